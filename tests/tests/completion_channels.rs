//! Programs that sleep on a completion channel (`ibv_get_cq_event`, `ibv_req_notify_cq`, `ibv_poll_cq`
//! until empty, `ibv_ack_cq_events`) under load: fio's rdma engine (middleware.md §4) moves its whole size
//! with 16 RDMA Writes or Reads of 64 KiB in flight, and every one of them completes through the channel.
//! Correctness only (exit codes, fio's `err=` and its byte and I/O counts): the speed of this path is
//! measured by `cargo xtask bench`, never asserted here.
//!
//! The daemons' transports follow `$SOFT_RDMA_TEST_TRANSPORT` (`kernel`, `xdp`, `mixed`). Needs root, the
//! binaries (`cargo build -p soft-rdma-user --all-features --bins`), the library (`cargo build -p
//! soft-rdma-verbs`) and fio (`cargo xtask setup`).

use soft_rdma_tests::Side::{A, B};
use soft_rdma_tests::rdma_core::{Outcome, Programs};

/// The I/O size and count of each run: 64 KiB I/Os, 16 in flight, 512 of them (32 MiB).
const BS: &str = "64k";
const SIZE: &str = "32m";
const IOS: usize = 512;

/// fio's server (`rw=read`, which posts its buffers and waits for the client's last message) on B, its
/// client (`rw=write` with `verb`) on A; both must exit 0 with `err= 0`, and the client must report every
/// byte and every I/O issued.
fn fio(tag: &str, port: u16, verb: &str) {
    let p = Programs::start_alone(tag);
    let b = p.ip(B).to_string();
    let (host, port) = (format!("--hostname={b}"), format!("--port={port}"));
    // fio takes an engine's options (`--hostname`, `--verb`, …) only after `--ioengine`.
    let common = [
        "--ioengine=rdma",
        &host,
        &port,
        "--bs",
        BS,
        "--size",
        SIZE,
        "--iodepth=16",
        "--thread",
    ];
    let mut server_args = vec!["--name=server", "--rw=read"];
    server_args.extend(common);
    let mut server = p.spawn(B, "fio", &server_args);
    // fio's server says nothing when it listens: it holds a listener on the daemon's port space once it does.
    p.wait_listening(B, port[7..].parse().expect("a port"), &mut server);
    let verb_arg = format!("--verb={verb}");
    let mut client_args = vec!["--name=client", "--rw=write"];
    client_args.extend(common);
    client_args.push(&verb_arg);
    let client = p.run(A, "fio", &client_args);
    let server = server.wait_after(&client);
    client.assert_success();
    server.assert_success();
    for out in [&client, &server] {
        assert!(out.text().contains("err= 0"), "fio reported an error: {out}");
    }
    assert_all_issued(&client);
    p.assert_in_force();
}

/// fio's `issued rwts: total=0,N,…` line says how many writes the job issued (verb=read issues "writes" too:
/// the client's rw is write); its `WRITE: … io=…` line how many bytes completed.
fn assert_all_issued(client: &Outcome) {
    let issued = client
        .lines_with("issued rwts: total=")
        .first()
        .and_then(|l| l.split("total=").nth(1))
        .and_then(|t| t.split(',').nth(1))
        .and_then(|n| n.trim().parse::<usize>().ok());
    assert_eq!(issued, Some(IOS), "every I/O issued: {client}");
    assert!(client.text().contains("io=32.0MiB"), "every byte moved: {client}");
}

#[test]
fn fio_rdma_writes_complete_through_the_completion_channel() {
    fio("ccfw", 7181, "write");
}

#[test]
fn fio_rdma_reads_complete_through_the_completion_channel() {
    fio("ccfr", 7182, "read");
}
