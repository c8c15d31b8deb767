//! Load: thousands of concurrent connections between two real soft-rdmad daemons in a pair of network
//! namespaces (issue 7). Needs root. Each test has its own namespaces.
//!
//! - [`ten_thousand_connections_kernel`] / [`ten_thousand_connections_xdp`]: 10,000 connections, each with
//!   its queue pair, set up 256 at a time; a verified Send each way on every one; all torn down; both port
//!   spaces back to the listener's port alone, and the daemons' descriptors back to where they started.
//!   One session per side: A's holds 20,002 objects (10,000 connectors and queue pairs, one completion
//!   queue, one region), B's 20,003 (and the listener), within the 65,536 a session may hold. Each daemon
//!   holds a descriptor per connection (in XDP mode A's are the reserved ports, B has none): the test
//!   raises its RLIMIT_NOFILE, which the daemons inherit and raise to the hard limit.
//! - [`port_space_exhaustion_by_connections`]: 16,384 connections use every port of 49152-65535; the next
//!   Connect (and Bind) is TOO_MANY_ADDRESSES; ports freed by an active close stay in the host's TIME_WAIT
//!   and are not usable for a minute, ports freed by the peer's close are usable at once.
//! - [`out_of_descriptors_is_a_clear_error`]: a daemon at its RLIMIT_NOFILE answers INSUFFICIENT_RESOURCES
//!   (active side) or makes the peer's Connect fail with CONNECTION_REFUSED (passive side), never a hang.
//!
//! Each prints what it measured (setup rate, teardown time, daemon RSS and descriptors per connection, daemon
//! CPU while the connections sit idle) for the record; nothing is asserted about time. `within` only guards
//! against hangs. `SOFT_RDMA_LOAD_CONNECTIONS=N` (up to 16,384) changes the 10,000 of the first two.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use soft_rdma::client::{Adapter, CompletionQueue, Connector, Listener, MemoryRegion, QueuePair};
use soft_rdma::engine::requests::{ConnectorState, ReadLimits};
use soft_rdma::engine::verbs::{Access, Completion, CompletionOp, QueuePairId, QueuePairState};
use soft_rdma::status::StatusReport;
use soft_rdma::{Error, NdStatus};
use soft_rdma_tests::ops::{eventually, within_for};
use soft_rdma_tests::{Daemon, Side, TestNet, output_ok, raise_fd_limit};

/// The listener's port (outside the ephemeral range, so B's port space stays full).
const PORT: u16 = 7500;
/// Connects (and accepts) in flight at once.
const IN_FLIGHT: usize = 256;
/// Bytes per connection in each side's region: a receive slot and a send slot.
const SLOT: usize = 64;
/// The message each side sends on each connection.
const MSG: usize = 32;
const LIMITS: ReadLimits = ReadLimits {
    inbound: 1,
    outbound: 1,
};
/// The daemons' log filter: a debug line per connection would cost more than the connection.
const LOG: Option<&str> = Some("info");
/// One session here holds up to every port of the range: its shares (README "Limits") are all of it.
const WHOLE_PORT_SPACE: &[&str] = &[
    "--max-ephemeral-ports-per-session",
    "16384",
    "--max-ports-per-session",
    "65536",
];

/// How long the established connections sit idle while the daemons' CPU use is measured.
const IDLE: Duration = Duration::from_secs(5);

/// The tests of this file run one at a time: each wants the machine's cores to itself, for its numbers
/// and so that its hang guards do not measure the others.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn within<T>(what: &str, secs: u64, f: impl Future<Output = T>) -> T {
    within_for(Duration::from_secs(secs), what, f).await
}

fn status<T>(r: Result<T, Error>) -> Error {
    match r {
        Ok(_) => panic!("expected an error, got Ok"),
        Err(e) => e,
    }
}

/// The message `from` sends on connection `i`: its direction and index, then a pattern of both.
fn message(from: u8, i: usize) -> [u8; MSG] {
    let mut m = [0u8; MSG];
    m[0] = from;
    m[1..9].copy_from_slice(&(i as u64).to_le_bytes());
    for (k, b) in m.iter_mut().enumerate().skip(9) {
        *b = (i as u32).wrapping_mul(2_654_435_761).rotate_left(k as u32) as u8 ^ from ^ k as u8;
    }
    m
}

fn recv_offset(i: usize) -> u64 {
    (i * SLOT) as u64
}

fn send_offset(n: usize, i: usize) -> u64 {
    ((n + i) * SLOT) as u64
}

/// One side's objects: a session, one completion queue and one region for every connection.
struct End {
    adapter: Adapter,
    cq: Arc<CompletionQueue>,
    mr: Arc<MemoryRegion>,
}

async fn end(d: &Daemon, n: usize) -> End {
    let adapter = Adapter::open(d.uds_path()).await.expect("adapter");
    let cq = Arc::new(adapter.create_completion_queue(4096).await.unwrap());
    let mr = Arc::new(
        adapter
            .register_memory(2 * n * SLOT, Access::LOCAL_WRITE)
            .await
            .unwrap(),
    );
    End { adapter, cq, mr }
}

/// Two daemons (on `xdp` or kernel TCP, the whole port space each) in a new netns pair, an `End` on each for
/// `n` connections, and B listening at `remote`.
struct Rig {
    net: TestNet,
    da: Daemon,
    db: Daemon,
    a: End,
    b: End,
    listener: Arc<Listener>,
    remote: SocketAddr,
}

async fn rig(tag: &str, xdp: bool, n: usize) -> Rig {
    let net = TestNet::new(tag).expect("netns pair");
    let da = net
        .spawn_daemon_logging(Side::A, xdp, WHOLE_PORT_SPACE, LOG)
        .expect("daemon A");
    // Both sides' clients live in this one process: in kernel mode B's daemon keeps its data path
    // (`--data-path daemon`), so that this process holds only A's handed-off sockets (10,000 of each side
    // would pass this machine's RLIMIT_NOFILE hard limit), and the two data paths meet on every connection.
    let b_args = [WHOLE_PORT_SPACE, &["--data-path", "daemon"]].concat();
    let db = net
        .spawn_daemon_logging(Side::B, xdp, &b_args, LOG)
        .expect("daemon B");
    let (a, b) = (end(&da, n).await, end(&db, n).await);
    let listener = Arc::new(b.adapter.create_listener().await.unwrap());
    let remote = net.addr(Side::B, PORT);
    listener.listen(remote, 0).await.unwrap();
    Rig {
        net,
        da,
        db,
        a,
        b,
        listener,
        remote,
    }
}

/// A connection on one side: its connector and (if any) queue pair.
struct Conn {
    connector: Arc<Connector>,
    qp: Option<QueuePair>,
}

type Slots = Arc<Mutex<Vec<Option<Result<Conn, Error>>>>>;

/// A connects to `remote` `n` times, `IN_FLIGHT` at a time; connection `i` carries `i` as private data.
/// `with_qp`: each gets a queue pair with a Receive posted in slot `i`. Returns the outcome of each.
async fn connect_all(
    a: &End,
    remote: SocketAddr,
    n: usize,
    with_qp: bool,
    progress: bool,
) -> Vec<Result<Conn, Error>> {
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let slots: Slots = Arc::new(Mutex::new((0..n).map(|_| None).collect()));
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..IN_FLIGHT.min(n) {
        let (adapter, cq, mr) = (a.adapter.clone(), a.cq.clone(), a.mr.clone());
        let (next, done, slots) = (next.clone(), done.clone(), slots.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return;
                }
                let r = async {
                    let qp = match with_qp {
                        true => {
                            let qp = adapter.create_queue_pair(&cq, &cq, 2, 2).await?;
                            qp.receive(i as u64, &[mr.sge(recv_offset(i), SLOT as u32)])?;
                            Some(qp)
                        }
                        false => None,
                    };
                    let c = adapter.create_connector().await?;
                    let pd = (i as u32).to_le_bytes();
                    match &qp {
                        Some(qp) => c.connect_qp(qp, remote, LIMITS, &pd).await?,
                        None => c.connect(remote, LIMITS, &pd).await?,
                    }
                    c.complete_connect().await?;
                    Ok(Conn {
                        connector: Arc::new(c),
                        qp,
                    })
                }
                .await;
                slots.lock().unwrap()[i] = Some(r);
                let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                if progress && d % 1000 == 0 {
                    let t = start.elapsed().as_secs_f64();
                    eprintln!(
                        "  {d} connections up after {t:.1} s ({:.0}/s so far)",
                        d as f64 / t
                    );
                }
            }
        }));
    }
    for w in workers {
        w.await.expect("connect worker");
    }
    let mut slots = slots.lock().unwrap();
    slots
        .iter_mut()
        .map(|s| s.take().expect("every index tried"))
        .collect()
}

/// B takes `n` offers from `listener`, `IN_FLIGHT` at a time, and accepts each (with a queue pair whose
/// Receive is posted in the slot the offer's private data names, if `with_qp`). Returns them by that index.
async fn accept_all(b: &End, listener: &Arc<Listener>, n: usize, with_qp: bool) -> Vec<Result<Conn, Error>> {
    let tickets = Arc::new(AtomicUsize::new(0));
    let slots: Slots = Arc::new(Mutex::new((0..n).map(|_| None).collect()));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let mut workers = Vec::new();
    for _ in 0..IN_FLIGHT.min(n) {
        let (adapter, cq, mr, listener) = (b.adapter.clone(), b.cq.clone(), b.mr.clone(), listener.clone());
        let (tickets, slots, errors) = (tickets.clone(), slots.clone(), errors.clone());
        workers.push(tokio::spawn(async move {
            while tickets.fetch_add(1, Ordering::Relaxed) < n {
                let r = async {
                    let qp = match with_qp {
                        true => Some(adapter.create_queue_pair(&cq, &cq, 2, 2).await?),
                        false => None,
                    };
                    let c = adapter.create_connector().await?;
                    let offer = listener.get_connection_request(&c).await?;
                    let i = u32::from_le_bytes(offer.private_data[..4].try_into().expect("4 bytes")) as usize;
                    assert!(i < n, "offer with index {i}");
                    match &qp {
                        Some(qp) => {
                            qp.receive(i as u64, &[mr.sge(recv_offset(i), SLOT as u32)])?;
                            c.accept_qp(qp, LIMITS, b"").await?;
                        }
                        None => c.accept(LIMITS, b"").await?,
                    }
                    Ok::<_, Error>((
                        i,
                        Conn {
                            connector: Arc::new(c),
                            qp,
                        },
                    ))
                }
                .await;
                match r {
                    Ok((i, conn)) => {
                        let mut s = slots.lock().unwrap();
                        assert!(s[i].is_none(), "index {i} offered twice");
                        s[i] = Some(Ok(conn));
                    }
                    Err(e) => errors.lock().unwrap().push(e),
                }
            }
        }));
    }
    for w in workers {
        w.await.expect("accept worker");
    }
    let errors = std::mem::take(&mut *errors.lock().unwrap());
    let mut slots = slots.lock().unwrap();
    let mut errors = errors.into_iter();
    slots
        .iter_mut()
        .map(|s| {
            s.take().unwrap_or_else(|| {
                Err(errors
                    .next()
                    .unwrap_or_else(|| Error::new(NdStatus::Unsuccessful, "no offer")))
            })
        })
        .collect()
}

/// Both sides' connections, set up concurrently; panics (with the first errors and a count by status) if
/// any failed.
async fn establish(
    a: &End,
    b: &End,
    listener: &Arc<Listener>,
    remote: SocketAddr,
    n: usize,
    with_qp: bool,
) -> (Vec<Conn>, Vec<Conn>) {
    let (ra, rb) = tokio::join!(
        async {
            let r = connect_all(a, remote, n, with_qp, true).await;
            if r.iter().any(Result::is_err) {
                // B would wait for offers that never come.
                let _ = listener.cancel().await;
            }
            r
        },
        accept_all(b, listener, n, with_qp)
    );
    let summary = |r: &[Result<Conn, Error>]| {
        let mut by: HashMap<String, usize> = HashMap::new();
        for e in r.iter().filter_map(|x| x.as_ref().err()) {
            *by.entry(format!("{:?}", e.status)).or_default() += 1;
        }
        let first: Vec<String> = r
            .iter()
            .filter_map(|x| x.as_ref().err())
            .take(3)
            .map(|e| e.to_string())
            .collect();
        (by, first)
    };
    let (fa, fb) = (summary(&ra), summary(&rb));
    assert!(
        fa.0.is_empty() && fb.0.is_empty(),
        "connections failed: A {fa:?}, B {fb:?}"
    );
    (
        ra.into_iter().map(Result::unwrap).collect(),
        rb.into_iter().map(Result::unwrap).collect(),
    )
}

/// A request's future, boxed so that thousands can be polled by hand.
type Pending<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Polls once every future in `futs` (so each has sent its request), keeping those still pending.
async fn poll_once_all<T>(futs: &mut Vec<Pending<T>>) -> Vec<T> {
    std::future::poll_fn(|cx| {
        let mut ready = Vec::new();
        futs.retain_mut(|f| match f.as_mut().poll(cx) {
            Poll::Ready(v) => {
                ready.push(v);
                false
            }
            Poll::Pending => true,
        });
        Poll::Ready(ready)
    })
    .await
}

/// Polls `a`'s and `b`'s status until `done` holds for both (up to `secs`); returns the last reports.
async fn until_status(
    a: &Adapter,
    b: &Adapter,
    secs: u64,
    what: &str,
    done: impl Fn(&StatusReport, &StatusReport) -> bool,
) -> (StatusReport, StatusReport) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let (sa, sb) = (a.status().await.unwrap(), b.status().await.unwrap());
        if done(&sa, &sb) {
            return (sa, sb);
        }
        if Instant::now() > deadline {
            panic!(
                "{what}: not reached in {secs} s: A ports {} in use / {} free, {} connectors, {} QPs; B ports {} in use, {} connectors, {} QPs",
                sa.ports_in_use,
                sa.ports_free,
                sa.connectors.len(),
                sa.queue_pairs.len(),
                sb.ports_in_use,
                sb.connectors.len(),
                sb.queue_pairs.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits (up to `secs`) until the daemon holds at most `fds` descriptors; returns how many it holds.
async fn until_fds(d: &Daemon, fds: usize, secs: u64) -> usize {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let now = d.open_fds().expect("daemon running");
        if now <= fds || Instant::now() > deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every completion `cq` delivers until it has `n`.
async fn completions(cq: &CompletionQueue, n: usize) -> Vec<Completion> {
    let mut got = Vec::with_capacity(n);
    while got.len() < n {
        got.extend(within("completions", 120, cq.wait(4096)).await.unwrap());
    }
    got
}

/// Checks one side's completions after the round of Sends: every Send and every Receive succeeded with
/// `MSG` bytes, each Receive on the right queue pair, and each receive slot holds the peer's message.
fn verify_round(side: &str, end: &End, conns: &[Conn], got: &[Completion], peer: u8) {
    let n = conns.len();
    let index: HashMap<QueuePairId, usize> = conns
        .iter()
        .enumerate()
        .map(|(i, c)| (c.qp.as_ref().expect("queue pair").id(), i))
        .collect();
    let (mut sends, mut recvs) = (vec![false; n], vec![false; n]);
    for c in got {
        let i = index[&c.qp];
        assert_eq!(
            (c.status, c.bytes),
            (NdStatus::Success, MSG as u32),
            "{side}: {c:?}"
        );
        match c.op {
            CompletionOp::Send => {
                assert_eq!(c.wr_id, (n + i) as u64, "{side}: {c:?}");
                assert!(
                    !std::mem::replace(&mut sends[i], true),
                    "{side}: two Send completions on {i}"
                );
            }
            CompletionOp::Receive => {
                assert_eq!(
                    c.wr_id, i as u64,
                    "{side}: receive on the wrong queue pair: {c:?}"
                );
                assert!(
                    !std::mem::replace(&mut recvs[i], true),
                    "{side}: two Receives on {i}"
                );
                let data = end.mr.to_vec(recv_offset(i) as usize, MSG).unwrap();
                assert_eq!(data, message(peer, i), "{side}: message on connection {i}");
            }
            other => panic!("{side}: unexpected {other:?} completion"),
        }
    }
    assert!(
        sends.iter().all(|x| *x) && recvs.iter().all(|x| *x),
        "{side}: missing completions"
    );
}

/// CPU time the daemon used so far (user + system).
fn cpu_time(d: &Daemon) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", d.pid().expect("running"))).expect("stat");
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|x| x.parse().unwrap())
        .collect();
    let tick = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    Duration::from_secs_f64((f[0] + f[1]) as f64 / tick)
}

/// How busy each daemon is over `over` while the connections sit idle (keepalives, timers).
async fn idle_cpu(da: &Daemon, db: &Daemon, over: Duration) -> (f64, f64) {
    let (a0, b0, t0) = (cpu_time(da), cpu_time(db), Instant::now());
    tokio::time::sleep(over).await;
    let t = t0.elapsed().as_secs_f64();
    (
        (cpu_time(da) - a0).as_secs_f64() / t * 100.0,
        (cpu_time(db) - b0).as_secs_f64() / t * 100.0,
    )
}

/// Packets `side`'s veth dropped on receive (`ethtool -S`: in XDP mode, a full 256-entry veth XDP ring or
/// AF_XDP ring; TCP retransmits them).
fn veth_rx_drops(net: &TestNet, side: Side) -> u64 {
    let out = net
        .command(side, "ethtool")
        .args(["-S", &net.dev(side)])
        .output()
        .expect("ethtool -S");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("rx_queue_"))
        .filter(|l| l.contains("_drops:"))
        .filter_map(|l| l.rsplit(':').next()?.trim().parse::<u64>().ok())
        .sum()
}

fn rss_kb(d: &Daemon) -> u64 {
    d.status_kb("VmRSS").expect("daemon running")
}

/// Bytes per connection from two kB readings.
fn per_conn(before_kb: u64, after_kb: u64, n: usize) -> f64 {
    (after_kb.saturating_sub(before_kb) * 1024) as f64 / n as f64
}

/// Test 1 and 2: `n` connections with queue pairs between daemons on `xdp` or kernel TCP.
async fn connections_with_a_send_each_way(tag: &str, xdp: bool, n: usize) {
    let mode = if xdp { "XDP" } else { "kernel TCP" };
    // Each daemon holds a socket per connection (and per port): 10,000 and some. In kernel mode this process
    // holds A's handed-off sockets too (the data path runs in the client; B's daemon runs its own).
    let limit = raise_fd_limit(n as u64 + 1024).expect("RLIMIT_NOFILE");
    let Rig {
        net,
        da,
        db,
        a,
        b,
        listener,
        remote,
    } = rig(tag, xdp, n).await;
    let (rss_a0, rss_b0) = (rss_kb(&da), rss_kb(&db));
    let (fds_a0, fds_b0) = (da.open_fds().unwrap(), db.open_fds().unwrap());
    eprintln!("{mode}: {n} connections, {IN_FLIGHT} in flight (fd limit {limit})");

    // Setup.
    let t = Instant::now();
    let (ca, cb) = within("setup", 900, establish(&a, &b, &listener, remote, n, true)).await;
    let setup = t.elapsed();
    let drops = (veth_rx_drops(&net, Side::A), veth_rx_drops(&net, Side::B));
    let (rss_a1, rss_b1) = (rss_kb(&da), rss_kb(&db));
    let (fds_a1, fds_b1) = (da.open_fds().unwrap(), db.open_fds().unwrap());
    // In kernel mode A's queue pairs run in this process, and the daemon's status shows them as the client
    // last reported them (when they change, at most every 100 ms): wait for the report of the last ones.
    let sa = eventually("A's status shows every queue pair connected", || async {
        let s = a.adapter.status().await.unwrap();
        let all =
            s.queue_pairs.len() == n && s.queue_pairs.iter().all(|q| q.state == QueuePairState::Connected);
        all.then_some(s)
    })
    .await;
    let sb = b.adapter.status().await.unwrap();
    for (side, s, ports) in [("A", &sa, n as u32), ("B", &sb, 1)] {
        assert_eq!(s.connectors.len(), n, "{side}");
        assert!(
            s.connectors.iter().all(|c| c.state == ConnectorState::Connected),
            "{side}"
        );
        assert_eq!(s.queue_pairs.len(), n, "{side}");
        assert!(
            s.queue_pairs.iter().all(|q| q.state == QueuePairState::Connected),
            "{side}"
        );
        assert_eq!(s.ports_in_use, ports, "{side}: ports in use");
    }
    assert_eq!(sa.ports_free as usize, 16_384 - n);

    // A Send each way on every connection.
    let t = Instant::now();
    for (end, conns, from) in [(&a, &ca, b'A'), (&b, &cb, b'B')] {
        for (i, c) in conns.iter().enumerate() {
            end.mr
                .write_at(send_offset(n, i) as usize, &message(from, i))
                .unwrap();
            let qp = c.qp.as_ref().unwrap();
            qp.send((n + i) as u64, &[end.mr.sge(send_offset(n, i), MSG as u32)])
                .unwrap();
        }
    }
    let (ga, gb) = tokio::join!(completions(&a.cq, 2 * n), completions(&b.cq, 2 * n));
    let round = t.elapsed();
    verify_round("A", &a, &ca, &ga, b'B');
    verify_round("B", &b, &cb, &gb, b'A');
    let (rss_a2, rss_b2) = (rss_kb(&da), rss_kb(&db));
    // Idle: nothing but keepalives and timers.
    let (idle_a, idle_b) = idle_cpu(&da, &db, IDLE).await;

    // Teardown: B waits for every disconnect (NotifyDisconnect, in the daemon before A starts), A
    // disconnects everything, then both release every object.
    let t = Instant::now();
    let mut notify: Vec<Pending<Result<(), Error>>> = cb
        .iter()
        .map(|c| {
            let c = c.connector.clone();
            Box::pin(async move { c.notify_disconnect().await }) as Pending<Result<(), Error>>
        })
        .collect();
    let early = poll_once_all(&mut notify).await;
    assert!(
        early.is_empty(),
        "a NotifyDisconnect completed before any disconnect: {early:?}"
    );
    b.adapter.status().await.unwrap(); // B's session is ordered: every NotifyDisconnect is in.
    let notified = tokio::spawn(async move {
        let mut failed = Vec::new();
        for f in notify {
            if let Err(e) = f.await {
                failed.push(e);
            }
        }
        failed
    });
    let next = Arc::new(AtomicUsize::new(0));
    let ca = Arc::new(ca);
    let mut workers = Vec::new();
    for _ in 0..IN_FLIGHT {
        let (next, ca) = (next.clone(), ca.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(c) = ca.get(i) else { return };
                c.connector.disconnect().await.expect("disconnect");
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    let disconnected = t.elapsed();
    let failed = within("B's NotifyDisconnects", 300, notified).await.unwrap();
    assert!(
        failed.is_empty(),
        "{} NotifyDisconnects failed, first: {}",
        failed.len(),
        failed[0]
    );
    let notified_at = t.elapsed();
    drop(Arc::try_unwrap(ca).ok().expect("workers done"));
    drop(cb);
    let (sa, sb) = until_status(&a.adapter, &b.adapter, 300, "teardown", |sa, sb| {
        sa.connectors.is_empty()
            && sa.queue_pairs.is_empty()
            && sa.ports_in_use == 0
            && sb.connectors.is_empty()
            && sb.queue_pairs.is_empty()
            && sb.ports_in_use == 1
    })
    .await;
    let teardown = t.elapsed();
    assert_eq!(sa.ports_free, 16_384, "A's port space is full again");
    assert_eq!(sb.ports_free, 16_384, "B's port space is full again");
    assert_eq!(sb.listeners.len(), 1, "B's listener is still there");
    assert!(
        a.cq.poll(1).is_empty() && b.cq.poll(1).is_empty(),
        "nothing was left to flush"
    );
    // The kernel sockets go too (a graceful close waits at most 5 s for the peer's FIN).
    let (fds_a2, fds_b2) = (until_fds(&da, fds_a0, 30).await, until_fds(&db, fds_b0, 30).await);
    let fds_gone = t.elapsed();
    let (rss_a3, rss_b3) = (rss_kb(&da), rss_kb(&db));

    let secs = |d: Duration| d.as_secs_f64();
    eprintln!("{mode}, {n} connections with a queue pair each:");
    eprintln!(
        "  setup: {:.2} s = {:.0} connections/s ({IN_FLIGHT} in flight); packets the veths dropped on receive \
         meanwhile (retransmitted by TCP): A {}, B {}",
        secs(setup),
        n as f64 / secs(setup),
        drops.0,
        drops.1
    );
    eprintln!(
        "  a {MSG}-byte Send each way on every connection, verified: {:.2} s",
        secs(round)
    );
    eprintln!(
        "  teardown: Disconnects answered after {:.2} s, B notified of all after {:.2} s, both port spaces full and \
         every object gone after {:.2} s, kernel sockets closed after {:.2} s",
        secs(disconnected),
        secs(notified_at),
        secs(teardown),
        secs(fds_gone)
    );
    eprintln!(
        "  daemon RSS per connection: A {:.0} B, B {:.0} B once connected; A {:.0} B, B {:.0} B after the Sends \
         (A {rss_a0} → {rss_a1} → {rss_a2} kB, B {rss_b0} → {rss_b1} → {rss_b2} kB; {rss_a3} / {rss_b3} kB after teardown)",
        per_conn(rss_a0, rss_a1, n),
        per_conn(rss_b0, rss_b1, n),
        per_conn(rss_a0, rss_a2, n),
        per_conn(rss_b0, rss_b2, n),
    );
    eprintln!(
        "  daemon descriptors: A {fds_a0} → {fds_a1} → {fds_a2}, B {fds_b0} → {fds_b1} → {fds_b2} (before, connected, after)"
    );
    eprintln!(
        "  daemon CPU with the {n} connections idle for {} s: A {idle_a:.1} %, B {idle_b:.1} % of a core",
        IDLE.as_secs()
    );
    assert!(
        fds_a2 <= fds_a0 && fds_b2 <= fds_b0,
        "descriptors leaked: A {fds_a0} → {fds_a2}, B {fds_b0} → {fds_b2}"
    );
    drop(listener);
}

/// 10,000, or `$SOFT_RDMA_LOAD_CONNECTIONS`.
fn connections() -> usize {
    std::env::var("SOFT_RDMA_LOAD_CONNECTIONS")
        .ok()
        .map(|v| v.parse().expect("SOFT_RDMA_LOAD_CONNECTIONS: a number"))
        .map(|n: usize| n.clamp(1, 16_384))
        .unwrap_or(10_000)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_connections_kernel() {
    let _alone = ONE_AT_A_TIME.lock().await;
    connections_with_a_send_each_way("lk", false, connections()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_connections_xdp() {
    let _alone = ONE_AT_A_TIME.lock().await;
    connections_with_a_send_each_way("lx", true, connections()).await;
}

/// The local ports of `conns`.
async fn local_ports(conns: &[Conn]) -> Vec<u16> {
    let mut v = Vec::with_capacity(conns.len());
    for c in conns {
        v.push(c.connector.local_addr().await.unwrap().port());
    }
    v
}

/// `/proc/net/tcp`'s state of a socket in TIME_WAIT.
const TCP_TIME_WAIT: u8 = 6;

/// A's host TCP sockets (IPv4): local port → the states of the sockets on it (from `/proc/net/tcp` read by a
/// thread in A's namespace).
fn tcp_states(net: &TestNet) -> HashMap<u16, Vec<u8>> {
    let text = net.in_ns(Side::A, || {
        std::fs::read_to_string("/proc/thread-self/net/tcp").expect("/proc/net/tcp")
    });
    let mut m: HashMap<u16, Vec<u8>> = HashMap::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(local), Some(state)) = (f.get(1), f.get(3)) else {
            continue;
        };
        let port = local
            .rsplit(':')
            .next()
            .and_then(|p| u16::from_str_radix(p, 16).ok());
        if let (Some(port), Ok(state)) = (port, u8::from_str_radix(state, 16)) {
            m.entry(port).or_default().push(state);
        }
    }
    m
}

/// Waits (up to `secs`) until `done` holds for A's host TCP sockets.
async fn until_tcp_states(
    net: &TestNet,
    secs: u64,
    what: &str,
    done: impl Fn(&HashMap<u16, Vec<u8>>) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done(&tcp_states(net)) {
        assert!(Instant::now() < deadline, "{what}: not within {secs} s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every port of 49152-65535 held by a connection: the next Connect and Bind are TOO_MANY_ADDRESSES. Ports
/// come back with the connections that held them, but a port whose connection this side closed first is in
/// the host's TIME_WAIT for a minute (the host refuses to bind it): it stays unusable, and is skipped,
/// however many there are, in favour of the ports freed by the peer's close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_space_exhaustion_by_connections() {
    const N: usize = 16_384;
    const FREED: usize = 100;
    let _alone = ONE_AT_A_TIME.lock().await;
    raise_fd_limit(N as u64 + 1024).expect("RLIMIT_NOFILE");
    let Rig {
        net,
        da: _da,
        db: _db,
        a,
        b,
        listener,
        remote,
    } = rig("lp", false, 1).await;
    let t = Instant::now();
    let (mut ca, mut cb) = within("setup", 900, establish(&a, &b, &listener, remote, N, false)).await;
    let setup = t.elapsed();
    let s = a.adapter.status().await.unwrap();
    assert_eq!((s.ports_in_use, s.ports_free), (N as u32, 0));

    // Exhausted: Connect (implicit bind) and Bind both fail, before anything reaches the network.
    let any = SocketAddr::new(IpAddr::V4(net.ipv4(Side::A)), 0);
    let extra = a.adapter.create_connector().await.unwrap();
    let e = status(extra.connect(remote, LIMITS, &[0; 4]).await);
    assert_eq!(e.status, NdStatus::TooManyAddresses, "{e}");
    let extra = a.adapter.create_connector().await.unwrap();
    let e = status(extra.bind(any).await);
    assert_eq!(e.status, NdStatus::TooManyAddresses, "{e}");
    eprintln!("exhausted: {e}");
    // A port outside the ephemeral range is still there to bind explicitly.
    extra.bind(net.addr(Side::A, 6000)).await.unwrap();
    drop(extra);

    // A closes FREED connections first: their ports are soft-rdma's to give again, but the host keeps them
    // in TIME_WAIT (60 s), so none is usable.
    let active: Vec<Conn> = ca.drain(..FREED).collect();
    let passive_seen: Vec<Conn> = cb.drain(..FREED).collect();
    let waiting = local_ports(&active).await;
    for c in &active {
        c.connector.disconnect().await.unwrap();
    }
    for c in &passive_seen {
        // Completes at once if the disconnect already arrived; CONNECTION_INVALID if B already closed it.
        let r = within("B sees the disconnect", 30, c.connector.notify_disconnect()).await;
        assert!(
            matches!(
                &r,
                Ok(())
                    | Err(Error {
                        status: NdStatus::ConnectionInvalid,
                        ..
                    })
            ),
            "{r:?}"
        );
    }
    drop(active);
    drop(passive_seen);
    until_status(&a.adapter, &b.adapter, 30, "the first ports freed", |sa, _| {
        sa.ports_free as usize == FREED
    })
    .await;
    until_tcp_states(&net, 30, "A's actively closed ports in TIME_WAIT", |t| {
        waiting
            .iter()
            .all(|p| t.get(p).is_some_and(|s| s == &[TCP_TIME_WAIT]))
    })
    .await;
    let c = a.adapter.create_connector().await.unwrap();
    let e = status(c.connect(remote, LIMITS, &[0; 4]).await);
    assert_eq!(e.status, NdStatus::TooManyAddresses, "{e}");
    assert!(e.context.contains("held by the host"), "{e}");
    eprintln!("{FREED} ports freed by an active close, in TIME_WAIT on the host: {e}");

    // B closes FREED connections first: A's ports leave the host at once and are usable, although the
    // TIME_WAIT ones are ahead of them in the queue (more of them than an allocation used to skip).
    let passive: Vec<Conn> = cb.drain(..FREED).collect();
    let active_seen: Vec<Conn> = ca.drain(..FREED).collect();
    let reusable = local_ports(&active_seen).await;
    for c in &passive {
        c.connector.disconnect().await.unwrap();
    }
    until_status(&a.adapter, &b.adapter, 30, "the second ports freed", |sa, _| {
        sa.ports_free as usize == 2 * FREED
    })
    .await;
    until_tcp_states(&net, 30, "A's passively closed ports gone from the host", |t| {
        reusable.iter().all(|p| !t.contains_key(p))
    })
    .await;
    drop(passive);
    drop(active_seen);
    let (ra, rb) = within("reconnects", 120, async {
        tokio::join!(
            async {
                let r = connect_all(&a, remote, FREED, false, false).await;
                if r.iter().any(Result::is_err) {
                    // B's acceptors would wait for offers that never come.
                    listener.cancel().await.unwrap();
                }
                r
            },
            accept_all(&b, &listener, FREED, false)
        )
    })
    .await;
    let again: Vec<Conn> = ra
        .into_iter()
        .map(|r| r.unwrap_or_else(|e| panic!("reconnect failed: {e}")))
        .collect();
    assert!(rb.iter().all(Result::is_ok));
    let mut used = local_ports(&again).await;
    used.sort_unstable();
    let mut want = reusable.clone();
    want.sort_unstable();
    assert_eq!(used, want, "the reconnects took the ports the peer's close freed");
    let s = a.adapter.status().await.unwrap();
    assert_eq!(s.ports_in_use as usize, N - FREED);
    let c = a.adapter.create_connector().await.unwrap();
    let e = status(c.connect(remote, LIMITS, &[0; 4]).await);
    assert_eq!(e.status, NdStatus::TooManyAddresses, "{e}");
    eprintln!(
        "all {FREED} ports freed by the peer's close reused at once; the {FREED} in TIME_WAIT still refused"
    );

    // Everything goes: both port spaces are full again.
    let t = Instant::now();
    drop(ca);
    drop(cb);
    drop(again);
    drop(rb);
    drop(c);
    until_status(&a.adapter, &b.adapter, 300, "teardown", |sa, sb| {
        sa.ports_in_use == 0 && sa.ports_free == 16_384 && sb.ports_in_use == 1 && sb.connectors.is_empty()
    })
    .await;
    eprintln!(
        "kernel TCP, {N} connections without queue pairs: setup {:.2} s = {:.0} connections/s, teardown {:.2} s",
        setup.as_secs_f64(),
        N as f64 / setup.as_secs_f64(),
        t.elapsed().as_secs_f64()
    );
}

/// Sets a running daemon's soft RLIMIT_NOFILE with prlimit(1) (the hard limit stays: raising it back needs
/// CAP_SYS_RESOURCE).
fn limit_fds(d: &Daemon, n: u64) {
    let pid = d.pid().expect("running").to_string();
    let mut prlimit = std::process::Command::new("prlimit");
    prlimit.args(["--pid", &pid, &format!("--nofile={n}:")]);
    output_ok(&mut prlimit, "prlimit").unwrap_or_else(|e| panic!("{e:#}"));
}

/// Each side out of file descriptors (RLIMIT_NOFILE lowered under the running daemon) is a clear error, not a
/// hang: A's Connect fails with INSUFFICIENT_RESOURCES (no socket for the port); a Connect to B, which
/// cannot accept, fails with CONNECTION_REFUSED (B resets it) instead of waiting for an MPA Reply forever
/// in B's kernel backlog. With the limit raised again, connections succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_is_a_clear_error() {
    const TRIES: usize = 100;
    let _alone = ONE_AT_A_TIME.lock().await;
    let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    let Rig {
        net: _net,
        da,
        db,
        a,
        b,
        listener,
        remote,
    } = rig("lf", false, 1).await;
    // Connects to B, and B's acceptor, until A is done: (successes, failures by status).
    let attempt = async |n: usize| {
        let (ra, rb) = within("connects", 120, async {
            tokio::join!(
                async {
                    let r = connect_all(&a, remote, n, false, false).await;
                    listener.cancel().await.unwrap();
                    r
                },
                accept_all(&b, &listener, n, false)
            )
        })
        .await;
        let mut failed: HashMap<NdStatus, usize> = HashMap::new();
        let mut up = Vec::new();
        for r in ra {
            match r {
                Ok(c) => up.push(c),
                Err(e) => *failed.entry(e.status).or_default() += 1,
            }
        }
        assert_eq!(rb.iter().filter(|r| r.is_ok()).count(), up.len());
        (up, rb, failed)
    };

    // A: room for a few more sockets only; then B: room for a few more connections only.
    for (d, side, want) in [
        (&da, "A", NdStatus::InsufficientResources),
        (&db, "B", NdStatus::ConnectionRefused),
    ] {
        let fds = d.open_fds().unwrap() as u64;
        limit_fds(d, fds + 10);
        let (up, accepted, failed) = attempt(TRIES).await;
        eprintln!(
            "{side} limited to {} descriptors: {} connected, failures {failed:?}",
            fds + 10,
            up.len()
        );
        assert!(!up.is_empty() && up.len() < TRIES, "{} connected", up.len());
        assert_eq!(failed.keys().collect::<Vec<_>>(), [&want]);
        drop((up, accepted));
        limit_fds(d, hard);
        until_fds(d, fds as usize, 30).await;
    }

    // Room again: every connect succeeds.
    let (up, _accepted, failed) = attempt(TRIES).await;
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(up.len(), TRIES);
}
