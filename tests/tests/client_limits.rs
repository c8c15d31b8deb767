//! One permitted client must not be able to crash or starve soft-rdmad (issue 22): real daemons with their
//! limits set low (README "Limits"), a hostile but permitted client going past each one (raw Unix-socket
//! frames from `soft_rdma_tests::local`, or the client library), and for every limit three checks: the
//! attacker gets the specific error docs/protocol.md names, the daemon survives, and another session is
//! still served. Needs root (namespaces, `setpriv`, `prlimit` on the daemon) and the built binaries
//! (`cargo build -p soft-rdma-user`).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::path::PathBuf;

use soft_rdma::client::Adapter;
use soft_rdma::engine::limits::ResourceStatus;
use soft_rdma::engine::requests::RequestId;
use soft_rdma::engine::verbs::Access;
use soft_rdma::status::StatusReport;
use soft_rdma::uds::messages::{Request as CmRequest, Response as CmResponse};
use soft_rdma::uds::proto::{ClientMessage, PROTOCOL_VERSION, ServerMessage};
use soft_rdma::{Error, NdStatus};
use soft_rdma_tests::local::{Raw, cli_as_nobody, frame, hello, sparse_memfd, system_group};
use soft_rdma_tests::ops::{eventually, within};
use soft_rdma_tests::{Daemon, Side, TestNet};

/// A daemon on side A of a fresh namespace pair, with `args`, logging at info.
fn daemon(tag: &str, args: &[&str]) -> (TestNet, Daemon) {
    let net = TestNet::new(tag).expect("netns pair");
    let d = net
        .spawn_daemon_logging(Side::A, false, args, Some("info"))
        .expect("soft-rdmad");
    (net, d)
}

/// [`daemon`] and a victim's session on it (one that does nothing wrong), with the socket path the raw
/// clients connect to.
async fn with_victim(tag: &str, args: &[&str]) -> (TestNet, Daemon, PathBuf, Adapter) {
    let (net, d) = daemon(tag, args);
    let uds = d.uds_path().to_owned();
    let victim = Adapter::open(&uds).await.unwrap();
    (net, d, uds, victim)
}

fn status<T: std::fmt::Debug>(r: Result<T, Error>) -> NdStatus {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e.status,
    }
}

/// The error of `r`, which must be `want`.
fn refused<T: std::fmt::Debug>(r: Result<T, Error>, want: NdStatus, what: &str) -> Error {
    match r {
        Ok(v) => panic!("{what}: expected {want:?}, got Ok({v:?})"),
        Err(e) => {
            assert_eq!(e.status, want, "{what}: {e}");
            e
        }
    }
}

async fn resources(a: &Adapter) -> ResourceStatus {
    *a.status()
        .await
        .expect("status")
        .resources
        .expect("status carries the resource counters")
}

/// Two sessions on `d`: the attacker's and the victim's.
async fn two_sessions(d: &Daemon) -> (Adapter, Adapter) {
    let uds = d.uds_path();
    (
        Adapter::open(uds).await.unwrap(),
        Adapter::open(uds).await.unwrap(),
    )
}

/// The daemon is alive, and `victim` (a session that did nothing wrong) is still served: it creates and
/// closes a connector and asks for Status.
async fn survives(d: &mut Daemon, victim: &Adapter) -> StatusReport {
    assert!(d.is_running(), "soft-rdmad died:\n{}", d.log_text());
    let c = within("victim: CreateConnector", victim.create_connector())
        .await
        .expect("the victim is served");
    drop(c);
    within("victim: Status", victim.status()).await.expect("Status")
}

/// RegisterMemory of a fresh sealed sparse memfd of `len` bytes from a raw client: its answer.
fn register(raw: &mut Raw, id: u64, len: u64) -> Result<CmResponse, Error> {
    let f = frame(&ClientMessage::Request {
        id: RequestId(id),
        request: CmRequest::RegisterMemory {
            length: len,
            access: Access::LOCAL_WRITE,
            pd: Default::default(),
        },
    });
    let memfd = sparse_memfd(len);
    raw.send_with_fds(&f, &[memfd.as_fd()])
        .expect("RegisterMemory with its memfd");
    match raw.next_message() {
        Some(ServerMessage::Response { id: got, result }) if got.0 == id => result,
        other => panic!("RegisterMemory {id}: {other:?}"),
    }
}

const K: u64 = 1 << 10;

/// Defect 1: registered memory is bounded per session and daemon-wide, in bytes and in regions (each a
/// mapping in the daemon): a sparse 1 TiB memfd, or one region too many, is INSUFFICIENT_RESOURCES instead of
/// address space; a mapped region keeps no descriptor in the daemon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registered_memory_is_bounded_per_session_and_daemon_wide() {
    // Registered memory is the daemon's to hold where it runs the data path (XDP mode, or kernel mode with
    // `--data-path daemon`); handed-off connections' regions stay in the application's own memory.
    let (_net, mut d, uds, victim) = with_victim(
        "rmem",
        &[
            "--data-path",
            "daemon",
            "--max-registered-bytes-per-session",
            "1M",
            "--max-registered-bytes",
            "1536K",
            "--max-regions-per-session",
            "3",
            "--max-regions",
            "5",
        ],
    )
    .await;
    let mut a1 = Raw::connect(&uds);
    a1.hello();
    let fds_with_a1 = d.open_fds().unwrap();
    let e = refused(
        register(&mut a1, 1, 1 << 40),
        NdStatus::InsufficientResources,
        "a sparse 1 TiB region",
    );
    assert!(e.context.contains("--max-registered-bytes-per-session"), "{e}");
    for id in 2..5 {
        assert!(matches!(
            register(&mut a1, id, 256 * K),
            Ok(CmResponse::MemoryRegion { .. })
        ));
    }
    let e = refused(
        register(&mut a1, 5, 4 * K),
        NdStatus::InsufficientResources,
        "a fourth region",
    );
    assert!(e.context.contains("--max-regions-per-session"), "{e}");
    // Three regions that kept their memfds would be three more (one more is allowed for a descriptor the
    // daemon has open only for a moment).
    let now = d.open_fds().unwrap();
    assert!(
        now <= fds_with_a1 + 1,
        "three mapped regions hold no descriptor: {now} open, {fds_with_a1} before"
    );
    // Daemon-wide: 768 KiB of 1.5 MiB are registered.
    let mut a2 = Raw::connect(&uds);
    a2.hello();
    let e = refused(
        register(&mut a2, 1, 1024 * K),
        NdStatus::InsufficientResources,
        "past the daemon-wide bytes",
    );
    assert!(e.context.contains("(--max-registered-bytes)"), "{e}");
    assert!(register(&mut a2, 2, 512 * K).is_ok());
    let s = survives(&mut d, &victim).await;
    let r = s.resources.unwrap();
    assert_eq!((r.registered_bytes, r.regions), (1280 * K, 4));
    // The victim registers within what is left, and past the daemon-wide region count it is refused too.
    let mine = victim
        .register_memory(128 * 1024, Access::LOCAL_WRITE)
        .await
        .unwrap();
    assert_eq!(
        status(victim.register_memory(4096, Access::LOCAL_WRITE).await),
        NdStatus::InsufficientResources,
        "a sixth region daemon-wide"
    );
    // The attacker's regions go with its session.
    drop(a1);
    eventually("a1's regions released", || async {
        let r = resources(&victim).await;
        (r.registered_bytes == 640 * K && r.regions == 2).then_some(())
    })
    .await;
    drop(mine);
    victim.register_memory(4096, Access::LOCAL_WRITE).await.unwrap();
}

/// Defect 2: descriptors that no frame announces (here the client's own socket, beside a Query) are closed
/// at once and end the session with INVALID_PARAMETER, so the daemon never holds a client's end of its own
/// connection: whether the client reads the Goodbye or exits at once, its session and descriptors go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unannounced_descriptors_are_closed_and_end_the_session() {
    let (_net, mut d, uds, victim) = with_victim("unfd", &[]).await;
    let baseline = d.open_fds().unwrap();
    let query = frame(&ClientMessage::Request {
        id: RequestId(1),
        request: CmRequest::Query,
    });
    for reads_the_goodbye in [true, false] {
        let mut raw = Raw::connect(&uds);
        raw.hello();
        // A listener it holds must be released with the session.
        assert!(matches!(
            raw.request(2, CmRequest::CreateListener),
            Ok(CmResponse::Listener(_))
        ));
        let own = raw.s.as_fd().try_clone_to_owned().unwrap();
        raw.send_with_fds(&query, &[own.as_fd()]).unwrap();
        drop(own);
        if reads_the_goodbye {
            let e = raw.goodbye("its own socket, unannounced");
            assert_eq!(e.status, NdStatus::InvalidParameter);
            assert_eq!(e.context, "1 file descriptors arrived that no frame announces");
        }
        drop(raw);
        // (At most as many as before: the count may include a descriptor open only for a moment then.)
        eventually("the session and its descriptors are gone", || async {
            let s = victim.status().await.unwrap();
            (s.sessions == 1 && d.open_fds().is_some_and(|n| n <= baseline)).then_some(())
        })
        .await;
    }
    survives(&mut d, &victim).await;
}

/// Defect 3: the ports a session holds (each a socket in the daemon: bound connectors, listening listeners,
/// shared endpoints) are bounded per session: one more is INSUFFICIENT_RESOURCES; another session still
/// binds and listens; a closed one gives its port back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ports_per_session_are_bounded() {
    let (net, mut d) = daemon("ppss", &["--max-ports-per-session", "3"]);
    let (attacker, victim) = two_sessions(&d).await;
    let at = |port| net.addr(Side::A, port);
    let c1 = attacker.create_connector().await.unwrap();
    c1.bind(at(7000)).await.unwrap();
    let c2 = attacker.create_connector().await.unwrap();
    c2.bind(at(0)).await.unwrap();
    let l1 = attacker.create_listener().await.unwrap();
    l1.listen(at(7001), 16).await.unwrap();
    let c3 = attacker.create_connector().await.unwrap();
    let e = refused(
        c3.bind(at(7002)).await,
        NdStatus::InsufficientResources,
        "a fourth port",
    );
    assert!(e.context.contains("--max-ports-per-session"), "{e}");
    let l2 = attacker.create_listener().await.unwrap();
    refused(
        l2.listen(at(7003), 16).await,
        NdStatus::InsufficientResources,
        "a fourth port (Listen)",
    );
    refused(
        attacker.create_shared_endpoint(at(7004)).await,
        NdStatus::InsufficientResources,
        "a fourth port (shared endpoint)",
    );
    // Another session is not affected.
    let v = victim.create_connector().await.unwrap();
    v.bind(at(7002)).await.unwrap();
    let vl = victim.create_listener().await.unwrap();
    vl.listen(at(7003), 16).await.unwrap();
    survives(&mut d, &victim).await;
    // A port given back is the attacker's to use again.
    drop(c1);
    eventually("c1's port released", || async { c3.bind(at(7005)).await.ok() }).await;
}

/// Defect 3: connections without Hello and sessions are capped (INSUFFICIENT_RESOURCES in a Goodbye), and a
/// connection that never says Hello is ended (IO_TIMEOUT), after which new clients get in again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_and_connections_without_hello_are_capped() {
    let (_net, mut d, uds, victim) = with_victim(
        "caps",
        &[
            "--max-sessions",
            "4",
            "--max-pending-hellos",
            "2",
            // Long enough that the two idle connections still wait when the third comes.
            "--hello-timeout-ms",
            "3000",
        ],
    )
    .await;
    // Connections accepted in the order they were made: two idle ones take both pending slots.
    let (mut idle1, mut idle2) = (Raw::connect(&uds), Raw::connect(&uds));
    let mut third = Raw::connect(&uds);
    let e = third.goodbye("a third connection without Hello");
    assert_eq!(e.status, NdStatus::InsufficientResources);
    assert!(e.context.contains("--max-pending-hellos"), "{e}");
    for idle in [&mut idle1, &mut idle2] {
        let e = idle.goodbye("no Hello within the timeout");
        assert_eq!(e.status, NdStatus::IoTimeout);
        assert!(e.context.contains("--hello-timeout-ms"), "{e}");
    }
    eventually("the idle connections' slots are free", || async {
        let r = resources(&victim).await;
        (r.client_connections == 1 && r.pending_hellos == 0).then_some(r.refused_connections)
    })
    .await;
    // Sessions: the victim and three more; a fifth is refused.
    let two = Adapter::open(&uds).await.unwrap();
    let _three = Adapter::open(&uds).await.unwrap();
    let four = Adapter::open(&uds).await.unwrap();
    let e = refused(
        Adapter::open(&uds).await,
        NdStatus::InsufficientResources,
        "a fifth session",
    );
    assert!(e.context.contains("--max-sessions"), "{e}");
    survives(&mut d, &victim).await;
    four.query().await.unwrap();
    drop(two);
    eventually("a slot is free again", || async {
        Adapter::open(&uds).await.ok()
    })
    .await;
}

/// Defect 3: a frame left half-sent (its prefix only, or its prefix and part of its body) ends the session
/// with IO_TIMEOUT instead of holding it for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_frames_time_out() {
    let (_net, mut d, uds, victim) = with_victim("half", &["--frame-timeout-ms", "500"]).await;
    let whole = frame(&ClientMessage::Request {
        id: RequestId(1),
        request: CmRequest::Query,
    });
    for cut in [2, whole.len() - 1] {
        let mut raw = Raw::connect(&uds);
        raw.hello();
        raw.write(&whole[..cut]).unwrap();
        let e = raw.goodbye("a half-sent frame");
        assert_eq!(e.status, NdStatus::IoTimeout, "{cut} bytes: {e}");
        assert!(e.context.contains("--frame-timeout-ms"), "{e}");
    }
    // A client that pauses between whole frames is not cut off.
    let mut patient = Raw::connect(&uds);
    patient.hello();
    eventually("the half-sent sessions are gone", || async {
        (resources(&victim).await.client_connections == 2).then_some(())
    })
    .await;
    assert!(matches!(
        patient.request(1, CmRequest::Query),
        Ok(CmResponse::Adapter(_))
    ));
    survives(&mut d, &victim).await;
}

/// prlimit(2) on process `pid`'s RLIMIT_NOFILE: sets `new` if given; returns the limits it had.
fn prlimit_nofile(pid: u32, new: Option<&libc::rlimit>) -> libc::rlimit {
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    let new = new.map_or(std::ptr::null(), |n| n as *const libc::rlimit);
    // SAFETY: `new` is null or points to a valid rlimit; `old` is a valid rlimit to write.
    let rc = unsafe { libc::prlimit(pid as libc::pid_t, libc::RLIMIT_NOFILE, new, &mut old) };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
    old
}

/// The soft RLIMIT_NOFILE of process `pid` (the hard one stays, so that the old limit can come back);
/// returns the previous limits.
fn set_nofile(pid: u32, limit: libc::rlim_t) -> libc::rlimit {
    let old = prlimit_nofile(pid, None);
    let new = libc::rlimit {
        rlim_cur: limit,
        rlim_max: old.rlim_max,
    };
    prlimit_nofile(pid, Some(&new));
    old
}

fn restore_nofile(pid: u32, old: libc::rlimit) {
    prlimit_nofile(pid, Some(&old));
}

/// Defect 3: with its descriptor table full, soft-rdmad still answers a new client (INSUFFICIENT_RESOURCES
/// in a Goodbye, from the descriptor it keeps in reserve) instead of leaving it in the kernel's backlog; the
/// sessions it has keep being served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_is_answered_when_descriptors_run_out() {
    let (_net, mut d, uds, victim) = with_victim("fdrs", &[]).await;
    let pid = d.pid().unwrap();
    let old = set_nofile(pid, (d.open_fds().unwrap() + 3) as libc::rlim_t);
    let path = uds.clone();
    let (kept, error) = tokio::task::spawn_blocking(move || {
        let mut kept = Vec::new();
        for _ in 0..16 {
            let mut raw = Raw::connect(&path);
            // The daemon may have refused and closed already: the Goodbye is still there to read.
            let _ = raw.write(&frame(&hello(PROTOCOL_VERSION)));
            match raw.next_message() {
                Some(ServerMessage::Welcome { .. }) => kept.push(raw),
                Some(ServerMessage::Goodbye { error }) => return (kept, error),
                other => panic!("expected Welcome or Goodbye, got {other:?}"),
            }
        }
        panic!("16 clients accepted although the daemon had room for 3")
    })
    .await
    .unwrap();
    assert_eq!(error.status, NdStatus::InsufficientResources, "{error}");
    assert!(error.context.contains("out of file descriptors"), "{error}");
    // (How many got in depends on the holes in the daemon's descriptor numbers, which RLIMIT_NOFILE bounds.)
    // The sessions it has are served while the table is full.
    victim.query().await.unwrap();
    restore_nofile(pid, old);
    drop(kept);
    let s = survives(&mut d, &victim).await;
    assert!(s.resources.unwrap().refused_connections >= 1);
    // The next client is served at once: the daemon answered only the client that was waiting.
    let next = Adapter::open(&uds).await;
    assert!(next.is_ok(), "{next:?}\n{}", d.log_text());
}

/// Defect 4: the output queued for clients that do not read is bounded daemon-wide: a client pipelining
/// Status requests (each report some 10 KiB) without reading is paused once the daemon holds more than
/// --max-output-bytes for all clients, far below its own 4 MiB; others are served meanwhile; and nothing it
/// asked for is lost once it reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_output_is_bounded_daemon_wide() {
    const BUDGET: u64 = 256 * K;
    let (_net, mut d, uds, victim) = with_victim("outb", &["--max-output-bytes", "256K"]).await;
    let mut attacker = Raw::connect(&uds);
    attacker.hello();
    // Objects that make every Status report large.
    let (answers, _) = attacker.pipeline(1, vec![CmRequest::CreateConnector; 300]);
    assert!(answers.iter().all(Result::is_ok));
    const N: u64 = 2000;
    attacker.send_requests(1000, vec![CmRequest::Status; N as usize]);
    eventually("the attacker is paused", || async {
        (resources(&victim).await.output_pauses >= 1).then_some(())
    })
    .await;
    let report = survives(&mut d, &victim).await;
    let mut encoded = bytes::BytesMut::new();
    ServerMessage::Response {
        id: RequestId(1),
        result: Ok(CmResponse::Status(report.clone())),
    }
    .encode(&mut encoded);
    let r = report.resources.unwrap();
    assert!(
        r.queued_output_bytes <= BUDGET + 2 * encoded.len() as u64,
        "{} bytes queued; the budget is {BUDGET}, a report {} bytes",
        r.queued_output_bytes,
        encoded.len()
    );
    assert_eq!(r.max_output_bytes, BUDGET);
    // Reading, the attacker gets every answer.
    let got = tokio::task::spawn_blocking(move || {
        let mut got = 0;
        while got < N {
            match attacker.next_message() {
                Some(ServerMessage::Response { result, .. }) => {
                    assert!(matches!(result, Ok(CmResponse::Status(_))));
                    got += 1;
                }
                other => panic!("after {got} answers: {other:?}"),
            }
        }
        got
    })
    .await
    .unwrap();
    assert_eq!(got, N);
    eventually("nothing is queued any more", || async {
        (resources(&victim).await.queued_output_bytes == 0).then_some(())
    })
    .await;
}

/// Defect 4, completions: what a session can have outstanding (so the completions it can be owed) is bounded
/// by the work-queue entries of its queue pairs; past --max-queue-entries-per-session, CreateQueuePair is
/// INSUFFICIENT_RESOURCES; another session still creates its own, and closing one gives its entries back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_queue_entries_are_bounded_per_session() {
    // The daemon's work queues (where it runs the data path: XDP mode, `--data-path daemon`).
    let (_net, mut d) = daemon(
        "wqes",
        &["--data-path", "daemon", "--max-queue-entries-per-session", "8"],
    );
    let (attacker, victim) = two_sessions(&d).await;
    let cq = attacker.create_completion_queue(64).await.unwrap();
    let q1 = attacker.create_queue_pair(&cq, &cq, 4, 4).await.unwrap();
    let e = refused(
        attacker.create_queue_pair(&cq, &cq, 1, 1).await,
        NdStatus::InsufficientResources,
        "two more entries",
    );
    assert!(e.context.contains("--max-queue-entries-per-session"), "{e}");
    let vcq = victim.create_completion_queue(64).await.unwrap();
    let _v = victim.create_queue_pair(&vcq, &vcq, 4, 4).await.unwrap();
    survives(&mut d, &victim).await;
    drop(q1);
    eventually("q1's entries given back", || async {
        attacker.create_queue_pair(&cq, &cq, 2, 2).await.ok()
    })
    .await;
}

/// Completion queues may be as deep as kernel siw's (`SIW_MAX_CQE`, 3,276,800), libfabric RxM's default
/// 262,144 among them; their depths together are bounded per session: past --max-cq-entries-per-session,
/// CreateCompletionQueue is INSUFFICIENT_RESOURCES; another session still creates its own, and closing one
/// gives its entries back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_queue_entries_are_bounded_per_session() {
    let (_net, mut d) = daemon(
        "cqes",
        &["--data-path", "daemon", "--max-cq-entries-per-session", "3600000"],
    );
    let (attacker, victim) = two_sessions(&d).await;
    let deepest = attacker.create_completion_queue(3_276_800).await.unwrap();
    let _rxm = attacker.create_completion_queue(262_144).await.unwrap();
    let e = refused(
        attacker.create_completion_queue(100_000).await,
        NdStatus::InsufficientResources,
        "100,000 more entries",
    );
    assert!(e.context.contains("--max-cq-entries-per-session"), "{e}");
    let _v = victim.create_completion_queue(3_276_800).await.unwrap();
    survives(&mut d, &victim).await;
    drop(deepest);
    eventually("the deepest queue's entries given back", || async {
        attacker.create_completion_queue(100_000).await.ok()
    })
    .await;
}

/// Defect 5: a session's share of the ephemeral range is bounded (TOO_MANY_ADDRESSES past it, for port 0
/// and for explicit ports in the range alike); other sessions keep getting ephemeral ports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_gets_only_its_share_of_the_ephemeral_range() {
    let (net, mut d) = daemon("ephs", &["--max-ephemeral-ports-per-session", "3"]);
    let (attacker, victim) = two_sessions(&d).await;
    let any = net.addr(Side::A, 0);
    let mut held = Vec::new();
    for _ in 0..3 {
        let c = attacker.create_connector().await.unwrap();
        c.bind(any).await.unwrap();
        held.push(c);
    }
    let c = attacker.create_connector().await.unwrap();
    let e = refused(
        c.bind(any).await,
        NdStatus::TooManyAddresses,
        "a fourth ephemeral port",
    );
    assert!(e.context.contains("--max-ephemeral-ports-per-session"), "{e}");
    refused(
        c.bind(net.addr(Side::A, 60000)).await,
        NdStatus::TooManyAddresses,
        "an explicit port in the range",
    );
    c.bind(net.addr(Side::A, 7000)).await.unwrap();
    for _ in 0..3 {
        let v = victim.create_connector().await.unwrap();
        v.bind(any).await.unwrap();
        held.push(v);
    }
    let s = survives(&mut d, &victim).await;
    assert_eq!(s.ports_free, 16_384 - 6);
    drop(held.remove(0));
    let c = attacker.create_connector().await.unwrap();
    eventually("a port given back", || async { c.bind(any).await.ok() }).await;
}

/// Defect 6: a warning a peer can trigger at will ("bad MPA Request") is logged for the first few
/// occurrences and then at powers of two with the count (`repeated=n`), not once per occurrence; the peer's
/// connections are reset and the daemon keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_warnings_are_aggregated() {
    let (net, mut d) = daemon("warn", &[]);
    let uds = d.uds_path().to_owned();
    let victim = Adapter::open(&uds).await.unwrap();
    let listener = victim.create_listener().await.unwrap();
    let at: SocketAddr = net.addr(Side::A, 7100);
    listener.listen(at, 16).await.unwrap();
    const N: usize = 200;
    let ends = net.in_ns(Side::B, move || {
        (0..N)
            .map(|_| {
                let mut s = std::net::TcpStream::connect(at).expect("connect to the listener");
                s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
                    .unwrap();
                s.write_all(&[b'X'; 40]).unwrap();
                let mut buf = [0u8; 64];
                loop {
                    match s.read(&mut buf) {
                        Ok(0) => break "closed",
                        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break "reset",
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        other => panic!("a bad MPA Request got {other:?}"),
                    }
                }
            })
            .collect::<Vec<_>>()
    });
    assert_eq!(ends.len(), N);
    survives(&mut d, &victim).await;
    let log = d.log_text();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("bad MPA Request")).collect();
    // 1-5, then 8, 16, 32, 64, 128 (one episode: the connections come back to back).
    assert!(
        (6..=10).contains(&lines.len()),
        "{} lines for {N} bad Requests:\n{}",
        lines.len(),
        lines.join("\n")
    );
    assert!(
        lines.iter().any(|l| l.contains("repeated=128")),
        "{}",
        lines.join("\n")
    );
}

/// `status` shows every session's connectors and listeners to root and to the admin group only; any other
/// user sees the totals (sessions, ports, resources) but none of another user's objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_other_users_objects_only_to_admins() {
    let (group, gid) = system_group(None);
    let (admin, admin_gid) = system_group(Some(gid));
    let (net, d) = daemon("stvi", &["--group", &group, "--admin-group", &admin]);
    let uds = d.uds_path().to_owned();
    let root = Adapter::open(&uds).await.unwrap();
    let c = root.create_connector().await.unwrap();
    let l = root.create_listener().await.unwrap();
    l.listen(net.addr(Side::A, 7200), 4).await.unwrap();
    let seen = |groups: Vec<u32>| {
        let uds = uds.clone();
        async move {
            let (ok, out, err) =
                tokio::task::spawn_blocking(move || cli_as_nobody(&uds, &groups, &["status", "--json"]))
                    .await
                    .unwrap();
            assert!(ok, "status as nobody: {err}");
            let v: serde_json::Value = serde_json::from_str(&out).expect("status --json");
            let ids = |k: &str| -> Vec<u64> {
                v[k].as_array()
                    .unwrap()
                    .iter()
                    .map(|o| o["id"].as_u64().unwrap())
                    .collect()
            };
            (
                (ids("connectors"), ids("listeners")),
                v["sessions"].as_u64().unwrap(),
                v["resources"].clone(),
            )
        }
    };
    let (objects, sessions, resources) = seen(vec![gid]).await;
    assert_eq!(objects, (vec![], vec![]), "a user sees none of root's objects");
    assert_eq!(sessions, 2, "the totals are visible");
    assert!(resources["max_sessions"].as_u64().is_some(), "{resources}");
    let (objects, _, _) = seen(vec![gid, admin_gid]).await;
    assert_eq!(
        objects,
        (vec![c.id().0], vec![l.id().0]),
        "the admin group sees every session's"
    );
    let s = root.status().await.unwrap();
    assert_eq!(
        (s.connectors.len(), s.listeners.len()),
        (1, 1),
        "root sees everything"
    );
}
