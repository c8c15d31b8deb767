//! The vocabulary of a Terminate's cause: the (layer, error type, error code) triple a Terminate carries
//! (RFC 5040 §4.8), and the numbers each layer defines for it (RFC 5040 §7.2 RDMAP, RFC 5041 §7.2 DDP,
//! RFC 5044 §8 and RFC 6581 §9 MPA). [`super::error`] maps malformations to causes and [`super::terminate`]
//! puts them on the wire; both use this module, which uses neither. Each cause also has its names and a
//! `Display` in words ([`TerminateCause::layer_name`], [`TerminateCause::type_name`],
//! [`TerminateCause::code_name`]), so that a Terminate is never reported as bare numbers.

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

    /// The layer's name (RFC 5040 §4.8): "RDMAP", "DDP" or "MPA" (the LLP); `None` past layer 2.
    pub const fn layer_name(self) -> Option<&'static str> {
        match self.layer {
            layer::RDMAP => Some("RDMAP"),
            layer::DDP => Some("DDP"),
            layer::LLP => Some("MPA"),
            _ => None,
        }
    }

    /// The error type's name within its layer (RFC 5040 §7.2, RFC 5041 §7.2, RFC 5044 §8); `None` for a
    /// type the layer does not define.
    pub const fn type_name(self) -> Option<&'static str> {
        Some(match (self.layer, self.error_type) {
            (layer::RDMAP, rdmap_type::CATASTROPHIC) | (layer::DDP, ddp_type::CATASTROPHIC) => {
                "local catastrophic error"
            }
            (layer::RDMAP, rdmap_type::REMOTE_PROTECTION) => "remote protection error",
            (layer::RDMAP, rdmap_type::REMOTE_OPERATION) => "remote operation error",
            (layer::DDP, ddp_type::TAGGED_BUFFER) => "tagged buffer error",
            (layer::DDP, ddp_type::UNTAGGED_BUFFER) => "untagged buffer error",
            (layer::LLP, llp_type::MPA) => "error",
            _ => return None,
        })
    }

    /// The error code's name within its layer and type (RFC 5040 §7.2, RFC 5041 §7.2, RFC 5044 §8 and
    /// RFC 6581 §9); `None` for a code the type does not define, and for the catastrophic types, whose
    /// only code (0x00) says nothing more than the type.
    pub const fn code_name(self) -> Option<&'static str> {
        Some(match (self.layer, self.error_type, self.code) {
            (layer::RDMAP, rdmap_type::REMOTE_PROTECTION | rdmap_type::REMOTE_OPERATION, code) => {
                match code {
                    rdmap_code::INVALID_STAG => "invalid STag",
                    rdmap_code::BASE_OR_BOUNDS => "base or bounds violation",
                    rdmap_code::ACCESS_RIGHTS => "access rights violation",
                    rdmap_code::STAG_NOT_ASSOCIATED => "STag not associated with the stream",
                    rdmap_code::TO_WRAP => "tagged offset wraps",
                    rdmap_code::INVALID_VERSION => "invalid RDMAP version",
                    rdmap_code::UNEXPECTED_OPCODE => "unexpected opcode",
                    rdmap_code::CATASTROPHIC_STREAM => "catastrophic error, localized to the stream",
                    rdmap_code::CATASTROPHIC_GLOBAL => "catastrophic error, global",
                    rdmap_code::CANNOT_INVALIDATE => "STag cannot be invalidated",
                    rdmap_code::UNSPECIFIED => "unspecified error",
                    _ => return None,
                }
            }
            (layer::DDP, ddp_type::TAGGED_BUFFER, code) => match code {
                ddp_code::TAGGED_INVALID_STAG => "invalid STag",
                ddp_code::TAGGED_BASE_OR_BOUNDS => "base or bounds violation",
                ddp_code::TAGGED_STAG_NOT_ASSOCIATED => "STag not associated with the stream",
                ddp_code::TAGGED_TO_WRAP => "tagged offset wraps",
                ddp_code::TAGGED_VERSION => "invalid DDP version",
                _ => return None,
            },
            (layer::DDP, ddp_type::UNTAGGED_BUFFER, code) => match code {
                ddp_code::UNTAGGED_INVALID_QN => "invalid queue number",
                ddp_code::UNTAGGED_NO_BUFFER => "no buffer for the MSN",
                ddp_code::UNTAGGED_MSN_RANGE => "MSN out of range",
                ddp_code::UNTAGGED_INVALID_MO => "invalid message offset",
                ddp_code::UNTAGGED_MESSAGE_TOO_LONG => "message too long for the buffer",
                ddp_code::UNTAGGED_VERSION => "invalid DDP version",
                _ => return None,
            },
            (layer::LLP, llp_type::MPA, code) => match code {
                llp_code::TCP_STREAM_LOST => "TCP stream lost",
                llp_code::CRC_ERROR => "CRC error",
                llp_code::FPDU_START => "FPDU start or length mismatch",
                llp_code::INVALID_REQUEST_REPLY => "invalid MPA Request or Reply",
                llp_code::LOCAL_CATASTROPHIC => "local catastrophic error",
                llp_code::INSUFFICIENT_IRD => "insufficient IRD",
                llp_code::NO_MATCHING_RTR => "no matching RTR",
                _ => return None,
            },
            _ => return None,
        })
    }

    /// Where the layer's types and codes are defined.
    pub const fn rfc(self) -> &'static str {
        match self.layer {
            layer::RDMAP => "RFC 5040 §7.2",
            layer::DDP => "RFC 5041 §7.2",
            layer::LLP if self.code >= llp_code::LOCAL_CATASTROPHIC => "RFC 6581 §9",
            layer::LLP => "RFC 5044 §8",
            _ => "RFC 5040 §4.8",
        }
    }
}

/// The cause in words, then its numbers and the RFC that defines them: "DDP tagged buffer error, invalid
/// STag (layer 1, type 1, code 0x00; RFC 5041 §7.2)". A type or code the RFCs do not define is given by
/// its number alone, marked "undefined".
impl core::fmt::Display for TerminateCause {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match (self.layer_name(), self.type_name()) {
            (Some(l), Some(t)) => write!(f, "{l} {t}")?,
            (Some(l), None) => write!(f, "{l} error of undefined type {}", self.error_type)?,
            (None, _) => f.write_str("error of undefined layer")?,
        }
        let catastrophic = self.layer != layer::LLP && self.error_type == 0 && self.code == 0;
        match self.code_name() {
            Some(c) => write!(f, ", {c}")?,
            None if self.type_name().is_some() && !catastrophic => f.write_str(", undefined code")?,
            None => {}
        }
        write!(
            f,
            " (layer {}, type {}, code {:#04x}; {})",
            self.layer,
            self.error_type,
            self.code,
            self.rfc()
        )
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::format;

    /// Every defined (layer, type, code) has a name and says so in words; each Display keeps the numbers.
    #[test]
    fn causes_in_words() {
        let cases = [
            (
                TerminateCause::new(layer::DDP, ddp_type::TAGGED_BUFFER, ddp_code::TAGGED_INVALID_STAG),
                "DDP tagged buffer error, invalid STag (layer 1, type 1, code 0x00; RFC 5041 §7.2)",
            ),
            (
                TerminateCause::new(
                    layer::DDP,
                    ddp_type::UNTAGGED_BUFFER,
                    ddp_code::UNTAGGED_NO_BUFFER,
                ),
                "DDP untagged buffer error, no buffer for the MSN (layer 1, type 2, code 0x02; RFC 5041 §7.2)",
            ),
            (
                TerminateCause::new(
                    layer::RDMAP,
                    rdmap_type::REMOTE_PROTECTION,
                    rdmap_code::ACCESS_RIGHTS,
                ),
                "RDMAP remote protection error, access rights violation (layer 0, type 1, code 0x02; RFC 5040 §7.2)",
            ),
            (
                TerminateCause::new(layer::LLP, llp_type::MPA, llp_code::CRC_ERROR),
                "MPA error, CRC error (layer 2, type 0, code 0x02; RFC 5044 §8)",
            ),
            (
                TerminateCause::new(layer::LLP, llp_type::MPA, llp_code::INSUFFICIENT_IRD),
                "MPA error, insufficient IRD (layer 2, type 0, code 0x06; RFC 6581 §9)",
            ),
            (
                TerminateCause::new(layer::DDP, ddp_type::CATASTROPHIC, 0),
                "DDP local catastrophic error (layer 1, type 0, code 0x00; RFC 5041 §7.2)",
            ),
            (
                TerminateCause::new(layer::DDP, ddp_type::TAGGED_BUFFER, 0x77),
                "DDP tagged buffer error, undefined code (layer 1, type 1, code 0x77; RFC 5041 §7.2)",
            ),
            (
                TerminateCause::new(layer::RDMAP, 9, 1),
                "RDMAP error of undefined type 9 (layer 0, type 9, code 0x01; RFC 5040 §7.2)",
            ),
            (
                TerminateCause::new(5, 1, 1),
                "error of undefined layer (layer 5, type 1, code 0x01; RFC 5040 §4.8)",
            ),
        ];
        for (cause, words) in cases {
            assert_eq!(format!("{cause}"), words);
        }
    }

    /// The codes the constants define all have names (a constant added without one fails here).
    #[test]
    fn every_constant_is_named() {
        let rdmap = [
            rdmap_code::INVALID_STAG,
            rdmap_code::BASE_OR_BOUNDS,
            rdmap_code::ACCESS_RIGHTS,
            rdmap_code::STAG_NOT_ASSOCIATED,
            rdmap_code::TO_WRAP,
            rdmap_code::INVALID_VERSION,
            rdmap_code::UNEXPECTED_OPCODE,
            rdmap_code::CATASTROPHIC_STREAM,
            rdmap_code::CATASTROPHIC_GLOBAL,
            rdmap_code::CANNOT_INVALIDATE,
            rdmap_code::UNSPECIFIED,
        ];
        for code in rdmap {
            for t in [rdmap_type::REMOTE_PROTECTION, rdmap_type::REMOTE_OPERATION] {
                assert!(TerminateCause::new(layer::RDMAP, t, code).code_name().is_some());
            }
        }
        let tagged = [
            ddp_code::TAGGED_INVALID_STAG,
            ddp_code::TAGGED_BASE_OR_BOUNDS,
            ddp_code::TAGGED_STAG_NOT_ASSOCIATED,
            ddp_code::TAGGED_TO_WRAP,
            ddp_code::TAGGED_VERSION,
        ];
        let untagged = [
            ddp_code::UNTAGGED_INVALID_QN,
            ddp_code::UNTAGGED_NO_BUFFER,
            ddp_code::UNTAGGED_MSN_RANGE,
            ddp_code::UNTAGGED_INVALID_MO,
            ddp_code::UNTAGGED_MESSAGE_TOO_LONG,
            ddp_code::UNTAGGED_VERSION,
        ];
        let llp = [
            llp_code::TCP_STREAM_LOST,
            llp_code::CRC_ERROR,
            llp_code::FPDU_START,
            llp_code::INVALID_REQUEST_REPLY,
            llp_code::LOCAL_CATASTROPHIC,
            llp_code::INSUFFICIENT_IRD,
            llp_code::NO_MATCHING_RTR,
        ];
        let named = |l, t, codes: &[u8]| {
            codes
                .iter()
                .all(|c| TerminateCause::new(l, t, *c).code_name().is_some())
        };
        assert!(named(layer::DDP, ddp_type::TAGGED_BUFFER, &tagged));
        assert!(named(layer::DDP, ddp_type::UNTAGGED_BUFFER, &untagged));
        assert!(named(layer::LLP, llp_type::MPA, &llp));
    }
}
