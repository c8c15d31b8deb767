//! Where a completion queue's completions wait for the application, whichever data path made them: those
//! completed in this process (the in-process data path's, and requests a daemon-run queue pair's ring
//! refused) are pushed into a queue; a daemon-run completion queue's are read from its shared ring, which
//! soft-rdmad writes and whose doorbell it rings only while this side sleeps. [`CqState`] polls and waits on
//! both, so that one completion-queue type ([`super::CompletionQueue`]) serves both data paths.
//!
//! The awaitable calls ([`super::QueuePair::write_async`] and its siblings) post with a work-request id
//! from [`RESERVED_IDS`], which an application cannot post, and wait for that request's completion alone
//! ([`PendingCompletion`]). Wherever a completion leaves the queue's state (pushed in this process, or read
//! from the ring by whoever polls or waits), one with a reserved id goes to its waiter, waking that task
//! only; the application's poll, wait and stream never see it, and see everything else as before. No task
//! or thread of its own: the waiter is woken by the push that delivers its completion, or, on the
//! daemon-run path, drains the ring itself as `wait` does.
//!
//! On the daemon-run path, several tasks may wait on one queue (two awaitable calls joined, or one beside
//! the application's `wait`). The ring's need-wakeup flag is one bit, which a task that stopped waiting
//! would clear under one still asleep; so one task at a time sleeps on the doorbell ([`Sleeper`]), and the
//! others follow it: it delivers their completions as it drains the ring, and wakes them to take over when
//! it leaves.

use std::collections::VecDeque;

use foldhash::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::sync::{Notify, oneshot};

use super::{Inner, device_removed};
use crate::engine::verbs::{Completion, CompletionOp, CompletionQueueId, QueuePairId};
use crate::error::{Error, NdStatus, Result};
use crate::rings::SpinConfig;
use crate::rings::cq::CqRingReader;
use crate::rings::doorbell::Doorbell;
use crate::rings::shared::RingGeometry;
use crate::shm::SharedMemory;

/// The environment variable that sets the spin of daemon-run completion queues
/// ([`super::CompletionQueue::set_spin`]) when they are created: rounds of polling before sleeping. Unset or
/// unparsable: 0.
pub const CQ_SPIN_ENV: &str = "SOFT_RDMA_CQ_SPIN";

fn spins_from_env() -> u32 {
    std::env::var(CQ_SPIN_ENV)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// A doorbell, as `AsyncFd` watches it.
struct Bell(Doorbell);

impl std::os::fd::AsRawFd for Bell {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.fd().as_raw_fd()
    }
}

/// A daemon-run completion queue's ring.
pub(super) struct CqRing {
    reader: Mutex<CqRingReader>,
    /// Rung by soft-rdmad when completions arrive while this side sleeps.
    doorbell: tokio::io::unix::AsyncFd<Bell>,
    /// Rung when soft-rdmad waits for room in the ring.
    session_bell: Arc<Doorbell>,
    /// The ring was found malformed (soft-rdmad never writes one): reported to every waiter.
    fault: Mutex<Option<Error>>,
    /// [`SpinConfig::spins`] before [`CqState::wait`] sleeps.
    spins: AtomicU32,
    /// A task sleeps on the doorbell ([`Sleeper`]). The ring's need-wakeup flag is one bit, so one task at a
    /// time sets and clears it; the others wait for that one to deliver their completions or to leave.
    sleeper: AtomicBool,
}

impl CqRing {
    /// Reads the ring mapped at `mem` (geometry `g`), sleeping on `doorbell`; `session_bell` is soft-rdmad's.
    pub(super) fn attach(
        mem: Arc<SharedMemory>,
        g: RingGeometry,
        doorbell: Doorbell,
        session_bell: Arc<Doorbell>,
    ) -> Result<CqRing> {
        let reader = CqRingReader::attach(mem, g)?;
        let bell = Bell(doorbell);
        // SAFETY: `Bell` owns the eventfd, so it stays open and is the same descriptor for the AsyncFd's life.
        let doorbell =
            unsafe { tokio::io::unix::AsyncFd::register_with_interest(bell, tokio::io::Interest::READABLE) }
                .map_err(|e| {
                    Error::new(
                        NdStatus::InsufficientResources,
                        format!("cannot watch the completion doorbell: {e}"),
                    )
                })?;
        Ok(CqRing {
            reader: Mutex::new(reader),
            doorbell,
            session_bell,
            fault: Mutex::new(None),
            spins: AtomicU32::new(spins_from_env()),
            sleeper: AtomicBool::new(false),
        })
    }

    /// The right to sleep on the doorbell, unless another task holds it.
    fn try_sleeper<'a>(&'a self, state: &'a CqState) -> Option<Sleeper<'a>> {
        self.sleeper
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        Some(Sleeper { ring: self, state })
    }

    /// Sleeps on the doorbell (its holder only) until soft-rdmad rings it or `woken` completes, unless
    /// completions arrived since the ring was last polled. The need-wakeup flag is set only meanwhile.
    async fn sleep(&self, _holder: &Sleeper<'_>, woken: impl Future<Output = ()>) -> Result<()> {
        if self.set_need_wakeup()? {
            tokio::select! {
                () = woken => {}
                ready = self.doorbell.readable() => {
                    if let Ok(mut ready) = ready {
                        let _ = ready.get_inner().0.drain();
                        ready.clear_ready();
                    }
                }
            }
        }
        self.reader.lock().expect("not poisoned").awake();
        Ok(())
    }

    /// [`Self::sleep`] for a program's thread: it blocks in poll(2) on the doorbell itself, at most
    /// `timeout`. Rung or not, the next poll says what is there; a failed poll(2) is a sleep cut short.
    fn sleep_blocking(&self, _holder: &Sleeper<'_>, timeout: std::time::Duration) -> Result<()> {
        if self.set_need_wakeup()? {
            let bell = &self.doorbell.get_ref().0;
            if bell.wait(Some(timeout)).unwrap_or(false) {
                let _ = bell.drain();
            }
        }
        self.reader.lock().expect("not poisoned").awake();
        Ok(())
    }

    /// Sets the ring's need-wakeup flag, so that soft-rdmad rings the doorbell for the next completion:
    /// false (flag not set) when completions arrived since the ring was last polled, and the caller polls
    /// instead of sleeping; the ring's fault when it is malformed.
    fn set_need_wakeup(&self) -> Result<bool> {
        let asleep = self.reader.lock().expect("not poisoned").prepare_sleep();
        asleep.map_err(|fault| fault.to_error())
    }
}

/// The right to sleep on a daemon-run queue's doorbell, held by one waiting task while it waits. Given up
/// when that task has what it waited for (or is dropped): the flag is cleared, and the other waiters wake
/// to take it over.
struct Sleeper<'a> {
    ring: &'a CqRing,
    state: &'a CqState,
}

impl Drop for Sleeper<'_> {
    fn drop(&mut self) {
        self.ring.reader.lock().expect("not poisoned").awake();
        self.ring.sleeper.store(false, Ordering::Release);
        self.state.notify.notify_waiters();
    }
}

/// The work-request ids the awaitable calls post with: from 2^63 up. [`super::QueuePair::post`] refuses
/// them, so that a completion with one is always an awaitable call's.
pub(super) const RESERVED_IDS: std::ops::RangeFrom<u64> = 1 << 63..;

fn is_reserved(wr_id: u64) -> bool {
    wr_id >= RESERVED_IDS.start
}

/// The awaitable calls' requests not yet completed, by work-request id.
#[derive(Default)]
struct Awaited {
    waiters: HashMap<u64, oneshot::Sender<Completion>>,
    /// soft-rdmad went away: the waiters were dropped (their calls fail with DEVICE_REMOVED), and no new one
    /// is taken.
    closed: bool,
}

/// One completion queue's completions: those completed in this process (kernel mode's data path, requests
/// refused before they reached a ring) in `queue`, and, for a daemon-run queue, those in its shared ring;
/// and the awaitable calls waiting for theirs.
#[derive(Default)]
pub(super) struct CqState {
    pub(super) queue: Mutex<VecDeque<Completion>>,
    pub(super) notify: Notify,
    pub(super) ring: Option<CqRing>,
    awaited: Mutex<Awaited>,
    /// The next reserved id's low bits.
    next_reserved: AtomicU64,
    /// Polls that returned completions, however they were made (a poll, a wait, the stream): tells a spin
    /// on `poll` from a poll before a wait ([`super::CompletionQueue::poll`]).
    pub(super) takes: AtomicU64,
    /// The notification armed on a queue completed in this process ([`Self::arm`]): fired by the push that
    /// delivers a completion it counts, on the pushing thread.
    armed: Mutex<Option<Armed>>,
}

/// A notification armed with [`CqState::arm`] (rdma-core `ibv_req_notify_cq`).
struct Armed {
    solicited_only: bool,
    notify: Arc<dyn Fn() + Send + Sync>,
}

impl Armed {
    /// Whether `c` fires it: any completion, or only a Receive of a solicited Send or a failed request
    /// (`ibv_req_notify_cq(cq, 1)`, `infiniband/verbs.h`).
    fn counts(&self, c: &Completion) -> bool {
        !self.solicited_only || c.solicited || c.status != NdStatus::Success
    }
}

impl CqState {
    /// A queue whose completions are pushed in this process and, for a daemon-run one, read from `ring`.
    pub(super) fn new(ring: Option<CqRing>) -> Self {
        CqState {
            ring,
            ..CqState::default()
        }
    }

    pub(super) fn push(&self, mut entries: Vec<Completion>) {
        self.route(&mut entries);
        if entries.is_empty() {
            return;
        }
        // Queued under the armed lock: an arm is either seen here, or made after the entries are queued,
        // where the program's poll after arming finds them.
        let fired = {
            let mut armed = self.armed.lock().expect("not poisoned");
            let due = armed
                .as_ref()
                .is_some_and(|a| entries.iter().any(|c| a.counts(c)));
            self.queue.lock().expect("not poisoned").extend(entries);
            if due { armed.take() } else { None }
        };
        self.notify.notify_waiters();
        if let Some(a) = fired {
            (a.notify)();
        }
    }

    /// Arms the notification of a queue completed in this process: `notify` is called once, by the next
    /// push of a completion it counts (on the pushing thread: the connection's driver, the progress thread,
    /// a poller or a poster), or when soft-rdmad goes away; completions queued already do not fire it, as
    /// siw's `siw_req_notify_cq` fires on the next CQE only (a program arms, then polls until empty, then
    /// waits). No task and no other thread: a program sleeping on its completion channel wakes one hand-off
    /// after its completion is made. Arming again replaces an armed notification that has not fired (siw
    /// keeps one flag per CQ).
    pub(super) fn arm(&self, solicited_only: bool, notify: Arc<dyn Fn() + Send + Sync>) {
        debug_assert!(
            self.ring.is_none(),
            "a daemon-run queue's notification waits on its doorbell"
        );
        *self.armed.lock().expect("not poisoned") = Some(Armed {
            solicited_only,
            notify,
        });
        if self.awaited.lock().expect("not poisoned").closed {
            self.fire();
        }
    }

    /// Calls the armed notification, if any, once.
    fn fire(&self) {
        let armed = self.armed.lock().expect("not poisoned").take();
        if let Some(a) = armed {
            (a.notify)();
        }
    }

    /// Hands the completions of awaitable calls among `entries` to their waiters and leaves the rest.
    fn route(&self, entries: &mut Vec<Completion>) {
        if !entries.iter().any(|c| is_reserved(c.wr_id)) {
            return;
        }
        let mut routed = Vec::new();
        {
            let mut awaited = self.awaited.lock().expect("not poisoned");
            entries.retain_mut(|c| {
                if !is_reserved(c.wr_id) {
                    return true;
                }
                match awaited.waiters.remove(&c.wr_id) {
                    Some(waiter) => routed.push((waiter, c.clone())),
                    // Its waiter is gone with the session (DEVICE_REMOVED); nobody else may see it.
                    None => tracing::trace!(wr = c.wr_id, "completion of an abandoned awaitable call"),
                }
                false
            });
        }
        for (waiter, c) in routed {
            // A call whose future was dropped no longer listens: its completion is discarded.
            let _ = waiter.send(c);
        }
    }

    /// A reserved work-request id and the receiver its completion will be routed to. DEVICE_REMOVED once
    /// soft-rdmad is gone.
    pub(super) fn reserve(&self) -> Result<(u64, oneshot::Receiver<Completion>)> {
        let low = self.next_reserved.fetch_add(1, Ordering::Relaxed) & !RESERVED_IDS.start;
        let id = RESERVED_IDS.start | low;
        let (tx, rx) = oneshot::channel();
        let mut awaited = self.awaited.lock().expect("not poisoned");
        if awaited.closed {
            return Err(device_removed());
        }
        awaited.waiters.insert(id, tx);
        Ok((id, rx))
    }

    /// The reserved id `id` was not posted after all (the post failed): nobody waits for it.
    pub(super) fn unreserve(&self, id: u64) {
        self.awaited.lock().expect("not poisoned").waiters.remove(&id);
    }

    /// soft-rdmad went away: every waiter wakes, the awaitable calls with DEVICE_REMOVED.
    pub(super) fn device_removed(&self) {
        {
            let mut awaited = self.awaited.lock().expect("not poisoned");
            awaited.closed = true;
            awaited.waiters.clear();
        }
        self.notify.notify_waiters();
        self.fire();
    }

    /// Whether a successful completion of `qp` waits to be polled: in this process's queue, or (a daemon-run
    /// queue, whose ring holds completions of every queue pair) any completion in the ring.
    pub(super) fn holds_delivered(&self, qp: QueuePairId) -> bool {
        let queued = self
            .queue
            .lock()
            .expect("not poisoned")
            .iter()
            .any(|c| c.qp == qp && c.status == NdStatus::Success);
        queued
            || self
                .ring
                .as_ref()
                .is_some_and(|r| r.reader.lock().expect("not poisoned").has_entries())
    }

    /// Up to `max` completions of completion queue `cq` already delivered; never waits.
    pub(super) fn poll(&self, cq: CompletionQueueId, max: usize) -> Vec<Completion> {
        let mut out: Vec<Completion> = {
            let mut q = self.queue.lock().expect("not poisoned");
            let n = max.min(q.len());
            q.drain(..n).collect()
        };
        if let Some(ring) = &self.ring {
            // Until `max`, or the ring is empty: the awaitable calls' completions are taken out on the way.
            while out.len() < max {
                let left = u32::try_from(max - out.len()).unwrap_or(u32::MAX);
                let mut got = Vec::new();
                if !self.read_ring(ring, cq, left, &mut got) {
                    break;
                }
                self.route(&mut got);
                out.append(&mut got);
            }
        }
        if !out.is_empty() {
            self.takes.fetch_add(1, Ordering::Relaxed);
        }
        out
    }

    /// Reads up to `max` completions from `ring` into `out`: false when there were none (or the ring is
    /// malformed: recorded for the waiters).
    fn read_ring(&self, ring: &CqRing, cq: CompletionQueueId, max: u32, out: &mut Vec<Completion>) -> bool {
        let before = out.len();
        let polled = ring.reader.lock().expect("not poisoned").poll(max, out);
        match polled {
            Ok(p) if p.wake_producer => {
                let _ = ring.session_bell.ring();
            }
            Ok(_) => {}
            Err(fault) => {
                let mut f = ring.fault.lock().expect("not poisoned");
                if f.is_none() {
                    tracing::warn!(cq = cq.0, %fault, "the completion ring is malformed");
                    *f = Some(fault.to_error());
                }
            }
        }
        out.len() > before
    }

    /// Empties `ring`: the awaitable calls' completions go to their waiters, the others into the queue for
    /// the application (whose waiters wake).
    fn drain_ring(&self, ring: &CqRing, cq: CompletionQueueId) {
        let mut got = Vec::new();
        while self.read_ring(ring, cq, 64, &mut got) {}
        self.push(got);
    }

    /// Waits for the completion routed to `rx` (a reserved id's). DEVICE_REMOVED when soft-rdmad goes away
    /// first. A daemon-run queue is drained while waiting (its completions for the application queue up for
    /// it), sleeping on its doorbell as [`Self::wait`] does, or following the task that sleeps there.
    async fn wait_routed(
        &self,
        cq: CompletionQueueId,
        mut rx: oneshot::Receiver<Completion>,
    ) -> Result<Completion> {
        let Some(ring) = &self.ring else {
            return rx.await.map_err(|_| device_removed());
        };
        let mut sleeper = None;
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let mut routed = || match rx.try_recv() {
                Ok(c) => Some(Ok(c)),
                Err(oneshot::error::TryRecvError::Closed) => Some(Err(device_removed())),
                Err(oneshot::error::TryRecvError::Empty) => None,
            };
            if let Some(r) = routed() {
                return r;
            }
            self.drain_ring(ring, cq);
            if let Some(r) = routed() {
                return r;
            }
            if let Some(e) = ring.fault.lock().expect("not poisoned").clone() {
                return Err(e);
            }
            if sleeper.is_none() {
                sleeper = ring.try_sleeper(self);
            }
            let spin = SpinConfig {
                spins: ring.spins.load(Ordering::Relaxed),
            };
            if sleeper.is_some()
                && spin.spins > 0
                && spin.spin_until(|| {
                    self.drain_ring(ring, cq);
                    !rx.is_empty()
                })
            {
                continue;
            }
            let mut got = None;
            let woken = async { got = Some((&mut rx).await) };
            match &sleeper {
                Some(holder) => ring.sleep(holder, woken).await?,
                // Another task sleeps on the doorbell: it routes this call's completion here, or leaves.
                None => {
                    tokio::select! {
                        () = woken => {}
                        () = notified => {}
                    }
                }
            }
            if let Some(r) = got {
                return r.map_err(|_| device_removed());
            }
        }
    }

    /// Blocks the calling thread (a program's, never a runtime's) until a completion of a daemon-run queue
    /// may be there to poll, `timeout` passes, or the ring is found malformed: the thread sleeps in poll(2)
    /// on the doorbell itself, so that soft-rdmad's ring wakes the thread that polls, not the runtime's
    /// reactor which then has to wake it (one wake-up per nap, not two: docs/performance.md, "Completion
    /// channels"). Ok(false) when it could not sleep here: the queue is completed in this process, or
    /// another task sleeps on the doorbell (the caller waits as [`Self::ready`] does).
    pub(super) fn nap(&self, cq: CompletionQueueId, timeout: std::time::Duration) -> Result<bool> {
        let Some(ring) = &self.ring else {
            return Ok(false);
        };
        self.drain_ring(ring, cq);
        if !self.queue.lock().expect("not poisoned").is_empty() {
            return Ok(true);
        }
        if let Some(e) = ring.fault.lock().expect("not poisoned").clone() {
            return Err(e);
        }
        let Some(holder) = ring.try_sleeper(self) else {
            return Ok(false);
        };
        ring.sleep_blocking(&holder, timeout)?;
        // The doorbell is given back (other waiters wake to take it).
        drop(holder);
        Ok(true)
    }

    /// Waits until a completion of `cq` is there to poll, without taking it: a daemon-run queue's ring is
    /// drained into the queue (where [`Self::poll`] finds it first) and its doorbell slept on as
    /// [`Self::wait`] does. DEVICE_REMOVED when soft-rdmad goes away with nothing queued.
    /// `solicited_only`: only a Receive of a solicited Send, or a failed request, counts (rdma-core
    /// `ibv_req_notify_cq(cq, 1)`, `infiniband/verbs.h`).
    pub(super) async fn ready(
        &self,
        inner: &Inner,
        cq: CompletionQueueId,
        solicited_only: bool,
    ) -> Result<()> {
        let counts = |c: &Completion| !solicited_only || c.solicited || c.status != NdStatus::Success;
        self.wait_for(inner, || {
            if let Some(ring) = &self.ring {
                self.drain_ring(ring, cq);
            }
            let q = self.queue.lock().expect("not poisoned");
            q.iter().any(counts).then_some(())
        })
        .await
    }

    /// Waits for at least one completion of `cq` and returns up to `max`. DEVICE_REMOVED when the daemon
    /// goes away with nothing left to return; a daemon-run queue sleeps on its completion doorbell (after
    /// telling soft-rdmad, which rings it only then).
    pub(super) async fn wait(
        &self,
        inner: &Inner,
        cq: CompletionQueueId,
        max: usize,
    ) -> Result<Vec<Completion>> {
        self.wait_for(inner, || {
            let got = self.poll(cq, max.max(1));
            (!got.is_empty()).then_some(got)
        })
        .await
    }

    /// Waits until `take` finds what it looks for (it is tried whenever completions may have arrived): a
    /// queue completed in this process waits for its pushes; a daemon-run one sleeps on its doorbell (one
    /// waiting task holds it; the others follow), after spinning on `take` if the queue is set to spin.
    async fn wait_for<T>(&self, inner: &Inner, mut take: impl FnMut() -> Option<T>) -> Result<T> {
        let mut sleeper = None;
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(got) = take() {
                return Ok(got);
            }
            if inner.gone.load(Ordering::Acquire) {
                return Err(device_removed());
            }
            let Some(ring) = &self.ring else {
                notified.await;
                continue;
            };
            if let Some(e) = ring.fault.lock().expect("not poisoned").clone() {
                return Err(e);
            }
            if sleeper.is_none() {
                sleeper = ring.try_sleeper(self);
            }
            let Some(holder) = &sleeper else {
                // Another task sleeps on the doorbell: it hands over when it leaves.
                notified.await;
                continue;
            };
            let spin = SpinConfig {
                spins: ring.spins.load(Ordering::Relaxed),
            };
            if spin.spins > 0 {
                let mut got = None;
                if spin.spin_until(|| {
                    got = take();
                    got.is_some()
                }) && let Some(got) = got
                {
                    return Ok(got);
                }
            }
            ring.sleep(holder, notified).await?;
        }
    }

    /// Sets a daemon-run queue's spin before [`Self::wait`] sleeps; nothing for one filled in this process.
    pub(super) fn set_spin(&self, spin: SpinConfig) {
        if let Some(ring) = &self.ring {
            ring.spins.store(spin.spins, Ordering::Relaxed);
        }
    }
}

/// The completion of one request an awaitable call posted ([`super::QueuePair::send_async`],
/// [`write_async`](super::QueuePair::write_async), [`read_async`](super::QueuePair::read_async),
/// [`receive_async`](super::QueuePair::receive_async)): a future of its [`Completion`], `Ok` when the request
/// succeeded, an error with the completion's status when it did not.
///
/// The request is posted by the call itself, not when this is first polled: a Receive taken before
/// [`super::Connector::accept_qp`] is ready for the peer's first Send. Dropping this does not cancel the
/// request (an RDMA operation cannot be called back); its completion is then discarded. Neither
/// [`super::CompletionQueue::poll`] nor its other ways of delivering ever return it.
#[must_use = "the request is posted already; await this for its completion"]
pub struct PendingCompletion {
    state: Pending,
}

enum Pending {
    /// Refused before it was posted; taken when polled.
    Refused(Option<Error>),
    Waiting(Pin<Box<dyn Future<Output = Result<Completion>> + Send>>),
}

impl PendingCompletion {
    /// A call refused before anything was posted: resolves to `error` at once.
    pub(super) fn refused(error: Error) -> Self {
        PendingCompletion {
            state: Pending::Refused(Some(error)),
        }
    }

    /// The request posted with the id `rx` was reserved for, completing on `cq` (whose state is `state`).
    pub(super) fn waiting(
        state: Arc<CqState>,
        cq: CompletionQueueId,
        rx: oneshot::Receiver<Completion>,
    ) -> Self {
        let wait = async move {
            let c = state.wait_routed(cq, rx).await?;
            if c.status == NdStatus::Success {
                Ok(c)
            } else {
                Err(failed(&c))
            }
        };
        PendingCompletion {
            state: Pending::Waiting(Box::pin(wait)),
        }
    }
}

impl Future for PendingCompletion {
    type Output = Result<Completion>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Completion>> {
        match &mut self.get_mut().state {
            Pending::Refused(error) => Poll::Ready(Err(error
                .take()
                .expect("a PendingCompletion is not polled again once it completed"))),
            Pending::Waiting(wait) => wait.as_mut().poll(cx),
        }
    }
}

impl std::fmt::Debug for PendingCompletion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            Pending::Refused(_) => "refused",
            Pending::Waiting(_) => "waiting",
        };
        f.debug_struct("PendingCompletion")
            .field("state", &state)
            .finish()
    }
}

/// The error an awaitable call resolves to when its request completed with `c.status`, not SUCCESS.
fn failed(c: &Completion) -> Error {
    let op = match c.op {
        CompletionOp::Send => "Send",
        CompletionOp::Write => "RDMA Write",
        CompletionOp::Read => "RDMA Read",
        CompletionOp::Receive => "Receive",
    };
    let why = match c.status {
        NdStatus::Canceled => {
            "it was flushed: the connection ended (a disconnect, the peer went away, a Terminate) or the \
             queue pair was closed first; QueuePair::query says whether a Terminate was involved"
        }
        NdStatus::RemoteError => {
            "the stream was terminated while it was in flight; QueuePair::query shows the Terminate and \
             which side sent it"
        }
        NdStatus::AccessViolation => {
            "a local buffer is outside its region, not this session's, or lacks LOCAL_WRITE where data lands"
        }
        NdStatus::DataOverrun => "the message was longer than the Receive's buffers",
        NdStatus::InsufficientResources => {
            "the queue pair's queue was full: await earlier requests first, or create the queue pair deeper"
        }
        NdStatus::InvalidParameter => {
            "too many SGEs, a message longer than 2^31 bytes, or a remote range that wraps"
        }
        _ => "docs/connector-semantics.md lists what the status means",
    };
    Error::new(
        c.status,
        format!("the {op} on queue pair {} failed: {why}", c.qp.0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::verbs::QueuePairId;

    fn completion(wr_id: u64, status: NdStatus) -> Completion {
        Completion {
            qp: QueuePairId(3),
            wr_id,
            op: CompletionOp::Write,
            status,
            bytes: 7,
            solicited: false,
            invalidated: None,
        }
    }

    const CQ: CompletionQueueId = CompletionQueueId(1);

    /// An awaited completion goes to its call alone; the application's, before and after it, stay queued
    /// in order, and a call's completion never reaches the application's poll.
    #[tokio::test]
    async fn awaited_completions_go_to_their_calls_and_the_rest_stays_queued() {
        let state = Arc::new(CqState::default());
        let (first, rx1) = state.reserve().unwrap();
        let (second, rx2) = state.reserve().unwrap();
        assert!(RESERVED_IDS.contains(&first) && RESERVED_IDS.contains(&second) && first != second);
        let one = PendingCompletion::waiting(state.clone(), CQ, rx1);
        let two = PendingCompletion::waiting(state.clone(), CQ, rx2);
        state.push(vec![
            completion(1, NdStatus::Success),
            completion(second, NdStatus::RemoteError),
            completion(2, NdStatus::Success),
            completion(first, NdStatus::Success),
        ]);
        assert_eq!(one.await.unwrap().wr_id, first);
        let e = two.await.unwrap_err();
        assert_eq!(e.status, NdStatus::RemoteError);
        assert_eq!(
            e.context,
            "the RDMA Write on queue pair 3 failed: the stream was terminated while it was in flight; \
             QueuePair::query shows the Terminate and which side sent it"
        );
        let ids: Vec<u64> = state.poll(CQ, 10).iter().map(|c| c.wr_id).collect();
        assert_eq!(ids, [1, 2]);
    }

    /// A nap on a daemon-run queue sleeps on its doorbell in the calling thread: it returns once the writer
    /// publishes and rings (the writer sees the need-wakeup flag the nap set), after its timeout when
    /// nothing comes, at once when completions are there; a queue completed in this process cannot nap.
    #[test]
    fn a_nap_sleeps_on_the_doorbell_in_the_calling_thread() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _enter = rt.enter();
        let g = crate::rings::cq::geometry(8).unwrap();
        let (mem, mut writer) = crate::rings::cq::CqRingWriter::create(g).unwrap();
        let bell = crate::rings::doorbell::Doorbell::new().unwrap();
        let theirs = crate::rings::doorbell::Doorbell::from_fd(bell.try_clone_fd().unwrap());
        let session = Arc::new(crate::rings::doorbell::Doorbell::new().unwrap());
        let state = Arc::new(CqState::new(Some(CqRing::attach(mem, g, bell, session).unwrap())));
        assert!(!CqState::default().nap(CQ, std::time::Duration::ZERO).unwrap());

        // Nothing comes: the nap lasts its timeout.
        let t = std::time::Instant::now();
        assert!(state.nap(CQ, std::time::Duration::from_millis(20)).unwrap());
        assert!(t.elapsed() >= std::time::Duration::from_millis(20));

        // A completion written while the nap sleeps: the writer is told to ring, and the nap wakes.
        let napping = {
            let state = state.clone();
            std::thread::spawn(move || {
                let t = std::time::Instant::now();
                assert!(state.nap(CQ, std::time::Duration::from_secs(30)).unwrap());
                t.elapsed()
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        writer.push(completion(9, NdStatus::Success));
        // Told to ring when the nap went to sleep first (else the nap finds the completion as it prepares
        // to sleep, and does not).
        if writer.flush().unwrap() {
            theirs.ring().unwrap();
        }
        assert!(napping.join().unwrap() < std::time::Duration::from_secs(30));
        // Already there: no sleep.
        let t = std::time::Instant::now();
        assert!(state.nap(CQ, std::time::Duration::from_secs(30)).unwrap());
        assert!(t.elapsed() < std::time::Duration::from_secs(30));
        assert_eq!(state.poll(CQ, 4).iter().map(|c| c.wr_id).collect::<Vec<_>>(), [9]);
    }

    /// A push holding only awaited completions wakes nobody who waits on the queue.
    #[tokio::test]
    async fn a_push_of_awaited_completions_alone_leaves_the_queue_asleep() {
        let state = CqState::default();
        let (id, mut rx) = state.reserve().unwrap();
        let notified = state.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        state.push(vec![completion(id, NdStatus::Success)]);
        assert_eq!(rx.try_recv().unwrap().wr_id, id);
        assert!(
            futures_poll(notified.as_mut()).is_pending(),
            "the queue's waiters were woken for nothing"
        );
        state.push(vec![completion(5, NdStatus::Success)]);
        assert!(futures_poll(notified.as_mut()).is_ready());
    }

    /// A call whose future was dropped, or whose post failed, leaves nothing behind: its completion is
    /// discarded, not delivered to the application.
    #[test]
    fn abandoned_and_unposted_calls_leave_nothing_behind() {
        let state = CqState::default();
        let (dropped, rx) = state.reserve().unwrap();
        drop(rx);
        let (unposted, _rx) = state.reserve().unwrap();
        state.unreserve(unposted);
        state.push(vec![
            completion(dropped, NdStatus::Success),
            completion(unposted, NdStatus::Success),
        ]);
        assert!(state.poll(CQ, 10).is_empty());
        assert!(state.awaited.lock().unwrap().waiters.is_empty());
    }

    /// When soft-rdmad goes away, a waiting call fails with DEVICE_REMOVED, and a new one is refused.
    #[tokio::test]
    async fn device_removed_fails_the_calls_waiting_and_refuses_new_ones() {
        let state = Arc::new(CqState::default());
        let (_, rx) = state.reserve().unwrap();
        let waiting = PendingCompletion::waiting(state.clone(), CQ, rx);
        state.device_removed();
        assert_eq!(waiting.await.unwrap_err().status, NdStatus::DeviceRemoved);
        assert_eq!(state.reserve().unwrap_err().status, NdStatus::DeviceRemoved);
        let refused = PendingCompletion::refused(Error::new(NdStatus::ConnectionInvalid, "not yet"));
        assert_eq!(format!("{refused:?}"), "PendingCompletion { state: \"refused\" }");
        assert_eq!(refused.await.unwrap_err().status, NdStatus::ConnectionInvalid);
    }

    /// An armed notification fires once, from the push of the next completion it counts: not for what was
    /// queued before the arm, not for an unsolicited success when only solicited ones were asked, and once
    /// more only after arming again; soft-rdmad going away fires it too.
    #[test]
    fn an_armed_notification_fires_once_on_the_next_completion() {
        let state = CqState::default();
        let fired = Arc::new(AtomicU64::new(0));
        let arm = |solicited_only| {
            let fired = fired.clone();
            state.arm(
                solicited_only,
                Arc::new(move || {
                    fired.fetch_add(1, Ordering::SeqCst);
                }),
            );
        };
        state.push(vec![completion(1, NdStatus::Success)]);
        arm(false);
        assert_eq!(fired.load(Ordering::SeqCst), 0, "queued before the arm");
        state.push(vec![
            completion(2, NdStatus::Success),
            completion(3, NdStatus::Success),
        ]);
        assert_eq!(fired.load(Ordering::SeqCst), 1);
        state.push(vec![completion(4, NdStatus::Success)]);
        assert_eq!(fired.load(Ordering::SeqCst), 1, "once per arm");
        arm(true);
        state.push(vec![completion(5, NdStatus::Success)]);
        assert_eq!(fired.load(Ordering::SeqCst), 1, "an unsolicited success");
        state.push(vec![completion(6, NdStatus::Canceled)]);
        assert_eq!(fired.load(Ordering::SeqCst), 2, "a failed request counts");
        assert_eq!(
            state.poll(CQ, 10).len(),
            6,
            "every completion is still there to poll"
        );
        arm(false);
        state.device_removed();
        assert_eq!(fired.load(Ordering::SeqCst), 3, "soft-rdmad went away");
    }

    /// Polls `f` once with a waker that does nothing.
    fn futures_poll<F: Future + ?Sized>(f: Pin<&mut F>) -> Poll<F::Output> {
        f.poll(&mut Context::from_waker(std::task::Waker::noop()))
    }
}
