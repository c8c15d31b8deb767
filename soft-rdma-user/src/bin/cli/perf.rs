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
use soft_rdma::client::{Adapter, CompletionQueue, Connector, Listener, MemoryRegion, QueuePair};
use soft_rdma::engine::api::{
    Access, Completion, CompletionOp, QueuePairState, ReadLimits, RemoteBuffer, Stag, WorkRequest,
};
use tokio::sync::watch;

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
                s.terminate
                    .map(|t| format!(", terminated {t:?}"))
                    .unwrap_or_default(),
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

/// What the client asks for (its Connect private data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Request {
    test: Test,
    latency: bool,
    busy_poll: bool,
    size: u32,
    iters: u32,
    depth: u32,
    client: RemoteBuffer,
}

const MAGIC: &[u8; 4] = b"SRPF";
const VERSION: u8 = 1;

impl Request {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(32);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&[
            VERSION,
            self.test.code(),
            u8::from(self.latency) | (u8::from(self.busy_poll) << 1),
            0,
        ]);
        b.extend_from_slice(&self.size.to_be_bytes());
        b.extend_from_slice(&self.iters.to_be_bytes());
        b.extend_from_slice(&self.depth.to_be_bytes());
        b.extend_from_slice(&self.client.stag.0.to_be_bytes());
        b.extend_from_slice(&self.client.offset.to_be_bytes());
        b
    }

    fn decode(b: &[u8]) -> Result<Request> {
        ensure!(
            b.len() >= 32 && &b[..4] == MAGIC,
            "not a soft-rdma perf client (private data {})",
            super::show(b)
        );
        ensure!(
            b[4] == VERSION,
            "perf protocol version {} (this is {VERSION})",
            b[4]
        );
        let test = Test::from_code(b[5]).with_context(|| format!("unknown test {}", b[5]))?;
        let u32_at = |o: usize| u32::from_be_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let r = Request {
            test,
            latency: b[6] & 1 != 0,
            busy_poll: b[6] & 2 != 0,
            size: u32_at(8),
            iters: u32_at(12),
            depth: u32_at(16),
            client: RemoteBuffer {
                stag: Stag(u32_at(20)),
                offset: u64::from_be_bytes(b[24..32].try_into().expect("8 bytes")),
            },
        };
        ensure!(r.size > 0 && r.iters > 0 && r.depth > 0, "bad request {r:?}");
        Ok(r)
    }
}

/// The server's answer (its Accept private data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Answer {
    buffer: RemoteBuffer,
    credits: u32,
}

impl Answer {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(20);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&self.buffer.stag.0.to_be_bytes());
        b.extend_from_slice(&self.buffer.offset.to_be_bytes());
        b.extend_from_slice(&self.credits.to_be_bytes());
        b
    }

    fn decode(b: &[u8]) -> Result<Answer> {
        ensure!(
            b.len() >= 20 && &b[..4] == MAGIC,
            "the server is not a soft-rdma perf server (private data {})",
            super::show(b)
        );
        Ok(Answer {
            buffer: RemoteBuffer {
                stag: Stag(u32::from_be_bytes(b[4..8].try_into().expect("4"))),
                offset: u64::from_be_bytes(b[8..16].try_into().expect("8")),
            },
            credits: u32::from_be_bytes(b[16..20].try_into().expect("4")),
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Credit = 1,
    Done = 2,
    Fin = 3,
}

/// A control message (a 24-byte Send).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ctrl {
    kind: Kind,
    count: u32,
    bytes: u64,
    bad: u32,
}

const CTRL_LEN: usize = 24;
/// Control slots: Receives at 0..CTRL_SLOTS, Sends at CTRL_SLOTS..2*CTRL_SLOTS (32 bytes each).
const CTRL_SLOTS: usize = 16;
const CTRL_SLOT: usize = 32;
/// Work-request ids of control Receives and Sends (data operations use their index).
const CTRL_RECV: u64 = 1 << 62;
const CTRL_SEND: u64 = 1 << 61;

impl Ctrl {
    fn encode(&self) -> [u8; CTRL_LEN] {
        let mut b = [0; CTRL_LEN];
        b[0..4].copy_from_slice(&(self.kind as u32).to_be_bytes());
        b[4..8].copy_from_slice(&self.count.to_be_bytes());
        b[8..16].copy_from_slice(&self.bytes.to_be_bytes());
        b[16..20].copy_from_slice(&self.bad.to_be_bytes());
        b
    }

    fn decode(b: &[u8]) -> Result<Ctrl> {
        ensure!(b.len() >= CTRL_LEN, "short control message ({} bytes)", b.len());
        let kind = match u32::from_be_bytes(b[0..4].try_into().expect("4")) {
            1 => Kind::Credit,
            2 => Kind::Done,
            3 => Kind::Fin,
            k => bail!("unknown control message kind {k}"),
        };
        Ok(Ctrl {
            kind,
            count: u32::from_be_bytes(b[4..8].try_into().expect("4")),
            bytes: u64::from_be_bytes(b[8..16].try_into().expect("8")),
            bad: u32::from_be_bytes(b[16..20].try_into().expect("4")),
        })
    }
}

/// Control-message buffers: Receives in slots 0..16, Sends in slots 16..32.
struct CtrlBufs {
    mr: MemoryRegion,
    next_send: usize,
}

impl CtrlBufs {
    async fn new(adapter: &Adapter) -> Result<CtrlBufs> {
        Ok(CtrlBufs {
            mr: adapter
                .register_memory(2 * CTRL_SLOTS * CTRL_SLOT, Access::LOCAL_WRITE)
                .await?,
            next_send: 0,
        })
    }

    fn post_receive(&self, qp: &QueuePair, slot: usize) -> Result<()> {
        qp.receive(
            CTRL_RECV | slot as u64,
            &[self.mr.sge((slot * CTRL_SLOT) as u64, CTRL_SLOT as u32)],
        )?;
        Ok(())
    }

    /// Reads the control message a Receive completion delivered, and reposts its slot.
    fn take(&self, qp: &QueuePair, c: &Completion) -> Result<Ctrl> {
        ensure!(c.wr_id & CTRL_RECV != 0, "unexpected receive completion {c:?}");
        let slot = (c.wr_id & !CTRL_RECV) as usize;
        ensure!(slot < CTRL_SLOTS, "unexpected receive completion {c:?}");
        let len = (c.bytes as usize).min(CTRL_SLOT);
        let msg = Ctrl::decode(&self.mr.to_vec(slot * CTRL_SLOT, len)?)?;
        self.post_receive(qp, slot)?;
        Ok(msg)
    }

    /// Sends `m` from the next send slot (at most CTRL_SLOTS may be outstanding).
    fn send(&mut self, qp: &QueuePair, m: Ctrl) -> Result<()> {
        let slot = CTRL_SLOTS + self.next_send % CTRL_SLOTS;
        self.next_send += 1;
        let off = slot * CTRL_SLOT;
        self.mr.write_at(off, &m.encode())?;
        qp.send(
            CTRL_SEND | self.next_send as u64,
            &[self.mr.sge(off as u64, CTRL_LEN as u32)],
        )?;
        Ok(())
    }
}

/// One row of results.
#[derive(Clone, Debug, serde::Serialize)]
struct Row {
    test: PerfTest,
    mode: &'static str,
    bytes: u64,
    iterations: u32,
    depth: u32,
    elapsed_s: f64,
    bw_gbps: f64,
    msg_rate_mpps: f64,
    /// What the latency figures measure.
    lat_kind: &'static str,
    lat_min_us: f64,
    lat_avg_us: f64,
    lat_p50_us: f64,
    lat_p99_us: f64,
    lat_max_us: f64,
    cpu_percent: f64,
    /// Bytes the server says it received (send bandwidth).
    #[serde(skip_serializing_if = "Option::is_none")]
    server_bytes: Option<u64>,
}

struct Stats {
    min: f64,
    avg: f64,
    p50: f64,
    p99: f64,
    max: f64,
}

/// Nearest-rank percentiles of `samples` (µs).
fn stats(samples: &mut [f64]) -> Stats {
    if samples.is_empty() {
        return Stats {
            min: 0.0,
            avg: 0.0,
            p50: 0.0,
            p99: 0.0,
            max: 0.0,
        };
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let n = samples.len();
    let rank = |q: f64| samples[((q * n as f64).ceil() as usize).clamp(1, n) - 1];
    Stats {
        min: samples[0],
        avg: samples.iter().sum::<f64>() / n as f64,
        p50: rank(0.50),
        p99: rank(0.99),
        max: samples[n - 1],
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Progress on stderr (only when it is a terminal), at most a few times a second.
struct Progress {
    on: bool,
    label: String,
    total: u32,
    last: Instant,
    shown: bool,
}

impl Progress {
    fn new(label: String, total: u32) -> Progress {
        Progress {
            on: std::io::stderr().is_terminal(),
            label,
            total,
            last: Instant::now(),
            shown: false,
        }
    }

    fn tick(&mut self, done: u32) {
        if self.on && self.last.elapsed() >= Duration::from_millis(250) {
            self.last = Instant::now();
            self.shown = true;
            let pct = 100.0 * f64::from(done) / f64::from(self.total.max(1));
            let _ = write!(
                std::io::stderr(),
                "\r  {}: {done}/{} ({pct:.0}%)   ",
                self.label,
                self.total
            );
        }
    }

    fn finish(&mut self) {
        if self.shown {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
            self.shown = false;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
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

// ---------------------------------------------------------------------------------------------------------
// Client.
// ---------------------------------------------------------------------------------------------------------

/// What the client registered for one test.
struct ClientBufs {
    /// send: the source (Receives of --latency pongs land after it); write: the source (--latency: the
    /// landing buffer at 0, the source at `size`); read: the sink.
    data: MemoryRegion,
    ctrl: CtrlBufs,
}

async fn client_one(
    adapter: &Adapter,
    a: &PerfArgs,
    test: Test,
    size: u32,
    iters: u32,
    mode: &'static str,
) -> Result<Row> {
    let info = adapter.info().clone();
    let sz = size as usize;
    let depth = a.depth.min(
        info.max_send_queue_depth
            .saturating_sub(CTRL_SLOTS as u32 + 1)
            .max(1),
    );
    let timeout = Duration::from_secs_f64(a.timeout);

    let (data_len, access) = match (test, a.latency) {
        (Test::Send, false) => (sz, Access::LOCAL_WRITE),
        (Test::Send, true) => (2 * sz, Access::LOCAL_WRITE),
        (Test::Write, false) => (sz, Access::LOCAL_WRITE),
        (Test::Write, true) => (2 * sz, Access::LOCAL_WRITE | Access::REMOTE_WRITE),
        (Test::Read, _) => (sz, Access::LOCAL_WRITE),
    };
    let data = adapter
        .register_memory(data_len, access)
        .await
        .context("registering the data buffer")?;
    match (test, a.latency) {
        (Test::Send | Test::Write, false) => data.write_at(0, &pattern_bytes(sz))?,
        (Test::Send, true) => data.write_at(0, &pattern_bytes(sz))?,
        (Test::Write, true) => {
            data.fill(0, sz, 0)?;
            data.write_at(sz, &pattern_bytes(sz))?;
        }
        (Test::Read, _) => data.fill(0, sz, 0)?,
    }
    let mut bufs = ClientBufs {
        data,
        ctrl: CtrlBufs::new(adapter).await?,
    };

    let send_depth = (depth + CTRL_SLOTS as u32 + 1).min(info.max_send_queue_depth);
    let recv_depth = (CTRL_SLOTS as u32 + 2).min(info.max_receive_queue_depth);
    let cq = adapter
        .create_completion_queue((send_depth + recv_depth).min(info.max_completion_queue_depth))
        .await?;
    let qp = adapter
        .create_queue_pair(&cq, &cq, send_depth, recv_depth)
        .await?;
    // Receives first: iWARP has no receiver-not-ready retry.
    match (test, a.latency) {
        (Test::Send, true) => {
            for slot in 0..2 {
                qp.receive(CTRL_RECV | slot, &[bufs.data.sge(size as u64, size)])?;
            }
        }
        (Test::Send | Test::Write, false) => {
            for slot in 0..4 {
                bufs.ctrl.post_receive(&qp, slot)?;
            }
        }
        _ => {}
    }
    let request = Request {
        test,
        latency: a.latency,
        busy_poll: a.busy_poll,
        size,
        iters,
        depth,
        client: if test == Test::Write && a.latency {
            bufs.data.remote(0)
        } else {
            RemoteBuffer {
                stag: Stag(0),
                offset: 0,
            }
        },
    };
    let connector = adapter.create_connector().await?;
    let limits = ReadLimits {
        inbound: 16.min(info.max_inbound_read_limit),
        outbound: depth.min(info.max_outbound_read_limit).max(1),
    };
    let answer =
        Answer::decode(&connect(&connector, &qp, a.addr, limits, &request.encode(), timeout).await?)?;
    connector.complete_connect().await?;
    let mut conn = Conn::new(connector, qp, cq, timeout);

    let label = format!("{} {mode} {size} B", test.name());
    mark_interval(false);
    let result = match (test, a.latency) {
        (_, false) => client_bw(&mut conn, &mut bufs, test, size, iters, depth, answer, label).await,
        (Test::Send, true) => client_send_lat(&mut conn, &bufs, size, iters, a.busy_poll, label).await,
        (Test::Write, true) => client_write_lat(&mut conn, &bufs, size, iters, answer, label).await,
        (Test::Read, true) => {
            client_read_lat(&mut conn, &bufs, size, iters, a.busy_poll, answer, label).await
        }
    };
    mark_interval(true);
    conn.close().await;
    let m = result?;
    let secs = m.elapsed.as_secs_f64();
    let mut lat = m.lat;
    let s = stats(&mut lat);
    Ok(Row {
        test: PerfTest::from(test),
        mode,
        bytes: u64::from(size),
        iterations: iters,
        depth: if a.latency { 1 } else { depth },
        elapsed_s: secs,
        bw_gbps: (u64::from(size) * u64::from(iters)) as f64 * 8.0 / secs / 1e9,
        msg_rate_mpps: f64::from(iters) / secs / 1e6,
        lat_kind: match (a.latency, test) {
            (false, _) => "post-to-completion",
            (true, Test::Read) => "round-trip",
            (true, _) => "half-round-trip",
        },
        lat_min_us: s.min,
        lat_avg_us: s.avg,
        lat_p50_us: s.p50,
        lat_p99_us: s.p99,
        lat_max_us: s.max,
        cpu_percent: 100.0 * m.cpu.as_secs_f64() / secs,
        server_bytes: m.server_bytes,
    })
}

/// What one measured run yields.
struct Measured {
    elapsed: Duration,
    cpu: Duration,
    /// µs per operation.
    lat: Vec<f64>,
    server_bytes: Option<u64>,
}

#[allow(clippy::too_many_arguments)]
async fn client_bw(
    conn: &mut Conn,
    bufs: &mut ClientBufs,
    test: Test,
    size: u32,
    iters: u32,
    depth: u32,
    answer: Answer,
    label: String,
) -> Result<Measured> {
    let mut progress = Progress::new(label, iters);
    let mut credits: u64 = match test {
        Test::Send => {
            ensure!(answer.credits > 0, "the server granted no receive credits");
            u64::from(answer.credits)
        }
        _ => u64::MAX,
    };
    let data_op = match test {
        Test::Send => CompletionOp::Send,
        Test::Write => CompletionOp::Write,
        Test::Read => CompletionOp::Read,
    };
    let make = |i: u64| match test {
        Test::Send => WorkRequest::Send {
            id: i,
            sgl: vec![bufs.data.sge(0, size)],
            solicited: false,
            invalidate: None,
        },
        Test::Write => WorkRequest::Write {
            id: i,
            sgl: vec![bufs.data.sge(0, size)],
            remote: answer.buffer,
        },
        Test::Read => WorkRequest::Read {
            id: i,
            sink: bufs.data.sge(0, size),
            remote: answer.buffer,
        },
    };
    let n = iters as usize;
    let mut posted = 0usize;
    let mut completed = 0usize;
    let mut done: Option<Ctrl> = None;
    let mut lat = Vec::with_capacity(n);
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    let mut post_at = vec![t0; n];
    while completed < n {
        let mut batch = Vec::new();
        let now = Instant::now();
        while posted < n && posted - completed < depth as usize && credits > 0 {
            batch.push(make(posted as u64));
            post_at[posted] = now;
            posted += 1;
            credits -= 1;
        }
        if !batch.is_empty() {
            conn.qp.post(batch)?;
        }
        let got = conn.wait(256, "data completions").await?;
        let now = Instant::now();
        for c in got {
            conn.check(&c, "bandwidth test").await?;
            if c.op == data_op && c.wr_id < n as u64 {
                completed += 1;
                lat.push(us(now - post_at[c.wr_id as usize]));
            } else if c.op == CompletionOp::Receive {
                let m = bufs.ctrl.take(&conn.qp, &c)?;
                match m.kind {
                    Kind::Credit => credits += u64::from(m.count),
                    Kind::Done => done = Some(m),
                    Kind::Fin => bail!("unexpected fin from the server"),
                }
            }
        }
        progress.tick(completed as u32);
    }
    progress.finish();
    // Send: the server's `done` says everything arrived. Write: `fin` (after the Writes) and its `done`.
    if test == Test::Write {
        bufs.ctrl.send(
            &conn.qp,
            Ctrl {
                kind: Kind::Fin,
                count: iters,
                bytes: u64::from(size) * u64::from(iters),
                bad: 0,
            },
        )?;
    }
    if test != Test::Read {
        while done.is_none() {
            let c = conn.next_of(CompletionOp::Receive, "the server's done").await?;
            let m = bufs.ctrl.take(&conn.qp, &c)?;
            if m.kind == Kind::Done {
                done = Some(m);
            }
        }
    }
    let elapsed = t0.elapsed();
    let cpu = cpu_time().saturating_sub(cpu0);
    let mut server_bytes = None;
    match test {
        Test::Send => {
            let d = done.expect("waited for");
            let want = u64::from(size) * u64::from(iters);
            ensure!(
                d.count == iters && d.bytes == want,
                "the server received {} messages, {} bytes; {iters} messages, {want} bytes were sent",
                d.count,
                d.bytes
            );
            ensure!(
                d.bad == 0,
                "the server found {} bad bytes in what it received",
                d.bad
            );
            server_bytes = Some(d.bytes);
        }
        Test::Write => {
            let d = done.expect("waited for");
            ensure!(d.bad == 0, "the server found {} bad bytes in its buffer", d.bad);
        }
        Test::Read => {
            let bad = pattern_mismatches(&bufs.data, 0, size as usize)?;
            ensure!(bad == 0, "{bad} bytes read differ from the server's pattern");
        }
    }
    Ok(Measured {
        elapsed,
        cpu,
        lat,
        server_bytes,
    })
}

/// Keeps at most this many of this side's own requests uncompleted in the latency tests.
const LAT_OUTSTANDING: u32 = 8;

/// Waits for completions of this side's own requests of `op` until at most `keep` are outstanding.
async fn drain(
    conn: &mut Conn,
    op: CompletionOp,
    outstanding: &mut u32,
    keep: u32,
    what: &str,
) -> Result<()> {
    while *outstanding > keep {
        for c in conn.wait(64, what).await? {
            conn.check(&c, what).await?;
            if c.op == op {
                *outstanding -= 1;
            }
        }
    }
    Ok(())
}

async fn client_send_lat(
    conn: &mut Conn,
    bufs: &ClientBufs,
    size: u32,
    iters: u32,
    busy: bool,
    label: String,
) -> Result<Measured> {
    let mut progress = Progress::new(label, iters);
    let mut lat = Vec::with_capacity(iters as usize);
    let mut outstanding = 0u32;
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    for i in 0..iters {
        let start = Instant::now();
        conn.qp.send(u64::from(i), &[bufs.data.sge(0, size)])?;
        outstanding += 1;
        let mut end = None;
        while end.is_none() {
            for c in conn.get(busy, 16, "the pong").await? {
                conn.check(&c, "send latency").await?;
                match c.op {
                    CompletionOp::Receive => {
                        end = Some(Instant::now());
                        ensure!(c.bytes == size, "pong of {} bytes, expected {size}", c.bytes);
                        conn.qp
                            .receive(c.wr_id, &[bufs.data.sge(u64::from(size), size)])?;
                    }
                    CompletionOp::Send => outstanding -= 1,
                    _ => {}
                }
            }
        }
        lat.push(us(end.expect("set") - start) / 2.0);
        drain(
            conn,
            CompletionOp::Send,
            &mut outstanding,
            LAT_OUTSTANDING,
            "send completions",
        )
        .await?;
        progress.tick(i + 1);
    }
    drain(conn, CompletionOp::Send, &mut outstanding, 0, "send completions").await?;
    Ok(Measured {
        elapsed: t0.elapsed(),
        cpu: cpu_time().saturating_sub(cpu0),
        lat,
        server_bytes: None,
    })
}

/// Spins until the byte at `offset` of `mr` is `want` (RDMA Write has no completion at its target).
async fn poll_byte(
    conn: &mut Conn,
    mr: &MemoryRegion,
    offset: usize,
    want: u8,
    own: CompletionOp,
    outstanding: &mut u32,
) -> Result<Instant> {
    let start = Instant::now();
    let mut b = [0u8];
    let mut spins = 0u32;
    loop {
        mr.read_at(offset, &mut b)?;
        if b[0] == want {
            return Ok(Instant::now());
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(64) {
            for c in conn.poll(16) {
                conn.check(&c, "write latency").await?;
                if c.op == own {
                    *outstanding = outstanding.saturating_sub(1);
                }
            }
            if conn.peer_gone() {
                return Err(PeerGone.into());
            }
            if start.elapsed() > conn.timeout {
                return Err(conn.timed_out("the peer's RDMA Write").await);
            }
            // Two daemons and two of these may share few CPUs: let them run.
            std::thread::yield_now();
            tokio::task::yield_now().await;
        } else {
            std::hint::spin_loop();
        }
    }
}

async fn client_write_lat(
    conn: &mut Conn,
    bufs: &ClientBufs,
    size: u32,
    iters: u32,
    answer: Answer,
    label: String,
) -> Result<Measured> {
    let sz = size as usize;
    let mut progress = Progress::new(label, iters);
    let mut lat = Vec::with_capacity(iters as usize);
    let mut outstanding = 0u32;
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    for i in 0..iters {
        let seq = (i % 255 + 1) as u8;
        bufs.data.write_at(2 * sz - 1, &[seq])?;
        let start = Instant::now();
        conn.qp.write(
            u64::from(i),
            &[bufs.data.sge(u64::from(size), size)],
            answer.buffer,
        )?;
        outstanding += 1;
        let end = poll_byte(
            conn,
            &bufs.data,
            sz - 1,
            seq,
            CompletionOp::Write,
            &mut outstanding,
        )
        .await?;
        lat.push(us(end - start) / 2.0);
        drain(
            conn,
            CompletionOp::Write,
            &mut outstanding,
            LAT_OUTSTANDING,
            "write completions",
        )
        .await?;
        progress.tick(i + 1);
    }
    drain(
        conn,
        CompletionOp::Write,
        &mut outstanding,
        0,
        "write completions",
    )
    .await?;
    Ok(Measured {
        elapsed: t0.elapsed(),
        cpu: cpu_time().saturating_sub(cpu0),
        lat,
        server_bytes: None,
    })
}

async fn client_read_lat(
    conn: &mut Conn,
    bufs: &ClientBufs,
    size: u32,
    iters: u32,
    busy: bool,
    answer: Answer,
    label: String,
) -> Result<Measured> {
    let mut progress = Progress::new(label, iters);
    let mut lat = Vec::with_capacity(iters as usize);
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    for i in 0..iters {
        let start = Instant::now();
        conn.qp
            .read(u64::from(i), bufs.data.sge(0, size), answer.buffer)?;
        let mut end = None;
        while end.is_none() {
            for c in conn.get(busy, 16, "the read").await? {
                conn.check(&c, "read latency").await?;
                if c.op == CompletionOp::Read && c.wr_id == u64::from(i) {
                    end = Some(Instant::now());
                }
            }
        }
        lat.push(us(end.expect("set") - start));
        progress.tick(i + 1);
    }
    let elapsed = t0.elapsed();
    let cpu = cpu_time().saturating_sub(cpu0);
    let bad = pattern_mismatches(&bufs.data, 0, size as usize)?;
    ensure!(bad == 0, "{bad} bytes read differ from the server's pattern");
    Ok(Measured {
        elapsed,
        cpu,
        lat,
        server_bytes: None,
    })
}

// ---------------------------------------------------------------------------------------------------------
// Server.
// ---------------------------------------------------------------------------------------------------------

/// What the server says about one client.
#[derive(Clone, Debug, serde::Serialize)]
struct ServerReport {
    peer: SocketAddr,
    test: Test,
    mode: &'static str,
    bytes: u32,
    iterations: u32,
    depth: u32,
    /// Send bandwidth: messages and bytes received, between the first and last arrival.
    #[serde(skip_serializing_if = "Option::is_none")]
    received_messages: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    received_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    receive_gbps: Option<f64>,
    /// Whether the data this side checked was intact (send/write bandwidth).
    #[serde(skip_serializing_if = "Option::is_none")]
    data_ok: Option<bool>,
    /// How the connection ended: "disconnected" by the client, or "closed" by the server after waiting.
    end: &'static str,
}

/// GetConnectionRequest calls a server keeps outstanding: connection-setup clients may have hundreds of
/// handshakes in flight, and each offer costs the server two calls to its daemon before the next is taken.
const ACCEPT_LOOPS: usize = 8;

async fn serve(adapter: &Adapter, a: &PerfArgs) -> Result<()> {
    let listener = Arc::new(adapter.create_listener().await?);
    let bound = listener.listen(a.addr, 0).await?;
    if !a.json {
        println!(
            "soft-rdma perf server on {bound}: serves send/write/read, bandwidth or latency, and connect, as each client asks{}",
            if a.once { " (one client)" } else { "" }
        );
    }
    let loops = if a.once { 1 } else { ACCEPT_LOOPS };
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..loops {
        set.spawn(accept_loop(adapter.clone(), listener.clone(), a.clone()));
    }
    // Runs until one loop fails (e.g. the daemon went away); --once: until its one client is served.
    match set.join_next().await {
        Some(r) => r?,
        None => Ok(()),
    }
}

async fn accept_loop(adapter: Adapter, listener: Arc<Listener>, a: PerfArgs) -> Result<()> {
    loop {
        let connector = adapter.create_connector().await?;
        let offer = listener.get_connection_request(&connector).await?;
        let peer = offer.peer;
        if is_connect_request(&offer.private_data) {
            let timeout = Duration::from_secs_f64(a.timeout);
            let task = tokio::spawn(async move {
                let r = serve_connect(connector, peer, timeout).await;
                if let Err(e) = &r {
                    eprintln!("client {peer}: {e:#}");
                }
                r
            });
            if a.once {
                return task.await?;
            }
            continue;
        }
        match server_one(&adapter, connector, &offer.private_data, peer, &a).await {
            Ok(r) => {
                if a.json {
                    println!("{}", serde_json::to_string(&r)?);
                } else {
                    let mut line = format!(
                        "client {peer}: {} {} {} B × {}",
                        r.test.name(),
                        r.mode,
                        r.bytes,
                        r.iterations
                    );
                    if let (Some(m), Some(b)) = (r.received_messages, r.received_bytes) {
                        line += &format!(", received {m} messages / {b} bytes");
                    }
                    if let Some(g) = r.receive_gbps {
                        line += &format!(" at {g:.3} Gb/s");
                    }
                    if let Some(ok) = r.data_ok {
                        line += if ok { ", data ok" } else { ", DATA MISMATCH" };
                    }
                    line += &format!(" ({})", r.end);
                    println!("{line}");
                }
            }
            Err(e) => {
                eprintln!("client {peer}: {e:#}");
                if a.once {
                    return Err(e);
                }
            }
        }
        if a.once {
            return Ok(());
        }
    }
}

/// Waits for the client to leave (its disconnect, or the queue pair going to error); `None` = no limit.
async fn wait_end(conn: &Conn, limit: Option<Duration>) -> &'static str {
    let start = Instant::now();
    loop {
        if conn.wait_gone(Some(Duration::from_secs(1))).await {
            return "disconnected";
        }
        if let Ok(s) = conn.qp.query().await
            && s.state == QueuePairState::Error
        {
            return "disconnected";
        }
        if limit.is_some_and(|l| start.elapsed() >= l) {
            return "closed";
        }
    }
}

async fn server_one(
    adapter: &Adapter,
    connector: Connector,
    private_data: &[u8],
    peer: SocketAddr,
    a: &PerfArgs,
) -> Result<ServerReport> {
    let req = match Request::decode(private_data) {
        Ok(r) => r,
        Err(e) => {
            let _ = connector.reject(b"soft-rdma perf: bad request").await;
            return Err(e);
        }
    };
    let info = adapter.info().clone();
    if req.size > info.max_transfer_length {
        let _ = connector.reject(b"soft-rdma perf: message too large").await;
        bail!("{} bytes exceeds the maximum transfer length", req.size);
    }
    let size = req.size;
    let sz = size as usize;
    let timeout = Duration::from_secs_f64(a.timeout);
    let send_bw = req.test == Test::Send && !req.latency;
    let credits = if send_bw {
        (2 * req.depth).clamp(16, info.max_receive_queue_depth.max(1))
    } else {
        0
    };
    // Send bandwidth: Receives share up to 16 MiB of slots (the data is only checked once, at the end).
    let slots = if send_bw {
        (credits as usize).min((16usize << 20).div_ceil(sz)).max(1)
    } else {
        1
    };
    let (data_len, access) = match (req.test, req.latency) {
        (Test::Send, false) => (slots * sz, Access::LOCAL_WRITE),
        (Test::Send, true) => (2 * sz, Access::LOCAL_WRITE),
        (Test::Write, false) => (sz, Access::LOCAL_WRITE | Access::REMOTE_WRITE),
        (Test::Write, true) => (2 * sz, Access::LOCAL_WRITE | Access::REMOTE_WRITE),
        (Test::Read, _) => (sz, Access::REMOTE_READ),
    };
    let data = adapter.register_memory(data_len, access).await?;
    match (req.test, req.latency) {
        (Test::Write, true) => {
            data.fill(0, sz, 0)?;
            data.write_at(sz, &pattern_bytes(sz))?;
        }
        (Test::Send, true) => data.write_at(sz, &pattern_bytes(sz))?,
        (Test::Read, _) => data.write_at(0, &pattern_bytes(sz))?,
        _ => data.fill(0, data_len, 0)?,
    }
    let mut ctrl = CtrlBufs::new(adapter).await?;
    let recv_depth = match (req.test, req.latency) {
        (Test::Send, false) => credits,
        (Test::Send, true) => 2,
        (Test::Write, false) => CTRL_SLOTS as u32,
        _ => 1,
    }
    .min(info.max_receive_queue_depth);
    let send_depth = (CTRL_SLOTS as u32 + 2 + LAT_OUTSTANDING).min(info.max_send_queue_depth);
    let cq = adapter
        .create_completion_queue((send_depth + recv_depth).min(info.max_completion_queue_depth))
        .await?;
    let qp = adapter
        .create_queue_pair(&cq, &cq, send_depth, recv_depth)
        .await?;
    let slot_sge = |k: u64| data.sge((k as usize % slots * sz) as u64, size);
    match (req.test, req.latency) {
        (Test::Send, false) => {
            for k in 0..u64::from(recv_depth) {
                qp.receive(k, &[slot_sge(k)])?;
            }
        }
        (Test::Send, true) => {
            for k in 0..2 {
                qp.receive(k, &[data.sge(0, size)])?;
            }
        }
        (Test::Write, false) => {
            for slot in 0..4 {
                ctrl.post_receive(&qp, slot)?;
            }
        }
        _ => {}
    }
    let answer = Answer {
        buffer: if req.test == Test::Send {
            RemoteBuffer {
                stag: Stag(0),
                offset: 0,
            }
        } else {
            data.remote(0)
        },
        credits: if send_bw { recv_depth } else { 0 },
    };
    let limits = ReadLimits {
        inbound: info.max_inbound_read_limit,
        outbound: 16.min(info.max_outbound_read_limit),
    };
    tokio::time::timeout(timeout, connector.accept_qp(&qp, limits, &answer.encode()))
        .await
        .map_err(|_| anyhow::anyhow!("accept: the connection was not established within {timeout:?}"))??;
    let mut conn = Conn::new(connector, qp, cq, timeout);
    let mut report = ServerReport {
        peer,
        test: req.test,
        mode: if req.latency { "lat" } else { "bw" },
        bytes: size,
        iterations: req.iters,
        depth: req.depth,
        received_messages: None,
        received_bytes: None,
        receive_gbps: None,
        data_ok: None,
        end: "closed",
    };
    let result: Result<()> = async {
        match (req.test, req.latency) {
            (Test::Send, false) => {
                let batch = (recv_depth / 2).max(1);
                let (mut count, mut bytes, mut bad, mut since) = (0u32, 0u64, 0u32, 0u32);
                let mut ctrl_out = 0usize;
                let mut last_slot = 0u64;
                let mut first = None;
                let mut last = Instant::now();
                while count < req.iters {
                    for c in conn.wait(256, "the client's sends").await? {
                        conn.check(&c, "send bandwidth").await?;
                        match c.op {
                            CompletionOp::Receive => {
                                last = Instant::now();
                                first.get_or_insert(last);
                                count += 1;
                                bytes += u64::from(c.bytes);
                                if c.bytes != size {
                                    bad += 1;
                                }
                                last_slot = c.wr_id;
                                conn.qp.receive(c.wr_id, &[slot_sge(c.wr_id)])?;
                                since += 1;
                            }
                            CompletionOp::Send => ctrl_out = ctrl_out.saturating_sub(1),
                            _ => {}
                        }
                    }
                    if since >= batch && count < req.iters && ctrl_out < CTRL_SLOTS - 1 {
                        ctrl.send(
                            &conn.qp,
                            Ctrl {
                                kind: Kind::Credit,
                                count: since,
                                bytes: 0,
                                bad: 0,
                            },
                        )?;
                        ctrl_out += 1;
                        since = 0;
                    }
                }
                bad += pattern_mismatches(&data, last_slot as usize % slots * sz, sz)? as u32;
                ctrl.send(
                    &conn.qp,
                    Ctrl {
                        kind: Kind::Done,
                        count,
                        bytes,
                        bad,
                    },
                )?;
                ctrl_out += 1;
                while ctrl_out > 0 {
                    conn.next_of(CompletionOp::Send, "control sends").await?;
                    ctrl_out -= 1;
                }
                report.received_messages = Some(count);
                report.received_bytes = Some(bytes);
                if let Some(f) = first
                    && last > f
                {
                    report.receive_gbps = Some(bytes as f64 * 8.0 / (last - f).as_secs_f64() / 1e9);
                }
                report.data_ok = Some(bad == 0);
            }
            (Test::Write, false) => {
                // The Writes complete nowhere here: wait (as long as it takes) for the fin behind them.
                conn.timeout = Duration::from_secs(86_400);
                let c = conn.next_of(CompletionOp::Receive, "the client's fin").await?;
                conn.timeout = timeout;
                let m = ctrl.take(&conn.qp, &c)?;
                ensure!(m.kind == Kind::Fin, "expected fin, got {m:?}");
                let bad = pattern_mismatches(&data, 0, sz)?;
                ctrl.send(
                    &conn.qp,
                    Ctrl {
                        kind: Kind::Done,
                        count: m.count,
                        bytes: m.bytes,
                        bad: bad as u32,
                    },
                )?;
                conn.next_of(CompletionOp::Send, "the done send").await?;
                report.data_ok = Some(bad == 0);
            }
            (Test::Send, true) => {
                let mut outstanding = 0u32;
                for i in 0..req.iters {
                    let mut got = false;
                    while !got {
                        let what = "the client's ping";
                        for c in conn.get(req.busy_poll, 16, what).await? {
                            conn.check(&c, "send latency").await?;
                            match c.op {
                                CompletionOp::Receive => {
                                    got = true;
                                    conn.qp.receive(c.wr_id, &[data.sge(0, size)])?;
                                }
                                CompletionOp::Send => outstanding -= 1,
                                _ => {}
                            }
                        }
                    }
                    conn.qp.send(u64::from(i), &[data.sge(u64::from(size), size)])?;
                    outstanding += 1;
                    drain(
                        &mut conn,
                        CompletionOp::Send,
                        &mut outstanding,
                        LAT_OUTSTANDING,
                        "pong sends",
                    )
                    .await?;
                }
                drain(&mut conn, CompletionOp::Send, &mut outstanding, 0, "pong sends").await?;
            }
            (Test::Write, true) => {
                let mut outstanding = 0u32;
                for i in 0..req.iters {
                    let seq = (i % 255 + 1) as u8;
                    poll_byte(
                        &mut conn,
                        &data,
                        sz - 1,
                        seq,
                        CompletionOp::Write,
                        &mut outstanding,
                    )
                    .await?;
                    data.write_at(2 * sz - 1, &[seq])?;
                    conn.qp
                        .write(u64::from(i), &[data.sge(u64::from(size), size)], req.client)?;
                    outstanding += 1;
                    drain(
                        &mut conn,
                        CompletionOp::Write,
                        &mut outstanding,
                        LAT_OUTSTANDING,
                        "pong writes",
                    )
                    .await?;
                }
                drain(&mut conn, CompletionOp::Write, &mut outstanding, 0, "pong writes").await?;
            }
            (Test::Read, _) => {
                // One-sided: the daemon serves the Reads; wait for the client to leave.
                report.end = wait_end(&conn, None).await;
            }
        }
        Ok(())
    }
    .await;
    if let Err(e) = result {
        conn.close().await;
        return Err(e);
    }
    if req.test != Test::Read {
        report.end = wait_end(&conn, Some(Duration::from_secs(30))).await;
    }
    conn.close().await;
    Ok(report)
}

// ---------------------------------------------------------------------------------------------------------
// Connection setup: `connect` (soft-rdma) and `tcp-connect` (its kernel-TCP baseline).
// ---------------------------------------------------------------------------------------------------------

/// The test code of a connection-setup client in its Connect private data (send/write/read are 0/1/2).
const CONNECT_TEST: u8 = 3;

/// The 32 bytes each side of a connection-setup test sends: the magic, the version, the test code.
fn connect_private_data() -> [u8; 32] {
    let mut b = [0u8; 32];
    b[..4].copy_from_slice(MAGIC);
    b[4] = VERSION;
    b[5] = CONNECT_TEST;
    b
}

fn is_connect_request(pd: &[u8]) -> bool {
    pd.len() >= 6 && &pd[..4] == MAGIC && pd[4] == VERSION && pd[5] == CONNECT_TEST
}

/// The read limits both sides of a connection-setup test offer.
const CONNECT_LIMITS: ReadLimits = ReadLimits {
    inbound: 16,
    outbound: 16,
};

/// The server's side of one connection-setup test: Accept with 32 bytes, then wait for the client to leave.
async fn serve_connect(connector: Connector, peer: SocketAddr, timeout: Duration) -> Result<()> {
    match tokio::time::timeout(timeout, connector.accept(CONNECT_LIMITS, &connect_private_data())).await {
        Err(_) => bail!("connect: Accept did not complete within {timeout:?}"),
        Ok(Err(e)) => return Err(anyhow::Error::from(e).context(format!("connect from {peer}: Accept"))),
        Ok(Ok(())) => {}
    }
    let _ = connector.notify_disconnect().await;
    Ok(())
}

/// Who sets connections up: soft-rdma through its daemon, or plain kernel TCP.
#[derive(Clone)]
enum Setup {
    Rdma(Adapter),
    Tcp,
}

/// One connection, up.
enum Held {
    Rdma(Connector),
    Tcp(tokio::net::TcpStream),
}

impl Setup {
    /// The steps of one connection's life, as `rdma_cm`'s cmtime times them.
    fn steps(&self) -> &'static [&'static str] {
        match self {
            // create: CreateConnector; connect: Connect until the MPA Reply (the peer's Accept) is in;
            // complete: CompleteConnect (sends the RTR); disconnect: Disconnect.
            Setup::Rdma(_) => &["create", "connect", "complete", "disconnect"],
            // connect: connect(2) until the SYN-ACK; request-response: 32 B each way; close: shutdown + close.
            Setup::Tcp => &["connect", "request-response", "close"],
        }
    }

    fn test(&self) -> PerfTest {
        match self {
            Setup::Rdma(_) => PerfTest::Connect,
            Setup::Tcp => PerfTest::TcpConnect,
        }
    }

    /// Sets one connection up; returns it with the time of each step but the last.
    async fn open(&self, addr: SocketAddr, timeout: Duration) -> Result<(Held, Vec<Duration>)> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let t0 = Instant::now();
        match self {
            Setup::Rdma(adapter) => {
                let c = adapter.create_connector().await?;
                let t1 = Instant::now();
                // A little longer than ours, so that the daemon's own connect timeout speaks first.
                let limit = timeout + Duration::from_secs(5);
                match tokio::time::timeout(limit, c.connect(addr, CONNECT_LIMITS, &connect_private_data()))
                    .await
                {
                    Err(_) => bail!("Connect to {addr}: no answer within {limit:?}"),
                    Ok(Err(e)) => return Err(anyhow::Error::from(e).context(format!("Connect to {addr}"))),
                    Ok(Ok(())) => {}
                }
                let t2 = Instant::now();
                tokio::time::timeout(timeout, c.complete_connect())
                    .await
                    .map_err(|_| anyhow::anyhow!("CompleteConnect: no answer within {timeout:?}"))?
                    .context("CompleteConnect")?;
                let t3 = Instant::now();
                Ok((Held::Rdma(c), vec![t1 - t0, t2 - t1, t3 - t2]))
            }
            Setup::Tcp => {
                let mut s = tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr))
                    .await
                    .map_err(|_| anyhow::anyhow!("TCP connect to {addr}: no answer within {timeout:?}"))?
                    .with_context(|| format!("TCP connect to {addr}"))?;
                s.set_nodelay(true)?;
                let t1 = Instant::now();
                s.write_all(&TcpHeader::connect().encode()).await?;
                let mut back = [0u8; 32];
                tokio::time::timeout(timeout, s.read_exact(&mut back))
                    .await
                    .map_err(|_| anyhow::anyhow!("no TCP response within {timeout:?}"))?
                    .context("reading the TCP response")?;
                ensure!(&back[..4] == TCP_MAGIC, "not a soft-rdma perf TCP server");
                let t2 = Instant::now();
                Ok((Held::Tcp(s), vec![t1 - t0, t2 - t1]))
            }
        }
    }

    /// Takes one connection down; returns how long that took.
    async fn close(held: Held, timeout: Duration) -> Result<Duration> {
        use tokio::io::AsyncWriteExt;
        let t0 = Instant::now();
        match held {
            Held::Rdma(c) => {
                tokio::time::timeout(timeout, c.disconnect())
                    .await
                    .map_err(|_| anyhow::anyhow!("Disconnect: no answer within {timeout:?}"))?
                    .context("Disconnect")?;
                drop(c);
            }
            Held::Tcp(mut s) => {
                let _ = s.shutdown().await;
                drop(s);
            }
        }
        Ok(t0.elapsed())
    }
}

/// Figures of one step (µs).
#[derive(Clone, Debug, serde::Serialize)]
struct StepRow {
    step: &'static str,
    p50_us: f64,
    p99_us: f64,
    avg_us: f64,
}

/// One connection-setup measurement.
#[derive(Clone, Debug, serde::Serialize)]
struct ConnRow {
    test: PerfTest,
    concurrency: u32,
    /// Connections attempted.
    count: u32,
    /// Connections set up and taken down without an error.
    completed: u32,
    errors: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    first_error: Option<String>,
    elapsed_s: f64,
    /// Completed connections (set up and taken down) per second.
    rate_per_s: f64,
    /// One connection's whole life (every step), µs.
    lat_min_us: f64,
    lat_p50_us: f64,
    lat_p99_us: f64,
    lat_max_us: f64,
    lat_avg_us: f64,
    steps: Vec<StepRow>,
    cpu_percent: f64,
}

/// Connections opened (and closed) with `concurrency` in flight.
struct Opened {
    held: Vec<Held>,
    /// Per connection: the time of each step.
    steps: Vec<Vec<Duration>>,
    errors: u32,
    first_error: Option<String>,
    elapsed: Duration,
    cpu: Duration,
}

/// Sets up `count` connections with `concurrency` in flight; `keep`: hold them, else take each down at once.
async fn open_many(
    setup: &Setup,
    addr: SocketAddr,
    count: u32,
    concurrency: u32,
    keep: bool,
    timeout: Duration,
) -> Opened {
    let mut progress = Progress::new(format!("{} ×{concurrency}", setup.test().name()), count);
    let spawn = |set: &mut tokio::task::JoinSet<Result<(Option<Held>, Vec<Duration>)>>| {
        let setup = setup.clone();
        set.spawn(async move {
            let (held, mut steps) = setup.open(addr, timeout).await?;
            if keep {
                return Ok((Some(held), steps));
            }
            steps.push(Setup::close(held, timeout).await?);
            Ok((None, steps))
        });
    };
    let mut set = tokio::task::JoinSet::new();
    let mut out = Opened {
        held: Vec::new(),
        steps: Vec::with_capacity(count as usize),
        errors: 0,
        first_error: None,
        elapsed: Duration::ZERO,
        cpu: Duration::ZERO,
    };
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    let mut started = 0u32;
    while started < count.min(concurrency) {
        spawn(&mut set);
        started += 1;
    }
    let mut done = 0u32;
    while let Some(r) = set.join_next().await {
        done += 1;
        match r.map_err(anyhow::Error::from).and_then(|r| r) {
            Ok((held, steps)) => {
                out.held.extend(held);
                out.steps.push(steps);
            }
            Err(e) => {
                out.errors += 1;
                out.first_error.get_or_insert_with(|| format!("{e:#}"));
            }
        }
        if started < count {
            spawn(&mut set);
            started += 1;
        }
        progress.tick(done);
    }
    out.elapsed = t0.elapsed();
    out.cpu = cpu_time().saturating_sub(cpu0);
    progress.finish();
    out
}

async fn connect_bench(adapter: Option<Adapter>, a: &PerfArgs) -> Result<()> {
    let setup = match adapter {
        Some(ad) => Setup::Rdma(ad),
        None => Setup::Tcp,
    };
    let timeout = Duration::from_secs_f64(a.timeout);
    if a.hold {
        return hold(&setup, a, timeout).await;
    }
    let o = open_many(&setup, a.addr, a.count, a.concurrency, false, timeout).await;
    let names = setup.steps();
    let mut total: Vec<f64> = o.steps.iter().map(|s| us(s.iter().sum::<Duration>())).collect();
    let t = stats(&mut total);
    let steps = names
        .iter()
        .enumerate()
        .map(|(i, &step)| {
            let mut v: Vec<f64> = o.steps.iter().map(|s| us(s[i])).collect();
            let s = stats(&mut v);
            StepRow {
                step,
                p50_us: s.p50,
                p99_us: s.p99,
                avg_us: s.avg,
            }
        })
        .collect();
    let secs = o.elapsed.as_secs_f64();
    let row = ConnRow {
        test: setup.test(),
        concurrency: a.concurrency,
        count: a.count,
        completed: o.steps.len() as u32,
        errors: o.errors,
        first_error: o.first_error.clone(),
        elapsed_s: secs,
        rate_per_s: o.steps.len() as f64 / secs,
        lat_min_us: t.min,
        lat_p50_us: t.p50,
        lat_p99_us: t.p99,
        lat_max_us: t.max,
        lat_avg_us: t.avg,
        steps,
        cpu_percent: 100.0 * o.cpu.as_secs_f64() / secs,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&[&row])?);
    } else {
        println!(
            "soft-rdma perf: {} to {}, {} connections, {} in flight",
            setup.test().name(),
            a.addr,
            a.count,
            a.concurrency
        );
        println!(
            "{:>11} {:>10} {:>10} {:>10} {:>10} {:>6}  steps p50 (p99) µs",
            "#completed", "conn/s", "t_p50 µs", "t_p99 µs", "t_max µs", "CPU%"
        );
        let steps: Vec<String> = row
            .steps
            .iter()
            .map(|s| format!("{} {:.0} ({:.0})", s.step, s.p50_us, s.p99_us))
            .collect();
        println!(
            "{:>11} {:>10.0} {:>10.1} {:>10.1} {:>10.1} {:>6.1}  {}",
            row.completed,
            row.rate_per_s,
            row.lat_p50_us,
            row.lat_p99_us,
            row.lat_max_us,
            row.cpu_percent,
            steps.join(", ")
        );
    }
    if let Some(e) = &o.first_error {
        bail!("{} of {} connections failed; the first: {e}", o.errors, a.count);
    }
    Ok(())
}

/// `--hold`: opens `--count` connections, reports, waits for stdin, closes them all, reports again.
async fn hold(setup: &Setup, a: &PerfArgs, timeout: Duration) -> Result<()> {
    use tokio::io::AsyncBufReadExt;
    let o = open_many(setup, a.addr, a.count, a.concurrency, true, timeout).await;
    let mut total: Vec<f64> = o.steps.iter().map(|s| us(s.iter().sum::<Duration>())).collect();
    let t = stats(&mut total);
    let secs = o.elapsed.as_secs_f64();
    let up = serde_json::json!({
        "test": setup.test(),
        "phase": "up",
        "count": a.count,
        "concurrency": a.concurrency,
        "connected": o.held.len(),
        "errors": o.errors,
        "first_error": o.first_error,
        "setup_s": secs,
        "rate_per_s": o.held.len() as f64 / secs,
        "lat_p50_us": t.p50,
        "lat_p99_us": t.p99,
        "cpu_percent": 100.0 * o.cpu.as_secs_f64() / secs,
    });
    if a.json {
        println!("{up}");
    } else {
        println!(
            "{} connections up in {secs:.3} s ({:.0}/s, {} failed{}); press Enter (or close stdin) to close them",
            o.held.len(),
            o.held.len() as f64 / secs,
            o.errors,
            o.first_error
                .as_deref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        );
    }
    std::io::stdout().flush()?;
    let mut line = String::new();
    let _ = tokio::io::BufReader::new(tokio::io::stdin())
        .read_line(&mut line)
        .await;
    let n = o.held.len();
    let t0 = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    let mut errors = 0u32;
    let mut first_error = None;
    let mut held = o.held.into_iter();
    let width = a.concurrency.max(1) as usize;
    loop {
        while set.len() < width {
            let Some(h) = held.next() else { break };
            set.spawn(Setup::close(h, timeout));
        }
        let Some(r) = set.join_next().await else { break };
        if let Err(e) = r.map_err(anyhow::Error::from).and_then(|r| r) {
            errors += 1;
            first_error.get_or_insert_with(|| format!("{e:#}"));
        }
    }
    let down = serde_json::json!({
        "test": setup.test(),
        "phase": "down",
        "closed": n,
        "errors": errors,
        "first_error": first_error,
        "teardown_s": t0.elapsed().as_secs_f64(),
    });
    if a.json {
        println!("{down}");
    } else {
        println!(
            "{n} connections closed in {:.3} s ({errors} failed)",
            t0.elapsed().as_secs_f64()
        );
    }
    if let Some(e) = o.first_error.or(first_error) {
        bail!("connections failed; the first: {e}");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------------
// Kernel-TCP baselines: `tcp-stream`, `tcp-pingpong` (and the server of `tcp-connect`).
// ---------------------------------------------------------------------------------------------------------

/// Every soft-rdma-free baseline connection is a kernel socket: `--hold` may need thousands.
fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

const TCP_MAGIC: &[u8; 4] = b"SRPT";

/// What a TCP baseline client asks for: its first 32 bytes (magic, version, kind, size, iterations).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TcpHeader {
    test: PerfTest,
    size: u32,
    iters: u32,
}

impl TcpHeader {
    fn connect() -> TcpHeader {
        TcpHeader {
            test: PerfTest::TcpConnect,
            size: 0,
            iters: 0,
        }
    }

    fn encode(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        b[..4].copy_from_slice(TCP_MAGIC);
        b[4] = VERSION;
        b[5] = match self.test {
            PerfTest::TcpStream => 0,
            PerfTest::TcpPingpong => 1,
            _ => 2,
        };
        b[8..12].copy_from_slice(&self.size.to_be_bytes());
        b[12..16].copy_from_slice(&self.iters.to_be_bytes());
        b
    }

    fn decode(b: &[u8; 32]) -> Result<TcpHeader> {
        ensure!(
            &b[..4] == TCP_MAGIC && b[4] == VERSION,
            "not a soft-rdma perf TCP client"
        );
        let test = match b[5] {
            0 => PerfTest::TcpStream,
            1 => PerfTest::TcpPingpong,
            2 => PerfTest::TcpConnect,
            k => bail!("unknown TCP test {k}"),
        };
        let u32_at = |o: usize| u32::from_be_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        Ok(TcpHeader {
            test,
            size: u32_at(8),
            iters: u32_at(12),
        })
    }
}

/// The TCP server: every client on its own task (connection-setup clients come hundreds at a time).
async fn tcp_serve(a: &PerfArgs) -> Result<()> {
    let socket = if a.addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket
        .bind(a.addr)
        .with_context(|| format!("binding {}", a.addr))?;
    let listener = socket.listen(4096)?;
    if !a.json {
        println!(
            "soft-rdma perf TCP server on {}: serves tcp-stream, tcp-pingpong and tcp-connect, as each client asks{}",
            listener.local_addr()?,
            if a.once { " (one client)" } else { "" }
        );
    }
    let json = a.json;
    loop {
        let (s, peer) = listener.accept().await?;
        let task = tokio::spawn(async move {
            let r = tcp_serve_one(s, peer, json).await;
            if let Err(e) = &r {
                eprintln!("client {peer}: {e:#}");
            }
            r
        });
        if a.once {
            return task.await?;
        }
    }
}

async fn tcp_serve_one(mut s: tokio::net::TcpStream, peer: SocketAddr, json: bool) -> Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    s.set_nodelay(true)?;
    let mut hdr = [0u8; 32];
    s.read_exact(&mut hdr).await?;
    let h = TcpHeader::decode(&hdr)?;
    if h.test == PerfTest::TcpConnect {
        s.write_all(&hdr).await?;
        let mut b = [0u8; 64];
        while s.read(&mut b).await? > 0 {}
        return Ok(());
    }
    ensure!(h.size > 0 && h.iters > 0, "bad request {h:?}");
    // The data tests use blocking sockets, as the client does: the plainest kernel-TCP path.
    let std = s.into_std()?;
    std.set_nonblocking(false)?;
    let line = tokio::task::spawn_blocking(move || tcp_serve_data(std, h)).await??;
    if json {
        println!(
            "{}",
            serde_json::json!({"peer": peer, "test": h.test, "bytes": h.size, "iterations": h.iters, "result": line})
        );
    } else {
        println!(
            "client {peer}: {} {} B × {}: {line}",
            h.test.name(),
            h.size,
            h.iters
        );
    }
    Ok(())
}

fn tcp_serve_data(mut s: std::net::TcpStream, h: TcpHeader) -> Result<String> {
    use std::io::Read;
    let sz = h.size as usize;
    let line = if h.test == PerfTest::TcpStream {
        let total = h.size as u64 * h.iters as u64;
        // The last message is checked against the pattern (as the soft-rdma servers check their buffer).
        let last_at = total - h.size as u64;
        let mut buf = vec![0u8; 256 << 10];
        let (mut got, mut bad) = (0u64, 0u64);
        while got < total {
            let want = (total - got).min(buf.len() as u64) as usize;
            let n = s.read(&mut buf[..want])?;
            ensure!(n > 0, "the client closed after {got} of {total} bytes");
            let end = got + n as u64;
            if end > last_at {
                let from = got.max(last_at);
                for at in from..end {
                    if buf[(at - got) as usize] != pattern((at - last_at) as usize) {
                        bad += 1;
                    }
                }
            }
            got = end;
        }
        let mut done = [0u8; 16];
        done[..8].copy_from_slice(&got.to_be_bytes());
        done[8..].copy_from_slice(&bad.to_be_bytes());
        s.write_all(&done)?;
        format!(
            "received {got} bytes{}",
            if bad == 0 { ", data ok" } else { ", DATA MISMATCH" }
        )
    } else {
        let mut buf = vec![0u8; sz];
        for _ in 0..h.iters {
            s.read_exact(&mut buf)?;
            s.write_all(&buf)?;
        }
        "echoed".to_owned()
    };
    // Wait for the client to close.
    let mut b = [0u8; 1];
    let _ = s.read(&mut b);
    Ok(line)
}

/// One tcp-stream or tcp-pingpong row: the same figures, sizes and iterations as the soft-rdma rows.
async fn tcp_client(a: &PerfArgs, size: u32, iters: u32) -> Result<Row> {
    let (addr, test) = (a.addr, a.test);
    let timeout = Duration::from_secs_f64(a.timeout);
    let (m, server_bytes) =
        tokio::task::spawn_blocking(move || tcp_client_blocking(addr, test, size, iters, timeout)).await??;
    let secs = m.elapsed.as_secs_f64();
    let mut lat = m.lat;
    let s = stats(&mut lat);
    Ok(Row {
        test,
        mode: if test == PerfTest::TcpStream { "bw" } else { "lat" },
        bytes: u64::from(size),
        iterations: iters,
        depth: 1,
        elapsed_s: secs,
        bw_gbps: (u64::from(size) * u64::from(iters)) as f64 * 8.0 / secs / 1e9,
        msg_rate_mpps: f64::from(iters) / secs / 1e6,
        lat_kind: if test == PerfTest::TcpStream {
            "write-call"
        } else {
            "half-round-trip"
        },
        lat_min_us: s.min,
        lat_avg_us: s.avg,
        lat_p50_us: s.p50,
        lat_p99_us: s.p99,
        lat_max_us: s.max,
        cpu_percent: 100.0 * m.cpu.as_secs_f64() / secs,
        server_bytes,
    })
}

fn tcp_client_blocking(
    addr: SocketAddr,
    test: PerfTest,
    size: u32,
    iters: u32,
    timeout: Duration,
) -> Result<(Measured, Option<u64>)> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect_timeout(&addr, timeout)
        .with_context(|| format!("TCP connect to {addr}"))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.write_all(&TcpHeader { test, size, iters }.encode())?;
    let sz = size as usize;
    let data = pattern_bytes(sz);
    let mut lat = Vec::with_capacity(iters as usize);
    let mut progress = Progress::new(format!("{} {sz} B", test.name()), iters);
    mark_interval(false);
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    let mut server_bytes = None;
    if test == PerfTest::TcpStream {
        for i in 0..iters {
            let t = Instant::now();
            s.write_all(&data)?;
            lat.push(us(t.elapsed()));
            progress.tick(i + 1);
        }
        let mut done = [0u8; 16];
        s.read_exact(&mut done)
            .context("waiting for the server's count")?;
        let got = u64::from_be_bytes(done[..8].try_into().expect("8"));
        let bad = u64::from_be_bytes(done[8..].try_into().expect("8"));
        let want = u64::from(size) * u64::from(iters);
        ensure!(got == want, "the server received {got} bytes; {want} were sent");
        ensure!(bad == 0, "the server found {bad} bad bytes in the last message");
        server_bytes = Some(got);
    } else {
        let mut buf = vec![0u8; sz];
        for i in 0..iters {
            let t = Instant::now();
            s.write_all(&data)?;
            s.read_exact(&mut buf).context("waiting for the pong")?;
            lat.push(us(t.elapsed()) / 2.0);
            progress.tick(i + 1);
        }
        ensure!(buf == data, "the pong differs from the ping");
    }
    let elapsed = t0.elapsed();
    let cpu = cpu_time().saturating_sub(cpu0);
    mark_interval(true);
    progress.finish();
    Ok((
        Measured {
            elapsed,
            cpu,
            lat,
            server_bytes: None,
        },
        server_bytes,
    ))
}
