//! soft-rdmad's event loop: one task owns the [`ConnectionManager`]; sessions, the transport and the engine's
//! timer feed it; after every input it drains the engine's transport commands and session events.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;

use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::engine::api::{SessionId, TransportEvent};
use crate::engine::cm::{CmConfig, ConnectionManager};
use crate::error::{Error, NdStatus};
use crate::transport::kernel::KernelTransport;
use crate::uds::proto::ServerMessage;
use crate::uds::server::{self, SessionInput};

/// Everything soft-rdmad needs to run.
#[derive(Clone, Debug)]
pub struct DaemonConfig {
    pub uds_path: PathBuf,
    /// Group owning the socket (mode 0660).
    pub group: Option<String>,
    pub cm: CmConfig,
}

fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// Runs the daemon until `shutdown` resolves; then every client gets DEVICE_REMOVED, every connection and
/// port is released, and the socket file is removed.
pub async fn run(config: DaemonConfig, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let listener = server::bind(&config.uds_path, config.group.as_deref()).await?;
    let (session_tx, mut session_rx) = mpsc::unbounded_channel::<SessionInput>();
    let (transport_tx, mut transport_rx) = mpsc::unbounded_channel::<TransportEvent>();
    let (mut transport, ports) = KernelTransport::new(transport_tx, config.cm.connect_timeout);
    let mut cm = ConnectionManager::new(config.cm.clone(), Box::new(ports));
    let uds = tokio::spawn(server::serve(
        listener,
        session_tx,
        config.cm.adapter.clone(),
        config.uds_path.clone(),
    ));
    info!(socket = %config.uds_path.display(), "soft-rdmad ready (kernel TCP transport)");
    let mut sessions: HashMap<SessionId, mpsc::UnboundedSender<ServerMessage>> = HashMap::new();
    tokio::pin!(shutdown);
    loop {
        let deadline = cm.poll_timeout().map(tokio::time::Instant::from_std);
        tokio::select! {
            _ = &mut shutdown => break,
            Some(input) = session_rx.recv() => match input {
                SessionInput::Opened { session, writer } => {
                    cm.open_session(session);
                    sessions.insert(session, writer);
                }
                SessionInput::Request { session, id, request } => {
                    let result = cm.handle_request(now(), session, id, request);
                    if let Some(w) = sessions.get(&session) {
                        let _ = w.send(ServerMessage::Response { id, result });
                    }
                }
                SessionInput::RegisterMemory { session, id, memory, access } => {
                    let len = memory.len();
                    let result = cm.register_memory(session, Box::new(memory), access);
                    if let Err(e) = &result {
                        warn!(session = session.0, len, error = %e, "memory registration refused");
                    }
                    if let Some(w) = sessions.get(&session) {
                        let _ = w.send(ServerMessage::Response { id, result });
                    }
                }
                SessionInput::Post { session, qp, requests } => {
                    if let Err(error) = cm.post(session, qp, requests)
                        && let Some(w) = sessions.get(&session)
                    {
                        // A Post naming a queue pair the session does not own: nothing to complete it on.
                        let _ = w.send(ServerMessage::Goodbye { error });
                    }
                }
                SessionInput::Closed { session } => {
                    sessions.remove(&session);
                    cm.close_session(now(), session);
                }
            },
            Some(event) = transport_rx.recv() => cm.handle_transport(now(), event),
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)), if deadline.is_some() => {
                cm.handle_timeout(now());
            }
        }
        drain(&mut cm, &mut transport, &sessions);
    }
    info!("shutting down: every client sees DEVICE_REMOVED");
    cm.shutdown(now());
    drain(&mut cm, &mut transport, &sessions);
    for w in sessions.values() {
        let _ = w.send(ServerMessage::Goodbye {
            error: Error::new(NdStatus::DeviceRemoved, "soft-rdmad stopped"),
        });
    }
    uds.abort();
    if let Err(e) = std::fs::remove_file(&config.uds_path) {
        warn!(error = %e, "removing the socket file");
    }
    // Give session writers a moment to flush their Goodbye.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    Ok(())
}

fn drain(
    cm: &mut ConnectionManager,
    transport: &mut KernelTransport,
    sessions: &HashMap<SessionId, mpsc::UnboundedSender<ServerMessage>>,
) {
    while let Some(cmd) = cm.poll_transport() {
        transport.execute(cmd);
    }
    while let Some((session, event)) = cm.poll_event() {
        if let Some(w) = sessions.get(&session) {
            let _ = w.send(ServerMessage::Event(event));
        }
    }
    for (session, cq, entries) in cm.poll_completions() {
        if let Some(w) = sessions.get(&session) {
            let _ = w.send(ServerMessage::Completions { cq, entries });
        }
    }
}
