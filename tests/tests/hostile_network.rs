//! Bad input from the network: a raw TCP peer in namespace A talks to soft-rdmad in namespace B (and, for the
//! active side, a raw TCP listener in B answers soft-rdmad in A), one malformation per test. Every test asserts
//! the exact bytes the daemon answers with — an MPA Reply (flags, revision, private data), a Terminate's
//! layer/type/code (RFC 5040 §4.8), or nothing — and how it ends the connection (FIN or RST); then that
//! nothing leaked: B's TCP (the kernel's, or an XDP-mode daemon's own, as its `status` lists it) holds no
//! connection of the hostile peer (TIME-WAIT at most), the hostile peer's own address:port connects again
//! and is offered to the application, and an ordinary soft-rdma connection to the same listener succeeds
//! with no port left behind. Needs root.
//!
//! The bytes are built with soft-rdma's own wire types (`MpaRepr`, `MessageRepr`, FPDU framing and CRC32c);
//! only the malformed part of each frame is patched by hand.

use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use soft_rdma::NdStatus;
use soft_rdma::client::{Access, ConnectionRequest, PdId, ReadLimits, TerminateInfo};
use soft_rdma::client::{Adapter, CompletionQueue, Connector, Listener, MemoryRegion, QueuePair};
use soft_rdma::engine::framing::terminate_fpdu;
use soft_rdma_common::wire::TerminateCause;
use soft_rdma_common::wire::ddp::{Placement, QN_SEND};
use soft_rdma_common::wire::fpdu::{CRC_LEN, FpduRepr, verify_crc};
use soft_rdma_common::wire::mpa::{
    EnhancedControl, FLAG_CRC, FLAG_ENHANCED, FLAG_MARKERS, FLAG_REJECT, MPA_HEADER_LEN, MpaKind, MpaRepr,
};
use soft_rdma_common::wire::rdmap::{MessageRepr, RdmapOpcode, ReadRequestRepr};
use soft_rdma_common::wire::terminate::{
    ddp_code, ddp_type, layer, llp_code, llp_type, rdmap_code, rdmap_type,
};
use soft_rdma_tests::ends::{Daemons, connect_connectors, connectors, read_request_fpdu, tcp_states_to};
use soft_rdma_tests::ops::{eventually, terminated, within};
use soft_rdma_tests::{Daemon, Side, TestNet};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

const PORT: u16 = 7400;
/// The raw listener the active-side tests point soft-rdmad at.
const RAW_PORT: u16 = 7401;
const LIMITS: ReadLimits = ReadLimits {
    inbound: 4,
    outbound: 4,
};
/// Private data of every hostile Request that carries any: an offer with it must never reach the application.
const HOSTILE: &[u8] = b"hostile";
/// A responder timeout no test reaches: whatever closes the connection in these tests is the malformation.
const PATIENT: &[&str] = &["--mpa-timeout-ms", "60000"];
/// How long [`observe`] waits for the daemon to close: a hang guard, and shorter than the [`PATIENT`]
/// timeout, so that a close it sees there is never the responder timer's.
const OBSERVE_LIMIT: Duration = Duration::from_secs(30);
/// B's log line when its responder timeout closes a connection (with `timeout=` the configured value).
const RESPONDER_TIMED_OUT: &str = "no MPA Request within the responder timeout; closing";

// ---------------------------------------------------------------------------------------------------------
// What the daemon sent back.

/// How the daemon ended the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Close {
    /// A FIN: a graceful close (after everything it sent).
    Fin,
    /// An RST: the connection was aborted.
    Reset,
    /// Neither within the time the test waited.
    StillOpen,
}

/// An MPA Reply as it arrived: the raw flags byte (so every bit is checked), revision and private data
/// (including the RFC 6581 word when S=1).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Reply {
    flags: u8,
    revision: u8,
    private_data: Vec<u8>,
}

/// One RDMAP message the daemon sent in FPDU mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Msg {
    /// (layer, error type, error code).
    Terminate(u8, u8, u8),
    Other(RdmapOpcode),
}

/// Everything the daemon sent on one connection, decoded, and how it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Wire {
    reply: Option<Reply>,
    messages: Vec<Msg>,
    close: Close,
}

impl Wire {
    /// Nothing sent; the connection reset.
    const RESET: Wire = Wire {
        reply: None,
        messages: Vec::new(),
        close: Close::Reset,
    };

    /// A single Terminate, then a FIN.
    fn terminate(cause: (u8, u8, u8)) -> Wire {
        Wire {
            reply: None,
            messages: vec![Msg::Terminate(cause.0, cause.1, cause.2)],
            close: Close::Fin,
        }
    }
}

/// Reads until the daemon closes (or [`OBSERVE_LIMIT`] passes: [`Close::StillOpen`]).
async fn observe(s: &mut TcpStream) -> (Vec<u8>, Close) {
    let mut bytes = Vec::new();
    let mut buf = vec![0u8; 65536];
    let deadline = tokio::time::Instant::now() + OBSERVE_LIMIT;
    let close = loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => break Close::StillOpen,
            Ok(Ok(0)) => break Close::Fin,
            Ok(Ok(n)) => bytes.extend_from_slice(&buf[..n]),
            Ok(Err(e)) if e.kind() == ErrorKind::ConnectionReset => break Close::Reset,
            Ok(Err(e)) => panic!("reading from the daemon: {e}"),
        }
    };
    (bytes, close)
}

/// Decodes what [`observe`] read: an MPA Reply if the bytes start with one, then whole FPDUs (their CRC
/// checked when `crc` was negotiated, else the CRC field must be 0).
fn decode(bytes: &[u8], close: Close, crc: bool) -> Wire {
    let mut rest = bytes;
    let reply = if rest.starts_with(b"MPA ID") {
        let len = MpaRepr::frame_len(rest)
            .expect("the daemon's MPA frame is well-formed")
            .expect("a whole MPA frame");
        let frame = MpaRepr::parse(&rest[..len]).expect("the daemon's MPA frame parses");
        assert_eq!(frame.kind, MpaKind::Reply, "the daemon answers with a Reply");
        let r = Reply {
            flags: rest[16],
            revision: rest[17],
            private_data: rest[MPA_HEADER_LEN..len].to_vec(),
        };
        rest = &rest[len..];
        Some(r)
    } else {
        None
    };
    let mut messages = Vec::new();
    while !rest.is_empty() {
        let len = FpduRepr::frame_len(rest, 65535)
            .expect("the daemon's FPDU length is valid")
            .filter(|len| *len <= rest.len())
            .unwrap_or_else(|| panic!("a partial FPDU at the end: {rest:02x?}"));
        let frame = &rest[..len];
        if crc {
            verify_crc(frame).expect("the daemon's FPDU CRC is right");
        } else {
            assert_eq!(&frame[len - CRC_LEN..], &[0; 4], "CRC field without CRC");
        }
        let f = FpduRepr::parse(frame, 65535).unwrap();
        let m = MessageRepr::parse(f.ulpdu).expect("the daemon's RDMAP message is well-formed");
        messages.push(match m.opcode {
            RdmapOpcode::Terminate => {
                let c = m.terminate().unwrap().cause;
                Msg::Terminate(c.layer, c.error_type, c.code)
            }
            op => Msg::Other(op),
        });
        rest = &rest[len..];
    }
    Wire {
        reply,
        messages,
        close,
    }
}

/// Reads one whole MPA frame (header and private data).
async fn read_mpa_frame(s: &mut TcpStream) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1];
    loop {
        if let Some(len) = MpaRepr::frame_len(&buf).expect("a well-formed MPA frame")
            && buf.len() == len
        {
            return buf;
        }
        // One byte at a time: never read past the frame (FPDUs may follow it).
        let n = within("an MPA frame", s.read(&mut chunk)).await.expect("read");
        assert_eq!(n, 1, "closed in the middle of an MPA frame: {buf:02x?}");
        buf.push(chunk[0]);
    }
}

// ---------------------------------------------------------------------------------------------------------
// Frames, built with soft-rdma's wire types.

fn mpa(kind: MpaKind, revision: u8, crc: bool, enhanced: Option<EnhancedControl>, pd: &[u8]) -> Vec<u8> {
    let r = MpaRepr {
        kind,
        markers: false,
        crc,
        reject: false,
        revision,
        enhanced,
        private_data: pd,
    };
    let mut b = vec![0u8; r.buffer_len()];
    r.emit(&mut b).unwrap();
    b
}

/// A well-formed MPA Rev 1 Request (RFC 5044: no IRD/ORD word, so no RTR either).
fn request_v1(crc: bool, pd: &[u8]) -> Vec<u8> {
    mpa(MpaKind::Request, 1, crc, None, pd)
}

// Spoiled MPA headers (RFC 5044 §7.1: key 16 bytes, flags M C R S (RFC 6581 §5), Rev, PD_Length), each made from
// a well-formed Request or Reply.

/// `frame` with its 16-byte key replaced by `key`.
fn with_key(mut frame: Vec<u8>, key: &[u8; 16]) -> Vec<u8> {
    frame[..16].copy_from_slice(key);
    frame
}

/// `frame` with `flags` set beside its own.
fn with_flags(mut frame: Vec<u8>, flags: u8) -> Vec<u8> {
    frame[16] |= flags;
    frame
}

/// `frame` with Rev `revision`.
fn with_revision(mut frame: Vec<u8>, revision: u8) -> Vec<u8> {
    frame[17] = revision;
    frame
}

/// `frame` with PD_Length `len`, whatever private data follows.
fn with_pd_length(mut frame: Vec<u8>, len: u16) -> Vec<u8> {
    frame[18..20].copy_from_slice(&len.to_be_bytes());
    frame
}

fn fpdu(msg: &MessageRepr<'_>, crc: bool) -> Vec<u8> {
    soft_rdma::engine::framing::fpdu(msg, crc).unwrap().to_vec()
}

fn write_fpdu(stag: u32, offset: u64, payload: &[u8], crc: bool) -> Vec<u8> {
    fpdu(
        &MessageRepr {
            opcode: RdmapOpcode::RdmaWrite,
            last: true,
            placement: Placement::Tagged { stag, offset },
            payload,
        },
        crc,
    )
}

// ---------------------------------------------------------------------------------------------------------
// The passive side: soft-rdmad in B listening, a raw peer in A.

struct Passive {
    net: TestNet,
    _da: Daemon,
    db: Daemon,
    a: Adapter,
    b: Adapter,
    listener: Listener,
    bound: SocketAddr,
}

/// Both daemons (B with `b_args`) and a listener on B:[`PORT`] held by B's application.
async fn passive(tag: &str, b_args: &[&str]) -> Passive {
    let Daemons { a, b, da, db, net } = Daemons::start(tag, &[], b_args).await;
    let listener = b.create_listener().await.unwrap();
    let bound = listener.listen(net.addr(Side::B, PORT), 0).await.unwrap();
    Passive {
        net,
        _da: da,
        db,
        a,
        b,
        listener,
        bound,
    }
}

/// A TCP connection from namespace A (`from`: a given local address:port, else an ephemeral port) to `to`.
/// The socket is created on a thread inside A's namespace; once created it can be used anywhere.
async fn raw_connect(net: &TestNet, to: SocketAddr, from: Option<SocketAddr>) -> TcpStream {
    let local = from.unwrap_or(SocketAddr::new(IpAddr::V4(net.ipv4(Side::A)), 0));
    within("raw TCP connect", async {
        loop {
            let socket = net
                .in_ns(Side::A, move || -> std::io::Result<TcpSocket> {
                    let s = TcpSocket::new_v4()?;
                    s.set_reuseaddr(true)?;
                    s.bind(local)?;
                    Ok(s)
                })
                .expect("a socket in A");
            match socket.connect(to).await {
                Ok(s) => return s,
                // Reconnecting from the same port: the previous socket may still be finishing its close.
                Err(e) if from.is_some() && e.kind() == ErrorKind::AddrNotAvailable => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(e) => panic!("TCP connect {local} → {to}: {e}"),
            }
        }
    })
    .await
}

/// B's side of a hostile connection that got through the handshake.
struct Accepted {
    _connector: Connector,
    qp: QueuePair,
    _cq: CompletionQueue,
    mr: MemoryRegion,
}

impl Passive {
    /// The raw peer connects and sends `bytes`; returns the stream and its local address.
    async fn hostile(&self, bytes: &[u8]) -> (TcpStream, SocketAddr) {
        let mut s = raw_connect(&self.net, self.bound, None).await;
        let local = s.local_addr().unwrap();
        s.write_all(bytes).await.unwrap();
        (s, local)
    }

    /// What B closed the connection for was what the peer sent: B's log never names its responder timer.
    fn assert_not_the_timer(&self) {
        let log = self.db.log_text();
        assert!(
            !log.contains(RESPONDER_TIMED_OUT),
            "B's responder timer closed a connection:\n{log}"
        );
    }

    /// B's responder timer, set to `timeout` (as `Duration`'s Debug writes it), closed the connection: its
    /// deadline itself is proven by the engine's unit tests on a driven clock.
    fn assert_the_timer(&self, timeout: &str) {
        let log = self.db.log_text();
        let with = format!("timeout={timeout}");
        assert!(
            log.lines()
                .any(|l| l.contains(RESPONDER_TIMED_OUT) && l.contains(&with)),
            "B's log names its responder timer ({timeout}):\n{log}"
        );
    }

    /// A raw MPA Rev 1 handshake (CRC if `crc`) that B's application accepts with `limits` and a queue pair
    /// (a 4 KiB region registered for remote access); the Reply has been read.
    async fn handshake(&self, crc: bool, limits: ReadLimits) -> (TcpStream, SocketAddr, Accepted) {
        self.handshake_in(PdId::default(), crc, limits).await
    }

    /// [`Passive::handshake`] with B's queue pair and region in protection domain `pd`.
    async fn handshake_in(
        &self,
        pd: PdId,
        crc: bool,
        limits: ReadLimits,
    ) -> (TcpStream, SocketAddr, Accepted) {
        let cq = self.b.create_completion_queue(64).await.unwrap();
        let qp = self.b.create_queue_pair_in(pd, &cq, &cq, 16, 16).await.unwrap();
        let mr = self
            .b
            .register_memory_in(pd, 4096, Access::REMOTE_READ | Access::REMOTE_WRITE)
            .await
            .unwrap();
        let connector = self.b.create_connector().await.unwrap();
        let (mut s, local) = self.hostile(&request_v1(crc, HOSTILE)).await;
        let offer = within("the offer", self.listener.get_connection_request(&connector))
            .await
            .unwrap();
        assert_eq!((offer.peer, &offer.private_data[..]), (local, HOSTILE));
        // Rev 1: no RTR, the Accept completes with the Reply.
        within("accept", connector.accept_qp(&qp, limits, b""))
            .await
            .unwrap();
        let reply = read_mpa_frame(&mut s).await;
        let wire = decode(&reply, Close::StillOpen, false);
        assert_eq!(
            wire.reply,
            Some(Reply {
                flags: if crc { FLAG_CRC } else { 0 },
                revision: 1,
                private_data: vec![],
            }),
            "the accepting Reply"
        );
        (
            s,
            local,
            Accepted {
                _connector: connector,
                qp,
                _cq: cq,
                mr,
            },
        )
    }

    /// States of B's TCP connections to `peer`: its kernel's sockets (`ss`), and in XDP mode its own TCP's
    /// connections as B's `status` lists them ([`tcp_states_to`]).
    async fn b_tcp_states_to(&self, peer: SocketAddr) -> Vec<String> {
        tcp_states_to(&self.net, &self.b, Side::B, peer).await
    }

    /// Nothing of the hostile connection from `hostile` is left, and the listener still works:
    /// 1. B's TCP — the kernel's, or in XDP mode the daemon's own — holds no connection of it (TIME-WAIT at
    ///    most: the daemon closed first);
    /// 2. the same address:port connects again with a well-formed Request, the application is offered that
    ///    one (so no hostile offer was queued) and accepts it, and B's TCP lists that connection ESTABLISHED
    ///    (so step 1 looked where B's connections are);
    /// 3. an ordinary soft-rdma connection from A's daemon to the same listener succeeds;
    /// 4. afterwards B holds only the listener's port and no queued offer, and A holds no port.
    async fn assert_recovers(&self, hostile: SocketAddr) {
        within("B's socket of the hostile connection to close", async {
            loop {
                let states = self.b_tcp_states_to(hostile).await;
                if states.iter().all(|s| s == "TIME-WAIT") {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;

        let mut s = raw_connect(&self.net, self.bound, Some(hostile)).await;
        s.write_all(&request_v1(false, b"again")).await.unwrap();
        let cb = self.b.create_connector().await.unwrap();
        let offer = within(
            "the offer from the same port",
            self.listener.get_connection_request(&cb),
        )
        .await
        .unwrap();
        assert_eq!(
            (offer.peer, &offer.private_data[..]),
            (hostile, &b"again"[..]),
            "the next offer is the well-formed one from the same address:port"
        );
        within("accept", cb.accept(LIMITS, b"")).await.unwrap();
        let reply = decode(&read_mpa_frame(&mut s).await, Close::StillOpen, false);
        assert_eq!(reply.reply.map(|r| (r.flags, r.revision)), Some((0, 1)));
        let states = self.b_tcp_states_to(hostile).await;
        assert!(
            states == ["ESTABLISHED"],
            "B's TCP holds the accepted connection from {hostile}, and only it: {states:?}"
        );
        drop((s, cb));

        let offer = probe_connection(
            (&self.a, &self.b),
            &self.listener,
            self.bound,
            "to the same listener after the hostile peer",
        )
        .await;
        assert_eq!(&offer.private_data[..], b"probe");

        eventually("ports and offers released", async || {
            let (sa, sb) = (self.a.status().await.unwrap(), self.b.status().await.unwrap());
            let queued: u32 = sb.listeners.iter().map(|l| l.queued_offers).sum();
            (sa.ports_in_use == 0 && sb.ports_in_use == 1 && queued == 0 && sb.connectors.is_empty())
                .then_some(())
        })
        .await;
    }
}

/// A new connector of `a`'s connects to `bound` with private data "probe" and one of `b`'s, taking the offer
/// from `listener` there, accepts it; then A disconnects. Returns the offer B accepted; `what` says which
/// connection this is, for a failure.
async fn probe_connection(
    (a, b): (&Adapter, &Adapter),
    listener: &Listener,
    bound: SocketAddr,
    what: &str,
) -> ConnectionRequest {
    let (ca, cb) = connectors((a, b)).await;
    let (x, y) = within(
        &format!("a soft-rdma connection {what}"),
        connect_connectors((&ca, &cb), listener, bound, (LIMITS, LIMITS), (b"probe", b"")),
    )
    .await;
    x.unwrap_or_else(|e| panic!("soft-rdma connect {what}: {e}"));
    let offer = y.unwrap_or_else(|e| panic!("soft-rdma accept {what}: {e}"));
    within("disconnect", ca.disconnect()).await.unwrap();
    offer
}

/// What a queue pair recorded of a Terminate: its (layer, type, code) and whether the peer sent it. (The
/// rule the peer's message broke, when this side found it, and the words are `error_messages`'s.)
fn recorded(t: TerminateInfo) -> ((u8, u8, u8), bool) {
    ((t.layer, t.error_type, t.code), t.from_peer)
}

/// A malformed MPA Request (or something else where the Request belongs): the daemon closes at once.
async fn refused_request(tag: &str, bytes: &[u8], expected: Wire) {
    let p = passive(tag, PATIENT).await;
    let (mut s, local) = p.hostile(bytes).await;
    let (got, close) = observe(&mut s).await;
    assert_eq!(decode(&got, close, false), expected, "what the daemon answered");
    p.assert_not_the_timer();
    drop(s);
    p.assert_recovers(local).await;
    drop(p.net);
}

// ---------------------------------------------------------------------------------------------------------
// 1-2: the responder's MPA timeout.

/// 1. A TCP connection that never sends anything is reset when the responder's MPA Request timeout expires:
/// 5 s by default, as siw (docs/iwarp-wire.md §2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silence_is_reset_after_the_default_five_second_mpa_timeout() {
    reset_by_the_mpa_timeout(passive("hsil", &[]).await, b"", "5s").await;
}

/// A daemon (`p`) sent `bytes` and then nothing: its MPA Request timer (`timer`, as its log names it) resets
/// the connection, and the daemon then serves a well-behaved connection on the same listener.
async fn reset_by_the_mpa_timeout(p: Passive, bytes: &[u8], timer: &str) {
    let (mut s, local) = p.hostile(bytes).await;
    let (got, close) = observe(&mut s).await;
    assert_eq!(decode(&got, close, false), Wire::RESET);
    p.assert_the_timer(timer);
    drop(s);
    p.assert_recovers(local).await;
    drop(p.net);
}

/// 2. Half an MPA Request, then silence: the same timeout (shortened with `--mpa-timeout-ms`) resets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_a_request_then_silence_is_reset_by_the_mpa_timeout() {
    let p = passive("hhalf", &["--mpa-timeout-ms", "1500"]).await;
    let req = request_v1(false, HOSTILE);
    reset_by_the_mpa_timeout(p, &req[..12], "1.5s").await;
}

// ---------------------------------------------------------------------------------------------------------
// 3-10: malformed Requests (RFC 5044 §7.1, RFC 6581 §6): there is no MPA error message before FPDU mode, so
// the responder resets the connection — except for markers, which siw answers with an R=1 Reply.

/// 3. The first 16 bytes are not "MPA ID Req Frame".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_key_is_reset() {
    let req = with_key(request_v1(false, HOSTILE), b"MPA ID Req Frome");
    refused_request("hkey", &req, Wire::RESET).await;
}

/// 4. Rev 3 (RFC 5044 defines 1, RFC 6581 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revision_three_is_reset() {
    let req = with_revision(request_v1(false, HOSTILE), 3);
    refused_request("hrev", &req, Wire::RESET).await;
}

/// 5. PD_Length 513, one more than RFC 5044 §7.1 allows: refused from the header alone (only the 20-byte
/// header is sent; the daemon must not wait for 513 bytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_data_length_513_is_reset_from_the_header() {
    let req = with_pd_length(request_v1(false, b""), 513);
    refused_request("h513", &req, Wire::RESET).await;
}

/// 6. PD_Length 65535.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_data_length_65535_is_reset_from_the_header() {
    let req = with_pd_length(request_v1(false, b""), u16::MAX);
    refused_request("h64k", &req, Wire::RESET).await;
}

/// 7. Markers requested (M=1): refused like siw does, with an R=1 Reply (no private data, Rev echoed, M and C
/// clear), then a FIN (docs/iwarp-wire.md §1). The Request arrives in two pieces, the first ending inside the
/// header: the Reply's revision must come from the Request, not from wherever the last piece starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn markers_get_a_reject_reply() {
    let p = passive("hmrk", PATIENT).await;
    let word = EnhancedControl {
        ird: 4,
        ord: 4,
        ..Default::default()
    };
    let req = with_flags(mpa(MpaKind::Request, 2, false, Some(word), HOSTILE), FLAG_MARKERS);
    let (mut s, local) = p.hostile(&req[..18]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.write_all(&req[18..]).await.unwrap();
    let (got, close) = observe(&mut s).await;
    assert_eq!(
        decode(&got, close, false),
        Wire {
            reply: Some(Reply {
                flags: FLAG_REJECT,
                revision: 2,
                private_data: vec![],
            }),
            messages: vec![],
            close: Close::Fin,
        }
    );
    p.assert_not_the_timer();
    drop(s);
    p.assert_recovers(local).await;
    drop(p.net);
}

/// 8. S=1 (RFC 6581 enhanced mode) with PD_Length 2: no room for the 4-byte IRD/ORD word.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enhanced_flag_without_room_for_the_word_is_reset() {
    let req = with_flags(
        mpa(MpaKind::Request, 2, false, None, &[0x80, 0x04]),
        FLAG_ENHANCED,
    );
    refused_request("hsw", &req, Wire::RESET).await;
}

/// 9. Bytes after the Request, before any Reply (RFC 5044 §7.1.2: the initiator cannot send FPDUs before
/// it has the Reply; siw refuses "extra data" after the Request with -EPROTO). Sent in the same segment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_after_the_request_is_reset() {
    let mut bytes = request_v1(false, HOSTILE);
    bytes.extend_from_slice(b"\xde\xad\xbe\xef garbage after the MPA Request");
    refused_request("hgrb", &bytes, Wire::RESET).await;
}

/// 10. A Reply ("MPA ID Rep Frame") where the Request belongs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_instead_of_a_request_is_reset() {
    let reply = mpa(MpaKind::Reply, 1, false, None, HOSTILE);
    refused_request("hrep", &reply, Wire::RESET).await;
}

/// 11. A well-formed Request, the application takes the offer, and then — before it accepts, so before any
/// Reply — the peer sends an FPDU (a valid RDMA Write). The connection is reset at once, nothing is placed,
/// and the application's Accept fails with CONNECTION_ABORTED (the peer abandoned the handshake).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_fpdu_before_the_reply_is_reset_and_aborts_the_accept() {
    let p = passive("hearly", PATIENT).await;
    let cq = p.b.create_completion_queue(16).await.unwrap();
    let qp = p.b.create_queue_pair(&cq, &cq, 16, 16).await.unwrap();
    let mr = p.b.register_memory(4096, Access::REMOTE_WRITE).await.unwrap();
    let cb = p.b.create_connector().await.unwrap();
    let (mut s, local) = p.hostile(&request_v1(false, HOSTILE)).await;
    let offer = within("the offer", p.listener.get_connection_request(&cb))
        .await
        .unwrap();
    assert_eq!(&offer.private_data[..], HOSTILE);
    s.write_all(&write_fpdu(mr.stag().0, 0, b"too early", false))
        .await
        .unwrap();
    let (got, close) = observe(&mut s).await;
    assert_eq!(decode(&got, close, false), Wire::RESET, "no Reply, a reset");
    p.assert_not_the_timer();
    let accepted = within("accept", cb.accept_qp(&qp, LIMITS, b"")).await;
    assert_eq!(accepted.map_err(|e| e.status), Err(NdStatus::ConnectionAborted));
    assert_eq!(mr.to_vec(0, 9).unwrap(), [0; 9], "nothing placed");
    drop((s, cb));
    p.assert_recovers(local).await;
    drop(p.net);
}

// ---------------------------------------------------------------------------------------------------------
// 12-17: after a good handshake, bad FPDUs: the daemon sends a Terminate (RFC 5040 §4.8, with the layer, type
// and code of RFC 5040 §7 / RFC 5041 §7 / RFC 5044 §8 that siw uses), FINs, and its queue pair records it.

/// Runs one FPDU-mode case: handshake (CRC if `crc`), `bytes`, then the daemon's answer must be exactly one
/// Terminate with `cause` and a FIN, and B's queue pair must be in Error with the same cause.
async fn terminated_by(
    p: &Passive,
    crc: bool,
    bytes: impl FnOnce(&Accepted) -> Vec<u8>,
    cause: (u8, u8, u8),
) {
    let (mut s, local, b) = p.handshake(crc, LIMITS).await;
    s.write_all(&bytes(&b)).await.unwrap();
    let (got, close) = observe(&mut s).await;
    assert_eq!(decode(&got, close, crc), Wire::terminate(cause), "on the wire");
    assert_eq!(
        recorded(terminated(&b.qp).await),
        (cause, false),
        "what B recorded"
    );
    drop((s, b));
    p.assert_recovers(local).await;
}

/// 12. CRC negotiated (C=1 in the Request), then an RDMA Write whose CRC is wrong: LLP/MPA CRC error
/// (RFC 5044 §8, code 0x02), in an FPDU whose own CRC is right; nothing is placed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_crc_terminates_with_mpa_crc_error() {
    let p = passive("hcrc", PATIENT).await;
    let (mut s, local, b) = p.handshake(true, LIMITS).await;
    let mut w = write_fpdu(b.mr.stag().0, 0, b"poison", true);
    let n = w.len();
    w[n - 1] ^= 0x5A;
    assert!(verify_crc(&w).is_err());
    s.write_all(&w).await.unwrap();
    let (got, close) = observe(&mut s).await;
    let cause = (layer::LLP, llp_type::MPA, llp_code::CRC_ERROR);
    assert_eq!(decode(&got, close, true), Wire::terminate(cause));
    assert_eq!(recorded(terminated(&b.qp).await), (cause, false));
    assert_eq!(b.mr.to_vec(0, 6).unwrap(), [0; 6], "nothing placed");
    drop((s, b));
    p.assert_recovers(local).await;
    drop(p.net);
}

/// 13. A ULPDU_Length beyond the daemon's limit (here `--max-ulpdu 1024`; the default is 65535, the most
/// the 16-bit field can say): LLP/MPA "FPDU start" error (RFC 5044 §8, code 0x03), decided from the 2-byte
/// length alone — the body is never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ulpdu_longer_than_the_limit_terminates_from_the_length() {
    let p = passive("hlong", &["--mpa-timeout-ms", "60000", "--max-ulpdu", "1024"]).await;
    terminated_by(
        &p,
        false,
        |_| 1025u16.to_be_bytes().to_vec(),
        (layer::LLP, llp_type::MPA, llp_code::FPDU_START),
    )
    .await;
    drop(p.net);
}

/// 13b. A ULPDU_Length shorter than the smallest DDP header (13 < 14): the same FPDU start error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ulpdu_shorter_than_a_ddp_header_terminates() {
    let p = passive("hshrt", PATIENT).await;
    terminated_by(
        &p,
        false,
        |_| vec![0x00, 13, 0xC1, 0x40],
        (layer::LLP, llp_type::MPA, llp_code::FPDU_START),
    )
    .await;
    drop(p.net);
}

/// 14. RDMAP opcode 8 (RFC 5040 §4.2: 8-15 reserved): RDMAP remote operation, unexpected opcode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_rdmap_opcode_terminates() {
    let p = passive("hop", PATIENT).await;
    terminated_by(
        &p,
        false,
        |_| {
            let mut f = fpdu(
                &MessageRepr {
                    opcode: RdmapOpcode::Send,
                    last: true,
                    placement: Placement::Untagged {
                        queue: QN_SEND,
                        msn: 1,
                        offset: 0,
                        ulp_field: 0,
                    },
                    payload: b"opcode 8",
                },
                false,
            );
            // Byte 1 of the ULPDU (after the 2-byte length) is the RDMAP control: RV 01, opcode.
            f[3] = (f[3] & 0xF0) | 8;
            f
        },
        (
            layer::RDMAP,
            rdmap_type::REMOTE_OPERATION,
            rdmap_code::UNEXPECTED_OPCODE,
        ),
    )
    .await;
    drop(p.net);
}

/// 15. An RDMA Write to an STag the daemon never issued: DDP tagged buffer, invalid STag (RFC 5041 §7.2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_to_an_unknown_stag_terminates() {
    let p = passive("hstag", PATIENT).await;
    terminated_by(
        &p,
        false,
        |b| write_fpdu(b.mr.stag().0 ^ 0x00A5_5A00, 0, b"nowhere", false),
        (layer::DDP, ddp_type::TAGGED_BUFFER, ddp_code::TAGGED_INVALID_STAG),
    )
    .await;
    drop(p.net);
}

/// 15b. Issue 40: a raw peer that Writes with forged STags in a loop (a bounded count), each attempt on a
/// fresh connection whose queue pair B made in a protection domain of its own: random STags, and the exact
/// STag of a victim's region in B's default domain (which a peer may learn). Every attempt ends in a
/// Terminate (DDP tagged: invalid STag for a random one, "STag not associated" for the victim's, as siw's
/// `siw_check_mem` E_PD_MISMATCH); the victim's connection keeps its queue pair and its bytes, and still
/// takes a Write of its own; the daemon serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_stag_writes_in_a_loop_leave_other_connections_alone() {
    let p = passive("hforge", PATIENT).await;
    let (mut victim_stream, _, victim) = p.handshake(false, LIMITS).await;
    victim.mr.write_at(0, b"victim's bytes").unwrap();
    let target = victim.mr.stag().0;
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..24u32 {
        let pd = p.b.protection_domain();
        let (mut s, _, b) = p.handshake_in(pd, false, LIMITS).await;
        let (stag, code) = if i % 2 == 0 {
            (target, ddp_code::TAGGED_STAG_NOT_ASSOCIATED)
        } else {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let mut forged = (seed >> 32) as u32;
            if forged == target || forged == b.mr.stag().0 {
                forged ^= 0x0100;
            }
            (forged, ddp_code::TAGGED_INVALID_STAG)
        };
        s.write_all(&write_fpdu(stag, 0, b"forged!", false))
            .await
            .unwrap();
        let (got, close) = observe(&mut s).await;
        let cause = (layer::DDP, ddp_type::TAGGED_BUFFER, code);
        assert_eq!(
            decode(&got, close, false),
            Wire::terminate(cause),
            "attempt {i}, STag {stag:#x}"
        );
        assert_eq!(recorded(terminated(&b.qp).await), (cause, false), "attempt {i}");
    }
    assert_eq!(
        victim.mr.to_vec(0, 14).unwrap(),
        b"victim's bytes",
        "the victim's bytes"
    );
    let state = victim.qp.query().await.unwrap();
    assert!(state.terminate.is_none(), "the victim's queue pair: {state:?}");
    victim_stream
        .write_all(&write_fpdu(target, 0, b"its own write", false))
        .await
        .unwrap();
    let mr = &victim.mr;
    eventually("the victim's own Write placed", || async move {
        (mr.to_vec(0, 13).unwrap() == b"its own write").then_some(())
    })
    .await;
    drop((victim_stream, victim));
    drop(p.net);
}

/// 16. Three RDMA Read Requests at once to a side that accepted with IRD 2: RDMAP remote operation,
/// catastrophic to the stream (what siw sends on "IRQ exceeded"). Read Responses for the first two may go
/// out before the Terminate; nothing may follow it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_requests_beyond_ird_terminate() {
    let p = passive("hird", PATIENT).await;
    let ird2 = ReadLimits {
        inbound: 2,
        outbound: 2,
    };
    let (mut s, local, b) = p.handshake(false, ird2).await;
    let mut bytes = Vec::new();
    for msn in 1..=3 {
        bytes.extend(read_request_fpdu(
            msn,
            ReadRequestRepr {
                sink_stag: 0x1234,
                sink_offset: 0,
                read_size: 16,
                source_stag: b.mr.stag().0,
                source_offset: 0,
            },
        ));
    }
    s.write_all(&bytes).await.unwrap();
    let (got, close) = observe(&mut s).await;
    let wire = decode(&got, close, false);
    let cause = (
        layer::RDMAP,
        rdmap_type::REMOTE_OPERATION,
        rdmap_code::CATASTROPHIC_STREAM,
    );
    let (last, before) = wire.messages.split_last().expect("a Terminate");
    assert_eq!(
        (wire.reply.clone(), *last, wire.close),
        (None, Msg::Terminate(cause.0, cause.1, cause.2), Close::Fin),
        "{wire:?}"
    );
    assert!(
        before.len() <= 2
            && before
                .iter()
                .all(|m| *m == Msg::Other(RdmapOpcode::RdmaReadResponse)),
        "at most the two allowed Read Responses before the Terminate: {wire:?}"
    );
    assert_eq!(recorded(terminated(&b.qp).await), (cause, false));
    drop((s, b));
    p.assert_recovers(local).await;
    drop(p.net);
}

/// 17. The peer sends a Terminate: the daemon sends nothing back (no Terminate answers a Terminate, RFC 5040
/// §5.3), FINs, and B's queue pair records the peer's cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminate_from_the_peer_closes_quietly() {
    let p = passive("hterm", PATIENT).await;
    let (mut s, local, b) = p.handshake(false, LIMITS).await;
    let cause = (
        layer::RDMAP,
        rdmap_type::REMOTE_PROTECTION,
        rdmap_code::ACCESS_RIGHTS,
    );
    s.write_all(&terminate_fpdu(
        TerminateCause::new(cause.0, cause.1, cause.2),
        false,
    ))
    .await
    .unwrap();
    let (got, close) = observe(&mut s).await;
    assert_eq!(
        decode(&got, close, false),
        Wire {
            reply: None,
            messages: vec![],
            close: Close::Fin,
        }
    );
    assert_eq!(recorded(terminated(&b.qp).await), (cause, true));
    drop((s, b));
    p.assert_recovers(local).await;
    drop(p.net);
}

// ---------------------------------------------------------------------------------------------------------
// The active side: soft-rdmad in A connects (client library) to a raw listener in B that answers the Request
// with a malformed Reply.

struct Active {
    net: TestNet,
    _da: Daemon,
    _db: Daemon,
    a: Adapter,
    b: Adapter,
    raw: TcpListener,
    raw_addr: SocketAddr,
}

async fn active(tag: &str) -> Active {
    let Daemons { a, b, da, db, net } = Daemons::start(tag, &[], &[]).await;
    let raw_addr = net.addr(Side::B, RAW_PORT);
    let std_listener = net
        .in_ns(Side::B, move || std::net::TcpListener::bind(raw_addr))
        .expect("raw listener in B");
    std_listener.set_nonblocking(true).unwrap();
    let raw = TcpListener::from_std(std_listener).unwrap();
    Active {
        net,
        _da: da,
        _db: db,
        a,
        b,
        raw,
        raw_addr,
    }
}

impl Active {
    /// A's application connects to the raw listener, which reads the Request and answers with `reply`.
    /// Returns A's Connect result, what A's daemon sent after the Request (FPDUs with a CRC if `crc`) and how
    /// it closed, and the connector (for GetPrivateData).
    async fn answer(&self, reply: &[u8], crc: bool) -> (Result<(), NdStatus>, Wire, Connector) {
        let ca = self.a.create_connector().await.unwrap();
        let (connected, wire) = within("connect against the raw listener", async {
            tokio::join!(ca.connect(self.raw_addr, LIMITS, b"active"), async {
                let (mut s, _) = self.raw.accept().await.unwrap();
                let req = read_mpa_frame(&mut s).await;
                let r = MpaRepr::parse(&req).unwrap();
                assert_eq!(
                    (r.kind, r.revision, r.private_data),
                    (MpaKind::Request, 2, &b"active"[..]),
                    "soft-rdmad's Request"
                );
                s.write_all(reply).await.unwrap();
                let (got, close) = observe(&mut s).await;
                decode(&got, close, crc)
            })
        })
        .await;
        (connected.map_err(|e| e.status), wire, ca)
    }

    /// A's daemon still works: a connection from A to B's daemon succeeds, and afterwards A holds no port.
    async fn assert_a_still_works(&self) {
        let listener = self.b.create_listener().await.unwrap();
        let bound = listener.listen(self.net.addr(Side::B, PORT), 0).await.unwrap();
        probe_connection((&self.a, &self.b), &listener, bound, "after the hostile listener").await;
        eventually("A's ports released", async || {
            let s = self.a.status().await.unwrap();
            (s.ports_in_use == 0 && s.connectors.is_empty()).then_some(())
        })
        .await;
    }
}

/// The Reply a responder would send to soft-rdmad's Request (Rev 2, S=1, IRD/ORD 4/4, no RTR).
fn good_reply(pd: &[u8]) -> Vec<u8> {
    mpa(
        MpaKind::Reply,
        2,
        false,
        Some(EnhancedControl {
            ird: 4,
            ord: 4,
            ..Default::default()
        }),
        pd,
    )
}

/// A malformed Reply: the Connect fails with `status`, A's daemon resets the connection without sending
/// anything more, and it keeps working.
async fn refused_reply(tag: &str, reply: &[u8], status: NdStatus) {
    let p = active(tag).await;
    let (connected, wire, ca) = p.answer(reply, false).await;
    assert_eq!(connected, Err(status), "A's Connect");
    assert_eq!(wire, Wire::RESET, "what A's daemon sent after its Request");
    drop(ca);
    p.assert_a_still_works().await;
    drop(p.net);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_reply_with_a_wrong_key_aborts_the_connect() {
    let reply = with_key(good_reply(b""), b"MPA ID Rep Frome");
    refused_reply("akey", &reply, NdStatus::ConnectionAborted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_reply_with_revision_three_aborts_the_connect() {
    let reply = with_revision(good_reply(b""), 3);
    refused_reply("arev", &reply, NdStatus::ConnectionAborted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_reply_with_private_data_length_513_aborts_the_connect() {
    let reply = with_pd_length(mpa(MpaKind::Reply, 2, false, None, b""), 513);
    refused_reply("a513", &reply, NdStatus::ConnectionAborted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_reply_with_a_truncated_ird_ord_word_aborts_the_connect() {
    let reply = with_flags(mpa(MpaKind::Reply, 2, false, None, &[0x00, 0x04]), FLAG_ENHANCED);
    refused_reply("aword", &reply, NdStatus::ConnectionAborted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_garbage_instead_of_a_reply_aborts_the_connect() {
    refused_reply(
        "agrb",
        b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
        NdStatus::ConnectionAborted,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_request_instead_of_a_reply_aborts_the_connect() {
    let reply = mpa(MpaKind::Request, 1, false, None, b"");
    refused_reply("areq", &reply, NdStatus::ConnectionAborted).await;
}

/// The R bit: the Connect is refused (CONNECTION_REFUSED) and the reject private data is readable
/// (IND2Connector::GetPrivateData); A's daemon closes its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_reply_with_the_reject_bit_refuses_the_connect() {
    let p = active("arej").await;
    let reply = with_flags(good_reply(b"go away"), FLAG_REJECT);
    let (connected, wire, ca) = p.answer(&reply, false).await;
    assert_eq!(connected, Err(NdStatus::ConnectionRefused));
    assert_eq!(&ca.private_data().await.unwrap()[..], b"go away");
    assert_eq!(wire, Wire::RESET, "what A's daemon sent after its Request");
    drop(ca);
    p.assert_a_still_works().await;
    drop(p.net);
}

/// A Reply whose ORD exceeds A's IRD (RFC 6581 §9), with C=1: A sends a Terminate (LLP/MPA, insufficient
/// IRD 0x06) in FPDU mode — so with a valid CRC, since the Reply asked for one (RFC 5044 §7.1) — then a FIN
/// (not a reset, which could discard the Terminate), and the Connect fails with CONNECTION_ABORTED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_reply_with_ord_above_our_ird_is_terminated() {
    let p = active("aord").await;
    let reply = mpa(
        MpaKind::Reply,
        2,
        true,
        Some(EnhancedControl {
            ird: 4,
            ord: LIMITS.inbound as u16 + 1,
            ..Default::default()
        }),
        b"",
    );
    let (connected, wire, ca) = p.answer(&reply, true).await;
    assert_eq!(connected, Err(NdStatus::ConnectionAborted));
    assert_eq!(
        wire,
        Wire::terminate((layer::LLP, llp_type::MPA, llp_code::INSUFFICIENT_IRD)),
        "what A's daemon sent after its Request"
    );
    drop(ca);
    p.assert_a_still_works().await;
    drop(p.net);
}
