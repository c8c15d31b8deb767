//! The connection manager: connectors, listeners and shared endpoints with the rules of IND2Connector,
//! NdkConnect, NdkConnectWithSharedEndpoint and TDI ClientEventConnect (`connector-semantics.md`), carried by
//! one MPA handshake ([`super::mpa`]) per TCP connection. Sans-IO, in the quinn-proto `Endpoint` style:
//! requests, transport events and time go in; transport commands and completions come out.
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

use bytes::{Bytes, BytesMut};
use soft_rdma_common::wire::TerminateCause;
use soft_rdma_common::wire::ddp::{Placement, QN_TERMINATE};
use soft_rdma_common::wire::fpdu::{self, FpduRepr, max_ulpdu_for};
use soft_rdma_common::wire::rdmap::{MessageRepr, RdmapOpcode, ReadRequestRepr};
use soft_rdma_common::wire::terminate::TerminateRepr;
use tracing::{debug, info, warn};

use super::api::*;
use super::datapath::{DataPath, TRANSMIT_WINDOW};
use super::first_fpdu::{self, FirstFpduHold};
use super::mpa::{
    self, InitiatorClosed, MpaConfig, MpaInitiator, MpaOffer, MpaResponder, Negotiated, ReplyOutcome,
};
use super::port_space::PortSpace;
use super::qp::QpParams;
use super::read_limits;
use crate::error::{Error, NdStatus, Result};

/// Settings of one connection manager.
#[derive(Clone, Debug)]
pub struct CmConfig {
    pub adapter: AdapterInfo,
    /// TCP connect timeout, applied by the transport (siw: 10 s).
    pub connect_timeout: Duration,
    pub mpa: MpaConfig,
    /// The largest ULPDU accepted once connected (an FPDU fits the path MSS: RFC 5044 §4.1).
    pub max_ulpdu: usize,
    /// Objects (connectors, listeners, shared endpoints, completion queues, queue pairs, memory regions) one
    /// session may hold at once; one more is INSUFFICIENT_RESOURCES, so no client can exhaust the daemon.
    pub max_objects_per_session: usize,
    /// How long the active side holds its first FPDU after the MPA Reply (siw's responder race:
    /// [`super::first_fpdu`]); zero: no hold.
    pub first_fpdu_hold: Duration,
}

impl CmConfig {
    /// Limits and MPA settings interoperable with Linux siw (iwarp-wire.md §1-2).
    pub fn default_siw_compatible() -> Self {
        CmConfig {
            adapter: AdapterInfo {
                max_inbound_read_limit: 128,
                max_outbound_read_limit: 128,
                max_caller_data: mpa::max_private_data(2) as u32,
                max_callee_data: mpa::max_private_data(2) as u32,
                max_send_queue_depth: 1024,
                max_receive_queue_depth: 1024,
                max_completion_queue_depth: 4096,
                max_transfer_length: 1 << 30,
                max_send_sge: 8,
                max_receive_sge: 8,
            },
            connect_timeout: Duration::from_secs(10),
            mpa: MpaConfig::default(),
            max_ulpdu: 65535,
            max_objects_per_session: 65_536,
            first_fpdu_hold: first_fpdu::FIRST_FPDU_HOLD,
        }
    }
}

/// The pending asynchronous requests a connector can have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PendingOp {
    Connect,
    Accept,
    NotifyDisconnect,
}

#[derive(Debug)]
struct Connector {
    session: SessionId,
    state: ConnectorState,
    /// The address bound (Bind, implicit bind, shared endpoint, or the listener's for accepted ones).
    local: Option<SocketAddr>,
    /// The port binding this connector must release (its own Bind or implicit bind).
    owned_binding: Option<SocketAddr>,
    /// The 4-tuple registered for its connection.
    tuple: Option<(SocketAddr, SocketAddr)>,
    peer: Option<SocketAddr>,
    conn: Option<ConnId>,
    own_limits: ReadLimits,
    /// What GetReadLimits reports: the peer's offer in this side's view, capped by the adapter.
    peer_limits: Option<ReadLimits>,
    effective: Option<ReadLimits>,
    peer_private_data: Option<Bytes>,
    negotiated: Option<Negotiated>,
    /// Passive side: the offer being answered.
    offer: Option<MpaOffer>,
    /// Passive side: the initiator went away before Accept (CONNECTION_ABORTED).
    aborted: bool,
    /// Active side: the Request to resend with Rev 1 if the responder closes on S=1.
    retry: Option<RetryPlan>,
    pending: Vec<(RequestId, PendingOp)>,
    /// The queue pair given at Connect/Accept.
    qp: Option<QueuePairId>,
}

#[derive(Clone, Debug)]
struct RetryPlan {
    remote: SocketAddr,
    private_data: Bytes,
    limits: ReadLimits,
}

impl Connector {
    fn new(session: SessionId) -> Self {
        Connector {
            session,
            state: ConnectorState::Idle,
            local: None,
            owned_binding: None,
            tuple: None,
            peer: None,
            conn: None,
            own_limits: ReadLimits::default(),
            peer_limits: None,
            effective: None,
            peer_private_data: None,
            negotiated: None,
            offer: None,
            aborted: false,
            retry: None,
            pending: Vec::new(),
            qp: None,
        }
    }

    fn take_pending(&mut self, op: PendingOp) -> Option<RequestId> {
        let i = self.pending.iter().position(|(_, o)| *o == op)?;
        Some(self.pending.swap_remove(i).0)
    }
}

#[derive(Debug)]
struct Listener {
    session: SessionId,
    local: Option<SocketAddr>,
    backlog: u32,
    /// Offers whose MPA Request arrived, not yet handed to GetConnectionRequest.
    queued: VecDeque<ConnId>,
    /// GetConnectionRequest calls waiting for an offer.
    waiting: VecDeque<(RequestId, ConnectorId)>,
}

#[derive(Debug)]
struct SharedEndpoint {
    session: SessionId,
    local: SocketAddr,
}

/// How a connector's connection ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Closing {
    Rst,
    Fin,
    /// Wait for the peer's FIN until then, then FIN ([`Phase::Lingering`]).
    LingerThenFin(Instant),
}

/// Who a TCP connection belongs to and where its bytes go.
#[derive(Debug)]
enum Phase {
    /// Active: TCP connecting; the Request goes out on `Connected`.
    TcpConnecting { initiator: MpaInitiator, request: Bytes },
    /// Active: Request sent, reading the Reply.
    AwaitingReply { initiator: MpaInitiator },
    /// Passive: TCP accepted, reading the Request.
    AwaitingRequest {
        listener: ListenerId,
        responder: MpaResponder,
    },
    /// Passive: Request read; queued at the listener or attached to a connector.
    Offered { listener: ListenerId },
    /// FPDU mode.
    Established,
    /// Closing (a Reject or Terminate was sent; waiting for the transport to report Closed).
    Closing,
    /// A reject Reply was sent: the initiator closes first, or the FIN goes out at `until`
    /// ([`REJECT_LINGER`]). Bytes that arrive meanwhile are dropped.
    Lingering { until: Instant },
}

/// How long a responder that sent a reject Reply (RFC 5044 §7.1.2, R=1) waits for the initiator to close
/// before closing itself. Closing at once races the Reply at kernel siw: siw reads the Reply from a work
/// queue and, if the FIN's work runs first, reports the reject to rdma_cm as a reset without its private
/// data (siw_cm.c, `SIW_CM_WORK_PEER_CLOSE` in `SIW_EPSTATE_AWAIT_MPAREP`). siw itself closes right after
/// reading the Reply, so the wait normally ends at once.
pub const REJECT_LINGER: Duration = Duration::from_secs(2);

#[derive(Debug)]
struct Conn {
    connector: Option<ConnectorId>,
    local: SocketAddr,
    remote: SocketAddr,
    phase: Phase,
    /// FPDU-mode receive buffer.
    rx: BytesMut,
    crc: bool,
    /// The passive side waits for the RTR before completing Accept.
    awaiting_rtr: bool,
    offer: Option<MpaOffer>,
    /// The largest ULPDU this side sends: one FPDU per TCP segment (RFC 5044 §4.1).
    max_ulpdu: usize,
    /// Bytes handed to the transport and not yet reported written.
    in_flight: usize,
    /// The passive side has not yet seen the initiator's first FPDU: it may not send (RFC 5044 §7.1).
    tx_held: bool,
    /// The active side, just after the Reply: what it sends first waits until the hold ends.
    first_fpdu: Option<FirstFpduHold>,
}

impl Conn {
    fn new(connector: Option<ConnectorId>, local: SocketAddr, remote: SocketAddr, phase: Phase) -> Conn {
        Conn {
            connector,
            local,
            remote,
            phase,
            rx: BytesMut::new(),
            crc: false,
            awaiting_rtr: false,
            offer: None,
            max_ulpdu: max_ulpdu_for(DEFAULT_MSS),
            in_flight: 0,
            tx_held: false,
            first_fpdu: None,
        }
    }
}

/// MSS assumed until the transport reports the path's (IPv4 over a 1500-byte MTU, with timestamps).
const DEFAULT_MSS: usize = 1448;

/// The connection manager of one daemon.
pub struct ConnectionManager {
    config: CmConfig,
    host: Box<dyn HostPorts>,
    ports: PortSpace,
    next_id: u64,
    connectors: HashMap<ConnectorId, Connector>,
    listeners: HashMap<ListenerId, Listener>,
    endpoints: HashMap<SharedEndpointId, SharedEndpoint>,
    conns: HashMap<ConnId, Conn>,
    sessions: HashMap<SessionId, ()>,
    transmit: VecDeque<TransportCommand>,
    events: VecDeque<(SessionId, CmEvent)>,
    /// Data messages that arrived on connections without a queue pair (dropped).
    fpdus_without_queue_pair: u64,
    dp: DataPath,
    /// Objects each session holds (against `max_objects_per_session`).
    objects: HashMap<SessionId, usize>,
    /// Connection deadlines (a responder's wait for the MPA Request, a reject's linger), earliest first.
    /// An entry is live while its connection still has exactly that deadline ([`conn_deadline`]); stale
    /// ones are dropped when they reach the front, so the next deadline costs O(log n), not a scan of
    /// every connection on each event.
    timers: BTreeSet<(Instant, ConnId)>,
}

/// The deadline a connection has in its phase, if any.
fn conn_deadline(c: &Conn) -> Option<Instant> {
    match &c.phase {
        Phase::AwaitingRequest { responder, .. } => responder.deadline(),
        Phase::Lingering { until } => Some(*until),
        Phase::Established | Phase::Closing => c.first_fpdu.as_ref().map(FirstFpduHold::until),
        _ => None,
    }
}

fn not_found(what: &str, id: u64) -> Error {
    Error::new(
        NdStatus::InvalidParameter,
        format!("no {what} {id} in this session"),
    )
}

/// INVALID_BUFFER_SIZE past the adapter's MaxCallerData / MaxCalleeData (IND2Connector::Connect, ::Accept,
/// ::Reject; connector-semantics "Adapter limits": exactly the maximum passes, one more fails).
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
        | CmRequest::RegisterMemory { .. } => 1,
        CmRequest::CloseConnector { .. }
        | CmRequest::CloseListener { .. }
        | CmRequest::CloseSharedEndpoint { .. }
        | CmRequest::CloseCompletionQueue { .. }
        | CmRequest::CloseQueuePair { .. }
        | CmRequest::DeregisterMemory { .. } => -1,
        _ => 0,
    }
}

/// A seed for STag keys that differs between daemon runs, so STags of an earlier run are not valid now.
fn key_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

fn unspecified_like(remote: SocketAddr) -> SocketAddr {
    match remote.ip() {
        IpAddr::V4(_) => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
        IpAddr::V6(_) => SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0),
    }
}

impl ConnectionManager {
    pub fn new(config: CmConfig, host: Box<dyn HostPorts>) -> Self {
        ConnectionManager {
            host,
            ports: PortSpace::new(),
            next_id: 1,
            connectors: HashMap::new(),
            listeners: HashMap::new(),
            endpoints: HashMap::new(),
            conns: HashMap::new(),
            sessions: HashMap::new(),
            transmit: VecDeque::new(),
            events: VecDeque::new(),
            fpdus_without_queue_pair: 0,
            dp: DataPath::new(config.adapter.clone(), key_seed()),
            objects: HashMap::new(),
            timers: BTreeSet::new(),
            config,
        }
    }

    pub fn config(&self) -> &CmConfig {
        &self.config
    }

    fn id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
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

    /// The next deadline: a responder waiting for its Request, or a reject lingering for the initiator's
    /// close. Call [`Self::handle_timeout`] then.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        while let Some(&(at, conn)) = self.timers.first() {
            if self.conns.get(&conn).and_then(conn_deadline) == Some(at) {
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
        if let Some(at) = self.conns.get(&conn).and_then(conn_deadline) {
            self.timers.insert((at, conn));
        }
    }

    /// Data messages that arrived on connections given no queue pair (dropped).
    pub fn fpdus_without_queue_pair(&self) -> u64 {
        self.fpdus_without_queue_pair
    }

    /// Completions gathered since the last call, batched per completion queue.
    pub fn poll_completions(&mut self) -> Vec<(SessionId, CompletionQueueId, Vec<Completion>)> {
        self.dp.take_completions()
    }

    /// RegisterMemory with the region's bytes (the daemon maps the memfd the request carried).
    pub fn register_memory(
        &mut self,
        session: SessionId,
        memory: Box<dyn super::memory::RegionMemory>,
        access: Access,
    ) -> Result<CmResponse> {
        self.sessions.insert(session, ());
        self.check_object_limit(session)?;
        let r = self.dp.register_memory(session, memory, access);
        if r.is_ok() {
            self.count_objects(session, 1);
        }
        r
    }

    /// Work requests for a queue pair (never waits; problems come back as error completions).
    pub fn post(&mut self, session: SessionId, qp: QueuePairId, requests: Vec<WorkRequest>) -> Result<()> {
        let r = self.dp.post(session, qp, requests);
        self.pump();
        r
    }

    /// Hands the transport whatever FPDUs the queue pairs have, within each connection's window.
    fn pump(&mut self) {
        let conns = &self.conns;
        let out = self.dp.transmit(|conn| {
            conns
                .get(&conn)
                .filter(|c| {
                    matches!(c.phase, Phase::Established)
                        && !c.tx_held
                        && !c.first_fpdu.as_ref().is_some_and(FirstFpduHold::holds_data)
                })
                .map_or(0, |c| TRANSMIT_WINDOW.saturating_sub(c.in_flight))
        });
        for (conn, data) in out {
            self.send(conn, data);
        }
    }

    /// Queues bytes for a connection, counting them against its window.
    fn send(&mut self, conn: ConnId, data: Bytes) {
        if let Some(c) = self.conns.get_mut(&conn) {
            if let Some(hold) = &mut c.first_fpdu
                && hold.holds_data()
            {
                hold.keep(data);
                return;
            }
            c.in_flight += data.len();
        }
        self.transmit.push_back(TransportCommand::Send { conn, data });
    }

    fn complete(&mut self, session: SessionId, request: RequestId, result: Result<CmResponse>) {
        self.events
            .push_back((session, CmEvent::Completed { request, result }));
    }

    fn connector(&self, session: SessionId, id: ConnectorId) -> Result<&Connector> {
        self.connectors
            .get(&id)
            .filter(|c| c.session == session)
            .ok_or_else(|| not_found("connector", id.0))
    }

    fn connector_mut(&mut self, session: SessionId, id: ConnectorId) -> Result<&mut Connector> {
        self.connectors
            .get_mut(&id)
            .filter(|c| c.session == session)
            .ok_or_else(|| not_found("connector", id.0))
    }

    fn listener_mut(&mut self, session: SessionId, id: ListenerId) -> Result<&mut Listener> {
        self.listeners
            .get_mut(&id)
            .filter(|l| l.session == session)
            .ok_or_else(|| not_found("listener", id.0))
    }

    /// Handles one request. `Ok(CmResponse::Pending)`: it completes later with [`CmEvent::Completed`].
    pub fn handle_request(
        &mut self,
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
        let r = self.on_request(now, session, request, req);
        if r.is_ok() {
            self.count_objects(session, delta);
        }
        self.pump();
        r
    }

    /// INSUFFICIENT_RESOURCES when `session` already holds `max_objects_per_session` objects.
    fn check_object_limit(&self, session: SessionId) -> Result<()> {
        let held = self.objects.get(&session).copied().unwrap_or(0);
        if held >= self.config.max_objects_per_session {
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

    fn on_request(
        &mut self,
        now: Instant,
        session: SessionId,
        request: RequestId,
        req: CmRequest,
    ) -> Result<CmResponse> {
        match req {
            CmRequest::RegisterMemory { .. } => Err(Error::new(
                NdStatus::InvalidParameter,
                "RegisterMemory must carry the region's memfd (SCM_RIGHTS)",
            )),
            CmRequest::DeregisterMemory { region } => self.dp.deregister_memory(session, region),
            CmRequest::CreateCompletionQueue { depth } => self.dp.create_cq(session, depth),
            CmRequest::CloseCompletionQueue { cq } => self.dp.close_cq(session, cq),
            CmRequest::CreateQueuePair { config } => self.dp.create_qp(session, config),
            CmRequest::CloseQueuePair { qp } => {
                // Releasing a connected queue pair disconnects implicitly (connector-semantics).
                if let Some(connector) = self.dp.close_qp(session, qp)? {
                    let live = self
                        .connectors
                        .get(&connector)
                        .is_some_and(|c| !matches!(c.state, ConnectorState::Closed | ConnectorState::Idle));
                    if live {
                        self.disconnect(connector, NdStatus::Canceled);
                    }
                    if let Some(c) = self.connectors.get_mut(&connector) {
                        c.qp = None;
                    }
                }
                Ok(CmResponse::Done)
            }
            CmRequest::QueryQueuePair { qp } => self.dp.qp_status(session, qp).map(CmResponse::QueuePairInfo),
            CmRequest::Query => Ok(CmResponse::Adapter(self.config.adapter.clone())),
            CmRequest::Status => Ok(CmResponse::Status(self.status())),
            CmRequest::CreateConnector => {
                let id = ConnectorId(self.id());
                self.connectors.insert(id, Connector::new(session));
                Ok(CmResponse::Connector(id))
            }
            CmRequest::CloseConnector { connector } => {
                self.connector(session, connector)?;
                self.close_connector(connector, NdStatus::Canceled);
                Ok(CmResponse::Done)
            }
            CmRequest::Bind { connector, local } => self.bind(session, connector, local),
            CmRequest::Connect {
                connector,
                remote,
                limits,
                private_data,
                shared_endpoint,
                queue_pair,
            } => {
                self.give_queue_pair(session, connector, queue_pair)?;
                self.connect(
                    session,
                    request,
                    connector,
                    remote,
                    limits,
                    private_data,
                    shared_endpoint,
                )
            }
            CmRequest::CompleteConnect { connector } => self.complete_connect(session, connector),
            CmRequest::Accept {
                connector,
                limits,
                private_data,
                queue_pair,
            } => {
                self.give_queue_pair(session, connector, queue_pair)?;
                self.accept(session, request, connector, limits, private_data)
            }
            CmRequest::Reject {
                connector,
                private_data,
            } => self.reject(now, session, connector, private_data),
            CmRequest::GetReadLimits { connector } => {
                let c = self.connector(session, connector)?;
                c.peer_limits.map(CmResponse::ReadLimits).ok_or_else(|| {
                    Error::new(
                        NdStatus::ConnectionInvalid,
                        "no peer limits yet: not connected or connecting",
                    )
                })
            }
            CmRequest::GetPrivateData {
                connector,
                buffer_len,
            } => {
                let c = self.connector(session, connector)?;
                let data = c.peer_private_data.clone().ok_or_else(|| {
                    Error::new(
                        NdStatus::ConnectionInvalid,
                        "the peer has sent no private data yet",
                    )
                })?;
                let required = data.len() as u32;
                let data = data.slice(..data.len().min(buffer_len as usize));
                Ok(CmResponse::PrivateData { data, required })
            }
            CmRequest::GetLocalAddress { connector } => {
                let c = self.connector(session, connector)?;
                match (c.state, c.local) {
                    (ConnectorState::Idle | ConnectorState::Closed, _) | (_, None) => Err(Error::new(
                        NdStatus::ConnectionInvalid,
                        "connector is not bound, connecting or connected",
                    )),
                    (_, Some(a)) => Ok(CmResponse::Address(a)),
                }
            }
            CmRequest::GetPeerAddress { connector } => {
                let c = self.connector(session, connector)?;
                match (c.state, c.peer) {
                    (
                        ConnectorState::AwaitingComplete
                        | ConnectorState::OfferReceived
                        | ConnectorState::Accepting
                        | ConnectorState::Connected,
                        Some(p),
                    ) => Ok(CmResponse::Address(p)),
                    _ => Err(Error::new(
                        NdStatus::ConnectionInvalid,
                        "connector is not connected",
                    )),
                }
            }
            CmRequest::NotifyDisconnect { connector } => {
                let c = self.connector_mut(session, connector)?;
                match c.state {
                    ConnectorState::Connected
                    | ConnectorState::Accepting
                    | ConnectorState::AwaitingComplete => {
                        c.pending.push((request, PendingOp::NotifyDisconnect));
                        Ok(CmResponse::Pending)
                    }
                    // A connection that existed and has ended: the disconnect has happened, so NotifyDisconnect
                    // completes at once; CONNECTION_INVALID is for a connector that was never connected
                    // (IND2Connector::NotifyDisconnect). `negotiated` is set once a handshake succeeded.
                    ConnectorState::Closed if c.negotiated.is_some() => Ok(CmResponse::Done),
                    _ => Err(Error::new(
                        NdStatus::ConnectionInvalid,
                        "connector is not connected",
                    )),
                }
            }
            CmRequest::Disconnect { connector } => {
                let c = self.connector(session, connector)?;
                match c.state {
                    ConnectorState::Connected
                    | ConnectorState::Accepting
                    | ConnectorState::AwaitingComplete => {
                        self.disconnect(connector, NdStatus::Canceled);
                        Ok(CmResponse::Done)
                    }
                    _ => Err(Error::new(
                        NdStatus::ConnectionInvalid,
                        "connector is not connected",
                    )),
                }
            }
            CmRequest::Cancel { object } => {
                match object {
                    ObjectRef::Connector(id) => {
                        let c = self.connector(session, id)?;
                        if c.state == ConnectorState::Connecting {
                            // Abandoning a pending Connect (IND2Connector::Connect remarks): RST; the passive
                            // side's Accept then fails with CONNECTION_ABORTED.
                            self.abort_connector(id, NdStatus::Canceled);
                        } else {
                            self.fail_pending(id, NdStatus::Canceled, "request cancelled");
                        }
                    }
                    ObjectRef::Listener(id) => {
                        let l = self.listener_mut(session, id)?;
                        let waiting: Vec<_> = l.waiting.drain(..).collect();
                        for (r, _) in waiting {
                            self.complete(
                                session,
                                r,
                                Err(Error::new(NdStatus::Canceled, "request cancelled")),
                            );
                        }
                    }
                }
                Ok(CmResponse::Done)
            }
            CmRequest::CreateListener => {
                let id = ListenerId(self.id());
                self.listeners.insert(
                    id,
                    Listener {
                        session,
                        local: None,
                        backlog: 0,
                        queued: VecDeque::new(),
                        waiting: VecDeque::new(),
                    },
                );
                Ok(CmResponse::Listener(id))
            }
            CmRequest::CloseListener { listener } => {
                self.listener_mut(session, listener)?;
                self.close_listener(listener);
                Ok(CmResponse::Done)
            }
            CmRequest::Listen {
                listener,
                local,
                backlog,
            } => {
                let l = self.listener_mut(session, listener)?;
                if l.local.is_some() {
                    return Err(Error::new(
                        NdStatus::InvalidParameter,
                        "listener is already listening",
                    ));
                }
                let bound = self.ports.bind_listener(local, self.host.as_mut())?;
                let l = self.listeners.get_mut(&listener).expect("checked");
                l.local = Some(bound);
                l.backlog = backlog;
                self.transmit.push_back(TransportCommand::Listen {
                    listener,
                    local: bound,
                });
                info!(listener = listener.0, %bound, backlog, "listening");
                Ok(CmResponse::Bound(bound))
            }
            CmRequest::GetConnectionRequest { listener, connector } => {
                let c = self.connector(session, connector)?;
                if c.state != ConnectorState::Idle {
                    return Err(Error::new(
                        NdStatus::ConnectionActive,
                        "connector is already in use",
                    ));
                }
                let l = self.listener_mut(session, listener)?;
                if l.local.is_none() {
                    return Err(Error::new(
                        NdStatus::ConnectionInvalid,
                        "listener is not listening",
                    ));
                }
                if let Some(conn) = l.queued.pop_front() {
                    Ok(self.attach_offer(conn, connector))
                } else {
                    l.waiting.push_back((request, connector));
                    Ok(CmResponse::Pending)
                }
            }
            CmRequest::CreateSharedEndpoint { local } => {
                let bound = self.ports.bind(local, true, self.host.as_mut())?;
                let id = SharedEndpointId(self.id());
                self.endpoints.insert(
                    id,
                    SharedEndpoint {
                        session,
                        local: bound,
                    },
                );
                Ok(CmResponse::SharedEndpoint(id))
            }
            CmRequest::CloseSharedEndpoint { endpoint } => {
                let ep = self
                    .endpoints
                    .get(&endpoint)
                    .filter(|e| e.session == session)
                    .ok_or_else(|| not_found("shared endpoint", endpoint.0))?;
                let local = ep.local;
                self.endpoints.remove(&endpoint);
                self.ports.release(local, self.host.as_mut());
                let _ = now;
                Ok(CmResponse::Done)
            }
        }
    }

    /// Connect/Accept with a queue pair: checked and recorded before the connection is attempted. The
    /// connector's own checks follow; a failed Connect/Accept leaves the queue pair given to this connector
    /// (it may retry with it), never to another.
    fn give_queue_pair(
        &mut self,
        session: SessionId,
        connector: ConnectorId,
        qp: Option<QueuePairId>,
    ) -> Result<()> {
        let c = self.connector(session, connector)?;
        let Some(qp) = qp else { return Ok(()) };
        if c.qp.is_some_and(|q| q != qp) {
            return Err(Error::new(
                NdStatus::ConnectionActive,
                "connector already has another queue pair",
            ));
        }
        self.dp.check_attachable(session, qp, connector)?;
        self.dp.attach(qp, connector);
        self.connectors.get_mut(&connector).expect("checked").qp = Some(qp);
        Ok(())
    }

    /// The queue pair's parameters once the connection is in FPDU mode.
    fn qp_params(&self, connector: ConnectorId, conn: ConnId) -> Option<(QueuePairId, QpParams)> {
        let c = self.connectors.get(&connector)?;
        let cn = self.conns.get(&conn)?;
        let effective = c.effective.unwrap_or_default();
        Some((
            c.qp?,
            QpParams {
                crc: cn.crc,
                max_ulpdu: cn.max_ulpdu,
                ird: effective.inbound,
                ord: effective.outbound,
            },
        ))
    }

    fn bind(&mut self, session: SessionId, connector: ConnectorId, local: SocketAddr) -> Result<CmResponse> {
        let c = self.connector(session, connector)?;
        if c.state != ConnectorState::Idle {
            return Err(Error::new(
                NdStatus::InvalidParameter,
                "connector is already bound or in use",
            ));
        }
        let bound = self.ports.bind(local, false, self.host.as_mut())?;
        let c = self.connectors.get_mut(&connector).expect("checked");
        c.local = Some(bound);
        c.owned_binding = Some(bound);
        c.state = ConnectorState::Bound;
        Ok(CmResponse::Bound(bound))
    }

    #[allow(clippy::too_many_arguments)]
    fn connect(
        &mut self,
        session: SessionId,
        request: RequestId,
        connector: ConnectorId,
        remote: SocketAddr,
        limits: ReadLimits,
        private_data: Bytes,
        shared_endpoint: Option<SharedEndpointId>,
    ) -> Result<CmResponse> {
        let c = self.connector(session, connector)?;
        match c.state {
            ConnectorState::Idle | ConnectorState::Bound => {}
            ConnectorState::Closed => {
                return Err(Error::new(
                    NdStatus::ConnectionInvalid,
                    "a failed or closed connector cannot be reused",
                ));
            }
            _ => {
                return Err(Error::new(
                    NdStatus::ConnectionActive,
                    "connector is already connecting or connected",
                ));
            }
        }
        check_private_data(
            private_data.len(),
            self.config.adapter.max_caller_data,
            "MaxCallerData",
        )?;
        let (local, implicit) = match shared_endpoint {
            Some(ep) => {
                if c.state == ConnectorState::Bound {
                    return Err(Error::new(
                        NdStatus::InvalidParameter,
                        "a bound connector cannot use a shared endpoint",
                    ));
                }
                let ep = self
                    .endpoints
                    .get(&ep)
                    .filter(|e| e.session == session)
                    .ok_or_else(|| not_found("shared endpoint", ep.0))?;
                (ep.local, false)
            }
            None => match c.local {
                Some(l) => (l, false),
                // Connect without Bind binds implicitly (connector-semantics "The active side" 1).
                None => (
                    self.ports
                        .bind(unspecified_like(remote), false, self.host.as_mut())?,
                    true,
                ),
            },
        };
        if let Err(e) = self.ports.add_tuple(local, remote) {
            if implicit {
                self.ports.release(local, self.host.as_mut());
            }
            return Err(e);
        }
        let limits_on_wire = read_limits::capped(limits, &self.config.adapter);
        let (initiator, request_bytes) =
            match MpaInitiator::new(&self.config.mpa, limits_on_wire, &private_data) {
                Ok(x) => x,
                Err(e) => {
                    self.ports.remove_tuple(local, remote);
                    if implicit {
                        self.ports.release(local, self.host.as_mut());
                    }
                    return Err(e);
                }
            };
        let conn = ConnId(self.id());
        self.conns.insert(
            conn,
            Conn::new(
                Some(connector),
                local,
                remote,
                Phase::TcpConnecting {
                    initiator,
                    request: request_bytes,
                },
            ),
        );
        let c = self.connectors.get_mut(&connector).expect("checked");
        if implicit {
            c.owned_binding = Some(local);
        }
        c.local = Some(local);
        c.tuple = Some((local, remote));
        c.peer = Some(remote);
        c.conn = Some(conn);
        c.own_limits = limits;
        c.state = ConnectorState::Connecting;
        c.retry = (self.config.mpa.revision >= 2).then(|| RetryPlan {
            remote,
            private_data,
            limits,
        });
        c.pending.push((request, PendingOp::Connect));
        self.transmit
            .push_back(TransportCommand::Connect { conn, local, remote });
        debug!(connector = connector.0, %local, %remote, conn = conn.0, "connecting");
        Ok(CmResponse::Pending)
    }

    fn complete_connect(&mut self, session: SessionId, connector: ConnectorId) -> Result<CmResponse> {
        let c = self.connector_mut(session, connector)?;
        if c.state != ConnectorState::AwaitingComplete {
            return Err(Error::new(
                NdStatus::ConnectionInvalid,
                "connector is not connecting (no accepted Reply)",
            ));
        }
        c.state = ConnectorState::Connected;
        let (conn, negotiated) = (c.conn, c.negotiated);
        if let (Some(conn), Some(n)) = (conn, negotiated)
            && let Some(rtr) = n.rtr
        {
            // RFC 6581 §9: in peer-to-peer mode the initiator's first FPDU is the RTR.
            self.send(conn, mpa::rtr_fpdu(rtr, n.crc));
        }
        if let Some(conn) = conn
            && let Some((qp, params)) = self.qp_params(connector, conn)
        {
            // The active side may send as soon as it completes the connection (RFC 5044 §7.1).
            self.dp.connected(qp, conn, params, true);
            if let Some(rtr) = negotiated.and_then(|n| n.rtr) {
                // The RTR went first on the queue pair's queues (a Read RTR takes Read Request MSN 1).
                self.dp.rtr_sent(qp, rtr);
            }
        }
        Ok(CmResponse::Done)
    }

    fn accept(
        &mut self,
        session: SessionId,
        request: RequestId,
        connector: ConnectorId,
        limits: ReadLimits,
        private_data: Bytes,
    ) -> Result<CmResponse> {
        let c = self.connector(session, connector)?;
        match c.state {
            ConnectorState::OfferReceived => {}
            ConnectorState::Connected | ConnectorState::Accepting | ConnectorState::Connecting => {
                return Err(Error::new(
                    NdStatus::ConnectionActive,
                    "connector is already connected",
                ));
            }
            _ => {
                return Err(Error::new(
                    NdStatus::ConnectionInvalid,
                    "connector has no connection request to accept",
                ));
            }
        }
        if c.aborted {
            return Err(Error::new(
                NdStatus::ConnectionAborted,
                "the connecting peer abandoned the connection",
            ));
        }
        check_private_data(
            private_data.len(),
            self.config.adapter.max_callee_data,
            "MaxCalleeData",
        )?;
        let offer = c.offer.clone().expect("OfferReceived has an offer");
        let conn = c.conn.expect("OfferReceived has a connection");
        let adapter = self.config.adapter.clone();
        let wire_limits = match &offer.enhanced {
            Some(w) => read_limits::responder_offer(limits, w, &adapter),
            None => read_limits::capped(limits, &adapter),
        };
        let (reply, negotiated) = offer.accept(&self.config.mpa, wire_limits, &private_data)?;
        let peer = c.peer_limits.unwrap_or(read_limits::capped(limits, &adapter));
        let effective = read_limits::effective(limits, peer, &adapter);
        self.send(conn, reply);
        let cn = self.conns.get_mut(&conn).expect("attached connection exists");
        cn.phase = Phase::Established;
        cn.crc = negotiated.crc;
        cn.awaiting_rtr = negotiated.peer_to_peer;
        // The responder sends nothing until the initiator's first FPDU (RFC 5044 §7.1) or RTR (RFC 6581 §9).
        cn.tx_held = true;
        let c = self.connectors.get_mut(&connector).expect("checked");
        c.own_limits = limits;
        c.effective = Some(effective);
        c.negotiated = Some(negotiated);
        if let Some((qp, params)) = self.qp_params(connector, conn) {
            self.dp.connected(qp, conn, params, false);
        }
        let c = self.connectors.get_mut(&connector).expect("checked");
        let result = if negotiated.peer_to_peer {
            c.state = ConnectorState::Accepting;
            c.pending.push((request, PendingOp::Accept));
            CmResponse::Pending
        } else {
            c.state = ConnectorState::Connected;
            CmResponse::Done
        };
        Ok(result)
    }

    fn reject(
        &mut self,
        now: Instant,
        session: SessionId,
        connector: ConnectorId,
        private_data: Bytes,
    ) -> Result<CmResponse> {
        let c = self.connector(session, connector)?;
        match c.state {
            ConnectorState::OfferReceived => {
                check_private_data(
                    private_data.len(),
                    self.config.adapter.max_callee_data,
                    "MaxCalleeData",
                )?;
                let offer = c.offer.clone().expect("OfferReceived has an offer");
                let conn = c.conn.expect("OfferReceived has a connection");
                let reply = offer.reject(&private_data)?;
                self.send(conn, reply);
                self.finish_connector_closing(connector, Closing::LingerThenFin(now + REJECT_LINGER));
                Ok(CmResponse::Done)
            }
            // The active side refusing the limits it saw (IND2Connector::Reject after Connect completes).
            ConnectorState::AwaitingComplete => {
                self.finish_connector(connector, false);
                Ok(CmResponse::Done)
            }
            _ => Err(Error::new(
                NdStatus::ConnectionInvalid,
                "connector has nothing to reject",
            )),
        }
    }

    /// Attaches the queued offer on `conn` to `connector`; returns the completion value.
    fn attach_offer(&mut self, conn: ConnId, connector: ConnectorId) -> CmResponse {
        let adapter = self.config.adapter.clone();
        let cn = self.conns.get_mut(&conn).expect("queued connection exists");
        cn.connector = Some(connector);
        let offer = cn.offer.clone().expect("an offered connection has its offer");
        let (local, remote) = (cn.local, cn.remote);
        let c = self.connectors.get_mut(&connector).expect("caller checked");
        let peer_limits = match &offer.enhanced {
            Some(w) => {
                let v = read_limits::peer_view(w.ird, w.ord);
                ReadLimits {
                    inbound: v.inbound.min(adapter.max_inbound_read_limit),
                    outbound: v.outbound.min(adapter.max_outbound_read_limit),
                }
            }
            // An RFC 5044 peer sends no limits: report the adapter's (nothing was negotiated).
            None => ReadLimits {
                inbound: adapter.max_inbound_read_limit,
                outbound: adapter.max_outbound_read_limit,
            },
        };
        c.state = ConnectorState::OfferReceived;
        c.local = Some(local);
        c.peer = Some(remote);
        c.conn = Some(conn);
        c.tuple = Some((local, remote));
        c.peer_limits = Some(peer_limits);
        c.peer_private_data = Some(offer.private_data.clone());
        c.offer = Some(offer.clone());
        CmResponse::ConnectionRequest {
            connector,
            peer: remote,
            limits: peer_limits,
            private_data: offer.private_data,
        }
    }

    /// Completes every pending request of `connector` with `status`.
    fn fail_pending(&mut self, connector: ConnectorId, status: NdStatus, why: &'static str) {
        let Some(c) = self.connectors.get_mut(&connector) else {
            return;
        };
        let session = c.session;
        let pending: Vec<_> = c.pending.drain(..).collect();
        for (r, _) in pending {
            self.complete(session, r, Err(Error::new(status, why)));
        }
    }

    /// Releases the connector's connection, tuple and port, and marks it Closed. `abort`: RST, else FIN.
    fn finish_connector(&mut self, connector: ConnectorId, abort: bool) {
        self.finish_connector_closing(connector, if abort { Closing::Rst } else { Closing::Fin });
    }

    /// [`Self::finish_connector`], closing the connection as `how` says.
    fn finish_connector_closing(&mut self, connector: ConnectorId, how: Closing) {
        let Some(c) = self.connectors.get_mut(&connector) else {
            return;
        };
        c.state = ConnectorState::Closed;
        if let Some(qp) = c.qp {
            // Disconnect flushes the queue pair with CANCELED; it cannot be reused (IND2Connector::Disconnect).
            self.dp.detach(qp, NdStatus::Canceled);
        }
        let c = self.connectors.get_mut(&connector).expect("exists");
        let conn = c.conn.take();
        let tuple = c.tuple.take();
        let binding = c.owned_binding.take();
        if let Some(conn) = conn
            && let Some(cn) = self.conns.get_mut(&conn)
        {
            cn.connector = None;
            match how {
                // The FIN waits for the first-FPDU hold too, behind what it holds: siw would otherwise see it
                // while still completing its accept ([`first_fpdu`]).
                Closing::Fin if cn.first_fpdu.is_some() => {
                    cn.phase = Phase::Closing;
                    if let Some(hold) = &mut cn.first_fpdu {
                        hold.close_after();
                    }
                }
                Closing::Rst | Closing::Fin => {
                    cn.first_fpdu = None;
                    cn.phase = Phase::Closing;
                    self.transmit.push_back(TransportCommand::Close {
                        conn,
                        abort: how == Closing::Rst,
                    });
                }
                Closing::LingerThenFin(until) => {
                    cn.phase = Phase::Lingering { until };
                    self.timers.insert((until, conn));
                }
            }
        }
        if let Some((l, r)) = tuple {
            self.ports.remove_tuple(l, r);
        }
        if let Some(b) = binding {
            self.ports.release(b, self.host.as_mut());
        }
    }

    fn disconnect(&mut self, connector: ConnectorId, status: NdStatus) {
        self.fail_pending(connector, status, "disconnected");
        self.finish_connector(connector, false);
    }

    fn abort_connector(&mut self, connector: ConnectorId, status: NdStatus) {
        self.fail_pending(connector, status, "connect abandoned");
        self.finish_connector(connector, true);
    }

    fn close_connector(&mut self, connector: ConnectorId, status: NdStatus) {
        let connecting = self
            .connectors
            .get(&connector)
            .is_some_and(|c| c.state == ConnectorState::Connecting);
        if connecting {
            self.abort_connector(connector, status);
        } else {
            self.disconnect(connector, status);
        }
        self.connectors.remove(&connector);
    }

    fn close_listener(&mut self, listener: ListenerId) {
        let Some(l) = self.listeners.remove(&listener) else {
            return;
        };
        for (r, _) in l.waiting {
            self.complete(
                l.session,
                r,
                Err(Error::new(NdStatus::Canceled, "listener closed")),
            );
        }
        // Offers nobody took, and connections still handshaking, are refused by closing them.
        let orphans: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                c.connector.is_none()
                    && matches!(c.phase, Phase::AwaitingRequest { listener: x, .. } | Phase::Offered { listener: x } if x == listener)
            })
            .map(|(id, _)| *id)
            .collect();
        for conn in orphans {
            self.close_conn(conn, true);
        }
        if let Some(local) = l.local {
            self.transmit
                .push_back(TransportCommand::StopListening { listener });
            self.ports.release(local, self.host.as_mut());
        }
    }

    fn close_conn(&mut self, conn: ConnId, abort: bool) {
        if let Some(cn) = self.conns.get_mut(&conn) {
            if cn.connector.is_none() {
                self.ports.remove_tuple(cn.local, cn.remote);
            }
            cn.phase = Phase::Closing;
            self.transmit.push_back(TransportCommand::Close { conn, abort });
        }
    }

    /// The session went away: everything it held is released.
    pub fn close_session(&mut self, _now: Instant, session: SessionId) {
        let connectors: Vec<_> = self
            .connectors
            .iter()
            .filter(|(_, c)| c.session == session)
            .map(|(i, _)| *i)
            .collect();
        for c in connectors {
            self.close_connector(c, NdStatus::Canceled);
        }
        let listeners: Vec<_> = self
            .listeners
            .iter()
            .filter(|(_, l)| l.session == session)
            .map(|(i, _)| *i)
            .collect();
        for l in listeners {
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
        self.dp.close_session(session);
        self.objects.remove(&session);
        self.sessions.remove(&session);
        // Completions for a session that is gone have nowhere to go.
        self.events.retain(|(s, _)| *s != session);
    }

    /// The adapter goes away: every pending request completes with DEVICE_REMOVED, everything closes.
    pub fn shutdown(&mut self, now: Instant) {
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
            self.close_session(now, s);
        }
        self.events = events;
    }

    pub fn handle_timeout(&mut self, now: Instant) {
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
                    warn!(
                        conn = conn.0,
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
                Phase::Established | Phase::Closing
                    if c.first_fpdu.as_ref().is_some_and(|h| h.until() <= now) =>
                {
                    let hold = self.config.first_fpdu_hold;
                    let Some(step) = c.first_fpdu.as_mut().map(|h| h.on_deadline(now, hold)) else {
                        continue;
                    };
                    if !step.keep {
                        c.first_fpdu = None;
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
        self.pump();
    }

    pub fn handle_transport(&mut self, now: Instant, event: TransportEvent) {
        self.on_transport(now, event);
        self.pump();
    }

    fn on_transport(&mut self, now: Instant, event: TransportEvent) {
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
                    Conn {
                        max_ulpdu: max_ulpdu_for(mss as usize),
                        ..Conn::new(
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
                self.fail_connect(connector, Error::new(status, why));
            }
            TransportEvent::Received { conn, data } => self.on_received(now, conn, &data),
            TransportEvent::Closed { conn } => self.on_closed(conn),
            TransportEvent::Written { conn, bytes } => {
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.in_flight = c.in_flight.saturating_sub(bytes);
                    if let Some(qp) = c
                        .connector
                        .and_then(|id| self.connectors.get(&id))
                        .and_then(|c| c.qp)
                    {
                        self.dp.wake(qp);
                    }
                }
            }
        }
    }

    /// Fails the pending Connect with `error` and resets the connection.
    fn fail_connect(&mut self, connector: ConnectorId, error: Error) {
        self.fail_connect_closing(connector, error, true);
    }

    /// Fails the pending Connect with `error`; `abort`: RST, else FIN after what was queued (a Terminate).
    fn fail_connect_closing(&mut self, connector: ConnectorId, error: Error, abort: bool) {
        let Some(c) = self.connectors.get_mut(&connector) else {
            return;
        };
        let session = c.session;
        if let Some(r) = c.take_pending(PendingOp::Connect) {
            self.complete(session, r, Err(error));
        }
        self.finish_connector(connector, abort);
    }

    fn on_received(&mut self, now: Instant, conn: ConnId, data: &[u8]) {
        let Some(cn) = self.conns.get_mut(&conn) else {
            return;
        };
        match &mut cn.phase {
            Phase::AwaitingReply { initiator } => {
                let outcome = initiator.on_bytes(data);
                let crc_in_use = initiator.crc_in_use();
                let connector = cn.connector;
                let crc_cfg = self.config.mpa.crc_required;
                let Some(connector) = connector else { return };
                match outcome {
                    Ok(None) => {}
                    Ok(Some(ReplyOutcome::Accepted {
                        negotiated,
                        private_data,
                        leftover,
                    })) => {
                        cn.phase = Phase::Established;
                        cn.crc = negotiated.crc || crc_cfg;
                        cn.first_fpdu = FirstFpduHold::start(now, self.config.first_fpdu_hold);
                        self.arm_timer(conn);
                        let adapter = self.config.adapter.clone();
                        let c = self
                            .connectors
                            .get_mut(&connector)
                            .expect("a connection's connector exists");
                        let peer = match negotiated.peer_word {
                            Some(w) => read_limits::peer_view(w.ird, w.ord),
                            None => read_limits::capped(c.own_limits, &adapter),
                        };
                        let peer = ReadLimits {
                            inbound: peer.inbound.min(adapter.max_inbound_read_limit),
                            outbound: peer.outbound.min(adapter.max_outbound_read_limit),
                        };
                        c.peer_limits = Some(peer);
                        c.effective = Some(read_limits::effective(c.own_limits, peer, &adapter));
                        c.peer_private_data = Some(private_data);
                        c.negotiated = Some(negotiated);
                        c.state = ConnectorState::AwaitingComplete;
                        c.retry = None;
                        let session = c.session;
                        if let Some(r) = c.take_pending(PendingOp::Connect) {
                            self.complete(session, r, Ok(CmResponse::Done));
                        }
                        if !leftover.is_empty() {
                            self.on_fpdu_bytes(conn, &leftover);
                        }
                    }
                    Ok(Some(ReplyOutcome::Rejected { private_data })) => {
                        let c = self
                            .connectors
                            .get_mut(&connector)
                            .expect("a connection's connector exists");
                        c.peer_private_data = Some(private_data);
                        c.retry = None;
                        self.fail_connect(
                            connector,
                            Error::new(NdStatus::ConnectionRefused, "the peer rejected the connection"),
                        );
                    }
                    Err(e) => {
                        warn!(conn = conn.0, error = %e, "MPA Reply refused");
                        let terminate = e.terminate_cause();
                        if let Some(cause) = terminate {
                            // RFC 6581 §9: these are reported to the responder with a Terminate, in FPDU mode:
                            // with a CRC if the Reply or we asked for one (RFC 5044 §7.1).
                            self.send(conn, terminate_fpdu(cause, crc_in_use));
                        }
                        if let Some(c) = self.connectors.get_mut(&connector) {
                            c.retry = None;
                        }
                        // After a Terminate, a FIN: a reset could discard the Terminate before it is sent.
                        self.fail_connect_closing(
                            connector,
                            Error::new(NdStatus::ConnectionAborted, format!("MPA handshake failed: {e}")),
                            terminate.is_none(),
                        );
                    }
                }
            }
            Phase::AwaitingRequest { listener, responder } => {
                let listener = *listener;
                match responder.on_bytes(data) {
                    Ok(None) => {}
                    Ok(Some(offer)) => self.on_offer(conn, listener, offer),
                    Err(mpa::MpaError::MarkersRequested { revision }) => {
                        // siw answers M=1 with an R=1 Reply and closes (iwarp-wire.md §1).
                        warn!(conn = conn.0, "MPA Request asks for markers; rejecting");
                        self.send(conn, mpa::reject_reply(revision, false, &[]));
                        self.close_conn(conn, false);
                    }
                    Err(e) => {
                        warn!(conn = conn.0, error = %e, "bad MPA Request; closing");
                        self.close_conn(conn, true);
                    }
                }
            }
            Phase::Offered { listener } => {
                // RFC 5044 §7.1.2: the initiator sends nothing between its Request and our Reply (siw: -EPROTO).
                // Refused rather than kept for after the Accept, which may be a long time coming: the peer
                // abandoned the handshake, so a queued offer is withdrawn and a taken one's Accept fails with
                // CONNECTION_ABORTED (on_closed → peer_gone).
                let listener = *listener;
                let e = mpa::MpaError::DataBeforeReply { bytes: data.len() };
                warn!(conn = conn.0, error = %e, "bad MPA handshake; resetting");
                if let Some(l) = self.listeners.get_mut(&listener) {
                    l.queued.retain(|c| *c != conn);
                }
                self.close_conn(conn, true);
            }
            Phase::Established => self.on_fpdu_bytes(conn, data),
            Phase::TcpConnecting { .. } | Phase::Closing | Phase::Lingering { .. } => {}
        }
    }

    fn on_offer(&mut self, conn: ConnId, listener: ListenerId, offer: MpaOffer) {
        let Some(l) = self.listeners.get_mut(&listener) else {
            self.close_conn(conn, true);
            return;
        };
        if l.backlog != 0 && l.queued.len() >= l.backlog as usize && l.waiting.is_empty() {
            // Past the backlog offers are refused: CONNECTION_REFUSED at the active side (connector-semantics).
            let reply = mpa::reject_reply(offer.revision, offer.enhanced.is_some(), &[]);
            self.send(conn, reply);
            self.close_conn(conn, false);
            return;
        }
        let cn = self.conns.get_mut(&conn).expect("caller has it");
        cn.phase = Phase::Offered { listener };
        cn.offer = Some(offer);
        let l = self.listeners.get_mut(&listener).expect("checked");
        if let Some((request, connector)) = l.waiting.pop_front() {
            let session = l.session;
            let response = self.attach_offer(conn, connector);
            self.complete(session, request, Ok(response));
        } else {
            l.queued.push_back(conn);
        }
    }

    /// FPDU-mode bytes: the RTR, a Terminate, or data messages for the connection's queue pair.
    fn on_fpdu_bytes(&mut self, conn: ConnId, data: &[u8]) {
        let max_ulpdu = self.config.max_ulpdu;
        let Some(cn) = self.conns.get_mut(&conn) else {
            return;
        };
        cn.rx.extend_from_slice(data);
        loop {
            let Some(cn) = self.conns.get_mut(&conn) else {
                return;
            };
            if !matches!(cn.phase, Phase::Established) {
                return;
            }
            let len = match FpduRepr::frame_len(&cn.rx, max_ulpdu) {
                Ok(Some(len)) if cn.rx.len() >= len => len,
                Ok(_) => return,
                Err(e) => return self.terminate(conn, e.terminate_cause()),
            };
            let frame = cn.rx.split_to(len).freeze();
            if cn.crc
                && let Err(e) = fpdu::verify_crc(&frame)
            {
                return self.terminate(conn, e.terminate_cause());
            }
            let msg = match FpduRepr::parse(&frame, max_ulpdu).and_then(|f| MessageRepr::parse(f.ulpdu)) {
                Ok(m) => m,
                Err(e) => return self.terminate(conn, e.terminate_cause()),
            };
            let rtr = mpa::is_rtr(&msg);
            let first = cn.tx_held;
            cn.tx_held = false;
            let awaiting_rtr = cn.awaiting_rtr;
            cn.awaiting_rtr = false;
            let connector = cn.connector;
            let qp = connector.and_then(|c| self.connectors.get(&c)).and_then(|c| c.qp);
            if first && let Some(qp) = qp {
                // The initiator's first FPDU: the responder may send from now on (RFC 5044 §7.1).
                self.dp.open_transmit(qp);
            }
            if msg.opcode == RdmapOpcode::Terminate {
                let cause = msg.terminate().ok().map(|t| t.cause);
                info!(conn = conn.0, ?cause, "peer sent a Terminate; closing");
                if let (Some(qp), Some(cause)) = (qp, cause) {
                    self.dp.peer_terminated(qp, cause);
                }
                self.close_conn(conn, false);
                if let Some(c) = connector {
                    self.peer_gone(c);
                }
                return;
            }
            if awaiting_rtr && let Some(c) = connector.and_then(|c| self.connectors.get_mut(&c)) {
                // The initiator called CompleteConnect: the passive Accept completes (RFC 6581 §9).
                c.state = ConnectorState::Connected;
                let session = c.session;
                if let Some(r) = c.take_pending(PendingOp::Accept) {
                    self.complete(session, r, Ok(CmResponse::Done));
                }
                if let Some(kind) = rtr {
                    match qp {
                        // A Read RTR is answered with a zero-length Read Response (siw waits for it).
                        Some(qp) => {
                            if let Err(cause) = self.dp.rtr_received(qp, &msg) {
                                return self.terminate(conn, Some(cause));
                            }
                        }
                        None if kind == mpa::Rtr::Read => {
                            let crc = self.conns.get(&conn).is_some_and(|c| c.crc);
                            if let Ok(rr) = msg.read_request() {
                                self.send(conn, read_rtr_response(&rr, crc));
                            }
                        }
                        None => {}
                    }
                    continue;
                }
            }
            match qp {
                Some(qp) => {
                    if let Err(cause) = self.dp.on_message(qp, &msg) {
                        return self.terminate(conn, Some(cause));
                    }
                }
                None => {
                    self.fpdus_without_queue_pair += 1;
                    debug!(conn = conn.0, opcode = ?msg.opcode, "data message on a connection without a queue pair; dropped");
                }
            }
        }
    }

    /// Sends a Terminate carrying `cause` (RFC 5040 §4.8) and closes; the queue pair has already completed
    /// what was outstanding (or is flushed by `peer_gone`).
    fn terminate(&mut self, conn: ConnId, cause: Option<TerminateCause>) {
        let crc = self.conns.get(&conn).is_some_and(|c| c.crc);
        // The Terminate goes out now; what a first-FPDU hold kept is dropped with the stream.
        if let Some(c) = self.conns.get_mut(&conn) {
            c.first_fpdu = None;
        }
        warn!(conn = conn.0, ?cause, "terminating the stream");
        let connector = self.conns.get(&conn).and_then(|c| c.connector);
        if let Some(cause) = cause {
            if let Some(qp) = connector.and_then(|c| self.connectors.get(&c)).and_then(|c| c.qp) {
                self.dp.terminated_locally(qp, cause);
            }
            self.send(conn, terminate_fpdu(cause, crc));
        }
        self.close_conn(conn, false);
        if let Some(c) = connector {
            self.peer_gone(c);
        }
    }

    /// The peer disconnected (FIN/RST, Terminate): NotifyDisconnect fires; a pending Accept is aborted.
    fn peer_gone(&mut self, connector: ConnectorId) {
        let Some(c) = self.connectors.get_mut(&connector) else {
            return;
        };
        let session = c.session;
        match c.state {
            ConnectorState::OfferReceived => {
                c.aborted = true;
                return;
            }
            ConnectorState::Accepting => {
                if let Some(r) = c.take_pending(PendingOp::Accept) {
                    self.complete(
                        session,
                        r,
                        Err(Error::new(
                            NdStatus::ConnectionAborted,
                            "the connecting peer abandoned the connection",
                        )),
                    );
                }
            }
            _ => {}
        }
        let c = self.connectors.get_mut(&connector).expect("exists");
        if let Some(r) = c.take_pending(PendingOp::NotifyDisconnect) {
            self.complete(session, r, Ok(CmResponse::Done));
        }
        self.fail_pending(connector, NdStatus::Canceled, "the peer disconnected");
        self.finish_connector(connector, false);
    }

    fn on_closed(&mut self, conn: ConnId) {
        let Some(cn) = self.conns.remove(&conn) else {
            return;
        };
        let Some(connector) = cn.connector else {
            self.ports.remove_tuple(cn.local, cn.remote);
            if let Phase::Offered { listener } = cn.phase
                && let Some(l) = self.listeners.get_mut(&listener)
            {
                l.queued.retain(|c| *c != conn);
            }
            return;
        };
        match cn.phase {
            Phase::AwaitingReply { initiator } | Phase::TcpConnecting { initiator, .. } => {
                let retry = self.connectors.get_mut(&connector).and_then(|c| c.retry.take());
                match (initiator.on_closed(), retry) {
                    (InitiatorClosed::RetryWithRevisionOne, Some(plan)) => {
                        self.retry_revision_one(connector, conn, plan)
                    }
                    _ => self.fail_connect(
                        connector,
                        Error::new(
                            NdStatus::ConnectionRefused,
                            "the peer closed the connection before replying",
                        ),
                    ),
                }
            }
            _ => {
                if let Some(c) = self.connectors.get_mut(&connector) {
                    c.conn = None;
                }
                self.peer_gone(connector);
            }
        }
    }

    /// RFC 6581 §6 / iwarp-wire.md §1: a responder that closes on S=1 gets one more try with a Rev 1 Request.
    fn retry_revision_one(&mut self, connector: ConnectorId, old: ConnId, plan: RetryPlan) {
        let mpa_v1 = MpaConfig {
            revision: 1,
            ..self.config.mpa.clone()
        };
        let limits = read_limits::capped(plan.limits, &self.config.adapter);
        let Ok((initiator, request)) = MpaInitiator::new(&mpa_v1, limits, &plan.private_data) else {
            self.fail_connect(
                connector,
                Error::new(
                    NdStatus::ConnectionRefused,
                    "the peer closed on an MPA Rev 2 Request",
                ),
            );
            return;
        };
        let Some(c) = self.connectors.get_mut(&connector) else {
            return;
        };
        let local = c
            .local
            .map(|l| SocketAddr::new(c.tuple.map_or(l.ip(), |t| t.0.ip()), l.port()))
            .expect("connecting has a local address");
        let conn = ConnId(self.id());
        let c = self.connectors.get_mut(&connector).expect("exists");
        c.conn = Some(conn);
        info!(
            connector = connector.0,
            old = old.0,
            new = conn.0,
            "peer closed on MPA Rev 2; retrying with Rev 1"
        );
        self.conns.insert(
            conn,
            Conn::new(
                Some(connector),
                local,
                plan.remote,
                Phase::TcpConnecting { initiator, request },
            ),
        );
        self.transmit.push_back(TransportCommand::Connect {
            conn,
            local,
            remote: plan.remote,
        });
    }

    /// Everything the daemon holds.
    pub fn status(&self) -> StatusReport {
        let (queue_pairs, memory_regions) = self.dp.status();
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
        StatusReport {
            listeners,
            connectors,
            shared_endpoints: self.endpoints.values().map(|e| e.local).collect(),
            ports_in_use: self.ports.in_use_count() as u32,
            ports_free: self.ports.free_count() as u32,
            sessions: self.sessions.len() as u32,
            queue_pairs,
            memory_regions,
            transport: None,
        }
    }
}

/// The zero-length Read Response that answers a Read RTR (RFC 6581 §9) on a connection without a queue pair.
fn read_rtr_response(rr: &ReadRequestRepr, crc: bool) -> Bytes {
    let msg = MessageRepr {
        opcode: RdmapOpcode::RdmaReadResponse,
        last: true,
        placement: Placement::Tagged {
            stag: rr.sink_stag,
            offset: rr.sink_offset,
        },
        payload: &[],
    };
    super::framing::fpdu(&msg, crc).expect("an empty Read Response always frames")
}

/// A Terminate FPDU carrying `cause` (RFC 5040 §4.8), MSN 1 on the Terminate queue.
pub fn terminate_fpdu(cause: TerminateCause, crc: bool) -> Bytes {
    let t = TerminateRepr::new(cause);
    let mut body = vec![0u8; t.buffer_len()];
    t.emit(&mut body).expect("sized");
    let msg = MessageRepr {
        opcode: RdmapOpcode::Terminate,
        last: true,
        placement: Placement::Untagged {
            queue: QN_TERMINATE,
            msn: 1,
            offset: 0,
            ulp_field: 0,
        },
        payload: &body,
    };
    super::framing::fpdu(&msg, crc).expect("a Terminate without optional fields always frames")
}
