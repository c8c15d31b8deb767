//! One handed-off connection's output: FPDUs waiting for its socket, written with gathered writes whose
//! payloads come straight from registered memory (no copy into a buffer of ours), and the completions that
//! wait for them.
//!
//! A Send, Write or Read Response is complete once its last FPDU is in the socket (siw completes on
//! transmit: iWARP has no end-to-end acknowledgement, RFC 5040 §5.5). Since the payload is only read when
//! the kernel copies it, a message's completion is held with the chunk its last FPDU is in and released when
//! that chunk is written: until then the application must not reuse the memory, exactly as the completion
//! says.

use std::collections::VecDeque;
use std::io;
use std::os::fd::AsRawFd;

use bytes::{Buf, Bytes};
use tokio::net::TcpStream;

use crate::engine::framing::{GatherBuf, GatherPiece};
use crate::engine::verbs::{Completion, CompletionQueueId};

/// Pieces per `sendmsg` (Linux's UIO_MAXIOV is 1024).
const MAX_IOV: usize = 1024;

/// Who drives a connection's socket at the moment, which says whose idea of its readiness holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum By {
    /// A task of the application's runtime (its driver, a posting task): tokio's readiness, which its
    /// reactor keeps, is trusted; a socket tokio saw full is not tried until tokio sees room.
    Runtime,
    /// The progress thread ([`super::progress`]), serving a connection its runtime left: that runtime's
    /// reactor may not have run since room (or bytes) came, so the socket is tried directly when tokio
    /// says it is not ready.
    Progress,
}

/// Completions of messages whose last FPDU was written (or dropped).
pub(super) type Held = Vec<(CompletionQueueId, Completion)>;

/// A run of FPDUs and the completions of the messages that end in it.
struct Chunk {
    pieces: VecDeque<GatherPiece>,
    completions: Held,
}

/// What waits for the socket, in order.
#[derive(Default)]
pub(super) struct Output {
    chunks: VecDeque<Chunk>,
    bytes: usize,
}

impl Output {
    /// Bytes waiting.
    pub(super) fn len(&self) -> usize {
        self.bytes
    }

    /// Whether nothing waits (not even completions).
    pub(super) fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Queues bytes of our own (an RTR, a Terminate, a Read Response to an RTR, what a hold kept).
    pub(super) fn push_bytes(&mut self, data: Bytes) {
        if data.is_empty() {
            return;
        }
        self.bytes += data.len();
        self.chunks.push_back(Chunk {
            pieces: VecDeque::from([GatherPiece::Bytes(data)]),
            completions: Vec::new(),
        });
    }

    /// Queues a queue pair's chunk with the completions it holds. An empty chunk behind nothing releases
    /// its completions at once (they are returned).
    pub(super) fn push_gathered(&mut self, buf: GatherBuf, completions: Held) -> Held {
        if buf.is_empty() && self.chunks.is_empty() {
            return completions;
        }
        let pieces: VecDeque<GatherPiece> = buf.into_pieces().into();
        self.bytes += pieces.iter().map(piece_len).sum::<usize>();
        self.chunks.push_back(Chunk { pieces, completions });
        Vec::new()
    }

    /// How many completions wait for their chunks to be written.
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.chunks.iter().map(|c| c.completions.len()).sum()
    }

    /// Drops what waits (the connection failed): the completions held are returned, for they are due
    /// whatever became of the bytes (the messages were handed to the connection, as siw's are).
    pub(super) fn clear(&mut self) -> Held {
        let held = self.take_completions();
        self.chunks.clear();
        self.bytes = 0;
        held
    }

    /// Releases every held completion now (the queue pair is about to be flushed: its completions must
    /// come before the flush's).
    pub(super) fn take_completions(&mut self) -> Held {
        self.chunks
            .iter_mut()
            .flat_map(|c| std::mem::take(&mut c.completions))
            .collect()
    }

    /// One gathered, non-blocking write of what waits; the bytes written. Completions of chunks written
    /// whole go to `released`. `WouldBlock` when the socket has no room (its readiness is then cleared).
    pub(super) fn write_to(&mut self, socket: &TcpStream, released: &mut Held, by: By) -> io::Result<usize> {
        self.release_empty_front(released);
        let mut iov: Vec<libc::iovec> = Vec::with_capacity(MAX_IOV.min(self.chunks.len() * 3));
        'fill: for chunk in &self.chunks {
            for piece in &chunk.pieces {
                if iov.len() == MAX_IOV {
                    break 'fill;
                }
                let (base, len) = match piece {
                    GatherPiece::Bytes(b) => (b.as_ptr(), b.len()),
                    GatherPiece::Memory(m) => match m.memory.range(m.offset, m.len) {
                        Some(p) => (p, m.len),
                        // Checked when appended; never outside. Sent as nothing rather than read wild.
                        None => continue,
                    },
                };
                iov.push(libc::iovec {
                    iov_base: base.cast_mut().cast(),
                    iov_len: len,
                });
            }
        }
        if iov.is_empty() {
            return Ok(0);
        }
        let fd = socket.as_raw_fd();
        let mut tried = false;
        let r = socket.try_io(tokio::io::Interest::WRITABLE, || {
            tried = true;
            send_gathered(fd, &mut iov)
        });
        let n = match r {
            // tokio has not seen room since its last WouldBlock: the progress thread tries anyway (a
            // WouldBlock then leaves tokio's readiness as it was, already clear).
            Err(e) if !tried && by == By::Progress && e.kind() == io::ErrorKind::WouldBlock => {
                send_gathered(fd, &mut iov)?
            }
            r => r?,
        };
        self.advance(n, released);
        Ok(n)
    }

    /// `n` bytes were written: whole pieces go, a partial one is trimmed, and whole chunks release their
    /// completions.
    fn advance(&mut self, mut n: usize, released: &mut Held) {
        self.bytes -= n.min(self.bytes);
        while n > 0 {
            let Some(chunk) = self.chunks.front_mut() else {
                break;
            };
            while n > 0 {
                let Some(piece) = chunk.pieces.front_mut() else {
                    break;
                };
                let len = piece_len(piece);
                if len <= n {
                    n -= len;
                    chunk.pieces.pop_front();
                } else {
                    match piece {
                        GatherPiece::Bytes(b) => b.advance(n),
                        GatherPiece::Memory(m) => {
                            m.offset += n;
                            m.len -= n;
                        }
                    }
                    n = 0;
                }
            }
            if chunk.pieces.is_empty() {
                self.release_empty_front(released);
            }
        }
        self.release_empty_front(released);
    }

    /// Pops written (or empty) chunks at the front, releasing their completions.
    fn release_empty_front(&mut self, released: &mut Held) {
        while self.chunks.front().is_some_and(|c| c.pieces.is_empty()) {
            if let Some(c) = self.chunks.pop_front() {
                released.extend(c.completions);
            }
        }
    }
}

/// One non-blocking `sendmsg` of `iov` on `fd`: the bytes the socket took.
fn send_gathered(fd: std::os::fd::RawFd, iov: &mut [libc::iovec]) -> io::Result<usize> {
    // SAFETY: a zeroed msghdr is valid (no name, no control data); its iovecs point into Bytes the output
    // owns and into registered memory its PinnedMemory handles keep mapped, each range checked to lie
    // inside its mapping. The kernel only reads them during the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len();
    // SAFETY: `fd` is the socket the caller keeps open; `msg` is valid as above. MSG_NOSIGNAL: a reset
    // connection is an EPIPE error here, not a SIGPIPE for the application.
    let r = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

fn piece_len(p: &GatherPiece) -> usize {
    match p {
        GatherPiece::Bytes(b) => b.len(),
        GatherPiece::Memory(m) => m.len,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::framing::{FpduSink, PayloadDst};
    use crate::engine::memory::PinnedMemory;
    use crate::engine::verbs::{CompletionOp, QueuePairId};
    use crate::error::NdStatus;
    use soft_rdma_common::wire::ddp::{DdpRepr, Placement};
    use soft_rdma_common::wire::rdmap::RdmapOpcode;
    use std::sync::Arc;
    use tokio::io::AsyncReadExt;

    fn completion(wr_id: u64) -> (CompletionQueueId, Completion) {
        let c = Completion {
            qp: QueuePairId(1),
            wr_id,
            op: CompletionOp::Write,
            status: NdStatus::Success,
            bytes: 0,
            solicited: false,
            invalidated: None,
        };
        (CompletionQueueId(1), c)
    }

    /// Write FPDUs (of at most 60,000 bytes) carrying `len` bytes from `memory` at `at`, in place.
    fn chunk(memory: &PinnedMemory, at: usize, len: usize) -> GatherBuf {
        let mut g = GatherBuf::default();
        let mut done = 0;
        loop {
            let n = (len - done).min(60_000);
            let ddp = DdpRepr {
                last: done + n == len,
                ulp_control: RdmapOpcode::RdmaWrite.control_byte(),
                placement: Placement::Tagged {
                    stag: 1,
                    offset: (at + done) as u64,
                },
            };
            g.push_fpdu(false, ddp, n, |dst| {
                if let PayloadDst::Gather(mut g) = dst {
                    g.refer(memory.clone(), at + done, n);
                }
            });
            done += n;
            if done == len {
                return g;
            }
        }
    }

    /// Through a socket that takes a little at a time (partial writes mid-piece): the peer gets exactly the
    /// bytes queued, in order, and a chunk's completions are released only once all of it was written,
    /// an empty chunk's in its turn.
    #[tokio::test]
    async fn partial_gathered_writes_send_every_byte_and_release_completions_in_order() {
        let source: Arc<Vec<u8>> = Arc::new((0..600_000u32).map(|i| (i % 253) as u8).collect());
        let base = std::ptr::NonNull::new(source.as_ptr().cast_mut()).unwrap();
        // SAFETY: the Vec's buffer is `len` bytes, never written, and lives as long as `source`.
        let memory = unsafe { PinnedMemory::new(base, source.len(), source.clone()) };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ours = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        socket2::SockRef::from(&ours).set_send_buffer_size(4096).unwrap();
        let (mut peer, _) = listener.accept().await.unwrap();

        let mut out = Output::default();
        let mut expected = Vec::new();
        out.push_bytes(Bytes::from_static(b"rtr!"));
        expected.extend_from_slice(b"rtr!");
        for (i, (at, len)) in [(0usize, 200_000usize), (200_000, 1), (250_000, 300_000)]
            .into_iter()
            .enumerate()
        {
            let g = chunk(&memory, at, len);
            let mut flat = Vec::new();
            for p in chunk(&memory, at, len).into_pieces() {
                match p {
                    GatherPiece::Bytes(b) => flat.extend_from_slice(&b),
                    GatherPiece::Memory(m) => m.memory.copy_to(m.offset, m.len, &mut flat),
                }
            }
            expected.extend_from_slice(&flat);
            assert!(out.push_gathered(g, vec![completion(i as u64)]).is_empty());
        }
        // Requests that failed at transmit: an empty chunk keeps their place behind the others.
        assert!(
            out.push_gathered(GatherBuf::default(), vec![completion(9)])
                .is_empty()
        );
        assert_eq!(out.len(), expected.len());

        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut buf = vec![0u8; 1000];
            loop {
                // A slow reader: the sender meets a full socket again and again.
                tokio::time::sleep(std::time::Duration::from_micros(50)).await;
                match peer.read(&mut buf).await {
                    Ok(0) | Err(_) => return got,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
        });
        let mut released = Vec::new();
        let mut order = Vec::new();
        let mut written = 0;
        while !out.is_empty() {
            match out.write_to(&ours, &mut released, By::Runtime) {
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => ours.writable().await.unwrap(),
                Err(e) => panic!("{e}"),
            }
            for (_, c) in released.drain(..) {
                order.push(c.wr_id);
            }
            // Nothing is released before the bytes of its chunk were all written (the first chunk ends
            // after the 4-byte RTR and 200,000 bytes of payload, plus headers and CRC fields).
            if written < 4 + 200_000 {
                assert!(order.is_empty(), "released at {written} bytes: {order:?}");
            }
        }
        assert_eq!(order, vec![0, 1, 2, 9]);
        assert_eq!(written, expected.len());
        drop(ours);
        let got = reader.await.unwrap();
        assert_eq!(got.len(), expected.len());
        assert!(got == expected, "the bytes differ");
    }

    /// Clearing (a failed connection) and taking completions (a flush) give every held completion, once.
    #[test]
    fn cleared_output_returns_what_it_held_once() {
        let source: Arc<Vec<u8>> = Arc::new(vec![1; 100]);
        let base = std::ptr::NonNull::new(source.as_ptr().cast_mut()).unwrap();
        // SAFETY: as above.
        let memory = unsafe { PinnedMemory::new(base, source.len(), source.clone()) };
        let mut out = Output::default();
        assert!(
            out.push_gathered(chunk(&memory, 0, 50), vec![completion(1)])
                .is_empty()
        );
        assert!(
            out.push_gathered(chunk(&memory, 50, 50), vec![completion(2)])
                .is_empty()
        );
        let taken: Vec<u64> = out.take_completions().into_iter().map(|(_, c)| c.wr_id).collect();
        assert_eq!(taken, vec![1, 2]);
        assert!(out.clear().is_empty());
        assert_eq!((out.len(), out.is_empty()), (0, true));
        // An empty chunk behind nothing is due at once.
        assert_eq!(
            out.push_gathered(GatherBuf::default(), vec![completion(3)]).len(),
            1
        );
    }
}
