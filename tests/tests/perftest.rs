//! Debian's unmodified perftest 4.5 on soft-rdma's drop-in `libibverbs.so.1`/`librdmacm.so.1`, between two
//! namespaces (`soft-rdma run`, rdma_cm: `-R`), in the transport mode `$SOFT_RDMA_TEST_TRANSPORT` gives
//! (`kernel`, `xdp`, `mixed`; `cargo xtask test` runs all three).
//!
//! Each of the six tests (`ib_send_bw`, `ib_write_bw`, `ib_read_bw`, `ib_send_lat`, `ib_write_lat`,
//! `ib_read_lat`) runs once, short; then the options perftest users vary: sizes (`-a`, `-s`), TX depth
//! (`-t`), iterations and duration (`-n`, `-D`), bidirectional (`-b`), several QPs (`-q`), inline sizes
//! (`-I`), `--report_gbits`. What iWARP cannot serve (atomics, UD, UC) fails with perftest's own message.
//! The tests assert on exit codes and results rows, never on figures: `cargo xtask bench --only perftest`
//! measures. Needs root, the binaries and the library (`cargo build -p soft-rdma-user --all-features --bins`,
//! `cargo build -p soft-rdma-verbs`) and Debian's perftest (`cargo xtask setup`).

use soft_rdma_tests::perftest::{Pair, run, run_refused};
use soft_rdma_tests::rdma_core::Programs;

/// A fresh pair, `program args…` on it, and the check that the connection went the mode's way.
fn pair(tag: &str, program: &str, args: &[&str]) -> Pair {
    let p = Programs::start_alone(tag);
    let r = run(&p, program, 18515, args);
    if r.client.success() {
        p.assert_in_force();
    }
    r
}

// ---- the six tests, one short run each ----

#[test]
fn ib_write_bw_runs() {
    pair("ptwb", "ib_write_bw", &["-s", "65536", "-n", "200"])
        .assert_success()
        .assert_rows(&[65536], Some(200));
}

#[test]
fn ib_read_bw_runs() {
    pair("ptrb", "ib_read_bw", &["-s", "65536", "-n", "200"])
        .assert_success()
        .assert_rows(&[65536], Some(200));
}

#[test]
fn ib_send_bw_runs() {
    pair("ptsb", "ib_send_bw", &["-s", "65536", "-n", "200"])
        .assert_success()
        .assert_rows(&[65536], Some(200));
}

#[test]
fn ib_send_lat_runs() {
    pair("ptsl", "ib_send_lat", &["-s", "64", "-n", "200"])
        .assert_success()
        .assert_rows(&[64], Some(200));
}

#[test]
fn ib_write_lat_runs() {
    pair("ptwl", "ib_write_lat", &["-s", "64", "-n", "200"])
        .assert_success()
        .assert_rows(&[64], Some(200));
}

#[test]
fn ib_read_lat_runs() {
    pair("ptrl", "ib_read_lat", &["-s", "64", "-n", "200"])
        .assert_success()
        .assert_rows(&[64], Some(200));
}

// ---- the options users vary ----

/// `-a`: every power of two from 2 B to 8 MiB (perftest 4.5, `MAX_SIZE` 2^23), a few iterations each.
#[test]
fn all_sizes_with_a() {
    let sizes: Vec<u64> = (1..=23).map(|i| 1u64 << i).collect();
    pair("ptas", "ib_write_bw", &["-a", "-n", "5"])
        .assert_success()
        .assert_rows(&sizes, Some(5));
}

/// `-a` on a latency test, where perftest stops at 8 MiB too; a short range of iterations.
#[test]
fn all_sizes_on_read_lat() {
    let sizes: Vec<u64> = (1..=23).map(|i| 1u64 << i).collect();
    pair("ptal", "ib_read_lat", &["-a", "-n", "5"])
        .assert_success()
        .assert_rows(&sizes, Some(5));
}

/// `-s` at a size that is no power of two, and `-t 16` (16 Writes in flight).
#[test]
fn odd_size_and_tx_depth() {
    pair("pttd", "ib_write_bw", &["-s", "12345", "-t", "16", "-n", "300"])
        .assert_success()
        .assert_rows(&[12345], Some(300));
}

/// `-D 1`: a run of one second instead of a count; the row's iteration count is whatever was done.
#[test]
fn duration_instead_of_iterations() {
    pair("ptdu", "ib_send_bw", &["-s", "4096", "-D", "1"])
        .assert_success()
        .assert_rows(&[4096], None);
}

/// `-D 1` on a latency test.
#[test]
fn duration_on_write_lat() {
    pair("ptdl", "ib_write_lat", &["-s", "64", "-D", "1"])
        .assert_success()
        .assert_rows(&[64], None);
}

/// `-b`: both sides send; each prints its row.
#[test]
fn bidirectional_write() {
    let r = pair("ptbw", "ib_write_bw", &["-b", "-s", "65536", "-n", "200"]);
    r.assert_success().assert_rows(&[65536], Some(200));
    assert_eq!(r.rows(true).len(), 1, "the server's row:\n{}", r.server);
}

/// `-b` with Sends (the receiver's credits both ways).
#[test]
fn bidirectional_send() {
    let r = pair("ptbs", "ib_send_bw", &["-b", "-s", "65536", "-n", "200"]);
    r.assert_success().assert_rows(&[65536], Some(200));
    assert_eq!(r.rows(true).len(), 1, "the server's row:\n{}", r.server);
}

/// `-q 4`: four queue pairs (four rdma_cm connections) at once; perftest's row counts the iterations of all
/// four (4 × 200).
#[test]
fn four_queue_pairs() {
    pair("ptq4", "ib_write_bw", &["-q", "4", "-s", "65536", "-n", "200"])
        .assert_success()
        .assert_rows(&[65536], Some(800));
}

/// `-q 4` with Reads.
#[test]
fn four_queue_pairs_read() {
    pair("ptq4r", "ib_read_bw", &["-q", "4", "-s", "65536", "-n", "200"])
        .assert_success()
        .assert_rows(&[65536], Some(800));
}

/// `-I 64`: perftest 4.5 takes an inline size only for the devices of its own table (`ib_dev_name` in
/// `src/perftest_parameters.c`, `ctx_set_max_inline`); on any other, siw included, it says so and runs
/// without inline data. The run goes on and says why.
#[test]
fn inline_send_lat() {
    let r = pair("ptil", "ib_send_lat", &["-I", "64", "-s", "64", "-n", "200"]);
    r.assert_success().assert_rows(&[64], Some(200));
    assert_inline_disabled(&r);
}

/// `-I 128` on a Write bandwidth test.
#[test]
fn inline_write_bw() {
    let r = pair("ptiw", "ib_write_bw", &["-I", "128", "-s", "128", "-n", "500"]);
    r.assert_success().assert_rows(&[128], Some(500));
    assert_inline_disabled(&r);
}

fn assert_inline_disabled(r: &Pair) {
    assert!(
        r.client
            .stderr
            .contains("Device not recognized to implement inline feature. Disabling it")
            && r.client.stdout.contains("Max inline data : 0[B]"),
        "perftest's inline message:\n{}",
        r.client
    );
}

/// `--report_gbits`: the bandwidth header in Gb/s.
#[test]
fn report_gbits() {
    let r = pair(
        "ptgb",
        "ib_read_bw",
        &["--report_gbits", "-s", "65536", "-n", "100"],
    );
    r.assert_success().assert_rows(&[65536], Some(100));
    assert!(r.client.stdout.contains("BW average[Gb/sec]"), "{}", r.client);
}

// ---- what iWARP cannot serve: perftest's own message, a failed exit ----

/// Both sides exit non-zero, and one prints `message` (perftest's own words).
fn refused(tag: &str, program: &str, args: &[&str], message: &str) {
    let p = Programs::start_alone(tag);
    let r = run_refused(&p, program, 18515, args);
    assert!(
        !r.client.success() && r.client.crash_signal().is_none(),
        "the client should fail (not crash):\n{}",
        r.client
    );
    assert!(
        r.server.crash_signal().is_none() && !r.server.success(),
        "the server should fail or be stopped:\n{}",
        r.server
    );
    let both = format!(
        "{}{}{}{}",
        r.client.stdout, r.client.stderr, r.server.stdout, r.server.stderr
    );
    assert!(
        both.contains(message),
        "no {message:?} in\n{}\n{}",
        r.client,
        r.server
    );
}

/// Atomics: soft-rdma's device has `atomic_cap` NONE. A region asking IBV_ACCESS_REMOTE_ATOMIC is registered
/// without it, as kernel siw does, and the atomic work request itself is refused at the post (EINVAL, as
/// rdma-core's siw provider refuses it).
#[test]
fn atomics_are_refused() {
    refused("ptat", "ib_atomic_bw", &["-n", "10"], "Couldn't post send");
}

/// UD: librdmacm's RDMA_PS_UDP is InfiniBand's (`rdma_create_id`: ENOSYS).
#[test]
fn ud_is_refused() {
    refused(
        "ptud",
        "ib_send_bw",
        &["-c", "UD", "-n", "10"],
        "Failed to create RDMA CM ID",
    );
}

/// UC: perftest itself refuses it over rdma_cm.
#[test]
fn uc_is_refused() {
    refused(
        "ptuc",
        "ib_send_bw",
        &["-c", "UC", "-n", "10"],
        "UC is not supported in librdmacm",
    );
}
