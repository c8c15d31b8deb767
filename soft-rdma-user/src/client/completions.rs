//! Where a completion queue's completions wait for the application, whichever data path made them: those
//! completed in this process (the in-process data path's, and requests a daemon-run queue pair's ring
//! refused) are pushed into a queue; a daemon-run completion queue's are read from its shared ring, which
//! soft-rdmad writes and whose doorbell it rings only while this side sleeps. [`CqState`] polls and waits on
//! both, so that one completion-queue type ([`super::CompletionQueue`]) serves both data paths.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::{Inner, device_removed};
use crate::engine::verbs::{Completion, CompletionQueueId};
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
        })
    }
}

/// One completion queue's completions: those completed in this process (kernel mode's data path, requests
/// refused before they reached a ring) in `queue`, and, for a daemon-run queue, those in its shared ring.
#[derive(Default)]
pub(super) struct CqState {
    pub(super) queue: Mutex<VecDeque<Completion>>,
    pub(super) notify: Notify,
    pub(super) ring: Option<CqRing>,
}

impl CqState {
    pub(super) fn push(&self, entries: Vec<Completion>) {
        self.queue.lock().expect("not poisoned").extend(entries);
        self.notify.notify_waiters();
    }

    /// Up to `max` completions of completion queue `cq` already delivered; never waits.
    pub(super) fn poll(&self, cq: CompletionQueueId, max: usize) -> Vec<Completion> {
        let mut out: Vec<Completion> = {
            let mut q = self.queue.lock().expect("not poisoned");
            let n = max.min(q.len());
            q.drain(..n).collect()
        };
        if let Some(ring) = &self.ring
            && out.len() < max
        {
            let left = u32::try_from(max - out.len()).unwrap_or(u32::MAX);
            let polled = ring.reader.lock().expect("not poisoned").poll(left, &mut out);
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
        }
        out
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
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let got = self.poll(cq, max.max(1));
            if !got.is_empty() {
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
            let spin = SpinConfig {
                spins: ring.spins.load(Ordering::Relaxed),
            };
            if spin.spins > 0 {
                let mut got = Vec::new();
                if spin.spin_until(|| {
                    got = self.poll(cq, max.max(1));
                    !got.is_empty()
                }) {
                    return Ok(got);
                }
            }
            let asleep = ring.reader.lock().expect("not poisoned").prepare_sleep();
            match asleep {
                Ok(true) => {
                    tokio::select! {
                        () = notified => {}
                        ready = ring.doorbell.readable() => {
                            if let Ok(mut ready) = ready {
                                let _ = ready.get_inner().0.drain();
                                ready.clear_ready();
                            }
                        }
                    }
                }
                Ok(false) => {}
                Err(fault) => return Err(fault.to_error()),
            }
            ring.reader.lock().expect("not poisoned").awake();
        }
    }

    /// Sets a daemon-run queue's spin before [`Self::wait`] sleeps; nothing for one filled in this process.
    pub(super) fn set_spin(&self, spin: SpinConfig) {
        if let Some(ring) = &self.ring {
            ring.spins.store(spin.spins, Ordering::Relaxed);
        }
    }
}
