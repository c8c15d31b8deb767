//! Every FPDU soft-rdma writes or reads (RFC 5044 §4): the one home of MPA framing once a connection is in
//! FPDU mode. Writing: whole FPDUs from RDMAP messages ([`fpdu()`]), FPDUs assembled in place in a transmit
//! buffer ([`append_fpdu`]), and the fixed messages the connection manager sends itself: the RFC 6581 RTR
//! ([`rtr_fpdu`]), the Read Response answering a Read RTR ([`read_rtr_response`]) and the Terminate
//! ([`terminate_fpdu`]). Reading: cutting the next FPDU off a connection's receive buffer and checking its
//! CRC ([`take_frame`]). Every FPDU is ULPDU_Length, the DDP/RDMAP header and payload, the pad to a 4-byte
//! boundary, and the CRC32c field (zero when CRC was not negotiated: RFC 5044 §4.4).

use bytes::{Bytes, BytesMut};
use soft_rdma_common::wire::ddp::{DdpRepr, Placement, QN_READ_REQUEST, QN_SEND};
use soft_rdma_common::wire::fpdu::{self, FpduRepr};
use soft_rdma_common::wire::rdmap::{MessageRepr, RdmapOpcode, ReadRequestRepr};
use soft_rdma_common::wire::terminate::TerminateRepr;
use soft_rdma_common::wire::{TerminateCause, WireError};

use super::mpa::Rtr;

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
