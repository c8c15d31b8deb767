//! What every data-moving netns test does around the client library: bound an await, make a recognisable
//! payload, collect completions, check one. One copy here instead of one per test file.

use std::future::Future;
use std::time::Duration;

use soft_rdma::NdStatus;
use soft_rdma::client::CompletionQueue;
use soft_rdma::client::{Completion, CompletionOp};

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

/// Polls `check` every 20 ms until it returns `Some` (at most [`STEP_LIMIT`]): waiting for a state the
/// daemon reaches on its own (a session released, a counter updated), never for a time.
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
