//! The UDS server's share of [`Limits`]: what every session, and all of them together, hold of soft-rdmad's
//! memory, address space and connection slots, counted where it is allocated, released when it is dropped.
//!
//! - [`Budget::admit`]: a connection slot ([`SessionTicket`]) past neither `max_sessions` nor
//!   `max_pending_hellos`; the ticket counts the connection as waiting for its Hello until
//!   [`SessionTicket::welcomed`].
//! - [`Budget::charge_region`]: room for one registered region of `len` bytes, per session and daemon-wide,
//!   taken *before* the memfd is mapped (a sparse memfd costs the daemon no RAM but costs it address space);
//!   the [`RegionCharge`] travels with the mapping ([`ChargedRegion`]) and gives the room back when the engine
//!   drops the region (deregistration, session end).
//! - Queued output ([`Budget::output_changed`], [`Budget::must_pause`]): the bytes every session's writer
//!   holds for a client that has not read them. Past `max_output_bytes` daemon-wide, a session holding at
//!   least the average share of it reads no more requests, so the largest consumers are paused first and the
//!   others keep being served; completions and events are queued output too.
//!
//! Every counter is an atomic: sessions run as tasks of their own. A reservation adds first and takes back
//! what overshot, so two sessions racing for the last room may both be refused, never both let through.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::sync::Notify;

use crate::engine::limits::{Limit, LimitHits, Limits, ResourceStatus};
use crate::engine::memory::RegionMemory;
use crate::error::{Error, NdStatus};
use crate::shm::SharedMemory;

/// Daemon-wide counters against [`Limits`].
#[derive(Debug, Default)]
pub struct Budget {
    limits: Limits,
    sessions: AtomicUsize,
    pending_hellos: AtomicUsize,
    refused_connections: AtomicU64,
    registered_bytes: AtomicU64,
    regions: AtomicUsize,
    output_bytes: AtomicUsize,
    /// Sessions holding any queued output.
    output_holders: AtomicUsize,
    /// Times a session was paused by the daemon-wide output bound.
    output_pauses: AtomicU64,
    /// The daemon-wide output fell back under its bound.
    output_room: Notify,
    /// How often each bound the UDS server enforces was hit.
    hits: LimitHits,
}

/// What one session holds of the registered-memory budget.
#[derive(Debug, Default)]
pub struct SessionAccount {
    registered_bytes: AtomicU64,
    regions: AtomicUsize,
}

/// Adds `n` to `counter` unless that passes `max`: true if added.
fn reserve_usize(counter: &AtomicUsize, n: usize, max: usize) -> bool {
    let before = counter.fetch_add(n, Ordering::AcqRel);
    if before.checked_add(n).is_none_or(|after| after > max) {
        counter.fetch_sub(n, Ordering::AcqRel);
        return false;
    }
    true
}

fn reserve_u64(counter: &AtomicU64, n: u64, max: u64) -> bool {
    let before = counter.fetch_add(n, Ordering::AcqRel);
    if before.checked_add(n).is_none_or(|after| after > max) {
        counter.fetch_sub(n, Ordering::AcqRel);
        return false;
    }
    true
}

fn insufficient(context: String) -> Error {
    Error::new(NdStatus::InsufficientResources, context)
}

impl Budget {
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Budget {
            limits,
            ..Budget::default()
        })
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// A slot for a new client connection, which has not sent its Hello yet. INSUFFICIENT_RESOURCES past
    /// `max_sessions` connections or `max_pending_hellos` connections without Hello.
    pub fn admit(self: &Arc<Self>) -> Result<SessionTicket, Error> {
        let refused = |e: Error| {
            self.refused_connections.fetch_add(1, Ordering::Relaxed);
            Err(e)
        };
        if !reserve_usize(&self.sessions, 1, self.limits.max_sessions) {
            self.hits.hit(Limit::Sessions);
            return refused(insufficient(format!(
                "soft-rdmad serves {} client connections, its limit (--max-sessions)",
                self.limits.max_sessions
            )));
        }
        if !reserve_usize(&self.pending_hellos, 1, self.limits.max_pending_hellos) {
            self.sessions.fetch_sub(1, Ordering::AcqRel);
            self.hits.hit(Limit::PendingHellos);
            return refused(insufficient(format!(
                "{} client connections have not sent their Hello yet, the limit (--max-pending-hellos)",
                self.limits.max_pending_hellos
            )));
        }
        Ok(SessionTicket {
            budget: self.clone(),
            pending_hello: true,
        })
    }

    /// A connection refused before it got a slot (out of descriptors).
    pub fn refused(&self) {
        self.refused_connections.fetch_add(1, Ordering::Relaxed);
    }

    /// Room for one region of `len` bytes for the session of `account`. INSUFFICIENT_RESOURCES past any of
    /// `max_regions_per_session`, `max_registered_bytes_per_session`, `max_regions`, `max_registered_bytes`.
    pub fn charge_region(
        self: &Arc<Self>,
        account: &Arc<SessionAccount>,
        len: u64,
    ) -> Result<RegionCharge, Error> {
        let l = &self.limits;
        if !reserve_usize(&account.regions, 1, l.max_regions_per_session) {
            self.hits.hit(Limit::RegionsPerSession);
            return Err(insufficient(format!(
                "this session has {} memory regions registered, the per-session limit \
                 (--max-regions-per-session)",
                l.max_regions_per_session
            )));
        }
        // From here on, dropping `charge` gives back whatever it holds.
        let mut charge = RegionCharge {
            budget: self.clone(),
            account: account.clone(),
            session_bytes: 0,
            regions: false,
            bytes: 0,
        };
        if !reserve_u64(&account.registered_bytes, len, l.max_registered_bytes_per_session) {
            self.hits.hit(Limit::RegisteredBytesPerSession);
            return Err(insufficient(format!(
                "registering {len} more bytes would pass this session's limit of {} registered bytes \
                 (--max-registered-bytes-per-session; {} registered now)",
                l.max_registered_bytes_per_session,
                account.registered_bytes.load(Ordering::Relaxed)
            )));
        }
        charge.session_bytes = len;
        if !reserve_usize(&self.regions, 1, l.max_regions) {
            self.hits.hit(Limit::Regions);
            return Err(insufficient(format!(
                "soft-rdmad has {} memory regions registered, its limit (--max-regions)",
                l.max_regions
            )));
        }
        charge.regions = true;
        if !reserve_u64(&self.registered_bytes, len, l.max_registered_bytes) {
            self.hits.hit(Limit::RegisteredBytes);
            return Err(insufficient(format!(
                "registering {len} more bytes would pass soft-rdmad's limit of {} registered bytes \
                 (--max-registered-bytes)",
                l.max_registered_bytes
            )));
        }
        charge.bytes = len;
        Ok(charge)
    }

    /// A session's queued output went from `before` to `after` bytes. Wakes paused sessions when the total
    /// falls back under `max_output_bytes`.
    pub fn output_changed(&self, before: usize, after: usize) {
        if before == after {
            return;
        }
        let total_before = if after > before {
            self.output_bytes.fetch_add(after - before, Ordering::AcqRel)
        } else {
            self.output_bytes.fetch_sub(before - after, Ordering::AcqRel)
        };
        match (before, after) {
            (0, _) => {
                self.output_holders.fetch_add(1, Ordering::AcqRel);
            }
            (_, 0) => {
                self.output_holders.fetch_sub(1, Ordering::AcqRel);
            }
            _ => {}
        }
        let total_after = total_before.wrapping_add(after).wrapping_sub(before);
        if total_before > self.limits.max_output_bytes && total_after <= self.limits.max_output_bytes {
            self.output_room.notify_waiters();
        }
    }

    /// Whether a session holding `mine` bytes of queued output must read no more requests for now: the
    /// daemon-wide output is past its bound and this session holds at least the average share of it.
    pub fn must_pause(&self, mine: usize) -> bool {
        let total = self.output_bytes.load(Ordering::Acquire);
        if total <= self.limits.max_output_bytes || mine == 0 {
            return false;
        }
        let holders = self.output_holders.load(Ordering::Acquire).max(1);
        mine.saturating_mul(holders) >= total
    }

    /// Counts one pause by the daemon-wide bound (for `status`).
    pub fn paused(&self) {
        self.output_pauses.fetch_add(1, Ordering::Relaxed);
        self.hits.hit(Limit::OutputBytes);
    }

    /// One of the UDS server's bounds was hit (a session's own output bound, a timeout).
    pub fn hit(&self, limit: Limit) {
        self.hits.hit(limit);
    }

    /// How often each bound the UDS server enforces was hit.
    pub fn limit_hits(&self) -> &LimitHits {
        &self.hits
    }

    /// Notified when the daemon-wide output falls back under its bound.
    pub fn output_room(&self) -> &Notify {
        &self.output_room
    }

    /// What `status` shows of it.
    pub fn status(&self) -> ResourceStatus {
        let l = &self.limits;
        ResourceStatus {
            client_connections: self.sessions.load(Ordering::Relaxed) as u64,
            max_sessions: l.max_sessions as u64,
            pending_hellos: self.pending_hellos.load(Ordering::Relaxed) as u64,
            refused_connections: self.refused_connections.load(Ordering::Relaxed),
            registered_bytes: self.registered_bytes.load(Ordering::Relaxed),
            max_registered_bytes: l.max_registered_bytes,
            regions: self.regions.load(Ordering::Relaxed) as u64,
            max_regions: l.max_regions as u64,
            queued_output_bytes: self.output_bytes.load(Ordering::Relaxed) as u64,
            max_output_bytes: l.max_output_bytes as u64,
            output_pauses: self.output_pauses.load(Ordering::Relaxed),
            resident_bytes: None,
        }
    }
}

/// One client connection's slot; dropping it frees the slot.
#[derive(Debug)]
pub struct SessionTicket {
    budget: Arc<Budget>,
    pending_hello: bool,
}

impl SessionTicket {
    /// The connection sent its Hello: it no longer counts against `max_pending_hellos`.
    pub fn welcomed(&mut self) {
        if std::mem::take(&mut self.pending_hello) {
            self.budget.pending_hellos.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for SessionTicket {
    fn drop(&mut self) {
        self.welcomed();
        self.budget.sessions.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Room held for one registered region; given back on drop.
#[derive(Debug)]
pub struct RegionCharge {
    budget: Arc<Budget>,
    account: Arc<SessionAccount>,
    session_bytes: u64,
    /// Holds one of the daemon-wide regions (the session's one is always held).
    regions: bool,
    bytes: u64,
}

impl Drop for RegionCharge {
    fn drop(&mut self) {
        self.account.regions.fetch_sub(1, Ordering::AcqRel);
        self.account
            .registered_bytes
            .fetch_sub(self.session_bytes, Ordering::AcqRel);
        if self.regions {
            self.budget.regions.fetch_sub(1, Ordering::AcqRel);
        }
        self.budget
            .registered_bytes
            .fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// A mapped region with the room it holds: what the event loop registers. Dropping it (the engine
/// deregisters the region, or the session ends) unmaps it and gives the room back.
pub struct ChargedRegion {
    memory: SharedMemory,
    _charge: RegionCharge,
}

impl ChargedRegion {
    pub fn new(memory: SharedMemory, charge: RegionCharge) -> Self {
        ChargedRegion {
            memory,
            _charge: charge,
        }
    }
}

impl std::fmt::Debug for ChargedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChargedRegion")
            .field("len", &self.memory.len())
            .finish_non_exhaustive()
    }
}

impl RegionMemory for ChargedRegion {
    fn len(&self) -> u64 {
        RegionMemory::len(&self.memory)
    }

    fn read_at(&self, offset: u64, out: &mut [u8]) {
        RegionMemory::read_at(&self.memory, offset, out);
    }

    fn write_at(&self, offset: u64, data: &[u8]) {
        RegionMemory::write_at(&self.memory, offset, data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(f: impl FnOnce(&mut Limits)) -> Arc<Budget> {
        let mut l = Limits::default();
        f(&mut l);
        Budget::new(l)
    }

    #[test]
    fn sessions_and_pending_hellos_are_capped_and_given_back() {
        let b = budget(|l| {
            l.max_sessions = 3;
            l.max_pending_hellos = 2;
        });
        let mut t1 = b.admit().unwrap();
        let _t2 = b.admit().unwrap();
        let e = b.admit().unwrap_err();
        assert_eq!(e.status, NdStatus::InsufficientResources);
        assert!(e.context.contains("--max-pending-hellos"), "{e}");
        t1.welcomed();
        let mut t3 = b.admit().unwrap();
        let e = b.admit().unwrap_err();
        assert!(e.context.contains("--max-sessions"), "{e}");
        assert_eq!(b.status().refused_connections, 2);
        let hits = |l| b.limit_hits().get(l);
        assert_eq!((hits(Limit::Sessions), hits(Limit::PendingHellos)), (1, 1));
        t3.welcomed();
        drop(t1);
        let _t4 = b.admit().unwrap();
        assert_eq!((b.status().client_connections, b.status().pending_hellos), (3, 2));
    }

    #[test]
    fn regions_are_charged_per_session_and_daemon_wide() {
        let b = budget(|l| {
            l.max_regions_per_session = 2;
            l.max_registered_bytes_per_session = 100;
            l.max_regions = 3;
            l.max_registered_bytes = 150;
        });
        let (s1, s2) = (
            Arc::new(SessionAccount::default()),
            Arc::new(SessionAccount::default()),
        );
        let a = b.charge_region(&s1, 60).unwrap();
        let e = b.charge_region(&s1, 41).unwrap_err();
        assert!(e.context.contains("--max-registered-bytes-per-session"), "{e}");
        let _b = b.charge_region(&s1, 40).unwrap();
        let e = b.charge_region(&s1, 1).unwrap_err();
        assert!(e.context.contains("--max-regions-per-session"), "{e}");
        // Daemon-wide: 100 of 150 bytes are taken.
        let e = b.charge_region(&s2, 51).unwrap_err();
        assert!(e.context.contains("(--max-registered-bytes)"), "{e}");
        let _c = b.charge_region(&s2, 50).unwrap();
        let e = b.charge_region(&s2, 0).unwrap_err();
        assert!(e.context.contains("(--max-regions)"), "{e}");
        let hits = |l| b.limit_hits().get(l);
        assert_eq!(
            Limit::ALL[1..=4].iter().map(|l| hits(*l)).collect::<Vec<_>>(),
            [1, 1, 1, 1],
            "each refusal counted against its bound"
        );
        // Refusals took nothing; a drop gives everything back.
        assert_eq!((b.status().regions, b.status().registered_bytes), (3, 150));
        drop(a);
        assert_eq!((b.status().regions, b.status().registered_bytes), (2, 90));
        assert_eq!(s1.regions.load(Ordering::Relaxed), 1);
        assert_eq!(s1.registered_bytes.load(Ordering::Relaxed), 40);
        let _d = b.charge_region(&s1, 60).unwrap();
    }

    #[test]
    fn the_largest_output_holders_are_paused_first() {
        let b = budget(|l| l.max_output_bytes = 1000);
        b.output_changed(0, 100);
        b.output_changed(0, 800);
        assert!(!b.must_pause(800), "900 of 1000: nobody is paused");
        b.output_changed(800, 1100);
        // 1200 bytes held by two sessions: the one with 1100 pauses, the one with 100 does not.
        assert!(b.must_pause(1100));
        assert!(!b.must_pause(100));
        assert!(!b.must_pause(0));
        b.output_changed(1100, 0);
        assert!(!b.must_pause(100));
        assert_eq!(b.status().queued_output_bytes, 100);
    }

    #[tokio::test]
    async fn falling_under_the_output_bound_wakes_the_paused() {
        let b = budget(|l| l.max_output_bytes = 10);
        b.output_changed(0, 20);
        let woken = b.output_room().notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        b.output_changed(20, 5);
        tokio::time::timeout(std::time::Duration::from_secs(5), woken)
            .await
            .expect("woken");
    }
}
