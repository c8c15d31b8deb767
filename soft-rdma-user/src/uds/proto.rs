//! The UDS protocol codec (documented in `docs/protocol.md`).
//!
//! Each frame on the stream: `length: u32 LE | fd_count: u8 | message (postcard)`, where `length` counts
//! `fd_count` and the message. `fd_count` file descriptors travel as SCM_RIGHTS ancillary data with the
//! frame's first byte: from a client, exactly one with `RegisterMemory` (the region's memfd), none with
//! anything else ([`ClientMessage::fds_expected`]); from the daemon, the shared rings of a queue pair or a
//! completion queue and their doorbells, and the socket of a hand-off ([`ServerMessage::fds_expected`]). Messages are postcard-encoded serde types (`ClientMessage`,
//! `ServerMessage`); decoding never panics and refuses trailing bytes, unknown enum tags and unknown ND
//! status codes.

use bytes::{Buf, BufMut, BytesMut};
use serde::{Deserialize, Serialize};

use super::messages::{Event, Request, Response};
use crate::engine::requests::{AdapterInfo, RequestId, SessionId};
use crate::error::Error;

/// Version 2 added the data path (memory registration, queue pairs, `Post`, `Completions`); version 3 the
/// status report's `resources`; version 4 kernel mode's hand-off (Welcome's `hand_off`, `HandedOff` with
/// the socket as SCM_RIGHTS, `ConnectionEnded`); version 5 the shared-memory rings of daemon-run queue pairs
/// (`QueuePair` and `CompletionQueue` answers carry their memfd and doorbells; `Post` and `Completions`
/// are gone: work requests and completions travel through the rings, `crate::rings`) and a connector's
/// `tcp` (TCP_INFO) in the status; version 6 a queue pair's status with its read limits (`ird`, `ord`) and
/// a Terminate's `violation` and `buffer` (what the side that sent it found, for its words); version 7 a
/// queue pair's traffic by operation (`QpStats::by_op`), which kernel-mode clients report for soft-rdmad's
/// metrics; version 8 `RegisterProcessMemory` (a client's own memory, reached in its process); version 9
/// the status's XDP-mode TCP connections (`TransportStatus::tcp_connections`); version 10 shared receive
/// queues (`CreateSharedReceiveQueue` … `CreateQueuePairOnSrq`, the `SrqLimitReached` event) and protection
/// domains: `RegisterMemory`, `RegisterProcessMemory` and a queue pair's config carry the PD (`PdId`) the
/// region or queue pair belongs to, and the data path checks every access against the queue pair's PD;
/// version 11 the `QueuePairEvent` event (IBV_EVENT_QP_FATAL, _REQ_ERR, _ACCESS_ERR, as siw raises them).
pub const PROTOCOL_VERSION: u16 = 11;
pub const DEFAULT_SOCKET_PATH: &str = "/run/soft-rdma/soft-rdmad.sock";
/// The environment variable that overrides [`DEFAULT_SOCKET_PATH`] for clients.
pub const SOCKET_ENV: &str = "SOFT_RDMA_UDS";
/// Client → daemon frames: requests are small (private data ≤ 256 bytes).
pub const MAX_CLIENT_FRAME: usize = 64 * 1024;
/// File descriptors one client frame may carry.
pub const MAX_FDS_PER_FRAME: u8 = 1;
/// File descriptors one daemon frame may carry (a completion queue's answer).
pub const MAX_SERVER_FDS_PER_FRAME: u8 = 3;
/// Daemon → client frames: a Status report of 16,384 connections is large.
pub const MAX_SERVER_FRAME: usize = 16 * 1024 * 1024;
pub const HEADER_LEN: usize = 5;

/// From a client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientMessage {
    /// The first message of every session.
    Hello {
        version: u16,
        client_name: String,
    },
    Request {
        id: RequestId,
        request: Request,
    },
}

impl ClientMessage {
    /// How many file descriptors travel with this message.
    pub fn fds_expected(&self) -> u8 {
        match self {
            ClientMessage::Request {
                request: Request::RegisterMemory { .. },
                ..
            } => 1,
            _ => 0,
        }
    }
}

/// From the daemon.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServerMessage {
    Welcome {
        version: u16,
        session: SessionId,
        adapter: AdapterInfo,
        /// Kernel mode: the client runs its queue pairs itself (memory, completion queues and queue pairs
        /// stay in its process), and each established connection that carries one is handed to it
        /// ([`Response::HandedOff`]). `false`: the daemon runs them (XDP mode).
        hand_off: bool,
    },
    /// The synchronous answer to Request `id` (`Ok(Response::Pending)` for asynchronous requests).
    Response {
        id: RequestId,
        result: Result<Response, Error>,
    },
    /// `Event::Completed` for a Pending request.
    Event(Event),
    /// The daemon ends the session: protocol violation, version mismatch, or shutdown (DEVICE_REMOVED).
    Goodbye { error: Error },
}

/// Everything wrong a frame can be.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("frame of {0} bytes exceeds the maximum of {1}")]
    TooLong(usize, usize),
    #[error("empty frame")]
    Empty,
    #[error("{0} file descriptors announced; this message takes {1}")]
    UnexpectedFds(u8, u8),
    #[error("the frame announced {0} file descriptors but none arrived with it")]
    MissingFds(u8),
    #[error("undecodable message: {0}")]
    Malformed(String),
    #[error("{0} trailing bytes after the message")]
    TrailingBytes(usize),
    #[error("protocol version {0} not supported (this daemon speaks {PROTOCOL_VERSION})")]
    UnsupportedVersion(u16),
    /// Descriptors arrived (SCM_RIGHTS) that no frame announces: they are closed at once and the session
    /// ends (a client could otherwise make the daemon hold its own socket, and never see it close).
    #[error("{0} file descriptors arrived that no frame announces")]
    UnannouncedFds(usize),
    /// The Hello, or the rest of a frame, did not come in time (`--hello-timeout-ms`,
    /// `--frame-timeout-ms`): the session ends with IO_TIMEOUT.
    #[error("{0}")]
    TimedOut(String),
    /// The stream ended with part of a frame buffered ([`truncated`]).
    #[error("the stream closed in the middle of a frame ({0} of {1} bytes)")]
    Truncated(usize, usize),
}

fn encode<T: Serialize>(msg: &T, fds: u8, out: &mut BytesMut) {
    let body = postcard::to_stdvec(msg).expect("postcard encodes every protocol type");
    out.put_u32_le((body.len() + 1) as u32);
    out.put_u8(fds);
    out.put_slice(&body);
}

/// The fd count and the message of one frame.
fn decode<'a, T: Deserialize<'a>>(frame: &'a [u8]) -> Result<(u8, T), ProtoError> {
    let (&fds, body) = frame.split_first().ok_or(ProtoError::Empty)?;
    let (msg, rest) = postcard::take_from_bytes(body).map_err(|e| ProtoError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(ProtoError::TrailingBytes(rest.len()));
    }
    Ok((fds, msg))
}

impl ClientMessage {
    /// Appends the framed message to `out`, announcing the fds it carries ([`Self::fds_expected`]).
    pub fn encode(&self, out: &mut BytesMut) {
        encode(self, self.fds_expected(), out)
    }

    /// Decodes one frame (as returned by [`split_frame`]), checking that its announced fd count is the one
    /// the message takes. The fds themselves arrive beside the stream ([`super::fdpass`]).
    pub fn decode(frame: &[u8]) -> Result<Self, ProtoError> {
        let (fds, msg): (u8, ClientMessage) = decode(frame)?;
        let expected = msg.fds_expected();
        if fds != expected {
            return Err(ProtoError::UnexpectedFds(fds, expected));
        }
        Ok(msg)
    }
}

impl ServerMessage {
    /// How many file descriptors travel with this message, in this order:
    /// - a hand-off's answer: the connection's socket;
    /// - `QueuePair`: the memfd of its send and receive rings (`rings::qp::QpRingLayout` for the depths
    ///   asked), and the session's doorbell (the daemon's: rung when a ring's need-wakeup flag asks);
    /// - `CompletionQueue`: the memfd of its completion ring (`rings::cq::geometry` of the depth asked), its
    ///   completion doorbell (the client's), and the session's doorbell (the same eventfd each time).
    pub fn fds_expected(&self) -> u8 {
        let fds = |r: &Result<Response, Error>| match r {
            Ok(Response::HandedOff(_)) => 1,
            Ok(Response::QueuePair(_)) => 2,
            Ok(Response::CompletionQueue(_)) => 3,
            _ => 0,
        };
        match self {
            ServerMessage::Response { result, .. } => fds(result),
            ServerMessage::Event(Event::Completed { result, .. }) => fds(result),
            _ => 0,
        }
    }

    pub fn encode(&self, out: &mut BytesMut) {
        encode(self, self.fds_expected(), out)
    }

    /// Decodes one frame, checking that its announced fd count is the one the message takes.
    pub fn decode(frame: &[u8]) -> Result<Self, ProtoError> {
        let (fds, msg): (u8, ServerMessage) = decode(frame)?;
        let expected = msg.fds_expected();
        if fds != expected {
            return Err(ProtoError::UnexpectedFds(fds, expected));
        }
        Ok(msg)
    }
}

/// Takes one whole frame (fd count + message) off the front of `buf`; `Ok(None)` until it is all there.
/// A length above `max` is refused from the 4-byte prefix alone.
pub fn split_frame(buf: &mut BytesMut, max: usize) -> Result<Option<BytesMut>, ProtoError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > max {
        return Err(ProtoError::TooLong(len, max));
    }
    if len == 0 {
        return Err(ProtoError::Empty);
    }
    if buf.len() < 4 + len {
        buf.reserve(4 + len - buf.len());
        return Ok(None);
    }
    buf.advance(4);
    Ok(Some(buf.split_to(len)))
}

/// What is wrong with `buf` when the stream ends: `None` if it holds no partial frame, else how much of the
/// frame arrived (of the length its prefix announced; of the 4-byte prefix itself if that is incomplete).
pub fn truncated(buf: &[u8]) -> Option<ProtoError> {
    match buf.len() {
        0 => None,
        n @ 1..4 => Some(ProtoError::Truncated(n, 4)),
        n => {
            let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
            Some(ProtoError::Truncated(n - 4, len))
        }
    }
}

const _: () = assert!(HEADER_LEN == 5);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::ids::PdId;
    use crate::engine::requests::*;
    use crate::engine::verbs::*;
    use crate::error::NdStatus;
    use crate::status::StatusReport;
    use crate::transport::status::TransportStatus;
    use crate::uds::messages::{Event, ObjectRef, Request, Response};
    use bytes::Bytes;
    use proptest::prelude::*;

    /// One message of every request and answer variant, as the daemon and clients exchange them.
    fn every_variant() -> (Vec<ClientMessage>, Vec<ServerMessage>) {
        let c = ConnectorId(3);
        let l = ListenerId(4);
        let ep = SharedEndpointId(5);
        let qp = QueuePairId(6);
        let cq = CompletionQueueId(7);
        let mr = MemoryRegionId(8);
        let a: std::net::SocketAddr = "10.0.0.1:49152".parse().unwrap();
        let b: std::net::SocketAddr = "[fd00::2]:7174".parse().unwrap();
        let lim = ReadLimits {
            inbound: 4,
            outbound: 8,
        };
        let pd = Bytes::from_static(&[1, 2, 3]);
        let qpc = QueuePairConfig {
            send_cq: cq,
            receive_cq: cq,
            send_depth: 16,
            receive_depth: 32,
            max_send_sge: 2,
            max_receive_sge: 3,
            pd: PdId(3),
        };
        let requests = vec![
            Request::Query,
            Request::CreateConnector,
            Request::CloseConnector { connector: c },
            Request::Bind {
                connector: c,
                local: a,
            },
            Request::Connect {
                connector: c,
                remote: b,
                limits: lim,
                private_data: pd.clone(),
                shared_endpoint: Some(ep),
                queue_pair: Some(qp),
            },
            Request::CompleteConnect { connector: c },
            Request::Accept {
                connector: c,
                limits: lim,
                private_data: pd.clone(),
                queue_pair: None,
            },
            Request::Reject {
                connector: c,
                private_data: pd.clone(),
            },
            Request::GetReadLimits { connector: c },
            Request::GetPrivateData {
                connector: c,
                buffer_len: 300,
            },
            Request::GetLocalAddress { connector: c },
            Request::GetPeerAddress { connector: c },
            Request::NotifyDisconnect { connector: c },
            Request::Disconnect { connector: c },
            Request::Cancel {
                object: ObjectRef::Connector(c),
            },
            Request::Cancel {
                object: ObjectRef::Listener(l),
            },
            Request::CreateListener,
            Request::CloseListener { listener: l },
            Request::Listen {
                listener: l,
                local: a,
                backlog: 128,
            },
            Request::GetConnectionRequest {
                listener: l,
                connector: c,
            },
            Request::CreateSharedEndpoint { local: a },
            Request::CloseSharedEndpoint { endpoint: ep },
            Request::Status,
            Request::RegisterMemory {
                length: 1 << 20,
                access: Access::ALL,
                pd: PdId(3),
            },
            Request::DeregisterMemory { region: mr },
            Request::CreateCompletionQueue { depth: 64 },
            Request::CloseCompletionQueue { cq },
            Request::CreateQueuePair { config: qpc },
            Request::CloseQueuePair { qp },
            Request::QueryQueuePair { qp },
            Request::RegisterProcessMemory {
                address: 0x7f00_0000_1000,
                length: 4096,
                iova: 0x7f00_0000_1000,
                access: Access::ALL,
                pd: PdId(3),
            },
            Request::ConnectionEnded {
                connector: c,
                how: ConnectionEnd::TimedOut,
            },
            Request::ReportDataPath {
                queue_pairs: vec![],
                memory_regions: 2,
                first: true,
            },
        ];
        let client = requests
            .into_iter()
            .enumerate()
            .map(|(i, request)| ClientMessage::Request {
                id: RequestId(i as u64 + 1),
                request,
            })
            .collect();
        let qps = QueuePairStatus {
            id: 6,
            session: 1,
            connector: Some(3),
            state: QueuePairState::Error,
            terminate: Some(TerminateInfo {
                layer: 1,
                error_type: 1,
                code: 0,
                from_peer: false,
                violation: Some(Violation::WriteWithoutRemoteWrite),
                buffer: Some(TaggedRange {
                    stag: Stag(0x301),
                    offset: 8,
                    length: 64,
                }),
            }),
            ird: 16,
            ord: 4,
            stats: Default::default(),
        };
        let status = StatusReport {
            listeners: vec![ListenerStatus {
                id: 4,
                session: 1,
                local: a,
                backlog: 0,
                queued_offers: 2,
            }],
            connectors: vec![ConnectorStatus {
                id: 3,
                session: 1,
                state: ConnectorState::Connected,
                local: Some(a),
                peer: Some(b),
                inbound_read_limit: Some(4),
                outbound_read_limit: Some(8),
                peer_private_data_len: Some(3),
                mpa_revision: Some(2),
                tcp: Some(crate::engine::requests::TcpStatus {
                    rtt_us: 52,
                    rttvar_us: 20,
                    snd_cwnd: 10,
                    snd_mss: 1448,
                    unacked: 0,
                    total_retrans: 1,
                    bytes_acked: 4096,
                    bytes_received: 8192,
                }),
            }],
            shared_endpoints: vec![a],
            ports_in_use: 3,
            ports_free: 16381,
            sessions: 1,
            queue_pairs: vec![qps.clone()],
            memory_regions: 2,
            transport: Some(TransportStatus {
                kind: "xdp".into(),
                interface: Some("veth0".into()),
                mode: None,
                link: None,
                counters: vec![("steered".into(), 9)],
                queues: vec![],
                tcp_connections: Some(vec![crate::transport::status::TcpConnectionStatus {
                    local: a,
                    remote: a,
                    state: "TIME-WAIT".into(),
                }]),
            }),
            resources: Some(Box::default()),
        };
        let responses = vec![
            Ok(Response::Done),
            Ok(Response::Pending),
            // Fixed sample values, not the daemon's defaults: a default that changes (the queue depths went
            // from 1,024 to siw's 32,768) changes no encoding.
            Ok(Response::Adapter(AdapterInfo {
                max_inbound_read_limit: 128,
                max_outbound_read_limit: 128,
                max_caller_data: 252,
                max_callee_data: 252,
                max_send_queue_depth: 1024,
                max_receive_queue_depth: 1024,
                max_completion_queue_depth: 3_276_800,
                max_transfer_length: 1 << 30,
                max_send_sge: 8,
                max_receive_sge: 8,
            })),
            Ok(Response::Connector(c)),
            Ok(Response::Listener(l)),
            Ok(Response::SharedEndpoint(ep)),
            Ok(Response::Bound(a)),
            Ok(Response::ReadLimits(lim)),
            Ok(Response::PrivateData {
                data: pd.clone(),
                required: 3,
            }),
            Ok(Response::Address(b)),
            Ok(Response::ConnectionRequest {
                connector: c,
                peer: b,
                limits: lim,
                private_data: pd.clone(),
            }),
            Ok(Response::Status(status)),
            Ok(Response::MemoryRegion {
                region: mr,
                stag: Stag(0x0102_0304),
            }),
            Ok(Response::CompletionQueue(cq)),
            Ok(Response::QueuePair(qp)),
            Ok(Response::QueuePairInfo(qps)),
            Ok(Response::HandedOff(HandOff {
                conn: crate::engine::transport_seam::ConnId(1 << 32),
                crc: true,
                max_ulpdu: 1448,
                max_inbound_ulpdu: 65535,
                ird: 4,
                ord: 8,
                send_rtr: Some(crate::engine::framing::Rtr::Read),
                awaiting_rtr: false,
                tx_held: true,
                first_fpdu_hold_us: 19_000,
                fin_hold_us: 20_000,
                received: pd.clone(),
            })),
            Err(Error::buffer_overflow(252, "short")),
        ];
        let mut server: Vec<ServerMessage> = responses
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, result)| ServerMessage::Response {
                id: RequestId(i as u64 + 1),
                result,
            })
            .collect();
        server.extend(responses.into_iter().map(|result| {
            ServerMessage::Event(Event::Completed {
                request: RequestId(99),
                result,
            })
        }));
        (client, server)
    }

    fn hex(m: &[u8]) -> String {
        m.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The bytes of every request and answer variant, as protocol version 10 defines them (version 2's, recorded
    /// when the engine's types still were the protocol's, plus version 3's status `resources`, version 4's
    /// hand-off: `ConnectionEnded`, `HandedOff`, Welcome's `hand_off`, version 5's fd counts of the
    /// `QueuePair` and `CompletionQueue` answers, without `Post` and `Completions`, and connector `tcp`, and
    /// version 6's queue-pair `ird`, `ord` and Terminate `violation`, `buffer`, version 7's queue-pair
    /// `stats.by_op`, version 8's `RegisterProcessMemory`, version 9's status `transport.tcp_connections`,
    /// version 10's `pd` of `RegisterMemory`, `RegisterProcessMemory` and `QueuePairConfig`; the Welcome's
    /// adapter info holds the default limits, whose CQ depth is siw's 3,276,800 since version 10).
    /// A failure here is a protocol change: bump `PROTOCOL_VERSION`, update
    /// docs/protocol.md, then these bytes.
    const GOLDEN: &[&str] = &[
        "0400000000010100",
        "0400000000010201",
        "050000000001030203",
        "0d0000000001040303000a000001808003",
        "22000000000105040301fd000000000000000000000000000002863804080301020301050106",
        "050000000001060503",
        "0c000000000107060304080301020300",
        "09000000000108070303010203",
        "050000000001090803",
        "0700000000010a0903ac02",
        "0500000000010b0a03",
        "0500000000010c0b03",
        "0500000000010d0c03",
        "0500000000010e0d03",
        "0600000000010f0e0003",
        "060000000001100e0104",
        "040000000001110f",
        "050000000001121004",
        "0f0000000001131104000a0000018080038001",
        "06000000000114120403",
        "0c00000000011513000a000001808003",
        "050000000001161405",
        "0400000000011715",
        "09000000010118168080400703",
        "050000000001191708",
        "0500000000011a1840",
        "0500000000011b1907",
        "0b00000000011c1a07071020020303",
        "0500000000011d1d06",
        "0500000000011e1e06",
        "1600000000011f1f80a0808080e01f802080a0808080e01f0703",
        "060000000001201b0302",
        "070000000001211c000201",
        "050000000001010000",
        "050000000001020001",
        "1c000000000103000280018001fc01fc01800880088080c80180808080040808",
        "06000000000104000303",
        "06000000000105000404",
        "06000000000106000505",
        "0d0000000001070006000a000001808003",
        "0700000000010800070408",
        "0a00000000010900080301020303",
        "1800000000010a000901fd0000000000000000000000000000028638",
        "1f00000000010b000a0301fd0000000000000000000000000000028638040803010203",
        "c300000000010c000b010401000a00000180800300020103010601000a0000018080030101fd000000000000000000000000000002863801040108010301020134140aa80b00018020804001000a00000180800303fd7f010106010103020101010000010d0181060840100400000000000000000000000000000000000000000000000002010378647001057665746830000001077374656572656409000101000a000001808003000a0000018080030954494d452d5741495401000000000000000000000000",
        "0a00000000010d000c0884868808",
        "0600000003010e000d07",
        "0600000002010f000e06",
        "30000000000110000f06010103020101010000010d01810608401004000000000000000000000000000000000000000000000000",
        "200000000101110010808080801001a80bffff03040801020001b89401a09c0103010203",
        "120000000001120185808080080573686f727401fc01",
        "06000000000200630000",
        "06000000000200630001",
        "1d00000000020063000280018001fc01fc01800880088080c80180808080040808",
        "0700000000020063000303",
        "0700000000020063000404",
        "0700000000020063000505",
        "0e000000000200630006000a000001808003",
        "080000000002006300070408",
        "0b0000000002006300080301020303",
        "1900000000020063000901fd0000000000000000000000000000028638",
        "2000000000020063000a0301fd0000000000000000000000000000028638040803010203",
        "c400000000020063000b010401000a00000180800300020103010601000a0000018080030101fd000000000000000000000000000002863801040108010301020134140aa80b00018020804001000a00000180800303fd7f010106010103020101010000010d0181060840100400000000000000000000000000000000000000000000000002010378647001057665746830000001077374656572656409000101000a000001808003000a0000018080030954494d452d5741495401000000000000000000000000",
        "0b00000000020063000c0884868808",
        "0700000003020063000d07",
        "0700000002020063000e06",
        "3100000000020063000f06010103020101010000010d01810608401004000000000000000000000000000000000000000000000000",
        "21000000010200630010808080801001a80bffff03040801020001b89401a09c0103010203",
        "13000000000200630185808080080573686f727401fc01",
    ];

    /// Version 10's shared-receive-queue requests, answers and event (after version 9's variants, whose
    /// bytes they leave alone).
    fn srq_variants() -> (Vec<ClientMessage>, Vec<ServerMessage>) {
        use crate::engine::srq::{SharedReceiveQueueId, SrqConfig, SrqStatus};
        let srq = SharedReceiveQueueId(7);
        let sge = Sge {
            stag: Stag(0x0102_0304),
            offset: 16,
            length: 64,
        };
        let requests = vec![
            Request::CreateSharedReceiveQueue {
                config: SrqConfig {
                    depth: 16,
                    max_sge: 2,
                    limit: 4,
                },
            },
            Request::CloseSharedReceiveQueue { srq },
            Request::ModifySharedReceiveQueue { srq, limit: 2 },
            Request::QuerySharedReceiveQueue { srq },
            Request::PostSharedReceiveQueue {
                srq,
                receives: vec![(1, vec![sge]), (2, vec![sge, sge])],
            },
            Request::CreateQueuePairOnSrq {
                config: QueuePairConfig::on_one_cq(CompletionQueueId(5), 8),
                srq,
            },
        ];
        let client = requests
            .into_iter()
            .map(|request| ClientMessage::Request {
                id: RequestId(1),
                request,
            })
            .collect();
        let status = SrqStatus {
            depth: 16,
            max_sge: 2,
            limit: 4,
            armed: true,
            posted: 3,
        };
        let responses = [
            Response::SharedReceiveQueue(srq),
            Response::SharedReceiveQueueInfo(status),
            Response::SharedReceivesPosted { refused: None },
            Response::SharedReceivesPosted {
                refused: Some((1, Error::new(NdStatus::InsufficientResources, "full"))),
            },
        ];
        let mut server: Vec<ServerMessage> = responses
            .into_iter()
            .map(|r| ServerMessage::Response {
                id: RequestId(1),
                result: Ok(r),
            })
            .collect();
        server.push(ServerMessage::Event(Event::SrqLimitReached { srq }));
        (client, server)
    }

    /// The bytes of [`srq_variants`], as protocol version 10 defines them.
    const GOLDEN_10: &[&str] = &[
        "0700000000010120100204",
        "050000000001012107",
        "06000000000101220702",
        "050000000001012307",
        "1c00000000010124070201018486880810400202848688081040848688081040",
        "0c000000000101250505080801010007",
        "06000000000101001107",
        "0a00000000010100121002040103",
        "06000000000101001300",
        "12000000000101001301019a8180800c0466756c6c00",
        "0400000000020107",
    ];

    /// Each message's frame as hex, the client's then the server's; printed with a `label` prefix when
    /// SOFT_RDMA_PRINT_GOLDEN is set (to record new golden bytes).
    fn frames(client: &[ClientMessage], server: &[ServerMessage], label: &str) -> Vec<String> {
        let frames: Vec<String> = client
            .iter()
            .map(|m| {
                let mut b = BytesMut::new();
                m.encode(&mut b);
                hex(&b)
            })
            .chain(server.iter().map(|m| {
                let mut b = BytesMut::new();
                m.encode(&mut b);
                hex(&b)
            }))
            .collect();
        if std::env::var_os("SOFT_RDMA_PRINT_GOLDEN").is_some() {
            for f in &frames {
                println!("{label} \"{f}\",");
            }
        }
        frames
    }

    /// Every message decodes to itself.
    fn roundtrip_all(client: Vec<ClientMessage>, server: Vec<ServerMessage>) {
        for m in client {
            roundtrip_client(m);
        }
        for m in server {
            let mut b = BytesMut::new();
            m.encode(&mut b);
            let f = split_frame(&mut b, MAX_SERVER_FRAME).unwrap().unwrap();
            assert_eq!(ServerMessage::decode(&f).unwrap(), m);
        }
    }

    /// Version 11's messages: the queue pair event, each kind.
    fn qp_event_variants() -> (Vec<ClientMessage>, Vec<ServerMessage>) {
        use crate::engine::verbs::{QueuePairEvent, QueuePairId};
        let server = [
            QueuePairEvent::Fatal,
            QueuePairEvent::RequestError,
            QueuePairEvent::AccessError,
        ]
        .into_iter()
        .map(|event| {
            ServerMessage::Event(Event::QueuePairEvent {
                qp: QueuePairId(9),
                event,
            })
        })
        .collect();
        (Vec::new(), server)
    }

    /// The bytes of [`qp_event_variants`], as protocol version 11 defines them.
    const GOLDEN_11: &[&str] = &["050000000002020900", "050000000002020901", "050000000002020902"];

    #[test]
    fn qp_event_variants_encode_as_protocol_version_11() {
        let (client, server) = qp_event_variants();
        let frames = frames(&client, &server, "GOLDEN_11");
        let golden: Vec<String> = GOLDEN_11.iter().map(|g| g.to_string()).collect();
        assert_eq!(frames, golden, "a version 11 variant changed its encoding");
        roundtrip_all(client, server);
    }

    #[test]
    fn srq_variants_encode_as_protocol_version_10() {
        let (client, server) = srq_variants();
        let frames = frames(&client, &server, "GOLDEN_10");
        let golden: Vec<String> = GOLDEN_10.iter().map(|g| g.to_string()).collect();
        assert_eq!(frames, golden, "a version 10 variant changed its encoding");
        roundtrip_all(client, server);
    }

    #[test]
    fn every_variant_encodes_as_protocol_version_10() {
        let (client, server) = every_variant();
        let frames = frames(&client, &server, "GOLDEN");
        assert_eq!(frames.len(), GOLDEN.len());
        for (i, (got, want)) in frames.iter().zip(GOLDEN).enumerate() {
            assert_eq!(got, want, "message {i} no longer encodes as protocol version 10");
        }
        roundtrip_all(client, server);
    }

    fn roundtrip_client(m: ClientMessage) {
        let mut b = BytesMut::new();
        m.encode(&mut b);
        let f = split_frame(&mut b, MAX_CLIENT_FRAME).unwrap().unwrap();
        assert_eq!(ClientMessage::decode(&f).unwrap(), m);
        assert!(b.is_empty());
    }

    #[test]
    fn hello_vector() {
        let mut b = BytesMut::new();
        ClientMessage::Hello {
            version: 1,
            client_name: "x".into(),
        }
        .encode(&mut b);
        // length 5 | fd_count 0 | variant 0, version varint 1, name length 1, 'x'
        assert_eq!(&b[..], &[5, 0, 0, 0, 0, 0, 1, 1, b'x']);
    }

    #[test]
    fn requests_round_trip() {
        roundtrip_client(ClientMessage::Request {
            id: RequestId(7),
            request: Request::Connect {
                connector: ConnectorId(3),
                remote: "[fd00::2]:7174".parse().unwrap(),
                limits: ReadLimits {
                    inbound: 4,
                    outbound: 8,
                },
                private_data: Bytes::from_static(&[1, 2, 3]),
                shared_endpoint: Some(SharedEndpointId(9)),
                queue_pair: None,
            },
        });
        let m = ServerMessage::Response {
            id: RequestId(7),
            result: Err(Error::buffer_overflow(252, "short buffer")),
        };
        let mut b = BytesMut::new();
        m.encode(&mut b);
        let f = split_frame(&mut b, MAX_SERVER_FRAME).unwrap().unwrap();
        assert_eq!(ServerMessage::decode(&f).unwrap(), m);
    }

    #[test]
    fn malformed_frames() {
        let mut b = BytesMut::from(&[0xFF, 0xFF, 0xFF, 0x7F][..]);
        assert!(matches!(
            split_frame(&mut b, MAX_CLIENT_FRAME),
            Err(ProtoError::TooLong(..))
        ));
        assert_eq!(
            ClientMessage::decode(&[1, 0, 2, 0]),
            Err(ProtoError::UnexpectedFds(1, 0))
        );
        assert!(
            matches!(ClientMessage::decode(&[0, 9]), Err(ProtoError::Malformed(_))),
            "unknown variant"
        );
        let mut b = BytesMut::new();
        ClientMessage::Hello {
            version: 1,
            client_name: String::new(),
        }
        .encode(&mut b);
        let mut f = split_frame(&mut b, MAX_CLIENT_FRAME).unwrap().unwrap().to_vec();
        f.push(0);
        assert_eq!(ClientMessage::decode(&f), Err(ProtoError::TrailingBytes(1)));
        // An unknown ND status code is refused, not mapped to something else.
        let mut b = BytesMut::new();
        ServerMessage::Goodbye {
            error: Error::new(NdStatus::DeviceRemoved, "bye"),
        }
        .encode(&mut b);
        let mut f = split_frame(&mut b, MAX_SERVER_FRAME).unwrap().unwrap().to_vec();
        // variant 3, then the status varint: 0xC00002B6 → replace with an unknown 0xC0000002.
        let unknown = {
            let mut v = Vec::new();
            let mut x: u32 = 0xC000_0002;
            loop {
                let byte = (x & 0x7F) as u8;
                x >>= 7;
                if x == 0 {
                    v.push(byte);
                    break;
                }
                v.push(byte | 0x80);
            }
            v
        };
        let known_len = 5; // 0xC00002B6 as a varint is 5 bytes
        f.splice(2..2 + known_len, unknown);
        assert!(matches!(ServerMessage::decode(&f), Err(ProtoError::Malformed(_))));
    }

    #[test]
    fn truncated_frames() {
        assert_eq!(truncated(&[]), None);
        assert_eq!(truncated(&[7, 0]), Some(ProtoError::Truncated(2, 4)));
        let e = truncated(&[100, 0, 0, 0, 0, 1, 2]).unwrap();
        assert_eq!(e, ProtoError::Truncated(3, 100));
        assert_eq!(
            e.to_string(),
            "the stream closed in the middle of a frame (3 of 100 bytes)"
        );
        // What split_frame leaves behind is exactly what truncated() describes.
        let mut b = BytesMut::new();
        ClientMessage::Hello {
            version: PROTOCOL_VERSION,
            client_name: "x".into(),
        }
        .encode(&mut b);
        b.truncate(b.len() - 1);
        assert_eq!(split_frame(&mut b, MAX_CLIENT_FRAME), Ok(None));
        assert_eq!(truncated(&b), Some(ProtoError::Truncated(4, 5)));
    }

    proptest! {
        #[test]
        fn arbitrary_frames_never_panic(data in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = ClientMessage::decode(&data);
            let _ = ServerMessage::decode(&data);
            let mut b = BytesMut::from(&data[..]);
            while let Ok(Some(f)) = split_frame(&mut b, MAX_CLIENT_FRAME) {
                let _ = ClientMessage::decode(&f);
            }
        }

        #[test]
        fn fragmentation(cuts in proptest::collection::vec(0usize..60, 0..8), n in 1u64..5) {
            let mut whole = BytesMut::new();
            for i in 0..n {
                ClientMessage::Request { id: RequestId(i), request: Request::GetReadLimits { connector: ConnectorId(i) } }.encode(&mut whole);
            }
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            let mut at = 0;
            for c in cuts.iter().map(|c| c % (whole.len() + 1)).chain([whole.len()]) {
                if c <= at { continue; }
                buf.extend_from_slice(&whole[at..c]);
                at = c;
                while let Some(f) = split_frame(&mut buf, MAX_CLIENT_FRAME).unwrap() {
                    got.push(ClientMessage::decode(&f).unwrap());
                }
            }
            prop_assert_eq!(got.len() as u64, n);
        }
    }
}
