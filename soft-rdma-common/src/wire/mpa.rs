//! MPA Request and Reply frames (RFC 5044 §7.1) with the RFC 6581 §9 enhanced IRD/ORD word.
//!
//! ```text
//!  0                16      17     18          20
//!  | key (16 bytes) | flags | Rev | PD_Length | private data (PD_Length bytes) |
//!  flags: M 0x80 markers, C 0x40 CRC, R 0x20 reject (Reply only), S 0x10 enhanced (RFC 6581), low 4 reserved
//! ```
//! With S=1 the first 4 bytes of the private data are the enhanced word `A|B|IRD(14)|C|D|ORD(14)`;
//! [`MpaRepr::private_data`] is the application's part after it.

use zerocopy::byteorder::network_endian::U16;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::buf::{check_len, check_room, header_view};
use super::error::WireError;

pub const MPA_REQUEST_KEY: &[u8; 16] = b"MPA ID Req Frame";
pub const MPA_REPLY_KEY: &[u8; 16] = b"MPA ID Rep Frame";
pub const MPA_HEADER_LEN: usize = 20;
/// RFC 5044 §7.1: PD_Length (including the RFC 6581 word) never exceeds 512.
pub const MPA_MAX_PRIVATE_DATA: usize = 512;
/// Linux siw and rdma_cm cap private data at 256 bytes on the wire (docs/iwarp-wire.md §1).
pub const MPA_INTEROP_PRIVATE_DATA: usize = 256;

pub const FLAG_MARKERS: u8 = 0x80;
pub const FLAG_CRC: u8 = 0x40;
pub const FLAG_REJECT: u8 = 0x20;
pub const FLAG_ENHANCED: u8 = 0x10;

/// Request (initiator → responder) or Reply (responder → initiator).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MpaKind {
    Request,
    Reply,
}

impl MpaKind {
    pub const fn key(self) -> &'static [u8; 16] {
        match self {
            MpaKind::Request => MPA_REQUEST_KEY,
            MpaKind::Reply => MPA_REPLY_KEY,
        }
    }
}

/// Zero-copy view of the 20-byte MPA Request/Reply header.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct MpaHeader {
    key: [u8; 16],
    flags: u8,
    revision: u8,
    pd_length: U16,
}

impl MpaHeader {
    /// A checked view of the first 20 bytes of `buf`.
    pub fn view(buf: &[u8]) -> Result<&MpaHeader, WireError> {
        header_view(buf, MPA_HEADER_LEN)
    }

    pub fn key(&self) -> &[u8; 16] {
        &self.key
    }

    /// Which frame the key names, if any.
    pub fn kind(&self) -> Result<MpaKind, WireError> {
        match &self.key {
            k if k == MPA_REQUEST_KEY => Ok(MpaKind::Request),
            k if k == MPA_REPLY_KEY => Ok(MpaKind::Reply),
            _ => Err(WireError::BadMpaKey),
        }
    }

    pub fn flags(&self) -> u8 {
        self.flags
    }

    pub fn revision(&self) -> u8 {
        self.revision
    }

    pub fn pd_length(&self) -> u16 {
        self.pd_length.get()
    }
}

/// The RFC 6581 §9 IRD/ORD word: `A|B|IRD(14)` `C|D|ORD(14)`, two big-endian u16.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EnhancedControl {
    /// Inbound RDMA Read Queue Depth offered (reads this side will serve).
    pub ird: u16,
    /// Outbound RDMA Read Queue Depth (reads this side will issue).
    pub ord: u16,
    /// A: peer-to-peer mode, an RTR message is wanted.
    pub peer_to_peer: bool,
    /// B: zero-length Send RTR.
    pub send_rtr: bool,
    /// C: zero-length RDMA Write RTR.
    pub write_rtr: bool,
    /// D: zero-length RDMA Read RTR.
    pub read_rtr: bool,
}

impl EnhancedControl {
    pub const LEN: usize = 4;
    /// RFC 6581 §9.1: 0x3FFF = "no automatic negotiation" (echoed, local values unchanged).
    pub const NO_NEGOTIATION: u16 = 0x3FFF;
    pub const MAX: u16 = 0x3FFF;
    const A: u16 = 0x8000;
    const B: u16 = 0x4000;
    const C: u16 = 0x8000;
    const D: u16 = 0x4000;

    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        check_len(b, Self::LEN)?;
        let ird_word = u16::from_be_bytes([b[0], b[1]]);
        let ord_word = u16::from_be_bytes([b[2], b[3]]);
        Ok(EnhancedControl {
            ird: ird_word & Self::MAX,
            ord: ord_word & Self::MAX,
            peer_to_peer: ird_word & Self::A != 0,
            send_rtr: ird_word & Self::B != 0,
            write_rtr: ord_word & Self::C != 0,
            read_rtr: ord_word & Self::D != 0,
        })
    }

    pub fn emit(&self, b: &mut [u8]) -> Result<(), WireError> {
        check_room(b, Self::LEN)?;
        for v in [self.ird, self.ord] {
            if v > Self::MAX {
                return Err(WireError::ReadLimitOutOfRange(v));
            }
        }
        let ird_word =
            self.ird | if self.peer_to_peer { Self::A } else { 0 } | if self.send_rtr { Self::B } else { 0 };
        let ord_word =
            self.ord | if self.write_rtr { Self::C } else { 0 } | if self.read_rtr { Self::D } else { 0 };
        b[0..2].copy_from_slice(&ird_word.to_be_bytes());
        b[2..4].copy_from_slice(&ord_word.to_be_bytes());
        Ok(())
    }

    /// True if any RTR type is offered.
    pub fn any_rtr(&self) -> bool {
        self.send_rtr || self.write_rtr || self.read_rtr
    }
}

/// A parsed MPA Request or Reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MpaRepr<'a> {
    pub kind: MpaKind,
    /// M: the sender wants markers (nobody supports them; RFC 5044 §7.1).
    pub markers: bool,
    /// C: the sender wants CRC32c (if either side sets it, both use it; RFC 5044 §7.1).
    pub crc: bool,
    /// R: the responder rejects (Reply only; in a Request it is reserved).
    pub reject: bool,
    /// 1 (RFC 5044) or 2 (RFC 6581).
    pub revision: u8,
    /// Some ⇔ the S flag: the first 4 bytes of PD are the IRD/ORD word (RFC 6581 §9).
    pub enhanced: Option<EnhancedControl>,
    /// The application's private data, without the enhanced word.
    pub private_data: &'a [u8],
}

impl<'a> MpaRepr<'a> {
    /// How long the frame at the start of `buf` is, decided from the 20-byte header alone, so that a stream
    /// reader never waits for bytes a malformed header promises. `Ok(None)`: fewer than 20 bytes so far.
    pub fn frame_len(buf: &[u8]) -> Result<Option<usize>, WireError> {
        if buf.len() < MPA_HEADER_LEN {
            // Fail early on a wrong key as soon as the key's bytes disagree (a raw TCP peer sending garbage).
            let n = buf.len().min(16);
            if buf[..n] != MPA_REQUEST_KEY[..n] && buf[..n] != MPA_REPLY_KEY[..n] {
                return Err(WireError::BadMpaKey);
            }
            return Ok(None);
        }
        let header = MpaHeader::view(buf)?;
        header.kind()?;
        Self::check_revision(header.revision())?;
        let pd = header.pd_length();
        if pd as usize > MPA_MAX_PRIVATE_DATA {
            return Err(WireError::PrivateDataTooLong(pd));
        }
        Ok(Some(MPA_HEADER_LEN + pd as usize))
    }

    fn check_revision(revision: u8) -> Result<(), WireError> {
        // RFC 5044 §7.1 defines Rev 1, RFC 6581 §6 Rev 2. Linux siw also takes 0 as 1; soft-rdma does not:
        // no implementation sends 0, and refusing it keeps the revision meaningful.
        match revision {
            1 | 2 => Ok(()),
            r => Err(WireError::UnsupportedMpaRevision(r)),
        }
    }

    /// Parses the frame at the start of `buf` (which must hold all of it; bytes after it are ignored).
    pub fn parse(buf: &'a [u8]) -> Result<MpaRepr<'a>, WireError> {
        let len = match Self::frame_len(buf)? {
            Some(len) => len,
            None => {
                return Err(WireError::Truncated {
                    needed: MPA_HEADER_LEN,
                    available: buf.len(),
                });
            }
        };
        check_len(buf, len)?;
        let header = MpaHeader::view(buf)?;
        let kind = header.kind()?;
        let flags = header.flags();
        let revision = header.revision();
        let pd = &buf[MPA_HEADER_LEN..len];
        let (enhanced, private_data) = if flags & FLAG_ENHANCED != 0 {
            // RFC 6581 §6: S is only meaningful with Rev 2.
            if revision < 2 {
                return Err(WireError::EnhancedOnRevisionOne);
            }
            if pd.len() < EnhancedControl::LEN {
                return Err(WireError::EnhancedWordMissing);
            }
            (Some(EnhancedControl::parse(pd)?), &pd[EnhancedControl::LEN..])
        } else {
            (None, pd)
        };
        Ok(MpaRepr {
            kind,
            markers: flags & FLAG_MARKERS != 0,
            crc: flags & FLAG_CRC != 0,
            // R is defined for Replies only (RFC 5044 §7.1); in a Request it is reserved and ignored.
            reject: kind == MpaKind::Reply && flags & FLAG_REJECT != 0,
            revision,
            enhanced,
            private_data,
        })
    }

    /// PD_Length on the wire: private data plus the enhanced word when present.
    pub fn pd_length(&self) -> usize {
        self.private_data.len()
            + if self.enhanced.is_some() {
                EnhancedControl::LEN
            } else {
                0
            }
    }

    pub fn buffer_len(&self) -> usize {
        MPA_HEADER_LEN + self.pd_length()
    }

    /// Writes the frame; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let len = self.buffer_len();
        check_room(buf, len)?;
        Self::check_revision(self.revision)?;
        let pd_length = self.pd_length();
        if pd_length > MPA_MAX_PRIVATE_DATA {
            return Err(WireError::PrivateDataTooLong(
                pd_length.min(u16::MAX as usize) as u16
            ));
        }
        if self.enhanced.is_some() && self.revision < 2 {
            return Err(WireError::EnhancedOnRevisionOne);
        }
        let mut flags = 0;
        if self.markers {
            flags |= FLAG_MARKERS;
        }
        if self.crc {
            flags |= FLAG_CRC;
        }
        if self.reject && self.kind == MpaKind::Reply {
            flags |= FLAG_REJECT;
        }
        let mut pd_start = MPA_HEADER_LEN;
        if let Some(word) = &self.enhanced {
            flags |= FLAG_ENHANCED;
            word.emit(&mut buf[MPA_HEADER_LEN..MPA_HEADER_LEN + EnhancedControl::LEN])?;
            pd_start += EnhancedControl::LEN;
        }
        buf[..16].copy_from_slice(self.kind.key());
        buf[16] = flags;
        buf[17] = self.revision;
        buf[18..20].copy_from_slice(&(pd_length as u16).to_be_bytes());
        buf[pd_start..len].copy_from_slice(self.private_data);
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::vec;
    use std::vec::Vec;

    /// Written from the layout, byte by byte: MPA v2 Request, CRC off, IRD 32 ORD 1, peer-to-peer with Read
    /// RTR, 36 bytes of private data (docs/iwarp-wire.md §1-2).
    #[test]
    fn v2_request_vector() {
        let pd: Vec<u8> = (0..36u8).collect();
        let repr = MpaRepr {
            kind: MpaKind::Request,
            markers: false,
            crc: false,
            reject: false,
            revision: 2,
            enhanced: Some(EnhancedControl {
                ird: 32,
                ord: 1,
                peer_to_peer: true,
                read_rtr: true,
                ..Default::default()
            }),
            private_data: &pd,
        };
        let mut expected = Vec::new();
        expected.extend_from_slice(b"MPA ID Req Frame");
        expected.extend_from_slice(&[0x10, 0x02, 0x00, 40]); // S, Rev 2, PD_Length 4 + 36
        expected.extend_from_slice(&[0x80, 0x20, 0x40, 0x01]); // A|IRD 32, D|ORD 1
        expected.extend_from_slice(&pd);
        let mut buf = vec![0u8; repr.buffer_len()];
        assert_eq!(repr.emit(&mut buf), Ok(60));
        assert_eq!(buf, expected);
        assert_eq!(MpaRepr::frame_len(&buf), Ok(Some(60)));
        assert_eq!(MpaRepr::parse(&buf), Ok(repr));
    }

    #[test]
    fn reject_reply_and_v1_request_vectors() {
        let reply = MpaRepr {
            kind: MpaKind::Reply,
            markers: false,
            crc: true,
            reject: true,
            revision: 1,
            enhanced: None,
            private_data: b"no",
        };
        let mut buf = [0u8; 22];
        reply.emit(&mut buf).unwrap();
        assert_eq!(&buf[..16], b"MPA ID Rep Frame");
        assert_eq!(&buf[16..], &[0x60, 0x01, 0x00, 0x02, b'n', b'o']);
        assert_eq!(MpaRepr::parse(&buf).unwrap(), reply);

        let v1: Vec<u8> = [&b"MPA ID Req Frame"[..], &[0x00, 0x01, 0x00, 0x00]].concat();
        let r = MpaRepr::parse(&v1).unwrap();
        assert_eq!(
            (r.kind, r.revision, r.enhanced, r.private_data.len()),
            (MpaKind::Request, 1, None, 0)
        );
    }

    #[test]
    fn malformations_have_their_own_errors() {
        let good = [&b"MPA ID Req Frame"[..], &[0x10, 0x02, 0x00, 0x04, 0, 0, 0, 0]].concat();
        let mut bad_key = good.clone();
        bad_key[3] = b'X';
        assert_eq!(MpaRepr::parse(&bad_key), Err(WireError::BadMpaKey));
        assert_eq!(MpaRepr::frame_len(&bad_key[..5]), Err(WireError::BadMpaKey));
        assert_eq!(MpaRepr::frame_len(&good[..5]), Ok(None));
        let mut rev3 = good.clone();
        rev3[17] = 3;
        assert_eq!(MpaRepr::parse(&rev3), Err(WireError::UnsupportedMpaRevision(3)));
        let mut long = good.clone();
        long[18..20].copy_from_slice(&513u16.to_be_bytes());
        assert_eq!(MpaRepr::frame_len(&long), Err(WireError::PrivateDataTooLong(513)));
        long[18..20].copy_from_slice(&65535u16.to_be_bytes());
        assert_eq!(
            MpaRepr::frame_len(&long),
            Err(WireError::PrivateDataTooLong(65535))
        );
        let mut short_s = good.clone();
        short_s[19] = 3;
        assert_eq!(
            MpaRepr::parse(&short_s[..23]),
            Err(WireError::EnhancedWordMissing)
        );
        let mut s_on_v1 = good.clone();
        s_on_v1[17] = 1;
        assert_eq!(MpaRepr::parse(&s_on_v1), Err(WireError::EnhancedOnRevisionOne));
        assert!(matches!(
            MpaRepr::parse(&good[..22]),
            Err(WireError::Truncated { needed: 24, .. })
        ));
        // Reserved low flag bits are never checked (RFC 5044 §7.1).
        let mut reserved = good.clone();
        reserved[16] |= 0x0F;
        assert!(MpaRepr::parse(&reserved).is_ok());
        // R in a Request is reserved, not a reject.
        let mut r_in_req = good;
        r_in_req[16] |= FLAG_REJECT;
        assert!(!MpaRepr::parse(&r_in_req).unwrap().reject);
    }

    #[test]
    fn emit_checks_its_inputs() {
        let pd = [0u8; 509];
        let mut r = MpaRepr {
            kind: MpaKind::Request,
            markers: false,
            crc: false,
            reject: false,
            revision: 2,
            enhanced: Some(EnhancedControl::default()),
            private_data: &pd,
        };
        let mut buf = vec![0u8; 600];
        assert_eq!(r.emit(&mut buf), Err(WireError::PrivateDataTooLong(513)));
        r.private_data = &pd[..508];
        assert_eq!(r.emit(&mut buf), Ok(532));
        assert_eq!(
            r.emit(&mut buf[..100]),
            Err(WireError::BufferTooSmall {
                needed: 532,
                available: 100
            })
        );
        r.enhanced = Some(EnhancedControl {
            ird: 0x4000,
            ..Default::default()
        });
        assert_eq!(r.emit(&mut buf), Err(WireError::ReadLimitOutOfRange(0x4000)));
    }

    pub(crate) fn arb_enhanced() -> impl Strategy<Value = EnhancedControl> {
        (0..=0x3FFFu16, 0..=0x3FFFu16, any::<[bool; 4]>()).prop_map(|(ird, ord, b)| EnhancedControl {
            ird,
            ord,
            peer_to_peer: b[0],
            send_rtr: b[1],
            write_rtr: b[2],
            read_rtr: b[3],
        })
    }

    proptest! {
        #[test]
        fn round_trip(kind in prop_oneof![Just(MpaKind::Request), Just(MpaKind::Reply)],
                      flags in any::<[bool; 3]>(), v2 in any::<bool>(),
                      enhanced in proptest::option::of(arb_enhanced()),
                      pd in proptest::collection::vec(any::<u8>(), 0..=508)) {
            let enhanced = if v2 { enhanced } else { None };
            let repr = MpaRepr { kind, markers: flags[0], crc: flags[1],
                reject: flags[2] && kind == MpaKind::Reply, revision: if v2 { 2 } else { 1 },
                enhanced, private_data: &pd };
            let mut buf = vec![0u8; repr.buffer_len()];
            prop_assert_eq!(repr.emit(&mut buf), Ok(buf.len()));
            prop_assert_eq!(MpaRepr::frame_len(&buf), Ok(Some(buf.len())));
            prop_assert_eq!(MpaRepr::parse(&buf), Ok(repr));
        }

        #[test]
        fn arbitrary_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = MpaRepr::frame_len(&buf);
            let _ = MpaRepr::parse(&buf);
            let _ = EnhancedControl::parse(&buf);
        }

        #[test]
        fn enhanced_round_trip(w in arb_enhanced()) {
            let mut b = [0u8; 4];
            w.emit(&mut b).unwrap();
            prop_assert_eq!(EnhancedControl::parse(&b), Ok(w));
        }
    }
}
