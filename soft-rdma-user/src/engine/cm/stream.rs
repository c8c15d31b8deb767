//! The endpoint's side of each TCP connection: it feeds the bytes to the connection
//! ([`crate::engine::connection::Connection`], which owns the phase, the MPA handshake and FPDU intake) and acts
//! on what they meant for connectors and listeners ([`ConnectionEvent`]), and it closes connections.

use std::time::Instant;

use bytes::Bytes;
use tracing::info;

use super::Endpoint;
use super::connector::PendingOp;
use crate::engine::connection::{ConnectionEvent, FpduStep, Phase, StreamEnd};
use crate::engine::counters::{Direction, SetupOutcome, TerminateKind};
use crate::engine::datapath::DataPath;
use crate::engine::mpa::{InitiatorClosed, Negotiated};
use crate::engine::read_limits;
use crate::engine::requests::{CmResponse, ConnectorId, ReadLimits};
use crate::engine::status::ConnectorState;
use crate::engine::transport_seam::{ConnId, TransportCommand};
use crate::error::{Error, NdStatus};
use crate::warn_limited;

impl Endpoint {
    pub(super) fn close_conn(&mut self, conn: ConnId, abort: bool) {
        if let Some(cn) = self.conns.get_mut(&conn) {
            if cn.connector.is_none() {
                self.ports.remove_tuple(cn.local, cn.remote);
            }
            cn.phase = Phase::Closing;
            self.transmit.push_back(TransportCommand::Close { conn, abort });
        }
    }

    /// Bytes the transport received on `conn`: the connection says what they mean ([`ConnectionEvent`]), and
    /// the endpoint acts on it for the connector or listener concerned.
    pub(super) fn on_received(&mut self, dp: &mut DataPath, now: Instant, conn: ConnId, data: &[u8]) {
        let rules = self.config.stream_rules();
        let Some(cn) = self.conns.get_mut(&conn) else {
            return;
        };
        let connector = cn.connector;
        // The client's data path takes these with the socket ([`Phase::HandingOff`]).
        let keep_for_client = connector.is_some_and(|c| self.connectors.get(&c).is_some_and(|c| c.hand_off));
        let qp = connector.and_then(|c| dp.queue_pair_of(c));
        match cn.on_bytes(now, data, &rules, keep_for_client, dp, qp) {
            ConnectionEvent::Nothing => {}
            ConnectionEvent::ReplyAccepted {
                negotiated,
                private_data,
                leftover,
            } => self.on_reply_accepted(dp, now, conn, negotiated, private_data, leftover),
            ConnectionEvent::ReplyRejected { private_data } => {
                let Some(connector) = connector else { return };
                self.counters
                    .active_ended(connector, SetupOutcome::Rejected, None);
                if let Some(c) = self.connectors.get_mut(&connector) {
                    c.peer_private_data = Some(private_data);
                    c.retry = None;
                }
                self.fail_connect(
                    dp,
                    connector,
                    Error::new(NdStatus::ConnectionRefused, "the peer rejected the connection"),
                );
            }
            ConnectionEvent::ReplyRefused { error, terminate } => {
                let Some(connector) = connector else { return };
                warn_limited!(conn = conn.0, %error, "MPA Reply refused");
                let reset = terminate.is_none();
                if let Some(t) = terminate {
                    self.counters
                        .terminate(Direction::Sent, TerminateKind::LlpMpa);
                    self.send(conn, t);
                }
                if let Some(c) = self.connectors.get_mut(&connector) {
                    c.retry = None;
                }
                // After a Terminate, a FIN: a reset could discard the Terminate before it is sent.
                self.fail_connect_closing(
                    dp,
                    connector,
                    Error::new(
                        NdStatus::ConnectionAborted,
                        format!("MPA handshake failed: {error}"),
                    ),
                    reset,
                );
            }
            ConnectionEvent::Offer { listener, offer } => self.on_offer(conn, listener, offer),
            ConnectionEvent::MarkersRefused { reply } => {
                warn_limited!(conn = conn.0, "MPA Request asks for markers; rejecting");
                self.counters.passive_failed(conn, SetupOutcome::Refused);
                self.send(conn, reply);
                self.close_conn(conn, false);
            }
            ConnectionEvent::RequestRefused { error } => {
                warn_limited!(conn = conn.0, %error, "bad MPA Request; closing");
                self.counters.passive_failed(conn, SetupOutcome::Refused);
                self.close_conn(conn, true);
            }
            ConnectionEvent::DataBeforeReply { listener, error } => {
                // Refused rather than kept for after the Accept, which may be a long time coming: the peer
                // abandoned the handshake, so a queued offer is withdrawn and a taken one's Accept fails with
                // CONNECTION_ABORTED (on_closed → peer_gone).
                warn_limited!(conn = conn.0, %error, "bad MPA handshake; resetting");
                self.counters.passive_ended(conn, SetupOutcome::Refused);
                if let Some(l) = self.listeners.get_mut(&listener) {
                    l.queued.retain(|c| *c != conn);
                }
                self.close_conn(conn, true);
            }
            ConnectionEvent::Fpdu(step) => self.on_fpdu_step(dp, conn, connector, step),
        }
    }

    /// The active side's Reply accepted the connection: the connector learns the peer's read limits and
    /// private data, its Connect completes, and what followed the Reply goes to FPDU intake.
    fn on_reply_accepted(
        &mut self,
        dp: &mut DataPath,
        now: Instant,
        conn: ConnId,
        negotiated: Negotiated,
        private_data: Bytes,
        leftover: Bytes,
    ) {
        self.arm_timer(conn);
        if let Some(connector) = self.conns.get(&conn).and_then(|cn| cn.connector) {
            self.counters
                .active_ended(connector, SetupOutcome::Established, Some(now));
        }
        let adapter = &self.config.adapter;
        let Some(c) = self
            .conns
            .get(&conn)
            .and_then(|cn| cn.connector)
            .and_then(|connector| self.connectors.get_mut(&connector))
        else {
            return self.close_conn(conn, true);
        };
        let peer = match negotiated.peer_word {
            Some(w) => read_limits::peer_view(w.ird, w.ord),
            None => read_limits::capped(c.own_limits, adapter),
        };
        let peer = ReadLimits {
            inbound: peer.inbound.min(adapter.max_inbound_read_limit),
            outbound: peer.outbound.min(adapter.max_outbound_read_limit),
        };
        c.peer_limits = Some(peer);
        c.effective = Some(read_limits::effective(c.own_limits, peer, adapter));
        c.peer_private_data = Some(private_data);
        c.negotiated = Some(negotiated);
        c.state = ConnectorState::AwaitingComplete;
        c.retry = None;
        let session = c.session;
        if let Some(r) = c.take_pending(PendingOp::Connect) {
            self.complete(session, r, Ok(CmResponse::Done));
        }
        if !leftover.is_empty() {
            self.on_received(dp, now, conn, &leftover);
        }
    }

    /// What FPDU intake saw ([`FpduStep`], the rules both data paths share): replies and our Terminate go
    /// out, the passive Accept completes at the initiator's RTR, and a stream that ended is closed.
    fn on_fpdu_step(
        &mut self,
        dp: &mut DataPath,
        conn: ConnId,
        connector: Option<ConnectorId>,
        step: FpduStep,
    ) {
        self.fpdus_without_queue_pair += step.dropped;
        for data in step.send {
            self.send(conn, data);
        }
        if step.accept_complete
            && let Some(c) = connector.and_then(|c| self.connectors.get_mut(&c))
        {
            // The initiator called CompleteConnect: the passive Accept completes (RFC 6581 §9).
            c.state = ConnectorState::Connected;
            let session = c.session;
            if let Some(r) = c.take_pending(PendingOp::Accept) {
                self.complete(session, r, Ok(CmResponse::Done));
            }
        }
        match step.end {
            None => return,
            Some(StreamEnd::PeerTerminated(cause)) => {
                self.counters
                    .terminate(Direction::Received, TerminateKind::of_cause(cause));
                info!(conn = conn.0, ?cause, "peer sent a Terminate; closing");
            }
            Some(StreamEnd::Terminated(cause)) => {
                if cause.is_some() {
                    self.counters
                        .terminate(Direction::Sent, TerminateKind::of_cause(cause));
                }
                warn_limited!(conn = conn.0, ?cause, "terminating the stream");
            }
        }
        self.close_conn(conn, false);
        if let Some(c) = connector {
            self.peer_gone(dp, c);
        }
    }

    /// A queue pair's local protection error: its Terminate is queued on the connection (behind what the
    /// first-FPDU hold keeps, if one is on); the connection closes after it (FIN) and the connector hears
    /// that the connection ended, as siw's `siw_qp_cm_drop` after `siw_qp_sq_proc_tx` failed.
    pub(super) fn drop_after_local_error(&mut self, dp: &mut DataPath, connector: ConnectorId) {
        let Some(conn) = self.connectors.get(&connector).and_then(|c| c.conn) else {
            return;
        };
        self.counters.terminate(
            Direction::Sent,
            TerminateKind::of_cause(Some(crate::engine::qp::LOCAL_PROTECTION)),
        );
        warn_limited!(
            conn = conn.0,
            connector = connector.0,
            "local protection error: Terminate sent; closing the connection"
        );
        match self.conns.get_mut(&conn) {
            Some(cn) if matches!(cn.phase, Phase::Closing) => {}
            Some(cn) if cn.fpdu.hold().is_some() => {
                cn.phase = Phase::Closing;
                cn.fpdu.close_after_hold();
            }
            Some(_) => self.close_conn(conn, false),
            None => return,
        }
        self.peer_gone(dp, connector);
    }

    pub(super) fn on_closed(&mut self, dp: &mut DataPath, conn: ConnId) {
        let Some(cn) = self.conns.remove(&conn) else {
            return;
        };
        // A passive setup still open: the initiator went away first.
        self.counters.passive_ended(conn, SetupOutcome::Aborted);
        let Some(connector) = cn.connector else {
            self.ports.remove_tuple(cn.local, cn.remote);
            if let Phase::Offered { listener } = cn.phase
                && let Some(l) = self.listeners.get_mut(&listener)
            {
                l.queued.retain(|c| *c != conn);
            }
            return;
        };
        match cn.phase {
            Phase::AwaitingReply { initiator } | Phase::TcpConnecting { initiator, .. } => {
                let retry = self.connectors.get_mut(&connector).and_then(|c| c.retry.take());
                match (initiator.on_closed(), retry) {
                    (InitiatorClosed::RetryWithRevisionOne, Some(plan)) => {
                        self.retry_revision_one(dp, connector, conn, plan)
                    }
                    _ => {
                        self.counters
                            .active_ended(connector, SetupOutcome::Refused, None);
                        self.fail_connect(
                            dp,
                            connector,
                            Error::new(
                                NdStatus::ConnectionRefused,
                                "the peer closed the connection before replying",
                            ),
                        )
                    }
                }
            }
            _ => {
                if let Some(c) = self.connectors.get_mut(&connector) {
                    c.conn = None;
                }
                self.peer_gone(dp, connector);
            }
        }
    }
}
