//! The RDMAP Terminate message (RFC 5040 §4.8). The error layers, types and codes it carries are
//! [`super::cause`]'s, re-exported here.
//!
//! ```text
//!  Terminate Control (32 bits): Layer(4) EType(4) ErrorCode(8) M D R(3) reserved(13)
//!  [DDP Segment Length (16 bits)       if M]
//!  [Terminated DDP header (14 or 18 B) if D — tagged or untagged by its own T bit]
//!  [Terminated RDMA header (28 B)      if R — the RDMA Read Request header]
//! ```

use super::buf::{check_len, check_room};
use super::cause::TerminateCause;
pub use super::cause::{ddp_code, ddp_type, layer, llp_code, llp_type, rdmap_code, rdmap_type};
use super::ddp::{CTRL_TAGGED, TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN};
use super::error::WireError;
use super::read_request::{READ_REQUEST_LEN, ReadRequestRepr};

const FLAG_M: u16 = 0x8000;
const FLAG_D: u16 = 0x4000;
const FLAG_R: u16 = 0x2000;
pub const TERMINATE_CONTROL_LEN: usize = 4;

/// A parsed Terminate message body (what follows the untagged DDP header on queue 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TerminateRepr<'a> {
    pub cause: TerminateCause,
    /// M: the length of the terminated DDP segment.
    pub ddp_segment_length: Option<u16>,
    /// D: the terminated DDP header (14 bytes tagged or 18 untagged, by its T bit).
    pub ddp_header: Option<&'a [u8]>,
    /// R: the terminated RDMA Read Request header.
    pub read_request: Option<ReadRequestRepr>,
}

impl<'a> TerminateRepr<'a> {
    /// A Terminate carrying only the cause.
    pub const fn new(cause: TerminateCause) -> Self {
        TerminateRepr {
            cause,
            ddp_segment_length: None,
            ddp_header: None,
            read_request: None,
        }
    }

    pub fn parse(buf: &'a [u8]) -> Result<Self, WireError> {
        check_len(buf, TERMINATE_CONTROL_LEN)?;
        let layer = buf[0] >> 4;
        if layer > super::cause::layer::LLP {
            return Err(WireError::UnknownTerminateLayer(layer));
        }
        let cause = TerminateCause::new(layer, buf[0] & 0x0F, buf[1]);
        let hdrct = u16::from_be_bytes([buf[2], buf[3]]);
        let mut at = TERMINATE_CONTROL_LEN;
        let need = |at: usize, n: usize| -> Result<(), WireError> {
            if buf.len() < at + n {
                Err(WireError::BadTerminateLength {
                    expected: at + n,
                    available: buf.len(),
                })
            } else {
                Ok(())
            }
        };
        let ddp_segment_length = if hdrct & FLAG_M != 0 {
            need(at, 2)?;
            let v = u16::from_be_bytes([buf[at], buf[at + 1]]);
            at += 2;
            Some(v)
        } else {
            None
        };
        let ddp_header = if hdrct & FLAG_D != 0 {
            need(at, 1)?;
            let n = if buf[at] & CTRL_TAGGED != 0 {
                TAGGED_HEADER_LEN
            } else {
                UNTAGGED_HEADER_LEN
            };
            need(at, n)?;
            let h = &buf[at..at + n];
            at += n;
            Some(h)
        } else {
            None
        };
        let read_request = if hdrct & FLAG_R != 0 {
            need(at, READ_REQUEST_LEN)?;
            let r = ReadRequestRepr::parse(&buf[at..at + READ_REQUEST_LEN])?;
            at += READ_REQUEST_LEN;
            Some(r)
        } else {
            None
        };
        // Anything after the declared fields is padding the sender chose; RFC 5040 §4.8 does not forbid it.
        let _ = at;
        Ok(TerminateRepr {
            cause,
            ddp_segment_length,
            ddp_header,
            read_request,
        })
    }

    pub fn buffer_len(&self) -> usize {
        TERMINATE_CONTROL_LEN
            + self.ddp_segment_length.map_or(0, |_| 2)
            + self.ddp_header.map_or(0, |h| h.len())
            + self.read_request.map_or(0, |_| READ_REQUEST_LEN)
    }

    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let len = self.buffer_len();
        check_room(buf, len)?;
        if self.cause.layer > layer::LLP {
            return Err(WireError::UnknownTerminateLayer(self.cause.layer));
        }
        if let Some(h) = self.ddp_header {
            let expect = match h.first() {
                Some(c) if c & CTRL_TAGGED != 0 => TAGGED_HEADER_LEN,
                _ => UNTAGGED_HEADER_LEN,
            };
            if h.len() != expect {
                return Err(WireError::BadTerminateLength {
                    expected: expect,
                    available: h.len(),
                });
            }
        }
        buf[0] = (self.cause.layer << 4) | (self.cause.error_type & 0x0F);
        buf[1] = self.cause.code;
        let mut hdrct = 0u16;
        let mut at = TERMINATE_CONTROL_LEN;
        if let Some(l) = self.ddp_segment_length {
            hdrct |= FLAG_M;
            buf[at..at + 2].copy_from_slice(&l.to_be_bytes());
            at += 2;
        }
        if let Some(h) = self.ddp_header {
            hdrct |= FLAG_D;
            buf[at..at + h.len()].copy_from_slice(h);
            at += h.len();
        }
        if let Some(r) = &self.read_request {
            hdrct |= FLAG_R;
            r.emit(&mut buf[at..at + READ_REQUEST_LEN])?;
            at += READ_REQUEST_LEN;
        }
        buf[2..4].copy_from_slice(&hdrct.to_be_bytes());
        Ok(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::rdmap::MessageRepr;
    use proptest::prelude::*;
    use std::vec;
    use std::vec::Vec;

    /// A Terminate for an RDMA Write to an invalid STag: RDMAP layer, remote protection, invalid STag, with
    /// the terminated tagged DDP header (M and D set), written from the layout (docs/iwarp-wire.md §5).
    #[test]
    fn invalid_stag_vector() {
        let terminated: [u8; 14] = [0xC1, 0x40, 0xDE, 0xAD, 0xBE, 0xEF, 0, 0, 0, 0, 0, 0, 0, 0];
        let t = TerminateRepr {
            cause: TerminateCause::new(
                layer::RDMAP,
                rdmap_type::REMOTE_PROTECTION,
                rdmap_code::INVALID_STAG,
            ),
            ddp_segment_length: Some(64),
            ddp_header: Some(&terminated),
            read_request: None,
        };
        let mut body = vec![0u8; t.buffer_len()];
        assert_eq!(t.emit(&mut body), Ok(20));
        let mut expected: Vec<u8> = vec![0x01, 0x00, 0xC0, 0x00, 0x00, 64];
        expected.extend_from_slice(&terminated);
        assert_eq!(body, expected);
        let msg = MessageRepr::new_terminate(&body);
        let mut buf = vec![0u8; msg.buffer_len()];
        msg.emit(&mut buf).unwrap();
        assert_eq!(
            &buf[..18],
            &[0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0]
        );
        assert_eq!(MessageRepr::parse(&buf).unwrap().terminate(), Ok(t));
    }

    #[test]
    fn optional_fields_must_fit() {
        assert_eq!(
            TerminateRepr::parse(&[0x01, 0x00, 0x80, 0x00, 0x00]),
            Err(WireError::BadTerminateLength {
                expected: 6,
                available: 5
            })
        );
        assert_eq!(
            TerminateRepr::parse(&[0x01, 0x00, 0x40, 0x00, 0x41, 0x43]),
            Err(WireError::BadTerminateLength {
                expected: 22,
                available: 6
            })
        );
        assert_eq!(
            TerminateRepr::parse(&[0x31, 0, 0, 0]),
            Err(WireError::UnknownTerminateLayer(3))
        );
        let t = TerminateRepr::parse(&[0x20, 0x06, 0x00, 0x00]).unwrap();
        assert_eq!(
            t,
            TerminateRepr::new(TerminateCause::new(
                layer::LLP,
                llp_type::MPA,
                llp_code::INSUFFICIENT_IRD
            ))
        );
    }

    proptest! {
        #[test]
        fn round_trip(layer in 0u8..3, etype in 0u8..16, code in any::<u8>(), seg in proptest::option::of(any::<u16>()),
                      hdr in proptest::option::of(any::<bool>()), rr in proptest::option::of(any::<(u32, u64, u32, u32, u64)>())) {
            let tagged = [0xC1u8; 14];
            let untagged = [0x41u8; 18];
            let t = TerminateRepr {
                cause: TerminateCause::new(layer, etype, code),
                ddp_segment_length: seg,
                ddp_header: hdr.map(|t| if t { &tagged[..] } else { &untagged[..] }),
                read_request: rr.map(|v| ReadRequestRepr { sink_stag: v.0, sink_offset: v.1,
                    read_size: v.2, source_stag: v.3, source_offset: v.4 }),
            };
            let mut b = vec![0u8; t.buffer_len()];
            prop_assert_eq!(t.emit(&mut b), Ok(b.len()));
            prop_assert_eq!(TerminateRepr::parse(&b), Ok(t));
        }

        #[test]
        fn arbitrary_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = TerminateRepr::parse(&buf);
        }
    }
}
