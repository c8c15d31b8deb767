//! Progress that does not depend on the application (issue 30): a target whose only runtime thread is
//! blocked still has a peer's RDMA Writes placed in its memory, its Read Requests answered and, for a Write
//! it must refuse, its Terminate sent. In kernel-TCP mode the library's progress thread serves the
//! connection the blocked runtime leaves; in XDP mode (`SOFT_RDMA_TEST_TRANSPORT=xdp`) soft-rdmad runs the
//! data path and the tests pass without it.
//!
//! Nothing here is timed: the target's runtime runs on one thread of its own, which blocks on a std channel
//! that only the client's completed operations unblock (the client then asks the blocked thread to look
//! at its memory and completion queue through the same channel). Without progress the Read never
//! completes, and the step's hang guard fails the test. Needs root.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::mpsc;

use soft_rdma::NdStatus;
use soft_rdma::client::{Completion, CompletionOp, ReadLimits, RemoteBuffer, Stag, TerminateInfo};
use soft_rdma_common::wire::terminate::{ddp_code, ddp_type, layer};
use soft_rdma_tests::Side;
use soft_rdma_tests::ends::{Daemons, End};
use soft_rdma_tests::ops::{assert_ok, completions, pattern, terminated, within};
use tokio::sync::oneshot;

const PORT: u16 = 7490;
/// The target's region: room for the largest transfer at its offset.
const LEN: usize = (1 << 20) + 4096;
const LIMITS: ReadLimits = ReadLimits {
    inbound: 4,
    outbound: 4,
};
/// The Receive the target posts before it accepts.
const RECEIVE: u64 = 77;

/// What the client asks of the target's blocked thread.
enum Ask {
    /// Whether the target's region holds `want` at `offset`.
    Holds {
        offset: usize,
        want: Vec<u8>,
        reply: oneshot::Sender<bool>,
    },
    /// The completion of work request `wr_id` of the target's, polled for without yielding to the runtime
    /// (the client's hang guard bounds the wait).
    Completion {
        wr_id: u64,
        reply: oneshot::Sender<Completion>,
    },
    /// Let the runtime run again: the test is over.
    Resume,
}

/// The target: its own thread and current-thread runtime on B's daemon.
struct Target {
    /// Its region's STag.
    stag: Stag,
    asks: mpsc::Sender<Ask>,
    /// Fires once the target accepted and its runtime's thread blocks.
    blocked: oneshot::Receiver<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Target {
    /// Starts the target on the daemon at `uds`, listening at `addr`: a queue pair with one Receive posted,
    /// a region of [`LEN`] bytes holding `pattern(LEN, 1)`. It accepts one connection, then blocks its
    /// runtime's only thread on the client's asks until [`Ask::Resume`].
    async fn start(uds: PathBuf, addr: SocketAddr) -> Target {
        let (ready_tx, ready_rx) = oneshot::channel();
        let (blocked_tx, blocked) = oneshot::channel();
        let (asks, asked) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the target's runtime");
            rt.block_on(async move {
                let end = End::open(&uds, 64, 16).await;
                let mr = end.register(LEN).await;
                mr.write_at(0, &pattern(LEN, 1)).unwrap();
                end.qp.receive(RECEIVE, &[mr.sge(0, 64)]).unwrap();
                let listener = end.adapter.create_listener().await.unwrap();
                listener.listen(addr, 0).await.unwrap();
                ready_tx.send(mr.stag()).unwrap();
                listener.get_connection_request(&end.connector).await.unwrap();
                end.connector.accept_qp(&end.qp, LIMITS, b"").await.unwrap();
                blocked_tx.send(()).unwrap();
                // From here to Resume this runtime's only thread is blocked: nothing of it runs.
                serve_asks(&asked, &end, &mr);
            });
        });
        let stag = within("the target to listen", ready_rx).await.unwrap();
        Target {
            stag,
            asks,
            blocked,
            thread,
        }
    }

    /// What the target's blocked thread answers to the ask `make` builds.
    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Ask) -> T {
        let (reply, answer) = oneshot::channel();
        self.asks.send(make(reply)).expect("the target is there");
        within("the target's answer", answer).await.unwrap()
    }

    /// Lets the target's runtime go on, and waits for its thread to end.
    async fn resume(self) {
        self.asks.send(Ask::Resume).unwrap();
        let thread = self.thread;
        within(
            "the target's thread to end",
            tokio::task::spawn_blocking(move || thread.join()),
        )
        .await
        .unwrap()
        .expect("the target's thread did not panic");
    }
}

/// The target's blocked thread: answers asks until Resume, without ever yielding to its runtime.
fn serve_asks(asked: &mpsc::Receiver<Ask>, end: &End, mr: &soft_rdma::client::MemoryRegion) {
    while let Ok(ask) = asked.recv() {
        match ask {
            Ask::Holds { offset, want, reply } => {
                let _ = reply.send(mr.to_vec(offset, want.len()).unwrap() == want);
            }
            Ask::Completion { wr_id, reply } => loop {
                if let Some(c) = end.cq.poll(16).into_iter().find(|c| c.wr_id == wr_id) {
                    let _ = reply.send(c);
                    break;
                }
                // A blocking wait for a state, as the rest of this thread's: the runtime still never runs.
                std::thread::sleep(std::time::Duration::from_millis(1));
            },
            Ask::Resume => return,
        }
    }
}

/// Daemons in a fresh namespace pair, the target on B (blocked once connected) and the client's end on A,
/// connected to it.
async fn connected(tag: &str) -> (Daemons, Target, End) {
    let d = Daemons::start(tag, &[], &[]).await;
    let addr = d.net.addr(Side::B, PORT);
    let mut target = Target::start(d.db.uds_path().to_owned(), addr).await;
    let client = End::on(&d.a, 64, 16).await;
    within("connect", async {
        client.connector.connect_qp(&client.qp, addr, LIMITS, b"").await?;
        client.connector.complete_connect().await
    })
    .await
    .unwrap();
    within("the target to accept and block", &mut target.blocked)
        .await
        .unwrap();
    (d, target, client)
}

/// A blocked target's memory takes the client's RDMA Writes and serves its RDMA Reads: a 64 B and a
/// 1 MiB + 17 B Write, each Read back whole (the large Read's responses fill the target's socket, so its
/// output waits for room too); the bytes landed while the target's runtime never ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_target_takes_writes_and_serves_reads() {
    let (d, target, client) = connected("blkrw").await;
    let local = client.register(LEN).await;
    let back = client.register(LEN).await;
    for (i, (size, offset)) in [(64usize, 100u64), ((1 << 20) + 17, 4000)]
        .into_iter()
        .enumerate()
    {
        let data = pattern(size, 2 + i as u8);
        local.write_at(0, &data).unwrap();
        let remote = RemoteBuffer {
            stag: target.stag,
            offset,
        };
        let id = 10 * i as u64;
        client.qp.write(id, &[local.sge(0, size as u32)], remote).unwrap();
        client.qp.read(id + 1, back.sge(0, size as u32), remote).unwrap();
        let got = completions(&client.cq, 2).await;
        assert_ok(&got[0], id, CompletionOp::Write, size as u32);
        assert_ok(&got[1], id + 1, CompletionOp::Read, size as u32);
        assert!(
            back.to_vec(0, size).unwrap() == data,
            "the Read of {size} B gave back what was written"
        );
        let landed = target
            .ask(|reply| Ask::Holds {
                offset: offset as usize,
                want: data,
                reply,
            })
            .await;
        assert!(landed, "the {size} B Write is in the blocked target's region");
    }
    let untouched = target
        .ask(|reply| Ask::Holds {
            offset: 0,
            want: pattern(LEN, 1)[..100].to_vec(),
            reply,
        })
        .await;
    assert!(untouched, "bytes before the first Write are the target's own");
    within("the client's disconnect", client.connector.disconnect())
        .await
        .unwrap();
    target.resume().await;
    drop(d);
}

/// A blocked target refuses a Write to an STag it never registered: its Terminate (DDP, tagged buffer,
/// invalid STag) reaches the client, and its own queue pair is in Error, its Receive flushed, while its
/// runtime never ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_target_terminates_a_bad_write() {
    let (d, target, client) = connected("blkterm").await;
    let local = client.register(4096).await;
    let bogus = RemoteBuffer {
        stag: Stag(target.stag.0 ^ 0x55),
        offset: 0,
    };
    client.qp.write(1, &[local.sge(0, 100)], bogus).unwrap();
    let t: TerminateInfo = terminated(&client.qp).await;
    assert_eq!(
        (t.layer, t.error_type, t.code, t.from_peer),
        (
            layer::DDP,
            ddp_type::TAGGED_BUFFER,
            ddp_code::TAGGED_INVALID_STAG,
            true
        ),
        "the client got the target's Terminate"
    );
    let flushed = target
        .ask(|reply| Ask::Completion {
            wr_id: RECEIVE,
            reply,
        })
        .await;
    assert_eq!(
        flushed.status,
        NdStatus::Canceled,
        "the blocked target's Receive was flushed: {flushed:?}"
    );
    target.resume().await;
    drop(client);
    drop(d);
}
