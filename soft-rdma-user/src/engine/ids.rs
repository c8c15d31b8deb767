//! The handles every other engine type names: sessions, requests, connectors, listeners, shared endpoints
//! and transport connections. Plain integers chosen by the engine (or, for accepted connections, by the
//! transport), unique for the daemon's lifetime, never reused. Nothing here depends on another engine module.

/// One UDS client session (one connection to soft-rdmad). Owns every object it creates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct SessionId(pub u64);

/// A request's id, chosen by the client, echoed in the asynchronous completion
/// ([`CmEvent::Completed`](super::requests::CmEvent::Completed)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct RequestId(pub u64);

/// An IND2Connector.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct ConnectorId(pub u64);

/// An IND2Listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct ListenerId(pub u64);

/// An NDK shared endpoint (one local addr:port shared by many outgoing connections).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct SharedEndpointId(pub u64);

/// One TCP connection as the transport knows it (active or accepted). Never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct ConnId(pub u64);

/// A protection domain, numbered by the session that made it (`ibv_alloc_pd`; the client library's
/// `Adapter::protection_domain`). `PdId(0)` is each adapter's default domain. The
/// number means something only inside its session: see the engine's `Domain`.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct PdId(pub u32);

/// The protection domain a memory region or queue pair belongs to: its session and the session's PD number.
/// A tagged access, a local SGE and a Send with Invalidate reach a region only through a queue pair of the
/// same domain (siw `siw_check_mem`: `mem->pd != pd` → E_PD_MISMATCH; RFC 5040 §7.2 "STag not associated
/// with RDMAP stream"). Regions of two sessions are never in one domain, whatever numbers they chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Domain {
    pub session: SessionId,
    pub pd: PdId,
}

impl Domain {
    pub const fn new(session: SessionId, pd: PdId) -> Self {
        Domain { session, pd }
    }
}

/// The session's default protection domain (`PdId(0)`).
impl From<SessionId> for Domain {
    fn from(session: SessionId) -> Self {
        Domain::new(session, PdId::default())
    }
}
