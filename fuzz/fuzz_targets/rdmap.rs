//! DDP + RDMAP message parsing (RFC 5041 §4, RFC 5040 §4): never panics; a parsed message re-emits
//! byte-identically apart from the reserved bits parse ignores.
#![no_main]
use libfuzzer_sys::fuzz_target;
use soft_rdma_common::wire::rdmap::MessageRepr;

#[macro_use]
#[path = "common/mod.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    if let Some((m, out)) = round_trip!(MessageRepr, data) {
        assert_eq!(out[2..], data[2..]);
        let _ = m.read_request();
        let _ = m.terminate();
    }
});
