//! Loss recovery on the sending side: the SACK scoreboard (RFC 6675 §3, fed by RFC 2018 blocks), the
//! loss estimate `IsLost` (RFC 6675 §4) with the early-retransmit threshold of RFC 5827 for short flights,
//! the fast-recovery episode with its NewReno recovery point (RFC 6582 §3.2) and the `pipe` estimate
//! (RFC 6675 §4) that paces (re)transmission during it, and the go-back after a timeout
//! (RFC 5681 §3.1, RFC 6675 §5.1). The window arithmetic is in `congestion.rs`; timers in `connection.rs`.

use super::seq::Seq;

/// Capacity kept when the scoreboard empties; a larger one is given back.
const IDLE_RANGES: usize = 16;

/// Sorted, disjoint SACKed ranges above SND.UNA. Bounded: past `max` ranges the highest ones are forgotten
/// (only costs a needless retransmission).
#[derive(Debug)]
pub struct Scoreboard {
    ranges: Vec<(Seq, Seq)>,
    max: usize,
    sacked: u32,
}

impl Scoreboard {
    pub fn new(max: usize) -> Self {
        Scoreboard {
            ranges: Vec::new(),
            max: max.max(1),
            sacked: 0,
        }
    }

    pub fn clear(&mut self) {
        self.ranges.clear();
        self.sacked = 0;
    }

    /// Bytes SACKed above SND.UNA.
    pub fn sacked_bytes(&self) -> u32 {
        self.sacked
    }

    /// The end of the highest SACKed range (RFC 6675 §2's HighSACK, exclusive).
    pub fn high_sacked(&self) -> Option<Seq> {
        self.ranges.last().map(|r| r.1)
    }

    /// Cumulative ACK: forget everything below `una`.
    pub fn on_cumulative_ack(&mut self, una: Seq) {
        self.ranges.retain_mut(|r| {
            if r.1 <= una {
                return false;
            }
            r.0 = r.0.max(una);
            true
        });
        if self.ranges.is_empty() && self.ranges.capacity() > IDLE_RANGES {
            self.ranges.shrink_to(IDLE_RANGES);
        }
        self.recount();
    }

    /// Record SACK blocks (RFC 2018 §3). Blocks outside (SND.UNA, SND.NXT] or empty are ignored (RFC 2018
    /// §3 makes them meaningless; RFC 6675 §5 uses only valid ones). Returns the bytes newly SACKed.
    pub fn on_sack_blocks(&mut self, una: Seq, nxt: Seq, blocks: &[(Seq, Seq)]) -> u32 {
        let before = self.sacked;
        for &(left, right) in blocks {
            if !(una <= left && left < right && right <= nxt) {
                continue;
            }
            // The ranges are sorted and disjoint, so their ends ascend too: merge the run that touches
            // [left, right) in place (a lossy, reordering path keeps hundreds of ranges).
            let first = self.ranges.partition_point(|r| r.1 < left);
            let (mut lo, mut hi) = (left, right);
            let mut last = first;
            while let Some(&(l, r)) = self.ranges.get(last)
                && l <= hi
            {
                lo = lo.min(l);
                hi = hi.max(r);
                last += 1;
            }
            self.ranges.splice(first..last, [(lo, hi)]);
            self.ranges.truncate(self.max);
        }
        self.recount();
        self.sacked.saturating_sub(before)
    }

    fn recount(&mut self) {
        self.sacked = self.ranges.iter().map(|r| r.1.bytes_since(r.0)).sum();
    }

    /// SACKed bytes within [lo, hi).
    pub fn sacked_between(&self, lo: Seq, hi: Seq) -> u32 {
        self.ranges
            .iter()
            .map(|r| hi.min(r.1).bytes_since(lo.max(r.0)))
            .sum()
    }

    /// The first un-SACKed run at or after `from`, below `limit`: (start, end).
    pub fn next_hole(&self, from: Seq, limit: Seq) -> Option<(Seq, Seq)> {
        let mut at = from;
        for r in &self.ranges {
            if r.1 <= at {
                continue;
            }
            if r.0 <= at {
                at = r.1;
                continue;
            }
            let end = r.0.min(limit);
            return (at < end).then_some((at, end));
        }
        (at < limit).then_some((at, limit))
    }

    /// RFC 6675 §4 `IsLost`, as a boundary: un-SACKed bytes below the returned sequence number are lost,
    /// because more than (DupThresh − 1)·SMSS bytes above them are SACKed. `None` when nothing is lost.
    pub fn lost_below(&self, dup_thresh: u32, mss: u32) -> Option<Seq> {
        let needed = dup_thresh.saturating_sub(1).saturating_mul(mss);
        let mut above = 0u32;
        for r in self.ranges.iter().rev() {
            above = above.saturating_add(r.1.bytes_since(r.0));
            if above > needed {
                return Some(r.0);
            }
        }
        None
    }
}

/// Where the sender stands in loss recovery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// No loss being repaired.
    Open,
    /// Fast recovery (RFC 6675 §5 / RFC 6582 §3.2) until SND.UNA reaches `recover`.
    Fast { recover: Seq },
    /// After a retransmission timeout: everything un-SACKed below `recover` is resent in slow start
    /// (RFC 5681 §3.1, RFC 6675 §5.1).
    Loss { recover: Seq },
}

/// Recovery state: the scoreboard, duplicate-ACK count, and which presumed-lost bytes are still to resend.
#[derive(Debug)]
pub struct Recovery {
    pub scoreboard: Scoreboard,
    pub phase: Phase,
    /// Duplicate ACKs since the last new cumulative ACK (RFC 5681 §2, without the window condition: a
    /// window update does not hide a duplicate).
    pub dup_acks: u32,
    /// Un-SACKed bytes below this are presumed lost.
    pub lost_limit: Seq,
    /// Presumed-lost bytes below this were already retransmitted in this episode.
    pub rtx_next: Seq,
    /// The first retransmission of a fast-recovery episode goes out whatever `pipe` says (RFC 6675 §5
    /// step 4.3, RFC 5681 §3.2 step 2).
    pub rtx_forced: bool,
}

impl Recovery {
    pub fn new(max_ranges: usize, una: Seq) -> Self {
        Recovery {
            scoreboard: Scoreboard::new(max_ranges),
            phase: Phase::Open,
            dup_acks: 0,
            lost_limit: una,
            rtx_next: una,
            rtx_forced: false,
        }
    }

    pub fn in_recovery(&self) -> bool {
        self.phase != Phase::Open
    }

    /// DupThresh: `reordering` (RFC 5681 §3.2's 3, raised after reordering was seen: RFC 4653 §3 and
    /// RFC 6675 §4 allow a larger DupThresh), lowered by early retransmit (RFC 5827 §3.1/§3.2) to one
    /// less than the outstanding segments when fewer than four are outstanding and no new data can be sent.
    pub fn dup_threshold(outstanding_segments: u32, can_send_new: bool, reordering: u32) -> u32 {
        if !can_send_new && outstanding_segments < 4 {
            outstanding_segments.saturating_sub(1).clamp(1, reordering)
        } else {
            reordering
        }
    }

    /// Enter fast recovery (RFC 6675 §5 step 4, RFC 6582 §3.2 step 2): the recovery point is SND.NXT, the
    /// first un-SACKed segment is presumed lost and resent at once.
    pub fn enter_fast(&mut self, una: Seq, nxt: Seq, mss: u32) {
        self.phase = Phase::Fast { recover: nxt };
        self.rtx_next = una;
        self.lost_limit = self.lost_limit.max(una + mss).min(nxt);
        self.rtx_forced = true;
    }

    /// Retransmission timeout: all un-SACKed data below SND.NXT is presumed lost (RFC 6675 §5.1).
    pub fn enter_loss(&mut self, una: Seq, nxt: Seq) {
        self.phase = Phase::Loss { recover: nxt };
        self.rtx_next = una;
        self.lost_limit = nxt;
        self.dup_acks = 0;
        self.rtx_forced = false;
    }

    /// SACK information changed: widen the lost region by RFC 6675 §4 `IsLost`.
    pub fn update_lost(&mut self, dup_thresh: u32, mss: u32) {
        if let Some(limit) = self.scoreboard.lost_below(dup_thresh, mss) {
            self.lost_limit = self.lost_limit.max(limit);
        }
    }

    /// `pipe` (RFC 6675 §4): bytes still in the network. Outstanding bytes, less SACKed ones, less those
    /// presumed lost and not yet resent. Without SACK, each duplicate ACK in recovery stands for one
    /// segment that left the network (RFC 5681 §3.2 step 4's inflation, expressed as a smaller pipe).
    pub fn pipe(&self, una: Seq, nxt: Seq, mss: u32, sack: bool) -> u32 {
        let outstanding = nxt.bytes_since(una);
        let mut pipe = outstanding.saturating_sub(self.scoreboard.sacked_bytes());
        if self.in_recovery() {
            let lo = self.rtx_next.max(una);
            let hi = self.lost_limit.min(nxt);
            let lost_unsent = hi
                .bytes_since(lo)
                .saturating_sub(self.scoreboard.sacked_between(lo, hi));
            pipe = pipe.saturating_sub(lost_unsent);
            if !sack {
                pipe = pipe.saturating_sub(self.dup_acks.saturating_mul(mss));
            }
        }
        pipe
    }

    /// The next presumed-lost run to resend, (start, end), if any.
    pub fn next_retransmission(&self, una: Seq, nxt: Seq) -> Option<(Seq, Seq)> {
        if !self.in_recovery() {
            return None;
        }
        let from = self.rtx_next.max(una);
        self.scoreboard.next_hole(from, self.lost_limit.min(nxt))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MSS: u32 = 100;

    fn s(n: u32) -> Seq {
        Seq(n)
    }

    #[test]
    fn scoreboard_merges_ignores_invalid_and_trims_on_ack() {
        let mut sb = Scoreboard::new(8);
        assert_eq!(sb.on_sack_blocks(s(0), s(1000), &[(s(200), s(300))]), 100);
        assert_eq!(
            sb.on_sack_blocks(s(0), s(1000), &[(s(300), s(400)), (s(250), s(260))]),
            100
        );
        // Outside (SND.UNA, SND.NXT] or empty: ignored.
        assert_eq!(
            sb.on_sack_blocks(s(0), s(1000), &[(s(900), s(1100)), (s(50), s(50))]),
            0
        );
        assert_eq!(sb.sacked_bytes(), 200);
        assert_eq!(sb.high_sacked(), Some(s(400)));
        sb.on_cumulative_ack(s(250));
        assert_eq!(sb.sacked_bytes(), 150);
        sb.on_cumulative_ack(s(400));
        assert_eq!(sb.high_sacked(), None);
    }

    #[test]
    fn holes_are_found_between_sacked_ranges() {
        let mut sb = Scoreboard::new(8);
        sb.on_sack_blocks(s(0), s(1000), &[(s(100), s(200)), (s(300), s(400))]);
        assert_eq!(sb.next_hole(s(0), s(1000)), Some((s(0), s(100))));
        assert_eq!(sb.next_hole(s(100), s(1000)), Some((s(200), s(300))));
        assert_eq!(sb.next_hole(s(250), s(1000)), Some((s(250), s(300))));
        assert_eq!(sb.next_hole(s(300), s(1000)), Some((s(400), s(1000))));
        assert_eq!(sb.next_hole(s(300), s(400)), None);
        assert_eq!(sb.sacked_between(s(150), s(350)), 100);
    }

    #[test]
    fn is_lost_needs_more_than_dupthresh_minus_one_segments_sacked_above() {
        let mut sb = Scoreboard::new(8);
        sb.on_sack_blocks(s(0), s(1000), &[(s(100), s(300))]);
        assert_eq!(sb.lost_below(3, MSS), None);
        sb.on_sack_blocks(s(0), s(1000), &[(s(400), s(410))]);
        assert_eq!(sb.lost_below(3, MSS), Some(s(100)));
        assert_eq!(sb.lost_below(1, MSS), Some(s(400)));
    }

    #[test]
    fn early_retransmit_lowers_the_threshold_for_short_flights() {
        assert_eq!(Recovery::dup_threshold(10, false, 3), 3);
        assert_eq!(Recovery::dup_threshold(3, true, 3), 3);
        assert_eq!(Recovery::dup_threshold(3, false, 3), 2);
        assert_eq!(Recovery::dup_threshold(2, false, 3), 1);
        assert_eq!(Recovery::dup_threshold(1, false, 3), 1);
        assert_eq!(Recovery::dup_threshold(10, true, 9), 9);
    }

    #[test]
    fn pipe_counts_what_is_still_in_the_network() {
        let mut r = Recovery::new(8, s(0));
        r.scoreboard.on_sack_blocks(s(0), s(1000), &[(s(100), s(500))]);
        assert_eq!(r.pipe(s(0), s(1000), MSS, true), 600);
        r.enter_fast(s(0), s(1000), MSS);
        // 0..100 presumed lost, not yet resent.
        assert_eq!(r.pipe(s(0), s(1000), MSS, true), 500);
        assert_eq!(r.next_retransmission(s(0), s(1000)), Some((s(0), s(100))));
        r.rtx_next = s(100);
        assert_eq!(r.pipe(s(0), s(1000), MSS, true), 600);
        assert_eq!(r.next_retransmission(s(0), s(1000)), None);
    }

    #[test]
    fn timeout_presumes_everything_unsacked_lost() {
        let mut r = Recovery::new(8, s(0));
        r.scoreboard.on_sack_blocks(s(0), s(1000), &[(s(100), s(500))]);
        r.enter_loss(s(0), s(1000));
        assert_eq!(r.pipe(s(0), s(1000), MSS, true), 0);
        assert_eq!(r.next_retransmission(s(0), s(1000)), Some((s(0), s(100))));
        r.rtx_next = s(100);
        assert_eq!(r.next_retransmission(s(0), s(1000)), Some((s(500), s(1000))));
    }
}
