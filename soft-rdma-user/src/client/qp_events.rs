//! Queue pairs' asynchronous events in the client library ([`QueuePairEvent`]: IBV_EVENT_QP_FATAL,
//! IBV_EVENT_QP_REQ_ERR, IBV_EVENT_QP_ACCESS_ERR of rdma-core verbs.h `enum ibv_event_type`), raised by
//! the engine where kernel siw raises them (docs/protection.md). In kernel-TCP mode they come from the
//! session's in-process data path; when soft-rdmad runs the data path (XDP mode), as
//! `Event::QueuePairEvent` (protocol 11). Each queue pair raises at most one, when it moves to Error.

use std::sync::Arc;

use super::Inner;
use super::data::QueuePair;
use crate::engine::verbs::{QueuePairEvent, QueuePairId};

/// Called with a queue pair's asynchronous event.
pub(super) type QpEventHandler = Arc<dyn Fn(QueuePairEvent) + Send + Sync>;

impl Inner {
    /// Tells who asked ([`QueuePair::on_async_event`]) that `qp` raised `event`.
    pub(super) fn queue_pair_event(&self, qp: QueuePairId, event: QueuePairEvent) {
        tracing::debug!(qp = qp.0, ?event, "queue pair event");
        let handler = self.qp_handlers.lock().expect("not poisoned").get(&qp).cloned();
        if let Some(f) = handler {
            f(event);
        }
    }

    /// The queue pair is gone: its handler with it.
    pub(super) fn forget_queue_pair_events(&self, qp: QueuePairId) {
        self.qp_handlers.lock().expect("not poisoned").remove(&qp);
    }
}

impl QueuePair {
    /// `f` is called with this queue pair's asynchronous event, if it raises one: at most once, when it
    /// moves to Error for a local protection error or a malformed inbound message
    /// ([`QueuePairEvent::Fatal`]), a refused Read Request ([`QueuePairEvent::RequestError`]) or a refused
    /// access to this side's memory ([`QueuePairEvent::AccessError`]). A Terminate from the peer raises
    /// none (the queue pair's state and [`Self::query`] say so), as with kernel siw. `f` runs on the thread
    /// that found the error (a poster's, the library's, or the one reading soft-rdmad's messages), possibly
    /// while the library holds the session's data path: it must not call this library or block; hand the
    /// event on (a channel) instead. A later call replaces `f`.
    pub fn on_async_event(&self, f: impl Fn(QueuePairEvent) + Send + Sync + 'static) {
        let mut h = self.inner.qp_handlers.lock().expect("not poisoned");
        h.insert(self.id(), Arc::new(f));
    }
}
