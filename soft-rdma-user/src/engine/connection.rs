//! One connection in FPDU mode, wherever its data path runs: the daemon's connection manager (XDP mode, and
//! kernel mode with `--data-path daemon`) and the client library's in-process data path (kernel mode, after
//! the hand-off) both drive this one type, and differ only in where its output goes (the transport's
//! commands, or the socket the client holds).
//!
//! It owns what the two paths must agree on:
//! - the inbound side ([`FpduReceiver`]: FPDUs, the CRC, the RTR, the passive side's hold until the
//!   initiator's first FPDU, RFC 5044 §7.1 and RFC 6581 §9), fed through [`FpduConnection::on_bytes`];
//! - the active side's first-FPDU hold ([`FirstFpduHold`]: siw's responder race), through which every byte
//!   it sends passes ([`FpduConnection::hold_or_send`]);
//! - how the stream ends ([`StreamEnd`]): a peer's Terminate closes with a FIN, a rule the peer broke sends
//!   our Terminate (RFC 5040 §4.8) after the queue pair completed what was outstanding, and drops what the
//!   hold kept.
//!
//! What a call saw comes back as a [`FpduStep`]; the driver acts on it (completes the passive Accept,
//! counts dropped messages, closes the connection).

use std::time::{Duration, Instant};

use bytes::Bytes;
use soft_rdma_common::wire::TerminateCause;

use super::datapath::DataPath;
use super::first_fpdu::{FirstFpduHold, HoldStep};
use super::fpdu_stream::{FpduEnd, FpduProgress, FpduReceiver};
use super::framing::terminate_fpdu;
use super::requests::HandOff;
use super::verbs::QueuePairId;

/// One FPDU-mode connection: its inbound side and its first-FPDU hold.
#[derive(Debug, Default)]
pub struct FpduConnection {
    /// The inbound side (buffer, CRC, the RTR and the passive side's first-FPDU rule).
    pub rx: FpduReceiver,
    /// The active side, just after the Reply: what it sends first waits until the hold ends.
    hold: Option<FirstFpduHold>,
    /// How long the hold's FIN phase lasts ([`FirstFpduHold::on_deadline`]).
    fin_hold: Duration,
}

/// What one [`FpduConnection::on_bytes`] saw, for the driver to act on.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct FpduStep {
    /// FPDUs to send now (already past the hold): a Read RTR's answer on a connection without a queue pair,
    /// or our Terminate.
    pub send: Vec<Bytes>,
    /// The passive side's Accept completes (peer-to-peer mode: the initiator's RTR arrived, RFC 6581 §9).
    pub accept_complete: bool,
    /// Data messages that arrived with no queue pair to take them (dropped).
    pub dropped: u64,
    /// The stream ended: the driver closes the connection (after sending `send`).
    pub end: Option<StreamEnd>,
}

/// How an FPDU-mode stream ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamEnd {
    /// The peer sent a Terminate (its cause, if it parsed): close with a FIN.
    PeerTerminated(Option<TerminateCause>),
    /// A rule the peer broke: our Terminate (none: the error has no wire cause) is in [`FpduStep::send`],
    /// the queue pair is in Error, and what the first-FPDU hold kept was dropped.
    Terminated(Option<TerminateCause>),
}

impl FpduConnection {
    /// A connection entering FPDU mode. `crc`: CRC32c negotiated (RFC 5044 §4.4).
    pub fn new(crc: bool) -> Self {
        FpduConnection {
            rx: FpduReceiver::new(crc),
            hold: None,
            fin_hold: Duration::ZERO,
        }
    }

    /// The connection as a hand-off carries it to the client (kernel-TCP mode, [`HandOff`]): the CRC, the
    /// passive side's wait for the RTR and for the first FPDU, what is left of the first-FPDU hold (from
    /// `now`), and the stream bytes the daemon read but did not process, which [`Self::on_bytes`] takes
    /// first.
    pub fn handed_off(h: &HandOff, now: Instant) -> Self {
        let mut c = FpduConnection::new(h.crc);
        c.rx.awaiting_rtr = h.awaiting_rtr;
        c.rx.tx_held = h.tx_held;
        c.start_hold(
            now,
            Duration::from_micros(h.first_fpdu_hold_us),
            Duration::from_micros(h.fin_hold_us),
        );
        c
    }

    /// Starts the active side's first-FPDU hold at `now` for `hold` (zero: none), whose FIN phase lasts
    /// `fin_hold` ([`super::first_fpdu`]).
    pub fn start_hold(&mut self, now: Instant, hold: Duration, fin_hold: Duration) {
        self.hold = FirstFpduHold::start(now, hold);
        self.fin_hold = fin_hold;
    }

    /// The hold, if one is on (its deadline; the hand-off takes it to the client).
    pub fn hold(&self) -> Option<&FirstFpduHold> {
        self.hold.as_ref()
    }

    /// Takes the hold away (the hand-off carries its remaining time to the client).
    pub fn take_hold(&mut self) -> Option<FirstFpduHold> {
        self.hold.take()
    }

    /// The hold's next deadline, if one is on.
    pub fn deadline(&self) -> Option<Instant> {
        self.hold.as_ref().map(FirstFpduHold::until)
    }

    /// Whether the first-FPDU hold is on and keeps what is sent ([`Self::hold_or_send`] keeps it).
    pub fn holds_data(&self) -> bool {
        self.hold.as_ref().is_some_and(FirstFpduHold::holds_data)
    }

    /// Whether the queue pair may add FPDUs now: not before the initiator's first FPDU on the passive side
    /// (RFC 5044 §7.1), and not while the hold keeps data.
    pub fn may_transmit(&self) -> bool {
        !self.rx.tx_held && !self.holds_data()
    }

    /// Bytes to send: kept while the first-FPDU hold holds data (`None`), else given back to be sent now.
    pub fn hold_or_send(&mut self, data: Bytes) -> Option<Bytes> {
        match &mut self.hold {
            Some(hold) if hold.holds_data() => {
                hold.keep(data);
                None
            }
            _ => Some(data),
        }
    }

    /// This side closes: the FIN waits for the hold, if one is on.
    pub fn close_after_hold(&mut self) {
        if let Some(hold) = &mut self.hold {
            hold.close_after();
        }
    }

    /// The stream ends at once (our Terminate, an abort): what the hold kept is dropped with it.
    pub fn drop_hold(&mut self) {
        self.hold = None;
    }

    /// The hold's deadline passed (`now`): what it kept to send, and whether the FIN goes now. `None`: no hold
    /// is on. The driver wakes the queue pair after it: it was passed over while its data was held.
    pub fn on_hold_deadline(&mut self, now: Instant) -> Option<HoldStep> {
        let step = self.hold.as_mut()?.on_deadline(now, self.fin_hold);
        if !step.keep {
            self.hold = None;
        }
        Some(step)
    }

    /// Stream bytes: every whole FPDU goes to `qp` (in `dp`), inbound ULPDUs up to `max_inbound_ulpdu`.
    /// Bytes after the stream's end are not looked at.
    pub fn on_bytes(
        &mut self,
        data: &[u8],
        max_inbound_ulpdu: usize,
        dp: &mut DataPath,
        qp: Option<QueuePairId>,
    ) -> FpduStep {
        let mut progress = FpduProgress::default();
        let end = self.rx.on_bytes(data, max_inbound_ulpdu, dp, qp, &mut progress);
        let mut step = FpduStep {
            send: Vec::new(),
            accept_complete: progress.accept_complete,
            dropped: progress.dropped,
            end: None,
        };
        for reply in progress.reply {
            step.send.extend(self.hold_or_send(reply));
        }
        step.end = match end {
            Ok(()) => None,
            Err(FpduEnd::PeerTerminated(cause)) => Some(StreamEnd::PeerTerminated(cause)),
            Err(FpduEnd::Terminate(cause)) => Some(self.terminate(cause, dp, qp, &mut step.send)),
        };
        step
    }

    /// Ends the stream with our Terminate carrying `cause` (RFC 5040 §4.8): the queue pair moves to Error
    /// (it completes what was outstanding), what the hold kept is dropped, and the Terminate joins `send`.
    pub fn terminate(
        &mut self,
        cause: Option<TerminateCause>,
        dp: &mut DataPath,
        qp: Option<QueuePairId>,
        send: &mut Vec<Bytes>,
    ) -> StreamEnd {
        self.hold = None;
        if let Some(cause) = cause {
            if let Some(qp) = qp {
                dp.terminated_locally(qp, cause);
            }
            send.push(terminate_fpdu(cause, self.rx.crc));
        }
        StreamEnd::Terminated(cause)
    }
}
