//! The byte storage under the send and receive buffers: a ring addressed by offset from its oldest byte,
//! whose memory grows on demand up to the buffer's size and can be given back when the buffer is empty.
//! So a connection's memory follows what it holds, not what it may hold: an idle connection has none, and
//! thousands of connections fit in a daemon (issue 20: 16,384 of them, each allowed 1 MiB per direction).

/// Smallest allocation.
const MIN_ALLOC: usize = 4096;

/// See the module doc. Offsets are from the oldest byte (the head); the owner tracks which hold data.
#[derive(Debug)]
pub struct Ring {
    buf: Vec<u8>,
    head: usize,
    capacity: usize,
}

impl Ring {
    /// A ring of at most `capacity` bytes, nothing allocated yet.
    pub fn new(capacity: usize) -> Self {
        Ring {
            buf: Vec::new(),
            head: 0,
            capacity: capacity.max(1),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes of memory held.
    pub fn allocated(&self) -> usize {
        self.buf.len()
    }

    /// Make offsets below `len` (at most the capacity) addressable: grow, doubling, and lay the bytes out
    /// again from the start.
    fn reserve(&mut self, len: usize) {
        let old = self.buf.len();
        if len <= old {
            return;
        }
        let new = len
            .next_power_of_two()
            .max(MIN_ALLOC)
            .max(old * 2)
            .min(self.capacity);
        let mut grown = vec![0u8; new];
        let first = old - self.head;
        grown[..first].copy_from_slice(&self.buf[self.head..]);
        grown[first..old].copy_from_slice(&self.buf[..self.head]);
        self.buf = grown;
        self.head = 0;
    }

    /// Write `data` at `offset` (the caller keeps `offset + data.len()` within the capacity).
    pub fn write(&mut self, offset: usize, data: &[u8]) {
        let n = data.len();
        if n == 0 {
            return;
        }
        self.reserve(offset + n);
        let cap = self.buf.len();
        let at = (self.head + offset) % cap;
        let first = n.min(cap - at);
        self.buf[at..at + first].copy_from_slice(&data[..first]);
        self.buf[..n - first].copy_from_slice(&data[first..]);
    }

    /// Copy the bytes at `offset` into `out` (the caller reads only what it wrote).
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        let n = out.len();
        if n == 0 {
            return;
        }
        let cap = self.buf.len();
        let at = (self.head + offset) % cap;
        let first = n.min(cap - at);
        out[..first].copy_from_slice(&self.buf[at..at + first]);
        out[first..].copy_from_slice(&self.buf[..n - first]);
    }

    /// The `n` oldest bytes are gone.
    pub fn advance(&mut self, n: usize) {
        if !self.buf.is_empty() {
            self.head = (self.head + n) % self.buf.len();
        }
    }

    /// Give the memory back (the owner holds no bytes in it).
    pub fn release(&mut self) {
        self.buf = Vec::new();
        self.head = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_on_demand_keeps_the_bytes_across_the_wrap_and_is_given_back() {
        let mut r = Ring::new(1 << 20);
        assert_eq!(r.allocated(), 0);
        r.write(0, &[1; 3000]);
        assert_eq!(r.allocated(), MIN_ALLOC);
        r.advance(2000);
        // 1,000 bytes live from the head; these wrap around the 4 KiB allocation.
        r.write(1000, &[2; 3000]);
        assert_eq!(r.allocated(), MIN_ALLOC);
        // Past the allocation: it doubles, and the bytes keep their offsets.
        r.write(4000, &[3; 2000]);
        assert_eq!(r.allocated(), 8192);
        let mut out = vec![0u8; 6000];
        r.read(0, &mut out);
        assert!(out[..1000].iter().all(|&b| b == 1));
        assert!(out[1000..4000].iter().all(|&b| b == 2));
        assert!(out[4000..].iter().all(|&b| b == 3));
        r.release();
        assert_eq!(r.allocated(), 0);
        r.write(0, b"again");
        let mut out = [0u8; 5];
        r.read(0, &mut out);
        assert_eq!(&out, b"again");
    }

    #[test]
    fn never_grows_past_the_capacity() {
        let mut r = Ring::new(5000);
        r.write(4999, &[7]);
        assert_eq!(r.allocated(), 5000);
        let mut out = [0u8; 1];
        r.read(4999, &mut out);
        assert_eq!(out, [7]);
    }
}
