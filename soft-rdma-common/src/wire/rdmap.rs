//! RDMAP messages over DDP (RFC 5040): the control byte and opcodes (§4.2), and [`MessageRepr`], one parsed
//! ULPDU (DDP header + RDMAP control + payload) checked against the opcode table. The RDMA Read Request header
//! (§4.4) is [`super::read_request`]'s, re-exported here.

use super::buf::check_room;
use super::ddp::{DdpRepr, Placement, QN_READ_REQUEST, QN_SEND, QN_TERMINATE};
use super::error::WireError;
pub use super::read_request::{READ_REQUEST_LEN, ReadRequestHeader, ReadRequestRepr};
use super::terminate::TerminateRepr;

pub const RDMAP_VERSION: u8 = 1;

listed_enum! {
    /// RDMAP opcodes (RFC 5040 §4.2, docs/iwarp-wire.md §5).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    #[repr(u8)]
    pub enum RdmapOpcode {
        RdmaWrite = 0,
        RdmaReadRequest = 1,
        RdmaReadResponse = 2,
        Send = 3,
        SendWithInvalidate = 4,
        SendWithSolicitedEvent = 5,
        SendWithSolicitedEventAndInvalidate = 6,
        Terminate = 7,
    }
}

impl RdmapOpcode {
    pub fn from_u8(v: u8) -> Result<Self, WireError> {
        RdmapOpcode::ALL
            .get(v as usize)
            .copied()
            .ok_or(WireError::UnknownOpcode(v))
    }

    /// Write and Read Response use the tagged model; everything else is untagged (RFC 5040 §4.2 table).
    pub const fn is_tagged(self) -> bool {
        matches!(self, RdmapOpcode::RdmaWrite | RdmapOpcode::RdmaReadResponse)
    }

    /// The untagged queue the opcode travels on (RFC 5040 §5.1), `None` for tagged opcodes.
    pub const fn queue(self) -> Option<u32> {
        match self {
            RdmapOpcode::RdmaWrite | RdmapOpcode::RdmaReadResponse => None,
            RdmapOpcode::RdmaReadRequest => Some(QN_READ_REQUEST),
            RdmapOpcode::Terminate => Some(QN_TERMINATE),
            _ => Some(QN_SEND),
        }
    }

    /// Send with Invalidate variants carry the STag to invalidate in the untagged ULP field (RFC 5040 §4.3).
    pub const fn carries_invalidate_stag(self) -> bool {
        matches!(
            self,
            RdmapOpcode::SendWithInvalidate | RdmapOpcode::SendWithSolicitedEventAndInvalidate
        )
    }

    /// The RDMAP control byte: RV (2 bits) = 01, 2 reserved, opcode (4 bits) (RFC 5040 §4.2).
    pub const fn control_byte(self) -> u8 {
        (RDMAP_VERSION << 6) | self as u8
    }
}

/// One ULPDU: a DDP segment carrying an RDMAP message (or a segment of one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MessageRepr<'a> {
    pub opcode: RdmapOpcode,
    /// DDP L: the last segment of the message.
    pub last: bool,
    pub placement: Placement,
    /// What follows the DDP header: data, or the Read Request / Terminate header.
    pub payload: &'a [u8],
}

impl<'a> MessageRepr<'a> {
    /// The Terminate message carrying `body` (an emitted [`TerminateRepr`]): one untagged segment on the
    /// Terminate queue, MSN 1, offset 0 (RFC 5040 §4.8, §5.1: a stream sends one Terminate).
    pub const fn new_terminate(body: &'a [u8]) -> Self {
        MessageRepr {
            opcode: RdmapOpcode::Terminate,
            last: true,
            placement: Placement::untagged_start(QN_TERMINATE, 1),
            payload: body,
        }
    }

    /// Parses and checks a ULPDU against RFC 5040's opcode table: versions, tagged/untagged model, queue
    /// number, Read Request and Terminate shape.
    pub fn parse(ulpdu: &'a [u8]) -> Result<Self, WireError> {
        let (ddp, header_len) = DdpRepr::parse(ulpdu)?;
        let rv = ddp.ulp_control >> 6;
        if rv != RDMAP_VERSION {
            return Err(WireError::BadRdmapVersion(rv));
        }
        let opcode = RdmapOpcode::from_u8(ddp.ulp_control & 0x0F)?;
        let tagged = ddp.placement.is_tagged();
        if opcode.is_tagged() != tagged {
            return Err(WireError::TaggedMismatch {
                opcode: opcode as u8,
                tagged,
            });
        }
        if let (Placement::Untagged { queue, .. }, Some(expected)) = (ddp.placement, opcode.queue())
            && queue != expected
        {
            return Err(WireError::InvalidQueueNumber {
                opcode: opcode as u8,
                queue,
            });
        }
        let payload = &ulpdu[header_len..];
        match opcode {
            // RFC 5040 §5.2 / §4.8: Read Requests and Terminates are single-segment messages.
            RdmapOpcode::RdmaReadRequest | RdmapOpcode::Terminate if !ddp.last => {
                return Err(WireError::SegmentedControlMessage(opcode as u8));
            }
            RdmapOpcode::RdmaReadRequest if payload.len() != READ_REQUEST_LEN => {
                return Err(WireError::BadReadRequestLength(payload.len()));
            }
            RdmapOpcode::Terminate => {
                TerminateRepr::parse(payload)?;
            }
            _ => {}
        }
        Ok(MessageRepr {
            opcode,
            last: ddp.last,
            placement: ddp.placement,
            payload,
        })
    }

    /// The Read Request header of an RDMA Read Request.
    pub fn read_request(&self) -> Result<ReadRequestRepr, WireError> {
        ReadRequestRepr::parse(self.payload)
    }

    /// The body of a Terminate.
    pub fn terminate(&self) -> Result<TerminateRepr<'a>, WireError> {
        TerminateRepr::parse(self.payload)
    }

    pub const fn header_len(&self) -> usize {
        self.placement.header_len()
    }

    pub const fn buffer_len(&self) -> usize {
        self.header_len() + self.payload.len()
    }

    /// Writes the DDP header (with the RDMAP control byte) and the payload.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let len = self.buffer_len();
        check_room(buf, len)?;
        if self.opcode.is_tagged() != self.placement.is_tagged() {
            return Err(WireError::TaggedMismatch {
                opcode: self.opcode as u8,
                tagged: self.placement.is_tagged(),
            });
        }
        let ddp = DdpRepr {
            last: self.last,
            ulp_control: self.opcode.control_byte(),
            placement: self.placement,
        };
        let h = ddp.emit(buf)?;
        buf[h..len].copy_from_slice(self.payload);
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ddp::{TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN};
    use proptest::prelude::*;
    use std::vec;
    use std::vec::Vec;

    #[test]
    fn read_request_vector() {
        let rr = ReadRequestRepr {
            sink_stag: 0xAABB_CC01,
            sink_offset: 0x10,
            read_size: 4096,
            source_stag: 0x0102_0304,
            source_offset: 0x2000,
        };
        let mut body = [0u8; READ_REQUEST_LEN];
        rr.emit(&mut body).unwrap();
        let msg = MessageRepr {
            opcode: RdmapOpcode::RdmaReadRequest,
            last: true,
            placement: Placement::untagged_start(QN_READ_REQUEST, 1),
            payload: &body,
        };
        let mut buf = vec![0u8; msg.buffer_len()];
        assert_eq!(msg.emit(&mut buf), Ok(46)); // 48 on the wire with the MPA length (docs/iwarp-wire.md §5)
        let mut expected: Vec<u8> = vec![0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0];
        expected.extend_from_slice(&[0xAA, 0xBB, 0xCC, 0x01, 0, 0, 0, 0, 0, 0, 0, 0x10]);
        expected.extend_from_slice(&[
            0, 0, 0x10, 0x00, 0x01, 0x02, 0x03, 0x04, 0, 0, 0, 0, 0, 0, 0x20, 0x00,
        ]);
        assert_eq!(buf, expected);
        let parsed = MessageRepr::parse(&buf).unwrap();
        assert_eq!(parsed, msg);
        assert_eq!(parsed.read_request(), Ok(rr));
    }

    #[test]
    fn opcode_table() {
        for op in RdmapOpcode::ALL {
            assert_eq!(RdmapOpcode::from_u8(op as u8), Ok(op));
            assert_eq!(op.is_tagged(), op.queue().is_none());
        }
        for v in 8..=15 {
            assert_eq!(RdmapOpcode::from_u8(v), Err(WireError::UnknownOpcode(v)));
        }
    }

    #[test]
    fn malformed_messages() {
        let send = |ctrl: u8, rdmap: u8, qn: u32| {
            let mut b = vec![ctrl, rdmap, 0, 0, 0, 0];
            b.extend_from_slice(&qn.to_be_bytes());
            b.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0]);
            b
        };
        assert!(MessageRepr::parse(&send(0x41, 0x43, 0)).is_ok());
        assert_eq!(
            MessageRepr::parse(&send(0x42, 0x43, 0)),
            Err(WireError::BadDdpVersion(2))
        );
        assert_eq!(
            MessageRepr::parse(&send(0x41, 0x83, 0)),
            Err(WireError::BadRdmapVersion(2))
        );
        assert_eq!(
            MessageRepr::parse(&send(0x41, 0x48, 0)),
            Err(WireError::UnknownOpcode(8))
        );
        assert_eq!(
            MessageRepr::parse(&send(0x41, 0x43, 1)),
            Err(WireError::InvalidQueueNumber { opcode: 3, queue: 1 })
        );
        assert_eq!(
            MessageRepr::parse(&send(0x41, 0x40, 0)),
            Err(WireError::TaggedMismatch {
                opcode: 0,
                tagged: false
            })
        );
        let mut rr = send(0x01, 0x41, 1);
        rr.extend_from_slice(&[0; 28]);
        assert_eq!(
            MessageRepr::parse(&rr),
            Err(WireError::SegmentedControlMessage(1))
        );
        rr[0] = 0x41;
        rr.pop();
        assert_eq!(MessageRepr::parse(&rr), Err(WireError::BadReadRequestLength(27)));
        assert!(matches!(
            MessageRepr::parse(&send(0x41, 0x43, 0)[..17]),
            Err(WireError::Truncated { .. })
        ));
        let e = WireError::UnknownOpcode(9).terminate_cause().unwrap();
        assert_eq!((e.layer, e.error_type, e.code), (0, 2, 0x06));
    }

    fn arb_message() -> impl Strategy<Value = (RdmapOpcode, bool, Placement, Vec<u8>)> {
        (
            0u8..7,
            any::<bool>(),
            any::<(u32, u64, u32, u32, u32)>(),
            proptest::collection::vec(any::<u8>(), 0..200),
        )
            .prop_map(|(op, last, (stag, to, msn, mo, inv), payload)| {
                let op = RdmapOpcode::from_u8(op).unwrap();
                let placement = match op.queue() {
                    None => Placement::Tagged { stag, offset: to },
                    Some(queue) => Placement::Untagged {
                        queue,
                        msn,
                        offset: mo,
                        ulp_field: if op.carries_invalidate_stag() { inv } else { 0 },
                    },
                };
                let (last, payload) = if op == RdmapOpcode::RdmaReadRequest {
                    (true, vec![7; 28])
                } else {
                    (last, payload)
                };
                (op, last, placement, payload)
            })
    }

    proptest! {
        #[test]
        fn round_trip((opcode, last, placement, payload) in arb_message()) {
            let m = MessageRepr { opcode, last, placement, payload: &payload };
            let mut buf = vec![0u8; m.buffer_len()];
            m.emit(&mut buf).unwrap();
            prop_assert_eq!(buf.len(), payload.len() + if opcode.is_tagged() { TAGGED_HEADER_LEN } else { UNTAGGED_HEADER_LEN });
            prop_assert_eq!(MessageRepr::parse(&buf), Ok(m));
        }

        #[test]
        fn arbitrary_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..120)) {
            if let Ok(m) = MessageRepr::parse(&buf) {
                let _ = m.read_request();
                let _ = m.terminate();
            }
            let _ = ReadRequestRepr::parse(&buf);
        }
    }
}
