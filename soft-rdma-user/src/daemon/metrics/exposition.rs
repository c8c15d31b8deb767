//! How a [`Snapshot`] reads in Prometheus's formats: every metric's name, type, unit, help and labels, written
//! by `prometheus-client` in the Prometheus text format (0.0.4) or OpenMetrics 1.0 ([`Format`], chosen from
//! the request's Accept header by [`Format::negotiate`]). Names follow Prometheus's rules: base units in the
//! name, `_total` on counters (the crate adds both), and every labelled counter is written for every label
//! value from the start, so that `increase()` sees its first step.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeGaugeValue, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use soft_rdma_common::maps::Counter;

use super::snapshot::{Snapshot, XdpFigures};
use crate::engine::counters::{
    CONNECTOR_STATES, Direction, QUEUE_PAIR_STATES, SetupOutcome, SetupTimes, Side, TerminateKind,
};
use crate::engine::limits::{Limit, LimitValue};
use crate::engine::traffic::MessageOp;
use crate::transport::status::{TCP_DROPS, TCP_PARTIAL_ACCEPTED};

/// The exposition formats `/metrics` speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// The Prometheus text format, version 0.0.4 (what `promtool check metrics` reads).
    PrometheusText,
    /// OpenMetrics 1.0.0 text (what Prometheus asks for first).
    OpenMetrics,
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::PrometheusText => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }

    /// The format an Accept header prefers: OpenMetrics when it is acceptable and weighted at least as high
    /// as plain text, else the Prometheus text format (also for no header, or one naming neither).
    pub fn negotiate(accept: Option<&str>) -> Format {
        let (mut open_metrics, mut text) = (0.0f32, 0.0f32);
        for range in accept.unwrap_or_default().split(',') {
            let mut params = range.split(';').map(str::trim);
            let media = params.next().unwrap_or_default().to_ascii_lowercase();
            let q = params
                .filter_map(|p| p.strip_prefix("q="))
                .find_map(|q| q.parse::<f32>().ok())
                .unwrap_or(1.0);
            match media.as_str() {
                "application/openmetrics-text" => open_metrics = open_metrics.max(q),
                "text/plain" | "text/*" | "*/*" => text = text.max(q),
                _ => {}
            }
        }
        if open_metrics > 0.0 && open_metrics >= text {
            Format::OpenMetrics
        } else {
            Format::PrometheusText
        }
    }
}

/// What the HTTP server counts of itself, shown with the daemon's figures.
#[derive(Debug, Default)]
pub struct ServerCounters {
    /// Connections closed at once because [`super::server::MAX_CONNECTIONS`] were open.
    pub refused_connections: AtomicU64,
    /// Scrapes served an older snapshot because the event loop did not answer in time.
    pub stale_snapshots: AtomicU64,
}

/// `snapshot` (and the server's own counters) in `format`.
pub fn encode(
    snapshot: Arc<Snapshot>,
    server: Arc<ServerCounters>,
    format: Format,
) -> Result<String, fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Figures { snapshot, server }));
    let mut out = String::new();
    match format {
        Format::PrometheusText => prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)?,
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, &registry)?,
    }
    Ok(out)
}

/// The collector the registry asks on each scrape.
#[derive(Debug)]
struct Figures {
    snapshot: Arc<Snapshot>,
    server: Arc<ServerCounters>,
}

impl Collector for Figures {
    fn encode(&self, encoder: DescriptorEncoder) -> fmt::Result {
        let mut w = Writer(encoder);
        let s = &*self.snapshot;
        daemon_families(&mut w, s)?;
        setup_families(&mut w, s)?;
        traffic_families(&mut w, s)?;
        resource_families(&mut w, s)?;
        limit_families(&mut w, s)?;
        if let Some(x) = &s.xdp {
            xdp_families(&mut w, x)?;
            tcp_families(&mut w, x)?;
        }
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        w.counter(
            "soft_rdma_metrics_connections_refused",
            "Connections to the metrics endpoint closed at once because its connection bound was reached.",
            None,
            load(&self.server.refused_connections),
        )?;
        w.counter(
            "soft_rdma_metrics_stale_scrapes",
            "Scrapes answered with an older snapshot because soft-rdmad's event loop did not answer in time.",
            None,
            load(&self.server.stale_snapshots),
        )
    }
}

/// A metric family's writer: one descriptor, then its samples.
struct Writer<'a>(DescriptorEncoder<'a>);

impl Writer<'_> {
    fn counter(&mut self, name: &str, help: &str, unit: Option<Unit>, v: u64) -> fmt::Result {
        let mut m = self
            .0
            .encode_descriptor(name, help, unit.as_ref(), MetricType::Counter)?;
        m.encode_counter::<NoLabelSet, _, u64>(&v, None)
    }

    fn gauge(&mut self, name: &str, help: &str, unit: Option<Unit>, v: impl EncodeGaugeValue) -> fmt::Result {
        let mut m = self
            .0
            .encode_descriptor(name, help, unit.as_ref(), MetricType::Gauge)?;
        m.encode_gauge(&v)
    }

    /// A counter with one sample per label set of `rows`.
    fn counters<const N: usize>(
        &mut self,
        (name, help, unit): (&str, &str, Option<Unit>),
        rows: impl IntoIterator<Item = ([(&'static str, &'static str); N], u64)>,
    ) -> fmt::Result {
        let mut m = self
            .0
            .encode_descriptor(name, help, unit.as_ref(), MetricType::Counter)?;
        for (labels, v) in rows {
            m.encode_family(&labels)?
                .encode_counter::<NoLabelSet, _, u64>(&v, None)?;
        }
        Ok(())
    }

    /// A gauge with one sample per label set of `rows`.
    fn gauges<const N: usize, V: EncodeGaugeValue>(
        &mut self,
        (name, help, unit): (&str, &str, Option<Unit>),
        rows: impl IntoIterator<Item = ([(&'static str, &'static str); N], V)>,
    ) -> fmt::Result {
        let mut m = self
            .0
            .encode_descriptor(name, help, unit.as_ref(), MetricType::Gauge)?;
        for (labels, v) in rows {
            m.encode_family(&labels)?.encode_gauge(&v)?;
        }
        Ok(())
    }

    fn histogram(&mut self, name: &str, help: &str, unit: Unit, h: &SetupTimes) -> fmt::Result {
        let mut m = self
            .0
            .encode_descriptor(name, help, Some(&unit), MetricType::Histogram)?;
        let buckets: Vec<(f64, u64)> = h.buckets().collect();
        m.encode_histogram::<NoLabelSet>(h.sum().as_secs_f64(), h.count(), &buckets, None)
    }
}

/// What the daemon holds now: its mode, sessions, connectors, listeners, ports, queue pairs and regions.
fn daemon_families(w: &mut Writer, s: &Snapshot) -> fmt::Result {
    let transport = if s.xdp.is_some() { "xdp" } else { "kernel" };
    let data_path = if s.data_path_in_clients {
        "client"
    } else {
        "daemon"
    };
    let mut m = w.0.encode_descriptor(
        "soft_rdma_daemon",
        "soft-rdmad's version, its transport (kernel TCP or XDP) and where established connections' data path runs.",
        None,
        MetricType::Info,
    )?;
    m.encode_info(&[
        ("version", env!("CARGO_PKG_VERSION")),
        ("transport", transport),
        ("data_path", data_path),
    ])?;
    let g = &s.gauges;
    w.gauge(
        "soft_rdma_sessions",
        "Client sessions (clients that said Hello).",
        None,
        g.sessions,
    )?;
    w.gauges(
        (
            "soft_rdma_connectors",
            "Connectors by state (IND2Connector).",
            None,
        ),
        CONNECTOR_STATES
            .iter()
            .zip(g.connectors)
            .map(|((_, name), n)| ([("state", *name)], n)),
    )?;
    w.gauge("soft_rdma_listeners", "Listeners that listen.", None, g.listeners)?;
    w.gauge(
        "soft_rdma_listener_queued_offers",
        "Connection requests waiting in the listeners' backlogs for GetConnectionRequest.",
        None,
        g.queued_offers,
    )?;
    w.gauge(
        "soft_rdma_shared_endpoints",
        "Shared endpoints (NdkConnectWithSharedEndpoint).",
        None,
        g.shared_endpoints,
    )?;
    w.gauge(
        "soft_rdma_ports_in_use",
        "RDMA ports held (bound connectors, shared endpoints, listeners).",
        None,
        g.ports_in_use,
    )?;
    w.gauge(
        "soft_rdma_ephemeral_ports_free",
        "Ports of the ephemeral range 49152-65535 not in use.",
        None,
        g.ports_free,
    )?;
    w.gauges(
        (
            "soft_rdma_queue_pairs",
            "Queue pairs by state: soft-rdmad's and, in kernel mode, those its clients run and report.",
            None,
        ),
        QUEUE_PAIR_STATES
            .iter()
            .zip(g.queue_pairs)
            .map(|((_, name), n)| ([("state", *name)], n)),
    )?;
    w.gauge(
        "soft_rdma_memory_regions",
        "Registered memory regions: soft-rdmad's and, in kernel mode, those its clients hold and report.",
        None,
        g.memory_regions,
    )
}

/// Connection setups: attempts, outcomes, the active side's setup times.
fn setup_families(w: &mut Writer, s: &Snapshot) -> fmt::Result {
    w.counters(
        (
            "soft_rdma_connection_setup_attempts",
            "Connection setups begun: active, a Connect; passive, an MPA Request that reached a listener.",
            None,
        ),
        Side::ALL.map(|side| ([("side", side.name())], s.setup_attempts[side as usize])),
    )?;
    let rows = Side::ALL.into_iter().flat_map(|side| {
        SetupOutcome::ALL.map(|o| {
            (
                [("side", side.name()), ("result", o.name())],
                s.setups[side as usize][o as usize],
            )
        })
    });
    w.counters(
        (
            "soft_rdma_connection_setups",
            "Connection setups ended, by side and result (established, refused, rejected, timed_out, \
             unreachable, aborted, cancelled, failed).",
            None,
        ),
        rows,
    )?;
    w.histogram(
        "soft_rdma_connection_setup_duration",
        "Active side: time from Connect to the peer's accepting MPA Reply.",
        Unit::Seconds,
        &s.setup_times,
    )
}

/// Data moved by operation and direction, and Terminates.
fn traffic_families(w: &mut Writer, s: &Snapshot) -> fmt::Result {
    let rows = |bytes: bool| {
        [Direction::Sent, Direction::Received]
            .into_iter()
            .flat_map(move |d| {
                MessageOp::ALL.map(|op| {
                    let t = match d {
                        Direction::Sent => s.traffic.sent(op),
                        Direction::Received => s.traffic.received(op),
                    };
                    let v = if bytes { t.bytes } else { t.messages };
                    ([("op", op.name()), ("direction", d.name())], v)
                })
            })
    };
    w.counters(
        (
            "soft_rdma_data",
            "RDMA payload bytes by operation and direction (tx sent, rx received and placed); kernel mode \
             counts its clients' queue pairs as they report them.",
            Some(Unit::Bytes),
        ),
        rows(true),
    )?;
    w.counters(
        (
            "soft_rdma_data_messages",
            "Whole RDMA messages by operation and direction.",
            None,
        ),
        rows(false),
    )?;
    w.counter(
        "soft_rdma_fpdus_without_queue_pair",
        "Data messages that arrived on connections given no queue pair (dropped).",
        None,
        s.fpdus_without_queue_pair,
    )?;
    let rows = Direction::ALL.into_iter().flat_map(|d| {
        TerminateKind::ALL.map(|k| {
            let (layer, kind) = k.names();
            (
                [("direction", d.name()), ("layer", layer), ("type", kind)],
                s.terminates[d as usize][k as usize],
            )
        })
    });
    w.counters(
        (
            "soft_rdma_terminates",
            "RDMAP Terminates sent (tx) and received (rx), by layer and error type (RFC 5040 section 4.8).",
            None,
        ),
        rows,
    )
}

/// Clients, registered memory, queued output and the daemon's memory.
fn resource_families(w: &mut Writer, s: &Snapshot) -> fmt::Result {
    let r = &s.resources;
    w.gauge(
        "soft_rdma_client_connections",
        "Client connections on the Unix socket, with or without Hello.",
        None,
        r.client_connections,
    )?;
    w.gauge(
        "soft_rdma_client_connections_pending_hello",
        "Client connections that have not sent their Hello yet.",
        None,
        r.pending_hellos,
    )?;
    w.counter(
        "soft_rdma_client_connections_refused",
        "Client connections answered INSUFFICIENT_RESOURCES (a bound, or out of descriptors).",
        None,
        r.refused_connections,
    )?;
    w.gauge(
        "soft_rdma_registered",
        "Bytes of client memory mapped into soft-rdmad for registered regions.",
        Some(Unit::Bytes),
        r.registered_bytes,
    )?;
    w.gauge(
        "soft_rdma_registered_regions",
        "Registered regions mapped into soft-rdmad.",
        None,
        r.regions,
    )?;
    w.gauge(
        "soft_rdma_queued_output",
        "Bytes of answers, events and completions queued for clients that have not read them.",
        Some(Unit::Bytes),
        r.queued_output_bytes,
    )?;
    w.counter(
        "soft_rdma_output_pauses",
        "Times a session was paused because the queued output of all sessions passed max_output_bytes.",
        None,
        r.output_pauses,
    )?;
    w.gauge(
        "soft_rdma_resident_memory",
        "soft-rdmad's resident memory (VmRSS).",
        Some(Unit::Bytes),
        r.resident_bytes.unwrap_or(0),
    )
}

/// Every limit's value (by unit) and how often each was hit.
fn limit_families(w: &mut Writer, s: &Snapshot) -> fmt::Result {
    let values = || Limit::ALL.into_iter().map(|l| (l, l.value(&s.limits)));
    w.gauges(
        (
            "soft_rdma_limit",
            "Bounds that count things (sessions, regions, ports, entries, doorbells, connections).",
            None,
        ),
        values().filter_map(|(l, v)| match v {
            LimitValue::Count(n) => Some(([("limit", l.name())], n)),
            _ => None,
        }),
    )?;
    w.gauges(
        ("soft_rdma_limit", "Bounds on bytes.", Some(Unit::Bytes)),
        values().filter_map(|(l, v)| match v {
            LimitValue::Bytes(n) => Some(([("limit", l.name())], n)),
            _ => None,
        }),
    )?;
    w.gauges(
        ("soft_rdma_limit", "Bounds on time.", Some(Unit::Seconds)),
        values().filter_map(|(l, v)| match v {
            LimitValue::Duration(d) => Some(([("limit", l.name())], d.as_secs_f64())),
            _ => None,
        }),
    )?;
    w.counters(
        (
            "soft_rdma_limit_hits",
            "Times each bound was hit: a request refused, a connection refused or timed out, a session \
             paused, a TCP buffer held down.",
            None,
        ),
        Limit::ALL.map(|l| ([("limit", l.name())], s.limit_hits[l as usize])),
    )
}

/// XDP mode: the program's steering counters, SYN cookies, the AF_XDP sockets.
fn xdp_families(w: &mut Writer, x: &XdpFigures) -> fmt::Result {
    let verdicts = [
        Counter::Passed,
        Counter::Redirected,
        Counter::NoSocket,
        Counter::Malformed,
        Counter::FaultDropped,
    ];
    w.counters(
        (
            "soft_rdma_xdp_packets",
            "Packets the XDP program saw, by verdict: passed to the kernel, redirected to an AF_XDP socket, \
             no socket on the queue, malformed, dropped by fault injection.",
            None,
        ),
        verdicts.map(|c| ([("verdict", c.name())], x.counter(c.name()))),
    )?;
    let classes = [
        Counter::MpaRequest,
        Counter::MpaReply,
        Counter::TaggedFpdu,
        Counter::UntaggedFpdu,
        Counter::Other,
    ];
    w.counters(
        (
            "soft_rdma_xdp_steered_segments",
            "Segments the XDP program steered, by what their payload looks like.",
            None,
        ),
        classes.map(|c| ([("class", c.name())], x.counter(c.name()))),
    )?;
    w.counter(
        "soft_rdma_xdp_syn_cookies_sent",
        "SYNs for a listener the XDP program answered itself with a SYN cookie.",
        None,
        x.counter(Counter::SynCookie.name()),
    )?;
    xsk_families(w, x)
}

/// Each AF_XDP socket's frames and the kernel's drop counters, by RX queue (a label bounded by the
/// interface's queues).
fn xsk_families(w: &mut Writer, x: &XdpFigures) -> fmt::Result {
    type Field = fn(&crate::transport::status::XskQueueStatus) -> u64;
    let families: [(&str, &str, Field); 7] = [
        (
            "soft_rdma_xsk_rx_frames",
            "Frames taken from the AF_XDP socket's RX ring.",
            |q| q.rx_frames,
        ),
        (
            "soft_rdma_xsk_tx_frames",
            "Frames put on the AF_XDP socket's TX ring.",
            |q| q.tx_frames,
        ),
        (
            "soft_rdma_xsk_rx_dropped",
            "Steered frames the kernel dropped (no fill ring entry, or RX ring full).",
            |q| q.rx_dropped,
        ),
        (
            "soft_rdma_xsk_rx_ring_full",
            "Of those, dropped with the RX ring full.",
            |q| q.rx_ring_full,
        ),
        (
            "soft_rdma_xsk_fill_ring_empty",
            "Times the kernel found the fill ring empty.",
            |q| q.rx_fill_ring_empty,
        ),
        (
            "soft_rdma_xsk_invalid_descriptors",
            "Descriptors the kernel rejected (a bug if ever non-zero).",
            |q| q.invalid_descs,
        ),
        (
            "soft_rdma_xsk_rx_oversized",
            "Multi-buffer packets longer than the daemon joins (64 KiB with headers), dropped.",
            |q| q.rx_oversized,
        ),
    ];
    // Queue numbers as label values, kept for the writer's lifetime.
    let queues: Vec<String> = x.queues.iter().map(|q| q.queue.to_string()).collect();
    for (name, help, field) in families {
        let mut m = w.0.encode_descriptor(name, help, None, MetricType::Counter)?;
        for (q, label) in x.queues.iter().zip(&queues) {
            m.encode_family(&[("queue", label.as_str())])?
                .encode_counter::<NoLabelSet, _, u64>(&field(q), None)?;
        }
    }
    Ok(())
}

/// XDP mode: the TCP of the steered flows: its budget (either TCP) and the own TCP's totals.
fn tcp_families(w: &mut Writer, x: &XdpFigures) -> fmt::Result {
    w.gauge(
        "soft_rdma_tcp_connections",
        "TCP connections the XDP transport holds, TIME-WAIT included.",
        None,
        x.counter("tcp_connections"),
    )?;
    let (all, send) = (x.counter("tcp_buffer_bytes"), x.counter("tcp_send_buffer_bytes"));
    w.gauges(
        (
            "soft_rdma_tcp_buffer",
            "Bytes of send and receive buffer memory the TCP connections hold.",
            Some(Unit::Bytes),
        ),
        [
            ([("pool", "send")], send),
            ([("pool", "receive")], all.saturating_sub(send)),
        ],
    )?;
    w.gauge(
        "soft_rdma_tcp_peak_buffer",
        "The most buffer memory the TCP connections held at once.",
        Some(Unit::Bytes),
        x.counter("tcp_peak_buffer_bytes"),
    )?;
    w.counters(
        (
            "soft_rdma_tcp_connections_refused",
            "TCP connections refused past max_tcp_connections: inbound SYNs reset, outbound connects failed.",
            None,
        ),
        [
            ([("direction", "inbound")], x.counter("tcp_refused_syns")),
            ([("direction", "outbound")], x.counter("tcp_refused_connects")),
        ],
    )?;
    w.counter(
        "soft_rdma_tcp_memory_limited",
        "Times a TCP buffer could not grow as far as it needed (max_tcp_buffer_bytes).",
        None,
        x.counter("tcp_memory_limited"),
    )?;
    let Some(t) = &x.own_tcp else { return Ok(()) };
    w.counters(
        (
            "soft_rdma_tcp_dropped_segments",
            "Segments steered to the own TCP that it dropped, by reason: bad checksum, partial checksum (the \
             peer offloads TX checksums on a link where they are refused), malformed header, no connection, \
             out of window.",
            None,
        ),
        TCP_DROPS.map(|(reason, counter)| ([("reason", reason)], x.counter(counter))),
    )?;
    w.counter(
        "soft_rdma_tcp_partial_checksums_accepted",
        "Segments taken with only the pseudo-header sum in their checksum field (a peer offloading TX \
         checksums on a veth, tap or bridge).",
        None,
        x.counter(TCP_PARTIAL_ACCEPTED),
    )?;
    let c = &t.counters;
    let totals: [(&str, &str, u64); 8] = [
        (
            "soft_rdma_tcp_segments_sent",
            "Segments the own TCP sent.",
            c.segments_sent,
        ),
        (
            "soft_rdma_tcp_segments_received",
            "Segments the own TCP received.",
            c.segments_received,
        ),
        (
            "soft_rdma_tcp_retransmitted_segments",
            "Segments that re-sent sequence space already sent, for any reason.",
            c.retransmitted_segments,
        ),
        (
            "soft_rdma_tcp_retransmission_timeouts",
            "Retransmission-timer expiries with data or a SYN outstanding (RFC 6298).",
            c.rto_events,
        ),
        (
            "soft_rdma_tcp_fast_recoveries",
            "Fast-recovery episodes entered (duplicate ACKs, SACK loss detection, early retransmit).",
            c.fast_retransmits,
        ),
        (
            "soft_rdma_tcp_tail_loss_probes",
            "Tail-loss probes sent (RFC 8985 section 7), and the same probe when a fast recovery stalled.",
            c.tlp_probes,
        ),
        (
            "soft_rdma_tcp_syn_cookie_connections",
            "Connections opened from the ACK of a SYN cookie.",
            t.cookie_connections,
        ),
        (
            "soft_rdma_tcp_syn_cookies_refused",
            "ACKs for a listener whose SYN cookie did not check out.",
            t.cookies_refused,
        ),
    ];
    for (name, help, v) in totals {
        w.counter(name, help, None, v)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_headers_choose_the_format() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                          version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(prometheus)), Format::OpenMetrics);
        assert_eq!(Format::negotiate(None), Format::PrometheusText);
        assert_eq!(Format::negotiate(Some("*/*")), Format::PrometheusText);
        assert_eq!(
            Format::negotiate(Some("text/plain; version=0.0.4")),
            Format::PrometheusText
        );
        assert_eq!(
            Format::negotiate(Some("text/plain;q=0.9, application/openmetrics-text;q=0.5")),
            Format::PrometheusText
        );
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text;q=0")),
            Format::PrometheusText
        );
        assert_eq!(Format::negotiate(Some("garbage;;q=x,,")), Format::PrometheusText);
    }

    /// Both formats: every family has HELP and TYPE, counters end in `_total`, units are in the names,
    /// OpenMetrics ends with `# EOF`; labelled counters are there at zero from the start.
    #[test]
    fn both_formats_name_every_metric_by_the_rules() {
        let s = Snapshot {
            xdp: Some(XdpFigures {
                counters: vec![
                    ("redirected".into(), 5),
                    ("tcp_buffer_bytes".into(), 10),
                    ("tcp_dropped_partial_checksum".into(), 3),
                ],
                queues: vec![crate::transport::status::XskQueueStatus::default()],
                own_tcp: Some(Default::default()),
            }),
            ..Snapshot::default()
        };
        let (snap, server) = (Arc::new(s), Arc::new(ServerCounters::default()));
        let text = encode(snap.clone(), server.clone(), Format::PrometheusText).unwrap();
        let om = encode(snap, server, Format::OpenMetrics).unwrap();
        assert!(om.ends_with("# EOF\n") && !text.contains("# EOF"));
        for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            let mut f = line.split_whitespace().skip(2);
            let (name, kind) = (f.next().unwrap(), f.next().unwrap());
            assert!(text.contains(&format!("# HELP {name} ")), "{name} has no HELP");
            assert_eq!(kind == "counter", name.ends_with("_total"), "{line}");
        }
        for needle in [
            "soft_rdma_data_bytes_total{op=\"write\",direction=\"tx\"} 0",
            "soft_rdma_connection_setups_total{side=\"active\",result=\"refused\"} 0",
            "soft_rdma_limit_hits_total{limit=\"max_sessions\"} 0",
            "soft_rdma_limit_seconds{limit=\"hello_timeout\"} 10",
            "soft_rdma_connection_setup_duration_seconds_bucket{le=\"+Inf\"} 0",
            "soft_rdma_xdp_packets_total{verdict=\"redirected\"} 5",
            "soft_rdma_tcp_buffer_bytes{pool=\"receive\"} 10",
            "soft_rdma_xsk_rx_dropped_total{queue=\"0\"} 0",
            "soft_rdma_tcp_dropped_segments_total{reason=\"partial_checksum\"} 3",
            "soft_rdma_tcp_dropped_segments_total{reason=\"out_of_window\"} 0",
            "soft_rdma_tcp_partial_checksums_accepted_total 0",
            "soft_rdma_daemon_info{version=",
        ] {
            assert!(text.contains(needle), "{needle} missing from:\n{text}");
        }
        assert!(om.contains("# UNIT soft_rdma_data_bytes bytes"), "{om}");
        assert!(om.contains("# TYPE soft_rdma_data_bytes counter"), "{om}");
    }
}
