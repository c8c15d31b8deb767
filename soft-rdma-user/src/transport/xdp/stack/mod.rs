//! The XDP stack: a smoltcp `Interface` over the AF_XDP device, one smoltcp TCP socket per listening slot
//! and per connection (or the own TCP, `own_tcp.rs`, with the XDP program's SYN cookies,
//! `syn_cookies.rs`), commands in, `TransportEvent`s out. Sans thread: the
//! daemon's event loop drives it (`super::XdpTransport`), on the thread that runs the engine.
//!
//! A round ([`Stack::round`]): copy received frames out of the RX rings (learning peers' MACs and SYN MSS
//! options on the way) → resolve pending neighbours → `Interface::poll` → kick TX → move bytes between the
//! sockets and the engine (Received / Written / Connected / Accepted / Closed) → poll again if anything
//! moved. Commands ([`Stack::command`]) run at once. The caller runs rounds while there is work, then sleeps
//! on the AF_XDP sockets for at most [`Stack::next_timeout`] (smoltcp's `poll_delay`, the own TCP's timers,
//! the next neighbour/connect/close deadline). Spinning (`--xdp-busy-poll-us`) is the event loop's
//! business (`daemon::run`); by default it is off below 8 CPUs.
//!
//! Scale. A round costs what happened in it, not the number of connections: each connection's socket is
//! in a smoltcp socket set of its own and frames are handed to their set by 4-tuple (`sets.rs`: smoltcp
//! would otherwise ask every socket about every segment and visit every socket on every poll); only the
//! sets with frames, touched by a command or with a smoltcp timer due are polled; and only the connections
//! something happened to are looked at: each socket has a waker (smoltcp's `async` wakers, woken inside
//! `Interface::poll` when data arrives, buffer space frees up or the state changes) that marks it, commands
//! mark their connection, and connect and close deadlines are kept in order.
//!
//! Neighbours. The kernel owns the interface's addresses too and the XDP program passes ARP/NDP to it, so
//! smoltcp never sees answers to its own requests. smoltcp's addresses are therefore configured with prefix
//! length 0 — every destination is "on link" for smoltcp, so it asks for the destination itself — and its
//! neighbour cache is filled with *the MAC of the kernel's next hop to that destination*: the device swallows
//! smoltcp's ARP requests / Neighbor Solicitations, the thread asks the kernel (`ip route get` + `ip neigh
//! get`, and if the kernel has no usable entry, `RTM_NEWNEIGH NTF_USE` so the kernel resolves it with its own
//! ARP/NDP) and injects a synthetic ARP reply / Neighbor Advertisement into smoltcp's ingress. Routing and
//! neighbour state thus stay the kernel's (routes via gateways, `ip neigh` entries, failures) with no second
//! ARP implementation. A connect first resolves its next hop this way (failure after the kernel gives up,
//! about 3 s → `HostUnreachable`); inbound segments from on-link peers refresh the entry from their Ethernet
//! source address, so an accepted connection answers without waiting.

use std::collections::{BTreeSet, HashMap, VecDeque};

/// Maps keyed by the transport's own ids (connections, sockets): a fast hasher, as they are looked up for
/// every segment. Maps keyed by what peers choose (addresses, ports) keep std's SipHash.
type IdMap<K, V> = foldhash::HashMap<K, V>;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::task::{Wake, Waker as TaskWaker};
use std::time::{Duration, Instant as StdInstant};

use bytes::Bytes;
use smoltcp::iface::{Config, Interface};
use smoltcp::socket::tcp;
use smoltcp::time::{Duration as SDuration, Instant};
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol, HardwareAddress,
    Icmpv6Packet, Icmpv6Repr, IpAddress, IpCidr, IpListenEndpoint, IpProtocol, Ipv6Packet, Ipv6Repr,
    NdiscNeighborFlags, NdiscRepr,
};
use tracing::{debug, info, warn};

mod own_tcp;
mod queued_bytes;
mod syn_cookies;

pub use syn_cookies::SynCookieSetup;

use queued_bytes::QueuedBytes;

use super::iface::IfaceInfo;
use super::loader::{Endpoints, endpoint_key};
use super::netlink::{NUD_FAILED, Netlink, Route};
use super::sets::{SetId, Sets, Sock};
use super::xsk::XdpDevice;
use crate::engine::requests::ListenerId;
use crate::engine::transport_seam::{ConnId, ConnectFailure, TransportEvent};
use soft_rdma_common::maps::EndpointKey;

mod commands;
mod neighbours;

use neighbours::*;

/// Socket buffers, allocated whole per connection by smoltcp: 256 KiB of receive window keeps a veth or
/// 10G LAN path full at sub-millisecond RTTs (window scaling on), while 16,384 connections stay within
/// 6 GiB in the worst case (4 MiB + 2 MiB buffers would need 96 GiB there).
const RX_BUFFER: usize = 256 << 10;
const TX_BUFFER: usize = 128 << 10;
/// Listening sockets kept ready per listener address (smoltcp: one socket per connection; a SYN that finds
/// none listening is reset, so the device hands smoltcp at most this many SYNs between two replenishments
/// and the rest wait their turn; the buffers are untouched, hence not resident, until a connection uses
/// them).
pub(super) const SPARE_LISTENERS: usize = 64;
/// How long a graceful close waits for the peer before the connection is dropped anyway (as kernel.rs).
const CLOSE_LINGER: Duration = Duration::from_secs(5);
/// Give up resolving a neighbour after this long (the kernel's default: 3 probes, 1 s apart).
const NEIGH_TIMEOUT: Duration = Duration::from_millis(3500);
/// Re-inject a learned neighbour this often (smoltcp's cache entries live 60 s).
const NEIGH_REFRESH: Duration = Duration::from_secs(20);
/// Copy the kernel's AF_XDP drop counters into the status this often (the loop sleeps at most 100 ms).
const STATISTICS_PERIOD: Duration = Duration::from_millis(250);

pub(super) enum Cmd {
    /// The listening sockets exist when the command returns.
    Listen {
        listener: ListenerId,
        local: SocketAddr,
    },
    StopListening {
        listener: ListenerId,
    },
    Connect {
        conn: ConnId,
        local: SocketAddr,
        remote: SocketAddr,
        /// The kernel's route to `remote`, as the transport looked it up to choose this stack over the
        /// kernel's (`None`: look it up again, which reports why there is none).
        route: Option<Route>,
    },
    Send {
        conn: ConnId,
        data: Bytes,
    },
    Close {
        conn: ConnId,
        abort: bool,
    },
}

struct Listener {
    /// One pool of listening sockets per local address (a wildcard listens on each interface address).
    pools: Vec<(IpListenEndpoint, SetId, Vec<Sock>)>,
}

#[derive(Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for the next hop's MAC before sending the SYN.
    Resolving {
        deadline: StdInstant,
    },
    /// SYN sent.
    Connecting {
        deadline: StdInstant,
    },
    Open,
}

struct Conn {
    handle: Option<Sock>,
    local: SocketAddr,
    remote: SocketAddr,
    phase: Phase,
    /// Bytes from `Send`s not yet in the socket's buffer.
    pending: QueuedBytes,
    /// `Close` asked: Some(abort).
    close: Option<bool>,
    fin_sent: bool,
    linger_deadline: Option<StdInstant>,
    closed_reported: bool,
}

impl Conn {
    /// A connection in `phase` with nothing queued or closed yet.
    fn new(handle: Option<Sock>, local: SocketAddr, remote: SocketAddr, phase: Phase) -> Conn {
        Conn {
            handle,
            local,
            remote,
            phase,
            pending: QueuedBytes::default(),
            close: None,
            fin_sent: false,
            linger_deadline: None,
            closed_reported: false,
        }
    }
}

struct Pending {
    started: StdInstant,
    next_check: StdInstant,
    triggered: bool,
}

/// Marks its socket for the next round when smoltcp wakes it.
struct SocketWaker {
    handle: Sock,
    woken: Arc<Mutex<Vec<Sock>>>,
}

impl Wake for SocketWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.lock().expect("not poisoned").push(self.handle);
    }
}

/// How long a socket the engine forgot may take to send its last segment.
const DRAIN_LIMIT: Duration = Duration::from_secs(2);

pub(super) struct Stack {
    iface: Interface,
    dev: XdpDevice,
    sets: Sets,
    info: IfaceInfo,
    nl: Netlink,
    /// Events for the engine, taken by [`Stack::poll_event`].
    events: VecDeque<TransportEvent>,
    listeners: IdMap<ListenerId, Listener>,
    conns: IdMap<ConnId, Conn>,
    /// The connection each connection socket belongs to.
    by_handle: IdMap<Sock, ConnId>,
    /// Sockets smoltcp woke since the last round (see [`SocketWaker`]).
    woken: Arc<Mutex<Vec<Sock>>>,
    wakers: IdMap<Sock, TaskWaker>,
    /// Connections a command touched since the last round.
    touched: Vec<ConnId>,
    /// Connect and graceful-close deadlines, earliest first (entries may be stale: the connection decides).
    deadlines: BTreeSet<(StdInstant, ConnId)>,
    /// Connections waiting for their next hop's MAC.
    resolving: Vec<ConnId>,
    /// Sockets aborted or closed after the engine forgot them, since when: removed once their last segment
    /// left, or after [`DRAIN_LIMIT`] (`drain_order` has them oldest first).
    draining: IdMap<Sock, StdInstant>,
    drain_order: VecDeque<(StdInstant, Sock)>,
    neigh: Neighbours,
    /// MSS options seen in SYNs: (remote, local port) → MSS.
    peer_mss: HashMap<(SocketAddr, u16), u16>,
    next_conn: u64,
    connect_timeout: Duration,
    start: StdInstant,
    /// When the AF_XDP sockets' kernel statistics were last copied into the status.
    last_statistics: StdInstant,
    /// The XDP endpoint map: each connection's socket holds its local endpoint there until removed.
    endpoints: Endpoints,
    held: IdMap<Sock, EndpointKey>,
    /// `--xdp-tcp own`: the steered flows on `crate::tcp` (own_tcp.rs); `None`: on smoltcp's socket.
    own: Option<own_tcp::OwnTcp>,
    /// The daemon's TCP bounds (`--max-tcp-connections`, `--max-tcp-buffer-bytes`). On smoltcp's socket,
    /// every socket (a connection or a listening slot) is charged its whole buffers, [`RX_BUFFER`] +
    /// [`TX_BUFFER`], and one connection, from when it is made until it is removed (`remove_socket`).
    budget: std::sync::Arc<crate::tcp::TcpBudget>,
    /// A listening slot could not be made for want of budget: when a socket gives its share back, every
    /// listener's pool is topped up in the next round (a SYN finding no slot is reset by smoltcp).
    listeners_short: bool,
    /// Set by `remove_socket` while `listeners_short`: top the pools up in the next round.
    refill_listeners: bool,
}

fn listen_endpoint(addr: IpAddr, port: u16) -> IpListenEndpoint {
    IpListenEndpoint {
        addr: Some(IpAddress::from(addr)),
        port,
    }
}

/// How the stack runs: what the daemon's configuration decides for it.
pub struct StackSettings {
    pub connect_timeout: Duration,
    /// The first connection id the stack hands out (ids never collide with the engine's).
    pub conn_id_base: u64,
    /// Seeds the TCP stacks (initial sequence numbers, ephemeral ports); drawn once by the daemon.
    pub random_seed: u64,
    /// `--xdp-tcp own`: the steered flows on `crate::tcp` instead of smoltcp's socket.
    pub own_tcp: bool,
    /// What SYN cookies are set up with (own TCP only); `None`: off.
    pub syn_cookies: Option<SynCookieSetup>,
    /// The daemon's TCP bounds and what they hold (shared with `status`): the own TCP's, or on smoltcp's
    /// socket its sockets' buffers and count.
    pub own_tcp_budget: std::sync::Arc<crate::tcp::TcpBudget>,
}

impl Stack {
    pub fn new(
        info: IfaceInfo,
        dev: XdpDevice,
        endpoints: Endpoints,
        settings: StackSettings,
    ) -> anyhow::Result<Stack> {
        let StackSettings {
            connect_timeout,
            conn_id_base,
            random_seed,
            own_tcp,
            own_tcp_budget,
            syn_cookies,
        } = settings;
        let mut dev = dev;
        let start = StdInstant::now();
        let mut config = Config::new(HardwareAddress::Ethernet(EthernetAddress(info.mac)));
        config.random_seed = random_seed;
        let mut iface = Interface::new(config, &mut dev, Instant::from_micros(0));
        iface.update_ip_addrs(|addrs| {
            for a in &info.addrs {
                // Prefix 0: every destination is "on link" for smoltcp; the next hop is the kernel's
                // (see the module documentation).
                if addrs.push(IpCidr::new(IpAddress::from(a.addr), 0)).is_err() {
                    warn!(addr = %a.addr, "too many addresses on the interface; ignoring this one");
                }
            }
        });
        let mut nl = Netlink::open()?;
        let own = own_tcp.then(|| {
            own_tcp::OwnTcp::new(
                info.mtu,
                random_seed,
                own_tcp_budget.clone(),
                syn_cookies,
                &mut nl,
            )
        });
        Ok(Stack {
            iface,
            dev,
            sets: Sets::new(),
            nl,
            events: VecDeque::new(),
            listeners: IdMap::default(),
            conns: IdMap::default(),
            by_handle: IdMap::default(),
            woken: Arc::default(),
            wakers: IdMap::default(),
            touched: Vec::new(),
            deadlines: BTreeSet::new(),
            resolving: Vec::new(),
            draining: IdMap::default(),
            drain_order: VecDeque::new(),
            neigh: Neighbours::default(),
            peer_mss: HashMap::new(),
            next_conn: conn_id_base,
            connect_timeout,
            start,
            last_statistics: start,
            own,
            budget: own_tcp_budget,
            listeners_short: false,
            refill_listeners: false,
            endpoints,
            held: IdMap::default(),
            info,
        })
    }

    /// Steers `local`'s segments to us for as long as socket `h` lives (an accepted connection outlives
    /// its listener's port reservation).
    fn hold(&mut self, h: Sock, local: SocketAddr) {
        let k = endpoint_key(local.ip(), local.port());
        match self.endpoints.lock().expect("not poisoned").acquire(&[k]) {
            Ok(()) => {
                self.held.insert(h, k);
            }
            Err(e) => crate::warn_limited!(%local, error = %e, "cannot hold the endpoint in the XDP map"),
        }
    }

    fn remove_socket(&mut self, h: Sock) {
        debug!(state = %self.sets.get(h).state(), sockets = self.budget.connections(), "smoltcp socket removed");
        self.sets.remove(h);
        // Every socket in the sets was charged when it was made (`commands.rs`, `charged_socket`).
        self.budget.close_fixed(RX_BUFFER, TX_BUFFER);
        if std::mem::take(&mut self.listeners_short) {
            self.refill_listeners = true;
        }
        self.by_handle.remove(&h);
        self.wakers.remove(&h);
        self.draining.remove(&h);
        if let Some(k) = self.held.remove(&h) {
            self.endpoints.lock().expect("not poisoned").release(&[k]);
        }
    }

    /// Asks smoltcp to wake `h` (mark it for the next round) on its next receive, send-space or state change.
    fn watch(&mut self, h: Sock) {
        let woken = &self.woken;
        let w = self.wakers.entry(h).or_insert_with(|| {
            TaskWaker::from(Arc::new(SocketWaker {
                handle: h,
                woken: woken.clone(),
            }))
        });
        let s = self.sets.get_mut_unpolled(h);
        s.register_recv_waker(w);
        s.register_send_waker(w);
    }

    /// Gives connection `id` the socket `h`: its events now mark `id`.
    fn adopt(&mut self, id: ConnId, h: Sock) {
        self.by_handle.insert(h, id);
        self.watch(h);
    }

    /// The engine is done with socket `h`: it is removed once its last segment left ([`DRAIN_LIMIT`]).
    fn drain(&mut self, h: Sock, now: StdInstant) {
        self.by_handle.remove(&h);
        if Self::drained(self.sets.get(h)) {
            self.remove_socket(h);
            return;
        }
        self.draining.insert(h, now);
        self.drain_order.push_back((now, h));
        self.watch(h);
    }

    /// Nothing left to send: closed and forgotten by smoltcp (the reset, if any, went out), or TIME-WAIT
    /// (not kept: see the module documentation of `mod.rs`).
    fn drained(s: &tcp::Socket<'static>) -> bool {
        (s.state() == tcp::State::Closed && s.remote_endpoint().is_none())
            || s.state() == tcp::State::TimeWait
    }

    fn ts(&self, now: StdInstant) -> Instant {
        Instant::from_micros(now.duration_since(self.start).as_micros() as i64)
    }

    fn emit(&mut self, ev: TransportEvent) {
        // One line per failed connect, as the kernel transport writes it (the suites read it in both modes).
        if let TransportEvent::ConnectFailed { conn, reason } = &ev {
            let timeout = self.connect_timeout;
            debug!(conn = conn.0, ?reason, ?timeout, "connect failed");
        }
        self.events.push_back(ev);
    }

    /// The next event for the engine.
    pub fn poll_event(&mut self) -> Option<TransportEvent> {
        self.events.pop_front()
    }

    /// One round: copies received frames out of the RX rings, resolves neighbours, runs TCP, kicks TX and
    /// turns what happened to the connections into events ([`Stack::poll_event`]). Commands run at once
    /// ([`Stack::command`]); a round after them sends what they queued. True: there is more to do right
    /// away (frames left, a socket woken), so the caller runs another round before it sleeps.
    pub fn round(&mut self, now: StdInstant) -> bool {
        if now.duration_since(self.last_statistics) >= STATISTICS_PERIOD {
            self.last_statistics = now;
            for q in &self.dev.queues {
                let _ = q.refresh_statistics();
            }
        }
        let mut work = self.receive(now);
        for q in &mut self.dev.queues {
            q.reap_completions();
        }
        work |= self.resolve_neighbours(now);
        self.start_resolved(now);
        self.poll_stack(now);
        work |= self.service(now);
        work |= self.own_service(now);
        if work {
            self.poll_stack(now);
        }
        work || !self.dev.rx_frames.is_empty()
            || self.sets.busy()
            || !self.woken.lock().expect("not poisoned").is_empty()
    }

    fn poll_stack(&mut self, now: StdInstant) {
        let ts = self.ts(now);
        self.sets.poll(&mut self.iface, &mut self.dev, ts);
        self.dev.kick();
        for target in std::mem::take(&mut self.dev.solicits) {
            // smoltcp forgot (or never knew) it: ask the kernel again.
            self.neigh.known.remove(&target);
            self.want_neighbour(target, now);
        }
    }

    /// How long the caller may sleep on [`Stack::queue_fds`] before the next round is due (timers, neighbour
    /// checks, connect and close deadlines, unreaped TX frames); at most 100 ms.
    pub fn next_timeout(&self, now: StdInstant) -> Duration {
        let ts = self.ts(now);
        let mut timeout = self
            .sets
            .next_timer()
            .map(|at| Duration::from_micros(if at > ts { (at - ts).total_micros() } else { 0 }))
            .unwrap_or(Duration::from_millis(100))
            .min(Duration::from_millis(100));
        for p in self.neigh.pending.values() {
            timeout = timeout.min(p.next_check.saturating_duration_since(now));
        }
        for id in &self.resolving {
            if let Some(Conn {
                phase: Phase::Resolving { deadline },
                ..
            }) = self.conns.get(id)
            {
                timeout = timeout.min(deadline.saturating_duration_since(now));
            }
        }
        if let Some(at) = self.own.as_ref().and_then(|o| o.poll_at(self.start)) {
            timeout = timeout.min(at.saturating_duration_since(now));
        }
        if let Some(at) = self.own.as_ref().and_then(|o| o.connect_deadline()) {
            timeout = timeout.min(at.saturating_duration_since(now));
        }
        if self.own.as_ref().is_some_and(|o| o.has_resolving()) {
            timeout = timeout.min(Duration::from_millis(10));
        }
        let next = [
            self.deadlines.first().map(|(at, _)| *at),
            self.drain_order.front().map(|(since, _)| *since + DRAIN_LIMIT),
        ];
        for at in next.into_iter().flatten() {
            timeout = timeout.min(at.saturating_duration_since(now));
        }
        if self.dev.queues[0].tx_pending() > 0 {
            timeout = timeout.min(Duration::from_millis(1));
        }
        timeout
    }

    /// The transport is going away: every connection is reset and the statistics are logged.
    pub fn shutdown(&mut self) {
        if let Some(own) = &self.own {
            own.log_totals();
        }
        for (_, c) in self.conns.drain() {
            if let Some(h) = c.handle {
                self.sets.get_mut(h).abort();
            }
        }
        self.sets.all_due();
        let now = StdInstant::now();
        self.poll_stack(now);
        // Frames lost inside the host, not on the wire: steered but dropped by the kernel (no fill ring
        // entry, RX ring full), or produced by smoltcp while no TX frame was free.
        for q in &self.dev.queues {
            if let Some(s) = q.refresh_statistics() {
                info!(
                    queue = q.queue_id,
                    rx_dropped = s.rx_dropped,
                    rx_ring_full = s.rx_ring_full,
                    rx_fill_ring_empty_descs = s.rx_fill_ring_empty_descs,
                    rx_invalid_descs = s.rx_invalid_descs,
                    tx_invalid_descs = s.tx_invalid_descs,
                    tx_ring_empty_descs = s.tx_ring_empty_descs,
                    "AF_XDP socket statistics"
                );
            }
        }
        info!(tx_dropped = self.dev.tx_dropped, "XDP device statistics");
    }

    // ---------------------------------------------------------------------------------------------------
    // Receiving frames.

    fn receive(&mut self, now: StdInstant) -> bool {
        let Stack {
            dev,
            info,
            neigh,
            peer_mss,
            ..
        } = self;
        let XdpDevice {
            queues, rx_frames, ..
        } = dev;
        let mut n = 0;
        for q in queues.iter_mut() {
            n += q.receive(1024, |frame| {
                inspect(frame, info, neigh, peer_mss, rx_frames, now);
                rx_frames.push_back(frame.to_vec());
            });
        }
        if let Some(own) = self.own.as_mut()
            && n > 0
        {
            // Segments for own-TCP endpoints leave smoltcp's queue (neighbour answers stay).
            let frames = std::mem::take(&mut self.dev.rx_frames);
            for f in frames {
                if own.wants(&f) {
                    own.take(f);
                } else {
                    self.dev.rx_frames.push_back(f);
                }
            }
        }
        n > 0
    }

    /// Moves bytes and states between the sockets and the engine. True if anything moved. Looks only at
    /// the connections smoltcp woke, commands touched or whose deadline came, and at the listeners.
    fn service(&mut self, now: StdInstant) -> bool {
        let mut work = self.accept(now);
        let mut ids = std::mem::take(&mut self.touched);
        while let Some(&(at, id)) = self.deadlines.first() {
            if at > now {
                break;
            }
            self.deadlines.pop_first();
            ids.push(id);
        }
        let woken = std::mem::take(&mut *self.woken.lock().expect("not poisoned"));
        let mut drained = Vec::new();
        for h in woken {
            match self.by_handle.get(&h) {
                Some(id) => ids.push(*id),
                None if self.draining.contains_key(&h) => drained.push(h),
                None => {}
            }
        }
        ids.sort_unstable();
        ids.dedup();
        for id in ids {
            work |= self.service_conn(id, now);
        }
        while let Some(&(since, h)) = self.drain_order.front() {
            if now.duration_since(since) <= DRAIN_LIMIT {
                break;
            }
            self.drain_order.pop_front();
            if self.draining.get(&h) == Some(&since) {
                drained.push(h);
            }
        }
        drained.sort_unstable();
        drained.dedup();
        for h in drained {
            let Some(&since) = self.draining.get(&h) else {
                continue;
            };
            if Self::drained(self.sets.get(h)) || now.duration_since(since) > DRAIN_LIMIT {
                self.remove_socket(h);
            } else {
                self.watch(h);
            }
        }
        // Sockets given back in this round make room for the listening slots the pools lacked: made now,
        // before the next SYN finds none.
        if self.refill_listeners {
            work |= self.accept(now);
        }
        work
    }

    fn accept(&mut self, now: StdInstant) -> bool {
        let mut announced = Vec::new();
        let mut replenish = Vec::new();
        let mut dead = Vec::new();
        // A listening socket changes state only when its pool is polled: look only at those pools (and at
        // every pool when the budget has room for the slots it lacked).
        let mut polled = self.sets.take_polled_pools();
        if std::mem::take(&mut self.refill_listeners) {
            polled.extend(
                self.listeners
                    .values()
                    .flat_map(|l| l.pools.iter().map(|(_, set, _)| *set)),
            );
        }
        if polled.is_empty() {
            return false;
        }
        for (lid, l) in self.listeners.iter_mut() {
            for (pi, (ep, set, pool)) in l.pools.iter_mut().enumerate() {
                if !polled.contains(set) {
                    continue;
                }
                let mut spare = 0;
                pool.retain(|h| {
                    let s = self.sets.get(*h);
                    match s.state() {
                        tcp::State::Listen => {
                            spare += 1;
                            true
                        }
                        tcp::State::SynReceived => true,
                        tcp::State::Closed | tcp::State::TimeWait => {
                            dead.push(*h);
                            false
                        }
                        _ => {
                            announced.push((*lid, *h));
                            false
                        }
                    }
                });
                replenish.push((*lid, pi, *set, *ep, SPARE_LISTENERS.saturating_sub(spare)));
            }
        }
        for h in dead {
            // Out of the pool: it may still owe the peer a reset.
            let h = self.sets.move_out(h);
            self.drain(h, now);
        }
        for (lid, pi, set, ep, n) in replenish {
            for _ in 0..n {
                // None: past the bounds (or smoltcp refused): the next would be too.
                let Some(h) = self.add_listening_socket(set, ep) else {
                    break;
                };
                if let Some(l) = self.listeners.get_mut(&lid) {
                    l.pools[pi].2.push(h);
                }
            }
            // Its spare listening sockets are back: smoltcp may take that many more SYNs there.
            self.sets.replenished(set, SPARE_LISTENERS);
        }
        let any = !announced.is_empty();
        for (listener, h) in announced {
            // The connection leaves the pool for a socket set of its own.
            let h = self.sets.move_out(h);
            let s = self.sets.get_mut(h);
            let (Some(local), Some(remote)) = (s.local_endpoint(), s.remote_endpoint()) else {
                self.drain(h, now);
                continue;
            };
            Self::tune_open(s);
            let (local, remote) = (SocketAddr::from(local), SocketAddr::from(remote));
            self.hold(h, local);
            let conn = ConnId(self.next_conn);
            self.next_conn += 1;
            let mss = self.mss_for(remote, local.port());
            self.conns
                .insert(conn, Conn::new(Some(h), local, remote, Phase::Open));
            self.adopt(conn, h);
            // Bytes that arrived with the handshake are read in the next round.
            self.touched.push(conn);
            debug!(listener = listener.0, conn = conn.0, %local, %remote, mss, "accepted (XDP)");
            self.emit(TransportEvent::Accepted {
                listener,
                conn,
                local,
                remote,
                mss,
            });
        }
        any
    }

    fn service_conn(&mut self, id: ConnId, now: StdInstant) -> bool {
        let Some(c) = self.conns.get(&id) else {
            return false;
        };
        let Some(h) = c.handle else {
            return false;
        };
        // Re-armed first: whatever happens to the socket from now on marks this connection again.
        self.watch(h);
        let c = self.conns.get(&id).expect("exists");
        let mut work = false;
        if let Phase::Connecting { deadline } = c.phase {
            let s = self.sets.get_mut(h);
            match s.state() {
                tcp::State::SynSent | tcp::State::SynReceived => {
                    if now >= deadline {
                        s.abort();
                        self.drain(h, now);
                        self.conns.remove(&id);
                        self.emit(TransportEvent::ConnectFailed {
                            conn: id,
                            reason: ConnectFailure::TimedOut,
                        });
                    }
                    return false;
                }
                tcp::State::Closed | tcp::State::TimeWait | tcp::State::Listen => {
                    // A reset answered the SYN.
                    self.remove_socket(h);
                    self.conns.remove(&id);
                    self.emit(TransportEvent::ConnectFailed {
                        conn: id,
                        reason: ConnectFailure::Refused,
                    });
                    return false;
                }
                _ => {
                    Self::tune_open(s);
                    let local = s.local_endpoint().map(SocketAddr::from).unwrap_or(c.local);
                    let remote = c.remote;
                    let mss = self.mss_for(remote, local.port());
                    let c = self.conns.get_mut(&id).expect("exists");
                    c.phase = Phase::Open;
                    c.local = local;
                    debug!(conn = id.0, %local, %remote, mss, "connected (XDP)");
                    self.emit(TransportEvent::Connected { conn: id, local, mss });
                    work = true;
                }
            }
        }
        let s = self.sets.get_mut(h);
        let c = self.conns.get_mut(&id).expect("exists");
        // Received bytes.
        while s.can_recv() {
            let data = s
                .recv(|buf| (buf.len(), Bytes::copy_from_slice(buf)))
                .unwrap_or_default();
            if data.is_empty() {
                break;
            }
            work = true;
            self.events.push_back(TransportEvent::Received { conn: id, data });
        }
        // Queued sends into the socket's buffer.
        let written = c.pending.drain_into(|bytes| {
            if s.can_send() {
                s.send_slice(bytes).unwrap_or(0)
            } else {
                0
            }
        });
        if written > 0 {
            work = true;
            self.events.push_back(TransportEvent::Written {
                conn: id,
                bytes: written,
            });
        }
        // Graceful close once everything queued is in the socket.
        if c.close == Some(false) && !c.fin_sent && c.pending.is_empty() {
            s.close();
            c.fin_sent = true;
            work = true;
        }
        let state = s.state();
        // The peer closed (FIN after all its data, or RST): tell the engine once.
        if !c.closed_reported && !s.may_recv() {
            debug!(conn = id.0, ?state, "peer closed (XDP)");
            c.closed_reported = true;
            work = true;
            self.events.push_back(TransportEvent::Closed { conn: id });
            // The engine never closes it now: our FIN after what is queued, as in own_tcp.rs.
            c.close.get_or_insert(false);
            self.touched.push(id);
        }
        let finished = matches!(state, tcp::State::Closed | tcp::State::TimeWait);
        let lingered = c.linger_deadline.is_some_and(|d| now >= d);
        if finished || lingered {
            if !finished {
                s.abort();
            }
            let c = self.conns.remove(&id).expect("exists");
            self.drain(h, now);
            if !c.closed_reported {
                self.events.push_back(TransportEvent::Closed { conn: id });
            }
            work = true;
        }
        work
    }
}

/// Looks at a received frame before smoltcp does: the peer's MSS option in SYNs, and for on-link peers the
/// Ethernet source address (injected as a neighbour answer ahead of the frame when smoltcp lacks it).
fn inspect(
    frame: &[u8],
    info: &IfaceInfo,
    neigh: &mut Neighbours,
    peer_mss: &mut HashMap<(SocketAddr, u16), u16>,
    rx_frames: &mut VecDeque<Vec<u8>>,
    now: StdInstant,
) {
    if frame.len() < 14 {
        return;
    }
    let src_mac: [u8; 6] = frame[6..12].try_into().expect("6 bytes");
    let (src, l4, proto) = match u16::from_be_bytes([frame[12], frame[13]]) {
        0x0800 if frame.len() >= 34 => {
            let ihl = ((frame[14] & 0x0f) as usize) * 4;
            let ip: [u8; 4] = frame[26..30].try_into().expect("4 bytes");
            (IpAddr::from(ip), 14 + ihl, frame[23])
        }
        0x86DD if frame.len() >= 54 => {
            let ip: [u8; 16] = frame[22..38].try_into().expect("16 bytes");
            (IpAddr::from(ip), 54, frame[20])
        }
        _ => return,
    };
    if proto != 6 || frame.len() < l4 + 20 {
        return;
    }
    let tcp = &frame[l4..];
    let (sport, dport) = (
        u16::from_be_bytes([tcp[0], tcp[1]]),
        u16::from_be_bytes([tcp[2], tcp[3]]),
    );
    let flags = tcp[13];
    if flags & 0x02 != 0 {
        // SYN: remember the MSS option (RFC 9293 §3.7.1).
        let doff = ((tcp[12] >> 4) as usize) * 4;
        let mut opts = &tcp[20.min(tcp.len())..doff.min(tcp.len())];
        while let Some(&kind) = opts.first() {
            match kind {
                0 => break,
                1 => opts = &opts[1..],
                _ => {
                    let Some(&len) = opts.get(1) else { break };
                    let len = len as usize;
                    if len < 2 || len > opts.len() {
                        break;
                    }
                    if kind == 2 && len == 4 {
                        peer_mss.insert(
                            (SocketAddr::new(src, sport), dport),
                            u16::from_be_bytes([opts[2], opts[3]]),
                        );
                    }
                    opts = &opts[len..];
                }
            }
        }
        if peer_mss.len() > 4096 {
            peer_mss.clear();
        }
    }
    if !info.on_link(src) || src_mac[0] & 1 != 0 {
        return;
    }
    let fresh = neigh
        .known
        .get(&src)
        .is_some_and(|(mac, at)| *mac == src_mac && now.duration_since(*at) < NEIGH_REFRESH);
    if !fresh && let Some(f) = neighbour_frame(info, src, src_mac) {
        rx_frames.push_back(f);
        neigh.known.insert(src, (src_mac, now));
        neigh.pending.remove(&src);
    }
}
