//! Connections under a [`TcpBudget`] that runs out (`budget.rs`): two connection tables (two daemons)
//! joined by a lossless simulated link, memory taken by a "hog" ring (standing for the daemon's other
//! connections) and given back. Every segment is checked as it leaves: no window's right edge ever moves
//! back (RFC 9293 §3.8.6), and the bytes held never pass the bound.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use super::budget::{Pool, TcpBudget, TcpLimits};
use super::ring::Ring;
use super::{ConnectionTable, Delivery, Events, FourTuple, Instant, Seq, State, TcpConfig, TcpHeader};
use crate::error::NdStatus;

/// 48 KiB receive buffers: windows below 64 KiB, so no window scaling and the right edge of each
/// advertisement is exact.
fn cfg() -> TcpConfig {
    TcpConfig {
        mss: 1000,
        send_buffer: 48 * 1024,
        recv_buffer: 48 * 1024,
        delayed_ack: Duration::ZERO,
        time_wait: Duration::from_millis(500),
        ..TcpConfig::default()
    }
}

fn limits(max_buffer_bytes: u64) -> TcpLimits {
    TcpLimits {
        max_buffer_bytes,
        max_connections: 16,
    }
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn flip(t: FourTuple) -> FourTuple {
    FourTuple {
        local: t.remote,
        remote: t.local,
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Memory held outside the connections: a ring grown to take what is left of the budget.
fn hog(budget: &Arc<TcpBudget>, pool: Pool) -> Ring {
    let mut r = Ring::new(usize::MAX / 2);
    let pools = budget.pools();
    r.set_budget(match pool {
        Pool::Send => pools.send,
        Pool::Receive => pools.receive,
    });
    let want = budget.headroom(pool);
    assert_eq!(r.grow(want), want);
    assert_eq!(budget.headroom(pool), 0);
    r
}

/// Client (side 0) and server (side 1) tables, each under its own budget, and the link between them.
struct Sim {
    tables: [ConnectionTable; 2],
    budgets: [Arc<TcpBudget>; 2],
    /// Segments in flight: arrival time, destination side, the 4-tuple from the destination's view.
    flight: Vec<(Instant, usize, FourTuple, TcpHeader, Vec<u8>)>,
    now: Instant,
    /// The right edge of the last window each side advertised on each connection, and the window.
    right: HashMap<(usize, FourTuple), Seq>,
    window: HashMap<(usize, FourTuple), u16>,
    events: [Events; 2],
    /// Bytes each side read, per connection (its own 4-tuple).
    read: HashMap<(usize, FourTuple), Vec<u8>>,
    /// Bytes each side still has to write, per connection; taken as `send` accepts them.
    to_write: HashMap<(usize, FourTuple), Vec<u8>>,
    /// Segments dropped by the tables as unmatched or refused (none expected but where a test says).
    resets: Vec<TcpHeader>,
}

const LISTEN: &str = "10.0.0.2:4791";

impl Sim {
    fn new(client: TcpLimits, server: TcpLimits) -> Sim {
        let budgets = [Arc::new(TcpBudget::new(client)), Arc::new(TcpBudget::new(server))];
        let mut server_table = ConnectionTable::with_budget(cfg(), budgets[1].clone(), 2);
        server_table.listen(addr(LISTEN), 1).unwrap();
        Sim {
            tables: [
                ConnectionTable::with_budget(cfg(), budgets[0].clone(), 1),
                server_table,
            ],
            budgets,
            flight: Vec::new(),
            now: Instant::from_millis(1),
            right: HashMap::new(),
            window: HashMap::new(),
            events: [Events::empty(); 2],
            read: HashMap::new(),
            to_write: HashMap::new(),
            resets: Vec::new(),
        }
    }

    /// A connection from client port `port`: its 4-tuple at the client.
    fn connect(&mut self, port: u16) -> FourTuple {
        let t = FourTuple {
            local: addr(&format!("10.0.0.1:{port}")),
            remote: addr(LISTEN),
        };
        self.tables[0].connect(self.now, t).unwrap();
        t
    }

    /// Queue `data` to be written by `side` on `t` (its own view).
    fn write(&mut self, side: usize, t: FourTuple, data: &[u8]) {
        self.to_write
            .entry((side, t))
            .or_default()
            .extend_from_slice(data);
    }

    fn read_by(&self, side: usize, t: FourTuple) -> &[u8] {
        self.read.get(&(side, t)).map_or(&[], |v| v.as_slice())
    }

    /// The applications (write what `send` takes, read everything), then every segment due out, checked.
    fn poll(&mut self) {
        let mut buf = vec![0u8; 65536];
        for side in 0..2 {
            for ((s, t), data) in self.to_write.iter_mut() {
                if *s != side || data.is_empty() {
                    continue;
                }
                if let Some(c) = self.tables[side].get_mut(*t)
                    && let Ok(n) = c.send(data)
                {
                    data.drain(..n);
                }
            }
            let tuples: Vec<FourTuple> = self.tables[side].connections().map(|(t, _)| *t).collect();
            for t in tuples {
                let c = self.tables[side].get_mut(t).unwrap();
                loop {
                    let n = c.recv(&mut buf);
                    if n == 0 {
                        break;
                    }
                    self.read
                        .entry((side, t))
                        .or_default()
                        .extend_from_slice(&buf[..n]);
                }
            }
            let mut out = Vec::new();
            while let Some((_, ev)) = self.tables[side].poll(self.now, &mut buf, |t, h, p| {
                out.push((t, *h, p.to_vec()));
            }) {
                self.events[side] |= ev;
            }
            for (t, h, p) in out {
                self.check(side, t, &h);
                let at = self.now + Duration::from_millis(1);
                self.flight.push((at, 1 - side, flip(t), h, p));
            }
            let b = &self.budgets[side];
            assert!(
                b.buffer_bytes() <= b.limits().max_buffer_bytes,
                "side {side} holds {} bytes, past its bound {}",
                b.buffer_bytes(),
                b.limits().max_buffer_bytes
            );
        }
    }

    /// RFC 9293 §3.8.6: the right edge of the window never moves back.
    fn check(&mut self, side: usize, t: FourTuple, h: &TcpHeader) {
        if !h.flags.ack() || h.flags.rst() {
            return;
        }
        let right = h.ack + u32::from(h.window);
        if let Some(&before) = self.right.get(&(side, t)) {
            assert!(
                right >= before,
                "side {side} moved its right edge back from {before:?} to {right:?} ({h:?})"
            );
        }
        self.right.insert((side, t), right);
        self.window.insert((side, t), h.window);
    }

    /// Deliver what is due at `now`.
    fn deliver(&mut self) {
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.flight)
            .into_iter()
            .partition(|f| f.0 <= self.now);
        self.flight = later;
        for (_, to, t, h, p) in due {
            match self.tables[to].on_segment(self.now, t, &h, &p) {
                Delivery::Connection | Delivery::Opened => {}
                Delivery::Unmatched(Some(rst)) | Delivery::Refused(rst) => {
                    self.resets.push(rst);
                    self.flight.push((
                        self.now + Duration::from_millis(1),
                        1 - to,
                        flip(t),
                        rst,
                        Vec::new(),
                    ));
                }
                Delivery::Unmatched(None) => {}
            }
        }
    }

    /// Runs until `done` holds (true) or `limit` of simulated time passes (false).
    fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&Sim) -> bool) -> bool {
        let end = self.now + limit;
        loop {
            self.poll();
            if done(self) {
                return true;
            }
            let next_flight = self.flight.iter().map(|f| f.0).min();
            let next_timer = self.tables.iter().filter_map(|t| t.poll_at()).min();
            let next = [next_flight, next_timer]
                .into_iter()
                .flatten()
                .min()
                .map(|n| n.max(self.now));
            let next = match next {
                // Something to do at once: do it without moving the clock.
                Some(n) if n <= self.now => self.now,
                Some(n) => n,
                None => return done(self),
            };
            if next > end {
                self.now = end;
                self.poll();
                return done(self);
            }
            self.now = next;
            self.deliver();
        }
    }

    fn established(&self, t: FourTuple) -> bool {
        self.tables[0]
            .get(&t)
            .is_some_and(|c| c.state() == State::Established)
            && self.tables[1]
                .get(&flip(t))
                .is_some_and(|c| c.state() == State::Established)
    }
}

/// The server's memory runs out after it advertised a window: the window it promised stays (the right
/// edge never moves back), the segments it has no memory for are dropped unacknowledged, and once memory
/// is given back every byte arrives, intact.
#[test]
fn a_window_already_advertised_is_kept_and_what_cannot_be_stored_is_resent() {
    let mut sim = Sim::new(limits(u64::MAX), limits(64 * 1024));
    let t = sim.connect(50000);
    assert!(sim.run_until(Duration::from_secs(1), |s| s.established(t)));
    let promised = sim.right[&(1, flip(t))];
    let hog = hog(&sim.budgets[1], Pool::Receive);
    let data = pattern(40_000, 1);
    sim.write(0, t, &data);
    // Long enough for several retransmission timeouts: nothing gets in, nothing is acknowledged.
    assert!(!sim.run_until(Duration::from_secs(3), |s| !s.read_by(1, flip(t)).is_empty()));
    assert_eq!(sim.tables[0].get(&t).unwrap().send_queue_len(), 40_000);
    assert_eq!(
        sim.right[&(1, flip(t))],
        promised,
        "the window promised is kept, not shrunk"
    );
    assert!(sim.tables[1].get(&flip(t)).unwrap().memory_limited());
    assert!(sim.budgets[1].memory_limited() > 0);
    drop(hog);
    assert!(
        sim.run_until(Duration::from_secs(30), |s| s.read_by(1, flip(t)).len()
            == data.len())
    );
    assert!(
        sim.read_by(1, flip(t)) == data,
        "bytes lost, duplicated or reordered"
    );
    for ev in sim.events {
        assert!(
            !ev.contains(Events::RESET) && !ev.contains(Events::TIMED_OUT),
            "{ev:?}"
        );
    }
    assert!(sim.resets.is_empty());
}

/// With no memory at all, the window offered is zero; when memory is given back the table tells the
/// connection, whose window update goes out at once (not at the peer's next zero-window probe).
#[test]
fn a_window_held_at_zero_opens_as_soon_as_memory_is_given_back() {
    let mut sim = Sim::new(limits(u64::MAX), limits(64 * 1024));
    let hog = hog(&sim.budgets[1], Pool::Receive);
    let t = sim.connect(50000);
    assert!(sim.run_until(Duration::from_secs(1), |s| s.established(t)));
    assert_eq!(sim.window[&(1, flip(t))], 0, "no memory, no window");
    let data = pattern(30_000, 2);
    sim.write(0, t, &data);
    sim.run_until(Duration::from_millis(50), |_| false);
    assert!(sim.read_by(1, flip(t)).is_empty());
    assert!(sim.tables[1].get(&flip(t)).unwrap().memory_limited());
    drop(hog);
    // The same instant: the update is the table's doing, not a timer's.
    let before = sim.right[&(1, flip(t))];
    sim.poll();
    assert!(
        sim.right[&(1, flip(t))] > before,
        "no window update when memory came back"
    );
    assert!(
        sim.run_until(Duration::from_secs(30), |s| s.read_by(1, flip(t)).len()
            == data.len())
    );
    assert!(sim.read_by(1, flip(t)) == data);
}

/// Past the bound, `send` takes fewer bytes (none here): the rest stays with the caller, and WRITABLE
/// comes when memory is given back, although nothing was in flight to be acknowledged.
#[test]
fn a_send_cut_short_by_the_budget_resumes_when_memory_is_given_back() {
    let mut sim = Sim::new(limits(64 * 1024), limits(u64::MAX));
    let t = sim.connect(50000);
    assert!(sim.run_until(Duration::from_secs(1), |s| s.established(t)));
    let hog = hog(&sim.budgets[0], Pool::Send);
    let data = pattern(100_000, 3);
    let c = sim.tables[0].get_mut(t).unwrap();
    assert_eq!(c.send(&data).unwrap(), 0, "no memory: nothing taken");
    assert!(c.memory_limited());
    assert!(c.send_capacity_free() > 0, "the buffer itself had room");
    sim.events[0] = Events::empty();
    sim.run_until(Duration::from_millis(50), |_| false);
    assert!(!sim.events[0].contains(Events::WRITABLE));
    drop(hog);
    sim.poll();
    assert!(sim.events[0].contains(Events::WRITABLE), "{:?}", sim.events[0]);
    sim.write(0, t, &data);
    assert!(
        sim.run_until(Duration::from_secs(30), |s| s.read_by(1, flip(t)).len()
            == data.len())
    );
    assert!(sim.read_by(1, flip(t)) == data);
}

/// A send buffer full of unacknowledged bytes cannot take the memory receiving needs: with both
/// directions busy and little memory on each side, both transfers complete.
#[test]
fn sends_never_take_the_memory_receiving_needs() {
    let mut sim = Sim::new(limits(16 * 1024), limits(16 * 1024));
    let t = sim.connect(50000);
    let (up, down) = (pattern(200_000, 4), pattern(200_000, 5));
    sim.write(0, t, &up);
    sim.write(1, flip(t), &down);
    assert!(sim.run_until(Duration::from_secs(120), |s| {
        s.read_by(1, flip(t)).len() == up.len() && s.read_by(0, t).len() == down.len()
    }));
    assert!(sim.read_by(1, flip(t)) == up && sim.read_by(0, t) == down);
    for b in &sim.budgets {
        let figures: HashMap<_, _> = b.counters().into_iter().collect();
        assert!(figures["tcp_peak_buffer_bytes"] <= b.limits().max_buffer_bytes);
        assert!(figures["tcp_peak_buffer_bytes"] > 0);
    }
}

/// Past the connection bound a SYN is answered with a reset and counted, and an active open fails with
/// INSUFFICIENT_RESOURCES; a connection gone makes room again.
#[test]
fn the_connection_bound_resets_syns_and_refuses_connects() {
    let bound = TcpLimits {
        max_buffer_bytes: u64::MAX,
        max_connections: 2,
    };
    let mut sim = Sim::new(limits(u64::MAX), bound);
    let a = sim.connect(50000);
    let b = sim.connect(50001);
    assert!(sim.run_until(Duration::from_secs(1), |s| s.established(a) && s.established(b)));
    assert_eq!(sim.budgets[1].connections(), 2);
    let c = sim.connect(50002);
    sim.run_until(Duration::from_secs(1), |s| s.events[0].contains(Events::RESET));
    assert_eq!(sim.resets.len(), 1);
    assert!(sim.resets[0].flags.rst() && sim.resets[0].flags.ack());
    assert_eq!(sim.budgets[1].refused_syns(), 1);
    assert_eq!(sim.tables[0].get(&c).unwrap().state(), State::Closed);
    assert_eq!(sim.budgets[1].connections(), 2);
    // The server's own active open is refused too, before anything is sent.
    let out = FourTuple {
        local: addr(LISTEN),
        remote: addr("10.0.0.1:7"),
    };
    let e = sim.tables[1].connect(sim.now, out).unwrap_err();
    assert_eq!(e.status, NdStatus::InsufficientResources, "{e}");
    let figures: HashMap<_, _> = sim.budgets[1].counters().into_iter().collect();
    assert_eq!(figures["tcp_refused_connects"], 1);
    // One connection gone: a SYN opens again.
    sim.tables[1].remove(flip(a));
    assert_eq!(sim.budgets[1].connections(), 1);
    sim.tables[0].remove(c);
    let c = sim.connect(50002);
    assert!(sim.run_until(Duration::from_secs(1), |s| s.established(c)));
    assert_eq!(sim.budgets[1].connections(), 2);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Whatever the bounds (from a few KiB), whenever memory is taken and given back, both directions
    /// of several connections deliver every byte once, in order, without a reset or a timeout.
    #[test]
    fn every_byte_arrives_whatever_the_budget(
        bound in [4_096u64..65_536, 4_096u64..65_536],
        hog_ms in 0u64..3_000,
        connections in 1usize..4,
        len in 1usize..60_000,
    ) {
        let mut sim = Sim::new(limits(bound[0]), limits(bound[1]));
        let hogs = [hog(&sim.budgets[0], Pool::Send), hog(&sim.budgets[1], Pool::Receive)];
        let tuples: Vec<FourTuple> = (0..connections).map(|i| sim.connect(50000 + i as u16)).collect();
        let data: Vec<(Vec<u8>, Vec<u8>)> =
            (0..connections).map(|i| (pattern(len, i as u8), pattern(len / 2 + 1, 100 + i as u8))).collect();
        for (t, (up, down)) in tuples.iter().zip(&data) {
            sim.write(0, *t, up);
            sim.write(1, flip(*t), down);
        }
        sim.run_until(Duration::from_millis(hog_ms), |_| false);
        drop(hogs);
        let all = |s: &Sim| {
            tuples.iter().zip(&data).all(|(t, (up, down))| {
                s.read_by(1, flip(*t)).len() == up.len() && s.read_by(0, *t).len() == down.len()
            })
        };
        prop_assert!(sim.run_until(Duration::from_secs(600), all), "transfers did not complete");
        for (t, (up, down)) in tuples.iter().zip(&data) {
            prop_assert!(sim.read_by(1, flip(*t)) == up.as_slice());
            prop_assert!(sim.read_by(0, *t) == down.as_slice());
        }
        for ev in sim.events {
            prop_assert!(!ev.contains(Events::RESET) && !ev.contains(Events::TIMED_OUT), "{:?}", ev);
        }
    }
}
