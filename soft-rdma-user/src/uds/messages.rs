//! The requests and answers of the Unix-socket protocol ([`super::proto`] frames them; `docs/protocol.md` is
//! their contract). They mirror the engine's [`CmRequest`], [`CmResponse`] and [`CmEvent`] variant for
//! variant, but are their own types: the engine's can change shape without changing a byte on the socket,
//! and a change here is a protocol change (the golden-bytes test in [`super::proto`] fails until
//! `PROTOCOL_VERSION` and `docs/protocol.md` follow). The conversions below are the only place the two meet.
//!
//! The plain data the messages carry (handles, read limits, adapter info, the status report
//! ([`crate::status`]), work requests and completions) are the engine's serde types, documented in `docs/protocol.md` with the rest.

use std::net::SocketAddr;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::engine::ids::PdId;
use crate::engine::requests::{
    self as engine, AdapterInfo, CmEvent, CmRequest, CmResponse, ConnectionEnd, ConnectorId, HandOff,
    ListenerId, ReadLimits, RequestId, SharedEndpointId,
};
use crate::engine::verbs::{
    Access, CompletionQueueId, MemoryRegionId, QueuePairConfig, QueuePairEvent, QueuePairId, QueuePairStatus, SharedReceiveQueueId, Sge, SrqConfig, SrqStatus,
    Stag,
};
use crate::error::Error;
use crate::status::StatusReport;

/// Requests a session makes. Most complete synchronously with [`Response`]; those marked *async* answer
/// `Ok(Response::Pending)` and complete later with [`Event::Completed`] carrying the same [`RequestId`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// IND2Adapter::Query.
    Query,
    CreateConnector,
    /// Release a connector: aborts a pending connect, disconnects a connected one (implicit disconnect).
    CloseConnector {
        connector: ConnectorId,
    },
    /// IND2Connector::Bind. Port 0 allocates from 49152-65535.
    Bind {
        connector: ConnectorId,
        local: SocketAddr,
    },
    /// IND2Connector::Connect / NdkConnectWithSharedEndpoint (*async*: completes when the peer accepts or
    /// rejects, or the attempt fails).
    Connect {
        connector: ConnectorId,
        remote: SocketAddr,
        limits: ReadLimits,
        private_data: Bytes,
        shared_endpoint: Option<SharedEndpointId>,
        /// The queue pair the connection carries (IND2Connector::Connect's pQueuePair); `None` for
        /// connection management alone (data messages from the peer are then dropped).
        queue_pair: Option<QueuePairId>,
    },
    /// IND2Connector::CompleteConnect (*async*).
    CompleteConnect {
        connector: ConnectorId,
    },
    /// IND2Connector::Accept (*async*: completes when the connection is established).
    Accept {
        connector: ConnectorId,
        limits: ReadLimits,
        private_data: Bytes,
        queue_pair: Option<QueuePairId>,
    },
    /// IND2Connector::Reject: passive side refusing an offer, or active side refusing the peer's limits.
    Reject {
        connector: ConnectorId,
        private_data: Bytes,
    },
    GetReadLimits {
        connector: ConnectorId,
    },
    /// `buffer_len` is the caller's buffer size: shorter than the data → BUFFER_OVERFLOW with the data
    /// truncated and the required size.
    GetPrivateData {
        connector: ConnectorId,
        buffer_len: u32,
    },
    GetLocalAddress {
        connector: ConnectorId,
    },
    GetPeerAddress {
        connector: ConnectorId,
    },
    /// IND2Connector::NotifyDisconnect (*async*: completes when the peer disconnects).
    NotifyDisconnect {
        connector: ConnectorId,
    },
    /// IND2Connector::Disconnect (*async*: completes when the local side is torn down). Outstanding
    /// requests on the connector complete with CANCELED.
    Disconnect {
        connector: ConnectorId,
    },
    /// IND2Overlapped::CancelOverlappedRequests: every pending async request on the object completes with
    /// CANCELED; a pending Connect is abandoned (the passive side sees CONNECTION_ABORTED).
    Cancel {
        object: ObjectRef,
    },
    CreateListener,
    CloseListener {
        listener: ListenerId,
    },
    /// IND2Listener::Bind + Listen. Backlog 0 = no limit.
    Listen {
        listener: ListenerId,
        local: SocketAddr,
        backlog: u32,
    },
    /// IND2Listener::GetConnectionRequest (*async*): completes when an offer is (or already was) queued,
    /// attaching it to `connector`.
    GetConnectionRequest {
        listener: ListenerId,
        connector: ConnectorId,
    },
    CreateSharedEndpoint {
        local: SocketAddr,
    },
    CloseSharedEndpoint {
        endpoint: SharedEndpointId,
    },
    /// Everything the daemon holds, for `soft-rdma status` (not ownership-filtered: an admin view).
    Status,
    /// IND2Adapter::CreateMemoryRegion + Register: the frame carries the region's memfd (SCM_RIGHTS), sealed
    /// against shrinking, at least `length` bytes long. Answers [`Response::MemoryRegion`].
    RegisterMemory {
        length: u64,
        access: Access,
        /// The protection domain (the session's number for it) the region joins.
        pd: PdId,
    },
    /// IND2MemoryRegion::Deregister: its STag is refused from now on.
    DeregisterMemory {
        region: MemoryRegionId,
    },
    CreateCompletionQueue {
        depth: u32,
    },
    CloseCompletionQueue {
        cq: CompletionQueueId,
    },
    CreateQueuePair {
        config: QueuePairConfig,
    },
    /// Kernel mode, after a hand-off: this client's data path saw the connection end (the peer's FIN or
    /// RST, a Terminate either way); the connector ends as on a peer's disconnect.
    ConnectionEnded {
        connector: ConnectorId,
        how: ConnectionEnd,
    },
    /// Kernel mode: the client's in-process queue pairs (with their counters) and its number of registered
    /// regions, for `status`; the latest replaces the previous. Bounded like every request frame (64 KiB),
    /// and to the session's object limit.
    ReportDataPath {
        queue_pairs: Vec<QueuePairStatus>,
        memory_regions: u32,
        /// The first part (replaces the previous report); later parts add their queue pairs to it.
        first: bool,
    },
    /// Releases a queue pair: outstanding requests complete with CANCELED; a connected one disconnects.
    CloseQueuePair {
        qp: QueuePairId,
    },
    /// State, Terminate reason and counters of one queue pair.
    QueryQueuePair {
        qp: QueuePairId,
    },
    /// Registers `length` bytes of the client's own memory at `address` in place (rdma-core
    /// `ibv_reg_mr_iova2`): soft-rdmad reaches them in the client's process (SO_PEERCRED's pid); peers
    /// address the first byte as tagged offset `iova`. Answers [`Response::MemoryRegion`]. (Last, so that
    /// the variants before it keep their encoding.)
    RegisterProcessMemory {
        address: u64,
        length: u64,
        iova: u64,
        access: Access,
        /// The protection domain (the session's number for it) the region joins.
        pd: PdId,
    },
    /// A shared receive queue (protocol 10; the requests below are the engine's, `engine::srq`). Answers
    /// [`Response::SharedReceiveQueue`].
    CreateSharedReceiveQueue {
        config: SrqConfig,
    },
    /// SHARING_VIOLATION while a queue pair uses it.
    CloseSharedReceiveQueue {
        srq: SharedReceiveQueueId,
    },
    /// Arms the limit, or disarms it with 0.
    ModifySharedReceiveQueue {
        srq: SharedReceiveQueueId,
        limit: u32,
    },
    /// Answers [`Response::SharedReceiveQueueInfo`].
    QuerySharedReceiveQueue {
        srq: SharedReceiveQueueId,
    },
    /// Receives `(wr_id, buffers)` in order. Answers [`Response::SharedReceivesPosted`].
    PostSharedReceiveQueue {
        srq: SharedReceiveQueueId,
        receives: Vec<(u64, Vec<Sge>)>,
    },
    /// A queue pair taking its Receives from `srq`; its rings travel with the answer as CreateQueuePair's.
    CreateQueuePairOnSrq {
        config: QueuePairConfig,
        srq: SharedReceiveQueueId,
    },
}

/// Any object handle, for [`Request::Cancel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ObjectRef {
    Connector(ConnectorId),
    Listener(ListenerId),
}

/// The answer to a request (synchronously, or in [`Event::Completed`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// SUCCESS with nothing to return.
    Done,
    /// PENDING: an async request accepted; it completes later with [`Event::Completed`].
    Pending,
    Adapter(AdapterInfo),
    Connector(ConnectorId),
    Listener(ListenerId),
    SharedEndpoint(SharedEndpointId),
    /// Bind, Listen, CreateSharedEndpoint: the address actually bound (port filled in).
    Bound(SocketAddr),
    ReadLimits(ReadLimits),
    /// GetPrivateData. `data.len() < required` means BUFFER_OVERFLOW (status carried by the UDS layer).
    PrivateData {
        data: Bytes,
        required: u32,
    },
    Address(SocketAddr),
    /// The connect/accept side of a completed GetConnectionRequest: the offer now attached to the connector.
    ConnectionRequest {
        connector: ConnectorId,
        peer: SocketAddr,
        limits: ReadLimits,
        private_data: Bytes,
    },
    Status(StatusReport),
    MemoryRegion {
        region: MemoryRegionId,
        stag: Stag,
    },
    CompletionQueue(CompletionQueueId),
    QueuePair(QueuePairId),
    QueuePairInfo(QueuePairStatus),
    /// CompleteConnect / Accept in kernel mode: the connection's socket travels with this frame
    /// (SCM_RIGHTS) and the client runs its queue pair from now on.
    HandedOff(HandOff),
    SharedReceiveQueue(SharedReceiveQueueId),
    SharedReceiveQueueInfo(SrqStatus),
    /// The Receives before `refused` were posted; the one at its index was refused for its error.
    SharedReceivesPosted {
        refused: Option<(u32, Error)>,
    },
}

/// Asynchronous output for a session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
// Completions are nearly every event; the rare limit event is the small one.
#[allow(clippy::large_enum_variant)]
pub enum Event {
    /// An async request finished (success or failure).
    Completed {
        request: RequestId,
        result: Result<Response, Error>,
    },
    /// A shared receive queue's armed limit was reached; it is disarmed (IBV_EVENT_SRQ_LIMIT_REACHED).
    SrqLimitReached {
        srq: SharedReceiveQueueId,
    },
    /// A queue pair's asynchronous event (IBV_EVENT_QP_FATAL, _REQ_ERR or _ACCESS_ERR; protocol version 11).
    QueuePairEvent {
        qp: QueuePairId,
        event: QueuePairEvent,
    },
}

/// The daemon's side: a request as the engine takes it.
impl From<Request> for CmRequest {
    fn from(r: Request) -> CmRequest {
        match r {
            Request::Query => CmRequest::Query,
            Request::CreateConnector => CmRequest::CreateConnector,
            Request::CloseConnector { connector } => CmRequest::CloseConnector { connector },
            Request::Bind { connector, local } => CmRequest::Bind { connector, local },
            Request::Connect {
                connector,
                remote,
                limits,
                private_data,
                shared_endpoint,
                queue_pair,
            } => CmRequest::Connect {
                connector,
                remote,
                limits,
                private_data,
                shared_endpoint,
                queue_pair,
            },
            Request::CompleteConnect { connector } => CmRequest::CompleteConnect { connector },
            Request::Accept {
                connector,
                limits,
                private_data,
                queue_pair,
            } => CmRequest::Accept {
                connector,
                limits,
                private_data,
                queue_pair,
            },
            Request::Reject {
                connector,
                private_data,
            } => CmRequest::Reject {
                connector,
                private_data,
            },
            Request::GetReadLimits { connector } => CmRequest::GetReadLimits { connector },
            Request::GetPrivateData {
                connector,
                buffer_len,
            } => CmRequest::GetPrivateData {
                connector,
                buffer_len,
            },
            Request::GetLocalAddress { connector } => CmRequest::GetLocalAddress { connector },
            Request::GetPeerAddress { connector } => CmRequest::GetPeerAddress { connector },
            Request::NotifyDisconnect { connector } => CmRequest::NotifyDisconnect { connector },
            Request::Disconnect { connector } => CmRequest::Disconnect { connector },
            Request::Cancel { object } => CmRequest::Cancel {
                object: object.into(),
            },
            Request::CreateListener => CmRequest::CreateListener,
            Request::CloseListener { listener } => CmRequest::CloseListener { listener },
            Request::Listen {
                listener,
                local,
                backlog,
            } => CmRequest::Listen {
                listener,
                local,
                backlog,
            },
            Request::GetConnectionRequest { listener, connector } => {
                CmRequest::GetConnectionRequest { listener, connector }
            }
            Request::CreateSharedEndpoint { local } => CmRequest::CreateSharedEndpoint { local },
            Request::CloseSharedEndpoint { endpoint } => CmRequest::CloseSharedEndpoint { endpoint },
            Request::Status => CmRequest::Status,
            Request::RegisterMemory { length, access, pd } => CmRequest::RegisterMemory { length, access, pd },
            // The server turns it into a region before the engine sees it; without one the engine refuses it
            // as a registration that brought no memory.
            Request::RegisterProcessMemory {
                length, access, pd, ..
            } => CmRequest::RegisterMemory { length, access, pd },
            Request::DeregisterMemory { region } => CmRequest::DeregisterMemory { region },
            Request::CreateCompletionQueue { depth } => CmRequest::CreateCompletionQueue { depth },
            Request::CloseCompletionQueue { cq } => CmRequest::CloseCompletionQueue { cq },
            Request::CreateQueuePair { config } => CmRequest::CreateQueuePair { config },
            Request::ConnectionEnded { connector, how } => CmRequest::ConnectionEnded { connector, how },
            Request::ReportDataPath {
                queue_pairs,
                memory_regions,
                first,
            } => CmRequest::ReportDataPath {
                queue_pairs,
                memory_regions,
                first,
            },
            Request::CloseQueuePair { qp } => CmRequest::CloseQueuePair { qp },
            Request::QueryQueuePair { qp } => CmRequest::QueryQueuePair { qp },
            Request::CreateSharedReceiveQueue { config } => CmRequest::CreateSharedReceiveQueue { config },
            Request::CloseSharedReceiveQueue { srq } => CmRequest::CloseSharedReceiveQueue { srq },
            Request::ModifySharedReceiveQueue { srq, limit } => {
                CmRequest::ModifySharedReceiveQueue { srq, limit }
            }
            Request::QuerySharedReceiveQueue { srq } => CmRequest::QuerySharedReceiveQueue { srq },
            Request::PostSharedReceiveQueue { srq, receives } => {
                CmRequest::PostSharedReceiveQueue { srq, receives }
            }
            Request::CreateQueuePairOnSrq { config, srq } => CmRequest::CreateQueuePairOnSrq { config, srq },
        }
    }
}

impl From<ObjectRef> for engine::ObjectRef {
    fn from(o: ObjectRef) -> engine::ObjectRef {
        match o {
            ObjectRef::Connector(x) => engine::ObjectRef::Connector(x),
            ObjectRef::Listener(x) => engine::ObjectRef::Listener(x),
        }
    }
}

/// The daemon's side: an engine answer as the protocol carries it.
impl From<CmResponse> for Response {
    fn from(r: CmResponse) -> Response {
        match r {
            CmResponse::Done => Response::Done,
            CmResponse::Pending => Response::Pending,
            CmResponse::Adapter(x) => Response::Adapter(x),
            CmResponse::Connector(x) => Response::Connector(x),
            CmResponse::Listener(x) => Response::Listener(x),
            CmResponse::SharedEndpoint(x) => Response::SharedEndpoint(x),
            CmResponse::Bound(x) => Response::Bound(x),
            CmResponse::ReadLimits(x) => Response::ReadLimits(x),
            CmResponse::PrivateData { data, required } => Response::PrivateData { data, required },
            CmResponse::Address(x) => Response::Address(x),
            CmResponse::ConnectionRequest {
                connector,
                peer,
                limits,
                private_data,
            } => Response::ConnectionRequest {
                connector,
                peer,
                limits,
                private_data,
            },
            CmResponse::Status(x) => Response::Status(x.into()),
            CmResponse::MemoryRegion { region, stag } => Response::MemoryRegion { region, stag },
            CmResponse::CompletionQueue(x) => Response::CompletionQueue(x),
            CmResponse::QueuePair(x) => Response::QueuePair(x),
            CmResponse::QueuePairInfo(x) => Response::QueuePairInfo(x),
            CmResponse::HandedOff(x) => Response::HandedOff(x),
            CmResponse::SharedReceiveQueue(x) => Response::SharedReceiveQueue(x),
            CmResponse::SharedReceiveQueueInfo(x) => Response::SharedReceiveQueueInfo(x),
            CmResponse::SharedReceivesPosted { refused } => Response::SharedReceivesPosted { refused },
        }
    }
}

impl From<CmEvent> for Event {
    fn from(e: CmEvent) -> Event {
        match e {
            CmEvent::Completed { request, result } => Event::Completed {
                request,
                result: result.map(Response::from),
            },
            CmEvent::SrqLimitReached { srq } => Event::SrqLimitReached { srq },
            CmEvent::QueuePairEvent { qp, event } => Event::QueuePairEvent { qp, event },
        }
    }
}
