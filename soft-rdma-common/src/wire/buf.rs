//! The bounds checks every format's `parse` and `emit` start with: that the bytes hold the fixed-size
//! header the RFC lays out (RFC 5044 §7.1 and §4.1, RFC 5041 §4, RFC 5040 §4.4 and §4.8) and that an output
//! buffer has room for it, each failure its [`WireError`].

use super::error::WireError;

/// `Err(Truncated)` unless `buf` holds `needed` bytes.
pub(crate) fn check_len(buf: &[u8], needed: usize) -> Result<(), WireError> {
    let available = buf.len();
    (available >= needed)
        .then_some(())
        .ok_or(WireError::Truncated { needed, available })
}

/// `Err(BufferTooSmall)` unless `buf` has room for `needed` bytes.
pub(crate) fn check_room(buf: &[u8], needed: usize) -> Result<(), WireError> {
    let available = buf.len();
    (available >= needed)
        .then_some(())
        .ok_or(WireError::BufferTooSmall { needed, available })
}

/// A view of the `H` (of `len` bytes, its wire size) at the start of `buf`; `Err(Truncated)` when `buf`
/// is shorter.
pub(crate) fn header_view<H: zerocopy::FromBytes + zerocopy::KnownLayout + zerocopy::Immutable>(
    buf: &[u8],
    len: usize,
) -> Result<&H, WireError> {
    check_len(buf, len)?;
    H::ref_from_prefix(buf)
        .map(|(h, _)| h)
        .map_err(|_| WireError::Truncated {
            needed: len,
            available: buf.len(),
        })
}
