//! A completion queue's ring, alone in its memfd: the daemon writes completions ([`CqRingWriter`]), the
//! client library reads them ([`CqRingReader`]).
//!
//! The ring holds the completion queue's depth, up to [`MAX_RING_ENTRIES`]: a queue may be as deep as kernel
//! siw's (`SIW_MAX_CQE`, 3,276,800), but its ring stays at most 2 MiB, since a ring's pages are all touched
//! once its indices have gone round it, however few completions wait at a time. When the client does not
//! keep up (or a deep queue holds more than its ring), the writer keeps what does not fit in an overflow
//! queue, in order, that grows on demand and is given back once empty, and sets its need-wakeup flag: the
//! client rings the room doorbell (the session's doorbell) once it has taken entries. The daemon bounds the
//! overflow: past `Limits::max_queue_entries_per_session` waiting completions it stops reading the
//! session's queue-pair rings until the client takes some (`daemon::rings`).
//!
//! The client can scribble over the consumer index the writer reads; the writer checks it every time
//! ([`RingError::ConsumerIndex`]), stops writing and reports the fault.

use std::collections::VecDeque;
use std::sync::Arc;

use super::consumer::{Consumer, PollError, Polled};
use super::entries::CompletionEntry;
use super::producer::Producer;
use super::qp::check_info;
use super::shared::{MAX_CAPACITY, RingGeometry, RingView};
use super::{RingError, RingFault, RingKind};
use crate::engine::verbs::Completion;
use crate::shm::SharedMemory;

const PAGE: usize = 4096;

/// The most entries a completion ring has, whatever its queue's depth: 65,536 entries of 32 bytes, 2 MiB
/// (the shared rings' [`MAX_CAPACITY`]). Deeper queues keep what does not fit in the writer's overflow.
pub const MAX_RING_ENTRIES: u32 = MAX_CAPACITY;

/// An overflow queue that held more than this many completions is given its memory back once empty.
const OVERFLOW_KEPT: usize = 1024;

/// A completion ring's geometry for a queue of `depth` entries: `depth` rounded up to a power of two, at
/// most [`MAX_RING_ENTRIES`]. Defined for every `depth` (0 is a ring of 1); both sides compute it from the
/// depth the client asked for, and the client checks the header the daemon wrote against it.
pub fn geometry(depth: u32) -> Result<RingGeometry, RingError> {
    RingGeometry::for_entries::<CompletionEntry>(depth.min(MAX_RING_ENTRIES))
}

/// The memfd's size for a completion ring of geometry `g`.
pub fn bytes(g: RingGeometry) -> usize {
    g.bytes().next_multiple_of(PAGE)
}

fn fault(error: RingError) -> RingFault {
    RingFault {
        ring: RingKind::Completion,
        entry: None,
        error,
    }
}

/// The daemon's producer of one completion queue's ring.
#[derive(Debug)]
pub struct CqRingWriter {
    ring: Producer<CompletionEntry>,
    overflow: VecDeque<Completion>,
    fault: Option<RingFault>,
}

impl CqRingWriter {
    /// A new sealed memfd holding an empty ring of geometry `g`, and its writer.
    pub fn create(g: RingGeometry) -> Result<(Arc<SharedMemory>, Self), RingError> {
        let mem = SharedMemory::create("soft-rdma-cq-ring", bytes(g))
            .map_err(|e| RingError::Geometry(format!("cannot create the completion ring: {e}")))?;
        let mem = Arc::new(mem);
        let writer = Self::over(mem.clone(), g)?;
        Ok((mem, writer))
    }

    /// [`CqRingWriter::create`], handing out the memfd (to pass to the client) instead of keeping it open:
    /// the writer holds the mapping alone.
    pub fn create_passing_fd(g: RingGeometry) -> Result<(std::os::fd::OwnedFd, Self), RingError> {
        let mut mem = SharedMemory::create("soft-rdma-cq-ring", bytes(g))
            .map_err(|e| RingError::Geometry(format!("cannot create the completion ring: {e}")))?;
        let fd = mem
            .take_fd()
            .ok_or_else(|| RingError::Geometry("a new memfd without its descriptor".into()))?;
        Ok((fd, Self::over(Arc::new(mem), g)?))
    }

    fn over(mem: Arc<SharedMemory>, g: RingGeometry) -> Result<Self, RingError> {
        let view = RingView::new(mem, 0, g)?;
        view.initialize();
        Ok(CqRingWriter {
            ring: Producer::new(view, 0)?,
            overflow: VecDeque::new(),
            fault: None,
        })
    }

    /// The fault that stopped this writer, if one did.
    pub fn fault(&self) -> Option<&RingFault> {
        self.fault.as_ref()
    }

    /// Completions waiting for room.
    pub fn overflowed(&self) -> usize {
        self.overflow.len()
    }

    /// Queues `c` behind what waits already; [`CqRingWriter::flush`] writes it.
    pub fn push(&mut self, c: Completion) {
        self.overflow.push_back(c);
    }

    /// Writes what fits, in order, and publishes it. Ok(true): the client sleeps, ring its doorbell. When
    /// completions are left over, the writer's need-wakeup flag is set: the client rings the room doorbell
    /// once it took entries, and the caller flushes again. After a fault nothing is written again.
    pub fn flush(&mut self) -> Result<bool, RingFault> {
        if let Some(f) = &self.fault {
            return Err(f.clone());
        }
        let mut wake = false;
        let r = self.write_all(&mut wake);
        let r = r.map_err(|e| {
            let f = fault(e);
            self.fault = Some(f.clone());
            self.overflow.clear();
            f
        });
        wake |= self.ring.publish();
        r.map(|()| wake)
    }

    /// Writes what fits; `wake` is set when a publish found the client asleep.
    fn write_all(&mut self, wake: &mut bool) -> Result<(), RingError> {
        loop {
            while let Some(c) = self.overflow.front() {
                match self.ring.push(&CompletionEntry::encode(c)) {
                    Ok(()) => {
                        self.overflow.pop_front();
                    }
                    Err(RingError::Full { .. }) => break,
                    Err(e) => return Err(e),
                }
            }
            if self.overflow.is_empty() {
                if self.overflow.capacity() > OVERFLOW_KEPT {
                    self.overflow = VecDeque::new();
                }
                self.ring.awake();
                return Ok(());
            }
            // Full: ask for the room doorbell, unless room appeared meanwhile.
            *wake |= self.ring.publish();
            if self.ring.prepare_sleep()? {
                return Ok(());
            }
        }
    }
}

/// The client's consumer of one completion queue's ring.
#[derive(Debug)]
pub struct CqRingReader {
    ring: Consumer<CompletionEntry>,
}

impl CqRingReader {
    /// Attaches to the ring the daemon made (its memfd mapped as `mem`), checking its header.
    pub fn attach(mem: Arc<SharedMemory>, g: RingGeometry) -> Result<Self, RingError> {
        let view = RingView::new(mem, 0, g)?;
        check_info::<CompletionEntry>(&view)?;
        Ok(CqRingReader {
            ring: Consumer::new(view, 0)?,
        })
    }

    /// Appends up to `max` completions to `out`. `wake_producer`: ring the daemon's room doorbell.
    pub fn poll(&mut self, max: u32, out: &mut Vec<Completion>) -> Result<Polled, RingFault> {
        let r = self.ring.poll(max, |_, e: CompletionEntry| {
            out.push(e.decode()?);
            Ok(())
        });
        r.map_err(|e| match e {
            PollError::Ring(error) => fault(error),
            // The faulty entry was not released: it is the one at the consumer index.
            PollError::Entry(error) => RingFault {
                ring: RingKind::Completion,
                entry: Some(self.ring.index()),
                error,
            },
        })
    }

    /// Whether completions wait in the ring (a malformed ring: none to take).
    pub fn has_entries(&self) -> bool {
        self.ring.available().is_ok_and(|n| n > 0)
    }

    /// Going to sleep: Ok(true) still empty (sleep on the doorbell), Ok(false) completions arrived.
    pub fn prepare_sleep(&mut self) -> Result<bool, RingFault> {
        self.ring.prepare_sleep().map_err(fault)
    }

    pub fn awake(&mut self) {
        self.ring.awake();
    }
}
