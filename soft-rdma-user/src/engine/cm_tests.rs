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

    fn status_of(&mut self, side: Side, session: SessionId, r: CmRequest) -> NdStatus {
        match self.req(side, session, r.clone()).1 {
            Ok(v) => panic!("{r:?} succeeded with {v:?}"),
            Err(e) => e.status,
        }
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

const LIMITS_A: ReadLimits = ReadLimits {
    inbound: 4,
    outbound: 8,
};
const LIMITS_B: ReadLimits = ReadLimits {
    inbound: 16,
    outbound: 2,
};

/// A connects to B:7000 with private data; B takes the offer. Returns (A's connector, B's connector, A's
/// pending Connect, the listener).
fn offer(net: &mut Net, pd: &[u8]) -> (ConnectorId, ConnectorId, RequestId, ListenerId) {
    let l = net.listen(Side::B, 7000, 0);
    let ca = net.connector(Side::A, S1);
    let cb = net.connector(Side::B, S1);
    let (connect, r) = net.req(
        Side::A,
        S1,
        CmRequest::Connect {
            connector: ca,
            remote: Net::addr(Side::B, 7000),
            limits: LIMITS_A,
            private_data: Bytes::copy_from_slice(pd),
            shared_endpoint: None,
            queue_pair: None,
        },
    );
    assert_eq!(r.unwrap(), CmResponse::Pending);
    match net.ok(
        Side::B,
        S1,
        CmRequest::GetConnectionRequest {
            listener: l,
            connector: cb,
        },
    ) {
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
    let (accept, r) = net.req(
        Side::B,
        S1,
        CmRequest::Accept {
            connector: cb,
            limits: LIMITS_B,
            private_data: Bytes::from_static(b"yo"),
            queue_pair: None,
        },
    );
    assert_eq!(r.unwrap(), CmResponse::Pending, "P2P: Accept waits for the RTR");
    assert_eq!(net.completed_status(Side::A, connect), Some(NdStatus::Success));
    assert_eq!(
        net.completion(Side::B, accept),
        None,
        "no Accept before CompleteConnect"
    );
    net.ok(Side::A, S1, CmRequest::CompleteConnect { connector: ca });
    assert_eq!(
        net.completed_status(Side::B, accept),
        Some(NdStatus::Success),
        "the RTR completes the Accept"
    );
    (ca, cb)
}

#[test]
fn connect_accept_complete_with_limits_private_data_and_addresses() {
    let mut net = Net::new();
    let pd: Vec<u8> = (0..32).collect();
    let (ca, cb, connect, _) = offer(&mut net, &pd);
    // B sees A's offer in its own view: A serves 4 (B may issue 4) and issues 8 (B serves 8).
    assert_eq!(
        net.ok(Side::B, S1, CmRequest::GetReadLimits { connector: cb }),
        CmResponse::ReadLimits(ReadLimits {
            inbound: 8,
            outbound: 4
        })
    );
    let (accept, _) = net.req(
        Side::B,
        S1,
        CmRequest::Accept {
            connector: cb,
            limits: LIMITS_B,
            private_data: Bytes::from_static(b"accepted"),
            queue_pair: None,
        },
    );
    assert_eq!(net.completed_status(Side::A, connect), Some(NdStatus::Success));
    // A sees B's answer, which Accept limited to A's offer (seed 004): B serves min(16, A's ORD 8) = 8 → A
    // may issue 8; B issues min(2, A's IRD 4) = 2 → A serves 2.
    assert_eq!(
        net.ok(Side::A, S1, CmRequest::GetReadLimits { connector: ca }),
        CmResponse::ReadLimits(ReadLimits {
            inbound: 2,
            outbound: 8
        })
    );
    assert_eq!(
        net.ok(
            Side::A,
            S1,
            CmRequest::GetPrivateData {
                connector: ca,
                buffer_len: 64
            }
        ),
        CmResponse::PrivateData {
            data: Bytes::from_static(b"accepted"),
            required: 8
        }
    );
    net.ok(Side::A, S1, CmRequest::CompleteConnect { connector: ca });
    assert_eq!(net.completed_status(Side::B, accept), Some(NdStatus::Success));
    let CmResponse::Address(a_local) = net.ok(Side::A, S1, CmRequest::GetLocalAddress { connector: ca })
    else {
        panic!()
    };
    assert!(
        (49152..=65535).contains(&a_local.port()),
        "implicit bind from the ephemeral range"
    );
    assert_eq!(
        net.ok(Side::B, S1, CmRequest::GetPeerAddress { connector: cb }),
        CmResponse::Address(a_local)
    );
    assert_eq!(
        net.ok(Side::A, S1, CmRequest::GetPeerAddress { connector: ca }),
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
    let more_served = ReadLimits {
        inbound: 16,
        outbound: 2,
    };
    let more_issued = ReadLimits {
        inbound: 2,
        outbound: 16,
    };
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
            net.req(
                Side::B,
                S1,
                CmRequest::Accept {
                    connector: cb,
                    limits: listener,
                    private_data: Bytes::new(),
                    queue_pair: None,
                },
            )
            .1
            .unwrap();
            assert_eq!(net.completed_status(Side::A, connect), Some(NdStatus::Success));
            let CmResponse::ReadLimits(seen) =
                net.ok(Side::A, S1, CmRequest::GetReadLimits { connector: ca })
            else {
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
            net.ok(Side::A, S1, CmRequest::CompleteConnect { connector: ca });
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
    let mut net = Net::new();
    let l = net.listen(Side::B, 7000, 0);
    let ca = net.connector(Side::A, S1);
    let cb = net.connector(Side::B, S1);
    net.req(
        Side::A,
        S1,
        CmRequest::Connect {
            connector: ca,
            remote: Net::addr(Side::B, 7000),
            limits: ReadLimits {
                inbound: 1000,
                outbound: 0x3FFF,
            },
            private_data: Bytes::new(),
            shared_endpoint: None,
            queue_pair: None,
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
    assert_eq!(
        net.ok(Side::B, S1, CmRequest::GetReadLimits { connector: cb }),
        CmResponse::ReadLimits(ReadLimits {
            inbound: 128,
            outbound: 128
        })
    );
    net.req(
        Side::B,
        S1,
        CmRequest::Accept {
            connector: cb,
            limits: ReadLimits {
                inbound: 500,
                outbound: 500,
            },
            private_data: Bytes::new(),
            queue_pair: None,
        },
    )
    .1
    .unwrap();
    assert_eq!(
        net.ok(Side::A, S1, CmRequest::GetReadLimits { connector: ca }),
        CmResponse::ReadLimits(ReadLimits {
            inbound: 128,
            outbound: 128
        })
    );
}

#[test]
fn reject_with_private_data_refuses_the_connect() {
    let mut net = Net::new();
    let (ca, cb, connect, _) = offer(&mut net, b"may I?");
    net.ok(
        Side::B,
        S1,
        CmRequest::Reject {
            connector: cb,
            private_data: Bytes::from_static(b"no: busy"),
        },
    );
    assert_eq!(
        net.completed_status(Side::A, connect),
        Some(NdStatus::ConnectionRefused)
    );
    assert_eq!(
        net.ok(
            Side::A,
            S1,
            CmRequest::GetPrivateData {
                connector: ca,
                buffer_len: 100
            }
        ),
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
    let (r, _) = net.req(
        Side::A,
        S1,
        CmRequest::Connect {
            connector: ca,
            remote: Net::addr(Side::B, 7999),
            limits: LIMITS_A,
            private_data: Bytes::new(),
            shared_endpoint: None,
            queue_pair: None,
        },
    );
    assert_eq!(
        net.completed_status(Side::A, r),
        Some(NdStatus::ConnectionRefused)
    );
    let ca = net.connector(Side::A, S1);
    let (r, _) = net.req(
        Side::A,
        S1,
        CmRequest::Connect {
            connector: ca,
            remote: format!("{BLACKHOLE}:7000").parse().unwrap(),
            limits: LIMITS_A,
            private_data: Bytes::new(),
            shared_endpoint: None,
            queue_pair: None,
        },
    );
    assert_eq!(net.completed_status(Side::A, r), Some(NdStatus::IoTimeout));
    assert_eq!(net.a.status().ports_in_use, 0);
}

#[test]
fn backlog_full_refuses_new_offers() {
    let mut net = Net::new();
    net.listen(Side::B, 7000, 1);
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let ca = net.connector(Side::A, S1);
        let (r, _) = net.req(
            Side::A,
            S1,
            CmRequest::Connect {
                connector: ca,
                remote: Net::addr(Side::B, 7000),
                limits: LIMITS_A,
                private_data: Bytes::new(),
                shared_endpoint: None,
                queue_pair: None,
            },
        );
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
    net.ok(
        Side::A,
        S1,
        CmRequest::Cancel {
            object: ObjectRef::Connector(ca),
        },
    );
    assert_eq!(net.completed_status(Side::A, connect), Some(NdStatus::Canceled));
    assert_eq!(
        net.status_of(
            Side::B,
            S1,
            CmRequest::Accept {
                connector: cb,
                limits: LIMITS_B,
                private_data: Bytes::new(),
                queue_pair: None
            }
        ),
        NdStatus::ConnectionAborted
    );
}

#[test]
fn active_reject_after_seeing_limits_aborts_the_accept() {
    let mut net = Net::new();
    let (ca, cb, _, _) = offer(&mut net, b"");
    let (accept, _) = net.req(
        Side::B,
        S1,
        CmRequest::Accept {
            connector: cb,
            limits: LIMITS_B,
            private_data: Bytes::new(),
            queue_pair: None,
        },
    );
    net.ok(
        Side::A,
        S1,
        CmRequest::Reject {
            connector: ca,
            private_data: Bytes::new(),
        },
    );
    assert_eq!(
        net.completed_status(Side::B, accept),
        Some(NdStatus::ConnectionAborted)
    );
}

#[test]
fn private_data_limits_and_buffer_overflow() {
    let mut net = Net::new();
    net.listen(Side::B, 7000, 0);
    let ca = net.connector(Side::A, S1);
    let connect = |pd: usize| CmRequest::Connect {
        connector: ca,
        remote: Net::addr(Side::B, 7000),
        limits: LIMITS_A,
        private_data: Bytes::from(vec![7; pd]),
        shared_endpoint: None,
        queue_pair: None,
    };
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
        net.status_of(
            Side::B,
            S1,
            CmRequest::Accept {
                connector: cb,
                limits: LIMITS_B,
                private_data: Bytes::from(vec![1; 253]),
                queue_pair: None
            }
        ),
        NdStatus::InvalidBufferSize
    );
    net.req(
        Side::B,
        S1,
        CmRequest::Accept {
            connector: cb,
            limits: LIMITS_B,
            private_data: Bytes::from(vec![1; 252]),
            queue_pair: None,
        },
    )
    .1
    .unwrap();
    // GetPrivateData with a short buffer: truncated data and the size required (BUFFER_OVERFLOW on the UDS).
    assert_eq!(
        net.ok(
            Side::A,
            S1,
            CmRequest::GetPrivateData {
                connector: ca,
                buffer_len: 4
            }
        ),
        CmResponse::PrivateData {
            data: Bytes::from(vec![1; 4]),
            required: 252
        }
    );
    assert_eq!(
        net.ok(
            Side::B,
            S1,
            CmRequest::GetPrivateData {
                connector: cb,
                buffer_len: 300
            }
        ),
        CmResponse::PrivateData {
            data: Bytes::from(vec![9; 252]),
            required: 252
        }
    );
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
        net.status_of(
            Side::A,
            S1,
            CmRequest::Connect {
                connector: ca,
                remote: Net::addr(Side::B, 7000),
                limits: LIMITS_A,
                private_data: Bytes::new(),
                shared_endpoint: None,
                queue_pair: None
            }
        ),
        NdStatus::ConnectionActive
    );
    assert_eq!(
        net.status_of(
            Side::B,
            S1,
            CmRequest::Accept {
                connector: cb,
                limits: LIMITS_B,
                private_data: Bytes::new(),
                queue_pair: None
            }
        ),
        NdStatus::ConnectionActive
    );
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
    net.ok(
        Side::A,
        S1,
        CmRequest::Bind {
            connector: c1,
            local: Net::addr(Side::A, 6000),
        },
    );
    assert_eq!(
        net.status_of(
            Side::A,
            S1,
            CmRequest::Bind {
                connector: c2,
                local: Net::addr(Side::A, 6000)
            }
        ),
        NdStatus::SharingViolation
    );
    assert_eq!(
        net.status_of(
            Side::A,
            S1,
            CmRequest::Bind {
                connector: c2,
                local: "10.9.9.9:6000".parse().unwrap()
            }
        ),
        NdStatus::InvalidAddress
    );
    let mut last = None;
    for _ in 0..16_384 {
        let c = net.connector(Side::A, S1);
        last = Some(net.ok(
            Side::A,
            S1,
            CmRequest::Bind {
                connector: c,
                local: Net::addr(Side::A, 0),
            },
        ));
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
    net.ok(
        Side::A,
        S1,
        CmRequest::CloseConnector {
            connector: ConnectorId(5),
        },
    );
    net.ok(
        Side::A,
        S1,
        CmRequest::Bind {
            connector: c,
            local: Net::addr(Side::A, 0),
        },
    );
}

#[test]
fn shared_endpoint_fan_out_and_duplicate_tuple() {
    let mut net = Net::new();
    let ls: Vec<_> = (0..3).map(|i| net.listen(Side::B, 7100 + i, 0)).collect();
    let CmResponse::SharedEndpoint(ep) = net.ok(
        Side::A,
        S1,
        CmRequest::CreateSharedEndpoint {
            local: Net::addr(Side::A, 0),
        },
    ) else {
        panic!()
    };
    let mut locals = Vec::new();
    for (i, l) in ls.iter().enumerate() {
        let ca = net.connector(Side::A, S1);
        let cb = net.connector(Side::B, S1);
        let (r, _) = net.req(
            Side::A,
            S1,
            CmRequest::Connect {
                connector: ca,
                remote: Net::addr(Side::B, 7100 + i as u16),
                limits: LIMITS_A,
                private_data: Bytes::new(),
                shared_endpoint: Some(ep),
                queue_pair: None,
            },
        );
        net.ok(
            Side::B,
            S1,
            CmRequest::GetConnectionRequest {
                listener: *l,
                connector: cb,
            },
        );
        net.req(
            Side::B,
            S1,
            CmRequest::Accept {
                connector: cb,
                limits: LIMITS_B,
                private_data: Bytes::new(),
                queue_pair: None,
            },
        )
        .1
        .unwrap();
        assert_eq!(net.completed_status(Side::A, r), Some(NdStatus::Success));
        let CmResponse::Address(a) = net.ok(Side::A, S1, CmRequest::GetLocalAddress { connector: ca }) else {
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
    net.ok(Side::A, S1, CmRequest::CreateCompletionQueue { depth: 16 });
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
    net.ok(Side::A, S1, CmRequest::CloseConnector { connector: c1 });
    net.ok(Side::A, S1, CmRequest::CreateListener);
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
    net.ok(Side::A, S1, CmRequest::Disconnect { connector: ca });
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
    net.ok(
        Side::B,
        S1,
        CmRequest::Reject {
            connector: cb,
            private_data: Bytes::new(),
        },
    );
    assert_eq!(
        net.completed_status(Side::A, connect),
        Some(NdStatus::ConnectionRefused)
    );
    assert_eq!(
        net.status_of(Side::A, S1, CmRequest::NotifyDisconnect { connector: ca }),
        NdStatus::ConnectionInvalid,
        "a refused connect never connected"
    );
}

/// siw's responder race ([`super::first_fpdu`]): after the Reply, the active side sends nothing — not the
/// RTR, not the queue pair's first FPDU — until the hold ends; then both go, in order, and the passive side
/// is never held. The deadline is the CM's timer; a Terminate in between drops what was held.
#[test]
fn first_fpdu_is_held_after_the_reply_until_the_hold_ends() {
    let hold = Duration::from_millis(20);
    let mut cfg = CmConfig::default_siw_compatible();
    cfg.first_fpdu_hold = hold;
    let mut net = Net::with_first_fpdu_hold(cfg.clone(), cfg);
    let (ca, cb, connect, _) = offer(&mut net, b"hold");
    let (accept, _) = net.req(
        Side::B,
        S1,
        CmRequest::Accept {
            connector: cb,
            limits: LIMITS_B,
            private_data: Bytes::new(),
            queue_pair: None,
        },
    );
    assert_eq!(net.completed_status(Side::A, connect), Some(NdStatus::Success));
    let reply_at = net.now;
    assert_eq!(net.a.poll_timeout(), Some(reply_at + hold), "the hold's deadline");
    net.ok(Side::A, S1, CmRequest::CompleteConnect { connector: ca });
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
    assert_eq!(
        net.completed_status(Side::B, accept),
        Some(NdStatus::Success),
        "the held RTR arrived and completed the Accept"
    );
    assert_eq!(net.a.poll_timeout(), None, "no deadline left");
    assert_eq!(net.b.poll_timeout(), None, "the passive side never holds");
}

/// A Disconnect during the first-FPDU hold: the FIN waits too, behind the held RTR (siw would otherwise see
/// the FIN while still completing its accept), and goes when the hold ends.
#[test]
fn a_fin_during_the_first_fpdu_hold_follows_the_held_rtr() {
    let hold = Duration::from_millis(20);
    let mut cfg = CmConfig::default_siw_compatible();
    cfg.first_fpdu_hold = hold;
    let mut net = Net::with_first_fpdu_hold(cfg.clone(), cfg);
    let (ca, cb, connect, _) = offer(&mut net, b"hold");
    let (accept, _) = net.req(
        Side::B,
        S1,
        CmRequest::Accept {
            connector: cb,
            limits: LIMITS_B,
            private_data: Bytes::new(),
            queue_pair: None,
        },
    );
    assert_eq!(net.completed_status(Side::A, connect), Some(NdStatus::Success));
    let reply_at = net.now;
    net.ok(Side::A, S1, CmRequest::CompleteConnect { connector: ca });
    let (notify_b, _) = net.req(Side::B, S1, CmRequest::NotifyDisconnect { connector: cb });
    net.ok(Side::A, S1, CmRequest::Disconnect { connector: ca });
    assert_eq!(net.completion(Side::B, accept), None, "the RTR is held");
    assert_eq!(net.completion(Side::B, notify_b), None, "the FIN is held");
    net.a.handle_timeout(reply_at + hold);
    net.pump();
    assert_eq!(
        net.completed_status(Side::B, accept),
        Some(NdStatus::Success),
        "the RTR first"
    );
    assert_eq!(
        net.completed_status(Side::B, notify_b),
        Some(NdStatus::Success),
        "then the FIN"
    );
}

#[test]
fn disconnect_notifies_the_peer_and_cancels_own_requests() {
    let mut net = Net::new();
    let (ca, cb) = connected_pair(&mut net);
    let (notify_b, r) = net.req(Side::B, S1, CmRequest::NotifyDisconnect { connector: cb });
    assert_eq!(r.unwrap(), CmResponse::Pending);
    let (notify_a, _) = net.req(Side::A, S1, CmRequest::NotifyDisconnect { connector: ca });
    assert_eq!(net.completion(Side::B, notify_b), None);
    net.ok(Side::A, S1, CmRequest::Disconnect { connector: ca });
    assert_eq!(
        net.completed_status(Side::A, notify_a),
        Some(NdStatus::Canceled),
        "Disconnect flushes with CANCELED"
    );
    assert_eq!(
        net.completed_status(Side::B, notify_b),
        Some(NdStatus::Success),
        "NotifyDisconnect fires on the peer"
    );
    assert_eq!(
        net.status_of(
            Side::A,
            S1,
            CmRequest::Connect {
                connector: ca,
                remote: Net::addr(Side::B, 7000),
                limits: LIMITS_A,
                private_data: Bytes::new(),
                shared_endpoint: None,
                queue_pair: None
            }
        ),
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
    assert_eq!(
        net.status_of(
            Side::B,
            S1,
            CmRequest::Accept {
                connector: cb,
                limits: LIMITS_B,
                private_data: Bytes::new(),
                queue_pair: None
            }
        ),
        NdStatus::ConnectionAborted
    );
}

#[test]
fn without_peer_to_peer_accept_completes_on_the_reply() {
    let mut cfg = CmConfig::default_siw_compatible();
    cfg.mpa.peer_to_peer = false;
    let mut net = Net::with(cfg.clone(), cfg);
    let (ca, cb, connect, _) = offer(&mut net, b"");
    assert_eq!(
        net.req(
            Side::B,
            S1,
            CmRequest::Accept {
                connector: cb,
                limits: LIMITS_B,
                private_data: Bytes::new(),
                queue_pair: None
            }
        )
        .1
        .unwrap(),
        CmResponse::Done
    );
    assert_eq!(net.completed_status(Side::A, connect), Some(NdStatus::Success));
    net.ok(Side::A, S1, CmRequest::CompleteConnect { connector: ca });
}

#[test]
fn revision_one_peer_and_retry() {
    let mut v1 = CmConfig::default_siw_compatible();
    v1.mpa.revision = 1;
    let mut net = Net::with(v1, CmConfig::default_siw_compatible());
    let (ca, cb, connect, _) = offer(&mut net, b"v1");
    // An RFC 5044 peer sends no limits: B reports the adapter's.
    assert_eq!(
        net.ok(Side::B, S1, CmRequest::GetReadLimits { connector: cb }),
        CmResponse::ReadLimits(ReadLimits {
            inbound: 128,
            outbound: 128
        })
    );
    assert_eq!(
        net.req(
            Side::B,
            S1,
            CmRequest::Accept {
                connector: cb,
                limits: LIMITS_B,
                private_data: Bytes::new(),
                queue_pair: None
            }
        )
        .1
        .unwrap(),
        CmResponse::Done
    );
    assert_eq!(net.completed_status(Side::A, connect), Some(NdStatus::Success));
    net.ok(Side::A, S1, CmRequest::CompleteConnect { connector: ca });

    // A responder that closes on S=1: the initiator retries once with Rev 1 and gets through.
    let mut net = Net::new();
    net.b_closes_on_enhanced = true;
    let (_, cb, connect, _) = offer(&mut net, b"retry");
    assert_eq!(
        net.req(
            Side::B,
            S1,
            CmRequest::Accept {
                connector: cb,
                limits: LIMITS_B,
                private_data: Bytes::new(),
                queue_pair: None
            }
        )
        .1
        .unwrap(),
        CmResponse::Done
    );
    assert_eq!(net.completed_status(Side::A, connect), Some(NdStatus::Success));
}

#[test]
fn responder_waits_five_seconds_for_the_request() {
    let mut net = Net::new();
    let listener = net.listen(Side::B, 7000, 0);
    let t0 = net.now;
    // A raw TCP connection that never sends the Request: accepted by the transport, then nothing.
    net.b.handle_transport(
        t0,
        TransportEvent::Accepted {
            listener,
            conn: ConnId(77),
            local: Net::addr(Side::B, 7000),
            remote: Net::addr(Side::A, 40000),
            mss: 1448,
        },
    );
    assert_eq!(net.b.poll_transport(), None);
    assert_eq!(net.b.poll_timeout(), Some(t0 + Duration::from_secs(5)));
    net.b.handle_timeout(t0 + Duration::from_millis(4999));
    assert_eq!(net.b.poll_transport(), None, "nothing before the deadline");
    net.b.handle_timeout(t0 + Duration::from_secs(5));
    assert_eq!(
        net.b.poll_transport(),
        Some(TransportCommand::Close {
            conn: ConnId(77),
            abort: true
        }),
        "the silent connection is reset at 5 s"
    );
    assert_eq!(net.b.poll_transport(), None);
    assert_eq!(net.b.poll_timeout(), None);
}

/// The responder timeout is the configured one (soft-rdmad `--mpa-timeout-ms`): a silent connection is reset
/// at that deadline, not before, and the default 5 s does not apply.
#[test]
fn the_configured_responder_timeout_applies() {
    let mut b = CmConfig::default_siw_compatible();
    b.mpa.request_timeout = Duration::from_millis(1000);
    let mut net = Net::with(CmConfig::default_siw_compatible(), b);
    let listener = net.listen(Side::B, 7000, 0);
    let t0 = net.now;
    net.b.handle_transport(
        t0,
        TransportEvent::Accepted {
            listener,
            conn: ConnId(78),
            local: Net::addr(Side::B, 7000),
            remote: Net::addr(Side::A, 40000),
            mss: 1448,
        },
    );
    assert_eq!(net.b.poll_timeout(), Some(t0 + Duration::from_millis(1000)));
    net.b.handle_timeout(t0 + Duration::from_millis(999));
    assert_eq!(net.b.poll_transport(), None, "nothing before the deadline");
    net.b.handle_timeout(t0 + Duration::from_millis(1000));
    assert_eq!(
        net.b.poll_transport(),
        Some(TransportCommand::Close {
            conn: ConnId(78),
            abort: true
        }),
        "the silent connection is reset at the configured 1 s"
    );
}

/// A thousand responders waiting for their Requests: the next deadline is always the earliest live one
/// (kept in an index, not found by scanning every connection on every event), a Request that arrives takes
/// its connection's deadline away, and each silent one closes at its own deadline.
#[test]
fn many_responder_deadlines() {
    let mut net = Net::new();
    let l = net.listen(Side::B, 7000, 0);
    let t0 = net.now;
    let ms = Duration::from_millis;
    let conn = |i: u64| ConnId(10_000 + i);
    for i in 0..1000u64 {
        net.b.handle_transport(
            t0 + ms(i),
            TransportEvent::Accepted {
                listener: l,
                conn: conn(i),
                local: Net::addr(Side::B, 7000),
                remote: Net::addr(Side::A, 40_000 + i as u16),
                mss: 1448,
            },
        );
    }
    assert_eq!(net.b.poll_timeout(), Some(t0 + ms(5000)));
    // Even-numbered initiators send their Request.
    let request = [&b"MPA ID Req Frame"[..], &[0x00, 1, 0, 2], b"hi"].concat();
    for i in (0..1000u64).step_by(2) {
        net.b.handle_transport(
            t0 + ms(1000),
            TransportEvent::Received {
                conn: conn(i),
                data: Bytes::from(request.clone()),
            },
        );
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
    let (notify, _) = net.req(Side::A, S1, CmRequest::NotifyDisconnect { connector: ca });
    let now = net.now;
    net.a.shutdown(now);
    net.pump();
    assert_eq!(
        net.completed_status(Side::A, notify),
        Some(NdStatus::DeviceRemoved)
    );
    assert_eq!(net.a.status().ports_in_use, 0);
}

#[test]
fn malformed_fpdu_after_connect_terminates() {
    let mut net = Net::new();
    let (ca, cb) = connected_pair(&mut net);
    let (notify_a, _) = net.req(Side::A, S1, CmRequest::NotifyDisconnect { connector: ca });
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
    net.b.handle_transport(
        net.now,
        TransportEvent::Received {
            conn: bconn,
            data: bad,
        },
    );
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
    assert_eq!(
        net.completed_status(Side::A, notify_a),
        Some(NdStatus::Success),
        "A sees the Terminate and the close"
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
        prop_assert_eq!(net.ok(Side::A, S1, CmRequest::GetReadLimits { connector: ca }), CmResponse::ReadLimits(ReadLimits { inbound: 2, outbound: 8 }));
    }
}

/// RFC 5044 §7.1.2: the initiator sends nothing between its Request and the Reply. Bytes that arrive after an
/// offer is out (queued, or taken by the application) reset the connection: a queued offer is withdrawn, a
/// taken one's Accept fails with CONNECTION_ABORTED, nothing is kept for later, and the 4-tuple is free again.
/// (The daemon once buffered such bytes without bound until the application accepted.)
#[test]
fn bytes_before_the_reply_reset_the_offer() {
    for taken in [false, true] {
        let mut net = Net::new();
        let l = net.listen(Side::B, 7000, 0);
        let (local, remote) = (Net::addr(Side::B, 7000), Net::addr(Side::A, 40000));
        let accepted = |conn| TransportEvent::Accepted {
            listener: l,
            conn,
            local,
            remote,
            mss: 1448,
        };
        let conn = ConnId(77);
        let now = net.now;
        net.b.handle_transport(now, accepted(conn));
        let request = [&b"MPA ID Req Frame"[..], &[0x00, 1, 0, 2], b"hi"].concat();
        net.b.handle_transport(
            now,
            TransportEvent::Received {
                conn,
                data: Bytes::from(request),
            },
        );
        let cb = net.connector(Side::B, S1);
        let gcr = CmRequest::GetConnectionRequest {
            listener: l,
            connector: cb,
        };
        if taken {
            assert!(matches!(
                net.ok(Side::B, S1, gcr.clone()),
                CmResponse::ConnectionRequest { .. }
            ));
        }
        let queued = |net: &Net| net.b.status().listeners[0].queued_offers;
        assert_eq!(queued(&net), u32::from(!taken));
        net.b.handle_transport(
            now,
            TransportEvent::Received {
                conn,
                data: Bytes::from_static(b"an FPDU before the Reply"),
            },
        );
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
            let accept = CmRequest::Accept {
                connector: cb,
                limits: LIMITS_B,
                private_data: Bytes::new(),
                queue_pair: None,
            };
            assert_eq!(net.status_of(Side::B, S1, accept), NdStatus::ConnectionAborted);
            net.ok(Side::B, S1, CmRequest::CloseConnector { connector: cb });
        } else {
            let (_, r) = net.req(Side::B, S1, gcr);
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
    let r = net.a.handle_request(
        now,
        S1,
        connect,
        CmRequest::Connect {
            connector: ca,
            remote,
            limits: LIMITS_A,
            private_data: Bytes::new(),
            shared_endpoint: None,
            queue_pair: None,
        },
    );
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
    net.a.handle_transport(
        now,
        TransportEvent::Received {
            conn,
            data: Bytes::from(bytes),
        },
    );
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
        let mut net = Net::new();
        let l = net.listen(Side::B, 7000, 0);
        let (local, remote) = (Net::addr(Side::B, 7000), Net::addr(Side::A, 40000));
        let conn = ConnId(78);
        let now = net.now;
        net.b.handle_transport(
            now,
            TransportEvent::Accepted {
                listener: l,
                conn,
                local,
                remote,
                mss: 1448,
            },
        );
        let request = [&b"MPA ID Req Frame"[..], &[0x00, 1, 0, 2], b"hi"].concat();
        net.b.handle_transport(
            now,
            TransportEvent::Received {
                conn,
                data: Bytes::from(request),
            },
        );
        let cb = net.connector(Side::B, S1);
        net.ok(
            Side::B,
            S1,
            CmRequest::GetConnectionRequest {
                listener: l,
                connector: cb,
            },
        );
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
    let mut net = Net::new();
    let l = net.listen(Side::B, 7000, 0);
    let closed = net.connector(Side::B, S1);
    let taker = net.connector(Side::B, S1);
    let (first, r) = net.req(
        Side::B,
        S1,
        CmRequest::GetConnectionRequest {
            listener: l,
            connector: closed,
        },
    );
    assert_eq!(r.unwrap(), CmResponse::Pending);
    net.ok(Side::B, S1, CmRequest::CloseConnector { connector: closed });
    assert_eq!(net.completed_status(Side::B, first), Some(NdStatus::Canceled));
    let (second, r) = net.req(
        Side::B,
        S1,
        CmRequest::GetConnectionRequest {
            listener: l,
            connector: taker,
        },
    );
    assert_eq!(r.unwrap(), CmResponse::Pending);
    let ca = net.connector(Side::A, S1);
    let (_, r) = net.req(
        Side::A,
        S1,
        CmRequest::Connect {
            connector: ca,
            remote: Net::addr(Side::B, 7000),
            limits: LIMITS_A,
            private_data: Bytes::from_static(b"x"),
            shared_endpoint: None,
            queue_pair: None,
        },
    );
    assert_eq!(r.unwrap(), CmResponse::Pending);
    match net.completion(Side::B, second) {
        Some(Ok(CmResponse::ConnectionRequest { connector, .. })) => assert_eq!(connector, taker),
        other => panic!("{other:?}"),
    }
}
