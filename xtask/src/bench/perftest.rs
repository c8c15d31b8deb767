//! Part 4 of `cargo xtask bench` (`--only perftest`): Debian's unmodified perftest (`ib_write_bw`,
//! `ib_read_bw`, `ib_send_bw`, `ib_write_lat`, `ib_send_lat`, `ib_read_lat`, all with `-R`: rdma_cm) and
//! rdma-core's `cmtime` on soft-rdma's drop-in `libibverbs.so.1`/`librdmacm.so.1`, between the bench's two
//! namespaces, in each mode.
//!
//! Each run measures, in the same namespaces and daemons: the kernel-TCP baselines (`perf tcp-stream` of the
//! same message size and depth for bandwidth, `perf tcp-pingpong` for latency), the native `soft-rdma perf`
//! of the same operation and size, and the perftest program. The report ([`section`]) gives perftest's
//! figures as × of TCP and × of the native tool (medians of per-run ratios), CPU per Gb/s and voluntary
//! context switches per round trip, and each of issue 32's targets with met / not met.
//!
//! A perftest program runs as `soft-rdma --uds SOCK run -- stdbuf -oL PROGRAM -R -F -p PORT …` (the server in
//! B, then the client in A). Its measured interval, for CPU and context switches, runs from the results
//! header it prints before its test loop to the results row it prints after it (perftest 4.5,
//! `src/write_bw.c`, `src/read_lat.c`…: `printf(RESULT_LINE); printf(RESULT_FMT…)` precedes `run_iter_*`,
//! `print_report_*` follows it). Its row is parsed from perftest's own output (`src/perftest_parameters.h`,
//! `RESULT_FMT_G`, `RESULT_FMT_LAT`): bandwidth `#bytes #iterations BW-peak BW-average MsgRate` with
//! `--report_gbits`; latency `#bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%`, where
//! t_typical is the median and, as perftest divides a Send or Write ping-pong's round trip by 2 and not a
//! Read's (`src/perftest_parameters.c`, `print_report_lat`), `ib_send_lat`/`ib_write_lat` give ½RTT and
//! `ib_read_lat` a whole round trip.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::{Value, json};

use super::markdown::{Foot, fmt_ratio, fmt_stat, per_gbps, ratio_cell, scaled, switches};
use super::netns::{Env, Side};
use super::procs::Proc;
use super::stats::{Q, Sample, Samples, Stat, q};
use super::usage::{Role, Usage, snapshot};
use super::{Bench, Mode, Profile, human};

/// The bandwidth programs and the native `soft-rdma perf` test of the same operation.
const BW: [(&str, &str); 3] = [
    ("ib_write_bw", "write"),
    ("ib_read_bw", "read"),
    ("ib_send_bw", "send"),
];
/// The latency programs and the native test of the same operation.
const LAT: [(&str, &str); 3] = [
    ("ib_send_lat", "send"),
    ("ib_write_lat", "write"),
    ("ib_read_lat", "read"),
];
/// The latency size of the targets.
const LAT_SIZE: u64 = 64;
/// perftest's rdma_cm ports: one per invocation, so that none meets a listener of the last.
const PORT_BASE: u16 = 18515;

/// Bandwidth sizes: issue 32's range, 64 KiB to 4 MiB.
pub(super) fn bw_sizes(quick: bool) -> Vec<u64> {
    if quick {
        vec![64 << 10, 1 << 20, 4 << 20]
    } else {
        vec![64 << 10, 256 << 10, 1 << 20, 4 << 20]
    }
}

/// The perftest part's share of the time budget (its runs: about 25 s per mode and run with `--quick`).
pub(super) fn extend_budget(p: &mut Profile, quick: bool) {
    let extra = if quick { 180 } else { 480 };
    p.budget_s += extra;
    p.min_window_s += extra;
}

impl Bench {
    /// One mode's part 4: per run, fresh namespaces, then bandwidth per size, 64 B latency, and cmtime.
    pub(super) fn perftest(&mut self, mode: Mode) -> Result<()> {
        let p = self.profile.clone();
        let quick = p.runs <= 3 && p.bw_sizes.len() < 9;
        for run in 1..=p.runs {
            let heading = ("perftest", "perftest");
            let setup = "namespaces and daemons";
            let Some(mut env) = self.run_env(mode, "pt", heading, (run, p.runs), setup)? else {
                return Ok(());
            };
            for size in bw_sizes(quick) {
                self.progress(&format!(
                    "perftest, {} mode, run {run}/{}: bandwidth {}",
                    mode.name(),
                    p.runs,
                    human(size)
                ));
                let iters = Profile::iters(p.perftest_bw_bytes, p.bw_iters, size);
                let args = vec![
                    "--size".into(),
                    size.to_string(),
                    "--iters".into(),
                    iters.to_string(),
                    "--depth".into(),
                    p.depth.to_string(),
                ];
                let sample = Sample::new("perftest", mode, "tcp-stream", "bw", size, 0, run);
                self.measure(&mut env, sample, &args)?;
                for (program, native) in BW {
                    let sample = Sample::new("perftest", mode, native, "bw", size, 0, run);
                    self.measure(&mut env, sample, &args)?;
                    let pargs = [
                        "-s".to_string(),
                        size.to_string(),
                        "-n".into(),
                        iters.to_string(),
                        "-t".into(),
                        p.depth.to_string(),
                        "--report_gbits".into(),
                    ];
                    let sample = Sample::new("perftest", mode, program, "bw", size, 0, run);
                    self.perftest_one(&mut env, sample, &pargs)?;
                }
            }
            self.progress(&format!(
                "perftest, {} mode, run {run}/{}: latency 64 B, cmtime",
                mode.name(),
                p.runs
            ));
            let iters = p.lat_iters.max(1000);
            let args = vec![
                "--size".into(),
                LAT_SIZE.to_string(),
                "--iters".into(),
                iters.to_string(),
            ];
            let sample = Sample::new("perftest", mode, "tcp-pingpong", "lat", LAT_SIZE, 0, run);
            self.measure(&mut env, sample, &args)?;
            for (program, native) in LAT {
                let mut nargs = args.clone();
                nargs.push("--latency".into());
                let sample = Sample::new("perftest", mode, native, "lat", LAT_SIZE, 0, run);
                self.measure(&mut env, sample, &nargs)?;
                let pargs = [
                    "-s".to_string(),
                    LAT_SIZE.to_string(),
                    "-n".into(),
                    iters.to_string(),
                ];
                let sample = Sample::new("perftest", mode, program, "lat", LAT_SIZE, 0, run);
                self.perftest_one(&mut env, sample, &pargs)?;
            }
            let count = if quick { 50 } else { 200 };
            let sample = Sample::new("perftest", mode, "cmtime", "rate", 0, 1, run);
            self.cmtime_one(&mut env, sample, count)?;
        }
        Ok(())
    }

    /// One perftest program: its server in B, its client in A (measured), both with `args`; records the
    /// client's results row in `sample`.
    pub(super) fn perftest_one(&mut self, env: &mut Env, mut sample: Sample, args: &[String]) -> Result<()> {
        if let Some(why) = self.skipping() {
            sample.error = Some(why);
            self.samples.0.push(sample);
            return Ok(());
        }
        let program = sample.test.clone();
        let port = self.next_port();
        let mut common = vec!["-R".to_string(), "-F".into(), "-p".into(), port.to_string()];
        common.extend_from_slice(args);
        let limit = self.limit();
        let t0 = Instant::now();
        let result = run_pair(self, env, &program, &common, limit);
        sample.wall_s = t0.elapsed().as_secs_f64();
        match result {
            Ok((row, usage)) => {
                sample.row = row;
                sample.usage = usage;
            }
            Err(e) => {
                let e = format!("{e:#}");
                eprintln!("        {program} {} B: FAILED: {e}", sample.bytes);
                if e.contains("HUNG") {
                    self.hung(sample.mode);
                }
                sample.error = Some(e);
            }
        }
        self.samples.0.push(sample);
        let dead = env.casualties();
        if !dead.is_empty() {
            anyhow::bail!("{}: {}", env.label, dead.join("; "));
        }
        Ok(())
    }

    /// `cmtime -s` in B, `cmtime -s B -c COUNT` in A: the per-step timings of COUNT connections.
    fn cmtime_one(&mut self, env: &mut Env, mut sample: Sample, count: u32) -> Result<()> {
        if let Some(why) = self.skipping() {
            sample.error = Some(why);
            self.samples.0.push(sample);
            return Ok(());
        }
        let port = self.next_port().to_string();
        let b = env.ip[1].to_string();
        let log = env.log(&format!("cmtime-server-run{}", sample.run));
        let mut server = spawn_logged(
            drop_in(self, env, Side::B, "cmtime", &["-b", &b, "-p", &port]),
            &log,
            "cmtime server",
        )?;
        std::thread::sleep(Duration::from_millis(300));
        let limit = self.limit();
        let c = count.to_string();
        let mut cmd = drop_in(self, env, Side::A, "cmtime", &["-s", &b, "-p", &port, "-c", &c]);
        let t0 = Instant::now();
        let out = super::procs::run_limited(&mut cmd, "cmtime", limit)?;
        sample.wall_s = t0.elapsed().as_secs_f64();
        // cmtime's server never exits (rdma-core 44, `librdmacm/examples/cmtime.c`): stopped after the client.
        server.stop();
        let steps = parse_cmtime(&out.stdout);
        if out.ok && !steps.is_empty() {
            sample.row = json!({ "connections": count, "steps": steps });
        } else {
            let why = if out.killed {
                self.killed_why(limit)
            } else {
                format!("cmtime failed: {}", out.why())
            };
            eprintln!("        cmtime: FAILED: {why}");
            sample.error = Some(why);
        }
        self.samples.0.push(sample);
        Ok(())
    }

    fn next_port(&mut self) -> u16 {
        let n = self.samples.0.len() as u16;
        PORT_BASE + n % 2000
    }
}

/// `soft-rdma --uds SOCK run -- stdbuf -oL PROGRAM ARGS…` in `side`'s namespace (pinned as that side's
/// processes are). `soft-rdma run` and `stdbuf` exec: the child's pid is the program's.
pub(super) fn drop_in(b: &Bench, env: &Env, side: Side, program: &str, args: &[&str]) -> Command {
    let mut c = env.in_ns(side, &b.tools.cli);
    c.arg("--uds")
        .arg(env.sock(side))
        .args(["run", "--", "stdbuf", "-oL", "-eL", program])
        .args(args);
    if let Some(n) = b.tools.spin.cq_rounds {
        c.env("SOFT_RDMA_CQ_SPIN", n.to_string());
    }
    c
}

fn spawn_logged(mut cmd: Command, log: &Path, what: &str) -> Result<Proc> {
    let f = std::fs::File::create(log)?;
    cmd.stdin(Stdio::null()).stdout(f.try_clone()?).stderr(f);
    Proc::spawn(&mut cmd, what)
}

/// Runs `program` as server (B) and client (A); returns the client's row and what both sides used between
/// the client's results header and its results row.
fn run_pair(
    b: &Bench,
    env: &mut Env,
    program: &str,
    common: &[String],
    limit: Duration,
) -> Result<(Value, Option<Usage>)> {
    let args: Vec<&str> = common.iter().map(String::as_str).collect();
    let log = env.log(&format!("{program}-server-{}", common[3]));
    let mut server = spawn_logged(drop_in(b, env, Side::B, program, &args), &log, program)?;
    // perftest's server prints nothing until a client connects, and its listener is up within
    // milliseconds of its start: a short wait, then the client (a refused client is a failed run).
    std::thread::sleep(Duration::from_millis(300));
    if let Some(st) = server.exited() {
        anyhow::bail!(
            "{program} server exited ({st}) before the client: {}",
            super::netns::last_lines(&log, 3)
        );
    }
    let ip = env.ip[1].to_string();
    let mut cargs = args.clone();
    cargs.push(&ip);
    let mut cmd = drop_in(b, env, Side::A, program, &cargs);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut client = Proc::spawn(&mut cmd, program)?;
    let procs = vec![
        (Role::Client, client.pid()),
        (Role::DaemonA, env.daemons[0].pid()),
        (Role::DaemonB, env.daemons[1].pid()),
        (Role::Server, server.pid()),
    ];
    let out = client.child.stdout.take().expect("piped");
    let mut err = client.child.stderr.take().expect("piped");
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    // The interval's ends are taken as the lines are read (the client is line-buffered by stdbuf).
    let out_t = std::thread::spawn(move || {
        let (mut text, mut start, mut usage) = (String::new(), None, None);
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if line.contains("#bytes") && start.is_none() {
                start = Some((Instant::now(), snapshot(&procs)));
            } else if let Some((t, begin)) = start.as_ref().filter(|_| usage.is_none())
                && results_row(&line).is_some()
            {
                let end = snapshot(&procs);
                usage = Usage::between(&procs, begin, &end, t.elapsed().as_secs_f64());
            }
            text.push_str(&line);
            text.push('\n');
        }
        (text, usage)
    });
    let status = client.wait_for(limit);
    if status.is_none() {
        let _ = client.child.kill();
        let _ = client.child.wait();
    }
    let server_status = server.wait_for(Duration::from_secs(10));
    if server_status.is_none() {
        server.stop();
    }
    let (stdout, usage) = out_t.join().unwrap_or_default();
    let stderr = err_t.join().unwrap_or_default();
    let failed = |why: String| {
        let _ = std::fs::write(
            env.log(&format!("failed-{program}-{}", common[3])),
            format!("--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"),
        );
        anyhow::anyhow!(why)
    };
    let Some(status) = status else {
        let why = if limit < Duration::from_secs(b.profile.limit_s) {
            "cut short: the time budget ran out".to_owned()
        } else {
            format!("HUNG: no result within {} s; killed", limit.as_secs())
        };
        return Err(failed(why));
    };
    let last = |t: &str| {
        t.lines()
            .rev()
            .find(|l| !l.trim().is_empty() && !l.starts_with('-'))
            .unwrap_or("no output")
            .trim()
            .to_owned()
    };
    if !status.success() {
        return Err(failed(format!(
            "{program} client exited ({status}): {}",
            last(&format!("{stdout}\n{stderr}"))
        )));
    }
    if !server_status.is_some_and(|s| s.success()) {
        return Err(failed(format!(
            "{program} server did not exit 0: {}",
            super::netns::last_lines(&log, 2)
        )));
    }
    let row = stdout
        .lines()
        .find_map(results_row)
        .ok_or_else(|| failed(format!("no results row in {program}'s output")))?;
    Ok((row_json(program, &row), usage))
}

/// perftest's results row: the whitespace-separated numbers of a line whose first two are integers
/// (`#bytes #iterations`) and that has at least five fields.
fn results_row(line: &str) -> Option<Vec<f64>> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 5 || f[0].parse::<u64>().is_err() || f[1].parse::<u64>().is_err() {
        return None;
    }
    f.iter().map(|x| x.parse::<f64>().ok()).collect()
}

/// The row in the bench's field names (those of `soft-rdma perf --json`).
fn row_json(program: &str, r: &[f64]) -> Value {
    if program.ends_with("_bw") {
        json!({
            "bytes": r[0], "iterations": r[1] as u64, "bw_peak_gbps": r[2], "bw_gbps": r[3],
            "msg_rate_mpps": r[4],
        })
    } else {
        json!({
            "bytes": r[0], "iterations": r[1] as u64, "lat_min_us": r[2], "lat_max_us": r[3],
            "lat_p50_us": r[4], "lat_avg_us": r[5], "lat_p99_us": r.get(7),
        })
    }
}

/// cmtime's table (rdma-core 44, `librdmacm/examples/cmtime.c`, `show_perf`): a header line
/// `step  total ms  max ms  min us  us / conn`, then per step `NAME : total max min per-conn`; returns
/// `[{step, us_per_conn}]` (the last column).
fn parse_cmtime(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let f: Vec<f64> = rest
                .split_whitespace()
                .map(|x| x.parse().ok())
                .collect::<Option<_>>()?;
            (f.len() >= 4).then(|| json!({ "step": name.trim(), "us_per_conn": f[f.len() - 1] }))
        })
        .collect()
}

/// A target: what it says, the ratio's statistics, and the bound (`at_most`: the ratio must not exceed it).
fn verdict(st: Option<Stat>, bound: f64, at_most: bool) -> &'static str {
    match st {
        None => "not measured",
        Some(s) if (at_most && s.median <= bound) || (!at_most && s.median >= bound) => "met",
        Some(_) => "NOT MET",
    }
}

/// The perftest section of bench.md, and its JSON.
pub(super) fn section(w: &mut String, s: &Samples, foot: &Foot, modes: &[Mode], quick: bool) -> Value {
    w.push_str(
        "## 4. perftest (Debian's unmodified `ib_*` with `-R`, on soft-rdma's libibverbs/librdmacm)\n\n",
    );
    w.push_str("Each run: `perf tcp-stream` / `tcp-pingpong` (TCP), `soft-rdma perf OP` (native) and perftest in the same namespaces, one after the other. Bandwidth: `ib_OP_bw -R -F -s SIZE -n N -t DEPTH --report_gbits` (BW average); latency: `ib_OP_lat -R -F -s 64 -n N`, t_typical (perftest's median; Send and Write: ½RTT, Read: a whole round trip). Ratios: medians of per-run ratios.\n\n");
    let mut js = Vec::new();
    let mut targets = Vec::new();
    for &mode in modes {
        w.push_str(&format!("**{} mode, bandwidth (Gb/s)**\n\n| size | TCP | program | perftest | × TCP | native | perftest × native | CPU/Gb/s A | CPU/Gb/s B |\n|---|---|---|---|---|---|---|---|---|\n", mode.name()));
        for size in bw_sizes(quick) {
            let base = q("perftest", mode, "tcp-stream", "bw", size, 0);
            for (program, native) in BW {
                let r = q("perftest", mode, program, "bw", size, 0);
                let n = q("perftest", mode, native, "bw", size, 0);
                let row = json!({
                    "mode": mode, "program": program, "bytes": size,
                    "bw_gbps": s.stat(r, "bw_gbps"), "tcp_bw_gbps": s.stat(base, "bw_gbps"),
                    "native_bw_gbps": s.stat(n, "bw_gbps"),
                    "ratio_tcp": s.ratio(r, base, "bw_gbps", "bw_gbps"),
                    "ratio_native": s.ratio(r, n, "bw_gbps", "bw_gbps"),
                    "cores_per_gbps_a": per_gbps(s, r, true), "cores_per_gbps_b": per_gbps(s, r, false),
                    "errors": s.errors(r),
                });
                w.push_str(&format!(
                    "| {} | {} | `{program}` | {} | {} | {} | {} | {} | {} |\n",
                    human(size),
                    fmt_stat(s.stat(base, "bw_gbps"), 2),
                    foot.cell(s, r, "bw_gbps", fmt_stat(s.stat(r, "bw_gbps"), 2)),
                    ratio_cell(s, r, base, "bw_gbps", 1.0),
                    foot.cell(s, n, "bw_gbps", fmt_stat(s.stat(n, "bw_gbps"), 2)),
                    ratio_cell(s, r, n, "bw_gbps", 1.0),
                    fmt_stat(per_gbps(s, r, true), 3),
                    fmt_stat(per_gbps(s, r, false), 3),
                ));
                let to_tcp = s.ratio(r, base, "bw_gbps", "bw_gbps");
                let to_native = s.ratio(r, n, "bw_gbps", "bw_gbps");
                if program != "ib_send_bw" || mode == Mode::Xdp {
                    targets.push((
                        mode,
                        format!("`{program}` {} ≥ 0.9× TCP stream", human(size)),
                        to_tcp,
                        0.9,
                        false,
                    ));
                }
                // Within 1.1× of the native tool: perftest's bandwidth at least 1/1.1 of it.
                targets.push((
                    mode,
                    format!(
                        "`{program}` {} within 1.1× of `soft-rdma perf {native}`",
                        human(size)
                    ),
                    to_native,
                    1.0 / 1.1,
                    false,
                ));
                js.push(row);
            }
        }
        w.push('\n');
        lat_table(w, s, foot, mode, &mut js, &mut targets);
        cmtime_table(w, s, mode, &mut js);
    }
    w.push_str("### Issue 32's targets (medians of per-run ratios, this run)\n\n| mode | target | ratio | verdict |\n|---|---|---|---|\n");
    let mut tj = Vec::new();
    for (mode, what, st, bound, at_most) in targets {
        let v = verdict(st, bound, at_most);
        w.push_str(&format!(
            "| {} | {what} | {} | {v} |\n",
            mode.name(),
            fmt_ratio(st)
        ));
        tj.push(json!({"mode": mode, "target": what, "ratio": st, "bound": bound, "verdict": v}));
    }
    w.push('\n');
    json!({ "rows": js, "targets": tj })
}

type Target = (Mode, String, Option<Stat>, f64, bool);

/// The 64 B latency rows of one mode, with context switches per round trip, and their targets.
fn lat_table(
    w: &mut String,
    s: &Samples,
    foot: &Foot,
    mode: Mode,
    js: &mut Vec<Value>,
    targets: &mut Vec<Target>,
) {
    w.push_str(&format!("**{} mode, 64 B latency (µs, t_typical / p99)**\n\n| program | perftest | TCP ping-pong ½RTT | × TCP | native | perftest × native | switches/RT A | switches/RT B |\n|---|---|---|---|---|---|---|---|\n", mode.name()));
    let base = q("perftest", mode, "tcp-pingpong", "lat", LAT_SIZE, 0);
    let pair = |qq: Q<'_>| super::markdown::p50_p99_cell(s, foot, qq);
    for (program, native) in LAT {
        let r = q("perftest", mode, program, "lat", LAT_SIZE, 0);
        let n = q("perftest", mode, native, "lat", LAT_SIZE, 0);
        // A Read is a whole round trip: against twice TCP's ½RTT.
        let half = if native == "read" { 0.5 } else { 1.0 };
        let to_tcp = s
            .ratio(r, base, "lat_p50_us", "lat_p50_us")
            .map(|st| scaled(st, half));
        let to_native = s.ratio(r, n, "lat_p50_us", "lat_p50_us");
        w.push_str(&format!(
            "| `{program}` | {} | {} | {} | {} | {} | {} | {} |\n",
            pair(r),
            pair(base),
            ratio_cell(s, r, base, "lat_p50_us", half),
            pair(n),
            ratio_cell(s, r, n, "lat_p50_us", 1.0),
            fmt_stat(switches(s, r, true), 2),
            fmt_stat(switches(s, r, false), 2),
        ));
        let bound = if native == "read" { 1.5 } else { 1.3 };
        let what = if native == "read" {
            "TCP round trip"
        } else {
            "TCP ping-pong ½RTT"
        };
        targets.push((
            mode,
            format!("`{program}` 64 B ≤ {bound}× {what}"),
            to_tcp,
            bound,
            true,
        ));
        targets.push((
            mode,
            format!("`{program}` 64 B within 1.1× of `soft-rdma perf {native} --latency`"),
            to_native,
            1.1,
            true,
        ));
        js.push(json!({
            "mode": mode, "program": program, "bytes": LAT_SIZE,
            "p50_us": s.stat(r, "lat_p50_us"), "p99_us": s.stat(r, "lat_p99_us"),
            "tcp_half_rtt_us": s.stat(base, "lat_p50_us"), "native_p50_us": s.stat(n, "lat_p50_us"),
            "ratio_tcp": to_tcp, "ratio_native": to_native,
            "switches_per_round_trip_a": switches(s, r, true), "switches_per_round_trip_b": switches(s, r, false),
            "errors": s.errors(r),
        }));
    }
    w.push('\n');
}

/// cmtime's per-step averages (µs per connection), beside part 1's native connection-setup steps.
fn cmtime_table(w: &mut String, s: &Samples, mode: Mode, js: &mut Vec<Value>) {
    let rows: Vec<&Sample> = s
        .find(q("perftest", mode, "cmtime", "rate", 0, 1))
        .filter(|x| x.error.is_none())
        .collect();
    let errors = s.errors(q("perftest", mode, "cmtime", "rate", 0, 1));
    let Some(first) = rows.first() else {
        w.push_str(&format!(
            "**{} mode, cmtime**: not measured ({})\n\n",
            mode.name(),
            errors.join("; ")
        ));
        return;
    };
    w.push_str(&format!("**{} mode, cmtime -c {} (µs per connection of each step, cmtime's `us / conn`; compare part 1's native steps)**: ", mode.name(), first.row["connections"]));
    let (cells, sj) = super::markdown::step_cells(&rows, "us_per_conn", 1);
    w.push_str(&cells.join(", "));
    w.push_str("\n\n");
    js.push(json!({"mode": mode, "program": "cmtime", "steps_us_per_conn": sj, "errors": errors}));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_perftest_rows() {
        let bw = " 65536      1000             9.12               9.10               0.017360";
        let r = results_row(bw).unwrap();
        assert_eq!(row_json("ib_write_bw", &r)["bw_gbps"], 9.10);
        let lat =
            " 64      1000          5.12           20.01        6.30     6.50        0.51      9.10    19.00";
        let r = results_row(lat).unwrap();
        assert_eq!(row_json("ib_send_lat", &r)["lat_p50_us"], 6.30);
        assert!(results_row(" #bytes #iterations    BW peak[Gb/sec]").is_none());
        assert!(results_row(" Mtu : 1024[B]").is_none());
    }

    #[test]
    fn parses_cmtime_steps() {
        let t = "creating id\nstep              total ms     max ms     min us  us / conn\ncreate id    :        0.01       0.00       0.00       0.70\nconnect      :        6.46       5.61    1938.00     323.05\n";
        let v = parse_cmtime(t);
        assert_eq!(v.len(), 2);
        assert_eq!(v[1]["step"], "connect");
        assert_eq!(v[1]["us_per_conn"], 323.05);
    }
}
