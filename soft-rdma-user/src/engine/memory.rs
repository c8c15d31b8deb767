//! The memory registry: every registered memory region of the daemon, the STags that name them, and the
//! protection checks every data-path access goes through (RFC 5040 §2.1/§6.4 "STag", RFC 5041 §3 "tagged
//! buffer model", Linux siw `siw_mem.c`).
//!
//! A region is a [`RegionMemory`] (the daemon maps the client's memfd; tests use [`VecMemory`]), the
//! protection domain it was registered in ([`Domain`]: the session and its PD), its access rights and its
//! STag. The STag's upper 24 bits are an index drawn from a keyed permutation of the index space, the low 8
//! bits a fresh random key (RFC 5040 §2.1 "STag ... key"; [`MemoryRegistry`] says how and why), so a stale
//! or guessed STag is refused. Index 0 is never handed out, as siw (`siw_mem_add` allocates ids from 1), so
//! STag 0 (the RFC 6581 RTR's STag) never names a region.
//!
//! [`MemoryRegistry::check`] applies siw's `siw_check_mem` order: STag known and valid, same protection domain
//! as the queue pair the access came through (RFC 5040 §7.2 "STag not associated with RDMAP stream"), access
//! rights, then bounds.

use foldhash::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use tracing::debug;

use super::ids::{Domain, SessionId};
use super::verbs::{Access, MemoryRegionId, Stag};
use crate::error::{Error, NdStatus};

/// Bytes of one registered region. The daemon implements it over a shared memfd mapping; tests over a Vec.
/// Offsets/lengths passed in are always already bounds-checked by the registry.
pub trait RegionMemory: Send {
    fn len(&self) -> u64;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn read_at(&self, offset: u64, out: &mut [u8]);
    fn write_at(&self, offset: u64, data: &[u8]);
    /// The memory as a gathered write may send it in place, if it can be (the client library's own
    /// mappings); `None` makes senders copy it.
    fn pinned(&self) -> Option<PinnedMemory> {
        None
    }
    /// Each access costs a system call, not a copy (another process's memory): senders read it ahead in
    /// pieces larger than one FPDU (`engine/qp/read_ahead.rs`).
    fn costly_access(&self) -> bool {
        false
    }
}

/// Registered memory a gathered write sends in place: the address of its first byte and its length, valid
/// while the owner (held here) lives. The bytes may change underneath the write, as any RDMA buffer's may;
/// no Rust reference to them is ever made, only the kernel reads them (`writev`).
#[derive(Clone)]
pub struct PinnedMemory {
    base: std::ptr::NonNull<u8>,
    len: usize,
    _owner: Arc<dyn Send + Sync>,
}

// SAFETY: `base` points into memory owned by `_owner` (Send + Sync), which stays mapped while this value
// exists; the pointer itself is only ever handed to the kernel or to `copy_to`, never dereferenced as a
// Rust reference.
unsafe impl Send for PinnedMemory {}
// SAFETY: as for Send: shared use only reads the address.
unsafe impl Sync for PinnedMemory {}

impl PinnedMemory {
    /// # Safety
    /// `base..base + len` must be mapped and stay mapped while `owner` lives.
    pub unsafe fn new(base: std::ptr::NonNull<u8>, len: usize, owner: Arc<dyn Send + Sync>) -> Self {
        PinnedMemory {
            base,
            len,
            _owner: owner,
        }
    }

    /// The address of byte `offset` with `len` bytes after it, if that range is inside the memory.
    pub fn range(&self, offset: usize, len: usize) -> Option<*const u8> {
        let end = offset.checked_add(len)?;
        // SAFETY: `offset <= end <= self.len`: the result stays inside the mapping.
        (end <= self.len).then(|| unsafe { self.base.as_ptr().add(offset).cast_const() })
    }

    /// Appends a copy of `[offset, offset + len)` to `out` (nothing when the range is outside).
    pub fn copy_to(&self, offset: usize, len: usize, out: &mut Vec<u8>) {
        if let Some(src) = self.range(offset, len) {
            out.reserve(len);
            let start = out.len();
            // SAFETY: `src..src + len` is inside the mapping (checked by `range`), `out` has room for
            // `len` more bytes, and the two cannot overlap (one is a heap Vec, the other a mapping).
            unsafe {
                std::ptr::copy_nonoverlapping(src, out.as_mut_ptr().add(start), len);
                out.set_len(start + len);
            }
        }
    }
}

impl fmt::Debug for PinnedMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedMemory")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// A Vec-backed [`RegionMemory`] for tests and fuzzing. Clones share the buffer, so a test keeps one clone to
/// look at (or change) the bytes after registering the other.
#[derive(Clone, Debug, Default)]
pub struct VecMemory(Arc<Mutex<Vec<u8>>>);

impl VecMemory {
    /// `len` zero bytes.
    pub fn new(len: usize) -> Self {
        VecMemory(Arc::new(Mutex::new(vec![0; len])))
    }

    /// A copy of the current bytes.
    pub fn bytes(&self) -> Vec<u8> {
        self.lock().clone()
    }

    /// Overwrites `data.len()` bytes at `offset` (ignored where it does not fit).
    pub fn fill_at(&self, offset: usize, data: &[u8]) {
        self.write_at(offset as u64, data);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        // A panicking test thread must not make every later access panic too.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl From<Vec<u8>> for VecMemory {
    fn from(v: Vec<u8>) -> Self {
        VecMemory(Arc::new(Mutex::new(v)))
    }
}

impl RegionMemory for VecMemory {
    fn len(&self) -> u64 {
        self.lock().len() as u64
    }

    fn read_at(&self, offset: u64, out: &mut [u8]) {
        let v = self.lock();
        let Ok(start) = usize::try_from(offset) else {
            return;
        };
        if let Some(src) = start.checked_add(out.len()).and_then(|end| v.get(start..end)) {
            out.copy_from_slice(src);
        }
    }

    fn write_at(&self, offset: u64, data: &[u8]) {
        let mut v = self.lock();
        let Ok(start) = usize::try_from(offset) else {
            return;
        };
        if let Some(dst) = start
            .checked_add(data.len())
            .and_then(|end| v.get_mut(start..end))
        {
            dst.copy_from_slice(data);
        }
    }
}

/// Why an access was refused; siw's `enum siw_access_state` (`siw_mem.h`). The data path maps each to the
/// Terminate code of the layer that found it (`siw_tagged_error` / `siw_rdmap_error`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccessError {
    /// No region with this index and key, or the region was invalidated (siw `E_STAG_INVALID`).
    InvalidStag,
    /// The range is not inside the region, or overflows (siw `E_BASE_BOUNDS`).
    BaseOrBounds,
    /// The region lacks the needed access right (siw `E_ACCESS_PERM`).
    AccessRights,
    /// The region belongs to another protection domain than the queue pair's (another PD of the session, or
    /// another session): RFC 5040 §7.2 "STag not associated with RDMAP stream" (siw `E_PD_MISMATCH`).
    NotAssociated,
}

impl fmt::Display for AccessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AccessError::InvalidStag => "invalid STag",
            AccessError::BaseOrBounds => "access outside the region's bounds",
            AccessError::AccessRights => "region lacks the access right",
            AccessError::NotAssociated => "STag not associated with this stream",
        })
    }
}

impl std::error::Error for AccessError {}

struct Region {
    id: MemoryRegionId,
    domain: Domain,
    stag: Stag,
    access: Access,
    len: u64,
    /// The tagged offset of the region's first byte: a peer addresses byte `i` as `iova + i` (rdma-core's
    /// `ibv_reg_mr_iova2`; `ibv_reg_mr` registers with the buffer's virtual address, which C programs
    /// advertise beside the rkey). 0 for the Rust library's regions (TO 0 = first byte).
    iova: u64,
    /// False after a Send with Invalidate named it (RFC 5040 §5.3); the region stays registered.
    valid: bool,
    memory: Box<dyn RegionMemory>,
}

/// The largest STag index (24 bits, RFC 5040 §2.1 via siw's `SIW_STAG_MAX_INDEX`).
const MAX_INDEX: u32 = 0x00FF_FFFF;

/// One splitmix64 step (Steele, Lea, Flood 2014): a cheap, well-mixed sequence from a seed.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Every registered region of the daemon (or of the client's in-process data path).
///
/// STag allocation (siw `siw_mr_add_mem`: a 24-bit index from `xa_alloc_cyclic` starting at a random point,
/// and an 8-bit key): registration `n` takes the index `P(start + n mod 2^24)`, where `P` is a keyed
/// permutation of the 24-bit index space (a four-round Feistel network whose round keys come from the
/// seed) and `start` a seeded random point, skipping index 0 and live indices. So an index comes back only
/// after the counter has gone round all 2^24 values, and consecutive registrations are not neighbours: an
/// STag says nothing a peer can use about the next or the previous one. The key byte is drawn fresh for
/// every registration.
pub struct MemoryRegistry {
    /// Live regions by STag index; index 0 is never used.
    regions: HashMap<u32, Region>,
    by_id: HashMap<MemoryRegionId, u32>,
    next_id: u64,
    /// splitmix64 state for the key bytes.
    key_state: u64,
    /// The index permutation's round keys.
    rounds: [u32; 4],
    /// The allocation counter (24 bits), permuted into the next index.
    cursor: u32,
    /// Most live regions (2^24 - 1, every index but 0; lower in tests).
    capacity: usize,
}

impl fmt::Debug for MemoryRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegistry")
            .field("regions", &self.by_id.len())
            .finish_non_exhaustive()
    }
}

impl MemoryRegistry {
    /// An empty registry; the STag indices and keys are drawn from `key_seed` (the daemon and the client's
    /// in-process data path pass a random seed, so STags are not predictable across runs).
    pub fn new(key_seed: u64) -> Self {
        let mut state = key_seed;
        let rounds = std::array::from_fn(|_| splitmix(&mut state) as u32);
        let cursor = splitmix(&mut state) as u32 & MAX_INDEX;
        MemoryRegistry {
            regions: HashMap::default(),
            by_id: HashMap::default(),
            next_id: 1,
            key_state: state,
            rounds,
            cursor,
            capacity: MAX_INDEX as usize,
        }
    }

    /// Tests: a registry that holds at most `capacity` live regions.
    #[cfg(test)]
    fn with_capacity(key_seed: u64, capacity: usize) -> Self {
        MemoryRegistry {
            capacity,
            ..MemoryRegistry::new(key_seed)
        }
    }

    fn next_key(&mut self) -> u8 {
        splitmix(&mut self.key_state) as u8
    }

    /// The keyed permutation of the 24-bit index space: four Feistel rounds on two 12-bit halves (a
    /// bijection whatever the round function, so every counter value names a distinct index).
    fn permute(&self, counter: u32) -> u32 {
        let (mut left, mut right) = ((counter >> 12) & 0xFFF, counter & 0xFFF);
        for &k in &self.rounds {
            let mut z = u64::from(right ^ k) | (u64::from(k) << 32);
            let f = splitmix(&mut z) as u32 & 0xFFF;
            (left, right) = (right, left ^ f);
        }
        (left << 12) | right
    }

    /// The next free index: the permuted counter, skipping 0 and live indices. `None` when full.
    fn next_index(&mut self) -> Option<u32> {
        if self.regions.len() >= self.capacity {
            return None;
        }
        // Fewer than 2^24 - 1 indices are live, so a free nonzero one is met within one turn of the counter.
        for _ in 0..=MAX_INDEX {
            let index = self.permute(self.cursor);
            self.cursor = (self.cursor + 1) & MAX_INDEX;
            if index != 0 && !self.regions.contains_key(&index) {
                return Some(index);
            }
        }
        None
    }

    /// Registers `memory` in `domain`. The STag is a fresh index (24 bits, see the type's doc) and a fresh
    /// random key byte (RFC 5040 §2.1; siw `siw_mr_add_mem`).
    /// Peers address the region's first byte as tagged offset `iova` (see [`MemoryRegistry::offset_of`]; 0
    /// for the Rust library's regions).
    /// Errors: access bits outside [`Access::ALL`] or a zero-length region → INVALID_PARAMETER, as is a region
    /// whose tagged offsets would wrap (RFC 5040 §7.2 "TO wrap"); the index space (2^24 - 1 regions, index 0
    /// reserved) exhausted → INSUFFICIENT_RESOURCES.
    pub fn register(
        &mut self,
        domain: Domain,
        memory: Box<dyn RegionMemory>,
        access: Access,
        iova: u64,
    ) -> Result<(MemoryRegionId, Stag), Error> {
        if iova.checked_add(memory.len()).is_none() {
            return Err(Error::new(
                NdStatus::InvalidParameter,
                format!("a region at tagged offset {iova:#x} would wrap the 64-bit tagged-offset space"),
            ));
        }
        if !access.is_valid() {
            return Err(Error::new(
                NdStatus::InvalidParameter,
                format!("memory region access flags {:#04x} are not valid", access.0),
            ));
        }
        let len = memory.len();
        if len == 0 {
            return Err(Error::new(
                NdStatus::InvalidParameter,
                "a memory region cannot be empty",
            ));
        }
        // The tables grow with what clients register: a growth the allocator refuses fails this registration
        // (INSUFFICIENT_RESOURCES) instead of aborting the daemon.
        let no_memory = |what: &str| {
            Error::new(
                NdStatus::InsufficientResources,
                format!("soft-rdmad could not grow its {what}: out of memory"),
            )
        };
        self.by_id.try_reserve(1).map_err(|_| no_memory("region table"))?;
        self.regions.try_reserve(1).map_err(|_| no_memory("STag table"))?;
        let Some(index) = self.next_index() else {
            return Err(Error::new(
                NdStatus::InsufficientResources,
                "the STag index space (2^24 - 1 regions) is exhausted",
            ));
        };
        let stag = Stag::new(index, self.next_key());
        let id = MemoryRegionId(self.next_id);
        self.next_id += 1;
        self.regions.insert(
            index,
            Region {
                id,
                domain,
                stag,
                access,
                len,
                iova,
                valid: true,
                memory,
            },
        );
        self.by_id.insert(id, index);
        debug!(
            session = domain.session.0,
            pd = domain.pd.0,
            mr = id.0,
            stag = stag.0,
            len,
            access = access.0,
            "memory region registered"
        );
        Ok((id, stag))
    }

    /// Deregisters `id`. Only the owning session may; any other session gets INVALID_PARAMETER exactly as for a
    /// region that does not exist (api.rs: no information leaks across sessions). Its STag names nothing from
    /// now on (siw `siw_mr_drop_mem`).
    pub fn deregister(&mut self, session: SessionId, id: MemoryRegionId) -> Result<(), Error> {
        let owned = self
            .by_id
            .get(&id)
            .and_then(|i| self.regions.get(i))
            .is_some_and(|r| r.domain.session == session);
        if !owned {
            return Err(Error::new(
                NdStatus::InvalidParameter,
                format!("memory region {} does not exist", id.0),
            ));
        }
        self.remove(id);
        Ok(())
    }

    fn remove(&mut self, id: MemoryRegionId) {
        if let Some(index) = self.by_id.remove(&id) {
            self.regions.remove(&index);
            debug!(mr = id.0, index, "memory region deregistered");
        }
    }

    fn region(&self, stag: Stag) -> Option<&Region> {
        self.regions.get(&stag.index()).filter(|r| r.stag == stag)
    }

    /// The region offset a peer's tagged offset `to` names in the region of `stag`: `to - iova`. A `to` below
    /// the region's first tagged offset gives an offset past any region (the bounds check refuses it: siw's
    /// `addr < mem->va` → E_BASE_BOUNDS); an unknown STag gives `to` unchanged (the STag check refuses it).
    /// Every access a peer names by tagged offset (an inbound Write, a Read Request's source) goes through
    /// this first; the local side's SGEs are already region offsets.
    pub fn offset_of(&self, stag: Stag, to: u64) -> u64 {
        match self.region(stag) {
            Some(r) => to.checked_sub(r.iova).unwrap_or(u64::MAX),
            None => to,
        }
    }

    /// The protection domain of the region `stag` names, if any.
    pub fn domain_of(&self, stag: Stag) -> Option<Domain> {
        self.region(stag).map(|r| r.domain)
    }

    /// Checks that `[offset, offset+len)` lies in the region named by `stag`, that the region is registered and
    /// not invalidated, belongs to `domain` (the queue pair's), and grants `need`. `len` 0 is allowed for any `offset` up to the
    /// region's length. Order and outcomes as siw's `siw_check_mem`: STag, protection domain, rights, bounds.
    pub fn check(
        &self,
        domain: Domain,
        stag: Stag,
        offset: u64,
        len: u64,
        need: Access,
    ) -> Result<(), AccessError> {
        // RFC 5040 §6.4 / siw_mem_id2obj: unknown index, wrong key, or invalidated → invalid STag.
        let r = self.region(stag).ok_or(AccessError::InvalidStag)?;
        if !r.valid {
            return Err(AccessError::InvalidStag);
        }
        // siw: mem->pd != pd → E_PD_MISMATCH (RFC 5040 §7.2 "STag not associated with RDMAP stream").
        if r.domain != domain {
            return Err(AccessError::NotAssociated);
        }
        // siw: (mem->perms & perms) < perms → E_ACCESS_PERM.
        if !r.access.contains(need) {
            return Err(AccessError::AccessRights);
        }
        // siw: addr < mem->va || addr + len > mem->va + mem->len → E_BASE_BOUNDS (overflow included).
        match offset.checked_add(len) {
            Some(end) if end <= r.len => Ok(()),
            _ => Err(AccessError::BaseOrBounds),
        }
    }

    /// Whether `stag` names a region here whose STag a Send with Invalidate invalidated (its
    /// [`MemoryRegistry::check`] says invalid STag, as for no region at all; siw raises an event for this
    /// one only).
    pub fn is_invalidated(&self, stag: Stag) -> bool {
        self.region(stag).is_some_and(|r| !r.valid)
    }

    /// The region's bytes at `offset` into `out`, after [`MemoryRegistry::check`]. An unchecked or out-of-range
    /// access does nothing (never panics).
    pub fn read(&self, stag: Stag, offset: u64, out: &mut [u8]) {
        if let Some(r) = self.region(stag)
            && offset
                .checked_add(out.len() as u64)
                .is_some_and(|end| end <= r.len)
        {
            r.memory.read_at(offset, out);
        }
    }

    /// Whether the region's memory is read ahead by senders ([`RegionMemory::costly_access`]); false for no
    /// region.
    pub fn costly_access(&self, stag: Stag) -> bool {
        self.region(stag).is_some_and(|r| r.memory.costly_access())
    }

    /// The region's memory for a gathered write, when it can be sent in place. Like [`MemoryRegistry::read`],
    /// only after [`MemoryRegistry::check`].
    pub fn pinned(&self, stag: Stag) -> Option<PinnedMemory> {
        self.region(stag)?.memory.pinned()
    }

    /// Writes `data` at `offset` of the region, after [`MemoryRegistry::check`]. An unchecked or out-of-range
    /// access does nothing.
    pub fn write(&self, stag: Stag, offset: u64, data: &[u8]) {
        if let Some(r) = self.region(stag)
            && offset
                .checked_add(data.len() as u64)
                .is_some_and(|end| end <= r.len)
        {
            r.memory.write_at(offset, data);
        }
    }

    /// Send with Invalidate (RFC 5040 §5.3 "Send with Invalidate", §6.4): marks the region's STag invalid;
    /// further accesses get [`AccessError::InvalidStag`] until the region is registered again (a new
    /// registration has a new STag). The region must belong to `domain`, the queue pair's (siw
    /// `siw_invalidate_stag`: PD mismatch refused). Invalidating an already invalid STag succeeds, as in siw.
    pub fn invalidate(&mut self, domain: Domain, stag: Stag) -> Result<(), AccessError> {
        let r = self
            .regions
            .get_mut(&stag.index())
            .filter(|r| r.stag == stag)
            .ok_or(AccessError::InvalidStag)?;
        if r.domain != domain {
            return Err(AccessError::NotAssociated);
        }
        r.valid = false;
        debug!(session = domain.session.0, pd = domain.pd.0, stag = stag.0, "STag invalidated");
        Ok(())
    }

    /// Deregisters everything `session` owns (the session closed).
    pub fn close_session(&mut self, session: SessionId) {
        let ids: Vec<MemoryRegionId> = self
            .regions
            .values()
            .filter(|r| r.domain.session == session)
            .map(|r| r.id)
            .collect();
        for id in ids {
            self.remove(id);
        }
    }

    /// Registered regions, all sessions.
    pub fn count(&self) -> usize {
        self.by_id.len()
    }

    /// Registered regions of `session`.
    pub fn session_count(&self, session: SessionId) -> usize {
        self.regions
            .values()
            .filter(|r| r.domain.session == session)
            .count()
    }

    /// Owner, STag, length and access of a region.
    pub fn info(&self, id: MemoryRegionId) -> Option<(SessionId, Stag, u64, Access)> {
        let index = *self.by_id.get(&id)?;
        let r = self.regions.get(&index)?;
        Some((r.domain.session, r.stag, r.len, r.access))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    use crate::engine::ids::PdId;

    const S1: SessionId = SessionId(1);
    const S2: SessionId = SessionId(2);
    /// Session 1's default PD, session 1's second PD, session 2's default PD.
    const D1: Domain = Domain::new(S1, PdId(0));
    const D1B: Domain = Domain::new(S1, PdId(1));
    const D2: Domain = Domain::new(S2, PdId(0));

    fn reg(m: &mut MemoryRegistry, d: Domain, len: usize, access: Access) -> (MemoryRegionId, Stag) {
        m.register(d, Box::new(VecMemory::new(len)), access, 0).unwrap()
    }

    #[test]
    fn register_checks_parameters() {
        let mut m = MemoryRegistry::new(7);
        let e = m
            .register(D1, Box::new(VecMemory::new(8)), Access(8), 0)
            .unwrap_err();
        assert_eq!(e.status, NdStatus::InvalidParameter);
        let e = m
            .register(D1, Box::new(VecMemory::new(0)), Access::ALL, 0)
            .unwrap_err();
        assert_eq!(e.status, NdStatus::InvalidParameter);
        assert_eq!(m.count(), 0);
        let (id, stag) = reg(&mut m, D1, 8, Access::LOCAL_WRITE);
        assert_ne!(stag.index(), 0, "index 0 is reserved, as siw");
        assert_eq!(m.info(id), Some((S1, stag, 8, Access::LOCAL_WRITE)));
        assert_eq!((m.count(), m.session_count(S1), m.session_count(S2)), (1, 1, 0));
    }

    #[test]
    fn index_space_exhaustion() {
        let mut m = MemoryRegistry::with_capacity(1, 3);
        for _ in 0..3 {
            reg(&mut m, D1, 1, Access::ALL);
        }
        let e = m
            .register(D1, Box::new(VecMemory::new(1)), Access::ALL, 0)
            .unwrap_err();
        assert_eq!(e.status, NdStatus::InsufficientResources);
        // A freed slot is usable again.
        let id = MemoryRegionId(2);
        m.deregister(S1, id).unwrap();
        reg(&mut m, D1, 1, Access::ALL);
    }

    #[test]
    fn deregister_only_by_owner() {
        let mut m = MemoryRegistry::new(0);
        let (id, _) = reg(&mut m, D1, 4, Access::ALL);
        assert_eq!(
            m.deregister(S2, id).unwrap_err().status,
            NdStatus::InvalidParameter
        );
        assert_eq!(
            m.deregister(S1, MemoryRegionId(99)).unwrap_err().status,
            NdStatus::InvalidParameter
        );
        m.deregister(S1, id).unwrap();
        assert_eq!(
            m.deregister(S1, id).unwrap_err().status,
            NdStatus::InvalidParameter
        );
        assert_eq!(m.info(id), None);
    }

    #[test]
    fn check_order_and_outcomes() {
        use AccessError::{AccessRights, BaseOrBounds, InvalidStag, NotAssociated};
        let mut m = MemoryRegistry::new(3);
        let (_, stag) = reg(&mut m, D1, 100, Access::REMOTE_WRITE);
        let (w, r) = (Access::REMOTE_WRITE, Access::REMOTE_READ);
        let cases = [
            (D1, stag, 0, 100, w, Ok(())),
            (D1, stag, 100, 0, w, Ok(())),
            (D1, stag, 101, 0, w, Err(BaseOrBounds)),
            (D1, stag, 1, 100, w, Err(BaseOrBounds)),
            (D1, stag, u64::MAX, 2, w, Err(BaseOrBounds)),
            (D1, stag, 0, 1, r, Err(AccessRights)),
            // siw order: PD mismatch before rights and bounds.
            (D2, stag, 0, 1000, r, Err(NotAssociated)),
            // Another PD of the same session: refused as siw refuses `mem->pd != qp->pd`.
            (D1B, stag, 0, 1, w, Err(NotAssociated)),
            (D1, Stag(stag.0 ^ 1), 0, 1, w, Err(InvalidStag)),
            (D1, Stag(0), 0, 0, Access(0), Err(InvalidStag)),
            (D1, Stag(u32::MAX), 0, 0, Access(0), Err(InvalidStag)),
        ];
        for (domain, key, to, len, access, want) in cases {
            assert_eq!(
                m.check(domain, key, to, len, access),
                want,
                "check({domain:?}, {key:?}, {to}, {len}, {access:?})"
            );
        }
    }

    #[test]
    fn stale_key_after_reregistration() {
        let mut m = MemoryRegistry::new(42);
        let (id, old) = reg(&mut m, D1, 16, Access::ALL);
        m.deregister(S1, id).unwrap();
        assert_eq!(m.check(D1, old, 0, 1, Access(0)), Err(AccessError::InvalidStag));
        let (_, new) = reg(&mut m, D1, 16, Access::ALL);
        assert_ne!(new.index(), old.index(), "a freed index waits for the counter to come round");
        assert_eq!(m.check(D1, old, 0, 1, Access(0)), Err(AccessError::InvalidStag));
        assert_eq!(m.check(D1, new, 0, 1, Access(0)), Ok(()));
    }

    /// Consecutive registrations are not neighbours in the index space (a peer holding one STag learns
    /// nothing about the next), and the index permutation is a bijection: the whole 24-bit space is visited.
    #[test]
    fn indices_are_scattered_and_every_one_is_reachable() {
        let mut m = MemoryRegistry::new(0x5eed);
        let stags: Vec<Stag> = (0..64).map(|_| reg(&mut m, D1, 1, Access::ALL).1).collect();
        let near = stags
            .windows(2)
            .filter(|w| w[0].index().abs_diff(w[1].index()) < 256)
            .count();
        assert!(near <= 1, "{near} of 63 consecutive indices are within 256 of each other");
        let mut seen = vec![false; (MAX_INDEX as usize) + 1];
        for c in 0..=MAX_INDEX {
            let i = m.permute(c) as usize;
            assert!(!seen[i], "index {i} twice");
            seen[i] = true;
        }
    }

    /// A freed index comes back only after the counter has gone round the index space; a small registry
    /// that fills and empties still never repeats an STag.
    #[test]
    fn a_freed_index_waits_for_the_counter() {
        let mut m = MemoryRegistry::with_capacity(9, 2);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1000 {
            let (id, stag) = reg(&mut m, D1, 1, Access::ALL);
            assert!(seen.insert(stag.index()), "index {} reused", stag.index());
            m.deregister(S1, id).unwrap();
        }
    }

    #[test]
    fn invalidate_rules() {
        let mut m = MemoryRegistry::new(5);
        let (id, stag) = reg(&mut m, D1, 16, Access::ALL);
        assert_eq!(m.invalidate(D2, stag), Err(AccessError::NotAssociated));
        assert_eq!(m.invalidate(D1B, stag), Err(AccessError::NotAssociated), "another PD: siw EACCES");
        assert_eq!(
            m.invalidate(D1, Stag(stag.0 ^ 0x80)),
            Err(AccessError::InvalidStag)
        );
        assert_eq!(m.invalidate(D1, stag), Ok(()));
        assert_eq!(m.check(D1, stag, 0, 1, Access(0)), Err(AccessError::InvalidStag));
        assert_eq!(m.invalidate(D1, stag), Ok(()), "idempotent, as siw");
        // Still registered: the owner deregisters it.
        assert_eq!(m.count(), 1);
        m.deregister(S1, id).unwrap();
    }

    #[test]
    fn read_write_and_close_session() {
        let mut m = MemoryRegistry::new(9);
        let mem = VecMemory::new(8);
        let (_, stag) = m.register(D1, Box::new(mem.clone()), Access::ALL, 0).unwrap();
        m.write(stag, 2, b"abc");
        m.write(stag, 7, b"xyz"); // out of bounds: ignored
        m.write(Stag(0), 0, b"q"); // unknown: ignored
        assert_eq!(mem.bytes(), b"\0\0abc\0\0\0");
        let mut out = [0u8; 4];
        m.read(stag, 1, &mut out);
        assert_eq!(&out, b"\0abc");
        m.read(stag, u64::MAX, &mut out); // no panic
        reg(&mut m, D2, 4, Access::ALL);
        reg(&mut m, D1, 4, Access::ALL);
        m.close_session(S1);
        assert_eq!((m.count(), m.session_count(S1), m.session_count(S2)), (1, 0, 1));
    }

    #[test]
    fn vec_memory_ignores_out_of_range() {
        let v = VecMemory::from(vec![1, 2, 3]);
        let mut out = [9u8; 2];
        v.read_at(2, &mut out);
        assert_eq!(out, [9, 9]);
        v.write_at(u64::MAX, &[1]);
        v.fill_at(1, &[7]);
        assert_eq!(v.bytes(), vec![1, 7, 3]);
        assert_eq!(RegionMemory::len(&v), 3);
    }

    proptest! {
        /// No STag is ever handed out twice (within one turn of the index counter); a deregistered STag is
        /// refused; check never panics.
        #[test]
        fn stags_never_repeat(seed in any::<u64>(), ops in proptest::collection::vec(any::<(bool, u8)>(), 1..200)) {
            let mut m = MemoryRegistry::new(seed);
            let mut live: Vec<(MemoryRegionId, Stag)> = Vec::new();
            let mut handed: std::collections::HashSet<u32> = std::collections::HashSet::new();
            for (add, pick) in ops {
                if add || live.is_empty() {
                    let (id, stag) = reg(&mut m, D1, 4, Access::ALL);
                    prop_assert!(handed.insert(stag.index()));
                    live.push((id, stag));
                } else {
                    let (id, stag) = live.swap_remove(pick as usize % live.len());
                    m.deregister(S1, id).unwrap();
                    prop_assert_eq!(m.check(D1, stag, 0, 0, Access(0)), Err(AccessError::InvalidStag));
                }
                prop_assert_eq!(m.count(), live.len());
            }
        }

        #[test]
        fn check_never_panics(stag in any::<u32>(), off in any::<u64>(), len in any::<u64>(), need in any::<u8>()) {
            let mut m = MemoryRegistry::new(1);
            reg(&mut m, D1, 64, Access::ALL);
            let _ = m.check(D1, Stag(stag), off, len, Access(need));
            let mut out = [0u8; 8];
            m.read(Stag(stag), off, &mut out);
            m.write(Stag(stag), off, &out);
        }
    }

    /// A region registered at a tagged offset: peers name byte i as `iova + i`; below `iova` is outside it
    /// (siw: `addr < mem->va` → E_BASE_BOUNDS), and a region whose tagged offsets would wrap is refused.
    #[test]
    fn tagged_offsets_count_from_the_regions_iova() {
        let mut m = MemoryRegistry::new(1);
        let mem = VecMemory::new(16);
        let iova = 0x7f00_0000_1000;
        let (_, stag) = m.register(D1, Box::new(mem.clone()), Access::ALL, iova).unwrap();
        let at = m.offset_of(stag, iova + 4);
        assert_eq!(at, 4);
        assert_eq!(m.check(D1, stag, at, 12, Access::REMOTE_WRITE), Ok(()));
        m.write(stag, at, b"abcd");
        assert_eq!(&mem.bytes()[4..8], b"abcd");
        let below = m.offset_of(stag, iova - 1);
        assert_eq!(m.check(D1, stag, below, 1, Access::REMOTE_READ), Err(AccessError::BaseOrBounds));
        assert_eq!(m.check(D1, stag, m.offset_of(stag, iova + 13), 4, Access::REMOTE_READ), Err(AccessError::BaseOrBounds));
        assert_eq!(m.offset_of(Stag(stag.0 ^ 1), 99), 99, "unknown STag: left to the STag check");
        assert!(m.register(D1, Box::new(VecMemory::new(16)), Access::ALL, u64::MAX - 8).is_err());
    }
}
