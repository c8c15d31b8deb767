//! soft-rdmad's default (`--xdp-tcp own`): the XDP stack's steered flows on soft-rdma's own TCP
//! (`crate::tcp`), the other backend to smoltcp's socket (`smoltcp_tcp.rs`, `--xdp-tcp smoltcp`), in the
//! same rounds. The shared smoltcp interface keeps everything else (neighbour answers, frames for no
//! own-TCP endpoint); the receive path hands this backend the frames for its endpoints ([`OwnTcp::claim`]),
//! and the XDP program may answer its listeners' SYNs with SYN cookies (`syn_cookies.rs`).
//!
//! This file is the driver only: Ethernet/IPv4/IPv6 framing around `tcp::ConnectionTable`, the checksum
//! (`tcp::wire::checksum`; on receipt with the interface's partial-checksum policy, and every segment not
//! taken counted by reason: `drops.rs`), the XDP endpoint map, and translation to the engine's
//! `TransportEvent`s.
//!
//! Ends. A connection's `Closed` is reported once, with the debug line the kernel transport writes
//! ("connection ended", `how=` "peer_fin", "peer_reset", "timed_out" or "local"). The engine forgets a
//! connection it hears is closed, so after the peer's FIN this driver sends ours (after what is queued;
//! RFC 9293 §3.6, CLOSE-WAIT → LAST-ACK) and the connection goes once that is acknowledged, as the kernel
//! transport's socket does.
//!
//! Bounds: the table runs under the daemon's `tcp::TcpBudget` (`--max-tcp-connections`,
//! `--max-tcp-buffer-bytes`, shown by `soft-rdma status` with the XDP counters). A SYN past the connection
//! bound is reset and logged (rate-limited); a connect past it fails with INSUFFICIENT_RESOURCES. Past the
//! memory bound the engine's bytes wait in the connection's queue (`Written` comes when the send buffer
//! takes them, as for a full one) and the windows advertised shrink; the first time in a while, a warning.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use bytes::Bytes;
use smoltcp::phy::TxToken;
use tracing::{debug, warn};

use super::drops::{Checksum, DropCounts, DropReason, OUT_OF_WINDOW};
use super::queued_bytes::QueuedBytes;
use super::shared::{Cmd, Shared};
use super::syn_cookies::{SynCookieSetup, SynCookies};
use crate::engine::requests::ListenerId;
use crate::engine::transport_seam::{ConnId, ConnectFailure, TransportEvent};
use crate::error::NdStatus;
use crate::tcp::wire::{MAX_HEADER_LEN, checksum};
use crate::transport::xdp::iface_kind::PartialChecksums;
use crate::tcp::{
    CongestionControl, ConnectionTable, Delivery, Events, FourTuple, Instant, Keepalive, State, TcpBudget,
    TcpConfig, TcpHeader,
};
use crate::transport::xdp::loader::endpoint_key;
use crate::transport::xdp::netlink::{Netlink, Route};

struct OwnConn {
    tuple: FourTuple,
    /// Bytes the engine queued that the send ring had no room for yet.
    pending: QueuedBytes,
    /// Accepted through this listener (`None`: our connect).
    listener: Option<ListenerId>,
    connected: bool,
    closed_reported: bool,
    close_requested: bool,
}

impl OwnConn {
    /// A connection on `tuple`, ours (`listener` `None`) or accepted through `listener`.
    fn new(tuple: FourTuple, listener: Option<ListenerId>) -> OwnConn {
        OwnConn {
            tuple,
            pending: QueuedBytes::default(),
            listener,
            connected: false,
            closed_reported: false,
            close_requested: false,
        }
    }
}

/// The own-TCP state of the XDP stack.
pub(super) struct OwnTcp {
    table: ConnectionTable,
    ids: HashMap<FourTuple, ConnId>,
    conns: HashMap<ConnId, OwnConn>,
    listeners: HashMap<ListenerId, Vec<SocketAddr>>,
    /// Connects waiting for their next hop's MAC, with their deadline.
    resolving: Vec<(ConnId, FourTuple, StdInstant)>,
    /// Connects under way (SYN sent), with the deadline of the connect timeout.
    connecting: Vec<(ConnId, StdInstant)>,
    /// Frames for own-TCP endpoints, taken from the receive path.
    inbound: Vec<Vec<u8>>,
    touched: Vec<ConnId>,
    ip_id: u16,
    payload: Vec<u8>,
    /// The budget's count of memory-limited growths when last looked at (a change is warned about).
    memory_limited_seen: u64,
    /// SYN cookies, if the program may answer listeners' SYNs.
    cookies: Option<SynCookies>,
    /// Whether the interface lets segments with a partial checksum in (`iface_kind.rs`).
    checksums: PartialChecksums,
    /// Segments dropped before the table took them, by reason (`drops.rs`).
    drops: DropCounts,
}

/// A parsed IPv4/IPv6 TCP frame: addresses from our side and the TCP segment's bytes.
fn tcp_of_frame(frame: &[u8]) -> Option<(FourTuple, &[u8])> {
    if frame.len() < 14 {
        return None;
    }
    let (src, dst, seg): (IpAddr, IpAddr, &[u8]) = match u16::from_be_bytes([frame[12], frame[13]]) {
        0x0800 => {
            let ip = &frame[14..];
            if ip.len() < 20 || ip[0] >> 4 != 4 || ip[9] != 6 {
                return None;
            }
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
            // Fragments are not ours (the XDP program passes them to the kernel).
            if ihl < 20 || total < ihl || total > ip.len() || u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0
            {
                return None;
            }
            let s: [u8; 4] = ip[12..16].try_into().ok()?;
            let d: [u8; 4] = ip[16..20].try_into().ok()?;
            (IpAddr::from(s), IpAddr::from(d), &ip[ihl..total])
        }
        0x86DD => {
            let ip = &frame[14..];
            if ip.len() < 40 || ip[0] >> 4 != 6 || ip[6] != 6 {
                return None;
            }
            let len = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
            if 40 + len > ip.len() {
                return None;
            }
            let s: [u8; 16] = ip[8..24].try_into().ok()?;
            let d: [u8; 16] = ip[24..40].try_into().ok()?;
            (IpAddr::from(s), IpAddr::from(d), &ip[40..40 + len])
        }
        _ => return None,
    };
    if seg.len() < 20 {
        return None;
    }
    let sport = u16::from_be_bytes([seg[0], seg[1]]);
    let dport = u16::from_be_bytes([seg[2], seg[3]]);
    Some((
        FourTuple {
            local: SocketAddr::new(dst, dport),
            remote: SocketAddr::new(src, sport),
        },
        seg,
    ))
}

/// An address's bytes (4 or 16) without allocating: the buffer and the length used.
fn addr_bytes(ip: &IpAddr) -> ([u8; 16], usize) {
    let mut b = [0u8; 16];
    match ip {
        IpAddr::V4(a) => {
            b[..4].copy_from_slice(&a.octets());
            (b, 4)
        }
        IpAddr::V6(a) => (a.octets(), 16),
    }
}

impl OwnTcp {
    /// `syn_cookies`: what SYN cookies are set up with (`None`: every SYN comes to the table);
    /// `checksums`: whether the interface lets partial checksums in.
    pub(super) fn new(
        mtu: usize,
        random_seed: u64,
        budget: Arc<TcpBudget>,
        (syn_cookies, checksums): (Option<SynCookieSetup>, PartialChecksums),
        nl: &mut Netlink,
    ) -> OwnTcp {
        let cfg = TcpConfig {
            // IPv6 header and TCP header without options (RFC 9293 §3.7.1); IPv4's is set below.
            // A segment with its headers must also fit one AF_XDP frame.
            mss: mtu
                .saturating_sub(60)
                .min(super::super::xsk::MAX_FRAME - 14 - 60 - 40)
                .clamp(536, 65_000) as u16,
            congestion: host_congestion_control(),
            // Rings for several bandwidth-delay products of a lossy WAN-like path, as large as the
            // kernel's default tcp_wmem maximum (4 MiB): a hole at SND.UNA must not stop the sender while
            // it is repaired (a round trip or more, during which everything after it waits in both
            // rings), and the peer's reordered segments need room. On issue 7's link (5 % loss,
            // 10 ± 5 ms, 10 % reordering) 1 MiB rings held the own TCP to about 10 MB/s while the kernel's
            // reached 15 MB/s (issue 34; the loss bench, `cargo xtask bench --only loss`).
            // These are bounds: a ring's memory grows with what it holds and is given back after a second
            // empty (tcp/ring.rs), so idle connections hold none; all of them together stay under the
            // daemon's --max-tcp-buffer-bytes (tcp/budget.rs).
            send_buffer: 4 << 20,
            recv_buffer: 4 << 20,
            // Out-of-order ranges held by the receiver and SACKed ranges kept by the sender. A delay that
            // jitters by ±5 ms reorders every segment within 10 ms of sending, so at 10 MB/s a window holds
            // hundreds of holes; past the bound the receiver drops a segment that would open one more and
            // the sender forgets SACKs, and both cost a retransmission. 64 ranges made most of the
            // retransmissions on that link needless (`tcp/sim_tests.rs`,
            // `jittery_link_keeps_its_sacks`). The vectors grow only as needed.
            max_ranges: 1024,
            // Dead-peer detection as smoltcp's socket here and kernel.rs: keepalives after 5 s idle, the
            // connection given up after 20 s unanswered (5 s + 3 probes 5 s apart; or 20 s of unacknowledged
            // retransmissions).
            keepalive: Some(Keepalive {
                idle: Duration::from_secs(5),
                interval: Duration::from_secs(5),
                probes: 3,
            }),
            user_timeout: Some(Duration::from_secs(20)),
            ..TcpConfig::default()
        };
        let limits = budget.limits();
        tracing::info!(
            congestion = ?cfg.congestion,
            max_connections = limits.max_connections,
            max_buffer_bytes = limits.max_buffer_bytes,
            "own TCP"
        );
        let mut table = ConnectionTable::with_budget(cfg, budget, random_seed);
        // IPv4: a 20-byte fixed IP header, so 20 bytes more per segment (the frame bound likewise).
        table.set_ipv4_mss(
            mtu.saturating_sub(40)
                .min(super::super::xsk::MAX_FRAME - 14 - 60 - 20)
                .clamp(536, 65_000) as u16,
        );
        let cookies =
            syn_cookies.and_then(|setup| SynCookies::start(setup, &mut table, nl, StdInstant::now()));
        OwnTcp {
            table,
            ids: HashMap::new(),
            conns: HashMap::new(),
            listeners: HashMap::new(),
            resolving: Vec::new(),
            connecting: Vec::new(),
            inbound: Vec::new(),
            touched: Vec::new(),
            ip_id: 0,
            payload: vec![0u8; 65_536],
            memory_limited_seen: 0,
            cookies,
            checksums,
            drops: DropCounts::default(),
        }
    }

    /// Takes the received frames for own-TCP endpoints (a connection's or a listener's) out of `rx_frames`,
    /// smoltcp's queue; the rest (neighbour answers, segments for no endpoint of ours) stay there.
    pub(super) fn claim(&mut self, rx_frames: &mut VecDeque<Vec<u8>>) {
        let frames = std::mem::take(rx_frames);
        for f in frames {
            if self.wants(&f) {
                self.inbound.push(f);
            } else {
                rx_frames.push_back(f);
            }
        }
    }

    /// Whether a received frame belongs to an own-TCP endpoint.
    fn wants(&self, frame: &[u8]) -> bool {
        let Some((t, _)) = tcp_of_frame(frame) else {
            return false;
        };
        self.table.get(&t).is_some() || self.table.listener_of(t.local).is_some()
    }

    /// When the next round is due for this backend: the table's next timer (on the clock that started at
    /// `start`), the earliest connect deadline, and 10 ms while a connect waits for its next hop.
    pub(super) fn next_deadline(&self, start: StdInstant, now: StdInstant) -> Option<StdInstant> {
        let timer = self
            .table
            .poll_at()
            .map(|at| start + Duration::from_micros(at.micros()));
        let connect = self.connecting.iter().map(|c| c.1).min();
        let resolving = (!self.resolving.is_empty()).then(|| now + Duration::from_millis(10));
        [timer, connect, resolving].into_iter().flatten().min()
    }

    /// Every connection the table holds, for `status`.
    pub(super) fn connections(&self) -> Vec<crate::transport::status::TcpConnectionStatus> {
        let mut v: Vec<_> = self
            .table
            .connections()
            .map(|(t, c)| crate::transport::status::TcpConnectionStatus {
                local: t.local,
                remote: t.remote,
                state: c.state().name().to_owned(),
            })
            .collect();
        v.sort_by_key(|c| (c.local, c.remote));
        v
    }

    /// Every connection's counters since start, and the SYN-cookie counts (connections opened from a
    /// cookie, ACKs whose cookie did not check out).
    pub(super) fn totals(&self) -> (crate::tcp::TcpCounters, (u64, u64)) {
        (self.table.total_counters(), self.table.syn_cookie_counts())
    }

    /// Segments dropped since start, by `status` name: before the table (checksum, header, no connection:
    /// `drops.rs`) and by it (outside the window).
    pub(super) fn drop_counters(&self) -> Vec<(&'static str, u64)> {
        let mut c: Vec<_> = self.drops.counters().collect();
        c.push((OUT_OF_WINDOW, self.table.total_counters().unacceptable_segments));
        c
    }

    /// Counters summed over the connections held now (logged when the transport stops).
    pub(super) fn log_totals(&self) {
        let mut t = crate::tcp::TcpCounters::default();
        let mut buffer_memory = 0usize;
        for (tuple, conn) in self.table.connections() {
            buffer_memory += conn.buffer_memory();
            tracing::info!(
                local = %tuple.local,
                remote = %tuple.remote,
                state = ?conn.state(),
                cwnd = conn.congestion_window(),
                ssthresh = conn.slow_start_threshold(),
                srtt = ?conn.smoothed_rtt(),
                rto = ?conn.rto(),
                reordering = conn.reordering(),
                mss = conn.send_mss(),
                negotiated = ?conn.negotiated(),
                counters = ?conn.counters(),
                "own TCP connection"
            );
            let c = conn.counters();
            t.segments_sent += c.segments_sent;
            t.retransmitted_segments += c.retransmitted_segments;
            t.rto_events += c.rto_events;
            t.fast_retransmits += c.fast_retransmits;
            t.tlp_probes += c.tlp_probes;
            t.sack_retransmits += c.sack_retransmits;
            t.lost_retransmissions += c.lost_retransmissions;
            t.spurious_recoveries += c.spurious_recoveries;
        }
        let (cookie_connections, cookies_refused) = self.table.syn_cookie_counts();
        tracing::info!(
            connections = self.table.len(),
            cookie_connections,
            cookies_refused,
            segments_sent = t.segments_sent,
            retransmitted = t.retransmitted_segments,
            rto_events = t.rto_events,
            fast_retransmits = t.fast_retransmits,
            tlp_probes = t.tlp_probes,
            sack_retransmits = t.sack_retransmits,
            lost_retransmissions = t.lost_retransmissions,
            spurious_recoveries = t.spurious_recoveries,
            buffer_memory,
            "own TCP totals"
        );
    }

    // ---------------------------------------------------------------------------------------------------
    // Commands.

    pub(super) fn command(&mut self, sh: &mut Shared, cmd: Cmd, now: StdInstant) {
        match cmd {
            Cmd::Listen { listener, local } => self.listen(sh, listener, local),
            Cmd::StopListening { listener } => self.stop_listening(sh, listener),
            Cmd::Connect {
                conn,
                local,
                remote,
                route,
            } => self.connect(sh, conn, local, remote, route, now),
            Cmd::Send { conn, data } => self.send(conn, data),
            Cmd::Close { conn, abort } => {
                if self.has(conn) {
                    self.close(sh, conn, abort);
                } else {
                    sh.emit(TransportEvent::Closed { conn });
                }
            }
        }
    }

    fn listen(&mut self, sh: &mut Shared, listener: ListenerId, local: SocketAddr) {
        // An unspecified address listens on each of the interface's addresses of its family.
        let addrs: Vec<SocketAddr> = sh
            .info
            .expand(local.ip())
            .into_iter()
            .map(|a| SocketAddr::new(a, local.port()))
            .collect();
        if let Some(c) = self.cookies.as_mut() {
            c.check_peer(&mut sh.nl, StdInstant::now());
        }
        let mut held = Vec::new();
        for a in addrs {
            if let Err(e) = self.table.listen(a, listener.0) {
                warn!(local = %a, error = %e, "own TCP: listen");
                continue;
            }
            let k = endpoint_key(a.ip(), a.port());
            let mut endpoints = sh.endpoints.lock().expect("not poisoned");
            if let Err(e) = endpoints.acquire(&[k]) {
                warn!(local = %a, error = %e, "cannot hold the endpoint in the XDP map");
            }
            endpoints.set_listening(k, true);
            held.push(a);
        }
        debug!(listener = listener.0, %local, "listening (XDP, own TCP)");
        self.listeners.insert(listener, held);
    }

    fn stop_listening(&mut self, sh: &mut Shared, listener: ListenerId) {
        for local in self.listeners.remove(&listener).unwrap_or_default() {
            self.table.unlisten(local);
            let k = endpoint_key(local.ip(), local.port());
            let mut endpoints = sh.endpoints.lock().expect("not poisoned");
            endpoints.set_listening(k, false);
            endpoints.release(&[k]);
        }
    }

    /// Resolves the next hop first: the round's [`OwnTcp::service`] starts the connection.
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
        let local = SocketAddr::new(local_ip, local.port());
        sh.neigh.failed.remove(&remote.ip());
        sh.want_neighbour(remote.ip(), now);
        let deadline = now + sh.connect_timeout;
        let k = endpoint_key(local.ip(), local.port());
        if let Err(e) = sh.endpoints.lock().expect("not poisoned").acquire(&[k]) {
            warn!(%local, error = %e, "cannot hold the endpoint in the XDP map");
        }
        self.resolving.push((conn, FourTuple { local, remote }, deadline));
    }

    fn send(&mut self, conn: ConnId, data: Bytes) {
        if let Some(c) = self.conns.get_mut(&conn)
            && !c.close_requested
            && !data.is_empty()
        {
            c.pending.push_back(data);
            self.touched.push(conn);
        }
    }

    fn close(&mut self, sh: &mut Shared, conn: ConnId, abort: bool) {
        debug!(conn = conn.0, abort, "close (XDP, own TCP)");
        if let Some(i) = self.resolving.iter().position(|r| r.0 == conn) {
            let (_, t, _) = self.resolving.swap_remove(i);
            sh.release_endpoint(t.local);
            sh.emit(TransportEvent::Closed { conn });
            return;
        }
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.close_requested = true;
        if abort {
            let t = c.tuple;
            if let Some(tc) = self.table.get_mut(t) {
                tc.abort();
            }
        }
        self.touched.push(conn);
    }

    /// Whether this command's connection is the own TCP's.
    fn has(&self, conn: ConnId) -> bool {
        self.conns.contains_key(&conn) || self.resolving.iter().any(|r| r.0 == conn)
    }

    // ---------------------------------------------------------------------------------------------------
    // Rounds.

    /// One round of the own TCP: connects whose neighbour is known, inbound segments, queued sends, then
    /// output and events. True if anything happened.
    pub(super) fn service(&mut self, sh: &mut Shared, now: StdInstant) -> bool {
        let ts = tcp_now(sh, now);
        if let Some(c) = self.cookies.as_mut() {
            c.service(&mut self.table, &mut sh.nl, now);
        }
        let mut work = self.start_connects(sh, ts, now);
        work |= self.expire_connects(sh, now);
        work |= self.receive_segments(sh, ts);
        work |= self.push_touched(sh);
        work |= self.output(sh, ts);
        self.warn_memory_limited();
        work
    }

    /// Connects whose next hop resolved send their SYN; those whose resolution failed or ran out of time
    /// fail. True if a connection started.
    fn start_connects(&mut self, sh: &mut Shared, ts: Instant, now: StdInstant) -> bool {
        let mut work = false;
        for (conn, t, deadline) in std::mem::take(&mut self.resolving) {
            if sh.neigh.known.contains_key(&t.remote.ip()) {
                match self.table.connect(ts, t) {
                    Ok(()) => {
                        self.connecting.push((conn, deadline));
                        self.ids.insert(t, conn);
                        self.conns.insert(conn, OwnConn::new(t, None));
                        work = true;
                    }
                    Err(e) => {
                        crate::warn_limited!(conn = conn.0, error = %e, "own TCP connect");
                        sh.release_endpoint(t.local);
                        let reason = if e.status == NdStatus::InsufficientResources {
                            ConnectFailure::NoResources
                        } else {
                            ConnectFailure::AddressInUse
                        };
                        sh.emit(TransportEvent::ConnectFailed { conn, reason });
                    }
                }
            } else if sh.neigh.failed.contains_key(&t.remote.ip()) {
                sh.release_endpoint(t.local);
                sh.emit(TransportEvent::ConnectFailed {
                    conn,
                    reason: ConnectFailure::HostUnreachable,
                });
            } else if now >= deadline {
                sh.release_endpoint(t.local);
                sh.emit(TransportEvent::ConnectFailed {
                    conn,
                    reason: ConnectFailure::TimedOut,
                });
            } else {
                self.resolving.push((conn, t, deadline));
            }
        }
        work
    }

    /// Connects that ran out of time (the engine's connect timeout, as on smoltcp's socket) are aborted
    /// and fail. True if one did.
    fn expire_connects(&mut self, sh: &mut Shared, now: StdInstant) -> bool {
        let mut work = false;
        let (expired, waiting): (Vec<_>, Vec<_>) = self.connecting.drain(..).partition(|c| now >= c.1);
        self.connecting = waiting;
        for (conn, _) in expired {
            let Some(c) = self.conns.get_mut(&conn) else {
                continue;
            };
            if c.connected {
                continue;
            }
            c.closed_reported = true;
            if let Some(tc) = self.table.get_mut(c.tuple) {
                tc.abort();
            }
            sh.emit(TransportEvent::ConnectFailed {
                conn,
                reason: ConnectFailure::TimedOut,
            });
            work = true;
        }
        work
    }

    /// The segments the receive path claimed, checked and handed to the table: a connection opened
    /// through a listener gets its id; a SYN refused or a segment for no connection is answered with the
    /// table's RST. True if a segment was well-formed.
    fn receive_segments(&mut self, sh: &mut Shared, ts: Instant) -> bool {
        let mut work = false;
        for frame in std::mem::take(&mut self.inbound) {
            let Some((t, seg)) = tcp_of_frame(&frame) else {
                continue;
            };
            let ((src, sn), (dst, dn)) = (addr_bytes(&t.remote.ip()), addr_bytes(&t.local.ip()));
            match super::drops::check_checksum(self.checksums, &src[..sn], &dst[..dn], seg) {
                Checksum::Valid => {}
                Checksum::PartialAccepted => self.drops.partial_accepted(t.remote.ip(), &sh.info.name),
                Checksum::Dropped(reason) => {
                    self.drops.drop(reason, t.remote.ip(), &sh.info.name);
                    continue;
                }
            }
            let Ok((h, off)) = TcpHeader::parse(seg) else {
                self.drops.drop(DropReason::Malformed, t.remote.ip(), &sh.info.name);
                continue;
            };
            if h.flags.rst() {
                debug!(local = %t.local, remote = %t.remote, seq = h.seq.0, ack = h.ack.0, ttl = frame.get(22).copied(), "RST received (XDP, own TCP)");
            }
            work = true;
            match self.table.on_segment(ts, t, &h, &seg[off..]) {
                Delivery::Connection => {}
                Delivery::Opened => self.opened(sh, t),
                Delivery::Refused(rst) => {
                    let budget = self.table.budget();
                    crate::warn_limited!(
                        local = %t.local,
                        remote = %t.remote,
                        connections = budget.connections(),
                        refused = budget.refused_syns(),
                        "own TCP connection bound (max_tcp_connections) reached: SYN answered with RST"
                    );
                    transmit(sh, &mut self.ip_id, t, &rst, &[]);
                }
                Delivery::Unmatched(Some(rst)) => {
                    debug!(local = %t.local, remote = %t.remote, flags = h.flags.0, "segment for no connection: RST (XDP, own TCP)");
                    self.drops.drop(DropReason::NoConnection, t.remote.ip(), &sh.info.name);
                    transmit(sh, &mut self.ip_id, t, &rst, &[]);
                }
                Delivery::Unmatched(None) => {
                    self.drops.drop(DropReason::NoConnection, t.remote.ip(), &sh.info.name);
                }
            }
        }
        work
    }

    /// A listener's connection on `t` opened: it gets its id (the engine hears `Accepted` once the table
    /// reports it connected).
    fn opened(&mut self, sh: &mut Shared, t: FourTuple) {
        // The table let a new connection take the 4-tuple of one that lingered in TIME-WAIT or CLOSED (and
        // dropped that one): its id, its state here and its hold on the endpoint go with it.
        if let Some(old) = self.ids.remove(&t) {
            if let Some(c) = self.conns.remove(&old) {
                debug!(conn = old.0, local = %t.local, remote = %t.remote, "a new connection takes the 4-tuple of a lingering one (XDP, own TCP)");
                if !c.closed_reported {
                    sh.emit(TransportEvent::Closed { conn: old });
                }
            }
            self.connecting.retain(|x| x.0 != old);
            sh.release_endpoint(t.local);
        }
        let listener = self.table.listener_of(t.local).map(ListenerId);
        // The connection holds its endpoint in the XDP map for as long as it lives: it outlives its
        // listener (the map counts references).
        let k = endpoint_key(t.local.ip(), t.local.port());
        if let Err(e) = sh.endpoints.lock().expect("not poisoned").acquire(&[k]) {
            warn!(local = %t.local, error = %e, "cannot hold the endpoint in the XDP map");
        }
        let conn = sh.new_conn_id();
        self.ids.insert(t, conn);
        self.conns.insert(conn, OwnConn::new(t, listener));
    }

    /// Queued sends and close requests of the connections commands touched. True if one was looked at.
    fn push_touched(&mut self, sh: &mut Shared) -> bool {
        let mut work = false;
        for conn in std::mem::take(&mut self.touched) {
            let Some(c) = self.conns.get_mut(&conn) else {
                continue;
            };
            let Some(tc) = self.table.get_mut(c.tuple) else {
                continue;
            };
            let written = push_pending(c, tc);
            if written > 0 {
                sh.emit(TransportEvent::Written { conn, bytes: written });
            }
            if c.close_requested && c.pending.is_empty() {
                tc.close();
            }
            work = true;
        }
        work
    }

    /// Output (framed straight onto the TX ring from the connection's payload buffer) and events. True if
    /// a segment went out or an event came.
    fn output(&mut self, sh: &mut Shared, ts: Instant) -> bool {
        let mut work = false;
        let mut sent = false;
        loop {
            let ip_id = &mut self.ip_id;
            let next = self.table.poll(ts, &mut self.payload, |t, h, p| {
                sent = true;
                transmit(sh, ip_id, t, h, p);
            });
            let Some((t, ev)) = next else { break };
            work = true;
            self.event(sh, t, ev);
        }
        work || sent
    }

    /// Warns when the table's buffer memory reached its bound since the last round.
    fn warn_memory_limited(&mut self) {
        let budget = self.table.budget();
        let limited = budget.memory_limited();
        if limited != self.memory_limited_seen {
            self.memory_limited_seen = limited;
            crate::warn_limited!(
                held = budget.buffer_bytes(),
                bound = budget.limits().max_buffer_bytes,
                connections = budget.connections(),
                "own TCP buffer memory at its bound (max_tcp_buffer_bytes): windows shrink and sends wait"
            );
        }
    }

    fn event(&mut self, sh: &mut Shared, t: FourTuple, ev: Events) {
        let Some(&conn) = self.ids.get(&t) else { return };
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        let Some(tc) = self.table.get_mut(t) else { return };
        if ev.contains(Events::CONNECTED) && !c.connected {
            c.connected = true;
            self.connecting.retain(|x| x.0 != conn);
            let mss = tc.send_mss();
            debug!(conn = conn.0, local = %t.local, remote = %t.remote, mss, "connected (XDP, own TCP)");
            let event = match c.listener {
                Some(listener) => TransportEvent::Accepted {
                    listener,
                    conn,
                    local: t.local,
                    remote: t.remote,
                    mss,
                },
                None => TransportEvent::Connected {
                    conn,
                    local: t.local,
                    mss,
                },
            };
            sh.emit(event);
        }
        if tc.readable() > 0 {
            let mut buf = vec![0u8; tc.readable()];
            let n = tc.recv(&mut buf);
            buf.truncate(n);
            tracing::trace!(conn = conn.0, bytes = n, "received (XDP, own TCP)");
            sh.events.push_back(TransportEvent::Received {
                conn,
                data: Bytes::from(buf),
            });
        }
        if ev.contains(Events::WRITABLE) {
            let written = push_pending(c, tc);
            if written > 0 {
                sh.emit(TransportEvent::Written { conn, bytes: written });
            }
            if c.close_requested && c.pending.is_empty() {
                tc.close();
            }
        }
        let failed = ev.contains(Events::RESET) || ev.contains(Events::TIMED_OUT);
        if !c.connected && failed {
            let reason = if ev.contains(Events::RESET) {
                ConnectFailure::Refused
            } else {
                ConnectFailure::TimedOut
            };
            c.closed_reported = true;
            if c.listener.is_none() {
                sh.emit(TransportEvent::ConnectFailed { conn, reason });
            }
        }
        let peer_done = ev.contains(Events::PEER_CLOSED) || failed || tc.state() == State::Closed;
        if peer_done && !c.closed_reported {
            let (local, peer, how) = (Some(t.local), Some(t.remote), ending(ev, c.close_requested));
            debug!(conn = conn.0, ?local, ?peer, how, ?ev, state = ?tc.state(), "connection ended");
            c.closed_reported = true;
            sh.emit(TransportEvent::Closed { conn });
            // The engine forgets a connection it hears is closed and never closes it: after the peer's FIN
            // ours is sent here (after what is queued), as the kernel transport drops its socket. Left in
            // CLOSE_WAIT, the connection and its endpoint would stay for as long as the peer answers.
            if tc.state() == State::CloseWait && !c.close_requested {
                c.close_requested = true;
                if c.pending.is_empty() {
                    tc.close();
                }
            }
        }
        if tc.state() == State::Closed {
            debug!(conn = conn.0, counters = ?tc.counters(), "own TCP connection closed (XDP)");
            self.table.remove(t);
            self.ids.remove(&t);
            self.conns.remove(&conn);
            sh.release_endpoint(t.local);
        }
    }
}

/// `now` on the own TCP's clock.
fn tcp_now(sh: &Shared, now: StdInstant) -> Instant {
    Instant::from_micros(now.duration_since(sh.start).as_micros() as u64)
}

/// Frame a segment (Ethernet + IPv4/IPv6 + TCP with its checksum) onto the TX ring.
fn transmit(sh: &mut Shared, ip_id: &mut u16, t: FourTuple, h: &TcpHeader, payload: &[u8]) {
    let Some(&(mac, _)) = sh.neigh.known.get(&t.remote.ip()) else {
        return; // no next hop known: the segment is lost, TCP retransmits
    };
    let mut tcp = [0u8; MAX_HEADER_LEN];
    let Ok(hl) = h.emit(&mut tcp) else { return };
    let seg_len = hl + payload.len();
    let ip_len = if t.local.is_ipv4() { 20 } else { 40 };
    let frame_len = 14 + ip_len + seg_len;
    *ip_id = ip_id.wrapping_add(1);
    let ip_id = *ip_id;
    let src_mac = sh.info.mac;
    sh.dev.tx_token().consume(frame_len, |f| {
        if f.len() < frame_len {
            return;
        }
        f[0..6].copy_from_slice(&mac);
        f[6..12].copy_from_slice(&src_mac);
        let (l4, src, dst) = match (t.local.ip(), t.remote.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
                let ip = &mut f[14..34];
                ip[0] = 0x45;
                ip[1] = 0;
                ip[2..4].copy_from_slice(&((20 + seg_len) as u16).to_be_bytes());
                ip[4..6].copy_from_slice(&ip_id.to_be_bytes());
                ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes()); // DF
                ip[8] = 64;
                ip[9] = 6;
                ip[10..12].copy_from_slice(&[0, 0]);
                ip[12..16].copy_from_slice(&s.octets());
                ip[16..20].copy_from_slice(&d.octets());
                let c = ipv4_header_checksum(ip);
                ip[10..12].copy_from_slice(&c.to_be_bytes());
                (34, addr_bytes(&IpAddr::V4(s)), addr_bytes(&IpAddr::V4(d)))
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                f[12..14].copy_from_slice(&0x86DDu16.to_be_bytes());
                let ip = &mut f[14..54];
                ip[0..4].copy_from_slice(&0x6000_0000u32.to_be_bytes());
                ip[4..6].copy_from_slice(&(seg_len as u16).to_be_bytes());
                ip[6] = 6;
                ip[7] = 64;
                ip[8..24].copy_from_slice(&s.octets());
                ip[24..40].copy_from_slice(&d.octets());
                (54, addr_bytes(&IpAddr::V6(s)), addr_bytes(&IpAddr::V6(d)))
            }
            _ => return,
        };
        f[l4..l4 + hl].copy_from_slice(&tcp[..hl]);
        f[l4 + hl..l4 + seg_len].copy_from_slice(payload);
        let c = checksum(&src.0[..src.1], &dst.0[..dst.1], &f[l4..l4 + seg_len]);
        f[l4 + 16..l4 + 18].copy_from_slice(&c.to_be_bytes());
    });
}

/// The congestion control the kernel's TCP uses in this namespace (`net.ipv4.tcp_congestion_control`), so
/// that both transports treat the same path alike: `bbr` there runs the own TCP's model-based controller,
/// anything else (cubic, reno) NewReno.
fn host_congestion_control() -> CongestionControl {
    match std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control") {
        Ok(name) if name.trim() == "bbr" => CongestionControl::Bbr,
        _ => CongestionControl::NewReno,
    }
}

/// How a connection ended, under the names of the kernel transport's "connection ended" line (`how`):
/// closed here ("local": the engine's Close), this host's TCP gave up ("timed_out": the user timeout or
/// unanswered keepalives), the peer's RST ("peer_reset") or its FIN ("peer_fin"); the most telling one
/// when a poll brings several.
fn ending(ev: Events, close_requested: bool) -> &'static str {
    if close_requested {
        "local"
    } else if ev.contains(Events::TIMED_OUT) {
        "timed_out"
    } else if ev.contains(Events::RESET) {
        "peer_reset"
    } else if ev.contains(Events::PEER_CLOSED) {
        "peer_fin"
    } else {
        "failed"
    }
}

/// Moves queued bytes into the connection's send ring; returns how many.
fn push_pending(c: &mut OwnConn, tc: &mut crate::tcp::Connection) -> usize {
    c.pending.drain_into(|bytes| tc.send(bytes).unwrap_or(0))
}

/// RFC 791 header checksum (the field zero while computing).
fn ipv4_header_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for c in header.chunks_exact(2) {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endings_are_named_as_the_kernel_transport_names_them() {
        assert_eq!(ending(Events::PEER_CLOSED, false), "peer_fin");
        assert_eq!(ending(Events::RESET, false), "peer_reset");
        assert_eq!(ending(Events::PEER_CLOSED | Events::RESET, false), "peer_reset");
        assert_eq!(ending(Events::TIMED_OUT | Events::CLOSED, false), "timed_out");
        assert_eq!(ending(Events::PEER_CLOSED, true), "local");
        assert_eq!(ending(Events::CLOSED, false), "failed");
    }

    #[test]
    fn ipv4_tcp_frames_are_recognised_and_fragments_are_not() {
        let mut f = vec![0u8; 14 + 20 + 20];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14] = 0x45;
        f[16..18].copy_from_slice(&40u16.to_be_bytes());
        f[23] = 6;
        f[26..30].copy_from_slice(&[10, 0, 0, 1]);
        f[30..34].copy_from_slice(&[10, 0, 0, 2]);
        f[34..36].copy_from_slice(&5000u16.to_be_bytes());
        f[36..38].copy_from_slice(&80u16.to_be_bytes());
        let (t, seg) = tcp_of_frame(&f).unwrap();
        assert_eq!(t.local, "10.0.0.2:80".parse().unwrap());
        assert_eq!(t.remote, "10.0.0.1:5000".parse().unwrap());
        assert_eq!(seg.len(), 20);
        f[20] = 0x20; // more fragments
        assert!(tcp_of_frame(&f).is_none());
        assert!(tcp_of_frame(&f[..30]).is_none());
    }

    #[test]
    fn ipv4_header_checksum_verifies_to_zero() {
        let mut h = [
            0x45, 0, 0, 40, 0, 1, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        let c = ipv4_header_checksum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        assert_eq!(ipv4_header_checksum(&h), 0);
    }
}
