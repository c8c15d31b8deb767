//! The client half of rdma-core's `rdma_server` / `rdma_client` example pair (librdmacm/examples), on
//! soft-rdma: connect to port 7471, post a 16-byte Receive, Send 16 bytes, wait for the Send and the
//! Receive to complete, disconnect. Works against `rdma_server` on kernel siw and against
//! `examples/rdma_server.rs`.
//!
//! ```text
//! cargo run --example rdma_client -- -s 10.98.1.2 [-p 7471]     (soft-rdmad's socket: $SOFT_RDMA_UDS)
//! ```
//! Prints `rdma_client: start`, then `rdma_client: end 0` on success, as rdma-core's does.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use clap::Parser;
use soft_rdma::NdStatus;
use soft_rdma::client::Adapter;
use soft_rdma::client::{Access, CompletionOp, ReadLimits};

/// rdma_client: a 16-byte Send/Receive exchange with rdma_server.
#[derive(Parser)]
struct Args {
    /// The server's address.
    #[arg(short = 's')]
    server: IpAddr,
    /// The server's port.
    #[arg(short = 'p', default_value_t = 7471)]
    port: u16,
}

/// rdma_client's message size.
const MSG: u32 = 16;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let a = Args::parse();
    println!("rdma_client: start");
    let r = run(SocketAddr::new(a.server, a.port)).await;
    println!("rdma_client: end {}", if r.is_ok() { 0 } else { -1 });
    r
}

async fn run(server: SocketAddr) -> Result<()> {
    let adapter = Adapter::open_default().await.context("opening soft-rdmad")?;
    let mr = adapter
        .register_memory(2 * MSG as usize, Access::LOCAL_WRITE)
        .await?;
    let cq = adapter.create_completion_queue(4).await?;
    let qp = adapter.create_queue_pair(&cq, &cq, 1, 1).await?;
    // rdma_client: the Receive is posted before rdma_connect.
    qp.receive(1, &[mr.sge(0, MSG)])?;
    let connector = adapter.create_connector().await?;
    let limits = ReadLimits {
        inbound: 1,
        outbound: 1,
    };
    connector
        .connect_qp(&qp, server, limits, &[])
        .await
        .with_context(|| format!("rdma_connect to {server}"))?;
    connector.complete_connect().await?;
    // The send message, as rdma_client's (static, so zeros).
    mr.fill(MSG as usize, MSG as usize, 0)?;
    qp.send(2, &[mr.sge(u64::from(MSG), MSG)])?;
    let mut sent = false;
    let mut received = None;
    while !sent || received.is_none() {
        let c = tokio::time::timeout(Duration::from_secs(30), cq.next())
            .await
            .context("no completion within 30 s")??;
        if c.status != NdStatus::Success {
            bail!("{:?} completed with {}", c.op, c.status);
        }
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
    // rdma_server and rdma_client both disconnect once their last completion is in; whoever comes second
    // finds the connection already gone (CONNECTION_INVALID), which is the exchange's normal end.
    match connector.disconnect().await {
        Err(e) if e.status == NdStatus::ConnectionInvalid => Ok(()),
        r => Ok(r?),
    }
}
