//! FPDU framing (RFC 5044 §4): `ULPDU_Length (2) | ULPDU | pad 0-3 | CRC32c (4)`.
//!
//! The CRC field is always present; it is zero when CRC was not negotiated (RFC 5044 §4.4). The CRC covers
//! the length, the ULPDU and the pad, and Linux puts the 32-bit value on the wire little-endian
//! (docs/iwarp-wire.md §3). Markers are never negotiated (soft-rdma refuses M=1), so this is all there is.

use super::buf::{check_len, check_room};
use super::error::WireError;

pub const LENGTH_LEN: usize = 2;
pub const CRC_LEN: usize = 4;
/// The smallest ULPDU: a tagged DDP header (RFC 5041 §4.3).
pub const MIN_ULPDU_LEN: usize = super::ddp::TAGGED_HEADER_LEN;

/// Pad bytes after a ULPDU of `ulpdu_len` so that the FPDU is a multiple of 4 (RFC 5044 §4.1).
pub const fn pad_len(ulpdu_len: usize) -> usize {
    (4 - (ulpdu_len + LENGTH_LEN) % 4) % 4
}

/// The FPDU carrying a ULPDU of `ulpdu_len` bytes.
pub const fn fpdu_len(ulpdu_len: usize) -> usize {
    LENGTH_LEN + ulpdu_len + pad_len(ulpdu_len) + CRC_LEN
}

/// The largest ULPDU whose FPDU fits `fpdu_room` bytes (e.g. the TCP MSS): RFC 5044 §4.1 "MULPDU".
pub const fn max_ulpdu_for(fpdu_room: usize) -> usize {
    let body = (fpdu_room.saturating_sub(CRC_LEN)) & !3;
    body.saturating_sub(LENGTH_LEN)
}

/// A parsed FPDU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FpduRepr<'a> {
    pub ulpdu: &'a [u8],
    /// The CRC field as received (little-endian on the wire), 0 when CRC is off.
    pub crc: u32,
}

impl<'a> FpduRepr<'a> {
    /// The FPDU at the start of `buf` is this long; `Ok(None)` until the 2-byte length is there. Errors on
    /// a length no peer may send (shorter than a DDP header, longer than `max_ulpdu`), decided from the
    /// length field alone (RFC 5044 §4.1).
    pub fn frame_len(buf: &[u8], max_ulpdu: usize) -> Result<Option<usize>, WireError> {
        if buf.len() < LENGTH_LEN {
            return Ok(None);
        }
        let ulpdu_len = u16::from_be_bytes([buf[0], buf[1]]);
        if (ulpdu_len as usize) < MIN_ULPDU_LEN {
            return Err(WireError::UlpduTooShort(ulpdu_len));
        }
        if ulpdu_len as usize > max_ulpdu {
            return Err(WireError::UlpduTooLong {
                length: ulpdu_len,
                max: max_ulpdu.min(u16::MAX as usize) as u16,
            });
        }
        Ok(Some(fpdu_len(ulpdu_len as usize)))
    }

    /// Parses the FPDU at the start of `buf` (which holds all of it) without checking the CRC.
    pub fn parse(buf: &'a [u8], max_ulpdu: usize) -> Result<Self, WireError> {
        let len = Self::frame_len(buf, max_ulpdu)?.ok_or(WireError::Truncated {
            needed: LENGTH_LEN,
            available: buf.len(),
        })?;
        check_len(buf, len)?;
        let ulpdu_len = u16::from_be_bytes([buf[0], buf[1]]) as usize;
        let crc_at = len - CRC_LEN;
        let crc = u32::from_le_bytes([buf[crc_at], buf[crc_at + 1], buf[crc_at + 2], buf[crc_at + 3]]);
        Ok(FpduRepr {
            ulpdu: &buf[LENGTH_LEN..LENGTH_LEN + ulpdu_len],
            crc,
        })
    }

    pub fn buffer_len(&self) -> usize {
        fpdu_len(self.ulpdu.len())
    }

    /// Writes length, ULPDU, zero pad and a zero CRC field; returns the FPDU length. With CRC negotiated,
    /// call [`seal_crc`] on the written bytes (or use [`FpduRepr::emit_with_crc`]).
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let len = self.buffer_len();
        check_room(buf, len)?;
        let ulpdu_len = u16::try_from(self.ulpdu.len()).map_err(|_| WireError::UlpduTooLong {
            length: u16::MAX,
            max: u16::MAX,
        })?;
        buf[..LENGTH_LEN].copy_from_slice(&ulpdu_len.to_be_bytes());
        buf[LENGTH_LEN..LENGTH_LEN + self.ulpdu.len()].copy_from_slice(self.ulpdu);
        buf[LENGTH_LEN + self.ulpdu.len()..len].fill(0);
        Ok(len)
    }
}

/// CRC32c over an FPDU (RFC 5044 §4.4), with the hardware-accelerated `crc32c` crate.
#[cfg(feature = "crc")]
mod crc {
    use super::*;

    /// CRC32c (Castagnoli) of `data`: init ~0, final ~crc, as RFC 5044 §4.4 and RFC 3385 specify.
    pub fn crc32c(data: &[u8]) -> u32 {
        crc32c::crc32c(data)
    }

    /// Computes the CRC over `fpdu[..len-4]` and stores it little-endian in the last 4 bytes.
    pub fn seal_crc(fpdu: &mut [u8]) -> Result<(), WireError> {
        check_len(fpdu, LENGTH_LEN + CRC_LEN)?;
        let at = fpdu.len() - CRC_LEN;
        let crc = crc32c(&fpdu[..at]);
        fpdu[at..].copy_from_slice(&crc.to_le_bytes());
        Ok(())
    }

    /// Checks the CRC of a whole FPDU (`fpdu` is exactly one FPDU).
    pub fn verify_crc(fpdu: &[u8]) -> Result<(), WireError> {
        check_len(fpdu, LENGTH_LEN + CRC_LEN)?;
        let at = fpdu.len() - CRC_LEN;
        let received = u32::from_le_bytes([fpdu[at], fpdu[at + 1], fpdu[at + 2], fpdu[at + 3]]);
        let computed = crc32c(&fpdu[..at]);
        if received != computed {
            Err(WireError::CrcMismatch { received, computed })
        } else {
            Ok(())
        }
    }

    impl FpduRepr<'_> {
        /// [`FpduRepr::emit`] then [`seal_crc`].
        pub fn emit_with_crc(&self, buf: &mut [u8]) -> Result<usize, WireError> {
            let len = self.emit(buf)?;
            seal_crc(&mut buf[..len])?;
            Ok(len)
        }
    }
}

#[cfg(feature = "crc")]
pub use crc::{crc32c, seal_crc, verify_crc};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ddp::Placement;
    use crate::wire::rdmap::{MessageRepr, RdmapOpcode};
    use proptest::prelude::*;
    use std::vec;
    use std::vec::Vec;

    #[test]
    fn crc32c_reference_vector() {
        // docs/iwarp-wire.md §3.
        assert_eq!(crc32c(b"Hello world!"), 0x7B98_E751);
    }

    #[test]
    fn pad_rule() {
        assert_eq!((pad_len(14), pad_len(15), pad_len(16), pad_len(17)), (0, 3, 2, 1));
        assert_eq!(fpdu_len(14), 20);
        assert_eq!(max_ulpdu_for(1460), 1454);
        assert_eq!(fpdu_len(max_ulpdu_for(1460)), 1460);
    }

    /// An FPDU carrying a 5-byte RDMA Write to STag 0x12345678 at offset 0x1000, written from the layout.
    fn write_fpdu(with_crc: bool) -> Vec<u8> {
        let msg = MessageRepr {
            opcode: RdmapOpcode::RdmaWrite,
            last: true,
            placement: Placement::Tagged {
                stag: 0x1234_5678,
                offset: 0x1000,
            },
            payload: b"hello",
        };
        let mut ulpdu = vec![0u8; msg.buffer_len()];
        msg.emit(&mut ulpdu).unwrap();
        let f = FpduRepr {
            ulpdu: &ulpdu,
            crc: 0,
        };
        let mut out = vec![0u8; f.buffer_len()];
        if with_crc {
            f.emit_with_crc(&mut out).unwrap()
        } else {
            f.emit(&mut out).unwrap()
        };
        out
    }

    #[test]
    fn rdma_write_vector() {
        let fpdu = write_fpdu(false);
        let mut expected = vec![0x00, 19]; // ULPDU_Length = 14 + 5
        expected.extend_from_slice(&[0xC1, 0x40]); // T|L|DV=1, RV=1 opcode 0
        expected.extend_from_slice(&[0x12, 0x34, 0x56, 0x78]);
        expected.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0x10, 0x00]);
        expected.extend_from_slice(b"hello");
        expected.extend_from_slice(&[0, 0, 0]); // pad: (2 + 19) % 4 = 1 → 3
        expected.extend_from_slice(&[0, 0, 0, 0]); // CRC off
        assert_eq!(fpdu, expected);
        let with_crc = write_fpdu(true);
        assert_eq!(with_crc[..24], expected[..24]);
        let crc = crc32c(&expected[..24]);
        assert_eq!(&with_crc[24..], &crc.to_le_bytes());
        verify_crc(&with_crc).unwrap();
        let parsed = FpduRepr::parse(&with_crc, 1454).unwrap();
        assert_eq!(parsed.crc, crc);
        assert_eq!(MessageRepr::parse(parsed.ulpdu).unwrap().payload, b"hello");
    }

    #[test]
    fn framing_errors() {
        let mut f = write_fpdu(true);
        f[10] ^= 1;
        assert!(matches!(verify_crc(&f), Err(WireError::CrcMismatch { .. })));
        assert_eq!(
            FpduRepr::frame_len(&[0, 13], 1454),
            Err(WireError::UlpduTooShort(13))
        );
        assert_eq!(
            FpduRepr::frame_len(&[0x05, 0xAF], 1454),
            Err(WireError::UlpduTooLong {
                length: 1455,
                max: 1454
            })
        );
        assert_eq!(FpduRepr::frame_len(&[0], 1454), Ok(None));
        assert!(matches!(
            FpduRepr::parse(&f[..20], 1454),
            Err(WireError::Truncated { needed: 28, .. })
        ));
    }

    proptest! {
        #[test]
        fn round_trip(ulpdu in proptest::collection::vec(any::<u8>(), 14..2000), crc in any::<bool>()) {
            let f = FpduRepr { ulpdu: &ulpdu, crc: 0 };
            let mut buf = vec![0u8; f.buffer_len()];
            let n = if crc { f.emit_with_crc(&mut buf).unwrap() } else { f.emit(&mut buf).unwrap() };
            prop_assert_eq!(n % 4, 0);
            prop_assert_eq!(FpduRepr::frame_len(&buf, 2000), Ok(Some(n)));
            let p = FpduRepr::parse(&buf, 2000).unwrap();
            prop_assert_eq!(p.ulpdu, &ulpdu[..]);
            if crc { prop_assert!(verify_crc(&buf).is_ok()); } else { prop_assert_eq!(p.crc, 0); }
        }

        #[test]
        fn arbitrary_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..300), max in 0usize..70000) {
            let _ = FpduRepr::frame_len(&buf, max);
            let _ = FpduRepr::parse(&buf, max);
            let _ = verify_crc(&buf);
        }
    }
}
