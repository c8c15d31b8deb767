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
//!
//! A queue pair is used in two styles, on the same completion queues: verbs-style posting
//! ([`QueuePair::send`], [`QueuePair::write`], … with the caller's work-request ids; completions are polled
//! or awaited on the completion queue, which is also a [`Stream`]), for pipelines; and awaitable calls
//! ([`QueuePair::send_async`], [`QueuePair::write_async`], …), each resolving to its own request's
//! completion ([`PendingCompletion`]). What a peer needs to reach a region is a [`BufferDescriptor`]
//! ([`MemoryRegion::descriptor`]).

use std::future::Future;
use std::ops::RangeBounds;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use futures_core::Stream;

use super::borrowed::{BorrowedMemory, RegionBytes};
use super::completions::{CqState, PendingCompletion, RESERVED_IDS};
use super::data_path::QueuePairPath;
use super::descriptor::{BufferDescriptor, outside, window};
use super::{Adapter, Inner};
use crate::engine::ids::PdId;
use crate::engine::verbs::*;
use crate::error::{Error, NdStatus, Result};
use crate::rings::SpinConfig;
use crate::shm::SharedMemory;

/// Protection domains handed out by [`Adapter::protection_domain`] in this process (0 is every adapter's
/// default). Numbers only mean something within one session, so one counter for the process suffices.
static NEXT_PD: AtomicU32 = AtomicU32::new(1);

impl Adapter {
    /// A new protection domain (`ibv_alloc_pd`): regions registered in it (`*_in` below) are reached only
    /// through queue pairs created in it, by this process's requests and by peers' (RFC 5040 §7.2 "STag not
    /// associated with RDMAP stream"; siw `siw_check_mem`). Everything made without one is in the adapter's
    /// default domain ([`PdId::default`]). A domain is a number: it needs no closing, and one used with
    /// another adapter's session is just a domain of that session (no region of another session is ever
    /// reachable).
    pub fn protection_domain(&self) -> PdId {
        PdId(NEXT_PD.fetch_add(1, Ordering::Relaxed))
    }

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
        self.register_memory_in(PdId::default(), len, access).await
    }

    /// [`Self::register_memory`] in protection domain `pd` ([`Self::protection_domain`]).
    pub async fn register_memory_in(&self, pd: PdId, len: usize, access: Access) -> Result<MemoryRegion> {
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
            .register_memory(&self.inner, &memory, (access, pd))
            .await?;
        Ok(MemoryRegion {
            id,
            stag,
            access,
            memory: RegionBytes::Shared(memory),
            inner: self.inner.clone(),
        })
    }

    /// Registers `len` bytes of the application's own memory at `base`, in place: what rdma-core's
    /// `ibv_reg_mr_iova2` does (`infiniband/verbs.h`). A peer addresses byte `i` as tagged offset `iova + i`
    /// (C programs register with `iova` = the buffer's address and advertise that address with the STag);
    /// local SGEs stay offsets from `base`. In kernel-TCP mode the data path in this process reads and writes
    /// the bytes; when soft-rdmad runs the queue pairs (XDP mode) it reaches them in this process through
    /// `/proc/<pid>/mem` (`proc(5)`). Errors as [`Self::register_memory`], and
    /// INVALID_PARAMETER for an empty buffer or one whose tagged offsets would wrap.
    ///
    /// # Safety
    /// `base..base + len` must be readable and writable memory of this process and stay so until the
    /// returned region is dropped (deregistered), and requests that name it have completed.
    pub async unsafe fn register_borrowed_memory(
        &self,
        base: std::ptr::NonNull<u8>,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MemoryRegion> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.register_borrowed_memory_in(PdId::default(), base, len, iova, access) }.await
    }

    /// [`Self::register_borrowed_memory`] in protection domain `pd` ([`Self::protection_domain`]).
    ///
    /// # Safety
    /// As [`Self::register_borrowed_memory`].
    pub async unsafe fn register_borrowed_memory_in(
        &self,
        pd: PdId,
        base: std::ptr::NonNull<u8>,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MemoryRegion> {
        if !access.is_valid() {
            return Err(Error::new(
                NdStatus::InvalidParameter,
                format!("unknown access bits {:#x}", access.0),
            ));
        }
        self.inner.check_alive()?;
        // SAFETY: the caller's contract, passed on.
        let memory = unsafe { BorrowedMemory::new(base, len) };
        let (id, stag) = self
            .inner
            .data_path
            .register_borrowed_memory(&self.inner, &memory, iova, (access, pd))
            .await?;
        Ok(MemoryRegion {
            id,
            stag,
            access,
            memory: RegionBytes::Borrowed(memory),
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
        let state = Arc::new(CqState::new(ring));
        self.inner
            .cqs
            .lock()
            .expect("not poisoned")
            .insert(id, state.clone());
        Ok(CompletionQueue {
            id,
            state,
            inner: self.inner.clone(),
            streaming: Mutex::new(None),
            polled_empty: AtomicU64::new(0),
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
        self.create_queue_pair_in(PdId::default(), send_cq, receive_cq, send_depth, receive_depth)
            .await
    }

    /// [`Self::create_queue_pair`] in protection domain `pd` ([`Self::protection_domain`]): it reaches only
    /// regions of `pd`, for its own requests' SGEs and for its peer's tagged accesses.
    pub async fn create_queue_pair_in(
        &self,
        pd: PdId,
        send_cq: &CompletionQueue,
        receive_cq: &CompletionQueue,
        send_depth: u32,
        receive_depth: u32,
    ) -> Result<QueuePair> {
        self.inner.check_alive()?;
        QueuePair::create(self, pd, send_cq, receive_cq, send_depth, receive_depth, None).await
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
    memory: RegionBytes,
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
        self.memory.len() == 0
    }

    /// `length` bytes at `offset`, for a local work request (unchecked: a request past the region's end
    /// completes with ACCESS_VIOLATION). [`Self::slice`] checks, and takes a range.
    pub fn sge(&self, offset: u64, length: u32) -> Sge {
        Sge {
            stag: self.stag,
            offset,
            length,
        }
    }

    /// The bytes `range` of this region as an SGE for a local work request, checked here: ACCESS_VIOLATION
    /// when the range is not inside the region, INVALID_PARAMETER when it holds 4 GiB or more (an SGE's
    /// length is 32 bits).
    ///
    /// ```no_run
    /// # async fn f(adapter: soft_rdma::client::Adapter) -> soft_rdma::Result<()> {
    /// let mr = adapter.register_memory(4096, soft_rdma::client::Access::LOCAL_WRITE).await?;
    /// let head = mr.slice(..1024)?; // bytes 0..1024
    /// let tail = mr.slice(1024..)?; // bytes 1024..4096
    /// assert!(mr.slice(4000..4100).is_err());
    /// # Ok(()) }
    /// ```
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<Sge> {
        let len = self.len() as u64;
        let (start, end) =
            window(&range, len).ok_or_else(|| outside(&range, format_args!("this {len}-byte region")))?;
        let length = u32::try_from(end - start).map_err(|_| {
            Error::new(
                NdStatus::InvalidParameter,
                format!(
                    "an SGE holds at most {} bytes, not {}: split the transfer",
                    u32::MAX,
                    end - start
                ),
            )
        })?;
        Ok(self.sge(start, length))
    }

    /// What a peer needs to read or write this region at `offset` (tagged offsets are byte offsets).
    pub fn remote(&self, offset: u64) -> RemoteBuffer {
        RemoteBuffer {
            stag: self.stag,
            offset,
        }
    }

    /// The bytes `range` of this region as the peer is to see them: the window's start, length, and the
    /// remote access this region was registered with. Send its [`BufferDescriptor::to_bytes`] in an
    /// Accept's or Connect's private data, or in a Send. ACCESS_VIOLATION when the range is not inside the
    /// region, or when the region allows a peer neither REMOTE_READ nor REMOTE_WRITE.
    ///
    /// ```no_run
    /// # async fn f(adapter: soft_rdma::client::Adapter, connector: soft_rdma::client::Connector, qp: soft_rdma::client::QueuePair) -> soft_rdma::Result<()> {
    /// use soft_rdma::client::{Access, ReadLimits};
    /// let mr = adapter.register_memory(1 << 20, Access::REMOTE_READ | Access::REMOTE_WRITE).await?;
    /// let window = mr.descriptor(..)?; // all of it
    /// connector.accept_qp(&qp, ReadLimits::new(4, 4), &window.to_bytes()).await?;
    /// # Ok(()) }
    /// ```
    pub fn descriptor(&self, range: impl RangeBounds<usize>) -> Result<BufferDescriptor> {
        let len = self.len() as u64;
        let (start, end) =
            window(&range, len).ok_or_else(|| outside(&range, format_args!("this {len}-byte region")))?;
        let access = Access(self.access.0 & BufferDescriptor::ACCESS.0);
        if access == Access(0) {
            return Err(Error::new(
                NdStatus::AccessViolation,
                "this region was registered without REMOTE_READ or REMOTE_WRITE, so a peer could do \
                 nothing with it: register it with the access the peer needs",
            ));
        }
        Ok(BufferDescriptor::new(self.remote(start), end - start, access)?)
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
/// `DataOverrun`, `RemoteError`, `InvalidParameter` or `InsufficientResources` (queue full). The
/// requests of awaitable calls ([`QueuePair::write_async`], …) are the exception: each completes to its
/// own call, never here.
///
/// It is also a [`Stream`] of completions (`futures_core::Stream`: `StreamExt` from `futures` or
/// `tokio-stream` adds `next`, `take`, `for_each`, …; the inherent [`Self::next`] shadows theirs and says why
/// it failed). The stream ends when the queue can deliver nothing more: soft-rdmad went away
/// (DEVICE_REMOVED) or its ring is malformed, which [`Self::wait`] and [`Self::next`] report.
pub struct CompletionQueue {
    id: CompletionQueueId,
    state: Arc<CqState>,
    inner: Arc<Inner>,
    /// The wait the stream is in between two polls (the lock is never contended: polling takes `&mut`).
    streaming: Mutex<Option<Waiting>>,
    /// The last poll found nothing, and nothing was taken since (1 + the queue's count of takes then; 0:
    /// no such poll): the next empty one is a spin, and serves the connections.
    polled_empty: AtomicU64,
}

/// A [`CompletionQueue::wait`] that outlives the poll that started it.
type Waiting = Pin<Box<dyn Future<Output = Result<Vec<Completion>>> + Send>>;

impl CompletionQueue {
    pub fn id(&self) -> CompletionQueueId {
        self.id
    }

    /// Whether a successful completion of `qp` is delivered and not yet polled (in XDP mode, whether the
    /// queue's ring holds any completion): what a program has still to take from a connection that ended.
    /// rdma-core's rdma_cm reports a peer's disconnect only after what the peer sent before it; the drop-in
    /// rdma_cm uses this to keep that order for programs that handle the event before they poll.
    pub fn holds_delivered(&self, qp: QueuePairId) -> bool {
        self.state.holds_delivered(qp)
    }

    /// IND2CompletionQueue::GetResults: up to `max` completions already delivered; never waits.
    ///
    /// In kernel-TCP mode, a poll that finds the queue empty right after a poll that found it empty (a
    /// program spinning on `poll`) first serves the session's connections once on the calling thread (reads
    /// what arrived, writes what waits), so that it makes its own progress instead of holding the CPU from
    /// the thread that would. A single poll before a wait costs nothing more.
    pub fn poll(&self, max: usize) -> Vec<Completion> {
        let got = self.state.poll(self.id, max);
        if !got.is_empty() || max == 0 {
            return got;
        }
        let mark = self.state.takes.load(Ordering::Relaxed) + 1;
        if self.polled_empty.swap(mark, Ordering::Relaxed) != mark {
            return got;
        }
        self.inner.data_path.serve_from_poll(&self.inner);
        self.state.poll(self.id, max)
    }

    /// Waits for at least one completion and returns up to `max` (IND2CompletionQueue::Notify +
    /// GetResults). DEVICE_REMOVED when the daemon goes away with nothing left to return; a daemon-run
    /// queue sleeps on its completion doorbell (after telling soft-rdmad, which rings it only then).
    pub async fn wait(&self, max: usize) -> Result<Vec<Completion>> {
        self.state.wait(&self.inner, self.id, max).await
    }

    /// Whether soft-rdmad makes this queue's completions (XDP mode, `--data-path daemon`: they come through
    /// its shared ring), rather than this process (kernel-TCP mode). A program that spins on [`Self::poll`]
    /// makes progress itself in the second case, and only holds the CPU from soft-rdmad in the first.
    pub fn completed_by_daemon(&self) -> bool {
        self.state.ring.is_some()
    }

    /// Waits until a completion is there for [`Self::poll`], without taking it: what a completion channel
    /// needs (rdma-core `ibv_req_notify_cq` + `ibv_get_cq_event`, `infiniband/verbs.h`). Returns at once when
    /// one is queued already. DEVICE_REMOVED when soft-rdmad goes away with nothing queued.
    pub async fn ready(&self) -> Result<()> {
        self.state.ready(&self.inner, self.id, false).await
    }

    /// Blocks the calling thread, at most `timeout`, until a completion may be there for [`Self::poll`] on a
    /// daemon-run queue ([`Self::completed_by_daemon`]), sleeping on the queue's doorbell in this thread:
    /// what a C program's poll loop needs between empty polls (the drop-in `ibv_poll_cq`). Ok(false) when it
    /// could not (a queue completed in this process, or a task of this session waits on the same queue):
    /// wait with [`Self::ready`] instead. Never call it on a runtime's thread.
    pub fn nap(&self, timeout: std::time::Duration) -> Result<bool> {
        self.state.nap(self.id, timeout)
    }

    /// Arms the queue for one notification (rdma-core `ibv_req_notify_cq`, `infiniband/verbs.h`): `notify` is
    /// called once when a completion is there to poll, or when soft-rdmad goes away. A queue completed in
    /// this process calls it from the thread that delivers the next completion (the ones queued already do
    /// not count, as on siw: arm, then poll until empty, then wait); a daemon-run one from a task on the
    /// runtime the adapter was opened on, at once if a completion is queued already (a program polls after
    /// arming, so an early notification costs it one empty poll and loses nothing). `solicited_only`: only when a Receive of a
    /// solicited Send, or a failed request, is there. Callable from any thread, inside a runtime or not;
    /// INVALID_PARAMETER when the adapter was opened outside a runtime it could spawn on.
    pub fn request_notification(
        &self,
        solicited_only: bool,
        notify: Arc<dyn Fn() + Send + Sync>,
    ) -> Result<()> {
        if self.state.ring.is_none() {
            // Completed in this process: the push that delivers the completion calls `notify` itself.
            self.state.arm(solicited_only, notify);
            return Ok(());
        }
        let Some(runtime) = &self.inner.runtime else {
            return Err(Error::new(
                NdStatus::InvalidParameter,
                "this adapter was opened outside a tokio runtime: nothing can wait for its completions",
            ));
        };
        let (state, inner, id) = (self.state.clone(), self.inner.clone(), self.id);
        runtime.spawn(async move {
            let _ = state.ready(&inner, id, solicited_only).await;
            notify();
        });
        Ok(())
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

impl Stream for CompletionQueue {
    type Item = Completion;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Completion>> {
        let this = self.get_mut();
        let waiting = this.streaming.get_mut().expect("not poisoned");
        if waiting.is_none() {
            if let Some(c) = this.state.poll(this.id, 1).pop() {
                return Poll::Ready(Some(c));
            }
            let (state, inner, id) = (this.state.clone(), this.inner.clone(), this.id);
            *waiting = Some(Box::pin(async move { state.wait(&inner, id, 1).await }));
        }
        let got = ready!(waiting.as_mut().expect("set above").as_mut().poll(cx));
        *waiting = None;
        Poll::Ready(got.ok().and_then(|mut c| c.pop()))
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
/// [`super::Connector::accept_qp`]; once connected, its requests go to the peer. Dropping it flushes what
/// is outstanding with CANCELED and disconnects its connection.
///
/// Two styles, on the same completion queues, which may be mixed:
///
/// - **Awaitable**: [`Self::send_async`], [`Self::write_async`], [`Self::read_async`],
///   [`Self::receive_async`] post one request and return its [`PendingCompletion`], which resolves to that
///   request's completion (an error with its status if it failed). The remote side of a Write or Read is a
///   [`BufferDescriptor`], checked before anything is posted.
///
///   ```no_run
///   # async fn f(qp: soft_rdma::client::QueuePair, mr: soft_rdma::client::MemoryRegion, remote: soft_rdma::client::BufferDescriptor) -> soft_rdma::Result<()> {
///   qp.write_async(&[mr.slice(..4096)?], remote).await?;
///   let back = qp.read_async(mr.slice(4096..8192)?, remote).await?;
///   assert_eq!(back.bytes, 4096);
///   # Ok(()) }
///   ```
///
/// - **Verbs-style posting**, for pipelines: [`Self::send`], [`Self::write`], [`Self::read`],
///   [`Self::receive`] (and [`Self::post`] for a batch) return at once; each request completes on its
///   completion queue with the caller's work-request id. Ids from 2^63 up are the awaitable calls'.
///
/// Receives may be posted at any time, and must be before the peer can send (before `accept_qp` on the
/// accepting side: iWARP has no receiver-not-ready retry). Sends, Writes and Reads are for a connected
/// queue pair: once `complete_connect` (connecting side) or `accept_qp` (accepting side) returned; before,
/// they are refused at once with CONNECTION_INVALID, as NetworkDirect and verbs refuse them.
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
    pub(super) inner: Arc<Inner>,
    /// Where its work requests go.
    path: QueuePairPath,
    /// Where its send-side requests and its Receives complete (awaitable calls wait there).
    send_cq: (CompletionQueueId, Arc<CqState>),
    receive_cq: (CompletionQueueId, Arc<CqState>),
    established: Established,
}

impl QueuePair {
    /// A queue pair with these queues, on `srq` if given (`Adapter::create_queue_pair_on_srq`).
    pub(super) async fn create(
        adapter: &Adapter,
        pd: PdId,
        send_cq: &CompletionQueue,
        receive_cq: &CompletionQueue,
        send_depth: u32,
        receive_depth: u32,
        srq: Option<crate::engine::srq::SharedReceiveQueueId>,
    ) -> Result<QueuePair> {
        let info = adapter.info();
        let config = QueuePairConfig {
            send_cq: send_cq.id,
            receive_cq: receive_cq.id,
            send_depth,
            receive_depth,
            max_send_sge: info.max_send_sge,
            max_receive_sge: info.max_receive_sge,
            pd,
        };
        let inner = &adapter.inner;
        let (id, path) = inner
            .data_path
            .create_queue_pair(inner, config, srq, &send_cq.state, &receive_cq.state)
            .await?;
        Ok(QueuePair {
            id,
            inner: inner.clone(),
            path,
            send_cq: (send_cq.id, send_cq.state.clone()),
            receive_cq: (receive_cq.id, receive_cq.state.clone()),
            established: Established::default(),
        })
    }
}

/// Whether a queue pair's connection was established (set by the connector once `complete_connect` or
/// `accept_qp` returned; it stays set after the connection ends, when requests are flushed instead).
#[derive(Clone, Debug, Default)]
pub(super) struct Established(Arc<AtomicBool>);

impl Established {
    pub(super) fn set(&self) {
        self.0.store(true, Ordering::Release);
    }

    fn get(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

impl QueuePair {
    pub fn id(&self) -> QueuePairId {
        self.id
    }

    /// What the connector this queue pair is given to sets once the connection is established.
    pub(super) fn established(&self) -> &Established {
        &self.established
    }

    /// Posts work requests in order; never waits. Refused at once, with nothing of the batch posted:
    /// INVALID_PARAMETER for an id from 2^63 up (the awaitable calls'), CONNECTION_INVALID for a Send,
    /// Write or Read before the queue pair is connected, DEVICE_REMOVED once the daemon is gone. Every
    /// other problem comes back as a completion. Daemon-run: each request is written into the queue pair's
    /// ring (soft-rdmad's doorbell is rung only when it sleeps); a request the ring cannot take (full:
    /// INSUFFICIENT_RESOURCES; past the SGE or length bounds: INVALID_PARAMETER) completes here at once
    /// with that status, so that every request completes exactly once.
    pub fn post(&self, requests: Vec<WorkRequest>) -> Result<()> {
        for wr in &requests {
            if RESERVED_IDS.contains(&wr.id()) {
                return Err(Error::new(
                    NdStatus::InvalidParameter,
                    format!(
                        "work-request id {:#x} is from 2^63 up, where the awaitable calls' ids are: \
                         use ids below 2^63",
                        wr.id()
                    ),
                ));
            }
            self.check_connected(wr)?;
        }
        self.path.post(&self.inner, self.id, requests)
    }

    /// CONNECTION_INVALID for a Send, Write or Read on a queue pair not yet connected.
    fn check_connected(&self, wr: &WorkRequest) -> Result<()> {
        if matches!(wr, WorkRequest::Receive { .. }) || self.established.get() {
            return Ok(());
        }
        Err(Error::new(
            NdStatus::ConnectionInvalid,
            format!(
                "queue pair {} is not connected yet: post Sends, Writes and Reads once complete_connect \
                 (the connecting side) or accept_qp (the accepting side) has returned; only Receives may \
                 be posted before",
                self.id.0
            ),
        ))
    }

    /// Posts what `request` makes of an id reserved on the queue its completion goes to (the receive queue's
    /// for a Receive), and returns the wait for that completion.
    fn post_awaited(&self, op: CompletionOp, request: impl FnOnce(u64) -> WorkRequest) -> PendingCompletion {
        let (cq, state) = match op {
            CompletionOp::Receive => &self.receive_cq,
            _ => &self.send_cq,
        };
        let (id, rx) = match state.reserve() {
            Ok(reserved) => reserved,
            Err(e) => return PendingCompletion::refused(e),
        };
        let wr = request(id);
        let posted = self
            .check_connected(&wr)
            .and_then(|()| self.path.post(&self.inner, self.id, vec![wr]));
        match posted {
            Ok(()) => PendingCompletion::waiting(state.clone(), *cq, rx),
            Err(e) => {
                state.unreserve(id);
                PendingCompletion::refused(e)
            }
        }
    }

    /// Sends the gathered `sgl` (RDMAP Send) and resolves to its completion: awaitable [`Self::send`].
    pub fn send_async(&self, sgl: &[Sge]) -> PendingCompletion {
        self.post_awaited(CompletionOp::Send, |id| WorkRequest::Send {
            id,
            sgl: sgl.to_vec(),
            solicited: false,
            invalidate: None,
            silent: false,
        })
    }

    /// RDMA-Writes the gathered `sgl` at the start of the peer's window `remote` and resolves to its
    /// completion: awaitable [`Self::write`]. Refused before anything is posted (ACCESS_VIOLATION) when the
    /// bytes do not fit the window or the peer did not grant REMOTE_WRITE; [`BufferDescriptor::slice`]
    /// picks a place inside the window.
    pub fn write_async(&self, sgl: &[Sge], remote: BufferDescriptor) -> PendingCompletion {
        let bytes = sgl.iter().map(|s| u64::from(s.length)).sum();
        let remote = match remote.target("RDMA Write", bytes, Access::REMOTE_WRITE) {
            Ok(remote) => remote,
            Err(e) => return PendingCompletion::refused(e),
        };
        self.post_awaited(CompletionOp::Write, |id| WorkRequest::Write {
            id,
            sgl: sgl.to_vec(),
            remote,
            silent: false,
        })
    }

    /// RDMA-Reads `sink.length` bytes from the start of the peer's window `remote` into `sink` (which needs
    /// LOCAL_WRITE) and resolves to its completion: awaitable [`Self::read`]. Refused before anything is
    /// posted (ACCESS_VIOLATION) when the bytes are not all in the window or the peer did not grant
    /// REMOTE_READ.
    pub fn read_async(&self, sink: Sge, remote: BufferDescriptor) -> PendingCompletion {
        let remote = match remote.target("RDMA Read", u64::from(sink.length), Access::REMOTE_READ) {
            Ok(remote) => remote,
            Err(e) => return PendingCompletion::refused(e),
        };
        self.post_awaited(CompletionOp::Read, |id| WorkRequest::Read {
            id,
            sink,
            remote,
            silent: false,
        })
    }

    /// Posts a receive buffer for one incoming Send (the regions need LOCAL_WRITE) and resolves to its
    /// completion, whose `bytes` say how much arrived: awaitable [`Self::receive`]. Posted by this call:
    /// take it before `accept_qp`, await it after.
    ///
    /// ```no_run
    /// # async fn f(connector: soft_rdma::client::Connector, qp: soft_rdma::client::QueuePair, inbox: soft_rdma::client::MemoryRegion) -> soft_rdma::Result<()> {
    /// let message = qp.receive_async(&[inbox.slice(..)?]); // ready for the peer's first Send
    /// connector.accept_qp(&qp, soft_rdma::client::ReadLimits::new(4, 4), b"").await?;
    /// let got = message.await?;
    /// println!("{:?}", inbox.to_vec(0, got.bytes as usize)?);
    /// # Ok(()) }
    /// ```
    pub fn receive_async(&self, sgl: &[Sge]) -> PendingCompletion {
        self.post_awaited(CompletionOp::Receive, |id| WorkRequest::Receive {
            id,
            sgl: sgl.to_vec(),
        })
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
        self.inner.forget_queue_pair_events(self.id);
        self.path.close(&self.inner, self.id);
    }
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair").field("id", &self.id.0).finish()
    }
}
