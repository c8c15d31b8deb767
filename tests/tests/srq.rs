//! Shared receive queues (issue 43, item 6) from C: `tests/c/srq_shared.c` between two namespaces, each
//! side one SRQ shared by three rdma_cm-connected queue pairs (`ibv_create_srq`, `ibv_post_srq_recv`,
//! `rdma_create_qp` with `attr.srq`, `ibv_modify_srq`/`ibv_query_srq` and IBV_EVENT_SRQ_LIMIT_REACHED,
//! `ibv_destroy_srq` EBUSY while in use), the rules kernel siw has (docs/rdma-core.md "Shared receive
//! queues"). The program checks data, order and `wc.qp_num` itself and prints `srq_shared ROLE: PASS`.
//!
//! The daemons' transports follow `$SOFT_RDMA_TEST_TRANSPORT` (`kernel`, `xdp`, `mixed`): `cargo xtask test`
//! runs the suite in all three. Needs root, the binaries (`cargo build -p soft-rdma-user --all-features
//! --bins`), the library (`cargo build -p soft-rdma-verbs`) and Debian's libibverbs-dev and librdmacm-dev.

use soft_rdma_tests::Side::{A, B};
use soft_rdma_tests::rdma_core::{DEADLINE, Outcome, Programs, compile_c};

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
