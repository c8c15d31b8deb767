//! Whole FPDUs from RDMAP messages (RFC 5044 §4): DDP/RDMAP header and payload, MPA length, pad, and the
//! CRC32c field (zero when CRC was not negotiated).

use bytes::Bytes;
use soft_rdma_common::wire::WireError;
use soft_rdma_common::wire::fpdu::FpduRepr;
use soft_rdma_common::wire::rdmap::MessageRepr;

/// The FPDU carrying `msg`, with a CRC when `crc` is negotiated.
pub fn fpdu(msg: &MessageRepr<'_>, crc: bool) -> Result<Bytes, WireError> {
    let mut ulpdu = vec![0u8; msg.buffer_len()];
    msg.emit(&mut ulpdu)?;
    let f = FpduRepr {
        ulpdu: &ulpdu,
        crc: 0,
    };
    let mut out = vec![0u8; f.buffer_len()];
    if crc {
        f.emit_with_crc(&mut out)?;
    } else {
        f.emit(&mut out)?;
    }
    Ok(Bytes::from(out))
}
