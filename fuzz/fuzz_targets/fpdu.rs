//! FPDU framing (RFC 5044 §4): never panics; a parsed FPDU re-emits byte-identically (with its CRC).
#![no_main]
use libfuzzer_sys::fuzz_target;
use soft_rdma_common::wire::fpdu::{FpduRepr, verify_crc};

fuzz_target!(|data: &[u8]| {
    let max = 1454;
    if let Ok(f) = FpduRepr::parse(data, max) {
        let n = f.buffer_len();
        let mut out = vec![0u8; n];
        f.emit(&mut out).unwrap();
        out[n - 4..].copy_from_slice(&f.crc.to_le_bytes());
        // Pad bytes are sent as zero but not checked on receive.
        let pad_at = 2 + f.ulpdu.len();
        assert_eq!(out[..pad_at], data[..pad_at]);
        assert_eq!(out[n - 4..], data[n - 4..n]);
        let _ = verify_crc(&data[..n]);
    }
});
