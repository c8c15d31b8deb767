//! Debian's unmodified libfabric 1.17 (`libfabric-bin`: `fi_info`, `fi_pingpong`) on soft-rdma's drop-in
//! `libibverbs.so.1`/`librdmacm.so.1`, between two namespaces, in the transport mode
//! `$SOFT_RDMA_TEST_TRANSPORT` gives (`kernel`, `xdp`, `mixed`; `cargo xtask test` runs all three).
//!
//! libfabric's verbs provider sees soft-rdma as an iWARP device (`fi_info` lists `softrdma0` on fabric
//! "Ethernet-iWARP"). `fi_pingpong` runs with data checking (`-c`) over every size (`-S all`, its
//! default), on the provider's MSG endpoints (`-p verbs -e msg`) and on RxM's RDM endpoints over them
//! (`-p "verbs;ofi_rxm" -e rdm`), whose messages above 128 KiB go by rendezvous: an RDMA Read by default,
//! RDMA Writes with `FI_OFI_RXM_USE_RNDV_WRITE=1`. fi_pingpong's own control connection is a TCP socket on
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

#[test]
fn pingpong_rdm_checks_every_size() {
    let p = Programs::start_alone("lfrdm");
    let r = fi_pingpong(&p, &["-p", "verbs;ofi_rxm", "-e", "rdm"], &[]);
    r.assert_success();
    sizes_checked(&r.client);
    p.assert_in_force();
}

#[test]
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

#[test]
fn pingpong_rdm_tagged() {
    let p = Programs::start_alone("lfrdt");
    let r = fi_pingpong(&p, &["-p", "verbs;ofi_rxm", "-e", "rdm", "-m", "tagged"], &[]);
    r.assert_success();
    sizes_checked(&r.client);
}
