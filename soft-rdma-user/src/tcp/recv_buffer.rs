//! The receive buffer: a ring (`ring.rs`: memory grows on demand up to its size) holding in-order bytes the
//! application has not read, and out-of-order ranges waiting for the gaps before them (RFC 9293 §3.10.7.4,
//! "seventh, process the segment text"; RFC 9293 §3.8.6.3 on queuing out-of-order data), from which the
//! SACK blocks of RFC 2018 §4 are produced. The number of out-of-order ranges is bounded; a segment that
//! would open one more is dropped (the sender retransmits it). So is the part of a segment the daemon's
//! buffer budget (`budget.rs`) gives no memory for: nothing stored is ever dropped, and what is not stored
//! is not acknowledged.

use std::sync::Arc;

use super::budget::PoolBudget;
use super::ring::Ring;
use super::seq::Seq;

/// Capacity kept when the out-of-order ranges are gone; a larger one is given back.
const IDLE_RANGES: usize = 16;

#[derive(Clone, Copy, Debug)]
struct OooRange {
    /// Offset of the first byte from RCV.NXT.
    start: u32,
    end: u32,
    /// When the range last grew, for RFC 2018 §4's "most recently received first".
    stamp: u32,
}

/// In-order unread bytes, then the receive window with its out-of-order ranges.
#[derive(Debug)]
pub struct RecvBuffer {
    /// In-order bytes from offset 0, the window after them.
    ring: Ring,
    readable: usize,
    ooo: Vec<OooRange>,
    max_ranges: usize,
    clock: u32,
}

impl RecvBuffer {
    pub fn new(capacity: usize, max_ranges: usize) -> Self {
        RecvBuffer {
            ring: Ring::new(capacity),
            readable: 0,
            ooo: Vec::new(),
            max_ranges,
            clock: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.ring.capacity()
    }

    /// Bytes of memory held.
    pub fn allocated(&self) -> usize {
        self.ring.allocated()
    }

    /// Charge the memory to `budget` from now on.
    pub fn set_budget(&mut self, budget: Arc<PoolBudget>) {
        self.ring.set_budget(budget);
    }

    /// The part of [`Self::window`] the memory held, and what the budget lets the ring grow by, can store:
    /// the window to offer under the budget.
    pub fn memory_window(&self) -> usize {
        self.ring.growable().saturating_sub(self.readable)
    }

    /// Give the memory back if it holds nothing (no unread or out-of-order bytes).
    pub fn release_if_empty(&mut self) {
        if self.readable == 0 && self.ooo.is_empty() {
            self.ring.release();
        }
    }

    /// Bytes the application can read.
    pub fn readable(&self) -> usize {
        self.readable
    }

    /// Free space after the in-order bytes: the receive window (RCV.WND, RFC 9293 §3.3.1).
    pub fn window(&self) -> usize {
        self.ring.capacity() - self.readable
    }

    pub fn has_out_of_order(&self) -> bool {
        !self.ooo.is_empty()
    }

    /// Place `data` at `offset` bytes past RCV.NXT (the caller trimmed it to the window). Returns how far
    /// RCV.NXT advances (0 when the data is out of order, or dropped because the range bound is reached).
    /// Past the memory the budget gives, only the part that fits is stored.
    pub fn write(&mut self, offset: usize, data: &[u8]) -> usize {
        let n = data.len().min(self.window().saturating_sub(offset));
        if n == 0 {
            return 0;
        }
        let at = self.readable + offset;
        let n = n.min(self.ring.grow(at + n).saturating_sub(at));
        if n == 0 {
            return 0;
        }
        let (start, end) = (offset as u32, (offset + n) as u32);
        // Merge with every range it touches or overlaps.
        let mut merged = OooRange {
            start,
            end,
            stamp: self.clock,
        };
        let touching = |r: &OooRange| r.start <= end && start <= r.end;
        let opens_new = offset > 0 && !self.ooo.iter().any(touching);
        if opens_new && self.ooo.len() >= self.max_ranges {
            return 0;
        }
        self.clock = self.clock.wrapping_add(1);
        self.ring.write(at, &data[..n]);
        self.ooo.retain(|r| {
            if touching(r) {
                merged.start = merged.start.min(r.start);
                merged.end = merged.end.max(r.end);
                false
            } else {
                true
            }
        });
        if merged.start > 0 {
            let pos = self.ooo.partition_point(|r| r.start < merged.start);
            self.ooo.insert(pos, merged);
            return 0;
        }
        let advance = merged.end;
        self.readable += advance as usize;
        for r in &mut self.ooo {
            r.start -= advance;
            r.end -= advance;
        }
        if self.ooo.is_empty() && self.ooo.capacity() > IDLE_RANGES {
            self.ooo.shrink_to(IDLE_RANGES);
        }
        advance as usize
    }

    /// Read in-order bytes into `out`; returns how many.
    pub fn read(&mut self, out: &mut [u8]) -> usize {
        let n = out.len().min(self.readable);
        self.ring.read(0, &mut out[..n]);
        self.ring.advance(n);
        self.readable -= n;
        n
    }

    /// Up to four SACK blocks for RCV.NXT = `rcv_nxt`, the most recently changed range first, the others
    /// by recency (RFC 2018 §4). Returns the blocks and their count.
    pub fn sack_blocks(&self, rcv_nxt: Seq) -> ([(Seq, Seq); 4], u8) {
        let mut picked: [Option<&OooRange>; 4] = [None; 4];
        for r in &self.ooo {
            let mut candidate = r;
            for slot in picked.iter_mut() {
                match slot {
                    None => {
                        *slot = Some(candidate);
                        break;
                    }
                    Some(p) if candidate.stamp.wrapping_sub(p.stamp) as i32 > 0 => {
                        let older = *p;
                        *slot = Some(candidate);
                        candidate = older;
                    }
                    _ => {}
                }
            }
        }
        let mut blocks = [(Seq(0), Seq(0)); 4];
        let mut count = 0;
        for r in picked.into_iter().flatten() {
            blocks[count] = (rcv_nxt + r.start, rcv_nxt + r.end);
            count += 1;
        }
        (blocks, count as u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_data_is_readable_at_once() {
        let mut b = RecvBuffer::new(16, 4);
        assert_eq!(b.write(0, b"hello"), 5);
        let mut out = [0u8; 16];
        assert_eq!(b.read(&mut out), 5);
        assert_eq!(&out[..5], b"hello");
        assert_eq!(b.window(), 16);
    }

    #[test]
    fn gaps_fill_in_any_order_and_overlaps_count_once() {
        let mut b = RecvBuffer::new(32, 4);
        assert_eq!(b.write(6, b"ghi"), 0);
        assert_eq!(b.write(3, b"def"), 0);
        assert_eq!(b.write(4, b"ef"), 0);
        assert_eq!(b.write(12, b"mno"), 0);
        assert_eq!(b.write(0, b"abc"), 9);
        assert_eq!(b.readable(), 9);
        // The range at 12..15 is now at 3..6 past the new RCV.NXT.
        assert_eq!(b.write(0, b"jkl"), 6);
        let mut out = [0u8; 32];
        assert_eq!(b.read(&mut out), 15);
        assert_eq!(&out[..15], b"abcdefghijklmno");
        assert!(!b.has_out_of_order());
    }

    #[test]
    fn data_beyond_the_window_is_cut() {
        let mut b = RecvBuffer::new(4, 4);
        assert_eq!(b.write(0, b"abcdef"), 4);
        assert_eq!(b.window(), 0);
        assert_eq!(b.write(0, b"x"), 0);
    }

    #[test]
    fn range_bound_drops_a_segment_that_would_open_one_more() {
        let mut b = RecvBuffer::new(64, 2);
        b.write(2, b"a");
        b.write(4, b"b");
        assert_eq!(b.write(8, b"c"), 0);
        let (_, count) = b.sack_blocks(Seq(0));
        assert_eq!(count, 2);
        // Extending an existing range is still accepted.
        b.write(5, b"b");
        let (blocks, _) = b.sack_blocks(Seq(100));
        assert_eq!(blocks[0], (Seq(104), Seq(106)));
    }

    #[test]
    fn sack_blocks_put_the_most_recent_first() {
        let mut b = RecvBuffer::new(64, 8);
        b.write(10, b"x");
        b.write(20, b"y");
        b.write(30, b"z");
        b.write(11, b"x");
        let (blocks, count) = b.sack_blocks(Seq(1000));
        assert_eq!(count, 3);
        assert_eq!(blocks[0], (Seq(1010), Seq(1012)));
        assert_eq!(blocks[1], (Seq(1030), Seq(1031)));
        assert_eq!(blocks[2], (Seq(1020), Seq(1021)));
    }
}
