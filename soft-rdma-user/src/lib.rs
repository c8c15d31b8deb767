//! soft-rdma userspace: the sans-IO engine, the daemon's transports and UDS server, and the client library.
