//! Who sees what in `status`, and the resource counters it carries.
//!
//! Decision (issue 22): a Status report lists every session's connectors, listeners and queue pairs only to
//! root and to members of the admin group (`--admin-group`, primary or supplementary group, checked once
//! per session from SO_PEERCRED and `/proc/<pid>/status`). Any other client sees the objects of the
//! sessions that run under its own uid (its own programs, including the `soft-rdma status` it runs), and
//! nothing of other users' connections: their peers' addresses, private-data sizes and read limits are
//! theirs. The daemon-wide totals (sessions, ports in use and free, shared endpoints' addresses, memory
//! regions, the transport, [`ResourceStatus`]) stay visible to everyone: a user needs them to see why a
//! limit refused it, and the kernel shows as much of its own sockets to every user (`ss -tln`).

use std::collections::HashMap;

use anyhow::Context;

use crate::engine::limits::ResourceStatus;
use crate::engine::requests::SessionId;
use crate::status::StatusReport;
use crate::uds::budget::Budget;
use crate::uds::server::Peer;

/// The gid of the admin group, if one is configured; an unknown group is an error at start.
pub fn admin_gid(group: Option<&str>) -> anyhow::Result<Option<u32>> {
    let Some(name) = group else { return Ok(None) };
    let g = nix::unistd::Group::from_name(name)?.with_context(|| format!("no group named {name}"))?;
    Ok(Some(g.gid.as_raw()))
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
}
