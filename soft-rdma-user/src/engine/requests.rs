//! The engine's requests and answers, as a session sees them: session and object handles, [`CmRequest`],
//! [`CmResponse`], [`CmEvent`], the adapter's limits and read limits. The handles live in [`super::ids`] and
//! the status views in [`super::status`] (re-exported here). The Unix-socket
//! protocol carries requests and answers as its own types (`crate::uds::messages`, converted at the daemon's
//! edge), so these can change without changing the protocol; the plain data (handles, limits, the status
//! report) is serde and travels as it is.
//!
//! Every handle is a plain integer chosen by the engine, unique for the daemon's lifetime (never reused), and
//! owned by the [`SessionId`] that created it: a request naming a handle another session owns fails with
//! `INVALID_PARAMETER` exactly as a handle that does not exist (no information leaks across sessions).

use std::net::SocketAddr;

use bytes::Bytes;

use super::framing::Rtr;
use super::ids::{ConnId, PdId};
pub use super::ids::{ConnectorId, ListenerId, RequestId, SessionId, SharedEndpointId};
pub use super::status::{ConnectorState, ConnectorStatus, EngineStatus, ListenerStatus, TcpStatus};
use super::verbs::{
    Access, CompletionQueueId, MemoryRegionId, QueuePairConfig, QueuePairEvent, QueuePairId, QueuePairStatus, SharedReceiveQueueId, Sge, SrqConfig, SrqStatus,
    Stag,
};
use crate::error::Error;

/// Read limits as one side states or sees them (docs/connector-semantics.md "Read limits"):
/// `inbound` = IRD (RDMA Reads of the peer this side serves at once), `outbound` = ORD (RDMA Reads this
/// side has in flight at once). What a side asks at Connect or Accept is capped by the adapter
/// (`AdapterInfo::max_inbound_read_limit`, `max_outbound_read_limit`: 128 each by default, as siw) and
/// negotiated down to what the peer allows (RFC 6581 §9); [`Connector::read_limits`] shows the peer's
/// offer, and a queue pair's status the limits in force.
///
/// The names say what an application means: [`ReadLimits::ADAPTER_MAX`] (as many as the adapter and the
/// peer allow, the default), [`ReadLimits::symmetric`] (`n` each way), [`ReadLimits::NONE`] (no RDMA Reads
/// either way), [`ReadLimits::new`] (each way its own).
///
/// [`Connector::read_limits`]: crate::client::Connector::read_limits
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ReadLimits {
    pub inbound: u32,
    pub outbound: u32,
}

impl ReadLimits {
    /// No RDMA Reads either way: this side issues none (each completes with INVALID_PARAMETER) and serves
    /// none. For connections that only Send and Write.
    pub const NONE: ReadLimits = ReadLimits::new(0, 0);

    /// As many RDMA Reads each way as the adapter allows (capped silently to its limits, then negotiated
    /// down to the peer's). What `ReadLimits::default()` asks, as rdma_cm does without connection
    /// parameters.
    pub const ADAPTER_MAX: ReadLimits = ReadLimits::new(u32::MAX, u32::MAX);

    /// IRD `inbound`, ORD `outbound`.
    pub const fn new(inbound: u32, outbound: u32) -> Self {
        ReadLimits { inbound, outbound }
    }

    /// `n` RDMA Reads each way: this side serves `n` at once and issues `n` at once.
    pub const fn symmetric(n: u32) -> Self {
        ReadLimits::new(n, n)
    }
}

/// [`ReadLimits::ADAPTER_MAX`]: Reads work unless a side asks for fewer (0 would make every RDMA Read
/// fail with INVALID_PARAMETER).
impl Default for ReadLimits {
    fn default() -> Self {
        ReadLimits::ADAPTER_MAX
    }
}

/// The adapter limits a Query reports (ND2_ADAPTER_INFO fields that matter here).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AdapterInfo {
    pub max_inbound_read_limit: u32,
    pub max_outbound_read_limit: u32,
    /// Private data on Connect (252 with MPA v2: 256 on the wire minus the RFC 6581 word).
    pub max_caller_data: u32,
    /// Private data on Accept/Reject.
    pub max_callee_data: u32,
    pub max_send_queue_depth: u32,
    pub max_receive_queue_depth: u32,
    pub max_completion_queue_depth: u32,
    pub max_transfer_length: u32,
    pub max_send_sge: u32,
    pub max_receive_sge: u32,
}

/// Requests a session makes. Most complete synchronously with [`CmResponse`]; those marked *async* answer
/// `Ok(CmResponse::Pending)` and complete later with [`CmEvent::Completed`] carrying the same [`RequestId`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CmRequest {
    /// IND2Adapter::Query.
    Query,
    CreateConnector,
    /// Release a connector: aborts a pending connect, disconnects a connected one (implicit disconnect).
    CloseConnector {
        connector: ConnectorId,
    },
    /// IND2Connector::Bind. Port 0 allocates from 49152-65535.
    Bind {
        connector: ConnectorId,
        local: SocketAddr,
    },
    /// IND2Connector::Connect / NdkConnectWithSharedEndpoint (*async*: completes when the peer accepts or
    /// rejects, or the attempt fails).
    Connect {
        connector: ConnectorId,
        remote: SocketAddr,
        limits: ReadLimits,
        private_data: Bytes,
        shared_endpoint: Option<SharedEndpointId>,
        /// The queue pair the connection carries (IND2Connector::Connect's pQueuePair); `None` for
        /// connection management alone (data messages from the peer are then dropped).
        queue_pair: Option<QueuePairId>,
    },
    /// IND2Connector::CompleteConnect (*async*).
    CompleteConnect {
        connector: ConnectorId,
    },
    /// IND2Connector::Accept (*async*: completes when the connection is established).
    Accept {
        connector: ConnectorId,
        limits: ReadLimits,
        private_data: Bytes,
        queue_pair: Option<QueuePairId>,
    },
    /// IND2Connector::Reject: passive side refusing an offer, or active side refusing the peer's limits.
    Reject {
        connector: ConnectorId,
        private_data: Bytes,
    },
    GetReadLimits {
        connector: ConnectorId,
    },
    /// `buffer_len` is the caller's buffer size: shorter than the data → BUFFER_OVERFLOW with the data
    /// truncated and the required size.
    GetPrivateData {
        connector: ConnectorId,
        buffer_len: u32,
    },
    GetLocalAddress {
        connector: ConnectorId,
    },
    GetPeerAddress {
        connector: ConnectorId,
    },
    /// IND2Connector::NotifyDisconnect (*async*: completes when the peer disconnects).
    NotifyDisconnect {
        connector: ConnectorId,
    },
    /// IND2Connector::Disconnect (*async*: completes when the local side is torn down). Outstanding
    /// requests on the connector complete with CANCELED.
    Disconnect {
        connector: ConnectorId,
    },
    /// IND2Overlapped::CancelOverlappedRequests: every pending async request on the object completes with
    /// CANCELED; a pending Connect is abandoned (the passive side sees CONNECTION_ABORTED).
    Cancel {
        object: ObjectRef,
    },
    CreateListener,
    CloseListener {
        listener: ListenerId,
    },
    /// IND2Listener::Bind + Listen. Backlog 0 = no limit.
    Listen {
        listener: ListenerId,
        local: SocketAddr,
        backlog: u32,
    },
    /// IND2Listener::GetConnectionRequest (*async*): completes when an offer is (or already was) queued,
    /// attaching it to `connector`.
    GetConnectionRequest {
        listener: ListenerId,
        connector: ConnectorId,
    },
    CreateSharedEndpoint {
        local: SocketAddr,
    },
    CloseSharedEndpoint {
        endpoint: SharedEndpointId,
    },
    /// Everything the daemon holds, for `soft-rdma status` (not ownership-filtered: an admin view).
    Status,
    /// IND2Adapter::CreateMemoryRegion + Register: the frame carries the region's memfd (SCM_RIGHTS), sealed
    /// against shrinking, at least `length` bytes long. Answers [`CmResponse::MemoryRegion`].
    RegisterMemory {
        length: u64,
        access: Access,
        /// The protection domain (the session's number for it) the region joins.
        pd: PdId,
    },
    /// IND2MemoryRegion::Deregister: its STag is refused from now on.
    DeregisterMemory {
        region: MemoryRegionId,
    },
    CreateCompletionQueue {
        depth: u32,
    },
    CloseCompletionQueue {
        cq: CompletionQueueId,
    },
    CreateQueuePair {
        config: QueuePairConfig,
    },
    /// Releases a queue pair: outstanding requests complete with CANCELED; a connected one disconnects.
    /// Kernel mode, after a hand-off: the client's data path saw the connection end (the peer's FIN or
    /// RST, a Terminate either way). The connector ends as on the peer's disconnect: NotifyDisconnect
    /// completes, the port and 4-tuple are released, the daemon's duplicate of the socket is closed.
    ConnectionEnded {
        connector: ConnectorId,
        how: ConnectionEnd,
    },
    /// Kernel mode: the client's in-process data path, for `status` (its queue pairs with their counters,
    /// its registered regions). Sent when they change and about once a second while connections run;
    /// the latest replaces the previous, and the session's end drops it.
    ReportDataPath {
        queue_pairs: Vec<QueuePairStatus>,
        memory_regions: u32,
        /// The first part of a report (it replaces the previous one); the following parts add to it (a
        /// session with thousands of queue pairs reports them in several frames).
        first: bool,
    },
    CloseQueuePair {
        qp: QueuePairId,
    },
    /// State, Terminate reason and counters of one queue pair.
    QueryQueuePair {
        qp: QueuePairId,
    },
    /// A shared receive queue (`super::srq`, siw `siw_create_srq`'s rules). Answers
    /// [`CmResponse::SharedReceiveQueue`].
    CreateSharedReceiveQueue {
        config: SrqConfig,
    },
    /// Destroys one: SHARING_VIOLATION while a queue pair uses it.
    CloseSharedReceiveQueue {
        srq: SharedReceiveQueueId,
    },
    /// Arms its limit, or disarms it with 0.
    ModifySharedReceiveQueue {
        srq: SharedReceiveQueueId,
        limit: u32,
    },
    /// Answers [`CmResponse::SharedReceiveQueueInfo`].
    QuerySharedReceiveQueue {
        srq: SharedReceiveQueueId,
    },
    /// Receives `(wr_id, buffers)` in order. Answers [`CmResponse::SharedReceivesPosted`].
    PostSharedReceiveQueue {
        srq: SharedReceiveQueueId,
        receives: Vec<(u64, Vec<Sge>)>,
    },
    /// A queue pair whose Sends take their Receives from `srq` (it has no receive queue of its own).
    CreateQueuePairOnSrq {
        config: QueuePairConfig,
        srq: SharedReceiveQueueId,
    },
}

/// Any object handle, for [`CmRequest::Cancel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ObjectRef {
    Connector(ConnectorId),
    Listener(ListenerId),
}

/// The answer to a request (synchronously, or in [`CmEvent::Completed`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CmResponse {
    /// SUCCESS with nothing to return.
    Done,
    /// PENDING: an async request accepted; it completes later with [`CmEvent::Completed`].
    Pending,
    Adapter(AdapterInfo),
    Connector(ConnectorId),
    Listener(ListenerId),
    SharedEndpoint(SharedEndpointId),
    /// Bind, Listen, CreateSharedEndpoint: the address actually bound (port filled in).
    Bound(SocketAddr),
    ReadLimits(ReadLimits),
    /// GetPrivateData. `data.len() < required` means BUFFER_OVERFLOW (status carried by the UDS layer).
    PrivateData {
        data: Bytes,
        required: u32,
    },
    Address(SocketAddr),
    /// The connect/accept side of a completed GetConnectionRequest: the offer now attached to the connector.
    ConnectionRequest {
        connector: ConnectorId,
        peer: SocketAddr,
        limits: ReadLimits,
        private_data: Bytes,
    },
    /// The engine's part of `soft-rdma status` (the daemon adds the transport's and the budgets':
    /// `crate::status::StatusReport`).
    Status(EngineStatus),
    MemoryRegion {
        region: MemoryRegionId,
        stag: Stag,
    },
    CompletionQueue(CompletionQueueId),
    QueuePair(QueuePairId),
    QueuePairInfo(QueuePairStatus),
    /// CompleteConnect or Accept of a connection whose data path the client runs (kernel mode): the
    /// established socket travels with this answer (SCM_RIGHTS), and this is what the client needs to run
    /// the queue pair on it.
    HandedOff(HandOff),
    SharedReceiveQueue(SharedReceiveQueueId),
    SharedReceiveQueueInfo(SrqStatus),
    /// PostSharedReceiveQueue: the Receives before `refused` were posted; the one at its index was refused
    /// for its error, and the rest not looked at.
    SharedReceivesPosted {
        refused: Option<(u32, Error)>,
    },
}

/// How a connection the client ran ended, as the daemon logs it (`connection ended`, `how=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ConnectionEnd {
    /// The peer closed in order (FIN).
    PeerFin,
    /// The peer reset the connection.
    PeerReset,
    /// This host's TCP gave up (TCP_USER_TIMEOUT, keepalive).
    TimedOut,
    /// A Terminate, sent or received (RFC 5040 §4.8).
    Terminated,
    /// Another socket error.
    Failed,
}

impl ConnectionEnd {
    /// The name the daemon's log gives it.
    pub fn name(self) -> &'static str {
        match self {
            ConnectionEnd::PeerFin => "peer_fin",
            ConnectionEnd::PeerReset => "peer_reset",
            ConnectionEnd::TimedOut => "timed_out",
            ConnectionEnd::Terminated => "terminated",
            ConnectionEnd::Failed => "failed",
        }
    }
}

/// An established connection handed to the client library (kernel-TCP mode): everything the MPA handshake
/// settled that the data path needs, and the stream bytes the daemon read before it let go of the socket.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HandOff {
    /// The daemon's name for the TCP connection (the socket travels beside the message).
    pub conn: ConnId,
    /// CRC32c in both directions (RFC 5044 §4.4).
    pub crc: bool,
    /// The largest ULPDU this side sends: one FPDU per TCP segment (RFC 5044 §4.1).
    pub max_ulpdu: u32,
    /// The largest inbound ULPDU accepted (soft-rdmad's `--max-ulpdu`); a longer one is terminated.
    pub max_inbound_ulpdu: u32,
    /// Inbound and outbound read limits in effect (RFC 6581 §9 IRD/ORD).
    pub ird: u32,
    pub ord: u32,
    /// Active side, peer-to-peer mode: the RTR to send before anything else (RFC 6581 §9).
    pub send_rtr: Option<Rtr>,
    /// Passive side, peer-to-peer mode: the Accept completes with the initiator's RTR.
    pub awaiting_rtr: bool,
    /// Passive side: nothing is sent before the initiator's first FPDU (RFC 5044 §7.1).
    pub tx_held: bool,
    /// Active side: how much longer the first FPDU is held, in µs, and the length of the FIN's hold that
    /// follows it (`engine::first_fpdu`); both 0 without a hold.
    pub first_fpdu_hold_us: u64,
    pub fin_hold_us: u64,
    /// Bytes of the stream the daemon read and did not process: the client's data path takes them first.
    pub received: Bytes,
}

/// A data-path object the engine made or closed at a session's request ([`CmRequest::CreateQueuePair`],
/// [`CmRequest::CreateCompletionQueue`] and their closes), as the daemon hears of it: it gives each queue
/// pair and completion queue its shared rings, and takes them away with the object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectEvent {
    QueuePairCreated {
        session: SessionId,
        qp: QueuePairId,
        config: QueuePairConfig,
    },
    CompletionQueueCreated {
        session: SessionId,
        cq: CompletionQueueId,
        depth: u32,
    },
    QueuePairClosed {
        session: SessionId,
        qp: QueuePairId,
    },
    CompletionQueueClosed {
        session: SessionId,
        cq: CompletionQueueId,
    },
}

impl ObjectEvent {
    /// The session whose object it is.
    pub fn session(&self) -> SessionId {
        match *self {
            ObjectEvent::QueuePairCreated { session, .. }
            | ObjectEvent::CompletionQueueCreated { session, .. }
            | ObjectEvent::QueuePairClosed { session, .. }
            | ObjectEvent::CompletionQueueClosed { session, .. } => session,
        }
    }
}

/// Asynchronous output for a session.
#[derive(Clone, Debug, PartialEq, Eq)]
// Completions are nearly every event; the rare limit event is the small one.
#[allow(clippy::large_enum_variant)]
pub enum CmEvent {
    /// An async request finished (success or failure).
    Completed {
        request: RequestId,
        result: Result<CmResponse, Error>,
    },
    /// A shared receive queue's armed limit was reached (IBV_EVENT_SRQ_LIMIT_REACHED); it is disarmed.
    SrqLimitReached {
        srq: SharedReceiveQueueId,
    },
    /// A queue pair's asynchronous event (IBV_EVENT_QP_FATAL, _REQ_ERR, _ACCESS_ERR: [`QueuePairEvent`]).
    QueuePairEvent {
        qp: QueuePairId,
        event: QueuePairEvent,
    },
}
