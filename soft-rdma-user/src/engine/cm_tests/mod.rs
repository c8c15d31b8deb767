//! Two RNICs (endpoint and data path) against each other over an in-memory transport: every connector rule, with the
//! exact ND status (docs/connector-semantics.md). Deterministic: time and byte fragmentation are chosen by the test.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use proptest::prelude::*;

use super::cm::CmConfig;
use super::port_space::tests::FakeHost;
use super::requests::*;
use super::rnic::Rnic;
use super::transport_seam::*;
use super::verbs::{QueuePairId, QueuePairStatus};
use crate::error::{NdStatus, Result};
use soft_rdma_common::wire::TerminateCause;
use soft_rdma_common::wire::terminate::{layer, rdmap_code, rdmap_type};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Side {
    A,
    B,
}

impl Side {
    fn other(self) -> Side {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }
    fn ip(self) -> &'static str {
        match self {
            Side::A => "10.0.0.1",
            Side::B => "10.0.0.2",
        }
    }
}

/// An address nothing answers: connects to it time out.
const BLACKHOLE: &str = "10.0.0.99";

struct Net {
    a: Rnic,
    b: Rnic,
    now: Instant,
    listening: HashMap<(Side, SocketAddr), ListenerId>,
    peers: HashMap<(Side, ConnId), (Side, ConnId)>,
    next_conn: u64,
    next_req: u64,
    deliveries: VecDeque<(Side, TransportEvent)>,
    events: HashMap<Side, Vec<(SessionId, CmEvent)>>,
    /// Split every Send into pieces at these offsets (modulo its length).
    cuts: Vec<usize>,
    /// Side B closes any connection whose first bytes are an MPA Rev 2 Request (an RFC 5044-only responder).
    b_closes_on_enhanced: bool,
}

const S1: SessionId = SessionId(1);
const S2: SessionId = SessionId(2);

fn host(side: Side) -> Box<FakeHost> {
    Box::new(FakeHost {
        local_ips: vec![side.ip().parse().unwrap()],
        ..Default::default()
    })
}

impl Net {
    fn new() -> Net {
        Net::with(
            CmConfig::default_siw_compatible(),
            CmConfig::default_siw_compatible(),
        )
    }

    /// Two CMs; the active side's first-FPDU hold is off unless a test asks for it
    /// ([`Net::with_first_fpdu_hold`]), so the handshake rules are checked without advancing time.
    fn with(mut a: CmConfig, mut b: CmConfig) -> Net {
        a.first_fpdu_hold = Duration::ZERO;
        b.first_fpdu_hold = Duration::ZERO;
        Net::with_first_fpdu_hold(a, b)
    }

    fn with_first_fpdu_hold(a: CmConfig, b: CmConfig) -> Net {
        Net {
            a: Rnic::new(a, host(Side::A), 0xA),
            b: Rnic::new(b, host(Side::B), 0xB),
            now: Instant::now(),
            listening: HashMap::new(),
            peers: HashMap::new(),
            next_conn: 1_000_000,
            next_req: 1,
            deliveries: VecDeque::new(),
            events: HashMap::new(),
            cuts: Vec::new(),
            b_closes_on_enhanced: false,
        }
    }

    fn cm(&mut self, side: Side) -> &mut Rnic {
        match side {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        }
    }

    fn addr(side: Side, port: u16) -> SocketAddr {
        format!("{}:{port}", side.ip()).parse().unwrap()
    }

    /// Issues a request and runs the network until it is quiet; returns (request id, synchronous answer).
    fn req(&mut self, side: Side, session: SessionId, r: CmRequest) -> (RequestId, Result<CmResponse>) {
        let id = RequestId(self.next_req);
        self.next_req += 1;
        let now = self.now;
        let answer = self.cm(side).handle_request(now, session, id, r);
        self.pump();
        (id, answer)
    }

    fn ok(&mut self, side: Side, session: SessionId, r: CmRequest) -> CmResponse {
        let (_, a) = self.req(side, session, r.clone());
        a.unwrap_or_else(|e| panic!("{r:?} failed: {e}"))
    }

    /// [`Net::req`] for A's session S1.
    fn req_a(&mut self, r: CmRequest) -> (RequestId, Result<CmResponse>) {
        self.req(Side::A, S1, r)
    }

    /// [`Net::req`] for B's session S1.
    fn req_b(&mut self, r: CmRequest) -> (RequestId, Result<CmResponse>) {
        self.req(Side::B, S1, r)
    }

    /// [`Net::ok`] for A's session S1.
    fn ok_a(&mut self, r: CmRequest) -> CmResponse {
        self.ok(Side::A, S1, r)
    }

    /// [`Net::ok`] for B's session S1.
    fn ok_b(&mut self, r: CmRequest) -> CmResponse {
        self.ok(Side::B, S1, r)
    }

    fn status_of(&mut self, side: Side, session: SessionId, r: CmRequest) -> NdStatus {
        match self.req(side, session, r.clone()).1 {
            Ok(v) => panic!("{r:?} succeeded with {v:?}"),
            Err(e) => e.status,
        }
    }

    /// B's Accept of `cb` ([`accept_b`], no private data), as [`Net::req`] answers it.
    fn accept_b(&mut self, cb: ConnectorId) -> (RequestId, Result<CmResponse>) {
        self.req(Side::B, S1, accept_b(cb, Bytes::new()))
    }

    /// The status B's Accept of `cb` (no private data) fails with.
    fn accept_b_status(&mut self, cb: ConnectorId) -> NdStatus {
        self.status_of(Side::B, S1, accept_b(cb, Bytes::new()))
    }

    fn connector(&mut self, side: Side, session: SessionId) -> ConnectorId {
        match self.ok(side, session, CmRequest::CreateConnector) {
            CmResponse::Connector(c) => c,
            other => panic!("{other:?}"),
        }
    }

    fn listen(&mut self, side: Side, port: u16, backlog: u32) -> ListenerId {
        let CmResponse::Listener(l) = self.ok(side, S1, CmRequest::CreateListener) else {
            panic!()
        };
        self.ok(
            side,
            S1,
            CmRequest::Listen {
                listener: l,
                local: Net::addr(side, port),
                backlog,
            },
        );
        l
    }

    /// The completion of `request` on `side`, if it came.
    fn completion(&self, side: Side, request: RequestId) -> Option<Result<CmResponse>> {
        self.events
            .get(&side)?
            .iter()
            .find_map(|(_, e)| match e {
                CmEvent::Completed { request: r, result } => (*r == request).then(|| result.clone()),
                CmEvent::SrqLimitReached { .. } | CmEvent::QueuePairEvent { .. } => None,
            })
    }

    /// `request` on `side` has completed, with `status`; `why` goes into the failure message.
    #[track_caller]
    fn assert_completed(&self, side: Side, request: RequestId, status: NdStatus, why: &str) {
        assert_eq!(self.completed_status(side, request), Some(status), "{why}");
    }

    fn completed_status(&self, side: Side, request: RequestId) -> Option<NdStatus> {
        self.completion(side, request)
            .map(|r| r.map_or_else(|e| e.status, |_| NdStatus::Success))
    }

    fn pump(&mut self) {
        loop {
            let mut progressed = false;
            for side in [Side::A, Side::B] {
                while let Some(cmd) = self.cm(side).poll_transport() {
                    progressed = true;
                    self.execute(side, cmd);
                }
                while let Some(ev) = self.cm(side).poll_event() {
                    progressed = true;
                    self.events.entry(side).or_default().push(ev);
                }
            }
            if let Some((side, ev)) = self.deliveries.pop_front() {
                progressed = true;
                let now = self.now;
                self.cm(side).handle_transport(now, ev);
            }
            if !progressed {
                return;
            }
        }
    }

    fn execute(&mut self, side: Side, cmd: TransportCommand) {
        match cmd {
            TransportCommand::HandOff { conn } => {
                self.deliveries
                    .push_back((side, TransportEvent::HandedOff { conn }));
            }
            TransportCommand::Listen { listener, local } => {
                self.listening.insert((side, local), listener);
            }
            TransportCommand::StopListening { listener } => self.listening.retain(|_, l| *l != listener),
            TransportCommand::Connect { conn, local, remote } => {
                if remote.ip().to_string() == BLACKHOLE {
                    self.deliveries.push_back((
                        side,
                        TransportEvent::ConnectFailed {
                            conn,
                            reason: ConnectFailure::TimedOut,
                        },
                    ));
                    return;
                }
                let other = side.other();
                let Some(&listener) = self.listening.get(&(other, remote)) else {
                    self.deliveries.push_back((
                        side,
                        TransportEvent::ConnectFailed {
                            conn,
                            reason: ConnectFailure::Refused,
                        },
                    ));
                    return;
                };
                let local = if local.ip().is_unspecified() {
                    Net::addr(side, local.port())
                } else {
                    local
                };
                let peer_conn = ConnId(self.next_conn);
                self.next_conn += 1;
                self.peers.insert((side, conn), (other, peer_conn));
                self.peers.insert((other, peer_conn), (side, conn));
                self.deliveries.push_back((
                    other,
                    TransportEvent::Accepted {
                        listener,
                        conn: peer_conn,
                        local: remote,
                        remote: local,
                        mss: 1448,
                    },
                ));
                self.deliveries.push_back((
                    side,
                    TransportEvent::Connected {
                        conn,
                        local,
                        mss: 1448,
                    },
                ));
            }
            TransportCommand::Send { conn, data } => {
                let Some(&(other, peer)) = self.peers.get(&(side, conn)) else {
                    return;
                };
                if other == Side::B
                    && self.b_closes_on_enhanced
                    && data.len() >= 20
                    && &data[..3] == b"MPA"
                    && data[16] & 0x10 != 0
                {
                    self.close_pair(side, conn);
                    return;
                }
                let mut at = 0;
                for c in self.cuts.iter().map(|c| c % (data.len() + 1)).chain([data.len()]) {
                    if c > at {
                        self.deliveries.push_back((
                            other,
                            TransportEvent::Received {
                                conn: peer,
                                data: data.slice(at..c),
                            },
                        ));
                        at = c;
                    }
                }
                self.deliveries.push_back((
                    side,
                    TransportEvent::Written {
                        conn,
                        bytes: data.len(),
                    },
                ));
            }
            TransportCommand::Close { conn, .. } => self.close_pair(side, conn),
        }
    }

    fn close_pair(&mut self, side: Side, conn: ConnId) {
        self.deliveries.push_back((side, TransportEvent::Closed { conn }));
        if let Some((other, peer)) = self.peers.remove(&(side, conn)) {
            self.peers.remove(&(other, peer));
            self.deliveries
                .push_back((other, TransportEvent::Closed { conn: peer }));
        }
    }
}

const LIMITS_A: ReadLimits = ReadLimits::new(4, 8);
const LIMITS_B: ReadLimits = ReadLimits::new(16, 2);

/// What an initiator without a CM of ours sends first: an MPA Rev 1 Request with private data "hi"
/// (RFC 5044 §7.1.1).
const RAW_REQUEST: &[u8] = b"MPA ID Req Frame\x00\x01\x00\x02hi";

/// The transport hands B's listener `listener` the connection `conn` from a raw initiator at A:`a_port`
/// to B:7000.
fn raw_accepted(listener: ListenerId, conn: ConnId, a_port: u16) -> TransportEvent {
    TransportEvent::Accepted {
        listener,
        conn,
        local: Net::addr(Side::B, 7000),
        remote: Net::addr(Side::A, a_port),
        mss: 1448,
    }
}

/// The transport hands over bytes that arrived on `conn`.
fn received(conn: ConnId, data: impl Into<Bytes>) -> TransportEvent {
    TransportEvent::Received {
        conn,
        data: data.into(),
    }
}

/// B's GetConnectionRequest on `listener`, handing the offer to `connector`.
fn get_connection_request(listener: ListenerId, connector: ConnectorId) -> CmRequest {
    CmRequest::GetConnectionRequest { listener, connector }
}

/// B's Accept of `connector` with [`LIMITS_B`], `private_data`, and no queue pair.
fn accept_b(connector: ConnectorId, private_data: Bytes) -> CmRequest {
    accept_b_with(connector, private_data, None)
}

/// [`accept_b`] carrying `queue_pair`.
fn accept_b_with(connector: ConnectorId, private_data: Bytes, queue_pair: Option<QueuePairId>) -> CmRequest {
    CmRequest::Accept {
        connector,
        limits: LIMITS_B,
        private_data,
        queue_pair,
    }
}

/// A's Connect of `connector` to `remote` with [`LIMITS_A`], `private_data`, its own endpoint, and no queue
/// pair.
fn connect_a(connector: ConnectorId, remote: SocketAddr, private_data: Bytes) -> CmRequest {
    connect_a_with(connector, remote, private_data, None)
}

/// [`connect_a`] carrying `queue_pair`.
fn connect_a_with(
    connector: ConnectorId,
    remote: SocketAddr,
    private_data: Bytes,
    queue_pair: Option<QueuePairId>,
) -> CmRequest {
    CmRequest::Connect {
        connector,
        remote,
        limits: LIMITS_A,
        private_data,
        shared_endpoint: None,
        queue_pair,
    }
}

/// Two default CMs, B listening on port 7000 with backlog 0. Returns the net and B's listener.
fn listening_at_7000() -> (Net, ListenerId) {
    let mut net = Net::new();
    let l = net.listen(Side::B, 7000, 0);
    (net, l)
}

/// A connects to B:7000 with private data; B takes the offer. Returns (A's connector, B's connector, A's
/// pending Connect, the listener).
fn offer(net: &mut Net, pd: &[u8]) -> (ConnectorId, ConnectorId, RequestId, ListenerId) {
    let l = net.listen(Side::B, 7000, 0);
    let ca = net.connector(Side::A, S1);
    let cb = net.connector(Side::B, S1);
    let (connect, r) = net.req_a(connect_a(
        ca,
        Net::addr(Side::B, 7000),
        Bytes::copy_from_slice(pd),
    ));
    assert_eq!(r.unwrap(), CmResponse::Pending);
    match net.ok_b(get_connection_request(l, cb)) {
        CmResponse::ConnectionRequest {
            connector,
            peer,
            private_data,
            ..
        } => {
            assert_eq!(connector, cb);
            assert_eq!(peer.ip().to_string(), Side::A.ip());
            assert_eq!(&private_data[..], pd);
        }
        other => panic!("{other:?}"),
    }
    (ca, cb, connect, l)
}

fn connected_pair(net: &mut Net) -> (ConnectorId, ConnectorId) {
    let (ca, cb, connect, _) = offer(net, b"hi");
    let (accept, r) = net.req_b(accept_b(cb, Bytes::from_static(b"yo")));
    assert_eq!(r.unwrap(), CmResponse::Pending, "P2P: Accept waits for the RTR");
    net.assert_completed(Side::A, connect, NdStatus::Success, "");
    assert_eq!(
        net.completion(Side::B, accept),
        None,
        "no Accept before CompleteConnect"
    );
    net.ok_a(CmRequest::CompleteConnect { connector: ca });
    net.assert_completed(Side::B, accept, NdStatus::Success, "the RTR completes the Accept");
    (ca, cb)
}

mod connector_rules;
mod streams;
