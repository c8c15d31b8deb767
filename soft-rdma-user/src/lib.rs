//! soft-rdma userspace: the sans-IO engine, the daemon (kernel-TCP transport, UDS server, event loop), the
//! async client library, and packet captures. See `docs/architecture.md`.
//!
//! Cargo features keep the client apart from the daemon: `client` is the library an application links
//! ([`engine`], [`client`], the Unix-socket protocol in [`uds`], [`shm`], [`capture`], [`error`]), with no
//! eBPF tool chain and no aya, smoltcp or xdpilone in its dependency graph; `daemon` adds [`daemon`],
//! [`transport`] and the UDS server; `cli` adds the `soft-rdma` tool. The default turns all three on.
//!
//! The layout, one line per module (each module's own documentation says more):
//!
//! - [`engine`]: the sans-IO core: connection manager, MPA handshake, FPDU framing, queue pairs, memory
//!   registry; fed requests, bytes and time, drained for transport commands and events. No sockets, no clock.
//! - [`client`]: the async client library an application links; re-exports the types it names.
//! - [`uds`]: the Unix-socket protocol between clients and soft-rdmad: codec ([`uds::proto`]), descriptor
//!   passing ([`uds::fdpass`]) and, with `daemon`, the daemon's sessions (`uds::server`).
//! - [`rings`]: shared-memory work and completion queues between a client and the daemon (SPSC rings in a
//!   sealed memfd, eventfd doorbells), for queue pairs whose data path runs in soft-rdmad.
//! - [`shm`]: registered memory shared by a client and the daemon (a sealed memfd mapped by both).
//! - [`capture`]: pcap captures of iWARP conversations, for tshark and `soft-rdma wire`.
//! - [`error`]: the one error type: a NetworkDirect status and its context.
//! - [`seed`]: random seeds from the operating system, for the engine's keys and the TCP's sequence numbers.
//! - [`tcp`]: a sans-IO TCP (RFC 9293 with SACK, RFC 6298 RTO, NewReno or BBR, RACK-TLP), fed segments and
//!   time; the XDP transport runs its steered flows on it (`soft-rdmad --xdp-tcp smoltcp` uses smoltcp's
//!   socket instead).
//! - [`warn_limit`]: repeated warnings a peer or a client can trigger, aggregated (`warn_limited!`).
//! - `daemon` (feature `daemon`): soft-rdmad's event loop, owning the engine and driving the transport.
//! - `transport` (feature `daemon`): kernel TCP (tokio) and XDP (smoltcp over AF_XDP) drivers of the engine.
//!
//! Long-form documents live in `docs/`: `architecture.md`, `protocol.md` (the Unix-socket protocol),
//! `connector-semantics.md` (the NetworkDirect rules and statuses) and `iwarp-wire.md` (the wire, by RFC).

pub mod capture;
pub mod client;
#[cfg(feature = "daemon")]
pub mod daemon;
pub mod engine;
pub mod error;
pub mod rings;
pub mod seed;
pub mod shm;
pub mod status;
pub mod tcp;
pub mod transport;
pub mod uds;
pub mod warn_limit;

pub use error::{Error, NdStatus, Result};
// The crate's own logging macro, at the root where its call sites name it (not exported).
pub(crate) use warn_limit::warn_limited;
