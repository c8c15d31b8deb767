//! Shared receive queues in the client library ([`SharedReceiveQueue`], the engine's
//! [`crate::engine::srq`]): one queue of Receives that every queue pair created on it
//! ([`Adapter::create_queue_pair_on_srq`]) takes its inbound Sends' buffers from, its limit and the event
//! when the limit is reached. In kernel-TCP mode the queues live in the session's in-process data path; when
//! soft-rdmad runs the data path (XDP mode) each call is a request to it (protocol 10) and the limit event
//! comes as `Event::SrqLimitReached`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::data::{CompletionQueue, QueuePair};
use super::data_path::SessionDataPath;
use super::{Adapter, Inner, unexpected};
use crate::engine::ids::PdId;
pub use crate::engine::srq::SharedReceiveQueueId;
use crate::engine::srq::{SrqConfig, SrqStatus};
use crate::engine::verbs::Sge;
use crate::error::{Error, Result};
use crate::uds::messages::{Request, Response};

/// Called when a shared receive queue's armed limit is reached (IBV_EVENT_SRQ_LIMIT_REACHED).
pub(super) type SrqLimitHandler = Arc<dyn Fn() + Send + Sync>;

/// A shared receive queue (`ibv_create_srq(3)`). Receives posted here are taken, in order, by the Sends that
/// reach any queue pair created on it; each completes on that queue pair's receive completion queue.
/// Dropping it destroys it (its Receives are dropped uncompleted); [`Self::close`] says whether that was
/// possible.
pub struct SharedReceiveQueue {
    id: SharedReceiveQueueId,
    inner: Arc<Inner>,
    closed: AtomicBool,
}

impl std::fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedReceiveQueue")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Inner {
    /// Tells who asked ([`SharedReceiveQueue::on_limit_reached`]) that `srq`'s limit was reached.
    pub(super) fn srq_limit_reached(&self, srq: SharedReceiveQueueId) {
        let handler = self.srq_handlers.lock().expect("not poisoned").get(&srq).cloned();
        if let Some(f) = handler {
            f();
        }
    }

    /// One of the engine's shared-receive-queue requests, in this process or in soft-rdmad.
    async fn srq_request(&self, what: &str, request: Request) -> Result<Response> {
        self.check_alive()?;
        match &self.data_path {
            SessionDataPath::InProcess { path, .. } => {
                let r = path.with(self, |dp, session| dp.handle_request(session, request.into()))?;
                Ok(Response::from(r))
            }
            SessionDataPath::DaemonRings => self
                .call(request)
                .await
                .map_err(|e| Error::new(e.status, format!("{what}: {}", e.context))),
        }
    }
}

impl Adapter {
    /// Whether this session can create shared receive queues (both data paths can).
    pub fn supports_shared_receive_queues(&self) -> bool {
        true
    }

    /// Creates a shared receive queue of `depth` Receives of up to `max_sge` SGEs, its limit armed at
    /// `limit` (0: disarmed). The engine's rules apply (`DataPath::create_srq`, as siw's).
    pub async fn create_shared_receive_queue(
        &self,
        depth: u32,
        max_sge: u32,
        limit: u32,
    ) -> Result<SharedReceiveQueue> {
        let config = SrqConfig {
            depth,
            max_sge,
            limit,
        };
        let r = self
            .inner
            .srq_request(
                "CreateSharedReceiveQueue",
                Request::CreateSharedReceiveQueue { config },
            )
            .await?;
        let Response::SharedReceiveQueue(id) = r else {
            return Err(unexpected("CreateSharedReceiveQueue", r));
        };
        self.inner.data_path.changed();
        Ok(SharedReceiveQueue {
            id,
            inner: self.inner.clone(),
            closed: AtomicBool::new(false),
        })
    }

    /// A queue pair whose Sends take their Receives from `srq` (it has no receive queue of its own: its
    /// [`QueuePair::receive`] completes in error); send-side requests complete on `send_cq`, Receives on
    /// `receive_cq`.
    pub async fn create_queue_pair_on_srq(
        &self,
        send_cq: &CompletionQueue,
        receive_cq: &CompletionQueue,
        send_depth: u32,
        srq: &SharedReceiveQueue,
    ) -> Result<QueuePair> {
        self.create_queue_pair_on_srq_in(PdId::default(), send_cq, receive_cq, send_depth, srq)
            .await
    }

    /// [`Self::create_queue_pair_on_srq`] in protection domain `pd` ([`Self::protection_domain`]).
    pub async fn create_queue_pair_on_srq_in(
        &self,
        pd: PdId,
        send_cq: &CompletionQueue,
        receive_cq: &CompletionQueue,
        send_depth: u32,
        srq: &SharedReceiveQueue,
    ) -> Result<QueuePair> {
        self.inner.check_alive()?;
        QueuePair::create(self, pd, send_cq, receive_cq, send_depth, 0, Some(srq.id)).await
    }
}

impl SharedReceiveQueue {
    pub fn id(&self) -> SharedReceiveQueueId {
        self.id
    }

    /// Posts Receives (`(wr_id, buffers)`) in order. The first one refused stops the post:
    /// `Err((its index, why))`, those before it posted (`ibv_post_srq_recv(3)`'s `bad_wr`).
    pub async fn post(&self, requests: Vec<(u64, Vec<Sge>)>) -> std::result::Result<(), (usize, Error)> {
        let request = Request::PostSharedReceiveQueue {
            srq: self.id,
            receives: requests,
        };
        match self.inner.srq_request("PostSharedReceiveQueue", request).await {
            Ok(Response::SharedReceivesPosted { refused: None }) => Ok(()),
            Ok(Response::SharedReceivesPosted {
                refused: Some((i, e)),
            }) => Err((i as usize, e)),
            Ok(r) => Err((0, unexpected("PostSharedReceiveQueue", r))),
            Err(e) => Err((0, e)),
        }
    }

    /// Posts one Receive.
    pub async fn receive(&self, wr_id: u64, sgl: &[Sge]) -> Result<()> {
        self.post(vec![(wr_id, sgl.to_vec())]).await.map_err(|(_, e)| e)
    }

    /// Arms the limit at `limit` Receives, or disarms it with 0 (INVALID_PARAMETER above the depth).
    pub async fn set_limit(&self, limit: u32) -> Result<()> {
        let request = Request::ModifySharedReceiveQueue { srq: self.id, limit };
        match self
            .inner
            .srq_request("ModifySharedReceiveQueue", request)
            .await?
        {
            Response::Done => Ok(()),
            r => Err(unexpected("ModifySharedReceiveQueue", r)),
        }
    }

    /// Its depth, SGEs, limit (and whether it is armed) and Receives posted.
    pub async fn query(&self) -> Result<SrqStatus> {
        let request = Request::QuerySharedReceiveQueue { srq: self.id };
        match self.inner.srq_request("QuerySharedReceiveQueue", request).await? {
            Response::SharedReceiveQueueInfo(s) => Ok(s),
            r => Err(unexpected("QuerySharedReceiveQueue", r)),
        }
    }

    /// `f` is called (on the thread that placed the Send, or the one reading soft-rdmad's messages) each
    /// time the armed limit is reached; the limit is then disarmed until [`Self::set_limit`] arms it again.
    pub fn on_limit_reached(&self, f: impl Fn() + Send + Sync + 'static) {
        let mut h = self.inner.srq_handlers.lock().expect("not poisoned");
        h.insert(self.id, Arc::new(f));
    }

    /// Destroys it: SHARING_VIOLATION while a queue pair created on it lives (and is not in error).
    pub async fn close(&self) -> Result<()> {
        let request = Request::CloseSharedReceiveQueue { srq: self.id };
        match self.inner.srq_request("CloseSharedReceiveQueue", request).await? {
            Response::Done => {}
            r => return Err(unexpected("CloseSharedReceiveQueue", r)),
        }
        self.closed.store(true, Ordering::Release);
        self.forget();
        Ok(())
    }

    fn forget(&self) {
        self.inner
            .srq_handlers
            .lock()
            .expect("not poisoned")
            .remove(&self.id);
        self.inner.data_path.changed();
    }
}

impl Drop for SharedReceiveQueue {
    fn drop(&mut self) {
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        self.forget();
        let srq = self.id;
        match &self.inner.data_path {
            SessionDataPath::InProcess { path, .. } => {
                let _ = path.with(&self.inner, |dp, session| dp.close_srq(session, srq));
            }
            SessionDataPath::DaemonRings => self.inner.fire(Request::CloseSharedReceiveQueue { srq }),
        }
    }
}
