//! The TCP header and its options on the wire (RFC 9293 §3.1, §3.2): a parsed representation
//! ([`TcpHeader`]) that the state machine consumes and produces, with `parse` and `emit`.
//!
//! Own code rather than smoltcp's `TcpRepr`: the state machine then needs no IP addresses (smoltcp's
//! `TcpRepr::emit` computes the checksum from them), it works in the `client` build (which has no
//! smoltcp), and the options the state machine relies on (timestamps, four SACK blocks) are plain fields.
//! The checksum (over the IPv4 or IPv6 pseudo-header) is left to the driver: [`checksum`].

use super::seq::Seq;
use crate::error::{Error, NdStatus, Result};

/// Length of the fixed part of the header (RFC 9293 §3.1).
pub const HEADER_LEN: usize = 20;
/// Largest header, with 40 bytes of options (data offset 15).
pub const MAX_HEADER_LEN: usize = 60;

/// The control bits (RFC 9293 §3.1; ECE/CWR from RFC 3168 are parsed but not used).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpFlags(pub u8);

impl TcpFlags {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const PSH: u8 = 0x08;
    pub const ACK: u8 = 0x10;
    pub const URG: u8 = 0x20;

    pub fn fin(self) -> bool {
        self.0 & Self::FIN != 0
    }
    pub fn syn(self) -> bool {
        self.0 & Self::SYN != 0
    }
    pub fn rst(self) -> bool {
        self.0 & Self::RST != 0
    }
    pub fn ack(self) -> bool {
        self.0 & Self::ACK != 0
    }
}

/// The options soft-rdma's TCP understands; others are skipped on receive (RFC 9293 §3.2: "MUST ignore
/// options it does not implement").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpOptions {
    /// Maximum Segment Size (RFC 9293 §3.7.1), only on SYN segments.
    pub mss: Option<u16>,
    /// Window scale shift (RFC 7323 §2), only on SYN segments.
    pub window_scale: Option<u8>,
    /// SACK-permitted (RFC 2018 §2), only on SYN segments.
    pub sack_permitted: bool,
    /// (TSval, TSecr) (RFC 7323 §3).
    pub timestamp: Option<(u32, u32)>,
    /// SACK blocks (RFC 2018 §3): `sack_blocks[..sack_count]`, each `[left, right)`.
    pub sack_blocks: [(Seq, Seq); 4],
    pub sack_count: u8,
}

impl TcpOptions {
    /// The SACK blocks carried.
    pub fn sacks(&self) -> &[(Seq, Seq)] {
        &self.sack_blocks[..usize::from(self.sack_count.min(4))]
    }

    /// Encoded length, padded to a multiple of 4, and how many SACK blocks fit in 40 bytes.
    fn layout(&self) -> (usize, usize) {
        let mut len = 0;
        if self.mss.is_some() {
            len += 4;
        }
        if self.window_scale.is_some() {
            len += 4; // NOP + kind/len/shift
        }
        if self.sack_permitted {
            len += 4; // NOP NOP + kind/len
        }
        if self.timestamp.is_some() {
            len += 12; // NOP NOP + 10
        }
        let mut sacks = usize::from(self.sack_count.min(4));
        while sacks > 0 && len + 4 + 8 * sacks > 40 {
            sacks -= 1;
        }
        if sacks > 0 {
            len += 4 + 8 * sacks; // NOP NOP + kind/len + blocks
        }
        (len, sacks)
    }
}

/// A TCP header, parsed (RFC 9293 §3.1). The urgent pointer is carried but unused (RFC 9293 §3.8.5; the
/// ULP never sends urgent data).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpHeader {
    pub src_port: u16,
    pub dst_port: u16,
    pub seq: Seq,
    pub ack: Seq,
    pub flags: TcpFlags,
    pub window: u16,
    pub urgent: u16,
    pub options: TcpOptions,
}

fn malformed(context: &'static str) -> Error {
    Error::new(NdStatus::InvalidParameter, context)
}

impl TcpHeader {
    /// Parse a segment's header; returns it and the offset of the payload. The checksum is not verified
    /// here (the driver does it with the pseudo-header). Malformed options are errors (RFC 9293 §3.2 asks
    /// an implementation to survive illegal option lengths; the segment is then dropped).
    pub fn parse(bytes: &[u8]) -> Result<(TcpHeader, usize)> {
        if bytes.len() < HEADER_LEN {
            return Err(malformed("TCP segment shorter than its 20-byte header"));
        }
        let data_offset = usize::from(bytes[12] >> 4) * 4;
        if data_offset < HEADER_LEN {
            return Err(malformed("TCP data offset below 5 words"));
        }
        if data_offset > bytes.len() {
            return Err(malformed("TCP data offset beyond the segment"));
        }
        let be16 = |i: usize| u16::from_be_bytes([bytes[i], bytes[i + 1]]);
        let be32 = |i: usize| u32::from_be_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        let mut header = TcpHeader {
            src_port: be16(0),
            dst_port: be16(2),
            seq: Seq(be32(4)),
            ack: Seq(be32(8)),
            flags: TcpFlags(bytes[13]),
            window: be16(14),
            urgent: be16(18),
            options: TcpOptions::default(),
        };
        parse_options(&bytes[HEADER_LEN..data_offset], &mut header.options)?;
        Ok((header, data_offset))
    }

    /// Bytes [`TcpHeader::emit`] writes.
    pub fn header_len(&self) -> usize {
        HEADER_LEN + self.options.layout().0
    }

    /// Write the header (checksum field zero) into `out`; returns its length. SACK blocks that do not fit
    /// in the 40 bytes of option space are left out (RFC 2018 §3).
    pub fn emit(&self, out: &mut [u8]) -> Result<usize> {
        let (opt_len, sacks) = self.options.layout();
        let len = HEADER_LEN + opt_len;
        if out.len() < len {
            return Err(Error::buffer_overflow(
                len as u32,
                "TCP header does not fit the buffer",
            ));
        }
        out[0..2].copy_from_slice(&self.src_port.to_be_bytes());
        out[2..4].copy_from_slice(&self.dst_port.to_be_bytes());
        out[4..8].copy_from_slice(&self.seq.0.to_be_bytes());
        out[8..12].copy_from_slice(&self.ack.0.to_be_bytes());
        out[12] = ((len / 4) as u8) << 4;
        out[13] = self.flags.0;
        out[14..16].copy_from_slice(&self.window.to_be_bytes());
        out[16..18].copy_from_slice(&[0, 0]);
        out[18..20].copy_from_slice(&self.urgent.to_be_bytes());
        let o = &self.options;
        let mut at = HEADER_LEN;
        let mut put = |bytes: &[u8]| {
            out[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        };
        if let Some(mss) = o.mss {
            let m = mss.to_be_bytes();
            put(&[2, 4, m[0], m[1]]);
        }
        if let Some(shift) = o.window_scale {
            put(&[1, 3, 3, shift]);
        }
        if o.sack_permitted {
            put(&[1, 1, 4, 2]);
        }
        if let Some((val, ecr)) = o.timestamp {
            put(&[1, 1, 8, 10]);
            put(&val.to_be_bytes());
            put(&ecr.to_be_bytes());
        }
        if sacks > 0 {
            put(&[1, 1, 5, (2 + 8 * sacks) as u8]);
            for (left, right) in &o.sack_blocks[..sacks] {
                put(&left.0.to_be_bytes());
                put(&right.0.to_be_bytes());
            }
        }
        Ok(len)
    }
}

/// RFC 9293 §3.2 option list: kind 0 ends it, kind 1 is padding, others carry a length byte counting
/// kind and length.
fn parse_options(mut bytes: &[u8], options: &mut TcpOptions) -> Result<()> {
    while let Some(&kind) = bytes.first() {
        match kind {
            0 => break,
            1 => {
                bytes = &bytes[1..];
                continue;
            }
            _ => {}
        }
        let len = usize::from(
            *bytes
                .get(1)
                .ok_or(malformed("TCP option without its length byte"))?,
        );
        if len < 2 || len > bytes.len() {
            return Err(malformed("TCP option length out of bounds"));
        }
        let body = &bytes[2..len];
        match (kind, body.len()) {
            (2, 2) => options.mss = Some(u16::from_be_bytes([body[0], body[1]])),
            (3, 1) => options.window_scale = Some(body[0]),
            (4, 0) => options.sack_permitted = true,
            (5, n) if n % 8 == 0 && n <= 32 => {
                options.sack_count = (n / 8) as u8;
                for (i, block) in body.chunks_exact(8).enumerate() {
                    let left = u32::from_be_bytes([block[0], block[1], block[2], block[3]]);
                    let right = u32::from_be_bytes([block[4], block[5], block[6], block[7]]);
                    options.sack_blocks[i] = (Seq(left), Seq(right));
                }
            }
            (8, 8) => {
                let val = u32::from_be_bytes([body[0], body[1], body[2], body[3]]);
                let ecr = u32::from_be_bytes([body[4], body[5], body[6], body[7]]);
                options.timestamp = Some((val, ecr));
            }
            (2..=5, _) | (8, _) => return Err(malformed("TCP option with a wrong length for its kind")),
            _ => {}
        }
        bytes = &bytes[len..];
    }
    Ok(())
}

/// The TCP checksum over the pseudo-header (RFC 9293 §3.1 for IPv4, RFC 8200 §8.1 for IPv6: source and
/// destination addresses, protocol 6, segment length) and `segment`, with the segment's checksum field
/// taken as it is (zero when computing, the received value when verifying: a correct segment then sums
/// to 0). `src` and `dst` are 4 or 16 address bytes.
pub fn checksum(src: &[u8], dst: &[u8], segment: &[u8]) -> u16 {
    !fold(pseudo_header_words(src, dst, segment.len()) + sum_words(segment))
}

/// The pseudo-header's one's-complement sum, folded and not complemented: what a sender that offloads its
/// TX checksum leaves in the checksum field (Linux `__tcp_v4_send_check` / `__tcp_v6_send_check`).
pub fn pseudo_header_sum(src: &[u8], dst: &[u8], segment_len: usize) -> u16 {
    fold(pseudo_header_words(src, dst, segment_len))
}

/// The pseudo-header's words summed, unfolded: the addresses, protocol 6 and the segment's length.
fn pseudo_header_words(src: &[u8], dst: &[u8], segment_len: usize) -> u64 {
    let len = segment_len as u64;
    sum_words(src) + sum_words(dst) + 6 + (len & 0xffff) + (len >> 16)
}

/// An unfolded sum folded to 16 bits (RFC 1071 §2 (B): end-around carries).
fn fold(mut sum: u64) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// The big-endian 16-bit words of `bytes` (an odd last byte padded with zero) summed, unfolded. Eight
/// bytes at a time, as two 32-bit words: 2^16 is 1 modulo 2^16 − 1, so a 32-bit word adds what its two
/// halves add once folded (RFC 1071 §2 (C), parallel summation); a segment's checksum is the data path's
/// only per-byte work besides the copies.
fn sum_words(bytes: &[u8]) -> u64 {
    let mut sum: u64 = 0;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_be_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        sum += (w >> 32) + (w & 0xffff_ffff);
    }
    let mut pairs = chunks.remainder().chunks_exact(2);
    for c in &mut pairs {
        sum += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = pairs.remainder() {
        sum += u64::from(*last) << 8;
    }
    sum
}

/// [`checksum`] for IPv4 addresses.
pub fn checksum_ipv4(src: [u8; 4], dst: [u8; 4], segment: &[u8]) -> u16 {
    checksum(&src, &dst, segment)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn full_header() -> TcpHeader {
        let mut options = TcpOptions {
            mss: Some(1460),
            window_scale: Some(7),
            sack_permitted: true,
            timestamp: Some((0xdead_beef, 42)),
            ..Default::default()
        };
        options.sack_blocks[0] = (Seq(100), Seq(200));
        options.sack_count = 1;
        TcpHeader {
            src_port: 49152,
            dst_port: 80,
            seq: Seq(1),
            ack: Seq(2),
            flags: TcpFlags(TcpFlags::SYN | TcpFlags::ACK),
            window: 65535,
            urgent: 0,
            options,
        }
    }

    #[test]
    fn emit_then_parse_is_identity() {
        let h = full_header();
        let mut buf = [0u8; MAX_HEADER_LEN];
        let n = h.emit(&mut buf).unwrap();
        assert_eq!(n, h.header_len());
        assert_eq!(n % 4, 0);
        let (back, off) = TcpHeader::parse(&buf[..n]).unwrap();
        assert_eq!(off, n);
        assert_eq!(back, h);
    }

    #[test]
    fn sack_blocks_beyond_40_bytes_are_dropped_on_emit() {
        let mut h = full_header();
        h.options.mss = None;
        h.options.window_scale = None;
        h.options.sack_permitted = false;
        h.options.sack_count = 4;
        let mut buf = [0u8; MAX_HEADER_LEN];
        let n = h.emit(&mut buf).unwrap();
        let (back, _) = TcpHeader::parse(&buf[..n]).unwrap();
        // RFC 2018 §3: with timestamps, three blocks fit.
        assert_eq!(back.options.sack_count, 3);
    }

    #[test]
    fn malformed_options_are_errors() {
        let mut buf = [0u8; 24];
        buf[12] = 6 << 4;
        buf[20] = 2; // MSS with a length byte of 1
        buf[21] = 1;
        assert!(TcpHeader::parse(&buf).is_err());
        buf[21] = 3; // wrong length for MSS
        assert!(TcpHeader::parse(&buf).is_err());
        buf[20] = 99; // unknown kind, length 4: skipped
        buf[21] = 4;
        assert!(TcpHeader::parse(&buf).is_ok());
        buf[12] = 4 << 4;
        assert!(TcpHeader::parse(&buf).is_err());
        buf[12] = 7 << 4;
        assert!(TcpHeader::parse(&buf).is_err());
    }

    #[test]
    fn checksum_of_a_checksummed_segment_is_zero() {
        let mut seg = [0u8; 25];
        full_header().emit(&mut seg).ok();
        seg[24] = 0x5a;
        let c = checksum_ipv4([10, 0, 0, 1], [10, 0, 0, 2], &seg);
        seg[16..18].copy_from_slice(&c.to_be_bytes());
        assert_eq!(checksum_ipv4([10, 0, 0, 1], [10, 0, 0, 2], &seg), 0);
        let (a, b) = (
            [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            [0xfe; 16],
        );
        seg[16..18].copy_from_slice(&[0, 0]);
        let c = checksum(&a, &b, &seg);
        seg[16..18].copy_from_slice(&c.to_be_bytes());
        assert_eq!(checksum(&a, &b, &seg), 0);
        assert_ne!(checksum(&b, &b, &seg), 0);
    }

    /// RFC 1071's checksum, a 16-bit word at a time: what [`checksum`] must equal.
    fn checksum_by_words(src: &[u8], dst: &[u8], segment: &[u8]) -> u16 {
        let mut pseudo = [src, dst].concat();
        pseudo.extend_from_slice(&[0, 6]);
        pseudo.extend_from_slice(&(segment.len() as u16).to_be_bytes());
        let mut sum: u64 = 0;
        for part in [&pseudo[..], segment] {
            for c in part.chunks(2) {
                sum += u64::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)]));
            }
        }
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    proptest! {
        #[test]
        fn checksum_equals_the_word_by_word_sum(
            src in proptest::collection::vec(any::<u8>(), 16),
            dst in proptest::collection::vec(any::<u8>(), 16),
            v4 in any::<bool>(),
            seg in proptest::collection::vec(any::<u8>(), 0..3000),
        ) {
            let n = if v4 { 4 } else { 16 };
            prop_assert_eq!(checksum(&src[..n], &dst[..n], &seg), checksum_by_words(&src[..n], &dst[..n], &seg));
        }

        #[test]
        fn parse_never_panics_and_reemits(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Ok((h, _)) = TcpHeader::parse(&bytes) {
                let mut buf = [0u8; MAX_HEADER_LEN];
                let n = h.emit(&mut buf).unwrap();
                let (again, _) = TcpHeader::parse(&buf[..n]).unwrap();
                prop_assert_eq!(again.seq, h.seq);
                prop_assert_eq!(again.options.timestamp, h.options.timestamp);
                prop_assert_eq!(again.options.mss, h.options.mss);
            }
        }
    }
}
