//! Terminate body parsing (RFC 5040 §4.8): never panics; what parses re-emits to a frame that parses equal.
#![no_main]
use libfuzzer_sys::fuzz_target;
use soft_rdma_common::wire::terminate::TerminateRepr;

#[macro_use]
#[path = "common/mod.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    round_trip!(TerminateRepr, data);
});
