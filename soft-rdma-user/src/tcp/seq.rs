//! TCP sequence numbers: 32-bit values compared modulo 2^32 (RFC 9293 §3.4, "Sequence Numbers").

use std::cmp::Ordering;
use std::ops::{Add, Sub};

/// A sequence (or acknowledgment) number. Ordering is the RFC 9293 §3.4 modular comparison: `a < b` when
/// `b - a` taken modulo 2^32 lies in (0, 2^31). Only meaningful for numbers less than 2^31 apart, which
/// any window guarantees.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Seq(pub u32);

impl Seq {
    /// The signed distance `self - earlier` (RFC 9293 §3.4 arithmetic modulo 2^32).
    pub fn since(self, earlier: Seq) -> i32 {
        self.0.wrapping_sub(earlier.0) as i32
    }

    /// The distance `self - earlier` for `earlier <= self`, or 0 when `earlier` is ahead.
    pub fn bytes_since(self, earlier: Seq) -> u32 {
        self.since(earlier).max(0) as u32
    }

    pub fn max(self, other: Seq) -> Seq {
        if self >= other { self } else { other }
    }

    pub fn min(self, other: Seq) -> Seq {
        if self <= other { self } else { other }
    }
}

impl std::fmt::Debug for Seq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl PartialOrd for Seq {
    fn partial_cmp(&self, other: &Seq) -> Option<Ordering> {
        Some(self.since(*other).cmp(&0))
    }
}

impl Add<u32> for Seq {
    type Output = Seq;
    fn add(self, n: u32) -> Seq {
        Seq(self.0.wrapping_add(n))
    }
}

impl Sub<u32> for Seq {
    type Output = Seq;
    fn sub(self, n: u32) -> Seq {
        Seq(self.0.wrapping_sub(n))
    }
}

#[cfg(test)]
mod tests {
    use super::Seq;

    #[test]
    fn comparison_wraps_around_2_pow_32() {
        let a = Seq(u32::MAX - 10);
        let b = a + 20;
        assert_eq!(b.0, 9);
        assert!(a < b);
        assert!(b > a);
        assert_eq!(b.since(a), 20);
        assert_eq!(a.since(b), -20);
        assert_eq!(a.bytes_since(b), 0);
        assert_eq!(b.max(a), b);
        assert_eq!(b.min(a), a);
    }
}
