//! The `soft-rdma` command line: `status`, `connect`, `listen`, `demo`, `ping`, `perf` (through the client
//! library), `run` (an unmodified libibverbs/librdmacm program on soft-rdma's drop-in libraries), and
//! `wire` (soft-rdma's iWARP framing, written as a pcap for an independent decoder).

use std::net::SocketAddrV4;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use soft_rdma::capture::{Direction, sample_capture};
use soft_rdma_common::wire::ddp::Placement;
use soft_rdma_common::wire::fpdu::{FpduRepr, verify_crc};
use soft_rdma_common::wire::mpa::MpaRepr;
use soft_rdma_common::wire::rdmap::MessageRepr;

#[derive(Parser)]
#[command(
    name = "soft-rdma",
    version,
    about = "soft-rdma: iWARP RDMA over plain Ethernet"
)]
struct Cli {
    /// soft-rdmad's socket (default: $SOFT_RDMA_UDS, else /run/soft-rdma/soft-rdmad.sock).
    #[arg(long, global = true)]
    uds: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Listeners, connectors and ports the daemon holds.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Connect to a listener and print what was negotiated, then complete and disconnect.
    Connect(ConnectArgs),
    /// Listen and answer offers (accept or reject), printing each.
    Listen(ListenArgs),
    /// The connection-management walk-through between two daemons (what `cargo xtask demo` runs).
    Demo(cli::demo::DemoArgs),
    /// rping-style: the server RDMA-Reads the client's buffer and RDMA-Writes it back, every round checked.
    Ping(cli::ping::PingArgs),
    /// perftest-style bandwidth or latency of Send, RDMA Write or RDMA Read.
    Perf(cli::perf::PerfArgs),
    /// Run an unmodified RDMA program (rping, ucmatose, ibv_devinfo, perftest…) on soft-rdma: its
    /// libibverbs.so.1 and librdmacm.so.1 become soft-rdma's, through LD_LIBRARY_PATH.
    Run(cli::run::RunArgs),
    /// Build a sample iWARP conversation (MPA v2 handshake, then one FPDU of every RDMAP kind), decode it
    /// with soft-rdma's own parsers, and write it as a pcap for Wireshark/tshark.
    Wire {
        /// Where to write the capture.
        #[arg(long, default_value = "soft-rdma-sample.pcap")]
        pcap: PathBuf,
        /// Negotiate CRC32c (MPA C flag): every FPDU carries a CRC.
        #[arg(long)]
        crc: bool,
        /// Print the decoded frames as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write the manual pages, generated from these definitions (soft-rdma.1 and one per command), into DIR
    /// and exit. Hidden: `cargo xtask package` runs it for the Debian package.
    #[command(hide = true)]
    WriteManPages {
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
}

/// What a side offers in the handshake, and how to print the outcome.
#[derive(clap::Args)]
struct Offer {
    /// Inbound read limit (IRD): RDMA Reads this side serves.
    #[arg(long, default_value_t = 16)]
    ird: u32,
    /// Outbound read limit (ORD): RDMA Reads this side issues.
    #[arg(long, default_value_t = 16)]
    ord: u32,
    /// Private data, hex.
    #[arg(long, default_value = "")]
    data: String,
    #[arg(long)]
    json: bool,
}

impl Offer {
    /// The read limits offered: IRD `ird`, ORD `ord`.
    fn limits(&self) -> soft_rdma::client::ReadLimits {
        soft_rdma::client::ReadLimits::new(self.ird, self.ord)
    }
}

#[derive(clap::Args)]
struct ConnectArgs {
    remote: std::net::SocketAddr,
    /// Local address to bind (port 0 = ephemeral).
    #[arg(long)]
    bind: Option<std::net::SocketAddr>,
    #[command(flatten)]
    offer: Offer,
}

#[derive(clap::Args)]
struct ListenArgs {
    local: std::net::SocketAddr,
    /// Reject offers instead of accepting them.
    #[arg(long, conflicts_with = "accept")]
    reject: bool,
    #[arg(long)]
    accept: bool,
    /// Stop after this many offers (0 = forever).
    #[arg(long, default_value_t = 0)]
    count: u32,
    #[command(flatten)]
    offer: Offer,
}

mod cli;

fn main() -> Result<()> {
    let cli = Cli::parse();
    let cmd = match cli.cmd {
        Cmd::Wire { pcap, crc, json } => return wire(pcap, crc, json),
        Cmd::WriteManPages { dir } => {
            // Section 1 (user commands); hidden commands, this one included, get no page.
            let cmd = <Cli as clap::CommandFactory>::command();
            return clap_mangen::generate_to(cmd, &dir)
                .with_context(|| format!("writing the manual pages into {}", dir.display()));
        }
        // Before any runtime or thread exists: the program replaces this process.
        Cmd::Run(a) => {
            let (err, code) = cli::run::run(cli.uds, a);
            eprintln!("soft-rdma run: {err:#}");
            std::process::exit(code);
        }
        cmd => cmd,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let uds = cli.uds;
    // The command runs as a task of its own, not as `block_on`'s future: when a task (a connection's driver)
    // wakes `block_on`'s future, tokio's current-thread scheduler polls its I/O driver once more without
    // blocking before it polls that future (one more `epoll_wait` per completion waited for, about 3 µs of
    // a 64 B Send round trip here: docs/performance.md); a task woken by a task is simply run next.
    let command = async move {
        match cmd {
            Cmd::Status { json } => cli::status(uds, json).await,
            Cmd::Connect(a) => cli::connect(uds, a.remote, a.bind, &a.offer).await,
            Cmd::Listen(a) => cli::listen(uds, a.local, !a.reject, a.count, &a.offer).await,
            Cmd::Demo(a) => cli::demo::run(a).await,
            Cmd::Ping(a) => cli::ping::run(uds, a).await,
            Cmd::Perf(a) => cli::perf::run(uds, a).await,
            Cmd::Wire { .. } | Cmd::Run(_) | Cmd::WriteManPages { .. } => unreachable!("handled above"),
        }
    };
    let result = rt.block_on(async move {
        match tokio::spawn(command).await {
            Ok(r) => r,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    });
    if let Err(e) = &result
        && let Some(err) = e.downcast_ref::<soft_rdma::Error>()
    {
        eprintln!("error: {err}");
        std::process::exit(2);
    }
    result
}

fn wire(pcap: PathBuf, crc: bool, json: bool) -> Result<()> {
    let client: SocketAddrV4 = "10.200.0.1:40000".parse()?;
    let server: SocketAddrV4 = "10.200.0.2:7174".parse()?;
    let (conv, frames) = sample_capture(client, server, crc).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut rows = Vec::new();
    for f in &frames {
        let dir = match f.direction {
            Direction::ToServer => "A → B",
            Direction::ToClient => "B → A",
        };
        let decoded = if f.opcode.is_none() {
            let m = MpaRepr::parse(&f.bytes).map_err(|e| anyhow::anyhow!("{e}"))?;
            let w = m.enhanced.map(|w| {
                format!(
                    " IRD {} ORD {}{}{}{}",
                    w.ird,
                    w.ord,
                    if w.peer_to_peer { " P2P" } else { "" },
                    if w.write_rtr { " WriteRTR" } else { "" },
                    if w.read_rtr { " ReadRTR" } else { "" }
                )
            });
            format!(
                "{:?} Rev {} CRC {}{} PD {} B",
                m.kind,
                m.revision,
                if m.crc { "on" } else { "off" },
                w.unwrap_or_default(),
                m.private_data.len()
            )
        } else {
            let fp = FpduRepr::parse(&f.bytes, 65535).map_err(|e| anyhow::anyhow!("{e}"))?;
            if crc {
                verify_crc(&f.bytes).map_err(|e| anyhow::anyhow!("{e}"))?;
            }
            let m = MessageRepr::parse(fp.ulpdu).map_err(|e| anyhow::anyhow!("{e}"))?;
            let place = match m.placement {
                Placement::Tagged { stag, offset } => format!("STag {stag:#010x} TO {offset:#x}"),
                Placement::Untagged {
                    queue, msn, offset, ..
                } => format!("QN {queue} MSN {msn} MO {offset}"),
            };
            format!(
                "{:?} ULPDU {} B, {place}, payload {} B",
                m.opcode,
                fp.ulpdu.len(),
                m.payload.len()
            )
        };
        rows.push((dir, f.what, f.bytes.len(), decoded));
    }
    if json {
        let v: Vec<_> = rows
            .iter()
            .map(|(d, w, n, dec)| serde_json::json!({"direction": d, "frame": w, "bytes": n, "decoded": dec}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "==> A sample iWARP conversation, decoded by soft-rdma (CRC {})\n",
            if crc { "on" } else { "off" }
        );
        println!("{:<6} {:<68} {:>5}  decoded", "dir", "frame", "bytes");
        for (d, w, n, dec) in &rows {
            println!("{d:<6} {w:<68} {n:>5}  {dec}");
        }
    }
    conv.write_pcap(std::fs::File::create(&pcap).with_context(|| format!("creating {}", pcap.display()))?)?;
    if !json {
        println!(
            "\nwrote {} ({} frames incl. the TCP handshake)",
            pcap.display(),
            conv.frames().len()
        );
    }
    Ok(())
}
