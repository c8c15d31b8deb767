//! Memory the application already has, registered in place: what `ibv_reg_mr` does with a program's own
//! buffer (rdma-core `infiniband/verbs.h`: `ibv_reg_mr`, `ibv_reg_mr_iova2`), for the C libraries built on this
//! client.
//!
//! This module owns [`BorrowedMemory`] (the caller's bytes as a region's memory, in this process) and
//! [`RegionBytes`] (what a [`MemoryRegion`](super::MemoryRegion) holds: the library's shared mapping or a
//! borrowed buffer), with the bounds-checked copies both offer.
//!
//! Where the bytes are reached from:
//! - the in-process data path (kernel-TCP mode) reads and writes them here, and sends them in place;
//! - soft-rdmad (daemon rings, XDP mode) cannot map them; it reaches them through `/proc/<pid>/mem` of the
//!   client's process, named by the kernel's SO_PEERCRED of the session (`uds::process_memory`).

use std::fmt;
use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::engine::memory::{PinnedMemory, RegionMemory};
use crate::shm::SharedMemory;

/// `len` bytes at `base` that the application owns and keeps valid while the region is registered.
#[derive(Clone)]
pub(crate) struct BorrowedMemory {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the bytes are the application's, which promised (`register_borrowed_memory`'s contract) that they stay
// valid while registered; they are only ever copied to and from (or handed to the kernel), never referenced as
// Rust values, so sharing the address between threads is sound.
unsafe impl Send for BorrowedMemory {}
// SAFETY: as for Send.
unsafe impl Sync for BorrowedMemory {}

impl BorrowedMemory {
    /// # Safety
    /// `base..base + len` must be readable and writable memory of this process, and stay so until every
    /// region made from this value is deregistered.
    pub(crate) unsafe fn new(base: NonNull<u8>, len: usize) -> Self {
        BorrowedMemory { base, len }
    }

    pub(crate) fn address(&self) -> u64 {
        self.base.as_ptr() as u64
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn range(&self, offset: usize, len: usize, what: &str) -> io::Result<*mut u8> {
        match offset.checked_add(len) {
            // SAFETY: `offset + len <= self.len`: the address stays inside the borrowed bytes.
            Some(end) if end <= self.len => Ok(unsafe { self.base.as_ptr().add(offset) }),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{what} of {len} bytes at offset {offset} is outside the {}-byte region",
                    self.len
                ),
            )),
        }
    }

    fn read_into(&self, offset: usize, out: &mut [u8]) -> io::Result<()> {
        let src = self.range(offset, out.len(), "read")?;
        // SAFETY: `src..src + out.len()` is inside the borrowed bytes (checked by `range`); `out` is a Rust buffer
        // of this library, never inside the application's registered bytes.
        unsafe { std::ptr::copy_nonoverlapping(src.cast_const(), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    fn write_from(&self, offset: usize, data: &[u8]) -> io::Result<()> {
        let dst = self.range(offset, data.len(), "write")?;
        // SAFETY: as for `read_into`, the other way.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        Ok(())
    }

    fn fill(&self, offset: usize, len: usize, byte: u8) -> io::Result<()> {
        let dst = self.range(offset, len, "fill")?;
        // SAFETY: `dst..dst + len` is inside the borrowed bytes (checked by `range`).
        unsafe { std::ptr::write_bytes(dst, byte, len) };
        Ok(())
    }
}

impl fmt::Debug for BorrowedMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BorrowedMemory")
            .field("address", &format_args!("{:#x}", self.address()))
            .field("len", &self.len)
            .finish()
    }
}

impl RegionMemory for BorrowedMemory {
    fn len(&self) -> u64 {
        self.len as u64
    }

    fn read_at(&self, offset: u64, out: &mut [u8]) {
        // The registry checked the bounds; a failure here is only logged (never a panic).
        if let Err(e) = usize::try_from(offset)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
            .and_then(|o| self.read_into(o, out))
        {
            tracing::error!("borrowed region read skipped: {e}");
        }
    }

    fn write_at(&self, offset: u64, data: &[u8]) {
        if let Err(e) = usize::try_from(offset)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
            .and_then(|o| self.write_from(o, data))
        {
            tracing::error!("borrowed region write skipped: {e}");
        }
    }

    fn pinned(&self) -> Option<PinnedMemory> {
        // SAFETY: the bytes stay valid while registered (the contract of `new`); a gathered write holding this
        // after deregistration is the application's error, as with any RDMA buffer freed under a posted request.
        Some(unsafe { PinnedMemory::new(self.base, self.len, Arc::new(())) })
    }
}

/// The bytes of a [`MemoryRegion`](super::MemoryRegion): the library's shared mapping
/// ([`Adapter::register_memory`](super::Adapter::register_memory)) or the application's own
/// ([`Adapter::register_borrowed_memory`](super::Adapter::register_borrowed_memory)).
pub(crate) enum RegionBytes {
    Shared(Arc<SharedMemory>),
    Borrowed(BorrowedMemory),
}

impl RegionBytes {
    pub(crate) fn len(&self) -> usize {
        match self {
            RegionBytes::Shared(m) => SharedMemory::len(m),
            RegionBytes::Borrowed(m) => m.len,
        }
    }

    pub(crate) fn read_at(&self, offset: usize, out: &mut [u8]) -> io::Result<()> {
        match self {
            RegionBytes::Shared(m) => SharedMemory::read_at(m, offset, out),
            RegionBytes::Borrowed(m) => m.read_into(offset, out),
        }
    }

    pub(crate) fn write_at(&self, offset: usize, data: &[u8]) -> io::Result<()> {
        match self {
            RegionBytes::Shared(m) => SharedMemory::write_at(m, offset, data),
            RegionBytes::Borrowed(m) => m.write_from(offset, data),
        }
    }

    pub(crate) fn fill(&self, offset: usize, len: usize, byte: u8) -> io::Result<()> {
        match self {
            RegionBytes::Shared(m) => m.fill(offset, len, byte),
            RegionBytes::Borrowed(m) => m.fill(offset, len, byte),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_stay_inside_the_borrowed_bytes() {
        let mut buf = vec![0u8; 16];
        let m = unsafe { BorrowedMemory::new(NonNull::new(buf.as_mut_ptr()).unwrap(), buf.len()) };
        RegionMemory::write_at(&m, 4, b"abcd");
        let mut out = [0u8; 4];
        RegionMemory::read_at(&m, 4, &mut out);
        assert_eq!(&out, b"abcd");
        assert!(m.write_from(14, b"xyz").is_err(), "past the end");
        assert!(m.read_into(usize::MAX, &mut out).is_err(), "offset overflow");
        m.fill(0, 2, 7).unwrap();
        let pinned = m.pinned().unwrap();
        assert!(pinned.range(15, 2).is_none());
        assert_eq!(&buf[..8], &[7, 7, 0, 0, b'a', b'b', b'c', b'd']);
    }
}
