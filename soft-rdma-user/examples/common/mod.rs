//! What `rdma_client.rs` and `rdma_server.rs` share: their arguments, the 16-byte message, the
//! start/end lines rdma-core's examples print, the buffers both post, waiting for one completion, and
//! the disconnect that ends the exchange.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use soft_rdma::NdStatus;
use soft_rdma::client::{Access, Adapter, Completion, CompletionQueue, Connector, MemoryRegion, QueuePair};

/// A 16-byte Send/Receive exchange between rdma_client and rdma_server.
#[derive(Parser)]
pub struct Args {
    /// The server's address (rdma_client) or the address to listen on (rdma_server).
    #[arg(short = 's')]
    pub server: IpAddr,
    /// The server's port (rdma_client) or the port to listen on (rdma_server).
    #[arg(short = 'p', default_value_t = 7471)]
    pub port: u16,
}

/// The message size of rdma-core's rdma_client and rdma_server.
pub const MSG: u32 = 16;

/// Parses the arguments and runs `run` on the address they name, between the `<name>: start` and
/// `<name>: end 0` (or `end -1`) lines rdma-core's examples print.
pub async fn main_as<F, Fut>(name: &str, run: F) -> Result<()>
where
    F: FnOnce(SocketAddr) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let a = Args::parse();
    println!("{name}: start");
    let r = run(SocketAddr::new(a.server, a.port)).await;
    println!("{name}: end {}", if r.is_ok() { 0 } else { -1 });
    r
}

/// One side's buffers: a region of two messages (receive at 0, send at `MSG`), one completion queue for
/// both work queues, and a queue pair with the one Receive already posted.
pub struct Exchange {
    pub mr: MemoryRegion,
    pub cq: CompletionQueue,
    pub qp: QueuePair,
}

impl Exchange {
    /// Creates the buffers and posts the Receive (request id 1) of `MSG` bytes.
    pub async fn new(adapter: &Adapter) -> Result<Self> {
        let mr = adapter
            .register_memory(2 * MSG as usize, Access::LOCAL_WRITE)
            .await?;
        let cq = adapter.create_completion_queue(4).await?;
        let qp = adapter.create_queue_pair(&cq, &cq, 1, 1).await?;
        qp.receive(1, &[mr.sge(0, MSG)])?;
        Ok(Self { mr, cq, qp })
    }

    /// Sends (request id 2) the message, as rdma-core's examples do: static, so zeros.
    pub fn send(&self) -> Result<()> {
        self.mr.fill(MSG as usize, MSG as usize, 0)?;
        self.qp.send(2, &[self.mr.sge(u64::from(MSG), MSG)])?;
        Ok(())
    }

    /// The next completion, which must come within 30 s and be a success.
    pub async fn next(&self) -> Result<Completion> {
        let c = tokio::time::timeout(Duration::from_secs(30), self.cq.next())
            .await
            .context("no completion within 30 s")??;
        if c.status != NdStatus::Success {
            bail!("{:?} completed with {}", c.op, c.status);
        }
        Ok(c)
    }
}

/// Disconnects. rdma_server and rdma_client both disconnect once their last completion is in; whoever
/// comes second finds the connection already gone (CONNECTION_INVALID), which is the exchange's normal
/// end.
pub async fn disconnect(connector: &Connector) -> Result<()> {
    match connector.disconnect().await {
        Err(e) if e.status == NdStatus::ConnectionInvalid => Ok(()),
        r => Ok(r?),
    }
}
