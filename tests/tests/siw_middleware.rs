//! The RDMA software people run, between soft-rdma and Linux kernel siw, both ways: libfabric's verbs
//! providers (`fi_pingpong`, MSG and RxM's RDM, data checked) and qperf over rdma_cm (`-cm1`), each with its
//! server on siw in the VM and its client on soft-rdma's drop-in libraries on the host, then the reverse. The
//! programs are Debian bookworm's, unmodified, on both ends (`interop/build-image.sh` puts libfabric 1.17 and
//! qperf 0.4.11 in the VM). Every scenario runs with soft-rdmad in kernel-TCP mode and in XDP mode
//! (`soft_rdma_tests::siw_host`), and ends with the capture and steering checks of `siw_interop.rs`.
//!
//! The tests are `#[ignore]`d in the ordinary run: they need the VM image. `cargo xtask interop` builds it
//! and runs them (`-- --ignored --test-threads=1`).

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use soft_rdma_tests::both_modes;
use soft_rdma_tests::rdma_core::{DEADLINE, Outcome, Running};
use soft_rdma_tests::siw;
use soft_rdma_tests::siw_host::{Host, Mode, host};

both_modes!(
    libfabric_pingpong_both_ways,
    libfabric_pingpong_both_ways_kernel,
    libfabric_pingpong_both_ways_xdp
);
both_modes!(qperf_both_ways, qperf_both_ways_kernel, qperf_both_ways_xdp);

type VmRun = JoinHandle<anyhow::Result<(i32, String)>>;

/// Waits until a program in the host's namespace listens on TCP `port` (a program's own control
/// connection, before any RDMA listener), failing at once with the program's output if it exits first.
fn wait_host_tcp_listen(h: &Host, port: u16, server: &mut Running) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if server.has_exited() {
            panic!("the server exited before it listened: {}", server.stop());
        }
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", h.vm.ns(), "ss", "-Hltn"])
            .output()
            .expect("ss");
        let text = String::from_utf8_lossy(&out.stdout);
        if text.lines().any(|l| l.contains(&format!(":{port} "))) {
            return;
        }
        if Instant::now() > deadline {
            panic!(
                "nothing listens on TCP port {port} on the host side: {}",
                server.stop()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `program args…` as one shell line for the VM's agent, each argument quoted (libfabric's provider names
/// hold a `;`).
fn shell_line(program: &str, args: &[String]) -> String {
    let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
    format!("{program} {}", quoted.join(" "))
}

/// Starts `program args…` in the VM in the background, its pid in `/tmp/sr-NAME.pid` ([`siw::apart`]).
fn vm_spawn(h: &Host, program: &str, args: &[String], name: &str, timeout_secs: u32) -> VmRun {
    h.vm.spawn(&siw::apart(&shell_line(program, args), name), timeout_secs)
}

/// Kills the VM program started as `name`, if it still runs.
fn vm_kill(h: &Host, name: &str) {
    let _ =
        h.vm.run(&format!("kill -9 $(cat /tmp/sr-{name}.pid) 2>/dev/null"), 10);
}

/// A VM program's [`Outcome`], standard error apart.
fn vm_outcome(h: &Host, what: &str, run: VmRun) -> Outcome {
    siw::apart_outcome(&format!("{what} (VM, siw)"), h.joined(what, run))
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

/// libfabric's providers as `fi_pingpong -p` names them, with the endpoint type each serves and the message
/// size each run moves: 64 KiB Sends over MSG; 1 MiB over RDM, past RxM's eager and segmented sizes, so that
/// RxM's rendezvous moves it by RDMA Read (`FI_OFI_RXM_SAR_LIMIT`, 128 KiB by default). One size each: the
/// VM is emulated, and fi_pingpong's `-S all` (fifty sizes up to 4 MiB) outlasts the harness's deadline.
const FABRICS: [(&str, &str, &str); 2] = [("verbs", "msg", "65536"), ("verbs;ofi_rxm", "rdm", "1048576")];

/// The environment each end runs with: RxM's completion queue for 4 peers (`FI_UNIVERSE_SIZE`), as in
/// `tests/tests/libfabric.rs`.
const FI_ENV: &str = "FI_UNIVERSE_SIZE=4";

/// fi_pingpong's options for `provider`/`ep`: data checked (`-c`), messages of `size`, 10 iterations.
fn pingpong_args(provider: &str, ep: &str, size: &str) -> Vec<String> {
    strings(&["-p", provider, "-e", ep, "-c", "-I", "10", "-S", size])
}

/// A pingpong end's check: exit 0, and its table of sizes printed (a header and at least one row).
fn assert_pingpong(o: &Outcome, ep: &str) {
    assert!(o.success(), "fi_pingpong {ep}: {o}");
    assert!(
        o.stdout.contains("usec/xfer"),
        "fi_pingpong {ep}: no results table: {o}"
    );
}

/// Whether siw's fi_pingpong failed the way siw's close race fails it ([`assert_pingpong_pair`]).
fn siw_lost_its_close_race(siw: &Outcome) -> bool {
    !siw.success() && siw.stderr.contains("cq_readerr: local QP operation error")
}

/// Both ends' check, with siw's close race allowed for: siw 6.1 fails the operation it is still sending
/// when the peer's FIN arrives (`siw_qp_sq_proc_tx`, docs/interop.md), and soft-rdma's end, done, closes
/// within a millisecond of siw's last message. siw's end then reports a local QP operation error after the
/// exchange; soft-rdma's end must have exited 0, which, with `-c`, it does only once every message it
/// received was checked.
fn assert_pingpong_pair(siw: &Outcome, ours: &Outcome, ep: &str) {
    assert_pingpong(ours, ep);
    if siw_lost_its_close_race(siw) {
        println!(
            "NOTE: siw's fi_pingpong ({ep}) failed its last operation as soft-rdma's end closed (siw's close \
             race); soft-rdma's end checked every message and exited 0:\n{siw}"
        );
        return;
    }
    assert_pingpong(siw, ep);
}

/// `fi_pingpong -c` (data checked), 10 iterations, for libfabric's verbs provider (MSG endpoints: Send and
/// Receive over an rdma_cm connection) and RxM over it (RDM endpoints, whose large messages move by RDMA
/// Read), with the server on siw and the client on soft-rdma, then the reverse.
async fn libfabric_pingpong_both_ways(mode: Mode) {
    let mut h = host("lf", "", &[], mode).await;
    h.vm.start_capture("libfabric").unwrap();
    let (vm, me) = (h.vm.vm_ip().to_string(), h.vm.host_ip().to_string());
    let mut port = 47600u16;
    for (provider, ep, size) in FABRICS {
        // The server on siw, the client on soft-rdma.
        let mut server_args = pingpong_args(provider, ep, size);
        server_args.extend(strings(&["-B", &port.to_string()]));
        let name = format!("fi-{port}");
        let server = vm_spawn(&h, &format!("{FI_ENV} fi_pingpong"), &server_args, &name, 120);
        h.vm.wait_listening(port).unwrap();
        let mut client_args = pingpong_args(provider, ep, size);
        client_args.extend(strings(&["-P", &port.to_string(), &vm]));
        let client_args: Vec<&str> = [FI_ENV, "fi_pingpong"]
            .into_iter()
            .chain(client_args.iter().map(String::as_str))
            .collect();
        let client = h.rdma_core("env", &client_args).wait(DEADLINE);
        if !client.success() {
            vm_kill(&h, &name);
        }
        let server = vm_outcome(&h, &format!("fi_pingpong {ep} server"), server);
        println!("fi_pingpong {provider} {ep}, server on siw:\n{}", client.stdout);
        assert_pingpong_pair(&server, &client, ep);
        port += 1;
        // The server on soft-rdma, the client on siw.
        let mut server_args = pingpong_args(provider, ep, size);
        server_args.extend(strings(&["-B", &port.to_string()]));
        let server_args: Vec<&str> = [FI_ENV, "fi_pingpong"]
            .into_iter()
            .chain(server_args.iter().map(String::as_str))
            .collect();
        let mut server = h.rdma_core("env", &server_args);
        wait_host_tcp_listen(&h, port, &mut server);
        let mut client_args = pingpong_args(provider, ep, size);
        client_args.extend(strings(&["-P", &port.to_string(), &me]));
        let name = format!("fi-{port}");
        let client = vm_outcome(
            &h,
            &format!("fi_pingpong {ep} client"),
            vm_spawn(&h, &format!("{FI_ENV} fi_pingpong"), &client_args, &name, 120),
        );
        // A client that failed only in siw's close race had everything from the server, which then finishes
        // by itself: it is waited for, not stopped.
        let server = if siw_lost_its_close_race(&client) {
            server.wait(DEADLINE)
        } else {
            server.wait_after(&client)
        };
        println!(
            "fi_pingpong {provider} {ep}, server on soft-rdma:\n{}",
            client.stdout
        );
        assert_pingpong_pair(&client, &server, ep);
        port += 1;
    }
    // One rdma_cm connection per run.
    h.check_capture("libfabric", 4);
    h.check_steering("libfabric", true).await;
}

/// The one siw can run on either end: every other test's client or server asks for a queue pair with no
/// send queue (the `rc_bw` and `rc_rdma_read_*` servers) or no receive queue (their clients, and both ends
/// of `rc_rdma_write_poll_lat`), which kernel siw refuses (`siw_create_qp`: EINVAL; qperf prints "failed to
/// create QP: Invalid argument") and soft-rdma, like rdma-core's other providers, takes. Those four run
/// between two soft-rdma ends (`tests/tests/qperf.rs`).
const QPERF_ON_SIW: [&str; 1] = ["rc_lat"];

/// qperf's control port (qperf.c's default).
const QPERF_PORT: u16 = 19765;

/// `qperf -cm1 -t 1 -to 30 TESTS…` against `server`: 30 s for each exchange over qperf's own TCP connection
/// (5 s by default), as the VM is emulated and shares two CPUs with the host.
fn qperf_args(server: &str, tests: &[&str]) -> Vec<String> {
    let mut args = strings(&[server, "-cm1", "-t", "1", "-to", "30"]);
    args.extend(tests.iter().map(|t| (*t).to_owned()));
    args
}

/// Each test's result as qperf prints it: the test's name and a colon on a line of their own, then its
/// figures.
fn assert_qperf_results(client: &Outcome, tests: &[&str]) {
    assert!(client.success(), "qperf: {client}");
    for t in tests {
        assert!(
            client.stdout.lines().any(|l| l.trim() == format!("{t}:")),
            "qperf: no result for {t}: {client}"
        );
    }
}

/// How long the VM holds each segment qperf's server sends on its control connection. qperf 0.4.11's
/// server tells its client the rdma_cm port (`send_mesg`) *before* it calls `rdma_listen` (`cm_open_server`;
/// upstream moved the message after the listen in "Fix rdmacm race", 118a571, after 0.4.11), and a server in
/// the emulated VM listens milliseconds later, after a client on the host has already connected and been
/// refused ("Event rejected"). Delaying the server's control messages gives its `rdma_listen` the head start
/// the fixed qperf gives it by program order; nothing else is delayed (`tc` in the VM: a `prio` qdisc whose
/// third band is a `netem`, and a `u32` filter on the control port).
const QPERF_CONTROL_DELAY_MS: u32 = 500;

/// How many times a qperf test whose connection was still refused is tried (a VM descheduled for longer than
/// [`QPERF_CONTROL_DELAY_MS`] between the message and the listen); a test refused every time fails.
const QPERF_TRIES: usize = 3;

/// Whether a qperf client met its server's listen race (the connection refused).
fn qperf_refused(client: &Outcome) -> bool {
    client
        .stdout
        .contains("unexpected event from RDMA CM: Event rejected")
}

/// Holds what the VM sends from TCP port `port` for `ms` milliseconds ([`QPERF_CONTROL_DELAY_MS`]).
/// iproute2's `tc` by its path: the VM's busybox shell runs its own applets first, and busybox's `tc` has no
/// netem.
fn delay_vm_segments_from(h: &Host, port: u16, ms: u32) {
    let tc = "/usr/sbin/tc";
    let cmd = format!(
        "{tc} qdisc replace dev eth0 root handle 1: prio && \
         {tc} qdisc replace dev eth0 parent 1:3 handle 30: netem delay {ms}ms && \
         {tc} filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip sport {port} 0xffff flowid 1:3"
    );
    let (code, out) = h.vm.run(&cmd, 30).expect("the VM's agent");
    assert_eq!(code, 0, "tc in the VM: {out}");
}

/// qperf on soft-rdma against qperf on siw, the server in the VM: each test in a run of its own, a refused
/// one again ([`QPERF_TRIES`]). Then the server's outcome.
fn qperf_client_on_soft_rdma(h: &Host, tests: &[&str]) -> (Vec<Outcome>, Outcome) {
    let server = vm_spawn(h, "qperf", &[], "qperf-server", 300);
    h.vm.wait_listening(QPERF_PORT).unwrap();
    let mut runs = Vec::new();
    for t in tests {
        let args = qperf_args(&h.vm.vm_ip().to_string(), &[t]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut tries = 0;
        let client = loop {
            tries += 1;
            let client = h.rdma_core("qperf", &args).wait(Duration::from_secs(120));
            if !qperf_refused(&client) || tries == QPERF_TRIES {
                break client;
            }
            println!(
                "NOTE: {t}: siw's qperf server listened after its client connected (qperf 0.4.11's race)"
            );
        };
        assert!(
            !qperf_refused(&client),
            "{t}: siw's qperf server refused its client {QPERF_TRIES} times, with its control messages held \
             {QPERF_CONTROL_DELAY_MS} ms: {client}"
        );
        runs.push(client);
    }
    // qperf's server serves until it is stopped.
    vm_kill(h, "qperf-server");
    (runs, vm_outcome(h, "qperf server", server))
}

/// qperf `-cm1` (rdma_cm connections): `rc_lat` with the server on siw and the client on soft-rdma, then the
/// reverse; last, after the capture, `rc_bw` against siw's server, which ends with siw's refusal of its
/// queue pair, printed by qperf on siw. The VM holds its qperf server's control messages
/// ([`QPERF_CONTROL_DELAY_MS`]), for qperf 0.4.11's listen race.
async fn qperf_both_ways(mode: Mode) {
    let mut h = host("qp", "", &[], mode).await;
    delay_vm_segments_from(&h, QPERF_PORT, QPERF_CONTROL_DELAY_MS);
    h.vm.start_capture("qperf").unwrap();
    // The server on siw, the client on soft-rdma.
    let (runs, server) = qperf_client_on_soft_rdma(&h, &QPERF_ON_SIW);
    for (t, client) in QPERF_ON_SIW.iter().zip(&runs) {
        println!("qperf {t}, server on siw:\n{}", client.stdout);
        assert_qperf_results(client, &[t]);
    }
    println!("siw's qperf server: {server}");
    // The server on soft-rdma, the client on siw.
    let mut server = h.rdma_core("qperf", &[]);
    wait_host_tcp_listen(&h, QPERF_PORT, &mut server);
    let client = vm_outcome(
        &h,
        "qperf client",
        vm_spawn(
            &h,
            "qperf",
            &qperf_args(&h.vm.host_ip().to_string(), &QPERF_ON_SIW),
            "qperf-client",
            200,
        ),
    );
    let server = server.stop();
    println!("qperf, server on soft-rdma:\n{}\nserver: {server}", client.stdout);
    assert_qperf_results(&client, &QPERF_ON_SIW);
    // One rdma_cm connection per test, each way.
    h.check_capture("qperf", 2 * QPERF_ON_SIW.len());
    h.check_steering("qperf", true).await;
    // rc_bw against siw's server: its server's queue pair has no send queue, which siw refuses after the
    // connection request arrived, so qperf's server ends the connection (the client sees it rejected) and
    // prints siw's refusal. One run: a refusal here is the expected end, not the listen race.
    let server = vm_spawn(&h, "qperf", &[], "qperf-server", 300);
    h.vm.wait_listening(QPERF_PORT).unwrap();
    let args = qperf_args(&h.vm.vm_ip().to_string(), &["rc_bw"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let client = h.rdma_core("qperf", &args).wait(Duration::from_secs(120));
    vm_kill(&h, "qperf-server");
    let server = vm_outcome(&h, "qperf server", server);
    assert!(!client.success(), "rc_bw against siw's server: {client}");
    assert!(
        server.stdout.contains("failed to create QP: Invalid argument"),
        "siw refuses rc_bw's server queue pair (no send queue): {server}\nclient: {client}"
    );
}
