//! The netns test harness: two network namespaces joined by a veth pair, with soft-rdmad running in each.
//!
//! [`TestNet::new`] creates namespaces `sr<id>a` / `sr<id>b`, a veth pair, IPv4 `10.200.<n>.1|2/24` and IPv6
//! `fd00:5352:<n>::1|2/64`, `tx off` on both ends (finished checksums in captures), and a blackhole subnet
//! `10.201.<n>.0/24` that A routes through B, which does not forward: packets vanish, connects time out;
//! `10.203.<n>.0/24` has no route at all, and `10.200.<n>.99` is on the link but nobody answers ARP.
//! Everything is deleted on drop (and daemons are stopped). Unix sockets live in the filesystem, not in a
//! namespace, so one test process drives both daemons.
//!
//! [`TestNet::new_offloading`] leaves offloads on, as containers and VMs run (TX checksums and TSO), over a
//! veth, a bridge carrying A's address, or macvlans ([`PeerLink`]).
//!
//! [`TestNet::new_impaired`] puts a third namespace between A and B with a userspace forwarder that loses,
//! delays and reorders frames (`tc netem`'s job, without netem): see [`impair`]. [`raw`] reads kernel
//! sockets (how a connection ended, which connections a namespace's kernel holds); [`capture`] classifies a
//! capture's iWARP frames by tshark's dissector fields; [`siw`] drives the Linux siw VM. With the `client`
//! feature (the suites; not xtask): `ops` has the helpers the data-moving tests share (bounded waits,
//! waiting for a state or a registration, payload patterns, completions), `ends` the shapes the connection
//! tests share (two daemons with a session each, a queue-pair end, connecting two ends, the XDP steering
//! check), `local` the hostile local clients (raw Unix-socket frames, passed descriptors, sparse memfds,
//! the CLI as another user), and `faults` what the local-client suites share (a Write and Read round, how a
//! daemon's log says a connection ended). [`rings`] finds a client's shared queue-pair rings and writes into
//! them behind the library's back (a client breaking the ring contract). `rdma_core` runs Debian's unmodified
//! rdma-core programs on soft-rdma's drop-in libraries (`soft-rdma run`) between the two namespaces, and
//! `perftest` runs Debian's perftest there and reads its results rows; `qperf` and `fio` run qperf's and
//! fio's rdma engine there. [`package`] makes the clean Debian root the package suite installs soft-rdma's
//! .deb in (debootstrap, cached) and runs commands in it.

pub mod capture;
#[cfg(feature = "client")]
pub mod ends;
#[cfg(feature = "client")]
pub mod faults;
#[cfg(feature = "client")]
pub mod fio;
pub mod impair;
#[cfg(feature = "client")]
pub mod libfabric;
#[cfg(feature = "client")]
pub mod local;
#[cfg(feature = "client")]
pub mod ops;
pub mod package;
#[cfg(feature = "client")]
pub mod perftest;
/// What `tests/c/protection.c` prints when it passes.
#[cfg(feature = "client")]
pub mod protection;
#[cfg(feature = "client")]
pub mod qperf;
pub mod raw;
#[cfg(feature = "client")]
pub mod rdma_core;
pub mod rdma_core_suite;
pub mod rings;
pub mod siw;
#[cfg(feature = "client")]
pub mod siw_host;
pub mod users;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::impair::{Forwarder, Impairment, Stats};

/// One of the two hosts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A name for a new set of namespaces: `prefix`, `tag`'s first 4 characters and a number unique to this
/// process and `counter`'s next value; with a byte for its subnet (1-250, `spread` times the pid apart) and a
/// new temporary directory `<dir_prefix>-<name>`.
pub(crate) fn fresh_name(
    counter: &AtomicU32,
    spread: u32,
    (prefix, tag): (&str, &str),
    dir_prefix: &str,
) -> Result<(String, u8, PathBuf)> {
    let c = counter.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    let n = ((pid.wrapping_mul(spread).wrapping_add(c)) % 250 + 1) as u8;
    let name = format!(
        "{prefix}{}{:x}",
        &tag[..tag.len().min(4)],
        (pid % 0xFFFF) * 64 + c % 64
    );
    let dir = std::env::temp_dir().join(format!("{dir_prefix}-{name}"));
    std::fs::create_dir_all(&dir)?;
    Ok((name, n, dir))
}

/// Two namespaces joined by veth (or through an impairing middle namespace: [`TestNet::new_impaired`]; or
/// as containers and VMs are joined, offloads on: [`TestNet::new_offloading`]).
pub struct TestNet {
    id: String,
    n: u8,
    dir: PathBuf,
    /// The forwarder in the middle namespace, if any.
    middle: Option<Forwarder>,
    /// How A and B are joined when offloads stay on (`None`: [`TestNet::new`]'s veth with `tx off`).
    link: Option<PeerLink>,
}

/// How [`TestNet::new_offloading`] joins A and B. Offloads stay at the kernel's defaults everywhere (TX
/// checksum offload and TSO on: B's segments carry only the pseudo-header sum, and come in GSO packets
/// where nothing splits them), as a container's veth or a VM's virtio-net sends them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerLink {
    /// A veth pair (a container).
    Veth,
    /// A's address on a bridge in A's namespace ([`TestNet::xdp_dev`]), whose port is A's veth to B: a host
    /// whose address sits on a bridge, with a container or VM behind it.
    Bridge,
    /// A and B each on a macvlan (bridge mode) of a veth in a middle namespace: a link whose kind the
    /// daemon does not trust with partial checksums (a macvlan may sit on a NIC), while B's still carry them
    /// (macvlan-to-macvlan frames never leave the host; macvlan's TX checksum offload is fixed on).
    Macvlan,
}

/// Runs `args` to completion; an error with its stderr if it fails.
pub fn run_quiet(args: &[&str]) -> Result<()> {
    output_ok(Command::new(args[0]).args(&args[1..]), &format!("{args:?}")).map(drop)
}

/// Runs `cmd` (`what` in messages) to completion: its output, or an error with its stderr if it fails.
pub fn output_ok(cmd: &mut Command, what: &str) -> Result<std::process::Output> {
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!("{what} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(out)
}

impl TestNet {
    /// Creates the pair. Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN).
    pub fn new(tag: &str) -> Result<TestNet> {
        Self::build(tag, None, 1)
    }

    /// As [`TestNet::new`], with `queues` RX and TX queues on both veths (veth picks the receiver's RX queue
    /// from the sender's TX queue, which the kernel chooses per flow by hash).
    pub fn new_multiqueue(tag: &str, queues: u32) -> Result<TestNet> {
        Self::build(tag, None, queues)
    }

    /// A ⇄ M ⇄ B: as [`TestNet::new`] (same addresses, device names and API for A and B), but A's and B's
    /// veths lead to a middle namespace M whose forwarder bridges every frame between them, impaired as
    /// `imp` says in each direction (see [`impair`]). Offloads are off on all four veths (tx checksum,
    /// GSO, TSO, GRO) and all have MTU 1500.
    pub fn new_impaired(tag: &str, imp: Impairment) -> Result<TestNet> {
        Self::build(tag, Some(imp), 1)
    }

    fn build(tag: &str, imp: Option<Impairment>, queues: u32) -> Result<TestNet> {
        let (id, n, dir) = fresh_name(&COUNTER, 31, ("", tag), "soft-rdma-net")?;
        let mut net = TestNet {
            id,
            n,
            dir,
            middle: None,
            link: None,
        };
        let (na, nb) = (net.ns(Side::A), net.ns(Side::B));
        let (va, vb) = (net.dev(Side::A), net.dev(Side::B));
        let (a4, b4) = (
            format!("{}/24", net.ipv4(Side::A)),
            format!("{}/24", net.ipv4(Side::B)),
        );
        let (a6, b6) = (
            format!("{}/64", net.ipv6(Side::A)),
            format!("{}/64", net.ipv6(Side::B)),
        );
        run_quiet(&["ip", "netns", "add", &na])?;
        run_quiet(&["ip", "netns", "add", &nb])?;
        // Offloads off: finished checksums in every frame (captures check them with tshark; XDP mode takes
        // partial ones too, which `new_offloading` and tests/tests/offloading_peers.rs cover), and with a
        // middle namespace no GSO/GRO frames larger than the MTU for its forwarder.
        let mut offloads = vec!["tx", "off"];
        if imp.is_some() {
            offloads.extend(["gso", "off", "tso", "off", "gro", "off"]);
        }
        let ethtool = |ns: &str, dev: &str| -> Result<()> {
            let mut args = vec!["ip", "netns", "exec", ns, "ethtool", "-K", dev];
            args.extend(&offloads);
            run_quiet(&args)
        };
        if imp.is_some() {
            let nm = net.middle_ns();
            let (ma, mb) = (net.middle_dev(Side::A), net.middle_dev(Side::B));
            run_quiet(&["ip", "netns", "add", &nm])?;
            // M has no addresses and must say nothing itself (no IPv6 link-local, RS, MLD, DAD): only the
            // forwarder's frames cross it.
            for key in [
                "net.ipv6.conf.default.disable_ipv6=1",
                "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv4.ip_forward=0",
            ] {
                run_quiet(&["ip", "netns", "exec", &nm, "sysctl", "-q", "-w", key])?;
            }
            run_quiet(&[
                "ip", "link", "add", &va, "netns", &na, "type", "veth", "peer", "name", &ma, "netns", &nm,
            ])?;
            run_quiet(&[
                "ip", "link", "add", &vb, "netns", &nb, "type", "veth", "peer", "name", &mb, "netns", &nm,
            ])?;
            for dev in [&ma, &mb] {
                run_quiet(&[
                    "ip", "-n", &nm, "link", "set", dev, "mtu", "1500", "promisc", "on", "up",
                ])?;
                ethtool(&nm, dev)?;
            }
        } else {
            let q = queues.to_string();
            run_quiet(&[
                "ip",
                "link",
                "add",
                &va,
                "netns",
                &na,
                "numtxqueues",
                &q,
                "numrxqueues",
                &q,
                "type",
                "veth",
                "peer",
                "name",
                &vb,
                "netns",
                &nb,
                "numtxqueues",
                &q,
                "numrxqueues",
                &q,
            ])?;
        }
        for (ns, dev, v4, v6) in [(&na, &va, &a4, &a6), (&nb, &vb, &b4, &b6)] {
            run_quiet(&["ip", "-n", ns, "addr", "add", v4, "dev", dev])?;
            run_quiet(&["ip", "-n", ns, "addr", "add", v6, "dev", dev, "nodad"])?;
            if imp.is_some() {
                run_quiet(&["ip", "-n", ns, "link", "set", dev, "mtu", "1500"])?;
            }
            run_quiet(&["ip", "-n", ns, "link", "set", dev, "up"])?;
            run_quiet(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
            ethtool(ns, dev)?;
        }
        let hole = format!("{}/24", net.blackhole_net());
        run_quiet(&[
            "ip",
            "-n",
            &na,
            "route",
            "add",
            &hole,
            "via",
            &net.ipv4(Side::B).to_string(),
        ])?;
        run_quiet(&[
            "ip",
            "netns",
            "exec",
            &nb,
            "sysctl",
            "-q",
            "-w",
            "net.ipv4.ip_forward=0",
        ])?;
        if let Some(imp) = imp {
            net.middle = Some(Forwarder::start(
                &format!("/run/netns/{}", net.middle_ns()),
                &net.middle_dev(Side::A),
                &net.middle_dev(Side::B),
                imp,
            )?);
        }
        Ok(net)
    }

    /// A and B joined as `link` says, offloads on (see [`PeerLink`]); same addresses and API as
    /// [`TestNet::new`], except that the blackhole and unreachable helpers are not set up.
    pub fn new_offloading(tag: &str, link: PeerLink) -> Result<TestNet> {
        let (id, n, dir) = fresh_name(&COUNTER, 31, ("", tag), "soft-rdma-net")?;
        let net = TestNet {
            id,
            n,
            dir,
            middle: None,
            link: Some(link),
        };
        let (na, nb) = (net.ns(Side::A), net.ns(Side::B));
        let (va, vb) = (net.dev(Side::A), net.dev(Side::B));
        run_quiet(&["ip", "netns", "add", &na])?;
        run_quiet(&["ip", "netns", "add", &nb])?;
        match link {
            PeerLink::Veth | PeerLink::Bridge => run_quiet(&[
                "ip", "link", "add", &va, "netns", &na, "type", "veth", "peer", "name", &vb, "netns", &nb,
            ])?,
            PeerLink::Macvlan => {
                // The parent: one end of a veth pair in the middle namespace (its other end unused).
                let nm = net.middle_ns();
                let (pa, pb) = (net.middle_dev(Side::A), net.middle_dev(Side::B));
                run_quiet(&["ip", "netns", "add", &nm])?;
                run_quiet(&[
                    "ip", "-n", &nm, "link", "add", &pa, "type", "veth", "peer", "name", &pb,
                ])?;
                for d in [&pa, &pb] {
                    run_quiet(&["ip", "-n", &nm, "link", "set", d, "up"])?;
                }
                for (dev, ns) in [(&va, &na), (&vb, &nb)] {
                    run_quiet(&[
                        "ip", "-n", &nm, "link", "add", dev, "link", &pa, "type", "macvlan", "mode", "bridge",
                    ])?;
                    run_quiet(&["ip", "-n", &nm, "link", "set", dev, "netns", ns])?;
                }
            }
        }
        // Where A's address goes: its veth or macvlan, or the bridge its veth is a port of.
        let a_dev = net.xdp_dev(Side::A);
        if link == PeerLink::Bridge {
            run_quiet(&["ip", "-n", &na, "link", "add", &a_dev, "type", "bridge"])?;
            run_quiet(&["ip", "-n", &na, "link", "set", &va, "master", &a_dev])?;
            run_quiet(&["ip", "-n", &na, "link", "set", &va, "up"])?;
        }
        for (ns, dev, side) in [(&na, &a_dev, Side::A), (&nb, &vb, Side::B)] {
            let v4 = format!("{}/24", net.ipv4(side));
            let v6 = format!("{}/64", net.ipv6(side));
            run_quiet(&["ip", "-n", ns, "addr", "add", &v4, "dev", dev])?;
            run_quiet(&["ip", "-n", ns, "addr", "add", &v6, "dev", dev, "nodad"])?;
            run_quiet(&["ip", "-n", ns, "link", "set", dev, "up"])?;
            run_quiet(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    /// The interface `side`'s address is on, where `--xdp` attaches: `side`'s veth, except A's bridge in
    /// [`PeerLink::Bridge`].
    pub fn xdp_dev(&self, side: Side) -> String {
        match (self.link, side) {
            (Some(PeerLink::Bridge), Side::A) => format!("br{}", self.id),
            _ => self.dev(side),
        }
    }

    /// The middle namespace of [`TestNet::new_impaired`] (exists only there).
    pub fn middle_ns(&self) -> String {
        format!("sr{}m", self.id)
    }

    /// M's end of the link to `side` (in [`TestNet::middle_ns`]).
    pub fn middle_dev(&self, side: Side) -> String {
        format!("v{}m{}", self.id, if side == Side::A { "a" } else { "b" })
    }

    /// The forwarder's counters so far; None without a middle namespace.
    pub fn impairment_stats(&self) -> Option<Stats> {
        self.middle.as_ref().map(Forwarder::stats)
    }

    pub fn ns(&self, side: Side) -> String {
        format!("sr{}{}", self.id, if side == Side::A { "a" } else { "b" })
    }

    pub fn dev(&self, side: Side) -> String {
        format!("v{}{}", self.id, if side == Side::A { "a" } else { "b" })
    }

    pub fn ipv4(&self, side: Side) -> Ipv4Addr {
        Ipv4Addr::new(10, 200, self.n, if side == Side::A { 1 } else { 2 })
    }

    pub fn ipv6(&self, side: Side) -> Ipv6Addr {
        Ipv6Addr::new(
            0xfd00,
            0x5352,
            self.n as u16,
            0,
            0,
            0,
            0,
            if side == Side::A { 1 } else { 2 },
        )
    }

    /// `side`'s IPv4 address with `port`.
    pub fn addr(&self, side: Side, port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.ipv4(side)), port)
    }

    fn blackhole_net(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 201, self.n, 0)
    }

    /// An address A can route to but nothing answers (packets are dropped in B): connects time out.
    pub fn blackhole(&self, port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 201, self.n, 9)), port)
    }

    /// An unused address on the veth subnet: ARP gets no answer, connects fail with EHOSTUNREACH after
    /// the kernel's neighbour resolution gives up (about 3 s; the ARP requests stay on the test's veth).
    pub fn unreachable_host(&self, port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 200, self.n, 99)), port)
    }

    /// An address A has no route to at all: connects fail at once with ENETUNREACH (no packet sent).
    pub fn unroutable(&self, port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 203, self.n, 9)), port)
    }

    /// A directory for this test's sockets and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Runs `program` in `side`'s namespace.
    pub fn command(&self, side: Side, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(side), program]);
        c
    }

    /// Starts soft-rdmad in `side`'s namespace and waits until its socket answers.
    ///
    /// The transport follows `$SOFT_RDMA_TEST_TRANSPORT` unless `extra` names one: `kernel` (the default),
    /// `xdp` (both daemons with `--xdp` on their veth) or `mixed` (A over XDP, B over kernel TCP), so the same
    /// suites run in all three configurations (`cargo xtask test` runs them so).
    pub fn spawn_daemon(&self, side: Side, extra: &[&str]) -> Result<Daemon> {
        let xdp = match (test_transport()?, side) {
            _ if extra.contains(&"--xdp") => false,
            (TestTransport::Xdp, _) | (TestTransport::Mixed, Side::A) => true,
            _ => false,
        };
        self.spawn_daemon_over(side, xdp, extra)
    }

    /// [`Self::spawn_daemon`] with the transport chosen here: `xdp` adds `--xdp` on `side`'s veth.
    pub fn spawn_daemon_over(&self, side: Side, xdp: bool, extra: &[&str]) -> Result<Daemon> {
        self.spawn_daemon_logging(side, xdp, extra, None)
    }

    /// [`Self::spawn_daemon_over`] with the daemon's log filter: `Some(filter)` unless `$RUST_LOG` is set
    /// (load tests log at `info`: a debug line per connection costs more than the connection).
    pub fn spawn_daemon_logging(
        &self,
        side: Side,
        xdp: bool,
        extra: &[&str],
        filter: Option<&str>,
    ) -> Result<Daemon> {
        let name = if side == Side::A { "a" } else { "b" };
        let dev = self.xdp_dev(side);
        let mut args: Vec<&str> = if xdp { vec!["--xdp", &dev] } else { vec![] };
        args.extend_from_slice(extra);
        spawn_daemon_with_log(&self.ns(side), &self.dir, name, &args, filter)
    }

    /// Runs `f` on a thread that has entered `side`'s network namespace (for raw sockets in tests).
    pub fn in_ns<T: Send + 'static>(&self, side: Side, f: impl FnOnce() -> T + Send + 'static) -> T {
        self.spawn_in_ns(side, f)
            .join()
            .expect("namespace thread panicked")
    }

    /// [`Self::in_ns`] without waiting for `f`: its thread.
    pub fn spawn_in_ns<T: Send + 'static>(
        &self,
        side: Side,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let path = format!("/run/netns/{}", self.ns(side));
        std::thread::spawn(move || {
            let fd = std::fs::File::open(&path).expect("namespace file");
            nix::sched::setns(fd, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        // The forwarder's sockets first: they hold the middle namespace.
        if let Some(mut f) = self.middle.take() {
            let _ = f.shutdown();
        }
        let middle = self.middle_ns();
        if Path::new("/run/netns").join(&middle).exists() {
            let _ = Command::new("ip").args(["netns", "del", &middle]).output();
        }
        for side in [Side::A, Side::B] {
            let _ = Command::new("ip").args(["netns", "del", &self.ns(side)]).output();
        }
        // `SOFT_RDMA_TEST_KEEP_LOGS=1` keeps the daemons' logs (and everything else of the test) to read.
        if std::env::var_os("SOFT_RDMA_TEST_KEEP_LOGS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Which transports the daemons of a test use (`$SOFT_RDMA_TEST_TRANSPORT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TestTransport {
    Kernel,
    Xdp,
    Mixed,
}

/// `$SOFT_RDMA_TEST_TRANSPORT`: `kernel` (default), `xdp` or `mixed`; anything else is an error.
pub fn test_transport() -> Result<TestTransport> {
    match std::env::var("SOFT_RDMA_TEST_TRANSPORT").as_deref() {
        Err(_) | Ok("") | Ok("kernel") => Ok(TestTransport::Kernel),
        Ok("xdp") => Ok(TestTransport::Xdp),
        Ok("mixed") => Ok(TestTransport::Mixed),
        Ok(other) => bail!("SOFT_RDMA_TEST_TRANSPORT={other}: expected kernel, xdp or mixed"),
    }
}

/// `$SOFT_RDMA_TEST_XDP_TCP` (`smoltcp` or `own`): which TCP an XDP daemon runs its steered flows on
/// (`--xdp-tcp`), added to every daemon started with `--xdp`; unset leaves the daemon's default.
fn xdp_tcp_args(args: &[&str]) -> Vec<String> {
    match std::env::var("SOFT_RDMA_TEST_XDP_TCP") {
        Ok(tcp) if !tcp.is_empty() && args.contains(&"--xdp") && !args.contains(&"--xdp-tcp") => {
            vec!["--xdp-tcp".into(), tcp]
        }
        _ => Vec::new(),
    }
}

/// Starts soft-rdmad in namespace `ns` with its socket `<dir>/<name>.sock` and log `<dir>/<name>.log`, and
/// waits (10 s at most) until the socket answers.
pub fn spawn_daemon_in(ns: &str, dir: &Path, name: &str, args: &[&str]) -> Result<Daemon> {
    spawn_daemon_with_log(ns, dir, name, args, None)
}

/// [`spawn_daemon_in`] with the log filter `filter` (else `debug`) unless `$RUST_LOG` is set.
pub fn spawn_daemon_with_log(
    ns: &str,
    dir: &Path,
    name: &str,
    args: &[&str],
    filter: Option<&str>,
) -> Result<Daemon> {
    let uds = dir.join(format!("{name}.sock"));
    let log_path = dir.join(format!("{name}.log"));
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns]).arg(daemon_binary()?);
    start_daemon(cmd, uds, log_path, args, filter)
}

/// `cmd` (soft-rdmad, however it is wrapped: `ip netns exec`, and [`users::as_user`]'s setpriv) with
/// `--uds uds` and `args`, logging to `log_path`; returns once its socket answers.
pub fn start_daemon(
    mut cmd: Command,
    uds: PathBuf,
    log_path: PathBuf,
    args: &[&str],
    filter: Option<&str>,
) -> Result<Daemon> {
    cmd.arg("--uds")
        .arg(&uds)
        .args(args)
        .args(xdp_tcp_args(args))
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| filter.unwrap_or("debug").into()),
        );
    spawn_daemon_command(cmd, uds, log_path)
}

/// Starts the soft-rdmad that `cmd` runs (every launcher in it must exec, so that the child's pid is the
/// daemon's), its output to `log_path`, and waits (10 s at most) until its socket, `uds` as this process
/// sees it, answers.
pub fn spawn_daemon_command(mut cmd: Command, uds: PathBuf, log_path: PathBuf) -> Result<Daemon> {
    let log = std::fs::File::create(&log_path)?;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
    let mut d = Daemon {
        child: Some(child),
        uds,
        log: log_path,
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(&d.uds).is_err() {
        if let Some(status) = d.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            bail!("soft-rdmad exited ({status}):\n{}", d.log_text());
        }
        if Instant::now() > deadline {
            bail!("soft-rdmad did not come up in 10 s:\n{}", d.log_text());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(d)
}

/// `tshark -r pcap <args>` with the RPC-over-RDMA heuristic dissector off (it tries every Send payload as an
/// RPC message and calls arbitrary application bytes malformed; it has nothing to say about iWARP); its
/// standard output.
pub fn tshark(pcap: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(pcap)
        .args(["--disable-protocol", "rpcordma"])
        .args(args)
        .output()
        .context("cannot run tshark; install it with `cargo xtask setup`")?;
    if !out.status.success() {
        bail!("tshark {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    String::from_utf8(out.stdout).context("tshark printed something that is not UTF-8")
}

/// The soft-rdmad binary: `$SOFT_RDMAD`, else `target/<profile>/soft-rdmad` next to the test executable.
pub fn daemon_binary() -> Result<PathBuf> {
    if let Ok(p) = std::env::var("SOFT_RDMAD") {
        return Ok(PathBuf::from(p));
    }
    sibling_binary("soft-rdmad", "SOFT_RDMAD")
}

/// The `soft-rdma` CLI: `$SOFT_RDMA_CLI`, else `target/<profile>/soft-rdma` next to the test executable.
pub fn cli_binary() -> Result<PathBuf> {
    if let Ok(p) = std::env::var("SOFT_RDMA_CLI") {
        return Ok(PathBuf::from(p));
    }
    sibling_binary("soft-rdma", "SOFT_RDMA_CLI")
}

/// Example program `name` of soft-rdma-user: `target/<profile>/examples/<name>`, beside the daemon binary
/// (`cargo build -p soft-rdma-user --examples` builds them; `cargo xtask test` does before the suites).
pub fn example_binary(name: &str) -> Result<PathBuf> {
    let p = daemon_binary()?.with_file_name("examples").join(name);
    if !p.is_file() {
        bail!(
            "{} missing: build the examples (`cargo build -p soft-rdma-user --examples`)",
            p.display()
        );
    }
    Ok(p)
}

/// `name` in the directory of the test executable or one above it (`target/<profile>/`).
fn sibling_binary(name: &str, env: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent();
    while let Some(d) = dir {
        let candidate = d.join(name);
        if candidate.is_file() {
            return Ok(candidate);
        }
        dir = d.parent();
    }
    bail!(
        "{name} not found next to {}; build it (`cargo build -p soft-rdma-user`) or set {env}",
        exe.display()
    )
}

/// A running soft-rdmad; stopped (SIGTERM, then SIGKILL) on drop.
pub struct Daemon {
    child: Option<Child>,
    uds: PathBuf,
    log: PathBuf,
}

impl Daemon {
    pub fn uds_path(&self) -> &Path {
        &self.uds
    }

    /// The daemon's process id (`ip netns exec` execs it), while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is still running (it has not exited or been stopped).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// A line of `/proc/<pid>/status` in kB (`VmRSS`, `VmHWM`...), while the daemon runs.
    pub fn status_kb(&self, field: &str) -> Option<u64> {
        let text = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        let line = text
            .lines()
            .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))?;
        line[field.len() + 1..].split_whitespace().next()?.parse().ok()
    }

    /// Open file descriptors of the daemon (each TCP connection and each reserved port is one).
    pub fn open_fds(&self) -> Option<usize> {
        Some(
            std::fs::read_dir(format!("/proc/{}/fd", self.pid()?))
                .ok()?
                .count(),
        )
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM and wait (up to 5 s); returns the exit status.
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        // `ip netns exec` execs the daemon, so the child's pid is the daemon's.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Ok(Some(s)) = child.try_wait() {
                return Some(s);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return child.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Daemon {
    /// SIGKILL (the daemon gets no chance to clean up) and wait; returns the exit status.
    pub fn kill(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let _ = child.kill();
        child.wait().ok()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Raises this process's RLIMIT_NOFILE to at least `want` (the hard limit too, which needs root), so that
/// it and the daemons it starts (they inherit the limit and raise their soft limit to the hard one) may
/// hold that many descriptors. Returns the soft limit now in force.
pub fn raise_fd_limit(want: u64) -> Result<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft >= want {
        return Ok(soft);
    }
    let hard = if hard < want {
        match setrlimit(Resource::RLIMIT_NOFILE, want, want) {
            Ok(()) => want,
            Err(e) => bail!("RLIMIT_NOFILE hard limit {hard} < {want} and cannot be raised: {e}"),
        }
    } else {
        hard
    };
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    Ok(hard)
}
