//! Unit and property tests of the queue pair.

use super::*;
use crate::engine::memory::{RegionMemory, VecMemory};
use crate::engine::verbs::{MemoryRegionId, RemoteBuffer};
use proptest::prelude::*;
use soft_rdma_common::wire::fpdu::{self, FpduRepr};
use soft_rdma_common::wire::terminate::llp_code;
use std::collections::HashMap;

const S1: SessionId = SessionId(1);
const S2: SessionId = SessionId(2);
const S3: SessionId = SessionId(3);
const SEND_CQ: CompletionQueueId = CompletionQueueId(10);
const RECV_CQ: CompletionQueueId = CompletionQueueId(11);

fn config() -> QueuePairConfig {
    QueuePairConfig {
        send_cq: SEND_CQ,
        receive_cq: RECV_CQ,
        send_depth: 64,
        receive_depth: 64,
        max_send_sge: 4,
        max_receive_sge: 4,
    }
}

fn params(crc: bool, max_ulpdu: usize) -> QpParams {
    QpParams {
        crc,
        max_ulpdu,
        ird: 8,
        ord: 8,
    }
}

fn cause(layer: u8, error_type: u8, code: u8) -> TerminateCause {
    TerminateCause::new(layer, error_type, code)
}

/// The LLP's "TCP stream lost" Terminate info (RFC 5044 §8), sent or (`from_peer`) received.
fn stream_lost(from_peer: bool) -> TerminateInfo {
    TerminateInfo::new(cause(layer::LLP, 0, llp_code::TCP_STREAM_LOST), from_peer)
}

/// RFC 5041 §7.2: a DDP untagged buffer error.
fn untagged_cause(code: u8) -> TerminateCause {
    cause(layer::DDP, ddp_type::UNTAGGED_BUFFER, code)
}

/// RFC 5041 §7.2: a DDP tagged buffer error.
fn tagged_cause(code: u8) -> TerminateCause {
    cause(layer::DDP, ddp_type::TAGGED_BUFFER, code)
}

/// RFC 5040 §7.2: an RDMAP remote operation error.
fn remote_operation_cause(code: u8) -> TerminateCause {
    cause(layer::RDMAP, rdmap_type::REMOTE_OPERATION, code)
}

/// Deterministic test bytes.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_left(7) as u8 ^ seed)
        .collect()
}

/// One parsed FPDU, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Wire {
    opcode: RdmapOpcode,
    last: bool,
    placement: Placement,
    payload: Vec<u8>,
}

impl Wire {
    fn msg(&self) -> MessageRepr<'_> {
        MessageRepr {
            opcode: self.opcode,
            last: self.last,
            placement: self.placement,
            payload: &self.payload,
        }
    }
}

/// Parses `bytes` as whole FPDUs (a partial one fails the test: FPDUs are never split), checking length,
/// pad, CRC (or the zero CRC field) and the RDMAP message.
fn frames(bytes: &[u8], crc: bool, max_ulpdu: usize) -> Vec<Wire> {
    let mut at = 0;
    let mut v = Vec::new();
    while at < bytes.len() {
        let rest = &bytes[at..];
        let len = FpduRepr::frame_len(rest, max_ulpdu).unwrap().unwrap();
        assert!(len <= rest.len(), "an FPDU was split across poll_transmit calls");
        let frame = &rest[..len];
        if crc {
            fpdu::verify_crc(frame).unwrap();
        } else {
            assert_eq!(&frame[len - 4..], &[0; 4], "CRC field is zero without CRC");
        }
        let f = FpduRepr::parse(frame, max_ulpdu).unwrap();
        let m = MessageRepr::parse(f.ulpdu).unwrap();
        v.push(Wire {
            opcode: m.opcode,
            last: m.last,
            placement: m.placement,
            payload: m.payload.to_vec(),
        });
        at += len;
    }
    v
}

struct Side {
    qp: QueuePair,
    mem: MemoryRegistry,
    session: SessionId,
    comps: Vec<(CompletionQueueId, Completion)>,
    /// This side's `on_message` returned this cause.
    terminated: Option<TerminateCause>,
}

impl Side {
    fn new(session: SessionId, config: QueuePairConfig) -> Side {
        Side {
            qp: QueuePair::new(QueuePairId(session.0), session, config),
            mem: MemoryRegistry::new(session.0 * 77),
            session,
            comps: Vec::new(),
            terminated: None,
        }
    }

    fn region(&mut self, bytes: Vec<u8>, access: Access) -> (VecMemory, Stag, MemoryRegionId) {
        let m = VecMemory::from(bytes);
        let (id, stag) = self
            .mem
            .register(self.session, Box::new(m.clone()), access)
            .unwrap();
        (m, stag, id)
    }

    fn post(&mut self, wr: WorkRequest) {
        self.qp.post(wr, &self.mem, &mut self.comps);
    }

    fn deliver(&mut self, msg: &MessageRepr<'_>) -> Result<(), TerminateCause> {
        let r = self.qp.on_message(msg, &mut self.mem, &mut self.comps);
        if let Err(c) = r {
            self.terminated = Some(c);
        }
        r
    }

    fn take(&mut self) -> Vec<(CompletionQueueId, Completion)> {
        std::mem::take(&mut self.comps)
    }

    /// One `poll_transmit` with `budget`: (what it answered, the bytes it wrote).
    fn transmit(&mut self, budget: usize) -> (usize, Vec<u8>) {
        let mut buf = Vec::new();
        let n = self
            .qp
            .poll_transmit(&self.mem, budget, &mut buf, &mut self.comps);
        (n, buf)
    }

    /// The posted request `wr_id` fails when the queue pair tries to transmit it: nothing goes out, and
    /// its only completion is `op` with `status`.
    fn assert_fails_at_transmit(&mut self, wr_id: u64, op: CompletionOp, status: NdStatus) {
        assert_eq!(self.transmit(100).0, 0);
        assert_eq!(summary(&self.take()), vec![(wr_id, op, status, 0)]);
    }
}

/// Splits `len` bytes at `offset` of a region into `n` SGEs of uneven sizes.
fn split_sgl(stag: Stag, offset: u64, len: u32, n: u32) -> Vec<Sge> {
    let mut v = Vec::new();
    let mut at = 0u32;
    for i in 0..n {
        let l = if i + 1 == n {
            len - at
        } else {
            (len / n).saturating_sub(i)
        };
        v.push(Sge {
            stag,
            offset: offset + u64::from(at),
            length: l,
        });
        at += l;
    }
    v
}

/// What identifies the message a segment belongs to, and where its next segment must start.
type Open = Option<(bool, u32, u64)>;

/// Two queue pairs connected back to back in memory.
struct Pair {
    a: Side,
    b: Side,
    budget: usize,
    /// Every FPDU in delivery order: (from A, message).
    log: Vec<(bool, Wire)>,
    closed: bool,
    open: [Open; 2],
}

impl Pair {
    fn new(pa: QpParams, pb: QpParams) -> Pair {
        let mut a = Side::new(S1, config());
        let mut b = Side::new(S2, config());
        a.qp.connect(pa);
        b.qp.connect(pb);
        Pair {
            a,
            b,
            budget: 4096,
            log: Vec::new(),
            closed: false,
            open: [None, None],
        }
    }

    fn pump(&mut self) {
        let mut rounds = 0;
        while self.step(true) | self.step(false) {
            rounds += 1;
            assert!(rounds < 2_000_000, "no quiescence");
        }
    }

    /// One `poll_transmit` of one side, delivered to the other. False when it had nothing to send.
    fn step(&mut self, from_a: bool) -> bool {
        if self.closed {
            return false;
        }
        let Pair {
            a,
            b,
            budget,
            log,
            closed,
            open,
        } = self;
        let (from, to) = if from_a { (a, b) } else { (b, a) };
        if !from.qp.wants_transmit() {
            return false;
        }
        let mut buf = Vec::new();
        let n = from
            .qp
            .poll_transmit(&from.mem, *budget, &mut buf, &mut from.comps);
        assert_eq!(n, buf.len());
        assert!(
            n >= *budget || !from.qp.wants_transmit(),
            "stopped before the budget with work left"
        );
        let max = from.qp.params.max_ulpdu;
        let crc = from.qp.params.crc;
        for w in frames(&buf, crc, max) {
            // Segments of different messages never interleave (siw_activate_tx, RFC 5041 §5.2).
            let slot = &mut open[usize::from(!from_a)];
            let (key, pos) = match w.placement {
                Placement::Tagged { stag, offset } => ((true, stag), offset),
                Placement::Untagged {
                    queue, msn, offset, ..
                } => ((false, queue << 24 ^ msn), u64::from(offset)),
            };
            if let Some((t, k, next)) = *slot {
                assert_eq!(
                    (t, k, next),
                    (key.0, key.1, pos),
                    "segments of two messages interleaved"
                );
            }
            *slot = (!w.last).then(|| (key.0, key.1, pos + w.payload.len() as u64));
            log.push((from_a, w.clone()));
            if let Err(c) = to.deliver(&w.msg()) {
                let info = TerminateInfo::new(c, true);
                from.qp.on_terminate(info, &mut from.comps);
                *closed = true;
                break;
            }
        }
        true
    }
}

/// One SGE: `length` bytes at `offset` of `stag`.
fn sge(stag: Stag, offset: u64, length: u32) -> Sge {
    Sge { stag, offset, length }
}

/// A plain Send (not solicited, no invalidate) of `length` bytes from offset 0 of `stag`.
fn send_wr(id: u64, stag: Stag, length: u32) -> WorkRequest {
    WorkRequest::Send {
        id,
        sgl: vec![Sge {
            stag,
            offset: 0,
            length,
        }],
        solicited: false,
        invalidate: None,
    }
}

/// A Read of `remote_stag` at `remote_offset` into `sink`.
fn read_wr(id: u64, sink: Sge, remote_stag: Stag, remote_offset: u64) -> WorkRequest {
    WorkRequest::Read {
        id,
        sink,
        remote: RemoteBuffer {
            stag: remote_stag,
            offset: remote_offset,
        },
    }
}

/// A Receive of up to `length` bytes at offset 0 of `stag`.
fn receive_wr(id: u64, stag: Stag, length: u32) -> WorkRequest {
    WorkRequest::Receive {
        id,
        sgl: vec![Sge {
            stag,
            offset: 0,
            length,
        }],
    }
}

fn ok(wr_id: u64, op: CompletionOp, bytes: u32) -> (u64, CompletionOp, NdStatus, u32) {
    (wr_id, op, NdStatus::Success, bytes)
}

fn summary(c: &[(CompletionQueueId, Completion)]) -> Vec<(u64, CompletionOp, NdStatus, u32)> {
    c.iter()
        .map(|(_, c)| (c.wr_id, c.op, c.status, c.bytes))
        .collect()
}

// ------------------------------------------------------------------------------------------------
// Round trips.
// ------------------------------------------------------------------------------------------------

#[test]
fn send_receive_sizes_crc_and_segmentation() {
    let sizes = [0usize, 1, 63, 64, 65, 1000, 100_000];
    for crc in [false, true] {
        for max_ulpdu in [64, 1448] {
            let mut p = Pair::new(params(crc, max_ulpdu), params(crc, max_ulpdu));
            let src = pattern(100_000, 3);
            let (_, sstag, _) = p.a.region(src.clone(), Access(0));
            let (sink, rstag, _) = p.b.region(vec![0; 200_000], Access::LOCAL_WRITE);
            for (i, &size) in sizes.iter().enumerate() {
                let size32 = size as u32;
                // Receive: 3 SGEs with 7 spare bytes, at a different split than the Send.
                let rsgl = split_sgl(rstag, 1000, size32 + 7, 3);
                p.b.post(WorkRequest::Receive {
                    id: 100 + i as u64,
                    sgl: rsgl,
                });
                p.a.post(WorkRequest::Send {
                    id: i as u64,
                    sgl: split_sgl(sstag, 0, size32, 3),
                    solicited: i % 2 == 1,
                    invalidate: None,
                });
                p.pump();
                assert_eq!(
                    summary(&p.a.take()),
                    vec![ok(i as u64, CompletionOp::Send, size32)]
                );
                let got = p.b.take();
                assert_eq!(
                    summary(&got),
                    vec![ok(100 + i as u64, CompletionOp::Receive, size32)]
                );
                assert_eq!(got[0].0, RECV_CQ);
                assert_eq!(got[0].1.solicited, i % 2 == 1);
                assert_eq!(got[0].1.invalidated, None);
                assert_eq!(&sink.bytes()[1000..1000 + size], &src[..size], "size {size}");
            }
            // RFC 5041 §4.4: MSN 1, 2, ... per message on queue 0, MO = position, L on the last only.
            let mut expect_msn = 1;
            let mut mo = 0u64;
            for (_, w) in p.log.iter().filter(|(from_a, _)| *from_a) {
                let Placement::Untagged {
                    queue, msn, offset, ..
                } = w.placement
                else {
                    panic!("Sends are untagged")
                };
                assert_eq!((queue, msn, u64::from(offset)), (QN_SEND, expect_msn, mo));
                assert!(UNTAGGED_HEADER_LEN + w.payload.len() <= max_ulpdu);
                mo += w.payload.len() as u64;
                if w.last {
                    expect_msn += 1;
                    mo = 0;
                }
            }
            assert_eq!(expect_msn, 1 + sizes.len() as u32);
            let s = p.a.qp.stats();
            assert_eq!(s.messages_sent, sizes.len() as u64);
            assert_eq!(s.bytes_sent, sizes.iter().sum::<usize>() as u64);
            assert_eq!(p.b.qp.stats().bytes_received, s.bytes_sent);
        }
    }
}

#[test]
fn write_places_data_without_target_completion() {
    for max_ulpdu in [64, 1448] {
        let mut p = Pair::new(params(true, max_ulpdu), params(true, max_ulpdu));
        let src = pattern(5000, 9);
        let (_, sstag, _) = p.a.region(src.clone(), Access(0));
        let (sink, tstag, _) = p.b.region(vec![0; 6000], Access::REMOTE_WRITE);
        p.a.post(WorkRequest::Write {
            id: 7,
            sgl: split_sgl(sstag, 10, 4000, 3),
            remote: RemoteBuffer {
                stag: tstag,
                offset: 100,
            },
        });
        p.pump();
        assert_eq!(summary(&p.a.take()), vec![ok(7, CompletionOp::Write, 4000)]);
        assert!(
            p.b.take().is_empty(),
            "an RDMA Write completes nothing at the target"
        );
        let got = sink.bytes();
        assert_eq!(&got[100..4100], &src[10..4010]);
        assert!(got[..100].iter().chain(&got[4100..]).all(|&b| b == 0));
        // Tagged segments: the sink STag, TO = 100 + position (RFC 5041 §4.3).
        let mut to = 100;
        for (_, w) in &p.log {
            assert_eq!(
                w.placement,
                Placement::Tagged {
                    stag: tstag.0,
                    offset: to
                }
            );
            to += w.payload.len() as u64;
        }
        assert_eq!(to, 4100);
    }
}

#[test]
fn read_across_many_segments_and_zero_length() {
    let mut p = Pair::new(params(false, 64), params(false, 64));
    let src = pattern(10_000, 5);
    let (_, rstag, _) = p.b.region(src.clone(), Access::REMOTE_READ);
    let (sink, lstag, _) = p.a.region(vec![0; 10_000], Access::LOCAL_WRITE);
    p.a.post(read_wr(1, sge(lstag, 500, 9000), rstag, 1000));
    p.a.post(read_wr(2, sge(Stag(0), 0, 0), Stag(0x1234_5678), 0));
    p.pump();
    assert_eq!(
        summary(&p.a.take()),
        vec![ok(1, CompletionOp::Read, 9000), ok(2, CompletionOp::Read, 0)]
    );
    assert!(p.b.take().is_empty());
    assert_eq!(&sink.bytes()[500..9500], &src[1000..10_000]);
    let responses: Vec<_> = p.log.iter().filter(|(a, _)| !a).map(|(_, w)| w).collect();
    assert!(responses.len() > 100, "9000 bytes in 50-byte segments");
    assert!(
        responses
            .iter()
            .all(|w| w.opcode == RdmapOpcode::RdmaReadResponse)
    );
    // The zero-length Read: one empty last segment to the requester's sink.
    let last = responses.last().unwrap();
    assert_eq!((last.last, last.payload.len()), (true, 0));
    // Read Requests: queue 1, MSN 1 and 2 (RFC 5040 §5.2).
    let msns: Vec<u32> = p
        .log
        .iter()
        .filter(|(a, _)| *a)
        .map(|(_, w)| match w.placement {
            Placement::Untagged {
                queue: QN_READ_REQUEST,
                msn,
                ..
            } => msn,
            p => panic!("{p:?}"),
        })
        .collect();
    assert_eq!(msns, vec![1, 2]);
    assert_eq!(p.a.qp.stats().orq_outstanding, 0);
}

#[test]
fn ord_limits_reads_in_flight() {
    let mut pa = params(false, 1448);
    pa.ord = 2;
    let mut p = Pair::new(pa, params(false, 1448));
    p.budget = 1 << 20;
    let (_, rstag, _) = p.b.region(pattern(50_000, 1), Access::REMOTE_READ);
    let (sink, lstag, _) = p.a.region(vec![0; 50_000], Access::LOCAL_WRITE);
    for i in 0..5u64 {
        p.a.post(read_wr(i, sge(lstag, i * 10_000, 10_000), rstag, i * 10_000));
    }
    // Before the peer answers: exactly two Requests went out.
    let mut buf = Vec::new();
    p.a.qp.poll_transmit(&p.a.mem, 1 << 20, &mut buf, &mut p.a.comps);
    assert_eq!(frames(&buf, false, 1448).len(), 2);
    assert!(
        !p.a.qp.wants_transmit(),
        "the SQ head waits while the ORQ is full"
    );
    assert_eq!(p.a.qp.stats().orq_outstanding, 2);
    assert_eq!(p.a.qp.stats().sq_outstanding, 5);
    for w in frames(&buf, false, 1448) {
        p.log.push((true, w.clone()));
        p.b.deliver(&w.msg()).unwrap();
    }
    p.pump();
    let mut in_flight = 0i32;
    let mut max = 0;
    for (from_a, w) in &p.log {
        match (from_a, w.opcode, w.last) {
            (true, RdmapOpcode::RdmaReadRequest, _) => in_flight += 1,
            (false, RdmapOpcode::RdmaReadResponse, true) => in_flight -= 1,
            _ => {}
        }
        max = max.max(in_flight);
    }
    assert_eq!((max, in_flight), (2, 0));
    assert_eq!(
        summary(&p.a.take()),
        (0..5)
            .map(|i| ok(i, CompletionOp::Read, 10_000))
            .collect::<Vec<_>>()
    );
    assert_eq!(sink.bytes(), pattern(50_000, 1));
}

#[test]
fn ird_overrun_terminates_catastrophically() {
    // Engine to engine: A (ORD 8) sends three Requests before B (IRD 2) answers any.
    let mut pb = params(false, 1448);
    pb.ird = 2;
    let mut p = Pair::new(params(false, 1448), pb);
    let (_, rstag, _) = p.b.region(vec![1; 300], Access::REMOTE_READ);
    let (_, lstag, _) = p.a.region(vec![0; 300], Access::LOCAL_WRITE);
    for i in 0..3u64 {
        p.a.post(read_wr(i, sge(lstag, i * 100, 100), rstag, i * 100));
    }
    assert!(p.step(true));
    let irq_exceeded = remote_operation_cause(rdmap_code::CATASTROPHIC_STREAM);
    assert_eq!(p.b.terminated, Some(irq_exceeded));
    assert_eq!(p.b.qp.state(), QpState::Error);
    let mine = p.b.qp.terminate_info().unwrap();
    assert_eq!(
        (mine.code, mine.from_peer),
        (rdmap_code::CATASTROPHIC_STREAM, false)
    );
    assert!(p.a.qp.terminate_info().unwrap().from_peer);
    // The requester's Reads will never be answered.
    assert_eq!(
        summary(&p.a.take()),
        (0..3)
            .map(|i| (i, CompletionOp::Read, NdStatus::RemoteError, 0))
            .collect::<Vec<_>>()
    );

    // Crafted: the third Request to a side with IRD 2.
    let mut b = Side::new(S2, config());
    b.qp.connect(pb);
    let (_, stag, _) = b.region(vec![0; 64], Access::REMOTE_READ);
    for msn in 1..=3u32 {
        let body = rr_body(0x100, 0, 8, stag.0, 0);
        let r = b.deliver(&read_request(msn, true, &body));
        assert_eq!(r.is_err(), msn == 3);
    }
    assert_eq!(b.terminated, Some(irq_exceeded));
}

// ------------------------------------------------------------------------------------------------
// Crafted inbound messages.
// ------------------------------------------------------------------------------------------------

fn untagged(
    opcode: RdmapOpcode,
    queue: u32,
    msn: u32,
    offset: u32,
    ulp_field: u32,
    last: bool,
    payload: &[u8],
) -> MessageRepr<'_> {
    MessageRepr {
        opcode,
        last,
        placement: Placement::Untagged {
            queue,
            msn,
            offset,
            ulp_field,
        },
        payload,
    }
}

/// A Send segment on the Send queue: message `msn`, at message offset `offset`.
fn send_segment(msn: u32, offset: u32, last: bool, payload: &[u8]) -> MessageRepr<'_> {
    untagged(RdmapOpcode::Send, QN_SEND, msn, offset, 0, last, payload)
}

/// A Read Request on the Read Request queue: message `msn`, offset 0, `body` its 28-byte header.
fn read_request(msn: u32, last: bool, body: &[u8]) -> MessageRepr<'_> {
    untagged(
        RdmapOpcode::RdmaReadRequest,
        QN_READ_REQUEST,
        msn,
        0,
        0,
        last,
        body,
    )
}

fn tagged(opcode: RdmapOpcode, stag: u32, offset: u64, last: bool, payload: &[u8]) -> MessageRepr<'_> {
    MessageRepr {
        opcode,
        last,
        placement: Placement::Tagged { stag, offset },
        payload,
    }
}

fn rr_body(
    sink_stag: u32,
    sink_offset: u64,
    read_size: u32,
    source_stag: u32,
    source_offset: u64,
) -> [u8; 28] {
    let mut b = [0u8; 28];
    ReadRequestRepr {
        sink_stag,
        sink_offset,
        read_size,
        source_stag,
        source_offset,
    }
    .emit(&mut b)
    .unwrap();
    b
}

/// A connected target (session 2) with: `rw` (all rights, 256 bytes), `ro` (no remote rights),
/// `stale` (an STag whose region was deregistered and its slot reused), and `foreign` (a region of
/// session 3 in the same registry).
struct Target {
    side: Side,
    rw: Stag,
    ro: Stag,
    stale: Stag,
    foreign: Stag,
}

fn target() -> Target {
    let mut side = Side::new(S2, config());
    side.qp.connect(params(false, 1448));
    let (_, rw, _) = side.region(vec![0; 256], Access::ALL);
    let (_, ro, _) = side.region(vec![0; 256], Access::LOCAL_WRITE);
    let (_, stale, id) = side.region(vec![0; 256], Access::ALL);
    side.mem.deregister(S2, id).unwrap();
    let (_, fresh, _) = side.region(vec![0; 256], Access::ALL);
    assert_eq!((fresh.index(), fresh == stale), (stale.index(), false));
    let (_, foreign) = side
        .mem
        .register(S3, Box::new(VecMemory::new(256)), Access::ALL)
        .unwrap();
    Target {
        side,
        rw,
        ro,
        stale,
        foreign,
    }
}

#[test]
fn write_protection_errors_as_siw_tagged_error() {
    let t = target();
    let ddp = |code| Some(tagged_cause(code));
    let cases = [
        (Stag(t.rw.0 ^ 0x55), 0, ddp(ddp_code::TAGGED_INVALID_STAG)),
        (t.stale, 0, ddp(ddp_code::TAGGED_INVALID_STAG)),
        (t.rw, 250, ddp(ddp_code::TAGGED_BASE_OR_BOUNDS)),
        (t.rw, u64::MAX - 2, ddp(ddp_code::TAGGED_BASE_OR_BOUNDS)),
        // siw_tagged_error: RFC 5041 has no access-rights code; invalid STag.
        (t.ro, 0, ddp(ddp_code::TAGGED_INVALID_STAG)),
        (t.foreign, 0, ddp(ddp_code::TAGGED_STAG_NOT_ASSOCIATED)),
        (t.rw, 248, None),
    ];
    for (stag, to, expect) in cases {
        let mut t = target();
        let r = t
            .side
            .deliver(&tagged(RdmapOpcode::RdmaWrite, stag.0, to, true, &[7; 8]));
        assert_eq!(r.err(), expect, "stag {stag:?} to {to}");
        assert_eq!(t.side.qp.state() == QpState::Error, expect.is_some());
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
        (t.rw, 0, 256, None),
        // Zero-length: not checked (siw; the RFC 6581 Read RTR).
        (Stag(0), 0, 0, None),
    ];
    for (stag, to, size, expect) in cases {
        let mut t = target();
        let body = rr_body(0x99, 0, size, stag.0, to);
        let r = t.side.deliver(&read_request(1, true, &body));
        assert_eq!(r.err(), expect, "stag {stag:?} to {to} size {size}");
    }
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

fn target_with_receive() -> Target {
    let mut t = target();
    let rw = t.rw;
    t.side.post(receive_wr(1, rw, 64));
    t
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
        .register(S3, Box::new(VecMemory::new(64)), Access::ALL)
        .unwrap();
    let sge = |stag, offset, length| Sge { stag, offset, length };
    let send = |id, sgl| WorkRequest::Send {
        id,
        sgl,
        solicited: false,
        invalidate: None,
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
    // Local protection: another session's region, out of bounds, no LOCAL_WRITE where data is scattered.
    a.post(send(3, vec![sge(foreign, 0, 1)]));
    a.post(send(4, vec![sge(all, 60, 5)]));
    a.post(WorkRequest::Receive {
        id: 5,
        sgl: vec![sge(nolw, 0, 8)],
    });
    a.post(WorkRequest::Read {
        id: 6,
        sink: sge(nolw, 0, 8),
        remote,
    });
    // Zero-length Read and gathering from a region without LOCAL_WRITE are fine.
    a.post(WorkRequest::Read {
        id: 7,
        sink: sge(Stag(0), 0, 0),
        remote,
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
    });
    assert_eq!(
        summary(&a.take()),
        vec![
            (1, CompletionOp::Send, NdStatus::InvalidParameter, 0),
            (2, CompletionOp::Receive, NdStatus::InvalidParameter, 0),
            (3, CompletionOp::Send, NdStatus::AccessViolation, 0),
            (4, CompletionOp::Send, NdStatus::AccessViolation, 0),
            (5, CompletionOp::Receive, NdStatus::AccessViolation, 0),
            (6, CompletionOp::Read, NdStatus::AccessViolation, 0),
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
    let (_, huge) = a.mem.register(S1, Box::new(Huge), Access::ALL).unwrap();
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
    });
    a.post(WorkRequest::Send {
        id: 2,
        sgl: vec![sge(0, 1 << 31)],
        solicited: false,
        invalidate: None,
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
    p.a.post(WorkRequest::Read { id: 1, sink, remote });
    p.a.post(send_wr(2, s, 500));
    p.a.post(WorkRequest::Read { id: 3, sink, remote });
    p.a.post(WorkRequest::Write {
        id: 4,
        sgl: vec![],
        remote,
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
fn deregistered_gather_list_is_an_access_violation() {
    let mut a = Side::new(S1, config());
    a.qp.connect(params(false, 1448));
    let (_, s, id) = a.region(vec![0; 8], Access(0));
    a.post(send_wr(1, s, 8));
    a.mem.deregister(S1, id).unwrap();
    a.assert_fails_at_transmit(1, CompletionOp::Send, NdStatus::AccessViolation);
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
    p.b.qp.rtr_received(&rtr, &mut p.b.mem, &mut p.b.comps).unwrap();
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
        .rtr_received(&rtr, &mut t.side.mem, &mut t.side.comps)
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
    });
    let mut buf = Vec::new();
    a.qp.poll_transmit(&a.mem, 1, &mut buf, &mut a.comps);
    assert!(matches!(
        frames(&buf, false, 1448)[0].placement,
        Placement::Untagged { msn: 2, .. }
    ));
}

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
                    p.a.post(WorkRequest::Send { id, sgl: split_sgl(asrc, 0, len, sges), solicited: false, invalidate: None });
                    expect_b[at..at + len as usize].copy_from_slice(&a_src[..len as usize]);
                    expected_a.push(ok(id, CompletionOp::Send, len));
                    expected_b.push(ok(id, CompletionOp::Receive, len));
                }
                1 => {
                    p.a.post(WorkRequest::Write { id, sgl: split_sgl(asrc, 0, len, sges), remote: RemoteBuffer { stag: bsink, offset: base } });
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
        let stags = [t.rw.0, t.ro.0, t.stale.0, t.foreign.0];
        for (op, tag, last, pick, offset, queue, msn, raw_stag, mut payload) in msgs {
            let stag = if pick < 200 { stags[pick as usize % 4] } else { raw_stag };
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
            }),
            Op::Write { len, bad, .. } => Some(WorkRequest::Write {
                id,
                sgl: split_sgl(own, 0, u32::from(len), 2),
                remote: RemoteBuffer {
                    stag: if bad { Stag(peer.0 ^ 1) } else { peer },
                    offset: 100,
                },
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
