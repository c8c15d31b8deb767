//! The XDP program: steers the TCP segments of soft-rdma's connections into AF_XDP rings.
//!
//! Parses Ethernet (one 802.1Q/802.1ad tag at most), IPv4 or IPv6 (no extension headers: anything else is
//! left to the kernel) and TCP, every read bounds-checked against `data_end` for the verifier. A segment whose
//! destination address and port are in `ENDPOINTS` (filled by soft-rdmad) is redirected to the AF_XDP socket
//! of its RX queue in `XSKS`; `bpf_redirect_map` falls back to `XDP_PASS` when no socket is bound there, so a
//! daemon that has not (or no longer) bound its sockets never blackholes traffic. Everything else — ARP,
//! ICMP, UDP, other TCP ports, IP fragments — passes to the kernel untouched.
//!
//! Per-CPU counters (`COUNTERS`, indexed by `soft_rdma_common::maps::Counter`) classify what was steered
//! by the first payload bytes: an MPA Request/Reply ("MPA ID Req"/"MPA ID Rep", RFC 5044 §7.1), a tagged or
//! untagged FPDU (DDP control byte, payload byte 2, T bit 0x80: RFC 5041 §4), or other (no payload). The
//! classification is a heuristic for observability only: a segment may start mid-FPDU. No logging per packet.
//!
//! SYN cookies (`soft_rdma_common::syn_cookie`, RFC 4987 §3.6): when the daemon turned them on
//! (`CONFIG[CONFIG_SYN_COOKIES]`), a SYN for a listening endpoint (`ENDPOINT_LISTENING`) that carries the
//! timestamp option and no payload, over IPv4 without options or IPv6 without extension headers, is
//! answered here: the frame is rewritten in
//! place into the SYN-ACK (addresses swapped, the cookie as its ISN and TSval, the options the daemon's TCP
//! offers, both checksums) and sent back with `XDP_TX`. The daemon is not woken until the ACK. Every other
//! SYN is steered to the daemon as before.
//!
//! `CONFIG[CONFIG_DROP_PPM]` (0 unless the daemon runs with the test-only `--xdp-fault-drop-ppm`) drops that
//! many steered segments per million, to test loss recovery of the userspace TCP stack.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

#[cfg(target_arch = "bpf")]
mod program {
    use aya_ebpf::{
        bindings::xdp_action,
        helpers::{bpf_get_prandom_u32, bpf_xdp_adjust_tail, bpf_xdp_load_bytes},
        macros::{map, xdp},
        maps::{Array, HashMap, PerCpuArray, XskMap},
        programs::XdpContext,
    };
    use core::ptr::{read_volatile, write_volatile};
    use soft_rdma_common::maps::{
        CONFIG_COUNT, CONFIG_DROP_PPM, CONFIG_SYN_COOKIE_KEY, CONFIG_SYN_COOKIE_MSS, CONFIG_SYN_COOKIE_MSS6,
        CONFIG_SYN_COOKIE_TICK, CONFIG_SYN_COOKIE_WINDOW, CONFIG_SYN_COOKIE_WSCALE, CONFIG_SYN_COOKIES,
        COUNTER_COUNT, Counter, ENDPOINT_LISTENING, EndpointKey, EndpointValue, MAX_ENDPOINTS, MAX_QUEUES,
        SYN_COOKIES_ON, SYN_COOKIES_SACK, SYN_COOKIES_WINDOW_SCALE,
    };
    use soft_rdma_common::syn_cookie::{self, Flow, FlowAddrs, PeerSynOptions, SynCookieKey};

    #[map(name = "ENDPOINTS")]
    static ENDPOINTS: HashMap<EndpointKey, EndpointValue> = HashMap::with_max_entries(MAX_ENDPOINTS, 0);

    #[map(name = "XSKS")]
    static XSKS: XskMap = XskMap::with_max_entries(MAX_QUEUES, 0);

    #[map(name = "COUNTERS")]
    static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_COUNT, 0);

    #[map(name = "CONFIG")]
    static CONFIG: Array<u32> = Array::with_max_entries(CONFIG_COUNT, 0);

    /// Scratch space of the SYN option walk ([`syn_options`]), one per CPU.
    #[map(name = "WALK")]
    static WALK: PerCpuArray<OptionWalk> = PerCpuArray::with_max_entries(1, 0);

    /// Where the SYN option walk is and what it found.
    #[repr(C)]
    struct OptionWalk {
        buf: [u8; 64],
        at: u32,
        found: u32,
        mss: u32,
        shift: u32,
        tsval: u32,
    }

    const FOUND_WINDOW_SCALE: u32 = 1;
    const FOUND_SACK: u32 = 2;
    const FOUND_TIMESTAMP: u32 = 4;
    const FOUND_MALFORMED: u32 = 8;

    const ETH_HLEN: usize = 14;
    const ETH_P_IP: u16 = 0x0800;
    const ETH_P_IPV6: u16 = 0x86DD;
    const ETH_P_8021Q: u16 = 0x8100;
    const ETH_P_8021AD: u16 = 0x88A8;
    const IPPROTO_TCP: u8 = 6;
    /// "MPA ID R", then "eq" (Request) or "ep" (Reply): RFC 5044 §7.1 keys.
    const MPA_KEY_HEAD: u64 = u64::from_ne_bytes(*b"MPA ID R");
    const MPA_REQ_TAIL: u16 = u16::from_ne_bytes(*b"eq");
    const MPA_REP_TAIL: u16 = u16::from_ne_bytes(*b"ep");
    /// DDP control byte T (tagged) bit (RFC 5041 §4.2).
    const DDP_TAGGED: u8 = 0x80;

    /// A segment's source and destination addresses.
    #[derive(Clone, Copy)]
    enum Ips {
        V4([u8; 4], [u8; 4]),
        V6([u8; 16], [u8; 16]),
    }

    enum Verdict {
        Pass,
        Malformed,
        Steer(Counter),
        /// The frame now holds a SYN-ACK with a cookie: send it back.
        SynAck,
    }

    #[inline(always)]
    fn count(c: Counter) {
        if let Some(p) = COUNTERS.get_ptr_mut(c as u32) {
            // SAFETY: a per-CPU slot of this CPU; XDP programs do not preempt themselves.
            unsafe { *p += 1 };
        }
    }

    /// `T` at byte `off` of the frame, if the frame is long enough.
    #[inline(always)]
    fn load<T: Copy>(ctx: &XdpContext, off: usize) -> Option<T> {
        let start = ctx.data();
        let end = ctx.data_end();
        if start + off + core::mem::size_of::<T>() > end {
            return None;
        }
        // SAFETY: bounds-checked above; unaligned reads of plain bytes.
        Some(unsafe { core::ptr::read_unaligned((start + off) as *const T) })
    }

    // `frags`: loaded as `xdp.frags` (BPF_F_XDP_HAS_FRAGS), so a packet larger than one AF_XDP frame (a
    // GSO packet from a peer on this host, in generic mode) reaches the socket in several descriptors
    // instead of being dropped; every read below is of the first buffer, which holds the headers.
    #[xdp(frags)]
    pub fn soft_rdma_xdp(ctx: XdpContext) -> u32 {
        match classify(&ctx) {
            Verdict::Pass => {
                count(Counter::Passed);
                xdp_action::XDP_PASS
            }
            Verdict::Malformed => {
                count(Counter::Malformed);
                xdp_action::XDP_PASS
            }
            Verdict::SynAck => {
                count(Counter::SynCookie);
                xdp_action::XDP_TX
            }
            Verdict::Steer(_) if fault_drop() => {
                count(Counter::FaultDropped);
                xdp_action::XDP_DROP
            }
            Verdict::Steer(class) => match XSKS.redirect(ctx.rx_queue_index(), xdp_action::XDP_PASS as u64) {
                Ok(action) => {
                    count(Counter::Redirected);
                    count(class);
                    action
                }
                Err(_) => {
                    count(Counter::NoSocket);
                    xdp_action::XDP_PASS
                }
            },
        }
    }

    /// Test-only fault injection: drop `CONFIG[CONFIG_DROP_PPM]` per million steered segments.
    #[inline(always)]
    fn fault_drop() -> bool {
        match CONFIG.get(CONFIG_DROP_PPM) {
            // SAFETY: a helper without arguments.
            Some(&ppm) if ppm != 0 => (unsafe { bpf_get_prandom_u32() }) % 1_000_000 < ppm,
            _ => false,
        }
    }

    #[inline(always)]
    fn classify(ctx: &XdpContext) -> Verdict {
        let Some(mut ethertype) = load::<[u8; 2]>(ctx, 12).map(u16::from_be_bytes) else {
            return Verdict::Malformed;
        };
        let mut l3 = ETH_HLEN;
        if ethertype == ETH_P_8021Q || ethertype == ETH_P_8021AD {
            // One tag: TCI (2 bytes) then the inner ethertype.
            match load::<[u8; 2]>(ctx, 16) {
                Some(t) => ethertype = u16::from_be_bytes(t),
                None => return Verdict::Malformed,
            }
            l3 = ETH_HLEN + 4;
        }
        // (key, TCP header offset, TCP segment length per the IP header, the source and destination
        // addresses when the header has no options or extensions: what a SYN cookie needs)
        let (mut key, l4, seg_len, ips) = match ethertype {
            ETH_P_IP => {
                let Some(vihl) = load::<u8>(ctx, l3) else {
                    return Verdict::Malformed;
                };
                let ihl = ((vihl & 0x0f) as usize) * 4;
                if vihl >> 4 != 4 || ihl < 20 {
                    return Verdict::Malformed;
                }
                let Some(hdr) = load::<[u8; 20]>(ctx, l3) else {
                    return Verdict::Malformed;
                };
                if hdr[9] != IPPROTO_TCP {
                    return Verdict::Pass;
                }
                // Fragments (MF set or a non-zero offset) are the kernel's to reassemble.
                if u16::from_be_bytes([hdr[6], hdr[7]]) & 0x3fff != 0 {
                    return Verdict::Pass;
                }
                let total = u16::from_be_bytes([hdr[2], hdr[3]]) as usize;
                if total < ihl {
                    return Verdict::Malformed;
                }
                let dst = [hdr[16], hdr[17], hdr[18], hdr[19]];
                let key = EndpointKey::ipv4(dst, 0);
                let ips = (ihl == 20).then_some(Ips::V4([hdr[12], hdr[13], hdr[14], hdr[15]], dst));
                (key, l3 + ihl, total - ihl, ips)
            }
            ETH_P_IPV6 => {
                let Some(hdr) = load::<[u8; 40]>(ctx, l3) else {
                    return Verdict::Malformed;
                };
                if hdr[0] >> 4 != 6 {
                    return Verdict::Malformed;
                }
                // Extension headers are left to the kernel.
                if hdr[6] != IPPROTO_TCP {
                    return Verdict::Pass;
                }
                let mut src = [0u8; 16];
                let mut dst = [0u8; 16];
                let mut i = 0;
                while i < 16 {
                    src[i] = hdr[8 + i];
                    dst[i] = hdr[24 + i];
                    i += 1;
                }
                let key = EndpointKey::ipv6(dst, 0);
                let ips = Some(Ips::V6(src, dst));
                (key, l3 + 40, u16::from_be_bytes([hdr[4], hdr[5]]) as usize, ips)
            }
            _ => return Verdict::Pass,
        };
        let Some(tcp) = load::<[u8; 20]>(ctx, l4) else {
            return Verdict::Malformed;
        };
        let doff = ((tcp[12] >> 4) as usize) * 4;
        if doff < 20 || seg_len < doff {
            return Verdict::Malformed;
        }
        key.port = [tcp[2], tcp[3]];
        let Some(endpoint) = ENDPOINTS.get_ptr(&key) else {
            return Verdict::Pass;
        };
        let payload = l4 + doff;
        let payload_len = seg_len - doff;
        // SYN alone (FIN, RST, ACK clear), no payload, for a listening endpoint.
        if tcp[13] & 0x17 == 0x02
            && payload_len == 0
            && let Some(ips) = ips
            // SAFETY: a value pointer of ENDPOINTS, valid for this program run.
            && unsafe { (*endpoint).flags } & ENDPOINT_LISTENING != 0
            && syn_ack(ctx, l3, &tcp, doff, ips).is_some()
        {
            return Verdict::SynAck;
        }
        if payload_len >= 10
            && let (Some(head), Some(tail)) = (load::<u64>(ctx, payload), load::<u16>(ctx, payload + 8))
            && head == MPA_KEY_HEAD
        {
            if tail == MPA_REQ_TAIL {
                return Verdict::Steer(Counter::MpaRequest);
            }
            if tail == MPA_REP_TAIL {
                return Verdict::Steer(Counter::MpaReply);
            }
        }
        if payload_len >= 3 {
            return match load::<u8>(ctx, payload + 2) {
                Some(ctrl) if ctrl & DDP_TAGGED != 0 => Verdict::Steer(Counter::TaggedFpdu),
                Some(_) => Verdict::Steer(Counter::UntaggedFpdu),
                None => Verdict::Steer(Counter::Other),
            };
        }
        Verdict::Steer(Counter::Other)
    }

    fn config(index: u32) -> u32 {
        CONFIG.get(index).copied().unwrap_or(0)
    }

    /// The options of a SYN whose options are the `len` bytes at `start`, and its TSval; `None` without the
    /// timestamp option or with a malformed option (RFC 9293 §3.1: kinds 0 and 1 are one byte, every other
    /// carries its length).
    ///
    /// The walk keeps its position and findings in a per-CPU map value ([`OptionWalk`]), read and written
    /// through volatile accesses: the verifier does not track what a map value holds, so every pass of the
    /// loop starts from the same state and it checks the body a few times instead of once per path.
    #[inline(always)]
    fn syn_options(ctx: &XdpContext, start: usize, len: usize) -> Option<(PeerSynOptions, u32)> {
        // Masked (behind `black_box`, which the optimizer cannot see through) so that the verifier knows the
        // helper's length is small and not negative.
        let n = core::hint::black_box(len as u32) & 0x3f;
        if n == 0 || n > 40 {
            return None;
        }
        let w = WALK.get_ptr_mut(0)?;
        // SAFETY: `w` is this CPU's value of WALK (XDP does not preempt itself); the helper copies `n`
        // (1..=40) bytes of the frame into its 64-byte buffer, or fails.
        unsafe {
            if bpf_xdp_load_bytes(ctx.ctx, start as u32, (*w).buf.as_mut_ptr() as *mut _, n) != 0 {
                return None;
            }
            write_volatile(&mut (*w).at, 0);
            // RFC 9293 §3.7.1: no MSS option means 536.
            write_volatile(&mut (*w).mss, 536);
            write_volatile(&mut (*w).found, 0);
        }
        let mut steps = 0;
        while steps < 20 {
            steps += 1;
            // SAFETY: as above.
            let done = unsafe { option_step(&mut *w, n) };
            if done {
                break;
            }
        }
        // SAFETY: as above.
        let (found, mss, shift, tsval) = unsafe {
            (
                read_volatile(&(*w).found),
                read_volatile(&(*w).mss),
                read_volatile(&(*w).shift),
                read_volatile(&(*w).tsval),
            )
        };
        if found & (FOUND_TIMESTAMP | FOUND_MALFORMED) != FOUND_TIMESTAMP {
            return None;
        }
        let opts = PeerSynOptions {
            mss: mss as u16,
            window_scale: (found & FOUND_WINDOW_SCALE != 0).then_some(shift as u8),
            sack_permitted: found & FOUND_SACK != 0,
        };
        Some((opts, tsval))
    }

    /// One option of the walk; true when the walk is over (the end, kind 0, or a malformed option).
    #[inline(always)]
    fn option_step(w: &mut OptionWalk, len: u32) -> bool {
        // SAFETY: plain fields of the map value `w`.
        let at = unsafe { read_volatile(&w.at) } & 0x3f;
        if at >= len {
            return true;
        }
        let i = at as usize;
        let kind = w.buf[i & 63];
        if kind == 0 {
            return true;
        }
        if kind == 1 {
            // SAFETY: as above.
            unsafe { write_volatile(&mut w.at, at + 1) };
            return false;
        }
        let olen = u32::from(w.buf[(i + 1) & 63]);
        if olen < 2 || at + olen > len {
            // SAFETY: as above.
            unsafe { write_volatile(&mut w.found, read_volatile(&w.found) | FOUND_MALFORMED) };
            return true;
        }
        let byte = |k: usize| u32::from(w.buf[(i + k) & 63]);
        // SAFETY: as above.
        unsafe {
            match (kind, olen) {
                (2, 4) => write_volatile(&mut w.mss, (byte(2) << 8) | byte(3)),
                (3, 3) => {
                    write_volatile(&mut w.shift, byte(2));
                    write_volatile(&mut w.found, read_volatile(&w.found) | FOUND_WINDOW_SCALE);
                }
                (4, 2) => write_volatile(&mut w.found, read_volatile(&w.found) | FOUND_SACK),
                (8, 10) => {
                    write_volatile(
                        &mut w.tsval,
                        (byte(2) << 24) | (byte(3) << 16) | (byte(4) << 8) | byte(5),
                    );
                    write_volatile(&mut w.found, read_volatile(&w.found) | FOUND_TIMESTAMP);
                }
                _ => {}
            }
            write_volatile(&mut w.at, at + olen);
        }
        false
    }

    /// One's-complement sum of big-endian 16-bit words.
    #[inline(always)]
    fn sum_words<const N: usize>(bytes: &[u8; N], mut sum: u32) -> u32 {
        let mut i = 0;
        while i + 1 < N {
            sum += u32::from(u16::from_be_bytes([bytes[i], bytes[i + 1]]));
            i += 2;
        }
        sum
    }

    #[inline(always)]
    fn fold(mut sum: u32) -> u16 {
        sum = (sum & 0xffff) + (sum >> 16);
        sum = (sum & 0xffff) + (sum >> 16);
        !(sum as u16)
    }

    /// Writes `bytes` at `off`, if the frame is long enough.
    #[inline(always)]
    fn store<const N: usize>(ctx: &XdpContext, off: usize, bytes: &[u8; N]) -> Option<()> {
        let start = ctx.data();
        if start + off + N > ctx.data_end() {
            return None;
        }
        // SAFETY: bounds-checked above.
        unsafe { core::ptr::write_unaligned((start + off) as *mut [u8; N], *bytes) };
        Some(())
    }

    /// Rewrites the SYN (IP header at `l3`, 20 bytes for IPv4, 40 for IPv6; TCP header `tcp`, `doff` bytes
    /// with options) into the SYN-ACK that answers it with a cookie. `None` (the frame untouched) when
    /// cookies are off or the SYN does not qualify; the daemon answers it then.
    #[inline(always)]
    fn syn_ack(ctx: &XdpContext, l3: usize, tcp: &[u8; 20], doff: usize, ips: Ips) -> Option<()> {
        let flags = config(CONFIG_SYN_COOKIES);
        if flags & SYN_COOKIES_ON == 0 {
            return None;
        }
        let (ip_len, mss, addrs) = match ips {
            Ips::V4(src, dst) => (
                20,
                config(CONFIG_SYN_COOKIE_MSS),
                FlowAddrs::V4 {
                    client: u32::from_be_bytes(src),
                    server: u32::from_be_bytes(dst),
                },
            ),
            Ips::V6(src, dst) => (40, config(CONFIG_SYN_COOKIE_MSS6), FlowAddrs::v6(src, dst)),
        };
        let (peer, peer_tsval) = syn_options(ctx, l3 + ip_len + 20, doff - 20)?;
        let client_isn = u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]);
        let key = SynCookieKey::from_words([
            config(CONFIG_SYN_COOKIE_KEY),
            config(CONFIG_SYN_COOKIE_KEY + 1),
            config(CONFIG_SYN_COOKIE_KEY + 2),
            config(CONFIG_SYN_COOKIE_KEY + 3),
        ]);
        let flow = Flow {
            addrs,
            client_port: u16::from_be_bytes([tcp[0], tcp[1]]),
            server_port: u16::from_be_bytes([tcp[2], tcp[3]]),
        };
        let (isn, tsval) = syn_cookie::generate(key, config(CONFIG_SYN_COOKIE_TICK), flow, client_isn, peer);
        let sack = peer.sack_permitted && flags & SYN_COOKIES_SACK != 0;
        let scale = peer.window_scale.is_some() && flags & SYN_COOKIES_WINDOW_SCALE != 0;

        // RFC 9293 §3.1 header, then MSS, SACK-permitted, timestamps, window scale: 20 option bytes, NOPs
        // where an option is not offered.
        let mut th = [1u8; 40];
        th[0..2].copy_from_slice(&tcp[2..4]);
        th[2..4].copy_from_slice(&tcp[0..2]);
        th[4..8].copy_from_slice(&isn.to_be_bytes());
        th[8..12].copy_from_slice(&client_isn.wrapping_add(1).to_be_bytes());
        th[12] = 10 << 4;
        th[13] = 0x12; // SYN, ACK
        th[14..16].copy_from_slice(&(config(CONFIG_SYN_COOKIE_WINDOW) as u16).to_be_bytes());
        th[16..20].copy_from_slice(&[0, 0, 0, 0]);
        th[20..22].copy_from_slice(&[2, 4]);
        th[22..24].copy_from_slice(&(mss as u16).to_be_bytes());
        if sack {
            th[24..26].copy_from_slice(&[4, 2]);
        }
        th[26..28].copy_from_slice(&[8, 10]);
        th[28..32].copy_from_slice(&tsval.to_be_bytes());
        th[32..36].copy_from_slice(&peer_tsval.to_be_bytes());
        if scale {
            th[37..39].copy_from_slice(&[3, 3]);
            th[39] = config(CONFIG_SYN_COOKIE_WSCALE) as u8;
        }
        // The pseudo-header's addresses (RFC 9293 §3.1; RFC 8200 §8.1), then protocol and TCP length.
        let pseudo = u32::from(IPPROTO_TCP) + 40;
        let pseudo = match ips {
            Ips::V4(src, dst) => sum_words(&dst, sum_words(&src, pseudo)),
            Ips::V6(src, dst) => sum_words(&dst, sum_words(&src, pseudo)),
        };
        let tcp_sum = fold(sum_words(&th, pseudo));
        th[16..18].copy_from_slice(&tcp_sum.to_be_bytes());

        let mac = load::<[u8; 12]>(ctx, 0)?;
        let want = (l3 + ip_len + 40) as i32;
        let have = (ctx.data_end() - ctx.data()) as i32;
        // SAFETY: the helper checks the new length against the frame's buffer; pointers are re-read after.
        if want != have && unsafe { bpf_xdp_adjust_tail(ctx.ctx, want - have) } != 0 {
            return None;
        }
        let mut eth = [0u8; 12];
        eth[0..6].copy_from_slice(&mac[6..12]);
        eth[6..12].copy_from_slice(&mac[0..6]);
        store(ctx, 0, &eth)?;
        match ips {
            Ips::V4(src, dst) => {
                let mut ip = [0u8; 20];
                ip[0] = 0x45;
                ip[2..4].copy_from_slice(&60u16.to_be_bytes());
                ip[6] = 0x40; // DF
                ip[8] = 64; // TTL
                ip[9] = IPPROTO_TCP;
                ip[12..16].copy_from_slice(&dst);
                ip[16..20].copy_from_slice(&src);
                let ip_sum = fold(sum_words(&ip, 0));
                ip[10..12].copy_from_slice(&ip_sum.to_be_bytes());
                store(ctx, l3, &ip)?;
                store(ctx, l3 + 20, &th)
            }
            Ips::V6(src, dst) => {
                // RFC 8200 §3: version 6, no traffic class or flow label, the TCP header as payload.
                let mut ip = [0u8; 40];
                ip[0] = 0x60;
                ip[4..6].copy_from_slice(&40u16.to_be_bytes());
                ip[6] = IPPROTO_TCP;
                ip[7] = 64; // hop limit
                ip[8..24].copy_from_slice(&dst);
                ip[24..40].copy_from_slice(&src);
                store(ctx, l3, &ip)?;
                store(ctx, l3 + 40, &th)
            }
        }
    }

    #[panic_handler]
    fn panic(_info: &core::panic::PanicInfo) -> ! {
        loop {}
    }

    #[unsafe(link_section = "license")]
    #[unsafe(no_mangle)]
    static LICENSE: [u8; 4] = *b"GPL\0";
}

#[cfg(not(target_arch = "bpf"))]
fn main() {}
