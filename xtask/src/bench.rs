//! `cargo xtask bench [--quick] [--out DIR]`: soft-rdma against kernel TCP on the same path, in one run.
//!
//! Two network namespaces joined by veth (own names, `srbn…`; removed on every exit path, Ctrl-C included),
//! soft-rdmad in each (kernel-TCP mode, then XDP mode when `soft-rdmad --xdp` comes up), and the release
//! `soft-rdma perf` tool on both ends: the soft-rdma figures and their kernel-TCP baselines come from the
//! same program, timer and namespaces.
//!
//! 1. Connection setup (`perf connect` vs `perf tcp-connect`): sequential latency p50/p99 with the time of
//!    each step (as rdma-core's cmtime), and the rate with 1, 16 and 256 connections in flight. Every run
//!    gets fresh namespaces (ports closed by the active side stay in TIME_WAIT for 60 s).
//! 2. Data (`perf write|read|send` vs `perf tcp-stream`, `--latency` vs `perf tcp-pingpong`): bandwidth and
//!    ping-pong latency for 64 B .. 4 MiB, powers of 4 (--quick: powers of 16), per transport mode, with the
//!    CPU the two daemons used.
//! 3. Scale (`perf connect --hold N` vs `perf tcp-connect --hold N`): 1, 1,024 and 16,384 idle connections:
//!    setup time and each daemon's resident memory per connection (VmRSS before and after).
//!
//! Every figure is the median of the runs (3 with --quick, else 5) with min and max; every comparison is
//! the median of per-run ratios to the baseline measured in the same run and namespaces. Output: tables on
//! stdout and in `bench.md`, everything (raw rows included) in `bench.json`, and `bench.svg`.
//! Performance claims live here only, never as timed assertions in tests.

pub mod profile;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Serialize;
use serde_json::{Value, json};

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Fewer sizes, iterations, connections and runs (3): finishes in under 3 minutes.
    #[arg(long)]
    quick: bool,
    /// Where bench.json, bench.md, bench.svg and the daemons' logs go.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// Runs of each measurement (default: 3 with --quick, else 5).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    runs: Option<u32>,
    /// Only these parts (comma-separated; default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Part>,
    /// Skip XDP mode.
    #[arg(long)]
    no_xdp: bool,
    /// Use the soft-rdmad and soft-rdma binaries in this directory instead of building target/release (e.g.
    /// to compare two builds).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Part {
    Connect,
    Data,
    Scale,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
enum Mode {
    Kernel,
    Xdp,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Kernel => "kernel",
            Mode::Xdp => "xdp",
        }
    }
}

/// What one run measures.
#[derive(Clone, Debug, Serialize)]
struct Profile {
    runs: u32,
    bw_sizes: Vec<u64>,
    /// Bandwidth: about this many bytes per size, at most `bw_iters` messages.
    bw_bytes: u64,
    bw_iters: u32,
    depth: u32,
    lat_sizes: Vec<u64>,
    lat_bytes: u64,
    lat_iters: u32,
    /// (connections in flight, connections) of each connection-setup measurement.
    connect: Vec<(u32, u32)>,
    /// (idle connections, runs).
    scale: Vec<(u32, u32)>,
    /// Seconds one `soft-rdma perf` invocation may take before it counts as hung.
    limit_s: u64,
    /// Seconds the whole command may take, build included: a measurement not started by then is skipped
    /// (and said so). Kernel mode goes first; XDP mode's parts share what is left.
    budget_s: u64,
    /// Seconds the measurements get at least, however long the build took.
    min_window_s: u64,
}

impl Profile {
    fn new(quick: bool, runs: Option<u32>) -> Profile {
        let powers = |step: u64| {
            let mut v = vec![64u64];
            while *v.last().expect("non-empty") * step <= 4 << 20 {
                v.push(v.last().expect("non-empty") * step);
            }
            v
        };
        if quick {
            Profile {
                runs: runs.unwrap_or(3),
                bw_sizes: powers(16),
                bw_bytes: 24 << 20,
                bw_iters: 8000,
                depth: 64,
                lat_sizes: vec![64, 1 << 10, 16 << 10, 256 << 10],
                lat_bytes: 8 << 20,
                lat_iters: 600,
                connect: vec![(1, 100), (16, 400), (256, 1000)],
                scale: vec![(1, 3), (1024, 3), (16384, 1)],
                limit_s: 25,
                budget_s: 165,
                min_window_s: 70,
            }
        } else {
            Profile {
                runs: runs.unwrap_or(5),
                bw_sizes: powers(4),
                bw_bytes: 96 << 20,
                bw_iters: 40_000,
                depth: 64,
                lat_sizes: powers(4),
                lat_bytes: 48 << 20,
                lat_iters: 4000,
                connect: vec![(1, 500), (16, 2000), (256, 4000)],
                scale: vec![(1, 5), (1024, 5), (16384, 3)],
                limit_s: 120,
                budget_s: 1140,
                min_window_s: 600,
            }
        }
    }

    /// Operations for one size: about `bytes`, at least 16, at most `max`.
    fn iters(bytes: u64, max: u32, size: u64) -> u32 {
        u32::try_from(bytes / size)
            .unwrap_or(u32::MAX)
            .clamp(16.min(max), max)
    }
}

// ---------------------------------------------------------------------------------------------------------
// Cleanup on every exit path: what exists is registered; a signal thread removes it on Ctrl-C / SIGTERM.
// ---------------------------------------------------------------------------------------------------------

#[derive(Default)]
struct Registry {
    namespaces: Vec<String>,
    pids: Vec<i32>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    namespaces: Vec::new(),
    pids: Vec::new(),
});

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

fn signal(pid: i32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
}

/// Blocks SIGINT/SIGTERM/SIGHUP in this (still single-threaded) process and waits for them on a thread of
/// its own, which stops every registered process, deletes every registered namespace and exits. Children
/// start with an empty signal mask ([`Proc::spawn`]) in process groups of their own, so a terminal's Ctrl-C
/// reaches only xtask, which takes them down in order.
fn install_signal_cleanup() -> Result<()> {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(s);
    }
    set.thread_block()?;
    std::thread::spawn(move || {
        let sig = set.wait().unwrap_or(Signal::SIGINT);
        eprintln!("\nbench: {sig:?}: stopping the daemons and removing the namespaces");
        let reg = registry();
        for &pid in &reg.pids {
            signal(pid, Signal::SIGTERM);
        }
        std::thread::sleep(Duration::from_millis(500));
        for &pid in &reg.pids {
            signal(pid, Signal::SIGKILL);
        }
        for ns in &reg.namespaces {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        std::process::exit(130);
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------------------
// Processes.
// ---------------------------------------------------------------------------------------------------------

/// A child registered for cleanup; SIGTERM (then SIGKILL) on drop.
struct Proc {
    child: Child,
    what: String,
}

impl Proc {
    fn spawn(cmd: &mut Command, what: &str) -> Result<Proc> {
        cmd.process_group(0);
        // SAFETY: pthread_sigmask is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                // The child must see SIGTERM: undo the mask xtask's threads carry (install_signal_cleanup).
                nix::sys::signal::SigSet::empty()
                    .thread_set_mask()
                    .map_err(std::io::Error::from)
            });
        }
        let child = cmd.spawn().with_context(|| format!("starting {what}: {cmd:?}"))?;
        registry().pids.push(child.id() as i32);
        Ok(Proc {
            child,
            what: what.to_owned(),
        })
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits up to `limit` for it to exit; `None`: still running.
    fn wait_for(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = self.exited() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn stop(&mut self) {
        if self.exited().is_none() {
            signal(self.pid(), nix::sys::signal::Signal::SIGTERM);
            if self.wait_for(Duration::from_secs(5)).is_none() {
                eprintln!("bench: {} did not stop on SIGTERM in 5 s; killing it", self.what);
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
        let pid = self.pid();
        registry().pids.retain(|&p| p != pid);
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What a finished `soft-rdma perf` said.
struct Output {
    ok: bool,
    /// It was killed at the limit.
    killed: bool,
    stdout: String,
    stderr: String,
    wall: Duration,
}

impl Output {
    /// The reason it failed, for the tables: the last line of stderr.
    fn why(&self) -> String {
        let last = self
            .stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty() && !l.starts_with("Stack backtrace"))
            .unwrap_or("no output");
        last.trim().trim_start_matches("Error: ").to_owned()
    }
}

/// Runs `cmd` to completion, at most `limit` (then it is killed: a hang is an error, never a wait).
fn run_limited(cmd: &mut Command, what: &str, limit: Duration) -> Result<Output> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let t0 = Instant::now();
    let mut p = Proc::spawn(cmd, what)?;
    let mut out = p.child.stdout.take().expect("piped");
    let mut err = p.child.stderr.take().expect("piped");
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let status = p.wait_for(limit);
    let hung = status.is_none();
    if hung {
        let _ = p.child.kill();
        let _ = p.child.wait();
    }
    let wall = t0.elapsed();
    drop(p);
    let stdout = out_t.join().unwrap_or_default();
    let stderr = err_t.join().unwrap_or_default();
    Ok(Output {
        ok: status.is_some_and(|s| s.success()),
        killed: hung,
        stdout,
        stderr,
        wall,
    })
}

fn run_quiet(args: &[&str]) -> Result<()> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .with_context(|| format!("running {args:?}"))?;
    if !out.status.success() {
        bail!("{args:?} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// A process's resident memory (VmRSS), bytes.
fn rss(pid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// CPU time of every thread of a process (schedstat: nanoseconds on a CPU).
fn cpu_ns(pid: i32) -> u64 {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    dir.flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

// ---------------------------------------------------------------------------------------------------------
// One environment: two namespaces, veth, a daemon in each, and the perf servers in B.
// ---------------------------------------------------------------------------------------------------------

const RDMA_PORT: u16 = 7000;
const TCP_PORT: u16 = 7001;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    A,
    B,
}

struct Env {
    label: String,
    ns: [String; 2],
    dev: [String; 2],
    ip: [Ipv4Addr; 2],
    sock_dir: PathBuf,
    log_dir: PathBuf,
    // Field order is drop order: the servers go before the daemons.
    servers: Vec<Proc>,
    daemons: Vec<Proc>,
}

struct Tools {
    cli: PathBuf,
    daemon: PathBuf,
}

impl Env {
    fn new(seq: u32, label: &str, mode: Mode, tools: &Tools, log_dir: &Path) -> Result<Env> {
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
            servers: Vec::new(),
            daemons: Vec::new(),
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
            // veth's partial checksums would reach AF_XDP sockets unfinished (as the test harness does).
            run_quiet(&["ip", "netns", "exec", ns, "ethtool", "-K", dev, "tx", "off"])?;
            // Kernel ephemeral ports (the TCP baselines) below soft-rdma's port space 49152-65535, so that
            // neither takes the other's ports.
            run_quiet(&[
                "ip",
                "netns",
                "exec",
                ns,
                "sysctl",
                "-q",
                "-w",
                "net.ipv4.ip_local_port_range=20000 49151",
            ])?;
        }
        for side in [Side::A, Side::B] {
            let d = env.spawn_daemon(side, mode, tools)?;
            env.daemons.push(d);
        }
        let b = env.ip[1];
        let rdma = env.spawn_server(
            tools,
            "srv",
            &["perf", "connect", "--server", &format!("{b}:{RDMA_PORT}")],
            true,
        )?;
        env.servers.push(rdma);
        let tcp = env.spawn_server(
            tools,
            "tsrv",
            &["perf", "tcp-connect", "--server", &format!("{b}:{TCP_PORT}")],
            false,
        )?;
        env.servers.push(tcp);
        Ok(env)
    }

    fn idx(side: Side) -> usize {
        if side == Side::A { 0 } else { 1 }
    }

    fn sock(&self, side: Side) -> PathBuf {
        self.sock_dir
            .join(if side == Side::A { "a.sock" } else { "b.sock" })
    }

    fn log(&self, what: &str) -> PathBuf {
        self.log_dir.join(format!("{}-{what}.log", self.label))
    }

    fn in_ns(&self, side: Side, program: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns[Self::idx(side)]]).arg(program);
        // Errors in one line, without backtraces.
        c.env("RUST_LIB_BACKTRACE", "0").env("RUST_BACKTRACE", "0");
        c
    }

    fn spawn_daemon(&self, side: Side, mode: Mode, tools: &Tools) -> Result<Proc> {
        let name = if side == Side::A { "a" } else { "b" };
        let log_path = self.log(&format!("soft-rdmad-{name}"));
        let log = std::fs::File::create(&log_path)?;
        let uds = self.sock(side);
        let mut cmd = self.in_ns(side, &tools.daemon);
        cmd.arg("--uds").arg(&uds);
        if mode == Mode::Xdp {
            cmd.args(["--xdp", &self.dev[Self::idx(side)]]);
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
    fn spawn_server(&self, tools: &Tools, name: &str, args: &[&str], uds: bool) -> Result<Proc> {
        let log_path = self.log(name);
        let log = std::fs::File::create(&log_path)?;
        let mut cmd = self.in_ns(Side::B, &tools.cli);
        if uds {
            cmd.arg("--uds").arg(self.sock(Side::B));
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

    fn daemon_pids(&self) -> [i32; 2] {
        [self.daemons[0].pid(), self.daemons[1].pid()]
    }

    /// `soft-rdma perf ARGS` in A (with A's daemon); `target`: the soft-rdma or the TCP server.
    fn perf(&self, tools: &Tools, test: &str, tcp: bool, args: &[String]) -> Command {
        let mut c = self.in_ns(Side::A, &tools.cli);
        if !tcp {
            c.arg("--uds").arg(self.sock(Side::A));
        }
        let port = if tcp { TCP_PORT } else { RDMA_PORT };
        c.args(["perf", test, &format!("{}:{port}", self.ip[1]), "--json"])
            .args(args);
        c
    }

    /// Whether a daemon or server died (a crash under load).
    fn casualties(&mut self) -> Vec<String> {
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
        registry().namespaces.retain(|n| !self.ns.contains(n));
        let _ = std::fs::remove_dir_all(&self.sock_dir);
    }
}

fn last_lines(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

// ---------------------------------------------------------------------------------------------------------
// Samples and statistics.
// ---------------------------------------------------------------------------------------------------------

/// One measurement of one run.
#[derive(Clone, Debug, Serialize)]
struct Sample {
    part: &'static str,
    mode: Mode,
    /// The perf test: write, read, send, tcp-stream, tcp-pingpong, connect, tcp-connect.
    test: String,
    /// bw, lat, rate, hold.
    kind: &'static str,
    bytes: u64,
    concurrency: u32,
    run: u32,
    error: Option<String>,
    /// The perf tool's JSON row (scale: its "up" and "down" lines and the memory figures).
    row: Value,
    /// Cores the two daemons (A, B) used during the measurement (soft-rdma tests).
    daemon_cores: Option<[f64; 2]>,
    wall_s: f64,
}

impl Sample {
    /// A figure of the row. A row that comes with an error (some connections failed) still has the figures
    /// of what succeeded; the tables flag them with the error.
    fn f(&self, field: &str) -> Option<f64> {
        self.row.get(field)?.as_f64()
    }
}

#[derive(Clone, Copy, Debug, Serialize)]
struct Stat {
    median: f64,
    min: f64,
    max: f64,
    n: usize,
}

fn stat(v: &[f64]) -> Option<Stat> {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some(Stat {
        median,
        min: v[0],
        max: v[n - 1],
        n,
    })
}

struct Samples(Vec<Sample>);

impl Samples {
    fn find<'a>(
        &'a self,
        part: &'a str,
        mode: Mode,
        test: &'a str,
        kind: &'a str,
        bytes: u64,
        concurrency: u32,
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.0.iter().filter(move |s| {
            s.part == part
                && s.mode == mode
                && s.test == test
                && s.kind == kind
                && s.bytes == bytes
                && s.concurrency == concurrency
        })
    }

    /// Per run: `field` of the sample.
    fn by_run(&self, q: Q<'_>, field: &str) -> BTreeMap<u32, f64> {
        self.find(q.part, q.mode, q.test, q.kind, q.bytes, q.concurrency)
            .filter_map(|s| Some((s.run, s.f(field)?)))
            .collect()
    }

    fn stat(&self, q: Q<'_>, field: &str) -> Option<Stat> {
        stat(&self.by_run(q, field).into_values().collect::<Vec<_>>())
    }

    /// Median (min, max) over runs of `q.field / base.base_field` within the same run.
    fn ratio(&self, q: Q<'_>, base: Q<'_>, field: &str, base_field: &str) -> Option<Stat> {
        let a = self.by_run(q, field);
        let b = self.by_run(base, base_field);
        let v: Vec<f64> = a.iter().filter_map(|(r, x)| Some(x / b.get(r)?)).collect();
        stat(&v)
    }

    /// Distinct errors of the samples `q` names.
    fn errors(&self, q: Q<'_>) -> Vec<String> {
        let mut v: Vec<String> = self
            .find(q.part, q.mode, q.test, q.kind, q.bytes, q.concurrency)
            .filter_map(|s| s.error.clone())
            .collect();
        // Failures first, skips last.
        v.sort_by_key(|e| (e.starts_with("skipped"), e.clone()));
        v.dedup();
        v
    }
}

/// A query: which samples.
#[derive(Clone, Copy)]
struct Q<'a> {
    part: &'a str,
    mode: Mode,
    test: &'a str,
    kind: &'a str,
    bytes: u64,
    concurrency: u32,
}

// ---------------------------------------------------------------------------------------------------------
// The run.
// ---------------------------------------------------------------------------------------------------------

struct Bench {
    tools: Tools,
    profile: Profile,
    log_dir: PathBuf,
    samples: Samples,
    /// Mode → None (available) or why not.
    modes: BTreeMap<Mode, Option<String>>,
    notes: Vec<String>,
    start: Instant,
    envs: u32,
    /// Progress: steps done.
    step: u32,
    /// When every measurement must have started.
    end: Instant,
    /// When the current part (of the current mode) must have: the rest is skipped.
    part_end: Instant,
    /// Why the rest of the current part is skipped early (a hang).
    part_skip: Option<String>,
}

impl Bench {
    /// `Some(why)` when the next measurement is not to be started.
    fn skipping(&self) -> Option<String> {
        if let Some(why) = &self.part_skip {
            return Some(why.clone());
        }
        (Instant::now() >= self.part_end.min(self.end)).then(|| "skipped: out of the time budget".to_owned())
    }

    /// How long the next measurement may take: `limit_s`, less when the budget is nearly spent (at least 5 s).
    fn limit(&self) -> Duration {
        let left = self
            .part_end
            .min(self.end)
            .saturating_duration_since(Instant::now());
        left.clamp(Duration::from_secs(5), Duration::from_secs(self.profile.limit_s))
    }

    /// Why a measurement killed at `limit` was: a hang, or the time budget running out.
    fn killed_why(&self, limit: Duration) -> String {
        if limit < Duration::from_secs(self.profile.limit_s) {
            format!(
                "cut short: the time budget ran out ({} s without a result)",
                limit.as_secs()
            )
        } else {
            format!("HUNG: no result within {} s; killed", limit.as_secs())
        }
    }

    /// Notes that the rest of a part is not measured (from run `run` on), and why.
    fn skip_rest(&mut self, mode: Mode, part: &str, run: u32) {
        let why = self.skipping().unwrap_or_default();
        let what = format!(
            "{} mode, {part}: not measured from run {run} on ({why}).",
            mode.name()
        );
        eprintln!("bench: {what}");
        self.notes.push(what);
    }

    /// A measurement hung: the rest of this part in this mode would most likely hang too.
    fn hung(&mut self, mode: Mode) {
        self.part_skip = Some(format!(
            "skipped: an earlier {} measurement of this part hung",
            mode.name()
        ));
    }

    fn progress(&mut self, what: &str) {
        self.step += 1;
        let t = self.start.elapsed().as_secs();
        eprintln!("[{:02}:{:02}] {what}", t / 60, t % 60);
    }

    fn env(&mut self, label: &str, mode: Mode) -> Result<Env> {
        self.envs += 1;
        Env::new(
            self.envs,
            &format!("{label}{}", self.envs),
            mode,
            &self.tools,
            &self.log_dir,
        )
    }

    /// Runs one perf invocation and records its sample.
    #[allow(clippy::too_many_arguments)]
    fn measure(
        &mut self,
        env: &mut Env,
        part: &'static str,
        mode: Mode,
        test: &str,
        kind: &'static str,
        bytes: u64,
        concurrency: u32,
        run: u32,
        args: &[String],
    ) -> Result<()> {
        let tcp = test.starts_with("tcp-");
        if let Some(why) = self.skipping() {
            self.samples.0.push(Sample {
                part,
                mode,
                test: test.to_owned(),
                kind,
                bytes,
                concurrency,
                run,
                error: Some(why),
                row: Value::Null,
                daemon_cores: None,
                wall_s: 0.0,
            });
            return Ok(());
        }
        let mut cmd = env.perf(&self.tools, test, tcp, args);
        let pids = env.daemon_pids();
        let cpu0 = [cpu_ns(pids[0]), cpu_ns(pids[1])];
        let limit = self.limit();
        let out = run_limited(&mut cmd, &format!("perf {test}"), limit)?;
        let secs = out.wall.as_secs_f64();
        let cores = [
            cpu_ns(pids[0]).saturating_sub(cpu0[0]) as f64 / 1e9 / secs,
            cpu_ns(pids[1]).saturating_sub(cpu0[1]) as f64 / 1e9 / secs,
        ];
        let row = serde_json::from_str::<Value>(&out.stdout)
            .ok()
            .and_then(|v| v.as_array().and_then(|a| a.first().cloned()));
        let mut error = match (&row, out.ok) {
            _ if out.killed => Some(self.killed_why(limit)),
            (Some(_), true) => None,
            _ => Some(out.why()),
        };
        let dead = env.casualties();
        if !dead.is_empty() {
            error = Some(format!(
                "{}{}",
                error.map(|e| format!("{e}; ")).unwrap_or_default(),
                dead.join("; ")
            ));
        }
        if let Some(e) = &error {
            eprintln!("        {test} {kind} {bytes} B ×{concurrency}: FAILED: {e}");
            if e.contains("HUNG") {
                self.hung(mode);
            }
            let _ = std::fs::write(
                env.log(&format!("failed-{test}-{kind}-{bytes}-{concurrency}-run{run}")),
                format!(
                    "{cmd:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
                    out.stdout, out.stderr
                ),
            );
        }
        self.samples.0.push(Sample {
            part,
            mode,
            test: test.to_owned(),
            kind,
            bytes,
            concurrency,
            run,
            error,
            row: row.unwrap_or(Value::Null),
            daemon_cores: (!tcp).then_some(cores),
            wall_s: secs,
        });
        if !dead.is_empty() {
            bail!("{}: {}", env.label, dead.join("; "));
        }
        Ok(())
    }

    fn data(&mut self, mode: Mode) -> Result<()> {
        let p = self.profile.clone();
        for run in 1..=p.runs {
            if self.skipping().is_some() {
                self.skip_rest(mode, "data", run);
                return Ok(());
            }
            self.progress(&format!(
                "data, {} mode, run {run}/{}: namespaces and daemons",
                mode.name(),
                p.runs
            ));
            let mut env = match self.env("data", mode) {
                Ok(e) => e,
                Err(e) => {
                    if mode == Mode::Xdp {
                        self.modes.insert(mode, Some(format!("{e:#}")));
                        return Ok(());
                    }
                    return Err(e);
                }
            };
            for test in ["tcp-stream", "write", "read", "send"] {
                self.progress(&format!(
                    "data, {} mode, run {run}/{}: {test} bandwidth, {}",
                    mode.name(),
                    p.runs,
                    size_list(&p.bw_sizes)
                ));
                for &size in &p.bw_sizes {
                    let iters = Profile::iters(p.bw_bytes, p.bw_iters, size);
                    let args = vec![
                        "--size".into(),
                        size.to_string(),
                        "--iters".into(),
                        iters.to_string(),
                        "--depth".into(),
                        p.depth.to_string(),
                    ];
                    self.measure(&mut env, "data", mode, test, "bw", size, 0, run, &args)?;
                }
            }
            for test in ["tcp-pingpong", "send", "write", "read"] {
                self.progress(&format!(
                    "data, {} mode, run {run}/{}: {test} latency, {}",
                    mode.name(),
                    p.runs,
                    size_list(&p.lat_sizes)
                ));
                for &size in &p.lat_sizes {
                    let iters = Profile::iters(p.lat_bytes, p.lat_iters, size);
                    let mut args = vec![
                        "--size".into(),
                        size.to_string(),
                        "--iters".into(),
                        iters.to_string(),
                    ];
                    if test != "tcp-pingpong" {
                        args.push("--latency".into());
                    }
                    self.measure(&mut env, "data", mode, test, "lat", size, 0, run, &args)?;
                }
            }
        }
        Ok(())
    }

    fn connect(&mut self, mode: Mode) -> Result<()> {
        let p = self.profile.clone();
        for run in 1..=p.runs {
            for &(conc, count) in &p.connect {
                // Fresh namespaces for each: every closed connection leaves its port busy for a while
                // (TIME_WAIT: 60 s), and the next measurement must not inherit that.
                if self.skipping().is_some() {
                    self.skip_rest(mode, "connection setup", run);
                    return Ok(());
                }
                self.progress(&format!(
                    "connection setup, {} mode, run {run}/{}: {count} connections, {conc} in flight",
                    mode.name(),
                    p.runs
                ));
                let mut env = match self.env("conn", mode) {
                    Ok(e) => e,
                    Err(e) => {
                        if mode == Mode::Xdp {
                            self.modes.insert(mode, Some(format!("{e:#}")));
                            return Ok(());
                        }
                        return Err(e);
                    }
                };
                for test in ["connect", "tcp-connect"] {
                    let args = vec![
                        "--count".into(),
                        count.to_string(),
                        "--concurrency".into(),
                        conc.to_string(),
                    ];
                    self.measure(&mut env, "connect", mode, test, "rate", 0, conc, run, &args)?;
                }
            }
        }
        Ok(())
    }

    fn scale(&mut self, mode: Mode) -> Result<()> {
        let p = self.profile.clone();
        for &(n, runs) in &p.scale {
            let runs = runs.min(p.runs);
            for run in 1..=runs {
                if self.skipping().is_some() {
                    self.skip_rest(mode, &format!("scale ({n} connections)"), run);
                    return Ok(());
                }
                self.progress(&format!(
                    "scale, {} mode, run {run}/{runs}: {n} idle connections (fresh namespaces)",
                    mode.name(),
                ));
                let mut env = match self.env("scale", mode) {
                    Ok(e) => e,
                    Err(e) => {
                        if mode == Mode::Xdp {
                            self.modes.insert(mode, Some(format!("{e:#}")));
                            return Ok(());
                        }
                        return Err(e);
                    }
                };
                for test in ["connect", "tcp-connect"] {
                    let s = self.hold(&mut env, mode, test, n, run);
                    self.samples.0.push(s);
                    let dead = env.casualties();
                    if !dead.is_empty() {
                        bail!("{}: {}", env.label, dead.join("; "));
                    }
                }
            }
        }
        Ok(())
    }

    /// `perf TEST --hold N`: opens N connections, measures the daemons' memory, closes them.
    fn hold(&mut self, env: &mut Env, mode: Mode, test: &str, n: u32, run: u32) -> Sample {
        let tcp = test.starts_with("tcp-");
        if let Some(why) = self.skipping() {
            return Sample {
                part: "scale",
                mode,
                test: test.to_owned(),
                kind: "hold",
                bytes: 0,
                concurrency: n,
                run,
                error: Some(why),
                row: Value::Null,
                daemon_cores: None,
                wall_s: 0.0,
            };
        }
        let pids = env.daemon_pids();
        // Let the daemons settle (the servers' sessions were just opened).
        std::thread::sleep(Duration::from_millis(200));
        let before = [rss(pids[0]), rss(pids[1])];
        let conc = n.min(256);
        let mut cmd = env.perf(
            &self.tools,
            test,
            tcp,
            &[
                "--hold".into(),
                "--count".into(),
                n.to_string(),
                "--concurrency".into(),
                conc.to_string(),
            ],
        );
        let t0 = Instant::now();
        let mut sample = Sample {
            part: "scale",
            mode,
            test: test.to_owned(),
            kind: "hold",
            bytes: 0,
            concurrency: n,
            run,
            error: None,
            row: Value::Null,
            daemon_cores: None,
            wall_s: 0.0,
        };
        let result = (|| -> Result<Value> {
            cmd.stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let mut p = Proc::spawn(&mut cmd, &format!("perf {test} --hold {n}"))?;
            let stdin: ChildStdin = p.child.stdin.take().expect("piped");
            let stdout = p.child.stdout.take().expect("piped");
            let mut stderr = p.child.stderr.take().expect("piped");
            let err_t = std::thread::spawn(move || {
                let mut s = String::new();
                let _ = stderr.read_to_string(&mut s);
                s
            });
            let (tx, rx) = std::sync::mpsc::channel::<String>();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
            let limit = self.limit();
            let fail = |p: &mut Proc, what: String, err_t: std::thread::JoinHandle<String>| {
                let _ = p.child.kill();
                let _ = p.child.wait();
                let e = err_t.join().unwrap_or_default();
                let last = e
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("")
                    .trim_start_matches("Error: ")
                    .to_owned();
                anyhow::anyhow!(
                    "{what}{}",
                    if last.is_empty() {
                        String::new()
                    } else {
                        format!(": {last}")
                    }
                )
            };
            let up: Value = match rx.recv_timeout(limit) {
                Ok(l) => serde_json::from_str(&l).with_context(|| format!("bad line {l:?}"))?,
                Err(_) => {
                    return Err(fail(
                        &mut p,
                        format!("{n} connections not up: {}", self.killed_why(limit)),
                        err_t,
                    ));
                }
            };
            // Idle connections: let any lazy work (RTR, first reads) finish before the memory is read.
            std::thread::sleep(Duration::from_millis(500));
            let after = [rss(pids[0]), rss(pids[1])];
            let mut stdin = stdin;
            let _ = writeln!(stdin);
            drop(stdin);
            let down: Value = match rx.recv_timeout(limit) {
                Ok(l) => serde_json::from_str(&l).unwrap_or(Value::Null),
                Err(_) => {
                    return Err(fail(
                        &mut p,
                        format!("{n} connections not closed: {}", self.killed_why(limit)),
                        err_t,
                    ));
                }
            };
            let status = p.wait_for(Duration::from_secs(30));
            drop(p);
            let stderr = err_t.join().unwrap_or_default();
            let connected = up["connected"].as_u64().unwrap_or(0);
            let per_conn = |i: usize| match (before[i], after[i]) {
                (Some(b), Some(a)) if connected > 0 => json!((a as f64 - b as f64) / connected as f64),
                _ => Value::Null,
            };
            let row = json!({
                "up": up,
                "down": down,
                "setup_s": up["setup_s"],
                "rate_per_s": up["rate_per_s"],
                "connected": connected,
                "rss_before_a": before[0], "rss_before_b": before[1],
                "rss_after_a": after[0], "rss_after_b": after[1],
                "rss_per_conn_a": if tcp { Value::Null } else { per_conn(0) },
                "rss_per_conn_b": if tcp { Value::Null } else { per_conn(1) },
            });
            if up["errors"].as_u64().unwrap_or(0) > 0 || !status.is_some_and(|s| s.success()) {
                let why = up["first_error"]
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| stderr.lines().last().unwrap_or("").to_owned());
                sample.error = Some(format!(
                    "{} of {n} connections failed: {why}",
                    up["errors"].as_u64().unwrap_or(0)
                ));
            }
            Ok(row)
        })();
        sample.wall_s = t0.elapsed().as_secs_f64();
        match result {
            Ok(row) => sample.row = row,
            Err(e) => sample.error = Some(format!("{e:#}")),
        }
        if let Some(e) = &sample.error {
            eprintln!("        {test} --hold {n}: FAILED: {e}");
            if e.contains("HUNG") {
                self.hung(mode);
            }
        }
        sample
    }
}

fn size_list(sizes: &[u64]) -> String {
    format!(
        "{} .. {} ({} sizes)",
        human(sizes[0]),
        human(*sizes.last().expect("non-empty")),
        sizes.len()
    )
}

fn human(b: u64) -> String {
    if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{} MiB", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}

fn build(root: &Path) -> Result<Tools> {
    eprintln!("bench: building the release soft-rdmad and soft-rdma");
    crate::run(crate::cargo().args(["build", "--release", "-p", "soft-rdma-user", "--bins"]))?;
    let dir = root.join("target/release");
    Ok(Tools {
        cli: dir.join("soft-rdma"),
        daemon: dir.join("soft-rdmad"),
    })
}

pub fn run(root: &Path, a: BenchArgs) -> Result<()> {
    let t_start = Instant::now();
    if !nix::unistd::geteuid().is_root() {
        bail!("cargo xtask bench creates network namespaces and veth pairs: run it as root");
    }
    crate::setup::run()?;
    let tools = match &a.bin_dir {
        Some(d) => Tools {
            cli: d.join("soft-rdma"),
            daemon: d.join("soft-rdmad"),
        },
        None => build(root)?,
    };
    // Before any thread exists (setup and the build only ran commands): the mask is inherited by every
    // later thread.
    install_signal_cleanup()?;
    let out = if a.out.is_absolute() {
        a.out.clone()
    } else {
        root.join(&a.out)
    };
    let log_dir = out.join("logs");
    let _ = std::fs::remove_dir_all(&log_dir);
    std::fs::create_dir_all(&log_dir)?;
    let profile = Profile::new(a.quick, a.runs);
    let (profile_budget, min_window) = (profile.budget_s, profile.min_window_s);
    let parts = if a.only.is_empty() {
        vec![Part::Connect, Part::Data, Part::Scale]
    } else {
        a.only.clone()
    };
    let mut bench = Bench {
        tools,
        profile,
        log_dir,
        samples: Samples(Vec::new()),
        modes: BTreeMap::new(),
        notes: Vec::new(),
        start: Instant::now(),
        envs: 0,
        step: 0,
        end: (t_start + Duration::from_secs(profile_budget))
            .max(Instant::now() + Duration::from_secs(min_window)),
        part_end: Instant::now(),
        part_skip: None,
    };
    bench.modes.insert(Mode::Kernel, None);
    if a.no_xdp {
        bench.modes.insert(Mode::Xdp, Some("skipped (--no-xdp)".into()));
    } else {
        bench.modes.insert(Mode::Xdp, None);
    }
    bench.notes.push(
        "Two network namespaces joined by a veth pair on one machine; soft-rdmad in each; `soft-rdma perf` \
         in namespace A against its server in B. Baselines: the same tool over plain kernel TCP sockets \
         (TCP_NODELAY) between the same namespaces."
            .into(),
    );
    bench.notes.push(
        "net.ipv4.ip_local_port_range = 20000-49151 in both namespaces: kernel ephemeral ports stay out of \
         soft-rdma's port space (49152-65535)."
            .into(),
    );
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    bench.notes.push(format!(
        "{cpus} CPUs; kernel {}.",
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    ));
    // A part that cannot go on (a daemon died, namespaces could not be made) is noted and the next part
    // starts afresh; kernel-mode failures make the exit status non-zero after the report is written.
    let mut kernel_failed = None;
    for mode in [Mode::Kernel, Mode::Xdp] {
        for (i, part) in parts.iter().enumerate() {
            if bench.modes[&mode].is_some() {
                continue;
            }
            // Kernel mode may use all the time left; XDP mode's parts share it.
            let left = bench.end.saturating_duration_since(Instant::now());
            let share = match mode {
                Mode::Kernel => left,
                Mode::Xdp => left / (parts.len() - i) as u32,
            };
            bench.part_end = Instant::now() + share;
            bench.part_skip = None;
            let r = match part {
                Part::Connect => bench.connect(mode),
                Part::Data => bench.data(mode),
                Part::Scale => bench.scale(mode),
            };
            if let Err(e) = r {
                let what = format!("{part:?} in {} mode stopped early: {e:#}", mode.name());
                eprintln!("bench: {what}");
                bench.notes.push(what.clone());
                if mode == Mode::Kernel {
                    kernel_failed.get_or_insert(what);
                }
            }
        }
    }
    let duration = bench.start.elapsed();
    report::write(&bench, &parts, &out, duration, t_start.elapsed())?;
    match kernel_failed {
        Some(e) => bail!("{e}"),
        None => Ok(()),
    }
}

mod report {
    //! Tables, bench.json and bench.svg.

    use super::*;

    fn fmt_stat(s: Option<Stat>, digits: usize) -> String {
        match s {
            None => "—".into(),
            Some(s) if s.n == 1 => format!("{:.*}", digits, s.median),
            Some(s) => format!(
                "{:.*} ({:.*}–{:.*})",
                digits, s.median, digits, s.min, digits, s.max
            ),
        }
    }

    /// Seconds → milliseconds.
    fn ms(s: Option<Stat>) -> Option<Stat> {
        s.map(|s| Stat {
            median: s.median * 1e3,
            min: s.min * 1e3,
            max: s.max * 1e3,
            n: s.n,
        })
    }

    fn fmt_ratio(s: Option<Stat>) -> String {
        match s {
            None => "—".into(),
            Some(s) if s.n == 1 => format!("×{:.2}", s.median),
            Some(s) => format!("×{:.2} ({:.2}–{:.2})", s.median, s.min, s.max),
        }
    }

    /// Footnotes for the cells whose runs failed or were skipped: each distinct reason once.
    #[derive(Default)]
    struct Foot(std::cell::RefCell<Vec<String>>);

    impl Foot {
        fn mark(&self, e: &str) -> String {
            // Each run has its own namespaces and addresses: the same failure reads the same.
            let e: Vec<String> = e
                .replace('|', "/")
                .split_whitespace()
                .map(|w| {
                    let bare = w.trim_end_matches([':', ',', ';', ')']);
                    if bare.parse::<std::net::SocketAddr>().is_ok() {
                        w.replace(bare, "B:port")
                    } else {
                        w.to_owned()
                    }
                })
                .collect();
            let e = e.join(" ");
            let mut v = self.0.borrow_mut();
            let i = match v.iter().position(|x| *x == e) {
                Some(i) => i,
                None => {
                    v.push(e);
                    v.len() - 1
                }
            };
            format!("[{}]", i + 1)
        }

        /// `value`, with how many runs it has when some are missing, and footnote marks for what went
        /// wrong: "FAILED [n]" when no run has the figure, "skipped [n]" when none ran.
        fn cell(&self, s: &Samples, qq: Q<'_>, field: &str, value: String) -> String {
            let total = s
                .find(qq.part, qq.mode, qq.test, qq.kind, qq.bytes, qq.concurrency)
                .count();
            let ok = s.by_run(qq, field).len();
            let errors = s.errors(qq);
            // "N of M connections failed…": the counts go in the cell, the reason in a note.
            let mut failed = Vec::new();
            let mut reasons: Vec<String> = errors
                .iter()
                .map(|e| match split_count(e) {
                    Some((n, m, rest)) => {
                        failed.push((n, m));
                        rest.to_owned()
                    }
                    None => e.clone(),
                })
                .collect();
            reasons.sort();
            reasons.dedup();
            let mut marks: Vec<String> = reasons.iter().map(|e| self.mark(e)).collect();
            marks.dedup();
            marks.truncate(2);
            let mut marks = marks.concat();
            if let (Some(lo), Some(hi)) = (failed.iter().map(|f| f.0).min(), failed.iter().map(|f| f.0).max())
            {
                let m = failed[0].1;
                let range = if lo == hi {
                    lo.to_string()
                } else {
                    format!("{lo}–{hi}")
                };
                marks = format!("({range} of {m} failed) {marks}");
            }
            if ok == 0 {
                if errors.is_empty() {
                    return "—".into();
                }
                if errors.iter().all(|e| e.starts_with("skipped")) {
                    return format!("skipped {marks}");
                }
                return format!("FAILED {marks}");
            }
            let runs = if ok < total {
                format!(" ({ok}/{total} runs)")
            } else {
                String::new()
            };
            if marks.is_empty() {
                format!("{value}{runs}")
            } else {
                format!("{value}{runs} {marks}")
            }
        }

        fn write(&self, w: &mut String) {
            let v = self.0.borrow();
            if v.is_empty() {
                return;
            }
            w.push_str("Notes:\n\n");
            for (i, e) in v.iter().enumerate() {
                w.push_str(&format!("{}. {e}\n", i + 1));
            }
            w.push('\n');
        }
    }

    /// "N of M connections failed; the first: WHY" → (N, M, "connections failed: WHY").
    fn split_count(e: &str) -> Option<(u64, u64, &str)> {
        let (n, rest) = e.split_once(" of ")?;
        let (m, rest) = rest.split_once(' ')?;
        let rest = rest.strip_prefix("connections failed")?;
        let why = rest
            .trim_start_matches([';', ':', ' '])
            .trim_start_matches("the first: ");
        Some((n.parse().ok()?, m.parse().ok()?, why))
    }

    fn q<'a>(part: &'a str, mode: Mode, test: &'a str, kind: &'a str, bytes: u64, concurrency: u32) -> Q<'a> {
        Q {
            part,
            mode,
            test,
            kind,
            bytes,
            concurrency,
        }
    }

    pub fn write(b: &Bench, parts: &[Part], out: &Path, duration: Duration, total: Duration) -> Result<()> {
        let s = &b.samples;
        let p = &b.profile;
        let foot = Foot::default();
        let mut md = String::new();
        let w = &mut md;
        let modes: Vec<Mode> = [Mode::Kernel, Mode::Xdp]
            .into_iter()
            .filter(|m| b.modes[m].is_none())
            .collect();
        w.push_str(&format!(
            "# soft-rdma bench{}\n\nmedian (min–max) of {} runs; ×: soft-rdma ÷ kernel-TCP baseline of the same run (median of per-run ratios). Measurements took {:.0} s ({:.0} s with setup and build).\n\n",
            if p.runs == 3 && p.bw_sizes.len() < 9 { " (--quick)" } else { "" },
            p.runs,
            duration.as_secs_f64(),
            total.as_secs_f64()
        ));
        for (m, why) in &b.modes {
            if let Some(why) = why {
                w.push_str(&format!("- **{} mode: not available**: {why}\n", m.name()));
            }
        }
        for n in &b.notes {
            w.push_str(&format!("- {n}\n"));
        }
        w.push('\n');

        let mut json_connect = Vec::new();
        if parts.contains(&Part::Connect) {
            w.push_str("## 1. Connection setup\n\nsoft-rdma: CreateConnector, Connect (TCP + MPA v2 Request/Reply, 32 B private data each way, IRD/ORD 16/16), CompleteConnect (RTR), Disconnect. Baseline: TCP connect, one 32 B request/response, close. Latency: one connection's whole life, µs.\n\n");
            w.push_str("| mode | in flight | connections | soft-rdma conn/s | TCP conn/s | rate × | soft-rdma p50 µs | p99 µs | TCP p50 µs | p99 µs | p50 × | soft-rdma steps p50 µs | TCP steps p50 µs |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
            for &mode in &modes {
                for &(conc, count) in &p.connect {
                    let r = q("connect", mode, "connect", "rate", 0, conc);
                    let t = q("connect", mode, "tcp-connect", "rate", 0, conc);
                    let steps = |qq: Q<'_>| -> (String, Value) {
                        let rows: Vec<&Sample> = s
                            .find(qq.part, qq.mode, qq.test, qq.kind, qq.bytes, qq.concurrency)
                            .filter(|x| !x.row.is_null())
                            .collect();
                        let Some(first) = rows.first() else {
                            return ("—".into(), Value::Null);
                        };
                        let names: Vec<String> = first.row["steps"]
                            .as_array()
                            .map(|a| {
                                a.iter()
                                    .filter_map(|x| x["step"].as_str().map(str::to_owned))
                                    .collect()
                            })
                            .unwrap_or_default();
                        let mut cells = Vec::new();
                        let mut js = serde_json::Map::new();
                        for (i, name) in names.iter().enumerate() {
                            let v: Vec<f64> = rows
                                .iter()
                                .filter_map(|x| x.row["steps"][i]["p50_us"].as_f64())
                                .collect();
                            let st = stat(&v);
                            cells.push(format!("{name} {}", fmt_stat(st, 0)));
                            js.insert(name.clone(), json!(st));
                        }
                        (cells.join(", "), Value::Object(js))
                    };
                    let errs = s.errors(r);
                    let terrs = s.errors(t);
                    let (rs, rsj) = steps(r);
                    let (ts, tsj) = steps(t);
                    let rate = foot.cell(s, r, "rate_per_s", fmt_stat(s.stat(r, "rate_per_s"), 0));
                    let trate = foot.cell(s, t, "rate_per_s", fmt_stat(s.stat(t, "rate_per_s"), 0));
                    w.push_str(&format!(
                        "| {} | {conc} | {count} | {rate} | {trate} | {} | {} | {} | {} | {} | {} | {rs} | {ts} |\n",
                        mode.name(),
                        fmt_ratio(s.ratio(r, t, "rate_per_s", "rate_per_s")),
                        fmt_stat(s.stat(r, "lat_p50_us"), 0),
                        fmt_stat(s.stat(r, "lat_p99_us"), 0),
                        fmt_stat(s.stat(t, "lat_p50_us"), 0),
                        fmt_stat(s.stat(t, "lat_p99_us"), 0),
                        fmt_ratio(s.ratio(r, t, "lat_p50_us", "lat_p50_us")),
                    ));
                    json_connect.push(json!({
                        "mode": mode, "concurrency": conc, "connections": count,
                        "soft_rdma": {
                            "rate_per_s": s.stat(r, "rate_per_s"),
                            "lat_p50_us": s.stat(r, "lat_p50_us"),
                            "lat_p99_us": s.stat(r, "lat_p99_us"),
                            "steps_p50_us": rsj,
                            "errors": errs,
                        },
                        "tcp": {
                            "rate_per_s": s.stat(t, "rate_per_s"),
                            "lat_p50_us": s.stat(t, "lat_p50_us"),
                            "lat_p99_us": s.stat(t, "lat_p99_us"),
                            "steps_p50_us": tsj,
                            "errors": terrs,
                        },
                        "rate_ratio": s.ratio(r, t, "rate_per_s", "rate_per_s"),
                        "lat_p50_ratio": s.ratio(r, t, "lat_p50_us", "lat_p50_us"),
                    }));
                }
            }
            w.push('\n');
        }

        let mut json_data = Vec::new();
        if parts.contains(&Part::Data) {
            w.push_str(&format!("## 2. Data\n\n### Bandwidth, Gb/s (depth {}; send/write/read vs a kernel TCP stream of the same messages; daemons' CPU in cores, A+B)\n\n", p.depth));
            for &mode in &modes {
                w.push_str(&format!("**{} mode**\n\n| size | TCP stream | write | × | read | × | send | × | daemons' cores (write) |\n|---|---|---|---|---|---|---|---|---|\n", mode.name()));
                for &size in &p.bw_sizes {
                    let base = q("data", mode, "tcp-stream", "bw", size, 0);
                    let mut line = format!(
                        "| {} | {} ",
                        human(size),
                        foot.cell(s, base, "bw_gbps", fmt_stat(s.stat(base, "bw_gbps"), 3))
                    );
                    let mut js = serde_json::Map::new();
                    js.insert("tcp-stream".into(), json!(s.stat(base, "bw_gbps")));
                    for test in ["write", "read", "send"] {
                        let r = q("data", mode, test, "bw", size, 0);
                        line += &format!(
                            "| {} | {} ",
                            foot.cell(s, r, "bw_gbps", fmt_stat(s.stat(r, "bw_gbps"), 3)),
                            fmt_ratio(s.ratio(r, base, "bw_gbps", "bw_gbps"))
                        );
                        js.insert(
                            test.into(),
                            json!({
                                "bw_gbps": s.stat(r, "bw_gbps"),
                                "ratio": s.ratio(r, base, "bw_gbps", "bw_gbps"),
                                "errors": s.errors(r),
                                "daemon_cores": cores(s, r),
                            }),
                        );
                    }
                    let wq = q("data", mode, "write", "bw", size, 0);
                    line += &format!(
                        "| {} |\n",
                        cores(s, wq).map_or("—".into(), |c| format!("{:.2}", c))
                    );
                    w.push_str(&line);
                    json_data.push(json!({"mode": mode, "kind": "bw", "bytes": size, "results": js}));
                }
                w.push('\n');
            }
            w.push_str("### Latency, µs p50 / p99 (send, write: ping-pong half round trip; read: one Read's full round trip, compared with a full TCP round trip)\n\n");
            for &mode in &modes {
                w.push_str(&format!("**{} mode**\n\n| size | TCP ping-pong ½RTT | send ½RTT | p50 × | write ½RTT | p50 × | read RTT | p50 × (vs TCP RTT) |\n|---|---|---|---|---|---|---|---|\n", mode.name()));
                for &size in &p.lat_sizes {
                    let base = q("data", mode, "tcp-pingpong", "lat", size, 0);
                    let pair = |qq: Q<'_>| {
                        foot.cell(
                            s,
                            qq,
                            "lat_p50_us",
                            format!(
                                "{} / {}",
                                fmt_stat(s.stat(qq, "lat_p50_us"), 1),
                                fmt_stat(s.stat(qq, "lat_p99_us"), 1)
                            ),
                        )
                    };
                    let mut line = format!("| {} | {} ", human(size), pair(base));
                    let mut js = serde_json::Map::new();
                    js.insert(
                        "tcp-pingpong".into(),
                        json!({"p50_us": s.stat(base, "lat_p50_us"), "p99_us": s.stat(base, "lat_p99_us")}),
                    );
                    for test in ["send", "write", "read"] {
                        let r = q("data", mode, test, "lat", size, 0);
                        // A Read is a full round trip: compare with twice the TCP half round trip.
                        let ratio = s.ratio(r, base, "lat_p50_us", "lat_p50_us").map(|mut st| {
                            if test == "read" {
                                st.median /= 2.0;
                                st.min /= 2.0;
                                st.max /= 2.0;
                            }
                            st
                        });
                        line += &format!("| {} | {} ", pair(r), fmt_ratio(ratio));
                        js.insert(
                            test.into(),
                            json!({
                                "p50_us": s.stat(r, "lat_p50_us"),
                                "p99_us": s.stat(r, "lat_p99_us"),
                                "p50_ratio": ratio,
                                "errors": s.errors(r),
                                "daemon_cores": cores(s, r),
                            }),
                        );
                    }
                    line += "|\n";
                    w.push_str(&line);
                    json_data.push(json!({"mode": mode, "kind": "lat", "bytes": size, "results": js}));
                }
                w.push('\n');
            }
        }

        let mut json_scale = Vec::new();
        if parts.contains(&Part::Scale) {
            w.push_str("## 3. Scale: idle connections per daemon\n\nsetup: all N connected (256 in flight); memory: each daemon's VmRSS growth ÷ N (A active, B passive). Baseline: N kernel TCP connections (+ 32 B request/response), same concurrency; kernel socket memory is not in either figure.\n\n| mode | connections | soft-rdma setup ms | conn/s | TCP setup ms | setup × | RSS/conn A, bytes | RSS/conn B, bytes | soft-rdma teardown ms |\n|---|---|---|---|---|---|---|---|---|\n");
            for &mode in &modes {
                for &(n, _) in &p.scale {
                    let r = q("scale", mode, "connect", "hold", 0, n);
                    let t = q("scale", mode, "tcp-connect", "hold", 0, n);
                    let teardown: Vec<f64> = s
                        .find("scale", mode, "connect", "hold", 0, n)
                        .filter_map(|x| x.row["down"]["teardown_s"].as_f64())
                        .collect();
                    w.push_str(&format!(
                        "| {} | {n} | {} | {} | {} | {} | {} | {} | {} |\n",
                        mode.name(),
                        foot.cell(s, r, "setup_s", fmt_stat(ms(s.stat(r, "setup_s")), 1)),
                        fmt_stat(s.stat(r, "rate_per_s"), 0),
                        foot.cell(s, t, "setup_s", fmt_stat(ms(s.stat(t, "setup_s")), 1)),
                        fmt_ratio(s.ratio(r, t, "setup_s", "setup_s")),
                        fmt_stat(s.stat(r, "rss_per_conn_a"), 0),
                        fmt_stat(s.stat(r, "rss_per_conn_b"), 0),
                        fmt_stat(ms(stat(&teardown)), 1),
                    ));
                    json_scale.push(json!({
                        "mode": mode, "connections": n,
                        "soft_rdma": {
                            "setup_s": s.stat(r, "setup_s"),
                            "rate_per_s": s.stat(r, "rate_per_s"),
                            "rss_per_conn_a_bytes": s.stat(r, "rss_per_conn_a"),
                            "rss_per_conn_b_bytes": s.stat(r, "rss_per_conn_b"),
                            "teardown_s": stat(&teardown),
                            "errors": s.errors(r),
                        },
                        "tcp": {
                            "setup_s": s.stat(t, "setup_s"),
                            "rate_per_s": s.stat(t, "rate_per_s"),
                            "errors": s.errors(t),
                        },
                        "setup_ratio": s.ratio(r, t, "setup_s", "setup_s"),
                    }));
                }
            }
            w.push('\n');
        }
        foot.write(w);
        std::fs::create_dir_all(out)?;
        let svg = out.join("bench.svg");
        let plotted = if parts.contains(&Part::Data) {
            match plot(b, &modes, &svg) {
                Ok(()) => true,
                Err(e) => {
                    eprintln!("bench: plotting failed: {e:#}");
                    false
                }
            }
        } else {
            false
        };
        let json_path = out.join("bench.json");
        let md_path = out.join("bench.md");
        w.push_str(&format!(
            "Files: {}, {}{}; daemon and server logs in {}.\n",
            md_path.display(),
            json_path.display(),
            if plotted {
                format!(", {}", svg.display())
            } else {
                String::new()
            },
            b.log_dir.display()
        ));
        println!("{md}");
        std::fs::write(&md_path, &md)?;
        let report = json!({
            "quick": p.runs == 3 && p.bw_sizes.len() < 9,
            "profile": p,
            "duration_s": duration.as_secs_f64(),
            "total_s": total.as_secs_f64(),
            "modes": b.modes.iter().map(|(m, why)| json!({"mode": m, "available": why.is_none(), "reason": why})).collect::<Vec<_>>(),
            "notes": b.notes,
            "connect": json_connect,
            "data": json_data,
            "scale": json_scale,
            "samples": s.0,
        });
        std::fs::write(&json_path, serde_json::to_string_pretty(&report)?)?;
        Ok(())
    }

    /// Median cores (A+B daemons) over the successful runs.
    fn cores(s: &Samples, qq: Q<'_>) -> Option<f64> {
        let v: Vec<f64> = s
            .find(qq.part, qq.mode, qq.test, qq.kind, qq.bytes, qq.concurrency)
            .filter(|x| x.error.is_none())
            .filter_map(|x| x.daemon_cores.map(|c| c[0] + c[1]))
            .collect();
        stat(&v).map(|s| s.median)
    }

    fn plot(b: &Bench, modes: &[Mode], path: &Path) -> Result<()> {
        use plotters::prelude::*;
        let s = &b.samples;
        let p = &b.profile;
        let root = SVGBackend::new(path, (1400, 620)).into_drawing_area();
        root.fill(&WHITE)?;
        let (left, right) = root.split_horizontally(700);
        let colour = |test: &str| match test {
            "write" => RGBColor(31, 119, 180),
            "read" => RGBColor(44, 160, 44),
            "send" => RGBColor(255, 127, 14),
            _ => RGBColor(0, 0, 0),
        };
        // Series: (label, mode, points, colour, dashed).
        type Series = (String, Mode, Vec<(f64, f64)>, RGBColor, bool);
        let series = |kind: &str, tests: &[&str], field: &str, sizes: &[u64]| -> Vec<Series> {
            let mut v = Vec::new();
            for &mode in modes {
                for &test in tests {
                    let pts: Vec<(f64, f64)> = sizes
                        .iter()
                        .filter_map(|&size| {
                            let st = s.stat(q("data", mode, test, kind, size, 0), field)?;
                            (st.median > 0.0).then_some((size as f64, st.median))
                        })
                        .collect();
                    if !pts.is_empty() {
                        let label = if test.starts_with("tcp-") {
                            format!("{test} baseline ({} mode's namespaces)", mode.name())
                        } else if kind == "lat" && test == "read" {
                            format!("read, full RTT ({})", mode.name())
                        } else {
                            format!("{test} ({})", mode.name())
                        };
                        let mut c = colour(test);
                        if test.starts_with("tcp-") && mode == Mode::Xdp {
                            c = RGBColor(140, 140, 140);
                        }
                        v.push((label, mode, pts, c, mode == Mode::Xdp));
                    }
                }
            }
            v
        };
        let draw = |area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
                    title: &str,
                    ylabel: &str,
                    legend: SeriesLabelPosition,
                    data: Vec<Series>|
         -> Result<()> {
            let ys: Vec<f64> = data.iter().flat_map(|d| d.2.iter().map(|p| p.1)).collect();
            let (ymin, ymax) = if ys.is_empty() {
                (0.1, 10.0)
            } else {
                (
                    ys.iter().copied().fold(f64::MAX, f64::min) / 1.5,
                    ys.iter().copied().fold(0.0, f64::max) * 1.5,
                )
            };
            let mut chart = ChartBuilder::on(area)
                .caption(title, ("sans-serif", 20))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(60)
                .build_cartesian_2d((48f64..6e6f64).log_scale(), (ymin..ymax).log_scale())?;
            chart
                .configure_mesh()
                .x_desc("message size, bytes")
                .y_desc(ylabel)
                .x_label_formatter(&|x| {
                    let x = x.round();
                    if x >= 1e6 {
                        format!("{} MB", x / 1e6)
                    } else if x >= 1e3 {
                        format!("{} kB", x / 1e3)
                    } else {
                        format!("{x} B")
                    }
                })
                .draw()?;
            for (label, _mode, pts, c, dashed) in data {
                let style = ShapeStyle::from(&c).stroke_width(2);
                if dashed {
                    chart
                        .draw_series(DashedLineSeries::new(pts.clone(), 6, 4, style))?
                        .label(label)
                        .legend(move |(x, y)| {
                            plotters::element::DashedPathElement::new(
                                vec![(x, y), (x + 18, y)],
                                4,
                                3,
                                ShapeStyle::from(&c).stroke_width(2),
                            )
                        });
                } else {
                    chart
                        .draw_series(LineSeries::new(pts.clone(), style))?
                        .label(label)
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 18, y)], ShapeStyle::from(&c).stroke_width(2))
                        });
                }
                chart.draw_series(pts.iter().map(|&(x, y)| Circle::new((x, y), 3, c.filled())))?;
            }
            chart
                .configure_series_labels()
                .position(legend)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()?;
            Ok(())
        };
        draw(
            &left,
            "Bandwidth (median of runs)",
            "Gb/s",
            SeriesLabelPosition::LowerRight,
            series(
                "bw",
                &["tcp-stream", "write", "read", "send"],
                "bw_gbps",
                &p.bw_sizes,
            ),
        )?;
        draw(
            &right,
            "Latency p50 (send/write/TCP: half RTT; read: RTT)",
            "µs",
            SeriesLabelPosition::UpperLeft,
            series(
                "lat",
                &["tcp-pingpong", "send", "write", "read"],
                "lat_p50_us",
                &p.lat_sizes,
            ),
        )?;
        root.present()?;
        Ok(())
    }
}
