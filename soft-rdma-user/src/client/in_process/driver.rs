//! Who serves a handed-off connection's socket: its driver task on the application's runtime ([`drive`]),
//! and, when that runtime leaves it unserved, the progress thread ([`super::progress`]) through
//! [`ConnServe`]. Both run the same passes under the data path's state lock — a read pass (read, cut
//! FPDUs, place, answer, complete), a write pass (write what waits and fits, let the queue pairs add more)
//! and a hold pass (the first-FPDU hold's deadline) — so the two never differ in what they do, only in
//! whose idea of the socket's readiness they trust ([`By`]).
//!
//! The driver task also waits: for bytes, for room, for the hold's deadline, for the peer's FIN after ours,
//! and tells soft-rdmad once the connection is over.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tokio::sync::Notify;
use tracing::debug;

use super::output::By;
use super::progress::{Serve, Served, Watch, WatchGuard};
use super::{CLOSE_LINGER, InProcessDataPath, PollScratch, READ_CHUNK, Tell, ending_of};
use crate::client::{InlineWait, Inner};
use crate::engine::requests::{ConnectionEnd, ConnectorId};
use crate::uds::messages::Request;

impl InProcessDataPath {
    /// A read pass: reads what the socket holds (until a short read or WouldBlock) and hands it to the
    /// connection; on the end of the stream (`failed`: the error the wait for bytes gave), ends the
    /// connection from the peer's side. Delivers the completions made. Whether the reading is over.
    pub(super) fn read_pass(
        &self,
        inner: &Inner,
        connector: ConnectorId,
        (socket, watch): (&TcpStream, &Watch),
        buf: &mut [u8],
        failed: Option<ConnectionEnd>,
        by: By,
    ) -> bool {
        watch.read_pass();
        let mut ended = failed;
        let srq_events = {
            let mut st = self.state.lock().expect("not poisoned");
            st.by = by;
            while ended.is_none() {
                match read_draining(socket, buf, by) {
                    Ok((0, _)) => ended = Some(ConnectionEnd::PeerFin),
                    Ok((n, drained)) => {
                        st.on_bytes(connector, &buf[..n]);
                        if drained {
                            break;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => ended = Some(ending_of(&e)),
                }
            }
            if let Some(how) = ended {
                debug!(connector = connector.0, how = how.name(), "connection over");
                if let Some(c) = st.conns.get_mut(&connector) {
                    c.read_over = true;
                }
                let reset = how != ConnectionEnd::PeerFin;
                st.peer_ended(connector, None, how);
                if reset && let Some(c) = st.conns.get_mut(&connector) {
                    // Nothing can be written on a reset connection (peer_ended released what completions
                    // it held).
                    let _ = c.out.clear();
                    st.send_fin(connector);
                }
            }
            st.pump();
            st.by = By::Runtime;
            st.deliver(inner);
            st.dp.take_srq_events()
        };
        for (_, srq) in srq_events {
            inner.srq_limit_reached(srq);
        }
        if ended.is_some() {
            // An ended stream stays readable (EOF): the progress thread stops looking at it.
            watch.stop();
        }
        ended.is_some()
    }

    /// A write pass: writes what waits and fits, and lets the queue pairs add more; `failed`: the wait
    /// for room failed (the connection is over).
    pub(super) fn write_pass(
        &self,
        inner: &Inner,
        connector: ConnectorId,
        failed: Option<std::io::Error>,
        by: By,
    ) {
        {
            let mut st = self.state.lock().expect("not poisoned");
            st.by = by;
            if let Some(e) = failed {
                let held = st
                    .conns
                    .get_mut(&connector)
                    .map(|c| c.out.clear())
                    .unwrap_or_default();
                st.dp.complete(held);
                st.peer_ended(connector, None, ending_of(&e));
                st.send_fin(connector);
            } else {
                st.flush(connector);
                st.pump();
            }
            st.by = By::Runtime;
            st.deliver(inner);
        };
    }

    /// A poll's pass: a program that polls a completion queue and finds it empty (rdma-core's
    /// `ibv_poll_cq`, `CompletionQueue::poll`) serves this session's connections itself, once, with the
    /// passes their driver runs: it reads what arrived (placing Writes, answering Read Requests, completing
    /// Receives) and writes what waits and fits. A program that spins on its completion queue (perftest does,
    /// in its measurements and in its rdma_cm handshakes) would otherwise hold the CPU from the runtime
    /// thread that does this work and wait for the scheduler to hand it over: on one CPU per side, that
    /// halved `ib_write_bw` (docs/perftest.md). The work done is the same; only the thread differs.
    ///
    /// It never waits for another server of the connections: when the runtime's driver or the progress
    /// thread holds the state, or another thread polls, there is nothing to do here. A connection's driver
    /// task still wakes for bytes this pass read first, and finds its socket empty.
    pub(in crate::client) fn poll_pass(&self, inner: &Inner) {
        let Ok(mut scratch) = self.poll_scratch.try_lock() else {
            return;
        };
        let PollScratch { buf, conns } = &mut *scratch;
        {
            let Ok(st) = self.state.try_lock() else { return };
            conns.extend(
                st.conns
                    .iter()
                    .map(|(id, c)| {
                        let write = !c.out.is_empty() && !c.fin_sent;
                        (*id, c.socket.clone(), c.watch.clone(), !c.read_over, write)
                    })
                    .filter(|(.., read, write)| *read || *write),
            );
        }
        if conns.is_empty() {
            return;
        }
        if buf.len() < READ_CHUNK {
            buf.resize(READ_CHUNK, 0);
        }
        for (connector, socket, watch, read, write) in conns.drain(..) {
            if read {
                self.read_pass(inner, connector, (&socket, &watch), buf, None, By::Progress);
            }
            if write {
                self.write_pass(inner, connector, None, By::Progress);
            }
        }
    }

    /// Blocks the calling thread until `fd` is readable (or `done` says so), at most `timeout`, serving this session's
    /// connections meanwhile with [`Self::poll_pass`] whenever one of their sockets is ready: the thread
    /// that waits for a completion is the one the kernel wakes for the bytes that make it, as a socket
    /// reader is, instead of the runtime's thread, which then has to wake it (two wake-ups per message,
    /// and on one CPU per side twice the switches: docs/performance.md, "Completion channels").
    ///
    /// `poll(2)` on `fd` and every socket that may be read, or holds output waiting for room. A signal
    /// ends the wait with EINTR, as it ends the blocking `read` the caller would make otherwise. Nothing to
    /// serve, or a socket that reports only a hang-up or an error after a pass served it (its driver task
    /// ends it): [`InlineWait::NothingToServe`], and the caller waits on `fd` alone.
    pub(in crate::client) fn serve_until_readable(
        &self,
        inner: &Inner,
        (fd, done): (RawFd, &dyn Fn() -> bool),
        timeout: Duration,
    ) -> std::io::Result<InlineWait> {
        let deadline = Instant::now() + timeout;
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let mut served_hangup = false;
        loop {
            if done() {
                return Ok(InlineWait::Readable);
            }
            fds.clear();
            fds.push(pollfd(fd, libc::POLLIN));
            {
                let st = self.state.lock().expect("not poisoned");
                for c in st.conns.values() {
                    let mut events = 0;
                    if !c.read_over {
                        events |= libc::POLLIN;
                    }
                    if !c.out.is_empty() && !c.fin_sent {
                        events |= libc::POLLOUT;
                    }
                    if events != 0 {
                        fds.push(pollfd(c.socket.as_raw_fd(), events));
                    }
                }
            }
            if fds.len() == 1 {
                return Ok(InlineWait::NothingToServe);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            // Whole milliseconds, rounded up: poll(2)'s unit.
            let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
            // SAFETY: `fds` is a live array of `fds.len()` pollfd entries.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
            if n < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if fds[0].revents != 0 {
                return Ok(InlineWait::Readable);
            }
            if n == 0 {
                return Ok(InlineWait::TimedOut);
            }
            let only_hangups = fds[1..]
                .iter()
                .all(|p| p.revents & (libc::POLLIN | libc::POLLOUT) == 0);
            if only_hangups && served_hangup {
                return Ok(InlineWait::NothingToServe);
            }
            served_hangup = only_hangups;
            self.poll_pass(inner);
        }
    }

    /// A hold pass: the first-FPDU hold's deadline, if it passed by `now`.
    pub(super) fn hold_pass(&self, inner: &Inner, connector: ConnectorId, now: Instant, by: By) {
        {
            let mut st = self.state.lock().expect("not poisoned");
            st.by = by;
            st.on_hold_deadline(connector, now);
            st.by = By::Runtime;
            st.deliver(inner);
        };
    }
}

/// The progress thread's handle on one connection: the passes its driver task runs, run from the thread.
pub(super) struct ConnServe {
    pub(super) path: Weak<InProcessDataPath>,
    pub(super) inner: Weak<Inner>,
    pub(super) connector: ConnectorId,
    pub(super) socket: Arc<TcpStream>,
    pub(super) watch: Watch,
}

impl Serve for ConnServe {
    fn serve(&self, buf: &mut Vec<u8>) -> Served {
        let (Some(path), Some(inner)) = (self.path.upgrade(), self.inner.upgrade()) else {
            return Served::Over;
        };
        if buf.len() < READ_CHUNK {
            buf.resize(READ_CHUNK, 0);
        }
        path.hold_pass(&inner, self.connector, Instant::now(), By::Progress);
        let io = (self.socket.as_ref(), &self.watch);
        if path.read_pass(&inner, self.connector, io, buf, None, By::Progress) {
            return Served::Over;
        }
        path.write_pass(&inner, self.connector, None, By::Progress);
        Served::Open
    }

    fn hold_deadline(&self) -> Option<Instant> {
        let path = self.path.upgrade()?;
        let st = path.state.lock().expect("not poisoned");
        st.conns.get(&self.connector)?.fpdu.deadline()
    }
}

/// One connection's driver task: reads the socket, waits for room to write and for the hold's deadline, and
/// tells soft-rdmad when the connection is over.
pub(super) async fn drive(
    inner: Weak<Inner>,
    local: Arc<InProcessDataPath>,
    connector: ConnectorId,
    (socket, watch): (Arc<TcpStream>, WatchGuard),
    wake: Arc<Notify>,
) {
    let mut buf = vec![0u8; READ_CHUNK];
    let mut read_open = true;
    let mut fin_at: Option<tokio::time::Instant> = None;
    loop {
        // The runtime runs this task: the connection is its own again if the progress thread had it.
        watch.0.runtime_ran();
        let (write, deadline, fin_sent) = {
            let st = local.state.lock().expect("not poisoned");
            let Some(c) = st.conns.get(&connector) else { break };
            (
                !c.out.is_empty() && !c.fin_sent,
                c.fpdu.deadline().map(tokio::time::Instant::from_std),
                c.fin_sent,
            )
        };
        if fin_sent {
            if fin_at.is_none() {
                fin_at = Some(tokio::time::Instant::now());
                tell_daemon(&inner, &local, connector);
            }
            if !read_open {
                break;
            }
        }
        let Some(inner_ref) = inner.upgrade() else { break };
        let now = tokio::time::Instant::now();
        tokio::select! {
            r = socket.readable(), if read_open => {
                let failed = r.err().map(|e| ending_of(&e));
                let io = (socket.as_ref(), &watch.0);
                if local.read_pass(&inner_ref, connector, io, &mut buf, failed, By::Runtime) {
                    read_open = false;
                }
            }
            r = socket.writable(), if write => {
                local.write_pass(&inner_ref, connector, r.err(), By::Runtime);
            }
            _ = wake.notified() => {}
            _ = tokio::time::sleep_until(deadline.unwrap_or(now)), if deadline.is_some() => {
                local.hold_pass(&inner_ref, connector, Instant::now(), By::Runtime);
            }
            _ = tokio::time::sleep_until(fin_at.map_or(now, |t| t + CLOSE_LINGER)), if fin_at.is_some() => {
                debug!(connector = connector.0, "the peer did not close after our FIN; dropping the socket");
                break;
            }
        }
    }
    tell_daemon(&inner, &local, connector);
    // Unwatched before the socket can close.
    drop(watch);
    let _ = socket2::SockRef::from(socket.as_ref()).shutdown(std::net::Shutdown::Both);
    local.state.lock().expect("not poisoned").forget(connector);
    if let Some(inner) = inner.upgrade() {
        inner.report_data_path();
    }
}

/// One `recv` into `buf`: the bytes read, and whether the socket was drained (a short read: the receive
/// queue held less than `buf`). A drained read also clears the socket's readiness in tokio, as a
/// `WouldBlock` would, so that the driver does not pay one more `recv` (EAGAIN) per message before it
/// sleeps; bytes that arrive after it raise a new readiness event (edge-triggered epoll), which tokio
/// keeps because it postdates the one cleared. The progress thread (`by`) reads even when tokio has not
/// seen the bytes (its runtime's reactor has not run since they came); the event stays queued for that
/// reactor, which then finds the socket drained.
fn read_draining(socket: &TcpStream, buf: &mut [u8], by: By) -> std::io::Result<(usize, bool)> {
    let fd = socket.as_raw_fd();
    let mut got = None;
    let mut tried = false;
    let r = socket.try_io(tokio::io::Interest::READABLE, || {
        tried = true;
        let n = recv(fd, buf)?;
        if n > 0 && n < buf.len() {
            got = Some(n);
            // Reported as WouldBlock only to clear the readiness; the bytes are in `buf`.
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    });
    match (r, got) {
        (_, Some(n)) => Ok((n, true)),
        (Err(e), None) if !tried && by == By::Progress && e.kind() == std::io::ErrorKind::WouldBlock => {
            let n = recv(fd, buf)?;
            Ok((n, n > 0 && n < buf.len()))
        }
        (Ok(n), None) => Ok((n, false)),
        (Err(e), None) => Err(e),
    }
}

/// One non-blocking `recv` on `fd` into `buf`.
fn recv(fd: std::os::fd::RawFd, buf: &mut [u8]) -> std::io::Result<usize> {
    // SAFETY: `buf` is the caller's own buffer, valid for `buf.len()` bytes, and `fd` is a socket the caller
    // keeps open for the duration of the call.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Tells soft-rdmad, once, that the connection is over (as `LocalConn::tell` says).
fn tell_daemon(inner: &Weak<Inner>, local: &InProcessDataPath, connector: ConnectorId) {
    let tell = {
        let mut st = local.state.lock().expect("not poisoned");
        st.conns.get_mut(&connector).and_then(|c| {
            let tell = c.tell.take();
            c.told |= tell.is_some();
            tell
        })
    };
    let Some(inner) = inner.upgrade() else { return };
    let request = match tell {
        Some(Tell::Ended(how)) => Request::ConnectionEnded { connector, how },
        Some(Tell::Disconnect) => Request::Disconnect { connector },
        Some(Tell::CloseConnector) => Request::CloseConnector { connector },
        Some(Tell::Nothing) | None => return,
    };
    inner.fire(request);
}

fn pollfd(fd: RawFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}
