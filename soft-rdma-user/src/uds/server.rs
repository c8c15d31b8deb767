//! The daemon's side of the UDS protocol: one session per client connection.
//!
//! A session starts with `Hello` (version checked) and gets `Welcome`; its requests go to the event loop,
//! whose answers and completions come back in order on the session's writer. A session that closes, or sends
//! anything malformed (answered with `Goodbye` and INVALID_PARAMETER), is closed in the engine, which
//! releases everything it held. Peer credentials (SO_PEERCRED) are logged with each session. Once a Goodbye
//! is queued (a protocol error, or the event loop ending the session) nothing more the client sends is read.
//!
//! Flow control ([`Backlog`]): a session reads requests only while its client keeps up with the answers, so
//! a client that never reads stalls itself, not the daemon's memory.
//!
//! RegisterMemory frames carry the region's memfd (SCM_RIGHTS, read with [`super::fdpass`]); the session
//! maps it here ([`SharedMemory::from_fd`], which refuses files that are too short or not sealed against
//! shrinking) so the event loop only ever sees mapped memory.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use anyhow::{Context, bail};
use std::collections::VecDeque;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Notify, mpsc};
use tracing::{Instrument, info, info_span, warn};

use super::fdpass::read_with_fds;
use super::proto::{
    ClientMessage, MAX_CLIENT_FRAME, PROTOCOL_VERSION, ProtoError, ServerMessage, split_frame, truncated,
};
use crate::engine::api::{Access, AdapterInfo, CmRequest, QueuePairId, RequestId, SessionId, WorkRequest};
use crate::error::{Error, NdStatus};
use crate::shm::SharedMemory;

/// File descriptors a session may have received ahead of the frames that announce them.
const MAX_PENDING_FDS: usize = 16;

/// What sessions tell the event loop.
#[derive(Debug)]
pub enum SessionInput {
    Opened {
        session: SessionId,
        writer: mpsc::UnboundedSender<ServerMessage>,
    },
    Request {
        session: SessionId,
        id: RequestId,
        request: CmRequest,
    },
    /// RegisterMemory with its memfd already mapped.
    RegisterMemory {
        session: SessionId,
        id: RequestId,
        memory: SharedMemory,
        access: Access,
    },
    Post {
        session: SessionId,
        qp: QueuePairId,
        requests: Vec<WorkRequest>,
    },
    Closed {
        session: SessionId,
    },
}

/// Binds the daemon's socket: creates the directory, refuses to start if a live daemon answers there,
/// replaces a stale socket file, sets mode 0660 and, if given, the group.
pub async fn bind(path: &Path, group: Option<&str>) -> anyhow::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if path.exists() {
        if UnixStream::connect(path).await.is_ok() {
            bail!("another soft-rdmad is already serving {}", path.display());
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing the stale socket {}", path.display()))?;
    }
    let listener = UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    if let Some(group) = group {
        let g = nix::unistd::Group::from_name(group)?.with_context(|| format!("no group named {group}"))?;
        nix::unistd::chown(path, None, Some(g.gid))
            .with_context(|| format!("chgrp {group} {}", path.display()))?;
    }
    Ok(listener)
}

/// Accepts sessions forever.
pub async fn serve(
    listener: UnixListener,
    inputs: mpsc::UnboundedSender<SessionInput>,
    adapter: AdapterInfo,
    path: PathBuf,
) {
    let next = Arc::new(AtomicU64::new(1));
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                crate::warn_limited!(socket = %path.display(), error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let session = SessionId(next.fetch_add(1, Ordering::Relaxed));
        // Who the client is, from the kernel (SO_PEERCRED): logged with everything the session does.
        let (pid, uid, gid) = match stream.peer_cred() {
            Ok(c) => (c.pid(), Some(c.uid()), Some(c.gid())),
            Err(e) => {
                warn!(session = session.0, error = %e, "no peer credentials (SO_PEERCRED)");
                (None, None, None)
            }
        };
        let span = info_span!("session", id = session.0, pid, uid, gid);
        tokio::spawn(run_session(session, stream, inputs.clone(), adapter.clone()).instrument(span));
    }
}

async fn run_session(
    session: SessionId,
    stream: UnixStream,
    inputs: mpsc::UnboundedSender<SessionInput>,
    adapter: AdapterInfo,
) {
    info!("session opened");
    let (rd, wr) = stream.into_split();
    let (tx, rx) = mpsc::unbounded_channel::<ServerMessage>();
    let backlog = Arc::new(Backlog::default());
    let mut writer = tokio::spawn(write_session(wr, rx, backlog.clone()));
    // The writer stops after a Goodbye (the event loop ends a session that Posts to a queue pair it does not
    // own; shutdown) or when the client takes no more: the session is over then, and nothing more it sends
    // may be acted on.
    let outcome = tokio::select! {
        outcome = read_session(session, rd.as_ref(), &tx, &inputs, adapter, &backlog) => Some(outcome),
        () = backlog.goodbye() => {
            info!("session ended by soft-rdmad (Goodbye)");
            None
        }
        end = &mut writer => {
            match end {
                Ok(WriterEnd::Failed(e)) => info!(error = %e, "session ended: the client takes no more replies"),
                _ => info!("session ended by soft-rdmad"),
            }
            None
        }
    };
    match &outcome {
        Some(Ok(())) => info!("session closed by the client"),
        Some(Err(e)) => {
            crate::warn_limited!(error = %e, "session ended: protocol error");
            let _ = tx.send(ServerMessage::Goodbye {
                error: Error::new(NdStatus::InvalidParameter, e.to_string()),
            });
        }
        None => {}
    }
    let _ = inputs.send(SessionInput::Closed { session });
    drop(tx);
    // The writer delivers what is queued (a Goodbye last), unless the client never reads it: then it ends
    // with the client's socket, on its own.
    if outcome.is_some() {
        let _ = writer.await;
    }
}

/// What the daemon owes a client and the client has not taken yet: encoded bytes not yet written, and
/// requests not yet answered. A client that sends requests without reading the answers would otherwise make
/// the daemon queue answers without bound (tens of times the bytes it sent): past [`MAX_BACKLOG`] bytes or
/// [`MAX_UNANSWERED`] requests its session reads nothing more until the client catches up.
#[derive(Default)]
struct Backlog {
    bytes: AtomicUsize,
    unanswered: AtomicUsize,
    /// The writer has taken a Goodbye: the session is over, even before the client reads it.
    goodbye: AtomicBool,
    /// Any of the above changed.
    drained: Notify,
}

/// Unsent bytes past which a session reads no more requests (well above what a client that reads its answers
/// ever leaves behind; a Status report may be larger, and is sent whole).
const MAX_BACKLOG: usize = 4 << 20;

/// Requests a session may have with the event loop at once (a client may pipeline this many).
const MAX_UNANSWERED: usize = 4096;

/// Queued messages the writer puts into one write.
const COALESCE: usize = 256 << 10;

impl Backlog {
    fn set_bytes(&self, bytes: usize) {
        let before = self.bytes.swap(bytes, Ordering::AcqRel);
        if before > MAX_BACKLOG && bytes <= MAX_BACKLOG {
            self.drained.notify_waiters();
        }
    }

    fn asked(&self) {
        self.unanswered.fetch_add(1, Ordering::AcqRel);
    }

    fn answered(&self) {
        let before = self.unanswered.fetch_sub(1, Ordering::AcqRel);
        if before >= MAX_UNANSWERED || before == 1 {
            self.drained.notify_waiters();
        }
    }

    fn has_room(&self, heavy: bool) -> bool {
        let unanswered = self.unanswered.load(Ordering::Acquire);
        self.bytes.load(Ordering::Acquire) <= MAX_BACKLOG
            && if heavy {
                unanswered == 0
            } else {
                unanswered < MAX_UNANSWERED
            }
    }

    fn said_goodbye(&self) {
        self.goodbye.store(true, Ordering::Release);
        self.drained.notify_waiters();
    }

    /// Waits until the writer has taken a Goodbye.
    async fn goodbye(&self) {
        loop {
            let changed = self.drained.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.goodbye.load(Ordering::Acquire) {
                return;
            }
            changed.await;
        }
    }

    /// Waits until the client has caught up enough for one more message. A `heavy` one (a Status report,
    /// which may be megabytes) also waits for every earlier answer, so that the bytes it adds are counted
    /// before anything after it is read: the answers in flight beside the backlog are all small.
    async fn room(&self, heavy: bool) {
        loop {
            let drained = self.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            if self.has_room(heavy) {
                return;
            }
            drained.await;
        }
    }
}

/// Writes the session's messages to the client: whatever is queued goes out in as few writes as the socket
/// takes; while the client does not read, messages are taken off the queue into the backlog (which the
/// reader watches). Ends after a Goodbye, when writing fails, or when every sender is gone.
async fn write_session(
    mut wr: tokio::net::unix::OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<ServerMessage>,
    backlog: Arc<Backlog>,
) -> WriterEnd {
    let mut out = BytesMut::new();
    let mut open = true;
    let mut end = WriterEnd::Drained;
    while open || !out.is_empty() {
        tokio::select! {
            biased;
            // Cancel-safe: a write that did not complete wrote nothing.
            written = wr.write_buf(&mut out), if !out.is_empty() => match written {
                Ok(0) => {
                    end = WriterEnd::Failed(std::io::ErrorKind::WriteZero.into());
                    break;
                }
                Ok(_) => {}
                Err(e) => {
                    end = WriterEnd::Failed(e);
                    break;
                }
            },
            msg = rx.recv(), if open => {
                let mut next = msg;
                loop {
                    match next {
                        Some(msg) => {
                            msg.encode(&mut out);
                            if matches!(msg, ServerMessage::Response { .. }) {
                                backlog.answered();
                            }
                            if matches!(msg, ServerMessage::Goodbye { .. }) {
                                open = false;
                                end = WriterEnd::Goodbye;
                                backlog.said_goodbye();
                                break;
                            }
                        }
                        None => {
                            open = false;
                            break;
                        }
                    }
                    // Whatever else is queued goes in the same write.
                    if out.len() >= COALESCE {
                        break;
                    }
                    match rx.try_recv() {
                        Ok(msg) => next = Some(msg),
                        Err(mpsc::error::TryRecvError::Empty) => break,
                        Err(mpsc::error::TryRecvError::Disconnected) => next = None,
                    }
                }
            }
        }
        backlog.set_bytes(out.len());
    }
    let _ = wr.shutdown().await;
    end
}

/// Why a session's writer stopped.
enum WriterEnd {
    /// It sent a Goodbye (the last message of a session).
    Goodbye,
    /// Writing to the client failed (it is gone, or closed its reading side).
    Failed(std::io::Error),
    /// The session dropped its sender: it ended first.
    Drained,
}

async fn read_session(
    session: SessionId,
    rd: &UnixStream,
    tx: &mpsc::UnboundedSender<ServerMessage>,
    inputs: &mpsc::UnboundedSender<SessionInput>,
    adapter: AdapterInfo,
    backlog: &Backlog,
) -> Result<(), ProtoError> {
    let mut buf = BytesMut::with_capacity(4096);
    let mut fds = VecDeque::new();
    let mut hello = false;
    loop {
        loop {
            // Every message may add to what the client has to read: none while it is behind.
            backlog.room(false).await;
            let Some(frame) = split_frame(&mut buf, MAX_CLIENT_FRAME)? else {
                break;
            };
            let msg = ClientMessage::decode(&frame)?;
            if let ClientMessage::Request {
                request: CmRequest::Status,
                ..
            } = &msg
            {
                backlog.room(true).await;
            }
            match msg {
                ClientMessage::Hello { version, client_name } => {
                    if hello {
                        return Err(ProtoError::Malformed("a second Hello".into()));
                    }
                    if version != PROTOCOL_VERSION {
                        return Err(ProtoError::UnsupportedVersion(version));
                    }
                    hello = true;
                    info!(client = %client_name, "hello");
                    let _ = tx.send(ServerMessage::Welcome {
                        version: PROTOCOL_VERSION,
                        session,
                        adapter: adapter.clone(),
                    });
                    let _ = inputs.send(SessionInput::Opened {
                        session,
                        writer: tx.clone(),
                    });
                }
                _ if !hello => {
                    return Err(ProtoError::Malformed("a Request before Hello".into()));
                }
                ClientMessage::Request {
                    id,
                    request: CmRequest::RegisterMemory { length, access },
                } => {
                    let fd = fds.pop_front().ok_or(ProtoError::MissingFds(1))?;
                    backlog.asked();
                    let mapped = usize::try_from(length)
                        .map_err(|_| std::io::Error::other("length exceeds the address space"))
                        .and_then(|len| SharedMemory::from_fd(fd, len));
                    match mapped {
                        Ok(memory) => {
                            let _ = inputs.send(SessionInput::RegisterMemory {
                                session,
                                id,
                                memory,
                                access,
                            });
                        }
                        Err(e) => {
                            let _ = tx.send(ServerMessage::Response {
                                id,
                                result: Err(Error::new(
                                    NdStatus::InvalidParameter,
                                    format!("cannot map the region's memfd ({length} bytes): {e}"),
                                )),
                            });
                        }
                    }
                }
                ClientMessage::Request { id, request } => {
                    backlog.asked();
                    let _ = inputs.send(SessionInput::Request { session, id, request });
                }
                ClientMessage::Post { qp, requests } => {
                    let _ = inputs.send(SessionInput::Post {
                        session,
                        qp,
                        requests,
                    });
                }
            }
        }
        match read_with_fds(rd, &mut buf, &mut fds).await {
            // The end of the stream: a clean close, unless it cuts a frame short.
            Ok(0) => return truncated(&buf).map_or(Ok(()), Err),
            // A client that exits with replies unread resets the socket: an ordinary end of session.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(()),
            Ok(_) => {}
            Err(e) => return Err(ProtoError::Malformed(format!("read failed: {e}"))),
        }
        if fds.len() > MAX_PENDING_FDS {
            return Err(ProtoError::Malformed(format!(
                "{} file descriptors sent without frames that take them",
                fds.len()
            )));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::api::CmResponse;
    use crate::engine::cm::CmConfig;
    use tokio::io::AsyncReadExt;

    /// A session over a socket pair: the client's end, what the session tells the event loop, the task.
    fn session() -> (
        UnixStream,
        mpsc::UnboundedReceiver<SessionInput>,
        tokio::task::JoinHandle<()>,
    ) {
        let (client, server) = UnixStream::pair().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        let adapter = CmConfig::default_siw_compatible().adapter;
        let task = tokio::spawn(run_session(SessionId(1), server, tx, adapter));
        (client, rx, task)
    }

    fn frame(m: &ClientMessage) -> BytesMut {
        let mut b = BytesMut::new();
        m.encode(&mut b);
        b
    }

    /// Everything the daemon sends until it closes.
    async fn read_all(client: &mut UnixStream) -> Vec<ServerMessage> {
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        loop {
            while let Some(f) = split_frame(&mut buf, super::super::proto::MAX_SERVER_FRAME).unwrap() {
                got.push(ServerMessage::decode(&f).unwrap());
            }
            let n = tokio::time::timeout(std::time::Duration::from_secs(5), client.read_buf(&mut buf))
                .await
                .expect("the session closes")
                .unwrap();
            if n == 0 {
                return got;
            }
        }
    }

    /// The session task finishes (at most 5 s).
    async fn ended(task: tokio::task::JoinHandle<()>) {
        tokio::time::timeout(std::time::Duration::from_secs(5), task)
            .await
            .expect("the session ends")
            .unwrap();
    }

    fn hello() -> ClientMessage {
        ClientMessage::Hello {
            version: PROTOCOL_VERSION,
            client_name: "test".into(),
        }
    }

    /// A frame cut short by the end of the stream is a protocol error the client hears about (if it only
    /// half-closed), not a clean close.
    #[tokio::test]
    async fn a_truncated_frame_at_the_end_of_the_stream_is_a_protocol_error() {
        let (mut client, mut inputs, task) = session();
        let mut out = frame(&hello());
        out.extend_from_slice(&[100, 0, 0, 0, 0, 1, 2]);
        client.write_all(&out).await.unwrap();
        client.shutdown().await.unwrap();
        let got = read_all(&mut client).await;
        assert!(matches!(got[0], ServerMessage::Welcome { .. }), "{got:?}");
        let ServerMessage::Goodbye { error } = &got[1] else {
            panic!("{got:?}")
        };
        assert_eq!(error.status, NdStatus::InvalidParameter);
        assert_eq!(
            error.context,
            "the stream closed in the middle of a frame (3 of 100 bytes)"
        );
        ended(task).await;
        assert!(matches!(inputs.recv().await, Some(SessionInput::Opened { .. })));
        assert!(matches!(inputs.recv().await, Some(SessionInput::Closed { .. })));
        // A whole frame, then the end of the stream: a clean close, no Goodbye.
        let (mut client, mut inputs, task) = session();
        client.write_all(&frame(&hello())).await.unwrap();
        client.shutdown().await.unwrap();
        // The event loop's copy of the session's writer (it drops it on Closed).
        assert!(matches!(inputs.recv().await, Some(SessionInput::Opened { .. })));
        let got = read_all(&mut client).await;
        assert!(matches!(got[..], [ServerMessage::Welcome { .. }]), "{got:?}");
        ended(task).await;
    }

    /// When the event loop ends a session (its Goodbye), the session stops reading: what the client sends
    /// after it never reaches the event loop, and the socket closes although the client keeps it open.
    #[tokio::test]
    async fn a_session_the_daemon_ended_reads_nothing_more() {
        let (mut client, mut inputs, task) = session();
        client.write_all(&frame(&hello())).await.unwrap();
        let Some(SessionInput::Opened { writer, .. }) = inputs.recv().await else {
            panic!("Opened")
        };
        writer
            .send(ServerMessage::Goodbye {
                error: Error::new(NdStatus::InvalidParameter, "no queue pair 7 in this session"),
            })
            .unwrap();
        // The session is over before the client has read anything.
        let closed = tokio::time::timeout(std::time::Duration::from_secs(5), inputs.recv()).await;
        assert!(matches!(closed, Ok(Some(SessionInput::Closed { .. }))));
        ended(task).await;
        // Whatever the client sends now goes nowhere (the socket may be closed: the write may fail).
        let _ = client
            .write_all(&frame(&ClientMessage::Request {
                id: RequestId(1),
                request: CmRequest::CreateConnector,
            }))
            .await;
        let got = read_all(&mut client).await;
        assert!(
            matches!(
                got[..],
                [ServerMessage::Welcome { .. }, ServerMessage::Goodbye { .. }]
            ),
            "{got:?}"
        );
        drop(writer);
        assert!(inputs.recv().await.is_none(), "nothing after Closed");
    }

    /// Receives what the session forwards until nothing more comes for 300 ms.
    async fn forwarded(inputs: &mut mpsc::UnboundedReceiver<SessionInput>) -> Vec<SessionInput> {
        let mut got = Vec::new();
        while let Ok(Some(i)) =
            tokio::time::timeout(std::time::Duration::from_millis(300), inputs.recv()).await
        {
            got.push(i);
        }
        got
    }

    fn requests(n: u64, request: CmRequest) -> BytesMut {
        let mut out = BytesMut::new();
        for id in 0..n {
            ClientMessage::Request {
                id: RequestId(id),
                request: request.clone(),
            }
            .encode(&mut out);
        }
        out
    }

    /// A client that pipelines requests and reads no answers: the session forwards MAX_UNANSWERED of them
    /// and then waits; each answer lets one more through.
    #[tokio::test]
    async fn unanswered_requests_are_capped() {
        let (mut client, mut inputs, _task) = session();
        client.write_all(&frame(&hello())).await.unwrap();
        let Some(SessionInput::Opened { writer, .. }) = inputs.recv().await else {
            panic!("Opened")
        };
        client
            .write_all(&requests(MAX_UNANSWERED as u64 + 500, CmRequest::Query))
            .await
            .unwrap();
        let got = forwarded(&mut inputs).await;
        assert_eq!(got.len(), MAX_UNANSWERED, "forwarded before any answer");
        let adapter = CmConfig::default_siw_compatible().adapter;
        for id in 0..10 {
            writer
                .send(ServerMessage::Response {
                    id: RequestId(id),
                    result: Ok(CmResponse::Adapter(adapter.clone())),
                })
                .unwrap();
        }
        assert_eq!(forwarded(&mut inputs).await.len(), 10, "one more per answer");
    }

    /// A client that asks for Status reports (large answers) and reads nothing: the session stops forwarding
    /// once about MAX_BACKLOG bytes wait for the client, and forwards the rest as the client reads.
    #[tokio::test]
    async fn unread_answers_are_capped() {
        let (mut client, mut inputs, _task) = session();
        client.write_all(&frame(&hello())).await.unwrap();
        let Some(SessionInput::Opened { writer, .. }) = inputs.recv().await else {
            panic!("Opened")
        };
        const N: u64 = 1000;
        const ANSWER: usize = 64 << 10;
        let (mut rd, mut wr) = client.into_split();
        wr.write_all(&requests(N, CmRequest::Status)).await.unwrap();
        // The event loop: a 64 KiB answer to every request, at once (a stand-in for a large Status report).
        let count = Arc::new(AtomicU64::new(0));
        let answering = tokio::spawn({
            let count = count.clone();
            async move {
                let mut n = 0;
                while let Some(input) = inputs.recv().await {
                    if let SessionInput::Request { id, .. } = input {
                        n += 1;
                        count.store(n, Ordering::Relaxed);
                        let _ = writer.send(ServerMessage::Response {
                            id,
                            result: Ok(CmResponse::PrivateData {
                                data: bytes::Bytes::from(vec![7; ANSWER]),
                                required: ANSWER as u32,
                            }),
                        });
                    }
                    if n == N {
                        break;
                    }
                }
                (n, writer, inputs)
            }
        });
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let before_reading = count.load(Ordering::Relaxed);
        // The backlog, what the socket buffers hold, and the one being written.
        let bound = (MAX_BACKLOG / ANSWER) as u64 + 32;
        assert!(
            (1..=bound).contains(&before_reading),
            "{before_reading} of {N} answered although the client reads nothing"
        );
        // Now the client reads: every answer arrives.
        let mut buf = BytesMut::new();
        let mut answers = 0;
        while answers < N {
            while let Some(f) = split_frame(&mut buf, super::super::proto::MAX_SERVER_FRAME).unwrap() {
                if let ServerMessage::Response { .. } = ServerMessage::decode(&f).unwrap() {
                    answers += 1;
                }
            }
            if answers < N {
                let n = tokio::time::timeout(std::time::Duration::from_secs(10), rd.read_buf(&mut buf))
                    .await
                    .expect("answers keep coming")
                    .unwrap();
                assert!(n > 0);
            }
        }
        let (n, _writer, _inputs) = answering.await.unwrap();
        assert_eq!(n, N);
    }
}
