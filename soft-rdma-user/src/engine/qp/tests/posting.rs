//! Posting, flushing and terminating: posting errors, flush order, Terminates, ORD 0, the wire shared by
//! Read Responses and Sends, and the Read RTR.

use super::*;
use crate::engine::traffic::{MessageOp, OpTraffic};

// ------------------------------------------------------------------------------------------------
// Posting, flushing, terminating.
// ------------------------------------------------------------------------------------------------

#[test]
fn posting_errors() {
    let mut cfg = config();
    cfg.send_depth = 2;
    cfg.receive_depth = 1;
    cfg.max_send_sge = 2;
    cfg.max_receive_sge = 1;
    let mut a = Side::new(S1, cfg);
    let (_, all, _) = a.region(vec![0; 64], Access::ALL);
    let (_, nolw, _) = a.region(vec![0; 64], Access::REMOTE_READ);
    let (_, foreign) = a
        .mem
        .register(S3.into(), Box::new(VecMemory::new(64)), Access::ALL, 0)
        .unwrap();
    let sge = |stag, offset, length| Sge { stag, offset, length };
    let send = |id, sgl| WorkRequest::Send {
        id,
        sgl,
        solicited: false,
        invalidate: None,
        silent: false,
    };
    let remote = RemoteBuffer {
        stag: Stag(0x100),
        offset: 0,
    };
    // Too many SGEs.
    a.post(send(1, vec![sge(all, 0, 1); 3]));
    a.post(WorkRequest::Receive {
        id: 2,
        sgl: vec![sge(all, 0, 1); 2],
    });
    // Local protection errors end the queue pair: local_protection_errors_end_the_queue_pair.
    let _ = foreign;
    // Zero-length Read and gathering from a region without LOCAL_WRITE are fine.
    a.post(WorkRequest::Read {
        id: 7,
        sink: sge(Stag(0), 0, 0),
        remote,
        silent: false,
    });
    a.post(send(8, vec![sge(nolw, 0, 8)]));
    // Send queue full (depth 2), receive queue full (depth 1).
    a.post(send(9, vec![]));
    a.post(WorkRequest::Receive { id: 10, sgl: vec![] });
    a.post(WorkRequest::Receive { id: 11, sgl: vec![] });
    // Remote offset wrapping.
    let mut b = Side::new(S1, config());
    let (_, ball, _) = b.region(vec![0; 64], Access::ALL);
    b.post(WorkRequest::Write {
        id: 12,
        sgl: vec![sge(ball, 0, 8)],
        remote: RemoteBuffer {
            stag: Stag(0x100),
            offset: u64::MAX - 3,
        },
        silent: false,
    });
    assert_eq!(
        summary(&a.take()),
        vec![
            (1, CompletionOp::Send, NdStatus::InvalidParameter, 0),
            (2, CompletionOp::Receive, NdStatus::InvalidParameter, 0),
            (9, CompletionOp::Send, NdStatus::InsufficientResources, 0),
            (11, CompletionOp::Receive, NdStatus::InsufficientResources, 0),
        ]
    );
    assert_eq!(
        summary(&b.take()),
        vec![(12, CompletionOp::Write, NdStatus::InvalidParameter, 0)]
    );
    let s = a.qp.stats();
    assert_eq!((s.sq_outstanding, s.rq_posted), (2, 1));
    // Receives go to the receive CQ, the rest to the send CQ.
    a.post(WorkRequest::Receive { id: 13, sgl: vec![] });
    a.post(send(14, vec![]));
    let c = a.take();
    assert_eq!((c[0].0, c[1].0), (RECV_CQ, SEND_CQ));
}

/// A region claiming 2^32 bytes, storing none (for the 2^31 message limit).
struct Huge;
impl RegionMemory for Huge {
    fn len(&self) -> u64 {
        1 << 32
    }
    fn read_at(&self, _: u64, out: &mut [u8]) {
        out.fill(0);
    }
    fn write_at(&self, _: u64, _: &[u8]) {}
}

#[test]
fn messages_longer_than_2_31_are_refused() {
    let mut a = Side::new(S1, config());
    let (_, huge) = a.mem.register(S1.into(), Box::new(Huge), Access::ALL, 0).unwrap();
    let sge = |offset, length| Sge {
        stag: huge,
        offset,
        length,
    };
    a.post(WorkRequest::Send {
        id: 1,
        sgl: vec![sge(0, 1 << 31), sge(0, 1)],
        solicited: false,
        invalidate: None,
        silent: false,
    });
    a.post(WorkRequest::Send {
        id: 2,
        sgl: vec![sge(0, 1 << 31)],
        solicited: false,
        invalidate: None,
        silent: false,
    });
    assert_eq!(
        summary(&a.take()),
        vec![(1, CompletionOp::Send, NdStatus::InvalidParameter, 0)]
    );
    assert_eq!(a.qp.stats().sq_outstanding, 1);
}

#[test]
fn flush_cancels_everything_in_posting_order() {
    let mut p = Pair::new(params(false, 64), params(false, 64));
    p.budget = 1;
    let (_, s, _) = p.a.region(vec![0; 1000], Access::ALL);
    let remote = RemoteBuffer {
        stag: Stag(0x300),
        offset: 0,
    };
    let sink = sge(s, 0, 10);
    p.a.post(WorkRequest::Read {
        id: 1,
        sink,
        remote,
        silent: false,
    });
    p.a.post(send_wr(2, s, 500));
    p.a.post(WorkRequest::Read {
        id: 3,
        sink,
        remote,
        silent: false,
    });
    p.a.post(WorkRequest::Write {
        id: 4,
        sgl: vec![],
        remote,
        silent: false,
    });
    for id in [5, 6, 7] {
        p.a.post(WorkRequest::Receive { id, sgl: vec![sink] });
    }
    // The Read Request and the first segment of the Send go out; nothing is delivered.
    let mut buf = Vec::new();
    p.a.qp.poll_transmit(&p.a.mem, 1, &mut buf, &mut p.a.comps);
    p.a.qp.poll_transmit(&p.a.mem, 1, &mut buf, &mut p.a.comps);
    assert_eq!(p.a.qp.stats().orq_outstanding, 1);
    assert!(p.a.comps.is_empty());
    p.a.qp.flush(NdStatus::Canceled, &mut p.a.comps);
    let c = |id, op| (id, op, NdStatus::Canceled, 0);
    assert_eq!(
        summary(&p.a.take()),
        vec![
            c(1, CompletionOp::Read),
            c(2, CompletionOp::Send),
            c(3, CompletionOp::Read),
            c(4, CompletionOp::Write),
            c(5, CompletionOp::Receive),
            c(6, CompletionOp::Receive),
            c(7, CompletionOp::Receive),
        ]
    );
    assert_eq!(p.a.qp.state(), QpState::Error);
    assert_eq!(
        p.a.qp.stats(),
        QpStats {
            messages_sent: 1,
            bytes_sent: 46,
            by_op: {
                // The whole Read Request, and the Send's first segment.
                let mut t = OpTraffic::default();
                t.sent[MessageOp::ReadRequest as usize].messages = 1;
                t.sent[MessageOp::Send as usize].bytes = 46;
                t
            },
            ..QpStats::default()
        }
    );
    p.a.qp.flush(NdStatus::Canceled, &mut p.a.comps);
    assert!(p.a.comps.is_empty(), "idempotent");
    assert!(!p.a.qp.wants_transmit());
    assert_eq!(p.a.qp.poll_transmit(&p.a.mem, 100, &mut buf, &mut p.a.comps), 0);
    p.a.post(WorkRequest::Receive { id: 8, sgl: vec![] });
    assert_eq!(summary(&p.a.take()), vec![c(8, CompletionOp::Receive)]);
    p.a.qp.connect(params(false, 64));
    assert_eq!(
        p.a.qp.state(),
        QpState::Error,
        "an Error QP cannot be reconnected"
    );
}

#[test]
fn terminate_completes_reads_and_the_receive_being_filled() {
    let mut t = target();
    let rw = t.rw;
    for id in [1, 2] {
        t.side.post(WorkRequest::Receive {
            id,
            sgl: vec![sge(rw, 0, 64)],
        });
    }
    t.side.post(read_wr(3, sge(rw, 0, 8), Stag(0x500), 0));
    t.side.post(WorkRequest::Write {
        id: 4,
        sgl: vec![],
        remote: RemoteBuffer {
            stag: Stag(0x500),
            offset: 0,
        },
        silent: false,
    });
    t.side.transmit(1);
    t.side.deliver(&send_segment(1, 0, false, b"ab")).unwrap();
    let info = stream_lost(true);
    t.side.qp.on_terminate(info, &mut t.side.comps);
    assert_eq!(
        summary(&t.side.take()),
        vec![
            (3, CompletionOp::Read, NdStatus::RemoteError, 0),
            (1, CompletionOp::Receive, NdStatus::RemoteError, 2),
            (4, CompletionOp::Write, NdStatus::Canceled, 0),
            (2, CompletionOp::Receive, NdStatus::Canceled, 0),
        ]
    );
    assert_eq!(t.side.qp.terminate_info(), Some(info));
    // A later flush or Terminate changes nothing.
    t.side.qp.on_terminate(
        TerminateInfo {
            from_peer: false,
            ..info
        },
        &mut t.side.comps,
    );
    t.side.qp.flush(NdStatus::Canceled, &mut t.side.comps);
    assert!(t.side.comps.is_empty());
    assert_eq!(t.side.qp.terminate_info(), Some(info));
}

#[test]
fn idle_queue_pair_queues_until_connected() {
    let mut a = Side::new(S1, config());
    let mut b = Side::new(S2, config());
    let (_, s, _) = a.region(b"hello".to_vec(), Access(0));
    let (sink, r, _) = b.region(vec![0; 5], Access::LOCAL_WRITE);
    b.post(receive_wr(1, r, 5));
    a.post(send_wr(1, s, 5));
    assert_eq!((a.qp.state(), a.qp.wants_transmit()), (QpState::Idle, false));
    assert_eq!(a.transmit(100).0, 0);
    a.qp.connect(params(false, 10)); // clamped to MIN_MAX_ULPDU
    assert!(a.qp.wants_transmit());
    let (_, buf) = a.transmit(100);
    for w in frames(&buf, false, MIN_MAX_ULPDU) {
        b.deliver(&w.msg()).unwrap();
    }
    assert_eq!(sink.bytes(), b"hello");
    assert_eq!(summary(&b.take()), vec![ok(1, CompletionOp::Receive, 5)]);
}

#[test]
fn deregistered_gather_list_is_a_local_protection_error() {
    let mut a = Side::new(S1, config());
    a.qp.connect(params(false, 1448));
    let (_, s, id) = a.region(vec![0; 8], Access(0));
    a.post(send_wr(1, s, 8));
    a.mem.deregister(S1, id).unwrap();
    let (_, wire) = a.transmit(100);
    assert_eq!(
        summary(&a.take()),
        vec![(1, CompletionOp::Send, NdStatus::AccessViolation, 0)]
    );
    assert_terminated_locally(&a, &wire);
}

/// The queue pair is in Error, and what it sent is only siw's Terminate for a local protection error.
fn assert_terminated_locally(a: &Side, wire: &[u8]) {
    assert_eq!(a.qp.state(), QpState::Error);
    let sent = frames(wire, false, 1448);
    assert_eq!(sent.len(), 1, "only the Terminate");
    assert_eq!(sent[0].opcode, RdmapOpcode::Terminate);
    let t = soft_rdma_common::wire::terminate::TerminateRepr::parse(&sent[0].payload).unwrap();
    assert_eq!(
        t.cause,
        cause(layer::RDMAP, rdmap_type::CATASTROPHIC, rdmap_code::UNSPECIFIED)
    );
    let info = a.qp.terminate_info().unwrap();
    assert!(!info.from_peer);
}

/// siw `siw_check_sgl_tx` → `siw_qp_sq_proc_tx`: a bad lkey (unknown, another PD's, another session's), a
/// range outside the region, or a sink without LOCAL_WRITE fails the request with a local protection error,
/// moves the queue pair to Error (what was outstanding flushes) and sends the peer a Terminate; an
/// unconnected queue pair sends nothing.
#[test]
fn local_protection_errors_end_the_queue_pair() {
    for connected in [true, false] {
        for case in 0..6 {
            let mut a = Side::new(S1, config());
            if connected {
                a.qp.connect(params(false, 1448));
            }
            let (_, all, _) = a.region(vec![0; 64], Access::ALL);
            let (_, nolw, _) = a.region(vec![0; 64], Access::REMOTE_READ);
            let (_, other_pd) = a
                .mem
                .register(Domain::new(S1, PdId(4)), Box::new(VecMemory::new(64)), Access::ALL, 0)
                .unwrap();
            let (_, foreign) = a
                .mem
                .register(S3.into(), Box::new(VecMemory::new(64)), Access::ALL, 0)
                .unwrap();
            a.post(receive_wr(100, all, 64));
            let remote = RemoteBuffer {
                stag: Stag(0x100),
                offset: 0,
            };
            let (wr, op) = match case {
                0 => (send_wr(1, foreign, 1), CompletionOp::Send),
                1 => (send_wr(1, other_pd, 1), CompletionOp::Send),
                2 => (send_wr(1, Stag(all.0 ^ 0x40), 1), CompletionOp::Send),
                3 => (
                    WorkRequest::Write {
                        id: 1,
                        sgl: vec![sge(all, 60, 5)],
                        remote,
                        silent: false,
                    },
                    CompletionOp::Write,
                ),
                4 => (receive_wr(1, nolw, 8), CompletionOp::Receive),
                _ => (
                    WorkRequest::Read {
                        id: 1,
                        sink: sge(nolw, 0, 8),
                        remote,
                        silent: false,
                    },
                    CompletionOp::Read,
                ),
            };
            a.post(wr);
            assert_eq!(
                summary(&a.take()),
                vec![
                    (1, op, NdStatus::AccessViolation, 0),
                    (100, CompletionOp::Receive, NdStatus::Canceled, 0)
                ],
                "case {case}"
            );
            assert_eq!(a.qp.state(), QpState::Error);
            // siw_qp_sq_proc_tx: IB_EVENT_QP_FATAL, once.
            assert_eq!(a.qp.take_event(), Some(QueuePairEvent::Fatal), "case {case}");
            assert_eq!(a.qp.take_event(), None);
            assert_eq!(a.qp.wants_transmit(), connected, "case {case}");
            assert!(!a.qp.take_connection_drop(), "not before the Terminate is out");
            let (_, wire) = a.transmit(100);
            if connected {
                assert_terminated_locally(&a, &wire);
            } else {
                assert!(wire.is_empty());
            }
            // siw_qp_cm_drop: the connection goes once the Terminate is out (once).
            assert_eq!(a.qp.take_connection_drop(), connected, "case {case}");
            assert!(!a.qp.take_connection_drop());
            // Later requests are flushed.
            a.post(send_wr(2, all, 1));
            assert_eq!(
                summary(&a.take()),
                vec![(2, CompletionOp::Send, NdStatus::Canceled, 0)]
            );
        }
    }
}

#[test]
fn ord_zero_refuses_reads() {
    let mut a = Side::new(S1, config());
    let mut pa = params(false, 1448);
    pa.ord = 0;
    a.qp.connect(pa);
    a.post(read_wr(1, sge(Stag(0), 0, 0), Stag(0), 0));
    assert!(a.qp.wants_transmit());
    a.assert_fails_at_transmit(1, CompletionOp::Read, NdStatus::InvalidParameter);
}

#[test]
fn read_responses_and_sends_share_the_wire_as_siw() {
    // B has 6 Read Requests queued and 2 Sends posted: every 4th pick with the send queue ready goes to
    // the send queue (siw SIW_IRQ_MAXBURST_SQ_ACTIVE), and no two messages' segments interleave.
    let mut pb = params(false, 64);
    pb.ird = 8;
    let mut b = Side::new(S2, config());
    b.qp.connect(pb);
    let (_, src, _) = b.region(pattern(1000, 2), Access::ALL);
    for msn in 1..=6 {
        let body = rr_body(0x4400, 0, 100, src.0, 0);
        b.deliver(&read_request(msn, true, &body)).unwrap();
    }
    for id in [1, 2] {
        b.post(WorkRequest::Send {
            id,
            sgl: vec![sge(src, 0, 100)],
            solicited: false,
            invalidate: None,
            silent: false,
        });
    }
    let mut buf = Vec::new();
    b.qp.poll_transmit(&b.mem, 1 << 20, &mut buf, &mut b.comps);
    let mut order = Vec::new();
    for w in frames(&buf, false, 64) {
        if w.last {
            order.push(w.opcode);
        }
    }
    use RdmapOpcode::{RdmaReadResponse as R, Send as S};
    assert_eq!(order, vec![R, R, R, S, R, R, R, S]);
    assert_eq!(b.qp.stats().irq_queued, 0);
}

#[test]
fn read_rtr_on_both_sides() {
    // Initiator sent a Read RTR (MSN 1 on queue 1): its first Read uses MSN 2 and the RTR's zero-length
    // Response completes nothing. Responder: the RTR is answered with a zero-length Read Response.
    let mut p = Pair::new(params(false, 1448), params(false, 1448));
    p.a.qp.rtr_sent(Rtr::Read);
    let rtr = read_request(1, true, &[0; 28]);
    p.b.qp.rtr_received(&rtr, &mut p.b.mem, None, &mut p.b.comps).unwrap();
    let (_, src, _) = p.b.region(pattern(100, 1), Access::REMOTE_READ);
    let (sink, dst, _) = p.a.region(vec![0; 100], Access::LOCAL_WRITE);
    p.a.post(read_wr(9, sge(dst, 0, 100), src, 0));
    p.pump();
    assert_eq!(summary(&p.a.take()), vec![ok(9, CompletionOp::Read, 100)]);
    assert_eq!(sink.bytes(), pattern(100, 1));
    assert!(p.b.take().is_empty());
    let first_response = p.log.iter().find(|(from_a, _)| !from_a).unwrap();
    assert_eq!(
        first_response.1.placement,
        Placement::Tagged { stag: 0, offset: 0 }
    );
    assert!(first_response.1.payload.is_empty() && first_response.1.last);

    // A Send RTR uses Send MSN 1 without taking a Receive.
    let mut t = target_with_receive();
    let rtr = send_segment(1, 0, true, &[]);
    t.side
        .qp
        .rtr_received(&rtr, &mut t.side.mem, None, &mut t.side.comps)
        .unwrap();
    t.side.deliver(&send_segment(2, 0, true, b"hi")).unwrap();
    assert_eq!(summary(&t.side.take()), vec![ok(1, CompletionOp::Receive, 2)]);
    let mut a = Side::new(S1, config());
    a.qp.rtr_sent(Rtr::Send);
    a.qp.rtr_sent(Rtr::Write);
    a.qp.connect(params(false, 1448));
    a.post(WorkRequest::Send {
        id: 1,
        sgl: vec![],
        solicited: false,
        invalidate: None,
        silent: false,
    });
    let mut buf = Vec::new();
    a.qp.poll_transmit(&a.mem, 1, &mut buf, &mut a.comps);
    assert!(matches!(
        frames(&buf, false, 1448)[0].placement,
        Placement::Untagged { msn: 2, .. }
    ));
}

/// The request with ND_OP_FLAG_SILENT_SUCCESS (`silent`), as `wr` with the flag set.
fn silent(wr: WorkRequest) -> WorkRequest {
    match wr {
        WorkRequest::Send {
            id,
            sgl,
            solicited,
            invalidate,
            ..
        } => WorkRequest::Send {
            id,
            sgl,
            solicited,
            invalidate,
            silent: true,
        },
        WorkRequest::Write { id, sgl, remote, .. } => WorkRequest::Write {
            id,
            sgl,
            remote,
            silent: true,
        },
        WorkRequest::Read { id, sink, remote, .. } => WorkRequest::Read {
            id,
            sink,
            remote,
            silent: true,
        },
        r => r,
    }
}

#[test]
fn silent_requests_complete_only_when_they_fail() {
    let mut p = Pair::new(params(false, 64), params(false, 64));
    let src = pattern(300, 3);
    let (_, s, _) = p.a.region(src.clone(), Access::ALL);
    let (sink, t, _) = p.b.region(vec![0; 1000], Access::ALL);
    let remote = |offset| RemoteBuffer { stag: t, offset };
    p.b.post(receive_wr(20, t, 500));
    p.b.post(receive_wr(21, t, 500));
    p.a.post(silent(send_wr(1, s, 100)));
    p.a.post(send_wr(2, s, 100));
    p.a.post(silent(WorkRequest::Write {
        id: 3,
        sgl: vec![sge(s, 0, 300)],
        remote: remote(600),
        silent: false,
    }));
    p.a.post(silent(read_wr(4, sge(s, 0, 50), t, 600)));
    p.a.post(WorkRequest::Write {
        id: 5,
        sgl: vec![sge(s, 0, 10)],
        remote: remote(990),
        silent: false,
    });
    p.pump();
    // Only the signaled ones complete at A; every Send still completes a Receive at B.
    assert_eq!(
        summary(&p.a.take()),
        vec![ok(2, CompletionOp::Send, 100), ok(5, CompletionOp::Write, 10)]
    );
    assert_eq!(
        summary(&p.b.take()),
        vec![
            ok(20, CompletionOp::Receive, 100),
            ok(21, CompletionOp::Receive, 100)
        ]
    );
    // The silent ones did their work and gave back their slots.
    assert_eq!(&sink.bytes()[600..900], &src[..]);
    assert_eq!(p.a.qp.stats().sq_outstanding, 0);
    assert_eq!(p.a.qp.stats().orq_outstanding, 0);
    // Failures complete silent requests: a local protection error at post, and a flush.
    p.a.post(silent(send_wr(6, Stag(0xbad), 10)));
    p.budget = 0;
    p.a.post(silent(send_wr(7, s, 10)));
    p.a.qp.flush(NdStatus::Canceled, &mut p.a.comps);
    assert_eq!(
        summary(&p.a.take()),
        vec![
            (6, CompletionOp::Send, NdStatus::AccessViolation, 0),
            (7, CompletionOp::Send, NdStatus::Canceled, 0),
        ]
    );
}
