//! What every data-moving netns test does around the client library: bound an await, make a recognisable
//! payload, collect completions, check one. One copy here instead of one per test file.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use soft_rdma::NdStatus;
use soft_rdma::client::{
    Adapter, Completion, CompletionOp, CompletionQueue, QueuePair, QueuePairState, TerminateInfo,
};

/// How long [`within`] lets one step take.
pub const STEP_LIMIT: Duration = Duration::from_secs(60);

/// `f`, or a panic naming `what` if it takes longer than `limit` (a hang fails the test, never stalls it).
pub async fn within_for<T>(limit: Duration, what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, f)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish in {limit:?}"))
}

/// [`within_for`] [`STEP_LIMIT`].
pub async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    within_for(STEP_LIMIT, what, f).await
}

/// A pattern that differs per byte and per `seed`, so that a misplaced or stale byte shows.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2_654_435_761)
                .rotate_left(seed as u32 % 31) as u8
                ^ seed
        })
        .collect()
}

/// Exactly `n` completions from `cq`, each wait bounded by `limit`.
pub async fn completions_within(limit: Duration, cq: &CompletionQueue, n: usize) -> Vec<Completion> {
    let mut got = Vec::new();
    while got.len() < n {
        got.extend(
            within_for(limit, "completions", cq.wait(n - got.len()))
                .await
                .unwrap(),
        );
    }
    got
}

/// [`completions_within`] [`STEP_LIMIT`].
pub async fn completions(cq: &CompletionQueue, n: usize) -> Vec<Completion> {
    completions_within(STEP_LIMIT, cq, n).await
}

/// `c` is work request `id`'s successful `op` of `bytes` bytes.
pub fn assert_ok(c: &Completion, id: u64, op: CompletionOp, bytes: u32) {
    assert_eq!(
        (c.wr_id, c.op, c.status, c.bytes),
        (id, op, NdStatus::Success, bytes),
        "completion {c:?}"
    );
}

/// Polls `check` (every 20 ms) until it returns `Some`, at most [`STEP_LIMIT`]: waiting for a state a daemon
/// reports, never for a guessed time.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    within(what, async {
        loop {
            if let Some(v) = check().await {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

/// Starts the request `f` makes on `adapter`'s session (a client call sends its request on its first
/// poll) and returns it still pending once the daemon has taken it: a second request on the same session
/// is answered only after the first was handled (a session's requests are handled in order), so when
/// the status answer is back, `f`'s request is registered. For "B's NotifyDisconnect is in before A
/// disconnects" without a sleep.
pub async fn registered<'a, F>(
    adapter: &Adapter,
    f: F,
) -> Pin<Box<dyn Future<Output = F::Output> + Send + 'a>>
where
    F: Future + Send + 'a,
    F::Output: Send + 'a,
{
    let mut f = Box::pin(f);
    if let Poll::Ready(v) = std::future::poll_fn(|cx| Poll::Ready(f.as_mut().poll(cx))).await {
        return Box::pin(std::future::ready(v));
    }
    adapter
        .status()
        .await
        .expect("a status round trip on the same session");
    f
}

/// The status of a call that must fail (a success is a panic naming what came back).
pub fn err_status<T: std::fmt::Debug>(r: soft_rdma::Result<T>) -> NdStatus {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e.status,
    }
}

/// Waits (at most [`STEP_LIMIT`]) until `qp` is in Error and returns its Terminate record.
pub async fn terminated(qp: &QueuePair) -> TerminateInfo {
    eventually("the queue pair to fail with a Terminate", async || {
        let s = qp.query().await.unwrap();
        (s.state == QueuePairState::Error).then(|| {
            s.terminate
                .unwrap_or_else(|| panic!("in Error without a Terminate: {s:?}"))
        })
    })
    .await
}
