//! The RDMA Read Request header (RFC 5040 §4.4): the 28 bytes an RDMA Read Request carries and a Terminate's
//! R field repeats (§4.8). Its own module because both [`super::rdmap`] and [`super::terminate`] need it, and
//! rdmap uses terminate (a Terminate message's body), so it cannot live in either.

use zerocopy::byteorder::network_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::buf::{check_room, header_view};
use super::error::WireError;

pub const READ_REQUEST_LEN: usize = 28;

/// Zero-copy view of the 28-byte RDMA Read Request header.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct ReadRequestHeader {
    pub sink_stag: U32,
    pub sink_offset: U64,
    pub read_size: U32,
    pub source_stag: U32,
    pub source_offset: U64,
}

/// The RDMA Read Request header (RFC 5040 §4.4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ReadRequestRepr {
    pub sink_stag: u32,
    pub sink_offset: u64,
    pub read_size: u32,
    pub source_stag: u32,
    pub source_offset: u64,
}

impl ReadRequestRepr {
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let h: &ReadRequestHeader = header_view(buf, READ_REQUEST_LEN)?;
        Ok(ReadRequestRepr {
            sink_stag: h.sink_stag.get(),
            sink_offset: h.sink_offset.get(),
            read_size: h.read_size.get(),
            source_stag: h.source_stag.get(),
            source_offset: h.source_offset.get(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        READ_REQUEST_LEN
    }

    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        check_room(buf, READ_REQUEST_LEN)?;
        let h = ReadRequestHeader {
            sink_stag: self.sink_stag.into(),
            sink_offset: self.sink_offset.into(),
            read_size: self.read_size.into(),
            source_stag: self.source_stag.into(),
            source_offset: self.source_offset.into(),
        };
        buf[..READ_REQUEST_LEN].copy_from_slice(h.as_bytes());
        Ok(READ_REQUEST_LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn read_request_round_trip(v in any::<(u32, u64, u32, u32, u64)>()) {
            let r = ReadRequestRepr { sink_stag: v.0, sink_offset: v.1, read_size: v.2, source_stag: v.3, source_offset: v.4 };
            let mut b = [0u8; 28];
            r.emit(&mut b).unwrap();
            prop_assert_eq!(ReadRequestRepr::parse(&b), Ok(r));
        }
    }
}
