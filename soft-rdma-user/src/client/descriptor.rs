//! What one side tells its peer about a window of its registered memory, so that the peer can RDMA-Write
//! into it or RDMA-Read from it: a [`BufferDescriptor`] (the window's STag, tagged offset and length, and the
//! access its owner granted), in a fixed 24-byte layout that fits an Accept's or a Connect's private data,
//! or a Send.
//!
//! The owner makes one with [`MemoryRegion::descriptor`](super::MemoryRegion::descriptor) and sends
//! [`BufferDescriptor::to_bytes`]; the peer reads it with [`BufferDescriptor::from_bytes`] (untrusted input:
//! each malformation is its own [`DescriptorError`], never a panic) and hands it, or a
//! [`BufferDescriptor::slice`] of it, to [`QueuePair::write_async`](super::QueuePair::write_async) or
//! [`QueuePair::read_async`](super::QueuePair::read_async). Those check, before anything is posted, that
//! the transfer fits the window and that the owner granted that access, so a Write past the advertised end
//! fails at once with a clear error instead of terminating the connection at the peer.
//!
//! # The layout
//!
//! 24 bytes, integers big-endian (network byte order):
//!
//! | bytes | field | value |
//! | --- | --- | --- |
//! | 0–1 | magic | `0x53 0x52` (`"SR"`) |
//! | 2 | version | `1` |
//! | 3 | access | `0x02` REMOTE_READ, `0x04` REMOTE_WRITE, or both; every other bit 0 |
//! | 4–7 | STag | the region's steering tag |
//! | 8–15 | tagged offset | where the window starts (soft-rdma's tagged offsets are byte offsets into the region) |
//! | 16–23 | length | the window's length in bytes; offset + length must not pass 2^64 |
//!
//! For example, 1 MiB at tagged offset 0 of STag `0x00000a17`, readable and writable:
//! `53 52 01 06 00 00 0a 17 00 00 00 00 00 00 00 00 00 00 00 00 00 10 00 00`.

use std::fmt;
use std::ops::{Bound, RangeBounds};

use crate::engine::verbs::{Access, RemoteBuffer, Stag};
use crate::error::{Error, NdStatus, Result};

/// A window of a peer's registered memory: where it starts ([`RemoteBuffer`]), how many bytes it holds, and
/// whether the peer may read it, write it or both. Parsed from the peer's bytes, it is checked: its access
/// bits are the two defined ones and the window does not wrap the tagged-offset space.
///
/// ```
/// use soft_rdma::client::{Access, BufferDescriptor, RemoteBuffer, Stag};
/// let d = BufferDescriptor::new(RemoteBuffer { stag: Stag(0xa17), offset: 0 }, 1 << 20, Access::REMOTE_WRITE)?;
/// let bytes = d.to_bytes(); // into private data or a Send
/// assert_eq!(BufferDescriptor::from_bytes(&bytes)?, d);
/// let second_half = d.slice(512 << 10..)?;
/// assert_eq!((second_half.remote().offset, second_half.len()), (512 << 10, 512 << 10));
/// assert!(d.slice(0..(2 << 20)).is_err(), "past the advertised end");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufferDescriptor {
    remote: RemoteBuffer,
    len: u64,
    access: Access,
}

/// Why bytes are not a [`BufferDescriptor`]: one variant per malformation, checked in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DescriptorError {
    #[error(
        "a buffer descriptor is {} bytes, these are {len}: cut short, or not a descriptor",
        BufferDescriptor::LEN
    )]
    Truncated { len: usize },
    #[error(
        "a buffer descriptor is {} bytes, these are {len}: pass only the descriptor's bytes",
        BufferDescriptor::LEN
    )]
    TooLong { len: usize },
    #[error("not a soft-rdma buffer descriptor: it starts {found:02x?}, not \"SR\" (53 52)")]
    Magic { found: [u8; 2] },
    #[error(
        "buffer descriptor version {found}; this library reads version {}: update the older side",
        BufferDescriptor::VERSION
    )]
    Version { found: u8 },
    #[error(
        "unknown access bits {bits:#04x}: a descriptor grants only REMOTE_READ (0x02) and REMOTE_WRITE (0x04)"
    )]
    Access { bits: u8 },
    #[error(
        "the window of {len} bytes at tagged offset {offset:#x} runs past the end of the 64-bit tagged offsets"
    )]
    Wraps { offset: u64, len: u64 },
}

impl From<DescriptorError> for Error {
    fn from(e: DescriptorError) -> Error {
        Error::new(NdStatus::InvalidParameter, e.to_string())
    }
}

impl BufferDescriptor {
    /// The layout's size in bytes.
    pub const LEN: usize = 24;
    /// Bytes 0–1 of the layout.
    pub const MAGIC: [u8; 2] = *b"SR";
    /// Byte 2 of the layout: the version this library writes and reads.
    pub const VERSION: u8 = 1;
    /// The access bits a descriptor may grant.
    pub const ACCESS: Access = Access::REMOTE_READ.union(Access::REMOTE_WRITE);

    /// `len` bytes from `remote`, which the peer may access as `access` says (REMOTE_READ, REMOTE_WRITE or
    /// both). Errors: other access bits, or a window that wraps the tagged offsets.
    pub fn new(remote: RemoteBuffer, len: u64, access: Access) -> std::result::Result<Self, DescriptorError> {
        if !Self::ACCESS.contains(access) {
            return Err(DescriptorError::Access { bits: access.0 });
        }
        if remote.offset.checked_add(len).is_none() {
            return Err(DescriptorError::Wraps {
                offset: remote.offset,
                len,
            });
        }
        Ok(BufferDescriptor { remote, len, access })
    }

    /// Where the window starts: for [`QueuePair::write`](super::QueuePair::write) and
    /// [`QueuePair::read`](super::QueuePair::read), which do not check the window's end
    /// (`descriptor.slice(range)?.remote()` checks the range first).
    pub fn remote(&self) -> RemoteBuffer {
        self.remote
    }

    /// The window's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What the owner lets the peer do: REMOTE_READ, REMOTE_WRITE or both.
    pub fn access(&self) -> Access {
        self.access
    }

    /// The 24-byte layout (module documentation).
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..2].copy_from_slice(&Self::MAGIC);
        b[2] = Self::VERSION;
        b[3] = self.access.0;
        b[4..8].copy_from_slice(&self.remote.stag.0.to_be_bytes());
        b[8..16].copy_from_slice(&self.remote.offset.to_be_bytes());
        b[16..24].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// Reads the 24-byte layout; exactly 24 bytes (a descriptor inside a longer message: pass its slice).
    pub fn from_bytes(bytes: &[u8]) -> std::result::Result<Self, DescriptorError> {
        let b: &[u8; Self::LEN] = match bytes.len() {
            n if n < Self::LEN => return Err(DescriptorError::Truncated { len: n }),
            n if n > Self::LEN => return Err(DescriptorError::TooLong { len: n }),
            _ => bytes.try_into().expect("the length was checked"),
        };
        let found = [b[0], b[1]];
        if found != Self::MAGIC {
            return Err(DescriptorError::Magic { found });
        }
        if b[2] != Self::VERSION {
            return Err(DescriptorError::Version { found: b[2] });
        }
        let word = |at: usize| u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        let stag = Stag(u32::from_be_bytes(b[4..8].try_into().expect("4 bytes")));
        Self::new(
            RemoteBuffer {
                stag,
                offset: word(8),
            },
            word(16),
            Access(b[3]),
        )
    }

    /// The bytes `range` of this window (relative to its start) as a window of their own, with the same
    /// access. ACCESS_VIOLATION when the range is not inside the window.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<BufferDescriptor> {
        let (start, end) =
            window(&range, self.len).ok_or_else(|| outside(&range, format_args!("the peer's {self}")))?;
        Ok(BufferDescriptor {
            remote: RemoteBuffer {
                stag: self.remote.stag,
                offset: self.remote.offset + start,
            },
            len: end - start,
            access: self.access,
        })
    }

    /// Where an `op` of `bytes` bytes that needs `need` goes in this window: its start, once checked that
    /// the bytes fit and that the owner granted `need` (ACCESS_VIOLATION otherwise).
    pub(super) fn target(&self, op: &str, bytes: u64, need: Access) -> Result<RemoteBuffer> {
        if !self.access.contains(need) {
            let right = if need == Access::REMOTE_READ {
                "REMOTE_READ"
            } else {
                "REMOTE_WRITE"
            };
            return Err(Error::new(
                NdStatus::AccessViolation,
                format!(
                    "the peer advertised {self} without {right}: it does not allow an {op} there; ask it \
                     to register the region with {right}"
                ),
            ));
        }
        if bytes > self.len {
            return Err(Error::new(
                NdStatus::AccessViolation,
                format!(
                    "an {op} of {bytes} bytes does not fit the peer's {self}: transfer at most {} bytes \
                     there, or ask the peer for a larger window",
                    self.len
                ),
            ));
        }
        Ok(self.remote)
    }
}

impl fmt::Display for BufferDescriptor {
    /// `1048576 bytes at STag 0x00000a17 offset 0x0 (read, write)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rights = match (
            self.access.contains(Access::REMOTE_READ),
            self.access.contains(Access::REMOTE_WRITE),
        ) {
            (true, true) => "read, write",
            (true, false) => "read",
            (false, true) => "write",
            (false, false) => "no access",
        };
        write!(
            f,
            "{} bytes at STag {:#010x} offset {:#x} ({rights})",
            self.len, self.remote.stag.0, self.remote.offset
        )
    }
}

/// `range` within `len` bytes as (start, end), or None when it is not inside them (or runs backwards).
pub(super) fn window(range: &impl RangeBounds<usize>, len: u64) -> Option<(u64, u64)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => u64::try_from(s).ok()?,
        Bound::Excluded(&s) => u64::try_from(s).ok()?.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => u64::try_from(e).ok()?.checked_add(1)?,
        Bound::Excluded(&e) => u64::try_from(e).ok()?,
        Bound::Unbounded => len,
    };
    (start <= end && end <= len).then_some((start, end))
}

/// ACCESS_VIOLATION: `range` is not inside `what`.
pub(super) fn outside(range: &impl RangeBounds<usize>, what: fmt::Arguments<'_>) -> Error {
    let bound = |b: Bound<&usize>, open: &str| match b {
        Bound::Included(v) => v.to_string(),
        Bound::Excluded(v) => format!("{open}{v}"),
        Bound::Unbounded => String::new(),
    };
    let end = match range.end_bound() {
        Bound::Included(v) => format!("={v}"),
        b => bound(b, ""),
    };
    Error::new(
        NdStatus::AccessViolation,
        format!(
            "bytes {}..{end} are not inside {what}",
            bound(range.start_bound(), ">")
        ),
    )
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn sample() -> BufferDescriptor {
        BufferDescriptor::new(
            RemoteBuffer {
                stag: Stag(0xa17),
                offset: 0,
            },
            1 << 20,
            Access::REMOTE_READ | Access::REMOTE_WRITE,
        )
        .unwrap()
    }

    #[test]
    fn the_layout_is_the_documented_one() {
        let bytes = sample().to_bytes();
        let documented = "53 52 01 06 00 00 0a 17 00 00 00 00 00 00 00 00 00 00 00 00 00 10 00 00";
        let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex.join(" "), documented);
        assert_eq!(
            sample().to_string(),
            "1048576 bytes at STag 0x00000a17 offset 0x0 (read, write)"
        );
    }

    #[test]
    fn each_malformation_is_its_own_error() {
        let good = sample().to_bytes();
        let with = |at: usize, v: u8| {
            let mut b = good;
            b[at] = v;
            b
        };
        assert_eq!(
            BufferDescriptor::from_bytes(&good[..23]),
            Err(DescriptorError::Truncated { len: 23 })
        );
        assert_eq!(
            BufferDescriptor::from_bytes(&[good.as_slice(), &[0]].concat()),
            Err(DescriptorError::TooLong { len: 25 })
        );
        assert_eq!(
            BufferDescriptor::from_bytes(&with(1, b'X')),
            Err(DescriptorError::Magic { found: *b"SX" })
        );
        assert_eq!(
            BufferDescriptor::from_bytes(&with(2, 2)),
            Err(DescriptorError::Version { found: 2 })
        );
        assert_eq!(
            BufferDescriptor::from_bytes(&with(3, 0x07)),
            Err(DescriptorError::Access { bits: 0x07 })
        );
        let mut wraps = with(8, 0xff);
        wraps[9..16].fill(0xff);
        assert_eq!(
            BufferDescriptor::from_bytes(&wraps),
            Err(DescriptorError::Wraps {
                offset: u64::MAX,
                len: 1 << 20
            })
        );
        let e = Error::from(DescriptorError::Version { found: 2 });
        assert_eq!(e.status, NdStatus::InvalidParameter);
        assert!(e.context.contains("update the older side"), "{e}");
    }

    #[test]
    fn slices_stay_inside_the_window() {
        let d = sample().slice(4096..).unwrap();
        assert_eq!((d.remote().offset, d.len()), (4096, (1 << 20) - 4096));
        let d = d.slice(..=9).unwrap();
        assert_eq!(
            (d.remote().offset, d.len(), d.access()),
            (4096, 10, sample().access())
        );
        assert!(d.slice(10..10).unwrap().is_empty());
        for bad in [d.slice(0..11), d.slice(11..), d.slice(..=10)] {
            let e = bad.unwrap_err();
            assert_eq!(e.status, NdStatus::AccessViolation);
            assert!(
                e.context.contains("not inside the peer's 10 bytes at STag"),
                "{e}"
            );
        }
        #[allow(clippy::reversed_empty_ranges)]
        let backwards = d.slice(5..4).unwrap_err();
        assert!(
            backwards.context.starts_with("bytes 5..4 are not inside"),
            "{backwards}"
        );
    }

    #[test]
    fn a_transfer_must_fit_and_be_granted() {
        let read_only = BufferDescriptor::new(sample().remote(), 100, Access::REMOTE_READ).unwrap();
        assert_eq!(
            read_only.target("RDMA Read", 100, Access::REMOTE_READ),
            Ok(sample().remote())
        );
        let e = read_only
            .target("RDMA Write", 1, Access::REMOTE_WRITE)
            .unwrap_err();
        assert_eq!(e.status, NdStatus::AccessViolation);
        assert!(e.context.contains("without REMOTE_WRITE"), "{e}");
        let e = read_only
            .target("RDMA Read", 101, Access::REMOTE_READ)
            .unwrap_err();
        assert!(e.context.contains("101 bytes does not fit"), "{e}");
        assert_eq!(
            BufferDescriptor::new(sample().remote(), 1, Access::LOCAL_WRITE),
            Err(DescriptorError::Access { bits: 1 })
        );
    }

    /// What `from_bytes` must answer for `b`, decided field by field from the documented layout.
    fn expected(b: &[u8]) -> std::result::Result<BufferDescriptor, DescriptorError> {
        if b.len() != BufferDescriptor::LEN {
            return Err(if b.len() < BufferDescriptor::LEN {
                DescriptorError::Truncated { len: b.len() }
            } else {
                DescriptorError::TooLong { len: b.len() }
            });
        }
        if b[..2] != *b"SR" {
            return Err(DescriptorError::Magic { found: [b[0], b[1]] });
        }
        if b[2] != 1 {
            return Err(DescriptorError::Version { found: b[2] });
        }
        if b[3] & !0x06 != 0 {
            return Err(DescriptorError::Access { bits: b[3] });
        }
        let offset = u64::from_be_bytes(b[8..16].try_into().unwrap());
        let len = u64::from_be_bytes(b[16..24].try_into().unwrap());
        if offset.checked_add(len).is_none() {
            return Err(DescriptorError::Wraps { offset, len });
        }
        Ok(BufferDescriptor {
            remote: RemoteBuffer {
                stag: Stag(u32::from_be_bytes(b[4..8].try_into().unwrap())),
                offset,
            },
            len,
            access: Access(b[3]),
        })
    }

    /// Bytes that are often a descriptor, or one byte off being one.
    fn near_descriptor() -> impl Strategy<Value = Vec<u8>> {
        (
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            0u8..8,
            proptest::option::of((0usize..24, any::<u8>())),
        )
            .prop_map(|(stag, offset, len, access, flip)| {
                let mut b = vec![0x53, 0x52, 1, access & 0x06];
                b.extend_from_slice(&stag.to_be_bytes());
                b.extend_from_slice(&offset.to_be_bytes());
                b.extend_from_slice(&(len % offset.wrapping_neg().max(1)).to_be_bytes());
                if let Some((at, v)) = flip {
                    b[at] = v;
                }
                b
            })
    }

    proptest! {
        #[test]
        fn descriptors_round_trip(stag in any::<u32>(), offset in any::<u64>(), len in any::<u64>(), access in 0u8..4) {
            let len = len.min(u64::MAX - offset);
            let d = BufferDescriptor::new(RemoteBuffer { stag: Stag(stag), offset }, len, Access(access << 1)).unwrap();
            let bytes = d.to_bytes();
            prop_assert_eq!(BufferDescriptor::from_bytes(&bytes), Ok(d));
            prop_assert_eq!(expected(&bytes), Ok(d));
            // Every truncation is Truncated, every extension TooLong.
            for n in 0..BufferDescriptor::LEN {
                prop_assert_eq!(BufferDescriptor::from_bytes(&bytes[..n]), Err(DescriptorError::Truncated { len: n }));
            }
            let longer = [bytes.as_slice(), &[0]].concat();
            prop_assert_eq!(BufferDescriptor::from_bytes(&longer), Err(DescriptorError::TooLong { len: 25 }));
        }

        #[test]
        fn any_bytes_parse_as_the_layout_says(b in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..40),
            near_descriptor(),
        ]) {
            let got = BufferDescriptor::from_bytes(&b);
            prop_assert_eq!(got, expected(&b));
            if let Ok(d) = got {
                prop_assert_eq!(d.to_bytes().to_vec(), b);
            }
        }

        #[test]
        fn slices_never_leave_the_window(len in 0u64..1 << 40, a in any::<usize>(), b in any::<usize>()) {
            let d = BufferDescriptor::new(sample().remote(), len, BufferDescriptor::ACCESS).unwrap();
            match d.slice(a..b) {
                Ok(s) => {
                    prop_assert!(a <= b && (b as u64) <= len);
                    prop_assert_eq!((s.remote().offset, s.len()), (a as u64, (b - a) as u64));
                }
                Err(e) => {
                    prop_assert!(a > b || (b as u64) > len);
                    prop_assert_eq!(e.status, NdStatus::AccessViolation);
                }
            }
        }
    }
}
