//! One ring's place in a shared mapping: the header layout, the geometry, and the only code in [`super`]
//! that touches the shared bytes.
//!
//! Layout of a ring at byte `base` of the mapping (`base` a multiple of 64):
//!
//! | offset | written by | field |
//! |---|---|---|
//! | 0 | the creator (the daemon) | magic `SRRG`, layout version, capacity, entry size (u32 each) |
//! | 64 | the producer | producer index (u32), producer needs wakeup (u32: waiting for room) |
//! | 128 | the consumer | consumer index (u32), consumer needs wakeup (u32: waiting for entries) |
//! | 192 | the producer | `capacity` entries of `entry size` bytes |
//!
//! Indices run free (wrapping u32); entry `i` lives in slot `i & (capacity - 1)`. The two sides' fields sit
//! on separate cache lines so that neither side's stores invalidate the line the other side writes.
//!
//! Every access is an atomic load or store of an aligned u32 or u64 inside the mapping, so bytes the other
//! process writes concurrently are never a data race in this process, and entries are copied out whole into
//! local values: no Rust reference to shared data leaves this file. Offsets come only from the geometry the
//! view was built with (checked against the mapping once), never from the shared bytes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::RingError;
use crate::shm::SharedMemory;

/// The alignment of a ring's base and of its index lines.
pub const CACHE_LINE: usize = 64;
/// Bytes before the first entry.
pub const HEADER_LEN: usize = 3 * CACHE_LINE;
/// `SRRG`, little-endian.
pub const MAGIC: u32 = u32::from_le_bytes(*b"SRRG");
/// Bumped when the layout or an entry encoding changes.
pub const LAYOUT_VERSION: u32 = 1;
/// The most entries a ring may have (the deepest queue the adapter allows is far below).
pub const MAX_CAPACITY: u32 = 1 << 16;
/// The largest entry, in 8-byte words.
pub const MAX_ENTRY_WORDS: usize = 32;

const INFO_MAGIC: usize = 0;
const INFO_VERSION: usize = 4;
const INFO_CAPACITY: usize = 8;
const INFO_ENTRY_SIZE: usize = 12;
const PRODUCER_INDEX: usize = CACHE_LINE;
const PRODUCER_NEEDS_WAKEUP: usize = CACHE_LINE + 4;
const CONSUMER_INDEX: usize = 2 * CACHE_LINE;
const CONSUMER_NEEDS_WAKEUP: usize = 2 * CACHE_LINE + 4;

/// A fixed-size ring entry: plain bytes, a whole number of 8-byte words, at most [`MAX_ENTRY_WORDS`].
pub trait RingEntry: FromBytes + IntoBytes + KnownLayout + Immutable + Copy {
    const SIZE: usize = {
        let size = std::mem::size_of::<Self>();
        assert!(size > 0 && size.is_multiple_of(8) && size / 8 <= MAX_ENTRY_WORDS);
        size
    };
}

/// A ring's shape: a power-of-two capacity and an entry size in bytes (a multiple of 8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingGeometry {
    capacity: u32,
    entry_size: u32,
}

impl RingGeometry {
    /// A ring of at least `min_entries` (rounded up to a power of two) entries of type `E`.
    pub fn for_entries<E: RingEntry>(min_entries: u32) -> Result<Self, RingError> {
        let capacity = min_entries.max(1).checked_next_power_of_two().unwrap_or(u32::MAX);
        if capacity > MAX_CAPACITY {
            return Err(RingError::Geometry(format!(
                "{min_entries} entries asked; a ring holds at most {MAX_CAPACITY}"
            )));
        }
        Ok(RingGeometry {
            capacity,
            entry_size: E::SIZE as u32,
        })
    }

    pub fn capacity(self) -> u32 {
        self.capacity
    }

    pub fn entry_size(self) -> usize {
        self.entry_size as usize
    }

    /// Bytes the ring occupies, header included, rounded up to a cache line.
    pub fn bytes(self) -> usize {
        let entries = self.capacity as usize * self.entry_size();
        (HEADER_LEN + entries).next_multiple_of(CACHE_LINE)
    }
}

/// One of the four header words the two sides exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Word {
    ProducerIndex,
    ProducerNeedsWakeup,
    ConsumerIndex,
    ConsumerNeedsWakeup,
}

impl Word {
    fn offset(self) -> usize {
        match self {
            Word::ProducerIndex => PRODUCER_INDEX,
            Word::ProducerNeedsWakeup => PRODUCER_NEEDS_WAKEUP,
            Word::ConsumerIndex => CONSUMER_INDEX,
            Word::ConsumerNeedsWakeup => CONSUMER_NEEDS_WAKEUP,
        }
    }
}

/// What the creator wrote in the first header line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingInfo {
    pub magic: u32,
    pub version: u32,
    pub capacity: u32,
    pub entry_size: u32,
}

/// One ring inside a shared mapping, bounds-checked once at construction.
#[derive(Debug)]
pub struct RingView {
    mem: Arc<SharedMemory>,
    base: usize,
    geometry: RingGeometry,
}

impl RingView {
    /// The ring at byte `base` of `mem`. `base` must be a multiple of [`CACHE_LINE`] and the ring must fit
    /// in the mapping.
    pub fn new(mem: Arc<SharedMemory>, base: usize, geometry: RingGeometry) -> Result<Self, RingError> {
        if !base.is_multiple_of(CACHE_LINE) || !(mem.as_ptr() as usize).is_multiple_of(CACHE_LINE) {
            return Err(RingError::Geometry(format!(
                "ring at offset {base} is not aligned to {CACHE_LINE} bytes"
            )));
        }
        match base.checked_add(geometry.bytes()) {
            Some(end) if end <= mem.len() => {}
            _ => {
                return Err(RingError::Geometry(format!(
                    "a ring of {} bytes at offset {base} does not fit in a {}-byte mapping",
                    geometry.bytes(),
                    mem.len()
                )));
            }
        }
        Ok(RingView { mem, base, geometry })
    }

    pub fn geometry(&self) -> RingGeometry {
        self.geometry
    }

    /// Refuses a ring whose entries are not `size` bytes (a producer or consumer of another entry type).
    pub fn expect_entry_size(&self, size: usize) -> Result<(), RingError> {
        let have = self.geometry.entry_size();
        if have != size {
            return Err(RingError::Geometry(format!(
                "entries of {size} bytes in a ring of {have}-byte entries"
            )));
        }
        Ok(())
    }

    /// The aligned u32 at `offset` from the ring's base.
    fn u32_at(&self, offset: usize) -> &AtomicU32 {
        debug_assert!(offset.is_multiple_of(4) && offset + 4 <= self.geometry.bytes());
        // SAFETY: `new` checked that `base + geometry.bytes()` lies in the live mapping, which `self.mem`
        // keeps alive for the returned borrow; every offset used here is a header constant below
        // HEADER_LEN, a multiple of 4, and the mapping and `base` are 64-byte aligned, so the pointer is
        // in bounds and aligned for AtomicU32. The other process may write the word at any time, which an
        // atomic permits; nothing in this process accesses it non-atomically.
        unsafe { AtomicU32::from_ptr(self.mem.as_ptr().add(self.base + offset).cast()) }
    }

    /// The aligned u64 `word` of the entry in slot `slot` (< capacity).
    fn entry_word(&self, slot: u32, word: usize) -> &AtomicU64 {
        let offset = HEADER_LEN + slot as usize * self.geometry.entry_size() + word * 8;
        debug_assert!(slot < self.geometry.capacity && offset + 8 <= self.geometry.bytes());
        // SAFETY: `slot < capacity` (callers mask the index) and `word < entry_size / 8`, so the word lies
        // inside the entries area that `new` checked against the mapping, kept alive by `self.mem`; the
        // base, HEADER_LEN and the entry size are multiples of 8, so it is aligned for AtomicU64. Shared
        // words are only ever accessed atomically by this process.
        unsafe { AtomicU64::from_ptr(self.mem.as_ptr().add(self.base + offset).cast()) }
    }

    pub fn load(&self, word: Word, order: Ordering) -> u32 {
        self.u32_at(word.offset()).load(order)
    }

    pub fn store(&self, word: Word, value: u32, order: Ordering) {
        self.u32_at(word.offset()).store(value, order)
    }

    /// The creator writes the first header line and zeroes the index lines.
    pub fn initialize(&self) {
        for (offset, value) in [
            (INFO_MAGIC, MAGIC),
            (INFO_VERSION, LAYOUT_VERSION),
            (INFO_CAPACITY, self.geometry.capacity),
            (INFO_ENTRY_SIZE, self.geometry.entry_size),
            (PRODUCER_INDEX, 0),
            (PRODUCER_NEEDS_WAKEUP, 0),
            (CONSUMER_INDEX, 0),
            (CONSUMER_NEEDS_WAKEUP, 0),
        ] {
            self.u32_at(offset).store(value, Ordering::Relaxed);
        }
    }

    pub fn info(&self) -> RingInfo {
        RingInfo {
            magic: self.u32_at(INFO_MAGIC).load(Ordering::Relaxed),
            version: self.u32_at(INFO_VERSION).load(Ordering::Relaxed),
            capacity: self.u32_at(INFO_CAPACITY).load(Ordering::Relaxed),
            entry_size: self.u32_at(INFO_ENTRY_SIZE).load(Ordering::Relaxed),
        }
    }

    /// Copies entry `index` (any free-running index; it is masked) out of the ring. The bytes may be torn
    /// if the other side writes the slot meanwhile; the caller validates whatever it gets.
    pub fn read_entry<E: RingEntry>(&self, index: u32) -> E {
        let slot = index & (self.geometry.capacity - 1);
        let mut words = [0u64; MAX_ENTRY_WORDS];
        let n = E::SIZE / 8;
        for (i, w) in words[..n].iter_mut().enumerate() {
            *w = self.entry_word(slot, i).load(Ordering::Relaxed);
        }
        let bytes = &words.as_bytes()[..E::SIZE];
        E::read_from_bytes(bytes).unwrap_or_else(|_| E::new_zeroed())
    }

    /// Copies `entry` into slot `index & (capacity - 1)`.
    pub fn write_entry<E: RingEntry>(&self, index: u32, entry: &E) {
        let slot = index & (self.geometry.capacity - 1);
        let mut words = [0u64; MAX_ENTRY_WORDS];
        let n = E::SIZE / 8;
        words.as_mut_bytes()[..E::SIZE].copy_from_slice(entry.as_bytes());
        for (i, w) in words[..n].iter().enumerate() {
            self.entry_word(slot, i).store(*w, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rings::entries::{CompletionEntry, SendEntry};
    use zerocopy::FromZeros;

    #[test]
    fn geometry_rounds_up_and_is_bounded() {
        let g = RingGeometry::for_entries::<SendEntry>(100).unwrap();
        assert_eq!(g.capacity(), 128);
        assert_eq!(g.bytes(), HEADER_LEN + 128 * SendEntry::SIZE);
        assert_eq!(RingGeometry::for_entries::<SendEntry>(0).unwrap().capacity(), 1);
        assert_eq!(
            RingGeometry::for_entries::<SendEntry>(MAX_CAPACITY)
                .unwrap()
                .capacity(),
            MAX_CAPACITY
        );
        for n in [MAX_CAPACITY + 1, u32::MAX] {
            let e = RingGeometry::for_entries::<SendEntry>(n).unwrap_err();
            assert!(matches!(e, RingError::Geometry(_)), "{e}");
        }
    }

    #[test]
    fn view_must_fit_and_be_aligned() {
        let g = RingGeometry::for_entries::<CompletionEntry>(4).unwrap();
        let mem = Arc::new(SharedMemory::create("soft-rdma-test", g.bytes() + 64).unwrap());
        RingView::new(mem.clone(), 0, g).unwrap();
        RingView::new(mem.clone(), 64, g).unwrap();
        for base in [8, 128, usize::MAX - 63] {
            let e = RingView::new(mem.clone(), base, g).unwrap_err();
            assert!(matches!(e, RingError::Geometry(_)), "{base}: {e}");
        }
    }

    #[test]
    fn entries_and_header_round_trip_through_two_mappings() {
        let g = RingGeometry::for_entries::<CompletionEntry>(4).unwrap();
        let a = Arc::new(SharedMemory::create("soft-rdma-test", g.bytes()).unwrap());
        let fd = a.fd().unwrap().try_clone_to_owned().unwrap();
        let b = Arc::new(SharedMemory::from_fd(fd, g.bytes()).unwrap());
        let (va, vb) = (RingView::new(a, 0, g).unwrap(), RingView::new(b, 0, g).unwrap());
        va.initialize();
        assert_eq!(
            vb.info(),
            RingInfo {
                magic: MAGIC,
                version: LAYOUT_VERSION,
                capacity: 4,
                entry_size: CompletionEntry::SIZE as u32
            }
        );
        let mut e = CompletionEntry::new_zeroed();
        e.wr_id.set(0x1122_3344_5566_7788);
        va.write_entry(6, &e); // slot 2
        assert_eq!(
            vb.read_entry::<CompletionEntry>(2).wr_id.get(),
            0x1122_3344_5566_7788
        );
        vb.store(Word::ConsumerIndex, 7, Ordering::Release);
        assert_eq!(va.load(Word::ConsumerIndex, Ordering::Acquire), 7);
    }
}
