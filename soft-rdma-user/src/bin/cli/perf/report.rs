//! Results: one JSON/table row per message size ([`Row`]), the statistics of latency samples, and the
//! progress line on a terminal.

use super::*;

/// One row of results.
#[derive(Clone, Debug, serde::Serialize)]
pub(super) struct Row {
    pub(super) test: PerfTest,
    pub(super) mode: &'static str,
    pub(super) bytes: u64,
    pub(super) iterations: u32,
    pub(super) depth: u32,
    pub(super) elapsed_s: f64,
    pub(super) bw_gbps: f64,
    pub(super) msg_rate_mpps: f64,
    /// What the latency figures measure.
    pub(super) lat_kind: &'static str,
    pub(super) lat_min_us: f64,
    pub(super) lat_avg_us: f64,
    pub(super) lat_p50_us: f64,
    pub(super) lat_p99_us: f64,
    pub(super) lat_max_us: f64,
    pub(super) cpu_percent: f64,
    /// Bytes the server says it received (send bandwidth).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) server_bytes: Option<u64>,
}

impl Row {
    /// The row of a measured run of `test` in `mode`: `iters` messages of `size` bytes, `depth` in flight;
    /// `lat_kind` says what the latency samples measure.
    pub(super) fn new(
        test: PerfTest,
        mode: &'static str,
        size: u32,
        iters: u32,
        depth: u32,
        lat_kind: &'static str,
        m: Measured,
    ) -> Row {
        let secs = m.elapsed.as_secs_f64();
        let mut lat = m.lat;
        let s = stats(&mut lat);
        Row {
            test,
            mode,
            bytes: u64::from(size),
            iterations: iters,
            depth,
            elapsed_s: secs,
            bw_gbps: (u64::from(size) * u64::from(iters)) as f64 * 8.0 / secs / 1e9,
            msg_rate_mpps: f64::from(iters) / secs / 1e6,
            lat_kind,
            lat_min_us: s.min,
            lat_avg_us: s.avg,
            lat_p50_us: s.p50,
            lat_p99_us: s.p99,
            lat_max_us: s.max,
            cpu_percent: 100.0 * m.cpu.as_secs_f64() / secs,
            server_bytes: m.server_bytes,
        }
    }
}

pub(super) struct Stats {
    pub(super) min: f64,
    pub(super) avg: f64,
    pub(super) p50: f64,
    pub(super) p99: f64,
    pub(super) max: f64,
}

/// Nearest-rank percentiles of `samples` (µs).
pub(super) fn stats(samples: &mut [f64]) -> Stats {
    if samples.is_empty() {
        return Stats {
            min: 0.0,
            avg: 0.0,
            p50: 0.0,
            p99: 0.0,
            max: 0.0,
        };
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let n = samples.len();
    let rank = |q: f64| samples[((q * n as f64).ceil() as usize).clamp(1, n) - 1];
    Stats {
        min: samples[0],
        avg: samples.iter().sum::<f64>() / n as f64,
        p50: rank(0.50),
        p99: rank(0.99),
        max: samples[n - 1],
    }
}

pub(super) fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Progress on stderr (only when it is a terminal), at most a few times a second.
pub(super) struct Progress {
    pub(super) on: bool,
    pub(super) label: String,
    pub(super) total: u32,
    pub(super) last: Instant,
    pub(super) shown: bool,
}

impl Progress {
    pub(super) fn new(label: String, total: u32) -> Progress {
        Progress {
            on: std::io::stderr().is_terminal(),
            label,
            total,
            last: Instant::now(),
            shown: false,
        }
    }

    pub(super) fn tick(&mut self, done: u32) {
        if self.on && self.last.elapsed() >= Duration::from_millis(250) {
            self.last = Instant::now();
            self.shown = true;
            let pct = 100.0 * f64::from(done) / f64::from(self.total.max(1));
            let _ = write!(
                std::io::stderr(),
                "\r  {}: {done}/{} ({pct:.0}%)   ",
                self.label,
                self.total
            );
        }
    }

    pub(super) fn finish(&mut self) {
        if self.shown {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
            self.shown = false;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}
