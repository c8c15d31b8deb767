//! Shared receive queues (issue 43, item 6) from C: `tests/c/srq_shared.c` between two namespaces, each
//! side one SRQ shared by three rdma_cm-connected queue pairs (`ibv_create_srq`, `ibv_post_srq_recv`,
//! `rdma_create_qp` with `attr.srq`, `ibv_modify_srq`/`ibv_query_srq` and IBV_EVENT_SRQ_LIMIT_REACHED,
//! `ibv_destroy_srq` EBUSY while in use), the rules kernel siw has (docs/rdma-core.md "Shared receive
//! queues"). The program checks data, order and `wc.qp_num` itself and prints `srq_shared ROLE: PASS`. The
//! client library's `SharedReceiveQueue` is checked the same way from Rust.
//!
//! The daemons' transports follow `$SOFT_RDMA_TEST_TRANSPORT` (`kernel`, `xdp`, `mixed`): `cargo xtask test`
//! runs the suite in all three. Needs root, the binaries (`cargo build -p soft-rdma-user --all-features
//! --bins`), the library (`cargo build -p soft-rdma-verbs`) and Debian's libibverbs-dev and librdmacm-dev.

use std::sync::Arc;

use soft_rdma::NdStatus;
use soft_rdma::client::{Access, ReadLimits};
use soft_rdma_tests::Side::{A, B};
use soft_rdma_tests::ends::Daemons;
use soft_rdma_tests::ops::within;
use soft_rdma_tests::rdma_core::{DEADLINE, Outcome, Programs, compile_c};

const LIMITS: ReadLimits = ReadLimits::new(4, 4);

#[test]
fn one_srq_shared_by_three_connected_queue_pairs_on_both_sides() {
    let p = Programs::start("srqs");
    let exe = compile_c("srq_shared", p.d.net.dir());
    let (exe, b) = (exe.to_str().unwrap(), p.ip(B).to_string());
    let mut server = p.spawn(B, exe, &["server", &b, "7491"]);
    server.wait_for_line("srq_shared server: listening", DEADLINE);
    p.wait_listening(B, 7491, &mut server);
    let client = p.run(A, exe, &["client", &b, "7491"]);
    let server = server.wait_after(&client);
    let passed =
        |o: &Outcome, role: &str| o.success() && o.stdout.contains(&format!("srq_shared {role}: PASS"));
    assert!(
        passed(&client, "client") && passed(&server, "server"),
        "client: {client}\nserver: {server}"
    );
    p.assert_in_force();
}

/// The client library's shared receive queue (`soft_rdma::client::SharedReceiveQueue`): B's two queue pairs
/// on one SRQ take its Receives in posting order, each completion naming its queue pair; the armed limit
/// calls its handler once; the SRQ cannot be closed while its queue pairs are connected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_client_two_queue_pairs_share_one_srq() {
    let d = Daemons::start("srqr", &[], &[]).await;
    let remote = d.net.addr(B, 7492);
    let (cq_a, cq_b) = (
        d.a.create_completion_queue(16).await.unwrap(),
        d.b.create_completion_queue(16).await.unwrap(),
    );
    let srq = d.b.create_shared_receive_queue(8, 1, 0).await.unwrap();
    let mut qa = Vec::new();
    let mut qb = Vec::new();
    for _ in 0..2 {
        qa.push(d.a.create_queue_pair(&cq_a, &cq_a, 4, 4).await.unwrap());
        qb.push(d.b.create_queue_pair_on_srq(&cq_b, &cq_b, 4, &srq).await.unwrap());
    }
    let mr_a = d.a.register_memory(64, Access::LOCAL_WRITE).await.unwrap();
    let mr_b = d.b.register_memory(4 * 64, Access::LOCAL_WRITE).await.unwrap();
    for i in 0..4u64 {
        srq.receive(i, &[mr_b.sge(i * 64, 64)]).await.unwrap();
    }
    // 4 posted: the third Receive taken leaves 1, fewer than 2.
    srq.set_limit(2).await.unwrap();
    let reached = Arc::new(tokio::sync::Notify::new());
    let r = reached.clone();
    srq.on_limit_reached(move || r.notify_one());
    let listener = d.b.create_listener().await.unwrap();
    listener.listen(remote, 0).await.unwrap();
    let mut connectors = Vec::new();
    for i in 0..2 {
        let (ca, cb) = (
            d.a.create_connector().await.unwrap(),
            d.b.create_connector().await.unwrap(),
        );
        let (x, y) = within("connect + accept", async {
            tokio::join!(
                async {
                    ca.connect_qp(&qa[i], remote, LIMITS, b"").await?;
                    ca.complete_connect().await
                },
                async {
                    listener.get_connection_request(&cb).await?;
                    cb.accept_qp(&qb[i], LIMITS, b"").await
                }
            )
        })
        .await;
        x.unwrap();
        y.unwrap();
        connectors.push((ca, cb));
    }
    // One message at a time, alternating queue pairs: B's k-th completion took Receive k.
    for k in 0..3u64 {
        let i = (k % 2) as usize;
        let msg = format!("m{k}");
        mr_a.write_at(0, msg.as_bytes()).unwrap();
        qa[i].send(k, &[mr_a.sge(0, 2)]).unwrap();
        let sent = within("the Send's completion", cq_a.next()).await.unwrap();
        assert_eq!((sent.wr_id, sent.status), (k, NdStatus::Success));
        let got = within("the Receive's completion", cq_b.next()).await.unwrap();
        assert_eq!(got.status, NdStatus::Success, "{got:?}");
        assert_eq!((got.qp, got.wr_id, got.bytes), (qb[i].id(), k, 2), "{got:?}");
        let mut buf = [0u8; 2];
        mr_b.read_at(k as usize * 64, &mut buf).unwrap();
        assert_eq!(&buf, msg.as_bytes());
    }
    within("the limit event", reached.notified()).await;
    let s = srq.query().await.unwrap();
    assert_eq!((s.posted, s.limit, s.armed), (1, 2, false), "{s:?}");
    let e = srq.close().await.unwrap_err();
    assert_eq!(e.status, NdStatus::SharingViolation, "{e}");
}
