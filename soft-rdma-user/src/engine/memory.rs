//! The memory registry: every registered memory region of the daemon, the STags that name them, and the
//! protection checks every data-path access goes through (RFC 5040 §2.1/§6.4 "STag", RFC 5041 §3 "tagged
//! buffer model", Linux siw `siw_mem.c`).
//!
//! A region is a [`RegionMemory`] (the daemon maps the client's memfd; tests use [`VecMemory`]), the session
//! that registered it, its access rights and its STag. The STag's upper 24 bits index the region table; the low
//! 8 bits are a key that changes every time the slot is reused, so a stale or guessed STag is refused (RFC 5040
//! §2.1: "STag ... key"). Index 0 is never handed out, as siw (`siw_mem_add` allocates ids from 1), so STag 0
//! (the RFC 6581 RTR's STag) never names a region.
//!
//! [`MemoryRegistry::check`] applies siw's `siw_check_mem` order: STag known and valid, same protection domain
//! (here: same session, RFC 5040 §6.4 "STag not associated with RDMAP stream"), access rights, then bounds.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use tracing::debug;

use super::ids::SessionId;
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
    /// The region belongs to another session: RFC 5040 §7.2 "STag not associated with RDMAP stream" (siw
    /// `E_PD_MISMATCH`).
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
    session: SessionId,
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

/// One index of the STag space. `last_key` survives deregistration so the next registration in this slot gets
/// a different key.
#[derive(Default)]
struct Slot {
    last_key: Option<u8>,
    region: Option<Region>,
}

/// The largest STag index (24 bits, RFC 5040 §2.1 via siw's `SIW_STAG_MAX_INDEX`).
const MAX_INDEX: u32 = 0x00FF_FFFF;

/// Every registered region of the daemon.
pub struct MemoryRegistry {
    /// Indexed by STag index; slot 0 is never used.
    slots: Vec<Slot>,
    /// Freed indices, reused last-freed-first (the key changes, so reuse is safe).
    free: Vec<u32>,
    by_id: HashMap<MemoryRegionId, u32>,
    next_id: u64,
    /// splitmix64 state for the key bytes.
    key_state: u64,
    /// Highest index handed out (2^24 - 1; lower in tests).
    max_index: u32,
}

impl fmt::Debug for MemoryRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegistry")
            .field("regions", &self.by_id.len())
            .finish_non_exhaustive()
    }
}

impl MemoryRegistry {
    /// An empty registry; the key byte sequence starts from `key_seed` (the daemon passes a random seed so
    /// STags are not predictable across runs).
    pub fn new(key_seed: u64) -> Self {
        MemoryRegistry {
            slots: vec![Slot::default()],
            free: Vec::new(),
            by_id: HashMap::new(),
            next_id: 1,
            key_state: key_seed,
            max_index: MAX_INDEX,
        }
    }

    /// Tests: a registry whose STag index space ends at `max_index`.
    #[cfg(test)]
    fn with_max_index(key_seed: u64, max_index: u32) -> Self {
        MemoryRegistry {
            max_index,
            ..MemoryRegistry::new(key_seed)
        }
    }

    fn next_key(&mut self) -> u8 {
        // splitmix64 (Steele, Lea, Flood 2014): a cheap, well-mixed sequence from the seed.
        self.key_state = self.key_state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.key_state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) as u8
    }

    /// Registers `memory` for `session`. The STag is a free index (24 bits) and a key byte that differs from
    /// the previous key used at that index (RFC 5040 §2.1; siw `siw_mr_add_mem` / `ib_inc_rkey`).
    /// Peers address the region's first byte as tagged offset `iova` (see [`MemoryRegistry::offset_of`]; 0
    /// for the Rust library's regions).
    /// Errors: access bits outside [`Access::ALL`] or a zero-length region → INVALID_PARAMETER, as is a region
    /// whose tagged offsets would wrap (RFC 5040 §7.2 "TO wrap"); the index space (2^24 - 1 regions, index 0
    /// reserved) exhausted → INSUFFICIENT_RESOURCES.
    pub fn register(
        &mut self,
        session: SessionId,
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
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                let next = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
                if next > self.max_index {
                    return Err(Error::new(
                        NdStatus::InsufficientResources,
                        "the STag index space (2^24 regions) is exhausted",
                    ));
                }
                self.slots.try_reserve(1).map_err(|_| no_memory("STag table"))?;
                self.slots.push(Slot::default());
                next
            }
        };
        let mut key = self.next_key();
        let Some(slot) = self.slots.get_mut(index as usize) else {
            // Unreachable: every free index and every pushed index has a slot.
            return Err(Error::new(NdStatus::InsufficientResources, "no free STag slot"));
        };
        if slot.last_key == Some(key) {
            key = key.wrapping_add(1);
        }
        slot.last_key = Some(key);
        let stag = Stag::new(index, key);
        let id = MemoryRegionId(self.next_id);
        self.next_id += 1;
        slot.region = Some(Region {
            id,
            session,
            stag,
            access,
            len,
            iova,
            valid: true,
            memory,
        });
        self.by_id.insert(id, index);
        debug!(
            session = session.0,
            mr = id.0,
            stag = stag.0,
            len,
            access = access.0,
            "memory region registered"
        );
        Ok((id, stag))
    }

    /// Deregisters `id`. Only the owning session may; any other session gets INVALID_PARAMETER exactly as for a
    /// region that does not exist (api.rs: no information leaks across sessions). Frees the slot.
    pub fn deregister(&mut self, session: SessionId, id: MemoryRegionId) -> Result<(), Error> {
        let owned = self
            .by_id
            .get(&id)
            .and_then(|&i| self.slots.get(i as usize))
            .and_then(|s| s.region.as_ref())
            .is_some_and(|r| r.session == session);
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
            if let Some(slot) = self.slots.get_mut(index as usize) {
                slot.region = None;
            }
            self.free.push(index);
            debug!(mr = id.0, index, "memory region deregistered");
        }
    }

    fn region(&self, stag: Stag) -> Option<&Region> {
        self.slots
            .get(stag.index() as usize)
            .and_then(|s| s.region.as_ref())
            .filter(|r| r.stag == stag)
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

    /// Checks that `[offset, offset+len)` lies in the region named by `stag`, that the region is registered and
    /// not invalidated, belongs to `session`, and grants `need`. `len` 0 is allowed for any `offset` up to the
    /// region's length. Order and outcomes as siw's `siw_check_mem`: STag, protection domain, rights, bounds.
    pub fn check(
        &self,
        session: SessionId,
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
        if r.session != session {
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
    /// further accesses get [`AccessError::InvalidStag`]. The region must belong to `session` (siw
    /// `siw_invalidate_stag`: PD mismatch refused). Invalidating an already invalid STag succeeds, as in siw.
    pub fn invalidate(&mut self, session: SessionId, stag: Stag) -> Result<(), AccessError> {
        let r = self
            .slots
            .get_mut(stag.index() as usize)
            .and_then(|s| s.region.as_mut())
            .filter(|r| r.stag == stag)
            .ok_or(AccessError::InvalidStag)?;
        if r.session != session {
            return Err(AccessError::NotAssociated);
        }
        r.valid = false;
        debug!(session = session.0, stag = stag.0, "STag invalidated");
        Ok(())
    }

    /// Deregisters everything `session` owns (the session closed).
    pub fn close_session(&mut self, session: SessionId) {
        let ids: Vec<MemoryRegionId> = self
            .slots
            .iter()
            .filter_map(|s| s.region.as_ref())
            .filter(|r| r.session == session)
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
        self.slots
            .iter()
            .filter_map(|s| s.region.as_ref())
            .filter(|r| r.session == session)
            .count()
    }

    /// Owner, STag, length and access of a region.
    pub fn info(&self, id: MemoryRegionId) -> Option<(SessionId, Stag, u64, Access)> {
        let index = *self.by_id.get(&id)?;
        let r = self.slots.get(index as usize)?.region.as_ref()?;
        Some((r.session, r.stag, r.len, r.access))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S1: SessionId = SessionId(1);
    const S2: SessionId = SessionId(2);

    fn reg(m: &mut MemoryRegistry, s: SessionId, len: usize, access: Access) -> (MemoryRegionId, Stag) {
        m.register(s, Box::new(VecMemory::new(len)), access, 0).unwrap()
    }

    #[test]
    fn register_checks_parameters() {
        let mut m = MemoryRegistry::new(7);
        let e = m
            .register(S1, Box::new(VecMemory::new(8)), Access(8), 0)
            .unwrap_err();
        assert_eq!(e.status, NdStatus::InvalidParameter);
        let e = m
            .register(S1, Box::new(VecMemory::new(0)), Access::ALL, 0)
            .unwrap_err();
        assert_eq!(e.status, NdStatus::InvalidParameter);
        assert_eq!(m.count(), 0);
        let (id, stag) = reg(&mut m, S1, 8, Access::LOCAL_WRITE);
        assert_ne!(stag.index(), 0, "index 0 is reserved, as siw");
        assert_eq!(m.info(id), Some((S1, stag, 8, Access::LOCAL_WRITE)));
        assert_eq!((m.count(), m.session_count(S1), m.session_count(S2)), (1, 1, 0));
    }

    #[test]
    fn index_space_exhaustion() {
        let mut m = MemoryRegistry::with_max_index(1, 3);
        for _ in 0..3 {
            reg(&mut m, S1, 1, Access::ALL);
        }
        let e = m
            .register(S1, Box::new(VecMemory::new(1)), Access::ALL, 0)
            .unwrap_err();
        assert_eq!(e.status, NdStatus::InsufficientResources);
        // A freed slot is usable again.
        let id = MemoryRegionId(2);
        m.deregister(S1, id).unwrap();
        reg(&mut m, S1, 1, Access::ALL);
    }

    #[test]
    fn deregister_only_by_owner() {
        let mut m = MemoryRegistry::new(0);
        let (id, _) = reg(&mut m, S1, 4, Access::ALL);
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
        let (_, stag) = reg(&mut m, S1, 100, Access::REMOTE_WRITE);
        let (w, r) = (Access::REMOTE_WRITE, Access::REMOTE_READ);
        let cases = [
            (S1, stag, 0, 100, w, Ok(())),
            (S1, stag, 100, 0, w, Ok(())),
            (S1, stag, 101, 0, w, Err(BaseOrBounds)),
            (S1, stag, 1, 100, w, Err(BaseOrBounds)),
            (S1, stag, u64::MAX, 2, w, Err(BaseOrBounds)),
            (S1, stag, 0, 1, r, Err(AccessRights)),
            // siw order: PD mismatch before rights and bounds.
            (S2, stag, 0, 1000, r, Err(NotAssociated)),
            (S1, Stag(stag.0 ^ 1), 0, 1, w, Err(InvalidStag)),
            (S1, Stag(0), 0, 0, Access(0), Err(InvalidStag)),
            (S1, Stag(u32::MAX), 0, 0, Access(0), Err(InvalidStag)),
        ];
        for (session, key, to, len, access, want) in cases {
            assert_eq!(
                m.check(session, key, to, len, access),
                want,
                "check({session:?}, {key:?}, {to}, {len}, {access:?})"
            );
        }
    }

    #[test]
    fn stale_key_after_reregistration() {
        let mut m = MemoryRegistry::new(42);
        let (id, old) = reg(&mut m, S1, 16, Access::ALL);
        m.deregister(S1, id).unwrap();
        assert_eq!(m.check(S1, old, 0, 1, Access(0)), Err(AccessError::InvalidStag));
        let (_, new) = reg(&mut m, S1, 16, Access::ALL);
        assert_eq!(new.index(), old.index(), "same slot");
        assert_ne!(new.key(), old.key());
        assert_eq!(m.check(S1, old, 0, 1, Access(0)), Err(AccessError::InvalidStag));
        assert_eq!(m.check(S1, new, 0, 1, Access(0)), Ok(()));
    }

    #[test]
    fn invalidate_rules() {
        let mut m = MemoryRegistry::new(5);
        let (id, stag) = reg(&mut m, S1, 16, Access::ALL);
        assert_eq!(m.invalidate(S2, stag), Err(AccessError::NotAssociated));
        assert_eq!(
            m.invalidate(S1, Stag(stag.0 ^ 0x80)),
            Err(AccessError::InvalidStag)
        );
        assert_eq!(m.invalidate(S1, stag), Ok(()));
        assert_eq!(m.check(S1, stag, 0, 1, Access(0)), Err(AccessError::InvalidStag));
        assert_eq!(m.invalidate(S1, stag), Ok(()), "idempotent, as siw");
        // Still registered: the owner deregisters it.
        assert_eq!(m.count(), 1);
        m.deregister(S1, id).unwrap();
    }

    #[test]
    fn read_write_and_close_session() {
        let mut m = MemoryRegistry::new(9);
        let mem = VecMemory::new(8);
        let (_, stag) = m.register(S1, Box::new(mem.clone()), Access::ALL, 0).unwrap();
        m.write(stag, 2, b"abc");
        m.write(stag, 7, b"xyz"); // out of bounds: ignored
        m.write(Stag(0), 0, b"q"); // unknown: ignored
        assert_eq!(mem.bytes(), b"\0\0abc\0\0\0");
        let mut out = [0u8; 4];
        m.read(stag, 1, &mut out);
        assert_eq!(&out, b"\0abc");
        m.read(stag, u64::MAX, &mut out); // no panic
        reg(&mut m, S2, 4, Access::ALL);
        reg(&mut m, S1, 4, Access::ALL);
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
        /// Keys at a reused slot always change; live STags are unique; check never panics.
        #[test]
        fn slot_reuse_changes_key(seed in any::<u64>(), ops in proptest::collection::vec(any::<(bool, u8)>(), 1..200)) {
            let mut m = MemoryRegistry::new(seed);
            let mut live: Vec<(MemoryRegionId, Stag)> = Vec::new();
            let mut last: HashMap<u32, u8> = HashMap::new();
            for (add, pick) in ops {
                if add || live.is_empty() {
                    let (id, stag) = reg(&mut m, S1, 4, Access::ALL);
                    if let Some(k) = last.get(&stag.index()) {
                        prop_assert_ne!(*k, stag.key());
                    }
                    last.insert(stag.index(), stag.key());
                    prop_assert!(live.iter().all(|(_, s)| *s != stag));
                    live.push((id, stag));
                } else {
                    let (id, stag) = live.swap_remove(pick as usize % live.len());
                    m.deregister(S1, id).unwrap();
                    prop_assert_eq!(m.check(S1, stag, 0, 0, Access(0)), Err(AccessError::InvalidStag));
                }
                prop_assert_eq!(m.count(), live.len());
            }
        }

        #[test]
        fn check_never_panics(stag in any::<u32>(), off in any::<u64>(), len in any::<u64>(), need in any::<u8>()) {
            let mut m = MemoryRegistry::new(1);
            reg(&mut m, S1, 64, Access::ALL);
            let _ = m.check(S1, Stag(stag), off, len, Access(need));
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
        let (_, stag) = m.register(S1, Box::new(mem.clone()), Access::ALL, iova).unwrap();
        let at = m.offset_of(stag, iova + 4);
        assert_eq!(at, 4);
        assert_eq!(m.check(S1, stag, at, 12, Access::REMOTE_WRITE), Ok(()));
        m.write(stag, at, b"abcd");
        assert_eq!(&mem.bytes()[4..8], b"abcd");
        let below = m.offset_of(stag, iova - 1);
        assert_eq!(m.check(S1, stag, below, 1, Access::REMOTE_READ), Err(AccessError::BaseOrBounds));
        assert_eq!(m.check(S1, stag, m.offset_of(stag, iova + 13), 4, Access::REMOTE_READ), Err(AccessError::BaseOrBounds));
        assert_eq!(m.offset_of(Stag(stag.0 ^ 1), 99), 99, "unknown STag: left to the STag check");
        assert!(m.register(S1, Box::new(VecMemory::new(16)), Access::ALL, u64::MAX - 8).is_err());
    }
}
