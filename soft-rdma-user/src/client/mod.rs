//! The async client library (tokio): the NetworkDirect connector model over soft-rdmad's UDS protocol.
//!
//! [`Adapter`] is one session with the daemon; [`Connector`], [`Listener`] and [`SharedEndpoint`] follow
//! IND2Connector, IND2Listener and NdkCreateSharedEndpoint. Every error carries the ND status
//! ([`crate::Error`]). Many requests may be in flight: asynchronous ones (Connect, Accept,
//! GetConnectionRequest, NotifyDisconnect) resolve when the daemon's completion arrives. When the daemon goes
//! away, everything pending — and everything after — fails with DEVICE_REMOVED.
//!
//! The data path's objects (memory regions, completion queues, queue pairs: `data`) live where the session's
//! data path says (`data_path`, chosen once from the Welcome): in this process, on the TCP socket soft-rdmad
//! hands over once a connection is established (kernel-TCP mode: `in_process`), or in soft-rdmad, which
//! this process reaches through shared rings (`daemon_rings`); either delivers completions to the same
//! completion queues (`completions`).
//!
//! ```no_run
//! # async fn demo() -> soft_rdma::Result<()> {
//! use soft_rdma::client::Adapter;
//! use soft_rdma::client::ReadLimits;
//! let adapter = Adapter::open("/run/soft-rdma/soft-rdmad.sock").await?;
//! let c = adapter.create_connector().await?;
//! c.connect("10.0.0.2:7174".parse().unwrap(), ReadLimits { inbound: 4, outbound: 4 }, b"hello").await?;
//! println!("peer offers {:?}, says {:?}", c.read_limits().await?, c.private_data().await?);
//! c.complete_connect().await?;
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};

use crate::engine::requests::*;
use crate::shm::SharedMemory;
use crate::uds::fdpass;
use crate::uds::messages::{Event, ObjectRef, Request, Response};
use crate::uds::proto::{
    ClientMessage, DEFAULT_SOCKET_PATH, MAX_SERVER_FRAME, PROTOCOL_VERSION, SOCKET_ENV, ServerMessage,
    split_frame,
};

mod borrowed;
mod completions;
mod daemon_rings;
mod data;
mod data_path;
mod descriptor;
mod in_process;
mod qp_events;
mod srq;
mod writer;
pub use crate::engine::srq::{MAX_SRQ_DEPTH, MAX_SRQS_PER_SESSION, SharedReceiveQueueId, SrqStatus};
pub use crate::rings::SpinConfig;
pub use completions::CQ_SPIN_ENV;
pub use completions::PendingCompletion;
pub use data::{CompletionQueue, MemoryRegion, QueuePair};
pub use descriptor::{BufferDescriptor, DescriptorError};
pub use srq::SharedReceiveQueue;

// The types an application names, re-exported so that it never reaches into the engine's modules.
pub use crate::engine::ids::{ConnectorId, ListenerId, PdId, SessionId, SharedEndpointId};
pub use crate::engine::limits::ResourceStatus;
pub use crate::engine::requests::{AdapterInfo, ReadLimits};
pub use crate::engine::status::{ConnectorState, ConnectorStatus, ListenerStatus, TcpStatus};
pub use crate::engine::verbs::{
    Access, Completion, CompletionOp, CompletionQueueId, MemoryRegionId, QpStats, QueuePairConfig,
    QueuePairEvent, QueuePairId, QueuePairState, QueuePairStatus, RemoteBuffer, Sge, Stag, TaggedRange,
    TerminateInfo, Violation, WorkRequest,
};
pub use crate::error::{Error, NdStatus, Result};
pub use crate::status::StatusReport;
pub use crate::transport::status::{TcpConnectionStatus, TransportStatus, XskQueueStatus};

type Waiter = oneshot::Sender<Result<Response>>;

/// A message for the daemon, with the shared memory whose fd travels with it (RegisterMemory).
type Outgoing = (ClientMessage, Option<Arc<SharedMemory>>);

struct Inner {
    writer: mpsc::UnboundedSender<Outgoing>,
    /// Completions delivered per completion queue, waiting for the application.
    cqs: Mutex<HashMap<CompletionQueueId, Arc<completions::CqState>>>,
    pending: Mutex<HashMap<u64, Waiter>>,
    next_id: AtomicU64,
    gone: AtomicBool,
    /// Woken when `gone` is set.
    gone_notify: tokio::sync::Notify,
    /// The runtime the adapter was opened on: where work for callers outside any runtime (the C
    /// libraries' threads) is spawned.
    runtime: Option<tokio::runtime::Handle>,
    info: AdapterInfo,
    session: SessionId,
    /// Where the session's queue pairs run: in this process (kernel-TCP mode) or in soft-rdmad.
    data_path: data_path::SessionDataPath,
    /// Descriptors soft-rdmad passed (sockets of handed-off connections, the rings of daemon-run queue pairs
    /// and completion queues), from the frame that carried them until the call that waits for them takes
    /// them; and the session's doorbell.
    handed: Mutex<Passed>,
    /// Who is told when a shared receive queue's limit is reached (`srq`), whichever data path runs it.
    srq_handlers: Mutex<HashMap<srq::SharedReceiveQueueId, srq::SrqLimitHandler>>,
    /// Who is told of a queue pair's asynchronous event (`qp_events`), whichever data path runs it.
    qp_handlers: Mutex<HashMap<QueuePairId, qp_events::QpEventHandler>>,
}

/// What soft-rdmad passed with its answers ([`ServerMessage::fds_expected`]).
#[derive(Default)]
struct Passed {
    sockets: HashMap<crate::engine::transport_seam::ConnId, OwnedFd>,
    /// A daemon-run queue pair's (memfd, session doorbell) or completion queue's (memfd, completion
    /// doorbell, session doorbell).
    rings: HashMap<RingObject, Vec<OwnedFd>>,
    /// The session's doorbell (soft-rdmad's: rung when one of this session's rings asks for it); the first
    /// one passed is kept, the copies that come later are closed.
    session_bell: Option<Arc<crate::rings::doorbell::Doorbell>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum RingObject {
    QueuePair(QueuePairId),
    CompletionQueue(CompletionQueueId),
}

impl Passed {
    /// The descriptors passed with `object`'s answer, the session doorbell (the last one) kept aside.
    fn take_rings(
        &mut self,
        object: RingObject,
    ) -> Option<(Vec<OwnedFd>, Arc<crate::rings::doorbell::Doorbell>)> {
        let mut fds = self.rings.remove(&object)?;
        let bell = fds.pop()?;
        let bell = self
            .session_bell
            .get_or_insert_with(|| Arc::new(crate::rings::doorbell::Doorbell::from_fd(bell)))
            .clone();
        Some((fds, bell))
    }
}

fn device_removed() -> Error {
    Error::new(NdStatus::DeviceRemoved, "soft-rdmad went away")
}

impl Inner {
    fn fail_all(&self, error: Error) {
        self.gone.store(true, Ordering::Release);
        self.gone_notify.notify_waiters();
        self.data_path.device_removed();
        for (_, w) in self.pending.lock().expect("not poisoned").drain() {
            let _ = w.send(Err(error.clone()));
        }
        for cq in self.cqs.lock().expect("not poisoned").values() {
            cq.device_removed();
        }
    }

    /// Sends a request and waits for its final answer (the Completed event for asynchronous requests).
    async fn call(&self, request: Request) -> Result<Response> {
        self.call_with(request, None).await
    }

    /// [`Self::call`], with the shared memory whose fd travels with the request.
    async fn call_with(&self, request: Request, memory: Option<Arc<SharedMemory>>) -> Result<Response> {
        if self.gone.load(Ordering::Acquire) {
            return Err(device_removed());
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().expect("not poisoned").insert(id, tx);
        if self
            .writer
            .send((
                ClientMessage::Request {
                    id: RequestId(id),
                    request,
                },
                memory,
            ))
            .is_err()
        {
            self.pending.lock().expect("not poisoned").remove(&id);
            return Err(device_removed());
        }
        rx.await.unwrap_or_else(|_| Err(device_removed()))
    }

    /// DEVICE_REMOVED once soft-rdmad is gone (the in-process data path included: the device is removed).
    fn check_alive(&self) -> Result<()> {
        if self.gone.load(Ordering::Acquire) {
            return Err(device_removed());
        }
        Ok(())
    }

    /// The in-process data path changed (kernel mode): its reporter tells soft-rdmad soon, for `status`
    /// (reports are coalesced: creating thousands of queue pairs sends a handful).
    fn report_data_path(&self) {
        self.data_path.changed();
    }

    /// Sends a request without waiting (used from Drop).
    fn fire(&self, request: Request) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let _ = self.writer.send((
            ClientMessage::Request {
                id: RequestId(id),
                request,
            },
            None,
        ));
    }

    fn dispatch(&self, msg: ServerMessage, mut fds: Vec<OwnedFd>) {
        if !fds.is_empty() {
            let result = match &msg {
                ServerMessage::Response { result, .. } => Some(result),
                ServerMessage::Event(Event::Completed { result, .. }) => Some(result),
                _ => None,
            };
            let mut passed = self.handed.lock().expect("not poisoned");
            match result {
                Some(Ok(Response::HandedOff(h))) => {
                    passed.sockets.insert(h.conn, fds.swap_remove(0));
                }
                // Kept only when all arrived (a lost descriptor fails the session: see the reader).
                Some(Ok(Response::QueuePair(id))) if fds.len() == 2 => {
                    passed.rings.insert(RingObject::QueuePair(*id), fds);
                }
                Some(Ok(Response::CompletionQueue(id))) if fds.len() == 3 => {
                    passed.rings.insert(RingObject::CompletionQueue(*id), fds);
                }
                _ => {}
            }
        }
        match msg {
            // Pending: keep waiting for the completion of the same id.
            ServerMessage::Response {
                result: Ok(Response::Pending),
                ..
            } => {}
            ServerMessage::Response { id, result } => self.resolve(id.0, result),
            ServerMessage::Event(Event::Completed { request, result }) => self.resolve(request.0, result),
            ServerMessage::Event(Event::SrqLimitReached { srq }) => self.srq_limit_reached(srq),
            ServerMessage::Event(Event::QueuePairEvent { qp, event }) => self.queue_pair_event(qp, event),
            ServerMessage::Goodbye { error } => self.fail_all(error),
            ServerMessage::Welcome { .. } => {}
        }
    }

    fn resolve(&self, id: u64, result: Result<Response>) {
        if let Some(w) = self.pending.lock().expect("not poisoned").remove(&id) {
            let _ = w.send(result);
        }
    }
}

fn unexpected(what: &str, r: Response) -> Error {
    Error::new(
        NdStatus::Unsuccessful,
        format!("unexpected answer to {what}: {r:?}"),
    )
}

/// One session with soft-rdmad (an IND2Adapter). Cheap to clone.
///
/// ```no_run
/// # async fn f() -> soft_rdma::Result<()> {
/// let adapter = soft_rdma::client::Adapter::open_default().await?;
/// let info = adapter.query().await?;
/// println!("up to {} bytes of private data, {} reads in flight", info.max_caller_data, info.max_outbound_read_limit);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Adapter {
    inner: Arc<Inner>,
}

impl Adapter {
    /// Connects to the daemon at `path` and opens a session. Without a daemon there: DEVICE_REMOVED, whose
    /// context says how to start soft-rdmad; a socket this user may not open: ACCESS_VIOLATION, whose
    /// context names the group that may.
    pub async fn open(path: impl AsRef<Path>) -> Result<Adapter> {
        Self::open_at(path.as_ref(), SocketSource::Given).await
    }

    /// [`Adapter::open`] on `$SOFT_RDMA_UDS`, else `/run/soft-rdma/soft-rdmad.sock`.
    pub async fn open_default() -> Result<Adapter> {
        match std::env::var(SOCKET_ENV) {
            Ok(path) => Self::open_at(Path::new(&path), SocketSource::Environment).await,
            Err(_) => Self::open_at(Path::new(DEFAULT_SOCKET_PATH), SocketSource::Default).await,
        }
    }

    async fn open_at(path: &Path, source: SocketSource) -> Result<Adapter> {
        let stream = UnixStream::connect(path)
            .await
            .map_err(|e| unreachable_daemon(path, source, &e))?;
        Self::over(stream).await
    }

    /// Opens a session over an already connected stream.
    pub async fn over(stream: UnixStream) -> Result<Adapter> {
        let (mut rd, mut wr) = stream.into_split();
        let mut out = BytesMut::new();
        ClientMessage::Hello {
            version: PROTOCOL_VERSION,
            client_name: format!("soft-rdma/{}", std::process::id()),
        }
        .encode(&mut out);
        // A daemon that refuses the connection (one of its limits) answers with a Goodbye and closes at
        // once: the Hello may then fail to go out, but the Goodbye is still there to read.
        let hello_failed = wr
            .write_all(&out)
            .await
            .err()
            .map(|e| Error::new(NdStatus::DeviceRemoved, format!("writing Hello: {e}")));
        let mut buf = BytesMut::with_capacity(4096);
        let (session, info, hand_off) = loop {
            if let Some(frame) = split_frame(&mut buf, MAX_SERVER_FRAME).map_err(proto_err)? {
                match ServerMessage::decode(&frame).map_err(proto_err)? {
                    ServerMessage::Welcome {
                        session,
                        adapter,
                        hand_off,
                        ..
                    } => break (session, adapter, hand_off),
                    ServerMessage::Goodbye { error } => return Err(error),
                    other => {
                        return Err(Error::new(
                            NdStatus::Unsuccessful,
                            format!("expected Welcome, got {other:?}"),
                        ));
                    }
                }
            }
            let n = match rd.read_buf(&mut buf).await {
                Ok(n) => n,
                Err(e) => {
                    return Err(hello_failed.unwrap_or_else(|| {
                        Error::new(NdStatus::DeviceRemoved, format!("reading Welcome: {e}"))
                    }));
                }
            };
            if n == 0 {
                return Err(hello_failed.unwrap_or_else(device_removed));
            }
        };
        let (tx, rx) = mpsc::unbounded_channel::<Outgoing>();
        let data_path = data_path::SessionDataPath::new(hand_off, &info, session);
        let inner = Arc::new(Inner {
            writer: tx,
            cqs: Mutex::default(),
            pending: Mutex::default(),
            next_id: AtomicU64::new(1),
            gone: AtomicBool::new(false),
            gone_notify: tokio::sync::Notify::new(),
            runtime: tokio::runtime::Handle::try_current().ok(),
            info,
            session,
            data_path,
            handed: Mutex::default(),
            srq_handlers: Mutex::default(),
            qp_handlers: Mutex::default(),
        });
        tokio::spawn(writer::write_loop(wr, rx));
        inner.data_path.spawn_reporter(&inner);
        let reader_inner = Arc::downgrade(&inner);
        tokio::spawn(async move {
            // Descriptors arrive beside the bytes (a hand-off's socket), in frame order.
            let mut fds = std::collections::VecDeque::new();
            loop {
                loop {
                    let Ok(Some(frame)) = split_frame(&mut buf, MAX_SERVER_FRAME) else {
                        break;
                    };
                    let Some(inner) = reader_inner.upgrade() else {
                        return;
                    };
                    let n = usize::from(frame.first().copied().unwrap_or(0)).min(fds.len());
                    let passed: Vec<_> = fds.drain(..n).collect();
                    match ServerMessage::decode(&frame) {
                        Ok(m) => inner.dispatch(m, passed),
                        Err(e) => {
                            inner.fail_all(Error::new(
                                NdStatus::DeviceRemoved,
                                format!("undecodable message from soft-rdmad: {e}"),
                            ));
                            return;
                        }
                    }
                }
                match fdpass::read_with_fds(rd.as_ref(), &mut buf, &mut fds).await {
                    Ok(n) if n > 0 => {}
                    Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                        // A descriptor soft-rdmad sent (a handed-off socket) could not be received.
                        if let Some(inner) = reader_inner.upgrade() {
                            inner.fail_all(Error::new(
                                NdStatus::InsufficientResources,
                                format!("a socket from soft-rdmad was lost ({e}): is this process out of file descriptors (RLIMIT_NOFILE)?"),
                            ));
                        }
                        return;
                    }
                    _ => {
                        if let Some(inner) = reader_inner.upgrade() {
                            inner.fail_all(device_removed());
                        }
                        return;
                    }
                }
            }
        });
        Ok(Adapter { inner })
    }

    /// The adapter limits from the session's Welcome.
    pub fn info(&self) -> &AdapterInfo {
        &self.inner.info
    }

    /// This session's id in the daemon (as `soft-rdma status` shows it).
    pub fn session(&self) -> SessionId {
        self.inner.session
    }

    /// Resolves when the session with soft-rdmad has ended (the daemon went away or closed it): from then on
    /// every call fails with DEVICE_REMOVED. What rdma-core reports as `IBV_EVENT_DEVICE_FATAL` on a
    /// context's async fd (`infiniband/verbs.h`).
    pub async fn closed(&self) {
        loop {
            let notified = self.inner.gone_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.inner.gone.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }

    /// Kernel-TCP mode: reports this session's queue pairs and their counters to soft-rdmad now, and
    /// returns once it has taken them (what its metrics count: docs/metrics.md). The library reports on its
    /// own once a second while connections run and whenever a queue pair closes or its connection ends;
    /// this is for a program about to end its process without dropping its objects (`exit`, as the
    /// drop-in libibverbs does from its atexit handler). Nothing to do when soft-rdmad runs the data path.
    pub async fn report_now(&self) -> Result<()> {
        let mut parts = self.inner.data_path.report_parts();
        let Some(last) = parts.pop() else {
            return Ok(());
        };
        for part in parts {
            self.inner.fire(part);
        }
        // soft-rdmad answers in order: the last part's answer means it has taken them all.
        match self.inner.call(last).await? {
            Response::Done => Ok(()),
            r => Err(unexpected("ReportDataPath", r)),
        }
    }

    /// Whether any of this session's connections runs in this process now (kernel-TCP mode): what
    /// [`Self::serve_until_readable`] would serve.
    pub fn has_local_connections(&self) -> bool {
        self.inner.data_path.has_local_connections()
    }

    /// For drivers that block a thread for an event, as the drop-in libibverbs does in
    /// `ibv_get_cq_event`: waits until `fd` (the caller's event descriptor) is readable, at most `timeout`,
    /// and in kernel-TCP mode serves this session's connections on the calling thread meanwhile, so that
    /// the bytes that make the awaited completion wake this thread and no other. Call it outside any
    /// tokio runtime. `done` is asked before each wait and after each pass: `true` ends the wait as
    /// [`InlineWait::Readable`] without another `poll(2)` (the caller's event is queued, its byte on the way).
    /// EINTR when a signal interrupts the wait.
    pub fn serve_until_readable(
        &self,
        fd: BorrowedFd<'_>,
        timeout: Duration,
        done: &dyn Fn() -> bool,
    ) -> std::io::Result<InlineWait> {
        self.inner
            .data_path
            .serve_until_readable(&self.inner, (fd.as_raw_fd(), done), timeout)
    }

    /// IND2Adapter::Query.
    pub async fn query(&self) -> Result<AdapterInfo> {
        match self.inner.call(Request::Query).await? {
            Response::Adapter(a) => Ok(a),
            r => Err(unexpected("Query", r)),
        }
    }

    pub async fn create_connector(&self) -> Result<Connector> {
        match self.inner.call(Request::CreateConnector).await? {
            Response::Connector(id) => Ok(Connector {
                id,
                inner: self.inner.clone(),
                queue_pair: Mutex::default(),
            }),
            r => Err(unexpected("CreateConnector", r)),
        }
    }

    pub async fn create_listener(&self) -> Result<Listener> {
        match self.inner.call(Request::CreateListener).await? {
            Response::Listener(id) => Ok(Listener {
                id,
                inner: self.inner.clone(),
            }),
            r => Err(unexpected("CreateListener", r)),
        }
    }

    /// NdkCreateSharedEndpoint: one local addr:port for many outgoing connections (port 0 allocates).
    pub async fn create_shared_endpoint(&self, local: SocketAddr) -> Result<SharedEndpoint> {
        match self.inner.call(Request::CreateSharedEndpoint { local }).await? {
            Response::SharedEndpoint(id) => Ok(SharedEndpoint {
                id,
                inner: self.inner.clone(),
            }),
            r => Err(unexpected("CreateSharedEndpoint", r)),
        }
    }

    /// Everything the daemon holds (`soft-rdma status`).
    pub async fn status(&self) -> Result<StatusReport> {
        match self.inner.call(Request::Status).await? {
            Response::Status(s) => Ok(s),
            r => Err(unexpected("Status", r)),
        }
    }
}

/// Where the path of soft-rdmad's socket came from, for the error that says it cannot be reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SocketSource {
    /// The caller's ([`Adapter::open`]).
    Given,
    /// `$SOFT_RDMA_UDS` ([`Adapter::open_default`]).
    Environment,
    /// The default, `$SOFT_RDMA_UDS` being unset ([`Adapter::open_default`]).
    Default,
}

/// Connecting to soft-rdmad's socket at `path` failed with `e`: what happened and what to do. A socket this
/// user may not open (EACCES) is ACCESS_VIOLATION and names the group that may ([`denied_by`]:
/// docs/service.md, docs/containers.md); anything else (no such file, no daemon listening) is
/// DEVICE_REMOVED and says how to start soft-rdmad and how a client finds it.
fn unreachable_daemon(path: &Path, source: SocketSource, e: &std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::PermissionDenied {
        return Error::new(NdStatus::AccessViolation, denied_by(path, e));
    }
    let path = path.display();
    let from = match source {
        SocketSource::Given => "the path given to Adapter::open",
        SocketSource::Environment => "from $SOFT_RDMA_UDS",
        SocketSource::Default => "the default; $SOFT_RDMA_UDS names another",
    };
    Error::new(
        NdStatus::DeviceRemoved,
        format!(
            "cannot reach soft-rdmad at {path} ({from}): {e}. Is soft-rdmad running? Start it as root \
             (`soft-rdmad`, with `--uds PATH` for another socket), or as a service with the systemd unit \
             dist/soft-rdmad.service (`systemctl enable --now soft-rdmad`); a client finds a daemon on \
             another socket through $SOFT_RDMA_UDS"
        ),
    )
}

/// Why this user may not open soft-rdmad's socket at `path` (connect(2) said EACCES), naming the group that
/// may: the socket file's group (soft-rdmad's `--group`: mode 0660, owner and group read-write), or the
/// directory on the way that this user may not search. The message says what to ask for.
fn denied_by(path: &Path, e: &std::io::Error) -> String {
    use std::os::unix::fs::MetadataExt;
    let shown = path.display();
    let group_name = |gid: u32| {
        nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid))
            .ok()
            .flatten()
            .map_or_else(|| format!("gid {gid}"), |g| g.name)
    };
    let user = nix::unistd::User::from_uid(nix::unistd::geteuid())
        .ok()
        .flatten()
        .map_or_else(|| format!("uid {}", nix::unistd::geteuid()), |u| u.name);
    match std::fs::metadata(path) {
        Ok(m) => {
            let group = group_name(m.gid());
            format!(
                "cannot open soft-rdmad's socket {shown}: {e}. The socket is mode {:04o}, open to its owner and \
                 to the group {group} (soft-rdmad's --group); {user} is not in {group}: ask to be added to group \
                 {group} (`usermod -aG {group} {user}`, then log in again; in a container, run the application \
                 with `--group-add {group}` or a pod's supplementalGroups: docs/containers.md), or run as root",
                m.mode() & 0o7777
            )
        }
        Err(_) => {
            // The socket could not even be looked at: a directory on the way is closed to this user.
            let dir = path
                .parent()
                .map_or_else(|| shown.to_string(), |d| d.display().to_string());
            format!(
                "cannot open soft-rdmad's socket {shown}: {e}. {user} may not search the directory {dir}: \
                 soft-rdmad's socket directory must be searchable (mode 0755, as soft-rdmad makes it and as \
                 the systemd unit's RuntimeDirectoryMode), or give soft-rdmad a socket path ({}) this user can \
                 reach",
                "--uds; clients find it through $SOFT_RDMA_UDS"
            )
        }
    }
}

fn proto_err(e: crate::uds::proto::ProtoError) -> Error {
    Error::new(
        NdStatus::DeviceRemoved,
        format!("protocol error talking to soft-rdmad: {e}"),
    )
}

/// An IND2Connector. Dropping it releases it in the daemon (implicit disconnect).
///
/// ```no_run
/// # async fn f(adapter: soft_rdma::client::Adapter) -> soft_rdma::Result<()> {
/// use soft_rdma::client::ReadLimits;
/// let c = adapter.create_connector().await?;
/// c.bind("10.0.0.1:0".parse().unwrap()).await?; // optional: Connect binds implicitly
/// match c.connect("10.0.0.2:7174".parse().unwrap(), ReadLimits { inbound: 4, outbound: 4 }, b"hi").await {
///     Ok(()) => c.complete_connect().await?, // or c.reject(b"") if the limits do not suit
///     Err(e) if e.status == soft_rdma::NdStatus::ConnectionRefused => {
///         println!("refused: {:?}", c.private_data().await?);
///     }
///     Err(e) => return Err(e),
/// }
/// # Ok(()) }
/// ```
pub struct Connector {
    id: ConnectorId,
    inner: Arc<Inner>,
    /// The queue pair its Connect or Accept carried: it may send once CompleteConnect (or the Accept)
    /// returned, and what ended the connection, when a Terminate did, is that queue pair's to say.
    queue_pair: Mutex<Option<(QueuePairId, data::Established)>>,
}

/// An incoming connection offer, as GetConnectionRequest delivers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionRequest {
    pub peer: SocketAddr,
    /// The offer's read limits from this side's view (the peer's IRD is what this side may issue).
    pub limits: ReadLimits,
    pub private_data: Bytes,
}

impl Connector {
    pub fn id(&self) -> ConnectorId {
        self.id
    }

    async fn done(&self, what: &str, r: Request) -> Result<()> {
        match self.inner.call(r).await? {
            Response::Done => Ok(()),
            r => Err(unexpected(what, r)),
        }
    }

    async fn address(&self, what: &str, r: Request) -> Result<SocketAddr> {
        match self.inner.call(r).await? {
            Response::Address(a) | Response::Bound(a) => Ok(a),
            r => Err(unexpected(what, r)),
        }
    }

    /// IND2Connector::Bind; port 0 allocates from 49152-65535.
    pub async fn bind(&self, local: SocketAddr) -> Result<SocketAddr> {
        self.address(
            "Bind",
            Request::Bind {
                connector: self.id,
                local,
            },
        )
        .await
    }

    /// IND2Connector::Connect without a queue pair (connection management only: data messages from the
    /// peer are dropped). Completes when the peer accepts (Ok) or rejects (CONNECTION_REFUSED).
    pub async fn connect(&self, remote: SocketAddr, limits: ReadLimits, private_data: &[u8]) -> Result<()> {
        self.connect_inner(None, None, remote, limits, private_data).await
    }

    /// IND2Connector::Connect carrying `qp`: after CompleteConnect, `qp` sends and receives on this
    /// connection. CONNECTION_ACTIVE if `qp` was already connected.
    pub async fn connect_qp(
        &self,
        qp: &QueuePair,
        remote: SocketAddr,
        limits: ReadLimits,
        private_data: &[u8],
    ) -> Result<()> {
        self.connect_inner(Some(qp), None, remote, limits, private_data)
            .await
    }

    async fn connect_inner(
        &self,
        qp: Option<&QueuePair>,
        shared_endpoint: Option<SharedEndpointId>,
        remote: SocketAddr,
        limits: ReadLimits,
        private_data: &[u8],
    ) -> Result<()> {
        let queue_pair = qp.map(QueuePair::id);
        self.inner
            .data_path
            .give_queue_pair(&self.inner, self.id, queue_pair)?;
        let r = Request::Connect {
            connector: self.id,
            remote,
            limits,
            private_data: Bytes::copy_from_slice(private_data),
            shared_endpoint,
            queue_pair,
        };
        self.carries(qp);
        self.done("Connect", r).await
    }

    /// The connection carries `qp` (or none) from this Connect or Accept on.
    fn carries(&self, qp: Option<&QueuePair>) {
        *self.queue_pair.lock().expect("not poisoned") = qp.map(|q| (q.id(), q.established().clone()));
    }

    /// NdkConnectWithSharedEndpoint.
    pub async fn connect_with_shared_endpoint(
        &self,
        ep: &SharedEndpoint,
        remote: SocketAddr,
        limits: ReadLimits,
        private_data: &[u8],
    ) -> Result<()> {
        self.connect_inner(None, Some(ep.id), remote, limits, private_data)
            .await
    }

    /// NdkConnectWithSharedEndpoint carrying `qp`.
    pub async fn connect_qp_with_shared_endpoint(
        &self,
        qp: &QueuePair,
        ep: &SharedEndpoint,
        remote: SocketAddr,
        limits: ReadLimits,
        private_data: &[u8],
    ) -> Result<()> {
        self.connect_inner(Some(qp), Some(ep.id), remote, limits, private_data)
            .await
    }

    pub async fn complete_connect(&self) -> Result<()> {
        match self
            .inner
            .call(Request::CompleteConnect { connector: self.id })
            .await?
        {
            Response::Done => {}
            Response::HandedOff(h) => {
                // The active side may send at once (RFC 5044 §7.1): nothing to wait for.
                self.inner.data_path.adopt(&self.inner, self.id, h)?;
            }
            r => return Err(unexpected("CompleteConnect", r)),
        }
        if let Some((_, established)) = self.queue_pair.lock().expect("not poisoned").as_ref() {
            established.set();
        }
        Ok(())
    }

    /// IND2Connector::Accept: completes when the connection is established.
    pub async fn accept(&self, limits: ReadLimits, private_data: &[u8]) -> Result<()> {
        self.accept_inner(None, limits, private_data).await
    }

    /// IND2Connector::Accept carrying `qp`. Receives posted on `qp` before this call are ready for the
    /// initiator's first message (iWARP has no receiver-not-ready retry).
    pub async fn accept_qp(&self, qp: &QueuePair, limits: ReadLimits, private_data: &[u8]) -> Result<()> {
        self.accept_inner(Some(qp), limits, private_data).await?;
        qp.established().set();
        Ok(())
    }

    async fn accept_inner(
        &self,
        qp: Option<&QueuePair>,
        limits: ReadLimits,
        private_data: &[u8],
    ) -> Result<()> {
        let queue_pair = qp.map(QueuePair::id);
        self.inner
            .data_path
            .give_queue_pair(&self.inner, self.id, queue_pair)?;
        let request = Request::Accept {
            connector: self.id,
            limits,
            private_data: Bytes::copy_from_slice(private_data),
            queue_pair,
        };
        self.carries(qp);
        match self.inner.call(request).await? {
            Response::Done => Ok(()),
            Response::HandedOff(h) => match self.inner.data_path.adopt(&self.inner, self.id, h)? {
                // Peer-to-peer mode: the Accept completes with the initiator's RTR (RFC 6581 §9).
                Some(rtr) => rtr.await.unwrap_or_else(|_| {
                    Err(Error::new(
                        NdStatus::ConnectionAborted,
                        "the connecting peer abandoned the connection",
                    ))
                }),
                None => Ok(()),
            },
            r => Err(unexpected("Accept", r)),
        }
    }

    /// IND2Connector::Reject (passive: refuse the offer; active: refuse the limits the peer answered).
    pub async fn reject(&self, private_data: &[u8]) -> Result<()> {
        self.done(
            "Reject",
            Request::Reject {
                connector: self.id,
                private_data: Bytes::copy_from_slice(private_data),
            },
        )
        .await
    }

    /// The peer's read limits from this side's view.
    pub async fn read_limits(&self) -> Result<ReadLimits> {
        match self
            .inner
            .call(Request::GetReadLimits { connector: self.id })
            .await?
        {
            Response::ReadLimits(l) => Ok(l),
            r => Err(unexpected("GetReadLimits", r)),
        }
    }

    /// All of the peer's private data.
    pub async fn private_data(&self) -> Result<Bytes> {
        match self
            .inner
            .call(Request::GetPrivateData {
                connector: self.id,
                buffer_len: u32::MAX,
            })
            .await?
        {
            Response::PrivateData { data, .. } => Ok(data),
            r => Err(unexpected("GetPrivateData", r)),
        }
    }

    /// IND2Connector::GetPrivateData into `buf`: BUFFER_OVERFLOW (with `required_size`) when it is short,
    /// after filling it with as much as fits.
    pub async fn read_private_data(&self, buf: &mut [u8]) -> Result<usize> {
        match self
            .inner
            .call(Request::GetPrivateData {
                connector: self.id,
                buffer_len: buf.len() as u32,
            })
            .await?
        {
            Response::PrivateData { data, required } => {
                buf[..data.len()].copy_from_slice(&data);
                if (data.len() as u32) < required {
                    return Err(Error::buffer_overflow(
                        required,
                        format!("private data is {required} bytes; the buffer holds {}", buf.len()),
                    ));
                }
                Ok(data.len())
            }
            r => Err(unexpected("GetPrivateData", r)),
        }
    }

    pub async fn local_addr(&self) -> Result<SocketAddr> {
        self.address("GetLocalAddress", Request::GetLocalAddress { connector: self.id })
            .await
    }

    pub async fn peer_addr(&self) -> Result<SocketAddr> {
        self.address("GetPeerAddress", Request::GetPeerAddress { connector: self.id })
            .await
    }

    /// Completes when the peer disconnects.
    pub async fn notify_disconnect(&self) -> Result<()> {
        self.done(
            "NotifyDisconnect",
            Request::NotifyDisconnect { connector: self.id },
        )
        .await
    }

    /// Disconnects; outstanding requests on the connector complete with CANCELED. CONNECTION_INVALID when
    /// the connector is not connected; when its connection was ended by a Terminate, the error says which
    /// (the words of its queue pair's [`TerminateInfo`]).
    pub async fn disconnect(&self) -> Result<()> {
        // In process, what was queued goes out and the FIN after it, before soft-rdmad closes its copy.
        self.inner.data_path.disconnect(&self.inner, self.id).await;
        match self
            .done("Disconnect", Request::Disconnect { connector: self.id })
            .await
        {
            Err(e) if e.status == NdStatus::ConnectionInvalid => Err(self.ended_by(e).await),
            r => r,
        }
    }

    /// `e`, the connector not being connected, said with what ended its connection when its queue pair
    /// knows: a Terminate, sent or received. Otherwise (no queue pair, a FIN, closed meanwhile) `e` as
    /// soft-rdmad said it.
    async fn ended_by(&self, e: Error) -> Error {
        let Some(qp) = self
            .queue_pair
            .lock()
            .expect("not poisoned")
            .as_ref()
            .map(|(qp, _)| *qp)
        else {
            return e;
        };
        match self.inner.data_path.query_queue_pair(&self.inner, qp).await {
            Ok(QueuePairStatus {
                terminate: Some(t), ..
            }) => Error::new(
                e.status,
                format!("connector is not connected: its connection already ended when {t}"),
            ),
            _ => e,
        }
    }

    /// CancelOverlappedRequests: pending requests complete with CANCELED; a pending Connect is abandoned.
    pub async fn cancel(&self) -> Result<()> {
        self.done(
            "Cancel",
            Request::Cancel {
                object: ObjectRef::Connector(self.id),
            },
        )
        .await
    }
}

/// `Type { id, session }`: the objects a client holds by id within its session.
macro_rules! debug_by_id {
    ($($t:ident),*) => {$(
        impl std::fmt::Debug for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($t))
                    .field("id", &self.id.0)
                    .field("session", &self.inner.session.0)
                    .finish()
            }
        }
    )*};
}
debug_by_id!(Connector, Listener, SharedEndpoint);

impl std::fmt::Debug for Adapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adapter")
            .field("session", &self.inner.session.0)
            .finish()
    }
}

impl Drop for Connector {
    fn drop(&mut self) {
        // An in-process connection ends gracefully first; its driver tells soft-rdmad after the FIN.
        self.inner.data_path.close_connector(&self.inner, self.id);
    }
}

/// How [`Adapter::serve_until_readable`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InlineWait {
    /// The descriptor is readable.
    Readable,
    /// The timeout passed first.
    TimedOut,
    /// Nothing to serve on this thread (soft-rdmad runs the data path, no connection runs here, or the
    /// only sockets left report a hang-up their driver ends): the caller waits on its descriptor alone.
    NothingToServe,
}

/// What a TDI-style handler ([`Listener::serve`]) answers to an offer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OfferDecision {
    Accept {
        limits: ReadLimits,
        private_data: Bytes,
    },
    /// The peer gets CONNECTION_REFUSED, with this private data.
    Refuse {
        private_data: Bytes,
    },
    /// Insufficient resources: refused without private data.
    InsufficientResources,
}

/// An IND2Listener. Dropping it stops listening.
///
/// ```no_run
/// # async fn f(adapter: soft_rdma::client::Adapter) -> soft_rdma::Result<()> {
/// use soft_rdma::client::ReadLimits;
/// let l = adapter.create_listener().await?;
/// l.listen("10.0.0.2:7174".parse().unwrap(), 16).await?;
/// let c = adapter.create_connector().await?;
/// let offer = l.get_connection_request(&c).await?;
/// println!("{} offers {:?}", offer.peer, offer.private_data);
/// c.accept(ReadLimits { inbound: 8, outbound: 8 }, b"welcome").await?;
/// # Ok(()) }
/// ```
pub struct Listener {
    id: ListenerId,
    inner: Arc<Inner>,
}

impl Listener {
    pub fn id(&self) -> ListenerId {
        self.id
    }

    /// Bind + Listen; backlog 0 = no limit. Returns the bound address.
    pub async fn listen(&self, local: SocketAddr, backlog: u32) -> Result<SocketAddr> {
        match self
            .inner
            .call(Request::Listen {
                listener: self.id,
                local,
                backlog,
            })
            .await?
        {
            Response::Bound(a) => Ok(a),
            r => Err(unexpected("Listen", r)),
        }
    }

    /// IND2Listener::GetConnectionRequest: waits for an offer and attaches it to `connector`.
    pub async fn get_connection_request(&self, connector: &Connector) -> Result<ConnectionRequest> {
        match self
            .inner
            .call(Request::GetConnectionRequest {
                listener: self.id,
                connector: connector.id,
            })
            .await?
        {
            Response::ConnectionRequest {
                peer,
                limits,
                private_data,
                ..
            } => Ok(ConnectionRequest {
                peer,
                limits,
                private_data,
            }),
            r => Err(unexpected("GetConnectionRequest", r)),
        }
    }

    /// TDI ClientEventConnect: `handler` sees each offer's remote address and private data and decides;
    /// accepted connectors go to `on_accepted` (data may flow as soon as it has them). Runs until an error
    /// (e.g. the listener is cancelled or the daemon goes away).
    pub async fn serve<H, F>(&self, adapter: &Adapter, mut handler: H, mut on_accepted: F) -> Result<()>
    where
        H: FnMut(&ConnectionRequest) -> OfferDecision,
        F: FnMut(Connector, ConnectionRequest),
    {
        loop {
            let c = adapter.create_connector().await?;
            let offer = self.get_connection_request(&c).await?;
            match handler(&offer) {
                OfferDecision::Accept { limits, private_data } => match c.accept(limits, &private_data).await
                {
                    Ok(()) => on_accepted(c, offer),
                    Err(e) if e.status == NdStatus::ConnectionAborted => continue,
                    Err(e) => return Err(e),
                },
                OfferDecision::Refuse { private_data } => c.reject(&private_data).await?,
                OfferDecision::InsufficientResources => c.reject(&[]).await?,
            }
        }
    }

    /// Cancels pending GetConnectionRequest calls (they complete with CANCELED).
    pub async fn cancel(&self) -> Result<()> {
        match self
            .inner
            .call(Request::Cancel {
                object: ObjectRef::Listener(self.id),
            })
            .await?
        {
            Response::Done => Ok(()),
            r => Err(unexpected("Cancel", r)),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.inner.fire(Request::CloseListener { listener: self.id });
    }
}

/// An NDK shared endpoint. Dropping it releases its port.
///
/// ```no_run
/// # async fn f(adapter: soft_rdma::client::Adapter) -> soft_rdma::Result<()> {
/// use soft_rdma::client::ReadLimits;
/// let ep = adapter.create_shared_endpoint("10.0.0.1:0".parse().unwrap()).await?;
/// for port in [7000, 7001] {
///     let c = adapter.create_connector().await?;
///     let dest = std::net::SocketAddr::new("10.0.0.2".parse().unwrap(), port);
///     c.connect_with_shared_endpoint(&ep, dest, ReadLimits::default(), b"").await?;
///     c.complete_connect().await?;
/// }
/// # Ok(()) }
/// ```
pub struct SharedEndpoint {
    id: SharedEndpointId,
    inner: Arc<Inner>,
}

impl SharedEndpoint {
    pub fn id(&self) -> SharedEndpointId {
        self.id
    }
}

impl Drop for SharedEndpoint {
    fn drop(&mut self) {
        self.inner
            .fire(Request::CloseSharedEndpoint { endpoint: self.id });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No daemon at the socket: DEVICE_REMOVED naming the socket, how to start soft-rdmad and how a client
    /// finds another socket; where the path came from is said.
    #[tokio::test]
    async fn no_daemon_says_how_to_start_one() {
        let dir = std::env::temp_dir().join(format!("soft-rdma-no-daemon-{}", std::process::id()));
        let path = dir.join("soft-rdmad.sock");
        let e = Adapter::open(&path).await.unwrap_err();
        assert_eq!(e.status, NdStatus::DeviceRemoved, "{e}");
        let text = e.to_string();
        for words in [
            &format!(
                "cannot reach soft-rdmad at {} (the path given to Adapter::open)",
                path.display()
            )[..],
            "Is soft-rdmad running? Start it as root (`soft-rdmad`",
            "dist/soft-rdmad.service",
            "$SOFT_RDMA_UDS",
        ] {
            assert!(text.contains(words), "{words:?} missing from {text}");
        }
        let default = unreachable_daemon(
            Path::new(DEFAULT_SOCKET_PATH),
            SocketSource::Default,
            &std::io::Error::from(std::io::ErrorKind::NotFound),
        );
        assert!(
            default
                .context
                .starts_with("cannot reach soft-rdmad at /run/soft-rdma/soft-rdmad.sock (the default; $SOFT_RDMA_UDS names another)"),
            "{default}"
        );
        let denied = unreachable_daemon(
            &path,
            SocketSource::Environment,
            &std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        );
        assert_eq!(denied.status, NdStatus::AccessViolation);
        assert!(
            denied.context.contains("may not search the directory"),
            "{denied}"
        );
        // A socket this user may not open: the message names the file's group.
        let dir = std::env::temp_dir().join(format!("soft-rdma-denied-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("sock");
        std::fs::write(&file, b"").unwrap();
        let gid = std::fs::metadata(&file)
            .map(|m| std::os::unix::fs::MetadataExt::gid(&m))
            .unwrap();
        let group = nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid))
            .unwrap()
            .map_or_else(|| format!("gid {gid}"), |g| g.name);
        let denied = unreachable_daemon(
            &file,
            SocketSource::Given,
            &std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        );
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            denied
                .context
                .contains(&format!("ask to be added to group {group}")),
            "{denied}"
        );
    }
}
