//! The XDP stack: the steered TCP flows over the AF_XDP device, commands in, `TransportEvent`s out, on one
//! of two TCP backends chosen at start ([`TcpBackend`], `--xdp-tcp`): soft-rdma's own TCP (`own_tcp.rs`,
//! the default, with the XDP program's SYN cookies, `syn_cookies.rs`) or smoltcp's socket
//! (`smoltcp_tcp.rs`). What both are given is [`Shared`] (`shared.rs`): a smoltcp `Interface` over the
//! device (in either mode it takes the neighbour answers and the segments no TCP claims), the neighbours
//! (`neighbours.rs`), routes, the XDP endpoint map and the events for the engine. Sans thread: the daemon's
//! event loop drives it (`super::XdpTransport`), on the thread that runs the engine.
//!
//! A round ([`Stack::round`]): copy received frames out of the RX rings (learning peers' MACs, and on
//! smoltcp's socket their SYN MSS options, on the way; the own TCP claims its segments) → resolve pending
//! neighbours → smoltcp's connects whose next hop resolved make their sockets → `Interface::poll` → kick TX
//! → the backend moves bytes and states between its connections and the engine (Received / Written /
//! Connected / Accepted / Closed; the own TCP also frames its segments onto the TX ring) → poll again if
//! anything moved. Commands ([`Stack::command`]) go to the backend and run at once. The caller runs rounds
//! while there is work, then sleeps on the AF_XDP sockets for at most [`Stack::next_timeout`] (smoltcp's
//! `poll_delay`, the own TCP's timers, the next neighbour/connect/close deadline). Spinning
//! (`--xdp-busy-poll-us`) is the event loop's business (`daemon::run`); by default it is off below 8 CPUs.
//!
//! Scale. A round costs what happened in it, not the number of connections. On smoltcp's socket each
//! connection's socket is in a smoltcp socket set of its own and frames are handed to their set by 4-tuple
//! (`sets.rs`: smoltcp would otherwise ask every socket about every segment and visit every socket on every
//! poll); only the sets with frames, touched by a command or with a smoltcp timer due are polled; and only
//! the connections something happened to are looked at (`smoltcp_tcp.rs`). The own TCP's table
//! demultiplexes by 4-tuple itself and keeps its timers and its connections with output in order
//! (`tcp/table.rs`).
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
//! source address, so an accepted connection answers without waiting. The own TCP frames its segments to
//! the MACs learned so.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant as StdInstant};

use tracing::info;

use crate::engine::transport_seam::TransportEvent;

mod drops;
mod neighbours;
mod own_tcp;
mod queued_bytes;
mod shared;
mod smoltcp_tcp;
mod syn_cookies;

pub(super) use shared::Cmd;
pub use syn_cookies::SynCookieSetup;

use neighbours::{NEIGH_REFRESH, Neighbours, neighbour_frame};
use own_tcp::OwnTcp;
use shared::Shared;
use smoltcp_tcp::{PeerMss, SmoltcpTcp};

use super::iface::IfaceInfo;
use super::loader::Endpoints;
use super::xsk::XdpDevice;

/// Copy the kernel's AF_XDP drop counters into the status this often (the loop sleeps at most 100 ms).
const STATISTICS_PERIOD: Duration = Duration::from_millis(250);

/// The TCP the steered flows run on (`--xdp-tcp`), chosen when the stack is made. Each command, round,
/// timeout and the shutdown go to it once.
// One value per stack, made once (the transport keeps the `Stack` boxed): the variants' difference in
// size costs nothing, and boxing the own TCP would add a pointer to follow on its hot path.
#[allow(clippy::large_enum_variant)]
enum TcpBackend {
    /// soft-rdma's own TCP, `crate::tcp` (`own_tcp.rs`): soft-rdmad's default.
    Own(OwnTcp),
    /// smoltcp's socket (`smoltcp_tcp.rs`).
    Smoltcp(SmoltcpTcp),
}

impl TcpBackend {
    fn command(&mut self, sh: &mut Shared, cmd: Cmd, now: StdInstant) {
        match self {
            TcpBackend::Own(own) => own.command(sh, cmd, now),
            TcpBackend::Smoltcp(s) => s.command(sh, cmd, now),
        }
    }

    /// Before the round's `Interface::poll`: smoltcp's connects whose next hop resolved make their
    /// sockets, so that the poll sends their SYNs. (The own TCP starts its connects in
    /// [`TcpBackend::service`], which frames its SYNs itself.)
    fn start_resolved(&mut self, sh: &mut Shared, now: StdInstant) {
        match self {
            TcpBackend::Own(_) => {}
            TcpBackend::Smoltcp(s) => s.start_resolved(sh, now),
        }
    }

    /// After the round's `Interface::poll`: bytes and states between the connections and the engine.
    /// True if anything moved.
    fn service(&mut self, sh: &mut Shared, now: StdInstant) -> bool {
        match self {
            TcpBackend::Own(own) => own.service(sh, now),
            TcpBackend::Smoltcp(s) => s.service(sh, now),
        }
    }

    /// Sockets smoltcp woke since the last round (the own TCP has none: its table reports in `service`).
    fn woken(&self) -> bool {
        match self {
            TcpBackend::Own(_) => false,
            TcpBackend::Smoltcp(s) => s.woken(),
        }
    }

    /// When the backend's next round is due, by its own timers and deadlines.
    fn next_deadline(&self, sh: &Shared, now: StdInstant) -> Option<StdInstant> {
        match self {
            TcpBackend::Own(own) => own.next_deadline(sh.start, now),
            TcpBackend::Smoltcp(s) => s.next_deadline(),
        }
    }

    /// The own TCP's segments dropped by reason (`drops.rs`); none on smoltcp's socket, which verifies
    /// checksums itself.
    fn drop_counters(&self) -> Vec<(&'static str, u64)> {
        match self {
            TcpBackend::Own(own) => own.drop_counters(),
            TcpBackend::Smoltcp(_) => Vec::new(),
        }
    }

    /// The own TCP's counters since start and its SYN-cookie counts; `None` on smoltcp's socket.
    fn totals(&self) -> Option<(crate::tcp::TcpCounters, (u64, u64))> {
        match self {
            TcpBackend::Own(own) => Some(own.totals()),
            TcpBackend::Smoltcp(_) => None,
        }
    }

    /// The transport is going away: the own TCP logs its totals; smoltcp's sockets are reset.
    fn shutdown(&mut self, sh: &mut Shared) {
        match self {
            TcpBackend::Own(own) => own.log_totals(),
            TcpBackend::Smoltcp(s) => s.shutdown(sh),
        }
    }
}

/// The XDP stack (see the module documentation): the parts both TCPs use, and the TCP.
pub(super) struct Stack {
    shared: Shared,
    tcp: TcpBackend,
    /// When the AF_XDP sockets' kernel statistics were last copied into the status.
    last_statistics: StdInstant,
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
    /// Whether the interface's kind lets segments with a partial checksum in (own TCP only).
    pub checksums: crate::transport::xdp::iface_kind::PartialChecksums,
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
            checksums,
        } = settings;
        let mut shared = Shared::new(info, dev, endpoints, connect_timeout, conn_id_base, random_seed)?;
        let tcp = if own_tcp {
            TcpBackend::Own(OwnTcp::new(
                shared.info.mtu,
                random_seed,
                own_tcp_budget,
                (syn_cookies, checksums),
                &mut shared.nl,
            ))
        } else {
            TcpBackend::Smoltcp(SmoltcpTcp::new(own_tcp_budget))
        };
        Ok(Stack {
            last_statistics: shared.start,
            shared,
            tcp,
        })
    }

    /// Carries a command out at once (a round after it sends what it queued).
    pub(in crate::transport::xdp) fn command(&mut self, cmd: Cmd, now: StdInstant) {
        self.tcp.command(&mut self.shared, cmd, now);
    }

    /// The own TCP's counters since start and its SYN-cookie counts; `None` on smoltcp's socket.
    pub fn tcp_totals(&self) -> Option<(crate::tcp::TcpCounters, (u64, u64))> {
        self.tcp.totals()
    }

    /// The TCP's connections (the own TCP's table, or smoltcp's connection sockets), for `status`.
    pub fn tcp_connections(&self) -> Vec<crate::transport::status::TcpConnectionStatus> {
        match &self.tcp {
            TcpBackend::Own(own) => own.connections(),
            TcpBackend::Smoltcp(s) => s.connections(&self.shared),
        }
    }

    /// The own TCP's segments dropped since start, by `status` name (`drops.rs`); none on smoltcp's socket.
    pub fn drop_counters(&self) -> Vec<(&'static str, u64)> {
        self.tcp.drop_counters()
    }

    /// The next event for the engine.
    pub fn poll_event(&mut self) -> Option<TransportEvent> {
        self.shared.events.pop_front()
    }

    /// One round: copies received frames out of the RX rings, resolves neighbours, runs TCP, kicks TX and
    /// turns what happened to the connections into events ([`Stack::poll_event`]). Commands run at once
    /// ([`Stack::command`]); a round after them sends what they queued. True: there is more to do right
    /// away (frames left, a socket woken), so the caller runs another round before it sleeps.
    pub fn round(&mut self, now: StdInstant) -> bool {
        let sh = &mut self.shared;
        if now.duration_since(self.last_statistics) >= STATISTICS_PERIOD {
            self.last_statistics = now;
            for q in &sh.dev.queues {
                let _ = q.refresh_statistics();
            }
        }
        let mut work = receive(sh, &mut self.tcp, now);
        for q in &mut sh.dev.queues {
            q.reap_completions();
        }
        work |= sh.resolve_neighbours(now);
        self.tcp.start_resolved(sh, now);
        sh.poll_stack(now);
        work |= self.tcp.service(sh, now);
        if work {
            sh.poll_stack(now);
        }
        work || !sh.dev.rx_frames.is_empty() || sh.sets.busy() || self.tcp.woken()
    }

    /// How long the caller may sleep on the AF_XDP sockets before the next round is due (timers, neighbour
    /// checks, connect and close deadlines, unreaped TX frames); at most 100 ms.
    pub fn next_timeout(&self, now: StdInstant) -> Duration {
        let sh = &self.shared;
        let ts = sh.ts(now);
        let mut timeout = sh
            .sets
            .next_timer()
            .map(|at| Duration::from_micros(if at > ts { (at - ts).total_micros() } else { 0 }))
            .unwrap_or(Duration::from_millis(100))
            .min(Duration::from_millis(100));
        for p in sh.neigh.pending.values() {
            timeout = timeout.min(p.next_check.saturating_duration_since(now));
        }
        if let Some(at) = self.tcp.next_deadline(sh, now) {
            timeout = timeout.min(at.saturating_duration_since(now));
        }
        if sh.dev.queues[0].tx_pending() > 0 {
            timeout = timeout.min(Duration::from_millis(1));
        }
        timeout
    }

    /// The transport is going away: every connection is reset and the statistics are logged.
    pub fn shutdown(&mut self) {
        let sh = &mut self.shared;
        self.tcp.shutdown(sh);
        sh.sets.all_due();
        let now = StdInstant::now();
        sh.poll_stack(now);
        // Frames lost inside the host, not on the wire: steered but dropped by the kernel (no fill ring
        // entry, RX ring full), or produced by smoltcp while no TX frame was free.
        for q in &sh.dev.queues {
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
        info!(tx_dropped = sh.dev.tx_dropped, "XDP device statistics");
    }
}

// -------------------------------------------------------------------------------------------------------
// Receiving frames.

/// Copies the received frames out of the RX rings into smoltcp's queue, looking at each on the way
/// ([`inspect`]); the own TCP then claims its segments from that queue. True if a frame came.
fn receive(sh: &mut Shared, tcp: &mut TcpBackend, now: StdInstant) -> bool {
    let Shared { dev, info, neigh, .. } = sh;
    let XdpDevice {
        queues, rx_frames, ..
    } = dev;
    let mut peer_mss = match tcp {
        TcpBackend::Smoltcp(s) => Some(s.peer_mss()),
        TcpBackend::Own(_) => None,
    };
    let mut n = 0;
    for q in queues.iter_mut() {
        n += q.receive(1024, |frame| {
            inspect(frame, info, neigh, peer_mss.as_deref_mut(), rx_frames, now);
            rx_frames.push_back(frame.to_vec());
        });
    }
    if let TcpBackend::Own(own) = tcp
        && n > 0
    {
        // Segments for own-TCP endpoints leave smoltcp's queue (neighbour answers stay).
        own.claim(rx_frames);
    }
    n > 0
}

/// Looks at a received frame before smoltcp does: the peer's MSS option in SYNs (into `peer_mss`, on
/// smoltcp's socket), and for on-link peers the Ethernet source address (injected as a neighbour answer
/// ahead of the frame when smoltcp lacks it).
fn inspect(
    frame: &[u8],
    info: &IfaceInfo,
    neigh: &mut Neighbours,
    peer_mss: Option<&mut PeerMss>,
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
    if let Some(peer_mss) = peer_mss
        && flags & 0x02 != 0
    {
        // SYN: remember the MSS option (RFC 9293 §3.7.1).
        let doff = ((tcp[12] >> 4) as usize) * 4;
        // A data offset below 5 words is malformed: no options (and no panic on an inverted range).
        let mut opts = &tcp[20..doff.clamp(20, tcp.len())];
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
                        peer_mss.record(
                            SocketAddr::new(src, sport),
                            dport,
                            u16::from_be_bytes([opts[2], opts[3]]),
                        );
                    }
                    opts = &opts[len..];
                }
            }
        }
        peer_mss.bound();
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
