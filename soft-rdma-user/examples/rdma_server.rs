//! The server half of rdma-core's `rdma_server` / `rdma_client` example pair (librdmacm/examples), on
//! soft-rdma: listen on port 7471, take one connection request, post a 16-byte Receive, accept, wait for
//! the client's 16 bytes, Send 16 bytes back, wait for the Send, disconnect. Works against `rdma_client` on
//! kernel siw and against `examples/rdma_client.rs`.
//!
//! ```text
//! cargo run --example rdma_server -- -s 10.98.1.1 [-p 7471]     (soft-rdmad's socket: $SOFT_RDMA_UDS)
//! ```
//! Prints `rdma_server: start`, then `rdma_server: end 0` on success, as rdma-core's does.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use clap::Parser;
use soft_rdma::NdStatus;
use soft_rdma::client::{Access, Completion, CompletionOp, ReadLimits};
use soft_rdma::client::{Adapter, CompletionQueue};

/// rdma_server: a 16-byte Send/Receive exchange with rdma_client.
#[derive(Parser)]
struct Args {
    /// The address to listen on.
    #[arg(short = 's')]
    server: IpAddr,
    /// The port to listen on.
    #[arg(short = 'p', default_value_t = 7471)]
    port: u16,
}

/// rdma_server's message size.
const MSG: u32 = 16;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let a = Args::parse();
    println!("rdma_server: start");
    let r = run(SocketAddr::new(a.server, a.port)).await;
    println!("rdma_server: end {}", if r.is_ok() { 0 } else { -1 });
    r
}

async fn next(cq: &CompletionQueue, want: CompletionOp) -> Result<Completion> {
    let c = tokio::time::timeout(Duration::from_secs(30), cq.next())
        .await
        .context("no completion within 30 s")??;
    if c.status != NdStatus::Success {
        bail!("{:?} completed with {}", c.op, c.status);
    }
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
    let mr = adapter
        .register_memory(2 * MSG as usize, Access::LOCAL_WRITE)
        .await?;
    let cq = adapter.create_completion_queue(4).await?;
    let qp = adapter.create_queue_pair(&cq, &cq, 1, 1).await?;
    qp.receive(1, &[mr.sge(0, MSG)])?;
    let limits = ReadLimits {
        inbound: request.limits.inbound.min(1),
        outbound: request.limits.outbound.min(1),
    };
    connector
        .accept_qp(&qp, limits, &[])
        .await
        .context("rdma_accept")?;
    let c = next(&cq, CompletionOp::Receive).await?;
    ensure!(c.bytes == MSG, "received {} bytes, expected {MSG}", c.bytes);
    mr.fill(MSG as usize, MSG as usize, 0)?;
    qp.send(2, &[mr.sge(u64::from(MSG), MSG)])?;
    next(&cq, CompletionOp::Send).await?;
    // rdma_server and rdma_client both disconnect once their last completion is in; whoever comes second
    // finds the connection already gone (CONNECTION_INVALID), which is the exchange's normal end.
    match connector.disconnect().await {
        Err(e) if e.status == NdStatus::ConnectionInvalid => Ok(()),
        r => Ok(r?),
    }
}
