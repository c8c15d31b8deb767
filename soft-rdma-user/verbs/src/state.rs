//! The process-wide state both names of the library share (`libibverbs.so.1` and `librdmacm.so.1` are one
//! file, mapped once): the tokio runtime (one worker thread, `soft-rdma-verbs`), the session with
//! soft-rdmad (`soft_rdma::client::Adapter`) and the one device it is, made on first use
//! (`ibv_get_device_list`, `rdma_create_event_channel`).
//!
//! Calls that are synchronous in C and asynchronous in Rust run with `block_on` on the caller's thread;
//! the data path (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`) calls the client's synchronous calls
//! directly.
//!
//! **fork.** A child of `fork` has none of its parent's threads, so neither the runtime nor the session
//! would work there. The handlers registered with `pthread_atfork` (`fork_handlers`) hold the state's locks
//! across the fork and, in the child, start a new generation: the first call makes a runtime and a session
//! of the child's own (a new Hello to soft-rdmad, so the child's objects are owned by its own pid), and
//! the objects the parent made answer EIO there ([`crate::export::Registry`]). Python's multiprocessing
//! and rdma-core's own test suite work this way: the parent opens the device, each child its own.

use std::cell::RefCell;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once, OnceLock};
use std::time::Duration;

use soft_rdma::client::{Adapter, AdapterInfo};
use tokio::runtime::{Handle, Runtime};

use crate::export::Errno;
use crate::netif::Interface;

/// The device's name, as `ibv_devices` lists it.
pub const DEVICE_NAME: &str = "softrdma0";

/// The session and the device it is.
pub(crate) struct Process {
    pub(crate) adapter: Adapter,
    pub(crate) info: AdapterInfo,
    /// The interface whose MAC gives the GUIDs and the GID, and whose MTU the port reports.
    pub(crate) interface: Interface,
    /// Set once soft-rdmad's session ended (`crate::events`), or in a child of fork for its parent's.
    pub(crate) gone: AtomicBool,
    /// The context every rdma_cm id's `verbs` points at, made on first use (`crate::cm::cm_context`).
    pub(crate) cm_context: OnceLock<usize>,
    /// The PD rdma_cm ids use when a program gives none (`crate::cm`).
    pub(crate) cm_default_pd: OnceLock<usize>,
}

impl Process {
    pub(crate) fn adapter_alive(&self) -> bool {
        !self.gone.load(Ordering::Acquire)
    }
}

/// This generation's runtime, leaked once made (a child of fork makes its own: the parent's has no
/// thread there and is never dropped).
static RUNTIME: AtomicPtr<Runtime> = AtomicPtr::new(std::ptr::null_mut());
static RUNTIME_MAKING: Mutex<()> = Mutex::new(());
static PROCESS: Mutex<Option<Arc<Process>>> = Mutex::new(None);
static SAID_UNREACHABLE: AtomicBool = AtomicBool::new(false);
/// Bumped in each child of fork (`fork_handlers`).
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// The environment variable that turns the library's logs on, on stderr (a `tracing` filter: `info`,
/// `soft_rdma=debug`, …).
pub const LOG_ENV: &str = "SOFT_RDMA_LOG";

/// Which process the library's objects belong to: 0 in the process that loaded it, one more in each child
/// of fork.
pub(crate) fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// The runtime's handle (made on first use in this process: one worker thread named `soft-rdma-verbs`).
pub(crate) fn handle() -> &'static Handle {
    let p = RUNTIME.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: a leaked runtime, never freed.
        return unsafe { (*p).handle() };
    }
    fork_handlers();
    let _making = RUNTIME_MAKING.lock().unwrap_or_else(|p| p.into_inner());
    let p = RUNTIME.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: as above.
        return unsafe { (*p).handle() };
    }
    static LOGS: Once = Once::new();
    LOGS.call_once(|| {
        if let Ok(filter) = std::env::var(LOG_ENV) {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_writer(std::io::stderr)
                .with_ansi(false)
                .try_init();
        }
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("soft-rdma-verbs")
        .enable_all()
        .build()
        .expect("a tokio runtime with one worker thread can be built");
    let runtime: &'static Runtime = Box::leak(Box::new(runtime));
    RUNTIME.store((runtime as *const Runtime).cast_mut(), Ordering::Release);
    runtime.handle()
}

/// How long the exit handler waits for soft-rdmad to take the last report.
const EXIT_REPORT: Duration = Duration::from_secs(1);

/// Registers, once, what runs at `exit` (atexit(3)): a program that exits with queue pairs still
/// connected, as C programs do, has their counters reported first (`Adapter::report_now`), so that
/// soft-rdmad's metrics count what they moved since the last periodic report (docs/metrics.md).
///
/// glibc's `exit` destroys the exiting thread's thread-locals before it runs these handlers (stdlib/exit.c:
/// `__call_tls_dtors` first), and tokio's `block_on` and `tracing` need theirs: the report is made on a
/// thread of its own (pthread_create(3), which touches no Rust thread-local of the caller), waited for
/// [`EXIT_REPORT`] and a second more at most. Nothing is reported in a child of fork whose session is its
/// parent's, or while another thread holds the state's lock. A program killed by a signal runs no
/// handler: its last report interval may be missing.
fn exit_handler() {
    extern "C" fn report(_: *mut libc::c_void) -> *mut libc::c_void {
        let _ = std::panic::catch_unwind(|| {
            let Some(p) = PROCESS.try_lock().ok().and_then(|slot| slot.clone()) else {
                return;
            };
            if p.adapter_alive() && !RUNTIME.load(Ordering::Acquire).is_null() {
                // The timer is made inside: it needs the runtime's context.
                let r = block_on(async { tokio::time::timeout(EXIT_REPORT, p.adapter.report_now()).await });
                tracing::debug!(result = ?r, "exit: the queue pairs' counters reported to soft-rdmad");
            }
        });
        std::ptr::null_mut()
    }
    extern "C" fn at_exit() {
        let mut thread: libc::pthread_t = 0;
        // SAFETY: `report` has C linkage and takes no argument; `thread` receives the new thread's id.
        if unsafe { libc::pthread_create(&mut thread, std::ptr::null(), report, std::ptr::null_mut()) } != 0 {
            return;
        }
        let mut deadline = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec to fill; then the thread made above, joined once.
        unsafe {
            libc::clock_gettime(libc::CLOCK_REALTIME, &mut deadline);
            deadline.tv_sec += EXIT_REPORT.as_secs() as libc::time_t + 1;
            if libc::pthread_timedjoin_np(thread, std::ptr::null_mut(), &deadline) != 0 {
                libc::pthread_detach(thread);
            }
        }
    }
    static REGISTERED: Once = Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: a handler with C linkage that lives as long as the library (never unloaded: its runtime
        // and session are leaked).
        if unsafe { libc::atexit(at_exit) } != 0 {
            tracing::warn!(
                "atexit failed: a program that exits without closing its queue pairs may miss its last \
                 second in soft-rdmad's metrics"
            );
        }
    });
}

type HeldForFork = (MutexGuard<'static, ()>, MutexGuard<'static, Option<Arc<Process>>>);

thread_local! {
    /// The state's locks, held by the thread that forks from `prepare` to `parent` or `child`.
    static HELD_FOR_FORK: RefCell<Option<HeldForFork>> = const { RefCell::new(None) };
}

/// Registers the fork handlers, once (pthread_atfork(3)).
fn fork_handlers() {
    extern "C" fn prepare() {
        // In `process()`'s order (it holds PROCESS while the runtime may be made), so that a fork on one
        // thread and a first call on another cannot wait for each other.
        let process = PROCESS.lock().unwrap_or_else(|p| p.into_inner());
        let making = RUNTIME_MAKING.lock().unwrap_or_else(|p| p.into_inner());
        HELD_FOR_FORK.with(|h| *h.borrow_mut() = Some((making, process)));
    }
    extern "C" fn parent() {
        HELD_FOR_FORK.with(|h| drop(h.borrow_mut().take()));
    }
    extern "C" fn child() {
        GENERATION.fetch_add(1, Ordering::AcqRel);
        crate::lease::reset_after_fork();
        RUNTIME.store(std::ptr::null_mut(), Ordering::Release);
        HELD_FOR_FORK.with(|h| {
            if let Some((_making, mut process)) = h.borrow_mut().take()
                && let Some(p) = process.take()
            {
                // The parent's session: gone for this process, and never dropped here (its Goodbye would
                // go on the parent's socket, through a runtime with no thread).
                p.gone.store(true, Ordering::Release);
                std::mem::forget(p);
            }
        });
    }
    static REGISTERED: Once = Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: three handlers with C linkage that live as long as the library.
        let rc = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
        if rc != 0 {
            tracing::warn!(
                error = rc,
                "pthread_atfork failed: a child of fork cannot use soft-rdma's verbs"
            );
        }
    });
}

/// Runs `f` to completion on the caller's thread (the C call is synchronous).
pub(crate) fn block_on<F: Future>(f: F) -> F::Output {
    // The worker may be held for a thread that waits inline (crate::lease): it is needed now.
    let _wanted = crate::lease::runtime_wanted();
    handle().block_on(f)
}

/// Whether the caller's thread is one of the runtime's (a `block_on` there would panic).
fn on_runtime_thread() -> bool {
    Handle::try_current().is_ok()
}

/// The session with soft-rdmad, opened on first use. Without a daemon: ENODEV, after saying once on
/// stderr where soft-rdmad was looked for and how to start it.
pub(crate) fn process() -> Result<Arc<Process>, Errno> {
    let mut slot = PROCESS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = slot.as_ref() {
        return Ok(p.clone());
    }
    if on_runtime_thread() {
        return Err(libc::EDEADLK);
    }
    match block_on(Adapter::open_default()) {
        Ok(adapter) => {
            let info = adapter.info().clone();
            let p = Arc::new(Process {
                adapter,
                info,
                interface: Interface::pick(),
                gone: AtomicBool::new(false),
                cm_context: OnceLock::new(),
                cm_default_pd: OnceLock::new(),
            });
            crate::events::watch_device(&p);
            exit_handler();
            *slot = Some(p.clone());
            Ok(p)
        }
        Err(e) => {
            if !SAID_UNREACHABLE.swap(true, Ordering::Relaxed) {
                // The error names the socket and says how to start soft-rdmad.
                eprintln!("soft-rdma: no RDMA device, because {e}");
            }
            Err(libc::ENODEV)
        }
    }
}
