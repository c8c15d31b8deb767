//! The XDP stack's wake-up for its timers (the own TCP's pacing, RACK and delayed-ACK timers, smoltcp's
//! `poll_delay`, neighbour and connect deadlines) in the daemon's event loop. tokio's timer has millisecond
//! granularity; BBR paces segments microseconds apart, and a pacing gap rounded up to the next millisecond
//! held a 4 MiB Write stream at a third of its rate. A timerfd (CLOCK_MONOTONIC, nanoseconds), watched by
//! the runtime's epoll beside the AF_XDP sockets, wakes the loop on time.

use std::cell::Cell;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use tokio::io::unix::AsyncFd;

/// The timerfd as `AsyncFd` watches it.
struct Timer(TimerFd);

impl AsRawFd for Timer {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// A one-shot timerfd that keeps the earliest wake-up asked of it.
pub(super) struct StackTimer {
    fd: AsyncFd<Timer>,
    /// When it fires, if armed and not yet seen firing.
    armed: Cell<Option<Instant>>,
}

impl StackTimer {
    pub(super) fn new() -> Result<Self> {
        let t = TimerFd::new(
            ClockId::CLOCK_MONOTONIC,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )
        .context("timerfd_create")?;
        // SAFETY: the TimerFd owns its descriptor, which stays open (and the same) until the AsyncFd drops it.
        let fd = unsafe { AsyncFd::register_with_interest(Timer(t), tokio::io::Interest::READABLE) }
            .map_err(|e| e.into_parts().1)
            .context("watching the stack's timerfd")?;
        Ok(StackTimer {
            fd,
            armed: Cell::new(None),
        })
    }

    /// Fire at `at` at the latest. A wake-up already armed at or before `at` (and still ahead) stays: an
    /// early wake costs one idle pass of the loop, a re-arm costs a syscall every time.
    pub(super) fn arm(&self, at: Instant, now: Instant) {
        if let Some(armed) = self.armed.get()
            && armed <= at
            && armed > now
        {
            return;
        }
        // Zero disarms a timerfd: at least a microsecond.
        let after = at.saturating_duration_since(now).max(Duration::from_micros(1));
        match self.fd.get_ref().0.set(
            Expiration::OneShot(TimeSpec::from_duration(after)),
            TimerSetTimeFlags::empty(),
        ) {
            Ok(()) => self.armed.set(Some(at)),
            Err(e) => {
                // The loop still wakes within 100 ms (the stack's longest timeout) through tokio's timer.
                crate::warn_limited!(error = %e, "arming the XDP stack's timerfd failed");
                self.armed.set(None);
            }
        }
    }

    /// Ready once the armed time passed (the expiration is read, so the descriptor stops being readable).
    pub(super) fn poll_fired(&self, cx: &mut Context<'_>) -> Poll<()> {
        // A stale readiness (the read finds nothing) is cleared and polled again, so that the Pending
        // returned comes with the waker registered.
        while let Poll::Ready(Ok(mut guard)) = self.fd.poll_read_ready(cx) {
            let mut count = [0u8; 8];
            // Non-blocking read of the expiration count; EAGAIN means a stale readiness.
            let n = nix::unistd::read(self.fd.get_ref().0.as_fd(), &mut count);
            guard.clear_ready();
            if n.is_ok() {
                self.armed.set(None);
                return Poll::Ready(());
            }
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fires_at_the_earliest_time_asked_with_sub_millisecond_precision() {
        let t = StackTimer::new().unwrap();
        let now = Instant::now();
        t.arm(now + Duration::from_secs(10), now);
        // An earlier deadline replaces the later one; a later one does not replace it.
        t.arm(now + Duration::from_micros(300), now);
        t.arm(now + Duration::from_secs(5), now);
        // Liveness bound only: the 5 s and 10 s wake-ups must not be the ones that fire.
        tokio::time::timeout(
            Duration::from_secs(4),
            std::future::poll_fn(|cx| t.poll_fired(cx)),
        )
        .await
        .expect("the earliest wake-up fired");
        let waited = now.elapsed();
        assert!(waited >= Duration::from_micros(300), "{waited:?}");
        assert_eq!(t.armed.get(), None, "fired: nothing armed");
        // Fired and read: not ready again until re-armed.
        let again = std::future::poll_fn(|cx| Poll::Ready(t.poll_fired(cx).is_ready())).await;
        assert!(!again);
    }
}
