//! soft-rdmad and RDMA programs as users other than root, as in containers (docs/containers.md): in each of
//! two namespaces a kernel-TCP soft-rdmad runs as a system user made for the test, with no capability at all,
//! and gives its socket to a group (`--group`) through a directory that user owns (a shared volume);
//! another user in that group runs `soft-rdma status` and rping (through `soft-rdma run`, on the drop-in
//! libraries) from one namespace to the other, and a user outside the group is refused with a message that
//! names the group.
//!
//! Needs root (namespaces, groupadd/useradd), rping (Debian's rdmacm-utils: `cargo xtask setup`), the
//! binaries and the drop-in library (`cargo build -p soft-rdma-user --all-features --bins`, `cargo build
//! -p soft-rdma-verbs`). Always kernel-TCP: the XDP transport needs capabilities (docs/containers.md).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use soft_rdma_tests::rdma_core::{DEADLINE, Outcome, Running, wait_tcp_listening};
use soft_rdma_tests::users::{Account, Accounts, Binaries, as_user};
use soft_rdma_tests::{Daemon, Side, TestNet, start_daemon};

const RPING_PORT: &str = "7174";
const ROUNDS: usize = 5;

/// `side`'s soft-rdmad as `accounts.daemon` with `--group`: its socket in a directory that user owns.
fn daemon(net: &TestNet, bin: &Binaries, accounts: &Accounts, side: Side) -> Daemon {
    let dir = net.dir().join(format!("run-{side:?}"));
    std::fs::create_dir_all(&dir).expect("socket directory");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    nix::unistd::chown(&dir, Some(nix::unistd::Uid::from_raw(accounts.daemon.uid)), None).expect("chown");
    let cmd = as_user(
        &net.ns(side),
        &accounts.daemon,
        &accounts.groups_of(&accounts.daemon),
        &bin.daemon,
    );
    let log = net.dir().join(format!("soft-rdmad-{side:?}.log"));
    // A names the group, B gives its number (as in a container whose image names no group).
    let group = match side {
        Side::A => accounts.group.clone(),
        Side::B => accounts.gid.to_string(),
    };
    start_daemon(cmd, dir.join("soft-rdmad.sock"), log, &["--group", &group], None)
        .unwrap_or_else(|e| panic!("soft-rdmad {side:?} as {}: {e:#}", accounts.daemon.name))
}

/// `soft-rdma --uds UDS args…` as `who`, in `side`'s namespace.
fn cli(
    net: &TestNet,
    bin: &Binaries,
    accounts: &Accounts,
    who: &Account,
    (side, uds): (Side, &Path),
) -> Command {
    let mut c = as_user(&net.ns(side), who, &accounts.groups_of(who), &bin.cli);
    c.arg("--uds").arg(uds);
    c
}

/// `cmd` run to its end (at most [`DEADLINE`]).
fn outcome(what: &str, cmd: Command) -> Outcome {
    Running::spawn(what, cmd).wait(DEADLINE)
}

/// A line of `/proc/<pid>/status` (`Uid`, `CapEff`...), its values.
fn proc_status(pid: u32, field: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/<pid>/status");
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

#[test]
fn unprivileged_daemons_serve_their_group_and_refuse_others_by_name() {
    let accounts = Accounts::create("up").expect("the test's group and users");
    let net = TestNet::new("unpriv").expect("netns pair");
    std::fs::set_permissions(net.dir(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let bin = Binaries::place(&net.dir().join("bin")).expect("binaries the users may run");
    let (da, db) = (
        daemon(&net, &bin, &accounts, Side::A),
        daemon(&net, &bin, &accounts, Side::B),
    );
    let (ua, ub): (PathBuf, PathBuf) = (da.uds_path().into(), db.uds_path().into());

    // The daemons run as their user, with no capability, and their sockets belong to the group.
    for d in [&da, &db] {
        let pid = d.pid().expect("running");
        let uid = accounts.daemon.uid.to_string();
        assert_eq!(
            proc_status(pid, "Uid"),
            [uid.as_str(); 4].join(" "),
            "soft-rdmad's uids"
        );
        assert_eq!(
            proc_status(pid, "CapEff"),
            "0000000000000000",
            "soft-rdmad's capabilities"
        );
        let meta = std::fs::metadata(d.uds_path()).expect("the socket");
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            (meta.gid(), meta.mode() & 0o777),
            (accounts.gid, 0o660),
            "the socket's group and mode"
        );
    }

    // A member of the group sees the daemon's status.
    let mut status_cmd = cli(&net, &bin, &accounts, &accounts.member, (Side::A, &ua));
    status_cmd.arg("status");
    let status = outcome("soft-rdma status (member)", status_cmd);
    status.assert_success().assert_prints("soft-rdmad:");

    // A user outside it is refused, told which group and what to ask for.
    let mut refused_cmd = cli(&net, &bin, &accounts, &accounts.outsider, (Side::A, &ua));
    refused_cmd.arg("status");
    let refused = outcome("soft-rdma status (outsider)", refused_cmd);
    assert!(!refused.success(), "{refused}");
    let ask = format!("ask to be added to group {}", accounts.group);
    assert!(refused.text().contains(&ask), "expected {ask:?}: {refused}");

    // rping from A to B, both ends run by the member on the drop-in libraries; -V checks the data.
    let b = net.ipv4(Side::B).to_string();
    let rounds = ROUNDS.to_string();
    let mut server_cmd = cli(&net, &bin, &accounts, &accounts.member, (Side::B, &ub));
    server_cmd.args([
        "run", "--", "rping", "-s", "-a", &b, "-p", RPING_PORT, "-C", &rounds,
    ]);
    let mut server = Running::spawn("rping -s (member)", server_cmd);
    wait_tcp_listening(&net, Side::B, RPING_PORT.parse().expect("a port"), &mut server);
    let mut client_cmd = cli(&net, &bin, &accounts, &accounts.member, (Side::A, &ua));
    client_cmd.args([
        "run", "--", "rping", "-c", "-a", &b, "-p", RPING_PORT, "-C", &rounds, "-V", "-v",
    ]);
    let client = outcome("rping -c (member)", client_cmd);
    let server = server.wait_after(&client);
    client.assert_rping_success();
    server.assert_rping_success();
    assert_eq!(
        client.lines_with("ping data: rdma-ping-").len(),
        ROUNDS,
        "one line per round: {client}"
    );

    // The outsider's RDMA program gets no device, and says why.
    let mut denied_cmd = cli(&net, &bin, &accounts, &accounts.outsider, (Side::A, &ua));
    denied_cmd.args(["run", "--", "rping", "-c", "-a", &b, "-p", RPING_PORT, "-C", "1"]);
    let denied = outcome("rping -c (outsider)", denied_cmd);
    assert!(!denied.success(), "{denied}");
    assert!(denied.text().contains(&ask), "expected {ask:?}: {denied}");
}
