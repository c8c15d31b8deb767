//! What the event loop publishes for the metrics endpoint: a [`Snapshot`] of its daemon-wide figures,
//! copied from the engine, the UDS server's budget, the shared rings and the transport at one moment. Plain
//! numbers the HTTP thread encodes on its own; nothing in it names a session, a user, a peer or an address.

use crate::engine::counters::{Direction, EngineGauges, SetupOutcome, SetupTimes, Side, TerminateKind};
use crate::engine::limits::{Limit, Limits, ResourceStatus};
use crate::engine::traffic::OpTraffic;
use crate::transport::status::XskQueueStatus;
use crate::transport::xdp::OwnTcpTotals;

use super::super::{Daemon, Transport, visibility};

/// See the module documentation.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Where established connections' data path runs: in the clients (kernel mode's hand-off) or here.
    pub(super) data_path_in_clients: bool,
    pub(super) gauges: EngineGauges,
    /// By [`Side`].
    pub(super) setup_attempts: [u64; 2],
    /// By [`Side`], then [`SetupOutcome`].
    pub(super) setups: [[u64; SetupOutcome::ALL.len()]; 2],
    pub(super) setup_times: SetupTimes,
    /// By [`Direction`], then [`TerminateKind`].
    pub(super) terminates: [[u64; TerminateKind::ALL.len()]; 2],
    pub(super) traffic: OpTraffic,
    pub(super) fpdus_without_queue_pair: u64,
    pub(super) resources: ResourceStatus,
    pub(super) limits: Limits,
    /// By [`Limit`].
    pub(super) limit_hits: [u64; Limit::ALL.len()],
    /// XDP mode only.
    pub(super) xdp: Option<XdpFigures>,
}

/// XDP mode's figures: the program's counters and the TCP budget's (by the names `status` gives them), the
/// AF_XDP sockets', and the own TCP's totals (`None` on smoltcp's socket).
#[derive(Clone, Debug, Default)]
pub(super) struct XdpFigures {
    pub(super) counters: Vec<(String, u64)>,
    pub(super) queues: Vec<XskQueueStatus>,
    pub(super) own_tcp: Option<OwnTcpTotals>,
}

impl XdpFigures {
    /// The counter named `name` (0 if the transport has none by that name).
    pub(super) fn counter(&self, name: &str) -> u64 {
        self.counters
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, v)| *v)
    }
}

impl Daemon {
    /// The figures the metrics endpoint shows, now. Costs a pass over the connectors and queue pairs; the
    /// HTTP thread asks for it a few times a second at most.
    pub(in crate::daemon) fn metrics_snapshot(&self) -> Snapshot {
        let c = self.rnic.counters();
        let xdp = match &self.transport {
            Transport::Kernel(_) => None,
            Transport::Xdp(t) => Some(XdpFigures {
                counters: t.counters().into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
                queues: t.queues(),
                own_tcp: t.own_tcp_totals(),
            }),
        };
        let mut s = Snapshot {
            data_path_in_clients: self.rnic.config().hand_off,
            gauges: self.rnic.gauges(),
            setup_times: c.setup_times().clone(),
            traffic: self.rnic.traffic(),
            fpdus_without_queue_pair: self.rnic.fpdus_without_queue_pair(),
            resources: visibility::resources(&self.budget),
            limits: self.budget.limits().clone(),
            ..Snapshot::default()
        };
        for side in Side::ALL {
            s.setup_attempts[side as usize] = c.attempts(side);
            for outcome in SetupOutcome::ALL {
                s.setups[side as usize][outcome as usize] = c.outcomes(side, outcome);
            }
        }
        for direction in Direction::ALL {
            for kind in TerminateKind::ALL {
                s.terminates[direction as usize][kind as usize] = c.terminates(direction, kind);
            }
        }
        for limit in Limit::ALL {
            s.limit_hits[limit as usize] = self.rnic.limit_hits(limit)
                + self.budget.limit_hits().get(limit)
                + self.rings.limit_hits().get(limit)
                + xdp.as_ref().map_or(0, |x| tcp_limit_hits(x, limit));
        }
        s.xdp = xdp;
        s
    }
}

/// The XDP transport's TCP bounds count their hits themselves (`status` shows them): refused SYNs and
/// connects past `max_tcp_connections`, buffers that could not grow past `max_tcp_buffer_bytes`.
fn tcp_limit_hits(x: &XdpFigures, limit: Limit) -> u64 {
    match limit {
        Limit::TcpConnections => x.counter("tcp_refused_syns") + x.counter("tcp_refused_connects"),
        Limit::TcpBufferBytes => x.counter("tcp_memory_limited"),
        _ => 0,
    }
}
