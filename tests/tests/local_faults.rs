//! Local faults: a client process killed with I/O in flight, the peer's daemon killed and the peer's host
//! gone mid-transfer, and the daemon restarted under its clients: real soft-rdmad daemons in a pair of
//! network namespaces, clients and daemons killed with SIGKILL. Every case checks that what did nothing wrong
//! keeps working and that nothing is left behind. Needs root (namespaces) and the built binaries
//! (`cargo build -p soft-rdma-user`).
//!
//! Each case runs under the transport pairings it says something about, whatever `$SOFT_RDMA_TEST_TRANSPORT`
//! says: `NAME::kernel` (both daemons over kernel TCP), `NAME::xdp` (both over XDP, the connections' TCP in
//! the daemons) and `NAME::mixed` (A over XDP, B over kernel TCP), one body `NAME(Transports)` for all.
//! Where the transports differ (where a killed daemon's TCP lived, what `status` can say of a connection's
//! TCP) the body says which it expects of which.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use soft_rdma::client::{Adapter, CompletionQueue, Connector, Listener, MemoryRegion, QueuePair};
use soft_rdma::engine::requests::{SessionId, TcpStatus};
// The protocol's own request and answer types, under the names this suite has always used for them.
use soft_rdma::engine::verbs::{Completion, CompletionOp, QueuePairState, WorkRequest};
use soft_rdma::{Error, NdStatus};
use soft_rdma_tests::ends::{Daemons, End, Transports, connect_pair};
use soft_rdma_tests::faults::*;
use soft_rdma_tests::ops::{completions, err_status as status, eventually, registered, within};
use soft_rdma_tests::{Side, cli_binary};

/// `NAME::PAIRING` for each pairing given (a [`Transports`] constant): a test running the body `NAME` with
/// those transports.
macro_rules! over {
    ($body:ident: $($pairing:ident => $t:ident),+ $(,)?) => {
        mod $body {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $pairing() {
                    super::$body(super::Transports::$t).await
                }
            )+
        }
    };
}

over!(a_client_killed_with_io_in_flight_leaves_nothing: kernel => KERNEL, xdp => XDP, mixed => MIXED);
over!(peer_daemon_killed_mid_transfer: kernel => KERNEL, xdp => XDP, mixed => MIXED);
// The case is A's TCP timers: B's transport does not matter.
over!(peer_host_gone_is_found_by_the_tcp_timeouts: kernel => KERNEL, xdp => XDP);
over!(daemon_restart_is_device_removed_then_reopen: kernel => KERNEL, xdp => XDP);

/// What `status` says of a connection's TCP (`tcp`, `what` in messages): TCP_INFO, which a kernel-mode
/// daemon reads from its copy of a socket it handed to a client; nothing from an XDP-mode daemon (`xdp`),
/// which runs its connections' TCP itself and hands none over. The TCP_INFO, where there is one.
fn handed_tcp(xdp: bool, tcp: Option<TcpStatus>, what: &str) -> Option<TcpStatus> {
    assert_eq!(tcp.is_some(), !xdp, "{what} (XDP mode: {xdp}): {tcp:?}");
    tcp
}

// ---------------------------------------------------------------------------------------------------------
// 6. A client process killed with I/O in flight.
// ---------------------------------------------------------------------------------------------------------

/// `soft-rdma perf write` (a separate process, a client of daemon A) streams 1 MiB RDMA Writes into a region
/// of a server this test runs on B (speaking perf's handshake: "SRPF", the region's STag and offset in the
/// Accept private data). The process is killed with SIGKILL while Writes are in flight: daemon A releases
/// its regions, queue pair, completion queue, connector and port, and B sees the disconnect.
async fn a_client_killed_with_io_in_flight_leaves_nothing(t: Transports) {
    let p = Daemons::start_over("kcli", t, &[], &[]).await;
    let (l, remote) = p.listen_b(7500).await;
    let log = std::fs::File::create(p.net.dir().join("perf.log")).unwrap();
    let mut perf = Command::new(cli_binary().expect("the soft-rdma CLI"))
        .arg("--uds")
        .arg(p.da.uds_path())
        .args(["perf", "write", &remote.to_string()])
        .args([
            "--size",
            "1m",
            "--iters",
            "1000000",
            "--depth",
            "16",
            "--timeout",
            "60",
        ])
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("soft-rdma perf");
    // The server side: perf's handshake, a 1 MiB landing region, nothing else to do.
    let cq = p.b.create_completion_queue(64).await.unwrap();
    let qp = p.b.create_queue_pair(&cq, &cq, 16, 16).await.unwrap();
    let region = p.b.register_memory(1 << 20, RW).await.unwrap();
    let c = p.b.create_connector().await.unwrap();
    let offer = within("perf's connect", l.get_connection_request(&c))
        .await
        .unwrap();
    assert_eq!(&offer.private_data[..4], b"SRPF", "perf's Connect private data");
    let mut answer = b"SRPF".to_vec();
    answer.extend_from_slice(&region.stag().0.to_be_bytes());
    answer.extend_from_slice(&0u64.to_be_bytes());
    answer.extend_from_slice(&0u32.to_be_bytes());
    c.accept_qp(&qp, LIMITS, &answer).await.unwrap();
    let c = Arc::new(c);
    let notified = watch_disconnect(&c);
    // Wait for Writes in flight, then kill the client.
    let check = p.a.clone();
    let (client, qp_id) = eventually("perf's Writes in flight", async || {
        let s = check.status().await.unwrap();
        s.queue_pairs
            .iter()
            .find(|q| {
                q.session != check.session().0 && q.stats.sq_outstanding > 0 && q.stats.bytes_sent > (4 << 20)
            })
            .map(|q| (SessionId(q.session), q.id))
    })
    .await;
    t.assert_in_force((&p.a, &p.b)).await;
    let s = p.a.status().await.unwrap();
    assert_eq!(
        held_by(&s, client),
        (1, 0, 1),
        "perf holds a connector and a queue pair: {s:?}"
    );
    assert!(s.memory_regions >= 2 && s.ports_in_use == 1, "{s:?}");
    // Status shows what the kernel says of each handed connection (TCP_INFO from the daemon's copy), once
    // 4 MiB went through: A's count of bytes sent is what went to its transport, which runs ahead of what
    // A's TCP has had acknowledged and B's queue pair has received.
    let (tcp, b_tcp) = eventually("4 MiB through perf's connection", async || {
        let tcp =
            p.a.status()
                .await
                .unwrap()
                .connectors
                .into_iter()
                .find(|c| c.session == client.0)
                .and_then(|c| c.tcp);
        let b_tcp =
            p.b.status()
                .await
                .unwrap()
                .connectors
                .into_iter()
                .find_map(|c| c.tcp);
        let through = qp.query().await.unwrap().stats.bytes_received > (4 << 20)
            && tcp.as_ref().is_none_or(|t| t.bytes_acked > (4 << 20))
            && b_tcp.as_ref().is_none_or(|t| t.bytes_received > (4 << 20));
        through.then_some((tcp, b_tcp))
    })
    .await;
    if let Some(tcp) = handed_tcp(t.a_xdp, tcp, "TCP_INFO of perf's connection in A's status") {
        assert!(tcp.rtt_us > 0 && tcp.snd_mss > 0 && tcp.snd_cwnd > 0, "{tcp:?}");
    }
    handed_tcp(t.b_xdp, b_tcp, "TCP_INFO of the test's connection in B's status");
    // perf's end of the connection, as B sees it.
    let perf_end =
        p.b.status()
            .await
            .unwrap()
            .connectors
            .iter()
            .find_map(|c| c.peer)
            .expect("B's connector with perf");
    perf.kill().expect("SIGKILL");
    let killed = Instant::now();
    let exit = perf.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&exit),
        Some(9),
        "perf was still running when killed: {}",
        std::fs::read_to_string(p.net.dir().join("perf.log")).unwrap_or_default()
    );
    let s = eventually("the killed client's objects released", async || {
        let s = p.a.status().await.unwrap();
        (s.sessions == 1 && s.ports_in_use == 0 && s.memory_regions == 0).then_some(s)
    })
    .await;
    let released = killed.elapsed();
    assert_eq!(held_by(&s, client), (0, 0, 0), "{s:?}");
    assert!(!s.queue_pairs.iter().any(|q| q.id == qp_id), "{s:?}");
    let (r, at) = within("B's NotifyDisconnect", notified).await.unwrap();
    r.unwrap();
    let seen = at.duration_since(killed);
    let q = qp.query().await.unwrap();
    assert_eq!(
        q.state,
        QueuePairState::Error,
        "B's queue pair after the disconnect: {q:?}"
    );
    assert!(q.stats.bytes_received > (4 << 20), "{q:?}");
    eprintln!("perf killed: daemon A released its objects in {released:?}, B saw the disconnect in {seen:?}");
    // The peer learns from A's close (a FIN or an RST on the wire), not from its own TCP timers.
    let how = ended_how(&p.db, perf_end).await;
    assert!(
        how == "peer_fin" || how == "peer_reset",
        "B learned of the disconnect by {how}, not by A's FIN/RST:\n{}",
        connection_log(&p.db)
    );
}

// ---------------------------------------------------------------------------------------------------------
// 7. The peer's daemon killed; the peer's host gone.
// ---------------------------------------------------------------------------------------------------------

/// A's queue pair with Receives posted, 64 RDMA Writes of 1 MiB and 8 RDMA Reads of 1 MiB outstanding.
/// Returns the work-request ids posted.
fn stream(qp: &QueuePair, local: &MemoryRegion, remote: &MemoryRegion) -> Vec<u64> {
    let mut ids = Vec::new();
    for i in 0..4 {
        qp.receive(1000 + i, &[local.sge(0, 64)]).unwrap();
        ids.push(1000 + i);
    }
    let mut batch = Vec::new();
    for i in 0..64u64 {
        batch.push(WorkRequest::Write {
            id: i,
            sgl: vec![local.sge(0, 1 << 20)],
            remote: remote.remote(0),
            silent: false,
        });
        ids.push(i);
        if i % 8 == 7 {
            let id = 500 + i / 8;
            batch.push(WorkRequest::Read {
                id,
                sink: local.sge(1 << 20, 1 << 20),
                remote: remote.remote(0),
                silent: false,
            });
            ids.push(id);
        }
    }
    qp.post(batch).unwrap();
    ids
}

/// A stream from A to B as §7 starts it: a connection through a listener of B's at B:7100, A's connector
/// shared with a NotifyDisconnect watcher, and [`stream`] posted and moving (more than `moving` bytes sent).
struct Streaming {
    listener: Listener,
    remote: SocketAddr,
    qp: QueuePair,
    cq: CompletionQueue,
    connector: Arc<Connector>,
    notified: tokio::task::JoinHandle<(Result<(), Error>, Instant)>,
    b: End,
    local: MemoryRegion,
    target: MemoryRegion,
    ids: Vec<u64>,
}

async fn streaming(p: &Daemons, moving: u64) -> Streaming {
    let (listener, remote) = p.listen_b(7100).await;
    let (a, b) = connected_ends(&p.a, &p.b, &listener, remote).await;
    let local = p.a.register_memory(2 << 20, RW).await.unwrap();
    let target = p.b.register_memory(1 << 20, RW).await.unwrap();
    let connector = Arc::new(a.connector);
    let notified = watch_disconnect(&connector);
    let ids = stream(&a.qp, &local, &target);
    eventually("bytes moving", async || {
        let q = a.qp.query().await.unwrap();
        (q.stats.bytes_sent > moving).then_some(())
    })
    .await;
    Streaming {
        listener,
        remote,
        qp: a.qp,
        cq: a.cq,
        connector,
        notified,
        b,
        local,
        target,
        ids,
    }
}

/// Waits for every posted work request of `qp` (in Error) to complete exactly once; returns the
/// completions.
async fn all_complete(cq: &CompletionQueue, qp: &QueuePair, ids: &[u64]) -> Vec<Completion> {
    let got = completions(cq, ids.len()).await;
    let mut seen: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
    seen.sort_unstable();
    let mut want = ids.to_vec();
    want.sort_unstable();
    assert_eq!(seen, want, "each work request completes exactly once");
    // And only once: a marker on each queue, posted now, is flushed at once (the queue pair is in Error);
    // a second completion of an earlier request would have come before them.
    // The highest ids an application may post (from 2^63 up they are the awaitable calls').
    const MARKS: [u64; 2] = [(1 << 63) - 2, (1 << 63) - 1];
    qp.receive(MARKS[0], &[]).unwrap();
    qp.send(MARKS[1], &[]).unwrap();
    let mut next: Vec<u64> = completions(cq, 2).await.iter().map(|c| c.wr_id).collect();
    next.sort_unstable();
    assert_eq!(next, MARKS, "and only once");
    got
}

/// What the survivor's work requests complete with once the connection is gone: Receives are flushed
/// (CANCELED); a Write or Read either made it before (SUCCESS) or is flushed (CANCELED); nothing else.
fn assert_flushed(got: &[Completion]) -> (usize, usize) {
    let mut flushed = 0;
    for c in got {
        match (c.op, c.status) {
            (CompletionOp::Receive, NdStatus::Canceled) => flushed += 1,
            (CompletionOp::Write | CompletionOp::Read, NdStatus::Success) => {}
            (CompletionOp::Write | CompletionOp::Read, NdStatus::Canceled) => flushed += 1,
            _ => panic!("unexpected completion after the peer went away: {c:?}"),
        }
    }
    (got.len() - flushed, flushed)
}

/// B's daemon is killed (SIGKILL) while A streams Writes and Reads to it. Over kernel TCP, B's kernel closes
/// the TCP connections at once (the process is gone, its host is not). Over XDP, B's TCP dies with the daemon
/// (and its XDP program with its last descriptor): B's kernel, which never knew the connections, answers
/// A's next segment with an RST, at once for the stream (A has data in flight), at A's first keepalive
/// probe for an idle connection. Either way A does not wait for its own TCP to give up: every outstanding
/// work request completes (flushed with CANCELED unless it finished first), NotifyDisconnect fires, the
/// queue pair is in Error, and A's port is released once the connector is. A new daemon on B listens on the
/// same port at once (even when the killed daemon's side of the connection is in TIME_WAIT: it closed
/// first) and A connects to it again.
async fn peer_daemon_killed_mid_transfer(t: Transports) {
    let mut p = Daemons::start_over("kpeer", t, &[], &[]).await;
    // An idle connection beside the stream (nothing unread when B dies: over kernel TCP, B's kernel sends a FIN,
    // not a reset, and B's end of it, port 7101, goes to TIME_WAIT).
    let (idle_l, idle_remote) = p.listen_b(7101).await;
    let (idle_a, idle_b) = connect_pair((&p.a, &p.b), idle_remote, &idle_l, (LIMITS, LIMITS)).await;
    let idle_a = Arc::new(idle_a);
    let idle_notified = tokio::spawn({
        let c = idle_a.clone();
        async move { c.notify_disconnect().await }
    });
    let Streaming {
        listener: l,
        remote,
        qp,
        cq,
        connector,
        notified,
        b: eb,
        local,
        target,
        ids,
    } = streaming(&p, 4 << 20).await;
    t.assert_in_force((&p.a, &p.b)).await;
    let killed = Instant::now();
    p.db.kill();
    let (r, at) = within("NotifyDisconnect", notified).await.unwrap();
    r.unwrap();
    let detected = at.duration_since(killed);
    let got = all_complete(&cq, &qp, &ids).await;
    let (ok, flushed) = assert_flushed(&got);
    assert!(flushed >= 4, "at least the Receives were flushed: {got:?}");
    assert_eq!(qp.query().await.unwrap().state, QueuePairState::Error);
    eprintln!(
        "B killed: A saw the disconnect after {detected:?}; {ok} requests had completed, {flushed} flushed"
    );
    // A killed process's sockets are closed by its kernel: A learns from a FIN or an RST (an RST where B had
    // unread data, or where B's TCP was the daemon's), not from its own TCP timers.
    let how = ended_how(&p.da, remote).await;
    assert!(
        how == "peer_fin" || how == "peer_reset",
        "A learned of B's death by {how}, not by B's kernel closing the connection:\n{}",
        connection_log(&p.da)
    );
    within("the idle connection's NotifyDisconnect", idle_notified)
        .await
        .unwrap()
        .unwrap();
    // Nothing unread at B: B's kernel ends it with a FIN, or (B over XDP) answers A's keepalive with an RST.
    let (idle_how, by) = if t.b_xdp {
        ("peer_reset", "B's kernel's RST")
    } else {
        ("peer_fin", "B's FIN")
    };
    assert_eq!(
        ended_how(&p.da, idle_remote).await,
        idle_how,
        "the idle connection ends with {by}:\n{}",
        connection_log(&p.da)
    );
    drop((eb, l, target, idle_l, idle_b));
    // The survivor's ports go when its connectors and queue pair do.
    drop((connector, qp, idle_a));
    eventually("A's ports released", async || {
        (p.a.status().await.unwrap().ports_in_use == 0).then_some(())
    })
    .await;
    // Over XDP, B's kernel never had the connection (and the daemon's TCP keeps no TIME_WAIT).
    let time_wait = if t.b_xdp {
        String::from("(none: B ran over XDP)")
    } else {
        eventually("B's end of the idle connection in TIME_WAIT", async || {
            let out = p
                .net
                .command(Side::B, "ss")
                .args(["-Htan", "state", "time-wait", "sport", "=", ":7101"])
                .output()
                .unwrap();
            let out = String::from_utf8_lossy(&out.stdout).into_owned();
            (!out.trim().is_empty()).then_some(out)
        })
        .await
    };
    // A new daemon on B: the same ports (7101 despite its TIME_WAIT), and A connects again.
    let db = t.spawn(&p.net, Side::B, &[]);
    let b = Adapter::open(db.uds_path()).await.unwrap();
    let idle_l = b.create_listener().await.unwrap();
    assert_eq!(
        idle_l.listen(idle_remote, 0).await.map_err(|e| e.to_string()),
        Ok(idle_remote),
        "listening on a port in TIME_WAIT:\n{time_wait}"
    );
    let l = b.create_listener().await.unwrap();
    assert_eq!(l.listen(p.net.addr(Side::B, 7100), 0).await.unwrap(), remote);
    let (ea, _eb) = connected_ends(&p.a, &b, &l, remote).await;
    let target = b.register_memory(1 << 20, RW).await.unwrap();
    write_read_round(&ea.qp, &ea.cq, &local, &target, 1).await;
    drop((ea, idle_l));
    p.db = db;
}

/// B's host goes away without a word (its veth goes down: no FIN, no RST ever arrives) while A has Writes in
/// flight. A finds out from its own TCP timers: a 20 s user timeout on unacknowledged data (kernel TCP's
/// TCP_USER_TIMEOUT, or the XDP transport's own TCP's) — the keepalive bounds the same for an idle
/// connection (kernel: idle 10 s, then 5 probes 2 s apart; XDP: idle 5 s, then 3 probes 5 s apart).
/// Everything outstanding is flushed as above.
async fn peer_host_gone_is_found_by_the_tcp_timeouts(t: Transports) {
    let p = Daemons::start_over("gone", t, &[], &[]).await;
    let st = streaming(&p, 2 << 20).await;
    t.assert_in_force((&p.a, &p.b)).await;
    let down = Command::new("ip")
        .args([
            "-n",
            &p.net.ns(Side::B),
            "link",
            "set",
            &p.net.dev(Side::B),
            "down",
        ])
        .status()
        .unwrap();
    assert!(down.success());
    let gone = Instant::now();
    let (r, at) = tokio::time::timeout(Duration::from_secs(60), st.notified)
        .await
        .expect("A notices within 60 s")
        .unwrap();
    r.unwrap();
    let detected = at.duration_since(gone);
    let got = all_complete(&st.cq, &st.qp, &st.ids).await;
    assert_flushed(&got);
    eprintln!("B's host gone: A saw the disconnect after {detected:?}");
    // Nothing came from B: A's own TCP gave up (ETIMEDOUT). With Writes unacknowledged that is the user
    // timeout (kernel TCP: TCP_USER_TIMEOUT, set on every connection: the kernel transport's unit tests read it
    // back); without it, retransmissions would go on for about 15 minutes, far past the 60 s hang guard above.
    assert_eq!(
        ended_how(&p.da, st.remote).await,
        "timed_out",
        "A learned that B's host was gone from its own TCP timers:\n{}",
        connection_log(&p.da)
    );
}

// ---------------------------------------------------------------------------------------------------------
// 8. The daemon restarted under its clients.
// ---------------------------------------------------------------------------------------------------------

/// soft-rdmad stops (SIGTERM: a Goodbye with DEVICE_REMOVED; then SIGKILL: the socket just closes, its file
/// left behind) under a client holding a connected connector with NotifyDisconnect pending, a listener with
/// GetConnectionRequest pending, a completion queue being waited on, a queue pair with Receives posted and
/// a memory region. Every pending request and every later call on every object fails with DEVICE_REMOVED,
/// the old session stays dead, and the client opens the adapter again on the new daemon (which replaces a
/// stale socket file) and connects as before. The peer sees the disconnect: at once over kernel TCP (the
/// client holds the connection and closes it) and on SIGTERM (the daemon closes its connections); when an
/// XDP-mode daemon is killed its TCP dies with it, and the peer's keepalive probe meets A's kernel's RST.
async fn daemon_restart_is_device_removed_then_reopen(t: Transports) {
    let mut p = Daemons::start_over("dead", t, &[], &[]).await;
    let (l, remote) = p.listen_b(7100).await;
    for how in ["SIGTERM", "SIGKILL"] {
        let a = Adapter::open(p.da.uds_path()).await.unwrap();
        let (ea, eb) = connected_ends(&a, &p.b, &l, remote).await;
        t.assert_in_force((&a, &p.b)).await;
        let mr = a.register_memory(4096, RW).await.unwrap();
        ea.qp.receive(1, &[mr.sge(0, 64)]).unwrap();
        let listener = a.create_listener().await.unwrap();
        listener.listen(p.net.addr(Side::A, 7200), 0).await.unwrap();
        let connector = Arc::new(ea.connector);
        let cq = Arc::new(ea.cq);
        let listener = Arc::new(listener);
        // Every pending request is registered with its daemon before A goes (B's NotifyDisconnect in
        // particular: after the disconnect it would be CONNECTION_INVALID).
        let pending_notify = tokio::spawn(
            registered(&a, {
                let c = connector.clone();
                async move { c.notify_disconnect().await }
            })
            .await,
        );
        let offered = a.create_connector().await.unwrap();
        let pending_offer = tokio::spawn(
            registered(&a, {
                let l = listener.clone();
                async move { l.get_connection_request(&offered).await.map(|_| ()) }
            })
            .await,
        );
        let pending_wait = tokio::spawn(
            registered(&a, {
                let cq = cq.clone();
                async move { cq.wait(1).await.map(|_| ()) }
            })
            .await,
        );
        let b_notify =
            tokio::spawn(registered(&p.b, async move { (eb.connector.notify_disconnect().await, eb) }).await);
        if how == "SIGTERM" {
            let exit = p.da.stop().expect("daemon A was running");
            assert!(exit.success(), "clean exit on SIGTERM: {exit:?}");
            assert!(!p.da.uds_path().exists(), "socket file removed");
        } else {
            p.da.kill().expect("daemon A was running");
            assert!(p.da.uds_path().exists(), "a killed daemon leaves its socket file");
        }
        for (what, r) in [
            (
                "NotifyDisconnect",
                within("pending", pending_notify).await.unwrap(),
            ),
            (
                "GetConnectionRequest",
                within("pending", pending_offer).await.unwrap(),
            ),
            (
                "CompletionQueue::wait",
                within("pending", pending_wait).await.unwrap(),
            ),
        ] {
            assert_eq!(status(r), NdStatus::DeviceRemoved, "{how}: pending {what}");
        }
        let (r, eb) = within("B's NotifyDisconnect", b_notify).await.unwrap();
        r.unwrap_or_else(|e| panic!("{how}: the peer sees the disconnect: {e}"));
        // Every object, every call.
        let removed = [
            ("connector", status(connector.local_addr().await)),
            ("connector", status(connector.disconnect().await)),
            (
                "listener",
                status(listener.listen(p.net.addr(Side::A, 7201), 0).await),
            ),
            ("listener", status(listener.cancel().await)),
            ("completion queue", status(cq.wait(1).await)),
            ("queue pair", status(ea.qp.query().await)),
            ("queue pair", status(ea.qp.receive(2, &[mr.sge(0, 64)]))),
            ("adapter", status(a.create_connector().await)),
            ("adapter", status(a.create_completion_queue(16).await)),
            ("adapter", status(a.register_memory(4096, RW).await)),
            ("adapter", status(a.query().await)),
        ];
        for (what, s) in removed {
            assert_eq!(s, NdStatus::DeviceRemoved, "{how}: {what}");
        }
        // A new daemon (on the same path): the old session stays dead, a new one works.
        p.da = t.spawn(&p.net, Side::A, &[]);
        assert_eq!(
            status(a.create_connector().await),
            NdStatus::DeviceRemoved,
            "{how}: no silent reconnect"
        );
        let again = Adapter::open(p.da.uds_path()).await.unwrap();
        let (ea2, _eb2) = connected_ends(&again, &p.b, &l, remote).await;
        let local = again.register_memory(8192, RW).await.unwrap();
        let target = p.b.register_memory(4096, RW).await.unwrap();
        write_read_round(&ea2.qp, &ea2.cq, &local, &target, 1).await;
        let l2 = again.create_listener().await.unwrap();
        l2.listen(p.net.addr(Side::A, 7200), 0).await.unwrap();
        drop((eb, ea2, l2, mr, ea.qp));
    }
}
