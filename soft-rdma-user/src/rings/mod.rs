//! Shared-memory work and completion queues between the client library and soft-rdmad (issue 17).
//!
//! A ring is a single-producer/single-consumer queue of fixed-size entries in a sealed memfd that both
//! processes map `MAP_SHARED` ([`crate::shm::SharedMemory`]). Per queue pair a send ring and a receive ring
//! (the client produces, the daemon consumes: [`qp`]); per completion queue a completion ring (the daemon
//! produces, the client consumes: [`cq`]). Doorbells are eventfds ([`doorbell`]), rung only when the other
//! side said it is going to sleep (the need-wakeup flags in the shared header), so neither side makes a
//! system call while the other is awake and polling. A bounded spin before sleeping ([`SpinConfig`]) is
//! off by default.
//!
//! The parts, one role per file:
//! - [`shared`]: one ring's place in a mapping: header layout, geometry, and the only code that touches the
//!   shared bytes (atomic loads and stores of whole words; no reference to shared data is handed out).
//! - [`entries`]: the entry encodings (zerocopy, little-endian): send, receive and completion entries, and
//!   their checked conversion to and from [`WorkRequest`](crate::engine::verbs::WorkRequest) and
//!   [`Completion`](crate::engine::verbs::Completion).
//! - [`producer`], [`consumer`]: the two ends of one ring (indices, need-wakeup protocol).
//! - [`qp`]: a queue pair's two rings: the client's writer, and the daemon's reader, a sans-IO consumer fed
//!   the mapping that returns validated work requests (no tokio: it can run on any thread).
//! - [`cq`]: a completion queue's ring: the daemon's writer (with an ordered overflow), the client's reader.
//! - [`doorbell`]: eventfd doorbells.
//!
//! Trust: the daemon treats everything in a client's mapping as untrusted input. It keeps its own copy of
//! the geometry and of the index it owns, reads the other side's index once per poll and checks it against
//! the ring's capacity, copies entries out word by word and validates them; every malformation is a
//! [`RingError`] (the queue pair goes to Error with its status), never a panic or a read outside the mapping.

pub mod consumer;
pub mod cq;
pub mod doorbell;
pub mod entries;
pub mod producer;
pub mod qp;
pub mod shared;
#[cfg(test)]
mod tests;

use crate::error::{Error, NdStatus};

/// Everything that can be wrong with a ring or one of its entries. Each malformation is its own variant.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// The geometry asked for, or the mapping given, cannot hold the ring.
    #[error("ring geometry: {0}")]
    Geometry(String),
    /// The producer's index in the shared header is further ahead of the consumer than the ring holds.
    #[error(
        "producer index {producer}: {} entries past the consumer index {consumer} (capacity {capacity})",
        producer.wrapping_sub(*consumer)
    )]
    ProducerIndex {
        producer: u32,
        consumer: u32,
        capacity: u32,
    },
    /// The consumer's index in the shared header is ahead of the producer's published index, or behind
    /// where the consumer already was.
    #[error(
        "consumer index {consumer}: moved back, or past the producer index {producer} (capacity {capacity})"
    )]
    ConsumerIndex {
        producer: u32,
        consumer: u32,
        capacity: u32,
    },
    /// The ring has no free entry.
    #[error("the ring is full ({capacity} entries)")]
    Full { capacity: u32 },
    #[error("unknown opcode {0}")]
    Opcode(u8),
    #[error("unknown flag bits {0:#04x}")]
    Flags(u8),
    #[error("reserved bytes are not zero")]
    Reserved,
    #[error("{count} SGEs, at most {max}")]
    SgeCount { count: u32, max: u32 },
    #[error("an RDMA Read has {0} sink SGEs; exactly 1 expected")]
    ReadSink(u8),
    #[error("the SGEs total {total} bytes, more than {max}")]
    Length { total: u64, max: u32 },
    #[error("unknown completion status {0:#010x}")]
    Status(u32),
    #[error("unknown completion op {0}")]
    CompletionOp(u8),
}

impl RingError {
    /// The ND status of this error: a full ring is INSUFFICIENT_RESOURCES; a bad geometry or a malformed
    /// header or entry is INVALID_PARAMETER.
    pub fn status(&self) -> NdStatus {
        match self {
            RingError::Full { .. } => NdStatus::InsufficientResources,
            _ => NdStatus::InvalidParameter,
        }
    }
}

/// Which ring an error was found in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingKind {
    Send,
    Receive,
    Completion,
}

/// A ring that cannot be used any more: which ring, which entry (its free-running index, when an entry was
/// at fault rather than the header) and what was wrong. The daemon moves the queue pair to Error with
/// [`RingFault::status`] and logs [`RingFault::to_error`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{ring:?} ring{}: {error}", entry.map(|e| format!(" entry {e}")).unwrap_or_default())]
pub struct RingFault {
    pub ring: RingKind,
    pub entry: Option<u32>,
    pub error: RingError,
}

impl RingFault {
    pub fn status(&self) -> NdStatus {
        self.error.status()
    }

    pub fn to_error(&self) -> Error {
        Error::new(self.status(), self.to_string())
    }
}

impl From<RingError> for Error {
    fn from(e: RingError) -> Error {
        Error::new(e.status(), e.to_string())
    }
}

/// How long one side polls its ring before it sets its need-wakeup flag and sleeps on its doorbell:
/// `spins` rounds of [`std::hint::spin_loop`] and a re-check. 0 (the default) sleeps at once, which suits a
/// machine with few cores, where a spinning side takes the core the other side needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpinConfig {
    pub spins: u32,
}

impl SpinConfig {
    /// Calls `ready` until it returns true or `spins` rounds have passed; returns what it last returned.
    /// With `spins == 0`, calls it once.
    pub fn spin_until(self, mut ready: impl FnMut() -> bool) -> bool {
        if ready() {
            return true;
        }
        for _ in 0..self.spins {
            std::hint::spin_loop();
            if ready() {
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod spin_tests {
    use super::SpinConfig;

    #[test]
    fn spin_until_polls_once_plus_the_spins_and_stops_when_ready() {
        for (spins, ready_at, calls, ready) in [
            (0, 99, 1, false),
            (3, 99, 4, false),
            (3, 2, 2, true),
            (0, 1, 1, true),
        ] {
            let mut n = 0;
            let got = SpinConfig { spins }.spin_until(|| {
                n += 1;
                n >= ready_at
            });
            assert_eq!(
                (n, got),
                (calls, ready),
                "spins {spins}, ready at call {ready_at}"
            );
        }
        assert_eq!(SpinConfig::default().spins, 0, "off by default");
    }
}
