//! One connection's inbound side in FPDU mode, wherever the data path runs: the daemon's connection manager
//! (XDP mode, and kernel mode with `--data-path daemon`) and the client library's in-process data path
//! (kernel mode, after the hand-off: `crate::client`) feed it the bytes of the TCP stream, and it cuts them
//! into FPDUs ([`super::framing`]: length, CRC), parses each message, and hands it to the connection's queue
//! pair ([`DataPath::on_message`]). The rules it applies, the same on both paths:
//!
//! - The passive side sends nothing before the initiator's first FPDU (RFC 5044 §7.1):
//!   [`FpduReceiver::tx_held`] ends with it.
//! - With RFC 6581 peer-to-peer mode, the initiator's first FPDU is the RTR (RFC 6581 §9): it completes the
//!   passive side's Accept ([`FpduProgress::accept_complete`]), and a Read RTR is answered with a
//!   zero-length Read Response (by the queue pair, or here when there is none: siw waits for it).
//! - A Terminate from the peer (RFC 5040 §4.8) ends the stream ([`FpduEnd::PeerTerminated`]); a malformed
//!   FPDU, a bad CRC or a data-path rule the peer broke ends it with a Terminate of ours
//!   ([`FpduEnd::Terminate`]), after the queue pair completed what was outstanding with the matching status.

use bytes::{Bytes, BytesMut};
use soft_rdma_common::wire::TerminateCause;
use soft_rdma_common::wire::rdmap::RdmapOpcode;
use tracing::debug;

use super::datapath::DataPath;
use super::framing::{self, read_rtr_response};
use super::verbs::QueuePairId;

/// The inbound state of one FPDU-mode connection.
#[derive(Debug, Default)]
pub struct FpduReceiver {
    /// Bytes received and not yet cut into FPDUs.
    pub rx: BytesMut,
    /// CRC32c negotiated (RFC 5044 §4.4): every inbound FPDU carries one and it is checked.
    pub crc: bool,
    /// Passive side in peer-to-peer mode: the Accept completes with the initiator's first FPDU (its RTR).
    pub awaiting_rtr: bool,
    /// Passive side: nothing may be sent before the initiator's first FPDU (RFC 5044 §7.1).
    pub tx_held: bool,
}

/// What [`FpduReceiver::on_bytes`] saw, for its caller to act on.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct FpduProgress {
    /// The initiator's first FPDU arrived: the passive side may send from now on.
    pub first_fpdu: bool,
    /// The passive side's Accept completes (peer-to-peer mode: the RTR arrived).
    pub accept_complete: bool,
    /// Data messages on a connection without a queue pair (dropped).
    pub dropped: u64,
    /// FPDUs to send back at once (a Read RTR's response on a connection without a queue pair).
    pub reply: Vec<Bytes>,
}

/// Why the stream ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FpduEnd {
    /// The peer sent a Terminate (its cause, if it parsed): close with a FIN.
    PeerTerminated(Option<TerminateCause>),
    /// Send a Terminate with this cause (none: the error has no wire cause), then close. The caller moves the
    /// queue pair to Error ([`DataPath::terminated_locally`]) so that it completes what was outstanding.
    Terminate(Option<TerminateCause>),
}

impl FpduReceiver {
    /// The state of a connection that reached FPDU mode.
    pub fn new(crc: bool) -> Self {
        FpduReceiver {
            crc,
            ..FpduReceiver::default()
        }
    }

    /// Feeds `data`, then every whole FPDU goes to `qp` (in `dp`). `Err`: the stream ends (see
    /// [`FpduEnd`]); bytes after the end are not looked at.
    pub fn on_bytes(
        &mut self,
        data: &[u8],
        max_ulpdu: usize,
        dp: &mut DataPath,
        qp: Option<QueuePairId>,
        progress: &mut FpduProgress,
    ) -> Result<(), FpduEnd> {
        self.rx.extend_from_slice(data);
        self.drain(max_ulpdu, dp, qp, progress)
    }

    /// [`Self::on_bytes`] with nothing new: the FPDUs already buffered (the bytes a hand-off carried).
    pub fn drain(
        &mut self,
        max_ulpdu: usize,
        dp: &mut DataPath,
        qp: Option<QueuePairId>,
        progress: &mut FpduProgress,
    ) -> Result<(), FpduEnd> {
        loop {
            let frame = match framing::take_frame(&mut self.rx, max_ulpdu, self.crc) {
                Ok(Some(frame)) => frame,
                Ok(None) => return Ok(()),
                Err(cause) => return Err(FpduEnd::Terminate(cause)),
            };
            let msg = match framing::parse_message(&frame, max_ulpdu) {
                Ok(m) => m,
                Err(cause) => return Err(FpduEnd::Terminate(cause)),
            };
            if std::mem::take(&mut self.tx_held) {
                // The initiator's first FPDU: the responder may send from now on (RFC 5044 §7.1).
                progress.first_fpdu = true;
                if let Some(qp) = qp {
                    dp.wake(qp);
                }
            }
            if msg.opcode == RdmapOpcode::Terminate {
                let terminate = msg.terminate().ok();
                if let (Some(qp), Some(t)) = (qp, &terminate) {
                    dp.peer_terminated(qp, t);
                }
                return Err(FpduEnd::PeerTerminated(terminate.map(|t| t.cause)));
            }
            if std::mem::take(&mut self.awaiting_rtr) {
                // The initiator called CompleteConnect: the passive Accept completes (RFC 6581 §9).
                progress.accept_complete = true;
                if let Some(kind) = framing::is_rtr(&msg) {
                    match qp {
                        // A Read RTR is answered with a zero-length Read Response (siw waits for it).
                        Some(qp) => {
                            if let Err(cause) = dp.rtr_received(qp, &msg) {
                                return Err(FpduEnd::Terminate(Some(cause)));
                            }
                        }
                        None if kind == framing::Rtr::Read => {
                            if let Ok(rr) = msg.read_request() {
                                progress.reply.push(read_rtr_response(&rr, self.crc));
                            }
                        }
                        None => {}
                    }
                    continue;
                }
            }
            match qp {
                Some(qp) => {
                    if let Err(cause) = dp.on_message(qp, &msg) {
                        return Err(FpduEnd::Terminate(Some(cause)));
                    }
                }
                None => {
                    progress.dropped += 1;
                    debug!(opcode = ?msg.opcode, "data message on a connection without a queue pair; dropped");
                }
            }
        }
    }
}
