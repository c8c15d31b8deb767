//! The perf control messages on the wire: the Connect and Accept private data ([`Request`], [`Answer`])
//! and the 24-byte control Sends ([`Ctrl`]) with their posted buffers (layouts in the parent's docs).

use super::*;

/// What the client asks for (its Connect private data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Request {
    pub(super) test: Test,
    pub(super) latency: bool,
    pub(super) busy_poll: bool,
    pub(super) size: u32,
    pub(super) iters: u32,
    pub(super) depth: u32,
    pub(super) client: RemoteBuffer,
}

pub(super) const MAGIC: &[u8; 4] = b"SRPF";

pub(super) const VERSION: u8 = 1;

impl Request {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(32);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&[
            VERSION,
            self.test.code(),
            u8::from(self.latency) | (u8::from(self.busy_poll) << 1),
            0,
        ]);
        b.extend_from_slice(&self.size.to_be_bytes());
        b.extend_from_slice(&self.iters.to_be_bytes());
        b.extend_from_slice(&self.depth.to_be_bytes());
        b.extend_from_slice(&self.client.stag.0.to_be_bytes());
        b.extend_from_slice(&self.client.offset.to_be_bytes());
        b
    }

    pub(super) fn decode(b: &[u8]) -> Result<Request> {
        ensure!(
            b.len() >= 32 && &b[..4] == MAGIC,
            "not a soft-rdma perf client (private data {})",
            super::super::show(b)
        );
        ensure!(
            b[4] == VERSION,
            "perf protocol version {} (this is {VERSION})",
            b[4]
        );
        let test = Test::from_code(b[5]).with_context(|| format!("unknown test {}", b[5]))?;
        let u32_at = |o: usize| u32::from_be_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let r = Request {
            test,
            latency: b[6] & 1 != 0,
            busy_poll: b[6] & 2 != 0,
            size: u32_at(8),
            iters: u32_at(12),
            depth: u32_at(16),
            client: RemoteBuffer {
                stag: Stag(u32_at(20)),
                offset: u64::from_be_bytes(b[24..32].try_into().expect("8 bytes")),
            },
        };
        ensure!(r.size > 0 && r.iters > 0 && r.depth > 0, "bad request {r:?}");
        Ok(r)
    }
}

/// The server's answer (its Accept private data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Answer {
    pub(super) buffer: RemoteBuffer,
    pub(super) credits: u32,
}

impl Answer {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(20);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&self.buffer.stag.0.to_be_bytes());
        b.extend_from_slice(&self.buffer.offset.to_be_bytes());
        b.extend_from_slice(&self.credits.to_be_bytes());
        b
    }

    pub(super) fn decode(b: &[u8]) -> Result<Answer> {
        ensure!(
            b.len() >= 20 && &b[..4] == MAGIC,
            "the server is not a soft-rdma perf server (private data {})",
            super::super::show(b)
        );
        Ok(Answer {
            buffer: RemoteBuffer {
                stag: Stag(u32::from_be_bytes(b[4..8].try_into().expect("4"))),
                offset: u64::from_be_bytes(b[8..16].try_into().expect("8")),
            },
            credits: u32::from_be_bytes(b[16..20].try_into().expect("4")),
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Credit = 1,
    Done = 2,
    Fin = 3,
}

/// A control message (a 24-byte Send).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Ctrl {
    pub(super) kind: Kind,
    pub(super) count: u32,
    pub(super) bytes: u64,
    pub(super) bad: u32,
}

pub(super) const CTRL_LEN: usize = 24;

/// Control slots: Receives at 0..CTRL_SLOTS, Sends at CTRL_SLOTS..2*CTRL_SLOTS (32 bytes each).
pub(super) const CTRL_SLOTS: usize = 16;

pub(super) const CTRL_SLOT: usize = 32;

/// Work-request ids of control Receives and Sends (data operations use their index).
pub(super) const CTRL_RECV: u64 = 1 << 62;

pub(super) const CTRL_SEND: u64 = 1 << 61;

impl Ctrl {
    pub(super) fn encode(&self) -> [u8; CTRL_LEN] {
        let mut b = [0; CTRL_LEN];
        b[0..4].copy_from_slice(&(self.kind as u32).to_be_bytes());
        b[4..8].copy_from_slice(&self.count.to_be_bytes());
        b[8..16].copy_from_slice(&self.bytes.to_be_bytes());
        b[16..20].copy_from_slice(&self.bad.to_be_bytes());
        b
    }

    pub(super) fn decode(b: &[u8]) -> Result<Ctrl> {
        ensure!(b.len() >= CTRL_LEN, "short control message ({} bytes)", b.len());
        let kind = match u32::from_be_bytes(b[0..4].try_into().expect("4")) {
            1 => Kind::Credit,
            2 => Kind::Done,
            3 => Kind::Fin,
            k => bail!("unknown control message kind {k}"),
        };
        Ok(Ctrl {
            kind,
            count: u32::from_be_bytes(b[4..8].try_into().expect("4")),
            bytes: u64::from_be_bytes(b[8..16].try_into().expect("8")),
            bad: u32::from_be_bytes(b[16..20].try_into().expect("4")),
        })
    }
}

/// Control-message buffers: Receives in slots 0..16, Sends in slots 16..32.
pub(super) struct CtrlBufs {
    pub(super) mr: MemoryRegion,
    pub(super) next_send: usize,
}

impl CtrlBufs {
    pub(super) async fn new(adapter: &Adapter) -> Result<CtrlBufs> {
        Ok(CtrlBufs {
            mr: adapter
                .register_memory(2 * CTRL_SLOTS * CTRL_SLOT, Access::LOCAL_WRITE)
                .await?,
            next_send: 0,
        })
    }

    pub(super) fn post_receive(&self, qp: &QueuePair, slot: usize) -> Result<()> {
        qp.receive(
            CTRL_RECV | slot as u64,
            &[self.mr.sge((slot * CTRL_SLOT) as u64, CTRL_SLOT as u32)],
        )?;
        Ok(())
    }

    /// Reads the control message a Receive completion delivered, and reposts its slot.
    pub(super) fn take(&self, qp: &QueuePair, c: &Completion) -> Result<Ctrl> {
        ensure!(c.wr_id & CTRL_RECV != 0, "unexpected receive completion {c:?}");
        let slot = (c.wr_id & !CTRL_RECV) as usize;
        ensure!(slot < CTRL_SLOTS, "unexpected receive completion {c:?}");
        let len = (c.bytes as usize).min(CTRL_SLOT);
        let msg = Ctrl::decode(&self.mr.to_vec(slot * CTRL_SLOT, len)?)?;
        self.post_receive(qp, slot)?;
        Ok(msg)
    }

    /// Sends `m` from the next send slot (at most CTRL_SLOTS may be outstanding).
    pub(super) fn send(&mut self, qp: &QueuePair, m: Ctrl) -> Result<()> {
        let slot = CTRL_SLOTS + self.next_send % CTRL_SLOTS;
        self.next_send += 1;
        let off = slot * CTRL_SLOT;
        self.mr.write_at(off, &m.encode())?;
        qp.send(
            CTRL_SEND | self.next_send as u64,
            &[self.mr.sge(off as u64, CTRL_LEN as u32)],
        )?;
        Ok(())
    }
}
