//! The vocabulary of a Terminate's cause: the (layer, error type, error code) triple a Terminate carries
//! (RFC 5040 §4.8), and the numbers each layer defines for it (RFC 5040 §7.2 RDMAP, RFC 5041 §7.2 DDP,
//! RFC 5044 §8 and RFC 6581 §9 MPA). [`super::error`] maps malformations to causes and [`super::terminate`]
//! puts them on the wire; both use this module, which uses neither.

/// The (layer, error type, error code) triple of an RDMAP Terminate (RFC 5040 §4.8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TerminateCause {
    pub layer: u8,
    pub error_type: u8,
    pub code: u8,
}

impl TerminateCause {
    pub const fn new(layer: u8, error_type: u8, code: u8) -> Self {
        TerminateCause {
            layer,
            error_type,
            code,
        }
    }
}

/// Terminate layers (RFC 5040 §4.8).
pub mod layer {
    pub const RDMAP: u8 = 0;
    pub const DDP: u8 = 1;
    pub const LLP: u8 = 2;
}

/// RDMAP error types (RFC 5040 §7.2).
pub mod rdmap_type {
    pub const CATASTROPHIC: u8 = 0;
    pub const REMOTE_PROTECTION: u8 = 1;
    pub const REMOTE_OPERATION: u8 = 2;
}

/// RDMAP error codes (RFC 5040 §7.2).
pub mod rdmap_code {
    pub const INVALID_STAG: u8 = 0x00;
    pub const BASE_OR_BOUNDS: u8 = 0x01;
    pub const ACCESS_RIGHTS: u8 = 0x02;
    pub const STAG_NOT_ASSOCIATED: u8 = 0x03;
    pub const TO_WRAP: u8 = 0x04;
    pub const INVALID_VERSION: u8 = 0x05;
    pub const UNEXPECTED_OPCODE: u8 = 0x06;
    pub const CATASTROPHIC_STREAM: u8 = 0x07;
    pub const CATASTROPHIC_GLOBAL: u8 = 0x08;
    pub const CANNOT_INVALIDATE: u8 = 0x09;
    pub const UNSPECIFIED: u8 = 0xFF;
}

/// DDP error types (RFC 5041 §7.2).
pub mod ddp_type {
    pub const CATASTROPHIC: u8 = 0;
    pub const TAGGED_BUFFER: u8 = 1;
    pub const UNTAGGED_BUFFER: u8 = 2;
}

/// DDP error codes (RFC 5041 §7.2); tagged codes with type 1, untagged with type 2.
pub mod ddp_code {
    pub const TAGGED_INVALID_STAG: u8 = 0x00;
    pub const TAGGED_BASE_OR_BOUNDS: u8 = 0x01;
    pub const TAGGED_STAG_NOT_ASSOCIATED: u8 = 0x02;
    pub const TAGGED_TO_WRAP: u8 = 0x03;
    pub const TAGGED_VERSION: u8 = 0x04;
    pub const UNTAGGED_INVALID_QN: u8 = 0x01;
    /// No buffer for the MSN: a Send with no posted Receive (iWARP has no RNR retry).
    pub const UNTAGGED_NO_BUFFER: u8 = 0x02;
    pub const UNTAGGED_MSN_RANGE: u8 = 0x03;
    pub const UNTAGGED_INVALID_MO: u8 = 0x04;
    pub const UNTAGGED_MESSAGE_TOO_LONG: u8 = 0x05;
    pub const UNTAGGED_VERSION: u8 = 0x06;
}

/// LLP (MPA) error type (RFC 5044 §8).
pub mod llp_type {
    pub const MPA: u8 = 0;
}

/// MPA error codes (RFC 5044 §8; 0x05-0x07 from RFC 6581 §9).
pub mod llp_code {
    pub const TCP_STREAM_LOST: u8 = 0x01;
    pub const CRC_ERROR: u8 = 0x02;
    pub const FPDU_START: u8 = 0x03;
    pub const INVALID_REQUEST_REPLY: u8 = 0x04;
    pub const LOCAL_CATASTROPHIC: u8 = 0x05;
    pub const INSUFFICIENT_IRD: u8 = 0x06;
    pub const NO_MATCHING_RTR: u8 = 0x07;
}
