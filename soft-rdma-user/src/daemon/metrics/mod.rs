//! soft-rdmad's metrics endpoint (`--metrics-listen ADDR:PORT`): `/metrics` over HTTP/1.1 in the Prometheus
//! text format or OpenMetrics, by content negotiation (docs/metrics.md lists every metric).
//!
//! The event loop never waits for a scraper. The HTTP server runs on a thread of its own ([`server`]) and
//! asks the loop for a [`Snapshot`] through a bounded channel ([`SnapshotRequests`]): the loop answers by
//! copying its daemon-wide figures (no session, peer or address: what `status` hides from other users stays
//! hidden) and goes on; the server encodes them ([`exposition`]) with the `prometheus-client` crate. A
//! snapshot is reused for scrapes less than [`server::REFRESH_AFTER`] apart, and a loop that does not answer
//! within [`server::REFRESH_WAIT`] gets the last snapshot served instead, so however many scrapers come,
//! the loop builds at most a few snapshots a second. What a scraper can make the server hold is bounded:
//! connections in number, requests in size and time ([`server`]).

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

mod exposition;
mod server;
mod snapshot;

pub use server::start;
pub use snapshot::Snapshot;

/// What the server asks the event loop for: a fresh [`Snapshot`], sent back on the channel it carries.
pub type SnapshotRequest = oneshot::Sender<Arc<Snapshot>>;

/// The event loop's end of the channel the server asks for snapshots on.
pub type SnapshotRequests = mpsc::Receiver<SnapshotRequest>;

/// The server's next request, if there is an endpoint (without one: never).
pub async fn next_request(requests: &mut Option<SnapshotRequests>) -> Option<SnapshotRequest> {
    match requests {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}
