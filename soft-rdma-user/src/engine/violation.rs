//! Why a stream was terminated, in words, for whoever reads a queue pair's status:
//!
//! - [`Violation`]: the rule an inbound message broke, as the side that found it (and sent the Terminate)
//!   records it: one variant per check of the queue pair's receive side (`engine::qp`, which maps each to
//!   its Terminate cause: RFC 5040 §7.2, RFC 5041 §7.2, siw where they leave a choice), each saying what
//!   was wrong and what to do about it.
//! - [`meaning`]: what a Terminate's cause says went wrong, for the side that received it (the peer's
//!   Terminate carries only its layer, type and code) or for an error found below the queue pair (a bad
//!   CRC, a malformed FPDU), with what the sender can check.
//!
//! `engine::verbs::TerminateInfo` puts these together with the cause's names
//! ([`soft_rdma_common::wire::TerminateCause`]'s `Display`). This module uses no other module of the engine.

use soft_rdma_common::wire::TerminateCause;
use soft_rdma_common::wire::terminate::{ddp_code, ddp_type, layer, llp_code, rdmap_code, rdmap_type};

/// The rule an inbound message broke, as the side that found it records it (and sends the Terminate for:
/// RFC 5040 §4.8). The variants' order is the Unix-socket protocol's encoding: new ones go at the end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Violation {
    /// A Terminate reached the data path (the connection manager handles them: RFC 5040 §7.2).
    TerminateOnDataPath,
    /// A Send in a tagged segment (RFC 5040 §4.2).
    SendTagged,
    /// A Send on a queue other than 0 (RFC 5040 §5.1).
    SendWrongQueue,
    /// A Send whose MSN is not the next on queue 0 (RFC 5041 §5.1).
    SendMsnOutOfSequence,
    /// A Send with no Receive posted (RFC 5041 §7.2: iWARP has no receiver-not-ready retry).
    SendWithoutReceive,
    /// A Send segment whose message offset is not the bytes placed so far (RFC 5041 §7.2).
    SendOffsetOutOfOrder,
    /// A Send longer than its Receive (RFC 5041 §7.2): the Receive completes with DATA_OVERRUN.
    SendLongerThanReceive,
    /// The Receive's memory was no longer accessible (siw `siw_proc_send`).
    ReceiveInaccessible,
    /// A Send with Invalidate naming an STag that cannot be invalidated (RFC 5040 §5.3, §7.2).
    CannotInvalidate,
    /// An RDMA Write in an untagged segment (RFC 5040 §4.2).
    WriteUntagged,
    /// An RDMA Write to an STag with no valid region (RFC 5041 §7.2).
    WriteInvalidStag,
    /// An RDMA Write reaching outside its region (RFC 5041 §7.2).
    WriteOutOfBounds,
    /// An RDMA Write to another session's region (RFC 5041 §7.2 "STag not associated").
    WriteNotAssociated,
    /// An RDMA Write to a region registered without REMOTE_WRITE (reported as an invalid STag, as siw).
    WriteWithoutRemoteWrite,
    /// A Read Request in a tagged segment (RFC 5040 §4.2).
    ReadRequestTagged,
    /// A Read Request on a queue other than 1 (RFC 5040 §5.1).
    ReadRequestWrongQueue,
    /// A Read Request in more than one segment (RFC 5040 §5.2).
    ReadRequestSegmented,
    /// A Read Request whose MSN is not the next on queue 1 (RFC 5041 §5.1).
    ReadRequestMsnOutOfSequence,
    /// A Read Request with a nonzero message offset (RFC 5041 §7.2).
    ReadRequestOffset,
    /// A Read Request whose header is not 28 bytes (RFC 5040 §4.4).
    ReadRequestSize,
    /// More Read Requests at once than this side's inbound read limit (RFC 6581 §9 IRD).
    InboundReadLimitExceeded,
    /// A Read from an STag with no valid region (RFC 5040 §7.2).
    ReadSourceInvalidStag,
    /// A Read reaching outside its source region (RFC 5040 §7.2).
    ReadSourceOutOfBounds,
    /// A Read from another session's region (RFC 5040 §7.2 "STag not associated").
    ReadSourceNotAssociated,
    /// A Read from a region registered without REMOTE_READ (RFC 5040 §7.2 "access rights").
    ReadWithoutRemoteRead,
    /// A Read Request whose sink range wraps (RFC 5040 §7.2 "TO wrap").
    ReadSinkWraps,
    /// A Read Response in an untagged segment (RFC 5040 §4.2).
    ReadResponseUntagged,
    /// A Read Response with no Read outstanding (RFC 5040 §7.2).
    ReadResponseUnexpected,
    /// A Read Response to another STag than the oldest Read's sink (RFC 5041 §7.2).
    ReadResponseWrongStag,
    /// A Read Response at the wrong offset, or longer than the Read (RFC 5041 §7.2).
    ReadResponseWrongOffset,
    /// A Read Response shorter than the Read (RFC 5040 §4.4).
    ReadResponseShort,
    /// The Read's sink was no longer accessible (deregistered while the Read was outstanding).
    ReadSinkInaccessible,
    /// An RDMA Write to an STag a Send with Invalidate made invalid (RFC 5040 §5.3; reported as an invalid
    /// STag, as siw, whose `siw_check_mem` finds the region and refuses it: `!mem->stag_valid`).
    WriteInvalidatedStag,
}

/// What an STag that names no region here means, for a Write or a Read alike.
const NO_SUCH_STAG: &str =
    "no region here has that STag (never registered, deregistered or invalidated): the peer used a wrong \
     or stale STag";

impl Violation {
    /// The message that broke the rule: "the peer's RDMA Write".
    pub fn message(self) -> &'static str {
        use Violation::*;
        match self {
            TerminateOnDataPath => "the peer's Terminate",
            SendTagged
            | SendWrongQueue
            | SendMsnOutOfSequence
            | SendWithoutReceive
            | SendLongerThanReceive
            | ReceiveInaccessible => "the peer's Send",
            SendOffsetOutOfOrder => "a segment of the peer's Send",
            CannotInvalidate => "the peer's Send with Invalidate",
            WriteUntagged
            | WriteInvalidStag
            | WriteOutOfBounds
            | WriteNotAssociated
            | WriteWithoutRemoteWrite
            | WriteInvalidatedStag => "the peer's RDMA Write",
            ReadRequestTagged
            | ReadRequestWrongQueue
            | ReadRequestSegmented
            | ReadRequestMsnOutOfSequence
            | ReadRequestOffset
            | ReadRequestSize
            | InboundReadLimitExceeded
            | ReadSinkWraps => "the peer's RDMA Read Request",
            ReadSourceInvalidStag
            | ReadSourceOutOfBounds
            | ReadSourceNotAssociated
            | ReadWithoutRemoteRead => "the peer's RDMA Read",
            ReadResponseUntagged
            | ReadResponseUnexpected
            | ReadResponseWrongStag
            | ReadResponseWrongOffset
            | ReadResponseShort
            | ReadSinkInaccessible => "the peer's RDMA Read Response",
        }
    }

    /// How the buffer the message named joins [`Self::message`]: a Read is "from" its source, anything
    /// else "to" its sink.
    pub fn preposition(self) -> &'static str {
        use Violation::*;
        match self {
            ReadSourceInvalidStag
            | ReadSourceOutOfBounds
            | ReadSourceNotAssociated
            | ReadWithoutRemoteRead => "from",
            _ => "to",
        }
    }

    /// The rule it broke, and what to do about it when this side can do something.
    pub fn rule(self) -> &'static str {
        use Violation::*;
        match self {
            TerminateOnDataPath => "it reached the data path, where no Terminate belongs (RFC 5040 §7.2)",
            SendTagged => "it came in a tagged DDP segment; a Send is untagged (RFC 5040 §4.2)",
            SendWrongQueue => "it came on a DDP queue other than 0 (RFC 5040 §5.1)",
            SendMsnOutOfSequence => "its MSN is not the next one on queue 0 (RFC 5041 §5.1)",
            SendWithoutReceive => {
                "no Receive was posted for it, and iWARP has no receiver-not-ready retry (RFC 5041 §7.2): \
                 post Receives before the peer can send, that is before accept_qp or complete_connect, and \
                 keep one posted for every Send the peer makes"
            }
            SendOffsetOutOfOrder => "its message offset is not the bytes placed so far (RFC 5041 §7.2)",
            SendLongerThanReceive => {
                "it is longer than the Receive posted for it, which completes with DATA_OVERRUN \
                 (RFC 5041 §7.2): post Receives as large as the largest Send the peer makes"
            }
            ReceiveInaccessible => {
                "the memory of the Receive it was placed into is no longer registered: keep a Receive's \
                 regions registered until it completes"
            }
            CannotInvalidate => {
                "the STag it named is not one of this connection's valid regions, so it cannot be \
                 invalidated (RFC 5040 §5.3, §7.2)"
            }
            WriteUntagged => "it came in an untagged DDP segment; an RDMA Write is tagged (RFC 5040 §4.2)",
            WriteInvalidStag => NO_SUCH_STAG,
            WriteOutOfBounds => {
                "it reaches past the end of the region (tagged offset plus length beyond its size): the \
                 peer wrote outside what it was given"
            }
            WriteNotAssociated => {
                "the region belongs to another session here, not to this connection's (RFC 5041 §7.2)"
            }
            WriteWithoutRemoteWrite => {
                "the region was registered without REMOTE_WRITE: register it with Access::REMOTE_WRITE \
                 for the peer to write it"
            }
            ReadRequestTagged => {
                "it came in a tagged DDP segment; a Read Request is untagged (RFC 5040 §4.2)"
            }
            ReadRequestWrongQueue => "it came on a DDP queue other than 1 (RFC 5040 §5.1)",
            ReadRequestSegmented => "it came in more than one DDP segment (RFC 5040 §5.2)",
            ReadRequestMsnOutOfSequence => "its MSN is not the next one on queue 1 (RFC 5041 §5.1)",
            ReadRequestOffset => "its message offset is not 0 (RFC 5041 §7.2)",
            ReadRequestSize => "its header is not the 28 bytes of a Read Request (RFC 5040 §4.4)",
            InboundReadLimitExceeded => {
                "the peer had more RDMA Reads in flight than this side's inbound read limit (IRD) allows \
                 (RFC 6581 §9): it ignored the limits the connection negotiated"
            }
            ReadSourceInvalidStag => NO_SUCH_STAG,
            ReadSourceOutOfBounds => {
                "it reaches past the end of the region (tagged offset plus length beyond its size): the \
                 peer read outside what it was given"
            }
            ReadSourceNotAssociated => {
                "the region belongs to another session here, not to this connection's (RFC 5040 §7.2)"
            }
            ReadWithoutRemoteRead => {
                "the region was registered without REMOTE_READ: register it with Access::REMOTE_READ for \
                 the peer to read it"
            }
            ReadSinkWraps => "its sink's tagged offset plus length wraps past 2^64 (RFC 5040 §7.2)",
            ReadResponseUntagged => {
                "it came in an untagged DDP segment; a Read Response is tagged (RFC 5040 §4.2)"
            }
            ReadResponseUnexpected => "this side had no RDMA Read outstanding (RFC 5040 §7.2)",
            ReadResponseWrongStag => {
                "that is not the sink of this side's oldest outstanding RDMA Read; Responses come in \
                 Request order (RFC 5040 §5.2)"
            }
            ReadResponseWrongOffset => {
                "it is at the wrong tagged offset or longer than the RDMA Read (RFC 5041 §7.2)"
            }
            ReadResponseShort => "it is shorter than the RDMA Read (RFC 5040 §4.4)",
            ReadSinkInaccessible => {
                "the RDMA Read's sink is no longer registered: keep a Read's sink registered until it \
                 completes"
            }
            WriteInvalidatedStag => {
                "the region's STag was invalidated by a Send with Invalidate (RFC 5040 §5.3): the peer \
                 wrote with an STag it had invalidated; a new registration has a new STag"
            }
        }
    }
}

/// "the peer's RDMA Write: the region was registered without REMOTE_WRITE: …".
impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.message(), self.rule())
    }
}

/// What a Terminate with `cause` says went wrong, for the side that sent the message it refused: what the
/// receiver found and what the sender can check. `None` for a cause the RFCs do not define (its numbers are
/// all there is). The receiver knows more ([`Violation`]); a Terminate carries only the cause.
pub fn meaning(cause: TerminateCause) -> Option<&'static str> {
    Some(match (cause.layer, cause.error_type, cause.code) {
        (layer::DDP, ddp_type::TAGGED_BUFFER, ddp_code::TAGGED_INVALID_STAG) => {
            "the receiver refused an RDMA Write or Read Response whose STag it does not accept: no region \
             there has it (wrong, deregistered or invalidated), or its region was registered without REMOTE_WRITE \
             (soft-rdma and siw report a missing access right so). Check the STag the peer advertised, \
             and that the peer registered that region with Access::REMOTE_WRITE"
        }
        (layer::DDP, ddp_type::TAGGED_BUFFER, ddp_code::TAGGED_BASE_OR_BOUNDS) => {
            "the receiver refused an RDMA Write or Read Response that reaches outside the region its STag names. \
             Check the tagged offset and length against the size of the region the peer advertised"
        }
        (layer::DDP, ddp_type::TAGGED_BUFFER, ddp_code::TAGGED_STAG_NOT_ASSOCIATED) => {
            "the receiver refused an RDMA Write or Read Response whose STag belongs to another session there, not \
             to this connection's. Use an STag the peer advertised on this connection"
        }
        (layer::DDP, ddp_type::TAGGED_BUFFER, ddp_code::TAGGED_TO_WRAP) => {
            "the receiver refused a tagged message whose tagged offset plus length wraps past 2^64"
        }
        (layer::DDP, ddp_type::UNTAGGED_BUFFER, ddp_code::UNTAGGED_NO_BUFFER) => {
            "a Send arrived and the receiver had no Receive posted for it; iWARP has no receiver-not-ready retry. \
             The peer must post its Receives before this side's first Send can arrive (before it accepts \
             or completes the connection) and keep one posted for every Send"
        }
        (layer::DDP, ddp_type::UNTAGGED_BUFFER, ddp_code::UNTAGGED_MESSAGE_TOO_LONG) => {
            "a Send was longer than the Receive the receiver had posted for it. Send no more than the peer's \
             Receives hold"
        }
        (layer::DDP, ddp_type::UNTAGGED_BUFFER, ddp_code::UNTAGGED_MSN_RANGE)
        | (layer::DDP, ddp_type::UNTAGGED_BUFFER, ddp_code::UNTAGGED_INVALID_MO)
        | (layer::DDP, ddp_type::UNTAGGED_BUFFER, ddp_code::UNTAGGED_INVALID_QN) => {
            "an untagged message (Send or Read Request) came out of sequence or on the wrong queue: the \
             two sides' DDP streams are out of step"
        }
        (layer::DDP, ddp_type::TAGGED_BUFFER, ddp_code::TAGGED_VERSION)
        | (layer::DDP, ddp_type::UNTAGGED_BUFFER, ddp_code::UNTAGGED_VERSION)
        | (layer::RDMAP, rdmap_type::REMOTE_OPERATION, rdmap_code::INVALID_VERSION) => {
            "the receiver does not speak the sender's DDP or RDMAP version"
        }
        (layer::RDMAP, rdmap_type::REMOTE_PROTECTION, rdmap_code::INVALID_STAG) => {
            "the receiver refused an RDMA Read whose source STag it does not accept: no region there has it (wrong, \
             deregistered or invalidated). Check the STag the peer advertised"
        }
        (layer::RDMAP, rdmap_type::REMOTE_PROTECTION, rdmap_code::BASE_OR_BOUNDS) => {
            "the receiver refused an RDMA Read that reaches outside the source region. Check the tagged offset and \
             length against the size of the region the peer advertised"
        }
        (layer::RDMAP, rdmap_type::REMOTE_PROTECTION, rdmap_code::ACCESS_RIGHTS) => {
            "the receiver refused an RDMA Read from a region registered without REMOTE_READ. The peer must register \
             that region with Access::REMOTE_READ"
        }
        (layer::RDMAP, rdmap_type::REMOTE_PROTECTION, rdmap_code::STAG_NOT_ASSOCIATED) => {
            "the receiver refused an RDMA Read whose source STag belongs to another session there. Use an STag the \
             peer advertised on this connection"
        }
        (layer::RDMAP, rdmap_type::REMOTE_PROTECTION, rdmap_code::TO_WRAP) => {
            "the receiver refused an RDMA Read whose sink range wraps past 2^64"
        }
        (layer::RDMAP, rdmap_type::REMOTE_OPERATION, rdmap_code::UNEXPECTED_OPCODE) => {
            "a message came that the receiver did not expect there (an unknown opcode, a Read Response with no Read \
             outstanding, a message in the wrong kind of segment)"
        }
        (layer::RDMAP, rdmap_type::REMOTE_OPERATION, rdmap_code::CATASTROPHIC_STREAM) => {
            "the stream broke one of RDMAP's rules, most often more RDMA Reads in flight than the \
             receiver's inbound read limit (IRD) allows"
        }
        (layer::RDMAP, rdmap_type::REMOTE_OPERATION, rdmap_code::CANNOT_INVALIDATE) => {
            "a Send with Invalidate named an STag the receiver cannot invalidate"
        }
        (layer::RDMAP | layer::DDP, 0, _)
        | (layer::RDMAP, rdmap_type::REMOTE_OPERATION, rdmap_code::CATASTROPHIC_GLOBAL)
        | (layer::LLP, _, llp_code::LOCAL_CATASTROPHIC) => {
            "the receiver met an error of its own that ended the stream (a Receive or Read sink no longer \
             registered, for one)"
        }
        (layer::RDMAP, _, rdmap_code::UNSPECIFIED) => "no reason was given",
        (layer::LLP, _, llp_code::CRC_ERROR) => {
            "an FPDU failed its CRC check: the bytes were damaged on the way, or the two sides compute \
             the CRC differently"
        }
        (layer::LLP, _, llp_code::FPDU_START) => {
            "an FPDU's length did not fit where one was expected (a malformed or oversized FPDU)"
        }
        (layer::LLP, _, llp_code::TCP_STREAM_LOST) => "the TCP stream under the connection was lost",
        (layer::LLP, _, llp_code::INVALID_REQUEST_REPLY) => "an MPA Request or Reply was not valid",
        (layer::LLP, _, llp_code::INSUFFICIENT_IRD) => {
            "the responder's outbound read limit (ORD) exceeds the initiator's inbound one (IRD) (RFC 6581 \
             §9): ask for read limits the other side can serve"
        }
        (layer::LLP, _, llp_code::NO_MATCHING_RTR) => {
            "the ready-to-receive message (RTR) was not the kind both sides agreed on (RFC 6581 §9)"
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use soft_rdma_common::wire::terminate::llp_type;

    /// Every cause soft-rdma's queue pairs and framing send has a meaning.
    #[test]
    fn every_cause_sent_has_a_meaning() {
        let causes = [
            (layer::DDP, ddp_type::TAGGED_BUFFER, ddp_code::TAGGED_INVALID_STAG),
            (
                layer::DDP,
                ddp_type::TAGGED_BUFFER,
                ddp_code::TAGGED_BASE_OR_BOUNDS,
            ),
            (
                layer::DDP,
                ddp_type::TAGGED_BUFFER,
                ddp_code::TAGGED_STAG_NOT_ASSOCIATED,
            ),
            (layer::DDP, ddp_type::TAGGED_BUFFER, ddp_code::TAGGED_VERSION),
            (
                layer::DDP,
                ddp_type::UNTAGGED_BUFFER,
                ddp_code::UNTAGGED_NO_BUFFER,
            ),
            (
                layer::DDP,
                ddp_type::UNTAGGED_BUFFER,
                ddp_code::UNTAGGED_MESSAGE_TOO_LONG,
            ),
            (
                layer::DDP,
                ddp_type::UNTAGGED_BUFFER,
                ddp_code::UNTAGGED_MSN_RANGE,
            ),
            (
                layer::DDP,
                ddp_type::UNTAGGED_BUFFER,
                ddp_code::UNTAGGED_INVALID_MO,
            ),
            (
                layer::DDP,
                ddp_type::UNTAGGED_BUFFER,
                ddp_code::UNTAGGED_INVALID_QN,
            ),
            (layer::DDP, ddp_type::CATASTROPHIC, 0),
            (
                layer::RDMAP,
                rdmap_type::REMOTE_PROTECTION,
                rdmap_code::INVALID_STAG,
            ),
            (
                layer::RDMAP,
                rdmap_type::REMOTE_PROTECTION,
                rdmap_code::BASE_OR_BOUNDS,
            ),
            (
                layer::RDMAP,
                rdmap_type::REMOTE_PROTECTION,
                rdmap_code::ACCESS_RIGHTS,
            ),
            (
                layer::RDMAP,
                rdmap_type::REMOTE_PROTECTION,
                rdmap_code::STAG_NOT_ASSOCIATED,
            ),
            (layer::RDMAP, rdmap_type::REMOTE_PROTECTION, rdmap_code::TO_WRAP),
            (
                layer::RDMAP,
                rdmap_type::REMOTE_OPERATION,
                rdmap_code::INVALID_VERSION,
            ),
            (
                layer::RDMAP,
                rdmap_type::REMOTE_OPERATION,
                rdmap_code::UNEXPECTED_OPCODE,
            ),
            (
                layer::RDMAP,
                rdmap_type::REMOTE_OPERATION,
                rdmap_code::CATASTROPHIC_STREAM,
            ),
            (
                layer::RDMAP,
                rdmap_type::REMOTE_OPERATION,
                rdmap_code::CANNOT_INVALIDATE,
            ),
            (layer::LLP, llp_type::MPA, llp_code::CRC_ERROR),
            (layer::LLP, llp_type::MPA, llp_code::FPDU_START),
            (layer::LLP, llp_type::MPA, llp_code::TCP_STREAM_LOST),
            (layer::LLP, llp_type::MPA, llp_code::INSUFFICIENT_IRD),
            (layer::LLP, llp_type::MPA, llp_code::NO_MATCHING_RTR),
        ];
        for (l, t, c) in causes {
            let cause = TerminateCause::new(l, t, c);
            assert!(meaning(cause).is_some(), "{cause}");
        }
        assert_eq!(
            meaning(TerminateCause::new(layer::LLP, llp_type::MPA, 0x40)),
            None
        );
    }

    /// The two mistakes an application makes on the side that receives, in words that say what to do.
    #[test]
    fn the_receivers_mistakes_say_what_to_do() {
        let w = Violation::WriteWithoutRemoteWrite.to_string();
        assert!(
            w.starts_with("the peer's RDMA Write: the region was registered without REMOTE_WRITE"),
            "{w}"
        );
        assert!(w.contains("Access::REMOTE_WRITE"), "{w}");
        let s = Violation::SendWithoutReceive.to_string();
        assert!(
            s.starts_with("the peer's Send: no Receive was posted for it"),
            "{s}"
        );
        assert!(s.contains("before accept_qp"), "{s}");
    }
}
