//! What connections do once the handshake is under way: the first-FPDU hold, disconnects, responder
//! timeouts, malformed streams, rejects, and the hand-off of established connections to clients.

use super::*;

/// Both sides with the siw-compatible config and a first-FPDU hold of `hold`: A connects, B accepts, and A's
/// Connect has completed (the Reply arrived, the hold starts now). Returns (the net, A's connector, B's
/// connector, B's pending Accept).
fn accepted_under_first_fpdu_hold(hold: Duration) -> (Net, ConnectorId, ConnectorId, RequestId) {
    let mut cfg = CmConfig::default_siw_compatible();
    cfg.first_fpdu_hold = hold;
    let mut net = Net::with_first_fpdu_hold(cfg.clone(), cfg);
    let (ca, cb, connect, _) = offer(&mut net, b"hold");
    let (accept, _) = net.accept_b(cb);
    net.assert_completed(Side::A, connect, NdStatus::Success, "");
    (net, ca, cb, accept)
}

/// siw's responder race ([`super::first_fpdu`]): after the Reply, the active side sends nothing — not the
/// RTR, not the queue pair's first FPDU — until the hold ends; then both go, in order, and the passive side
/// is never held. The deadline is the CM's timer; a Terminate in between drops what was held.
#[test]
fn first_fpdu_is_held_after_the_reply_until_the_hold_ends() {
    let hold = Duration::from_millis(20);
    let (mut net, ca, _, accept) = accepted_under_first_fpdu_hold(hold);
    let reply_at = net.now;
    assert_eq!(net.a.poll_timeout(), Some(reply_at + hold), "the hold's deadline");
    net.ok_a(CmRequest::CompleteConnect { connector: ca });
    assert_eq!(
        net.completion(Side::B, accept),
        None,
        "the RTR is held: B's Accept still waits"
    );
    // Not yet: a moment before the deadline nothing moves.
    net.a.handle_timeout(reply_at + hold - Duration::from_millis(1));
    net.pump();
    assert_eq!(net.completion(Side::B, accept), None);
    net.a.handle_timeout(reply_at + hold);
    net.pump();
    net.assert_completed(
        Side::B,
        accept,
        NdStatus::Success,
        "the held RTR arrived and completed the Accept",
    );
    assert_eq!(
        net.a.poll_timeout(),
        Some(reply_at + hold + hold),
        "then only a FIN would wait, one more hold"
    );
    net.a.handle_timeout(reply_at + hold + hold);
    net.pump();
    assert_eq!(net.a.poll_timeout(), None, "no deadline left");
    assert_eq!(net.b.poll_timeout(), None, "the passive side never holds");
}

/// Without RTR, the first FPDUs the hold keeps are the queue pair's own: a Send posted during the hold goes
/// out (and is received) only when the hold ends — the queue pair, passed over while held, is woken then.
#[test]
fn a_send_posted_during_the_first_fpdu_hold_goes_when_it_ends() {
    use crate::engine::memory::VecMemory;
    use crate::engine::verbs::*;
    let hold = Duration::from_millis(20);
    let mut cfg = CmConfig::default_siw_compatible();
    cfg.first_fpdu_hold = hold;
    cfg.mpa.peer_to_peer = false;
    let mut net = Net::with_first_fpdu_hold(cfg.clone(), cfg);
    // A queue pair and a 16-byte region on each side.
    let mut end = |side: Side| {
        let CmResponse::CompletionQueue(cq) = net.ok(side, S1, CmRequest::CreateCompletionQueue { depth: 8 })
        else {
            panic!()
        };
        let CmResponse::QueuePair(qp) = net.ok(
            side,
            S1,
            CmRequest::CreateQueuePair {
                config: QueuePairConfig::on_one_cq(cq, 4),
            },
        ) else {
            panic!()
        };
        let Ok(CmResponse::MemoryRegion { stag, .. }) =
            net.cm(side)
                .register_memory(S1.into(), Box::new(VecMemory::new(16)), Access::LOCAL_WRITE, 0)
        else {
            panic!()
        };
        (qp, stag)
    };
    let (qa, sa) = end(Side::A);
    let (qb, sb) = end(Side::B);
    let sge = |stag| Sge {
        stag,
        offset: 0,
        length: 16,
    };
    let l = net.listen(Side::B, 7000, 0);
    let ca = net.connector(Side::A, S1);
    let cb = net.connector(Side::B, S1);
    net.req(
        Side::A,
        S1,
        CmRequest::Connect {
            connector: ca,
            remote: Net::addr(Side::B, 7000),
            limits: LIMITS_A,
            private_data: Bytes::new(),
            shared_endpoint: None,
            queue_pair: Some(qa),
        },
    )
    .1
    .unwrap();
    net.ok(
        Side::B,
        S1,
        CmRequest::GetConnectionRequest {
            listener: l,
            connector: cb,
        },
    );
    net.b
        .post(
            S1,
            qb,
            vec![WorkRequest::Receive {
                id: 7,
                sgl: vec![sge(sb)],
            }],
        )
        .unwrap();
    net.ok(
        Side::B,
        S1,
        CmRequest::Accept {
            connector: cb,
            limits: LIMITS_B,
            private_data: Bytes::new(),
            queue_pair: Some(qb),
        },
    );
    let reply_at = net.now;
    net.ok(Side::A, S1, CmRequest::CompleteConnect { connector: ca });
    net.a
        .post(
            S1,
            qa,
            vec![WorkRequest::Send {
                id: 1,
                sgl: vec![sge(sa)],
                solicited: false,
                invalidate: None,
                silent: false,
            }],
        )
        .unwrap();
    net.pump();
    let received = |net: &mut Net| {
        net.b
            .poll_completions()
            .into_iter()
            .flat_map(|(_, _, cs)| cs)
            .filter(|c| c.wr_id == 7 && c.status == NdStatus::Success)
            .count()
    };
    assert_eq!(received(&mut net), 0, "the Send is held");
    net.a.handle_timeout(reply_at + hold);
    net.pump();
    assert_eq!(received(&mut net), 1, "the Send went when the hold ended");
}

/// A Disconnect during the first-FPDU hold: the FIN waits too, and goes one more hold after the held RTR
/// (siw must report ESTABLISHED for the RTR before it sees the FIN: [`super::first_fpdu`]).
#[test]
fn a_fin_during_the_first_fpdu_hold_follows_the_held_rtr() {
    let hold = Duration::from_millis(20);
    let (mut net, ca, cb, accept) = accepted_under_first_fpdu_hold(hold);
    let reply_at = net.now;
    net.ok_a(CmRequest::CompleteConnect { connector: ca });
    let (notify_b, _) = net.req_b(CmRequest::NotifyDisconnect { connector: cb });
    net.ok_a(CmRequest::Disconnect { connector: ca });
    assert_eq!(net.completion(Side::B, accept), None, "the RTR is held");
    assert_eq!(net.completion(Side::B, notify_b), None, "the FIN is held");
    net.a.handle_timeout(reply_at + hold);
    net.pump();
    net.assert_completed(Side::B, accept, NdStatus::Success, "the RTR first");
    assert_eq!(net.completion(Side::B, notify_b), None, "the FIN still waits");
    net.a.handle_timeout(reply_at + hold + hold);
    net.pump();
    net.assert_completed(Side::B, notify_b, NdStatus::Success, "then the FIN");
    assert_eq!(net.a.poll_timeout(), None);
}

#[test]
fn disconnect_notifies_the_peer_and_cancels_own_requests() {
    let mut net = Net::new();
    let (ca, cb) = connected_pair(&mut net);
    let (notify_b, r) = net.req_b(CmRequest::NotifyDisconnect { connector: cb });
    assert_eq!(r.unwrap(), CmResponse::Pending);
    let (notify_a, _) = net.req_a(CmRequest::NotifyDisconnect { connector: ca });
    assert_eq!(net.completion(Side::B, notify_b), None);
    net.ok_a(CmRequest::Disconnect { connector: ca });
    net.assert_completed(
        Side::A,
        notify_a,
        NdStatus::Canceled,
        "Disconnect flushes with CANCELED",
    );
    net.assert_completed(
        Side::B,
        notify_b,
        NdStatus::Success,
        "NotifyDisconnect fires on the peer",
    );
    assert_eq!(
        net.status_of(Side::A, S1, connect_a(ca, Net::addr(Side::B, 7000), Bytes::new())),
        NdStatus::ConnectionInvalid,
        "not reusable"
    );
    assert_eq!(
        (net.a.status().ports_in_use, net.b.status().ports_in_use),
        (0, 1),
        "only B's listener port remains"
    );
}

#[test]
fn closing_a_session_mid_handshake_frees_everything() {
    let mut net = Net::new();
    let (_, cb, _, _) = offer(&mut net, b"");
    assert_eq!(net.a.status().ports_in_use, 1);
    let now = net.now;
    net.a.close_session(now, S1);
    net.pump();
    assert_eq!(net.a.status().ports_in_use, 0);
    assert!(net.a.status().connectors.is_empty());
    assert_eq!(net.accept_b_status(cb), NdStatus::ConnectionAborted);
}

#[test]
fn without_peer_to_peer_accept_completes_on_the_reply() {
    let mut cfg = CmConfig::default_siw_compatible();
    cfg.mpa.peer_to_peer = false;
    let mut net = Net::with(cfg.clone(), cfg);
    let (ca, cb, connect, _) = offer(&mut net, b"");
    assert_eq!(net.accept_b(cb).1.unwrap(), CmResponse::Done);
    net.assert_completed(Side::A, connect, NdStatus::Success, "");
    net.ok_a(CmRequest::CompleteConnect { connector: ca });
}

#[test]
fn revision_one_peer_and_retry() {
    let mut v1 = CmConfig::default_siw_compatible();
    v1.mpa.revision = 1;
    let mut net = Net::with(v1, CmConfig::default_siw_compatible());
    let (ca, cb, connect, _) = offer(&mut net, b"v1");
    // An RFC 5044 peer sends no limits: B reports the adapter's.
    assert_eq!(
        net.ok_b(CmRequest::GetReadLimits { connector: cb }),
        CmResponse::ReadLimits(ReadLimits::new(128, 128))
    );
    assert_eq!(net.accept_b(cb).1.unwrap(), CmResponse::Done);
    net.assert_completed(Side::A, connect, NdStatus::Success, "");
    net.ok_a(CmRequest::CompleteConnect { connector: ca });

    // A responder that closes on S=1: the initiator retries once with Rev 1 and gets through.
    let mut net = Net::new();
    net.b_closes_on_enhanced = true;
    let (_, cb, connect, _) = offer(&mut net, b"retry");
    assert_eq!(net.accept_b(cb).1.unwrap(), CmResponse::Done);
    net.assert_completed(Side::A, connect, NdStatus::Success, "");
}

/// B, configured `b`, accepts a raw TCP connection that never sends the Request: nothing happens until
/// `deadline` after the accept, not a millisecond before; then B resets the connection and waits for nothing.
fn assert_silent_connection_reset_at(b: CmConfig, deadline: Duration) {
    let mut net = Net::with(CmConfig::default_siw_compatible(), b);
    let listener = net.listen(Side::B, 7000, 0);
    let t0 = net.now;
    net.b
        .handle_transport(t0, raw_accepted(listener, ConnId(77), 40000));
    assert_eq!(net.b.poll_transport(), None);
    assert_eq!(net.b.poll_timeout(), Some(t0 + deadline));
    net.b.handle_timeout(t0 + deadline - Duration::from_millis(1));
    assert_eq!(net.b.poll_transport(), None, "nothing before the deadline");
    net.b.handle_timeout(t0 + deadline);
    assert_eq!(
        net.b.poll_transport(),
        Some(TransportCommand::Close {
            conn: ConnId(77),
            abort: true
        }),
        "the silent connection is reset at {deadline:?}"
    );
    assert_eq!(net.b.poll_transport(), None);
    assert_eq!(net.b.poll_timeout(), None);
}

#[test]
fn responder_waits_five_seconds_for_the_request() {
    assert_silent_connection_reset_at(CmConfig::default_siw_compatible(), Duration::from_secs(5));
}

/// The responder timeout is the configured one (soft-rdmad `--mpa-timeout-ms`): a silent connection is reset
/// at that deadline, not before, and the default 5 s does not apply.
#[test]
fn the_configured_responder_timeout_applies() {
    let mut b = CmConfig::default_siw_compatible();
    b.mpa.request_timeout = Duration::from_millis(1000);
    assert_silent_connection_reset_at(b, Duration::from_millis(1000));
}

/// A thousand responders waiting for their Requests: the next deadline is always the earliest live one
/// (kept in an index, not found by scanning every connection on every event), a Request that arrives takes
/// its connection's deadline away, and each silent one closes at its own deadline.
#[test]
fn many_responder_deadlines() {
    let (mut net, l) = listening_at_7000();
    let t0 = net.now;
    let ms = Duration::from_millis;
    let conn = |i: u64| ConnId(10_000 + i);
    for i in 0..1000u64 {
        net.b
            .handle_transport(t0 + ms(i), raw_accepted(l, conn(i), 40_000 + i as u16));
    }
    assert_eq!(net.b.poll_timeout(), Some(t0 + ms(5000)));
    // Even-numbered initiators send their Request.
    for i in (0..1000u64).step_by(2) {
        net.b
            .handle_transport(t0 + ms(1000), received(conn(i), RAW_REQUEST));
    }
    assert_eq!(net.b.poll_timeout(), Some(t0 + ms(5001)), "the first silent one");
    assert_eq!(net.b.poll_transport(), None);
    let closes = |cm: &mut Rnic| {
        let mut v = Vec::new();
        while let Some(cmd) = cm.poll_transport() {
            match cmd {
                TransportCommand::Close { conn, abort: true } => v.push(conn.0 - 10_000),
                other => panic!("unexpected {other:?}"),
            }
        }
        v.sort_unstable();
        v
    };
    net.b.handle_timeout(t0 + ms(5500));
    assert_eq!(closes(&mut net.b), (1..=499).step_by(2).collect::<Vec<u64>>());
    assert_eq!(net.b.poll_timeout(), Some(t0 + ms(5501)));
    net.b.handle_timeout(t0 + ms(6000));
    assert_eq!(closes(&mut net.b), (501..1000).step_by(2).collect::<Vec<u64>>());
    assert_eq!(net.b.poll_timeout(), None);
    assert_eq!(net.b.timer_entries(), 0, "stale entries are dropped, not kept");
    assert_eq!(net.b.status().listeners[0].queued_offers, 500);
    // Much later, nothing else fires: the offers have no deadline (nothing times out the application).
    net.b.handle_timeout(t0 + ms(60_000));
    assert_eq!(net.b.poll_transport(), None);
}

#[test]
fn shutdown_completes_pending_requests_with_device_removed() {
    let mut net = Net::new();
    let (ca, _cb) = connected_pair(&mut net);
    let (notify, _) = net.req_a(CmRequest::NotifyDisconnect { connector: ca });
    let now = net.now;
    net.a.shutdown(now);
    net.pump();
    net.assert_completed(Side::A, notify, NdStatus::DeviceRemoved, "");
    assert_eq!(net.a.status().ports_in_use, 0);
}

#[test]
fn malformed_fpdu_after_connect_terminates() {
    let mut net = Net::new();
    let (ca, cb) = connected_pair(&mut net);
    let (notify_a, _) = net.req_a(CmRequest::NotifyDisconnect { connector: ca });
    let _ = cb;
    // B's side of the connection receives an FPDU with an unknown opcode: B terminates and closes.
    let bconn = net
        .peers
        .iter()
        .find(|((s, _), _)| *s == Side::B)
        .map(|((_, c), _)| *c)
        .unwrap();
    let bad = Bytes::from_static(&[
        0x00, 0x12, 0x41, 0x4F, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0,
    ]);
    net.b.handle_transport(net.now, received(bconn, bad));
    // RFC 5040 §7.2: an unknown opcode is a remote operation error, "unexpected opcode"; the Terminate goes
    // out (no CRC was negotiated), then a FIN (not a reset, which could discard the Terminate).
    let cause = TerminateCause::new(
        layer::RDMAP,
        rdmap_type::REMOTE_OPERATION,
        rdmap_code::UNEXPECTED_OPCODE,
    );
    let TransportCommand::Send { conn, data } = net.b.poll_transport().expect("a Terminate") else {
        panic!("B sends the Terminate first");
    };
    assert_eq!(conn, bconn);
    assert_eq!(data, crate::engine::framing::terminate_fpdu(cause, false));
    let msg = crate::engine::framing::parse_message(&data, 65535).unwrap();
    assert_eq!(msg.terminate().unwrap().cause, cause);
    assert_eq!(
        net.b.poll_transport(),
        Some(TransportCommand::Close {
            conn: bconn,
            abort: false
        })
    );
    assert_eq!(net.b.poll_transport(), None);
    // Deliver the Terminate and the close to A.
    net.execute(Side::B, TransportCommand::Send { conn: bconn, data });
    net.execute(
        Side::B,
        TransportCommand::Close {
            conn: bconn,
            abort: false,
        },
    );
    net.pump();
    net.assert_completed(
        Side::A,
        notify_a,
        NdStatus::Success,
        "A sees the Terminate and the close",
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// The handshake's outcome does not depend on how the transport cuts the bytes.
    #[test]
    fn fragmentation_does_not_change_the_outcome(cuts in proptest::collection::vec(0usize..80, 0..10)) {
        let mut net = Net::new();
        net.cuts = cuts;
        let (ca, _cb) = connected_pair(&mut net);
        prop_assert_eq!(net.ok_a(CmRequest::GetReadLimits { connector: ca }), CmResponse::ReadLimits(ReadLimits::new(2, 8)));
    }
}

/// RFC 5044 §7.1.2: the initiator sends nothing between its Request and the Reply. Bytes that arrive after an
/// offer is out (queued, or taken by the application) reset the connection: a queued offer is withdrawn, a
/// taken one's Accept fails with CONNECTION_ABORTED, nothing is kept for later, and the 4-tuple is free again.
/// (The daemon once buffered such bytes without bound until the application accepted.)
#[test]
fn bytes_before_the_reply_reset_the_offer() {
    for taken in [false, true] {
        let (mut net, l) = listening_at_7000();
        let accepted = |conn| raw_accepted(l, conn, 40000);
        let conn = ConnId(77);
        let now = net.now;
        net.b.handle_transport(now, accepted(conn));
        net.b.handle_transport(now, received(conn, RAW_REQUEST));
        let cb = net.connector(Side::B, S1);
        let gcr = get_connection_request(l, cb);
        if taken {
            assert!(matches!(
                net.ok_b(gcr.clone()),
                CmResponse::ConnectionRequest { .. }
            ));
        }
        let queued = |net: &Net| net.b.status().listeners[0].queued_offers;
        assert_eq!(queued(&net), u32::from(!taken));
        net.b
            .handle_transport(now, received(conn, &b"an FPDU before the Reply"[..]));
        let commands: Vec<_> = std::iter::from_fn(|| net.b.poll_transport()).collect();
        assert_eq!(
            commands,
            vec![TransportCommand::Close { conn, abort: true }],
            "taken: {taken}"
        );
        net.b.handle_transport(now, TransportEvent::Closed { conn });
        net.pump();
        assert_eq!(queued(&net), 0, "taken: {taken}");
        if taken {
            let accept = accept_b(cb, Bytes::new());
            assert_eq!(net.status_of(Side::B, S1, accept), NdStatus::ConnectionAborted);
            net.ok_b(CmRequest::CloseConnector { connector: cb });
        } else {
            let (_, r) = net.req_b(gcr);
            assert_eq!(r.unwrap(), CmResponse::Pending, "no offer left to take");
        }
        // The same 4-tuple is accepted again (a leaked tuple would be closed at once).
        net.b.handle_transport(now, accepted(ConnId(78)));
        assert_eq!(net.b.poll_transport(), None, "taken: {taken}");
    }
}

/// RFC 6581 §9: a Reply whose ORD exceeds our IRD is answered with a Terminate (LLP/MPA, insufficient IRD) in
/// FPDU mode — with a CRC when the Reply set C=1 (RFC 5044 §7.1), even if this side did not ask — and then a
/// FIN, not a reset that could discard the Terminate. The Connect fails with CONNECTION_ABORTED.
#[test]
fn unacceptable_reply_is_terminated_with_the_negotiated_crc_then_closed() {
    use soft_rdma_common::wire::fpdu::{FpduRepr, verify_crc};
    use soft_rdma_common::wire::mpa::{EnhancedControl, MpaKind, MpaRepr};
    use soft_rdma_common::wire::rdmap::{MessageRepr, RdmapOpcode};

    let mut net = Net::new();
    let ca = net.connector(Side::A, S1);
    let remote = Net::addr(Side::B, 7000);
    let now = net.now;
    let connect = RequestId(9000);
    let r = net
        .a
        .handle_request(now, S1, connect, connect_a(ca, remote, Bytes::new()));
    assert_eq!(r.unwrap(), CmResponse::Pending);
    let Some(TransportCommand::Connect { conn, local, .. }) = net.a.poll_transport() else {
        panic!("a TCP connect")
    };
    net.a.handle_transport(
        now,
        TransportEvent::Connected {
            conn,
            local,
            mss: 1448,
        },
    );
    assert!(
        matches!(net.a.poll_transport(), Some(TransportCommand::Send { .. })),
        "the Request"
    );
    let word = EnhancedControl {
        ird: 1,
        ord: LIMITS_A.inbound as u16 + 1,
        ..Default::default()
    };
    let reply = MpaRepr {
        kind: MpaKind::Reply,
        markers: false,
        crc: true,
        reject: false,
        revision: 2,
        enhanced: Some(word),
        private_data: b"",
    };
    let mut bytes = vec![0u8; reply.buffer_len()];
    reply.emit(&mut bytes).unwrap();
    net.a.handle_transport(now, received(conn, bytes));
    let commands: Vec<_> = std::iter::from_fn(|| net.a.poll_transport()).collect();
    let [TransportCommand::Send { data, .. }, close] = &commands[..] else {
        panic!("a Terminate, then a close: {commands:?}")
    };
    verify_crc(data).expect("the Terminate carries the CRC the Reply asked for");
    let f = FpduRepr::parse(data, 65535).unwrap();
    let m = MessageRepr::parse(f.ulpdu).unwrap();
    assert_eq!(m.opcode, RdmapOpcode::Terminate);
    let c = m.terminate().unwrap().cause;
    assert_eq!((c.layer, c.error_type, c.code), (2, 0, 0x06));
    assert_eq!(close, &TransportCommand::Close { conn, abort: false });
    let events: Vec<_> = std::iter::from_fn(|| net.a.poll_event()).collect();
    assert!(
        events
            .iter()
            .any(|(_, e)| matches!(e, CmEvent::Completed { request, result } if *request == connect
                && result
                    .as_ref()
                    .is_err_and(|e| e.status == NdStatus::ConnectionAborted))),
        "{events:?}"
    );
}

/// After a reject Reply the responder leaves the close to the initiator (kernel siw reads the Reply from a
/// work queue and loses its private data if our FIN's work runs first), and closes with a FIN itself only
/// after [`REJECT_LINGER`]. The 4-tuple and the connector are released at once either way.
#[test]
fn a_reject_lingers_for_the_initiators_close() {
    use crate::engine::cm::REJECT_LINGER;
    for initiator_closes in [true, false] {
        let (mut net, l) = listening_at_7000();
        let conn = ConnId(78);
        let now = net.now;
        net.b.handle_transport(now, raw_accepted(l, conn, 40000));
        net.b.handle_transport(now, received(conn, RAW_REQUEST));
        let cb = net.connector(Side::B, S1);
        net.ok_b(get_connection_request(l, cb));
        let reject = CmRequest::Reject {
            connector: cb,
            private_data: Bytes::from_static(b"no"),
        };
        assert_eq!(
            net.b.handle_request(now, S1, RequestId(9999), reject).unwrap(),
            CmResponse::Done
        );
        let commands: Vec<_> = std::iter::from_fn(|| net.b.poll_transport()).collect();
        assert!(
            matches!(&commands[..], [TransportCommand::Send { conn: c, data }] if *c == conn && data[16] & 0x20 != 0),
            "only the reject Reply goes out: {commands:?}"
        );
        assert_eq!(net.b.poll_timeout(), Some(now + REJECT_LINGER));
        if initiator_closes {
            net.b.handle_transport(now, TransportEvent::Closed { conn });
            assert_eq!(net.b.poll_transport(), None, "the initiator's close ends it");
            assert_eq!(net.b.poll_timeout(), None);
        } else {
            net.b
                .handle_timeout(now + REJECT_LINGER - Duration::from_millis(1));
            assert_eq!(net.b.poll_transport(), None, "still lingering");
            net.b.handle_timeout(now + REJECT_LINGER);
            assert_eq!(
                net.b.poll_transport(),
                Some(TransportCommand::Close { conn, abort: false })
            );
            assert_eq!(net.b.poll_timeout(), None);
        }
        assert_eq!(net.b.status().ports_in_use, 1, "only the listener's port");
    }
}

/// A GetConnectionRequest waiting with a connector that is then closed completes with CANCELED at once, and
/// the next offer goes to the next waiting call (the closed connector is never handed an offer).
#[test]
fn closing_a_connector_cancels_its_waiting_get_connection_request() {
    let (mut net, l) = listening_at_7000();
    let closed = net.connector(Side::B, S1);
    let taker = net.connector(Side::B, S1);
    let (first, r) = net.req_b(get_connection_request(l, closed));
    assert_eq!(r.unwrap(), CmResponse::Pending);
    net.ok_b(CmRequest::CloseConnector { connector: closed });
    net.assert_completed(Side::B, first, NdStatus::Canceled, "");
    let (second, r) = net.req_b(get_connection_request(l, taker));
    assert_eq!(r.unwrap(), CmResponse::Pending);
    let ca = net.connector(Side::A, S1);
    let (_, r) = net.req_a(connect_a(ca, Net::addr(Side::B, 7000), Bytes::from_static(b"x")));
    assert_eq!(r.unwrap(), CmResponse::Pending);
    match net.completion(Side::B, second) {
        Some(Ok(CmResponse::ConnectionRequest { connector, .. })) => assert_eq!(connector, taker),
        other => panic!("{other:?}"),
    }
}

/// Kernel mode's hand-off ([`super::cm`]'s `hand_off`): a connection carrying a queue pair the client runs
/// is handed over at Accept (passive: it waits for the RTR itself) and at CompleteConnect (active: it sends
/// the RTR itself); each request completes with what the client needs. The client reporting the end makes
/// the connector end as on the peer's disconnect.
#[test]
fn connections_with_client_queue_pairs_are_handed_over_once_established() {
    let mut cfg = CmConfig::default_siw_compatible();
    cfg.hand_off = true;
    let mut net = Net::with(cfg.clone(), cfg);
    let l = net.listen(Side::B, 7000, 0);
    let ca = net.connector(Side::A, S1);
    let cb = net.connector(Side::B, S1);
    // Queue pairs of the clients' own: the daemons never saw them.
    let (connect, r) = net.req_a(connect_a_with(
        ca,
        Net::addr(Side::B, 7000),
        Bytes::from_static(b"hi"),
        Some(QueuePairId(77)),
    ));
    assert_eq!(r.unwrap(), CmResponse::Pending);
    net.ok_b(get_connection_request(l, cb));
    let (accept, r) = net.req_b(accept_b_with(
        cb,
        Bytes::from_static(b"yo"),
        Some(QueuePairId(88)),
    ));
    assert_eq!(r.unwrap(), CmResponse::Pending);
    net.pump();
    net.assert_completed(Side::A, connect, NdStatus::Success, "the Reply");
    let Some(Ok(CmResponse::HandedOff(passive))) = net.completion(Side::B, accept) else {
        panic!("the Accept completes with the hand-off");
    };
    assert!(passive.awaiting_rtr && passive.tx_held && passive.send_rtr.is_none());
    assert_eq!(
        (passive.ird, passive.ord),
        (
            LIMITS_B.inbound.min(LIMITS_A.outbound),
            LIMITS_B.outbound.min(LIMITS_A.inbound)
        )
    );
    let (complete, r) = net.req_a(CmRequest::CompleteConnect { connector: ca });
    assert_eq!(
        r.unwrap(),
        CmResponse::Pending,
        "waits for the transport to let go"
    );
    net.pump();
    let Some(Ok(CmResponse::HandedOff(active))) = net.completion(Side::A, complete) else {
        panic!("CompleteConnect completes with the hand-off");
    };
    assert!(active.send_rtr.is_some(), "the client sends the RTR itself");
    assert!(!active.awaiting_rtr && !active.tx_held);
    assert!(active.received.is_empty());
    // The client saw the peer go: NotifyDisconnect fires, the connector is closed.
    let (notify, r) = net.req_b(CmRequest::NotifyDisconnect { connector: cb });
    assert_eq!(r.unwrap(), CmResponse::Pending);
    net.ok_b(CmRequest::ConnectionEnded {
        connector: cb,
        how: ConnectionEnd::PeerFin,
    });
    net.pump();
    net.assert_completed(Side::B, notify, NdStatus::Success, "NotifyDisconnect");
    // Only a hand-off connector's client may say so.
    let other = net.connector(Side::A, S1);
    assert_eq!(
        net.status_of(
            Side::A,
            S1,
            CmRequest::ConnectionEnded {
                connector: other,
                how: ConnectionEnd::PeerFin,
            }
        ),
        NdStatus::ConnectionInvalid
    );
}

/// A client's report of its in-process queue pairs is kept per session, marked as the session's whatever
/// the report says, replaced by the next first part, and bounded by what the session holds in the daemon
/// (one per object plus a little slack): a client cannot make the daemon keep more than its objects allow.
#[test]
fn reported_queue_pairs_are_the_sessions_and_bounded_by_its_objects() {
    let mut net = Net::new();
    let qp = |id: u64| QueuePairStatus {
        id,
        session: 999,
        connector: None,
        state: crate::engine::verbs::QueuePairState::Idle,
        terminate: None,
        ird: 0,
        ord: 0,
        stats: Default::default(),
    };
    let report = |first: bool, ids: std::ops::Range<u64>| CmRequest::ReportDataPath {
        queue_pairs: ids.map(qp).collect(),
        memory_regions: 3,
        first,
    };
    let c = net.connector(Side::A, S1);
    net.ok_a(report(true, 0..1000));
    let status = |net: &mut Net| match net.ok_a(CmRequest::Status) {
        CmResponse::Status(s) => s,
        other => panic!("{other:?}"),
    };
    let s = status(&mut net);
    assert_eq!(
        s.queue_pairs.len(),
        1 + crate::engine::cm::REPORT_SLACK,
        "one object held: 1 + slack"
    );
    assert!(s.queue_pairs.iter().all(|q| q.session == S1.0));
    assert_eq!(s.memory_regions, 3);
    // A following part adds (within the bound); a first part replaces.
    net.ok_a(report(true, 0..2));
    net.ok_a(report(false, 2..4));
    assert_eq!(status(&mut net).queue_pairs.len(), 4);
    net.ok_a(CmRequest::CloseConnector { connector: c });
    net.a.close_session(net.now, S1);
    assert!(
        status(&mut net).queue_pairs.is_empty(),
        "dropped with the session"
    );
}
