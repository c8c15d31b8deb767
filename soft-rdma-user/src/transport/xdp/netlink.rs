//! The few rtnetlink requests the XDP transport needs, over a plain `NETLINK_ROUTE` socket (no crate: three
//! fixed-format messages): the kernel's route to a destination (`ip route get`), one neighbour entry
//! (`ip neigh get`), and a request to resolve one (`RTM_NEWNEIGH` with `NTF_USE`: the kernel sends its own
//! ARP request / Neighbor Solicitation exactly as if it had a packet for that address, and nothing else).
//!
//! The kernel stays the owner of routing and neighbour state; soft-rdma's userspace stack only copies from it.
//!
//! [`Netlink::link_kind`] reads an interface's kind (veth, bridge, tun, …: `iface_kind.rs` decides from it
//! which TCP checksums the own TCP accepts).
//!
//! [`Netlink::veth_peer_xdp`] asks whether a veth's peer (in whichever namespace) runs an XDP program: only
//! then does a frame the program sends back with `XDP_TX` reach it at once (see `stack/syn_cookies.rs`).

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_CREATE: u16 = 0x400;
const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
const RTM_NEWNEIGH: u16 = 28;
const RTM_GETNEIGH: u16 = 30;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_PREFSRC: u16 = 7;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
const NTF_USE: u8 = 0x01;
const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const IFLA_LINK: u16 = 5;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_LINK_NETNSID: u16 = 37;
const IFLA_XDP: u16 = 43;
const IFLA_XDP_ATTACHED: u16 = 2;
const IFLA_TARGET_NETNSID: u16 = 46;
/// `XDP_ATTACHED_DRV` and `XDP_ATTACHED_MULTI` (linux/if_link.h): a native-mode program is attached.
const XDP_ATTACHED_DRV: u8 = 1;
const XDP_ATTACHED_MULTI: u8 = 4;

/// Kernel route types (`rtm_type`).
pub const RTN_LOCAL: u8 = 2;
const RTN_BLACKHOLE: u8 = 6;
const RTN_UNREACHABLE: u8 = 7;
const RTN_PROHIBIT: u8 = 8;

/// Neighbour states (`ndm_state`).
pub const NUD_FAILED: u16 = 0x20;
const NUD_VALID: u16 = 0x02 | 0x04 | 0x08 | 0x10 | 0x40 | 0x80; // REACHABLE STALE DELAY PROBE NOARP PERMANENT

/// The kernel's answer to `ip route get DST`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// `RTN_UNICAST`, `RTN_LOCAL`, …
    pub kind: u8,
    pub oif: u32,
    pub gateway: Option<IpAddr>,
    pub prefsrc: Option<IpAddr>,
}

impl Route {
    /// The address whose link-layer address frames to the destination carry.
    pub fn next_hop(&self, dst: IpAddr) -> IpAddr {
        self.gateway.unwrap_or(dst)
    }
}

/// One neighbour entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Neighbour {
    pub state: u16,
    pub lladdr: Option<[u8; 6]>,
}

impl Neighbour {
    /// The link-layer address, if the entry is usable (reachable, stale, probing, permanent…).
    pub fn usable(&self) -> Option<[u8; 6]> {
        if self.state & NUD_VALID != 0 {
            self.lladdr
        } else {
            None
        }
    }
}

/// A blocking rtnetlink socket (requests answer in microseconds: no I/O leaves the host).
pub struct Netlink {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

fn push_attr(msg: &mut Vec<u8>, kind: u16, data: &[u8]) {
    let len = 4 + data.len();
    msg.extend_from_slice(&(len as u16).to_ne_bytes());
    msg.extend_from_slice(&kind.to_ne_bytes());
    msg.extend_from_slice(data);
    while !msg.len().is_multiple_of(4) {
        msg.push(0);
    }
}

fn ip_bytes(ip: IpAddr) -> (u8, Vec<u8>) {
    match ip {
        IpAddr::V4(a) => (libc::AF_INET as u8, a.octets().to_vec()),
        IpAddr::V6(a) => (libc::AF_INET6 as u8, a.octets().to_vec()),
    }
}

fn parse_ip(data: &[u8]) -> Option<IpAddr> {
    match data.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(data).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(data).ok()?)),
        _ => None,
    }
}

/// (type, data) of each attribute in `buf`.
fn attrs(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        let kind = u16::from_ne_bytes([buf[2], buf[3]]) & 0x3fff;
        if len < 4 || len > buf.len() {
            return None;
        }
        let data = &buf[4..len];
        buf = &buf[((len + 3) & !3).min(buf.len())..];
        Some((kind, data))
    })
}

impl Netlink {
    pub fn open() -> io::Result<Netlink> {
        Self::open_protocol(libc::NETLINK_ROUTE)
    }

    fn open_protocol(protocol: libc::c_int) -> io::Result<Netlink> {
        // SAFETY: plain socket(2); the fd is owned right away.
        let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, protocol) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // Answers must not block the caller forever if the kernel never answers (it always does).
        let tv = libc::timeval {
            tv_sec: 1,
            tv_usec: 0,
        };
        // SAFETY: valid option pointer and length.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        Ok(Netlink {
            fd,
            seq: 1,
            buf: vec![0; 64 * 1024],
        })
    }

    /// Sends `body` (after the nlmsghdr) and returns the payload of the answer of type `want`, or the error
    /// the kernel answered with. An ACK-only answer returns an empty payload.
    fn request(&mut self, kind: u16, flags: u16, body: &[u8], want: u16) -> io::Result<Vec<u8>> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut msg = Vec::with_capacity(NLMSG_HDRLEN + body.len());
        msg.extend_from_slice(&((NLMSG_HDRLEN + body.len()) as u32).to_ne_bytes());
        msg.extend_from_slice(&kind.to_ne_bytes());
        msg.extend_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        msg.extend_from_slice(&seq.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        msg.extend_from_slice(body);
        // SAFETY: sockaddr_nl zeroed = the kernel (pid 0).
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as u16;
        // SAFETY: valid buffers and lengths.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                0,
                (&addr as *const libc::sockaddr_nl).cast(),
                size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut result: Option<io::Result<Vec<u8>>> = None;
        loop {
            // SAFETY: buf is valid for its length.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                    0,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let mut rest = &self.buf[..n as usize];
            while rest.len() >= NLMSG_HDRLEN {
                let len = u32::from_ne_bytes(rest[0..4].try_into().expect("4 bytes")) as usize;
                let typ = u16::from_ne_bytes([rest[4], rest[5]]);
                let mseq = u32::from_ne_bytes(rest[8..12].try_into().expect("4 bytes"));
                if len < NLMSG_HDRLEN || len > rest.len() {
                    break;
                }
                let payload = &rest[NLMSG_HDRLEN..len];
                rest = &rest[((len + 3) & !3).min(rest.len())..];
                if mseq != seq {
                    continue;
                }
                match typ {
                    NLMSG_ERROR => {
                        let code = payload
                            .get(0..4)
                            .map(|b| i32::from_ne_bytes(b.try_into().expect("4 bytes")))
                            .unwrap_or(-libc::EIO);
                        let r = if code == 0 {
                            Ok(Vec::new())
                        } else {
                            Err(io::Error::from_raw_os_error(-code))
                        };
                        // An error (or the ACK) ends the exchange; a data answer before an ACK wins.
                        return result.unwrap_or(r);
                    }
                    NLMSG_DONE => return result.unwrap_or_else(|| Ok(Vec::new())),
                    t if t == want => {
                        result = Some(Ok(payload.to_vec()));
                        if flags & NLM_F_ACK == 0 {
                            return result.expect("set");
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    /// `ip route get DST`: `Err(ENETUNREACH)` (or EHOSTUNREACH…) when there is no usable route.
    pub fn route_get(&mut self, dst: IpAddr) -> io::Result<Route> {
        let (family, bytes) = ip_bytes(dst);
        let mut body = vec![family, (bytes.len() * 8) as u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        push_attr(&mut body, RTA_DST, &bytes);
        let answer = self.request(RTM_GETROUTE, 0, &body, RTM_NEWROUTE)?;
        if answer.len() < 12 {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let kind = answer[7];
        match kind {
            RTN_UNREACHABLE => return Err(io::Error::from_raw_os_error(libc::ENETUNREACH)),
            RTN_BLACKHOLE | RTN_PROHIBIT => return Err(io::Error::from_raw_os_error(libc::EHOSTUNREACH)),
            _ => {}
        }
        let mut route = Route {
            kind,
            oif: 0,
            gateway: None,
            prefsrc: None,
        };
        for (t, data) in attrs(&answer[12..]) {
            match t {
                RTA_OIF if data.len() == 4 => route.oif = u32::from_ne_bytes(data.try_into().expect("4")),
                RTA_GATEWAY => route.gateway = parse_ip(data),
                RTA_PREFSRC => route.prefsrc = parse_ip(data),
                _ => {}
            }
        }
        Ok(route)
    }

    fn ndmsg(family: u8, ifindex: u32, state: u16, flags: u8) -> Vec<u8> {
        let mut body = vec![family, 0, 0, 0];
        body.extend_from_slice(&(ifindex as i32).to_ne_bytes());
        body.extend_from_slice(&state.to_ne_bytes());
        body.push(flags);
        body.push(0);
        body
    }

    /// `ip neigh get ADDR dev IFINDEX`; `None` when the kernel has no entry.
    pub fn neigh_get(&mut self, ifindex: u32, addr: IpAddr) -> io::Result<Option<Neighbour>> {
        let (family, bytes) = ip_bytes(addr);
        let mut body = Self::ndmsg(family, ifindex, 0, 0);
        push_attr(&mut body, NDA_DST, &bytes);
        let answer = match self.request(RTM_GETNEIGH, 0, &body, RTM_NEWNEIGH) {
            Ok(a) => a,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e),
        };
        if answer.len() < 12 {
            return Ok(None);
        }
        let state = u16::from_ne_bytes([answer[8], answer[9]]);
        let mut lladdr = None;
        for (t, data) in attrs(&answer[12..]) {
            if t == NDA_LLADDR && data.len() == 6 {
                lladdr = Some(<[u8; 6]>::try_from(data).expect("6 bytes"));
            }
        }
        Ok(Some(Neighbour { state, lladdr }))
    }

    /// `ip link show` of `ifindex` (in the namespace `netnsid`, ours if `None`): its attributes.
    fn link_get(&mut self, ifindex: u32, netnsid: Option<i32>) -> io::Result<Vec<u8>> {
        let mut body = vec![libc::AF_UNSPEC as u8, 0, 0, 0];
        body.extend_from_slice(&(ifindex as i32).to_ne_bytes());
        body.extend_from_slice(&[0u8; 8]);
        if let Some(id) = netnsid {
            push_attr(&mut body, IFLA_TARGET_NETNSID, &id.to_ne_bytes());
        }
        let answer = self.request(RTM_GETLINK, 0, &body, RTM_NEWLINK)?;
        answer
            .get(16..)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EIO))
    }

    /// The `kind` of `ifindex`'s link info (`ip -d link`: "veth", "bridge", "tun", "macvlan", …); `None` for
    /// a device with none, as a NIC's driver registers it.
    pub fn link_kind(&mut self, ifindex: u32) -> io::Result<Option<String>> {
        let ours = self.link_get(ifindex, None)?;
        let kind = attrs(&ours)
            .filter(|(t, _)| *t == IFLA_LINKINFO)
            .flat_map(|(_, data)| attrs(data))
            .find(|(k, _)| *k == IFLA_INFO_KIND)
            .map(|(_, v)| String::from_utf8_lossy(v.strip_suffix(b"\0").unwrap_or(v)).into_owned());
        Ok(kind)
    }

    /// `None` if `ifindex` is not a veth; else whether its peer runs an XDP program in native mode (the
    /// peer may live in another namespace: it is asked for by the namespace id the kernel reports).
    pub fn veth_peer_xdp(&mut self, ifindex: u32) -> io::Result<Option<bool>> {
        let ours = self.link_get(ifindex, None)?;
        let mut kind_veth = false;
        let mut peer = None;
        let mut netnsid = None;
        for (t, data) in attrs(&ours) {
            match t {
                IFLA_LINKINFO => {
                    kind_veth = attrs(data)
                        .any(|(k, v)| k == IFLA_INFO_KIND && v.strip_suffix(b"\0").unwrap_or(v) == b"veth")
                }
                IFLA_LINK if data.len() == 4 => peer = Some(u32::from_ne_bytes(data.try_into().expect("4"))),
                IFLA_LINK_NETNSID if data.len() == 4 => {
                    netnsid = Some(i32::from_ne_bytes(data.try_into().expect("4")))
                }
                _ => {}
            }
        }
        let (true, Some(peer)) = (kind_veth, peer) else {
            return Ok(None);
        };
        let theirs = self.link_get(peer, netnsid)?;
        let attached = attrs(&theirs)
            .filter(|(t, _)| *t == IFLA_XDP)
            .flat_map(|(_, data)| attrs(data))
            .any(|(t, v)| {
                t == IFLA_XDP_ATTACHED && matches!(v.first(), Some(&XDP_ATTACHED_DRV | &XDP_ATTACHED_MULTI))
            });
        Ok(Some(attached))
    }

    /// Asks the kernel to resolve `addr` on `ifindex` (creates the entry if needed and sends the ARP request
    /// or Neighbor Solicitation, as a packet waiting for it would).
    pub fn neigh_resolve(&mut self, ifindex: u32, addr: IpAddr) -> io::Result<()> {
        let (family, bytes) = ip_bytes(addr);
        let mut body = Self::ndmsg(family, ifindex, 0, NTF_USE);
        push_attr(&mut body, NDA_DST, &bytes);
        self.request(RTM_NEWNEIGH, NLM_F_ACK | NLM_F_CREATE, &body, u16::MAX)
            .map(|_| ())
    }
}
