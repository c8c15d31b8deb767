//! One queue pair's RDMAP/DDP data path (RFC 5040 RDMAP, RFC 5041 DDP), sans-IO: the send queue, the receive
//! queue, the outstanding-read queue (ORQ, Reads this side issued) and the inbound-read queue (IRQ, Reads the
//! peer issued), the untagged queues' message sequence numbers, segmentation of outbound messages into FPDUs
//! (RFC 5044 §4), placement of inbound segments, the rule every protocol error breaks ([`Violation`], which
//! the queue pair's status keeps) with its Terminate cause, and the rule that every posted work request
//! completes exactly once.
//!
//! It never touches sockets or clocks. The connection manager owns the byte stream: it cuts it into FPDUs,
//! checks the CRC, parses [`MessageRepr`], handles the MPA handshake, the RTR and inbound Terminates, and calls
//! [`QueuePair::on_message`] with everything else; it sends what [`QueuePair::poll_transmit`] appends. Memory is
//! reached only through the [`MemoryRegistry`] and its checks.
//!
//! Behaviour follows the RFCs and, where they leave a choice, Linux siw (`drivers/infiniband/sw/siw`).

use std::collections::VecDeque;

use crate::warn_limited;
use soft_rdma_common::wire::TerminateCause;
use soft_rdma_common::wire::ddp::{
    DdpRepr, Placement, QN_READ_REQUEST, QN_SEND, QN_TERMINATE, TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN,
};
use soft_rdma_common::wire::rdmap::{MessageRepr, READ_REQUEST_LEN, RdmapOpcode, ReadRequestRepr};
use soft_rdma_common::wire::terminate::{TerminateRepr, ddp_code, ddp_type, layer, rdmap_code, rdmap_type};
use tracing::{debug, trace};

use super::framing::{Rtr, is_rtr};
use super::ids::{Domain, SessionId};
use super::memory::{AccessError, MemoryRegistry};
use super::srq::{PostedReceive, SharedReceiveQueue};
use super::verbs::{
    Access, Completion, CompletionOp, CompletionQueueId, QpStats, QueuePairConfig, QueuePairEvent, QueuePairId, Sge, Stag,
    TaggedRange, TerminateInfo, Violation, WorkRequest,
};
use crate::error::NdStatus;

mod faults;
pub(crate) use faults::LOCAL_PROTECTION;
mod read_ahead;
mod receive;
mod send;
mod sgl;
#[cfg(test)]
mod tests;

use faults::*;
use read_ahead::ReadAhead;
use sgl::*;

/// What the connection agreed on for this QP's data path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpParams {
    /// CRC32c negotiated (RFC 5044 §4.4): outbound FPDUs carry it; the CM checks inbound ones.
    pub crc: bool,
    /// The largest ULPDU (DDP header + payload) an outbound FPDU may carry (RFC 5044 §4.1 MULPDU). Clamped to
    /// [`MIN_MAX_ULPDU`, 65535].
    pub max_ulpdu: usize,
    /// Inbound read limit: Read Requests this side queues before it must answer them (RFC 6581 §9 IRD).
    pub ird: u32,
    /// Outbound read limit: Read Requests this side has in flight at most (RFC 6581 §9 ORD).
    pub ord: u32,
}

/// Where a queue pair stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum QpState {
    /// Created, not yet connected: Receives may be posted; Sends, Writes and Reads queue.
    Idle,
    /// The stream is in FPDU mode (RTS).
    Connected,
    /// Terminated, disconnected or destroyed: everything outstanding was flushed; new requests are Canceled.
    Error,
}

/// The smallest usable `max_ulpdu`: an untagged DDP header plus a Read Request header, since a Read Request
/// is a single DDP segment (RFC 5040 §5.2, §4.4).
pub const MIN_MAX_ULPDU: usize = UNTAGGED_HEADER_LEN + READ_REQUEST_LEN;

/// The largest message a work request may carry: 2^31 bytes (ND's limit; RFC 5041 §5.2 allows up to 2^32 - 1,
/// the reach of the 32-bit MO).
const MAX_MESSAGE_LEN: u64 = 1 << 31;

/// siw `SIW_IRQ_MAXBURST_SQ_ACTIVE`: with both queues ready, every 4th message comes from the send queue
/// (`siw_activate_tx`: `++irq_burst >= SIW_IRQ_MAXBURST_SQ_ACTIVE` skips the IRQ once).
const IRQ_MAX_BURST_SQ_ACTIVE: u32 = 4;

/// RFC 5041 §7.2: DDP error type 0 (catastrophic), code 0x00 "local catastrophic error".
const DDP_LOCAL_CATASTROPHIC: u8 = 0x00;

/// A send-side work request not yet fully transmitted.
struct SqEntry {
    wr: WorkRequest,
    /// Message length (Read: the read size).
    len: u32,
    /// Payload bytes already transmitted.
    sent: u32,
    /// A gather SGE failed its re-check after the message started: it completes with ACCESS_VIOLATION.
    faulted: bool,
    /// The payload read ahead, when its memory's reads are costly (`None` until the message starts, and
    /// for memory that is copied or sent in place per FPDU).
    read_ahead: Option<ReadAhead>,
}

/// A Read whose Request is on the wire (RFC 5040 §5.2: Responses arrive in Request order).
struct OrqEntry {
    /// `None`: the RFC 6581 Read RTR this side sent; its Response completes nothing.
    wr_id: Option<u64>,
    /// ND_OP_FLAG_SILENT_SUCCESS: the Response completes nothing unless it fails.
    silent: bool,
    sink: Sge,
    received: u32,
}

/// An inbound Read Request being answered.
struct IrqEntry {
    req: ReadRequestRepr,
    sent: u32,
    /// The source read ahead, when its memory's reads are costly (as [`SqEntry::read_ahead`]).
    read_ahead: Option<ReadAhead>,
}

/// A posted Receive (the shared receive queue's entries are the same).
type RqEntry = PostedReceive;

/// Which queue's head message is being segmented: segments of different messages never interleave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    Sq,
    Irq,
}

/// One queue pair's data-path state.
pub struct QueuePair {
    id: QueuePairId,
    /// The session that made it and the PD it was made in (`config.pd`): every region it reaches, for
    /// its own requests and for its peer's, must be of this domain.
    domain: Domain,
    config: QueuePairConfig,
    state: QpState,
    params: QpParams,
    sq: VecDeque<SqEntry>,
    orq: VecDeque<OrqEntry>,
    irq: VecDeque<IrqEntry>,
    rq: VecDeque<RqEntry>,
    /// Bytes received of the inbound Send being placed into the Receive in `rx_receive`, if one is in
    /// progress.
    rx_send: Option<u32>,
    /// The Receive the inbound Send in progress is placed into, taken off the receive queue (or the shared
    /// receive queue) at its first segment, as siw's `siw_rqe_get`: other queue pairs' Sends take the next.
    rx_receive: Option<RqEntry>,
    /// The queue whose head message is partly transmitted.
    tx_active: Option<Source>,
    /// Read Responses sent in a row while the send queue was ready (siw `irq_burst`).
    irq_burst: u32,
    /// RFC 5041 §5.1: MSNs per untagged queue, starting at 1, modulo 2^32.
    tx_send_msn: u32,
    tx_read_msn: u32,
    rx_send_msn: u32,
    rx_read_msn: u32,
    terminate: Option<TerminateInfo>,
    /// A Terminate this side owes its peer after a local protection error ([`QueuePair::fail_local`]):
    /// the next transmit sends it.
    local_terminate: Option<TerminateCause>,
    /// The asynchronous event its move to Error raised, until the data path takes it
    /// ([`QueuePair::take_event`]).
    event: Option<QueuePairEvent>,
    /// The local protection error's Terminate went out: the connection is to be dropped
    /// ([`QueuePair::take_connection_drop`]).
    drop_connection: bool,
    stats: QpStats,
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair")
            .field("id", &self.id)
            .field("domain", &self.domain)
            .field("state", &self.state)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl QueuePair {
    pub fn new(id: QueuePairId, session: SessionId, config: QueuePairConfig) -> Self {
        QueuePair {
            id,
            domain: Domain::new(session, config.pd),
            config,
            state: QpState::Idle,
            params: QpParams {
                crc: false,
                max_ulpdu: MIN_MAX_ULPDU,
                ird: 0,
                ord: 0,
            },
            sq: VecDeque::new(),
            orq: VecDeque::new(),
            irq: VecDeque::new(),
            rq: VecDeque::new(),
            rx_send: None,
            rx_receive: None,
            tx_active: None,
            irq_burst: 0,
            tx_send_msn: 1,
            tx_read_msn: 1,
            rx_send_msn: 1,
            rx_read_msn: 1,
            terminate: None,
            local_terminate: None,
            event: None,
            drop_connection: false,
            stats: QpStats::default(),
        }
    }

    pub fn id(&self) -> QueuePairId {
        self.id
    }

    pub fn session(&self) -> SessionId {
        self.domain.session
    }

    pub fn config(&self) -> &QueuePairConfig {
        &self.config
    }

    pub fn state(&self) -> QpState {
        self.state
    }

    /// Why the QP is in Error, if a Terminate (sent or received) was involved.
    pub fn terminate_info(&self) -> Option<TerminateInfo> {
        self.terminate
    }

    /// What the connection agreed on for this queue pair (read limits 0 until it is connected).
    pub fn params(&self) -> QpParams {
        self.params
    }

    pub fn stats(&self) -> QpStats {
        let n = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        QpStats {
            sq_outstanding: n(self.sq.len() + self.orq.iter().filter(|o| o.wr_id.is_some()).count()),
            rq_posted: n(self.rq.len() + usize::from(self.rx_receive.is_some())),
            orq_outstanding: n(self.orq.len()),
            irq_queued: n(self.irq.len()),
            ..self.stats.clone()
        }
    }

    fn completion(
        &self,
        wr_id: u64,
        op: CompletionOp,
        status: NdStatus,
        bytes: u32,
    ) -> (CompletionQueueId, Completion) {
        let cq = match op {
            CompletionOp::Receive => self.config.receive_cq,
            _ => self.config.send_cq,
        };
        let c = Completion {
            qp: self.id,
            wr_id,
            op,
            status,
            bytes,
            solicited: false,
            invalidated: None,
        };
        (cq, c)
    }

    /// Posts one work request. Never blocks and never fails synchronously: every problem is a completion in
    /// `out` (send CQ for Send/Write/Read, receive CQ for Receive). Checks in order: QP in Error → CANCELED (a
    /// flushed WR, as verbs/ND after the QP left RTS); too many SGEs → INVALID_PARAMETER; queue full →
    /// INSUFFICIENT_RESOURCES; a local SGE of another protection domain, invalid, out of bounds or (where
    /// data is scattered) lacking LOCAL_WRITE is a local protection error: ACCESS_VIOLATION, and the queue
    /// pair moves to Error (`QueuePair::fail_local`; zero-length SGEs are not checked, as siw
    /// `siw_check_sgl_tx`); message longer than 2^31, or a remote range that wraps → INVALID_PARAMETER.
    pub fn post(
        &mut self,
        wr: WorkRequest,
        mem: &MemoryRegistry,
        out: &mut Vec<(CompletionQueueId, Completion)>,
    ) {
        let (id, op) = (wr.id(), wr.op());
        let refuse = |qp: &QueuePair, out: &mut Vec<_>, status: NdStatus, why: &str| {
            debug!(qp = qp.id.0, wr = id, ?op, ?status, why, "work request refused");
            out.push(qp.completion(id, op, status, 0));
        };
        if self.state == QpState::Error {
            return refuse(self, out, NdStatus::Canceled, "queue pair in error");
        }
        let (sgl, max_sge, need): (&[Sge], u32, Access) = match &wr {
            WorkRequest::Send { sgl, .. } | WorkRequest::Write { sgl, .. } => {
                (sgl, self.config.max_send_sge, Access(0))
            }
            // One sink SGE, as siw; a zero-length Read has nothing to scatter.
            WorkRequest::Read { sink, .. } => (
                std::slice::from_ref(sink),
                self.config.max_send_sge.max(1),
                Access::LOCAL_WRITE,
            ),
            WorkRequest::Receive { sgl, .. } => (sgl, self.config.max_receive_sge, Access::LOCAL_WRITE),
        };
        if sgl.len() as u64 > u64::from(max_sge) {
            return refuse(self, out, NdStatus::InvalidParameter, "too many SGEs");
        }
        let full = match op {
            CompletionOp::Receive => {
                (self.rq.len() + usize::from(self.rx_receive.is_some())) as u64
                    >= u64::from(self.config.receive_depth)
            }
            _ => {
                (self.sq.len() + self.orq.iter().filter(|o| o.wr_id.is_some()).count()) as u64
                    >= u64::from(self.config.send_depth)
            }
        };
        if full {
            return refuse(self, out, NdStatus::InsufficientResources, "queue full");
        }
        if let Err(e) = check_sgl(mem, self.domain, sgl, need) {
            debug!(qp = self.id.0, wr = id, error = %e, "local protection error");
            return self.fail_local(id, op, out);
        }
        let total: u64 = sgl.iter().map(|s| u64::from(s.length)).sum();
        if total > MAX_MESSAGE_LEN {
            return refuse(
                self,
                out,
                NdStatus::InvalidParameter,
                "message longer than 2^31 bytes",
            );
        }
        if let WorkRequest::Write { remote, .. } | WorkRequest::Read { remote, .. } = &wr
            && remote.offset.checked_add(total).is_none()
        {
            // RFC 5040 §7.2 "TO wrap" is an error at the peer; refuse it here instead.
            return refuse(
                self,
                out,
                NdStatus::InvalidParameter,
                "remote tagged offset wraps",
            );
        }
        let len = total as u32;
        match wr {
            WorkRequest::Receive { id, sgl } => self.rq.push_back(RqEntry {
                id,
                sgl,
                capacity: total,
            }),
            wr => self.sq.push_back(SqEntry {
                wr,
                len,
                sent: 0,
                faulted: false,
                read_ahead: None,
            }),
        }
        trace!(qp = self.id.0, wr = id, ?op, len, "posted");
    }

    /// The connection is in FPDU mode with `params`: queued work starts to go out.
    pub fn connect(&mut self, params: QpParams) {
        if self.state == QpState::Error {
            return;
        }
        self.params = QpParams {
            max_ulpdu: params.max_ulpdu.clamp(MIN_MAX_ULPDU, u16::MAX as usize),
            ..params
        };
        self.state = QpState::Connected;
        debug!(qp = self.id.0, ?params, "queue pair connected");
    }

    /// RFC 6581 §9: the connection manager sent an RTR as initiator before any of this QP's messages. A zero-length
    /// Read RTR used Read Request MSN 1 and its (zero-length) Response will arrive first: it takes an ORQ slot,
    /// as siw's `siw_qp_mpa_rts` puts it in the ORQ. A Send RTR used Send MSN 1. A Write RTR changes nothing.
    pub fn rtr_sent(&mut self, rtr: Rtr) {
        match rtr {
            Rtr::Write => {}
            Rtr::Read => {
                self.tx_read_msn = self.tx_read_msn.wrapping_add(1);
                self.orq.push_back(OrqEntry {
                    wr_id: None,
                    silent: false,
                    sink: Sge {
                        stag: Stag(0),
                        offset: 0,
                        length: 0,
                    },
                    received: 0,
                });
            }
            Rtr::Send => self.tx_send_msn = self.tx_send_msn.wrapping_add(1),
        }
    }

    /// RFC 6581 §9: the responder received the initiator's RTR. A zero-length Send RTR uses Send MSN 1 without
    /// consuming a Receive; a Read RTR is an ordinary zero-length Read Request answered with a zero-length Read
    /// Response (what siw, which queued it in its ORQ, waits for); a Write RTR is a zero-length Write (no
    /// access check, siw `siw_proc_write`). Anything else goes to [`QueuePair::on_message`].
    pub fn rtr_received(
        &mut self,
        msg: &MessageRepr<'_>,
        mem: &mut MemoryRegistry,
        srq: Option<&mut SharedReceiveQueue>,
        out: &mut Vec<(CompletionQueueId, Completion)>,
    ) -> Result<(), TerminateCause> {
        if self.state != QpState::Error
            && is_rtr(msg) == Some(Rtr::Send)
            && let Placement::Untagged { msn, .. } = msg.placement
            && msn == self.rx_send_msn
            && self.rx_send.is_none()
        {
            self.rx_send_msn = self.rx_send_msn.wrapping_add(1);
            return Ok(());
        }
        self.on_message(msg, mem, srq, out)
    }
}
