//! XDP mode with the peers people have (issue 34): a peer on kernel TCP whose link keeps the kernel's default
//! offloads — TX checksum offload and TSO on, as a container's veth or a VM's virtio-net — so its segments
//! carry only the pseudo-header sum in their checksum field (`CHECKSUM_PARTIAL`) and may come as GSO
//! packets larger than an AF_XDP frame. The other netns suites turn `tx off`; these do not.
//!
//! - behind a veth (native XDP): both directions connect, and Send, RDMA Write and Read move 1 B .. 1 MiB
//!   byte for byte; `status` counts the partial checksums accepted and no drop;
//! - behind a bridge that carries the XDP daemon's address (generic XDP on the bridge, SYN cookies
//!   answered by the program): the same;
//! - on a macvlan, a link whose partial checksums the daemon must refuse (it may sit on a NIC): the
//!   connection fails, and `status`, the metrics and a warning naming the cause and the fix say why.
//!
//! Needs root.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use soft_rdma::client::{CompletionOp, ReadLimits, StatusReport};
use soft_rdma_tests::ends::{End, listen_and_connect, write_read_back};
use soft_rdma_tests::ops::{assert_ok, completions, pattern, within};
use soft_rdma_tests::{Daemon, PeerLink, Side, TestNet};

const PORT: u16 = 7410;
const LIMITS: ReadLimits = ReadLimits {
    inbound: 16,
    outbound: 16,
};
const SIZES: [usize; 3] = [1, 4096, 1 << 20];

/// A in XDP mode on [`TestNet::xdp_dev`], B on kernel TCP with its offloads on.
fn daemons(net: &TestNet, a_extra: &[&str]) -> (Daemon, Daemon) {
    let a = net.spawn_daemon_over(Side::A, true, a_extra).expect("daemon A");
    assert!(
        a.log_text().contains("XDP transport ready"),
        "A did not start XDP mode:\n{}",
        a.log_text()
    );
    let b = net.spawn_daemon_over(Side::B, false, &[]).expect("daemon B");
    (a, b)
}

async fn end(d: &Daemon) -> End {
    End::open(d.uds_path(), 4096, 1024).await
}

/// The transport counter `name` in `status`.
fn counter(s: &StatusReport, name: &str) -> u64 {
    let t = s.transport.as_ref().expect("a transport in status");
    t.counters
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no counter {name} in {:?}", t.counters))
}

/// `client` connects to `server`'s listener at `at`; then Send of each size, and RDMA Write and Read back
/// of each size, client → server, byte for byte.
async fn connect_and_move(client: &End, server: &End, at: SocketAddr, seed: u8, logs: &[&Daemon]) {
    let rmr = server.register((1 << 20) + 64).await;
    for (i, size) in SIZES.iter().enumerate() {
        server.qp.receive(i as u64, &[rmr.sge(0, *size as u32)]).unwrap();
    }
    let (x, y) = within(
        "connect + accept",
        listen_and_connect(client, server, at, (LIMITS, LIMITS), b""),
    )
    .await;
    if x.is_err() || y.is_err() {
        let text: Vec<String> = logs.iter().map(|d| d.log_text()).collect();
        panic!("connect to {at}: {x:?} / {y:?}\n{}", text.join("\n=====\n"));
    }
    let smr = client.register((1 << 20) + 64).await;
    for (i, size) in SIZES.iter().enumerate() {
        let data = pattern(*size, seed.wrapping_add(i as u8));
        smr.write_at(0, &data).unwrap();
        client
            .qp
            .send(100 + i as u64, &[smr.sge(0, *size as u32)])
            .unwrap();
        assert_ok(
            &completions(&client.cq, 1).await[0],
            100 + i as u64,
            CompletionOp::Send,
            *size as u32,
        );
        assert_ok(
            &completions(&server.cq, 1).await[0],
            i as u64,
            CompletionOp::Receive,
            *size as u32,
        );
        assert_eq!(rmr.to_vec(0, *size).unwrap(), data, "Send of {size} bytes");
    }
    write_read_back(client, server, &SIZES, seed.wrapping_add(50)).await;
}

/// Both directions between A (XDP) and B (kernel TCP, offloads on) over `link`: B connects to A, then A to
/// B, each moving every size both ways' worth. Returns A's status after.
async fn both_directions(tag: &str, link: PeerLink) -> (StatusReport, TestNet, Daemon) {
    let net = TestNet::new_offloading(tag, link).expect("namespaces");
    let (da, db) = daemons(&net, &[]);
    let (a1, b1) = (end(&da).await, end(&db).await);
    connect_and_move(&b1, &a1, net.addr(Side::A, PORT), 1, &[&da, &db]).await;
    let (a2, b2) = (end(&da).await, end(&db).await);
    connect_and_move(&a2, &b2, net.addr(Side::B, PORT + 1), 2, &[&da, &db]).await;
    let status = a1.adapter.status().await.expect("status");
    drop(db);
    (status, net, da)
}

/// What every link that accepts partial checksums must show: they came and were taken, nothing dropped
/// for its checksum, no packet too long to join.
fn assert_taken(s: &StatusReport, log: &str) {
    let accepted = counter(s, "tcp_partial_checksums_accepted");
    assert!(
        accepted > 0,
        "B's segments carry partial checksums: none seen?\n{log}"
    );
    for reason in [
        "tcp_dropped_bad_checksum",
        "tcp_dropped_partial_checksum",
        "tcp_dropped_malformed",
    ] {
        assert_eq!(counter(s, reason), 0, "{reason}\n{log}");
    }
    let t = s.transport.as_ref().unwrap();
    assert!(t.queues.iter().all(|q| q.rx_oversized == 0), "{:?}", t.queues);
    assert!(
        log.contains("carry partial checksums (the peer offloads TX checksums): accepted"),
        "the first partial checksum is said once at info:\n{log}"
    );
}

/// A container's veth: native XDP on A's end (the kernel then turns the peer end's GSO off).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn veth_peer_with_offloads_on() {
    let (s, _net, da) = both_directions("ofveth", PeerLink::Veth).await;
    let log = da.log_text();
    let t = s.transport.as_ref().unwrap();
    assert_eq!(t.mode.as_deref(), Some("native"), "{log}");
    assert!(
        log.contains("is a veth: segments from peers that offload TX checksums"),
        "{log}"
    );
    assert_taken(&s, &log);
}

/// A host whose address is on a bridge, a peer with offloads on behind it: generic XDP on the bridge, SYN
/// cookies answered by the program, TSO's GSO packets joined from several AF_XDP descriptors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bridge_carrying_the_address_with_an_offloading_peer() {
    let (s, _net, da) = both_directions("ofbrdg", PeerLink::Bridge).await;
    let log = da.log_text();
    let t = s.transport.as_ref().unwrap();
    assert_eq!(t.mode.as_deref(), Some("generic"), "{log}");
    assert!(
        log.contains("is a bridge: segments from peers that offload TX checksums"),
        "{log}"
    );
    assert!(
        counter(&s, "syn_cookie") > 0,
        "B's SYN answered by the program:\n{log}"
    );
    assert_taken(&s, &log);
}

/// `GET /metrics` from inside `side`'s namespace at `addr`: the body.
fn scrape(net: &TestNet, side: Side, addr: SocketAddr) -> String {
    net.in_ns(side, move || {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("metrics endpoint");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).expect("a UTF-8 answer");
        text
    })
}

/// A link the daemon must not trust with partial checksums (a macvlan: it may sit on a NIC): B's SYN is
/// answered by the program's SYN cookie, but B's ACK and everything after carry partial checksums and are
/// dropped. The connect fails; `status` and the metrics count the drops by their reason, and the log
/// names the cause and the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn macvlan_refuses_partial_checksums_and_says_why() {
    let net = TestNet::new_offloading("ofmacv", PeerLink::Macvlan).expect("namespaces");
    let metrics: SocketAddr = "127.0.0.1:9474".parse().unwrap();
    let flag = metrics.to_string();
    let (da, db) = daemons(&net, &["--metrics-listen", &flag]);
    let (a, b) = (end(&da).await, end(&db).await);
    let at = net.addr(Side::A, PORT);
    let listener = a.adapter.create_listener().await.unwrap();
    listener.listen(at, 0).await.unwrap();
    let r = within("a connect that fails", async {
        b.connector.connect_qp(&b.qp, at, LIMITS, b"").await?;
        b.connector.complete_connect().await
    })
    .await;
    assert!(r.is_err(), "connected over a refused link");
    let s = a.adapter.status().await.expect("status");
    let log = da.log_text();
    assert!(
        log.contains("is a macvlan: every TCP checksum is verified"),
        "{log}"
    );
    let refused = counter(&s, "tcp_dropped_partial_checksum");
    assert!(refused > 0, "{:?}\n{log}", s.transport);
    assert_eq!(counter(&s, "tcp_partial_checksums_accepted"), 0);
    assert_eq!(counter(&s, "tcp_dropped_bad_checksum"), 0);
    let warning = log
        .lines()
        .find(|l| l.contains("WARN") && l.contains("carry partial checksums"))
        .unwrap_or_else(|| panic!("no warning:\n{log}"));
    let peer = net.ipv4(Side::B).to_string();
    for needle in [peer.as_str(), "offloads TX checksums", "ethtool -K", "tx off"] {
        assert!(warning.contains(needle), "{needle} missing from: {warning}");
    }
    // Rate-limited: not a line per segment.
    let lines = log.matches("carry partial checksums (only").count() as u64;
    assert!(lines <= refused, "{lines} warnings for {refused} drops");
    // The CLI says it too, for people and for scripts.
    let cli = soft_rdma_tests::cli_binary().expect("the soft-rdma CLI");
    let status = |json: bool| {
        let mut c = net.command(Side::A, cli.to_str().unwrap());
        c.arg("--uds").arg(da.uds_path()).arg("status");
        if json {
            c.arg("--json");
        }
        let out = c.output().expect("soft-rdma status");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let human = status(false);
    assert!(
        human.contains("TCP segments dropped: bad_checksum 0, partial_checksum "),
        "{human}"
    );
    let v: serde_json::Value = serde_json::from_str(&status(true)).expect("JSON");
    let in_json = v["transport"]["counters"]
        .as_array()
        .and_then(|c| c.iter().find(|p| p[0] == "tcp_dropped_partial_checksum"))
        .and_then(|p| p[1].as_u64())
        .unwrap_or_else(|| panic!("no tcp_dropped_partial_checksum in {v}"));
    assert!(in_json >= refused, "JSON {in_json}, status {refused}");
    let text = scrape(&net, Side::A, metrics);
    let series = "soft_rdma_tcp_dropped_segments_total{reason=\"partial_checksum\"} ";
    let value: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{series} missing:\n{text}"));
    assert!(value >= refused, "metrics {value}, status {refused}");
    drop(db);
}
