//! Shared by the XDP program (`soft-rdma-ebpf`, `bpfel-unknown-none`) and userspace (`soft-rdma-user`):
//! the iWARP wire formats, the NetworkDirect status codes, the XDP map key/value types, and the SYN-cookie
//! rule the XDP program and the daemon's TCP share.
#![no_std]
#![forbid(unsafe_op_in_unsafe_fn)]

#[cfg(test)]
extern crate std;

#[macro_use]
mod listed_enum;
pub mod maps;
pub mod status;
pub mod syn_cookie;
pub mod wire;
