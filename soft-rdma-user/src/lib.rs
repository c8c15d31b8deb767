//! soft-rdma userspace: the sans-IO engine, the daemon (kernel-TCP transport, UDS server, event loop), the
//! async client library, and packet captures. See `docs/architecture.md`.

pub mod capture;
pub mod client;
pub mod daemon;
pub mod engine;
pub mod error;
pub mod shm;
pub mod transport;
pub mod uds;
pub mod warn_limit;

pub use error::{Error, NdStatus, Result};
