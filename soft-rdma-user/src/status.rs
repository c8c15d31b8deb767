//! `soft-rdma status`: everything the daemon holds, as one report ([`StatusReport`]). The engine fills in its
//! part ([`EngineStatus`]: connectors, listeners, ports, queue pairs), the daemon adds the transport's
//! ([`TransportStatus`]) and the budgets' ([`ResourceStatus`]) before it answers.

use std::net::SocketAddr;

use crate::engine::limits::ResourceStatus;
use crate::engine::status::{ConnectorStatus, EngineStatus, ListenerStatus};
use crate::engine::verbs::QueuePairStatus;
use crate::transport::status::TransportStatus;

/// `soft-rdma status`: everything the daemon holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StatusReport {
    pub listeners: Vec<ListenerStatus>,
    pub connectors: Vec<ConnectorStatus>,
    pub shared_endpoints: Vec<SocketAddr>,
    pub ports_in_use: u32,
    pub ports_free: u32,
    pub sessions: u32,
    pub queue_pairs: Vec<QueuePairStatus>,
    pub memory_regions: u32,
    /// How the daemon moves bytes (filled in by the daemon, not the engine).
    pub transport: Option<TransportStatus>,
    /// Client connections, registered memory and queued output against their limits (filled in by the
    /// daemon).
    /// (Boxed: it would make every `CmResponse` larger.)
    pub resources: Option<Box<ResourceStatus>>,
}

impl From<EngineStatus> for StatusReport {
    /// The engine's part, with the transport's and the budgets' still to be filled in.
    fn from(e: EngineStatus) -> Self {
        let EngineStatus {
            listeners,
            connectors,
            shared_endpoints,
            ports_in_use,
            ports_free,
            sessions,
            queue_pairs,
            memory_regions,
        } = e;
        StatusReport {
            listeners,
            connectors,
            shared_endpoints,
            ports_in_use,
            ports_free,
            sessions,
            queue_pairs,
            memory_regions,
            transport: None,
            resources: None,
        }
    }
}
