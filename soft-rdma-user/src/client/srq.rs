//! Shared receive queues in the client library ([`SharedReceiveQueue`], the engine's
//! [`crate::engine::srq`]): one queue of Receives that every queue pair created on it
//! ([`Adapter::create_queue_pair_on_srq`]) takes its inbound Sends' buffers from, its limit and the event
//! when the limit is reached. Kernel-TCP mode only for now: the queues live in the session's in-process
//! data path; when soft-rdmad runs the data path (XDP mode) creation is refused
//! ([`Adapter::supports_shared_receive_queues`]).

use std::sync::Arc;

use super::data::{CompletionQueue, QueuePair};
use super::data_path::SessionDataPath;
use super::in_process::InProcessDataPath;
use super::{Adapter, Inner};
use crate::engine::srq::{SharedReceiveQueueId, SrqConfig, SrqStatus};
use crate::engine::verbs::Sge;
use crate::error::{Error, NdStatus, Result};

/// A shared receive queue (`ibv_create_srq(3)`). Receives posted here are taken, in order, by the Sends that
/// reach any queue pair created on it; each completes on that queue pair's receive completion queue.
/// Dropping it destroys it (its Receives are dropped uncompleted); [`Self::close`] says whether that was
/// possible.
pub struct SharedReceiveQueue {
    id: SharedReceiveQueueId,
    inner: Arc<Inner>,
    path: Arc<InProcessDataPath>,
    closed: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedReceiveQueue")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// Why shared receive queues are not offered when soft-rdmad runs the data path.
fn daemon_run() -> Error {
    Error::new(
        NdStatus::InvalidParameter,
        "shared receive queues run only in kernel-TCP mode for now: this soft-rdmad runs the data path \
         itself (XDP mode, --data-path daemon); run it in kernel-TCP mode to use them",
    )
}

impl Adapter {
    /// Whether this session can create shared receive queues (its data path runs in this process).
    pub fn supports_shared_receive_queues(&self) -> bool {
        matches!(self.inner.data_path, SessionDataPath::InProcess { .. })
    }

    /// Creates a shared receive queue of `depth` Receives of up to `max_sge` SGEs, its limit armed at
    /// `limit` (0: disarmed). The engine's rules apply (`DataPath::create_srq`, as siw's).
    pub async fn create_shared_receive_queue(
        &self,
        depth: u32,
        max_sge: u32,
        limit: u32,
    ) -> Result<SharedReceiveQueue> {
        self.inner.check_alive()?;
        let SessionDataPath::InProcess { path, .. } = &self.inner.data_path else {
            return Err(daemon_run());
        };
        let config = SrqConfig {
            depth,
            max_sge,
            limit,
        };
        let id = path.with(&self.inner, |dp, session| dp.create_srq(session, config))?;
        Ok(SharedReceiveQueue {
            id,
            inner: self.inner.clone(),
            path: path.clone(),
            closed: Default::default(),
        })
    }

    /// A queue pair whose Sends take their Receives from `srq` (it has no receive queue of its own: its
    /// [`QueuePair::receive`] is refused); send-side requests complete on `send_cq`, Receives on
    /// `receive_cq`.
    pub async fn create_queue_pair_on_srq(
        &self,
        send_cq: &CompletionQueue,
        receive_cq: &CompletionQueue,
        send_depth: u32,
        srq: &SharedReceiveQueue,
    ) -> Result<QueuePair> {
        self.inner.check_alive()?;
        QueuePair::create(self, send_cq, receive_cq, send_depth, 0, Some(srq.id)).await
    }
}

impl SharedReceiveQueue {
    pub fn id(&self) -> SharedReceiveQueueId {
        self.id
    }

    /// Posts Receives (`(wr_id, buffers)`) in order. The first one refused stops the post:
    /// `Err((its index, why))`, those before it posted (`ibv_post_srq_recv(3)`'s `bad_wr`).
    pub fn post(&self, requests: Vec<(u64, Vec<Sge>)>) -> std::result::Result<(), (usize, Error)> {
        self.inner.check_alive().map_err(|e| (0, e))?;
        self.path
            .with(&self.inner, |dp, session| dp.post_srq(session, self.id, requests))
    }

    /// Posts one Receive.
    pub fn receive(&self, wr_id: u64, sgl: &[Sge]) -> Result<()> {
        self.post(vec![(wr_id, sgl.to_vec())]).map_err(|(_, e)| e)
    }

    /// Arms the limit at `limit` Receives, or disarms it with 0 (INVALID_PARAMETER above the depth).
    pub fn set_limit(&self, limit: u32) -> Result<()> {
        self.path
            .with(&self.inner, |dp, session| dp.modify_srq(session, self.id, limit))
    }

    /// Its depth, SGEs, armed limit and Receives posted.
    pub fn query(&self) -> Result<SrqStatus> {
        self.inner.check_alive()?;
        self.path
            .with(&self.inner, |dp, session| dp.query_srq(session, self.id))
    }

    /// `f` is called (on the thread that placed the Send, outside the data path's lock) each time the
    /// armed limit is reached; the limit is then disarmed until [`Self::set_limit`] arms it again.
    pub fn on_limit_reached(&self, f: impl Fn() + Send + Sync + 'static) {
        self.path.set_srq_handler(self.id, Some(Arc::new(f)));
    }

    /// Destroys it: SHARING_VIOLATION while a queue pair created on it lives.
    pub fn close(&self) -> Result<()> {
        self.path
            .with(&self.inner, |dp, session| dp.close_srq(session, self.id))?;
        self.closed.store(true, std::sync::atomic::Ordering::Release);
        self.path.set_srq_handler(self.id, None);
        Ok(())
    }
}

impl Drop for SharedReceiveQueue {
    fn drop(&mut self) {
        if !self.closed.load(std::sync::atomic::Ordering::Acquire) {
            let _ = self.close();
        }
    }
}
