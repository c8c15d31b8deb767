//! Ring entry encodings (zerocopy, little-endian, fixed size) and their checked conversions.
//!
//! - [`SendEntry`] (160 bytes): Send, Send with Solicited Event and/or Invalidate, RDMA Write, RDMA Read;
//!   any of them silent (ND_OP_FLAG_SILENT_SUCCESS: [`FLAG_SILENT`]).
//! - [`ReceiveEntry`] (144 bytes): a receive buffer.
//! - [`CompletionEntry`] (32 bytes): one completion.
//!
//! An entry holds up to [`MAX_SGES`] scatter/gather elements (the adapter's maximum per request). Decoding
//! a client's entry ([`SendEntry::decode`], [`ReceiveEntry::decode`]) refuses unknown opcodes and flag
//! bits, non-zero reserved bytes, more SGEs than the queue pair allows, a Read without exactly one sink and
//! SGE lengths past the adapter's transfer limit, each with its own [`RingError`]. Memory checks (STags,
//! offsets, access) stay the engine's (`engine::memory`), as for any work request.

use zerocopy::byteorder::little_endian::{U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use super::RingError;
use super::shared::RingEntry;
use crate::engine::verbs::{Completion, CompletionOp, QueuePairId, RemoteBuffer, Sge, Stag, WorkRequest};
use crate::error::NdStatus;

/// SGEs an entry can carry (`AdapterInfo::max_send_sge` and `max_receive_sge` are no more).
pub const MAX_SGES: usize = 8;

/// [`SendEntry::opcode`]: Send (RDMAP opcodes 3-6 by the flags).
pub const OP_SEND: u8 = 0;
/// [`SendEntry::opcode`]: RDMA Write.
pub const OP_WRITE: u8 = 1;
/// [`SendEntry::opcode`]: RDMA Read.
pub const OP_READ: u8 = 2;

/// [`SendEntry::flags`]: Send with Solicited Event.
pub const FLAG_SOLICITED: u8 = 1;
/// [`SendEntry::flags`]: Send with Invalidate of [`SendEntry::invalidate`].
pub const FLAG_INVALIDATE: u8 = 2;
/// [`SendEntry::flags`], any opcode: no completion on success ([`WorkRequest::is_silent`]).
pub const FLAG_SILENT: u8 = 4;

/// [`CompletionEntry::op`] values.
const CQ_OP_SEND: u8 = 0;
const CQ_OP_WRITE: u8 = 1;
const CQ_OP_READ: u8 = 2;
const CQ_OP_RECEIVE: u8 = 3;
/// [`CompletionEntry::flags`]: the received Send carried Solicited Event.
const CQ_FLAG_SOLICITED: u8 = 1;
/// [`CompletionEntry::flags`]: [`CompletionEntry::invalidated`] holds the STag the peer invalidated.
const CQ_FLAG_INVALIDATED: u8 = 2;

/// One scatter/gather element.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct SgeEntry {
    pub stag: U32,
    pub length: U32,
    pub offset: U64,
}

impl SgeEntry {
    fn from_sge(s: &Sge) -> Self {
        SgeEntry {
            stag: s.stag.0.into(),
            length: s.length.into(),
            offset: s.offset.into(),
        }
    }

    fn sge(&self) -> Sge {
        Sge {
            stag: Stag(self.stag.get()),
            offset: self.offset.get(),
            length: self.length.get(),
        }
    }
}

/// What bounds a decoded work request: the queue pair's SGEs per request and the adapter's largest
/// transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryBounds {
    pub max_sge: u32,
    pub max_transfer_length: u32,
}

impl EntryBounds {
    /// The client library's check before it writes `wr`: the same bounds [`SendEntry::decode`] and
    /// [`ReceiveEntry::decode`] apply, so an entry the library writes never faults the daemon's reader.
    pub fn check(&self, wr: &WorkRequest) -> Result<(), RingError> {
        let (sgl, max): (&[Sge], u32) = match wr {
            WorkRequest::Send { sgl, .. }
            | WorkRequest::Write { sgl, .. }
            | WorkRequest::Receive { sgl, .. } => (sgl, self.max_sge),
            WorkRequest::Read { sink, .. } => (std::slice::from_ref(sink), self.max_sge.max(1)),
        };
        let max = max.min(MAX_SGES as u32);
        if sgl.len() as u64 > u64::from(max) {
            return Err(RingError::SgeCount {
                count: u32::try_from(sgl.len()).unwrap_or(u32::MAX),
                max,
            });
        }
        let total: u64 = sgl.iter().map(|s| u64::from(s.length)).sum();
        if total > u64::from(self.max_transfer_length) {
            return Err(RingError::Length {
                total,
                max: self.max_transfer_length,
            });
        }
        Ok(())
    }
}

/// Checks `count` SGEs against the entry and `bounds`, and their total length; returns them.
fn sgl(sges: &[SgeEntry; MAX_SGES], count: u8, bounds: EntryBounds) -> Result<Vec<Sge>, RingError> {
    let max = bounds.max_sge.min(MAX_SGES as u32);
    if u32::from(count) > max {
        return Err(RingError::SgeCount {
            count: count.into(),
            max,
        });
    }
    let used = &sges[..usize::from(count)];
    let total: u64 = used.iter().map(|s| u64::from(s.length.get())).sum();
    if total > u64::from(bounds.max_transfer_length) {
        return Err(RingError::Length {
            total,
            max: bounds.max_transfer_length,
        });
    }
    // Unused elements must be zero, like reserved bytes: a client library never leaves garbage there.
    if sges[usize::from(count)..]
        .iter()
        .any(|s| *s != SgeEntry::default())
    {
        return Err(RingError::Reserved);
    }
    Ok(used.iter().map(SgeEntry::sge).collect())
}

fn encode_sgl(sgl: &[Sge]) -> Result<(u8, [SgeEntry; MAX_SGES]), RingError> {
    let mut out = [SgeEntry::default(); MAX_SGES];
    if sgl.len() > MAX_SGES {
        return Err(RingError::SgeCount {
            count: u32::try_from(sgl.len()).unwrap_or(u32::MAX),
            max: MAX_SGES as u32,
        });
    }
    for (o, s) in out.iter_mut().zip(sgl) {
        *o = SgeEntry::from_sge(s);
    }
    Ok((sgl.len() as u8, out))
}

/// A send-queue entry.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct SendEntry {
    /// [`OP_SEND`], [`OP_WRITE`] or [`OP_READ`].
    pub opcode: u8,
    /// [`FLAG_SOLICITED`], [`FLAG_INVALIDATE`] (Send only), [`FLAG_SILENT`].
    pub flags: u8,
    pub sge_count: u8,
    pub reserved: u8,
    /// Send with Invalidate: the peer's STag to invalidate (RFC 5040 §5.3); zero otherwise.
    pub invalidate: U32,
    pub wr_id: U64,
    /// Write and Read: the peer's buffer; zero for a Send.
    pub remote_stag: U32,
    pub reserved2: U32,
    pub remote_offset: U64,
    /// The gather list (Send, Write) or the one sink (Read).
    pub sges: [SgeEntry; MAX_SGES],
}

impl RingEntry for SendEntry {}

impl SendEntry {
    /// The entry for a Send, Write or Read. A Receive belongs in the receive ring (`InvalidParameter`
    /// as [`RingError::Opcode`]); more than [`MAX_SGES`] SGEs is [`RingError::SgeCount`].
    pub fn encode(wr: &WorkRequest) -> Result<Self, RingError> {
        let mut e = SendEntry::new_zeroed();
        e.wr_id = wr.id().into();
        if wr.is_silent() {
            e.flags |= FLAG_SILENT;
        }
        match wr {
            WorkRequest::Send {
                sgl,
                solicited,
                invalidate,
                ..
            } => {
                e.opcode = OP_SEND;
                (e.sge_count, e.sges) = encode_sgl(sgl)?;
                if *solicited {
                    e.flags |= FLAG_SOLICITED;
                }
                if let Some(stag) = invalidate {
                    e.flags |= FLAG_INVALIDATE;
                    e.invalidate = stag.0.into();
                }
            }
            WorkRequest::Write { sgl, remote, .. } => {
                e.opcode = OP_WRITE;
                (e.sge_count, e.sges) = encode_sgl(sgl)?;
                e.remote_stag = remote.stag.0.into();
                e.remote_offset = remote.offset.into();
            }
            WorkRequest::Read { sink, remote, .. } => {
                e.opcode = OP_READ;
                (e.sge_count, e.sges) = encode_sgl(std::slice::from_ref(sink))?;
                e.remote_stag = remote.stag.0.into();
                e.remote_offset = remote.offset.into();
            }
            WorkRequest::Receive { .. } => return Err(RingError::Opcode(u8::MAX)),
        }
        Ok(e)
    }

    /// The work request this entry asks for, checked against `bounds`.
    pub fn decode(&self, bounds: EntryBounds) -> Result<WorkRequest, RingError> {
        if self.reserved != 0 || self.reserved2.get() != 0 {
            return Err(RingError::Reserved);
        }
        let id = self.wr_id.get();
        let remote = RemoteBuffer {
            stag: Stag(self.remote_stag.get()),
            offset: self.remote_offset.get(),
        };
        let no_remote = || self.remote_stag.get() == 0 && self.remote_offset.get() == 0;
        let silent = self.flags & FLAG_SILENT != 0;
        match self.opcode {
            OP_SEND => {
                if self.flags & !(FLAG_SOLICITED | FLAG_INVALIDATE | FLAG_SILENT) != 0 {
                    return Err(RingError::Flags(self.flags));
                }
                let invalidate = self.flags & FLAG_INVALIDATE != 0;
                if !no_remote() || (!invalidate && self.invalidate.get() != 0) {
                    return Err(RingError::Reserved);
                }
                Ok(WorkRequest::Send {
                    id,
                    sgl: sgl(&self.sges, self.sge_count, bounds)?,
                    solicited: self.flags & FLAG_SOLICITED != 0,
                    invalidate: invalidate.then(|| Stag(self.invalidate.get())),
                    silent,
                })
            }
            OP_WRITE | OP_READ => {
                if self.flags & !FLAG_SILENT != 0 {
                    return Err(RingError::Flags(self.flags));
                }
                if self.invalidate.get() != 0 {
                    return Err(RingError::Reserved);
                }
                if self.opcode == OP_WRITE {
                    return Ok(WorkRequest::Write {
                        id,
                        sgl: sgl(&self.sges, self.sge_count, bounds)?,
                        remote,
                        silent,
                    });
                }
                if self.sge_count != 1 {
                    return Err(RingError::ReadSink(self.sge_count));
                }
                // One sink SGE, as siw; the queue pair's send SGE bound is at least 1.
                let bounds = EntryBounds {
                    max_sge: bounds.max_sge.max(1),
                    ..bounds
                };
                let sink = sgl(&self.sges, 1, bounds)?[0];
                Ok(WorkRequest::Read {
                    id,
                    sink,
                    remote,
                    silent,
                })
            }
            op => Err(RingError::Opcode(op)),
        }
    }
}

/// A receive-queue entry.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct ReceiveEntry {
    pub wr_id: U64,
    pub sge_count: u8,
    pub reserved: [u8; 7],
    pub sges: [SgeEntry; MAX_SGES],
}

impl RingEntry for ReceiveEntry {}

impl ReceiveEntry {
    /// The entry for a Receive; any other request is [`RingError::Opcode`].
    pub fn encode(wr: &WorkRequest) -> Result<Self, RingError> {
        let WorkRequest::Receive { id, sgl } = wr else {
            return Err(RingError::Opcode(u8::MAX));
        };
        let (sge_count, sges) = encode_sgl(sgl)?;
        Ok(ReceiveEntry {
            wr_id: (*id).into(),
            sge_count,
            reserved: [0; 7],
            sges,
        })
    }

    pub fn decode(&self, bounds: EntryBounds) -> Result<WorkRequest, RingError> {
        if self.reserved != [0; 7] {
            return Err(RingError::Reserved);
        }
        Ok(WorkRequest::Receive {
            id: self.wr_id.get(),
            sgl: sgl(&self.sges, self.sge_count, bounds)?,
        })
    }
}

/// A completion-queue entry.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct CompletionEntry {
    pub qp: U64,
    pub wr_id: U64,
    /// The ND status's numeric value.
    pub status: U32,
    pub bytes: U32,
    pub op: u8,
    pub flags: u8,
    pub reserved: [u8; 2],
    /// The local STag the peer invalidated (with the invalidated flag).
    pub invalidated: U32,
}

impl RingEntry for CompletionEntry {}

impl CompletionEntry {
    pub fn encode(c: &Completion) -> Self {
        let mut flags = 0;
        if c.solicited {
            flags |= CQ_FLAG_SOLICITED;
        }
        if c.invalidated.is_some() {
            flags |= CQ_FLAG_INVALIDATED;
        }
        CompletionEntry {
            qp: c.qp.0.into(),
            wr_id: c.wr_id.into(),
            status: c.status.code().into(),
            bytes: c.bytes.into(),
            op: match c.op {
                CompletionOp::Send => CQ_OP_SEND,
                CompletionOp::Write => CQ_OP_WRITE,
                CompletionOp::Read => CQ_OP_READ,
                CompletionOp::Receive => CQ_OP_RECEIVE,
            },
            flags,
            reserved: [0; 2],
            invalidated: c.invalidated.map_or(0, |s| s.0).into(),
        }
    }

    pub fn decode(&self) -> Result<Completion, RingError> {
        let op = match self.op {
            CQ_OP_SEND => CompletionOp::Send,
            CQ_OP_WRITE => CompletionOp::Write,
            CQ_OP_READ => CompletionOp::Read,
            CQ_OP_RECEIVE => CompletionOp::Receive,
            op => return Err(RingError::CompletionOp(op)),
        };
        if self.flags & !(CQ_FLAG_SOLICITED | CQ_FLAG_INVALIDATED) != 0 {
            return Err(RingError::Flags(self.flags));
        }
        if self.reserved != [0; 2] {
            return Err(RingError::Reserved);
        }
        let status = NdStatus::from_code(self.status.get()).ok_or(RingError::Status(self.status.get()))?;
        Ok(Completion {
            qp: QueuePairId(self.qp.get()),
            wr_id: self.wr_id.get(),
            op,
            status,
            bytes: self.bytes.get(),
            solicited: self.flags & CQ_FLAG_SOLICITED != 0,
            invalidated: (self.flags & CQ_FLAG_INVALIDATED != 0).then(|| Stag(self.invalidated.get())),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: EntryBounds = EntryBounds {
        max_sge: 4,
        max_transfer_length: 1 << 20,
    };

    fn sge(i: u32) -> Sge {
        Sge {
            stag: Stag(0x100 + i),
            offset: u64::from(i) * 4096,
            length: 100 + i,
        }
    }

    #[test]
    fn sizes_are_fixed() {
        assert_eq!(SendEntry::SIZE, 160);
        assert_eq!(ReceiveEntry::SIZE, 144);
        assert_eq!(CompletionEntry::SIZE, 32);
    }

    #[test]
    fn every_work_request_round_trips() {
        let remote = RemoteBuffer {
            stag: Stag(0xabcd_ef01),
            offset: 1 << 40,
        };
        let sends = [
            WorkRequest::Send {
                id: 1,
                sgl: vec![sge(0), sge(1)],
                solicited: false,
                invalidate: None,
                silent: false,
            },
            WorkRequest::Send {
                id: 2,
                sgl: vec![],
                solicited: true,
                invalidate: Some(Stag(0)),
                silent: false,
            },
            WorkRequest::Write {
                id: u64::MAX,
                sgl: vec![sge(0), sge(1), sge(2), sge(3)],
                remote,
                silent: false,
            },
            WorkRequest::Read {
                id: 4,
                sink: sge(7),
                remote,
                silent: false,
            },
        ];
        for wr in sends {
            let e = SendEntry::encode(&wr).unwrap();
            assert_eq!(e.decode(BOUNDS).unwrap(), wr);
            assert!(ReceiveEntry::encode(&wr).is_err());
        }
        let rx = WorkRequest::Receive {
            id: 9,
            sgl: vec![sge(3)],
        };
        assert_eq!(ReceiveEntry::encode(&rx).unwrap().decode(BOUNDS).unwrap(), rx);
        assert_eq!(SendEntry::encode(&rx), Err(RingError::Opcode(u8::MAX)));
        let nine = WorkRequest::Receive {
            id: 9,
            sgl: (0..9).map(sge).collect(),
        };
        assert_eq!(
            ReceiveEntry::encode(&nine),
            Err(RingError::SgeCount { count: 9, max: 8 })
        );
    }

    #[test]
    fn each_malformation_has_its_error() {
        let good = SendEntry::encode(&WorkRequest::Write {
            id: 1,
            sgl: vec![sge(0)],
            remote: RemoteBuffer {
                stag: Stag(5),
                offset: 0,
            },
            silent: false,
        })
        .unwrap();
        type Case = (fn(&mut SendEntry), RingError);
        let cases: [Case; 9] = [
            (|e| e.opcode = 3, RingError::Opcode(3)),
            (|e| e.flags = FLAG_SOLICITED, RingError::Flags(1)),
            (|e| e.reserved = 1, RingError::Reserved),
            (|e| e.reserved2 = 1.into(), RingError::Reserved),
            (|e| e.sge_count = 5, RingError::SgeCount { count: 5, max: 4 }),
            (|e| e.sge_count = 255, RingError::SgeCount { count: 255, max: 4 }),
            (|e| e.sges[3].length = 1.into(), RingError::Reserved),
            (
                |e| e.sges[0].length = (2 << 20).into(),
                RingError::Length {
                    total: 2 << 20,
                    max: 1 << 20,
                },
            ),
            (
                |e| {
                    e.opcode = OP_READ;
                    e.sge_count = 2;
                },
                RingError::ReadSink(2),
            ),
        ];
        for (i, (break_it, want)) in cases.into_iter().enumerate() {
            let mut e = good;
            break_it(&mut e);
            assert_eq!(e.decode(BOUNDS), Err(want), "case {i}");
        }
        let mut send = SendEntry::encode(&WorkRequest::Send {
            id: 1,
            sgl: vec![],
            solicited: false,
            invalidate: None,
            silent: false,
        })
        .unwrap();
        send.flags = 0x80;
        assert_eq!(send.decode(BOUNDS), Err(RingError::Flags(0x80)));
        send.flags = 0;
        send.invalidate = 7.into();
        assert_eq!(
            send.decode(BOUNDS),
            Err(RingError::Reserved),
            "an STag without the flag"
        );
        send.invalidate = 0.into();
        send.remote_stag = 7.into();
        assert_eq!(
            send.decode(BOUNDS),
            Err(RingError::Reserved),
            "a Send names no remote"
        );

        // SGE lengths that would overflow a u32 sum are caught in u64.
        let mut big = good;
        big.sge_count = 4;
        for s in &mut big.sges[..4] {
            s.length = u32::MAX.into();
        }
        let bounds = EntryBounds {
            max_sge: 8,
            max_transfer_length: u32::MAX,
        };
        assert_eq!(
            big.decode(bounds),
            Err(RingError::Length {
                total: 4 * u64::from(u32::MAX),
                max: u32::MAX
            })
        );

        let mut rx = ReceiveEntry::new_zeroed();
        rx.reserved[6] = 1;
        assert_eq!(rx.decode(BOUNDS), Err(RingError::Reserved));
    }

    #[test]
    fn completions_round_trip_and_are_checked() {
        let c = Completion {
            qp: QueuePairId(77),
            wr_id: 5,
            op: CompletionOp::Receive,
            status: NdStatus::DataOverrun,
            bytes: 1234,
            solicited: true,
            invalidated: Some(Stag(0x4201)),
        };
        let e = CompletionEntry::encode(&c);
        assert_eq!(e.decode().unwrap(), c);
        let mut bad = e;
        bad.op = 4;
        assert_eq!(bad.decode(), Err(RingError::CompletionOp(4)));
        let mut bad = e;
        bad.status = 0x1234.into();
        assert_eq!(bad.decode(), Err(RingError::Status(0x1234)));
        let mut bad = e;
        bad.flags = 4;
        assert_eq!(bad.decode(), Err(RingError::Flags(4)));
        let mut bad = e;
        bad.reserved = [0, 1];
        assert_eq!(bad.decode(), Err(RingError::Reserved));
    }
}
