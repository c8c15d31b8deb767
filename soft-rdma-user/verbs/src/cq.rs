//! Completion queues and completion channels (`ibv_create_cq`, `ibv_poll_cq`, `ibv_req_notify_cq`,
//! `ibv_create_comp_channel`, `ibv_get_cq_event`, `ibv_ack_cq_events`, `ibv_destroy_cq`).
//!
//! `ibv_poll_cq` calls the client's synchronous `CompletionQueue::poll` on the caller's thread and writes
//! `struct ibv_wc`s (verbs.h); `ibv_req_notify_cq` arms the client's notification, which queues the CQ on
//! its channel and writes a byte to the channel's pipe, so that `channel->fd` polls readable and
//! `ibv_get_cq_event` blocks, or answers EAGAIN under O_NONBLOCK, as rdma-core's kernel file does.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use libc::{c_int, c_void};
use soft_rdma::NdStatus;
use soft_rdma::client::{Completion, CompletionOp, CompletionQueue, QueuePairId};

use crate::abi::*;
use crate::device::{Context, context};
use crate::errno::{errno_of, wc_status};
use crate::export::{
    CCell, CObject, Errno, EventPipe, LastHit, Registry, export, guard, ret_errno, ret_minus_one, ret_ptr,
};
use crate::state;

#[repr(C)]
pub(crate) struct Channel {
    c: CCell<ibv_comp_channel>,
    context: Arc<Context>,
    pipe: EventPipe,
    /// CQs whose notification fired, and who waits inline ([`Ready`]).
    ready: Mutex<Ready>,
    /// CQs attached (`ibv_destroy_comp_channel` answers EBUSY while any is).
    cqs: AtomicUsize,
}

/// A channel's queued events. The pipe holds one byte per event, so that `channel->fd` polls readable
/// while one is queued, as rdma-core's kernel file does, except while a thread of this process waits on the
/// channel inline ([`serve_while_waiting`]): that thread looks at the queue itself, and an event queued
/// then gets no byte (two system calls less per event). When the last inline waiter leaves, the events
/// still queued get their bytes.
#[derive(Default)]
struct Ready {
    /// CQs whose notification fired, in order, as `struct ibv_cq *`, each with whether a byte in the pipe
    /// stands for it.
    queue: VecDeque<(usize, bool)>,
    /// Threads in an inline wait on the channel.
    inline: usize,
}

impl Ready {
    /// A CQ's notification fired.
    fn push(&mut self, pipe: &EventPipe, cq: usize) {
        let byte = self.inline == 0 && pipe.ring();
        self.queue.push_back((cq, byte));
    }

    /// The first queued event, its byte taken from the pipe.
    fn pop(&mut self, pipe: &EventPipe) -> Option<usize> {
        let (cq, byte) = self.queue.pop_front()?;
        if byte {
            pipe.take_byte();
        }
        Some(cq)
    }

    /// A CQ destroyed: its queued events go, with their bytes.
    fn forget(&mut self, pipe: &EventPipe, cq: usize) {
        self.queue.retain(|&(c, byte)| {
            if c == cq && byte {
                pipe.take_byte();
            }
            c != cq
        });
    }

    /// The last inline waiter left: the events still queued get their bytes.
    fn inline_end(&mut self, pipe: &EventPipe) {
        self.inline -= 1;
        if self.inline == 0 {
            for (_, byte) in self.queue.iter_mut().filter(|(_, byte)| !*byte) {
                *byte = pipe.ring();
            }
        }
    }
}

impl Channel {
    fn ready(&self) -> std::sync::MutexGuard<'_, Ready> {
        self.ready.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, cq: usize) {
        self.ready().push(&self.pipe, cq);
    }

    fn pop(&self) -> Option<usize> {
        self.ready().pop(&self.pipe)
    }

    fn forget(&self, cq: usize) {
        self.ready().forget(&self.pipe, cq);
    }

    fn inline_begin(&self) {
        self.ready().inline += 1;
    }

    fn inline_end(&self) {
        self.ready().inline_end(&self.pipe);
    }
}

// SAFETY: #[repr(C)], the C struct first.
unsafe impl CObject for Channel {
    type C = ibv_comp_channel;
    const KIND: &'static str = "completion channel";
}

static CHANNELS: Registry<Channel> = Registry::new();

#[repr(C)]
pub(crate) struct Cq {
    c: CCell<ibv_cq>,
    pub(crate) context: Arc<Context>,
    pub(crate) cq: CompletionQueue,
    channel: Option<Arc<Channel>>,
    /// Queue pairs using it (`ibv_destroy_cq` answers EBUSY while any is).
    users: AtomicUsize,
    /// Completion events taken by `ibv_get_cq_event` and acknowledged (`ibv_destroy_cq` waits for the acks,
    /// as rdma-core's `ibv_cmd_destroy_cq` does; events queued but not taken are dropped with the CQ, as
    /// the kernel drops them).
    events: Mutex<Events>,
    acked: Condvar,
    /// The queue pairs destroyed while using it, the latest [`DESTROYED_QPS_REMEMBERED`]: their failed
    /// completions (the flush a destroy makes, and any still on the way) are never polled. `ibv_destroy_qp`
    /// takes a queue pair away with its work requests: a program frees what their `wr_id`s point to once it
    /// returns (libfabric's RxM does, and read a flushed receive's buffer after it had given it to another
    /// queue pair), as rdma-core's providers clean a destroyed queue pair's entries from its CQs
    /// (`mlx5_destroy_qp` → `__mlx5_cq_clean`). Its successful completions stay, as on kernel siw (whose
    /// destroy cleans nothing): over TCP a peer's last message and its FIN arrive together, the program can
    /// hear of the disconnect before it polls that message, and RxM destroys the queue pair and then reads
    /// the CQ for what it delivered (`rxm_close_conn`: `fi_close`, then `rxm_flush_msg_cq`).
    destroyed: Mutex<VecDeque<QueuePairId>>,
    /// Whether `destroyed` holds any: a poll that finds none takes no lock.
    any_destroyed: AtomicBool,
    /// What an armed notification calls (queues the CQ on its channel and rings the pipe), made on the
    /// first `ibv_req_notify_cq`.
    notify: std::sync::OnceLock<Arc<dyn Fn() + Send + Sync>>,
}

/// A CQ's completion events, as `ibv_get_cq_event` takes them and `ibv_ack_cq_events` acknowledges them.
#[derive(Default)]
struct Events {
    taken: u32,
    acked: u32,
    /// `ibv_destroy_cq` waits for the acks: only then does an ack notify.
    destroy_waits: bool,
}

/// How many destroyed queue pairs a CQ remembers ([`Cq::forget_queue_pair`]): their completions come within
/// one flush of the destroy (in kernel-TCP mode during it, in XDP mode within the daemon's next pass), long
/// before a thousand more queue pairs of the same CQ are destroyed.
const DESTROYED_QPS_REMEMBERED: usize = 1024;

// SAFETY: #[repr(C)], the C struct first.
unsafe impl CObject for Cq {
    type C = ibv_cq;
    const KIND: &'static str = "completion queue";
}

pub(crate) static CQS: Registry<Cq> = Registry::new();

thread_local! {
    /// The CQ this thread polled or armed last ([`Registry::get_hot`]).
    static LAST_CQ: LastHit<Cq> = const { LastHit::new() };
}

impl Cq {
    pub(crate) fn ibv(&self) -> *mut ibv_cq {
        self.c.get()
    }

    pub(crate) fn hold(&self) {
        self.users.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn release(&self) {
        self.users.fetch_sub(1, Ordering::AcqRel);
    }

    /// From now on, `qp`'s failed completions are left out of every poll ([`Cq::destroyed`]).
    pub(crate) fn forget_queue_pair(&self, qp: QueuePairId) {
        let mut d = self.destroyed.lock().expect("not poisoned");
        if d.len() == DESTROYED_QPS_REMEMBERED {
            d.pop_front();
        }
        d.push_back(qp);
        self.any_destroyed.store(true, Ordering::Release);
    }

    /// `got` without the failed completions of destroyed queue pairs.
    fn without_destroyed(&self, mut got: Vec<Completion>) -> Vec<Completion> {
        if self.any_destroyed.load(Ordering::Acquire) {
            let d = self.destroyed.lock().expect("not poisoned");
            got.retain(|c| c.status == NdStatus::Success || !d.contains(&c.qp));
        }
        got
    }
}

pub(crate) fn cq(p: *const ibv_cq) -> Result<Arc<Cq>, Errno> {
    CQS.get(p)
}

export!("IBVERBS_1.0";
fn ibv_create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel {
    ret_ptr("ibv_create_comp_channel", || {
        let context = context(ctx)?;
        let pipe = EventPipe::new()?;
        let ch = Arc::new(Channel {
            c: CCell::new(ibv_comp_channel {
                context: ctx,
                fd: pipe.read,
                refcnt: 0,
            }),
            context,
            pipe,
            ready: Mutex::default(),
            cqs: AtomicUsize::new(0),
        });
        Ok(CHANNELS.insert(ch))
    })
});

export!("IBVERBS_1.0";
fn ibv_destroy_comp_channel(p: *mut ibv_comp_channel) -> c_int {
    ret_errno("ibv_destroy_comp_channel", || {
        let ch = CHANNELS.get(p)?;
        if ch.cqs.load(Ordering::Acquire) > 0 {
            return Err(libc::EBUSY);
        }
        CHANNELS.remove(p)?;
        Ok(())
    })
});

export!("IBVERBS_1.1";
fn ibv_create_cq(ctx: *mut ibv_context, cqe: c_int, cq_context: *mut c_void, channel: *mut ibv_comp_channel, comp_vector: c_int) -> *mut ibv_cq {
    ret_ptr("ibv_create_cq", || create_cq(ctx, cqe, cq_context, channel, comp_vector))
});

fn create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> Result<*mut ibv_cq, Errno> {
    let context = context(ctx)?;
    let max = context.process.info.max_completion_queue_depth;
    if cqe < 1 || cqe as u32 > max || comp_vector != 0 {
        tracing::warn!(
            cqe,
            max,
            comp_vector,
            "ibv_create_cq: cqe outside 1..=max_cqe, or a completion vector other than 0"
        );
        return Err(libc::EINVAL);
    }
    let channel = if channel.is_null() {
        None
    } else {
        let ch = CHANNELS.get(channel)?;
        if !Arc::ptr_eq(&ch.context, &context) {
            return Err(libc::EINVAL);
        }
        Some(ch)
    };
    let adapter = context.process.adapter.clone();
    let queue =
        state::block_on(async move { adapter.create_completion_queue(cqe as u32).await }).map_err(|e| {
            tracing::warn!(error = %e, "ibv_create_cq: soft-rdma refused a completion queue of {cqe}");
            errno_of(&e)
        })?;
    tracing::debug!(cqe, max, "ibv_create_cq");
    if let Some(ch) = &channel {
        ch.cqs.fetch_add(1, Ordering::AcqRel);
    }
    let cq = Arc::new(Cq {
        c: CCell::new(ibv_cq {
            context: ctx,
            channel: channel.as_ref().map_or(std::ptr::null_mut(), |c| c.c.get()),
            cq_context,
            handle: queue.id().0 as u32,
            cqe,
            // SAFETY: all-zero is the static initializer of glibc's mutex and condition variable.
            mutex: unsafe { std::mem::zeroed() },
            cond: unsafe { std::mem::zeroed() },
            comp_events_completed: 0,
            async_events_completed: 0,
        }),
        context,
        cq: queue,
        channel,
        users: AtomicUsize::new(0),
        events: Mutex::default(),
        acked: Condvar::new(),
        destroyed: Mutex::new(VecDeque::new()),
        any_destroyed: AtomicBool::new(false),
        notify: std::sync::OnceLock::new(),
    });
    Ok(CQS.insert(cq))
}

export!("IBVERBS_1.1";
fn ibv_destroy_cq(p: *mut ibv_cq) -> c_int {
    ret_errno("ibv_destroy_cq", || {
        let cq = cq(p)?;
        if cq.users.load(Ordering::Acquire) > 0 {
            return Err(libc::EBUSY);
        }
        CQS.remove(p)?;
        if let Some(ch) = &cq.channel {
            ch.forget(p as usize);
        }
        let mut ev = cq.events.lock().unwrap_or_else(|e| e.into_inner());
        ev.destroy_waits = true;
        while ev.acked < ev.taken {
            ev = cq.acked.wait(ev).unwrap_or_else(|e| e.into_inner());
        }
        drop(ev);
        if let Some(ch) = &cq.channel {
            ch.cqs.fetch_sub(1, Ordering::AcqRel);
        }
        Ok(())
    })
});

export!("IBVERBS_1.1";
/// soft-rdma's completion queues have a fixed depth: EOPNOTSUPP.
fn ibv_resize_cq(p: *mut ibv_cq, _cqe: c_int) -> c_int {
    ret_errno("ibv_resize_cq", || {
        cq(p)?;
        Err(libc::EOPNOTSUPP)
    })
});

/// `ibv_context_ops.poll_cq`: up to `n` completions into `wc`; their number, or a negative errno.
pub(crate) unsafe extern "C" fn poll_cq(p: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    guard("ibv_poll_cq", -libc::EIO, || {
        let cq = match CQS.get_hot(&LAST_CQ, p) {
            Ok(cq) => cq,
            Err(e) => return -e,
        };
        if n < 0 || (n > 0 && wc.is_null()) {
            return -libc::EINVAL;
        }
        let got = {
            let _runtime = state::handle().enter();
            cq.without_destroyed(cq.cq.poll(n as usize))
        };
        if got.is_empty() {
            pause_when_spinning(&cq.cq);
        } else {
            EMPTY_SINCE.set(None);
        }
        for (i, c) in got.iter().enumerate() {
            // SAFETY: the caller's array of `n` entries; i < n.
            unsafe { wc.add(i).write(to_wc(c)) };
        }
        got.len() as c_int
    })
}

thread_local! {
    /// When this thread's run of empty `ibv_poll_cq` calls began (`None`: its last poll found completions).
    static EMPTY_SINCE: std::cell::Cell<Option<std::time::Instant>> = const { std::cell::Cell::new(None) };
}

/// What `$SOFT_RDMA_POLL_YIELD_US` says: how long a thread may spin on empty `ibv_poll_cq` calls before
/// each further empty one gives the CPU away ([`pause_when_spinning`]); `Some(None)`: `off`, never; `None`:
/// unset, the default of the queue's kind.
fn spin_setting() -> Option<Option<std::time::Duration>> {
    static SPIN: std::sync::OnceLock<Option<Option<std::time::Duration>>> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| match std::env::var("SOFT_RDMA_POLL_YIELD_US") {
        Ok(v) if v == "off" => Some(None),
        Ok(v) => match v.parse::<u64>() {
            Ok(us) => Some(Some(std::time::Duration::from_micros(us))),
            Err(_) => {
                eprintln!(
                    "soft-rdma-verbs: SOFT_RDMA_POLL_YIELD_US={v:?} is not a number of µs or `off`: using the \
                     defaults (100 µs in kernel-TCP mode, 0 in XDP mode)"
                );
                None
            }
        },
        Err(_) => None,
    })
}

/// The spin before an empty poll gives the CPU away, by default: in kernel-TCP mode (the poll serves the
/// connections itself) longer than a 64 B round trip here (about 60 µs), so that a latency test's wait is
/// not touched, and short beside a bandwidth test's gap between completions (64 KiB at a few Gb/s: about
/// 150 µs); in XDP mode none, as every µs of spinning is taken from soft-rdmad on a shared CPU (perftest's
/// 64 B Send ½RTT there: about 100 µs spinning 100 µs first, 57 µs napping at once, docs/perftest.md).
fn spin_before_pause(by_daemon: bool) -> Option<std::time::Duration> {
    match spin_setting() {
        Some(set) => set,
        None if by_daemon => Some(std::time::Duration::ZERO),
        None => Some(std::time::Duration::from_micros(100)),
    }
}

/// A program that spins on `ibv_poll_cq` (perftest does; on one CPU per side, as `cargo xtask bench --pin
/// sides` runs it) holds its CPU from whoever makes its completions. Past [`spin_before_pause`] of empty
/// polls, each further empty poll gives the CPU away, by who that is:
/// - **this process** (kernel-TCP mode): the poll itself already served the connections
///   (`CompletionQueue::poll`), so the spin is useful work; sched_yield(2) hands the CPU to the library's
///   runtime worker or progress thread when they are runnable, and returns at once when nothing else is;
/// - **soft-rdmad** (XDP mode): the spin only takes CPU time from the daemon, which needs all of it at
///   full rate; the poll naps on the queue's completion doorbell for at most [`DOORBELL_NAP`] (soft-rdmad
///   rings it for the first completion), so that the CPU is the daemon's until there is something to poll.
///
/// Measured with `cargo xtask bench --only perftest` (docs/perftest.md).
fn pause_when_spinning(cq: &soft_rdma::client::CompletionQueue) {
    let by_daemon = cq.completed_by_daemon();
    let Some(spin) = spin_before_pause(by_daemon) else {
        return;
    };
    let now = std::time::Instant::now();
    let spun = match EMPTY_SINCE.get() {
        None => {
            EMPTY_SINCE.set(Some(now));
            spin.is_zero()
        }
        Some(t) => now.duration_since(t) >= spin,
    };
    if !spun {
        return;
    }
    if by_daemon {
        // A poll never fails: whatever the wait ends on (a completion, the nap's end, the daemon gone), the
        // next poll says it. This thread sleeps on the doorbell itself, with the runtime's worker held off
        // its reactor (`crate::lease`), so that soft-rdmad's ring wakes this thread alone; when another
        // task sleeps there, or with `SOFT_RDMA_INLINE_WAIT=off`, the runtime waits and hands over.
        let napped = crate::lease::enabled() && {
            let _lease = crate::lease::waiting();
            !matches!(cq.nap(DOORBELL_NAP), Ok(false))
        };
        if !napped {
            state::block_on(async {
                let _ = tokio::time::timeout(DOORBELL_NAP, cq.ready()).await;
            });
        }
    } else {
        std::thread::yield_now();
    }
}

/// The longest an empty `ibv_poll_cq` on a daemon-run queue naps on its doorbell, past the spin: the poll
/// returns (with nothing) after it, as a program that also watches something else expects of a poll.
const DOORBELL_NAP: std::time::Duration = std::time::Duration::from_millis(1);

/// A soft-rdma completion as `struct ibv_wc`. qp_num is the queue pair's id (`ibv_qp.qp_num`).
pub(crate) fn to_wc(c: &Completion) -> ibv_wc {
    let mut wc = ibv_wc {
        wr_id: c.wr_id,
        status: wc_status(c.status),
        opcode: match c.op {
            CompletionOp::Send => IBV_WC_SEND,
            CompletionOp::Write => IBV_WC_RDMA_WRITE,
            CompletionOp::Read => IBV_WC_RDMA_READ,
            CompletionOp::Receive => IBV_WC_RECV,
        },
        byte_len: c.bytes,
        qp_num: c.qp.0 as u32,
        ..ibv_wc::default()
    };
    if c.status.is_error() {
        wc.vendor_err = c.status.code();
    }
    if let Some(stag) = c.invalidated {
        wc.wc_flags |= IBV_WC_WITH_INV;
        wc.invalidated_rkey = stag.0;
    }
    wc
}

/// `ibv_context_ops.req_notify_cq`: the next completion (a solicited one if asked) queues an event on
/// the CQ's channel.
pub(crate) unsafe extern "C" fn req_notify_cq(p: *mut ibv_cq, solicited_only: c_int) -> c_int {
    ret_errno("ibv_req_notify_cq", || {
        let cq = CQS.get_hot(&LAST_CQ, p)?;
        let Some(channel) = cq.channel.clone() else {
            // No channel: nothing to wake (rdma-core's kernel arms it all the same).
            return Ok(());
        };
        // Made once per CQ: an event loop arms it once per event.
        let notify = cq
            .notify
            .get_or_init(|| {
                let weak = Arc::downgrade(&cq);
                let address = p as usize;
                Arc::new(move || {
                    if weak.upgrade().is_none() {
                        return;
                    }
                    channel.push(address);
                })
            })
            .clone();
        let _runtime = state::handle().enter();
        crate::primitives::request_notification(&cq.cq, solicited_only != 0, notify).map_err(|e| errno_of(&e))
    })
}

export!("IBVERBS_1.1";
/// Waits (unless O_NONBLOCK is set on `channel->fd`) for a CQ's completion event.
fn ibv_get_cq_event(channel: *mut ibv_comp_channel, cq_out: *mut *mut ibv_cq, cq_context: *mut *mut c_void) -> c_int {
    ret_minus_one("ibv_get_cq_event", || {
        let ch = CHANNELS.get(channel)?;
        if cq_out.is_null() || cq_context.is_null() {
            return Err(libc::EINVAL);
        }
        // An event whose CQ was destroyed meanwhile is gone: wait for the next one.
        let cq = loop {
            let next = match ch.pop() {
                Some(p) => Some(p),
                None if ch.pipe.nonblocking() => return Err(libc::EAGAIN),
                None => serve_while_waiting(&ch)?,
            };
            match next {
                Some(p) => match CQS.find(p as *const ibv_cq) {
                    Some(cq) => break cq,
                    None => continue,
                },
                None => wait_for_the_runtime(&ch.pipe)?,
            }
        };
        cq.events.lock().unwrap_or_else(|e| e.into_inner()).taken += 1;
        // SAFETY: the caller's out-parameters; the CQ is live.
        unsafe {
            *cq_out = cq.ibv();
            *cq_context = (*cq.ibv()).cq_context;
        }
        Ok(())
    })
});

/// Blocks on the channel's pipe, which the runtime's worker writes when this thread serves nothing itself
/// (XDP mode: soft-rdmad makes the completions, and the worker turns them into channel events), with the
/// worker free to write it ([`crate::lease::runtime_for_wait`]).
fn wait_for_the_runtime(pipe: &EventPipe) -> Result<(), Errno> {
    let _runtime = crate::lease::runtime_for_wait(pipe)?;
    pipe.wait_readable()
}

/// The longest one `poll(2)` of an inline wait lasts before it looks again at which sockets to watch (a
/// connection adopted meanwhile is served by the runtime's turns until then: `crate::lease`).
const INLINE_SLICE: std::time::Duration = std::time::Duration::from_millis(10);

/// Before `ibv_get_cq_event` blocks on the channel's pipe (a blocking one): in kernel-TCP mode, unless
/// `SOFT_RDMA_INLINE_WAIT=off`, the thread waits for an event while serving the session's connections
/// itself, with the runtime's worker held off ([`crate::lease`]): the bytes that make the completion wake
/// this thread only. The event queued meanwhile, taken while this thread still waits inline (so that it
/// never gets a byte); `None` when there is nothing to serve here or the pipe became readable (the caller
/// waits on the pipe, or takes what is there); EINTR from a signal, as the pipe's `read` gives it.
fn serve_while_waiting(ch: &Channel) -> Result<Option<usize>, Errno> {
    let process = &ch.context.process;
    // Nothing to serve (XDP mode, or no connection yet): the runtime makes the events; no lease.
    if !crate::lease::enabled() || !process.adapter.has_local_connections() {
        return Ok(None);
    }
    // SAFETY: the pipe's read end stays open while `ch` lives.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(ch.pipe.read) };
    let _lease = crate::lease::waiting();
    ch.inline_begin();
    // An event queued by this thread's own pass (or another's) ends the wait without one more poll.
    let queued = || !ch.ready().queue.is_empty();
    let r = loop {
        match process.adapter.serve_until_readable(fd, INLINE_SLICE, &queued) {
            Ok(soft_rdma::client::InlineWait::TimedOut) => {}
            Ok(soft_rdma::client::InlineWait::Readable) => break Ok(ch.pop()),
            Ok(soft_rdma::client::InlineWait::NothingToServe) => break Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => break Err(libc::EINTR),
            // Anything else: the pipe's own wait says what it is.
            Err(_) => break Ok(None),
        }
    };
    ch.inline_end();
    r
}

export!("IBVERBS_1.1";
fn ibv_ack_cq_events(p: *mut ibv_cq, n: u32) {
    guard("ibv_ack_cq_events", (), || {
        let Ok(cq) = cq(p) else { return };
        let mut ev = cq.events.lock().unwrap_or_else(|e| e.into_inner());
        ev.acked = ev.acked.saturating_add(n).min(ev.taken);
        // SAFETY: the live CQ's counter, which rdma-core also keeps there.
        unsafe { (*cq.ibv()).comp_events_completed = ev.acked };
        if ev.destroy_waits {
            cq.acked.notify_all();
        }
    })
});

#[cfg(test)]
mod tests {
    use super::*;
    use soft_rdma::NdStatus;
    use soft_rdma::client::{QueuePairId, Stag};

    /// Whether the pipe's read end polls readable now.
    fn readable(pipe: &EventPipe) -> bool {
        pipe.poll_readable(0).unwrap()
    }

    #[test]
    fn the_pipe_is_readable_exactly_while_an_event_waits_for_a_reader_outside() {
        let pipe = EventPipe::new().unwrap();
        let mut r = Ready::default();
        r.push(&pipe, 1);
        r.push(&pipe, 2);
        assert!(readable(&pipe));
        assert_eq!(r.pop(&pipe), Some(1));
        assert!(readable(&pipe), "one event left, one byte left");
        assert_eq!(r.pop(&pipe), Some(2));
        assert!(!readable(&pipe));
        assert_eq!(r.pop(&pipe), None);

        // An inline waiter takes its events from the queue: no byte, no system call.
        r.inline += 1;
        r.push(&pipe, 3);
        assert!(!readable(&pipe));
        assert_eq!(r.pop(&pipe), Some(3));
        // One left behind when the waiter goes gets its byte then, for a reader that polls the descriptor.
        r.push(&pipe, 4);
        r.inline_end(&pipe);
        assert!(readable(&pipe));
        assert_eq!(r.pop(&pipe), Some(4));
        assert!(!readable(&pipe));
    }

    #[test]
    fn a_destroyed_cqs_events_take_their_bytes_with_them() {
        let pipe = EventPipe::new().unwrap();
        let mut r = Ready::default();
        r.push(&pipe, 1);
        r.push(&pipe, 2);
        r.push(&pipe, 1);
        r.forget(&pipe, 1);
        assert_eq!(r.pop(&pipe), Some(2));
        assert!(!readable(&pipe));
    }

    #[test]
    fn completions_become_work_completions() {
        let c = Completion {
            qp: QueuePairId(7),
            wr_id: 99,
            op: CompletionOp::Receive,
            status: NdStatus::Success,
            bytes: 64,
            solicited: false,
            invalidated: Some(Stag(0x1234)),
        };
        let wc = to_wc(&c);
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.qp_num),
            (99, IBV_WC_SUCCESS, IBV_WC_RECV, 64, 7)
        );
        assert_eq!((wc.wc_flags, wc.invalidated_rkey), (IBV_WC_WITH_INV, 0x1234));
        let flushed = to_wc(&Completion {
            status: NdStatus::Canceled,
            invalidated: None,
            ..c
        });
        assert_eq!(
            (flushed.status, flushed.vendor_err),
            (IBV_WC_WR_FLUSH_ERR, NdStatus::Canceled.code())
        );
    }
}
