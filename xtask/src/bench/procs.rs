//! The bench's processes: every child and namespace is registered so that a signal thread removes them on
//! Ctrl-C / SIGTERM; a child runs with a time limit (a hang is an error, never a wait); what a process used
//! is read from /proc.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::usage::{MARK_END, MARK_START, Role, Usage, snapshot};

#[derive(Default)]
pub(super) struct Registry {
    pub(super) namespaces: Vec<String>,
    pub(super) pids: Vec<i32>,
}

pub(super) static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    namespaces: Vec::new(),
    pids: Vec::new(),
});

pub(super) fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn signal(pid: i32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
}

/// Blocks SIGINT/SIGTERM/SIGHUP in this (still single-threaded) process and waits for them on a thread of
/// its own, which stops every registered process, deletes every registered namespace and exits. Children
/// start with an empty signal mask ([`Proc::spawn`]) in process groups of their own, so a terminal's Ctrl-C
/// reaches only xtask, which takes them down in order.
pub(super) fn install_signal_cleanup() -> Result<()> {
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

/// `--pin`: where the bench's processes run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pin {
    /// `--pin sides` (the default with 2 CPUs or more): namespace A's processes (its daemon, the perf
    /// clients) on the first half of the CPUs this process may use, B's (its daemon, the perf servers) on
    /// the second half. The two namespaces stand for two hosts, each with CPUs of its own.
    Sides,
    /// `--pin none`: wherever the scheduler puts them.
    None,
    /// `--pin CPU`: every process on this one CPU.
    One(usize),
}

impl std::str::FromStr for Pin {
    type Err = String;

    fn from_str(s: &str) -> Result<Pin, String> {
        match s {
            "sides" => Ok(Pin::Sides),
            "none" => Ok(Pin::None),
            n => n
                .parse()
                .map(Pin::One)
                .map_err(|_| format!("`{n}`: expected `sides`, `none` or a CPU number")),
        }
    }
}

/// The CPUs of namespace A's and B's processes (`None`: unpinned), from `--pin` and the CPUs this process
/// may use; set once ([`SIDE_CPUS`]) before the first spawn.
pub(super) fn side_cpus(pin: Pin) -> Result<[Option<Vec<usize>>; 2]> {
    let allowed = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))?;
    let usable: Vec<usize> = (0..nix::sched::CpuSet::count())
        .filter(|&c| allowed.is_set(c).unwrap_or(false))
        .collect();
    split(pin, &usable)
}

/// [`side_cpus`] from the CPUs this process may use.
fn split(pin: Pin, usable: &[usize]) -> Result<[Option<Vec<usize>>; 2]> {
    Ok(match pin {
        Pin::None => [None, None],
        Pin::One(cpu) => {
            anyhow::ensure!(
                usable.contains(&cpu),
                "--pin {cpu}: not a CPU this process may run on"
            );
            [Some(vec![cpu]), Some(vec![cpu])]
        }
        Pin::Sides => {
            anyhow::ensure!(
                usable.len() >= 2,
                "--pin sides needs 2 CPUs; this process may use {}",
                usable.len()
            );
            let (a, b) = usable.split_at(usable.len() / 2);
            [Some(a.to_vec()), Some(b.to_vec())]
        }
    })
}

/// Namespace A's and B's CPUs ([`side_cpus`]), read by every command started in a namespace
/// (`netns::Env::in_ns`).
pub(super) static SIDE_CPUS: std::sync::OnceLock<[Option<Vec<usize>>; 2]> = std::sync::OnceLock::new();

/// Makes `cmd` and everything it starts run on `cpus` only (sched_setaffinity in the child before exec;
/// exec keeps the mask).
pub(super) fn pin_command(cmd: &mut Command, cpus: &[usize]) {
    let mut set = nix::sched::CpuSet::new();
    for &c in cpus {
        // From this process's own affinity mask ([`side_cpus`]): always a CPU number the set can hold.
        let _ = set.set(c);
    }
    // SAFETY: sched_setaffinity is an async-signal-safe system call; the CPU set was built before the fork.
    unsafe {
        cmd.pre_exec(move || {
            nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).map_err(std::io::Error::from)
        });
    }
}

/// A child registered for cleanup; SIGTERM (then SIGKILL) on drop.
pub(super) struct Proc {
    pub(super) child: Child,
    pub(super) what: String,
}

impl Proc {
    pub(super) fn spawn(cmd: &mut Command, what: &str) -> Result<Proc> {
        cmd.process_group(0);
        // SAFETY: pthread_sigmask is an async-signal-safe system call; nothing else runs between fork and
        // exec.
        unsafe {
            cmd.pre_exec(move || {
                // The child must see SIGTERM: undo the mask xtask's threads carry (install_signal_cleanup).
                nix::sys::signal::SigSet::empty()
                    .thread_set_mask()
                    .map_err(std::io::Error::from)?;
                Ok(())
            });
        }
        let child = cmd.spawn().with_context(|| format!("starting {what}: {cmd:?}"))?;
        registry().pids.push(child.id() as i32);
        Ok(Proc {
            child,
            what: what.to_owned(),
        })
    }

    pub(super) fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub(super) fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits up to `limit` for it to exit; `None`: still running.
    pub(super) fn wait_for(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
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

    pub(super) fn stop(&mut self) {
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
pub(super) struct Output {
    pub(super) ok: bool,
    /// It was killed at the limit.
    pub(super) killed: bool,
    pub(super) stdout: String,
    pub(super) stderr: String,
    pub(super) wall: Duration,
}

impl Output {
    /// The reason it failed, for the tables: the last line of stderr.
    pub(super) fn why(&self) -> String {
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
/// Lets a child waiting at a mark go on (a line on its stdin).
fn release(stdin: &mut Option<std::process::ChildStdin>) {
    use std::io::Write;
    if let Some(s) = stdin {
        let _ = s.write_all(b"\n").and_then(|()| s.flush());
    }
}

pub(super) fn run_limited(cmd: &mut Command, what: &str, limit: Duration) -> Result<Output> {
    Ok(run_measured(cmd, what, limit, &[])?.0)
}

/// [`run_limited`], and what `watch` and the child itself (as [`Role::Client`]) used between the child's
/// two marks of its measured interval ([`usage`](super::usage)); `None` without both marks.
pub(super) fn run_measured(
    cmd: &mut Command,
    what: &str,
    limit: Duration,
    watch: &[(Role, i32)],
) -> Result<(Output, Option<Usage>)> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    if watch.is_empty() {
        cmd.stdin(Stdio::null());
    } else {
        // The child waits at each mark for a line on stdin: the snapshot is taken while it waits.
        cmd.env("SOFT_RDMA_PERF_MARKS", "1").stdin(Stdio::piped());
    }
    let t0 = Instant::now();
    let mut p = Proc::spawn(cmd, what)?;
    let mut procs = vec![(Role::Client, p.pid())];
    procs.extend_from_slice(watch);
    let mut out = p.child.stdout.take().expect("piped");
    let err = p.child.stderr.take().expect("piped");
    let mut ack = p.child.stdin.take();
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    // The marks are acted on as they are read: a snapshot of every process at each end of the interval.
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let mut start = None;
        let mut usage = None;
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            match line.trim() {
                MARK_START => {
                    start = Some((Instant::now(), snapshot(&procs)));
                    release(&mut ack);
                }
                MARK_END => {
                    let end = snapshot(&procs);
                    if let Some((t, begin)) = start.take() {
                        usage = Usage::between(&procs, &begin, &end, t.elapsed().as_secs_f64());
                    }
                    release(&mut ack);
                }
                _ => {
                    s.push_str(&line);
                    s.push('\n');
                }
            }
        }
        (s, usage)
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
    let (stderr, usage) = err_t.join().unwrap_or_default();
    Ok((
        Output {
            ok: status.is_some_and(|s| s.success()),
            killed: hung,
            stdout,
            stderr,
            wall,
        },
        usage,
    ))
}

/// `args` run to completion (the netns harness's own helper: an error with stderr if it fails).
pub(super) use soft_rdma_tests::run_quiet;

/// A process's resident memory (VmRSS), bytes.
pub(super) fn rss(pid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_parses_sides_none_and_a_cpu() {
        assert_eq!("sides".parse::<Pin>(), Ok(Pin::Sides));
        assert_eq!("none".parse::<Pin>(), Ok(Pin::None));
        assert_eq!("3".parse::<Pin>(), Ok(Pin::One(3)));
        assert!("both".parse::<Pin>().is_err());
    }

    #[test]
    fn sides_split_the_usable_cpus_in_halves() {
        assert_eq!(
            split(Pin::Sides, &[0, 1]).unwrap(),
            [Some(vec![0]), Some(vec![1])]
        );
        // An odd count: B (the servers' side) gets the extra CPU.
        assert_eq!(
            split(Pin::Sides, &[2, 4, 6]).unwrap(),
            [Some(vec![2]), Some(vec![4, 6])]
        );
        assert!(split(Pin::Sides, &[0]).is_err());
        assert_eq!(
            split(Pin::One(4), &[2, 4]).unwrap(),
            [Some(vec![4]), Some(vec![4])]
        );
        assert!(split(Pin::One(1), &[2, 4]).is_err());
        assert_eq!(split(Pin::None, &[0, 1]).unwrap(), [None, None]);
    }
}
