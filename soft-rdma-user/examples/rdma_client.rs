//! The client half of rdma-core's `rdma_server` / `rdma_client` example pair (librdmacm/examples), on
//! soft-rdma: connect to port 7471, post a 16-byte Receive, Send 16 bytes, wait for the Send and the
//! Receive to complete, disconnect. Works against `rdma_server` on kernel siw and against
//! `examples/rdma_server.rs`.
//!
//! ```text
//! cargo run --example rdma_client -- -s 10.98.1.2 [-p 7471]     (soft-rdmad's socket: $SOFT_RDMA_UDS)
//! ```
//! Prints `rdma_client: start`, then `rdma_client: end 0` on success, as rdma-core's does.

use std::net::SocketAddr;

use anyhow::{Context, Result, bail, ensure};
use soft_rdma::client::{Adapter, CompletionOp, ReadLimits};

#[path = "common/mod.rs"]
mod common;
use common::{Exchange, MSG};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    common::main_as("rdma_client", run).await
}

async fn run(server: SocketAddr) -> Result<()> {
    let adapter = Adapter::open_default().await.context("opening soft-rdmad")?;
    // rdma_client: the Receive is posted before rdma_connect.
    let x = Exchange::new(&adapter).await?;
    let connector = adapter.create_connector().await?;
    let limits = ReadLimits {
        inbound: 1,
        outbound: 1,
    };
    connector
        .connect_qp(&x.qp, server, limits, &[])
        .await
        .with_context(|| format!("rdma_connect to {server}"))?;
    connector.complete_connect().await?;
    x.send()?;
    let mut sent = false;
    let mut received = None;
    while !sent || received.is_none() {
        let c = x.next().await?;
        match c.op {
            CompletionOp::Send => sent = true,
            CompletionOp::Receive => received = Some(c.bytes),
            other => bail!("unexpected completion {other:?}"),
        }
    }
    ensure!(
        received == Some(MSG),
        "received {received:?} bytes, expected {MSG}"
    );
    common::disconnect(&connector).await
}
