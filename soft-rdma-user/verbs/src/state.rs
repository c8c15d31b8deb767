//! The process-wide state both names of the library share (`libibverbs.so.1` and `librdmacm.so.1` are one
//! file, mapped once): the tokio runtime (one worker thread, `soft-rdma-verbs`), the session with
//! soft-rdmad (`soft_rdma::client::Adapter`) and the one device it is, made on first use
//! (`ibv_get_device_list`, `rdma_create_event_channel`).
//!
//! Calls that are synchronous in C and asynchronous in Rust run with `block_on` on the caller's thread;
//! the data path (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`) calls the client's synchronous calls
//! directly.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

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
    /// Set once soft-rdmad's session ended (`crate::events`).
    pub(crate) gone: AtomicBool,
}

impl Process {
    pub(crate) fn adapter_alive(&self) -> bool {
        !self.gone.load(Ordering::Acquire)
    }
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();
static PROCESS: Mutex<Option<Arc<Process>>> = Mutex::new(None);
static SAID_UNREACHABLE: AtomicBool = AtomicBool::new(false);

/// The environment variable that turns the library's logs on, on stderr (a `tracing` filter: `info`,
/// `soft_rdma=debug`, …).
pub const LOG_ENV: &str = "SOFT_RDMA_LOG";

/// The runtime's handle (made on first use: one worker thread named `soft-rdma-verbs`).
pub(crate) fn handle() -> &'static Handle {
    RUNTIME
        .get_or_init(|| {
            if let Ok(filter) = std::env::var(LOG_ENV) {
                let _ = tracing_subscriber::fmt()
                    .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                    .with_writer(std::io::stderr)
                    .with_ansi(false)
                    .try_init();
            }
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("soft-rdma-verbs")
                .enable_all()
                .build()
                .expect("a tokio runtime with one worker thread can be built")
        })
        .handle()
}

/// Runs `f` to completion on the caller's thread (the C call is synchronous).
pub(crate) fn block_on<F: Future>(f: F) -> F::Output {
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
            });
            crate::events::watch_device(&p);
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
