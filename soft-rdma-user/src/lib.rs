//! soft-rdma userspace: the sans-IO engine, the daemon (kernel-TCP transport, UDS server, event loop), the
//! async client library, and packet captures. See `docs/architecture.md`.
//!
//! # What an application sees
//!
//! An application links the library with `default-features = false, features = ["client"]` and sees
//! [`client`], the async client library, and the crate root's [`Error`], [`NdStatus`] and [`Result`]. Every
//! type that a public signature of `client` names is reachable from `client` itself, which re-exports them
//! (the handles, the requests' and the verbs' types, `soft-rdma status`'s report).
//!
//! Everything else is the implementation, and is private unless the feature `internals` is on. The daemon
//! and the CLI turn it on (`daemon` and `cli` imply it: their binaries drive the engine and the transports),
//! and so do the crates that test the internals (the netns suites in `tests/`, the benchmarks, the fuzz
//! targets). Without it an application cannot come to depend on the engine's modules, which change freely.
//!
//! # Features
//!
//! Cargo features keep the client apart from the daemon: `client` is the library an application links
//! (the client, the engine and the Unix-socket protocol it runs on), with no eBPF tool chain and no aya,
//! smoltcp or xdpilone in its dependency graph; `internals` makes the implementation's modules (all but
//! `client` below) public; `daemon` adds `daemon`, the transports and the UDS server; `cli` adds the
//! `soft-rdma` tool. The default turns all four on.
//!
//! # Layout
//!
//! One line per module (each module's own documentation says more); all but `client` are internals:
//!
//! - `client`: the async client library an application links; re-exports the types it names.
//! - `engine`: the sans-IO core: one RNIC (`engine::rnic`) of an endpoint (sessions, ports, connectors,
//!   listeners, a `Connection` per TCP connection with its MPA handshake and FPDU intake) beside a data path
//!   (queue pairs, memory registry); fed requests, bytes and time, drained for transport commands and
//!   events. No sockets, no clock.
//! - `uds`: the Unix-socket protocol between clients and soft-rdmad: codec (`uds::proto`), descriptor passing
//!   (`uds::fdpass`) and, with `daemon`, the daemon's sessions (`uds::server`).
//! - `rings`: shared-memory work and completion queues between a client and the daemon (SPSC rings in a
//!   sealed memfd, eventfd doorbells), for queue pairs whose data path runs in soft-rdmad.
//! - `shm`: registered memory shared by a client and the daemon (a sealed memfd mapped by both).
//! - `error`: the one error type: a NetworkDirect status and its context.
//! - `status`: `soft-rdma status`, everything the daemon holds, as one report.
//! - `seed`: random seeds from the operating system, for the engine's keys and the TCP's sequence numbers.
//! - `warn_limit`: repeated warnings a peer or a client can trigger, aggregated (`warn_limited!`).
//! - `transport`: kernel TCP (tokio) and XDP (the own TCP, or smoltcp's, over AF_XDP) drivers of the engine
//!   (feature `daemon`;
//!   only `transport::status` is built without it).
//! - `dropin` (feature `internals`): where the drop-in `libibverbs.so.1`/`librdmacm.so.1` are found (the
//!   link directory that `soft-rdma run` and the `soft-rdma-verbs` crate make).
//! - `capture` (feature `internals`): pcap captures of iWARP conversations, for tshark and `soft-rdma wire`.
//! - `tcp` (feature `internals`): a sans-IO TCP (RFC 9293 with SACK, RFC 6298 RTO, NewReno or BBR,
//!   RACK-TLP), fed segments and time; the XDP transport runs its steered flows on it (`soft-rdmad --xdp-tcp
//!   smoltcp` uses smoltcp's socket instead).
//! - `daemon` (feature `daemon`): soft-rdmad's event loop, owning the RNIC and driving the transport.
//!
//! Long-form documents live in `docs/`: `architecture.md`, `protocol.md` (the Unix-socket protocol),
//! `connector-semantics.md` (the NetworkDirect rules and statuses) and `iwarp-wire.md` (the wire, by RFC).

pub mod client;
pub use error::{Error, NdStatus, Result};

// The implementation. Each module an application's build needs is declared twice: public with `internals`,
// private without. Private, its parts that only the daemon uses are dead code in that build: expected, not a
// finding. `capture` and `tcp`, which the client library does not use, are not built without `internals`.
#[cfg(feature = "internals")]
pub mod capture;
#[cfg(feature = "daemon")]
pub mod daemon;
#[cfg(feature = "internals")]
pub mod dropin;
/// Declares implementation modules: public with `internals`, private without (their daemon-only parts are
/// then dead code, and clippy judges the names of items that are not exported only:
/// `Request::GetConnectionRequest` is ND's name).
macro_rules! implementation {
    ($($module:ident),+ $(,)?) => {
        $(
            #[cfg(feature = "internals")]
            pub mod $module;
            #[cfg(not(feature = "internals"))]
            #[allow(dead_code, unused_imports, clippy::enum_variant_names)]
            mod $module;
        )+
    };
}

implementation!(
    engine, error, rings, seed, shm, status, transport, uds, warn_limit
);
#[cfg(feature = "internals")]
pub mod tcp;

// The crate's own logging macro, at the root where its call sites name it (not exported).
pub(crate) use warn_limit::warn_limited;
