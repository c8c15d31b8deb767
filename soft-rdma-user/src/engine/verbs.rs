//! The data path's types (the verbs): memory regions and STags, access rights, scatter/gather elements, work
//! requests, completions, queue-pair configuration and status, and why a stream was terminated
//! ([`TerminateInfo`]).
//!
//! What went wrong is said in words where an application meets it: a [`TerminateInfo`] displays its cause
//! by name and what it means (the rule the peer's message broke, with the buffer it named, when this side
//! sent it: [`Violation`]), and [`QueuePairStatus::result_of`] turns a failed [`Completion`] into an
//! [`Error`] that says why, from the queue pair's state.

use std::fmt;

use soft_rdma_common::wire::ddp::{DdpRepr, Placement};
use soft_rdma_common::wire::terminate::TerminateRepr;

pub use super::violation::Violation;
use crate::error::{Error, NdStatus};

use super::ids::PdId;
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
    /// Why the stream was terminated, if it was (its `Display` says it in words).
    pub terminate: Option<TerminateInfo>,
    /// The connection's inbound read limit in force: RDMA Read Requests of the peer this side serves at
    /// once (RFC 6581 §9 IRD). 0 until the queue pair is connected.
    pub ird: u32,
    /// The connection's outbound read limit in force: RDMA Reads this side has in flight at most (RFC 6581
    /// §9 ORD); with 0 every RDMA Read completes with INVALID_PARAMETER. 0 until the queue pair is connected.
    pub ord: u32,
    pub stats: QpStats,
}

impl QueuePairStatus {
    /// `c`, a completion of this queue pair, as a `Result`: `Ok` when it succeeded, else an [`Error`] with
    /// its status that says in words what failed and why, from this status (query it after the
    /// completion): a request flushed or failed because the stream was terminated names the Terminate
    /// ([`TerminateInfo`]'s words), an RDMA Read refused on a connection whose outbound read limit is 0
    /// says so and how to ask for one, and every other status says what causes it.
    ///
    /// ```no_run
    /// # async fn f(qp: soft_rdma::client::QueuePair, cq: soft_rdma::client::CompletionQueue) -> soft_rdma::Result<()> {
    /// let c = cq.next().await?;
    /// if c.status != soft_rdma::NdStatus::Success {
    ///     qp.query().await?.result_of(&c)?; // e.g. "RDMA Write 7 on queue pair 3 was flushed, …"
    /// }
    /// # Ok(()) }
    /// ```
    pub fn result_of(&self, c: &Completion) -> crate::Result<()> {
        if c.status == NdStatus::Success {
            return Ok(());
        }
        let what = format!("{} {} on queue pair {}", c.op, c.wr_id, self.id);
        let why = self.why(c);
        Err(Error::new(c.status, format!("{what} {why}")))
    }

    /// Why `c` failed, as the end of a sentence that starts with the request.
    fn why(&self, c: &Completion) -> String {
        let ended = self.terminate.map(|t| t.to_string());
        match (c.status, c.op, ended) {
            (NdStatus::Canceled, _, Some(t)) if self.state == QueuePairState::Error => {
                format!("was flushed, not carried out: the queue pair is in Error because {t}")
            }
            (NdStatus::Canceled, _, _) if self.state == QueuePairState::Error => {
                "was flushed, not carried out: the queue pair is in Error (disconnected, closed, or its \
                 connection ended) and takes no more requests"
                    .into()
            }
            (NdStatus::Canceled, _, _) => "was canceled".into(),
            (NdStatus::RemoteError, _, Some(t)) => format!("failed: {t}"),
            (NdStatus::RemoteError, _, None) => "failed: the stream was terminated".into(),
            (NdStatus::InvalidParameter, CompletionOp::Read, _)
                if self.state != QueuePairState::Idle && self.ord == 0 =>
            {
                "was refused: this connection's outbound read limit (ORD) is 0, so this side may issue no \
                 RDMA Reads; ask for one in the ReadLimits given to connect_qp or accept_qp \
                 (ReadLimits::ADAPTER_MAX, or ReadLimits::symmetric(n)): the peer's inbound limit caps it \
                 (Connector::read_limits shows what the peer allows)"
                    .into()
            }
            (NdStatus::InvalidParameter, _, _) => {
                "was refused: more SGEs than the queue pair allows, a message longer than 2^31 bytes, or a \
                 remote tagged offset plus length that wraps"
                    .into()
            }
            (NdStatus::InsufficientResources, _, _) => {
                "was refused: its queue was full; wait for completions before posting more, or create the \
                 queue pair with deeper queues"
                    .into()
            }
            (NdStatus::AccessViolation | NdStatus::DataOverrun, CompletionOp::Receive, Some(t)) => {
                format!("failed: {t}")
            }
            (NdStatus::AccessViolation, _, _) => {
                "was refused: a local SGE is not valid (not a region of this session, deregistered, outside \
                 its region, or, for a Receive or an RDMA Read's sink, in a region without \
                 Access::LOCAL_WRITE)"
                    .into()
            }
            (NdStatus::DataOverrun, _, _) => {
                "overran its buffers: the Send was longer than the Receive".into()
            }
            (status, _, Some(t)) => format!("failed ({status}): {t}"),
            (status, _, None) => format!("failed ({status})"),
        }
    }
}

/// "queue pair 3: Connected", "queue pair 3: Error: the peer terminated the connection with …".
impl fmt::Display for QueuePairStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "queue pair {}: {:?}", self.id, self.state)?;
        match self.terminate {
            Some(t) => write!(f, ": {t}"),
            None => Ok(()),
        }
    }
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

/// A shared receive queue. Never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct SharedReceiveQueueId(pub u64);

/// What a shared receive queue was created with (`struct ibv_srq_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SrqConfig {
    /// Receives it holds at most (`max_wr`), 1..=[`MAX_SRQ_DEPTH`](super::srq::MAX_SRQ_DEPTH).
    pub depth: u32,
    /// SGEs per Receive at most (`max_sge`), 1..=the adapter's receive SGEs.
    pub max_sge: u32,
    /// The limit (`srq_limit`), at most `depth`; nonzero arms it.
    pub limit: u32,
}

/// A shared receive queue's state for `ibv_query_srq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SrqStatus {
    pub depth: u32,
    pub max_sge: u32,
    /// The limit last set (it stays after it fired, as siw's `siw_query_srq` reports it).
    pub limit: u32,
    /// Whether the limit is armed.
    pub armed: bool,
    /// Receives posted and not yet taken.
    pub posted: u32,
}

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

/// Access rights of a memory region (ND_MR_FLAG_ALLOW_LOCAL_WRITE / _REMOTE_READ / _REMOTE_WRITE), combined
/// with `|`. Every region may be read by this session's own requests (the gather lists of its Sends and
/// RDMA Writes); each right adds one use:
///
/// | name | this session's requests may | peers may |
/// | --- | --- | --- |
/// | [`Access::LOCAL_READ`] (also `Access::default()`) | send from it | nothing |
/// | [`Access::LOCAL_WRITE`] | also receive into it (Receives, RDMA Read sinks) | nothing |
/// | [`Access::REMOTE_READ`] | send from it | RDMA Read it |
/// | [`Access::REMOTE_WRITE`] | send from it | RDMA Write it |
/// | [`Access::REMOTE_READ_WRITE`] | send from it | RDMA Read and Write it |
/// | [`Access::ALL`] | send from it and receive into it | RDMA Read and Write it |
///
/// A request that uses a region beyond its rights completes with ACCESS_VIOLATION (this session's) or ends
/// the connection with a Terminate (a peer's: [`Violation`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Access(pub u8);

impl Access {
    /// No right beyond what every region has: local read only. This session's Sends and RDMA Writes may
    /// gather from it; nothing writes into it and peers cannot reach it. `Access::default()`.
    pub const LOCAL_READ: Access = Access(0);
    /// The data path may write into the region for this session: Receive buffers and RDMA Read sinks.
    pub const LOCAL_WRITE: Access = Access(1);
    /// Peers may read it with RDMA Read (its STag is advertised as a Read source).
    pub const REMOTE_READ: Access = Access(2);
    /// Peers may write it with RDMA Write (its STag is advertised as a Write target).
    pub const REMOTE_WRITE: Access = Access(4);
    /// Peers may read and write it (RDMA Read and Write); this session may only send from it.
    pub const REMOTE_READ_WRITE: Access = Access(2 | 4);
    /// Every right: receive into it, and peers may read and write it.
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

/// The rights by name, joined by `|` ("LOCAL_WRITE | REMOTE_READ"); no right is "LOCAL_READ", and
/// undefined bits are shown in hex.
impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (Access::LOCAL_WRITE, "LOCAL_WRITE"),
            (Access::REMOTE_READ, "REMOTE_READ"),
            (Access::REMOTE_WRITE, "REMOTE_WRITE"),
        ];
        let mut first = true;
        for (right, name) in names {
            if self.contains(right) {
                write!(f, "{}{name}", if first { "" } else { " | " })?;
                first = false;
            }
        }
        let undefined = self.0 & !Access::ALL.0;
        if undefined != 0 {
            write!(f, "{}{undefined:#x}", if first { "" } else { " | " })?;
            first = false;
        }
        if first {
            f.write_str("LOCAL_READ")?;
        }
        Ok(())
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

/// "Send", "RDMA Write", "RDMA Read", "Receive".
impl fmt::Display for CompletionOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CompletionOp::Send => "Send",
            CompletionOp::Write => "RDMA Write",
            CompletionOp::Read => "RDMA Read",
            CompletionOp::Receive => "Receive",
        })
    }
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
    /// The protection domain (of the creating session) whose regions the queue pair reaches, locally and
    /// for its peer (siw `siw_create_qp` takes the PD; `siw_check_mem` compares it on every access).
    pub pd: PdId,
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
            pd: PdId(0),
        }
    }
}

/// A queue pair's asynchronous event (rdma-core verbs.h `enum ibv_event_type`), raised where kernel siw
/// raises it (`siw_qp_event` in drivers/infiniband/sw/siw: `siw_qp_rx.c`, `siw_qp_tx.c`); at most one per
/// queue pair, when it moves to Error. The peer's Terminate raises none (siw's `siw_proc_terminate` only
/// drops the connection), and neither does a Terminate this side sends for a CRC or framing error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum QueuePairEvent {
    /// IBV_EVENT_QP_FATAL: a local protection error (an SGE of this queue pair's own request), or an inbound
    /// Send or Read Response whose header broke a DDP rule (queue number, MSN, message offset, length).
    Fatal,
    /// IBV_EVENT_QP_REQ_ERR: the peer's Read Request named a source this side refused (siw: its Read
    /// Response fails at transmit).
    RequestError,
    /// IBV_EVENT_QP_ACCESS_ERR: the peer's RDMA Write named a region of another protection domain, without
    /// REMOTE_WRITE or outside its bounds; or an inbound Send's Receive, or a Read Response's sink, could not
    /// be written (siw: `siw_check_mem` / `siw_check_sge` failed), or the Write named an STag a Send with
    /// Invalidate invalidated. A Write to an STag that names no region here (never registered, deregistered)
    /// raises none: siw raises none when `siw_mem_id2obj` finds no region.
    AccessError,
}

impl QueuePairEvent {
    /// The event that a queue pair entering Error for `info` raises, if any (see the variants; a local
    /// protection error's is raised where it is found, `QueuePair::fail_local`).
    pub fn of_terminate(info: &TerminateInfo) -> Option<QueuePairEvent> {
        use super::violation::Violation::*;
        if info.from_peer {
            return None;
        }
        match info.violation? {
            WriteOutOfBounds
            | WriteNotAssociated
            | WriteWithoutRemoteWrite
            | WriteInvalidatedStag
            | ReceiveInaccessible
            | ReadSinkInaccessible => Some(QueuePairEvent::AccessError),
            ReadSourceInvalidStag | ReadSourceOutOfBounds | ReadSourceNotAssociated | ReadWithoutRemoteRead => {
                Some(QueuePairEvent::RequestError)
            }
            SendWrongQueue
            | SendMsnOutOfSequence
            | SendOffsetOutOfOrder
            | SendLongerThanReceive
            | ReadResponseWrongStag
            | ReadResponseWrongOffset
            | ReadResponseShort => Some(QueuePairEvent::Fatal),
            _ => None,
        }
    }
}

/// Why a stream was terminated, as the peer's (or our own) Terminate said (RFC 5040 §4.8). Its `Display`
/// says it in words: who terminated it, the cause by name with its numbers, and what it means (see
/// [`TerminateCause`](soft_rdma_common::wire::TerminateCause)'s `Display`):
///
/// ```text
/// the peer terminated the connection with DDP tagged buffer error, invalid STag (layer 1, type 1,
/// code 0x00; RFC 5041 §7.2): the receiver refused an RDMA Write or Read Response whose STag it does not
/// accept: …
/// this side terminated the connection with DDP tagged buffer error, invalid STag (…): the peer's RDMA
/// Write to STag 0x00000301 (64 bytes at tagged offset 0): the region was registered without REMOTE_WRITE:
/// register it with Access::REMOTE_WRITE for the peer to write it
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TerminateInfo {
    pub layer: u8,
    pub error_type: u8,
    pub code: u8,
    /// True when the peer sent it; false when this side detected the error and sent it.
    pub from_peer: bool,
    /// This side's Terminate for a rule an inbound message broke: which rule. `None` when the peer sent
    /// the Terminate (it carries only the cause), and for errors found below the queue pair (a bad CRC, a
    /// malformed FPDU: the cause names them).
    pub violation: Option<Violation>,
    /// The tagged buffer the offending message named, when it named one: an RDMA Write's or Read
    /// Response's STag and tagged offset with the segment's length, a Read Request's source and size. A
    /// peer's Terminate names one only if it carried the terminated header ([`TaggedRange::named_by`]).
    pub buffer: Option<TaggedRange>,
}

/// A range of a tagged buffer as a message named it: its STag, the tagged offset and the length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TaggedRange {
    pub stag: Stag,
    pub offset: u64,
    pub length: u32,
}

impl TaggedRange {
    /// The tagged buffer a peer's Terminate names, when it carried one (RFC 5040 §4.8): the terminated Read
    /// Request's source (R), else the terminated tagged DDP header's STag and tagged offset (D) with the
    /// segment's payload length (M, less the header). siw sends these fields; soft-rdma sends none.
    pub fn named_by(t: &TerminateRepr<'_>) -> Option<TaggedRange> {
        if let Some(r) = t.read_request {
            return Some(TaggedRange {
                stag: Stag(r.source_stag),
                offset: r.source_offset,
                length: r.read_size,
            });
        }
        let (ddp, header) = DdpRepr::parse(t.ddp_header?).ok()?;
        let Placement::Tagged { stag, offset } = ddp.placement else {
            return None;
        };
        Some(TaggedRange {
            stag: Stag(stag),
            offset,
            length: u32::from(t.ddp_segment_length?).saturating_sub(header as u32),
        })
    }
}

/// "STag 0x00000301 (64 bytes at tagged offset 0)".
impl fmt::Display for TaggedRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "STag {:#010x} ({} bytes at tagged offset {})",
            self.stag.0, self.length, self.offset
        )
    }
}

impl TerminateInfo {
    /// The Terminate that carries `cause`; `from_peer` says whether the peer sent it.
    pub fn new(cause: soft_rdma_common::wire::TerminateCause, from_peer: bool) -> Self {
        TerminateInfo {
            layer: cause.layer,
            error_type: cause.error_type,
            code: cause.code,
            from_peer,
            violation: None,
            buffer: None,
        }
    }

    /// This side's Terminate carrying `cause` for `violation`, found on a message that named `buffer`.
    pub fn found(
        cause: soft_rdma_common::wire::TerminateCause,
        violation: Violation,
        buffer: Option<TaggedRange>,
    ) -> Self {
        TerminateInfo {
            violation: Some(violation),
            buffer,
            ..TerminateInfo::new(cause, false)
        }
    }

    /// The (layer, type, code) it carried.
    pub fn cause(&self) -> soft_rdma_common::wire::TerminateCause {
        soft_rdma_common::wire::TerminateCause::new(self.layer, self.error_type, self.code)
    }
}

impl fmt::Display for TerminateInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let who = if self.from_peer { "the peer" } else { "this side" };
        let cause = self.cause();
        write!(f, "{who} terminated the connection with {cause}")?;
        match self.violation {
            Some(v) => {
                write!(f, ": {}", v.message())?;
                if let Some(b) = self.buffer {
                    write!(f, " {} {b}", v.preposition())?;
                }
                write!(f, ": {}", v.rule())
            }
            None => {
                if let Some(b) = self.buffer {
                    write!(f, ": the message named {b}")?;
                }
                match super::violation::meaning(cause) {
                    Some(m) => write!(f, ": {m}"),
                    None => Ok(()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use soft_rdma_common::wire::TerminateCause;
    use soft_rdma_common::wire::terminate::{ddp_code, ddp_type, layer};

    const DDP_INVALID_STAG: TerminateCause =
        TerminateCause::new(layer::DDP, ddp_type::TAGGED_BUFFER, ddp_code::TAGGED_INVALID_STAG);

    fn status(state: QueuePairState, terminate: Option<TerminateInfo>, ord: u32) -> QueuePairStatus {
        QueuePairStatus {
            id: 3,
            session: 1,
            connector: Some(4),
            state,
            terminate,
            ird: 4,
            ord,
            stats: QpStats::default(),
        }
    }

    fn completion(op: CompletionOp, status: NdStatus) -> Completion {
        Completion {
            qp: QueuePairId(3),
            wr_id: 7,
            op,
            status,
            bytes: 0,
            solicited: false,
            invalidated: None,
        }
    }

    /// The sender's view (the cause alone, and what it can check) and the receiver's (the rule, the buffer,
    /// what to do), each with the cause by name and number.
    #[test]
    fn a_terminate_in_words_on_both_sides() {
        let peer = TerminateInfo::new(DDP_INVALID_STAG, true).to_string();
        assert!(
            peer.starts_with(
                "the peer terminated the connection with DDP tagged buffer error, invalid STag (layer 1, \
                 type 1, code 0x00; RFC 5041 §7.2): the receiver refused an RDMA Write"
            ),
            "{peer}"
        );
        assert!(peer.contains("Access::REMOTE_WRITE"), "{peer}");
        let buffer = TaggedRange {
            stag: Stag(0x301),
            offset: 0,
            length: 64,
        };
        let mine = TerminateInfo::found(DDP_INVALID_STAG, Violation::WriteWithoutRemoteWrite, Some(buffer));
        assert_eq!(
            mine.to_string(),
            "this side terminated the connection with DDP tagged buffer error, invalid STag (layer 1, type \
             1, code 0x00; RFC 5041 §7.2): the peer's RDMA Write to STag 0x00000301 (64 bytes at tagged \
             offset 0): the region was registered without REMOTE_WRITE: register it with \
             Access::REMOTE_WRITE for the peer to write it"
        );
        let unknown = TerminateInfo::new(TerminateCause::new(layer::DDP, 7, 9), true).to_string();
        assert_eq!(
            unknown,
            "the peer terminated the connection with DDP error of undefined type 7 (layer 1, type 7, code \
             0x09; RFC 5041 §7.2)"
        );
    }

    /// A peer's Terminate that carries the terminated header (as siw's do) names the buffer; one without
    /// (as soft-rdma's) names none.
    #[test]
    fn a_peers_terminate_names_the_buffer_it_carried() {
        use soft_rdma_common::wire::read_request::ReadRequestRepr;
        let tagged: [u8; 14] = [0xC1, 0x40, 0, 0, 0x03, 0x01, 0, 0, 0, 0, 0, 0, 0x10, 0];
        let mut t = TerminateRepr {
            ddp_segment_length: Some(14 + 100),
            ddp_header: Some(&tagged),
            ..TerminateRepr::new(DDP_INVALID_STAG)
        };
        let named = TaggedRange {
            stag: Stag(0x301),
            offset: 0x1000,
            length: 100,
        };
        assert_eq!(TaggedRange::named_by(&t), Some(named));
        let info = TerminateInfo {
            buffer: TaggedRange::named_by(&t),
            ..TerminateInfo::new(DDP_INVALID_STAG, true)
        };
        let words = info.to_string();
        assert!(
            words.contains("(layer 1, type 1, code 0x00; RFC 5041 §7.2): the message named STag 0x00000301 (100 bytes at tagged offset 4096): the receiver refused"),
            "{words}"
        );
        t.ddp_segment_length = None;
        assert_eq!(TaggedRange::named_by(&t), None, "no length, no range");
        t.read_request = Some(ReadRequestRepr {
            sink_stag: 9,
            sink_offset: 0,
            read_size: 64,
            source_stag: 0x402,
            source_offset: 8,
        });
        let source = TaggedRange {
            stag: Stag(0x402),
            offset: 8,
            length: 64,
        };
        assert_eq!(TaggedRange::named_by(&t), Some(source));
        assert_eq!(TaggedRange::named_by(&TerminateRepr::new(DDP_INVALID_STAG)), None);
    }

    /// A failed completion says what failed and why, from the queue pair's state.
    #[test]
    fn failed_completions_say_why() {
        let ended = Some(TerminateInfo::new(DDP_INVALID_STAG, true));
        let flushed = status(QueuePairState::Error, ended, 4)
            .result_of(&completion(CompletionOp::Send, NdStatus::Canceled))
            .unwrap_err();
        assert_eq!(flushed.status, NdStatus::Canceled);
        assert!(
            flushed.context.starts_with(
                "Send 7 on queue pair 3 was flushed, not carried out: the queue pair is in Error because \
                 the peer terminated the connection with DDP tagged buffer error, invalid STag"
            ),
            "{flushed}"
        );
        let no_ord = status(QueuePairState::Connected, None, 0)
            .result_of(&completion(CompletionOp::Read, NdStatus::InvalidParameter))
            .unwrap_err();
        assert!(
            no_ord.context.starts_with(
                "RDMA Read 7 on queue pair 3 was refused: this connection's outbound read limit (ORD) is 0"
            ),
            "{no_ord}"
        );
        assert!(no_ord.context.contains("ReadLimits::ADAPTER_MAX"), "{no_ord}");
        // With an outbound limit, INVALID_PARAMETER is something else, and says so.
        let other = status(QueuePairState::Connected, None, 4)
            .result_of(&completion(CompletionOp::Read, NdStatus::InvalidParameter))
            .unwrap_err();
        assert!(!other.context.contains("ORD"), "{other}");
        assert!(other.context.contains("2^31 bytes"), "{other}");
        let ok = completion(CompletionOp::Write, NdStatus::Success);
        assert_eq!(status(QueuePairState::Error, ended, 0).result_of(&ok), Ok(()));
        let shown = status(QueuePairState::Error, ended, 4).to_string();
        assert!(
            shown.starts_with("queue pair 3: Error: the peer terminated"),
            "{shown}"
        );
    }

    #[test]
    fn access_rights_by_name() {
        assert_eq!(Access::default(), Access::LOCAL_READ);
        assert_eq!(Access::LOCAL_READ.to_string(), "LOCAL_READ");
        assert_eq!(
            Access::REMOTE_READ_WRITE.to_string(),
            "REMOTE_READ | REMOTE_WRITE"
        );
        assert_eq!(
            Access::REMOTE_READ_WRITE,
            Access::REMOTE_READ | Access::REMOTE_WRITE
        );
        assert_eq!(
            Access::ALL.to_string(),
            "LOCAL_WRITE | REMOTE_READ | REMOTE_WRITE"
        );
        assert_eq!(Access(0x11).to_string(), "LOCAL_WRITE | 0x10");
        assert!(!Access(0x11).is_valid());
    }
}
