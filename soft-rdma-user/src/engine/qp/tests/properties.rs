//! Properties: random operations between two queue pairs over a lossless stream, and chaos.

use super::*;

// ------------------------------------------------------------------------------------------------
// Properties.
// ------------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any mix of message sizes, segment sizes and budgets round-trips byte-exact.
    #[test]
    fn round_trip_byte_exact(
        ops in proptest::collection::vec((0u8..3, 0u32..3000, 1u32..4), 1..8),
        max_ulpdu in 46usize..400,
        crc in any::<bool>(),
        budget in 1usize..5000,
        ord in 1u32..4,
    ) {
        let mut pa = params(crc, max_ulpdu);
        pa.ord = ord;
        let mut p = Pair::new(pa, params(crc, max_ulpdu));
        p.budget = budget;
        let a_src = pattern(3000, 11);
        let b_src = pattern(3000, 22);
        let (_, asrc, _) = p.a.region(a_src.clone(), Access::ALL);
        let (a_sink, asink, _) = p.a.region(vec![0; 3000 * 8], Access::LOCAL_WRITE);
        let (_, bsrc, _) = p.b.region(b_src.clone(), Access::REMOTE_READ);
        let (b_sink, bsink, _) = p.b.region(vec![0; 3000 * 8], Access::ALL);
        let mut expect_a = vec![0u8; 3000 * 8];
        let mut expect_b = vec![0u8; 3000 * 8];
        let mut expected_a = Vec::new();
        let mut expected_b = Vec::new();
        for (i, &(kind, len, sges)) in ops.iter().enumerate() {
            let id = i as u64;
            let base = 3000 * i as u64;
            let at = base as usize;
            match kind {
                0 => {
                    p.b.post(WorkRequest::Receive { id, sgl: split_sgl(bsink, base, len, sges) });
                    p.a.post(WorkRequest::Send { id, sgl: split_sgl(asrc, 0, len, sges), solicited: false, invalidate: None, silent: false });
                    expect_b[at..at + len as usize].copy_from_slice(&a_src[..len as usize]);
                    expected_a.push(ok(id, CompletionOp::Send, len));
                    expected_b.push(ok(id, CompletionOp::Receive, len));
                }
                1 => {
                    p.a.post(WorkRequest::Write { id, sgl: split_sgl(asrc, 0, len, sges), remote: RemoteBuffer { stag: bsink, offset: base }, silent: false });
                    expect_b[at..at + len as usize].copy_from_slice(&a_src[..len as usize]);
                    expected_a.push(ok(id, CompletionOp::Write, len));
                }
                _ => {
                    p.a.post(read_wr(id, sge(asink, base, len), bsrc, 0));
                    expect_a[at..at + len as usize].copy_from_slice(&b_src[..len as usize]);
                    expected_a.push(ok(id, CompletionOp::Read, len));
                }
            }
        }
        p.pump();
        prop_assert_eq!(p.b.terminated, None);
        prop_assert_eq!(p.a.terminated, None);
        // Sends and Writes complete at transmit, Reads at their Response: compare as sets per op.
        let mut got_a = summary(&p.a.take());
        got_a.sort_by_key(|c| c.0);
        prop_assert_eq!(got_a, expected_a);
        prop_assert_eq!(summary(&p.b.take()), expected_b);
        prop_assert!(a_sink.bytes() == expect_a);
        prop_assert!(b_sink.bytes() == expect_b);
    }

    /// Arbitrary messages, including ones MessageRepr::parse would refuse, never panic, and after the
    /// first error everything is ignored.
    #[test]
    fn arbitrary_messages_never_panic(
        msgs in proptest::collection::vec(
            (0u8..8, any::<bool>(), any::<bool>(), any::<u8>(), any::<u64>(), 0u32..4, any::<u32>(), any::<u32>(),
             proptest::collection::vec(any::<u8>(), 0..80)),
            1..40),
    ) {
        let mut t = target_with_receive();
        let (rw, ro) = (t.rw, t.ro);
        t.side.post(read_wr(2, sge(rw, 0, 64), ro, 0));
        let mut buf = Vec::new();
        t.side.qp.poll_transmit(&t.side.mem, 100, &mut buf, &mut t.side.comps);
        let stags = [t.rw.0, t.ro.0, t.stale.0, t.foreign.0, t.other_pd.0];
        for (op, tag, last, pick, offset, queue, msn, raw_stag, mut payload) in msgs {
            let stag = if pick < 200 { stags[pick as usize % stags.len()] } else { raw_stag };
            let opcode = RdmapOpcode::from_u8(op).unwrap();
            if opcode == RdmapOpcode::RdmaReadRequest && pick % 2 == 0 {
                payload = rr_body(raw_stag, offset, u32::from(pick) * 3, stag, offset % 300).to_vec();
            }
            let placement = if tag {
                Placement::Tagged { stag, offset: if pick % 3 == 0 { offset } else { offset % 300 } }
            } else {
                Placement::Untagged { queue, msn: if pick % 3 == 0 { msn } else { msn % 4 }, offset: (offset % 100) as u32, ulp_field: stag }
            };
            let was_error = t.side.qp.state() == QpState::Error;
            let r = t.side.deliver(&MessageRepr { opcode, last, placement, payload: &payload });
            if was_error {
                prop_assert_eq!(r, Ok(()));
            }
            let mut buf = Vec::new();
            t.side.qp.poll_transmit(&t.side.mem, 200, &mut buf, &mut t.side.comps);
            frames(&buf, false, 1448);
        }
        t.side.qp.flush(NdStatus::Canceled, &mut t.side.comps);
        // Exactly one completion each for the Receive (1) and the Read (2).
        let mut ids: Vec<u64> = t.side.comps.iter().map(|(_, c)| c.wr_id).collect();
        ids.sort_unstable();
        prop_assert_eq!(ids, vec![1, 2]);
    }

    /// Every posted work request completes exactly once, whatever happens: posting (valid or not),
    /// partial transmission, partial delivery, protocol errors, Terminates, flushes.
    #[test]
    fn every_work_request_completes_exactly_once(ops in proptest::collection::vec(arb_op(), 1..150)) {
        let mut h = Chaos::new();
        for op in ops {
            h.apply(op);
        }
        prop_assert!(h.reconnects < 150);
        h.a.qp.flush(NdStatus::Canceled, &mut h.a.comps);
        h.b.qp.flush(NdStatus::Canceled, &mut h.b.comps);
        for (side, posted) in [(&h.a, &h.posted_a), (&h.b, &h.posted_b)] {
            let mut count: HashMap<u64, u32> = HashMap::new();
            for (cq, c) in &side.comps {
                prop_assert_eq!(*cq == RECV_CQ, c.op == CompletionOp::Receive);
                *count.entry(c.wr_id).or_default() += 1;
            }
            for id in posted {
                prop_assert_eq!(count.remove(id), Some(1), "wr {} of session {}", id, side.session.0);
            }
            prop_assert!(count.is_empty(), "completions for unknown requests: {:?}", count);
            prop_assert_eq!(side.qp.stats().sq_outstanding + side.qp.stats().rq_posted, 0);
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Send { a: bool, len: u16, sges: u8 },
    Write { a: bool, len: u16, bad: bool },
    Read { a: bool, len: u16, bad: bool },
    Recv { a: bool, len: u16 },
    Transmit { a: bool, budget: u16 },
    Deliver { a: bool, frames: u8 },
    Terminate { a: bool },
    Flush { a: bool },
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (any::<bool>(), 0u16..600, 0u8..6).prop_map(|(a, len, sges)| Op::Send { a, len, sges }),
        2 => (any::<bool>(), 0u16..600, proptest::bool::weighted(0.05))
            .prop_map(|(a, len, bad)| Op::Write { a, len, bad }),
        3 => (any::<bool>(), 0u16..600, proptest::bool::weighted(0.05))
            .prop_map(|(a, len, bad)| Op::Read { a, len, bad }),
        3 => (any::<bool>(), 0u16..700).prop_map(|(a, len)| Op::Recv { a, len }),
        6 => (any::<bool>(), 1u16..2000).prop_map(|(a, budget)| Op::Transmit { a, budget }),
        6 => (any::<bool>(), 1u8..20).prop_map(|(a, frames)| Op::Deliver { a, frames }),
        1 => any::<bool>().prop_map(|a| Op::Terminate { a }),
        1 => any::<bool>().prop_map(|a| Op::Flush { a }),
    ]
}

/// Two queue pairs with decoupled transmission and delivery (bytes wait in a pipe).
struct Chaos {
    a: Side,
    b: Side,
    stags: [Stag; 2],
    /// Bytes from A (0) and from B (1) not yet delivered.
    pipes: [Vec<u8>; 2],
    closed: bool,
    reconnects: u32,
    next_id: u64,
    posted_a: Vec<u64>,
    posted_b: Vec<u64>,
}

impl Chaos {
    fn new() -> Chaos {
        let mut cfg = config();
        cfg.send_depth = 8;
        cfg.receive_depth = 6;
        let mut a = Side::new(S1, cfg);
        let mut b = Side::new(S2, cfg);
        let mut pa = params(true, 100);
        pa.ord = 2;
        pa.ird = 3;
        a.qp.connect(pa);
        b.qp.connect(pa);
        let (_, sa, _) = a.region(pattern(4096, 1), Access::ALL);
        let (_, sb, _) = b.region(pattern(4096, 2), Access::ALL);
        Chaos {
            a,
            b,
            stags: [sa, sb],
            pipes: [Vec::new(), Vec::new()],
            closed: false,
            reconnects: 0,
            next_id: 1,
            posted_a: Vec::new(),
            posted_b: Vec::new(),
        }
    }

    fn close(&mut self) {
        self.closed = true;
        self.pipes = [Vec::new(), Vec::new()];
    }

    /// A new connection with fresh queue pairs; the old ones are destroyed (flushed).
    fn reconnect(&mut self) {
        for side in [&mut self.a, &mut self.b] {
            side.qp.flush(NdStatus::Canceled, &mut side.comps);
            let (id, session, config, params) =
                (side.qp.id(), side.session, *side.qp.config(), side.qp.params);
            side.qp = QueuePair::new(id, session, config);
            side.qp.connect(params);
        }
        self.closed = false;
        self.reconnects += 1;
    }

    fn apply(&mut self, op: Op) {
        if self.closed {
            self.reconnect();
        }
        let id = self.next_id;
        self.next_id += 1;
        let (own, peer) = if op_side(&op) {
            (self.stags[0], self.stags[1])
        } else {
            (self.stags[1], self.stags[0])
        };
        let wr = match op {
            Op::Send { len, sges, .. } => Some(WorkRequest::Send {
                id,
                sgl: split_sgl(own, 0, u32::from(len), u32::from(sges)),
                solicited: len % 2 == 0,
                invalidate: None,
                silent: false,
            }),
            Op::Write { len, bad, .. } => Some(WorkRequest::Write {
                id,
                sgl: split_sgl(own, 0, u32::from(len), 2),
                remote: RemoteBuffer {
                    stag: if bad { Stag(peer.0 ^ 1) } else { peer },
                    offset: 100,
                },
                silent: false,
            }),
            Op::Read { len, bad, .. } => Some(read_wr(
                id,
                sge(own, 2000, u32::from(len)),
                if bad { Stag(peer.0 ^ 1) } else { peer },
                3000,
            )),
            Op::Recv { len, .. } => Some(WorkRequest::Receive {
                id,
                sgl: split_sgl(own, 1000, u32::from(len), 2),
            }),
            _ => None,
        };
        let a = op_side(&op);
        if let Some(wr) = wr {
            let (side, posted) = if a {
                (&mut self.a, &mut self.posted_a)
            } else {
                (&mut self.b, &mut self.posted_b)
            };
            posted.push(id);
            side.post(wr);
            return;
        }
        match op {
            Op::Transmit { budget, .. } => {
                let (side, pipe) = if a {
                    (&mut self.a, &mut self.pipes[0])
                } else {
                    (&mut self.b, &mut self.pipes[1])
                };
                let mut buf = Vec::new();
                side.qp
                    .poll_transmit(&side.mem, usize::from(budget), &mut buf, &mut side.comps);
                if !self.closed {
                    pipe.extend_from_slice(&buf);
                }
            }
            Op::Deliver { frames: n, .. } => {
                let from = usize::from(!a);
                let bytes = std::mem::take(&mut self.pipes[from]);
                let mut at = 0;
                let mut delivered = 0;
                let (src, dst) = if a {
                    (&mut self.a, &mut self.b)
                } else {
                    (&mut self.b, &mut self.a)
                };
                let mut failed = None;
                while delivered < n {
                    let Ok(Some(len)) = FpduRepr::frame_len(&bytes[at..], 100) else {
                        break;
                    };
                    let frame = &bytes[at..at + len];
                    fpdu::verify_crc(frame).unwrap();
                    let m = MessageRepr::parse(FpduRepr::parse(frame, 100).unwrap().ulpdu).unwrap();
                    at += len;
                    delivered += 1;
                    if let Err(c) = dst.deliver(&m) {
                        failed = Some(c);
                        break;
                    }
                }
                if let Some(c) = failed {
                    let info = TerminateInfo::new(c, true);
                    src.qp.on_terminate(info, &mut src.comps);
                    self.close();
                } else {
                    self.pipes[from] = bytes[at..].to_vec();
                }
            }
            Op::Terminate { .. } => {
                let info = stream_lost(false);
                self.a.qp.on_terminate(info, &mut self.a.comps);
                self.b.qp.on_terminate(
                    TerminateInfo {
                        from_peer: true,
                        ..info
                    },
                    &mut self.b.comps,
                );
                self.close();
            }
            Op::Flush { .. } => {
                let side = if a { &mut self.a } else { &mut self.b };
                side.qp.flush(NdStatus::Canceled, &mut side.comps);
                self.close();
            }
            _ => {}
        }
    }
}

fn op_side(op: &Op) -> bool {
    match *op {
        Op::Send { a, .. }
        | Op::Write { a, .. }
        | Op::Read { a, .. }
        | Op::Recv { a, .. }
        | Op::Transmit { a, .. }
        | Op::Deliver { a, .. }
        | Op::Terminate { a }
        | Op::Flush { a } => a,
    }
}
