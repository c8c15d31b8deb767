//! The daemon's side of the UDS protocol: one session per client connection.
//!
//! A session starts with `Hello` (version checked) and gets `Welcome`; its requests go to the event loop,
//! whose answers and completions come back in order on the session's writer. A session that closes, or sends
//! anything malformed (answered with `Goodbye` and INVALID_PARAMETER), is closed in the engine, which
//! releases everything it held. Peer credentials (SO_PEERCRED) are logged with each session. Once a Goodbye
//! is queued (a protocol error, or the event loop ending the session) nothing more the client sends is read.
//!
//! Bounds ([`Limits`], counted in [`super::budget`]); each refusal is a Goodbye or an answer the client
//! can read, never a hang:
//! - connections: past `max_sessions`, or `max_pending_hellos` without Hello, a new connection gets a
//!   Goodbye with INSUFFICIENT_RESOURCES and is closed. One spare descriptor is kept so that a client
//!   arriving when the daemon is out of descriptors (EMFILE) gets that answer too instead of waiting in the
//!   kernel's backlog.
//! - time: the Hello must come within `hello_timeout`, and a frame once started must be complete within
//!   `frame_timeout`; otherwise Goodbye with IO_TIMEOUT.
//! - descriptors: a frame's descriptors arrive with its first byte; any others (SCM_RIGHTS that no frame
//!   announces) are closed at once and end the session with a protocol error.
//! - flow control (`Backlog`): a session reads requests only while its client keeps up with the answers,
//!   so a client that never reads stalls itself, not the daemon's memory; past the daemon-wide output bound
//!   the sessions with the most output queued are paused first.
//!
//! RegisterMemory frames carry the region's memfd (SCM_RIGHTS, read with [`super::fdpass`]); the session
//! charges the region to its budget (INSUFFICIENT_RESOURCES past a bound) and maps it here
//! ([`SharedMemory::from_fd`], which refuses files that are too short or not sealed against shrinking, and
//! closes the descriptor once mapped) so the event loop only ever sees mapped memory.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use anyhow::{Context, bail};
use std::collections::VecDeque;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tracing::{Instrument, debug, info, info_span, warn};

use super::budget::{Budget, ChargedRegion, SessionAccount, SessionTicket};
use super::fdpass::read_with_fds;
use super::messages::Request;
use super::proto::{
    ClientMessage, HEADER_LEN, MAX_CLIENT_FRAME, MAX_FDS_PER_FRAME, PROTOCOL_VERSION, ProtoError,
    ServerMessage, split_frame, truncated,
};
use crate::engine::ids::PdId;
use crate::engine::limits::{Limit, Limits};
use crate::engine::requests::{AdapterInfo, CmRequest, RequestId, SessionId};
use crate::engine::verbs::Access;
use crate::error::{Error, NdStatus};
use crate::shm::SharedMemory;
use super::process_memory::{ClientProcess, ProcessMemory};
use crate::warn_limited;

/// Who a session's client is (SO_PEERCRED), and what `status` may show it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Peer {
    /// The process that connected; soft-rdmad reaches its in-place regions through it.
    pub pid: Option<i32>,
    pub uid: Option<u32>,
    /// Root, or a member of soft-rdmad's admin group (`--admin-group`): `status` shows every session's
    /// objects. Anyone else sees the objects of sessions with its own uid.
    pub sees_all: bool,
}

/// What the event loop sends a session: a message, and the descriptor that travels with it (the socket of
/// a hand-off, a queue pair's or a completion queue's rings and doorbells: [`ServerMessage::fds_expected`]).
#[derive(Debug)]
pub struct Outbound {
    pub msg: ServerMessage,
    pub fds: Vec<OwnedFd>,
}

impl From<ServerMessage> for Outbound {
    fn from(msg: ServerMessage) -> Self {
        Outbound { msg, fds: Vec::new() }
    }
}

/// A session's writer, as the event loop holds it.
pub type SessionWriter = mpsc::UnboundedSender<Outbound>;

/// Sends a message without a descriptor on a [`SessionWriter`].
pub trait SendMessage {
    /// `false` when the session's writer is gone (the message is dropped with the session).
    fn send_msg(&self, msg: ServerMessage) -> bool;
}

impl SendMessage for SessionWriter {
    fn send_msg(&self, msg: ServerMessage) -> bool {
        self.send(msg.into()).is_ok()
    }
}

/// What every session is told in its Welcome.
#[derive(Clone, Debug)]
pub struct SessionTerms {
    pub adapter: AdapterInfo,
    /// Kernel mode: established connections are handed to the client, which runs its queue pairs.
    pub hand_off: bool,
}

/// What sessions tell the event loop.
#[derive(Debug)]
pub enum SessionInput {
    Opened {
        session: SessionId,
        writer: SessionWriter,
        peer: Peer,
    },
    Request {
        session: SessionId,
        id: RequestId,
        request: CmRequest,
    },
    /// RegisterMemory with its memfd already mapped (and charged to the session's budget).
    RegisterMemory {
        session: SessionId,
        id: RequestId,
        memory: ChargedRegion,
        access: Access,
        pd: PdId,
    },
    /// RegisterProcessMemory: the client's own bytes, reached in its process (`super::process_memory`).
    RegisterProcessMemory {
        session: SessionId,
        id: RequestId,
        memory: ProcessMemory,
        iova: u64,
        access: Access,
        pd: PdId,
    },
    Closed {
        session: SessionId,
    },
}

/// Binds the daemon's socket: creates the directory, refuses to start if a live daemon answers there,
/// replaces a stale socket file, sets mode 0660 and, if given, the group (a name or a numeric gid).
pub async fn bind(path: &Path, group: Option<&str>) -> anyhow::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| {
            format!(
                "creating {}: soft-rdmad not run as root needs its socket's directory writable by its user: \
                 give --uds a path in such a directory, or have the directory made for it (systemd's \
                 RuntimeDirectory=, a container's volume: docs/containers.md)",
                dir.display()
            )
        })?;
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
        let gid = nix::unistd::Gid::from_raw(group_gid(group)?);
        nix::unistd::chown(path, None, Some(gid)).with_context(|| {
            format!(
                "chgrp {group} {}: soft-rdmad's user must be a member of the group {group} (or hold \
                 CAP_CHOWN) to give the socket to it (docs/containers.md)",
                path.display()
            )
        })?;
    }
    Ok(listener)
}

/// The gid of `group`: a group's name, or a number (a container's image often names no group: the gid its
/// clients are given with `--group-add` or a pod's supplementalGroups, docs/containers.md).
pub fn group_gid(group: &str) -> anyhow::Result<u32> {
    if let Some(g) = nix::unistd::Group::from_name(group)? {
        return Ok(g.gid.as_raw());
    }
    group.parse().map_err(|_| {
        anyhow::anyhow!("no group named {group} (give a group's name from /etc/group, or a numeric gid)")
    })
}

/// A descriptor held in reserve: given up to accept one client when the daemon is out of descriptors, so
/// that the client hears why instead of waiting in the kernel's backlog.
fn spare_fd() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

/// Answers a connection the daemon will not serve with a Goodbye carrying `error`, and closes it. The
/// Goodbye is small: it fits the new socket's buffer, so this never waits.
fn refuse(stream: UnixStream, error: Error) {
    let mut out = BytesMut::new();
    ServerMessage::Goodbye { error }.encode(&mut out);
    let _ = stream.try_write(&out);
}

/// Whether a client with these credentials sees every session in `status`: root, or a member (primary or
/// supplementary group) of `admin_gid`.
fn sees_all(uid: Option<u32>, gid: Option<u32>, pid: Option<i32>, admin_gid: Option<u32>) -> bool {
    if uid == Some(0) {
        return true;
    }
    let Some(admin) = admin_gid else {
        return false;
    };
    if gid == Some(admin) {
        return true;
    }
    // Supplementary groups are not in SO_PEERCRED: /proc/<pid>/status "Groups:".
    pid.and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .is_some_and(|status| {
            status.lines().any(|l| {
                l.strip_prefix("Groups:")
                    .is_some_and(|g| g.split_whitespace().any(|g| g.parse() == Ok(admin)))
            })
        })
}

/// Accepts sessions forever, within the budget's bounds.
pub async fn serve(
    listener: UnixListener,
    inputs: mpsc::UnboundedSender<SessionInput>,
    terms: SessionTerms,
    path: PathBuf,
    budget: Arc<Budget>,
    admin_gid: Option<u32>,
) {
    let next = Arc::new(AtomicU64::new(1));
    let mut spare = spare_fd();
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                // The table is full (accept4 fails so before it looks for a client). The spare descriptor
                // makes room to take a waiting client and tell it so; with nobody waiting, the spare comes
                // back and the table is looked at again shortly (an accept would only fail again at once).
                drop(spare.take());
                let waiting = std::future::poll_fn(|cx| Poll::Ready(listener.poll_accept(cx))).await;
                let answered = matches!(waiting, Poll::Ready(Ok(_)));
                match waiting {
                    Poll::Ready(Ok((s, _))) => {
                        budget.refused();
                        refuse(
                            s,
                            Error::new(
                                NdStatus::InsufficientResources,
                                "soft-rdmad is out of file descriptors (RLIMIT_NOFILE)",
                            ),
                        );
                        warn_limited!(
                            socket = %path.display(),
                            error = %e,
                            "out of file descriptors: a client was refused (INSUFFICIENT_RESOURCES)"
                        );
                    }
                    Poll::Ready(Err(e)) => {
                        warn_limited!(socket = %path.display(), error = %e, "accept failed")
                    }
                    Poll::Pending => {}
                }
                spare = spare_fd();
                if !answered {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                continue;
            }
            Err(e) => {
                warn_limited!(socket = %path.display(), error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let ticket = match budget.admit() {
            Ok(t) => t,
            Err(error) => {
                warn_limited!(%error, "client connection refused");
                refuse(stream, error);
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
        let peer = Peer {
            pid,
            uid,
            sees_all: sees_all(uid, gid, pid, admin_gid),
        };
        let span = info_span!("session", id = session.0, pid, uid, gid);
        let session_budget = SessionBudget {
            budget: budget.clone(),
            ticket,
            account: Arc::new(SessionAccount::default()),
        };
        tokio::spawn(
            run_session(
                session,
                stream,
                inputs.clone(),
                terms.clone(),
                session_budget,
                peer,
            )
            .instrument(span),
        );
    }
}

/// What a session holds of the daemon-wide budget.
pub(crate) struct SessionBudget {
    budget: Arc<Budget>,
    /// Its connection slot (freed when the session task ends).
    ticket: SessionTicket,
    /// Its registered memory.
    account: Arc<SessionAccount>,
}

impl SessionBudget {
    fn limits(&self) -> &Limits {
        self.budget.limits()
    }
}

async fn run_session(
    session: SessionId,
    stream: UnixStream,
    inputs: mpsc::UnboundedSender<SessionInput>,
    terms: SessionTerms,
    mut budget: SessionBudget,
    peer: Peer,
) {
    info!("session opened");
    let (rd, wr) = stream.into_split();
    let (tx, rx) = mpsc::unbounded_channel::<Outbound>();
    let backlog = Arc::new(Backlog::new(budget.budget.clone()));
    let mut writer = tokio::spawn(write_session(wr, rx, backlog.clone()));
    // The writer stops after a Goodbye (shutdown) or when the client takes no more: the session is over then, and nothing more it sends
    // may be acted on.
    let reader = Reader {
        session,
        rd: rd.as_ref(),
        tx: &tx,
        inputs: &inputs,
        terms,
        backlog: &backlog,
        peer,
    };
    let outcome = tokio::select! {
        outcome = reader.run(&mut budget) => Some(outcome),
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
            // Every session's end is logged (at info, like its start); the warning that a client broke the
            // protocol is one any client can repeat at will: aggregated.
            info!(error = %e, "session ended: protocol error");
            warn_limited!(error = %e, "a client broke the UDS protocol; its session ended");
            let status = match e {
                ProtoError::TimedOut(_) => NdStatus::IoTimeout,
                _ => NdStatus::InvalidParameter,
            };
            let _ = tx.send_msg(ServerMessage::Goodbye {
                error: Error::new(status, e.to_string()),
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
    // The connection slot is freed here, with the session.
    drop(budget);
}

/// What the daemon owes a client and the client has not taken yet: encoded bytes not yet written, and
/// requests not yet answered. A client that sends requests without reading the answers would otherwise make
/// the daemon queue answers without bound (tens of times the bytes it sent): past
/// `max_output_bytes_per_session` bytes or [`MAX_UNANSWERED`] requests its session reads nothing more until
/// the client catches up; past `max_output_bytes` of all sessions together, the largest holders wait too
/// ([`Budget::must_pause`]).
struct Backlog {
    budget: Arc<Budget>,
    bytes: AtomicUsize,
    unanswered: AtomicUsize,
    /// The writer has taken a Goodbye: the session is over, even before the client reads it.
    goodbye: AtomicBool,
    /// Any of the above changed.
    drained: Notify,
}

/// Requests a session may have with the event loop at once (a client may pipeline this many).
const MAX_UNANSWERED: usize = 4096;

/// Queued messages the writer puts into one write.
const COALESCE: usize = 256 << 10;

impl Backlog {
    fn new(budget: Arc<Budget>) -> Self {
        Backlog {
            budget,
            bytes: AtomicUsize::new(0),
            unanswered: AtomicUsize::new(0),
            goodbye: AtomicBool::new(false),
            drained: Notify::new(),
        }
    }

    fn max_bytes(&self) -> usize {
        self.budget.limits().max_output_bytes_per_session
    }

    fn set_bytes(&self, bytes: usize) {
        let before = self.bytes.swap(bytes, Ordering::AcqRel);
        self.budget.output_changed(before, bytes);
        // Less output may end a pause by either bound (the daemon-wide one looks at this session's share).
        if bytes < before {
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

    /// Whether the session may read one more message; `Err(())` if only the daemon-wide bound stops it.
    fn has_room(&self, heavy: bool) -> Result<bool, ()> {
        let unanswered = self.unanswered.load(Ordering::Acquire);
        let bytes = self.bytes.load(Ordering::Acquire);
        let own = bytes <= self.max_bytes()
            && if heavy {
                unanswered == 0
            } else {
                unanswered < MAX_UNANSWERED
            };
        match (own, self.budget.must_pause(bytes)) {
            (true, false) => Ok(true),
            (true, true) => Err(()),
            (false, _) => Ok(false),
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
        let mut counted = false;
        let mut said = false;
        loop {
            let drained = self.drained.notified();
            let shared = self.budget.output_room().notified();
            tokio::pin!(drained, shared);
            drained.as_mut().enable();
            shared.as_mut().enable();
            match self.has_room(heavy) {
                Ok(true) => return,
                Ok(false) => {
                    // Once per pause (its own bound: the client is behind on reading).
                    if !std::mem::replace(&mut said, true) {
                        debug!("reads paused: the client is behind on its answers");
                        if self.bytes.load(Ordering::Acquire) > self.max_bytes() {
                            self.budget.hit(Limit::OutputBytesPerSession);
                        }
                    }
                }
                Err(()) => {
                    if !std::mem::replace(&mut counted, true) {
                        self.budget.paused();
                    }
                }
            }
            tokio::select! {
                () = drained => {}
                () = shared => {}
            }
        }
    }
}

/// Writes the session's messages to the client: whatever is queued goes out in as few writes as the socket
/// takes; while the client does not read, messages are taken off the queue into the backlog (which the
/// reader watches). Ends after a Goodbye, when writing fails, or when every sender is gone.
async fn write_session(
    mut wr: tokio::net::unix::OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Outbound>,
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
                        Some(Outbound { msg, fds }) if !fds.is_empty() => {
                            // Everything before it goes first; then the frame whose first byte carries the
                            // descriptor (not cancel-safe, so written here rather than in the select).
                            let mut frame = BytesMut::new();
                            msg.encode(&mut frame);
                            let written = async {
                                wr.write_all(&out).await?;
                                out.clear();
                                let fds: Vec<_> = fds.iter().map(|fd| fd.as_fd()).collect();
                                super::fdpass::write_with_fds(wr.as_ref(), &frame, &fds).await
                            };
                            if let Err(e) = written.await {
                                end = WriterEnd::Failed(e);
                                open = false;
                                out.clear();
                                break;
                            }
                            if matches!(msg, ServerMessage::Response { .. }) {
                                backlog.answered();
                            }
                        }
                        Some(Outbound { msg, .. }) => {
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
        // A backlog that grew large gives its memory back once written.
        if out.is_empty() && out.capacity() > 2 * COALESCE {
            out = BytesMut::new();
        }
        backlog.set_bytes(out.len());
    }
    // Whatever was not written is dropped with the session: it no longer counts.
    backlog.set_bytes(0);
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

/// The reading half of a session.
struct Reader<'a> {
    session: SessionId,
    rd: &'a UnixStream,
    tx: &'a SessionWriter,
    inputs: &'a mpsc::UnboundedSender<SessionInput>,
    terms: SessionTerms,
    backlog: &'a Backlog,
    peer: Peer,
}

/// Descriptors the partial frame at the front of `buf` may have brought with it: its announced count once
/// its header is in, up to [`MAX_FDS_PER_FRAME`] before that, none if no frame is started.
fn announced_fds(buf: &[u8]) -> usize {
    match buf.len() {
        0 => 0,
        n if n < HEADER_LEN => MAX_FDS_PER_FRAME as usize,
        _ => buf[HEADER_LEN - 1] as usize,
    }
}

impl Reader<'_> {
    /// RegisterProcessMemory: the client's own bytes at `(address, length)`, addressed by peers from `iova`,
    /// reached through the client's address space (opened on the session's first such request).
    fn register_process_memory(
        &self,
        client_process: &mut Option<ClientProcess>,
        id: RequestId,
        (address, length, iova): (u64, u64, u64),
        (access, pd): (Access, PdId),
    ) {
        let memory = match client_process {
            Some(p) => Ok(p.clone()),
            None => ClientProcess::open(self.peer.pid),
        }
        .and_then(|p| {
            let region = p.region(address, length);
            *client_process = Some(p);
            region
        });
        let input = memory.map(|memory| SessionInput::RegisterProcessMemory {
            session: self.session,
            id,
            memory,
            iova,
            access,
            pd,
        });
        self.registration(id, length, input);
    }

    /// A registration's region, made: on to the event loop; or refused here, with the reason.
    fn registration(&self, id: RequestId, length: u64, input: Result<SessionInput, Error>) {
        match input {
            Ok(input) => {
                let _ = self.inputs.send(input);
            }
            Err(error) => {
                warn_limited!(length, %error, "memory registration refused");
                let _ = self.tx.send_msg(ServerMessage::Response {
                    id,
                    result: Err(error),
                });
            }
        }
    }

    async fn run(self, budget: &mut SessionBudget) -> Result<(), ProtoError> {
        let limits = budget.limits().clone();
        let mut buf = BytesMut::new();
        let mut fds: VecDeque<OwnedFd> = VecDeque::new();
        let mut hello = false;
        let hello_deadline = Instant::now() + limits.hello_timeout;
        // When the frame at the front of `buf` started (its first byte was read).
        let mut frame_started: Option<Instant> = None;
        // The client's address space, opened on its first in-place registration.
        let mut client_process: Option<ClientProcess> = None;
        loop {
            let mut took_frames = false;
            loop {
                // Every message may add to what the client has to read: none while it is behind.
                self.backlog.room(false).await;
                let Some(frame) = split_frame(&mut buf, MAX_CLIENT_FRAME)? else {
                    break;
                };
                took_frames = true;
                let msg = ClientMessage::decode(&frame)?;
                if let ClientMessage::Request {
                    request: Request::Status,
                    ..
                } = &msg
                {
                    self.backlog.room(true).await;
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
                        budget.ticket.welcomed();
                        info!(client = %client_name, "hello");
                        let _ = self.tx.send_msg(ServerMessage::Welcome {
                            version: PROTOCOL_VERSION,
                            session: self.session,
                            adapter: self.terms.adapter.clone(),
                            hand_off: self.terms.hand_off,
                        });
                        let _ = self.inputs.send(SessionInput::Opened {
                            session: self.session,
                            writer: self.tx.clone(),
                            peer: self.peer,
                        });
                    }
                    _ if !hello => {
                        return Err(ProtoError::Malformed("a Request before Hello".into()));
                    }
                    ClientMessage::Request {
                        id,
                        request: Request::RegisterMemory { length, access, pd },
                    } => {
                        let fd = fds.pop_front().ok_or(ProtoError::MissingFds(1))?;
                        self.backlog.asked();
                        let input = map_region(budget, fd, length).map(|memory| SessionInput::RegisterMemory {
                            session: self.session,
                            id,
                            memory,
                            access,
                            pd,
                        });
                        self.registration(id, length, input);
                    }
                    ClientMessage::Request {
                        id,
                        request:
                            Request::RegisterProcessMemory {
                                address,
                                length,
                                iova,
                                access,
                                pd,
                            },
                    } => {
                        self.backlog.asked();
                        let at = (address, length, iova);
                        self.register_process_memory(&mut client_process, id, at, (access, pd));
                    }
                    ClientMessage::Request { id, request } => {
                        self.backlog.asked();
                        let _ = self.inputs.send(SessionInput::Request {
                            session: self.session,
                            id,
                            request: request.into(),
                        });
                    }
                }
            }
            // Every descriptor left must have come with the frame now at the front; others are closed now.
            if fds.len() > announced_fds(&buf) {
                let n = fds.len();
                fds.clear();
                return Err(ProtoError::UnannouncedFds(n));
            }
            // An idle session keeps no read buffer.
            if buf.is_empty() {
                buf = BytesMut::new();
                frame_started = None;
            } else if took_frames || frame_started.is_none() {
                frame_started = Some(Instant::now());
            }
            let deadline = if !hello {
                Some((
                    hello_deadline,
                    "no Hello within the Hello timeout (--hello-timeout-ms)",
                ))
            } else {
                frame_started.map(|at| {
                    (
                        at + limits.frame_timeout,
                        "a frame left half-sent past the frame timeout (--frame-timeout-ms)",
                    )
                })
            };
            let read = read_with_fds(self.rd, &mut buf, &mut fds);
            let read = match deadline {
                Some((at, why)) => match tokio::time::timeout_at(at, read).await {
                    Ok(r) => r,
                    Err(_) => {
                        budget.budget.hit(if hello {
                            Limit::FrameTimeout
                        } else {
                            Limit::HelloTimeout
                        });
                        return Err(ProtoError::TimedOut(why.into()));
                    }
                },
                None => read.await,
            };
            match read {
                // The end of the stream: a clean close, unless it cuts a frame short.
                Ok(0) => return truncated(&buf).map_or(Ok(()), Err),
                // A client that exits with replies unread resets the socket: an ordinary end of session.
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(()),
                Ok(_) => {}
                Err(e) => return Err(ProtoError::Malformed(format!("read failed: {e}"))),
            }
        }
    }
}

/// Charges a region of `length` bytes to the session's budget, then maps its memfd (closing the descriptor).
/// INSUFFICIENT_RESOURCES past a bound, or when the daemon has no address space left for it; anything wrong
/// with the memfd is INVALID_PARAMETER.
fn map_region(budget: &SessionBudget, fd: OwnedFd, length: u64) -> Result<ChargedRegion, Error> {
    let len = usize::try_from(length).map_err(|_| {
        Error::new(
            NdStatus::InvalidParameter,
            format!("a region of {length} bytes exceeds the address space"),
        )
    })?;
    let charge = budget.budget.charge_region(&budget.account, length)?;
    match SharedMemory::from_fd(fd, len) {
        Ok(memory) => Ok(ChargedRegion::new(memory, charge)),
        Err(e) if e.kind() == std::io::ErrorKind::OutOfMemory => Err(Error::new(
            NdStatus::InsufficientResources,
            format!("no address space left to map the region ({length} bytes): {e}"),
        )),
        Err(e) => Err(Error::new(
            NdStatus::InvalidParameter,
            format!("cannot map the region's memfd ({length} bytes): {e}"),
        )),
    }
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
