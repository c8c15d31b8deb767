//! The shared-memory rings of daemon-run queue pairs (issue 17) as untrusted input, between two real
//! soft-rdmad daemons (`--data-path daemon`, or XDP mode) in a pair of network namespaces. Needs root.
//!
//! A client that writes garbage into its own queue pair's ring gets that queue pair into Error, its
//! outstanding requests completing with INVALID_PARAMETER; another session's traffic on the same daemon
//! carries on, byte for byte. A request its ring has no room for completes at once in the client with
//! INSUFFICIENT_RESOURCES.

use soft_rdma::NdStatus;
use soft_rdma::client::{Adapter, CompletionOp, QueuePairState, ReadLimits};
use soft_rdma::rings::qp::QpRingLayout;
use soft_rdma::rings::shared::CACHE_LINE;
use soft_rdma_tests::Side;
use soft_rdma_tests::ends::{Daemons, End, listen_and_connect_ok, write_read_back};
use soft_rdma_tests::ops::{completions, eventually, within};
use soft_rdma_tests::rings::{qp_ring_mappings, scribble};

const LIMITS: (ReadLimits, ReadLimits) = (
    ReadLimits {
        inbound: 4,
        outbound: 4,
    },
    ReadLimits {
        inbound: 4,
        outbound: 4,
    },
);
const DEPTH: u32 = 16;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scribbled_ring_fails_its_queue_pair_alone() {
    let daemon_run = ["--data-path", "daemon"];
    let p = Daemons::start("ring", &daemon_run, &daemon_run).await;

    // A healthy pair: A's session to B, used before and after.
    let good_a = End::on(&p.a, 64, DEPTH).await;
    let good_b = End::on(&p.b, 64, DEPTH).await;
    listen_and_connect_ok(&good_a, &good_b, p.net.addr(Side::B, 7400), LIMITS).await;
    write_read_back(&good_a, &good_b, &[64, 4096], 1).await;

    // The offender: its own session on A, its queue pair's rings the one mapping that appears.
    let offender = Adapter::open(p.da.uds_path()).await.unwrap();
    let before = qp_ring_mappings();
    let bad_a = End::on(&offender, 64, DEPTH).await;
    let new: Vec<String> = qp_ring_mappings().difference(&before).cloned().collect();
    let [ring] = new.as_slice() else {
        panic!("one new queue-pair ring mapping expected: {new:?}");
    };
    let bad_b = End::on(&p.b, 64, DEPTH).await;
    listen_and_connect_ok(&bad_a, &bad_b, p.net.addr(Side::B, 7401), LIMITS).await;
    let mr = bad_a.register(4096).await;
    bad_a.qp.receive(1, &[mr.sge(0, 64)]).unwrap();
    eventually("the first Receive reaches the daemon", async || {
        let q = bad_a.qp.query().await.unwrap();
        (q.stats.rq_posted == 1).then_some(())
    })
    .await;

    // The send ring's producer index, far past what the ring holds; a Receive then publishes the receive
    // ring alone and wakes the daemon, which reads the send ring first.
    let layout = QpRingLayout::new(DEPTH, DEPTH).unwrap();
    scribble(
        ring,
        (layout.send_offset() + CACHE_LINE) as u64,
        &1_000_000u32.to_le_bytes(),
    );
    bad_a.qp.receive(2, &[mr.sge(64, 64)]).unwrap();
    let got = completions(&bad_a.cq, 1).await;
    assert_eq!(
        (got[0].qp, got[0].wr_id, got[0].op, got[0].status),
        (
            bad_a.qp.id(),
            1,
            CompletionOp::Receive,
            NdStatus::InvalidParameter
        ),
        "the outstanding Receive completes with the ring fault's status"
    );
    let q = bad_a.qp.query().await.unwrap();
    assert_eq!(q.state, QueuePairState::Error, "{q:?}");
    // Its connection ends: the peer's connector hears of it.
    within(
        "the peer sees the disconnect",
        bad_b.connector.notify_disconnect(),
    )
    .await
    .unwrap();

    // The other session's connection on the same daemon is untouched.
    write_read_back(&good_a, &good_b, &[64, 4096, 65536], 2).await;
    let q = good_a.qp.query().await.unwrap();
    assert_ne!(q.state, QueuePairState::Error, "{q:?}");
}

/// A ring holds what its queue pair's depth asks (rounded up to a power of two); what one post writes past
/// that completes at once in the client with INSUFFICIENT_RESOURCES, so that every request completes
/// exactly once: the ring's entries are published only at the end of the post, so the daemon cannot make
/// room meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_full_ring_cannot_take_completes_at_once() {
    let daemon_run = ["--data-path", "daemon"];
    let p = Daemons::start("rfull", &daemon_run, &daemon_run).await;
    let cq = p.a.create_completion_queue(64).await.unwrap();
    let qp = p.a.create_queue_pair(&cq, &cq, 2, 2).await.unwrap();
    let mr =
        p.a.register_memory(4096, soft_rdma::client::Access::LOCAL_WRITE)
            .await
            .unwrap();
    let receives = (1..=8)
        .map(|id| soft_rdma::client::WorkRequest::Receive {
            id,
            sgl: vec![mr.sge(64 * id, 64)],
        })
        .collect();
    qp.post(receives).unwrap();
    let got = completions(&cq, 6).await;
    assert_eq!(
        got.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        (3..=8)
            .map(|id| (id, NdStatus::InsufficientResources))
            .collect::<Vec<_>>()
    );
    eventually("the two the ring took reach the daemon", async || {
        let q = qp.query().await.unwrap();
        (q.stats.rq_posted == 2).then_some(())
    })
    .await;
    assert!(cq.poll(8).is_empty(), "nothing else completes");
}
