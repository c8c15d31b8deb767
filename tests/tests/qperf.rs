//! Debian's unmodified qperf 0.4.11 over rdma_cm (`-cm1`) on soft-rdma's drop-in `libibverbs.so.1`/
//! `librdmacm.so.1`, between two namespaces (`soft-rdma run`), in the transport mode
//! `$SOFT_RDMA_TEST_TRANSPORT` gives (`kernel`, `xdp`, `mixed`; `cargo xtask test` runs all three).
//!
//! The five tests iWARP can serve (`rc_bw`, `rc_lat`, `rc_rdma_read_bw`, `rc_rdma_read_lat`,
//! `rc_rdma_write_poll_lat`) each run for a second and print their figures; `rc_bw`'s and the RDMA Read
//! tests' servers create queue pairs with a zero-size send queue, which rdma-core takes (kernel siw refuses
//! it). What iWARP cannot do (atomics: `rc_compare_swap_mr`, `rc_fetch_add_mr`; UD: `ud_bw`; Write with
//! Immediate: `rc_rdma_write_bw`) ends with qperf's own message, within the harness's deadline and with no
//! crash. The tests assert on exit codes and that a figure line is printed, never on figures. Needs root,
//! the binaries and the library (`cargo build -p soft-rdma-user --all-features --bins`,
//! `cargo build -p soft-rdma-verbs`) and Debian's qperf (`cargo xtask setup`).

use soft_rdma_tests::qperf::{Run, run};
use soft_rdma_tests::rdma_core::Programs;

/// A fresh pair, `qperf -cm1 -t 1 args… B tests…` on it, and (if the client succeeded) the check that the
/// connection went the mode's way.
fn qperf(tag: &str, args: &[&str], tests: &[&str]) -> Run {
    let p = Programs::start_alone(tag);
    let r = run(&p, args, tests);
    if r.client.success() {
        p.assert_in_force();
    }
    r
}

// ---- the five tests iWARP can serve ----

/// `rc_bw`: 1 MiB Sends against a server whose queue pair has a zero-size send queue (`rd_server_def`).
///
/// 1 MiB, not qperf's 64 KiB: iWARP has no receiver-not-ready retry (RFC 5041 §7.2), so a Send that finds
/// no Receive posted ends the connection (a Terminate, then WR_FLUSH_ERR at the client: "rc_bw failed: WR
/// flush failure"), on siw and hardware iWARP as on soft-rdma. qperf's server keeps 1024 Receives posted
/// and reposts after each poll; on this loaded 2-core machine, with 64 KiB messages, its thread is now and
/// then off the CPU for the 64 MiB the client sends meanwhile. With 1 MiB messages that would take 1 GiB.
#[test]
fn rc_bw_runs() {
    qperf("qpbw", &["-m", "1M"], &["rc_bw"]).assert_figures(&["rc_bw"]);
}

/// `rc_lat`: a Send/Receive ping-pong of one byte.
#[test]
fn rc_lat_runs() {
    qperf("qplt", &[], &["rc_lat"]).assert_figures(&["rc_lat"]);
}

/// `rc_rdma_read_bw`: 64 KiB RDMA Reads from an idle server with a zero-size send queue (`rd_server_nop`).
#[test]
fn rc_rdma_read_bw_runs() {
    qperf("qprb", &["-m", "64K"], &["rc_rdma_read_bw"]).assert_figures(&["rc_rdma_read_bw"]);
}

/// `rc_rdma_read_lat`: one RDMA Read at a time against the same idle server.
#[test]
fn rc_rdma_read_lat_runs() {
    qperf("qprl", &[], &["rc_rdma_read_lat"]).assert_figures(&["rc_rdma_read_lat"]);
}

/// `rc_rdma_write_poll_lat`: RDMA Writes both ways, arrival seen by polling the buffer's last byte.
#[test]
fn rc_rdma_write_poll_lat_runs() {
    qperf("qpwp", &[], &["rc_rdma_write_poll_lat"]).assert_figures(&["rc_rdma_write_poll_lat"]);
}

// ---- what iWARP cannot do: qperf's own message, no hang, no crash ----

/// Atomics: soft-rdma's device reports no atomic capability and refuses the post (EINVAL), as the
/// rdma-core siw provider does (`push_send_wqe`).
#[test]
fn compare_and_swap_ends_with_qperfs_message() {
    qperf("qpcs", &[], &["rc_compare_swap_mr"]).assert_refused(&["failed to post compare and swap"]);
}

#[test]
fn fetch_and_add_ends_with_qperfs_message() {
    qperf("qpfa", &[], &["rc_fetch_add_mr"]).assert_refused(&["failed to post fetch and add"]);
}

/// UD: iWARP has reliable connections only. qperf's `-cm1` UD ids are RDMA_PS_UDP, which soft-rdma's
/// `rdma_create_id` refuses (ENOSYS; the kernel takes the id and siw refuses the UD queue pair, EOPNOTSUPP).
/// Whichever side fails first tells the other: the client prints its own failure ("failed to create QP" or
/// "rdma_create_id failed") or the server's, after "server:" (qperf 0.4.11 sends it as TCP urgent data and
/// now and then loses the text).
#[test]
fn ud_ends_with_qperfs_message() {
    qperf("qpud", &[], &["ud_bw"]).assert_refused(&[
        "failed to create QP",
        "rdma_create_id failed",
        "server:",
    ]);
}

/// `rc_rdma_write_bw` posts RDMA Write with Immediate, which iWARP (RFC 5040) has not; refused at the post,
/// as the rdma-core siw provider refuses it.
#[test]
fn write_with_immediate_ends_with_qperfs_message() {
    qperf("qpwi", &["-m", "64K"], &["rc_rdma_write_bw"])
        .assert_refused(&["failed to post rdma write with immediate"]);
}
