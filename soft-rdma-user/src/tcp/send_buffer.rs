//! The send buffer: a fixed-size ring of the bytes the application queued and the peer has not yet
//! acknowledged (RFC 9293 §3.3.1: the region from SND.UNA onwards). Allocated once per connection.

/// Bytes from the oldest unacknowledged one to the last one queued.
#[derive(Debug)]
pub struct SendBuffer {
    ring: Box<[u8]>,
    head: usize,
    len: usize,
}

impl SendBuffer {
    pub fn new(capacity: usize) -> Self {
        SendBuffer {
            ring: vec![0; capacity.max(1)].into_boxed_slice(),
            head: 0,
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn free(&self) -> usize {
        self.ring.len() - self.len
    }

    /// Queue as much of `data` as fits; returns how much.
    pub fn push(&mut self, data: &[u8]) -> usize {
        let n = data.len().min(self.free());
        let cap = self.ring.len();
        let start = (self.head + self.len) % cap;
        let first = n.min(cap - start);
        self.ring[start..start + first].copy_from_slice(&data[..first]);
        self.ring[..n - first].copy_from_slice(&data[first..n]);
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
        let cap = self.ring.len();
        let start = (self.head + offset) % cap;
        let first = n.min(cap - start);
        out[..first].copy_from_slice(&self.ring[start..start + first]);
        out[first..n].copy_from_slice(&self.ring[..n - first]);
        n
    }

    /// Drop the `n` oldest bytes (acknowledged).
    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.len);
        self.head = (self.head + n) % self.ring.len();
        self.len -= n;
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
    }
}
