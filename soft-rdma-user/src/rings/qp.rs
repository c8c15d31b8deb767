//! A queue pair's two rings in one memfd: the send ring at offset 0, the receive ring after it. The client
//! library writes them ([`QpRingWriter`]); the daemon reads them ([`QpRingReader`]).
//!
//! [`QpRingReader`] is the daemon's sans-IO consumer: fed the mapping, it returns validated work requests
//! and knows nothing of sockets, eventfds or tokio, so whichever thread runs the queue pair's engine can
//! drain it. The first malformation it meets (in the header or an entry) is a [`RingFault`]; the reader
//! stays faulted (every later call returns the same fault) and the daemon moves the queue pair to Error.
//!
//! Order between the rings: the reader drains the send ring first, then the receive ring. The client
//! publishes a Receive before a Send it posts after it, and the reader's read of the send ring's producer
//! index (acquire) therefore makes every such Receive visible when it reads the receive ring next: a Send
//! whose answer needs that Receive never overtakes it.

use std::sync::Arc;

use super::consumer::{Consumer, PollError, Polled};
use super::entries::{EntryBounds, ReceiveEntry, SendEntry};
use super::producer::Producer;
use super::shared::{LAYOUT_VERSION, MAGIC, RingEntry, RingGeometry, RingView};
use super::{RingError, RingFault, RingKind};
use crate::engine::verbs::{QueuePairConfig, WorkRequest};
use crate::shm::SharedMemory;

const PAGE: usize = 4096;

/// Where a queue pair's rings sit in their memfd and how big they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpRingLayout {
    pub send: RingGeometry,
    pub receive: RingGeometry,
}

impl QpRingLayout {
    /// Rings of at least `send_depth` and `receive_depth` entries.
    pub fn new(send_depth: u32, receive_depth: u32) -> Result<Self, RingError> {
        Ok(QpRingLayout {
            send: RingGeometry::for_entries::<SendEntry>(send_depth)?,
            receive: RingGeometry::for_entries::<ReceiveEntry>(receive_depth)?,
        })
    }

    pub fn send_offset(&self) -> usize {
        0
    }

    pub fn receive_offset(&self) -> usize {
        self.send.bytes()
    }

    /// The memfd's size: both rings, rounded up to a page.
    pub fn bytes(&self) -> usize {
        (self.send.bytes() + self.receive.bytes()).next_multiple_of(PAGE)
    }

    /// The daemon's side: a new sealed memfd holding both rings, initialized (empty).
    pub fn create(&self) -> Result<Arc<SharedMemory>, RingError> {
        let mem = SharedMemory::create("soft-rdma-qp-rings", self.bytes())
            .map_err(|e| RingError::Geometry(format!("cannot create the queue pair's rings: {e}")))?;
        let mem = Arc::new(mem);
        RingView::new(mem.clone(), self.send_offset(), self.send)?.initialize();
        RingView::new(mem.clone(), self.receive_offset(), self.receive)?.initialize();
        Ok(mem)
    }
}

/// The client's check of a ring the daemon created: its first header line must say what the control path
/// said.
pub(crate) fn check_info<E: RingEntry>(view: &RingView) -> Result<(), RingError> {
    let info = view.info();
    let g = view.geometry();
    if info.magic != MAGIC
        || info.version != LAYOUT_VERSION
        || info.capacity != g.capacity()
        || info.entry_size as usize != E::SIZE
    {
        return Err(RingError::Geometry(format!(
            "ring header {info:?} does not match version {LAYOUT_VERSION}, {} entries of {} bytes",
            g.capacity(),
            E::SIZE
        )));
    }
    Ok(())
}

/// What bounds the send and the receive ring's requests: the queue pair's SGEs per request, the adapter's
/// largest transfer. Writer and reader apply the same.
fn bounds(config: &QueuePairConfig, max_transfer_length: u32) -> (EntryBounds, EntryBounds) {
    let bound = |max_sge| EntryBounds {
        max_sge,
        max_transfer_length,
    };
    (bound(config.max_send_sge), bound(config.max_receive_sge))
}

/// The daemon's consumer of one queue pair's rings.
#[derive(Debug)]
pub struct QpRingReader {
    send: Consumer<SendEntry>,
    receive: Consumer<ReceiveEntry>,
    send_bounds: EntryBounds,
    receive_bounds: EntryBounds,
    fault: Option<RingFault>,
}

/// What [`QpRingReader::drain`] took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Drained {
    pub sends: u32,
    pub receives: u32,
    /// Entries were left in a ring (past `max`): drain again before sleeping.
    pub more: bool,
}

impl QpRingReader {
    /// The reader of the rings in `mem` (made by [`QpRingLayout::create`]) laid out as `layout`, for a queue
    /// pair configured as `config`, on an adapter whose largest transfer is `max_transfer_length` bytes.
    pub fn new(
        mem: Arc<SharedMemory>,
        layout: QpRingLayout,
        config: &QueuePairConfig,
        max_transfer_length: u32,
    ) -> Result<Self, RingError> {
        let send = RingView::new(mem.clone(), layout.send_offset(), layout.send)?;
        let receive = RingView::new(mem, layout.receive_offset(), layout.receive)?;
        let (send_bounds, receive_bounds) = bounds(config, max_transfer_length);
        Ok(QpRingReader {
            send: Consumer::new(send, 0)?,
            receive: Consumer::new(receive, 0)?,
            send_bounds,
            receive_bounds,
            fault: None,
        })
    }

    /// The fault that stopped this reader, if one did.
    pub fn fault(&self) -> Option<&RingFault> {
        self.fault.as_ref()
    }

    fn check(&self) -> Result<(), RingFault> {
        match &self.fault {
            Some(f) => Err(f.clone()),
            None => Ok(()),
        }
    }

    fn faulted(&mut self, fault: RingFault) -> RingFault {
        self.fault = Some(fault.clone());
        fault
    }

    /// Appends to `out` up to `max` work requests from the send ring, then up to `max` from the receive
    /// ring, each validated. On a fault, `out` keeps the valid requests taken before it (post them, then move
    /// the queue pair to Error, so they complete as flushed) and the reader is faulted for good.
    pub fn drain(&mut self, max: u32, out: &mut Vec<WorkRequest>) -> Result<Drained, RingFault> {
        self.check()?;
        let sends = {
            let bounds = self.send_bounds;
            let r = self.send.poll(max, |_, e: SendEntry| {
                out.push(e.decode(bounds)?);
                Ok(())
            });
            self.result(RingKind::Send, r)?
        };
        let receives = {
            let bounds = self.receive_bounds;
            let r = self.receive.poll(max, |_, e: ReceiveEntry| {
                out.push(e.decode(bounds)?);
                Ok(())
            });
            self.result(RingKind::Receive, r)?
        };
        Ok(Drained {
            sends: sends.taken,
            receives: receives.taken,
            more: sends.left > 0 || receives.left > 0,
        })
    }

    fn result(
        &mut self,
        ring: RingKind,
        r: Result<Polled, PollError<RingError>>,
    ) -> Result<Polled, RingFault> {
        let index = match ring {
            RingKind::Receive => self.receive.index(),
            _ => self.send.index(),
        };
        r.map_err(|e| {
            let fault = match e {
                PollError::Ring(error) => RingFault {
                    ring,
                    entry: None,
                    error,
                },
                // The faulty entry was not released: it is the one at the consumer index.
                PollError::Entry(error) => RingFault {
                    ring,
                    entry: Some(index),
                    error,
                },
            };
            self.faulted(fault)
        })
    }

    /// Going to sleep on the doorbell: sets both rings' need-wakeup flags. Ok(true): both still empty,
    /// sleep; Ok(false): something arrived, drain again.
    pub fn prepare_sleep(&mut self) -> Result<bool, RingFault> {
        self.check()?;
        let send = self.send.prepare_sleep();
        let send = self.header(RingKind::Send, send)?;
        let receive = self.receive.prepare_sleep();
        let receive = self.header(RingKind::Receive, receive)?;
        if !(send && receive) {
            self.awake();
        }
        Ok(send && receive)
    }

    fn header<T>(&mut self, ring: RingKind, r: Result<T, RingError>) -> Result<T, RingFault> {
        r.map_err(|error| {
            self.faulted(RingFault {
                ring,
                entry: None,
                error,
            })
        })
    }

    /// Woken: clears both need-wakeup flags (the client stops ringing while the daemon polls).
    pub fn awake(&mut self) {
        self.send.awake();
        self.receive.awake();
    }
}

/// The client's producer of one queue pair's rings.
#[derive(Debug)]
pub struct QpRingWriter {
    send: Producer<SendEntry>,
    receive: Producer<ReceiveEntry>,
    send_bounds: EntryBounds,
    receive_bounds: EntryBounds,
}

impl QpRingWriter {
    /// Attaches to the rings the daemon made (its memfd mapped as `mem`), checking their headers; `config`
    /// and `max_transfer_length` as the daemon's reader has them ([`QpRingReader::new`]).
    pub fn attach(
        mem: Arc<SharedMemory>,
        layout: QpRingLayout,
        config: &QueuePairConfig,
        max_transfer_length: u32,
    ) -> Result<Self, RingError> {
        let send = RingView::new(mem.clone(), layout.send_offset(), layout.send)?;
        check_info::<SendEntry>(&send)?;
        let receive = RingView::new(mem, layout.receive_offset(), layout.receive)?;
        check_info::<ReceiveEntry>(&receive)?;
        let (send_bounds, receive_bounds) = bounds(config, max_transfer_length);
        Ok(QpRingWriter {
            send: Producer::new(send, 0)?,
            receive: Producer::new(receive, 0)?,
            send_bounds,
            receive_bounds,
        })
    }

    /// Writes `wr` into its ring (not yet visible: [`QpRingWriter::publish`]). [`RingError::Full`] when its
    /// ring has no room; [`RingError::SgeCount`] or [`RingError::Length`] past the bounds the daemon's
    /// reader applies (nothing is written then: the reader never faults on what this writer wrote).
    pub fn post(&mut self, wr: &WorkRequest) -> Result<(), RingError> {
        match wr {
            WorkRequest::Receive { .. } => {
                self.receive_bounds.check(wr)?;
                self.receive.push(&ReceiveEntry::encode(wr)?)
            }
            _ => {
                self.send_bounds.check(wr)?;
                self.send.push(&SendEntry::encode(wr)?)
            }
        }
    }

    /// Publishes what was written, the receive ring first (see the module documentation). True when the
    /// daemon sleeps: ring its doorbell.
    pub fn publish(&mut self) -> bool {
        let receive = self.receive.publish();
        let send = self.send.publish();
        receive || send
    }
}
