//! The send buffer: the bytes the application queued and the peer has not yet acknowledged
//! (RFC 9293 §3.3.1: the region from SND.UNA onwards), in a [`Ring`] whose memory grows with what is
//! queued and is given back when the connection sits idle. Under the daemon's buffer budget
//! (`budget.rs`) it may take fewer bytes than it has room for: the caller keeps the rest.

use std::sync::Arc;

use super::budget::PoolBudget;
use super::ring::Ring;

/// Bytes from the oldest unacknowledged one to the last one queued.
#[derive(Debug)]
pub struct SendBuffer {
    ring: Ring,
    len: usize,
}

impl SendBuffer {
    pub fn new(capacity: usize) -> Self {
        SendBuffer {
            ring: Ring::new(capacity),
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn free(&self) -> usize {
        self.ring.capacity() - self.len
    }

    /// Bytes of memory held.
    pub fn allocated(&self) -> usize {
        self.ring.allocated()
    }

    /// Charge the memory to `budget` from now on.
    pub fn set_budget(&mut self, budget: Arc<PoolBudget>) {
        self.ring.set_budget(budget);
    }

    /// Queue as much of `data` as fits, in the buffer's size and in the memory the budget lets it hold;
    /// returns how much.
    pub fn push(&mut self, data: &[u8]) -> usize {
        let n = data.len().min(self.free());
        let n = self.ring.write(self.len, &data[..n]);
        self.len += n;
        n
    }

    /// Copy the bytes at `offset` from the oldest one into `out`, as many as `out` holds and the buffer
    /// has; returns how many.
    pub fn copy_out(&self, offset: usize, out: &mut [u8]) -> usize {
        if offset >= self.len {
            return 0;
        }
        let n = out.len().min(self.len - offset);
        self.ring.read(offset, &mut out[..n]);
        n
    }

    /// Drop the `n` oldest bytes (acknowledged).
    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.len);
        self.ring.advance(n);
        self.len -= n;
    }

    /// Give the memory back if nothing is queued.
    pub fn release_if_empty(&mut self) {
        if self.len == 0 {
            self.ring.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SendBuffer;

    #[test]
    fn push_copy_consume_across_the_wrap() {
        let mut b = SendBuffer::new(8);
        assert_eq!(b.push(b"abcdef"), 6);
        b.consume(4);
        assert_eq!(b.push(b"ghijklmn"), 6);
        assert_eq!(b.free(), 0);
        let mut out = [0u8; 8];
        assert_eq!(b.copy_out(0, &mut out), 8);
        assert_eq!(&out, b"efghijkl");
        assert_eq!(b.copy_out(5, &mut out[..2]), 2);
        assert_eq!(&out[..2], b"jk");
        assert_eq!(b.copy_out(8, &mut out), 0);
        b.consume(100);
        assert_eq!(b.len(), 0);
        b.release_if_empty();
        assert_eq!(b.allocated(), 0);
        assert_eq!(b.free(), 8);
    }
}
