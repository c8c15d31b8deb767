//! Bytes the engine queued for a connection that its TCP's send buffer could not take yet: one type for the
//! smoltcp socket path and the own-TCP path, drained in order as room appears.

use std::collections::VecDeque;

use bytes::Bytes;

/// Bytes the engine queued for a connection that its TCP's send buffer had no room for yet (both stacks).
#[derive(Debug, Default)]
pub(super) struct QueuedBytes {
    queue: VecDeque<Bytes>,
    /// How much of the front buffer already went.
    front_off: usize,
}

impl QueuedBytes {
    pub(super) fn push_back(&mut self, data: Bytes) {
        self.queue.push_back(data);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Hands queued bytes to `write` (which takes what fits and returns how much) until it takes nothing;
    /// returns the bytes taken.
    pub(super) fn drain_into(&mut self, mut write: impl FnMut(&[u8]) -> usize) -> usize {
        let mut written = 0;
        while let Some(front) = self.queue.front() {
            let n = write(&front[self.front_off..]);
            if n == 0 {
                break;
            }
            written += n;
            self.front_off += n;
            if self.front_off == front.len() {
                self.queue.pop_front();
                self.front_off = 0;
            }
        }
        written
    }
}
