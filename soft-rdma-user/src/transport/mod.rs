//! Transports: thin drivers that execute the engine's `TransportCommand`s and feed back `TransportEvent`s.
//! [`kernel`] runs over the kernel's TCP sockets (the default, and the interop baseline); [`xdp`] runs a
//! userspace TCP stack (smoltcp) over AF_XDP sockets fed by an XDP program (`soft-rdmad --xdp IFACE`).

pub mod kernel;
pub mod xdp;

/// Connection ids the transport picks (accepted connections) start here, so they never collide with the
/// ids the engine picks for its own connects (which count up from 1).
pub const TRANSPORT_CONN_ID_BASE: u64 = 1 << 62;
