//! One software RNIC, as its driver (soft-rdmad's event loop, the tests, the fuzz targets) sees it: the
//! endpoint ([`Endpoint`]: sessions, ports, connectors, listeners, connections) and the data path
//! ([`DataPath`]: memory regions, completion queues, queue pairs) side by side. Neither owns the other: the
//! endpoint acts on queue pairs through the data path lent to each call, and the client library's
//! in-process path runs a [`DataPath`] with no endpoint at all.
//!
//! Sans-IO, in the quinn-proto style: requests, transport events and time go in ([`Rnic::handle_request`],
//! [`Rnic::handle_transport`], [`Rnic::handle_timeout`]); transport commands, session events, completions
//! and the objects a request made or closed come out ([`Rnic::poll_transport`], [`Rnic::poll_event`],
//! [`Rnic::poll_completions`], [`Rnic::poll_object_event`]).

use std::time::Instant;

use super::cm::{CmConfig, Endpoint};
use super::counters::{EngineCounters, EngineGauges};
use super::datapath::DataPath;
use super::ids::{ConnId, ConnectorId, Domain, RequestId, SessionId};
use super::limits::Limit;
use super::memory::RegionMemory;
use super::requests::{CmEvent, CmRequest, CmResponse, ObjectEvent};
use super::status::EngineStatus;
use super::traffic::OpTraffic;
use super::transport_seam::{HostPorts, TransportCommand, TransportEvent};
use super::verbs::{Access, Completion, CompletionQueueId, QueuePairId, WorkRequest};
use crate::error::{NdStatus, Result};

/// The endpoint and the data path of one daemon.
pub struct Rnic {
    endpoint: Endpoint,
    data_path: DataPath,
}

impl Rnic {
    /// An RNIC holding host ports through `host`. `key_seed` starts the STag key sequence (the daemon passes
    /// a random one, so that STags of an earlier run are not valid now); the engine reads no clock and no
    /// randomness of its own.
    pub fn new(config: CmConfig, host: Box<dyn HostPorts>, key_seed: u64) -> Self {
        let data_path = DataPath::new(config.adapter.clone(), key_seed).with_limits(&config.limits);
        Rnic {
            endpoint: Endpoint::new(config, host),
            data_path,
        }
    }

    pub fn config(&self) -> &CmConfig {
        self.endpoint.config()
    }

    /// Records that a session exists (for the status view).
    pub fn open_session(&mut self, session: SessionId) {
        self.endpoint.open_session(session);
    }

    /// Handles one request. `Ok(CmResponse::Pending)`: it completes later with [`CmEvent::Completed`].
    pub fn handle_request(
        &mut self,
        now: Instant,
        session: SessionId,
        request: RequestId,
        req: CmRequest,
    ) -> Result<CmResponse> {
        self.endpoint
            .handle_request(&mut self.data_path, now, session, request, req)
    }

    /// RegisterMemory with the region's bytes (the daemon maps the memfd the request carried, or reaches the
    /// client's own memory: `uds::process_memory`); peers address its first byte as tagged offset `iova`.
    pub fn register_memory(
        &mut self,
        domain: Domain,
        memory: Box<dyn RegionMemory>,
        access: Access,
        iova: u64,
    ) -> Result<CmResponse> {
        self.endpoint
            .register_memory(&mut self.data_path, domain, memory, access, iova)
    }

    /// Work requests for a queue pair (never waits; problems come back as error completions).
    pub fn post(&mut self, session: SessionId, qp: QueuePairId, requests: Vec<WorkRequest>) -> Result<()> {
        self.endpoint.post(&mut self.data_path, session, qp, requests)
    }

    /// A local queue-pair error the engine did not see on the wire (a malformed entry in the client's
    /// shared ring): see [`Endpoint::fail_queue_pair`].
    pub fn fail_queue_pair(&mut self, session: SessionId, qp: QueuePairId, status: NdStatus) -> Result<()> {
        self.endpoint
            .fail_queue_pair(&mut self.data_path, session, qp, status)
    }

    pub fn handle_transport(&mut self, now: Instant, event: TransportEvent) {
        self.endpoint.handle_transport(&mut self.data_path, now, event);
    }

    /// The deadline passed: a responder waiting for its Request, a reject's linger, a first-FPDU hold.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.endpoint.handle_timeout(&mut self.data_path, now);
    }

    /// The session went away: everything it held is released.
    pub fn close_session(&mut self, now: Instant, session: SessionId) {
        self.endpoint.close_session(&mut self.data_path, now, session);
    }

    /// The adapter goes away: every pending request completes with DEVICE_REMOVED, everything closes.
    pub fn shutdown(&mut self, now: Instant) {
        self.endpoint.shutdown(&mut self.data_path, now);
    }

    pub fn poll_transport(&mut self) -> Option<TransportCommand> {
        self.endpoint.poll_transport()
    }

    /// The connection manager's events, then the data path's (shared receive queue limits).
    pub fn poll_event(&mut self) -> Option<(SessionId, CmEvent)> {
        self.endpoint
            .poll_event()
            .or_else(|| self.data_path.poll_srq_event())
            .or_else(|| self.data_path.poll_qp_event())
    }

    /// The next queue pair or completion queue a request made or closed (the daemon's shared rings follow
    /// them). Drain after each [`Self::handle_request`].
    pub fn poll_object_event(&mut self) -> Option<ObjectEvent> {
        self.endpoint.poll_object_event()
    }

    /// Completions gathered since the last call, batched per completion queue.
    pub fn poll_completions(&mut self) -> Vec<(SessionId, CompletionQueueId, Vec<Completion>)> {
        self.data_path.take_completions()
    }

    /// The next deadline; call [`Self::handle_timeout`] then.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        self.endpoint.poll_timeout()
    }

    /// The queue pair a request acts on, whose work already posted must reach the engine first
    /// ([`Endpoint::queue_pair_acted_on`]).
    pub fn queue_pair_acted_on(&self, req: &CmRequest) -> Option<QueuePairId> {
        self.endpoint.queue_pair_acted_on(&self.data_path, req)
    }

    /// The queue pair (and its session) whose messages arrive on `conn`: the driver posts what that queue
    /// pair's client already posted (its shared ring) before the bytes, so that a Receive posted before the
    /// peer's Send arrived is there to take it (a verbs post is in force once it returns).
    pub fn queue_pair_on(&self, conn: ConnId) -> Option<(SessionId, QueuePairId)> {
        self.endpoint.queue_pair_on(&self.data_path, conn)
    }

    /// The TCP connection a connector runs on, if it has one.
    pub fn connection_of(&self, connector: ConnectorId) -> Option<ConnId> {
        self.endpoint.connection_of(connector)
    }

    /// Data messages that arrived on connections given no queue pair (dropped).
    pub fn fpdus_without_queue_pair(&self) -> u64 {
        self.endpoint.fpdus_without_queue_pair()
    }

    /// Connection setups and Terminates since start (soft-rdmad's metrics).
    pub fn counters(&self) -> &EngineCounters {
        self.endpoint.counters()
    }

    /// What every queue pair moved since start: the daemon's own, and those its clients run and report.
    pub fn traffic(&self) -> OpTraffic {
        let mut t = self.data_path.traffic();
        t.add(self.endpoint.reported().traffic());
        t
    }

    /// How often the engine's share of the limits (objects, ports, work-queue and completion-queue
    /// entries) refused `limit`.
    pub fn limit_hits(&self, limit: Limit) -> u64 {
        self.endpoint.limit_hits(limit) + self.data_path.limit_hits(limit)
    }

    /// What the engine holds now, daemon-wide.
    pub fn gauges(&self) -> EngineGauges {
        self.endpoint.gauges(&self.data_path)
    }

    /// The engine's part of `soft-rdma status`.
    pub fn status(&self) -> EngineStatus {
        self.endpoint.status(&self.data_path)
    }

    /// Entries in the deadline index, live or stale (tests: it must not grow without bound).
    #[cfg(test)]
    pub(crate) fn timer_entries(&self) -> usize {
        self.endpoint.timer_entries()
    }
}
