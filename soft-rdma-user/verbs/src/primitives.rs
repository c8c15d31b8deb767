//! The client-library calls these libraries need beyond the connector model, in one place: registering
//! the program's own memory (`Adapter::register_borrowed_memory`), completion notification
//! (`CompletionQueue::request_notification`), flushing a queue pair (`ibv_modify_qp` to IBV_QPS_ERR), and
//! learning that soft-rdmad went away (`Adapter::closed`).

use std::future::Future;
use std::ptr::NonNull;
use std::sync::Arc;

use soft_rdma::client::{Access, Adapter, CompletionQueue, MemoryRegion, PdId};
use soft_rdma::{Error, NdStatus, Result};

/// Registers `len` bytes at `base` that the program owns, in protection domain `pd`; peers address byte i
/// as `iova + i`.
///
/// # Safety
/// `base..base + len` stays mapped until the region is dropped.
pub(crate) async unsafe fn register_borrowed_memory(
    adapter: &Adapter,
    pd: PdId,
    base: NonNull<u8>,
    len: usize,
    iova: u64,
    access: Access,
) -> Result<MemoryRegion> {
    // SAFETY: the caller's contract, passed on.
    unsafe { adapter.register_borrowed_memory_in(pd, base, len, iova, access) }.await
}

/// After this call the next completion (any completion, when only solicited ones were asked: more often
/// than asked, never less) calls `notify` once.
pub(crate) fn request_notification(
    cq: &CompletionQueue,
    solicited_only: bool,
    notify: Arc<dyn Fn() + Send + Sync>,
) -> Result<()> {
    cq.request_notification(solicited_only, notify)
}

/// Moving a connected queue pair to Error ends its connection, as siw does (`siw_qp_modify` to ERROR
/// drops the LLP connection): `disconnect` on its connector flushes what is posted (CANCELED, i.e.
/// IBV_WC_WR_FLUSH_ERR). A queue pair never connected has no such call in the client library yet.
pub(crate) fn flush_unconnected() -> Error {
    Error::new(
        NdStatus::Unsuccessful,
        "moving a queue pair that was never connected to IBV_QPS_ERR needs QueuePair::flush, which this \
         soft-rdma client library lacks",
    )
}

/// Resolves when soft-rdmad's session ends.
pub(crate) fn closed(adapter: &Adapter) -> impl Future<Output = ()> + Send + 'static {
    let adapter = adapter.clone();
    async move { adapter.closed().await }
}
