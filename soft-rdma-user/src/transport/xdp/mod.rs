//! The XDP/AF_XDP transport: soft-rdma's TCP connections run in a userspace TCP stack (smoltcp) whose frames
//! come straight from the NIC's RX queues through AF_XDP sockets, while every other packet still goes to the
//! kernel.
//!
//! Pieces:
//! - `soft-rdma-ebpf` (the XDP program, attached by `loader.rs`) redirects TCP segments whose destination
//!   addr:port is in the `ENDPOINTS` map to the AF_XDP socket of their RX queue (`XSKS`); everything else —
//!   ARP/NDP, ICMP, UDP, other ports — passes to the kernel.
//! - [`XdpPorts`] (the engine's `HostPorts`): a reservation is a bound, never-used kernel TCP socket
//!   (kernel.rs's [`KernelPorts`], so exclusivity and SHARING_VIOLATION behave exactly as in kernel mode: the
//!   host stack neither hands the port out nor answers on it) *and* the endpoint in `ENDPOINTS` (a wildcard
//!   address: one key per interface address of that family). Release removes both. Each live smoltcp
//!   connection also holds its local endpoint in `ENDPOINTS` (reference-counted): an accepted connection
//!   outlives its listener's reservation, as a kernel socket would.
//! - One AF_XDP socket per RX queue, copy mode (`xsk.rs`); a smoltcp interface over them with the interface's
//!   MAC, MTU and addresses (`stack/`), run by one dedicated thread (`soft-rdma-xdp`): it works while there
//!   is traffic (spinning `--xdp-busy-poll-us` after it) and sleeps in ppoll(2) on the sockets and a
//!   command eventfd otherwise. The daemon's event
//!   loop talks to it exactly as to the kernel transport: [`XdpTransport::execute`] queues the command (never
//!   blocks), events come back on the same `TransportEvent` channel.
//! - Neighbours (ARP/NDP) and routes stay the kernel's: see `stack/mod.rs` and `stack/neighbours.rs`.
//!
//! Semantics kept from kernel.rs: accepted connections get ids counting from
//! `TRANSPORT_CONN_ID_BASE + 2^60` (the embedded kernel transport keeps `TRANSPORT_CONN_ID_BASE`);
//! `Written` when bytes are accepted into the smoltcp socket's send buffer; connect timeout → `TimedOut`,
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
//! steered but dropped for want of a fill ring entry or RX ring room) and the frames smoltcp produced while
//! no TX frame was free (`tx_dropped`): losses inside the host, as opposed to the wire's.
//!
//! Attach mode: `--xdp-mode auto` (default) tries native (driver) mode and falls back to generic (SKB) mode
//! with the reason logged; `native`/`generic` force one. The attach is a BPF link (see `loader.rs`): the
//! program goes away with the daemon, even after SIGKILL.

mod iface;
mod loader;
mod netlink;
mod sets;
mod stack;
mod xsk;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use soft_rdma_common::maps::EndpointKey;
use tokio::sync::mpsc::UnboundedSender;
use tracing::{info, warn};

pub use loader::{AttachedMode, XdpModeChoice};

use self::iface::IfaceInfo;
use self::loader::{Endpoints, Loaded, endpoint_key};
use self::netlink::{Netlink, RTN_LOCAL};
use self::stack::{Channels, Cmd, Stack, StackSettings, Waker};
use self::xsk::{MAX_FRAME, QueueCounters, XdpDevice, XskQueue};
use super::TRANSPORT_CONN_ID_BASE;
use super::kernel::{KernelPorts, KernelTransport};
use crate::engine::requests::XskQueueStatus;
use crate::engine::transport_seam::{ConnId, ConnectFailure, HostPorts, TransportCommand, TransportEvent};

/// Ids of connections the XDP thread accepts start here (kernel-accepted ones below).
pub const XDP_CONN_ID_BASE: u64 = TRANSPORT_CONN_ID_BASE + (1 << 60);

/// `soft-rdmad --xdp IFACE --xdp-mode MODE`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XdpConfig {
    pub iface: String,
    pub mode: XdpModeChoice,
    /// Test-only fault injection: the XDP program drops this many of every million steered segments.
    pub fault_drop_ppm: u32,
    /// The transport thread spins this long after its last work before it blocks in ppoll(2): lower latency
    /// for a CPU kept busy (zero: block at once).
    pub busy_poll: Duration,
    /// The steered flows on `crate::tcp` (`--xdp-tcp own`, soft-rdmad's default) instead of smoltcp's socket
    /// (`--xdp-tcp smoltcp`).
    pub own_tcp: bool,
    /// The own TCP's daemon-wide bounds (`--max-tcp-buffer-bytes`, `--max-tcp-connections`).
    pub own_tcp_limits: crate::tcp::TcpLimits,
}

/// The XDP transport (see the module documentation).
pub struct XdpTransport {
    cmds: Option<mpsc::Sender<Cmd>>,
    waker: Arc<Waker>,
    thread: Option<JoinHandle<()>>,
    kernel: KernelTransport,
    kernel_conns: HashSet<ConnId>,
    nl: Netlink,
    info: IfaceInfo,
    queue_counters: Vec<Arc<QueueCounters>>,
    /// The own TCP's connections and buffer memory, for `status` (`None`: smoltcp's TCP).
    own_tcp_budget: Option<Arc<crate::tcp::TcpBudget>>,
    // Last: detaches the program after the thread has closed its sockets.
    loaded: Loaded,
}

impl XdpTransport {
    /// Attaches the program to `config.iface`, binds the AF_XDP sockets and starts the transport thread.
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
        let mut xsks = loaded.xsks.take().ok_or_else(|| anyhow!("XSKS map missing"))?;
        let (cmd_tx, cmd_rx) = mpsc::channel();
        let waker = Arc::new(Waker::new().context("eventfd")?);
        let (ready_tx, ready_rx) = mpsc::channel::<Result<()>>();
        let (thread_info, thread_waker, thread_events) = (info.clone(), waker.clone(), events.clone());
        let thread_endpoints = loaded.endpoints.clone();
        let busy_poll = config.busy_poll;
        let own_tcp = config.own_tcp;
        let own_tcp_budget = Arc::new(crate::tcp::TcpBudget::new(config.own_tcp_limits));
        let thread_budget = own_tcp_budget.clone();
        let queue_counters: Vec<Arc<QueueCounters>> = (0..info.rx_queues).map(QueueCounters::new).collect();
        let thread_counters = queue_counters.clone();
        let thread = std::thread::Builder::new()
            .name("soft-rdma-xdp".into())
            .spawn(move || {
                let setup = || -> Result<Stack> {
                    let mut queues = Vec::new();
                    for c in &thread_counters {
                        queues.push(XskQueue::new(&thread_info.name, c.clone())?);
                    }
                    for q in &queues {
                        xsks.set(q.queue_id, q.fd(), 0).with_context(|| {
                            format!("registering the AF_XDP socket of queue {}", q.queue_id)
                        })?;
                    }
                    let dev = XdpDevice::new(queues, thread_info.mtu);
                    Stack::new(
                        thread_info,
                        dev,
                        Channels {
                            cmds: cmd_rx,
                            waker: thread_waker,
                            events: thread_events,
                            endpoints: thread_endpoints,
                        },
                        StackSettings {
                            connect_timeout,
                            conn_id_base: XDP_CONN_ID_BASE,
                            busy_poll,
                            random_seed,
                            own_tcp,
                            own_tcp_budget: thread_budget,
                        },
                    )
                };
                match setup() {
                    Ok(stack) => {
                        let _ = ready_tx.send(Ok(()));
                        stack.run();
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
                drop(xsks);
            })
            .context("spawning the XDP transport thread")?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e.context(format!("AF_XDP sockets on {}", config.iface)));
            }
            Err(_) => {
                let _ = thread.join();
                bail!("the XDP transport thread died during setup");
            }
        }
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
        let ports = XdpPorts {
            kernel: kernel_ports,
            endpoints: loaded.endpoints.clone(),
            info: info.clone(),
        };
        Ok((
            XdpTransport {
                cmds: Some(cmd_tx),
                waker,
                thread: Some(thread),
                kernel,
                kernel_conns: HashSet::new(),
                nl: Netlink::open().context("netlink socket")?,
                info,
                queue_counters,
                own_tcp_budget: own_tcp.then_some(own_tcp_budget),
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

    /// The XDP program's counters summed over CPUs, then the own TCP's connections and buffer memory.
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        let mut c = self.loaded.counters();
        if let Some(b) = &self.own_tcp_budget {
            c.extend(b.counters());
        }
        c
    }

    /// Each AF_XDP socket's frames and the kernel's drop counters.
    pub fn queues(&self) -> Vec<XskQueueStatus> {
        self.queue_counters.iter().map(|c| c.snapshot()).collect()
    }

    fn queue(&self, cmd: Cmd) {
        if let Some(tx) = &self.cmds {
            let _ = tx.send(cmd);
            self.waker.wake();
        }
    }

    /// Connections that never cross the interface: local destinations, or routes through other interfaces.
    fn via_kernel(&mut self, remote: SocketAddr) -> bool {
        match self.nl.route_get(remote.ip()) {
            Ok(r) => r.kind == RTN_LOCAL || r.oif != self.info.index,
            // The thread reports the failure (NetworkUnreachable…).
            Err(_) => false,
        }
    }

    fn is_kernel(&self, conn: ConnId) -> bool {
        self.kernel_conns.contains(&conn) || (TRANSPORT_CONN_ID_BASE..XDP_CONN_ID_BASE).contains(&conn.0)
    }

    /// Executes one command (never blocks: the thread does the work).
    pub fn execute(&mut self, cmd: TransportCommand) {
        match cmd {
            TransportCommand::Listen { listener, local } => {
                // The kernel socket only ever sees this host's own connections (see the module doc).
                self.kernel.execute(TransportCommand::Listen { listener, local });
                if local.ip().is_unspecified() || self.info.has_addr(local.ip()) {
                    // Wait until the thread listens, as a kernel listen is in place when execute returns:
                    // the port is already steered to smoltcp, and a SYN before the listening sockets exist
                    // would be reset. (Microseconds; bounded in case the thread is stuck.)
                    let (done, wait) = mpsc::channel();
                    self.queue(Cmd::Listen {
                        listener,
                        local,
                        done,
                    });
                    if wait.recv_timeout(Duration::from_secs(1)).is_err() {
                        crate::warn_limited!(listener = listener.0, %local, "the XDP thread did not confirm the listen in 1 s");
                    }
                }
            }
            TransportCommand::StopListening { listener } => {
                self.kernel.execute(TransportCommand::StopListening { listener });
                self.queue(Cmd::StopListening { listener });
            }
            TransportCommand::Connect { conn, local, remote } => {
                if self.via_kernel(remote) {
                    self.kernel_conns.insert(conn);
                    self.kernel
                        .execute(TransportCommand::Connect { conn, local, remote });
                } else {
                    self.queue(Cmd::Connect { conn, local, remote });
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
        self.cmds = None;
        self.waker.wake();
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            warn!("the XDP transport thread panicked");
        }
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

impl HostPorts for XdpPorts {
    fn reserve(&mut self, local: SocketAddr, shared: bool) -> Result<(), ConnectFailure> {
        self.kernel.reserve(local, shared)?;
        let keys = self.keys(local);
        let r = self.endpoints.lock().expect("not poisoned").acquire(&keys);
        if let Err(e) = r {
            crate::warn_limited!(%local, error = %e, "cannot add the endpoint to the XDP map");
            self.kernel.release(local);
            return Err(ConnectFailure::Other);
        }
        Ok(())
    }

    fn release(&mut self, local: SocketAddr) {
        self.kernel.release(local);
        let keys = self.keys(local);
        self.endpoints.lock().expect("not poisoned").release(&keys);
    }
}
