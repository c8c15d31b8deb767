//! Debian's unmodified libfabric 1.17 (`libfabric-bin`: `fi_info`, `fi_pingpong`) on soft-rdma's drop-in
//! `libibverbs.so.1`/`librdmacm.so.1`, between two namespaces, in the transport mode
//! `$SOFT_RDMA_TEST_TRANSPORT` gives (`kernel`, `xdp`, `mixed`; `cargo xtask test` runs all three).
//!
//! libfabric's verbs provider sees soft-rdma as an iWARP device (`fi_info` lists `softrdma0` on fabric
//! "Ethernet-iWARP"). `fi_pingpong` runs with data checking (`-c`) over every size (`-S all`, its
//! default), on the provider's MSG endpoints (`-p verbs -e msg`) and on RxM's RDM endpoints over them
//! (`-p "verbs;ofi_rxm" -e rdm`, plain and tagged), whose messages above 128 KiB go by rendezvous, an RDMA
//! Read. RxM needs `FI_UNIVERSE_SIZE=4` (its completion queue otherwise exceeds soft-rdma's `max_cqe`; a
//! test checks the message without it); its rendezvous by RDMA Write (`FI_OFI_RXM_USE_RNDV_WRITE=1`) fails
//! and is ignored. fi_pingpong's own control connection is a TCP socket on
//! port 47592 (the kernel's, beside soft-rdma's). The tests assert on exit codes and fi_pingpong's results
//! rows, never on figures. Needs root, the binaries and the library (`cargo build --workspace --bins`,
//! `cargo build -p soft-rdma-verbs`) and Debian's libfabric-bin (`cargo xtask setup`).

use soft_rdma_tests::Side::A;
use soft_rdma_tests::libfabric::{fi_pingpong, fi_pingpong_refused, sizes_checked};
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

/// RxM sizes its MSG endpoints' completion queue from the universe size: 256 peers × 1024 entries
/// (`FI_UNIVERSE_SIZE`), 262144, more than soft-rdma's `max_cqe` of 4096 (siw allows 3276800). With
/// `FI_UNIVERSE_SIZE=4` the queue is 4096 entries.
const UNIVERSE: (&str, &str) = ("FI_UNIVERSE_SIZE", "4");

#[test]
fn pingpong_rdm_checks_every_size() {
    let p = Programs::start_alone("lfrdm");
    let r = fi_pingpong(&p, &["-p", "verbs;ofi_rxm", "-e", "rdm"], &[UNIVERSE]);
    r.assert_success();
    sizes_checked(&r.client);
    p.assert_in_force();
}

#[test]
fn pingpong_rdm_tagged() {
    let p = Programs::start_alone("lfrdt");
    let r = fi_pingpong(
        &p,
        &["-p", "verbs;ofi_rxm", "-e", "rdm", "-m", "tagged"],
        &[UNIVERSE],
    );
    r.assert_success();
    sizes_checked(&r.client);
}

/// Without `FI_UNIVERSE_SIZE`, RxM asks for a completion queue of 262144 entries: the verbs provider's own
/// message (`FI_LOG_LEVEL=warn`), and fi_pingpong's, on the server (the client then loses its control connection).
#[test]
fn pingpong_rdm_default_universe_is_over_max_cqe() {
    let p = Programs::start_alone("lfrdu");
    let r = fi_pingpong_refused(
        &p,
        &["-p", "verbs;ofi_rxm", "-e", "rdm"],
        &[("FI_LOG_LEVEL", "warn")],
    );
    assert!(!r.server.success(), "{}", r.server);
    r.server.assert_prints("Unable to create verbs CQ");
    r.server
        .assert_prints("fi_enable(): util/pingpong.c:1551, ret=-22 (Invalid argument)");
}

/// `FI_OFI_RXM_USE_RNDV_WRITE=1`: rendezvous by RDMA Write. Fails from the 64 KiB size on, differently
/// each run (a Write to an STag that is payload bytes, "Message truncated", a flushed receive, a
/// segmentation fault in libfabric at exit); RxM 1.17's `rxm_rndv_handle_wr_data` carries an upstream
/// "BUG:" comment on its state handling. Not yet known whether siw passes it.
#[test]
#[ignore = "RxM's rendezvous by Write fails from 64 KiB (docs/running-rdma-programs.md, libfabric)"]
fn pingpong_rdm_rendezvous_by_write() {
    let p = Programs::start_alone("lfrdw");
    let r = fi_pingpong(
        &p,
        &["-p", "verbs;ofi_rxm", "-e", "rdm"],
        &[UNIVERSE, ("FI_OFI_RXM_USE_RNDV_WRITE", "1")],
    );
    r.assert_success();
    sizes_checked(&r.client);
}
