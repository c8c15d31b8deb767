//! Protocol errors found on inbound messages ([`Fault`]: the [`Violation`] and the tagged buffer the message
//! named, each violation's Terminate cause: RFC 5040 §7.2, RFC 5041 §7.2, siw where the RFCs leave a
//! choice), and the queue pair's end: the Terminate it sent or received and the flush of everything
//! outstanding.

use super::*;

/// A protocol error found on an inbound message: the rule it broke and the tagged buffer it named.
pub(super) struct Fault {
    pub(super) violation: Violation,
    pub(super) buffer: Option<TaggedRange>,
}

impl Fault {
    /// `violation`, on a message whose tagged buffer (if it named one) says nothing more.
    pub(super) const fn new(violation: Violation) -> Fault {
        Fault {
            violation,
            buffer: None,
        }
    }

    /// `violation`, on a message that named `length` bytes at tagged offset `offset` of `stag`.
    pub(super) fn at(violation: Violation, stag: u32, offset: u64, length: u64) -> Fault {
        let length = u32::try_from(length).unwrap_or(u32::MAX);
        Fault {
            violation,
            buffer: Some(TaggedRange {
                stag: Stag(stag),
                offset,
                length,
            }),
        }
    }

    /// The Terminate that reports it ([`cause_of`]).
    pub(super) fn cause(&self) -> TerminateCause {
        cause_of(self.violation)
    }

    /// The status of the Receive being filled, when the error was on it: DATA_OVERRUN for a Send longer than
    /// it (RFC 5041 §7.2), ACCESS_VIOLATION when its memory went away (siw `siw_proc_send`); `None`:
    /// REMOTE_ERROR.
    pub(super) fn receive_status(&self) -> Option<NdStatus> {
        match self.violation {
            Violation::SendLongerThanReceive => Some(NdStatus::DataOverrun),
            Violation::ReceiveInaccessible => Some(NdStatus::AccessViolation),
            _ => None,
        }
    }

    /// What the queue pair records of it ([`QueuePair::terminate_info`]).
    pub(super) fn info(&self) -> TerminateInfo {
        TerminateInfo::found(self.cause(), self.violation, self.buffer)
    }
}

/// The Terminate cause of each violation (RFC 5040 §7.2 RDMAP, RFC 5041 §7.2 DDP; where the RFCs allow
/// several, siw's choice: `siw_tagged_error`, `siw_rdmap_error`, docs/iwarp-wire.md §5).
pub(super) const fn cause_of(v: Violation) -> TerminateCause {
    use Violation::*;
    let (layer, error_type, code) = match v {
        // RFC 5040 §4.2 table, §7.2: a message in the wrong kind of segment, or where none belongs.
        TerminateOnDataPath
        | SendTagged
        | WriteUntagged
        | ReadRequestTagged
        | ReadResponseUntagged
        | ReadResponseUnexpected => (
            layer::RDMAP,
            rdmap_type::REMOTE_OPERATION,
            rdmap_code::UNEXPECTED_OPCODE,
        ),
        // RFC 5040 §5.1, RFC 5041 §7.2: untagged queue, MSN, message offset and buffer rules.
        SendWrongQueue | ReadRequestWrongQueue => (
            layer::DDP,
            ddp_type::UNTAGGED_BUFFER,
            ddp_code::UNTAGGED_INVALID_QN,
        ),
        SendMsnOutOfSequence | ReadRequestMsnOutOfSequence => (
            layer::DDP,
            ddp_type::UNTAGGED_BUFFER,
            ddp_code::UNTAGGED_MSN_RANGE,
        ),
        SendWithoutReceive => (
            layer::DDP,
            ddp_type::UNTAGGED_BUFFER,
            ddp_code::UNTAGGED_NO_BUFFER,
        ),
        SendOffsetOutOfOrder | ReadRequestOffset => (
            layer::DDP,
            ddp_type::UNTAGGED_BUFFER,
            ddp_code::UNTAGGED_INVALID_MO,
        ),
        SendLongerThanReceive => (
            layer::DDP,
            ddp_type::UNTAGGED_BUFFER,
            ddp_code::UNTAGGED_MESSAGE_TOO_LONG,
        ),
        // siw_proc_send: a Receive SGE that fails its check is a local catastrophic DDP error.
        ReceiveInaccessible => (layer::DDP, ddp_type::CATASTROPHIC, DDP_LOCAL_CATASTROPHIC),
        // RFC 5040 §5.3, §7.2: remote operation error "cannot invalidate".
        CannotInvalidate => (
            layer::RDMAP,
            rdmap_type::REMOTE_OPERATION,
            rdmap_code::CANNOT_INVALIDATE,
        ),
        // siw_tagged_error: a tagged access refused at the DDP layer. RFC 5041 has no access-rights code;
        // siw reports invalid STag for it. siw_rresp_check_ntoh: a Response to the wrong STag is one too.
        WriteInvalidStag | WriteInvalidatedStag | WriteWithoutRemoteWrite | ReadResponseWrongStag => {
            (layer::DDP, ddp_type::TAGGED_BUFFER, ddp_code::TAGGED_INVALID_STAG)
        }
        // siw_rresp_check_ntoh: a Response at the wrong TO or of the wrong length is base or bounds, and so
        // is a sink deregistered meanwhile.
        WriteOutOfBounds | ReadResponseWrongOffset | ReadResponseShort | ReadSinkInaccessible => (
            layer::DDP,
            ddp_type::TAGGED_BUFFER,
            ddp_code::TAGGED_BASE_OR_BOUNDS,
        ),
        WriteNotAssociated => (
            layer::DDP,
            ddp_type::TAGGED_BUFFER,
            ddp_code::TAGGED_STAG_NOT_ASSOCIATED,
        ),
        // RFC 5040 §5.2, §4.4; RFC 6581 §9 (siw "IRQ exceeded"): catastrophic, localized to the stream.
        ReadRequestSegmented | ReadRequestSize | InboundReadLimitExceeded => (
            layer::RDMAP,
            rdmap_type::REMOTE_OPERATION,
            rdmap_code::CATASTROPHIC_STREAM,
        ),
        // siw_rdmap_error: a Read Request's source refused, RDMAP remote protection error.
        ReadSourceInvalidStag => (
            layer::RDMAP,
            rdmap_type::REMOTE_PROTECTION,
            rdmap_code::INVALID_STAG,
        ),
        ReadSourceOutOfBounds => (
            layer::RDMAP,
            rdmap_type::REMOTE_PROTECTION,
            rdmap_code::BASE_OR_BOUNDS,
        ),
        ReadWithoutRemoteRead => (
            layer::RDMAP,
            rdmap_type::REMOTE_PROTECTION,
            rdmap_code::ACCESS_RIGHTS,
        ),
        ReadSourceNotAssociated => (
            layer::RDMAP,
            rdmap_type::REMOTE_PROTECTION,
            rdmap_code::STAG_NOT_ASSOCIATED,
        ),
        ReadSinkWraps => (layer::RDMAP, rdmap_type::REMOTE_PROTECTION, rdmap_code::TO_WRAP),
    };
    TerminateCause::new(layer, error_type, code)
}

/// siw `siw_tagged_error`: the rule an RDMA Write broke when its sink was refused.
pub(super) const fn write_refused(e: AccessError) -> Violation {
    match e {
        AccessError::InvalidStag => Violation::WriteInvalidStag,
        AccessError::BaseOrBounds => Violation::WriteOutOfBounds,
        AccessError::NotAssociated => Violation::WriteNotAssociated,
        AccessError::AccessRights => Violation::WriteWithoutRemoteWrite,
    }
}

/// siw `siw_rdmap_error`: the rule a Read Request broke when its source was refused.
pub(super) const fn read_source_refused(e: AccessError) -> Violation {
    match e {
        AccessError::InvalidStag => Violation::ReadSourceInvalidStag,
        AccessError::BaseOrBounds => Violation::ReadSourceOutOfBounds,
        AccessError::AccessRights => Violation::ReadWithoutRemoteRead,
        AccessError::NotAssociated => Violation::ReadSourceNotAssociated,
    }
}

/// The Terminate siw sends after a local protection error (`siw_qp_sq_proc_tx`: RDMAP, catastrophic,
/// unspecified).
pub(crate) const LOCAL_PROTECTION: TerminateCause =
    TerminateCause::new(layer::RDMAP, rdmap_type::CATASTROPHIC, rdmap_code::UNSPECIFIED);

impl QueuePair {
    /// A local protection error (an SGE whose lkey names no region of this queue pair's protection domain,
    /// a range outside its region, a sink without LOCAL_WRITE): the request completes ACCESS_VIOLATION
    /// (IBV_WC_LOC_PROT_ERR; siw says LOC_QP_OP_ERR), the queue pair moves to Error and everything else
    /// outstanding flushes, and a connected one owes its peer a Terminate (RDMAP catastrophic,
    /// unspecified), which its next transmit sends. As siw: `siw_check_sgl_tx` fails,
    /// `siw_qp_sq_proc_tx` queues the Terminate, `siw_qp_cm_drop` moves the QP to ERROR.
    pub(super) fn fail_local(
        &mut self,
        id: u64,
        op: CompletionOp,
        out: &mut Vec<(CompletionQueueId, Completion)>,
    ) {
        out.push(self.completion(id, op, NdStatus::AccessViolation, 0));
        let connected = self.state == QpState::Connected;
        if self.state != QpState::Error {
            // siw: `siw_qp_sq_proc_tx` raises IB_EVENT_QP_FATAL after a failed SQ work request.
            self.event = Some(QueuePairEvent::Fatal);
        }
        self.fail(TerminateInfo::new(LOCAL_PROTECTION, false), None, out);
        if connected {
            self.local_terminate = Some(LOCAL_PROTECTION);
        }
    }

    /// The stream is terminated (by us or the peer): Reads in the ORQ complete with REMOTE_ERROR (their
    /// Responses will never come), the Receive being filled with `receive` (or REMOTE_ERROR), and everything
    /// else is flushed with CANCELED (RFC 5040 §5.4, §6.2.2 abortive teardown: outstanding work completes in
    /// error; siw flushes its queues the same way, `siw_sq_flush` / `siw_rq_flush`).
    pub(super) fn fail(
        &mut self,
        info: TerminateInfo,
        receive: Option<NdStatus>,
        out: &mut Vec<(CompletionQueueId, Completion)>,
    ) {
        if self.state != QpState::Error && self.event.is_none() {
            self.event = QueuePairEvent::of_terminate(&info);
        }
        self.state = QpState::Error;
        if self.terminate.is_none() {
            self.terminate = Some(info);
        }
        while let Some(o) = self.orq.pop_front() {
            if let Some(id) = o.wr_id {
                out.push(self.completion(id, CompletionOp::Read, NdStatus::RemoteError, o.received));
            }
        }
        if let Some(received) = self.rx_send.take()
            && let Some(r) = self.rx_receive.take()
        {
            let status = receive.unwrap_or(NdStatus::RemoteError);
            out.push(self.completion(r.id, CompletionOp::Receive, status, received));
        }
        self.flush(NdStatus::Canceled, out);
    }

    /// Whether its local protection error's Terminate has gone out, so that its connection is to be
    /// dropped now, as siw's `siw_qp_cm_drop` (once: taking it clears it).
    pub fn take_connection_drop(&mut self) -> bool {
        std::mem::take(&mut self.drop_connection)
    }

    /// The asynchronous event its move to Error raised (once: taking it clears it).
    pub fn take_event(&mut self) -> Option<QueuePairEvent> {
        self.event.take()
    }

    /// The peer sent a Terminate (`info.from_peer`), or the stream died: Error, and everything outstanding
    /// completes (see [`QueuePair::on_message`]'s error path).
    pub fn on_terminate(&mut self, info: TerminateInfo, out: &mut Vec<(CompletionQueueId, Completion)>) {
        debug!(qp = self.id.0, ?info, "stream terminated");
        self.fail(info, None, out);
    }

    /// Disconnect, QP destroyed or connection closed: every outstanding work request (ORQ and send queue in
    /// posting order, then receives in posting order) completes with `status`. Moves to Error. Idempotent.
    pub fn flush(&mut self, status: NdStatus, out: &mut Vec<(CompletionQueueId, Completion)>) {
        if self.state != QpState::Error {
            debug!(qp = self.id.0, ?status, "queue pair flushed");
        }
        self.state = QpState::Error;
        self.tx_active = None;
        self.irq.clear();
        while let Some(o) = self.orq.pop_front() {
            if let Some(id) = o.wr_id {
                out.push(self.completion(id, CompletionOp::Read, status, 0));
            }
        }
        while let Some(e) = self.sq.pop_front() {
            out.push(self.completion(e.wr.id(), e.wr.op(), status, 0));
        }
        self.rx_send = None;
        // The Receive being filled first (it was the oldest); a shared receive queue is left alone (siw
        // `siw_rq_flush` does not touch `qp->srq`).
        while let Some(r) = self.rx_receive.take().or_else(|| self.rq.pop_front()) {
            out.push(self.completion(r.id, CompletionOp::Receive, status, 0));
        }
    }
}
