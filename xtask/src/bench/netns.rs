//! One bench environment: two namespaces joined by veth (or, for the loss part, through the test harness's
//! impairing forwarder: [`Env::new_impaired`]), a daemon in each, and the perf servers in B.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::Mode;
use super::procs::{Proc, registry, run_quiet};
use super::usage::Role;

pub(super) const RDMA_PORT: u16 = 7000;
pub(super) const TCP_PORT: u16 = 7001;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    A,
    B,
}

pub(super) struct Env {
    pub(super) label: String,
    pub(super) ns: [String; 2],
    pub(super) dev: [String; 2],
    pub(super) ip: [Ipv4Addr; 2],
    pub(super) sock_dir: PathBuf,
    pub(super) log_dir: PathBuf,
    /// Every daemon's extra arguments (the loss part's metrics endpoint).
    pub(super) daemon_args: Vec<String>,
    // Field order is drop order: the servers go before the daemons, the impaired link (its forwarder and
    // middle namespace) last.
    pub(super) servers: Vec<Proc>,
    pub(super) daemons: Vec<Proc>,
    pub(super) impaired: Option<soft_rdma_tests::TestNet>,
}

/// Where an impaired environment's XDP daemons serve their metrics (inside each namespace).
pub(super) const METRICS: &str = "127.0.0.1:9479";

pub(super) struct Tools {
    pub(super) cli: PathBuf,
    pub(super) daemon: PathBuf,
    /// XDP mode's spinning (`--spin-us`, `--cq-spin`).
    pub(super) spin: Spin,
}

/// How XDP mode's processes spin before they sleep (none by default).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Spin {
    /// The daemons' `--xdp-busy-poll-us`.
    pub(super) daemon_us: Option<u64>,
    /// The perf clients' and servers' `SOFT_RDMA_CQ_SPIN`.
    pub(super) cq_rounds: Option<u32>,
}

impl Env {
    pub(super) fn new(seq: u32, label: &str, mode: Mode, tools: &Tools, log_dir: &Path) -> Result<Env> {
        let id = format!("{:x}{seq}", std::process::id() & 0xFFFF);
        let ns = [format!("srbn{id}a"), format!("srbn{id}b")];
        let dev = [format!("vbn{id}a"), format!("vbn{id}b")];
        let n = (seq % 250 + 1) as u8;
        let ip = [Ipv4Addr::new(10, 231, n, 1), Ipv4Addr::new(10, 231, n, 2)];
        let sock_dir = std::env::temp_dir().join(format!("soft-rdma-bench-{id}"));
        std::fs::create_dir_all(&sock_dir)?;
        let mut env = Env {
            label: label.to_owned(),
            ns: ns.clone(),
            dev: dev.clone(),
            ip,
            sock_dir,
            log_dir: log_dir.to_owned(),
            daemon_args: Vec::new(),
            servers: Vec::new(),
            daemons: Vec::new(),
            impaired: None,
        };
        for ns in &ns {
            run_quiet(&["ip", "netns", "add", ns])?;
            registry().namespaces.push(ns.clone());
        }
        run_quiet(&[
            "ip", "link", "add", &dev[0], "netns", &ns[0], "type", "veth", "peer", "name", &dev[1], "netns",
            &ns[1],
        ])?;
        for i in 0..2 {
            let (ns, dev) = (&ns[i], &dev[i]);
            run_quiet(&[
                "ip",
                "-n",
                ns,
                "addr",
                "add",
                &format!("{}/24", ip[i]),
                "dev",
                dev,
            ])?;
            run_quiet(&["ip", "-n", ns, "link", "set", dev, "up"])?;
            run_quiet(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
            // Finished checksums and no TSO, as in the figures so far (XDP mode also takes a peer's partial
            // checksums and GSO packets: docs/xdp-mode.md, tests/tests/offloading_peers.rs).
            run_quiet(&["ip", "netns", "exec", ns, "ethtool", "-K", dev, "tx", "off"])?;
            kernel_ports_below_soft_rdmas(ns)?;
        }
        env.start(mode, tools)?;
        Ok(env)
    }

    /// A ⇄ M ⇄ B through the test harness's userspace netem substitute (`soft_rdma_tests::impair`; this
    /// kernel has no netem, and netem would not see AF_XDP's transmits), impaired as `imp` says in each
    /// direction; offloads off on its veths. In XDP mode the daemons serve their metrics at [`METRICS`].
    pub(super) fn new_impaired(
        label: &str,
        mode: Mode,
        tools: &Tools,
        log_dir: &Path,
        imp: soft_rdma_tests::impair::Impairment,
    ) -> Result<Env> {
        use soft_rdma_tests::Side as S;
        let net = soft_rdma_tests::TestNet::new_impaired("bl", imp)?;
        let ns = [net.ns(S::A), net.ns(S::B)];
        registry()
            .namespaces
            .extend([ns[0].clone(), ns[1].clone(), net.middle_ns()]);
        let mut env = Env {
            label: label.to_owned(),
            ns: ns.clone(),
            dev: [net.dev(S::A), net.dev(S::B)],
            ip: [net.ipv4(S::A), net.ipv4(S::B)],
            sock_dir: net.dir().to_owned(),
            log_dir: log_dir.to_owned(),
            daemon_args: if mode == Mode::Xdp {
                vec!["--metrics-listen".into(), METRICS.into()]
            } else {
                Vec::new()
            },
            servers: Vec::new(),
            daemons: Vec::new(),
            impaired: Some(net),
        };
        for ns in &ns {
            kernel_ports_below_soft_rdmas(ns)?;
        }
        env.start(mode, tools)?;
        Ok(env)
    }

    /// The daemons, then the perf servers in B.
    fn start(&mut self, mode: Mode, tools: &Tools) -> Result<()> {
        for side in [Side::A, Side::B] {
            let d = self.spawn_daemon(side, mode, tools)?;
            self.daemons.push(d);
        }
        let env = self;
        let b = env.ip[1];
        for (name, test, port, rdma) in [
            ("srv", "connect", RDMA_PORT, true),
            ("tsrv", "tcp-connect", TCP_PORT, false),
        ] {
            let server = env.spawn_server(
                tools,
                name,
                &["perf", test, "--server", &format!("{b}:{port}")],
                rdma,
            )?;
            env.servers.push(server);
        }
        Ok(())
    }

    pub(super) fn idx(side: Side) -> usize {
        if side == Side::A { 0 } else { 1 }
    }

    pub(super) fn sock(&self, side: Side) -> PathBuf {
        self.sock_dir
            .join(if side == Side::A { "a.sock" } else { "b.sock" })
    }

    pub(super) fn log(&self, what: &str) -> PathBuf {
        self.log_dir.join(format!("{}-{what}.log", self.label))
    }

    pub(super) fn in_ns(&self, side: Side, program: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns[Self::idx(side)]]).arg(program);
        // Errors in one line, without backtraces.
        c.env("RUST_LIB_BACKTRACE", "0").env("RUST_BACKTRACE", "0");
        // `--pin`: this side's CPUs.
        if let Some(Some(cpus)) = super::procs::SIDE_CPUS.get().map(|s| &s[Self::idx(side)]) {
            super::procs::pin_command(&mut c, cpus);
        }
        c
    }

    pub(super) fn spawn_daemon(&self, side: Side, mode: Mode, tools: &Tools) -> Result<Proc> {
        let name = if side == Side::A { "a" } else { "b" };
        let log_path = self.log(&format!("soft-rdmad-{name}"));
        let log = std::fs::File::create(&log_path)?;
        let uds = self.sock(side);
        let mut cmd = self.in_ns(side, &tools.daemon);
        cmd.arg("--uds").arg(&uds);
        // The scale rows hold up to the whole port space from one perf session: its shares of the ports
        // (README "Limits") are all of them, as an operator of such a host would configure.
        cmd.args([
            "--max-ports-per-session",
            "65536",
            "--max-ephemeral-ports-per-session",
            "16384",
        ]);
        cmd.args(&self.daemon_args);
        if mode == Mode::Xdp {
            cmd.args(["--xdp", &self.dev[Self::idx(side)]]);
            if let Some(us) = tools.spin.daemon_us {
                cmd.args(["--xdp-busy-poll-us", &us.to_string()]);
            }
        }
        cmd.env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let mut p = Proc::spawn(&mut cmd, &format!("soft-rdmad {name} ({})", self.label))?;
        let deadline = Instant::now() + Duration::from_secs(15);
        while std::os::unix::net::UnixStream::connect(&uds).is_err() {
            if let Some(status) = p.exited() {
                bail!(
                    "soft-rdmad {}exited ({status}): {}",
                    if mode == Mode::Xdp { "--xdp " } else { "" },
                    last_lines(&log_path, 3)
                );
            }
            if Instant::now() > deadline {
                bail!("soft-rdmad did not come up in 15 s: {}", last_lines(&log_path, 3));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(p)
    }

    /// A perf server in B; waits until it says it listens.
    pub(super) fn spawn_server(&self, tools: &Tools, name: &str, args: &[&str], uds: bool) -> Result<Proc> {
        let log_path = self.log(name);
        let log = std::fs::File::create(&log_path)?;
        let mut cmd = self.in_ns(Side::B, &tools.cli);
        if uds {
            cmd.arg("--uds").arg(self.sock(Side::B));
            if let Some(n) = tools.spin.cq_rounds {
                cmd.env("SOFT_RDMA_CQ_SPIN", n.to_string());
            }
        }
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let mut p = Proc::spawn(&mut cmd, &format!("perf server {name} ({})", self.label))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = std::fs::read_to_string(&log_path).unwrap_or_default();
            if text.contains("server on") {
                return Ok(p);
            }
            if let Some(status) = p.exited() {
                bail!("perf server {name} exited ({status}): {}", text.trim());
            }
            if Instant::now() > deadline {
                bail!("perf server {name} did not start in 10 s: {}", text.trim());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The processes a measurement's usage covers besides the perf client: for soft-rdma both daemons and
    /// its perf server, for TCP the TCP server.
    pub(super) fn watch(&self, tcp: bool) -> Vec<(Role, i32)> {
        if tcp {
            vec![(Role::Server, self.servers[1].pid())]
        } else {
            vec![
                (Role::DaemonA, self.daemons[0].pid()),
                (Role::DaemonB, self.daemons[1].pid()),
                (Role::Server, self.servers[0].pid()),
            ]
        }
    }

    pub(super) fn daemon_pids(&self) -> [i32; 2] {
        [self.daemons[0].pid(), self.daemons[1].pid()]
    }

    /// `soft-rdma perf ARGS` in A (with A's daemon); `target`: the soft-rdma or the TCP server.
    pub(super) fn perf(&self, tools: &Tools, test: &str, tcp: bool, args: &[String]) -> Command {
        let mut c = self.in_ns(Side::A, &tools.cli);
        if !tcp {
            c.arg("--uds").arg(self.sock(Side::A));
            if let Some(n) = tools.spin.cq_rounds {
                c.env("SOFT_RDMA_CQ_SPIN", n.to_string());
            }
        }
        let port = if tcp { TCP_PORT } else { RDMA_PORT };
        c.args(["perf", test, &format!("{}:{port}", self.ip[1]), "--json"])
            .args(args);
        c
    }

    /// Whether a daemon or server died (a crash under load).
    pub(super) fn casualties(&mut self) -> Vec<String> {
        let mut v = Vec::new();
        for p in self.daemons.iter_mut().chain(self.servers.iter_mut()) {
            if let Some(s) = p.exited() {
                v.push(format!("{} exited ({s})", p.what));
            }
        }
        v
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for s in &mut self.servers {
            s.stop();
        }
        for d in &mut self.daemons {
            d.stop();
        }
        for ns in &self.ns {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        let middle = self.impaired.as_ref().map(|n| n.middle_ns());
        registry()
            .namespaces
            .retain(|n| !self.ns.contains(n) && Some(n) != middle.as_ref());
        if self.impaired.is_none() {
            let _ = std::fs::remove_dir_all(&self.sock_dir);
        }
    }
}

pub(super) fn last_lines(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// Kernel ephemeral ports (the TCP baselines) below soft-rdma's port space 49152-65535 in namespace `ns`, so
/// that neither takes the other's ports.
fn kernel_ports_below_soft_rdmas(ns: &str) -> Result<()> {
    run_quiet(&[
        "ip",
        "netns",
        "exec",
        ns,
        "sysctl",
        "-q",
        "-w",
        "net.ipv4.ip_local_port_range=20000 49151",
    ])
}
