//! How a Rust function becomes one of rdma-core's versioned C symbols, and the rules every `extern "C"`
//! entry follows: no panic unwinds into C (`guard`), errors become errno values, and every pointer from a
//! C caller is looked up in a registry of live handles before it is used (`Registry`).
//!
//! Symbol versions: `export!("IBVERBS_1.1"; fn ibv_alloc_pd(...) ...)` defines the function under the name
//! `soft_rdma_ibv_alloc_pd` and binds `ibv_alloc_pd@@IBVERBS_1.1` to it with `.symver` (GNU as), so that
//! binaries linked against rdma-core 44 (`libibverbs.map.in`, `librdmacm.map`) bind to it. The nodes are
//! declared in `symbols.map` (build.rs).

use foldhash::HashMap;
use std::cell::RefCell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};

use libc::c_int;

/// Defines an `extern "C"` function and binds its C name at a version node of rdma-core's maps.
macro_rules! export {
    ($ver:literal; $(#[$m:meta])* fn $name:ident ($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        ///
        /// # Safety
        /// A C entry point: pointer arguments are the caller's as rdma-core's headers describe them
        /// (handles are checked against the live ones before use; buffers and out-parameters are not).
        #[unsafe(export_name = concat!("soft_rdma_", stringify!($name)))]
        pub unsafe extern "C" fn $name($($arg: $ty),*) $(-> $ret)? $body
        ::core::arch::global_asm!(concat!(
            ".symver soft_rdma_", stringify!($name), ", ", stringify!($name), "@@", $ver
        ));
    };
}
pub(crate) use export;

/// Runs `f`, catching a panic (a bug in these libraries) so that it never unwinds into the C caller, which
/// then gets `failed` with errno EIO.
pub(crate) fn guard<R>(what: &str, failed: R, f: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(panic) => {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(call = what, panic = %why, "soft-rdma's verbs library failed inside {what}: this is a bug in soft-rdma");
            set_errno(libc::EIO);
            failed
        }
    }
}

pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

pub(crate) fn errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// An errno value (positive), the error every call here reports in C's terms.
pub(crate) type Errno = c_int;

/// For calls that return an errno value (0 on success): `ibv_query_device`, `ibv_modify_qp`, …
pub(crate) fn ret_errno(what: &str, f: impl FnOnce() -> Result<(), Errno>) -> c_int {
    guard(what, libc::EIO, || match f() {
        Ok(()) => 0,
        Err(e) => e,
    })
}

/// For calls that return 0 or -1 with errno set (rdma_cm's, `ibv_get_cq_event`, …).
pub(crate) fn ret_minus_one(what: &str, f: impl FnOnce() -> Result<(), Errno>) -> c_int {
    guard(what, -1, || match f() {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            -1
        }
    })
}

/// For calls that return a pointer, NULL with errno set on failure.
pub(crate) fn ret_ptr<T>(what: &str, f: impl FnOnce() -> Result<*mut T, Errno>) -> *mut T {
    guard(what, std::ptr::null_mut(), || match f() {
        Ok(p) => p,
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    })
}

/// An object whose C struct (`T::C`) is its first field, handed to C callers by that field's address.
///
/// # Safety
/// The implementing struct is `#[repr(C)]` and its first field is an `UnsafeCell<Self::C>`.
pub(crate) unsafe trait CObject: Send + Sync + 'static {
    type C;
    /// What the handle is, in words ("queue pair").
    const KIND: &'static str;
}

/// The live handles of one kind, by address: a pointer a C caller passes is used only if it is here (a
/// foreign, freed or mistyped pointer gets EINVAL, never a dereference). Each is tagged with the process
/// generation that made it ([`crate::state::generation`]): in a child of `fork`, the parent's objects
/// answer EIO (their session and runtime stayed with the parent), and are neither listed nor freed.
///
/// The data path's calls (`ibv_post_send`, `ibv_poll_cq`, …) find their object through a per-thread memory
/// of the last one found ([`LastHit`], [`Registry::get_hot`]): the same pointer, while no object of the kind
/// was removed since, is the same live object, so a thread that posts on one queue pair pays a comparison
/// and a reference count instead of the registry's process-wide lock. A removal bumps `removals`, which
/// every thread's memory then fails to match (a freed address reused by a new object is looked up again).
pub(crate) struct Registry<T: CObject> {
    live: LazyLock<Mutex<Live<T>>>,
    /// Objects removed so far: a thread's [`LastHit`] made before the last removal is not trusted.
    removals: AtomicU64,
}

/// One thread's memory of the last object a registry gave it (`thread_local!`, one per registry).
pub(crate) struct LastHit<T> {
    hit: RefCell<Option<Hit<T>>>,
}

struct Hit<T> {
    p: usize,
    removals: u64,
    generation: u64,
    object: Weak<T>,
}

impl<T> LastHit<T> {
    pub(crate) const fn new() -> Self {
        LastHit {
            hit: RefCell::new(None),
        }
    }
}

/// Live objects by address, each with the process generation that made it.
type Live<T> = HashMap<usize, (u64, Arc<T>)>;

impl<T: CObject> Registry<T> {
    pub(crate) const fn new() -> Self {
        Registry {
            live: LazyLock::new(Mutex::default),
            removals: AtomicU64::new(0),
        }
    }

    /// [`Self::get`] through this thread's memory of its last hit (`last`): no lock when `p` is the object
    /// this thread found last and no object of the kind was removed since (nor the process forked).
    pub(crate) fn get_hot(
        &self,
        last: &'static std::thread::LocalKey<LastHit<T>>,
        p: *const T::C,
    ) -> Result<Arc<T>, Errno> {
        let removals = self.removals.load(Ordering::Acquire);
        let generation = crate::state::generation();
        let known = last.with(|l| {
            let hit = l.hit.borrow();
            hit.as_ref()
                .filter(|h| h.p == p as usize && h.removals == removals && h.generation == generation)
                .and_then(|h| h.object.upgrade())
        });
        if let Some(object) = known {
            return Ok(object);
        }
        let object = self.get(p)?;
        last.with(|l| {
            *l.hit.borrow_mut() = Some(Hit {
                p: p as usize,
                removals,
                generation,
                object: Arc::downgrade(&object),
            });
        });
        Ok(object)
    }

    fn map(&self) -> std::sync::MutexGuard<'_, Live<T>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `object` and returns the pointer C callers get.
    pub(crate) fn insert(&self, object: Arc<T>) -> *mut T::C {
        let p = Arc::as_ptr(&object) as *mut T::C;
        self.map()
            .insert(p as usize, (crate::state::generation(), object));
        p
    }

    /// The live object `p` names: EINVAL if none, EIO if the parent process made it before a fork.
    pub(crate) fn get(&self, p: *const T::C) -> Result<Arc<T>, Errno> {
        if p.is_null() {
            return Err(libc::EINVAL);
        }
        match self.map().get(&(p as usize)) {
            Some((g, o)) if *g == crate::state::generation() => Ok(o.clone()),
            Some(_) => {
                tracing::warn!(
                    pointer = ?p,
                    "this {} was made by the parent process before fork(): it stays the parent's, and a child \
                     cannot use it (EIO); open the device again in the child",
                    T::KIND
                );
                Err(libc::EIO)
            }
            None => {
                tracing::warn!(pointer = ?p, "not a live {} of soft-rdma's verbs library: EINVAL", T::KIND);
                Err(libc::EINVAL)
            }
        }
    }

    /// The live object `p` names, if any, without a word: for lookups that expect to miss (an event or
    /// a CQ dropped while queued).
    pub(crate) fn find(&self, p: *const T::C) -> Option<Arc<T>> {
        let now = crate::state::generation();
        self.map()
            .get(&(p as usize))
            .filter(|(g, _)| *g == now)
            .map(|(_, o)| o.clone())
    }

    /// Forgets `p` (the object is freed once the calls using it return): EINVAL if none, EIO (and kept)
    /// if the parent process made it before a fork.
    pub(crate) fn remove(&self, p: *const T::C) -> Result<Arc<T>, Errno> {
        let mut map = self.map();
        match map.get(&(p as usize)) {
            None => Err(libc::EINVAL),
            Some((g, _)) if *g != crate::state::generation() => Err(libc::EIO),
            Some(_) => {
                // Before the object leaves the map: a thread that reads the old count afterwards finds the
                // map without it.
                self.removals.fetch_add(1, Ordering::AcqRel);
                map.remove(&(p as usize)).map(|(_, o)| o).ok_or(libc::EINVAL)
            }
        }
    }

    /// Every live object of this process, for checks such as "a CQ still in use".
    pub(crate) fn all(&self) -> Vec<Arc<T>> {
        let now = crate::state::generation();
        self.map()
            .values()
            .filter(|(g, _)| *g == now)
            .map(|(_, o)| o.clone())
            .collect()
    }
}

/// A C struct inside a Rust object: the program may read and write its fields at any time (as with
/// rdma-core), so it is reached only through raw pointers.
#[repr(transparent)]
pub(crate) struct CCell<C>(std::cell::UnsafeCell<C>);

// SAFETY: the C struct is shared with the program exactly as rdma-core shares its own; these libraries
// write its fields only while creating the object or under the object's own locks.
unsafe impl<C> Send for CCell<C> {}
unsafe impl<C> Sync for CCell<C> {}

impl<C> CCell<C> {
    pub(crate) fn new(c: C) -> Self {
        CCell(std::cell::UnsafeCell::new(c))
    }

    pub(crate) fn get(&self) -> *mut C {
        self.0.get()
    }
}

/// A pipe whose read end programs poll (`ibv_comp_channel.fd`, `rdma_event_channel.fd`,
/// `ibv_context.async_fd`): one byte written per queued event, read back by the call that takes it, so
/// that a blocking read waits and an O_NONBLOCK one answers EAGAIN, as rdma-core's kernel files do.
pub(crate) struct EventPipe {
    pub(crate) read: c_int,
    write: c_int,
}

impl EventPipe {
    pub(crate) fn new() -> Result<EventPipe, Errno> {
        let mut fds = [0 as c_int; 2];
        // SAFETY: fds has room for the two descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(errno());
        }
        // The write end never blocks: a full pipe (64 KiB of unread events) drops the extra byte, and
        // `take` below then finds the queued event anyway.
        // SAFETY: fds[1] is the pipe's write end, just made.
        unsafe { libc::fcntl(fds[1], libc::F_SETFL, libc::O_NONBLOCK) };
        Ok(EventPipe {
            read: fds[0],
            write: fds[1],
        })
    }

    /// One more event is queued: `false` if its byte could not be written (a full pipe, readable anyway).
    pub(crate) fn ring(&self) -> bool {
        let b = 1u8;
        // SAFETY: writes one byte from a live local.
        unsafe { libc::write(self.write, (&b as *const u8).cast(), 1) == 1 }
    }

    /// Reads one byte that is known to be there (written by [`Self::ring`] for an event being taken).
    pub(crate) fn take_byte(&self) {
        let mut b = 0u8;
        // SAFETY: reads one byte into a live local.
        unsafe { libc::read(self.read, (&mut b as *mut u8).cast(), 1) };
    }

    /// Waits until the read end is readable, without reading; EINTR from a signal, as [`Self::wait`].
    pub(crate) fn wait_readable(&self) -> Result<(), Errno> {
        self.poll_readable(-1).map(drop)
    }

    /// Whether the read end is readable within `timeout_ms` (poll(2): -1 waits for ever, 0 looks now).
    pub(crate) fn poll_readable(&self, timeout_ms: c_int) -> Result<bool, Errno> {
        let mut p = libc::pollfd {
            fd: self.read,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        match unsafe { libc::poll(&mut p, 1, timeout_ms) } {
            n if n >= 0 => Ok(n == 1),
            _ => Err(errno()),
        }
    }

    /// Whether the program made the read end non-blocking (O_NONBLOCK): then nothing may wait on it.
    pub(crate) fn nonblocking(&self) -> bool {
        // SAFETY: F_GETFL on the pipe's own descriptor.
        let flags = unsafe { libc::fcntl(self.read, libc::F_GETFL) };
        flags < 0 || flags & libc::O_NONBLOCK != 0
    }

    /// Waits (unless the program set O_NONBLOCK on the read end) for one event's byte. A signal whose
    /// handler was installed without SA_RESTART ends the wait with EINTR, as it ends the `read` (or
    /// `write`) on the kernel's file that rdma-core's `ibv_get_cq_event`, `ibv_get_async_event` and
    /// `rdma_get_cm_event` make, which return -1 with that errno: qperf's SIGALRM ends its test so
    /// (`rd_poll`, `maybe`). With SA_RESTART the kernel restarts the `read` itself.
    pub(crate) fn wait(&self) -> Result<(), Errno> {
        let mut b = 0u8;
        // SAFETY: reads one byte into a live local.
        let n = unsafe { libc::read(self.read, (&mut b as *mut u8).cast(), 1) };
        match n {
            1 => Ok(()),
            0 => Err(libc::EIO),
            _ => Err(errno()),
        }
    }
}

impl Drop for EventPipe {
    fn drop(&mut self) {
        // SAFETY: both descriptors are this pipe's own.
        unsafe {
            libc::close(self.read);
            libc::close(self.write);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    extern "C" fn ignore(_: c_int) {}

    #[test]
    fn a_signal_without_sa_restart_ends_the_wait_with_eintr() {
        // SIGUSR2 with a handler installed without SA_RESTART, as qperf installs its SIGALRM.
        // SAFETY: an all-zero sigaction with a handler that does nothing.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = ignore as extern "C" fn(c_int) as usize;
            sa.sa_flags = 0;
            assert_eq!(libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut()), 0);
        }
        let pipe = EventPipe::new().expect("pipe");
        // SAFETY: this thread's own id.
        let me = unsafe { libc::pthread_self() };
        let done = Arc::new(AtomicBool::new(false));
        let signaller = {
            let done = done.clone();
            std::thread::spawn(move || {
                // Until the wait has ended: a signal sent before the read began is simply sent again.
                while !done.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(20));
                    // SAFETY: the test thread is alive until `done` is set.
                    unsafe { libc::pthread_kill(me, libc::SIGUSR2) };
                }
            })
        };
        let r = pipe.wait();
        done.store(true, Ordering::Release);
        signaller.join().expect("signaller");
        assert_eq!(r, Err(libc::EINTR));
        // An event queued meanwhile is still there for the next wait.
        pipe.ring();
        assert_eq!(pipe.wait(), Ok(()));
    }

    #[repr(C)]
    struct Thing {
        c: CCell<u64>,
    }

    // SAFETY: #[repr(C)], the C struct first.
    unsafe impl CObject for Thing {
        type C = u64;
        const KIND: &'static str = "thing";
    }

    static THINGS: Registry<Thing> = Registry::new();
    thread_local! {
        static LAST_THING: LastHit<Thing> = const { LastHit::new() };
    }

    /// The per-thread memory of the last hit answers as the registry does: the live object, and EINVAL
    /// for a removed one (even at the remembered address) or one never registered.
    #[test]
    fn the_last_hit_never_outlives_its_object() {
        let thing = || Arc::new(Thing { c: CCell::new(7) });
        let (a, b) = (THINGS.insert(thing()), THINGS.insert(thing()));
        for _ in 0..2 {
            assert_eq!(
                THINGS.get_hot(&LAST_THING, a).map(|t| t.c.get() as usize),
                Ok(a as usize)
            );
        }
        assert_eq!(
            THINGS.get_hot(&LAST_THING, b).map(|t| t.c.get() as usize),
            Ok(b as usize)
        );
        THINGS.remove(b).unwrap();
        assert_eq!(
            THINGS.get_hot(&LAST_THING, b).err(),
            Some(libc::EINVAL),
            "removed"
        );
        assert_eq!(
            THINGS.get_hot(&LAST_THING, a).map(|t| t.c.get() as usize),
            Ok(a as usize)
        );
        THINGS.remove(a).unwrap();
        assert_eq!(
            THINGS.get_hot(&LAST_THING, a).err(),
            Some(libc::EINVAL),
            "removed after a hit"
        );
        let foreign = 0x1000 as *const u64;
        assert_eq!(
            THINGS.get_hot(&LAST_THING, foreign).err(),
            Some(libc::EINVAL),
            "never registered"
        );
        assert_eq!(
            THINGS.get_hot(&LAST_THING, std::ptr::null()).err(),
            Some(libc::EINVAL)
        );
    }
}
