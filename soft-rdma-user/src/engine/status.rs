//! What `soft-rdma status` shows of the engine: connectors and their states, listeners, ports, sessions,
//! queue pairs and registered memory ([`EngineStatus`]), as the connection manager reports them. Plain,
//! serde data; the full report with the transport's and the budgets' parts is [`crate::status`].

use std::net::SocketAddr;

use super::verbs::QueuePairStatus;

/// Connector states, as `status` shows them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ConnectorState {
    Idle,
    Bound,
    /// TCP connecting or MPA Request sent; waiting for the Reply.
    Connecting,
    /// Active side: Reply received (accepted); waiting for CompleteConnect or Reject.
    AwaitingComplete,
    /// Passive side: offer attached, waiting for the application's Accept/Reject.
    OfferReceived,
    /// Passive side: Accept sent the Reply; waiting for the first FPDU (or RTR) from the initiator.
    Accepting,
    Connected,
    Disconnecting,
    Closed,
}

/// One connector in a [`StatusReport`](crate::status::StatusReport).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ConnectorStatus {
    pub id: u64,
    pub session: u64,
    pub state: ConnectorState,
    pub local: Option<SocketAddr>,
    pub peer: Option<SocketAddr>,
    /// Effective limits from this side's point of view, once negotiated.
    pub inbound_read_limit: Option<u32>,
    pub outbound_read_limit: Option<u32>,
    pub peer_private_data_len: Option<u32>,
    pub mpa_revision: Option<u8>,
    /// The kernel's view of the connection's TCP (`TCP_INFO`), read by the daemon from its copy of a socket
    /// handed to a client (kernel-TCP mode; filled in by the daemon, not the engine).
    pub tcp: Option<TcpStatus>,
}

/// What `TCP_INFO` says of one connection (Linux `struct tcp_info`), as `status` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TcpStatus {
    /// Smoothed round-trip time and its variation, µs.
    pub rtt_us: u32,
    pub rttvar_us: u32,
    /// Congestion window, segments; sender MSS, bytes.
    pub snd_cwnd: u32,
    pub snd_mss: u32,
    /// Segments sent and not yet acknowledged.
    pub unacked: u32,
    /// Retransmitted segments over the connection's life.
    pub total_retrans: u32,
    /// Bytes the peer acknowledged, bytes received.
    pub bytes_acked: u64,
    pub bytes_received: u64,
}

/// One listener in a [`StatusReport`](crate::status::StatusReport).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ListenerStatus {
    pub id: u64,
    pub session: u64,
    pub local: SocketAddr,
    pub backlog: u32,
    pub queued_offers: u32,
}

/// The engine's part of `soft-rdma status`: listeners, connectors, ports, sessions, queue pairs and memory.
/// The daemon adds the transport's and the budgets' parts ([`crate::status::StatusReport`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EngineStatus {
    pub listeners: Vec<ListenerStatus>,
    pub connectors: Vec<ConnectorStatus>,
    pub shared_endpoints: Vec<SocketAddr>,
    pub ports_in_use: u32,
    pub ports_free: u32,
    pub sessions: u32,
    pub queue_pairs: Vec<QueuePairStatus>,
    pub memory_regions: u32,
}
