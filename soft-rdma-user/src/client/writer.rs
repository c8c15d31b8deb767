//! The session's writer task: everything this process tells soft-rdmad goes through it, in order
//! ([`write_loop`]), and what its runtime's end left queued is still written ([`Writer`]'s drop: the last
//! counters of the queue pairs a program's returning `main` dropped, docs/metrics.md).

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::Outgoing;
use crate::uds::fdpass;

/// Writes messages to the daemon, coalescing whatever is queued into one write (a burst of posts costs one
/// system call), and sending a RegisterMemory frame with its memfd attached. If the runtime ends under it
/// (a program returns from `main` with its objects alive), [`Writer`]'s drop still writes what was queued.
pub(super) async fn write_loop(wr: tokio::net::unix::OwnedWriteHalf, rx: mpsc::UnboundedReceiver<Outgoing>) {
    const COALESCE: usize = 256 * 1024;
    let mut w = Writer {
        wr,
        rx,
        out: BytesMut::new(),
        torn: false,
    };
    while let Some(first) = w.rx.recv().await {
        let mut next = Some(first);
        while let Some((msg, memory)) = next.take() {
            match memory {
                None => msg.encode(&mut w.out),
                Some(mem) => {
                    // Everything before it goes first; then the frame whose first byte carries the fd.
                    if w.flush().await.is_err() {
                        return;
                    }
                    msg.encode(&mut w.out);
                    w.torn = true; // until the frame is out whole
                    let sent = fdpass::write_with_fds(w.wr.as_ref(), &w.out, mem.fd().as_slice()).await;
                    if sent.is_err() {
                        return;
                    }
                    w.torn = false;
                    w.out.clear();
                }
            }
            if w.out.len() < COALESCE {
                next = w.rx.try_recv().ok();
            }
        }
        if w.flush().await.is_err() {
            return;
        }
    }
}

/// The writer's state, so that its drop knows what was not written yet.
struct Writer {
    wr: tokio::net::unix::OwnedWriteHalf,
    rx: mpsc::UnboundedReceiver<Outgoing>,
    /// Encoded frames not written yet (the front is dropped as the socket takes it).
    out: BytesMut,
    /// A frame with descriptors is part-written, or a write failed: nothing more may follow it.
    torn: bool,
}

impl Writer {
    /// Writes all of `out`, dropping what the socket took as it goes.
    async fn flush(&mut self) -> std::io::Result<()> {
        use bytes::Buf;
        while !self.out.is_empty() {
            match self.wr.write(&self.out).await {
                Ok(0) => {
                    self.torn = true;
                    return Err(std::io::ErrorKind::WriteZero.into());
                }
                Ok(n) => self.out.advance(n),
                Err(e) => {
                    self.torn = true;
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}

impl Drop for Writer {
    /// The task is dropped with its runtime (the program returned from `main` with objects alive; their
    /// drops queued their last messages, the queue pairs' final counters among them: docs/metrics.md):
    /// what was queued is written here, blocking, for at most [`FINAL_WRITE`]. Frames that carry
    /// descriptors are left out (a RegisterMemory nobody waits for any more).
    fn drop(&mut self) {
        if self.torn {
            return;
        }
        while let Ok((msg, memory)) = self.rx.try_recv() {
            if memory.is_none() {
                msg.encode(&mut self.out);
            }
        }
        if self.out.is_empty() {
            return;
        }
        let fd = std::os::fd::AsRawFd::as_raw_fd(self.wr.as_ref());
        if let Err(e) = write_blocking(fd, &self.out, std::time::Instant::now() + FINAL_WRITE) {
            tracing::debug!("the last messages to soft-rdmad were not all written: {e}");
        }
    }
}

/// How long a writer dropped with its runtime may block to write what was queued.
const FINAL_WRITE: std::time::Duration = std::time::Duration::from_secs(1);

/// Writes `bytes` to the non-blocking socket `fd`, waiting for room with poll(2), until `deadline`.
fn write_blocking(
    fd: std::os::fd::RawFd,
    mut bytes: &[u8],
    deadline: std::time::Instant,
) -> std::io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is valid for its length; `fd` is the session's socket, open while `Writer` lives.
        let n = unsafe { libc::send(fd, bytes.as_ptr().cast(), bytes.len(), libc::MSG_NOSIGNAL) };
        if n > 0 {
            bytes = &bytes[n as usize..];
            continue;
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            std::io::ErrorKind::Interrupted => continue,
            std::io::ErrorKind::WouldBlock => {}
            _ => return Err(e),
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, left.as_millis().clamp(1, 1000) as libc::c_int) };
    }
    Ok(())
}
