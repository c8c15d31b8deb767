//! Reading a message's payload ahead, in pieces larger than one FPDU, from registered memory whose every
//! read is costly: a C program's own buffer that soft-rdmad reaches through the client's `/proc/<pid>/mem`
//! in XDP mode (`uds/process_memory.rs`: one system call, and one walk of the client's page tables per page,
//! per read). Segmenting a 64 KiB Write into FPDUs of one MSS read it 45 times; read ahead, once
//! (docs/perftest.md, "XDP mode").
//!
//! The bytes are taken when the first FPDU of a piece is made, not when each FPDU is: RDMA gives no promise
//! about when between the post and the completion the source is read (RFC 5040 §5.5: the buffer may be
//! reused only after the completion), so a program that changes it meanwhile gets either bytes, as on any
//! RNIC. A piece holds at most [`READ_AHEAD`] bytes, so a queue pair's buffer is bounded, and it is freed
//! with the message.

use crate::engine::framing::PayloadDst;

/// The most bytes read at once for one message.
pub(super) const READ_AHEAD: usize = 64 * 1024;

/// The piece of one message read ahead: message bytes `[start, start + bytes.len())`.
#[derive(Debug, Default)]
pub(super) struct ReadAhead {
    start: u64,
    bytes: Vec<u8>,
    /// Every byte of the piece was readable (else the unreadable ones are zeros).
    readable: bool,
}

impl ReadAhead {
    /// Supplies message bytes `[pos, pos + len)` to `dst` from the piece read ahead; when they are not all
    /// in it, first reads the next piece, `[pos, pos + ahead)` (`ahead` ≥ `len`, at most [`READ_AHEAD`]
    /// unless `len` is larger), with `read(pos, buffer)`, which answers whether every byte was readable.
    /// Answers whether the bytes supplied were readable.
    pub(super) fn supply(
        &mut self,
        (pos, len): (u64, usize),
        ahead: usize,
        dst: &mut PayloadDst<'_>,
        read: impl FnOnce(u64, &mut [u8]) -> bool,
    ) -> bool {
        if self.range(pos, len).is_none() {
            let n = ahead.min(READ_AHEAD).max(len);
            self.bytes.clear();
            self.bytes.resize(n, 0);
            self.start = pos;
            self.readable = read(pos, &mut self.bytes);
        }
        let Some(range) = self.range(pos, len) else {
            return false;
        };
        let piece = &self.bytes[range];
        dst.copy(0, len, |d| d.copy_from_slice(piece));
        self.readable
    }

    /// Where message bytes `[pos, pos + len)` are in the piece, if all of them are.
    fn range(&self, pos: u64, len: usize) -> Option<core::ops::Range<usize>> {
        let from = usize::try_from(pos.checked_sub(self.start)?).ok()?;
        let to = from.checked_add(len)?;
        (to <= self.bytes.len()).then_some(from..to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message of `len` bytes, byte i = i mod 251, segmented in `seg`-byte FPDUs through a ReadAhead:
    /// the bytes supplied, and how many reads it took.
    fn segment(len: usize, seg: usize, ahead: usize) -> (Vec<u8>, usize) {
        let mut ra = ReadAhead::default();
        let mut reads = 0;
        let mut got = Vec::new();
        let mut pos = 0;
        while pos < len {
            let n = seg.min(len - pos);
            let mut fpdu = vec![0u8; n];
            let ok = ra.supply(
                (pos as u64, n),
                ahead.min(len - pos),
                &mut PayloadDst::Copy(&mut fpdu),
                |at, buf| {
                    reads += 1;
                    for (i, b) in buf.iter_mut().enumerate() {
                        *b = ((at as usize + i) % 251) as u8;
                    }
                    true
                },
            );
            assert!(ok);
            got.extend_from_slice(&fpdu);
            pos += n;
        }
        (got, reads)
    }

    #[test]
    fn segments_are_the_message_bytes_read_in_pieces() {
        let want = |len: usize| (0..len).map(|i| (i % 251) as u8).collect::<Vec<_>>();
        // 64 KiB in MSS-sized FPDUs: one read instead of 46.
        assert_eq!(segment(65536, 1428, READ_AHEAD), (want(65536), 1));
        // 1 MiB: one read per 64 KiB piece (an FPDU across two pieces reads the next from its own start).
        let (got, reads) = segment(1 << 20, 1428, READ_AHEAD);
        assert_eq!(got, want(1 << 20));
        assert!((16..=17).contains(&reads), "{reads} reads");
        // Tiny look-ahead: one read per FPDU, still the right bytes.
        assert_eq!(segment(5000, 1000, 1).0, want(5000));
        // A segment larger than the look-ahead is read whole.
        assert_eq!(segment(300_000, 200_000, READ_AHEAD).0, want(300_000));
    }

    #[test]
    fn an_unreadable_piece_says_so_for_each_of_its_segments() {
        let mut ra = ReadAhead::default();
        let mut fpdu = [7u8; 10];
        let read = |_: u64, buf: &mut [u8]| {
            buf.fill(0);
            false
        };
        assert!(!ra.supply((0, 10), 100, &mut PayloadDst::Copy(&mut fpdu), read));
        assert_eq!(fpdu, [0; 10]);
        let mut next = [7u8; 10];
        assert!(!ra.supply((10, 10), 100, &mut PayloadDst::Copy(&mut next), |_, _| unreachable!()));
    }
}
