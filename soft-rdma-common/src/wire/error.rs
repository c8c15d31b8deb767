//! [`WireError`]: one variant per malformation, and the Terminate each maps to.

// What `terminate_cause` returns, at the path it had before it moved to `cause`.
pub use super::cause::TerminateCause;
use super::cause::{ddp_code, ddp_type, layer, llp_code, llp_type, rdmap_code, rdmap_type};

/// Everything that can be wrong with bytes on the wire (or with a buffer handed to `emit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WireError {
    /// Fewer bytes than the format needs.
    Truncated { needed: usize, available: usize },
    /// `emit` was given a buffer shorter than `buffer_len()`.
    BufferTooSmall { needed: usize, available: usize },
    /// The first 16 bytes are neither "MPA ID Req Frame" nor "MPA ID Rep Frame" (RFC 5044 §7.1).
    BadMpaKey,
    /// The MPA frame is not the kind expected (a Reply where a Request belongs, or the reverse).
    UnexpectedMpaKind,
    /// MPA Rev other than 1 or 2 (RFC 5044 §7.1, RFC 6581 §6).
    UnsupportedMpaRevision(u8),
    /// PD_Length above the RFC 5044 §7.1 cap of 512 bytes.
    PrivateDataTooLong(u16),
    /// S=1 (RFC 6581 §6) but PD_Length < 4: no room for the IRD/ORD word.
    EnhancedWordMissing,
    /// S=1 on a Rev 1 frame: enhanced connection setup needs Rev 2 (RFC 6581 §6).
    EnhancedOnRevisionOne,
    /// An IRD/ORD value above 0x3FFF given to `emit` (14-bit fields, RFC 6581 §9).
    ReadLimitOutOfRange(u16),
    /// ULPDU_Length smaller than the smallest DDP header (RFC 5044 §4.1, RFC 5041 §4).
    UlpduTooShort(u16),
    /// ULPDU_Length above the negotiated maximum (RFC 5044 §4.1: an FPDU fits the path MSS).
    UlpduTooLong { length: u16, max: u16 },
    /// The received MPA CRC does not match (RFC 5044 §4.4).
    CrcMismatch { received: u32, computed: u32 },
    /// DDP version other than 1 (RFC 5041 §4.2).
    BadDdpVersion(u8),
    /// RDMAP version other than 1 (RFC 5040 §4.2).
    BadRdmapVersion(u8),
    /// RDMAP opcode 8-15 (RFC 5040 §4.2: reserved).
    UnknownOpcode(u8),
    /// An opcode carried with the wrong DDP model (e.g. a Send in a tagged segment; RFC 5040 §4.2 table).
    TaggedMismatch { opcode: u8, tagged: bool },
    /// Untagged queue number not valid for the opcode (RFC 5040 §5: 0 Send, 1 Read Request, 2 Terminate).
    InvalidQueueNumber { opcode: u8, queue: u32 },
    /// A Read Request or Terminate split over several DDP segments (RFC 5040 §5.2, §4.8: L must be set).
    SegmentedControlMessage(u8),
    /// A Read Request whose payload is not exactly the 28-byte header (RFC 5040 §4.4).
    BadReadRequestLength(usize),
    /// A Terminate whose optional fields (M/D/R) do not fit the message (RFC 5040 §4.8).
    BadTerminateLength { expected: usize, available: usize },
    /// Terminate layer 3-15 (RFC 5040 §4.8 defines 0 RDMAP, 1 DDP, 2 LLP).
    UnknownTerminateLayer(u8),
}

impl WireError {
    /// The Terminate a receiver sends for this error, where the RFCs name one (RFC 5040 §4.8, RFC 5041 §7.2,
    /// RFC 5044 §8, RFC 6581 §9). `None` for errors that are not about received FPDUs (emit-side errors) or
    /// that happen before the stream is in FPDU mode (MPA Request/Reply problems: answered by an R=1 Reply or
    /// a close, not a Terminate).
    pub const fn terminate_cause(&self) -> Option<TerminateCause> {
        use TerminateCause as T;
        Some(match *self {
            WireError::CrcMismatch { .. } => T::new(layer::LLP, llp_type::MPA, llp_code::CRC_ERROR),
            WireError::UlpduTooShort(_) | WireError::UlpduTooLong { .. } => {
                T::new(layer::LLP, llp_type::MPA, llp_code::FPDU_START)
            }
            WireError::BadDdpVersion(_) => {
                // RFC 5041 §7.2: tagged/untagged "invalid DDP version" codes; the untagged one when unknown.
                T::new(layer::DDP, ddp_type::UNTAGGED_BUFFER, ddp_code::UNTAGGED_VERSION)
            }
            WireError::InvalidQueueNumber { .. } => T::new(
                layer::DDP,
                ddp_type::UNTAGGED_BUFFER,
                ddp_code::UNTAGGED_INVALID_QN,
            ),
            WireError::BadRdmapVersion(_) => T::new(
                layer::RDMAP,
                rdmap_type::REMOTE_OPERATION,
                rdmap_code::INVALID_VERSION,
            ),
            WireError::UnknownOpcode(_) | WireError::TaggedMismatch { .. } => T::new(
                layer::RDMAP,
                rdmap_type::REMOTE_OPERATION,
                rdmap_code::UNEXPECTED_OPCODE,
            ),
            WireError::SegmentedControlMessage(_)
            | WireError::BadReadRequestLength(_)
            | WireError::BadTerminateLength { .. }
            | WireError::UnknownTerminateLayer(_)
            | WireError::Truncated { .. } => T::new(
                layer::RDMAP,
                rdmap_type::REMOTE_OPERATION,
                rdmap_code::CATASTROPHIC_STREAM,
            ),
            WireError::BufferTooSmall { .. }
            | WireError::BadMpaKey
            | WireError::UnexpectedMpaKind
            | WireError::UnsupportedMpaRevision(_)
            | WireError::PrivateDataTooLong(_)
            | WireError::EnhancedWordMissing
            | WireError::EnhancedOnRevisionOne
            | WireError::ReadLimitOutOfRange(_) => return None,
        })
    }
}

impl core::fmt::Display for WireError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            WireError::Truncated { needed, available } => {
                write!(f, "truncated: {needed} bytes needed, {available} available")
            }
            WireError::BufferTooSmall { needed, available } => {
                write!(
                    f,
                    "output buffer too small: {needed} bytes needed, {available} available"
                )
            }
            WireError::BadMpaKey => f.write_str("not an MPA Request/Reply key"),
            WireError::UnexpectedMpaKind => {
                f.write_str("MPA Request where a Reply was expected, or the reverse")
            }
            WireError::UnsupportedMpaRevision(r) => write!(f, "unsupported MPA revision {r}"),
            WireError::PrivateDataTooLong(n) => write!(f, "MPA private data length {n} exceeds 512"),
            WireError::EnhancedWordMissing => f.write_str("MPA S=1 with PD_Length < 4 (no IRD/ORD word)"),
            WireError::EnhancedOnRevisionOne => f.write_str("MPA S=1 on a Rev 1 frame"),
            WireError::ReadLimitOutOfRange(v) => write!(f, "IRD/ORD value {v} exceeds 0x3FFF"),
            WireError::UlpduTooShort(n) => write!(f, "ULPDU length {n} shorter than a DDP header"),
            WireError::UlpduTooLong { length, max } => {
                write!(f, "ULPDU length {length} exceeds maximum {max}")
            }
            WireError::CrcMismatch { received, computed } => {
                write!(
                    f,
                    "MPA CRC mismatch: received {received:#010x}, computed {computed:#010x}"
                )
            }
            WireError::BadDdpVersion(v) => write!(f, "DDP version {v} (expected 1)"),
            WireError::BadRdmapVersion(v) => write!(f, "RDMAP version {v} (expected 1)"),
            WireError::UnknownOpcode(o) => write!(f, "unknown RDMAP opcode {o}"),
            WireError::TaggedMismatch { opcode, tagged } => {
                write!(
                    f,
                    "RDMAP opcode {opcode} in a {} DDP segment",
                    if *tagged { "tagged" } else { "untagged" }
                )
            }
            WireError::InvalidQueueNumber { opcode, queue } => {
                write!(f, "queue number {queue} invalid for RDMAP opcode {opcode}")
            }
            WireError::SegmentedControlMessage(o) => write!(f, "RDMAP opcode {o} without the DDP Last flag"),
            WireError::BadReadRequestLength(n) => {
                write!(f, "RDMA Read Request payload of {n} bytes (28 expected)")
            }
            WireError::BadTerminateLength { expected, available } => {
                write!(
                    f,
                    "Terminate needs {expected} bytes for its optional fields, {available} available"
                )
            }
            WireError::UnknownTerminateLayer(l) => write!(f, "Terminate layer {l} (0-2 defined)"),
        }
    }
}
