//! One TCP connection's state machine (RFC 9293 §3.3.2 states, §3.10 event processing) and its output
//! (data, retransmissions, pacing, ACKs). Its timers are in `timers.rs`, segment arrival in
//! `segment_arrival.rs` (both submodules of this one).
//!
//! Driving it: feed each arriving segment to [`Connection::on_segment`]; after that, after `send`, `recv`,
//! `close`, and whenever the time reaches [`Connection::poll_at`], call [`Connection::poll_transmit`] until
//! it returns `None`.

use std::time::Duration;

use super::budget::BufferPools;
use super::congestion::Controller;
use super::rack::Rack;
use super::recovery::{Phase, Recovery};
use super::recv_buffer::RecvBuffer;
use super::rtt::RttEstimator;
use super::send_buffer::SendBuffer;
use super::seq::Seq;
use super::wire::{TcpFlags, TcpHeader, TcpOptions};
use super::{Events, Instant, TcpConfig, TcpCounters};
use crate::error::{NdStatus, Result, err};

/// RFC 9293 §3.3.2 connection states (LISTEN is the driver's: it calls [`Connection::accept`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    SynSent,
    SynReceived,
    Established,
    FinWait1,
    FinWait2,
    CloseWait,
    Closing,
    LastAck,
    TimeWait,
    Closed,
}

impl State {
    /// The state's name as RFC 9293 §3.3.2 writes it ("ESTABLISHED", "TIME-WAIT"…), for `status`.
    pub fn name(self) -> &'static str {
        match self {
            State::SynSent => "SYN-SENT",
            State::SynReceived => "SYN-RECEIVED",
            State::Established => "ESTABLISHED",
            State::FinWait1 => "FIN-WAIT-1",
            State::FinWait2 => "FIN-WAIT-2",
            State::CloseWait => "CLOSE-WAIT",
            State::Closing => "CLOSING",
            State::LastAck => "LAST-ACK",
            State::TimeWait => "TIME-WAIT",
            State::Closed => "CLOSED",
        }
    }
}

/// RFC 9293 §3.7.1: the send MSS when the peer sent no MSS option.
const DEFAULT_PEER_MSS: u32 = 536;
/// Bytes of a timestamp option with its padding (RFC 7323 §3.2), taken from each segment's payload.
const TIMESTAMP_OPTION_LEN: u32 = 12;
/// RFC 7323 §2.3: the largest shift.
const MAX_WINDOW_SCALE: u8 = 14;

/// How long both buffers stay empty before their memory is given back (`ring.rs`).
const IDLE_RELEASE: Duration = Duration::from_secs(1);

/// Largest DupThresh reordering can raise it to.
const MAX_REORDERING: u32 = 64;

/// What undoing a recovery episode needs (RFC 3522 §3.2 detection, RFC 4015 §3 response).
#[derive(Clone, Copy, Debug)]
pub(super) struct Undo {
    /// The first retransmitted sequence number.
    pub(super) seq: Seq,
    /// TSval of its retransmission: an ACK echoing an older one acknowledges the original.
    pub(super) ts: u32,
    pub(super) cwnd: u32,
    pub(super) ssthresh: u32,
    /// How many segments beyond the "lost" one had been SACKed: the reordering seen, if spurious.
    pub(super) distance: u32,
}

/// A one-off segment to send outside the data path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Probe {
    /// RFC 9293 §3.8.4: SEG.SEQ = SND.UNA − 1, no data, to elicit an ACK.
    Keepalive,
    /// RFC 9293 §3.8.6.1: one octet past a zero window.
    ZeroWindow,
    /// RFC 8985 §7.3: new data if possible, else the last segment again.
    TailLoss,
    /// A loss recovery that stalled (`timers.rs`, `schedule_tlp`): the first un-SACKed segment again.
    StalledRecovery,
}

/// One connection. See the module doc.
#[derive(Debug)]
pub struct Connection {
    cfg: TcpConfig,
    state: State,
    local_port: u16,
    remote_port: u16,

    // Send sequence space (RFC 9293 §3.3.1).
    iss: Seq,
    snd_una: Seq,
    snd_nxt: Seq,
    snd_wnd: u32,
    snd_wl1: Seq,
    snd_wl2: Seq,
    max_snd_wnd: u32,
    snd_wscale: u8,
    /// Payload bytes per segment: the peer's MSS, ours, less the timestamp option (RFC 9293 §3.7.1).
    send_mss: u32,
    send_buf: SendBuffer,
    /// Sequence number of `send_buf`'s first byte.
    buf_seq: Seq,
    /// The application closed: FIN follows the last queued byte.
    fin_queued: bool,
    /// The SYN (or SYN-ACK) is to be (re)sent.
    syn_pending: bool,

    // Receive sequence space.
    irs: Seq,
    rcv_nxt: Seq,
    rcv_wscale: u8,
    recv_buf: RecvBuffer,
    /// Right edge of the last window advertised (RCV.NXT until one was).
    rcv_right: Seq,
    /// The last window advertised was held down by the daemon's buffer budget (`budget.rs`).
    recv_memory_limited: bool,
    /// The last `send` took fewer bytes than the buffer had room for: the budget gave no memory.
    send_memory_limited: bool,
    fin_received: bool,
    /// A FIN that arrived ahead of missing data: its sequence number.
    pending_fin: Option<Seq>,

    // Options in force (RFC 7323, RFC 2018).
    timestamps: bool,
    sack: bool,
    ts_offset: u32,
    ts_recent: u32,
    last_ack_sent: Seq,

    // Timers.
    rtt: RttEstimator,
    rto_at: Option<Instant>,
    tlp_at: Option<Instant>,
    tlp_outstanding: bool,
    persist_at: Option<Instant>,
    delack_at: Option<Instant>,
    keepalive_at: Option<Instant>,
    keepalive_unanswered: u32,
    close_at: Option<Instant>,
    /// When the empty buffers' memory is given back.
    release_at: Option<Instant>,
    /// The user timeout's deadline (`TcpConfig::user_timeout`), from the first timeout in a row.
    give_up_at: Option<Instant>,
    /// Karn's algorithm without timestamps (RFC 6298 §3): the segment being timed.
    rtt_probe: Option<(Seq, Instant)>,
    timeouts_in_row: u32,
    last_send: Instant,

    cc: Controller,
    rec: Recovery,
    /// Bytes delivered so far: cumulatively acknowledged or SACKed (the delivery-rate model's count).
    delivered: u64,
    /// The RTT measured by the ACK being processed.
    ack_rtt: Option<Duration>,
    /// Pacing (`pacing_allows`): bytes that may leave now, when the last refill happened, and when
    /// a paced segment may leave next.
    pace_tokens: i64,
    pace_last: Instant,
    pacing_at: Option<Instant>,
    /// After a fast-recovery or timeout episode, SND.UNA must pass this before the next fast retransmit
    /// (RFC 6582 §3.2 step 1, RFC 6675 §5).
    high_recover: Seq,
    /// RACK (RFC 8985 §6, `rack.rs`): every segment in flight with its latest transmission time.
    rack: Rack,
    /// The RACK reordering timer (RFC 8985 §6.3).
    rack_at: Option<Instant>,
    /// A duplicate segment arrived: the D-SACK block (RFC 2883 §4) for the next ACK.
    dsack: Option<(Seq, Seq)>,
    /// DupThresh in force, raised when a fast retransmit turns out spurious.
    reordering: u32,
    undo: Option<Undo>,
    /// The recovery point of the episode whose rescue retransmission was sent (RFC 6675 §4 RescueRxt).
    rescue_done_for: Option<Seq>,

    // Pending output.
    ack_now: bool,
    segments_since_ack: u32,
    rst_pending: Option<(Seq, Option<Seq>)>,
    probe: Option<Probe>,
    challenge_window: Instant,
    challenges_in_window: u32,

    events: Events,
    counters: TcpCounters,
}

/// The RST answering a segment that matches no connection (RFC 9293 §3.10.7.1); `None` for an RST.
pub fn reset_for_unknown(segment: &TcpHeader, payload_len: usize) -> Option<TcpHeader> {
    if segment.flags.rst() {
        return None;
    }
    let mut h = TcpHeader {
        src_port: segment.dst_port,
        dst_port: segment.src_port,
        ..Default::default()
    };
    if segment.flags.ack() {
        h.seq = segment.ack;
        h.flags = TcpFlags(TcpFlags::RST);
    } else {
        let len = payload_len as u32 + u32::from(segment.flags.syn()) + u32::from(segment.flags.fin());
        h.ack = segment.seq + len;
        h.flags = TcpFlags(TcpFlags::RST | TcpFlags::ACK);
    }
    Some(h)
}

fn window_scale_for(buffer: usize) -> u8 {
    let mut shift = 0;
    while shift < MAX_WINDOW_SCALE && (buffer >> shift) > 0xffff {
        shift += 1;
    }
    shift
}

impl Connection {
    /// The window-scale shift this end offers with `cfg` (RFC 7323 §2.3: the smallest that covers the
    /// receive buffer).
    pub fn window_scale_of(cfg: &TcpConfig) -> u8 {
        window_scale_for(cfg.recv_buffer)
    }

    fn new(
        cfg: &TcpConfig,
        local_port: u16,
        remote_port: u16,
        isn: u32,
        ts_offset: u32,
        now: Instant,
    ) -> Self {
        let iss = Seq(isn);
        let send_mss = u32::from(cfg.mss).max(64);
        Connection {
            cfg: *cfg,
            state: State::Closed,
            local_port,
            remote_port,
            iss,
            snd_una: iss,
            snd_nxt: iss,
            snd_wnd: 0,
            snd_wl1: Seq(0),
            snd_wl2: iss,
            max_snd_wnd: 0,
            snd_wscale: 0,
            send_mss,
            send_buf: SendBuffer::new(cfg.send_buffer),
            buf_seq: iss + 1,
            fin_queued: false,
            syn_pending: true,
            irs: Seq(0),
            rcv_nxt: Seq(0),
            rcv_wscale: if cfg.window_scaling {
                window_scale_for(cfg.recv_buffer)
            } else {
                0
            },
            recv_buf: RecvBuffer::new(cfg.recv_buffer, cfg.max_ranges),
            rcv_right: Seq(0),
            recv_memory_limited: false,
            send_memory_limited: false,
            fin_received: false,
            pending_fin: None,
            timestamps: cfg.timestamps,
            sack: cfg.sack,
            ts_offset,
            ts_recent: 0,
            last_ack_sent: Seq(0),
            rtt: RttEstimator::new(cfg.rto_initial, cfg.rto_min, cfg.rto_max),
            rto_at: None,
            tlp_at: None,
            tlp_outstanding: false,
            persist_at: None,
            delack_at: None,
            keepalive_at: None,
            keepalive_unanswered: 0,
            close_at: None,
            release_at: None,
            give_up_at: None,
            rtt_probe: None,
            timeouts_in_row: 0,
            last_send: now,
            cc: Controller::new(cfg.congestion, send_mss, cfg.initial_window_segments, now),
            delivered: 0,
            ack_rtt: None,
            pace_tokens: i64::from(send_mss.saturating_mul(cfg.initial_window_segments.max(1))),
            pace_last: now,
            pacing_at: None,
            rec: Recovery::new(cfg.max_ranges, iss),
            high_recover: iss,
            rescue_done_for: None,
            reordering: 3,
            rack: Rack::new(iss),
            rack_at: None,
            dsack: None,
            undo: None,
            ack_now: false,
            segments_since_ack: 0,
            rst_pending: None,
            probe: None,
            challenge_window: now,
            challenges_in_window: 0,
            events: Events::empty(),
            counters: TcpCounters::default(),
        }
    }

    /// Active open (RFC 9293 §3.10.1): the connection starts in SYN-SENT and its first `poll_transmit`
    /// is the SYN. `isn` is the initial sequence number (RFC 9293 §3.4.1: the caller draws it, e.g. per
    /// RFC 6528), `ts_offset` a random offset for the timestamp clock (RFC 7323 §5.4).
    pub fn connect(
        cfg: &TcpConfig,
        local_port: u16,
        remote_port: u16,
        isn: u32,
        ts_offset: u32,
        now: Instant,
    ) -> Self {
        let mut c = Connection::new(cfg, local_port, remote_port, isn, ts_offset, now);
        c.state = State::SynSent;
        c
    }

    /// Passive open: a SYN arrived for a listening port (RFC 9293 §3.10.7.2). Returns the connection in
    /// SYN-RECEIVED (its first `poll_transmit` is the SYN-ACK), or `None` when the segment does not open
    /// one (an RST is ignored; an ACK or a segment without SYN gets [`reset_for_unknown`] from the driver).
    pub fn accept(cfg: &TcpConfig, syn: &TcpHeader, isn: u32, ts_offset: u32, now: Instant) -> Option<Self> {
        if syn.flags.rst() || syn.flags.ack() || !syn.flags.syn() {
            return None;
        }
        let mut c = Connection::new(cfg, syn.dst_port, syn.src_port, isn, ts_offset, now);
        c.state = State::SynReceived;
        c.irs = syn.seq;
        c.rcv_nxt = syn.seq + 1;
        c.rcv_right = c.rcv_nxt;
        c.negotiate(&syn.options, now);
        c.snd_wnd = u32::from(syn.window);
        c.max_snd_wnd = c.snd_wnd;
        c.snd_wl1 = syn.seq;
        c.keepalive_at = None;
        Some(c)
    }

    /// Passive open from a SYN cookie (RFC 4987 §3.6, `soft_rdma_common::syn_cookie`): the XDP program
    /// answered the peer's SYN with a SYN-ACK whose ISN is `ack.ack - 1` and whose TSval the ACK echoes;
    /// `peer` are the SYN's options the cookie carried, `syn_ack_window` the window it advertised. Returns
    /// the connection in SYN-RECEIVED with that SYN-ACK counted as sent now, ready to be fed `ack` (which
    /// completes the handshake); `None` if `ack` has no timestamp option.
    ///
    /// The timestamp clock continues from the echoed TSval, so the peer's PAWS check (RFC 7323 §5.3) never
    /// sees it go back.
    pub fn accept_cookie(
        cfg: &TcpConfig,
        ack: &TcpHeader,
        peer: soft_rdma_common::syn_cookie::PeerSynOptions,
        syn_ack_window: u16,
        now: Instant,
    ) -> Option<Self> {
        let (tsval, tsecr) = ack.options.timestamp?;
        let syn = TcpHeader {
            src_port: ack.src_port,
            dst_port: ack.dst_port,
            seq: ack.seq - 1,
            flags: TcpFlags(TcpFlags::SYN),
            options: TcpOptions {
                mss: Some(peer.mss),
                window_scale: peer.window_scale,
                sack_permitted: peer.sack_permitted,
                timestamp: Some((tsval, 0)),
                ..Default::default()
            },
            ..Default::default()
        };
        let ts_offset = tsecr.wrapping_sub((now.micros() / 1000) as u32);
        let mut c = Connection::accept(cfg, &syn, (ack.ack - 1).0, ts_offset, now)?;
        // The SYN-ACK the program sent: as if this end had sent it now (its sequence number, its timer).
        c.poll_transmit(now, &mut [])?;
        let promised = c.rcv_nxt + u32::from(syn_ack_window);
        if promised > c.rcv_right {
            c.rcv_right = promised;
        }
        Some(c)
    }

    /// Options of the peer's SYN (RFC 9293 §3.7.1 MSS, RFC 7323 §2.2 and §3.2, RFC 2018 §2): each is in
    /// force only if both SYNs carried it.
    fn negotiate(&mut self, o: &TcpOptions, now: Instant) {
        match o.window_scale {
            Some(shift) if self.cfg.window_scaling => self.snd_wscale = shift.min(MAX_WINDOW_SCALE),
            _ => {
                self.snd_wscale = 0;
                self.rcv_wscale = 0;
            }
        }
        self.timestamps = self.cfg.timestamps && o.timestamp.is_some();
        if let (true, Some((val, _))) = (self.timestamps, o.timestamp) {
            self.ts_recent = val;
        }
        self.sack = self.cfg.sack && o.sack_permitted;
        let peer_mss = o.mss.map_or(DEFAULT_PEER_MSS, u32::from);
        let overhead = if self.timestamps { TIMESTAMP_OPTION_LEN } else { 0 };
        self.send_mss = (peer_mss.min(u32::from(self.cfg.mss)).saturating_sub(overhead)).max(64);
        self.cc = Controller::new(
            self.cfg.congestion,
            self.send_mss,
            self.cfg.initial_window_segments,
            now,
        );
        self.pace_tokens = i64::from(
            self.send_mss
                .saturating_mul(self.cfg.initial_window_segments.max(1)),
        );
        self.pace_last = now;
    }

    pub fn state(&self) -> State {
        self.state
    }

    pub fn counters(&self) -> &TcpCounters {
        &self.counters
    }

    pub fn local_port(&self) -> u16 {
        self.local_port
    }

    pub fn remote_port(&self) -> u16 {
        self.remote_port
    }

    /// DupThresh in force (3 until reordering was seen).
    pub fn reordering(&self) -> u32 {
        self.reordering
    }

    /// RACK's reordering-window multiplier (RFC 8985 §6.2 step 4).
    #[cfg(test)]
    pub(super) fn reo_wnd_mult(&self) -> u32 {
        self.rack.reo_wnd_mult()
    }

    /// Payload bytes per segment in force.
    pub fn send_mss(&self) -> u32 {
        self.send_mss
    }

    /// Negotiated (window scaling shifts: ours, the peer's; timestamps; SACK).
    pub fn negotiated(&self) -> ((u8, u8), bool, bool) {
        ((self.rcv_wscale, self.snd_wscale), self.timestamps, self.sack)
    }

    pub fn congestion_window(&self) -> u32 {
        self.cc.cwnd()
    }

    pub fn slow_start_threshold(&self) -> u32 {
        self.cc.ssthresh()
    }

    /// Retransmission-timer expiries since the last RTT sample (RFC 6298 §5.5 doublings).
    pub fn rto_backoff(&self) -> u32 {
        self.rtt.backoff()
    }

    /// The current RTO, backoff included.
    pub fn rto(&self) -> Duration {
        self.rtt.rto()
    }

    pub fn smoothed_rtt(&self) -> Option<Duration> {
        self.rtt.srtt()
    }

    #[cfg(test)]
    pub(super) fn trace(&self) -> String {
        format!(
            "una={} nxt-una={} buf={} wnd={} cwnd={} pipe={} phase={:?} cc={:?} tokens={} pacing_at={:?}",
            self.snd_una.0,
            self.snd_nxt.bytes_since(self.snd_una),
            self.send_buf.len(),
            self.snd_wnd,
            self.cc.cwnd(),
            self.pipe(),
            self.rec.phase,
            self.cc,
            self.pace_tokens,
            self.pacing_at
        )
    }

    /// Events since the last call.
    pub fn take_events(&mut self) -> Events {
        std::mem::take(&mut self.events)
    }

    /// Bytes of buffer memory held (send and receive).
    pub fn buffer_memory(&self) -> usize {
        self.send_buf.allocated() + self.recv_buf.allocated()
    }

    /// Charge both buffers' memory to the daemon's `budget` from now on (`budget.rs`): past its bound,
    /// `send` takes fewer bytes and the window offered shrinks.
    pub fn set_budget(&mut self, pools: &BufferPools) {
        self.send_buf.set_budget(pools.send.clone());
        self.recv_buf.set_budget(pools.receive.clone());
    }

    /// The budget held this connection down (its last window, or its last `send`): it wants
    /// [`Self::memory_freed`] when memory is given back.
    pub fn memory_limited(&self) -> bool {
        self.recv_memory_limited || self.send_memory_limited
    }

    /// Memory was given back to the budget: a send cut short may go on (WRITABLE), and a window held
    /// down that can now open by a significant amount is announced at once (a window update, RFC 9293
    /// §3.8.6.2.2) rather than when the peer's next zero-window probe asks.
    pub fn memory_freed(&mut self) {
        if std::mem::take(&mut self.send_memory_limited) {
            self.events |= Events::WRITABLE;
        }
        if self.fin_received {
            // Nothing more will arrive.
            self.recv_memory_limited = false;
        } else if self.recv_memory_limited && self.is_synchronized() {
            // The flag stays until the next advertisement (`sent`) says whether the window is still held
            // down.
            let right = self.rcv_nxt + self.advertised_bytes();
            let threshold =
                (self.recv_buf.capacity() as u32 / 2).min(self.send_mss.max(u32::from(self.cfg.mss)));
            if right > self.rcv_right && right.bytes_since(self.rcv_right) >= threshold {
                self.ack_now = true;
            }
        }
    }

    /// Bytes queued and not yet acknowledged.
    pub fn send_queue_len(&self) -> usize {
        self.send_buf.len()
    }

    pub fn send_capacity_free(&self) -> usize {
        self.send_buf.free()
    }

    /// The peer's FIN arrived and every byte before it was read.
    pub fn is_read_closed(&self) -> bool {
        self.fin_received && self.recv_buf.readable() == 0
    }

    /// Queue bytes to send (RFC 9293 §3.10.2); returns how many fit. Refused after `close` or once the
    /// connection is closing or closed.
    pub fn send(&mut self, data: &[u8]) -> Result<usize> {
        match self.state {
            State::SynSent | State::SynReceived | State::Established | State::CloseWait
                if !self.fin_queued =>
            {
                let n = self.send_buf.push(data);
                self.send_memory_limited = n < data.len().min(self.send_buf.free() + n);
                Ok(n)
            }
            _ => err(
                NdStatus::ConnectionInvalid,
                "TCP connection is closing or closed: nothing more can be sent",
            ),
        }
    }

    /// Read in-order bytes (RFC 9293 §3.10.3); returns how many. Opening the window by a significant
    /// amount schedules a window update (RFC 9293 §3.8.6.2.2, receiver-side SWS avoidance).
    pub fn recv(&mut self, out: &mut [u8]) -> usize {
        let n = self.recv_buf.read(out);
        if n > 0 && !self.fin_received && self.is_synchronized() {
            let right = self.rcv_nxt + self.advertised_bytes();
            let threshold =
                (self.recv_buf.capacity() as u32 / 2).min(self.send_mss.max(u32::from(self.cfg.mss)));
            if right.bytes_since(self.rcv_right) >= threshold {
                self.ack_now = true;
            }
        }
        n
    }

    /// Bytes ready to read.
    pub fn readable(&self) -> usize {
        self.recv_buf.readable()
    }

    /// Orderly close (RFC 9293 §3.10.4): FIN after the queued bytes.
    pub fn close(&mut self) {
        match self.state {
            State::SynSent => self.enter_closed(Events::CLOSED),
            State::SynReceived => self.fin_queued = true,
            State::Established => {
                self.fin_queued = true;
                self.state = State::FinWait1;
            }
            State::CloseWait => {
                self.fin_queued = true;
                self.state = State::LastAck;
            }
            _ => {}
        }
    }

    /// Abort (RFC 9293 §3.10.5): RST <SEQ=SND.NXT> if synchronized, then CLOSED.
    pub fn abort(&mut self) {
        if self.is_synchronized() || self.state == State::SynReceived {
            self.rst_pending = Some((self.snd_nxt, None));
        }
        self.enter_closed(Events::CLOSED);
    }

    fn is_synchronized(&self) -> bool {
        !matches!(self.state, State::SynSent | State::SynReceived | State::Closed)
    }

    /// States in which data and FIN are (re)transmitted.
    fn sends_data(&self) -> bool {
        matches!(
            self.state,
            State::Established | State::CloseWait | State::FinWait1 | State::Closing | State::LastAck
        )
    }

    fn enter_closed(&mut self, why: Events) {
        self.state = State::Closed;
        self.events |= why;
        self.rto_at = None;
        self.tlp_at = None;
        self.rack_at = None;
        self.persist_at = None;
        self.delack_at = None;
        self.keepalive_at = None;
        self.close_at = None;
        self.pacing_at = None;
        self.release_at = None;
        self.give_up_at = None;
        self.send_buf.release_if_empty();
        self.recv_buf.release_if_empty();
        self.probe = None;
        self.ack_now = false;
        self.syn_pending = false;
    }

    fn enter_time_wait(&mut self, now: Instant) {
        self.state = State::TimeWait;
        self.rto_at = None;
        self.tlp_at = None;
        self.rack_at = None;
        self.persist_at = None;
        self.keepalive_at = None;
        self.close_at = Some(now + self.cfg.time_wait);
    }

    fn timed_out(&mut self) {
        if self.is_synchronized() {
            self.rst_pending = Some((self.snd_nxt, Some(self.rcv_nxt)));
        }
        self.enter_closed(Events::TIMED_OUT);
    }

    /// The earliest time `poll_transmit` has timer work to do (output that is due now is found by calling
    /// `poll_transmit` after each input).
    pub fn poll_at(&self) -> Option<Instant> {
        [
            self.rto_at,
            self.tlp_at,
            self.rack_at,
            self.persist_at,
            self.delack_at,
            self.keepalive_at,
            self.close_at,
            self.pacing_at,
            self.release_at,
            self.give_up_at,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn data_end(&self) -> Seq {
        self.buf_seq + self.send_buf.len() as u32
    }

    fn ts_now(&self, now: Instant) -> u32 {
        ((now.micros() / 1000) as u32).wrapping_add(self.ts_offset)
    }

    /// RCV.WND (RFC 9293 §3.3.1): the buffer's free space, as far as the memory held and the daemon's
    /// budget can store it; but never less than the window already advertised, whose right edge does not
    /// move back (RFC 9293 §3.8.6, SHLD-14: a segment the budget then cannot store is dropped
    /// unacknowledged, as the RFC allows, and retransmitted by the peer).
    pub(super) fn rcv_wnd(&self) -> u32 {
        let offered = self.recv_buf.memory_window() as u32;
        let promised = if self.rcv_right > self.rcv_nxt {
            self.rcv_right.bytes_since(self.rcv_nxt)
        } else {
            0
        };
        offered.max(promised).min(self.recv_buf.window() as u32)
    }

    fn advertised_bytes(&self) -> u32 {
        u32::from(self.window_field()) << self.rcv_wscale
    }

    /// The window field of a segment after the SYN: RCV.WND in units of 2^shift (RFC 7323 §2.3), rounded
    /// down; but never short of the right edge already advertised (RFC 7323 §2.4, RFC 9293 §3.8.6), which
    /// is then rounded up to the next unit, as Linux's `tcp_select_window` does (`ALIGN(cur_win, 1 <<
    /// rcv_wscale)`). The few bytes offered past the buffer's free space that way are trimmed off if they
    /// come (segment_arrival.rs) and resent by the peer.
    fn window_field(&self) -> u16 {
        let shift = self.rcv_wscale;
        let mut field = self.rcv_wnd() >> shift;
        if self.rcv_right > self.rcv_nxt {
            let promised = self.rcv_right.bytes_since(self.rcv_nxt);
            field = field.max(promised.div_ceil(1 << shift));
        }
        field.min(0xffff) as u16
    }

    /// A header from this end with the ACK, window, timestamp and SACK fields filled in.
    fn header(&self, now: Instant, seq: Seq, flags: u8) -> TcpHeader {
        let syn = flags & TcpFlags::SYN != 0;
        let mut options = TcpOptions::default();
        let window = if syn {
            self.rcv_wnd().min(0xffff) as u16
        } else {
            self.window_field()
        };
        if syn {
            options.mss = Some(self.cfg.mss);
            let offer = self.state == State::SynSent;
            if self.rcv_wscale > 0 || (offer && self.cfg.window_scaling) || self.snd_wscale > 0 {
                options.window_scale = Some(self.rcv_wscale);
            }
            options.sack_permitted = self.sack;
        }
        if self.timestamps {
            let ecr = if self.state == State::SynSent {
                0
            } else {
                self.ts_recent
            };
            options.timestamp = Some((self.ts_now(now), ecr));
        }
        if self.sack && !syn {
            (options.sack_blocks, options.sack_count) = self.sack_option();
        }
        TcpHeader {
            src_port: self.local_port,
            dst_port: self.remote_port,
            seq,
            ack: if flags & TcpFlags::ACK != 0 {
                self.rcv_nxt
            } else {
                Seq(0)
            },
            flags: TcpFlags(flags),
            window,
            urgent: 0,
            options,
        }
    }

    /// The SACK blocks of the next segment (RFC 2018 §4): a D-SACK block first if a duplicate arrived
    /// (RFC 2883 §4), then the out-of-order ranges, most recent first (emitting drops what does not fit).
    fn sack_option(&self) -> ([(Seq, Seq); 4], u8) {
        let (blocks, count) = if self.recv_buf.has_out_of_order() {
            self.recv_buf.sack_blocks(self.rcv_nxt)
        } else {
            ([(Seq(0), Seq(0)); 4], 0)
        };
        let Some(dup) = self.dsack else {
            return (blocks, count);
        };
        let mut out = [dup; 4];
        out[1..].copy_from_slice(&blocks[..3]);
        (out, (count + 1).min(4))
    }

    /// Bookkeeping for every segment leaving.
    fn sent(&mut self, now: Instant, h: &TcpHeader) {
        self.counters.segments_sent += 1;
        self.last_send = now;
        if h.flags.ack() {
            self.dsack = None;
            self.ack_now = false;
            self.delack_at = None;
            self.segments_since_ack = 0;
            self.last_ack_sent = self.rcv_nxt;
            if !h.flags.syn() {
                self.rcv_right = self.rcv_nxt + (u32::from(h.window) << self.rcv_wscale);
            } else {
                self.rcv_right = self.rcv_nxt + u32::from(h.window);
            }
            self.recv_memory_limited = self.recv_buf.memory_window() < self.recv_buf.window();
        }
    }

    /// Next segment to send: the header, and the payload length written to `payload` (which should hold
    /// at least one MSS). Runs due timers first.
    pub fn poll_transmit(&mut self, now: Instant, payload: &mut [u8]) -> Option<(TcpHeader, usize)> {
        self.run_timers(now);
        if self.release_at.is_none()
            && self.send_buf.len() == 0
            && self.recv_buf.readable() == 0
            && (self.send_buf.allocated() > 0 || self.recv_buf.allocated() > 0)
        {
            self.release_at = Some(now + IDLE_RELEASE);
        }
        if let Some((seq, ack)) = self.rst_pending.take() {
            let mut h = TcpHeader {
                src_port: self.local_port,
                dst_port: self.remote_port,
                seq,
                flags: TcpFlags(TcpFlags::RST),
                ..Default::default()
            };
            if let Some(ack) = ack {
                h.ack = ack;
                h.flags = TcpFlags(TcpFlags::RST | TcpFlags::ACK);
            }
            self.counters.segments_sent += 1;
            return Some((h, 0));
        }
        match self.state {
            State::Closed => return None,
            State::SynSent | State::SynReceived => {
                if !self.syn_pending {
                    return self.pure_ack(now);
                }
                self.syn_pending = false;
                let flags = if self.state == State::SynSent {
                    TcpFlags::SYN
                } else {
                    TcpFlags::SYN | TcpFlags::ACK
                };
                let h = self.header(now, self.iss, flags);
                if self.snd_nxt == self.iss + 1 {
                    self.counters.retransmitted_segments += 1;
                }
                self.snd_nxt = self.iss + 1;
                if self.timeouts_in_row == 0 {
                    self.rtt_probe = Some((self.iss, now));
                }
                self.rto_at.get_or_insert(now + self.rtt.rto());
                self.sent(now, &h);
                return Some((h, 0));
            }
            _ => {}
        }
        if let Some(probe) = self.probe.take()
            && let Some(out) = self.send_probe(now, probe, payload)
        {
            return Some(out);
        }
        if self.sends_data()
            && let Some(out) = self.send_data(now, payload)
        {
            return Some(out);
        }
        self.pure_ack(now)
    }

    fn pure_ack(&mut self, now: Instant) -> Option<(TcpHeader, usize)> {
        if !self.ack_now || matches!(self.state, State::SynSent | State::Closed) {
            return None;
        }
        let seq = if self.state == State::SynReceived {
            self.iss + 1
        } else {
            self.snd_nxt
        };
        let h = self.header(now, seq, TcpFlags::ACK);
        self.sent(now, &h);
        Some((h, 0))
    }

    /// Send sequence space [seq, end) from the buffer, at most one MSS, with FIN if the range reaches it.
    fn send_range(&mut self, now: Instant, seq: Seq, end: Seq, payload: &mut [u8]) -> (TcpHeader, usize) {
        let data_end = self.data_end();
        let avail = data_end.bytes_since(seq);
        // SACK blocks riding on a data segment take room from its payload: header, options and data
        // together stay within the peer's MSS plus 20 (RFC 9293 §3.7.1).
        let sack_room = if self.sack && (self.recv_buf.has_out_of_order() || self.dsack.is_some()) {
            let (_, count) = self.sack_option();
            let fit = if self.timestamps { 3 } else { 4 };
            4 + 8 * u32::from(count.min(fit))
        } else {
            0
        };
        let len = (end.bytes_since(seq))
            .min(avail)
            .min(self.send_mss.saturating_sub(sack_room).max(1))
            .min(payload.len() as u32);
        let fin = self.fin_queued && seq + len == data_end && end > data_end;
        let offset = seq.bytes_since(self.buf_seq) as usize;
        let n = self.send_buf.copy_out(offset, &mut payload[..len as usize]);
        let mut flags = TcpFlags::ACK;
        if fin {
            flags |= TcpFlags::FIN;
        }
        if n > 0 && seq + n as u32 == data_end {
            flags |= TcpFlags::PSH;
        }
        let h = self.header(now, seq, flags);
        let seg_end = seq + n as u32 + u32::from(fin);
        let resends_head = seq < self.snd_nxt && seq == self.snd_una;
        if seq < self.snd_nxt {
            self.counters.retransmitted_segments += 1;
            // Karn (RFC 6298 §3): a retransmitted range is never timed.
            if matches!(self.rtt_probe, Some((p, _)) if p < seg_end) {
                self.rtt_probe = None;
            }
        } else {
            if !self.timestamps && self.rtt_probe.is_none() {
                self.rtt_probe = Some((seq, now));
            }
        }
        if self.sack {
            // RFC 8985 §6.1: every (re)transmission is timed.
            self.rack.on_transmit(seq, seg_end, now);
        }
        if n > 0 {
            self.counters.data_segments_sent += 1;
            if self.cc.pacing_rate().is_some() {
                self.pace_tokens = self.pace_tokens.saturating_sub(n as i64);
            }
        }
        self.snd_nxt = self.snd_nxt.max(seg_end);
        // RFC 6298 §5.1: start the timer if it is not running. A retransmission of the segment at SND.UNA
        // restarts it: the timeout then runs from the head's latest transmission, as Linux's does. Else a
        // head that loss recovery resent twice (each resend found lost by RACK, RFC 8985 §6.2, so the peer
        // is answering) timed out 200 ms after the last cumulative ACK anyway, and the window restarted
        // from one segment; on issue 34's link that was several timeouts per 48 MiB.
        if self.rto_at.is_none() || resends_head {
            self.rto_at = Some(now + self.rtt.rto());
        }
        if self.in_fast_recovery() {
            // The stalled-recovery probe runs from the latest transmission (`timers.rs`).
            self.schedule_tlp(now);
        }
        self.sent(now, &h);
        (h, n)
    }

    /// (Re)transmission by the recovery state, then new data within the windows (RFC 6675 §5, RFC 5681).
    fn send_data(&mut self, now: Instant, payload: &mut [u8]) -> Option<(TcpHeader, usize)> {
        if !self.pacing_allows(now) {
            return None;
        }
        let mss = self.send_mss;
        let (una, nxt) = (self.snd_una, self.snd_nxt);
        let pipe = self.pipe();
        let cwnd = self.cc.cwnd();
        // A retransmission RACK found lost too (RFC 8985 §6.2): send it once more, as `pipe` allows
        // (RFC 6675 §5 step C).
        if let Some((start, end)) = self.rack.first_lost_below(self.rec.rtx_next)
            && start >= una
            && pipe.saturating_add(mss) <= cwnd
        {
            self.counters.lost_retransmissions += 1;
            return Some(self.send_range(now, start, end, payload));
        }
        if let Some((start, end)) = self.rec.next_retransmission(una, nxt)
            && (self.rec.rtx_forced || pipe.saturating_add(mss) <= cwnd)
        {
            self.rec.rtx_forced = false;
            let below_sack = self.rec.scoreboard.high_sacked().is_some_and(|h| start < h);
            let (h, n) = self.send_range(now, start, end, payload);
            self.rec.rtx_next = start + n as u32 + u32::from(h.flags.fin());
            if self.sack && below_sack && matches!(self.rec.phase, Phase::Fast { .. }) {
                self.counters.sack_retransmits += 1;
            }
            return Some((h, n));
        }
        let data_end = self.data_end();
        let seq_end = data_end + u32::from(self.fin_queued);
        if nxt >= seq_end {
            if pipe < cwnd {
                self.cc.on_app_limited();
            }
            return self.rescue_retransmission(now, payload);
        }
        // Restart after idle (RFC 5681 §4.1).
        if una == nxt && now.since(self.last_send) > self.rtt.rto() {
            self.cc.on_idle_restart(mss, self.cfg.initial_window_segments);
        }
        let cwnd_room = cwnd.saturating_sub(pipe);
        let wnd_room = (una + self.snd_wnd).bytes_since(nxt);
        let avail = data_end.bytes_since(nxt);
        if avail == 0 {
            // Only the FIN is left: it needs no window, only the congestion window's leave.
            if cwnd_room == 0 && una != nxt {
                return None;
            }
            return Some(self.send_range(now, nxt, seq_end, payload));
        }
        let usable = cwnd_room.min(wnd_room);
        // Sender SWS avoidance (RFC 9293 §3.8.6.2.1): a full segment, all that is queued, or at least half
        // the largest window the peer offered.
        let wanted = avail.min(mss);
        let sws_ok = usable >= wanted || (usable > 0 && usable >= self.max_snd_wnd / 2);
        if usable == 0 || !sws_ok {
            // Nothing in flight to clock the sender: the persist timer probes a zero window
            // (RFC 9293 §3.8.6.1) or overrides sender SWS avoidance for a small one (§3.8.6.2.1).
            if una == nxt && wnd_room < wanted && self.persist_at.is_none() {
                self.persist_at = Some(now + self.rtt.rto());
            }
            return self.rescue_retransmission(now, payload);
        }
        let end = if usable >= avail { seq_end } else { nxt + usable };
        let (h, n) = self.send_range(now, nxt, end, payload);
        self.schedule_tlp(now);
        Some((h, n))
    }

    /// Pacing (BBR §4.6.2, draft-ietf-ccwg-bbr: segments leave at the pacing rate, not in bursts as ACKs
    /// open the window): a token bucket filled at the controller's rate and holding at most
    /// max(2 segments, 1 ms of the rate); a data segment leaves while tokens remain. When they ran out,
    /// `pacing_at` is when half a bucket is back (fewer wake-ups than one per segment). Controllers that
    /// do not pace (NewReno) always allow.
    fn pacing_allows(&mut self, now: Instant) -> bool {
        let Some(rate) = self.cc.pacing_rate() else {
            return true;
        };
        let rate = rate.max(1);
        let mss = i64::from(self.send_mss);
        let burst = ((rate / 1000).min(i64::MAX as u64 / 2) as i64).max(2 * mss);
        let elapsed = now.since(self.pace_last).as_micros() as u64;
        let refill = (rate.saturating_mul(elapsed) / 1_000_000).min(i64::MAX as u64 / 2) as i64;
        if refill > 0 {
            // Keep the fraction of a byte by not moving the clock when nothing was added.
            // (The initial window's allowance may exceed the bucket: it is spent, never refilled.)
            self.pace_last = now;
            self.pace_tokens = self
                .pace_tokens
                .saturating_add(refill)
                .min(burst.max(self.pace_tokens));
        }
        if self.pace_tokens > 0 {
            self.pacing_at = None;
            return true;
        }
        let wanted = (burst / 2).max(mss) - self.pace_tokens;
        let wait_us = (wanted as u64).saturating_mul(1_000_000) / rate;
        self.pacing_at = Some(now + Duration::from_micros(wait_us.max(1)));
        false
    }

    /// RFC 6675 §4 NextSeg rule (4): once per recovery episode, when nothing presumed lost and no new
    /// data can go, resend the segment holding the highest un-SACKed sequence number above HighRxt
    /// (`rtx_next`), if `pipe` allows.
    fn rescue_retransmission(&mut self, now: Instant, payload: &mut [u8]) -> Option<(TcpHeader, usize)> {
        let Phase::Fast { recover } = self.rec.phase else {
            return None;
        };
        let (una, nxt, mss) = (self.snd_una, self.snd_nxt, self.send_mss);
        if self.rescue_done_for == Some(recover) || self.pipe().saturating_add(mss) > self.cc.cwnd() {
            return None;
        }
        let mut last_hole = None;
        let mut from = una;
        while let Some((start, end)) = self.rec.scoreboard.next_hole(from, nxt) {
            last_hole = Some((start, end));
            from = end;
        }
        let (start, end) = last_hole?;
        // S3 > HighRxt: never a byte already retransmitted in this episode.
        if end <= self.rec.rtx_next {
            return None;
        }
        let start = start.max(self.rec.rtx_next);
        self.rescue_done_for = Some(recover);
        if self.sack {
            self.counters.sack_retransmits += 1;
        }
        let seg_start = start.max(end - mss);
        Some(self.send_range(now, seg_start, end, payload))
    }

    /// In fast recovery (not the go-back after a timeout).
    pub(super) fn in_fast_recovery(&self) -> bool {
        matches!(self.rec.phase, Phase::Fast { .. })
    }

    /// `pipe` (RFC 6675 §4, `Recovery::pipe`), less the retransmissions RACK found lost and not yet
    /// resent (they left the network too).
    pub(super) fn pipe(&self) -> u32 {
        let pipe = self
            .rec
            .pipe(self.snd_una, self.snd_nxt, self.send_mss, self.sack);
        pipe.saturating_sub(self.rack.lost_bytes_below(self.rec.rtx_next))
    }
}

#[path = "segment_arrival.rs"]
mod segment_arrival;
#[path = "timers.rs"]
mod timers;
