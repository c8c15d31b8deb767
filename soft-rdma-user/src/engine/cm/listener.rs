//! Listeners and shared endpoints (IND2Listener, NdkConnectWithSharedEndpoint): offers queued to a listener
//! and handed to GetConnectionRequest.

use std::collections::VecDeque;
use std::net::SocketAddr;

use tracing::info;

use super::{Call, Endpoint, connection_invalid, not_found, owned_by};
use crate::engine::connection::Phase;
use crate::engine::counters::SetupOutcome;
use crate::engine::mpa;
use crate::engine::mpa::MpaOffer;
use crate::engine::requests::{
    CmRequest, CmResponse, ConnectorId, ListenerId, RequestId, SessionId, SharedEndpointId,
};
use crate::engine::status::ConnectorState;
use crate::engine::transport_seam::{ConnId, TransportCommand};
use crate::error::{Error, NdStatus, Result};

#[derive(Debug)]
pub(super) struct Listener {
    pub(super) session: SessionId,
    pub(super) local: Option<SocketAddr>,
    pub(super) backlog: u32,
    /// Offers whose MPA Request arrived, not yet handed to GetConnectionRequest.
    pub(super) queued: VecDeque<ConnId>,
    /// GetConnectionRequest calls waiting for an offer.
    pub(super) waiting: VecDeque<(RequestId, ConnectorId)>,
}

#[derive(Debug)]
pub(super) struct SharedEndpoint {
    pub(super) session: SessionId,
    pub(super) local: SocketAddr,
}

impl Endpoint {
    /// Listener and shared-endpoint requests (IND2Listener, NdkCreateSharedEndpoint).
    pub(super) fn on_listener_request(&mut self, call: Call, req: CmRequest) -> Result<CmResponse> {
        let Call { session, request, .. } = call;
        match req {
            CmRequest::CreateListener => {
                let id = ListenerId(self.id());
                self.listeners.insert(
                    id,
                    Listener {
                        session,
                        local: None,
                        backlog: 0,
                        queued: VecDeque::new(),
                        waiting: VecDeque::new(),
                    },
                );
                Ok(CmResponse::Listener(id))
            }
            CmRequest::CloseListener { listener } => {
                self.listener_mut(session, listener)?;
                self.close_listener(listener);
                Ok(CmResponse::Done)
            }
            CmRequest::Listen {
                listener,
                local,
                backlog,
            } => {
                let l = owned_by(self.listeners.get_mut(&listener), session, listener.0)?;
                if l.local.is_some() {
                    return Err(Error::new(
                        NdStatus::InvalidParameter,
                        "listener is already listening",
                    ));
                }
                let bound = self.ports.bind_listener(local, self.host.as_mut())?;
                l.local = Some(bound);
                l.backlog = backlog;
                self.transmit.push_back(TransportCommand::Listen {
                    listener,
                    local: bound,
                });
                info!(listener = listener.0, %bound, backlog, "listening");
                Ok(CmResponse::Bound(bound))
            }
            CmRequest::GetConnectionRequest { listener, connector } => {
                let c = self.connector(session, connector)?;
                if c.state != ConnectorState::Idle {
                    return Err(Error::new(
                        NdStatus::ConnectionActive,
                        "connector is already in use",
                    ));
                }
                let l = self.listener_mut(session, listener)?;
                if l.local.is_none() {
                    return Err(connection_invalid("listener is not listening"));
                }
                if let Some(conn) = l.queued.pop_front() {
                    self.attach_offer(conn, connector)
                } else {
                    l.waiting.push_back((request, connector));
                    Ok(CmResponse::Pending)
                }
            }
            CmRequest::CreateSharedEndpoint { local } => {
                let bound = self.ports.bind(local, true, self.host.as_mut())?;
                let id = SharedEndpointId(self.id());
                self.endpoints.insert(
                    id,
                    SharedEndpoint {
                        session,
                        local: bound,
                    },
                );
                Ok(CmResponse::SharedEndpoint(id))
            }
            CmRequest::CloseSharedEndpoint { endpoint } => {
                let ep = self
                    .endpoints
                    .get(&endpoint)
                    .filter(|e| e.session == session)
                    .ok_or_else(|| not_found("shared endpoint", endpoint.0))?;
                let local = ep.local;
                self.endpoints.remove(&endpoint);
                self.ports.release(local, self.host.as_mut());
                Ok(CmResponse::Done)
            }
            other => Err(Error::new(
                NdStatus::InvalidParameter,
                format!("{other:?} is not a listener request"),
            )),
        }
    }

    pub(super) fn close_listener(&mut self, listener: ListenerId) {
        let Some(l) = self.listeners.remove(&listener) else {
            return;
        };
        for (r, _) in l.waiting {
            self.complete(
                l.session,
                r,
                Err(Error::new(NdStatus::Canceled, "listener closed")),
            );
        }
        // Offers nobody took, and connections still handshaking, are refused by closing them.
        let orphans: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                c.connector.is_none()
                    && matches!(c.phase, Phase::AwaitingRequest { listener: x, .. } | Phase::Offered { listener: x } if x == listener)
            })
            .map(|(id, _)| *id)
            .collect();
        for conn in orphans {
            self.counters.passive_ended(conn, SetupOutcome::Cancelled);
            self.close_conn(conn, true);
        }
        if let Some(local) = l.local {
            self.transmit
                .push_back(TransportCommand::StopListening { listener });
            self.ports.release(local, self.host.as_mut());
        }
    }

    pub(super) fn on_offer(&mut self, conn: ConnId, listener: ListenerId, offer: MpaOffer) {
        let Some(l) = self.listeners.get_mut(&listener) else {
            self.close_conn(conn, true);
            return;
        };
        self.counters.passive_began(conn);
        if l.backlog != 0 && l.queued.len() >= l.backlog as usize && l.waiting.is_empty() {
            self.counters.passive_ended(conn, SetupOutcome::Refused);
            // Past the backlog offers are refused: CONNECTION_REFUSED at the active side (docs/connector-semantics.md).
            let reply = mpa::reject_reply(offer.revision, offer.enhanced.is_some(), &[]);
            self.send(conn, reply);
            self.close_conn(conn, false);
            return;
        }
        let (session, waiting) = (l.session, l.waiting.pop_front());
        let Some(cn) = self.conns.get_mut(&conn) else {
            return;
        };
        cn.phase = Phase::Offered { listener };
        cn.offer = Some(offer);
        let attached = waiting.map(|(request, connector)| (request, self.attach_offer(conn, connector)));
        match attached {
            Some((request, Ok(response))) => self.complete(session, request, Ok(response)),
            unanswered => {
                if let Some((request, Err(e))) = unanswered {
                    self.complete(session, request, Err(e));
                }
                if let Some(l) = self.listeners.get_mut(&listener) {
                    l.queued.push_back(conn);
                }
            }
        }
    }
}
