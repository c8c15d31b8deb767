//! The network interface the device stands for: its MAC gives the node GUID and the GID as siw derives
//! them (`siw_device_create`: the GUID is the MAC's EUI-64, `addrconf_addr_eui48`; `siw_query_gid`: the
//! GID is the MAC in its first six bytes), and its MTU the port's active MTU (`siw_query_port`:
//! `ib_mtu_int_to_enum(netdev->mtu)`).
//!
//! Which interface: `$SOFT_RDMA_VERBS_IFACE` if set, else the one carrying the default route
//! (`/proc/net/route`), else the first non-loopback interface that is up, else `lo`.

use std::path::Path;

use crate::abi::{IBV_MTU_256, IBV_MTU_4096};

/// The environment variable that names the interface.
pub const IFACE_ENV: &str = "SOFT_RDMA_VERBS_IFACE";

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Interface {
    pub(crate) name: String,
    pub(crate) mac: [u8; 6],
    pub(crate) mtu: u32,
}

impl Interface {
    pub(crate) fn pick() -> Interface {
        let name = std::env::var(IFACE_ENV)
            .ok()
            .or_else(default_route_interface)
            .or_else(first_up_interface)
            .unwrap_or_else(|| "lo".to_string());
        let dir = Path::new("/sys/class/net").join(&name);
        let mac = std::fs::read_to_string(dir.join("address"))
            .ok()
            .and_then(|s| parse_mac(s.trim()))
            .unwrap_or_default();
        let mtu = std::fs::read_to_string(dir.join("mtu"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(1500);
        Interface { name, mac, mtu }
    }

    /// The interface's index (0 when it cannot be read).
    pub(crate) fn ifindex(&self) -> u32 {
        std::fs::read_to_string(Path::new("/sys/class/net").join(&self.name).join("ifindex"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The EUI-64 of the MAC (FF:FE in the middle, the universal/local bit flipped), in network order.
    pub(crate) fn guid(&self) -> u64 {
        let m = self.mac;
        let eui = [m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]];
        // The field is __be64: its bytes in memory are the EUI-64's in order.
        u64::from_ne_bytes(eui)
    }

    /// The GID: the MAC, then zeros.
    pub(crate) fn gid(&self) -> [u8; 16] {
        let mut g = [0u8; 16];
        g[..6].copy_from_slice(&self.mac);
        g
    }

    /// `enum ibv_mtu` for the interface's MTU: the largest IB MTU (256 … 4096) it holds.
    pub(crate) fn ibv_mtu(&self) -> libc::c_int {
        ibv_mtu_of(self.mtu)
    }
}

pub(crate) fn ibv_mtu_of(mtu: u32) -> libc::c_int {
    let mut e = IBV_MTU_4096;
    let mut size = 4096;
    while e > IBV_MTU_256 && mtu < size {
        e -= 1;
        size /= 2;
    }
    e
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

fn default_route_interface() -> Option<String> {
    let routes = std::fs::read_to_string("/proc/net/route").ok()?;
    routes.lines().skip(1).find_map(|line| {
        let mut f = line.split_whitespace();
        let iface = f.next()?;
        (f.next()? == "00000000").then(|| iface.to_string())
    })
}

fn first_up_interface() -> Option<String> {
    let mut names: Vec<String> = std::fs::read_dir("/sys/class/net")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n != "lo")
        .filter(|n| {
            std::fs::read_to_string(Path::new("/sys/class/net").join(n).join("operstate"))
                .map(|s| s.trim() == "up")
                .unwrap_or(false)
        })
        .collect();
    names.sort();
    names.into_iter().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guid_is_the_macs_eui64() {
        let i = Interface {
            name: "x".into(),
            mac: [0x52, 0x54, 0x00, 0x12, 0x34, 0x56],
            mtu: 1500,
        };
        assert_eq!(
            i.guid().to_ne_bytes(),
            [0x50, 0x54, 0x00, 0xff, 0xfe, 0x12, 0x34, 0x56]
        );
        assert_eq!(&i.gid()[..6], &i.mac);
        assert_eq!(&i.gid()[6..], &[0u8; 10]);
    }

    #[test]
    fn mtu_maps_to_the_largest_ib_mtu_that_fits() {
        assert_eq!(ibv_mtu_of(65536), IBV_MTU_4096);
        assert_eq!(ibv_mtu_of(4096), IBV_MTU_4096);
        assert_eq!(ibv_mtu_of(1500), 3); // IBV_MTU_1024
        assert_eq!(ibv_mtu_of(2048), 4); // IBV_MTU_2048
        assert_eq!(ibv_mtu_of(100), IBV_MTU_256);
    }

    #[test]
    fn macs_parse() {
        assert_eq!(
            parse_mac("00:11:22:aa:bb:cc"),
            Some([0, 0x11, 0x22, 0xaa, 0xbb, 0xcc])
        );
        assert_eq!(parse_mac("00:11:22"), None);
        assert_eq!(parse_mac("00:11:22:aa:bb:cc:dd"), None);
    }
}
