//! Debian's unmodified fio 3.33 with `ioengine=rdma` on soft-rdma's drop-in `libibverbs.so.1` and
//! `librdmacm.so.1`, between two namespaces (`soft-rdma run`), in the transport mode
//! `$SOFT_RDMA_TEST_TRANSPORT` gives (`kernel`, `xdp`, `mixed`; `cargo xtask test` runs all three).
//!
//! Each verb fio's engine has (`--verb=write`, `read`, `send`) runs 4 MiB in 64 KiB blocks: the server
//! (`--rw=read`) in B, the client (`--rw=write`) in A, both with `--thread`; both ends exit 0 and their job
//! summaries say `err= 0`. Data is verified where fio can verify it: with `--verb=send` the blocks land in
//! the server's own buffers, in order, so the client writes fio's verify headers (`--verify=crc32c
//! --do_verify=0`, and `--verify_state_save=0`: no state file left behind) and the server checks each block
//! it receives (`--verify=crc32c`); a client that sends another pattern fails the server's check
//! (`err=84`), which shows the check is real. With `write` and `read` the client moves data to or from a
//! random one of the server's buffers (`fio_rdmaio_send`), which the server never looks at, so fio has
//! nothing to verify.
//!
//! `--verb=send`: the server's `--iodepth` covers the whole run (64 receives for 64 blocks). iWARP has no
//! receiver-not-ready retry (RFC 5041 §7.2) and a Send completes at its sender once it is on the wire, so a
//! client may run ahead of a server that reposts its receives late; its Send then finds no receive, the
//! connection ends with a Terminate and both ends' requests flush (fio: "cq completion status 5(Work Request
//! Flushed Error)"), on siw as on soft-rdma. fio 3.33 then waits for another completion event forever
//! (`fio_rdmaio_getevents`: `goto again` after an error), the hang of issue 43. The tests assert on exit
//! codes and `err=`, never on figures. Needs root, the binaries and the library (`cargo build -p
//! soft-rdma-user --all-features --bins`, `cargo build -p soft-rdma-verbs`) and Debian's fio (`cargo xtask
//! setup`).

use soft_rdma_tests::fio::{Pair, run};
use soft_rdma_tests::rdma_core::Programs;

/// The port fio's server listens on.
const PORT: u16 = 18520;

/// What both ends move: 4 MiB in 64 KiB blocks.
const BLOCKS: [&str; 2] = ["--bs=64k", "--size=4m"];

/// A fresh pair, fio's server and client on it, and (if the client succeeded) the check that the connection
/// went the mode's way.
fn fio(tag: &str, verb: &str, server: &[&str], client: &[&str]) -> Pair {
    let p = Programs::start_alone(tag);
    let r = run(&p, PORT, verb, server, client);
    if r.client.success() {
        p.assert_in_force();
    }
    r
}

/// `BLOCKS` and `more`.
fn with(more: &[&'static str]) -> Vec<&'static str> {
    [&BLOCKS[..], more].concat()
}

#[test]
fn verb_write_runs() {
    let o = with(&["--iodepth=4"]);
    fio("fiow", "write", &o, &o).assert_success();
}

#[test]
fn verb_read_runs() {
    let o = with(&["--iodepth=4"]);
    fio("fior", "read", &o, &o).assert_success();
}

#[test]
fn verb_send_runs_and_the_server_verifies_each_block() {
    fio(
        "fios",
        "send",
        &with(&["--iodepth=64", "--verify=crc32c"]),
        &with(&[
            "--iodepth=4",
            "--verify=crc32c",
            "--do_verify=0",
            "--verify_state_save=0",
        ]),
    )
    .assert_success();
}

/// The negative of the test above: blocks without fio's verify headers fail the server's check.
#[test]
fn verb_send_with_other_data_fails_the_servers_verify() {
    let r = fio(
        "fiov",
        "send",
        &with(&["--iodepth=64", "--verify=crc32c"]),
        &with(&["--iodepth=4", "--buffer_pattern=0x55aa", "--do_verify=0"]),
    );
    assert!(r.client.success(), "{}\n{}", r.client, r.server);
    assert_eq!(r.server.code(), Some(1), "{}", r.server);
    r.server
        .assert_prints("err=84")
        .assert_prints("verify: bad magic header");
}

/// A deeper queue and a longer run: 16 MiB, 32 requests in flight on each end.
#[test]
fn verb_write_with_a_deeper_queue() {
    let o = ["--bs=64k", "--size=16m", "--iodepth=32"];
    fio("fiod", "write", &o, &o).assert_success();
}
