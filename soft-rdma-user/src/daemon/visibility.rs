//! Who sees what in `status`, and the resource counters it carries.
//!
//! Decision (issue 22): a Status report lists every session's connectors, listeners and queue pairs only to
//! root and to members of the admin group (`--admin-group`, primary or supplementary group, checked once
//! per session from SO_PEERCRED and `/proc/<pid>/status`). Any other client sees the objects of the
//! sessions that run under its own uid (its own programs, including the `soft-rdma status` it runs), and
//! nothing of other users' connections: their peers' addresses, private-data sizes and read limits are
//! theirs, and so are XDP mode's TCP connections to them (a user sees those of the connectors it sees).
//! The daemon-wide totals (sessions, ports in use and free, shared endpoints' addresses, memory
//! regions, the transport's counters, [`ResourceStatus`]) stay visible to everyone: a user needs them to see why a
//! limit refused it, and the kernel shows as much of its own sockets to every user (`ss -tln`).

use std::collections::HashMap;

use crate::engine::limits::ResourceStatus;
use crate::engine::requests::SessionId;
use crate::status::StatusReport;
use crate::uds::budget::Budget;
use crate::uds::server::Peer;

/// The gid of the admin group, if one is configured; an unknown group is an error at start.
pub fn admin_gid(group: Option<&str>) -> anyhow::Result<Option<u32>> {
    group.map(crate::uds::server::group_gid).transpose()
}

/// The budget's counters, with the daemon's resident memory.
pub fn resources(budget: &Budget) -> ResourceStatus {
    ResourceStatus {
        resident_bytes: resident_bytes(),
        ..budget.status()
    }
}

/// VmRSS from `/proc/self/status`.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let kib: u64 = line.trim().trim_end_matches("kB").trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// Leaves in `report` only what the session that asked for it may see (module documentation).
pub fn restrict(report: &mut StatusReport, asker: SessionId, peers: &HashMap<SessionId, Peer>) {
    let me = peers.get(&asker).copied().unwrap_or_default();
    if me.sees_all {
        return;
    }
    let visible = |session: u64| {
        session == asker.0
            || (me.uid.is_some() && peers.get(&SessionId(session)).is_some_and(|p| p.uid == me.uid))
    };
    report.connectors.retain(|c| visible(c.session));
    report.listeners.retain(|l| visible(l.session));
    report.queue_pairs.retain(|q| visible(q.session));
    // XDP mode's TCP connections carry peers' addresses too: those of the connectors it may see.
    if let Some(t) = report.transport.as_mut()
        && let Some(conns) = t.tcp_connections.as_mut()
    {
        let mine: std::collections::HashSet<_> = report
            .connectors
            .iter()
            .filter_map(|c| Some((c.local?, c.peer?)))
            .collect();
        conns.retain(|t| mine.contains(&(t.local, t.remote)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::requests::{ConnectorState, ConnectorStatus};

    fn connector(id: u64, session: u64) -> ConnectorStatus {
        ConnectorStatus {
            id,
            session,
            state: ConnectorState::Idle,
            local: None,
            peer: None,
            inbound_read_limit: None,
            outbound_read_limit: None,
            peer_private_data_len: None,
            mpa_revision: None,
            tcp: None,
        }
    }

    #[test]
    fn users_see_their_own_uid_and_admins_see_everything() {
        let peers: HashMap<SessionId, Peer> = [
            (
                SessionId(1),
                Peer {
                    pid: None,
                    uid: Some(0),
                    sees_all: true,
                },
            ),
            (
                SessionId(2),
                Peer {
                    pid: None,
                    uid: Some(1000),
                    sees_all: false,
                },
            ),
            (
                SessionId(3),
                Peer {
                    pid: None,
                    uid: Some(1000),
                    sees_all: false,
                },
            ),
            (
                SessionId(4),
                Peer {
                    pid: None,
                    uid: Some(1001),
                    sees_all: false,
                },
            ),
        ]
        .into();
        let report = StatusReport {
            connectors: (1..=4).map(|s| connector(10 + s, s)).collect(),
            sessions: 4,
            ..StatusReport::default()
        };
        let seen = |asker| {
            let mut r = report.clone();
            restrict(&mut r, SessionId(asker), &peers);
            (
                r.connectors.iter().map(|c| c.session).collect::<Vec<_>>(),
                r.sessions,
            )
        };
        assert_eq!(seen(1), (vec![1, 2, 3, 4], 4), "root");
        assert_eq!(
            seen(2),
            (vec![2, 3], 4),
            "uid 1000: both of its sessions, the totals"
        );
        assert_eq!(seen(4), (vec![4], 4), "uid 1001");
        // A session without credentials sees only itself.
        let mut r = report.clone();
        restrict(&mut r, SessionId(9), &peers);
        assert!(r.connectors.is_empty());
    }

    #[test]
    fn xdp_mode_tcp_connections_follow_the_connectors_a_user_sees() {
        use crate::transport::status::{TcpConnectionStatus, TransportStatus};
        let addr = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
        let peers: HashMap<SessionId, Peer> = [(1, 1000, false), (2, 1001, false), (3, 0, true)]
            .map(|(s, uid, sees_all)| {
                let peer = Peer {
                    pid: None,
                    uid: Some(uid),
                    sees_all,
                };
                (SessionId(s), peer)
            })
            .into();
        let with = |c: ConnectorStatus, local: &str, peer: &str| ConnectorStatus {
            local: Some(addr(local)),
            peer: Some(addr(peer)),
            ..c
        };
        let tcp = |local: &str, remote: &str| TcpConnectionStatus {
            local: addr(local),
            remote: addr(remote),
            state: "ESTABLISHED".into(),
        };
        let report = StatusReport {
            connectors: vec![
                with(connector(11, 1), "10.0.0.1:49152", "10.0.0.2:7000"),
                with(connector(12, 2), "10.0.0.1:49153", "10.0.0.3:7000"),
            ],
            transport: Some(TransportStatus {
                tcp_connections: Some(vec![
                    tcp("10.0.0.1:49152", "10.0.0.2:7000"),
                    tcp("10.0.0.1:49153", "10.0.0.3:7000"),
                    tcp("10.0.0.1:7100", "10.0.0.4:50000"),
                ]),
                ..TransportStatus::default()
            }),
            ..StatusReport::default()
        };
        let remotes = |asker| {
            let mut r = report.clone();
            restrict(&mut r, SessionId(asker), &peers);
            let conns = r.transport.unwrap().tcp_connections.unwrap();
            conns.iter().map(|c| c.remote.to_string()).collect::<Vec<_>>()
        };
        assert_eq!(
            remotes(1),
            ["10.0.0.2:7000"],
            "uid 1000: its connector's connection"
        );
        assert_eq!(remotes(2), ["10.0.0.3:7000"], "uid 1001");
        assert_eq!(remotes(3).len(), 3, "root: every connection, a lingering one too");
    }
}
