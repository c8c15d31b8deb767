//! This process's side of the queue pairs soft-rdmad runs (XDP mode, `--data-path daemon`): attaching the
//! shared rings whose descriptors soft-rdmad passes with a queue pair's or completion queue's answer, and
//! posting work requests into a queue pair's ring ([`QpRing`]). Completions are read from the completion
//! queue's ring by [`super::completions`]; the rings' layout and their untrusted-input checks are
//! `crate::rings`'.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::completions::{CqRing, CqState};
use super::{Inner, RingObject};
use crate::engine::verbs::{
    Completion, CompletionOp, CompletionQueueId, QueuePairConfig, QueuePairId, WorkRequest,
};
use crate::error::{Error, NdStatus, Result};
use crate::rings::doorbell::Doorbell;
use crate::rings::qp::{QpRingLayout, QpRingWriter};
use crate::shm::SharedMemory;

/// A daemon-run queue pair's rings.
pub(super) struct QpRing {
    writer: QpRingWriter,
    /// Rung when soft-rdmad sleeps.
    bell: Arc<Doorbell>,
    send_cq: Arc<CqState>,
    receive_cq: Arc<CqState>,
}

impl QpRing {
    /// Writes `requests` into the ring in order and publishes them, ringing soft-rdmad's doorbell only when
    /// it sleeps. A request the ring cannot take (full: INSUFFICIENT_RESOURCES; past the SGE or length
    /// bounds: INVALID_PARAMETER) completes here at once with that status, so that every request completes
    /// exactly once.
    pub(super) fn post(&mut self, qp: QueuePairId, requests: Vec<WorkRequest>) -> Result<()> {
        for wr in requests {
            if let Err(e) = self.writer.post(&wr) {
                let (cq, op) = match &wr {
                    WorkRequest::Receive { .. } => (&self.receive_cq, CompletionOp::Receive),
                    WorkRequest::Send { .. } => (&self.send_cq, CompletionOp::Send),
                    WorkRequest::Write { .. } => (&self.send_cq, CompletionOp::Write),
                    WorkRequest::Read { .. } => (&self.send_cq, CompletionOp::Read),
                };
                tracing::debug!(qp = qp.0, error = %e, "work request refused by its ring");
                cq.push(vec![Completion {
                    qp,
                    wr_id: wr.id(),
                    op,
                    status: e.status(),
                    bytes: 0,
                    solicited: false,
                    invalidated: None,
                }]);
            }
        }
        if self.writer.publish() {
            self.bell.ring().map_err(|e| {
                Error::new(
                    NdStatus::DeviceRemoved,
                    format!("cannot ring soft-rdmad's doorbell: {e}"),
                )
            })?;
        }
        Ok(())
    }
}

/// The rings soft-rdmad passed with queue pair `id`'s answer (`ServerMessage::fds_expected`); refused
/// requests complete on `send_cq` or `receive_cq`.
pub(super) fn attach_queue_pair(
    inner: &Inner,
    id: QueuePairId,
    config: &QueuePairConfig,
    send_cq: Arc<CqState>,
    receive_cq: Arc<CqState>,
) -> Result<QpRing> {
    let (mut fds, bell) = passed(inner, RingObject::QueuePair(id))?;
    let layout = QpRingLayout::new(config.send_depth, config.receive_depth)?;
    let memfd = fds.pop().ok_or_else(missing_rings)?;
    let mem = SharedMemory::from_fd(memfd, layout.bytes()).map_err(map_failed)?;
    let writer = QpRingWriter::attach(Arc::new(mem), layout, config, inner.info.max_transfer_length)?;
    Ok(QpRing {
        writer,
        bell,
        send_cq,
        receive_cq,
    })
}

/// The ring and doorbells soft-rdmad passed with completion queue `id`'s answer.
pub(super) fn attach_completion_queue(inner: &Inner, id: CompletionQueueId, depth: u32) -> Result<CqRing> {
    let (mut fds, session_bell) = passed(inner, RingObject::CompletionQueue(id))?;
    let (Some(doorbell), Some(memfd), None) = (fds.pop(), fds.pop(), fds.pop()) else {
        return Err(missing_rings());
    };
    let g = crate::rings::cq::geometry(depth)?;
    let mem = SharedMemory::from_fd(memfd, crate::rings::cq::bytes(g)).map_err(map_failed)?;
    CqRing::attach(Arc::new(mem), g, Doorbell::from_fd(doorbell), session_bell)
}

fn passed(inner: &Inner, object: RingObject) -> Result<(Vec<OwnedFd>, Arc<Doorbell>)> {
    inner
        .handed
        .lock()
        .expect("not poisoned")
        .take_rings(object)
        .ok_or_else(missing_rings)
}

fn missing_rings() -> Error {
    Error::new(
        NdStatus::Unsuccessful,
        "soft-rdmad answered without the shared rings' descriptors",
    )
}

fn map_failed(e: std::io::Error) -> Error {
    Error::new(
        NdStatus::InsufficientResources,
        format!("cannot map the shared rings: {e}"),
    )
}
