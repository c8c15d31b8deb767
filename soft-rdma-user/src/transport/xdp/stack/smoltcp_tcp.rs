//! `--xdp-tcp smoltcp`: the XDP stack's steered flows on smoltcp's TCP socket, one socket per listening
//! slot and per connection, in the shared interface's socket sets (`sets.rs`). This backend owns those
//! sockets and what maps them to the engine: listeners' pools of listening sockets, connections (resolving
//! their next hop, connecting, open, closing), the wakers that mark a socket for the next round, sockets
//! draining after the engine forgot them, the peers' SYN MSS options and the charge of every socket to the
//! daemon's TCP bounds.
//!
//! Scale. Only the connections something happened to are looked at: each socket has a waker (smoltcp's
//! `async` wakers, woken inside `Interface::poll` when data arrives, buffer space frees up or the state
//! changes) that marks it, commands mark their connection, and connect and close deadlines are kept in
//! order; a listener's pool is looked at only when it was polled.
//!
//! Bounds: every socket (a connection or a listening slot) is charged its whole buffers, [`RX_BUFFER`] +
//! [`TX_BUFFER`], and one connection against `--max-tcp-connections` and `--max-tcp-buffer-bytes`, from
//! when it is made until it is removed. Past them a listener keeps fewer ready slots (a SYN finding none is
//! reset by smoltcp) and a connect fails with INSUFFICIENT_RESOURCES.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::task::{Wake, Waker as TaskWaker};
use std::time::{Duration, Instant as StdInstant};

use bytes::Bytes;
use smoltcp::socket::tcp;
use smoltcp::time::Duration as SDuration;
use smoltcp::wire::{IpAddress, IpListenEndpoint};
use soft_rdma_common::maps::EndpointKey;
use tracing::debug;

use super::queued_bytes::QueuedBytes;
use super::shared::{Cmd, Shared};
use crate::engine::requests::ListenerId;
use crate::engine::transport_seam::{ConnId, ConnectFailure, TransportEvent};
use crate::tcp::TcpBudget;
use crate::transport::xdp::loader::endpoint_key;
use crate::transport::xdp::netlink::Route;
use crate::transport::xdp::sets::{SetId, Sock};

/// Maps keyed by the transport's own ids (connections, sockets): a fast hasher, as they are looked up for
/// every segment. Maps keyed by what peers choose (addresses, ports) keep std's SipHash.
type IdMap<K, V> = foldhash::HashMap<K, V>;

/// Socket buffers, allocated whole per connection by smoltcp: 256 KiB of receive window keeps a veth or
/// 10G LAN path full at sub-millisecond RTTs (window scaling on), while 16,384 connections stay within
/// 6 GiB in the worst case (4 MiB + 2 MiB buffers would need 96 GiB there).
const RX_BUFFER: usize = 256 << 10;
const TX_BUFFER: usize = 128 << 10;
/// Listening sockets kept ready per listener address (smoltcp: one socket per connection; a SYN that finds
/// none listening is reset, so the device hands smoltcp at most this many SYNs between two replenishments
/// and the rest wait their turn; the buffers are untouched, hence not resident, until a connection uses
/// them).
const SPARE_LISTENERS: usize = 64;
/// How long a graceful close waits for the peer before the connection is dropped anyway (as kernel.rs).
const CLOSE_LINGER: Duration = Duration::from_secs(5);
/// How long a socket the engine forgot may take to send its last segment.
const DRAIN_LIMIT: Duration = Duration::from_secs(2);

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

/// MSS options seen in SYNs: (remote, local port) → MSS. smoltcp's socket does not tell the MSS it
/// negotiated, so the stack reads the peer's from its SYN (`mod.rs`, `inspect`).
#[derive(Default)]
pub(super) struct PeerMss(HashMap<(SocketAddr, u16), u16>);

impl PeerMss {
    /// A SYN from `remote` to `local_port` carried `mss`.
    pub(super) fn record(&mut self, remote: SocketAddr, local_port: u16, mss: u16) {
        self.0.insert((remote, local_port), mss);
    }

    /// Forgets every entry once there are too many (SYNs that never became connections).
    pub(super) fn bound(&mut self) {
        if self.0.len() > 4096 {
            self.0.clear();
        }
    }

    fn take(&mut self, remote: SocketAddr, local_port: u16) -> Option<u16> {
        self.0.remove(&(remote, local_port))
    }
}

/// The smoltcp-socket backend of the XDP stack (see the module documentation).
pub(super) struct SmoltcpTcp {
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
    peer_mss: PeerMss,
    /// Each connection's socket holds its local endpoint in the XDP map until removed.
    held: IdMap<Sock, EndpointKey>,
    /// The daemon's TCP bounds (`--max-tcp-connections`, `--max-tcp-buffer-bytes`): every socket is charged
    /// its whole buffers and one connection from when it is made until it is removed (`remove_socket`).
    budget: Arc<TcpBudget>,
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

impl SmoltcpTcp {
    pub(super) fn new(budget: Arc<TcpBudget>) -> SmoltcpTcp {
        SmoltcpTcp {
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
            peer_mss: PeerMss::default(),
            held: IdMap::default(),
            budget,
            listeners_short: false,
            refill_listeners: false,
        }
    }

    pub(super) fn command(&mut self, sh: &mut Shared, cmd: Cmd, now: StdInstant) {
        match cmd {
            Cmd::Listen { listener, local } => self.listen(sh, listener, local),
            Cmd::StopListening { listener } => self.stop_listening(sh, listener, now),
            Cmd::Connect {
                conn,
                local,
                remote,
                route,
            } => self.connect(sh, conn, local, remote, route, now),
            Cmd::Send { conn, data } => self.send(conn, data),
            Cmd::Close { conn, abort } => self.close(sh, conn, abort, now),
        }
    }

    /// Every connection's socket (those the engine forgot and that still drain their last segments
    /// included), with its addresses and smoltcp's name of its state, for `status`. (A listening socket's
    /// handshake under way is not listed until it is a connection.)
    pub(super) fn connections(&self, sh: &Shared) -> Vec<crate::transport::status::TcpConnectionStatus> {
        let handles: std::collections::BTreeSet<Sock> = self
            .conns
            .values()
            .filter_map(|c| c.handle)
            .chain(self.draining.keys().copied())
            .collect();
        let mut v: Vec<_> = handles
            .into_iter()
            .filter_map(|h| {
                let s = sh.sets.get(h);
                Some(crate::transport::status::TcpConnectionStatus {
                    local: SocketAddr::from(s.local_endpoint()?),
                    remote: SocketAddr::from(s.remote_endpoint()?),
                    state: s.state().to_string(),
                })
            })
            .collect();
        v.sort_by_key(|c| (c.local, c.remote));
        v
    }

    /// The peers' SYN MSS options, as the receive path records them.
    pub(super) fn peer_mss(&mut self) -> &mut PeerMss {
        &mut self.peer_mss
    }

    /// Sockets smoltcp woke since the last round: the next round looks at them.
    pub(super) fn woken(&self) -> bool {
        !self.woken.lock().expect("not poisoned").is_empty()
    }

    /// The earliest of the connections' deadlines: next hops resolving, connects, graceful closes, and
    /// the oldest draining socket's [`DRAIN_LIMIT`].
    pub(super) fn next_deadline(&self) -> Option<StdInstant> {
        let resolving = self.resolving.iter().filter_map(|id| match self.conns.get(id) {
            Some(Conn {
                phase: Phase::Resolving { deadline },
                ..
            }) => Some(*deadline),
            _ => None,
        });
        let next = [
            self.deadlines.first().map(|(at, _)| *at),
            self.drain_order.front().map(|(since, _)| *since + DRAIN_LIMIT),
        ];
        resolving.chain(next.into_iter().flatten()).min()
    }

    /// The transport is going away: every connection's socket is reset (the caller polls the sets once
    /// more to send the resets).
    pub(super) fn shutdown(&mut self, sh: &mut Shared) {
        for (_, c) in self.conns.drain() {
            if let Some(h) = c.handle {
                sh.sets.get_mut(h).abort();
            }
        }
    }

    // ---------------------------------------------------------------------------------------------------
    // Sockets.

    /// Steers `local`'s segments to us for as long as socket `h` lives (an accepted connection outlives
    /// its listener's port reservation).
    fn hold(&mut self, sh: &Shared, h: Sock, local: SocketAddr) {
        let k = endpoint_key(local.ip(), local.port());
        match sh.endpoints.lock().expect("not poisoned").acquire(&[k]) {
            Ok(()) => {
                self.held.insert(h, k);
            }
            Err(e) => crate::warn_limited!(%local, error = %e, "cannot hold the endpoint in the XDP map"),
        }
    }

    fn remove_socket(&mut self, sh: &mut Shared, h: Sock) {
        debug!(
            state = %sh.sets.get(h).state(),
            sockets = self.budget.connections(),
            "smoltcp socket removed"
        );
        sh.sets.remove(h);
        // Every socket in the sets was charged when it was made (`charged_socket`).
        self.budget.close_fixed(RX_BUFFER, TX_BUFFER);
        if std::mem::take(&mut self.listeners_short) {
            self.refill_listeners = true;
        }
        self.by_handle.remove(&h);
        self.wakers.remove(&h);
        self.draining.remove(&h);
        if let Some(k) = self.held.remove(&h) {
            sh.endpoints.lock().expect("not poisoned").release(&[k]);
        }
    }

    /// Asks smoltcp to wake `h` (mark it for the next round) on its next receive, send-space or state change.
    fn watch(&mut self, sh: &mut Shared, h: Sock) {
        let woken = &self.woken;
        let w = self.wakers.entry(h).or_insert_with(|| {
            TaskWaker::from(Arc::new(SocketWaker {
                handle: h,
                woken: woken.clone(),
            }))
        });
        let s = sh.sets.get_mut_unpolled(h);
        s.register_recv_waker(w);
        s.register_send_waker(w);
    }

    /// Gives connection `id` the socket `h`: its events now mark `id`.
    fn adopt(&mut self, sh: &mut Shared, id: ConnId, h: Sock) {
        self.by_handle.insert(h, id);
        self.watch(sh, h);
    }

    /// The engine is done with socket `h`: it is removed once its last segment left ([`DRAIN_LIMIT`]).
    fn drain(&mut self, sh: &mut Shared, h: Sock, now: StdInstant) {
        self.by_handle.remove(&h);
        if Self::drained(sh.sets.get(h)) {
            self.remove_socket(sh, h);
            return;
        }
        self.draining.insert(h, now);
        self.drain_order.push_back((now, h));
        self.watch(sh, h);
    }

    /// Nothing left to send: closed and forgotten by smoltcp (the reset, if any, went out), or TIME-WAIT
    /// (not kept: see the module documentation of `xdp/mod.rs`).
    fn drained(s: &tcp::Socket<'static>) -> bool {
        (s.state() == tcp::State::Closed && s.remote_endpoint().is_none())
            || s.state() == tcp::State::TimeWait
    }

    /// A new smoltcp socket, its buffers charged to the daemon's TCP bounds (`remove_socket` gives them
    /// back); `None` past `--max-tcp-connections` or `--max-tcp-buffer-bytes`, counted and logged.
    /// `active`: for a connect (else a listening slot).
    fn charged_socket(&mut self, active: bool) -> Option<tcp::Socket<'static>> {
        if self.budget.try_open_fixed(RX_BUFFER, TX_BUFFER) {
            return Some(Self::new_socket());
        }
        if active {
            self.budget.count_refused_connect();
        } else {
            self.listeners_short = true;
        }
        let limits = self.budget.limits();
        crate::warn_limited!(
            connections = self.budget.connections(),
            max_connections = limits.max_connections,
            buffer_bytes = self.budget.buffer_bytes(),
            max_buffer_bytes = limits.max_buffer_bytes,
            per_socket = RX_BUFFER + TX_BUFFER,
            "smoltcp connection bound reached: {}",
            if active {
                "the connect fails with INSUFFICIENT_RESOURCES"
            } else {
                "no listening slot made; a SYN past the ones ready is reset"
            }
        );
        None
    }

    fn new_socket() -> tcp::Socket<'static> {
        let mut s = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0u8; RX_BUFFER]),
            tcp::SocketBuffer::new(vec![0u8; TX_BUFFER]),
        );
        // As kernel.rs sets TCP_NODELAY: FPDUs go out as soon as they are queued.
        s.set_nagle_enabled(false);
        s.set_keep_alive(Some(SDuration::from_secs(5)));
        // Cubic: as the kernel; on a lossless veth it measured the same as no congestion control.
        s.set_congestion_control(tcp::CongestionControl::Cubic);
        s
    }

    /// Dead-peer detection once connected (kernel.rs: about 20 s, with keepalives every 5 s idle, set at
    /// creation: setting them on an idle open connection would send a probe at once).
    fn tune_open(s: &mut tcp::Socket<'static>) {
        s.set_timeout(Some(SDuration::from_secs(20)));
    }

    fn add_listening_socket(&mut self, sh: &mut Shared, pool: SetId, ep: IpListenEndpoint) -> Option<Sock> {
        let mut s = self.charged_socket(false)?;
        // A handshake that never completes (SYN-RECEIVED) closes the slot after 10 s (`accept` drops it).
        s.set_timeout(Some(SDuration::from_secs(10)));
        match s.listen(ep) {
            Ok(()) => Some(sh.sets.add_listening(pool, s)),
            Err(e) => {
                self.budget.close_fixed(RX_BUFFER, TX_BUFFER);
                crate::warn_limited!(?ep, error = ?e, "smoltcp listen failed");
                None
            }
        }
    }

    // ---------------------------------------------------------------------------------------------------
    // Commands.

    fn listen(&mut self, sh: &mut Shared, listener: ListenerId, local: SocketAddr) {
        let addrs = sh.info.expand(local.ip());
        if addrs.is_empty() {
            crate::warn_limited!(%local, "cannot listen: no address of that family on the interface");
            return;
        }
        let mut pools = Vec::new();
        for a in addrs {
            let ep = listen_endpoint(a, local.port());
            let set = sh.sets.add_pool(SocketAddr::new(a, local.port()));
            let mut pool = Vec::new();
            for _ in 0..SPARE_LISTENERS {
                // None: past the bounds (or smoltcp refused): the next would be too.
                let Some(h) = self.add_listening_socket(sh, set, ep) else {
                    break;
                };
                pool.push(h);
            }
            sh.sets.replenished(set, pool.len());
            pools.push((ep, set, pool));
        }
        debug!(listener = listener.0, %local, "listening (XDP)");
        self.listeners.insert(listener, Listener { pools });
    }

    /// Stops a listener: its listening sockets go; a handshake under way is reset.
    fn stop_listening(&mut self, sh: &mut Shared, listener: ListenerId, now: StdInstant) {
        if let Some(l) = self.listeners.remove(&listener) {
            for (_, set, pool) in l.pools {
                for h in pool {
                    if sh.sets.get(h).is_listening() {
                        self.remove_socket(sh, h);
                    } else {
                        // A handshake under way: reset in a set of its own, the pool goes.
                        let h = sh.sets.move_out(h);
                        sh.sets.get_mut(h).abort();
                        self.drain(sh, h, now);
                    }
                }
                sh.sets.remove_pool(set);
            }
        }
    }

    /// Resolves the next hop first: [`SmoltcpTcp::start_resolved`] sends the SYN.
    fn connect(
        &mut self,
        sh: &mut Shared,
        conn: ConnId,
        local: SocketAddr,
        remote: SocketAddr,
        route: Option<Route>,
        now: StdInstant,
    ) {
        let Some(local_ip) = sh.connect_source(conn, local, remote, route) else {
            return;
        };
        sh.neigh.failed.remove(&remote.ip());
        sh.want_neighbour(remote.ip(), now);
        self.conns.insert(
            conn,
            Conn::new(
                None,
                SocketAddr::new(local_ip, local.port()),
                remote,
                Phase::Resolving {
                    deadline: now + sh.connect_timeout,
                },
            ),
        );
        self.resolving.push(conn);
    }

    fn send(&mut self, conn: ConnId, data: Bytes) {
        if let Some(c) = self.conns.get_mut(&conn)
            && c.close.is_none()
            && !data.is_empty()
        {
            c.pending.push_back(data);
            self.touched.push(conn);
        }
    }

    /// Connections whose next hop resolved send their SYN (in the round's poll that follows); those whose
    /// resolution failed fail.
    pub(super) fn start_resolved(&mut self, sh: &mut Shared, now: StdInstant) {
        if self.resolving.is_empty() {
            return;
        }
        for id in std::mem::take(&mut self.resolving) {
            let Some(c) = self.conns.get(&id) else {
                continue; // closed while resolving
            };
            let (remote, local) = (c.remote, c.local);
            let Phase::Resolving { deadline } = c.phase else {
                continue;
            };
            if sh.neigh.known.contains_key(&remote.ip()) {
                self.start_connect(sh, id, local, remote, deadline);
            } else if sh.neigh.failed.contains_key(&remote.ip()) {
                self.conns.remove(&id);
                sh.emit(TransportEvent::ConnectFailed {
                    conn: id,
                    reason: ConnectFailure::HostUnreachable,
                });
            } else if now >= deadline {
                self.conns.remove(&id);
                sh.emit(TransportEvent::ConnectFailed {
                    conn: id,
                    reason: ConnectFailure::TimedOut,
                });
            } else {
                self.resolving.push(id);
            }
        }
        sh.neigh
            .failed
            .retain(|_, t| now.duration_since(*t) < Duration::from_secs(1));
    }

    /// Connection `id`'s next hop is known: its socket is made and connects (or the connect fails).
    fn start_connect(
        &mut self,
        sh: &mut Shared,
        id: ConnId,
        local: SocketAddr,
        remote: SocketAddr,
        deadline: StdInstant,
    ) {
        let Some(mut s) = self.charged_socket(true) else {
            self.conns.remove(&id);
            sh.emit(TransportEvent::ConnectFailed {
                conn: id,
                reason: ConnectFailure::NoResources,
            });
            return;
        };
        let r = s.connect(
            sh.iface.context(),
            (IpAddress::from(remote.ip()), remote.port()),
            (IpAddress::from(local.ip()), local.port()),
        );
        match r {
            Ok(()) => {
                let h = sh.sets.add_connection(s, local, remote);
                self.hold(sh, h, local);
                self.adopt(sh, id, h);
                let c = self.conns.get_mut(&id).expect("listed");
                c.handle = Some(h);
                c.phase = Phase::Connecting { deadline };
                self.deadlines.insert((deadline, id));
            }
            Err(e) => {
                self.budget.close_fixed(RX_BUFFER, TX_BUFFER);
                crate::warn_limited!(conn = id.0, %local, %remote, error = ?e, "smoltcp connect failed");
                self.conns.remove(&id);
                sh.emit(TransportEvent::ConnectFailed {
                    conn: id,
                    reason: ConnectFailure::Other,
                });
            }
        }
    }

    fn close(&mut self, sh: &mut Shared, conn: ConnId, abort: bool, now: StdInstant) {
        debug!(conn = conn.0, abort, "close (XDP)");
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        match (c.handle, &c.phase) {
            (None, _) | (Some(_), Phase::Connecting { .. }) => {
                // Not connected yet: abandon the attempt (kernel.rs reports Closed likewise).
                let c = self.conns.remove(&conn).expect("exists");
                if let Some(h) = c.handle {
                    sh.sets.get_mut(h).abort();
                    self.drain(sh, h, now);
                }
                sh.emit(TransportEvent::Closed { conn });
            }
            (Some(h), _) => {
                if abort {
                    let c = self.conns.remove(&conn).expect("exists");
                    sh.sets.get_mut(h).abort();
                    self.drain(sh, h, now);
                    if !c.closed_reported {
                        sh.emit(TransportEvent::Closed { conn });
                    }
                } else {
                    c.close = Some(false);
                    c.linger_deadline = Some(now + CLOSE_LINGER);
                    self.deadlines.insert((now + CLOSE_LINGER, conn));
                    self.touched.push(conn);
                }
            }
        }
    }

    // ---------------------------------------------------------------------------------------------------
    // Sockets ↔ engine.

    fn mss_for(&mut self, sh: &Shared, remote: SocketAddr, local_port: u16) -> u32 {
        let ip_hdr = if remote.is_ipv4() { 20 } else { 40 };
        let local = (sh.info.mtu - ip_hdr - 20) as u32;
        let peer = self.peer_mss.take(remote, local_port).map_or(local, u32::from);
        local.min(peer).clamp(536, 65_000)
    }

    /// Moves bytes and states between the sockets and the engine. True if anything moved. Looks only at
    /// the connections smoltcp woke, commands touched or whose deadline came, and at the listeners.
    pub(super) fn service(&mut self, sh: &mut Shared, now: StdInstant) -> bool {
        let mut work = self.accept(sh, now);
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
            work |= self.service_conn(sh, id, now);
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
            if Self::drained(sh.sets.get(h)) || now.duration_since(since) > DRAIN_LIMIT {
                self.remove_socket(sh, h);
            } else {
                self.watch(sh, h);
            }
        }
        // Sockets given back in this round make room for the listening slots the pools lacked: made now,
        // before the next SYN finds none.
        if self.refill_listeners {
            work |= self.accept(sh, now);
        }
        work
    }

    fn accept(&mut self, sh: &mut Shared, now: StdInstant) -> bool {
        let mut announced = Vec::new();
        let mut replenish = Vec::new();
        let mut dead = Vec::new();
        // A listening socket changes state only when its pool is polled: look only at those pools (and at
        // every pool when the budget has room for the slots it lacked).
        let mut polled = sh.sets.take_polled_pools();
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
                    let s = sh.sets.get(*h);
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
            let h = sh.sets.move_out(h);
            self.drain(sh, h, now);
        }
        for (lid, pi, set, ep, n) in replenish {
            for _ in 0..n {
                // None: past the bounds (or smoltcp refused): the next would be too.
                let Some(h) = self.add_listening_socket(sh, set, ep) else {
                    break;
                };
                if let Some(l) = self.listeners.get_mut(&lid) {
                    l.pools[pi].2.push(h);
                }
            }
            // Its spare listening sockets are back: smoltcp may take that many more SYNs there.
            sh.sets.replenished(set, SPARE_LISTENERS);
        }
        let any = !announced.is_empty();
        for (listener, h) in announced {
            self.announce(sh, listener, h, now);
        }
        any
    }

    /// A listening socket of `listener` got a connection: it leaves the pool for a socket set of its own
    /// and the engine hears `Accepted`.
    fn announce(&mut self, sh: &mut Shared, listener: ListenerId, h: Sock, now: StdInstant) {
        let h = sh.sets.move_out(h);
        let s = sh.sets.get_mut(h);
        let (Some(local), Some(remote)) = (s.local_endpoint(), s.remote_endpoint()) else {
            self.drain(sh, h, now);
            return;
        };
        Self::tune_open(s);
        let (local, remote) = (SocketAddr::from(local), SocketAddr::from(remote));
        self.hold(sh, h, local);
        let conn = sh.new_conn_id();
        let mss = self.mss_for(sh, remote, local.port());
        self.conns
            .insert(conn, Conn::new(Some(h), local, remote, Phase::Open));
        self.adopt(sh, conn, h);
        // Bytes that arrived with the handshake are read in the next round.
        self.touched.push(conn);
        debug!(listener = listener.0, conn = conn.0, %local, %remote, mss, "accepted (XDP)");
        sh.emit(TransportEvent::Accepted {
            listener,
            conn,
            local,
            remote,
            mss,
        });
    }

    fn service_conn(&mut self, sh: &mut Shared, id: ConnId, now: StdInstant) -> bool {
        let Some(c) = self.conns.get(&id) else {
            return false;
        };
        let Some(h) = c.handle else {
            return false;
        };
        // Re-armed first: whatever happens to the socket from now on marks this connection again.
        self.watch(sh, h);
        let c = self.conns.get(&id).expect("exists");
        let mut work = false;
        if let Phase::Connecting { deadline } = c.phase {
            let s = sh.sets.get_mut(h);
            match s.state() {
                tcp::State::SynSent | tcp::State::SynReceived => {
                    if now >= deadline {
                        s.abort();
                        self.drain(sh, h, now);
                        self.conns.remove(&id);
                        sh.emit(TransportEvent::ConnectFailed {
                            conn: id,
                            reason: ConnectFailure::TimedOut,
                        });
                    }
                    return false;
                }
                tcp::State::Closed | tcp::State::TimeWait | tcp::State::Listen => {
                    // A reset answered the SYN.
                    self.remove_socket(sh, h);
                    self.conns.remove(&id);
                    sh.emit(TransportEvent::ConnectFailed {
                        conn: id,
                        reason: ConnectFailure::Refused,
                    });
                    return false;
                }
                _ => {
                    Self::tune_open(s);
                    let local = s.local_endpoint().map(SocketAddr::from).unwrap_or(c.local);
                    let remote = c.remote;
                    let mss = self.mss_for(sh, remote, local.port());
                    let c = self.conns.get_mut(&id).expect("exists");
                    c.phase = Phase::Open;
                    c.local = local;
                    debug!(conn = id.0, %local, %remote, mss, "connected (XDP)");
                    sh.emit(TransportEvent::Connected { conn: id, local, mss });
                    work = true;
                }
            }
        }
        let s = sh.sets.get_mut(h);
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
            sh.events.push_back(TransportEvent::Received { conn: id, data });
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
            sh.events.push_back(TransportEvent::Written {
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
            sh.events.push_back(TransportEvent::Closed { conn: id });
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
            self.drain(sh, h, now);
            if !c.closed_reported {
                sh.events.push_back(TransportEvent::Closed { conn: id });
            }
            work = true;
        }
        work
    }
}
