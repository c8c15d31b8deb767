//! The MPA connection handshake (RFC 5044 §7.1, RFC 6581 §6-9), one per TCP connection, as two pure state
//! machines: [`MpaInitiator`] (active side: sends the Request, reads the Reply) and [`MpaResponder`] (passive
//! side: reads the Request, answers with [`MpaOffer::accept`] or [`MpaOffer::reject`]).
//!
//! They are fed bytes in any fragmentation. Bytes that follow the Reply in the same chunk (the responder's
//! first FPDUs) are handed back to the initiator as `leftover`, never dropped; bytes that follow the Request
//! before any Reply are a protocol violation the responder refuses (RFC 5044 §7.1.2). Defaults match Linux siw (docs/iwarp-wire.md §1-2):
//! Rev 2 with the enhanced word, Rev 1 Requests accepted, CRC only when a side asks, markers refused, private
//! data capped at 256 bytes on the wire. There is deliberately no timer on the Reply: the listener's
//! application may take as long as it likes to Accept (IND2Connector::Accept implementation notes); the
//! responder's wait for the Request after TCP accept is bounded (siw: 5 s).

use std::time::{Duration, Instant};

use bytes::Bytes;
use soft_rdma_common::wire::mpa::{EnhancedControl, MPA_INTEROP_PRIVATE_DATA, MpaKind, MpaRepr};
use soft_rdma_common::wire::terminate::{layer, llp_code, llp_type};
use soft_rdma_common::wire::{TerminateCause, WireError};

use super::framing::Rtr;
use super::requests::ReadLimits;
use crate::error::{Error, NdStatus};

/// MPA settings of one daemon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MpaConfig {
    /// Revision sent in Requests: 2 (RFC 6581) by default, 1 for peers that close on S=1.
    pub revision: u8,
    /// Ask for CRC32c even if the peer does not (if either side asks, both use it: RFC 5044 §7.1).
    pub crc_required: bool,
    /// Ask for / accept RFC 6581 peer-to-peer mode (an RTR lets the passive side learn CompleteConnect).
    pub peer_to_peer: bool,
    /// How long a responder waits for the Request after TCP accept (siw: 5 s).
    pub request_timeout: Duration,
}

impl Default for MpaConfig {
    fn default() -> Self {
        MpaConfig {
            revision: 2,
            crc_required: false,
            peer_to_peer: true,
            request_timeout: Duration::from_secs(5),
        }
    }
}

/// The largest private data an application may pass with this revision: 256 bytes on the wire (siw and
/// rdma_cm), minus the 4-byte RFC 6581 word with Rev 2 — MaxCallerData = MaxCalleeData = 252.
pub const fn max_private_data(revision: u8) -> usize {
    if revision >= 2 {
        MPA_INTEROP_PRIVATE_DATA - EnhancedControl::LEN
    } else {
        MPA_INTEROP_PRIVATE_DATA
    }
}

/// What a completed handshake agreed on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Negotiated {
    /// The revision both sides use (the Reply's).
    pub revision: u8,
    /// CRC32c in both directions.
    pub crc: bool,
    /// Peer-to-peer mode: the initiator sends an RTR before anything else, and the responder's Accept
    /// completes when it arrives.
    pub peer_to_peer: bool,
    /// Initiator: the RTR it will send. Responder: `None` (it accepts any type it offered).
    pub rtr: Option<Rtr>,
    /// The peer's IRD/ORD word, when it sent one.
    pub peer_word: Option<EnhancedControl>,
}

/// Why a handshake failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MpaError {
    /// A malformed frame.
    Wire(WireError),
    /// A Request where a Reply belongs, or the reverse.
    UnexpectedFrame,
    /// The peer asked for markers (M=1): nobody implements them; refused like siw does (R=1 Reply, with the
    /// revision of the frame that asked).
    MarkersRequested { revision: u8 },
    /// The initiator sent bytes after its Request, before any Reply. RFC 5044 §7.1.2: it cannot send FPDUs
    /// before it has the Reply (markers and CRC are not agreed until then); siw refuses such "extra data"
    /// with -EPROTO. Keeping them would also let a peer grow the responder's memory for as long as the
    /// application takes to Accept.
    DataBeforeReply { bytes: usize },
    /// A Reply with a higher revision than the Request, or S=1 on Rev 1.
    BadReplyRevision(u8),
    /// RFC 6581 §9: the responder offered no RTR type the initiator can send.
    NoMatchingRtr,
    /// RFC 6581 §9: the responder's ORD exceeds the initiator's IRD.
    InsufficientIrd { own_ird: u16, peer_ord: u16 },
    /// The responder did not receive a Request in time.
    RequestTimeout,
}

impl MpaError {
    /// The Terminate to send in FPDU mode (RFC 5044 §8, RFC 6581 §9), where one applies: only the initiator,
    /// after the Reply, terminates; everything before that is a close or an R=1 Reply.
    pub fn terminate_cause(&self) -> Option<TerminateCause> {
        let mpa = |code| Some(TerminateCause::new(layer::LLP, llp_type::MPA, code));
        match self {
            MpaError::NoMatchingRtr => mpa(llp_code::NO_MATCHING_RTR),
            MpaError::InsufficientIrd { .. } => mpa(llp_code::INSUFFICIENT_IRD),
            _ => None,
        }
    }
}

impl std::fmt::Display for MpaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MpaError::Wire(e) => write!(f, "malformed MPA frame: {e}"),
            MpaError::UnexpectedFrame => f.write_str("MPA frame of the wrong kind (Request vs Reply)"),
            MpaError::MarkersRequested { .. } => {
                f.write_str("peer requested MPA markers, which soft-rdma does not support")
            }
            MpaError::DataBeforeReply { bytes } => write!(
                f,
                "initiator sent {bytes} bytes after its MPA Request, before the Reply (RFC 5044 §7.1.2)"
            ),
            MpaError::BadReplyRevision(r) => write!(f, "MPA Reply revision {r} does not answer the Request"),
            MpaError::NoMatchingRtr => f.write_str("no RTR type in common with the responder (RFC 6581 §9)"),
            MpaError::InsufficientIrd { own_ird, peer_ord } => {
                write!(
                    f,
                    "responder ORD {peer_ord} exceeds our IRD {own_ird} (RFC 6581 §9)"
                )
            }
            MpaError::RequestTimeout => f.write_str("no MPA Request within the responder timeout"),
        }
    }
}

impl From<WireError> for MpaError {
    fn from(e: WireError) -> Self {
        MpaError::Wire(e)
    }
}

/// Collects one MPA frame from a byte stream.
#[derive(Debug, Default)]
struct FrameReader {
    buf: Vec<u8>,
}

impl FrameReader {
    /// Appends `data`; returns the whole frame and what followed it once the frame is complete.
    fn push(&mut self, data: &[u8]) -> Result<Option<(Vec<u8>, Bytes)>, WireError> {
        self.buf.extend_from_slice(data);
        let Some(len) = MpaRepr::frame_len(&self.buf)? else {
            return Ok(None);
        };
        if self.buf.len() < len {
            return Ok(None);
        }
        let leftover = Bytes::copy_from_slice(&self.buf[len..]);
        self.buf.truncate(len);
        Ok(Some((std::mem::take(&mut self.buf), leftover)))
    }
}

fn emit(repr: &MpaRepr<'_>) -> Bytes {
    let mut b = vec![0u8; repr.buffer_len()];
    repr.emit(&mut b)
        .expect("sized by buffer_len and validated by the caller");
    Bytes::from(b)
}

fn check_private_data(len: usize, revision: u8) -> Result<(), Error> {
    let max = max_private_data(revision);
    if len > max {
        return Err(Error::new(
            NdStatus::InvalidBufferSize,
            format!("{len} bytes of private data exceed the maximum of {max} (MPA Rev {revision})"),
        ));
    }
    Ok(())
}

fn word(limits: ReadLimits, p2p: bool, offer: (bool, bool, bool)) -> EnhancedControl {
    let field = |v: u32| v.min((EnhancedControl::NO_NEGOTIATION - 1) as u32) as u16;
    EnhancedControl {
        ird: field(limits.inbound),
        ord: field(limits.outbound),
        peer_to_peer: p2p,
        send_rtr: p2p && offer.0,
        write_rtr: p2p && offer.1,
        read_rtr: p2p && offer.2,
    }
}

/// The RTR types soft-rdma sends as initiator and accepts as responder: zero-length Write and Read
/// (like siw's responder, docs/iwarp-wire.md §2). A zero-length Send would consume a posted Receive.
const RTR_OFFER: (bool, bool, bool) = (false, true, true);

/// The initiator ("active side") of one handshake.
#[derive(Debug)]
pub struct MpaInitiator {
    reader: FrameReader,
    sent_revision: u8,
    sent_word: Option<EnhancedControl>,
    crc: bool,
    /// The C bit of the Reply, once one was read.
    reply_crc: bool,
    received_any: bool,
}

/// The Reply, as the initiator reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplyOutcome {
    Accepted {
        negotiated: Negotiated,
        private_data: Bytes,
        leftover: Bytes,
    },
    /// R=1 (RFC 5044 §7.1): the application's Connect completes with CONNECTION_REFUSED; the reject private
    /// data stays readable.
    Rejected { private_data: Bytes },
}

/// What the initiator makes of the TCP connection closing before a Reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InitiatorClosed {
    /// RFC 6581 §6 / docs/iwarp-wire.md §1: a responder without enhanced support closes on S=1; retry with Rev 1.
    RetryWithRevisionOne,
    /// The responder went away (CONNECTION_REFUSED to the application).
    Aborted,
}

impl MpaInitiator {
    /// Builds the Request for `limits` (already capped by the adapter) and `private_data`.
    /// INVALID_BUFFER_SIZE when the private data is longer than [`max_private_data`].
    pub fn new(config: &MpaConfig, limits: ReadLimits, private_data: &[u8]) -> Result<(Self, Bytes), Error> {
        let revision = config.revision.clamp(1, 2);
        check_private_data(private_data.len(), revision)?;
        let sent_word = (revision >= 2).then(|| word(limits, config.peer_to_peer, RTR_OFFER));
        let request = MpaRepr {
            kind: MpaKind::Request,
            markers: false,
            crc: config.crc_required,
            reject: false,
            revision,
            enhanced: sent_word,
            private_data,
        };
        let this = MpaInitiator {
            reader: FrameReader::default(),
            sent_revision: revision,
            sent_word,
            crc: config.crc_required,
            reply_crc: false,
            received_any: false,
        };
        Ok((this, emit(&request)))
    }

    /// Feeds bytes from the responder. `Ok(None)`: the Reply is not complete yet.
    pub fn on_bytes(&mut self, data: &[u8]) -> Result<Option<ReplyOutcome>, MpaError> {
        self.received_any |= !data.is_empty();
        let Some((frame, leftover)) = self.reader.push(data)? else {
            return Ok(None);
        };
        let reply = MpaRepr::parse(&frame)?;
        if reply.kind != MpaKind::Reply {
            return Err(MpaError::UnexpectedFrame);
        }
        self.reply_crc = reply.crc;
        if reply.revision > self.sent_revision {
            return Err(MpaError::BadReplyRevision(reply.revision));
        }
        if reply.reject {
            return Ok(Some(ReplyOutcome::Rejected {
                private_data: Bytes::copy_from_slice(reply.private_data),
            }));
        }
        if reply.markers {
            return Err(MpaError::MarkersRequested {
                revision: reply.revision,
            });
        }
        let mut negotiated = Negotiated {
            revision: reply.revision,
            crc: self.crc || reply.crc,
            peer_to_peer: false,
            rtr: None,
            peer_word: reply.enhanced,
        };
        if let (Some(ours), Some(theirs)) = (self.sent_word, reply.enhanced) {
            // RFC 6581 §9: responder ORD ≤ initiator IRD, else TERM 0x06.
            if !super::read_limits::initiator_ird_sufficient(ours.ird, theirs.ord) {
                return Err(MpaError::InsufficientIrd {
                    own_ird: ours.ird,
                    peer_ord: theirs.ord,
                });
            }
            // RFC 6581 §9: A echoed → pick one RTR the responder offered and we can send, else TERM 0x07.
            if ours.peer_to_peer && theirs.peer_to_peer {
                let rtr = if theirs.write_rtr && ours.write_rtr {
                    Rtr::Write
                } else if theirs.read_rtr && ours.read_rtr {
                    Rtr::Read
                } else if theirs.send_rtr && ours.send_rtr {
                    Rtr::Send
                } else {
                    return Err(MpaError::NoMatchingRtr);
                };
                negotiated.peer_to_peer = true;
                negotiated.rtr = Some(rtr);
            }
        }
        Ok(Some(ReplyOutcome::Accepted {
            negotiated,
            private_data: Bytes::copy_from_slice(reply.private_data),
            leftover,
        }))
    }

    /// Whether FPDUs on this connection carry a CRC: once a Reply was read, if it or the Request asked
    /// (RFC 5044 §7.1) — including for the Terminate that answers an unacceptable Reply (RFC 6581 §9).
    pub fn crc_in_use(&self) -> bool {
        self.crc || self.reply_crc
    }

    /// The TCP connection closed before a Reply.
    pub fn on_closed(&self) -> InitiatorClosed {
        if self.sent_revision >= 2 && !self.received_any {
            InitiatorClosed::RetryWithRevisionOne
        } else {
            InitiatorClosed::Aborted
        }
    }
}

/// The responder ("passive side") of one handshake, waiting for the Request.
#[derive(Debug)]
pub struct MpaResponder {
    reader: FrameReader,
    deadline: Option<Instant>,
}

/// A received MPA Request: what the listener's application sees before it accepts or rejects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MpaOffer {
    pub revision: u8,
    pub crc: bool,
    pub enhanced: Option<EnhancedControl>,
    pub private_data: Bytes,
}

impl MpaResponder {
    /// A responder whose TCP connection was accepted at `now`.
    pub fn new(now: Instant, config: &MpaConfig) -> Self {
        MpaResponder {
            reader: FrameReader::default(),
            deadline: Some(now + config.request_timeout),
        }
    }

    /// When the Request must have arrived; `None` once it has.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// `Err(RequestTimeout)` once `now` is past the deadline without a Request.
    pub fn on_timeout(&self, now: Instant) -> Result<(), MpaError> {
        match self.deadline {
            Some(d) if now >= d => Err(MpaError::RequestTimeout),
            _ => Ok(()),
        }
    }

    /// Feeds bytes from the initiator. `Err(MarkersRequested)`: answer with [`reject_reply`] and close
    /// (siw's behaviour). Other errors: close the connection (there is no MPA error message before FPDU mode).
    /// Once the offer is out, the caller must refuse any further byte before its Reply the same way
    /// ([`MpaError::DataBeforeReply`]).
    pub fn on_bytes(&mut self, data: &[u8]) -> Result<Option<MpaOffer>, MpaError> {
        let Some((frame, leftover)) = self.reader.push(data)? else {
            return Ok(None);
        };
        let req = MpaRepr::parse(&frame)?;
        if req.kind != MpaKind::Request {
            return Err(MpaError::UnexpectedFrame);
        }
        self.deadline = None;
        // RFC 5044 §7.1.2: nothing may follow the Request until the Reply (checked first, as siw does).
        if !leftover.is_empty() {
            return Err(MpaError::DataBeforeReply {
                bytes: leftover.len(),
            });
        }
        if req.markers {
            return Err(MpaError::MarkersRequested {
                revision: req.revision,
            });
        }
        Ok(Some(MpaOffer {
            revision: req.revision,
            crc: req.crc,
            enhanced: req.enhanced,
            private_data: Bytes::copy_from_slice(req.private_data),
        }))
    }
}

impl MpaOffer {
    /// The Reply accepting the offer with `limits` (this side's, already capped per RFC 6581 §9 — see
    /// [`super::read_limits::responder_offer`]) and `private_data`. INVALID_BUFFER_SIZE past MaxCalleeData.
    pub fn accept(
        &self,
        config: &MpaConfig,
        limits: ReadLimits,
        private_data: &[u8],
    ) -> Result<(Bytes, Negotiated), Error> {
        // Reply with the Request's revision (we speak both); the enhanced word only when the initiator sent one.
        let revision = self.revision;
        check_private_data(private_data.len(), revision)?;
        let p2p = config.peer_to_peer && self.enhanced.is_some_and(|w| w.peer_to_peer);
        let enhanced = self.enhanced.map(|_| word(limits, p2p, RTR_OFFER));
        let crc = self.crc || config.crc_required;
        let reply = MpaRepr {
            kind: MpaKind::Reply,
            markers: false,
            crc,
            reject: false,
            revision,
            enhanced,
            private_data,
        };
        let negotiated = Negotiated {
            revision,
            crc,
            peer_to_peer: p2p,
            rtr: None,
            peer_word: self.enhanced,
        };
        Ok((emit(&reply), negotiated))
    }

    /// The Reply rejecting the offer (R=1) with `private_data` (IND2Connector::Reject).
    pub fn reject(&self, private_data: &[u8]) -> Result<Bytes, Error> {
        check_private_data(private_data.len(), self.revision)?;
        Ok(reject_reply(self.revision, self.enhanced.is_some(), private_data))
    }
}

/// An R=1 Reply: for a reject, a full backlog, or a Request asking for markers (siw answers those the same).
pub fn reject_reply(revision: u8, enhanced: bool, private_data: &[u8]) -> Bytes {
    let pd = &private_data[..private_data.len().min(max_private_data(revision))];
    let word = (enhanced && revision >= 2).then(EnhancedControl::default);
    emit(&MpaRepr {
        kind: MpaKind::Reply,
        markers: false,
        crc: false,
        reject: true,
        revision: revision.clamp(1, 2),
        enhanced: word,
        private_data: pd,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::framing::is_rtr;
    use proptest::prelude::*;
    use soft_rdma_common::wire::fpdu::FpduRepr;
    use soft_rdma_common::wire::rdmap::MessageRepr;

    const OWN: ReadLimits = ReadLimits {
        inbound: 32,
        outbound: 1,
    };

    fn feed_in_chunks<T>(
        mut f: impl FnMut(&[u8]) -> Result<Option<T>, MpaError>,
        bytes: &[u8],
        cuts: &[usize],
    ) -> Result<Option<T>, MpaError> {
        let mut at = 0;
        for c in cuts.iter().map(|c| c % (bytes.len() + 1)).chain([bytes.len()]) {
            if c < at {
                continue;
            }
            if let Some(done) = f(&bytes[at..c])? {
                return Ok(Some(done));
            }
            at = c;
        }
        Ok(None)
    }

    /// An initiator (`cfg`, private data `pd`) whose Request a responder (`cfg`) took whole: the initiator,
    /// the responder's offer, and the Request's bytes.
    fn offered(cfg: &MpaConfig, pd: &[u8]) -> (MpaInitiator, MpaOffer, Bytes) {
        let (ini, request) = MpaInitiator::new(cfg, OWN, pd).unwrap();
        let offer = MpaResponder::new(Instant::now(), cfg)
            .on_bytes(&request)
            .unwrap()
            .expect("the Request is whole");
        (ini, offer, request)
    }

    /// Both machines against each other: Request, Reply, then the RTR the initiator chose.
    fn handshake(
        cfg_i: &MpaConfig,
        cfg_r: &MpaConfig,
        cuts: &[usize],
    ) -> (Negotiated, Negotiated, MpaOffer, Bytes) {
        let t0 = Instant::now();
        let (mut ini, request) = MpaInitiator::new(cfg_i, OWN, b"hello from A").unwrap();
        let mut resp = MpaResponder::new(t0, cfg_r);
        let offer = feed_in_chunks(|b| resp.on_bytes(b), &request, cuts)
            .unwrap()
            .expect("request complete");
        assert_eq!(resp.deadline(), None, "no deadline once the Request is in");
        let limits = crate::engine::read_limits::responder_offer(
            ReadLimits {
                inbound: 16,
                outbound: 8,
            },
            &offer.enhanced.unwrap_or_default(),
            &crate::engine::read_limits::tests_support::adapter(128),
        );
        let (reply, n_r) = offer.accept(cfg_r, limits, b"welcome").unwrap();
        let Some(ReplyOutcome::Accepted {
            negotiated: n_i,
            private_data,
            leftover,
        }) = feed_in_chunks(|b| ini.on_bytes(b), &reply, cuts).unwrap()
        else {
            panic!("accepted expected")
        };
        assert_eq!(&private_data[..], b"welcome");
        assert!(leftover.is_empty());
        (n_i, n_r, offer, reply)
    }

    #[test]
    fn v2_peer_to_peer_handshake() {
        let cfg = MpaConfig::default();
        let (ni, nr, offer, _) = handshake(&cfg, &cfg, &[3, 17, 21]);
        assert_eq!(&offer.private_data[..], b"hello from A");
        assert_eq!(
            offer.enhanced.map(|w| (w.ird, w.ord, w.peer_to_peer)),
            Some((32, 1, true))
        );
        assert_eq!(
            (ni.revision, ni.crc, ni.peer_to_peer, ni.rtr),
            (2, false, true, Some(Rtr::Write))
        );
        assert_eq!((nr.peer_to_peer, nr.rtr), (true, None));
        // Responder ORD ≤ initiator IRD (32): 8; responder IRD 16 limited to the initiator's ORD 1 (seed 004).
        assert_eq!(ni.peer_word.map(|w| (w.ird, w.ord)), Some((1, 8)));
        // The RTR the initiator sends parses as one on the responder.
        let rtr = crate::engine::framing::rtr_fpdu(Rtr::Write, ni.crc);
        let f = FpduRepr::parse(&rtr, 1454).unwrap();
        assert_eq!(is_rtr(&MessageRepr::parse(f.ulpdu).unwrap()), Some(Rtr::Write));
        let rtr = crate::engine::framing::rtr_fpdu(Rtr::Read, true);
        soft_rdma_common::wire::fpdu::verify_crc(&rtr).unwrap();
        let f = FpduRepr::parse(&rtr, 1454).unwrap();
        assert_eq!(is_rtr(&MessageRepr::parse(f.ulpdu).unwrap()), Some(Rtr::Read));
    }

    #[test]
    fn crc_if_either_side_asks_and_p2p_only_if_both() {
        let ask = MpaConfig {
            crc_required: true,
            ..Default::default()
        };
        let plain = MpaConfig {
            peer_to_peer: false,
            ..Default::default()
        };
        let (ni, nr, _, reply) = handshake(&plain, &ask, &[]);
        assert!(ni.crc && nr.crc, "responder asked: both use CRC");
        assert_eq!(reply[16] & 0x40, 0x40);
        assert!(!ni.peer_to_peer && ni.rtr.is_none() && !nr.peer_to_peer);
        let (ni, nr, _, _) = handshake(&ask, &plain, &[]);
        assert!(ni.crc && nr.crc, "initiator asked: both use CRC");
        assert!(
            !ni.peer_to_peer && !nr.peer_to_peer,
            "responder without P2P: the active side sends first"
        );
    }

    #[test]
    fn revision_one_request_gets_revision_one_reply() {
        let v1 = MpaConfig {
            revision: 1,
            ..Default::default()
        };
        let (ni, nr, offer, reply) = handshake(&v1, &MpaConfig::default(), &[]);
        assert_eq!((offer.revision, offer.enhanced), (1, None));
        assert_eq!((reply[17], reply[16] & 0x10), (1, 0), "Rev 1, no S bit");
        assert_eq!(
            (ni.revision, ni.peer_word, ni.rtr, nr.revision),
            (1, None, None, 1)
        );
        // Rev 1 carries 256 bytes of private data, Rev 2 252 (the word takes 4).
        assert!(MpaInitiator::new(&v1, OWN, &[0; 256]).is_ok());
        let e = MpaInitiator::new(&MpaConfig::default(), OWN, &[0; 253]).unwrap_err();
        assert_eq!(e.status, NdStatus::InvalidBufferSize);
        assert!(MpaInitiator::new(&MpaConfig::default(), OWN, &[0; 252]).is_ok());
    }

    #[test]
    fn reject_carries_private_data() {
        let cfg = MpaConfig::default();
        let (mut ini, offer, _) = offered(&cfg, b"please");
        let reply = offer.reject(b"not today").unwrap();
        assert_eq!(
            ini.on_bytes(&reply).unwrap(),
            Some(ReplyOutcome::Rejected {
                private_data: Bytes::from_static(b"not today")
            })
        );
        assert_eq!(
            offer.reject(&[0; 253]).unwrap_err().status,
            NdStatus::InvalidBufferSize
        );
        assert_eq!(
            offer.accept(&cfg, OWN, &[0; 253]).unwrap_err().status,
            NdStatus::InvalidBufferSize
        );
    }

    #[test]
    fn markers_are_refused() {
        let mut req = vec![0u8; 20];
        req[..16].copy_from_slice(b"MPA ID Req Frame");
        req[16] = 0x80;
        req[17] = 1;
        let mut resp = MpaResponder::new(Instant::now(), &MpaConfig::default());
        assert_eq!(
            resp.on_bytes(&req),
            Err(MpaError::MarkersRequested { revision: 1 })
        );
        let rejection = reject_reply(1, false, &[]);
        let r = MpaRepr::parse(&rejection).unwrap();
        assert!(r.reject && !r.markers);
        // The revision is the Request's, however TCP cut it: here the last piece starts after the Rev byte
        // and is too short to have a byte 17 of its own (the daemon once read the Rev from the last piece).
        let pd = [0x80, 0x04, 0x00, 0x04, b'h', b'i'];
        let mut v2 = [
            &b"MPA ID Req Frame"[..],
            &[0x80 | 0x10, 2, 0, pd.len() as u8],
            &pd,
        ]
        .concat();
        let mut resp = MpaResponder::new(Instant::now(), &MpaConfig::default());
        assert_eq!(resp.on_bytes(&v2[..18]), Ok(None));
        assert_eq!(
            resp.on_bytes(&v2[18..]),
            Err(MpaError::MarkersRequested { revision: 2 })
        );
        // A Reply asking for markers is refused by the initiator too.
        v2[..16].copy_from_slice(b"MPA ID Rep Frame");
        let (mut ini, _) = MpaInitiator::new(&MpaConfig::default(), OWN, b"").unwrap();
        assert_eq!(ini.on_bytes(&v2), Err(MpaError::MarkersRequested { revision: 2 }));
    }

    /// RFC 5044 §7.1.2: the initiator sends nothing after its Request until it has the Reply. Bytes that
    /// arrive with the Request's last piece are refused, never buffered for later (bytes in a later chunk
    /// reach the connection manager, which refuses them the same way: cm_tests).
    #[test]
    fn bytes_after_the_request_are_refused() {
        let cfg = MpaConfig::default();
        let (_, request) = MpaInitiator::new(&cfg, OWN, b"x").unwrap();
        let rtr = crate::engine::framing::rtr_fpdu(Rtr::Write, false);
        let early: Vec<u8> = [&request[..], &rtr[..]].concat();
        let mut resp = MpaResponder::new(Instant::now(), &cfg);
        assert_eq!(
            resp.on_bytes(&early),
            Err(MpaError::DataBeforeReply { bytes: rtr.len() })
        );
        assert_eq!(resp.deadline(), None, "the Request did arrive");
        // One garbage byte after the Request, however the Request itself is cut.
        let one_more: Vec<u8> = [&request[..], b"!"].concat();
        for cut in 0..request.len() {
            let mut resp = MpaResponder::new(Instant::now(), &cfg);
            let first = resp.on_bytes(&one_more[..cut]);
            let outcome = match first {
                Ok(None) => resp.on_bytes(&one_more[cut..]),
                other => other,
            };
            assert_eq!(
                outcome,
                Err(MpaError::DataBeforeReply { bytes: 1 }),
                "cut at {cut}"
            );
        }
        // The exact Request alone is an offer.
        let mut resp = MpaResponder::new(Instant::now(), &cfg);
        assert_eq!(
            resp.on_bytes(&request).unwrap().map(|o| o.private_data),
            Some(Bytes::from_static(b"x"))
        );
    }

    /// An accepting MPA v2 Reply with the word `w`, no private data, and C = `crc`.
    fn v2_reply(crc: bool, w: EnhancedControl) -> Bytes {
        emit(&MpaRepr {
            kind: MpaKind::Reply,
            markers: false,
            crc,
            reject: false,
            revision: 2,
            enhanced: Some(w),
            private_data: b"",
        })
    }

    /// Replies the initiator must refuse with a Terminate, each to a fresh initiator with no CRC of its own:
    /// (what, the Reply's C bit, its word, the error, the Terminate's MPA error code). The Terminate is framed
    /// with the CRC the Reply asked for (the daemon once framed it by its own setting alone, so the responder
    /// saw a CRC error instead).
    #[test]
    fn rtr_and_ird_violations_terminate() {
        let cfg = MpaConfig::default();
        let word = |ord, send_rtr, write_rtr| EnhancedControl {
            ird: 1,
            ord,
            peer_to_peer: true,
            send_rtr,
            write_rtr,
            ..Default::default()
        };
        let cases = [
            (
                "A=1 offering only a Send RTR, which soft-rdma does not send",
                false,
                word(1, true, false),
                MpaError::NoMatchingRtr,
                0x07,
            ),
            (
                "ORD 33 exceeds our IRD (32), asking for CRC",
                true,
                word(33, false, true),
                MpaError::InsufficientIrd {
                    own_ird: 32,
                    peer_ord: 33,
                },
                0x06,
            ),
        ];
        for (what, crc, w, error, code) in cases {
            let (mut ini, _) = MpaInitiator::new(&cfg, OWN, b"").unwrap();
            assert!(!ini.crc_in_use(), "{what}");
            let e = ini.on_bytes(&v2_reply(crc, w)).unwrap_err();
            assert_eq!(e, error, "{what}");
            assert_eq!(
                e.terminate_cause(),
                Some(TerminateCause::new(2, 0, code)),
                "{what}"
            );
            assert_eq!(ini.crc_in_use(), crc, "{what}: the Reply's C bit counts");
        }
    }

    #[test]
    fn wrong_frames_and_garbage() {
        let cfg = MpaConfig::default();
        let (mut ini, offer, request) = offered(&cfg, b"");
        assert_eq!(
            ini.on_bytes(&request),
            Err(MpaError::UnexpectedFrame),
            "a Request where a Reply belongs"
        );
        let mut resp = MpaResponder::new(Instant::now(), &cfg);
        assert_eq!(
            resp.on_bytes(b"GET / HTTP/1.1\r\n"),
            Err(MpaError::Wire(WireError::BadMpaKey))
        );
        let mut resp = MpaResponder::new(Instant::now(), &cfg);
        let (reply_like, _) = offer.accept(&cfg, OWN, b"").unwrap();
        assert_eq!(
            resp.on_bytes(&reply_like),
            Err(MpaError::UnexpectedFrame),
            "a Reply instead of a Request"
        );
    }

    #[test]
    fn leftover_bytes_are_kept() {
        let cfg = MpaConfig::default();
        let (mut ini, offer, _) = offered(&cfg, b"x");
        let (reply, _) = offer
            .accept(
                &cfg,
                ReadLimits {
                    inbound: 1,
                    outbound: 1,
                },
                b"y",
            )
            .unwrap();
        let rtr = crate::engine::framing::rtr_fpdu(Rtr::Write, false);
        let both: Vec<u8> = [&reply[..], &rtr[..]].concat();
        let Some(ReplyOutcome::Accepted { leftover, .. }) = ini.on_bytes(&both).unwrap() else {
            panic!()
        };
        assert_eq!(leftover, rtr);
    }

    #[test]
    fn request_timeout_and_retry_with_revision_one() {
        let cfg = MpaConfig::default();
        let t0 = Instant::now();
        let resp = MpaResponder::new(t0, &cfg);
        assert_eq!(resp.deadline(), Some(t0 + Duration::from_secs(5)));
        assert_eq!(resp.on_timeout(t0 + Duration::from_secs(4)), Ok(()));
        assert_eq!(
            resp.on_timeout(t0 + Duration::from_secs(5)),
            Err(MpaError::RequestTimeout)
        );
        let (ini, _) = MpaInitiator::new(&cfg, OWN, b"").unwrap();
        assert_eq!(ini.on_closed(), InitiatorClosed::RetryWithRevisionOne);
        let (ini, _) = MpaInitiator::new(
            &MpaConfig {
                revision: 1,
                ..cfg.clone()
            },
            OWN,
            b"",
        )
        .unwrap();
        assert_eq!(ini.on_closed(), InitiatorClosed::Aborted);
        let (mut ini, _) = MpaInitiator::new(&cfg, OWN, b"").unwrap();
        ini.on_bytes(b"MPA").unwrap();
        assert_eq!(
            ini.on_closed(),
            InitiatorClosed::Aborted,
            "a responder that answered did not refuse S=1"
        );
    }

    proptest! {
        /// The outcome does not depend on how TCP cuts the bytes.
        #[test]
        fn fragmentation_independent(cuts in proptest::collection::vec(0usize..120, 0..12), crc in any::<bool>(), p2p in any::<bool>()) {
            let cfg = MpaConfig { crc_required: crc, peer_to_peer: p2p, ..Default::default() };
            let whole = handshake(&cfg, &cfg, &[]);
            let cut = handshake(&cfg, &cfg, &cuts);
            prop_assert_eq!(whole.0, cut.0);
            prop_assert_eq!(whole.1, cut.1);
            prop_assert_eq!(whole.2, cut.2);
        }

        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..600)) {
            let cfg = MpaConfig::default();
            let _ = MpaResponder::new(Instant::now(), &cfg).on_bytes(&data);
            let (mut ini, _) = MpaInitiator::new(&cfg, OWN, b"").unwrap();
            let _ = ini.on_bytes(&data);
        }
    }
}
