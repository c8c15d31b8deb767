//! soft-rdma userspace: the sans-IO engine, the daemon (transports and UDS server), and the async client library.
//!
//! See `docs/architecture.md` for how the pieces fit.

pub mod capture;
pub mod client;
pub mod daemon;
pub mod engine;
pub mod error;
pub mod transport;
pub mod uds;
pub mod xdp;

pub use error::{Error, NdStatus, Result};
