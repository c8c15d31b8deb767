//! The daemon's side of the shared-memory rings (`crate::rings`) of the queue pairs it runs (XDP mode,
//! `--data-path daemon`): per queue pair a [`QpRingReader`], per completion queue a [`CqRingWriter`] and
//! its completion doorbell, per session one doorbell the client rings for all of its rings (a queue pair's
//! new work, room in a completion ring), watched by one small task that wakes the event loop.
//!
//! Descriptors: the rings' memfds are passed to the client and closed here (the mappings stay), so the
//! daemon holds one eventfd per session with rings and one per completion queue, whatever the number of
//! queue pairs; both, and the rings' bytes, count against [`Limits`] (INSUFFICIENT_RESOURCES past them).
//!
//! While the event loop spins (`--xdp-busy-poll-us`), the queue pairs that posted since it was last idle
//! (at most [`MAX_HOT`]) have their need-wakeup flags clear and are polled on every pass; the others keep
//! theirs, and their clients ring as usual.
//!
//! Everything a client writes in its rings is untrusted: a reader's [`RingFault`] moves that queue pair to
//! Error with the fault's status (`Rnic::fail_queue_pair`); the session's other queue pairs and
//! every other session carry on. A completion ring whose consumer index the client scribbled over stops
//! taking completions (they are dropped, logged once).

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::engine::limits::{Limit, LimitHits, Limits};
use crate::engine::requests::SessionId;
use crate::engine::rnic::Rnic;
use crate::engine::verbs::{Completion, CompletionQueueId, QueuePairConfig, QueuePairId, WorkRequest};
use crate::error::{Error, NdStatus};
use crate::rings::cq::{self, CqRingWriter};
use crate::rings::doorbell::Doorbell;
use crate::rings::qp::{QpRingLayout, QpRingReader};
use crate::rings::{RingError, RingFault};
use crate::shm::SharedMemory;

/// Work requests taken from one ring per pass.
const DRAIN_BATCH: u32 = 256;
/// Passes over one queue pair per wake-up before the others (and other sessions) get their turn: a client
/// that keeps posting is drained again on the next wake-up the event loop queues itself.
const MAX_PASSES: u32 = 8;
/// Queue pairs the event loop's spin polls at most: those that posted since the loop was last idle. The
/// others keep their need-wakeup flags (their clients ring), so a spinning pass costs the same with ten
/// thousand idle queue pairs as with one.
const MAX_HOT: usize = 64;

/// A session's doorbell, as `AsyncFd` watches it.
struct Bell(Arc<Doorbell>);

impl AsRawFd for Bell {
    fn as_raw_fd(&self) -> RawFd {
        self.0.fd().as_raw_fd()
    }
}

struct QpRings {
    reader: QpRingReader,
    bytes: u64,
}

struct CqRings {
    writer: CqRingWriter,
    /// Rung when the client sleeps on an empty ring and completions arrive.
    doorbell: Doorbell,
    bytes: u64,
    /// The fault was logged.
    reported: bool,
}

struct SessionRings {
    doorbell: Arc<Doorbell>,
    watcher: tokio::task::JoinHandle<()>,
    qps: HashMap<QueuePairId, QpRings>,
    cqs: HashMap<CompletionQueueId, CqRings>,
    bytes: u64,
    /// Completions waiting for room in its completion rings (the client does not poll).
    overflow: u64,
}

impl SessionRings {
    fn doorbells(&self) -> usize {
        1 + self.cqs.len()
    }
}

impl Drop for SessionRings {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

/// Every session's rings.
pub(super) struct Rings {
    sessions: HashMap<SessionId, SessionRings>,
    /// Where the doorbell watchers send the session whose doorbell rang.
    wake: mpsc::UnboundedSender<SessionId>,
    limits: Limits,
    max_transfer_length: u32,
    bytes: u64,
    doorbells: usize,
    /// Completions waiting for room, all sessions together.
    overflow: u64,
    scratch: Vec<WorkRequest>,
    /// The event loop spins (`--xdp-busy-poll-us`): the hot queue pairs' need-wakeup flags are clear and
    /// their rings are polled on every pass ([`Rings::poll_awake`]) until [`Rings::sleep`].
    awake: bool,
    /// Queue pairs that posted since the event loop was last idle (at most [`MAX_HOT`]): the ones its spin
    /// polls.
    hot: Vec<(SessionId, QueuePairId)>,
    /// How often the ring and doorbell bounds refused a create.
    hits: LimitHits,
}

fn insufficient(what: String) -> Error {
    Error::new(NdStatus::InsufficientResources, what)
}

fn ring_error(e: RingError) -> Error {
    insufficient(format!("cannot set up the shared rings: {e}"))
}

fn dup(d: &Doorbell) -> Result<OwnedFd, Error> {
    d.try_clone_fd().map_err(|e| {
        insufficient(format!(
            "cannot duplicate a doorbell (out of file descriptors?): {e}"
        ))
    })
}

impl Rings {
    /// No rings yet; doorbell watchers report to `wake`.
    pub(super) fn new(
        limits: Limits,
        max_transfer_length: u32,
        wake: mpsc::UnboundedSender<SessionId>,
    ) -> Self {
        Rings {
            sessions: HashMap::new(),
            wake,
            limits,
            max_transfer_length,
            bytes: 0,
            doorbells: 0,
            overflow: 0,
            scratch: Vec::new(),
            awake: false,
            hot: Vec::new(),
            hits: LimitHits::default(),
        }
    }

    /// Bytes of rings and doorbells held, all sessions together.
    #[cfg(test)]
    fn held(&self) -> (u64, usize) {
        (self.bytes, self.doorbells)
    }

    /// How often the ring and doorbell bounds refused a create.
    pub(super) fn limit_hits(&self) -> &LimitHits {
        &self.hits
    }

    /// Checks that `session` may take `bytes` more of rings and `doorbells` more doorbells (its own
    /// doorbell included if it has none yet).
    fn admit(&self, session: SessionId, bytes: u64, doorbells: usize) -> Result<(), Error> {
        let (held_bytes, held_bells) = self
            .sessions
            .get(&session)
            .map_or((0, 0), |s| (s.bytes, s.doorbells()));
        let bells = doorbells + usize::from(!self.sessions.contains_key(&session));
        let l = &self.limits;
        if held_bytes + bytes > l.max_ring_bytes_per_session {
            self.hits.hit(Limit::RingBytesPerSession);
            return Err(insufficient(format!(
                "the session's shared rings would take {} bytes, past its bound of {} (max_ring_bytes_per_session)",
                held_bytes + bytes,
                l.max_ring_bytes_per_session
            )));
        }
        if self.bytes + bytes > l.max_ring_bytes {
            self.hits.hit(Limit::RingBytes);
            return Err(insufficient(format!(
                "soft-rdmad's shared rings would take {} bytes, past its bound of {} (max_ring_bytes)",
                self.bytes + bytes,
                l.max_ring_bytes
            )));
        }
        if held_bells + bells > l.max_doorbells_per_session {
            self.hits.hit(Limit::DoorbellsPerSession);
            return Err(insufficient(format!(
                "the session would hold {} doorbells, past its bound of {} (max_doorbells_per_session)",
                held_bells + bells,
                l.max_doorbells_per_session
            )));
        }
        if self.doorbells + bells > l.max_doorbells {
            self.hits.hit(Limit::Doorbells);
            return Err(insufficient(format!(
                "soft-rdmad would hold {} doorbells, past its bound of {} (max_doorbells)",
                self.doorbells + bells,
                l.max_doorbells
            )));
        }
        Ok(())
    }

    /// The session's rings, with its doorbell and the task that watches it (made on first use).
    fn session(&mut self, session: SessionId) -> Result<&mut SessionRings, Error> {
        if !self.sessions.contains_key(&session) {
            let doorbell = Arc::new(
                Doorbell::new().map_err(|e| insufficient(format!("cannot create a doorbell: {e}")))?,
            );
            // SAFETY: `Bell` holds the doorbell (an Arc of its owned eventfd), so the descriptor stays open
            // and the same for the AsyncFd's life.
            let fd = unsafe {
                AsyncFd::register_with_interest(Bell(doorbell.clone()), tokio::io::Interest::READABLE)
            }
            .map_err(|e| insufficient(format!("cannot watch a doorbell: {e}")))?;
            let wake = self.wake.clone();
            let watcher = tokio::spawn(async move {
                loop {
                    let Ok(mut ready) = fd.readable().await else {
                        return;
                    };
                    let _ = fd.get_ref().0.drain();
                    ready.clear_ready();
                    if wake.send(session).is_err() {
                        return;
                    }
                }
            });
            self.doorbells += 1;
            self.sessions.insert(
                session,
                SessionRings {
                    doorbell,
                    watcher,
                    qps: HashMap::new(),
                    cqs: HashMap::new(),
                    bytes: 0,
                    overflow: 0,
                },
            );
        }
        Ok(self.sessions.get_mut(&session).expect("inserted above"))
    }

    /// A new queue pair's rings: the descriptors its CreateQueuePair answer carries (the rings' memfd, the
    /// session's doorbell: `ServerMessage::fds_expected`).
    pub(super) fn create_qp(
        &mut self,
        session: SessionId,
        qp: QueuePairId,
        config: &QueuePairConfig,
    ) -> Result<Vec<OwnedFd>, Error> {
        let layout = QpRingLayout::new(config.send_depth, config.receive_depth).map_err(ring_error)?;
        let bytes = layout.bytes() as u64;
        self.admit(session, bytes, 0)?;
        let mut mem = layout.create().map_err(ring_error)?;
        let memfd = take_fd(&mut mem)?;
        let mut reader =
            QpRingReader::new(mem, layout, config, self.max_transfer_length).map_err(ring_error)?;
        // Asleep from the start: the client's first publish rings the doorbell (and makes it hot).
        reader.prepare_sleep().map_err(|f| ring_error(f.error))?;
        let s = self.session(session)?;
        let bell = dup(&s.doorbell)?;
        s.qps.insert(qp, QpRings { reader, bytes });
        s.bytes += bytes;
        self.bytes += bytes;
        Ok(vec![memfd, bell])
    }

    /// A new completion queue's ring: the descriptors its CreateCompletionQueue answer carries (the ring's
    /// memfd, its completion doorbell, the session's doorbell).
    pub(super) fn create_cq(
        &mut self,
        session: SessionId,
        cq: CompletionQueueId,
        depth: u32,
    ) -> Result<Vec<OwnedFd>, Error> {
        let g = cq::geometry(depth).map_err(ring_error)?;
        let bytes = cq::bytes(g) as u64;
        self.admit(session, bytes, 1)?;
        let (memfd, writer) = CqRingWriter::create_passing_fd(g).map_err(ring_error)?;
        let doorbell = Doorbell::new().map_err(|e| insufficient(format!("cannot create a doorbell: {e}")))?;
        let completion_bell = dup(&doorbell)?;
        let s = self.session(session)?;
        let session_bell = dup(&s.doorbell)?;
        s.cqs.insert(
            cq,
            CqRings {
                writer,
                doorbell,
                bytes,
                reported: false,
            },
        );
        s.bytes += bytes;
        self.bytes += bytes;
        self.doorbells += 1;
        Ok(vec![memfd, completion_bell, session_bell])
    }

    /// The queue pair was closed: its rings go (drain it first, [`Rings::drain_qp`]).
    pub(super) fn close_qp(&mut self, session: SessionId, qp: QueuePairId) {
        self.hot.retain(|&h| h != (session, qp));
        if let Some(s) = self.sessions.get_mut(&session)
            && let Some(q) = s.qps.remove(&qp)
        {
            s.bytes -= q.bytes;
            self.bytes -= q.bytes;
        }
    }

    pub(super) fn close_cq(&mut self, session: SessionId, cq: CompletionQueueId) {
        if let Some(s) = self.sessions.get_mut(&session)
            && let Some(c) = s.cqs.remove(&cq)
        {
            s.bytes -= c.bytes;
            self.bytes -= c.bytes;
            self.doorbells -= 1;
            let waiting = c.writer.overflowed() as u64;
            s.overflow -= waiting;
            self.overflow -= waiting;
        }
    }

    /// The session ended: every ring and doorbell of it goes.
    pub(super) fn close_session(&mut self, session: SessionId) {
        self.hot.retain(|&(s, _)| s != session);
        if let Some(s) = self.sessions.remove(&session) {
            self.bytes -= s.bytes;
            self.doorbells -= s.doorbells();
            self.overflow -= s.overflow;
        }
    }

    /// Posts what the client wrote in `qp`'s rings (before a request that must see it: Connect, Accept,
    /// CloseQueuePair).
    pub(super) fn drain_qp(&mut self, rnic: &mut Rnic, session: SessionId, qp: QueuePairId) {
        if self.held_back(session) {
            return;
        }
        let Some(s) = self.sessions.get_mut(&session) else {
            return;
        };
        let Some(q) = s.qps.get_mut(&qp) else { return };
        if drain(rnic, session, qp, q, &mut self.scratch).again {
            let _ = self.wake.send(session);
        }
    }

    /// Completions wait for room past the bounds on what may be outstanding
    /// (`max_queue_entries_per_session`, `max_queue_entries`): the client does not poll its completion
    /// queues. Its rings are then not read (the way a session that does not read its answers is not read
    /// from) until it takes completions and rings the session's doorbell.
    fn held_back(&self, session: SessionId) -> bool {
        let waiting = self.sessions.get(&session).map_or(0, |s| s.overflow);
        waiting >= self.limits.max_queue_entries_per_session || self.overflow >= self.limits.max_queue_entries
    }

    /// The session's doorbell rang: writes completions that waited for room in its completion rings, then
    /// posts what its queue pairs' rings hold (unless [`Rings::held_back`]).
    pub(super) fn woken(&mut self, rnic: &mut Rnic, session: SessionId) {
        let Some(s) = self.sessions.get_mut(&session) else {
            return;
        };
        for (id, c) in s.cqs.iter_mut() {
            let before = c.writer.overflowed() as u64;
            if before > 0 {
                flush_counted(session, *id, c, before, &mut s.overflow, &mut self.overflow);
            }
        }
        if self.held_back(session) {
            crate::warn_limited!(
                session = session.0,
                "the client takes no completions: its queue pairs' rings wait"
            );
            return;
        }
        let Some(s) = self.sessions.get_mut(&session) else {
            return;
        };
        let mut again = false;
        for (qp, q) in s.qps.iter_mut() {
            let d = drain(rnic, session, *qp, q, &mut self.scratch);
            again |= d.again;
            if d.posted && self.hot.len() < MAX_HOT && !self.hot.contains(&(session, *qp)) {
                self.hot.push((session, *qp));
                if self.awake {
                    // The loop spins: this one is polled from now on, its client stops ringing.
                    q.reader.awake();
                }
            }
        }
        if again {
            let _ = self.wake.send(session);
        }
    }

    /// A pass of the event loop's spin: posts what the hot queue pairs' rings hold, without doorbells (the
    /// first pass clears their need-wakeup flags, so their clients stop ringing). A session held back
    /// ([`Rings::held_back`]) is skipped. True: something was posted.
    pub(super) fn poll_awake(&mut self, rnic: &mut Rnic) -> bool {
        let first = !self.awake;
        self.awake = true;
        let mut posted = false;
        for i in 0..self.hot.len() {
            let (session, qp) = self.hot[i];
            if self.held_back(session) {
                continue;
            }
            let Some(q) = self.sessions.get_mut(&session).and_then(|s| s.qps.get_mut(&qp)) else {
                continue;
            };
            if q.reader.fault().is_some() {
                continue;
            }
            if first {
                q.reader.awake();
            }
            posted |= drain_awake(rnic, session, qp, q, &mut self.scratch);
        }
        posted
    }

    /// The event loop goes idle: the spin (if any) ended, so the hot queue pairs' need-wakeup flags are set
    /// again (what arrived meanwhile is posted first, [`drain`]), and nothing is hot any more. True: the loop
    /// was spinning, and the engine may have new output.
    pub(super) fn sleep(&mut self, rnic: &mut Rnic) -> bool {
        let hot = std::mem::take(&mut self.hot);
        if !std::mem::take(&mut self.awake) {
            return false;
        }
        for (session, qp) in hot {
            let Some(q) = self.sessions.get_mut(&session).and_then(|s| s.qps.get_mut(&qp)) else {
                continue;
            };
            if drain(rnic, session, qp, q, &mut self.scratch).again {
                let _ = self.wake.send(session);
            }
        }
        true
    }

    /// Completions for a completion queue: written to its ring (the client's doorbell rung if it sleeps).
    /// A queue without a ring (closed meanwhile) drops them.
    pub(super) fn complete(&mut self, session: SessionId, cq: CompletionQueueId, entries: Vec<Completion>) {
        let Some(s) = self.sessions.get_mut(&session) else {
            return;
        };
        let Some(c) = s.cqs.get_mut(&cq) else {
            debug!(
                session = session.0,
                cq = cq.0,
                n = entries.len(),
                "completions for a closed completion queue dropped"
            );
            return;
        };
        if c.writer.fault().is_some() {
            return;
        }
        let before = c.writer.overflowed() as u64;
        for e in entries {
            c.writer.push(e);
        }
        flush_counted(session, cq, c, before, &mut s.overflow, &mut self.overflow);
    }
}

fn take_fd(mem: &mut Arc<SharedMemory>) -> Result<OwnedFd, Error> {
    Arc::get_mut(mem)
        .and_then(SharedMemory::take_fd)
        .ok_or_else(|| Error::new(NdStatus::Unsuccessful, "the rings' memfd is shared already"))
}

/// [`flush`], keeping the session's and the daemon's counts of completions waiting for room up to date:
/// `before` is what they count of `c`'s (its waiting completions when they were last counted).
fn flush_counted(
    session: SessionId,
    cq: CompletionQueueId,
    c: &mut CqRings,
    before: u64,
    session_overflow: &mut u64,
    overflow: &mut u64,
) {
    flush(session, cq, c);
    let after = c.writer.overflowed() as u64;
    *session_overflow = *session_overflow - before + after;
    *overflow = *overflow - before + after;
}

/// Writes what fits of `c`'s completions; rings the client's doorbell if it sleeps.
fn flush(session: SessionId, cq: CompletionQueueId, c: &mut CqRings) {
    match c.writer.flush() {
        Ok(true) => {
            if let Err(e) = c.doorbell.ring() {
                warn!(session = session.0, cq = cq.0, error = %e, "ringing a completion doorbell failed");
            }
        }
        Ok(false) => {}
        Err(fault) => {
            if !c.reported {
                c.reported = true;
                crate::warn_limited!(session = session.0, cq = cq.0, %fault, "completion ring faulted: its completions are dropped");
            }
        }
    }
}

/// What [`drain`] did.
#[derive(Clone, Copy, Debug, Default)]
struct DrainOutcome {
    /// Entries are left: drain again later.
    again: bool,
    /// Work requests were posted.
    posted: bool,
}

/// Posts what `q`'s rings hold until they are empty and asleep, or a fault (the queue pair goes to Error),
/// or [`MAX_PASSES`].
fn drain(
    rnic: &mut Rnic,
    session: SessionId,
    qp: QueuePairId,
    q: &mut QpRings,
    scratch: &mut Vec<WorkRequest>,
) -> DrainOutcome {
    let mut out = DrainOutcome::default();
    if q.reader.fault().is_some() {
        return out;
    }
    for _ in 0..MAX_PASSES {
        match post_batch(rnic, session, qp, q, scratch, &mut out.posted) {
            Err(Faulted) => return out,
            Ok(true) => continue,
            Ok(false) => {}
        }
        match q.reader.prepare_sleep() {
            Ok(true) => return out,
            Ok(false) => {}
            Err(fault) => {
                ring_fault(rnic, session, qp, &fault);
                return out;
            }
        }
    }
    out.again = true;
    out
}

/// One batch of what `q`'s rings hold, leaving the need-wakeup flags alone (the event loop spins). True:
/// something was posted.
fn drain_awake(
    rnic: &mut Rnic,
    session: SessionId,
    qp: QueuePairId,
    q: &mut QpRings,
    scratch: &mut Vec<WorkRequest>,
) -> bool {
    let mut posted = false;
    let _ = post_batch(rnic, session, qp, q, scratch, &mut posted);
    posted
}

/// The ring faulted; the queue pair went to Error.
struct Faulted;

/// Posts one batch ([`DRAIN_BATCH`]) of what `q`'s rings hold (`posted` set if any). Ok(true): entries are
/// left.
fn post_batch(
    rnic: &mut Rnic,
    session: SessionId,
    qp: QueuePairId,
    q: &mut QpRings,
    scratch: &mut Vec<WorkRequest>,
    posted: &mut bool,
) -> Result<bool, Faulted> {
    scratch.clear();
    let r = q.reader.drain(DRAIN_BATCH, scratch);
    if !scratch.is_empty() {
        *posted = true;
        // The queue pair is this session's (the rings exist only while it does). Requests taken before a
        // fault are posted, so they complete as flushed.
        let _ = rnic.post(session, qp, std::mem::take(scratch));
    }
    match r {
        Ok(d) => Ok(d.more),
        Err(fault) => {
            ring_fault(rnic, session, qp, &fault);
            Err(Faulted)
        }
    }
}

fn ring_fault(rnic: &mut Rnic, session: SessionId, qp: QueuePairId, fault: &RingFault) {
    crate::warn_limited!(session = session.0, qp = qp.0, %fault, "malformed shared ring: the queue pair goes to Error");
    let _ = rnic.fail_queue_pair(session, qp, fault.status());
}

#[cfg(test)]
#[path = "rings_tests.rs"]
mod tests;
