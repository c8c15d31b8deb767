//! Where a session's data path runs, chosen once from soft-rdmad's Welcome and held as a type, so that every
//! operation whose two ways differ is one call: [`SessionDataPath::InProcess`] in kernel-TCP mode, where
//! memory regions, completion queues and queue pairs live in this process and each connection runs on the
//! socket soft-rdmad hands over ([`super::in_process`]); [`SessionDataPath::DaemonRings`] when soft-rdmad
//! runs them (XDP mode, `--data-path daemon`) and this process posts and completes through their shared
//! rings ([`super::daemon_rings`]). Each queue pair holds its own side of the choice ([`QueuePairPath`]).
//!
//! The in-process path also tells soft-rdmad what `status` and the metrics show of it: soon after it changes
//! (reports are coalesced: creating thousands of queue pairs sends a handful), once a second while
//! connections run, and a closing queue pair's final counters at once (docs/metrics.md).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, oneshot};

use super::borrowed::BorrowedMemory;
use super::completions::{CqRing, CqState};
use super::daemon_rings::{self, QpRing};
use super::in_process::InProcessDataPath;
use super::{Inner, unexpected};
use crate::engine::ids::{Domain, PdId};
use crate::engine::memory::RegionMemory;
use crate::engine::requests::{AdapterInfo, CmResponse, ConnectorId, HandOff, SessionId};
use crate::engine::srq::SharedReceiveQueueId;
use crate::engine::verbs::{
    Access, CompletionQueueId, MemoryRegionId, QueuePairConfig, QueuePairId, QueuePairStatus, Stag,
    WorkRequest,
};
use crate::error::{Error, NdStatus, Result};
use crate::shm::SharedMemory;
use crate::uds::messages::{Request, Response};

/// Where a session's queue pairs run.
pub(super) enum SessionDataPath {
    /// Kernel-TCP mode: in this process, each connection on the socket soft-rdmad handed over.
    InProcess {
        path: Arc<InProcessDataPath>,
        /// The path changed since its last report to soft-rdmad, and the reporter's wake-up.
        report_due: AtomicBool,
        report_wake: Arc<Notify>,
    },
    /// In soft-rdmad: work requests go into the queue pairs' shared rings, completions come from the
    /// completion queues' rings.
    DaemonRings,
}

impl SessionDataPath {
    /// The data path soft-rdmad's Welcome chose: in this process when it hands connections over.
    pub(super) fn new(hand_off: bool, adapter: &AdapterInfo, session: SessionId) -> Self {
        if hand_off {
            Self::in_process(Arc::new(InProcessDataPath::new(adapter.clone(), session)))
        } else {
            Self::DaemonRings
        }
    }

    pub(super) fn in_process(path: Arc<InProcessDataPath>) -> Self {
        Self::InProcess {
            path,
            report_due: AtomicBool::new(false),
            report_wake: Arc::new(Notify::new()),
        }
    }

    /// The in-process path's reporter: what `status` shows of in-process objects is reported when they
    /// change (at most every 100 ms) and, for the counters, once a second while connections run.
    pub(super) fn spawn_reporter(&self, inner: &Arc<Inner>) {
        let Self::InProcess { report_wake, .. } = self else {
            return;
        };
        let weak = Arc::downgrade(inner);
        let wake = report_wake.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let changed = tokio::select! {
                    _ = wake.notified() => true,
                    _ = tick.tick() => false,
                };
                let Some(inner) = weak.upgrade() else { return };
                if inner.gone.load(Ordering::Acquire) {
                    return;
                }
                inner.data_path.report_if_due(&inner, changed);
                drop(inner);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
    }

    /// Sends the in-process path's report if it changed since the last one or, on the periodic tick
    /// (`changed` false), while connections run.
    fn report_if_due(&self, inner: &Inner, changed: bool) {
        let Self::InProcess { path, report_due, .. } = self else {
            return;
        };
        let due = report_due.swap(false, Ordering::AcqRel);
        if (due || (!changed && path.has_conns())) && !inner.gone.load(Ordering::Acquire) {
            for part in path.report() {
                inner.fire(part);
            }
        }
    }

    /// The in-process path's report now (none when soft-rdmad runs the data path).
    pub(super) fn report_parts(&self) -> Vec<Request> {
        match self {
            Self::InProcess { path, report_due, .. } => {
                report_due.store(false, Ordering::Release);
                path.report()
            }
            Self::DaemonRings => Vec::new(),
        }
    }

    /// The in-process path changed: its reporter tells soft-rdmad soon. Nothing to tell of the daemon's.
    pub(super) fn changed(&self) {
        if let Self::InProcess {
            report_due,
            report_wake,
            ..
        } = self
        {
            report_due.store(true, Ordering::Release);
            report_wake.notify_one();
        }
    }

    /// soft-rdmad went away: the in-process path ends every connection it runs.
    pub(super) fn device_removed(&self) {
        if let Self::InProcess { path, .. } = self {
            path.device_removed();
        }
    }

    /// Registers `memory` with `access`: its region and STag. The daemon-run path passes the memfd to
    /// soft-rdmad with the request.
    pub(super) async fn register_memory(
        &self,
        inner: &Inner,
        memory: &Arc<SharedMemory>,
        (access, pd): (Access, PdId),
    ) -> Result<(MemoryRegionId, Stag)> {
        match self {
            Self::InProcess { path, .. } => {
                self.register_in_process(inner, path, Box::new(memory.clone()), (access, pd), 0)
            }
            Self::DaemonRings => {
                let request = Request::RegisterMemory {
                    length: memory.len(),
                    access,
                    pd,
                };
                match inner.call_with(request, Some(memory.clone())).await? {
                    Response::MemoryRegion { region, stag } => Ok((region, stag)),
                    r => Err(unexpected("RegisterMemory", r)),
                }
            }
        }
    }

    /// Registers the application's own bytes (see `Adapter::register_borrowed_memory`): in process, the data
    /// path uses them in place; the daemon-run path names them by address, for soft-rdmad to reach in this
    /// process.
    pub(super) async fn register_borrowed_memory(
        &self,
        inner: &Inner,
        memory: &BorrowedMemory,
        iova: u64,
        (access, pd): (Access, PdId),
    ) -> Result<(MemoryRegionId, Stag)> {
        match self {
            Self::InProcess { path, .. } => {
                self.register_in_process(inner, path, Box::new(memory.clone()), (access, pd), iova)
            }
            Self::DaemonRings => {
                let request = Request::RegisterProcessMemory {
                    address: memory.address(),
                    length: memory.len() as u64,
                    iova,
                    access,
                    pd,
                };
                match inner.call(request).await? {
                    Response::MemoryRegion { region, stag } => Ok((region, stag)),
                    r => Err(unexpected("RegisterProcessMemory", r)),
                }
            }
        }
    }

    /// Registers `memory` with the data path in this process: its region and STag.
    fn register_in_process(
        &self,
        inner: &Inner,
        path: &InProcessDataPath,
        memory: Box<dyn RegionMemory>,
        (access, pd): (Access, PdId),
        iova: u64,
    ) -> Result<(MemoryRegionId, Stag)> {
        let r = path.with(inner, |dp, session| {
            dp.register_memory(Domain::new(session, pd), memory, access, iova)
        })?;
        let CmResponse::MemoryRegion { region, stag } = r else {
            return Err(Error::new(
                NdStatus::Unsuccessful,
                "unexpected answer to RegisterMemory",
            ));
        };
        self.changed();
        Ok((region, stag))
    }

    /// A poll found its completion queue empty: the in-process path serves its connections once, on the
    /// polling thread ([`InProcessDataPath::poll_pass`]). soft-rdmad serves its own.
    pub(super) fn serve_from_poll(&self, inner: &Inner) {
        if let Self::InProcess { path, .. } = self {
            path.poll_pass(inner);
        }
    }

    /// Whether connections run in this process now (kernel-TCP mode, at least one handed over).
    pub(super) fn has_local_connections(&self) -> bool {
        match self {
            Self::InProcess { path, .. } => path.has_conns(),
            Self::DaemonRings => false,
        }
    }

    /// [`super::Adapter::serve_until_readable`]: in kernel-TCP mode the calling thread serves the
    /// connections until `fd` is readable; soft-rdmad's rings have nothing to serve here.
    pub(super) fn serve_until_readable(
        &self,
        inner: &Inner,
        wake: (std::os::fd::RawFd, &dyn Fn() -> bool),
        timeout: std::time::Duration,
    ) -> std::io::Result<super::InlineWait> {
        match self {
            Self::InProcess { path, .. } => path.serve_until_readable(inner, wake, timeout),
            Self::DaemonRings => Ok(super::InlineWait::NothingToServe),
        }
    }

    pub(super) fn deregister_memory(&self, inner: &Inner, region: MemoryRegionId) {
        match self {
            Self::InProcess { path, .. } => {
                let _ = path.with(inner, |dp, session| dp.deregister_memory(session, region));
                self.changed();
            }
            Self::DaemonRings => inner.fire(Request::DeregisterMemory { region }),
        }
    }

    /// Creates a completion queue of `depth` entries; a daemon-run one comes with its ring (if the ring
    /// cannot be attached, soft-rdmad is told to close the queue).
    pub(super) async fn create_completion_queue(
        &self,
        inner: &Inner,
        depth: u32,
    ) -> Result<(CompletionQueueId, Option<CqRing>)> {
        match self {
            Self::InProcess { path, .. } => {
                match path.with(inner, |dp, session| dp.create_cq(session, depth))? {
                    CmResponse::CompletionQueue(id) => Ok((id, None)),
                    r => Err(unexpected("CreateCompletionQueue", r.into())),
                }
            }
            Self::DaemonRings => match inner.call(Request::CreateCompletionQueue { depth }).await? {
                Response::CompletionQueue(id) => {
                    match daemon_rings::attach_completion_queue(inner, id, depth) {
                        Ok(ring) => Ok((id, Some(ring))),
                        Err(e) => {
                            inner.fire(Request::CloseCompletionQueue { cq: id });
                            Err(e)
                        }
                    }
                }
                r => Err(unexpected("CreateCompletionQueue", r)),
            },
        }
    }

    pub(super) fn close_completion_queue(&self, inner: &Inner, cq: CompletionQueueId) {
        match self {
            Self::InProcess { path, .. } => {
                let _ = path.with(inner, |dp, session| dp.close_cq(session, cq));
            }
            Self::DaemonRings => inner.fire(Request::CloseCompletionQueue { cq }),
        }
    }

    /// Creates a queue pair as `config` says (on shared receive queue `srq` if given),
    /// whose requests complete on `send_cq` and `receive_cq`; a
    /// daemon-run one comes with its rings (if they cannot be attached, soft-rdmad is told to close it).
    pub(super) async fn create_queue_pair(
        &self,
        inner: &Inner,
        config: QueuePairConfig,
        srq: Option<SharedReceiveQueueId>,
        send_cq: &Arc<CqState>,
        receive_cq: &Arc<CqState>,
    ) -> Result<(QueuePairId, QueuePairPath)> {
        match self {
            Self::InProcess { path, .. } => {
                let r = path.with(inner, |dp, session| dp.create_qp_on(session, config, srq))?;
                self.changed();
                match r {
                    CmResponse::QueuePair(id) => Ok((id, QueuePairPath::InProcess(path.clone()))),
                    r => Err(unexpected("CreateQueuePair", r.into())),
                }
            }
            Self::DaemonRings => match inner.call(create_qp_request(config, srq)).await? {
                Response::QueuePair(id) => {
                    let ring = daemon_rings::attach_queue_pair(
                        inner,
                        id,
                        &config,
                        send_cq.clone(),
                        receive_cq.clone(),
                    );
                    match ring {
                        Ok(ring) => Ok((id, QueuePairPath::DaemonRings(Mutex::new(ring)))),
                        Err(e) => {
                            inner.fire(Request::CloseQueuePair { qp: id });
                            Err(e)
                        }
                    }
                }
                r => Err(unexpected("CreateQueuePair", r)),
            },
        }
    }

    /// Before a Connect or Accept carrying `qp` goes to soft-rdmad: the in-process path checks the queue
    /// pair and gives it to `connector` here (CONNECTION_ACTIVE if it is connected or given to another);
    /// soft-rdmad checks the queue pairs it runs itself.
    pub(super) fn give_queue_pair(
        &self,
        inner: &Inner,
        connector: ConnectorId,
        qp: Option<QueuePairId>,
    ) -> Result<()> {
        let (Self::InProcess { path, .. }, Some(qp)) = (self, qp) else {
            return Ok(());
        };
        path.with(inner, |dp, session| dp.give(session, qp, connector))
    }

    /// Takes over the connection soft-rdmad handed over with `h` (its socket came with the answer): the
    /// queue pair given to `connector` runs in this process from now on. Returns what the Accept waits
    /// for, if anything.
    pub(super) fn adopt(
        &self,
        inner: &Arc<Inner>,
        connector: ConnectorId,
        h: HandOff,
    ) -> Result<Option<oneshot::Receiver<Result<()>>>> {
        let fd = inner.handed.lock().expect("not poisoned").sockets.remove(&h.conn);
        let (Self::InProcess { path, .. }, Some(fd)) = (self, fd) else {
            return Err(Error::new(
                NdStatus::Unsuccessful,
                "soft-rdmad handed over a connection without its socket",
            ));
        };
        let r = path.adopt(inner, connector, h, fd);
        self.changed();
        r
    }

    /// Queue pair `qp`'s state, Terminate reason and counters, wherever it runs.
    pub(super) async fn query_queue_pair(&self, inner: &Inner, qp: QueuePairId) -> Result<QueuePairStatus> {
        match self {
            Self::InProcess { path, .. } => {
                inner.check_alive()?;
                path.with(inner, |dp, session| dp.qp_status(session, qp))
            }
            Self::DaemonRings => match inner.call(Request::QueryQueuePair { qp }).await? {
                Response::QueuePairInfo(s) => Ok(s),
                r => Err(unexpected("QueryQueuePair", r)),
            },
        }
    }

    /// Before soft-rdmad hears `connector`'s Disconnect: an in-process connection writes what was queued
    /// and its FIN first, so that they go out before soft-rdmad closes its copy of the socket.
    pub(super) async fn disconnect(&self, inner: &Inner, connector: ConnectorId) {
        if let Self::InProcess { path, .. } = self
            && path.has_conn(connector)
        {
            path.disconnect(inner, connector).await;
        }
    }

    /// `connector` was dropped: an in-process connection ends gracefully first, and its driver tells
    /// soft-rdmad after the FIN; otherwise soft-rdmad is told now.
    pub(super) fn close_connector(&self, inner: &Inner, connector: ConnectorId) {
        if let Self::InProcess { path, .. } = self
            && path.close_connector(inner, connector)
        {
            return;
        }
        inner.fire(Request::CloseConnector { connector });
    }
}

/// CreateQueuePair, or CreateQueuePairOnSrq for one on a shared receive queue.
fn create_qp_request(config: QueuePairConfig, srq: Option<SharedReceiveQueueId>) -> Request {
    match srq {
        Some(srq) => Request::CreateQueuePairOnSrq { config, srq },
        None => Request::CreateQueuePair { config },
    }
}

/// Where one queue pair's work requests go.
pub(super) enum QueuePairPath {
    /// Into the session's in-process data path.
    InProcess(Arc<InProcessDataPath>),
    /// Into the queue pair's shared rings, which soft-rdmad reads.
    DaemonRings(Mutex<QpRing>),
}

impl QueuePairPath {
    /// Posts work requests on queue pair `qp` in order; never waits. DEVICE_REMOVED once soft-rdmad is gone.
    pub(super) fn post(&self, inner: &Inner, qp: QueuePairId, requests: Vec<WorkRequest>) -> Result<()> {
        inner.check_alive()?;
        match self {
            Self::InProcess(path) => path.post(inner, qp, requests),
            Self::DaemonRings(ring) => ring.lock().expect("not poisoned").post(qp, requests),
        }
    }

    /// Queue pair `qp`'s state, Terminate reason and counters.
    pub(super) async fn query(&self, inner: &Inner, qp: QueuePairId) -> Result<QueuePairStatus> {
        inner.data_path.query_queue_pair(inner, qp).await
    }

    /// Queue pair `qp` was dropped: what is outstanding completes with CANCELED, and its connection ends.
    pub(super) fn close(&self, inner: &Inner, qp: QueuePairId) {
        match self {
            Self::InProcess(path) => {
                path.close_qp(inner, qp);
                inner.data_path.changed();
            }
            Self::DaemonRings(_) => inner.fire(Request::CloseQueuePair { qp }),
        }
    }
}
