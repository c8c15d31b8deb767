//! What the local-client suites (`local_clients`, `local_faults`) share: connecting two queue-pair ends, a
//! Write and Read round that proves a connection works, watching NotifyDisconnect, how a daemon's log says a
//! connection ended, and what a session holds in `status`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use soft_rdma::client::{Adapter, CompletionQueue, Connector, Listener, MemoryRegion, QueuePair};
use soft_rdma::engine::requests::{ReadLimits, SessionId};
use soft_rdma::engine::verbs::{Access, CompletionOp};
use soft_rdma::status::StatusReport;
use soft_rdma::{Error, NdStatus};

use crate::Daemon;
use crate::ends::{End, connect_ends};
use crate::ops::{completions, eventually, within};

/// The read limits of the suites' connections.
pub const LIMITS: ReadLimits = ReadLimits {
    inbound: 16,
    outbound: 16,
};

/// Local write and remote read and write.
pub const RW: Access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_READ.0 | Access::REMOTE_WRITE.0);

/// Connects a queue pair of `a` to one of `b` through `listener` (listening at `remote`).
pub async fn connected_ends(a: &Adapter, b: &Adapter, listener: &Listener, remote: SocketAddr) -> (End, End) {
    let (ea, eb) = (End::on(a, 1024, 256).await, End::on(b, 1024, 256).await);
    let (x, y) = within(
        "connect + accept",
        connect_ends(&ea, &eb, listener, remote, (LIMITS, LIMITS), b""),
    )
    .await;
    x.unwrap();
    y.unwrap();
    (ea, eb)
}

/// NotifyDisconnect on `c` in a task of its own: its result, and when it came.
pub fn watch_disconnect(c: &Arc<Connector>) -> tokio::task::JoinHandle<(Result<(), Error>, Instant)> {
    let c = c.clone();
    tokio::spawn(async move {
        let r = c.notify_disconnect().await;
        (r, Instant::now())
    })
}

/// How `d`'s log says its TCP connection with `peer` ended (the "connection ended" line of the kernel
/// transport and of the XDP transport's own TCP, field `how`): "peer_fin" (the peer's FIN), "peer_reset" (its
/// RST), "timed_out" (this host's TCP gave up: user timeout or keepalive), "local" (closed here), or `None`
/// while there is no such line.
pub fn connection_ended(d: &Daemon, peer: SocketAddr) -> Option<String> {
    let with = format!("peer=Some({peer})");
    d.log_text()
        .lines()
        .filter(|l| l.contains("connection ended") && l.contains(&with))
        .find_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("how=")))
        .map(|how| how.trim_matches('"').to_owned())
}

/// `d`'s log lines about its TCP connections' ends (for failure messages).
pub fn connection_log(d: &Daemon) -> String {
    d.log_text()
        .lines()
        .filter(|l| l.contains("conn=") && (l.contains("failed") || l.contains("connection ended")))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits for `d`'s log line saying how its connection with `peer` ended; returns `how`.
pub async fn ended_how(d: &Daemon, peer: SocketAddr) -> String {
    eventually("the daemon logs how the connection ended", async || {
        connection_ended(d, peer)
    })
    .await
}

/// One RDMA Write of `len` bytes from `src` into `dst`, and a Read back of them into `src` at `len`,
/// verified byte for byte: the connection works.
pub async fn write_read_round(
    qp: &QueuePair,
    cq: &CompletionQueue,
    src: &MemoryRegion,
    dst: &MemoryRegion,
    seed: u64,
) {
    let len = src.len() / 2;
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u64).wrapping_mul(31).wrapping_add(seed) as u8)
        .collect();
    src.write_at(0, &data).unwrap();
    src.fill(len, len, 0).unwrap();
    qp.write(seed * 2, &[src.sge(0, len as u32)], dst.remote(0))
        .unwrap();
    qp.read(seed * 2 + 1, src.sge(len as u64, len as u32), dst.remote(0))
        .unwrap();
    let c = completions(cq, 2).await;
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.op, c.status)).collect::<Vec<_>>(),
        [
            (seed * 2, CompletionOp::Write, NdStatus::Success),
            (seed * 2 + 1, CompletionOp::Read, NdStatus::Success)
        ],
        "round {seed}"
    );
    assert_eq!(
        src.to_vec(len, len).unwrap(),
        data,
        "round {seed}: the Read returns what the Write put"
    );
}

/// How many of the daemon's objects belong to `session` (connectors, listeners, queue pairs).
pub fn held_by(s: &StatusReport, session: SessionId) -> (usize, usize, usize) {
    (
        s.connectors.iter().filter(|c| c.session == session.0).count(),
        s.listeners.iter().filter(|l| l.session == session.0).count(),
        s.queue_pairs.iter().filter(|q| q.session == session.0).count(),
    )
}
