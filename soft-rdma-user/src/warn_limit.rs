//! Repeated warnings, aggregated: a peer or a client that can make soft-rdmad log a warning must not be able
//! to flood its log (one 1 GiB Read whose source was deregistered used to write a line per segment).
//!
//! This module owns the one mechanism every such call site uses: `warn_limited!`, a drop-in for
//! `tracing::warn!` with a [`RepeatLimit`] of its own (a `static` per call site). Within an *episode* (a
//! run of occurrences at that site with no pause of [`QUIET`] or more between two of them) the first
//! [`BURST`] occurrences are logged, then only the occurrences whose number is a power of two, each carrying
//! `repeated = n` (how many happened in the episode so far). N occurrences thus cost at most
//! `BURST + log2(N)` lines: 740,864 cost 5 + 17. The first occurrence after a quiet spell starts a new
//! episode and is logged again.
//!
//! The clock is read only to tell episodes apart; what is logged never changes what the engine does, so the
//! sans-IO core stays deterministic.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Occurrences logged in full at the start of an episode.
pub const BURST: u64 = 5;

/// A pause at least this long between two occurrences ends an episode.
pub const QUIET: Duration = Duration::from_secs(10);

/// The state of one call site: see the module documentation.
#[derive(Debug)]
pub struct RepeatLimit {
    state: Mutex<Episode>,
}

#[derive(Debug)]
struct Episode {
    /// Occurrences in the current episode.
    count: u64,
    last: Option<Instant>,
}

impl Default for RepeatLimit {
    fn default() -> Self {
        Self::new()
    }
}

impl RepeatLimit {
    pub const fn new() -> Self {
        RepeatLimit {
            state: Mutex::new(Episode { count: 0, last: None }),
        }
    }

    /// One occurrence now: `Some(n)` if it is to be logged (the `n`th of its episode), `None` if not.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    /// [`RepeatLimit::admit`] at `now` (tests pass their own clock).
    pub fn admit_at(&self, now: Instant) -> Option<u64> {
        // A panic while the lock was held cannot leave the counters inconsistent: take them as they are.
        let mut e = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let quiet = e
            .last
            .is_none_or(|last| now.saturating_duration_since(last) >= QUIET);
        e.count = if quiet { 1 } else { e.count.saturating_add(1) };
        e.last = Some(now);
        let n = e.count;
        (n <= BURST || n.is_power_of_two()).then_some(n)
    }
}

/// `tracing::warn!` for a warning that a peer or a client can trigger: logged as [`RepeatLimit`] allows, with
/// `repeated = n` added (the occurrence's number in its episode). Same arguments as `warn!` (fields, then the
/// message).
///
/// Not exported: only this crate logs through it. Call sites name it `crate::warn_limited` (lib.rs imports
/// it at the crate root).
macro_rules! warn_limited {
    ($($arg:tt)+) => {{
        static LIMIT: $crate::warn_limit::RepeatLimit = $crate::warn_limit::RepeatLimit::new();
        if let Some(repeated) = LIMIT.admit() {
            ::tracing::warn!(repeated, $($arg)+);
        }
    }};
}
pub(crate) use warn_limited;

#[cfg(test)]
mod tests {
    use super::*;

    /// Which of `n` back-to-back occurrences are logged.
    fn logged(limit: &RepeatLimit, start: Instant, n: u64) -> Vec<u64> {
        (0..n)
            .filter_map(|i| limit.admit_at(start + Duration::from_millis(i)))
            .collect()
    }

    #[test]
    fn a_burst_then_powers_of_two() {
        let limit = RepeatLimit::new();
        let t = Instant::now();
        assert_eq!(logged(&limit, t, 300), [1, 2, 3, 4, 5, 8, 16, 32, 64, 128, 256]);
    }

    #[test]
    fn a_flood_costs_a_logarithmic_number_of_lines() {
        let limit = RepeatLimit::new();
        let t = Instant::now();
        // The Read of issue 22: one warning per segment of a 1 GiB Read.
        let lines = (0..740_864u64)
            .filter(|i| limit.admit_at(t + Duration::from_micros(*i)).is_some())
            .count();
        assert_eq!(lines, 5 + 17, "1..=5 and 8, 16, ..., 2^19");
    }

    #[test]
    fn a_quiet_spell_starts_a_new_episode() {
        let limit = RepeatLimit::new();
        let t = Instant::now();
        assert_eq!(logged(&limit, t, 7).len(), 5);
        // Just short of QUIET after the last one: the same episode (the 8th is a power of two).
        let last = t + Duration::from_millis(6);
        assert_eq!(limit.admit_at(last + QUIET - Duration::from_millis(1)), Some(8));
        assert_eq!(limit.admit_at(last + QUIET), None, "9th, only 1 ms after the 8th");
        // QUIET after the last occurrence: logged again, as the first of a new episode.
        assert_eq!(limit.admit_at(last + QUIET * 3), Some(1));
    }
}
