//! The objects an application holds on the data path: registered memory ([`MemoryRegion`], a memfd this
//! process maps, and soft-rdmad too when it runs the queue pairs), completion queues ([`CompletionQueue`])
//! and queue pairs ([`QueuePair`]).
//!
//! Each operation is one call into the session's data path ([`super::data_path`]), whichever it is: in
//! kernel-TCP mode the objects live in this process ([`super::in_process`]) and a queue pair runs on the
//! socket soft-rdmad handed over; when soft-rdmad runs the queue pairs (XDP mode, `--data-path daemon`),
//! work requests are written into the queue pair's shared rings ([`super::daemon_rings`]) and completions
//! read from the completion queue's ring, with a doorbell rung only when the other side sleeps. Posting
//! never waits for the daemon. One completion-queue type serves both ([`super::completions`]). One-sided
//! operations (RDMA Write into, or RDMA Read from, a region) need no call: whoever runs the queue pair
//! serves them from the region's mapping.

use std::sync::Arc;

use super::completions::CqState;
use super::data_path::QueuePairPath;
use super::{Adapter, Inner};
use crate::engine::verbs::*;
use crate::error::{Error, NdStatus, Result};
use crate::rings::SpinConfig;
use crate::shm::SharedMemory;

impl Adapter {
    /// IND2Adapter::CreateMemoryRegion + Register: `len` bytes of memory shared with the data path (with
    /// soft-rdmad when it runs the queue pairs). `access` says what the data path may do with it for this
    /// session (LOCAL_WRITE: Receives and Read sinks) and for peers (REMOTE_READ, REMOTE_WRITE).
    ///
    /// ```no_run
    /// # async fn f(adapter: soft_rdma::client::Adapter) -> soft_rdma::Result<()> {
    /// use soft_rdma::client::Access;
    /// let mr = adapter.register_memory(1 << 20, Access::LOCAL_WRITE | Access::REMOTE_WRITE).await?;
    /// mr.write_at(0, b"hello")?;
    /// println!("advertise STag {:#x} to the peer", mr.stag().0);
    /// # Ok(()) }
    /// ```
    pub async fn register_memory(&self, len: usize, access: Access) -> Result<MemoryRegion> {
        if !access.is_valid() {
            return Err(Error::new(
                NdStatus::InvalidParameter,
                format!("unknown access bits {:#x}", access.0),
            ));
        }
        self.inner.check_alive()?;
        let memory = SharedMemory::create("soft-rdma-region", len).map_err(|e| {
            Error::new(
                NdStatus::InsufficientResources,
                format!("cannot allocate {len} bytes of shared memory: {e}"),
            )
        })?;
        let memory = Arc::new(memory);
        let (id, stag) = self
            .inner
            .data_path
            .register_memory(&self.inner, &memory, access)
            .await?;
        Ok(MemoryRegion {
            id,
            stag,
            access,
            memory,
            inner: self.inner.clone(),
        })
    }

    /// IND2Adapter::CreateCompletionQueue.
    pub async fn create_completion_queue(&self, depth: u32) -> Result<CompletionQueue> {
        self.inner.check_alive()?;
        let (id, ring) = self
            .inner
            .data_path
            .create_completion_queue(&self.inner, depth)
            .await?;
        let state = Arc::new(CqState {
            ring,
            ..CqState::default()
        });
        self.inner
            .cqs
            .lock()
            .expect("not poisoned")
            .insert(id, state.clone());
        Ok(CompletionQueue {
            id,
            state,
            inner: self.inner.clone(),
        })
    }

    /// IND2Adapter::CreateQueuePair: send-side requests complete on `send_cq`, Receives on `receive_cq`
    /// (they may be the same). Up to the adapter's maximum SGEs per request.
    pub async fn create_queue_pair(
        &self,
        send_cq: &CompletionQueue,
        receive_cq: &CompletionQueue,
        send_depth: u32,
        receive_depth: u32,
    ) -> Result<QueuePair> {
        self.inner.check_alive()?;
        let info = self.info();
        let config = QueuePairConfig {
            send_cq: send_cq.id,
            receive_cq: receive_cq.id,
            send_depth,
            receive_depth,
            max_send_sge: info.max_send_sge,
            max_receive_sge: info.max_receive_sge,
        };
        let (id, path) = self
            .inner
            .data_path
            .create_queue_pair(&self.inner, config, &send_cq.state, &receive_cq.state)
            .await?;
        Ok(QueuePair {
            id,
            inner: self.inner.clone(),
            path,
        })
    }
}

/// Registered memory (IND2MemoryRegion). Dropping it deregisters it: its STag is refused from then on.
///
/// The bytes are shared with the data path and, through it, with peers that hold the STag: as with any RDMA
/// buffer, their contents change under one-sided operations, so they are accessed by copying
/// ([`Self::read_at`], [`Self::write_at`]), never through a Rust reference.
pub struct MemoryRegion {
    id: MemoryRegionId,
    stag: Stag,
    access: Access,
    memory: Arc<SharedMemory>,
    inner: Arc<Inner>,
}

fn bounds(e: std::io::Error) -> Error {
    Error::new(NdStatus::AccessViolation, e.to_string())
}

impl MemoryRegion {
    pub fn id(&self) -> MemoryRegionId {
        self.id
    }

    /// The STag: local requests name it in their SGEs; a peer needs it (and an offset) for one-sided access.
    pub fn stag(&self) -> Stag {
        self.stag
    }

    pub fn access(&self) -> Access {
        self.access
    }

    pub fn len(&self) -> usize {
        self.memory.len()
    }

    pub fn is_empty(&self) -> bool {
        self.memory.is_empty()
    }

    /// `length` bytes at `offset`, for a local work request.
    pub fn sge(&self, offset: u64, length: u32) -> Sge {
        Sge {
            stag: self.stag,
            offset,
            length,
        }
    }

    /// What a peer needs to read or write this region at `offset` (tagged offsets are byte offsets).
    pub fn remote(&self, offset: u64) -> RemoteBuffer {
        RemoteBuffer {
            stag: self.stag,
            offset,
        }
    }

    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.memory.read_at(offset, out).map_err(bounds)
    }

    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.memory.write_at(offset, data).map_err(bounds)
    }

    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<()> {
        self.memory.fill(offset, len, byte).map_err(bounds)
    }

    /// A copy of `len` bytes at `offset`.
    pub fn to_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
        let mut v = vec![0; len];
        self.read_at(offset, &mut v)?;
        Ok(v)
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        self.inner.data_path.deregister_memory(&self.inner, self.id);
    }
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("id", &self.id.0)
            .field("stag", &format_args!("{:#010x}", self.stag.0))
            .field("len", &self.len())
            .finish()
    }
}

/// A completion queue (IND2CompletionQueue). Every work request completes here exactly once, with its
/// status: `Success`, `Canceled` when flushed (disconnect, queue pair closed), `AccessViolation`,
/// `DataOverrun`, `RemoteError`, `InvalidParameter` or `InsufficientResources` (queue full).
pub struct CompletionQueue {
    id: CompletionQueueId,
    state: Arc<CqState>,
    inner: Arc<Inner>,
}

impl CompletionQueue {
    pub fn id(&self) -> CompletionQueueId {
        self.id
    }

    /// IND2CompletionQueue::GetResults: up to `max` completions already delivered; never waits.
    pub fn poll(&self, max: usize) -> Vec<Completion> {
        self.state.poll(self.id, max)
    }

    /// Waits for at least one completion and returns up to `max` (IND2CompletionQueue::Notify +
    /// GetResults). DEVICE_REMOVED when the daemon goes away with nothing left to return; a daemon-run
    /// queue sleeps on its completion doorbell (after telling soft-rdmad, which rings it only then).
    pub async fn wait(&self, max: usize) -> Result<Vec<Completion>> {
        self.state.wait(&self.inner, self.id, max).await
    }

    /// How long [`Self::wait`] polls a daemon-run queue's ring before it sleeps on the doorbell (and
    /// soft-rdmad has to ring it): off by default, which suits a machine with few cores; the spin blocks the
    /// waiting task's thread while it lasts. `$SOFT_RDMA_CQ_SPIN` sets it at creation. No effect in kernel
    /// mode, whose completions are delivered in this process.
    pub fn set_spin(&self, spin: SpinConfig) {
        self.state.set_spin(spin);
    }

    /// The next completion.
    pub async fn next(&self) -> Result<Completion> {
        Ok(self.wait(1).await?.remove(0))
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        self.inner.cqs.lock().expect("not poisoned").remove(&self.id);
        self.inner.data_path.close_completion_queue(&self.inner, self.id);
    }
}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionQueue").field("id", &self.id.0).finish()
    }
}

/// A queue pair (IND2QueuePair). Give it to [`super::Connector::connect_qp`] or
/// [`super::Connector::accept_qp`]; once connected, its requests go to the peer. Posting returns at once;
/// each request completes on its completion queue. Dropping it flushes what is outstanding with CANCELED
/// and disconnects its connection.
///
/// ```no_run
/// # async fn f(adapter: soft_rdma::client::Adapter, connector: soft_rdma::client::Connector) -> soft_rdma::Result<()> {
/// use soft_rdma::client::{Access, ReadLimits};
/// let cq = adapter.create_completion_queue(256).await?;
/// let qp = adapter.create_queue_pair(&cq, &cq, 64, 64).await?;
/// let mr = adapter.register_memory(4096, Access::LOCAL_WRITE).await?;
/// qp.receive(1, &[mr.sge(0, 4096)])?; // ready before the peer's first Send
/// connector.connect_qp(&qp, "10.0.0.2:7174".parse().unwrap(), ReadLimits { inbound: 4, outbound: 4 }, b"").await?;
/// connector.complete_connect().await?;
/// mr.write_at(0, b"ping")?;
/// qp.send(2, &[mr.sge(0, 4)])?;
/// let done = cq.next().await?;
/// assert_eq!(done.status, soft_rdma::NdStatus::Success);
/// # Ok(()) }
/// ```
pub struct QueuePair {
    id: QueuePairId,
    inner: Arc<Inner>,
    /// Where its work requests go.
    path: QueuePairPath,
}

impl QueuePair {
    pub fn id(&self) -> QueuePairId {
        self.id
    }

    /// Posts work requests in order; never waits. DEVICE_REMOVED once the daemon is gone; every other
    /// problem comes back as a completion. Daemon-run: each request is written into the queue pair's ring
    /// (soft-rdmad's doorbell is rung only when it sleeps); a request the ring cannot take (full:
    /// INSUFFICIENT_RESOURCES; past the SGE or length bounds: INVALID_PARAMETER) completes here at once
    /// with that status, so that every request completes exactly once.
    pub fn post(&self, requests: Vec<WorkRequest>) -> Result<()> {
        self.path.post(&self.inner, self.id, requests)
    }

    /// Send (RDMAP Send) of the gathered `sgl`.
    pub fn send(&self, id: u64, sgl: &[Sge]) -> Result<()> {
        self.send_with(id, sgl, false, None)
    }

    /// Send with Solicited Event and/or Invalidate (the peer's STag `invalidate` stops working).
    pub fn send_with(&self, id: u64, sgl: &[Sge], solicited: bool, invalidate: Option<Stag>) -> Result<()> {
        self.post(vec![WorkRequest::Send {
            id,
            sgl: sgl.to_vec(),
            solicited,
            invalidate,
            silent: false,
        }])
    }

    /// A Send that completes only if it fails (ND_OP_FLAG_SILENT_SUCCESS, verbs' unsignaled send: see
    /// [`WorkRequest::is_silent`]). A ping-pong then wakes once per message received, not once more for
    /// each message sent.
    pub fn send_silent(&self, id: u64, sgl: &[Sge]) -> Result<()> {
        self.post(vec![WorkRequest::Send {
            id,
            sgl: sgl.to_vec(),
            solicited: false,
            invalidate: None,
            silent: true,
        }])
    }

    /// RDMA Write of the gathered `sgl` into the peer's `remote` buffer.
    pub fn write(&self, id: u64, sgl: &[Sge], remote: RemoteBuffer) -> Result<()> {
        self.post(vec![WorkRequest::Write {
            id,
            sgl: sgl.to_vec(),
            remote,
            silent: false,
        }])
    }

    /// An RDMA Write that completes only if it fails (see [`QueuePair::send_silent`]).
    pub fn write_silent(&self, id: u64, sgl: &[Sge], remote: RemoteBuffer) -> Result<()> {
        self.post(vec![WorkRequest::Write {
            id,
            sgl: sgl.to_vec(),
            remote,
            silent: true,
        }])
    }

    /// RDMA Read of `sink.length` bytes from the peer's `remote` buffer into `sink` (which needs
    /// LOCAL_WRITE). At most the connection's outbound read limit are in flight; more wait their turn.
    pub fn read(&self, id: u64, sink: Sge, remote: RemoteBuffer) -> Result<()> {
        self.post(vec![WorkRequest::Read {
            id,
            sink,
            remote,
            silent: false,
        }])
    }

    /// A receive buffer for one incoming Send (the regions need LOCAL_WRITE).
    pub fn receive(&self, id: u64, sgl: &[Sge]) -> Result<()> {
        self.post(vec![WorkRequest::Receive {
            id,
            sgl: sgl.to_vec(),
        }])
    }

    /// State, Terminate reason (if the stream was terminated) and counters.
    pub async fn query(&self) -> Result<QueuePairStatus> {
        self.path.query(&self.inner, self.id).await
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        self.path.close(&self.inner, self.id);
    }
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair").field("id", &self.id.0).finish()
    }
}
