//! `perf connect`: connection setup rate and per-step times (as rdma-core's cmtime), and `--hold`.

use super::*;

/// The test code of a connection-setup client in its Connect private data (send/write/read are 0/1/2).
pub(super) const CONNECT_TEST: u8 = 3;

/// The 32 bytes each side of a connection-setup test sends: the magic, the version, the test code.
pub(super) fn connect_private_data() -> [u8; 32] {
    let mut b = [0u8; 32];
    b[..4].copy_from_slice(MAGIC);
    b[4] = VERSION;
    b[5] = CONNECT_TEST;
    b
}

pub(super) fn is_connect_request(pd: &[u8]) -> bool {
    pd.len() >= 6 && &pd[..4] == MAGIC && pd[4] == VERSION && pd[5] == CONNECT_TEST
}

/// The read limits both sides of a connection-setup test offer.
pub(super) const CONNECT_LIMITS: ReadLimits = ReadLimits {
    inbound: 16,
    outbound: 16,
};

/// The server's side of one connection-setup test: Accept with 32 bytes, then wait for the client to leave.
pub(super) async fn serve_connect(connector: Connector, peer: SocketAddr, timeout: Duration) -> Result<()> {
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
pub(super) enum Setup {
    Rdma(Adapter),
    Tcp,
}

/// One connection, up.
pub(super) enum Held {
    Rdma(Connector),
    Tcp(tokio::net::TcpStream),
}

impl Setup {
    /// The steps of one connection's life, as `rdma_cm`'s cmtime times them.
    pub(super) fn steps(&self) -> &'static [&'static str] {
        match self {
            // create: CreateConnector; connect: Connect until the MPA Reply (the peer's Accept) is in;
            // complete: CompleteConnect (sends the RTR); disconnect: Disconnect.
            Setup::Rdma(_) => &["create", "connect", "complete", "disconnect"],
            // connect: connect(2) until the SYN-ACK; request-response: 32 B each way; close: shutdown + close.
            Setup::Tcp => &["connect", "request-response", "close"],
        }
    }

    pub(super) fn test(&self) -> PerfTest {
        match self {
            Setup::Rdma(_) => PerfTest::Connect,
            Setup::Tcp => PerfTest::TcpConnect,
        }
    }

    /// Sets one connection up; returns it with the time of each step but the last.
    pub(super) async fn open(&self, addr: SocketAddr, timeout: Duration) -> Result<(Held, Vec<Duration>)> {
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
    pub(super) async fn close(held: Held, timeout: Duration) -> Result<Duration> {
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
pub(super) struct StepRow {
    pub(super) step: &'static str,
    pub(super) p50_us: f64,
    pub(super) p99_us: f64,
    pub(super) avg_us: f64,
}

/// One connection-setup measurement.
#[derive(Clone, Debug, serde::Serialize)]
pub(super) struct ConnRow {
    pub(super) test: PerfTest,
    pub(super) concurrency: u32,
    /// Connections attempted.
    pub(super) count: u32,
    /// Connections set up and taken down without an error.
    pub(super) completed: u32,
    pub(super) errors: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) first_error: Option<String>,
    pub(super) elapsed_s: f64,
    /// Completed connections (set up and taken down) per second.
    pub(super) rate_per_s: f64,
    /// One connection's whole life (every step), µs.
    pub(super) lat_min_us: f64,
    pub(super) lat_p50_us: f64,
    pub(super) lat_p99_us: f64,
    pub(super) lat_max_us: f64,
    pub(super) lat_avg_us: f64,
    pub(super) steps: Vec<StepRow>,
    pub(super) cpu_percent: f64,
}

/// Connections opened (and closed) with `concurrency` in flight.
pub(super) struct Opened {
    pub(super) held: Vec<Held>,
    /// Per connection: the time of each step.
    pub(super) steps: Vec<Vec<Duration>>,
    pub(super) errors: u32,
    pub(super) first_error: Option<String>,
    pub(super) elapsed: Duration,
    pub(super) cpu: Duration,
}

/// Sets up `count` connections with `concurrency` in flight; `keep`: hold them, else take each down at once.
pub(super) async fn open_many(
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

pub(super) async fn connect_bench(adapter: Option<Adapter>, a: &PerfArgs) -> Result<()> {
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
pub(super) async fn hold(setup: &Setup, a: &PerfArgs, timeout: Duration) -> Result<()> {
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

/// Every soft-rdma-free baseline connection is a kernel socket: `--hold` may need thousands.
pub(super) fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}
