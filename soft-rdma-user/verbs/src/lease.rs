//! The runtime lease: while a program's thread waits in `ibv_get_cq_event` and serves its connections
//! itself (`Adapter::serve_until_readable`), or naps in an empty `ibv_poll_cq` on a daemon-run queue's
//! doorbell (`CompletionQueue::nap`, XDP mode), the library's runtime worker is held off its epoll, so that
//! the kernel wakes one thread per message, the one that waits, and not also the worker, which would find
//! the bytes read or the doorbell drained already.
//!
//! - A waiter that finds no lease asks for one: a task on the runtime ([`hold`]) parks the worker on a
//!   condition variable. That costs one wake-up of the worker, once per lease, not per message.
//! - The worker comes back to the runtime for one turn (its I/O and timers: soft-rdmad's messages, rdma_cm
//!   events, the first-FPDU hold) every [`TURN`], and for good once no waiter came for [`LINGER`] at a
//!   turn's end, or at once when a thread needs the runtime ([`runtime_wanted`], which `state::block_on`
//!   takes): nothing that needs the runtime waits longer than a turn.
//! - Between two waits of a program the connections are served by its polls and posts, and after 250 µs
//!   by the library's progress thread, as when a runtime is busy.
//! - `SOFT_RDMA_INLINE_WAIT=off` turns inline waiting off (the runtime's thread serves the connections and
//!   wakes the waiter through the channel's pipe, and waits on the doorbell for a napping poll, as before;
//!   for measuring the difference).

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::state;

/// How long the worker stays held before it runs one turn of the runtime.
const TURN: Duration = Duration::from_millis(5);
/// How long after the last waiter left a lease ends at a turn's end (a program between two waits is
/// usually back within tens of microseconds).
const LINGER: Duration = Duration::from_micros(500);

#[derive(Default)]
struct Lease {
    /// Threads in an inline wait now.
    waiters: usize,
    /// Threads that need the runtime now (a `block_on`).
    wanted: usize,
    /// A holding task was spawned and has not ended.
    held: bool,
    /// When the last waiter left.
    last_left: Option<Instant>,
}

static LEASE: Mutex<Lease> = Mutex::new(Lease {
    waiters: 0,
    wanted: 0,
    held: false,
    last_left: None,
});
static CHANGED: Condvar = Condvar::new();

fn lease() -> MutexGuard<'static, Lease> {
    LEASE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether `ibv_get_cq_event` serves the connections while it waits (`SOFT_RDMA_INLINE_WAIT`, on unless
/// `off`).
pub(crate) fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("SOFT_RDMA_INLINE_WAIT").map_or(true, |v| v != "off"))
}

/// A thread in an inline wait; dropping it ends the wait.
pub(crate) struct Waiting(());

/// Marks the calling thread as waiting inline, and asks for a lease if none is held.
pub(crate) fn waiting() -> Waiting {
    let mut l = lease();
    l.waiters += 1;
    if !l.held && l.wanted == 0 {
        l.held = true;
        drop(l);
        state::handle().spawn(hold());
    }
    Waiting(())
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut l = lease();
        l.waiters -= 1;
        l.last_left = Some(Instant::now());
    }
}

/// A thread that needs the runtime's worker (a `block_on`): the lease ends at once, and no new one
/// starts until it is dropped.
pub(crate) struct Wanted(());

pub(crate) fn runtime_wanted() -> Wanted {
    let mut l = lease();
    l.wanted += 1;
    if l.held {
        CHANGED.notify_all();
    }
    Wanted(())
}

impl Drop for Wanted {
    fn drop(&mut self) {
        lease().wanted -= 1;
    }
}

/// For a thread about to block on a completion channel's `pipe` that only the runtime's worker writes
/// (`ibv_get_cq_event` when the thread serves nothing itself: XDP mode, where soft-rdmad makes the
/// completions and the worker turns them into channel events): unless the pipe is readable already, the
/// runtime is wanted for the wait, so that no lease (the nap of the poll that found the queue empty just
/// before, as qperf's `rc_lat` polls it) holds the worker off for up to a [`TURN`]. That took qperf's
/// `rc_lat` in XDP mode to 1.6 ms per message, against 143 µs with inline waiting off. rdma_cm's and the
/// async events' waits do not take it: a thread parked there for a program's whole life (rping's CM
/// thread) would keep every lease from starting; their events wait for a turn at most.
pub(crate) fn runtime_for_wait(
    pipe: &crate::export::EventPipe,
) -> Result<Option<Wanted>, crate::export::Errno> {
    Ok((!pipe.poll_readable(0)?).then(runtime_wanted))
}

/// In a child of fork: no worker holds anything there, and no thread of the parent waits.
pub(crate) fn reset_after_fork() {
    *lease() = Lease::default();
}

/// The holding task: parks the worker thread, a turn at a time, while the lease lasts.
async fn hold() {
    while park_worker() {
        // One turn of the runtime: the worker polls its I/O driver and runs what is ready.
        tokio::task::yield_now().await;
    }
}

/// Parks the calling (worker) thread for at most one [`TURN`]; `true` if the lease goes on after it.
fn park_worker() -> bool {
    let start = Instant::now();
    let mut l = lease();
    let goes_on = loop {
        if l.wanted > 0 {
            break false;
        }
        let elapsed = start.elapsed();
        if elapsed >= TURN {
            let idle = l.waiters == 0 && l.last_left.is_none_or(|t| t.elapsed() >= LINGER);
            break !idle;
        }
        l = CHANGED
            .wait_timeout(l, TURN - elapsed)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    };
    if !goes_on {
        l.held = false;
    }
    goes_on
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lease's rules, on the worker's side, in one test (they share the process-wide state).
    #[test]
    fn a_held_worker_comes_back_for_a_turn_for_good_when_idle_and_at_once_when_wanted() {
        reset_after_fork();
        lease().held = true;
        // A waiter: the lease goes on after the turn.
        lease().waiters = 1;
        let t = Instant::now();
        assert!(park_worker());
        assert!(t.elapsed() >= TURN);
        // No waiter since long enough: it ends at the turn's end.
        {
            let mut l = lease();
            l.waiters = 0;
            l.last_left = Some(Instant::now() - LINGER);
        }
        assert!(!park_worker());
        assert!(!lease().held);
        // A thread that needs the runtime ends it at once, however long the turn.
        {
            let mut l = lease();
            l.held = true;
            l.waiters = 1;
        }
        let wanted = std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(1));
            runtime_wanted()
        });
        // It ends within the turn the thread asks in (a slow machine may run a turn or two first).
        let mut turns = 0;
        while park_worker() {
            turns += 1;
            assert!(turns < 1000, "a wanted runtime was never let go");
        }
        let w = wanted.join().unwrap();
        assert_eq!(lease().wanted, 1);
        drop(w);
        assert_eq!(lease().wanted, 0);
        reset_after_fork();
    }
}
