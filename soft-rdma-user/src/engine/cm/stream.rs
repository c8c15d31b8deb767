//! The per-TCP-connection stream: who a connection belongs to ([`Phase`]), the MPA handshake bytes, then FPDU
//! deframing, the CRC check, the RTR and Terminates (RFC 5044 §4, RFC 6581 §9, RFC 5040 §4.8), and closing.

use super::*;

/// How a connector's connection ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Closing {
    Rst,
    Fin,
    /// Wait for the peer's FIN until then, then FIN ([`Phase::Lingering`]).
    LingerThenFin(Instant),
}

/// Who a TCP connection belongs to and where its bytes go.
#[derive(Debug)]
pub(super) enum Phase {
    /// Active: TCP connecting; the Request goes out on `Connected`.
    TcpConnecting { initiator: MpaInitiator, request: Bytes },
    /// Active: Request sent, reading the Reply.
    AwaitingReply { initiator: MpaInitiator },
    /// Passive: TCP accepted, reading the Request.
    AwaitingRequest {
        listener: ListenerId,
        responder: MpaResponder,
    },
    /// Passive: Request read; queued at the listener or attached to a connector.
    Offered { listener: ListenerId },
    /// FPDU mode.
    Established,
    /// FPDU mode, the socket on its way to the client ([`super::hand_off`]): bytes are kept for it.
    HandingOff,
    /// The client runs the connection; the transport keeps the daemon's copy of the socket until Close.
    HandedOff,
    /// Closing (a Reject or Terminate was sent; waiting for the transport to report Closed).
    Closing,
    /// A reject Reply was sent: the initiator closes first, or the FIN goes out at `until`
    /// ([`REJECT_LINGER`]). Bytes that arrive meanwhile are dropped.
    Lingering { until: Instant },
}

/// How long a responder that sent a reject Reply (RFC 5044 §7.1.2, R=1) waits for the initiator to close
/// before closing itself. Closing at once races the Reply at kernel siw: siw reads the Reply from a work
/// queue and, if the FIN's work runs first, reports the reject to rdma_cm as a reset without its private
/// data (siw_cm.c, `SIW_CM_WORK_PEER_CLOSE` in `SIW_EPSTATE_AWAIT_MPAREP`). siw itself closes right after
/// reading the Reply, so the wait normally ends at once.
pub const REJECT_LINGER: Duration = Duration::from_secs(2);

#[derive(Debug)]
pub(super) struct Conn {
    pub(super) connector: Option<ConnectorId>,
    pub(super) local: SocketAddr,
    pub(super) remote: SocketAddr,
    pub(super) phase: Phase,
    /// FPDU mode: the inbound side and the first-FPDU hold, shared with the client's in-process data path.
    pub(super) fpdu: FpduConnection,
    pub(super) offer: Option<MpaOffer>,
    /// The largest ULPDU this side sends: one FPDU per TCP segment (RFC 5044 §4.1).
    pub(super) max_ulpdu: usize,
    /// Bytes handed to the transport and not yet reported written.
    pub(super) in_flight: usize,
}

impl Conn {
    pub(super) fn new(
        connector: Option<ConnectorId>,
        local: SocketAddr,
        remote: SocketAddr,
        phase: Phase,
    ) -> Conn {
        Conn {
            connector,
            local,
            remote,
            phase,
            fpdu: FpduConnection::default(),
            offer: None,
            max_ulpdu: max_ulpdu_for(DEFAULT_MSS),
            in_flight: 0,
        }
    }
}

/// MSS assumed until the transport reports the path's (IPv4 over a 1500-byte MTU, with timestamps).
pub(super) const DEFAULT_MSS: usize = 1448;

/// The connection carrying the offer (MPA Request) a passive connector answers, and a copy of the offer.
/// CONNECTION_ABORTED when it is gone: the initiator closed before the answer.
pub(super) fn offered_conn(
    conns: &mut HashMap<ConnId, Conn>,
    conn: Option<ConnId>,
) -> Result<(ConnId, &mut Conn, MpaOffer)> {
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

/// The deadline a connection has in its phase, if any.
pub(super) fn conn_deadline(c: &Conn) -> Option<Instant> {
    match &c.phase {
        Phase::AwaitingRequest { responder, .. } => responder.deadline(),
        Phase::Lingering { until } => Some(*until),
        Phase::Established | Phase::Closing => c.fpdu.deadline(),
        _ => None,
    }
}

impl ConnectionManager {
    pub(super) fn close_conn(&mut self, conn: ConnId, abort: bool) {
        if let Some(cn) = self.conns.get_mut(&conn) {
            if cn.connector.is_none() {
                self.ports.remove_tuple(cn.local, cn.remote);
            }
            cn.phase = Phase::Closing;
            self.transmit.push_back(TransportCommand::Close { conn, abort });
        }
    }

    pub(super) fn on_received(&mut self, now: Instant, conn: ConnId, data: &[u8]) {
        let Some(cn) = self.conns.get_mut(&conn) else {
            return;
        };
        match &mut cn.phase {
            Phase::AwaitingReply { initiator } => {
                let outcome = initiator.on_bytes(data);
                let crc_in_use = initiator.crc_in_use();
                let connector = cn.connector;
                let crc_cfg = self.config.mpa.crc_required;
                let Some(connector) = connector else { return };
                match outcome {
                    Ok(None) => {}
                    Ok(Some(ReplyOutcome::Accepted {
                        negotiated,
                        private_data,
                        leftover,
                    })) => {
                        cn.phase = Phase::Established;
                        cn.fpdu.rx.crc = negotiated.crc || crc_cfg;
                        let hold = self.config.first_fpdu_hold;
                        cn.fpdu.start_hold(now, hold, hold);
                        self.arm_timer(conn);
                        let adapter = &self.config.adapter;
                        let Some(c) = self.connectors.get_mut(&connector) else {
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
                            self.on_fpdu_bytes(conn, &leftover);
                        }
                    }
                    Ok(Some(ReplyOutcome::Rejected { private_data })) => {
                        if let Some(c) = self.connectors.get_mut(&connector) {
                            c.peer_private_data = Some(private_data);
                            c.retry = None;
                        }
                        self.fail_connect(
                            connector,
                            Error::new(NdStatus::ConnectionRefused, "the peer rejected the connection"),
                        );
                    }
                    Err(e) => {
                        warn_limited!(conn = conn.0, error = %e, "MPA Reply refused");
                        let terminate = e.terminate_cause();
                        if let Some(cause) = terminate {
                            // RFC 6581 §9: these are reported to the responder with a Terminate, in FPDU mode:
                            // with a CRC if the Reply or we asked for one (RFC 5044 §7.1).
                            self.send(conn, terminate_fpdu(cause, crc_in_use));
                        }
                        if let Some(c) = self.connectors.get_mut(&connector) {
                            c.retry = None;
                        }
                        // After a Terminate, a FIN: a reset could discard the Terminate before it is sent.
                        self.fail_connect_closing(
                            connector,
                            Error::new(NdStatus::ConnectionAborted, format!("MPA handshake failed: {e}")),
                            terminate.is_none(),
                        );
                    }
                }
            }
            Phase::AwaitingRequest { listener, responder } => {
                let listener = *listener;
                match responder.on_bytes(data) {
                    Ok(None) => {}
                    Ok(Some(offer)) => self.on_offer(conn, listener, offer),
                    Err(mpa::MpaError::MarkersRequested { revision }) => {
                        // siw answers M=1 with an R=1 Reply and closes (docs/iwarp-wire.md §1).
                        warn_limited!(conn = conn.0, "MPA Request asks for markers; rejecting");
                        self.send(conn, mpa::reject_reply(revision, false, &[]));
                        self.close_conn(conn, false);
                    }
                    Err(e) => {
                        warn_limited!(conn = conn.0, error = %e, "bad MPA Request; closing");
                        self.close_conn(conn, true);
                    }
                }
            }
            Phase::Offered { listener } => {
                // RFC 5044 §7.1.2: the initiator sends nothing between its Request and our Reply (siw: -EPROTO).
                // Refused rather than kept for after the Accept, which may be a long time coming: the peer
                // abandoned the handshake, so a queued offer is withdrawn and a taken one's Accept fails with
                // CONNECTION_ABORTED (on_closed → peer_gone).
                let listener = *listener;
                let e = mpa::MpaError::DataBeforeReply { bytes: data.len() };
                warn_limited!(conn = conn.0, error = %e, "bad MPA handshake; resetting");
                if let Some(l) = self.listeners.get_mut(&listener) {
                    l.queued.retain(|c| *c != conn);
                }
                self.close_conn(conn, true);
            }
            Phase::Established => self.on_fpdu_bytes(conn, data),
            Phase::HandingOff => cn.fpdu.rx.rx.extend_from_slice(data),
            Phase::HandedOff => {}
            Phase::TcpConnecting { .. } | Phase::Closing | Phase::Lingering { .. } => {}
        }
    }

    /// FPDU-mode bytes: the RTR, a Terminate, or data messages for the connection's queue pair
    /// ([`FpduReceiver`], the rules both data paths share).
    pub(super) fn on_fpdu_bytes(&mut self, conn: ConnId, data: &[u8]) {
        let max_ulpdu = self.config.max_ulpdu;
        let Some(cn) = self.conns.get_mut(&conn) else {
            return;
        };
        if !matches!(cn.phase, Phase::Established) {
            return;
        }
        let connector = cn.connector;
        if connector.is_some_and(|c| self.connectors.get(&c).is_some_and(|c| c.hand_off)) {
            // The client's data path takes these with the socket ([`Phase::HandingOff`]).
            cn.fpdu.rx.rx.extend_from_slice(data);
            return;
        }
        let qp = connector.and_then(|c| self.dp.queue_pair_of(c));
        let step = cn.fpdu.on_bytes(data, max_ulpdu, &mut self.dp, qp);
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
            None => {}
            Some(StreamEnd::PeerTerminated(cause)) => {
                info!(conn = conn.0, ?cause, "peer sent a Terminate; closing");
            }
            Some(StreamEnd::Terminated(cause)) => {
                warn_limited!(conn = conn.0, ?cause, "terminating the stream");
            }
        }
        if step.end.is_some() {
            self.close_conn(conn, false);
            if let Some(c) = connector {
                self.peer_gone(c);
            }
        }
    }

    pub(super) fn on_closed(&mut self, conn: ConnId) {
        let Some(cn) = self.conns.remove(&conn) else {
            return;
        };
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
                        self.retry_revision_one(connector, conn, plan)
                    }
                    _ => self.fail_connect(
                        connector,
                        Error::new(
                            NdStatus::ConnectionRefused,
                            "the peer closed the connection before replying",
                        ),
                    ),
                }
            }
            _ => {
                if let Some(c) = self.connectors.get_mut(&connector) {
                    c.conn = None;
                }
                self.peer_gone(connector);
            }
        }
    }
}
