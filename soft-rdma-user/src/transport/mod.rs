//! Transports: thin drivers that execute the engine's `TransportCommand`s and feed back `TransportEvent`s.
//! `kernel` runs over the kernel's TCP sockets (the default, and the interop baseline); `xdp` runs a
//! userspace TCP (the project's own, [`crate::tcp`], by default; smoltcp's socket with `--xdp-tcp smoltcp`)
//! over AF_XDP sockets fed by an XDP program (`soft-rdmad --xdp IFACE`). Both need the `daemon` feature;
//! [`status`], what `soft-rdma status` shows of them, builds for clients too.

#[cfg(feature = "daemon")]
pub mod kernel;
pub mod status;
#[cfg(feature = "daemon")]
pub mod xdp;

/// Connection ids the transport picks (accepted connections) start here, so they never collide with the
/// ids the engine picks for its own connects (which count up from 1).
#[cfg(feature = "daemon")]
pub const TRANSPORT_CONN_ID_BASE: u64 = 1 << 62;
