//! The shapes the connection tests share: a queue-pair [`End`] on one daemon (adapter, completion queue,
//! queue pair, connector), the connect of two ends, the connect of two bare connectors, and the check that a
//! connection of an XDP-mode daemon really went through the XDP program ([`assert_steered`]). One copy here
//! instead of one per suite.

use std::net::SocketAddr;
use std::path::Path;

use soft_rdma::client::{Access, CompletionOp, ConnectionRequest, ReadLimits};
use soft_rdma::client::{Adapter, CompletionQueue, Connector, Listener, MemoryRegion, QueuePair};

use soft_rdma::status::StatusReport;

use crate::ops::{assert_ok, completions, pattern, within};
use crate::{Daemon, Side, TestNet, TestTransport, test_transport};

/// Two daemons in a fresh namespace pair and a session on each: what the connection-management suites start
/// from. Field order is drop order: the namespaces go last.
pub struct Daemons {
    pub a: Adapter,
    pub b: Adapter,
    pub da: Daemon,
    pub db: Daemon,
    pub net: TestNet,
}

/// Which daemons of a pair run the XDP transport (`--xdp` on their veth, the own TCP unless
/// `$SOFT_RDMA_TEST_XDP_TCP` says otherwise); the others run over kernel TCP. For suites that run a test under
/// several pairings whatever `$SOFT_RDMA_TEST_TRANSPORT` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transports {
    pub a_xdp: bool,
    pub b_xdp: bool,
}

impl Transports {
    /// Both daemons over kernel TCP.
    pub const KERNEL: Transports = Transports {
        a_xdp: false,
        b_xdp: false,
    };
    /// Both daemons over XDP.
    pub const XDP: Transports = Transports {
        a_xdp: true,
        b_xdp: true,
    };
    /// A over XDP, B over kernel TCP.
    pub const MIXED: Transports = Transports {
        a_xdp: true,
        b_xdp: false,
    };

    /// Whether `side`'s daemon runs the XDP transport.
    pub fn xdp(self, side: Side) -> bool {
        match side {
            Side::A => self.a_xdp,
            Side::B => self.b_xdp,
        }
    }

    /// Starts `side`'s daemon of `net` (again) under this pairing, with `extra` arguments.
    pub fn spawn(self, net: &TestNet, side: Side, extra: &[&str]) -> Daemon {
        net.spawn_daemon_over(side, self.xdp(side), extra)
            .unwrap_or_else(|e| panic!("daemon {side:?}: {e:#}"))
    }

    /// Panics unless each daemon (a session on A's and one on B's) runs the transport this pairing gives it
    /// and, over XDP, its connections so far went through the XDP program (frames redirected, MPA frames
    /// seen): a silent fallback to kernel TCP fails here. Call it once a connection of each daemon crossed
    /// the wire.
    pub async fn assert_in_force(self, (a, b): (&Adapter, &Adapter)) {
        for (adapter, side) in [(a, Side::A), (b, Side::B)] {
            let before = self.xdp(side).then(Steering::default);
            assert_steered_as(adapter, self.xdp(side), &format!("daemon {side:?}"), before).await;
        }
    }
}

impl Daemons {
    /// `tag` names the namespaces; `a_args` and `b_args` go to each daemon. The transports follow
    /// `$SOFT_RDMA_TEST_TRANSPORT` ([`TestNet::spawn_daemon`]).
    pub async fn start(tag: &str, a_args: &[&str], b_args: &[&str]) -> Daemons {
        let net = TestNet::new(tag).expect("netns pair");
        let da = net.spawn_daemon(Side::A, a_args).expect("daemon A");
        let db = net.spawn_daemon(Side::B, b_args).expect("daemon B");
        Self::open(net, da, db).await
    }

    /// [`Self::start`] with the transports `t` gives each daemon.
    pub async fn start_over(tag: &str, t: Transports, a_args: &[&str], b_args: &[&str]) -> Daemons {
        let net = TestNet::new(tag).expect("netns pair");
        let da = t.spawn(&net, Side::A, a_args);
        let db = t.spawn(&net, Side::B, b_args);
        Self::open(net, da, db).await
    }

    /// A session on each of the two daemons.
    async fn open(net: TestNet, da: Daemon, db: Daemon) -> Daemons {
        let a = Adapter::open(da.uds_path()).await.expect("adapter A");
        let b = Adapter::open(db.uds_path()).await.expect("adapter B");
        Daemons { a, b, da, db, net }
    }

    /// A listener of B's daemon at B's address and `port`, with the default backlog, and where it listens.
    pub async fn listen_b(&self, port: u16) -> (Listener, SocketAddr) {
        let listener = self.b.create_listener().await.unwrap();
        let bound = listener.listen(self.net.addr(Side::B, port), 0).await.unwrap();
        (listener, bound)
    }

    /// A new connector on each daemon: (A's, B's).
    pub async fn connectors(&self) -> (Connector, Connector) {
        connectors((&self.a, &self.b)).await
    }
}

/// A new connector on each of two sessions: (`a`'s, `b`'s).
pub async fn connectors((a, b): (&Adapter, &Adapter)) -> (Connector, Connector) {
    (
        a.create_connector().await.unwrap(),
        b.create_connector().await.unwrap(),
    )
}

/// A queue pair and its connector on one daemon.
pub struct End {
    pub adapter: Adapter,
    pub cq: CompletionQueue,
    pub qp: QueuePair,
    pub connector: Connector,
}

impl End {
    /// Opens a session on the daemon at `uds`: a completion queue of `cq_entries` (both queues' completions)
    /// and a queue pair `depth` deep each way.
    pub async fn open(uds: &Path, cq_entries: u32, depth: u32) -> End {
        End::on(
            &Adapter::open(uds.to_owned()).await.expect("adapter"),
            cq_entries,
            depth,
        )
        .await
    }

    /// [`Self::open`] on a session the test already has.
    pub async fn on(adapter: &Adapter, cq_entries: u32, depth: u32) -> End {
        let adapter = adapter.clone();
        let cq = adapter.create_completion_queue(cq_entries).await.unwrap();
        let qp = adapter.create_queue_pair(&cq, &cq, depth, depth).await.unwrap();
        let connector = adapter.create_connector().await.unwrap();
        End {
            adapter,
            cq,
            qp,
            connector,
        }
    }

    /// A region of `len` bytes the peer may read and write.
    pub async fn register(&self, len: usize) -> MemoryRegion {
        self.adapter
            .register_memory(
                len,
                Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
            )
            .await
            .unwrap()
    }
}

/// `a` connects its queue pair to `remote`, where `listener` (on `b`'s daemon) listens; `b` accepts the offer
/// with its queue pair. Both sides' results (bound them with the suite's `within`).
pub async fn connect_ends(
    a: &End,
    b: &End,
    listener: &Listener,
    remote: SocketAddr,
    limits: (ReadLimits, ReadLimits),
    private_data: &[u8],
) -> (soft_rdma::Result<()>, soft_rdma::Result<()>) {
    let (x, y) = connect(
        (&a.connector, &b.connector),
        Some((&a.qp, &b.qp)),
        listener,
        remote,
        limits,
        (private_data, b""),
    )
    .await;
    (x, y.map(drop))
}

/// [`connect_ends`] with a listener of `b`'s made for it at `remote` (closed once the connection is up: the
/// connection outlives it).
pub async fn listen_and_connect(
    a: &End,
    b: &End,
    remote: SocketAddr,
    limits: (ReadLimits, ReadLimits),
    private_data: &[u8],
) -> (soft_rdma::Result<()>, soft_rdma::Result<()>) {
    let listener = b.adapter.create_listener().await.unwrap();
    listener.listen(remote, 0).await.unwrap();
    connect_ends(a, b, &listener, remote, limits, private_data).await
}

/// [`listen_and_connect`] without private data, bounded by [`within`]; panics unless both sides connected.
pub async fn listen_and_connect_ok(a: &End, b: &End, remote: SocketAddr, limits: (ReadLimits, ReadLimits)) {
    let (x, y) = within("connect + accept", listen_and_connect(a, b, remote, limits, b"")).await;
    x.unwrap();
    y.unwrap();
}

/// Connector `ca` connects to `remote` with `hello`, and connector `cb` takes the offer from `listener` (on
/// its daemon) and accepts it with `welcome`. Both sides' results, B's with the offer it accepted (bound them
/// with the suite's `within`).
pub async fn connect_connectors(
    connectors: (&Connector, &Connector),
    listener: &Listener,
    remote: SocketAddr,
    limits: (ReadLimits, ReadLimits),
    private_data: (&[u8], &[u8]),
) -> (soft_rdma::Result<()>, soft_rdma::Result<ConnectionRequest>) {
    connect(connectors, None, listener, remote, limits, private_data).await
}

/// [`connect_connectors`], with queue pairs `qps` (A's, B's) on the connection when given.
async fn connect(
    (ca, cb): (&Connector, &Connector),
    qps: Option<(&QueuePair, &QueuePair)>,
    listener: &Listener,
    remote: SocketAddr,
    limits: (ReadLimits, ReadLimits),
    (hello, welcome): (&[u8], &[u8]),
) -> (soft_rdma::Result<()>, soft_rdma::Result<ConnectionRequest>) {
    tokio::join!(
        async {
            match qps {
                Some((qa, _)) => ca.connect_qp(qa, remote, limits.0, hello).await?,
                None => ca.connect(remote, limits.0, hello).await?,
            }
            ca.complete_connect().await
        },
        async {
            let offer = listener.get_connection_request(cb).await?;
            match qps {
                Some((_, qb)) => cb.accept_qp(qb, limits.1, welcome).await?,
                None => cb.accept(limits.1, welcome).await?,
            }
            Ok(offer)
        }
    )
}

/// A new connector on `a` connects to `remote` (with `hello`) and a new connector on `b` accepts it from
/// `listener` (with `welcome`); returns (active, passive), both connected. Panics on any failure.
pub async fn connect_pair(
    (a, b): (&Adapter, &Adapter),
    remote: SocketAddr,
    listener: &Listener,
    limits: (ReadLimits, ReadLimits),
) -> (Connector, Connector) {
    let (ca, cb) = connectors((a, b)).await;
    let (x, y) = within(
        "connect + accept",
        connect_connectors((&ca, &cb), listener, remote, limits, (b"hello", b"welcome")),
    )
    .await;
    x.unwrap();
    y.unwrap();
    (ca, cb)
}

/// `a` RDMA-Writes each size of `sizes` (a [`crate::ops::pattern`] seeded from `seed`) into a region of
/// `b` at offset 7, then Reads it back into a zeroed region of its own: both byte for byte, every completion
/// checked. One-sided: `b`'s application does nothing.
pub async fn write_read_back(a: &End, b: &End, sizes: &[usize], seed: u8) {
    let len = sizes.iter().max().copied().unwrap_or(0) + 64;
    let target = b.register(len).await;
    let local = a.register(len).await;
    let back = a.register(len).await;
    for (i, size) in sizes.iter().enumerate() {
        let data = pattern(*size, seed.wrapping_add(i as u8));
        local.write_at(0, &data).unwrap();
        a.qp.write(i as u64, &[local.sge(0, *size as u32)], target.remote(7))
            .unwrap();
        assert_ok(
            &completions(&a.cq, 1).await[0],
            i as u64,
            CompletionOp::Write,
            *size as u32,
        );
        back.fill(0, *size, 0).unwrap();
        a.qp.read(1000 + i as u64, back.sge(0, *size as u32), target.remote(7))
            .unwrap();
        assert_ok(
            &completions(&a.cq, 1).await[0],
            1000 + i as u64,
            CompletionOp::Read,
            *size as u32,
        );
        assert_eq!(back.to_vec(0, *size).unwrap(), data, "Read back of {size} bytes");
        assert_eq!(
            target.to_vec(7, *size).unwrap(),
            data,
            "Write of {size} bytes at offset 7"
        );
    }
}

/// A plain TCP connection to `remote` (from the calling thread's namespace) that has sent an MPA Rev 1
/// Request (RFC 5044 §7.1: no IRD/ORD word) with `private_data`; reads time out after 20 s. For tests that
/// play a peer soft-rdma's client library never is.
pub fn rev1_initiator(remote: SocketAddr, private_data: &[u8]) -> std::net::TcpStream {
    use soft_rdma_common::wire::mpa::{MpaKind, MpaRepr};
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(remote).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    let req = MpaRepr {
        kind: MpaKind::Request,
        markers: false,
        crc: false,
        reject: false,
        revision: 1,
        enhanced: None,
        private_data,
    };
    let mut b = vec![0u8; req.buffer_len()];
    req.emit(&mut b).unwrap();
    s.write_all(&b).unwrap();
    s
}

/// An RDMA Read Request as a raw peer sends it, one FPDU without CRC: `rr` on the Read Request queue with
/// message sequence number `msn` (RFC 5040 §4.4; RFC 5041 §5).
pub fn read_request_fpdu(msn: u32, rr: soft_rdma_common::wire::rdmap::ReadRequestRepr) -> Vec<u8> {
    use soft_rdma_common::wire::ddp::{Placement, QN_READ_REQUEST};
    use soft_rdma_common::wire::rdmap::{MessageRepr, RdmapOpcode};
    let mut body = [0u8; 28];
    rr.emit(&mut body).unwrap();
    let msg = MessageRepr {
        opcode: RdmapOpcode::RdmaReadRequest,
        last: true,
        placement: Placement::Untagged {
            queue: QN_READ_REQUEST,
            msn,
            offset: 0,
            ulp_field: 0,
        },
        payload: &body,
    };
    soft_rdma::engine::framing::fpdu(&msg, false).unwrap().to_vec()
}

/// How many offers the listener at `local` has queued, by a daemon's `status` (`None`: no listener there).
pub fn queued_offers(status: &StatusReport, local: SocketAddr) -> Option<u32> {
    status
        .listeners
        .iter()
        .find(|l| l.local == local)
        .map(|l| l.queued_offers)
}

/// The XDP program's steering counters of one daemon (from its status).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Steering {
    /// Frames redirected to the daemon's AF_XDP sockets.
    pub redirected: u64,
    /// MPA Requests and Replies the program classified.
    pub mpa: u64,
}

/// The daemon's steering counters, or `None` when it runs over kernel TCP.
pub async fn steering(adapter: &Adapter) -> Option<Steering> {
    let status = adapter.status().await.expect("status");
    let t = status.transport?;
    if t.kind != "xdp" {
        return None;
    }
    let get = |name: &str| t.counters.iter().find(|(n, _)| n == name).map_or(0, |(_, v)| *v);
    Some(Steering {
        redirected: get("redirected"),
        mpa: get("mpa_request") + get("mpa_reply"),
    })
}

/// Whether `$SOFT_RDMA_TEST_TRANSPORT` puts `side`'s daemon in XDP mode (as [`crate::TestNet::spawn_daemon`]
/// does).
pub fn expects_xdp(side: Side) -> bool {
    matches!(
        (test_transport().expect("SOFT_RDMA_TEST_TRANSPORT"), side),
        (TestTransport::Xdp, _) | (TestTransport::Mixed, Side::A)
    )
}

/// What [`assert_steered`] finds wrong, if anything: `before`/`after` are the daemon's counters around
/// connections of its own that crossed the wire (`None`: the daemon runs over kernel TCP).
pub fn steering_problem(xdp: bool, before: Option<Steering>, after: Option<Steering>) -> Option<String> {
    match (xdp, before, after) {
        (false, _, None) => None,
        (false, _, Some(_)) => Some("a kernel-mode daemon reports XDP counters".into()),
        (true, _, None) | (true, None, _) => {
            Some("an XDP-mode daemon runs over kernel TCP (no XDP counters)".into())
        }
        (true, Some(b), Some(a)) if a.redirected <= b.redirected => Some(format!(
            "no frame redirected to the daemon ({b:?} → {a:?}): the connection fell back to kernel TCP"
        )),
        (true, Some(b), Some(a)) if a.mpa <= b.mpa => Some(format!(
            "the XDP program saw no MPA frame ({b:?} → {a:?}): the handshake did not go through it"
        )),
        _ => None,
    }
}

/// Asserts that connections `side`'s daemon made or accepted since `before` (its [`steering`] then) went
/// through the XDP program when the test transport puts that daemon in XDP mode: frames redirected and MPA
/// frames seen. A silent fallback to kernel TCP fails here.
pub async fn assert_steered(adapter: &Adapter, side: Side, before: Option<Steering>) {
    assert_steered_as(adapter, expects_xdp(side), &format!("daemon {side:?}"), before).await;
}

/// [`assert_steered`] for a daemon whose mode the test chose itself (`xdp`); `who` names it.
pub async fn assert_steered_as(adapter: &Adapter, xdp: bool, who: &str, before: Option<Steering>) {
    let after = steering(adapter).await;
    if let Some(problem) = steering_problem(xdp, before, after) {
        panic!("{who}: {problem}");
    }
}

/// The states of `side`'s TCP connections to `peer`, whichever TCP holds them, with RFC 9293's names
/// ("ESTABLISHED", "TIME-WAIT"…): the kernel's sockets in `side`'s namespace (`ss`), and, when
/// `$SOFT_RDMA_TEST_TRANSPORT` puts `side`'s daemon in XDP mode, the daemon's connections as its `status`
/// lists them (an XDP-mode connection is no kernel socket: the own TCP's table, or smoltcp's sockets).
pub async fn tcp_states_to(net: &TestNet, adapter: &Adapter, side: Side, peer: SocketAddr) -> Vec<String> {
    let mut ss = net.command(side, "ss");
    let out = crate::output_ok(ss.args(["-Htan", "dst", &peer.to_string()]), "ss")
        .unwrap_or_else(|e| panic!("{e:#}"));
    let mut states: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(|s| match s {
            "ESTAB" => "ESTABLISHED".to_owned(),
            "SYN-RECV" => "SYN-RECEIVED".to_owned(),
            "UNCONN" | "CLOSE" => "CLOSED".to_owned(),
            other => other.to_owned(),
        })
        .collect();
    if expects_xdp(side) {
        let status = adapter.status().await.expect("status");
        let t = status.transport.expect("the daemon reports its transport");
        assert_eq!(t.kind, "xdp", "daemon {side:?} should run in XDP mode");
        let conns = t
            .tcp_connections
            .expect("an XDP-mode daemon lists its TCP connections");
        states.extend(conns.into_iter().filter(|c| c.remote == peer).map(|c| c.state));
    }
    states
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(redirected: u64, mpa: u64) -> Option<Steering> {
        Some(Steering { redirected, mpa })
    }

    #[test]
    fn steering_problems() {
        assert_eq!(steering_problem(false, None, None), None);
        assert_eq!(steering_problem(true, s(0, 0), s(9, 1)), None);
        assert!(
            steering_problem(true, s(0, 0), None)
                .unwrap()
                .contains("kernel TCP")
        );
        assert!(
            steering_problem(true, None, s(1, 1))
                .unwrap()
                .contains("kernel TCP")
        );
        assert!(
            steering_problem(true, s(5, 1), s(5, 1))
                .unwrap()
                .contains("fell back"),
            "nothing redirected since before"
        );
        assert!(
            steering_problem(true, s(5, 1), s(9, 1))
                .unwrap()
                .contains("no MPA frame"),
            "frames but no handshake"
        );
        assert!(steering_problem(false, None, s(1, 1)).is_some());
    }
}
