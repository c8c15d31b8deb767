//! Terminate body parsing (RFC 5040 §4.8): never panics; what parses re-emits to a frame that parses equal.
#![no_main]
use libfuzzer_sys::fuzz_target;
use soft_rdma_common::wire::terminate::TerminateRepr;

fuzz_target!(|data: &[u8]| {
    if let Ok(t) = TerminateRepr::parse(data) {
        let mut out = vec![0u8; t.buffer_len()];
        t.emit(&mut out).unwrap();
        assert_eq!(TerminateRepr::parse(&out), Ok(t));
    }
});
