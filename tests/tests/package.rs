//! The Debian package on a clean system (issue 41): a minimal bookworm root made by debootstrap from Debian's
//! mirror (`soft_rdma_tests::package`), the package installed there with `apt-get install ./….deb`, and from
//! that root alone, in two namespaces joined by veth: soft-rdmad with the packaged configuration file,
//! Debian's `rping` and `ib_write_bw -R` through the installed `soft-rdma run`. Nothing from the build tree
//! is used: every program runs as `ip netns exec NS chroot ROOT …` with a clean environment. And: install,
//! upgrade to a higher version, remove and purge leave no stray file (Debian policy 6.8 and 10.7.3: the
//! conffile stays until purge; 9.2.2: the system group may stay).
//!
//! The packages are `$SOFT_RDMA_DEB` and `$SOFT_RDMA_DEB_UPGRADE` (`cargo xtask package --test` builds both
//! and runs this suite with `--include-ignored`); a plain `cargo test` lists both tests as ignored. Needs
//! root, debootstrap and the mirror.

use std::path::PathBuf;

use soft_rdma_tests::package::Chroot;
use soft_rdma_tests::perftest::{Pair, rows, with_retry};
use soft_rdma_tests::rdma_core::{DEADLINE, Running};
use soft_rdma_tests::{Daemon, Side, TestNet, spawn_daemon_command};

/// rping's port in the installed package's run.
const RPING_PORT: u16 = 7174;

/// Where the package puts the drop-in library (docs/installing.md).
const LIB_DIR: &str = "/usr/lib/x86_64-linux-gnu/soft-rdma";

/// `$name` as a path: the suite is `#[ignore]`d in a plain `cargo test` (which lists it as ignored, with the
/// reason), and run by `cargo xtask package --test` with `--include-ignored` and both packages named.
fn package(name: &str) -> PathBuf {
    let p = PathBuf::from(std::env::var_os(name).filter(|v| !v.is_empty()).unwrap_or_else(|| {
        panic!("${name} names no Debian package: `cargo xtask package --test` builds the packages and runs this suite")
    }));
    assert!(p.is_file(), "{name}={} is not a file", p.display());
    p
}

/// The installed version of `pkg` in `root`, or "" if it is not installed.
fn installed_version(root: &Chroot, pkg: &str) -> String {
    root.command(
        None,
        "dpkg-query",
        &["-W", "-f=${db:Status-Abbrev}${Version}", pkg],
    )
    .output()
    .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    .unwrap_or_default()
}

/// soft-rdmad from the root, in `side`'s namespace, with the packaged configuration file and its socket
/// at `/run/soft-rdma/<name>.sock` in the root.
fn daemon(root: &Chroot, net: &TestNet, side: Side, name: &str) -> Daemon {
    let uds = format!("/run/soft-rdma/{name}.sock");
    let mut cmd = root.command(
        Some(&net.ns(side)),
        "/usr/sbin/soft-rdmad",
        &["--config", "/etc/soft-rdma/soft-rdmad.toml", "--uds", &uds],
    );
    cmd.env("RUST_LOG", "info");
    spawn_daemon_command(cmd, root.host_path(&uds), net.dir().join(format!("{name}.log")))
        .unwrap_or_else(|e| panic!("soft-rdmad {name} from the package: {e:#}"))
}

/// `soft-rdma --uds /run/soft-rdma/<name>.sock run -- program args…` from the root in `side`'s namespace,
/// in the background. `ip netns exec`, `chroot` and `soft-rdma run` all exec: the pid is the program's.
fn spawn_program(
    root: &Chroot,
    net: &TestNet,
    side: Side,
    name: &str,
    program: &str,
    args: &[&str],
) -> Running {
    let uds = format!("/run/soft-rdma/{name}.sock");
    let mut all = vec!["--uds", &uds, "run", "--", program];
    all.extend(args);
    let what = format!("{program} {} (side {side:?}, from the package)", args.join(" "));
    Running::spawn(
        &what,
        root.command(Some(&net.ns(side)), "/usr/bin/soft-rdma", &all),
    )
}

/// Waits until the daemon `name` holds a listener on `port`, asking the installed `soft-rdma status --json`
/// ([`DEADLINE`] at most); panics with the server's output if it exits first.
fn wait_listening(root: &Chroot, net: &TestNet, side: Side, name: &str, port: u16, server: &mut Running) {
    let uds = format!("/run/soft-rdma/{name}.sock");
    let deadline = std::time::Instant::now() + DEADLINE;
    let suffix = format!(":{port}\"");
    loop {
        let out = root
            .command(
                Some(&net.ns(side)),
                "/usr/bin/soft-rdma",
                &["--uds", &uds, "status", "--json"],
            )
            .output()
            .expect("soft-rdma status");
        let text = String::from_utf8_lossy(&out.stdout);
        // `"local": "10.200.n.2:PORT"` in the listeners array.
        if text
            .split("\"listeners\"")
            .nth(1)
            .is_some_and(|l| l.contains(&suffix))
        {
            return;
        }
        if server.has_exited() || std::time::Instant::now() > deadline {
            let o = server.stop();
            panic!("no listener on port {port} in daemon {name}: {text}\n{o}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
#[ignore = "needs the packages: cargo xtask package --test"]
fn the_installed_package_runs_rping_and_ib_write_bw_between_two_namespaces() {
    let deb = package("SOFT_RDMA_DEB");
    let root = Chroot::fresh("run").expect("a fresh bookworm root");
    root.apt_install(&deb)
        .expect("apt-get install ./soft-rdma….deb in the root");
    assert_links_as_shipped(&root);
    std::fs::create_dir_all(root.host_path("/run/soft-rdma")).unwrap();
    let net = TestNet::new("pkg").expect("namespaces");
    let (_da, _db) = (
        daemon(&root, &net, Side::A, "a"),
        daemon(&root, &net, Side::B, "b"),
    );
    // The packaged configuration is in force: the socket's group is the package's soft-rdma group.
    let gid = std::os::unix::fs::MetadataExt::gid(
        &std::fs::metadata(root.host_path("/run/soft-rdma/a.sock")).unwrap(),
    );
    let group = root
        .stdout("getent", &["group", "soft-rdma"])
        .expect("the soft-rdma group");
    assert_eq!(
        group.split(':').nth(2).map(str::trim),
        Some(gid.to_string().as_str()),
        "{group}"
    );
    let b = net.ipv4(Side::B).to_string();

    // rping: 10 rounds, each verified (-V) and printed (-v). Either side may lose rping 44's own teardown
    // race once its connection ended (`Outcome::assert_rping_success`); the rounds are counted anyway.
    let port = RPING_PORT.to_string();
    let mut server = spawn_program(
        &root,
        &net,
        Side::B,
        "b",
        "rping",
        &["-s", "-a", &b, "-p", &port, "-C", "10"],
    );
    wait_listening(&root, &net, Side::B, "b", RPING_PORT, &mut server);
    let client = spawn_program(
        &root,
        &net,
        Side::A,
        "a",
        "rping",
        &["-c", "-a", &b, "-p", &port, "-C", "10", "-V", "-v"],
    )
    .wait(DEADLINE);
    let server = server.wait_after(&client);
    client.assert_rping_success();
    server.assert_rping_success();
    assert_eq!(client.lines_with("ping data: rdma-ping-").len(), 10, "{client}");

    // ib_write_bw -R: 200 Writes of 64 KiB, retried once on perftest's own listen race.
    let pair = with_retry(18515, |port| {
        let args = ["-R", "-F", "-p", &port.to_string(), "-s", "65536", "-n", "200"].map(str::to_owned);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut server = spawn_program(&root, &net, Side::B, "b", "ib_write_bw", &args);
        wait_listening(&root, &net, Side::B, "b", port, &mut server);
        let mut client_args = args.clone();
        client_args.push(&b);
        let client = spawn_program(&root, &net, Side::A, "a", "ib_write_bw", &client_args).wait(DEADLINE);
        let server = server.wait_after(&client);
        Pair { client, server }
    });
    pair.assert_success();
    let results = rows(&pair.client.stdout);
    assert!(
        results.iter().any(|r| r.bytes == 65536 && r.iterations == 200),
        "a results row for 200 × 64 KiB: {}",
        pair.client
    );
    println!("ib_write_bw from the package: {}", pair.client.stdout.trim());
    // rdma-core's own libraries were not touched by the package, and `soft-rdma run` left the package's
    // links as shipped.
    root.run("dpkg", &["--verify", "libibverbs1", "librdmacm1"])
        .expect("dpkg --verify: rdma-core's libraries as Debian shipped them");
    assert_links_as_shipped(&root);
}

/// The package's two links, as `soft-rdma run` needs them (it would otherwise rewrite them).
fn assert_links_as_shipped(root: &Chroot) {
    for soname in ["libibverbs.so.1", "librdmacm.so.1"] {
        let link = root.host_path(&format!("{LIB_DIR}/rdma-core/{soname}"));
        assert_eq!(
            std::fs::read_link(&link).expect("the package's link"),
            PathBuf::from("../libsoft_rdma_verbs.so"),
            "{}",
            link.display()
        );
    }
}

/// Paths that may differ after purge from before install: dpkg's and apt's own records and logs, and the
/// system group (Debian policy 9.2.2 leaves it; adduser rewrites the group files and their backups).
fn allowed_change(path: &str) -> bool {
    const PREFIXES: [&str; 5] = [
        "var/lib/dpkg/",
        "var/lib/apt/",
        "var/cache/apt/",
        "var/cache/debconf/",
        "var/log/",
    ];
    const FILES: [&str; 4] = ["etc/group-", "etc/gshadow-", "etc/passwd-", "etc/shadow-"];
    (PREFIXES.iter().any(|p| path.starts_with(p)) && !path.starts_with("var/lib/dpkg/info/soft-rdma."))
        || FILES.contains(&path)
}

#[test]
#[ignore = "needs the packages: cargo xtask package --test"]
fn install_upgrade_remove_and_purge_leave_no_stray_file() {
    let (deb, upgrade) = (package("SOFT_RDMA_DEB"), package("SOFT_RDMA_DEB_UPGRADE"));
    let root = Chroot::fresh("lifecycle").expect("a fresh bookworm root");
    let before = root.files().unwrap();
    let rdma_core_before = (
        installed_version(&root, "libibverbs1"),
        installed_version(&root, "librdmacm1"),
    );
    assert!(
        rdma_core_before.0.starts_with("ii "),
        "Debian's libibverbs1 is installed: {rdma_core_before:?}"
    );

    let out = root.apt_install(&deb).expect("install");
    println!("{}", String::from_utf8_lossy(&out.stdout));
    let first = installed_version(&root, "soft-rdma");
    assert!(first.starts_with("ii "), "{first}");
    let installed = root.files().unwrap();
    assert!(
        installed.contains("usr/sbin/soft-rdmad") && installed.len() > before.len(),
        "the root's file list shows the package's files"
    );
    let listed = root.stdout("dpkg", &["-L", "soft-rdma"]).unwrap();
    for want in [
        "/usr/sbin/soft-rdmad",
        "/usr/bin/soft-rdma",
        "/usr/lib/x86_64-linux-gnu/soft-rdma/libsoft_rdma_verbs.so",
        "/usr/lib/x86_64-linux-gnu/soft-rdma/rdma-core/libibverbs.so.1",
        "/usr/lib/x86_64-linux-gnu/soft-rdma/rdma-core/librdmacm.so.1",
        "/etc/soft-rdma/soft-rdmad.toml",
        "/usr/share/man/man8/soft-rdmad.8.gz",
        "/usr/share/man/man1/soft-rdma.1.gz",
        "/usr/share/man/man1/soft-rdma-run.1.gz",
        "/usr/share/doc/soft-rdma/copyright",
        "/usr/share/doc/soft-rdma/README.md",
        "/usr/share/doc/soft-rdma/docs/installing.md",
    ] {
        assert!(
            listed.lines().any(|l| l == want),
            "{want} not in the package:\n{listed}"
        );
    }
    assert!(
        listed
            .lines()
            .any(|l| l.ends_with("/systemd/system/soft-rdmad.service")),
        "{listed}"
    );
    root.stdout("getent", &["group", "soft-rdma"])
        .expect("postinst made the soft-rdma group");
    // Enabled as debhelper enables a unit (deb-systemd-helper), even where systemd does not run.
    let wants = "/etc/systemd/system/multi-user.target.wants/soft-rdmad.service";
    assert!(
        std::fs::symlink_metadata(root.host_path(wants)).is_ok(),
        "postinst enables the unit: {wants}"
    );

    root.apt_install(&upgrade).expect("upgrade");
    let second = installed_version(&root, "soft-rdma");
    assert!(
        second.starts_with("ii ") && second != first,
        "upgraded from {first} to {second}"
    );
    assert_links_as_shipped(&root);

    root.run("apt-get", &["remove", "-y", "soft-rdma"])
        .expect("remove");
    assert!(
        !root.host_path("/usr/sbin/soft-rdmad").exists(),
        "remove takes the programs"
    );
    assert!(
        root.host_path("/etc/soft-rdma/soft-rdmad.toml").is_file(),
        "remove keeps the conffile (policy 10.7.3)"
    );
    root.run("apt-get", &["purge", "-y", "soft-rdma"]).expect("purge");
    assert_eq!(installed_version(&root, "soft-rdma"), "", "purged");
    let after = root.files().unwrap();
    let strays: Vec<&String> = after.difference(&before).filter(|p| !allowed_change(p)).collect();
    let lost: Vec<&String> = before.difference(&after).filter(|p| !allowed_change(p)).collect();
    let changed: Vec<&String> = after
        .symmetric_difference(&before)
        .filter(|p| allowed_change(p))
        .collect();
    println!(
        "{} paths before install, {} after purge; changed, as allowed: {changed:#?}",
        before.len(),
        after.len()
    );
    assert!(
        strays.is_empty(),
        "left behind by install, upgrade, remove and purge: {strays:#?}"
    );
    assert!(
        lost.is_empty(),
        "gone after purge though there before install: {lost:#?}"
    );
    assert_eq!(
        (
            installed_version(&root, "libibverbs1"),
            installed_version(&root, "librdmacm1")
        ),
        rdma_core_before,
        "rdma-core's libraries stay installed throughout"
    );
}
