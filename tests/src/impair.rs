//! A userspace `tc netem` substitute: an impairing Ethernet bridge between the two test namespaces.
//!
//! This kernel has no `sch_netem`, so [`TestNet::new_impaired`](crate::TestNet::new_impaired) builds
//! A ⇄ M ⇄ B instead of A ⇄ B: a third namespace M joined to A and to B by one veth pair each, and a
//! forwarder thread in M that moves *every* Ethernet frame (ARP, NDP, IPv4, IPv6, whatever) between M's two
//! veths through AF_PACKET sockets, impairing each direction on the way. A and B keep TestNet's addresses
//! (one subnet: it is a bridge, not a router) and device names, so daemons (kernel or XDP transport) run on
//! A's and B's veths exactly as on a plain TestNet.
//!
//! Per direction, independently, each frame is (a) lost with probability `loss`; otherwise (b) delayed by
//! `delay` ± a uniform `jitter` (frames closer together than the jitter reorder by themselves, as with
//! netem); and (c) with probability `reorder`, held back until the next frame of that direction has been
//! scheduled, and sent right after it (so it is reordered even without jitter; a held frame goes anyway
//! after `max(delay, 1 ms)` more if nothing follows). Decisions come from a xorshift64* generator seeded
//! from `seed` and the direction: the same frames in the same order get the same fates.
//!
//! [`Scheduler`] is the sans-IO core (frames and times in, frames out when due, from a binary heap);
//! [`Forwarder`] is the thread doing the I/O with it. Offloads are off on all four veths (no partial
//! checksums, no GSO/GRO super-frames: every frame the forwarder sees fits the common MTU). Counters per
//! direction ([`DirStats`]) let a test check that the impairment happened.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// What happens to frames on the link, per direction (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Impairment {
    /// Probability that a frame is lost (0..=1).
    pub loss: f64,
    /// Base one-way delay.
    pub delay: Duration,
    /// Each frame's delay is `delay` ± a uniform value up to this (never below zero).
    pub jitter: Duration,
    /// Probability that a frame is held back behind the next one (0..=1).
    pub reorder: f64,
    /// Seeds the decisions.
    pub seed: u64,
}

impl Impairment {
    /// Nothing: every frame forwarded at once, in order.
    pub const NONE: Impairment = Impairment {
        loss: 0.0,
        delay: Duration::ZERO,
        jitter: Duration::ZERO,
        reorder: 0.0,
        seed: 0,
    };

    /// Issue 7's `tc netem loss 5% delay 10ms 5ms reorder 10%`.
    pub fn netem_issue7(seed: u64) -> Impairment {
        Impairment {
            loss: 0.05,
            delay: Duration::from_millis(10),
            jitter: Duration::from_millis(5),
            reorder: 0.10,
            seed,
        }
    }
}

/// A direction across the middle namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    AtoB,
    BtoA,
}

/// Counters of one direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirStats {
    /// Frames read from the ingress veth.
    pub received: u64,
    /// Frames that left (or were handed to the egress veth, see `send_errors`).
    pub forwarded: u64,
    /// Frames lost on purpose (`loss`).
    pub dropped: u64,
    /// Frames held back behind the next one (`reorder`).
    pub held: u64,
    /// Frames that left after a frame that arrived later than them (jitter or `reorder`).
    pub reordered: u64,
    /// Frames refused because the queue was full (not expected in tests).
    pub overflow: u64,
    /// Frames the egress socket refused (counted in `forwarded` too).
    pub send_errors: u64,
    /// Frames the kernel dropped before the forwarder read them (socket buffer full; unintended loss).
    pub socket_drops: u64,
    /// Bytes forwarded.
    pub bytes: u64,
}

/// Counters of both directions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub a_to_b: DirStats,
    pub b_to_a: DirStats,
}

impl Stats {
    pub fn dir(&self, d: Dir) -> &DirStats {
        match d {
            Dir::AtoB => &self.a_to_b,
            Dir::BtoA => &self.b_to_a,
        }
    }
}

/// xorshift64*, seeded through splitmix64 (a small, deterministic, good-enough generator).
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Rng(if z == 0 { 1 } else { z })
    }

    fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Frames queued per direction at most (beyond: `overflow`).
pub const MAX_QUEUED: usize = 1 << 16;

fn probability(p: f64) -> f64 {
    if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) }
}

/// A frame waiting in the heap, ordered by (due, scheduling order) only.
struct Queued {
    due: Instant,
    order: u64,
    /// Arrival number (for the `reordered` count).
    seq: u64,
    frame: Vec<u8>,
}

impl PartialEq for Queued {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.order) == (other.due, other.order)
    }
}

impl Eq for Queued {}

impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Queued {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.due, self.order).cmp(&(other.due, other.order))
    }
}

struct Held {
    due: Instant,
    seq: u64,
    frame: Vec<u8>,
}

/// One direction's impairment, sans I/O: [`offer`](Self::offer) frames as they arrive, then
/// [`pop_due`](Self::pop_due) what is due; [`next_due`](Self::next_due) says when to look again.
pub struct Scheduler {
    loss: f64,
    delay_ns: f64,
    jitter_ns: f64,
    reorder: f64,
    hold_limit: Duration,
    rng: Rng,
    /// Frames by due time: a min-heap.
    heap: BinaryHeap<Reverse<Queued>>,
    held: Option<Held>,
    next_seq: u64,
    next_order: u64,
    max_departed: Option<u64>,
    stats: DirStats,
}

impl Scheduler {
    /// `stream` tells directions apart: the same `imp.seed` gives each stream its own decisions.
    pub fn new(imp: &Impairment, stream: u64) -> Scheduler {
        Scheduler {
            loss: probability(imp.loss),
            delay_ns: imp.delay.as_nanos() as f64,
            jitter_ns: imp.jitter.as_nanos() as f64,
            reorder: probability(imp.reorder),
            hold_limit: imp.delay.max(Duration::from_millis(1)),
            rng: Rng::new(imp.seed ^ stream.wrapping_mul(0xD6E8_FEB8_6659_FD93)),
            heap: BinaryHeap::new(),
            held: None,
            next_seq: 0,
            next_order: 0,
            max_departed: None,
            stats: DirStats::default(),
        }
    }

    pub fn stats(&self) -> DirStats {
        self.stats
    }

    /// Frames waiting (including a held one).
    pub fn queued(&self) -> usize {
        self.heap.len() + usize::from(self.held.is_some())
    }

    fn push(&mut self, due: Instant, seq: u64, frame: Vec<u8>) {
        let order = self.next_order;
        self.next_order += 1;
        self.heap.push(Reverse(Queued {
            due,
            order,
            seq,
            frame,
        }));
    }

    /// A frame arrived at `now`.
    pub fn offer(&mut self, frame: Vec<u8>, now: Instant) {
        self.stats.received += 1;
        // Three draws per frame whatever happens to it: a frame's fate depends only on its position.
        let (lose, spread, hold) = (self.rng.unit(), self.rng.unit(), self.rng.unit());
        if lose < self.loss {
            self.stats.dropped += 1;
            return;
        }
        if self.queued() >= MAX_QUEUED {
            self.stats.overflow += 1;
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let ns = (self.delay_ns + self.jitter_ns * (2.0 * spread - 1.0)).max(0.0);
        let due = now + Duration::from_nanos(ns as u64);
        if let Some(h) = self.held.take() {
            // The held frame goes right behind this one.
            let after = h.due.max(due);
            self.push(due, seq, frame);
            self.push(after, h.seq, h.frame);
        } else if hold < self.reorder {
            self.stats.held += 1;
            self.held = Some(Held { due, seq, frame });
        } else {
            self.push(due, seq, frame);
        }
    }

    /// When the next frame is due (a held frame's own deadline included); None if nothing waits.
    pub fn next_due(&self) -> Option<Instant> {
        let heap = self.heap.peek().map(|Reverse(q)| q.due);
        let held = self.held.as_ref().map(|h| h.due + self.hold_limit);
        match (heap, held) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The next frame due at `now`, if any.
    pub fn pop_due(&mut self, now: Instant) -> Option<Vec<u8>> {
        if let Some(h) = &self.held
            && h.due + self.hold_limit <= now
        {
            // Nothing followed it in time: it goes anyway.
            let h = self.held.take().expect("checked");
            self.push(h.due + self.hold_limit, h.seq, h.frame);
        }
        if self.heap.peek()?.0.due > now {
            return None;
        }
        let Reverse(q) = self.heap.pop().expect("peeked");
        match self.max_departed {
            Some(m) if q.seq < m => self.stats.reordered += 1,
            _ => self.max_departed = Some(q.seq),
        }
        self.stats.forwarded += 1;
        self.stats.bytes += q.frame.len() as u64;
        Some(q.frame)
    }
}

// -------------------------------------------------------------------------------------------------------
// The I/O: AF_PACKET sockets in the middle namespace.

const ETH_P_ALL: u16 = 0x0003;
/// Larger than any frame a veth can carry with offloads off (and than a 64 KiB GSO frame if one slipped
/// through: it is then refused by the egress socket and counted in `send_errors`).
const RX_BUF: usize = 65_536 + 64;

fn last_error(what: &str) -> anyhow::Error {
    anyhow::Error::new(std::io::Error::last_os_error()).context(what.to_owned())
}

/// A raw packet socket bound to one interface, receiving every frame that interface receives (not those
/// it sends).
struct PacketSocket {
    fd: OwnedFd,
}

impl PacketSocket {
    fn open(dev: &str) -> Result<PacketSocket> {
        let name = CString::new(dev).context("interface name")?;
        // SAFETY: plain C call with a valid string.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if ifindex == 0 {
            bail!("no interface {dev} in the middle namespace");
        }
        // SAFETY: socket(2); the descriptor is owned right away.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                (ETH_P_ALL.to_be()) as libc::c_int,
            )
        };
        if raw < 0 {
            return Err(last_error("AF_PACKET socket"));
        }
        // SAFETY: fresh descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let s = PacketSocket { fd };
        s.setsockopt(libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, 1)
            .context("PACKET_IGNORE_OUTGOING")?;
        // Room for a burst: the forwarder reads continuously, but the test shares two cores.
        let _ = s.setsockopt(libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 16 << 20);
        let _ = s.setsockopt(libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, 16 << 20);
        // SAFETY: zeroed sockaddr_ll is valid; fields set below.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = ETH_P_ALL.to_be();
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: valid sockaddr_ll of the given size.
        let r = unsafe {
            libc::bind(
                s.fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(last_error("binding the AF_PACKET socket"));
        }
        // Frames for A's and B's MACs are not M's: receive them all.
        // SAFETY: zeroed packet_mreq is valid.
        let mut mreq: libc::packet_mreq = unsafe { std::mem::zeroed() };
        mreq.mr_ifindex = ifindex as i32;
        mreq.mr_type = libc::PACKET_MR_PROMISC as u16;
        // SAFETY: valid packet_mreq.
        let r = unsafe {
            libc::setsockopt(
                s.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_ADD_MEMBERSHIP,
                (&mreq as *const libc::packet_mreq).cast(),
                std::mem::size_of::<libc::packet_mreq>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(last_error("PACKET_ADD_MEMBERSHIP promiscuous"));
        }
        // Whatever arrived before the bind (unfiltered) is dropped with the socket's first reads: harmless.
        Ok(s)
    }

    fn setsockopt(&self, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> Result<()> {
        // SAFETY: an int option.
        let r = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                level,
                name,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(last_error("setsockopt"));
        }
        Ok(())
    }

    /// One received frame into `buf`: Some(len), or None when nothing is waiting. Frames the interface
    /// sent (should PACKET_IGNORE_OUTGOING not filter them) and truncated frames are skipped.
    fn recv(&self, buf: &mut [u8]) -> Option<Result<Option<usize>>> {
        // SAFETY: zeroed sockaddr_ll is valid.
        let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: buf and from are valid for the given lengths.
        let n = unsafe {
            libc::recvfrom(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                (&mut from as *mut libc::sockaddr_ll).cast(),
                &mut len,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return match e.kind() {
                std::io::ErrorKind::WouldBlock => None,
                std::io::ErrorKind::Interrupted => Some(Ok(None)),
                _ => Some(Err(anyhow::Error::new(e).context("recvfrom"))),
            };
        }
        let n = n as usize;
        if from.sll_pkttype == libc::PACKET_OUTGOING || n > buf.len() {
            return Some(Ok(None));
        }
        Some(Ok(Some(n)))
    }

    fn send(&self, frame: &[u8]) -> bool {
        // SAFETY: frame is valid for its length.
        let n = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                libc::MSG_DONTWAIT,
            )
        };
        n == frame.len() as isize
    }

    /// Frames the kernel dropped for this socket since the last call.
    fn drops(&self) -> u64 {
        // SAFETY: zeroed tpacket_stats is valid.
        let mut st: libc::tpacket_stats = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tpacket_stats>() as libc::socklen_t;
        // SAFETY: valid buffer and length.
        let r = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&mut st as *mut libc::tpacket_stats).cast(),
                &mut len,
            )
        };
        if r < 0 { 0 } else { st.tp_drops as u64 }
    }
}

/// The forwarder thread in the middle namespace; stopped (and its sockets closed) on drop.
pub struct Forwarder {
    stop: Arc<AtomicBool>,
    stats: Arc<Mutex<Stats>>,
    thread: Option<JoinHandle<Result<()>>>,
}

/// Longest sleep between looks at the stop flag.
const TICK: Duration = Duration::from_millis(5);

impl Forwarder {
    /// Starts forwarding between `dev_a` (M's end of the A link) and `dev_b` in namespace `ns_path`
    /// (`/run/netns/<name>`); returns once both sockets are bound.
    pub fn start(ns_path: &str, dev_a: &str, dev_b: &str, imp: Impairment) -> Result<Forwarder> {
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Mutex::new(Stats::default()));
        let (ready_tx, ready_rx) = mpsc::channel::<Result<()>>();
        let (path, da, db) = (ns_path.to_owned(), dev_a.to_owned(), dev_b.to_owned());
        let (stop2, stats2) = (stop.clone(), stats.clone());
        let thread = std::thread::Builder::new()
            .name("impair-forwarder".into())
            .spawn(move || {
                let setup = || -> Result<(PacketSocket, PacketSocket)> {
                    let ns = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
                    nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).context("setns")?;
                    Ok((PacketSocket::open(&da)?, PacketSocket::open(&db)?))
                };
                let (sa, sb) = match setup() {
                    Ok(s) => {
                        let _ = ready_tx.send(Ok(()));
                        s
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return Ok(());
                    }
                };
                forward(&sa, &sb, &imp, &stop2, &stats2)
            })
            .context("spawning the forwarder thread")?;
        let mut fwd = Forwarder {
            stop,
            stats,
            thread: Some(thread),
        };
        match ready_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => Ok(fwd),
            Ok(Err(e)) => {
                let _ = fwd.shutdown();
                Err(e)
            }
            Err(_) => {
                let _ = fwd.shutdown();
                bail!("the forwarder thread did not start")
            }
        }
    }

    /// The counters so far (updated every few milliseconds).
    pub fn stats(&self) -> Stats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stops the thread; its error, if it failed.
    pub fn shutdown(&mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => bail!("the forwarder thread panicked"),
            None => Ok(()),
        }
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            eprintln!("impairment forwarder: {e:#}");
        }
    }
}

/// The thread's loop: read what arrived on either side, send what is due, sleep until the next due frame
/// or readable socket (at most [`TICK`]).
fn forward(
    sa: &PacketSocket,
    sb: &PacketSocket,
    imp: &Impairment,
    stop: &AtomicBool,
    stats: &Mutex<Stats>,
) -> Result<()> {
    let mut ab = Scheduler::new(imp, 1);
    let mut ba = Scheduler::new(imp, 2);
    let (mut drops_ab, mut drops_ba, mut send_err_ab, mut send_err_ba) = (0u64, 0u64, 0u64, 0u64);
    let mut buf = vec![0u8; RX_BUF];
    let mut last_publish = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        // Read everything waiting (bounded per round so that due frames are not starved).
        for (sock, sched) in [(sa, &mut ab), (sb, &mut ba)] {
            for _ in 0..512 {
                match sock.recv(&mut buf) {
                    None => break,
                    Some(Ok(Some(n))) => sched.offer(buf[..n].to_vec(), Instant::now()),
                    Some(Ok(None)) => {}
                    Some(Err(e)) => return Err(e),
                }
            }
        }
        let now = Instant::now();
        while let Some(f) = ab.pop_due(now) {
            if !sb.send(&f) {
                send_err_ab += 1;
            }
        }
        while let Some(f) = ba.pop_due(now) {
            if !sa.send(&f) {
                send_err_ba += 1;
            }
        }
        if now.duration_since(last_publish) >= Duration::from_millis(2) {
            drops_ab += sa.drops();
            drops_ba += sb.drops();
            let mut s = stats.lock().unwrap_or_else(|e| e.into_inner());
            *s = Stats {
                a_to_b: DirStats {
                    send_errors: send_err_ab,
                    socket_drops: drops_ab,
                    ..ab.stats()
                },
                b_to_a: DirStats {
                    send_errors: send_err_ba,
                    socket_drops: drops_ba,
                    ..ba.stats()
                },
            };
            last_publish = now;
        }
        let mut timeout = TICK;
        for d in [ab.next_due(), ba.next_due()].into_iter().flatten() {
            timeout = timeout.min(d.saturating_duration_since(Instant::now()));
        }
        if timeout.is_zero() {
            continue;
        }
        let mut fds = [
            libc::pollfd {
                fd: sa.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: sb.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: valid pollfd array and timespec.
        unsafe { libc::ppoll(fds.as_mut_ptr(), 2, &ts, std::ptr::null()) };
    }
    // Final counters.
    let mut s = stats.lock().unwrap_or_else(|e| e.into_inner());
    s.a_to_b = DirStats {
        send_errors: send_err_ab,
        socket_drops: drops_ab + sa.drops(),
        ..ab.stats()
    };
    s.b_to_a = DirStats {
        send_errors: send_err_ba,
        socket_drops: drops_ba + sb.drops(),
        ..ba.stats()
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn frame(i: u64) -> Vec<u8> {
        i.to_be_bytes().to_vec()
    }

    fn id(f: &[u8]) -> u64 {
        u64::from_be_bytes(f[..8].try_into().unwrap())
    }

    /// Pops everything due up to `until`, each frame at its due time: (frame id, departure).
    fn drain_until(s: &mut Scheduler, until: Option<Instant>, out: &mut Vec<(u64, Instant)>) {
        while let Some(due) = s.next_due() {
            if until.is_some_and(|t| due > t) {
                break;
            }
            while let Some(f) = s.pop_due(due) {
                out.push((id(&f), due));
            }
        }
    }

    /// Offers `n` frames `gap` apart from `t0`, then drains everything: (frame id, departure) in order.
    fn run(s: &mut Scheduler, t0: Instant, n: u64, gap: Duration) -> Vec<(u64, Instant)> {
        let mut out = Vec::new();
        for i in 0..n {
            let now = t0 + gap * i as u32;
            drain_until(s, Some(now), &mut out);
            s.offer(frame(i), now);
        }
        drain_until(s, None, &mut out);
        assert_eq!(s.queued(), 0);
        out
    }

    #[test]
    fn no_impairment_is_a_wire() {
        let t0 = Instant::now();
        let mut s = Scheduler::new(&Impairment::NONE, 1);
        let out = run(&mut s, t0, 1000, Duration::from_micros(10));
        assert_eq!(out.len(), 1000);
        for (i, (f, at)) in out.iter().enumerate() {
            assert_eq!(*f, i as u64);
            assert_eq!(*at, t0 + Duration::from_micros(10) * i as u32);
        }
        let st = s.stats();
        assert_eq!(
            (st.received, st.forwarded, st.dropped, st.reordered),
            (1000, 1000, 0, 0)
        );
        assert_eq!(st.bytes, 8000);
    }

    #[test]
    fn fixed_delay_keeps_order_and_timing() {
        let t0 = Instant::now();
        let imp = Impairment {
            delay: 10 * MS,
            ..Impairment::NONE
        };
        let mut s = Scheduler::new(&imp, 1);
        assert_eq!(s.next_due(), None);
        s.offer(frame(0), t0);
        assert_eq!(s.next_due(), Some(t0 + 10 * MS));
        assert!(s.pop_due(t0 + 9 * MS).is_none());
        assert_eq!(s.pop_due(t0 + 10 * MS).map(|f| id(&f)), Some(0));
        let out = run(&mut s, t0, 500, Duration::from_micros(3));
        assert!(out.windows(2).all(|w| w[0].0 < w[1].0), "fixed delay reordered");
        for (f, at) in out {
            assert_eq!(at, t0 + Duration::from_micros(3) * f as u32 + 10 * MS);
        }
    }

    #[test]
    fn loss_rate_is_as_asked_and_all_or_nothing_works() {
        let t0 = Instant::now();
        for (p, lo, hi) in [
            (0.0, 0, 0),
            (0.05, 4_500, 5_500),
            (0.5, 49_000, 51_000),
            (1.0, 100_000, 100_000),
        ] {
            let imp = Impairment {
                loss: p,
                seed: 7,
                ..Impairment::NONE
            };
            let mut s = Scheduler::new(&imp, 1);
            let out = run(&mut s, t0, 100_000, Duration::from_micros(1));
            let st = s.stats();
            assert!(
                (lo..=hi).contains(&st.dropped),
                "loss {p}: {} dropped",
                st.dropped
            );
            assert_eq!(st.dropped + st.forwarded, 100_000);
            assert_eq!(out.len() as u64, st.forwarded);
        }
    }

    #[test]
    fn jitter_stays_in_bounds_and_reorders_close_frames() {
        let t0 = Instant::now();
        let imp = Impairment {
            delay: 10 * MS,
            jitter: 5 * MS,
            seed: 3,
            ..Impairment::NONE
        };
        let mut s = Scheduler::new(&imp, 1);
        let gap = Duration::from_micros(100);
        let out = run(&mut s, t0, 10_000, gap);
        assert_eq!(out.len(), 10_000);
        for (f, at) in &out {
            let sent = t0 + gap * *f as u32;
            let d = at.duration_since(sent);
            assert!((5 * MS..=15 * MS).contains(&d), "frame {f} delayed {d:?}");
        }
        let st = s.stats();
        assert!(
            st.reordered > 1000,
            "frames 100 µs apart with ±5 ms jitter: {st:?}"
        );
        assert_eq!(st.held, 0);
        // Frames further apart than the whole jitter range never reorder.
        let mut s = Scheduler::new(&imp, 1);
        run(&mut s, t0, 1000, 11 * MS);
        assert_eq!(s.stats().reordered, 0);
    }

    #[test]
    fn reorder_holds_a_frame_behind_the_next() {
        let t0 = Instant::now();
        let imp = Impairment {
            reorder: 1.0,
            ..Impairment::NONE
        };
        let mut s = Scheduler::new(&imp, 1);
        let gap = Duration::from_micros(100);
        let ids: Vec<u64> = run(&mut s, t0, 10, gap).into_iter().map(|(f, _)| f).collect();
        assert_eq!(ids, [1, 0, 3, 2, 5, 4, 7, 6, 9, 8]);
        assert_eq!(s.stats().held, 5);
        assert_eq!(s.stats().reordered, 5);
        // 10 %: about a tenth held, each one reordered (no jitter, no other cause).
        let imp = Impairment {
            reorder: 0.1,
            seed: 11,
            ..Impairment::NONE
        };
        let mut s = Scheduler::new(&imp, 1);
        run(&mut s, t0, 100_000, Duration::from_micros(1));
        let st = s.stats();
        assert!((8_000..=10_000).contains(&st.held), "{st:?}");
        assert_eq!(st.reordered, st.held, "{st:?}");
    }

    #[test]
    fn a_held_frame_with_no_follower_still_goes() {
        let t0 = Instant::now();
        let imp = Impairment {
            delay: 10 * MS,
            reorder: 1.0,
            ..Impairment::NONE
        };
        let mut s = Scheduler::new(&imp, 1);
        s.offer(frame(42), t0);
        assert_eq!(s.queued(), 1);
        assert_eq!(s.next_due(), Some(t0 + 20 * MS));
        assert!(s.pop_due(t0 + 19 * MS).is_none());
        assert_eq!(s.pop_due(t0 + 20 * MS).map(|f| id(&f)), Some(42));
        assert_eq!(s.queued(), 0);
        assert_eq!(s.next_due(), None);
    }

    #[test]
    fn deterministic_per_seed_and_stream() {
        let t0 = Instant::now();
        let fates = |seed, stream| {
            let mut s = Scheduler::new(&Impairment::netem_issue7(seed), stream);
            run(&mut s, t0, 5_000, Duration::from_micros(50))
        };
        assert_eq!(fates(1, 1), fates(1, 1));
        assert_ne!(fates(1, 1), fates(2, 1));
        assert_ne!(fates(1, 1), fates(1, 2));
    }

    #[test]
    fn issue7_profile_counts() {
        let t0 = Instant::now();
        let mut s = Scheduler::new(&Impairment::netem_issue7(5), 1);
        let out = run(&mut s, t0, 50_000, Duration::from_micros(20));
        let st = s.stats();
        assert_eq!(st.received, 50_000);
        assert_eq!(st.forwarded + st.dropped, 50_000);
        assert_eq!(out.len() as u64, st.forwarded);
        assert!((2_000..=3_000).contains(&st.dropped), "{st:?}");
        assert!(st.held > 3_000, "{st:?}");
        assert!(st.reordered > st.held, "{st:?}");
        // Every frame left once.
        let mut ids: Vec<u64> = out.iter().map(|(f, _)| *f).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len() as u64, st.forwarded);
    }

    #[test]
    fn overflow_refuses_instead_of_growing() {
        let t0 = Instant::now();
        let imp = Impairment {
            delay: Duration::from_secs(1),
            ..Impairment::NONE
        };
        let mut s = Scheduler::new(&imp, 1);
        for i in 0..MAX_QUEUED as u64 + 10 {
            s.offer(Vec::new(), t0 + Duration::from_nanos(i));
        }
        assert_eq!(s.queued(), MAX_QUEUED);
        assert_eq!(s.stats().overflow, 10);
    }

    /// Any frames (empty, huge), any parameters (NaN, negative, > 1), times in any order: no panic, and
    /// every accepted frame comes out exactly once.
    #[test]
    fn robust_to_anything() {
        let mut rng = Rng::new(99);
        let t0 = Instant::now() + Duration::from_secs(100);
        for round in 0..200 {
            let pick = |r: &mut Rng, xs: &[f64]| xs[(r.next_u64() % xs.len() as u64) as usize];
            let weird = [0.0, 1.0, 0.5, -1.0, 2.0, f64::NAN, f64::INFINITY, 0.05];
            let imp = Impairment {
                loss: pick(&mut rng, &weird),
                delay: Duration::from_micros(rng.next_u64() % 20_000),
                jitter: Duration::from_micros(rng.next_u64() % 40_000),
                reorder: pick(&mut rng, &weird),
                seed: round,
            };
            let mut s = Scheduler::new(&imp, round);
            let mut out = 0u64;
            for i in 0..2_000u64 {
                let len = match rng.next_u64() % 4 {
                    0 => 0,
                    1 => (rng.next_u64() % 16) as usize,
                    2 => (rng.next_u64() % 1600) as usize,
                    _ => (rng.next_u64() % 70_000) as usize,
                };
                // Times jump back and forth by up to 50 ms around a slowly advancing clock.
                let now = t0 + Duration::from_micros(i * 10) + Duration::from_micros(rng.next_u64() % 50_000)
                    - Duration::from_micros(25_000);
                s.offer(vec![0xA5; len], now);
                if rng.next_u64().is_multiple_of(3) {
                    while s.pop_due(now).is_some() {
                        out += 1;
                    }
                }
            }
            while let Some(due) = s.next_due() {
                while s.pop_due(due).is_some() {
                    out += 1;
                }
            }
            let st = s.stats();
            assert_eq!(st.forwarded, out);
            assert_eq!(
                st.received,
                st.forwarded + st.dropped + st.overflow,
                "{imp:?}: {st:?}"
            );
        }
    }
}
