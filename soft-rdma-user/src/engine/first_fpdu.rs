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
//! connection would send first: the RTR, the queue pair's first FPDUs, or a FIN, which siw would likewise see
//! while still completing its accept), and it applies whatever the mode: with or without RTR. The passive
//! side never holds (it already waits for the initiator's first FPDU).
//!
//! How long: the window is a handful of instructions between two calls in `siw_accept()`, on the thread that
//! sent the Reply. It is microseconds on hardware or KVM, and under TCG on a loaded host it stretches to a
//! scheduling quantum. Measured in the siw VM (TCG, 2 busy host cores; docs/interop.md): see
//! [`FIRST_FPDU_HOLD`]. The hold costs one delay per connection set-up on the active side, before its first
//! message; it adds nothing once the connection runs. `soft-rdmad --first-fpdu-hold-ms` changes it (0: off).

use std::time::{Duration, Instant};

use bytes::Bytes;

/// How long the active side holds its first FPDU after the Reply (see the module documentation and
/// docs/interop.md for the measurement).
pub const FIRST_FPDU_HOLD: Duration = Duration::from_millis(20);

/// What an initiator's connection holds back until `until`.
#[derive(Debug)]
pub struct FirstFpduHold {
    pub until: Instant,
    /// FPDUs (an RTR) the CM sent meanwhile, in order.
    held: Vec<Bytes>,
    /// A Disconnect came during the hold: the FIN follows what was held.
    close: bool,
}

impl FirstFpduHold {
    /// A hold starting at `now` (the Reply's arrival); none if `hold` is zero.
    pub fn start(now: Instant, hold: Duration) -> Option<FirstFpduHold> {
        (!hold.is_zero()).then(|| FirstFpduHold {
            until: now + hold,
            held: Vec::new(),
            close: false,
        })
    }

    /// Keeps `data` until the hold ends.
    pub fn keep(&mut self, data: Bytes) {
        self.held.push(data);
    }

    /// The connection is to close (FIN) once the hold ends, after what it kept.
    pub fn close_after(&mut self) {
        self.close = true;
    }

    /// The hold has ended: what was kept, to send now, in order, and whether a FIN follows.
    pub fn release(self) -> (Vec<Bytes>, bool) {
        (self.held, self.close)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_in_order_and_zero_means_no_hold() {
        let t0 = Instant::now();
        assert!(FirstFpduHold::start(t0, Duration::ZERO).is_none());
        let mut h = FirstFpduHold::start(t0, Duration::from_millis(5)).unwrap();
        assert_eq!(h.until, t0 + Duration::from_millis(5));
        h.keep(Bytes::from_static(b"rtr"));
        h.keep(Bytes::from_static(b"send"));
        h.close_after();
        assert_eq!(
            h.release(),
            (
                vec![Bytes::from_static(b"rtr"), Bytes::from_static(b"send")],
                true
            )
        );
    }
}
