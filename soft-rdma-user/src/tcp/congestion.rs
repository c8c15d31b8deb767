//! Congestion control: NewReno's window arithmetic (RFC 5681, RFC 6582 for the exit from recovery),
//! with the initial window of RFC 6928 and appropriate byte counting (RFC 3465, L = 2·SMSS), and
//! [`Controller`], which runs NewReno or the model-based [`Bbr`] (`bbr.rs`) as configured.
//! Loss detection and what to retransmit live in `recovery.rs`; this file only sizes the window.

use super::bbr::{AckSample, Bbr};
use super::{CongestionControl, Instant};

/// The connection's congestion controller, as [`super::TcpConfig::congestion`] chose.
#[derive(Clone, Debug)]
pub enum Controller {
    NewReno(NewReno),
    /// Boxed: its model is larger than NewReno's two numbers, and most connections are NewReno.
    Bbr(Box<Bbr>),
}

impl Controller {
    pub fn new(kind: CongestionControl, mss: u32, initial_segments: u32, now: Instant) -> Self {
        match kind {
            CongestionControl::NewReno => Controller::NewReno(NewReno::new(mss, initial_segments)),
            CongestionControl::Bbr => Controller::Bbr(Box::new(Bbr::new(mss, initial_segments, now))),
        }
    }

    pub fn cwnd(&self) -> u32 {
        match self {
            Controller::NewReno(c) => c.cwnd(),
            Controller::Bbr(b) => b.cwnd(),
        }
    }

    /// NewReno's ssthresh; BBR has none (u32::MAX).
    pub fn ssthresh(&self) -> u32 {
        match self {
            Controller::NewReno(c) => c.ssthresh(),
            Controller::Bbr(_) => u32::MAX,
        }
    }

    /// Bytes per second to pace at, for a controller that paces.
    pub fn pacing_rate(&self) -> Option<u64> {
        match self {
            Controller::NewReno(_) => None,
            Controller::Bbr(b) => Some(b.pacing_rate()),
        }
    }

    /// New data cumulatively acknowledged outside fast recovery (NewReno's window growth).
    pub fn on_ack(&mut self, acked: u32, mss: u32) {
        if let Controller::NewReno(c) = self {
            c.on_ack(acked, mss);
        }
    }

    /// Every acceptable ACK, after loss detection (BBR's model and window).
    pub fn on_ack_sample(&mut self, s: &AckSample) {
        if let Controller::Bbr(b) = self {
            b.on_ack(s);
        }
    }

    /// The sender had room to send and nothing queued.
    pub fn on_app_limited(&mut self) {
        if let Controller::Bbr(b) = self {
            b.on_app_limited();
        }
    }

    /// Fast recovery begins with `flight` bytes outstanding, `pipe` of them still in the network.
    pub fn on_fast_loss(&mut self, flight: u32, pipe: u32, mss: u32) {
        match self {
            Controller::NewReno(c) => c.on_fast_loss(flight, mss),
            Controller::Bbr(b) => b.on_fast_loss(pipe),
        }
    }

    /// Fast recovery ended by a full acknowledgment.
    pub fn on_recovery_exit(&mut self, flight: u32, mss: u32) {
        match self {
            Controller::NewReno(c) => c.on_recovery_exit(flight, mss),
            Controller::Bbr(b) => b.on_recovery_exit(),
        }
    }

    /// The recovery after a timeout ended (SND.UNA passed the recovery point): NewReno keeps slow
    /// starting; BBR restores the window it had.
    pub fn on_loss_exit(&mut self) {
        if let Controller::Bbr(b) = self {
            b.on_recovery_exit();
        }
    }

    pub fn on_rto(&mut self, flight: u32, mss: u32, first_timeout: bool) {
        match self {
            Controller::NewReno(c) => c.on_rto(flight, mss, first_timeout),
            Controller::Bbr(b) => b.on_rto(),
        }
    }

    pub fn restore(&mut self, cwnd: u32, ssthresh: u32) {
        match self {
            Controller::NewReno(c) => c.restore(cwnd, ssthresh),
            Controller::Bbr(b) => b.restore(cwnd),
        }
    }

    /// Restart after idle: NewReno per RFC 5681 §4.1; BBR keeps its model and paces (BBR §4.4.3).
    pub fn on_idle_restart(&mut self, mss: u32, initial_segments: u32) {
        if let Controller::NewReno(c) = self {
            c.on_idle_restart(mss, initial_segments);
        }
    }
}

/// cwnd and ssthresh, in bytes.
#[derive(Clone, Copy, Debug)]
pub struct NewReno {
    cwnd: u32,
    ssthresh: u32,
    /// Bytes acknowledged since cwnd last grew in congestion avoidance (RFC 5681 §3.1, byte counting).
    acked_in_avoidance: u32,
}

impl NewReno {
    /// IW = `initial_segments` · SMSS (RFC 6928 §2 recommends min(10·MSS, max(2·MSS, 14600))); ssthresh
    /// starts arbitrarily high (RFC 5681 §3.1).
    pub fn new(mss: u32, initial_segments: u32) -> Self {
        NewReno {
            cwnd: initial_window(mss, initial_segments),
            ssthresh: u32::MAX,
            acked_in_avoidance: 0,
        }
    }

    pub fn cwnd(&self) -> u32 {
        self.cwnd
    }

    pub fn ssthresh(&self) -> u32 {
        self.ssthresh
    }

    /// New data acknowledged outside fast recovery: slow start below ssthresh (RFC 5681 §3.1, eq. 2 with
    /// RFC 3465's L = 2·SMSS), else congestion avoidance, one SMSS per cwnd of data acknowledged.
    pub fn on_ack(&mut self, acked: u32, mss: u32) {
        if self.cwnd < self.ssthresh {
            self.cwnd = self.cwnd.saturating_add(acked.min(2 * mss));
        } else {
            self.acked_in_avoidance = self.acked_in_avoidance.saturating_add(acked);
            if self.acked_in_avoidance >= self.cwnd {
                self.acked_in_avoidance -= self.cwnd;
                self.cwnd = self.cwnd.saturating_add(mss);
            }
        }
        self.cwnd = self.cwnd.min(1 << 30);
    }

    /// Loss detected by duplicate ACKs or SACK: ssthresh = max(FlightSize/2, 2·SMSS) (RFC 5681 §3.2 eq. 4,
    /// RFC 6675 §5 step 4.2), cwnd = ssthresh. No window inflation: the sender limits itself by `pipe`
    /// (RFC 6675 §5), which the caller computes.
    pub fn on_fast_loss(&mut self, flight: u32, mss: u32) {
        self.ssthresh = (flight / 2).max(2 * mss);
        self.cwnd = self.ssthresh;
        self.acked_in_avoidance = 0;
    }

    /// Full acknowledgment ends recovery: cwnd = min(ssthresh, FlightSize + SMSS) (RFC 6582 §3.2 step 3,
    /// option 1).
    pub fn on_recovery_exit(&mut self, flight: u32, mss: u32) {
        self.cwnd = self.ssthresh.min(flight.saturating_add(mss)).max(mss);
    }

    /// Retransmission timeout: ssthresh = max(FlightSize/2, 2·SMSS), cwnd = 1 SMSS, the loss window
    /// (RFC 5681 §3.1 eq. 4 and the paragraph after it). Repeated timeouts keep ssthresh (RFC 5681 §3.1).
    pub fn on_rto(&mut self, flight: u32, mss: u32, first_timeout: bool) {
        if first_timeout {
            self.ssthresh = (flight / 2).max(2 * mss);
        }
        self.cwnd = mss;
        self.acked_in_avoidance = 0;
    }

    /// The loss was spurious (RFC 3522 detection): back to the window before the reduction (RFC 4015
    /// §3, the Eifel response).
    pub fn restore(&mut self, cwnd: u32, ssthresh: u32) {
        self.cwnd = self.cwnd.max(cwnd);
        self.ssthresh = ssthresh;
        self.acked_in_avoidance = 0;
    }

    /// Restart after an idle period longer than an RTO (RFC 5681 §4.1): cwnd = min(cwnd, IW).
    pub fn on_idle_restart(&mut self, mss: u32, initial_segments: u32) {
        self.cwnd = self.cwnd.min(initial_window(mss, initial_segments));
    }
}

fn initial_window(mss: u32, segments: u32) -> u32 {
    mss.saturating_mul(segments.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MSS: u32 = 1000;

    #[test]
    fn slow_start_grows_by_at_most_two_segments_per_ack() {
        let mut c = NewReno::new(MSS, 10);
        assert_eq!(c.cwnd(), 10 * MSS);
        c.on_ack(MSS, MSS);
        assert_eq!(c.cwnd(), 11 * MSS);
        c.on_ack(5 * MSS, MSS);
        assert_eq!(c.cwnd(), 13 * MSS);
    }

    #[test]
    fn congestion_avoidance_adds_one_segment_per_window() {
        let mut c = NewReno::new(MSS, 10);
        c.on_fast_loss(20 * MSS, MSS);
        assert_eq!((c.cwnd(), c.ssthresh()), (10 * MSS, 10 * MSS));
        for _ in 0..9 {
            c.on_ack(MSS, MSS);
        }
        assert_eq!(c.cwnd(), 10 * MSS);
        c.on_ack(MSS, MSS);
        assert_eq!(c.cwnd(), 11 * MSS);
    }

    #[test]
    fn loss_halves_flight_with_a_two_segment_floor() {
        let mut c = NewReno::new(MSS, 10);
        c.on_fast_loss(MSS, MSS);
        assert_eq!(c.ssthresh(), 2 * MSS);
        c.on_recovery_exit(0, MSS);
        assert_eq!(c.cwnd(), MSS);
    }

    #[test]
    fn timeout_collapses_to_one_segment_and_keeps_ssthresh_when_repeated() {
        let mut c = NewReno::new(MSS, 10);
        c.on_rto(40 * MSS, MSS, true);
        assert_eq!((c.cwnd(), c.ssthresh()), (MSS, 20 * MSS));
        c.on_rto(MSS, MSS, false);
        assert_eq!((c.cwnd(), c.ssthresh()), (MSS, 20 * MSS));
        c.on_ack(MSS, MSS);
        assert_eq!(c.cwnd(), 2 * MSS);
    }

    #[test]
    fn idle_restart_caps_at_the_initial_window() {
        let mut c = NewReno::new(MSS, 10);
        for _ in 0..20 {
            c.on_ack(2 * MSS, MSS);
        }
        c.on_idle_restart(MSS, 10);
        assert_eq!(c.cwnd(), 10 * MSS);
    }
}
