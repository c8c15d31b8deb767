//! The daemon's side of the UDS protocol: one session per client connection.
//!
//! A session starts with `Hello` (version checked) and gets `Welcome`; its requests go to the event loop,
//! whose answers and completions come back in order on the session's writer. A session that closes, or sends
//! anything malformed (answered with `Goodbye` and INVALID_PARAMETER), is closed in the engine, which
//! releases everything it held. Peer credentials (SO_PEERCRED) are logged with each session.
//!
//! RegisterMemory frames carry the region's memfd (SCM_RIGHTS, read with [`super::fdpass`]); the session
//! maps it here ([`SharedMemory::from_fd`], which refuses files that are too short or not sealed against
//! shrinking) so the event loop only ever sees mapped memory.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, bail};
use std::collections::VecDeque;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tracing::{Instrument, info, info_span, warn};

use super::fdpass::read_with_fds;
use super::proto::{
    ClientMessage, MAX_CLIENT_FRAME, PROTOCOL_VERSION, ProtoError, ServerMessage, split_frame,
};
use crate::engine::api::{Access, AdapterInfo, CmRequest, QueuePairId, RequestId, SessionId, WorkRequest};
use crate::error::{Error, NdStatus};
use crate::shm::SharedMemory;

/// File descriptors a session may have received ahead of the frames that announce them.
const MAX_PENDING_FDS: usize = 16;

/// What sessions tell the event loop.
#[derive(Debug)]
pub enum SessionInput {
    Opened {
        session: SessionId,
        writer: mpsc::UnboundedSender<ServerMessage>,
    },
    Request {
        session: SessionId,
        id: RequestId,
        request: CmRequest,
    },
    /// RegisterMemory with its memfd already mapped.
    RegisterMemory {
        session: SessionId,
        id: RequestId,
        memory: SharedMemory,
        access: Access,
    },
    Post {
        session: SessionId,
        qp: QueuePairId,
        requests: Vec<WorkRequest>,
    },
    Closed {
        session: SessionId,
    },
}

/// Binds the daemon's socket: creates the directory, refuses to start if a live daemon answers there,
/// replaces a stale socket file, sets mode 0660 and, if given, the group.
pub async fn bind(path: &Path, group: Option<&str>) -> anyhow::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if path.exists() {
        if UnixStream::connect(path).await.is_ok() {
            bail!("another soft-rdmad is already serving {}", path.display());
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing the stale socket {}", path.display()))?;
    }
    let listener = UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    if let Some(group) = group {
        let g = nix::unistd::Group::from_name(group)?.with_context(|| format!("no group named {group}"))?;
        nix::unistd::chown(path, None, Some(g.gid))
            .with_context(|| format!("chgrp {group} {}", path.display()))?;
    }
    Ok(listener)
}

/// Accepts sessions forever.
pub async fn serve(
    listener: UnixListener,
    inputs: mpsc::UnboundedSender<SessionInput>,
    adapter: AdapterInfo,
    path: PathBuf,
) {
    let next = Arc::new(AtomicU64::new(1));
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                warn!(socket = %path.display(), error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let session = SessionId(next.fetch_add(1, Ordering::Relaxed));
        let creds = stream.peer_cred().ok();
        let (pid, uid, gid) = creds.map_or((None, 0, 0), |c| (c.pid(), c.uid(), c.gid()));
        let span = info_span!("session", id = session.0, pid, uid, gid);
        tokio::spawn(run_session(session, stream, inputs.clone(), adapter.clone()).instrument(span));
    }
}

async fn run_session(
    session: SessionId,
    stream: UnixStream,
    inputs: mpsc::UnboundedSender<SessionInput>,
    adapter: AdapterInfo,
) {
    info!("session opened");
    let (rd, mut wr) = stream.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<ServerMessage>();
    let writer = tokio::spawn(async move {
        let mut out = BytesMut::new();
        while let Some(msg) = rx.recv().await {
            let last = matches!(msg, ServerMessage::Goodbye { .. });
            out.clear();
            msg.encode(&mut out);
            if wr.write_all(&out).await.is_err() || last {
                break;
            }
        }
        let _ = wr.shutdown().await;
    });
    let outcome = read_session(session, rd.as_ref(), &tx, &inputs, adapter).await;
    match &outcome {
        Ok(()) => info!("session closed by the client"),
        Err(e) => {
            warn!(error = %e, "session ended: protocol error");
            let _ = tx.send(ServerMessage::Goodbye {
                error: Error::new(NdStatus::InvalidParameter, e.to_string()),
            });
        }
    }
    let _ = inputs.send(SessionInput::Closed { session });
    drop(tx);
    let _ = writer.await;
}

async fn read_session(
    session: SessionId,
    rd: &UnixStream,
    tx: &mpsc::UnboundedSender<ServerMessage>,
    inputs: &mpsc::UnboundedSender<SessionInput>,
    adapter: AdapterInfo,
) -> Result<(), ProtoError> {
    let mut buf = BytesMut::with_capacity(4096);
    let mut fds = VecDeque::new();
    let mut hello = false;
    loop {
        while let Some(frame) = split_frame(&mut buf, MAX_CLIENT_FRAME)? {
            match ClientMessage::decode(&frame)? {
                ClientMessage::Hello { version, client_name } => {
                    if hello {
                        return Err(ProtoError::Malformed("a second Hello".into()));
                    }
                    if version != PROTOCOL_VERSION {
                        return Err(ProtoError::UnsupportedVersion(version));
                    }
                    hello = true;
                    info!(client = %client_name, "hello");
                    let _ = tx.send(ServerMessage::Welcome {
                        version: PROTOCOL_VERSION,
                        session,
                        adapter: adapter.clone(),
                    });
                    let _ = inputs.send(SessionInput::Opened {
                        session,
                        writer: tx.clone(),
                    });
                }
                _ if !hello => {
                    return Err(ProtoError::Malformed("a Request before Hello".into()));
                }
                ClientMessage::Request {
                    id,
                    request: CmRequest::RegisterMemory { length, access },
                } => {
                    let fd = fds.pop_front().ok_or(ProtoError::MissingFds(1))?;
                    let mapped = usize::try_from(length)
                        .map_err(|_| std::io::Error::other("length exceeds the address space"))
                        .and_then(|len| SharedMemory::from_fd(fd, len));
                    match mapped {
                        Ok(memory) => {
                            let _ = inputs.send(SessionInput::RegisterMemory {
                                session,
                                id,
                                memory,
                                access,
                            });
                        }
                        Err(e) => {
                            let _ = tx.send(ServerMessage::Response {
                                id,
                                result: Err(Error::new(
                                    NdStatus::InvalidParameter,
                                    format!("cannot map the region's memfd ({length} bytes): {e}"),
                                )),
                            });
                        }
                    }
                }
                ClientMessage::Request { id, request } => {
                    let _ = inputs.send(SessionInput::Request { session, id, request });
                }
                ClientMessage::Post { qp, requests } => {
                    let _ = inputs.send(SessionInput::Post {
                        session,
                        qp,
                        requests,
                    });
                }
            }
        }
        match read_with_fds(rd, &mut buf, &mut fds).await {
            Ok(0) => return Ok(()),
            // A client that exits with replies unread resets the socket: an ordinary end of session.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(()),
            Ok(_) => {}
            Err(e) => return Err(ProtoError::Malformed(format!("read failed: {e}"))),
        }
        if fds.len() > MAX_PENDING_FDS {
            return Err(ProtoError::Malformed(format!(
                "{} file descriptors sent without frames that take them",
                fds.len()
            )));
        }
    }
}
