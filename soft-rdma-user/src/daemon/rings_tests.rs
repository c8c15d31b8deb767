//! The daemon's rings against a real engine: what a create passes, the bounds, and a client scribbling over
//! its ring (that queue pair alone goes to Error, its requests complete with the fault's status).

use std::os::fd::OwnedFd;
use std::time::Instant;

use super::*;
use crate::engine::cm::CmConfig;
use crate::engine::port_space::tests::FakeHost;
use crate::engine::requests::{CmRequest, CmResponse, RequestId};
use crate::engine::verbs::{QueuePairState, Sge, Stag};
use crate::rings::cq::CqRingReader;
use crate::rings::qp::QpRingWriter;

const S: SessionId = SessionId(1);
const OTHER: SessionId = SessionId(2);

struct Rig {
    rnic: Rnic,
    rings: Rings,
    woken: mpsc::UnboundedReceiver<SessionId>,
    limits: Limits,
}

fn rig(limits: Limits) -> Rig {
    let mut config = CmConfig::default_siw_compatible();
    config.limits = limits.clone();
    let max = config.adapter.max_transfer_length;
    let mut rnic = Rnic::new(config, Box::new(FakeHost::default()), 1);
    rnic.open_session(S);
    rnic.open_session(OTHER);
    let (tx, woken) = mpsc::unbounded_channel();
    Rig {
        rnic,
        rings: Rings::new(limits.clone(), max, tx),
        woken,
        limits,
    }
}

impl Rig {
    fn request(&mut self, session: SessionId, r: CmRequest) -> Result<CmResponse, Error> {
        self.rnic.handle_request(Instant::now(), session, RequestId(1), r)
    }

    fn cq(&mut self, session: SessionId, depth: u32) -> Result<(CompletionQueueId, Vec<OwnedFd>), Error> {
        let Ok(CmResponse::CompletionQueue(cq)) =
            self.request(session, CmRequest::CreateCompletionQueue { depth })
        else {
            panic!("CreateCompletionQueue");
        };
        let fds = self.rings.create_cq(session, cq, depth)?;
        Ok((cq, fds))
    }

    fn config(cq: CompletionQueueId) -> QueuePairConfig {
        QueuePairConfig {
            send_cq: cq,
            receive_cq: cq,
            send_depth: 4,
            receive_depth: 4,
            max_send_sge: 2,
            max_receive_sge: 2,
            pd: crate::engine::ids::PdId(0),
        }
    }

    fn qp(
        &mut self,
        session: SessionId,
        cq: CompletionQueueId,
    ) -> Result<(QueuePairId, Vec<OwnedFd>), Error> {
        let config = Self::config(cq);
        let Ok(CmResponse::QueuePair(qp)) = self.request(session, CmRequest::CreateQueuePair { config })
        else {
            panic!("CreateQueuePair");
        };
        let fds = self.rings.create_qp(session, qp, &config)?;
        Ok((qp, fds))
    }

    fn status(&mut self, session: SessionId, qp: QueuePairId) -> crate::engine::verbs::QueuePairStatus {
        match self.request(session, CmRequest::QueryQueuePair { qp }) {
            Ok(CmResponse::QueuePairInfo(s)) => s,
            r => panic!("QueryQueuePair: {r:?}"),
        }
    }

    fn state(&mut self, session: SessionId, qp: QueuePairId) -> QueuePairState {
        self.status(session, qp).state
    }

    /// What the client side does with a queue pair's descriptors: maps its rings, rings the doorbell.
    fn writer(&self, fds: Vec<OwnedFd>) -> (Arc<SharedMemory>, QpRingWriter, Doorbell) {
        let [memfd, bell]: [OwnedFd; 2] = fds.try_into().expect("two descriptors");
        let layout = QpRingLayout::new(4, 4).unwrap();
        let mem = Arc::new(SharedMemory::from_fd(memfd, layout.bytes()).unwrap());
        let config = Self::config(CompletionQueueId(0));
        let w = QpRingWriter::attach(mem.clone(), layout, &config, 1 << 20).unwrap();
        (mem, w, Doorbell::from_fd(bell))
    }

    /// Delivers what the engine completed, as the event loop does.
    fn deliver(&mut self) {
        for (session, cq, entries) in self.rnic.poll_completions() {
            self.rings.complete(session, cq, entries);
        }
    }
}

fn receive(stag: Stag, id: u64) -> WorkRequest {
    WorkRequest::Receive {
        id,
        sgl: vec![Sge {
            stag,
            offset: 0,
            length: 8,
        }],
    }
}

#[tokio::test]
async fn creates_pass_their_descriptors_and_closes_give_back_what_they_held() {
    let mut r = rig(Limits::default());
    let (cq, cq_fds) = r.cq(S, 16).unwrap();
    assert_eq!(cq_fds.len(), 3, "memfd, completion doorbell, session doorbell");
    let (qp, qp_fds) = r.qp(S, cq).unwrap();
    assert_eq!(qp_fds.len(), 2, "memfd, session doorbell");
    let bytes = (cq::bytes(cq::geometry(16).unwrap()) + QpRingLayout::new(4, 4).unwrap().bytes()) as u64;
    assert_eq!(
        r.rings.held(),
        (bytes, 2),
        "the session's doorbell and the queue's"
    );
    r.rings.close_qp(S, qp);
    r.rings.close_cq(S, cq);
    assert_eq!(r.rings.held(), (0, 1));
    r.rings.close_session(S);
    assert_eq!(r.rings.held(), (0, 0));
}

#[tokio::test]
async fn past_a_ring_bound_a_create_is_insufficient_resources() {
    let qp_bytes = QpRingLayout::new(4, 4).unwrap().bytes() as u64;
    let cq_bytes = cq::bytes(cq::geometry(16).unwrap()) as u64;
    let cases = [
        (
            Limits {
                max_ring_bytes_per_session: cq_bytes + qp_bytes,
                ..Limits::default()
            },
            "max_ring_bytes_per_session",
        ),
        (
            Limits {
                max_ring_bytes: cq_bytes + qp_bytes,
                ..Limits::default()
            },
            "max_ring_bytes",
        ),
        (
            Limits {
                max_doorbells_per_session: 2,
                ..Limits::default()
            },
            "max_doorbells_per_session",
        ),
    ];
    for (limits, what) in cases {
        let mut r = rig(limits);
        let (cq, _) = r.cq(S, 16).unwrap();
        r.qp(S, cq).unwrap();
        let e = match what {
            "max_doorbells_per_session" => r.cq(S, 16).unwrap_err(),
            _ => r.qp(S, cq).unwrap_err(),
        };
        assert_eq!(e.status, NdStatus::InsufficientResources, "{what}");
        assert!(e.context.contains(what), "{what}: {e}");
    }
    // The daemon-wide doorbell bound holds across sessions.
    let mut r = rig(Limits {
        max_doorbells: 3,
        ..Limits::default()
    });
    r.cq(S, 16).unwrap();
    let e = r.cq(OTHER, 16).unwrap_err();
    assert_eq!(e.status, NdStatus::InsufficientResources);
    assert!(e.context.contains("max_doorbells"), "{e}");
    assert_eq!(r.limits.max_doorbells, 3);
}

#[tokio::test]
async fn a_scribbled_ring_moves_its_queue_pair_alone_to_error() {
    let mut r = rig(Limits::default());
    let (cq, cq_fds) = r.cq(S, 16).unwrap();
    let (bad, bad_fds) = r.qp(S, cq).unwrap();
    let (good, good_fds) = r.qp(S, cq).unwrap();
    let (_bad_mem, mut bad_w, bell) = r.writer(bad_fds);
    let (_good_mem, mut good_w, _) = r.writer(good_fds);
    let region = SharedMemory::create("test-region", 4096).unwrap();
    let Ok(CmResponse::MemoryRegion { stag, .. }) =
        r.rnic
            .register_memory(S.into(), Box::new(region), crate::engine::verbs::Access::ALL, 0)
    else {
        panic!("RegisterMemory");
    };

    // A Receive on each; the daemon sleeps, so the publish asks for the doorbell.
    bad_w.post(&receive(stag, 1)).unwrap();
    assert!(bad_w.publish(), "the daemon's reader starts asleep");
    bell.ring().unwrap();
    good_w.post(&receive(stag, 2)).unwrap();
    good_w.publish();
    r.rings.woken(&mut r.rnic, S);
    assert!(r.woken.try_recv().is_err(), "both rings drained in one pass");

    // The client scribbles over its send ring's producer index: far past what the ring holds.
    let layout = QpRingLayout::new(4, 4).unwrap();
    _bad_mem
        .write_at(
            layout.send_offset() + crate::rings::shared::CACHE_LINE,
            &1000u32.to_le_bytes(),
        )
        .unwrap();
    r.rings.woken(&mut r.rnic, S);
    assert_eq!(r.state(S, bad), QueuePairState::Error);
    assert_ne!(r.state(S, good), QueuePairState::Error);

    // The bad queue pair's Receive completes with the fault's status, through the completion ring.
    r.deliver();
    let [memfd, _, _]: [OwnedFd; 3] = cq_fds.try_into().unwrap();
    let g = cq::geometry(16).unwrap();
    let mem = Arc::new(SharedMemory::from_fd(memfd, cq::bytes(g)).unwrap());
    let mut reader = CqRingReader::attach(mem, g).unwrap();
    let mut out = Vec::new();
    reader.poll(16, &mut out).unwrap();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(
        (out[0].qp, out[0].wr_id, out[0].status),
        (bad, 1, NdStatus::InvalidParameter)
    );

    // The good one still takes requests; the bad one's ring is never read again.
    good_w.post(&receive(stag, 3)).unwrap();
    good_w.publish();
    r.rings.woken(&mut r.rnic, S);
    assert_ne!(r.state(S, good), QueuePairState::Error);
    r.deliver();
    out.clear();
    reader.poll(16, &mut out).unwrap();
    assert!(
        out.is_empty(),
        "nothing completes on the good queue pair: {out:?}"
    );
}

/// Posts 4 Receives naming no region (each completes at once, ACCESS_VIOLATION) and wakes the daemon;
/// delivers what the engine completed, as the event loop does. Returns how many completed.
fn burst(r: &mut Rig, w: &mut QpRingWriter, id: &mut u64) -> usize {
    for _ in 0..4 {
        *id += 1;
        w.post(&receive(Stag(0xdead), *id)).unwrap();
    }
    w.publish();
    r.rings.woken(&mut r.rnic, S);
    deliver_counted(r)
}

fn deliver_counted(r: &mut Rig) -> usize {
    let mut n = 0;
    for (session, cq, entries) in r.rnic.poll_completions() {
        n += entries.len();
        r.rings.complete(session, cq, entries);
    }
    n
}

/// A client that posts but never takes completions: once the completions waiting for room in its ring
/// reach `max_queue_entries_per_session`, its queue pairs' rings are not read; taking completions (and
/// ringing the session's doorbell, as the library does) lets them be read again.
#[tokio::test]
async fn a_client_that_takes_no_completions_is_not_read_from() {
    let mut r = rig(Limits {
        max_queue_entries_per_session: 8,
        ..Limits::default()
    });
    let (cq, cq_fds) = r.cq(S, 1).unwrap();
    let (_, qp_fds) = r.qp(S, cq).unwrap();
    let (_mem, mut w, _) = r.writer(qp_fds);
    let mut id = 0;
    // The ring holds one completion; 3, then 7, then 11 wait for room.
    for _ in 0..3 {
        assert_eq!(burst(&mut r, &mut w, &mut id), 4);
    }
    // 11 waiting, past 8: the next burst stays in the queue pair's ring.
    assert_eq!(burst(&mut r, &mut w, &mut id), 0);
    assert_eq!(r.rings.overflow, 11);
    // The client takes completions one at a time, ringing the session's doorbell each time the daemon asks.
    let [memfd, _, _]: [OwnedFd; 3] = cq_fds.try_into().unwrap();
    let g = cq::geometry(1).unwrap();
    let mem = Arc::new(SharedMemory::from_fd(memfd, cq::bytes(g)).unwrap());
    let mut reader = CqRingReader::attach(mem, g).unwrap();
    let mut taken = Vec::new();
    let mut rounds = 0;
    let resumed = loop {
        rounds += 1;
        let p = reader.poll(1, &mut taken).unwrap();
        assert!(p.wake_producer, "the daemon waits for room");
        r.rings.woken(&mut r.rnic, S);
        let n = deliver_counted(&mut r);
        if n > 0 {
            break n;
        }
    };
    assert_eq!((rounds, resumed), (4, 4), "read again once fewer than 8 wait");
    assert_eq!(
        taken.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        [1, 2, 3, 4],
        "in order"
    );
    r.rings.close_session(S);
    assert_eq!(r.rings.overflow, 0);
}

fn rq_posted(r: &mut Rig, qp: QueuePairId) -> u32 {
    r.status(S, qp).stats.rq_posted
}

#[tokio::test]
async fn while_the_loop_spins_hot_queue_pairs_post_without_a_doorbell_and_idle_ones_keep_ringing() {
    let mut r = rig(Limits::default());
    let (cq, _cq_fds) = r.cq(S, 16).unwrap();
    let (qp, fds) = r.qp(S, cq).unwrap();
    let (_mem, mut w, _bell) = r.writer(fds);
    let (idle, idle_fds) = r.qp(S, cq).unwrap();
    let (_idle_mem, mut idle_w, _) = r.writer(idle_fds);
    let region = SharedMemory::create("test-region", 4096).unwrap();
    let Ok(CmResponse::MemoryRegion { stag, .. }) =
        r.rnic
            .register_memory(S.into(), Box::new(region), crate::engine::verbs::Access::ALL, 0)
    else {
        panic!("RegisterMemory");
    };
    assert!(!r.rings.sleep(&mut r.rnic), "not spinning yet");
    // The doorbell brings `qp`'s first post: it is hot from now on.
    w.post(&receive(stag, 1)).unwrap();
    assert!(w.publish(), "asleep: the doorbell is asked for");
    r.rings.woken(&mut r.rnic, S);
    assert_eq!(rq_posted(&mut r, qp), 1);

    // Spinning: the hot queue pair's flags are clear, its client publishes without ringing.
    assert!(!r.rings.poll_awake(&mut r.rnic), "nothing new");
    w.post(&receive(stag, 2)).unwrap();
    assert!(!w.publish(), "hot and polled: no doorbell");
    assert!(r.rings.poll_awake(&mut r.rnic));
    assert_eq!(rq_posted(&mut r, qp), 2);
    // A queue pair that did not post since the loop was last idle is not polled: its client rings.
    idle_w.post(&receive(stag, 3)).unwrap();
    assert!(idle_w.publish(), "not hot: the doorbell is asked for");
    r.rings.woken(&mut r.rnic, S);
    assert_eq!(rq_posted(&mut r, idle), 1);
    // Woken during the spin, it is hot now, and polled.
    idle_w.post(&receive(stag, 4)).unwrap();
    assert!(!idle_w.publish(), "hot since its doorbell: no doorbell");
    assert!(r.rings.poll_awake(&mut r.rnic));
    assert_eq!(rq_posted(&mut r, idle), 2);

    // The spin ends: what arrived in between is posted, and the flags are set again.
    w.post(&receive(stag, 5)).unwrap();
    w.publish();
    assert!(r.rings.sleep(&mut r.rnic));
    assert_eq!(rq_posted(&mut r, qp), 3, "posted on the way to sleep");
    w.post(&receive(stag, 6)).unwrap();
    assert!(w.publish(), "asleep again: the doorbell is asked for");
    assert!(!r.rings.sleep(&mut r.rnic), "already asleep");
    r.rings.woken(&mut r.rnic, S);
    assert_eq!(rq_posted(&mut r, qp), 4);
}
