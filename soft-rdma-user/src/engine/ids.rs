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
