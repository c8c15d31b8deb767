//! The active side's first FPDU, held for a short while after the MPA Reply, so that a responder which
//! switches its socket to the data path only after sending the Reply does not lose it.
//!
//! RFC 5044 §7.1.2 lets the initiator send its first FPDU as soon as it has the Reply (the responder, not
//! the initiator, must wait: it sends nothing before the initiator's first FPDU, or the RTR of RFC 6581 §9).
//! Linux siw (6.1, `siw_cm.c`) as a responder breaks that assumption: `siw_accept()` puts the endpoint in
//! `SIW_EPSTATE_RDMA_MODE`, sends the Reply (`siw_send_mpareqrep()`), and only then points the socket's
//! `sk_data_ready` at the data path (`siw_qp_socket_assoc()`, or `siw_sk_assign_rtr_upcalls()` when it waits
//! for an RTR). Bytes that arrive in between reach `siw_cm_llp_data_ready()`, which ignores data in
//! `RDMA_MODE`; they stay in the socket until *more* data arrives and wakes the data path. An application
//! whose first message waits for an answer (rping's advertisement, an RTR) then waits forever.
//!
//! No packet from siw marks the switch (the Reply is its last segment, and our ACK of it says nothing about
//! siw's state), so the hold is a short delay, counted from the Reply's arrival at our side, which is at least
//! one one-way trip after siw started its window. Every application gets it (the CM holds whatever the
//! connection would send first: the RTR or the queue pair's first FPDUs), and it applies whatever the mode:
//! with or without RTR. A FIN waits too, until one more hold after the first FPDUs went out, so that siw has
//! finished its accept (and, with an RTR, reported ESTABLISHED) before it sees the FIN (`HoldPhase::Fin`).
//! The passive side never holds (it already waits for the initiator's first FPDU).
//!
//! How long: the window is a handful of instructions between two calls in `siw_accept()`, on the thread that
//! sent the Reply. It is microseconds on hardware or KVM, and under TCG on a loaded host it stretches to a
//! scheduling quantum. Measured in the siw VM (TCG, 2 busy host cores; docs/interop.md): see
//! [`FIRST_FPDU_HOLD`]. The hold costs one delay per connection set-up on the active side, before its first
//! message; it adds nothing once the connection runs. `soft-rdmad --first-fpdu-hold-ms` changes it (0: off).

use std::time::{Duration, Instant};

use bytes::Bytes;

/// How long the active side holds its first FPDU after the Reply, and its FIN after the first FPDU (see the
/// module documentation and docs/interop.md for the measurement).
pub const FIRST_FPDU_HOLD: Duration = Duration::from_millis(20);

/// What an initiator's connection holds back, and until when.
#[derive(Debug)]
pub struct FirstFpduHold {
    phase: HoldPhase,
    /// FPDUs (an RTR) the CM sent during [`HoldPhase::FirstFpdu`], in order.
    held: Vec<Bytes>,
    /// A Disconnect came: the FIN waits for the end of [`HoldPhase::Fin`].
    close: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HoldPhase {
    /// After the Reply: nothing goes out until then.
    FirstFpdu { until: Instant },
    /// After the first FPDUs went out: data flows, but a FIN waits until then, so that siw has reported
    /// ESTABLISHED (for an RTR: `siw_rtr_data_ready()`) before it sees the FIN. A FIN in the same segment as
    /// the RTR reaches siw's state-change upcall before its data-ready upcall, and iw_cm 6.1 then trips a
    /// `BUG_ON` (iwcm.c, `cm_conn_est_handler()`: ESTABLISHED in a state other than CONN_RECV): seen in
    /// this suite's peer-to-peer scenario before the FIN had a hold of its own.
    Fin { until: Instant },
}

/// What the CM does when a hold's deadline passes.
#[derive(Debug, PartialEq, Eq)]
pub struct HoldStep {
    /// Send these now, in order.
    pub send: Vec<Bytes>,
    /// Then close (FIN).
    pub close: bool,
    /// The hold goes on (its next deadline is [`FirstFpduHold::until`]).
    pub keep: bool,
}

impl FirstFpduHold {
    /// A hold starting at `now` (the Reply's arrival); none if `hold` is zero.
    pub fn start(now: Instant, hold: Duration) -> Option<FirstFpduHold> {
        (!hold.is_zero()).then(|| FirstFpduHold {
            phase: HoldPhase::FirstFpdu { until: now + hold },
            held: Vec::new(),
            close: false,
        })
    }

    /// The current deadline.
    pub fn until(&self) -> Instant {
        match self.phase {
            HoldPhase::FirstFpdu { until } | HoldPhase::Fin { until } => until,
        }
    }

    /// Whether FPDUs are held now (else only a FIN is).
    pub fn holds_data(&self) -> bool {
        matches!(self.phase, HoldPhase::FirstFpdu { .. })
    }

    /// Keeps `data` until the first phase ends.
    pub fn keep(&mut self, data: Bytes) {
        self.held.push(data);
    }

    /// The connection is to close (FIN) once the hold ends, after what it kept.
    pub fn close_after(&mut self) {
        self.close = true;
    }

    /// The deadline has passed (`now`): the first phase hands over what it kept and starts the FIN's
    /// phase, which lasts `hold` more; the FIN's phase ends the hold, closing if a Disconnect came.
    pub fn on_deadline(&mut self, now: Instant, hold: Duration) -> HoldStep {
        match self.phase {
            HoldPhase::FirstFpdu { .. } => {
                self.phase = HoldPhase::Fin { until: now + hold };
                HoldStep {
                    send: std::mem::take(&mut self.held),
                    close: false,
                    keep: true,
                }
            }
            HoldPhase::Fin { .. } => HoldStep {
                send: Vec::new(),
                close: self.close,
                keep: false,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fpdus_then_the_fin_each_after_a_hold() {
        let t0 = Instant::now();
        let hold = Duration::from_millis(5);
        assert!(FirstFpduHold::start(t0, Duration::ZERO).is_none());
        let mut h = FirstFpduHold::start(t0, hold).unwrap();
        assert_eq!(h.until(), t0 + hold);
        assert!(h.holds_data());
        h.keep(Bytes::from_static(b"rtr"));
        h.keep(Bytes::from_static(b"send"));
        h.close_after();
        let t1 = t0 + hold;
        assert_eq!(
            h.on_deadline(t1, hold),
            HoldStep {
                send: vec![Bytes::from_static(b"rtr"), Bytes::from_static(b"send")],
                close: false,
                keep: true
            }
        );
        assert!(!h.holds_data(), "data flows in the FIN's phase");
        assert_eq!(h.until(), t1 + hold);
        assert_eq!(
            h.on_deadline(t1 + hold, hold),
            HoldStep {
                send: vec![],
                close: true,
                keep: false
            }
        );
    }

    #[test]
    fn no_disconnect_no_close() {
        let t0 = Instant::now();
        let hold = Duration::from_millis(5);
        let mut h = FirstFpduHold::start(t0, hold).unwrap();
        assert!(h.on_deadline(t0 + hold, hold).send.is_empty());
        assert_eq!(
            h.on_deadline(t0 + hold + hold, hold),
            HoldStep {
                send: vec![],
                close: false,
                keep: false
            }
        );
    }
}
