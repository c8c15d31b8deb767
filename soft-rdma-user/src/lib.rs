//! soft-rdma userspace: the sans-IO engine, the daemon (kernel-TCP transport, UDS server, event loop), the
//! async client library, and packet captures. See `docs/architecture.md`.
//!
//! Cargo features keep the client apart from the daemon: `client` is the library an application links
//! ([`engine`], [`client`], the Unix-socket protocol in [`uds`], [`shm`], [`capture`], [`error`]), with no
//! eBPF tool chain and no aya, smoltcp or xdpilone in its dependency graph; `daemon` adds [`daemon`],
//! [`transport`] and the UDS server; `cli` adds the `soft-rdma` tool. The default turns all three on.

pub mod capture;
pub mod client;
#[cfg(feature = "daemon")]
pub mod daemon;
pub mod engine;
pub mod error;
pub mod shm;
pub mod tcp;
#[cfg(feature = "daemon")]
pub mod transport;
pub mod uds;

pub use error::{Error, NdStatus, Result};
