//! The sans-IO engine: everything soft-rdma decides, as plain state machines fed requests, transport
//! events and time, and drained for transport commands and application events (the quinn-proto model).
//!
//! - [`port_space`]: the RDMA port space 49152-65535 and the 4-tuple registry.
//! - [`mpa`]: the MPA v1/v2 connection handshake (RFC 5044 §7, RFC 6581), one per TCP connection.
//! - [`limits`]: what clients may consume of the daemon ([`limits::Limits`]).
//! - [`read_limits`]: IRD/ORD negotiation (RFC 6581 §9, connector-semantics "Read limits").
//! - [`cm`]: the connection manager: connectors, listeners and shared endpoints with the IND2Connector /
//!   NdkConnect / TDI rules, owning the port space and one MPA handshake per connection.
//! - [`framing`]: whole FPDUs from RDMAP messages.
//! - [`api`]: the types at the engine's edges, shared by the daemon's drivers and the UDS server.
//!
//! Transports (kernel TCP via tokio, smoltcp over AF_XDP) and the UDS server are thin drivers around
//! [`cm::ConnectionManager`]; nothing in here touches a socket or a clock.

pub mod api;
pub mod cm;
pub mod datapath;
pub mod framing;
pub mod limits;
pub mod memory;
pub mod mpa;
pub mod port_space;
pub mod qp;
pub mod read_limits;

#[cfg(test)]
mod cm_tests;
