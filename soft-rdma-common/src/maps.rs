//! XDP map key/value types shared by the XDP program and the daemon.
//!
//! - [`ENDPOINTS`](ENDPOINTS_MAP): `HashMap<EndpointKey, EndpointValue>`, the local addr:port pairs whose TCP
//!   segments belong to soft-rdma. The daemon inserts one key per reserved port (one per interface address
//!   for a wildcard reservation) and removes it on release.
//! - [`XSKS`](XSKS_MAP): `XskMap`, the AF_XDP socket bound to each RX queue, indexed by queue.
//! - [`COUNTERS`](COUNTERS_MAP): `PerCpuArray<u64>` indexed by [`Counter`].
//!
//! Every type is `#[repr(C)]` without implicit padding, so the kernel hashes exactly the bytes both sides
//! wrote. The `user` feature adds `aya::Pod`.

/// Name of the XDP program (the `#[xdp]` function).
pub const PROGRAM_NAME: &str = "soft_rdma_xdp";
/// Name of the endpoint map.
pub const ENDPOINTS_MAP: &str = "ENDPOINTS";
/// Name of the AF_XDP socket map.
pub const XSKS_MAP: &str = "XSKS";
/// Name of the counter map.
pub const COUNTERS_MAP: &str = "COUNTERS";
/// Name of the configuration map: `Array<u32>` indexed by the `CONFIG_*` constants.
pub const CONFIG_MAP: &str = "CONFIG";

/// [`CONFIG_MAP`] index: fault injection for tests — drop this many of every million steered segments
/// (0, the default, = never). Models random loss on the AF_XDP receive path, which `tc netem` cannot:
/// AF_XDP transmits bypass the sender's qdisc.
pub const CONFIG_DROP_PPM: u32 = 0;
/// [`CONFIG_MAP`] index: the SYN-ACKs the program sends for listening endpoints
/// ([`crate::syn_cookie`]): 0 = none (every SYN goes to the daemon), else [`SYN_COOKIES_ON`] and the
/// options to offer ([`SYN_COOKIES_SACK`], [`SYN_COOKIES_WINDOW_SCALE`]).
pub const CONFIG_SYN_COOKIES: u32 = 1;
/// [`CONFIG_MAP`] index: the MSS the SYN-ACK advertises on IPv4.
pub const CONFIG_SYN_COOKIE_MSS: u32 = 2;
/// [`CONFIG_MAP`] index: the window-scale shift the SYN-ACK offers.
pub const CONFIG_SYN_COOKIE_WSCALE: u32 = 3;
/// [`CONFIG_MAP`] index: the SYN-ACK's (unscaled) window.
pub const CONFIG_SYN_COOKIE_WINDOW: u32 = 4;
/// [`CONFIG_MAP`] index: the cookie's time counter (`syn_cookie::TICK_PERIOD_SECS` a step), written by the
/// daemon.
pub const CONFIG_SYN_COOKIE_TICK: u32 = 5;
/// [`CONFIG_MAP`] indexes 6..10: the cookie's SipHash key, `SynCookieKey::to_words`.
pub const CONFIG_SYN_COOKIE_KEY: u32 = 6;
/// [`CONFIG_MAP`] index: the MSS the SYN-ACK advertises on IPv6.
pub const CONFIG_SYN_COOKIE_MSS6: u32 = 10;
/// Entries in [`CONFIG_MAP`].
pub const CONFIG_COUNT: u32 = 11;

/// [`CONFIG_SYN_COOKIES`] bit: answer SYNs with cookies.
pub const SYN_COOKIES_ON: u32 = 1;
/// [`CONFIG_SYN_COOKIES`] bit: offer SACK (RFC 2018) when the SYN does.
pub const SYN_COOKIES_SACK: u32 = 2;
/// [`CONFIG_SYN_COOKIES`] bit: offer window scaling (RFC 7323 §2) when the SYN does.
pub const SYN_COOKIES_WINDOW_SCALE: u32 = 4;

/// [`EndpointValue::flags`] bit: a listening endpoint (its SYNs may be answered with a cookie).
pub const ENDPOINT_LISTENING: u32 = 1;

/// Capacity of [`ENDPOINTS_MAP`]: every port of the dynamic range on four addresses.
pub const MAX_ENDPOINTS: u32 = 65_536;
/// Capacity of [`XSKS_MAP`]: RX queues the program can steer (queue index = map index).
pub const MAX_QUEUES: u32 = 256;

/// `EndpointKey::family` for IPv4.
pub const FAMILY_IPV4: u8 = 4;
/// `EndpointKey::family` for IPv6.
pub const FAMILY_IPV6: u8 = 6;

/// A local TCP endpoint: the destination address and port of a received segment.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EndpointKey {
    /// IPv4: the 4 address bytes then 12 zero bytes. IPv6: the 16 address bytes.
    pub addr: [u8; 16],
    /// The port in network byte order (as it appears in the TCP header).
    pub port: [u8; 2],
    /// [`FAMILY_IPV4`] or [`FAMILY_IPV6`].
    pub family: u8,
    /// Always 0 (the key is hashed bytewise).
    pub pad: u8,
}

impl EndpointKey {
    pub const fn ipv4(addr: [u8; 4], port: u16) -> EndpointKey {
        let mut a = [0u8; 16];
        a[0] = addr[0];
        a[1] = addr[1];
        a[2] = addr[2];
        a[3] = addr[3];
        EndpointKey {
            addr: a,
            port: port.to_be_bytes(),
            family: FAMILY_IPV4,
            pad: 0,
        }
    }

    pub const fn ipv6(addr: [u8; 16], port: u16) -> EndpointKey {
        EndpointKey {
            addr,
            port: port.to_be_bytes(),
            family: FAMILY_IPV6,
            pad: 0,
        }
    }
}

/// What the program knows about an endpoint.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EndpointValue {
    /// [`ENDPOINT_LISTENING`], or 0.
    pub flags: u32,
}

listed_enum! {
    /// Indexes of [`COUNTERS_MAP`].
    #[repr(u32)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum Counter {
        /// Left to the kernel (not soft-rdma's, or not TCP).
        Passed = 0 => "passed",
        /// Redirected into an AF_XDP socket.
        Redirected = 1 => "redirected",
        /// A soft-rdma endpoint, but no AF_XDP socket on this RX queue: passed to the kernel.
        NoSocket = 2 => "no_socket",
        /// Truncated or inconsistent headers: passed to the kernel, which drops or counts them.
        Malformed = 3 => "malformed",
        /// Steered segments whose payload begins "MPA ID Req".
        MpaRequest = 4 => "mpa_request",
        /// Steered segments whose payload begins "MPA ID Rep".
        MpaReply = 5 => "mpa_reply",
        /// Steered segments whose payload looks like a tagged FPDU (DDP control T bit set).
        TaggedFpdu = 6 => "tagged_fpdu",
        /// Steered segments whose payload looks like an untagged FPDU.
        UntaggedFpdu = 7 => "untagged_fpdu",
        /// Steered segments without payload (ACKs, SYN, FIN) or too short to classify.
        Other = 8 => "other",
        /// Steered segments dropped by fault injection ([`CONFIG_DROP_PPM`]).
        FaultDropped = 9 => "fault_dropped",
        /// SYNs for a listening endpoint answered by the program with a SYN cookie (`XDP_TX`), IPv4 or IPv6.
        SynCookie = 10 => "syn_cookie",
    }
}

/// Number of [`Counter`]s (the map's size).
pub const COUNTER_COUNT: u32 = Counter::ALL.len() as u32;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: #[repr(C)], only integer/byte-array fields, no padding (18 + 1 + 1 bytes; 4 bytes).
    unsafe impl aya::Pod for super::EndpointKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::EndpointValue {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_layout_has_no_padding() {
        assert_eq!(core::mem::size_of::<EndpointKey>(), 20);
        assert_eq!(core::mem::align_of::<EndpointKey>(), 1);
        assert_eq!(core::mem::size_of::<EndpointValue>(), 4);
        let k = EndpointKey::ipv4([10, 0, 0, 1], 0x1234);
        assert_eq!(k.port, [0x12, 0x34]);
        assert_eq!(&k.addr[..5], &[10, 0, 0, 1, 0]);
        assert_eq!(Counter::ALL.len(), COUNTER_COUNT as usize);
    }
}
