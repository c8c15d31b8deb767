//! What every process of one measurement used over the measured interval only: CPU time and voluntary
//! context switches, summed over the process's threads, read from /proc at the interval's two ends.
//!
//! The perf client marks the ends on stderr (`perf: measuring` / `perf: measured`, when
//! `$SOFT_RDMA_PERF_MARKS` is set) and waits at each for a line on stdin; the bench snapshots every process
//! while it waits, then lets it go on. Connection setup, registration and teardown are outside the figures;
//! CPU per Gb/s is CPU seconds per gigabit moved, so the idle wait at the marks does not dilute it. CPU time is the scheduler's (schedstat, ns);
//! context switches are `voluntary_ctxt_switches` of each thread's status (a thread that blocked: a wake-up
//! paid per wait). Both are read per thread: a thread started within the interval counts from zero, and a
//! thread that ended within it takes its figures with it (Linux keeps no per-thread total of exited threads
//! at this resolution), so each process says how many of its threads ended ([`Used::threads_ended`]): a
//! figure with ended threads is a lower bound.

use serde::Serialize;

/// The perf client's marks for the two ends of its measured interval.
pub(super) const MARK_START: &str = "perf: measuring";
pub(super) const MARK_END: &str = "perf: measured";

/// Which side of the link a process runs on and what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(super) enum Role {
    /// The perf client (namespace A).
    Client,
    /// soft-rdmad in A.
    DaemonA,
    /// soft-rdmad in B.
    DaemonB,
    /// The perf server (namespace B).
    Server,
}

impl Role {
    /// A side (the client's) or B side (the server's).
    pub(super) fn side_a(self) -> bool {
        matches!(self, Role::Client | Role::DaemonA)
    }
}

/// The client library's progress thread as the kernel names it (`soft_rdma::client`'s in-process data
/// path: one per process, serving connections their runtime leaves; its `THREAD_NAME`). Its share of a
/// process's switches is shown on its own.
pub(super) const PROGRESS_THREAD: &str = "soft-rdma-prog";

/// One thread's counters at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Counters {
    pub(super) cpu_ns: u64,
    pub(super) voluntary_switches: u64,
    /// The thread is the client library's progress thread ([`PROGRESS_THREAD`]).
    pub(super) progress: bool,
}

/// One process's threads' counters at one instant, by thread id.
pub(super) type Threads = std::collections::BTreeMap<i32, Counters>;

/// What one process used over the interval.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub(super) struct Used {
    pub(super) role: Role,
    pub(super) pid: i32,
    pub(super) cpu_s: f64,
    pub(super) voluntary_switches: u64,
    /// Of `voluntary_switches`, the progress thread's, if the process has one.
    pub(super) progress_switches: Option<u64>,
    /// Threads that ended within the interval (their share is missing from the figures above).
    pub(super) threads_ended: usize,
}

/// Every process's use over one measured interval, and the interval's length as the bench saw it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(super) struct Usage {
    pub(super) interval_s: f64,
    pub(super) procs: Vec<Used>,
}

impl Usage {
    /// From the snapshots at the two ends; `None` if a process vanished in between (its figures would be
    /// missing, so the sum would be wrong).
    pub(super) fn between(
        procs: &[(Role, i32)],
        start: &[Option<Threads>],
        end: &[Option<Threads>],
        interval_s: f64,
    ) -> Option<Usage> {
        let mut v = Vec::new();
        for (i, &(role, pid)) in procs.iter().enumerate() {
            let (a, b) = (start.get(i)?.as_ref()?, end.get(i)?.as_ref()?);
            let (mut cpu_ns, mut voluntary_switches) = (0u64, 0u64);
            let mut progress_switches = None;
            for (tid, e) in b {
                // A thread id is not reused while the process lives long enough to matter here; a counter
                // that went back means it was: no figure rather than a wrong one.
                let s = a.get(tid).copied().unwrap_or_default();
                cpu_ns += e.cpu_ns.checked_sub(s.cpu_ns)?;
                let switches = e.voluntary_switches.checked_sub(s.voluntary_switches)?;
                voluntary_switches += switches;
                if e.progress {
                    *progress_switches.get_or_insert(0) += switches;
                }
            }
            v.push(Used {
                role,
                pid,
                cpu_s: cpu_ns as f64 / 1e9,
                voluntary_switches,
                progress_switches,
                threads_ended: a.keys().filter(|t| !b.contains_key(t)).count(),
            });
        }
        (interval_s > 0.0).then_some(Usage { interval_s, procs: v })
    }

    /// Whether no thread ended within the interval (else the figures are lower bounds).
    pub(super) fn complete(&self) -> bool {
        self.procs.iter().all(|p| p.threads_ended == 0)
    }

    /// CPU seconds of side A's (or B's) processes.
    pub(super) fn cpu_s(&self, side_a: bool) -> f64 {
        self.procs
            .iter()
            .filter(|p| p.role.side_a() == side_a)
            .map(|p| p.cpu_s)
            .sum()
    }

    /// Cores per Gb/s: CPU seconds per gigabit moved (`bits` over the interval; the interval's length
    /// cancels out, so the processes' idle wait at the marks does not dilute it).
    pub(super) fn cores_per_gbps(&self, side_a: bool, bits: f64) -> Option<f64> {
        (bits > 0.0).then(|| self.cpu_s(side_a) / (bits / 1e9))
    }

    /// Voluntary context switches of side A's (or B's) processes per operation.
    pub(super) fn switches_per_op(&self, side_a: bool, ops: u64) -> Option<f64> {
        let n: u64 = self
            .procs
            .iter()
            .filter(|p| p.role.side_a() == side_a)
            .map(|p| p.voluntary_switches)
            .sum();
        (ops > 0).then(|| n as f64 / ops as f64)
    }

    /// Of [`Self::switches_per_op`], the progress threads'; `None` if no process on that side has one.
    pub(super) fn progress_switches_per_op(&self, side_a: bool, ops: u64) -> Option<f64> {
        let n: Option<u64> = self
            .procs
            .iter()
            .filter(|p| p.role.side_a() == side_a)
            .filter_map(|p| p.progress_switches)
            .reduce(|x, y| x + y);
        n.filter(|_| ops > 0).map(|n| n as f64 / ops as f64)
    }
}

/// The time on a CPU in a thread's `schedstat` (its first field, ns).
pub(super) fn parse_schedstat(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

/// The thread's name (`Name` of its `status`: the kernel's 15 bytes of it).
pub(super) fn parse_name(status: &str) -> Option<&str> {
    Some(status.lines().find_map(|l| l.strip_prefix("Name:"))?.trim())
}

/// `voluntary_ctxt_switches` of a thread's `status`.
pub(super) fn parse_voluntary(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))?
        .trim()
        .parse()
        .ok()
}

/// Process `pid`'s threads' counters; `None` if it is gone or /proc cannot be read.
pub(super) fn counters(pid: i32) -> Option<Threads> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut threads = Threads::new();
    for t in dir.flatten() {
        let Some(tid) = t.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let path = t.path();
        // A thread that exits between the listing and the read is as if it had ended before.
        let (Ok(sched), Ok(status)) = (
            std::fs::read_to_string(path.join("schedstat")),
            std::fs::read_to_string(path.join("status")),
        ) else {
            continue;
        };
        threads.insert(
            tid,
            Counters {
                cpu_ns: parse_schedstat(&sched)?,
                voluntary_switches: parse_voluntary(&status)?,
                progress: parse_name(&status) == Some(PROGRESS_THREAD),
            },
        );
    }
    Some(threads)
}

/// Every process's counters, in order.
pub(super) fn snapshot(procs: &[(Role, i32)]) -> Vec<Option<Threads>> {
    procs.iter().map(|&(_, pid)| counters(pid)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_schedstat_and_status() {
        assert_eq!(parse_schedstat("123456 789 10\n"), Some(123_456));
        assert_eq!(parse_schedstat(""), None);
        assert_eq!(parse_schedstat("x 1 2"), None);
        let status = "Name:\tsoft-rdmad\nvoluntary_ctxt_switches:\t41\nnonvoluntary_ctxt_switches:\t7\n";
        assert_eq!(parse_voluntary(status), Some(41), "not the nonvoluntary line");
        assert_eq!(parse_voluntary("Name:\tx\n"), None);
        assert_eq!(parse_name(status), Some("soft-rdmad"));
        assert_eq!(parse_name("State:\tS\n"), None);
    }

    #[test]
    fn this_process_has_counters() {
        let me = std::process::id() as i32;
        let total = |t: &Threads| t.values().map(|c| c.cpu_ns).sum::<u64>();
        let c = counters(me).expect("our own /proc entry");
        assert!(c.contains_key(&me), "the main thread is listed: {c:?}");
        // Spin until the scheduler has charged some time: a reader that summed nothing would stay at 0.
        let mut x = 0u64;
        while total(&counters(me).expect("still here")) == total(&c) {
            x = x.wrapping_add(1);
        }
        std::hint::black_box(x);
        assert_eq!(counters(-1), None);
    }

    /// The thread id the tests give a progress thread.
    const PROGRESS_TID: i32 = 99;

    /// One process with threads (tid, cpu_ns, voluntary switches); thread [`PROGRESS_TID`] is a progress
    /// thread.
    fn t(threads: &[(i32, u64, u64)]) -> Option<Threads> {
        Some(
            threads
                .iter()
                .map(|&(tid, cpu_ns, voluntary_switches)| {
                    (
                        tid,
                        Counters {
                            cpu_ns,
                            voluntary_switches,
                            progress: tid == PROGRESS_TID,
                        },
                    )
                })
                .collect(),
        )
    }

    fn c(cpu_ns: u64, voluntary_switches: u64) -> Option<Threads> {
        t(&[(1, cpu_ns, voluntary_switches)])
    }

    #[test]
    fn usage_per_side() {
        let procs = [
            (Role::Client, 1),
            (Role::DaemonA, 2),
            (Role::DaemonB, 3),
            (Role::Server, 4),
        ];
        let start = [c(0, 0), c(1_000_000_000, 10), c(0, 0), c(5, 5)];
        let end = [
            c(500_000_000, 100),
            c(1_500_000_000, 110),
            c(250_000_000, 50),
            c(5, 55),
        ];
        let u = Usage::between(&procs, &start, &end, 2.0).unwrap();
        assert_eq!(u.cpu_s(true), 1.0);
        assert_eq!(u.cpu_s(false), 0.25);
        assert_eq!(u.cores_per_gbps(true, 4e9), Some(0.25), "1 CPU second for 4 Gbit");
        assert_eq!(u.cores_per_gbps(true, 0.0), None);
        assert_eq!(u.switches_per_op(true, 100), Some(2.0));
        assert_eq!(u.switches_per_op(false, 100), Some(1.0));
        assert_eq!(u.switches_per_op(false, 0), None);
        assert!(u.procs.iter().all(|p| p.threads_ended == 0));
        assert_eq!(u.progress_switches_per_op(true, 100), None, "no progress thread");
    }

    /// A progress thread's switches count in its process's, and on their own.
    #[test]
    fn the_progress_threads_share() {
        let procs = [(Role::Client, 1), (Role::DaemonA, 2), (Role::Server, 3)];
        let start = [t(&[(1, 0, 0), (PROGRESS_TID, 0, 0)]), c(0, 0), c(0, 0)];
        let end = [t(&[(1, 0, 100), (PROGRESS_TID, 0, 4)]), c(0, 7), c(0, 100)];
        let u = Usage::between(&procs, &start, &end, 1.0).unwrap();
        assert_eq!(u.procs[0].progress_switches, Some(4));
        assert_eq!(u.procs[1].progress_switches, None);
        assert_eq!(u.switches_per_op(true, 100), Some(1.11));
        assert_eq!(u.progress_switches_per_op(true, 100), Some(0.04));
        assert_eq!(u.progress_switches_per_op(false, 100), None);
    }

    #[test]
    fn threads_that_start_or_end_within_the_interval() {
        let procs = [(Role::Server, 9)];
        // Thread 2 started within the interval (counts from zero), thread 3 ended within it (counted as
        // ended, its share missing), thread 1 ran throughout.
        let start = [t(&[(1, 100, 1), (3, 500, 5)])];
        let end = [t(&[(1, 300, 4), (2, 50, 2)])];
        let u = Usage::between(&procs, &start, &end, 1.0).unwrap();
        assert_eq!(u.procs[0].cpu_s, 250e-9);
        assert_eq!(u.procs[0].voluntary_switches, 5);
        assert_eq!(u.procs[0].threads_ended, 1);
    }

    #[test]
    fn a_vanished_process_or_a_counter_going_back_gives_no_usage() {
        let procs = [(Role::Client, 1), (Role::DaemonA, 2)];
        assert_eq!(
            Usage::between(&procs, &[c(0, 0), c(0, 0)], &[c(1, 1), None], 1.0),
            None
        );
        assert_eq!(
            Usage::between(&procs, &[c(0, 0), None], &[c(1, 1), c(1, 1)], 1.0),
            None
        );
        assert_eq!(
            Usage::between(&procs, &[c(5, 0), c(0, 0)], &[c(1, 1), c(1, 1)], 1.0),
            None
        );
        assert_eq!(Usage::between(&procs, &[c(0, 0)], &[c(1, 1), c(1, 1)], 1.0), None);
        assert_eq!(
            Usage::between(&procs, &[c(0, 0), c(0, 0)], &[c(1, 1), c(1, 1)], 0.0),
            None
        );
    }
}
