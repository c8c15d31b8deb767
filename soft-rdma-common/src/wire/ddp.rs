//! DDP segment headers (RFC 5041 §4): tagged (14 bytes) and untagged (18 bytes).
//!
//! ```text
//!  byte 0, DDP control: T 0x80 | L 0x40 | 4 reserved | DV (2 bits) = 01
//!  byte 1, reserved for the ULP: the RDMAP control byte (RFC 5040 §4.2)
//!  tagged:   STag (4) | Tagged Offset (8)
//!  untagged: RDMAP field (4: invalidate STag or 0) | Queue Number (4) | MSN (4) | Message Offset (4)
//! ```

use zerocopy::byteorder::network_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::buf::{check_len, check_room, header_view};
use super::error::WireError;

pub const TAGGED_HEADER_LEN: usize = 14;
pub const UNTAGGED_HEADER_LEN: usize = 18;
pub const DDP_VERSION: u8 = 1;
pub const CTRL_TAGGED: u8 = 0x80;
pub const CTRL_LAST: u8 = 0x40;
const CTRL_VERSION_MASK: u8 = 0x03;

/// Untagged queue numbers (RFC 5040 §5.1).
pub const QN_SEND: u32 = 0;
pub const QN_READ_REQUEST: u32 = 1;
pub const QN_TERMINATE: u32 = 2;

/// Zero-copy view of a tagged DDP header.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct TaggedHeader {
    pub control: u8,
    pub ulp_control: u8,
    pub stag: U32,
    pub tagged_offset: U64,
}

/// Zero-copy view of an untagged DDP header.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct UntaggedHeader {
    pub control: u8,
    pub ulp_control: u8,
    pub ulp_field: U32,
    pub queue: U32,
    pub msn: U32,
    pub message_offset: U32,
}

/// Where a segment's payload goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Tagged buffer model: STag + offset into the target's registered region (RFC 5041 §4.3).
    Tagged { stag: u32, offset: u64 },
    /// Untagged buffer model: queue, message sequence number, offset in the message (RFC 5041 §4.4).
    /// `ulp_field` is the RDMAP "Invalidate STag" for Send with Invalidate, else 0.
    Untagged {
        queue: u32,
        msn: u32,
        offset: u32,
        ulp_field: u32,
    },
}

impl Placement {
    /// Untagged on `queue`, message `msn`, at message offset 0 with a zero ULP field: a message's first (or
    /// only) segment when it invalidates nothing (RFC 5041 §4.4).
    pub const fn untagged_start(queue: u32, msn: u32) -> Self {
        Placement::Untagged {
            queue,
            msn,
            offset: 0,
            ulp_field: 0,
        }
    }

    pub const fn is_tagged(&self) -> bool {
        matches!(self, Placement::Tagged { .. })
    }

    pub const fn header_len(&self) -> usize {
        if self.is_tagged() {
            TAGGED_HEADER_LEN
        } else {
            UNTAGGED_HEADER_LEN
        }
    }
}

/// A parsed DDP header; `ulp_control` is the opaque byte 1 (RDMAP's control byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DdpRepr {
    /// L: the last segment of a message.
    pub last: bool,
    pub ulp_control: u8,
    pub placement: Placement,
}

impl DdpRepr {
    /// Parses the DDP header at the start of a ULPDU; returns it and its length.
    pub fn parse(buf: &[u8]) -> Result<(DdpRepr, usize), WireError> {
        check_len(buf, 1)?;
        let control = buf[0];
        // RFC 5041 §4.2: DV must be 1.
        if control & CTRL_VERSION_MASK != DDP_VERSION {
            return Err(WireError::BadDdpVersion(control & CTRL_VERSION_MASK));
        }
        let last = control & CTRL_LAST != 0;
        if control & CTRL_TAGGED != 0 {
            let h: &TaggedHeader = header_view(buf, TAGGED_HEADER_LEN)?;
            let placement = Placement::Tagged {
                stag: h.stag.get(),
                offset: h.tagged_offset.get(),
            };
            Ok((
                DdpRepr {
                    last,
                    ulp_control: h.ulp_control,
                    placement,
                },
                TAGGED_HEADER_LEN,
            ))
        } else {
            let h: &UntaggedHeader = header_view(buf, UNTAGGED_HEADER_LEN)?;
            let placement = Placement::Untagged {
                queue: h.queue.get(),
                msn: h.msn.get(),
                offset: h.message_offset.get(),
                ulp_field: h.ulp_field.get(),
            };
            Ok((
                DdpRepr {
                    last,
                    ulp_control: h.ulp_control,
                    placement,
                },
                UNTAGGED_HEADER_LEN,
            ))
        }
    }

    pub const fn buffer_len(&self) -> usize {
        self.placement.header_len()
    }

    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let len = self.buffer_len();
        check_room(buf, len)?;
        let mut control = DDP_VERSION;
        if self.last {
            control |= CTRL_LAST;
        }
        match self.placement {
            Placement::Tagged { stag, offset } => {
                let h = TaggedHeader {
                    control: control | CTRL_TAGGED,
                    ulp_control: self.ulp_control,
                    stag: stag.into(),
                    tagged_offset: offset.into(),
                };
                buf[..len].copy_from_slice(h.as_bytes());
            }
            Placement::Untagged {
                queue,
                msn,
                offset,
                ulp_field,
            } => {
                let h = UntaggedHeader {
                    control,
                    ulp_control: self.ulp_control,
                    ulp_field: ulp_field.into(),
                    queue: queue.into(),
                    msn: msn.into(),
                    message_offset: offset.into(),
                };
                buf[..len].copy_from_slice(h.as_bytes());
            }
        }
        Ok(len)
    }
}
