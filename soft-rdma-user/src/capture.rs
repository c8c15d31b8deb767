//! Packet captures of iWARP conversations: a classic pcap writer and a TCP conversation builder
//! (Ethernet/IPv4/TCP with correct checksums and consistent sequence numbers).
//!
//! Used to have an independent decoder (Wireshark's `iwarp_mpa` / `iwarp_ddp_rdmap` dissectors, through
//! tshark) read what soft-rdma's wire code writes, and by `soft-rdma wire` to show it to people.

use std::io::{self, Write};
use std::net::SocketAddrV4;

use soft_rdma_common::wire::TerminateCause;
use soft_rdma_common::wire::WireError;
use soft_rdma_common::wire::ddp::{Placement, QN_READ_REQUEST, QN_SEND, QN_TERMINATE};
use soft_rdma_common::wire::mpa::{EnhancedControl, MpaKind, MpaRepr};
use soft_rdma_common::wire::rdmap::{MessageRepr, RdmapOpcode, ReadRequestRepr};
use soft_rdma_common::wire::terminate::{TerminateRepr, layer, rdmap_code, rdmap_type};

const TCP_SYN: u8 = 0x02;
const TCP_ACK: u8 = 0x10;
const TCP_PSH: u8 = 0x08;

/// Which way a segment goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Initiator (client) → responder (server).
    ToServer,
    /// Responder → initiator.
    ToClient,
}

/// A TCP conversation between two IPv4 endpoints, built segment by segment as Ethernet frames.
pub struct TcpConversation {
    client: SocketAddrV4,
    server: SocketAddrV4,
    client_seq: u32,
    server_seq: u32,
    frames: Vec<Vec<u8>>,
}

const CLIENT_MAC: [u8; 6] = [0x02, 0x53, 0x52, 0x00, 0x00, 0x01];
const SERVER_MAC: [u8; 6] = [0x02, 0x53, 0x52, 0x00, 0x00, 0x02];

impl TcpConversation {
    /// Starts a conversation with the three-way handshake.
    pub fn new(client: SocketAddrV4, server: SocketAddrV4) -> Self {
        let mut c = TcpConversation {
            client,
            server,
            client_seq: 1000,
            server_seq: 500_000,
            frames: Vec::new(),
        };
        c.segment(Direction::ToServer, TCP_SYN, &[]);
        c.client_seq += 1;
        c.segment(Direction::ToClient, TCP_SYN | TCP_ACK, &[]);
        c.server_seq += 1;
        c.segment(Direction::ToServer, TCP_ACK, &[]);
        c
    }

    /// Appends one data segment carrying `payload` in `dir`.
    pub fn send(&mut self, dir: Direction, payload: &[u8]) {
        self.segment(dir, TCP_PSH | TCP_ACK, payload);
        match dir {
            Direction::ToServer => self.client_seq = self.client_seq.wrapping_add(payload.len() as u32),
            Direction::ToClient => self.server_seq = self.server_seq.wrapping_add(payload.len() as u32),
        }
    }

    /// The Ethernet frames so far (handshake first).
    pub fn frames(&self) -> &[Vec<u8>] {
        &self.frames
    }

    fn segment(&mut self, dir: Direction, flags: u8, payload: &[u8]) {
        let (src, dst, smac, dmac, seq, ack) = match dir {
            Direction::ToServer => (
                self.client,
                self.server,
                CLIENT_MAC,
                SERVER_MAC,
                self.client_seq,
                self.server_seq,
            ),
            Direction::ToClient => (
                self.server,
                self.client,
                SERVER_MAC,
                CLIENT_MAC,
                self.server_seq,
                self.client_seq,
            ),
        };
        let ack = if flags & TCP_ACK != 0 { ack } else { 0 };
        let mut tcp = Vec::with_capacity(20 + payload.len());
        tcp.extend_from_slice(&src.port().to_be_bytes());
        tcp.extend_from_slice(&dst.port().to_be_bytes());
        tcp.extend_from_slice(&seq.to_be_bytes());
        tcp.extend_from_slice(&ack.to_be_bytes());
        tcp.push(5 << 4); // data offset: 20 bytes
        tcp.push(flags);
        tcp.extend_from_slice(&65535u16.to_be_bytes()); // window
        tcp.extend_from_slice(&[0, 0, 0, 0]); // checksum, urgent pointer
        tcp.extend_from_slice(payload);
        let mut pseudo = Vec::with_capacity(12 + tcp.len());
        pseudo.extend_from_slice(&src.ip().octets());
        pseudo.extend_from_slice(&dst.ip().octets());
        pseudo.extend_from_slice(&[0, 6]);
        pseudo.extend_from_slice(&(tcp.len() as u16).to_be_bytes());
        pseudo.extend_from_slice(&tcp);
        let sum = internet_checksum(&pseudo);
        tcp[16..18].copy_from_slice(&sum.to_be_bytes());

        let mut ip = Vec::with_capacity(20 + tcp.len());
        ip.push(0x45);
        ip.push(0);
        ip.extend_from_slice(&((20 + tcp.len()) as u16).to_be_bytes());
        ip.extend_from_slice(&(self.frames.len() as u16).to_be_bytes()); // identification
        ip.extend_from_slice(&[0x40, 0]); // DF
        ip.push(64);
        ip.push(6);
        ip.extend_from_slice(&[0, 0]);
        ip.extend_from_slice(&src.ip().octets());
        ip.extend_from_slice(&dst.ip().octets());
        let sum = internet_checksum(&ip);
        ip[10..12].copy_from_slice(&sum.to_be_bytes());
        ip.extend_from_slice(&tcp);

        let mut eth = Vec::with_capacity(14 + ip.len());
        eth.extend_from_slice(&dmac);
        eth.extend_from_slice(&smac);
        eth.extend_from_slice(&[0x08, 0x00]);
        eth.extend_from_slice(&ip);
        self.frames.push(eth);
    }

    /// Writes a classic pcap file (LINKTYPE_ETHERNET), one frame per millisecond.
    pub fn write_pcap(&self, mut w: impl Write) -> io::Result<()> {
        w.write_all(&0xA1B2_C3D4u32.to_le_bytes())?;
        w.write_all(&2u16.to_le_bytes())?;
        w.write_all(&4u16.to_le_bytes())?;
        w.write_all(&0i32.to_le_bytes())?;
        w.write_all(&0u32.to_le_bytes())?;
        w.write_all(&65535u32.to_le_bytes())?;
        w.write_all(&1u32.to_le_bytes())?;
        for (i, f) in self.frames.iter().enumerate() {
            w.write_all(&1_700_000_000u32.to_le_bytes())?;
            w.write_all(&((i as u32) * 1000).to_le_bytes())?;
            w.write_all(&(f.len() as u32).to_le_bytes())?;
            w.write_all(&(f.len() as u32).to_le_bytes())?;
            w.write_all(f)?;
        }
        w.flush()
    }
}

/// RFC 1071 ones' complement sum.
pub fn internet_checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for chunk in data.chunks(2) {
        let word = if chunk.len() == 2 {
            u16::from_be_bytes([chunk[0], chunk[1]])
        } else {
            u16::from_be_bytes([chunk[0], 0])
        };
        sum += word as u32;
    }
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

/// One iWARP frame of the sample conversation, with what a decoder must find in it.
#[derive(Clone, Debug)]
pub struct SampleFrame {
    pub direction: Direction,
    pub what: &'static str,
    /// The MPA frame or FPDU (the TCP payload).
    pub bytes: Vec<u8>,
    /// RDMAP opcode for FPDUs, `None` for MPA Request/Reply.
    pub opcode: Option<RdmapOpcode>,
    /// The DDP STag (tagged) or queue number (untagged) the frame carries.
    pub placement: Option<Placement>,
}

/// The IRD/ORD word of the sample Request: IRD 32, ORD 1, peer-to-peer with Read RTR.
pub const SAMPLE_REQUEST_WORD: EnhancedControl = EnhancedControl {
    ird: 32,
    ord: 1,
    peer_to_peer: true,
    send_rtr: false,
    write_rtr: false,
    read_rtr: true,
};

/// A full sample conversation: MPA Request and Reply (v2, with `crc` as negotiated), then one FPDU of every
/// kind: Send, Send with Solicited Event, RDMA Write, Read Request, Read Response, Send with Invalidate,
/// Send with SE and Invalidate, a zero-length Write (an RTR), and a Terminate.
pub fn sample_conversation(crc: bool) -> Result<Vec<SampleFrame>, WireError> {
    let mut frames = sample_handshake(crc)?;
    let mut rr = [0u8; 28];
    SAMPLE_READ_REQUEST.emit(&mut rr)?;
    let term_body = sample_terminate_body()?;
    let data: Vec<u8> = (0..64u8).collect();
    for (direction, what, opcode, placement, payload) in sample_fpdus(&rr, &term_body, &data) {
        let msg = MessageRepr {
            opcode,
            last: true,
            placement,
            payload,
        };
        let bytes = crate::engine::framing::fpdu(&msg, crc)?.to_vec();
        frames.push(SampleFrame {
            direction,
            what,
            bytes,
            opcode: Some(opcode),
            placement: Some(placement),
        });
    }
    Ok(frames)
}

/// The sample's MPA Request (with [`SAMPLE_REQUEST_WORD`] and 36 bytes of private data) and its accepting
/// Reply, Rev 2, with `crc` as negotiated.
fn sample_handshake(crc: bool) -> Result<Vec<SampleFrame>, WireError> {
    let request_pd: Vec<u8> = (0..36u8).collect();
    let mpa = |kind, enhanced, pd: &[u8]| -> Result<Vec<u8>, WireError> {
        let r = MpaRepr {
            kind,
            markers: false,
            crc,
            reject: false,
            revision: 2,
            enhanced: Some(enhanced),
            private_data: pd,
        };
        let mut b = vec![0u8; r.buffer_len()];
        r.emit(&mut b)?;
        Ok(b)
    };
    let reply_word = EnhancedControl {
        ird: 1,
        ord: 32,
        peer_to_peer: true,
        read_rtr: true,
        ..Default::default()
    };
    Ok(vec![
        SampleFrame {
            direction: Direction::ToServer,
            what: "MPA Request (Rev 2, IRD 32 ORD 1, P2P Read RTR, 36 B private data)",
            bytes: mpa(MpaKind::Request, SAMPLE_REQUEST_WORD, &request_pd)?,
            opcode: None,
            placement: None,
        },
        SampleFrame {
            direction: Direction::ToClient,
            what: "MPA Reply (Rev 2, IRD 1 ORD 32, accepted)",
            bytes: mpa(MpaKind::Reply, reply_word, b"accepted")?,
            opcode: None,
            placement: None,
        },
    ])
}

/// The sample's RDMA Read Request: 64 bytes of the Write's target (STag 0x2201 at 0x40) into STag 0x1101.
const SAMPLE_READ_REQUEST: ReadRequestRepr = ReadRequestRepr {
    sink_stag: 0x0000_1101,
    sink_offset: 0,
    read_size: 64,
    source_stag: 0x0000_2201,
    source_offset: 0x40,
};

/// The body of the sample's Terminate: a remote protection error (invalid STag) for a 64-byte RDMA Write to
/// STag 0xDEADBE01, with the terminated segment's length and DDP header.
fn sample_terminate_body() -> Result<Vec<u8>, WireError> {
    let terminated = {
        let m = MessageRepr {
            opcode: RdmapOpcode::RdmaWrite,
            last: true,
            placement: Placement::Tagged {
                stag: 0xDEAD_BE01,
                offset: 0,
            },
            payload: &[],
        };
        let mut b = [0u8; 14];
        m.emit(&mut b)?;
        b
    };
    let term = TerminateRepr {
        cause: TerminateCause::new(
            layer::RDMAP,
            rdmap_type::REMOTE_PROTECTION,
            rdmap_code::INVALID_STAG,
        ),
        ddp_segment_length: Some(14 + 64),
        ddp_header: Some(&terminated),
        read_request: None,
    };
    let mut term_body = vec![0u8; term.buffer_len()];
    term.emit(&mut term_body)?;
    Ok(term_body)
}

/// One FPDU of the sample: its direction, description, opcode, placement and payload.
type SampleFpdu<'a> = (Direction, &'static str, RdmapOpcode, Placement, &'a [u8]);

/// The sample's FPDUs in order, one of every kind, carrying the Read Request header `rr`, the Terminate body
/// `term_body` and `data` (the Write's and the Read Response's).
fn sample_fpdus<'a>(rr: &'a [u8], term_body: &'a [u8], data: &'a [u8]) -> Vec<SampleFpdu<'a>> {
    let untagged = Placement::untagged_start;
    vec![
        (
            Direction::ToServer,
            "Read RTR (zero-length Read Request)",
            RdmapOpcode::RdmaReadRequest,
            untagged(QN_READ_REQUEST, 1),
            &[0u8; 28],
        ),
        (
            Direction::ToServer,
            "Send",
            RdmapOpcode::Send,
            untagged(QN_SEND, 1),
            b"hello, siw",
        ),
        (
            Direction::ToClient,
            "Send with Solicited Event",
            RdmapOpcode::SendWithSolicitedEvent,
            untagged(QN_SEND, 1),
            b"hello back",
        ),
        (
            Direction::ToServer,
            "RDMA Write",
            RdmapOpcode::RdmaWrite,
            Placement::Tagged {
                stag: 0x0000_2201,
                offset: 0,
            },
            data,
        ),
        (
            Direction::ToServer,
            "RDMA Read Request",
            RdmapOpcode::RdmaReadRequest,
            untagged(QN_READ_REQUEST, 2),
            rr,
        ),
        (
            Direction::ToClient,
            "RDMA Read Response",
            RdmapOpcode::RdmaReadResponse,
            Placement::Tagged {
                stag: 0x0000_1101,
                offset: 0,
            },
            data,
        ),
        (
            Direction::ToServer,
            "Send with Invalidate",
            RdmapOpcode::SendWithInvalidate,
            Placement::Untagged {
                queue: QN_SEND,
                msn: 2,
                offset: 0,
                ulp_field: 0x0000_2201,
            },
            b"inv",
        ),
        (
            Direction::ToServer,
            "Send with SE and Invalidate",
            RdmapOpcode::SendWithSolicitedEventAndInvalidate,
            Placement::Untagged {
                queue: QN_SEND,
                msn: 3,
                offset: 0,
                ulp_field: 0x0000_2202,
            },
            b"inv+se",
        ),
        (
            Direction::ToClient,
            "Terminate (invalid STag)",
            RdmapOpcode::Terminate,
            untagged(QN_TERMINATE, 1),
            term_body,
        ),
    ]
}

/// The sample conversation as a TCP conversation between `client` and `server`, one iWARP frame per segment.
pub fn sample_capture(
    client: SocketAddrV4,
    server: SocketAddrV4,
    crc: bool,
) -> Result<(TcpConversation, Vec<SampleFrame>), WireError> {
    let frames = sample_conversation(crc)?;
    let mut conv = TcpConversation::new(client, server);
    for f in &frames {
        conv.send(f.direction, &f.bytes);
    }
    Ok((conv, frames))
}

#[cfg(test)]
mod tests {
    use super::*;
    use soft_rdma_common::wire::fpdu::FpduRepr;

    #[test]
    fn checksums_verify() {
        let c = TcpConversation::new(
            "10.0.0.1:40000".parse().unwrap(),
            "10.0.0.2:7174".parse().unwrap(),
        );
        for f in c.frames() {
            // A correct IPv4 header sums to zero (RFC 1071).
            assert_eq!(internet_checksum(&f[14..34]), 0);
        }
    }

    #[test]
    fn sample_frames_parse_with_our_own_decoder() {
        for crc in [false, true] {
            let frames = sample_conversation(crc).unwrap();
            assert_eq!(frames.len(), 11);
            let req = MpaRepr::parse(&frames[0].bytes).unwrap();
            assert_eq!(req.enhanced, Some(SAMPLE_REQUEST_WORD));
            assert_eq!(req.crc, crc);
            for f in &frames[2..] {
                let p = FpduRepr::parse(&f.bytes, 4096).unwrap();
                if crc {
                    soft_rdma_common::wire::fpdu::verify_crc(&f.bytes).unwrap();
                }
                let m = MessageRepr::parse(p.ulpdu).unwrap();
                assert_eq!(Some(m.opcode), f.opcode, "{}", f.what);
            }
        }
    }
}
