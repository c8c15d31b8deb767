//! What the endpoint counted since it started, for soft-rdmad's metrics ([`EngineCounters`]): connection
//! setups by side and outcome, with the active side's setup times ([`SetupTimes`]), and Terminates sent and
//! received by layer and error type ([`TerminateKind`]). Also the totals of the queue pairs soft-rdmad's
//! clients run themselves (kernel mode), as their periodic reports show them ([`ReportedQueuePairs`]), and
//! the figures of what the engine holds now ([`EngineGauges`]).
//!
//! Every counter only grows, and every label takes a fixed set of values: a peer's Terminate with a layer or
//! error type RFC 5040 does not define counts as `unknown`, not as a new label value.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use soft_rdma_common::wire::TerminateCause;
use soft_rdma_common::wire::cause::{ddp_type, layer, llp_type, rdmap_type};

use super::ids::{ConnId, ConnectorId, SessionId};
use super::status::ConnectorState;
use super::traffic::OpTraffic;
use super::verbs::{QueuePairState, QueuePairStatus};

/// Which end of a connection setup: the Connect, or the listener's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Active,
    Passive,
}

impl Side {
    pub const ALL: [Side; 2] = [Side::Active, Side::Passive];

    pub fn name(self) -> &'static str {
        match self {
            Side::Active => "active",
            Side::Passive => "passive",
        }
    }
}

/// How a connection setup ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetupOutcome {
    /// Active: the peer's Reply accepted the connection. Passive: the application's Accept sent the Reply.
    Established,
    /// Active: no listener (TCP reset), or the peer closed before replying. Passive: the MPA Request was
    /// malformed or asked for markers, or the listener's backlog was full.
    Refused,
    /// The application on the passive side rejected it (MPA Reply with the Reject bit).
    Rejected,
    /// Active: the TCP connect timed out. Passive: no MPA Request within the responder's timeout.
    TimedOut,
    /// Active: no route, or no answer to ARP/NDP.
    Unreachable,
    /// Passive: the initiator went away before the Accept.
    Aborted,
    /// The local application gave up: it cancelled the Connect or closed the connector or the listener.
    Cancelled,
    /// Anything else: an MPA Reply soft-rdma refuses, out of resources, ...
    Failed,
}

impl SetupOutcome {
    pub const ALL: [SetupOutcome; 8] = [
        SetupOutcome::Established,
        SetupOutcome::Refused,
        SetupOutcome::Rejected,
        SetupOutcome::TimedOut,
        SetupOutcome::Unreachable,
        SetupOutcome::Aborted,
        SetupOutcome::Cancelled,
        SetupOutcome::Failed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SetupOutcome::Established => "established",
            SetupOutcome::Refused => "refused",
            SetupOutcome::Rejected => "rejected",
            SetupOutcome::TimedOut => "timed_out",
            SetupOutcome::Unreachable => "unreachable",
            SetupOutcome::Aborted => "aborted",
            SetupOutcome::Cancelled => "cancelled",
            SetupOutcome::Failed => "failed",
        }
    }
}

/// A histogram of the active side's setup times, from Connect to the accepting Reply (the TCP handshake,
/// the MPA exchange and the remote application's Accept).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SetupTimes {
    /// Per bucket of [`SetupTimes::BOUNDS`] (non-cumulative), and past the last one.
    counts: [u64; SetupTimes::BOUNDS.len() + 1],
    sum: Duration,
}

impl SetupTimes {
    /// The buckets' upper bounds, in seconds: 100 µs to 10 s.
    pub const BOUNDS: [f64; 15] = [
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
    ];

    fn observe(&mut self, d: Duration) {
        let s = d.as_secs_f64();
        let i = Self::BOUNDS.iter().position(|b| s <= *b).unwrap_or(Self::BOUNDS.len());
        self.counts[i] += 1;
        self.sum = self.sum.saturating_add(d);
    }

    /// Each bucket's upper bound (the last one infinite) and its count (non-cumulative).
    pub fn buckets(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        Self::BOUNDS
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(self.counts.iter().copied())
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    pub fn sum(&self) -> Duration {
        self.sum
    }
}

/// Whether this side sent a Terminate or received one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Sent,
    Received,
}

impl Direction {
    pub const ALL: [Direction; 2] = [Direction::Sent, Direction::Received];

    pub fn name(self) -> &'static str {
        match self {
            Direction::Sent => "tx",
            Direction::Received => "rx",
        }
    }
}

/// A Terminate's layer and error type (RFC 5040 §4.8, §7.2; RFC 5041 §7.2; RFC 5044 §8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TerminateKind {
    RdmapCatastrophic,
    RdmapRemoteProtection,
    RdmapRemoteOperation,
    DdpCatastrophic,
    DdpTaggedBuffer,
    DdpUntaggedBuffer,
    LlpMpa,
    /// A layer or error type the RFCs do not define, or a Terminate whose header did not parse.
    Unknown,
}

impl TerminateKind {
    pub const ALL: [TerminateKind; 8] = [
        TerminateKind::RdmapCatastrophic,
        TerminateKind::RdmapRemoteProtection,
        TerminateKind::RdmapRemoteOperation,
        TerminateKind::DdpCatastrophic,
        TerminateKind::DdpTaggedBuffer,
        TerminateKind::DdpUntaggedBuffer,
        TerminateKind::LlpMpa,
        TerminateKind::Unknown,
    ];

    /// The kind of a Terminate with this layer and error type.
    pub fn of(layer: u8, error_type: u8) -> TerminateKind {
        match (layer, error_type) {
            (layer::RDMAP, rdmap_type::CATASTROPHIC) => TerminateKind::RdmapCatastrophic,
            (layer::RDMAP, rdmap_type::REMOTE_PROTECTION) => TerminateKind::RdmapRemoteProtection,
            (layer::RDMAP, rdmap_type::REMOTE_OPERATION) => TerminateKind::RdmapRemoteOperation,
            (layer::DDP, ddp_type::CATASTROPHIC) => TerminateKind::DdpCatastrophic,
            (layer::DDP, ddp_type::TAGGED_BUFFER) => TerminateKind::DdpTaggedBuffer,
            (layer::DDP, ddp_type::UNTAGGED_BUFFER) => TerminateKind::DdpUntaggedBuffer,
            (layer::LLP, llp_type::MPA) => TerminateKind::LlpMpa,
            _ => TerminateKind::Unknown,
        }
    }

    /// The kind of a Terminate's cause, if it had one that parsed.
    pub fn of_cause(cause: Option<TerminateCause>) -> TerminateKind {
        cause.map_or(TerminateKind::Unknown, |c| Self::of(c.layer, c.error_type))
    }

    /// Its layer and error type as the metrics label them.
    pub fn names(self) -> (&'static str, &'static str) {
        match self {
            TerminateKind::RdmapCatastrophic => ("rdmap", "catastrophic"),
            TerminateKind::RdmapRemoteProtection => ("rdmap", "remote_protection"),
            TerminateKind::RdmapRemoteOperation => ("rdmap", "remote_operation"),
            TerminateKind::DdpCatastrophic => ("ddp", "catastrophic"),
            TerminateKind::DdpTaggedBuffer => ("ddp", "tagged_buffer"),
            TerminateKind::DdpUntaggedBuffer => ("ddp", "untagged_buffer"),
            TerminateKind::LlpMpa => ("llp", "mpa"),
            TerminateKind::Unknown => ("unknown", "unknown"),
        }
    }
}

/// See the module documentation. Each setup is counted once when it starts and once when it ends, whichever
/// of the endpoint's paths ends it first: the setups in progress are remembered until then (one entry per
/// connecting connector or handshaking connection, both bounded already).
#[derive(Debug, Default)]
pub struct EngineCounters {
    attempts: [u64; 2],
    outcomes: [[u64; SetupOutcome::ALL.len()]; 2],
    setup_times: SetupTimes,
    terminates: [[u64; TerminateKind::ALL.len()]; 2],
    /// Connects in progress, since when.
    active: HashMap<ConnectorId, Instant>,
    /// Passive setups in progress: connections whose MPA Request was taken as an offer.
    passive: HashMap<ConnId, ()>,
}

impl EngineCounters {
    /// `connector`'s Connect started at `now`.
    pub fn active_began(&mut self, connector: ConnectorId, now: Instant) {
        if self.active.insert(connector, now).is_none() {
            self.attempts[Side::Active as usize] += 1;
        }
    }

    /// `connector`'s Connect ended (`now`: when it was established, for its setup time); nothing if it
    /// already ended or never began.
    pub fn active_ended(&mut self, connector: ConnectorId, outcome: SetupOutcome, now: Option<Instant>) {
        let Some(began) = self.active.remove(&connector) else {
            return;
        };
        self.outcomes[Side::Active as usize][outcome as usize] += 1;
        if outcome == SetupOutcome::Established
            && let Some(now) = now
        {
            self.setup_times.observe(now.saturating_duration_since(began));
        }
    }

    /// A connection's MPA Request reached a listener.
    pub fn passive_began(&mut self, conn: ConnId) {
        if self.passive.insert(conn, ()).is_none() {
            self.attempts[Side::Passive as usize] += 1;
        }
    }

    /// The passive setup on `conn` ended; nothing if it already ended or never began.
    pub fn passive_ended(&mut self, conn: ConnId, outcome: SetupOutcome) {
        if self.passive.remove(&conn).is_some() {
            self.outcomes[Side::Passive as usize][outcome as usize] += 1;
        }
    }

    /// A passive setup that began and ended at once (a refused MPA Request, no Request in time).
    pub fn passive_failed(&mut self, conn: ConnId, outcome: SetupOutcome) {
        self.passive_began(conn);
        self.passive_ended(conn, outcome);
    }

    /// A Terminate sent or received.
    pub fn terminate(&mut self, direction: Direction, kind: TerminateKind) {
        self.terminates[direction as usize][kind as usize] += 1;
    }

    pub fn attempts(&self, side: Side) -> u64 {
        self.attempts[side as usize]
    }

    pub fn outcomes(&self, side: Side, outcome: SetupOutcome) -> u64 {
        self.outcomes[side as usize][outcome as usize]
    }

    pub fn setup_times(&self) -> &SetupTimes {
        &self.setup_times
    }

    pub fn terminates(&self, direction: Direction, kind: TerminateKind) -> u64 {
        self.terminates[direction as usize][kind as usize]
    }
}

/// What one queue pair had counted at its client's last report.
#[derive(Debug, Default)]
struct Reported {
    traffic: OpTraffic,
    terminated: bool,
}

/// One session's queue pairs as reported: the current report's and the one before (a report comes in
/// parts; a queue pair missing from two reports in a row is gone and forgotten).
#[derive(Debug, Default)]
struct SessionReports {
    current: HashMap<u64, Reported>,
    previous: HashMap<u64, Reported>,
}

/// The queue pairs clients run themselves (kernel mode), totalled from their reports: each report adds what
/// each queue pair counted beyond the most it was reported with before, so the totals only grow (saturating,
/// never wrapping) and no byte counts twice, and a queue pair that closes keeps what it was last reported
/// with. The client reports a queue pair's final counters when it closes, when its connection ends, and at
/// the process's exit (docs/metrics.md); a client's report is its word, untrusted: it can only add to the
/// totals, as much as its counters grew.
#[derive(Debug, Default)]
pub struct ReportedQueuePairs {
    sessions: HashMap<SessionId, SessionReports>,
    traffic: OpTraffic,
}

impl ReportedQueuePairs {
    /// A part of `session`'s report (`first`: a new report starts). Terminates first seen now are counted
    /// in `counters`.
    pub fn record(
        &mut self,
        session: SessionId,
        first: bool,
        queue_pairs: &[QueuePairStatus],
        counters: &mut EngineCounters,
    ) {
        let s = self.sessions.entry(session).or_default();
        if first {
            s.previous = std::mem::take(&mut s.current);
        }
        for q in queue_pairs {
            let base = s.current.remove(&q.id).or_else(|| s.previous.remove(&q.id));
            let base = base.unwrap_or_default();
            self.traffic.add(&q.stats.by_op.since(&base.traffic));
            let terminated = base.terminated || q.terminate.is_some();
            if let (false, Some(t)) = (base.terminated, q.terminate) {
                let direction = if t.from_peer {
                    Direction::Received
                } else {
                    Direction::Sent
                };
                counters.terminate(direction, TerminateKind::of(t.layer, t.error_type));
            }
            // The base never goes down: a report older than one already taken (a periodic report that
            // crossed a closing queue pair's final one), or a client that lowers its counts, cannot make
            // the same bytes count twice.
            s.current.insert(
                q.id,
                Reported {
                    traffic: base.traffic.max(&q.stats.by_op),
                    terminated,
                },
            );
        }
    }

    /// The session ended: what its queue pairs were reported with stays counted.
    pub fn forget(&mut self, session: SessionId) {
        self.sessions.remove(&session);
    }

    /// Everything the clients' queue pairs were reported to have moved.
    pub fn traffic(&self) -> &OpTraffic {
        &self.traffic
    }
}

/// What the engine holds now, as soft-rdmad's metrics show it (daemon-wide counts only: no session, peer or
/// address).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineGauges {
    pub sessions: u64,
    /// Connectors by state, in [`CONNECTOR_STATES`]' order.
    pub connectors: [u64; CONNECTOR_STATES.len()],
    /// Listeners that listen, and the offers waiting in their backlogs.
    pub listeners: u64,
    pub queued_offers: u64,
    pub shared_endpoints: u64,
    pub ports_in_use: u64,
    pub ports_free: u64,
    /// Queue pairs by state, in [`QUEUE_PAIR_STATES`]' order: the daemon's and those its clients reported.
    pub queue_pairs: [u64; QUEUE_PAIR_STATES.len()],
    /// Memory regions: the daemon's and those its clients reported.
    pub memory_regions: u64,
}

/// Every connector state, with its name in the metrics.
pub const CONNECTOR_STATES: [(ConnectorState, &str); 9] = [
    (ConnectorState::Idle, "idle"),
    (ConnectorState::Bound, "bound"),
    (ConnectorState::Connecting, "connecting"),
    (ConnectorState::AwaitingComplete, "awaiting_complete"),
    (ConnectorState::OfferReceived, "offer_received"),
    (ConnectorState::Accepting, "accepting"),
    (ConnectorState::Connected, "connected"),
    (ConnectorState::Disconnecting, "disconnecting"),
    (ConnectorState::Closed, "closed"),
];

/// Every queue-pair state, with its name in the metrics.
pub const QUEUE_PAIR_STATES: [(QueuePairState, &str); 3] = [
    (QueuePairState::Idle, "idle"),
    (QueuePairState::Connected, "connected"),
    (QueuePairState::Error, "error"),
];

impl EngineGauges {
    /// Counts one connector in `state`.
    pub fn add_connector(&mut self, state: ConnectorState) {
        if let Some(i) = CONNECTOR_STATES.iter().position(|(s, _)| *s == state) {
            self.connectors[i] += 1;
        }
    }

    /// Counts one queue pair in `state`.
    pub fn add_queue_pair(&mut self, state: QueuePairState) {
        if let Some(i) = QUEUE_PAIR_STATES.iter().position(|(s, _)| *s == state) {
            self.queue_pairs[i] += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::traffic::{MessageOp, Traffic};
    use crate::engine::verbs::{QpStats, TerminateInfo};

    #[test]
    fn each_setup_ends_once_and_established_ones_are_timed() {
        let mut c = EngineCounters::default();
        let t0 = Instant::now();
        c.active_began(ConnectorId(1), t0);
        c.active_began(ConnectorId(2), t0);
        c.active_ended(ConnectorId(1), SetupOutcome::Established, Some(t0 + Duration::from_millis(3)));
        c.active_ended(ConnectorId(1), SetupOutcome::Cancelled, None);
        c.active_ended(ConnectorId(2), SetupOutcome::Refused, None);
        c.active_ended(ConnectorId(3), SetupOutcome::Failed, None);
        assert_eq!(c.attempts(Side::Active), 2);
        assert_eq!(c.outcomes(Side::Active, SetupOutcome::Established), 1);
        assert_eq!(c.outcomes(Side::Active, SetupOutcome::Refused), 1);
        assert_eq!(c.outcomes(Side::Active, SetupOutcome::Cancelled), 0, "ended already");
        assert_eq!(c.outcomes(Side::Active, SetupOutcome::Failed), 0, "never began");
        let t = c.setup_times();
        assert_eq!((t.count(), t.sum()), (1, Duration::from_millis(3)));
        let bucket = t.buckets().find(|(_, n)| *n == 1).unwrap().0;
        assert_eq!(bucket, 0.005, "3 ms falls in the 5 ms bucket");
        c.passive_failed(ConnId(9), SetupOutcome::TimedOut);
        c.passive_ended(ConnId(9), SetupOutcome::Aborted);
        assert_eq!(c.attempts(Side::Passive), 1);
        assert_eq!(c.outcomes(Side::Passive, SetupOutcome::TimedOut), 1);
        assert_eq!(c.outcomes(Side::Passive, SetupOutcome::Aborted), 0);
    }

    /// A peer chooses a Terminate's layer and type: anything undefined is one label value, `unknown`.
    #[test]
    fn terminate_kinds_are_a_fixed_set() {
        assert_eq!(TerminateKind::of(2, 0), TerminateKind::LlpMpa);
        assert_eq!(TerminateKind::of(1, 2), TerminateKind::DdpUntaggedBuffer);
        assert_eq!(TerminateKind::of(0, 7), TerminateKind::Unknown);
        assert_eq!(TerminateKind::of(200, 0), TerminateKind::Unknown);
        assert_eq!(TerminateKind::of_cause(None), TerminateKind::Unknown);
        assert!(TerminateKind::ALL.iter().enumerate().all(|(i, k)| *k as usize == i));
        assert!(SetupOutcome::ALL.iter().enumerate().all(|(i, k)| *k as usize == i));
    }

    fn qp(id: u64, write_bytes: u64, terminate: Option<TerminateInfo>) -> QueuePairStatus {
        let mut stats = QpStats::default();
        stats.by_op.sent[MessageOp::RdmaWrite as usize] = Traffic {
            messages: write_bytes / 10,
            bytes: write_bytes,
        };
        QueuePairStatus {
            id,
            session: 1,
            connector: None,
            state: QueuePairState::Connected,
            terminate,
            ird: 0,
            ord: 0,
            stats,
        }
    }

    /// Reports in parts add what moved since each queue pair's last report; a queue pair that left the
    /// reports keeps its bytes counted; a Terminate counts once however often it is reported.
    #[test]
    fn reports_add_up_to_monotonic_totals() {
        let (mut r, mut c) = (ReportedQueuePairs::default(), EngineCounters::default());
        let s = SessionId(1);
        let written = |r: &ReportedQueuePairs| r.traffic().sent(MessageOp::RdmaWrite).bytes;
        r.record(s, true, &[qp(1, 100, None)], &mut c);
        r.record(s, false, &[qp(2, 50, None)], &mut c);
        assert_eq!(written(&r), 150);
        let t = TerminateInfo {
            layer: 1,
            error_type: 1,
            code: 0,
            from_peer: true,
            violation: None,
            buffer: None,
        };
        r.record(s, true, &[qp(1, 300, Some(t))], &mut c);
        r.record(s, false, &[qp(2, 50, None)], &mut c);
        assert_eq!(written(&r), 350);
        r.record(s, true, &[qp(1, 300, Some(t))], &mut c);
        assert_eq!(c.terminates(Direction::Received, TerminateKind::DdpTaggedBuffer), 1);
        // Queue pair 2 closed: missing from two reports, forgotten, its 50 bytes still counted.
        r.record(s, true, &[qp(1, 300, Some(t))], &mut c);
        assert_eq!(written(&r), 350);
        assert!(!r.sessions[&s].previous.contains_key(&2) && !r.sessions[&s].current.contains_key(&2));
        r.forget(s);
        assert_eq!(written(&r), 350);
    }

    /// A closing queue pair's final counters, then an older periodic report of it (the two crossed), then
    /// a client that lowers and raises its counts again: each byte counts once.
    #[test]
    fn an_older_or_lowered_report_counts_nothing_twice() {
        let (mut r, mut c) = (ReportedQueuePairs::default(), EngineCounters::default());
        let s = SessionId(1);
        let written = |r: &ReportedQueuePairs| r.traffic().sent(MessageOp::RdmaWrite).bytes;
        r.record(s, true, &[qp(1, 100, None)], &mut c);
        r.record(s, false, &[qp(1, 64 << 20, None)], &mut c); // its final counters
        assert_eq!(written(&r), 64 << 20);
        r.record(s, true, &[qp(1, 500, None)], &mut c); // the older snapshot
        r.record(s, true, &[qp(1, 64 << 20, None)], &mut c);
        assert_eq!(written(&r), 64 << 20);
        r.record(s, true, &[qp(1, u64::MAX, None)], &mut c);
        r.record(s, true, &[qp(2, u64::MAX, None)], &mut c);
        assert_eq!(written(&r), u64::MAX, "saturates, never wraps");
    }
}
