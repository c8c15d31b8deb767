//! Connector rules: connect, accept, reject, limits and private data, ports and shared endpoints, objects
//! and sessions (docs/connector-semantics.md).

use super::*;
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
    refused_and_timed_out_connects(&mut net);
    assert_eq!(net.a.status().ports_in_use, 0);
}

/// A's connect to a port nobody listens on is CONNECTION_REFUSED; one to a host that never answers, IO_TIMEOUT.
fn refused_and_timed_out_connects(net: &mut Net) {
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

/// The metrics' setup counters: each setup counted once on each side it reaches, by how it ended, and the
/// active side's established ones timed (the test's clock moves only when it says so).
#[test]
fn setups_are_counted_by_side_and_outcome() {
    use crate::engine::counters::{SetupOutcome as O, Side as S};
    let mut net = Net::new();
    connected_pair(&mut net);
    let (a, b) = (net.a.counters(), net.b.counters());
    assert_eq!((a.attempts(S::Active), a.outcomes(S::Active, O::Established)), (1, 1));
    assert_eq!(a.setup_times().count(), 1);
    assert_eq!(a.setup_times().sum(), Duration::ZERO, "the test's clock did not move");
    assert_eq!((b.attempts(S::Passive), b.outcomes(S::Passive, O::Established)), (1, 1));
    assert_eq!(b.attempts(S::Active), 0);

    let mut net = Net::new();
    let (_ca, cb, connect, _) = offer(&mut net, b"no");
    net.ok_b(CmRequest::Reject {
        connector: cb,
        private_data: Bytes::new(),
    });
    net.assert_completed(Side::A, connect, NdStatus::ConnectionRefused, "");
    refused_and_timed_out_connects(&mut net);
    let a = net.a.counters();
    let active = |o| a.outcomes(S::Active, o);
    assert_eq!(a.attempts(S::Active), 3);
    assert_eq!([O::Rejected, O::Refused, O::TimedOut].map(active), [1, 1, 1]);
    assert_eq!(
        [O::Established, O::Failed].map(active),
        [0, 0],
        "each ended once, by its own outcome"
    );
    assert_eq!(a.setup_times().count(), 0, "only established setups are timed");
    let b = net.b.counters();
    assert_eq!((b.attempts(S::Passive), b.outcomes(S::Passive, O::Rejected)), (1, 1));
}
