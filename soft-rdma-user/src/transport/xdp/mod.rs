//! The XDP/AF_XDP transport: soft-rdma's TCP connections run in a userspace TCP stack whose frames come
//! straight from the NIC's RX queues through AF_XDP sockets, while every other packet still goes to the
//! kernel. Their TCP is soft-rdma's own (`crate::tcp`; `--xdp-tcp own`, soft-rdmad's default) or smoltcp's
//! socket (`--xdp-tcp smoltcp`); either way a smoltcp interface takes the rest (the neighbour answers the
//! stack injects, segments no TCP claims).
//!
//! Pieces:
//! - `soft-rdma-ebpf` (the XDP program, attached by `loader.rs`) redirects TCP segments whose destination
//!   addr:port is in the `ENDPOINTS` map to the AF_XDP socket of their RX queue (`XSKS`); everything else —
//!   ARP/NDP, ICMP, UDP, other ports — passes to the kernel. With the own TCP it also answers a listening
//!   endpoint's SYNs itself with SYN cookies, when its SYN-ACK can leave at once
//!   (`stack/syn_cookies.rs`).
//! - [`XdpPorts`] (the engine's `HostPorts`): a reservation is a bound, never-used kernel TCP socket
//!   (kernel.rs's [`KernelPorts`], so exclusivity and SHARING_VIOLATION behave exactly as in kernel mode: the
//!   host stack neither hands the port out nor answers on it) *and* the endpoint in `ENDPOINTS` (a wildcard
//!   address: one key per interface address of that family). Release removes both. Each live connection
//!   also holds its local endpoint in `ENDPOINTS` (reference-counted): an accepted connection outlives its
//!   listener's reservation, as a kernel socket would.
//! - One AF_XDP socket per RX queue, copy mode (`xsk.rs`); a smoltcp interface over them with the interface's
//!   MAC, MTU and addresses (`stack/`), run on the daemon's event-loop thread, the one that runs the engine
//!   and writes the clients' completion rings: one thread from ring to wire (issue 17), no hand-off between
//!   threads on the way. [`XdpTransport::execute`] carries a command out at once; the loop runs the stack's
//!   rounds ([`XdpTransport::run_round`]) after every input, feeds its events ([`XdpTransport::poll_event`])
//!   to the engine, and sends what the engine made of them in the next round, until nothing moves (then,
//!   with `--xdp-busy-poll-us`, it keeps running rounds that long, yielding to the runtime's other tasks in
//!   between). Asleep, it waits in the runtime's epoll on the AF_XDP sockets ([`XdpTransport::readable`]),
//!   the sessions, the rings' doorbells and the next timer ([`XdpTransport::arm_timer`]).
//! - Neighbours (ARP/NDP) and routes stay the kernel's: see `stack/mod.rs` and `stack/neighbours.rs`.
//!
//! Semantics kept from kernel.rs: accepted connections get ids counting from
//! `TRANSPORT_CONN_ID_BASE + 2^60` (the embedded kernel transport keeps `TRANSPORT_CONN_ID_BASE`);
//! `Written` when bytes are accepted into the TCP's send buffer; connect timeout → `TimedOut`,
//! RST → `Refused`, no route → `NetworkUnreachable`, neighbour resolution failed → `HostUnreachable`;
//! no Nagle; keepalive 5 s and a 20 s dead-peer timeout once connected; graceful close waits up to 5 s.
//!
//! Local connections. Traffic between the host's own addresses never crosses the NIC (it goes through `lo`),
//! so XDP cannot see it. Such connections use kernel TCP within the same daemon: a `Connect` whose kernel
//! route is local, or leaves through another interface, is executed by an embedded [`KernelTransport`] on
//! the reserved kernel socket; and every `Listen` also puts the reserved kernel socket into listen, which only
//! ever receives connections from this host (segments from the wire to that port are redirected before the
//! kernel sees them). Both kinds of accepted connections are reported for the same listener.
//!
//! Limits: copy mode only (no zero-copy); one VLAN tag at most and no IPv6 extension headers in the XDP
//! parser (such segments go to the kernel, which answers with a reset); interface addresses are read at
//! startup; frames larger than 3840 bytes (MTU above ~3800) are refused at startup; TIME_WAIT is not kept;
//! once a listener's port is released, its still-open accepted connections keep their segments steered but
//! the kernel port itself is free again (the kernel would keep it busy). The program counters are logged
//! when the transport stops, and so are the AF_XDP sockets' kernel statistics (`XDP_STATISTICS`: frames
//! steered but dropped for want of a fill ring entry or RX ring room) and the frames the stack produced
//! while no TX frame was free (`tx_dropped`): losses inside the host, as opposed to the wire's.
//!
//! Attach mode: `--xdp-mode auto` (default) tries native (driver) mode and falls back to generic (SKB) mode
//! with the reason logged; `native`/`generic` force one. The attach is a BPF link (see `loader.rs`): the
//! program goes away with the daemon, even after SIGKILL.

mod iface;
mod iface_kind;
mod loader;
mod netlink;
mod sets;
mod stack;
mod timer;
mod xsk;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use anyhow::{Context, Result, anyhow, bail};
use soft_rdma_common::maps::EndpointKey;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc::UnboundedSender;
use tracing::info;

pub use loader::{AttachedMode, XdpModeChoice};

use self::iface::IfaceInfo;
use self::iface_kind::IfaceKind;
use self::loader::{Endpoints, Loaded, endpoint_key};
use self::netlink::{Netlink, RTN_LOCAL, Route};
use self::stack::{Cmd, Stack, StackSettings};
use self::xsk::{MAX_FRAME, QueueCounters, XdpDevice, XskQueue};
use super::TRANSPORT_CONN_ID_BASE;
use super::kernel::{KernelPorts, KernelTransport};
use crate::engine::transport_seam::{ConnId, ConnectFailure, HostPorts, TransportCommand, TransportEvent};
use crate::transport::status::XskQueueStatus;

/// Ids of connections the XDP stack accepts start here (kernel-accepted ones below).
pub const XDP_CONN_ID_BASE: u64 = TRANSPORT_CONN_ID_BASE + (1 << 60);

/// `soft-rdmad --xdp IFACE --xdp-mode MODE`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XdpConfig {
    pub iface: String,
    pub mode: XdpModeChoice,
    /// Test-only fault injection: the XDP program drops this many of every million steered segments.
    pub fault_drop_ppm: u32,
    /// The event loop keeps running the stack's rounds this long after its last work before it sleeps: lower
    /// latency for a CPU kept busy (zero: sleep at once).
    pub busy_poll: Duration,
    /// The steered flows on `crate::tcp` (`--xdp-tcp own`, soft-rdmad's default) instead of smoltcp's socket
    /// (`--xdp-tcp smoltcp`).
    pub own_tcp: bool,
    /// The steered flows' daemon-wide bounds (`--max-tcp-buffer-bytes`, `--max-tcp-connections`), on the
    /// own TCP or on smoltcp's socket.
    pub own_tcp_limits: crate::tcp::TcpLimits,
    /// With the own TCP: the XDP program answers listeners' SYNs with SYN cookies (`--xdp-syn-cookies`).
    pub syn_cookies: bool,
}

/// What the own TCP counted since the transport started: every connection's counters added up (those
/// already closed included), and the connections SYN cookies opened or refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OwnTcpTotals {
    pub counters: crate::tcp::TcpCounters,
    pub cookie_connections: u64,
    pub cookies_refused: u64,
}

/// The XDP transport (see the module documentation).
pub struct XdpTransport {
    /// The AF_XDP sockets as the event loop waits on them. Before `stack` (fields drop in order): they
    /// leave the runtime's epoll set while `stack`'s queues still hold the descriptors open.
    readable: Vec<AsyncFd<QueueFd>>,
    /// Wakes the event loop when the stack's next timer is due (`timer.rs`).
    timer: timer::StackTimer,
    stack: Box<Stack>,
    /// `--xdp-busy-poll-us`: rounds keep running this long after the last work before the loop sleeps.
    busy_poll: Duration,
    last_work: StdInstant,
    kernel: KernelTransport,
    kernel_conns: HashSet<ConnId>,
    nl: Netlink,
    info: IfaceInfo,
    queue_counters: Vec<Arc<QueueCounters>>,
    /// The TCP's connections and buffer memory against the bounds, for `status` (the own TCP's, or
    /// smoltcp's sockets').
    tcp_budget: Arc<crate::tcp::TcpBudget>,
    // Last: detaches the program after the stack has closed its sockets.
    loaded: Loaded,
}

impl XdpTransport {
    /// Attaches the program to `config.iface`, binds the AF_XDP sockets and sets up the stack (on the calling
    /// thread, within the daemon's runtime: the sockets are watched by its reactor).
    /// `random_seed` seeds the TCP stack (initial sequence numbers, ephemeral ports).
    pub fn start(
        config: &XdpConfig,
        events: UnboundedSender<TransportEvent>,
        connect_timeout: Duration,
        random_seed: u64,
    ) -> Result<(XdpTransport, XdpPorts)> {
        let info = IfaceInfo::read(&config.iface)?;
        if info.mtu + 14 + 4 > MAX_FRAME {
            bail!(
                "{}: MTU {} is too large for the XDP transport (frames up to {MAX_FRAME} bytes)",
                info.name,
                info.mtu
            );
        }
        let mut loaded = loader::load_and_attach(&config.iface, config.mode, config.fault_drop_ppm)?;
        let mut nl = Netlink::open().context("netlink socket")?;
        let iface_kind = IfaceKind::detect(&mut nl, info.index, &info.name);
        let xsks = loaded.xsks.as_mut().ok_or_else(|| anyhow!("XSKS map missing"))?;
        let queue_counters: Vec<Arc<QueueCounters>> = (0..info.rx_queues).map(QueueCounters::new).collect();
        let mut queues = Vec::new();
        for c in &queue_counters {
            queues.push(
                XskQueue::new(&info.name, c.clone())
                    .with_context(|| format!("AF_XDP sockets on {}", config.iface))?,
            );
        }
        for q in &queues {
            xsks.set(q.queue_id, q.fd(), 0)
                .with_context(|| format!("registering the AF_XDP socket of queue {}", q.queue_id))?;
        }
        let readable = queues
            .iter()
            .map(|q| {
                // SAFETY: the descriptor belongs to `q`, which the stack keeps until the transport drops;
                // `readable` drops first (field order), so the descriptor is open for the AsyncFd's life.
                unsafe { AsyncFd::register_with_interest(QueueFd(q.fd()), tokio::io::Interest::READABLE) }
                    .context("watching an AF_XDP socket")
            })
            .collect::<Result<Vec<_>>>()?;
        let own_tcp_budget = Arc::new(crate::tcp::TcpBudget::new(config.own_tcp_limits));
        let dev = XdpDevice::new(queues, info.mtu);
        let stack = Stack::new(
            info.clone(),
            dev,
            loaded.endpoints.clone(),
            StackSettings {
                connect_timeout,
                conn_id_base: XDP_CONN_ID_BASE,
                random_seed,
                own_tcp: config.own_tcp,
                own_tcp_budget: own_tcp_budget.clone(),
                checksums: iface_kind.partial_checksums(),
                syn_cookies: config
                    .syn_cookies
                    .then(|| loaded.config.take())
                    .flatten()
                    .map(|config| stack::SynCookieSetup {
                        config,
                        generic_mode: loaded.mode == loader::AttachedMode::Generic,
                        ifindex: info.index,
                    }),
            },
        )?;
        let (kernel, kernel_ports) = KernelTransport::new(events, connect_timeout);
        info!(
            iface = %info.name,
            mode = %loaded.mode,
            link = loaded.link_kind,
            rx_queues = info.rx_queues,
            mtu = info.mtu,
            busy_poll_us = config.busy_poll.as_micros() as u64,
            tcp = if config.own_tcp { "own (experimental)" } else { "smoltcp" },
            addrs = ?info.addrs.iter().map(|a| a.addr).collect::<Vec<_>>(),
            "XDP transport ready (AF_XDP copy mode)"
        );
        iface_kind::log_choice(&iface_kind, &info.name, config.own_tcp);
        let ports = XdpPorts {
            kernel: kernel_ports,
            endpoints: loaded.endpoints.clone(),
            info: info.clone(),
        };
        Ok((
            XdpTransport {
                stack: Box::new(stack),
                readable,
                timer: timer::StackTimer::new()?,
                busy_poll: config.busy_poll,
                last_work: StdInstant::now(),
                kernel,
                kernel_conns: HashSet::new(),
                nl,
                info,
                queue_counters,
                tcp_budget: own_tcp_budget,
                loaded,
            },
            ports,
        ))
    }

    /// The interface the program is attached to.
    /// The kernel-TCP transport that carries this host's own connections (and any handed-off one).
    pub fn kernel(&self) -> &KernelTransport {
        &self.kernel
    }

    pub fn interface(&self) -> &str {
        &self.info.name
    }

    /// Native or generic, as attached.
    pub fn mode(&self) -> AttachedMode {
        self.loaded.mode
    }

    /// "bpf_link" (detached when the daemon exits, even on SIGKILL) or "netlink".
    pub fn link_kind(&self) -> &'static str {
        self.loaded.link_kind
    }

    /// The XDP program's counters summed over CPUs, then the TCP's connections and buffer memory against
    /// its bounds (the own TCP's, or smoltcp's sockets'), then the own TCP's dropped segments by reason
    /// (`tcp_dropped_<reason>`) and the partial checksums it accepted (`stack/drops.rs`).
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        let mut c = self.loaded.counters();
        c.extend(self.tcp_budget.counters());
        c.extend(self.stack.drop_counters());
        c
    }

    /// The own TCP's figures since start, for soft-rdmad's metrics; `None` on smoltcp's socket.
    pub fn own_tcp_totals(&self) -> Option<OwnTcpTotals> {
        let (counters, (cookie_connections, cookies_refused)) = self.stack.tcp_totals()?;
        Some(OwnTcpTotals {
            counters,
            cookie_connections,
            cookies_refused,
        })
    }

    /// The TCP's connections (the own TCP's TIME-WAIT included).
    pub fn tcp_connections(&self) -> Vec<crate::transport::status::TcpConnectionStatus> {
        self.stack.tcp_connections()
    }

    /// Each AF_XDP socket's frames and the kernel's drop counters.
    pub fn queues(&self) -> Vec<XskQueueStatus> {
        self.queue_counters.iter().map(|c| c.snapshot()).collect()
    }

    fn queue(&mut self, cmd: Cmd) {
        self.stack.command(cmd, StdInstant::now());
    }

    /// Runs one round of the stack; events for the engine are then waiting in
    /// [`XdpTransport::poll_event`]. The answer says when the next round is due.
    pub fn run_round(&mut self) -> NextRound {
        let now = StdInstant::now();
        if self.stack.round(now) {
            self.last_work = now;
            NextRound::Now
        } else if now.duration_since(self.last_work) < self.busy_poll {
            NextRound::Spin
        } else {
            NextRound::Sleep
        }
    }

    /// The next event from the XDP side (the embedded kernel transport reports on the event channel).
    pub fn poll_event(&mut self) -> Option<TransportEvent> {
        self.stack.poll_event()
    }

    /// Arms the wake-up for the stack's next timer (before the event loop sleeps: [`XdpTransport::readable`]
    /// then also resolves when it is due).
    pub fn arm_timer(&self) {
        let now = StdInstant::now();
        self.timer.arm(now + self.stack.next_timeout(now), now);
    }

    /// Resolves when a frame may be waiting in an AF_XDP socket's RX ring (the next round takes it), or the
    /// timer [`XdpTransport::arm_timer`] armed is due. Readiness is cleared before the round reads the
    /// ring, so a frame that arrives later wakes again.
    pub async fn readable(&self) {
        std::future::poll_fn(|cx| {
            let mut ready = self.timer.poll_fired(cx).is_ready();
            for fd in &self.readable {
                if let std::task::Poll::Ready(Ok(mut guard)) = fd.poll_read_ready(cx) {
                    guard.clear_ready();
                    ready = true;
                }
            }
            if ready {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
        .await
    }

    /// Whether a connection on `route` never crosses the interface (a local destination, or a route through
    /// another interface): then it is the kernel's. No route: the stack's, which looks again and reports
    /// the failure (NetworkUnreachable…).
    fn kernel_route(&self, route: Option<&Route>) -> bool {
        route.is_some_and(|r| r.kind == RTN_LOCAL || r.oif != self.info.index)
    }

    fn is_kernel(&self, conn: ConnId) -> bool {
        self.kernel_conns.contains(&conn) || (TRANSPORT_CONN_ID_BASE..XDP_CONN_ID_BASE).contains(&conn.0)
    }

    /// Executes one command at once (the next [`XdpTransport::run_round`] sends what it queued).
    pub fn execute(&mut self, cmd: TransportCommand) {
        match cmd {
            TransportCommand::Listen { listener, local } => {
                // The kernel socket only ever sees this host's own connections (see the module doc).
                self.kernel.execute(TransportCommand::Listen { listener, local });
                if local.ip().is_unspecified() || self.info.has_addr(local.ip()) {
                    // The listening sockets exist when this returns, as a kernel listen is in place: the
                    // port is already steered here, and a SYN before them would be reset.
                    self.queue(Cmd::Listen { listener, local });
                }
            }
            TransportCommand::StopListening { listener } => {
                self.kernel.execute(TransportCommand::StopListening { listener });
                self.queue(Cmd::StopListening { listener });
            }
            TransportCommand::Connect { conn, local, remote } => {
                // One lookup per connect: the stack chooses the source address from the same route.
                let route = self.nl.route_get(remote.ip()).ok();
                if self.kernel_route(route.as_ref()) {
                    self.kernel_conns.insert(conn);
                    self.kernel
                        .execute(TransportCommand::Connect { conn, local, remote });
                } else {
                    self.queue(Cmd::Connect {
                        conn,
                        local,
                        remote,
                        route,
                    });
                }
            }
            TransportCommand::Send { conn, data } => {
                if self.is_kernel(conn) {
                    self.kernel.execute(TransportCommand::Send { conn, data });
                } else {
                    self.queue(Cmd::Send { conn, data });
                }
            }
            TransportCommand::HandOff { conn } => {
                if self.is_kernel(conn) {
                    self.kernel.execute(TransportCommand::HandOff { conn });
                } else {
                    // Never asked in XDP mode (its data path stays in the daemon): the connection ends.
                    crate::warn_limited!(conn = conn.0, "a hand-off of an XDP connection; closing it");
                    self.queue(Cmd::Close { conn, abort: true });
                }
            }
            TransportCommand::Close { conn, abort } => {
                if self.is_kernel(conn) {
                    self.kernel.execute(TransportCommand::Close { conn, abort });
                } else {
                    self.queue(Cmd::Close { conn, abort });
                }
            }
        }
    }
}

impl Drop for XdpTransport {
    fn drop(&mut self) {
        let counters = self.counters();
        info!(?counters, "XDP transport stopping");
        self.stack.shutdown();
    }
}

/// When the stack's next round is due ([`XdpTransport::run_round`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NextRound {
    /// Frames or woken sockets are waiting: at once.
    Now,
    /// Nothing waits, but the last work was less than `--xdp-busy-poll-us` ago: at once, after the
    /// runtime's other tasks had their turn.
    Spin,
    /// When a frame arrives or the timer [`XdpTransport::arm_timer`] armed is due.
    Sleep,
}

/// An AF_XDP socket's descriptor, as `AsyncFd` watches it (the socket is owned by its `XskQueue`).
struct QueueFd(RawFd);

impl AsRawFd for QueueFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// The engine's `HostPorts` in XDP mode (see the module documentation).
pub struct XdpPorts {
    kernel: KernelPorts,
    endpoints: Endpoints,
    info: IfaceInfo,
}

impl XdpPorts {
    fn keys(&self, local: SocketAddr) -> Vec<EndpointKey> {
        self.info
            .expand(local.ip())
            .into_iter()
            .map(|ip| endpoint_key(ip, local.port()))
            .collect()
    }
}

impl XdpPorts {
    /// Adds `local`'s endpoint to the XDP map once its kernel socket is reserved; gives the socket back if
    /// the map refuses.
    fn steer(&mut self, local: SocketAddr) -> Result<(), ConnectFailure> {
        let keys = self.keys(local);
        let r = self.endpoints.lock().expect("not poisoned").acquire(&keys);
        if let Err(e) = r {
            crate::warn_limited!(%local, error = %e, "cannot add the endpoint to the XDP map");
            self.kernel.release(local);
            return Err(ConnectFailure::Other);
        }
        Ok(())
    }
}

impl HostPorts for XdpPorts {
    fn reserve(&mut self, local: SocketAddr, shared: bool) -> Result<(), ConnectFailure> {
        self.kernel.reserve(local, shared)?;
        self.steer(local)
    }

    /// As in kernel mode (SO_REUSEADDR, listening at once): the local connections of an earlier listener
    /// on the port, which run on kernel TCP (the module's "Local connections"), may still be in TIME_WAIT,
    /// and must not keep a restarted listener off its port.
    fn reserve_listener(&mut self, local: SocketAddr) -> Result<(), ConnectFailure> {
        self.kernel.reserve_listener(local)?;
        self.steer(local)
    }

    fn release(&mut self, local: SocketAddr) {
        self.kernel.release(local);
        let keys = self.keys(local);
        self.endpoints.lock().expect("not poisoned").release(&keys);
    }
}
