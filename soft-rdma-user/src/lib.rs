//! soft-rdma userspace: the error type, the sans-IO engine, and packet captures. The daemon (transports and
//! UDS server) and the async client library are built on the engine next (see `docs/architecture.md`).

pub mod capture;
pub mod engine;
pub mod error;

pub use error::{Error, NdStatus, Result};
