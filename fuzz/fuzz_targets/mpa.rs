//! MPA Request/Reply parsing (RFC 5044 §7.1, RFC 6581): never panics; whatever parses re-emits to the
//! same frame (up to the reserved flag bits and the R bit of a Request, which parse ignores).
#![no_main]
use libfuzzer_sys::fuzz_target;
use soft_rdma_common::wire::mpa::{EnhancedControl, MpaRepr};

fuzz_target!(|data: &[u8]| {
    let len = MpaRepr::frame_len(data);
    if let Ok(repr) = MpaRepr::parse(data) {
        let n = repr.buffer_len();
        assert_eq!(len, Ok(Some(n)));
        let mut out = vec![0u8; n];
        assert_eq!(repr.emit(&mut out), Ok(n));
        assert_eq!(MpaRepr::parse(&out), Ok(repr));
        assert_eq!(out[..16], data[..16]);
        assert_eq!(out[17..n], data[17..n]);
    }
    if let Ok(w) = EnhancedControl::parse(data) {
        let mut out = [0u8; 4];
        w.emit(&mut out).unwrap();
        assert_eq!(out, data[..4]);
    }
});
