//! soft-rdmad: the soft-rdma daemon. Runs the MPA handshake and the connector/listener rules over kernel TCP
//! sockets and serves clients on a Unix socket. See `soft-rdmad --help`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use soft_rdma::daemon::{self, DaemonConfig};
use soft_rdma::engine::cm::CmConfig;
use soft_rdma::engine::limits::Limits;
use soft_rdma::transport::xdp::{XdpConfig, XdpModeChoice};
use soft_rdma::uds::proto::DEFAULT_SOCKET_PATH;

/// Where kernel-TCP mode runs an established connection's data path (`--data-path`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum DataPathHome {
    Client,
    Daemon,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Parser, Debug)]
#[command(
    name = "soft-rdmad",
    version,
    about = "soft-rdma daemon: iWARP RDMA over plain Ethernet"
)]
struct Args {
    /// The Unix socket clients connect to.
    #[arg(long, default_value = DEFAULT_SOCKET_PATH)]
    uds: PathBuf,
    /// Group owning the socket (mode 0660), by name or numeric gid; members may use soft-rdma.
    #[arg(long)]
    group: Option<String>,
    /// Members of this group (and root) see every session's connectors, listeners and queue pairs in
    /// `status`; anyone else sees those of its own uid's sessions.
    #[arg(long)]
    admin_group: Option<String>,
    /// A TOML file with the same keys as the long options (flags given on the command line win).
    #[arg(long)]
    config: Option<PathBuf>,
    /// TCP connect timeout in milliseconds (siw: 10 s). An expired attempt fails with IO_TIMEOUT.
    #[arg(long)]
    connect_timeout_ms: Option<u64>,
    /// How long a listener waits for the MPA Request after TCP accept, in milliseconds (siw: 5 s).
    #[arg(long)]
    mpa_timeout_ms: Option<u64>,
    /// Ask for MPA CRC32c on every connection (otherwise only when the peer asks).
    #[arg(long)]
    crc_required: bool,
    /// Do not ask for RFC 6581 peer-to-peer mode (no RTR; the active side sends first).
    #[arg(long)]
    no_p2p: bool,
    /// Send MPA Rev 1 Requests (RFC 5044 peers).
    #[arg(long)]
    mpa_rev1: bool,
    /// How long, in milliseconds, a connecting side holds its first FPDU (or RTR) after the MPA Reply, so
    /// that Linux siw, which switches to its data path only after sending the Reply, does not miss it
    /// (docs/interop.md); 0: no hold [default: 20].
    #[arg(long)]
    first_fpdu_hold_ms: Option<u64>,
    /// Kernel-TCP mode: where established connections' data path runs. `client` (the default): the
    /// socket is handed to the client library, which runs the queue pair in the application's process;
    /// `daemon`: soft-rdmad runs it and the client talks to it over the Unix socket. XDP mode always runs it
    /// in soft-rdmad.
    #[arg(long, value_enum)]
    data_path: Option<DataPathHome>,
    #[command(flatten)]
    limits: LimitArgs,
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Threads running the engine, the client sessions and (in kernel-TCP mode) the TCP sockets. 1 (the
    /// default): one thread, no hand-offs between threads on the way from a client's request to the wire,
    /// the lowest latency and the highest connection rate. More: a multi-threaded runtime, whose session and
    /// socket tasks can use other cores (bulk transfers in kernel-TCP mode, with cores to spare). The XDP
    /// transport has a thread of its own either way. `cargo xtask bench` measured both on 2 cores: README.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    worker_threads: Option<u32>,
    /// Steer soft-rdma's TCP flows through XDP/AF_XDP on this interface (a userspace TCP stack over AF_XDP
    /// sockets; other traffic still goes to the kernel).
    #[arg(long)]
    xdp: Option<String>,
    /// XDP attach mode with --xdp: native (driver), generic (SKB), or auto (native, else generic).
    #[arg(long, value_enum)]
    xdp_mode: Option<XdpModeChoice>,
    /// With --xdp: the event loop keeps running the stack and polling the queue pairs' rings this many
    /// microseconds after its last work before it sleeps (clients then post without a doorbell). Spinning
    /// trims wake-up latency but costs a CPU while traffic flows: worth it with cores to spare, not on a
    /// machine whose cores the applications need [default: 50 on a machine with at least 8 CPUs this
    /// process may use, else 0].
    #[arg(long)]
    xdp_busy_poll_us: Option<u64>,
    /// With --xdp: the TCP of the steered flows: soft-rdma's own (`own`, the default: SACK, RACK-TLP, BBR or
    /// NewReno) or smoltcp's socket (`smoltcp`).
    #[arg(long, value_parser = ["smoltcp", "own"], default_value = "own")]
    xdp_tcp: String,
    /// With --xdp and the own TCP: the XDP program answers a SYN for a listener itself (IPv4 or IPv6), with
    /// a SYN cookie (RFC 4987), so the daemon is not woken until the handshake's ACK. SYNs without the
    /// timestamp option come to the daemon either way, and so does every SYN while the program's SYN-ACK
    /// could not leave at once (a veth whose peer runs no XDP program). `false`: every SYN comes to the
    /// daemon.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    xdp_syn_cookies: bool,
    /// Serve Prometheus metrics (the Prometheus text format, or OpenMetrics when asked for) at
    /// http://ADDR:PORT/metrics, for example 127.0.0.1:9464. Off unless given. Daemon-wide figures only;
    /// anyone who can reach the address can read them.
    #[arg(long, value_name = "ADDR:PORT")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Write soft-rdmad.8, the manual page generated from these definitions, into DIR and exit (`cargo xtask
    /// package` does, for the Debian package).
    #[arg(long, hide = true, value_name = "DIR")]
    write_man_page: Option<PathBuf>,
    /// Test-only fault injection with --xdp: drop this many of every million soft-rdma segments received.
    #[arg(long, hide = true, default_value_t = 0)]
    xdp_fault_drop_ppm: u32,
    /// Test-only: the longest ULPDU accepted from a peer (RFC 5044 §4.1), 14-65535; a longer ULPDU_Length is
    /// terminated (MPA, FPDU start) as soon as its 2 bytes arrive [default: 65535].
    #[arg(long, hide = true, value_parser = clap::value_parser!(u16).range(14..))]
    max_ulpdu: Option<u16>,
}

/// What clients may consume (soft_rdma::engine::limits::Limits; README "Limits"). Sizes take K, M, G and T
/// suffixes (powers of 1024). In the config file: a `[limits]` table with the same keys.
#[derive(clap::Args, serde::Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct LimitArgs {
    /// Objects (connectors, listeners, shared endpoints, completion queues, queue pairs, memory regions) one
    /// client session may hold at once; past it, creating one fails with INSUFFICIENT_RESOURCES [default: 65536].
    #[arg(long)]
    max_objects_per_session: Option<usize>,
    /// Bytes of memory one session may have registered (like RLIMIT_MEMLOCK); past it RegisterMemory fails
    /// with INSUFFICIENT_RESOURCES [default: 64G].
    #[arg(long, value_parser = parse_size)]
    #[serde(default, deserialize_with = "size_from_file")]
    max_registered_bytes_per_session: Option<u64>,
    /// Bytes of memory all sessions together may have registered [default: 1T].
    #[arg(long, value_parser = parse_size)]
    #[serde(default, deserialize_with = "size_from_file")]
    max_registered_bytes: Option<u64>,
    /// Memory regions (mappings) one session may hold [default: 4096].
    #[arg(long)]
    max_regions_per_session: Option<usize>,
    /// Memory regions all sessions together may hold [default: 32768].
    #[arg(long)]
    max_regions: Option<usize>,
    /// Ports (bound connectors, shared endpoints, listening listeners; one socket each) one session may hold;
    /// past it INSUFFICIENT_RESOURCES [default: 16384, lowered to a quarter of RLIMIT_NOFILE unless given].
    #[arg(long)]
    max_ports_per_session: Option<usize>,
    /// Ports of the ephemeral range 49152-65535 one session may hold; past it TOO_MANY_ADDRESSES
    /// [default: 8192].
    #[arg(long)]
    max_ephemeral_ports_per_session: Option<usize>,
    /// Client connections served at once; past it a new one gets INSUFFICIENT_RESOURCES [default: 1024].
    #[arg(long)]
    max_sessions: Option<usize>,
    /// Client connections that have not sent their Hello yet [default: 128].
    #[arg(long)]
    max_pending_hellos: Option<usize>,
    /// Milliseconds a new connection has to send its Hello; then IO_TIMEOUT [default: 10000].
    #[arg(long)]
    hello_timeout_ms: Option<u64>,
    /// Milliseconds a frame may stay half-sent; then IO_TIMEOUT [default: 30000].
    #[arg(long)]
    frame_timeout_ms: Option<u64>,
    /// Bytes queued for one client that does not read; past it its session reads no more requests
    /// [default: 4M].
    #[arg(long, value_parser = parse_size)]
    #[serde(default, deserialize_with = "size_from_file")]
    max_output_bytes_per_session: Option<u64>,
    /// Bytes queued for all clients together; past it the largest holders are paused first [default: 256M].
    #[arg(long, value_parser = parse_size)]
    #[serde(default, deserialize_with = "size_from_file")]
    max_output_bytes: Option<u64>,
    /// Work-queue entries (send + receive depth of its queue pairs) one session may hold; past it
    /// CreateQueuePair fails with INSUFFICIENT_RESOURCES [default: 262144].
    #[arg(long)]
    max_queue_entries_per_session: Option<u64>,
    /// Work-queue entries of all sessions together [default: 4194304].
    #[arg(long)]
    max_queue_entries: Option<u64>,
    /// Completion-queue entries (the depths of its completion queues) one session may hold; past it
    /// CreateCompletionQueue fails with INSUFFICIENT_RESOURCES [default: 16777216].
    #[arg(long)]
    max_cq_entries_per_session: Option<u64>,
    /// Completion-queue entries of all sessions together [default: 268435456].
    #[arg(long)]
    max_cq_entries: Option<u64>,
    /// Bytes of shared rings (daemon-run queue pairs and completion queues) one session may hold; past it
    /// the create fails with INSUFFICIENT_RESOURCES [default: 256M].
    #[arg(long, value_parser = parse_size)]
    #[serde(default, deserialize_with = "size_from_file")]
    max_ring_bytes_per_session: Option<u64>,
    /// Bytes of shared rings of all sessions together [default: 4G].
    #[arg(long, value_parser = parse_size)]
    #[serde(default, deserialize_with = "size_from_file")]
    max_ring_bytes: Option<u64>,
    /// Doorbells (eventfds: one per session with rings, one per completion queue) one session may hold
    /// [default: 1024].
    #[arg(long)]
    max_doorbells_per_session: Option<u64>,
    /// Doorbells of all sessions together; lowered to a quarter of RLIMIT_NOFILE [default: 8192].
    #[arg(long)]
    max_doorbells: Option<u64>,
    /// With --xdp: bytes of send and receive buffer memory all own-TCP connections may hold together; past
    /// it windows shrink and sends wait, nothing fails. With --xdp-tcp smoltcp each socket (connection or
    /// listening slot) takes its fixed 384 KiB when made, and past it is not made [default: 1G].
    #[arg(long, value_parser = parse_size)]
    #[serde(default, deserialize_with = "size_from_file")]
    max_tcp_buffer_bytes: Option<u64>,
    /// With --xdp: TCP connections held at once (TIME-WAIT included; with --xdp-tcp smoltcp, its listening
    /// slots too); past it a SYN is reset and a Connect fails with INSUFFICIENT_RESOURCES [default: 32768].
    #[arg(long)]
    max_tcp_connections: Option<usize>,
}

/// `4096`, `64K`, `4M`, `64G`, `1T` (powers of 1024).
fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, shift) = match s.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&s[..s.len() - 1], 10),
        Some('M') => (&s[..s.len() - 1], 20),
        Some('G') => (&s[..s.len() - 1], 30),
        Some('T') => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|e| format!("{s:?} is not a size (a number with an optional K, M, G or T): {e}"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s} is too large"))
}

/// A size in the config file: a number of bytes, or a string `parse_size` takes.
fn size_from_file<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Size {
        Bytes(u64),
        Text(String),
    }
    match <Size as serde::Deserialize>::deserialize(d)? {
        Size::Bytes(n) => Ok(Some(n)),
        Size::Text(t) => parse_size(&t).map(Some).map_err(serde::de::Error::custom),
    }
}

impl LimitArgs {
    /// Flags win over the file's `[limits]`, which wins over the defaults. Returns whether
    /// max-ports-per-session was given (otherwise it is fitted to RLIMIT_NOFILE).
    fn apply(&self, file: &LimitArgs, l: &mut Limits) -> Result<bool> {
        fn pick<T: Copy>(flag: Option<T>, file: Option<T>, to: &mut T) {
            if let Some(v) = flag.or(file) {
                *to = v;
            }
        }
        let usize_of = |n: Option<u64>| n.map(usize::try_from).transpose();
        pick(
            self.max_objects_per_session,
            file.max_objects_per_session,
            &mut l.max_objects_per_session,
        );
        pick(
            self.max_registered_bytes_per_session,
            file.max_registered_bytes_per_session,
            &mut l.max_registered_bytes_per_session,
        );
        pick(
            self.max_registered_bytes,
            file.max_registered_bytes,
            &mut l.max_registered_bytes,
        );
        pick(
            self.max_regions_per_session,
            file.max_regions_per_session,
            &mut l.max_regions_per_session,
        );
        pick(self.max_regions, file.max_regions, &mut l.max_regions);
        pick(
            self.max_ports_per_session,
            file.max_ports_per_session,
            &mut l.max_ports_per_session,
        );
        pick(
            self.max_ephemeral_ports_per_session,
            file.max_ephemeral_ports_per_session,
            &mut l.max_ephemeral_ports_per_session,
        );
        pick(self.max_sessions, file.max_sessions, &mut l.max_sessions);
        pick(
            self.max_pending_hellos,
            file.max_pending_hellos,
            &mut l.max_pending_hellos,
        );
        if let Some(ms) = self.hello_timeout_ms.or(file.hello_timeout_ms) {
            l.hello_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = self.frame_timeout_ms.or(file.frame_timeout_ms) {
            l.frame_timeout = Duration::from_millis(ms);
        }
        pick(
            usize_of(self.max_output_bytes_per_session)?,
            usize_of(file.max_output_bytes_per_session)?,
            &mut l.max_output_bytes_per_session,
        );
        pick(
            usize_of(self.max_output_bytes)?,
            usize_of(file.max_output_bytes)?,
            &mut l.max_output_bytes,
        );
        pick(
            self.max_queue_entries_per_session,
            file.max_queue_entries_per_session,
            &mut l.max_queue_entries_per_session,
        );
        pick(
            self.max_queue_entries,
            file.max_queue_entries,
            &mut l.max_queue_entries,
        );
        pick(
            self.max_cq_entries_per_session,
            file.max_cq_entries_per_session,
            &mut l.max_cq_entries_per_session,
        );
        pick(self.max_cq_entries, file.max_cq_entries, &mut l.max_cq_entries);
        pick(
            self.max_ring_bytes_per_session,
            file.max_ring_bytes_per_session,
            &mut l.max_ring_bytes_per_session,
        );
        pick(self.max_ring_bytes, file.max_ring_bytes, &mut l.max_ring_bytes);
        pick(
            usize_of(self.max_doorbells_per_session)?,
            usize_of(file.max_doorbells_per_session)?,
            &mut l.max_doorbells_per_session,
        );
        pick(
            usize_of(self.max_doorbells)?,
            usize_of(file.max_doorbells)?,
            &mut l.max_doorbells,
        );
        pick(
            self.max_tcp_buffer_bytes,
            file.max_tcp_buffer_bytes,
            &mut l.max_tcp_buffer_bytes,
        );
        pick(
            self.max_tcp_connections,
            file.max_tcp_connections,
            &mut l.max_tcp_connections,
        );
        if l.max_sessions == 0 || l.max_pending_hellos == 0 {
            bail!("max-sessions and max-pending-hellos must be at least 1");
        }
        Ok(self
            .max_ports_per_session
            .or(file.max_ports_per_session)
            .is_some())
    }
}

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct FileConfig {
    uds: Option<PathBuf>,
    group: Option<String>,
    admin_group: Option<String>,
    connect_timeout_ms: Option<u64>,
    mpa_timeout_ms: Option<u64>,
    crc_required: Option<bool>,
    no_p2p: Option<bool>,
    mpa_rev1: Option<bool>,
    first_fpdu_hold_ms: Option<u64>,
    data_path: Option<DataPathHome>,
    /// Also accepted in `[limits]`, with the other limits.
    max_objects_per_session: Option<usize>,
    #[serde(default)]
    limits: LimitArgs,
    xdp: Option<String>,
    xdp_mode: Option<XdpModeChoice>,
    xdp_busy_poll_us: Option<u64>,
    worker_threads: Option<u32>,
    metrics_listen: Option<std::net::SocketAddr>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(dir) = &args.write_man_page {
        // Section 8: a daemon, in /usr/sbin (Debian policy 12.1).
        let page = clap_mangen::Man::new(<Args as clap::CommandFactory>::command()).section("8");
        let path = page
            .generate_to(dir)
            .with_context(|| format!("writing soft-rdmad's manual page into {}", dir.display()))?;
        println!("{}", path.display());
        return Ok(());
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let sub = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Text => sub.init(),
        LogFormat::Json => sub.json().init(),
    }
    let file: FileConfig = match &args.config {
        Some(p) => {
            toml::from_str(&std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?)
                .with_context(|| format!("parsing {}", p.display()))?
        }
        None => FileConfig::default(),
    };
    let mut cm = CmConfig::default_siw_compatible();
    if let Some(ms) = args.connect_timeout_ms.or(file.connect_timeout_ms) {
        cm.connect_timeout = Duration::from_millis(ms);
    }
    if let Some(ms) = args.mpa_timeout_ms.or(file.mpa_timeout_ms) {
        cm.mpa.request_timeout = Duration::from_millis(ms);
    }
    if let Some(ms) = args.first_fpdu_hold_ms.or(file.first_fpdu_hold_ms) {
        cm.first_fpdu_hold = Duration::from_millis(ms);
    }
    cm.hand_off = args.data_path.or(file.data_path).unwrap_or(DataPathHome::Client) == DataPathHome::Client;
    if let Some(n) = args.max_ulpdu {
        cm.max_ulpdu = n as usize;
    }
    if let Some(n) = file.max_objects_per_session {
        cm.limits.max_objects_per_session = n;
    }
    let ports_given = args.limits.apply(&file.limits, &mut cm.limits)?;
    cm.mpa.crc_required = args.crc_required || file.crc_required.unwrap_or(false);
    cm.mpa.peer_to_peer = !(args.no_p2p || file.no_p2p.unwrap_or(false));
    if args.mpa_rev1 || file.mpa_rev1.unwrap_or(false) {
        cm.mpa.revision = 1;
        cm.adapter.max_caller_data = soft_rdma::engine::mpa::max_private_data(1) as u32;
        cm.adapter.max_callee_data = cm.adapter.max_caller_data;
    }
    let uds = if args.uds.as_os_str() != DEFAULT_SOCKET_PATH {
        args.uds
    } else {
        file.uds.unwrap_or(args.uds)
    };
    let xdp_mode = args.xdp_mode.or(file.xdp_mode);
    let xdp = match (args.xdp.or(file.xdp), xdp_mode) {
        (Some(iface), mode) => Some(XdpConfig {
            iface,
            mode: mode.unwrap_or_default(),
            fault_drop_ppm: args.xdp_fault_drop_ppm,
            busy_poll: args
                .xdp_busy_poll_us
                .or(file.xdp_busy_poll_us)
                .map(Duration::from_micros)
                .unwrap_or_else(|| {
                    default_busy_poll(std::thread::available_parallelism().map_or(1, |n| n.get()))
                }),
            own_tcp: args.xdp_tcp == "own",
            syn_cookies: args.xdp_syn_cookies,
            own_tcp_limits: soft_rdma::tcp::TcpLimits {
                max_buffer_bytes: cm.limits.max_tcp_buffer_bytes,
                max_connections: cm.limits.max_tcp_connections,
            },
        }),
        (None, Some(_)) => bail!("--xdp-mode needs --xdp IFACE"),
        (None, None) => None,
    };
    let fd_limit = raise_fd_limit();
    if !ports_given && let Some(limit) = fd_limit {
        let before = cm.limits.max_ports_per_session;
        let now = cm.limits.fit_descriptors(limit);
        if now < before {
            tracing::info!(
                fd_limit = limit,
                max_ports_per_session = now,
                "ports per session lowered to a quarter of the file descriptor limit"
            );
        }
    }
    let config = DaemonConfig {
        uds_path: uds,
        group: args.group.or(file.group),
        admin_group: args.admin_group.or(file.admin_group),
        cm,
        xdp,
        metrics_listen: args.metrics_listen.or(file.metrics_listen),
    };
    let rt = match args.worker_threads.or(file.worker_threads).unwrap_or(1) {
        0 => bail!("worker-threads must be at least 1"),
        1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n as usize);
            b
        }
    }
    .enable_all()
    .build()?;
    rt.block_on(daemon::run(config, shutdown_signal()))
}

/// Descriptors a daemon using the whole port space needs: a socket per port or connection (16,384), plus
/// client sessions, memory regions and the runtime's own.
const FDS_FOR_THE_PORT_SPACE: u64 = 16_384 + 1_024;

/// Every soft-rdma port and connection is a kernel socket: the soft RLIMIT_NOFILE goes up to the hard limit
/// (often 1,024 soft / 524,288 hard). Past the limit, binds and connects fail with UNSUCCESSFUL and accepted
/// connections wait in the kernel's backlog.
fn raise_fd_limit() -> Option<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read RLIMIT_NOFILE");
            return None;
        }
    };
    let now = match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => hard,
        Err(e) => {
            tracing::warn!(soft, hard, error = %e, "cannot raise RLIMIT_NOFILE");
            soft
        }
    };
    tracing::info!(
        was = soft,
        now,
        hard,
        "file descriptor limit (RLIMIT_NOFILE) raised to the hard limit"
    );
    if now < FDS_FOR_THE_PORT_SPACE {
        tracing::warn!(
            limit = now,
            needed = FDS_FOR_THE_PORT_SPACE,
            "the file descriptor limit is below what the whole RDMA port space needs (a socket per port or \
             connection); raise the hard limit (LimitNOFILE=, ulimit -Hn) for more connections"
        );
    }
    Some(now)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (mut term, mut int) = (
        signal(SignalKind::terminate()).expect("SIGTERM handler"),
        signal(SignalKind::interrupt()).expect("SIGINT handler"),
    );
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// CPUs from which XDP mode spins by default.
const SPIN_MIN_CPUS: usize = 8;

/// `--xdp-busy-poll-us` when not given (issue 17: off by default on small machines). Off below
/// [`SPIN_MIN_CPUS`]: a spinning daemon takes a CPU its clients may need, and on the 2-CPU machine it was
/// measured on, spinning daemons took 64 B Send ½RTT from 40 to 12–30 µs but spinning clients beside them
/// put it back at 41 µs. 50 µs from there up (about two 64 B round trips with spinning daemons), where a CPU
/// per daemon is cheap next to its wake-ups.
fn default_busy_poll(cpus: usize) -> Duration {
    if cpus >= SPIN_MIN_CPUS {
        Duration::from_micros(50)
    } else {
        Duration::ZERO
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xdp_mode_spins_by_default_only_with_cpus_to_spare() {
        assert_eq!(default_busy_poll(1), Duration::ZERO);
        assert_eq!(default_busy_poll(SPIN_MIN_CPUS - 1), Duration::ZERO);
        assert_eq!(default_busy_poll(SPIN_MIN_CPUS), Duration::from_micros(50));
        assert_eq!(default_busy_poll(64), Duration::from_micros(50));
    }

    /// `--metrics-listen` wins over the file's `metrics-listen`; either must be an address with a port.
    #[test]
    fn metrics_listen_from_the_flag_or_the_file() {
        let file: FileConfig = toml::from_str("metrics-listen = \"127.0.0.1:9469\"\n").unwrap();
        assert_eq!(file.metrics_listen, Some("127.0.0.1:9469".parse().unwrap()));
        let args = Args::parse_from(["soft-rdmad", "--metrics-listen", "[::1]:9470"]);
        assert_eq!(
            args.metrics_listen.or(file.metrics_listen),
            Some("[::1]:9470".parse().unwrap())
        );
        assert!(toml::from_str::<FileConfig>("metrics-listen = \"nowhere\"\n").is_err());
        assert!(Args::try_parse_from(["soft-rdmad", "--metrics-listen", "9469"]).is_err());
        assert_eq!(
            Args::parse_from(["soft-rdmad"]).metrics_listen,
            None,
            "off unless asked for"
        );
    }

    #[test]
    fn sizes_take_binary_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("4m"), Ok(4 << 20));
        assert_eq!(parse_size("64G"), Ok(64 << 30));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        assert!(parse_size("").is_err());
        assert!(parse_size("12X").is_err());
        assert!(parse_size("99999999999T").is_err(), "overflow");
    }

    /// Flags win over the file's `[limits]`, which wins over the defaults; sizes in the file may be numbers
    /// or strings; an unknown key is an error.
    #[test]
    fn limits_from_flags_and_file() {
        let file: FileConfig = toml::from_str(
            "[limits]\nmax-sessions = 7\nmax-registered-bytes = \"2G\"\nmax-output-bytes = 1048576\n\
             hello-timeout-ms = 250\nmax-tcp-buffer-bytes = \"64M\"\n",
        )
        .unwrap();
        let args = Args::parse_from([
            "soft-rdmad",
            "--max-sessions",
            "9",
            "--max-ports-per-session",
            "12",
            "--max-tcp-connections",
            "100",
        ]);
        let mut l = Limits::default();
        let ports_given = args.limits.apply(&file.limits, &mut l).unwrap();
        assert!(ports_given);
        assert_eq!(l.max_sessions, 9, "the flag wins");
        assert_eq!(l.max_registered_bytes, 2 << 30);
        assert_eq!(l.max_output_bytes, 1 << 20);
        assert_eq!(l.hello_timeout, Duration::from_millis(250));
        assert_eq!(l.max_ports_per_session, 12);
        assert_eq!(l.max_regions, Limits::default().max_regions);
        assert_eq!(l.max_tcp_buffer_bytes, 64 << 20);
        assert_eq!(l.max_tcp_connections, 100);
        assert!(toml::from_str::<FileConfig>("[limits]\nmax-sesions = 1\n").is_err());
        let zero = Args::parse_from(["soft-rdmad", "--max-sessions", "0"]);
        assert!(
            zero.limits
                .apply(&LimitArgs::default(), &mut Limits::default())
                .is_err()
        );
    }
}
