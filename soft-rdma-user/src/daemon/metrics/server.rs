//! The metrics endpoint's HTTP server: hyper's HTTP/1 on a thread and a current-thread runtime of its own,
//! so that no scraper, however slow or however many, takes a turn from the event loop.
//!
//! Bounds, each a constant below: at most [`MAX_CONNECTIONS`] connections at once (one more is closed as
//! soon as it is accepted, and counted); a request's head within [`MAX_REQUEST_BYTES`] and
//! [`HEADER_TIMEOUT`]; a connection's whole life within [`CONNECTION_LIFETIME`], however slowly it reads
//! the answer. Only `GET` and `HEAD /metrics` are served; a request body is never read.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{ACCEPT, ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{Mutex, Semaphore, mpsc, oneshot};
use tracing::{debug, info};

use super::exposition::{self, Format, ServerCounters};
use super::{Snapshot, SnapshotRequest, SnapshotRequests};

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 16;
/// The largest request head read (hyper's smallest read buffer).
pub const MAX_REQUEST_BYTES: usize = 8192;
/// Time a connection has to send a request head, each time.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Time a connection may stay open, whatever it does.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);
/// A snapshot younger than this is served again rather than asked for anew.
pub const REFRESH_AFTER: Duration = Duration::from_millis(250);
/// How long a scrape waits for the event loop's snapshot before it is served the previous one.
pub const REFRESH_WAIT: Duration = Duration::from_secs(1);

/// Binds `addr` now (an address in use is an error at start) and serves `/metrics` on it from a thread of
/// its own. The event loop answers the requests that come out of the returned channel; when it drops it,
/// the server stops.
pub fn start(addr: SocketAddr) -> anyhow::Result<SnapshotRequests> {
    let listener = std::net::TcpListener::bind(addr)
        .with_context(|| format!("binding the metrics endpoint to {addr} (--metrics-listen)"))?;
    listener.set_nonblocking(true)?;
    let (tx, rx) = mpsc::channel(1);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("soft-rdmad-metrics".into())
        .spawn(move || {
            runtime.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => serve(l, tx).await,
                    Err(e) => tracing::error!(error = %e, "the metrics endpoint cannot use its socket"),
                }
            })
        })?;
    info!(%addr, "metrics endpoint: http://{addr}/metrics");
    Ok(rx)
}

/// The snapshot scrapes are served from, and how it is refreshed.
struct Snapshots {
    ask: mpsc::Sender<SnapshotRequest>,
    /// The last snapshot and when it came. Held across a refresh, so that one scrape asks the loop and the
    /// others wait for its answer instead of asking again.
    last: Mutex<Option<(Instant, Arc<Snapshot>)>>,
    counters: Arc<ServerCounters>,
}

impl Snapshots {
    /// A snapshot at most [`REFRESH_AFTER`] old, or the last one if the loop does not answer within
    /// [`REFRESH_WAIT`] (`None` if there is none yet).
    async fn get(&self) -> Option<Arc<Snapshot>> {
        let mut last = self.last.lock().await;
        if let Some((at, s)) = &*last
            && at.elapsed() < REFRESH_AFTER
        {
            return Some(s.clone());
        }
        let (reply, answer) = oneshot::channel();
        // Full: an earlier request is still waiting for the loop, which is busy; do not queue another.
        if self.ask.try_send(reply).is_ok()
            && let Ok(Ok(s)) = tokio::time::timeout(REFRESH_WAIT, answer).await
        {
            *last = Some((Instant::now(), s.clone()));
            return Some(s);
        }
        self.counters.stale_snapshots.fetch_add(1, Ordering::Relaxed);
        last.as_ref().map(|(_, s)| s.clone())
    }
}

async fn serve(listener: tokio::net::TcpListener, ask: mpsc::Sender<SnapshotRequest>) {
    let counters = Arc::new(ServerCounters::default());
    let snapshots = Arc::new(Snapshots {
        ask: ask.clone(),
        last: Mutex::new(None),
        counters: counters.clone(),
    });
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors, most likely: give the connections a moment to end.
                    crate::warn_limited!(error = %e, "the metrics endpoint cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = ask.closed() => {
                debug!("the event loop ended: the metrics endpoint stops");
                return;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            counters.refused_connections.fetch_add(1, Ordering::Relaxed);
            crate::warn_limited!(
                max = MAX_CONNECTIONS,
                "metrics endpoint: connection closed, {MAX_CONNECTIONS} already open"
            );
            drop(stream);
            continue;
        };
        let snapshots = snapshots.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let snapshots = snapshots.clone();
                async move { Ok::<_, Infallible>(respond(&req, &snapshots).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(MAX_REQUEST_BYTES)
                .serve_connection(TokioIo::new(stream), service);
            if tokio::time::timeout(CONNECTION_LIFETIME, conn).await.is_err() {
                debug!("metrics endpoint: a connection outlived its time and was closed");
            }
            drop(slot);
        });
    }
}

/// The answer to one request.
async fn respond(req: &Request<Incoming>, snapshots: &Snapshots) -> Response<Full<Bytes>> {
    if req.uri().path() != "/metrics" {
        return plain(StatusCode::NOT_FOUND, "soft-rdmad serves /metrics only\n");
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "/metrics takes GET or HEAD\n");
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let format = Format::negotiate(req.headers().get(ACCEPT).and_then(|v| v.to_str().ok()));
    let Some(snapshot) = snapshots.get().await else {
        return plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "soft-rdmad's event loop has not answered yet; try again\n",
        );
    };
    match exposition::encode(snapshot, snapshots.counters.clone(), format) {
        Ok(body) => {
            let mut r = Response::new(Full::new(Bytes::from(body)));
            r.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(format.content_type()));
            r
        }
        Err(_) => plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the metrics could not be encoded\n",
        ),
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}
