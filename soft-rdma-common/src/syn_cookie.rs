//! SYN cookies (RFC 4987 §3.6) for the listeners of soft-rdma's own TCP in XDP mode: the one rule both
//! ends of the scheme share, the XDP program that answers a SYN and the daemon that checks the ACK.
//!
//! The XDP program answers a SYN for a listening endpoint itself (IPv4 or IPv6), with a SYN-ACK (`XDP_TX`) whose
//! initial sequence number and timestamp value (RFC 7323 §3) hold everything the connection needs later;
//! the daemon keeps no state and is not woken until the handshake's ACK. The ACK echoes both: its
//! `SEG.ACK - 1` is our ISN, its TSecr is our TSval (which is why only SYNs with the timestamp option are
//! answered this way: the others go to the daemon as before).
//!
//! - **ISN** (32 bits): bits 31..6 are the top of a keyed hash, bits 5..0 the time counter `tick` (a
//!   period of [`TICK_PERIOD_SECS`], advanced by the daemon, which writes it into the program's
//!   configuration, so the daemon's counter is never behind the program's).
//! - **TSval** (32 bits): bits 31..10 the peer's SYN options ([`PeerSynOptions::pack`]: its MSS, window
//!   scale, SACK-permitted), bits 9..0 the bottom of the same hash.
//! - **The hash**: SipHash-1-3 keyed with a secret the daemon draws at start, over the 4-tuple, the peer's
//!   ISN, the counter and the packed options; an ACK is accepted when both parts match (36 bits) and the
//!   counter is at most [`MAX_AGE_TICKS`] old (a cookie lives 64 to 128 s). Forged options fail the hash.
//!
//! The connection's later TSvals continue from the echoed one (the daemon sets its timestamp offset so),
//! so the peer's PAWS check (RFC 7323 §5) never sees our clock go back.

/// Seconds per `tick` of the cookie's time counter.
pub const TICK_PERIOD_SECS: u64 = 64;
/// The counter's bits in the ISN.
pub const TICK_MASK: u32 = 0x3f;
/// How many periods old a cookie may be: the current period's and the one before are accepted.
pub const MAX_AGE_TICKS: u32 = 1;
/// The hash bits in the TSval.
const TSVAL_HASH_MASK: u32 = 0x3ff;
/// RFC 7323 §2.3: a shift above 14 is used as 14.
pub const MAX_WINDOW_SCALE: u8 = 14;

/// The SipHash key (128 bits).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SynCookieKey {
    pub k0: u64,
    pub k1: u64,
}

impl SynCookieKey {
    /// The key as four 32-bit words (the program's configuration map holds `u32`s).
    pub fn to_words(self) -> [u32; 4] {
        [
            self.k0 as u32,
            (self.k0 >> 32) as u32,
            self.k1 as u32,
            (self.k1 >> 32) as u32,
        ]
    }

    pub fn from_words(w: [u32; 4]) -> SynCookieKey {
        SynCookieKey {
            k0: u64::from(w[0]) | (u64::from(w[1]) << 32),
            k1: u64::from(w[2]) | (u64::from(w[3]) << 32),
        }
    }
}

/// The options of the peer's SYN that the connection needs (RFC 9293 §3.7.1, RFC 7323 §2, RFC 2018).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerSynOptions {
    /// The peer's MSS option (536 when it sent none, RFC 9293 §3.7.1).
    pub mss: u16,
    /// The peer's window-scale shift, if it offered scaling (at most 14).
    pub window_scale: Option<u8>,
    pub sack_permitted: bool,
}

impl PeerSynOptions {
    /// 22 bits: the MSS (bits 21..6), window scale offered (bit 5), SACK-permitted (bit 4), the shift
    /// (bits 3..0).
    pub fn pack(self) -> u32 {
        let (offered, shift) = match self.window_scale {
            Some(s) => (
                1,
                u32::from(if s > MAX_WINDOW_SCALE { MAX_WINDOW_SCALE } else { s }),
            ),
            None => (0, 0),
        };
        (u32::from(self.mss) << 6) | (offered << 5) | ((self.sack_permitted as u32) << 4) | shift
    }

    /// `None` for bits [`Self::pack`] cannot have made.
    pub fn unpack(bits: u32) -> Option<PeerSynOptions> {
        let shift = (bits & 0xf) as u8;
        let offered = bits & 0x20 != 0;
        if bits >> 22 != 0 || shift > MAX_WINDOW_SCALE || (!offered && shift != 0) {
            return None;
        }
        Some(PeerSynOptions {
            mss: (bits >> 6) as u16,
            window_scale: offered.then_some(shift),
            sack_permitted: bits & 0x10 != 0,
        })
    }
}

/// A connection's addresses: the client sent the SYN, the server listens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flow {
    pub addrs: FlowAddrs,
    pub client_port: u16,
    pub server_port: u16,
}

/// The two addresses of a [`Flow`], as big-endian numbers (an IPv6 address as two halves: the XDP program
/// has no 128-bit arithmetic).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlowAddrs {
    V4 { client: u32, server: u32 },
    V6 { client: [u64; 2], server: [u64; 2] },
}

impl FlowAddrs {
    /// IPv6 addresses from their 16 bytes.
    pub fn v6(client: [u8; 16], server: [u8; 16]) -> FlowAddrs {
        let halves = |a: [u8; 16]| {
            let mut h = [0u64; 2];
            let mut i = 0;
            while i < 16 {
                h[i / 8] = (h[i / 8] << 8) | u64::from(a[i]);
                i += 1;
            }
            h
        };
        FlowAddrs::V6 {
            client: halves(client),
            server: halves(server),
        }
    }
}

#[inline(always)]
fn sip_round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13);
    v[1] ^= v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16);
    v[3] ^= v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21);
    v[3] ^= v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17);
    v[1] ^= v[2];
    v[2] = v[2].rotate_left(32);
}

/// SipHash-1-3 of `N` little-endian 64-bit words (an `8·N`-byte message). Written out rather than taken
/// from a hashing crate because the XDP program needs it straight-line (no slices, no loops over bytes,
/// for the verifier); the tests check it against the `siphasher` crate.
#[inline(always)]
pub fn siphash13<const N: usize>(key: SynCookieKey, m: [u64; N]) -> u64 {
    let mut v = [
        key.k0 ^ 0x736f_6d65_7073_6575,
        key.k1 ^ 0x646f_7261_6e64_6f6d,
        key.k0 ^ 0x6c79_6765_6e65_7261,
        key.k1 ^ 0x7465_6462_7974_6573,
    ];
    for w in m {
        v[3] ^= w;
        sip_round(&mut v);
        v[0] ^= w;
    }
    let last = ((N as u64 * 8) & 0xff) << 56;
    v[3] ^= last;
    sip_round(&mut v);
    v[0] ^= last;
    v[2] ^= 0xff;
    sip_round(&mut v);
    sip_round(&mut v);
    sip_round(&mut v);
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

#[inline(always)]
fn cookie_hash(key: SynCookieKey, flow: Flow, client_isn: u32, tick: u32, packed: u32) -> u64 {
    let ports_isn =
        (u64::from(flow.client_port) << 48) | (u64::from(flow.server_port) << 32) | u64::from(client_isn);
    let options_tick = (u64::from(packed) << 8) | u64::from(tick & TICK_MASK);
    match flow.addrs {
        FlowAddrs::V4 { client, server } => siphash13(
            key,
            [
                (u64::from(client) << 32) | u64::from(server),
                ports_isn,
                options_tick,
            ],
        ),
        FlowAddrs::V6 { client, server } => siphash13(
            key,
            [
                client[0],
                client[1],
                server[0],
                server[1],
                ports_isn,
                options_tick,
            ],
        ),
    }
}

/// The SYN-ACK's ISN and TSval for the peer's SYN (its ISN `client_isn`, its options `opts`).
#[inline(always)]
pub fn generate(
    key: SynCookieKey,
    tick: u32,
    flow: Flow,
    client_isn: u32,
    opts: PeerSynOptions,
) -> (u32, u32) {
    let packed = opts.pack();
    let h = cookie_hash(key, flow, client_isn, tick, packed);
    let isn = ((h >> 32) as u32 & !TICK_MASK) | (tick & TICK_MASK);
    let tsval = (packed << 10) | (h as u32 & TSVAL_HASH_MASK);
    (isn, tsval)
}

/// Checks the handshake's ACK (`seq`, `ack`, its timestamp echo `tsecr`) against the cookie it must echo,
/// with the daemon's counter at `tick_now`. Returns the peer's SYN options if it is ours and fresh.
pub fn check(
    key: SynCookieKey,
    tick_now: u32,
    flow: Flow,
    seq: u32,
    ack: u32,
    tsecr: u32,
) -> Option<PeerSynOptions> {
    let client_isn = seq.wrapping_sub(1);
    let isn = ack.wrapping_sub(1);
    let tick = isn & TICK_MASK;
    if tick_now.wrapping_sub(tick) & TICK_MASK > MAX_AGE_TICKS {
        return None;
    }
    let opts = PeerSynOptions::unpack(tsecr >> 10)?;
    let (want_isn, want_tsval) = generate(key, tick, flow, client_isn, opts);
    (want_isn == isn && want_tsval == tsecr).then_some(opts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::hash::Hasher;
    use proptest::prelude::*;

    const KEY: SynCookieKey = SynCookieKey {
        k0: 0x0706_0504_0302_0100,
        k1: 0x0f0e_0d0c_0b0a_0908,
    };
    const FLOW: Flow = Flow {
        addrs: FlowAddrs::V4 {
            client: 0x0a00_0001,
            server: 0x0a00_0002,
        },
        client_port: 40_000,
        server_port: 50_000,
    };
    const OPTS: PeerSynOptions = PeerSynOptions {
        mss: 1460,
        window_scale: Some(7),
        sack_permitted: true,
    };

    proptest! {
        #[test]
        fn siphash13_is_the_siphasher_crates(k0: u64, k1: u64, m: [u64; 6]) {
            let reference = |words: &[u64]| {
                let mut h = siphasher::sip::SipHasher13::new_with_keys(k0, k1);
                for w in words {
                    h.write(&w.to_le_bytes());
                }
                h.finish()
            };
            let key = SynCookieKey { k0, k1 };
            prop_assert_eq!(siphash13(key, [m[0], m[1], m[2]]), reference(&m[..3]));
            prop_assert_eq!(siphash13(key, m), reference(&m));
        }

        #[test]
        fn an_ipv6_cookie_checks_out_for_its_own_flow_only(isn: u32, client: [u8; 16], server: [u8; 16], flip in 0usize..16) {
            let flow = Flow { addrs: FlowAddrs::v6(client, server), ..FLOW };
            let (cookie, tsval) = generate(KEY, 9, flow, isn, OPTS);
            let (seq, ack) = (isn.wrapping_add(1), cookie.wrapping_add(1));
            prop_assert_eq!(check(KEY, 9, flow, seq, ack, tsval), Some(OPTS));
            let mut other = client;
            other[flip] ^= 1;
            let moved = Flow { addrs: FlowAddrs::v6(other, server), ..FLOW };
            prop_assert_eq!(check(KEY, 9, moved, seq, ack, tsval), None);
        }

        #[test]
        fn options_pack_and_unpack(mss: u16, ws in proptest::option::of(0u8..=14), sack: bool) {
            let o = PeerSynOptions { mss, window_scale: ws, sack_permitted: sack };
            prop_assert_eq!(PeerSynOptions::unpack(o.pack()), Some(o));
        }

        #[test]
        fn a_cookie_checks_out_for_its_own_flow_only(isn: u32, tick in 0u32..64, port_delta in 1u16..) {
            let (cookie, tsval) = generate(KEY, tick, FLOW, isn, OPTS);
            let (seq, ack) = (isn.wrapping_add(1), cookie.wrapping_add(1));
            prop_assert_eq!(check(KEY, tick, FLOW, seq, ack, tsval), Some(OPTS));
            let other = Flow { client_port: FLOW.client_port.wrapping_add(port_delta), ..FLOW };
            prop_assert_eq!(check(KEY, tick, other, seq, ack, tsval), None);
            prop_assert_eq!(check(KEY, tick, FLOW, seq.wrapping_add(1), ack, tsval), None);
        }

        #[test]
        fn random_acks_do_not_pass(seq: u32, ack: u32, tsecr: u32, tick in 0u32..64) {
            // 36 bits must match: a random ACK passing would be a 1-in-69-billion event.
            prop_assert_eq!(check(KEY, tick, FLOW, seq, ack, tsecr), None);
        }
    }

    #[test]
    fn a_cookie_lives_its_period_and_the_next() {
        let (cookie, tsval) = generate(KEY, 63, FLOW, 1000, OPTS);
        let ok = |now| check(KEY, now, FLOW, 1001, cookie.wrapping_add(1), tsval).is_some();
        assert!(ok(63));
        assert!(ok(0), "the counter wraps");
        assert!(!ok(1));
        assert!(!ok(62), "a counter from the future");
    }

    #[test]
    fn forged_options_fail_the_hash() {
        let (cookie, tsval) = generate(KEY, 5, FLOW, 1000, OPTS);
        let bigger_mss = PeerSynOptions { mss: 9000, ..OPTS }.pack();
        let forged = (bigger_mss << 10) | (tsval & TSVAL_HASH_MASK);
        assert_eq!(check(KEY, 5, FLOW, 1001, cookie.wrapping_add(1), forged), None);
        let other_key = SynCookieKey { k0: 1, ..KEY };
        assert_eq!(
            check(other_key, 5, FLOW, 1001, cookie.wrapping_add(1), tsval),
            None
        );
    }

    #[test]
    fn options_that_pack_cannot_make_are_refused() {
        assert_eq!(PeerSynOptions::unpack(0x0f), None, "a shift without the offer");
        assert_eq!(PeerSynOptions::unpack(0x20 | 15), None, "a shift above 14");
        assert_eq!(PeerSynOptions::unpack(1 << 22), None);
        let big = PeerSynOptions {
            window_scale: Some(20),
            ..OPTS
        };
        assert_eq!(PeerSynOptions::unpack(big.pack()).unwrap().window_scale, Some(14));
    }

    #[test]
    fn ipv6_halves_are_big_endian() {
        let mut a = [0u8; 16];
        a[7] = 1;
        a[15] = 2;
        assert_eq!(
            FlowAddrs::v6(a, [0xff; 16]),
            FlowAddrs::V6 {
                client: [1, 2],
                server: [u64::MAX, u64::MAX]
            }
        );
    }

    #[test]
    fn key_words_round_trip() {
        assert_eq!(SynCookieKey::from_words(KEY.to_words()), KEY);
    }
}
