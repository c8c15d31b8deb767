//! What an application sees of the client library, end to end between two namespaces with real daemons:
//! the example server and client a newcomer copies (run as the built example binaries, and shown by the
//! README), the awaitable calls beside verbs-style posting on one completion queue, the completion queue as
//! a `Stream`, the buffer descriptor's local checks, and how an awaitable call fails. The daemons' transport
//! follows `$SOFT_RDMA_TEST_TRANSPORT` (kernel TCP: the data path in the application; XDP: in soft-rdmad,
//! through the shared rings). Needs root, and the examples built (`cargo build -p soft-rdma-user
//! --examples`).

use std::pin::Pin;
use std::process::{Output, Stdio};

use futures_core::Stream;
use soft_rdma::NdStatus;
use soft_rdma::client::{
    Access, BufferDescriptor, CompletionOp, MemoryRegion, ReadLimits, RemoteBuffer, Stag,
};
use soft_rdma_tests::ends::{Daemons, End, assert_steered, listen_and_connect_ok, steering};
use soft_rdma_tests::ops::{completions, err_status, pattern, within};
use soft_rdma_tests::{Daemon, Side, TestNet, example_binary};
use tokio::io::{AsyncBufReadExt, BufReader};

const PORT: u16 = 7471;
const LIMITS: ReadLimits = ReadLimits::new(4, 4);

/// Example `name` in `side`'s namespace, talking to `daemon`, with `args`; its output piped, killed if the
/// test ends first.
fn example(net: &TestNet, side: Side, daemon: &Daemon, name: &str, args: &[&str]) -> tokio::process::Child {
    let bin = example_binary(name).unwrap_or_else(|e| panic!("{e:#}"));
    let mut c = tokio::process::Command::from(net.command(side, bin.to_str().expect("a UTF-8 path")));
    c.args(args)
        .env("SOFT_RDMA_UDS", daemon.uds_path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    c.spawn().unwrap_or_else(|e| panic!("cannot start {name}: {e}"))
}

/// Its output, as text.
fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The README's example, as CI runs it: `write_read_server` on B, `write_read_client` on A. Both exit 0;
/// the client wrote 64 KiB into the window the server advertised and read them back, the server found
/// them there after the client's "done"; both printed the same descriptor. Then what a newcomer sees
/// when it goes wrong: no server (exit 1, the status on stderr), no address (exit 2, the usage).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_server_and_client_between_two_namespaces() {
    let p = Daemons::start("exmp", &[], &[]).await;
    let before = (steering(&p.a).await, steering(&p.b).await);
    let at = p.net.addr(Side::B, PORT).to_string();
    let mut server = example(&p.net, Side::B, &p.db, "write_read_server", &[&at]);
    let mut lines = BufReader::new(server.stdout.take().expect("piped")).lines();
    let listening = within("the server listening", lines.next_line()).await.unwrap();
    assert_eq!(listening, Some(format!("listening on {at}")));
    let client = example(&p.net, Side::A, &p.da, "write_read_client", &[&at]);
    let client = within("the example client", client.wait_with_output())
        .await
        .unwrap();
    let (out, err) = text(&client);
    assert!(client.status.success(), "write_read_client failed:\n{out}{err}");
    let mut served = Vec::new();
    while let Some(line) = within("the server's output", lines.next_line()).await.unwrap() {
        served.push(line);
    }
    let server = within("the example server", server.wait_with_output())
        .await
        .unwrap();
    let (_, server_err) = text(&server);
    assert!(
        server.status.success(),
        "write_read_server failed:\n{served:?}\n{server_err}"
    );

    let printed: Vec<&str> = out.lines().collect();
    let advertised = |line: &str| line.split_once("advertised ").map(|(_, d)| d.to_owned());
    let window = advertised(printed[0]).expect("the client names the window");
    assert!(window.starts_with("1048576 bytes at STag 0x") && window.ends_with(" offset 0x0 (read, write)"));
    assert_eq!(
        printed,
        [
            format!("connected to {at}; the server advertised {window}").as_str(),
            "wrote 65536 bytes at the start of the window",
            "read them back: they match",
            "sent \"done\"",
        ]
    );
    assert_eq!(served.len(), 2, "{served:?}");
    assert!(served[0].starts_with("accepted 10.200."), "{served:?}");
    assert_eq!(
        advertised(&served[0]),
        Some(window),
        "both sides name the same window"
    );
    assert_eq!(
        served[1],
        "the client said \"done\"; the 65536 bytes it wrote are in the region"
    );
    assert_steered(&p.a, Side::A, before.0).await;
    assert_steered(&p.b, Side::B, before.1).await;

    // Nobody listens any more: the connect is refused, and the client says so.
    let refused = example(&p.net, Side::A, &p.da, "write_read_client", &[&at]);
    let refused = within("the refused client", refused.wait_with_output())
        .await
        .unwrap();
    let (_, err) = text(&refused);
    assert_eq!(refused.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with("write_read_client: ND_CONNECTION_REFUSED (0xC0000236)"),
        "{err}"
    );
    let usage = example(&p.net, Side::A, &p.da, "write_read_client", &[]);
    let usage = within("the client without arguments", usage.wait_with_output())
        .await
        .unwrap();
    let (_, err) = text(&usage);
    assert_eq!(usage.status.code(), Some(2), "{err}");
    assert!(err.starts_with("usage: write_read_client ADDR:PORT"), "{err}");
}

/// The README shows the examples' code: each paragraph of each of its Rust blocks that names an example
/// file is in that file, verbatim, so that what a newcomer copies from the README compiles and is what CI
/// runs.
#[test]
fn the_readme_shows_the_examples_code() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let mut shown = 0;
    for block in readme.split("```rust\n").skip(1) {
        let block = block.split("```").next().unwrap();
        let Some(file) = block
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("// soft-rdma-user/examples/"))
            .and_then(|l| l.split_whitespace().next())
        else {
            continue;
        };
        let source = std::fs::read_to_string(root.join("soft-rdma-user/examples").join(file)).unwrap();
        for paragraph in block.split_once('\n').unwrap().1.split("\n\n") {
            assert!(
                source.contains(paragraph.trim_end()),
                "README.md shows, for {file}:\n{paragraph}\nwhich is not in the file"
            );
        }
        shown += 1;
    }
    assert_eq!(
        shown, 2,
        "README.md shows write_read_server.rs and write_read_client.rs"
    );
}

/// Regions on B for A to reach: a window the peer may read and write, and a read-only one; A's source and
/// sink.
struct Regions {
    window: MemoryRegion,
    read_only: MemoryRegion,
    source: MemoryRegion,
    sink: MemoryRegion,
}

async fn regions(a: &End, b: &End) -> Regions {
    let source = a.register(1 << 16).await;
    source.write_at(0, &pattern(1 << 16, 3)).unwrap();
    Regions {
        window: b.register(1 << 16).await,
        read_only: b
            .adapter
            .register_memory(4096, Access::REMOTE_READ)
            .await
            .unwrap(),
        source,
        sink: a.register(1 << 16).await,
    }
}

/// One completion queue, both styles: verbs-style Writes and Sends posted with the application's ids around
/// awaitable ones. Each awaitable call resolves to its own request's completion (an id the library
/// reserved), the queue delivers exactly the posted ones, and Receives of both styles take the Sends in
/// order. The queue works as a `Stream` too, and beside concurrent awaitable calls. Refused at once, with
/// nothing posted: a Send before the connection, a Write past the advertised window or into a window
/// without REMOTE_WRITE, an id the library reserves; the queue pair works on afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awaitable_calls_beside_posting_on_one_completion_queue() {
    let p = Daemons::start("await", &[], &[]).await;
    let before = (steering(&p.a).await, steering(&p.b).await);
    let (mut a, b) = (End::on(&p.a, 64, 16).await, End::on(&p.b, 64, 16).await);
    let r = regions(&a, &b).await;
    let (src, window) = (&r.source, r.window.descriptor(..).unwrap());
    assert_eq!(
        err_status(a.qp.send_async(&[src.slice(..4).unwrap()]).await),
        NdStatus::ConnectionInvalid
    );
    assert_eq!(
        err_status(a.qp.write(1, &[src.slice(..4).unwrap()], window.remote())),
        NdStatus::ConnectionInvalid
    );
    let inbox = b.register(64).await;
    b.qp.receive(7, &[inbox.slice(..32).unwrap()]).unwrap();
    let second = b.qp.receive_async(&[inbox.slice(32..).unwrap()]);
    listen_and_connect_ok(&a, &b, p.net.addr(Side::B, PORT), (LIMITS, LIMITS)).await;

    writes_posted_around_an_awaited_one(&a, &r).await;
    // Sends: awaited, then posted; B's posted Receive takes the first, its awaited one the second.
    src.write_at(0, b"one!two!").unwrap();
    within("an awaited Send", a.qp.send_async(&[src.slice(..4).unwrap()]))
        .await
        .unwrap();
    a.qp.send(8, &[src.slice(4..8).unwrap()]).unwrap();
    let got = completions(&b.cq, 1).await;
    assert_eq!((got[0].wr_id, got[0].bytes), (7, 4));
    assert_eq!(within("the awaited Receive", second).await.unwrap().bytes, 4);
    assert_eq!(inbox.to_vec(0, 4).unwrap(), b"one!");
    assert_eq!(inbox.to_vec(32, 4).unwrap(), b"two!");
    // The completion queue as a Stream: the posted Send's completion, then a posted Write's.
    a.qp.write(3, &[src.slice(..8).unwrap()], window.remote())
        .unwrap();
    for id in [8, 3] {
        let next = std::future::poll_fn(|cx| Pin::new(&mut a.cq).poll_next(cx));
        let c = within("the stream's next completion", next).await;
        assert_eq!(c.map(|c| (c.wr_id, c.status)), Some((id, NdStatus::Success)));
    }
    calls_and_a_wait_together(&a, &r).await;
    refused_before_posting(&a, &r).await;
    assert!(
        a.cq.poll(16).is_empty() && b.cq.poll(16).is_empty(),
        "nothing else completed"
    );
    assert_steered(&p.a, Side::A, before.0).await;
    assert_steered(&p.b, Side::B, before.1).await;
}

/// Writes posted (ids 1 and 2) around an awaited one, into B's window; then an awaited Read of all of it.
async fn writes_posted_around_an_awaited_one(a: &End, r: &Regions) {
    let (src, window) = (&r.source, r.window.descriptor(..).unwrap());
    a.qp.write(1, &[src.slice(..1024).unwrap()], window.remote())
        .unwrap();
    let awaited =
        a.qp.write_async(&[src.slice(1024..4096).unwrap()], window.slice(1024..).unwrap());
    let tail = window.slice(4096..).unwrap().remote();
    a.qp.write(2, &[src.slice(4096..).unwrap()], tail).unwrap();
    let c = within("the awaited Write", awaited).await.unwrap();
    assert_eq!(
        (c.op, c.status, c.bytes),
        (CompletionOp::Write, NdStatus::Success, 3072)
    );
    assert!(c.wr_id >= 1 << 63, "an id the library reserves: {c:?}");
    let posted: Vec<u64> = completions(&a.cq, 2).await.iter().map(|c| c.wr_id).collect();
    assert_eq!(posted, [1, 2]);
    let back = within(
        "an awaited Read",
        a.qp.read_async(r.sink.slice(..).unwrap(), window),
    )
    .await
    .unwrap();
    assert_eq!((back.op, back.bytes), (CompletionOp::Read, 1 << 16));
    assert_eq!(r.sink.to_vec(0, 1 << 16).unwrap(), pattern(1 << 16, 3));
    assert_eq!(r.window.to_vec(0, 1 << 16).unwrap(), pattern(1 << 16, 3));
}

/// Two awaitable calls and the application's wait on the one queue, many times over: over the shared
/// rings one of them sleeps on the doorbell and the others follow it, and none is left asleep.
async fn calls_and_a_wait_together(a: &End, r: &Regions) {
    let (src, window) = (&r.source, r.window.descriptor(..).unwrap());
    for round in 0..100u64 {
        a.qp.write(100 + round, &[src.slice(..64).unwrap()], window.remote())
            .unwrap();
        let (w, rd, c) = within("two awaitable calls and a wait, together", async {
            tokio::join!(
                a.qp.write_async(&[src.slice(..256).unwrap()], window),
                a.qp.read_async(r.sink.slice(..256).unwrap(), window),
                a.cq.next(),
            )
        })
        .await;
        assert_eq!((w.unwrap().bytes, rd.unwrap().bytes), (256, 256));
        assert_eq!(c.unwrap().wr_id, 100 + round);
    }
}

/// What is refused before anything is posted: a Write past the window's end or into a window without
/// REMOTE_WRITE, an id the library reserves. A Read of the read-only window still goes through.
async fn refused_before_posting(a: &End, r: &Regions) {
    let (src, window) = (&r.source, r.window.descriptor(..).unwrap());
    let past_the_end =
        a.qp.write_async(&[src.slice(..).unwrap()], window.slice(1..).unwrap())
            .await
            .unwrap_err();
    assert_eq!(past_the_end.status, NdStatus::AccessViolation);
    assert!(
        past_the_end
            .context
            .contains("65536 bytes does not fit the peer's 65535 bytes at STag"),
        "{past_the_end}"
    );
    let read_only = r.read_only.descriptor(..).unwrap();
    let not_granted =
        a.qp.write_async(&[src.slice(..4).unwrap()], read_only)
            .await
            .unwrap_err();
    assert!(
        not_granted.context.contains("without REMOTE_WRITE"),
        "{not_granted}"
    );
    assert_eq!(
        err_status(a.qp.send(1 << 63, &[src.slice(..4).unwrap()])),
        NdStatus::InvalidParameter
    );
    let c = within(
        "a Read of the read-only window",
        a.qp.read_async(r.sink.slice(..4096).unwrap(), read_only),
    )
    .await
    .unwrap();
    assert_eq!(c.bytes, 4096);
}

/// An awaitable call whose request fails resolves to an error with the completion's status and what to do:
/// a Read of an STag B never advertised terminates the stream (A's Read: REMOTE_ERROR), which flushes B's
/// awaited Receive (CANCELED). A dropped call's completion reaches nobody. When the daemon goes away, a
/// call still waiting fails with DEVICE_REMOVED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_awaitable_call_fails_with_its_completion_status() {
    let mut p = Daemons::start("afail", &[], &[]).await;
    let (a, b) = (End::on(&p.a, 64, 16).await, End::on(&p.b, 64, 16).await);
    let r = regions(&a, &b).await;
    let inbox = b.register(64).await;
    let flushed = b.qp.receive_async(&[inbox.slice(..).unwrap()]);
    listen_and_connect_ok(&a, &b, p.net.addr(Side::B, PORT), (LIMITS, LIMITS)).await;

    let stag = r.window.descriptor(..).unwrap().remote().stag;
    let stale = RemoteBuffer {
        stag: Stag(stag.0 ^ 0xff),
        offset: 0,
    };
    let stale = BufferDescriptor::new(stale, 4096, BufferDescriptor::ACCESS).unwrap();
    let e = within(
        "a Read of a stale STag",
        a.qp.read_async(r.sink.slice(..4096).unwrap(), stale),
    )
    .await
    .unwrap_err();
    assert_eq!(e.status, NdStatus::RemoteError, "{e}");
    assert!(e.context.starts_with("the RDMA Read on queue pair "), "{e}");
    assert!(e.context.contains("QueuePair::query shows the Terminate"), "{e}");
    let e = within("B's Receive, flushed", flushed).await.unwrap_err();
    assert_eq!(e.status, NdStatus::Canceled, "{e}");

    // Dropped: its completion (CANCELED: the queue pair is in Error) goes nowhere; a posted one still
    // reaches the queue.
    drop(a.qp.send_async(&[r.source.slice(..4).unwrap()]));
    a.qp.send(9, &[r.source.slice(..4).unwrap()]).unwrap();
    let c = completions(&a.cq, 1).await;
    assert_eq!((c[0].wr_id, c[0].status), (9, NdStatus::Canceled));
    assert!(
        a.cq.poll(16).is_empty(),
        "the dropped call's completion reached the queue"
    );

    let idle = End::on(&p.a, 8, 8).await;
    let waiting = idle.qp.receive_async(&[r.sink.slice(..64).unwrap()]);
    p.da.stop();
    let e = within("a Receive when the daemon is gone", waiting)
        .await
        .unwrap_err();
    assert_eq!(e.status, NdStatus::DeviceRemoved, "{e}");
    within("the session's end", idle.adapter.closed()).await;
    let e = within("a completion channel's wait", idle.cq.ready())
        .await
        .unwrap_err();
    assert_eq!(e.status, NdStatus::DeviceRemoved, "{e}");
}

/// Memory the application already has, registered in place (what `ibv_reg_mr` does for a C program): B
/// registers a buffer of its own with peers addressing it from its address (the iova rdma-core programs
/// advertise); A RDMA-Writes into it at that address and Reads it back, B Sends from it, and B finds A's
/// bytes in its own buffer. In XDP mode soft-rdmad reaches the buffer in this process. A Write below the
/// region's first tagged offset is outside the region: the stream ends with a Terminate, as siw's bounds
/// check (`addr < mem->va`) does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_the_application_owns_is_used_in_place() {
    const LEN: usize = 1 << 16;
    let p = Daemons::start("inplc", &[], &[]).await;
    let (a, b) = (End::on(&p.a, 64, 16).await, End::on(&p.b, 64, 16).await);
    let mut own = vec![0u8; LEN + 200];
    let base = std::ptr::NonNull::new(own.as_mut_ptr()).unwrap();
    let iova = base.as_ptr() as u64;
    let rw = Access::REMOTE_READ | Access::REMOTE_WRITE | Access::LOCAL_WRITE;
    // SAFETY: `own` outlives the region (dropped at the end of the test, after `window`).
    let window = unsafe { b.adapter.register_borrowed_memory(base, own.len(), iova, rw) }
        .await
        .unwrap();
    assert_eq!(window.len(), LEN + 200);
    let source = a.register(LEN).await;
    let data = pattern(LEN, 7);
    source.write_at(0, &data).unwrap();
    let sink = a.register(LEN).await;
    let inbox = a.register(64).await;
    let received = a.qp.receive_async(&[inbox.slice(..).unwrap()]);
    listen_and_connect_ok(&a, &b, p.net.addr(Side::B, PORT), (LIMITS, LIMITS)).await;

    let at = |offset: u64, len: u64| {
        let remote = RemoteBuffer {
            stag: window.stag(),
            offset: iova + offset,
        };
        BufferDescriptor::new(remote, len, BufferDescriptor::ACCESS).unwrap()
    };
    within(
        "the Write",
        a.qp.write_async(&[source.slice(..).unwrap()], at(100, LEN as u64)),
    )
    .await
    .unwrap();
    within(
        "the Read",
        a.qp.read_async(sink.slice(..).unwrap(), at(100, LEN as u64)),
    )
    .await
    .unwrap();
    assert_eq!(sink.to_vec(0, LEN).unwrap(), data, "read back through the peer");
    window.write_at(0, b"hi from B").unwrap();
    within("B's Send", b.qp.send_async(&[window.slice(..9).unwrap()]))
        .await
        .unwrap();
    let c = within("A's Receive", received).await.unwrap();
    assert_eq!(c.bytes, 9);
    assert_eq!(inbox.to_vec(0, 9).unwrap(), b"hi from B");
    // A completion channel's wait: ready when a completion is there, which it leaves for the poll.
    a.qp.receive(11, &[inbox.slice(..).unwrap()]).unwrap();
    b.qp.send(12, &[window.slice(..4).unwrap()]).unwrap();
    within("A's queue ready", a.cq.ready()).await.unwrap();
    within("A's queue still ready", a.cq.ready()).await.unwrap();
    let got = completions(&a.cq, 1).await;
    // (In XDP mode, A's Receive was in A's ring, maybe not yet in soft-rdmad's engine, when B's Send came.)
    assert_eq!(
        (got[0].wr_id, got[0].status),
        (11, NdStatus::Success),
        "{:?}",
        a.qp.query().await
    );
    // Armed from a thread outside the runtime (as a C program's), notified once the next one is there.
    a.qp.receive(13, &[inbox.slice(..).unwrap()]).unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let tx = std::sync::Mutex::new(Some(tx));
    let cq = &a.cq;
    std::thread::scope(|t| {
        t.spawn(|| {
            let notify = move || {
                if let Some(tx) = tx.lock().unwrap().take() {
                    let _ = tx.send(());
                }
            };
            cq.request_notification(false, std::sync::Arc::new(notify))
                .unwrap();
        });
    });
    b.qp.send(14, &[window.slice(..4).unwrap()]).unwrap();
    within("the notification", rx).await.unwrap();
    let got = completions(&a.cq, 1).await;
    assert_eq!((got[0].wr_id, got[0].status), (13, NdStatus::Success));
    // Solicited only: an unsolicited Send's Receive does not notify; a solicited one does.
    a.qp.receive(15, &[inbox.slice(..).unwrap()]).unwrap();
    a.qp.receive(16, &[inbox.slice(..).unwrap()]).unwrap();
    let (tx, mut rx) = tokio::sync::oneshot::channel();
    let tx = std::sync::Mutex::new(Some(tx));
    let notify = move || {
        if let Some(tx) = tx.lock().unwrap().take() {
            let _ = tx.send(());
        }
    };
    a.cq.request_notification(true, std::sync::Arc::new(notify))
        .unwrap();
    b.qp.send(17, &[window.slice(..4).unwrap()]).unwrap();
    let got = completions(&a.cq, 1).await;
    assert_eq!((got[0].wr_id, got[0].solicited), (15, false));
    assert!(rx.try_recv().is_err(), "notified for an unsolicited Send");
    b.qp.send_with(18, &[window.slice(..4).unwrap()], true, None)
        .unwrap();
    within("the solicited notification", rx).await.unwrap();
    let got = completions(&a.cq, 1).await;
    assert_eq!((got[0].wr_id, got[0].solicited), (16, true));

    // Below the first tagged offset: outside the region.
    let below = RemoteBuffer {
        stag: window.stag(),
        offset: iova - 1,
    };
    let below = BufferDescriptor::new(below, 16, BufferDescriptor::ACCESS).unwrap();
    let e = within(
        "a Write below the region",
        a.qp.write_async(&[source.slice(..16).unwrap()], below),
    )
    .await;
    // The Write itself may complete before the peer's Terminate arrives; the stream ends either way.
    if let Err(e) = e {
        assert!(
            matches!(e.status, NdStatus::RemoteError | NdStatus::Canceled),
            "{e}"
        );
    }
    let end = within("the Terminate", async {
        loop {
            let s = a.qp.query().await.unwrap();
            if let Some(t) = s.terminate {
                return t;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(end.from_peer, "{end:?}");
    drop(window);
    assert_eq!(&own[100..100 + LEN], &data[..], "A's bytes are in B's own buffer");
    assert_eq!(&own[..9], b"hi from B");
}
