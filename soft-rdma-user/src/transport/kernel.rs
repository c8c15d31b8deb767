//! The kernel-TCP transport: soft-rdma's connections are ordinary kernel TCP sockets driven by tokio.
//!
//! - Ports: [`KernelPorts`] (the engine's `HostPorts`) holds each soft-rdma port as a bound kernel socket,
//!   without SO_REUSEADDR for exclusive ports so that no host application can bind it (a port in TIME_WAIT
//!   is then skipped by allocation, or refused with SHARING_VIOLATION when asked for explicitly, exactly as
//!   the host stack would). A listener is that socket put into listen; a connect uses it (exclusive port) or
//!   a fresh SO_REUSEADDR socket bound to the same addr:port (shared endpoint: many destinations from one
//!   port; the Rev 1 retry). A listener's port is bound with SO_REUSEADDR and listens at once
//!   ([`HostPorts::reserve_listener`]): as exclusive (nothing else may bind a listening port), and a listener
//!   restarted after a crash is not kept off its port by the old connections in TIME_WAIT (as siw).
//! - Connections: TCP_NODELAY (as siw), keepalive idle 10 s / interval 2 s / 5 probes and TCP_USER_TIMEOUT
//!   20 s, so a dead peer is found in about 20 s without any deadline on the application (docs/connector-semantics.md:
//!   no timeout on Accept). A reader task reports `Received` and finally `Closed`; a writer task takes `Send`s
//!   from a queue so the event loop never blocks; `Close` flushes then FINs (reporting Closed when the peer's
//!   FIN arrives, at most 5 s later), or RSTs when aborting. The side that closes first keeps the port in
//!   TIME_WAIT for a minute, as any TCP stack: the port space hands ports out first-in first-out so a
//!   released port is reused last.
//! - How each connection ended is logged once (debug, "connection ended", `how=` one of `Ending`'s names):
//!   the peer's FIN, the peer's RST, this host's TCP giving up (ETIMEDOUT: TCP_USER_TIMEOUT or keepalive), or
//!   a local Close.
//! - Out of file descriptors: a bind or connect fails with INSUFFICIENT_RESOURCES (EMFILE/ENFILE). A
//!   listener that cannot accept for want of one closes a descriptor it keeps in reserve, accepts the
//!   connection and, unless the reserve can be taken back at once (room again), resets it: the initiator's
//!   Connect fails with CONNECTION_REFUSED. Left in the kernel's backlog, the connection would be
//!   established at the TCP level and its initiator would wait for an MPA Reply forever (nothing times out
//!   the passive side's Accept).

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use socket2::{Domain, SockRef, Socket, TcpKeepalive, Type};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::debug;

use crate::warn_limited;

use super::TRANSPORT_CONN_ID_BASE;
use crate::engine::requests::ListenerId;
use crate::engine::requests::TcpStatus;
use crate::engine::transport_seam::{ConnId, ConnectFailure, HostPorts, TransportCommand, TransportEvent};

/// The kernel's accept queue of a listener.
const LISTEN_BACKLOG: i32 = 1024;

/// How long a graceful close waits for the peer's FIN before the connection is dropped anyway.
const CLOSE_LINGER: Duration = Duration::from_secs(5);

struct Reserved {
    socket: Socket,
    shared: bool,
}

type ReservedMap = Arc<Mutex<HashMap<SocketAddr, Reserved>>>;

/// A descriptor held in reserve for refusing connections when the process is out of descriptors.
type Spare = Arc<Mutex<Option<std::fs::File>>>;

fn spare_descriptor() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

/// What [`refuse_one`] did.
enum Refusal {
    /// The connection from this peer was reset.
    Refused(SocketAddr),
    /// There was room after all (descriptors were freed or the limit raised meanwhile): accepted.
    Kept(TcpStream, SocketAddr),
    /// No spare descriptor, or no connection waiting.
    Nothing,
}

/// Out of descriptors: frees the spare one and accepts a waiting connection with it; if the spare cannot be
/// taken back (still out of descriptors), resets that connection and takes the spare back with its
/// descriptor.
fn refuse_one(tcp: &TcpListener, spare: &Spare) -> Refusal {
    let Some(reserve) = spare.lock().expect("not poisoned").take() else {
        return Refusal::Nothing;
    };
    drop(reserve);
    // Polled once, never waited on: a connection is waiting (accept just failed on it).
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let accepted = match tcp.poll_accept(&mut cx) {
        std::task::Poll::Ready(Ok(x)) => Some(x),
        _ => None,
    };
    let back = spare_descriptor();
    let outcome = match (accepted, back.is_some()) {
        (None, _) => Refusal::Nothing,
        (Some((stream, remote)), true) => Refusal::Kept(stream, remote),
        (Some((stream, remote)), false) => {
            // SO_LINGER 0: the close sends an RST.
            let _ = SockRef::from(&stream).set_linger(Some(Duration::ZERO));
            drop(stream);
            Refusal::Refused(remote)
        }
    };
    *spare.lock().expect("not poisoned") = back.or_else(spare_descriptor);
    outcome
}

/// A TCP socket bound to `local`. `reuse` (SO_REUSEADDR) only where soft-rdma itself puts several sockets on
/// one port (shared endpoints) or rebinds a port it just used: an exclusive reservation without it is what
/// keeps host applications — which usually set SO_REUSEADDR themselves — off soft-rdma's ports.
fn new_socket(local: SocketAddr, reuse: bool) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(local), Type::STREAM, None)?;
    socket.set_reuse_address(reuse)?;
    if local.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&local.into())?;
    Ok(socket)
}

/// `getsockopt(TCP_INFO)` of `fd` (Linux `struct tcp_info`).
fn tcp_info(fd: &std::os::fd::OwnedFd) -> Option<TcpStatus> {
    use std::os::fd::AsRawFd;
    // SAFETY: tcp_info is plain integers: all zeros is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `fd` is an open socket this map owns; `info` is writable for `len` bytes, and the kernel writes
    // at most `len` and says how many.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(TcpStatus {
        rtt_us: info.tcpi_rtt,
        rttvar_us: info.tcpi_rttvar,
        snd_cwnd: info.tcpi_snd_cwnd,
        snd_mss: info.tcpi_snd_mss,
        unacked: info.tcpi_unacked,
        total_retrans: info.tcpi_total_retrans,
        bytes_acked: info.tcpi_bytes_acked,
        bytes_received: info.tcpi_bytes_received,
    })
}

fn failure(e: &io::Error) -> ConnectFailure {
    match e.raw_os_error() {
        // A reset during the handshake (or right after it, before the connect was seen complete) is a refusal
        // too: a listener out of descriptors resets what it cannot accept.
        Some(libc::ECONNREFUSED | libc::ECONNRESET | libc::ECONNABORTED) => ConnectFailure::Refused,
        Some(libc::ETIMEDOUT) => ConnectFailure::TimedOut,
        Some(libc::ENETUNREACH) => ConnectFailure::NetworkUnreachable,
        Some(libc::EHOSTUNREACH) => ConnectFailure::HostUnreachable,
        Some(libc::EADDRINUSE) => ConnectFailure::AddressInUse,
        Some(libc::EADDRNOTAVAIL) => ConnectFailure::AddressNotAvailable,
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) => ConnectFailure::NoResources,
        _ => ConnectFailure::Other,
    }
}

/// The engine's view of the host TCP port space, backed by real bound sockets.
pub struct KernelPorts {
    reserved: ReservedMap,
}

impl HostPorts for KernelPorts {
    fn reserve(&mut self, local: SocketAddr, shared: bool) -> Result<(), ConnectFailure> {
        let socket = new_socket(local, shared).map_err(|e| failure(&e))?;
        self.reserved
            .lock()
            .expect("not poisoned")
            .insert(local, Reserved { socket, shared });
        Ok(())
    }

    /// SO_REUSEADDR, so that connections of an earlier listener in TIME_WAIT do not keep the port (siw does the
    /// same), and listening at once: no other socket may bind a port something listens on, SO_REUSEADDR or
    /// not, so the port is as exclusive as any other reservation.
    fn reserve_listener(&mut self, local: SocketAddr) -> Result<(), ConnectFailure> {
        let socket = new_socket(local, true).map_err(|e| failure(&e))?;
        socket.listen(LISTEN_BACKLOG).map_err(|e| failure(&e))?;
        self.reserved.lock().expect("not poisoned").insert(
            local,
            Reserved {
                socket,
                shared: false,
            },
        );
        Ok(())
    }

    fn release(&mut self, local: SocketAddr) {
        self.reserved.lock().expect("not poisoned").remove(&local);
    }
}

enum WriteCmd {
    Data(Bytes),
    Close {
        abort: bool,
    },
    /// Flush, stop the reader, and keep the socket for the client ([`TransportCommand::HandOff`]).
    HandOff,
}

/// Sockets of connections handed to clients: the daemon's copy, until `Close`.
type HandedMap = Arc<Mutex<HashMap<ConnId, std::os::fd::OwnedFd>>>;

/// The writers of live connections, by connection.
type WriterMap = Arc<Mutex<HashMap<ConnId, mpsc::UnboundedSender<WriteCmd>>>>;

/// The transport: owns the sockets, executes commands, reports events on `events`.
pub struct KernelTransport {
    events: mpsc::UnboundedSender<TransportEvent>,
    reserved: ReservedMap,
    writers: Arc<Mutex<HashMap<ConnId, mpsc::UnboundedSender<WriteCmd>>>>,
    handed: HandedMap,
    connecting: HashMap<ConnId, JoinHandle<()>>,
    listeners: HashMap<ListenerId, JoinHandle<()>>,
    next_conn: Arc<AtomicU64>,
    connect_timeout: Duration,
    spare: Spare,
}

impl KernelTransport {
    /// The transport and the `HostPorts` to give the engine (they share the reserved sockets).
    pub fn new(
        events: mpsc::UnboundedSender<TransportEvent>,
        connect_timeout: Duration,
    ) -> (Self, KernelPorts) {
        let reserved: ReservedMap = Arc::default();
        let t = KernelTransport {
            events,
            reserved: reserved.clone(),
            writers: Arc::default(),
            handed: Arc::default(),
            connecting: HashMap::new(),
            listeners: HashMap::new(),
            next_conn: Arc::new(AtomicU64::new(TRANSPORT_CONN_ID_BASE)),
            connect_timeout,
            spare: Arc::new(Mutex::new(spare_descriptor())),
        };
        (t, KernelPorts { reserved })
    }

    /// Executes one command (never blocks: socket work happens in tasks).
    pub fn execute(&mut self, cmd: TransportCommand) {
        match cmd {
            TransportCommand::Listen { listener, local } => self.listen(listener, local),
            TransportCommand::StopListening { listener } => {
                if let Some(task) = self.listeners.remove(&listener) {
                    task.abort();
                }
            }
            TransportCommand::Connect { conn, local, remote } => self.connect(conn, local, remote),
            TransportCommand::Send { conn, data } => {
                if let Some(w) = self.writers.lock().expect("not poisoned").get(&conn) {
                    let _ = w.send(WriteCmd::Data(data));
                }
            }
            TransportCommand::HandOff { conn } => {
                if let Some(w) = self.writers.lock().expect("not poisoned").get(&conn) {
                    let _ = w.send(WriteCmd::HandOff);
                }
            }
            TransportCommand::Close { conn, abort } => {
                if let Some(fd) = self.handed.lock().expect("not poisoned").remove(&conn) {
                    // The client is done with it, or gone: the connection ends whoever else holds it.
                    let s = SockRef::from(&fd);
                    if abort {
                        let _ = s.set_linger(Some(Duration::ZERO));
                    }
                    let _ = s.shutdown(std::net::Shutdown::Both);
                    drop(fd);
                    debug!(
                        conn = conn.0,
                        how = Ending::Local.name(),
                        "connection ended (handed to a client)"
                    );
                    let _ = self.events.send(TransportEvent::Closed { conn });
                    return;
                }
                let writer = self.writers.lock().expect("not poisoned").get(&conn).cloned();
                if let Some(w) = writer {
                    let _ = w.send(WriteCmd::Close { abort });
                } else if let Some(task) = self.connecting.remove(&conn) {
                    task.abort();
                    let _ = self.events.send(TransportEvent::Closed { conn });
                }
            }
        }
    }

    /// A copy of a handed-off connection's socket, for the client (the daemon keeps its own until `Close`).
    pub fn handed_socket(&self, conn: ConnId) -> Option<std::os::fd::OwnedFd> {
        let handed = self.handed.lock().expect("not poisoned");
        handed.get(&conn).and_then(|fd| fd.try_clone().ok())
    }

    /// `TCP_INFO` of a connection handed to a client, read from the daemon's copy of its socket.
    pub fn handed_tcp_info(&self, conn: ConnId) -> Option<TcpStatus> {
        let handed = self.handed.lock().expect("not poisoned");
        tcp_info(handed.get(&conn)?)
    }

    /// Forgets every handed-off socket without shutting it down: the daemon is stopping, and the clients'
    /// connections go on without it.
    pub fn release_handed(&self) {
        self.handed.lock().expect("not poisoned").clear();
    }

    fn listen(&mut self, listener: ListenerId, local: SocketAddr) {
        let reserved = self.reserved.lock().expect("not poisoned").remove(&local);
        let socket = match reserved {
            Some(r) => r.socket,
            None => match new_socket(local, false) {
                Ok(s) => s,
                Err(e) => {
                    warn_limited!(%local, error = %e, "cannot listen: the port is not reserved and cannot be bound");
                    return;
                }
            },
        };
        let std_listener: std::net::TcpListener = match socket.listen(LISTEN_BACKLOG) {
            Ok(()) => socket.into(),
            Err(e) => {
                warn_limited!(%local, error = %e, "listen failed");
                return;
            }
        };
        let tcp = match TcpListener::from_std(std_listener) {
            Ok(l) => l,
            Err(e) => {
                warn_limited!(%local, error = %e, "listen failed");
                return;
            }
        };
        let (events, writers, next) = (self.events.clone(), self.writers.clone(), self.next_conn.clone());
        let handed = self.handed.clone();
        let spare = self.spare.clone();
        let task = tokio::spawn(async move {
            let announce = |stream: TcpStream, remote: SocketAddr| {
                let conn = ConnId(next.fetch_add(1, Ordering::Relaxed));
                let local = stream.local_addr().unwrap_or(local);
                let announce = TransportEvent::Accepted {
                    listener,
                    conn,
                    local,
                    remote,
                    mss: path_mss(&stream),
                };
                start_connection(conn, stream, announce, &events, &writers, &handed);
            };
            loop {
                match tcp.accept().await {
                    Ok((stream, remote)) => announce(stream, remote),
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                        match refuse_one(&tcp, &spare) {
                            Refusal::Refused(remote) => warn_limited!(
                                %local,
                                %remote,
                                "out of file descriptors: connection refused (reset); raise RLIMIT_NOFILE"
                            ),
                            Refusal::Kept(stream, remote) => announce(stream, remote),
                            Refusal::Nothing => {
                                warn_limited!(%local, error = %e, "accept failed");
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                        }
                    }
                    Err(e) => {
                        warn_limited!(%local, error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        });
        self.listeners.insert(listener, task);
    }

    fn connect(&mut self, conn: ConnId, local: SocketAddr, remote: SocketAddr) {
        let reserved = {
            let mut map = self.reserved.lock().expect("not poisoned");
            match map.get(&local) {
                Some(r) if !r.shared => map.remove(&local).map(|r| r.socket),
                _ => None,
            }
        };
        let (events, writers, timeout) = (self.events.clone(), self.writers.clone(), self.connect_timeout);
        let handed = self.handed.clone();
        let task = tokio::spawn(async move {
            let socket = match reserved {
                Some(s) => s,
                None => match rebind(local).await {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = events.send(TransportEvent::ConnectFailed {
                            conn,
                            reason: failure(&e),
                        });
                        return;
                    }
                },
            };
            let std_stream: std::net::TcpStream = socket.into();
            let s = TcpSocket::from_std_stream(std_stream);
            let result = match tokio::time::timeout(timeout, s.connect(remote)).await {
                Ok(Ok(stream)) => Ok(stream),
                Ok(Err(e)) => Err(failure(&e)),
                Err(_) => Err(ConnectFailure::TimedOut),
            };
            match result {
                Ok(stream) => {
                    let local = stream.local_addr().unwrap_or(local);
                    let mss = path_mss(&stream);
                    start_connection(
                        conn,
                        stream,
                        TransportEvent::Connected { conn, local, mss },
                        &events,
                        &writers,
                        &handed,
                    );
                }
                Err(reason) => {
                    debug!(conn = conn.0, %remote, ?reason, ?timeout, "connect failed");
                    let _ = events.send(TransportEvent::ConnectFailed { conn, reason });
                }
            }
        });
        self.connecting.retain(|_, t| !t.is_finished());
        self.connecting.insert(conn, task);
    }
}

/// A socket on `local`, which soft-rdma holds but whose reservation was used (a shared endpoint, or the Rev 1
/// retry on the port of a connection the responder just closed or reset). That connection's socket may be
/// a moment from closed, and it was bound without SO_REUSEADDR: EADDRINUSE is retried for up to 200 ms.
async fn rebind(local: SocketAddr) -> io::Result<Socket> {
    let mut tries = 0;
    loop {
        match new_socket(local, true) {
            Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) && tries < 20 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            r => return r,
        }
    }
}

/// The connection's MSS (TCP_MAXSEG), so that each FPDU fits one segment (RFC 5044 §4.1).
fn path_mss(stream: &TcpStream) -> u32 {
    SockRef::from(stream).tcp_mss().unwrap_or(1448).clamp(536, 65_000)
}

fn tune(stream: &TcpStream) {
    let _ = stream.set_nodelay(true);
    let s = SockRef::from(stream);
    let ka = TcpKeepalive::new()
        .with_time(Duration::from_secs(10))
        .with_interval(Duration::from_secs(2))
        .with_retries(5);
    let _ = s.set_tcp_keepalive(&ka);
    let _ = s.set_tcp_user_timeout(Some(Duration::from_secs(20)));
}

/// Registers the writer of an established connection, reports `announce` (Accepted or Connected), and only
/// then starts reading, so the engine always learns of a connection before any of its bytes.
fn start_connection(
    conn: ConnId,
    stream: TcpStream,
    announce: TransportEvent,
    events: &mpsc::UnboundedSender<TransportEvent>,
    writers: &Arc<Mutex<HashMap<ConnId, mpsc::UnboundedSender<WriteCmd>>>>,
    handed: &HandedMap,
) {
    tune(&stream);
    let ends = (stream.local_addr().ok(), stream.peer_addr().ok());
    let (rd, wr) = stream.into_split();
    let (tx, rx) = mpsc::unbounded_channel();
    writers.lock().expect("not poisoned").insert(conn, tx);
    let _ = events.send(announce);
    let end = Arc::new(ConnEnd::default());
    let (stop, stopped) = oneshot::channel();
    let reader = tokio::spawn(read_loop(
        conn,
        rd,
        stopped,
        events.clone(),
        writers.clone(),
        end.clone(),
    ));
    tokio::spawn(write_loop(
        conn,
        ends,
        wr,
        rx,
        Reader {
            task: reader,
            stop: Some(stop),
        },
        events.clone(),
        (writers.clone(), handed.clone()),
        end,
    ));
}

/// How a connection ended, as the log line "connection ended" (field `how`) says. A dead socket gives its
/// error to whichever half asks first (the other half then reads an end of stream or gets EPIPE), and a
/// half may be stopped before it looks, so both halves note what they saw and the most telling one wins:
/// the order below, weakest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ending {
    /// The engine closed it (Close: FIN after what was queued, or RST when aborting).
    Local,
    /// End of stream: the peer closed in order (FIN).
    PeerFin,
    /// The peer aborted (RST): ECONNRESET, or EPIPE when the RST came after its FIN (tcp_reset() in
    /// net/ipv4/tcp_input.c gives EPIPE in CLOSE_WAIT), as when a killed process's kernel answers the data
    /// still arriving.
    PeerReset,
    /// Another socket error.
    Failed,
    /// This host's TCP gave up: data unacknowledged for TCP_USER_TIMEOUT, or keepalive probes unanswered
    /// ([`tune`]). Linux then reports ETIMEDOUT, or the last ICMP error the connection got meanwhile
    /// (EHOSTUNREACH when the peer's address no longer resolves, ENETUNREACH, ...): tcp_write_err() in
    /// net/ipv4/tcp_timer.c. An established socket without IP_RECVERR takes no other hard error from ICMP, so
    /// on a connection these errors mean the timers expired.
    TimedOut,
}

impl Ending {
    /// The name the log gives it (`how=`).
    fn name(self) -> &'static str {
        match self {
            Ending::Local => "local",
            Ending::PeerFin => "peer_fin",
            Ending::Failed => "failed",
            Ending::PeerReset => "peer_reset",
            Ending::TimedOut => "timed_out",
        }
    }

    /// What a socket error says about the end. EPIPE is also what a half gets after the other took the
    /// socket's error; that half notes the error itself, which ranks above [`Ending::PeerReset`] unless it
    /// was a reset too.
    fn of(e: &io::Error) -> Option<Ending> {
        match e.raw_os_error() {
            Some(libc::ECONNRESET | libc::ECONNABORTED | libc::EPIPE) => Some(Ending::PeerReset),
            Some(
                libc::ETIMEDOUT | libc::EHOSTUNREACH | libc::ENETUNREACH | libc::EHOSTDOWN | libc::ENONET,
            ) => Some(Ending::TimedOut),
            _ => Some(Ending::Failed),
        }
    }
}

/// One connection's end, shared by its reader and writer: whether `Closed` went to the engine, and the most
/// telling [`Ending`] either half saw.
#[derive(Default)]
struct ConnEnd {
    reported: AtomicBool,
    how: Mutex<Option<Ending>>,
}

impl ConnEnd {
    fn note(&self, how: Option<Ending>) {
        let mut h = self.how.lock().expect("not poisoned");
        *h = (*h).max(how);
    }

    fn how(&self) -> Option<Ending> {
        *self.how.lock().expect("not poisoned")
    }
}

fn report_closed(
    conn: ConnId,
    end: &ConnEnd,
    events: &mpsc::UnboundedSender<TransportEvent>,
    writers: &Mutex<HashMap<ConnId, mpsc::UnboundedSender<WriteCmd>>>,
) {
    if !end.reported.swap(true, Ordering::AcqRel) {
        writers.lock().expect("not poisoned").remove(&conn);
        let _ = events.send(TransportEvent::Closed { conn });
    }
}

/// A connection's reader task, and the signal that stops it for a hand-off.
struct Reader {
    task: JoinHandle<Option<OwnedReadHalf>>,
    stop: Option<oneshot::Sender<()>>,
}

/// Reads until the end of the stream, an error, or `stop` (a hand-off: the read half is returned, and
/// everything read so far has gone out as `Received`).
async fn read_loop(
    conn: ConnId,
    mut rd: OwnedReadHalf,
    mut stop: oneshot::Receiver<()>,
    events: mpsc::UnboundedSender<TransportEvent>,
    writers: Arc<Mutex<HashMap<ConnId, mpsc::UnboundedSender<WriteCmd>>>>,
    end: Arc<ConnEnd>,
) -> Option<OwnedReadHalf> {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    loop {
        buf.reserve(64 * 1024);
        let read = tokio::select! {
            biased;
            // Cancel-safe: a read that did not complete read nothing.
            r = rd.read_buf(&mut buf) => r,
            _ = &mut stop => return Some(rd),
        };
        match read {
            Ok(0) => {
                end.note(Some(Ending::PeerFin));
                break;
            }
            Ok(_) => {
                if events
                    .send(TransportEvent::Received {
                        conn,
                        data: buf.split().freeze(),
                    })
                    .is_err()
                {
                    break;
                }
            }
            Err(e) => {
                debug!(conn = conn.0, error = %e, "read failed");
                end.note(Ending::of(&e));
                break;
            }
        }
    }
    report_closed(conn, &end, &events, &writers);
    None
}

#[allow(clippy::too_many_arguments)]
async fn write_loop(
    conn: ConnId,
    (local, peer): (Option<SocketAddr>, Option<SocketAddr>),
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<WriteCmd>,
    mut reader: Reader,
    events: mpsc::UnboundedSender<TransportEvent>,
    (writers, handed): (WriterMap, HandedMap),
    end: Arc<ConnEnd>,
) {
    let how = loop {
        let Some(cmd) = rx.recv().await else {
            // The reader ended (it took this queue's sender away), or the transport is gone.
            break None;
        };
        match cmd {
            WriteCmd::Data(d) => {
                if let Err(e) = wr.write_all(&d).await {
                    debug!(conn = conn.0, error = %e, "write failed");
                    break Ending::of(&e);
                }
                // Room for more: the engine keeps a bounded window of unwritten bytes per connection.
                let _ = events.send(TransportEvent::Written { conn, bytes: d.len() });
            }
            WriteCmd::HandOff => {
                if let Some(stop) = reader.stop.take() {
                    let _ = stop.send(());
                }
                // The reader stops at once unless it is past the end of the stream (it reported Closed).
                let Ok(Some(rd)) = (&mut reader.task).await else {
                    return;
                };
                let socket = rd
                    .reunite(wr)
                    .map_err(|e| io::Error::other(e.to_string()))
                    .and_then(|s| s.into_std());
                match socket {
                    Ok(s) => {
                        writers.lock().expect("not poisoned").remove(&conn);
                        handed.lock().expect("not poisoned").insert(conn, s.into());
                        let _ = events.send(TransportEvent::HandedOff { conn });
                    }
                    Err(e) => {
                        warn_limited!(conn = conn.0, error = %e, "cannot hand the connection over; closing it");
                        report_closed(conn, &end, &events, &writers);
                    }
                }
                return;
            }
            WriteCmd::Close { abort } => {
                if abort {
                    // SO_LINGER 0: the last close sends an RST and discards anything unsent. The write half
                    // must not be dropped normally: that shuts the write side down first, and the peer would
                    // read a FIN (an orderly end) before the RST. `forget` leaves the socket whole until the
                    // reader's half goes too.
                    let _ = SockRef::from(wr.as_ref()).set_linger(Some(Duration::ZERO));
                    reader.task.abort();
                    wr.forget();
                } else {
                    let _ = wr.shutdown().await;
                    // Wait for the peer's FIN (the reader ends on it), but not forever: Closed is reported as
                    // soon as the FIN exchange is through.
                    let _ = tokio::time::timeout(CLOSE_LINGER, &mut reader.task).await;
                    reader.task.abort();
                }
                report_closed(conn, &end, &events, &writers);
                debug!(
                    conn = conn.0,
                    ?local,
                    ?peer,
                    how = Ending::Local.name(),
                    "connection ended"
                );
                return;
            }
        }
    };
    end.note(how);
    reader.task.abort();
    // The reader may be past its last read already: what it saw counts too.
    let _ = (&mut reader.task).await;
    report_closed(conn, &end, &events, &writers);
    let how = end.how().map_or("unknown", Ending::name);
    debug!(conn = conn.0, ?local, ?peer, how, "connection ended");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loopback address whose port nothing holds right now.
    fn free_loopback() -> SocketAddr {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    }

    fn ports() -> KernelPorts {
        KernelPorts {
            reserved: Arc::default(),
        }
    }

    /// The connect timer is the configured one: a connect whose SYNs go unanswered fails with `TimedOut`
    /// (IO_TIMEOUT) at the configured deadline of tokio's clock (paused here: the test moves it), not before.
    #[tokio::test(start_paused = true)]
    async fn an_unanswered_connect_fails_at_the_configured_deadline() {
        // A listener whose accept queue is full drops further SYNs (tcp_conn_request): a black hole on
        // loopback. Backlog 0 holds one connection.
        let full = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        full.bind(&free_loopback().into()).unwrap();
        full.listen(0).unwrap();
        let hole = full.local_addr().unwrap().as_socket().unwrap();
        let _queued = std::net::TcpStream::connect(hole).unwrap();

        let (tx, mut events) = mpsc::unbounded_channel();
        let (mut t, _ports) = KernelTransport::new(tx, Duration::from_millis(1500));
        t.execute(TransportCommand::Connect {
            conn: ConnId(1),
            local: free_loopback(),
            remote: hole,
        });
        tokio::time::sleep(Duration::from_millis(1499)).await;
        assert!(events.try_recv().is_err(), "nothing before the deadline");
        // Not later either (the paused clock's resolution is 1 ms): the default 10 s did not apply.
        let at_deadline = tokio::time::timeout(Duration::from_millis(2), events.recv()).await;
        assert_eq!(
            at_deadline.expect("the failure at the deadline"),
            Some(TransportEvent::ConnectFailed {
                conn: ConnId(1),
                reason: ConnectFailure::TimedOut
            })
        );
    }

    /// A dead peer is found by this host's TCP timers, not by any deadline of soft-rdma's: every connection
    /// carries TCP_USER_TIMEOUT 20 s and keepalive (idle 10 s, 5 probes 2 s apart), and their expiry
    /// (ETIMEDOUT) is logged as [`Ending::TimedOut`], told apart from the peer's RST and FIN.
    #[tokio::test]
    async fn connections_carry_the_dead_peer_timers_and_their_expiry_is_told_apart() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let s = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        tune(&s);
        let r = SockRef::from(&s);
        assert!(r.keepalive().unwrap());
        assert_eq!(r.tcp_keepalive_time().unwrap(), Duration::from_secs(10));
        assert_eq!(r.tcp_keepalive_interval().unwrap(), Duration::from_secs(2));
        assert_eq!(r.tcp_keepalive_retries().unwrap(), 5);
        assert_eq!(r.tcp_user_timeout().unwrap(), Some(Duration::from_secs(20)));
        assert!(r.tcp_nodelay().unwrap());

        let of = |errno| Ending::of(&io::Error::from_raw_os_error(errno));
        assert_eq!(of(libc::ETIMEDOUT), Some(Ending::TimedOut));
        assert_eq!(of(libc::ECONNRESET), Some(Ending::PeerReset));
        assert_eq!(
            of(libc::EPIPE),
            Some(Ending::PeerReset),
            "EPIPE: an RST after the peer's FIN"
        );
        assert_eq!(
            of(libc::EHOSTUNREACH),
            Some(Ending::TimedOut),
            "the timers' expiry, reported as the ICMP error met meanwhile"
        );
        assert_eq!(of(libc::EIO), Some(Ending::Failed));
        // The most telling wins, whichever half saw it first.
        let end = ConnEnd::default();
        end.note(Some(Ending::TimedOut));
        end.note(Some(Ending::PeerFin));
        end.note(None);
        assert_eq!(end.how(), Some(Ending::TimedOut));
        let end = ConnEnd::default();
        end.note(Some(Ending::PeerFin));
        end.note(Some(Ending::PeerReset));
        assert_eq!(end.how(), Some(Ending::PeerReset));
        // A reader's error outranks the writer's EPIPE that followed it.
        let end = ConnEnd::default();
        end.note(Some(Ending::Failed));
        end.note(of(libc::EPIPE));
        assert_eq!(end.how(), Some(Ending::Failed));
    }

    /// A listener's port is free again for the next listener although the first one's connection is in
    /// TIME_WAIT (its side closed first, as when a daemon is killed), and it stays exclusive; an exclusive
    /// (connector) reservation of a port in TIME_WAIT is still refused.
    #[test]
    fn a_listener_gets_its_port_back_from_time_wait_and_keeps_it_exclusive() {
        let mut ports = ports();
        let at = free_loopback();
        ports.reserve_listener(at).unwrap();
        let listener: std::net::TcpListener =
            ports.reserved.lock().unwrap().remove(&at).unwrap().socket.into();
        let client = std::net::TcpStream::connect(at).unwrap();
        let (server, _) = listener.accept().unwrap();
        drop(listener);
        drop(server); // the listening side closes first: its end goes to TIME_WAIT
        let mut b = [0u8; 1];
        assert_eq!(std::io::Read::read(&mut &client, &mut b).unwrap(), 0, "FIN");
        drop(client);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            ports.reserve(at, false),
            Err(ConnectFailure::AddressInUse),
            "an exclusive bind is kept off a port in TIME_WAIT"
        );
        ports.reserve_listener(at).expect("a listener is not");
        // Exclusive: neither a plain bind nor one with SO_REUSEADDR (std's TcpListener) gets the port.
        let plain = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        assert!(plain.bind(&at.into()).is_err());
        assert_eq!(
            std::net::TcpListener::bind(at).unwrap_err().kind(),
            io::ErrorKind::AddrInUse
        );
        ports.release(at);
        // A port another application listens on is refused.
        let other = std::net::TcpListener::bind(free_loopback()).unwrap();
        assert_eq!(
            ports.reserve_listener(other.local_addr().unwrap()),
            Err(ConnectFailure::AddressInUse)
        );
    }
}
