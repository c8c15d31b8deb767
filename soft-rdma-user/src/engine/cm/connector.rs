//! Connectors (IND2Connector, NdkConnect; docs/connector-semantics.md): their state, and the active and
//! passive sides' requests (Bind, Connect, CompleteConnect, Accept, Reject, Disconnect) and endings.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Instant;

use bytes::Bytes;
use tracing::{debug, info};

use super::{
    Call, Endpoint, check_private_data, connection_invalid, not_found, owned_connector, take_id,
    unspecified_like,
};
use crate::engine::connection::{Connection, Phase, REJECT_LINGER};
use crate::engine::counters::SetupOutcome;
use crate::engine::datapath::DataPath;
use crate::engine::mpa::{MpaConfig, MpaInitiator, MpaOffer, Negotiated};
use crate::engine::qp::QpParams;
use crate::engine::read_limits;
use crate::engine::requests::{
    CmRequest, CmResponse, ConnectorId, ObjectRef, ReadLimits, RequestId, SessionId, SharedEndpointId,
};
use crate::engine::status::ConnectorState;
use crate::engine::transport_seam::{ConnId, TransportCommand};
use crate::engine::verbs::QueuePairId;
use crate::error::{Error, NdStatus, Result};

/// The pending asynchronous requests a connector can have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PendingOp {
    Connect,
    Accept,
    NotifyDisconnect,
    /// CompleteConnect of a connection being handed to the client ([`super::hand_off`]).
    HandOff,
}

#[derive(Debug)]
pub(super) struct Connector {
    pub(super) session: SessionId,
    pub(super) state: ConnectorState,
    /// The address bound (Bind, implicit bind, shared endpoint, or the listener's for accepted ones).
    pub(super) local: Option<SocketAddr>,
    /// The port binding this connector must release (its own Bind or implicit bind).
    pub(super) owned_binding: Option<SocketAddr>,
    /// The 4-tuple registered for its connection.
    pub(super) tuple: Option<(SocketAddr, SocketAddr)>,
    pub(super) peer: Option<SocketAddr>,
    pub(super) conn: Option<ConnId>,
    pub(super) own_limits: ReadLimits,
    /// What GetReadLimits reports: the peer's offer in this side's view, capped by the adapter.
    pub(super) peer_limits: Option<ReadLimits>,
    pub(super) effective: Option<ReadLimits>,
    pub(super) peer_private_data: Option<Bytes>,
    pub(super) negotiated: Option<Negotiated>,
    /// Passive side: the initiator went away before Accept (CONNECTION_ABORTED).
    pub(super) aborted: bool,
    /// Active side: the Request to resend with Rev 1 if the responder closes on S=1.
    pub(super) retry: Option<RetryPlan>,
    pub(super) pending: Vec<(RequestId, PendingOp)>,
    /// The client runs this connector's queue pair (kernel mode): once established, its connection is
    /// handed over ([`super::hand_off`]).
    pub(super) hand_off: bool,
}

#[derive(Clone, Debug)]
pub(super) struct RetryPlan {
    pub(super) remote: SocketAddr,
    pub(super) private_data: Bytes,
    pub(super) limits: ReadLimits,
}

impl Connector {
    pub(super) fn new(session: SessionId) -> Self {
        Connector {
            session,
            state: ConnectorState::Idle,
            local: None,
            owned_binding: None,
            tuple: None,
            peer: None,
            conn: None,
            own_limits: ReadLimits::default(),
            peer_limits: None,
            effective: None,
            peer_private_data: None,
            negotiated: None,
            aborted: false,
            retry: None,
            pending: Vec::new(),
            hand_off: false,
        }
    }

    pub(super) fn take_pending(&mut self, op: PendingOp) -> Option<RequestId> {
        let i = self.pending.iter().position(|(_, o)| *o == op)?;
        Some(self.pending.swap_remove(i).0)
    }
}

/// A connection is up or being completed (Accepting, AwaitingComplete, Connected): what NotifyDisconnect
/// waits on and Disconnect ends (IND2Connector::NotifyDisconnect, ::Disconnect).
fn has_connection(state: ConnectorState) -> bool {
    matches!(
        state,
        ConnectorState::Connected | ConnectorState::Accepting | ConnectorState::AwaitingComplete
    )
}

/// How a connector's connection ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Closing {
    Rst,
    Fin,
    /// Wait for the peer's FIN until then, then FIN ([`Phase::Lingering`]).
    LingerThenFin(Instant),
}

/// The connection carrying the offer (MPA Request) a passive connector answers, and a copy of the offer.
/// CONNECTION_ABORTED when it is gone: the initiator closed before the answer.
pub(super) fn offered_conn(
    conns: &mut HashMap<ConnId, Connection>,
    conn: Option<ConnId>,
) -> Result<(ConnId, &mut Connection, MpaOffer)> {
    let aborted = || {
        Error::new(
            NdStatus::ConnectionAborted,
            "the connecting peer abandoned the connection",
        )
    };
    let id = conn.ok_or_else(aborted)?;
    let c = conns.get_mut(&id).ok_or_else(aborted)?;
    let offer = c.offer.clone().ok_or_else(aborted)?;
    Ok((id, c, offer))
}

impl Endpoint {
    /// Connector requests (IND2Connector, NdkConnect, IND2Overlapped::CancelOverlappedRequests).
    pub(super) fn on_connector_request(
        &mut self,
        dp: &mut DataPath,
        call: Call,
        req: CmRequest,
    ) -> Result<CmResponse> {
        let Call {
            now,
            session,
            request,
        } = call;
        match req {
            CmRequest::CreateConnector => {
                let id = ConnectorId(self.id());
                self.connectors.insert(id, Connector::new(session));
                Ok(CmResponse::Connector(id))
            }
            CmRequest::CloseConnector { connector } => {
                self.connector(session, connector)?;
                self.close_connector(dp, connector, NdStatus::Canceled);
                Ok(CmResponse::Done)
            }
            CmRequest::Bind { connector, local } => self.bind(session, connector, local),
            CmRequest::Connect {
                connector,
                remote,
                limits,
                private_data,
                shared_endpoint,
                queue_pair,
            } => {
                self.give_queue_pair(dp, session, connector, queue_pair)?;
                let r = self.connect(
                    session,
                    request,
                    connector,
                    remote,
                    limits,
                    private_data,
                    shared_endpoint,
                );
                if r.is_ok() {
                    self.counters.active_began(connector, now);
                }
                r
            }
            CmRequest::CompleteConnect { connector } => {
                self.complete_connect(dp, session, request, connector)
            }
            CmRequest::Accept {
                connector,
                limits,
                private_data,
                queue_pair,
            } => {
                self.give_queue_pair(dp, session, connector, queue_pair)?;
                self.accept(dp, session, request, connector, limits, private_data)
            }
            CmRequest::Reject {
                connector,
                private_data,
            } => self.reject(dp, now, session, connector, private_data),
            req @ (CmRequest::GetReadLimits { .. }
            | CmRequest::GetPrivateData { .. }
            | CmRequest::GetLocalAddress { .. }
            | CmRequest::GetPeerAddress { .. }) => self.connector_query(session, req),
            CmRequest::NotifyDisconnect { connector } => self.notify_disconnect(session, request, connector),
            CmRequest::ConnectionEnded { connector, how } => {
                self.connection_ended(dp, session, connector, how)
            }
            CmRequest::ReportDataPath {
                queue_pairs,
                memory_regions,
                first,
            } => self.report_data_path(session, queue_pairs, memory_regions, first),
            CmRequest::Disconnect { connector } => {
                let c = self.connector(session, connector)?;
                if !has_connection(c.state) {
                    // `negotiated` is set once a handshake succeeded: a connection existed and is over.
                    return Err(connection_invalid(if c.negotiated.is_some() {
                        "connector is not connected: its connection already ended (the peer closed or \
                         reset it, or a Terminate ended it; NotifyDisconnect has completed)"
                    } else {
                        "connector is not connected"
                    }));
                }
                self.disconnect(dp, connector, NdStatus::Canceled);
                Ok(CmResponse::Done)
            }
            CmRequest::Cancel { object } => self.cancel(dp, session, object),
            other => Err(Error::new(
                NdStatus::InvalidParameter,
                format!("{other:?} is not a connector request"),
            )),
        }
    }

    /// What a connector knows of its connection: the peer's read limits and private data, the local and the
    /// peer's address (IND2Connector::GetReadLimits, GetPrivateData, GetLocalAddress, GetPeerAddress).
    fn connector_query(&self, session: SessionId, req: CmRequest) -> Result<CmResponse> {
        match req {
            CmRequest::GetReadLimits { connector } => {
                let c = self.connector(session, connector)?;
                c.peer_limits
                    .map(CmResponse::ReadLimits)
                    .ok_or_else(|| connection_invalid("no peer limits yet: not connected or connecting"))
            }
            CmRequest::GetPrivateData {
                connector,
                buffer_len,
            } => {
                let c = self.connector(session, connector)?;
                let data = c
                    .peer_private_data
                    .clone()
                    .ok_or_else(|| connection_invalid("the peer has sent no private data yet"))?;
                let required = data.len() as u32;
                let data = data.slice(..data.len().min(buffer_len as usize));
                Ok(CmResponse::PrivateData { data, required })
            }
            CmRequest::GetLocalAddress { connector } => {
                let c = self.connector(session, connector)?;
                match (c.state, c.local) {
                    (ConnectorState::Idle | ConnectorState::Closed, _) | (_, None) => Err(
                        connection_invalid("connector is not bound, connecting or connected"),
                    ),
                    (_, Some(a)) => Ok(CmResponse::Address(a)),
                }
            }
            CmRequest::GetPeerAddress { connector } => {
                let c = self.connector(session, connector)?;
                match (c.state, c.peer) {
                    (
                        ConnectorState::AwaitingComplete
                        | ConnectorState::OfferReceived
                        | ConnectorState::Accepting
                        | ConnectorState::Connected,
                        Some(p),
                    ) => Ok(CmResponse::Address(p)),
                    _ => Err(connection_invalid("connector is not connected")),
                }
            }
            other => Err(Error::new(
                NdStatus::InvalidParameter,
                format!("{other:?} is not a connector query"),
            )),
        }
    }

    /// IND2Connector::NotifyDisconnect: completes when the connection ends (at once if it already has).
    fn notify_disconnect(
        &mut self,
        session: SessionId,
        request: RequestId,
        connector: ConnectorId,
    ) -> Result<CmResponse> {
        let c = self.connector_mut(session, connector)?;
        match c.state {
            state if has_connection(state) => {
                c.pending.push((request, PendingOp::NotifyDisconnect));
                Ok(CmResponse::Pending)
            }
            // A connection that existed and has ended: the disconnect has happened, so NotifyDisconnect
            // completes at once; CONNECTION_INVALID is for a connector that was never connected
            // (IND2Connector::NotifyDisconnect). `negotiated` is set once a handshake succeeded.
            ConnectorState::Closed if c.negotiated.is_some() => Ok(CmResponse::Done),
            _ => Err(connection_invalid("connector is not connected")),
        }
    }

    /// IND2Overlapped::CancelOverlappedRequests on a connector (a pending Connect is abandoned) or a listener
    /// (its waiting GetConnectionRequests complete with CANCELED).
    fn cancel(&mut self, dp: &mut DataPath, session: SessionId, object: ObjectRef) -> Result<CmResponse> {
        match object {
            ObjectRef::Connector(id) => {
                let c = self.connector(session, id)?;
                if c.state == ConnectorState::Connecting {
                    // Abandoning a pending Connect (IND2Connector::Connect remarks): RST; the passive
                    // side's Accept then fails with CONNECTION_ABORTED.
                    self.abort_connector(dp, id, NdStatus::Canceled);
                } else {
                    self.fail_pending(id, NdStatus::Canceled, "request cancelled");
                }
            }
            ObjectRef::Listener(id) => {
                let l = self.listener_mut(session, id)?;
                let waiting: Vec<_> = l.waiting.drain(..).collect();
                for (r, _) in waiting {
                    self.complete(
                        session,
                        r,
                        Err(Error::new(NdStatus::Canceled, "request cancelled")),
                    );
                }
            }
        }
        Ok(CmResponse::Done)
    }

    /// CloseQueuePair: the data path flushes it; releasing a connected queue pair disconnects its connector
    /// implicitly (docs/connector-semantics.md "Queue pairs").
    pub(super) fn close_queue_pair(
        &mut self,
        dp: &mut DataPath,
        session: SessionId,
        qp: QueuePairId,
    ) -> Result<CmResponse> {
        if let Some(connector) = dp.close_qp(session, qp)? {
            let live = self
                .connectors
                .get(&connector)
                .is_some_and(|c| !matches!(c.state, ConnectorState::Closed | ConnectorState::Idle));
            if live {
                self.disconnect(dp, connector, NdStatus::Canceled);
            }
        }
        Ok(CmResponse::Done)
    }

    /// The queue pair given to `connector` at Connect/Accept, if any.
    pub fn queue_pair_of(&self, dp: &DataPath, connector: ConnectorId) -> Option<QueuePairId> {
        dp.queue_pair_of(connector)
    }

    /// A local queue-pair error the engine did not see on the wire (a malformed entry in the client's
    /// shared ring): the queue pair goes to Error, what is outstanding completes with `status`, and its
    /// connection is ended as on any local queue-pair error (the connector is disconnected). Nothing else
    /// of the session is affected.
    pub fn fail_queue_pair(
        &mut self,
        dp: &mut DataPath,
        session: SessionId,
        qp: QueuePairId,
        status: NdStatus,
    ) -> Result<()> {
        if let Some(connector) = dp.fail_qp(session, qp, status)? {
            let live = self
                .connectors
                .get(&connector)
                .is_some_and(|c| !matches!(c.state, ConnectorState::Closed | ConnectorState::Idle));
            if live {
                self.disconnect(dp, connector, status);
            }
        }
        self.pump(dp);
        Ok(())
    }

    /// Connect/Accept with a queue pair: checked and recorded before the connection is attempted. The
    /// connector's own checks follow; a failed Connect/Accept leaves the queue pair given to this connector
    /// (it may retry with it), never to another.
    fn give_queue_pair(
        &mut self,
        dp: &mut DataPath,
        session: SessionId,
        connector: ConnectorId,
        qp: Option<QueuePairId>,
    ) -> Result<()> {
        let c = owned_connector(&mut self.connectors, session, connector)?;
        let Some(qp) = qp else { return Ok(()) };
        if self.config.hand_off {
            // The client runs its queue pairs (kernel mode) and checks them itself.
            c.hand_off = true;
            return Ok(());
        }
        dp.give(session, qp, connector)
    }

    /// The queue pair's parameters once the connection is in FPDU mode.
    fn qp_params(
        &self,
        dp: &DataPath,
        connector: ConnectorId,
        conn: ConnId,
    ) -> Option<(QueuePairId, QpParams)> {
        let c = self.connectors.get(&connector)?;
        let cn = self.conns.get(&conn)?;
        let effective = c.effective.unwrap_or_default();
        Some((
            dp.queue_pair_of(connector)?,
            QpParams {
                crc: cn.fpdu.rx.crc,
                max_ulpdu: cn.max_ulpdu,
                ird: effective.inbound,
                ord: effective.outbound,
            },
        ))
    }

    pub(super) fn bind(
        &mut self,
        session: SessionId,
        connector: ConnectorId,
        local: SocketAddr,
    ) -> Result<CmResponse> {
        let c = owned_connector(&mut self.connectors, session, connector)?;
        if c.state != ConnectorState::Idle {
            return Err(Error::new(
                NdStatus::InvalidParameter,
                "connector is already bound or in use",
            ));
        }
        let bound = self.ports.bind(local, false, self.host.as_mut())?;
        c.local = Some(bound);
        c.owned_binding = Some(bound);
        c.state = ConnectorState::Bound;
        Ok(CmResponse::Bound(bound))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn connect(
        &mut self,
        session: SessionId,
        request: RequestId,
        connector: ConnectorId,
        remote: SocketAddr,
        limits: ReadLimits,
        private_data: Bytes,
        shared_endpoint: Option<SharedEndpointId>,
    ) -> Result<CmResponse> {
        let c = owned_connector(&mut self.connectors, session, connector)?;
        match c.state {
            ConnectorState::Idle | ConnectorState::Bound => {}
            ConnectorState::Closed => {
                return Err(connection_invalid(
                    "a failed or closed connector cannot be reused",
                ));
            }
            _ => {
                return Err(Error::new(
                    NdStatus::ConnectionActive,
                    "connector is already connecting or connected",
                ));
            }
        }
        check_private_data(
            private_data.len(),
            self.config.adapter.max_caller_data,
            "MaxCallerData",
        )?;
        let (local, implicit) = match shared_endpoint {
            Some(ep) => {
                if c.state == ConnectorState::Bound {
                    return Err(Error::new(
                        NdStatus::InvalidParameter,
                        "a bound connector cannot use a shared endpoint",
                    ));
                }
                let ep = self
                    .endpoints
                    .get(&ep)
                    .filter(|e| e.session == session)
                    .ok_or_else(|| not_found("shared endpoint", ep.0))?;
                (ep.local, false)
            }
            None => match c.local {
                Some(l) => (l, false),
                // Connect without Bind binds implicitly (docs/connector-semantics.md "The active side" 1).
                None => (
                    self.ports
                        .bind(unspecified_like(remote), false, self.host.as_mut())?,
                    true,
                ),
            },
        };
        if let Err(e) = self.ports.add_tuple(local, remote) {
            if implicit {
                self.ports.release(local, self.host.as_mut());
            }
            return Err(e);
        }
        let limits_on_wire = read_limits::capped(limits, &self.config.adapter);
        let (initiator, request_bytes) =
            match MpaInitiator::new(&self.config.mpa, limits_on_wire, &private_data) {
                Ok(x) => x,
                Err(e) => {
                    self.ports.remove_tuple(local, remote);
                    if implicit {
                        self.ports.release(local, self.host.as_mut());
                    }
                    return Err(e);
                }
            };
        let conn = ConnId(take_id(&mut self.next_id));
        self.conns.insert(
            conn,
            Connection::new(
                Some(connector),
                local,
                remote,
                Phase::TcpConnecting {
                    initiator,
                    request: request_bytes,
                },
            ),
        );
        if implicit {
            c.owned_binding = Some(local);
        }
        c.local = Some(local);
        c.tuple = Some((local, remote));
        c.peer = Some(remote);
        c.conn = Some(conn);
        c.own_limits = limits;
        c.state = ConnectorState::Connecting;
        c.retry = (self.config.mpa.revision >= 2).then(|| RetryPlan {
            remote,
            private_data,
            limits,
        });
        c.pending.push((request, PendingOp::Connect));
        self.transmit
            .push_back(TransportCommand::Connect { conn, local, remote });
        debug!(connector = connector.0, %local, %remote, conn = conn.0, "connecting");
        Ok(CmResponse::Pending)
    }

    fn complete_connect(
        &mut self,
        dp: &mut DataPath,
        session: SessionId,
        request: RequestId,
        connector: ConnectorId,
    ) -> Result<CmResponse> {
        let c = self.connector_mut(session, connector)?;
        if c.state != ConnectorState::AwaitingComplete {
            return Err(connection_invalid(
                "connector is not connecting (no accepted Reply)",
            ));
        }
        c.state = ConnectorState::Connected;
        let (conn, negotiated) = (c.conn, c.negotiated);
        if c.hand_off
            && let Some(conn) = conn
        {
            // The client sends the RTR itself, first thing on its socket.
            return Ok(self.begin_hand_off(conn, connector, request, PendingOp::HandOff));
        }
        if let (Some(conn), Some(n)) = (conn, negotiated)
            && let Some(rtr) = n.rtr
        {
            // RFC 6581 §9: in peer-to-peer mode the initiator's first FPDU is the RTR.
            self.send(conn, crate::engine::framing::rtr_fpdu(rtr, n.crc));
        }
        if let Some(conn) = conn
            && let Some((qp, params)) = self.qp_params(dp, connector, conn)
        {
            // The active side may send as soon as it completes the connection (RFC 5044 §7.1).
            dp.connected(qp, params);
            if let Some(rtr) = negotiated.and_then(|n| n.rtr) {
                // The RTR went first on the queue pair's queues (a Read RTR takes Read Request MSN 1).
                dp.rtr_sent(qp, rtr);
            }
        }
        Ok(CmResponse::Done)
    }

    fn accept(
        &mut self,
        dp: &mut DataPath,
        session: SessionId,
        request: RequestId,
        connector: ConnectorId,
        limits: ReadLimits,
        private_data: Bytes,
    ) -> Result<CmResponse> {
        let c = owned_connector(&mut self.connectors, session, connector)?;
        match c.state {
            ConnectorState::OfferReceived => {}
            ConnectorState::Connected | ConnectorState::Accepting | ConnectorState::Connecting => {
                return Err(Error::new(
                    NdStatus::ConnectionActive,
                    "connector is already connected",
                ));
            }
            _ => {
                return Err(connection_invalid(
                    "connector has no connection request to accept",
                ));
            }
        }
        if c.aborted {
            return Err(Error::new(
                NdStatus::ConnectionAborted,
                "the connecting peer abandoned the connection",
            ));
        }
        check_private_data(
            private_data.len(),
            self.config.adapter.max_callee_data,
            "MaxCalleeData",
        )?;
        let (conn, cn, offer) = offered_conn(&mut self.conns, c.conn)?;
        let adapter = &self.config.adapter;
        let wire_limits = match &offer.enhanced {
            Some(w) => read_limits::responder_offer(limits, w, adapter),
            None => read_limits::capped(limits, adapter),
        };
        let (reply, negotiated) = offer.accept(&self.config.mpa, wire_limits, &private_data)?;
        let peer = c.peer_limits.unwrap_or(read_limits::capped(limits, adapter));
        let effective = read_limits::effective(limits, peer, adapter);
        cn.phase = Phase::Established;
        cn.fpdu.rx.crc = negotiated.crc;
        cn.fpdu.rx.awaiting_rtr = negotiated.peer_to_peer;
        // The responder sends nothing until the initiator's first FPDU (RFC 5044 §7.1) or RTR (RFC 6581 §9).
        cn.fpdu.rx.tx_held = true;
        c.own_limits = limits;
        c.effective = Some(effective);
        c.negotiated = Some(negotiated);
        let result = if negotiated.peer_to_peer {
            c.state = ConnectorState::Accepting;
            c.pending.push((request, PendingOp::Accept));
            CmResponse::Pending
        } else {
            c.state = ConnectorState::Connected;
            CmResponse::Done
        };
        let hand_off = c.hand_off;
        self.send(conn, reply);
        self.counters.passive_ended(conn, SetupOutcome::Established);
        if hand_off {
            if let Some(c) = self.connectors.get_mut(&connector) {
                // Until the client has the socket, as an Accept waiting for the RTR: a peer that goes away
                // meanwhile aborts it.
                c.state = ConnectorState::Accepting;
            }
            return Ok(self.begin_hand_off(conn, connector, request, PendingOp::Accept));
        }
        if let Some((qp, params)) = self.qp_params(dp, connector, conn) {
            dp.connected(qp, params);
        }
        Ok(result)
    }

    pub(super) fn reject(
        &mut self,
        dp: &mut DataPath,
        now: Instant,
        session: SessionId,
        connector: ConnectorId,
        private_data: Bytes,
    ) -> Result<CmResponse> {
        let c = owned_connector(&mut self.connectors, session, connector)?;
        match c.state {
            ConnectorState::OfferReceived => {
                check_private_data(
                    private_data.len(),
                    self.config.adapter.max_callee_data,
                    "MaxCalleeData",
                )?;
                let (conn, _, offer) = offered_conn(&mut self.conns, c.conn)?;
                let reply = offer.reject(&private_data)?;
                self.send(conn, reply);
                self.counters.passive_ended(conn, SetupOutcome::Rejected);
                self.finish_connector_closing(dp, connector, Closing::LingerThenFin(now + REJECT_LINGER));
                Ok(CmResponse::Done)
            }
            // The active side refusing the limits it saw (IND2Connector::Reject after Connect completes).
            ConnectorState::AwaitingComplete => {
                self.finish_connector(dp, connector, false);
                Ok(CmResponse::Done)
            }
            _ => Err(connection_invalid("connector has nothing to reject")),
        }
    }

    /// Attaches the queued offer on `conn` to `connector`; returns the completion value. CONNECTION_ABORTED
    /// if the offer's connection is gone; INVALID_PARAMETER if the connector is.
    pub(super) fn attach_offer(&mut self, conn: ConnId, connector: ConnectorId) -> Result<CmResponse> {
        let adapter = &self.config.adapter;
        let c = self
            .connectors
            .get_mut(&connector)
            .ok_or_else(|| not_found("connector", connector.0))?;
        let (_, cn, offer) = offered_conn(&mut self.conns, Some(conn))?;
        cn.connector = Some(connector);
        let (local, remote) = (cn.local, cn.remote);
        let peer_limits = match &offer.enhanced {
            Some(w) => {
                let v = read_limits::peer_view(w.ird, w.ord);
                ReadLimits {
                    inbound: v.inbound.min(adapter.max_inbound_read_limit),
                    outbound: v.outbound.min(adapter.max_outbound_read_limit),
                }
            }
            // An RFC 5044 peer sends no limits: report the adapter's (nothing was negotiated).
            None => ReadLimits {
                inbound: adapter.max_inbound_read_limit,
                outbound: adapter.max_outbound_read_limit,
            },
        };
        c.state = ConnectorState::OfferReceived;
        c.local = Some(local);
        c.peer = Some(remote);
        c.conn = Some(conn);
        c.tuple = Some((local, remote));
        c.peer_limits = Some(peer_limits);
        c.peer_private_data = Some(offer.private_data.clone());
        Ok(CmResponse::ConnectionRequest {
            connector,
            peer: remote,
            limits: peer_limits,
            private_data: offer.private_data.clone(),
        })
    }

    /// Completes every pending request of `connector` with `status`.
    pub(super) fn fail_pending(&mut self, connector: ConnectorId, status: NdStatus, why: &'static str) {
        let Some(c) = self.connectors.get_mut(&connector) else {
            return;
        };
        let session = c.session;
        let pending: Vec<_> = c.pending.drain(..).collect();
        for (r, _) in pending {
            self.complete(session, r, Err(Error::new(status, why)));
        }
    }

    /// Releases the connector's connection, tuple and port, and marks it Closed. `abort`: RST, else FIN.
    fn finish_connector(&mut self, dp: &mut DataPath, connector: ConnectorId, abort: bool) {
        self.finish_connector_closing(dp, connector, if abort { Closing::Rst } else { Closing::Fin });
    }

    /// [`Self::finish_connector`], closing the connection as `how` says.
    fn finish_connector_closing(&mut self, dp: &mut DataPath, connector: ConnectorId, how: Closing) {
        let Some(c) = self.connectors.get_mut(&connector) else {
            return;
        };
        c.state = ConnectorState::Closed;
        if let Some(qp) = dp.queue_pair_of(connector) {
            // Disconnect flushes the queue pair with CANCELED; it cannot be reused (IND2Connector::Disconnect).
            dp.detach(qp, NdStatus::Canceled);
        }
        let conn = c.conn.take();
        let tuple = c.tuple.take();
        let binding = c.owned_binding.take();
        if let Some(conn) = conn
            && let Some(cn) = self.conns.get_mut(&conn)
        {
            cn.connector = None;
            match how {
                // Already closing (after a Terminate, or the peer's close): one Close command is enough.
                _ if matches!(cn.phase, Phase::Closing) => {}
                // The FIN waits for the first-FPDU hold too, behind what it holds: siw would otherwise see it
                // while still completing its accept ([`crate::engine::first_fpdu`]).
                Closing::Fin if cn.fpdu.hold().is_some() => {
                    cn.phase = Phase::Closing;
                    cn.fpdu.close_after_hold();
                }
                Closing::Rst | Closing::Fin => {
                    cn.fpdu.drop_hold();
                    cn.phase = Phase::Closing;
                    self.transmit.push_back(TransportCommand::Close {
                        conn,
                        abort: how == Closing::Rst,
                    });
                }
                Closing::LingerThenFin(until) => {
                    cn.phase = Phase::Lingering { until };
                    self.timers.insert((until, conn));
                }
            }
        }
        if let Some((l, r)) = tuple {
            self.ports.remove_tuple(l, r);
        }
        if let Some(b) = binding {
            self.ports.release(b, self.host.as_mut());
        }
    }

    pub(super) fn disconnect(&mut self, dp: &mut DataPath, connector: ConnectorId, status: NdStatus) {
        self.fail_pending(connector, status, "disconnected");
        self.finish_connector(dp, connector, false);
    }

    fn abort_connector(&mut self, dp: &mut DataPath, connector: ConnectorId, status: NdStatus) {
        self.counters
            .active_ended(connector, SetupOutcome::Cancelled, None);
        self.fail_pending(connector, status, "connect abandoned");
        self.finish_connector(dp, connector, true);
    }

    pub(super) fn close_connector(&mut self, dp: &mut DataPath, connector: ConnectorId, status: NdStatus) {
        let connecting = self
            .connectors
            .get(&connector)
            .is_some_and(|c| c.state == ConnectorState::Connecting);
        if let Some(c) = self.connectors.get(&connector)
            && c.state == ConnectorState::OfferReceived
            && let Some(conn) = c.conn
        {
            // The application closed the connector it took the offer with, unanswered.
            self.counters.passive_ended(conn, SetupOutcome::Cancelled);
        }
        if connecting {
            self.abort_connector(dp, connector, status);
        } else {
            self.disconnect(dp, connector, status);
        }
        // Whatever path the connector took, its setup is not left counted as in progress.
        self.counters
            .active_ended(connector, SetupOutcome::Cancelled, None);
        if let Some(c) = self.connectors.remove(&connector) {
            // A GetConnectionRequest waiting to hand an offer to this connector ends with it.
            let mut cancelled = Vec::new();
            for l in self.listeners.values_mut().filter(|l| l.session == c.session) {
                l.waiting.retain(|&(r, id)| {
                    id != connector || {
                        cancelled.push(r);
                        false
                    }
                });
            }
            for r in cancelled {
                self.complete(c.session, r, Err(Error::new(status, "connector closed")));
            }
        }
    }

    /// Fails the pending Connect with `error` and resets the connection.
    pub(super) fn fail_connect(&mut self, dp: &mut DataPath, connector: ConnectorId, error: Error) {
        self.fail_connect_closing(dp, connector, error, true);
    }

    /// Fails the pending Connect with `error`; `abort`: RST, else FIN after what was queued (a Terminate).
    pub(super) fn fail_connect_closing(
        &mut self,
        dp: &mut DataPath,
        connector: ConnectorId,
        error: Error,
        abort: bool,
    ) {
        // Unless the caller counted it more precisely already.
        self.counters.active_ended(connector, SetupOutcome::Failed, None);
        let Some(c) = self.connectors.get_mut(&connector) else {
            return;
        };
        let session = c.session;
        if let Some(r) = c.take_pending(PendingOp::Connect) {
            self.complete(session, r, Err(error));
        }
        self.finish_connector(dp, connector, abort);
    }

    /// The peer disconnected (FIN/RST, Terminate): NotifyDisconnect fires; a pending Accept is aborted.
    pub(super) fn peer_gone(&mut self, dp: &mut DataPath, connector: ConnectorId) {
        let Some(c) = self.connectors.get_mut(&connector) else {
            return;
        };
        let session = c.session;
        match c.state {
            ConnectorState::OfferReceived => {
                c.aborted = true;
                return;
            }
            ConnectorState::Accepting => {
                if let Some(r) = c.take_pending(PendingOp::Accept) {
                    self.complete(
                        session,
                        r,
                        Err(Error::new(
                            NdStatus::ConnectionAborted,
                            "the connecting peer abandoned the connection",
                        )),
                    );
                }
            }
            _ => {}
        }
        let Some(c) = self.connectors.get_mut(&connector) else {
            return;
        };
        if let Some(r) = c.take_pending(PendingOp::NotifyDisconnect) {
            self.complete(session, r, Ok(CmResponse::Done));
        }
        self.fail_pending(connector, NdStatus::Canceled, "the peer disconnected");
        self.finish_connector(dp, connector, false);
    }

    /// RFC 6581 §6 / docs/iwarp-wire.md §1: a responder that closes on S=1 gets one more try with a Rev 1 Request.
    pub(super) fn retry_revision_one(
        &mut self,
        dp: &mut DataPath,
        connector: ConnectorId,
        old: ConnId,
        plan: RetryPlan,
    ) {
        let mpa_v1 = MpaConfig {
            revision: 1,
            ..self.config.mpa.clone()
        };
        let limits = read_limits::capped(plan.limits, &self.config.adapter);
        let Ok((initiator, request)) = MpaInitiator::new(&mpa_v1, limits, &plan.private_data) else {
            self.fail_connect(
                dp,
                connector,
                Error::new(
                    NdStatus::ConnectionRefused,
                    "the peer closed on an MPA Rev 2 Request",
                ),
            );
            return;
        };
        let Some(c) = self.connectors.get_mut(&connector) else {
            return;
        };
        let Some(local) = c
            .local
            .map(|l| SocketAddr::new(c.tuple.map_or(l.ip(), |t| t.0.ip()), l.port()))
        else {
            self.fail_connect(
                dp,
                connector,
                Error::new(
                    NdStatus::Unsuccessful,
                    "a connecting connector without a local address",
                ),
            );
            return;
        };
        let conn = ConnId(take_id(&mut self.next_id));
        c.conn = Some(conn);
        info!(
            connector = connector.0,
            old = old.0,
            new = conn.0,
            "peer closed on MPA Rev 2; retrying with Rev 1"
        );
        self.conns.insert(
            conn,
            Connection::new(
                Some(connector),
                local,
                plan.remote,
                Phase::TcpConnecting { initiator, request },
            ),
        );
        self.transmit.push_back(TransportCommand::Connect {
            conn,
            local,
            remote: plan.remote,
        });
    }
}
