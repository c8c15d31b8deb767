//! Tests of the rings across two mappings of one memfd: the need-wakeup protocol, interleavings and
//! wraparound (property tests against a model), two threads with eventfd doorbells, a client that
//! scribbles over the daemon's view, and a second process posting through the rings.

use std::sync::Arc;

use proptest::prelude::*;
use zerocopy::FromZeros;

use super::consumer::{Consumer, Polled};
use super::cq::{self, CqRingReader, CqRingWriter};
use super::doorbell::Doorbell;
use super::entries::{CompletionEntry, SendEntry};
use super::producer::Producer;
use super::qp::{QpRingLayout, QpRingReader, QpRingWriter};
use super::shared::{CACHE_LINE, RingEntry, RingGeometry, RingView};
use super::*;
use crate::engine::verbs::*;
use crate::shm::SharedMemory;

/// The largest transfer the tests' adapters allow.
const MAX: u32 = 1 << 20;

/// Two mappings of one fresh memfd, as the daemon and a client hold them.
fn two_mappings(len: usize) -> (Arc<SharedMemory>, Arc<SharedMemory>) {
    let a = SharedMemory::create("soft-rdma-test", len).unwrap();
    let fd = a.fd().unwrap().try_clone_to_owned().unwrap();
    let b = SharedMemory::from_fd(fd, len).unwrap();
    (Arc::new(a), Arc::new(b))
}

/// A producer and a consumer of completion entries over `capacity` slots, each on its own mapping, both
/// starting at index `start`.
fn pair(capacity: u32, start: u32) -> (Producer<CompletionEntry>, Consumer<CompletionEntry>) {
    let g = RingGeometry::for_entries::<CompletionEntry>(capacity).unwrap();
    let (a, b) = two_mappings(g.bytes());
    let (va, vb) = (RingView::new(a, 0, g).unwrap(), RingView::new(b, 0, g).unwrap());
    va.initialize();
    (
        Producer::new(va, start).unwrap(),
        Consumer::new(vb, start).unwrap(),
    )
}

/// Entry number `n`: every field derived from it, so a misplaced or torn slot shows.
fn entry(n: u64) -> CompletionEntry {
    let mut e = CompletionEntry::new_zeroed();
    e.wr_id.set(n);
    e.qp.set(!n);
    e.bytes.set(n as u32 ^ 0x5a5a_5a5a);
    e
}

fn drain_all(c: &mut Consumer<CompletionEntry>, max: u32, got: &mut Vec<CompletionEntry>) -> Polled {
    c.poll(max, |_, e| {
        got.push(e);
        Ok::<(), ()>(())
    })
    .unwrap()
}

#[test]
fn no_doorbell_while_the_consumer_polls_one_once_it_sleeps() {
    let (mut p, mut c) = pair(4, 0);
    p.push(&entry(0)).unwrap();
    assert!(!p.publish(), "the consumer never said it sleeps");
    assert!(!p.publish(), "nothing new: nothing to ring");
    assert!(!c.prepare_sleep().unwrap(), "an entry is waiting: do not sleep");
    let mut got = Vec::new();
    drain_all(&mut c, 8, &mut got);
    assert!(c.prepare_sleep().unwrap(), "empty: sleep");
    p.push(&entry(1)).unwrap();
    assert!(p.publish(), "the consumer sleeps: ring");
    c.awake();
    p.push(&entry(2)).unwrap();
    assert!(!p.publish(), "awake again: no ring");
    drain_all(&mut c, 8, &mut got);
    assert_eq!(got, vec![entry(0), entry(1), entry(2)]);
}

#[test]
fn a_full_ring_refuses_and_wakes_the_waiting_producer() {
    let (mut p, mut c) = pair(2, u32::MAX - 1);
    p.push(&entry(0)).unwrap();
    p.push(&entry(1)).unwrap();
    assert_eq!(p.push(&entry(2)), Err(RingError::Full { capacity: 2 }));
    p.publish();
    assert!(p.prepare_sleep().unwrap(), "still full: sleep");
    let mut got = Vec::new();
    let polled = drain_all(&mut c, 1, &mut got);
    assert_eq!(
        polled,
        Polled {
            taken: 1,
            left: 1,
            wake_producer: true
        }
    );
    p.awake();
    p.push(&entry(2)).unwrap();
    p.publish();
    let polled = drain_all(&mut c, 8, &mut got);
    assert!(!polled.wake_producer, "the producer is awake");
    assert_eq!(got, vec![entry(0), entry(1), entry(2)], "across the u32 wrap");
    assert_eq!(c.index(), 1);
}

#[test]
fn the_consumer_refuses_a_producer_index_past_the_ring() {
    let (p, mut c) = pair(4, 10);
    drop(p);
    for bad in [15u32, 9, 10u32.wrapping_sub(1000), u32::MAX] {
        c.view_for_tests().store(
            shared::Word::ProducerIndex,
            bad,
            std::sync::atomic::Ordering::Relaxed,
        );
        let e = c.available().unwrap_err();
        assert_eq!(
            e,
            RingError::ProducerIndex {
                producer: bad,
                consumer: 10,
                capacity: 4
            }
        );
        assert!(c.prepare_sleep().is_err());
    }
    c.view_for_tests().store(
        shared::Word::ProducerIndex,
        14,
        std::sync::atomic::Ordering::Relaxed,
    );
    assert_eq!(c.available(), Ok(4), "a full ring is fine");
}

#[test]
fn the_producer_refuses_a_consumer_index_out_of_its_window() {
    let (mut p, c) = pair(4, 100);
    for n in 0..3 {
        p.push(&entry(n)).unwrap();
    }
    p.publish();
    // The consumer may be anywhere in [100, 103]; not behind what it took, not past what was published.
    for (consumer, ok) in [
        (100, true),
        (102, true),
        (103, true),
        (104, false),
        (99, false),
        (0, false),
    ] {
        c.view_for_tests().store(
            shared::Word::ConsumerIndex,
            consumer,
            std::sync::atomic::Ordering::Relaxed,
        );
        let r = p.free();
        if ok {
            assert_eq!(r, Ok(4 - (103 - consumer)), "{consumer}");
        } else {
            assert!(
                matches!(r, Err(RingError::ConsumerIndex { .. })),
                "{consumer}: {r:?}"
            );
        }
    }
}

/// One step of the interleaving model.
#[derive(Clone, Debug)]
enum Step {
    Push(u32),
    Publish,
    Poll(u32),
    ConsumerSleeps,
    ProducerSleepsIfFull,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (1u32..6).prop_map(Step::Push),
        Just(Step::Publish),
        (1u32..6).prop_map(Step::Poll),
        Just(Step::ConsumerSleeps),
        Just(Step::ProducerSleepsIfFull),
    ]
}

fn sge_strategy() -> impl Strategy<Value = Sge> {
    (
        any::<u32>(),
        any::<u64>(),
        prop_oneof![0u32..4096, Just(MAX), any::<u32>()],
    )
        .prop_map(|(stag, offset, length)| Sge {
            stag: Stag(stag),
            offset,
            length,
        })
}

fn work_request() -> impl Strategy<Value = WorkRequest> {
    let sgl = || prop::collection::vec(sge_strategy(), 0..10);
    let remote = || {
        (any::<u32>(), any::<u64>()).prop_map(|(stag, offset)| RemoteBuffer {
            stag: Stag(stag),
            offset,
        })
    };
    prop_oneof![
        (
            any::<u64>(),
            sgl(),
            any::<bool>(),
            prop::option::of(any::<u32>()),
            any::<bool>()
        )
            .prop_map(|(id, sgl, solicited, invalidate, silent)| WorkRequest::Send {
                id,
                sgl,
                solicited,
                invalidate: invalidate.map(Stag),
                silent,
            }),
        (any::<u64>(), sgl(), remote(), any::<bool>()).prop_map(|(id, sgl, remote, silent)| {
            WorkRequest::Write {
                id,
                sgl,
                remote,
                silent,
            }
        }),
        (any::<u64>(), sge_strategy(), remote(), any::<bool>()).prop_map(|(id, sink, remote, silent)| {
            WorkRequest::Read {
                id,
                sink,
                remote,
                silent,
            }
        }),
        (any::<u64>(), sgl()).prop_map(|(id, sgl)| WorkRequest::Receive { id, sgl }),
    ]
}

proptest! {
    /// Any interleaving of pushes, publishes, polls and sleeps, from any start index (wraparound included):
    /// the consumer sees exactly what was published, in order, and a side that sleeps is woken whenever it
    /// must be (a sleeping side only acts after its doorbell was rung; at the end nothing is stuck).
    #[test]
    fn interleavings_deliver_everything_in_order_with_no_lost_wakeup(
        capacity in 1u32..9,
        start in prop_oneof![Just(0u32), Just(u32::MAX - 3), any::<u32>()],
        steps in prop::collection::vec(step(), 0..80),
    ) {
        let (mut p, mut c) = pair(capacity, start);
        let (mut next, mut published) = (0u64, 0u64);
        let mut got = Vec::new();
        let (mut consumer_asleep, mut consumer_bell) = (false, 0u32);
        let (mut producer_asleep, mut room_bell) = (false, 0u32);
        let poll = |c: &mut Consumer<CompletionEntry>, max, got: &mut Vec<_>, room_bell: &mut u32| {
            let polled = drain_all(c, max, got);
            if polled.wake_producer {
                *room_bell += 1;
            }
        };
        for s in steps {
            match s {
                Step::Push(n) => {
                    if producer_asleep {
                        if room_bell == 0 { continue; }
                        room_bell = 0;
                        producer_asleep = false;
                        p.awake();
                    }
                    for _ in 0..n {
                        match p.push(&entry(next)) {
                            Ok(()) => next += 1,
                            Err(RingError::Full { .. }) => break,
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
                Step::Publish => {
                    if p.publish() { consumer_bell += 1; }
                    published = next;
                }
                Step::Poll(max) => {
                    if consumer_asleep {
                        if consumer_bell == 0 { continue; }
                        consumer_bell = 0;
                        consumer_asleep = false;
                        c.awake();
                    }
                    poll(&mut c, max, &mut got, &mut room_bell);
                }
                Step::ConsumerSleeps => {
                    if !consumer_asleep && c.prepare_sleep().unwrap() {
                        consumer_asleep = true;
                    }
                }
                Step::ProducerSleepsIfFull => {
                    if !producer_asleep && p.free().unwrap() == 0 && p.prepare_sleep().unwrap() {
                        producer_asleep = true;
                    }
                }
            }
            prop_assert!(got.len() as u64 <= published, "only published entries are seen");
        }
        // The end: publish, then the consumer runs only as its doorbell allows, and must get everything.
        if p.publish() { consumer_bell += 1; }
        published = next;
        if consumer_asleep {
            prop_assert!(
                consumer_bell > 0 || got.len() as u64 == published,
                "entries {}..{published} published beside a consumer asleep with no doorbell",
                got.len()
            );
            c.awake();
        }
        poll(&mut c, u32::MAX, &mut got, &mut room_bell);
        if producer_asleep {
            prop_assert!(room_bell > 0, "the consumer made room but never woke the waiting producer");
        }
        let want: Vec<_> = (0..published).map(entry).collect();
        prop_assert_eq!(got, want);
    }

    /// Whatever the client library's writer accepts, the daemon's reader hands out unchanged, in order
    /// (sends before receives within one drain); what it refuses (too many SGEs, too long, ring full) it
    /// refuses without writing anything.
    #[test]
    fn what_the_writer_accepts_the_reader_returns_unchanged(
        requests in prop::collection::vec(work_request(), 0..24),
        max_sge in 1u32..9,
    ) {
        let config = QueuePairConfig {
            max_send_sge: max_sge,
            max_receive_sge: max_sge,
            ..QueuePairConfig::on_one_cq(CompletionQueueId(1), 8)
        };
        let layout = QpRingLayout::new(8, 8).unwrap();
        let daemon = layout.create().unwrap();
        let fd = daemon.fd().unwrap().try_clone_to_owned().unwrap();
        let client = Arc::new(SharedMemory::from_fd(fd, layout.bytes()).unwrap());
        let mut reader = QpRingReader::new(daemon, layout, &config, MAX).unwrap();
        let mut writer = QpRingWriter::attach(client, layout, &config, MAX).unwrap();
        let (mut sends, mut receives) = (Vec::new(), Vec::new());
        for wr in &requests {
            match writer.post(wr) {
                Ok(()) if matches!(wr, WorkRequest::Receive { .. }) => receives.push(wr.clone()),
                Ok(()) => sends.push(wr.clone()),
                Err(RingError::Full { capacity: 8 }) => {}
                Err(RingError::SgeCount { count, max }) => {
                    prop_assert!(count > max && max == max_sge.min(8));
                }
                Err(RingError::Length { total, max: MAX }) => prop_assert!(total > u64::from(MAX)),
                Err(e) => prop_assert!(false, "unexpected {e}"),
            }
        }
        writer.publish();
        let mut out = Vec::new();
        let d = reader.drain(64, &mut out).unwrap();
        prop_assert_eq!((d.sends as usize, d.receives as usize), (sends.len(), receives.len()));
        sends.extend(receives);
        prop_assert_eq!(out, sends);
    }

    /// A client writing anything anywhere in its queue pair's mapping (header and entries): the daemon's
    /// reader never panics, hands out only requests that passed validation, and once it reports a fault it
    /// keeps reporting the same one.
    #[test]
    fn a_hostile_client_cannot_break_the_reader(
        posts in 0u32..20,
        scribbles in prop::collection::vec((0usize..8192, any::<u64>()), 0..24),
        header_bias in prop::collection::vec((0usize..3, 0usize..2, any::<u32>()), 0..6),
    ) {
        let config = QueuePairConfig {
            max_send_sge: 2,
            max_receive_sge: 2,
            ..QueuePairConfig::on_one_cq(CompletionQueueId(1), 8)
        };
        let layout = QpRingLayout::new(8, 8).unwrap();
        let daemon = layout.create().unwrap();
        let fd = daemon.fd().unwrap().try_clone_to_owned().unwrap();
        let client = Arc::new(SharedMemory::from_fd(fd, layout.bytes()).unwrap());
        let mut reader = QpRingReader::new(daemon, layout, &config, 4096).unwrap();
        let mut writer = QpRingWriter::attach(client.clone(), layout, &config, 4096).unwrap();
        for i in 0..posts {
            let wr = if i % 3 == 0 {
                let sgl = vec![Sge { stag: Stag(1), offset: 0, length: 8 }];
                WorkRequest::Receive { id: u64::from(i), sgl }
            } else {
                WorkRequest::Send { id: u64::from(i), sgl: vec![], solicited: false, invalidate: None, silent: false }
            };
            let _ = writer.post(&wr);
        }
        writer.publish();
        let mut out = Vec::new();
        let mut fault = None;
        for round in 0..4 {
            // Scribble words anywhere (the mapping is 8-byte aligned; stay inside it) and bend the index
            // words of either ring towards plausible-but-wrong values.
            let quarter = |r: usize| r * scribbles.len() / 4;
            for &(offset, value) in &scribbles[quarter(round)..quarter(round + 1)] {
                let offset = (offset % (layout.bytes() / 8)) * 8;
                client.write_at(offset, &value.to_le_bytes()).unwrap();
            }
            for &(ring, word, value) in &header_bias {
                if ring == round % 3 {
                    let base = if ring == 0 { layout.send_offset() } else { layout.receive_offset() };
                    let offset = base + CACHE_LINE * (1 + word);
                    client.write_at(offset, &(value % 40).to_le_bytes()).unwrap();
                }
            }
            let before = out.len();
            match reader.drain(4, &mut out) {
                Ok(d) => {
                    prop_assert!(fault.is_none(), "a faulted reader never drains again");
                    prop_assert_eq!(out.len() - before, (d.sends + d.receives) as usize);
                    prop_assert!(d.sends <= 4 && d.receives <= 4);
                }
                Err(f) => {
                    if let Some(old) = &fault { prop_assert_eq!(old, &f); }
                    prop_assert_eq!(reader.fault(), Some(&f));
                    prop_assert_eq!(f.status(), crate::NdStatus::InvalidParameter);
                    fault = Some(f);
                }
            }
            let _ = reader.prepare_sleep();
        }
        for wr in &out {
            let (sgl, max) = match wr {
                WorkRequest::Send { sgl, .. } | WorkRequest::Write { sgl, .. } => (sgl.clone(), 2),
                WorkRequest::Read { sink, .. } => (vec![*sink], 2),
                WorkRequest::Receive { sgl, .. } => (sgl.clone(), 2),
            };
            prop_assert!(sgl.len() <= max);
            prop_assert!(sgl.iter().map(|s| u64::from(s.length)).sum::<u64>() <= 4096);
        }
    }
}

#[test]
fn a_bad_entry_faults_the_reader_after_the_good_ones() {
    let config = QueuePairConfig::on_one_cq(CompletionQueueId(1), 4);
    let layout = QpRingLayout::new(4, 4).unwrap();
    let daemon = layout.create().unwrap();
    let fd = daemon.fd().unwrap().try_clone_to_owned().unwrap();
    let client = Arc::new(SharedMemory::from_fd(fd, layout.bytes()).unwrap());
    let mut reader = QpRingReader::new(daemon, layout, &config, MAX).unwrap();
    let mut writer = QpRingWriter::attach(client.clone(), layout, &config, MAX).unwrap();
    let send = |id| WorkRequest::Send {
        id,
        sgl: vec![],
        solicited: true,
        invalidate: None,
        silent: false,
    };
    for id in 0..3 {
        writer.post(&send(id)).unwrap();
    }
    let rx = WorkRequest::Receive { id: 9, sgl: vec![] };
    writer.post(&rx).unwrap();
    assert!(!writer.publish(), "the daemon has not slept yet");
    // Entry 1 of the send ring gets opcode 7.
    let slot1 = layout.send_offset() + shared::HEADER_LEN + SendEntry::SIZE;
    client.write_at(slot1, &[7]).unwrap();
    let mut out = Vec::new();
    let f = reader.drain(16, &mut out).unwrap_err();
    assert_eq!(out, vec![send(0)], "the good entry before the bad one");
    assert_eq!(
        f,
        RingFault {
            ring: RingKind::Send,
            entry: Some(1),
            error: RingError::Opcode(7)
        }
    );
    assert_eq!(f.to_error().status, crate::NdStatus::InvalidParameter);
    assert_eq!(f.to_string(), "Send ring entry 1: unknown opcode 7");
    assert_eq!(reader.drain(16, &mut out), Err(f.clone()), "faulted for good");
    assert_eq!(reader.prepare_sleep(), Err(f));
    assert_eq!(out.len(), 1);
}

#[test]
fn the_reader_sleeps_only_when_both_rings_are_empty() {
    let config = QueuePairConfig::on_one_cq(CompletionQueueId(1), 4);
    let layout = QpRingLayout::new(4, 2).unwrap();
    let daemon = layout.create().unwrap();
    let fd = daemon.fd().unwrap().try_clone_to_owned().unwrap();
    let client = Arc::new(SharedMemory::from_fd(fd, layout.bytes()).unwrap());
    let mut reader = QpRingReader::new(daemon, layout, &config, MAX).unwrap();
    let mut writer = QpRingWriter::attach(client, layout, &config, MAX).unwrap();
    assert_eq!(reader.prepare_sleep(), Ok(true));
    writer.post(&WorkRequest::Receive { id: 1, sgl: vec![] }).unwrap();
    assert!(writer.publish(), "the daemon sleeps: ring");
    assert_eq!(reader.prepare_sleep(), Ok(false), "a receive is waiting");
    let mut out = Vec::new();
    let d = reader.drain(1, &mut out).unwrap();
    assert_eq!((d.sends, d.receives, d.more), (0, 1, false));
    writer.post(&WorkRequest::Receive { id: 2, sgl: vec![] }).unwrap();
    writer.post(&WorkRequest::Receive { id: 3, sgl: vec![] }).unwrap();
    assert_eq!(
        writer.post(&WorkRequest::Receive { id: 4, sgl: vec![] }),
        Err(RingError::Full { capacity: 2 })
    );
    assert!(!writer.publish(), "the daemon is awake");
    let d = reader.drain(1, &mut out).unwrap();
    assert!(d.more, "one left past max");
}

#[test]
fn the_client_refuses_rings_that_are_not_what_the_daemon_said() {
    let config = QueuePairConfig::on_one_cq(CompletionQueueId(1), 4);
    let layout = QpRingLayout::new(4, 4).unwrap();
    let daemon = layout.create().unwrap();
    let other = QpRingLayout::new(8, 4).unwrap();
    assert!(matches!(
        QpRingWriter::attach(daemon.clone(), other, &config, MAX),
        Err(RingError::Geometry(_))
    ));
    daemon.write_at(0, b"XXXX").unwrap();
    assert!(matches!(
        QpRingWriter::attach(daemon, layout, &config, MAX),
        Err(RingError::Geometry(_))
    ));
}

#[test]
fn completions_overflow_in_order_and_a_scribbled_index_stops_the_writer() {
    let g = cq::geometry(2).unwrap();
    let (daemon, mut writer) = CqRingWriter::create(g).unwrap();
    let fd = daemon.fd().unwrap().try_clone_to_owned().unwrap();
    let client = Arc::new(SharedMemory::from_fd(fd, cq::bytes(g)).unwrap());
    let mut reader = CqRingReader::attach(client.clone(), g).unwrap();
    let c = |wr_id| Completion {
        qp: QueuePairId(3),
        wr_id,
        op: CompletionOp::Send,
        status: crate::NdStatus::Success,
        bytes: 0,
        solicited: false,
        invalidated: None,
    };
    assert_eq!(reader.prepare_sleep(), Ok(true));
    for id in 0..5 {
        writer.push(c(id));
    }
    assert_eq!(writer.flush(), Ok(true), "the client sleeps: ring it");
    assert_eq!(writer.overflowed(), 3);
    reader.awake();
    let mut out = Vec::new();
    let polled = reader.poll(16, &mut out).unwrap();
    assert!(polled.wake_producer, "the writer waits for room");
    assert_eq!(writer.flush(), Ok(false));
    assert_eq!(writer.overflowed(), 1);
    reader.poll(16, &mut out).unwrap();
    writer.flush().unwrap();
    reader.poll(16, &mut out).unwrap();
    assert_eq!(writer.overflowed(), 0);
    assert_eq!(out, (0..5).map(c).collect::<Vec<_>>());

    // The client moves the consumer index past what was published.
    client.write_at(2 * CACHE_LINE, &1000u32.to_le_bytes()).unwrap();
    writer.push(c(9));
    writer.push(c(10));
    writer.push(c(11));
    let f = writer.flush().unwrap_err();
    assert!(matches!(f.error, RingError::ConsumerIndex { .. }), "{f}");
    assert_eq!(writer.fault(), Some(&f));
    assert_eq!(writer.overflowed(), 0, "nothing is kept for a broken ring");
    writer.push(c(12));
    assert_eq!(writer.flush(), Err(f));
}

#[test]
fn two_threads_with_doorbells_deliver_every_entry_in_order() {
    const N: u64 = 20_000;
    for spin in [SpinConfig::default(), SpinConfig { spins: 200 }] {
        let (mut p, mut c) = pair(16, 0);
        let data = Arc::new(Doorbell::new().unwrap());
        let room = Arc::new(Doorbell::new().unwrap());
        let (data2, room2) = (data.clone(), room.clone());
        let consumer = std::thread::spawn(move || {
            let mut got = Vec::with_capacity(N as usize);
            while (got.len() as u64) < N {
                let mut wake = false;
                let ready = spin.spin_until(|| {
                    let polled = drain_all(&mut c, 64, &mut got);
                    wake |= polled.wake_producer;
                    polled.taken > 0
                });
                if wake {
                    room2.ring().unwrap();
                }
                if !ready && (got.len() as u64) < N && c.prepare_sleep().unwrap() {
                    data2.wait(None).unwrap();
                    data2.drain().unwrap();
                    c.awake();
                }
            }
            got
        });
        let mut n = 0;
        while n < N {
            match p.push(&entry(n)) {
                Ok(()) => n += 1,
                Err(RingError::Full { .. }) => {
                    if p.publish() {
                        data.ring().unwrap();
                    }
                    if !spin.spin_until(|| p.free().unwrap() > 0) && p.prepare_sleep().unwrap() {
                        room.wait(None).unwrap();
                        room.drain().unwrap();
                        p.awake();
                    }
                    continue;
                }
                Err(e) => panic!("{e}"),
            }
            if n % 5 == 0 && p.publish() {
                data.ring().unwrap();
            }
        }
        if p.publish() {
            data.ring().unwrap();
        }
        let got = consumer.join().unwrap();
        assert_eq!(got.len() as u64, N);
        assert!(
            got.iter().enumerate().all(|(i, e)| *e == entry(i as u64)),
            "{spin:?}"
        );
    }
}

/// The environment variable that turns [`another_process_posts_through_the_rings`] into its child.
const CHILD_ENV: &str = "SOFT_RDMA_TEST_RING_CHILD";
const CHILD_POSTS: u64 = 5_000;

fn child_layout() -> (QueuePairConfig, QpRingLayout) {
    let config = QueuePairConfig::on_one_cq(CompletionQueueId(1), 8);
    (config, QpRingLayout::new(8, 8).unwrap())
}

fn child_request(i: u64) -> WorkRequest {
    let sgl = vec![Sge {
        stag: Stag(i as u32),
        offset: i,
        length: 1,
    }];
    if i.is_multiple_of(4) {
        WorkRequest::Receive { id: i, sgl }
    } else {
        WorkRequest::Send {
            id: i,
            sgl,
            solicited: i.is_multiple_of(3),
            invalidate: None,
            silent: false,
        }
    }
}

/// The child's side: attach to the rings whose memfd and doorbell it inherited, post every request,
/// ringing only when the daemon's side sleeps.
fn ring_child(fds: &str) {
    use std::os::fd::{FromRawFd, OwnedFd};
    let (mem, bell) = fds.split_once(',').unwrap();
    let (config, layout) = child_layout();
    // SAFETY: the parent passed these two descriptors open (close-on-exec cleared) for this process alone.
    let (mem, bell) = unsafe {
        (
            OwnedFd::from_raw_fd(mem.parse().unwrap()),
            OwnedFd::from_raw_fd(bell.parse().unwrap()),
        )
    };
    let mem = Arc::new(SharedMemory::from_fd(mem, layout.bytes()).unwrap());
    let bell = Doorbell::from_fd(bell);
    let mut writer = QpRingWriter::attach(mem, layout, &config, MAX).unwrap();
    for i in 0..CHILD_POSTS {
        loop {
            match writer.post(&child_request(i)) {
                Ok(()) => break,
                Err(RingError::Full { .. }) => {
                    if writer.publish() {
                        bell.ring().unwrap();
                    }
                    std::thread::yield_now();
                }
                Err(e) => panic!("{e}"),
            }
        }
        if writer.publish() {
            bell.ring().unwrap();
        }
    }
}

#[test]
fn another_process_posts_through_the_rings() {
    if let Ok(fds) = std::env::var(CHILD_ENV) {
        return ring_child(&fds);
    }
    use std::os::fd::AsRawFd;
    let (config, layout) = child_layout();
    let daemon = layout.create().unwrap();
    let bell = Doorbell::new().unwrap();
    let (mem_fd, bell_fd) = (
        daemon.fd().unwrap().try_clone_to_owned().unwrap(),
        bell.try_clone_fd().unwrap(),
    );
    for fd in [&mem_fd, &bell_fd] {
        nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty())).unwrap();
    }
    let mut reader = QpRingReader::new(daemon, layout, &config, MAX).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "rings::tests::another_process_posts_through_the_rings",
            "--test-threads=1",
        ])
        .env(
            CHILD_ENV,
            format!("{},{}", mem_fd.as_raw_fd(), bell_fd.as_raw_fd()),
        )
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    drop((mem_fd, bell_fd));
    let mut out = Vec::new();
    let (mut sends, mut receives) = (Vec::new(), Vec::new());
    while ((sends.len() + receives.len()) as u64) < CHILD_POSTS {
        out.clear();
        let d = reader.drain(16, &mut out).unwrap();
        for wr in out.drain(..) {
            match wr {
                WorkRequest::Receive { .. } => receives.push(wr),
                _ => sends.push(wr),
            }
        }
        if d.sends + d.receives == 0 && reader.prepare_sleep().unwrap() {
            // Asleep with an empty ring: only the doorbell may wake us. The poll timeout only lets us
            // notice a child that ended without ringing (a lost wakeup), by its exit, not by the clock.
            while !bell.wait(Some(std::time::Duration::from_secs(1))).unwrap() {
                if let Some(status) = child.try_wait().unwrap() {
                    assert!(
                        bell.wait(Some(std::time::Duration::ZERO)).unwrap(),
                        "the child ended ({status}) and never rang the sleeping reader"
                    );
                }
            }
            bell.drain().unwrap();
            reader.awake();
        }
    }
    assert!(child.wait().unwrap().success());
    let want = |receive: bool| -> Vec<WorkRequest> {
        (0..CHILD_POSTS)
            .filter(|i| i.is_multiple_of(4) == receive)
            .map(child_request)
            .collect()
    };
    assert_eq!(sends, want(false), "every Send, in order");
    assert_eq!(receives, want(true), "every Receive, in order");
}

/// The largest completion ring's memfd: [`cq::MAX_RING_ENTRIES`] entries of 32 bytes and the header, in
/// whole pages.
fn largest_cq_ring_bytes() -> usize {
    (shared::HEADER_LEN + cq::MAX_RING_ENTRIES as usize * CompletionEntry::SIZE).next_multiple_of(4096)
}

proptest! {
    /// Every depth a client may ask for (and any other u32: the geometry never fails) gives a ring that is a
    /// power of two, holds the depth up to [`cq::MAX_RING_ENTRIES`] and never more, in at most 2 MiB and a
    /// page; the daemon and the client compute the same one.
    #[test]
    fn cq_geometry_is_bounded_for_every_depth(depth in prop_oneof![
        1..=crate::engine::limits::MAX_COMPLETION_QUEUE_DEPTH,
        any::<u32>(),
    ]) {
        let g = cq::geometry(depth).unwrap();
        let cap = g.capacity();
        prop_assert!(cap.is_power_of_two());
        prop_assert!(cap <= cq::MAX_RING_ENTRIES);
        prop_assert!(cap >= depth.clamp(1, cq::MAX_RING_ENTRIES));
        prop_assert!(depth > cq::MAX_RING_ENTRIES || cap < depth.max(1).saturating_mul(2));
        prop_assert_eq!(g.entry_size(), CompletionEntry::SIZE);
        let bytes = cq::bytes(g);
        prop_assert!(bytes.is_multiple_of(4096) && bytes >= g.bytes());
        prop_assert!(bytes <= largest_cq_ring_bytes());
        prop_assert_eq!(g, cq::geometry(depth).unwrap());
    }
}

#[test]
fn deep_completion_queues_have_a_2_mib_ring() {
    assert_eq!(CompletionEntry::SIZE, 32);
    assert_eq!(largest_cq_ring_bytes(), 2 * 1024 * 1024 + 4096);
    for depth in [
        cq::MAX_RING_ENTRIES,
        cq::MAX_RING_ENTRIES + 1,
        262_144, // libfabric RxM's default (FI_UNIVERSE_SIZE 256 x its RX size 1024)
        crate::engine::limits::MAX_COMPLETION_QUEUE_DEPTH, // kernel siw's SIW_MAX_CQE
        u32::MAX,
    ] {
        let g = cq::geometry(depth).unwrap();
        assert_eq!(g.capacity(), cq::MAX_RING_ENTRIES, "{depth}");
        assert_eq!(cq::bytes(g), largest_cq_ring_bytes(), "{depth}");
    }
    assert_eq!(cq::geometry(4096).unwrap().capacity(), 4096);
    assert_eq!(cq::geometry(0).unwrap().capacity(), 1);
}

/// The largest ring, with its free-running indices wrapping past u32::MAX while it is full: room is
/// counted right, a full ring refuses, and everything comes out in order.
#[test]
fn the_largest_ring_wraps_its_indices_when_full() {
    let start = u32::MAX - 100;
    let (mut p, mut c) = pair(cq::MAX_RING_ENTRIES, start);
    assert_eq!(p.capacity(), cq::MAX_RING_ENTRIES);
    for round in 0..2u64 {
        let base = round * u64::from(cq::MAX_RING_ENTRIES);
        for n in 0..u64::from(cq::MAX_RING_ENTRIES) {
            p.push(&entry(base + n)).unwrap();
        }
        assert_eq!(
            p.push(&entry(0)),
            Err(RingError::Full {
                capacity: cq::MAX_RING_ENTRIES
            })
        );
        p.publish();
        assert_eq!(c.available(), Ok(cq::MAX_RING_ENTRIES));
        let mut got = Vec::new();
        let polled = drain_all(&mut c, u32::MAX, &mut got);
        assert_eq!(polled.taken, cq::MAX_RING_ENTRIES);
        assert!(got.iter().enumerate().all(|(n, e)| *e == entry(base + n as u64)));
        assert_eq!(p.free(), Ok(cq::MAX_RING_ENTRIES));
    }
    assert!(c.index() < start, "the indices wrapped");
}

/// A queue deeper than its ring: what does not fit waits in the writer's overflow, in order, and comes out
/// as the client takes entries.
#[test]
fn a_queue_deeper_than_its_ring_overflows_in_order() {
    let g = cq::geometry(262_144).unwrap();
    let (daemon, mut writer) = CqRingWriter::create(g).unwrap();
    let fd = daemon.fd().unwrap().try_clone_to_owned().unwrap();
    let client = Arc::new(SharedMemory::from_fd(fd, cq::bytes(g)).unwrap());
    let mut reader = CqRingReader::attach(client, g).unwrap();
    let n = u64::from(cq::MAX_RING_ENTRIES) + 1000;
    let c = |wr_id| Completion {
        qp: QueuePairId(1),
        wr_id,
        op: CompletionOp::Receive,
        status: crate::NdStatus::Success,
        bytes: 8,
        solicited: false,
        invalidated: None,
    };
    for id in 0..n {
        writer.push(c(id));
    }
    writer.flush().unwrap();
    assert_eq!(writer.overflowed(), 1000);
    let mut out = Vec::new();
    while (out.len() as u64) < n {
        let polled = reader.poll(4096, &mut out).unwrap();
        assert!(polled.taken > 0);
        writer.flush().unwrap();
    }
    assert_eq!(writer.overflowed(), 0);
    assert!(out.iter().enumerate().all(|(i, x)| x.wr_id == i as u64));
}
