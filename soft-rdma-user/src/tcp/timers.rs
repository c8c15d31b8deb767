//! One connection's timers (RFC 9293 §3.8: retransmission RFC 6298 with RFC 5681/6675's response,
//! tail-loss probe RFC 8985 §7, RACK reordering timer RFC 8985 §6.3, persist §3.8.6.1, delayed ACK
//! §3.8.6.3, keepalive §3.8.4, TIME-WAIT §3.6.1, user timeout, idle buffer release) and the one-off probes
//! they send; challenge-ACK rate limiting (RFC 5961 §7).

use std::time::Duration;

use super::super::wire::{TcpFlags, TcpHeader};
use super::super::{Events, Instant};
use super::{Connection, Probe, State, Undo};

impl Connection {
    pub(super) fn send_probe(
        &mut self,
        now: Instant,
        probe: Probe,
        payload: &mut [u8],
    ) -> Option<(TcpHeader, usize)> {
        if !self.sends_data() {
            return None;
        }
        match probe {
            Probe::Keepalive => {
                self.counters.keepalive_probes += 1;
                let h = self.header(now, self.snd_una - 1, TcpFlags::ACK);
                self.sent(now, &h);
                Some((h, 0))
            }
            Probe::ZeroWindow => {
                let data_end = self.data_end();
                let seq = if self.snd_una < self.snd_nxt {
                    self.snd_una
                } else {
                    self.snd_nxt
                };
                if seq >= data_end {
                    return None;
                }
                // A small open window is used as it is (the SWS override); a zero one gets one octet.
                let room = (self.snd_una + self.snd_wnd).bytes_since(seq).max(1);
                if self.snd_wnd == 0 {
                    self.counters.zero_window_probes += 1;
                }
                let out = self.send_range(now, seq, seq + room, payload);
                self.rto_at = Some(now + self.rtt.rto());
                Some(out)
            }
            Probe::TailLoss => {
                if self.snd_una == self.snd_nxt {
                    return None;
                }
                self.counters.tlp_probes += 1;
                self.tlp_outstanding = true;
                let data_end = self.data_end();
                let wnd_room = (self.snd_una + self.snd_wnd).bytes_since(self.snd_nxt);
                let out = if self.snd_nxt < data_end && wnd_room > 0 {
                    let end = self.snd_nxt + wnd_room.min(data_end.bytes_since(self.snd_nxt));
                    self.send_range(now, self.snd_nxt, end, payload)
                } else {
                    // The last segment sent, again (RFC 8985 §7.3).
                    let end = self.snd_nxt;
                    let fin = u32::from(self.fin_queued && end > data_end);
                    let start = (end - fin - self.send_mss).max(self.snd_una);
                    self.send_range(now, start, end, payload)
                };
                // RFC 8985 §7.3: re-arm the RTO after the probe.
                self.rto_at = Some(now + self.rtt.rto());
                Some(out)
            }
            Probe::StalledRecovery => {
                let (start, end) = self.rec.scoreboard.next_hole(self.snd_una, self.snd_nxt)?;
                self.counters.tlp_probes += 1;
                self.tlp_outstanding = true;
                // A retransmission of the segment at SND.UNA: it re-arms the RTO (`send_range`).
                Some(self.send_range(now, start, end, payload))
            }
        }
    }

    /// Arm the tail-loss probe (RFC 8985 §7.2): PTO = 2·SRTT, plus the delayed-ACK allowance when one
    /// segment is in flight, at most the RTO.
    ///
    /// The same timer, during a loss recovery, arms the stalled-recovery probe. RFC 8985 §7.2 keeps TLP
    /// out of recovery because there RACK's timer finds a lost retransmission (§6.2), but only once a
    /// segment sent after it is delivered. A sender with nothing more to send (the peer's window full of
    /// SACKed data behind the hole, or the application waiting for that data's completion) sends none:
    /// a retransmission of the hole lost again then waited for the RTO (200 ms at least, twice that the
    /// next time) and BBR restarted from one segment. On issue 34's link (5 % loss) that was several
    /// timeouts per 48 MiB (Linux behaves the same). So when a fast recovery has sent and heard nothing
    /// for a PTO, the first un-SACKed segment goes once more: one segment per stall, as TLP's one probe
    /// per tail. The RTO stays the backstop, and after it (RFC 6298 §5.5's backoff) there is no probe.
    pub(super) fn schedule_tlp(&mut self, now: Instant) {
        self.tlp_at = None;
        // RFC 8985 §7.2: only with SACK, no SACKed sequence (the RACK timer covers that case) and not in
        // recovery (above).
        if !self.cfg.tail_loss_probe
            || !self.sack
            || self.tlp_outstanding
            || (self.rec.in_recovery() && !self.in_fast_recovery())
            || (!self.rec.in_recovery() && self.rec.scoreboard.sacked_bytes() > 0)
        {
            return;
        }
        let (Some(srtt), Some(rto_at)) = (self.rtt.srtt(), self.rto_at) else {
            return;
        };
        let flight = self.snd_nxt.bytes_since(self.snd_una);
        if flight == 0 {
            return;
        }
        let mut pto = 2 * srtt;
        if flight <= self.send_mss {
            pto += self.cfg.tlp_single_segment_allowance;
        } else {
            pto += Duration::from_millis(2);
        }
        // PTO = min(PTO, RTO): a probe rather than a timeout when both would fire together.
        self.tlp_at = Some((now + pto).min(rto_at));
    }

    pub(super) fn run_timers(&mut self, now: Instant) {
        let due = |t: Option<Instant>| t.is_some_and(|t| t <= now);
        if due(self.close_at) {
            self.close_at = None;
            self.enter_closed(Events::CLOSED);
            return;
        }
        if due(self.give_up_at) {
            self.give_up_at = None;
            if self.timeouts_in_row > 0 {
                self.timed_out();
                return;
            }
        }
        // The probe goes first when both are due: it replaces the timeout (RFC 8985 §7.2–7.3).
        if due(self.tlp_at) {
            self.tlp_at = None;
            if self.snd_una != self.snd_nxt && !self.rec.in_recovery() {
                self.probe = Some(Probe::TailLoss);
                self.rto_at = Some(now + self.rtt.rto());
            } else if self.snd_una != self.snd_nxt && self.in_fast_recovery() {
                self.probe = Some(Probe::StalledRecovery);
            }
        }
        if due(self.rack_at) {
            self.rack_at = None;
            self.on_rack_timer(now);
        }
        if due(self.rto_at) {
            self.rto_at = None;
            self.on_retransmission_timeout(now);
        }
        if due(self.persist_at) {
            self.persist_at = None;
            self.rtt.on_timeout();
            self.probe = Some(Probe::ZeroWindow);
        }
        if due(self.delack_at) {
            self.delack_at = None;
            self.ack_now = true;
        }
        if due(self.pacing_at) {
            self.pacing_at = None;
        }
        if due(self.release_at) {
            // Empty now (perhaps not all along: then it only costs a regrowth).
            self.release_at = None;
            self.send_buf.release_if_empty();
            self.recv_buf.release_if_empty();
        }
        if due(self.keepalive_at) {
            let ka = self
                .cfg
                .keepalive
                .expect("keepalive timer armed only when configured");
            if self.keepalive_unanswered >= ka.probes {
                self.timed_out();
                return;
            }
            self.keepalive_unanswered += 1;
            self.keepalive_at = Some(now + ka.interval);
            self.probe = Some(Probe::Keepalive);
        }
    }

    /// RFC 6298 §5.4–5.7 with RFC 5681 §3.1 and RFC 6675 §5.1; the SYN is resent in SYN states.
    pub(super) fn on_retransmission_timeout(&mut self, now: Instant) {
        match self.state {
            State::SynSent | State::SynReceived => {
                if self.timeouts_in_row >= self.cfg.max_syn_retransmissions {
                    self.timed_out();
                    return;
                }
                self.counters.rto_events += 1;
                self.timeouts_in_row += 1;
                self.rtt.on_timeout();
                self.rtt_probe = None;
                self.syn_pending = true;
            }
            State::Closed | State::TimeWait => {}
            _ if self.snd_una == self.snd_nxt => {}
            _ => {
                if self.snd_wnd == 0 && self.snd_una < self.data_end() {
                    // Zero window: the outstanding octet is a window probe (RFC 9293 §3.8.6.1), resent
                    // with backoff for as long as the peer answers.
                    self.rtt.on_timeout();
                    self.probe = Some(Probe::ZeroWindow);
                    self.timeouts_in_row += 1;
                    if self.timeouts_in_row > self.cfg.max_retransmissions {
                        self.timed_out();
                    }
                    return;
                }
                if self.timeouts_in_row >= self.cfg.max_retransmissions {
                    self.timed_out();
                    return;
                }
                self.counters.rto_events += 1;
                if self.timeouts_in_row == 0 {
                    self.give_up_at = self.cfg.user_timeout.map(|t| now + t);
                }
                let flight = self.snd_nxt.bytes_since(self.snd_una);
                tracing::debug!(
                    port = self.local_port,
                    flight,
                    queued = self.send_buf.len(),
                    phase = ?self.rec.phase,
                    sacked = self.rec.scoreboard.sacked_bytes(),
                    high_sacked = ?self.rec.scoreboard.high_sacked().map(|h| h.bytes_since(self.snd_una)),
                    tlp_outstanding = self.tlp_outstanding,
                    in_row = self.timeouts_in_row,
                    since_send_ms = now.since(self.last_send).as_millis() as u64,
                    srtt = ?self.rtt.srtt(),
                    rto = ?self.rtt.rto(),
                    wnd = self.snd_wnd,
                    cwnd = self.cc.cwnd(),
                    "TCP retransmission timeout"
                );
                if self.timeouts_in_row == 0 && !self.rec.in_recovery() {
                    self.undo = self.timestamps.then(|| Undo {
                        seq: self.snd_una,
                        ts: self.ts_now(now),
                        cwnd: self.cc.cwnd(),
                        ssthresh: self.cc.ssthresh(),
                        distance: 0,
                    });
                }
                self.cc.on_rto(flight, self.send_mss, self.timeouts_in_row == 0);
                // A second timeout in a row: the receiver may have reneged on its SACKs (RFC 2018 §8).
                if self.timeouts_in_row >= 1 {
                    self.rec.scoreboard.clear();
                    self.rack.forget_sacks();
                }
                self.rec.enter_loss(self.snd_una, self.snd_nxt);
                self.rack_at = None;
                self.high_recover = self.snd_nxt;
                self.rtt.on_timeout();
                self.timeouts_in_row += 1;
                self.rtt_probe = None;
                self.tlp_at = None;
                self.tlp_outstanding = false;
            }
        }
    }

    pub(super) fn challenge_ack(&mut self, now: Instant) {
        // RFC 5961 §7: a bounded number per second.
        if now.since(self.challenge_window) >= Duration::from_secs(1) {
            self.challenge_window = now;
            self.challenges_in_window = 0;
        }
        if self.challenges_in_window < self.cfg.challenge_acks_per_second {
            self.challenges_in_window += 1;
            self.counters.challenge_acks += 1;
            self.ack_now = true;
        }
    }
}
