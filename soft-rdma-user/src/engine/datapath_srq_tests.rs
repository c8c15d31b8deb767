//! Shared receive queues in the data path: shared between queue pairs, taken in order, the limit event,
//! flushes that leave them alone, and their bounds (siw `siw_create_srq`, `siw_rqe_get`, `siw_rq_flush`).

use soft_rdma_common::wire::ddp::{Placement, QN_SEND};
use soft_rdma_common::wire::rdmap::RdmapOpcode;

use super::*;
use crate::engine::cm::CmConfig;
use crate::engine::memory::VecMemory;
use crate::engine::qp::MIN_MAX_ULPDU;

const S: SessionId = SessionId(1);
const OTHER: SessionId = SessionId(2);

fn dp() -> DataPath {
    DataPath::new(CmConfig::default_siw_compatible().adapter, 1)
}

fn srq(dp: &mut DataPath, depth: u32, limit: u32) -> SharedReceiveQueueId {
    let config = SrqConfig {
        depth,
        max_sge: 2,
        limit,
    };
    dp.create_srq(S, config).unwrap()
}

fn cq(dp: &mut DataPath) -> CompletionQueueId {
    match dp.create_cq(S, 64).unwrap() {
        CmResponse::CompletionQueue(id) => id,
        other => panic!("{other:?}"),
    }
}

/// A connected queue pair on `srq`, completing on `cq`.
fn qp_on(dp: &mut DataPath, cq: CompletionQueueId, srq: SharedReceiveQueueId) -> QueuePairId {
    let config = QueuePairConfig::on_one_cq(cq, 4);
    let CmResponse::QueuePair(id) = dp.create_qp_on(S, config, Some(srq)).unwrap() else {
        panic!("not a queue pair")
    };
    let params = QpParams {
        crc: false,
        max_ulpdu: MIN_MAX_ULPDU.max(1024),
        ird: 1,
        ord: 1,
    };
    dp.connected(id, params);
    id
}

/// A region of `len` bytes: its STag.
fn region(dp: &mut DataPath, len: usize) -> Stag {
    match dp
        .register_memory(S.into(), Box::new(VecMemory::new(len)), Access::ALL, 0)
        .unwrap()
    {
        CmResponse::MemoryRegion { stag, .. } => stag,
        other => panic!("{other:?}"),
    }
}

fn send(msn: u32, offset: u32, last: bool, payload: &[u8]) -> MessageRepr<'_> {
    MessageRepr {
        opcode: RdmapOpcode::Send,
        last,
        placement: Placement::Untagged {
            queue: QN_SEND,
            msn,
            offset,
            ulp_field: 0,
        },
        payload,
    }
}

fn sge(stag: Stag, offset: u64, length: u32) -> Sge {
    Sge {
        stag,
        offset,
        length,
    }
}

/// (queue pair, wr_id, bytes, status) of every completion so far.
fn completions(dp: &mut DataPath) -> Vec<(QueuePairId, u64, u32, NdStatus)> {
    dp.take_completions()
        .into_iter()
        .flat_map(|(_, _, cs)| cs)
        .map(|c| (c.qp, c.wr_id, c.bytes, c.status))
        .collect()
}

/// Two queue pairs take Receives from one SRQ in posting order, whichever queue pair's Send comes; each
/// completion names its queue pair; a Send that started keeps its Receive while the other queue pair's
/// Send takes the next; data lands where the Receive said.
#[test]
fn two_queue_pairs_share_one_queue_in_order() {
    let mut dp = dp();
    let (c, q) = (cq(&mut dp), srq(&mut dp, 8, 0));
    let (a, b) = (qp_on(&mut dp, c, q), qp_on(&mut dp, c, q));
    let mr = region(&mut dp, 64);
    let posts = (0..4u64).map(|i| (i, vec![sge(mr, i * 16, 16)])).collect();
    dp.post_srq(S, q, posts).unwrap();
    assert_eq!(dp.query_srq(S, q).unwrap().posted, 4);
    // A's Send in two segments, with B's whole Send between them.
    dp.on_message(a, &send(1, 0, false, b"aa")).unwrap();
    dp.on_message(b, &send(1, 0, true, b"bbbb")).unwrap();
    dp.on_message(a, &send(1, 2, true, b"AA")).unwrap();
    dp.on_message(b, &send(2, 0, true, b"cc")).unwrap();
    assert_eq!(
        completions(&mut dp),
        [
            (b, 1, 4, NdStatus::Success),
            (a, 0, 4, NdStatus::Success),
            (b, 2, 2, NdStatus::Success)
        ]
    );
    let mut out = [0u8; 48];
    dp.memory.read(mr, 0, &mut out);
    assert_eq!(&out[..4], b"aaAA");
    assert_eq!(&out[16..20], b"bbbb");
    assert_eq!(&out[32..34], b"cc");
    assert_eq!(dp.query_srq(S, q).unwrap().posted, 1);
}

/// The armed limit fires once when fewer than `limit` Receives remain, for the SRQ's session, and disarms;
/// modify re-arms it; a limit above the depth is refused.
#[test]
fn limit_event_once_then_rearmed() {
    let mut dp = dp();
    let (c, q) = (cq(&mut dp), srq(&mut dp, 4, 2));
    let a = qp_on(&mut dp, c, q);
    let mr = region(&mut dp, 64);
    dp.post_srq(S, q, (0..4u64).map(|i| (i, vec![sge(mr, 0, 8)])).collect())
        .unwrap();
    dp.on_message(a, &send(1, 0, true, b"x")).unwrap();
    dp.on_message(a, &send(2, 0, true, b"x")).unwrap();
    assert!(dp.take_srq_events().is_empty(), "2 left: not fewer than 2");
    dp.on_message(a, &send(3, 0, true, b"x")).unwrap();
    assert_eq!(dp.take_srq_events(), [(S, q)]);
    assert!(!dp.query_srq(S, q).unwrap().armed, "disarmed");
    let e = dp.modify_srq(S, q, 5).unwrap_err();
    assert_eq!(e.status, NdStatus::InvalidParameter, "{e}");
    dp.modify_srq(S, q, 1).unwrap();
    dp.on_message(a, &send(4, 0, true, b"x")).unwrap();
    assert_eq!(dp.take_srq_events(), [(S, q)]);
    assert!(dp.take_srq_events().is_empty());
}

/// A queue pair's flush completes the Receive it was filling (it took it) but leaves the SRQ's others for
/// the other queue pairs; the SRQ cannot be destroyed while a queue pair is on it (SHARING_VIOLATION).
#[test]
fn flush_leaves_the_queue_alone() {
    let mut dp = dp();
    let (c, q) = (cq(&mut dp), srq(&mut dp, 8, 0));
    let (a, b) = (qp_on(&mut dp, c, q), qp_on(&mut dp, c, q));
    let mr = region(&mut dp, 64);
    dp.post_srq(S, q, (0..3u64).map(|i| (i, vec![sge(mr, 0, 8)])).collect())
        .unwrap();
    dp.on_message(a, &send(1, 0, false, b"half")).unwrap();
    dp.detach(a, NdStatus::Canceled);
    assert_eq!(completions(&mut dp), [(a, 0, 0, NdStatus::Canceled)]);
    assert_eq!(dp.query_srq(S, q).unwrap().posted, 2);
    dp.on_message(b, &send(1, 0, true, b"ok")).unwrap();
    assert_eq!(completions(&mut dp), [(b, 1, 2, NdStatus::Success)]);
    let e = dp.close_srq(S, q).unwrap_err();
    assert_eq!(e.status, NdStatus::SharingViolation, "{e}");
    dp.close_qp(S, b).unwrap();
    assert!(completions(&mut dp).is_empty(), "the SRQ's Receives are not the queue pairs'");
    // `a` is in Error (flushed): it takes nothing more, and does not hold the SRQ.
    dp.close_srq(S, q).unwrap();
    assert!(dp.query_srq(S, q).is_err());
    assert!(dp.on_message(a, &send(2, 0, true, b"late")).is_ok(), "ignored in Error");
    dp.close_qp(S, a).unwrap();
    assert!(dp.srq_users.is_empty());
}

/// A Send with the SRQ empty has no buffer: the stream is terminated (siw_rqe_get finds none).
#[test]
fn empty_queue_is_no_buffer() {
    let mut dp = dp();
    let (c, q) = (cq(&mut dp), srq(&mut dp, 2, 0));
    let a = qp_on(&mut dp, c, q);
    assert!(dp.on_message(a, &send(1, 0, true, b"x")).is_err());
}

/// siw's rules at create and post: depth 0 or above the most, SGEs 0 or above the adapter's, a limit above
/// the depth → INVALID_PARAMETER; posting no SGE or too many → INVALID_PARAMETER, full →
/// INSUFFICIENT_RESOURCES, memory not this session's → ACCESS_VIOLATION, with the index of the refused one;
/// another session's SRQ is not found; depth counts against the session's work-queue entries.
#[test]
fn bounds() {
    let mut dp = dp().with_limits(&Limits {
        max_queue_entries_per_session: 100,
        ..Limits::default()
    });
    let bad = [(0, 1, 0), (MAX_SRQ_DEPTH + 1, 1, 0), (4, 0, 0), (4, 99, 0), (4, 1, 5)];
    for (depth, max_sge, limit) in bad {
        let config = SrqConfig {
            depth,
            max_sge,
            limit,
        };
        let e = dp.create_srq(S, config).unwrap_err();
        assert_eq!(e.status, NdStatus::InvalidParameter, "{config:?}: {e}");
    }
    let e = dp
        .create_srq(
            S,
            SrqConfig {
                depth: 101,
                max_sge: 1,
                limit: 0,
            },
        )
        .unwrap_err();
    assert_eq!(e.status, NdStatus::InsufficientResources, "{e}");
    let q = srq(&mut dp, 2, 0);
    let mr = region(&mut dp, 64);
    let (i, e) = dp
        .post_srq(S, q, vec![(0, vec![sge(mr, 0, 8)]), (1, vec![])])
        .unwrap_err();
    assert_eq!((i, e.status), (1, NdStatus::InvalidParameter));
    let three = vec![sge(mr, 0, 1), sge(mr, 1, 1), sge(mr, 2, 1)];
    let (i, e) = dp.post_srq(S, q, vec![(1, three)]).unwrap_err();
    assert_eq!((i, e.status), (0, NdStatus::InvalidParameter));
    let (i, e) = dp.post_srq(S, q, vec![(1, vec![sge(mr, 60, 8)])]).unwrap_err();
    assert_eq!((i, e.status), (0, NdStatus::AccessViolation), "{e}");
    dp.post_srq(S, q, vec![(1, vec![sge(mr, 8, 8)])]).unwrap();
    let (i, e) = dp.post_srq(S, q, vec![(2, vec![sge(mr, 0, 8)])]).unwrap_err();
    assert_eq!((i, e.status), (0, NdStatus::InsufficientResources), "{e}");
    assert!(dp.post_srq(OTHER, q, vec![]).is_err());
    assert!(dp.query_srq(OTHER, q).is_err());
    assert_eq!(dp.entries.total(), 2);
    dp.close_session(S);
    assert_eq!(dp.entries.total(), 0);
    assert!(dp.srqs.is_empty());
}
