//! One TCP connection of soft-rdma's, from the MPA handshake to its close: [`Connection`] owns its phase
//! ([`Phase`]: the handshake's side and step, FPDU mode, the hand-off, the close), the handshake machines
//! ([`super::mpa`]), FPDU intake and the first-FPDU hold, and says what the bytes it received mean as a
//! [`ConnectionEvent`]. The endpoint (the connection manager, [`super::cm`]) keeps one per TCP connection and
//! acts on the events for its connectors and listeners; it never reads stream bytes itself.
//!
//! FPDU mode is the part both data paths run: the daemon's connection manager (XDP mode, and kernel mode
//! with `--data-path daemon`) through [`Connection`], and the client library's in-process data path
//! (kernel mode, after the hand-off: a handed-off connection is in FPDU mode for good) through its
//! [`FpduConnection`] directly. They differ only in where the output goes (the transport's commands, or the
//! socket the client holds). [`FpduConnection`] owns what the two paths must agree on:
//! - the inbound side ([`FpduReceiver`]: FPDUs, the CRC, the RTR, the passive side's hold until the
//!   initiator's first FPDU, RFC 5044 §7.1 and RFC 6581 §9), fed through [`FpduConnection::on_bytes`];
//! - the active side's first-FPDU hold ([`FirstFpduHold`]: siw's responder race), through which every byte
//!   it sends passes ([`FpduConnection::hold_or_send`]);
//! - how the stream ends ([`StreamEnd`]): a peer's Terminate closes with a FIN, a rule the peer broke sends
//!   our Terminate (RFC 5040 §4.8) after the queue pair completed what was outstanding, and drops what the
//!   hold kept.
//!
//! What one FPDU-mode call saw comes back as a [`FpduStep`]; the driver acts on it (completes the passive
//! Accept, counts dropped messages, closes the connection).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use soft_rdma_common::wire::TerminateCause;
use soft_rdma_common::wire::fpdu::max_ulpdu_for;

use super::datapath::DataPath;
use super::first_fpdu::{FirstFpduHold, HoldStep};
use super::fpdu_stream::{FpduEnd, FpduProgress, FpduReceiver};
use super::framing::terminate_fpdu;
use super::ids::{ConnectorId, ListenerId};
use super::mpa::{self, MpaError, MpaInitiator, MpaOffer, MpaResponder, Negotiated, ReplyOutcome};
use super::requests::HandOff;
use super::verbs::QueuePairId;

/// Where a TCP connection stands, and so where its bytes go.
#[derive(Debug)]
pub enum Phase {
    /// Active: TCP connecting; the Request goes out on `Connected`.
    TcpConnecting { initiator: MpaInitiator, request: Bytes },
    /// Active: Request sent, reading the Reply (RFC 5044 §7.1).
    AwaitingReply { initiator: MpaInitiator },
    /// Passive: TCP accepted, reading the Request.
    AwaitingRequest {
        listener: ListenerId,
        responder: MpaResponder,
    },
    /// Passive: Request read; queued at the listener or attached to a connector.
    Offered { listener: ListenerId },
    /// FPDU mode.
    Established,
    /// FPDU mode, the socket on its way to the client (`cm::hand_off`): bytes are kept for it.
    HandingOff,
    /// The client runs the connection; the transport keeps the daemon's copy of the socket until Close.
    HandedOff,
    /// Closing (a Reject or Terminate was sent; waiting for the transport to report Closed).
    Closing,
    /// A reject Reply was sent: the initiator closes first, or the FIN goes out at `until`
    /// ([`REJECT_LINGER`]). Bytes that arrive meanwhile are dropped.
    Lingering { until: Instant },
}

/// How long a responder that sent a reject Reply (RFC 5044 §7.1.2, R=1) waits for the initiator to close
/// before closing itself. Closing at once races the Reply at kernel siw: siw reads the Reply from a work
/// queue and, if the FIN's work runs first, reports the reject to rdma_cm as a reset without its private
/// data (siw_cm.c, `SIW_CM_WORK_PEER_CLOSE` in `SIW_EPSTATE_AWAIT_MPAREP`). siw itself closes right after
/// reading the Reply, so the wait normally ends at once.
pub const REJECT_LINGER: Duration = Duration::from_secs(2);

/// MSS assumed until the transport reports the path's (IPv4 over a 1500-byte MTU, with timestamps).
pub const DEFAULT_MSS: usize = 1448;

/// The endpoint's settings a connection's byte rules follow.
#[derive(Clone, Copy, Debug)]
pub struct StreamRules {
    /// The largest inbound ULPDU accepted once connected (RFC 5044 §4.1); a longer one is terminated.
    pub max_inbound_ulpdu: usize,
    /// CRC32c required of every peer (`--crc-required`), whatever the Reply says (RFC 5044 §7.1).
    pub crc_required: bool,
    /// How long the active side holds its first FPDU after the Reply ([`super::first_fpdu`]); zero: no hold.
    pub first_fpdu_hold: Duration,
}

/// One TCP connection: whose it is, its phase, and its FPDU mode.
#[derive(Debug)]
pub struct Connection {
    /// The connector it carries, once it has one (an offer waiting at a listener has none).
    pub connector: Option<ConnectorId>,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub phase: Phase,
    /// FPDU mode: the inbound side and the first-FPDU hold, as the client's in-process data path runs them.
    pub fpdu: FpduConnection,
    /// Passive side: the Request this connection carries, until it is answered.
    pub offer: Option<MpaOffer>,
    /// The largest ULPDU this side sends: one FPDU per TCP segment (RFC 5044 §4.1).
    pub max_ulpdu: usize,
    /// Bytes handed to the transport and not yet reported written.
    pub in_flight: usize,
}

/// What the bytes a connection received mean for its endpoint.
#[derive(Debug)]
pub enum ConnectionEvent {
    /// Nothing to act on: the handshake wants more, the bytes are kept for the client, or the phase drops
    /// them.
    Nothing,
    /// Active side: the Reply accepted the connection (RFC 5044 §7.1.2). The connection is in FPDU mode
    /// (its first-FPDU hold started); `leftover` is what followed the Reply, for FPDU intake once the
    /// connector has been told.
    ReplyAccepted {
        negotiated: Negotiated,
        private_data: Bytes,
        leftover: Bytes,
    },
    /// Active side: the peer rejected the connection (a Reply with R=1).
    ReplyRejected { private_data: Bytes },
    /// Active side: the Reply broke the handshake's rules. `terminate`: the Terminate to send before the FIN
    /// (RFC 6581 §9, in FPDU mode, with a CRC if the Reply or we asked for one); none: reset.
    ReplyRefused {
        error: MpaError,
        terminate: Option<Bytes>,
    },
    /// Passive side: the initiator's Request arrived.
    Offer { listener: ListenerId, offer: MpaOffer },
    /// Passive side: the Request asks for markers, which soft-rdma does not do: `reply` (R=1) goes out,
    /// then a FIN (as siw answers M=1, docs/iwarp-wire.md §1).
    MarkersRefused { reply: Bytes },
    /// Passive side: the Request broke the handshake's rules: reset.
    RequestRefused { error: MpaError },
    /// Passive side: the initiator sent bytes between its Request and our Reply (RFC 5044 §7.1.2, siw:
    /// -EPROTO): the offer is withdrawn and the connection reset.
    DataBeforeReply { listener: ListenerId, error: MpaError },
    /// FPDU mode: what the intake saw.
    Fpdu(FpduStep),
}

impl Connection {
    /// A connection in `phase`, carrying `connector` (if it has one yet).
    pub fn new(connector: Option<ConnectorId>, local: SocketAddr, remote: SocketAddr, phase: Phase) -> Self {
        Connection {
            connector,
            local,
            remote,
            phase,
            fpdu: FpduConnection::default(),
            offer: None,
            max_ulpdu: max_ulpdu_for(DEFAULT_MSS),
            in_flight: 0,
        }
    }

    /// The deadline the connection has in its phase, if any: a responder's wait for the Request, a reject's
    /// linger, the first-FPDU hold.
    pub fn deadline(&self) -> Option<Instant> {
        match &self.phase {
            Phase::AwaitingRequest { responder, .. } => responder.deadline(),
            Phase::Lingering { until } => Some(*until),
            Phase::Established | Phase::Closing => self.fpdu.deadline(),
            _ => None,
        }
    }

    /// Bytes the transport received at `now`. In FPDU mode they go to `qp` (in `dp`), unless
    /// `keep_for_client`: then, as while the socket is handed off, they are kept for the client's data path,
    /// which takes them with the socket.
    pub fn on_bytes(
        &mut self,
        now: Instant,
        data: &[u8],
        rules: &StreamRules,
        keep_for_client: bool,
        dp: &mut DataPath,
        qp: Option<QueuePairId>,
    ) -> ConnectionEvent {
        match &mut self.phase {
            Phase::AwaitingReply { initiator } => {
                let outcome = initiator.on_bytes(data);
                let crc_in_use = initiator.crc_in_use();
                if self.connector.is_none() {
                    return ConnectionEvent::Nothing;
                }
                match outcome {
                    Ok(None) => ConnectionEvent::Nothing,
                    Ok(Some(ReplyOutcome::Accepted {
                        negotiated,
                        private_data,
                        leftover,
                    })) => {
                        self.phase = Phase::Established;
                        self.fpdu.rx.crc = negotiated.crc || rules.crc_required;
                        let hold = rules.first_fpdu_hold;
                        self.fpdu.start_hold(now, hold, hold);
                        ConnectionEvent::ReplyAccepted {
                            negotiated,
                            private_data,
                            leftover,
                        }
                    }
                    Ok(Some(ReplyOutcome::Rejected { private_data })) => {
                        ConnectionEvent::ReplyRejected { private_data }
                    }
                    Err(error) => {
                        let terminate = error
                            .terminate_cause()
                            .map(|cause| terminate_fpdu(cause, crc_in_use));
                        ConnectionEvent::ReplyRefused { error, terminate }
                    }
                }
            }
            Phase::AwaitingRequest { listener, responder } => {
                let listener = *listener;
                match responder.on_bytes(data) {
                    Ok(None) => ConnectionEvent::Nothing,
                    Ok(Some(offer)) => ConnectionEvent::Offer { listener, offer },
                    Err(MpaError::MarkersRequested { revision }) => ConnectionEvent::MarkersRefused {
                        reply: mpa::reject_reply(revision, false, &[]),
                    },
                    Err(error) => ConnectionEvent::RequestRefused { error },
                }
            }
            Phase::Offered { listener } => ConnectionEvent::DataBeforeReply {
                listener: *listener,
                error: MpaError::DataBeforeReply { bytes: data.len() },
            },
            Phase::Established if !keep_for_client => {
                ConnectionEvent::Fpdu(self.fpdu.on_bytes(data, rules.max_inbound_ulpdu, dp, qp))
            }
            Phase::Established | Phase::HandingOff => {
                self.fpdu.rx.rx.extend_from_slice(data);
                ConnectionEvent::Nothing
            }
            Phase::HandedOff | Phase::TcpConnecting { .. } | Phase::Closing | Phase::Lingering { .. } => {
                ConnectionEvent::Nothing
            }
        }
    }
}

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
