//! Unit tests of `uds::server`: a session against a real Unix socket pair, its framing errors, the caps on
//! unanswered requests and unread answers, descriptor announcements, the Hello and frame timeouts and the
//! registration budget.

use super::*;
use crate::engine::cm::CmConfig;
use crate::uds::messages::{Request, Response};
use std::os::fd::AsFd;
use tokio::io::AsyncReadExt;

/// A session over a socket pair: the client's end, what the session tells the event loop, the task.
fn session() -> (
    UnixStream,
    mpsc::UnboundedReceiver<SessionInput>,
    tokio::task::JoinHandle<()>,
) {
    session_with(Budget::new(Limits::default()))
}

/// The client says Hello; the event loop's end of the session it opened.
async fn opened(
    client: &mut UnixStream,
    inputs: &mut mpsc::UnboundedReceiver<SessionInput>,
) -> SessionWriter {
    client.write_all(&frame(&hello())).await.unwrap();
    let Some(SessionInput::Opened { writer, .. }) = inputs.recv().await else {
        panic!("Opened")
    };
    writer
}

/// [`session`] within `budget`.
fn session_with(
    budget: Arc<Budget>,
) -> (
    UnixStream,
    mpsc::UnboundedReceiver<SessionInput>,
    tokio::task::JoinHandle<()>,
) {
    let (client, server) = UnixStream::pair().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let terms = SessionTerms {
        adapter: CmConfig::default_siw_compatible().adapter,
        hand_off: false,
    };
    let session_budget = SessionBudget {
        ticket: budget.admit().unwrap(),
        account: Arc::default(),
        budget,
    };
    let task = tokio::spawn(run_session(
        SessionId(1),
        server,
        tx,
        terms,
        session_budget,
        Peer::default(),
    ));
    (client, rx, task)
}

fn frame(m: &ClientMessage) -> BytesMut {
    let mut b = BytesMut::new();
    m.encode(&mut b);
    b
}

/// Everything the daemon sends until it closes.
async fn read_all(client: &mut UnixStream) -> Vec<ServerMessage> {
    let mut buf = BytesMut::new();
    let mut got = Vec::new();
    loop {
        while let Some(f) = split_frame(&mut buf, super::super::proto::MAX_SERVER_FRAME).unwrap() {
            got.push(ServerMessage::decode(&f).unwrap());
        }
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), client.read_buf(&mut buf))
            .await
            .expect("the session closes")
            .unwrap();
        if n == 0 {
            return got;
        }
    }
}

/// The session task finishes (at most 5 s).
async fn ended(task: tokio::task::JoinHandle<()>) {
    tokio::time::timeout(std::time::Duration::from_secs(5), task)
        .await
        .expect("the session ends")
        .unwrap();
}

fn hello() -> ClientMessage {
    ClientMessage::Hello {
        version: PROTOCOL_VERSION,
        client_name: "test".into(),
    }
}

/// A frame cut short by the end of the stream is a protocol error the client hears about (if it only
/// half-closed), not a clean close.
#[tokio::test]
async fn a_truncated_frame_at_the_end_of_the_stream_is_a_protocol_error() {
    let (mut client, mut inputs, task) = session();
    let mut out = frame(&hello());
    out.extend_from_slice(&[100, 0, 0, 0, 0, 1, 2]);
    client.write_all(&out).await.unwrap();
    client.shutdown().await.unwrap();
    let got = read_all(&mut client).await;
    assert!(matches!(got[0], ServerMessage::Welcome { .. }), "{got:?}");
    let ServerMessage::Goodbye { error } = &got[1] else {
        panic!("{got:?}")
    };
    assert_eq!(error.status, NdStatus::InvalidParameter);
    assert_eq!(
        error.context,
        "the stream closed in the middle of a frame (3 of 100 bytes)"
    );
    ended(task).await;
    assert!(matches!(inputs.recv().await, Some(SessionInput::Opened { .. })));
    assert!(matches!(inputs.recv().await, Some(SessionInput::Closed { .. })));
    // A whole frame, then the end of the stream: a clean close, no Goodbye.
    let (mut client, mut inputs, task) = session();
    client.write_all(&frame(&hello())).await.unwrap();
    client.shutdown().await.unwrap();
    // The event loop's copy of the session's writer (it drops it on Closed).
    assert!(matches!(inputs.recv().await, Some(SessionInput::Opened { .. })));
    let got = read_all(&mut client).await;
    assert!(matches!(got[..], [ServerMessage::Welcome { .. }]), "{got:?}");
    ended(task).await;
}

/// When the event loop ends a session (its Goodbye), the session stops reading: what the client sends
/// after it never reaches the event loop, and the socket closes although the client keeps it open.
#[tokio::test]
async fn a_session_the_daemon_ended_reads_nothing_more() {
    let (mut client, mut inputs, task) = session();
    let writer = opened(&mut client, &mut inputs).await;
    assert!(writer.send_msg(ServerMessage::Goodbye {
        error: Error::new(NdStatus::InvalidParameter, "no queue pair 7 in this session"),
    }));
    // The session is over before the client has read anything.
    let closed = tokio::time::timeout(std::time::Duration::from_secs(5), inputs.recv()).await;
    assert!(matches!(closed, Ok(Some(SessionInput::Closed { .. }))));
    ended(task).await;
    // Whatever the client sends now goes nowhere (the socket may be closed: the write may fail).
    let _ = client
        .write_all(&frame(&ClientMessage::Request {
            id: RequestId(1),
            request: Request::CreateConnector,
        }))
        .await;
    let got = read_all(&mut client).await;
    assert!(
        matches!(
            got[..],
            [ServerMessage::Welcome { .. }, ServerMessage::Goodbye { .. }]
        ),
        "{got:?}"
    );
    drop(writer);
    assert!(inputs.recv().await.is_none(), "nothing after Closed");
}

/// Receives what the session forwards until nothing more comes for 300 ms.
async fn forwarded(inputs: &mut mpsc::UnboundedReceiver<SessionInput>) -> Vec<SessionInput> {
    let mut got = Vec::new();
    while let Ok(Some(i)) =
        tokio::time::timeout(std::time::Duration::from_millis(300), inputs.recv()).await
    {
        got.push(i);
    }
    got
}

fn requests(n: u64, request: Request) -> BytesMut {
    let mut out = BytesMut::new();
    for id in 0..n {
        ClientMessage::Request {
            id: RequestId(id),
            request: request.clone(),
        }
        .encode(&mut out);
    }
    out
}

/// A client that pipelines requests and reads no answers: the session forwards MAX_UNANSWERED of them
/// and then waits; each answer lets one more through.
#[tokio::test]
async fn unanswered_requests_are_capped() {
    let (mut client, mut inputs, _task) = session();
    let writer = opened(&mut client, &mut inputs).await;
    client
        .write_all(&requests(MAX_UNANSWERED as u64 + 500, Request::Query))
        .await
        .unwrap();
    let got = forwarded(&mut inputs).await;
    assert_eq!(got.len(), MAX_UNANSWERED, "forwarded before any answer");
    let adapter = CmConfig::default_siw_compatible().adapter;
    for id in 0..10 {
        assert!(writer.send_msg(ServerMessage::Response {
            id: RequestId(id),
            result: Ok(Response::Adapter(adapter.clone())),
        }));
    }
    assert_eq!(forwarded(&mut inputs).await.len(), 10, "one more per answer");
}

/// A client that asks for Status reports (large answers) and reads nothing: the session stops forwarding
/// once about max_output_bytes_per_session bytes wait for the client, and forwards the rest as the client reads.
#[tokio::test]
async fn unread_answers_are_capped() {
    let (mut client, mut inputs, _task) = session();
    let writer = opened(&mut client, &mut inputs).await;
    const N: u64 = 1000;
    const ANSWER: usize = 64 << 10;
    let (mut rd, mut wr) = client.into_split();
    wr.write_all(&requests(N, Request::Status)).await.unwrap();
    // The event loop: a 64 KiB answer to every request, at once (a stand-in for a large Status report).
    let count = Arc::new(AtomicU64::new(0));
    let answering = tokio::spawn({
        let count = count.clone();
        async move {
            let mut n = 0;
            while let Some(input) = inputs.recv().await {
                if let SessionInput::Request { id, .. } = input {
                    n += 1;
                    count.store(n, Ordering::Relaxed);
                    let _ = writer.send_msg(ServerMessage::Response {
                        id,
                        result: Ok(Response::PrivateData {
                            data: bytes::Bytes::from(vec![7; ANSWER]),
                            required: ANSWER as u32,
                        }),
                    });
                }
                if n == N {
                    break;
                }
            }
            (n, writer, inputs)
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let before_reading = count.load(Ordering::Relaxed);
    // The backlog, what the socket buffers hold, and the one being written.
    let bound = (Limits::default().max_output_bytes_per_session / ANSWER) as u64 + 32;
    assert!(
        (1..=bound).contains(&before_reading),
        "{before_reading} of {N} answered although the client reads nothing"
    );
    // Now the client reads: every answer arrives.
    let mut buf = BytesMut::new();
    let mut answers = 0;
    while answers < N {
        while let Some(f) = split_frame(&mut buf, super::super::proto::MAX_SERVER_FRAME).unwrap() {
            if let ServerMessage::Response { .. } = ServerMessage::decode(&f).unwrap() {
                answers += 1;
            }
        }
        if answers < N {
            let n = tokio::time::timeout(std::time::Duration::from_secs(10), rd.read_buf(&mut buf))
                .await
                .expect("answers keep coming")
                .unwrap();
            assert!(n > 0);
        }
    }
    let (n, _writer, _inputs) = answering.await.unwrap();
    assert_eq!(n, N);
}

/// The Goodbye a session ends with, and that it ended.
async fn goodbye_of(client: &mut UnixStream, task: tokio::task::JoinHandle<()>) -> Error {
    let got = read_all(client).await;
    ended(task).await;
    match got.last() {
        Some(ServerMessage::Goodbye { error }) => error.clone(),
        _ => panic!("no Goodbye: {got:?}"),
    }
}

/// A descriptor no frame announces (here: the client's own socket, with a Query) is closed at once and
/// ends the session: the daemon must never hold the client's end of its own connection.
#[tokio::test]
async fn unannounced_descriptors_end_the_session() {
    let (mut client, _inputs, task) = session();
    client.write_all(&frame(&hello())).await.unwrap();
    let query = frame(&ClientMessage::Request {
        id: RequestId(1),
        request: Request::Query,
    });
    let own = client.as_fd().try_clone_to_owned().unwrap();
    super::super::fdpass::write_with_fds(&client, &query, &[own.as_fd()])
        .await
        .unwrap();
    drop(own);
    let error = goodbye_of(&mut client, task).await;
    assert_eq!(error.status, NdStatus::InvalidParameter);
    assert_eq!(
        error.context,
        "1 file descriptors arrived that no frame announces"
    );
}

/// A connection that sends no Hello, or leaves a frame half-sent, is ended with IO_TIMEOUT.
#[tokio::test]
async fn hello_and_frame_timeouts() {
    let limits = Limits {
        hello_timeout: std::time::Duration::from_millis(200),
        frame_timeout: std::time::Duration::from_millis(200),
        ..Limits::default()
    };
    let budget = Budget::new(limits);
    let (mut client, _inputs, task) = session_with(budget.clone());
    let error = goodbye_of(&mut client, task).await;
    assert_eq!(error.status, NdStatus::IoTimeout);
    assert!(error.context.contains("--hello-timeout-ms"), "{error}");
    assert_eq!(budget.status().client_connections, 0, "the slot is free again");
    let (mut client, _inputs, task) = session_with(budget.clone());
    let mut out = frame(&hello());
    out.extend_from_slice(
        &frame(&ClientMessage::Request {
            id: RequestId(1),
            request: Request::Query,
        })[..3],
    );
    client.write_all(&out).await.unwrap();
    let error = goodbye_of(&mut client, task).await;
    assert_eq!(error.status, NdStatus::IoTimeout);
    assert!(error.context.contains("--frame-timeout-ms"), "{error}");
}

/// Memory past the session's budget is refused (INSUFFICIENT_RESOURCES) before it is mapped, and the
/// session goes on; what was mapped keeps no descriptor and gives its room back when dropped.
#[tokio::test]
async fn registration_past_the_budget_is_refused() {
    let limits = Limits {
        max_registered_bytes_per_session: 8192,
        ..Limits::default()
    };
    let budget = Budget::new(limits);
    let (mut client, mut inputs, _task) = session_with(budget.clone());
    client.write_all(&frame(&hello())).await.unwrap();
    assert!(matches!(inputs.recv().await, Some(SessionInput::Opened { .. })));
    let register = |id| {
        frame(&ClientMessage::Request {
            id: RequestId(id),
            request: Request::RegisterMemory {
                length: 8192,
                access: Access::LOCAL_WRITE,
                pd: crate::engine::ids::PdId(0),
            },
        })
    };
    let m = SharedMemory::create("budget test", 8192).unwrap();
    let fd = [m.fd().unwrap()];
    super::super::fdpass::write_with_fds(&client, &register(1), &fd)
        .await
        .unwrap();
    let Some(SessionInput::RegisterMemory { memory, .. }) = inputs.recv().await else {
        panic!("RegisterMemory")
    };
    assert_eq!(budget.status().registered_bytes, 8192);
    super::super::fdpass::write_with_fds(&client, &register(2), &fd)
        .await
        .unwrap();
    let mut buf = BytesMut::new();
    let refused = loop {
        if let Some(f) = split_frame(&mut buf, super::super::proto::MAX_SERVER_FRAME).unwrap()
            && let ServerMessage::Response { id, result } = ServerMessage::decode(&f).unwrap()
        {
            assert_eq!(id, RequestId(2));
            break result.unwrap_err();
        }
        assert!(client.read_buf(&mut buf).await.unwrap() > 0);
    };
    assert_eq!(refused.status, NdStatus::InsufficientResources);
    drop(memory);
    assert_eq!(budget.status().registered_bytes, 0);
    super::super::fdpass::write_with_fds(&client, &register(3), &fd)
        .await
        .unwrap();
    assert!(matches!(
        inputs.recv().await,
        Some(SessionInput::RegisterMemory { .. })
    ));
}
