//! soft-rdmad: the soft-rdma daemon. Runs the MPA handshake and the connector/listener rules over kernel TCP
//! sockets and serves clients on a Unix socket. See `soft-rdmad --help`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use soft_rdma::daemon::{self, DaemonConfig};
use soft_rdma::engine::cm::CmConfig;
use soft_rdma::transport::xdp::{XdpConfig, XdpModeChoice};
use soft_rdma::uds::proto::DEFAULT_SOCKET_PATH;

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
    /// Group owning the socket (mode 0660); members may use soft-rdma.
    #[arg(long)]
    group: Option<String>,
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
    /// Objects (connectors, listeners, shared endpoints, completion queues, queue pairs, memory regions) one
    /// client session may hold at once; past it, creating one fails with INSUFFICIENT_RESOURCES [default: 65536].
    #[arg(long)]
    max_objects_per_session: Option<usize>,
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
    /// With --xdp: the transport thread spins this many microseconds after its last work before it sleeps in
    /// ppoll(2). Spinning trims wake-up latency but costs a CPU while traffic flows: worth it with cores to
    /// spare, not on a machine whose cores the applications need [default: 0].
    #[arg(long)]
    xdp_busy_poll_us: Option<u64>,
    /// Experimental, with --xdp: run the steered flows on soft-rdma's own TCP (`own`) instead of smoltcp's
    /// socket (`smoltcp`, the default).
    #[arg(long, value_parser = ["smoltcp", "own"], default_value = "smoltcp")]
    xdp_tcp: String,
    /// Test-only fault injection with --xdp: drop this many of every million soft-rdma segments received.
    #[arg(long, hide = true, default_value_t = 0)]
    xdp_fault_drop_ppm: u32,
    /// Test-only: the longest ULPDU accepted from a peer (RFC 5044 §4.1), 14-65535; a longer ULPDU_Length is
    /// terminated (MPA, FPDU start) as soon as its 2 bytes arrive [default: 65535].
    #[arg(long, hide = true, value_parser = clap::value_parser!(u16).range(14..))]
    max_ulpdu: Option<u16>,
}

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct FileConfig {
    uds: Option<PathBuf>,
    group: Option<String>,
    connect_timeout_ms: Option<u64>,
    mpa_timeout_ms: Option<u64>,
    crc_required: Option<bool>,
    no_p2p: Option<bool>,
    mpa_rev1: Option<bool>,
    max_objects_per_session: Option<usize>,
    xdp: Option<String>,
    xdp_mode: Option<XdpModeChoice>,
    xdp_busy_poll_us: Option<u64>,
    worker_threads: Option<u32>,
}

fn main() -> Result<()> {
    let args = Args::parse();
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
    if let Some(n) = args.max_ulpdu {
        cm.max_ulpdu = n as usize;
    }
    if let Some(n) = args.max_objects_per_session.or(file.max_objects_per_session) {
        cm.max_objects_per_session = n;
    }
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
            busy_poll: Duration::from_micros(args.xdp_busy_poll_us.or(file.xdp_busy_poll_us).unwrap_or(0)),
            own_tcp: args.xdp_tcp == "own",
        }),
        (None, Some(_)) => bail!("--xdp-mode needs --xdp IFACE"),
        (None, None) => None,
    };
    let config = DaemonConfig {
        uds_path: uds,
        group: args.group.or(file.group),
        cm,
        xdp,
    };
    raise_fd_limit();
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
fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read RLIMIT_NOFILE");
            return;
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
