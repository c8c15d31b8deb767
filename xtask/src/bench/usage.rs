//! What every process of one measurement used over the measured interval only: CPU time and voluntary
//! context switches, summed over the process's threads, read from /proc at the interval's two ends.
//!
//! The perf client marks the ends on stderr (`perf: measuring` / `perf: measured`, when
//! `$SOFT_RDMA_PERF_MARKS` is set); the bench snapshots every process as it reads each mark, so connection
//! setup, registration and teardown are outside the figures. CPU time is the scheduler's (schedstat, ns);
//! context switches are `voluntary_ctxt_switches` of each thread's status (a thread that blocked: a wake-up
//! paid per wait).

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

/// One process's counters at one instant (summed over its threads).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Counters {
    pub(super) cpu_ns: u64,
    pub(super) voluntary_switches: u64,
}

/// What one process used over the interval.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub(super) struct Used {
    pub(super) role: Role,
    pub(super) pid: i32,
    pub(super) cpu_s: f64,
    pub(super) voluntary_switches: u64,
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
        start: &[Option<Counters>],
        end: &[Option<Counters>],
        interval_s: f64,
    ) -> Option<Usage> {
        let mut v = Vec::new();
        for (i, &(role, pid)) in procs.iter().enumerate() {
            let (a, b) = ((*start.get(i)?)?, (*end.get(i)?)?);
            v.push(Used {
                role,
                pid,
                cpu_s: b.cpu_ns.checked_sub(a.cpu_ns)? as f64 / 1e9,
                voluntary_switches: b.voluntary_switches.checked_sub(a.voluntary_switches)?,
            });
        }
        (interval_s > 0.0).then_some(Usage { interval_s, procs: v })
    }

    /// CPU seconds of side A's (or B's) processes.
    pub(super) fn cpu_s(&self, side_a: bool) -> f64 {
        self.procs
            .iter()
            .filter(|p| p.role.side_a() == side_a)
            .map(|p| p.cpu_s)
            .sum()
    }

    /// Cores side A (or B) kept busy over the interval.
    pub(super) fn cores(&self, side_a: bool) -> f64 {
        self.cpu_s(side_a) / self.interval_s
    }

    /// Cores per Gb/s moved: how much CPU each gigabit per second costs that side.
    pub(super) fn cores_per_gbps(&self, side_a: bool, gbps: f64) -> Option<f64> {
        (gbps > 0.0).then(|| self.cores(side_a) / gbps)
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
}

/// The time on a CPU in a thread's `schedstat` (its first field, ns).
pub(super) fn parse_schedstat(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
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

/// Process `pid`'s counters summed over its threads; `None` if it is gone or /proc cannot be read.
pub(super) fn counters(pid: i32) -> Option<Counters> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut c = Counters::default();
    for t in dir.flatten() {
        let path = t.path();
        // A thread that exits between the listing and the read takes its figures with it: the process
        // total can only be read while the thread lives (schedstat has no exited-threads sum).
        let (Ok(sched), Ok(status)) = (
            std::fs::read_to_string(path.join("schedstat")),
            std::fs::read_to_string(path.join("status")),
        ) else {
            continue;
        };
        c.cpu_ns += parse_schedstat(&sched)?;
        c.voluntary_switches += parse_voluntary(&status)?;
    }
    Some(c)
}

/// Every process's counters, in order.
pub(super) fn snapshot(procs: &[(Role, i32)]) -> Vec<Option<Counters>> {
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
    }

    #[test]
    fn this_process_has_counters() {
        let c = counters(std::process::id() as i32).expect("our own /proc entry");
        // Spin until the scheduler has charged some time: a reader that summed nothing would stay at 0.
        let mut x = 0u64;
        while counters(std::process::id() as i32).expect("still here").cpu_ns == c.cpu_ns {
            x = x.wrapping_add(1);
        }
        std::hint::black_box(x);
        assert_eq!(counters(-1), None);
    }

    fn c(cpu_ns: u64, voluntary_switches: u64) -> Option<Counters> {
        Some(Counters {
            cpu_ns,
            voluntary_switches,
        })
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
        let end = [c(500_000_000, 100), c(1_500_000_000, 110), c(250_000_000, 50), c(5, 55)];
        let u = Usage::between(&procs, &start, &end, 2.0).unwrap();
        assert_eq!(u.cpu_s(true), 1.0);
        assert_eq!(u.cpu_s(false), 0.25);
        assert_eq!(u.cores(true), 0.5);
        assert_eq!(u.cores_per_gbps(true, 4.0), Some(0.125));
        assert_eq!(u.cores_per_gbps(true, 0.0), None);
        assert_eq!(u.switches_per_op(true, 100), Some(2.0));
        assert_eq!(u.switches_per_op(false, 100), Some(1.0));
        assert_eq!(u.switches_per_op(false, 0), None);
    }

    #[test]
    fn a_vanished_process_or_a_counter_going_back_gives_no_usage() {
        let procs = [(Role::Client, 1), (Role::DaemonA, 2)];
        assert_eq!(Usage::between(&procs, &[c(0, 0), c(0, 0)], &[c(1, 1), None], 1.0), None);
        assert_eq!(Usage::between(&procs, &[c(0, 0), None], &[c(1, 1), c(1, 1)], 1.0), None);
        assert_eq!(Usage::between(&procs, &[c(5, 0), c(0, 0)], &[c(1, 1), c(1, 1)], 1.0), None);
        assert_eq!(Usage::between(&procs, &[c(0, 0)], &[c(1, 1), c(1, 1)], 1.0), None);
        assert_eq!(Usage::between(&procs, &[c(0, 0), c(0, 0)], &[c(1, 1), c(1, 1)], 0.0), None);
    }
}
