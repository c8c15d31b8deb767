//! The sans-IO engine: everything soft-rdma decides, as plain state machines fed requests, transport
//! events and time, and drained for transport commands and application events (the quinn-proto model).
//!
//! - [`port_space`]: the RDMA port space 49152-65535 and the 4-tuple registry.
//! - [`mpa`]: the MPA v1/v2 connection handshake (RFC 5044 §7, RFC 6581), one per TCP connection.
//! - [`limits`]: what clients may consume of the daemon ([`limits::Limits`]).
//! - [`read_limits`]: IRD/ORD negotiation (RFC 6581 §9, docs/connector-semantics.md "Read limits").
//! - [`cm`]: the connection manager's endpoint ([`cm::Endpoint`]): a dispatcher (`cm/mod.rs`) over connectors
//!   (`cm/connector.rs`), listeners and shared endpoints (`cm/listener.rs`) with the IND2Connector /
//!   NdkConnect / TDI rules, and what each connection's bytes mean for them (`cm/stream.rs`).
//! - [`connection`]: one TCP connection ([`connection::Connection`]: its phase, MPA handshake, FPDU intake
//!   and first-FPDU hold, what its bytes mean); its FPDU mode ([`connection::FpduConnection`]: the inbound
//!   side, the first-FPDU hold, how the stream ends) is driven alike by the daemon's endpoint and the client
//!   library's in-process data path.
//! - [`first_fpdu`]: the active side's first FPDU, held briefly after the Reply (siw's responder race).
//! - [`fpdu_stream`]: one FPDU-mode connection's inbound side (FPDUs to the queue pair, RTR, Terminates),
//!   shared by the daemon's data path and the client library's in-process one.
//! - [`framing`]: every FPDU written or cut from a stream (RFC 5044 §4): data, RTR, Terminate, CRC.
//! - [`ids`]: the handles every other module names (sessions, requests, connectors, listeners, shared
//!   endpoints, transport connections).
//! - [`requests`]: what a session asks and is answered: [`requests::CmRequest`], [`requests::CmResponse`],
//!   [`requests::CmEvent`], adapter and read limits.
//! - [`status`]: the engine's part of `soft-rdma status` (connectors, listeners, ports, queue pairs).
//! - [`transport_seam`]: the commands the engine gives its transports and the events they report back.
//! - [`verbs`]: the data path's types: STags, access rights, work requests, completions, queue-pair status,
//!   why a stream was terminated.
//! - [`violation`]: the words for a terminated stream: the rule an inbound message broke, what a
//!   Terminate's cause means.
//! - [`traffic`]: messages and bytes by RDMAP operation and direction (a queue pair's, and totals).
//! - [`counters`]: what the endpoint counted for soft-rdmad's metrics (connection setups, Terminates) and
//!   the totals of the clients' reported queue pairs.
//! - [`memory`]: registered memory regions, STag allocation and every access check.
//! - [`qp`]: one queue pair's RDMAP/DDP engine (RFC 5040, RFC 5041): send side, receive side, faults.
//! - [`srq`]: shared receive queues: Receives any queue pair created on one takes, and the limit event.
//! - [`datapath`]: every session's regions, completion queues, shared receive queues and queue pairs, and
//!   the transmit window.
//!
//! - [`rnic`]: one software RNIC, what a driver feeds: the endpoint ([`cm::Endpoint`]) and the data path
//!   ([`datapath::DataPath`]) side by side.
//!
//! Transports (kernel TCP via tokio, own TCP or smoltcp's over AF_XDP) and the UDS server are thin drivers
//! around [`rnic::Rnic`]; nothing in here touches a socket or a clock.

pub mod cm;
pub mod connection;
pub mod counters;
pub mod datapath;
pub mod first_fpdu;
pub mod fpdu_stream;
pub mod framing;
pub mod ids;
pub mod limits;
pub mod memory;
pub mod mpa;
pub mod port_space;
pub mod qp;
pub mod read_limits;
pub mod requests;
pub mod rnic;
pub mod srq;
pub mod status;
pub mod traffic;
pub mod transport_seam;
pub mod verbs;
pub mod violation;

#[cfg(test)]
mod cm_tests;
