//! The types at the engine's edges. The UDS protocol (`crate::uds`) mirrors [`CmRequest`]/[`CmResponse`]/
//! [`CmEvent`] one to one; transports consume [`TransportCommand`] and produce [`TransportEvent`].
//!
//! Every handle is a plain integer chosen by the engine, unique for the daemon's lifetime (never reused), and
//! owned by the [`SessionId`] that created it: a request naming a handle another session owns fails with
//! `INVALID_PARAMETER` exactly as a handle that does not exist (no information leaks across sessions).

use std::net::SocketAddr;

use bytes::Bytes;

use crate::error::Error;

/// One UDS client session (one connection to soft-rdmad). Owns every object it creates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct SessionId(pub u64);

/// A request's id, chosen by the client, echoed in the asynchronous completion ([`CmEvent::Completed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct RequestId(pub u64);

/// An IND2Connector.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct ConnectorId(pub u64);

/// An IND2Listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct ListenerId(pub u64);

/// An NDK shared endpoint (one local addr:port shared by many outgoing connections).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct SharedEndpointId(pub u64);

/// One TCP connection as the transport knows it (active or accepted). Never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct ConnId(pub u64);

/// Read limits as one side states or sees them (connector-semantics "Read limits"):
/// `inbound` = IRD (reads this side serves), `outbound` = ORD (reads this side issues).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ReadLimits {
    pub inbound: u32,
    pub outbound: u32,
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

/// What a listener's TDI-style handler (or the application) answers to an offer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum OfferVerdict {
    Accept,
    /// The peer gets CONNECTION_REFUSED.
    Refuse,
    /// Insufficient resources: the offer is refused (MPA Reply R=1, no private data).
    InsufficientResources,
}

/// Requests a session makes. Most complete synchronously with [`CmResponse`]; those marked *async* answer
/// `Ok(CmResponse::Pending)` and complete later with [`CmEvent::Completed`] carrying the same [`RequestId`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
    CloseQueuePair {
        qp: QueuePairId,
    },
    /// State, Terminate reason and counters of one queue pair.
    QueryQueuePair {
        qp: QueuePairId,
    },
}

/// Any object handle, for [`CmRequest::Cancel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ObjectRef {
    Connector(ConnectorId),
    Listener(ListenerId),
}

/// The answer to a request (synchronously, or in [`CmEvent::Completed`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
    Status(StatusReport),
    MemoryRegion {
        region: MemoryRegionId,
        stag: Stag,
    },
    CompletionQueue(CompletionQueueId),
    QueuePair(QueuePairId),
    QueuePairInfo(QueuePairStatus),
}

/// Asynchronous output for a session.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum CmEvent {
    /// An async request finished (success or failure).
    Completed {
        request: RequestId,
        result: Result<CmResponse, Error>,
    },
}

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

/// One connector in a [`StatusReport`].
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
}

/// One listener in a [`StatusReport`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ListenerStatus {
    pub id: u64,
    pub session: u64,
    pub local: SocketAddr,
    pub backlog: u32,
    pub queued_offers: u32,
}

/// `soft-rdma status`: everything the daemon holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StatusReport {
    pub listeners: Vec<ListenerStatus>,
    pub connectors: Vec<ConnectorStatus>,
    pub shared_endpoints: Vec<SocketAddr>,
    pub ports_in_use: u32,
    pub ports_free: u32,
    pub sessions: u32,
    pub queue_pairs: Vec<QueuePairStatus>,
    pub memory_regions: u32,
    /// How the daemon moves bytes (filled in by the daemon, not the engine).
    pub transport: Option<TransportStatus>,
    /// Client connections, registered memory and queued output against their limits (filled in by the
    /// daemon).
    /// (Boxed: it would make every `CmResponse` larger.)
    pub resources: Option<Box<super::limits::ResourceStatus>>,
}

/// The transport under the engine, as `status` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TransportStatus {
    /// "kernel TCP" or "xdp".
    pub kind: String,
    /// XDP: the interface, the attach mode (native / generic) and the link type (bpf_link detaches with the
    /// process).
    pub interface: Option<String>,
    pub mode: Option<String>,
    pub link: Option<String>,
    /// XDP: the program's counters, summed over CPUs (steered / passed / per class).
    pub counters: Vec<(String, u64)>,
    /// XDP: one AF_XDP socket per RX queue of the interface, with its traffic and the kernel's drop counters.
    pub queues: Vec<XskQueueStatus>,
}

/// One AF_XDP socket (one RX queue) in a [`TransportStatus`]. The frame counts are the daemon's; the drop
/// counts are the kernel's (`XDP_STATISTICS`), refreshed every quarter second.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct XskQueueStatus {
    pub queue: u32,
    /// Frames the XDP program steered to this socket and the daemon took from its RX ring.
    pub rx_frames: u64,
    /// Frames the daemon put on this socket's TX ring (smoltcp transmits on queue 0).
    pub tx_frames: u64,
    /// Steered frames the kernel dropped: no fill ring entry or RX ring full (`rx_dropped`, of which
    /// `rx_ring_full`), and times the fill ring was found empty.
    pub rx_dropped: u64,
    pub rx_ring_full: u64,
    pub rx_fill_ring_empty: u64,
    /// Descriptors the kernel rejected (a bug if ever non-zero).
    pub invalid_descs: u64,
}

/// A queue pair's state as `status` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum QueuePairState {
    /// Created; Receives may be posted, other requests wait for the connection.
    Idle,
    Connected,
    /// Disconnected or terminated: every request completes with a flush status.
    Error,
}

/// One queue pair in a [`StatusReport`] or a QueryQueuePair answer.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueuePairStatus {
    pub id: u64,
    pub session: u64,
    pub connector: Option<u64>,
    pub state: QueuePairState,
    /// Why the stream was terminated, if it was.
    pub terminate: Option<TerminateInfo>,
    pub stats: super::qp::QpStats,
}

/// Why a transport-level connect failed (mapped to ND statuses by the engine: connector-semantics).
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
    /// The peer closed (FIN) or reset, or the transport gave up (keepalive).
    Closed {
        conn: ConnId,
    },
}

/// The host TCP port space, as the engine sees it: soft-rdma's ports are also held there so host
/// applications and soft-rdma never collide (connector-semantics "Port space"; IND2Connector::Connect
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

// ---------------------------------------------------------------------------------------------------------
// The data path: memory regions, completion queues, queue pairs, work requests and completions.
// ---------------------------------------------------------------------------------------------------------

/// A registered memory region (IND2MemoryRegion). Never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct MemoryRegionId(pub u64);

/// A completion queue (IND2CompletionQueue). Never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct CompletionQueueId(pub u64);

/// A queue pair (IND2QueuePair). Never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct QueuePairId(pub u64);

/// An iWARP steering tag (RFC 5040 §2.1, RFC 5041 §3): the upper 24 bits index the region table, the low 8
/// bits are a key that changes with every registration, so a stale or guessed STag is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct Stag(pub u32);

impl Stag {
    pub const fn new(index: u32, key: u8) -> Stag {
        Stag((index << 8) | key as u32)
    }
    pub const fn index(self) -> u32 {
        self.0 >> 8
    }
    pub const fn key(self) -> u8 {
        self.0 as u8
    }
}

/// Access rights of a memory region (ND_MR_FLAG_ALLOW_LOCAL_WRITE / _REMOTE_READ / _REMOTE_WRITE).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Access(pub u8);

impl Access {
    /// The daemon may write into the region for this session (Receive buffers, RDMA Read sinks).
    pub const LOCAL_WRITE: Access = Access(1);
    /// Peers may read it with RDMA Read (its STag is advertised as a Read source).
    pub const REMOTE_READ: Access = Access(2);
    /// Peers may write it with RDMA Write.
    pub const REMOTE_WRITE: Access = Access(4);
    pub const ALL: Access = Access(7);

    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
    pub const fn union(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }
    /// Only the three defined bits.
    pub const fn is_valid(self) -> bool {
        self.0 & !Access::ALL.0 == 0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        self.union(rhs)
    }
}

/// One scatter/gather element: `length` bytes at byte `offset` of the local region whose STag is `stag`.
/// The region must belong to the posting session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Sge {
    pub stag: Stag,
    pub offset: u64,
    pub length: u32,
}

/// A buffer in the peer's memory: its advertised STag and a tagged offset. soft-rdma's tagged offsets are
/// byte offsets into the region (TO 0 = first byte); a peer such as siw may advertise virtual addresses,
/// which soft-rdma passes through unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct RemoteBuffer {
    pub stag: Stag,
    pub offset: u64,
}

/// What a queue pair is asked to do (IND2QueuePair::Send/Write/Read/Receive). `id` is the caller's
/// work-request id, returned in the completion.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum WorkRequest {
    /// Send (RDMAP opcode 3), with Solicited Event (5), with Invalidate (4) or both (6).
    Send {
        id: u64,
        sgl: Vec<Sge>,
        solicited: bool,
        /// Send with Invalidate: the peer's STag to invalidate on delivery (RFC 5040 §5.3).
        invalidate: Option<Stag>,
    },
    /// RDMA Write (opcode 0) of the gathered `sgl` to `remote`.
    Write {
        id: u64,
        sgl: Vec<Sge>,
        remote: RemoteBuffer,
    },
    /// RDMA Read (opcode 1/2): `sink.length` bytes from `remote` into `sink` (one local SGE, as siw).
    Read {
        id: u64,
        sink: Sge,
        remote: RemoteBuffer,
    },
    /// A receive buffer for one incoming Send (untagged queue 0, in MSN order).
    Receive { id: u64, sgl: Vec<Sge> },
}

impl WorkRequest {
    pub fn id(&self) -> u64 {
        match self {
            WorkRequest::Send { id, .. }
            | WorkRequest::Write { id, .. }
            | WorkRequest::Read { id, .. }
            | WorkRequest::Receive { id, .. } => *id,
        }
    }

    pub fn op(&self) -> CompletionOp {
        match self {
            WorkRequest::Send { .. } => CompletionOp::Send,
            WorkRequest::Write { .. } => CompletionOp::Write,
            WorkRequest::Read { .. } => CompletionOp::Read,
            WorkRequest::Receive { .. } => CompletionOp::Receive,
        }
    }
}

/// Which kind of work request completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum CompletionOp {
    Send,
    Write,
    Read,
    Receive,
}

/// One completion (ND2_RESULT): the work request, its ND status (numeric value on the wire), the bytes
/// transferred (received bytes for a Receive, the message length otherwise).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Completion {
    pub qp: QueuePairId,
    pub wr_id: u64,
    pub op: CompletionOp,
    /// `Success`, or why it failed: `Canceled` (flushed), `AccessViolation` (local protection),
    /// `DataOverrun` (message longer than the receive), `RemoteError` (the stream was terminated).
    #[serde(with = "crate::error::nd_status_code")]
    pub status: crate::error::NdStatus,
    pub bytes: u32,
    /// Receive of a Send with Solicited Event.
    pub solicited: bool,
    /// Receive of a Send with Invalidate: the local STag the peer invalidated.
    pub invalidated: Option<Stag>,
}

/// Queue pair depths and limits asked at creation (bounded by [`AdapterInfo`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueuePairConfig {
    pub send_cq: CompletionQueueId,
    pub receive_cq: CompletionQueueId,
    pub send_depth: u32,
    pub receive_depth: u32,
    pub max_send_sge: u32,
    pub max_receive_sge: u32,
}

/// Why a stream was terminated, as the peer's (or our own) Terminate said (RFC 5040 §4.8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TerminateInfo {
    pub layer: u8,
    pub error_type: u8,
    pub code: u8,
    /// True when the peer sent it; false when this side detected the error and sent it.
    pub from_peer: bool,
}
