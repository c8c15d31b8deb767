//! The progress thread's policy ([`super::progress`]), sans-IO: fed what the thread saw of the handed-off
//! connections at one look, [`Watchdog::look`] says which connections the application's runtime left
//! unserved for longer than [`GRACE`] (the thread serves those itself from then on) and when to look
//! next. It owns no socket and no clock, so every rule is tested here without a thread.
//!
//! A connection is left unserved when, at two looks at least [`GRACE`] apart, it was
//! - readable with the same count of read passes (nobody read what arrived);
//! - holding output, with room in its socket, and the same count of writes (nobody wrote what fits);
//! - or its first-FPDU hold's deadline passed [`GRACE`] ago and the hold is still on (nobody fired it).
//!
//! Between looks the thread sleeps until a watched socket is readable (nothing else moves), so that an
//! idle process costs no wake-up and an occasional message one (three if the thread's look comes before
//! the runtime has read it: it looks again when the grace ends, then ticks once). Once traffic comes
//! within a tick of a look, or output waits for room, it ticks every [`TICK`] instead, so that busy
//! connections cost at most `1 / TICK` wake-ups a second however many messages they carry; a suspect
//! seen then is judged at the next tick. A tick that saw no traffic puts it back to sleep.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A watched connection, as the progress thread names it.
pub(super) type Key = u64;

/// How long the application's runtime has to serve a readable socket (or room for its output, or a passed
/// hold deadline) before the progress thread does it.
///
/// A runtime that is waiting serves a socket tens of microseconds after its bytes arrive (the 64 B Send's
/// whole half round trip here is about 25 µs), so 250 µs never takes a connection from a responsive
/// runtime. The usual guidance for async Rust is an `.await` at least every 10–100 µs; a runtime that has
/// not come back to a ready socket in 250 µs is running something that blocks, and the peer's Read then
/// waits at most this long (plus a round trip) instead of until the application's code returns.
pub(super) const GRACE: Duration = Duration::from_micros(250);

/// The thread's tick while traffic flows: how late it may notice a runtime that stops in the middle of a
/// ping-pong (at most twice this: far below TCP's 200 ms minimum retransmission timeout, and of the order
/// of the first-FPDU hold an initiator's first message already waits), for 200 wake-ups a second while
/// traffic flows. A 64 B ping-pong here makes 10,000 to 17,000 round trips a second: about 0.015 of a
/// wake-up per round trip; at 2 ms the quick bench counted 400–550 wake-ups a second, 0.03–0.08 per round
/// trip of its short runs.
pub(super) const TICK: Duration = Duration::from_millis(5);

/// What the progress thread saw at one look.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Look {
    /// Connections the application's runtime drives whose socket is readable, each with its count of read
    /// passes (the runtime's and the thread's).
    pub(super) readable: Vec<(Key, u64)>,
    /// Connections the runtime drives with output waiting and room in their socket, each with its count of
    /// writes.
    pub(super) writable: Vec<(Key, u64)>,
    /// Connections the runtime drives whose first-FPDU hold is on, each with its deadline.
    pub(super) deadlines: Vec<(Key, Instant)>,
    /// Whether any connection the runtime drives has output waiting, room or not (room may come while the
    /// runtime is away: looked at again within [`TICK`]).
    pub(super) output_waits: bool,
    /// How many connections the thread serves itself.
    pub(super) taken: usize,
    /// The process's count of read passes and writes, every connection's.
    pub(super) activity: u64,
}

/// When the thread looks next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// When a watched socket becomes readable (or the thread is poked): nothing else can move.
    Readable,
    /// After this long.
    After(Duration),
}

/// What the thread remembers between looks.
#[derive(Debug, Default)]
pub(super) struct Watchdog {
    /// Readable at the last look: the count of read passes then, and since when it was unchanged.
    readable: HashMap<Key, (u64, Instant)>,
    /// Output waiting with room at the last look: the count of writes then, and since when.
    writable: HashMap<Key, (u64, Instant)>,
    /// The process's activity at the last look.
    activity: Option<u64>,
    /// The thread ticks: traffic flows.
    ticking: bool,
    /// When it looked last.
    last: Option<Instant>,
}

impl Watchdog {
    /// The connections to take over now (each once, in key order), and when to look next.
    pub(super) fn look(&mut self, now: Instant, look: &Look) -> (Vec<Key>, Next) {
        let mut take = Vec::new();
        // When a suspect's grace ends: the next look, unless the thread ticks anyway.
        let mut suspects: Option<Instant> = None;
        self.readable = unchanged_for_grace(&self.readable, &look.readable, now, &mut take, &mut suspects);
        self.writable = unchanged_for_grace(&self.writable, &look.writable, now, &mut take, &mut suspects);
        let mut deadlines: Option<Instant> = None;
        for &(key, deadline) in &look.deadlines {
            let due = deadline + GRACE;
            if due <= now {
                take.push(key);
            } else {
                deadlines = Some(deadlines.map_or(due, |d| d.min(due)));
            }
        }
        take.sort_unstable();
        take.dedup();
        let active = self.activity.is_some_and(|a| a != look.activity);
        self.activity = Some(look.activity);
        // Traffic that keeps the thread ticking rather than sleeping until each message: activity since the
        // last tick, or since a look less than a tick ago (messages come closer together than a tick).
        let recent = self.last.is_some_and(|t| now.duration_since(t) < TICK);
        let dense = active && (self.ticking || recent);
        self.ticking = dense || look.output_waits || look.taken > 0 || !take.is_empty();
        self.last = Some(now);
        let next = if self.ticking {
            // A suspect waits for the next tick (farther than its grace): a ping-pong's messages caught in
            // flight cost no extra look. A hold's deadline does not wait.
            Next::After(deadlines.map_or(TICK, |d| (d - now).min(TICK)))
        } else if let Some(due) = deadlines.into_iter().chain(suspects).min() {
            Next::After(due - now)
        } else {
            Next::Readable
        };
        (take, next)
    }
}

/// The suspects of this look (`seen`: key and count), each with since when its count is unchanged; those
/// unchanged for [`GRACE`] go to `take` instead, and the earliest end of a grace still running to
/// `soonest`.
fn unchanged_for_grace(
    before: &HashMap<Key, (u64, Instant)>,
    seen: &[(Key, u64)],
    now: Instant,
    take: &mut Vec<Key>,
    soonest: &mut Option<Instant>,
) -> HashMap<Key, (u64, Instant)> {
    let mut kept = HashMap::with_capacity(seen.len());
    for &(key, count) in seen {
        let since = match before.get(&key) {
            Some(&(c, since)) if c == count => since,
            _ => now,
        };
        if now.duration_since(since) >= GRACE {
            take.push(key);
        } else {
            let due = since + GRACE;
            *soonest = Some(soonest.map_or(due, |s| s.min(due)));
            kept.insert(key, (count, since));
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// A socket that stays readable with no read pass for the grace is taken over; looked at again when
    /// its grace ends, not before.
    #[test]
    fn an_unread_socket_is_taken_after_the_grace() {
        let t0 = Instant::now();
        let mut dog = Watchdog::default();
        let look = Look {
            readable: vec![(7, 3)],
            ..Look::default()
        };
        assert_eq!(dog.look(t0, &look), (vec![], Next::After(GRACE)));
        assert_eq!(
            dog.look(t0 + us(100), &look),
            (vec![], Next::After(GRACE - us(100)))
        );
        assert_eq!(dog.look(t0 + GRACE, &look).0, vec![7]);
    }

    /// A socket read in the meantime (its count moved) starts a new grace; one no longer readable is
    /// forgotten.
    #[test]
    fn a_served_socket_is_left_to_the_runtime() {
        let t0 = Instant::now();
        let mut dog = Watchdog::default();
        let at = |count: u64| Look {
            readable: vec![(7, count)],
            activity: count,
            ..Look::default()
        };
        dog.look(t0, &at(3));
        let (take, _) = dog.look(t0 + GRACE, &at(4));
        assert!(take.is_empty(), "read meanwhile: {take:?}");
        let (take, _) = dog.look(t0 + GRACE * 2 - us(1), &at(4));
        assert!(take.is_empty());
        // Not readable at one look: what came later starts from nothing.
        dog.look(t0 + GRACE * 2, &Look::default());
        let (take, _) = dog.look(t0 + GRACE * 3, &at(4));
        assert!(take.is_empty(), "{take:?}");
        assert_eq!(dog.look(t0 + GRACE * 4, &at(4)).0, vec![7]);
    }

    /// Output with room and no write for the grace is taken over; output that a full socket holds is only
    /// watched, every tick.
    #[test]
    fn output_left_with_room_is_taken_and_a_full_socket_only_watched() {
        let t0 = Instant::now();
        let mut dog = Watchdog::default();
        let full = Look {
            output_waits: true,
            ..Look::default()
        };
        for i in 0..3 {
            assert_eq!(dog.look(t0 + TICK * i, &full), (vec![], Next::After(TICK)));
        }
        let t = t0 + TICK * 3;
        let room = Look {
            writable: vec![(9, 40)],
            output_waits: true,
            ..Look::default()
        };
        assert_eq!(dog.look(t, &room), (vec![], Next::After(TICK)));
        assert_eq!(dog.look(t + GRACE, &room).0, vec![9]);
    }

    /// A hold whose deadline passed more than the grace ago is taken; one still ahead sets the next look.
    #[test]
    fn a_missed_hold_deadline_is_taken() {
        let t0 = Instant::now();
        let mut dog = Watchdog::default();
        let look = Look {
            deadlines: vec![(5, t0 + us(10_000))],
            ..Look::default()
        };
        assert_eq!(dog.look(t0, &look), (vec![], Next::After(us(10_000) + GRACE)));
        assert_eq!(dog.look(t0 + us(10_000), &look).0, vec![]);
        assert_eq!(dog.look(t0 + us(10_000) + GRACE, &look).0, vec![5]);
    }

    /// Messages closer together than a tick keep the thread ticking every TICK (a message caught in
    /// flight is judged at the next tick); a tick that saw no traffic puts it to sleep; an occasional
    /// message wakes it once if the runtime served it before the thread's look, three times if not.
    #[test]
    fn dense_traffic_ticks_and_occasional_messages_sleep() {
        let t0 = Instant::now();
        let mut dog = Watchdog::default();
        let at = |activity| Look {
            activity,
            ..Look::default()
        };
        assert_eq!(dog.look(t0, &at(0)).1, Next::Readable);
        assert_eq!(dog.look(t0 + TICK * 10, &at(2)).1, Next::Readable);
        // The next message comes within a tick of the last: the thread ticks.
        let t1 = t0 + TICK * 10 + us(60);
        assert_eq!(dog.look(t1, &at(4)).1, Next::After(TICK));
        let caught = Look {
            readable: vec![(3, 9)],
            activity: 40,
            ..Look::default()
        };
        assert_eq!(dog.look(t1 + TICK, &caught), (vec![], Next::After(TICK)));
        assert_eq!(dog.look(t1 + TICK * 2, &at(80)), (vec![], Next::After(TICK)));
        assert_eq!(dog.look(t1 + TICK * 3, &at(80)).1, Next::Readable);
        // An occasional message the thread looks at before the runtime read it: judged when its grace ends,
        // by which time the runtime served it; the thread ticks once more before it sleeps again.
        let t2 = t1 + TICK * 20;
        let arrived = Look {
            readable: vec![(3, 12)],
            activity: 80,
            ..Look::default()
        };
        assert_eq!(dog.look(t2, &arrived), (vec![], Next::After(GRACE)));
        assert_eq!(dog.look(t2 + GRACE, &at(82)), (vec![], Next::After(TICK)));
        assert_eq!(dog.look(t2 + GRACE + TICK, &at(82)).1, Next::Readable);
    }

    /// Connections the thread serves keep it looking (the runtime may come back and take them); while it
    /// ticks, a readable suspect waits for the next tick, and is taken there if nobody read it.
    #[test]
    fn taken_connections_keep_the_thread_looking() {
        let t0 = Instant::now();
        let mut dog = Watchdog::default();
        let taken = Look {
            taken: 1,
            ..Look::default()
        };
        let mut t = t0;
        for _ in 0..6 {
            let (_, next) = dog.look(t, &taken);
            let Next::After(d) = next else {
                panic!("a taken connection is looked after")
            };
            t += d;
        }
        let suspect = Look {
            readable: vec![(3, 0)],
            taken: 1,
            ..Look::default()
        };
        assert_eq!(dog.look(t, &suspect), (vec![], Next::After(TICK)));
        assert_eq!(dog.look(t + TICK, &suspect).0, vec![3]);
    }
}
