//! What all the connections of a daemon may hold together, and what they hold now: bytes of send and
//! receive buffer memory, and connections. One [`TcpBudget`] is shared (an `Arc`) by every connection of a
//! [`super::ConnectionTable`]; its figures are atomics, so `status` reads them through its own `Arc`
//! whatever thread charges them.
//!
//! - Buffer memory: each ring (`ring.rs`) charges its growth here before it allocates and gives the bytes
//!   back when it is released or dropped, so the bytes charged are the bytes held, and never more than
//!   [`TcpLimits::max_buffer_bytes`]. Send buffers together may hold at most half of it ([`Pool`]): the
//!   rest is for receiving, so that bytes queued to send (which leave only when a peer acknowledges them)
//!   can never take the memory that receiving needs — two daemons exchanging data, each with its memory
//!   in unacknowledged sends and none left to receive the other's, would otherwise wait for each other
//!   forever. A ring that cannot grow works within what it has: the send buffer
//!   takes fewer bytes (the application sees a full send buffer, RFC 9293 §3.10.2: the data stays with it,
//!   nothing is lost), the receive buffer offers a smaller window (RFC 9293 §3.8.6: the window follows the
//!   buffer space; the right edge already advertised never moves back, SHLD-14) and drops a segment it
//!   cannot store, unacknowledged, so the peer retransmits it (RFC 9293 §3.8.6: "if more data arrives than
//!   can be accepted, it will be discarded"). Bytes acknowledged or SACKed are never dropped. When memory is
//!   given back, the table tells the connections the budget held down ([`TcpBudget::releases`]): a window
//!   update goes out, and a cut-short sender is WRITABLE again.
//! - Connections: the table holds at most [`TcpLimits::max_connections`] (TIME-WAIT included); past it, a
//!   SYN for a listening address is answered with a reset and an active open fails with
//!   INSUFFICIENT_RESOURCES (`table.rs` says why a reset rather than silence).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Which buffers a ring's memory counts against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pool {
    /// Send buffers: at most half of the bound together.
    Send,
    /// Receive buffers: whatever the bound leaves.
    Receive,
}

/// The bounds of a [`TcpBudget`] (soft-rdmad's `--max-tcp-buffer-bytes` and `--max-tcp-connections`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpLimits {
    /// Bytes of send and receive buffer memory all connections may hold together.
    pub max_buffer_bytes: u64,
    /// Connections held at once, in any state (SYN-RECEIVED and TIME-WAIT included).
    pub max_connections: usize,
}

impl TcpLimits {
    /// No bound on memory (each connection's rings still have their sizes), `max_connections` connections.
    pub fn connections_only(max_connections: usize) -> TcpLimits {
        TcpLimits {
            max_buffer_bytes: u64::MAX,
            max_connections,
        }
    }
}

/// One pool of a budget, as the rings charge it: one for all send buffers, one for all receive buffers
/// (a ring holds a pointer to it, no more).
#[derive(Debug)]
pub struct PoolBudget {
    budget: Arc<TcpBudget>,
    pool: Pool,
}

impl PoolBudget {
    pub(super) fn headroom(&self) -> usize {
        self.budget.headroom(self.pool)
    }

    pub(super) fn try_charge(&self, n: usize) -> bool {
        self.budget.try_charge(n, self.pool)
    }

    pub(super) fn force_charge(&self, n: usize) {
        self.budget.force_charge(n, self.pool)
    }

    pub(super) fn credit(&self, n: usize) {
        self.budget.credit(n, self.pool)
    }

    pub(super) fn count_memory_limited(&self) {
        self.budget.count_memory_limited()
    }
}

/// A budget's two pools, for a connection's two buffers ([`TcpBudget::pools`]).
#[derive(Clone, Debug)]
pub struct BufferPools {
    pub(super) send: Arc<PoolBudget>,
    pub(super) receive: Arc<PoolBudget>,
}

/// See the module doc.
#[derive(Debug)]
pub struct TcpBudget {
    limits: TcpLimits,
    buffer_bytes: AtomicU64,
    /// The part of `buffer_bytes` send buffers hold.
    send_bytes: AtomicU64,
    /// The most `buffer_bytes` has been.
    peak_buffer_bytes: AtomicU64,
    connections: AtomicU64,
    /// Times memory was given back (a ring released or dropped): a change tells the table to retry the
    /// connections the budget held down.
    releases: AtomicU64,
    refused_syns: AtomicU64,
    refused_connects: AtomicU64,
    /// Times a ring could not grow as far as it needed (a send cut short, a window held down, a segment
    /// dropped).
    memory_limited: AtomicU64,
}

impl TcpBudget {
    pub fn new(limits: TcpLimits) -> TcpBudget {
        TcpBudget {
            limits,
            buffer_bytes: AtomicU64::new(0),
            send_bytes: AtomicU64::new(0),
            peak_buffer_bytes: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            releases: AtomicU64::new(0),
            refused_syns: AtomicU64::new(0),
            refused_connects: AtomicU64::new(0),
            memory_limited: AtomicU64::new(0),
        }
    }

    pub fn limits(&self) -> TcpLimits {
        self.limits
    }

    /// Handles on the two pools, for connections to charge ([`super::Connection::set_budget`]).
    pub fn pools(self: &Arc<Self>) -> BufferPools {
        let pool = |pool| {
            Arc::new(PoolBudget {
                budget: self.clone(),
                pool,
            })
        };
        BufferPools {
            send: pool(Pool::Send),
            receive: pool(Pool::Receive),
        }
    }

    /// Bytes of buffer memory held by all connections.
    pub fn buffer_bytes(&self) -> u64 {
        self.buffer_bytes.load(Relaxed)
    }

    /// Connections held.
    pub fn connections(&self) -> u64 {
        self.connections.load(Relaxed)
    }

    /// The send buffers' share of the bound.
    fn max_send_bytes(&self) -> u64 {
        self.limits.max_buffer_bytes / 2
    }

    /// Bytes that may still be charged to `pool`.
    pub(super) fn headroom(&self, pool: Pool) -> usize {
        let mut left = self.limits.max_buffer_bytes.saturating_sub(self.buffer_bytes());
        if pool == Pool::Send {
            left = left.min(
                self.max_send_bytes()
                    .saturating_sub(self.send_bytes.load(Relaxed)),
            );
        }
        usize::try_from(left).unwrap_or(usize::MAX)
    }

    /// Charge `n` bytes to `pool` if they fit under the bound (and the send buffers' share); false
    /// (nothing charged) otherwise.
    pub(super) fn try_charge(&self, n: usize, pool: Pool) -> bool {
        let n = n as u64;
        let add_within = |max: u64| move |held: u64| held.checked_add(n).filter(|&t| t <= max);
        if pool == Pool::Send
            && self
                .send_bytes
                .fetch_update(Relaxed, Relaxed, add_within(self.max_send_bytes()))
                .is_err()
        {
            return false;
        }
        match self
            .buffer_bytes
            .fetch_update(Relaxed, Relaxed, add_within(self.limits.max_buffer_bytes))
        {
            Ok(before) => {
                self.peak_buffer_bytes.fetch_max(before + n, Relaxed);
                true
            }
            Err(_) => {
                if pool == Pool::Send {
                    self.send_bytes.fetch_sub(n, Relaxed);
                }
                false
            }
        }
    }

    /// Charge `n` bytes already held, past the bound or not (a ring that comes under this budget).
    pub(super) fn force_charge(&self, n: usize, pool: Pool) {
        if pool == Pool::Send {
            self.send_bytes.fetch_add(n as u64, Relaxed);
        }
        let after = self
            .buffer_bytes
            .fetch_add(n as u64, Relaxed)
            .saturating_add(n as u64);
        self.peak_buffer_bytes.fetch_max(after, Relaxed);
    }

    /// Give back `n` bytes charged to `pool` before.
    pub(super) fn credit(&self, n: usize, pool: Pool) {
        if n == 0 {
            return;
        }
        let less = |held: u64| Some(held.saturating_sub(n as u64));
        if pool == Pool::Send {
            let _ = self.send_bytes.fetch_update(Relaxed, Relaxed, less);
        }
        let _ = self.buffer_bytes.fetch_update(Relaxed, Relaxed, less);
        self.releases.fetch_add(1, Relaxed);
    }

    /// `--xdp-tcp smoltcp`: one socket of smoltcp's stack, a connection or a listening slot, whose buffers
    /// (`receive` and `send` bytes) are allocated whole when it is made and kept until it goes. It is
    /// charged whole, as one connection, for its life: false (nothing charged) past either bound. A daemon
    /// runs one of the two stacks, never both, so the own TCP's table (which counts its connections itself)
    /// and these never share a budget.
    pub fn try_open_fixed(&self, receive: usize, send: usize) -> bool {
        let max = self.limits.max_connections as u64;
        if self
            .connections
            .fetch_update(Relaxed, Relaxed, |n| (n < max).then_some(n + 1))
            .is_err()
        {
            return false;
        }
        if !self.try_charge(send, Pool::Send) {
            self.connections.fetch_sub(1, Relaxed);
            return false;
        }
        if !self.try_charge(receive, Pool::Receive) {
            self.credit(send, Pool::Send);
            self.connections.fetch_sub(1, Relaxed);
            return false;
        }
        true
    }

    /// A socket [`TcpBudget::try_open_fixed`] charged is gone.
    pub fn close_fixed(&self, receive: usize, send: usize) {
        self.credit(receive, Pool::Receive);
        self.credit(send, Pool::Send);
        let _ = self
            .connections
            .fetch_update(Relaxed, Relaxed, |n| Some(n.saturating_sub(1)));
    }

    /// How many times memory was given back so far.
    pub(super) fn releases(&self) -> u64 {
        self.releases.load(Relaxed)
    }

    pub(super) fn set_connections(&self, n: usize) {
        self.connections.store(n as u64, Relaxed);
    }

    pub(super) fn count_refused_syn(&self) {
        self.refused_syns.fetch_add(1, Relaxed);
    }

    /// An active open refused by the bounds (the own TCP's table, or `--xdp-tcp smoltcp`'s stack).
    pub fn count_refused_connect(&self) {
        self.refused_connects.fetch_add(1, Relaxed);
    }

    pub(super) fn count_memory_limited(&self) {
        self.memory_limited.fetch_add(1, Relaxed);
    }

    /// Times a ring could not grow as far as it needed for want of budget.
    pub fn memory_limited(&self) -> u64 {
        self.memory_limited.load(Relaxed)
    }

    /// SYNs (and, with SYN cookies, handshake ACKs) refused because the connection bound was reached.
    pub fn refused_syns(&self) -> u64 {
        self.refused_syns.load(Relaxed)
    }

    /// The figures by name, for `soft-rdma status`.
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("tcp_connections", self.connections()),
            ("tcp_max_connections", self.limits.max_connections as u64),
            ("tcp_refused_syns", self.refused_syns()),
            ("tcp_refused_connects", self.refused_connects.load(Relaxed)),
            ("tcp_buffer_bytes", self.buffer_bytes()),
            ("tcp_send_buffer_bytes", self.send_bytes.load(Relaxed)),
            ("tcp_peak_buffer_bytes", self.peak_buffer_bytes.load(Relaxed)),
            ("tcp_max_buffer_bytes", self.limits.max_buffer_bytes),
            ("tcp_memory_limited", self.memory_limited()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_sockets_are_charged_whole_and_refused_past_either_bound() {
        let b = TcpBudget::new(TcpLimits {
            max_buffer_bytes: 1000,
            max_connections: 3,
        });
        // 300 + 200 each: two fit the memory bound (1000), the third does not; nothing is charged for it.
        assert!(b.try_open_fixed(300, 200));
        assert!(b.try_open_fixed(300, 200));
        assert!(!b.try_open_fixed(300, 200));
        assert_eq!((b.connections(), b.buffer_bytes()), (2, 1000));
        b.close_fixed(300, 200);
        assert_eq!((b.connections(), b.buffer_bytes()), (1, 500));
        // The connection bound: three small ones, then no more.
        assert!(b.try_open_fixed(1, 1));
        assert!(b.try_open_fixed(1, 1));
        assert!(!b.try_open_fixed(1, 1));
        assert_eq!((b.connections(), b.buffer_bytes()), (3, 504));
        // The send buffers' half: 600 of send is past it, and the receive part is not kept either.
        let c = TcpBudget::new(TcpLimits {
            max_buffer_bytes: 1000,
            max_connections: 10,
        });
        assert!(!c.try_open_fixed(10, 600));
        assert_eq!((c.connections(), c.buffer_bytes()), (0, 0));
    }

    #[test]
    fn charges_stop_at_the_bound_and_credits_count_as_releases() {
        let b = TcpBudget::new(TcpLimits {
            max_buffer_bytes: 10_000,
            max_connections: 1,
        });
        assert!(b.try_charge(6000, Pool::Receive));
        assert!(
            !b.try_charge(4001, Pool::Receive),
            "past the bound: nothing charged"
        );
        assert_eq!(b.buffer_bytes(), 6000);
        assert_eq!(b.headroom(Pool::Receive), 4000);
        assert!(b.try_charge(4000, Pool::Receive));
        assert_eq!(b.headroom(Pool::Receive), 0);
        assert_eq!(b.releases(), 0);
        b.credit(3000, Pool::Receive);
        assert_eq!((b.buffer_bytes(), b.releases()), (7000, 1));
        b.credit(0, Pool::Receive);
        assert_eq!(b.releases(), 1, "nothing given back, no release");
        let figures: std::collections::HashMap<_, _> = b.counters().into_iter().collect();
        assert_eq!(figures["tcp_buffer_bytes"], 7000);
        assert_eq!(figures["tcp_peak_buffer_bytes"], 10_000);
        assert_eq!(figures["tcp_max_buffer_bytes"], 10_000);
    }

    /// Send buffers stop at half the bound; receive buffers can still have the rest.
    #[test]
    fn send_buffers_take_at_most_half() {
        let b = TcpBudget::new(TcpLimits {
            max_buffer_bytes: 10_000,
            max_connections: 1,
        });
        assert!(b.try_charge(4000, Pool::Send));
        assert_eq!(b.headroom(Pool::Send), 1000);
        assert!(!b.try_charge(1001, Pool::Send));
        assert_eq!(
            b.buffer_bytes(),
            4000,
            "a refused send charge leaves nothing behind"
        );
        assert!(b.try_charge(1000, Pool::Send));
        assert_eq!(b.headroom(Pool::Receive), 5000);
        assert!(b.try_charge(4500, Pool::Receive));
        b.credit(2000, Pool::Send);
        assert!(b.try_charge(2000, Pool::Receive));
        // The bound, not the share, stops this one: nothing is left behind in the send share either.
        assert_eq!(b.headroom(Pool::Send), 500);
        assert!(!b.try_charge(1000, Pool::Send));
        let figures: std::collections::HashMap<_, _> = b.counters().into_iter().collect();
        assert_eq!(figures["tcp_send_buffer_bytes"], 3000);
        assert_eq!(figures["tcp_buffer_bytes"], 9500);
    }

    #[test]
    fn an_unbounded_budget_never_refuses() {
        let b = TcpBudget::new(TcpLimits::connections_only(4));
        assert!(b.try_charge(usize::MAX / 2, Pool::Receive));
        assert!(b.try_charge(usize::MAX / 4, Pool::Send));
        assert_eq!(b.limits().max_connections, 4);
    }
}
