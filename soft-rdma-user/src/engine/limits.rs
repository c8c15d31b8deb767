//! What one client, and all of them together, may consume of soft-rdmad: one settings struct, [`Limits`],
//! with every bound a client can reach, its default and what passing it costs the client. soft-rdmad's
//! flags (`--max-…`, `--…-timeout-ms`) and config-file keys set them; README.md ("Limits") tabulates them
//! and docs/protocol.md ("Limits") gives the error each one produces.
//!
//! The engine applies the port bounds ([`super::port_space`]) and the object bound ([`super::cm`]); the UDS
//! server applies the rest (`uds::budget`): registered memory, sessions, Hello and frame timeouts, queued
//! output.

use std::time::Duration;

const GIB: u64 = 1 << 30;
const MIB: usize = 1 << 20;

/// Every bound on what clients may consume. Defaults: [`Limits::default`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Objects (connectors, listeners, shared endpoints, completion queues, queue pairs, memory regions) one
    /// session may hold; one more is INSUFFICIENT_RESOURCES.
    pub max_objects_per_session: usize,
    /// Bytes of memory one session may have registered (mapped into the daemon) at once, like
    /// RLIMIT_MEMLOCK (`ulimit -l`) for a verbs application; past it RegisterMemory is
    /// INSUFFICIENT_RESOURCES. A sparse memfd costs no RAM but costs the daemon address space.
    pub max_registered_bytes_per_session: u64,
    /// Bytes of memory all sessions together may have registered; past it INSUFFICIENT_RESOURCES.
    pub max_registered_bytes: u64,
    /// Memory regions (each one mapping in the daemon) one session may hold; past it INSUFFICIENT_RESOURCES.
    pub max_regions_per_session: usize,
    /// Memory regions of all sessions together (the kernel's `vm.max_map_count`, 65,530 by default, bounds
    /// the daemon's mappings); past it INSUFFICIENT_RESOURCES.
    pub max_regions: usize,
    /// Ports one session may hold at once (each a socket, so a descriptor, in the daemon): bound connectors
    /// (Bind, or the implicit bind of Connect), shared endpoints and listening listeners; past it
    /// INSUFFICIENT_RESOURCES. soft-rdmad lowers it at start to a quarter of its RLIMIT_NOFILE if that is less.
    pub max_ports_per_session: usize,
    /// Ephemeral ports (49152-65535, a bind to port 0) one session may hold at once, so that no session can
    /// take the whole range from the others; past it TOO_MANY_ADDRESSES, as when the range is used up.
    pub max_ephemeral_ports_per_session: usize,
    /// Client connections the daemon serves at once (with or without Hello); one more is answered with a
    /// Goodbye carrying INSUFFICIENT_RESOURCES and closed.
    pub max_sessions: usize,
    /// Client connections that have not sent their Hello yet; one more is answered like one past
    /// `max_sessions`.
    pub max_pending_hellos: usize,
    /// How long a new connection may take to send its Hello; then Goodbye with IO_TIMEOUT.
    pub hello_timeout: Duration,
    /// How long a frame may stay half-sent (its first byte received, its last not); then Goodbye with
    /// IO_TIMEOUT.
    pub frame_timeout: Duration,
    /// Bytes of answers, events and completions queued for one client that does not read them; past it the
    /// session reads no more requests until the client catches up.
    pub max_output_bytes_per_session: usize,
    /// The same for all sessions together: past it, the sessions with the most queued output are paused
    /// first (every session holding at least the average share), the others keep being served.
    pub max_output_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_objects_per_session: 65_536,
            max_registered_bytes_per_session: 64 * GIB,
            max_registered_bytes: 1024 * GIB,
            max_regions_per_session: 4_096,
            max_regions: 32_768,
            max_ports_per_session: 16_384,
            max_ephemeral_ports_per_session: 8_192,
            max_sessions: 1_024,
            max_pending_hellos: 128,
            hello_timeout: Duration::from_secs(10),
            frame_timeout: Duration::from_secs(30),
            max_output_bytes_per_session: 4 * MIB,
            max_output_bytes: 256 * MIB,
        }
    }
}

impl Limits {
    /// Lowers the per-session port bound to a quarter of `fd_limit` (the daemon's RLIMIT_NOFILE) if it is
    /// higher, so one session can never take most of the daemon's descriptors. Returns the bound now.
    pub fn fit_descriptors(&mut self, fd_limit: u64) -> usize {
        let quarter = usize::try_from(fd_limit / 4).unwrap_or(usize::MAX).max(1);
        self.max_ports_per_session = self.max_ports_per_session.min(quarter);
        self.max_ports_per_session
    }
}

/// What `status` shows of the limits the daemon enforces beside the engine's (the UDS server's counters,
/// filled in by the daemon): connections, registered memory and the memory held for clients.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResourceStatus {
    /// Client connections open (with or without Hello), and the bound.
    pub client_connections: u64,
    pub max_sessions: u64,
    /// Of those, the ones that have not sent their Hello yet.
    pub pending_hellos: u64,
    /// Connections answered INSUFFICIENT_RESOURCES (a bound above, or out of descriptors) since start.
    pub refused_connections: u64,
    /// Bytes of client memory mapped for registered regions, and the bound.
    pub registered_bytes: u64,
    pub max_registered_bytes: u64,
    /// Registered regions (mappings), and the bound.
    pub regions: u64,
    pub max_regions: u64,
    /// Bytes of answers, events and completions queued for clients that have not read them, and the bound.
    pub queued_output_bytes: u64,
    pub max_output_bytes: u64,
    /// Times a session was paused because the queued output of all sessions passed the bound.
    pub output_pauses: u64,
    /// The daemon's resident memory (VmRSS), if it could be read.
    pub resident_bytes: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_session_ports_stay_well_below_the_descriptor_limit() {
        let mut l = Limits::default();
        assert_eq!(
            l.fit_descriptors(524_288),
            16_384,
            "a high limit leaves the default"
        );
        assert_eq!(l.fit_descriptors(20_000), 5_000);
        assert_eq!(l.fit_descriptors(3), 1, "never 0");
    }
}
