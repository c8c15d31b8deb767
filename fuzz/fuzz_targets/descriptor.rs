//! A peer's buffer descriptor (soft_rdma::client::BufferDescriptor), as an application reads it from private
//! data or a Send: never panics; what parses re-emits to exactly the same 24 bytes, and its windows stay
//! inside it.
#![no_main]
use libfuzzer_sys::fuzz_target;
use soft_rdma::client::BufferDescriptor;

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = BufferDescriptor::from_bytes(data) {
        assert_eq!(d.to_bytes().as_slice(), data);
        if let Ok(s) = d.slice(1..) {
            assert!(s.remote().offset > d.remote().offset && s.len() < d.len());
        }
    }
});
