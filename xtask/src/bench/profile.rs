//! `cargo xtask profile [--mode xdp|kernel] [--seconds N] [--out DIR] [--call-graph]`: where soft-rdma's
//! time goes. The bench's namespaces and daemons ([`Env`]), one workload at a time — 1 MiB RDMA Write
//! bandwidth (depth 64) and 64 B Send ping-pong — with `perf record` on the whole machine for the
//! workload's duration (in kernel mode the data path runs in the applications, `soft-rdma perf` here; in
//! XDP mode in the daemons); then, per workload, the CPU by process and, for the daemons (`soft-rdmad`)
//! and the applications (`soft-rdma`), by thread, by binary (kernel, the program, libc, the XDP program)
//! and the top symbols by self time, on stdout and in `DIR/*.txt` (the `perf.data` files stay there for
//! `perf report -i`).
//!
//! What it is for: the bench says how fast; this says why. Numbers from a profiled run are slower than the
//! bench's (perf's sampling costs CPU on a 2-core machine) and are printed only as context.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::{Env, Mode, Proc, build, install_signal_cleanup, run_limited};

#[derive(clap::Args, Debug)]
pub struct ProfileArgs {
    /// Transport mode of both daemons.
    #[arg(long, value_enum, default_value = "xdp")]
    mode: ProfileMode,
    /// How long each workload runs (and is sampled).
    #[arg(long, default_value_t = 8)]
    seconds: u64,
    /// Where perf.data files and reports go.
    #[arg(long, default_value = "target/profile")]
    out: PathBuf,
    /// Record call graphs (DWARF unwinding: larger files, slower reports) so that `perf report -G` shows
    /// who calls the hot symbols.
    #[arg(long)]
    call_graph: bool,
    /// Symbols to list per daemon.
    #[arg(long, default_value_t = 15)]
    top: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ProfileMode {
    Kernel,
    Xdp,
}

/// One workload: `soft-rdma perf` arguments and a label.
struct Workload {
    name: &'static str,
    test: &'static str,
    args: &'static [&'static str],
}

const WORKLOADS: [Workload; 2] = [
    Workload {
        name: "write-1MiB-bw",
        test: "write",
        args: &["--size", "1048576", "--depth", "64"],
    },
    Workload {
        name: "send-64B-latency",
        test: "send",
        args: &["--size", "64", "--latency"],
    },
];

/// `perf` on PATH, else installed (Debian's linux-perf).
fn ensure_perf() -> Result<()> {
    let works = || {
        Command::new("perf")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if works() {
        return Ok(());
    }
    crate::setup::apt_install(&["linux-perf"])?;
    if !works() {
        bail!("perf still does not run after installing linux-perf");
    }
    Ok(())
}

/// `perf report` of `data` sorted by `keys`, self time, without call graphs: the `pct  name` lines (of
/// the processes named `comm` only, if given).
fn report(data: &Path, comm: Option<&str>, keys: &str, top: usize) -> Result<Vec<String>> {
    let mut cmd = Command::new("perf");
    if let Some(comm) = comm {
        cmd.args(["report", "--comms", comm]);
    } else {
        cmd.arg("report");
    }
    let out = cmd
        .args(["--stdio", "--no-children", "-g", "none", "--percent-limit", "0.5"])
        .args(["--sort", keys, "-i"])
        .arg(data)
        .output()
        .context("perf report")?;
    if !out.status.success() {
        bail!(
            "perf report -i {}: {}",
            data.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .take(top)
        .map(|l| {
            // perf pads the columns widely; one space between the fields reads better.
            l.split_whitespace().collect::<Vec<_>>().join(" ")
        })
        .collect())
}

pub fn run(root: &Path, a: ProfileArgs) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("cargo xtask profile creates network namespaces and attaches perf: run it as root");
    }
    crate::setup::run()?;
    ensure_perf()?;
    let tools = build(root)?;
    install_signal_cleanup()?;
    let out = if a.out.is_absolute() {
        a.out.clone()
    } else {
        root.join(&a.out)
    };
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out)?;
    let mode = match a.mode {
        ProfileMode::Kernel => Mode::Kernel,
        ProfileMode::Xdp => Mode::Xdp,
    };
    println!(
        "# where soft-rdmad's time goes: {} mode, {} s per workload, perf record -F 999{}\n",
        mode.name(),
        a.seconds,
        if a.call_graph { " --call-graph dwarf" } else { "" }
    );
    for (i, w) in WORKLOADS.iter().enumerate() {
        let env = Env::new(900 + i as u32, w.name, mode, &tools, &out)?;
        let data = out.join(format!("{}.data", w.name));
        let mut cmd = Command::new("perf");
        cmd.args(["record", "-a", "-F", "999", "-q"]);
        if a.call_graph {
            cmd.args(["--call-graph", "dwarf,8192"]);
        }
        cmd.arg("-o")
            .arg(&data)
            .args(["--", "sleep"])
            .arg(a.seconds.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut recorder = Proc::spawn(&mut cmd, "perf record -a")?;
        // The client runs until the recorders stop: iterations enough for the time, cut at the limit.
        let started = Instant::now();
        let mut args: Vec<String> = w.args.iter().map(|s| s.to_string()).collect();
        args.extend([
            "--iters".into(),
            "1000000".into(),
            "--timeout".into(),
            "30".into(),
        ]);
        let mut client = env.perf(&tools, w.test, false, &args);
        let client_out = run_limited(
            &mut client,
            &format!("perf {} ({})", w.test, w.name),
            Duration::from_secs(a.seconds + 1),
        )?;
        if recorder.wait_for(Duration::from_secs(a.seconds + 30)).is_none() {
            bail!("perf record did not finish");
        }
        let during = started.elapsed();
        drop(env);
        let mut text = format!(
            "## {} ({} mode): soft-rdma perf {} {} for {:.1} s\n",
            w.name,
            mode.name(),
            w.test,
            w.args.join(" "),
            during.as_secs_f64()
        );
        if !client_out.ok && !client_out.killed {
            text.push_str(&format!(
                "(the client failed: {})\n",
                client_out.stderr.lines().last().unwrap_or("")
            ));
        }
        text.push_str("\nby process (the whole machine):\n");
        for l in report(&data, None, "comm", 8)? {
            text.push_str(&format!("    {l}\n"));
        }
        for (comm, role) in [
            (
                "soft-rdmad",
                "the daemons (A and B): engine, sessions and (XDP mode) the stack, on one thread",
            ),
            (
                "soft-rdma",
                "the applications: perf client and server (the data path in kernel mode)",
            ),
        ] {
            text.push_str(&format!("\n### {comm}: {role}\n\nby thread:\n"));
            for l in report(&data, Some(comm), "comm,pid", 6)? {
                text.push_str(&format!("    {l}\n"));
            }
            text.push_str("by binary:\n");
            for l in report(&data, Some(comm), "dso", 6)? {
                text.push_str(&format!("    {l}\n"));
            }
            text.push_str(&format!("top {} symbols (self):\n", a.top));
            for l in report(&data, Some(comm), "dso,sym", a.top)? {
                text.push_str(&format!("    {l}\n"));
            }
        }
        println!("{text}");
        std::fs::write(out.join(format!("{}.txt", w.name)), &text)?;
    }
    println!(
        "perf.data files and these reports: {} (perf report -i FILE{})",
        out.display(),
        if a.call_graph { " -G" } else { "" }
    );
    Ok(())
}
