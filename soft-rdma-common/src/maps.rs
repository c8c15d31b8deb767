//! XDP map key/value types shared by the XDP program and the daemon.
