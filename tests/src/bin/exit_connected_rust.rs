//! The client of `tests/c/exit_connected.c`, written on the Rust client library: connects to its server
//! (soft-rdmad's socket from `$SOFT_RDMA_UDS`), writes the advertised region whole in 1 MiB RDMA Writes,
//! Reads 8 bytes back (the Read Response follows the Writes: RFC 5040 §5.5), and returns from `main` with
//! its adapter, queue pair and connector alive. They are dropped as `main`'s runtime ends, and the library
//! must still tell soft-rdmad what the queue pair moved (docs/metrics.md). For the metrics suite.
//!
//! ```text
//! exit_connected_rust ADDR:PORT
//! ```

use std::process::ExitCode;

use soft_rdma::NdStatus;
use soft_rdma::client::{Access, Adapter, CompletionQueue, ReadLimits, RemoteBuffer, Stag};

const CHUNK: usize = 1 << 20;
/// Writes in flight at once.
const DEPTH: u32 = 16;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let Some(addr) = std::env::args().nth(1) else {
        eprintln!("usage: exit_connected_rust ADDR:PORT");
        return ExitCode::from(2);
    };
    match run(&addr).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("exit_connected_rust: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(addr: &str) -> Result<(), Box<dyn std::error::Error>> {
    let adapter = Adapter::open_default().await?;
    let cq = adapter.create_completion_queue(2 * DEPTH).await?;
    let qp = adapter.create_queue_pair(&cq, &cq, DEPTH, 1).await?;
    let connector = adapter.create_connector().await?;
    connector
        .connect_qp(&qp, addr.parse()?, ReadLimits::new(1, 1), b"")
        .await?;
    // The server's advertisement: address, rkey, length (big-endian; exit_connected.c's `struct advert`).
    let ad = connector.private_data().await?;
    let field = |at: usize, n: usize| ad.get(at..at + n).ok_or("the server advertised no region");
    let remote_base = u64::from_be_bytes(field(0, 8)?.try_into()?);
    let rkey = u32::from_be_bytes(field(8, 4)?.try_into()?);
    let len = u32::from_be_bytes(field(12, 4)?.try_into()?) as usize;
    connector.complete_connect().await?;
    let mr = adapter.register_memory(len + 8, Access::LOCAL_WRITE).await?;
    let data: Vec<u8> = (0..len).map(pattern).collect();
    mr.write_at(0, &data)?;
    println!("client: connected");
    let started = std::time::Instant::now();
    let remote = |offset: u64| RemoteBuffer {
        stag: Stag(rkey),
        offset,
    };
    let chunks: Vec<usize> = (0..len).step_by(CHUNK).collect();
    for batch in chunks.chunks(DEPTH as usize) {
        for &at in batch {
            let part = CHUNK.min(len - at) as u32;
            qp.write(
                at as u64,
                &[mr.sge(at as u64, part)],
                remote(remote_base + at as u64),
            )?;
        }
        check(&cq, batch.len()).await?;
    }
    qp.read(u64::from(u32::MAX), mr.sge(len as u64, 8), remote(remote_base))?;
    check(&cq, 1).await?;
    println!("client: wrote {len} bytes in {:?}", started.elapsed());
    // Returns with everything alive: no disconnect.
    Ok(())
}

/// Waits for `n` completions; all must be successful.
async fn check(cq: &CompletionQueue, n: usize) -> Result<(), Box<dyn std::error::Error>> {
    let mut got = Vec::new();
    while got.len() < n {
        got.extend(cq.wait(n - got.len()).await?);
    }
    if let Some(bad) = got.iter().find(|c| c.status != NdStatus::Success) {
        return Err(format!("a work request failed: {bad:?}").into());
    }
    Ok(())
}

/// Byte `i` of the transfer, as exit_connected.c's `pattern`.
fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(7) + i / 4099 + 3) as u8
}
