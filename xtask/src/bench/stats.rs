//! Samples (one per perf invocation) and their statistics: median/min/max over runs, and ratios paired
//! run by run.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::Mode;
use super::usage::Usage;

/// One measurement of one run.
#[derive(Clone, Debug, Serialize)]
pub(super) struct Sample {
    pub(super) part: &'static str,
    pub(super) mode: Mode,
    /// The perf test: write, read, send, tcp-stream, tcp-pingpong, connect, tcp-connect.
    pub(super) test: String,
    /// bw, lat, rate, hold.
    pub(super) kind: &'static str,
    pub(super) bytes: u64,
    pub(super) concurrency: u32,
    pub(super) run: u32,
    pub(super) error: Option<String>,
    /// The perf tool's JSON row (scale: its "up" and "down" lines and the memory figures).
    pub(super) row: Value,
    /// What every process (perf client and server, both daemons) used over the measured interval only.
    pub(super) usage: Option<Usage>,
    pub(super) wall_s: f64,
}

impl Sample {
    /// A sample with no result yet (no error, no row, no usage).
    pub(super) fn new(
        part: &'static str,
        mode: Mode,
        test: &str,
        kind: &'static str,
        bytes: u64,
        concurrency: u32,
        run: u32,
    ) -> Sample {
        Sample {
            part,
            mode,
            test: test.to_owned(),
            kind,
            bytes,
            concurrency,
            run,
            error: None,
            row: Value::Null,
            usage: None,
            wall_s: 0.0,
        }
    }

    /// A figure of the row. A row that comes with an error (some connections failed) still has the figures
    /// of what succeeded; the tables flag them with the error.
    pub(super) fn f(&self, field: &str) -> Option<f64> {
        self.row.get(field)?.as_f64()
    }
}

/// Median, min and max of a figure over runs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub(super) struct Stat {
    pub(super) median: f64,
    pub(super) min: f64,
    pub(super) max: f64,
    pub(super) n: usize,
}

/// The statistics of the finite values of `v` (`None` if there are none).
pub(super) fn stat(v: &[f64]) -> Option<Stat> {
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

/// Every sample of the bench.
pub(super) struct Samples(pub(super) Vec<Sample>);

impl Samples {
    /// The samples `q` names (one per run).
    pub(super) fn find<'a>(&'a self, q: Q<'a>) -> impl Iterator<Item = &'a Sample> + 'a {
        self.0.iter().filter(move |s| {
            s.part == q.part
                && s.mode == q.mode
                && s.test == q.test
                && s.kind == q.kind
                && s.bytes == q.bytes
                && s.concurrency == q.concurrency
        })
    }

    /// Per run: `field` of the sample.
    pub(super) fn by_run(&self, q: Q<'_>, field: &str) -> BTreeMap<u32, f64> {
        self.find(q).filter_map(|s| Some((s.run, s.f(field)?))).collect()
    }

    pub(super) fn stat(&self, q: Q<'_>, field: &str) -> Option<Stat> {
        stat(&self.by_run(q, field).into_values().collect::<Vec<_>>())
    }

    /// Per run without a failure: `field` of the sample. Ratios pair these only: a run that failed on either
    /// side says nothing about the other.
    fn by_good_run(&self, q: Q<'_>, field: &str) -> BTreeMap<u32, f64> {
        self.find(q)
            .filter(|s| s.error.is_none())
            .filter_map(|s| Some((s.run, s.f(field)?)))
            .collect()
    }

    /// Median (min, max) over runs of `q.field / base.base_field` within the same run, runs with a failure
    /// on either side left out.
    pub(super) fn ratio(&self, q: Q<'_>, base: Q<'_>, field: &str, base_field: &str) -> Option<Stat> {
        let a = self.by_good_run(q, field);
        let b = self.by_good_run(base, base_field);
        let v: Vec<f64> = a.iter().filter_map(|(r, x)| Some(x / b.get(r)?)).collect();
        stat(&v)
    }

    /// Runs that have a figure on either side but are left out of [`Self::ratio`] (a failure on one side
    /// or a figure missing on the other), of all the runs either side has.
    pub(super) fn ratio_left_out(
        &self,
        q: Q<'_>,
        base: Q<'_>,
        field: &str,
        base_field: &str,
    ) -> (usize, usize) {
        let runs = |qq: Q<'_>| -> std::collections::BTreeSet<u32> {
            self.find(qq)
                .filter(|s| !s.error.as_deref().is_some_and(|e| e.starts_with("skipped")))
                .map(|s| s.run)
                .collect()
        };
        let all: std::collections::BTreeSet<u32> = runs(q).union(&runs(base)).copied().collect();
        let (a, b) = (self.by_good_run(q, field), self.by_good_run(base, base_field));
        let paired = all
            .iter()
            .filter(|r| a.contains_key(r) && b.contains_key(r))
            .count();
        (all.len() - paired, all.len())
    }

    /// Statistics of `f` over the runs without a failure (figures derived from [`Sample::usage`]).
    pub(super) fn stat_of(&self, q: Q<'_>, f: impl Fn(&Sample) -> Option<f64>) -> Option<Stat> {
        let v: Vec<f64> = self.find(q).filter(|s| s.error.is_none()).filter_map(f).collect();
        stat(&v)
    }

    /// Distinct errors of the samples `q` names.
    pub(super) fn errors(&self, q: Q<'_>) -> Vec<String> {
        let mut v: Vec<String> = self.find(q).filter_map(|s| s.error.clone()).collect();
        // Failures first, skips last.
        v.sort_by_key(|e| (e.starts_with("skipped"), e.clone()));
        v.dedup();
        v
    }
}

/// A query: which samples.
#[derive(Clone, Copy)]
pub(super) struct Q<'a> {
    pub(super) part: &'a str,
    pub(super) mode: Mode,
    pub(super) test: &'a str,
    pub(super) kind: &'a str,
    pub(super) bytes: u64,
    pub(super) concurrency: u32,
}

/// The query for the samples of `part`, `mode`, `test`, `kind`, `bytes` and `concurrency` (the report's
/// tables and plots ask for one cell or point at a time).
pub(super) fn q<'a>(
    part: &'a str,
    mode: Mode,
    test: &'a str,
    kind: &'a str,
    bytes: u64,
    concurrency: u32,
) -> Q<'a> {
    Q {
        part,
        mode,
        test,
        kind,
        bytes,
        concurrency,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample(test: &str, run: u32, bw: Option<f64>, error: Option<&str>) -> Sample {
        Sample {
            error: error.map(str::to_owned),
            row: bw.map_or(Value::Null, |b| json!({ "bw_gbps": b })),
            ..Sample::new("data", Mode::Kernel, test, "bw", 64, 0, run)
        }
    }

    fn q(test: &str) -> Q<'_> {
        Q {
            part: "data",
            mode: Mode::Kernel,
            test,
            kind: "bw",
            bytes: 64,
            concurrency: 0,
        }
    }

    #[test]
    fn median_min_max() {
        let s = stat(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        let s = stat(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.5, 1.0, 4.0, 4));
        let s = stat(&[f64::NAN, 5.0, f64::INFINITY]).unwrap();
        assert_eq!((s.median, s.n), (5.0, 1), "non-finite values are left out");
        assert_eq!(stat(&[]), None);
        assert_eq!(stat(&[f64::NAN]), None);
    }

    #[test]
    fn ratios_pair_runs_and_leave_out_failures() {
        let s = Samples(vec![
            sample("write", 1, Some(2.0), None),
            sample("tcp-stream", 1, Some(1.0), None),
            // Run 2: the soft-rdma side has figures but failed (some messages lost): not in the ratio.
            sample(
                "write",
                2,
                Some(100.0),
                Some("2 of 100 connections failed: reset"),
            ),
            sample("tcp-stream", 2, Some(1.0), None),
            // Run 3: the baseline failed.
            sample("write", 3, Some(3.0), None),
            sample("tcp-stream", 3, None, Some("connection refused")),
            // Run 4: paired with its own baseline, not run 1's.
            sample("write", 4, Some(8.0), None),
            sample("tcp-stream", 4, Some(2.0), None),
            // Run 5: skipped on both sides: not counted as left out.
            sample("write", 5, None, Some("skipped: out of the time budget")),
            sample("tcp-stream", 5, None, Some("skipped: out of the time budget")),
        ]);
        let r = s
            .ratio(q("write"), q("tcp-stream"), "bw_gbps", "bw_gbps")
            .unwrap();
        assert_eq!((r.median, r.min, r.max, r.n), (3.0, 2.0, 4.0, 2));
        assert_eq!(
            s.ratio_left_out(q("write"), q("tcp-stream"), "bw_gbps", "bw_gbps"),
            (2, 4)
        );
        // The plain figures keep a failed run's numbers (the cell flags them).
        assert_eq!(s.stat(q("write"), "bw_gbps").unwrap().n, 4);
        assert_eq!(s.stat_of(q("write"), |x| x.f("bw_gbps")).unwrap().n, 3);
        assert_eq!(s.ratio(q("read"), q("tcp-stream"), "bw_gbps", "bw_gbps"), None);
    }
}
