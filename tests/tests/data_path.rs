//! The RDMA data path end to end: two real soft-rdmad daemons in a pair of network namespaces, queue pairs
//! connected through the client library, memory registered as memfds shared with the daemons. Every
//! transfer is verified byte for byte; every error case checks the Terminate (layer, type, code) both sides
//! recorded and the completion statuses both sides saw. Needs root.

use std::time::Duration;

use soft_rdma::NdStatus;
use soft_rdma::client::{
    Access, Adapter, CompletionOp, QueuePairState, ReadLimits, RemoteBuffer, Sge, Stag, TerminateInfo,
    WorkRequest,
};
use soft_rdma_common::wire::terminate::{layer, rdmap_code, rdmap_type};
use soft_rdma_tests::ends::{
    End, assert_steered, listen_and_connect_ok, read_request_fpdu, rev1_initiator, steering, write_read_back,
};
use soft_rdma_tests::ops::{assert_ok, completions, pattern, registered, terminated, within};
use soft_rdma_tests::{Daemon, Side, TestNet};

const PORT: u16 = 7300;

struct Pair {
    net: TestNet,
    da: Daemon,
    db: Daemon,
    a: End,
    b: End,
}

/// Two daemons, a queue pair on each side, connected A → B. `before_accept` runs on B's side (post its
/// Receives there: data may arrive as soon as B accepts).
async fn pair<F>(tag: &str, la: ReadLimits, lb: ReadLimits, before_accept: F) -> Pair
where
    F: AsyncFnOnce(&End),
{
    pair_keeping(tag, la, lb, before_accept).await.0
}

/// [`pair`], and what `before_accept` gave (B's regions, say).
async fn pair_keeping<T, F>(tag: &str, la: ReadLimits, lb: ReadLimits, before_accept: F) -> (Pair, T)
where
    F: AsyncFnOnce(&End) -> T,
{
    let net = TestNet::new(tag).expect("netns pair");
    let da = net.spawn_daemon(Side::A, &[]).expect("daemon A");
    let db = net.spawn_daemon(Side::B, &[]).expect("daemon B");
    let (a, b) = (
        End::open(da.uds_path(), 4096, 1024).await,
        End::open(db.uds_path(), 4096, 1024).await,
    );
    let remote = net.addr(Side::B, PORT);
    let kept = before_accept(&b).await;
    let before = (steering(&a.adapter).await, steering(&b.adapter).await);
    listen_and_connect_ok(&a, &b, remote, (la, lb)).await;
    assert_steered(&a.adapter, Side::A, before.0).await;
    assert_steered(&b.adapter, Side::B, before.1).await;
    (Pair { net, da, db, a, b }, kept)
}

/// Posts Receives `ids` on `b`, each of `len` bytes of one region that stays registered for the test's life.
async fn post_receives(b: &End, ids: std::ops::Range<u64>, len: u32) {
    let mr = b.register(4096).await;
    for i in ids {
        b.qp.receive(i, &[mr.sge(0, len)]).unwrap();
    }
    std::mem::forget(mr);
}

const LIMITS: ReadLimits = ReadLimits {
    inbound: 16,
    outbound: 16,
};

/// Sizes from 1 byte to 16 MiB, several not multiples of the FPDU payload.
const SIZES: [usize; 9] = [1, 17, 1400, 1448, 4096, 65_537, 1 << 20, 3_000_001, 16 << 20];
/// Region size: the largest transfer plus room for the offset the Write/Read test uses.
const MAX: usize = (16 << 20) + 64;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_receive_every_size_byte_for_byte() {
    let (p, rmr) = pair_keeping("dsnd", LIMITS, LIMITS, async |b: &End| {
        let mr = b.register(MAX).await;
        // One Receive per size, in order (Sends match Receives in MSN order: RFC 5041 §5).
        for (i, size) in SIZES.iter().enumerate() {
            b.qp.receive(i as u64, &[mr.sge(0, *size as u32)]).unwrap();
        }
        mr
    })
    .await;
    let smr = p.a.register(MAX).await;
    for (i, size) in SIZES.iter().enumerate() {
        let data = pattern(*size, i as u8 + 1);
        smr.write_at(0, &data).unwrap();
        p.a.qp.send(100 + i as u64, &[smr.sge(0, *size as u32)]).unwrap();
        let sent = completions(&p.a.cq, 1).await;
        assert_ok(&sent[0], 100 + i as u64, CompletionOp::Send, *size as u32);
        let got = completions(&p.b.cq, 1).await;
        assert_ok(&got[0], i as u64, CompletionOp::Receive, *size as u32);
        assert_eq!(rmr.to_vec(0, *size).unwrap(), data, "Send of {size} bytes");
    }
    drop(p.net);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_then_read_back_every_size() {
    let p = pair("dwr", LIMITS, LIMITS, async |_: &End| {}).await;
    write_read_back(&p.a, &p.b, &SIZES, 40).await;
    assert!(
        p.b.cq.poll(16).is_empty(),
        "one-sided operations complete nothing on the target"
    );
    drop(p.net);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scatter_gather_lists() {
    let (p, rmr) = pair_keeping("dsgl", LIMITS, LIMITS, async |b: &End| {
        let mr = b.register(8192).await;
        // 5000 bytes scattered over three pieces of the region, out of order.
        b.qp.receive(1, &[mr.sge(6000, 1000), mr.sge(0, 3000), mr.sge(4000, 1000)])
            .unwrap();
        mr
    })
    .await;
    let smr = p.a.register(8192).await;
    let data = pattern(5000, 9);
    // Gathered from three places.
    smr.write_at(100, &data[..2000]).unwrap();
    smr.write_at(5000, &data[2000..2500]).unwrap();
    smr.write_at(5600, &data[2500..]).unwrap();
    p.a.qp
        .send(2, &[smr.sge(100, 2000), smr.sge(5000, 500), smr.sge(5600, 2500)])
        .unwrap();
    assert_ok(&completions(&p.a.cq, 1).await[0], 2, CompletionOp::Send, 5000);
    assert_ok(&completions(&p.b.cq, 1).await[0], 1, CompletionOp::Receive, 5000);
    let mut got = rmr.to_vec(6000, 1000).unwrap();
    got.extend(rmr.to_vec(0, 3000).unwrap());
    got.extend(rmr.to_vec(4000, 1000).unwrap());
    assert_eq!(got, data);
    // Write with a gather list lands contiguously.
    let target = p.b.register(8192).await;
    p.a.qp
        .write(3, &[smr.sge(100, 2000), smr.sge(5000, 500)], target.remote(0))
        .unwrap();
    assert_ok(&completions(&p.a.cq, 1).await[0], 3, CompletionOp::Write, 2500);
    // A Write completes when handed to TCP, not when placed: a Read behind it on the same stream is answered
    // only after the Write was placed (RDMAP ordering, RFC 5040 §5.5), so it fences the check.
    p.a.qp.read(4, smr.sge(8000, 1), target.remote(0)).unwrap();
    assert_ok(&completions(&p.a.cq, 1).await[0], 4, CompletionOp::Read, 1);
    assert_eq!(target.to_vec(0, 2500).unwrap(), data[..2500]);
    drop(p.net);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_pipeline_within_the_outbound_limit() {
    // A may issue 2 reads at a time (its ORD, capped by B's IRD 2).
    let la = ReadLimits {
        inbound: 2,
        outbound: 2,
    };
    let p = pair("dord", la, la, async |_: &End| {}).await;
    assert_eq!(p.a.connector.read_limits().await.unwrap().outbound, 2);
    let source = p.b.register(64 * 4096).await;
    let data = pattern(64 * 4096, 3);
    source.write_at(0, &data).unwrap();
    let sink = p.a.register(64 * 4096).await;
    let reads: Vec<_> = (0..64u64)
        .map(|i| WorkRequest::Read {
            id: i,
            sink: sink.sge(i * 4096, 4096),
            remote: source.remote(i * 4096),
            silent: false,
        })
        .collect();
    p.a.qp.post(reads).unwrap();
    let done = completions(&p.a.cq, 64).await;
    for (i, c) in done.iter().enumerate() {
        assert_ok(c, i as u64, CompletionOp::Read, 4096);
    }
    assert_eq!(sink.to_vec(0, data.len()).unwrap(), data);
    // B served them all without a Terminate: A never had more than 2 in flight.
    let b = p.b.qp.query().await.unwrap();
    assert_eq!(b.state, QueuePairState::Connected, "{b:?}");
    drop(p.net);
}

fn cause(t: TerminateInfo) -> Cause {
    (t.layer, t.error_type, t.code)
}

/// A Terminate's (layer, type, code) (RFC 5040 §7.2; RFC 5041 §7.3).
type Cause = (u8, u8, u8);

/// The Terminates these tests provoke.
#[rustfmt::skip]
mod provoked {
    use super::Cause;
    use soft_rdma_common::wire::terminate::layer::{DDP, RDMAP};
    use soft_rdma_common::wire::terminate::{ddp_code, ddp_type, rdmap_code, rdmap_type};

    pub const DDP_INVALID_STAG: Cause = (DDP, ddp_type::TAGGED_BUFFER, ddp_code::TAGGED_INVALID_STAG);
    pub const DDP_BASE_OR_BOUNDS: Cause = (DDP, ddp_type::TAGGED_BUFFER, ddp_code::TAGGED_BASE_OR_BOUNDS);
    pub const RDMAP_ACCESS_RIGHTS: Cause = (RDMAP, rdmap_type::REMOTE_PROTECTION, rdmap_code::ACCESS_RIGHTS);
    pub const RDMAP_INVALID_STAG: Cause = (RDMAP, rdmap_type::REMOTE_PROTECTION, rdmap_code::INVALID_STAG);
    pub const DDP_NO_BUFFER: Cause = (DDP, ddp_type::UNTAGGED_BUFFER, ddp_code::UNTAGGED_NO_BUFFER);
    pub const DDP_TOO_LONG: Cause = (DDP, ddp_type::UNTAGGED_BUFFER, ddp_code::UNTAGGED_MESSAGE_TOO_LONG);
}
use provoked::*;

/// Both sides recorded the same Terminate: B detected it (and sent it), A received it.
async fn both_saw(p: &Pair, expected: Cause) {
    let d = terminated(&p.b.qp).await;
    let v = terminated(&p.a.qp).await;
    assert_eq!((cause(d), d.from_peer), (expected, false), "detecting side");
    assert_eq!((cause(v), v.from_peer), (expected, true), "terminated side");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_to_an_invalid_stag_terminates_with_ddp_invalid_stag() {
    let p = pair("dstag", LIMITS, LIMITS, async |_: &End| {}).await;
    let local = p.a.register(4096).await;
    let target = p.b.register(4096).await;
    let bogus = RemoteBuffer {
        stag: Stag(target.stag().0 ^ 0x55),
        offset: 0,
    };
    p.a.qp.receive(9, &[local.sge(0, 64)]).unwrap();
    p.a.qp.write(1, &[local.sge(0, 100)], bogus).unwrap();
    both_saw(&p, DDP_INVALID_STAG).await;
    // A's Receive is flushed (it will never be filled).
    let flushed: Vec<_> = completions(&p.a.cq, 2).await;
    assert!(
        flushed
            .iter()
            .any(|c| c.wr_id == 9 && c.status == NdStatus::Canceled),
        "{flushed:?}"
    );
    drop(p.net);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protection_errors_map_to_their_terminate_codes() {
    // Each case on its own connection: a Terminate ends the stream.
    // 1. Write beyond the region's end: DDP tagged base-or-bounds.
    let p = pair("dbnd", LIMITS, LIMITS, async |_: &End| {}).await;
    let local = p.a.register(4096).await;
    let target = p.b.register(4096).await;
    p.a.qp
        .write(1, &[local.sge(0, 200)], target.remote(4000))
        .unwrap();
    both_saw(&p, DDP_BASE_OR_BOUNDS).await;
    drop(p);

    // 2. Read from a region without REMOTE_READ: RDMAP remote protection, access rights; the Read fails.
    let p = pair("dacc", LIMITS, LIMITS, async |_: &End| {}).await;
    let sink = p.a.register(4096).await;
    let write_only =
        p.b.adapter
            .register_memory(4096, Access::REMOTE_WRITE)
            .await
            .unwrap();
    p.a.qp.read(5, sink.sge(0, 100), write_only.remote(0)).unwrap();
    both_saw(&p, RDMAP_ACCESS_RIGHTS).await;
    let c = completions(&p.a.cq, 1).await;
    assert_eq!((c[0].wr_id, c[0].status), (5, NdStatus::RemoteError), "{c:?}");
    drop(p);

    // 3. A deregistered STag is refused: RDMAP remote protection, invalid STag, for a Read.
    let p = pair("ddrg", LIMITS, LIMITS, async |_: &End| {}).await;
    let sink = p.a.register(4096).await;
    let gone = p.b.register(4096).await;
    let remote = gone.remote(0);
    drop(gone);
    // Deregistration is asynchronous on the wire; make sure it happened before the Read is sent.
    within("deregistration", async {
        while p.b.adapter.status().await.unwrap().memory_regions != 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    p.a.qp.read(6, sink.sge(0, 64), remote).unwrap();
    both_saw(&p, RDMAP_INVALID_STAG).await;
    drop(p);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_without_a_posted_receive_terminates() {
    let p = pair("dnrx", LIMITS, LIMITS, async |_: &End| {}).await;
    let local = p.a.register(4096).await;
    // iWARP has no receiver-not-ready retry: the Send finds no buffer (RFC 5041 §7.3, code 0x02).
    p.a.qp.send(1, &[local.sge(0, 10)]).unwrap();
    both_saw(&p, DDP_NO_BUFFER).await;
    drop(p.net);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_longer_than_the_receive_is_a_data_overrun() {
    let p = pair("dovr", LIMITS, LIMITS, async |b: &End| {
        post_receives(b, 1..2, 100).await
    })
    .await;
    let local = p.a.register(4096).await;
    p.a.qp.send(1, &[local.sge(0, 101)]).unwrap();
    both_saw(&p, DDP_TOO_LONG).await;
    let c = completions(&p.b.cq, 1).await;
    assert_eq!((c[0].wr_id, c[0].status), (1, NdStatus::DataOverrun), "{c:?}");
    drop(p.net);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_with_invalidate_revokes_the_peers_stag() {
    let (p, (_inbox, exposed)) = pair_keeping("dinv", LIMITS, LIMITS, async |b: &End| {
        let inbox = b.register(4096).await;
        let exposed = b.register(4096).await;
        b.qp.receive(1, &[inbox.sge(0, 64)]).unwrap();
        (inbox, exposed)
    })
    .await;
    let local = p.a.register(4096).await;
    // Before: A may write B's exposed region.
    local.write_at(0, b"before").unwrap();
    p.a.qp.write(1, &[local.sge(0, 6)], exposed.remote(0)).unwrap();
    assert_ok(&completions(&p.a.cq, 1).await[0], 1, CompletionOp::Write, 6);
    p.a.qp
        .send_with(2, &[local.sge(0, 6)], true, Some(exposed.stag()))
        .unwrap();
    let got = completions(&p.b.cq, 1).await;
    assert_eq!(got[0].invalidated, Some(exposed.stag()), "{got:?}");
    assert!(got[0].solicited);
    assert_eq!(exposed.to_vec(0, 6).unwrap(), b"before");
    // After: the same Write is refused with an invalid STag.
    p.a.qp.write(3, &[local.sge(0, 6)], exposed.remote(0)).unwrap();
    both_saw(&p, DDP_INVALID_STAG).await;
    drop(p.net);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_flushes_both_sides_with_canceled() {
    let p = pair("dfls", LIMITS, LIMITS, async |b: &End| {
        post_receives(b, 0..5, 64).await
    })
    .await;
    post_receives(&p.a, 10..13, 64).await;
    // B asks to be told of the disconnect; its request is in before A disconnects.
    let notified = registered(&p.b.adapter, p.b.connector.notify_disconnect()).await;
    p.a.connector.disconnect().await.unwrap();
    within("NotifyDisconnect", notified).await.unwrap();
    let a = completions(&p.a.cq, 3).await;
    assert_eq!(
        a.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        (10..13).map(|i| (i, NdStatus::Canceled)).collect::<Vec<_>>()
    );
    let b = completions(&p.b.cq, 5).await;
    assert_eq!(
        b.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        (0..5).map(|i| (i, NdStatus::Canceled)).collect::<Vec<_>>()
    );
    drop(p.net);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_exits_with_io_in_flight_leaves_nothing() {
    let p = pair("dexit", LIMITS, LIMITS, async |_: &End| {}).await;
    let big = p.b.register(16 << 20).await;
    let sink = p.a.register(16 << 20).await;
    for i in 0..4 {
        p.a.qp.read(i, sink.sge(0, 16 << 20), big.remote(0)).unwrap();
    }
    let session = p.a.adapter.session();
    let Pair { net, da, db, a, b } = p;
    drop((a, sink)); // the client goes away mid-transfer
    let check = Adapter::open(da.uds_path()).await.unwrap();
    within("release", async {
        loop {
            let s = check.status().await.unwrap();
            let held = s.queue_pairs.iter().any(|q| q.session == session.0)
                || s.connectors.iter().any(|c| c.session == session.0);
            if !held && s.memory_regions == 0 && s.ports_in_use == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // B saw the disconnect: its queue pair left Connected.
    within("peer disconnect", async {
        while b.qp.query().await.unwrap().state == QueuePairState::Connected {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    drop((b, big, db, net));
}

/// A peer that issues more RDMA Reads than our inbound limit (IRD) is terminated: RDMAP, remote operation,
/// catastrophic to the stream (what Linux siw sends on "IRQ exceeded"). The peer here is a raw MPA Rev 1
/// client (soft-rdma's own client library never exceeds the negotiated limit), sending three Read Requests in
/// one write to a side that serves two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_beyond_the_inbound_limit_terminate_the_stream() {
    use std::io::{Read, Write};

    use soft_rdma_common::wire::fpdu::FpduRepr;
    use soft_rdma_common::wire::mpa::{MpaKind, MpaRepr};
    use soft_rdma_common::wire::rdmap::{MessageRepr, RdmapOpcode, ReadRequestRepr};

    let net = TestNet::new("dird").expect("netns pair");
    let db = net.spawn_daemon(Side::B, &[]).expect("daemon B");
    let b = Adapter::open(db.uds_path()).await.unwrap();
    let cq = b.create_completion_queue(64).await.unwrap();
    let qp = b.create_queue_pair(&cq, &cq, 16, 16).await.unwrap();
    let source = b.register_memory(1 << 20, Access::REMOTE_READ).await.unwrap();
    let listener = b.create_listener().await.unwrap();
    let bound = listener.listen(net.addr(Side::B, PORT), 0).await.unwrap();
    let stag = source.stag().0;
    let peer = net.spawn_in_ns(Side::A, {
        move || {
            let mut s = rev1_initiator(bound, b"");
            let mut reply = [0u8; 20];
            s.read_exact(&mut reply).unwrap();
            assert_eq!(MpaRepr::parse(&reply).unwrap().kind, MpaKind::Reply);
            // Three Read Requests in one segment: the side that serves two must terminate on the third.
            let mut out = Vec::new();
            for msn in 1..=3u32 {
                out.extend(read_request_fpdu(
                    msn,
                    ReadRequestRepr {
                        sink_stag: 0x1234,
                        sink_offset: 0,
                        read_size: 1 << 20,
                        source_stag: stag,
                        source_offset: 0,
                    },
                ));
            }
            s.write_all(&out).unwrap();
            // Read FPDUs until the Terminate (Read Responses for the first two may come first).
            let mut rx = Vec::new();
            let mut chunk = vec![0u8; 65536];
            loop {
                while let Ok(Some(len)) = FpduRepr::frame_len(&rx, 65535) {
                    if rx.len() < len {
                        break;
                    }
                    let frame: Vec<u8> = rx.drain(..len).collect();
                    let f = FpduRepr::parse(&frame, 65535).unwrap();
                    let m = MessageRepr::parse(f.ulpdu).unwrap();
                    if m.opcode == RdmapOpcode::Terminate {
                        let t = m.terminate().unwrap();
                        return (t.cause.layer, t.cause.error_type, t.cause.code);
                    }
                }
                let n = s
                    .read(&mut chunk)
                    .expect("the Terminate before the connection closes");
                assert!(n > 0, "closed without a Terminate");
                rx.extend_from_slice(&chunk[..n]);
            }
        }
    });
    let connector = b.create_connector().await.unwrap();
    within("offer", listener.get_connection_request(&connector))
        .await
        .unwrap();
    let ird2 = ReadLimits {
        inbound: 2,
        outbound: 2,
    };
    connector.accept_qp(&qp, ird2, b"").await.unwrap();
    let expected = (
        layer::RDMAP,
        rdmap_type::REMOTE_OPERATION,
        rdmap_code::CATASTROPHIC_STREAM,
    );
    assert_eq!(peer.join().unwrap(), expected, "the Terminate on the wire");
    let t = terminated(&qp).await;
    assert_eq!((cause(t), t.from_peer), (expected, false), "what B recorded");
    drop(net);
}

/// ND_OP_FLAG_SILENT_SUCCESS end to end (through the client's rings in XDP mode, in-process in kernel mode):
/// silent Sends, Writes and Reads do their work and complete nothing; the signaled request after them
/// completes alone, in order; a silent request that fails still completes, with its error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_requests_complete_only_when_they_fail() {
    let (p, rmr) = pair_keeping("dsil", LIMITS, LIMITS, async |b: &End| {
        let mr = b.register(4096).await;
        for i in 0..3u64 {
            b.qp.receive(i, &[mr.sge(i * 100, 100)]).unwrap();
        }
        mr
    })
    .await;
    let target = p.b.register(4096).await;
    let local = p.a.register(4096).await;
    let data = pattern(300, 9);
    local.write_at(0, &data).unwrap();
    target.write_at(2000, &data[..50]).unwrap();
    for i in 0..2u32 {
        p.a.qp
            .send_silent(10 + u64::from(i), &[local.sge(u64::from(i) * 100, 100)])
            .unwrap();
    }
    p.a.qp
        .write_silent(12, &[local.sge(0, 300)], target.remote(100))
        .unwrap();
    p.a.qp
        .post(vec![WorkRequest::Read {
            id: 13,
            sink: local.sge(1000, 50),
            remote: target.remote(2000),
            silent: true,
        }])
        .unwrap();
    p.a.qp.send(14, &[local.sge(200, 100)]).unwrap();
    let got = completions(&p.a.cq, 1).await;
    assert_ok(&got[0], 14, CompletionOp::Send, 100);
    let got = completions(&p.b.cq, 3).await;
    for (i, c) in got.iter().enumerate() {
        assert_ok(c, i as u64, CompletionOp::Receive, 100);
    }
    assert_eq!(rmr.to_vec(0, 300).unwrap(), data, "the Sends, silent or not");
    assert_eq!(target.to_vec(100, 300).unwrap(), data, "the silent Write");
    // The silent Read was before the signaled Send in the queue, and a Read completes on its Response:
    // wait for the peer's bytes rather than for an order iWARP does not promise between them.
    within("the silent Read's data", async {
        while local.to_vec(1000, 50).unwrap() != data[..50] {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(p.a.cq.poll(16).is_empty(), "nothing for the silent requests");
    // A silent request that fails completes: a gather list naming no region.
    let nowhere = Sge {
        stag: Stag(0x7fff_ff00),
        offset: 0,
        length: 10,
    };
    p.a.qp.send_silent(15, &[nowhere]).unwrap();
    let got = completions(&p.a.cq, 1).await;
    assert_eq!(
        (got[0].wr_id, got[0].status),
        (15, NdStatus::AccessViolation),
        "{got:?}"
    );
    drop(p.net);
}
