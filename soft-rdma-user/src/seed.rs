//! Seeds from the operating system: 64 random bits for whatever must differ between runs and processes
//! (STag keys, initial sequence numbers, ephemeral ports). The engine takes them as input (it is sans-IO).

/// 64 random bits for the engine (STag keys) and the XDP transport's TCP stack (initial sequence numbers,
/// ephemeral ports): from the kernel's generator, mixed with the time and the process id, so that two daemon
/// runs differ even if /dev/urandom cannot be read.
pub fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut b = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut b);
    }
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(u64::from_ne_bytes(b));
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}
