//! What an application is told, in words, when it makes one of the data path's common mistakes (issue 30):
//! a region without REMOTE_WRITE, a wrong STag, an RDMA Write past a region's end, a Receive posted after the
//! peer's Send, an RDMA Read with an outbound read limit of 0. Two real soft-rdmad daemons in a pair of
//! network namespaces, queue pairs connected through the client library.
//!
//! An RDMA Write completes at the sender when it is sent (as with siw: iWARP has no end-to-end
//! acknowledgement), so a mistake the target finds reaches the sender later, as the target's Terminate. For
//! each case the test checks what the sender is told (its queue pair's status, the error of its next post's
//! completion, its Disconnect) and, where the mistake is the target's, what the target is told, on the side
//! that made it. Every check is on the words; waits are bounded only as hang guards. Needs root; the
//! transport follows `$SOFT_RDMA_TEST_TRANSPORT`.

use soft_rdma::NdStatus;
use soft_rdma::client::{Access, CompletionOp, ReadLimits, RemoteBuffer, Stag};
use soft_rdma_tests::ends::{End, listen_and_connect_ok};
use soft_rdma_tests::ops::{assert_ok, completions, terminated, within};
use soft_rdma_tests::{Daemon, Side, TestNet};

const PORT: u16 = 7400;

/// Read limits of the connections whose Reads are not the point.
const LIMITS: ReadLimits = ReadLimits::symmetric(4);

struct Pair {
    net: TestNet,
    _daemons: (Daemon, Daemon),
    a: End,
    b: End,
}

/// Two daemons, a queue pair on each side, A connected to B with read limits `la` and `lb`. No Receive is
/// posted on either side.
async fn pair(tag: &str, la: ReadLimits, lb: ReadLimits) -> Pair {
    let net = TestNet::new(tag).expect("netns pair");
    let da = net.spawn_daemon(Side::A, &[]).expect("daemon A");
    let db = net.spawn_daemon(Side::B, &[]).expect("daemon B");
    let (a, b) = (
        End::open(da.uds_path(), 64, 16).await,
        End::open(db.uds_path(), 64, 16).await,
    );
    listen_and_connect_ok(&a, &b, net.addr(Side::B, PORT), (la, lb)).await;
    Pair {
        net,
        _daemons: (da, db),
        a,
        b,
    }
}

/// `text` holds each of `words`.
fn assert_says(what: &str, text: &str, words: &[&str]) {
    for w in words {
        assert!(text.contains(w), "{what} does not say {w:?}:\n{text}");
    }
}

/// What `end` is told once its stream was terminated (by `who`: "the peer" or "this side", with `cause` in
/// words, then `meaning`): its queue pair's status; the completion of a Send it posts then (flushed), as an
/// error; its Disconnect, after NotifyDisconnect said the connection is over. Its earlier requests are
/// `earlier` (work request ids), each completed with SUCCESS. Returns the status's words.
async fn told(end: &End, earlier: &[u64], who: &str, cause: &str, meaning: &[&str]) -> String {
    let info = terminated(&end.qp).await;
    let status = end.qp.query().await.unwrap().to_string();
    let ended = format!("{who} terminated the connection with {cause}");
    assert!(
        status.contains(&format!(": Error: {ended}")),
        "the status says who ended the stream and why:\n{status}"
    );
    assert_says("the status", &status, meaning);
    assert_eq!(status, format!("queue pair {}: Error: {info}", end.qp.id().0));
    // The next post is flushed; its completion, as a Result, says what ended the queue pair.
    let spare = end.register(64).await;
    end.qp.send(99, &[spare.sge(0, 8)]).unwrap();
    let got = completions(&end.cq, earlier.len() + 1).await;
    for (c, id) in got.iter().zip(earlier) {
        assert_eq!((c.wr_id, c.status), (*id, NdStatus::Success), "{got:?}");
    }
    let flushed = got.last().unwrap();
    assert_eq!((flushed.wr_id, flushed.status), (99, NdStatus::Canceled));
    let e = end.qp.query().await.unwrap().result_of(flushed).unwrap_err();
    assert_eq!(e.status, NdStatus::Canceled);
    assert_says(
        "the flushed Send's error",
        &e.to_string(),
        &[&format!(
            "Send 99 on queue pair {} was flushed, not carried out: the queue pair is in Error because \
             {ended}",
            end.qp.id().0
        )],
    );
    // NotifyDisconnect completes: the connection is over. Disconnect then says what ended it.
    within("NotifyDisconnect", end.connector.notify_disconnect())
        .await
        .unwrap();
    let e = within("Disconnect", end.connector.disconnect())
        .await
        .unwrap_err();
    assert_eq!(e.status, NdStatus::ConnectionInvalid, "{e}");
    assert_says(
        "Disconnect's error",
        &e.to_string(),
        &[&format!("its connection already ended when {ended}")],
    );
    status
}

/// The cause B sends for an RDMA Write it refuses (RFC 5041 §7.2; siw also for a missing access right).
const INVALID_STAG: &str =
    "DDP tagged buffer error, invalid STag (layer 1, type 1, code 0x00; RFC 5041 §7.2)";

/// What A, the sender, is told when B refuses its RDMA Write for its STag: every possible reason, since
/// the Terminate carries only the cause.
const WRITE_REFUSED_FOR_ITS_STAG: &[&str] = &[
    "the receiver refused an RDMA Write or Read Response whose STag it does not accept",
    "registered without REMOTE_WRITE",
    "Check the STag the peer advertised, and that the peer registered that region with Access::REMOTE_WRITE",
];

/// The target's mistake: its region lacks REMOTE_WRITE. The sender hears an invalid STag (all a Terminate
/// can say, as siw); the target is told which right is missing and how to grant it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_without_remote_write() {
    let p = pair("ewr", LIMITS, LIMITS).await;
    let local = p.a.register(4096).await;
    let read_only =
        p.b.adapter
            .register_memory(4096, Access::LOCAL_WRITE | Access::REMOTE_READ)
            .await
            .unwrap();
    p.a.qp.write(1, &[local.sge(0, 64)], read_only.remote(0)).unwrap();
    told(&p.a, &[1], "the peer", INVALID_STAG, WRITE_REFUSED_FOR_ITS_STAG).await;
    let rule = format!(
        "the peer's RDMA Write to STag {:#010x} (64 bytes at tagged offset 0): the region was registered \
         without REMOTE_WRITE: register it with Access::REMOTE_WRITE for the peer to write it",
        read_only.stag().0
    );
    told(&p.b, &[], "this side", INVALID_STAG, &[&rule]).await;
    drop(p.net);
}

/// The sender's mistake: an STag the target never gave. Both sides say so; the target names the STag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_stag() {
    let p = pair("estag", LIMITS, LIMITS).await;
    let local = p.a.register(4096).await;
    let target = p.b.register(4096).await;
    let wrong = Stag(target.stag().0 ^ 0x55);
    let remote = RemoteBuffer {
        stag: wrong,
        offset: 0,
    };
    p.a.qp.write(1, &[local.sge(0, 64)], remote).unwrap();
    told(&p.a, &[1], "the peer", INVALID_STAG, WRITE_REFUSED_FOR_ITS_STAG).await;
    let rule = format!(
        "the peer's RDMA Write to STag {:#010x} (64 bytes at tagged offset 0): no region here has that STag \
         (never registered, deregistered or invalidated): the peer used a wrong or stale STag",
        wrong.0
    );
    told(&p.b, &[], "this side", INVALID_STAG, &[&rule]).await;
    drop(p.net);
}

/// The sender's mistake: an RDMA Write past the end of the target's region.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_past_the_end() {
    let p = pair("eend", LIMITS, LIMITS).await;
    let local = p.a.register(4096).await;
    let target = p.b.register(4096).await;
    p.a.qp
        .write(1, &[local.sge(0, 200)], target.remote(4000))
        .unwrap();
    let cause =
        "DDP tagged buffer error, base or bounds violation (layer 1, type 1, code 0x01; RFC 5041 §7.2)";
    told(
        &p.a,
        &[1],
        "the peer",
        cause,
        &[
            "the receiver refused an RDMA Write or Read Response that reaches outside the region its STag \
           names. Check the tagged offset and length against the size of the region the peer advertised",
        ],
    )
    .await;
    let rule = format!(
        "the peer's RDMA Write to STag {:#010x} (200 bytes at tagged offset 4000): it reaches past the end \
         of the region",
        target.stag().0
    );
    told(&p.b, &[], "this side", cause, &[&rule]).await;
    drop(p.net);
}

/// The target's mistake: no Receive posted when the peer's Send arrives (iWARP has no receiver-not-ready
/// retry). The Receive it posts afterwards is flushed, and says why; the sender is told to have the peer
/// post its Receives first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_posted_after_the_send() {
    let p = pair("ercv", LIMITS, LIMITS).await;
    let local = p.a.register(4096).await;
    p.a.qp.send(1, &[local.sge(0, 10)]).unwrap();
    let cause =
        "DDP untagged buffer error, no buffer for the MSN (layer 1, type 2, code 0x02; RFC 5041 §7.2)";
    told(
        &p.a,
        &[1],
        "the peer",
        cause,
        &[
            "a Send arrived and the receiver had no Receive posted for it; iWARP has no receiver-not-ready \
           retry. The peer must post its Receives before this side's first Send can arrive",
        ],
    )
    .await;
    // B's Receive, too late: flushed, and its error says why.
    let inbox = p.b.register(4096).await;
    p.b.qp.receive(5, &[inbox.sge(0, 64)]).unwrap();
    let late = completions(&p.b.cq, 1).await.remove(0);
    assert_eq!(
        (late.wr_id, late.op, late.status),
        (5, CompletionOp::Receive, NdStatus::Canceled)
    );
    let e = p.b.qp.query().await.unwrap().result_of(&late).unwrap_err();
    let rule = "the peer's Send: no Receive was posted for it, and iWARP has no receiver-not-ready retry \
                (RFC 5041 §7.2): post Receives before the peer can send, that is before accept_qp or \
                complete_connect";
    assert_says(
        "the late Receive's error",
        &e.to_string(),
        &[
            "Receive 5 on queue pair",
            &format!(
                "was flushed, not carried out: the queue pair is in Error because this side terminated the connection with {cause}"
            ),
            rule,
        ],
    );
    told(&p.b, &[], "this side", cause, &[rule]).await;
    drop(p.net);
}

/// An RDMA Read on a connection whose outbound read limit is 0 (`ReadLimits::NONE`): refused with
/// INVALID_PARAMETER, and its error names the limit and how to ask for one. With the default limits the same
/// Read works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_with_an_outbound_limit_of_0() {
    let p = pair("eord", ReadLimits::NONE, ReadLimits::default()).await;
    let sink = p.a.register(4096).await;
    let source = p.b.register(4096).await;
    p.a.qp.read(1, sink.sge(0, 64), source.remote(0)).unwrap();
    let c = completions(&p.a.cq, 1).await.remove(0);
    assert_eq!((c.wr_id, c.status), (1, NdStatus::InvalidParameter));
    let status = p.a.qp.query().await.unwrap();
    assert_eq!(status.ord, 0, "{status:?}");
    let e = status.result_of(&c).unwrap_err();
    assert_says(
        "the refused Read's error",
        &e.to_string(),
        &[
            "RDMA Read 1 on queue pair",
            "was refused: this connection's outbound read limit (ORD) is 0",
            "ask for one in the ReadLimits given to connect_qp or accept_qp (ReadLimits::ADAPTER_MAX, or \
             ReadLimits::symmetric(n))",
        ],
    );
    drop(p);

    let p = pair("edef", ReadLimits::default(), ReadLimits::default()).await;
    let sink = p.a.register(4096).await;
    let source = p.b.register(4096).await;
    source.write_at(0, b"read me").unwrap();
    p.a.qp.read(1, sink.sge(0, 7), source.remote(0)).unwrap();
    assert_ok(&completions(&p.a.cq, 1).await[0], 1, CompletionOp::Read, 7);
    assert_eq!(sink.to_vec(0, 7).unwrap(), b"read me");
    let max = p.a.adapter.info().max_outbound_read_limit;
    assert_eq!(
        p.a.qp.query().await.unwrap().ord,
        max,
        "the default asks for the adapter's limit"
    );
    drop(p.net);
}
