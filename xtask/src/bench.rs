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
//! 2. Data (`perf write|read|send` vs `perf tcp-stream`, `--latency` vs `perf tcp-pingpong`; iperf3 with the
//!    same message size and bytes beside the stream, and the stream's ratio to it): bandwidth and
//!    ping-pong latency for 64 B .. 4 MiB, powers of 4 (--quick: powers of 16), per transport mode; the CPU
//!    every process on each side (perf client and server, both daemons) used per Gb/s, and its voluntary
//!    context switches per 64 B round trip (with the client library's progress thread's share on a row of
//!    its own), over the measured interval only ([`usage`]).
//! 3. Scale (`perf connect --hold N` vs `perf tcp-connect --hold N`): 1, 1,024 and 16,384 idle connections:
//!    setup time and each daemon's resident memory per connection (VmRSS before and after).
//! 4. Loss ([`loss`], `--only loss`; not in --quick's default): Write, Read and Send of tens of MiB over
//!    issue 7's impaired link, XDP ↔ XDP against kernel ↔ kernel in every run, each side's retransmission
//!    timeouts and recovery episodes beside the rates; `loss.md`, `loss.json`.
//! 5. Apps ([`apps`], `--only apps`; not in the default set): iperf3 and qperf's `tcp_*` over plain kernel TCP
//!    as baselines for fio `ioengine=rdma`, qperf's `rc_*` and perftest on soft-rdma's drop-in libraries,
//!    and the bench's own TCP stream beside iperf3 (issue 42).
//!
//! Every figure is the median of the runs (3 with --quick, else 5) with min and max; every comparison is
//! the median of per-run ratios to the baseline measured in the same run and namespaces, runs with a
//! failure on either side left out (and said so in the cell). Namespace A's processes run on half of the
//! CPUs and B's on the other half (`--pin sides`, as on two hosts; `--pin none`, `--pin CPU`);
//! `--spin-us US` and `--cq-spin ROUNDS` make XDP mode's daemons and clients spin before they sleep.
//! Output: tables on stdout and in `bench.md`, everything (raw rows included) in `bench.json`, and
//! `bench.svg`. Performance claims live here only, never as timed assertions in tests.
//!
//! The rooms: this file runs the parts ([`Bench`]); [`netns`] makes one environment (namespaces, daemons,
//! perf servers); [`procs`] starts, limits and cleans up processes; [`usage`] reads what they used;
//! [`stats`] holds the samples and their statistics; [`markdown`] writes the tables and bench.json;
//! [`svg`] draws bench.svg; [`profile`] is `cargo xtask profile`.

mod apps;
mod loss;
mod markdown;
mod netns;
mod perftest;
mod procs;
pub mod profile;
mod stats;
mod svg;
mod usage;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Serialize;
use serde_json::{Value, json};

use netns::{Env, Tools};
use procs::{Proc, install_signal_cleanup, rss, run_limited, run_measured};
use stats::{Sample, Samples};

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
    /// Where the processes run (sched_setaffinity). `sides` (the default with 2 CPUs or more): namespace
    /// A's (its daemon, the perf clients) on the first half of the CPUs, B's (its daemon, the perf servers)
    /// on the second half, as on two hosts. `none`: wherever the scheduler puts them; it then sometimes
    /// stacks both ends of a ping-pong on one CPU and sometimes not, and a 64 B latency swings by ×3 from run
    /// to run. `CPU`: every process on that one CPU.
    #[arg(long, value_name = "sides|none|CPU")]
    pin: Option<procs::Pin>,
    /// XDP mode: both daemons run with `--xdp-busy-poll-us US` (after their last work they keep running the
    /// stack and polling the queue pairs' rings that long, so clients post without a doorbell).
    #[arg(long, value_name = "US")]
    spin_us: Option<u64>,
    /// XDP mode: perf clients and servers poll their completion rings this many rounds before they sleep
    /// (`SOFT_RDMA_CQ_SPIN`).
    #[arg(long, value_name = "ROUNDS")]
    cq_spin: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Part {
    Connect,
    Data,
    Scale,
    /// Issue 7's lossy link, XDP against kernel mode in each run (`loss.rs`; not in --quick's default).
    Loss,
    /// Debian's perftest and cmtime on soft-rdma's drop-in libraries ([`perftest`]).
    Perftest,
    /// iperf3, qperf, fio and perftest against baselines no one here wrote ([`apps`]; not in the default set).
    Apps,
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
    /// perftest's bandwidth (part 4): about this many bytes per size, with the same `bw_iters` cap. perftest's
    /// own default is 5000 messages of 64 KiB (320 MiB, `-n`/`-s` unset); a run of 96 MiB lasts about 100 ms,
    /// as long as a connection's first ramp (send and receive buffers growing), and measured that ramp more
    /// than the stream for perftest and TCP alike.
    perftest_bw_bytes: u64,
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
                perftest_bw_bytes: 96 << 20,
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
                perftest_bw_bytes: 320 << 20,
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

    /// The namespaces and daemons (`label`) for run `run.0` of `run.1` of `part` in `mode`, announced as
    /// "`heading`, MODE mode, run R/N: `detail`"; `None` when the rest of the part is skipped (noted) or the
    /// mode is unavailable ([`Self::env_or_unavailable`]).
    fn run_env(
        &mut self,
        mode: Mode,
        label: &str,
        (part, heading): (&str, &str),
        run: (u32, u32),
        detail: &str,
    ) -> Result<Option<Env>> {
        if self.skipping().is_some() {
            self.skip_rest(mode, part, run.0);
            return Ok(None);
        }
        self.progress(&format!(
            "{heading}, {} mode, run {}/{}: {detail}",
            mode.name(),
            run.0,
            run.1
        ));
        self.env_or_unavailable(label, mode)
    }

    /// [`Self::env`]; in XDP mode a failure (the XDP transport does not come up here) marks the mode
    /// unavailable and gives `None`; in kernel mode it is the error.
    fn env_or_unavailable(&mut self, label: &str, mode: Mode) -> Result<Option<Env>> {
        match self.env(label, mode) {
            Ok(e) => Ok(Some(e)),
            Err(e) if mode == Mode::Xdp => {
                self.modes.insert(mode, Some(format!("{e:#}")));
                Ok(None)
            }
            Err(e) => Err(e),
        }
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

    /// Runs one perf invocation with `args` and records its result in `sample` (which names the
    /// measurement: [`Sample::new`]).
    fn measure(&mut self, env: &mut Env, sample: Sample, args: &[String]) -> Result<()> {
        let (mode, kind, bytes, concurrency, run) = (
            sample.mode,
            sample.kind,
            sample.bytes,
            sample.concurrency,
            sample.run,
        );
        let test = sample.test.clone();
        let test = test.as_str();
        let tcp = test.starts_with("tcp-");
        if let Some(why) = self.skipping() {
            self.samples.0.push(Sample {
                error: Some(why),
                ..sample
            });
            return Ok(());
        }
        let mut cmd = env.perf(&self.tools, test, tcp, args);
        // Every process on both sides: for soft-rdma both daemons and its perf server, for TCP its server
        // (the client joins as itself).
        let watch = env.watch(tcp);
        let limit = self.limit();
        let (out, usage) = run_measured(&mut cmd, &format!("perf {test}"), limit, &watch)?;
        let secs = out.wall.as_secs_f64();
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
        // A failed run's figures are not reported (nor is what it used).
        let usage = usage.filter(|_| error.is_none());
        self.samples.0.push(Sample {
            error,
            row: row.unwrap_or(Value::Null),
            usage,
            wall_s: secs,
            ..sample
        });
        if !dead.is_empty() {
            bail!("{}: {}", env.label, dead.join("; "));
        }
        Ok(())
    }

    fn data(&mut self, mode: Mode) -> Result<()> {
        let p = self.profile.clone();
        for run in 1..=p.runs {
            let setup = "namespaces and daemons";
            let Some(mut env) = self.run_env(mode, "data", ("data", "data"), (run, p.runs), setup)? else {
                return Ok(());
            };
            // Bandwidth (`--depth` in flight), then latency (`--latency`; the TCP ping-pong is one already).
            let parts = [
                (
                    "bw",
                    "bandwidth",
                    ["tcp-stream", "iperf3", "write", "read", "send"],
                    &p.bw_sizes,
                    p.bw_bytes,
                    p.bw_iters,
                ),
                (
                    "lat",
                    "latency",
                    ["tcp-pingpong", "send", "write", "read", ""],
                    &p.lat_sizes,
                    p.lat_bytes,
                    p.lat_iters,
                ),
            ];
            for (kind, what, tests, sizes, bytes, most_iters) in parts {
                for test in tests.into_iter().filter(|t| !t.is_empty()) {
                    self.progress(&format!(
                        "data, {} mode, run {run}/{}: {test} {what}, {}",
                        mode.name(),
                        p.runs,
                        size_list(sizes)
                    ));
                    for &size in sizes {
                        let iters = Profile::iters(bytes, most_iters, size);
                        if test == "iperf3" {
                            // iperf3 beside the bench's own stream, the same bytes in messages of the same
                            // size (issue 42: the stream must stay within ×1.1 of it).
                            let sample = Sample::new("data", mode, test, kind, size, 0, run);
                            let n = (u64::from(iters) * size).to_string();
                            // iperf3's largest `-l` is 1 MiB.
                            let l = size.min(1 << 20).to_string();
                            let extra = ["-l".into(), l, "-n".into(), n];
                            self.iperf3(&mut env, sample, &extra)?;
                            continue;
                        }
                        let mut args = vec![
                            "--size".into(),
                            size.to_string(),
                            "--iters".into(),
                            iters.to_string(),
                        ];
                        if kind == "bw" {
                            args.extend(["--depth".into(), p.depth.to_string()]);
                        } else if test != "tcp-pingpong" {
                            args.push("--latency".into());
                        }
                        let sample = Sample::new("data", mode, test, kind, size, 0, run);
                        self.measure(&mut env, sample, &args)?;
                    }
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
                let heading = ("connection setup", "connection setup");
                let detail = format!("{count} connections, {conc} in flight");
                let Some(mut env) = self.run_env(mode, "conn", heading, (run, p.runs), &detail)? else {
                    return Ok(());
                };
                for test in ["connect", "tcp-connect"] {
                    let args = vec![
                        "--count".into(),
                        count.to_string(),
                        "--concurrency".into(),
                        conc.to_string(),
                    ];
                    let sample = Sample::new("connect", mode, test, "rate", 0, conc, run);
                    self.measure(&mut env, sample, &args)?;
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
                let part = format!("scale ({n} connections)");
                let detail = format!("{n} idle connections (fresh namespaces)");
                let Some(mut env) = self.run_env(mode, "scale", (&part, "scale"), (run, runs), &detail)?
                else {
                    return Ok(());
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
                error: Some(why),
                ..Sample::new("scale", mode, test, "hold", 0, n, run)
            };
        }
        let pids = env.daemon_pids();
        // The servers' sessions were just opened: give the daemons a moment before their memory is read.
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
        let mut sample = Sample::new("scale", mode, test, "hold", 0, n, run);
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
    // perftest's part: the drop-in libraries (`soft-rdma run` finds them beside the CLI).
    crate::run(crate::cargo().args(["build", "--release", "-p", "soft-rdma-verbs", "--lib"]))?;
    let dir = root.join("target/release");
    Ok(Tools {
        cli: dir.join("soft-rdma"),
        daemon: dir.join("soft-rdmad"),
        spin: Default::default(),
    })
}

/// The report's notes on how the run was set up: the namespaces, the port range, spinning, pinning, the
/// machine.
fn setup_notes(
    a: &BenchArgs,
    pin: &procs::Pin,
    side_cpus: &[Option<Vec<usize>>; 2],
    cpus: usize,
) -> Vec<String> {
    let mut notes = Vec::new();
    notes.push(
        "Two network namespaces joined by a veth pair on one machine; soft-rdmad in each; `soft-rdma perf` \
         in namespace A against its server in B. Baselines: the same tool over plain kernel TCP sockets \
         (TCP_NODELAY) between the same namespaces."
            .into(),
    );
    notes.push(
        "net.ipv4.ip_local_port_range = 20000-49151 in both namespaces: kernel ephemeral ports stay out of \
         soft-rdma's port space (49152-65535)."
            .into(),
    );
    if a.spin_us.is_some() || a.cq_spin.is_some() {
        notes.push(format!(
            "Spinning in XDP mode: daemons --xdp-busy-poll-us {}, clients SOFT_RDMA_CQ_SPIN={} (every spinner \
             needs a CPU of its own: on fewer CPUs than spinners, they take turns at the scheduler's pace).",
            a.spin_us.unwrap_or(0),
            a.cq_spin.unwrap_or(0)
        ));
    }
    notes.push(match (&pin, &side_cpus) {
        (procs::Pin::Sides, [Some(a), Some(b)]) => format!(
            "--pin sides: namespace A's processes (its daemon, the perf clients) run on CPUs {a:?}, B's (its \
             daemon, the perf servers) on CPUs {b:?}, as on two hosts. Both ends of a ping-pong never share \
             a CPU, soft-rdma's or TCP's; unpinned (--pin none) the scheduler sometimes stacks them and \
             sometimes not, and 64 B latencies swing by ×3 from run to run."
        ),
        (procs::Pin::One(cpu), _) => {
            format!("--pin {cpu}: every process (daemons, perf clients and servers) runs on CPU {cpu} only.")
        }
        _ => "--pin none: every process runs wherever the scheduler puts it.".into(),
    });
    notes.push(format!(
        "{cpus} CPUs; kernel {}.",
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    ));
    notes
}

pub fn run(root: &Path, a: BenchArgs) -> Result<()> {
    let t_start = Instant::now();
    if !nix::unistd::geteuid().is_root() {
        bail!("cargo xtask bench creates network namespaces and veth pairs: run it as root");
    }
    crate::setup::run()?;
    let mut tools = match &a.bin_dir {
        Some(d) => Tools {
            cli: d.join("soft-rdma"),
            daemon: d.join("soft-rdmad"),
            spin: Default::default(),
        },
        None => build(root)?,
    };
    tools.spin = netns::Spin {
        daemon_us: a.spin_us,
        cq_rounds: a.cq_spin,
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pin = a.pin.unwrap_or(if cpus >= 2 {
        procs::Pin::Sides
    } else {
        procs::Pin::None
    });
    let side_cpus = procs::side_cpus(pin)?;
    let _ = procs::SIDE_CPUS.set(side_cpus.clone());
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
    let parts = if a.only.is_empty() && a.quick {
        vec![Part::Connect, Part::Data, Part::Scale, Part::Perftest]
    } else if a.only.is_empty() {
        vec![Part::Connect, Part::Data, Part::Scale, Part::Perftest, Part::Loss]
    } else {
        a.only.clone()
    };
    let mut profile = Profile::new(a.quick, a.runs);
    if parts.contains(&Part::Perftest) {
        perftest::extend_budget(&mut profile, a.quick);
    }
    if parts.contains(&Part::Apps) {
        apps::extend_budget(&mut profile, a.quick);
    }
    let (profile_budget, min_window) = (profile.budget_s, profile.min_window_s);
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
    bench.notes.extend(setup_notes(&a, &pin, &side_cpus, cpus));
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
                // Both modes in each run: after this loop.
                Part::Loss => Ok(()),
                Part::Perftest => bench.perftest(mode),
                Part::Apps => bench.apps(mode, a.quick),
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
    if parts.contains(&Part::Loss)
        && let Err(e) = bench.loss(&out, a.quick, a.runs)
    {
        let what = format!("Loss stopped early: {e:#}");
        eprintln!("bench: {what}");
        bench.notes.push(what);
    }
    let duration = bench.start.elapsed();
    markdown::write(&bench, &parts, &out, duration, t_start.elapsed())?;
    match kernel_failed {
        Some(e) => bail!("{e}"),
        None => Ok(()),
    }
}
