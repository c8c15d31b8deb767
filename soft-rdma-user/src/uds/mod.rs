//! The UDS protocol between soft-rdmad and its clients (codec) and the daemon side of it (sessions).
