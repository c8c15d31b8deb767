//! Shared by the XDP program (`soft-rdma-ebpf`, `bpfel-unknown-none`) and userspace (`soft-rdma-user`):
//! the iWARP wire formats, the NetworkDirect status codes, and the XDP map key/value types.
#![no_std]
#![forbid(unsafe_op_in_unsafe_fn)]

#[cfg(test)]
extern crate std;

#[macro_use]
mod listed_enum;
pub mod maps;
pub mod status;
pub mod wire;
