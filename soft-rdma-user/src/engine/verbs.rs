//! The data path's types (the verbs): memory regions and STags, access rights, scatter/gather elements, work
//! requests, completions, queue-pair configuration and status.

use super::traffic::{MessageOp, OpTraffic};

/// A queue pair's state as `status` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum QueuePairState {
    /// Created; Receives may be posted, other requests wait for the connection.
    Idle,
    Connected,
    /// Disconnected or terminated: every request completes with a flush status.
    Error,
}

/// One queue pair in a [`StatusReport`](crate::status::StatusReport) or a QueryQueuePair answer.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueuePairStatus {
    pub id: u64,
    pub session: u64,
    pub connector: Option<u64>,
    pub state: QueuePairState,
    /// Why the stream was terminated, if it was.
    pub terminate: Option<TerminateInfo>,
    pub stats: QpStats,
}

/// Counters and queue occupancy, for `soft-rdma status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QpStats {
    /// Whole messages transmitted (Sends, Writes, Read Requests, Read Responses).
    pub messages_sent: u64,
    /// Payload bytes transmitted (Send, Write and Read Response data).
    pub bytes_sent: u64,
    /// Whole messages received and accepted.
    pub messages_received: u64,
    /// Payload bytes received and placed.
    pub bytes_received: u64,
    /// Send-side work requests not yet completed (send queue + outstanding reads).
    pub sq_outstanding: u32,
    /// Receives posted and not yet completed.
    pub rq_posted: u32,
    /// Reads whose Request was sent and whose Response has not fully arrived.
    pub orq_outstanding: u32,
    /// Inbound Read Requests not yet fully answered.
    pub irq_queued: u32,
    /// The four counters above, by operation.
    pub by_op: OpTraffic,
}

impl QpStats {
    /// `bytes` of `op`'s payload transmitted.
    pub fn payload_sent(&mut self, op: MessageOp, bytes: u64) {
        self.bytes_sent += bytes;
        self.by_op.sent[op as usize].bytes += bytes;
    }

    /// A whole `op` message transmitted.
    pub fn message_sent(&mut self, op: MessageOp) {
        self.messages_sent += 1;
        self.by_op.sent[op as usize].messages += 1;
    }

    /// `bytes` of `op`'s payload received and placed.
    pub fn payload_received(&mut self, op: MessageOp, bytes: u64) {
        self.bytes_received += bytes;
        self.by_op.received[op as usize].bytes += bytes;
    }

    /// A whole `op` message received and accepted.
    pub fn message_received(&mut self, op: MessageOp) {
        self.messages_received += 1;
        self.by_op.received[op as usize].messages += 1;
    }
}

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
        /// See [`WorkRequest::is_silent`].
        silent: bool,
    },
    /// RDMA Write (opcode 0) of the gathered `sgl` to `remote`.
    Write {
        id: u64,
        sgl: Vec<Sge>,
        remote: RemoteBuffer,
        /// See [`WorkRequest::is_silent`].
        silent: bool,
    },
    /// RDMA Read (opcode 1/2): `sink.length` bytes from `remote` into `sink` (one local SGE, as siw).
    Read {
        id: u64,
        sink: Sge,
        remote: RemoteBuffer,
        /// See [`WorkRequest::is_silent`].
        silent: bool,
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

    /// ND_OP_FLAG_SILENT_SUCCESS (IND2QueuePair::Send/Write/Read; verbs: a WR without IBV_SEND_SIGNALED):
    /// no completion when the request succeeds; an error, a flush included, still completes it. Its send
    /// queue slot frees when it is done (Send and Write: in the socket; Read: the response placed). A
    /// Receive always completes.
    pub fn is_silent(&self) -> bool {
        match self {
            WorkRequest::Send { silent, .. }
            | WorkRequest::Write { silent, .. }
            | WorkRequest::Read { silent, .. } => *silent,
            WorkRequest::Receive { .. } => false,
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

/// Queue pair depths and limits asked at creation (bounded by [`AdapterInfo`](super::requests::AdapterInfo)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueuePairConfig {
    pub send_cq: CompletionQueueId,
    pub receive_cq: CompletionQueueId,
    pub send_depth: u32,
    pub receive_depth: u32,
    pub max_send_sge: u32,
    pub max_receive_sge: u32,
}

impl QueuePairConfig {
    /// Both queues completing on `cq`, each `depth` deep, one SGE per request.
    pub fn on_one_cq(cq: CompletionQueueId, depth: u32) -> Self {
        QueuePairConfig {
            send_cq: cq,
            receive_cq: cq,
            send_depth: depth,
            receive_depth: depth,
            max_send_sge: 1,
            max_receive_sge: 1,
        }
    }
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

impl TerminateInfo {
    /// The Terminate that carries `cause`; `from_peer` says whether the peer sent it.
    pub fn new(cause: soft_rdma_common::wire::TerminateCause, from_peer: bool) -> Self {
        TerminateInfo {
            layer: cause.layer,
            error_type: cause.error_type,
            code: cause.code,
            from_peer,
        }
    }
}
