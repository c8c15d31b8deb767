//! The XDP/AF_XDP transport (`soft-rdmad --xdp IFACE`) end to end: real daemons in a pair of network
//! namespaces, driven through the client library exactly as data_path.rs does, every transfer verified byte
//! for byte. Covers both sides in XDP mode (IPv4 and IPv6), mixed XDP/kernel pairs in both directions,
//! traffic that is not soft-rdma's still reaching the kernel, the program going away with a SIGKILLed
//! daemon, loss recovery, a 2-queue veth (a socket per queue, flows arriving on both), and the own TCP's
//! connection bound. Needs root.
//!
//! Loss: `tc netem` cannot test the XDP path — AF_XDP transmits use direct xmit, bypassing the sender's
//! qdisc (and this kernel is built without netem anyway) — so the loss test uses the daemon's test-only
//! `--xdp-fault-drop-ppm`, with which the XDP program drops that many received soft-rdma segments per
//! million: both directions lose ~1 % and the userspace TCP stacks on both ends must retransmit and reassemble.
//! impaired_link.rs runs the XDP transport through a userspace netem substitute instead (loss, delay,
//! reordering on the wire between the namespaces).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use soft_rdma::client::{Adapter, Listener, MemoryRegion};
use soft_rdma::client::{CompletionOp, ReadLimits};
use soft_rdma_tests::ends::{
    self, End, assert_steered_as, listen_and_connect, listen_and_connect_ok, steering,
};
use soft_rdma_tests::ops::{assert_ok, completions, pattern, within, within_for};
use soft_rdma_tests::raw::{KernelSocket, kernel_tcp_sockets};
use soft_rdma_tests::{Daemon, Side, TestNet};

const PORT: u16 = 7400;

/// Prints the daemons' logs (their transport lines and warnings) if the test panics.
struct Dump(Vec<std::path::PathBuf>);

impl Drop for Dump {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for p in &self.0 {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            eprintln!("===== {}", p.display());
            for l in text.lines().filter(|l| {
                l.contains("transport") || l.contains("WARN") || l.contains("ERROR") || l.contains("INFO")
            }) {
                eprintln!("{l}");
            }
        }
    }
}

/// Field order = drop order: client ends, daemons (which log their counters when stopped), the log dump
/// on failure, and the namespaces (with the logs) last.
struct Pair {
    a: End,
    b: End,
    da: Daemon,
    db: Daemon,
    _dump: Dump,
    net: TestNet,
}

const LIMITS: ReadLimits = ReadLimits {
    inbound: 16,
    outbound: 16,
};

/// The sizes every test moves: 1 byte, one page, 1 MiB.
const SIZES: [usize; 3] = [1, 4096, 1 << 20];
const MAX: usize = (1 << 20) + 64;

/// Which daemons run in XDP mode.
#[derive(Clone, Copy)]
struct Modes {
    a_xdp: bool,
    b_xdp: bool,
}

fn args(net: &TestNet, side: Side, xdp: bool, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    if xdp {
        v.extend(["--xdp".to_string(), net.dev(side)]);
        v.extend(extra.iter().map(|s| s.to_string()));
    }
    v
}

fn spawn(net: &TestNet, side: Side, args: &[String]) -> Daemon {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let d = net.spawn_daemon(side, &refs).expect("daemon");
    if !args.is_empty() {
        assert!(
            d.log_text().contains("XDP transport ready"),
            "the daemon did not start the XDP transport:\n{}",
            d.log_text()
        );
    }
    d
}

async fn end(d: &Daemon) -> End {
    End::open(d.uds_path(), 4096, 1024).await
}

/// Two daemons (`modes`), a queue pair on each side, connected A → B at `remote(net)`. `before_accept`
/// runs on B's side (post its Receives there: data may arrive as soon as B accepts).
async fn pair<F>(
    tag: &str,
    modes: Modes,
    extra: &[&str],
    remote: impl Fn(&TestNet) -> SocketAddr,
    before_accept: F,
) -> Pair
where
    F: AsyncFnOnce(&End),
{
    let net = TestNet::new(tag).expect("netns pair");
    let da = spawn(&net, Side::A, &args(&net, Side::A, modes.a_xdp, extra));
    let db = spawn(&net, Side::B, &args(&net, Side::B, modes.b_xdp, extra));
    let (a, b) = (end(&da).await, end(&db).await);
    let remote = remote(&net);
    before_accept(&b).await;
    let before = (steering(&a.adapter).await, steering(&b.adapter).await);
    let (x, y) = within(
        "connect + accept",
        listen_and_connect(&a, &b, remote, (LIMITS, LIMITS), b""),
    )
    .await;
    x.unwrap_or_else(|e| panic!("connect: {e}\nA:\n{}\nB:\n{}", da.log_text(), db.log_text()));
    y.unwrap();
    // The connection went through each XDP daemon's program (frames redirected, MPA seen), not a fallback
    // to kernel TCP; and a kernel daemon has no program.
    assert_steered_as(&a.adapter, modes.a_xdp, "daemon A", before.0).await;
    assert_steered_as(&b.adapter, modes.b_xdp, "daemon B", before.1).await;
    let _dump = Dump(vec![net.dir().join("a.log"), net.dir().join("b.log")]);
    Pair {
        _dump,
        net,
        da,
        db,
        a,
        b,
    }
}

/// Posts one Receive per size on B (before accept).
fn post_receives(b: &End, mr: &MemoryRegion) {
    for (i, size) in SIZES.iter().enumerate() {
        b.qp.receive(i as u64, &[mr.sge(0, *size as u32)]).unwrap();
    }
}

/// A Sends each size to B's Receives; then RDMA-Writes each size into B and Reads it back. Byte for byte.
async fn exercise(p: &Pair, rmr: &MemoryRegion, seed: u8) {
    let smr = p.a.register(MAX).await;
    for (i, size) in SIZES.iter().enumerate() {
        let data = pattern(*size, seed + i as u8);
        smr.write_at(0, &data).unwrap();
        p.a.qp.send(100 + i as u64, &[smr.sge(0, *size as u32)]).unwrap();
        assert_ok(
            &completions(&p.a.cq, 1).await[0],
            100 + i as u64,
            CompletionOp::Send,
            *size as u32,
        );
        assert_ok(
            &completions(&p.b.cq, 1).await[0],
            i as u64,
            CompletionOp::Receive,
            *size as u32,
        );
        assert_eq!(rmr.to_vec(0, *size).unwrap(), data, "Send of {size} bytes");
    }
    write_read_back(p, seed.wrapping_add(50)).await;
}

/// RDMA Write of each size into B at offset 7, then RDMA Read back into a zeroed region of A.
async fn write_read_back(p: &Pair, seed: u8) {
    ends::write_read_back(&p.a, &p.b, &SIZES, seed).await;
}

/// The XDP program's counters, from the line an XDP daemon logs when it stops.
fn counters(log: &str) -> HashMap<String, u64> {
    let mut map = HashMap::new();
    let Some(line) = log.lines().rev().find(|l| l.contains("XDP transport stopping")) else {
        return map;
    };
    let mut rest = line;
    while let Some(start) = rest.find("(\"") {
        rest = &rest[start + 2..];
        let Some(q) = rest.find('"') else { break };
        let name = rest[..q].to_string();
        rest = &rest[q + 1..];
        let digits: String = rest
            .trim_start_matches([',', ' '])
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        if let Ok(v) = digits.parse() {
            map.insert(name, v);
        }
    }
    map
}

/// Stops `d` and returns its counters (the daemon logs them on the way out).
fn stop_and_count(d: &mut Daemon) -> HashMap<String, u64> {
    d.stop();
    let c = counters(&d.log_text());
    assert!(!c.is_empty(), "no counters in the log:\n{}", d.log_text());
    c
}

async fn send_receive_write_read(tag: &str, modes: Modes, seed: u8) {
    send_receive_write_read_with(tag, modes, &[], seed).await;
}

async fn send_receive_write_read_with(tag: &str, modes: Modes, extra: &[&str], seed: u8) {
    let rx = std::sync::Arc::new(tokio::sync::OnceCell::new());
    let rx2 = rx.clone();
    let mut p = pair(
        tag,
        modes,
        extra,
        |net| net.addr(Side::B, PORT),
        async move |b: &End| {
            let mr = b.register(MAX).await;
            post_receives(b, &mr);
            let _ = rx2.set(mr);
        },
    )
    .await;
    exercise(&p, rx.get().unwrap(), seed).await;
    // B's kernel holds the listener's reserved port; the connection is in it only when B runs on kernel TCP
    // (which shows that the check sees kernel connections when there are some).
    let in_kernel = kernel_connections(&p.net, Side::B, PORT);
    if modes.b_xdp {
        assert_eq!(in_kernel, vec![], "an XDP daemon's connection reached the kernel");
    } else {
        assert!(
            !in_kernel.is_empty(),
            "B on kernel TCP, its connection not in the kernel"
        );
    }
    // SYN cookies: B's program answers A's SYN when B runs the own TCP and A's side of the veth has an XDP
    // program (else the SYN-ACK would not reach A at once: stack/syn_cookies.rs), and never A's.
    let own_tcp = !extra.contains(&"smoltcp");
    let cookies = own_tcp && modes.a_xdp;
    for (xdp, listener, d) in [(modes.a_xdp, false, &mut p.da), (modes.b_xdp, true, &mut p.db)] {
        if xdp {
            let c = stop_and_count(d);
            assert!(c["redirected"] > 0, "nothing was steered: {c:?}");
            assert!(
                c["mpa_request"] + c["mpa_reply"] > 0,
                "no MPA handshake seen: {c:?}"
            );
            assert!(c["tagged_fpdu"] + c["untagged_fpdu"] > 0, "no FPDU seen: {c:?}");
            let answered = c["syn_cookie"];
            assert_eq!(
                answered > 0,
                listener && cookies,
                "SYNs answered by the program: {c:?}"
            );
            if own_tcp {
                // Each cookie connection had its SYN answered (a retransmitted SYN is answered again).
                let totals = own_tcp_totals(&d.log_text());
                let opened = totals["cookie_connections"];
                assert!(opened <= answered && (opened > 0) == (answered > 0), "{totals:?}");
                assert_eq!(totals["cookies_refused"], 0, "{totals:?}");
            }
        }
    }
    drop(p.net);
}

/// (a) Both daemons in XDP mode: Send/Receive and RDMA Write/Read of 1 B, 4 KiB and 1 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_xdp_send_write_read_byte_for_byte() {
    send_receive_write_read(
        "xboth",
        Modes {
            a_xdp: true,
            b_xdp: true,
        },
        1,
    )
    .await;
}

/// (a) Both daemons in XDP mode and spinning (`--xdp-busy-poll-us`, the default from 8 CPUs): the event
/// loop polls the hot queue pairs' rings without doorbells and sets their need-wakeup flags again when it
/// goes idle; nothing is lost or reordered either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spinning_daemons_send_write_read_byte_for_byte() {
    let spin: &[&str] = &["--xdp-busy-poll-us", "200"];
    send_receive_write_read_with(
        "xspin",
        Modes {
            a_xdp: true,
            b_xdp: true,
        },
        spin,
        7,
    )
    .await;
}

/// (a) Both daemons in XDP mode on smoltcp's socket (`--xdp-tcp smoltcp`; the other tests run the default,
/// soft-rdma's own TCP), and an XDP daemon on it against a kernel-TCP daemon either way round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoltcp_send_write_read_byte_for_byte() {
    let smoltcp: &[&str] = &["--xdp-tcp", "smoltcp"];
    for (tag, a_xdp, b_xdp) in [("xsmt", true, true), ("xsma", true, false), ("xsmb", false, true)] {
        send_receive_write_read_with(tag, Modes { a_xdp, b_xdp }, smoltcp, 4).await;
    }
}

/// The `own TCP totals` line a daemon on `--xdp-tcp own` logs when it stops: field → value.
fn own_tcp_totals(log: &str) -> HashMap<String, u64> {
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("own TCP totals"))
        .unwrap_or("");
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect()
}

/// Issue 20, tail losses: 200 one-segment RDMA Reads (request A → B, response B → A), each waited for,
/// with the XDP program dropping 5 % of the segments each daemon receives. Every lost request or response
/// is the last segment of its flight: the tail-loss probe repairs it, not the retransmission timeout
/// (smoltcp's is 1 s at least). Counted from both daemons' own-TCP counters, never timed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_tcp_repairs_tail_losses_by_probe_not_timeout() {
    let extra: &[&str] = &["--xdp-tcp", "own", "--xdp-fault-drop-ppm", "50000"];
    let target = std::sync::Arc::new(tokio::sync::OnceCell::new());
    let target2 = target.clone();
    let mut p = pair(
        "xtail",
        Modes {
            a_xdp: true,
            b_xdp: true,
        },
        extra,
        |net| net.addr(Side::B, PORT),
        async move |b: &End| {
            let _ = target2.set(b.register(4096).await);
        },
    )
    .await;
    let target = target.get().unwrap();
    let data = pattern(1000, 9);
    target.write_at(0, &data).unwrap();
    let local = p.a.register(4096).await;
    for i in 0..200u64 {
        p.a.qp.read(i, local.sge(0, 1000), target.remote(0)).unwrap();
        assert_ok(&completions(&p.a.cq, 1).await[0], i, CompletionOp::Read, 1000);
    }
    assert_eq!(local.to_vec(0, 1000).unwrap(), data);
    let mut total = HashMap::new();
    for d in [&mut p.da, &mut p.db] {
        d.stop();
        for (k, v) in own_tcp_totals(&d.log_text()) {
            *total.entry(k).or_insert(0) += v;
        }
    }
    let (rto, tlp) = (total["rto_events"], total["tlp_probes"]);
    assert!(tlp > 0, "no tail loss was probed: {total:?}");
    // A timeout only when a probe is lost too (5 %): a few at most.
    assert!(rto * 2 <= tlp, "tail losses cost timeouts: {total:?}");
    eprintln!("tail losses over the XDP transport, own TCP: {total:?}");
    drop(p.net);
}

/// (a) Both in XDP mode over IPv6 (the XDP program's IPv6 path and its IPv6 SYN cookies, Neighbor
/// Advertisements for smoltcp).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_xdp_ipv6_write_read() {
    let mut p = pair(
        "xv6",
        Modes {
            a_xdp: true,
            b_xdp: true,
        },
        &[],
        |net| SocketAddr::new(net.ipv6(Side::B).into(), PORT),
        async |_: &End| {},
    )
    .await;
    write_read_back(&p, 9).await;
    // B's program answered the IPv6 SYN with a cookie, and the ACK opened the connection.
    let c = stop_and_count(&mut p.db);
    assert!(c["syn_cookie"] >= 1, "{c:?}");
    let totals = own_tcp_totals(&p.db.log_text());
    assert_eq!(totals["cookie_connections"], 1, "{totals:?}");
    drop(p.net);
}

/// (b) A in XDP mode, B on kernel TCP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xdp_client_kernel_server() {
    send_receive_write_read(
        "xmxa",
        Modes {
            a_xdp: true,
            b_xdp: false,
        },
        20,
    )
    .await;
}

/// (b) A on kernel TCP, B in XDP mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_client_xdp_server() {
    send_receive_write_read(
        "xmxb",
        Modes {
            a_xdp: false,
            b_xdp: true,
        },
        40,
    )
    .await;
}

/// A TCP echo server at `addr` in `server`'s namespace serving one client, and a client in the other
/// namespace sending `len` bytes and reading them back.
fn tcp_echo(net: &TestNet, server: Side, addr: SocketAddr, len: usize) {
    let client = if server == Side::A { Side::B } else { Side::A };
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let srv = net.spawn_in_ns(server, move || {
        let l = TcpListener::bind(addr).expect("bind echo server");
        ready_tx.send(()).unwrap();
        let (mut s, _) = l.accept().expect("accept");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => s.write_all(&buf[..n]).expect("echo"),
                Err(e) => panic!("echo server read: {e}"),
            }
        }
    });
    ready_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("echo server up");
    let data = pattern(len, 77);
    let got = net.in_ns(client, move || {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).expect("connect to echo");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut r = s.try_clone().unwrap();
        let reader = std::thread::spawn(move || {
            let mut got = vec![0u8; len];
            r.read_exact(&mut got).expect("read echo");
            got
        });
        s.write_all(&data).expect("write");
        let got = reader.join().unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        (got, data)
    });
    assert!(got.0 == got.1, "TCP echo through {addr} corrupted");
    srv.join().expect("echo server");
}

/// A UDP datagram from the other namespace to `addr`, echoed back.
fn udp_echo(net: &TestNet, server: Side, addr: SocketAddr) {
    let client = if server == Side::A { Side::B } else { Side::A };
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let srv = net.spawn_in_ns(server, move || {
        let s = UdpSocket::bind(addr).expect("bind UDP");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        ready_tx.send(()).unwrap();
        let mut buf = [0u8; 2048];
        let (n, from) = s.recv_from(&mut buf).expect("UDP datagram");
        s.send_to(&buf[..n], from).expect("UDP echo");
    });
    ready_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("UDP server up");
    let local = if addr.is_ipv4() {
        net.addr(client, 0)
    } else {
        SocketAddr::new(net.ipv6(client).into(), 0)
    };
    let echoed = net.in_ns(client, move || {
        let s = UdpSocket::bind(local).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.send_to(b"not soft-rdma's", addr).unwrap();
        let mut buf = [0u8; 2048];
        let n = s.recv(&mut buf).expect("UDP echo back");
        buf[..n].to_vec()
    });
    assert_eq!(echoed, b"not soft-rdma's");
    srv.join().expect("UDP server");
}

/// (c) With both daemons in XDP mode and a soft-rdma connection up, ordinary TCP (both directions, IPv4
/// and IPv6) and UDP between the namespaces on other ports still go through the kernel; and a kernel socket
/// on a port soft-rdma holds is not reachable from the wire (the port is soft-rdma's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_traffic_reaches_the_kernel() {
    let mut p = pair(
        "xoth",
        Modes {
            a_xdp: true,
            b_xdp: true,
        },
        &[],
        |net| net.addr(Side::B, PORT),
        async |_: &End| {},
    )
    .await;
    let net = &p.net;
    tcp_echo(net, Side::B, net.addr(Side::B, 9100), 300_000);
    tcp_echo(net, Side::A, net.addr(Side::A, 9101), 300_000);
    tcp_echo(
        net,
        Side::B,
        SocketAddr::new(net.ipv6(Side::B).into(), 9102),
        100_000,
    );
    udp_echo(net, Side::B, net.addr(Side::B, 9200));
    udp_echo(net, Side::A, net.addr(Side::A, 9201));
    udp_echo(net, Side::B, SocketAddr::new(net.ipv6(Side::B).into(), 9202));
    // soft-rdma still works next to it.
    write_read_back(&p, 60).await;
    // A port soft-rdma listens on: B's kernel has a socket listening on it (the reservation, listening for
    // this host's own connections), yet a plain TCP client on the wire reaches soft-rdma's stack, never that
    // socket: B's kernel has no connection on the port. (The soft-rdma connection's port, too.)
    let listener = p.b.adapter.create_listener().await.unwrap();
    let held = listener.listen(net.addr(Side::B, PORT + 1), 0).await.unwrap();
    let sockets = kernel_tcp_sockets(net, Side::B).unwrap();
    assert!(
        sockets.iter().any(|k| k.state == "LISTEN" && k.local == held),
        "no kernel socket on the held port to test against: {sockets:?}"
    );
    let client = net.in_ns(Side::A, move || {
        TcpStream::connect(held).expect("connect to the held port")
    });
    let a_end = client.local_addr().unwrap();
    for port in [PORT, PORT + 1] {
        assert_eq!(
            kernel_connections(net, Side::B, port),
            vec![],
            "a connection from the wire ({a_end}) reached B's kernel socket on port {port}"
        );
    }
    drop((client, listener));
    for d in [&mut p.da, &mut p.db] {
        let c = stop_and_count(d);
        assert!(c["passed"] > 0, "nothing passed to the kernel: {c:?}");
        assert!(c["redirected"] > 0, "nothing steered: {c:?}");
    }
    drop(p.net);
}

/// `side`'s kernel TCP sockets on local port `port` other than listening ones: connections the kernel has.
fn kernel_connections(net: &TestNet, side: Side, port: u16) -> Vec<KernelSocket> {
    kernel_tcp_sockets(net, side)
        .unwrap()
        .into_iter()
        .filter(|k| k.local.port() == port && k.state != "LISTEN")
        .collect()
}

fn xdp_attached(net: &TestNet, side: Side) -> bool {
    let out = std::process::Command::new("ip")
        .args(["-n", &net.ns(side), "link", "show", "dev", &net.dev(side)])
        .output()
        .expect("ip link show");
    let text = String::from_utf8_lossy(&out.stdout);
    text.contains("prog/xdp") || text.contains(" xdp")
}

/// (d) A SIGKILLed XDP daemon leaves no program behind (BPF link: detached with its last descriptor), and
/// a new daemon attaches again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_detaches_the_program() {
    let net = TestNet::new("xkil").expect("netns pair");
    let xdp = args(&net, Side::A, true, &[]);
    let mut d = spawn(&net, Side::A, &xdp);
    assert!(
        d.log_text().contains("bpf_link"),
        "not attached with a BPF link:\n{}",
        d.log_text()
    );
    assert!(xdp_attached(&net, Side::A), "no XDP program on the interface");
    d.kill();
    let deadline = Instant::now() + Duration::from_secs(10);
    while xdp_attached(&net, Side::A) {
        assert!(
            Instant::now() < deadline,
            "the XDP program is still attached 10 s after SIGKILL"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The interface is usable again, by the kernel and by a new daemon.
    tcp_echo(&net, Side::A, net.addr(Side::A, 9300), 10_000);
    let d2 = spawn(&net, Side::A, &xdp);
    assert!(xdp_attached(&net, Side::A));
    let db = spawn(&net, Side::B, &[]);
    let (a, b) = (end(&d2).await, end(&db).await);
    let remote = net.addr(Side::B, PORT);
    listen_and_connect_ok(&a, &b, remote, (LIMITS, LIMITS)).await;
    drop(net);
}

/// (e) ~1 % of soft-rdma's segments lost in each direction (see the module doc): 1 MiB Write and Read back
/// still verify.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lossy_link_data_still_verifies() {
    let mut p = pair(
        "xlos",
        Modes {
            a_xdp: true,
            b_xdp: true,
        },
        &["--xdp-fault-drop-ppm", "10000"],
        |net| net.addr(Side::B, PORT),
        async |_: &End| {},
    )
    .await;
    let target = p.b.register(MAX).await;
    let local = p.a.register(MAX).await;
    let back = p.a.register(MAX).await;
    for round in 0..3u8 {
        let data = pattern(1 << 20, 90 + round);
        local.write_at(0, &data).unwrap();
        p.a.qp
            .write(round as u64, &[local.sge(0, 1 << 20)], target.remote(0))
            .unwrap();
        assert_ok(
            &completions(&p.a.cq, 1).await[0],
            round as u64,
            CompletionOp::Write,
            1 << 20,
        );
        back.fill(0, 1 << 20, 0).unwrap();
        p.a.qp
            .read(100 + round as u64, back.sge(0, 1 << 20), target.remote(0))
            .unwrap();
        assert_ok(
            &completions(&p.a.cq, 1).await[0],
            100 + round as u64,
            CompletionOp::Read,
            1 << 20,
        );
        assert!(
            back.to_vec(0, 1 << 20).unwrap() == data,
            "round {round}: Read back differs"
        );
        assert!(
            target.to_vec(0, 1 << 20).unwrap() == data,
            "round {round}: Write differs"
        );
    }
    let dropped: u64 = [&mut p.da, &mut p.db]
        .into_iter()
        .map(|d| stop_and_count(d)["fault_dropped"])
        .sum();
    assert!(dropped > 0, "no segment was dropped: the test did not test loss");
    drop(p.net);
}

/// Connections between the host's own addresses never cross the interface (they go through `lo`): an XDP
/// daemon runs them over kernel TCP itself. Here one daemon listens on its interface address and connects
/// to it; data still verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_connection_runs_over_kernel_tcp() {
    let net = TestNet::new("xloc").expect("netns pair");
    let d = spawn(&net, Side::A, &args(&net, Side::A, true, &[]));
    let _dump = Dump(vec![net.dir().join("a.log")]);
    let (a, b) = (end(&d).await, end(&d).await);
    let remote = net.addr(Side::A, PORT);
    listen_and_connect_ok(&a, &b, remote, (LIMITS, LIMITS)).await;
    let target = b.register(MAX).await;
    let local = a.register(MAX).await;
    let data = pattern(1 << 20, 33);
    local.write_at(0, &data).unwrap();
    a.qp.write(1, &[local.sge(0, 1 << 20)], target.remote(0)).unwrap();
    assert_ok(&completions(&a.cq, 1).await[0], 1, CompletionOp::Write, 1 << 20);
    // The Read is ordered after the Write (RFC 5040 §5.5): when it completes, the Write was placed.
    let back = a.register(MAX).await;
    a.qp.read(2, back.sge(0, 1 << 20), target.remote(0)).unwrap();
    assert_ok(&completions(&a.cq, 1).await[0], 2, CompletionOp::Read, 1 << 20);
    assert!(
        back.to_vec(0, 1 << 20).unwrap() == data,
        "local Read back differs"
    );
    assert!(target.to_vec(0, 1 << 20).unwrap() == data, "local Write differs");
    drop((a, b));
    let mut d = d;
    let c = stop_and_count(&mut d);
    assert_eq!(c["redirected"], 0, "a local connection went through XDP: {c:?}");
    drop(net);
}

/// A Listen is in place when the client hears Done: a plain TCP connect right after it is accepted, every
/// time (the port is steered to the userspace stack as soon as it is reserved, so a SYN arriving before its
/// listening sockets exist would be reset).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_right_after_listen_is_accepted() {
    let net = TestNet::new("xlis").expect("netns pair");
    let _da = spawn(&net, Side::A, &args(&net, Side::A, true, &[]));
    let db = spawn(&net, Side::B, &args(&net, Side::B, true, &[]));
    let _dump = Dump(vec![net.dir().join("b.log")]);
    let b = end(&db).await;
    for i in 0..30u16 {
        let l = b.adapter.create_listener().await.unwrap();
        let bound = l.listen(net.addr(Side::B, 7100 + i), 0).await.unwrap();
        let r = net.in_ns(Side::A, move || {
            TcpStream::connect(bound).map(|_| ()).map_err(|e| e.to_string())
        });
        if let Err(e) = r {
            panic!("connect {i} right after listen: {e}");
        }
    }
    drop((b, db, net));
}

/// B in XDP mode with `extra` and a listener on its address and `PORT`: the daemon, its end, the listener
/// and the address bound.
async fn xdp_listener(net: &TestNet, extra: &[&str]) -> (Daemon, End, Listener, SocketAddr) {
    let db = spawn(net, Side::B, &args(net, Side::B, true, extra));
    let b = end(&db).await;
    let l = b.adapter.create_listener().await.unwrap();
    let bound = l.listen(net.addr(Side::B, PORT), 0).await.unwrap();
    (db, b, l, bound)
}

/// `n` kernel TCP connects to `to`, one after another (run in A's namespace): the streams that connected
/// (held open) and each connect's outcome.
fn kernel_connects(to: SocketAddr, n: usize) -> (Vec<TcpStream>, Vec<Result<(), std::io::ErrorKind>>) {
    let mut held = Vec::new();
    let mut out = Vec::new();
    for _ in 0..n {
        match TcpStream::connect_timeout(&to, Duration::from_secs(5)) {
            Ok(s) => {
                held.push(s);
                out.push(Ok(()));
            }
            Err(e) => out.push(Err(e.kind())),
        }
    }
    (held, out)
}

/// The own TCP's connection bound (`--max-tcp-connections`): with two connections held, a third SYN is
/// answered with a reset (the connect is refused at once, not left to time out), counted in `status`
/// beside the bound and the buffer memory held; the connections held are not disturbed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_tcp_connection_bound_resets_the_next_syn() {
    let net = TestNet::new("xcap").expect("netns pair");
    let extra = [
        "--xdp-tcp",
        "own",
        "--max-tcp-connections",
        "2",
        "--max-tcp-buffer-bytes",
        "64M",
    ];
    let _dump = Dump(vec![net.dir().join("b.log")]);
    let (db, b, l, bound) = xdp_listener(&net, &extra).await;
    let (held, out) = net.in_ns(Side::A, move || kernel_connects(bound, 3));
    assert_eq!(
        out,
        vec![Ok(()), Ok(()), Err(std::io::ErrorKind::ConnectionRefused)],
        "the third connect is refused by a reset"
    );
    let status = b.adapter.status().await.unwrap();
    let t = status.transport.expect("transport status");
    let get = |name: &str| t.counters.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
    assert_eq!(get("tcp_refused_syns"), Some(1), "{:?}", t.counters);
    assert_eq!(get("tcp_connections"), Some(2), "{:?}", t.counters);
    assert_eq!(get("tcp_max_connections"), Some(2));
    assert_eq!(get("tcp_max_buffer_bytes"), Some(64 << 20));
    assert!(get("tcp_buffer_bytes").is_some_and(|v| v <= 64 << 20));
    assert!(
        db.log_text().contains("own TCP connection bound"),
        "the refusal is logged:\n{}",
        db.log_text()
    );
    drop(held);
    drop((l, b, db, net));
}

/// The same bound with SYN cookies (A's side of the veth runs an XDP program, so B's program answers the
/// SYNs): the third SYN is answered too (the table keeps nothing for a SYN), and the handshake's ACK past
/// the bound is reset, so the third connection fails at once (its connect or its first read), not by a
/// timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_tcp_connection_bound_resets_a_syn_cookies_ack() {
    use std::io::{Read, Write};
    let net = TestNet::new("xcapc").expect("netns pair");
    let extra = ["--max-tcp-connections", "2"];
    let da = spawn(&net, Side::A, &args(&net, Side::A, true, &[]));
    let _dump = Dump(vec![net.dir().join("a.log"), net.dir().join("b.log")]);
    let (mut db, b, l, bound) = xdp_listener(&net, &extra).await;
    let (held, (out, third)) = net.in_ns(Side::A, move || {
        let (held, out) = kernel_connects(bound, 2);
        // The reset may reach the third connect before connect(2) returns (then it fails), or after (then
        // its first read does).
        let third = match TcpStream::connect_timeout(&bound, Duration::from_secs(5)) {
            Err(e) => Err(e.kind()),
            Ok(mut s) => {
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let _ = s.write_all(b"x");
                s.read(&mut [0u8; 1]).map(drop).map_err(|e| e.kind())
            }
        };
        (held, (out, third))
    });
    assert_eq!(out, vec![Ok(()), Ok(())]);
    assert!(
        matches!(
            third,
            Err(std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionRefused)
        ),
        "the third connection is reset: {third:?}"
    );
    let status = b.adapter.status().await.unwrap();
    let t = status.transport.expect("transport status");
    let get = |name: &str| t.counters.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
    // The ACK, and any segment the client sent before the reset reached it, each refused.
    assert!(
        get("tcp_refused_syns").is_some_and(|n| n >= 1),
        "{:?}",
        t.counters
    );
    assert_eq!(get("tcp_connections"), Some(2), "{:?}", t.counters);
    assert_eq!(get("syn_cookie"), Some(3), "{:?}", t.counters);
    drop(held);
    drop((l, b));
    let totals = {
        db.stop();
        own_tcp_totals(&db.log_text())
    };
    assert_eq!(totals["cookie_connections"], 2, "{totals:?}");
    drop((da, net));
}

/// The same bound on smoltcp's socket (`--xdp-tcp smoltcp`), whose sockets take their whole buffers (384
/// KiB) when made: with `--max-tcp-connections 3` a listener gets three listening slots; three kernel
/// connects are accepted and a fourth SYN finds no slot and is reset; a Connect from B then fails with
/// INSUFFICIENT_RESOURCES. `status` shows the sockets and the memory charged; the connections held are not
/// disturbed. With one connection gone, a connect is accepted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoltcp_connection_bound_resets_the_next_syn_and_fails_a_connect() {
    const PER_SOCKET: u64 = 384 << 10;
    let net = TestNet::new("xcaps").expect("netns pair");
    let extra = ["--xdp-tcp", "smoltcp", "--max-tcp-connections", "3"];
    let _dump = Dump(vec![net.dir().join("b.log")]);
    let (db, b, l, bound) = xdp_listener(&net, &extra).await;
    let (held, out) = net.in_ns(Side::A, move || kernel_connects(bound, 4));
    assert_eq!(
        out,
        vec![Ok(()), Ok(()), Ok(()), Err(std::io::ErrorKind::ConnectionRefused)],
        "the fourth connect is refused by a reset"
    );
    let counters = || async {
        let status = b.adapter.status().await.unwrap();
        status.transport.expect("transport status").counters
    };
    let c = counters().await;
    let get = |c: &Vec<(String, u64)>, name: &str| c.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
    assert_eq!(get(&c, "tcp_connections"), Some(3), "{c:?}");
    assert_eq!(get(&c, "tcp_max_connections"), Some(3));
    assert_eq!(get(&c, "tcp_buffer_bytes"), Some(3 * PER_SOCKET), "{c:?}");
    // An active open from B, past the bound: refused at once, nothing else disturbed.
    let conn = b.adapter.create_connector().await.unwrap();
    let e = conn
        .connect(net.addr(Side::A, PORT), ReadLimits::default(), b"")
        .await
        .expect_err("a connect past the bound");
    assert_eq!(e.status, soft_rdma::NdStatus::InsufficientResources, "{e}");
    let c = counters().await;
    assert_eq!(get(&c, "tcp_refused_connects"), Some(1), "{c:?}");
    assert_eq!(get(&c, "tcp_connections"), Some(3), "{c:?}");
    assert!(
        db.log_text().contains("smoltcp connection bound reached"),
        "the refusals are logged:\n{}",
        db.log_text()
    );
    // One connection goes (A closes it; B's end, still waiting for its MPA Request, closes on A's FIN):
    // its socket and memory come back, the listener makes a slot again, and a connect is accepted. The
    // sockets never pass the bound on the way.
    let mut held = held;
    drop(held.pop());
    let again = within_for(
        Duration::from_secs(60),
        "a connect accepted after one closed",
        async {
            loop {
                let (again, out) = net.in_ns(Side::A, move || kernel_connects(bound, 1));
                if out == [Ok(())] {
                    return again;
                }
                let c = counters().await;
                assert!(get(&c, "tcp_connections").is_some_and(|n| n <= 3), "{c:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        },
    )
    .await;
    let c = counters().await;
    assert_eq!(get(&c, "tcp_connections"), Some(3), "two held, one new: {c:?}");
    drop((held, again));
    drop((conn, l, b, db, net));
}

/// Connections [`two_queue_veth_socket_per_queue`] opens: the kernel picks each one's TX queue (so B's RX
/// queue) by a per-socket hash, so all 16 on one queue would be a 1-in-32,768 chance.
const MQ_CONNECTIONS: usize = 16;
const MQ_BYTES: usize = 256 << 10;

/// (f) Both veths with 2 RX/TX queues; A on kernel TCP (whose flows the kernel spreads over both queues),
/// B in XDP mode: B binds one AF_XDP socket per RX queue, `status` lists both, [`MQ_CONNECTIONS`]
/// connections each verify a Send and an RDMA Write/Read, and both queues carried soft-rdma frames with
/// none dropped by the kernel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_queue_veth_socket_per_queue() {
    let net = TestNet::new_multiqueue("xmq", 2).expect("2-queue netns pair");
    let _dump = Dump(vec![net.dir().join("a.log"), net.dir().join("b.log")]);
    let da = spawn(&net, Side::A, &args(&net, Side::A, false, &[]));
    let db = spawn(&net, Side::B, &args(&net, Side::B, true, &[]));
    assert!(
        db.log_text().contains("rx_queues=2"),
        "B did not see 2 RX queues:\n{}",
        db.log_text()
    );
    let (a, b) = (
        Adapter::open(da.uds_path().to_owned()).await.unwrap(),
        Adapter::open(db.uds_path().to_owned()).await.unwrap(),
    );
    let listener = b.create_listener().await.unwrap();
    let remote = net.addr(Side::B, PORT);
    listener.listen(remote, 0).await.unwrap();
    let mut conns = Vec::new();
    for i in 0..MQ_CONNECTIONS {
        let (ea, eb) = (End::on(&a, 64, 16).await, End::on(&b, 64, 16).await);
        let brx = eb.register(MQ_BYTES).await;
        eb.qp.receive(1, &[brx.sge(0, MQ_BYTES as u32)]).unwrap();
        let (x, y) = within(
            &format!("connection {i}"),
            ends::connect_ends(&ea, &eb, &listener, remote, (LIMITS, LIMITS), b""),
        )
        .await;
        x.unwrap_or_else(|e| panic!("connection {i}: {e}"));
        y.unwrap();
        conns.push((ea, eb, brx));
    }
    for (i, (ea, eb, brx)) in conns.iter().enumerate() {
        let seed = 100 + i as u8;
        let data = pattern(MQ_BYTES, seed);
        let src = ea.register(MQ_BYTES).await;
        src.write_at(0, &data).unwrap();
        ea.qp.send(10, &[src.sge(0, MQ_BYTES as u32)]).unwrap();
        assert_ok(
            &completions(&ea.cq, 1).await[0],
            10,
            CompletionOp::Send,
            MQ_BYTES as u32,
        );
        assert_ok(
            &completions(&eb.cq, 1).await[0],
            1,
            CompletionOp::Receive,
            MQ_BYTES as u32,
        );
        assert!(brx.to_vec(0, MQ_BYTES).unwrap() == data, "connection {i}: Send");
        ends::write_read_back(ea, eb, &[MQ_BYTES], seed).await;
    }
    // The counters of the kernel are copied every 250 ms: let one copy happen after the traffic.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let status = b.status().await.unwrap();
    let t = status.transport.expect("B reports its transport");
    let queues: Vec<u32> = t.queues.iter().map(|q| q.queue).collect();
    assert_eq!(queues, [0, 1], "one AF_XDP socket per RX queue: {t:?}");
    for q in &t.queues {
        assert!(
            q.rx_frames > 0,
            "queue {} received nothing over {MQ_CONNECTIONS} connections: {t:?}",
            q.queue
        );
        assert_eq!(
            (q.rx_dropped, q.invalid_descs),
            (0, 0),
            "the kernel dropped frames: {q:?}"
        );
    }
    println!("B's AF_XDP queues: {:?}", t.queues);
    drop(conns);
    drop(net);
}
