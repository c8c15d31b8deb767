//! RACK loss detection (RFC 8985 §6): time-based, per transmission. What it owns: the record of every
//! segment in flight with its latest transmission time (RFC 8985 §6.1 `Segment.xmit_ts`,
//! `.retransmitted`, `.lost`), the connection's RACK state (`RACK.xmit_ts`, `.end_seq`, `.rtt`, `.fack`,
//! `.reordering_seen`), and the loss rule: a segment is lost once a segment sent after it was delivered
//! and it is itself older than that delivery's RTT plus the reordering window (§6.2 step 5). When a
//! candidate is not old enough yet, [`Rack::detect_loss`] says when it will be: the RACK reordering timer
//! (§6.3), so a hole is repaired without waiting for more ACKs or for the RTO. Retransmissions are
//! timed like originals, so a lost retransmission is found the same way (§6.2: "RACK ... detects lost
//! retransmissions").
//!
//! How the connection uses it: entries above the recovery sweep point (`Recovery::rtx_next`) that RACK
//! finds lost widen the lost region of `recovery.rs`; entries below it (already resent in this episode)
//! keep their `lost` flag here until resent again ([`Rack::first_lost_below`]).
//!
//! Bounded: at most [`MAX_SEGMENTS`] entries; past that an original transmission is merged into the
//! newest entry (taking its later time: detection of those bytes can only come later, never early).

use std::collections::VecDeque;
use std::time::Duration;

use super::Instant;
use super::seq::Seq;

/// Entries kept at most (XDP mode's 4 MiB window of 1,400-byte segments is about 3,000).
pub const MAX_SEGMENTS: usize = 4096;

/// Capacity kept when the record empties; a larger one is given back (idle connections stay small).
const IDLE_CAPACITY: usize = 16;

/// One transmitted range of sequence space (RFC 8985 §6.1 per-segment variables).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sent {
    start: Seq,
    end: Seq,
    /// Segment.xmit_ts: its latest transmission.
    xmit_ts: Instant,
    /// Segment.retransmitted.
    retransmitted: bool,
    /// Covered by a SACK block.
    sacked: bool,
    /// Segment.lost: found lost and not resent since.
    lost: bool,
}

/// RFC 8985 §6.2 `RACK_sent_after`: was (t1, seq1) sent after (t2, seq2)?
fn sent_after(t1: Instant, seq1: Seq, t2: Instant, seq2: Seq) -> bool {
    t1 > t2 || (t1 == t2 && seq1 > seq2)
}

/// The outcome of one run of the loss rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Detected {
    /// The end of the highest entry at or above the sweep point lost (newly or still: a loss found while
    /// the recovery could not act on it is reported until it is resent).
    pub lost_above_sweep: Option<Seq>,
    /// Entries below the sweep point (resent already) lost and not resent since.
    pub lost_below_sweep: bool,
    /// When the youngest candidate not yet old enough will be (the RACK timer, §6.3).
    pub timer: Option<Instant>,
}

/// See the module doc.
#[derive(Debug)]
pub struct Rack {
    segs: VecDeque<Sent>,
    /// RACK.xmit_ts and RACK.end_seq: the most recently sent segment delivered so far (if `has_xmit`).
    xmit_ts: Instant,
    end_seq: Seq,
    has_xmit: bool,
    /// RACK.rtt, in microseconds: the RTT of that delivery.
    rtt_us: u32,
    /// The RTT of the most recently sent segment the last ACK delivered (unambiguous ones only), in µs.
    ack_rtt_us: Option<u32>,
    /// RACK.fack: the highest end of a delivered segment.
    fack: Seq,
    /// RACK.reordering_seen (§6.2 step 3).
    reordering_seen: bool,
    /// RACK.reo_wnd_mult, RACK.reo_wnd_persist and RACK.dsack_round (§6.2 step 4).
    reo_wnd_mult: u8,
    reo_wnd_persist: u8,
    dsack_round: Option<Seq>,
}

/// RFC 8985 §6.2 step 4: the multiplier is kept for this many recoveries after the last D-SACK.
const REO_WND_PERSIST: u8 = 16;
/// The largest multiplier (the window is capped at SRTT anyway: 4·min_RTT is past it on most paths).
const MAX_REO_WND_MULT: u8 = 16;

impl Rack {
    pub fn new(una: Seq) -> Self {
        Rack {
            segs: VecDeque::new(),
            xmit_ts: Instant::ZERO,
            end_seq: una,
            has_xmit: false,
            rtt_us: 0,
            ack_rtt_us: None,
            fack: una,
            reordering_seen: false,
            reo_wnd_mult: 1,
            reo_wnd_persist: 0,
            dsack_round: None,
        }
    }

    /// The RTT the last ACK measured, at the clock's resolution (µs, where a timestamp echo has 1 ms): the
    /// send time of the most recently sent segment it delivered (never an ambiguous retransmission), as
    /// the delivery-rate model wants it (draft-ietf-ccwg-bbr §4.5.1: rs.rtt).
    pub fn ack_rtt(&self) -> Option<Duration> {
        self.ack_rtt_us.map(|us| Duration::from_micros(u64::from(us)))
    }

    /// RACK.reo_wnd_mult: the reordering window in quarters of the minimum RTT.
    pub fn reo_wnd_mult(&self) -> u32 {
        u32::from(self.reo_wnd_mult)
    }

    /// RFC 8985 §6.2 step 4 on each ACK: a D-SACK (RFC 2883: a retransmission was not needed) widens the
    /// window once per round trip, and keeps it for 16 recoveries. `una`, `nxt`: SND.UNA and SND.NXT.
    pub fn on_ack_round(&mut self, dsack: bool, una: Seq, nxt: Seq) {
        if self.dsack_round.is_some_and(|r| una >= r) {
            self.dsack_round = None;
        }
        if dsack && self.dsack_round.is_none() {
            self.spurious(nxt);
        }
    }

    /// A retransmission proved spurious (D-SACK, or Eifel detection, RFC 3522, which this TCP treats the
    /// same way): widen the window, at most once per round trip ending at `nxt`.
    pub fn spurious(&mut self, nxt: Seq) {
        self.reo_wnd_mult = (self.reo_wnd_mult + 1).min(MAX_REO_WND_MULT);
        self.reo_wnd_persist = REO_WND_PERSIST;
        self.dsack_round = Some(nxt);
    }

    /// A loss recovery ended (§6.2 step 4): after 16 without D-SACK the window is back to min_RTT/4.
    pub fn on_recovery_exit(&mut self) {
        if self.reo_wnd_persist > 0 {
            self.reo_wnd_persist -= 1;
            if self.reo_wnd_persist == 0 {
                self.reo_wnd_mult = 1;
            }
        }
    }

    pub fn reordering_seen(&self) -> bool {
        self.reordering_seen
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.segs.len()
    }

    /// [start, end) left at `now` (RFC 8985 §6.1: Segment.xmit_ts = now; a retransmission also sets
    /// Segment.retransmitted and clears Segment.lost).
    pub fn on_transmit(&mut self, start: Seq, end: Seq, now: Instant) {
        if end <= start {
            return;
        }
        let last_end = self.segs.back().map(|s| s.end);
        if last_end.is_none_or(|e| start >= e) {
            let new = Sent {
                start,
                end,
                xmit_ts: now,
                retransmitted: false,
                sacked: false,
                lost: false,
            };
            let full = self.segs.len() >= MAX_SEGMENTS;
            match self.segs.back_mut() {
                Some(last) if full => {
                    last.end = end;
                    last.xmit_ts = now;
                }
                _ => self.segs.push_back(new),
            }
            return;
        }
        // A retransmission: split the entries at its edges, then stamp those inside.
        self.split_at(start);
        self.split_at(end);
        let from = self.segs.partition_point(|s| s.end <= start);
        for s in self.segs.range_mut(from..) {
            if s.start >= end {
                break;
            }
            s.xmit_ts = now;
            s.retransmitted = true;
            s.lost = false;
        }
    }

    /// Split the entry containing `at` (strictly inside it) in two; not past the bound.
    fn split_at(&mut self, at: Seq) {
        if self.segs.len() >= MAX_SEGMENTS {
            return;
        }
        let i = self.segs.partition_point(|s| s.end <= at);
        if let Some(&s) = self.segs.get(i)
            && s.start < at
            && at < s.end
        {
            self.segs[i].end = at;
            self.segs.insert(i + 1, Sent { start: at, ..s });
        }
    }

    /// An ACK arrived: entries below `una` are acknowledged, entries inside `blocks` SACKed (validated
    /// blocks, RFC 2018 §3). Each newly delivered one updates RACK (RFC 8985 §6.2 steps 2 and 3).
    /// `echoed`: when the segment whose timestamp the ACK echoes was sent (RFC 7323; millisecond ticks, so
    /// compared in whole milliseconds), if known;
    /// `min_rtt`: RACK.min_RTT (step 1). Returns whether anything was newly delivered.
    pub fn on_ack(
        &mut self,
        now: Instant,
        una: Seq,
        blocks: &[(Seq, Seq)],
        echoed: Option<Instant>,
        min_rtt: Option<Duration>,
    ) -> bool {
        let mut delivered = false;
        self.ack_rtt_us = None;
        while let Some(&s) = self.segs.front() {
            if s.end > una {
                break;
            }
            self.segs.pop_front();
            if !s.sacked {
                self.delivered(s, now, echoed, min_rtt);
                delivered = true;
            }
        }
        if let Some(front) = self.segs.front_mut()
            && front.start < una
        {
            front.start = una;
        }
        for &(left, right) in blocks {
            let from = self.segs.partition_point(|s| s.end <= left);
            for i in from..self.segs.len() {
                let s = self.segs[i];
                if s.start >= right {
                    break;
                }
                if s.sacked || s.start < left || s.end > right {
                    continue;
                }
                self.segs[i].sacked = true;
                self.delivered(s, now, echoed, min_rtt);
                delivered = true;
            }
        }
        if self.segs.is_empty() && self.segs.capacity() > IDLE_CAPACITY {
            self.segs.shrink_to(IDLE_CAPACITY);
        }
        delivered
    }

    /// RFC 8985 §6.2 step 2 (RACK_update) and step 3 (RACK_detect_reordering) for one delivered segment.
    fn delivered(&mut self, s: Sent, now: Instant, echoed: Option<Instant>, min_rtt: Option<Duration>) {
        let rtt = now.since(s.xmit_ts);
        // Step 2: a retransmitted segment whose ACK may be for the original is ambiguous: skipped when the
        // echoed timestamp predates the retransmission, or the RTT is below the minimum.
        let ambiguous = s.retransmitted
            && (echoed.is_some_and(|e| e.micros() / 1000 < s.xmit_ts.micros() / 1000)
                || min_rtt.is_some_and(|m| rtt < m));
        if !ambiguous {
            self.rtt_us = rtt.as_micros().min(u128::from(u32::MAX)) as u32;
            self.ack_rtt_us = Some(self.ack_rtt_us.map_or(self.rtt_us, |r| r.min(self.rtt_us)));
            if !self.has_xmit || sent_after(s.xmit_ts, s.end, self.xmit_ts, self.end_seq) {
                self.xmit_ts = s.xmit_ts;
                self.end_seq = s.end;
                self.has_xmit = true;
            }
        }
        // Step 3: delivered below the highest delivered end, never retransmitted: the network reordered.
        if s.end > self.fack {
            self.fack = s.end;
        } else if s.end < self.fack && !s.retransmitted {
            self.reordering_seen = true;
        }
    }

    /// RFC 8985 §6.2 step 5 (RACK_detect_loss) with the reordering window `reo_wnd` (step 4, the
    /// connection's): every entry neither delivered nor already lost, sent before RACK.xmit_ts/end_seq,
    /// is lost if it left at least RACK.rtt + reo_wnd ago; the youngest other such entry sets the timer.
    /// `sweep`: the recovery sweep point (see the module doc). Entries already lost and not resent are
    /// reported again.
    pub fn detect_loss(&mut self, now: Instant, reo_wnd: Duration, sweep: Seq) -> Detected {
        let mut out = Detected::default();
        if !self.has_xmit {
            return out;
        }
        let (rack_ts, rack_end) = (self.xmit_ts, self.end_seq);
        let wait = Duration::from_micros(u64::from(self.rtt_us)) + reo_wnd;
        for s in self.segs.iter_mut() {
            if s.sacked || !(s.lost || sent_after(rack_ts, rack_end, s.xmit_ts, s.end)) {
                continue;
            }
            let due = s.xmit_ts + wait;
            if s.lost || due <= now {
                s.lost = true;
                if s.start >= sweep {
                    out.lost_above_sweep = Some(out.lost_above_sweep.map_or(s.end, |e| e.max(s.end)));
                } else {
                    out.lost_below_sweep = true;
                }
            } else {
                out.timer = Some(out.timer.map_or(due, |t| t.max(due)));
            }
        }
        out
    }

    /// The first entry below `limit` found lost and not resent since: (start, end).
    pub fn first_lost_below(&self, limit: Seq) -> Option<(Seq, Seq)> {
        self.segs
            .iter()
            .take_while(|s| s.start < limit)
            .find(|s| s.lost && !s.sacked)
            .map(|s| (s.start, s.end.min(limit)))
    }

    /// Bytes below `limit` found lost and not resent since (out of `pipe`, RFC 6675 §4).
    pub fn lost_bytes_below(&self, limit: Seq) -> u32 {
        self.segs
            .iter()
            .take_while(|s| s.start < limit)
            .filter(|s| s.lost && !s.sacked)
            .map(|s| s.end.min(limit).bytes_since(s.start))
            .sum()
    }

    /// A receiver may renege on its SACKs (RFC 2018 §8): forget them, as the scoreboard does.
    pub fn forget_sacks(&mut self) {
        for s in self.segs.iter_mut() {
            s.sacked = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Instant {
        Instant::from_millis(n)
    }

    fn d(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Four 100-byte segments sent at 0, 1, 2, 3 ms.
    fn four() -> Rack {
        let mut r = Rack::new(Seq(0));
        for i in 0..4u32 {
            r.on_transmit(Seq(i * 100), Seq(i * 100 + 100), ms(u64::from(i)));
        }
        r
    }

    #[test]
    fn a_segment_sent_before_a_delivered_one_is_lost_after_rtt_plus_reo_wnd() {
        let mut r = four();
        // RFC 8985 §6.2: segment 3 (sent at 3 ms) SACKed at 23 ms: RACK.rtt = 20 ms.
        assert!(r.on_ack(ms(23), Seq(0), &[(Seq(300), Seq(400))], None, Some(d(20))));
        // Segments 0..2 were sent before it; with a 5 ms window the oldest (0 ms) is due at 25 ms.
        let det = r.detect_loss(ms(23), d(5), Seq(0));
        assert_eq!(det.lost_above_sweep, None);
        // §6.3: the timer is set for the youngest candidate (sent at 2 ms): 2 + 20 + 5.
        assert_eq!(det.timer, Some(ms(27)));
        // When it fires, all three are lost.
        let det = r.detect_loss(ms(27), d(5), Seq(0));
        assert_eq!(det.lost_above_sweep, Some(Seq(300)));
        assert_eq!(det.timer, None);
        // Still lost (not resent): reported again, so the recovery cannot miss it.
        assert_eq!(
            r.detect_loss(ms(40), d(5), Seq(0)).lost_above_sweep,
            Some(Seq(300))
        );
        // Resent, they are candidates again, from their new transmission time.
        r.on_transmit(Seq(0), Seq(300), ms(41));
        assert_eq!(r.detect_loss(ms(42), d(5), Seq(300)), Detected::default());
    }

    #[test]
    fn nothing_is_lost_before_anything_sent_later_was_delivered() {
        let mut r = four();
        assert_eq!(r.detect_loss(ms(1000), d(0), Seq(0)), Detected::default());
        // Only the first segment delivered: nothing was sent before it.
        r.on_ack(ms(20), Seq(100), &[], None, None);
        assert_eq!(r.detect_loss(ms(1000), d(0), Seq(0)), Detected::default());
    }

    #[test]
    fn a_lost_retransmission_is_found_by_its_own_transmission_time() {
        let mut r = four();
        r.on_ack(ms(23), Seq(0), &[(Seq(100), Seq(400))], None, Some(d(20)));
        assert_eq!(
            r.detect_loss(ms(30), d(0), Seq(0)).lost_above_sweep,
            Some(Seq(100))
        );
        assert_eq!(r.first_lost_below(Seq(100)), Some((Seq(0), Seq(100))));
        assert_eq!(r.lost_bytes_below(Seq(100)), 100);
        // Resent at 30 ms (the sweep moves past it): no longer lost.
        r.on_transmit(Seq(0), Seq(100), ms(30));
        assert_eq!(r.first_lost_below(Seq(100)), None);
        // New data sent at 31 ms is SACKed at 51 ms: the retransmission (30 ms) was sent before it and is
        // older than 20 ms + 0 at 50 ms: lost again, below the sweep point.
        r.on_transmit(Seq(400), Seq(500), ms(31));
        r.on_ack(ms(51), Seq(0), &[(Seq(400), Seq(500))], None, Some(d(20)));
        let det = r.detect_loss(ms(51), d(0), Seq(100));
        assert!(det.lost_below_sweep);
        assert_eq!(r.first_lost_below(Seq(100)), Some((Seq(0), Seq(100))));
    }

    #[test]
    fn an_ambiguous_retransmission_does_not_move_rack() {
        let mut r = four();
        r.on_transmit(Seq(0), Seq(100), ms(10));
        // Acknowledged 12 ms after the retransmission with a 20 ms minimum RTT: the original's ACK.
        r.on_ack(ms(22), Seq(100), &[], None, Some(d(20)));
        assert!(!r.has_xmit);
        // The echoed timestamp predates the retransmission: also ambiguous.
        let mut r = four();
        r.on_transmit(Seq(0), Seq(100), ms(10));
        r.on_ack(ms(40), Seq(100), &[], Some(ms(0)), Some(d(20)));
        assert!(!r.has_xmit);
        r.on_transmit(Seq(100), Seq(200), ms(41));
        r.on_ack(ms(70), Seq(200), &[], Some(ms(41)), Some(d(20)));
        assert_eq!((r.has_xmit, r.xmit_ts, r.rtt_us), (true, ms(41), 29_000));
        assert_eq!(r.ack_rtt(), Some(d(29)));
    }

    #[test]
    fn dsack_widens_the_window_once_per_round_trip_for_sixteen_recoveries() {
        let mut r = four();
        assert_eq!(r.reo_wnd_mult(), 1);
        r.on_ack_round(true, Seq(0), Seq(400));
        // A second D-SACK in the same round trip: no change.
        r.on_ack_round(true, Seq(100), Seq(400));
        assert_eq!(r.reo_wnd_mult(), 2);
        // The round trip is over once SND.UNA passes where it ended.
        r.on_ack_round(true, Seq(400), Seq(800));
        assert_eq!(r.reo_wnd_mult(), 3);
        for _ in 0..15 {
            r.on_recovery_exit();
        }
        assert_eq!(r.reo_wnd_mult(), 3);
        r.on_recovery_exit();
        assert_eq!(r.reo_wnd_mult(), 1);
    }

    #[test]
    fn delivery_below_the_highest_delivered_end_is_reordering() {
        let mut r = four();
        r.on_ack(ms(20), Seq(0), &[(Seq(200), Seq(300))], None, None);
        assert!(!r.reordering_seen());
        r.on_ack(ms(21), Seq(200), &[], None, None);
        assert!(r.reordering_seen());
    }

    #[test]
    fn retransmissions_split_entries_and_the_record_is_bounded() {
        let mut r = four();
        r.on_transmit(Seq(150), Seq(250), ms(9));
        assert_eq!(r.len(), 6);
        let stamped: Vec<_> = r
            .segs
            .iter()
            .filter(|s| s.retransmitted)
            .map(|s| (s.start.0, s.end.0))
            .collect();
        assert_eq!(stamped, vec![(150, 200), (200, 250)]);
        let mut r = Rack::new(Seq(0));
        for i in 0..(MAX_SEGMENTS as u32 + 10) {
            r.on_transmit(Seq(i), Seq(i + 1), ms(u64::from(i)));
        }
        assert_eq!(r.len(), MAX_SEGMENTS);
        assert_eq!(r.segs.back().unwrap().end, Seq(MAX_SEGMENTS as u32 + 10));
        r.on_ack(ms(99_999), Seq(MAX_SEGMENTS as u32 + 10), &[], None, None);
        assert_eq!(r.len(), 0);
        assert!(r.segs.capacity() < MAX_SEGMENTS);
    }
}
