//! Connection management end to end: two real soft-rdmad daemons in a pair of network namespaces, driven
//! through the client library, one test per connector rule that can be provoked on a real network
//! (docs/connector-semantics.md). Needs root. Each test has its own namespaces. Sessions, ownership and the
//! daemon going away under its clients are in `local_clients.rs`.

use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

use soft_rdma::client::ConnectorState;
use soft_rdma::client::ReadLimits;
use soft_rdma::client::{Adapter, Connector, OfferDecision};
use soft_rdma::{Error, NdStatus};
use soft_rdma_common::wire::mpa::{MpaKind, MpaRepr};
use soft_rdma_tests::Side;
use soft_rdma_tests::ends::{self, Daemons, assert_steered, queued_offers, steering};
use soft_rdma_tests::ops::{err_status as status, eventually, registered, within_for};
use soft_rdma_tests::raw::{StreamEnd, stream_end};

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    within_for(Duration::from_secs(30), what, f).await
}

const LA: ReadLimits = ReadLimits {
    inbound: 4,
    outbound: 8,
};
const LB: ReadLimits = ReadLimits {
    inbound: 16,
    outbound: 2,
};

/// A connects to B at `remote` and B accepts; returns (active, passive) connected connectors. With the XDP
/// test transport, each XDP daemon's steering counters must show the connection.
async fn connect_pair(
    p: &Daemons,
    remote: SocketAddr,
    listener: &soft_rdma::client::Listener,
) -> (Connector, Connector) {
    let before = (steering(&p.a).await, steering(&p.b).await);
    let c = ends::connect_pair((&p.a, &p.b), remote, listener, (LA, LB)).await;
    assert_steered(&p.a, Side::A, before.0).await;
    assert_steered(&p.b, Side::B, before.1).await;
    c
}

#[tokio::test]
async fn connect_exchanges_private_data_limits_and_addresses() {
    let p = Daemons::start("conn", &[], &[]).await;
    let (l, bound) = p.listen_b(7100).await;
    assert_eq!(bound, p.net.addr(Side::B, 7100));
    let (ca, cb) = p.connectors().await;
    let pd: Vec<u8> = (0..32).collect();
    let before = (steering(&p.a).await, steering(&p.b).await);
    let (x, offer) = within("handshake", async {
        tokio::join!(
            async {
                ca.connect(bound, LA, &pd).await?;
                let seen = (ca.read_limits().await?, ca.private_data().await?);
                ca.complete_connect().await?;
                Ok::<_, Error>(seen)
            },
            async {
                let offer = l.get_connection_request(&cb).await?;
                cb.accept(LB, b"accepted by B").await?;
                Ok::<_, Error>(offer)
            }
        )
    })
    .await;
    let (a_limits, a_pd) = x.unwrap();
    let offer = offer.unwrap();
    assert_steered(&p.a, Side::A, before.0).await;
    assert_steered(&p.b, Side::B, before.1).await;
    assert_eq!(offer.private_data.as_ref(), &pd[..]);
    assert_eq!(
        offer.limits,
        ReadLimits {
            inbound: 8,
            outbound: 4
        },
        "A's 4/8 in B's view"
    );
    assert_eq!(a_pd.as_ref(), b"accepted by B");
    // B accepted with IRD 16 / ORD 2, limited to A's offer before it went out (IND2Connector::Accept, seed
    // 004): A may issue 8 (not 16) and serves 2.
    assert_eq!(
        a_limits,
        ReadLimits {
            inbound: 2,
            outbound: 8
        }
    );
    let a_local = ca.local_addr().await.unwrap();
    assert_eq!(a_local.ip(), IpAddr::V4(p.net.ipv4(Side::A)));
    assert!(
        (49152..=65535).contains(&a_local.port()),
        "implicit bind: {a_local}"
    );
    assert_eq!(cb.peer_addr().await.unwrap(), a_local);
    assert_eq!(ca.peer_addr().await.unwrap(), bound);
    assert_eq!(cb.local_addr().await.unwrap(), bound);
    // GetPrivateData into a short buffer: BUFFER_OVERFLOW with the required size, buffer filled.
    let mut small = [0u8; 4];
    let e = ca.read_private_data(&mut small).await.unwrap_err();
    assert_eq!((e.status, e.required_size), (NdStatus::BufferOverflow, Some(13)));
    assert_eq!(&small, b"acce");
    let st = p.a.status().await.unwrap();
    let c = st.connectors.iter().find(|c| c.id == ca.id().0).unwrap();
    assert_eq!(
        (c.inbound_read_limit, c.outbound_read_limit, c.mpa_revision),
        (Some(2), Some(8), Some(2))
    );
}

/// IND2Connector::Accept (seed 004) between two daemons: the connecting side's GetReadLimits never reports
/// more than it offered (IRD 4 / ORD 8), whether the listener asks to serve more (16/2) or to issue more
/// (2/16), with MPA Rev 2 (the IRD/ORD word) and Rev 1 (no word: each side keeps its own values).
#[tokio::test]
async fn accept_limits_never_exceed_the_connecting_peers_offer() {
    for (tag, a_args, rev) in [("lim2", &[][..], 2u8), ("lim1", &["--mpa-rev1"][..], 1)] {
        let p = Daemons::start(tag, a_args, &[]).await;
        let (l, bound) = p.listen_b(7100).await;
        for (listener, a_sees, b_effective) in [
            (LB, (2, 8), (8, 2)),
            (
                ReadLimits {
                    inbound: 2,
                    outbound: 16,
                },
                (4, 2),
                (2, 4),
            ),
        ] {
            let (a_sees, b_effective) = if rev == 1 {
                ((LA.inbound, LA.outbound), (listener.inbound, listener.outbound))
            } else {
                (a_sees, b_effective)
            };
            let (ca, cb) = p.connectors().await;
            let (seen, accepted) = within("connect + accept", async {
                tokio::join!(
                    async {
                        ca.connect(bound, LA, b"limits").await?;
                        let seen = ca.read_limits().await?;
                        ca.complete_connect().await?;
                        Ok::<_, Error>(seen)
                    },
                    async {
                        l.get_connection_request(&cb).await?;
                        cb.accept(listener, b"").await
                    }
                )
            })
            .await;
            accepted.unwrap();
            let seen = seen.unwrap();
            assert_eq!(
                (seen.inbound, seen.outbound),
                a_sees,
                "MPA rev {rev}, listener {listener:?}: A's GetReadLimits"
            );
            let st = p.b.status().await.unwrap();
            let c = st.connectors.iter().find(|c| c.id == cb.id().0).unwrap();
            assert_eq!(
                (c.inbound_read_limit, c.outbound_read_limit, c.mpa_revision),
                (Some(b_effective.0), Some(b_effective.1), Some(rev)),
                "MPA rev {rev}, listener {listener:?}: B's effective limits"
            );
            ca.disconnect().await.unwrap();
        }
    }
}

/// IND2Connector::NotifyDisconnect on a connector whose connection has already ended completes at once
/// (the disconnect happened), on the side that was disconnected and on the side that disconnected;
/// a connector that never connected still gets CONNECTION_INVALID.
#[tokio::test]
async fn notify_disconnect_after_the_end_completes_at_once() {
    let p = Daemons::start("ndend", &[], &[]).await;
    let (l, bound) = p.listen_b(7100).await;
    let (ca, cb) = connect_pair(&p, bound, &l).await;
    ca.disconnect().await.unwrap();
    // Pending until the FIN arrives, or at once if it already has: either way it completes.
    within("B's NotifyDisconnect", cb.notify_disconnect())
        .await
        .unwrap();
    // Both connections have ended: a new NotifyDisconnect completes at once on each side.
    within("B's NotifyDisconnect after the end", cb.notify_disconnect())
        .await
        .unwrap();
    within(
        "A's NotifyDisconnect after its Disconnect",
        ca.notify_disconnect(),
    )
    .await
    .unwrap();
    let never = p.a.create_connector().await.unwrap();
    assert_eq!(
        status(never.notify_disconnect().await),
        NdStatus::ConnectionInvalid
    );
}

#[tokio::test]
async fn ipv6_connection() {
    let p = Daemons::start("ip6", &[], &[]).await;
    let l = p.b.create_listener().await.unwrap();
    let bound = l
        .listen(SocketAddr::new(IpAddr::V6(p.net.ipv6(Side::B)), 7100), 0)
        .await
        .unwrap();
    let (ca, _cb) = connect_pair(&p, bound, &l).await;
    assert_eq!(
        ca.local_addr().await.unwrap().ip(),
        IpAddr::V6(p.net.ipv6(Side::A))
    );
}

#[tokio::test]
async fn adapter_caps_read_limits() {
    let p = Daemons::start("caps", &[], &[]).await;
    let (l, bound) = p.listen_b(7100).await;
    let (ca, cb) = p.connectors().await;
    let big = ReadLimits {
        inbound: 100_000,
        outbound: 0x3FFF,
    };
    let (x, y) = within("handshake", async {
        tokio::join!(
            async {
                ca.connect(bound, big, b"").await?;
                let seen = ca.read_limits().await?;
                ca.complete_connect().await.map(|_| seen)
            },
            async {
                let o = l.get_connection_request(&cb).await?;
                cb.accept(big, b"").await.map(|_| o)
            }
        )
    })
    .await;
    assert_eq!(
        x.unwrap(),
        ReadLimits {
            inbound: 128,
            outbound: 128
        },
        "capped at the adapter's 128"
    );
    assert_eq!(
        y.unwrap().limits,
        ReadLimits {
            inbound: 128,
            outbound: 128
        }
    );
}

#[tokio::test]
async fn reject_and_refusals() {
    let p = Daemons::start("rej", &[], &[]).await;
    // Handler-style listener refusing with private data (TDI ClientEventConnect).
    let (l, bound) = p.listen_b(7100).await;
    let b = p.b.clone();
    let server = tokio::spawn(async move {
        let _ = l
            .serve(
                &b,
                |_| OfferDecision::Refuse {
                    private_data: bytes::Bytes::from_static(b"busy"),
                },
                |_, _| {},
            )
            .await;
    });
    let c = p.a.create_connector().await.unwrap();
    assert_eq!(
        status(within("refused", c.connect(bound, LA, b"?")).await),
        NdStatus::ConnectionRefused
    );
    assert_eq!(c.private_data().await.unwrap().as_ref(), b"busy");
    server.abort();
    // No listener at all.
    let c = p.a.create_connector().await.unwrap();
    assert_eq!(
        status(within("no listener", c.connect(p.net.addr(Side::B, 7999), LA, b"")).await),
        NdStatus::ConnectionRefused
    );
    // Backlog 1: the first offer waits in the queue, the second is refused.
    let l = p.b.create_listener().await.unwrap();
    let bound = l.listen(p.net.addr(Side::B, 7101), 1).await.unwrap();
    let first = std::sync::Arc::new(p.a.create_connector().await.unwrap());
    let pending = tokio::spawn({
        let first = first.clone();
        async move { first.connect(bound, LA, b"1").await }
    });
    // The event itself: B's listener holds the first offer in its queue.
    eventually("the first offer queued at B", async || {
        (queued_offers(&p.b.status().await.unwrap(), bound) == Some(1)).then_some(())
    })
    .await;
    let second = p.a.create_connector().await.unwrap();
    assert_eq!(
        status(within("backlog", second.connect(bound, LA, b"2")).await),
        NdStatus::ConnectionRefused
    );
    // The refused connect gave its port back; the one port in use is the queued connect's.
    let st = p.a.status().await.unwrap();
    let queued = st.connectors.iter().find(|c| c.id == first.id().0).unwrap();
    assert_eq!(
        (st.ports_in_use, queued.state, queued.local.is_some()),
        (1, ConnectorState::Connecting, true),
        "only the queued connect holds a port: {st:?}"
    );
    pending.abort();
}

#[tokio::test]
async fn blackholed_destination_times_out() {
    let p = Daemons::start("tmo", &["--connect-timeout-ms", "1500"], &[]).await;
    let c = p.a.create_connector().await.unwrap();
    assert_eq!(
        status(within("timeout", c.connect(p.net.blackhole(7000), LA, b"")).await),
        NdStatus::IoTimeout
    );
    // What ended it: the transport's connect timer, set to the configured 1.5 s (the kernel transport's unit
    // tests prove that it fires at that deadline and not before).
    let log = p.da.log_text();
    assert!(
        log.lines().any(|l| l.contains("connect failed")
            && l.contains("reason=TimedOut")
            && l.contains("timeout=1.5s")),
        "soft-rdmad's log names the configured connect timer:\n{log}"
    );
    assert_eq!(p.a.status().await.unwrap().ports_in_use, 0);
}

#[tokio::test]
async fn unreachable_destinations() {
    let p = Daemons::start("unr", &[], &[]).await;
    let c = p.a.create_connector().await.unwrap();
    assert_eq!(
        status(within("no route", c.connect(p.net.unroutable(7000), LA, b"")).await),
        NdStatus::NetworkUnreachable
    );
    let c = p.a.create_connector().await.unwrap();
    let host = p.net.unreachable_host(7000);
    assert_eq!(
        status(within("unreachable route", c.connect(host, LA, b"")).await),
        NdStatus::HostUnreachable
    );
    assert_eq!(p.a.status().await.unwrap().ports_in_use, 0);
}

#[tokio::test]
async fn ports_sharing_violation_host_collisions_and_exhaustion() {
    // This session takes the whole ephemeral range: its share (README "Limits") is all of it here.
    let whole_range = [
        "--max-ephemeral-ports-per-session",
        "16384",
        "--max-ports-per-session",
        "16400",
    ];
    let p = Daemons::start("port", &whole_range, &[]).await;
    let (c1, c2) = (
        p.a.create_connector().await.unwrap(),
        p.a.create_connector().await.unwrap(),
    );
    let local = p.net.addr(Side::A, 6000);
    c1.bind(local).await.unwrap();
    assert_eq!(status(c2.bind(local).await), NdStatus::SharingViolation);
    // A port soft-rdma holds is held in the host stack too: a host application cannot take it.
    let host_bind = p
        .net
        .in_ns(Side::A, move || std::net::TcpListener::bind(local).map(|_| ()));
    assert_eq!(host_bind.unwrap_err().kind(), std::io::ErrorKind::AddrInUse);
    // And a port a host application holds is a SHARING_VIOLATION for soft-rdma.
    let held = p.net.addr(Side::A, 6001);
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let ns_thread = p.net.spawn_in_ns(Side::A, move || {
        let _l = std::net::TcpListener::bind(held).unwrap();
        tx.send(()).unwrap();
        let _ = stop_rx.recv();
    });
    rx.recv().unwrap();
    assert_eq!(status(c2.bind(held).await), NdStatus::SharingViolation);
    stop_tx.send(()).unwrap();
    ns_thread.join().unwrap();
    // An address that is not this host's.
    assert_eq!(
        status(c2.bind(p.net.addr(Side::B, 6002)).await),
        NdStatus::InvalidAddress
    );
    // Exhaust all 16,384 ephemeral ports, then recover.
    let any = SocketAddr::new(IpAddr::V4(p.net.ipv4(Side::A)), 0);
    let mut held = Vec::new();
    for _ in 0..16_384 {
        let c = p.a.create_connector().await.unwrap();
        let bound = c.bind(any).await.unwrap();
        assert!((49152..=65535).contains(&bound.port()));
        held.push(c);
    }
    let extra = p.a.create_connector().await.unwrap();
    assert_eq!(status(extra.bind(any).await), NdStatus::TooManyAddresses);
    // A Connect without Bind binds implicitly: the same answer, before anything reaches the network.
    let implicit = p.a.create_connector().await.unwrap();
    assert_eq!(
        status(implicit.connect(p.net.addr(Side::B, 6003), LA, b"").await),
        NdStatus::TooManyAddresses
    );
    drop(held.pop());
    // The drop's close goes out on the session before the Bind below, and a session's requests are handled
    // in order: the port is free by then.
    extra.bind(any).await.unwrap();
}

#[tokio::test]
async fn shared_endpoint_fan_out_and_duplicate_tuple() {
    let p = Daemons::start("shep", &[], &[]).await;
    let ep =
        p.a.create_shared_endpoint(SocketAddr::new(IpAddr::V4(p.net.ipv4(Side::A)), 0))
            .await
            .unwrap();
    let mut locals = Vec::new();
    let mut keep = Vec::new();
    for port in 7100..7103 {
        let (l, dest) = p.listen_b(port).await;
        let (ca, cb) = p.connectors().await;
        let (x, y) = within("fan-out", async {
            tokio::join!(
                async {
                    ca.connect_with_shared_endpoint(&ep, dest, LA, b"").await?;
                    ca.complete_connect().await
                },
                async {
                    l.get_connection_request(&cb).await?;
                    cb.accept(LB, b"").await
                }
            )
        })
        .await;
        x.unwrap();
        y.unwrap();
        locals.push(ca.local_addr().await.unwrap());
        keep.push((l, ca, cb));
    }
    assert!(
        locals.windows(2).all(|w| w[0].port() == w[1].port()),
        "{locals:?}"
    );
    let dup = p.a.create_connector().await.unwrap();
    assert_eq!(
        status(
            dup.connect_with_shared_endpoint(&ep, p.net.addr(Side::B, 7100), LA, b"")
                .await
        ),
        NdStatus::AddressAlreadyExists
    );
}

#[tokio::test]
async fn cancelled_connect_aborts_the_accept() {
    let p = Daemons::start("abrt", &[], &[]).await;
    let (l, bound) = p.listen_b(7100).await;
    let (ca, cb) = p.connectors().await;
    let ca = std::sync::Arc::new(ca);
    let ca2 = ca.clone();
    let connect = tokio::spawn(async move { ca2.connect(bound, LA, b"").await });
    within("offer", l.get_connection_request(&cb)).await.unwrap();
    ca.cancel().await.unwrap();
    assert_eq!(status(connect.await.unwrap()), NdStatus::Canceled);
    // No wait for A's close to reach B: if it is in first, the Accept finds the offer abandoned; if the
    // Accept is first, it waits for A's first message, and A's close completes it. ConnectionAborted both ways.
    assert_eq!(
        status(within("Accept of an abandoned offer", cb.accept(LB, b"")).await),
        NdStatus::ConnectionAborted
    );
}

#[tokio::test]
async fn connection_invalid_active_and_buffer_sizes() {
    let p = Daemons::start("inv", &[], &[]).await;
    let idle = p.a.create_connector().await.unwrap();
    assert_eq!(status(idle.complete_connect().await), NdStatus::ConnectionInvalid);
    assert_eq!(status(idle.peer_addr().await), NdStatus::ConnectionInvalid);
    assert_eq!(status(idle.disconnect().await), NdStatus::ConnectionInvalid);
    let (l, bound) = p.listen_b(7100).await;
    let max = p.a.info().max_caller_data as usize;
    assert_eq!(max, 252);
    assert_eq!(
        status(idle.connect(bound, LA, &vec![1; max + 1]).await),
        NdStatus::InvalidBufferSize
    );
    let (ca, cb) = p.connectors().await;
    let full = vec![7; max];
    let (x, y) = within("max private data", async {
        tokio::join!(
            async {
                ca.connect(bound, LA, &full).await?;
                ca.complete_connect().await
            },
            async {
                let o = l.get_connection_request(&cb).await?;
                assert_eq!(
                    status(cb.accept(LB, &vec![1; max + 1]).await),
                    NdStatus::InvalidBufferSize
                );
                cb.accept(LB, &vec![9; max]).await.map(|_| o)
            }
        )
    })
    .await;
    x.unwrap();
    assert_eq!(
        y.unwrap().private_data.as_ref(),
        &vec![7u8; max][..],
        "MaxCallerData bytes arrive intact"
    );
    assert_eq!(ca.private_data().await.unwrap().as_ref(), &vec![9u8; max][..]);
    assert_eq!(
        status(ca.connect(bound, LA, b"").await),
        NdStatus::ConnectionActive
    );
    assert_eq!(status(cb.accept(LB, b"").await), NdStatus::ConnectionActive);
}

#[tokio::test]
async fn disconnect_notifies_the_peer() {
    let p = Daemons::start("disc", &[], &[]).await;
    let (l, bound) = p.listen_b(7100).await;
    let (ca, cb) = connect_pair(&p, bound, &l).await;
    let notify = registered(&p.b, cb.notify_disconnect()).await;
    ca.disconnect().await.unwrap();
    within("NotifyDisconnect", notify).await.unwrap();
    assert_eq!(
        status(ca.connect(bound, LA, b"").await),
        NdStatus::ConnectionInvalid,
        "not reusable"
    );
    drop(ca);
    eventually("A's port released", async || {
        (p.a.status().await.unwrap().ports_in_use == 0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_closed_session_releases_everything() {
    let p = Daemons::start("sess", &[], &[]).await;
    let (l, bound) = p.listen_b(7100).await;
    let other = Adapter::open(p.da.uds_path()).await.unwrap();
    let c = other.create_connector().await.unwrap();
    let pending = tokio::spawn(async move { c.connect(bound, LA, b"").await });
    let cb = p.b.create_connector().await.unwrap();
    within("offer", l.get_connection_request(&cb)).await.unwrap();
    assert_eq!(p.a.status().await.unwrap().ports_in_use, 1);
    pending.abort();
    drop(other);
    // Mid-handshake session gone: nothing left.
    eventually("the closed session's connector and port released", async || {
        let st = p.a.status().await.unwrap();
        (st.ports_in_use, st.connectors.len()).eq(&(0, 0)).then_some(())
    })
    .await;
    assert_eq!(status(cb.accept(LB, b"").await), NdStatus::ConnectionAborted);
}

/// A peer speaking MPA Rev 1 (RFC 5044, no IRD/ORD word) gets a Rev 1 Reply.
#[tokio::test]
async fn mpa_revision_one_peer() {
    let p = Daemons::start("rev1", &[], &[]).await;
    let (l, bound) = p.listen_b(7100).await;
    let peer = p.net.spawn_in_ns(Side::A, {
        move || {
            let mut s = ends::rev1_initiator(bound, b"old peer");
            let mut reply = vec![0u8; 20 + 5];
            s.read_exact(&mut reply).unwrap();
            reply
        }
    });
    let cb = p.b.create_connector().await.unwrap();
    let offer = within("Rev 1 offer", l.get_connection_request(&cb))
        .await
        .unwrap();
    assert_eq!(offer.private_data.as_ref(), b"old peer");
    assert_eq!(
        offer.limits,
        ReadLimits {
            inbound: 128,
            outbound: 128
        },
        "no limits from a Rev 1 peer: the adapter's"
    );
    cb.accept(LB, b"hello").await.unwrap();
    let reply = peer.join().unwrap();
    let r = MpaRepr::parse(&reply).unwrap();
    assert_eq!(
        (r.kind, r.revision, r.enhanced, r.reject, r.private_data),
        (MpaKind::Reply, 1, None, false, &b"hello"[..])
    );
}

/// A raw TCP client that sends nothing is dropped after the responder timeout, with a reset (the daemon
/// aborts a connection that never sent its MPA Request: RFC 5044 §7.1 leaves the responder free to close
/// it); the listener keeps serving.
#[tokio::test]
async fn silent_client_is_dropped_and_service_continues() {
    let p = Daemons::start("mtmo", &[], &["--mpa-timeout-ms", "1000"]).await;
    let (l, bound) = p.listen_b(7100).await;
    let ended = p.net.in_ns(Side::A, move || {
        let mut s = TcpStream::connect(bound).unwrap();
        // The configured 1 s plus a margin for a loaded machine: past it, the read ends in WouldBlock, which
        // `stream_end` reports as "still open", a failure.
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut b = [0u8; 1];
        stream_end(s.read(&mut b))
    });
    assert_eq!(
        ended,
        StreamEnd::Reset,
        "how the daemon dropped the silent client"
    );
    // Why: the responder timeout (the engine's unit tests prove it fires at the configured deadline, not
    // before).
    let log = p.db.log_text();
    assert!(
        log.lines().any(
            |l| l.contains("no MPA Request within the responder timeout; closing")
                && l.contains("timeout=1s")
        ),
        "soft-rdmad B's log gives its configured responder timeout (1 s) as the cause:\n{log}"
    );
    connect_pair(&p, bound, &l).await;
}

/// A listener restarted on its port gets it back at once, although the local connections of the one before
/// (the host to its own address: kernel TCP, in XDP mode too) left the port's server side in TIME_WAIT. As
/// siw's listeners (SO_REUSEADDR); rdma-core's own test suite restarts its servers on one port this way.
#[tokio::test]
async fn a_listener_restarted_after_local_connections_gets_its_port_back() {
    let p = Daemons::start("relisten", &[], &[]).await;
    for round in 0..3 {
        let (l, bound) = p.listen_b(7100).await;
        // B connects to its own address; the passive side hangs up first, so that the server's end of the
        // kernel connection (local port 7100) is the one left in TIME_WAIT.
        let (active, passive) = ends::connect_pair((&p.b, &p.b), bound, &l, (LA, LB)).await;
        let notify = registered(&p.b, active.notify_disconnect()).await;
        passive.disconnect().await.unwrap();
        within("the active side's NotifyDisconnect", notify)
            .await
            .unwrap();
        drop((active, passive, l));
        eventually(&format!("round {round}: B's ports released"), async || {
            (p.b.status().await.unwrap().ports_in_use == 0).then_some(())
        })
        .await;
    }
}
