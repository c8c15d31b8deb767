//! Segment arrival (RFC 9293 §3.10.7): SYN-SENT processing, then the checks of §3.10.7.4 in order —
//! PAWS (RFC 7323 §5), sequence acceptability, RST (RFC 5961 §3), SYN (RFC 5961 §4), ACK (with RFC 5961
//! §5's acceptable range, duplicate-ACK counting, SACK and loss detection: RFC 6675 `IsLost` and RACK,
//! RFC 8985 §6.2, with its reordering timer §6.3), text, FIN.

use super::super::bbr::AckSample;
use super::super::rack::Rack;
use super::super::recovery::{Phase, Recovery};
use super::super::seq::Seq;
use super::super::wire::{TcpFlags, TcpHeader};
use super::super::{Events, Instant};
use super::{Connection, MAX_REORDERING, State, Undo};
use std::time::Duration;

/// RTT samples above this are discarded as bogus (an echo of a stale timestamp).
const MAX_RTT_SAMPLE: Duration = Duration::from_secs(60);

impl Connection {
    /// A segment for this connection arrived (the driver matched its 4-tuple and verified its checksum).
    pub fn on_segment(&mut self, now: Instant, h: &TcpHeader, payload: &[u8]) {
        self.counters.segments_received += 1;
        match self.state {
            State::Closed => return,
            State::SynSent => return self.on_segment_syn_sent(now, h),
            _ => {}
        }
        if let Some(ka) = self.cfg.keepalive
            && matches!(self.state, State::Established | State::CloseWait)
        {
            self.keepalive_unanswered = 0;
            self.keepalive_at = Some(now + ka.idle);
        }
        // SYN-RECEIVED: the peer retransmitted its SYN; our SYN-ACK was lost (RFC 9293 §3.8.1).
        if self.state == State::SynReceived && h.flags.syn() && !h.flags.ack() && h.seq == self.irs {
            self.syn_pending = true;
            return;
        }
        // SYN-RECEIVED after a simultaneous open (RFC 9293 §3.5, figure 8, line 7): the peer's SYN-ACK
        // repeats the SYN we have; what is new is its ACK (and anything after the SYN).
        if self.state == State::SynReceived && h.flags.syn() && h.flags.ack() && h.seq == self.irs {
            let mut rest = *h;
            rest.flags = TcpFlags(h.flags.0 & !TcpFlags::SYN);
            rest.seq = h.seq + 1;
            self.counters.segments_received -= 1;
            // The peer's SYN may not have been acknowledged yet (our SYN-ACK not sent or lost).
            self.ack_now = true;
            return self.on_segment(now, &rest, payload);
        }
        // PAWS (RFC 7323 §5.3 R1): a timestamp older than TS.Recent marks an old duplicate. Applied to
        // segments carrying text, SYN or FIN, the ones PAWS protects (RFC 7323 §5.2); a pure ACK that was
        // merely reordered keeps its SACK information and faces the ACK checks of RFC 5961 §5 instead.
        if self.timestamps
            && !h.flags.rst()
            && (!payload.is_empty() || h.flags.syn() || h.flags.fin())
            && let Some((val, _)) = h.options.timestamp
            && (val.wrapping_sub(self.ts_recent) as i32) < 0
        {
            self.counters.unacceptable_segments += 1;
            self.ack_now = true;
            return;
        }
        // Sequence acceptability (RFC 9293 §3.10.7.4, first check).
        let seg_len = payload.len() as u32 + u32::from(h.flags.syn()) + u32::from(h.flags.fin());
        let wnd = self.rcv_wnd();
        let in_window = |s: Seq| self.rcv_nxt <= s && s.since(self.rcv_nxt) < wnd as i32;
        let acceptable = match (seg_len, wnd) {
            (0, 0) => h.seq == self.rcv_nxt,
            (0, _) => in_window(h.seq),
            (_, 0) => false,
            (len, _) => in_window(h.seq) || in_window(h.seq + (len - 1)),
        };
        // With a zero window, ACKs and RSTs still count (RFC 9293 §3.10.7.4: "special allowance").
        let zero_window_ack = !acceptable && wnd == 0 && h.seq == self.rcv_nxt;
        if !acceptable && !zero_window_ack {
            self.counters.unacceptable_segments += 1;
            if !h.flags.rst() {
                self.ack_now = true;
            }
            // RFC 2883 §4: data already received is reported in a D-SACK block.
            if self.sack && !payload.is_empty() && h.seq + payload.len() as u32 <= self.rcv_nxt {
                self.dsack = Some((h.seq, h.seq + payload.len() as u32));
            }
            if self.state == State::TimeWait && h.flags.fin() {
                // RFC 9293 §3.10.7.4: a retransmitted FIN restarts the 2·MSL timeout.
                self.close_at = Some(now + self.cfg.time_wait);
            }
            return;
        }
        // RFC 5961 §3.2: RST resets only at exactly RCV.NXT; elsewhere in the window, a challenge ACK.
        if h.flags.rst() {
            if h.seq == self.rcv_nxt {
                self.enter_closed(Events::RESET);
            } else {
                self.challenge_ack(now);
            }
            return;
        }
        // RFC 5961 §4.2: a SYN in a synchronized state gets a challenge ACK.
        if h.flags.syn() {
            self.challenge_ack(now);
            return;
        }
        // Trim to the window (RFC 9293 §3.10.7.4: "trimmed ... to fit the window").
        let mut seq = h.seq;
        let mut data = payload;
        let mut fin = h.flags.fin();
        if seq < self.rcv_nxt {
            let cut = (self.rcv_nxt.bytes_since(seq) as usize).min(data.len());
            // RFC 2883 §4: the part received before, in a D-SACK block.
            if self.sack && cut > 0 {
                self.dsack = Some((seq, seq + cut as u32));
                self.ack_now = true;
            }
            data = &data[cut..];
            seq = self.rcv_nxt;
        }
        let offset = seq.bytes_since(self.rcv_nxt) as usize;
        if zero_window_ack || offset + data.len() > wnd as usize {
            data = &data[..(wnd as usize).saturating_sub(offset).min(data.len())];
            fin = false;
        }
        // Timestamps: TS.Recent follows the segment covering Last.ACK.sent (RFC 7323 §4.3).
        if self.timestamps
            && let Some((val, _)) = h.options.timestamp
            && h.seq <= self.last_ack_sent
            && (val.wrapping_sub(self.ts_recent) as i32) >= 0
        {
            self.ts_recent = val;
        }
        if !h.flags.ack() {
            return;
        }
        if self.state == State::SynReceived {
            if !(self.snd_una < h.ack && h.ack <= self.snd_nxt) {
                // RFC 9293 §3.10.7.4: an unacceptable ACK in SYN-RECEIVED gets <SEQ=SEG.ACK><CTL=RST>.
                self.rst_pending = Some((h.ack, None));
                return;
            }
            self.established_by(now, h);
            if self.fin_queued {
                self.state = State::FinWait1;
            }
        }
        if !self.on_ack(now, h, payload.is_empty() && !h.flags.fin()) {
            return;
        }
        if !data.is_empty() && matches!(self.state, State::Established | State::FinWait1 | State::FinWait2) {
            self.on_text(now, offset, data);
        }
        if fin {
            let fin_seq = seq + data.len() as u32;
            if fin_seq > self.rcv_nxt {
                self.pending_fin = Some(fin_seq);
                self.ack_now = true;
            } else if fin_seq == self.rcv_nxt && !self.fin_received {
                self.on_fin(now);
            } else {
                self.ack_now = true;
            }
        }
        if self.pending_fin == Some(self.rcv_nxt) && !self.fin_received {
            self.pending_fin = None;
            self.on_fin(now);
        }
    }

    /// RFC 9293 §3.10.7.3: a segment in SYN-SENT.
    fn on_segment_syn_sent(&mut self, now: Instant, h: &TcpHeader) {
        let ack_ok = h.flags.ack() && self.iss < h.ack && h.ack <= self.snd_nxt;
        if h.flags.ack() && !ack_ok {
            if !h.flags.rst() {
                self.rst_pending = Some((h.ack, None));
            }
            return;
        }
        if h.flags.rst() {
            if ack_ok {
                self.enter_closed(Events::RESET);
            }
            return;
        }
        if !h.flags.syn() {
            return;
        }
        self.irs = h.seq;
        self.rcv_nxt = h.seq + 1;
        self.rcv_right = self.rcv_nxt;
        self.negotiate(&h.options, now);
        if ack_ok {
            self.established_by(now, h);
            self.ack_now = true;
        } else {
            // Simultaneous open (RFC 9293 §3.5, figure 8): SYN-RECEIVED, answer with SYN-ACK.
            self.state = State::SynReceived;
            self.syn_pending = true;
            self.snd_wnd = u32::from(h.window);
            self.max_snd_wnd = self.snd_wnd;
            self.snd_wl1 = h.seq;
        }
    }

    /// Our SYN is acknowledged: ESTABLISHED (RFC 9293 §3.10.7.3, §3.10.7.4 SYN-RECEIVED case).
    fn established_by(&mut self, now: Instant, h: &TcpHeader) {
        self.state = State::Established;
        self.snd_una = h.ack;
        self.buf_seq = self.iss + 1;
        self.syn_pending = false;
        self.rto_at = None;
        // The window of a SYN segment is never scaled (RFC 7323 §2.2).
        let scale = if h.flags.syn() { 0 } else { self.snd_wscale };
        self.snd_wnd = u32::from(h.window) << scale;
        self.max_snd_wnd = self.snd_wnd;
        self.snd_wl1 = h.seq;
        self.snd_wl2 = h.ack;
        self.rec = Recovery::new(self.cfg.max_ranges, h.ack);
        self.rack = Rack::new(h.ack);
        self.high_recover = h.ack;
        self.take_rtt_sample(now, h, h.ack);
        self.timeouts_in_row = 0;
        self.give_up_at = None;
        self.rtt.reset_backoff();
        if let Some(ka) = self.cfg.keepalive {
            self.keepalive_at = Some(now + ka.idle);
        }
        self.events |= Events::CONNECTED | Events::WRITABLE;
    }

    /// RTT from the timestamp echo (RFC 7323 §4.1) or from the timed segment (RFC 6298 §3, Karn).
    fn take_rtt_sample(&mut self, now: Instant, h: &TcpHeader, ack: Seq) {
        let sample = if self.timestamps {
            h.options
                .timestamp
                .filter(|&(_, ecr)| ecr != 0)
                .map(|(_, ecr)| Duration::from_millis(u64::from(self.ts_now(now).wrapping_sub(ecr))))
        } else {
            match self.rtt_probe {
                Some((seq, sent)) if seq < ack => {
                    self.rtt_probe = None;
                    Some(now.since(sent))
                }
                _ => None,
            }
        };
        if let Some(rtt) = sample.filter(|r| *r <= MAX_RTT_SAMPLE) {
            self.rtt.on_sample(rtt);
            self.ack_rtt = Some(rtt);
        }
    }

    /// RFC 9293 §3.10.7.4 fifth check: the ACK field. Returns false when the segment is to be dropped.
    /// Whatever it delivered (acknowledged or SACKed) then feeds the congestion controller's model
    /// (BBR §4.2, BBRUpdateOnACK).
    fn on_ack(&mut self, now: Instant, h: &TcpHeader, no_text: bool) -> bool {
        let delivered_before = self.delivered;
        self.ack_rtt = None;
        let accepted = self.process_ack(now, h, no_text);
        // The delivery-rate model's RTT where the timestamp echo's millisecond ticks cannot tell (under
        // 2 ms: on a sub-millisecond path it says 0, and the model's BDP with it): the delivered segment's
        // send time, in microseconds (`rack.rs`). Above, the echo is kept: it covers the receiver's ACK
        // delay too, which the window must also cover (measured under the impaired link, Writes were
        // slower with the shorter sample).
        if self.sack
            && self.ack_rtt.is_none_or(|r| r < Duration::from_millis(2))
            && let Some(rtt) = self.rack.ack_rtt()
        {
            self.ack_rtt = Some(rtt);
        }
        let newly_delivered = self.delivered - delivered_before;
        if accepted && newly_delivered > 0 {
            let (una, nxt) = (self.snd_una, self.snd_nxt);
            let high = self.rec.scoreboard.high_sacked().map_or(una, |h| h.max(una));
            let sample = AckSample {
                now,
                delivered: self.delivered,
                delivered_seq: high,
                snd_nxt: nxt,
                inflight: self.pipe(),
                newly_delivered: newly_delivered.min(u64::from(u32::MAX)) as u32,
                rtt: self.ack_rtt,
            };
            self.cc.on_ack_sample(&sample);
        }
        accepted
    }

    fn process_ack(&mut self, now: Instant, h: &TcpHeader, no_text: bool) -> bool {
        let ack = h.ack;
        // RFC 5961 §5.2: acceptable ACKs lie in [SND.UNA − MAX.SND.WND, SND.NXT].
        let oldest = self.snd_una - self.max_snd_wnd.max(1);
        if ack > self.snd_nxt || ack < oldest {
            self.counters.unacceptable_segments += 1;
            self.challenge_ack(now);
            return false;
        }
        let una_before = self.snd_una;
        if ack > self.snd_una {
            self.on_new_ack(now, h);
        }
        // Window update (RFC 9293 §3.10.7.4: SND.WL1/SND.WL2 guard against old segments).
        if self.snd_wl1 < h.seq || (self.snd_wl1 == h.seq && self.snd_wl2 <= ack) {
            let was_zero = self.snd_wnd == 0;
            self.snd_wnd = u32::from(h.window) << self.snd_wscale;
            self.max_snd_wnd = self.max_snd_wnd.max(self.snd_wnd);
            self.snd_wl1 = h.seq;
            self.snd_wl2 = ack;
            if self.snd_wnd == 0 {
                // The peer answers: persist probing goes on without giving up (RFC 9293 §3.8.6.1).
                self.timeouts_in_row = 0;
                self.give_up_at = None;
            } else if was_zero {
                self.persist_at = None;
                self.rtt.reset_backoff();
                if self.snd_una != self.snd_nxt {
                    self.rto_at = Some(now + self.rtt.rto());
                }
            }
        }
        if !self.sends_data() && !matches!(self.state, State::FinWait2) {
            return true;
        }
        let (una, nxt, mss) = (self.snd_una, self.snd_nxt, self.send_mss);
        let newly_sacked = if self.sack {
            self.rec.scoreboard.on_sack_blocks(una, nxt, h.options.sacks())
        } else {
            0
        };
        self.delivered += u64::from(newly_sacked);
        if self.sack {
            // RACK (RFC 8985 §6.2 steps 1–3) learns what this ACK delivered.
            let blocks: Vec<(Seq, Seq)> = h
                .options
                .sacks()
                .iter()
                .copied()
                .filter(|&(l, r)| una <= l && l < r && r <= nxt)
                .collect();
            let echoed = self.echoed_at(now, h);
            self.rack.on_ack(now, una, &blocks, echoed, self.rtt.min_rtt());
            // RFC 2883 §4: a first block below the cumulative ACK, or inside the second, is a D-SACK.
            let sacks = h.options.sacks();
            let dsack = sacks.first().is_some_and(|&(l, r)| {
                l < r && (r <= ack || sacks.get(1).is_some_and(|&(l2, r2)| l2 <= l && r <= r2))
            });
            self.rack.on_ack_round(dsack, una, nxt);
        }
        // Duplicate ACK (RFC 5681 §2), deliberately without "the advertised window is unchanged": a window
        // update must not hide a loss. With SACK, only ACKs with new SACK information count (RFC 6675 §2).
        let duplicate = ack == una_before
            && ack == una
            && no_text
            && una != nxt
            && h.window != 0
            && (!self.sack || newly_sacked > 0);
        if duplicate {
            self.rec.dup_acks += 1;
            self.counters.dup_acks += 1;
        }
        if una == nxt {
            return true;
        }
        let dup_thresh = self.dup_thresh();
        let by_count = self.dup_thresh_marks_losses();
        let lost_by_sack = by_count && self.sack && self.rec.scoreboard.lost_below(dup_thresh, mss).is_some();
        // RACK (RFC 8985 §6.2 step 5) on every ACK.
        let rack_lost = self.rack_detect(now, dup_thresh);
        match self.rec.phase {
            Phase::Open
                if ((by_count && self.rec.dup_acks >= dup_thresh)
                    || lost_by_sack
                    || rack_lost.is_some_and(|s| s > una))
                    && una > self.high_recover - 1 =>
            {
                self.enter_fast_recovery(now, dup_thresh, rack_lost);
            }
            Phase::Fast { .. } | Phase::Loss { .. }
                if self.sack && (newly_sacked > 0 || rack_lost.is_some()) =>
            {
                if by_count {
                    self.rec.update_lost(dup_thresh, mss);
                }
                if let Some(limit) = rack_lost {
                    self.rec.lost_limit = self.rec.lost_limit.max(limit.min(nxt));
                }
            }
            _ => {}
        }
        if self.in_fast_recovery() {
            // The stalled-recovery probe runs from the latest ACK too (`timers.rs`).
            self.schedule_tlp(now);
        }
        true
    }

    /// Whether counting (DupThresh duplicate ACKs, RFC 5681 §3.2; RFC 6675 §4 `IsLost`'s DupThresh
    /// segments SACKed above) still marks losses: not once the path has shown reordering with SACK on.
    /// Then RACK's time-based rule (RFC 8985 §6.2, with its reordering window) alone decides: a count
    /// cannot tell a segment overtaken by thirty others on a jittery path from a lost one, and every such
    /// guess is a spurious retransmission and a needless recovery episode. RACK-TLP is meant as the
    /// replacement of the DupAck threshold (RFC 8985 §1, §3); Linux makes the same choice
    /// (`tcp_time_to_recover()` skips the duplicate-ACK heuristic under RACK). Issue 34: on issue 7's link
    /// (10 % reordering, 10 ± 5 ms), four recovery episodes in five were undone as spurious, and the
    /// own TCP retransmitted several times more than the kernel's.
    fn dup_thresh_marks_losses(&self) -> bool {
        !(self.sack && self.rack.reordering_seen())
    }

    /// DupThresh for the flight outstanding now (`Recovery::dup_threshold`).
    fn dup_thresh(&self) -> u32 {
        let (una, nxt) = (self.snd_una, self.snd_nxt);
        let outstanding_segments = nxt.bytes_since(una).div_ceil(self.send_mss);
        let wnd_room = (una + self.snd_wnd).bytes_since(nxt);
        let can_send_new = nxt < self.data_end() && wnd_room > 0;
        Recovery::dup_threshold(outstanding_segments, can_send_new, self.reordering)
    }

    /// Fast retransmit (RFC 5681 §3.2 steps 2–3, RFC 6675 §5 step 4, RFC 5827 early retransmit, RFC 8985
    /// §6.2 when RACK found the loss): the recovery point is SND.NXT, the lost region what IsLost and
    /// RACK (`rack_lost`) say, at least the segment at SND.UNA.
    fn enter_fast_recovery(&mut self, now: Instant, dup_thresh: u32, rack_lost: Option<Seq>) {
        let (una, nxt, mss) = (self.snd_una, self.snd_nxt, self.send_mss);
        self.counters.fast_retransmits += 1;
        let distance = self
            .rec
            .scoreboard
            .high_sacked()
            .map_or(0, |h| h.bytes_since(una) / mss);
        self.undo = self.timestamps.then(|| Undo {
            seq: una,
            ts: self.ts_now(now),
            cwnd: self.cc.cwnd(),
            ssthresh: self.cc.ssthresh(),
            distance,
        });
        self.rec.lost_limit = una;
        self.rec.enter_fast(una, nxt, mss);
        if self.sack {
            if self.dup_thresh_marks_losses() {
                self.rec.update_lost(dup_thresh, mss);
            }
            if let Some(limit) = rack_lost {
                self.rec.lost_limit = self.rec.lost_limit.max(limit.min(nxt));
            }
        }
        let pipe = self.pipe();
        self.cc.on_fast_loss(nxt.bytes_since(una), pipe, mss);
        self.schedule_tlp(now);
    }

    /// RFC 8985 §6.2 step 4: the reordering window. Zero while no reordering was seen and the sender is
    /// in recovery or has DupThresh segments SACKed; else min_RTT/4 times a multiplier (raised when a
    /// recovery proved spurious, the role DSACK plays in §6.2 step 4), at most SRTT.
    fn rack_reo_wnd(&self, dup_thresh: u32) -> Duration {
        let sacked_segments = self.rec.scoreboard.sacked_bytes() / self.send_mss.max(1);
        if !self.rack.reordering_seen() && (self.rec.in_recovery() || sacked_segments >= dup_thresh) {
            return Duration::ZERO;
        }
        match (self.rtt.min_rtt(), self.rtt.srtt()) {
            (Some(min_rtt), Some(srtt)) => (min_rtt / 4 * self.rack.reo_wnd_mult()).min(srtt),
            _ => Duration::ZERO,
        }
    }

    /// RACK_detect_loss_and_arm_timer (RFC 8985 §6.2 step 5, §6.3): marks what RACK finds lost and
    /// re-arms the reordering timer. Returns the end of the lost region above the recovery sweep point.
    fn rack_detect(&mut self, now: Instant, dup_thresh: u32) -> Option<Seq> {
        if !self.sack || self.snd_una == self.snd_nxt {
            self.rack_at = None;
            return None;
        }
        let reo_wnd = self.rack_reo_wnd(dup_thresh);
        let sweep = self.rec.rtx_next.max(self.snd_una);
        let found = self.rack.detect_loss(now, reo_wnd, sweep);
        self.rack_at = found.timer;
        found.lost_above_sweep.map(|e| e.min(self.snd_nxt))
    }

    /// The RACK reordering timer fired (RFC 8985 §6.3): detect again; what is lost now is repaired
    /// without waiting for another ACK or the RTO (entering fast recovery if need be).
    pub(super) fn on_rack_timer(&mut self, now: Instant) {
        if !self.sends_data() {
            return;
        }
        let dup_thresh = self.dup_thresh();
        let rack_lost = self.rack_detect(now, dup_thresh);
        let una = self.snd_una;
        match self.rec.phase {
            Phase::Open if rack_lost.is_some_and(|s| s > una) && una > self.high_recover - 1 => {
                self.enter_fast_recovery(now, dup_thresh, rack_lost);
            }
            Phase::Fast { .. } | Phase::Loss { .. } => {
                if let Some(limit) = rack_lost {
                    self.rec.lost_limit = self.rec.lost_limit.max(limit);
                }
            }
            _ => {}
        }
    }

    /// When the segment whose timestamp this ACK echoes left (RFC 7323 §3: TSecr), in our clock.
    fn echoed_at(&self, now: Instant, h: &TcpHeader) -> Option<Instant> {
        let (_, ecr) = h.options.timestamp.filter(|_| self.timestamps)?;
        let age = Duration::from_millis(u64::from(self.ts_now(now).wrapping_sub(ecr)));
        (ecr != 0 && age <= MAX_RTT_SAMPLE)
            .then(|| Instant::from_micros(now.micros().saturating_sub(age.as_micros() as u64)))
    }

    /// SND.UNA advances (RFC 9293 §3.10.7.4 ESTABLISHED ACK processing; RFC 6582 §3.2 steps 3 and 5).
    fn on_new_ack(&mut self, now: Instant, h: &TcpHeader) {
        let ack = h.ack;
        let acked = ack.bytes_since(self.snd_una);
        self.take_rtt_sample(now, h, ack);
        // Eifel detection (RFC 3522 §3.2): the first ACK covering the first retransmission echoes a
        // timestamp older than that retransmission: the original arrived, the episode was spurious.
        if let Some(undo) = self.undo
            && ack > undo.seq
        {
            self.undo = None;
            // Segments above the first presumed lost too (RACK or IsLost widened the lost region) and not
            // covered by this ACK: the first retransmission was needless — its original was only late —
            // but the episode is not
            // (issue 34: undoing it stopped the repair of real holes until a new episode found them, and
            // on a lossy, reordering path four episodes in five ended so). Linux likewise undoes on a
            // partial ACK only with no retransmission outstanding (`tcp_try_undo_partial`). The
            // reordering is learnt either way.
            let others_lost = matches!(self.rec.phase, Phase::Fast { .. })
                && self.rec.lost_limit > (undo.seq + self.send_mss).max(ack);
            let delayed = h
                .options
                .timestamp
                .is_some_and(|(_, ecr)| ecr != 0 && (ecr.wrapping_sub(undo.ts) as i32) < 0);
            if delayed && others_lost {
                self.reordering = self.reordering.max(undo.distance + 1).min(MAX_REORDERING);
                self.rack.spurious(self.snd_nxt);
            } else if delayed {
                // RFC 4015 §3: restore the window; reordering, not loss: raise DupThresh to what was seen.
                self.counters.spurious_recoveries += 1;
                self.cc.restore(undo.cwnd, undo.ssthresh);
                self.rec.phase = Phase::Open;
                self.rec.dup_acks = 0;
                self.reordering = self.reordering.max(undo.distance + 1).min(MAX_REORDERING);
                self.rack.spurious(self.snd_nxt);
            }
        }
        let data_end = self.data_end();
        let data_acked = ack.min(data_end).bytes_since(self.buf_seq);
        self.send_buf.consume(data_acked as usize);
        self.buf_seq = self.buf_seq + data_acked;
        let fin_acked = self.fin_queued && ack > data_end;
        self.snd_una = ack;
        let sacked_before = self.rec.scoreboard.sacked_bytes();
        self.rec.scoreboard.on_cumulative_ack(ack);
        // Delivered now: the bytes acknowledged, less those already counted when they were SACKed.
        let was_sacked = sacked_before.saturating_sub(self.rec.scoreboard.sacked_bytes());
        self.delivered += u64::from(acked.saturating_sub(was_sacked));
        self.rec.lost_limit = self.rec.lost_limit.max(ack);
        self.rec.rtx_next = self.rec.rtx_next.max(ack);
        self.timeouts_in_row = 0;
        self.give_up_at = None;
        let mss = self.send_mss;
        let flight = self.snd_nxt.bytes_since(ack);
        match self.rec.phase {
            Phase::Fast { recover } if ack >= recover => {
                self.cc.on_recovery_exit(flight, mss);
                self.rack.on_recovery_exit();
                self.rec.phase = Phase::Open;
                self.rec.dup_acks = 0;
                self.high_recover = recover;
            }
            Phase::Fast { .. } => {
                // Partial ACK (RFC 6582 §3.2 step 5): the next unacknowledged segment is lost too.
                if !self.sack {
                    self.rec.lost_limit = self.rec.lost_limit.max(ack + mss).min(self.snd_nxt);
                    self.rec.rtx_forced = true;
                }
                self.rec.dup_acks = 0;
            }
            Phase::Loss { recover } => {
                self.cc.on_ack(acked, mss);
                if ack >= recover {
                    self.rec.phase = Phase::Open;
                    self.high_recover = recover;
                    self.cc.on_loss_exit();
                    self.rack.on_recovery_exit();
                }
                self.rec.dup_acks = 0;
            }
            Phase::Open => {
                self.cc.on_ack(acked, mss);
                self.rec.dup_acks = 0;
            }
        }
        // RFC 6298 §5.2–5.3: stop the timer when all is acknowledged, else restart it.
        if self.snd_una == self.snd_nxt {
            self.rto_at = None;
            self.tlp_at = None;
        } else {
            self.rto_at = Some(now + self.rtt.rto());
        }
        self.tlp_outstanding = false;
        self.schedule_tlp(now);
        if data_acked > 0 {
            self.events |= Events::WRITABLE;
        }
        if fin_acked {
            match self.state {
                State::FinWait1 => {
                    self.state = State::FinWait2;
                    // Bounded FIN-WAIT-2 (the peer may never close): the TIME-WAIT duration.
                    self.close_at = Some(now + self.cfg.time_wait);
                }
                State::Closing => self.enter_time_wait(now),
                State::LastAck => self.enter_closed(Events::CLOSED),
                _ => {}
            }
        }
    }

    /// RFC 9293 §3.10.7.4 seventh check: segment text; ACK policy of RFC 5681 §4.2 / RFC 9293 §3.8.6.3
    /// (every second full segment, at once for out-of-order data or a filled gap, else after the delay).
    fn on_text(&mut self, now: Instant, offset: usize, data: &[u8]) {
        let had_gap = self.recv_buf.has_out_of_order();
        let advanced = self.recv_buf.write(offset, data);
        if advanced > 0 {
            self.rcv_nxt = self.rcv_nxt + advanced as u32;
            self.events |= Events::READABLE;
        }
        if offset > 0 {
            self.counters.out_of_order_segments += 1;
            self.ack_now = true;
        } else if had_gap || advanced == 0 || self.cfg.delayed_ack.is_zero() {
            self.ack_now = true;
        } else {
            self.segments_since_ack += 1;
            if self.segments_since_ack >= 2 {
                self.ack_now = true;
            } else if self.delack_at.is_none() {
                self.delack_at = Some(now + self.cfg.delayed_ack);
            }
        }
    }

    /// The FIN is in sequence (RFC 9293 §3.10.7.4 eighth check).
    fn on_fin(&mut self, now: Instant) {
        self.rcv_nxt = self.rcv_nxt + 1;
        self.fin_received = true;
        self.ack_now = true;
        self.events |= Events::PEER_CLOSED | Events::READABLE;
        match self.state {
            State::SynReceived | State::Established => self.state = State::CloseWait,
            State::FinWait1 => {
                if self.snd_una == self.snd_nxt && self.fin_queued {
                    self.enter_time_wait(now);
                } else {
                    self.state = State::Closing;
                }
            }
            State::FinWait2 => self.enter_time_wait(now),
            State::TimeWait => self.close_at = Some(now + self.cfg.time_wait),
            _ => {}
        }
    }
}
