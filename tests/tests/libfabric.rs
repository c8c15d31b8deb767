//! Debian's unmodified libfabric 1.17 (`libfabric-bin`: `fi_info`, `fi_pingpong`) on soft-rdma's drop-in
//! `libibverbs.so.1`/`librdmacm.so.1`, between two namespaces, in the transport mode
//! `$SOFT_RDMA_TEST_TRANSPORT` gives (`kernel`, `xdp`, `mixed`; `cargo xtask test` runs all three).
//!
//! libfabric's verbs provider sees soft-rdma as an iWARP device (`fi_info` lists `softrdma0` on fabric
//! "Ethernet-iWARP"). `fi_pingpong` runs with data checking (`-c`) over every size (`-S all`, its
//! default), on the provider's MSG endpoints (`-p verbs -e msg`) and on RxM's RDM endpoints over them
//! (`-p "verbs;ofi_rxm" -e rdm`, plain and tagged), whose messages above 128 KiB go by rendezvous, an RDMA
//! Read. RxM runs with libfabric's defaults: its completion queue of 262,144 entries (`FI_UNIVERSE_SIZE`
//! 256 × its RX size 1024) is within soft-rdma's `max_cqe` (kernel siw's 3,276,800); one run keeps a small
//! universe (RxM then asks for 1,024 entries, which a shared ring of XDP mode holds whole). Its rendezvous by RDMA Write
//! (`FI_OFI_RXM_USE_RNDV_WRITE=1`) fails and is ignored. fi_pingpong's own control connection is a TCP socket on
//! port 47592 (the kernel's, beside soft-rdma's). The tests assert on exit codes and fi_pingpong's results
//! rows, never on figures. Needs root, the binaries and the library (`cargo build --workspace --bins`,
//! `cargo build -p soft-rdma-verbs`) and Debian's libfabric-bin (`cargo xtask setup`).

use soft_rdma_tests::Side::A;
use soft_rdma_tests::libfabric::{fi_pingpong, sizes_checked};
use soft_rdma_tests::rdma_core::Programs;

#[test]
fn fi_info_lists_the_device() {
    let p = Programs::start("lfin");
    let out = p.run(A, "fi_info", &["-p", "verbs"]);
    out.assert_success()
        .assert_prints("domain: softrdma0")
        .assert_prints("fabric: Ethernet-iWARP")
        .assert_prints("verbs;ofi_rxm");
}

#[test]
fn pingpong_msg_checks_every_size() {
    let p = Programs::start_alone("lfmsg");
    let r = fi_pingpong(&p, &["-p", "verbs", "-e", "msg"], &[]);
    r.assert_success();
    sizes_checked(&r.client);
    p.assert_in_force();
}

/// The verbs library's debug line for each completion queue made (`cqe=… max=…`).
const CQ_LOG: (&str, &str) = ("SOFT_RDMA_LOG", "soft_rdma_verbs::cq=debug");

/// RxM with libfabric's defaults sizes its MSG endpoints' completion queue from the universe size: 256
/// peers × 1024 entries (`FI_UNIVERSE_SIZE`), 262,144, which soft-rdma makes (up to kernel siw's
/// `SIW_MAX_CQE`, 3,276,800): both sides make it and check every size.
#[test]
fn pingpong_rdm_checks_every_size() {
    let p = Programs::start_alone("lfrdm");
    let r = fi_pingpong(&p, &["-p", "verbs;ofi_rxm", "-e", "rdm"], &[CQ_LOG]);
    r.assert_success();
    for side in [&r.client, &r.server] {
        side.assert_prints("ibv_create_cq cqe=262144 max=3276800");
    }
    sizes_checked(&r.client);
    p.assert_in_force();
}

#[test]
fn pingpong_rdm_tagged() {
    let p = Programs::start_alone("lfrdt");
    let r = fi_pingpong(&p, &["-p", "verbs;ofi_rxm", "-e", "rdm", "-m", "tagged"], &[]);
    r.assert_success();
    sizes_checked(&r.client);
}

/// A small universe (`FI_UNIVERSE_SIZE=4`): RxM asks for a completion queue of 1,024 entries, which in XDP
/// mode its shared ring holds whole (a default one's ring holds 65,536 of its 262,144 entries, the rest
/// wait in soft-rdmad's overflow when the program falls behind).
const UNIVERSE: (&str, &str) = ("FI_UNIVERSE_SIZE", "4");

#[test]
fn pingpong_rdm_small_universe() {
    let p = Programs::start_alone("lfrds");
    let r = fi_pingpong(&p, &["-p", "verbs;ofi_rxm", "-e", "rdm"], &[UNIVERSE, CQ_LOG]);
    r.assert_success();
    r.server.assert_prints("ibv_create_cq cqe=1024 ");
    sizes_checked(&r.client);
}

/// `FI_OFI_RXM_USE_SRX=1`: RxM asks the verbs provider for a shared receive context of 4,096 entries
/// (`RXM_MSG_SRX_SIZE`), which fi_getinfo grants only where `max_qp_wr` is at least that (kernel siw's is
/// 32,768; soft-rdma's was 1,024, and fi_getinfo failed with -61). Every size checked, eager, segmented and
/// rendezvous. (libfabric 1.17's RxM then opened no SRQ in these runs: `ibv_create_srq` was not called;
/// the SRQ itself is `tests/tests/srq.rs`'s.)
#[test]
fn pingpong_rdm_shared_receive_context() {
    let p = Programs::start_alone("lfrdx");
    let r = fi_pingpong(
        &p,
        &["-p", "verbs;ofi_rxm", "-e", "rdm"],
        &[
            ("FI_OFI_RXM_USE_SRX", "1"),
            ("SOFT_RDMA_LOG", "soft_rdma_verbs::srq=debug"),
        ],
    );
    r.assert_success();
    for side in [&r.client, &r.server] {
        side.assert_prints("ibv_create_srq");
    }
    sizes_checked(&r.client);
    p.assert_in_force();
}

/// `FI_OFI_RXM_USE_RNDV_WRITE=1`: rendezvous by RDMA Write. Fails from the 64 KiB size on, differently
/// each run (a Write to an STag that is payload bytes, "Message truncated", a flushed receive, a
/// segmentation fault in libfabric at exit); RxM 1.17's `rxm_rndv_handle_wr_data` carries an upstream
/// "BUG:" comment on its state handling. It fails between two kernel siw ends too, from 256 KiB
/// (docs/running-rdma-programs.md, libfabric).
#[test]
#[ignore = "RxM's rendezvous by Write fails from 64 KiB (docs/running-rdma-programs.md, libfabric)"]
fn pingpong_rdm_rendezvous_by_write() {
    let p = Programs::start_alone("lfrdw");
    let r = fi_pingpong(
        &p,
        &["-p", "verbs;ofi_rxm", "-e", "rdm"],
        &[("FI_OFI_RXM_USE_RNDV_WRITE", "1")],
    );
    r.assert_success();
    sizes_checked(&r.client);
}
