//! What the XDP transport needs to know about its interface: index, MAC, MTU, addresses, RX queues.

use std::ffi::CString;
use std::net::IpAddr;

use anyhow::{Context, Result, bail};

/// One address of the interface with its prefix length (as `ip addr` shows it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IfAddr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl IfAddr {
    /// `other` is on this address's subnet (directly reachable on the link).
    pub fn contains(&self, other: IpAddr) -> bool {
        fn masked(bytes: &[u8], prefix: u8) -> Vec<u8> {
            bytes
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    let bits = (prefix as i32 - (i as i32) * 8).clamp(0, 8);
                    if bits == 0 { 0 } else { b & (0xffu8 << (8 - bits)) }
                })
                .collect()
        }
        match (self.addr, other) {
            (IpAddr::V4(a), IpAddr::V4(b)) => {
                masked(&a.octets(), self.prefix) == masked(&b.octets(), self.prefix)
            }
            (IpAddr::V6(a), IpAddr::V6(b)) => {
                masked(&a.octets(), self.prefix) == masked(&b.octets(), self.prefix)
            }
            _ => false,
        }
    }
}

/// The interface, as read at startup.
#[derive(Clone, Debug)]
pub struct IfaceInfo {
    pub name: String,
    pub index: u32,
    pub mac: [u8; 6],
    /// IP MTU (without the Ethernet header).
    pub mtu: usize,
    /// Global (non link-local) IPv4 and IPv6 addresses.
    pub addrs: Vec<IfAddr>,
    pub rx_queues: u32,
}

impl IfaceInfo {
    pub fn read(name: &str) -> Result<IfaceInfo> {
        let c = CString::new(name).context("interface name")?;
        // SAFETY: valid C string.
        let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
        if index == 0 {
            bail!("no interface named {name} in this network namespace");
        }
        let sys = format!("/sys/class/net/{name}");
        let mac_text = std::fs::read_to_string(format!("{sys}/address"))
            .with_context(|| format!("reading {sys}/address"))?;
        let mut mac = [0u8; 6];
        let parts: Vec<&str> = mac_text.trim().split(':').collect();
        if parts.len() != 6 {
            bail!("{name} has no Ethernet address ({})", mac_text.trim());
        }
        for (m, p) in mac.iter_mut().zip(parts) {
            *m = u8::from_str_radix(p, 16).with_context(|| format!("parsing the MAC of {name}"))?;
        }
        let mtu: usize = std::fs::read_to_string(format!("{sys}/mtu"))
            .with_context(|| format!("reading {sys}/mtu"))?
            .trim()
            .parse()
            .context("parsing the MTU")?;
        let rx_queues = std::fs::read_dir(format!("{sys}/queues"))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
                    .count() as u32
            })
            .unwrap_or(1)
            .max(1);
        let mut addrs = Vec::new();
        for ifa in nix::ifaddrs::getifaddrs().context("getifaddrs")? {
            if ifa.interface_name != name {
                continue;
            }
            let (Some(addr), Some(mask)) = (ifa.address, ifa.netmask) else {
                continue;
            };
            if let (Some(a), Some(m)) = (addr.as_sockaddr_in(), mask.as_sockaddr_in()) {
                addrs.push(IfAddr {
                    addr: IpAddr::V4(a.ip()),
                    prefix: m.ip().to_bits().count_ones() as u8,
                });
            } else if let (Some(a), Some(m)) = (addr.as_sockaddr_in6(), mask.as_sockaddr_in6()) {
                let ip = a.ip();
                if ip.is_unicast_link_local() {
                    continue;
                }
                addrs.push(IfAddr {
                    addr: IpAddr::V6(ip),
                    prefix: m.ip().to_bits().count_ones() as u8,
                });
            }
        }
        if addrs.is_empty() {
            bail!("{name} has no IPv4 or global IPv6 address");
        }
        Ok(IfaceInfo {
            name: name.to_owned(),
            index,
            mac,
            mtu,
            addrs,
            rx_queues,
        })
    }

    pub fn has_addr(&self, ip: IpAddr) -> bool {
        self.addrs.iter().any(|a| a.addr == ip)
    }

    /// Every address of the same family as `ip` (for a wildcard `ip`), or `ip` itself if it is ours.
    pub fn expand(&self, ip: IpAddr) -> Vec<IpAddr> {
        if ip.is_unspecified() {
            self.addrs
                .iter()
                .map(|a| a.addr)
                .filter(|a| a.is_ipv4() == ip.is_ipv4())
                .collect()
        } else {
            vec![ip]
        }
    }

    /// `ip` is on one of the interface's subnets.
    pub fn on_link(&self, ip: IpAddr) -> bool {
        self.addrs.iter().any(|a| a.contains(ip))
    }

    /// The first address of `ip`'s family.
    pub fn first_of_family(&self, ipv4: bool) -> Option<IpAddr> {
        self.addrs.iter().map(|a| a.addr).find(|a| a.is_ipv4() == ipv4)
    }
}
