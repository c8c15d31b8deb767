//! The byte storage under the send and receive buffers: a ring addressed by offset from its oldest byte,
//! whose memory grows on demand up to the buffer's size and can be given back when the buffer is empty.
//! So a connection's memory follows what it holds, not what it may hold: an idle connection has none, and
//! thousands of connections fit in a daemon (issue 20: 16,384 of them, each allowed 1 MiB per direction).
//!
//! Under the daemon's budget (`budget.rs`, one of its pools), every growth is charged to it first and every
//! byte given back returns to it: a growth the budget cannot cover is cut to what it can, or refused, and
//! the owner works within the memory it has ([`Ring::grow`] says how much that is).

use std::sync::Arc;

use super::budget::PoolBudget;

/// Smallest allocation.
const MIN_ALLOC: usize = 4096;

/// See the module doc. Offsets are from the oldest byte (the head); the owner tracks which hold data.
#[derive(Debug)]
pub struct Ring {
    buf: Vec<u8>,
    // 32 bits each (a buffer is far below 4 GiB), so that the budget's pointer costs a connection nothing.
    head: u32,
    capacity: u32,
    /// Where the memory is charged (`None`: nowhere, only `capacity` bounds it).
    budget: Option<Arc<PoolBudget>>,
}

impl Drop for Ring {
    fn drop(&mut self) {
        self.release();
    }
}

impl Ring {
    /// A ring of at most `capacity` bytes, nothing allocated yet.
    pub fn new(capacity: usize) -> Self {
        Ring {
            buf: Vec::new(),
            head: 0,
            capacity: capacity.clamp(1, u32::MAX as usize) as u32,
            budget: None,
        }
    }

    /// Charge this ring's memory, now and from now on, to `budget` (the memory held already is charged
    /// whether or not it fits: it is held).
    pub fn set_budget(&mut self, budget: Arc<PoolBudget>) {
        if let Some(old) = self.budget.take() {
            old.credit(self.buf.len());
        }
        budget.force_charge(self.buf.len());
        self.budget = Some(budget);
    }

    /// Offsets below this are addressable, or can be made so by [`Self::grow`] as the budget stands now.
    pub fn growable(&self) -> usize {
        match &self.budget {
            None => self.capacity(),
            Some(b) => self.buf.len().saturating_add(b.headroom()).min(self.capacity()),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity as usize
    }

    /// Bytes of memory held.
    pub fn allocated(&self) -> usize {
        self.buf.len()
    }

    /// Make offsets below `len` (at most the capacity) addressable: grow, doubling, and lay the bytes out
    /// again from the start. Past the budget, grow only as far as it lets (`len` at most). Returns how many
    /// offsets are addressable now: at least what was before, `len` or more unless the budget ran out.
    pub fn grow(&mut self, len: usize) -> usize {
        let old = self.buf.len();
        let len = len.min(self.capacity());
        if len <= old {
            return old;
        }
        let doubled = len
            .next_power_of_two()
            .max(MIN_ALLOC)
            .max(old * 2)
            .min(self.capacity());
        let new = match &self.budget {
            None => doubled,
            Some(b) if b.try_charge(doubled - old) => doubled,
            Some(b) => {
                let new = len.min(old.saturating_add(b.headroom()));
                if new < len {
                    b.count_memory_limited();
                }
                if new <= old || !b.try_charge(new - old) {
                    return old;
                }
                new
            }
        };
        let mut grown = vec![0u8; new];
        let head = self.head as usize;
        let first = old - head;
        grown[..first].copy_from_slice(&self.buf[head..]);
        grown[first..old].copy_from_slice(&self.buf[..head]);
        self.buf = grown;
        self.head = 0;
        new
    }

    /// Write `data` at `offset`, as much of it as [`Self::grow`] makes room for; returns how much (the
    /// caller grew the ring first, or keeps within what it holds, to write it all).
    pub fn write(&mut self, offset: usize, data: &[u8]) -> usize {
        let room = self.grow(offset.saturating_add(data.len()));
        let n = data.len().min(room.saturating_sub(offset));
        if n == 0 {
            return 0;
        }
        let data = &data[..n];
        let cap = self.buf.len();
        let at = (self.head as usize + offset) % cap;
        let first = n.min(cap - at);
        self.buf[at..at + first].copy_from_slice(&data[..first]);
        self.buf[..n - first].copy_from_slice(&data[first..]);
        n
    }

    /// Copy the bytes at `offset` into `out` (the caller reads only what it wrote).
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        let n = out.len();
        if n == 0 {
            return;
        }
        let cap = self.buf.len();
        let at = (self.head as usize + offset) % cap;
        let first = n.min(cap - at);
        out[..first].copy_from_slice(&self.buf[at..at + first]);
        out[first..].copy_from_slice(&self.buf[..n - first]);
    }

    /// The `n` oldest bytes are gone.
    pub fn advance(&mut self, n: usize) {
        if !self.buf.is_empty() {
            self.head = ((self.head as usize + n) % self.buf.len()) as u32;
        }
    }

    /// Give the memory back (the owner holds no bytes in it).
    pub fn release(&mut self) {
        if let Some(b) = &self.budget {
            b.credit(self.buf.len());
        }
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

    #[test]
    fn growth_is_charged_cut_to_the_need_or_refused_and_given_back() {
        use super::super::budget::{TcpBudget, TcpLimits};
        let budget = Arc::new(TcpBudget::new(TcpLimits {
            max_buffer_bytes: 12_000,
            max_connections: 1,
        }));
        let pools = budget.pools();
        let mut a = Ring::new(1 << 20);
        a.set_budget(pools.receive.clone());
        let mut b = Ring::new(1 << 20);
        b.set_budget(pools.receive.clone());
        assert_eq!(a.write(0, &[1; 5000]), 5000);
        assert_eq!(budget.buffer_bytes(), 8192, "doubling to 8 KiB fits");
        assert_eq!(b.growable(), 12_000 - 8192);
        // b needs 3,000 bytes: 4 KiB does not fit, exactly 3,000 does.
        assert_eq!(b.grow(3000), 3000);
        assert_eq!(budget.buffer_bytes(), 11_192);
        // 808 bytes left: a grows by those, not the 1,308 it wanted, and writes what fits.
        assert_eq!(a.write(8000, &[2; 1500]), 1000);
        assert_eq!(budget.memory_limited(), 1);
        assert_eq!((a.allocated(), budget.buffer_bytes()), (9000, 12_000));
        let mut out = [0u8; 1000];
        a.read(8000, &mut out);
        assert!(out.iter().all(|&x| x == 2));
        // Nothing left: no growth at all.
        assert_eq!(a.grow(9001), 9000);
        assert_eq!(budget.memory_limited(), 2);
        let releases = budget.releases();
        drop(b);
        assert_eq!(budget.buffer_bytes(), 9000);
        assert!(budget.releases() > releases);
        a.release();
        assert_eq!(budget.buffer_bytes(), 0);
    }
}
