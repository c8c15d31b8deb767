//! `cargo xtask bench --only apps`: baselines no one here wrote (issue 42, item 3). Per mode and run, in the
//! bench's pinned namespaces (fresh ones per run), one after the other:
//!
//! - baselines over plain kernel TCP, no soft-rdma in the process: iperf3 with fio's block size (`-l 64K`)
//!   and with its default; qperf `tcp_bw` (`-m 1M`, as `rc_bw`) and `tcp_lat`;
//! - the bench's own stream (`soft-rdma perf tcp-stream`, 64 KiB, depth 16), so that its ratio to iperf3 in
//!   the same run (the ×1.1 rule) can be read;
//! - through `soft-rdma run`: fio `ioengine=rdma` write / read / send (64 KiB, iodepth 16, fio's own
//!   bandwidth from `--output-format=json`), qperf `rc_bw` (`-m 1M`), `rc_lat` and `rc_rdma_read_lat`
//!   (`-cm1`), perftest `ib_write_bw` / `ib_read_bw` / `ib_send_bw` (64 KiB, `-t 16`);
//! - `soft-rdma perf write|read|send` of the same size and depth (XDP mode's targets compare with it).
//!
//! The report ([`section`]) gives each figure (median, min–max) and each target's ratio as the median (min,
//! max) of per-run ratios against the baseline of the same run, with met / NOT MET. CPU per Gb/s: iperf3's
//! own (`cpu_utilization_percent`, host = A, remote = B) and perftest's from the bench's [`usage`] module
//! (client, both daemons and server, between perftest's results header and row).
//!
//! Every program is started by pid and stopped by pid on every exit path ([`Proc`]): iperf3's server runs
//! with `-1` (one test); qperf's server forks a child per test, which goes first ([`stop_with_children`]);
//! fio runs with `--thread` (the job stays in the process that was started).
//!
//! [`usage`]: super::usage

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde_json::{Value, json};

use super::markdown::{Foot, fmt_ratio, fmt_stat, per_gbps};
use super::netns::{Env, Side};
use super::procs::{Proc, run_limited, signal};
use super::stats::{Sample, Samples, Stat, q};
use super::{Bench, Mode, Profile};

/// fio's and iperf3's block size (the targets' 64 KiB).
const BLOCK: u64 = 64 << 10;
/// fio's iodepth, and the depth of perftest and `soft-rdma perf` in this part.
const DEPTH: u32 = 16;
/// iperf3's server port.
const IPERF_PORT: u16 = 5201;
/// qperf's control ports: the plain server and the one on soft-rdma's libraries.
const QPERF_PLAIN: u16 = 17765;
const QPERF_RDMA: u16 = 17766;
/// fio's rdma_cm ports (one per invocation; below perftest's 18515 and up).
const FIO_PORT: u16 = 17800;
/// qperf's message size for `tcp_bw` and `rc_bw` (`rc_bw` needs 1 MiB or more on soft-rdma to keep its
/// receive queue fed: docs/running-rdma-programs.md).
const QPERF_MSG: &str = "1M";
/// Tries of a qperf client refused by qperf 0.4.11's own listen race, and what it then prints last.
const QPERF_TRIES: u32 = 5;
const QPERF_REFUSED: &str = "expecting: Event established";
/// fio's `send` server: receives posted at once (fio's queue pair holds twice its iodepth, `engines/rdma.c`
/// `qp_depth`, within soft-rdma's `max_qp_wr` of 32,768). fio reposts each as it completes; the depth is a
/// margin, as iWARP has no receiver-not-ready retry and a Send that finds no receive ends the connection.
const FIO_SEND_SERVER_DEPTH: u64 = 512;
/// Seconds at the start of each fio run that fio leaves out of its figures (`--ramp_time`): its rdma engine
/// sleeps 500 ms in `fio_rdmaio_connect` (`usleep(500000)`, for the server's receives) inside the job's
/// runtime, so that a run of a fixed size counts the sleep as transfer time. 512 MiB at 5 Gb/s then
/// measured ×0.6 of the stream's rate, and `send`'s 32 MiB ×0.1.
const FIO_RAMP_SECS: u32 = 1;
/// The bytes a fio job cycles over (its "file": the server's registered buffers are `--iodepth` blocks).
const FIO_FILE: u64 = 256 << 20;

/// Seconds each timed program runs (iperf3 `-t`, qperf `-t`, fio `--runtime`); [`bytes`]: what each perf
/// or perftest run moves.
pub(super) fn secs(quick: bool) -> u32 {
    if quick { 2 } else { 5 }
}

fn bytes(quick: bool) -> u64 {
    if quick { 512 << 20 } else { 2 << 30 }
}

/// The part's share of the time budget (about 60 s per mode and run with `--quick`).
pub(super) fn extend_budget(p: &mut Profile, quick: bool) {
    let extra = u64::from(p.runs) * if quick { 2 * 90 } else { 2 * 160 };
    p.budget_s += extra;
    p.min_window_s += extra;
}

impl Bench {
    /// One mode's apps part: per run, fresh namespaces, then the baselines and the programs, interleaved.
    pub(super) fn apps(&mut self, mode: Mode, quick: bool) -> Result<()> {
        let p = self.profile.clone();
        let t = secs(quick);
        for run in 1..=p.runs {
            let heading = ("apps", "apps");
            let setup = "namespaces and daemons";
            let Some(mut env) = self.run_env(mode, "apps", heading, (run, p.runs), setup)? else {
                return Ok(());
            };
            let step = |b: &mut Bench, what: &str| {
                b.progress(&format!(
                    "apps, {} mode, run {run}/{}: {what}",
                    mode.name(),
                    p.runs
                ));
            };
            step(self, "iperf3, perf tcp-stream, qperf tcp_bw/tcp_lat (kernel TCP)");
            for (test, len) in [("iperf3-64k", Some("64K")), ("iperf3", None)] {
                let sample = Sample::new("apps", mode, test, "bw", BLOCK, 0, run);
                let mut extra = vec!["-t".to_string(), t.to_string()];
                extra.extend(
                    len.map(|l| ["-l".to_string(), l.to_string()])
                        .into_iter()
                        .flatten(),
                );
                self.iperf3(&mut env, sample, &extra)?;
            }
            let iters = Profile::iters(bytes(quick), u32::MAX, BLOCK);
            let perf_args = vec![
                "--size".into(),
                BLOCK.to_string(),
                "--iters".into(),
                iters.to_string(),
                "--depth".into(),
                DEPTH.to_string(),
            ];
            let sample = Sample::new("apps", mode, "tcp-stream", "bw", BLOCK, 0, run);
            self.measure(&mut env, sample, &perf_args)?;
            for (test, kind) in [("tcp_bw", "bw"), ("tcp_lat", "lat")] {
                let sample = Sample::new("apps", mode, &format!("qperf-{test}"), kind, BLOCK, 0, run);
                self.qperf(&mut env, sample, test, Qperf::Plain, t)?;
            }
            step(self, "fio ioengine=rdma write/read/send, soft-rdma perf");
            for verb in ["write", "read", "send"] {
                let sample = Sample::new("apps", mode, &format!("fio-{verb}"), "bw", BLOCK, 0, run);
                self.fio(&mut env, sample, verb, t)?;
                let sample = Sample::new("apps", mode, verb, "bw", BLOCK, 0, run);
                self.measure(&mut env, sample, &perf_args)?;
            }
            step(self, "qperf rc_bw/rc_lat/rc_rdma_read_lat, perftest ib_*_bw");
            for (test, kind) in [("rc_bw", "bw"), ("rc_lat", "lat"), ("rc_rdma_read_lat", "lat")] {
                let sample = Sample::new("apps", mode, &format!("qperf-{test}"), kind, BLOCK, 0, run);
                self.qperf(&mut env, sample, test, Qperf::Rdma, t)?;
            }
            // The same latency with the library's inline wait off (the runtime's thread serves the
            // connections and wakes qperf through the channel's pipe): what the inline wait is worth.
            let sample = Sample::new("apps", mode, "qperf-rc_lat-pipe", "lat", BLOCK, 0, run);
            self.qperf(&mut env, sample, "rc_lat", Qperf::RdmaPipeWait, t)?;
            let pt_iters = Profile::iters(bytes(quick), u32::MAX, BLOCK);
            for program in ["ib_write_bw", "ib_read_bw", "ib_send_bw"] {
                let pargs = [
                    "-s".to_string(),
                    BLOCK.to_string(),
                    "-n".into(),
                    pt_iters.to_string(),
                    "-t".into(),
                    DEPTH.to_string(),
                    "--report_gbits".into(),
                ];
                let sample = Sample::new("apps", mode, program, "bw", BLOCK, 0, run);
                self.perftest_one(&mut env, sample, &pargs)?;
                cpu_into_row(self.samples.0.last_mut().expect("just pushed"));
            }
        }
        Ok(())
    }

    /// `iperf3 -s -1` in B, `iperf3 -c B -J EXTRA…` in A, both plain (no soft-rdma). Also part 2's iperf3
    /// column, beside the bench's own TCP stream (`-l SIZE -n BYTES`).
    pub(super) fn iperf3(&mut self, env: &mut Env, mut sample: Sample, extra: &[String]) -> Result<()> {
        if self.skip(&mut sample) {
            return Ok(());
        }
        let port = IPERF_PORT.to_string();
        let log = env.log(&format!("{}-server-run{}", sample.test, sample.run));
        let server = plain(env, Side::B, "iperf3", &["-s", "-1", "-p", &port]);
        let b = env.ip[1].to_string();
        let mut args = vec!["-c", &b, "-p", &port, "-J"];
        args.extend(extra.iter().map(String::as_str));
        let client = plain(env, Side::A, "iperf3", &args);
        let limit = self.limit();
        let ready = Listening::Tcp(IPERF_PORT);
        let r = pair_ready(env, (server, &log, ready, true), client, limit);
        self.record(sample, r, |out| {
            let v: Value = serde_json::from_str(out)?;
            let gbps = v["end"]["sum_received"]["bits_per_second"]
                .as_f64()
                .ok_or_else(|| anyhow::anyhow!("no end.sum_received in iperf3's JSON"))?
                / 1e9;
            let cpu = &v["end"]["cpu_utilization_percent"];
            let per = |k: &str| cpu[k].as_f64().map(|pct| pct / 100.0 / gbps);
            Ok(json!({
                "bw_gbps": gbps,
                "cores_per_gbps_a": per("host_total"),
                "cores_per_gbps_b": per("remote_total"),
            }))
        })
    }

    /// qperf's server in B (plain, or on soft-rdma's libraries for `rc_*`), its client in A running `test`.
    fn qperf(&mut self, env: &mut Env, mut sample: Sample, test: &str, how: Qperf, t: u32) -> Result<()> {
        let rdma = how != Qperf::Plain;
        if self.skip(&mut sample) {
            return Ok(());
        }
        let lp = if rdma { QPERF_RDMA } else { QPERF_PLAIN };
        let lps = lp.to_string();
        let log = env.log(&format!("{}-server-run{}", sample.test, sample.run));
        let b = env.ip[1].to_string();
        let t = t.to_string();
        let mut args = vec!["-lp", &lps, "-t", &t, "-to", "20"];
        if test.ends_with("_bw") {
            args.extend(["-m", QPERF_MSG]);
        }
        if rdma {
            args.extend(["-cm1"]);
        }
        args.extend([b.as_str(), test]);
        // qperf 0.4.11 sends its port before it listens: a quick client is refused (its listen race,
        // docs/running-rdma-programs.md); each try gets a fresh server, 5 tries in all.
        let mut r = Err(anyhow::anyhow!("not run"));
        for n in 1..=QPERF_TRIES {
            let (server, client) = if rdma {
                let mut pair = (
                    super::perftest::drop_in(self, env, Side::B, "qperf", &["-lp", &lps]),
                    super::perftest::drop_in(self, env, Side::A, "qperf", &args),
                );
                if how == Qperf::RdmaPipeWait {
                    pair.0.env("SOFT_RDMA_INLINE_WAIT", "off");
                    pair.1.env("SOFT_RDMA_INLINE_WAIT", "off");
                }
                pair
            } else {
                (
                    plain(env, Side::B, "qperf", &["-lp", &lps]),
                    plain(env, Side::A, "qperf", &args),
                )
            };
            let limit = self.limit();
            r = pair_ready(env, (server, &log, Listening::Tcp(lp), false), client, limit);
            match &r {
                Err(e) if n < QPERF_TRIES && format!("{e:#}").contains(QPERF_REFUSED) => {
                    eprintln!(
                        "        {}: refused (qperf's listen race), try {} of {QPERF_TRIES}",
                        sample.test,
                        n + 1
                    );
                }
                _ => break,
            }
        }
        let bw = test.ends_with("_bw");
        self.record(sample, r, |out| qperf_figure(out, bw))
    }

    /// fio's server (`--rw=read`) in B and client (`--rw=write --verb=VERB`) in A on soft-rdma's libraries,
    /// 64 KiB blocks, iodepth 16, for `secs` seconds after fio's ramp; the client's bandwidth from its JSON.
    fn fio(&mut self, env: &mut Env, mut sample: Sample, verb: &str, secs: u32) -> Result<()> {
        if self.skip(&mut sample) {
            return Ok(());
        }
        let port = FIO_PORT + (self.samples.0.len() % 500) as u16;
        // The client runs for a time (`--time_based`, cycling over its [`FIO_FILE`]), after a ramp
        // fio leaves out ([`FIO_RAMP_SECS`]). A write or read server ends at the client's closing message; a
        // send server waits for receives that never come once the client has gone (as on any device), and
        // is stopped by pid after the client.
        let server_depth = if verb == "send" {
            FIO_SEND_SERVER_DEPTH
        } else {
            u64::from(DEPTH)
        };
        let common = [
            "--ioengine=rdma".to_string(),
            "--thread".into(),
            format!("--port={port}"),
            format!("--bs={BLOCK}"),
            "--output-format=json".into(),
        ];
        // The job's name, then the engine: fio knows the engine's options (port, hostname, verb) only after
        // `--ioengine=rdma`.
        let mut s_args: Vec<String> = vec!["--name=server".into()];
        s_args.extend(common.iter().cloned());
        // A send server's job ends once it has received its size, and its disconnect then flushes the
        // client's sends, where fio's client waits for ever: its size is one no run reaches.
        let server_size = if verb == "send" {
            "1t".to_string()
        } else {
            FIO_FILE.to_string()
        };
        s_args.extend([
            "--rw=read".into(),
            format!("--iodepth={server_depth}"),
            format!("--size={server_size}"),
        ]);
        let mut c_args: Vec<String> = vec!["--name=client".into()];
        c_args.extend(common.iter().cloned());
        c_args.extend([
            "--rw=write".into(),
            format!("--hostname={}", env.ip[1]),
            format!("--verb={verb}"),
            format!("--iodepth={DEPTH}"),
            format!("--size={FIO_FILE}"),
            "--time_based".into(),
            format!("--runtime={secs}"),
            format!("--ramp_time={FIO_RAMP_SECS}"),
        ]);
        let s: Vec<&str> = s_args.iter().map(String::as_str).collect();
        let c: Vec<&str> = c_args.iter().map(String::as_str).collect();
        let log = env.log(&format!("{}-server-run{}", sample.test, sample.run));
        let server = super::perftest::drop_in(self, env, Side::B, "fio", &s);
        let client = super::perftest::drop_in(self, env, Side::A, "fio", &c);
        let limit = self.limit();
        let sock = env.sock(Side::B);
        let ready = Listening::Rdma(&self.tools.cli, &sock, port);
        let r = pair_ready(env, (server, &log, ready, verb != "send"), client, limit);
        self.record(sample, r, fio_figure)
    }

    /// Fills in `sample` (skipped: out of the budget or after a hang) and pushes it; `true` if skipped.
    fn skip(&mut self, sample: &mut Sample) -> bool {
        match self.skipping() {
            Some(why) => {
                sample.error = Some(why);
                self.samples.0.push(sample.clone());
                true
            }
            None => false,
        }
    }

    /// Records the result of a pair: the row `parse` makes of the client's stdout, or the error.
    fn record(
        &mut self,
        mut sample: Sample,
        r: Result<(String, f64)>,
        parse: impl Fn(&str) -> Result<Value>,
    ) -> Result<()> {
        let r = r.and_then(|(out, wall)| Ok((parse(&out)?, wall)));
        match r {
            Ok((row, wall)) => {
                sample.row = row;
                sample.wall_s = wall;
            }
            Err(e) => {
                let e = format!("{e:#}");
                eprintln!("        {}: FAILED: {e}", sample.test);
                if e.contains("HUNG") {
                    self.hung(sample.mode);
                }
                sample.error = Some(e);
            }
        }
        self.samples.0.push(sample);
        Ok(())
    }
}

/// `PROGRAM ARGS…` in `side`'s namespace, pinned as that side's processes, with no soft-rdma library.
fn plain(env: &Env, side: Side, program: &str, args: &[&str]) -> Command {
    let mut c = env.in_ns(side, Path::new(program));
    c.args(args);
    c
}

/// How to tell that a server listens.
enum Listening<'a> {
    /// A kernel TCP listener on this port in B (`ss`).
    Tcp(u16),
    /// A listener of B's soft-rdmad on this port (`soft-rdma --uds SOCK status`).
    Rdma(&'a Path, &'a Path, u16),
}

/// Starts `server` (output to `log`), waits until it listens, runs `client` to completion (at most `limit`),
/// then (after up to 10 s for a server that `exits_alone`) stops the server and any child it forked, by
/// pid. Returns the client's stdout and wall time.
fn pair_ready(
    env: &mut Env,
    (mut server, log, ready, exits_alone): (Command, &Path, Listening<'_>, bool),
    mut client: Command,
    limit: Duration,
) -> Result<(String, f64)> {
    let f = std::fs::File::create(log)?;
    server.stdin(Stdio::null()).stdout(f.try_clone()?).stderr(f);
    let mut srv = Proc::spawn(&mut server, "apps server")?;
    let deadline = Instant::now() + Duration::from_secs(15);
    while !listens(env, &ready) {
        if let Some(st) = srv.exited() {
            bail!(
                "server exited ({st}) before listening: {}",
                super::netns::last_lines(log, 3)
            );
        }
        if Instant::now() > deadline {
            stop_with_children(&mut srv);
            bail!(
                "server not listening in 15 s: {}",
                super::netns::last_lines(log, 3)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let t0 = Instant::now();
    let out = run_limited(&mut client, "apps client", limit);
    let wall = t0.elapsed().as_secs_f64();
    // iperf3 -1 and fio's server exit on their own after the client: a moment for them; qperf's never does.
    if exits_alone && out.as_ref().is_ok_and(|o| o.ok) {
        let _ = srv.wait_for(Duration::from_secs(10));
    }

    stop_with_children(&mut srv);
    let out = out?;
    let _ = std::fs::write(
        log.with_extension("client.log"),
        format!(
            "{client:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            out.stdout, out.stderr
        ),
    );
    let dead = env.casualties();
    if !dead.is_empty() {
        bail!("{}", dead.join("; "));
    }
    if out.killed {
        bail!("HUNG: no result within {} s; killed", limit.as_secs());
    }
    if !out.ok {
        let tail = |t: &str| {
            t.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .trim()
                .to_owned()
        };
        bail!(
            "client failed: {} {}",
            tail(&out.stderr),
            tail(&out.stdout).chars().take(200).collect::<String>()
        );
    }
    Ok((out.stdout, wall))
}

fn listens(env: &Env, ready: &Listening<'_>) -> bool {
    match *ready {
        Listening::Tcp(port) => {
            let out = Command::new("ip")
                .args(["netns", "exec", &env.ns[1], "ss", "-Hltn"])
                .arg(format!("sport = :{port}"))
                .output();
            out.is_ok_and(|o| !String::from_utf8_lossy(&o.stdout).trim().is_empty())
        }
        Listening::Rdma(cli, sock, port) => {
            let out = Command::new(cli).arg("--uds").arg(sock).arg("status").output();
            out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(&format!(":{port} ")))
        }
    }
}

/// Stops `p` by pid after the children it forked (qperf's server forks one per test), each by pid.
fn stop_with_children(p: &mut Proc) {
    if p.exited().is_none() {
        for child in children(p.pid()) {
            signal(child, nix::sys::signal::Signal::SIGKILL);
        }
    }
    p.stop();
}

/// The process ids whose parent is `pid` (`/proc/PID/stat`, field 4; as `tests/src/qperf.rs`).
fn children(pid: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| {
            std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|stat| {
                // `pid (comm) state ppid …`: comm may hold spaces, so the fields after the last ')'.
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok())
                    == Some(pid)
            })
        })
        .collect()
}

/// qperf's figure (`bw = 2.93 GB/sec`, `latency = 13.4 us`) in Gb/s or µs. qperf's GB, MB and KB are powers
/// of 10 (`src/qperf.c`, `show_rate`).
fn qperf_figure(out: &str, bw: bool) -> Result<Value> {
    let key = if bw { "bw" } else { "latency" };
    for line in out.lines() {
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        if k.trim() != key {
            continue;
        }
        let mut f = v.split_whitespace();
        let (Some(n), Some(unit)) = (f.next().and_then(|n| n.parse::<f64>().ok()), f.next()) else {
            continue;
        };
        let scale = match unit {
            "GB/sec" => 8.0,
            "MB/sec" => 8e-3,
            "KB/sec" => 8e-6,
            "bytes/sec" => 8e-9,
            "Gb/sec" => 1.0,
            "Mb/sec" => 1e-3,
            "ns" => 1e-3,
            "us" => 1.0,
            "ms" => 1e3,
            "sec" => 1e6,
            _ => bail!("qperf: unknown unit {unit:?} in {line:?}"),
        };
        return Ok(if bw {
            json!({ "bw_gbps": n * scale })
        } else {
            json!({ "lat_us": n * scale })
        });
    }
    bail!("no `{key} = …` line in qperf's output")
}

/// The client job's bandwidth from fio's JSON (`jobs[0].write.bw_bytes` or `.read`, bytes per second).
fn fio_figure(out: &str) -> Result<Value> {
    // fio may print notes before its JSON.
    let start = out
        .find('{')
        .ok_or_else(|| anyhow::anyhow!("no JSON in fio's output"))?;
    let v: Value = serde_json::from_str(&out[start..])?;
    let job = &v["jobs"][0];
    if job["error"].as_i64().unwrap_or(0) != 0 {
        bail!("fio's job error {}", job["error"]);
    }
    let bw = ["write", "read"]
        .iter()
        .filter_map(|d| job[d]["bw_bytes"].as_f64())
        .fold(0.0, f64::max);
    if bw <= 0.0 {
        bail!("fio reported no bandwidth (its messages: the client's and server's logs)");
    }
    Ok(json!({ "bw_gbps": bw * 8.0 / 1e9 }))
}

/// perftest's CPU per Gb/s of each side (from the bench's usage of the sample) into its row, so that it can
/// be paired run by run with iperf3's.
fn cpu_into_row(s: &mut Sample) {
    let (Some(u), Some(bytes), Some(it)) = (&s.usage, s.f("bytes"), s.f("iterations")) else {
        return;
    };
    let bits = bytes * it * 8.0;
    let (a, b) = (u.cores_per_gbps(true, bits), u.cores_per_gbps(false, bits));
    if let Value::Object(m) = &mut s.row {
        m.insert("cores_per_gbps_a".into(), json!(a));
        m.insert("cores_per_gbps_b".into(), json!(b));
    }
}

/// A target's bound.
#[derive(Clone, Copy)]
enum Bound {
    AtLeast(f64),
    AtMost(f64),
    /// Within ×k either way.
    Within(f64),
}

impl Bound {
    fn text(self) -> String {
        // At most two decimals, no trailing zeros (1/1.1: ×0.91).
        let x = |k: f64| {
            let t = format!("{k:.2}");
            t.trim_end_matches('0').trim_end_matches('.').to_owned()
        };
        match self {
            Bound::AtLeast(k) => format!("≥ ×{}", x(k)),
            Bound::AtMost(k) => format!("≤ ×{}", x(k)),
            Bound::Within(k) => format!("within ×{}", x(k)),
        }
    }

    fn met(self, m: f64) -> bool {
        match self {
            Bound::AtLeast(k) => m >= k,
            Bound::AtMost(k) => m <= k,
            Bound::Within(k) => m >= 1.0 / k && m <= k,
        }
    }
}

/// How qperf runs: over kernel TCP, or on soft-rdma's libraries (with the library's inline wait in
/// `ibv_get_cq_event`, its default, or without it: `SOFT_RDMA_INLINE_WAIT=off`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Qperf {
    Plain,
    Rdma,
    RdmaPipeWait,
}

/// (what, baseline, field, bound; `None`: no target in this mode, the ratio is shown).
type Ratio = (&'static str, &'static str, &'static str, Option<Bound>);

/// The ratios of one mode: the figure's test, its baseline's, the field, and the target.
fn ratios(mode: Mode) -> Vec<Ratio> {
    let k = |b: Bound| (mode == Mode::Kernel).then_some(b);
    let x = |b: Bound| (mode == Mode::Xdp).then_some(b);
    let mut v: Vec<Ratio> = vec![("tcp-stream", "iperf3-64k", "bw_gbps", Some(Bound::Within(1.1)))];
    for t in [
        "fio-write",
        "fio-read",
        "fio-send",
        "ib_write_bw",
        "ib_read_bw",
        "ib_send_bw",
    ] {
        v.push((t, "iperf3-64k", "bw_gbps", k(Bound::AtLeast(0.9))));
    }
    v.push(("qperf-rc_bw", "qperf-tcp_bw", "bw_gbps", k(Bound::AtLeast(0.9))));
    v.push(("qperf-rc_lat", "qperf-tcp_lat", "lat_us", k(Bound::AtMost(1.1))));
    v.push(("qperf-rc_lat", "qperf-rc_lat-pipe", "lat_us", None));
    v.push((
        "qperf-rc_rdma_read_lat",
        "qperf-tcp_lat",
        "lat_us",
        k(Bound::AtMost(2.2)),
    ));
    for (t, n) in [
        ("fio-write", "write"),
        ("fio-read", "read"),
        ("fio-send", "send"),
        ("ib_write_bw", "write"),
        ("ib_read_bw", "read"),
        ("ib_send_bw", "send"),
    ] {
        v.push((t, n, "bw_gbps", x(Bound::AtLeast(1.0 / 1.1))));
    }
    for t in ["ib_write_bw", "ib_read_bw", "ib_send_bw"] {
        for f in ["cores_per_gbps_a", "cores_per_gbps_b"] {
            v.push((t, "iperf3-64k", f, k(Bound::AtMost(1.0))));
        }
    }
    v
}

/// What each test is, for the figures table.
const FIGURES: [(&str, &str, &str); 18] = [
    ("iperf3-64k", "bw_gbps", "iperf3 -l 64K (kernel TCP)"),
    ("iperf3", "bw_gbps", "iperf3, its default length (kernel TCP)"),
    (
        "tcp-stream",
        "bw_gbps",
        "soft-rdma perf tcp-stream 64 KiB, depth 16 (kernel TCP)",
    ),
    ("qperf-tcp_bw", "bw_gbps", "qperf tcp_bw -m 1M (kernel TCP)"),
    ("qperf-tcp_lat", "lat_us", "qperf tcp_lat (kernel TCP)"),
    ("fio-write", "bw_gbps", "fio rdma --verb=write"),
    ("fio-read", "bw_gbps", "fio rdma --verb=read"),
    ("fio-send", "bw_gbps", "fio rdma --verb=send"),
    ("write", "bw_gbps", "soft-rdma perf write"),
    ("read", "bw_gbps", "soft-rdma perf read"),
    ("send", "bw_gbps", "soft-rdma perf send"),
    ("qperf-rc_bw", "bw_gbps", "qperf -cm1 rc_bw -m 1M"),
    ("qperf-rc_lat", "lat_us", "qperf -cm1 rc_lat"),
    (
        "qperf-rc_lat-pipe",
        "lat_us",
        "qperf -cm1 rc_lat, SOFT_RDMA_INLINE_WAIT=off",
    ),
    ("qperf-rc_rdma_read_lat", "lat_us", "qperf -cm1 rc_rdma_read_lat"),
    ("ib_write_bw", "bw_gbps", "ib_write_bw -R -s 64K -t 16"),
    ("ib_read_bw", "bw_gbps", "ib_read_bw -R -s 64K -t 16"),
    ("ib_send_bw", "bw_gbps", "ib_send_bw -R -s 64K -t 16"),
];

/// The apps section of bench.md, and its JSON.
pub(super) fn section(w: &mut String, s: &Samples, foot: &Foot, modes: &[Mode], quick: bool) -> Value {
    w.push_str(&format!("## Apps: baselines no one here wrote (issue 42)\n\nEach run, fresh namespaces: iperf3 (`-t {t}`), qperf (`-t {t}`), `soft-rdma perf tcp-stream`, then through `soft-rdma run`: fio `ioengine=rdma` (64 KiB blocks, iodepth 16, `--time_based --runtime={t} --ramp_time={ramp}`), `soft-rdma perf OP`, qperf `-cm1` rc tests, perftest `ib_*_bw -R` (64 KiB, `-t 16`). Ratios: medians (min–max) of per-run ratios to the baseline of the same run. CPU per Gb/s: cores ÷ Gb/s (iperf3's own `cpu_utilization_percent`; perftest: client + soft-rdmad A / soft-rdmad B + server, between perftest's results header and row).\n\n", t = secs(quick), ramp = FIO_RAMP_SECS));
    let mut js = Vec::new();
    for &mode in modes {
        w.push_str(&format!(
            "**{} mode, figures**\n\n| program | Gb/s or µs | CPU/Gb/s A | CPU/Gb/s B |\n|---|---|---|---|\n",
            mode.name()
        ));
        for (test, field, what) in FIGURES.iter() {
            let qq = q(
                "apps",
                mode,
                test,
                if *field == "lat_us" { "lat" } else { "bw" },
                BLOCK,
                0,
            );
            let unit = if *field == "lat_us" { "µs" } else { "Gb/s" };
            let cpu = |a: bool| {
                let f = if a { "cores_per_gbps_a" } else { "cores_per_gbps_b" };
                s.stat(qq, f).or_else(|| per_gbps(s, qq, a))
            };
            w.push_str(&format!(
                "| {what} | {} {unit} | {} | {} |\n",
                foot.cell(s, qq, field, fmt_stat(s.stat(qq, field), 2)),
                fmt_stat(cpu(true), 3),
                fmt_stat(cpu(false), 3),
            ));
            js.push(json!({
                "mode": mode, "test": test, *field: s.stat(qq, field),
                "cores_per_gbps_a": cpu(true), "cores_per_gbps_b": cpu(false), "errors": s.errors(qq),
            }));
        }
        w.push_str(&format!(
            "\n**{} mode, ratios**\n\n| figure | baseline (same run) | ratio | target | verdict |\n|---|---|---|---|---|\n",
            mode.name()
        ));
        for (test, base, field, bound) in ratios(mode) {
            let kind = if field == "lat_us" { "lat" } else { "bw" };
            let r = s.ratio(
                q("apps", mode, test, kind, BLOCK, 0),
                q("apps", mode, base, kind, BLOCK, 0),
                field,
                field,
            );
            let verdict = verdict(r, bound);
            let what = if field.starts_with("cores") {
                format!(
                    "`{test}` CPU/Gb/s side {}",
                    &field[field.len() - 1..].to_uppercase()
                )
            } else {
                format!("`{test}`")
            };
            w.push_str(&format!(
                "| {what} | `{base}` | {} | {} | {verdict} |\n",
                fmt_ratio(r),
                bound.map_or("—".into(), Bound::text)
            ));
            js.push(json!({
                "mode": mode, "test": test, "baseline": base, "field": field, "ratio": r,
                "target": bound.map(Bound::text), "verdict": verdict,
            }));
        }
        w.push('\n');
    }
    json!(js)
}

fn verdict(r: Option<Stat>, bound: Option<Bound>) -> &'static str {
    match (r, bound) {
        (_, None) => "",
        (None, Some(_)) => "not measured",
        (Some(r), Some(b)) if b.met(r.median) => "met",
        _ => "NOT MET",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_qperf_figures() {
        let bw = "rc_bw:\n    bw  =  2.93 GB/sec\n";
        assert_eq!(qperf_figure(bw, true).unwrap()["bw_gbps"], 2.93 * 8.0);
        let lat = "tcp_lat:\n    latency  =  13.4 us\n";
        assert_eq!(qperf_figure(lat, false).unwrap()["lat_us"], 13.4);
        let ms = "rc_rdma_read_lat:\n    latency  =  1.5 ms\n";
        assert_eq!(qperf_figure(ms, false).unwrap()["lat_us"], 1500.0);
        assert!(qperf_figure("rc_bw:\nfailed\n", true).is_err());
    }

    #[test]
    fn parses_fio_json() {
        let out = "note: both iodepth >= 1\n{\"jobs\": [{\"error\": 0, \"write\": {\"bw_bytes\": 1000000000}, \"read\": {\"bw_bytes\": 0}}]}";
        assert_eq!(fio_figure(out).unwrap()["bw_gbps"], 8.0);
        let bad = "{\"jobs\": [{\"error\": 5, \"write\": {\"bw_bytes\": 1}}]}";
        assert!(fio_figure(bad).is_err());
    }

    #[test]
    fn bounds() {
        assert!(Bound::Within(1.1).met(0.95) && !Bound::Within(1.1).met(0.85));
        assert!(Bound::AtLeast(0.9).met(0.9) && !Bound::AtMost(1.1).met(1.2));
        assert_eq!(Bound::AtLeast(1.0 / 1.1).text(), "≥ ×0.91");
        assert_eq!(Bound::AtMost(1.0).text(), "≤ ×1");
        assert_eq!(Bound::Within(1.1).text(), "within ×1.1");
    }
}
