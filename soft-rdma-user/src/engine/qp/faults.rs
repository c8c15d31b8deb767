//! Protocol errors found on inbound messages ([`Fault`], with the Terminate cause of each: RFC 5040 §7.2,
//! RFC 5041 §7.2, siw where the RFCs leave a choice), and the queue pair's end: the Terminate it sent or
//! received and the flush of everything outstanding.

use super::*;

/// A protocol error found on an inbound message.
pub(super) struct Fault {
    pub(super) cause: TerminateCause,
    /// The status of the Receive being filled when the error was on it (DataOverrun, AccessViolation);
    /// `None`: RemoteError.
    pub(super) receive: Option<NdStatus>,
    pub(super) what: &'static str,
}

impl Fault {
    pub(super) const fn new(layer: u8, error_type: u8, code: u8, what: &'static str) -> Fault {
        Fault {
            cause: TerminateCause::new(layer, error_type, code),
            receive: None,
            what,
        }
    }
}

/// RFC 5040 §7.2: RDMAP remote operation error "unexpected opcode" (0x06).
pub(super) const fn unexpected_opcode(what: &'static str) -> Fault {
    Fault::new(
        layer::RDMAP,
        rdmap_type::REMOTE_OPERATION,
        rdmap_code::UNEXPECTED_OPCODE,
        what,
    )
}

/// RFC 5041 §7.2: DDP untagged buffer error `code`.
pub(super) const fn untagged(code: u8, what: &'static str) -> Fault {
    Fault::new(layer::DDP, ddp_type::UNTAGGED_BUFFER, code, what)
}

/// RFC 5041 §7.2: DDP tagged buffer error `code`.
pub(super) const fn tagged(code: u8, what: &'static str) -> Fault {
    Fault::new(layer::DDP, ddp_type::TAGGED_BUFFER, code, what)
}

/// RFC 5040 §7.2: RDMAP remote operation "catastrophic error, localized to RDMAP stream" (0x07).
pub(super) const fn catastrophic(what: &'static str) -> Fault {
    Fault::new(
        layer::RDMAP,
        rdmap_type::REMOTE_OPERATION,
        rdmap_code::CATASTROPHIC_STREAM,
        what,
    )
}

/// siw `siw_tagged_error`: a tagged-buffer access refused at the DDP layer. RFC 5041 has no access-rights code;
/// siw reports invalid STag for it.
pub(super) const fn tagged_error(e: AccessError) -> Fault {
    match e {
        AccessError::InvalidStag => tagged(ddp_code::TAGGED_INVALID_STAG, "RDMA Write: invalid STag"),
        AccessError::BaseOrBounds => tagged(ddp_code::TAGGED_BASE_OR_BOUNDS, "RDMA Write: base or bounds"),
        AccessError::NotAssociated => tagged(
            ddp_code::TAGGED_STAG_NOT_ASSOCIATED,
            "RDMA Write: STag not associated with this stream",
        ),
        AccessError::AccessRights => tagged(
            ddp_code::TAGGED_INVALID_STAG,
            "RDMA Write: region lacks remote write access",
        ),
    }
}

/// siw `siw_rdmap_error`: a Read Request's source refused, RDMAP remote protection error (RFC 5040 §7.2).
pub(super) const fn rdmap_error(e: AccessError) -> Fault {
    let (code, what) = match e {
        AccessError::InvalidStag => (rdmap_code::INVALID_STAG, "Read Request: invalid source STag"),
        AccessError::BaseOrBounds => (rdmap_code::BASE_OR_BOUNDS, "Read Request: source base or bounds"),
        AccessError::AccessRights => (
            rdmap_code::ACCESS_RIGHTS,
            "Read Request: source lacks remote read access",
        ),
        AccessError::NotAssociated => (
            rdmap_code::STAG_NOT_ASSOCIATED,
            "Read Request: source STag not associated with this stream",
        ),
    };
    Fault::new(layer::RDMAP, rdmap_type::REMOTE_PROTECTION, code, what)
}

impl QueuePair {
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
            && let Some(r) = self.rq.pop_front()
        {
            let status = receive.unwrap_or(NdStatus::RemoteError);
            out.push(self.completion(r.id, CompletionOp::Receive, status, received));
        }
        self.flush(NdStatus::Canceled, out);
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
        while let Some(r) = self.rq.pop_front() {
            out.push(self.completion(r.id, CompletionOp::Receive, status, 0));
        }
    }
}
