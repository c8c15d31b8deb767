//! The Unix-socket protocol between soft-rdmad and its clients: the message codec ([`proto`]) and the
//! daemon's side of it ([`server`]). `docs/protocol.md` documents every message.

#[cfg(feature = "daemon")]
pub mod budget;
pub mod fdpass;
pub mod proto;
#[cfg(feature = "daemon")]
pub mod server;
