//! Registered memory shared between a client process and soft-rdmad.
//!
//! This module owns [`SharedMemory`]: a `MAP_SHARED` mapping of a sealed memfd. The client creates the
//! memfd ([`SharedMemory::create`]) and passes its descriptor to the daemon over the Unix socket
//! (`uds::fdpass`); the daemon maps the same pages ([`SharedMemory::from_fd`]). A one-sided RDMA Write
//! the daemon executes therefore lands directly in the client's memory, and an RDMA Read is served from
//! it, without the client doing anything.
//!
//! Safety against the other side: the memfd is sealed against shrinking (and growing) before it is
//! shared, and the daemon refuses a descriptor that is not sealed against shrinking or is shorter than the
//! length it is asked to map. Otherwise a client could truncate the file under the daemon's mapping and
//! crash the daemon with SIGBUS on its next access.
//!
//! Contents: the pages are writable by both processes at any time, exactly like any RDMA buffer. All
//! access here goes through bounds-checked copying methods ([`SharedMemory::read_at`],
//! [`SharedMemory::write_at`], [`SharedMemory::fill`]); the bytes observed may change underneath a copy
//! if the other process writes concurrently (torn reads are possible, as with any RDMA buffer), but no
//! Rust reference to the shared bytes is ever handed out.

use std::fmt;
use std::io;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::{self, NonNull};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::mman::{MapFlags, ProtFlags, mmap, munmap};
use nix::sys::stat::{SFlag, fstat};
use nix::unistd::ftruncate;

/// A `MAP_SHARED` read-write mapping of a memfd. Both the client (which creates it) and the daemon (which
/// receives the fd over the Unix socket) map the same pages, so a one-sided RDMA Write lands in the
/// client's memory without the client doing anything.
///
/// The mapping covers `[0, len)` of the file and lives until the value is dropped (munmap). The creator
/// keeps the descriptor open alongside it so it can be passed on ([`SharedMemory::fd`]); the daemon's
/// mapping ([`SharedMemory::from_fd`]) closes it once mapped: a mapping needs no descriptor, and a client
/// must not be able to hold one of the daemon's descriptors per region.
pub struct SharedMemory {
    ptr: NonNull<u8>,
    len: usize,
    fd: Option<OwnedFd>,
}

// SAFETY: the mapping is plain shared bytes owned by this value (nothing in it is tied to the creating
// thread), and the raw pointer is only dereferenced by the copying methods, which take `&self`, stay in
// bounds and never create Rust references to the shared bytes. Concurrent copies from several threads are
// no different from concurrent access by the other process, which the contents contract already allows.
unsafe impl Send for SharedMemory {}
// SAFETY: see `Send`: every `&self` method only copies bytes in or out of the mapping through raw
// pointers, so sharing `&SharedMemory` between threads cannot produce aliasing Rust references.
unsafe impl Sync for SharedMemory {}

/// An `io::Error` of `errno`'s kind, saying what failed.
fn os_error(errno: Errno, what: impl fmt::Display) -> io::Error {
    io::Error::new(io::Error::from(errno).kind(), format!("{what}: {errno}"))
}

fn invalid_input(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

impl SharedMemory {
    /// Creates a memfd named `name` (`MFD_CLOEXEC | MFD_ALLOW_SEALING`), sizes it to `len` bytes, seals it
    /// with `F_SEAL_SHRINK | F_SEAL_GROW` (so neither side can change its size under the other's mapping)
    /// and maps it read-write `MAP_SHARED`. `len == 0` is `InvalidInput`.
    pub fn create(name: &str, len: usize) -> io::Result<Self> {
        let size = NonZeroUsize::new(len)
            .ok_or_else(|| invalid_input(format!("shared memory {name:?}: length 0")))?;
        let file_len = libc::off_t::try_from(len)
            .map_err(|_| invalid_input(format!("shared memory {name:?}: length {len} exceeds off_t")))?;
        let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)
            .map_err(|e| os_error(e, format_args!("memfd_create({name:?})")))?;
        ftruncate(&fd, file_len)
            .map_err(|e| os_error(e, format_args!("ftruncate memfd {name:?} to {len} bytes")))?;
        fcntl(
            &fd,
            FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW),
        )
        .map_err(|e| os_error(e, format_args!("sealing memfd {name:?} against resizing")))?;
        Self::map(fd, size)
    }

    /// The daemon side: maps a received memfd's first `len` bytes read-write `MAP_SHARED`, then closes the
    /// descriptor (the mapping keeps the pages; [`SharedMemory::fd`] is `None`).
    ///
    /// Refuses (`InvalidInput`) a descriptor that is not a regular file, is not sealed against shrinking
    /// (`F_SEAL_SHRINK`; a file that cannot be sealed at all is refused the same way), or is shorter than
    /// `len`; `len == 0` is `InvalidInput` too. A descriptor opened read-only or sealed against writing
    /// fails at mmap (`PermissionDenied`); a mapping the address space has no room for fails with
    /// `OutOfMemory` (ENOMEM).
    pub fn from_fd(fd: OwnedFd, len: usize) -> io::Result<Self> {
        let raw = fd.as_raw_fd();
        let size = NonZeroUsize::new(len)
            .ok_or_else(|| invalid_input(format!("shared memory fd {raw}: length 0")))?;
        // Seals first, size second: once F_SEAL_SHRINK is set the size can no longer go down, so the size
        // checked below stays valid for the mapping's whole life.
        let seals = match fcntl(&fd, FcntlArg::F_GET_SEALS) {
            Ok(bits) => SealFlag::from_bits_retain(bits),
            Err(Errno::EINVAL) => {
                return Err(invalid_input(format!(
                    "shared memory fd {raw}: not a sealable memfd (F_GET_SEALS: EINVAL)"
                )));
            }
            Err(e) => return Err(os_error(e, format_args!("F_GET_SEALS on shared memory fd {raw}"))),
        };
        if !seals.contains(SealFlag::F_SEAL_SHRINK) {
            return Err(invalid_input(format!(
                "shared memory fd {raw}: not sealed against shrinking (seals {:#x}); it could be truncated \
                 under the mapping",
                seals.bits()
            )));
        }
        let stat = fstat(&fd).map_err(|e| os_error(e, format_args!("fstat shared memory fd {raw}")))?;
        if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
            return Err(invalid_input(format!(
                "shared memory fd {raw}: not a regular file (mode {:#o})",
                stat.st_mode
            )));
        }
        let file_len = u64::try_from(stat.st_size).unwrap_or(0);
        if file_len < len as u64 {
            return Err(invalid_input(format!(
                "shared memory fd {raw}: file is {file_len} bytes, {len} requested"
            )));
        }
        let mut mapped = Self::map(fd, size)?;
        mapped.fd = None;
        Ok(mapped)
    }

    fn map(fd: OwnedFd, len: NonZeroUsize) -> io::Result<Self> {
        // SAFETY: a fresh mapping at an address the kernel chooses (no `MAP_FIXED`), so no existing memory
        // is replaced; the file is at least `len` bytes long and sealed against shrinking (checked or set by
        // the callers), so every page of the mapping stays backed and accessing it cannot SIGBUS.
        let ptr = unsafe {
            mmap(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                &fd,
                0,
            )
        }
        .map_err(|e| {
            os_error(
                e,
                format_args!("mmap {len} bytes of shared memory fd {}", fd.as_raw_fd()),
            )
        })?;
        Ok(SharedMemory {
            ptr: ptr.cast(),
            len: len.get(),
            fd: Some(fd),
        })
    }

    /// Length of the mapping in bytes (never 0).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a zero-length mapping cannot be created.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memfd, to pass to the other process (SCM_RIGHTS) or to `dup`; `None` for a mapping made by
    /// [`SharedMemory::from_fd`], which closed it.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(AsFd::as_fd)
    }

    /// Takes the memfd out (to pass it to the other process without a `dup`); the mapping stays. Later
    /// calls, and [`SharedMemory::fd`], return `None`.
    pub fn take_fd(&mut self) -> Option<OwnedFd> {
        self.fd.take()
    }

    /// The start of the mapping. Valid for `len()` bytes while `self` lives; the other process may write
    /// the bytes at any time.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Checks `[offset, offset + count)` against the mapping.
    fn check(&self, offset: usize, count: usize, what: &str) -> io::Result<()> {
        match offset.checked_add(count) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(invalid_input(format!(
                "shared memory {what}: {count} bytes at offset {offset} exceed the {}-byte mapping",
                self.len
            ))),
        }
    }

    /// Copies `out.len()` bytes starting at `offset` into `out`. `InvalidInput` if the range does not fit in
    /// the mapping. The other process may be writing concurrently: the copy is a snapshot, possibly torn.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> io::Result<()> {
        self.check(offset, out.len(), "read")?;
        // SAFETY: `check` proved `offset + out.len() <= self.len`, so the source lies inside the live
        // mapping; `out` is a distinct Rust buffer (it cannot point into the mapping, of which no references
        // are handed out), so the ranges do not overlap.
        unsafe { ptr::copy_nonoverlapping(self.ptr.as_ptr().add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Copies `data` into the mapping at `offset`. `InvalidInput` if the range does not fit in the mapping.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> io::Result<()> {
        self.check(offset, data.len(), "write")?;
        // SAFETY: `check` proved `offset + data.len() <= self.len`, so the destination lies inside the live,
        // writable mapping; `data` is a distinct Rust buffer, so the ranges do not overlap.
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len()) };
        Ok(())
    }

    /// Sets `len` bytes at `offset` to `byte`. `InvalidInput` if the range does not fit in the mapping.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> io::Result<()> {
        self.check(offset, len, "fill")?;
        // SAFETY: `check` proved `offset + len <= self.len`, so the range lies inside the live, writable
        // mapping.
        unsafe { ptr::write_bytes(self.ptr.as_ptr().add(offset), byte, len) };
        Ok(())
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly the mapping created in `map`, unmapped only here, and no Rust
        // reference into it exists (the copying methods hold none beyond their own call).
        if let Err(e) = unsafe { munmap(self.ptr.cast(), self.len) } {
            tracing::warn!("munmap of {} bytes of shared memory failed: {e}", self.len);
        }
        // `fd` is closed by its own Drop, after the mapping is gone.
    }
}

impl fmt::Debug for SharedMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedMemory")
            .field("len", &self.len)
            .field("fd", &self.fd.as_ref().map(|f| f.as_raw_fd()))
            .finish()
    }
}

// ---------------------------------------------------------------------------------------------------------
// The engine's view of registered memory: `crate::engine::memory::RegionMemory`.
//
// The engine bounds-checks offsets against the region before calling these; they still never panic or
// touch memory outside the mapping: an out-of-range call is skipped (and logged, since it is an engine bug).
// ---------------------------------------------------------------------------------------------------------

impl crate::engine::memory::RegionMemory for SharedMemory {
    fn len(&self) -> u64 {
        self.len as u64
    }

    fn read_at(&self, offset: u64, out: &mut [u8]) {
        let result = usize::try_from(offset)
            .map_err(|_| invalid_input(format!("shared memory read: offset {offset} exceeds usize")))
            .and_then(|offset| SharedMemory::read_at(self, offset, out));
        if let Err(e) = result {
            tracing::error!("RegionMemory::read_at skipped: {e}");
        }
    }

    fn write_at(&self, offset: u64, data: &[u8]) {
        let result = usize::try_from(offset)
            .map_err(|_| invalid_input(format!("shared memory write: offset {offset} exceeds usize")))
            .and_then(|offset| SharedMemory::write_at(self, offset, data));
        if let Err(e) = result {
            tracing::error!("RegionMemory::write_at skipped: {e}");
        }
    }
}

/// The client library's own regions: its handle on the mapping, which a gathered write may send in place.
impl crate::engine::memory::RegionMemory for std::sync::Arc<SharedMemory> {
    fn len(&self) -> u64 {
        self.len as u64
    }

    fn read_at(&self, offset: u64, out: &mut [u8]) {
        crate::engine::memory::RegionMemory::read_at(&**self, offset, out)
    }

    fn write_at(&self, offset: u64, data: &[u8]) {
        crate::engine::memory::RegionMemory::write_at(&**self, offset, data)
    }

    fn pinned(&self) -> Option<crate::engine::memory::PinnedMemory> {
        let base = NonNull::new(self.as_ptr())?;
        // SAFETY: the mapping is `self.len` bytes from `base` and lives as long as the SharedMemory, which
        // the PinnedMemory keeps alive through this Arc; its memfd is sealed against shrinking.
        Some(unsafe { crate::engine::memory::PinnedMemory::new(base, self.len, self.clone()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dup(fd: BorrowedFd<'_>) -> OwnedFd {
        fd.try_clone_to_owned().expect("dup")
    }

    #[test]
    fn shm_two_mappings_see_the_same_bytes() {
        let a = SharedMemory::create("soft-rdma-test", 8192).unwrap();
        assert_eq!(a.len(), 8192);
        assert!(!a.is_empty());
        a.write_at(100, b"hello from a").unwrap();

        let b = SharedMemory::from_fd(dup(a.fd().unwrap()), 8192).unwrap();
        assert_ne!(a.as_ptr(), b.as_ptr(), "two distinct mappings");
        let mut got = [0u8; 12];
        b.read_at(100, &mut got).unwrap();
        assert_eq!(&got, b"hello from a");

        b.write_at(8192 - 4, b"tail").unwrap();
        b.fill(0, 4, 0xAB).unwrap();
        let mut tail = [0u8; 4];
        a.read_at(8192 - 4, &mut tail).unwrap();
        assert_eq!(&tail, b"tail");
        let mut head = [0u8; 5];
        a.read_at(0, &mut head).unwrap();
        assert_eq!(head, [0xAB, 0xAB, 0xAB, 0xAB, 0]);

        // A shorter view of the same file is fine.
        let c = SharedMemory::from_fd(dup(a.fd().unwrap()), 4096).unwrap();
        let mut got = [0u8; 12];
        c.read_at(100, &mut got).unwrap();
        assert_eq!(&got, b"hello from a");
        assert!(format!("{c:?}").contains("len: 4096"));
    }

    #[test]
    fn shm_bounds_are_checked() {
        let m = SharedMemory::create("soft-rdma-test", 64).unwrap();
        let mut buf = [0u8; 8];
        m.read_at(56, &mut buf).unwrap();
        m.write_at(56, &buf).unwrap();
        m.read_at(64, &mut []).unwrap();
        for (offset, what) in [(57, "past end"), (64, "at end"), (usize::MAX, "overflow")] {
            let e = m.read_at(offset, &mut buf).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "read {what}");
            let e = m.write_at(offset, &buf).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "write {what}");
        }
        assert_eq!(
            m.fill(1, usize::MAX, 0).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(m.fill(0, 65, 0).unwrap_err().kind(), io::ErrorKind::InvalidInput);
        m.fill(0, 64, 7).unwrap();
        assert_eq!(
            SharedMemory::create("soft-rdma-test", 0).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            SharedMemory::from_fd(dup(m.fd().unwrap()), 0).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }

    #[test]
    fn shm_sealed_against_resizing() {
        let m = SharedMemory::create("soft-rdma-test", 4096).unwrap();
        assert_eq!(ftruncate(m.fd().unwrap(), 0), Err(Errno::EPERM));
        assert_eq!(ftruncate(m.fd().unwrap(), 8192), Err(Errno::EPERM));
        let seals = SealFlag::from_bits_retain(fcntl(m.fd().unwrap(), FcntlArg::F_GET_SEALS).unwrap());
        assert!(seals.contains(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW));
    }

    #[test]
    fn shm_from_fd_refuses_unsealed_short_and_non_memfd() {
        // Unsealed (but sealable) memfd.
        let fd = memfd_create(
            "soft-rdma-test",
            MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
        )
        .unwrap();
        ftruncate(&fd, 4096).unwrap();
        let e = SharedMemory::from_fd(dup(fd.as_fd()), 4096).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("not sealed against shrinking"), "{e}");

        // A memfd created without MFD_ALLOW_SEALING carries F_SEAL_SEAL and nothing else.
        let fd = memfd_create("soft-rdma-test", MFdFlags::MFD_CLOEXEC).unwrap();
        ftruncate(&fd, 4096).unwrap();
        let e = SharedMemory::from_fd(fd, 4096).unwrap_err();
        assert!(e.to_string().contains("not sealed against shrinking"), "{e}");

        // Sealed but shorter than requested.
        let m = SharedMemory::create("soft-rdma-test", 4096).unwrap();
        let e = SharedMemory::from_fd(dup(m.fd().unwrap()), 4097).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("4096 bytes, 4097 requested"), "{e}");

        // Not a memfd at all: a pipe.
        let (r, _w) = nix::unistd::pipe().unwrap();
        let e = SharedMemory::from_fd(r, 4096).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("not a sealable memfd"), "{e}");
    }

    #[test]
    fn shm_region_memory_skips_out_of_range() {
        use crate::engine::memory::RegionMemory;
        let m = SharedMemory::create("soft-rdma-test", 16).unwrap();
        RegionMemory::write_at(&m, 12, b"abcd");
        RegionMemory::write_at(&m, 13, b"abcd"); // skipped
        RegionMemory::write_at(&m, u64::MAX, b"a"); // skipped
        let mut out = [0u8; 4];
        RegionMemory::read_at(&m, 12, &mut out);
        assert_eq!(&out, b"abcd");
        let mut out = [9u8; 4];
        RegionMemory::read_at(&m, 14, &mut out); // skipped
        assert_eq!(out, [9; 4]);
        assert_eq!(RegionMemory::len(&m), 16);
    }
}
