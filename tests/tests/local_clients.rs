//! Bad input from local clients, isolation and limits, and socket permissions: real soft-rdmad daemons (in a pair of
//! network namespaces where a network is needed), raw Unix-socket clients speaking hand-made frames
//! (docs/protocol.md), CLI clients run as another user (`setpriv`), a client vanishing mid-everything.
//! (Killed clients and daemons are `local_faults`.) Every case checks that the sessions and connections that did
//! nothing wrong keep working. Needs root (namespaces, `setpriv`), and the built binaries
//! (`cargo build -p soft-rdma-user`).

use std::io::Write;
use std::net::Shutdown;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use soft_rdma::client::Adapter;
use soft_rdma::engine::requests::{ConnectorId, ListenerId, RequestId, SharedEndpointId};
// The protocol's own request and answer types, under the names this suite has always used for them.
use soft_rdma::NdStatus;
use soft_rdma::engine::verbs::{
    Access, CompletionQueueId, MemoryRegionId, QueuePairConfig, QueuePairId, QueuePairState,
};
use soft_rdma::uds::messages::{ObjectRef, Request as CmRequest, Response as CmResponse};
use soft_rdma::uds::proto::{ClientMessage, MAX_CLIENT_FRAME, PROTOCOL_VERSION, ServerMessage};
use soft_rdma_tests::ends::{Daemons, queued_offers};
use soft_rdma_tests::faults::*;
use soft_rdma_tests::local::{Raw, frame, hello};
use soft_rdma_tests::ops::{err_status as status, eventually, within};
use soft_rdma_tests::{Daemon, Side, TestNet, cli_binary};

/// A context with its numbers taken out: "no connector 7 in this session" and "no connector 999999 in this
/// session" are the same answer.
fn without_digits(s: &str) -> String {
    s.chars().filter(|c| !c.is_ascii_digit()).collect()
}

/// One malformed conversation: what the raw client sends (after a Hello and its Welcome if `hello`), and
/// what the daemon's Goodbye must say.
struct Bad {
    name: &'static str,
    hello: bool,
    bytes: Vec<u8>,
    /// Half-close the socket (SHUT_WR) after the bytes: the daemon sees the end of the stream but can still
    /// answer.
    half_close: bool,
    expect: &'static str,
}

fn bad_inputs() -> Vec<Bad> {
    let with_extra_byte = {
        // A Hello frame whose length counts one byte more than the message.
        let mut f = frame(&hello(PROTOCOL_VERSION)).to_vec();
        f[0] += 1;
        f.push(0);
        f
    };
    let announcing_an_fd = {
        let mut f = frame(&hello(PROTOCOL_VERSION)).to_vec();
        f[4] = 1;
        f
    };
    let bad = |name, hello, bytes: Vec<u8>, expect| Bad {
        name,
        hello,
        bytes,
        half_close: false,
        expect,
    };
    vec![
        bad(
            "wrong protocol version (1) in the Hello",
            false,
            frame(&hello(1)).to_vec(),
            "protocol version 1 not supported",
        ),
        bad(
            "wrong protocol version (65535) in the Hello",
            false,
            frame(&hello(u16::MAX)).to_vec(),
            "protocol version 65535 not supported",
        ),
        bad(
            "a Request before the Hello",
            false,
            frame(&ClientMessage::Request {
                id: RequestId(1),
                request: CmRequest::Query,
            })
            .to_vec(),
            "a Request before Hello",
        ),
        bad(
            "a second Hello",
            true,
            frame(&hello(PROTOCOL_VERSION)).to_vec(),
            "a second Hello",
        ),
        bad(
            "oversized frame: length 64 KiB + 1 (the prefix alone)",
            true,
            ((MAX_CLIENT_FRAME + 1) as u32).to_le_bytes().to_vec(),
            "frame of 65537 bytes exceeds the maximum of 65536",
        ),
        bad(
            "oversized frame before the Hello: length 4 GiB - 1",
            false,
            u32::MAX.to_le_bytes().to_vec(),
            "frame of 4294967295 bytes exceeds the maximum of 65536",
        ),
        bad("an empty frame (length 0)", true, vec![0, 0, 0, 0], "empty frame"),
        bad(
            "unknown message type (ClientMessage variant 3)",
            true,
            vec![2, 0, 0, 0, 0, 3],
            "undecodable message",
        ),
        bad(
            "unknown request type (CmRequest variant 127)",
            true,
            vec![4, 0, 0, 0, 0, 1, 1, 0x7F],
            "undecodable message",
        ),
        bad(
            "a byte after the message inside its frame",
            false,
            with_extra_byte,
            "1 trailing bytes after the message",
        ),
        bad(
            "a Hello announcing a file descriptor",
            false,
            announcing_an_fd,
            "1 file descriptors announced; this message takes 0",
        ),
        bad(
            "RegisterMemory without its memfd",
            true,
            frame(&ClientMessage::Request {
                id: RequestId(1),
                request: CmRequest::RegisterMemory {
                    length: 4096,
                    access: Access::LOCAL_WRITE,
                    pd: Default::default(),
                },
            })
            .to_vec(),
            "announced 1 file descriptors but none arrived",
        ),
        bad(
            "garbage: an HTTP request",
            false,
            b"GET / HTTP/1.1\r\nHost: soft-rdma\r\n\r\n".to_vec(),
            "exceeds the maximum of 65536",
        ),
        bad(
            "garbage: a frame of 0xFF bytes",
            true,
            vec![9, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF],
            "undecodable message",
        ),
        Bad {
            name: "a truncated frame (7 of 104 bytes), then the end of the stream",
            hello: true,
            bytes: vec![100, 0, 0, 0, 0, 1, 2],
            half_close: true,
            expect: "closed in the middle of a frame (3 of 100 bytes)",
        },
    ]
}

/// Every malformed conversation ends its own session with a Goodbye (INVALID_PARAMETER, saying what was
/// wrong) and a close; a truncated frame followed by a full close just ends the session. Meanwhile a normal
/// client with an open connection moves data the whole time, and afterwards the daemon holds exactly what it
/// held before (the bad sessions released everything).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_input_ends_only_that_session() {
    let mut p = Daemons::start("bad", &[], &[]).await;
    let (l, remote) = p.listen_b(7100).await;
    let (ea, eb) = connected_ends(&p.a, &p.b, &l, remote).await;
    let src = p.a.register_memory(128 << 10, RW).await.unwrap();
    let dst = p.b.register_memory(64 << 10, RW).await.unwrap();
    let a_listener = p.a.create_listener().await.unwrap();
    a_listener.listen(p.net.addr(Side::A, 7101), 0).await.unwrap();
    let before = p.a.status().await.unwrap();

    // The normal client keeps moving data while the bad clients come and go.
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut rounds = 0;
            while !stop.load(Ordering::Relaxed) {
                write_read_round(&ea.qp, &ea.cq, &src, &dst, rounds).await;
                rounds += 1;
            }
            (rounds, ea, src, dst)
        }
    });

    let uds = p.da.uds_path().to_owned();
    let cases = bad_inputs();
    let n = cases.len();
    tokio::task::spawn_blocking(move || {
        for case in cases {
            let mut r = Raw::connect(&uds);
            if case.hello {
                r.hello();
            }
            // The daemon may close before taking everything (a refused length prefix): a failed write is fine.
            let _ = r.write(&case.bytes);
            if case.half_close {
                r.s.shutdown(Shutdown::Write).unwrap();
            }
            let e = r.goodbye(case.name);
            assert_eq!(e.status, NdStatus::InvalidParameter, "{}: {e}", case.name);
            assert!(
                e.context.contains(case.expect),
                "{}: Goodbye says {:?}, expected {:?}",
                case.name,
                e.context,
                case.expect
            );
            // The Goodbye names the malformation, so that is what ended the session. And it answers the bytes
            // already sent: apart from the truncated frame, the client neither sends more nor closes, so a
            // daemon waiting for the rest of a frame (an oversized length) would never answer, and Raw's read
            // timeout (the hang guard) fails the case.
        }
        // A truncated frame, then the client goes away altogether: nothing to answer, the session just ends.
        let mut r = Raw::connect(&uds);
        r.hello();
        r.write(&[0x40, 0, 0, 0, 0, 1]).unwrap();
        drop(r);
    })
    .await
    .unwrap();

    // Every bad session is gone; everything else is as it was.
    let after = eventually("bad sessions released", async || {
        let s = p.a.status().await.unwrap();
        (s.sessions == before.sessions).then_some(s)
    })
    .await;
    // What the daemon holds, without the live TCP counters of the connection that keeps moving data.
    let held = |s: &soft_rdma::status::StatusReport| {
        let mut connectors = s.connectors.clone();
        for c in &mut connectors {
            c.tcp = None;
        }
        (connectors, s.listeners.clone(), s.ports_in_use, s.memory_regions)
    };
    assert_eq!(
        held(&after),
        held(&before),
        "the daemon holds what it held before"
    );
    stop.store(true, Ordering::Relaxed);
    let (rounds, ea, src, dst) = within("traffic", traffic).await.unwrap();
    assert!(rounds > 0, "data moved while the bad clients came and went");
    // And still does; the queue pairs never left Connected.
    write_read_round(&ea.qp, &ea.cq, &src, &dst, rounds + 1).await;
    assert_eq!(ea.qp.query().await.unwrap().state, QueuePairState::Connected);
    assert_eq!(eb.qp.query().await.unwrap().state, QueuePairState::Connected);
    assert!(p.da.is_running(), "soft-rdmad A still runs");
    let log = p.da.log_text();
    assert_eq!(
        log.matches("session ended: protocol error").count(),
        n + 1,
        "one warning per bad session:\n{log}"
    );
    drop((ea, eb, a_listener, l));
}

/// The daemon's resident memory, in bytes.
fn rss(d: &Daemon) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.pid().expect("running"))).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kb * 1024
}

/// A client that pipelines 400,000 requests and reads none of the answers cannot make the daemon queue them
/// all (about 100 MB): its session stops reading once a few MiB of answers wait, the daemon's memory stays
/// put, other sessions are served as usual, and when the client does read, every answer arrives, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_cannot_grow_the_daemon() {
    const N: u64 = 400_000;
    let p = Daemons::start("nord", &[], &[]).await;
    let mut r = Raw::connect(p.da.uds_path());
    let session = r.hello();
    let before = rss(&p.da);
    let mut out = BytesMut::new();
    for id in 1..=N {
        ClientMessage::Request {
            id: RequestId(id),
            request: CmRequest::Query,
        }
        .encode(&mut out);
    }
    let mut w = r.s.try_clone().unwrap();
    let writer = std::thread::spawn(move || w.write_all(&out));
    // The event: soft-rdmad stops reading this session (its own bound on unread answers).
    let in_session = format!("session{{id={} ", session.0);
    eventually("soft-rdmad pauses the session that does not read", async || {
        p.da.log_text()
            .lines()
            .any(|l| {
                l.contains(&in_session) && l.contains("reads paused: the client is behind on its answers")
            })
            .then_some(())
    })
    .await;
    let grown = rss(&p.da).saturating_sub(before);
    assert!(
        !writer.is_finished(),
        "soft-rdmad took all {N} requests although their answers are not read"
    );
    // Others are served meanwhile: another session's request is answered while this one is still stalled
    // (its writer still blocked, after the answer came: a writer never goes back to blocked).
    within("another session's Query", p.a.status()).await.unwrap();
    assert!(
        grown < 32 << 20,
        "soft-rdmad grew by {} MiB for a client that does not read",
        grown >> 20
    );
    assert!(
        !writer.is_finished(),
        "soft-rdmad had taken all {N} requests (unread answers) by the time another session was answered"
    );
    // Now the client reads: every answer, in order.
    let got = tokio::task::spawn_blocking(move || {
        let mut next = 1;
        while next <= N {
            match r.next_message() {
                Some(ServerMessage::Response {
                    id,
                    result: Ok(CmResponse::Adapter(_)),
                }) => {
                    assert_eq!(id.0, next);
                    next += 1;
                }
                other => panic!("answer {next}: {other:?}"),
            }
        }
        next - 1
    })
    .await
    .unwrap();
    assert_eq!(got, N);
    writer.join().unwrap().unwrap();
    eprintln!("a client not reading: soft-rdmad grew by {} KiB", grown >> 10);
}

// ---------------------------------------------------------------------------------------------------------
// 2. Other sessions' objects; the per-session object limit.
// ---------------------------------------------------------------------------------------------------------

/// One session cannot touch another's objects: every request naming a connector, listener, shared endpoint,
/// completion queue, queue pair or memory region of another session is answered exactly as one naming an
/// object that does not exist (INVALID_PARAMETER, the same words); an SGE naming another session's region
/// completes with ACCESS_VIOLATION; work requests travel only through a queue pair's own shared rings (the
/// former Post message ends the offender's session with a Goodbye, after which nothing it sends is acted
/// on). The owner's objects work throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_cannot_touch_each_others_objects() {
    // The daemon's data-path objects (XDP mode, or `--data-path daemon`): a handed-off session's are in its
    // own process, out of another's reach.
    let p = Daemons::start("own", &["--data-path", "daemon"], &[]).await;
    // The victim: one of everything.
    let mine = p.a.create_connector().await.unwrap();
    let listener = p.a.create_listener().await.unwrap();
    let listening = listener.listen(p.net.addr(Side::A, 7200), 0).await.unwrap();
    let ep =
        p.a.create_shared_endpoint(p.net.addr(Side::A, 7201))
            .await
            .unwrap();
    let cq = p.a.create_completion_queue(64).await.unwrap();
    let qp = p.a.create_queue_pair(&cq, &cq, 16, 16).await.unwrap();
    let mr = p.a.register_memory(4096, RW).await.unwrap();
    let (b_listener, b_addr) = p.listen_b(7202).await;

    let uds = p.da.uds_path().to_owned();
    let (a_addr, ids) = (
        p.net.addr(Side::A, 0),
        (
            mine.id(),
            listener.id(),
            ep.id(),
            cq.id(),
            qp.id(),
            mr.id(),
            mr.stag(),
        ),
    );
    let (intruder, raw) = tokio::task::spawn_blocking(move || {
        let (connector, listener, ep, cq, qp, region, stag) = ids;
        let mut r = Raw::connect(&uds);
        let session = r.hello();
        let Ok(CmResponse::Connector(own)) = r.request(1, CmRequest::CreateConnector) else {
            panic!("CreateConnector")
        };
        let Ok(CmResponse::CompletionQueue(own_cq)) =
            r.request(2, CmRequest::CreateCompletionQueue { depth: 16 })
        else {
            panic!("CreateCompletionQueue")
        };
        let qp_config = |cq| QueuePairConfig::on_one_cq(cq, 4);
        let Ok(CmResponse::QueuePair(own_qp)) = r.request(
            3,
            CmRequest::CreateQueuePair {
                config: qp_config(own_cq),
            },
        ) else {
            panic!("CreateQueuePair")
        };
        // Each request twice: naming the victim's object, and naming one that does not exist.
        let requests = |connector: ConnectorId,
                        listener: ListenerId,
                        ep: SharedEndpointId,
                        cq: CompletionQueueId,
                        qp: QueuePairId,
                        region: MemoryRegionId| {
            vec![
                CmRequest::Bind {
                    connector,
                    local: a_addr,
                },
                CmRequest::GetLocalAddress { connector },
                CmRequest::GetPeerAddress { connector },
                CmRequest::GetReadLimits { connector },
                CmRequest::GetPrivateData {
                    connector,
                    buffer_len: 64,
                },
                CmRequest::NotifyDisconnect { connector },
                CmRequest::Disconnect { connector },
                CmRequest::CompleteConnect { connector },
                CmRequest::Reject {
                    connector,
                    private_data: Bytes::new(),
                },
                CmRequest::Accept {
                    connector,
                    limits: LIMITS,
                    private_data: Bytes::new(),
                    queue_pair: None,
                },
                CmRequest::Cancel {
                    object: ObjectRef::Connector(connector),
                },
                CmRequest::Listen {
                    listener,
                    local: a_addr,
                    backlog: 0,
                },
                CmRequest::GetConnectionRequest {
                    listener,
                    connector: own,
                },
                CmRequest::Cancel {
                    object: ObjectRef::Listener(listener),
                },
                CmRequest::Connect {
                    connector: own,
                    remote: b_addr,
                    limits: LIMITS,
                    private_data: Bytes::new(),
                    shared_endpoint: Some(ep),
                    queue_pair: None,
                },
                CmRequest::Connect {
                    connector: own,
                    remote: b_addr,
                    limits: LIMITS,
                    private_data: Bytes::new(),
                    shared_endpoint: None,
                    queue_pair: Some(qp),
                },
                CmRequest::CreateQueuePair {
                    config: qp_config(cq),
                },
                CmRequest::QueryQueuePair { qp },
                CmRequest::CloseQueuePair { qp },
                CmRequest::CloseCompletionQueue { cq },
                CmRequest::DeregisterMemory { region },
                CmRequest::CloseSharedEndpoint { endpoint: ep },
                CmRequest::CloseListener { listener },
                CmRequest::CloseConnector { connector },
            ]
        };
        let foreign = requests(connector, listener, ep, cq, qp, region);
        let n = foreign.len();
        let (answers, _) = r.pipeline(100, foreign);
        let (unknown, _) = r.pipeline(
            200,
            requests(
                ConnectorId(999_999),
                ListenerId(999_998),
                SharedEndpointId(999_997),
                CompletionQueueId(999_996),
                QueuePairId(999_995),
                MemoryRegionId(999_994),
            ),
        );
        for (i, (a, u)) in answers.iter().zip(&unknown).enumerate() {
            let (Err(a), Err(u)) = (a, u) else {
                panic!("request {i}: {a:?} / {u:?}")
            };
            assert_eq!(a.status, NdStatus::InvalidParameter, "request {i}: {a}");
            assert_eq!(
                without_digits(&a.context),
                without_digits(&u.context),
                "request {i}: a foreign handle reads exactly like a missing one"
            );
        }
        assert_eq!(answers.len(), n);
        // Work requests travel through a queue pair's shared rings, which only its owner was given: the
        // message that once posted them over the socket (variant 2: queue pair, no requests) is now a
        // protocol violation, and the session ends.
        let _ = (own_qp, own_cq, stag);
        let _ = r.write(&[4, 0, 0, 0, 0, 2, qp.0 as u8 & 0x7f, 0]);
        let e = r.goodbye("the former Post message");
        assert_eq!(e.status, NdStatus::InvalidParameter, "{e}");
        assert!(e.context.contains("undecodable"), "{e}");
        // Anything sent after the Goodbye is not acted on: a connector bound to a chosen port would hold it.
        let late = [
            frame(&ClientMessage::Request {
                id: RequestId(300),
                request: CmRequest::CreateConnector,
            }),
            frame(&ClientMessage::Request {
                id: RequestId(301),
                request: CmRequest::CreateListener,
            }),
        ]
        .concat();
        let _ = r.write(&late);
        (session, r)
    })
    .await
    .unwrap();
    // The intruder's socket is still open here: its session must be gone anyway, late requests included.
    let s = eventually("the intruder's session released", async || {
        let s = p.a.status().await.unwrap();
        (s.sessions == 1).then_some(s)
    })
    .await;
    assert_eq!(
        held_by(&s, intruder),
        (0, 0, 0),
        "nothing of the intruder's is left, not even what it sent after the Goodbye: {s:?}"
    );
    drop(raw);
    // The victim's objects are all there and work.
    assert_eq!(held_by(&s, p.a.session()), (1, 1, 1));
    assert_eq!(s.shared_endpoints, [p.net.addr(Side::A, 7201)]);
    assert_eq!((s.memory_regions, s.listeners[0].local), (1, listening));
    qp.receive(1, &[mr.sge(0, 64)]).unwrap();
    let q = qp.query().await.unwrap();
    assert_eq!((q.state, q.stats.rq_posted), (QueuePairState::Idle, 1), "{q:?}");
    assert!(cq.poll(8).is_empty());
    mine.bind(p.net.addr(Side::A, 0)).await.unwrap();
    // An SGE naming the victim's region, posted through another session's own rings: ACCESS_VIOLATION,
    // on that session's completion queue.
    let other = Adapter::open(p.da.uds_path()).await.unwrap();
    let other_cq = other.create_completion_queue(16).await.unwrap();
    let other_qp = other.create_queue_pair(&other_cq, &other_cq, 4, 4).await.unwrap();
    other_qp.receive(7, &[mr.sge(0, 64)]).unwrap();
    let c = other_cq.next().await.unwrap();
    assert_eq!(
        (c.qp, c.wr_id, c.status),
        (other_qp.id(), 7, NdStatus::AccessViolation)
    );
    assert!(cq.poll(8).is_empty());
    drop((listener, ep, b_listener));
}

/// Thousands of objects: past `--max-objects-per-session` every kind of creation fails with
/// INSUFFICIENT_RESOURCES and words that say why, for that session only (two sessions at their limits at
/// once, a third unaffected and connecting); closing one object makes room; closing the session frees all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_session_object_limit() {
    const LIMIT: usize = 2000;
    let limit = LIMIT.to_string();
    // Completion queues and regions count where the daemon holds them (`--data-path daemon`, XDP mode).
    let p = Daemons::start(
        "olim",
        &["--data-path", "daemon", "--max-objects-per-session", &limit],
        &[],
    )
    .await;
    let (l, remote) = p.listen_b(7100).await;
    // A raw session asks for 2,500 connectors in one burst: exactly the first 2,000 are created.
    let uds = p.da.uds_path().to_owned();
    let (raw_session, raw) = tokio::task::spawn_blocking(move || {
        let mut r = Raw::connect(&uds);
        let session = r.hello();
        let (answers, _) = r.pipeline(1, vec![CmRequest::CreateConnector; LIMIT + 500]);
        for (i, a) in answers.iter().enumerate() {
            match a {
                Ok(CmResponse::Connector(_)) if i < LIMIT => {}
                Err(e) if i >= LIMIT => {
                    assert_eq!(e.status, NdStatus::InsufficientResources, "request {i}: {e}");
                    assert_eq!(
                        e.context,
                        format!(
                            "this session holds {LIMIT} objects, the per-session limit; close some first"
                        )
                    );
                }
                other => panic!("request {i}: {other:?}"),
            }
        }
        (session, r)
    })
    .await
    .unwrap();
    // A library session fills up with a mix (a CQ, a region, the rest connectors) ...
    let full = Adapter::open(p.da.uds_path()).await.unwrap();
    let cq = full.create_completion_queue(16).await.unwrap();
    let mr = full.register_memory(4096, RW).await.unwrap();
    let mut held = Vec::new();
    for _ in 0..LIMIT - 2 {
        held.push(full.create_connector().await.unwrap());
    }
    // ... and then nothing more can be created, of any kind.
    let e = full.create_connector().await.unwrap_err();
    assert_eq!(e.status, NdStatus::InsufficientResources);
    assert!(e.context.contains("per-session limit"), "{e}");
    assert_eq!(
        status(full.create_listener().await),
        NdStatus::InsufficientResources
    );
    assert_eq!(
        status(full.create_completion_queue(16).await),
        NdStatus::InsufficientResources
    );
    assert_eq!(
        status(full.create_queue_pair(&cq, &cq, 4, 4).await),
        NdStatus::InsufficientResources
    );
    assert_eq!(
        status(full.register_memory(4096, RW).await),
        NdStatus::InsufficientResources
    );
    assert_eq!(
        status(full.create_shared_endpoint(p.net.addr(Side::A, 0)).await),
        NdStatus::InsufficientResources
    );
    // Requests that create nothing still work at the limit.
    held[0].bind(p.net.addr(Side::A, 0)).await.unwrap();
    let s = p.a.status().await.unwrap();
    assert_eq!(held_by(&s, raw_session).0, LIMIT);
    assert_eq!(held_by(&s, full.session()).0, LIMIT - 2);
    // The first session (p.a) is unaffected: it creates, listens and connects.
    let own = p.a.create_listener().await.unwrap();
    own.listen(p.net.addr(Side::A, 7101), 0).await.unwrap();
    let (ea, eb) = connected_ends(&p.a, &p.b, &l, remote).await;
    let src = p.a.register_memory(8192, RW).await.unwrap();
    let dst = p.b.register_memory(4096, RW).await.unwrap();
    write_read_round(&ea.qp, &ea.cq, &src, &dst, 1).await;
    // Closing one object makes room for one.
    drop(held.pop());
    let again = eventually("room after a close", async || full.create_connector().await.ok()).await;
    assert_eq!(
        status(full.create_connector().await),
        NdStatus::InsufficientResources
    );
    // Closing the sessions frees everything they held.
    drop(raw);
    drop((held, again, cq, mr));
    drop(full);
    let s = eventually("the full sessions released", async || {
        let s = p.a.status().await.unwrap();
        (s.sessions == 1).then_some(s)
    })
    .await;
    assert_eq!(held_by(&s, raw_session), (0, 0, 0));
    assert_eq!(
        s.connectors.len(),
        1,
        "only the first session's connector: {:?}",
        s.connectors
    );
    assert_eq!(s.memory_regions, 1);
    drop((ea, eb, own));
}

// ---------------------------------------------------------------------------------------------------------
// 3. A client disconnecting in the middle of everything.
// ---------------------------------------------------------------------------------------------------------

/// A session over a stream the test can cut (a duplicate of the socket: `shutdown` on it ends the session
/// without the library's per-object close messages, as when a process dies).
async fn cuttable_session(path: &Path) -> (Adapter, StdUnixStream) {
    let s = StdUnixStream::connect(path).unwrap();
    let cut = s.try_clone().unwrap();
    s.set_nonblocking(true).unwrap();
    let adapter = Adapter::over(tokio::net::UnixStream::from_std(s).unwrap())
        .await
        .unwrap();
    (adapter, cut)
}

/// A client holding a listener, a bound connector, a shared endpoint, a connect waiting for its TCP
/// handshake (blackholed), a connect waiting for the peer's Accept, and a connected queue pair with Receives
/// posted and RDMA Reads in flight, goes away without closing anything. Everything it held is released: its
/// ports can be taken again by another session, the peer sees the disconnect (NotifyDisconnect fires, its
/// queue pair leaves Connected) and the offer it had queued for the abandoned connect is withdrawn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_vanishes_mid_everything_releases_everything() {
    let p = Daemons::start("vani", &["--connect-timeout-ms", "20000"], &[]).await;
    let (bl, remote) = p.listen_b(7100).await;
    let (_idle_bl, idle_remote) = p.listen_b(7101).await;
    let (x, cut) = cuttable_session(p.da.uds_path()).await;
    let ports = [7400, 7401, 7402].map(|port| p.net.addr(Side::A, port));
    let listener = x.create_listener().await.unwrap();
    listener.listen(ports[0], 0).await.unwrap();
    let bound = x.create_connector().await.unwrap();
    bound.bind(ports[1]).await.unwrap();
    let ep = x.create_shared_endpoint(ports[2]).await.unwrap();
    let pending_listen = tokio::spawn({
        let c = x.create_connector().await.unwrap();
        async move { listener.get_connection_request(&c).await.map(|_| ()) }
    });
    // A connect whose SYN goes nowhere, and one whose offer B queued but nobody takes.
    let (blackholed, hole) = (x.create_connector().await.unwrap(), p.net.blackhole(7000));
    let blackholed = tokio::spawn(async move { blackholed.connect(hole, LIMITS, b"").await });
    let unanswered = x.create_connector().await.unwrap();
    let unanswered = tokio::spawn(async move { unanswered.connect(idle_remote, LIMITS, b"").await });
    // A connected queue pair with Receives posted and 16 MiB Reads in flight.
    let (ex, eb) = connected_ends(&x, &p.b, &bl, remote).await;
    let sink = x.register_memory(16 << 20, RW).await.unwrap();
    let source = p.b.register_memory(16 << 20, RW).await.unwrap();
    for i in 0..4 {
        ex.qp.receive(100 + i, &[sink.sge(0, 64)]).unwrap();
        ex.qp.read(i, sink.sge(0, 16 << 20), source.remote(0)).unwrap();
    }
    let session = x.session();
    let b_notified = tokio::spawn(async move {
        let r = eb.connector.notify_disconnect().await;
        (r, eb)
    });
    // Wait until everything is in place: the offer queued on B, Reads moving.
    eventually("the client's objects in place", async || {
        let a = p.a.status().await.unwrap();
        let b = p.b.status().await.unwrap();
        let queued = queued_offers(&b, idle_remote) == Some(1);
        // Reads have moved data (in kernel mode the client reports its counters about once a second, and
        // the 64 MiB may all have arrived by then: the end of the session is what this test is about).
        let reading = a
            .queue_pairs
            .iter()
            .any(|q| q.session == session.0 && q.stats.bytes_received > 0);
        (queued && reading).then_some(())
    })
    .await;
    let s = p.a.status().await.unwrap();
    assert_eq!(held_by(&s, session), (5, 1, 1), "{s:?}");
    // listen, bind, shared endpoint, two connects (implicit ports), one connection.
    assert_eq!(s.ports_in_use, 6, "{s:?}");

    cut.shutdown(Shutdown::Both).unwrap();
    let t = Instant::now();
    let s = eventually("everything released", async || {
        let s = p.a.status().await.unwrap();
        (s.sessions == 1 && s.ports_in_use == 0).then_some(s)
    })
    .await;
    let released = t.elapsed();
    assert_eq!(held_by(&s, session), (0, 0, 0), "{s:?}");
    assert!(s.shared_endpoints.is_empty() && s.memory_regions == 0, "{s:?}");
    // The client's pending requests end (the library sees the session gone).
    for r in [
        within("pending GetConnectionRequest", pending_listen)
            .await
            .unwrap(),
        within("blackholed connect", blackholed).await.unwrap(),
        within("unanswered connect", unanswered).await.unwrap(),
    ] {
        assert_eq!(status(r), NdStatus::DeviceRemoved);
    }
    // The peer saw the disconnect, and the offer it had queued is gone.
    let (r, eb) = within("B's NotifyDisconnect", b_notified).await.unwrap();
    r.unwrap();
    eventually("B's queue pair leaves Connected", async || {
        (eb.qp.query().await.unwrap().state == QueuePairState::Error).then_some(())
    })
    .await;
    eventually("the abandoned offer leaves B's queue", async || {
        (queued_offers(&p.b.status().await.unwrap(), idle_remote) == Some(0)).then_some(())
    })
    .await;
    // Another session takes the same ports.
    let l2 = p.a.create_listener().await.unwrap();
    assert_eq!(l2.listen(ports[0], 0).await.unwrap(), ports[0]);
    let c2 = p.a.create_connector().await.unwrap();
    assert_eq!(c2.bind(ports[1]).await.unwrap(), ports[1]);
    let ep2 = p.a.create_shared_endpoint(ports[2]).await.unwrap();
    eprintln!("a vanished client's objects were released {released:?} after it went away");
    drop((ep, bound, ex, sink, source, ep2, eb));
}

// ---------------------------------------------------------------------------------------------------------
// 4. Socket permissions; 5. peer credentials in the log.
// ---------------------------------------------------------------------------------------------------------

/// An existing group other than root's and nobody's, for `--group`.
fn socket_group() -> (String, u32) {
    ["daemon", "bin", "sys", "adm"]
        .iter()
        .find_map(|name| {
            nix::unistd::Group::from_name(name)
                .ok()
                .flatten()
                .filter(|g| g.gid.as_raw() != 0 && g.gid.as_raw() != NOBODY)
                .map(|g| (g.name, g.gid.as_raw()))
        })
        .expect("a system group (daemon, bin, sys or adm)")
}

const NOBODY: u32 = 65534;

/// `soft-rdma --uds PATH status` as uid/gid 65534 with exactly the supplementary `groups`; returns the
/// process id, whether it succeeded, and its stdout + stderr.
fn status_as_nobody(uds: &Path, groups: Option<u32>) -> (u32, bool, String) {
    let mut cmd = Command::new("setpriv");
    cmd.arg(format!("--reuid={NOBODY}"))
        .arg(format!("--regid={NOBODY}"));
    match groups {
        Some(g) => cmd.arg(format!("--groups={g}")),
        None => cmd.arg("--clear-groups"),
    };
    let child = cmd
        .arg(cli_binary().expect("the soft-rdma CLI"))
        .arg("--uds")
        .arg(uds)
        .arg("status")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("setpriv");
    // setpriv execs the CLI: the child's pid is the client's.
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (pid, out.status.success(), text)
}

/// The socket is created mode 0660 (owner root, group root without `--group`, the named group with it). A
/// process of another user outside that group is refused by connect(2) itself (EACCES: the CLI reports
/// ACCESS_VIOLATION "Permission denied"); the same user with the group gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_is_0660_and_only_its_group_gets_in() {
    let net = TestNet::new("perm").expect("netns pair");
    let plain = net
        .spawn_daemon_logging(Side::B, false, &[], Some("info"))
        .unwrap();
    let meta = std::fs::metadata(plain.uds_path()).unwrap();
    assert_eq!(
        (meta.mode() & 0o7777, meta.uid(), meta.gid()),
        (0o660, 0, 0),
        "without --group: root:root 0660"
    );
    let (group, gid) = socket_group();
    let d = net
        .spawn_daemon_logging(Side::A, false, &["--group", &group], Some("info"))
        .unwrap();
    let meta = std::fs::metadata(d.uds_path()).unwrap();
    assert!(
        std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()),
        "a socket"
    );
    assert_eq!(
        (meta.mode() & 0o7777, meta.uid(), meta.gid()),
        (0o660, 0, gid),
        "--group {group}: root:{group} 0660"
    );
    let uds = d.uds_path().to_owned();
    let (_, ok, out) = tokio::task::spawn_blocking(move || status_as_nobody(&uds, None))
        .await
        .unwrap();
    assert!(!ok, "uid {NOBODY} without the group got in: {out}");
    assert!(
        out.contains("ND_ACCESS_VIOLATION") && out.contains("Permission denied (os error 13)"),
        "EACCES from connect(2): {out}"
    );
    // The same refusal at the system-call level, from this process as that user.
    let uds = d.uds_path().to_owned();
    let errno = tokio::task::spawn_blocking(move || connect_as(&uds, NOBODY, NOBODY, &[]))
        .await
        .unwrap();
    assert_eq!(errno, Some(nix::errno::Errno::EACCES));
    let uds = d.uds_path().to_owned();
    let errno = tokio::task::spawn_blocking(move || connect_as(&uds, NOBODY, NOBODY, &[gid]))
        .await
        .unwrap();
    assert_eq!(errno, None, "with the group, connect(2) succeeds");
    let uds = d.uds_path().to_owned();
    let (_, ok, out) = tokio::task::spawn_blocking(move || status_as_nobody(&uds, Some(gid)))
        .await
        .unwrap();
    assert!(ok, "uid {NOBODY} in group {group} is refused: {out}");
    assert!(out.contains("soft-rdmad: 1 session(s)"), "{out}");
    assert!(
        d.log_text().contains(&format!("uid={NOBODY}")),
        "{}",
        d.log_text()
    );
}

/// connect(2) to `path` from a forked child running as `uid`/`gid` with supplementary `groups`; the errno if
/// it failed. (The child only makes system calls, then `_exit`s: safe after fork in a threaded process.)
fn connect_as(path: &Path, uid: u32, gid: u32, groups: &[u32]) -> Option<nix::errno::Errno> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, connect, socket};
    use nix::unistd::{ForkResult, Gid, Uid, fork, setgid, setgroups, setuid};
    let addr = UnixAddr::new(path).unwrap();
    let groups: Vec<Gid> = groups.iter().map(|g| Gid::from_raw(*g)).collect();
    // SAFETY: the child calls only async-signal-safe functions (system calls) before _exit.
    match unsafe { fork() }.expect("fork") {
        ForkResult::Child => {
            let code = (|| {
                setgroups(&groups).ok()?;
                setgid(Gid::from_raw(gid)).ok()?;
                setuid(Uid::from_raw(uid)).ok()?;
                let fd = socket(AddressFamily::Unix, SockType::Stream, SockFlag::empty(), None).ok()?;
                Some(match connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr) {
                    Ok(()) => 0,
                    Err(e) => e as i32,
                })
            })()
            .unwrap_or(255);
            // SAFETY: _exit is async-signal-safe; nothing of the parent's runs in the child.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => match nix::sys::wait::waitpid(child, None).unwrap() {
            nix::sys::wait::WaitStatus::Exited(_, 0) => None,
            nix::sys::wait::WaitStatus::Exited(_, 255) => panic!("the child could not drop privileges"),
            nix::sys::wait::WaitStatus::Exited(_, code) => Some(nix::errno::Errno::from_raw(code)),
            other => panic!("child: {other:?}"),
        },
    }
}

/// Each session is logged at info level with the client's peer credentials (SO_PEERCRED): this test
/// process's pid as root, and the pid of a CLI run as uid/gid 65534 — numbers a client cannot make up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_logged_with_peer_credentials() {
    let net = TestNet::new("cred").expect("netns pair");
    let (group, gid) = socket_group();
    let d = net
        .spawn_daemon_logging(Side::A, false, &["--group", &group], Some("info"))
        .unwrap();
    let me = Adapter::open(d.uds_path()).await.unwrap();
    let uds = d.uds_path().to_owned();
    let (pid, ok, out) = tokio::task::spawn_blocking(move || status_as_nobody(&uds, Some(gid)))
        .await
        .unwrap();
    assert!(ok, "{out}");
    drop(me);
    let log = eventually("both sessions logged as closed", async || {
        let log = d.log_text();
        (log.matches("session closed").count() >= 2).then_some(log)
    })
    .await;
    let lines = |pid: u32, uid: u32, gid: u32| {
        let creds = format!("pid={pid} uid={uid} gid={gid}");
        log.lines()
            .filter(|l| l.contains(" INFO ") && l.contains(&creds))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let mine = lines(std::process::id(), 0, 0);
    assert!(
        mine.iter().any(|l| l.contains("session opened"))
            && mine.iter().any(|l| l.contains("session closed")),
        "this process's session, with its credentials, at info level:\n{log}"
    );
    let nobody = lines(pid, NOBODY, NOBODY);
    assert!(
        nobody.iter().any(|l| l.contains("session opened"))
            && nobody.iter().any(|l| l.contains("session closed")),
        "the CLI's session (pid {pid}, uid/gid {NOBODY}) at info level:\n{log}"
    );
}
