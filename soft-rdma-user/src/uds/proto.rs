//! The UDS protocol codec (documented in `docs/protocol.md`).
//!
//! Each frame on the stream: `length: u32 LE | fd_count: u8 | message (postcard)`, where `length` counts
//! `fd_count` and the message. `fd_count` file descriptors travel as SCM_RIGHTS ancillary data with the
//! frame's first byte: exactly one with `RegisterMemory` (the region's memfd), none with anything else
//! ([`ClientMessage::fds_expected`]). Messages are postcard-encoded serde types (`ClientMessage`,
//! `ServerMessage`); decoding never panics and refuses trailing bytes, unknown enum tags and unknown ND
//! status codes.

use bytes::{Buf, BufMut, BytesMut};
use serde::{Deserialize, Serialize};

use crate::engine::api::{
    AdapterInfo, CmEvent, CmRequest, CmResponse, Completion, CompletionQueueId, QueuePairId, RequestId,
    SessionId, WorkRequest,
};
use crate::error::Error;

/// Version 2 added the data path (memory registration, queue pairs, `Post`, `Completions`).
pub const PROTOCOL_VERSION: u16 = 2;
pub const DEFAULT_SOCKET_PATH: &str = "/run/soft-rdma/soft-rdmad.sock";
/// The environment variable that overrides [`DEFAULT_SOCKET_PATH`] for clients.
pub const SOCKET_ENV: &str = "SOFT_RDMA_UDS";
/// Client → daemon frames: requests are small (private data ≤ 256 bytes); a `Post` batch of work requests
/// is split by the client library to stay below this.
pub const MAX_CLIENT_FRAME: usize = 64 * 1024;
/// File descriptors one frame may carry.
pub const MAX_FDS_PER_FRAME: u8 = 1;
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
        request: CmRequest,
    },
    /// Work requests for a queue pair. No answer: each completes on its completion queue, errors included,
    /// so posting never waits for the daemon (IND2QueuePair::Send/Receive/Read/Write are non-blocking).
    Post {
        qp: QueuePairId,
        requests: Vec<WorkRequest>,
    },
}

impl ClientMessage {
    /// How many file descriptors travel with this message.
    pub fn fds_expected(&self) -> u8 {
        match self {
            ClientMessage::Request {
                request: CmRequest::RegisterMemory { .. },
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
    },
    /// The synchronous answer to Request `id` (`Ok(CmResponse::Pending)` for asynchronous requests).
    Response {
        id: RequestId,
        result: Result<CmResponse, Error>,
    },
    /// `CmEvent::Completed` for a Pending request.
    Event(CmEvent),
    /// Work completions for one completion queue, in the order they happened.
    Completions {
        cq: CompletionQueueId,
        entries: Vec<Completion>,
    },
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
    pub fn encode(&self, out: &mut BytesMut) {
        encode(self, 0, out)
    }

    pub fn decode(frame: &[u8]) -> Result<Self, ProtoError> {
        match decode(frame)? {
            (0, msg) => Ok(msg),
            (n, _) => Err(ProtoError::UnexpectedFds(n, 0)),
        }
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
    use crate::engine::api::*;
    use crate::error::NdStatus;
    use bytes::Bytes;
    use proptest::prelude::*;

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
            request: CmRequest::Connect {
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
                ClientMessage::Request { id: RequestId(i), request: CmRequest::GetReadLimits { connector: ConnectorId(i) } }.encode(&mut whole);
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
