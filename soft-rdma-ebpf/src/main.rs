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
//! `CONFIG[CONFIG_DROP_PPM]` (0 unless the daemon runs with the test-only `--xdp-fault-drop-ppm`) drops that
//! many steered segments per million, to test loss recovery of the userspace TCP stack.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

#[cfg(target_arch = "bpf")]
mod program {
    use aya_ebpf::{
        bindings::xdp_action,
        helpers::bpf_get_prandom_u32,
        macros::{map, xdp},
        maps::{Array, HashMap, PerCpuArray, XskMap},
        programs::XdpContext,
    };
    use soft_rdma_common::maps::{
        CONFIG_COUNT, CONFIG_DROP_PPM, COUNTER_COUNT, Counter, EndpointKey, EndpointValue, MAX_ENDPOINTS,
        MAX_QUEUES,
    };

    #[map(name = "ENDPOINTS")]
    static ENDPOINTS: HashMap<EndpointKey, EndpointValue> = HashMap::with_max_entries(MAX_ENDPOINTS, 0);

    #[map(name = "XSKS")]
    static XSKS: XskMap = XskMap::with_max_entries(MAX_QUEUES, 0);

    #[map(name = "COUNTERS")]
    static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_COUNT, 0);

    #[map(name = "CONFIG")]
    static CONFIG: Array<u32> = Array::with_max_entries(CONFIG_COUNT, 0);

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

    enum Verdict {
        Pass,
        Malformed,
        Steer(Counter),
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

    #[xdp]
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
        // (key, TCP header offset, TCP segment length per the IP header)
        let (mut key, l4, seg_len) = match ethertype {
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
                let key = EndpointKey::ipv4([hdr[16], hdr[17], hdr[18], hdr[19]], 0);
                (key, l3 + ihl, total - ihl)
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
                let mut dst = [0u8; 16];
                let mut i = 0;
                while i < 16 {
                    dst[i] = hdr[24 + i];
                    i += 1;
                }
                let key = EndpointKey::ipv6(dst, 0);
                (key, l3 + 40, u16::from_be_bytes([hdr[4], hdr[5]]) as usize)
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
        if ENDPOINTS.get_ptr(&key).is_none() {
            return Verdict::Pass;
        }
        let payload = l4 + doff;
        let payload_len = seg_len - doff;
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
