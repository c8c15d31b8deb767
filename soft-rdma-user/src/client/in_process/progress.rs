//! The progress thread: one named thread per process (`soft-rdma-prog`, started with the first
//! handed-off connection, shared by every adapter; a child of fork starts its own) that serves a connection when the application's runtime
//! does not, so that a peer's RDMA Write is placed, its Read Request answered and its Terminate handled
//! while that runtime is blocked or busy (issue 30).
//!
//! The connection's driver task on the application's runtime keeps doing the work whenever that runtime is
//! responsive: one wake-up per message, on the thread that waits for the completion. The thread only
//! watches, at almost no cost:
//! - **Asleep** (no traffic, or an occasional message): it waits on an epoll set holding every watched
//!   socket, level-triggered; bytes arriving wake it for one look (and one more when the grace ends if the
//!   runtime had not read them yet). An idle process with connections costs no wake-up at all.
//! - **Ticking** (messages closer together than 5 ms, or output waiting for room): the sockets leave its
//!   wait set, and it looks every 5 ms instead, whatever the message rate ([`super::watchdog`] holds the
//!   policy and the justification of the figures). A look is one `epoll_wait` with no timeout listing the
//!   readable sockets, one `poll` for the room of those with output waiting, and each connection's counts
//!   of read passes and writes (atomics its driver bumps), which say whether the runtime served them
//!   meanwhile. A tick that saw no traffic puts it back to sleep.
//! - **Serving**: a connection left unserved for the grace (bytes unread, room for its output unused, its
//!   first-FPDU hold's deadline passed) is taken over: the thread serves it at once, then on every event of
//!   its socket (edge-triggered), under the same state lock and with the same code as the driver
//!   ([`Serve`]), until the driver task runs again ([`Watch::runtime_ran`]), which gives it back.
//!
//! What it holds is bounded: an entry per handed-off connection of this process (each one the daemon's
//! limits allow), a read buffer of 256 KiB (allocated at its first takeover), 64 events per wait. It keeps
//! a connection's socket open until the connection's driver ends, which unwatches it (before the socket
//! closes: epoll must forget a descriptor before its number can be reused). When the adapters go, the
//! thread sleeps with an empty set and costs nothing; it ends with the process. If it cannot start (no
//! descriptors or threads left), connections run as before, served only while their runtime runs, and a
//! warning says so.

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};

use super::watchdog::{GRACE, Key, Look, Next, Watchdog};
use crate::rings::doorbell::Doorbell;

/// The thread's name, as `ps -T`, `cargo xtask profile` and `cargo xtask bench` (which shows its share of
/// the context switches) see it: within the kernel's 15 bytes, so that it is the same everywhere.
pub(super) const THREAD_NAME: &str = "soft-rdma-prog";
/// Events taken per `epoll_wait`.
const EVENTS: usize = 64;
/// Keys of the thread's own descriptors in its wait set; connections' keys start above.
const POKE: Key = 0;
const TIMER: Key = 1;
const SOCKETS: Key = 2;
const FIRST_CONN: Key = 16;

/// The process's count of read passes and writes, every connection's: traffic keeps the thread looking.
static ACTIVITY: AtomicU64 = AtomicU64::new(0);
static NEXT_KEY: AtomicU64 = AtomicU64::new(FIRST_CONN);
/// The thread of this process (the pid that started it, or tried to): a child of fork has none of its
/// parent's threads, and starts its own.
static PROGRESS: Mutex<Option<(u32, Option<&'static Progress>)>> = Mutex::new(None);

/// What the thread does with a connection it serves: the in-process data path's side.
pub(super) trait Serve: Send + Sync {
    /// Serves the connection once, as its driver task would: fires a passed first-FPDU hold deadline,
    /// reads and handles what arrived, writes what waits and fits. `buf` is the thread's read buffer.
    fn serve(&self, buf: &mut Vec<u8>) -> Served;
    /// Its first-FPDU hold's deadline, while one is on.
    fn hold_deadline(&self) -> Option<Instant>;
}

/// What became of a connection the thread served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Served {
    /// Still open: watched on.
    Open,
    /// Its reading is over, or its session is gone: no longer watched.
    Over,
}

/// One connection's side of the watch, shared by its state, its driver task and the thread. Before
/// [`Watch::start`] (and if the thread could not start) it only counts.
#[derive(Clone)]
pub(super) struct Watch {
    shared: Arc<Shared>,
}

struct Shared {
    key: Key,
    /// Read passes begun, by the driver or the thread.
    reads: AtomicU64,
    /// Writes that moved bytes.
    writes: AtomicU64,
    /// Output waits for room in the socket.
    output_waits: AtomicBool,
    /// The thread serves the connection; the driver task clears it when it runs (the runtime is back).
    taken: AtomicBool,
    /// Registered with the thread, and not yet unwatched.
    watched: AtomicBool,
    /// The thread it was registered with (set before it is registered, so that a stop never misses it).
    thread: OnceLock<&'static Progress>,
}

impl Watch {
    pub(super) fn new() -> Watch {
        Watch {
            shared: Arc::new(Shared {
                key: NEXT_KEY.fetch_add(1, Ordering::Relaxed),
                reads: AtomicU64::new(0),
                writes: AtomicU64::new(0),
                output_waits: AtomicBool::new(false),
                taken: AtomicBool::new(false),
                watched: AtomicBool::new(false),
                thread: OnceLock::new(),
            }),
        }
    }

    /// Starts watching the connection on `socket` (kept open by `serve` until [`Self::stop`]), whose
    /// first-FPDU hold is on if `hold`; starts the thread if this is the process's first connection.
    pub(super) fn start(&self, socket: RawFd, serve: Arc<dyn Serve>, hold: bool) {
        let Some(p) = progress() else { return };
        if self.shared.thread.set(p).is_err() {
            return; // started before: a connection is watched once
        }
        if let Err(e) = p.watch(&self.shared, socket, serve, hold) {
            crate::warn_limited!(
                error = %e,
                "cannot watch a connection's socket (is fs.epoll.max_user_watches reached?): its one-sided \
                 operations are served only while the application's runtime runs"
            );
        }
    }

    /// A read pass begins (the driver's or the thread's).
    pub(super) fn read_pass(&self) {
        self.shared.reads.fetch_add(1, Ordering::Relaxed);
        ACTIVITY.fetch_add(1, Ordering::Relaxed);
    }

    /// A write moved bytes.
    pub(super) fn wrote(&self) {
        self.shared.writes.fetch_add(1, Ordering::Relaxed);
        ACTIVITY.fetch_add(1, Ordering::Relaxed);
    }

    /// Output waits for room (the socket is full): the thread watches its room from now on.
    pub(super) fn output_waits(&self) {
        if !self.shared.output_waits.swap(true, Ordering::AcqRel)
            && let Some(p) = self.shared.thread.get()
        {
            p.note_output(self.shared.key);
        }
    }

    /// No output waits.
    pub(super) fn output_drained(&self) {
        if self.shared.output_waits.load(Ordering::Relaxed) {
            self.shared.output_waits.store(false, Ordering::Release);
        }
    }

    /// The driver task runs: its runtime is responsive, and serves the connection again if the thread did.
    pub(super) fn runtime_ran(&self) {
        if self.shared.taken.load(Ordering::Relaxed) {
            self.shared.taken.store(false, Ordering::Relaxed);
        }
    }

    /// Stops watching (the connection's reading is over, or its driver ended); again is nothing.
    pub(super) fn stop(&self) {
        if self.shared.watched.swap(false, Ordering::AcqRel)
            && let Some(p) = self.shared.thread.get()
        {
            p.unwatch(self.shared.key);
        }
    }
}

/// Stops the watch when dropped: the driver task holds one, so that a task dropped with its runtime
/// unwatches too.
pub(super) struct WatchGuard(pub(super) Watch);

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// The thread's state that registering code shares.
struct Progress {
    /// What the thread waits on: the poke, the timer, `sockets` while asleep, the connections it serves.
    epoll: OwnedFd,
    /// Every watched socket, level-triggered readable.
    sockets: OwnedFd,
    /// Rung when output starts waiting or a hold starts while the thread sleeps.
    poke: Doorbell,
    registry: Mutex<Registry>,
}

#[derive(Default)]
struct Registry {
    conns: HashMap<Key, Entry>,
    /// Connections whose output may wait for room.
    output: HashSet<Key>,
    /// Connections whose first-FPDU hold may be on.
    holds: HashSet<Key>,
    /// The thread sleeps until a socket is readable: new output waits and holds must poke it.
    asleep: bool,
}

struct Entry {
    fd: RawFd,
    serve: Arc<dyn Serve>,
    shared: Arc<Shared>,
}

/// The thread, started on first use; `None` if it could not start (said once).
fn progress() -> Option<&'static Progress> {
    let pid = std::process::id();
    let mut slot = PROGRESS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((started_by, p)) = *slot
        && started_by == pid
    {
        return p;
    }
    // This process's first connection, or a child of fork's: the parent's thread (and its epoll sets,
    // which the child shares) is left to the parent.
    let p = match Progress::start() {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::warn!(
                error = %e,
                "cannot start the {THREAD_NAME} thread: one-sided operations are served only while the \
                 application's runtime runs (is the process out of threads or file descriptors?)"
            );
            None
        }
    };
    *slot = Some((pid, p));
    p
}

impl Progress {
    fn start() -> io::Result<&'static Progress> {
        let epoll = epoll_create()?;
        let sockets = epoll_create()?;
        let poke = Doorbell::new()?;
        let timer = TimerFd::new(
            ClockId::CLOCK_MONOTONIC,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )
        .map_err(io::Error::from)?;
        ctl(
            &epoll,
            libc::EPOLL_CTL_ADD,
            poke.fd().as_raw_fd(),
            libc::EPOLLIN,
            POKE,
        )?;
        ctl(
            &epoll,
            libc::EPOLL_CTL_ADD,
            timer.as_fd().as_raw_fd(),
            libc::EPOLLIN,
            TIMER,
        )?;
        ctl(
            &epoll,
            libc::EPOLL_CTL_ADD,
            sockets.as_raw_fd(),
            libc::EPOLLIN,
            SOCKETS,
        )?;
        let p: &'static Progress = Box::leak(Box::new(Progress {
            epoll,
            sockets,
            poke,
            registry: Mutex::new(Registry {
                asleep: true,
                ..Registry::default()
            }),
        }));
        std::thread::Builder::new()
            .name(THREAD_NAME.into())
            .spawn(move || Thread::new(p, timer).run())?;
        Ok(p)
    }

    fn watch(&self, shared: &Arc<Shared>, fd: RawFd, serve: Arc<dyn Serve>, hold: bool) -> io::Result<()> {
        let mut reg = self.registry.lock().expect("not poisoned");
        ctl(&self.sockets, libc::EPOLL_CTL_ADD, fd, libc::EPOLLIN, shared.key)?;
        shared.watched.store(true, Ordering::Release);
        let key = shared.key;
        reg.conns.insert(
            key,
            Entry {
                fd,
                serve,
                shared: shared.clone(),
            },
        );
        let output = shared.output_waits.load(Ordering::Acquire);
        if output {
            reg.output.insert(key);
        }
        if hold {
            reg.holds.insert(key);
        }
        if (output || hold) && reg.asleep {
            let _ = self.poke.ring();
        }
        Ok(())
    }

    fn note_output(&self, key: Key) {
        let mut reg = self.registry.lock().expect("not poisoned");
        reg.output.insert(key);
        if reg.asleep {
            let _ = self.poke.ring();
        }
    }

    fn unwatch(&self, key: Key) {
        let entry = {
            let mut reg = self.registry.lock().expect("not poisoned");
            reg.output.remove(&key);
            reg.holds.remove(&key);
            reg.conns.remove(&key)
        };
        if let Some(e) = entry {
            // Before the entry (and with it, perhaps, the socket) is dropped: the descriptor is still open.
            let _ = ctl(&self.sockets, libc::EPOLL_CTL_DEL, e.fd, 0, key);
            let _ = ctl(&self.epoll, libc::EPOLL_CTL_DEL, e.fd, 0, key);
        }
    }

    /// The connection's serving side, if it is still watched.
    fn serving(&self, key: Key) -> Option<Arc<dyn Serve>> {
        let reg = self.registry.lock().expect("not poisoned");
        reg.conns.get(&key).map(|e| e.serve.clone())
    }
}

/// What only the thread holds.
struct Thread {
    p: &'static Progress,
    timer: TimerFd,
    dog: Watchdog,
    /// Connections the thread serves (in its wait set, edge-triggered).
    taken: HashSet<Key>,
    /// Whether `sockets` is in the wait set.
    asleep: bool,
    buf: Vec<u8>,
    events: Vec<libc::epoll_event>,
}

impl Thread {
    fn new(p: &'static Progress, timer: TimerFd) -> Thread {
        Thread {
            p,
            timer,
            dog: Watchdog::default(),
            taken: HashSet::new(),
            asleep: true,
            buf: Vec::new(),
            events: vec![libc::epoll_event { events: 0, u64: 0 }; EVENTS],
        }
    }

    fn run(mut self) {
        loop {
            let n = match wait(&self.p.epoll, &mut self.events, -1) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "{THREAD_NAME}: epoll_wait failed; the thread stops");
                    return;
                }
            };
            let mut look = false;
            let mut serve = Vec::new();
            for ev in &self.events[..n] {
                match ev.u64 {
                    POKE => {
                        let _ = self.p.poke.drain();
                        look = true;
                    }
                    TIMER => {
                        let _ = self.timer.wait();
                        look = true;
                    }
                    SOCKETS => look = true,
                    key => serve.push(key),
                }
            }
            self.give_back();
            for key in serve {
                if self.taken.contains(&key) {
                    self.serve(key);
                }
            }
            if look {
                self.look();
            }
        }
    }

    /// Connections whose driver task ran again go back to it.
    fn give_back(&mut self) {
        if self.taken.is_empty() {
            return;
        }
        let reg = self.p.registry.lock().expect("not poisoned");
        self.taken.retain(|key| match reg.conns.get(key) {
            Some(e) if e.shared.taken.load(Ordering::Relaxed) => true,
            Some(e) => {
                let _ = ctl(&self.p.epoll, libc::EPOLL_CTL_DEL, e.fd, 0, *key);
                false
            }
            None => false,
        });
    }

    fn serve(&mut self, key: Key) {
        let Some(serve) = self.p.serving(key) else {
            self.taken.remove(&key);
            return;
        };
        if serve.serve(&mut self.buf) == Served::Over {
            self.taken.remove(&key);
            self.p.unwatch(key);
        }
    }

    /// Takes `key` over: it is served now and on every event of its socket until its runtime is back.
    fn take(&mut self, key: Key) {
        if !self.taken.contains(&key) {
            let reg = self.p.registry.lock().expect("not poisoned");
            let Some(e) = reg.conns.get(&key) else { return };
            e.shared.taken.store(true, Ordering::Relaxed);
            let events = libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET;
            if ctl(&self.p.epoll, libc::EPOLL_CTL_ADD, e.fd, events, key).is_err() {
                return;
            }
            drop(reg);
            tracing::debug!(
                key,
                "{THREAD_NAME}: the application's runtime left a connection unserved; serving it"
            );
            self.taken.insert(key);
        }
        self.serve(key);
    }

    /// Looks at every watched connection, takes over those left unserved, and sleeps or ticks.
    fn look(&mut self) {
        let now = Instant::now();
        let seen = self.observe();
        let (take, next) = self.dog.look(now, &seen);
        for key in take {
            self.take(key);
        }
        let after = match next {
            Next::After(d) => Some(d),
            Next::Readable => {
                // Asleep only if nothing was noted since the look (under the lock the notes take).
                let mut reg = self.p.registry.lock().expect("not poisoned");
                if reg.output.is_empty() && reg.holds.is_empty() && self.taken.is_empty() {
                    reg.asleep = true;
                    None
                } else {
                    Some(GRACE)
                }
            }
        };
        match after {
            Some(d) => {
                if self.asleep {
                    self.asleep = false;
                    self.p.registry.lock().expect("not poisoned").asleep = false;
                    let _ = ctl(
                        &self.p.epoll,
                        libc::EPOLL_CTL_DEL,
                        self.p.sockets.as_raw_fd(),
                        0,
                        SOCKETS,
                    );
                }
                let at = Expiration::OneShot(TimeSpec::from_duration(
                    d.max(std::time::Duration::from_micros(1)),
                ));
                let _ = self.timer.set(at, TimerSetTimeFlags::empty());
            }
            None => {
                let _ = self.timer.unset();
                if !self.asleep {
                    self.asleep = true;
                    let _ = ctl(
                        &self.p.epoll,
                        libc::EPOLL_CTL_ADD,
                        self.p.sockets.as_raw_fd(),
                        libc::EPOLLIN,
                        SOCKETS,
                    );
                }
            }
        }
    }

    /// What the connections the runtime drives look like now.
    fn observe(&mut self) -> Look {
        let mut look = Look {
            activity: ACTIVITY.load(Ordering::Relaxed),
            taken: self.taken.len(),
            ..Look::default()
        };
        let readable = wait(&self.p.sockets, &mut self.events, 0).unwrap_or(0);
        let (output, holds) = {
            let mut reg = self.p.registry.lock().expect("not poisoned");
            let Registry {
                conns, output, holds, ..
            } = &mut *reg;
            for ev in &self.events[..readable] {
                let key = ev.u64;
                if let Some(e) = conns.get(&key)
                    && !self.taken.contains(&key)
                {
                    look.readable.push((key, e.shared.reads.load(Ordering::Relaxed)));
                }
            }
            output.retain(|k| {
                conns
                    .get(k)
                    .is_some_and(|e| e.shared.output_waits.load(Ordering::Acquire))
            });
            let output: Vec<(Key, RawFd, u64)> = output
                .iter()
                .filter(|k| !self.taken.contains(k))
                .filter_map(|k| {
                    conns
                        .get(k)
                        .map(|e| (*k, e.fd, e.shared.writes.load(Ordering::Relaxed)))
                })
                .collect();
            holds.retain(|k| conns.contains_key(k));
            let holds: Vec<(Key, Arc<dyn Serve>)> = holds
                .iter()
                .filter_map(|k| conns.get(k).map(|e| (*k, e.serve.clone())))
                .collect();
            (output, holds)
        };
        look.output_waits = !output.is_empty();
        let mut fds: Vec<libc::pollfd> = output
            .iter()
            .map(|&(_, fd, _)| libc::pollfd {
                fd,
                events: libc::POLLOUT,
                revents: 0,
            })
            .collect();
        let polled = if fds.is_empty() {
            0
        } else {
            // SAFETY: `fds` is a live array of `fds.len()` pollfds; the descriptors stay open (their entries'
            // sockets) or, unwatched meanwhile, at worst report nothing or POLLNVAL.
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) }
        };
        if polled > 0 {
            for (p, &(key, _, writes)) in fds.iter().zip(&output) {
                if p.revents & libc::POLLOUT != 0 {
                    look.writable.push((key, writes));
                }
            }
        }
        let mut over = Vec::new();
        for (key, serve) in holds {
            match serve.hold_deadline() {
                Some(deadline) => look.deadlines.push((key, deadline)),
                None => over.push(key),
            }
        }
        if !over.is_empty() {
            let mut reg = self.p.registry.lock().expect("not poisoned");
            for key in over {
                reg.holds.remove(&key);
            }
        }
        look
    }
}

fn epoll_create() -> io::Result<OwnedFd> {
    // SAFETY: epoll_create1 takes no pointers; it returns a new descriptor or -1.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn ctl(epoll: &OwnedFd, op: libc::c_int, fd: RawFd, events: libc::c_int, key: Key) -> io::Result<()> {
    let mut ev = libc::epoll_event {
        events: events as u32,
        u64: key,
    };
    // SAFETY: `ev` is a live epoll_event (ignored by EPOLL_CTL_DEL); `epoll` is an epoll descriptor this
    // module owns.
    if unsafe { libc::epoll_ctl(epoll.as_raw_fd(), op, fd, &mut ev) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn wait(epoll: &OwnedFd, events: &mut [libc::epoll_event], timeout_ms: libc::c_int) -> io::Result<usize> {
    // SAFETY: `events` is a live, writable array of `events.len()` entries.
    let n = unsafe {
        libc::epoll_wait(
            epoll.as_raw_fd(),
            events.as_mut_ptr(),
            events.len() as libc::c_int,
            timeout_ms,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}
