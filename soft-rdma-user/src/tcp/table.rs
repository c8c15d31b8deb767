//! The connections of one stack, for a single-threaded poll loop: demultiplexing by 4-tuple, listening
//! addresses, SYNs that open connections (RFC 9293 §3.10.7.2), resets for segments that match nothing
//! (§3.10.7.1), initial sequence numbers (RFC 6528 §3: a clock plus a keyed hash of the 4-tuple), the
//! daemon's [`TcpBudget`] (a bound on the number of connections, the buffer memory every connection
//! charges, and the connections it held down, told when memory is given back), one ordered set of timer
//! deadlines (so a round costs what happened in it, not the number of connections), and the list of
//! connections with output or events to collect.
//!
//! SYN cookies (RFC 4987 §3.6; the rule is `soft_rdma_common::syn_cookie`): when the driver turns them on,
//! the XDP program answers listeners' SYNs and the table opens the connection from the handshake's ACK,
//! which it checks against the cookie (the key and time counter are the driver's to give, as the ISN
//! secret). What the program must offer in its SYN-ACK, so that it says what this table's would, comes
//! from [`ConnectionTable::syn_ack_offer`].
//!
//! A SYN past the connection bound is answered with a reset, as one for no listener (RFC 9293
//! §3.10.7.1; §3.5.2: a reset goes to a segment no connection is for), rather than dropped. RFC 9293 leaves
//! the choice to the implementation; the answer is the useful one here: the peer's connect fails at once
//! as refused (its application can report it, or retry later) instead of retransmitting the SYN until its
//! own give-up time (RFC 9293 §3.8.3: R2 for a SYN is at least three minutes) or connect timeout, and a
//! flood of SYNs costs one reset each (no larger than the SYN) and no state. Silence would only help a
//! bound that frees up within the peer's SYN retransmissions, at the price of making every connect past
//! it slow.

use std::collections::hash_map::{Entry, HashMap};
use std::collections::{BTreeSet, HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::sync::Arc;

use soft_rdma_common::syn_cookie::{self, Flow, FlowAddrs, SynCookieKey};

use super::budget::{BufferPools, TcpBudget, TcpLimits};
use super::{Connection, Events, Instant, State, TcpConfig, TcpCounters, TcpHeader, reset_for_unknown};
use crate::error::{NdStatus, Result, err};

/// A connection's addresses, from this end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FourTuple {
    pub local: SocketAddr,
    pub remote: SocketAddr,
}

/// What [`ConnectionTable::on_segment`] did with a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Fed to an existing connection.
    Connection,
    /// A SYN for a listening address opened a connection (SYN-RECEIVED).
    Opened,
    /// Matched nothing: send this reset (RFC 9293 §3.10.7.1), or nothing for an RST.
    Unmatched(Option<TcpHeader>),
    /// A SYN for a listening address, refused because the table holds as many connections as the budget
    /// allows: this reset answers it.
    Refused(TcpHeader),
}

/// What this table's SYN-ACK offers: what the XDP program's must offer in its place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SynAckOffer {
    /// The MSS on IPv4 and on IPv6 (RFC 9293 §3.7.1: the MTU less each family's fixed headers).
    pub mss_ipv4: u16,
    pub mss_ipv6: u16,
    /// The window-scale shift offered when the SYN offers scaling (RFC 7323 §2.2), if scaling is on.
    pub window_scale: Option<u8>,
    /// SACK-permitted when the SYN carries it (RFC 2018 §2).
    pub sack: bool,
    /// The SYN-ACK's window (never scaled, RFC 7323 §2.2).
    pub window: u16,
}

/// SYN cookies as the driver set them: the key and the time counter now.
#[derive(Clone, Copy, Debug)]
struct Cookies {
    key: SynCookieKey,
    tick: u32,
    window: u16,
}

/// The addresses a cookie for `t` (from the listener's side) covers; `None` for mixed families.
fn cookie_flow(t: &FourTuple) -> Option<Flow> {
    let addrs = match (t.remote, t.local) {
        (SocketAddr::V4(r), SocketAddr::V4(l)) => FlowAddrs::V4 {
            client: u32::from(*r.ip()),
            server: u32::from(*l.ip()),
        },
        (SocketAddr::V6(r), SocketAddr::V6(l)) => FlowAddrs::v6(r.ip().octets(), l.ip().octets()),
        _ => return None,
    };
    Some(Flow {
        addrs,
        client_port: t.remote.port(),
        server_port: t.local.port(),
    })
}

/// All connections of one stack. See the module doc.
pub struct ConnectionTable {
    cfg: TcpConfig,
    /// The MSS advertised on IPv4 connections (`cfg.mss` is IPv6's): see [`Self::set_ipv4_mss`].
    ipv4_mss: u16,
    budget: Arc<TcpBudget>,
    pools: BufferPools,
    conns: HashMap<FourTuple, Connection>,
    /// Connections the budget held down (a window, a send), with the budget's release count when they
    /// were last told: a newer count tells them again ([`Connection::memory_freed`]).
    starved: HashSet<FourTuple>,
    releases_seen: u64,
    listening: HashMap<SocketAddr, u64>,
    /// Connections with something to transmit or report since the last collection.
    dirty: VecDeque<FourTuple>,
    dirty_set: std::collections::HashSet<FourTuple>,
    /// (deadline, connection) for every connection with a timer; `armed` is each one's entry.
    timers: BTreeSet<(Instant, FourTuple)>,
    armed: HashMap<FourTuple, Instant>,
    /// The RFC 6528 secret: SipHash keys, from the seed the driver passes in (the table reads no randomness).
    isn_key: (u64, u64),
    cookies: Option<Cookies>,
    /// Connections opened from a SYN cookie, and ACKs for a listener whose cookie did not check out.
    cookie_counts: (u64, u64),
    /// The counters of the connections removed so far (for daemon-wide totals).
    retired: TcpCounters,
}

impl ConnectionTable {
    /// The MSS to advertise on IPv4 connections: the MTU less the fixed IPv4 and TCP headers (RFC 9293
    /// §3.7.1; RFC 879), 20 bytes more than IPv6's (`TcpConfig::mss`, whose fixed header is 40 bytes).
    pub fn set_ipv4_mss(&mut self, mss: u16) {
        self.ipv4_mss = mss;
    }

    /// The configuration of a new connection on `t`.
    fn cfg_for(&self, t: &FourTuple) -> TcpConfig {
        if t.remote.is_ipv4() {
            TcpConfig {
                mss: self.ipv4_mss,
                ..self.cfg
            }
        } else {
            self.cfg
        }
    }

    /// `secret_seed` keys the initial-sequence-number hash (RFC 6528 §3): the driver draws it from the OS once.
    /// At most `max_connections` connections; their buffers bounded by their sizes only.
    pub fn new(cfg: TcpConfig, max_connections: usize, secret_seed: u64) -> Self {
        let budget = Arc::new(TcpBudget::new(TcpLimits::connections_only(max_connections)));
        Self::with_budget(cfg, budget, secret_seed)
    }

    /// As [`Self::new`], with the connections and buffer memory bounded by `budget` (the daemon's).
    pub fn with_budget(cfg: TcpConfig, budget: Arc<TcpBudget>, secret_seed: u64) -> Self {
        ConnectionTable {
            ipv4_mss: cfg.mss,
            cfg,
            releases_seen: budget.releases(),
            pools: budget.pools(),
            budget,
            starved: Default::default(),
            conns: HashMap::new(),
            listening: HashMap::new(),
            dirty: VecDeque::new(),
            dirty_set: Default::default(),
            timers: BTreeSet::new(),
            armed: HashMap::new(),
            // Two different keys from one seed (splitmix64's increment and finalizer constants).
            isn_key: (
                secret_seed,
                secret_seed
                    .wrapping_add(0x9E37_79B9_7F4A_7C15)
                    .wrapping_mul(0xBF58_476D_1CE4_E5B9),
            ),
            cookies: None,
            cookie_counts: (0, 0),
            retired: TcpCounters::default(),
        }
    }

    /// What a SYN-ACK of this table offers; `None` when SYN cookies cannot stand in for it (they travel
    /// in the timestamp option, RFC 7323 §3, which this configuration does not use).
    pub fn syn_ack_offer(&self) -> Option<SynAckOffer> {
        let cfg = self.cfg;
        if !cfg.timestamps {
            return None;
        }
        Some(SynAckOffer {
            mss_ipv4: self.ipv4_mss,
            mss_ipv6: cfg.mss,
            window_scale: cfg.window_scaling.then(|| Connection::window_scale_of(&cfg)),
            sack: cfg.sack,
            window: cfg.recv_buffer.min(0xffff) as u16,
        })
    }

    /// From now on, an ACK for a listening address that matches no connection opens one if it carries a
    /// valid cookie for `key` (the XDP program's), at most one counter step old; `tick` is the counter now.
    /// Needs [`Self::syn_ack_offer`].
    pub fn enable_syn_cookies(&mut self, key: SynCookieKey, tick: u32) {
        if let Some(offer) = self.syn_ack_offer() {
            self.cookies = Some(Cookies {
                key,
                tick,
                window: offer.window,
            });
        }
    }

    /// The cookie's time counter moved on (the driver wrote the same value to the XDP program first).
    pub fn set_syn_cookie_tick(&mut self, tick: u32) {
        if let Some(c) = self.cookies.as_mut() {
            c.tick = tick;
        }
    }

    /// (connections opened from a SYN cookie, ACKs for a listener whose cookie did not check out).
    pub fn syn_cookie_counts(&self) -> (u64, u64) {
        self.cookie_counts
    }

    /// The peer's SYN options if `h` is the ACK of a SYN-ACK the XDP program sent with a cookie.
    fn check_cookie(&mut self, t: &FourTuple, h: &TcpHeader) -> Option<syn_cookie::PeerSynOptions> {
        let cookies = self.cookies?;
        let (_, tsecr) = h.options.timestamp?;
        let flow = cookie_flow(t)?;
        let peer = syn_cookie::check(cookies.key, cookies.tick, flow, h.seq.0, h.ack.0, tsecr);
        if peer.is_none() {
            self.cookie_counts.1 += 1;
        }
        peer
    }

    /// Whether `h`, for a 4-tuple whose connection lingers, is the ACK that completes a new handshake a
    /// listener's SYN cookie answered: a listener on `t.local`, the ACK alone, and a valid cookie (not
    /// counted as refused when it is not: it is then the old connection's segment).
    fn is_cookie_ack(&self, t: &FourTuple, h: &TcpHeader) -> bool {
        let Some(cookies) = self.cookies else {
            return false;
        };
        if !self.listening.contains_key(&t.local) || !h.flags.ack() || h.flags.syn() || h.flags.rst() {
            return false;
        }
        let (Some((_, tsecr)), Some(flow)) = (h.options.timestamp, cookie_flow(t)) else {
            return false;
        };
        syn_cookie::check(cookies.key, cookies.tick, flow, h.seq.0, h.ack.0, tsecr).is_some()
    }

    pub fn len(&self) -> usize {
        self.conns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// The budget the connections are bounded by.
    pub fn budget(&self) -> &Arc<TcpBudget> {
        &self.budget
    }

    /// Holds a new connection under the budget.
    fn insert(&mut self, t: FourTuple, mut c: Connection) {
        c.set_budget(&self.pools);
        self.conns.insert(t, c);
        self.budget.set_connections(self.conns.len());
        self.mark(t);
    }

    fn full(&self) -> bool {
        self.conns.len() >= self.budget.limits().max_connections
    }

    /// RFC 6528 §3: ISN = M + F(4-tuple, secret), M a 4 µs clock, F a keyed hash (SipHash, keys drawn
    /// once per table). The timestamp offset comes from the same hash (RFC 7323 §5.4 randomizes it).
    fn isn_and_ts_offset(&self, t: &FourTuple, now: Instant) -> (u32, u32) {
        // SipHash-1-3 keyed with the secret: the keyed PRF RFC 6528 asks for. std's keyed SipHasher is
        // deprecated only in favour of `RandomState`, which cannot take a key from the caller.
        #[allow(deprecated)]
        let mut hasher = std::hash::SipHasher::new_with_keys(self.isn_key.0, self.isn_key.1);
        t.hash(&mut hasher);
        let h = hasher.finish();
        let m = (now.micros() / 4) as u32;
        (m.wrapping_add(h as u32), (h >> 32) as u32)
    }

    /// Accept connections on `local`; `token` comes back with each opened connection.
    pub fn listen(&mut self, local: SocketAddr, token: u64) -> Result<()> {
        match self.listening.entry(local) {
            Entry::Occupied(_) => err(
                NdStatus::AddressAlreadyExists,
                format!("already listening on {local}"),
            ),
            Entry::Vacant(v) => {
                v.insert(token);
                Ok(())
            }
        }
    }

    /// Stop accepting on `local` (connections already opened stay).
    pub fn unlisten(&mut self, local: SocketAddr) -> Option<u64> {
        self.listening.remove(&local)
    }

    /// The token of the listener a connection was opened by, if `local` still listens.
    pub fn listener_of(&self, local: SocketAddr) -> Option<u64> {
        self.listening.get(&local).copied()
    }

    /// Active open (RFC 9293 §3.10.1) of `t`.
    pub fn connect(&mut self, now: Instant, t: FourTuple) -> Result<()> {
        if self.conns.contains_key(&t) {
            return err(
                NdStatus::AddressAlreadyExists,
                format!("a TCP connection {t:?} exists"),
            );
        }
        if self.full() {
            self.budget.count_refused_connect();
            return err(
                NdStatus::InsufficientResources,
                format!(
                    "TCP connection table full ({} connections, max_tcp_connections)",
                    self.conns.len()
                ),
            );
        }
        let (isn, ts) = self.isn_and_ts_offset(&t, now);
        let c = Connection::connect(&self.cfg_for(&t), t.local.port(), t.remote.port(), isn, ts, now);
        self.insert(t, c);
        Ok(())
    }

    /// A segment arrived for `t` (the driver parsed it and verified its checksum).
    pub fn on_segment(&mut self, now: Instant, t: FourTuple, h: &TcpHeader, payload: &[u8]) -> Delivery {
        let lingering = match self.conns.get_mut(&t) {
            // A live connection, the common case: one lookup.
            Some(c) if !matches!(c.state(), State::TimeWait | State::Closed) => {
                c.on_segment(now, h, payload);
                self.mark(t);
                return Delivery::Connection;
            }
            Some(_) => true,
            None => false,
        };
        if lingering {
            // A new SYN for a 4-tuple whose connection is gone from the peer's view while ours lingers in
            // TIME-WAIT or CLOSED: the old one makes way (RFC 9293 §3.6.1 allows reuse from TIME-WAIT). With
            // SYN cookies the XDP program answered that SYN itself, so what reaches the table is the ACK
            // that echoes the cookie: it makes way for the new connection alike (Linux's TIME-WAIT takes a
            // new connection on its 4-tuple whichever way it came; left to the old one, the ACK and the
            // peer's data would be dropped as old duplicates and the peer would hang).
            let reusable = (h.flags.syn() && !h.flags.ack()) || self.is_cookie_ack(&t, h);
            if !reusable {
                if let Some(c) = self.conns.get_mut(&t) {
                    c.on_segment(now, h, payload);
                }
                self.mark(t);
                return Delivery::Connection;
            }
            self.remove(t);
        }
        if self.listening.contains_key(&t.local)
            && h.flags.ack()
            && !h.flags.syn()
            && !h.flags.rst()
            && let Some(peer) = self.check_cookie(&t, h)
        {
            if self.full() {
                self.budget.count_refused_syn();
                return Delivery::Refused(reset_for_unknown(h, payload.len()).unwrap_or_default());
            }
            let window = self.cookies.map_or(0, |c| c.window);
            if let Some(c) = Connection::accept_cookie(&self.cfg_for(&t), h, peer, window, now) {
                self.insert(t, c);
                if let Some(c) = self.conns.get_mut(&t) {
                    c.on_segment(now, h, payload);
                }
                self.cookie_counts.0 += 1;
                return Delivery::Opened;
            }
        }
        if self.listening.contains_key(&t.local) && h.flags.syn() && !h.flags.ack() && !h.flags.rst() {
            if self.full() {
                self.budget.count_refused_syn();
                if let Some(rst) = reset_for_unknown(h, payload.len()) {
                    return Delivery::Refused(rst);
                }
                return Delivery::Unmatched(None);
            }
            let (isn, ts) = self.isn_and_ts_offset(&t, now);
            if let Some(c) = Connection::accept(&self.cfg_for(&t), h, isn, ts, now) {
                self.insert(t, c);
                return Delivery::Opened;
            }
        }
        Delivery::Unmatched(reset_for_unknown(h, payload.len()))
    }

    pub fn get(&self, t: &FourTuple) -> Option<&Connection> {
        self.conns.get(t)
    }

    /// Every connection held.
    pub fn connections(&self) -> impl Iterator<Item = (&FourTuple, &Connection)> {
        self.conns.iter()
    }

    /// The connection, marked for collection (the caller may queue data, read, close).
    pub fn get_mut(&mut self, t: FourTuple) -> Option<&mut Connection> {
        if self.conns.contains_key(&t) {
            self.mark(t);
        }
        self.conns.get_mut(&t)
    }

    /// Forget a connection (after its CLOSED event, or to drop it outright).
    pub fn remove(&mut self, t: FourTuple) -> Option<Connection> {
        if let Some(at) = self.armed.remove(&t) {
            self.timers.remove(&(at, t));
        }
        self.starved.remove(&t);
        let c = self.conns.remove(&t);
        if let Some(c) = &c {
            self.retired.add(c.counters());
        }
        self.budget.set_connections(self.conns.len());
        c
    }

    /// Every connection's counters added up since the table was made, the removed ones' included.
    pub fn total_counters(&self) -> TcpCounters {
        let mut t = self.retired;
        for c in self.conns.values() {
            t.add(c.counters());
        }
        t
    }

    fn mark(&mut self, t: FourTuple) {
        if self.dirty_set.insert(t) {
            self.dirty.push_back(t);
        }
    }

    /// Move connections whose timers are due to the dirty list.
    fn expire(&mut self, now: Instant) {
        while let Some(&(at, t)) = self.timers.first() {
            if at > now {
                break;
            }
            self.timers.pop_first();
            self.armed.remove(&t);
            self.mark(t);
        }
    }

    /// Next piece of work: for each connection marked since the last call (touched, fed a segment, or
    /// with a timer due), its segments to transmit through `transmit` and its events. Returns `None` when
    /// no connection is left to visit.
    pub fn poll(
        &mut self,
        now: Instant,
        payload: &mut [u8],
        mut transmit: impl FnMut(FourTuple, &TcpHeader, &[u8]),
    ) -> Option<(FourTuple, Events)> {
        self.expire(now);
        self.wake_starved();
        while let Some(t) = self.dirty.pop_front() {
            self.dirty_set.remove(&t);
            let Some(c) = self.conns.get_mut(&t) else { continue };
            while let Some((h, n)) = c.poll_transmit(now, payload) {
                transmit(t, &h, &payload[..n]);
            }
            if c.memory_limited() {
                self.starved.insert(t);
            }
            let events = c.take_events();
            let next = c.poll_at();
            if let Some(at) = self.armed.remove(&t) {
                self.timers.remove(&(at, t));
            }
            if let Some(at) = next {
                self.timers.insert((at, t));
                self.armed.insert(t, at);
            }
            if !events.is_empty() {
                return Some((t, events));
            }
        }
        None
    }

    /// Memory was given back since the connections the budget held down were last told: tell them, and
    /// visit them.
    fn wake_starved(&mut self) {
        let releases = self.budget.releases();
        if releases == self.releases_seen {
            return;
        }
        self.releases_seen = releases;
        for t in std::mem::take(&mut self.starved) {
            if let Some(c) = self.conns.get_mut(&t) {
                c.memory_freed();
                self.mark(t);
            }
        }
    }

    /// The earliest timer of any connection (the poll loop sleeps until then at most).
    pub fn poll_at(&self) -> Option<Instant> {
        let memory_freed = !self.starved.is_empty() && self.budget.releases() != self.releases_seen;
        if !self.dirty.is_empty() || memory_freed {
            return Some(Instant::ZERO);
        }
        self.timers.first().map(|&(at, _)| at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn tuple(local: &str, remote: &str) -> FourTuple {
        FourTuple {
            local: addr(local),
            remote: addr(remote),
        }
    }

    fn flip(t: FourTuple) -> FourTuple {
        FourTuple {
            local: t.remote,
            remote: t.local,
        }
    }

    type Seen = Vec<(FourTuple, Events)>;

    /// Runs both tables until quiet; returns the events each saw.
    fn exchange(a: &mut ConnectionTable, b: &mut ConnectionTable, now: &mut Instant) -> (Seen, Seen) {
        let (mut ea, mut eb) = (Vec::new(), Vec::new());
        let mut buf = vec![0u8; 65536];
        for _ in 0..1000 {
            let mut to_b = Vec::new();
            let mut to_a = Vec::new();
            while let Some(e) = a.poll(*now, &mut buf, |t, h, p| to_b.push((flip(t), *h, p.to_vec()))) {
                ea.push(e);
            }
            while let Some(e) = b.poll(*now, &mut buf, |t, h, p| to_a.push((flip(t), *h, p.to_vec()))) {
                eb.push(e);
            }
            if to_a.is_empty() && to_b.is_empty() {
                break;
            }
            *now = *now + Duration::from_millis(1);
            for (t, h, p) in to_b {
                if let Delivery::Unmatched(Some(rst)) = b.on_segment(*now, t, &h, &p) {
                    to_a.push((flip(t), rst, Vec::new()));
                }
            }
            for (t, h, p) in to_a {
                a.on_segment(*now, t, &h, &p);
            }
        }
        (ea, eb)
    }

    #[test]
    fn connect_listen_accept_transfer_close() {
        let cfg = TcpConfig {
            time_wait: Duration::from_millis(100),
            ..TcpConfig::default()
        };
        let mut a = ConnectionTable::new(cfg, 16, 7);
        let mut b = ConnectionTable::new(cfg, 16, 7);
        let mut now = Instant::from_millis(1);
        b.listen(addr("10.0.0.2:4791"), 7).unwrap();
        assert!(b.listen(addr("10.0.0.2:4791"), 8).is_err());
        let t = tuple("10.0.0.1:50000", "10.0.0.2:4791");
        a.connect(now, t).unwrap();
        assert_eq!(
            a.connect(now, t).unwrap_err().status,
            NdStatus::AddressAlreadyExists
        );
        let (ea, eb) = exchange(&mut a, &mut b, &mut now);
        assert!(ea.iter().any(|(x, e)| *x == t && e.contains(Events::CONNECTED)));
        assert!(
            eb.iter()
                .any(|(x, e)| *x == flip(t) && e.contains(Events::CONNECTED))
        );
        assert_eq!(b.listener_of(flip(t).local), Some(7));
        a.get_mut(t).unwrap().send(b"hello").unwrap();
        exchange(&mut a, &mut b, &mut now);
        let mut out = [0u8; 16];
        assert_eq!(b.get_mut(flip(t)).unwrap().recv(&mut out), 5);
        a.get_mut(t).unwrap().close();
        exchange(&mut a, &mut b, &mut now);
        b.get_mut(flip(t)).unwrap().close();
        let (_, eb) = exchange(&mut a, &mut b, &mut now);
        assert!(eb.iter().any(|(_, e)| e.contains(Events::CLOSED)));
        // TIME-WAIT ends by the table's timer set.
        assert_eq!(a.get(&t).unwrap().state(), State::TimeWait);
        now = a.poll_at().unwrap();
        let (ea, _) = exchange(&mut a, &mut b, &mut now);
        assert!(ea.iter().any(|(_, e)| e.contains(Events::CLOSED)));
        assert_eq!(a.get(&t).unwrap().state(), State::Closed);
        a.remove(t);
        assert!(a.is_empty() && a.poll_at().is_none());
    }

    const COOKIE_KEY: SynCookieKey = SynCookieKey { k0: 11, k1: 12 };

    /// The SYN-ACK the XDP program sends for `syn` (soft-rdma-ebpf's `syn_ack`, at the header level).
    fn cookie_syn_ack(offer: SynAckOffer, tick: u32, t: FourTuple, syn: &TcpHeader) -> TcpHeader {
        let peer = syn_cookie::PeerSynOptions {
            mss: syn.options.mss.unwrap_or(536),
            window_scale: syn.options.window_scale,
            sack_permitted: syn.options.sack_permitted,
        };
        let flow = cookie_flow(&flip(t)).unwrap();
        let (isn, tsval) = syn_cookie::generate(COOKIE_KEY, tick, flow, syn.seq.0, peer);
        let mss = if t.local.is_ipv4() {
            offer.mss_ipv4
        } else {
            offer.mss_ipv6
        };
        let mut options = super::super::TcpOptions {
            mss: Some(mss),
            sack_permitted: offer.sack && peer.sack_permitted,
            timestamp: Some((tsval, syn.options.timestamp.unwrap().0)),
            ..Default::default()
        };
        if peer.window_scale.is_some() {
            options.window_scale = offer.window_scale;
        }
        TcpHeader {
            src_port: syn.dst_port,
            dst_port: syn.src_port,
            seq: crate::tcp::Seq(isn),
            ack: syn.seq + 1,
            flags: super::super::TcpFlags(super::super::TcpFlags::SYN | super::super::TcpFlags::ACK),
            window: offer.window,
            options,
            ..Default::default()
        }
    }

    /// A table listening on 10.0.0.2:4791 (token 9) with cookies on, at counter `tick`.
    fn cookie_listener(max_connections: usize, tick: u32) -> ConnectionTable {
        let mut b = ConnectionTable::new(TcpConfig::default(), max_connections, 2);
        b.listen(addr("10.0.0.2:4791"), 9).unwrap();
        b.enable_syn_cookies(COOKIE_KEY, tick);
        b
    }

    /// The client's SYN for `t`, answered by a cookie SYN-ACK; returns the client's segments after it.
    fn cookie_handshake(
        a: &mut ConnectionTable,
        b: &ConnectionTable,
        t: FourTuple,
        now: Instant,
        tick: u32,
    ) -> Vec<(TcpHeader, Vec<u8>)> {
        let mut buf = vec![0u8; 65536];
        a.connect(now, t).unwrap();
        let mut syn = None;
        while a.poll(now, &mut buf, |_, h, _| syn = Some(*h)).is_some() {}
        let syn_ack = cookie_syn_ack(b.syn_ack_offer().unwrap(), tick, t, &syn.unwrap());
        assert_eq!(a.on_segment(now, t, &syn_ack, &[]), Delivery::Connection);
        let mut out = Vec::new();
        while a
            .poll(now, &mut buf, |_, h, p| out.push((*h, p.to_vec())))
            .is_some()
        {}
        out
    }

    /// RFC 4987 §3.6: the listener keeps nothing for the SYN; the ACK that echoes the cookie opens an
    /// ESTABLISHED connection with the options of the SYN, and data flows both ways.
    #[test]
    fn a_syn_cookie_ack_opens_a_connection_with_the_syns_options() {
        let mut a = ConnectionTable::new(TcpConfig::default(), 16, 1);
        let mut b = cookie_listener(16, 40);
        let t = tuple("10.0.0.1:50000", "10.0.0.2:4791");
        let mut now = Instant::from_millis(5);
        let acks = cookie_handshake(&mut a, &b, t, now, 40);
        assert_eq!(a.get(&t).unwrap().state(), State::Established);
        b.set_syn_cookie_tick(41);
        let (h, p) = &acks[0];
        assert_eq!(b.on_segment(now, flip(t), h, p), Delivery::Opened);
        assert_eq!(b.syn_cookie_counts(), (1, 0));
        assert_eq!(b.listener_of(flip(t).local), Some(9));
        let conn = b.get(&flip(t)).unwrap();
        assert_eq!(conn.state(), State::Established);
        assert_eq!(conn.negotiated(), a.get(&t).unwrap().negotiated());
        a.get_mut(t).unwrap().send(&[7u8; 5000]).unwrap();
        b.get_mut(flip(t)).unwrap().send(b"back").unwrap();
        let (_, eb) = exchange(&mut a, &mut b, &mut now);
        assert!(eb.iter().any(|(_, e)| e.contains(Events::CONNECTED)));
        let mut out = vec![0u8; 8192];
        assert_eq!(b.get_mut(flip(t)).unwrap().recv(&mut out), 5000);
        assert_eq!(a.get_mut(t).unwrap().recv(&mut out), 4);
        assert_eq!(a.get(&t).unwrap().counters().retransmitted_segments, 0);
        assert_eq!(b.get(&flip(t)).unwrap().counters().retransmitted_segments, 0);
    }

    #[test]
    fn an_ipv6_syn_cookie_opens_a_connection_with_the_ipv6_mss() {
        let cfg = TcpConfig {
            mss: 1440,
            ..TcpConfig::default()
        };
        let mut a = ConnectionTable::new(cfg, 16, 1);
        let mut b = ConnectionTable::new(cfg, 16, 2);
        b.set_ipv4_mss(1460);
        b.listen(addr("[fd00::2]:4791"), 9).unwrap();
        b.enable_syn_cookies(COOKIE_KEY, 7);
        let t = tuple("[fd00::1]:50000", "[fd00::2]:4791");
        let now = Instant::from_millis(5);
        let acks = cookie_handshake(&mut a, &b, t, now, 7);
        assert_eq!(
            a.get(&t).unwrap().send_mss(),
            1440 - 12,
            "the IPv6 MSS, less the timestamps"
        );
        assert_eq!(
            b.on_segment(now, flip(t), &acks[0].0, &acks[0].1),
            Delivery::Opened
        );
        assert_eq!(b.get(&flip(t)).unwrap().state(), State::Established);
        // The same ACK from the address's IPv4 twin is not its cookie.
        let v4 = tuple("10.0.0.1:50000", "10.0.0.2:4791");
        b.listen(addr("10.0.0.2:4791"), 9).unwrap();
        assert!(matches!(
            b.on_segment(now, flip(v4), &acks[0].0, &[]),
            Delivery::Unmatched(Some(_))
        ));
    }

    #[test]
    fn a_stale_or_forged_cookie_is_reset_and_opens_nothing() {
        let mut b = cookie_listener(16, 3);
        let now = Instant::from_millis(5);
        // Two counter steps old.
        let mut a = ConnectionTable::new(TcpConfig::default(), 16, 1);
        let t = tuple("10.0.0.1:50000", "10.0.0.2:4791");
        let acks = cookie_handshake(&mut a, &b, t, now, 1);
        let (h, p) = &acks[0];
        assert!(
            matches!(b.on_segment(now, flip(t), h, p), Delivery::Unmatched(Some(rst)) if rst.seq == h.ack)
        );
        // An acknowledgment number the cookie did not make.
        let t2 = tuple("10.0.0.1:50001", "10.0.0.2:4791");
        let acks = cookie_handshake(&mut a, &b, t2, now, 3);
        let mut forged = acks[0].0;
        forged.ack = forged.ack + 64;
        assert!(matches!(
            b.on_segment(now, flip(t2), &forged, &[]),
            Delivery::Unmatched(Some(_))
        ));
        assert!(b.is_empty());
        assert_eq!(b.syn_cookie_counts(), (0, 2));
        // Without cookies on, the valid ACK is just a segment for no connection.
        let mut off = ConnectionTable::new(TcpConfig::default(), 16, 2);
        off.listen(addr("10.0.0.2:4791"), 9).unwrap();
        let (h, p) = &acks[0];
        assert!(matches!(
            off.on_segment(now, flip(t2), h, p),
            Delivery::Unmatched(Some(_))
        ));
    }

    /// The listener closed first and lingers in TIME-WAIT; the peer connects again from the same port. With
    /// cookies the XDP program answers that SYN, so the table sees only the cookie's ACK: it opens the new
    /// connection in place of the old one (as a SYN would), while any other segment still reaches the old.
    #[test]
    fn a_cookie_ack_takes_the_4_tuple_of_a_connection_in_time_wait() {
        let mut a = ConnectionTable::new(TcpConfig::default(), 16, 1);
        let mut b = cookie_listener(16, 40);
        let t = tuple("10.0.0.1:50000", "10.0.0.2:4791");
        let mut now = Instant::from_millis(5);
        let acks = cookie_handshake(&mut a, &b, t, now, 40);
        assert_eq!(
            b.on_segment(now, flip(t), &acks[0].0, &acks[0].1),
            Delivery::Opened
        );
        exchange(&mut a, &mut b, &mut now);
        b.get_mut(flip(t)).unwrap().close();
        exchange(&mut a, &mut b, &mut now);
        a.get_mut(t).unwrap().close();
        exchange(&mut a, &mut b, &mut now);
        assert_eq!(
            (a.get(&t).unwrap().state(), b.get(&flip(t)).unwrap().state()),
            (State::Closed, State::TimeWait)
        );
        a.remove(t);

        now = now + Duration::from_millis(100);
        let acks = cookie_handshake(&mut a, &b, t, now, 40);
        // Not the cookie's ACK (another acknowledgment number): the old connection's segment, not a refusal.
        let mut stray = acks[0].0;
        stray.ack = stray.ack + 64;
        assert_eq!(b.on_segment(now, flip(t), &stray, &[]), Delivery::Connection);
        assert_eq!(b.get(&flip(t)).unwrap().state(), State::TimeWait);
        assert_eq!(b.syn_cookie_counts(), (1, 0));
        // The cookie's ACK, with data behind it: the new connection, which gets the data.
        let (h, _) = &acks[0];
        assert_eq!(b.on_segment(now, flip(t), h, b"again"), Delivery::Opened);
        assert_eq!(b.syn_cookie_counts(), (2, 0));
        assert_eq!((b.len(), b.budget().connections()), (1, 1));
        let mut out = [0u8; 16];
        let conn = b.get_mut(flip(t)).unwrap();
        assert_eq!(conn.state(), State::Established);
        let n = conn.recv(&mut out);
        assert_eq!(&out[..n], b"again");
    }

    #[test]
    fn a_cookie_ack_past_the_connection_bound_is_refused() {
        let mut b = cookie_listener(1, 0);
        let now = Instant::from_millis(5);
        let mut a = ConnectionTable::new(TcpConfig::default(), 16, 1);
        for (port, want_open) in [(50000, true), (50001, false)] {
            let t = tuple(&format!("10.0.0.1:{port}"), "10.0.0.2:4791");
            let acks = cookie_handshake(&mut a, &b, t, now, 0);
            let got = b.on_segment(now, flip(t), &acks[0].0, &acks[0].1);
            assert_eq!(got == Delivery::Opened, want_open, "{got:?}");
            if !want_open {
                assert!(matches!(got, Delivery::Refused(rst) if rst.flags.rst()));
            }
        }
        assert_eq!(b.len(), 1);
        assert_eq!(b.budget().refused_syns(), 1);
    }

    #[test]
    fn no_timestamps_no_cookies() {
        let cfg = TcpConfig {
            timestamps: false,
            ..TcpConfig::default()
        };
        let mut b = ConnectionTable::new(cfg, 16, 2);
        assert_eq!(b.syn_ack_offer(), None);
        b.enable_syn_cookies(COOKIE_KEY, 0);
        assert!(b.cookies.is_none());
    }

    /// RFC 9293 §3.7.1: the MSS advertised is the MTU less the fixed headers, 20 bytes more on IPv4.
    #[test]
    fn ipv4_connections_advertise_their_own_mss() {
        let cfg = TcpConfig {
            mss: 1440,
            ..TcpConfig::default()
        };
        let mut a = ConnectionTable::new(cfg, 16, 7);
        a.set_ipv4_mss(1460);
        let now = Instant::from_millis(1);
        let v4 = tuple("10.0.0.1:50000", "10.0.0.2:4791");
        let v6 = tuple("[fd00::1]:50000", "[fd00::2]:4791");
        a.connect(now, v4).unwrap();
        a.connect(now, v6).unwrap();
        let mut buf = vec![0u8; 65536];
        let mut syns = Vec::new();
        while a
            .poll(now, &mut buf, |t, h, _| syns.push((t, h.options.mss)))
            .is_some()
        {}
        syns.sort_by_key(|(t, _)| t.remote.is_ipv4());
        assert_eq!(syns, vec![(v6, Some(1440)), (v4, Some(1460))]);
    }

    #[test]
    fn unmatched_segments_are_reset_and_a_full_table_refuses() {
        let cfg = TcpConfig::default();
        let mut b = ConnectionTable::new(cfg, 1, 7);
        let now = Instant::from_millis(1);
        let syn = TcpHeader {
            src_port: 50000,
            dst_port: 4791,
            flags: super::super::TcpFlags(super::super::TcpFlags::SYN),
            ..Default::default()
        };
        // No listener: RST|ACK.
        let t = tuple("10.0.0.2:4791", "10.0.0.1:50000");
        assert!(matches!(
            b.on_segment(now, t, &syn, &[]),
            Delivery::Unmatched(Some(_))
        ));
        b.listen(addr("10.0.0.2:4791"), 1).unwrap();
        assert_eq!(b.on_segment(now, t, &syn, &[]), Delivery::Opened);
        let t2 = tuple("10.0.0.2:4791", "10.0.0.1:50001");
        assert!(matches!(b.on_segment(now, t2, &syn, &[]), Delivery::Refused(_)));
        assert_eq!(b.len(), 1);
        let mut a = ConnectionTable::new(cfg, 0, 7);
        assert_eq!(
            a.connect(now, t2).unwrap_err().status,
            NdStatus::InsufficientResources
        );
    }

    #[test]
    fn isns_differ_per_tuple_and_advance_with_the_clock() {
        let t = ConnectionTable::new(TcpConfig::default(), 1, 7);
        let x = tuple("10.0.0.1:1", "10.0.0.2:2");
        let y = tuple("10.0.0.1:1", "10.0.0.2:3");
        let now = Instant::from_millis(5);
        assert_ne!(t.isn_and_ts_offset(&x, now).0, t.isn_and_ts_offset(&y, now).0);
        let later = Instant::from_micros(now.micros() + 400);
        assert_eq!(
            t.isn_and_ts_offset(&x, later)
                .0
                .wrapping_sub(t.isn_and_ts_offset(&x, now).0),
            100
        );
    }
}
