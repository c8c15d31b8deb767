//! The CLI's client-library commands: tables for people, `--json` for scripts.

pub mod demo;
pub mod perf;
pub mod ping;
pub mod run;

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use soft_rdma::client::Adapter;
use soft_rdma::client::{ResourceStatus, StatusReport};
use soft_rdma::transport::status::TransportStatus;
use soft_rdma::transport::status::{TCP_DROPS, TCP_PARTIAL_ACCEPTED};

use super::Offer;

pub async fn open(uds: Option<PathBuf>) -> Result<Adapter> {
    Ok(match uds {
        Some(p) => Adapter::open(p).await?,
        None => Adapter::open_default().await?,
    })
}

pub fn hex_decode(s: &str) -> Result<Vec<u8>> {
    let s = s.trim();
    anyhow::ensure!(
        s.len().is_multiple_of(2),
        "hex data must have an even number of digits"
    );
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).context("bad hex digit"))
        .collect()
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Shows bytes as text when they are printable, else hex.
pub fn show(b: &[u8]) -> String {
    if !b.is_empty() && b.iter().all(|c| c.is_ascii_graphic() || *c == b' ') {
        format!("\"{}\"", String::from_utf8_lossy(b))
    } else {
        format!("{} bytes: {}", b.len(), hex(b))
    }
}

pub fn print_status(title: &str, s: &StatusReport) {
    println!(
        "{title}: {} session(s), ports in use {}, free {}",
        s.sessions, s.ports_in_use, s.ports_free
    );
    if let Some(t) = &s.transport {
        print_transport(t);
    }
    print_listeners(s);
    print_connectors(s);
    if !s.shared_endpoints.is_empty() {
        let eps: Vec<String> = s.shared_endpoints.iter().map(|e| e.to_string()).collect();
        println!("  shared endpoints: {}", eps.join(", "));
    }
    print_queue_pairs(s);
    if s.memory_regions > 0 {
        println!("  registered memory regions: {}", s.memory_regions);
    }
    if let Some(r) = &s.resources {
        print_resources(r);
    }
}

/// The transport's line, the XDP and TCP-drop counters and the AF_XDP queues' table.
fn print_transport(t: &TransportStatus) {
    match (&t.interface, &t.mode, &t.link) {
        (Some(i), Some(m), Some(l)) => println!("  transport: {} on {i}, {m} mode, {l}", t.kind),
        _ => println!("  transport: {}", t.kind),
    }
    // The own TCP's dropped segments by reason (and the partial checksums it took) on a line of their own.
    let is_drop = |k: &str| TCP_DROPS.iter().any(|(_, c)| *c == k) || k == TCP_PARTIAL_ACCEPTED;
    let (drops, counters): (Vec<_>, Vec<_>) = t.counters.iter().partition(|(k, _)| is_drop(k));
    if !counters.is_empty() {
        let c: Vec<String> = counters.iter().map(|(k, v)| format!("{k} {v}")).collect();
        println!("  XDP counters: {}", c.join(", "));
    }
    if !drops.is_empty() {
        let c: Vec<String> = drops
            .iter()
            .map(|(k, v)| {
                let label = TCP_DROPS.iter().find(|(_, c)| c == k).map(|(reason, _)| *reason);
                format!(
                    "{} {v}",
                    label.unwrap_or_else(|| k.strip_prefix("tcp_").unwrap_or(k))
                )
            })
            .collect();
        println!("  TCP segments dropped: {}", c.join(", "));
    }
    // The steered flows' TCP connections by state (each one, with its addresses, in `--json`).
    if let Some(conns) = &t.tcp_connections {
        let mut by_state = std::collections::BTreeMap::<&str, usize>::new();
        for c in conns {
            *by_state.entry(c.state.as_str()).or_default() += 1;
        }
        let c: Vec<String> = by_state.iter().map(|(k, v)| format!("{k} {v}")).collect();
        println!(
            "  TCP connections: {}",
            if c.is_empty() { "none".into() } else { c.join(", ") }
        );
    }
    if !t.queues.is_empty() {
        println!(
            "  {:>7} {:>12} {:>12} {:>10} {:>10} {:>11} {:>8} {:>9}",
            "queue", "rx frames", "tx frames", "rx drops", "ring full", "fill empty", "invalid", "oversized"
        );
        for q in &t.queues {
            println!(
                "  {:>7} {:>12} {:>12} {:>10} {:>10} {:>11} {:>8} {:>9}",
                q.queue,
                q.rx_frames,
                q.tx_frames,
                q.rx_dropped,
                q.rx_ring_full,
                q.rx_fill_ring_empty,
                q.invalid_descs,
                q.rx_oversized
            );
        }
    }
}

/// The listeners' table.
fn print_listeners(s: &StatusReport) {
    if !s.listeners.is_empty() {
        println!(
            "  {:<8} {:<8} {:<24} {:>8} {:>7}",
            "listener", "session", "local", "backlog", "queued"
        );
        for l in &s.listeners {
            println!(
                "  {:<8} {:<8} {:<24} {:>8} {:>7}",
                l.id,
                l.session,
                l.local.to_string(),
                l.backlog,
                l.queued_offers
            );
        }
    }
}

/// The connectors' table, with each one's TCP figures where the client reported them.
fn print_connectors(s: &StatusReport) {
    if !s.connectors.is_empty() {
        println!(
            "  {:<9} {:<8} {:<17} {:<22} {:<22} {:>4} {:>4} {:>6} {:>4}  tcp (kernel mode: rtt, cwnd, retransmits)",
            "connector", "session", "state", "local", "peer", "IRD", "ORD", "pd len", "MPA"
        );
        let opt = |v: Option<u32>| v.map_or("-".to_owned(), |v| v.to_string());
        for c in &s.connectors {
            let tcp = c.tcp.as_ref().map_or("-".to_owned(), |t| {
                format!(
                    "rtt {} µs ±{}, cwnd {}, retrans {}, in flight {}",
                    t.rtt_us, t.rttvar_us, t.snd_cwnd, t.total_retrans, t.unacked
                )
            });
            println!(
                "  {:<9} {:<8} {:<17} {:<22} {:<22} {:>4} {:>4} {:>6} {:>4}  {tcp}",
                c.id,
                c.session,
                format!("{:?}", c.state),
                c.local.map_or("-".into(), |a| a.to_string()),
                c.peer.map_or("-".into(), |a| a.to_string()),
                opt(c.inbound_read_limit),
                opt(c.outbound_read_limit),
                opt(c.peer_private_data_len),
                c.mpa_revision.map_or("-".into(), |r| format!("v{r}"))
            );
        }
    }
}

/// The queue pairs' table, with the Terminate that ended each one's stream.
fn print_queue_pairs(s: &StatusReport) {
    if !s.queue_pairs.is_empty() {
        println!(
            "  {:<6} {:<8} {:<9} {:<10} {:>10} {:>14} {:>10} {:>14} {:>5} {:>5}  terminate",
            "qp", "session", "connector", "state", "msgs out", "bytes out", "msgs in", "bytes in", "sq", "rq"
        );
        for q in &s.queue_pairs {
            // In words: who ended the stream, the RFC 5040 §7 cause with its numbers, what it means.
            let t = q.terminate.map_or("-".to_owned(), |t| t.to_string());
            println!(
                "  {:<6} {:<8} {:<9} {:<10} {:>10} {:>14} {:>10} {:>14} {:>5} {:>5}  {t}",
                q.id,
                q.session,
                q.connector.map_or("-".into(), |c| c.to_string()),
                format!("{:?}", q.state),
                q.stats.messages_sent,
                q.stats.bytes_sent,
                q.stats.messages_received,
                q.stats.bytes_received,
                q.stats.sq_outstanding,
                q.stats.rq_posted
            );
        }
    }
}

/// Client connections, registered memory and queued output against their bounds.
fn print_resources(r: &ResourceStatus) {
    let size = |b: u64| {
        let (unit, shift) = match b {
            0..0x10_0000 => ("KiB", 10),
            0x10_0000..0x4000_0000 => ("MiB", 20),
            0x4000_0000..0x100_0000_0000 => ("GiB", 30),
            _ => ("TiB", 40),
        };
        format!("{:.1} {unit}", b as f64 / (1u64 << shift) as f64)
    };
    println!(
        "  client connections: {} of {} ({} without Hello), {} refused",
        r.client_connections, r.max_sessions, r.pending_hellos, r.refused_connections
    );
    println!(
        "  registered: {} in {} regions (limits {}, {} regions)",
        size(r.registered_bytes),
        r.regions,
        size(r.max_registered_bytes),
        r.max_regions
    );
    println!(
        "  queued for clients: {} of {}, {} pause(s){}",
        size(r.queued_output_bytes),
        size(r.max_output_bytes),
        r.output_pauses,
        r.resident_bytes
            .map_or(String::new(), |b| format!("; soft-rdmad resident {}", size(b)))
    );
}

pub async fn status(uds: Option<PathBuf>, json: bool) -> Result<()> {
    let a = open(uds).await?;
    let s = a.status().await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print_status("soft-rdmad", &s);
    }
    Ok(())
}

pub async fn connect(
    uds: Option<PathBuf>,
    remote: SocketAddr,
    bind: Option<SocketAddr>,
    offer: &Offer,
) -> Result<()> {
    let json = offer.json;
    let a = open(uds).await?;
    let c = a.create_connector().await?;
    if let Some(b) = bind {
        c.bind(b).await?;
    }
    let pd = hex_decode(&offer.data)?;
    let outcome = c.connect(remote, offer.limits(), &pd).await;
    let peer_pd = c.private_data().await.unwrap_or_default();
    if let Err(e) = outcome {
        if json {
            println!(
                "{}",
                serde_json::json!({"status": e.status.name(), "code": e.code(), "peer_private_data": hex(&peer_pd)})
            );
        } else {
            println!("connect {remote}: {e}; peer private data {}", show(&peer_pd));
        }
        return Err(e.into());
    }
    let limits = c.read_limits().await?;
    let local = c.local_addr().await?;
    c.complete_connect().await?;
    if json {
        println!(
            "{}",
            serde_json::json!({"status": "ND_SUCCESS", "local": local, "peer": remote, "peer_inbound": limits.inbound, "peer_outbound": limits.outbound, "peer_private_data": hex(&peer_pd)})
        );
    } else {
        println!(
            "connected {local} → {remote}: may issue {} reads, serves {}; peer private data {}",
            limits.outbound,
            limits.inbound,
            show(&peer_pd)
        );
    }
    c.disconnect().await?;
    Ok(())
}

pub async fn listen(
    uds: Option<PathBuf>,
    local: SocketAddr,
    accept: bool,
    count: u32,
    ours: &Offer,
) -> Result<()> {
    let json = ours.json;
    let a = open(uds).await?;
    let l = a.create_listener().await?;
    let bound = l.listen(local, 0).await?;
    let pd = hex_decode(&ours.data)?;
    if !json {
        println!(
            "listening on {bound} ({})",
            if accept { "accepting" } else { "rejecting" }
        );
    }
    let mut n = 0;
    let mut held = Vec::new();
    while count == 0 || n < count {
        let c = a.create_connector().await?;
        let offer = l.get_connection_request(&c).await?;
        let verdict = if accept {
            c.accept(ours.limits(), &pd).await.map(|_| "accepted")
        } else {
            c.reject(&pd).await.map(|_| "rejected")
        };
        let verdict = verdict.unwrap_or_else(|e| e.status.name());
        if json {
            println!(
                "{}",
                serde_json::json!({"peer": offer.peer, "peer_inbound": offer.limits.inbound, "peer_outbound": offer.limits.outbound, "private_data": hex(&offer.private_data), "verdict": verdict})
            );
        } else {
            println!(
                "offer from {}: limits {:?}, private data {} → {verdict}",
                offer.peer,
                offer.limits,
                show(&offer.private_data)
            );
        }
        held.push(c);
        n += 1;
    }
    Ok(())
}
