//! What `soft-rdma status` shows of the transport under the engine: kernel TCP, or XDP with its program's
//! counters and its AF_XDP sockets. Plain, serde data that clients read too, so it builds without the
//! daemon's transports (`transport::kernel`, `transport::xdp` fill it in).

/// The own TCP's (XDP mode) dropped-segment counters among [`TransportStatus::counters`]: each reason as
/// the metrics label it (`reason`), with its counter's name (`tcp_dropped_<reason>`), in the order `status`
/// lists them. `transport/xdp/stack/drops.rs` counts them (the last, outside the window, is the table's).
pub const TCP_DROPS: [(&str, &str); 5] = [
    ("bad_checksum", "tcp_dropped_bad_checksum"),
    ("partial_checksum", "tcp_dropped_partial_checksum"),
    ("malformed", "tcp_dropped_malformed"),
    ("no_connection", "tcp_dropped_no_connection"),
    ("out_of_window", "tcp_dropped_out_of_window"),
];

/// The own TCP's counter of segments taken with only the pseudo-header sum in their checksum field (a
/// peer offloading TX checksums, on a link that allows it), among [`TransportStatus::counters`].
pub const TCP_PARTIAL_ACCEPTED: &str = "tcp_partial_checksums_accepted";

/// The transport under the engine, as `status` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TransportStatus {
    /// "kernel TCP" or "xdp".
    pub kind: String,
    /// XDP: the interface, the attach mode (native / generic) and the link type (bpf_link detaches with the
    /// process).
    pub interface: Option<String>,
    pub mode: Option<String>,
    pub link: Option<String>,
    /// XDP: the program's counters, summed over CPUs (steered / passed / per class).
    pub counters: Vec<(String, u64)>,
    /// XDP: one AF_XDP socket per RX queue of the interface, with its traffic and the kernel's drop counters.
    pub queues: Vec<XskQueueStatus>,
    /// XDP: every connection of the steered flows' TCP, as `ss` lists a kernel's sockets: the own TCP's table
    /// (TIME-WAIT included), or smoltcp's connection sockets; `None` over kernel TCP (ask `ss`).
    #[serde(default)]
    pub tcp_connections: Option<Vec<TcpConnectionStatus>>,
}

/// One connection of the steered flows' TCP (XDP mode) in a [`TransportStatus`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TcpConnectionStatus {
    pub local: std::net::SocketAddr,
    pub remote: std::net::SocketAddr,
    /// RFC 9293's name of its state: "ESTABLISHED", "TIME-WAIT"… (as smoltcp also writes them).
    pub state: String,
}

/// One AF_XDP socket (one RX queue) in a [`TransportStatus`]. The frame counts are the daemon's; the drop
/// counts are the kernel's (`XDP_STATISTICS`), refreshed every quarter second.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct XskQueueStatus {
    pub queue: u32,
    /// Frames the XDP program steered to this socket and the daemon took from its RX ring.
    pub rx_frames: u64,
    /// Frames the daemon put on this socket's TX ring (smoltcp transmits on queue 0).
    pub tx_frames: u64,
    /// Steered frames the kernel dropped: no fill ring entry or RX ring full (`rx_dropped`, of which
    /// `rx_ring_full`), and times the fill ring was found empty.
    pub rx_dropped: u64,
    pub rx_ring_full: u64,
    pub rx_fill_ring_empty: u64,
    /// Descriptors the kernel rejected (a bug if ever non-zero).
    pub invalid_descs: u64,
    /// Multi-buffer packets (GSO from a peer on this host) longer than the daemon joins (64 KiB with
    /// headers): dropped by the daemon.
    #[serde(default)]
    pub rx_oversized: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_drop_reason_has_a_label_and_a_status_counter() {
        for (label, counter) in TCP_DROPS {
            assert_eq!(counter, format!("tcp_dropped_{label}"));
        }
    }
}
