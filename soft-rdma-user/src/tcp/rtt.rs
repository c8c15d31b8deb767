//! Retransmission timeout from measured round-trip times (RFC 6298), with a configurable minimum
//! (soft-rdma defaults to 200 ms, as Linux does, rather than RFC 6298 §2.4's 1 s).

use std::time::Duration;

/// RFC 6298 §2 estimator: SRTT, RTTVAR and the RTO, plus the exponential backoff of §5.5.
#[derive(Clone, Copy, Debug)]
pub struct RttEstimator {
    srtt_us: u64,
    rttvar_us: u64,
    has_sample: bool,
    initial_us: u64,
    min_us: u64,
    max_us: u64,
    backoff: u32,
    /// Smallest sample seen (RFC 8985 §6.2.4 sizes the reordering window from it).
    min_rtt_us: u64,
}

/// Clock granularity G of RFC 6298 §2: 1 ms (the timestamp clock of RFC 7323 ticks in milliseconds).
const GRANULARITY_US: u64 = 1_000;

impl RttEstimator {
    pub fn new(initial: Duration, min: Duration, max: Duration) -> Self {
        RttEstimator {
            srtt_us: 0,
            rttvar_us: 0,
            has_sample: false,
            initial_us: initial.as_micros() as u64,
            min_us: min.as_micros() as u64,
            max_us: max.as_micros().max(min.as_micros()) as u64,
            backoff: 0,
            min_rtt_us: u64::MAX,
        }
    }

    /// Take one RTT measurement R (RFC 6298 §2.2 for the first, §2.3 afterwards: alpha 1/8, beta 1/4).
    /// A new measurement also ends the backoff (RFC 6298 §5.7's note: the backed-off RTO is kept only
    /// until a valid sample arrives).
    pub fn on_sample(&mut self, rtt: Duration) {
        let r = (rtt.as_micros() as u64).max(1);
        self.min_rtt_us = self.min_rtt_us.min(r);
        if !self.has_sample {
            self.srtt_us = r;
            self.rttvar_us = r / 2;
            self.has_sample = true;
        } else {
            let delta = self.srtt_us.abs_diff(r);
            self.rttvar_us = (3 * self.rttvar_us + delta) / 4;
            self.srtt_us = (7 * self.srtt_us + r) / 8;
        }
        self.backoff = 0;
    }

    /// The base RTO without backoff: 1 s (configurable) before any sample (RFC 6298 §2.1), then
    /// SRTT + max(G, 4·RTTVAR) (§2.3), clamped to [min, max] (§2.4, §2.5).
    pub fn base_rto(&self) -> Duration {
        let us = if self.has_sample {
            self.srtt_us + GRANULARITY_US.max(4 * self.rttvar_us)
        } else {
            self.initial_us
        };
        Duration::from_micros(us.clamp(self.min_us, self.max_us))
    }

    /// The RTO to arm now: the base doubled per expiry (RFC 6298 §5.5), at most the maximum.
    pub fn rto(&self) -> Duration {
        let base = self.base_rto().as_micros() as u64;
        let shifted = base.saturating_mul(1u64 << self.backoff.min(20));
        Duration::from_micros(shifted.min(self.max_us))
    }

    /// The timer expired: back off (RFC 6298 §5.5).
    pub fn on_timeout(&mut self) {
        self.backoff = self.backoff.saturating_add(1);
    }

    pub fn reset_backoff(&mut self) {
        self.backoff = 0;
    }

    pub fn backoff(&self) -> u32 {
        self.backoff
    }

    /// The smallest RTT measured.
    pub fn min_rtt(&self) -> Option<Duration> {
        self.has_sample.then(|| Duration::from_micros(self.min_rtt_us))
    }

    /// The smoothed RTT, once measured.
    pub fn srtt(&self) -> Option<Duration> {
        self.has_sample.then(|| Duration::from_micros(self.srtt_us))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn initial_rto_is_one_second_before_any_sample() {
        let e = RttEstimator::new(ms(1000), ms(200), ms(60_000));
        assert_eq!(e.rto(), ms(1000));
        assert_eq!(e.srtt(), None);
    }

    #[test]
    fn first_sample_sets_srtt_and_half_rttvar() {
        let mut e = RttEstimator::new(ms(1000), ms(1), ms(60_000));
        e.on_sample(ms(100));
        assert_eq!(e.srtt(), Some(ms(100)));
        // RTO = 100 + 4 * 50.
        assert_eq!(e.rto(), ms(300));
    }

    #[test]
    fn later_samples_smooth_with_one_eighth_and_one_quarter() {
        let mut e = RttEstimator::new(ms(1000), ms(1), ms(60_000));
        e.on_sample(ms(100));
        e.on_sample(ms(200));
        // RTTVAR = 3/4·50 + 1/4·100 = 62.5; SRTT = 7/8·100 + 1/8·200 = 112.5.
        assert_eq!(e.srtt(), Some(Duration::from_micros(112_500)));
        assert_eq!(e.rto(), Duration::from_micros(112_500 + 250_000));
    }

    #[test]
    fn minimum_applies_and_is_configurable() {
        let mut e = RttEstimator::new(ms(1000), ms(200), ms(60_000));
        e.on_sample(ms(1));
        assert_eq!(e.rto(), ms(200));
        let mut e = RttEstimator::new(ms(1000), ms(5), ms(60_000));
        e.on_sample(ms(1));
        // 1 ms + max(G, 2 ms) = 3 ms, raised to the 5 ms minimum.
        assert_eq!(e.rto(), ms(5));
    }

    #[test]
    fn backoff_doubles_up_to_the_maximum_and_a_sample_resets_it() {
        let mut e = RttEstimator::new(ms(1000), ms(200), ms(3000));
        e.on_timeout();
        assert_eq!(e.rto(), ms(2000));
        e.on_timeout();
        assert_eq!(e.rto(), ms(3000));
        for _ in 0..100 {
            e.on_timeout();
        }
        assert_eq!(e.rto(), ms(3000));
        e.on_sample(ms(10));
        assert_eq!(e.backoff(), 0);
        assert_eq!(e.rto(), ms(200));
    }
}
