//! The Unix-socket protocol between soft-rdmad and its clients: the requests and answers ([`messages`]), the
//! frame codec ([`proto`]), descriptor passing ([`fdpass`]) and the daemon's side of it (`server`, feature
//! `daemon`). `docs/protocol.md` documents every message.

#[cfg(feature = "daemon")]
pub mod budget;
pub mod fdpass;
pub mod messages;
#[cfg(feature = "daemon")]
pub mod process_memory;
pub mod proto;
#[cfg(feature = "daemon")]
pub mod server;
