//! The Unix-socket protocol between soft-rdmad and its clients: the message codec ([`proto`]) and the
//! daemon's side of it ([`server`]). `docs/protocol.md` documents every message.

pub mod fdpass;
pub mod proto;
#[cfg(feature = "daemon")]
pub mod server;
