//! The `soft-rdma` command line. Today: `wire`, which shows soft-rdma's iWARP framing and writes it as a
//! pcap for an independent decoder. (status, connect, listen, ping, perf come with the daemon.)

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
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
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
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Wire { pcap, crc, json } => wire(pcap, crc, json),
    }
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
