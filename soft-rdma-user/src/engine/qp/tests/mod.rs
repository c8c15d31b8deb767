//! Unit and property tests of the queue pair.

use super::*;
use crate::engine::ids::PdId;
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
        pd: crate::engine::ids::PdId(0),
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
            .register(self.session.into(), Box::new(m.clone()), access, 0)
            .unwrap();
        (m, stag, id)
    }

    fn post(&mut self, wr: WorkRequest) {
        self.qp.post(wr, &self.mem, &mut self.comps);
    }

    fn deliver(&mut self, msg: &MessageRepr<'_>) -> Result<(), TerminateCause> {
        let r = self.qp.on_message(msg, &mut self.mem, None, &mut self.comps);
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
        silent: false,
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
        silent: false,
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
                    silent: false,
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
            silent: false,
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

/// Memory whose reads are costly (as a client's `/proc/<pid>/mem`), counting them.
#[derive(Clone)]
struct CostlyMemory {
    bytes: VecMemory,
    reads: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl RegionMemory for CostlyMemory {
    fn len(&self) -> u64 {
        self.bytes.len()
    }
    fn read_at(&self, offset: u64, out: &mut [u8]) {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.bytes.read_at(offset, out);
    }
    fn write_at(&self, offset: u64, data: &[u8]) {
        self.bytes.write_at(offset, data);
    }
    fn costly_access(&self) -> bool {
        true
    }
}

/// A Write from, and a Read Response out of, memory whose reads are costly: the bytes are the region's,
/// in MSS-sized FPDUs, read in 64 KiB pieces (`read_ahead.rs`) instead of once per FPDU.
#[test]
fn costly_memory_is_read_ahead_by_writes_and_read_responses() {
    const LEN: usize = 256 * 1024;
    let mut p = Pair::new(params(false, 1448), params(false, 1448));
    p.budget = 1 << 20;
    let src = pattern(LEN + 100, 3);
    let costly = |bytes: Vec<u8>| CostlyMemory {
        bytes: VecMemory::from(bytes),
        reads: Default::default(),
    };
    let a_mem = costly(src.clone());
    let (_, a_stag) = p.a.mem.register(S1.into(), Box::new(a_mem.clone()), Access::REMOTE_READ, 0).unwrap();
    let (sink, b_stag, _) = p.b.region(vec![0; LEN], Access::REMOTE_WRITE | Access::LOCAL_WRITE);
    // A's Write of LEN bytes from offset 100, in two SGEs.
    p.a.post(WorkRequest::Write {
        id: 1,
        sgl: split_sgl(a_stag, 100, LEN as u32, 2),
        remote: RemoteBuffer { stag: b_stag, offset: 0 },
        silent: false,
    });
    p.pump();
    assert_eq!(summary(&p.a.take()), vec![ok(1, CompletionOp::Write, LEN as u32)]);
    assert_eq!(sink.bytes(), &src[100..]);
    let fpdus = p.log.len();
    let reads = a_mem.reads.swap(0, std::sync::atomic::Ordering::Relaxed);
    assert!(fpdus > 180, "{fpdus} FPDUs");
    assert!(reads <= 2 * LEN.div_ceil(64 * 1024) + 2, "{reads} reads for {fpdus} FPDUs");
    // B reads it back from A: A's Read Responses read ahead too.
    p.b.post(read_wr(2, sge(b_stag, 0, LEN as u32), a_stag, 100));
    p.pump();
    assert_eq!(summary(&p.b.take()), vec![ok(2, CompletionOp::Read, LEN as u32)]);
    assert_eq!(sink.bytes(), &src[100..]);
    let reads = a_mem.reads.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(reads, LEN.div_ceil(64 * 1024) + 1, "one read per 64 KiB piece (and the FPDU across pieces)");
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
// Crafted inbound messages (the suites in inbound.rs and posting.rs use them).
// ------------------------------------------------------------------------------------------------

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
    /// A region of the target's own session in another protection domain than its queue pair's.
    other_pd: Stag,
}

fn target() -> Target {
    let mut side = Side::new(S2, config());
    side.qp.connect(params(false, 1448));
    let (_, rw, _) = side.region(vec![0; 256], Access::ALL);
    let (_, ro, _) = side.region(vec![0; 256], Access::LOCAL_WRITE);
    let (_, stale, id) = side.region(vec![0; 256], Access::ALL);
    side.mem.deregister(S2, id).unwrap();
    let (_, fresh, _) = side.region(vec![0; 256], Access::ALL);
    assert_ne!(fresh.index(), stale.index(), "a deregistered STag's index is not handed out again");
    let (_, foreign) = side
        .mem
        .register(S3.into(), Box::new(VecMemory::new(256)), Access::ALL, 0)
        .unwrap();
    let (_, other_pd) = side
        .mem
        .register(Domain::new(S2, PdId(7)), Box::new(VecMemory::new(256)), Access::ALL, 0)
        .unwrap();
    Target {
        side,
        rw,
        ro,
        stale,
        foreign,
        other_pd,
    }
}

fn target_with_receive() -> Target {
    let mut t = target();
    let rw = t.rw;
    t.side.post(receive_wr(1, rw, 64));
    t
}

mod inbound;
mod posting;
mod properties;
