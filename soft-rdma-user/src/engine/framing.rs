//! Every FPDU soft-rdma writes or reads (RFC 5044 §4): the one home of MPA framing once a connection is in
//! FPDU mode. Writing: whole FPDUs from RDMAP messages ([`fpdu()`]), FPDUs assembled in place in a transmit
//! buffer ([`append_fpdu`]), and the fixed messages the connection manager sends itself: the RFC 6581 RTR
//! ([`rtr_fpdu`]), the Read Response answering a Read RTR ([`read_rtr_response`]) and the Terminate
//! ([`terminate_fpdu`]). Queue pairs append their FPDUs to an [`FpduSink`]: a `Vec<u8>` (every byte copied:
//! the daemon's transports, and CRC) or a [`GatherBuf`], where payloads stay in registered memory and a
//! gathered write sends them in place (the client library's kernel-TCP path). Reading: cutting the next FPDU
//! off a connection's receive buffer and checking its CRC ([`take_frame`]). Every FPDU is ULPDU_Length, the DDP/RDMAP header and payload, the pad to a 4-byte
//! boundary, and the CRC32c field (zero when CRC was not negotiated: RFC 5044 §4.4).

use bytes::{Bytes, BytesMut};
use soft_rdma_common::wire::ddp::{DdpRepr, Placement, QN_READ_REQUEST, QN_SEND};
use soft_rdma_common::wire::fpdu::{self, FpduRepr};
use soft_rdma_common::wire::rdmap::{MessageRepr, RdmapOpcode, ReadRequestRepr};
use soft_rdma_common::wire::terminate::TerminateRepr;
use soft_rdma_common::wire::{TerminateCause, WireError};

use super::memory::PinnedMemory;

/// The FPDU carrying `msg`, with a CRC when `crc` is negotiated.
pub fn fpdu(msg: &MessageRepr<'_>, crc: bool) -> Result<Bytes, WireError> {
    let mut ulpdu = vec![0u8; msg.buffer_len()];
    msg.emit(&mut ulpdu)?;
    let f = FpduRepr {
        ulpdu: &ulpdu,
        crc: 0,
    };
    let mut out = vec![0u8; f.buffer_len()];
    if crc {
        f.emit_with_crc(&mut out)?;
    } else {
        f.emit(&mut out)?;
    }
    Ok(Bytes::from(out))
}

/// Appends one FPDU (RFC 5044 §4): ULPDU_Length, the DDP/RDMAP header, `payload_len` bytes written by
/// `fill`, the pad, and the CRC field (sealed iff `crc`, else zero: RFC 5044 §4.4).
pub fn append_fpdu(
    buf: &mut Vec<u8>,
    crc: bool,
    ddp: DdpRepr,
    payload_len: usize,
    fill: impl FnOnce(&mut [u8]),
) {
    let hlen = ddp.buffer_len();
    let ulpdu_len = hlen + payload_len;
    debug_assert!(ulpdu_len <= u16::MAX as usize, "max_ulpdu is clamped to 65535");
    let total = fpdu::fpdu_len(ulpdu_len);
    let start = buf.len();
    buf.resize(start + total, 0);
    let frame = &mut buf[start..];
    frame[..fpdu::LENGTH_LEN].copy_from_slice(&(ulpdu_len as u16).to_be_bytes());
    let body = &mut frame[fpdu::LENGTH_LEN..];
    if ddp.emit(body).is_err() {
        debug_assert!(false, "the frame was sized for the header");
    }
    fill(&mut body[hlen..ulpdu_len]);
    if crc && fpdu::seal_crc(frame).is_err() {
        debug_assert!(false, "an FPDU always has a CRC field");
    }
}

/// Where a queue pair appends whole FPDUs (RFC 5044 §4).
pub trait FpduSink {
    /// Bytes appended so far: headers, payloads, pads and CRC fields.
    fn appended(&self) -> usize;
    /// Appends one FPDU: ULPDU_Length, the DDP/RDMAP header, `payload_len` bytes supplied by `fill`, the
    /// pad, and the CRC field (sealed iff `crc`, else zero: RFC 5044 §4.4).
    fn push_fpdu(&mut self, crc: bool, ddp: DdpRepr, payload_len: usize, fill: impl FnOnce(PayloadDst<'_>));
}

/// Every byte copied into one buffer.
impl FpduSink for Vec<u8> {
    fn appended(&self) -> usize {
        self.len()
    }

    fn push_fpdu(&mut self, crc: bool, ddp: DdpRepr, payload_len: usize, fill: impl FnOnce(PayloadDst<'_>)) {
        append_fpdu(self, crc, ddp, payload_len, |dst| fill(PayloadDst::Copy(dst)));
    }
}

/// Where an FPDU's payload goes: bytes to fill in place, or a gather list that may refer to registered
/// memory instead of copying it. A filler must supply exactly the payload length it was asked for.
pub enum PayloadDst<'a> {
    Copy(&'a mut [u8]),
    Gather(Gathering<'a>),
}

impl PayloadDst<'_> {
    /// Supplies `len` bytes (the whole payload, or the next part of it) by copying: `fill` writes them.
    pub fn copy(&mut self, at: usize, len: usize, fill: impl FnOnce(&mut [u8])) {
        match self {
            PayloadDst::Copy(dst) => {
                if let Some(d) = dst.get_mut(at..at + len) {
                    fill(d);
                }
            }
            PayloadDst::Gather(g) => {
                let start = g.bytes.len();
                g.bytes.resize(start + len, 0);
                fill(&mut g.bytes[start..]);
            }
        }
    }
}

/// The gather list of the FPDU being appended to a [`GatherBuf`].
pub struct Gathering<'a> {
    bytes: &'a mut Vec<u8>,
    refs: &'a mut Vec<MemRef>,
    ref_len: &'a mut usize,
}

impl Gathering<'_> {
    /// The next `len` payload bytes are registered memory `memory` from `offset` (bounds checked by the
    /// registry), sent in place.
    pub fn refer(&mut self, memory: PinnedMemory, offset: usize, len: usize) {
        if len == 0 {
            return;
        }
        *self.ref_len += len;
        self.refs.push(MemRef {
            at: self.bytes.len(),
            memory,
            offset,
            len,
        });
    }
}

/// A run of registered memory in a [`GatherBuf`]: sent after the buffer's first `at` bytes of its own.
#[derive(Clone)]
pub struct MemRef {
    at: usize,
    pub memory: PinnedMemory,
    pub offset: usize,
    pub len: usize,
}

/// FPDUs whose payloads stay in registered memory: header, pad and CRC bytes of their own, interleaved with
/// references into the regions ([`MemRef`]). Without CRC only: a CRC covers the payload, so with CRC the
/// payload is copied (RFC 5044 §4.4: the sender computes it over the FPDU as sent).
#[derive(Default)]
pub struct GatherBuf {
    bytes: Vec<u8>,
    refs: Vec<MemRef>,
    ref_len: usize,
}

/// One piece of a gathered write, in order.
pub enum GatherPiece {
    Bytes(Bytes),
    Memory(MemRef),
}

impl GatherBuf {
    pub fn is_empty(&self) -> bool {
        self.appended() == 0
    }

    /// The same FPDUs as contiguous bytes, payloads copied out of registered memory now (for FPDUs that
    /// wait while the application may already reuse the memory).
    pub fn into_bytes(self) -> Bytes {
        if self.refs.is_empty() {
            return Bytes::from(self.bytes);
        }
        let mut out = Vec::with_capacity(self.appended());
        let mut from = 0;
        for r in &self.refs {
            out.extend_from_slice(&self.bytes[from..r.at]);
            from = r.at;
            let want = out.len() + r.len;
            r.memory.copy_to(r.offset, r.len, &mut out);
            out.resize(want, 0);
        }
        out.extend_from_slice(&self.bytes[from..]);
        Bytes::from(out)
    }

    /// The pieces to write, in order.
    pub fn into_pieces(self) -> Vec<GatherPiece> {
        let bytes = Bytes::from(self.bytes);
        let mut pieces = Vec::with_capacity(2 * self.refs.len() + 1);
        let mut from = 0;
        for r in self.refs {
            if r.at > from {
                pieces.push(GatherPiece::Bytes(bytes.slice(from..r.at)));
            }
            from = r.at;
            pieces.push(GatherPiece::Memory(r));
        }
        if bytes.len() > from {
            pieces.push(GatherPiece::Bytes(bytes.slice(from..)));
        }
        pieces
    }
}

impl FpduSink for GatherBuf {
    fn appended(&self) -> usize {
        self.bytes.len() + self.ref_len
    }

    fn push_fpdu(&mut self, crc: bool, ddp: DdpRepr, payload_len: usize, fill: impl FnOnce(PayloadDst<'_>)) {
        if crc {
            FpduSink::push_fpdu(&mut self.bytes, crc, ddp, payload_len, fill);
            return;
        }
        let hlen = ddp.buffer_len();
        let ulpdu_len = hlen + payload_len;
        debug_assert!(ulpdu_len <= u16::MAX as usize, "max_ulpdu is clamped to 65535");
        let start = self.bytes.len();
        self.bytes.resize(start + fpdu::LENGTH_LEN + hlen, 0);
        let frame = &mut self.bytes[start..];
        frame[..fpdu::LENGTH_LEN].copy_from_slice(&(ulpdu_len as u16).to_be_bytes());
        if ddp.emit(&mut frame[fpdu::LENGTH_LEN..]).is_err() {
            debug_assert!(false, "the frame was sized for the header");
        }
        let before = self.appended();
        fill(PayloadDst::Gather(Gathering {
            bytes: &mut self.bytes,
            refs: &mut self.refs,
            ref_len: &mut self.ref_len,
        }));
        let supplied = self.appended() - before;
        debug_assert_eq!(supplied, payload_len, "the filler supplies the payload");
        if supplied < payload_len {
            // Never short on the wire: the length field already promised `payload_len` bytes.
            self.bytes.resize(self.bytes.len() + payload_len - supplied, 0);
        }
        // The pad to a 4-byte boundary and the (zero) CRC field: RFC 5044 §4.
        let tail = fpdu::fpdu_len(ulpdu_len) - fpdu::LENGTH_LEN - ulpdu_len;
        self.bytes.resize(self.bytes.len() + tail, 0);
    }
}

/// The zero-length RTR FPDU an initiator sends in peer-to-peer mode when the application completes the
/// connection (RFC 6581 §9): a zero-length RDMA Write (tagged, STag 0), a zero-length Read Request (queue 1,
/// MSN 1), or a zero-length Send (queue 0, MSN 1).
pub fn rtr_fpdu(rtr: Rtr, crc: bool) -> Bytes {
    let read_request = [0u8; 28];
    let (opcode, placement, payload): (RdmapOpcode, Placement, &[u8]) = match rtr {
        Rtr::Write => (
            RdmapOpcode::RdmaWrite,
            Placement::Tagged { stag: 0, offset: 0 },
            &[],
        ),
        Rtr::Read => (
            RdmapOpcode::RdmaReadRequest,
            Placement::untagged_start(QN_READ_REQUEST, 1),
            &read_request,
        ),
        Rtr::Send => (RdmapOpcode::Send, Placement::untagged_start(QN_SEND, 1), &[]),
    };
    let msg = MessageRepr {
        opcode,
        last: true,
        placement,
        payload,
    };
    fpdu(&msg, crc).expect("a zero-length RTR always frames")
}

/// The zero-length Read Response that answers a Read RTR (RFC 6581 §9) on a connection without a queue pair.
pub fn read_rtr_response(rr: &ReadRequestRepr, crc: bool) -> Bytes {
    let msg = MessageRepr {
        opcode: RdmapOpcode::RdmaReadResponse,
        last: true,
        placement: Placement::Tagged {
            stag: rr.sink_stag,
            offset: rr.sink_offset,
        },
        payload: &[],
    };
    fpdu(&msg, crc).expect("an empty Read Response always frames")
}

/// A Terminate FPDU carrying `cause` (RFC 5040 §4.8), MSN 1 on the Terminate queue.
pub fn terminate_fpdu(cause: TerminateCause, crc: bool) -> Bytes {
    let t = TerminateRepr::new(cause);
    let mut body = vec![0u8; t.buffer_len()];
    t.emit(&mut body).expect("sized");
    let msg = MessageRepr::new_terminate(&body);
    fpdu(&msg, crc).expect("a Terminate without optional fields always frames")
}

/// Cuts the next whole FPDU off the front of `rx` (RFC 5044 §4): `Ok(None)` until it has all arrived; with
/// `crc`, its CRC32c is checked (RFC 5044 §4.4). `Err` carries the Terminate cause of the malformation
/// (`None`: close without a Terminate); the stream cannot be resynchronised after one.
pub fn take_frame(
    rx: &mut BytesMut,
    max_ulpdu: usize,
    crc: bool,
) -> Result<Option<Bytes>, Option<TerminateCause>> {
    let len = match FpduRepr::frame_len(rx, max_ulpdu) {
        Ok(Some(len)) if rx.len() >= len => len,
        Ok(_) => return Ok(None),
        Err(e) => return Err(e.terminate_cause()),
    };
    let frame = rx.split_to(len).freeze();
    if crc && let Err(e) = fpdu::verify_crc(&frame) {
        return Err(e.terminate_cause());
    }
    Ok(Some(frame))
}

/// The RDMAP message in a whole FPDU cut by [`take_frame`].
pub fn parse_message(frame: &[u8], max_ulpdu: usize) -> Result<MessageRepr<'_>, Option<TerminateCause>> {
    FpduRepr::parse(frame, max_ulpdu)
        .and_then(|f| MessageRepr::parse(f.ulpdu))
        .map_err(|e| e.terminate_cause())
}

/// The ready-to-receive message types of RFC 6581 §9 (zero-length Send, RDMA Write, or RDMA Read).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Rtr {
    Send,
    Write,
    Read,
}

/// Recognises an RTR at the start of the responder's first FPDU (RFC 6581 §9): a zero-length Write, Read
/// Request of size 0, or Send with no payload.
pub fn is_rtr(msg: &MessageRepr<'_>) -> Option<Rtr> {
    match msg.opcode {
        RdmapOpcode::RdmaWrite if msg.payload.is_empty() => Some(Rtr::Write),
        RdmapOpcode::RdmaReadRequest if msg.read_request().is_ok_and(|r| r.read_size == 0) => Some(Rtr::Read),
        RdmapOpcode::Send if msg.payload.is_empty() => Some(Rtr::Send),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use soft_rdma_common::wire::ddp::TAGGED_HEADER_LEN;

    #[test]
    fn appended_and_whole_fpdus_are_the_same_bytes() {
        for crc in [false, true] {
            let payload = [7u8; 13];
            let msg = MessageRepr {
                opcode: RdmapOpcode::RdmaWrite,
                last: true,
                placement: Placement::Tagged {
                    stag: 0x1234_5600,
                    offset: 99,
                },
                payload: &payload,
            };
            let whole = fpdu(&msg, crc).unwrap();
            let ddp = DdpRepr {
                last: true,
                ulp_control: RdmapOpcode::RdmaWrite.control_byte(),
                placement: msg.placement,
            };
            let mut buf = vec![0xee; 3];
            append_fpdu(&mut buf, crc, ddp, payload.len(), |b| b.copy_from_slice(&payload));
            assert_eq!(&buf[3..], &whole[..]);
            assert_eq!(whole.len(), fpdu::fpdu_len(TAGGED_HEADER_LEN + payload.len()));
        }
    }

    /// A PinnedMemory over `bytes` (kept alive, never written, by the handle).
    fn pinned(bytes: Vec<u8>) -> PinnedMemory {
        let owner = std::sync::Arc::new(bytes);
        let base = std::ptr::NonNull::new(owner.as_ptr().cast_mut()).unwrap();
        // SAFETY: the Vec's heap buffer is `len` bytes and lives as long as `owner`, which the handle holds.
        unsafe { PinnedMemory::new(base, owner.len(), owner) }
    }

    /// FPDUs gathered with payloads referring to memory (parts copied, parts in place, empty ones) are the
    /// bytes the copying sink appends, pad and zero CRC included; with CRC the gather buffer copies.
    #[test]
    fn gathered_fpdus_are_the_bytes_of_copied_ones() {
        let source: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 256) as u8).collect();
        let memory = pinned(source.clone());
        for crc in [false, true] {
            let mut copied = Vec::new();
            let mut gathered = GatherBuf::default();
            for (i, (at, len)) in [(0usize, 13usize), (100, 1448), (7, 0), (3000, 1999)]
                .into_iter()
                .enumerate()
            {
                let ddp = DdpRepr {
                    last: i % 2 == 0,
                    ulp_control: RdmapOpcode::RdmaWrite.control_byte(),
                    placement: Placement::Tagged {
                        stag: 0x100,
                        offset: at as u64,
                    },
                };
                copied.push_fpdu(crc, ddp, len, |mut dst| {
                    dst.copy(0, len, |d| d.copy_from_slice(&source[at..at + len]))
                });
                gathered.push_fpdu(crc, ddp, len, |mut dst| match &mut dst {
                    // Half copied, half referred to.
                    PayloadDst::Gather(g) => {
                        let half = len / 2;
                        g.refer(memory.clone(), at, half);
                        dst.copy(half, len - half, |d| {
                            d.copy_from_slice(&source[at + half..at + len])
                        });
                    }
                    PayloadDst::Copy(d) => d.copy_from_slice(&source[at..at + len]),
                });
                assert_eq!(gathered.appended(), copied.len());
            }
            let pieces = gathered.into_pieces();
            assert_eq!(
                pieces.iter().any(|p| matches!(p, GatherPiece::Memory(_))),
                !crc,
                "in place without CRC only"
            );
            let mut flat = Vec::new();
            for p in pieces {
                match p {
                    GatherPiece::Bytes(b) => flat.extend_from_slice(&b),
                    GatherPiece::Memory(m) => m.memory.copy_to(m.offset, m.len, &mut flat),
                }
            }
            assert_eq!(flat, copied);
        }
        // into_bytes copies the same.
        let mut g = GatherBuf::default();
        let ddp = DdpRepr {
            last: true,
            ulp_control: RdmapOpcode::RdmaWrite.control_byte(),
            placement: Placement::Tagged { stag: 1, offset: 0 },
        };
        g.push_fpdu(false, ddp, 10, |dst| {
            if let PayloadDst::Gather(mut g) = dst {
                g.refer(memory.clone(), 5, 10)
            }
        });
        let mut v = Vec::new();
        v.push_fpdu(false, ddp, 10, |mut dst| {
            dst.copy(0, 10, |d| d.copy_from_slice(&source[5..15]))
        });
        assert_eq!(&g.into_bytes()[..], &v[..]);
        // A range outside the memory is refused, never read.
        assert!(memory.range(4990, 11).is_none());
        assert!(memory.range(usize::MAX, 2).is_none());
    }

    #[test]
    fn take_frame_waits_for_whole_fpdus_and_checks_the_crc() {
        let t = terminate_fpdu(TerminateCause::new(1, 2, 3), true);
        let mut rx = BytesMut::from(&t[..t.len() - 1]);
        assert_eq!(take_frame(&mut rx, 65535, true), Ok(None));
        rx.extend_from_slice(&t[t.len() - 1..]);
        rx.extend_from_slice(&t);
        let frame = take_frame(&mut rx, 65535, true).unwrap().unwrap();
        assert_eq!(frame, t);
        let msg = parse_message(&frame, 65535).unwrap();
        assert_eq!(msg.opcode, RdmapOpcode::Terminate);
        assert_eq!(msg.terminate().unwrap().cause, TerminateCause::new(1, 2, 3));
        // The second copy with its CRC broken: a Terminate cause, not a panic or a silent skip.
        let last = rx.len() - 1;
        rx[last] ^= 1;
        let e = take_frame(&mut rx, 65535, true).unwrap_err();
        assert!(e.is_some(), "a CRC error has a Terminate cause (RFC 5044 §4.4)");
    }
}
