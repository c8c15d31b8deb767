//! The in-process data path (kernel-TCP mode): memory regions, completion queues and queue pairs live in the
//! application's process, and each established connection's socket, handed over by soft-rdmad
//! ([`HandOff`]), is driven here on the application's tokio runtime by the same sans-IO engine the daemon
//! runs ([`DataPath`], [`FpduConnection`]: the FPDU receiver and the first-FPDU hold). A session holds it as
//! [`super::data_path::SessionDataPath::InProcess`]; the other data path, soft-rdmad's, is reached through
//! its rings ([`super::daemon_rings`]).
//!
//! - **Posting** runs the queue pair and writes its FPDUs to the socket from the posting task itself
//!   (non-blocking; what does not fit waits for the connection's driver task): no hand-off to another task
//!   or process on the way out. Payloads are sent in place from registered memory by gathered writes, and a
//!   message completes once the socket has taken its last FPDU ([`output`]).
//! - **Receiving**: one driver task per connection ([`driver`]) reads the socket, cuts FPDUs, places data
//!   into registered memory, answers Read Requests, and pushes completions straight into the completion
//!   queues, whose waiters it wakes: one wake-up per direction, as for plain TCP.
//! - **Progress without the application**: a peer's RDMA Write or Read, or its Terminate, needs no
//!   application code, and not even a running runtime. When the runtime leaves a connection unserved for
//!   250 µs (its thread is blocked, or busy in code that does not yield), the process's progress thread
//!   ([`progress`], its policy in [`watchdog`]) serves it with the driver's own passes, under the same
//!   lock, until the driver task runs again. While the runtime keeps up, the thread only looks: never when
//!   no traffic flows, every 5 ms while it does.
//! - **Endings**: the peer's FIN or RST, or a Terminate either way, flush the queue pair (CANCELED) and are
//!   reported to soft-rdmad (`ConnectionEnded`), which ends the connector (NotifyDisconnect fires, ports are
//!   released). A local Disconnect, or dropping the queue pair or connector, flushes the queue pair, writes
//!   what was already queued, sends a FIN, and only then tells the daemon, which closes its copy of the
//!   socket. A closing queue pair's final counters go to the daemon first, for its metrics. If the process
//!   dies, the kernel closes its socket and soft-rdmad closes its copy with the session: the peer sees the
//!   connection end, and the ports are returned.
//! - If soft-rdmad stops or dies, the device is gone (as a NIC that is removed): this process ends every
//!   connection it runs (the peers see them close), and every call — posts, waits, queries, requests —
//!   fails with DEVICE_REMOVED, exactly as when the daemon ran the data path. Keeping connections alive
//!   without the daemon would leave ports, status and NotifyDisconnect unowned.

use foldhash::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::net::TcpStream;
use tokio::sync::{Notify, oneshot};
use tracing::debug;

mod driver;
mod output;
mod progress;
mod watchdog;

use self::driver::{ConnServe, drive};
use self::output::{By, Held, Output};
use self::progress::{Watch, WatchGuard};
use super::Inner;
use crate::engine::connection::{FpduConnection, StreamEnd};
use crate::engine::datapath::DataPath;
use crate::engine::framing::{GatherBuf, rtr_fpdu};
use crate::engine::qp::QpParams;
use crate::engine::requests::{AdapterInfo, ConnectionEnd, ConnectorId, HandOff, SessionId};
use crate::engine::verbs::{Completion, CompletionQueueId, QueuePairId};
use crate::error::{Error, NdStatus, Result};
use crate::uds::messages::Request;

/// The largest inbound ULPDU accepted (RFC 5044 §4.1: the MPA length field's reach).
const MAX_INBOUND_ULPDU: usize = 65535;
/// Bytes of FPDUs a connection keeps queued in the process beyond what its socket took. The socket's send
/// buffer is the real queue; this only has to keep it fed. While payloads were copied, a larger window
/// starved it (the queue pair copied the whole window before the socket got any of it: 1 MiB measured
/// 6.5–6.9 Gb/s against 7.9–8.4 Gb/s for 256 KiB, 4 MiB Writes, TCP 8.5–9.0); sent in place, 256 KiB,
/// 1 MiB and 4 MiB measured alike (7.5–8.1 Gb/s).
const LOCAL_TRANSMIT_WINDOW: usize = 256 * 1024;
/// Bytes read from a socket per `read` call.
const READ_CHUNK: usize = 256 * 1024;
/// Queue pairs per `ReportDataPath` frame: a queue pair's status is at most about 120 bytes encoded, so a
/// part stays well under the 64 KiB client frame.
const REPORT_PART: usize = 256;
/// How long a connection that sent its FIN waits for the peer's before the socket is dropped anyway.
const CLOSE_LINGER: Duration = Duration::from_secs(5);

/// Where one handed-off connection stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Open,
    /// Ending: what is queued goes out, then the FIN.
    Closing,
    /// The FIN went out (or the connection failed): nothing more is sent.
    Done,
}

/// What soft-rdmad is told once a connection is over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tell {
    /// The peer ended it (or the connection failed): `ConnectionEnded`.
    Ended(ConnectionEnd),
    /// This side disconnected (the queue pair was closed): `Disconnect`.
    Disconnect,
    /// The connector was dropped: `CloseConnector`.
    CloseConnector,
    /// The caller of `Connector::disconnect` tells the daemon itself.
    Nothing,
}

/// One connection handed to this process.
struct LocalConn {
    qp: QueuePairId,
    /// The largest inbound ULPDU accepted (the daemon's `--max-ulpdu`).
    max_inbound_ulpdu: usize,
    socket: Arc<TcpStream>,
    /// FPDU mode: the inbound side and the first-FPDU hold (active side), as the daemon's path runs them.
    fpdu: FpduConnection,
    /// FPDUs ready to write, in order, with the completions that wait for them.
    out: Output,
    stage: Stage,
    /// What the daemon hears when the connection is over, and whether it heard it: it hears one thing, once
    /// (a peer's FIN after a local Disconnect must not end the connector under the Disconnect).
    tell: Option<Tell>,
    told: bool,
    /// Wakes the driver task: there is output waiting for room, or the stage changed.
    wake: Arc<Notify>,
    /// Passive side in peer-to-peer mode: the Accept waits for the initiator's RTR.
    accept: Option<oneshot::Sender<Result<()>>>,
    /// Fires when the FIN went out (or the connection ended): a Disconnect waits for it.
    finished: Arc<Notify>,
    fin_sent: bool,
    /// The error a write met: a socket gives its error to one call only, and the reader then sees a mere
    /// end of stream, so the writer's is what tells how the connection ended.
    write_error: Option<ConnectionEnd>,
    /// What the progress thread sees of it: read passes, writes, output waiting.
    watch: Watch,
    /// Its stream ended (EOF or an error): a poll's pass ([`InProcessDataPath::poll_pass`]) reads it no more.
    read_over: bool,
}

/// Every in-process data-path object of one session.
pub(super) struct InProcessDataPath {
    state: Mutex<LocalState>,
    session: SessionId,
    /// What [`Self::poll_pass`] reuses from one poll to the next, and who polls: one poller at a time.
    poll_scratch: Mutex<PollScratch>,
}

/// [`InProcessDataPath::poll_pass`]'s buffers, kept so that a program spinning on its completion queue
/// allocates nothing per poll.
#[derive(Default)]
struct PollScratch {
    /// The read buffer (grown to `READ_CHUNK` at the first pass).
    buf: Vec<u8>,
    /// The connections one pass serves (emptied at its end): id, socket, watch, read, write.
    conns: Vec<(ConnectorId, Arc<TcpStream>, Watch, bool, bool)>,
}

struct LocalState {
    dp: DataPath,
    conns: HashMap<ConnectorId, LocalConn>,
    /// The connector each connected queue pair belongs to.
    connector_of: HashMap<QueuePairId, ConnectorId>,
    /// Who holds the lock: the progress thread writes to sockets whose readiness its runtime's reactor
    /// has not seen.
    by: By,
}

/// Completions to hand to their completion queues once the state's lock is released.
type Batches = Vec<(SessionId, CompletionQueueId, Vec<Completion>)>;

impl InProcessDataPath {
    pub(super) fn new(adapter: AdapterInfo, session: SessionId) -> Self {
        InProcessDataPath {
            state: Mutex::new(LocalState {
                dp: DataPath::new(adapter, crate::seed::random_seed()),
                conns: HashMap::default(),
                connector_of: HashMap::default(),
                by: By::Runtime,
            }),
            session,
            poll_scratch: Mutex::default(),
        }
    }

    /// Runs `f` on the engine's data path under the lock, and delivers the completions it made.
    pub(super) fn with<R>(&self, inner: &Inner, f: impl FnOnce(&mut DataPath, SessionId) -> R) -> R {
        let mut st = self.state.lock().expect("not poisoned");
        let r = f(&mut st.dp, self.session);
        st.deliver(inner);
        r
    }

    /// Posts work requests on a queue pair and sends what it can at once.
    pub(super) fn post(
        &self,
        inner: &Inner,
        qp: QueuePairId,
        requests: Vec<crate::engine::verbs::WorkRequest>,
    ) -> Result<()> {
        let mut st = self.state.lock().expect("not poisoned");
        st.dp.post(self.session, qp, requests)?;
        st.pump();
        st.deliver(inner);
        Ok(())
    }

    /// Closes a queue pair: what is outstanding completes with CANCELED, and its connection (if any) ends
    /// gracefully, the daemon told `Disconnect` once the FIN is out.
    pub(super) fn close_qp(&self, inner: &Inner, qp: QueuePairId) {
        {
            let mut st = self.state.lock().expect("not poisoned");
            // Its final counters go to soft-rdmad before anything else of the close (the requests keep
            // their order on the socket): what it moved since the last report is counted (docs/metrics.md).
            if let Some(last) = st.dp.status_of_qp(self.session, qp) {
                inner.fire(final_report(last, st.dp.memory_region_count()));
            }
            // What its connection still holds completes before the close's CANCELED (in posting order).
            if let Some(c) = st.connector_of.get(&qp).copied()
                && let Some(conn) = st.conns.get_mut(&c)
            {
                let held = conn.out.take_completions();
                st.dp.complete(held);
            }
            let connector = st.dp.close_qp(self.session, qp).ok().flatten();
            st.connector_of.remove(&qp);
            if let Some(c) = connector {
                st.begin_close(c, Tell::Disconnect);
            }
            st.deliver(inner);
        };
    }

    /// soft-rdmad went away: the device is removed. Every connection ends (the peer sees it close), as
    /// when the daemon ran them; waits and posts fail with DEVICE_REMOVED from now on.
    pub(super) fn device_removed(&self) {
        let mut st = self.state.lock().expect("not poisoned");
        let connectors: Vec<ConnectorId> = st.conns.keys().copied().collect();
        for connector in connectors {
            if let Some(c) = st.conns.get_mut(&connector) {
                c.tell = None;
                c.told = true; // nobody to tell: the daemon is gone
                let _ = c.out.clear();
                c.fpdu.drop_hold();
                let _ = socket2::SockRef::from(c.socket.as_ref()).shutdown(std::net::Shutdown::Both);
            }
            st.peer_ended(connector, None, ConnectionEnd::Failed);
        }
        // Nobody is told of these completions: waits fail with DEVICE_REMOVED.
        let _ = st.dp.take_completions();
    }

    /// What `status` shows of this process's data path: its queue pairs and its number of regions, in parts
    /// that each fit a request frame.
    pub(super) fn report(&self) -> Vec<Request> {
        let (queue_pairs, memory_regions) = self.state.lock().expect("not poisoned").dp.status();
        if queue_pairs.is_empty() {
            return vec![Request::ReportDataPath {
                queue_pairs,
                memory_regions,
                first: true,
            }];
        }
        queue_pairs
            .chunks(REPORT_PART)
            .enumerate()
            .map(|(i, part)| Request::ReportDataPath {
                queue_pairs: part.to_vec(),
                memory_regions,
                first: i == 0,
            })
            .collect()
    }

    /// Whether any connection runs here (the periodic report goes on while one does).
    pub(super) fn has_conns(&self) -> bool {
        !self.state.lock().expect("not poisoned").conns.is_empty()
    }

    /// Whether `connector` has a connection here.
    pub(super) fn has_conn(&self, connector: ConnectorId) -> bool {
        self.state
            .lock()
            .expect("not poisoned")
            .conns
            .contains_key(&connector)
    }

    /// The connector is dropped: its connection ends gracefully and the daemon is told `CloseConnector`
    /// once the FIN is out. `false`: no connection here (the caller tells the daemon at once).
    pub(super) fn close_connector(&self, inner: &Inner, connector: ConnectorId) -> bool {
        let mut st = self.state.lock().expect("not poisoned");
        let found = st
            .conns
            .get(&connector)
            .is_some_and(|c| c.stage != Stage::Done && !c.told);
        if found {
            st.begin_close(connector, Tell::CloseConnector);
        }
        st.deliver(inner);
        found
    }

    /// Connector::disconnect: flushes the queue pair, writes what was queued and the FIN, and returns once
    /// the FIN is out (the caller then tells the daemon).
    pub(super) async fn disconnect(&self, inner: &Inner, connector: ConnectorId) {
        let finished = {
            let mut st = self.state.lock().expect("not poisoned");
            let finished = st.conns.get(&connector).map(|c| c.finished.clone());
            st.begin_close(connector, Tell::Nothing);
            st.deliver(inner);
            finished
        };
        let Some(finished) = finished else { return };
        loop {
            let notified = finished.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let done = {
                let st = self.state.lock().expect("not poisoned");
                st.conns.get(&connector).is_none_or(|c| c.fin_sent)
            };
            if done {
                return;
            }
            notified.await;
        }
    }

    /// Takes over a handed-off connection: the queue pair given to `connector` runs on `fd` from now on.
    /// Returns what the Accept waits for (the initiator's RTR), if anything.
    pub(super) fn adopt(
        self: &Arc<Self>,
        inner: &Arc<Inner>,
        connector: ConnectorId,
        h: HandOff,
        fd: OwnedFd,
    ) -> Result<Option<oneshot::Receiver<Result<()>>>> {
        let std_stream = std::net::TcpStream::from(fd);
        std_stream
            .set_nonblocking(true)
            .and_then(|()| TcpStream::from_std(std_stream))
            .map_err(|e| {
                Error::new(
                    NdStatus::Unsuccessful,
                    format!("cannot use the handed-off socket: {e}"),
                )
            })
            .and_then(|socket| self.adopt_stream(inner, connector, h, socket))
    }

    fn adopt_stream(
        self: &Arc<Self>,
        inner: &Arc<Inner>,
        connector: ConnectorId,
        h: HandOff,
        socket: TcpStream,
    ) -> Result<Option<oneshot::Receiver<Result<()>>>> {
        let socket = Arc::new(socket);
        let wake = Arc::new(Notify::new());
        let watch = Watch::new();
        let now = Instant::now();
        let (accept_tx, accept_rx) = if h.awaiting_rtr {
            let (tx, rx) = oneshot::channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let srq_events = {
            let mut st = self.state.lock().expect("not poisoned");
            let Some(qp) = st.dp.queue_pair_of(connector) else {
                return Err(Error::new(
                    NdStatus::ConnectionInvalid,
                    "the queue pair of this connection was closed meanwhile",
                ));
            };
            let params = QpParams {
                crc: h.crc,
                max_ulpdu: h.max_ulpdu as usize,
                ird: h.ird,
                ord: h.ord,
            };
            let mut conn = LocalConn {
                qp,
                max_inbound_ulpdu: (h.max_inbound_ulpdu as usize).min(MAX_INBOUND_ULPDU),
                socket: socket.clone(),
                fpdu: FpduConnection::handed_off(&h, now),
                out: Output::default(),
                stage: Stage::Open,
                tell: None,
                told: false,
                wake: wake.clone(),
                accept: accept_tx,
                finished: Arc::new(Notify::new()),
                fin_sent: false,
                read_over: false,
                write_error: None,
                watch: watch.clone(),
            };
            if let Some(rtr) = h.send_rtr {
                // RFC 6581 §9: in peer-to-peer mode the initiator's first FPDU is the RTR.
                conn.queue(rtr_fpdu(rtr, h.crc));
            }
            st.dp.connected(qp, params);
            if let Some(rtr) = h.send_rtr {
                // The RTR went first on the queue pair's queues (a Read RTR takes Read Request MSN 1).
                st.dp.rtr_sent(qp, rtr);
            }
            st.conns.insert(connector, conn);
            st.connector_of.insert(qp, connector);
            if !h.received.is_empty() {
                st.on_bytes(connector, &h.received);
            }
            // Flush, then pump: pump ends only when no queue pair has anything it may send, so nothing
            // it woke is left waiting for an event that may never come.
            st.flush(connector);
            st.pump();
            st.deliver(inner);
            st.dp.take_srq_events()
        };
        for (_, srq) in srq_events {
            inner.srq_limit_reached(srq);
        }
        debug!(
            connector = connector.0,
            conn = h.conn.0,
            "running the handed-off connection in this process"
        );
        // From here on the progress thread serves it whenever this runtime does not.
        let serve = ConnServe {
            path: Arc::downgrade(self),
            inner: Arc::downgrade(inner),
            connector,
            socket: socket.clone(),
            watch: watch.clone(),
        };
        watch.start(socket.as_raw_fd(), Arc::new(serve), h.first_fpdu_hold_us > 0);
        tokio::spawn(drive(
            Arc::downgrade(inner),
            self.clone(),
            connector,
            (socket, WatchGuard(watch)),
            wake,
        ));
        Ok(accept_rx)
    }
}

/// A closing queue pair's last counters, as one more part of the current report: soft-rdmad adds what it
/// moved since its last report to its totals, and the next whole report (which no longer has it) drops it
/// from `status`.
fn final_report(last: crate::engine::verbs::QueuePairStatus, memory_regions: u32) -> Request {
    Request::ReportDataPath {
        queue_pairs: vec![last],
        memory_regions,
        first: false,
    }
}

/// Hands completions to their completion queues (and wakes whoever waits on them). Called with the state's
/// lock held ([`LocalState::deliver`]).
fn deliver(inner: &Inner, batches: Batches) {
    if batches.is_empty() {
        return;
    }
    let cqs = inner.cqs.lock().expect("not poisoned");
    for (_, cq, entries) in batches {
        if let Some(state) = cqs.get(&cq) {
            state.push(entries);
        }
    }
}

impl LocalConn {
    /// Queues bytes to write, or keeps them while the first-FPDU hold holds data.
    fn queue(&mut self, data: Bytes) {
        if let Some(data) = self.fpdu.hold_or_send(data) {
            self.out.push_bytes(data);
        }
    }

    /// Queues a queue pair's chunk with the completions that wait for it; returns completions due now.
    fn queue_gathered(&mut self, buf: GatherBuf, held: Held) -> Held {
        if self.fpdu.holds_data() {
            // Kept for a while: copied now, so the messages are complete now.
            let kept = self.fpdu.hold_or_send(buf.into_bytes());
            debug_assert!(kept.is_none(), "the hold keeps what is sent while it holds data");
            return held;
        }
        self.out.push_gathered(buf, held)
    }

    /// Whether the queue pair may add FPDUs now.
    fn may_transmit(&self) -> bool {
        self.stage == Stage::Open && self.fpdu.may_transmit()
    }
}

impl LocalState {
    /// Hands the completions made so far to their completion queues, before the lock is released: the
    /// driver task, the progress thread, a poller and a poster each make completions under the lock, and a
    /// thread that delivered them after releasing it could be overtaken by the next holder's. A queue pair's
    /// completions would then reach its completion queue out of order: a Receive completed after the one
    /// posted behind it (RxM placed a segmented message's later segment first), a Send's after the Receive
    /// of the peer's answer to it. RFC 5040 §5.5 and rdma-core both want a queue's completions in the order
    /// of its work requests. The lock order is state, then `inner.cqs`, then a queue's own locks; a
    /// notification the push fires (a completion channel's byte) takes none of the state's.
    fn deliver(&mut self, inner: &Inner) {
        deliver(inner, self.dp.take_completions());
        // A queue pair's asynchronous event follows the completions its move to Error made.
        for (_, qp, event) in self.dp.take_qp_events() {
            inner.queue_pair_event(qp, event);
        }
    }

    /// Moves FPDUs from every queue pair with something to send into its connection's output, within the
    /// transmit window, and writes what the sockets take.
    fn pump(&mut self) {
        loop {
            let conns = &self.conns;
            let produced = self.dp.transmit_gathered(|connector| {
                let c = conns.get(&connector).filter(|c| c.may_transmit())?;
                Some((connector, LOCAL_TRANSMIT_WINDOW.saturating_sub(c.out.len())))
            });
            if produced.is_empty() {
                return;
            }
            let mut touched = Vec::new();
            for (connector, buf, held) in produced {
                if let Some(c) = self.conns.get_mut(&connector) {
                    let due = c.queue_gathered(buf, held);
                    self.dp.complete(due);
                    touched.push(connector);
                }
            }
            touched.dedup();
            // A socket that took everything lets its queue pair go on (flush wakes it); one that is full
            // waits for its driver.
            for connector in touched {
                self.flush(connector);
            }
            // A local protection error's Terminate is queued: the connection ends after it (siw
            // `siw_qp_cm_drop`), and the daemon hears that it ended.
            for connector in self.dp.take_connections_to_drop() {
                crate::warn_limited!(
                    connector = connector.0,
                    "local protection error: Terminate sent; closing the connection"
                );
                self.begin_close(connector, Tell::Ended(ConnectionEnd::Terminated));
            }
        }
    }

    /// Writes as much of the connection's output as the socket takes now; the rest waits for the driver.
    /// Room freed lets the queue pair produce more.
    fn flush(&mut self, connector: ConnectorId) {
        let mut more = false;
        let mut released = Vec::new();
        if let Some(c) = self.conns.get_mut(&connector) {
            while !c.out.is_empty() {
                match c.out.write_to(&c.socket, &mut released, self.by) {
                    Ok(0) => break,
                    Ok(_) => more = true,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        // The reader sees the same error and ends the connection.
                        debug!(connector = connector.0, error = %e, "write failed");
                        c.write_error.get_or_insert(ending_of(&e));
                        released.extend(c.out.clear());
                        c.wake.notify_one();
                        break;
                    }
                }
            }
            if more {
                c.watch.wrote();
            }
            if !c.out.is_empty() {
                // The driver waits for room (and the progress thread watches for it).
                c.wake.notify_one();
                c.watch.output_waits();
            } else {
                c.watch.output_drained();
            }
            let fin = c.out.is_empty() && c.stage == Stage::Closing && c.fpdu.hold().is_none();
            let qp = c.qp;
            // Messages written whole are complete (RFC 5040 §5.5: the memory may be reused now).
            self.dp.complete(released);
            if fin {
                self.send_fin(connector);
                return;
            }
            if more {
                self.dp.wake(qp);
            }
        }
    }

    /// The FIN goes out; the connection sends nothing more.
    fn send_fin(&mut self, connector: ConnectorId) {
        if let Some(c) = self.conns.get_mut(&connector)
            && !c.fin_sent
        {
            let _ = socket2::SockRef::from(c.socket.as_ref()).shutdown(std::net::Shutdown::Write);
            c.fin_sent = true;
            c.stage = Stage::Done;
            c.finished.notify_waiters();
            c.wake.notify_one();
        }
    }

    /// Ends the connection from this side: the queue pair is flushed (CANCELED), what was queued goes out,
    /// then the FIN (after the first-FPDU hold, if one is on); the daemon hears `tell` then.
    fn begin_close(&mut self, connector: ConnectorId, tell: Tell) {
        let Some(c) = self.conns.get_mut(&connector) else {
            return;
        };
        let qp = c.qp;
        if !c.told && (c.tell.is_none() || tell == Tell::CloseConnector) {
            c.tell = Some(tell);
        }
        if c.stage == Stage::Open {
            c.stage = Stage::Closing;
            c.fpdu.close_after_hold();
        }
        if let Some(a) = c.accept.take() {
            let _ = a.send(Err(Error::new(NdStatus::Canceled, "disconnected")));
        }
        c.wake.notify_one();
        // What was handed to the connection completes before the flush's CANCELED (one completion per
        // request, in order); it still goes out.
        let held = c.out.take_completions();
        self.dp.complete(held);
        // Disconnect flushes the queue pair with CANCELED; it cannot be reused (IND2Connector::Disconnect).
        self.dp.detach(qp, NdStatus::Canceled);
        self.flush(connector);
    }

    /// The connection is over from the peer's side or failed: the queue pair is flushed and nothing more is
    /// sent but what `send` holds (a Terminate of ours), followed by the FIN.
    fn peer_ended(&mut self, connector: ConnectorId, send: Option<Bytes>, how: ConnectionEnd) {
        let Some(c) = self.conns.get_mut(&connector) else {
            return;
        };
        if !c.told && c.tell.is_none() {
            c.tell = Some(Tell::Ended(c.write_error.unwrap_or(how)));
        }
        if let Some(a) = c.accept.take() {
            let _ = a.send(Err(Error::new(
                NdStatus::ConnectionAborted,
                "the connecting peer abandoned the connection",
            )));
        }
        // A Terminate goes now: what the first-FPDU hold kept is dropped with the stream.
        c.fpdu.drop_hold();
        let qp = c.qp;
        if c.stage == Stage::Open {
            c.stage = Stage::Closing;
        }
        let held = c.out.take_completions();
        if let Some(t) = send {
            c.out.push_bytes(t);
        }
        self.dp.complete(held);
        self.dp.detach(qp, NdStatus::Canceled);
        self.flush(connector);
    }

    /// Stream bytes: FPDUs go to the queue pair; a Terminate either way ends the connection.
    fn on_bytes(&mut self, connector: ConnectorId, data: &[u8]) {
        let Some(c) = self.conns.get_mut(&connector) else {
            return;
        };
        if c.stage != Stage::Open {
            return; // ending: what the peer still sends is not looked at
        }
        let step = c
            .fpdu
            .on_bytes(data, c.max_inbound_ulpdu, &mut self.dp, Some(c.qp));
        // A Read RTR's answer, or our Terminate (the hold, if one was on, is gone with the stream then).
        for data in step.send {
            c.queue(data);
        }
        if step.accept_complete
            && let Some(a) = c.accept.take()
        {
            // The initiator called CompleteConnect: the passive Accept completes (RFC 6581 §9).
            let _ = a.send(Ok(()));
        }
        match step.end {
            None => return,
            Some(StreamEnd::PeerTerminated(cause)) => {
                debug!(connector = connector.0, ?cause, "peer sent a Terminate; closing");
            }
            Some(StreamEnd::Terminated(cause)) => {
                crate::warn_limited!(connector = connector.0, ?cause, "terminating the stream");
            }
        }
        self.peer_ended(connector, None, ConnectionEnd::Terminated);
    }

    /// The first-FPDU hold's deadline passed.
    fn on_hold_deadline(&mut self, connector: ConnectorId, now: Instant) {
        let Some(c) = self.conns.get_mut(&connector) else {
            return;
        };
        // The driver and the progress thread both look: whoever comes second finds the next deadline.
        if c.fpdu.deadline().is_none_or(|d| d > now) {
            return;
        }
        let Some(step) = c.fpdu.on_hold_deadline(now) else {
            return;
        };
        for data in step.send {
            c.out.push_bytes(data);
        }
        let qp = c.qp;
        // The queue pair was passed over while its data was held: it may send now.
        self.dp.wake(qp);
        // Flush first: a flush after the pump could drain the output and wake the queue pair with nothing
        // left to pump it (seen as a Write stream stalling mid-message at the hold's second deadline).
        self.flush(connector);
        self.pump();
    }
}

/// What a socket error says about the connection's end (Linux: tcp_reset() gives ECONNRESET, or EPIPE
/// after the peer's FIN; the TCP timers' expiry gives ETIMEDOUT or the last ICMP error met meanwhile).
fn ending_of(e: &std::io::Error) -> ConnectionEnd {
    match e.raw_os_error() {
        Some(libc::ECONNRESET | libc::ECONNABORTED | libc::EPIPE) => ConnectionEnd::PeerReset,
        Some(libc::ETIMEDOUT | libc::EHOSTUNREACH | libc::ENETUNREACH | libc::EHOSTDOWN | libc::ENONET) => {
            ConnectionEnd::TimedOut
        }
        _ => ConnectionEnd::Failed,
    }
}

impl LocalState {
    /// The driver is gone: the connection is forgotten (its queue pair stays, in Error).
    fn forget(&mut self, connector: ConnectorId) {
        if let Some(c) = self.conns.remove(&connector) {
            c.finished.notify_waiters();
            if let Some(a) = c.accept {
                let _ = a.send(Err(Error::new(
                    NdStatus::ConnectionAborted,
                    "the connecting peer abandoned the connection",
                )));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::data_path::SessionDataPath;
    use super::*;
    use crate::engine::cm::CmConfig;
    use crate::engine::memory::VecMemory;
    use crate::engine::requests::CmResponse;
    use crate::engine::transport_seam::ConnId;
    use crate::engine::verbs::{Access, CompletionOp, QueuePairConfig, RemoteBuffer, Sge, Stag, WorkRequest};
    use std::sync::atomic::{AtomicBool, AtomicU64};

    /// A session's client state with an in-process data path and no daemon behind it.
    fn inner() -> (Arc<Inner>, Arc<InProcessDataPath>) {
        let adapter = CmConfig::default_siw_compatible().adapter;
        let local = Arc::new(InProcessDataPath::new(adapter.clone(), SessionId(1)));
        let (writer, rx) = tokio::sync::mpsc::unbounded_channel();
        std::mem::forget(rx); // requests to the daemon go nowhere
        let inner = Arc::new(Inner {
            writer,
            cqs: Mutex::default(),
            pending: Mutex::default(),
            next_id: AtomicU64::new(1),
            gone: AtomicBool::new(false),
            gone_notify: tokio::sync::Notify::new(),
            runtime: None,
            info: adapter,
            session: SessionId(1),
            data_path: SessionDataPath::in_process(local.clone()),
            handed: Mutex::default(),
            srq_handlers: Mutex::default(),
            qp_handlers: Mutex::default(),
        });
        (inner, local)
    }

    /// A queue pair streaming many large Writes into a peer, through full socket buffers and both deadlines
    /// of a first-FPDU hold that end mid-stream: every Write completes and every byte reaches the peer, at
    /// its tagged offset. (The hold's second deadline once flushed after pumping: a flush that drained the
    /// output left the woken queue pair with nothing to pump it, and the stream stalled mid-message.) Over
    /// the client's own shared memory the payloads are sent in place (gathered writes, partial ones
    /// included); over memory that cannot be, they are copied.
    #[tokio::test]
    async fn large_writes_stream_through_full_sockets_and_the_first_fpdu_hold() {
        for (hold_us, slow_start, in_place) in
            [(3_000, true, true), (30_000, false, true), (60_000, false, false)]
        {
            stream_writes(hold_us, slow_start, in_place).await;
        }
    }

    /// The byte at `offset` of the source region.
    fn pattern(offset: usize) -> u8 {
        (offset % 251) as u8
    }

    /// A connected queue pair of a session with no daemon behind it, over a loopback TCP connection whose
    /// far end (returned) is the test's; its CQ, and a `LEN`-byte region holding `pattern`, in the client's
    /// shared memory (`in_place`) or in memory that cannot be sent in place.
    struct Rig {
        inner: Arc<Inner>,
        local: Arc<InProcessDataPath>,
        state: Arc<super::super::completions::CqState>,
        qp: QueuePairId,
        stag: Stag,
        connector: ConnectorId,
        peer: TcpStream,
    }

    async fn rig(len: usize, hold_us: u64, in_place: bool, small_buffers: bool) -> Rig {
        let (inner, local) = inner();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        if small_buffers {
            socket2::SockRef::from(&listener)
                .set_recv_buffer_size(4096)
                .unwrap();
        }
        let ours = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        if small_buffers {
            socket2::SockRef::from(&ours).set_send_buffer_size(4096).unwrap();
        }
        let (peer, _) = listener.accept().await.unwrap();
        let connector = ConnectorId(7);
        let state = Arc::new(super::super::completions::CqState::default());
        let (cq, qp, stag) = local.with(&inner, |dp, s| {
            let CmResponse::CompletionQueue(cq) = dp.create_cq(s, 64).unwrap() else {
                panic!()
            };
            let config = QueuePairConfig {
                send_cq: cq,
                receive_cq: cq,
                send_depth: 64,
                receive_depth: 4,
                max_send_sge: 1,
                max_receive_sge: 1,
                pd: crate::engine::ids::PdId(0),
            };
            let CmResponse::QueuePair(qp) = dp.create_qp(s, config).unwrap() else {
                panic!()
            };
            let bytes: Vec<u8> = (0..len).map(pattern).collect();
            let memory: Box<dyn crate::engine::memory::RegionMemory> = if in_place {
                let shm = crate::shm::SharedMemory::create("soft-rdma-test", len).unwrap();
                shm.write_at(0, &bytes).unwrap();
                let shm = Arc::new(shm);
                assert!(crate::engine::memory::RegionMemory::pinned(&shm).is_some());
                Box::new(shm)
            } else {
                let v = VecMemory::new(len);
                v.fill_at(0, &bytes);
                Box::new(v)
            };
            let CmResponse::MemoryRegion { stag, .. } = dp
                .register_memory(s.into(), memory, Access::LOCAL_WRITE | Access::REMOTE_READ, 0)
                .unwrap()
            else {
                panic!()
            };
            dp.attach(qp, connector);
            (cq, qp, stag)
        });
        inner.cqs.lock().unwrap().insert(cq, state.clone());
        let hand_off = HandOff {
            conn: ConnId(1),
            crc: false,
            max_ulpdu: 1448,
            max_inbound_ulpdu: 65535,
            ird: 4,
            ord: 4,
            send_rtr: None,
            awaiting_rtr: false,
            tx_held: false,
            first_fpdu_hold_us: hold_us,
            fin_hold_us: hold_us,
            received: Bytes::new(),
        };
        local.adopt_stream(&inner, connector, hand_off, ours).unwrap();
        Rig {
            inner,
            local,
            state,
            qp,
            stag,
            connector,
            peer,
        }
    }

    /// A Write of all of `len` bytes of the region.
    fn write_wr(id: u64, stag: Stag, len: usize) -> WorkRequest {
        WorkRequest::Write {
            id,
            sgl: vec![Sge {
                stag,
                offset: 0,
                length: len as u32,
            }],
            remote: RemoteBuffer {
                stag: Stag(0x100),
                offset: 0,
            },
            silent: false,
        }
    }

    /// Closing a queue pair while its connection still holds completions of Writes sent in place (the peer
    /// reads nothing, so the small socket buffers stay full): every Write completes exactly once, in posting
    /// order, those handed to the connection with success before the rest with CANCELED.
    #[tokio::test]
    async fn closing_a_queue_pair_completes_held_writes_before_the_flush() {
        const LEN: usize = 16 << 10;
        const N: u64 = 64;
        let r = rig(LEN, 0, true, true).await;
        r.local
            .post(&r.inner, r.qp, (0..N).map(|i| write_wr(i, r.stag, LEN)).collect())
            .unwrap();
        let held = {
            let st = r.local.state.lock().unwrap();
            st.conns[&r.connector].out.held()
        };
        assert!(
            held > 0,
            "the connection holds completions of Writes not yet in the socket"
        );
        // Let the socket fill (nothing reads it): some Writes are in it, one chunk's completions are held.
        tokio::time::sleep(Duration::from_millis(50)).await;
        r.local.close_qp(&r.inner, r.qp);
        let mut got = Vec::new();
        while got.len() < N as usize {
            let notified = r.state.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            got.extend(r.state.queue.lock().unwrap().drain(..));
            if got.len() < N as usize {
                tokio::time::timeout(Duration::from_secs(20), notified)
                    .await
                    .expect("every Write completes");
            }
        }
        assert_eq!(
            got.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
            (0..N).collect::<Vec<_>>()
        );
        let ok = got.iter().take_while(|c| c.status == NdStatus::Success).count();
        assert!(
            ok > 0 && ok < N as usize,
            "{ok} of {N} succeeded: the test needs both kinds"
        );
        assert!(
            got[ok..].iter().all(|c| c.status == NdStatus::Canceled),
            "after the first CANCELED, only CANCELED: {:?}",
            got.iter().map(|c| c.status).collect::<Vec<_>>()
        );
        drop(r.peer);
    }

    /// A connection whose runtime is blocked still answers the peer's Read: the peer (a thread of its own)
    /// sends a Read Request for the whole region while this test's only runtime thread blocks on a channel
    /// that the peer feeds only once the last byte of the Read Response arrived. Without the progress
    /// thread the runtime never runs again and the hang guard fails the test.
    #[tokio::test]
    async fn a_blocked_runtime_still_answers_a_peers_read() {
        use crate::engine::framing::{fpdu, parse_message, take_frame};
        use soft_rdma_common::wire::ddp::{Placement, QN_READ_REQUEST};
        use soft_rdma_common::wire::rdmap::{MessageRepr, RdmapOpcode};
        use soft_rdma_common::wire::read_request::ReadRequestRepr;
        use std::io::{Read, Write};
        const LEN: usize = 1 << 20;
        let r = rig(LEN, 0, true, false).await;
        let mut peer = r.peer.into_std().unwrap();
        peer.set_nonblocking(false).unwrap();
        let source_stag = r.stag.0;
        let (done, answered) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut body = [0u8; 28];
            let rr = ReadRequestRepr {
                sink_stag: 0x4400,
                sink_offset: 0,
                read_size: LEN as u32,
                source_stag,
                source_offset: 0,
            };
            rr.emit(&mut body).unwrap();
            let msg = MessageRepr {
                opcode: RdmapOpcode::RdmaReadRequest,
                last: true,
                placement: Placement::Untagged {
                    queue: QN_READ_REQUEST,
                    msn: 1,
                    offset: 0,
                    ulp_field: 0,
                },
                payload: &body,
            };
            peer.write_all(&fpdu(&msg, false).unwrap()).unwrap();
            let mut rx = bytes::BytesMut::new();
            let mut placed = 0usize;
            let mut buf = vec![0u8; 64 << 10];
            while placed < LEN {
                let n = peer.read(&mut buf).unwrap();
                assert!(
                    n > 0,
                    "the connection ended after {placed} bytes of the Read Response"
                );
                rx.extend_from_slice(&buf[..n]);
                while let Some(frame) = take_frame(&mut rx, 65535, false).unwrap() {
                    let msg = parse_message(&frame, 65535).unwrap();
                    assert_eq!(msg.opcode, RdmapOpcode::RdmaReadResponse);
                    let Placement::Tagged { stag, offset } = msg.placement else {
                        panic!("a Read Response is tagged")
                    };
                    assert_eq!(stag, 0x4400);
                    for (i, b) in msg.payload.iter().enumerate() {
                        assert_eq!(*b, pattern(offset as usize + i), "byte {}", offset as usize + i);
                    }
                    placed += msg.payload.len();
                }
            }
            done.send(placed).unwrap();
            peer
        });
        // This runtime's only thread blocks here: nothing of it runs until the peer has its answer.
        let placed = answered
            .recv_timeout(Duration::from_secs(60))
            .expect("the Read was answered while the runtime was blocked");
        assert_eq!(placed, LEN);
        drop(reader.join().unwrap());
        drop((r.inner, r.local));
    }

    async fn stream_writes(hold_us: u64, slow_start: bool, in_place: bool) {
        const LEN: usize = 4 << 20;
        const N: u64 = 24;
        let Rig {
            inner,
            local,
            state,
            qp,
            stag,
            connector,
            mut peer,
        } = rig(LEN, hold_us, in_place, false).await;
        // The peer reads everything, slowly at first, so that the socket's buffers fill, and checks every
        // Write segment's payload against the source at its tagged offset.
        let reader = tokio::spawn(async move {
            use crate::engine::framing::{parse_message, take_frame};
            use soft_rdma_common::wire::ddp::Placement;
            use tokio::io::AsyncReadExt;
            let (mut total, mut placed) = (0usize, 0usize);
            let mut rx = bytes::BytesMut::with_capacity(256 * 1024);
            loop {
                if slow_start && total < 8 << 20 {
                    tokio::time::sleep(Duration::from_micros(200)).await;
                }
                match peer.read_buf(&mut rx).await {
                    Ok(0) | Err(_) => return (total, placed),
                    Ok(n) => total += n,
                }
                while let Some(frame) = take_frame(&mut rx, 65535, false).unwrap() {
                    let msg = parse_message(&frame, 65535).unwrap();
                    let Placement::Tagged { offset, .. } = msg.placement else {
                        panic!("only Writes are sent")
                    };
                    for (i, b) in msg.payload.iter().enumerate() {
                        assert_eq!(
                            *b,
                            pattern(offset as usize + i),
                            "byte {} of a Write",
                            offset as usize + i
                        );
                    }
                    placed += msg.payload.len();
                }
                rx.reserve(64 * 1024);
            }
        });
        local
            .post(&inner, qp, (0..N).map(|i| write_wr(i, stag, LEN)).collect())
            .unwrap();
        let mut done = 0;
        while done < N {
            let notified = state.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let got = state.queue.lock().unwrap().drain(..).collect::<Vec<_>>();
            for c in &got {
                assert_eq!((c.op, c.status), (CompletionOp::Write, NdStatus::Success));
            }
            done += got.len() as u64;
            if done < N {
                tokio::time::timeout(Duration::from_secs(20), notified)
                    .await
                    .unwrap_or_else(|_| panic!("hold {hold_us} µs: stalled after {done} of {N} Writes"));
            }
        }
        assert!(
            local.close_connector(&inner, connector),
            "the connection ends gracefully"
        );
        let (total, placed) = tokio::time::timeout(Duration::from_secs(20), reader)
            .await
            .unwrap()
            .unwrap();
        assert!(total >= N as usize * LEN, "the peer read {total} bytes");
        assert_eq!(placed, N as usize * LEN, "every payload byte, once");
    }
}
