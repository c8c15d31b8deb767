//! What happens when soft-rdmad's session ends: every open context gets IBV_EVENT_DEVICE_FATAL on its
//! async fd (verbs.h `enum ibv_event_type`), every rdma_cm id on a channel RDMA_CM_EVENT_DEVICE_REMOVAL
//! (rdma_cma.h), the port goes down, and calls fail from then on (the client library answers
//! DEVICE_REMOVED, ENODEV here).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::abi::IBV_EVENT_DEVICE_FATAL;
use crate::state::{self, Process};

/// Starts the one task that waits for the session's end (called once, when the session opens).
pub(crate) fn watch_device(process: &Arc<Process>) {
    let weak = Arc::downgrade(process);
    let closed = crate::primitives::closed(&process.adapter);
    state::handle().spawn(async move {
        closed.await;
        let Some(process) = weak.upgrade() else { return };
        process.gone.store(true, Ordering::Release);
        tracing::warn!("soft-rdmad's session ended: the device is gone (IBV_EVENT_DEVICE_FATAL)");
        for ctx in crate::device::contexts() {
            ctx.post_async_event(IBV_EVENT_DEVICE_FATAL, 0);
        }
        crate::cm::device_removed();
    });
}
