//! soft-rdma's own TCP (RFC 9293), sans-IO, for the flows the XDP transport steers into userspace.
//!
//! What it owns: one connection's state machine from SYN to TIME-WAIT ([`Connection`]), its buffers, its
//! timers and its loss recovery. It is fed parsed segments ([`TcpHeader`] plus payload), the current time
//! ([`Instant`], never read from a clock here) and randomness (the ISN and timestamp offset, passed in),
//! and hands back segments to transmit ([`Connection::poll_transmit`], payload written into the caller's
//! buffer: no allocation per segment), the next time it wants to be polled ([`Connection::poll_at`]),
//! events ([`Events`]) and counters ([`TcpCounters`]). No threads, no async: a driver calls it from one
//! poll loop, next to the queue-pair engine and the AF_XDP rings.
//!
//! [`ConnectionTable`] holds a stack's connections for the poll loop (4-tuple demultiplexing, listeners,
//! resets for segments matching nothing, ISNs, timers) under a [`TcpBudget`]: the daemon-wide bounds on
//! connections and on the buffer memory they hold together. IP, Ethernet and the checksum
//! ([`wire::checksum`]) are the driver's.
//!
//! Files by role:
//! - `seq.rs`: sequence-number arithmetic (RFC 9293 §3.4);
//! - `wire.rs`: header and options, parse and emit (RFC 9293 §3.1–3.2, RFC 7323, RFC 2018);
//! - `connection.rs`: the state machine and output; `timers.rs`: its timers (RTO, tail-loss probe RFC 8985
//!   §7 and the same probe when a fast recovery stalls, the RACK reordering timer, persist, delayed ACK,
//!   keepalive, TIME-WAIT, user timeout, idle buffer release) and probes; `segment_arrival.rs`: segment arrival
//!   (RFC 9293 §3.10, RFC 5961, PAWS), entering recovery, Eifel undo of spurious recovery (RFC 3522/4015);
//! - `rack.rs`: RACK loss detection (RFC 8985 §6): every segment in flight with its latest transmission
//!   time, the reordering-window rule and timer, lost retransmissions, the window widened by D-SACK
//!   (RFC 2883, which the receiving side sends for duplicate segments);
//! - `send_buffer.rs`, `recv_buffer.rs`: the byte rings, out-of-order reassembly and SACK blocks;
//! - `rtt.rs`: RTO (RFC 6298) with a configurable minimum;
//! - `recovery.rs`: SACK scoreboard, fast retransmit, NewReno/SACK recovery (RFC 5681, 6582, 6675, 5827);
//! - `congestion.rs`: NewReno windows (RFC 5681, RFC 6928) and the choice of controller; `bbr.rs`: the
//!   model-based controller (draft-ietf-ccwg-bbr) and what paces the sender;
//! - `table.rs`: the connections of one stack: 4-tuple demultiplexing, listeners, ISNs (RFC 6528), a
//!   bound on their number (a SYN past it is reset), connections opened from a SYN cookie's ACK (RFC 4987
//!   §3.6, the XDP program having answered the SYN), one ordered timer set, the connections with work to
//!   collect;
//! - `budget.rs`: what all connections may hold together (buffer bytes, connections) and hold now, shared
//!   with whoever shows it; `ring.rs` charges it, and past it windows shrink (never the right edge already
//!   advertised, RFC 9293 §3.8.6) and sends are cut short, nothing is aborted;
//! - tests: unit tests in each file, `connection_tests.rs` rule by rule, `sim_tests.rs` a seeded simulated
//!   link (loss, duplication, reordering, delay) with property tests, `budget_tests.rs` connections under
//!   a budget that runs out.
//!
//! Memory per connection: the two rings (sizes from [`TcpConfig`]; what they hold is charged to the
//! [`TcpBudget`], whose bound caps all connections' rings together), a scoreboard and an out-of-order list
//! of at most [`TcpConfig::max_ranges`] ranges each (grown as needed, given back when empty), RACK's record of the segments in flight (bounded, given back when empty), and a few hundred bytes
//! of state.

mod bbr;
mod budget;
mod congestion;
mod connection;
mod rack;
mod recovery;
mod recv_buffer;
mod ring;
mod rtt;
mod send_buffer;
mod seq;
mod table;
pub mod wire;

#[cfg(test)]
mod budget_tests;
#[cfg(test)]
mod connection_tests;
#[cfg(test)]
mod sim_tests;

pub use budget::{TcpBudget, TcpLimits};
pub use connection::{Connection, State, reset_for_unknown};
pub use seq::Seq;
pub use table::{ConnectionTable, Delivery, FourTuple, SynAckOffer};
pub use wire::{TcpFlags, TcpHeader, TcpOptions};

use std::time::Duration;

/// A point in time, in microseconds from an origin the driver chooses (monotonic). Passed in; the TCP
/// never reads a clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(u64);

impl Instant {
    pub const ZERO: Instant = Instant(0);

    pub fn from_micros(micros: u64) -> Self {
        Instant(micros)
    }

    pub fn from_millis(millis: u64) -> Self {
        Instant(millis.saturating_mul(1000))
    }

    pub fn micros(self) -> u64 {
        self.0
    }

    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn since(self, earlier: Instant) -> Duration {
        Duration::from_micros(self.0.saturating_sub(earlier.0))
    }
}

impl std::ops::Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        Instant(
            self.0
                .saturating_add(d.as_micros().min(u128::from(u64::MAX)) as u64),
        )
    }
}

/// Keepalive (RFC 9293 §3.8.4): after `idle` without a segment from the peer, probe every `interval`;
/// after `probes` unanswered probes the connection times out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keepalive {
    pub idle: Duration,
    pub interval: Duration,
    pub probes: u32,
}

/// The congestion controller (`congestion.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CongestionControl {
    /// Loss-based: RFC 5681 with RFC 6582/6675 recovery. Each loss episode halves the window.
    #[default]
    NewReno,
    /// Model-based, paced (draft-ietf-ccwg-bbr, `bbr.rs`): random loss does not shrink the window.
    Bbr,
}

/// Per-connection configuration. `Copy`, so each connection keeps its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpConfig {
    /// The MSS this end advertises (RFC 9293 §3.7.1): the largest segment payload it accepts, without
    /// options.
    pub mss: u16,
    /// Send ring size in bytes.
    pub send_buffer: usize,
    /// Receive ring size in bytes, which is also the largest window advertised.
    pub recv_buffer: usize,
    /// Largest number of out-of-order ranges held by the receiver and SACKed ranges by the sender.
    pub max_ranges: usize,
    /// RTO before any RTT sample (RFC 6298 §2.1: 1 s).
    pub rto_initial: Duration,
    /// Smallest RTO (RFC 6298 §2.4 says 1 s; Linux and soft-rdma use 200 ms).
    pub rto_min: Duration,
    /// Largest RTO (RFC 6298 §2.5: at least 60 s).
    pub rto_max: Duration,
    /// Delayed-ACK timeout (RFC 9293 §3.8.6.3: under 0.5 s); zero acknowledges every segment at once.
    pub delayed_ack: Duration,
    /// Offer window scaling (RFC 7323 §2).
    pub window_scaling: bool,
    /// Offer timestamps (RFC 7323 §3).
    pub timestamps: bool,
    /// Offer SACK (RFC 2018).
    pub sack: bool,
    /// Initial congestion window in segments (RFC 6928).
    pub initial_window_segments: u32,
    pub congestion: CongestionControl,
    /// Tail-loss probe (RFC 8985 §7).
    pub tail_loss_probe: bool,
    /// Allowance for a delayed ACK when a single segment is in flight (RFC 8985 §7.2 WCDelAckT: 200 ms).
    pub tlp_single_segment_allowance: Duration,
    /// Retransmission timeouts in a row before the connection is given up (RFC 9293 §3.8.3, R2).
    pub max_retransmissions: u32,
    /// R2 as a time (RFC 9293 §3.8.3 allows it; RFC 5482's user timeout): data still unacknowledged this
    /// long after its first retransmission timeout gives the connection up (TIMED_OUT), however few
    /// timeouts that was. `None`: only `max_retransmissions` counts.
    pub user_timeout: Option<Duration>,
    /// SYN (or SYN-ACK) timeouts before the handshake is given up (RFC 9293 §3.8.3: R2 for SYN ≥ 3 min is
    /// a SHOULD; soft-rdma's connection manager has its own timeout above this).
    pub max_syn_retransmissions: u32,
    /// How long TIME-WAIT lasts: 2·MSL (RFC 9293 §3.6.1). Also bounds FIN-WAIT-2.
    pub time_wait: Duration,
    pub keepalive: Option<Keepalive>,
    /// Challenge ACKs per second at most (RFC 5961 §7).
    pub challenge_acks_per_second: u32,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            mss: 1460,
            send_buffer: 256 * 1024,
            recv_buffer: 256 * 1024,
            max_ranges: 16,
            rto_initial: Duration::from_secs(1),
            rto_min: Duration::from_millis(200),
            rto_max: Duration::from_secs(60),
            delayed_ack: Duration::from_millis(40),
            window_scaling: true,
            timestamps: true,
            sack: true,
            initial_window_segments: 10,
            congestion: CongestionControl::NewReno,
            tail_loss_probe: true,
            tlp_single_segment_allowance: Duration::from_millis(200),
            max_retransmissions: 15,
            user_timeout: None,
            max_syn_retransmissions: 6,
            time_wait: Duration::from_secs(60),
            keepalive: None,
            challenge_acks_per_second: 100,
        }
    }
}

/// What happened since the application last asked ([`Connection::take_events`]); a bit set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Events(u8);

impl Events {
    /// The handshake completed.
    pub const CONNECTED: Events = Events(1);
    /// New in-order data can be read.
    pub const READABLE: Events = Events(2);
    /// Send buffer space was freed.
    pub const WRITABLE: Events = Events(4);
    /// The peer sent FIN: after the readable bytes, end of stream.
    pub const PEER_CLOSED: Events = Events(8);
    /// The connection reached CLOSED in an orderly way (or after `abort`).
    pub const CLOSED: Events = Events(16);
    /// The peer reset the connection (RST accepted, RFC 9293 §3.10.7.4 / RFC 5961 §3.2).
    pub const RESET: Events = Events(32);
    /// Retransmissions, SYN retransmissions or keepalive probes ran out (RFC 9293 §3.8.3).
    pub const TIMED_OUT: Events = Events(64);

    pub fn empty() -> Events {
        Events(0)
    }

    pub fn contains(self, other: Events) -> bool {
        self.0 & other.0 == other.0 && other.0 != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl std::ops::BitOr for Events {
    type Output = Events;
    fn bitor(self, rhs: Events) -> Events {
        Events(self.0 | rhs.0)
    }
}

impl std::ops::BitOrAssign for Events {
    fn bitor_assign(&mut self, rhs: Events) {
        self.0 |= rhs.0;
    }
}

/// Per-connection counters, so tests and status count events instead of timing them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpCounters {
    pub segments_sent: u64,
    pub segments_received: u64,
    pub data_segments_sent: u64,
    /// Every segment that re-sent sequence space already sent (for any reason).
    pub retransmitted_segments: u64,
    /// Retransmission-timer expiries with data or SYN outstanding (not zero-window probes).
    pub rto_events: u64,
    /// Fast-recovery episodes entered (3 duplicate ACKs, SACK loss detection or early retransmit).
    pub fast_retransmits: u64,
    /// Retransmissions of holes below SACKed data during fast recovery.
    pub sack_retransmits: u64,
    /// Recovery episodes (fast or after a timeout) found spurious by the timestamp echo and undone
    /// (RFC 3522, RFC 4015).
    pub spurious_recoveries: u64,
    /// Retransmissions found lost again and resent without waiting for the RTO.
    pub lost_retransmissions: u64,
    /// Tail-loss probes sent (RFC 8985 §7), and stalled-recovery probes (`timers.rs`).
    pub tlp_probes: u64,
    pub dup_acks: u64,
    pub zero_window_probes: u64,
    pub keepalive_probes: u64,
    pub challenge_acks: u64,
    /// Segments dropped as unacceptable (RFC 9293 §3.10.7.4 first check, PAWS, bad ACK).
    pub unacceptable_segments: u64,
    /// Out-of-order segments queued by the receiver.
    pub out_of_order_segments: u64,
}

impl TcpCounters {
    /// Adds `other`'s counts (the totals of many connections).
    pub fn add(&mut self, other: &TcpCounters) {
        let TcpCounters {
            segments_sent,
            segments_received,
            data_segments_sent,
            retransmitted_segments,
            rto_events,
            fast_retransmits,
            sack_retransmits,
            spurious_recoveries,
            lost_retransmissions,
            tlp_probes,
            dup_acks,
            zero_window_probes,
            keepalive_probes,
            challenge_acks,
            unacceptable_segments,
            out_of_order_segments,
        } = other;
        for (to, from) in [
            (&mut self.segments_sent, segments_sent),
            (&mut self.segments_received, segments_received),
            (&mut self.data_segments_sent, data_segments_sent),
            (&mut self.retransmitted_segments, retransmitted_segments),
            (&mut self.rto_events, rto_events),
            (&mut self.fast_retransmits, fast_retransmits),
            (&mut self.sack_retransmits, sack_retransmits),
            (&mut self.spurious_recoveries, spurious_recoveries),
            (&mut self.lost_retransmissions, lost_retransmissions),
            (&mut self.tlp_probes, tlp_probes),
            (&mut self.dup_acks, dup_acks),
            (&mut self.zero_window_probes, zero_window_probes),
            (&mut self.keepalive_probes, keepalive_probes),
            (&mut self.challenge_acks, challenge_acks),
            (&mut self.unacceptable_segments, unacceptable_segments),
            (&mut self.out_of_order_segments, out_of_order_segments),
        ] {
            *to = to.saturating_add(*from);
        }
    }
}
