//! soft-rdmad's event loop: one task owns the [`Rnic`]; sessions, the transport and the engine's
//! timer feed it; after every input it drains the engine's transport commands and session events.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;

use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::engine::cm::CmConfig;
use crate::engine::ids::Domain;
use crate::engine::requests::{CmRequest, ConnectorId, ObjectEvent, RequestId, SessionId};
use crate::engine::rnic::Rnic;
use crate::engine::transport_seam::HostPorts;
use crate::engine::transport_seam::TransportEvent;
use crate::error::{Error, NdStatus};
use crate::status::StatusReport;
use crate::transport::kernel::KernelTransport;
use crate::transport::status::TransportStatus;
use crate::transport::xdp::{NextRound, XdpConfig, XdpTransport};
use crate::uds::budget::Budget;
use crate::uds::messages::Response;
use crate::uds::proto::ServerMessage;
use crate::uds::server::{self, Outbound, Peer, SendMessage, SessionInput, SessionTerms, SessionWriter};

mod metrics;
mod rings;
mod visibility;

/// Everything soft-rdmad needs to run.
#[derive(Clone, Debug)]
pub struct DaemonConfig {
    pub uds_path: PathBuf,
    /// Group owning the socket (mode 0660).
    pub group: Option<String>,
    /// Members of this group (and root) see every session's objects in `status`; anyone else sees those
    /// of sessions with its own uid (`daemon::visibility`).
    pub admin_group: Option<String>,
    pub cm: CmConfig,
    /// `Some`: soft-rdma's connections run over XDP/AF_XDP on that interface (`transport::xdp`);
    /// `None`: kernel TCP.
    pub xdp: Option<XdpConfig>,
    /// Where `/metrics` is served (`--metrics-listen`; `daemon::metrics`); `None`: nowhere.
    pub metrics_listen: Option<SocketAddr>,
}

/// The transport the daemon drives: kernel TCP, or XDP/AF_XDP on one interface.
enum Transport {
    Kernel(KernelTransport),
    Xdp(Box<XdpTransport>),
}

impl Transport {
    /// What `soft-rdma status` shows of the transport.
    fn status(&self) -> TransportStatus {
        match self {
            Transport::Kernel(_) => TransportStatus {
                kind: "kernel TCP".into(),
                ..TransportStatus::default()
            },
            Transport::Xdp(t) => TransportStatus {
                kind: "xdp".into(),
                interface: Some(t.interface().to_owned()),
                mode: Some(format!("{}", t.mode())),
                link: Some(t.link_kind().to_owned()),
                counters: t.counters().into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
                queues: t.queues(),
                tcp_connections: Some(t.tcp_connections()),
            },
        }
    }

    /// A copy of the socket of a connection the transport let go of, for its client.
    fn handed_socket(&self, conn: crate::engine::transport_seam::ConnId) -> Option<std::os::fd::OwnedFd> {
        match self {
            Transport::Kernel(t) => t.handed_socket(conn),
            Transport::Xdp(t) => t.kernel().handed_socket(conn),
        }
    }

    /// `TCP_INFO` of a connection handed to a client.
    fn handed_tcp_info(
        &self,
        conn: crate::engine::transport_seam::ConnId,
    ) -> Option<crate::engine::status::TcpStatus> {
        match self {
            Transport::Kernel(t) => t.handed_tcp_info(conn),
            Transport::Xdp(t) => t.kernel().handed_tcp_info(conn),
        }
    }

    fn release_handed(&self) {
        match self {
            Transport::Kernel(t) => t.release_handed(),
            Transport::Xdp(t) => t.kernel().release_handed(),
        }
    }

    fn execute(&mut self, cmd: crate::engine::transport_seam::TransportCommand) {
        match self {
            Transport::Kernel(t) => t.execute(cmd),
            Transport::Xdp(t) => t.execute(cmd),
        }
    }

    /// XDP mode: arms the wake-up for the stack's next timer ([`Transport::frames`] resolves then).
    fn arm_timer(&self) {
        if let Transport::Xdp(t) = self {
            t.arm_timer();
        }
    }

    /// XDP mode: resolves when a frame may be waiting in an AF_XDP socket or the stack's timer is due;
    /// kernel mode: never.
    async fn frames(&self) {
        match self {
            Transport::Kernel(_) => std::future::pending().await,
            Transport::Xdp(t) => t.readable().await,
        }
    }
}

/// Stack rounds per pass of the event loop before sessions, doorbells and the runtime's other tasks get
/// their turn (a busy stream would otherwise keep them waiting).
const ROUNDS_PER_PASS: u32 = 32;

/// After every input: the engine's commands go to the transport, and in XDP mode the stack runs on this
/// thread — frames in, TCP, the engine's placement and completions, frames out — until nothing moves, with
/// no hand-off to another thread (see `transport::xdp`). The answer says when the loop comes back ([`Pass`]).
/// Hands a transport event to the engine. Bytes for a queue pair are preceded by what its client already
/// posted to its ring: a Receive posted before the peer's Send arrived must be there to take it (a post is
/// in force once it returns, as on any RNIC), even if its doorbell is still on its way.
fn feed(rnic: &mut Rnic, rings: &mut rings::Rings, event: TransportEvent) {
    if let TransportEvent::Received { conn, .. } = &event
        && let Some((session, qp)) = rnic.queue_pair_on(*conn)
    {
        rings.drain_qp(rnic, session, qp);
    }
    rnic.handle_transport(now(), event);
}

fn pump(
    rnic: &mut Rnic,
    transport: &mut Transport,
    sessions: &HashMap<SessionId, SessionWriter>,
    rings: &mut rings::Rings,
) -> Pass {
    // The commands go to the stack now; the first round sends what they queued.
    drain(rnic, transport, sessions, rings);
    for _ in 0..ROUNDS_PER_PASS {
        let Transport::Xdp(x) = transport else {
            return Pass::Idle;
        };
        let next = x.run_round();
        while let Some(ev) = x.poll_event() {
            feed(rnic, rings, ev);
        }
        // What the engine made of them: completions to the rings, and FPDUs, which the next round sends.
        if drain(rnic, transport, sessions, rings) {
            continue;
        }
        match next {
            NextRound::Now => {}
            NextRound::Spin => {
                // Spinning: the queue pairs' rings are polled too, so clients post without a doorbell.
                if rings.poll_awake(rnic) {
                    drain(rnic, transport, sessions, rings);
                    continue;
                }
                return Pass::Spin;
            }
            NextRound::Sleep => {
                if rings.sleep(rnic) {
                    drain(rnic, transport, sessions, rings);
                    continue;
                }
                return Pass::Idle;
            }
        }
    }
    Pass::More
}

/// What [`pump`] left for the loop's next pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pass {
    /// Nothing moves: sleep until an input or a timer.
    Idle,
    /// Frames or events are waiting: come back at once.
    More,
    /// Nothing moves, but the busy poll is on: come back after whoever else wants the CPU.
    Spin,
}

fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// Runs the daemon until `shutdown` resolves; then every client gets DEVICE_REMOVED, every connection and
/// port is released, and the socket file is removed.
pub async fn run(config: DaemonConfig, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let mut config = config;
    // Kernel mode hands established connections to the clients, unless `--data-path daemon`; XDP mode runs
    // them here (their TCP is in this process).
    config.cm.hand_off &= config.xdp.is_none();
    let (session_tx, mut session_rx) = mpsc::unbounded_channel::<SessionInput>();
    let (transport_tx, mut transport_rx) = mpsc::unbounded_channel::<TransportEvent>();
    let (transport, ports, transport_name) = start_transport(&config, transport_tx)?;
    let mut metrics = config.metrics_listen.map(metrics::start).transpose()?;
    // After the transport: a daemon whose XDP setup fails leaves no socket file behind.
    let admin_gid = visibility::admin_gid(config.admin_group.as_deref())?;
    let listener = server::bind(&config.uds_path, config.group.as_deref()).await?;
    let budget = Budget::new(config.cm.limits.clone());
    let (ring_tx, mut ring_rx) = mpsc::unbounded_channel::<SessionId>();
    let mut d = Daemon {
        rnic: Rnic::new(config.cm.clone(), ports, crate::seed::random_seed()),
        transport,
        sessions: HashMap::new(),
        peers: HashMap::new(),
        rings: rings::Rings::new(
            config.cm.limits.clone(),
            config.cm.adapter.max_transfer_length,
            ring_tx,
        ),
        budget: budget.clone(),
    };
    let uds = tokio::spawn(server::serve(
        listener,
        session_tx,
        SessionTerms {
            adapter: config.cm.adapter.clone(),
            hand_off: config.cm.hand_off,
        },
        config.uds_path.clone(),
        budget,
        admin_gid,
    ));
    let data_path = if config.cm.hand_off {
        "in the clients"
    } else {
        "in soft-rdmad"
    };
    info!(socket = %config.uds_path.display(), transport = %transport_name, data_path, "soft-rdmad ready ({transport_name}, data path {data_path})");
    tokio::pin!(shutdown);
    let mut pass = Pass::Idle;
    loop {
        if pass == Pass::Spin {
            // Nothing to do but the spin: the CPU goes to whoever else is runnable on it first (a client of
            // ours, often), then the loop comes back.
            std::thread::yield_now();
        }
        let busy = pass != Pass::Idle;
        if busy {
            // The stack has more right away: let the sessions, the doorbells and the I/O driver in first.
            tokio::task::yield_now().await;
        }
        let deadline = d.rnic.poll_timeout().map(tokio::time::Instant::from_std);
        if !busy {
            // The stack's timers need microseconds (pacing); tokio's timer has milliseconds.
            d.transport.arm_timer();
        }
        tokio::select! {
            _ = &mut shutdown => break,
            Some(input) = session_rx.recv() => d.on_session_input(input),
            Some(session) = ring_rx.recv() => d.rings.woken(&mut d.rnic, session),
            Some(event) = transport_rx.recv() => feed(&mut d.rnic, &mut d.rings, event),
            // The metrics endpoint's thread asks for the figures; the loop copies them and goes on.
            Some(reply) = metrics::next_request(&mut metrics) => {
                let _ = reply.send(std::sync::Arc::new(d.metrics_snapshot()));
            }
            _ = d.transport.frames() => {}
            // Busy: back to the stack at once when no input is ready (not through tokio's timer, whose
            // millisecond ticks would hold a due round up to a millisecond).
            _ = std::future::ready(()), if busy => {}
            // The engine's timers (early is harmless).
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)), if deadline.is_some() => {
                d.rnic.handle_timeout(now());
            }
        }
        pass = pump(&mut d.rnic, &mut d.transport, &d.sessions, &mut d.rings);
    }
    d.shut_down();
    uds.abort();
    if let Err(e) = std::fs::remove_file(&config.uds_path) {
        warn!(error = %e, "removing the socket file");
    }
    // Give session writers a moment to flush their Goodbye.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    Ok(())
}

/// The transport the configuration asks for, the host ports it holds for the engine, and its name for the
/// log.
fn start_transport(
    config: &DaemonConfig,
    transport_tx: mpsc::UnboundedSender<TransportEvent>,
) -> anyhow::Result<(Transport, Box<dyn HostPorts>, String)> {
    Ok(match &config.xdp {
        None => {
            let (t, p) = KernelTransport::new(transport_tx, config.cm.connect_timeout);
            (Transport::Kernel(t), Box::new(p), "kernel TCP transport".into())
        }
        Some(x) => {
            let (t, p) = XdpTransport::start(
                x,
                transport_tx,
                config.cm.connect_timeout,
                crate::seed::random_seed(),
            )?;
            let name = format!(
                "XDP transport on {}, {} mode, {}",
                x.iface,
                t.mode(),
                t.link_kind()
            );
            (Transport::Xdp(Box::new(t)), Box::new(p), name)
        }
    })
}

/// What the event loop owns: the engine, the transport under it, the sessions and their shared rings.
struct Daemon {
    rnic: Rnic,
    transport: Transport,
    sessions: HashMap<SessionId, SessionWriter>,
    peers: HashMap<SessionId, Peer>,
    rings: rings::Rings,
    budget: std::sync::Arc<Budget>,
}

impl Daemon {
    /// A session opened, asked something, or ended.
    fn on_session_input(&mut self, input: SessionInput) {
        match input {
            SessionInput::Opened {
                session,
                writer,
                peer,
            } => {
                self.rnic.open_session(session);
                self.sessions.insert(session, writer);
                self.peers.insert(session, peer);
            }
            // What a session sent before it learnt that the daemon ended it is not acted on: the session's
            // objects are already released.
            SessionInput::Request { session, .. }
            | SessionInput::RegisterMemory { session, .. }
            | SessionInput::RegisterProcessMemory { session, .. }
                if !self.sessions.contains_key(&session) =>
            {
                debug!(session = session.0, "input from an ended session dropped");
            }
            SessionInput::Request { session, id, request } => self.on_request(session, id, request),
            SessionInput::RegisterMemory {
                session,
                id,
                memory,
                access,
                pd,
            } => {
                let len = crate::engine::memory::RegionMemory::len(&memory);
                let domain = Domain::new(session, pd);
                let result = self.rnic.register_memory(domain, Box::new(memory), access, 0);
                if let Err(e) = &result {
                    crate::warn_limited!(session = session.0, len, error = %e, "memory registration refused");
                }
                if let Some(w) = self.sessions.get(&session) {
                    let _ = w.send_msg(ServerMessage::Response {
                        id,
                        result: result.map(Response::from),
                    });
                }
            }
            SessionInput::RegisterProcessMemory {
                session,
                id,
                memory,
                iova,
                access,
                pd,
            } => {
                let domain = Domain::new(session, pd);
                let result = self.rnic.register_memory(domain, Box::new(memory), access, iova);
                if let Err(e) = &result {
                    crate::warn_limited!(session = session.0, error = %e, "in-place memory registration refused");
                }
                if let Some(w) = self.sessions.get(&session) {
                    let _ = w.send_msg(ServerMessage::Response {
                        id,
                        result: result.map(Response::from),
                    });
                }
            }
            SessionInput::Closed { session } => {
                self.sessions.remove(&session);
                self.peers.remove(&session);
                self.rnic.close_session(now(), session);
                self.rings.close_session(session);
            }
        }
    }

    /// One request: the engine answers it; the shared rings follow the objects it made or closed; a status
    /// report gets the transport's and the budgets' parts, restricted to what the asker may see.
    fn on_request(&mut self, session: SessionId, id: RequestId, request: CmRequest) {
        // What the client wrote in a queue pair's rings before this request comes first.
        if let Some(qp) = self.rnic.queue_pair_acted_on(&request) {
            self.rings.drain_qp(&mut self.rnic, session, qp);
        }
        let result = self.rnic.handle_request(now(), session, id, request);
        let mut fds = Vec::new();
        let mut result = match self.follow_objects() {
            Ok(f) => {
                fds = f;
                result
            }
            Err(e) => Err(e),
        }
        .map(Response::from);
        if let Ok(Response::Status(report)) = &mut result {
            self.complete_status(report, session);
        }
        // The transport acts first (a Listen is listening) before the client hears Done.
        drain(
            &mut self.rnic,
            &mut self.transport,
            &self.sessions,
            &mut self.rings,
        );
        if let Some(w) = self.sessions.get(&session) {
            let msg = ServerMessage::Response { id, result };
            let _ = w.send(Outbound { msg, fds });
        }
    }

    /// The shared rings follow the queue pairs and completion queues the engine made or closed
    /// ([`Rnic::poll_object_event`]). A created object's ring descriptors are returned, to
    /// travel with the answer. When they cannot be made (a ring bound, out of descriptors), the engine's
    /// object is closed again and the create fails with INSUFFICIENT_RESOURCES.
    fn follow_objects(&mut self) -> Result<Vec<std::os::fd::OwnedFd>, Error> {
        let mut outcome = Ok(Vec::new());
        while let Some(ev) = self.rnic.poll_object_event() {
            let (session, made, close) = match ev {
                ObjectEvent::QueuePairCreated { session, qp, config } => (
                    session,
                    self.rings.create_qp(session, qp, &config),
                    CmRequest::CloseQueuePair { qp },
                ),
                ObjectEvent::CompletionQueueCreated { session, cq, depth } => (
                    session,
                    self.rings.create_cq(session, cq, depth),
                    CmRequest::CloseCompletionQueue { cq },
                ),
                ObjectEvent::QueuePairClosed { session, qp } => {
                    self.rings.close_qp(session, qp);
                    continue;
                }
                ObjectEvent::CompletionQueueClosed { session, cq } => {
                    self.rings.close_cq(session, cq);
                    continue;
                }
            };
            if let Err(e) = &made {
                crate::warn_limited!(session = session.0, error = %e, "shared rings refused");
                let _ = self.rnic.handle_request(now(), session, RequestId(0), close);
            }
            outcome = made;
        }
        outcome
    }

    /// The daemon's parts of a status report (the transport, each handed-off connection's `TCP_INFO`, the
    /// budgets), and only what `asker` may see ([`visibility::restrict`]).
    fn complete_status(&self, report: &mut StatusReport, asker: SessionId) {
        report.transport = Some(self.transport.status());
        for c in &mut report.connectors {
            c.tcp = self
                .rnic
                .connection_of(ConnectorId(c.id))
                .and_then(|conn| self.transport.handed_tcp_info(conn));
        }
        report.resources = Some(Box::new(visibility::resources(&self.budget)));
        visibility::restrict(report, asker, &self.peers);
    }

    /// Every client sees DEVICE_REMOVED; every connection and port is released.
    fn shut_down(&mut self) {
        info!("shutting down: every client sees DEVICE_REMOVED");
        // Handed-off sockets are let go of without a shutdown: each client library ends its connections
        // itself when it sees the daemon gone (DEVICE_REMOVED), after what it had queued.
        self.transport.release_handed();
        self.rnic.shutdown(now());
        drain(
            &mut self.rnic,
            &mut self.transport,
            &self.sessions,
            &mut self.rings,
        );
        for w in self.sessions.values() {
            let _ = w.send_msg(ServerMessage::Goodbye {
                error: Error::new(NdStatus::DeviceRemoved, "soft-rdmad stopped"),
            });
        }
    }
}

/// The engine's transport commands to the transport, its events to the sessions, its completions to the
/// rings. True: a command was executed.
fn drain(
    rnic: &mut Rnic,
    transport: &mut Transport,
    sessions: &HashMap<SessionId, SessionWriter>,
    rings: &mut rings::Rings,
) -> bool {
    let mut commands = false;
    while let Some(cmd) = rnic.poll_transport() {
        transport.execute(cmd);
        commands = true;
    }
    while let Some((session, event)) = rnic.poll_event() {
        let Some(w) = sessions.get(&session) else { continue };
        let msg = ServerMessage::Event(event.into());
        // A hand-off's answer carries the connection's socket.
        let handed = match &msg {
            ServerMessage::Event(crate::uds::messages::Event::Completed {
                request,
                result: Ok(Response::HandedOff(h)),
            }) => Some((*request, h.conn)),
            _ => None,
        };
        let Some((request, conn)) = handed else {
            let _ = w.send_msg(msg);
            continue;
        };
        match transport.handed_socket(conn) {
            Some(fd) => {
                let _ = w.send(Outbound { msg, fds: vec![fd] });
            }
            None => {
                // Nobody can run the connection: it is reset, and the connector ends as on a peer's reset.
                crate::warn_limited!(session = session.0, "a handed-off socket could not be duplicated");
                transport
                    .execute(crate::engine::transport_seam::TransportCommand::Close { conn, abort: true });
                let _ = w.send_msg(ServerMessage::Event(crate::uds::messages::Event::Completed {
                    request,
                    result: Err(Error::new(
                        NdStatus::InsufficientResources,
                        "soft-rdmad could not pass the connection's socket (out of file descriptors?)",
                    )),
                }));
            }
        }
    }
    for (session, cq, entries) in rnic.poll_completions() {
        rings.complete(session, cq, entries);
    }
    commands
}
