//! The server half of rdma-core's `rdma_server` / `rdma_client` example pair (librdmacm/examples), on
//! soft-rdma: listen on port 7471, take one connection request, post a 16-byte Receive, accept, wait for
//! the client's 16 bytes, Send 16 bytes back, wait for the Send, disconnect. Works against `rdma_client` on
//! kernel siw and against `examples/rdma_client.rs`.
//!
//! ```text
//! cargo run --example rdma_server -- -s 10.98.1.1 [-p 7471]     (soft-rdmad's socket: $SOFT_RDMA_UDS)
//! ```
//! Prints `rdma_server: start`, then `rdma_server: end 0` on success, as rdma-core's does.

use std::net::SocketAddr;

use anyhow::{Context, Result, ensure};
use soft_rdma::client::{Adapter, Completion, CompletionOp, ReadLimits};

#[path = "common/mod.rs"]
mod common;
use common::{Exchange, MSG};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    common::main_as("rdma_server", run).await
}

/// The next completion, which must be a successful `want`.
async fn next(x: &Exchange, want: CompletionOp) -> Result<Completion> {
    let c = x.next().await?;
    ensure!(c.op == want, "expected a {want:?} completion, got {c:?}");
    Ok(c)
}

async fn run(local: SocketAddr) -> Result<()> {
    let adapter = Adapter::open_default().await.context("opening soft-rdmad")?;
    let listener = adapter.create_listener().await?;
    listener
        .listen(local, 0)
        .await
        .with_context(|| format!("rdma_listen on {local}"))?;
    let connector = adapter.create_connector().await?;
    let request = listener.get_connection_request(&connector).await?;
    let x = Exchange::new(&adapter).await?;
    let limits = ReadLimits {
        inbound: request.limits.inbound.min(1),
        outbound: request.limits.outbound.min(1),
    };
    connector
        .accept_qp(&x.qp, limits, &[])
        .await
        .context("rdma_accept")?;
    let c = next(&x, CompletionOp::Receive).await?;
    ensure!(c.bytes == MSG, "received {} bytes, expected {MSG}", c.bytes);
    x.send()?;
    next(&x, CompletionOp::Send).await?;
    common::disconnect(&connector).await
}
