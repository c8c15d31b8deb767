//! The consuming end of one ring: reads published entries, releases their slots, and sleeps only after
//! telling the producer (the need-wakeup protocol described in [`super::producer`]).
//!
//! The consumer owns the consumer index: it keeps its own copy and only stores it. It reads the producer's
//! index once per poll and checks it: more entries than the ring holds (or an index that moved backwards,
//! which looks the same in wrapping arithmetic) is [`RingError::ProducerIndex`]. Entries are copied out
//! before their slots are released, so the producer may overwrite a slot only once its copy is taken.

use std::marker::PhantomData;
use std::sync::atomic::{Ordering, fence};

use super::RingError;
use super::shared::{RingEntry, RingView, Word};

/// The consuming end of a ring of `E`.
#[derive(Debug)]
pub struct Consumer<E> {
    view: RingView,
    /// Entries consumed so far (free-running): the consumer index.
    tail: u32,
    _entries: PhantomData<E>,
}

/// What [`Consumer::poll`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Polled {
    /// Entries taken.
    pub taken: u32,
    /// Published entries left in the ring (past `max`).
    pub left: u32,
    /// The producer is waiting for room: ring its room doorbell.
    pub wake_producer: bool,
}

impl<E: RingEntry> Consumer<E> {
    /// The consuming end of the ring in `view`, starting at index `start` (0 for a fresh ring). Stores
    /// `start` as the consumer index.
    pub fn new(view: RingView, start: u32) -> Result<Self, RingError> {
        view.expect_entry_size(E::SIZE)?;
        view.store(Word::ConsumerIndex, start, Ordering::Release);
        Ok(Consumer {
            view,
            tail: start,
            _entries: PhantomData,
        })
    }

    pub fn capacity(&self) -> u32 {
        self.view.geometry().capacity()
    }

    /// The consumer index: entries taken so far (free-running).
    pub fn index(&self) -> u32 {
        self.tail
    }

    /// Published entries waiting, read from the producer's index and checked against the capacity.
    pub fn available(&self) -> Result<u32, RingError> {
        let producer = self.view.load(Word::ProducerIndex, Ordering::Acquire);
        let ready = producer.wrapping_sub(self.tail);
        if ready > self.capacity() {
            return Err(RingError::ProducerIndex {
                producer,
                consumer: self.tail,
                capacity: self.capacity(),
            });
        }
        Ok(ready)
    }

    /// Takes up to `max` published entries: hands each to `take` with its free-running index, in order,
    /// then releases their slots. If `take` fails, that entry and the ones after it stay in the ring (not
    /// released) and the error is returned.
    pub fn poll<X>(
        &mut self,
        max: u32,
        mut take: impl FnMut(u32, E) -> Result<(), X>,
    ) -> Result<Polled, PollError<X>> {
        let ready = self.available().map_err(PollError::Ring)?;
        let n = ready.min(max);
        let mut result = Ok(());
        let mut taken = 0;
        while taken < n {
            let index = self.tail.wrapping_add(taken);
            let entry = self.view.read_entry::<E>(index);
            if let Err(e) = take(index, entry) {
                result = Err(PollError::Entry(e));
                break;
            }
            taken += 1;
        }
        let wake_producer = self.release(taken);
        result.map(|()| Polled {
            taken,
            left: ready - taken,
            wake_producer,
        })
    }

    /// Gives `n` slots back to the producer; true when it waits for room.
    fn release(&mut self, n: u32) -> bool {
        if n == 0 {
            return false;
        }
        self.tail = self.tail.wrapping_add(n);
        self.view.store(Word::ConsumerIndex, self.tail, Ordering::Release);
        // Pairs with the producer's fence in `Producer::prepare_sleep`.
        fence(Ordering::SeqCst);
        self.view.load(Word::ProducerNeedsWakeup, Ordering::Relaxed) != 0
    }

    /// Going to sleep: sets the consumer's need-wakeup flag, then re-reads the producer's index. Ok(true):
    /// still empty, sleep on the doorbell; Ok(false): entries arrived meanwhile, the flag is cleared again.
    pub fn prepare_sleep(&mut self) -> Result<bool, RingError> {
        self.view.store(Word::ConsumerNeedsWakeup, 1, Ordering::Relaxed);
        // Pairs with the producer's fence in `Producer::publish`.
        fence(Ordering::SeqCst);
        if self.available()? > 0 {
            self.awake();
            return Ok(false);
        }
        Ok(true)
    }

    #[cfg(test)]
    pub(super) fn view_for_tests(&self) -> &RingView {
        &self.view
    }

    /// Woken (or polling again): clears the consumer's need-wakeup flag, so the producer stops ringing.
    pub fn awake(&mut self) {
        self.view.store(Word::ConsumerNeedsWakeup, 0, Ordering::Relaxed);
    }
}

/// Why [`Consumer::poll`] stopped: the ring's header, or the caller's verdict on an entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PollError<X> {
    Ring(RingError),
    Entry(X),
}
