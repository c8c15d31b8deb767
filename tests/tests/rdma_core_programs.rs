//! Debian's unmodified rdma-core 44 programs on soft-rdma's drop-in `libibverbs.so.1` and `librdmacm.so.1`
//! (the `soft-rdma-verbs` crate), run through `soft-rdma run` between two network namespaces with a
//! soft-rdmad each; `tests/c/bad_use.c`, wrong uses of the verbs from C that must end in an errno or an
//! error completion, never a crash; and `tests/c/sync_cm.c`, synchronous rdma_cm ids and the forms of
//! `rdma_getaddrinfo`'s hints as rdma-core's librdmacm behaves.
//!
//! The daemons' transports follow `$SOFT_RDMA_TEST_TRANSPORT` (`kernel`, `xdp`, `mixed`): `cargo xtask test`
//! runs the suite in all three. Each test asserts on the programs' exit codes and on what they print
//! (rping `-V` compares the data itself). Needs root, the binaries (`cargo build -p soft-rdma-user
//! --all-features --bins`), the library (`cargo build -p soft-rdma-verbs`) and the Debian packages
//! (`cargo xtask setup`: rdmacm-utils, ibverbs-utils, libibverbs-dev, librdmacm-dev).

use std::path::{Path, PathBuf};
use std::process::Command;

use soft_rdma_tests::Side::{A, B};
use soft_rdma_tests::cli_binary;
use soft_rdma_tests::rdma_core::{DEADLINE, Outcome, Programs, Running, compile_c};

// ---- soft-rdma run itself (no daemon needed) ----

/// A scratch directory beside the CLI (same file system: the CLI can be hard-linked into it).
fn scratch(tag: &str) -> PathBuf {
    let cli = cli_binary().expect("soft-rdma CLI");
    let d = cli.with_file_name(format!("run-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch directory");
    d
}

/// `soft-rdma [args…]` with a stand-in library at `lib` (None: no `$SOFT_RDMA_VERBS_LIB`).
fn run_cli(cli: &Path, lib: Option<&Path>, args: &[&str]) -> Outcome {
    let mut c = Command::new(cli);
    c.args(args).env("LD_LIBRARY_PATH", "/before");
    match lib {
        Some(l) => c.env("SOFT_RDMA_VERBS_LIB", l),
        None => c.env_remove("SOFT_RDMA_VERBS_LIB"),
    };
    Running::spawn(&format!("soft-rdma {}", args.join(" ")), c).wait(DEADLINE)
}

#[test]
fn soft_rdma_run_hands_the_program_its_libraries_exit_code_and_signals() {
    let dir = scratch("env");
    let lib = dir.join("libsoft_rdma_verbs.so");
    std::fs::write(&lib, b"a stand-in: the program below loads no library").unwrap();
    let cli = cli_binary().unwrap();
    let out = run_cli(
        &cli,
        Some(&lib),
        &[
            "--uds",
            "/somewhere/soft-rdmad.sock",
            "run",
            "--",
            "sh",
            "-c",
            "echo \"$LD_LIBRARY_PATH\"; echo \"$SOFT_RDMA_UDS\"; exit 7",
        ],
    );
    assert_eq!(
        out.code(),
        Some(7),
        "the program's exit code is soft-rdma run's: {out}"
    );
    let links = dir.join("rdma-core");
    assert_eq!(
        out.stdout.lines().collect::<Vec<_>>(),
        [
            &format!("{}:/before", links.display()),
            "/somewhere/soft-rdmad.sock"
        ],
        "{out}"
    );
    for name in ["libibverbs.so.1", "librdmacm.so.1"] {
        assert_eq!(
            std::fs::read_link(links.join(name)).unwrap(),
            Path::new("../libsoft_rdma_verbs.so"),
            "{name}"
        );
    }
    // `--uds` after `run` too; and a signal that ends the program ends `soft-rdma run` (it is the program).
    let out = run_cli(
        &cli,
        Some(&lib),
        &[
            "run",
            "--uds",
            "/u.sock",
            "--",
            "sh",
            "-c",
            "echo \"$SOFT_RDMA_UDS\"; kill -TERM $$",
        ],
    );
    assert_eq!(out.stdout.trim(), "/u.sock", "{out}");
    assert_eq!(out.crash_signal(), Some(libc::SIGTERM), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn soft_rdma_run_says_what_is_missing() {
    let dir = scratch("missing");
    let cli = cli_binary().unwrap();
    let out = run_cli(&cli, Some(&dir.join("nothing.so")), &["run", "--", "true"]);
    assert_eq!(out.code(), Some(1), "{out}");
    out.assert_prints("nothing.so is not a file");
    // A soft-rdma with no library beside it: a hard link of the CLI in an empty directory.
    let lonely = dir.join("soft-rdma");
    std::fs::hard_link(&cli, &lonely).unwrap();
    let out = run_cli(&lonely, None, &["run", "--", "true"]);
    assert_eq!(out.code(), Some(1), "{out}");
    out.assert_prints("libsoft_rdma_verbs.so is missing (looked in");
    out.assert_prints("/lib/x86_64-linux-gnu/soft-rdma/libsoft_rdma_verbs.so");
    out.assert_prints("build it with `cargo build");
    let lib = dir.join("libsoft_rdma_verbs.so");
    std::fs::write(&lib, b"stand-in").unwrap();
    let out = run_cli(&cli, Some(&lib), &["run", "--", "no-such-rdma-program"]);
    assert_eq!(
        out.code(),
        Some(127),
        "as a shell says a command is not found: {out}"
    );
    out.assert_prints("program no-such-rdma-program not found");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn soft_rdma_run_makes_the_verbs_crates_link_directory() {
    // One stand-in library linked by the verbs crate's `link_directory`, one by `soft-rdma run`: the same
    // directory, the same two names, the same link targets.
    let cli = cli_binary().unwrap();
    let (ours, theirs) = (scratch("ours"), scratch("theirs"));
    for d in [&ours, &theirs] {
        std::fs::write(d.join("libsoft_rdma_verbs.so"), b"stand-in").unwrap();
    }
    let made = soft_rdma_verbs::link_directory(&theirs.join("libsoft_rdma_verbs.so")).unwrap();
    let lib = ours.join("libsoft_rdma_verbs.so");
    run_cli(&cli, Some(&lib), &["run", "--", "true"]).assert_success();
    assert_eq!(made, theirs.join("rdma-core"));
    let listing = |d: &Path| {
        let mut v: Vec<(String, PathBuf)> = std::fs::read_dir(d.join("rdma-core"))
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().into_string().unwrap(),
                    std::fs::read_link(e.path()).unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(listing(&ours), listing(&theirs));
    assert_eq!(listing(&ours).len(), 2, "{:?}", listing(&ours));
    for d in [ours, theirs] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

// ---- the device ----

#[test]
fn ibv_devices_lists_one_device_per_daemon() {
    let p = Programs::start("rcdv");
    for side in [A, B] {
        let out = p.run(side, "ibv_devices", &[]);
        out.assert_success();
        // "    device    node GUID" then one row per device.
        let rows = out.lines_with("softrdma");
        assert_eq!(rows.len(), 1, "one soft-rdma device: {out}");
    }
}

/// The GID siw gives a port: the interface's MAC in the first six bytes, then zeros (siw_query_gid), as 32
/// hex digits.
fn gid_of(p: &Programs, side: soft_rdma_tests::Side) -> String {
    // The veth lives in the namespace: `ip netns exec` mounts that namespace's /sys.
    let out =
        p.d.net
            .command(side, "cat")
            .arg(format!("/sys/class/net/{}/address", p.d.net.dev(side)))
            .output()
            .expect("cat");
    let mac: String = String::from_utf8_lossy(&out.stdout).trim().split(':').collect();
    assert_eq!(mac.len(), 12, "a MAC: {out:?}");
    format!("{mac:0<32}")
}

#[test]
fn ibv_devinfo_describes_an_iwarp_device_and_its_active_port() {
    let p = Programs::start("rcdi");
    let out = p.run(A, "ibv_devinfo", &["-v"]);
    out.assert_success()
        .assert_words("hca_id: softrdma")
        .assert_words("transport: iWARP (1)")
        .assert_words("state: PORT_ACTIVE (4)")
        // The veth's MTU is 1500: the largest IB MTU that fits is 1024 (siw: ib_mtu_int_to_enum).
        .assert_words("active_mtu: 1024 (3)")
        .assert_words("link_layer: Ethernet")
        .assert_words("gid_tbl_len: 1");
    // ibv_devinfo leaves out a GID whose last 8 bytes are zero, as siw's are: ask ibv_query_gid.
    let exe = compile_c("port_gid", p.d.net.dir());
    for side in [A, B] {
        let out = p.run(side, exe.to_str().unwrap(), &[]);
        out.assert_success();
        assert_eq!(
            out.lines_with("port_gid: "),
            [format!("port_gid: {}", gid_of(&p, side))],
            "side {side:?}: {out}"
        );
    }
}

// ---- rping ----

/// rping between the namespaces: `rping -s` on B, `rping -c -V` on A, `rounds` rounds of `size` bytes
/// (rping's default, 64, if None); both must exit 0. With `-v` (default size only) the client prints every
/// round's data: one line per round.
fn rping(tag: &str, size: Option<&str>, rounds: u32) {
    let p = Programs::start(tag);
    let (b, n) = (p.ip(B).to_string(), rounds.to_string());
    let mut common = vec!["-p", "7174", "-C", &n];
    if let Some(s) = size {
        common.extend(["-S", s]);
    }
    let mut server_args = vec!["-s", "-a", &b];
    server_args.extend(&common);
    let mut server = p.spawn(B, "rping", &server_args);
    p.wait_listening(B, 7174, &mut server);
    let mut client_args = vec!["-c", "-a", &b, "-V"];
    if size.is_none() {
        client_args.push("-v");
    }
    client_args.extend(&common);
    let client = p.run(A, "rping", &client_args);
    let server = server.wait_after(&client);
    client.assert_rping_success();
    server.assert_rping_success();
    if size.is_none() {
        let rounds_seen = client.lines_with("ping data: rdma-ping-").len();
        assert_eq!(rounds_seen, rounds as usize, "one line per round: {client}");
    }
    assert!(!client.text().contains("mismatch"), "{client}");
    p.assert_in_force();
}

#[test]
fn rping_verified_at_its_default_size() {
    rping("rcrp", None, 10);
}

/// 64 KiB as rping takes it: its largest `-S` is 65535 (rping.c refuses `size > RPING_BUFSIZE - 1`, though
/// its message says "valid range is 23 to 65536").
#[test]
fn rping_verified_at_64_kib() {
    rping("rcr6", Some("65535"), 10);
}

// ---- ucmatose, cmtime, rdma_server/rdma_client ----

#[test]
fn ucmatose_with_four_connections() {
    let p = Programs::start("rcuc");
    let b = p.ip(B).to_string();
    let mut server = p.spawn(B, "ucmatose", &["-b", &b, "-p", "7471", "-c", "4"]);
    p.wait_listening(B, 7471, &mut server);
    let client = p.run(A, "ucmatose", &["-s", &b, "-p", "7471", "-c", "4"]);
    let server = server.wait_after(&client);
    for out in [&client, &server] {
        out.assert_success()
            .assert_prints("data transfers complete")
            .assert_prints("test complete")
            .assert_prints("return status 0");
    }
    p.assert_in_force();
}

#[test]
fn cmtime_times_twenty_connections() {
    let p = Programs::start("rcct");
    let b = p.ip(B).to_string();
    let mut server = p.spawn(B, "cmtime", &["-b", &b, "-p", "7472", "-c", "20"]);
    p.wait_listening(B, 7472, &mut server);
    let client = p.run(A, "cmtime", &["-s", &b, "-p", "7472", "-c", "20"]);
    client.assert_success();
    // Its table: one row per step, each step done for every connection.
    for step in [
        "create id",
        "resolve addr",
        "resolve route",
        "create qp",
        "connect",
        "disconnect",
        "destroy",
    ] {
        assert!(
            client.stdout.lines().any(|l| l.trim_start().starts_with(step)),
            "no `{step}` row: {client}"
        );
    }
    // cmtime's server serves until it is stopped; it must not have failed meanwhile.
    let mut server = server;
    if server.has_exited() {
        server.wait(DEADLINE).assert_success();
    } else {
        let out = server.stop();
        assert!(out.crash_signal() == Some(libc::SIGKILL), "{out}");
        assert!(!out.text().contains("error"), "{out}");
    }
    p.assert_in_force();
}

#[test]
fn rdma_server_and_rdma_client() {
    let p = Programs::start("rcsc");
    let b = p.ip(B).to_string();
    let mut server = p.spawn(B, "rdma_server", &["-s", &b, "-p", "7473"]);
    p.wait_listening(B, 7473, &mut server);
    let client = p.run(A, "rdma_client", &["-s", &b, "-p", "7473"]);
    let server = server.wait_after(&client);
    client.assert_success().assert_prints("rdma_client: end 0");
    server.assert_success().assert_prints("rdma_server: end 0");
    p.assert_in_force();
}

// ---- soft-rdma's own tools against rdma-core's (perftest has its suite: tests/tests/perftest.rs) ----

#[test]
fn soft_rdma_ping_against_rping_server() {
    let p = Programs::start("rcps");
    let b = p.ip(B).to_string();
    let mut server = p.spawn(B, "rping", &["-s", "-a", &b, "-p", "7174", "-C", "5"]);
    p.wait_listening(B, 7174, &mut server);
    let target = format!("{b}:7174");
    let ping = Running::spawn(
        "soft-rdma ping (side A)",
        p.cli(A, &["ping", &target, "--count", "5"]),
    )
    .wait(DEADLINE);
    let server = server.wait_after(&ping);
    ping.assert_success().assert_prints("5 rounds, 5 ok, 0 failed");
    server.assert_rping_success();
    p.assert_in_force();
}

#[test]
fn rping_client_against_soft_rdma_ping_server() {
    let p = Programs::start("rcpc");
    let b = p.ip(B).to_string();
    let target = format!("{b}:7174");
    let mut server = Running::spawn(
        "soft-rdma ping --server (side B)",
        p.cli(B, &["ping", "--server", &target]),
    );
    p.wait_listening(B, 7174, &mut server);
    let client = p.run(A, "rping", &["-c", "-a", &b, "-p", "7174", "-V", "-v", "-C", "5"]);
    let server = server.wait_after(&client);
    client.assert_rping_success();
    assert_eq!(client.lines_with("ping data: rdma-ping-").len(), 5, "{client}");
    server.assert_success();
    p.assert_in_force();
}

// ---- bad use from C ----

/// Runs `bad_use CASE args…` on `side` and returns its one line; panics if it crashed, hung or printed
/// something else.
fn bad_use(p: &Programs, exe: &Path, side: soft_rdma_tests::Side, args: &[&str]) -> String {
    let out = p.run(side, exe.to_str().unwrap(), args);
    assert_eq!(out.crash_signal(), None, "a wrong use crashed the program: {out}");
    out.assert_success();
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with(&format!("{}: ", args[0])))
        .unwrap_or_else(|| panic!("no line for {}: {out}", args[0]));
    assert!(!line.contains("SETUP"), "the case could not be set up: {out}");
    line.to_owned()
}

/// The cases of `bad_use.c` that need no connection, and the line each must print: (case, prefix, suffix)
/// (the middle of `wrong_state`'s line is the QP's SGE count, which is the library's to choose).
const NO_CONNECTION_CASES: [(&str, &str, &str); 5] = [
    (
        "other_context",
        "other_context: ibv_create_qp failed with EINVAL",
        "",
    ),
    (
        "wrong_state",
        "wrong_state: state INIT: ibv_post_send returned ENOTCONN (bad_wr set); ibv_post_recv with ",
        " SGEs returned EINVAL",
    ),
    (
        "too_many_sges",
        "too_many_sges: ibv_create_qp with max_send_sge = max_sge + 1 failed with EINVAL",
        "",
    ),
    (
        "cq_in_use",
        "cq_in_use: ibv_destroy_cq returned EBUSY; after ibv_destroy_qp it returned 0 (no error)",
        "",
    ),
    (
        "after_fork",
        "after_fork: in the child, the parent's context: ibv_alloc_pd EIO; its PD: ibv_reg_mr EIO; the \
         child's own context: ibv_alloc_pd succeeded",
        "",
    ),
];

#[test]
fn bad_use_from_c_gets_an_errno() {
    let p = Programs::start("rcbu");
    let exe = compile_c("bad_use", p.d.net.dir());
    // Every case runs, then every wrong answer is reported together.
    let mut wrong = Vec::new();
    for (case, prefix, suffix) in NO_CONNECTION_CASES {
        let out = p.run(A, exe.to_str().unwrap(), &[case]);
        let line = out
            .lines_with(&format!("{case}: "))
            .first()
            .map(|l| l.to_string());
        let fits = line.as_deref().is_some_and(|l| {
            l.starts_with(prefix) && l.ends_with(suffix) && (!suffix.is_empty() || l == prefix)
        });
        if !fits || !out.success() {
            wrong.push(format!("{case}: expected `{prefix}…{suffix}`; {out}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}

#[test]
fn bad_use_from_c_an_unregistered_lkey_completes_in_error() {
    let p = Programs::start("rcbl");
    let exe = compile_c("bad_use", p.d.net.dir());
    let (exe_s, b) = (exe.to_str().unwrap(), p.ip(B).to_string());
    let mut server = p.spawn(B, exe_s, &["serve", &b, "7474"]);
    server.wait_for_line("serve: listening", DEADLINE);
    p.wait_listening(B, 7474, &mut server);
    let line = bad_use(&p, &exe, A, &["unregistered_lkey", &b, "7474"]);
    assert_eq!(
        line,
        "unregistered_lkey: too many SGEs: EINVAL; unregistered lkey: wr_id 2 completed with local protection \
         error (4)"
    );
    let server = server.wait(DEADLINE);
    server.assert_success();
    assert_eq!(server.crash_signal(), None, "{server}");
    p.assert_in_force();
}

#[test]
fn bad_use_from_c_a_refused_connect_leaves_the_id_to_destroy() {
    let p = Programs::start("rcbr");
    let exe = compile_c("bad_use", p.d.net.dir());
    // Nothing listens on B's port 7479.
    let line = bad_use(&p, &exe, A, &["refused", &p.ip(B).to_string(), "7479"]);
    assert_eq!(
        line,
        format!(
            "refused: RDMA_CM_EVENT_REJECTED status -{}; rdma_destroy_id returned 0 (0 (no error))",
            libc::ECONNREFUSED
        )
    );
}

#[test]
fn bad_use_from_c_soft_rdmad_going_away_is_device_fatal() {
    let mut p = Programs::start("rcbf");
    let exe = compile_c("bad_use", p.d.net.dir());
    let mut prog = p.spawn(A, exe.to_str().unwrap(), &["device_fatal"]);
    prog.wait_for_line("device_fatal: ready", DEADLINE);
    p.d.da.kill();
    let out = prog.wait(DEADLINE);
    assert_eq!(out.crash_signal(), None, "{out}");
    out.assert_success();
    assert_eq!(
        out.lines_with("device_fatal: async"),
        [
            "device_fatal: async event local catastrophic error; then ibv_alloc_pd EIO, ibv_create_cq EIO, ibv_reg_mr EIO"
        ],
        "{out}"
    );
}

// ---- synchronous rdma_cm ids and rdma_getaddrinfo's hints, from C ----

/// `tests/c/sync_cm.c`'s forms of hints, each with what rdma-core's `rdma_getaddrinfo` makes of it
/// (librdmacm/addrinfo.c): the result's flags keep only RAI_PASSIVE; hints alone are copied; a source the
/// result lacks is the hints'; a lookup that fails is -1.
#[test]
fn sync_cm_getaddrinfo_takes_every_hints_form() {
    let p = Programs::start("rcga");
    let exe = compile_c("sync_cm", p.d.net.dir());
    let b = p.ip(B).to_string();
    let out = p.run(A, exe.to_str().unwrap(), &["getaddrinfo", &b, "7471"]);
    out.assert_success();
    let (inet, rc, tcp) = (libc::AF_INET, 2, 0x106);
    let expected = [
        format!(
            "getaddrinfo: node passive: flags 1 family {inet} qp_type {rc} ps 0x{tcp:x} src {b}:7471 dst none"
        ),
        format!(
            "getaddrinfo: node active: flags 0 family {inet} qp_type {rc} ps 0x{tcp:x} src none dst {b}:7471"
        ),
        format!(
            "getaddrinfo: hints dst: flags 8 family {inet} qp_type {rc} ps 0x{tcp:x} src none dst {b}:7471"
        ),
        format!(
            "getaddrinfo: hints src dst: flags 8 family {inet} qp_type {rc} ps 0x{tcp:x} src 127.0.0.1:7 dst {b}:7471"
        ),
        format!(
            "getaddrinfo: node with src: flags 0 family {inet} qp_type {rc} ps 0x{tcp:x} src 127.0.0.1:7 dst {b}:7471"
        ),
        "getaddrinfo: numeric name: failed (an error)".to_string(),
        "getaddrinfo: ipv4 as ipv6: failed (an error)".to_string(),
        "getaddrinfo: nothing: failed (EINVAL)".to_string(),
    ];
    assert_eq!(out.lines_with("getaddrinfo: "), expected, "{out}");
}

/// A synchronous client and server (`rdma_create_ep` without a channel), each reading what the last call
/// left in `id->event` (rdma-core's `ucma_complete`): the server the client's private data in the request,
/// the client the server's advertisement in ESTABLISHED.
#[test]
fn sync_cm_ids_keep_their_last_event() {
    let p = Programs::start("rcsy");
    let exe = compile_c("sync_cm", p.d.net.dir());
    let (exe_s, b) = (exe.to_str().unwrap(), p.ip(B).to_string());
    let mut server = p.spawn(B, exe_s, &["server", &b, "7472"]);
    server.wait_for_line("server: listening", DEADLINE);
    p.wait_listening(B, 7472, &mut server);
    let client = p.run(A, exe_s, &["client", &b, "7472"]);
    let server = server.wait_after(&client);
    client.assert_success();
    server.assert_success();
    assert_eq!(
        client.lines_with("client: "),
        [
            "client: after rdma_create_ep, id->event is RDMA_CM_EVENT_ROUTE_RESOLVED",
            "client: after rdma_connect, id->event is RDMA_CM_EVENT_ESTABLISHED with \"server-advertisement:rkey=0x1234\"",
            "client: rdma_migrate_id(id, NULL) returned -1 (EINVAL)",
            "client: after rdma_disconnect, id->event is RDMA_CM_EVENT_DISCONNECTED",
            "client: done",
        ],
        "{client}"
    );
    assert_eq!(
        server.lines_with("server: "),
        [
            "server: listening",
            "server: after rdma_get_request, id->event is RDMA_CM_EVENT_CONNECT_REQUEST with \"hello-from-client\"",
            "server: the new id has a QP and its own channel",
            "server: after rdma_accept, id->event is RDMA_CM_EVENT_ESTABLISHED",
            "server: after rdma_disconnect, id->event is RDMA_CM_EVENT_DISCONNECTED",
            "server: done",
        ],
        "{server}"
    );
    p.assert_in_force();
}
