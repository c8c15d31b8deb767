//! Two ConnectionManagers against each other over an in-memory transport: every connector rule, with the
//! exact ND status (docs/connector-semantics.md). Deterministic: time and byte fragmentation are chosen by the test.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use proptest::prelude::*;

use super::cm::{CmConfig, ConnectionManager};
use super::port_space::tests::FakeHost;
use super::requests::*;
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
    a: ConnectionManager,
    b: ConnectionManager,
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
            a: ConnectionManager::new(a, host(Side::A), 0xA),
            b: ConnectionManager::new(b, host(Side::B), 0xB),
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

    fn cm(&mut self, side: Side) -> &mut ConnectionManager {
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
            .find_map(|(_, CmEvent::Completed { request: r, result })| {
                (*r == request).then(|| result.clone())
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

#[test]
fn connect_accept_complete_with_limits_private_data_and_addresses() {
    let mut net = Net::new();
    let pd: Vec<u8> = (0..32).collect();
    let (ca, cb, connect, _) = offer(&mut net, &pd);
    // B sees A's offer in its own view: A serves 4 (B may issue 4) and issues 8 (B serves 8).
    assert_eq!(
        net.ok_b(CmRequest::GetReadLimits { connector: cb }),
        CmResponse::ReadLimits(ReadLimits::new(8, 4))
    );
    let (accept, _) = net.req_b(accept_b(cb, Bytes::from_static(b"accepted")));
    net.assert_completed(Side::A, connect, NdStatus::Success, "");
    // A sees B's answer, which Accept limited to A's offer (seed 004): B serves min(16, A's ORD 8) = 8 → A
    // may issue 8; B issues min(2, A's IRD 4) = 2 → A serves 2.
    assert_eq!(
        net.ok_a(CmRequest::GetReadLimits { connector: ca }),
        CmResponse::ReadLimits(ReadLimits::new(2, 8))
    );
    assert_eq!(
        net.ok_a(CmRequest::GetPrivateData {
            connector: ca,
            buffer_len: 64
        }),
        CmResponse::PrivateData {
            data: Bytes::from_static(b"accepted"),
            required: 8
        }
    );
    net.ok_a(CmRequest::CompleteConnect { connector: ca });
    net.assert_completed(Side::B, accept, NdStatus::Success, "");
    let CmResponse::Address(a_local) = net.ok_a(CmRequest::GetLocalAddress { connector: ca }) else {
        panic!()
    };
    assert!(
        (49152..=65535).contains(&a_local.port()),
        "implicit bind from the ephemeral range"
    );
    assert_eq!(
        net.ok_b(CmRequest::GetPeerAddress { connector: cb }),
        CmResponse::Address(a_local)
    );
    assert_eq!(
        net.ok_a(CmRequest::GetPeerAddress { connector: ca }),
        CmResponse::Address(Net::addr(Side::B, 7000))
    );
    let st = net.a.status();
    assert_eq!(st.connectors[0].state, ConnectorState::Connected);
    assert_eq!(
        (
            st.connectors[0].inbound_read_limit,
            st.connectors[0].outbound_read_limit
        ),
        (Some(2), Some(8))
    );
    assert_eq!(st.connectors[0].mpa_revision, Some(2));
}

/// IND2Connector::Accept (seed 004): Accept's limits are silently limited to the connecting peer's offer, so
/// the connecting side's GetReadLimits never reports more than it offered: both directions (the listener
/// asking for more to serve, and for more to issue), both MPA revisions. Rev 1 carries no limits: each side
/// keeps its own (capped) values.
#[test]
fn accept_limits_never_exceed_the_connecting_peers_offer() {
    let more_served = ReadLimits::new(16, 2);
    let more_issued = ReadLimits::new(2, 16);
    for revision in [1u8, 2] {
        for (listener, a_sees, b_effective) in [
            // A offers IRD 4 / ORD 8.
            (more_served, (2, 8), (8, 2)),
            (more_issued, (4, 2), (2, 4)),
        ] {
            let mut cfg = CmConfig::default_siw_compatible();
            cfg.mpa.revision = revision;
            let mut net = Net::with(cfg.clone(), cfg);
            let (ca, cb, connect, _) = offer(&mut net, b"limits");
            net.req_b(CmRequest::Accept {
                connector: cb,
                limits: listener,
                private_data: Bytes::new(),
                queue_pair: None,
            })
            .1
            .unwrap();
            net.assert_completed(Side::A, connect, NdStatus::Success, "");
            let CmResponse::ReadLimits(seen) = net.ok_a(CmRequest::GetReadLimits { connector: ca }) else {
                panic!()
            };
            let (a_sees, b_effective) = if revision == 1 {
                // Nothing negotiated: A reports its own offer; B keeps its own values.
                (
                    (LIMITS_A.inbound, LIMITS_A.outbound),
                    (listener.inbound, listener.outbound),
                )
            } else {
                (a_sees, b_effective)
            };
            assert_eq!(
                (seen.inbound, seen.outbound),
                a_sees,
                "rev {revision}, listener {listener:?}: A's GetReadLimits"
            );
            assert!(seen.outbound <= LIMITS_A.outbound && seen.inbound <= LIMITS_A.inbound);
            net.ok_a(CmRequest::CompleteConnect { connector: ca });
            let st = net.b.status();
            let b = st.connectors.iter().find(|c| c.id == cb.0).unwrap();
            assert_eq!(
                (b.inbound_read_limit, b.outbound_read_limit),
                (Some(b_effective.0), Some(b_effective.1)),
                "rev {revision}, listener {listener:?}: B's effective limits"
            );
            assert_eq!(b.mpa_revision, Some(revision));
        }
    }
}

#[test]
fn adapter_caps_limits_silently() {
    let (mut net, l) = listening_at_7000();
    let ca = net.connector(Side::A, S1);
    let cb = net.connector(Side::B, S1);
    net.req_a(CmRequest::Connect {
        connector: ca,
        remote: Net::addr(Side::B, 7000),
        limits: ReadLimits::new(1000, 0x3FFF),
        private_data: Bytes::new(),
        shared_endpoint: None,
        queue_pair: None,
    })
    .1
    .unwrap();
    net.ok_b(get_connection_request(l, cb));
    assert_eq!(
        net.ok_b(CmRequest::GetReadLimits { connector: cb }),
        CmResponse::ReadLimits(ReadLimits::new(128, 128))
    );
    net.req_b(CmRequest::Accept {
        connector: cb,
        limits: ReadLimits::new(500, 500),
        private_data: Bytes::new(),
        queue_pair: None,
    })
    .1
    .unwrap();
    assert_eq!(
        net.ok_a(CmRequest::GetReadLimits { connector: ca }),
        CmResponse::ReadLimits(ReadLimits::new(128, 128))
    );
}

#[test]
fn reject_with_private_data_refuses_the_connect() {
    let mut net = Net::new();
    let (ca, cb, connect, _) = offer(&mut net, b"may I?");
    net.ok_b(CmRequest::Reject {
        connector: cb,
        private_data: Bytes::from_static(b"no: busy"),
    });
    net.assert_completed(Side::A, connect, NdStatus::ConnectionRefused, "");
    assert_eq!(
        net.ok_a(CmRequest::GetPrivateData {
            connector: ca,
            buffer_len: 100
        }),
        CmResponse::PrivateData {
            data: Bytes::from_static(b"no: busy"),
            required: 8
        }
    );
    assert_eq!(net.a.status().ports_in_use, 0, "the implicit port is freed");
}

#[test]
fn transport_failures_map_to_nd_statuses() {
    let mut net = Net::new();
    let ca = net.connector(Side::A, S1);
    let (r, _) = net.req_a(connect_a(ca, Net::addr(Side::B, 7999), Bytes::new()));
    net.assert_completed(Side::A, r, NdStatus::ConnectionRefused, "");
    let ca = net.connector(Side::A, S1);
    let (r, _) = net.req_a(connect_a(
        ca,
        format!("{BLACKHOLE}:7000").parse().unwrap(),
        Bytes::new(),
    ));
    net.assert_completed(Side::A, r, NdStatus::IoTimeout, "");
    assert_eq!(net.a.status().ports_in_use, 0);
}

#[test]
fn backlog_full_refuses_new_offers() {
    let mut net = Net::new();
    net.listen(Side::B, 7000, 1);
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let ca = net.connector(Side::A, S1);
        let (r, _) = net.req_a(connect_a(ca, Net::addr(Side::B, 7000), Bytes::new()));
        statuses.push(net.completed_status(Side::A, r));
    }
    assert_eq!(
        statuses,
        vec![None, Some(NdStatus::ConnectionRefused)],
        "first queued, second refused"
    );
}

#[test]
fn cancelled_connect_aborts_the_passive_accept() {
    let mut net = Net::new();
    let (ca, cb, connect, _) = offer(&mut net, b"");
    net.ok_a(CmRequest::Cancel {
        object: ObjectRef::Connector(ca),
    });
    net.assert_completed(Side::A, connect, NdStatus::Canceled, "");
    assert_eq!(net.accept_b_status(cb), NdStatus::ConnectionAborted);
}

#[test]
fn active_reject_after_seeing_limits_aborts_the_accept() {
    let mut net = Net::new();
    let (ca, cb, _, _) = offer(&mut net, b"");
    let (accept, _) = net.accept_b(cb);
    net.ok_a(CmRequest::Reject {
        connector: ca,
        private_data: Bytes::new(),
    });
    net.assert_completed(Side::B, accept, NdStatus::ConnectionAborted, "");
}

#[test]
fn private_data_limits_and_buffer_overflow() {
    let mut net = Net::new();
    net.listen(Side::B, 7000, 0);
    let ca = net.connector(Side::A, S1);
    let connect = |pd: usize| connect_a(ca, Net::addr(Side::B, 7000), Bytes::from(vec![7; pd]));
    assert_eq!(
        net.status_of(Side::A, S1, connect(253)),
        NdStatus::InvalidBufferSize,
        "MaxCallerData + 1"
    );
    let (ca, cb, _, _) = {
        let mut n2 = Net::new();
        let r = offer(&mut n2, &[9; 252]);
        net = n2;
        r
    };
    assert_eq!(
        net.status_of(Side::B, S1, accept_b(cb, Bytes::from(vec![1; 253]))),
        NdStatus::InvalidBufferSize
    );
    net.req_b(accept_b(cb, Bytes::from(vec![1; 252]))).1.unwrap();
    // GetPrivateData: A's with a short buffer gets truncated data and the size required (BUFFER_OVERFLOW on
    // the UDS); B's buffer holds all of A's.
    for (side, connector, buffer_len, data) in
        [(Side::A, ca, 4, vec![1; 4]), (Side::B, cb, 300, vec![9; 252])]
    {
        assert_eq!(
            net.ok(
                side,
                S1,
                CmRequest::GetPrivateData {
                    connector,
                    buffer_len
                }
            ),
            CmResponse::PrivateData {
                data: Bytes::from(data),
                required: 252
            },
            "{side:?}"
        );
    }
}

#[test]
fn connection_invalid_and_active() {
    let mut net = Net::new();
    let c = net.connector(Side::A, S1);
    for r in [
        CmRequest::CompleteConnect { connector: c },
        CmRequest::GetPeerAddress { connector: c },
        CmRequest::GetLocalAddress { connector: c },
        CmRequest::Disconnect { connector: c },
        CmRequest::NotifyDisconnect { connector: c },
        CmRequest::GetReadLimits { connector: c },
    ] {
        assert_eq!(net.status_of(Side::A, S1, r), NdStatus::ConnectionInvalid);
    }
    let (ca, cb) = connected_pair(&mut net);
    assert_eq!(
        net.status_of(Side::A, S1, connect_a(ca, Net::addr(Side::B, 7000), Bytes::new())),
        NdStatus::ConnectionActive
    );
    assert_eq!(net.accept_b_status(cb), NdStatus::ConnectionActive);
    assert_eq!(
        net.status_of(Side::A, S1, CmRequest::CompleteConnect { connector: ca }),
        NdStatus::ConnectionInvalid
    );
}

#[test]
fn bind_sharing_violation_and_port_exhaustion() {
    // One session takes the whole ephemeral range: here its share is all of it.
    let mut whole_range = CmConfig::default_siw_compatible();
    whole_range.limits.max_ephemeral_ports_per_session = 16_384;
    whole_range.limits.max_ports_per_session = usize::MAX;
    let mut net = Net::with(whole_range, CmConfig::default_siw_compatible());
    let c1 = net.connector(Side::A, S1);
    let c2 = net.connector(Side::A, S1);
    net.ok_a(CmRequest::Bind {
        connector: c1,
        local: Net::addr(Side::A, 6000),
    });
    // c1's address again; an address that is not the host's.
    for (local, status) in [
        (Net::addr(Side::A, 6000), NdStatus::SharingViolation),
        ("10.9.9.9:6000".parse().unwrap(), NdStatus::InvalidAddress),
    ] {
        let bind = CmRequest::Bind { connector: c2, local };
        assert_eq!(net.status_of(Side::A, S1, bind), status, "{local}");
    }
    let mut last = None;
    for _ in 0..16_384 {
        let c = net.connector(Side::A, S1);
        last = Some(net.ok_a(CmRequest::Bind {
            connector: c,
            local: Net::addr(Side::A, 0),
        }));
    }
    assert!(matches!(last, Some(CmResponse::Bound(_))));
    let c = net.connector(Side::A, S1);
    assert_eq!(
        net.status_of(
            Side::A,
            S1,
            CmRequest::Bind {
                connector: c,
                local: Net::addr(Side::A, 0)
            }
        ),
        NdStatus::TooManyAddresses
    );
    net.ok_a(CmRequest::CloseConnector {
        connector: ConnectorId(5),
    });
    net.ok_a(CmRequest::Bind {
        connector: c,
        local: Net::addr(Side::A, 0),
    });
}

#[test]
fn shared_endpoint_fan_out_and_duplicate_tuple() {
    let mut net = Net::new();
    let ls: Vec<_> = (0..3).map(|i| net.listen(Side::B, 7100 + i, 0)).collect();
    let CmResponse::SharedEndpoint(ep) = net.ok_a(CmRequest::CreateSharedEndpoint {
        local: Net::addr(Side::A, 0),
    }) else {
        panic!()
    };
    let mut locals = Vec::new();
    for (i, l) in ls.iter().enumerate() {
        let ca = net.connector(Side::A, S1);
        let cb = net.connector(Side::B, S1);
        let (r, _) = net.req_a(CmRequest::Connect {
            connector: ca,
            remote: Net::addr(Side::B, 7100 + i as u16),
            limits: LIMITS_A,
            private_data: Bytes::new(),
            shared_endpoint: Some(ep),
            queue_pair: None,
        });
        net.ok_b(get_connection_request(*l, cb));
        net.accept_b(cb).1.unwrap();
        net.assert_completed(Side::A, r, NdStatus::Success, "");
        let CmResponse::Address(a) = net.ok_a(CmRequest::GetLocalAddress { connector: ca }) else {
            panic!()
        };
        locals.push(a);
    }
    assert!(
        locals.windows(2).all(|w| w[0] == w[1]),
        "one local addr:port for all: {locals:?}"
    );
    let dup = net.connector(Side::A, S1);
    assert_eq!(
        net.status_of(
            Side::A,
            S1,
            CmRequest::Connect {
                connector: dup,
                remote: Net::addr(Side::B, 7100),
                limits: LIMITS_A,
                private_data: Bytes::new(),
                shared_endpoint: Some(ep),
                queue_pair: None
            }
        ),
        NdStatus::AddressAlreadyExists
    );
}

/// No session can exhaust the daemon: past `max_objects_per_session` creating anything is
/// INSUFFICIENT_RESOURCES for that session only; closing one makes room again; a closed session's count is gone.
#[test]
fn per_session_object_limit() {
    let mut limited = CmConfig::default_siw_compatible();
    limited.limits.max_objects_per_session = 3;
    let mut net = Net::with(limited, CmConfig::default_siw_compatible());
    let c1 = net.connector(Side::A, S1);
    net.connector(Side::A, S1);
    net.ok_a(CmRequest::CreateCompletionQueue { depth: 16 });
    for r in [
        CmRequest::CreateConnector,
        CmRequest::CreateListener,
        CmRequest::CreateCompletionQueue { depth: 16 },
        CmRequest::CreateSharedEndpoint {
            local: Net::addr(Side::A, 0),
        },
    ] {
        assert_eq!(net.status_of(Side::A, S1, r), NdStatus::InsufficientResources);
    }
    // Another session is unaffected.
    net.connector(Side::A, S2);
    // A failed close does not count; a real one makes room.
    net.status_of(
        Side::A,
        S1,
        CmRequest::CloseConnector {
            connector: ConnectorId(999_999),
        },
    );
    assert_eq!(
        net.status_of(Side::A, S1, CmRequest::CreateListener),
        NdStatus::InsufficientResources
    );
    net.ok_a(CmRequest::CloseConnector { connector: c1 });
    net.ok_a(CmRequest::CreateListener);
    assert_eq!(
        net.status_of(Side::A, S1, CmRequest::CreateConnector),
        NdStatus::InsufficientResources
    );
    let now = net.now;
    net.a.close_session(now, S1);
    for _ in 0..3 {
        net.connector(Side::A, S1);
    }
}

#[test]
fn sessions_own_their_objects() {
    let mut net = Net::new();
    let c = net.connector(Side::A, S1);
    assert_eq!(
        net.status_of(
            Side::A,
            S2,
            CmRequest::Bind {
                connector: c,
                local: Net::addr(Side::A, 0)
            }
        ),
        NdStatus::InvalidParameter
    );
    assert_eq!(
        net.status_of(Side::A, S2, CmRequest::CloseConnector { connector: c }),
        NdStatus::InvalidParameter
    );
    assert_eq!(
        net.status_of(
            Side::A,
            S2,
            CmRequest::CloseConnector {
                connector: ConnectorId(4242)
            }
        ),
        NdStatus::InvalidParameter
    );
}

/// IND2Connector::NotifyDisconnect on a connector whose connection existed and has already ended completes
/// at once, as a disconnect that happened, on both sides (the peer that saw the FIN and the side that
/// disconnected); CONNECTION_INVALID stays for a connector that never connected, or whose connect was refused.
#[test]
fn notify_disconnect_after_the_end_completes_at_once() {
    let mut net = Net::new();
    let (ca, cb) = connected_pair(&mut net);
    net.ok_a(CmRequest::Disconnect { connector: ca });
    net.pump();
    for (side, c) in [(Side::B, cb), (Side::A, ca)] {
        let (notify, r) = net.req(side, S1, CmRequest::NotifyDisconnect { connector: c });
        assert_eq!(r.unwrap(), CmResponse::Done, "{side:?}: completes at once");
        assert_eq!(
            net.completion(side, notify),
            None,
            "{side:?}: nothing left pending"
        );
    }
    let never = net.connector(Side::A, S1);
    assert_eq!(
        net.status_of(Side::A, S1, CmRequest::NotifyDisconnect { connector: never }),
        NdStatus::ConnectionInvalid
    );
    let mut net = Net::new();
    let (ca, cb, connect, _) = offer(&mut net, b"no");
    net.ok_b(CmRequest::Reject {
        connector: cb,
        private_data: Bytes::new(),
    });
    net.assert_completed(Side::A, connect, NdStatus::ConnectionRefused, "");
    assert_eq!(
        net.status_of(Side::A, S1, CmRequest::NotifyDisconnect { connector: ca }),
        NdStatus::ConnectionInvalid,
        "a refused connect never connected"
    );
}

/// Both sides with the siw-compatible config and a first-FPDU hold of `hold`: A connects, B accepts, and A's
/// Connect has completed (the Reply arrived, the hold starts now). Returns (the net, A's connector, B's
/// connector, B's pending Accept).
fn accepted_under_first_fpdu_hold(hold: Duration) -> (Net, ConnectorId, ConnectorId, RequestId) {
    let mut cfg = CmConfig::default_siw_compatible();
    cfg.first_fpdu_hold = hold;
    let mut net = Net::with_first_fpdu_hold(cfg.clone(), cfg);
    let (ca, cb, connect, _) = offer(&mut net, b"hold");
    let (accept, _) = net.accept_b(cb);
    net.assert_completed(Side::A, connect, NdStatus::Success, "");
    (net, ca, cb, accept)
}

/// siw's responder race ([`super::first_fpdu`]): after the Reply, the active side sends nothing — not the
/// RTR, not the queue pair's first FPDU — until the hold ends; then both go, in order, and the passive side
/// is never held. The deadline is the CM's timer; a Terminate in between drops what was held.
#[test]
fn first_fpdu_is_held_after_the_reply_until_the_hold_ends() {
    let hold = Duration::from_millis(20);
    let (mut net, ca, _, accept) = accepted_under_first_fpdu_hold(hold);
    let reply_at = net.now;
    assert_eq!(net.a.poll_timeout(), Some(reply_at + hold), "the hold's deadline");
    net.ok_a(CmRequest::CompleteConnect { connector: ca });
    assert_eq!(
        net.completion(Side::B, accept),
        None,
        "the RTR is held: B's Accept still waits"
    );
    // Not yet: a moment before the deadline nothing moves.
    net.a.handle_timeout(reply_at + hold - Duration::from_millis(1));
    net.pump();
    assert_eq!(net.completion(Side::B, accept), None);
    net.a.handle_timeout(reply_at + hold);
    net.pump();
    net.assert_completed(
        Side::B,
        accept,
        NdStatus::Success,
        "the held RTR arrived and completed the Accept",
    );
    assert_eq!(
        net.a.poll_timeout(),
        Some(reply_at + hold + hold),
        "then only a FIN would wait, one more hold"
    );
    net.a.handle_timeout(reply_at + hold + hold);
    net.pump();
    assert_eq!(net.a.poll_timeout(), None, "no deadline left");
    assert_eq!(net.b.poll_timeout(), None, "the passive side never holds");
}

/// Without RTR, the first FPDUs the hold keeps are the queue pair's own: a Send posted during the hold goes
/// out (and is received) only when the hold ends — the queue pair, passed over while held, is woken then.
#[test]
fn a_send_posted_during_the_first_fpdu_hold_goes_when_it_ends() {
    use super::memory::VecMemory;
    use super::verbs::*;
    let hold = Duration::from_millis(20);
    let mut cfg = CmConfig::default_siw_compatible();
    cfg.first_fpdu_hold = hold;
    cfg.mpa.peer_to_peer = false;
    let mut net = Net::with_first_fpdu_hold(cfg.clone(), cfg);
    // A queue pair and a 16-byte region on each side.
    let mut end = |side: Side| {
        let CmResponse::CompletionQueue(cq) = net.ok(side, S1, CmRequest::CreateCompletionQueue { depth: 8 })
        else {
            panic!()
        };
        let CmResponse::QueuePair(qp) = net.ok(
            side,
            S1,
            CmRequest::CreateQueuePair {
                config: QueuePairConfig::on_one_cq(cq, 4),
            },
        ) else {
            panic!()
        };
        let Ok(CmResponse::MemoryRegion { stag, .. }) =
            net.cm(side)
                .register_memory(S1, Box::new(VecMemory::new(16)), Access::LOCAL_WRITE)
        else {
            panic!()
        };
        (qp, stag)
    };
    let (qa, sa) = end(Side::A);
    let (qb, sb) = end(Side::B);
    let sge = |stag| Sge {
        stag,
        offset: 0,
        length: 16,
    };
    let l = net.listen(Side::B, 7000, 0);
    let ca = net.connector(Side::A, S1);
    let cb = net.connector(Side::B, S1);
    net.req(
        Side::A,
        S1,
        CmRequest::Connect {
            connector: ca,
            remote: Net::addr(Side::B, 7000),
            limits: LIMITS_A,
            private_data: Bytes::new(),
            shared_endpoint: None,
            queue_pair: Some(qa),
        },
    )
    .1
    .unwrap();
    net.ok(
        Side::B,
        S1,
        CmRequest::GetConnectionRequest {
            listener: l,
            connector: cb,
        },
    );
    net.b
        .post(
            S1,
            qb,
            vec![WorkRequest::Receive {
                id: 7,
                sgl: vec![sge(sb)],
            }],
        )
        .unwrap();
    net.ok(
        Side::B,
        S1,
        CmRequest::Accept {
            connector: cb,
            limits: LIMITS_B,
            private_data: Bytes::new(),
            queue_pair: Some(qb),
        },
    );
    let reply_at = net.now;
    net.ok(Side::A, S1, CmRequest::CompleteConnect { connector: ca });
    net.a
        .post(
            S1,
            qa,
            vec![WorkRequest::Send {
                id: 1,
                sgl: vec![sge(sa)],
                solicited: false,
                invalidate: None,
            }],
        )
        .unwrap();
    net.pump();
    let received = |net: &mut Net| {
        net.b
            .poll_completions()
            .into_iter()
            .flat_map(|(_, _, cs)| cs)
            .filter(|c| c.wr_id == 7 && c.status == NdStatus::Success)
            .count()
    };
    assert_eq!(received(&mut net), 0, "the Send is held");
    net.a.handle_timeout(reply_at + hold);
    net.pump();
    assert_eq!(received(&mut net), 1, "the Send went when the hold ended");
}

/// A Disconnect during the first-FPDU hold: the FIN waits too, and goes one more hold after the held RTR
/// (siw must report ESTABLISHED for the RTR before it sees the FIN: [`super::first_fpdu`]).
#[test]
fn a_fin_during_the_first_fpdu_hold_follows_the_held_rtr() {
    let hold = Duration::from_millis(20);
    let (mut net, ca, cb, accept) = accepted_under_first_fpdu_hold(hold);
    let reply_at = net.now;
    net.ok_a(CmRequest::CompleteConnect { connector: ca });
    let (notify_b, _) = net.req_b(CmRequest::NotifyDisconnect { connector: cb });
    net.ok_a(CmRequest::Disconnect { connector: ca });
    assert_eq!(net.completion(Side::B, accept), None, "the RTR is held");
    assert_eq!(net.completion(Side::B, notify_b), None, "the FIN is held");
    net.a.handle_timeout(reply_at + hold);
    net.pump();
    net.assert_completed(Side::B, accept, NdStatus::Success, "the RTR first");
    assert_eq!(net.completion(Side::B, notify_b), None, "the FIN still waits");
    net.a.handle_timeout(reply_at + hold + hold);
    net.pump();
    net.assert_completed(Side::B, notify_b, NdStatus::Success, "then the FIN");
    assert_eq!(net.a.poll_timeout(), None);
}

#[test]
fn disconnect_notifies_the_peer_and_cancels_own_requests() {
    let mut net = Net::new();
    let (ca, cb) = connected_pair(&mut net);
    let (notify_b, r) = net.req_b(CmRequest::NotifyDisconnect { connector: cb });
    assert_eq!(r.unwrap(), CmResponse::Pending);
    let (notify_a, _) = net.req_a(CmRequest::NotifyDisconnect { connector: ca });
    assert_eq!(net.completion(Side::B, notify_b), None);
    net.ok_a(CmRequest::Disconnect { connector: ca });
    net.assert_completed(
        Side::A,
        notify_a,
        NdStatus::Canceled,
        "Disconnect flushes with CANCELED",
    );
    net.assert_completed(
        Side::B,
        notify_b,
        NdStatus::Success,
        "NotifyDisconnect fires on the peer",
    );
    assert_eq!(
        net.status_of(Side::A, S1, connect_a(ca, Net::addr(Side::B, 7000), Bytes::new())),
        NdStatus::ConnectionInvalid,
        "not reusable"
    );
    assert_eq!(
        (net.a.status().ports_in_use, net.b.status().ports_in_use),
        (0, 1),
        "only B's listener port remains"
    );
}

#[test]
fn closing_a_session_mid_handshake_frees_everything() {
    let mut net = Net::new();
    let (_, cb, _, _) = offer(&mut net, b"");
    assert_eq!(net.a.status().ports_in_use, 1);
    let now = net.now;
    net.a.close_session(now, S1);
    net.pump();
    assert_eq!(net.a.status().ports_in_use, 0);
    assert!(net.a.status().connectors.is_empty());
    assert_eq!(net.accept_b_status(cb), NdStatus::ConnectionAborted);
}

#[test]
fn without_peer_to_peer_accept_completes_on_the_reply() {
    let mut cfg = CmConfig::default_siw_compatible();
    cfg.mpa.peer_to_peer = false;
    let mut net = Net::with(cfg.clone(), cfg);
    let (ca, cb, connect, _) = offer(&mut net, b"");
    assert_eq!(net.accept_b(cb).1.unwrap(), CmResponse::Done);
    net.assert_completed(Side::A, connect, NdStatus::Success, "");
    net.ok_a(CmRequest::CompleteConnect { connector: ca });
}

#[test]
fn revision_one_peer_and_retry() {
    let mut v1 = CmConfig::default_siw_compatible();
    v1.mpa.revision = 1;
    let mut net = Net::with(v1, CmConfig::default_siw_compatible());
    let (ca, cb, connect, _) = offer(&mut net, b"v1");
    // An RFC 5044 peer sends no limits: B reports the adapter's.
    assert_eq!(
        net.ok_b(CmRequest::GetReadLimits { connector: cb }),
        CmResponse::ReadLimits(ReadLimits::new(128, 128))
    );
    assert_eq!(net.accept_b(cb).1.unwrap(), CmResponse::Done);
    net.assert_completed(Side::A, connect, NdStatus::Success, "");
    net.ok_a(CmRequest::CompleteConnect { connector: ca });

    // A responder that closes on S=1: the initiator retries once with Rev 1 and gets through.
    let mut net = Net::new();
    net.b_closes_on_enhanced = true;
    let (_, cb, connect, _) = offer(&mut net, b"retry");
    assert_eq!(net.accept_b(cb).1.unwrap(), CmResponse::Done);
    net.assert_completed(Side::A, connect, NdStatus::Success, "");
}

/// B, configured `b`, accepts a raw TCP connection that never sends the Request: nothing happens until
/// `deadline` after the accept, not a millisecond before; then B resets the connection and waits for nothing.
fn assert_silent_connection_reset_at(b: CmConfig, deadline: Duration) {
    let mut net = Net::with(CmConfig::default_siw_compatible(), b);
    let listener = net.listen(Side::B, 7000, 0);
    let t0 = net.now;
    net.b
        .handle_transport(t0, raw_accepted(listener, ConnId(77), 40000));
    assert_eq!(net.b.poll_transport(), None);
    assert_eq!(net.b.poll_timeout(), Some(t0 + deadline));
    net.b.handle_timeout(t0 + deadline - Duration::from_millis(1));
    assert_eq!(net.b.poll_transport(), None, "nothing before the deadline");
    net.b.handle_timeout(t0 + deadline);
    assert_eq!(
        net.b.poll_transport(),
        Some(TransportCommand::Close {
            conn: ConnId(77),
            abort: true
        }),
        "the silent connection is reset at {deadline:?}"
    );
    assert_eq!(net.b.poll_transport(), None);
    assert_eq!(net.b.poll_timeout(), None);
}

#[test]
fn responder_waits_five_seconds_for_the_request() {
    assert_silent_connection_reset_at(CmConfig::default_siw_compatible(), Duration::from_secs(5));
}

/// The responder timeout is the configured one (soft-rdmad `--mpa-timeout-ms`): a silent connection is reset
/// at that deadline, not before, and the default 5 s does not apply.
#[test]
fn the_configured_responder_timeout_applies() {
    let mut b = CmConfig::default_siw_compatible();
    b.mpa.request_timeout = Duration::from_millis(1000);
    assert_silent_connection_reset_at(b, Duration::from_millis(1000));
}

/// A thousand responders waiting for their Requests: the next deadline is always the earliest live one
/// (kept in an index, not found by scanning every connection on every event), a Request that arrives takes
/// its connection's deadline away, and each silent one closes at its own deadline.
#[test]
fn many_responder_deadlines() {
    let (mut net, l) = listening_at_7000();
    let t0 = net.now;
    let ms = Duration::from_millis;
    let conn = |i: u64| ConnId(10_000 + i);
    for i in 0..1000u64 {
        net.b
            .handle_transport(t0 + ms(i), raw_accepted(l, conn(i), 40_000 + i as u16));
    }
    assert_eq!(net.b.poll_timeout(), Some(t0 + ms(5000)));
    // Even-numbered initiators send their Request.
    for i in (0..1000u64).step_by(2) {
        net.b
            .handle_transport(t0 + ms(1000), received(conn(i), RAW_REQUEST));
    }
    assert_eq!(net.b.poll_timeout(), Some(t0 + ms(5001)), "the first silent one");
    assert_eq!(net.b.poll_transport(), None);
    let closes = |cm: &mut ConnectionManager| {
        let mut v = Vec::new();
        while let Some(cmd) = cm.poll_transport() {
            match cmd {
                TransportCommand::Close { conn, abort: true } => v.push(conn.0 - 10_000),
                other => panic!("unexpected {other:?}"),
            }
        }
        v.sort_unstable();
        v
    };
    net.b.handle_timeout(t0 + ms(5500));
    assert_eq!(closes(&mut net.b), (1..=499).step_by(2).collect::<Vec<u64>>());
    assert_eq!(net.b.poll_timeout(), Some(t0 + ms(5501)));
    net.b.handle_timeout(t0 + ms(6000));
    assert_eq!(closes(&mut net.b), (501..1000).step_by(2).collect::<Vec<u64>>());
    assert_eq!(net.b.poll_timeout(), None);
    assert_eq!(net.b.timer_entries(), 0, "stale entries are dropped, not kept");
    assert_eq!(net.b.status().listeners[0].queued_offers, 500);
    // Much later, nothing else fires: the offers have no deadline (nothing times out the application).
    net.b.handle_timeout(t0 + ms(60_000));
    assert_eq!(net.b.poll_transport(), None);
}

#[test]
fn shutdown_completes_pending_requests_with_device_removed() {
    let mut net = Net::new();
    let (ca, _cb) = connected_pair(&mut net);
    let (notify, _) = net.req_a(CmRequest::NotifyDisconnect { connector: ca });
    let now = net.now;
    net.a.shutdown(now);
    net.pump();
    net.assert_completed(Side::A, notify, NdStatus::DeviceRemoved, "");
    assert_eq!(net.a.status().ports_in_use, 0);
}

#[test]
fn malformed_fpdu_after_connect_terminates() {
    let mut net = Net::new();
    let (ca, cb) = connected_pair(&mut net);
    let (notify_a, _) = net.req_a(CmRequest::NotifyDisconnect { connector: ca });
    let _ = cb;
    // B's side of the connection receives an FPDU with an unknown opcode: B terminates and closes.
    let bconn = net
        .peers
        .iter()
        .find(|((s, _), _)| *s == Side::B)
        .map(|((_, c), _)| *c)
        .unwrap();
    let bad = Bytes::from_static(&[
        0x00, 0x12, 0x41, 0x4F, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0,
    ]);
    net.b.handle_transport(net.now, received(bconn, bad));
    // RFC 5040 §7.2: an unknown opcode is a remote operation error, "unexpected opcode"; the Terminate goes
    // out (no CRC was negotiated), then a FIN (not a reset, which could discard the Terminate).
    let cause = TerminateCause::new(
        layer::RDMAP,
        rdmap_type::REMOTE_OPERATION,
        rdmap_code::UNEXPECTED_OPCODE,
    );
    let TransportCommand::Send { conn, data } = net.b.poll_transport().expect("a Terminate") else {
        panic!("B sends the Terminate first");
    };
    assert_eq!(conn, bconn);
    assert_eq!(data, crate::engine::framing::terminate_fpdu(cause, false));
    let msg = crate::engine::framing::parse_message(&data, 65535).unwrap();
    assert_eq!(msg.terminate().unwrap().cause, cause);
    assert_eq!(
        net.b.poll_transport(),
        Some(TransportCommand::Close {
            conn: bconn,
            abort: false
        })
    );
    assert_eq!(net.b.poll_transport(), None);
    // Deliver the Terminate and the close to A.
    net.execute(Side::B, TransportCommand::Send { conn: bconn, data });
    net.execute(
        Side::B,
        TransportCommand::Close {
            conn: bconn,
            abort: false,
        },
    );
    net.pump();
    net.assert_completed(
        Side::A,
        notify_a,
        NdStatus::Success,
        "A sees the Terminate and the close",
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// The handshake's outcome does not depend on how the transport cuts the bytes.
    #[test]
    fn fragmentation_does_not_change_the_outcome(cuts in proptest::collection::vec(0usize..80, 0..10)) {
        let mut net = Net::new();
        net.cuts = cuts;
        let (ca, _cb) = connected_pair(&mut net);
        prop_assert_eq!(net.ok_a(CmRequest::GetReadLimits { connector: ca }), CmResponse::ReadLimits(ReadLimits::new(2, 8)));
    }
}

/// RFC 5044 §7.1.2: the initiator sends nothing between its Request and the Reply. Bytes that arrive after an
/// offer is out (queued, or taken by the application) reset the connection: a queued offer is withdrawn, a
/// taken one's Accept fails with CONNECTION_ABORTED, nothing is kept for later, and the 4-tuple is free again.
/// (The daemon once buffered such bytes without bound until the application accepted.)
#[test]
fn bytes_before_the_reply_reset_the_offer() {
    for taken in [false, true] {
        let (mut net, l) = listening_at_7000();
        let accepted = |conn| raw_accepted(l, conn, 40000);
        let conn = ConnId(77);
        let now = net.now;
        net.b.handle_transport(now, accepted(conn));
        net.b.handle_transport(now, received(conn, RAW_REQUEST));
        let cb = net.connector(Side::B, S1);
        let gcr = get_connection_request(l, cb);
        if taken {
            assert!(matches!(
                net.ok_b(gcr.clone()),
                CmResponse::ConnectionRequest { .. }
            ));
        }
        let queued = |net: &Net| net.b.status().listeners[0].queued_offers;
        assert_eq!(queued(&net), u32::from(!taken));
        net.b
            .handle_transport(now, received(conn, &b"an FPDU before the Reply"[..]));
        let commands: Vec<_> = std::iter::from_fn(|| net.b.poll_transport()).collect();
        assert_eq!(
            commands,
            vec![TransportCommand::Close { conn, abort: true }],
            "taken: {taken}"
        );
        net.b.handle_transport(now, TransportEvent::Closed { conn });
        net.pump();
        assert_eq!(queued(&net), 0, "taken: {taken}");
        if taken {
            let accept = accept_b(cb, Bytes::new());
            assert_eq!(net.status_of(Side::B, S1, accept), NdStatus::ConnectionAborted);
            net.ok_b(CmRequest::CloseConnector { connector: cb });
        } else {
            let (_, r) = net.req_b(gcr);
            assert_eq!(r.unwrap(), CmResponse::Pending, "no offer left to take");
        }
        // The same 4-tuple is accepted again (a leaked tuple would be closed at once).
        net.b.handle_transport(now, accepted(ConnId(78)));
        assert_eq!(net.b.poll_transport(), None, "taken: {taken}");
    }
}

/// RFC 6581 §9: a Reply whose ORD exceeds our IRD is answered with a Terminate (LLP/MPA, insufficient IRD) in
/// FPDU mode — with a CRC when the Reply set C=1 (RFC 5044 §7.1), even if this side did not ask — and then a
/// FIN, not a reset that could discard the Terminate. The Connect fails with CONNECTION_ABORTED.
#[test]
fn unacceptable_reply_is_terminated_with_the_negotiated_crc_then_closed() {
    use soft_rdma_common::wire::fpdu::{FpduRepr, verify_crc};
    use soft_rdma_common::wire::mpa::{EnhancedControl, MpaKind, MpaRepr};
    use soft_rdma_common::wire::rdmap::{MessageRepr, RdmapOpcode};

    let mut net = Net::new();
    let ca = net.connector(Side::A, S1);
    let remote = Net::addr(Side::B, 7000);
    let now = net.now;
    let connect = RequestId(9000);
    let r = net
        .a
        .handle_request(now, S1, connect, connect_a(ca, remote, Bytes::new()));
    assert_eq!(r.unwrap(), CmResponse::Pending);
    let Some(TransportCommand::Connect { conn, local, .. }) = net.a.poll_transport() else {
        panic!("a TCP connect")
    };
    net.a.handle_transport(
        now,
        TransportEvent::Connected {
            conn,
            local,
            mss: 1448,
        },
    );
    assert!(
        matches!(net.a.poll_transport(), Some(TransportCommand::Send { .. })),
        "the Request"
    );
    let word = EnhancedControl {
        ird: 1,
        ord: LIMITS_A.inbound as u16 + 1,
        ..Default::default()
    };
    let reply = MpaRepr {
        kind: MpaKind::Reply,
        markers: false,
        crc: true,
        reject: false,
        revision: 2,
        enhanced: Some(word),
        private_data: b"",
    };
    let mut bytes = vec![0u8; reply.buffer_len()];
    reply.emit(&mut bytes).unwrap();
    net.a.handle_transport(now, received(conn, bytes));
    let commands: Vec<_> = std::iter::from_fn(|| net.a.poll_transport()).collect();
    let [TransportCommand::Send { data, .. }, close] = &commands[..] else {
        panic!("a Terminate, then a close: {commands:?}")
    };
    verify_crc(data).expect("the Terminate carries the CRC the Reply asked for");
    let f = FpduRepr::parse(data, 65535).unwrap();
    let m = MessageRepr::parse(f.ulpdu).unwrap();
    assert_eq!(m.opcode, RdmapOpcode::Terminate);
    let c = m.terminate().unwrap().cause;
    assert_eq!((c.layer, c.error_type, c.code), (2, 0, 0x06));
    assert_eq!(close, &TransportCommand::Close { conn, abort: false });
    let events: Vec<_> = std::iter::from_fn(|| net.a.poll_event()).collect();
    assert!(
        events
            .iter()
            .any(|(_, CmEvent::Completed { request, result })| *request == connect
                && result
                    .as_ref()
                    .is_err_and(|e| e.status == NdStatus::ConnectionAborted)),
        "{events:?}"
    );
}

/// After a reject Reply the responder leaves the close to the initiator (kernel siw reads the Reply from a
/// work queue and loses its private data if our FIN's work runs first), and closes with a FIN itself only
/// after [`REJECT_LINGER`]. The 4-tuple and the connector are released at once either way.
#[test]
fn a_reject_lingers_for_the_initiators_close() {
    use crate::engine::cm::REJECT_LINGER;
    for initiator_closes in [true, false] {
        let (mut net, l) = listening_at_7000();
        let conn = ConnId(78);
        let now = net.now;
        net.b.handle_transport(now, raw_accepted(l, conn, 40000));
        net.b.handle_transport(now, received(conn, RAW_REQUEST));
        let cb = net.connector(Side::B, S1);
        net.ok_b(get_connection_request(l, cb));
        let reject = CmRequest::Reject {
            connector: cb,
            private_data: Bytes::from_static(b"no"),
        };
        assert_eq!(
            net.b.handle_request(now, S1, RequestId(9999), reject).unwrap(),
            CmResponse::Done
        );
        let commands: Vec<_> = std::iter::from_fn(|| net.b.poll_transport()).collect();
        assert!(
            matches!(&commands[..], [TransportCommand::Send { conn: c, data }] if *c == conn && data[16] & 0x20 != 0),
            "only the reject Reply goes out: {commands:?}"
        );
        assert_eq!(net.b.poll_timeout(), Some(now + REJECT_LINGER));
        if initiator_closes {
            net.b.handle_transport(now, TransportEvent::Closed { conn });
            assert_eq!(net.b.poll_transport(), None, "the initiator's close ends it");
            assert_eq!(net.b.poll_timeout(), None);
        } else {
            net.b
                .handle_timeout(now + REJECT_LINGER - Duration::from_millis(1));
            assert_eq!(net.b.poll_transport(), None, "still lingering");
            net.b.handle_timeout(now + REJECT_LINGER);
            assert_eq!(
                net.b.poll_transport(),
                Some(TransportCommand::Close { conn, abort: false })
            );
            assert_eq!(net.b.poll_timeout(), None);
        }
        assert_eq!(net.b.status().ports_in_use, 1, "only the listener's port");
    }
}

/// A GetConnectionRequest waiting with a connector that is then closed completes with CANCELED at once, and
/// the next offer goes to the next waiting call (the closed connector is never handed an offer).
#[test]
fn closing_a_connector_cancels_its_waiting_get_connection_request() {
    let (mut net, l) = listening_at_7000();
    let closed = net.connector(Side::B, S1);
    let taker = net.connector(Side::B, S1);
    let (first, r) = net.req_b(get_connection_request(l, closed));
    assert_eq!(r.unwrap(), CmResponse::Pending);
    net.ok_b(CmRequest::CloseConnector { connector: closed });
    net.assert_completed(Side::B, first, NdStatus::Canceled, "");
    let (second, r) = net.req_b(get_connection_request(l, taker));
    assert_eq!(r.unwrap(), CmResponse::Pending);
    let ca = net.connector(Side::A, S1);
    let (_, r) = net.req_a(connect_a(ca, Net::addr(Side::B, 7000), Bytes::from_static(b"x")));
    assert_eq!(r.unwrap(), CmResponse::Pending);
    match net.completion(Side::B, second) {
        Some(Ok(CmResponse::ConnectionRequest { connector, .. })) => assert_eq!(connector, taker),
        other => panic!("{other:?}"),
    }
}

/// Kernel mode's hand-off ([`super::cm`]'s `hand_off`): a connection carrying a queue pair the client runs
/// is handed over at Accept (passive: it waits for the RTR itself) and at CompleteConnect (active: it sends
/// the RTR itself); each request completes with what the client needs. The client reporting the end makes
/// the connector end as on the peer's disconnect.
#[test]
fn connections_with_client_queue_pairs_are_handed_over_once_established() {
    let mut cfg = CmConfig::default_siw_compatible();
    cfg.hand_off = true;
    let mut net = Net::with(cfg.clone(), cfg);
    let l = net.listen(Side::B, 7000, 0);
    let ca = net.connector(Side::A, S1);
    let cb = net.connector(Side::B, S1);
    // Queue pairs of the clients' own: the daemons never saw them.
    let (connect, r) = net.req_a(connect_a_with(
        ca,
        Net::addr(Side::B, 7000),
        Bytes::from_static(b"hi"),
        Some(QueuePairId(77)),
    ));
    assert_eq!(r.unwrap(), CmResponse::Pending);
    net.ok_b(get_connection_request(l, cb));
    let (accept, r) = net.req_b(accept_b_with(
        cb,
        Bytes::from_static(b"yo"),
        Some(QueuePairId(88)),
    ));
    assert_eq!(r.unwrap(), CmResponse::Pending);
    net.pump();
    net.assert_completed(Side::A, connect, NdStatus::Success, "the Reply");
    let Some(Ok(CmResponse::HandedOff(passive))) = net.completion(Side::B, accept) else {
        panic!("the Accept completes with the hand-off");
    };
    assert!(passive.awaiting_rtr && passive.tx_held && passive.send_rtr.is_none());
    assert_eq!(
        (passive.ird, passive.ord),
        (
            LIMITS_B.inbound.min(LIMITS_A.outbound),
            LIMITS_B.outbound.min(LIMITS_A.inbound)
        )
    );
    let (complete, r) = net.req_a(CmRequest::CompleteConnect { connector: ca });
    assert_eq!(
        r.unwrap(),
        CmResponse::Pending,
        "waits for the transport to let go"
    );
    net.pump();
    let Some(Ok(CmResponse::HandedOff(active))) = net.completion(Side::A, complete) else {
        panic!("CompleteConnect completes with the hand-off");
    };
    assert!(active.send_rtr.is_some(), "the client sends the RTR itself");
    assert!(!active.awaiting_rtr && !active.tx_held);
    assert!(active.received.is_empty());
    // The client saw the peer go: NotifyDisconnect fires, the connector is closed.
    let (notify, r) = net.req_b(CmRequest::NotifyDisconnect { connector: cb });
    assert_eq!(r.unwrap(), CmResponse::Pending);
    net.ok_b(CmRequest::ConnectionEnded {
        connector: cb,
        how: ConnectionEnd::PeerFin,
    });
    net.pump();
    net.assert_completed(Side::B, notify, NdStatus::Success, "NotifyDisconnect");
    // Only a hand-off connector's client may say so.
    let other = net.connector(Side::A, S1);
    assert_eq!(
        net.status_of(
            Side::A,
            S1,
            CmRequest::ConnectionEnded {
                connector: other,
                how: ConnectionEnd::PeerFin,
            }
        ),
        NdStatus::ConnectionInvalid
    );
}

/// A client's report of its in-process queue pairs is kept per session, marked as the session's whatever
/// the report says, replaced by the next first part, and bounded by what the session holds in the daemon
/// (one per object plus a little slack): a client cannot make the daemon keep more than its objects allow.
#[test]
fn reported_queue_pairs_are_the_sessions_and_bounded_by_its_objects() {
    let mut net = Net::new();
    let qp = |id: u64| QueuePairStatus {
        id,
        session: 999,
        connector: None,
        state: crate::engine::verbs::QueuePairState::Idle,
        terminate: None,
        stats: Default::default(),
    };
    let report = |first: bool, ids: std::ops::Range<u64>| CmRequest::ReportDataPath {
        queue_pairs: ids.map(qp).collect(),
        memory_regions: 3,
        first,
    };
    let c = net.connector(Side::A, S1);
    net.ok_a(report(true, 0..1000));
    let status = |net: &mut Net| match net.ok_a(CmRequest::Status) {
        CmResponse::Status(s) => s,
        other => panic!("{other:?}"),
    };
    let s = status(&mut net);
    assert_eq!(
        s.queue_pairs.len(),
        1 + super::cm::REPORT_SLACK,
        "one object held: 1 + slack"
    );
    assert!(s.queue_pairs.iter().all(|q| q.session == S1.0));
    assert_eq!(s.memory_regions, 3);
    // A following part adds (within the bound); a first part replaces.
    net.ok_a(report(true, 0..2));
    net.ok_a(report(false, 2..4));
    assert_eq!(status(&mut net).queue_pairs.len(), 4);
    net.ok_a(CmRequest::CloseConnector { connector: c });
    net.a.close_session(net.now, S1);
    assert!(
        status(&mut net).queue_pairs.is_empty(),
        "dropped with the session"
    );
}
