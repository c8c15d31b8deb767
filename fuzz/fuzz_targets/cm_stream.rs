//! The connection manager (soft_rdma::engine::cm) fed arbitrary bytes on an accepted connection, before and
//! after a real handshake: never panics, and whatever happens, the port space is whole again after the
//! session closes.
//!
//! One engine serves every input (made once: `Rnic::new` builds the port space's 16,384-port queue, which
//! cost a quarter of each execution and swelled libFuzzer's per-execution feature scan); each input is a
//! session of its own, with its own listener and connection, and leaves the engine as it found it: the
//! session closed, the connection gone, the port space whole, no event, command or deadline left.
#![no_main]
use std::cell::RefCell;
use std::net::SocketAddr;
use std::time::Instant;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use soft_rdma::engine::cm::CmConfig;
use soft_rdma::engine::mpa::{MpaConfig, MpaInitiator};
use soft_rdma::engine::requests::*;
use soft_rdma::engine::rnic::Rnic;
use soft_rdma::engine::transport_seam::*;

struct Host;
impl HostPorts for Host {
    fn reserve(&mut self, _: SocketAddr, _: bool) -> Result<(), ConnectFailure> {
        Ok(())
    }
    fn release(&mut self, _: SocketAddr) {}
}

thread_local! {
    /// The engine, and the number of the next input's session and connection.
    static ENGINE: RefCell<(Rnic, u64)> =
        RefCell::new((Rnic::new(CmConfig::default_siw_compatible(), Box::new(Host), 0), 1));
}

fuzz_target!(|data: &[u8]| {
    ENGINE.with(|e| {
        let (cm, next) = &mut *e.borrow_mut();
        *next += 1;
        one_input(cm, *next, data);
        // Nothing of the input is left: no command, event or deadline (close_session and Closed ended all).
        while cm.poll_transport().is_some() {}
        while cm.poll_event().is_some() {}
        assert_eq!(cm.poll_timeout(), None, "a deadline outlived its session");
    });
});

/// Input `n` in session `n` on connection `n`; whatever it did, the session closes and the connection ends.
fn one_input(cm: &mut Rnic, n: u64, data: &[u8]) {
    let Some((&mode, data)) = data.split_first() else {
        return;
    };
    let now = Instant::now();
    let (s, conn) = (SessionId(n), ConnId((1 << 62) + n));
    drive(cm, now, s, conn, mode, data);
    cm.close_session(now, s);
    cm.handle_transport(now, TransportEvent::Closed { conn });
    assert_eq!(cm.status().ports_in_use, 0);
}

fn drive(cm: &mut Rnic, now: Instant, s: SessionId, conn: ConnId, mode: u8, data: &[u8]) {
    let local: SocketAddr = "10.0.0.2:7000".parse().unwrap();
    let Ok(CmResponse::Listener(l)) = cm.handle_request(now, s, RequestId(1), CmRequest::CreateListener)
    else {
        return;
    };
    cm.handle_request(
        now,
        s,
        RequestId(2),
        CmRequest::Listen {
            listener: l,
            local,
            backlog: 0,
        },
    )
    .unwrap();
    cm.handle_transport(
        now,
        TransportEvent::Accepted {
            listener: l,
            conn,
            local,
            remote: "10.0.0.1:50000".parse().unwrap(),
            mss: 1448,
        },
    );
    if mode & 1 == 1 {
        // A valid Request first, accepted by the application; then the arbitrary bytes are FPDU-mode.
        let (_, request) = MpaInitiator::new(
            &MpaConfig::default(),
            ReadLimits {
                inbound: 2,
                outbound: 2,
            },
            b"x",
        )
        .unwrap();
        cm.handle_transport(now, TransportEvent::Received { conn, data: request });
        let Ok(CmResponse::Connector(c)) =
            cm.handle_request(now, s, RequestId(3), CmRequest::CreateConnector)
        else {
            return;
        };
        let _ = cm.handle_request(
            now,
            s,
            RequestId(4),
            CmRequest::GetConnectionRequest {
                listener: l,
                connector: c,
            },
        );
        let _ = cm.handle_request(
            now,
            s,
            RequestId(5),
            CmRequest::Accept {
                connector: c,
                limits: ReadLimits::default(),
                private_data: Bytes::new(),
                queue_pair: None,
            },
        );
    }
    for chunk in data.chunks(((mode >> 1) as usize).max(1)) {
        cm.handle_transport(
            now,
            TransportEvent::Received {
                conn,
                data: Bytes::copy_from_slice(chunk),
            },
        );
        while cm.poll_transport().is_some() {}
        while cm.poll_event().is_some() {}
    }
}
