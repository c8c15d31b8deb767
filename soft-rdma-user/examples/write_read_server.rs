//! The server of the README's example: registers 1 MiB, advertises it in the Accept's private data (a
//! `BufferDescriptor`), and waits for the client's "done"; by then the client has RDMA-Written 64 KiB into
//! the region and RDMA-Read them back, without this side doing anything. It checks the bytes, waits for the
//! client to disconnect, and exits 0.
//!
//! ```text
//! write_read_server ADDR:PORT     e.g. 10.0.0.2:7471; soft-rdmad's socket: $SOFT_RDMA_UDS
//! ```
//!
//! Exits 1 with a message on stderr when anything fails, 2 on a bad command line. Its client:
//! `write_read_client.rs`. Needs only the `client` feature and tokio's `macros` and `rt`.

use std::process::ExitCode;

use soft_rdma::client::{Access, Adapter, ReadLimits};

const LEN: usize = 64 << 10; // what the client writes: byte i is i % 251

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let Some(addr) = std::env::args().nth(1) else {
        eprintln!("usage: write_read_server ADDR:PORT (the address to listen on)");
        return ExitCode::from(2);
    };
    match serve(&addr).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("write_read_server: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(addr: &str) -> Result<(), Box<dyn std::error::Error>> {
    let adapter = Adapter::open_default().await?; // $SOFT_RDMA_UDS, else /run/soft-rdma/soft-rdmad.sock
    let listener = adapter.create_listener().await?;
    listener.listen(addr.parse()?, 0).await?;
    println!("listening on {addr}");
    let connector = adapter.create_connector().await?;
    let offer = listener.get_connection_request(&connector).await?;
    let cq = adapter.create_completion_queue(16).await?;
    let qp = adapter.create_queue_pair(&cq, &cq, 16, 16).await?; // send and receive depths
    let rw = Access::REMOTE_READ | Access::REMOTE_WRITE; // what the client may do to the region
    let mr = adapter.register_memory(1 << 20, rw).await?;
    let inbox = adapter.register_memory(4, Access::LOCAL_WRITE).await?; // LOCAL_WRITE: a Send lands here
    let done = qp.receive_async(&[inbox.slice(..)?]); // posted now: ready before the client can send
    let window = mr.descriptor(..)?; // all 1 MiB, as the client will see it
    let limits = ReadLimits::new(4, 4); // Reads in flight each way
    connector.accept_qp(&qp, limits, &window.to_bytes()).await?;
    println!("accepted {}; advertised {window}", offer.peer);
    done.await?; // the client's Send: its Write and Read came before it
    let written: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    if inbox.to_vec(0, 4)? != b"done" || mr.to_vec(0, LEN)? != written {
        return Err("the client's message is not \"done\", or its 64 KiB are not in the region".into());
    }
    println!("the client said \"done\"; the {LEN} bytes it wrote are in the region");
    connector.notify_disconnect().await?; // the client hangs up first: exiting now would race its Disconnect
    Ok(())
}
