//! The producing end of one ring: writes entries, publishes them, and says when the consumer must be woken.
//!
//! The producer owns the producer index: it keeps its own copy and only stores it, never trusting what the
//! shared word holds. It reads the consumer's index to learn how much room there is and checks it: a
//! consumer index that is ahead of what was published, or behind what it had already taken, is
//! [`RingError::ConsumerIndex`].
//!
//! Wakeups (the need-wakeup protocol, as AF_XDP's): after publishing, the producer looks at the consumer's
//! need-wakeup flag and rings the doorbell only if it is set. The consumer sets the flag, then re-reads the
//! producer index before sleeping; a sequentially consistent fence on each side between the store and the
//! load means at least one of them sees the other's store, so a published entry never sits unnoticed beside
//! a sleeping consumer.

use std::marker::PhantomData;
use std::sync::atomic::{Ordering, fence};

use super::RingError;
use super::shared::{RingEntry, RingView, Word};

/// The producing end of a ring of `E`.
#[derive(Debug)]
pub struct Producer<E> {
    view: RingView,
    /// Entries written so far (free-running), published or not.
    head: u32,
    /// Entries published (stored in the shared producer index).
    published: u32,
    /// The consumer index last read (checked).
    consumer: u32,
    _entries: PhantomData<E>,
}

impl<E: RingEntry> Producer<E> {
    /// The producing end of the ring in `view`, starting at index `start` (0 for a fresh ring; both ends must
    /// agree). Stores `start` as the producer index.
    pub fn new(view: RingView, start: u32) -> Result<Self, RingError> {
        view.expect_entry_size(E::SIZE)?;
        view.store(Word::ProducerIndex, start, Ordering::Release);
        Ok(Producer {
            view,
            head: start,
            published: start,
            consumer: start,
            _entries: PhantomData,
        })
    }

    pub fn capacity(&self) -> u32 {
        self.view.geometry().capacity()
    }

    /// Reads and checks the consumer's index: it must lie between the index last read and
    /// the published index.
    fn refresh_consumer(&mut self) -> Result<(), RingError> {
        let consumer = self.view.load(Word::ConsumerIndex, Ordering::Acquire);
        // The consumer may only have taken what was published, and never less than it had already taken:
        // its index lies in [last read, published], a window of at most one ring.
        if consumer.wrapping_sub(self.consumer) > self.published.wrapping_sub(self.consumer) {
            return Err(RingError::ConsumerIndex {
                producer: self.published,
                consumer,
                capacity: self.capacity(),
            });
        }
        self.consumer = consumer;
        Ok(())
    }

    /// Free entries, reading the consumer's index.
    pub fn free(&mut self) -> Result<u32, RingError> {
        self.refresh_consumer()?;
        Ok(self.capacity() - self.head.wrapping_sub(self.consumer))
    }

    /// Writes `entry` (not yet visible to the consumer: [`Producer::publish`]). [`RingError::Full`] when no
    /// entry is free.
    pub fn push(&mut self, entry: &E) -> Result<(), RingError> {
        if self.head.wrapping_sub(self.consumer) >= self.capacity() && self.free()? == 0 {
            return Err(RingError::Full {
                capacity: self.capacity(),
            });
        }
        self.view.write_entry(self.head, entry);
        self.head = self.head.wrapping_add(1);
        Ok(())
    }

    /// Entries written and not yet published.
    pub fn unpublished(&self) -> u32 {
        self.head.wrapping_sub(self.published)
    }

    /// Makes every written entry visible to the consumer. True when the consumer asked to be woken: the
    /// caller rings its doorbell. No system call otherwise.
    pub fn publish(&mut self) -> bool {
        if self.head == self.published {
            return false;
        }
        self.published = self.head;
        self.view
            .store(Word::ProducerIndex, self.published, Ordering::Release);
        // Pairs with the consumer's fence in `Consumer::prepare_sleep` (see the module documentation).
        fence(Ordering::SeqCst);
        self.view.load(Word::ConsumerNeedsWakeup, Ordering::Relaxed) != 0
    }

    /// The ring is full and the producer is going to wait for room: sets the producer's need-wakeup flag and
    /// re-reads the consumer's index. Ok(true): still full, sleep on the room doorbell; Ok(false): room
    /// appeared, the flag is cleared again.
    pub fn prepare_sleep(&mut self) -> Result<bool, RingError> {
        self.view.store(Word::ProducerNeedsWakeup, 1, Ordering::Relaxed);
        // Pairs with the consumer's fence in `Consumer::release`.
        fence(Ordering::SeqCst);
        if self.free()? > 0 {
            self.view.store(Word::ProducerNeedsWakeup, 0, Ordering::Relaxed);
            return Ok(false);
        }
        Ok(true)
    }

    /// Woken (or done waiting): clears the producer's need-wakeup flag.
    pub fn awake(&mut self) {
        self.view.store(Word::ProducerNeedsWakeup, 0, Ordering::Relaxed);
    }
}
