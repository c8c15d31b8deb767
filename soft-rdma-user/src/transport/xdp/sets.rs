//! Many smoltcp socket sets instead of one. smoltcp finds a segment's socket by asking every socket of the
//! set in turn, and each `Interface::poll` visits every socket of the set: with thousands of connections in
//! one set, every segment and every round cost thousands of socket visits (measured with one set: setup
//! slowed from ~800 to ~300 connections/s between 1,000 and 10,000 connections, and at 16,384 connections
//! some were lost). Here each connection's socket has a set of its own and each listening endpoint one set
//! for its listening sockets (a pool); received frames are handed to their set by 4-tuple (a listening
//! endpoint's pool when no connection has the tuple, an empty default set otherwise, where smoltcp answers
//! with a reset as it would), and a round polls only the sets that have frames, were touched, or whose
//! smoltcp timer is due. The sets share one `Interface`, so the neighbour cache and addresses stay one.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};

use smoltcp::iface::{Interface, SocketHandle, SocketSet};
use smoltcp::phy::{self, DeviceCapabilities};
use smoltcp::socket::{Socket, tcp};
use smoltcp::time::Instant;

use super::xsk::{RxTok, TxTok, XdpDevice, is_connection_request};

/// Maps keyed by set ids, looked up for every segment and socket access: a fast hasher (the ids are ours;
/// maps keyed by peers' addresses keep std's SipHash).
type IdMap<K, V> = foldhash::HashMap<K, V>;

/// A socket set.
pub(super) type SetId = u64;

/// A socket: its set and its handle there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct Sock {
    pub set: SetId,
    pub h: SocketHandle,
}

/// The empty set: frames no socket owns (smoltcp resets them), and everything that is not TCP.
const DEFAULT: SetId = 0;

#[derive(Default)]
pub(super) struct Sets {
    sets: IdMap<SetId, SocketSet<'static>>,
    next: SetId,
    /// Connection sets by their socket's (local, remote) endpoints.
    tuples: HashMap<(SocketAddr, SocketAddr), SetId>,
    tuple_of: IdMap<SetId, (SocketAddr, SocketAddr)>,
    /// Pools by listening endpoint (a specific address), with how many connection requests (SYNs) each may
    /// still take before its listening sockets are replenished: a SYN that finds none is reset by smoltcp,
    /// so further SYNs wait for the next round.
    pools: HashMap<SocketAddr, SetId>,
    pool_budget: IdMap<SetId, usize>,
    /// Frames waiting for their set's next poll.
    queued: IdMap<SetId, VecDeque<Vec<u8>>>,
    /// Sets to poll in the next round.
    due: BTreeSet<SetId>,
    /// smoltcp's next timer of each set (retransmission, keepalive, delayed ACK, timeouts).
    timers: BTreeSet<(Instant, SetId)>,
    timer_of: IdMap<SetId, Instant>,
    /// Sets whose sockets asked for a neighbour's MAC: polled again as soon as it is known.
    waiting: HashMap<IpAddr, Vec<SetId>>,
    /// Pools polled since [`Sets::take_polled_pools`] last ran: only their listening sockets can have
    /// changed state (smoltcp changes states inside a poll).
    polled_pools: Vec<SetId>,
}

/// The TCP endpoints of a frame, from its receiver's point of view: (local, remote).
fn tcp_endpoints(frame: &[u8]) -> Option<(SocketAddr, SocketAddr)> {
    let (src, dst, l4): (IpAddr, IpAddr, usize) = match frame.get(12..14)? {
        [0x08, 0x00] => {
            if *frame.get(23)? != 6 {
                return None;
            }
            let ihl = ((frame.get(14)? & 0x0f) as usize) * 4;
            let s: [u8; 4] = frame.get(26..30)?.try_into().ok()?;
            let d: [u8; 4] = frame.get(30..34)?.try_into().ok()?;
            (s.into(), d.into(), 14 + ihl)
        }
        [0x86, 0xdd] => {
            if *frame.get(20)? != 6 {
                return None;
            }
            let s: [u8; 16] = frame.get(22..38)?.try_into().ok()?;
            let d: [u8; 16] = frame.get(38..54)?.try_into().ok()?;
            (s.into(), d.into(), 54)
        }
        _ => return None,
    };
    let ports = frame.get(l4..l4 + 4)?;
    let (sport, dport) = (
        u16::from_be_bytes([ports[0], ports[1]]),
        u16::from_be_bytes([ports[2], ports[3]]),
    );
    Some((SocketAddr::new(dst, dport), SocketAddr::new(src, sport)))
}

/// The device smoltcp sees while one set is polled: that set's frames in, the real device's TX out.
struct SetDevice<'a> {
    dev: &'a mut XdpDevice,
    frames: &'a mut VecDeque<Vec<u8>>,
    /// Connection requests this poll may still hand over (pools); `usize::MAX` elsewhere.
    syn_budget: usize,
    syns: usize,
}

impl phy::Device for SetDevice<'_> {
    type RxToken<'b>
        = RxTok
    where
        Self: 'b;
    type TxToken<'b>
        = TxTok<'b>
    where
        Self: 'b;

    fn receive(&mut self, _timestamp: Instant) -> Option<(RxTok, TxTok<'_>)> {
        if is_connection_request(self.frames.front()?) {
            if self.syns >= self.syn_budget {
                return None;
            }
            self.syns += 1;
        }
        let frame = self.frames.pop_front()?;
        Some((RxTok(frame), self.dev.tx_token()))
    }

    fn transmit(&mut self, timestamp: Instant) -> Option<TxTok<'_>> {
        phy::Device::transmit(self.dev, timestamp)
    }

    fn capabilities(&self) -> DeviceCapabilities {
        phy::Device::capabilities(self.dev)
    }
}

impl Sets {
    pub fn new() -> Sets {
        let mut s = Sets {
            next: DEFAULT + 1,
            ..Sets::default()
        };
        s.sets.insert(DEFAULT, SocketSet::new(vec![]));
        s
    }

    fn new_set(&mut self) -> SetId {
        let id = self.next;
        self.next += 1;
        self.sets.insert(id, SocketSet::new(vec![]));
        id
    }

    /// A connection's socket, in a set of its own, receiving what arrives for (local, remote).
    pub fn add_connection(
        &mut self,
        socket: tcp::Socket<'static>,
        local: SocketAddr,
        remote: SocketAddr,
    ) -> Sock {
        let set = self.new_set();
        let h = self.sets.get_mut(&set).expect("just made").add(socket);
        self.tuples.insert((local, remote), set);
        self.tuple_of.insert(set, (local, remote));
        self.due.insert(set);
        Sock { set, h }
    }

    /// A pool for listening sockets on `local` (a specific address).
    pub fn add_pool(&mut self, local: SocketAddr) -> SetId {
        let set = self.new_set();
        self.pools.insert(local, set);
        self.pool_budget.insert(set, 0);
        set
    }

    /// A listening socket in `pool`.
    pub fn add_listening(&mut self, pool: SetId, socket: tcp::Socket<'static>) -> Sock {
        let h = self.sets.get_mut(&pool).expect("live pool").add(socket);
        Sock { set: pool, h }
    }

    /// `pool` has `spare` listening sockets again: it may take that many connection requests.
    pub fn replenished(&mut self, pool: SetId, spare: usize) {
        self.pool_budget.insert(pool, spare);
        if self.queued.get(&pool).is_some_and(|q| !q.is_empty()) {
            self.due.insert(pool);
        }
    }

    /// Removes a pool (its sockets were removed or moved out first).
    pub fn remove_pool(&mut self, pool: SetId) {
        self.pools.retain(|_, s| *s != pool);
        self.drop_set(pool);
    }

    /// A socket of a pool that now has a connection moves to a set of its own.
    pub fn move_out(&mut self, s: Sock) -> Sock {
        let socket = self.sets.get_mut(&s.set).expect("live set").remove(s.h);
        let Socket::Tcp(tcp) = &socket;
        let ends = tcp
            .local_endpoint()
            .zip(tcp.remote_endpoint())
            .map(|(l, r)| (SocketAddr::from(l), SocketAddr::from(r)));
        let set = self.new_set();
        let h = self.sets.get_mut(&set).expect("just made").add(socket);
        if let Some(t) = ends {
            self.tuples.insert(t, set);
            self.tuple_of.insert(set, t);
        }
        self.due.insert(set);
        Sock { set, h }
    }

    /// Removes a socket; a connection's set goes with it.
    pub fn remove(&mut self, s: Sock) {
        if let Some(set) = self.sets.get_mut(&s.set) {
            set.remove(s.h);
        }
        if s.set != DEFAULT && !self.pool_budget.contains_key(&s.set) {
            self.drop_set(s.set);
        }
    }

    fn drop_set(&mut self, set: SetId) {
        self.sets.remove(&set);
        if let Some(t) = self.tuple_of.remove(&set)
            && self.tuples.get(&t) == Some(&set)
        {
            self.tuples.remove(&t);
        }
        self.pool_budget.remove(&set);
        self.queued.remove(&set);
        self.due.remove(&set);
        if let Some(at) = self.timer_of.remove(&set) {
            self.timers.remove(&(at, set));
        }
    }

    pub fn get(&self, s: Sock) -> &tcp::Socket<'static> {
        self.sets.get(&s.set).expect("live set").get::<tcp::Socket>(s.h)
    }

    /// The socket, to act on: its set is polled in the next round.
    pub fn get_mut(&mut self, s: Sock) -> &mut tcp::Socket<'static> {
        self.due.insert(s.set);
        self.sets
            .get_mut(&s.set)
            .expect("live set")
            .get_mut::<tcp::Socket>(s.h)
    }

    /// The socket, to set wakers or options that send nothing: its set is not polled for it.
    pub fn get_mut_unpolled(&mut self, s: Sock) -> &mut tcp::Socket<'static> {
        self.sets
            .get_mut(&s.set)
            .expect("live set")
            .get_mut::<tcp::Socket>(s.h)
    }

    /// The connection set that owns a frame's tuple, if any.
    fn tuples_owner(&self, frame: &[u8]) -> Option<SetId> {
        let (local, remote) = tcp_endpoints(frame)?;
        self.tuples.get(&(local, remote)).copied()
    }

    /// The set a received frame belongs to.
    fn demux(&self, frame: &[u8]) -> SetId {
        let Some((local, remote)) = tcp_endpoints(frame) else {
            return DEFAULT;
        };
        self.tuples
            .get(&(local, remote))
            .or_else(|| self.pools.get(&local))
            .copied()
            .unwrap_or(DEFAULT)
    }

    /// The neighbour `ip` is known now: the sets that asked for it send at once.
    pub fn neighbour_known(&mut self, ip: IpAddr) {
        if let Some(sets) = self.waiting.remove(&ip) {
            self.due
                .extend(sets.into_iter().filter(|s| self.sets.contains_key(s)));
        }
    }

    /// Polls every set now due (after handing out the device's received frames): the default set first,
    /// so that injected neighbour answers are in before the segments that need them.
    pub fn poll(&mut self, iface: &mut Interface, dev: &mut XdpDevice, now: Instant) {
        while let Some(frame) = dev.rx_frames.pop_front() {
            let set = self.demux(&frame);
            self.queued.entry(set).or_default().push_back(frame);
            self.due.insert(set);
        }
        while let Some(&(at, set)) = self.timers.first() {
            if at > now {
                break;
            }
            self.timers.pop_first();
            self.timer_of.remove(&set);
            self.due.insert(set);
        }
        let mut solicits = std::mem::take(&mut dev.solicits);
        let due = std::mem::take(&mut self.due);
        let order = due.contains(&DEFAULT).then_some(DEFAULT).into_iter();
        for set in order.chain(due.into_iter().filter(|s| *s != DEFAULT)) {
            self.poll_one(set, iface, dev, now, &mut solicits);
        }
        dev.solicits = solicits;
    }

    fn poll_one(
        &mut self,
        set: SetId,
        iface: &mut Interface,
        dev: &mut XdpDevice,
        now: Instant,
        solicits: &mut Vec<IpAddr>,
    ) {
        let mut frames = self.queued.remove(&set).unwrap_or_default();
        let budget = self.pool_budget.get(&set).copied();
        if budget.is_some() && !self.polled_pools.contains(&set) {
            self.polled_pools.push(set);
        }
        if budget.is_some() {
            frames = self.reroute_held(set, frames);
        }
        let Some(sockets) = self.sets.get_mut(&set) else {
            return;
        };
        let mut d = SetDevice {
            dev,
            frames: &mut frames,
            syn_budget: budget.unwrap_or(usize::MAX),
            syns: 0,
        };
        iface.poll(now, &mut d, sockets);
        let syns = d.syns;
        if let Some(b) = budget {
            self.pool_budget.insert(set, b - syns);
        }
        if !frames.is_empty() {
            // Connection requests past the pool's budget: after its next replenishment.
            self.queued.insert(set, frames);
        }
        for ip in std::mem::take(&mut dev.solicits) {
            self.waiting.entry(ip).or_default().push(set);
            if !solicits.contains(&ip) {
                solicits.push(ip);
            }
        }
        let at = iface.poll_at(now, sockets);
        if let Some(old) = self.timer_of.remove(&set) {
            self.timers.remove(&(old, set));
        }
        if let Some(at) = at {
            self.timers.insert((at, set));
            self.timer_of.insert(set, at);
        }
    }

    /// A pool's held-back frames (behind connection requests past its budget) may belong by now to a
    /// connection that left the pool: those go to the connection's set (smoltcp would answer them with a
    /// reset in the pool); the rest stay, in order.
    fn reroute_held(&mut self, pool: SetId, frames: VecDeque<Vec<u8>>) -> VecDeque<Vec<u8>> {
        let mut kept = VecDeque::with_capacity(frames.len());
        for f in frames {
            match self.tuples_owner(&f).filter(|s| *s != pool) {
                Some(owner) => {
                    self.queued.entry(owner).or_default().push_back(f);
                    self.due.insert(owner);
                }
                None => kept.push_back(f),
            }
        }
        kept
    }

    /// The pools polled since the last call (their listening sockets may have changed state).
    pub fn take_polled_pools(&mut self) -> Vec<SetId> {
        std::mem::take(&mut self.polled_pools)
    }

    /// Every set is polled in the next round (shutdown).
    pub fn all_due(&mut self) {
        self.due.extend(self.sets.keys().copied());
    }

    /// Something to poll right away: sets touched or with frames. (Connection requests held back wait for
    /// their pool's replenishment, which every round does and which makes the pool due.)
    pub fn busy(&self) -> bool {
        !self.due.is_empty()
    }

    /// The earliest smoltcp timer of any set.
    pub fn next_timer(&self) -> Option<Instant> {
        self.timers.first().map(|(at, _)| *at)
    }

    /// Sets alive (the default set included).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.sets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_v4(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 20];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[23] = 6;
        f[26..30].copy_from_slice(&src);
        f[30..34].copy_from_slice(&dst);
        f[34..36].copy_from_slice(&sport.to_be_bytes());
        f[36..38].copy_from_slice(&dport.to_be_bytes());
        f
    }

    fn socket() -> tcp::Socket<'static> {
        tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0; 64]),
            tcp::SocketBuffer::new(vec![0; 64]),
        )
    }

    #[test]
    fn endpoints_of_ipv4_and_ipv6_frames() {
        let f = frame_v4([10, 0, 0, 1], 50000, [10, 0, 0, 2], 7000);
        assert_eq!(
            tcp_endpoints(&f),
            Some((
                "10.0.0.2:7000".parse().unwrap(),
                "10.0.0.1:50000".parse().unwrap()
            ))
        );
        let mut udp = f.clone();
        udp[23] = 17;
        assert_eq!(tcp_endpoints(&udp), None);
        let mut v6 = vec![0u8; 14 + 40 + 20];
        v6[12..14].copy_from_slice(&[0x86, 0xdd]);
        v6[20] = 6;
        v6[37] = 1; // src ::1
        v6[53] = 2; // dst ::2
        v6[54..56].copy_from_slice(&40000u16.to_be_bytes());
        v6[56..58].copy_from_slice(&7000u16.to_be_bytes());
        assert_eq!(
            tcp_endpoints(&v6),
            Some(("[::2]:7000".parse().unwrap(), "[::1]:40000".parse().unwrap()))
        );
        for cut in 0..f.len() - 16 {
            assert_eq!(tcp_endpoints(&f[..cut]), None, "cut at {cut}");
        }
    }

    /// Frames go to the connection with their exact tuple, else to the pool of their local endpoint, else
    /// to the default set; removing a connection's socket removes its set and its tuple.
    #[test]
    fn demultiplexing_by_tuple_then_listening_endpoint() {
        let mut sets = Sets::new();
        let (b, a1, a2) = (
            "10.0.0.2:7000".parse().unwrap(),
            "10.0.0.1:50000".parse().unwrap(),
            "10.0.0.1:50001".parse().unwrap(),
        );
        let pool = sets.add_pool(b);
        let c1 = sets.add_connection(socket(), b, a1);
        assert_ne!(c1.set, pool);
        assert_eq!(
            sets.demux(&frame_v4([10, 0, 0, 1], 50000, [10, 0, 0, 2], 7000)),
            c1.set
        );
        assert_eq!(
            sets.demux(&frame_v4([10, 0, 0, 1], 50001, [10, 0, 0, 2], 7000)),
            pool
        );
        assert_eq!(
            sets.demux(&frame_v4([10, 0, 0, 1], 50001, [10, 0, 0, 2], 7001)),
            DEFAULT
        );
        assert_eq!(sets.demux(&[0u8; 42]), DEFAULT, "not IP");
        let c2 = sets.add_connection(socket(), b, a2);
        assert_eq!(
            sets.demux(&frame_v4([10, 0, 0, 1], 50001, [10, 0, 0, 2], 7000)),
            c2.set
        );
        assert_eq!(sets.len(), 4);
        sets.remove(c2);
        assert_eq!(
            sets.demux(&frame_v4([10, 0, 0, 1], 50001, [10, 0, 0, 2], 7000)),
            pool
        );
        assert_eq!(sets.len(), 3);
        let l = sets.add_listening(pool, socket());
        sets.remove(l);
        assert_eq!(sets.len(), 3, "a pool outlives its sockets");
        sets.remove_pool(pool);
        assert_eq!(
            sets.demux(&frame_v4([10, 0, 0, 1], 50001, [10, 0, 0, 2], 7000)),
            DEFAULT
        );
        assert_eq!(sets.len(), 2);
        assert_eq!(sets.get(c1).state(), tcp::State::Closed);
    }

    /// Listening sockets change state only inside a poll of their pool: the transport looks at a pool's
    /// sockets only after it was polled, once.
    #[test]
    fn polled_pools_are_reported_once() {
        use smoltcp::iface::Config;
        use smoltcp::wire::{EthernetAddress, HardwareAddress};
        let mut dev = XdpDevice::new(Vec::new(), 1500);
        let now = Instant::from_millis(0);
        let config = Config::new(HardwareAddress::Ethernet(EthernetAddress([2, 0, 0, 0, 0, 1])));
        let mut iface = Interface::new(config, &mut dev, now);
        let mut sets = Sets::new();
        let b: SocketAddr = "10.0.0.2:7000".parse().unwrap();
        let pool = sets.add_pool(b);
        let c = sets.add_connection(socket(), b, "10.0.0.1:50001".parse().unwrap());
        assert!(sets.take_polled_pools().is_empty(), "nothing polled yet");
        sets.due.extend([pool, c.set]);
        sets.poll(&mut iface, &mut dev, now);
        assert_eq!(sets.take_polled_pools(), [pool]);
        assert!(sets.take_polled_pools().is_empty(), "reported once");
        sets.due.insert(c.set);
        sets.poll(&mut iface, &mut dev, now);
        assert!(
            sets.take_polled_pools().is_empty(),
            "a connection's set is no pool"
        );
    }

    /// A pool holds frames back behind connection requests past its budget; by its next poll the connection
    /// one of them belongs to may have left the pool: that frame goes to the connection's set.
    #[test]
    fn held_frames_follow_their_connection_out_of_the_pool() {
        let mut sets = Sets::new();
        let b: SocketAddr = "10.0.0.2:7000".parse().unwrap();
        let pool = sets.add_pool(b);
        let mut syn = frame_v4([10, 0, 0, 1], 50002, [10, 0, 0, 2], 7000);
        syn[14 + 20 + 13] = 0x02;
        let data = frame_v4([10, 0, 0, 1], 50001, [10, 0, 0, 2], 7000);
        let held: VecDeque<Vec<u8>> = [syn.clone(), data.clone()].into();
        // Still nobody's: both stay.
        assert_eq!(sets.reroute_held(pool, held.clone()), held);
        let c = sets.add_connection(socket(), b, "10.0.0.1:50001".parse().unwrap());
        sets.due.clear();
        assert_eq!(sets.reroute_held(pool, held), VecDeque::from([syn]));
        assert_eq!(sets.queued.get(&c.set), Some(&VecDeque::from([data])));
        assert!(sets.due.contains(&c.set));
    }
}
