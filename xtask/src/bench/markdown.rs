//! The report: tables on stdout and in bench.md, everything in bench.json (bench.svg: [`super::svg`]).

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use serde_json::{Value, json};

use super::stats::{Q, Sample, Samples, Stat, q, stat};
use super::usage::PROGRESS_THREAD;
use super::{Bench, Mode, Part, Profile, human};

pub(super) fn fmt_stat(s: Option<Stat>, digits: usize) -> String {
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

pub(super) fn fmt_ratio(s: Option<Stat>) -> String {
    match s {
        None => "—".into(),
        Some(s) if s.n == 1 => format!("×{:.2}", s.median),
        Some(s) => format!("×{:.2} ({:.2}–{:.2})", s.median, s.min, s.max),
    }
}

/// Footnotes for the cells whose runs failed or were skipped: each distinct reason once.
#[derive(Default)]
pub(super) struct Foot(std::cell::RefCell<Vec<String>>);

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
    pub(super) fn cell(&self, s: &Samples, qq: Q<'_>, field: &str, value: String) -> String {
        let total = s.find(qq).count();
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
        if let (Some(lo), Some(hi)) = (failed.iter().map(|f| f.0).min(), failed.iter().map(|f| f.0).max()) {
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

/// Writes the report: bench.md (printed too) with a section per part measured and its notes, bench.svg when
/// part 2 was measured, and bench.json with the same figures and every sample.
pub(super) fn write(
    b: &Bench,
    parts: &[Part],
    out: &Path,
    duration: Duration,
    total: Duration,
) -> Result<()> {
    let s = &b.samples;
    let p = &b.profile;
    let foot = Foot::default();
    let mut md = String::new();
    let w = &mut md;
    let modes: Vec<Mode> = [Mode::Kernel, Mode::Xdp]
        .into_iter()
        .filter(|m| b.modes[m].is_none())
        .collect();
    intro(w, b, duration, total);
    let mut json_connect = Vec::new();
    if parts.contains(&Part::Connect) {
        json_connect = connect_section(w, s, &foot, &modes, p);
    }
    let mut json_data = Vec::new();
    if parts.contains(&Part::Data) {
        json_data = data_section(w, s, &foot, &modes, p);
    }
    let mut json_scale = Vec::new();
    if parts.contains(&Part::Scale) {
        json_scale = scale_section(w, s, &foot, &modes, p);
    }
    let mut json_perftest = Value::Null;
    if parts.contains(&Part::Perftest) {
        let quick = p.runs <= 3 && p.bw_sizes.len() < 9;
        json_perftest = super::perftest::section(w, s, &foot, &modes, quick);
    }
    let mut json_apps = Value::Null;
    if parts.contains(&Part::Apps) {
        let quick = p.runs <= 3 && p.bw_sizes.len() < 9;
        json_apps = super::apps::section(w, s, &foot, &modes, quick);
    }
    foot.write(w);
    std::fs::create_dir_all(out)?;
    let svg = out.join("bench.svg");
    let plotted = if parts.contains(&Part::Data) {
        match super::svg::plot(b, &modes, &svg) {
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
        "perftest": json_perftest,
        "apps": json_apps,
        "samples": s.0,
    });
    std::fs::write(&json_path, serde_json::to_string_pretty(&report)?)?;
    Ok(())
}

/// The title, what the figures are and how long they took, the modes not measured and why, and the notes.
fn intro(w: &mut String, b: &Bench, duration: Duration, total: Duration) {
    let p = &b.profile;
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
}

/// Part 1's table, connection setup against TCP's, a row per mode and concurrency; returns its JSON entries.
fn connect_section(w: &mut String, s: &Samples, foot: &Foot, modes: &[Mode], p: &Profile) -> Vec<Value> {
    let mut json_connect = Vec::new();
    w.push_str("## 1. Connection setup\n\nsoft-rdma: CreateConnector, Connect (TCP + MPA v2 Request/Reply, 32 B private data each way, IRD/ORD 16/16), CompleteConnect (RTR), Disconnect. Baseline: TCP connect, one 32 B request/response, close. Latency: one connection's whole life, µs.\n\n");
    w.push_str("| mode | in flight | connections | soft-rdma conn/s | TCP conn/s | rate × | soft-rdma p50 µs | p99 µs | TCP p50 µs | p99 µs | p50 × | soft-rdma steps p50 µs | TCP steps p50 µs |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for &mode in modes {
        for &(conc, count) in &p.connect {
            let r = q("connect", mode, "connect", "rate", 0, conc);
            let t = q("connect", mode, "tcp-connect", "rate", 0, conc);
            let errs = s.errors(r);
            let terrs = s.errors(t);
            let (rs, rsj) = steps_cell(s, r);
            let (ts, tsj) = steps_cell(s, t);
            let rate = foot.cell(s, r, "rate_per_s", fmt_stat(s.stat(r, "rate_per_s"), 0));
            let trate = foot.cell(s, t, "rate_per_s", fmt_stat(s.stat(t, "rate_per_s"), 0));
            w.push_str(&format!(
                "| {} | {conc} | {count} | {rate} | {trate} | {} | {} | {} | {} | {} | {} | {rs} | {ts} |\n",
                mode.name(),
                ratio_cell(s, r, t, "rate_per_s", 1.0),
                fmt_stat(s.stat(r, "lat_p50_us"), 0),
                fmt_stat(s.stat(r, "lat_p99_us"), 0),
                fmt_stat(s.stat(t, "lat_p50_us"), 0),
                fmt_stat(s.stat(t, "lat_p99_us"), 0),
                ratio_cell(s, r, t, "lat_p50_us", 1.0),
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
    json_connect
}

/// A connection-setup cell of the steps' p50s (each step's median over runs, named as the first run names
/// them), and the same figures as JSON.
fn steps_cell(s: &Samples, qq: Q<'_>) -> (String, Value) {
    let rows: Vec<&Sample> = s.find(qq).filter(|x| !x.row.is_null()).collect();
    if rows.is_empty() {
        return ("—".into(), Value::Null);
    }
    let (cells, js) = step_cells(&rows, "p50_us", 0);
    (cells.join(", "), Value::Object(js))
}

/// One cell per connection-setup step named in the first of `rows` (`row.steps[i].step`): the step's name
/// and the median (min–max) of `field` over the rows, at `decimals`; and the same figures by step name.
pub(super) fn step_cells(
    rows: &[&Sample],
    field: &str,
    decimals: usize,
) -> (Vec<String>, serde_json::Map<String, Value>) {
    let names: Vec<String> = rows.first().map_or_else(Vec::new, |first| {
        first.row["steps"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x["step"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    });
    let mut cells = Vec::new();
    let mut js = serde_json::Map::new();
    for (i, name) in names.iter().enumerate() {
        let v: Vec<f64> = rows
            .iter()
            .filter_map(|x| x.row["steps"][i][field].as_f64())
            .collect();
        let st = stat(&v);
        cells.push(format!("{name} {}", fmt_stat(st, decimals)));
        js.insert(name.clone(), json!(st));
    }
    (cells, js)
}

/// Part 2: the bandwidth tables and CPU per Gb/s, then the latency tables and context switches; returns the
/// tables' JSON entries.
fn data_section(w: &mut String, s: &Samples, foot: &Foot, modes: &[Mode], p: &Profile) -> Vec<Value> {
    let mut json_data = Vec::new();
    w.push_str(&format!("## 2. Data\n\n### Bandwidth, Gb/s (depth {}; send/write/read vs a kernel TCP stream of the same messages; iperf3 `-l SIZE -n BYTES` beside it, `-l` at most iperf3's 1 MiB: the stream should be within ×1.1 of iperf3)\n\n", p.depth));
    let header = "| size | iperf3 | TCP stream | stream × iperf3 | write | × | read | × | send | × |\n|---|---|---|---|---|---|---|---|---|---|\n";
    data_tables(
        w,
        &mut json_data,
        (modes, &p.bw_sizes),
        ("bw", header),
        |mode, size| bw_row(s, foot, mode, size),
    );
    cpu_table(w, s, modes, &p.bw_sizes);
    w.push_str("### Latency, µs p50 / p99 (send, write: ping-pong half round trip; read: one Read's full round trip, compared with a full TCP round trip)\n\n");
    let header = "| size | TCP ping-pong ½RTT | send ½RTT | p50 × | write ½RTT | p50 × | read RTT | p50 × (vs TCP RTT) |\n|---|---|---|---|---|---|---|---|\n";
    data_tables(
        w,
        &mut json_data,
        (modes, &p.lat_sizes),
        ("lat", header),
        |mode, size| lat_row(s, foot, mode, size),
    );
    switches_table(w, s, modes, &p.lat_sizes);
    json_data
}

/// A bandwidth row's cells after the size: the TCP stream, then write, read and send each with its ratio to
/// it; and their figures.
fn bw_row(s: &Samples, foot: &Foot, mode: Mode, size: u64) -> (String, serde_json::Map<String, Value>) {
    let base = q("data", mode, "tcp-stream", "bw", size, 0);
    let iperf = q("data", mode, "iperf3", "bw", size, 0);
    let mut cells = format!(
        "| {} | {} | {} ",
        foot.cell(s, iperf, "bw_gbps", fmt_stat(s.stat(iperf, "bw_gbps"), 3)),
        foot.cell(s, base, "bw_gbps", fmt_stat(s.stat(base, "bw_gbps"), 3)),
        ratio_cell(s, base, iperf, "bw_gbps", 1.0),
    );
    let mut js = serde_json::Map::new();
    js.insert(
        "iperf3".into(),
        json!({
            "bw_gbps": s.stat(iperf, "bw_gbps"),
            "errors": s.errors(iperf),
            "stream_ratio": s.ratio(base, iperf, "bw_gbps", "bw_gbps"),
        }),
    );
    js.insert(
        "tcp-stream".into(),
        json!({
            "bw_gbps": s.stat(base, "bw_gbps"),
            "errors": s.errors(base),
            "cores_per_gbps_a": per_gbps(s, base, true),
            "cores_per_gbps_b": per_gbps(s, base, false),
        }),
    );
    for test in ["write", "read", "send"] {
        let r = q("data", mode, test, "bw", size, 0);
        cells += &format!(
            "| {} | {} ",
            foot.cell(s, r, "bw_gbps", fmt_stat(s.stat(r, "bw_gbps"), 3)),
            ratio_cell(s, r, base, "bw_gbps", 1.0)
        );
        js.insert(
            test.into(),
            json!({
                "bw_gbps": s.stat(r, "bw_gbps"),
                "ratio": s.ratio(r, base, "bw_gbps", "bw_gbps"),
                "errors": s.errors(r),
                "cores_per_gbps_a": per_gbps(s, r, true),
                "cores_per_gbps_b": per_gbps(s, r, false),
            }),
        );
    }
    (cells, js)
}

/// A latency's cell: its p50 / p99 in µs (with the footnote mark of a measurement that failed).
pub(super) fn p50_p99_cell(s: &Samples, foot: &Foot, qq: Q<'_>) -> String {
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
}

/// A latency row's cells after the size: TCP ping-pong's p50 / p99, then send, write and read each with its
/// p50's ratio to TCP's (a Read's full round trip against a full TCP one); and their figures.
fn lat_row(s: &Samples, foot: &Foot, mode: Mode, size: u64) -> (String, serde_json::Map<String, Value>) {
    let base = q("data", mode, "tcp-pingpong", "lat", size, 0);
    let pair = |qq: Q<'_>| p50_p99_cell(s, foot, qq);
    let mut cells = format!("| {} ", pair(base));
    let mut js = serde_json::Map::new();
    js.insert(
        "tcp-pingpong".into(),
        json!({"p50_us": s.stat(base, "lat_p50_us"), "p99_us": s.stat(base, "lat_p99_us")}),
    );
    for test in ["send", "write", "read"] {
        let r = q("data", mode, test, "lat", size, 0);
        // A Read is a full round trip: compare with twice the TCP half round trip.
        let half = if test == "read" { 0.5 } else { 1.0 };
        let ratio = s
            .ratio(r, base, "lat_p50_us", "lat_p50_us")
            .map(|st| scaled(st, half));
        cells += &format!("| {} | {} ", pair(r), ratio_cell(s, r, base, "lat_p50_us", half));
        js.insert(
            test.into(),
            json!({
                "p50_us": s.stat(r, "lat_p50_us"),
                "p99_us": s.stat(r, "lat_p99_us"),
                "p50_ratio": ratio,
                "errors": s.errors(r),
                "switches_per_round_trip_a": switches(s, r, true),
                "switches_per_round_trip_b": switches(s, r, false),
            }),
        );
    }
    (cells, js)
}

/// Part 3's table, idle connections per daemon against TCP's, a row per mode and count; returns its JSON
/// entries.
fn scale_section(w: &mut String, s: &Samples, foot: &Foot, modes: &[Mode], p: &Profile) -> Vec<Value> {
    let mut json_scale = Vec::new();
    w.push_str("## 3. Scale: idle connections per daemon\n\nsetup: all N connected (256 in flight); memory: each daemon's VmRSS growth ÷ N (A active, B passive). Baseline: N kernel TCP connections (+ 32 B request/response), same concurrency; kernel socket memory is not in either figure.\n\n| mode | connections | soft-rdma setup ms | conn/s | TCP setup ms | setup × | RSS/conn A, bytes | RSS/conn B, bytes | soft-rdma teardown ms |\n|---|---|---|---|---|---|---|---|---|\n");
    for &mode in modes {
        for &(n, _) in &p.scale {
            let r = q("scale", mode, "connect", "hold", 0, n);
            let t = q("scale", mode, "tcp-connect", "hold", 0, n);
            let teardown: Vec<f64> = s
                .find(q("scale", mode, "connect", "hold", 0, n))
                .filter_map(|x| x.row["down"]["teardown_s"].as_f64())
                .collect();
            w.push_str(&format!(
                "| {} | {n} | {} | {} | {} | {} | {} | {} | {} |\n",
                mode.name(),
                foot.cell(s, r, "setup_s", fmt_stat(ms(s.stat(r, "setup_s")), 1)),
                fmt_stat(s.stat(r, "rate_per_s"), 0),
                foot.cell(s, t, "setup_s", fmt_stat(ms(s.stat(t, "setup_s")), 1)),
                ratio_cell(s, r, t, "setup_s", 1.0),
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
    json_scale
}

/// Part 2's tables, one per mode: `header` under the mode's name, then a row per size of `sizes`: `row` gives
/// the cells after the size and the figures, which go to `json_data` as one entry of `kind`.
fn data_tables(
    w: &mut String,
    json_data: &mut Vec<Value>,
    (modes, sizes): (&[Mode], &[u64]),
    (kind, header): (&str, &str),
    row: impl Fn(Mode, u64) -> (String, serde_json::Map<String, Value>),
) {
    for &mode in modes {
        w.push_str(&format!("**{} mode**\n\n{header}", mode.name()));
        for &size in sizes {
            let (cells, js) = row(mode, size);
            w.push_str(&format!("| {} {cells}|\n", human(size)));
            json_data.push(json!({"mode": mode, "kind": kind, "bytes": size, "results": js}));
        }
        w.push('\n');
    }
}

/// `st` times `k` (a Read's full round trip against half a TCP one: ½).
pub(super) fn scaled(st: Stat, k: f64) -> Stat {
    Stat {
        median: st.median * k,
        min: st.min * k,
        max: st.max * k,
        n: st.n,
    }
}

/// A ratio cell: the median (min–max) of the per-run ratios `r.field / base.field` times `k`, and, when runs
/// with a failure on either side were left out, on how many runs it rests.
pub(super) fn ratio_cell(s: &Samples, r: Q<'_>, base: Q<'_>, field: &str, k: f64) -> String {
    let st = s.ratio(r, base, field, field).map(|st| scaled(st, k));
    let (left_out, all) = s.ratio_left_out(r, base, field, field);
    match st {
        Some(_) if left_out > 0 => format!(
            "{} ({} of {all} runs: failed runs left out)",
            fmt_ratio(st),
            all - left_out
        ),
        None if left_out > 0 => "— (no run without a failure)".into(),
        _ => fmt_ratio(st),
    }
}

/// Cores per Gb/s on side A (client + its daemon) or B (daemon + server) over the measured interval,
/// over the runs without a failure.
pub(super) fn per_gbps(s: &Samples, qq: Q<'_>, side_a: bool) -> Option<Stat> {
    s.stat_of(qq, |x| {
        let bits = x.f("bytes")? * x.f("iterations")? * 8.0;
        x.usage.as_ref()?.cores_per_gbps(side_a, bits)
    })
}

/// Voluntary context switches per round trip on side A or B (each latency iteration is one round trip).
pub(super) fn switches(s: &Samples, qq: Q<'_>, side_a: bool) -> Option<Stat> {
    s.stat_of(qq, |x| {
        x.usage
            .as_ref()?
            .switches_per_op(side_a, x.row.get("iterations")?.as_u64()?)
    })
}

/// Of [`switches`], the client library's progress threads' (none: no process on that side has one).
fn progress_switches(s: &Samples, qq: Q<'_>, side_a: bool) -> Option<Stat> {
    s.stat_of(qq, |x| {
        x.usage
            .as_ref()?
            .progress_switches_per_op(side_a, x.row.get("iterations")?.as_u64()?)
    })
}

/// "≥ " when a thread of a measured process ended within a measured interval (its share is missing).
fn lower_bound(s: &Samples, qq: Q<'_>) -> &'static str {
    let partial = s
        .find(qq)
        .any(|x| x.usage.as_ref().is_some_and(|u| !u.complete()));
    if partial { "≥ " } else { "" }
}

/// One row of a per-side table: `label`, then for each of `tests` (the same `kind` and `size`) the figure
/// `value` gives for side A and side B.
fn side_row(
    s: &Samples,
    label: &str,
    (mode, kind, size): (Mode, &str, u64),
    tests: [&str; 4],
    value: impl Fn(Q<'_>, bool) -> Option<Stat>,
    digits: usize,
) -> String {
    let mut line = format!("| {label} ");
    for test in tests {
        let qq = q("data", mode, test, kind, size, 0);
        for side_a in [true, false] {
            line += &format!("| {}{} ", lower_bound(s, qq), fmt_stat(value(qq, side_a), digits));
        }
    }
    line + "|\n"
}

/// CPU per Gb/s of every process on each side, soft-rdma and TCP, over the measured interval only.
fn cpu_table(w: &mut String, s: &Samples, modes: &[Mode], sizes: &[u64]) {
    w.push_str("### CPU per Gb/s over the measured interval (cores ÷ Gb/s; A: perf client + its soft-rdmad; B: soft-rdmad + perf server; TCP: the client and the server process; ≥: a thread ended within the interval, its share is missing)\n\n");
    for &mode in modes {
        w.push_str(&format!("**{} mode**\n\n| size | TCP A | TCP B | write A | write B | read A | read B | send A | send B |\n|---|---|---|---|---|---|---|---|---|\n", mode.name()));
        for &size in sizes {
            w.push_str(&side_row(
                s,
                &human(size),
                (mode, "bw", size),
                ["tcp-stream", "write", "read", "send"],
                |qq, side_a| per_gbps(s, qq, side_a),
                3,
            ));
        }
        w.push('\n');
    }
}

/// Voluntary context switches per round trip of the smallest latency size, every process on each side,
/// soft-rdma and TCP.
fn switches_table(w: &mut String, s: &Samples, modes: &[Mode], sizes: &[u64]) {
    let Some(&size) = sizes.first() else {
        return;
    };
    w.push_str(&format!("### Voluntary context switches per {} round trip over the measured interval (A: perf client + its soft-rdmad; B: soft-rdmad + perf server; TCP: the client and the server process)\n\n| mode | TCP A | TCP B | send A | send B | write A | write B | read A | read B |\n|---|---|---|---|---|---|---|---|---|\n", human(size)));
    let tests = ["tcp-pingpong", "send", "write", "read"];
    for &mode in modes {
        w.push_str(&side_row(
            s,
            mode.name(),
            (mode, "lat", size),
            tests,
            |qq, side_a| switches(s, qq, side_a),
            2,
        ));
        // Where the client library's progress thread ran (kernel mode's in-process data path): its share.
        let has_progress = tests.iter().any(|test| {
            s.find(q("data", mode, test, "lat", size, 0)).any(|x| {
                x.usage
                    .as_ref()
                    .is_some_and(|u| u.procs.iter().any(|p| p.progress_switches.is_some()))
            })
        });
        if has_progress {
            w.push_str(&side_row(
                s,
                &format!("{}, of which {PROGRESS_THREAD}", mode.name()),
                (mode, "lat", size),
                tests,
                |qq, side_a| progress_switches(s, qq, side_a),
                2,
            ));
        }
    }
    w.push('\n');
}
