//! soft-rdmad's metrics endpoint (`--metrics-listen`) with real daemons in a namespace pair:
//!
//! - a real Prometheus server (Debian's `prometheus`), run in A's namespace with a generated configuration and
//!   a temporary storage directory, scrapes both daemons during an RDMA Write transfer; through its HTTP API
//!   the bytes `increase()` counts over the transfer are the bytes the test sent, and a refused connection
//!   and a hit limit show up as increments;
//! - `promtool check metrics` accepts the exposition of an XDP-mode daemon and of a kernel-mode one, and
//!   OpenMetrics comes when asked for;
//! - kernel mode counts every byte of short connections: a 64 MiB RDMA Write whose queue pairs close at
//!   once, C programs that exit with their queue pairs connected (`tests/c/exit_connected.c`), and a Rust
//!   program that returns from `main` with its objects alive (`tests/src/bin/exit_connected_rust.rs`);
//! - many slow or hostile scrapers at once neither stall a transfer that runs through the daemon nor grow
//!   its memory, and a well-behaved scrape is answered afterwards.
//!
//! Needs root. Without Debian's prometheus package (`cargo xtask setup` installs it) the first two tests say
//! so and pass, unless `CI` is set: there they fail.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use soft_rdma::NdStatus;
use soft_rdma::client::{Adapter, ReadLimits};
use soft_rdma_tests::ends::{End, listen_and_connect_ok, write_read_back};
use soft_rdma_tests::ops::{completions, eventually, pattern, within};
use soft_rdma_tests::{Daemon, Side, TestNet};

const METRICS_PORT: u16 = 9464;
const PROMETHEUS_PORT: u16 = 9090;
/// Prometheus's scrape interval in these tests, seconds.
const SCRAPE_INTERVAL: f64 = 1.0;
/// One transfer round: this many RDMA Writes of [`CHUNK`] bytes.
const CHUNKS: usize = 16;
const CHUNK: usize = 1 << 20;

/// `name` on `PATH`, or `None` if this test may skip without it (it says so); with `CI` set it must be
/// there.
fn tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    if let Some(p) = std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
    {
        return Some(p);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{name} is not installed and CI is set: `cargo xtask setup` installs Debian's prometheus package"
    );
    eprintln!(
        "SKIPPED: {name} is not installed (Debian's prometheus package: `cargo xtask setup` installs it)"
    );
    None
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64()
}

/// An HTTP client whose every request ends within 20 s, and which hands back 4xx and 5xx answers.
fn agent() -> ureq::Agent {
    ureq::Agent::new_with_config(
        ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(20)))
            .http_status_as_error(false)
            .build(),
    )
}

/// An HTTP answer: status, content type, body.
type Answer = (u16, String, String);

/// `method` `url` with `accept`, from inside `side`'s namespace.
fn request_in(net: &TestNet, side: Side, method: &'static str, url: String, accept: &'static str) -> Answer {
    net.in_ns(side, move || {
        let agent = agent();
        let r = match method {
            "GET" => agent.get(&url).header("Accept", accept).call(),
            _ => agent.post(&url).send(""),
        };
        let mut r = r.unwrap_or_else(|e| panic!("{method} {url}: {e}"));
        let ct = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body = r.body_mut().read_to_string().expect("a UTF-8 body");
        (r.status().as_u16(), ct, body)
    })
}

/// `/metrics` of the daemon at `addr` in the Prometheus text format, read from A's namespace.
fn scrape(net: &TestNet, addr: SocketAddr) -> String {
    let (status, _, body) = request_in(
        net,
        Side::A,
        "GET",
        format!("http://{addr}/metrics"),
        "text/plain",
    );
    assert_eq!(status, 200, "{body}");
    body
}

/// The value of the sample `series` (a name with its labels, as the text format writes it) in `text`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// `/metrics` flags for a daemon in `side`'s namespace: its address on the veth, port [`METRICS_PORT`].
fn metrics_flag(net: &TestNet, side: Side) -> (SocketAddr, String) {
    let addr = net.addr(side, METRICS_PORT);
    (addr, addr.to_string())
}

/// A Prometheus server in A's namespace, stopped (and waited for) on drop; its storage is in the test's
/// directory, which the [`TestNet`] removes.
struct Prometheus {
    child: Child,
    api: String,
    log: PathBuf,
}

impl Prometheus {
    /// Starts `binary` scraping `targets` every [`SCRAPE_INTERVAL`].
    fn start(net: &TestNet, binary: &Path, targets: &[SocketAddr]) -> Prometheus {
        let dir = net.dir().join("prometheus");
        std::fs::create_dir_all(&dir).expect("prometheus directory");
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let config = format!(
            "global:\n  scrape_interval: {SCRAPE_INTERVAL}s\n  scrape_timeout: {SCRAPE_INTERVAL}s\n\
             scrape_configs:\n  - job_name: soft-rdmad\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        );
        let config_path = dir.join("prometheus.yml");
        std::fs::write(&config_path, config).expect("prometheus.yml");
        let listen = net.addr(Side::A, PROMETHEUS_PORT);
        let log = dir.join("prometheus.log");
        let out = std::fs::File::create(&log).expect("prometheus.log");
        let child = net
            .command(Side::A, binary.to_str().expect("a UTF-8 path"))
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={listen}"))
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .spawn()
            .expect("prometheus starts");
        Prometheus {
            child,
            api: format!("http://{listen}/api/v1"),
            log,
        }
    }

    /// Waits until the server answers its readiness check (it exits: a panic with its log).
    async fn ready(&mut self, net: &TestNet) {
        let url = self.api.replace("/api/v1", "/-/ready");
        within("Prometheus to be ready", async {
            loop {
                if let Ok(Some(status)) = self.child.try_wait() {
                    panic!("prometheus exited ({status}):\n{}", self.log_text());
                }
                let url = url.clone();
                let ready = net.in_ns(Side::A, move || {
                    agent().get(&url).call().is_ok_and(|r| r.status() == 200)
                });
                if ready {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await
    }

    /// An instant query at `at` (now if `None`): each series' labels and value.
    fn query(&self, net: &TestNet, promql: &str, at: Option<f64>) -> Vec<(HashMap<String, String>, f64)> {
        let (url, q) = (format!("{}/query", self.api), promql.to_owned());
        let body = net.in_ns(Side::A, move || {
            let mut req = agent().get(&url).query("query", &q);
            if let Some(t) = at {
                req = req.query("time", format!("{t:.3}"));
            }
            let mut r = req.call().unwrap_or_else(|e| panic!("query {q}: {e}"));
            r.body_mut().read_to_string().expect("a UTF-8 body")
        });
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        assert_eq!(v["status"], "success", "{promql}: {body}");
        v["data"]["result"]
            .as_array()
            .unwrap_or_else(|| panic!("{promql}: no result in {body}"))
            .iter()
            .map(|s| {
                let labels = s["metric"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect();
                let value = s["value"][1]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(f64::NAN);
                (labels, value)
            })
            .collect()
    }

    /// Waits until the single series `promql` selects has a value `ok` accepts; returns it.
    async fn until(&self, net: &TestNet, what: &str, promql: &str, ok: impl Fn(f64) -> bool) -> f64 {
        eventually(what, async || {
            let rows = self.query(net, promql, None);
            match rows.as_slice() {
                [(_, v)] if ok(*v) => Some(*v),
                _ => None,
            }
        })
        .await
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `rounds` rounds of [`CHUNKS`] RDMA Writes of [`CHUNK`] bytes from `a` into a region of `b`; after each,
/// a Read of the whole region back proves every Write landed, and both copies must equal what was sent.
/// Returns the bytes written.
async fn transfer(a: &End, b: &End, rounds: usize, seed: u8) -> u64 {
    let len = CHUNK * CHUNKS;
    let (src, back, dst) = (
        a.register(len).await,
        a.register(len).await,
        b.register(len).await,
    );
    for round in 0..rounds {
        let data = pattern(len, seed.wrapping_add(round as u8));
        src.write_at(0, &data).unwrap();
        for i in 0..CHUNKS {
            let at = i * CHUNK;
            a.qp.write(
                i as u64,
                &[src.sge(at as u64, CHUNK as u32)],
                dst.remote(at as u64),
            )
            .unwrap();
        }
        a.qp.read(99, back.sge(0, len as u32), dst.remote(0)).unwrap();
        for c in completions(&a.cq, CHUNKS + 1).await {
            assert_eq!(c.status, NdStatus::Success, "{c:?}");
        }
        assert!(
            back.to_vec(0, len).unwrap() == data,
            "round {round}: the bytes read back differ"
        );
        assert!(
            dst.to_vec(0, len).unwrap() == data,
            "round {round}: B's region differs"
        );
    }
    (rounds * len) as u64
}

/// Two daemons with metrics endpoints (`extra` for both), a queue pair on each, connected A → B.
async fn pair(tag: &str, extra: &[&str]) -> (TestNet, Daemon, Daemon, End, End) {
    let net = TestNet::new(tag).expect("netns pair");
    let ((_, fa), (_, fb)) = (metrics_flag(&net, Side::A), metrics_flag(&net, Side::B));
    let mut args_a = vec!["--metrics-listen", &fa];
    let mut args_b = vec!["--metrics-listen", &fb];
    args_a.extend(extra);
    args_b.extend(extra);
    let da = net.spawn_daemon(Side::A, &args_a).expect("daemon A");
    let db = net.spawn_daemon(Side::B, &args_b).expect("daemon B");
    let (a, b) = (
        End::open(da.uds_path(), 64, 32).await,
        End::open(db.uds_path(), 64, 32).await,
    );
    let limits = (ReadLimits::new(4, 4), ReadLimits::new(4, 4));
    listen_and_connect_ok(&a, &b, net.addr(Side::B, 7400), limits).await;
    (net, da, db, a, b)
}

/// Checks that `increase(series[window])` at `at`, as Prometheus computes it, is `expected` give or take
/// what scrape timing explains. The window reaches 5 scrape intervals before `since` (Prometheus has scraped
/// since well before), while the counter held its earlier value of 0, so its first sample is at most one
/// interval after its start and, being 0, nothing is extrapolated before it; its last sample is at most one
/// interval before the window's end, and Prometheus extrapolates over that gap: by at most 1.1 intervals,
/// against at least `window` − 2.2 intervals sampled.
fn assert_increase(prom: &Prometheus, net: &TestNet, series: &str, (since, at): (f64, f64), expected: f64) {
    let window = (at - since).ceil() + 5.0 * SCRAPE_INTERVAL;
    let promql = format!("increase({series}[{window}s])");
    let rows = prom.query(net, &promql, Some(at));
    let [(_, got)] = rows.as_slice() else {
        panic!("{promql}: expected one series, got {rows:?}");
    };
    let slack = 1.1 * SCRAPE_INTERVAL / (window - 2.2 * SCRAPE_INTERVAL);
    assert!(
        *got >= expected * 0.999 && *got <= expected * (1.0 + slack) + 1e-9,
        "{promql} = {got}, expected {expected} (up to {:.1}% more from extrapolation)",
        slack * 100.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_sees_a_transfer_a_refused_connection_and_a_hit_limit() {
    let Some(binary) = tool("prometheus") else { return };
    let (net, da, _db, a, b) = pair("prom", &["--max-objects-per-session", "32"]).await;
    let (ma, mb) = (net.addr(Side::A, METRICS_PORT), net.addr(Side::B, METRICS_PORT));
    let mut prom = Prometheus::start(&net, &binary, &[ma, mb]);
    prom.ready(&net).await;
    let up = |rows: Vec<(HashMap<String, String>, f64)>| rows.len() == 2 && rows.iter().all(|r| r.1 == 1.0);
    eventually("Prometheus scraping both daemons", async || {
        up(prom.query(&net, "up", None)).then_some(())
    })
    .await;
    // Samples from well before the transfer, so that the windows below are covered from their start.
    eventually("6 scrapes of each daemon", async || {
        let rows = prom.query(&net, "count_over_time(up[1h]) >= 6", None);
        (rows.len() == 2).then_some(())
    })
    .await;

    // The transfer: kernel mode runs it in this process, and each client reports its queue pair's counts.
    let before = unix_now();
    let sent = transfer(&a, &b, 4, 1).await;
    let tx = format!(r#"soft_rdma_data_bytes_total{{op="write",direction="tx",instance="{ma}"}}"#);
    let rx = format!(r#"soft_rdma_data_bytes_total{{op="write",direction="rx",instance="{mb}"}}"#);
    for series in [&tx, &rx] {
        prom.until(&net, "Prometheus to have the whole transfer", series, |v| {
            v >= sent as f64
        })
        .await;
    }
    let after = unix_now();
    for series in [&tx, &rx] {
        assert_increase(&prom, &net, series, (before, after), sent as f64);
    }
    let rate = prom.query(
        &net,
        &format!("rate({tx}[{}s])", (after - before).ceil() + 1.0),
        Some(after),
    );
    assert!(rate.first().is_some_and(|r| r.1 > 0.0), "rate(): {rate:?}");

    // A refused connection: nobody listens on B's port 7999.
    let before = unix_now();
    let c = a.adapter.create_connector().await.unwrap();
    let e = within(
        "a refused connect",
        c.connect(net.addr(Side::B, 7999), ReadLimits::new(1, 1), b""),
    )
    .await
    .unwrap_err();
    assert_eq!(e.status, NdStatus::ConnectionRefused, "{e}");
    let refused =
        format!(r#"soft_rdma_connection_setups_total{{side="active",result="refused",instance="{ma}"}}"#);
    prom.until(&net, "the refusal in Prometheus", &refused, |v| v >= 1.0)
        .await;
    assert_increase(&prom, &net, &refused, (before, unix_now()), 1.0);

    // A hit limit: a session creates connectors until A's --max-objects-per-session refuses one.
    let before = unix_now();
    let s = Adapter::open(da.uds_path()).await.expect("a second session");
    let mut held = Vec::new();
    let e = loop {
        match s.create_connector().await {
            Ok(c) => held.push(c),
            Err(e) => break e,
        }
        assert!(held.len() <= 32, "the object limit never refused");
    };
    assert_eq!(e.status, NdStatus::InsufficientResources, "{e}");
    let hits = format!(r#"soft_rdma_limit_hits_total{{limit="max_objects_per_session",instance="{ma}"}}"#);
    prom.until(&net, "the hit limit in Prometheus", &hits, |v| v >= 1.0)
        .await;
    assert_increase(&prom, &net, &hits, (before, unix_now()), 1.0);
    eprintln!("prometheus log:\n{}", prom.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_accepts_the_exposition_of_both_transports() {
    let Some(promtool) = tool("promtool") else { return };
    let net = TestNet::new("ptool").expect("netns pair");
    let ((ma, fa), (mb, fb)) = (metrics_flag(&net, Side::A), metrics_flag(&net, Side::B));
    // A over XDP (its program's, its sockets' and its own TCP's figures), B over kernel TCP.
    let da = net
        .spawn_daemon_over(Side::A, true, &["--metrics-listen", &fa])
        .expect("daemon A");
    let db = net
        .spawn_daemon_over(Side::B, false, &["--metrics-listen", &fb])
        .expect("daemon B");
    let (a, b) = (
        End::open(da.uds_path(), 64, 32).await,
        End::open(db.uds_path(), 64, 32).await,
    );
    let limits = (ReadLimits::new(4, 4), ReadLimits::new(4, 4));
    listen_and_connect_ok(&a, &b, net.addr(Side::B, 7400), limits).await;
    write_read_back(&a, &b, &[1, 4096, 100_000], 3).await;
    for (who, addr) in [("A (XDP)", ma), ("B (kernel TCP)", mb)] {
        let url = format!("http://{addr}/metrics");
        let (status, ct, text) = request_in(&net, Side::A, "GET", url.clone(), "text/plain");
        assert_eq!(status, 200, "{who}: {text}");
        assert!(ct.starts_with("text/plain; version=0.0.4"), "{who}: {ct}");
        let mut check = Command::new(&promtool)
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("promtool runs");
        use std::io::Write;
        check.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
        let out = check.wait_with_output().unwrap();
        let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && said.trim().is_empty(),
            "{who}: promtool: {said}\n{text}"
        );
        let moved = r#"soft_rdma_data_bytes_total{op="write",direction="tx"}"#;
        assert!(sample(&text, moved).is_some(), "{who}: no {moved}");
        let redirected = sample(&text, r#"soft_rdma_xdp_packets_total{verdict="redirected"}"#);
        match who {
            "A (XDP)" => {
                assert!(redirected.is_some_and(|n| n > 0.0), "A steered nothing: {text}");
                assert!(sample(&text, "soft_rdma_tcp_segments_sent_total").is_some_and(|n| n > 0.0));
            }
            _ => assert!(redirected.is_none(), "B runs no XDP program"),
        }
        let accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5";
        let (status, ct, om) = request_in(&net, Side::A, "GET", url.clone(), accept);
        assert_eq!(status, 200);
        assert!(
            ct.starts_with("application/openmetrics-text; version=1.0.0"),
            "{who}: {ct}"
        );
        assert!(om.ends_with("# EOF\n") && om.contains("# TYPE soft_rdma_data_bytes counter"));
        let (status, _, _) = request_in(&net, Side::A, "GET", format!("http://{addr}/other"), "*/*");
        assert_eq!(status, 404);
        let (status, _, _) = request_in(&net, Side::A, "POST", url, "*/*");
        assert_eq!(status, 405);
    }
}

/// One hostile scraper's connection: what it does until the server closes it or `stop` is set.
fn hostile(addr: SocketAddr, kind: usize, stop: &AtomicBool) {
    use std::io::Write;
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return;
    };
    let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
    let head = b"GET /metrics HTTP/1.1\r\nHost: x\r\n";
    let wrote = match kind {
        // Slowloris: a request head that never ends, a header every 200 ms.
        0 => s.write_all(head).is_ok(),
        // Asks again and again and never reads an answer.
        1 => (0..64).all(|_| s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").is_ok()),
        // A head far past the server's bound.
        2 => s.write_all(head).is_ok() && s.write_all(&vec![b'a'; 64 << 10]).is_ok(),
        // Connects and says nothing.
        _ => true,
    };
    let until = Instant::now() + Duration::from_secs(8);
    while wrote && !stop.load(Ordering::Relaxed) && Instant::now() < until {
        if kind == 0 && s.write_all(b"X-Slow: 1\r\n").is_err() {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_scrapers_neither_stall_a_transfer_nor_grow_the_daemon() {
    // The data path runs in the daemons: a stalled event loop would stall the transfer.
    let (net, _da, db, a, b) = pair("hammr", &["--data-path", "daemon"]).await;
    let mb = net.addr(Side::B, METRICS_PORT);
    transfer(&a, &b, 1, 7).await;
    let rss = || db.status_kb("VmRSS").expect("B's VmRSS");
    let baseline = rss();
    // 8 threads keep 4 connections each going (32 > the server's 16), new ones as the server drops them.
    let stop = Arc::new(AtomicBool::new(false));
    let hammers: Vec<_> = (0..8)
        .map(|t| {
            let stop = stop.clone();
            net.spawn_in_ns(Side::A, move || {
                for round in 0..20 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let conns: Vec<_> = (0..4)
                        .map(|k| {
                            let stop = stop.clone();
                            std::thread::spawn(move || hostile(mb, (t + round + k) % 4, &stop))
                        })
                        .collect();
                    conns
                        .into_iter()
                        .for_each(|c| c.join().expect("a hostile client"));
                }
            })
        })
        .collect();
    let mut peak = baseline;
    let mut sent = 0;
    for round in 0..6 {
        sent += transfer(&a, &b, 1, 20 + round).await;
        peak = peak.max(rss());
    }
    stop.store(true, Ordering::Relaxed);
    for h in hammers {
        within(
            "the hostile clients to stop",
            tokio::task::spawn_blocking(move || h.join()),
        )
        .await
        .unwrap()
        .expect("a hammer thread");
    }
    assert!(
        peak.saturating_sub(baseline) < 64 << 10,
        "B's resident memory grew from {baseline} kB to {peak} kB under the scrapers"
    );
    // The endpoint answers again, and saw the flood: connections past its bound were closed.
    let rx = r#"soft_rdma_data_bytes_total{op="write",direction="rx"}"#;
    let text = eventually("a scrape once the flood ended", async || {
        let t = scrape(&net, mb);
        (sample(&t, rx)? >= (sent + (CHUNK * CHUNKS) as u64) as f64).then_some(t)
    })
    .await;
    let refused = sample(&text, "soft_rdma_metrics_connections_refused_total").unwrap();
    assert!(refused > 0.0, "the connection bound never acted:\n{text}");
    assert_eq!(
        sample(&text, rx),
        Some((sent + (CHUNK * CHUNKS) as u64) as f64),
        "B counts exactly the bytes written into its queue pair"
    );
}

/// Bytes in the short transfers below: 64 RDMA Writes of 1 MiB.
const SHORT: usize = 64 << 20;
/// How long the daemons' totals may take to reach what moved in these tests. Not the product's bound (a
/// closing queue pair's final counters are sent at once, the exit's at `exit`: docs/metrics.md), only
/// what fails the test rather than stalling it.
const COUNTED_WITHIN: Duration = Duration::from_secs(10);

/// Waits until `series` of the daemon whose metrics are at `addr` is `expected`; fails if it goes past
/// it, or has not reached it in [`COUNTED_WITHIN`].
async fn until_counted(net: &TestNet, addr: SocketAddr, series: &str, expected: u64) {
    let deadline = Instant::now() + COUNTED_WITHIN;
    loop {
        let got = sample(&scrape(net, addr), series).unwrap_or(0.0);
        assert!(
            got <= expected as f64,
            "{series} at {addr} is {got}, past {expected}"
        );
        if got == expected as f64 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{series} at {addr} is {got}, not {expected}, {COUNTED_WITHIN:?} after the transfer ended"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

const WRITE_TX: &str = r#"soft_rdma_data_bytes_total{op="write",direction="tx"}"#;
const WRITE_RX: &str = r#"soft_rdma_data_bytes_total{op="write",direction="rx"}"#;

/// A 64 MiB RDMA Write that lasts far less than the clients' one-second report interval, its queue pairs
/// closed right after: both daemons count all of it (in kernel mode from the final counters each queue pair
/// reports as it closes; over XDP the daemon ran it and counted it itself).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_transfer_is_counted_in_full_once_its_queue_pairs_close() {
    let (net, _da, _db, a, b) = pair("short", &[]).await;
    let (ma, mb) = (net.addr(Side::A, METRICS_PORT), net.addr(Side::B, METRICS_PORT));
    let (src, dst, back) = (
        a.register(SHORT).await,
        b.register(SHORT).await,
        a.register(8).await,
    );
    let data = pattern(SHORT, 9);
    src.write_at(0, &data).unwrap();
    let started = Instant::now();
    for batch in 0..SHORT / (CHUNKS * CHUNK) {
        for i in 0..CHUNKS {
            let at = (batch * CHUNKS + i) * CHUNK;
            a.qp.write(
                at as u64,
                &[src.sge(at as u64, CHUNK as u32)],
                dst.remote(at as u64),
            )
            .unwrap();
        }
        for c in completions(&a.cq, CHUNKS).await {
            assert_eq!(c.status, NdStatus::Success, "{c:?}");
        }
    }
    // The Read's response follows the Writes (RFC 5040 §5.5): B has placed them all.
    a.qp.read(SHORT as u64, back.sge(0, 8), dst.remote(0)).unwrap();
    for c in completions(&a.cq, 1).await {
        assert_eq!(c.status, NdStatus::Success, "{c:?}");
    }
    eprintln!("64 MiB written in {:?}", started.elapsed());
    // Closed at once (queue pairs, connectors): no periodic report comes after the transfer.
    drop((a, b));
    assert!(dst.to_vec(0, SHORT).unwrap() == data, "B's region differs");
    drop((src, dst, back));
    until_counted(&net, ma, WRITE_TX, SHORT as u64).await;
    until_counted(&net, mb, WRITE_RX, SHORT as u64).await;
}

/// `tests/src/bin/exit_connected_rust.rs`, the Rust client library's program, writes 64 MiB into
/// `tests/c/exit_connected.c`'s region and returns from `main` with its objects alive (dropped as its
/// runtime ends, no disconnect); the server exits connected too. Both daemons count every byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_program_that_returns_from_main_connected_is_counted_in_full() {
    use soft_rdma_tests::rdma_core::{DEADLINE, Running, compile_c};
    let net = TestNet::new("exitr").expect("netns pair");
    let ((ma, fa), (mb, fb)) = (metrics_flag(&net, Side::A), metrics_flag(&net, Side::B));
    let da = net
        .spawn_daemon(Side::A, &["--metrics-listen", &fa])
        .expect("daemon A");
    let db = net
        .spawn_daemon(Side::B, &["--metrics-listen", &fb])
        .expect("daemon B");
    let exe = compile_c("exit_connected", net.dir());
    let cli = soft_rdma_tests::cli_binary().expect("soft-rdma CLI");
    let b_ip = net.ipv4(Side::B).to_string();
    let mut server_cmd = net.command(Side::B, cli.to_str().expect("UTF-8 path"));
    server_cmd
        .arg("--uds")
        .arg(db.uds_path())
        .args(["run", "--"])
        .arg(&exe);
    server_cmd.args(["server", &b_ip, "7411", &SHORT.to_string()]);
    let mut server = Running::spawn("exit_connected server", server_cmd);
    server.wait_for_line("server: listening", DEADLINE);
    let mut client_cmd = net.command(Side::A, env!("CARGO_BIN_EXE_exit_connected_rust"));
    client_cmd
        .arg(format!("{b_ip}:7411"))
        .env("SOFT_RDMA_UDS", da.uds_path());
    let client = Running::spawn("exit_connected_rust", client_cmd).wait(DEADLINE);
    let server = server.wait_after(&client);
    client.assert_success();
    server.assert_success();
    eprintln!("{}", client.lines_with("client: wrote").join("\n"));
    assert_eq!(
        server.lines_with("all as sent"),
        [format!("server: {SHORT} bytes written, all as sent")],
        "{server}"
    );
    until_counted(&net, ma, WRITE_TX, SHORT as u64).await;
    until_counted(&net, mb, WRITE_RX, SHORT as u64).await;
}

/// `tests/c/exit_connected.c` through the drop-in libraries: a client writes 64 MiB into a server's region
/// and both return from `main` with their queue pairs connected (no disconnect, no destroy). Both daemons
/// count every byte: the library reports its queue pairs' counters at `exit`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn programs_that_exit_without_disconnecting_are_counted_in_full() {
    use soft_rdma_tests::rdma_core::{DEADLINE, Running, compile_c};
    let net = TestNet::new("exitc").expect("netns pair");
    let ((ma, fa), (mb, fb)) = (metrics_flag(&net, Side::A), metrics_flag(&net, Side::B));
    let da = net
        .spawn_daemon(Side::A, &["--metrics-listen", &fa])
        .expect("daemon A");
    let db = net
        .spawn_daemon(Side::B, &["--metrics-listen", &fb])
        .expect("daemon B");
    let exe = compile_c("exit_connected", net.dir());
    let cli = soft_rdma_tests::cli_binary().expect("soft-rdma CLI");
    let program = |side: Side, uds: &Path, args: &[&str]| {
        let mut c = net.command(side, cli.to_str().expect("UTF-8 path"));
        c.arg("--uds").arg(uds).args(["run", "--"]).arg(&exe).args(args);
        c
    };
    let (b_ip, port, len) = (net.ipv4(Side::B).to_string(), "7410", SHORT.to_string());
    let mut server = Running::spawn(
        "exit_connected server",
        program(Side::B, db.uds_path(), &["server", &b_ip, port, &len]),
    );
    server.wait_for_line("server: listening", DEADLINE);
    let client = Running::spawn(
        "exit_connected client",
        program(Side::A, da.uds_path(), &["client", &b_ip, port]),
    )
    .wait(DEADLINE);
    let server = server.wait_after(&client);
    client.assert_success();
    server.assert_success();
    eprintln!("{}", client.lines_with("client: wrote").join("\n"));
    assert_eq!(
        server.lines_with("all as sent"),
        [format!("server: {SHORT} bytes written, all as sent")],
        "{server}"
    );
    until_counted(&net, ma, WRITE_TX, SHORT as u64).await;
    until_counted(&net, mb, WRITE_RX, SHORT as u64).await;
}
