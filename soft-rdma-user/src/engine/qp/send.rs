//! The send side: picking the next message (send queue or inbound-read queue, never interleaving segments of
//! two messages), and segmenting Sends, Writes, Read Requests and Read Responses into FPDUs.

use super::*;
use crate::engine::framing::{FpduSink, PayloadDst};
use crate::engine::traffic::MessageOp;

/// What a send-queue message is counted as: a Write, or a Send (of any flavour).
fn message_op(opcode: RdmapOpcode) -> MessageOp {
    if opcode == RdmapOpcode::RdmaWrite {
        MessageOp::RdmaWrite
    } else {
        MessageOp::Send
    }
}

impl QueuePair {
    pub(super) fn sq_ready(&self) -> bool {
        match self.sq.front() {
            None => false,
            // RFC 6581 §9 / docs/connector-semantics.md: never more Reads in flight than the outbound limit (ORD).
            // ORD 0 lets the head through so it can be refused (see `tx_sq`).
            Some(e) => {
                !matches!(e.wr, WorkRequest::Read { .. })
                    || self.params.ord == 0
                    || (self.orq.len() as u64) < u64::from(self.params.ord)
            }
        }
    }

    /// siw `siw_activate_tx`: inbound Read Responses go first, but every `IRQ_MAX_BURST_SQ_ACTIVE`-th pick
    /// made while the send queue is ready goes to the send queue (3 Responses, 1 SQ message, ...).
    pub(super) fn pick_next(&mut self) -> Option<Source> {
        let sq_ready = self.sq_ready();
        if !self.irq.is_empty() {
            if sq_ready {
                self.irq_burst += 1;
                if self.irq_burst >= IRQ_MAX_BURST_SQ_ACTIVE {
                    self.irq_burst = 0;
                    return Some(Source::Sq);
                }
            }
            return Some(Source::Irq);
        }
        sq_ready.then_some(Source::Sq)
    }

    /// Whether [`QueuePair::poll_transmit`] has something to append.
    pub fn wants_transmit(&self) -> bool {
        self.local_terminate.is_some()
            || (self.state == QpState::Connected
                && (self.tx_active.is_some() || !self.irq.is_empty() || self.sq_ready()))
    }

    /// Appends whole FPDUs to `buf` until at least `budget` bytes were appended or nothing is left; returns the
    /// bytes appended. Each ULPDU is at most `max_ulpdu` (RFC 5044 §4.1: an FPDU fits the path MSS). Read
    /// Responses interleave with the send queue at message granularity (siw `siw_activate_tx`); segments of
    /// different messages never interleave. Sends and Writes complete when their last segment is appended
    /// (siw completes on transmit: iWARP has no end-to-end ACK); a Read moves to the ORQ when its Request is.
    pub fn poll_transmit(
        &mut self,
        mem: &MemoryRegistry,
        budget: usize,
        buf: &mut impl FpduSink,
        out: &mut Vec<(CompletionQueueId, Completion)>,
    ) -> usize {
        let start = buf.appended();
        while self.state == QpState::Connected && buf.appended() - start < budget {
            let source = match self.tx_active {
                Some(s) => s,
                None => match self.pick_next() {
                    Some(s) => s,
                    None => break,
                },
            };
            match source {
                Source::Sq => self.tx_sq(mem, buf, out),
                Source::Irq => self.tx_irq(mem, buf),
            }
        }
        if let Some(cause) = self.local_terminate.take() {
            self.tx_terminate(cause, buf);
            // siw_qp_sq_proc_tx → siw_qp_cm_drop: the connection goes once its Terminate is out.
            self.drop_connection = true;
        }
        buf.appended() - start
    }

    /// The Terminate a local protection error owes the peer (RFC 5040 §4.8: queue 2, MSN 1, one segment).
    fn tx_terminate(&mut self, cause: TerminateCause, buf: &mut impl FpduSink) {
        let t = TerminateRepr::new(cause);
        let mut body = vec![0u8; t.buffer_len()];
        if t.emit(&mut body).is_err() {
            return;
        }
        let ddp = DdpRepr {
            last: true,
            ulp_control: RdmapOpcode::Terminate.control_byte(),
            placement: Placement::untagged_start(QN_TERMINATE, 1),
        };
        buf.push_fpdu(self.params.crc, ddp, body.len(), |mut dst| {
            dst.copy(0, body.len(), |d| d.copy_from_slice(&body));
        });
        debug!(qp = self.id.0, %cause, "Terminate sent after a local protection error");
    }

    /// One FPDU (or a refusal) from the send queue's head.
    pub(super) fn tx_sq(
        &mut self,
        mem: &MemoryRegistry,
        buf: &mut impl FpduSink,
        out: &mut Vec<(CompletionQueueId, Completion)>,
    ) {
        let (domain, crc, max_ulpdu) = (self.domain, self.params.crc, self.params.max_ulpdu);
        let starting = self.tx_active.is_none();
        let Some(head) = self.sq.front_mut() else {
            self.tx_active = None;
            return;
        };
        let (id, op, silent) = (head.wr.id(), head.wr.op(), head.wr.is_silent());
        let (opcode, placement, sgl) = match &head.wr {
            WorkRequest::Read { sink, remote, .. } => {
                let (sink, remote) = (*sink, *remote);
                return self.tx_read_request((id, silent), sink, remote, buf, out);
            }
            WorkRequest::Send {
                sgl,
                solicited,
                invalidate,
                ..
            } => {
                // RFC 5040 §4.2: opcodes 3-6.
                let opcode = match (*solicited, invalidate.is_some()) {
                    (false, false) => RdmapOpcode::Send,
                    (false, true) => RdmapOpcode::SendWithInvalidate,
                    (true, false) => RdmapOpcode::SendWithSolicitedEvent,
                    (true, true) => RdmapOpcode::SendWithSolicitedEventAndInvalidate,
                };
                // RFC 5041 §4.4, §5.2 / RFC 5040 §5.3: queue 0, one MSN per message (the same in every
                // segment), MO = the segment's position in the message; Send with Invalidate carries the STag
                // in the Invalidate STag field (RFC 5040 §4.1).
                let placement = Placement::Untagged {
                    queue: QN_SEND,
                    msn: self.tx_send_msn,
                    offset: head.sent,
                    ulp_field: invalidate.map_or(0, |s| s.0),
                };
                (opcode, placement, sgl)
            }
            WorkRequest::Write { sgl, remote, .. } => {
                // RFC 5041 §4.3 / RFC 5040 §5.1: the Data Sink's STag, TO = advertised TO + position.
                let placement = Placement::Tagged {
                    stag: remote.stag.0,
                    offset: remote.offset.wrapping_add(u64::from(head.sent)),
                };
                (RdmapOpcode::RdmaWrite, placement, sgl)
            }
            WorkRequest::Receive { .. } => {
                // Never queued here (post puts Receives in the RQ).
                self.sq.pop_front();
                self.tx_active = None;
                return;
            }
        };
        // Re-check the gather list when a message starts: the region may have been deregistered since the post.
        if starting && let Err(e) = check_sgl(mem, domain, sgl, Access(0)) {
            warn_limited!(qp = self.id.0, wr = id, error = %e, "gather list no longer accessible");
            self.sq.pop_front();
            return self.fail_local(id, op, out);
        }
        if starting && sgl.iter().any(|s| s.length > 0 && mem.costly_access(s.stag)) {
            head.read_ahead = Some(ReadAhead::default());
        }
        // RFC 5041 §5.2 / RFC 5044 §4.1: segments no larger than the MULPDU; L on the last one only.
        let remaining = head.len - head.sent;
        let room = u32::try_from(max_ulpdu - placement.header_len()).unwrap_or(u32::MAX);
        let n = remaining.min(room);
        let last = n == remaining;
        let ddp = DdpRepr {
            last,
            ulp_control: opcode.control_byte(),
            placement,
        };
        let pos = u64::from(head.sent);
        let mut readable = true;
        let read_ahead = &mut head.read_ahead;
        buf.push_fpdu(crc, ddp, n as usize, |mut dst| {
            readable = match read_ahead {
                // Read ahead as far as the message goes; each piece passes gather's checks when it is read
                // (siw too reads a source it holds a reference on until the message is out).
                Some(ra) => ra.supply((pos, n as usize), remaining as usize, &mut dst, |at, piece| {
                    gather(mem, domain, sgl, at, piece.len(), PayloadDst::Copy(piece))
                }),
                None => gather(mem, domain, sgl, pos, n as usize, dst),
            };
        });
        if !readable {
            warn_limited!(
                qp = self.id.0,
                wr = id,
                "gather list became inaccessible mid-message; zeros sent"
            );
            head.faulted = true;
        }
        head.sent += n;
        self.stats.payload_sent(message_op(opcode), u64::from(n));
        if !last {
            self.tx_active = Some(Source::Sq);
            return;
        }
        let (len, faulted) = (head.len, head.faulted);
        self.sq.pop_front();
        self.tx_active = None;
        self.stats.message_sent(message_op(opcode));
        if opcode != RdmapOpcode::RdmaWrite {
            self.tx_send_msn = self.tx_send_msn.wrapping_add(1);
        }
        // siw completes Sends and Writes once transmitted: iWARP has no end-to-end acknowledgement
        // (RFC 5040 §5.5: the local completion means the buffer may be reused).
        let (status, bytes) = if faulted {
            (NdStatus::AccessViolation, 0)
        } else {
            (NdStatus::Success, len)
        };
        trace!(qp = self.id.0, wr = id, ?op, len, "message sent");
        // ND_OP_FLAG_SILENT_SUCCESS: only a failure completes it.
        if !(silent && status == NdStatus::Success) {
            out.push(self.completion(id, op, status, bytes));
        }
    }

    /// The Read Request for the send queue's head (RFC 5040 §4.4, §5.2), which then waits in the ORQ.
    pub(super) fn tx_read_request(
        &mut self,
        (id, silent): (u64, bool),
        sink: Sge,
        remote: crate::engine::verbs::RemoteBuffer,
        buf: &mut impl FpduSink,
        out: &mut Vec<(CompletionQueueId, Completion)>,
    ) {
        self.sq.pop_front();
        self.tx_active = None;
        if self.params.ord == 0 {
            // The connection allows no outbound Reads (ORD 0, RFC 6581 §9): refuse rather than wait forever.
            // The queue pair's status says the same (QueuePairStatus::result_of).
            warn_limited!(
                qp = self.id.0,
                wr = id,
                "RDMA Read refused with INVALID_PARAMETER: the connection's outbound read limit (ORD) is 0; \
                 ask for one in the ReadLimits given to connect_qp or accept_qp (the peer's inbound limit \
                 caps it)"
            );
            out.push(self.completion(id, CompletionOp::Read, NdStatus::InvalidParameter, 0));
            return;
        }
        // RFC 5040 §4.4: sink STag/TO (where the Response goes), size, source STag/TO.
        let req = ReadRequestRepr {
            sink_stag: sink.stag.0,
            sink_offset: sink.offset,
            read_size: sink.length,
            source_stag: remote.stag.0,
            source_offset: remote.offset,
        };
        // RFC 5040 §5.2 / RFC 5041 §4.4: queue 1 with its own MSN sequence; one segment (L set, MO 0).
        let ddp = DdpRepr {
            last: true,
            ulp_control: RdmapOpcode::RdmaReadRequest.control_byte(),
            placement: Placement::untagged_start(QN_READ_REQUEST, self.tx_read_msn),
        };
        buf.push_fpdu(self.params.crc, ddp, READ_REQUEST_LEN, |mut dst| {
            dst.copy(0, READ_REQUEST_LEN, |d| {
                let _ = req.emit(d);
            });
        });
        trace!(
            qp = self.id.0,
            wr = id,
            msn = self.tx_read_msn,
            size = sink.length,
            "Read Request sent"
        );
        self.tx_read_msn = self.tx_read_msn.wrapping_add(1);
        self.orq.push_back(OrqEntry {
            wr_id: Some(id),
            silent,
            sink,
            received: 0,
        });
        self.stats.message_sent(MessageOp::ReadRequest);
    }

    /// One Read Response FPDU for the IRQ's head (RFC 5040 §5.2: tagged, to the requester's sink STag and TO +
    /// position, L on the last; a zero-length Read is answered by one empty last segment).
    pub(super) fn tx_irq(&mut self, mem: &MemoryRegistry, buf: &mut impl FpduSink) {
        let (domain, crc, max_ulpdu) = (self.domain, self.params.crc, self.params.max_ulpdu);
        let Some(e) = self.irq.front_mut() else {
            self.tx_active = None;
            return;
        };
        let remaining = e.req.read_size - e.sent;
        let n = remaining.min((max_ulpdu - TAGGED_HEADER_LEN) as u32);
        let last = n == remaining;
        let ddp = DdpRepr {
            last,
            ulp_control: RdmapOpcode::RdmaReadResponse.control_byte(),
            placement: Placement::Tagged {
                stag: e.req.sink_stag,
                // Checked not to wrap when the Request was accepted.
                offset: e.req.sink_offset.wrapping_add(u64::from(e.sent)),
            },
        };
        let source = Stag(e.req.source_stag);
        // The Request named the source by tagged offset; the region is read by region offset.
        let base = mem.offset_of(source, e.req.source_offset);
        let pos = u64::from(e.sent);
        let at = base.saturating_add(pos);
        if e.sent == 0 && mem.costly_access(source) {
            e.read_ahead = Some(ReadAhead::default());
        }
        let read_ahead = &mut e.read_ahead;
        let mut readable = true;
        let len = n as usize;
        buf.push_fpdu(crc, ddp, len, |mut dst| {
            // Checked for every FPDU, read ahead or not: a region deregistered mid-response sends zeros.
            let ok = mem
                .check(domain, source, at, len as u64, Access::REMOTE_READ)
                .is_ok();
            if let (true, PayloadDst::Gather(g)) = (ok, &mut dst)
                && let Some(pinned) = mem.pinned(source)
                && let Ok(offset) = usize::try_from(at)
            {
                g.refer(pinned, offset, len);
                return;
            }
            if ok && let Some(ra) = read_ahead {
                readable = ra.supply((pos, len), remaining as usize, &mut dst, |p, piece| {
                    let from = base.saturating_add(p);
                    let whole = mem.check(domain, source, from, piece.len() as u64, Access::REMOTE_READ);
                    whole.is_ok() && {
                        mem.read(source, from, piece);
                        true
                    }
                });
                return;
            }
            dst.copy(0, len, |d| {
                if ok {
                    mem.read(source, at, d);
                }
            });
            readable = ok || len == 0;
        });
        if !readable {
            // siw holds a reference on the source region; soft-rdma re-checks it and sends zeros if the
            // application deregistered it while the Response was going out.
            warn_limited!(
                qp = self.id.0,
                stag = source.0,
                "Read source deregistered mid-response; zeros sent"
            );
        }
        e.sent += n;
        self.stats.payload_sent(MessageOp::ReadResponse, u64::from(n));
        if last {
            self.irq.pop_front();
            self.tx_active = None;
            self.stats.message_sent(MessageOp::ReadResponse);
        } else {
            self.tx_active = Some(Source::Irq);
        }
    }
}
