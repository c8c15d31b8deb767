//! The seam between the engine and its transports: transports execute [`TransportCommand`]s and report
//! [`TransportEvent`]s on connections named by [`ConnId`], and hold ports in the host's TCP port space for
//! the engine ([`HostPorts`]). The drivers (kernel TCP, a userspace TCP over AF_XDP) live in the daemon
//! (`crate::transport`); these types live here so that the engine depends on nothing of the daemon.

use std::net::SocketAddr;

use bytes::Bytes;

pub use super::ids::ConnId;
use super::ids::ListenerId;

/// Why a transport-level connect failed (mapped to ND statuses by the engine: docs/connector-semantics.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ConnectFailure {
    /// ECONNREFUSED → CONNECTION_REFUSED.
    Refused,
    /// No SYN-ACK within the connect timeout → IO_TIMEOUT.
    TimedOut,
    /// ENETUNREACH → NETWORK_UNREACHABLE.
    NetworkUnreachable,
    /// EHOSTUNREACH → HOST_UNREACHABLE.
    HostUnreachable,
    /// EADDRINUSE on the local side → SHARING_VIOLATION at Bind, ADDRESS_ALREADY_EXISTS at Connect.
    AddressInUse,
    /// EADDRNOTAVAIL: the local IP is not this host's → INVALID_ADDRESS.
    AddressNotAvailable,
    /// EMFILE, ENFILE, ENOBUFS, ENOMEM: out of file descriptors (every port and connection is a socket) or
    /// kernel memory → INSUFFICIENT_RESOURCES.
    NoResources,
    /// Anything else → UNSUCCESSFUL.
    Other,
}

/// What the engine asks the transport to do. The transport executes each in order.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum TransportCommand {
    /// Start listening on `local` (already reserved). Accepted connections arrive as
    /// [`TransportEvent::Accepted`].
    Listen {
        listener: ListenerId,
        local: SocketAddr,
    },
    StopListening {
        listener: ListenerId,
    },
    /// Open a TCP connection from `local` (reserved) to `remote`. Result: `Connected` or `ConnectFailed`.
    Connect {
        conn: ConnId,
        local: SocketAddr,
        remote: SocketAddr,
    },
    /// Append bytes to the connection's stream.
    Send {
        conn: ConnId,
        data: Bytes,
    },
    /// Let go of an established connection (kernel TCP): flush what was queued, stop reading, report
    /// [`TransportEvent::HandedOff`] and keep the socket for the daemon to pass on. Bytes read before the
    /// reading stopped arrive as `Received` first. A later `Close` closes the daemon's copy (shutting the
    /// connection down: the client is done with it or gone).
    HandOff {
        conn: ConnId,
    },
    /// Close the connection: `abort` = RST (SO_LINGER 0) instead of FIN after flushing.
    Close {
        conn: ConnId,
        abort: bool,
    },
}

/// What the transport tells the engine.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum TransportEvent {
    Accepted {
        listener: ListenerId,
        conn: ConnId,
        local: SocketAddr,
        remote: SocketAddr,
        mss: u32,
    },
    /// `bytes` of earlier `Send`s left the transport's queue (written to the socket): room for more.
    Written {
        conn: ConnId,
        bytes: usize,
    },
    Connected {
        conn: ConnId,
        local: SocketAddr,
        /// The path's TCP MSS: FPDUs are sized to fit one segment (RFC 5044 §4.1, MULPDU).
        mss: u32,
    },
    ConnectFailed {
        conn: ConnId,
        reason: ConnectFailure,
    },
    Received {
        conn: ConnId,
        data: Bytes,
    },
    /// The connection was let go (`HandOff`): the transport holds its socket for the daemon to pass on.
    HandedOff {
        conn: ConnId,
    },
    /// The peer closed (FIN) or reset, or the transport gave up (keepalive).
    Closed {
        conn: ConnId,
    },
}

/// The host TCP port space, as the engine sees it: soft-rdma's ports are also held there so host
/// applications and soft-rdma never collide (docs/connector-semantics.md "Port space"; IND2Connector::Connect
/// remarks on mapping ND ports into host TCP ports). Synchronous because Bind answers inline.
///
/// Kernel mode: a reservation is a bound, not yet listening or connected, TCP socket that the transport later
/// uses for `Listen`/`Connect` on that address. XDP mode: a bound kernel socket that is never used, so the
/// host stack neither hands the port out nor answers on it.
pub trait HostPorts: Send {
    /// Hold `local` (port != 0). `shared` = several soft-rdma connections may use it (shared endpoint:
    /// SO_REUSEADDR among soft-rdma's own sockets). EADDRINUSE → `Err(ConnectFailure::AddressInUse)`;
    /// an address not on this host → `Err(ConnectFailure::AddressNotAvailable)` (the engine answers INVALID_ADDRESS).
    fn reserve(&mut self, local: SocketAddr, shared: bool) -> Result<(), ConnectFailure>;
    /// Hold `local` for a listener. The kernel transport listens at once (a listening socket keeps every
    /// other socket off the port) and so may take a port whose earlier connections are still in TIME_WAIT, as
    /// Linux siw and ordinary servers do: a listener restarted after a crash gets its port back at once.
    fn reserve_listener(&mut self, local: SocketAddr) -> Result<(), ConnectFailure> {
        self.reserve(local, false)
    }
    /// Give `local` back to the host.
    fn release(&mut self, local: SocketAddr);
}
