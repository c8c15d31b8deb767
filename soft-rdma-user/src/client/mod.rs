//! The async client library (tokio): Adapter, Connector, Listener, SharedEndpoint over the UDS protocol.
