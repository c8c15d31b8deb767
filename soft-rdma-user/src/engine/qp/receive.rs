//! The receive side: inbound data messages checked against the queues and memory, placed, and completed
//! (RFC 5040 §5, RFC 5041 §5).

use super::*;
use crate::engine::srq::SharedReceiveQueue;
use crate::engine::traffic::MessageOp;

impl QueuePair {
    /// One inbound message (not the RTR, not a Terminate). `Err` means this side terminates the stream: the
    /// CM sends `terminate_fpdu(cause)` and closes. The QP has then already moved to Error and completed
    /// everything outstanding. In Error every message is ignored (RFC 5040 §5.4: once a Terminate was sent or
    /// received the stream carries nothing more; siw stops processing input, `rx_suspend`). `srq`: the shared
    /// receive queue this queue pair was created on, if any, which its Sends take their Receives from.
    pub fn on_message(
        &mut self,
        msg: &MessageRepr<'_>,
        mem: &mut MemoryRegistry,
        srq: Option<&mut SharedReceiveQueue>,
        out: &mut Vec<(CompletionQueueId, Completion)>,
    ) -> Result<(), TerminateCause> {
        if self.state == QpState::Error {
            return Ok(());
        }
        let result = match msg.opcode {
            RdmapOpcode::Send
            | RdmapOpcode::SendWithInvalidate
            | RdmapOpcode::SendWithSolicitedEvent
            | RdmapOpcode::SendWithSolicitedEventAndInvalidate => self.rx_send(msg, mem, srq, out),
            RdmapOpcode::RdmaWrite => self.rx_write(msg, mem),
            RdmapOpcode::RdmaReadRequest => self.rx_read_request(msg, mem),
            RdmapOpcode::RdmaReadResponse => self.rx_read_response(msg, mem, out),
            // The CM handles Terminates; one reaching the data path is out of place (RFC 5040 §7.2).
            RdmapOpcode::Terminate => Err(Fault::new(Violation::TerminateOnDataPath)),
        };
        result.map_err(|f| {
            let info = f.info();
            warn_limited!(qp = self.id.0, reason = %info, "terminating the stream");
            self.fail(info, f.receive_status(), out);
            f.cause()
        })
    }

    /// Inbound Send (RFC 5040 §5.3, RFC 5041 §5.3 untagged buffer model).
    pub(super) fn rx_send(
        &mut self,
        msg: &MessageRepr<'_>,
        mem: &mut MemoryRegistry,
        srq: Option<&mut SharedReceiveQueue>,
        out: &mut Vec<(CompletionQueueId, Completion)>,
    ) -> Result<(), Fault> {
        let (msn, offset, ulp_field) = untagged_on(msg, &SENDS)?;
        if msn != self.rx_send_msn {
            // RFC 5041 §5.1, §7.2: the MSN of a Send must be the next one on queue 0 (siw_send_check_ntoh).
            return Err(Fault::new(Violation::SendMsnOutOfSequence));
        }
        let received = match self.rx_send {
            Some(r) => r,
            None => {
                // RFC 5041 §5.3 / docs/iwarp-wire.md §5: the first segment of a message takes the head Receive; none
                // posted → "no buffer" (iWARP has no RNR retry; siw_rqe_get failure). A queue pair on a
                // shared receive queue takes it from there, in order (siw_rqe_get on `qp->srq`).
                let taken = match srq {
                    Some(q) => q.take(),
                    None => self.rq.pop_front(),
                };
                let Some(r) = taken else {
                    return Err(Fault::new(Violation::SendWithoutReceive));
                };
                self.rx_receive = Some(r);
                self.rx_send = Some(0);
                0
            }
        };
        if offset != received {
            // RFC 5041 §7.2: segments arrive in order over MPA/TCP; MO must be the bytes placed so far.
            return Err(Fault::new(Violation::SendOffsetOutOfOrder));
        }
        let (domain, len) = (self.domain, msg.payload.len() as u64);
        let Some(head) = self.rx_receive.as_ref() else {
            return Err(Fault::new(Violation::SendWithoutReceive));
        };
        let end = u64::from(received) + len;
        if end > head.capacity {
            // RFC 5041 §7.2 "message too long": the Receive completes with DATA_OVERRUN.
            return Err(Fault::new(Violation::SendLongerThanReceive));
        }
        if !scatter(mem, domain, &head.sgl, u64::from(received), msg.payload) {
            // siw_proc_send: a Receive SGE that fails its check is a local catastrophic DDP error; the
            // Receive completes with ACCESS_VIOLATION.
            return Err(Fault::new(Violation::ReceiveInaccessible));
        }
        let received = end as u32;
        self.rx_send = Some(received);
        self.stats.payload_received(MessageOp::Send, len);
        if !msg.last {
            return Ok(());
        }
        let invalidated = if msg.opcode.carries_invalidate_stag() {
            // RFC 5040 §5.3 / §7.2: Send with Invalidate invalidates the named local STag before the Receive
            // completes; failure → remote operation error "cannot invalidate" (0x09).
            let stag = Stag(ulp_field);
            mem.invalidate(domain, stag)
                .map_err(|_| Fault::new(Violation::CannotInvalidate))?;
            Some(stag)
        } else {
            None
        };
        let solicited = matches!(
            msg.opcode,
            RdmapOpcode::SendWithSolicitedEvent | RdmapOpcode::SendWithSolicitedEventAndInvalidate
        );
        self.rx_send = None;
        self.rx_send_msn = self.rx_send_msn.wrapping_add(1);
        self.stats.message_received(MessageOp::Send);
        if let Some(r) = self.rx_receive.take() {
            let (cq, mut c) = self.completion(r.id, CompletionOp::Receive, NdStatus::Success, received);
            c.solicited = solicited;
            c.invalidated = invalidated;
            trace!(qp = self.id.0, wr = r.id, bytes = received, "Receive completed");
            out.push((cq, c));
        }
        Ok(())
    }

    /// Inbound RDMA Write (RFC 5040 §5.2, RFC 5041 §4.3 tagged buffer model): placed, no completion.
    pub(super) fn rx_write(&mut self, msg: &MessageRepr<'_>, mem: &MemoryRegistry) -> Result<(), Fault> {
        let Placement::Tagged { stag, offset } = msg.placement else {
            return Err(Fault::new(Violation::WriteUntagged));
        };
        let len = msg.payload.len() as u64;
        if len > 0 {
            // siw_proc_write: a zero-length Write touches no memory and is not checked (the RFC 6581 Write RTR
            // uses STag 0). Otherwise the sink must be this stream's, valid, writable and in bounds.
            let at = mem.offset_of(Stag(stag), offset); // the wire's tagged offset, as a region offset
            mem.check(self.domain, Stag(stag), at, len, Access::REMOTE_WRITE)
                .map_err(|e| {
                    // siw tells an invalidated region (found, refused by siw_check_mem) from no region.
                    let v = match e {
                        AccessError::InvalidStag if mem.is_invalidated(Stag(stag)) => {
                            Violation::WriteInvalidatedStag
                        }
                        e => write_refused(e),
                    };
                    Fault::at(v, stag, offset, len)
                })?;
            mem.write(Stag(stag), at, msg.payload);
        }
        self.stats.payload_received(MessageOp::RdmaWrite, len);
        if msg.last {
            self.stats.message_received(MessageOp::RdmaWrite);
        }
        Ok(())
    }

    /// Inbound RDMA Read Request (RFC 5040 §4.4, §5.2): checked, then queued in the IRQ for `poll_transmit`.
    pub(super) fn rx_read_request(
        &mut self,
        msg: &MessageRepr<'_>,
        mem: &MemoryRegistry,
    ) -> Result<(), Fault> {
        let (msn, offset, _) = untagged_on(msg, &READ_REQUESTS)?;
        if !msg.last {
            // RFC 5040 §5.2: a Read Request is a single DDP segment.
            return Err(Fault::new(Violation::ReadRequestSegmented));
        }
        if msn != self.rx_read_msn {
            // RFC 5041 §5.1, §7.2: queue 1 has its own MSN sequence.
            return Err(Fault::new(Violation::ReadRequestMsnOutOfSequence));
        }
        if offset != 0 {
            return Err(Fault::new(Violation::ReadRequestOffset));
        }
        // RFC 5040 §4.4: exactly the 28-byte header.
        let req = ReadRequestRepr::parse(msg.payload)
            .ok()
            .filter(|_| msg.payload.len() == READ_REQUEST_LEN)
            .ok_or(Fault::new(Violation::ReadRequestSize))?;
        if self.irq.len() as u64 >= u64::from(self.params.ird) {
            // RFC 6581 §9: the peer exceeded the inbound read limit it agreed to; siw ("IRQ exceeded") reports
            // a catastrophic stream error.
            return Err(Fault::new(Violation::InboundReadLimitExceeded));
        }
        if req.read_size > 0 {
            // siw: zero-length Reads touch no memory and are not checked (the RFC 6581 Read RTR uses STag 0).
            let size = u64::from(req.read_size);
            mem.check(
                self.domain,
                Stag(req.source_stag),
                mem.offset_of(Stag(req.source_stag), req.source_offset),
                size,
                Access::REMOTE_READ,
            )
            .map_err(|e| Fault::at(read_source_refused(e), req.source_stag, req.source_offset, size))?;
            if req.sink_offset.checked_add(size).is_none() {
                // RFC 5040 §7.2: remote protection "TO wrap".
                let sink = (req.sink_stag, req.sink_offset);
                return Err(Fault::at(Violation::ReadSinkWraps, sink.0, sink.1, size));
            }
        }
        self.rx_read_msn = self.rx_read_msn.wrapping_add(1);
        self.stats.message_received(MessageOp::ReadRequest);
        trace!(qp = self.id.0, msn, size = req.read_size, "Read Request queued");
        self.irq.push_back(IrqEntry {
            req,
            sent: 0,
            read_ahead: None,
        });
        Ok(())
    }

    /// Inbound RDMA Read Response (RFC 5040 §5.2): belongs to the ORQ's head (Responses come in Request order),
    /// to its sink STag, at the next expected tagged offset.
    pub(super) fn rx_read_response(
        &mut self,
        msg: &MessageRepr<'_>,
        mem: &MemoryRegistry,
        out: &mut Vec<(CompletionQueueId, Completion)>,
    ) -> Result<(), Fault> {
        let Placement::Tagged { stag, offset } = msg.placement else {
            return Err(Fault::new(Violation::ReadResponseUntagged));
        };
        let domain = self.domain;
        let Some(head) = self.orq.front_mut() else {
            // RFC 5040 §7.2: a Read Response with no Read outstanding is an unexpected opcode.
            return Err(Fault::new(Violation::ReadResponseUnexpected));
        };
        let len = msg.payload.len() as u64;
        let named = |v: Violation| Fault::at(v, stag, offset, len);
        if stag != head.sink.stag.0 {
            // RFC 5041 §7.2 / siw_rresp_check_ntoh: not the sink STag of the oldest outstanding Read.
            return Err(named(Violation::ReadResponseWrongStag));
        }
        let expected = head.sink.offset.checked_add(u64::from(head.received));
        let end = u64::from(head.received) + len;
        if expected != Some(offset) || end > u64::from(head.sink.length) {
            // siw_rresp_check_ntoh: wrong TO or more data than requested → base or bounds.
            return Err(named(Violation::ReadResponseWrongOffset));
        }
        if len > 0 {
            // Checked at post; re-checked in case the sink was deregistered meanwhile.
            if mem
                .check(domain, head.sink.stag, offset, len, Access::LOCAL_WRITE)
                .is_err()
            {
                return Err(named(Violation::ReadSinkInaccessible));
            }
            mem.write(head.sink.stag, offset, msg.payload);
        }
        head.received = end as u32;
        self.stats.payload_received(MessageOp::ReadResponse, len);
        if !msg.last {
            return Ok(());
        }
        if head.received != head.sink.length {
            // RFC 5040 §4.4: the Response carries exactly the Read size.
            return Err(Fault::new(Violation::ReadResponseShort));
        }
        let (wr_id, bytes, silent) = (head.wr_id, head.sink.length, head.silent);
        self.orq.pop_front();
        self.stats.message_received(MessageOp::ReadResponse);
        if let Some(id) = wr_id
            && !silent
        {
            trace!(qp = self.id.0, wr = id, bytes, "Read completed");
            out.push(self.completion(id, CompletionOp::Read, NdStatus::Success, bytes));
        }
        Ok(())
    }
}

/// An untagged message kind's queue and the rules it breaks off it.
struct UntaggedQueue {
    queue: u32,
    /// Unexpected opcode: the message came tagged.
    tagged: Violation,
    /// Invalid QN: the message came on another queue.
    wrong_queue: Violation,
}

/// RFC 5040 §4.2 table: Sends are untagged; §5.1: they travel on queue 0.
const SENDS: UntaggedQueue = UntaggedQueue {
    queue: QN_SEND,
    tagged: Violation::SendTagged,
    wrong_queue: Violation::SendWrongQueue,
};

/// RFC 5040 §4.2 table: Read Requests are untagged; §5.1: they travel on queue 1.
const READ_REQUESTS: UntaggedQueue = UntaggedQueue {
    queue: QN_READ_REQUEST,
    tagged: Violation::ReadRequestTagged,
    wrong_queue: Violation::ReadRequestWrongQueue,
};

/// The (MSN, message offset, ULP field) of an untagged message that must travel on `expected.queue`: a
/// tagged segment is an unexpected opcode (RFC 5040 §4.2 table); another queue is an invalid QN (RFC 5040
/// §5.1, RFC 5041 §7.2).
fn untagged_on(msg: &MessageRepr<'_>, expected: &UntaggedQueue) -> Result<(u32, u32, u32), Fault> {
    let Placement::Untagged {
        queue,
        msn,
        offset,
        ulp_field,
    } = msg.placement
    else {
        return Err(Fault::new(expected.tagged));
    };
    if queue != expected.queue {
        return Err(Fault::new(expected.wrong_queue));
    }
    Ok((msn, offset, ulp_field))
}
