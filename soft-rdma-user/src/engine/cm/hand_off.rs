//! Kernel mode's split between the control path and the data path: once a connection that carries a queue
//! pair is established, the daemon hands its socket to the client library, which runs the queue pair in the
//! application's process (`crate::client`'s in-process data path, on the same [`FpduReceiver`] and queue-pair
//! engine). The daemon keeps the connector, the port and 4-tuple, and a copy of the socket: a client that
//! goes away still closes the connection, and `Close` shuts it down.
//!
//! When: the active side at CompleteConnect (it sends its RTR itself, first thing: RFC 6581 §9), the passive
//! side at Accept, right after its Reply (it waits for the initiator's first FPDU or RTR itself: RFC 5044
//! §7.1). The request completes with [`CmResponse::HandedOff`] once the transport has let go of the socket
//! ([`TransportEvent::HandedOff`]), carrying what the handshake settled and the bytes read meanwhile.

use std::time::Duration;
use std::time::Instant;

use tracing::debug;

use super::connector::PendingOp;
use super::{Endpoint, connection_invalid};
use crate::engine::connection::Phase;
use crate::engine::datapath::DataPath;
use crate::engine::requests::{CmResponse, ConnectionEnd, ConnectorId, HandOff, RequestId, SessionId};
use crate::engine::status::ConnectorState;
use crate::engine::transport_seam::{ConnId, TransportCommand};
use crate::engine::verbs::QueuePairStatus;
use crate::error::{NdStatus, Result};

/// Queue pairs a client may report beyond the objects it holds in the daemon (created, not yet connected).
pub const REPORT_SLACK: usize = 16;

impl Endpoint {
    /// Starts handing `conn` over: the transport flushes and stops reading; the request `request` (a
    /// CompleteConnect, or an Accept) completes when it has.
    pub(super) fn begin_hand_off(
        &mut self,
        conn: ConnId,
        connector: ConnectorId,
        request: RequestId,
        op: PendingOp,
    ) -> CmResponse {
        if let Some(cn) = self.conns.get_mut(&conn) {
            cn.phase = Phase::HandingOff;
        }
        if let Some(c) = self.connectors.get_mut(&connector) {
            c.pending.push((request, op));
        }
        self.transmit.push_back(TransportCommand::HandOff { conn });
        debug!(
            connector = connector.0,
            conn = conn.0,
            "handing the connection to the client"
        );
        CmResponse::Pending
    }

    /// The transport let go of `conn`: the waiting CompleteConnect or Accept completes with what the client
    /// needs to run the connection.
    pub(super) fn on_handed_off(&mut self, dp: &mut DataPath, now: Instant, conn: ConnId) {
        let hold_len = self.config.first_fpdu_hold;
        let max_inbound_ulpdu = self.config.max_ulpdu.min(u32::MAX as usize) as u32;
        let Some(cn) = self.conns.get_mut(&conn) else {
            return;
        };
        if !matches!(cn.phase, Phase::HandingOff) {
            return; // closed meanwhile
        }
        cn.phase = Phase::HandedOff;
        let hold = cn.fpdu.take_hold();
        let rx = &mut cn.fpdu.rx;
        let received = rx.rx.split().freeze();
        let (crc, awaiting_rtr, tx_held, max_ulpdu) = (rx.crc, rx.awaiting_rtr, rx.tx_held, cn.max_ulpdu);
        let Some(connector) = cn.connector else {
            return self.close_conn(conn, false);
        };
        let Some(c) = self.connectors.get_mut(&connector) else {
            return self.close_conn(conn, false);
        };
        let (request, active) = match c.take_pending(PendingOp::HandOff) {
            Some(r) => (r, true),
            None => match c.take_pending(PendingOp::Accept) {
                Some(r) => (r, false),
                None => {
                    // Cancelled meanwhile: nobody takes the connection.
                    return self.disconnect(dp, connector, NdStatus::Canceled);
                }
            },
        };
        c.state = ConnectorState::Connected;
        let effective = c.effective.unwrap_or_default();
        let hold_us = |d: Duration| d.as_micros().min(u64::MAX as u128) as u64;
        let hand_off = HandOff {
            conn,
            crc,
            max_ulpdu: max_ulpdu as u32,
            max_inbound_ulpdu,
            ird: effective.inbound,
            ord: effective.outbound,
            send_rtr: if active {
                c.negotiated.and_then(|n| n.rtr)
            } else {
                None
            },
            awaiting_rtr,
            tx_held,
            first_fpdu_hold_us: hold
                .as_ref()
                .map_or(0, |h| hold_us(h.until().saturating_duration_since(now)).max(1)),
            fin_hold_us: if hold.is_some() { hold_us(hold_len) } else { 0 },
            received,
        };
        let session = c.session;
        debug!(
            connector = connector.0,
            conn = conn.0,
            active,
            "connection handed to the client"
        );
        self.complete(session, request, Ok(CmResponse::HandedOff(hand_off)));
    }

    /// The client's data path saw its connection end: the connector ends as on the peer's disconnect.
    pub(super) fn connection_ended(
        &mut self,
        dp: &mut DataPath,
        session: SessionId,
        connector: ConnectorId,
        how: ConnectionEnd,
    ) -> Result<CmResponse> {
        let c = self.connector(session, connector)?;
        if !c.hand_off {
            return Err(connection_invalid(
                "the connector's data path is the daemon's, not the client's",
            ));
        }
        if let Some(cn) = c.conn.and_then(|conn| self.conns.get(&conn)) {
            debug!(
                connector = connector.0,
                local = ?Some(cn.local),
                peer = ?Some(cn.remote),
                how = how.name(),
                "connection ended (in the client)"
            );
        }
        self.peer_gone(dp, connector);
        Ok(CmResponse::Done)
    }

    /// The client's report of its in-process data path, for `status`: kept until the next report or the
    /// session's end, each queue pair marked as the session's. What a session can make the daemon keep this
    /// way is bounded by what it already holds here: one queue pair per object it holds (its connectors
    /// carry the queue pairs worth showing), plus [`REPORT_SLACK`] for queue pairs not yet given to one,
    /// so the daemon-wide total follows the object limits.
    pub(super) fn report_data_path(
        &mut self,
        session: SessionId,
        queue_pairs: Vec<QueuePairStatus>,
        memory_regions: u32,
        first: bool,
    ) -> Result<CmResponse> {
        let held = self.objects.get(&session).copied().unwrap_or(0);
        let bound = held
            .saturating_add(REPORT_SLACK)
            .min(self.config.limits.max_objects_per_session);
        let report = self.client_data_paths.entry(session).or_default();
        if first {
            report.0.clear();
        }
        report.1 = memory_regions;
        let kept = queue_pairs.len().min(bound.saturating_sub(report.0.len()));
        self.reported
            .record(session, first, &queue_pairs[..kept], &mut self.counters);
        for mut q in queue_pairs.into_iter().take(kept) {
            q.session = session.0;
            report.0.push(q);
        }
        Ok(CmResponse::Done)
    }
}
