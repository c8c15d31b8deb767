//! The connection manager's endpoint: sessions, the port space, connectors, listeners and shared endpoints
//! with the rules of IND2Connector, NdkConnect, NdkConnectWithSharedEndpoint and TDI ClientEventConnect
//! (`docs/connector-semantics.md`), and one [`Connection`] per TCP connection (its phase, MPA handshake and
//! FPDU intake live there, [`super::connection`]). Sans-IO, in the quinn-proto `Endpoint` style: requests,
//! transport events and time go in; transport commands and completions come out. The data path
//! ([`DataPath`]) is its sibling, not a part of it: every call that acts on queue pairs borrows it, and
//! [`super::rnic::Rnic`] holds the two for the daemon.
//!
//! Layout: this file holds the [`Endpoint`] and its dispatch: requests go to the data path
//! ([`DataPath::handle_request`]: memory, completion queues, queue pairs), to the listeners (`listener.rs`:
//! listeners and shared endpoints, offers) or to the connectors (`connector.rs`: Bind, Connect, Accept,
//! Reject, Disconnect and how a connector ends); transport events go to the connection they name
//! (`stream.rs`: what its bytes meant for connectors and listeners, and closing it). Each object has one
//! owner map here, and the code looks ids up in it, answering a miss with a specific error.
//!
//! Decisions recorded here:
//! - The transport owns the TCP connect timer (IO_TIMEOUT comes from `ConnectFailure::TimedOut`); the engine
//!   owns only the responder's wait for the MPA Request. Nothing times out the listener's application.
//! - With RFC 6581 peer-to-peer negotiated (soft-rdma ↔ soft-rdma by default), CompleteConnect sends the RTR
//!   and the passive side's Accept completes when it arrives. Without it (an RFC 5044 peer, or siw in its
//!   default mode) the passive Accept completes when its Reply is sent, and the iWARP rule "the active side
//!   sends first" holds.
//! - GetPrivateData with a short buffer answers `CmResponse::PrivateData` with the truncated data and the
//!   required size; the UDS layer reports it as BUFFER_OVERFLOW.
//! - A handle owned by another session is answered exactly like one that does not exist (INVALID_PARAMETER).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use crate::warn_limited;
use bytes::Bytes;
use soft_rdma_common::wire::fpdu::max_ulpdu_for;
use tracing::debug;

use super::connection::{Connection, Phase, StreamRules};
use super::counters::{EngineCounters, EngineGauges, ReportedQueuePairs, SetupOutcome};
use super::datapath::{DataPath, TRANSMIT_WINDOW};
use super::first_fpdu;
use super::limits::{Limit, LimitHits, Limits, MAX_COMPLETION_QUEUE_DEPTH};
use super::mpa::{self, MpaConfig, MpaResponder};
use super::port_space::PortSpace;
use super::requests::*;
use super::transport_seam::*;
use super::verbs::*;
use crate::error::{Error, NdStatus, Result};

mod connector;
mod hand_off;
mod listener;
mod stream;

pub use super::connection::REJECT_LINGER;
use connector::Connector;
pub use hand_off::REPORT_SLACK;
use listener::{Listener, SharedEndpoint};

/// Settings of one connection manager.
#[derive(Clone, Debug)]
pub struct CmConfig {
    pub adapter: AdapterInfo,
    /// TCP connect timeout, applied by the transport (siw: 10 s).
    pub connect_timeout: Duration,
    pub mpa: MpaConfig,
    /// The largest ULPDU accepted once connected (an FPDU fits the path MSS: RFC 5044 §4.1).
    pub max_ulpdu: usize,
    /// What one session, and all of them, may hold (objects, ports, ...): [`super::limits`].
    pub limits: Limits,
    /// How long the active side holds its first FPDU after the MPA Reply (siw's responder race:
    /// [`super::first_fpdu`]); zero: no hold.
    pub first_fpdu_hold: Duration,
    /// Kernel mode: established connections that carry a queue pair are handed to the client, which runs
    /// their data path (`hand_off`). Off: the daemon runs every queue pair (XDP mode).
    pub hand_off: bool,
}

impl CmConfig {
    /// What a connection's byte rules take from these settings.
    fn stream_rules(&self) -> StreamRules {
        StreamRules {
            max_inbound_ulpdu: self.max_ulpdu,
            crc_required: self.mpa.crc_required,
            first_fpdu_hold: self.first_fpdu_hold,
        }
    }

    /// Limits and MPA settings interoperable with Linux siw (docs/iwarp-wire.md §1-2).
    pub fn default_siw_compatible() -> Self {
        CmConfig {
            adapter: AdapterInfo {
                max_inbound_read_limit: 128,
                max_outbound_read_limit: 128,
                max_caller_data: mpa::max_private_data(2) as u32,
                max_callee_data: mpa::max_private_data(2) as u32,
                // Kernel siw's SIW_MAX_QP_WR (siw.h: 1024 * 32), verbs' `max_qp_wr`: libfabric's RxM asks
                // for 4,096 receives per endpoint with a shared receive context (FI_OFI_RXM_USE_SRX=1). A
                // depth counts against the work-queue entries bounds (docs/limits.md).
                max_send_queue_depth: 32 * 1024,
                max_receive_queue_depth: 32 * 1024,
                // Kernel siw's SIW_MAX_CQE (drivers/infiniband/sw/siw/siw.h: SIW_MAX_QP_WR * 100). A deep
                // queue costs nothing until completions wait in it (docs/limits.md, "Completion queues").
                max_completion_queue_depth: MAX_COMPLETION_QUEUE_DEPTH,
                max_transfer_length: 1 << 30,
                max_send_sge: 8,
                max_receive_sge: 8,
            },
            connect_timeout: Duration::from_secs(10),
            mpa: MpaConfig::default(),
            max_ulpdu: 65535,
            limits: Limits::default(),
            first_fpdu_hold: first_fpdu::FIRST_FPDU_HOLD,
            hand_off: false,
        }
    }
}

/// The endpoint of one daemon: sessions, the port space, connectors, listeners, shared endpoints, and one
/// [`Connection`] per TCP connection with its deadline. It acts on queue pairs through the data path its
/// driver lends it ([`DataPath`], a sibling: [`crate::engine::rnic::Rnic`] holds both).
pub struct Endpoint {
    config: CmConfig,
    host: Box<dyn HostPorts>,
    ports: PortSpace,
    next_id: u64,
    connectors: HashMap<ConnectorId, Connector>,
    listeners: HashMap<ListenerId, Listener>,
    endpoints: HashMap<SharedEndpointId, SharedEndpoint>,
    conns: HashMap<ConnId, Connection>,
    sessions: HashMap<SessionId, ()>,
    transmit: VecDeque<TransportCommand>,
    events: VecDeque<(SessionId, CmEvent)>,
    /// Data-path objects made or closed since the driver last looked ([`Self::poll_object_event`]).
    objects_changed: VecDeque<ObjectEvent>,
    /// Data messages that arrived on connections without a queue pair (dropped).
    fpdus_without_queue_pair: u64,
    /// Objects each session holds (against `max_objects_per_session`).
    objects: HashMap<SessionId, usize>,
    /// Connection deadlines (a responder's wait for the MPA Request, a reject's linger), earliest first.
    /// An entry is live while its connection still has exactly that deadline ([`conn_deadline`]); stale
    /// ones are dropped when they reach the front, so the next deadline costs O(log n), not a scan of
    /// every connection on each event.
    timers: BTreeSet<(Instant, ConnId)>,
    /// Kernel mode: each session's in-process data path as its client last reported it (for `status`).
    client_data_paths: HashMap<SessionId, (Vec<QueuePairStatus>, u32)>,
    /// The same reports totalled, for the metrics.
    reported: ReportedQueuePairs,
    /// Connection setups and Terminates, for the metrics.
    counters: EngineCounters,
    /// How often `max_objects_per_session` refused a create.
    hits: LimitHits,
}

/// CONNECTION_INVALID: the connector is not in a state the request needs (IND2Connector's rules,
/// docs/connector-semantics.md).
fn connection_invalid(why: &'static str) -> Error {
    Error::new(NdStatus::ConnectionInvalid, why)
}

fn not_found(what: &str, id: u64) -> Error {
    Error::new(
        NdStatus::InvalidParameter,
        format!("no {what} {id} in this session"),
    )
}

/// INVALID_BUFFER_SIZE past the adapter's MaxCallerData / MaxCalleeData (IND2Connector::Connect, ::Accept,
/// ::Reject; docs/connector-semantics.md "Adapter limits": exactly the maximum passes, one more fails).
fn check_private_data(len: usize, max: u32, which: &str) -> Result<()> {
    if len > max as usize {
        return Err(Error::new(
            NdStatus::InvalidBufferSize,
            format!("{len} bytes of private data exceed {which} ({max})"),
        ));
    }
    Ok(())
}

/// How a successful request changes the number of objects its session holds.
fn object_delta(req: &CmRequest) -> isize {
    match req {
        CmRequest::CreateConnector
        | CmRequest::CreateListener
        | CmRequest::CreateSharedEndpoint { .. }
        | CmRequest::CreateCompletionQueue { .. }
        | CmRequest::CreateQueuePair { .. }
        | CmRequest::CreateQueuePairOnSrq { .. }
        | CmRequest::CreateSharedReceiveQueue { .. }
        | CmRequest::RegisterMemory { .. } => 1,
        CmRequest::CloseConnector { .. }
        | CmRequest::CloseListener { .. }
        | CmRequest::CloseSharedEndpoint { .. }
        | CmRequest::CloseCompletionQueue { .. }
        | CmRequest::CloseQueuePair { .. }
        | CmRequest::CloseSharedReceiveQueue { .. }
        | CmRequest::DeregisterMemory { .. } => -1,
        _ => 0,
    }
}

/// Who made a request and when: what the request handlers need besides the request itself.
#[derive(Clone, Copy)]
struct Call {
    now: Instant,
    session: SessionId,
    request: RequestId,
}

/// The next handle from `next` (never reused for the daemon's lifetime).
fn take_id(next: &mut u64) -> u64 {
    let id = *next;
    *next += 1;
    id
}

/// An object a session owns (connector, listener), named as [`not_found`] names it.
trait SessionOwned {
    const KIND: &'static str;
    fn session(&self) -> SessionId;
}

/// Implements [`SessionOwned`] for types with a `session` field.
macro_rules! session_owned {
    ($($owner:ty => $kind:literal),+) => {
        $(impl SessionOwned for $owner {
            const KIND: &'static str = $kind;
            fn session(&self) -> SessionId {
                self.session
            }
        })+
    };
}
session_owned!(Connector => "connector", Listener => "listener");

/// The object found under id `id` (shared or exclusive reference), if there is one and `session` owns it.
fn owned_by<T: SessionOwned, R: core::ops::Deref<Target = T>>(
    found: Option<R>,
    session: SessionId,
    id: u64,
) -> Result<R> {
    found
        .filter(|o| o.session() == session)
        .ok_or_else(|| not_found(T::KIND, id))
}

/// The ids of the objects in `map` that `session` owns.
fn owned_ids<K: Copy, T: SessionOwned>(map: &HashMap<K, T>, session: SessionId) -> Vec<K> {
    map.iter()
        .filter(|(_, o)| o.session() == session)
        .map(|(id, _)| *id)
        .collect()
}

/// Connector `id` if `session` owns it. A handle another session owns is answered exactly like one that does
/// not exist (INVALID_PARAMETER). A function of the map rather than a method, so that a caller can hold the
/// connector while it uses the manager's other parts (ports, connections, data path).
fn owned_connector(
    connectors: &mut HashMap<ConnectorId, Connector>,
    session: SessionId,
    id: ConnectorId,
) -> Result<&mut Connector> {
    owned_by(connectors.get_mut(&id), session, id.0)
}

fn unspecified_like(remote: SocketAddr) -> SocketAddr {
    match remote.ip() {
        IpAddr::V4(_) => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
        IpAddr::V6(_) => SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0),
    }
}

impl Endpoint {
    /// An endpoint holding host ports through `host`.
    pub fn new(config: CmConfig, host: Box<dyn HostPorts>) -> Self {
        Endpoint {
            host,
            ports: PortSpace::with_limits(&config.limits),
            next_id: 1,
            connectors: HashMap::new(),
            listeners: HashMap::new(),
            endpoints: HashMap::new(),
            conns: HashMap::new(),
            sessions: HashMap::new(),
            transmit: VecDeque::new(),
            events: VecDeque::new(),
            objects_changed: VecDeque::new(),
            fpdus_without_queue_pair: 0,
            objects: HashMap::new(),
            timers: BTreeSet::new(),
            client_data_paths: HashMap::new(),
            reported: ReportedQueuePairs::default(),
            counters: EngineCounters::default(),
            hits: LimitHits::default(),
            config,
        }
    }

    pub fn config(&self) -> &CmConfig {
        &self.config
    }

    fn id(&mut self) -> u64 {
        take_id(&mut self.next_id)
    }

    /// Records that a session exists (for the status view).
    pub fn open_session(&mut self, session: SessionId) {
        self.sessions.insert(session, ());
    }

    pub fn poll_transport(&mut self) -> Option<TransportCommand> {
        self.transmit.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<(SessionId, CmEvent)> {
        self.events.pop_front()
    }

    /// The next queue pair or completion queue a request made or closed (the daemon's shared rings follow
    /// them). Drain after each [`Self::handle_request`].
    pub fn poll_object_event(&mut self) -> Option<ObjectEvent> {
        self.objects_changed.pop_front()
    }

    /// The queue pair a request acts on, whose work already posted (in the client's shared rings) must reach
    /// the engine before the request does: the one a Connect or Accept gives its connection, the one a
    /// CompleteConnect's or Disconnect's connector carries, or the one it closes or queries (a query answers
    /// with everything posted before it counted).
    pub fn queue_pair_acted_on(&self, dp: &DataPath, req: &CmRequest) -> Option<QueuePairId> {
        match req {
            CmRequest::Connect { queue_pair, .. } | CmRequest::Accept { queue_pair, .. } => *queue_pair,
            CmRequest::CompleteConnect { connector } | CmRequest::Disconnect { connector } => {
                self.queue_pair_of(dp, *connector)
            }
            CmRequest::CloseQueuePair { qp } | CmRequest::QueryQueuePair { qp } => Some(*qp),
            _ => None,
        }
    }

    /// The next deadline: a responder waiting for its Request, or a reject lingering for the initiator's
    /// close. Call [`Self::handle_timeout`] then.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        while let Some(&(at, conn)) = self.timers.first() {
            if self.conns.get(&conn).and_then(Connection::deadline) == Some(at) {
                return Some(at);
            }
            self.timers.pop_first();
        }
        None
    }

    /// Entries in the deadline index, live or stale (tests: it must not grow without bound).
    #[cfg(test)]
    pub(crate) fn timer_entries(&self) -> usize {
        self.timers.len()
    }

    /// Schedules `conn`'s current deadline (after it entered a phase that has one).
    fn arm_timer(&mut self, conn: ConnId) {
        if let Some(at) = self.conns.get(&conn).and_then(Connection::deadline) {
            self.timers.insert((at, conn));
        }
    }

    /// Data messages that arrived on connections given no queue pair (dropped).
    pub fn fpdus_without_queue_pair(&self) -> u64 {
        self.fpdus_without_queue_pair
    }

    /// RegisterMemory with the region's bytes (the daemon maps the memfd the request carried, or reaches the
    /// client's own memory: `uds::process_memory`); peers address its first byte as tagged offset `iova`.
    pub fn register_memory(
        &mut self,
        dp: &mut DataPath,
        domain: super::ids::Domain,
        memory: Box<dyn super::memory::RegionMemory>,
        access: Access,
        iova: u64,
    ) -> Result<CmResponse> {
        let session = domain.session;
        self.sessions.insert(session, ());
        self.check_object_limit(session)?;
        let r = dp.register_memory(domain, memory, access, iova);
        if r.is_ok() {
            self.count_objects(session, 1);
        }
        r
    }

    /// Work requests for a queue pair (never waits; problems come back as error completions).
    pub fn post(
        &mut self,
        dp: &mut DataPath,
        session: SessionId,
        qp: QueuePairId,
        requests: Vec<WorkRequest>,
    ) -> Result<()> {
        let r = dp.post(session, qp, requests);
        self.pump(dp);
        r
    }

    /// Hands the transport whatever FPDUs the queue pairs have, within each connection's window.
    fn pump(&mut self, dp: &mut DataPath) {
        let (conns, connectors) = (&self.conns, &self.connectors);
        let out = dp.transmit(|connector| {
            let conn = connectors.get(&connector)?.conn?;
            let c = conns
                .get(&conn)
                .filter(|c| matches!(c.phase, Phase::Established) && c.fpdu.may_transmit())?;
            Some((conn, TRANSMIT_WINDOW.saturating_sub(c.in_flight)))
        });
        for (conn, data) in out {
            self.send(conn, data);
        }
        for connector in dp.take_connections_to_drop() {
            self.drop_after_local_error(dp, connector);
        }
    }

    /// Queues bytes for a connection, counting them against its window.
    fn send(&mut self, conn: ConnId, data: Bytes) {
        let data = match self.conns.get_mut(&conn) {
            Some(c) => {
                let Some(data) = c.fpdu.hold_or_send(data) else {
                    return;
                };
                c.in_flight += data.len();
                data
            }
            None => data,
        };
        self.transmit.push_back(TransportCommand::Send { conn, data });
    }

    fn complete(&mut self, session: SessionId, request: RequestId, result: Result<CmResponse>) {
        self.events
            .push_back((session, CmEvent::Completed { request, result }));
    }

    fn connector(&self, session: SessionId, id: ConnectorId) -> Result<&Connector> {
        owned_by(self.connectors.get(&id), session, id.0)
    }

    fn connector_mut(&mut self, session: SessionId, id: ConnectorId) -> Result<&mut Connector> {
        owned_connector(&mut self.connectors, session, id)
    }

    fn listener_mut(&mut self, session: SessionId, id: ListenerId) -> Result<&mut Listener> {
        owned_by(self.listeners.get_mut(&id), session, id.0)
    }

    /// Handles one request. `Ok(CmResponse::Pending)`: it completes later with [`CmEvent::Completed`].
    pub fn handle_request(
        &mut self,
        dp: &mut DataPath,
        now: Instant,
        session: SessionId,
        request: RequestId,
        req: CmRequest,
    ) -> Result<CmResponse> {
        self.sessions.insert(session, ());
        let delta = object_delta(&req);
        if delta > 0 {
            self.check_object_limit(session)?;
        }
        self.ports.act_for(Some(session));
        let call = Call {
            now,
            session,
            request,
        };
        let r = self.on_request(dp, call, req);
        self.ports.act_for(None);
        if r.is_ok() {
            self.count_objects(session, delta);
        }
        self.pump(dp);
        r
    }

    /// INSUFFICIENT_RESOURCES when `session` already holds `max_objects_per_session` objects.
    fn check_object_limit(&self, session: SessionId) -> Result<()> {
        let held = self.objects.get(&session).copied().unwrap_or(0);
        if held >= self.config.limits.max_objects_per_session {
            self.hits.hit(Limit::ObjectsPerSession);
            return Err(Error::new(
                NdStatus::InsufficientResources,
                format!("this session holds {held} objects, the per-session limit; close some first"),
            ));
        }
        Ok(())
    }

    fn count_objects(&mut self, session: SessionId, delta: isize) {
        if delta != 0 {
            let n = self.objects.entry(session).or_default();
            *n = n.saturating_add_signed(delta);
        }
    }

    /// Routes a request to the part of the engine that owns it: the data path (memory, completion queues,
    /// queue pairs), listeners and shared endpoints, or connectors.
    fn on_request(&mut self, dp: &mut DataPath, call: Call, req: CmRequest) -> Result<CmResponse> {
        let session = call.session;
        match req {
            CmRequest::Query => Ok(CmResponse::Adapter(self.config.adapter.clone())),
            CmRequest::Status => Ok(CmResponse::Status(self.status(dp))),
            CmRequest::CreateQueuePair { config } => {
                let r = dp.create_qp(session, config)?;
                if let CmResponse::QueuePair(qp) = r {
                    self.objects_changed
                        .push_back(ObjectEvent::QueuePairCreated { session, qp, config });
                }
                Ok(r)
            }
            CmRequest::CreateQueuePairOnSrq { config, srq } => {
                let r = dp.create_qp_on(session, config, Some(srq))?;
                if let CmResponse::QueuePair(qp) = r {
                    self.objects_changed
                        .push_back(ObjectEvent::QueuePairCreated { session, qp, config });
                }
                Ok(r)
            }
            CmRequest::CloseQueuePair { qp } => {
                let r = self.close_queue_pair(dp, session, qp)?;
                self.objects_changed
                    .push_back(ObjectEvent::QueuePairClosed { session, qp });
                Ok(r)
            }
            CmRequest::CreateCompletionQueue { depth } => {
                let r = dp.create_cq(session, depth)?;
                if let CmResponse::CompletionQueue(cq) = r {
                    self.objects_changed
                        .push_back(ObjectEvent::CompletionQueueCreated { session, cq, depth });
                }
                Ok(r)
            }
            CmRequest::CloseCompletionQueue { cq } => {
                let r = dp.close_cq(session, cq)?;
                self.objects_changed
                    .push_back(ObjectEvent::CompletionQueueClosed { session, cq });
                Ok(r)
            }
            req @ (CmRequest::RegisterMemory { .. }
            | CmRequest::DeregisterMemory { .. }
            | CmRequest::QueryQueuePair { .. }
            | CmRequest::CreateSharedReceiveQueue { .. }
            | CmRequest::CloseSharedReceiveQueue { .. }
            | CmRequest::ModifySharedReceiveQueue { .. }
            | CmRequest::QuerySharedReceiveQueue { .. }
            | CmRequest::PostSharedReceiveQueue { .. }) => dp.handle_request(session, req),
            req @ (CmRequest::CreateListener
            | CmRequest::CloseListener { .. }
            | CmRequest::Listen { .. }
            | CmRequest::GetConnectionRequest { .. }
            | CmRequest::CreateSharedEndpoint { .. }
            | CmRequest::CloseSharedEndpoint { .. }) => self.on_listener_request(call, req),
            req => self.on_connector_request(dp, call, req),
        }
    }

    /// The session went away: everything it held is released.
    pub fn close_session(&mut self, dp: &mut DataPath, _now: Instant, session: SessionId) {
        for c in owned_ids(&self.connectors, session) {
            self.close_connector(dp, c, NdStatus::Canceled);
        }
        for l in owned_ids(&self.listeners, session) {
            self.close_listener(l);
        }
        let eps: Vec<_> = self
            .endpoints
            .iter()
            .filter(|(_, e)| e.session == session)
            .map(|(i, e)| (*i, e.local))
            .collect();
        for (id, local) in eps {
            self.endpoints.remove(&id);
            self.ports.release(local, self.host.as_mut());
        }
        dp.close_session(session);
        // The driver ends the session's rings itself; what was queued for them is moot.
        self.objects_changed.retain(|ev| ev.session() != session);
        self.client_data_paths.remove(&session);
        self.reported.forget(session);
        self.objects.remove(&session);
        self.sessions.remove(&session);
        // Completions for a session that is gone have nowhere to go.
        self.events.retain(|(s, _)| *s != session);
    }

    /// The adapter goes away: every pending request completes with DEVICE_REMOVED, everything closes.
    pub fn shutdown(&mut self, dp: &mut DataPath, now: Instant) {
        let ids: Vec<_> = self.connectors.keys().copied().collect();
        for id in &ids {
            self.fail_pending(*id, NdStatus::DeviceRemoved, "soft-rdmad is shutting down");
        }
        for (_, l) in self.listeners.iter_mut() {
            for (r, _) in l.waiting.drain(..) {
                self.events.push_back((
                    l.session,
                    CmEvent::Completed {
                        request: r,
                        result: Err(Error::new(NdStatus::DeviceRemoved, "soft-rdmad is shutting down")),
                    },
                ));
            }
        }
        let sessions: Vec<_> = self.sessions.keys().copied().collect();
        let events = std::mem::take(&mut self.events);
        for s in sessions {
            self.close_session(dp, now, s);
        }
        self.events = events;
    }

    pub fn handle_timeout(&mut self, dp: &mut DataPath, now: Instant) {
        while let Some(&(at, conn)) = self.timers.first() {
            if at > now {
                break;
            }
            self.timers.pop_first();
            let Some(c) = self.conns.get_mut(&conn) else {
                continue;
            };
            match &c.phase {
                Phase::AwaitingRequest { responder, .. } if responder.on_timeout(now).is_err() => {
                    self.counters.passive_failed(conn, SetupOutcome::TimedOut);
                    warn_limited!(
                        conn = conn.0,
                        timeout = ?self.config.mpa.request_timeout,
                        "no MPA Request within the responder timeout; closing"
                    );
                    self.close_conn(conn, true);
                }
                Phase::Lingering { until } if *until <= now => {
                    debug!(conn = conn.0, "the rejected initiator did not close; closing");
                    c.phase = Phase::Closing;
                    self.transmit
                        .push_back(TransportCommand::Close { conn, abort: false });
                }
                Phase::Established | Phase::Closing if c.fpdu.deadline().is_some_and(|at| at <= now) => {
                    let Some(step) = c.fpdu.on_hold_deadline(now) else {
                        continue;
                    };
                    // The queue pair was passed over while its data was held (no room): it may send now.
                    if let Some(qp) = c.connector.and_then(|id| dp.queue_pair_of(id)) {
                        dp.wake(qp);
                    }
                    debug!(
                        conn = conn.0,
                        fpdus = step.send.len(),
                        close = step.close,
                        "first-FPDU hold step"
                    );
                    for data in step.send {
                        self.send(conn, data);
                    }
                    if step.close {
                        self.transmit
                            .push_back(TransportCommand::Close { conn, abort: false });
                    }
                    if step.keep {
                        self.arm_timer(conn);
                    }
                }
                _ => {}
            }
        }
        // A released hold lets the queue pairs send.
        self.pump(dp);
    }

    pub fn handle_transport(&mut self, dp: &mut DataPath, now: Instant, event: TransportEvent) {
        self.on_transport(dp, now, event);
        self.pump(dp);
    }

    fn on_transport(&mut self, dp: &mut DataPath, now: Instant, event: TransportEvent) {
        match event {
            TransportEvent::Accepted {
                listener,
                conn,
                local,
                remote,
                mss,
            } => {
                if self.listeners.get(&listener).is_none_or(|l| l.local.is_none())
                    || self.ports.add_tuple(local, remote).is_err()
                {
                    self.transmit
                        .push_back(TransportCommand::Close { conn, abort: true });
                    return;
                }
                let responder = MpaResponder::new(now, &self.config.mpa);
                self.conns.insert(
                    conn,
                    Connection {
                        max_ulpdu: max_ulpdu_for(mss as usize),
                        ..Connection::new(
                            None,
                            local,
                            remote,
                            Phase::AwaitingRequest { listener, responder },
                        )
                    },
                );
                self.arm_timer(conn);
                debug!(listener = listener.0, conn = conn.0, %remote, "TCP accepted; waiting for the MPA Request");
            }
            TransportEvent::Connected { conn, local, mss } => {
                let Some(cn) = self.conns.get_mut(&conn) else {
                    return;
                };
                cn.max_ulpdu = max_ulpdu_for(mss as usize);
                let phase = std::mem::replace(&mut cn.phase, Phase::Closing);
                if let Phase::TcpConnecting { initiator, request } = phase {
                    cn.phase = Phase::AwaitingReply { initiator };
                    cn.in_flight += request.len();
                    self.transmit
                        .push_back(TransportCommand::Send { conn, data: request });
                    if let Some(c) = cn.connector.and_then(|id| self.connectors.get_mut(&id))
                        && c.local.is_some_and(|l| l.ip().is_unspecified())
                    {
                        // Show the address the kernel chose (routing) while keeping the port.
                        c.local = Some(SocketAddr::new(
                            local.ip(),
                            c.local.map_or(local.port(), |l| l.port()),
                        ));
                    }
                } else {
                    cn.phase = phase;
                }
            }
            TransportEvent::ConnectFailed { conn, reason } => {
                let Some(cn) = self.conns.remove(&conn) else {
                    return;
                };
                let Some(connector) = cn.connector else { return };
                let (status, why) = match reason {
                    ConnectFailure::Refused => {
                        (NdStatus::ConnectionRefused, "connection refused (no listener)")
                    }
                    ConnectFailure::TimedOut => (NdStatus::IoTimeout, "TCP connection attempt timed out"),
                    ConnectFailure::NetworkUnreachable => {
                        (NdStatus::NetworkUnreachable, "network unreachable")
                    }
                    ConnectFailure::HostUnreachable => (NdStatus::HostUnreachable, "host unreachable"),
                    ConnectFailure::AddressInUse => (
                        NdStatus::AddressAlreadyExists,
                        "local address and port in use for this destination",
                    ),
                    ConnectFailure::AddressNotAvailable => {
                        (NdStatus::InvalidAddress, "local address not available")
                    }
                    ConnectFailure::NoResources => (
                        NdStatus::InsufficientResources,
                        "out of file descriptors or kernel memory",
                    ),
                    ConnectFailure::Other => (NdStatus::Unsuccessful, "TCP connect failed"),
                };
                if let Some(c) = self.connectors.get_mut(&connector) {
                    c.conn = None;
                }
                let outcome = match reason {
                    ConnectFailure::Refused => SetupOutcome::Refused,
                    ConnectFailure::TimedOut => SetupOutcome::TimedOut,
                    ConnectFailure::NetworkUnreachable | ConnectFailure::HostUnreachable => {
                        SetupOutcome::Unreachable
                    }
                    _ => SetupOutcome::Failed,
                };
                self.counters.active_ended(connector, outcome, None);
                self.fail_connect(dp, connector, Error::new(status, why));
            }
            TransportEvent::Received { conn, data } => self.on_received(dp, now, conn, &data),
            TransportEvent::Closed { conn } => self.on_closed(dp, conn),
            TransportEvent::HandedOff { conn } => self.on_handed_off(dp, now, conn),
            TransportEvent::Written { conn, bytes } => {
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.in_flight = c.in_flight.saturating_sub(bytes);
                    if let Some(qp) = c.connector.and_then(|id| dp.queue_pair_of(id)) {
                        dp.wake(qp);
                    }
                }
            }
        }
    }

    /// Everything the daemon holds.
    /// The connection a connector holds, if any (the daemon reads its socket's `TCP_INFO` for `status`).
    pub fn connection_of(&self, connector: ConnectorId) -> Option<ConnId> {
        self.connectors.get(&connector)?.conn
    }

    /// The queue pair (and its session) whose messages arrive on `conn`, once the connection carries one.
    pub fn queue_pair_on(&self, dp: &DataPath, conn: ConnId) -> Option<(SessionId, QueuePairId)> {
        let connector = self.conns.get(&conn)?.connector?;
        let session = self.connectors.get(&connector)?.session;
        Some((session, dp.queue_pair_of(connector)?))
    }

    /// Connection setups and Terminates counted since start.
    pub fn counters(&self) -> &EngineCounters {
        &self.counters
    }

    /// The queue pairs the clients run (kernel mode), totalled from their reports.
    pub fn reported(&self) -> &ReportedQueuePairs {
        &self.reported
    }

    /// How often `limit` refused something here (the object bound, the port space's shares).
    pub fn limit_hits(&self, limit: Limit) -> u64 {
        self.hits.get(limit) + self.ports.hits().get(limit)
    }

    /// What the endpoint holds now, daemon-wide (the metrics' gauges), with the data path's queue pairs and
    /// regions and those the clients reported.
    pub fn gauges(&self, dp: &DataPath) -> EngineGauges {
        let mut g = EngineGauges {
            sessions: self.sessions.len() as u64,
            shared_endpoints: self.endpoints.len() as u64,
            ports_in_use: self.ports.in_use_count() as u64,
            ports_free: self.ports.free_count() as u64,
            ..EngineGauges::default()
        };
        for c in self.connectors.values() {
            g.add_connector(c.state);
        }
        for l in self.listeners.values().filter(|l| l.local.is_some()) {
            g.listeners += 1;
            g.queued_offers += l.queued.len() as u64;
        }
        g.memory_regions = dp.count_into(&mut g);
        for (qps, regions) in self.client_data_paths.values() {
            for q in qps {
                g.add_queue_pair(q.state);
            }
            g.memory_regions += u64::from(*regions);
        }
        g
    }

    pub fn status(&self, dp: &DataPath) -> EngineStatus {
        let (mut queue_pairs, mut memory_regions) = dp.status();
        for (qps, regions) in self.client_data_paths.values() {
            queue_pairs.extend(qps.iter().cloned());
            memory_regions = memory_regions.saturating_add(*regions);
        }
        let mut connectors: Vec<ConnectorStatus> = self
            .connectors
            .iter()
            .map(|(id, c)| ConnectorStatus {
                id: id.0,
                session: c.session.0,
                state: c.state,
                local: c.local,
                peer: c.peer,
                inbound_read_limit: c.effective.map(|e| e.inbound),
                outbound_read_limit: c.effective.map(|e| e.outbound),
                peer_private_data_len: c.peer_private_data.as_ref().map(|d| d.len() as u32),
                mpa_revision: c.negotiated.map(|n| n.revision),
                tcp: None,
            })
            .collect();
        connectors.sort_by_key(|c| c.id);
        let mut listeners: Vec<ListenerStatus> = self
            .listeners
            .iter()
            .filter_map(|(id, l)| {
                Some(ListenerStatus {
                    id: id.0,
                    session: l.session.0,
                    local: l.local?,
                    backlog: l.backlog,
                    queued_offers: l.queued.len() as u32,
                })
            })
            .collect();
        listeners.sort_by_key(|l| l.id);
        EngineStatus {
            listeners,
            connectors,
            shared_endpoints: self.endpoints.values().map(|e| e.local).collect(),
            ports_in_use: self.ports.in_use_count() as u32,
            ports_free: self.ports.free_count() as u32,
            sessions: self.sessions.len() as u32,
            queue_pairs,
            memory_regions,
        }
    }
}
