//! The data path's objects, owned per session: memory regions ([`MemoryRegistry`]), completion queues, shared
//! receive queues ([`SharedReceiveQueue`]) and queue pairs ([`QueuePair`], one RDMAP/DDP engine each). The connection manager ([`super::cm`]) binds a
//! queue pair to a connection when it reaches FPDU mode, hands it every inbound data message, and asks
//! [`DataPath::transmit`] for FPDUs whenever the transport has room (a fixed window of bytes handed to the
//! transport and not yet written, so a 16 MiB Write never sits whole in a queue).
//!
//! Completions are collected here and drained by the daemon, batched per completion queue.

use std::collections::hash_map::Entry;
use std::collections::BTreeSet;

use foldhash::HashMap;

use bytes::Bytes;
use soft_rdma_common::wire::TerminateCause;
use soft_rdma_common::wire::rdmap::MessageRepr;
use soft_rdma_common::wire::terminate::TerminateRepr;

use super::counters::EngineGauges;
use super::framing::{FpduSink, GatherBuf};
use super::ids::Domain;
use super::limits::{EntryKind, Limit, Limits, QueueEntries};
use super::memory::{MemoryRegistry, RegionMemory};
use super::qp::{QpParams, QpState, QueuePair};
use super::srq::{
    MAX_SRQ_DEPTH, MAX_SRQS_PER_SESSION, PostedReceive, SharedReceiveQueue, SharedReceiveQueueId, SrqConfig,
    SrqStatus,
};
use super::requests::*;
use super::traffic::OpTraffic;
use super::transport_seam::*;
use super::verbs::*;
use crate::error::{Error, NdStatus, Result};

/// Bytes a connection may have handed to the transport and not yet seen written: enough to keep a TCP
/// socket's send buffer busy, small enough that memory stays bounded per connection.
pub const TRANSMIT_WINDOW: usize = 1 << 20;
/// A chunk of one queue pair's FPDUs for its connection (named by `K`, whatever the driver keys its
/// connections by), with the completions of the messages that ended in it.
pub type Chunk<K, B> = (K, B, Vec<(CompletionQueueId, Completion)>);
/// One transport command carries up to this many bytes of FPDUs.
const TRANSMIT_CHUNK: usize = 256 * 1024;

struct QpSlot {
    qp: QueuePair,
    /// The connector it was given to at Connect/Accept (it cannot be given to another). Which connection
    /// it transmits on, and whether that connection may carry data yet (the passive side waits for the
    /// initiator's first FPDU: RFC 5044 §7.1), is the connection manager's to say, through the room it gives
    /// [`DataPath::transmit`]: the queue pair keeps no link to a connection that could go stale.
    connector: Option<ConnectorId>,
    /// The shared receive queue its Sends take their Receives from, if it was created on one.
    srq: Option<SharedReceiveQueueId>,
}

/// The data-path objects of every session.
pub struct DataPath {
    memory: MemoryRegistry,
    next_id: u64,
    cqs: HashMap<CompletionQueueId, (SessionId, u32)>,
    /// How many queue-pair queues complete on each completion queue (a queue pair using one CQ for both
    /// counts twice): closing a CQ in use is refused without a scan of every queue pair.
    cq_users: HashMap<CompletionQueueId, usize>,
    qps: HashMap<QueuePairId, QpSlot>,
    srqs: HashMap<SharedReceiveQueueId, (SessionId, SharedReceiveQueue)>,
    /// How many queue pairs take their Receives from each shared receive queue (closing one in use is
    /// refused, as `ibv_destroy_srq` is EBUSY then).
    srq_users: HashMap<SharedReceiveQueueId, usize>,
    /// Shared receive queues whose limit was reached, for their sessions (IBV_EVENT_SRQ_LIMIT_REACHED).
    srq_events: Vec<(SessionId, SharedReceiveQueueId)>,
    /// Queue pairs' asynchronous events not yet taken (at most one per queue pair: it raises one on its
    /// move to Error), with their sessions.
    qp_events: Vec<(SessionId, QueuePairId, QueuePairEvent)>,
    /// Connectors whose queue pair sent its local protection error's Terminate: the driver drops their
    /// connections ([`DataPath::take_connections_to_drop`]).
    to_drop: Vec<ConnectorId>,
    /// The queue pair given to each connector: the other direction of [`QpSlot::connector`], set and removed
    /// with it here ([`DataPath::attach`], [`DataPath::close_qp`]) and nowhere else.
    given: HashMap<ConnectorId, QueuePairId>,
    /// Queue pairs that may have something to transmit.
    ready: BTreeSet<QueuePairId>,
    completions: Vec<(CompletionQueueId, Completion)>,
    adapter: AdapterInfo,
    /// Send + receive depth of every queue pair, per session (bounds outstanding work and completions).
    entries: QueueEntries,
    /// Depth of every completion queue, per session.
    cq_entries: QueueEntries,
    /// What closed queue pairs moved (their last counts), for the daemon-wide totals.
    retired: OpTraffic,
}

fn not_found(what: &str, id: u64) -> Error {
    Error::new(
        NdStatus::InvalidParameter,
        format!("no {what} {id} in this session"),
    )
}

impl DataPath {
    /// The data path's requests: memory registration, completion queues, queue pairs.
    pub fn handle_request(&mut self, session: SessionId, req: CmRequest) -> Result<CmResponse> {
        match req {
            CmRequest::RegisterMemory { .. } => Err(Error::new(
                NdStatus::InvalidParameter,
                "RegisterMemory must carry the region's memfd (SCM_RIGHTS)",
            )),
            CmRequest::DeregisterMemory { region } => self.deregister_memory(session, region),
            CmRequest::CreateCompletionQueue { depth } => self.create_cq(session, depth),
            CmRequest::CloseCompletionQueue { cq } => self.close_cq(session, cq),
            CmRequest::CreateQueuePair { config } => self.create_qp(session, config),
            CmRequest::QueryQueuePair { qp } => self.qp_status(session, qp).map(CmResponse::QueuePairInfo),
            CmRequest::CreateSharedReceiveQueue { config } => self
                .create_srq(session, config)
                .map(CmResponse::SharedReceiveQueue),
            CmRequest::CloseSharedReceiveQueue { srq } => {
                self.close_srq(session, srq).map(|()| CmResponse::Done)
            }
            CmRequest::ModifySharedReceiveQueue { srq, limit } => {
                self.modify_srq(session, srq, limit).map(|()| CmResponse::Done)
            }
            CmRequest::QuerySharedReceiveQueue { srq } => self
                .query_srq(session, srq)
                .map(CmResponse::SharedReceiveQueueInfo),
            CmRequest::PostSharedReceiveQueue { srq, receives } => {
                let refused = self.post_srq(session, srq, receives).err();
                Ok(CmResponse::SharedReceivesPosted {
                    refused: refused.map(|(i, e)| (i as u32, e)),
                })
            }
            other => Err(Error::new(
                NdStatus::InvalidParameter,
                format!("{other:?} is not a data-path request"),
            )),
        }
    }

    pub fn new(adapter: AdapterInfo, key_seed: u64) -> Self {
        DataPath {
            memory: MemoryRegistry::new(key_seed),
            next_id: 1,
            cqs: HashMap::default(),
            cq_users: HashMap::default(),
            qps: HashMap::default(),
            srqs: HashMap::default(),
            srq_users: HashMap::default(),
            srq_events: Vec::new(),
            qp_events: Vec::new(),
            to_drop: Vec::new(),
            given: HashMap::default(),
            ready: BTreeSet::new(),
            completions: Vec::new(),
            adapter,
            entries: QueueEntries::default(),
            cq_entries: QueueEntries::unbounded(EntryKind::CompletionQueue),
            retired: OpTraffic::default(),
        }
    }

    /// Bounds the work-queue and completion-queue entries of each session and of all ([`Limits`]).
    pub fn with_limits(mut self, limits: &Limits) -> Self {
        self.entries = QueueEntries::new(limits);
        self.cq_entries = QueueEntries::of(EntryKind::CompletionQueue, limits);
        self
    }

    fn id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    pub fn register_memory(
        &mut self,
        domain: Domain,
        memory: Box<dyn RegionMemory>,
        access: Access,
        iova: u64,
    ) -> Result<CmResponse> {
        let (region, stag) = self.memory.register(domain, memory, access, iova)?;
        Ok(CmResponse::MemoryRegion { region, stag })
    }

    pub fn deregister_memory(&mut self, session: SessionId, region: MemoryRegionId) -> Result<CmResponse> {
        self.memory.deregister(session, region)?;
        Ok(CmResponse::Done)
    }

    pub fn create_cq(&mut self, session: SessionId, depth: u32) -> Result<CmResponse> {
        if depth == 0 || depth > self.adapter.max_completion_queue_depth {
            return Err(Error::new(
                NdStatus::InvalidParameter,
                format!(
                    "completion queue depth {depth} outside 1..={}",
                    self.adapter.max_completion_queue_depth
                ),
            ));
        }
        self.cq_entries.take(session, u64::from(depth))?;
        let id = CompletionQueueId(self.id());
        self.cqs.insert(id, (session, depth));
        Ok(CmResponse::CompletionQueue(id))
    }

    pub fn close_cq(&mut self, session: SessionId, cq: CompletionQueueId) -> Result<CmResponse> {
        self.cq_owned(session, cq)?;
        if self.cq_users.get(&cq).is_some_and(|n| *n > 0) {
            return Err(Error::new(
                NdStatus::InvalidParameter,
                format!(
                    "completion queue {} is used by a queue pair; close it first",
                    cq.0
                ),
            ));
        }
        if let Some((_, depth)) = self.cqs.remove(&cq) {
            self.cq_entries.give(session, u64::from(depth));
        }
        Ok(CmResponse::Done)
    }

    fn cq_owned(&self, session: SessionId, cq: CompletionQueueId) -> Result<()> {
        match self.cqs.get(&cq) {
            Some((s, _)) if *s == session => Ok(()),
            _ => Err(not_found("completion queue", cq.0)),
        }
    }

    pub fn create_qp(&mut self, session: SessionId, config: QueuePairConfig) -> Result<CmResponse> {
        self.create_qp_on(session, config, None)
    }

    /// Creates a queue pair; on `srq` (this session's) it has no receive queue of its own and its Sends take
    /// their Receives from there (siw `siw_create_qp`: `rq_size = 0` with an SRQ; its receive depth and
    /// SGEs are not looked at).
    pub fn create_qp_on(
        &mut self,
        session: SessionId,
        mut config: QueuePairConfig,
        srq: Option<SharedReceiveQueueId>,
    ) -> Result<CmResponse> {
        self.cq_owned(session, config.send_cq)?;
        self.cq_owned(session, config.receive_cq)?;
        if let Some(q) = srq {
            self.srq_mut(session, q)?;
            config.receive_depth = 0;
            config.max_receive_sge = 0;
        }
        let a = &self.adapter;
        let checks = [
            (config.send_depth, a.max_send_queue_depth, "send queue depth"),
            (
                config.receive_depth,
                a.max_receive_queue_depth,
                "receive queue depth",
            ),
            (config.max_send_sge, a.max_send_sge, "send SGEs"),
            (config.max_receive_sge, a.max_receive_sge, "receive SGEs"),
        ];
        for (i, (v, max, what)) in checks.into_iter().enumerate() {
            let on_srq = srq.is_some() && (i == 1 || i == 3);
            if !on_srq && (v == 0 || v > max) {
                return Err(Error::new(
                    NdStatus::InvalidParameter,
                    format!("{what} {v} outside 1..={max} (the adapter limits)"),
                ));
            }
        }
        self.entries.take(
            session,
            u64::from(config.send_depth) + u64::from(config.receive_depth),
        )?;
        let id = QueuePairId(self.id());
        for cq in [config.send_cq, config.receive_cq] {
            *self.cq_users.entry(cq).or_default() += 1;
        }
        if let Some(q) = srq {
            *self.srq_users.entry(q).or_default() += 1;
        }
        self.qps.insert(
            id,
            QpSlot {
                qp: QueuePair::new(id, session, config),
                connector: None,
                srq,
            },
        );
        Ok(CmResponse::QueuePair(id))
    }

    fn slot(&self, session: SessionId, qp: QueuePairId) -> Result<&QpSlot> {
        self.qps
            .get(&qp)
            .filter(|s| s.qp.session() == session)
            .ok_or_else(|| not_found("queue pair", qp.0))
    }

    /// Connect/Accept carrying `qp`: it is given to `connector` if it is this session's, never connected,
    /// not given to another connector, and the connector carries no other queue pair (CONNECTION_ACTIVE
    /// otherwise: "queue pair already connected", docs/connector-semantics.md). Both data paths check here:
    /// the daemon's endpoint, and the client's in-process path before its Connect or Accept goes out.
    pub fn give(&mut self, session: SessionId, qp: QueuePairId, connector: ConnectorId) -> Result<()> {
        if self.queue_pair_of(connector).is_some_and(|q| q != qp) {
            return Err(Error::new(
                NdStatus::ConnectionActive,
                "connector already has another queue pair",
            ));
        }
        self.check_attachable(session, qp, connector)?;
        self.attach(qp, connector);
        Ok(())
    }

    /// The queue pair must be this session's, never connected, and not given to another connector.
    fn check_attachable(
        &self,
        session: SessionId,
        qp: QueuePairId,
        connector: ConnectorId,
    ) -> Result<()> {
        let s = self.slot(session, qp)?;
        if s.connector.is_some_and(|c| c != connector) || s.qp.state() != QpState::Idle {
            return Err(Error::new(
                NdStatus::ConnectionActive,
                format!("queue pair {} is already connected or in use", qp.0),
            ));
        }
        Ok(())
    }

    pub fn attach(&mut self, qp: QueuePairId, connector: ConnectorId) {
        if let Some(s) = self.qps.get_mut(&qp) {
            s.connector = Some(connector);
            self.given.insert(connector, qp);
        }
    }

    /// The queue pair given to `connector` at Connect/Accept, if any (and not closed since).
    pub fn queue_pair_of(&self, connector: ConnectorId) -> Option<QueuePairId> {
        self.given.get(&connector).copied()
    }

    /// The connection reached FPDU mode.
    pub fn connected(&mut self, qp: QueuePairId, params: QpParams) {
        if let Some(s) = self.qps.get_mut(&qp) {
            s.qp.connect(params);
            self.ready.insert(qp);
        }
    }

    /// The connection is gone (Disconnect, peer FIN/RST, Terminate): every outstanding request completes
    /// with `status`; the queue pair cannot be reused (IND2Connector::Disconnect).
    pub fn detach(&mut self, qp: QueuePairId, status: NdStatus) {
        if let Some(s) = self.qps.get_mut(&qp) {
            s.qp.flush(status, &mut self.completions);
        }
    }

    /// The peer's Terminate (its cause, and the buffer it names if it carried the terminated header).
    pub fn peer_terminated(&mut self, qp: QueuePairId, terminate: &TerminateRepr<'_>) {
        if let Some(s) = self.qps.get_mut(&qp) {
            let info = TerminateInfo {
                buffer: TaggedRange::named_by(terminate),
                ..TerminateInfo::new(terminate.cause, true)
            };
            s.qp.on_terminate(info, &mut self.completions);
        }
    }

    /// This side detected an error and terminates the stream (bad CRC, malformed FPDU, a data-path rule).
    pub fn terminated_locally(&mut self, qp: QueuePairId, cause: TerminateCause) {
        if let Some(s) = self.qps.get_mut(&qp) {
            let info = TerminateInfo::new(cause, false);
            s.qp.on_terminate(info, &mut self.completions);
        }
    }

    /// The initiator's RTR went out before anything of this queue pair's (RFC 6581 §9).
    pub fn rtr_sent(&mut self, qp: QueuePairId, rtr: super::framing::Rtr) {
        if let Some(s) = self.qps.get_mut(&qp) {
            s.qp.rtr_sent(rtr);
        }
    }

    /// The initiator's RTR arrived (the responder answers a Read RTR with a zero-length Read Response).
    pub fn rtr_received(&mut self, qp: QueuePairId, msg: &MessageRepr<'_>) -> Result<(), TerminateCause> {
        let Some(s) = self.qps.get_mut(&qp) else {
            return Ok(());
        };
        let srq = s.srq.and_then(|q| self.srqs.get_mut(&q)).map(|(_, q)| q);
        let r = s.qp.rtr_received(msg, &mut self.memory, srq, &mut self.completions);
        self.ready.insert(qp);
        self.note_srq_event(qp);
        self.note_qp_event(qp);
        r
    }

    /// One inbound data message. `Err`: terminate the stream with that cause (the queue pair has already
    /// moved to Error and completed what was outstanding).
    pub fn on_message(&mut self, qp: QueuePairId, msg: &MessageRepr<'_>) -> Result<(), TerminateCause> {
        let Some(s) = self.qps.get_mut(&qp) else {
            return Ok(());
        };
        let srq = s.srq.and_then(|q| self.srqs.get_mut(&q)).map(|(_, q)| q);
        let r = s.qp.on_message(msg, &mut self.memory, srq, &mut self.completions);
        // A Read Request queues a response; a Read Response may unblock the send queue (ORD).
        self.ready.insert(qp);
        self.note_srq_event(qp);
        self.note_qp_event(qp);
        r
    }

    /// Close a queue pair: everything outstanding is flushed with CANCELED. Returns the connector it was
    /// given to, which the caller disconnects (releasing a connected queue pair disconnects implicitly).
    pub fn close_qp(&mut self, session: SessionId, qp: QueuePairId) -> Result<Option<ConnectorId>> {
        let mut s = match self.qps.entry(qp) {
            Entry::Occupied(e) if e.get().qp.session() == session => e.remove(),
            _ => return Err(not_found("queue pair", qp.0)),
        };
        let config = *s.qp.config();
        self.entries.give(
            session,
            u64::from(config.send_depth) + u64::from(config.receive_depth),
        );
        for cq in [config.send_cq, config.receive_cq] {
            if let Some(n) = self.cq_users.get_mut(&cq) {
                *n -= 1;
                if *n == 0 {
                    self.cq_users.remove(&cq);
                }
            }
        }
        if let Some(q) = s.srq
            && let Some(n) = self.srq_users.get_mut(&q)
        {
            *n -= 1;
            if *n == 0 {
                self.srq_users.remove(&q);
            }
        }
        s.qp.flush(NdStatus::Canceled, &mut self.completions);
        self.retired.add(&s.qp.stats().by_op);
        self.ready.remove(&qp);
        if let Some(c) = s.connector {
            self.given.remove(&c);
        }
        Ok(s.connector)
    }

    /// A local error outside the wire (the client's shared ring held a malformed entry, `crate::rings`):
    /// the queue pair moves to Error and everything outstanding completes with `status`. Returns the
    /// connector it was given to, whose connection the caller ends.
    pub fn fail_qp(
        &mut self,
        session: SessionId,
        qp: QueuePairId,
        status: NdStatus,
    ) -> Result<Option<ConnectorId>> {
        let s = self
            .qps
            .get_mut(&qp)
            .filter(|s| s.qp.session() == session)
            .ok_or_else(|| not_found("queue pair", qp.0))?;
        s.qp.flush(status, &mut self.completions);
        Ok(s.connector)
    }

    /// Work requests from the application. Problems become error completions; nothing waits.
    pub fn post(&mut self, session: SessionId, qp: QueuePairId, requests: Vec<WorkRequest>) -> Result<()> {
        let s = self
            .qps
            .get_mut(&qp)
            .filter(|s| s.qp.session() == session)
            .ok_or_else(|| not_found("queue pair", qp.0))?;
        for wr in requests {
            s.qp.post(wr, &self.memory, &mut self.completions);
        }
        self.ready.insert(qp);
        self.note_qp_event(qp);
        Ok(())
    }

    /// FPDUs for every queue pair that has something to send and room on its connection. `room(connector)`
    /// names the connection of the connector the queue pair was given to and how many bytes it may take now
    /// (`None`: no connection that may carry data).
    pub fn transmit(
        &mut self,
        room: impl FnMut(ConnectorId) -> Option<(ConnId, usize)>,
    ) -> Vec<(ConnId, Bytes)> {
        let chunks = self.transmit_into(room, |chunk| Vec::<u8>::with_capacity(chunk + 64 * 1024));
        let mut out = Vec::with_capacity(chunks.len());
        for (conn, buf, ended) in chunks {
            // Copied out of registered memory: the messages are complete (siw completes on transmit).
            self.completions.extend(ended);
            if !buf.is_empty() {
                out.push((conn, Bytes::from(buf)));
            }
        }
        out
    }

    /// [`DataPath::transmit`] for a gathered write: payloads stay in registered memory that can be sent in
    /// place (`GatherBuf`), and each chunk carries the completions of the messages that ended in it. Those
    /// may only be delivered once the chunk is written (the application may reuse the memory then: RFC 5040
    /// §5.5), so they are the caller's to release ([`DataPath::complete`]).
    pub fn transmit_gathered<K: Copy>(
        &mut self,
        room: impl FnMut(ConnectorId) -> Option<(K, usize)>,
    ) -> Vec<Chunk<K, GatherBuf>> {
        self.transmit_into(room, |_| GatherBuf::default())
    }

    /// Completions a gathered write held until its chunk was written.
    pub fn complete(&mut self, completions: Vec<(CompletionQueueId, Completion)>) {
        self.completions.extend(completions);
    }

    /// Both transmits: chunks of at most `TRANSMIT_CHUNK` bytes per queue pair within its room, each with
    /// the completions of the messages that ended in it.
    fn transmit_into<K: Copy, B: FpduSink>(
        &mut self,
        mut room: impl FnMut(ConnectorId) -> Option<(K, usize)>,
        new_buf: impl Fn(usize) -> B,
    ) -> Vec<Chunk<K, B>> {
        let mut out = Vec::new();
        let ready = std::mem::take(&mut self.ready);
        for id in ready {
            let Some(s) = self.qps.get_mut(&id) else { continue };
            // Only a connected queue pair (given to a connector, in FPDU mode, not flushed) wants to.
            if !s.qp.wants_transmit() {
                continue;
            }
            let Some((conn, mut budget)) = s.connector.and_then(&mut room) else {
                continue;
            };
            if budget == 0 {
                // No room, or the connection may not carry data yet: the transport's Written event, or the
                // connection manager when the passive side may send, puts it back.
                continue;
            }
            while budget > 0 && s.qp.wants_transmit() {
                let chunk = budget.min(TRANSMIT_CHUNK);
                let mut buf = new_buf(chunk);
                let mut ended = Vec::new();
                let n = s.qp.poll_transmit(&self.memory, chunk, &mut buf, &mut ended);
                if n == 0 {
                    // Nothing appended, but requests may have failed at transmit: their completions follow
                    // those of the chunks before (an empty chunk keeps their place).
                    if !ended.is_empty() {
                        out.push((conn, buf, ended));
                    }
                    break;
                }
                budget = budget.saturating_sub(n);
                out.push((conn, buf, ended));
            }
            if let Some(event) = s.qp.take_event() {
                self.qp_events.push((s.qp.session(), id, event));
            }
            if s.qp.take_connection_drop()
                && let Some(c) = s.connector
            {
                self.to_drop.push(c);
            }
            if s.qp.wants_transmit() {
                // Out of room: the transport's Written event puts it back.
                self.ready.insert(id);
            }
        }
        out
    }

    /// The transport wrote bytes of `qp`'s connection: it may send again.
    pub fn wake(&mut self, qp: QueuePairId) {
        self.ready.insert(qp);
    }

    /// Completions gathered so far, batched per completion queue with the owning session.
    pub fn take_completions(&mut self) -> Vec<(SessionId, CompletionQueueId, Vec<Completion>)> {
        if self.completions.is_empty() {
            return Vec::new();
        }
        let mut batches: Vec<(SessionId, CompletionQueueId, Vec<Completion>)> = Vec::new();
        // Batch index per completion queue: a flush of many queue pairs on many CQs stays linear.
        let mut index: HashMap<CompletionQueueId, usize> = HashMap::default();
        for (cq, c) in self.completions.drain(..) {
            let Some((session, _)) = self.cqs.get(&cq) else {
                continue; // the completion queue (and its session) is gone
            };
            match index.get(&cq) {
                Some(&i) => batches[i].2.push(c),
                None => {
                    index.insert(cq, batches.len());
                    batches.push((*session, cq, vec![c]));
                }
            }
        }
        batches
    }

    /// Creates a shared receive queue (siw `siw_create_srq`): a depth of 0 or above [`MAX_SRQ_DEPTH`], more
    /// SGEs than the adapter's receive SGEs (or none), or a limit above the depth → INVALID_PARAMETER; past
    /// [`MAX_SRQS_PER_SESSION`] or the session's work-queue entries → INSUFFICIENT_RESOURCES. A nonzero
    /// limit arms it.
    pub fn create_srq(&mut self, session: SessionId, config: SrqConfig) -> Result<SharedReceiveQueueId> {
        let max_sge = self.adapter.max_receive_sge;
        if config.depth == 0 || config.depth > MAX_SRQ_DEPTH {
            return Err(Error::new(
                NdStatus::InvalidParameter,
                format!(
                    "shared receive queue depth {} outside 1..={MAX_SRQ_DEPTH}",
                    config.depth
                ),
            ));
        }
        if config.max_sge == 0 || config.max_sge > max_sge {
            return Err(Error::new(
                NdStatus::InvalidParameter,
                format!(
                    "shared receive queue SGEs {} outside 1..={max_sge} (the adapter limit)",
                    config.max_sge
                ),
            ));
        }
        if config.limit > config.depth {
            return Err(Error::new(
                NdStatus::InvalidParameter,
                format!(
                    "shared receive queue limit {} above its depth {}",
                    config.limit, config.depth
                ),
            ));
        }
        let mine = self.srqs.values().filter(|(s, _)| *s == session).count();
        if mine >= MAX_SRQS_PER_SESSION {
            return Err(Error::new(
                NdStatus::InsufficientResources,
                format!(
                    "this session holds {MAX_SRQS_PER_SESSION} shared receive queues, the most it may; \
                     destroy one first"
                ),
            ));
        }
        self.entries.take(session, u64::from(config.depth))?;
        let id = SharedReceiveQueueId(self.id());
        self.srqs.insert(id, (session, SharedReceiveQueue::new(config)));
        Ok(id)
    }

    fn srq_mut(
        &mut self,
        session: SessionId,
        srq: SharedReceiveQueueId,
    ) -> Result<&mut SharedReceiveQueue> {
        match self.srqs.get_mut(&srq) {
            Some((s, q)) if *s == session => Ok(q),
            _ => Err(not_found("shared receive queue", srq.0)),
        }
    }

    /// Destroys a shared receive queue: SHARING_VIOLATION while a queue pair created on it is not in Error
    /// (siw: the queue pairs hold a reference; `ibv_destroy_srq` answers EBUSY). One in Error takes nothing
    /// more (its application may have destroyed it already, and the client closes it a little later). Its
    /// Receives are dropped uncompleted: it has no completion queue of its own.
    pub fn close_srq(&mut self, session: SessionId, srq: SharedReceiveQueueId) -> Result<()> {
        let depth = self.srq_mut(session, srq)?.config().depth;
        let in_use = self.srq_users.get(&srq).is_some_and(|n| *n > 0)
            && self
                .qps
                .values()
                .any(|s| s.srq == Some(srq) && s.qp.state() != QpState::Error);
        if in_use {
            return Err(Error::new(
                NdStatus::SharingViolation,
                format!(
                    "shared receive queue {} is used by a queue pair; destroy its queue pairs first",
                    srq.0
                ),
            ));
        }
        self.srqs.remove(&srq);
        self.srq_users.remove(&srq);
        self.entries.give(session, u64::from(depth));
        Ok(())
    }

    /// Posts Receives on a shared receive queue, in order, each checked as siw's `siw_post_srq_recv`: no SGE
    /// or more than its SGEs → INVALID_PARAMETER, full → INSUFFICIENT_RESOURCES; and, as a queue pair's
    /// Receives, a local SGE that is not this session's, invalid, out of bounds or not writable →
    /// ACCESS_VIOLATION. The first refused one stops the post: `Err((its index, why))`, the ones before it
    /// posted.
    pub fn post_srq(
        &mut self,
        session: SessionId,
        srq: SharedReceiveQueueId,
        requests: Vec<(u64, Vec<Sge>)>,
    ) -> std::result::Result<(), (usize, Error)> {
        let memory = &self.memory;
        let q = match self.srqs.get_mut(&srq) {
            Some((s, q)) if *s == session => q,
            _ => return Err((0, not_found("shared receive queue", srq.0))),
        };
        for (i, (id, sgl)) in requests.into_iter().enumerate() {
            let max = q.config().max_sge;
            if sgl.is_empty() || sgl.len() as u64 > u64::from(max) {
                let why = format!("a Receive with {} SGEs on a shared receive queue of 1..={max}", sgl.len());
                return Err((i, Error::new(NdStatus::InvalidParameter, why)));
            }
            if q.is_full() {
                let why = format!(
                    "shared receive queue {} is full ({} Receives posted)",
                    srq.0,
                    q.config().depth
                );
                return Err((i, Error::new(NdStatus::InsufficientResources, why)));
            }
            // A shared receive queue has no protection domain of its own here: a Receive's buffers must be
            // writable memory of the session, in any of its domains, and the queue pair a Send lands on
            // checks them against its own domain when it places the bytes (siw checks the SRQ's PD then).
            let domain_of = |g: &Sge| {
                memory
                    .domain_of(g.stag)
                    .filter(|d| d.session == session)
                    .unwrap_or(Domain::from(session))
            };
            if let Some(sge) = sgl.iter().find(|g| {
                g.length > 0
                    && memory
                        .check(domain_of(g), g.stag, g.offset, u64::from(g.length), Access::LOCAL_WRITE)
                        .is_err()
            }) {
                let why = format!(
                    "Receive buffer (STag {:#x}, offset {}, {} bytes) is not writable registered memory of \
                     this session",
                    sge.stag.0, sge.offset, sge.length
                );
                return Err((i, Error::new(NdStatus::AccessViolation, why)));
            }
            let capacity = sgl.iter().map(|g| u64::from(g.length)).sum();
            q.push(PostedReceive { id, sgl, capacity });
        }
        Ok(())
    }

    /// Arms the limit at `limit`, or disarms it with 0 (siw `siw_modify_srq`: a limit above the depth →
    /// INVALID_PARAMETER).
    pub fn modify_srq(&mut self, session: SessionId, srq: SharedReceiveQueueId, limit: u32) -> Result<()> {
        let q = self.srq_mut(session, srq)?;
        let depth = q.config().depth;
        if limit > depth {
            return Err(Error::new(
                NdStatus::InvalidParameter,
                format!("shared receive queue limit {limit} above its depth {depth}"),
            ));
        }
        q.set_limit(limit);
        Ok(())
    }

    pub fn query_srq(&mut self, session: SessionId, srq: SharedReceiveQueueId) -> Result<SrqStatus> {
        Ok(self.srq_mut(session, srq)?.status())
    }

    /// A message `qp` took may have reached its shared receive queue's limit.
    fn note_srq_event(&mut self, qp: QueuePairId) {
        let Some(q) = self.qps.get(&qp).and_then(|s| s.srq) else {
            return;
        };
        if let Some((session, srq)) = self.srqs.get_mut(&q)
            && srq.take_limit_event()
        {
            self.srq_events.push((*session, q));
        }
    }

    /// Keeps the asynchronous event `qp` raised, if it did (its move to Error).
    fn note_qp_event(&mut self, qp: QueuePairId) {
        if let Some(s) = self.qps.get_mut(&qp)
            && let Some(event) = s.qp.take_event()
        {
            self.qp_events.push((s.qp.session(), qp, event));
        }
    }

    /// Connectors whose connection is to be dropped now: their queue pair's local protection error was
    /// sent to the peer as a Terminate in what [`DataPath::transmit`] gave out (siw `siw_qp_cm_drop`). The
    /// driver closes each connection after those bytes (FIN) and tells the application the connection
    /// ended.
    pub fn take_connections_to_drop(&mut self) -> Vec<ConnectorId> {
        std::mem::take(&mut self.to_drop)
    }

    /// Queue pairs' asynchronous events raised since last asked, with their sessions.
    pub fn take_qp_events(&mut self) -> Vec<(SessionId, QueuePairId, QueuePairEvent)> {
        std::mem::take(&mut self.qp_events)
    }

    /// The oldest queue pair event not yet taken, as a session's event.
    pub fn poll_qp_event(&mut self) -> Option<(SessionId, CmEvent)> {
        if self.qp_events.is_empty() {
            return None;
        }
        let (session, qp, event) = self.qp_events.remove(0);
        Some((session, CmEvent::QueuePairEvent { qp, event }))
    }

    /// Shared receive queues whose limit was reached since last asked, with their sessions.
    pub fn take_srq_events(&mut self) -> Vec<(SessionId, SharedReceiveQueueId)> {
        std::mem::take(&mut self.srq_events)
    }

    /// The oldest shared receive queue limit event not yet taken, as a session's event.
    pub fn poll_srq_event(&mut self) -> Option<(SessionId, CmEvent)> {
        if self.srq_events.is_empty() {
            return None;
        }
        let (session, srq) = self.srq_events.remove(0);
        Some((session, CmEvent::SrqLimitReached { srq }))
    }

    pub fn qp_status(&self, session: SessionId, qp: QueuePairId) -> Result<QueuePairStatus> {
        self.slot(session, qp).map(|s| self.status_of(s))
    }

    fn status_of(&self, s: &QpSlot) -> QueuePairStatus {
        QueuePairStatus {
            id: s.qp.id().0,
            session: s.qp.session().0,
            connector: s.connector.map(|c| c.0),
            state: match s.qp.state() {
                QpState::Idle => QueuePairState::Idle,
                QpState::Connected => QueuePairState::Connected,
                QpState::Error => QueuePairState::Error,
            },
            terminate: s.qp.terminate_info(),
            ird: s.qp.params().ird,
            ord: s.qp.params().ord,
            stats: s.qp.stats(),
        }
    }

    /// What every queue pair moved since start, closed ones included.
    pub fn traffic(&self) -> OpTraffic {
        let mut t = self.retired.clone();
        for s in self.qps.values() {
            t.add(&s.qp.stats().by_op);
        }
        t
    }

    /// Counts the queue pairs by state into `g`; returns the number of memory regions.
    pub fn count_into(&self, g: &mut EngineGauges) -> u64 {
        for s in self.qps.values() {
            g.add_queue_pair(self.status_of(s).state);
        }
        self.memory.count() as u64
    }

    /// How often the work-queue and completion-queue entry bounds refused `limit`.
    pub fn limit_hits(&self, limit: Limit) -> u64 {
        self.entries.hits().get(limit) + self.cq_entries.hits().get(limit)
    }

    /// One queue pair's status, if `session` holds it (its final counters, read before it closes).
    pub fn status_of_qp(&self, session: SessionId, qp: QueuePairId) -> Option<QueuePairStatus> {
        self.qps
            .get(&qp)
            .filter(|s| s.qp.session() == session)
            .map(|s| self.status_of(s))
    }

    /// How many memory regions it holds (what a report of the in-process data path carries).
    pub fn memory_region_count(&self) -> u32 {
        self.memory.count() as u32
    }

    pub fn status(&self) -> (Vec<QueuePairStatus>, u32) {
        let mut qps: Vec<_> = self.qps.values().map(|s| self.status_of(s)).collect();
        qps.sort_by_key(|q| q.id);
        (qps, self.memory.count() as u32)
    }

    /// The session went away: its queue pairs (flushed), completion queues and regions are released. (Its
    /// connectors are the connection manager's: it closes them first.)
    pub fn close_session(&mut self, session: SessionId) {
        let qps: Vec<_> = self
            .qps
            .iter()
            .filter(|(_, s)| s.qp.session() == session)
            .map(|(id, _)| *id)
            .collect();
        for qp in qps {
            let _ = self.close_qp(session, qp);
        }
        self.cqs.retain(|_, (s, _)| *s != session);
        self.cq_entries.give_all(session);
        let srqs: Vec<_> = self
            .srqs
            .iter()
            .filter(|(_, (s, _))| *s == session)
            .map(|(id, _)| *id)
            .collect();
        for q in srqs {
            let _ = self.close_srq(session, q);
        }
        self.srq_events.retain(|(s, _)| *s != session);
        self.qp_events.retain(|(s, _, _)| *s != session);
        self.memory.close_session(session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cm::CmConfig;

    const S: SessionId = SessionId(1);

    fn cq(dp: &mut DataPath) -> CompletionQueueId {
        match dp.create_cq(S, 16).unwrap() {
            CmResponse::CompletionQueue(id) => id,
            other => panic!("{other:?}"),
        }
    }

    fn qp(dp: &mut DataPath, send_cq: CompletionQueueId, receive_cq: CompletionQueueId) -> QueuePairId {
        let config = QueuePairConfig {
            send_cq,
            receive_cq,
            send_depth: 4,
            receive_depth: 4,
            max_send_sge: 1,
            max_receive_sge: 1,
            pd: crate::engine::ids::PdId(0),
        };
        match dp.create_qp(S, config).unwrap() {
            CmResponse::QueuePair(id) => id,
            other => panic!("{other:?}"),
        }
    }

    /// A completion queue cannot close while any queue pair completes on it (send or receive side, one CQ
    /// for both, many queue pairs on one CQ), and can once the last one closed.
    #[test]
    fn completion_queue_in_use_until_its_last_queue_pair_closes() {
        let mut dp = DataPath::new(CmConfig::default_siw_compatible().adapter, 1);
        let (shared, send_only, recv_only) = (cq(&mut dp), cq(&mut dp), cq(&mut dp));
        let many: Vec<QueuePairId> = (0..100).map(|_| qp(&mut dp, shared, shared)).collect();
        let split = qp(&mut dp, send_only, recv_only);
        for c in [shared, send_only, recv_only] {
            assert_eq!(dp.close_cq(S, c).unwrap_err().status, NdStatus::InvalidParameter);
        }
        dp.close_qp(S, split).unwrap();
        dp.close_cq(S, send_only).unwrap();
        dp.close_cq(S, recv_only).unwrap();
        for q in &many[..99] {
            dp.close_qp(S, *q).unwrap();
        }
        assert!(dp.close_cq(S, shared).is_err(), "one queue pair still uses it");
        dp.close_qp(S, many[99]).unwrap();
        dp.close_cq(S, shared).unwrap();
        assert!(dp.close_cq(S, shared).is_err(), "already closed");
        // A session's end releases everything, counts included.
        let c = cq(&mut dp);
        qp(&mut dp, c, c);
        dp.close_session(S);
        assert!(dp.cq_users.is_empty());
    }

    /// Work-queue entries (send + receive depth) past the session's bound: CreateQueuePair is
    /// INSUFFICIENT_RESOURCES for that session; closing a queue pair, or the session, gives them back.
    #[test]
    fn queue_entries_are_bounded_per_session() {
        let limits = Limits {
            max_queue_entries_per_session: 16,
            ..Limits::default()
        };
        let mut dp = DataPath::new(CmConfig::default_siw_compatible().adapter, 1).with_limits(&limits);
        let c = cq(&mut dp);
        let (q1, _q2) = (qp(&mut dp, c, c), qp(&mut dp, c, c));
        let config = QueuePairConfig::on_one_cq(c, 4);
        let e = dp.create_qp(S, config).unwrap_err();
        assert_eq!(e.status, NdStatus::InsufficientResources, "{e}");
        dp.close_qp(S, q1).unwrap();
        qp(&mut dp, c, c);
        dp.close_session(S);
        assert_eq!(dp.entries.total(), 0);
    }

    /// Completion queues as deep as kernel siw's (`SIW_MAX_CQE`), libfabric RxM's default 262,144 among
    /// them; their depths count against the session's bound, given back when a queue or the session closes.
    #[test]
    fn completion_queues_up_to_siw_depth_are_bounded_per_session() {
        let adapter = CmConfig::default_siw_compatible().adapter;
        let max = crate::engine::limits::MAX_COMPLETION_QUEUE_DEPTH;
        assert_eq!(adapter.max_completion_queue_depth, max);
        let limits = Limits {
            max_cq_entries_per_session: u64::from(max) + 262_144,
            ..Limits::default()
        };
        let mut dp = DataPath::new(adapter, 1).with_limits(&limits);
        for depth in [0, max + 1, u32::MAX] {
            let e = dp.create_cq(S, depth).unwrap_err();
            assert_eq!(e.status, NdStatus::InvalidParameter, "{depth}: {e}");
        }
        let deepest = dp.create_cq(S, max).unwrap();
        let CmResponse::CompletionQueue(rxm) = dp.create_cq(S, 262_144).unwrap() else {
            panic!("not a completion queue");
        };
        let e = dp.create_cq(S, 1).unwrap_err();
        assert_eq!(e.status, NdStatus::InsufficientResources, "{e}");
        assert!(e.context.contains("--max-cq-entries-per-session"), "{e}");
        assert_eq!(dp.limit_hits(Limit::CqEntriesPerSession), 1);
        dp.close_cq(S, rxm).unwrap();
        dp.create_cq(S, 262_144).unwrap();
        dp.close_session(S);
        assert_eq!(dp.cq_entries.total(), 0);
        assert!(matches!(deepest, CmResponse::CompletionQueue(_)));
    }

    /// Completions are batched per completion queue, each batch in completion order, batches in the order
    /// their queues first completed (many queues at once: a session's end flushing thousands).
    #[test]
    fn completions_batched_per_queue_in_order() {
        let mut dp = DataPath::new(CmConfig::default_siw_compatible().adapter, 1);
        let cqs: Vec<CompletionQueueId> = (0..1000).map(|_| cq(&mut dp)).collect();
        let completion = |wr_id: u64| Completion {
            qp: QueuePairId(0),
            wr_id,
            op: CompletionOp::Send,
            status: NdStatus::Success,
            bytes: 0,
            solicited: false,
            invalidated: None,
        };
        for round in 0..3u64 {
            for (i, c) in cqs.iter().enumerate().rev() {
                dp.completions.push((*c, completion(round * 10_000 + i as u64)));
            }
        }
        let batches = dp.take_completions();
        assert_eq!(batches.len(), 1000);
        for (k, (session, c, entries)) in batches.iter().enumerate() {
            let i = 999 - k;
            assert_eq!((*session, *c), (S, cqs[i]));
            let ids: Vec<u64> = entries.iter().map(|e| e.wr_id).collect();
            assert_eq!(ids, [0, 10_000, 20_000].map(|r| r + i as u64));
        }
        assert!(dp.take_completions().is_empty());
    }
}

#[cfg(test)]
#[path = "datapath_srq_tests.rs"]
mod srq_tests;
