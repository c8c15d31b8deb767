//! `soft-rdma ping`: rping's exchange (rdma-core's librdmacm/examples/rping.c), wire-compatible with it in
//! both directions, with every round's data verified.
//!
//! The server listens; the client connects. Each round:
//!
//! 1. the client fills its source buffer with the round's pattern (`rdma-ping-N: `, then a rotating run of
//!    `A`..`z` that starts one letter later each round, and a NUL in the last byte, as rping) and
//!    advertises it in a Send;
//! 2. the server RDMA-Reads it into its buffer and answers "go" (a Send);
//! 3. the client advertises its (cleared) sink buffer in another Send;
//! 4. the server RDMA-Writes what it read into the sink and answers "go";
//! 5. the client compares sink and source byte for byte (rping -V).
//!
//! The round trip is timed from the first advertisement to the second "go".
//!
//! # Wire formats (big-endian, like rping's `struct rping_rdma_info`)
//!
//! Advertisement (16-byte Send): `buf` (8: the tagged offset; siw's are virtual addresses, soft-rdma's are
//! byte offsets into the region), `rkey` (4: the STag), `size` (4: bytes). A "go" is a 16-byte Send too:
//! rping's server sends zeros; soft-rdma's puts the round in `buf` and the phase (1 after the Read, 2 after
//! the Write) in `rkey`, and its client accepts either.
//!
//! Connect private data (16 bytes, optional): magic `SRPI`, version (1), three reserved bytes, the size per
//! round (4) and the rounds the client will run (4; 0 = until it stops). rping's server ignores it; a client
//! that sends none (rping's) is served with the server's `--size` buffer until it disconnects.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use soft_rdma::client::{Access, CompletionOp, ReadLimits, RemoteBuffer, Stag};
use soft_rdma::client::{Adapter, Connector, MemoryRegion, QueuePair};

use super::perf::{Conn, connect, is_disconnect, parse_size};

#[derive(clap::Args)]
pub struct PingArgs {
    /// The server's address: where to listen (--server) or connect; the port defaults to rping's, 7174.
    #[arg(value_parser = parse_addr)]
    addr: SocketAddr,
    /// Listen and serve one client (--forever: clients one after another).
    #[arg(long)]
    server: bool,
    /// Server: keep accepting clients.
    #[arg(long, requires = "server")]
    forever: bool,
    /// Client: rounds to run (0 = until Ctrl-C, the default, as rping's -C). Server: at most this many rounds
    /// per client (default: as many as the client asks).
    #[arg(long)]
    count: Option<u32>,
    /// Bytes per round (k/m suffixes). Both sides' buffers must be this large: the default is rping's (-S 64),
    /// so that `soft-rdma ping ADDR` talks to a default `rping -s`.
    #[arg(long, default_value = "64", value_parser = parse_size)]
    size: u64,
    /// Client: pause between rounds, in milliseconds.
    #[arg(long, default_value_t = 0)]
    interval_ms: u64,
    /// Print the start of each round's data (rping -v).
    #[arg(long, short)]
    verbose: bool,
    /// Give up when one step of a round takes longer than this many seconds.
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,
    /// Print a JSON summary instead of one line per round.
    #[arg(long)]
    json: bool,
}

/// rping's default port (rping.c: 7174).
const RPING_PORT: u16 = 7174;

/// `IP:PORT`, `[IPv6]:PORT`, or a bare IP with rping's port.
fn parse_addr(s: &str) -> std::result::Result<SocketAddr, String> {
    s.parse::<SocketAddr>()
        .or_else(|_| {
            s.trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<std::net::IpAddr>()
                .map(|ip| SocketAddr::new(ip, RPING_PORT))
        })
        .map_err(|_| format!("{s}: expected IP, IP:PORT or [IPv6]:PORT"))
}

const MAGIC: &[u8; 4] = b"SRPI";
const VERSION: u8 = 1;
const INFO_LEN: usize = 16;
/// Control buffer: Receives at 0 and 16, the outgoing message at 32.
const SEND_SLOT: usize = 32;
const RECV: u64 = 1 << 62;

/// rping's `struct rping_rdma_info`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Info {
    buf: u64,
    rkey: u32,
    size: u32,
}

impl Info {
    fn encode(&self) -> [u8; INFO_LEN] {
        let mut b = [0; INFO_LEN];
        b[0..8].copy_from_slice(&self.buf.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..16].copy_from_slice(&self.size.to_be_bytes());
        b
    }

    fn decode(b: &[u8]) -> Result<Info> {
        ensure!(
            b.len() >= INFO_LEN,
            "short message ({} bytes, expected {INFO_LEN})",
            b.len()
        );
        Ok(Info {
            buf: u64::from_be_bytes(b[0..8].try_into().expect("8")),
            rkey: u32::from_be_bytes(b[8..12].try_into().expect("4")),
            size: u32::from_be_bytes(b[12..16].try_into().expect("4")),
        })
    }
}

/// The data of round `round`, byte for byte what rping's client puts in its start buffer: `rdma-ping-N: `
/// (snprintf, so cut to `len - 1` bytes), then `A`..`z` rotating from one letter later each round, and a
/// NUL in the last byte (rping.c, `rping_test_client`). The NUL matters: rping's server Writes back
/// `strlen(buf) + 1` bytes.
fn round_pattern(round: u64, len: usize) -> Vec<u8> {
    let mut v = format!("rdma-ping-{round}: ").into_bytes();
    v.truncate(len.saturating_sub(1));
    let mut c = b'A' + (round % 58) as u8;
    while v.len() < len {
        v.push(c);
        c = if c >= b'z' { b'A' } else { c + 1 };
    }
    if let Some(last) = v.last_mut() {
        *last = 0;
    }
    v
}

/// Whether a "go" is acceptable for `round` and `phase`: soft-rdma's server numbers them; rping's server
/// Sends its (never written, all-zero) send buffer, so zeros are a go too.
fn is_go(go: &Info, round: u64, phase: u32) -> bool {
    (go.buf == round && go.rkey == phase) || (go.buf == 0 && go.rkey == 0 && go.size == 0)
}

/// The first differing byte, if any.
fn first_mismatch(want: &[u8], got: &[u8]) -> Option<(usize, u8, u8)> {
    want.iter()
        .zip(got)
        .enumerate()
        .find(|(_, (a, b))| a != b)
        .map(|(i, (a, b))| (i, *a, *b))
}

fn preview(b: &[u8]) -> String {
    let n = b.len().min(64);
    String::from_utf8_lossy(&b[..n]).into_owned()
}

/// The small buffer for advertisements and "go"s.
struct Ctrl {
    mr: MemoryRegion,
}

impl Ctrl {
    async fn new(adapter: &Adapter) -> Result<Ctrl> {
        Ok(Ctrl {
            mr: adapter.register_memory(64, Access::LOCAL_WRITE).await?,
        })
    }

    fn post_receive(&self, qp: &QueuePair, slot: u64) -> Result<()> {
        qp.receive(
            RECV | slot,
            &[self.mr.sge(slot * INFO_LEN as u64, INFO_LEN as u32)],
        )?;
        Ok(())
    }

    /// Sends `m` and waits for the Send to complete.
    async fn send(&self, conn: &mut Conn, id: u64, m: Info, what: &str) -> Result<()> {
        self.mr.write_at(SEND_SLOT, &m.encode())?;
        conn.qp
            .send(id, &[self.mr.sge(SEND_SLOT as u64, INFO_LEN as u32)])?;
        conn.next_of(CompletionOp::Send, what).await?;
        Ok(())
    }

    /// Waits for the next message, reads it and reposts its Receive.
    async fn receive(&self, conn: &mut Conn, what: &str) -> Result<Info> {
        let c = conn.next_of(CompletionOp::Receive, what).await?;
        let slot = c.wr_id & !RECV;
        ensure!(
            c.wr_id & RECV != 0 && slot < 2,
            "unexpected receive completion {c:?}"
        );
        let m = Info::decode(
            &self
                .mr
                .to_vec((slot as usize) * INFO_LEN, c.bytes.min(INFO_LEN as u32) as usize)?,
        )?;
        self.post_receive(&conn.qp, slot)?;
        Ok(m)
    }
}

pub async fn run(uds: Option<PathBuf>, a: PingArgs) -> Result<()> {
    ensure!(
        a.size >= 1 && a.size <= u64::from(u32::MAX),
        "--size must be 1 byte .. 4 GiB"
    );
    ensure!(a.timeout > 0.0, "--timeout must be positive");
    let adapter = super::open(uds).await?;
    ensure!(
        a.size <= u64::from(adapter.info().max_transfer_length),
        "--size {} exceeds the adapter's maximum transfer length {}",
        a.size,
        adapter.info().max_transfer_length
    );
    if a.server {
        serve(&adapter, &a).await
    } else {
        client(&adapter, &a).await
    }
}

// ---------------------------------------------------------------------------------------------------------
// Client.
// ---------------------------------------------------------------------------------------------------------

#[derive(Clone, Debug, serde::Serialize)]
struct RoundResult {
    round: u64,
    bytes: u32,
    rtt_us: f64,
    ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    mismatch: Option<String>,
}

/// The client's connection: the queue pair, its control buffer, and the two buffers the server reaches.
struct ClientConn {
    // Field order is drop order: the connection, then the buffers, last registered first.
    conn: Conn,
    ctrl: Ctrl,
    /// rping's rdma_buf: the Write sink.
    sink: MemoryRegion,
    /// rping's start_buf: the Read source.
    source: MemoryRegion,
    /// This side's address, if the daemon reports it.
    local: Option<SocketAddr>,
}

async fn client(adapter: &Adapter, a: &PingArgs) -> Result<()> {
    let size = a.size as u32;
    let count = a.count.unwrap_or(0);
    let mut c = client_connect(adapter, a, size, count).await?;
    if !a.json {
        println!(
            "soft-rdma ping {}{}: {size} bytes per round, {}",
            a.addr,
            c.local.map(|l| format!(" from {l}")).unwrap_or_default(),
            if count == 0 {
                "until Ctrl-C".to_owned()
            } else {
                format!("{count} rounds")
            }
        );
    }
    let (results, error) = client_rounds(&mut c, a, size, count).await?;
    c.conn.close().await;
    client_summary(a, c.local, size, &results, error)
}

/// Registers the buffers, posts the Receives for the "go"s and connects, announcing `size` and `count` in
/// the private data.
async fn client_connect(adapter: &Adapter, a: &PingArgs, size: u32, count: u32) -> Result<ClientConn> {
    let timeout = Duration::from_secs_f64(a.timeout);
    let info = adapter.info().clone();
    // rping: start_buf is the Read source, rdma_buf the Write sink.
    let source = adapter
        .register_memory(size as usize, Access::REMOTE_READ)
        .await
        .context("registering the source buffer")?;
    let sink = adapter
        .register_memory(size as usize, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .await
        .context("registering the sink buffer")?;
    let ctrl = Ctrl::new(adapter).await?;
    let cq = adapter.create_completion_queue(16).await?;
    let qp = adapter.create_queue_pair(&cq, &cq, 4, 4).await?;
    // The "go"s: posted before anything can come.
    ctrl.post_receive(&qp, 0)?;
    ctrl.post_receive(&qp, 1)?;
    let connector = adapter.create_connector().await?;
    let mut pd = Vec::with_capacity(16);
    pd.extend_from_slice(MAGIC);
    pd.extend_from_slice(&[VERSION, 0, 0, 0]);
    pd.extend_from_slice(&size.to_be_bytes());
    pd.extend_from_slice(&count.to_be_bytes());
    let limits = ReadLimits {
        inbound: 4.min(info.max_inbound_read_limit),
        outbound: 4.min(info.max_outbound_read_limit),
    };
    connect(&connector, &qp, a.addr, limits, &pd, timeout).await?;
    connector.complete_connect().await?;
    let local = connector.local_addr().await.ok();
    Ok(ClientConn {
        conn: Conn::new(connector, qp, cq, timeout),
        ctrl,
        source,
        sink,
        local,
    })
}

/// Runs rounds until `count` (0: until Ctrl-C), the first failure or Ctrl-C, printing each unless `--json`:
/// the rounds' results, and the failure that ended them, if one did.
async fn client_rounds(
    c: &mut ClientConn,
    a: &PingArgs,
    size: u32,
    count: u32,
) -> Result<(Vec<RoundResult>, Option<anyhow::Error>)> {
    let mut results: Vec<RoundResult> = Vec::new();
    let mut error = None;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut round = 0u64;
    while count == 0 || round < u64::from(count) {
        if round > 0 && a.interval_ms > 0 {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(a.interval_ms)) => {}
                _ = &mut ctrl_c => break,
            }
        }
        let r = tokio::select! {
            r = client_round(&mut c.conn, &c.ctrl, &c.source, &c.sink, round, size) => r,
            _ = &mut ctrl_c => break,
        };
        match r {
            Ok(res) => {
                if !a.json {
                    match &res.mismatch {
                        None => println!(
                            "round {}: {} bytes, rtt {:.1} µs, ok",
                            res.round, res.bytes, res.rtt_us
                        ),
                        Some(m) => println!(
                            "round {}: {} bytes, rtt {:.1} µs, MISMATCH: {m}",
                            res.round, res.bytes, res.rtt_us
                        ),
                    }
                    if a.verbose {
                        println!("  ping data: {}", preview(&c.sink.to_vec(0, size as usize)?));
                    }
                }
                results.push(res);
            }
            Err(e) => {
                let e = round_failure(e, round, size);
                if !a.json {
                    println!("round {round}: FAILED: {e:#}");
                }
                error = Some(e);
                break;
            }
        }
        round += 1;
    }
    Ok((results, error))
}

/// Round `round`'s failure `e`, with what it may mean: the server left, or (a first round's) its buffers
/// are smaller than `size`.
fn round_failure(e: anyhow::Error, round: u64, size: u32) -> anyhow::Error {
    let e = if is_disconnect(&e) {
        e.context(format!("the server ended the connection after {round} rounds"))
    } else {
        e
    };
    // A server whose buffer is smaller than --size fails the first Read (rping -s: a local
    // protection error, and a Terminate to us): say which size to use.
    if round == 0 {
        e.context(format!(
            "the first round failed with --size {size}: the server's buffers must be at least that \
             large (rping -s allocates its -S, 64 bytes by default): run with --size equal to the \
             server's -S"
        ))
    } else {
        e
    }
}

/// The summary of the rounds (a line, or with `--json` the whole report), and the client's outcome: the
/// failure that ended the rounds, or an error if any round's data came back different.
fn client_summary(
    a: &PingArgs,
    local: Option<SocketAddr>,
    size: u32,
    results: &[RoundResult],
    error: Option<anyhow::Error>,
) -> Result<()> {
    let failures = results.iter().filter(|r| !r.ok).count() + usize::from(error.is_some());
    let rtts: Vec<f64> = results.iter().map(|r| r.rtt_us).collect();
    let (min, avg, max) = if rtts.is_empty() {
        (0.0, 0.0, 0.0)
    } else {
        (
            rtts.iter().copied().fold(f64::INFINITY, f64::min),
            rtts.iter().sum::<f64>() / rtts.len() as f64,
            rtts.iter().copied().fold(0.0, f64::max),
        )
    };
    let attempted = results.len() + usize::from(error.is_some());
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "peer": a.addr,
                "local": local,
                "size": size,
                "rounds": attempted,
                "ok": attempted - failures,
                "failures": failures,
                "rtt_us": {"min": min, "avg": avg, "max": max},
                "error": error.as_ref().map(|e| format!("{e:#}")),
                "results": results,
            }))?
        );
    } else {
        println!(
            "--- soft-rdma ping {}: {attempted} rounds, {} ok, {failures} failed; rtt min/avg/max = {min:.1}/{avg:.1}/{max:.1} µs",
            a.addr,
            attempted - failures
        );
    }
    if let Some(e) = error {
        return Err(e);
    }
    if failures > 0 {
        bail!("{failures} of {attempted} rounds returned data that differs from what was sent");
    }
    Ok(())
}

async fn client_round(
    conn: &mut Conn,
    ctrl: &Ctrl,
    source: &MemoryRegion,
    sink: &MemoryRegion,
    round: u64,
    size: u32,
) -> Result<RoundResult> {
    let want = round_pattern(round, size as usize);
    source.write_at(0, &want)?;
    sink.fill(0, size as usize, 0)?;
    let start = Instant::now();
    let ad = |mr: &MemoryRegion| Info {
        buf: mr.remote(0).offset,
        rkey: mr.stag().0,
        size,
    };
    ctrl.send(conn, round, ad(source), "the source advertisement")
        .await?;
    let go = ctrl.receive(conn, "the server's go after its RDMA Read").await?;
    ensure!(
        is_go(&go, round, 1),
        "expected go (round {round}, after the Read), got {go:?}"
    );
    ctrl.send(conn, round, ad(sink), "the sink advertisement").await?;
    let go = ctrl.receive(conn, "the server's go after its RDMA Write").await?;
    ensure!(
        is_go(&go, round, 2),
        "expected go (round {round}, after the Write), got {go:?}"
    );
    let rtt = start.elapsed();
    let got = sink.to_vec(0, size as usize)?;
    let mismatch = first_mismatch(&want, &got).map(|(i, w, g)| {
        let n = want.iter().zip(&got).filter(|(a, b)| a != b).count();
        format!("{n} bytes differ; first at byte {i}: expected {w:#04x}, got {g:#04x}")
    });
    Ok(RoundResult {
        round,
        bytes: size,
        rtt_us: rtt.as_secs_f64() * 1e6,
        ok: mismatch.is_none(),
        mismatch,
    })
}

// ---------------------------------------------------------------------------------------------------------
// Server.
// ---------------------------------------------------------------------------------------------------------

async fn serve(adapter: &Adapter, a: &PingArgs) -> Result<()> {
    let listener = adapter.create_listener().await?;
    let bound = listener.listen(a.addr, 0).await?;
    if !a.json {
        println!(
            "soft-rdma ping server on {bound}{}",
            if a.forever {
                " (serving clients until killed)"
            } else {
                ""
            }
        );
    }
    loop {
        let connector = adapter.create_connector().await?;
        let offer = listener.get_connection_request(&connector).await?;
        let peer = offer.peer;
        let r = serve_one(adapter, a, connector, &offer.private_data, peer).await;
        match &r {
            Ok(s) => {
                if a.json {
                    println!("{}", serde_json::to_string(s)?);
                } else {
                    println!(
                        "client {peer}: served {} rounds of {} bytes{} ({})",
                        s.rounds,
                        s.size,
                        if s.read_mismatches > 0 {
                            format!(", {} rounds READ DATA NOT AS EXPECTED", s.read_mismatches)
                        } else {
                            String::new()
                        },
                        s.end
                    );
                }
            }
            Err(e) => eprintln!("client {peer}: {e:#}"),
        }
        if !a.forever {
            return r.map(|_| ());
        }
    }
}

#[derive(Debug, serde::Serialize)]
struct Served {
    peer: SocketAddr,
    size: u32,
    rounds: u64,
    /// Rounds whose data, as read from the client, was not the round's pattern.
    read_mismatches: u64,
    /// "disconnected" (the client left) or "done" (the agreed rounds were served).
    end: &'static str,
}

async fn serve_one(
    adapter: &Adapter,
    a: &PingArgs,
    connector: Connector,
    pd: &[u8],
    peer: SocketAddr,
) -> Result<Served> {
    // soft-rdma's client announces its size and rounds; rping's client sends no private data and runs
    // until it disconnects, advertising its size (which must fit this server's --size) every round.
    let (size, client_count) = if pd.is_empty() {
        (a.size as u32, 0)
    } else if pd.len() >= 16 && &pd[..4] == MAGIC && pd[4] == VERSION {
        (
            u32::from_be_bytes(pd[8..12].try_into().expect("4")),
            u32::from_be_bytes(pd[12..16].try_into().expect("4")),
        )
    } else {
        let _ = connector.reject(b"soft-rdma ping: not a ping client").await;
        bail!("not a ping client (private data {})", super::show(pd));
    };
    let info = adapter.info().clone();
    if size == 0 || size > info.max_transfer_length {
        let _ = connector.reject(b"soft-rdma ping: bad size").await;
        bail!("the client asks for {size} bytes per round");
    }
    let limit = match (client_count, a.count.unwrap_or(0)) {
        (0, s) => s,
        (c, 0) => c,
        (c, s) => c.min(s),
    };
    let timeout = Duration::from_secs_f64(a.timeout);
    // rping's rdma_buf: the Read sink and the Write source.
    let buf = adapter
        .register_memory(size as usize, Access::LOCAL_WRITE)
        .await?;
    let ctrl = Ctrl::new(adapter).await?;
    let cq = adapter.create_completion_queue(16).await?;
    let qp = adapter.create_queue_pair(&cq, &cq, 4, 4).await?;
    ctrl.post_receive(&qp, 0)?;
    ctrl.post_receive(&qp, 1)?;
    let limits = ReadLimits {
        inbound: 4.min(info.max_inbound_read_limit),
        outbound: 4.min(info.max_outbound_read_limit),
    };
    tokio::time::timeout(timeout, connector.accept_qp(&qp, limits, b""))
        .await
        .map_err(|_| anyhow::anyhow!("accept: the connection was not established within {timeout:?}"))??;
    let mut conn = Conn::new(connector, qp, cq, timeout);
    let mut served = Served {
        peer,
        size,
        rounds: 0,
        read_mismatches: 0,
        end: "done",
    };
    let result: Result<()> = async {
        let mut round = 0u64;
        while limit == 0 || round < u64::from(limit) {
            // The client paces the rounds: wait for its advertisement as long as it takes.
            conn.timeout = Duration::from_secs(86_400);
            let src = match ctrl.receive(&mut conn, "the client's source advertisement").await {
                Ok(m) => m,
                Err(e) if is_disconnect(&e) => {
                    served.end = "disconnected";
                    return Ok(());
                }
                Err(e) => return Err(e),
            };
            conn.timeout = timeout;
            ensure!(
                src.size <= size,
                "round {round}: the client advertises {} bytes; it asked for {size}",
                src.size
            );
            let remote = |m: &Info| RemoteBuffer {
                stag: Stag(m.rkey),
                offset: m.buf,
            };
            conn.qp.read(round, buf.sge(0, src.size), remote(&src))?;
            conn.next_of(CompletionOp::Read, "the RDMA Read of the client's source")
                .await?;
            let data = buf.to_vec(0, src.size as usize)?;
            if data != round_pattern(round, src.size as usize) {
                served.read_mismatches += 1;
            }
            if a.verbose && !a.json {
                println!("round {round}: ping data: {}", preview(&data));
            }
            let go = |phase| Info {
                buf: round,
                rkey: phase,
                size: src.size,
            };
            ctrl.send(&mut conn, round, go(1), "the go after the Read")
                .await?;
            let sink = ctrl.receive(&mut conn, "the client's sink advertisement").await?;
            ensure!(
                sink.size >= src.size,
                "round {round}: the sink holds {} bytes, the source {}",
                sink.size,
                src.size
            );
            conn.qp.write(round, &[buf.sge(0, src.size)], remote(&sink))?;
            conn.next_of(CompletionOp::Write, "the RDMA Write into the client's sink")
                .await?;
            ctrl.send(&mut conn, round, go(2), "the go after the Write")
                .await?;
            round += 1;
            served.rounds = round;
        }
        Ok(())
    }
    .await;
    if result.is_ok() && served.end == "done" {
        if client_count == 0 || u64::from(client_count) > served.rounds {
            // This side's --count ended it: the client learns it from the disconnect.
            served.end = "done (server's --count), disconnected the client";
        } else if conn.wait_gone(Some(Duration::from_secs(30))).await {
            // Leave the closing to the client (its last "go" must not race our disconnect).
            served.end = "done, client disconnected";
        }
    }
    conn.close().await;
    result.map(|()| served)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_default_to_rpings_port() {
        assert_eq!(parse_addr("10.0.0.2").unwrap(), "10.0.0.2:7174".parse().unwrap());
        assert_eq!(
            parse_addr("10.0.0.2:7175").unwrap(),
            "10.0.0.2:7175".parse().unwrap()
        );
        assert_eq!(parse_addr("fd00::2").unwrap(), "[fd00::2]:7174".parse().unwrap());
        assert_eq!(
            parse_addr("[fd00::2]").unwrap(),
            "[fd00::2]:7174".parse().unwrap()
        );
        assert_eq!(parse_addr("[fd00::2]:9").unwrap(), "[fd00::2]:9".parse().unwrap());
        assert!(parse_addr("host.example").is_err());
    }
}
