//! Why the own TCP did not take a segment the XDP program steered to it: the checksum check
//! ([`check_checksum`], with the interface's [`PartialChecksums`] policy), the count of every drop by
//! reason ([`DropCounts`], shown by `soft-rdma status` and the metrics under the names of
//! [`TCP_DROPS`]), and the
//! rate-limited warning that names a drop's cause and its fix the first times it happens.
//!
//! Segments the table itself finds outside the window are counted there (`TcpCounters::
//! unacceptable_segments`, RFC 9293 §3.10.7.4) and reported beside these as `out_of_window`.

use std::net::IpAddr;

use tracing::info;

use crate::transport::status::{TCP_DROPS, TCP_PARTIAL_ACCEPTED};
use crate::transport::xdp::iface_kind::PartialChecksums;

/// Why a steered segment was dropped before (or by) the connection table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::transport::xdp) enum DropReason {
    /// The TCP checksum does not verify, and the field is not a partial checksum either (RFC 9293 §3.1).
    BadChecksum,
    /// The checksum field holds only the pseudo-header sum (the peer offloads TX checksums) and the
    /// interface is one whose frames must be verified ([`PartialChecksums::Refuse`]).
    PartialChecksum,
    /// The TCP header does not parse (data offset, options).
    Malformed,
    /// No connection or listener took it (answered with a reset where RFC 9293 §3.10.7.1 says so).
    NoConnection,
}

impl DropReason {
    pub(in crate::transport::xdp) const ALL: [DropReason; 4] = [
        DropReason::BadChecksum,
        DropReason::PartialChecksum,
        DropReason::Malformed,
        DropReason::NoConnection,
    ];

    /// Its `status` counter (`tcp_dropped_<reason>`): from [`TCP_DROPS`], in [`DropReason::ALL`]'s order.
    fn counter_name(self) -> &'static str {
        TCP_DROPS[self as usize].1
    }
}

/// The `status` counter of segments the table dropped as outside the window (or failing PAWS): the last of
/// [`TCP_DROPS`], after [`DropReason::ALL`]'s.
pub(in crate::transport::xdp) const OUT_OF_WINDOW: &str = TCP_DROPS[DropReason::ALL.len()].1;

/// What the checksum check found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Checksum {
    /// The checksum verifies.
    Valid,
    /// A partial checksum, accepted on this link.
    PartialAccepted,
    /// Dropped, for this reason.
    Dropped(DropReason),
}

/// Checks `segment`'s TCP checksum (the pseudo-header of `src` → `dst`, 4 or 16 address bytes each):
/// valid; or, with the field holding exactly the pseudo-header sum (what an offloading sender leaves
/// there: Linux `__tcp_v4_send_check` / `__tcp_v6_send_check`, the folded sum not complemented), accepted
/// or refused as `policy` says; else bad. The partial test runs only after the full sum failed.
pub(super) fn check_checksum(policy: PartialChecksums, src: &[u8], dst: &[u8], segment: &[u8]) -> Checksum {
    // Shorter than a TCP header (the caller parses frames that are not): no checksum field to read.
    let Some(&[hi, lo]) = segment.get(16..18) else {
        return Checksum::Dropped(DropReason::Malformed);
    };
    if crate::tcp::wire::checksum(src, dst, segment) == 0 {
        return Checksum::Valid;
    }
    let field = u16::from_be_bytes([hi, lo]);
    let partial = crate::tcp::wire::pseudo_header_sum(src, dst, segment.len());
    // One's complement has two zeros (RFC 1071 §1): 0x0000 and 0xffff are the same sum.
    let same = field == partial || (field | partial == 0xffff && (field == 0 || partial == 0));
    match (same, policy) {
        (true, PartialChecksums::Accept) => Checksum::PartialAccepted,
        (true, PartialChecksums::Refuse) => Checksum::Dropped(DropReason::PartialChecksum),
        (false, _) => Checksum::Dropped(DropReason::BadChecksum),
    }
}

/// Every drop since start by [`DropReason`], and the partial checksums accepted.
#[derive(Clone, Debug, Default)]
pub(super) struct DropCounts {
    dropped: [u64; DropReason::ALL.len()],
    partial_accepted: u64,
}

impl DropCounts {
    /// A segment from `remote` dropped for `reason` on interface `iface`: counted, and the first times (per
    /// reason, rate-limited) a warning naming the cause and the fix.
    pub(super) fn drop(&mut self, reason: DropReason, remote: IpAddr, iface: &str) {
        self.dropped[reason as usize] += 1;
        let count = self.dropped[reason as usize];
        match reason {
            DropReason::PartialChecksum => crate::warn_limited!(
                peer = %remote,
                interface = iface,
                dropped = count,
                "segments from {remote} carry partial checksums (only the pseudo-header sum): the peer offloads \
                 TX checksums, and {iface} is not a link whose frames can be trusted unverified (only veth, \
                 tun/tap and bridge are). Dropped. Fix: on the peer, `ethtool -K <its interface> tx off`; or \
                 run soft-rdmad with --xdp on the veth, tap or bridge the peer's frames arrive on \
                 (docs/xdp-mode.md, \"Peers that offload TX checksums\")"
            ),
            DropReason::BadChecksum => crate::warn_limited!(
                peer = %remote,
                interface = iface,
                dropped = count,
                "segments from {remote} fail the TCP checksum: corrupted between the peer and {iface}. Dropped; \
                 the peer resends them. If it keeps happening, check the link (cable, NIC, `ethtool -S {iface}` \
                 errors), or a middlebox rewriting segments"
            ),
            DropReason::Malformed => crate::warn_limited!(
                peer = %remote,
                interface = iface,
                dropped = count,
                "a segment from {remote} has a malformed TCP header (data offset or options): dropped"
            ),
            // Part of TCP's normal life (segments after a close, a reset peer's retransmissions): counted,
            // answered with a reset where RFC 9293 §3.10.7.1 says so (the caller logs that at debug), and
            // not worth a warning.
            DropReason::NoConnection => {}
        }
    }

    /// A segment from `remote` taken with a partial checksum: counted, said once at `info`.
    pub(super) fn partial_accepted(&mut self, remote: IpAddr, iface: &str) {
        self.partial_accepted += 1;
        if self.partial_accepted == 1 {
            info!(
                peer = %remote,
                interface = iface,
                "segments from {remote} carry partial checksums (the peer offloads TX checksums): accepted, as \
                 the kernel accepts them, since {iface} carries frames from this host's memory \
                 (docs/xdp-mode.md, \"Peers that offload TX checksums\")"
            );
        }
    }

    /// The counts by `status` name: each [`DropReason`]'s, then the partial checksums accepted.
    pub(super) fn counters(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        DropReason::ALL
            .into_iter()
            .map(|r| (r.counter_name(), self.dropped[r as usize]))
            .chain([(TCP_PARTIAL_ACCEPTED, self.partial_accepted)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::wire::pseudo_header_sum;
    use proptest::prelude::*;

    const SRC: [u8; 4] = [10, 99, 0, 2];
    const DST: [u8; 4] = [10, 99, 0, 1];

    /// A 20-byte header and `payload`, its checksum field set to `check`.
    fn segment(payload: &[u8], check: u16) -> Vec<u8> {
        let mut s = vec![0u8; 20];
        s[0..2].copy_from_slice(&40000u16.to_be_bytes());
        s[2..4].copy_from_slice(&7174u16.to_be_bytes());
        s[12] = 5 << 4;
        s[13] = 0x18;
        s.extend_from_slice(payload);
        s[16..18].copy_from_slice(&check.to_be_bytes());
        s
    }

    /// What an offloading Linux sender leaves in the field, computed independently of
    /// `pseudo_header_sum`: `~tcp_v4_check(len, saddr, daddr, 0)`, i.e. the complement of the checksum of
    /// the pseudo-header over `len` zero bytes.
    fn kernel_partial(src: &[u8], dst: &[u8], len: usize) -> u16 {
        !crate::tcp::wire::checksum(src, dst, &vec![0u8; len])
    }

    #[test]
    fn a_valid_checksum_is_valid_on_every_link() {
        let mut s = segment(b"hello", 0);
        let c = crate::tcp::wire::checksum(&SRC, &DST, &s);
        s[16..18].copy_from_slice(&c.to_be_bytes());
        for p in [PartialChecksums::Accept, PartialChecksums::Refuse] {
            assert_eq!(check_checksum(p, &SRC, &DST, &s), Checksum::Valid);
        }
    }

    #[test]
    fn a_partial_checksum_is_accepted_or_refused_by_the_link() {
        let mut s = segment(b"some payload", 0);
        let p = kernel_partial(&SRC, &DST, s.len());
        assert_eq!(p, pseudo_header_sum(&SRC, &DST, s.len()));
        s[16..18].copy_from_slice(&p.to_be_bytes());
        assert_eq!(
            check_checksum(PartialChecksums::Accept, &SRC, &DST, &s),
            Checksum::PartialAccepted
        );
        assert_eq!(
            check_checksum(PartialChecksums::Refuse, &SRC, &DST, &s),
            Checksum::Dropped(DropReason::PartialChecksum)
        );
        // One bit off: bad everywhere.
        s[16] ^= 0x01;
        for p in [PartialChecksums::Accept, PartialChecksums::Refuse] {
            assert_eq!(
                check_checksum(p, &SRC, &DST, &s),
                Checksum::Dropped(DropReason::BadChecksum)
            );
        }
    }

    #[test]
    fn ipv6_pseudo_header_sums_the_same_way() {
        let src: [u8; 16] = [0xfd, 0, 0x53, 0x52, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
        let dst: [u8; 16] = [0xfd, 0, 0x53, 0x52, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        let mut s = segment(&[7u8; 33], 0);
        let sum = pseudo_header_sum(&src, &dst, s.len());
        s[16..18].copy_from_slice(&sum.to_be_bytes());
        assert_eq!(
            check_checksum(PartialChecksums::Accept, &src, &dst, &s),
            Checksum::PartialAccepted
        );
    }

    #[test]
    fn a_segment_too_short_for_the_field_is_malformed_not_a_panic() {
        for len in 0..18 {
            assert_eq!(
                check_checksum(PartialChecksums::Accept, &SRC, &DST, &vec![0u8; len]),
                Checksum::Dropped(DropReason::Malformed)
            );
        }
    }

    #[test]
    fn every_reason_names_its_own_label_and_status_counter() {
        // `counter_name` indexes TCP_DROPS by the reason's position in ALL: the two orders must agree.
        for (i, r) in DropReason::ALL.into_iter().enumerate() {
            assert_eq!(r as usize, i);
        }
        assert_eq!(TCP_DROPS[DropReason::PartialChecksum as usize].0, "partial_checksum");
        assert_eq!(DropReason::PartialChecksum.counter_name(), "tcp_dropped_partial_checksum");
        assert_eq!(TCP_DROPS[DropReason::NoConnection as usize].0, "no_connection");
        assert_eq!(DropReason::NoConnection.counter_name(), "tcp_dropped_no_connection");
        assert_eq!(OUT_OF_WINDOW, "tcp_dropped_out_of_window");
    }

    #[test]
    fn drops_are_counted_by_reason() {
        let mut d = DropCounts::default();
        let peer: IpAddr = "10.99.0.2".parse().unwrap();
        d.drop(DropReason::PartialChecksum, peer, "eth0");
        d.drop(DropReason::PartialChecksum, peer, "eth0");
        d.drop(DropReason::NoConnection, peer, "eth0");
        d.partial_accepted(peer, "eth0");
        let c: Vec<_> = d.counters().collect();
        assert_eq!(
            c,
            [
                ("tcp_dropped_bad_checksum", 0),
                ("tcp_dropped_partial_checksum", 2),
                ("tcp_dropped_malformed", 0),
                ("tcp_dropped_no_connection", 1),
                ("tcp_partial_checksums_accepted", 1),
            ]
        );
    }

    proptest! {
        /// Any payload: the field the sender's offload starts from is partial (accepted or refused by the
        /// link) unless the whole segment happens to verify with it; the full checksum is valid; and a field
        /// that is neither is bad. Never a panic, whatever the field.
        #[test]
        fn checksum_classification(
            payload in proptest::collection::vec(any::<u8>(), 0..300),
            other in any::<u16>(),
            v6 in any::<bool>(),
        ) {
            let (src, dst): (&[u8], &[u8]) = if v6 {
                (&[0xfd, 0, 0x53, 0x52, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
                 &[0xfd, 0, 0x53, 0x52, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1])
            } else {
                (&SRC, &DST)
            };
            let mut s = segment(&payload, 0);
            let full = crate::tcp::wire::checksum(src, dst, &s);
            let partial = kernel_partial(src, dst, s.len());
            s[16..18].copy_from_slice(&partial.to_be_bytes());
            let verifies = crate::tcp::wire::checksum(src, dst, &s) == 0;
            for (policy, taken) in [
                (PartialChecksums::Accept, Checksum::PartialAccepted),
                (PartialChecksums::Refuse, Checksum::Dropped(DropReason::PartialChecksum)),
            ] {
                let expected = if verifies { Checksum::Valid } else { taken };
                prop_assert_eq!(check_checksum(policy, src, dst, &s), expected);
            }
            s[16..18].copy_from_slice(&full.to_be_bytes());
            prop_assert_eq!(check_checksum(PartialChecksums::Refuse, src, dst, &s), Checksum::Valid);
            s[16..18].copy_from_slice(&other.to_be_bytes());
            let same = |a: u16, b: u16| a == b || (a | b == 0xffff && (a == 0 || b == 0));
            if !same(other, full) && !same(other, partial) {
                prop_assert_eq!(
                    check_checksum(PartialChecksums::Accept, src, dst, &s),
                    Checksum::Dropped(DropReason::BadChecksum)
                );
            }
        }
    }
}
