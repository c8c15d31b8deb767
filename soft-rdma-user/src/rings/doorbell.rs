//! Eventfd doorbells: one side rings (adds 1 to the counter), the other waits for the descriptor to become
//! readable and drains it. The daemon creates them (non-blocking, close-on-exec) and passes one end's
//! descriptor over the Unix socket with the ring's memfd; both processes then hold the same eventfd.
//!
//! A doorbell is rung only when the other side set its need-wakeup flag ([`super::producer`]), so a side
//! that keeps polling costs the other no system call. Async code waits with tokio's `AsyncFd` on
//! [`Doorbell::fd`]; [`Doorbell::wait`] blocks a plain thread (poll(2)).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// An eventfd used as a doorbell.
#[derive(Debug)]
pub struct Doorbell {
    fd: OwnedFd,
}

impl Doorbell {
    /// A new eventfd (`EFD_NONBLOCK | EFD_CLOEXEC`, counter 0).
    pub fn new() -> io::Result<Self> {
        // SAFETY: eventfd takes no pointers; it returns a new descriptor or -1.
        let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a descriptor eventfd just created, owned by nothing else.
        Ok(Doorbell {
            fd: unsafe { OwnedFd::from_raw_fd(raw) },
        })
    }

    /// A doorbell received from the other process (the descriptor must be a non-blocking eventfd; anything
    /// else makes [`Doorbell::ring`] and [`Doorbell::drain`] fail with an I/O error, never block).
    pub fn from_fd(fd: OwnedFd) -> Self {
        Doorbell { fd }
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Another descriptor of the same eventfd (to pass to the other process).
    pub fn try_clone_fd(&self) -> io::Result<OwnedFd> {
        self.fd.try_clone()
    }

    /// Rings: adds 1 to the counter. A counter at its maximum (EAGAIN) is already rung.
    pub fn ring(&self) -> io::Result<()> {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live local buffer to a descriptor this value owns.
        let n = unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::WouldBlock {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Takes every ring so far: the count (0 if none).
    pub fn drain(&self) -> io::Result<u64> {
        let mut buf = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live local buffer from a descriptor this value owns.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::WouldBlock {
                Ok(0)
            } else {
                Err(e)
            };
        }
        Ok(u64::from_ne_bytes(buf))
    }

    /// Blocks the thread until the doorbell is rung or `timeout` passes (None: no limit); true when rung.
    /// Does not drain it.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<bool> {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.map_or(-1, |t| i32::try_from(t.as_millis()).unwrap_or(i32::MAX));
        loop {
            // SAFETY: one valid pollfd in a live local.
            let n = unsafe { libc::poll(&mut pfd, 1, ms) };
            if n >= 0 {
                return Ok(n > 0);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_are_counted_and_drained_across_descriptors() {
        let a = Doorbell::new().unwrap();
        let b = Doorbell::from_fd(a.try_clone_fd().unwrap());
        assert_eq!(b.drain().unwrap(), 0);
        assert!(!b.wait(Some(Duration::ZERO)).unwrap());
        a.ring().unwrap();
        a.ring().unwrap();
        assert!(b.wait(None).unwrap());
        assert_eq!(b.drain().unwrap(), 2);
        assert_eq!(a.drain().unwrap(), 0);
    }

    #[test]
    fn a_descriptor_that_is_not_an_eventfd_fails_without_blocking() {
        let (r, _w) = nix::unistd::pipe().unwrap();
        nix::fcntl::fcntl(&r, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK)).unwrap();
        let d = Doorbell::from_fd(r);
        assert_eq!(d.drain().unwrap(), 0, "an empty non-blocking pipe reads EAGAIN");
        assert!(d.ring().is_err(), "the read end cannot be written");
    }
}
