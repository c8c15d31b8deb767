//! The client-library calls these libraries need beyond the connector model, in one place: registering
//! the program's own memory, completion notification, flushing a queue pair, and learning that soft-rdmad
//! went away.
//!
//! TEMPORARY (until `main` has `Adapter::register_borrowed_memory`, `CompletionQueue::request_notification`,
//! `QueuePair::flush` and `Adapter::closed`): without them, `ibv_reg_mr` answers ENOSYS, completion
//! notification and flush answer EOPNOTSUPP, and the end of the session is found by asking soft-rdmad.

use std::future::Future;
use std::ptr::NonNull;
use std::sync::Arc;

use soft_rdma::client::{Access, Adapter, CompletionQueue, MemoryRegion, QueuePair};
use soft_rdma::{Error, NdStatus, Result};

fn missing(what: &str) -> Error {
    Error::new(
        NdStatus::Unsuccessful,
        format!("{what} needs a newer soft-rdma client library than this build has"),
    )
}

/// Registers `len` bytes at `base` that the program owns; peers address byte i as `iova + i`.
///
/// # Safety
/// `base..base + len` stays mapped until the region is dropped.
pub(crate) unsafe fn register_borrowed_memory(
    _adapter: &Adapter,
    _base: NonNull<u8>,
    _len: usize,
    _iova: u64,
    _access: Access,
) -> impl Future<Output = Result<MemoryRegion>> {
    async { Err(missing("registering the program's own memory")) }
}

/// After this call the next completion (a solicited one if asked) calls `notify` once.
pub(crate) fn request_notification(
    _cq: &CompletionQueue,
    _solicited_only: bool,
    _notify: Arc<dyn Fn() + Send + Sync>,
) -> Result<()> {
    Err(missing("completion notification"))
}

/// The queue pair goes to Error; everything posted completes CANCELED.
pub(crate) fn flush(_qp: &QueuePair) -> Result<()> {
    Err(missing("flushing a queue pair"))
}

/// Resolves when soft-rdmad's session ends.
pub(crate) fn closed(adapter: &Adapter) -> impl Future<Output = ()> + Send + 'static {
    let adapter = adapter.clone();
    async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            if let Err(e) = adapter.query().await
                && e.status == NdStatus::DeviceRemoved
            {
                return;
            }
        }
    }
}
