//! Crafted inbound messages: protection errors as siw reports them, untagged sequence rules, Send with
//! Invalidate, Read Responses, and the error state.

use super::*;

#[test]
fn write_protection_errors_as_siw_tagged_error() {
    let t = target();
    let ddp = |code, v| Some((tagged_cause(code), v));
    let cases = [
        (
            Stag(t.rw.0 ^ 0x55),
            0,
            ddp(ddp_code::TAGGED_INVALID_STAG, Violation::WriteInvalidStag),
        ),
        (
            t.stale,
            0,
            ddp(ddp_code::TAGGED_INVALID_STAG, Violation::WriteInvalidStag),
        ),
        (
            t.rw,
            250,
            ddp(ddp_code::TAGGED_BASE_OR_BOUNDS, Violation::WriteOutOfBounds),
        ),
        (
            t.rw,
            u64::MAX - 2,
            ddp(ddp_code::TAGGED_BASE_OR_BOUNDS, Violation::WriteOutOfBounds),
        ),
        // siw_tagged_error: RFC 5041 has no access-rights code; invalid STag. The queue pair still knows.
        (
            t.ro,
            0,
            ddp(ddp_code::TAGGED_INVALID_STAG, Violation::WriteWithoutRemoteWrite),
        ),
        (
            t.foreign,
            0,
            ddp(
                ddp_code::TAGGED_STAG_NOT_ASSOCIATED,
                Violation::WriteNotAssociated,
            ),
        ),
        // Another PD of the same session (siw_check_mem: `mem->pd != pd` → E_PD_MISMATCH).
        (
            t.other_pd,
            0,
            ddp(
                ddp_code::TAGGED_STAG_NOT_ASSOCIATED,
                Violation::WriteNotAssociated,
            ),
        ),
        (t.rw, 248, None),
    ];
    for (stag, to, expect) in cases {
        let mut t = target();
        let r = t
            .side
            .deliver(&tagged(RdmapOpcode::RdmaWrite, stag.0, to, true, &[7; 8]));
        assert_eq!(r.err(), expect.map(|e| e.0), "stag {stag:?} to {to}");
        assert_eq!(t.side.qp.state() == QpState::Error, expect.is_some());
        // What the queue pair keeps: the rule broken and the buffer the Write named.
        let kept = t
            .side
            .qp
            .terminate_info()
            .map(|i| (i.from_peer, i.violation, i.buffer));
        let buffer = TaggedRange {
            stag,
            offset: to,
            length: 8,
        };
        assert_eq!(kept, expect.map(|e| (false, Some(e.1), Some(buffer))));
    }
    // A zero-length Write (the RFC 6581 Write RTR: STag 0) is not checked (siw_proc_write).
    let mut t = target();
    t.side
        .deliver(&tagged(RdmapOpcode::RdmaWrite, 0, 0, true, &[]))
        .unwrap();
}

#[test]
fn read_protection_errors_as_siw_rdmap_error() {
    let t = target();
    let rdmap = |code| Some(cause(layer::RDMAP, rdmap_type::REMOTE_PROTECTION, code));
    let cases = [
        (Stag(t.rw.0 ^ 0x55), 0, 8, rdmap(rdmap_code::INVALID_STAG)),
        (t.stale, 0, 8, rdmap(rdmap_code::INVALID_STAG)),
        (t.rw, 200, 100, rdmap(rdmap_code::BASE_OR_BOUNDS)),
        (t.ro, 0, 8, rdmap(rdmap_code::ACCESS_RIGHTS)),
        (t.foreign, 0, 8, rdmap(rdmap_code::STAG_NOT_ASSOCIATED)),
        (t.other_pd, 0, 8, rdmap(rdmap_code::STAG_NOT_ASSOCIATED)),
        (t.rw, 0, 256, None),
        // Zero-length: not checked (siw; the RFC 6581 Read RTR).
        (Stag(0), 0, 0, None),
    ];
    for (stag, to, size, expect) in cases {
        let mut t = target();
        let body = rr_body(0x99, 0, size, stag.0, to);
        let r = t.side.deliver(&read_request(1, true, &body));
        assert_eq!(r.err(), expect, "stag {stag:?} to {to} size {size}");
        // The source the Read named, kept with the rule it broke.
        let kept = t.side.qp.terminate_info().and_then(|i| i.buffer);
        let source = TaggedRange {
            stag,
            offset: to,
            length: size,
        };
        assert_eq!(kept, expect.map(|_| source));
    }
    let mut t = target();
    let body = rr_body(0x99, 0, 8, t.ro.0, 0);
    assert!(t.side.deliver(&read_request(1, true, &body)).is_err());
    let kept = t.side.qp.terminate_info().unwrap();
    assert_eq!(kept.violation, Some(Violation::ReadWithoutRemoteRead));
    // RFC 5040 §7.2: a sink range that wraps is "TO wrap".
    let mut t = target();
    let body = rr_body(0x99, u64::MAX - 3, 8, t.rw.0, 0);
    assert_eq!(
        t.side.deliver(&read_request(1, true, &body)).err(),
        rdmap(rdmap_code::TO_WRAP)
    );
}

#[test]
fn untagged_sequence_errors() {
    let ut = |code| Some(untagged_cause(code));
    let recv = |t: &mut Target| {
        let rw = t.rw;
        t.side.post(receive_wr(1, rw, 100));
    };
    // A Send sequence error, with a Receive posted: (what, the segment accepted first, the offending segment,
    // its error, the Receive's completion).
    let abc = send_segment(1, 0, false, b"abc");
    for (what, first, bad, code, receive) in [
        (
            // The Receive was never touched: flushed with CANCELED.
            "MSN must start at 1 (RFC 5041 §4.4)",
            None,
            send_segment(2, 0, true, b"x"),
            ddp_code::UNTAGGED_MSN_RANGE,
            Some((NdStatus::Canceled, 0)),
        ),
        (
            // The partly filled Receive completes with REMOTE_ERROR.
            "MO must continue where the message stands",
            Some(abc),
            send_segment(1, 4, true, b"d"),
            ddp_code::UNTAGGED_INVALID_MO,
            Some((NdStatus::RemoteError, 3)),
        ),
        (
            "a second message starting (MO 0) inside an unfinished one is an MO error too",
            Some(abc),
            send_segment(1, 0, true, b"abc"),
            ddp_code::UNTAGGED_INVALID_MO,
            None,
        ),
    ] {
        let mut t = target();
        recv(&mut t);
        if let Some(first) = first {
            t.side.deliver(&first).unwrap();
        }
        assert_eq!(t.side.deliver(&bad).err(), ut(code), "{what}");
        if let Some((status, bytes)) = receive {
            assert_eq!(
                summary(&t.side.take()),
                vec![(1, CompletionOp::Receive, status, bytes)],
                "{what}"
            );
        }
    }

    // Wrong queue number for a Send / a Read Request.
    let body = rr_body(1, 0, 0, 0, 0);
    for bad in [
        untagged(RdmapOpcode::Send, 5, 1, 0, 0, true, b""),
        untagged(RdmapOpcode::RdmaReadRequest, QN_SEND, 1, 0, 0, true, &body),
    ] {
        let mut t = target();
        assert_eq!(t.side.deliver(&bad).err(), ut(ddp_code::UNTAGGED_INVALID_QN));
    }

    // Read Requests have their own MSN sequence.
    let mut t = target();
    let rw = t.rw.0;
    let body = rr_body(1, 0, 4, rw, 0);
    recv(&mut t);
    t.side.deliver(&send_segment(1, 0, true, b"s")).unwrap();
    t.side.deliver(&read_request(1, true, &body)).unwrap();
    let r = t.side.deliver(&read_request(3, true, &body));
    assert_eq!(r.err(), ut(ddp_code::UNTAGGED_MSN_RANGE));

    // Malformed Read Requests: segmented, or the wrong size (RFC 5040 §4.4, §5.2).
    let cat = Some(remote_operation_cause(rdmap_code::CATASTROPHIC_STREAM));
    for bad in [read_request(1, false, &body), read_request(1, true, &body[..27])] {
        let mut t = target();
        assert_eq!(t.side.deliver(&bad).err(), cat);
    }
}

#[test]
fn send_without_receive_is_no_buffer() {
    let mut p = Pair::new(params(false, 1448), params(false, 1448));
    let (_, s, _) = p.a.region(vec![1; 10], Access(0));
    p.a.post(send_wr(1, s, 10));
    p.pump();
    assert_eq!(p.b.terminated, Some(untagged_cause(ddp_code::UNTAGGED_NO_BUFFER)));
    // The Send itself completed when it was transmitted (iWARP has no end-to-end ACK).
    assert_eq!(summary(&p.a.take()), vec![ok(1, CompletionOp::Send, 10)]);
    assert_eq!(p.a.qp.state(), QpState::Error);
    let info = p.a.qp.terminate_info().unwrap();
    assert_eq!(
        (info.layer, info.code, info.from_peer),
        (layer::DDP, ddp_code::UNTAGGED_NO_BUFFER, true)
    );
    // The receiver knows which rule; the sender has only the cause.
    assert_eq!(info.violation, None);
    let mine = p.b.qp.terminate_info().unwrap();
    assert_eq!(mine.violation, Some(Violation::SendWithoutReceive));
}

#[test]
fn message_too_long_is_data_overrun() {
    let mut p = Pair::new(params(false, 64), params(false, 64));
    let (_, s, _) = p.a.region(vec![1; 200], Access(0));
    let (_, r, _) = p.b.region(vec![0; 200], Access::LOCAL_WRITE);
    for id in [1, 2] {
        p.b.post(WorkRequest::Receive {
            id,
            sgl: split_sgl(r, 0, 100, 2),
        });
    }
    p.a.post(send_wr(9, s, 150));
    p.pump();
    assert_eq!(
        p.b.terminated,
        Some(untagged_cause(ddp_code::UNTAGGED_MESSAGE_TOO_LONG))
    );
    // 46 bytes per segment: two segments (92 bytes) fit, the third overruns.
    assert_eq!(
        summary(&p.b.take()),
        vec![
            (1, CompletionOp::Receive, NdStatus::DataOverrun, 92),
            (2, CompletionOp::Receive, NdStatus::Canceled, 0)
        ]
    );
}

#[test]
fn send_with_invalidate_invalidates_the_receivers_stag() {
    let mut p = Pair::new(params(true, 1448), params(true, 1448));
    let (_, s, _) = p.a.region(vec![5; 16], Access(0));
    let (_, r, _) = p.b.region(vec![0; 16], Access::LOCAL_WRITE);
    let (_, target, _) = p.b.region(vec![0; 16], Access::REMOTE_WRITE);
    p.b.post(receive_wr(1, r, 16));
    p.a.post(WorkRequest::Send {
        id: 1,
        sgl: vec![sge(s, 0, 4)],
        solicited: true,
        invalidate: Some(target),
        silent: false,
    });
    p.pump();
    let got = p.b.take();
    assert_eq!(summary(&got), vec![ok(1, CompletionOp::Receive, 4)]);
    assert_eq!((got[0].1.solicited, got[0].1.invalidated), (true, Some(target)));
    // On the wire: opcode 6 with the STag in the Invalidate STag field (RFC 5040 §4.1).
    assert_eq!(
        p.log[0].1.opcode,
        RdmapOpcode::SendWithSolicitedEventAndInvalidate
    );
    assert!(matches!(p.log[0].1.placement, Placement::Untagged { ulp_field, .. } if ulp_field == target.0));
    // A later Write to it is refused: invalid STag.
    p.a.post(WorkRequest::Write {
        id: 2,
        sgl: vec![sge(s, 0, 4)],
        remote: RemoteBuffer {
            stag: target,
            offset: 0,
        },
        silent: false,
    });
    p.pump();
    assert_eq!(p.b.terminated, Some(tagged_cause(ddp_code::TAGGED_INVALID_STAG)));

    // An STag that cannot be invalidated (another session's): RDMAP "cannot invalidate" (0x09).
    let mut t = target_with_receive();
    let foreign = t.foreign.0;
    let r = t.side.deliver(&untagged(
        RdmapOpcode::SendWithInvalidate,
        QN_SEND,
        1,
        0,
        foreign,
        true,
        b"x",
    ));
    assert_eq!(
        r.err(),
        Some(remote_operation_cause(rdmap_code::CANNOT_INVALIDATE))
    );
    assert_eq!(
        summary(&t.side.take()),
        vec![(1, CompletionOp::Receive, NdStatus::RemoteError, 1)]
    );
}

#[test]
fn read_response_checks() {
    let tag = |code| Some(tagged_cause(code));
    // No Read outstanding: unexpected opcode (RFC 5040 §7.2).
    let mut t = target();
    let r = t
        .side
        .deliver(&tagged(RdmapOpcode::RdmaReadResponse, t.rw.0, 0, true, b"x"));
    assert_eq!(
        r.err(),
        Some(remote_operation_cause(rdmap_code::UNEXPECTED_OPCODE))
    );
    let with_read = || {
        let mut t = target();
        let rw = t.rw;
        t.side.post(read_wr(4, sge(rw, 16, 8), Stag(0x700), 0));
        t.side.transmit(1);
        assert_eq!(t.side.qp.stats().orq_outstanding, 1);
        t
    };
    let mut t = with_read();
    let r = t.side.deliver(&tagged(
        RdmapOpcode::RdmaReadResponse,
        t.rw.0 ^ 1,
        16,
        true,
        &[0; 8],
    ));
    assert_eq!(r.err(), tag(ddp_code::TAGGED_INVALID_STAG));
    assert_eq!(
        summary(&t.side.take()),
        vec![(4, CompletionOp::Read, NdStatus::RemoteError, 0)]
    );
    // (offset, length) of a last segment that misses the 8-byte sink at offset 16: at the wrong offset, too
    // long, and short (L before the whole read size arrived).
    for (offset, len) in [(17, 8), (16, 9), (16, 7)] {
        let mut t = with_read();
        let payload = vec![0; len];
        let r = t.side.deliver(&tagged(
            RdmapOpcode::RdmaReadResponse,
            t.rw.0,
            offset,
            true,
            &payload,
        ));
        assert_eq!(
            r.err(),
            tag(ddp_code::TAGGED_BASE_OR_BOUNDS),
            "offset {offset}, {len} bytes"
        );
    }
    // The sink deregistered meanwhile.
    let mut t = with_read();
    let id = t
        .side
        .mem
        .info(MemoryRegionId(1))
        .map(|_| MemoryRegionId(1))
        .unwrap();
    t.side.mem.deregister(S2, id).unwrap();
    let r = t
        .side
        .deliver(&tagged(RdmapOpcode::RdmaReadResponse, t.rw.0, 16, true, &[0; 8]));
    assert_eq!(r.err(), tag(ddp_code::TAGGED_BASE_OR_BOUNDS));
    // Correct, in two segments.
    let mut t = with_read();
    t.side
        .deliver(&tagged(RdmapOpcode::RdmaReadResponse, t.rw.0, 16, false, &[1; 5]))
        .unwrap();
    t.side
        .deliver(&tagged(RdmapOpcode::RdmaReadResponse, t.rw.0, 21, true, &[2; 3]))
        .unwrap();
    assert_eq!(summary(&t.side.take()), vec![ok(4, CompletionOp::Read, 8)]);
}

#[test]
fn other_opcodes_and_error_state() {
    let unexpected = Some(remote_operation_cause(rdmap_code::UNEXPECTED_OPCODE));
    let mut t = target();
    let r = t
        .side
        .deliver(&untagged(RdmapOpcode::Terminate, 2, 1, 0, 0, true, &[0, 0, 0, 0]));
    assert_eq!(r.err(), unexpected);
    // In Error everything is ignored.
    let w = tagged(RdmapOpcode::RdmaWrite, 0xdead, 0, true, b"zz");
    assert_eq!(t.side.deliver(&w), Ok(()));
    // A Send in a tagged segment / a Write in an untagged one (only a hand-built MessageRepr can).
    let mut t = target();
    assert_eq!(
        t.side.deliver(&tagged(RdmapOpcode::Send, 0, 0, true, b"")).err(),
        unexpected
    );
    let mut t = target();
    assert_eq!(
        t.side
            .deliver(&untagged(RdmapOpcode::RdmaWrite, 0, 1, 0, 0, true, b""))
            .err(),
        unexpected
    );
}

/// The asynchronous event each refusal raises, where siw's `siw_qp_event` raises one: ACCESS_ERR for a
/// Write `siw_check_mem` refuses (but none for an STag that names no region: `siw_mem_id2obj` fails first),
/// REQ_ERR for a refused Read source (its Read Response fails at transmit), FATAL for a Send whose header
/// breaks a DDP rule, and none for the peer's Terminate. Once per queue pair.
#[test]
fn refusals_raise_the_async_event_siw_raises() {
    use crate::engine::verbs::QueuePairEvent::{AccessError, Fatal, RequestError};
    let t0 = target();
    let writes = [
        (Stag(t0.rw.0 ^ 0x55), 0, None),
        (t0.stale, 0, None),
        (t0.rw, 250, Some(AccessError)),
        (t0.ro, 0, Some(AccessError)),
        (t0.foreign, 0, Some(AccessError)),
        (t0.other_pd, 0, Some(AccessError)),
        (t0.rw, 248, None),
    ];
    for (stag, to, want) in writes {
        let mut t = target();
        let _ = t
            .side
            .deliver(&tagged(RdmapOpcode::RdmaWrite, stag.0, to, true, &[7; 8]));
        assert_eq!(t.side.qp.take_event(), want, "Write to {stag:?} at {to}");
        assert_eq!(t.side.qp.take_event(), None, "raised once");
    }
    // An invalidated STag: siw finds the region and siw_check_mem refuses it (stag_valid 0): ACCESS_ERR,
    // with the DDP invalid-STag Terminate of any unknown STag.
    let mut t = target();
    t.side.mem.invalidate(S2.into(), t.rw).unwrap();
    let r = t
        .side
        .deliver(&tagged(RdmapOpcode::RdmaWrite, t.rw.0, 0, true, &[7; 8]));
    assert_eq!(r.err(), Some(tagged_cause(ddp_code::TAGGED_INVALID_STAG)));
    let kept = t.side.qp.terminate_info().and_then(|i| i.violation);
    assert_eq!(kept, Some(Violation::WriteInvalidatedStag));
    assert_eq!(t.side.qp.take_event(), Some(AccessError));
    let reads = [
        (Stag(t0.rw.0 ^ 0x55), 0, 8, Some(RequestError)),
        (t0.rw, 200, 100, Some(RequestError)),
        (t0.ro, 0, 8, Some(RequestError)),
        (t0.other_pd, 0, 8, Some(RequestError)),
        (t0.rw, 0, 256, None),
    ];
    for (stag, to, size, want) in reads {
        let mut t = target();
        let body = rr_body(0x99, 0, size, stag.0, to);
        let _ = t.side.deliver(&read_request(1, true, &body));
        assert_eq!(t.side.qp.take_event(), want, "Read of {stag:?} at {to}");
    }
    // A Send out of MSN sequence (siw_send_check_ntoh → IB_EVENT_QP_FATAL).
    let mut t = target();
    t.side.post(WorkRequest::Receive {
        id: 1,
        sgl: vec![sge(t.rw, 0, 64)],
    });
    assert!(t.side.deliver(&send_segment(2, 0, true, b"x")).is_err());
    assert_eq!(t.side.qp.take_event(), Some(Fatal));
    // The peer's Terminate: none (siw_proc_terminate only drops the connection).
    let mut t = target();
    t.side.qp.on_terminate(stream_lost(true), &mut t.side.comps);
    assert_eq!(t.side.qp.take_event(), None);
}
