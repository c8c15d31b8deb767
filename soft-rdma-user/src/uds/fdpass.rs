//! File-descriptor passing (SCM_RIGHTS) on tokio's `UnixStream`.
//!
//! This module owns the socket-level half of the UDS framing rule "a frame's `fd_count` descriptors travel
//! as SCM_RIGHTS ancillary data attached to the frame's first byte" (see [`super::proto`]):
//! [`write_with_fds`] sends a frame's bytes with its descriptors attached to the first `sendmsg`, and
//! [`read_with_fds`] receives bytes and any descriptors that came with them. Splitting bytes into frames
//! and matching descriptors to frames is the codec's job: descriptors are queued in arrival order and the
//! caller pops `fd_count` of them per frame.
//!
//! Linux stream-socket semantics this relies on: descriptors ride with the first byte of the `sendmsg`
//! that carried them and are delivered by the `recvmsg` that returns that byte. A `recvmsg` may return
//! bytes of several earlier descriptor-less writes before that byte, but the kernel stops right after the
//! segment that carried descriptors, so one `recvmsg` delivers the descriptors of at most one `sendmsg`
//! and descriptors are queued in frame order, by the time their frame's first byte is in the buffer.
//!
//! Both functions work on `&UnixStream`, so they also serve its split halves
//! (`OwnedReadHalf`/`OwnedWriteHalf`/`ReadHalf`/`WriteHalf` all implement `AsRef<UnixStream>`).

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;

use bytes::BytesMut;
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use tokio::io::Interest;
use tokio::net::UnixStream;

/// The most descriptors one frame may carry.
pub const MAX_FDS_PER_FRAME: usize = 4;

/// Bytes [`read_with_fds`] asks for per call.
const READ_CHUNK: usize = 64 * 1024;

/// Linux's `SCM_MAX_FD`: the most descriptors one `sendmsg` can carry, hence the most one `recvmsg` can
/// deliver on a stream socket. Receiving with room for this many means SCM_RIGHTS alone never truncates.
const SCM_MAX_FD: usize = 253;

/// Writes all of `bytes`, attaching `fds` (at most [`MAX_FDS_PER_FRAME`]) to the first `sendmsg`, i.e. to
/// `bytes[0]`. If that `sendmsg` writes only part of `bytes` (the descriptors went with it), the rest is
/// written without descriptors. Waits for writability as needed (`writable().await` + `try_io`).
///
/// `fds` must be non-empty only if `bytes` is (there is no byte to attach them to otherwise:
/// `InvalidInput`). Sends with `MSG_NOSIGNAL`: a closed peer is an `EPIPE` error, never SIGPIPE (this
/// code also runs inside client processes that may not ignore SIGPIPE).
///
/// Not cancel-safe: dropping the future part-way leaves a partial frame on the stream.
pub async fn write_with_fds(stream: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.len() > MAX_FDS_PER_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} file descriptors in one frame; at most {MAX_FDS_PER_FRAME}",
                fds.len()
            ),
        ));
    }
    if bytes.is_empty() {
        if fds.is_empty() {
            return Ok(());
        }
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} file descriptors with an empty write: nothing to attach them to",
                fds.len()
            ),
        ));
    }
    let mut raw = [0 as RawFd; MAX_FDS_PER_FRAME];
    for (slot, fd) in raw.iter_mut().zip(fds) {
        *slot = fd.as_raw_fd();
    }
    let rights = [ControlMessage::ScmRights(&raw[..fds.len()])];

    let mut written = 0;
    while written < bytes.len() {
        // The descriptors go with the first successful sendmsg only. A sendmsg that fails (EAGAIN, EINTR)
        // sends nothing, descriptors included, so they are retried with the same first byte.
        let cmsgs: &[ControlMessage<'_>] = if written == 0 && !fds.is_empty() {
            &rights
        } else {
            &[]
        };
        let rest = &bytes[written..];
        stream.writable().await?;
        let sent = stream.try_io(Interest::WRITABLE, || {
            sendmsg::<()>(
                stream.as_raw_fd(),
                &[IoSlice::new(rest)],
                cmsgs,
                MsgFlags::MSG_NOSIGNAL,
                None,
            )
            .map_err(io::Error::from)
        });
        match sent {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!("UDS sendmsg wrote 0 of {} bytes", rest.len()),
                ));
            }
            Ok(n) => written += n,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "UDS sendmsg ({} of {} bytes written, {} fds {}): {e}",
                        written,
                        bytes.len(),
                        fds.len(),
                        if written == 0 { "pending" } else { "sent" }
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Reads what is available (up to 64 KiB) and appends it to `buf`, pushing any descriptors received with
/// it (SCM_RIGHTS, opened `O_CLOEXEC` via `MSG_CMSG_CLOEXEC`) to the back of `fds` in arrival order.
/// Returns the number of bytes read; 0 is end of stream. Waits for readability as needed
/// (`readable().await` + `try_io`).
///
/// Control-message truncation (`MSG_CTRUNC`) is an `InvalidData` error, since descriptors would have been
/// lost; with room for 253 descriptors (Linux's per-`sendmsg` maximum) plus credentials it cannot happen
/// for SCM_RIGHTS. Any descriptors that did arrive with a truncated message are closed, not leaked, and no
/// bytes are appended to `buf` (the stream is then out of step with its descriptors and should be
/// dropped).
///
/// Cancel-safe: nothing is received unless the call returns.
pub async fn read_with_fds(
    stream: &UnixStream,
    buf: &mut BytesMut,
    fds: &mut VecDeque<OwnedFd>,
) -> io::Result<usize> {
    read_limited::<SCM_MAX_FD>(stream, buf, fds, READ_CHUNK).await
}

/// [`read_with_fds`] with a byte limit per call and a descriptor capacity (tests use small ones).
async fn read_limited<const MAX_FDS: usize>(
    stream: &UnixStream,
    buf: &mut BytesMut,
    fds: &mut VecDeque<OwnedFd>,
    max_bytes: usize,
) -> io::Result<usize> {
    loop {
        stream.readable().await?;
        let mut drained = None;
        match stream.try_io(Interest::READABLE, || {
            let fds_before = fds.len();
            let n = recv_once::<MAX_FDS>(stream.as_raw_fd(), buf, fds, max_bytes)?;
            // A short read that brought no descriptors emptied the socket's queue (Linux stops a stream
            // read early only after a message carrying descriptors): its readiness is cleared as on EAGAIN,
            // so the next read waits for new data instead of paying a `recvmsg` that fails. Data arriving
            // after it raises a new edge, which tokio keeps since it postdates the one cleared.
            if n > 0 && n < max_bytes && fds.len() == fds_before {
                drained = Some(n);
                return Err(io::ErrorKind::WouldBlock.into());
            }
            Ok(n)
        }) {
            _ if drained.is_some() => return Ok(drained.unwrap_or_default()),
            Ok(n) => return Ok(n),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
            Err(e) => return Err(e),
        }
    }
}

/// One non-blocking `recvmsg` of up to `max_bytes` into `buf`'s tail, with room for `MAX_FDS` descriptors.
/// `WouldBlock` (EAGAIN) is returned as is for `try_io`.
fn recv_once<const MAX_FDS: usize>(
    sock: RawFd,
    buf: &mut BytesMut,
    fds: &mut VecDeque<OwnedFd>,
    max_bytes: usize,
) -> io::Result<usize> {
    // The kernel writes into a scratch buffer zero-filled once per thread (handing uninitialised capacity
    // to it as `&mut [u8]` would be unsound in Rust's model), and what arrived is copied to `buf`. Zeroing
    // 64 KiB of `buf` per read instead was 4% of the CPU of a connection-setup run (two messages a step).
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    SCRATCH.with_borrow_mut(|scratch| {
        if scratch.len() < max_bytes {
            scratch.resize(max_bytes, 0);
        }
        recv_into::<MAX_FDS>(sock, &mut scratch[..max_bytes], buf, fds)
    })
}

/// [`recv_once`] into `scratch`; what arrived is appended to `buf`.
fn recv_into<const MAX_FDS: usize>(
    sock: RawFd,
    scratch: &mut [u8],
    buf: &mut BytesMut,
    fds: &mut VecDeque<OwnedFd>,
) -> io::Result<usize> {
    // Room for a full SCM_RIGHTS message and for credentials, should SO_PASSCRED ever be enabled.
    let mut cmsg_buf = nix::cmsg_space!([RawFd; MAX_FDS], libc::ucred);
    let received = {
        let mut iov = [IoSliceMut::new(scratch)];
        recvmsg::<()>(sock, &mut iov, Some(&mut cmsg_buf), MsgFlags::MSG_CMSG_CLOEXEC).map(|msg| {
            let truncated = msg.flags.contains(MsgFlags::MSG_CTRUNC);
            let mut arrived = Vec::new();
            if !truncated {
                // `cmsgs()` only fails on MSG_CTRUNC, excluded above.
                for cmsg in msg.cmsgs().into_iter().flatten() {
                    if let ControlMessageOwned::ScmRights(raw) = cmsg {
                        arrived.extend(raw.into_iter().map(|fd| {
                            // SAFETY: the kernel installed `fd` in this process's table for this recvmsg;
                            // nothing else knows of it, so this is its only owner.
                            unsafe { OwnedFd::from_raw_fd(fd) }
                        }));
                    }
                }
            }
            (msg.bytes, truncated, arrived)
        })
    };
    match received {
        Ok((n, false, arrived)) => {
            buf.extend_from_slice(&scratch[..n]);
            fds.extend(arrived);
            Ok(n)
        }
        Ok((n, true, _)) => {
            let closed = close_truncated_fds(&cmsg_buf);
            Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "UDS recvmsg: control message truncated (MSG_CTRUNC) with {n} bytes; file descriptors were \
                     lost ({closed} that did arrive were closed)"
                ),
            ))
        }
        Err(errno) => {
            let e = io::Error::from(errno);
            if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) {
                Err(e)
            } else {
                Err(io::Error::new(e.kind(), format!("UDS recvmsg: {errno}")))
            }
        }
    }
}

/// After MSG_CTRUNC nix refuses to iterate the control messages, but the descriptors that fit were
/// installed in this process: walks the kernel-written buffer and closes them. Returns how many.
///
/// The buffer was zero-filled before `recvmsg`, so the walk ends at the first header whose length is
/// shorter than a header (the unused tail); a truncated non-SCM_RIGHTS message is skipped by its type, and
/// the kernel only ever writes whole descriptors into a truncated SCM_RIGHTS message.
fn close_truncated_fds(cmsg_buf: &[u8]) -> usize {
    // CMSG_ALIGN on Linux aligns to `sizeof(long)`; CMSG_LEN(0) is the aligned header size.
    const ALIGN: usize = size_of::<usize>();
    let hdr_len = size_of::<libc::cmsghdr>().next_multiple_of(ALIGN);
    let mut offset = 0;
    let mut closed = 0;
    while offset + hdr_len <= cmsg_buf.len() {
        // SAFETY: `offset + hdr_len <= len` and `hdr_len >= size_of::<cmsghdr>()`, so the read is in bounds;
        // `cmsghdr` is plain integers (every bit pattern is valid) and `read_unaligned` needs no alignment.
        let hdr: libc::cmsghdr = unsafe { ptr::read_unaligned(cmsg_buf[offset..].as_ptr().cast()) };
        // `cmsg_len` is `size_t` on glibc and `socklen_t` on musl.
        #[allow(clippy::unnecessary_cast)]
        let len = hdr.cmsg_len as usize;
        if len < hdr_len || len > cmsg_buf.len() - offset {
            break;
        }
        if hdr.cmsg_level == libc::SOL_SOCKET && hdr.cmsg_type == libc::SCM_RIGHTS {
            for bytes in cmsg_buf[offset + hdr_len..offset + len].chunks_exact(size_of::<RawFd>()) {
                let mut raw = [0u8; size_of::<RawFd>()];
                raw.copy_from_slice(bytes);
                // SAFETY: the kernel wrote this descriptor into an SCM_RIGHTS message of this recvmsg and
                // installed it in this process's table; nothing else owns it, so closing it is ours to do.
                drop(unsafe { OwnedFd::from_raw_fd(RawFd::from_ne_bytes(raw)) });
                closed += 1;
            }
        }
        offset += len.next_multiple_of(ALIGN);
    }
    closed
}

#[cfg(test)]
mod tests {
    use bytes::{Buf, BufMut};

    use super::*;
    use crate::shm::SharedMemory;

    fn frame(fd_count: u8, message: &[u8]) -> Vec<u8> {
        let mut f = Vec::new();
        f.put_u32_le(message.len() as u32 + 1);
        f.put_u8(fd_count);
        f.put_slice(message);
        f
    }

    /// Pops whole frames off `buf`, each with the descriptors it announces.
    fn pop_frames(buf: &mut BytesMut, fds: &mut VecDeque<OwnedFd>, out: &mut Vec<(Vec<u8>, Vec<OwnedFd>)>) {
        while buf.len() >= 5 {
            let len = u32::from_le_bytes(buf[..4].try_into().unwrap()) as usize;
            if buf.len() < 4 + len {
                return;
            }
            buf.advance(4);
            let count = buf.get_u8() as usize;
            assert!(
                fds.len() >= count,
                "frame announces {count} fds, {} arrived",
                fds.len()
            );
            let frame_fds = fds.drain(..count).collect();
            out.push((buf.split_to(len - 1).to_vec(), frame_fds));
        }
    }

    #[tokio::test]
    async fn fdpass_three_frames_read_in_small_pieces() {
        let (a, b) = UnixStream::pair().unwrap();
        let m1 = SharedMemory::create("fdpass-test-1", 4096).unwrap();
        let m2 = SharedMemory::create("fdpass-test-2", 8192).unwrap();
        m1.write_at(0, b"first region").unwrap();
        m2.write_at(8000, b"second region").unwrap();

        let f1 = frame(0, b"hello");
        let f2 = frame(2, b"here are two regions");
        let f3 = frame(0, b"bye");
        write_with_fds(&a, &f1, &[]).await.unwrap();
        write_with_fds(&a, &f2, &[m1.fd().unwrap(), m2.fd().unwrap()])
            .await
            .unwrap();
        write_with_fds(&a, &f3, &[]).await.unwrap();
        drop(a);

        let mut buf = BytesMut::new();
        let mut fds = VecDeque::new();
        let mut frames = Vec::new();
        let mut total = 0;
        loop {
            let n = read_limited::<SCM_MAX_FD>(&b, &mut buf, &mut fds, 3)
                .await
                .unwrap();
            if n == 0 {
                break;
            }
            assert!(n <= 3);
            total += n;
            // The descriptors arrive exactly with frame 2's first byte, never earlier or later.
            let seen_fds = fds.len() + frames.iter().map(|(_, f): &(_, Vec<_>)| f.len()).sum::<usize>();
            assert_eq!(
                seen_fds,
                if total > f1.len() { 2 } else { 0 },
                "after {total} bytes"
            );
            pop_frames(&mut buf, &mut fds, &mut frames);
        }
        assert_eq!(total, f1.len() + f2.len() + f3.len());
        assert!(buf.is_empty() && fds.is_empty());
        assert_eq!(frames.len(), 3);
        assert_eq!(frames[0].0, b"hello");
        assert!(frames[0].1.is_empty());
        assert_eq!(frames[1].0, b"here are two regions");
        assert_eq!(frames[2].0, b"bye");
        assert!(frames[2].1.is_empty());

        // The received descriptors are the same memory: map them and compare both ways.
        let mut received = std::mem::take(&mut frames[1].1).into_iter();
        let fd1 = received.next().unwrap();
        // Received descriptors are close-on-exec.
        let flags = nix::fcntl::fcntl(&fd1, nix::fcntl::FcntlArg::F_GETFD).unwrap();
        assert_ne!(flags & libc::FD_CLOEXEC, 0);
        let r1 = SharedMemory::from_fd(fd1, 4096).unwrap();
        let r2 = SharedMemory::from_fd(received.next().unwrap(), 8192).unwrap();
        let mut got = [0u8; 13];
        r1.read_at(0, &mut got[..12]).unwrap();
        assert_eq!(&got[..12], b"first region");
        r2.read_at(8000, &mut got).unwrap();
        assert_eq!(&got, b"second region");
        r2.write_at(0, b"from the daemon").unwrap();
        let mut got = [0u8; 15];
        m2.read_at(0, &mut got).unwrap();
        assert_eq!(&got, b"from the daemon");
        assert!(r1.fd().is_none(), "the daemon's mapping keeps no descriptor");
    }

    #[tokio::test]
    async fn fdpass_large_write_with_fd_and_concurrent_reader() {
        const LEN: usize = 4 * 1024 * 1024;
        let (a, b) = UnixStream::pair().unwrap();
        let m = SharedMemory::create("fdpass-test-large", 4096).unwrap();
        m.write_at(0, b"big").unwrap();
        let data: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();

        let reader = tokio::spawn(async move {
            let mut buf = BytesMut::new();
            let mut fds = VecDeque::new();
            let mut reads = 0;
            while read_with_fds(&b, &mut buf, &mut fds).await.unwrap() != 0 {
                reads += 1;
            }
            (buf, fds, reads)
        });
        write_with_fds(&a, &data, &[m.fd().unwrap()]).await.unwrap();
        drop(a);
        let (buf, mut fds, reads) = reader.await.unwrap();
        assert!(reads > 1, "4 MiB cannot arrive in one read");
        assert_eq!(buf.len(), LEN);
        assert!(buf[..] == data[..], "bytes arrive intact and in order");
        assert_eq!(fds.len(), 1);
        let r = SharedMemory::from_fd(fds.pop_front().unwrap(), 4096).unwrap();
        let mut got = [0u8; 3];
        r.read_at(0, &mut got).unwrap();
        assert_eq!(&got, b"big");
    }

    #[tokio::test]
    async fn fdpass_split_halves_and_argument_checks() {
        let (a, b) = UnixStream::pair().unwrap();
        let (_ar, aw) = a.into_split();
        let (br, _bw) = b.into_split();
        let m = SharedMemory::create("fdpass-test-args", 4096).unwrap();

        let five = [
            m.fd().unwrap(),
            m.fd().unwrap(),
            m.fd().unwrap(),
            m.fd().unwrap(),
            m.fd().unwrap(),
        ];
        let e = write_with_fds(aw.as_ref(), b"x", &five).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let e = write_with_fds(aw.as_ref(), b"", &[m.fd().unwrap()])
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        write_with_fds(aw.as_ref(), b"", &[]).await.unwrap();

        let four = [m.fd().unwrap(), m.fd().unwrap(), m.fd().unwrap(), m.fd().unwrap()];
        write_with_fds(aw.as_ref(), b"four", &four).await.unwrap();
        let mut buf = BytesMut::new();
        let mut fds = VecDeque::new();
        assert_eq!(read_with_fds(br.as_ref(), &mut buf, &mut fds).await.unwrap(), 4);
        assert_eq!(&buf[..], b"four");
        assert_eq!(fds.len(), 4);
    }

    #[tokio::test]
    async fn fdpass_truncated_control_message_is_an_error() {
        let (a, b) = UnixStream::pair().unwrap();
        let m = SharedMemory::create("fdpass-test-ctrunc", 4096).unwrap();
        // More descriptors than the reader below has room for (bypassing MAX_FDS_PER_FRAME).
        let raw = [m.fd().unwrap().as_raw_fd(); 16];
        let sent = sendmsg::<()>(
            a.as_raw_fd(),
            &[IoSlice::new(b"abc")],
            &[ControlMessage::ScmRights(&raw)],
            MsgFlags::empty(),
            None,
        )
        .unwrap();
        assert_eq!(sent, 3);

        let mut buf = BytesMut::from(&b"kept"[..]);
        let mut fds = VecDeque::new();
        // Room for one descriptor plus credentials: 56 bytes on 64-bit Linux, which hold 10 descriptors.
        let e = read_limited::<1>(&b, &mut buf, &mut fds, 64).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("MSG_CTRUNC"), "{e}");
        assert!(fds.is_empty());
        assert_eq!(&buf[..], b"kept", "no bytes appended on error");
        // The descriptors that did arrive were found and closed, not leaked.
        let room = (nix::cmsg_space!([RawFd; 1], libc::ucred).len() - size_of::<libc::cmsghdr>())
            / size_of::<RawFd>();
        assert!(
            e.to_string()
                .contains(&format!("({room} that did arrive were closed)")),
            "{e}"
        );
        m.write_at(0, b"still mapped").unwrap();
    }
}
