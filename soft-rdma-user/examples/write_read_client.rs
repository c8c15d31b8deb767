//! The client of the README's example: connects to `write_read_server`, reads the `BufferDescriptor` the
//! server's Accept carried, RDMA-Writes 64 KiB into that window, RDMA-Reads them back into its own memory,
//! checks them, and Sends "done".
//!
//! ```text
//! write_read_client ADDR:PORT     the server's, e.g. 10.0.0.2:7471; soft-rdmad's socket: $SOFT_RDMA_UDS
//! ```
//!
//! Exits 1 with a message on stderr when anything fails, 2 on a bad command line. Needs only the `client`
//! feature and tokio's `macros` and `rt`.

use std::process::ExitCode;

use soft_rdma::client::{Access, Adapter, BufferDescriptor, ReadLimits};

const LEN: usize = 64 << 10; // what the client writes: byte i is i % 251

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let Some(addr) = std::env::args().nth(1) else {
        eprintln!("usage: write_read_client ADDR:PORT (the server's address)");
        return ExitCode::from(2);
    };
    match run(&addr).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("write_read_client: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(addr: &str) -> Result<(), Box<dyn std::error::Error>> {
    let adapter = Adapter::open_default().await?;
    let cq = adapter.create_completion_queue(16).await?;
    let qp = adapter.create_queue_pair(&cq, &cq, 16, 16).await?;
    let mr = adapter.register_memory(2 * LEN, Access::LOCAL_WRITE).await?; // LOCAL_WRITE: the Read lands here
    let connector = adapter.create_connector().await?;
    let limits = ReadLimits::new(4, 4); // Reads in flight each way
    connector.connect_qp(&qp, addr.parse()?, limits, b"").await?;
    let window = BufferDescriptor::from_bytes(&connector.private_data().await?)?;
    connector.complete_connect().await?; // Sends, Writes and Reads may go from here on
    println!("connected to {addr}; the server advertised {window}");
    let data: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    mr.write_at(0, &data)?;
    qp.write_async(&[mr.slice(..LEN)?], window).await?; // checked against the window first
    println!("wrote {LEN} bytes at the start of the window");
    qp.read_async(mr.slice(LEN..)?, window).await?;
    if mr.to_vec(LEN, LEN)? != data {
        return Err("the bytes read back differ from those written".into());
    }
    println!("read them back: they match");
    mr.write_at(0, b"done")?;
    qp.send_async(&[mr.slice(..4)?]).await?;
    println!("sent \"done\"");
    connector.disconnect().await?;
    Ok(())
}
