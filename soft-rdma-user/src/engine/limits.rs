//! What one client, and all of them together, may consume of soft-rdmad: one settings struct, [`Limits`],
//! with every bound a client can reach, its default and what passing it costs the client. soft-rdmad's
//! flags (`--max-…`, `--…-timeout-ms`) and config-file keys set them; README.md ("Limits") tabulates them
//! and docs/protocol.md ("Limits") gives the error each one produces.
//!
//! The engine applies the port bounds ([`super::port_space`]), the object bound ([`super::cm`]) and the
//! work-queue and completion-queue entry bounds ([`QueueEntries`], in [`super::datapath`]); the UDS server applies the rest
//! (`uds::budget`): registered memory, sessions, Hello and frame timeouts, queued output. The own TCP of
//! the XDP transport applies the TCP bounds (`crate::tcp::TcpBudget`), which a peer reaches as well as a
//! client.
//!
//! [`Limit`] names each bound, and [`LimitHits`] counts how often each was hit (soft-rdmad's metrics show
//! both): whoever enforces a bound counts its hits where it refuses.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::ids::SessionId;
use crate::error::{Error, NdStatus, Result};

const GIB: u64 = 1 << 30;
const MIB: usize = 1 << 20;

/// The deepest completion queue: kernel siw's `SIW_MAX_CQE` (`drivers/infiniband/sw/siw/siw.h`:
/// `SIW_MAX_QP_WR * 100`), the adapter's `max_completion_queue_depth` (verbs' `max_cqe`). Its cost is
/// bounded whatever the depth: in the program's process completions wait in a queue that grows on demand;
/// a daemon-run queue's shared ring holds at most `crate::rings::cq::MAX_RING_ENTRIES` (docs/limits.md,
/// "Completion queues").
pub const MAX_COMPLETION_QUEUE_DEPTH: u32 = 3_276_800;

/// Every bound on what clients may consume. Defaults: [`Limits::default`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Objects (connectors, listeners, shared endpoints, completion queues, queue pairs, memory regions) one
    /// session may hold; one more is INSUFFICIENT_RESOURCES.
    pub max_objects_per_session: usize,
    /// Bytes of memory one session may have registered (mapped into the daemon) at once, like
    /// RLIMIT_MEMLOCK (`ulimit -l`) for a verbs application; past it RegisterMemory is
    /// INSUFFICIENT_RESOURCES. A sparse memfd costs no RAM but costs the daemon address space.
    pub max_registered_bytes_per_session: u64,
    /// Bytes of memory all sessions together may have registered; past it INSUFFICIENT_RESOURCES.
    pub max_registered_bytes: u64,
    /// Memory regions (each one mapping in the daemon) one session may hold; past it INSUFFICIENT_RESOURCES.
    pub max_regions_per_session: usize,
    /// Memory regions of all sessions together (the kernel's `vm.max_map_count`, 65,530 by default, bounds
    /// the daemon's mappings); past it INSUFFICIENT_RESOURCES.
    pub max_regions: usize,
    /// Ports one session may hold at once (each a socket, so a descriptor, in the daemon): bound connectors
    /// (Bind, or the implicit bind of Connect), shared endpoints and listening listeners; past it
    /// INSUFFICIENT_RESOURCES. soft-rdmad lowers it at start to a quarter of its RLIMIT_NOFILE if that is less.
    pub max_ports_per_session: usize,
    /// Ephemeral ports (49152-65535, a bind to port 0) one session may hold at once, so that no session can
    /// take the whole range from the others; past it TOO_MANY_ADDRESSES, as when the range is used up.
    pub max_ephemeral_ports_per_session: usize,
    /// Client connections the daemon serves at once (with or without Hello); one more is answered with a
    /// Goodbye carrying INSUFFICIENT_RESOURCES and closed.
    pub max_sessions: usize,
    /// Client connections that have not sent their Hello yet; one more is answered like one past
    /// `max_sessions`.
    pub max_pending_hellos: usize,
    /// How long a new connection may take to send its Hello; then Goodbye with IO_TIMEOUT.
    pub hello_timeout: Duration,
    /// How long a frame may stay half-sent (its first byte received, its last not); then Goodbye with
    /// IO_TIMEOUT.
    pub frame_timeout: Duration,
    /// Bytes of answers, events and completions queued for one client that does not read them; past it the
    /// session reads no more requests until the client catches up.
    pub max_output_bytes_per_session: usize,
    /// The same for all sessions together: past it, the sessions with the most queued output are paused
    /// first (every session holding at least the average share), the others keep being served.
    pub max_output_bytes: usize,
    /// Work-queue entries (send depth + receive depth of every queue pair) one session may hold: what
    /// bounds its outstanding work requests, hence the completions they will produce; past it
    /// CreateQueuePair is INSUFFICIENT_RESOURCES. It also bounds the completions soft-rdmad keeps for a
    /// client that does not take them (its completion rings full): past it, its queue pairs' rings are not
    /// read until it does (`daemon::rings`).
    pub max_queue_entries_per_session: u64,
    /// The same for all sessions together.
    pub max_queue_entries: u64,
    /// Completion-queue entries (the depths of its completion queues) one session may hold; past it
    /// CreateCompletionQueue is INSUFFICIENT_RESOURCES. A depth reserves nothing (completions wait in
    /// storage that grows on demand, bounded by the work-queue entries above), so this bounds what a
    /// session may declare: by default five queues of [`MAX_COMPLETION_QUEUE_DEPTH`], or 64 of libfabric
    /// RxM's default 262,144.
    pub max_cq_entries_per_session: u64,
    /// The same for all sessions together.
    pub max_cq_entries: u64,
    /// Bytes of shared rings (`crate::rings`: a memfd per daemon-run queue pair and completion queue, mapped
    /// by the daemon) one session may hold; past it CreateQueuePair or CreateCompletionQueue is
    /// INSUFFICIENT_RESOURCES.
    pub max_ring_bytes_per_session: u64,
    /// The same for all sessions together.
    pub max_ring_bytes: u64,
    /// Doorbells (eventfds the daemon holds: one per session with rings, one per completion queue) one
    /// session may hold; past it CreateQueuePair or CreateCompletionQueue is INSUFFICIENT_RESOURCES.
    pub max_doorbells_per_session: usize,
    /// Doorbells of all sessions together. soft-rdmad lowers it at start to a quarter of its RLIMIT_NOFILE
    /// if that is less.
    pub max_doorbells: usize,
    /// XDP mode's own TCP: bytes of send and receive buffer memory all its connections may hold together
    /// (each connection's buffers grow on demand up to 1 MiB per direction). Past it, nothing fails: the
    /// windows connections advertise shrink (never below what they advertised already) and their send
    /// buffers take no more bytes until memory is given back, so transfers slow down. On smoltcp's socket
    /// (`--xdp-tcp smoltcp`) each socket's fixed buffers (256 KiB receive, 128 KiB send) are charged whole
    /// when it is made: past the bound no socket is made (as past `max_tcp_connections`).
    pub max_tcp_buffer_bytes: u64,
    /// XDP mode's own TCP: connections held at once, in any state (TIME-WAIT included); past it a SYN is
    /// answered with a reset (the peer's connect is refused) and a Connect fails with
    /// INSUFFICIENT_RESOURCES. On smoltcp's socket the listening slots (up to 64 per listening address)
    /// count too.
    pub max_tcp_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_objects_per_session: 65_536,
            max_registered_bytes_per_session: 64 * GIB,
            max_registered_bytes: 1024 * GIB,
            max_regions_per_session: 4_096,
            max_regions: 32_768,
            max_ports_per_session: 16_384,
            max_ephemeral_ports_per_session: 8_192,
            max_sessions: 1_024,
            max_pending_hellos: 128,
            hello_timeout: Duration::from_secs(10),
            frame_timeout: Duration::from_secs(30),
            max_output_bytes_per_session: 4 * MIB,
            max_output_bytes: 256 * MIB,
            max_queue_entries_per_session: 262_144,
            max_queue_entries: 4_194_304,
            max_cq_entries_per_session: 16_777_216,
            max_cq_entries: 268_435_456,
            max_ring_bytes_per_session: 256 * MIB as u64,
            max_ring_bytes: 4 * GIB,
            max_doorbells_per_session: 1_024,
            max_doorbells: 8_192,
            // 128 connections at their full 4 MiB each way, or the whole port space's 16,384 connections
            // at 32 KiB each way; idle connections hold none.
            max_tcp_buffer_bytes: GIB,
            // A whole ephemeral port space (16,384) of connections made, as many accepted, with room for
            // TIME-WAIT; a few KiB of state each.
            max_tcp_connections: 32_768,
        }
    }
}

impl Limits {
    /// Lowers the per-session port bound and the doorbell bound to a quarter of `fd_limit` (the daemon's
    /// RLIMIT_NOFILE) if they are higher, so one session can never take most of the daemon's descriptors,
    /// nor can the rings' doorbells. Returns the port bound now.
    pub fn fit_descriptors(&mut self, fd_limit: u64) -> usize {
        let quarter = usize::try_from(fd_limit / 4).unwrap_or(usize::MAX).max(1);
        self.max_ports_per_session = self.max_ports_per_session.min(quarter);
        self.max_doorbells = self.max_doorbells.min(quarter);
        self.max_ports_per_session
    }
}

/// One bound of [`Limits`], by its field's name: what soft-rdmad's metrics label a limit and its hits with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Limit {
    ObjectsPerSession,
    RegisteredBytesPerSession,
    RegisteredBytes,
    RegionsPerSession,
    Regions,
    PortsPerSession,
    EphemeralPortsPerSession,
    Sessions,
    PendingHellos,
    HelloTimeout,
    FrameTimeout,
    OutputBytesPerSession,
    OutputBytes,
    QueueEntriesPerSession,
    QueueEntries,
    CqEntriesPerSession,
    CqEntries,
    RingBytesPerSession,
    RingBytes,
    DoorbellsPerSession,
    Doorbells,
    TcpBufferBytes,
    TcpConnections,
}

/// What a bound's value counts: things, bytes or time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitValue {
    Count(u64),
    Bytes(u64),
    Duration(Duration),
}

impl Limit {
    /// Every bound, in [`Limits`]' order.
    pub const ALL: [Limit; 23] = [
        Limit::ObjectsPerSession,
        Limit::RegisteredBytesPerSession,
        Limit::RegisteredBytes,
        Limit::RegionsPerSession,
        Limit::Regions,
        Limit::PortsPerSession,
        Limit::EphemeralPortsPerSession,
        Limit::Sessions,
        Limit::PendingHellos,
        Limit::HelloTimeout,
        Limit::FrameTimeout,
        Limit::OutputBytesPerSession,
        Limit::OutputBytes,
        Limit::QueueEntriesPerSession,
        Limit::QueueEntries,
        Limit::CqEntriesPerSession,
        Limit::CqEntries,
        Limit::RingBytesPerSession,
        Limit::RingBytes,
        Limit::DoorbellsPerSession,
        Limit::Doorbells,
        Limit::TcpBufferBytes,
        Limit::TcpConnections,
    ];

    /// The [`Limits`] field it is (its flag is the same name with dashes: `--max-sessions`).
    pub fn name(self) -> &'static str {
        match self {
            Limit::ObjectsPerSession => "max_objects_per_session",
            Limit::RegisteredBytesPerSession => "max_registered_bytes_per_session",
            Limit::RegisteredBytes => "max_registered_bytes",
            Limit::RegionsPerSession => "max_regions_per_session",
            Limit::Regions => "max_regions",
            Limit::PortsPerSession => "max_ports_per_session",
            Limit::EphemeralPortsPerSession => "max_ephemeral_ports_per_session",
            Limit::Sessions => "max_sessions",
            Limit::PendingHellos => "max_pending_hellos",
            Limit::HelloTimeout => "hello_timeout",
            Limit::FrameTimeout => "frame_timeout",
            Limit::OutputBytesPerSession => "max_output_bytes_per_session",
            Limit::OutputBytes => "max_output_bytes",
            Limit::QueueEntriesPerSession => "max_queue_entries_per_session",
            Limit::QueueEntries => "max_queue_entries",
            Limit::CqEntriesPerSession => "max_cq_entries_per_session",
            Limit::CqEntries => "max_cq_entries",
            Limit::RingBytesPerSession => "max_ring_bytes_per_session",
            Limit::RingBytes => "max_ring_bytes",
            Limit::DoorbellsPerSession => "max_doorbells_per_session",
            Limit::Doorbells => "max_doorbells",
            Limit::TcpBufferBytes => "max_tcp_buffer_bytes",
            Limit::TcpConnections => "max_tcp_connections",
        }
    }

    /// Its value in `limits`.
    pub fn value(self, l: &Limits) -> LimitValue {
        let count = |n: usize| LimitValue::Count(n as u64);
        match self {
            Limit::ObjectsPerSession => count(l.max_objects_per_session),
            Limit::RegisteredBytesPerSession => LimitValue::Bytes(l.max_registered_bytes_per_session),
            Limit::RegisteredBytes => LimitValue::Bytes(l.max_registered_bytes),
            Limit::RegionsPerSession => count(l.max_regions_per_session),
            Limit::Regions => count(l.max_regions),
            Limit::PortsPerSession => count(l.max_ports_per_session),
            Limit::EphemeralPortsPerSession => count(l.max_ephemeral_ports_per_session),
            Limit::Sessions => count(l.max_sessions),
            Limit::PendingHellos => count(l.max_pending_hellos),
            Limit::HelloTimeout => LimitValue::Duration(l.hello_timeout),
            Limit::FrameTimeout => LimitValue::Duration(l.frame_timeout),
            Limit::OutputBytesPerSession => LimitValue::Bytes(l.max_output_bytes_per_session as u64),
            Limit::OutputBytes => LimitValue::Bytes(l.max_output_bytes as u64),
            Limit::QueueEntriesPerSession => LimitValue::Count(l.max_queue_entries_per_session),
            Limit::QueueEntries => LimitValue::Count(l.max_queue_entries),
            Limit::CqEntriesPerSession => LimitValue::Count(l.max_cq_entries_per_session),
            Limit::CqEntries => LimitValue::Count(l.max_cq_entries),
            Limit::RingBytesPerSession => LimitValue::Bytes(l.max_ring_bytes_per_session),
            Limit::RingBytes => LimitValue::Bytes(l.max_ring_bytes),
            Limit::DoorbellsPerSession => count(l.max_doorbells_per_session),
            Limit::Doorbells => count(l.max_doorbells),
            Limit::TcpBufferBytes => LimitValue::Bytes(l.max_tcp_buffer_bytes),
            Limit::TcpConnections => count(l.max_tcp_connections),
        }
    }
}

/// How often each bound was hit since start (a refusal, a timeout, a pause). Atomics, so that whoever
/// enforces a bound counts through a shared reference, whatever task or thread it runs on.
#[derive(Debug, Default)]
pub struct LimitHits([AtomicU64; Limit::ALL.len()]);

impl LimitHits {
    pub fn hit(&self, limit: Limit) {
        self.0[limit as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self, limit: Limit) -> u64 {
        self.0[limit as usize].load(Ordering::Relaxed)
    }
}

/// What `status` shows of the limits the daemon enforces beside the engine's (the UDS server's counters,
/// filled in by the daemon): connections, registered memory and the memory held for clients.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResourceStatus {
    /// Client connections open (with or without Hello), and the bound.
    pub client_connections: u64,
    pub max_sessions: u64,
    /// Of those, the ones that have not sent their Hello yet.
    pub pending_hellos: u64,
    /// Connections answered INSUFFICIENT_RESOURCES (a bound above, or out of descriptors) since start.
    pub refused_connections: u64,
    /// Bytes of client memory mapped for registered regions, and the bound.
    pub registered_bytes: u64,
    pub max_registered_bytes: u64,
    /// Registered regions (mappings), and the bound.
    pub regions: u64,
    pub max_regions: u64,
    /// Bytes of answers, events and completions queued for clients that have not read them, and the bound.
    pub queued_output_bytes: u64,
    pub max_output_bytes: u64,
    /// Times a session was paused because the queued output of all sessions passed the bound.
    pub output_pauses: u64,
    /// The daemon's resident memory (VmRSS), if it could be read.
    pub resident_bytes: Option<u64>,
}

/// What a [`QueueEntries`] counts: work-queue entries (queue pairs' depths) or completion-queue entries
/// (completion queues' depths).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    WorkQueue,
    CompletionQueue,
}

impl EntryKind {
    /// Its bounds: per session, all sessions.
    fn limits(self) -> (Limit, Limit) {
        match self {
            EntryKind::WorkQueue => (Limit::QueueEntriesPerSession, Limit::QueueEntries),
            EntryKind::CompletionQueue => (Limit::CqEntriesPerSession, Limit::CqEntries),
        }
    }

    fn what(self) -> &'static str {
        match self {
            EntryKind::WorkQueue => "work-queue entries",
            EntryKind::CompletionQueue => "completion-queue entries",
        }
    }
}

/// The flag that sets `limit` (its name with dashes).
fn flag(limit: Limit) -> String {
    format!("--{}", limit.name().replace('_', "-"))
}

/// Entries held per session and in total, against a per-session and a daemon-wide bound:
/// `max_queue_entries_per_session` and `max_queue_entries` for work-queue entries,
/// `max_cq_entries_per_session` and `max_cq_entries` for completion-queue entries.
#[derive(Debug)]
pub struct QueueEntries {
    kind: EntryKind,
    held: HashMap<SessionId, u64>,
    total: u64,
    max_per_session: u64,
    max_total: u64,
    hits: LimitHits,
}

impl Default for QueueEntries {
    /// Work-queue entries, unbounded.
    fn default() -> Self {
        QueueEntries::unbounded(EntryKind::WorkQueue)
    }
}

impl QueueEntries {
    /// Work-queue entries, bounded by `limits`.
    pub fn new(limits: &Limits) -> Self {
        QueueEntries::of(EntryKind::WorkQueue, limits)
    }

    /// `kind`'s entries, unbounded.
    pub fn unbounded(kind: EntryKind) -> Self {
        QueueEntries {
            kind,
            held: HashMap::new(),
            total: 0,
            max_per_session: u64::MAX,
            max_total: u64::MAX,
            hits: LimitHits::default(),
        }
    }

    /// `kind`'s entries, bounded by `limits`.
    pub fn of(kind: EntryKind, limits: &Limits) -> Self {
        let (max_per_session, max_total) = match kind {
            EntryKind::WorkQueue => (limits.max_queue_entries_per_session, limits.max_queue_entries),
            EntryKind::CompletionQueue => (limits.max_cq_entries_per_session, limits.max_cq_entries),
        };
        QueueEntries {
            max_per_session,
            max_total,
            ..QueueEntries::unbounded(kind)
        }
    }

    /// `n` more entries for `session`, or INSUFFICIENT_RESOURCES (nothing taken).
    pub fn take(&mut self, session: SessionId, n: u64) -> Result<()> {
        let (per_session, all) = self.kind.limits();
        let what = self.kind.what();
        let mine = self.held.get(&session).copied().unwrap_or(0);
        if mine.saturating_add(n) > self.max_per_session {
            self.hits.hit(per_session);
            return Err(Error::new(
                NdStatus::InsufficientResources,
                format!(
                    "{n} more {what} would pass this session's limit of {} ({}; {mine} held)",
                    self.max_per_session,
                    flag(per_session)
                ),
            ));
        }
        if self.total.saturating_add(n) > self.max_total {
            self.hits.hit(all);
            return Err(Error::new(
                NdStatus::InsufficientResources,
                format!(
                    "{n} more {what} would pass soft-rdmad's limit of {} ({})",
                    self.max_total,
                    flag(all)
                ),
            ));
        }
        *self.held.entry(session).or_default() += n;
        self.total += n;
        Ok(())
    }

    /// Gives back `n` entries of `session`.
    pub fn give(&mut self, session: SessionId, n: u64) {
        if let Some(mine) = self.held.get_mut(&session) {
            let n = n.min(*mine);
            *mine -= n;
            self.total = self.total.saturating_sub(n);
            if *mine == 0 {
                self.held.remove(&session);
            }
        }
    }

    /// Gives back everything `session` holds.
    pub fn give_all(&mut self, session: SessionId) {
        if let Some(mine) = self.held.remove(&session) {
            self.total = self.total.saturating_sub(mine);
        }
    }

    /// Entries all sessions hold.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// How often each of its bounds refused entries.
    pub fn hits(&self) -> &LimitHits {
        &self.hits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_entries_per_session_and_in_total() {
        let limits = Limits {
            max_queue_entries_per_session: 100,
            max_queue_entries: 150,
            ..Limits::default()
        };
        let mut q = QueueEntries::new(&limits);
        let (a, b) = (SessionId(1), SessionId(2));
        q.take(a, 60).unwrap();
        let e = q.take(a, 41).unwrap_err();
        assert_eq!(e.status, NdStatus::InsufficientResources);
        assert!(e.context.contains("--max-queue-entries-per-session"), "{e}");
        q.take(a, 40).unwrap();
        let e = q.take(b, 51).unwrap_err();
        assert!(e.context.contains("(--max-queue-entries)"), "{e}");
        q.take(b, 50).unwrap();
        assert_eq!(q.total(), 150);
        q.give(a, 60);
        q.take(b, 50).unwrap();
        q.give(b, 1000);
        assert_eq!(q.total(), 40, "only what b held is given back");
        assert_eq!(
            (q.hits().get(Limit::QueueEntriesPerSession), q.hits().get(Limit::QueueEntries)),
            (1, 1),
            "each refusal counted against its bound"
        );
    }

    #[test]
    fn completion_queue_entries_per_session_and_in_total() {
        let limits = Limits {
            max_cq_entries_per_session: 100,
            max_cq_entries: 150,
            ..Limits::default()
        };
        let mut q = QueueEntries::of(EntryKind::CompletionQueue, &limits);
        let (a, b) = (SessionId(1), SessionId(2));
        q.take(a, 100).unwrap();
        let e = q.take(a, 1).unwrap_err();
        assert_eq!(e.status, NdStatus::InsufficientResources);
        assert!(e.context.contains("completion-queue entries"), "{e}");
        assert!(e.context.contains("--max-cq-entries-per-session"), "{e}");
        let e = q.take(b, 51).unwrap_err();
        assert!(e.context.contains("(--max-cq-entries)"), "{e}");
        q.give_all(a);
        q.take(b, 100).unwrap();
        assert_eq!(q.total(), 100);
        assert_eq!(
            (q.hits().get(Limit::CqEntriesPerSession), q.hits().get(Limit::CqEntries)),
            (1, 1)
        );
        assert_eq!(q.hits().get(Limit::QueueEntriesPerSession), 0);
    }

    #[test]
    fn default_cq_bounds_hold_deep_queues() {
        let l = Limits::default();
        let deepest = u64::from(MAX_COMPLETION_QUEUE_DEPTH);
        assert!(l.max_cq_entries_per_session >= 5 * deepest);
        assert!(l.max_cq_entries_per_session >= 64 * 262_144, "64 of libfabric RxM's default CQ");
        assert!(l.max_cq_entries >= l.max_cq_entries_per_session);
    }

    #[test]
    fn per_session_ports_stay_well_below_the_descriptor_limit() {
        let mut l = Limits::default();
        assert_eq!(
            l.fit_descriptors(524_288),
            16_384,
            "a high limit leaves the default"
        );
        assert_eq!(l.fit_descriptors(20_000), 5_000);
        assert_eq!(l.fit_descriptors(3), 1, "never 0");
    }
}
