//! soft-rdmad: the event loop that owns the engine and drives the transport and the UDS server.
