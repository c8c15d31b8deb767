//! `soft-rdma perf {send|write|read|connect}`: perftest-style bandwidth, latency and connection setup
//! between two soft-rdma daemons, and `soft-rdma perf {tcp-stream|tcp-pingpong|tcp-connect}`: the same
//! measurements over plain kernel TCP sockets (TCP_NODELAY), the baselines `cargo xtask bench` compares with
//! (same sizes, iterations, timer and JSON rows).
//!
//! The server (`--server ADDR:PORT`) listens and serves clients until killed (`--once`: one client), with
//! several GetConnectionRequest calls outstanding so that connection-setup clients can keep hundreds of
//! handshakes in flight. It needs no matching flags: the client states the test in its Connect private
//! data, and the server answers with its buffer in the Accept private data. Each message size is one
//! connection. A TCP server (`perf tcp-stream --server ADDR:PORT`, any of the tcp tests) serves all three
//! TCP tests, the client stating which in its first 32 bytes (`SRPT`, version, test, size, iterations).
//!
//! `connect` (`--count M --concurrency N`): M connections, N in flight, each CreateConnector, Connect with
//! 32 B private data and IRD/ORD 16 (until the server's Accept, 32 B, is in), CompleteConnect, Disconnect;
//! the time of each step (as rdma-core's cmtime) and of the whole. `tcp-connect`: TCP connect, a 32 B
//! request and response, close. `--hold`: open M connections, report, keep them idle until a line (or end
//! of file) on stdin, then close them and report again (`cargo xtask bench` reads the daemons' memory in
//! between).
//!
//! # Wire formats (all integers big-endian)
//!
//! Connect private data, client → server (32 bytes):
//!
//! | offset | size | field |
//! | ---: | ---: | --- |
//! | 0 | 4 | magic `SRPF` |
//! | 4 | 1 | version (1) |
//! | 5 | 1 | test: 0 = send, 1 = write, 2 = read, 3 = connect (the rest zero; the Accept carries the same 32 bytes) |
//! | 6 | 1 | flags: bit 0 = latency (ping-pong) test, bit 1 = busy-poll completions |
//! | 7 | 1 | reserved (0) |
//! | 8 | 4 | message size in bytes |
//! | 12 | 4 | iterations |
//! | 16 | 4 | depth (operations the client keeps in flight) |
//! | 20 | 4 | client STag (write latency: the client's landing buffer; else 0) |
//! | 24 | 8 | client tagged offset of that buffer |
//!
//! Accept private data, server → client (20 bytes): magic `SRPF`, the server's STag (4; write/read: its
//! buffer, else 0), the tagged offset of that buffer (8), and credits (4; send bandwidth: Receives the
//! server keeps posted, else 0).
//!
//! Control messages (Sends of 24 bytes): kind (4: 1 = credit, 2 = done, 3 = fin), count (4), bytes (8),
//! bad (4: verification failures), reserved (4).
//!
//! # The tests
//!
//! * `send` bandwidth: the server keeps `credits` Receives posted and grants the client credits as it
//!   reposts them (iWARP has no receiver-not-ready retry: a Send without a Receive kills the connection); at
//!   the end it sends `done` with the messages and bytes received. The clock stops at `done`.
//! * `write` bandwidth: RDMA Writes into the server's buffer, then a `fin` Send (delivered after the Writes
//!   are placed); the server checks its buffer and answers `done`. The clock stops at `done`.
//! * `read` bandwidth: RDMA Reads of the server's buffer (at most the negotiated outbound read limit in
//!   flight); the client checks the last data read.
//! * `--latency`: `send` ping-pong (half round trip), `write` ping-pong where each side polls the last byte
//!   of its buffer for a changing sequence value (half round trip), `read` one outstanding Read at a time
//!   (full round trip).
//!
//! In bandwidth mode the latency columns are per-operation post-to-completion times (queueing included).
//! CPU% is this process's user+system time over wall time; the data movement itself happens in soft-rdmad.

use std::collections::VecDeque;
use std::io::{IsTerminal, Write as _};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use soft_rdma::NdStatus;
use soft_rdma::client::{
    Access, Completion, CompletionOp, QueuePairState, ReadLimits, RemoteBuffer, Stag, WorkRequest,
};
use soft_rdma::client::{Adapter, CompletionQueue, Connector, Listener, MemoryRegion, QueuePair};
use tokio::sync::watch;

mod bandwidth;
mod connect;
mod latency;
mod report;
mod server;
mod tcp;
mod wire;

use bandwidth::*;
use connect::*;
use latency::*;
use report::*;
use server::*;
use tcp::*;
use wire::*;

// ---------------------------------------------------------------------------------------------------------
// Shared with `ping`: sizes, one connection's completions, CPU time.
// ---------------------------------------------------------------------------------------------------------

/// `4096`, `64k`, `1m`, `1g` (binary multiples).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, mult) = match s.as_bytes().last().map(|c| c.to_ascii_lowercase()) {
        Some(b'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some(b'm') => (&s[..s.len() - 1], 1 << 20),
        Some(b'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("bad size {s:?} (examples: 64, 4k, 1m)"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

/// `A..B`: a range of message sizes.
fn parse_range(s: &str) -> Result<(u64, u64), String> {
    let (a, b) = s
        .split_once("..")
        .ok_or_else(|| format!("bad size range {s:?} (example: 64..1m)"))?;
    let (a, b) = (parse_size(a)?, parse_size(b)?);
    if a == 0 || a > b {
        return Err(format!("bad size range {s:?}: need 0 < A <= B"));
    }
    Ok((a, b))
}

/// The peer disconnected while this side waited for a completion.
#[derive(Debug)]
pub struct PeerGone;

impl std::fmt::Display for PeerGone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the peer disconnected")
    }
}

impl std::error::Error for PeerGone {}

/// Whether `e` says the peer went away (its disconnect, or our requests flushed because of it).
pub fn is_disconnect(e: &anyhow::Error) -> bool {
    e.downcast_ref::<PeerGone>().is_some()
        || e.downcast_ref::<soft_rdma::Error>().is_some_and(|e| {
            matches!(
                e.status,
                NdStatus::Canceled | NdStatus::ConnectionAborted | NdStatus::ConnectionInvalid
            )
        })
}

/// A queue pair `send_depth` / `recv_depth` deep with one completion queue for both, sized for both (within
/// the adapter's limits).
pub(super) async fn queue_pair_with_cq(
    adapter: &Adapter,
    send_depth: u32,
    recv_depth: u32,
) -> Result<(QueuePair, CompletionQueue)> {
    let cq = adapter
        .create_completion_queue((send_depth + recv_depth).min(adapter.info().max_completion_queue_depth))
        .await?;
    let qp = adapter
        .create_queue_pair(&cq, &cq, send_depth, recv_depth)
        .await?;
    Ok((qp, cq))
}

/// One connected queue pair with its completion queue, and a watch on the peer's disconnect.
pub struct Conn {
    // Field order is drop order: the queue pair goes before its completion queue and connector.
    pub qp: QueuePair,
    pub cq: CompletionQueue,
    pub connector: Arc<Connector>,
    gone: watch::Receiver<bool>,
    watcher: tokio::task::JoinHandle<()>,
    /// Completions taken from the queue but not yet wanted ([`Conn::next_of`]).
    stash: VecDeque<Completion>,
    /// Longest wait for any one completion.
    pub timeout: Duration,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

impl Conn {
    /// Call once the connection is established (after CompleteConnect or Accept).
    pub fn new(connector: Connector, qp: QueuePair, cq: CompletionQueue, timeout: Duration) -> Conn {
        let connector = Arc::new(connector);
        let (tx, gone) = watch::channel(false);
        let c = connector.clone();
        let watcher = tokio::spawn(async move {
            if c.notify_disconnect().await.is_ok() {
                let _ = tx.send(true);
            } else {
                // Keep the sender: nothing more will be learnt here (the flush completions still say it).
                std::future::pending::<()>().await;
            }
        });
        Conn {
            qp,
            cq,
            connector,
            gone,
            watcher,
            stash: VecDeque::new(),
            timeout,
        }
    }

    pub fn peer_gone(&self) -> bool {
        *self.gone.borrow()
    }

    /// Completions already delivered (stashed ones first); never waits.
    pub fn poll(&mut self, max: usize) -> Vec<Completion> {
        if !self.stash.is_empty() {
            let n = max.min(self.stash.len());
            return self.stash.drain(..n).collect();
        }
        self.cq.poll(max)
    }

    async fn qp_state(&self) -> String {
        match self.qp.query().await {
            Ok(s) => format!(
                "queue pair {:?}{}; {:?}",
                s.state,
                s.terminate.map(|t| format!(", ended: {t}")).unwrap_or_default(),
                s.stats
            ),
            Err(e) => format!("queue pair query failed: {e}"),
        }
    }

    async fn timed_out(&self, what: &str) -> anyhow::Error {
        let state = self.qp_state().await;
        anyhow::anyhow!(
            "no completion within {:.1} s while waiting for {what} ({state})",
            self.timeout.as_secs_f64()
        )
    }

    /// Waits for the completion queue only (not the stash): at least one, up to `max`.
    async fn wait_cq(&self, max: usize, what: &str) -> Result<Vec<Completion>> {
        let mut gone = self.gone.clone();
        tokio::select! {
            r = self.cq.wait(max) => Ok(r?),
            // (The watch's read guard is dropped inside: it must not live across the awaits below.)
            _ = async { let _ = gone.wait_for(|g| *g).await; } => {
                // The flush of what is outstanding may be on its way: it says more than "gone".
                match tokio::time::timeout(Duration::from_millis(200), self.cq.wait(max)).await {
                    Ok(r) => Ok(r?),
                    Err(_) => Err(PeerGone.into()),
                }
            }
            _ = tokio::time::sleep(self.timeout) => Err(self.timed_out(what).await),
        }
    }

    /// Waits for at least one completion (stashed ones first) and returns up to `max`.
    pub async fn wait(&mut self, max: usize, what: &str) -> Result<Vec<Completion>> {
        let got = self.poll(max);
        if !got.is_empty() {
            return Ok(got);
        }
        self.wait_cq(max, what).await
    }

    /// Like [`Self::wait`], but spinning on [`Self::poll`] (busy polling, as perftest does).
    pub async fn spin(&mut self, max: usize, what: &str) -> Result<Vec<Completion>> {
        let start = Instant::now();
        loop {
            let got = self.poll(max);
            if !got.is_empty() {
                return Ok(got);
            }
            if self.peer_gone() {
                return self.wait_cq(max, what).await;
            }
            if start.elapsed() > self.timeout {
                return Err(self.timed_out(what).await);
            }
            tokio::task::yield_now().await;
        }
    }

    /// [`Self::wait`] or [`Self::spin`].
    pub async fn get(&mut self, busy: bool, max: usize, what: &str) -> Result<Vec<Completion>> {
        if busy {
            self.spin(max, what).await
        } else {
            self.wait(max, what).await
        }
    }

    /// An error carrying the completion's ND status, unless it succeeded.
    pub async fn check(&self, c: &Completion, what: &str) -> Result<()> {
        if c.status == NdStatus::Success {
            return Ok(());
        }
        let state = self.qp_state().await;
        Err(soft_rdma::Error::new(
            c.status,
            format!(
                "{what}: {:?} request (wr_id {:#x}) failed ({state})",
                c.op, c.wr_id
            ),
        )
        .into())
    }

    /// The next successful completion of `op`; others are kept for later. Any failure is an error, except
    /// other requests flushed (CANCELED) by a disconnect: `op` may still have completed before it.
    pub async fn next_of(&mut self, op: CompletionOp, what: &str) -> Result<Completion> {
        if let Some(i) = self.stash.iter().position(|c| c.op == op) {
            let c = self.stash.remove(i).expect("found");
            self.check(&c, what).await?;
            return Ok(c);
        }
        loop {
            let mut found = None;
            for c in self.wait_cq(64, what).await? {
                if c.op == op || c.status != NdStatus::Canceled {
                    self.check(&c, what).await?;
                }
                if found.is_none() && c.op == op {
                    found = Some(c);
                } else {
                    self.stash.push_back(c);
                }
            }
            if let Some(c) = found {
                return Ok(c);
            }
        }
    }

    /// Waits (at most `limit`; `None` = as long as it takes) for the peer to disconnect.
    pub async fn wait_gone(&self, limit: Option<Duration>) -> bool {
        let mut gone = self.gone.clone();
        let f = gone.wait_for(|g| *g);
        match limit {
            Some(l) => matches!(tokio::time::timeout(l, f).await, Ok(Ok(_))),
            None => f.await.is_ok(),
        }
    }

    /// Disconnects (the peer's NotifyDisconnect fires); errors are ignored (it may be gone already).
    pub async fn close(&self) {
        let _ = tokio::time::timeout(Duration::from_secs(5), self.connector.disconnect()).await;
    }
}

/// Connect carrying `qp`; returns the server's private data. A refusal shows the server's reason.
pub async fn connect(
    connector: &Connector,
    qp: &QueuePair,
    remote: SocketAddr,
    limits: ReadLimits,
    private_data: &[u8],
    timeout: Duration,
) -> Result<bytes::Bytes> {
    // A little longer than ours, so that the daemon's own connect timeout (IO_TIMEOUT) speaks first.
    let limit = timeout + Duration::from_secs(5);
    match tokio::time::timeout(limit, connector.connect_qp(qp, remote, limits, private_data)).await {
        Err(_) => bail!("connecting to {remote}: no answer within {limit:?}"),
        Ok(Err(e)) if e.status == NdStatus::ConnectionRefused => {
            let why = connector.private_data().await.unwrap_or_default();
            if why.is_empty() {
                return Err(e.into());
            }
            Err(soft_rdma::Error::new(
                e.status,
                format!("{}; the server says {}", e.context, super::show(&why)),
            )
            .into())
        }
        Ok(Err(e)) => Err(e.into()),
        Ok(Ok(())) => Ok(connector.private_data().await?),
    }
}

/// This process's user + system CPU time.
pub fn cpu_time() -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid, writable rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Marks an end of the measured interval on stderr (`perf: measuring` / `perf: measured`) when
/// `$SOFT_RDMA_PERF_MARKS` is set, then waits for a line on stdin: `cargo xtask bench` reads what every
/// process used at each mark, while this one waits (outside the interval), so that nothing it does next
/// (ending threads, exiting) is missed or counted.
pub fn mark_interval(end: bool) {
    if std::env::var_os("SOFT_RDMA_PERF_MARKS").is_some() {
        eprintln!("{}", if end { "perf: measured" } else { "perf: measuring" });
        let _ = std::io::stdin().read_line(&mut String::new());
    }
}

/// A byte of the verification pattern (251 is prime: no alignment with powers of two).
pub fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

fn pattern_bytes(len: usize) -> Vec<u8> {
    (0..len).map(pattern).collect()
}

/// How many bytes of `region[offset..offset+len]` differ from the pattern.
fn pattern_mismatches(region: &MemoryRegion, offset: usize, len: usize) -> Result<u64> {
    let got = region.to_vec(offset, len)?;
    Ok(got.iter().enumerate().filter(|(i, b)| **b != pattern(*i)).count() as u64)
}

// ---------------------------------------------------------------------------------------------------------
// Command line.
// ---------------------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Test {
    Send,
    Write,
    Read,
}

impl Test {
    fn code(self) -> u8 {
        match self {
            Test::Send => 0,
            Test::Write => 1,
            Test::Read => 2,
        }
    }
    fn from_code(c: u8) -> Option<Test> {
        match c {
            0 => Some(Test::Send),
            1 => Some(Test::Write),
            2 => Some(Test::Read),
            _ => None,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Test::Send => "send",
            Test::Write => "write",
            Test::Read => "read",
        }
    }
}

/// What `soft-rdma perf` measures: an operation through soft-rdma, or its kernel-TCP baseline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PerfTest {
    /// Send/Receive through soft-rdma.
    Send,
    /// RDMA Write through soft-rdma.
    Write,
    /// RDMA Read through soft-rdma.
    Read,
    /// Connection setup through soft-rdma: TCP + MPA v2 with 32 B private data and IRD/ORD, CompleteConnect,
    /// Disconnect (`--concurrency`, `--count`, `--hold`).
    Connect,
    /// Baseline of send/write/read bandwidth: a kernel TCP socket (TCP_NODELAY) streaming the same messages.
    TcpStream,
    /// Baseline of the latency tests: kernel TCP ping-pong of the same sizes.
    TcpPingpong,
    /// Baseline of `connect`: TCP connect, one 32 B request/response, close.
    TcpConnect,
}

impl PerfTest {
    /// The soft-rdma data operation, if this is one.
    fn rdma(self) -> Option<Test> {
        match self {
            PerfTest::Send => Some(Test::Send),
            PerfTest::Write => Some(Test::Write),
            PerfTest::Read => Some(Test::Read),
            _ => None,
        }
    }

    /// A kernel-TCP baseline (no soft-rdmad involved).
    fn is_tcp(self) -> bool {
        matches!(
            self,
            PerfTest::TcpStream | PerfTest::TcpPingpong | PerfTest::TcpConnect
        )
    }

    fn name(self) -> &'static str {
        match self {
            PerfTest::Send => "send",
            PerfTest::Write => "write",
            PerfTest::Read => "read",
            PerfTest::Connect => "connect",
            PerfTest::TcpStream => "tcp-stream",
            PerfTest::TcpPingpong => "tcp-pingpong",
            PerfTest::TcpConnect => "tcp-connect",
        }
    }
}

impl From<Test> for PerfTest {
    fn from(t: Test) -> PerfTest {
        match t {
            Test::Send => PerfTest::Send,
            Test::Write => PerfTest::Write,
            Test::Read => PerfTest::Read,
        }
    }
}

#[derive(Clone, clap::Args)]
pub struct PerfArgs {
    /// What to measure. A soft-rdma server (send/write/read/connect) serves whatever its clients ask, and
    /// so does a TCP server (tcp-stream/tcp-pingpong/tcp-connect).
    #[arg(value_enum)]
    test: PerfTest,
    /// The server's address: where to listen (--server) or connect.
    addr: SocketAddr,
    /// Listen and serve clients (until killed; --once: one client).
    #[arg(long)]
    server: bool,
    /// Server: serve one client, then exit.
    #[arg(long, requires = "server")]
    once: bool,
    /// Message size (k/m suffixes; default 64k for bandwidth, 8 for --latency).
    #[arg(long, value_parser = parse_size, conflicts_with = "sizes")]
    size: Option<u64>,
    /// A sweep of message sizes A..B (k/m suffixes), powers of --factor from A up to B.
    #[arg(long, value_parser = parse_range)]
    sizes: Option<(u64, u64)>,
    /// Step of a --sizes sweep.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(2..))]
    factor: u64,
    /// Operations per message size (with --bytes: at most this many).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    iters: u32,
    /// About this many bytes per message size (k/m/g suffixes): --bytes/size operations, at least 16 and at
    /// most --iters. Keeps a sweep's small sizes from being too short and its large ones too long.
    #[arg(long, value_parser = parse_size)]
    bytes: Option<u64>,
    /// Operations kept in flight (bandwidth mode).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    depth: u32,
    /// Ping-pong latency instead of bandwidth.
    #[arg(long)]
    latency: bool,
    /// Latency mode: spin on the completion queue instead of waiting for completions (costs a CPU).
    #[arg(long)]
    busy_poll: bool,
    /// connect/tcp-connect: connections set up in total (with --hold: connections to open and hold).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    count: u32,
    /// connect/tcp-connect: connections in flight at once (1 = sequential).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    concurrency: u32,
    /// connect/tcp-connect: open --count connections and keep them idle; print a JSON line when they are
    /// up, wait for a line (or end of file) on stdin, then close them all and print a second line.
    #[arg(long)]
    hold: bool,
    /// Give up when a completion takes longer than this many seconds.
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,
    /// JSON for scripts: an array of rows (server: one object per client).
    #[arg(long)]
    json: bool,
}

pub async fn run(uds: Option<PathBuf>, a: PerfArgs) -> Result<()> {
    ensure!(a.timeout > 0.0, "--timeout must be positive");
    ensure!(
        !(a.latency && a.test == PerfTest::TcpStream),
        "tcp-stream measures bandwidth; tcp-pingpong is its latency test"
    );
    if a.test.is_tcp() {
        raise_fd_limit();
        if a.server {
            return tcp_serve(&a).await;
        }
        if a.test == PerfTest::TcpConnect {
            return connect_bench(None, &a).await;
        }
    }
    let adapter = if a.test.is_tcp() {
        None
    } else {
        Some(super::open(uds).await?)
    };
    if let Some(adapter) = &adapter {
        if a.server {
            return serve(adapter, &a).await;
        }
        if a.test == PerfTest::Connect {
            return connect_bench(Some(adapter.clone()), &a).await;
        }
    }
    let latency = a.latency || a.test == PerfTest::TcpPingpong;
    let default_size = if latency { 8 } else { 64 << 10 };
    let sizes: Vec<u64> = match a.sizes {
        Some((lo, hi)) => {
            let mut v = Vec::new();
            let mut s = lo;
            while s <= hi {
                v.push(s);
                match s.checked_mul(a.factor) {
                    Some(n) => s = n,
                    None => break,
                }
            }
            v
        }
        None => vec![a.size.unwrap_or(default_size)],
    };
    let max = adapter
        .as_ref()
        .map_or(u64::from(u32::MAX), |ad| u64::from(ad.info().max_transfer_length));
    for &s in &sizes {
        ensure!(s >= 1, "message size must be at least 1 byte");
        ensure!(
            s <= max,
            "message size {s} exceeds the adapter's maximum transfer length {max}"
        );
    }
    let mode = if latency { "lat" } else { "bw" };
    if !a.json {
        println!(
            "soft-rdma perf: {} {} to {}, {} iterations{}{}",
            a.test.name(),
            if latency { "latency" } else { "bandwidth" },
            a.addr,
            a.iters,
            a.bytes
                .map(|b| format!(" (at most; about {b} bytes per size)"))
                .unwrap_or_default(),
            if latency || a.test.is_tcp() {
                String::new()
            } else {
                format!(", depth {}", a.depth)
            }
        );
        if latency {
            let kind = match a.test {
                PerfTest::Read => "full round trip",
                _ => "half round trip",
            };
            println!("latency: {kind}, µs");
            println!(
                "{:>10} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>13} {:>6}",
                "#bytes",
                "#iterations",
                "t_min",
                "t_p50",
                "t_p99",
                "t_max",
                "t_avg",
                "BW Gb/s",
                "MsgRate Mpps",
                "CPU%"
            );
        } else {
            println!(
                "{:>10} {:>12} {:>10} {:>13} {:>11} {:>11} {:>6}",
                "#bytes", "#iterations", "BW Gb/s", "MsgRate Mpps", "lat p50 µs", "lat p99 µs", "CPU%"
            );
        }
    }
    let mut rows = Vec::new();
    for &size in &sizes {
        let iters = iterations_for(&a, size);
        let row = match (&adapter, a.test.rdma()) {
            (Some(adapter), Some(test)) => client_one(adapter, &a, test, size as u32, iters, mode).await,
            _ => tcp_client(&a, size as u32, iters).await,
        }
        .with_context(|| format!("{} {mode}, {size} bytes", a.test.name()))?;
        if !a.json {
            if latency {
                println!(
                    "{:>10} {:>12} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.3} {:>13.6} {:>6.1}",
                    row.bytes,
                    row.iterations,
                    row.lat_min_us,
                    row.lat_p50_us,
                    row.lat_p99_us,
                    row.lat_max_us,
                    row.lat_avg_us,
                    row.bw_gbps,
                    row.msg_rate_mpps,
                    row.cpu_percent
                );
            } else {
                println!(
                    "{:>10} {:>12} {:>10.3} {:>13.6} {:>11.1} {:>11.1} {:>6.1}",
                    row.bytes,
                    row.iterations,
                    row.bw_gbps,
                    row.msg_rate_mpps,
                    row.lat_p50_us,
                    row.lat_p99_us,
                    row.cpu_percent
                );
            }
        }
        rows.push(row);
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    }
    Ok(())
}

/// Operations for one message size: `--iters`, or with `--bytes` about that many bytes (at least
/// [`MIN_ITERATIONS`], at most `--iters`).
fn iterations_for(a: &PerfArgs, size: u64) -> u32 {
    match a.bytes {
        Some(b) => u32::try_from(b / size.max(1))
            .unwrap_or(u32::MAX)
            .clamp(MIN_ITERATIONS.min(a.iters), a.iters),
        None => a.iters,
    }
}

/// The fewest operations a `--bytes` sweep does for one size.
const MIN_ITERATIONS: u32 = 16;
