//! What kind of link the XDP program is attached to, and what that lets the own TCP accept as a TCP
//! checksum ([`IfaceKind`], [`PartialChecksums`]). Chosen once at attach time from the kernel's link info
//! (`ip -d link`: the `kind` a virtual device's driver registers; a NIC has none) and sysfs.
//!
//! Why it matters. A sender with TX checksum offload hands its driver a segment whose checksum field holds
//! only the pseudo-header sum (`CHECKSUM_PARTIAL`, Linux `include/linux/skbuff.h`, "Checksumming of
//! output packets"): the NIC is to finish it. When that segment never reaches a NIC — a container's veth,
//! a VM's tap (virtio-net's `VIRTIO_NET_HDR_F_NEEDS_CSUM`), a bridge between them — it arrives as it was
//! handed over, and the receiving kernel accepts it because the skb says "partial" in metadata. AF_XDP
//! copies the bytes only, not that metadata, so in XDP mode the own TCP sees a checksum that does not add
//! up. On a link that only ever carries frames from this host's memory, such a segment is trusted as the
//! kernel trusts it; on a NIC it is verified, and one that fails is dropped, counted and warned about
//! (`stack/drops.rs`).

use std::fmt;

use super::netlink::Netlink;

/// The kind of the interface soft-rdmad's XDP program is attached to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IfaceKind {
    /// A NIC (a device on a bus, `/sys/class/net/IFACE/device`), with its driver's name. virtio-net in a
    /// guest is one too: what it receives may have crossed its host's wire.
    Nic { driver: String },
    /// One end of a veth pair (containers): its frames come from the peer end's sender, in memory.
    Veth,
    /// A tun/tap device (a VM's or a VPN's): its frames come from the process behind it, in memory.
    Tap,
    /// A Linux bridge carrying this host's address: its frames come from its ports (veths, taps, NICs).
    Bridge,
    /// Any other virtual device (macvlan, ipvlan, VLAN, bond, VXLAN, …), by its kind: some sit on a NIC.
    Other { kind: String },
}

/// Which TCP checksums the own TCP takes on this interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartialChecksums {
    /// Only segments whose checksum verifies (RFC 9293 §3.1): a NIC's, and any link not known to carry
    /// frames from memory only.
    Refuse,
    /// Also segments whose checksum field holds exactly the pseudo-header sum of their addresses and length
    /// (a `CHECKSUM_PARTIAL` segment from an offloading sender on a virtual link): see `docs/xdp-mode.md`,
    /// "Peers that offload TX checksums".
    Accept,
}

impl IfaceKind {
    /// The kind of `name` (index `ifindex`), from its link info and sysfs. A link whose info cannot be read
    /// is taken as a NIC (the strict choice).
    pub fn detect(nl: &mut Netlink, ifindex: u32, name: &str) -> IfaceKind {
        let kind = nl.link_kind(ifindex).ok().flatten();
        let driver = std::fs::read_link(format!("/sys/class/net/{name}/device/driver"))
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
        Self::from_parts(kind.as_deref(), driver)
    }

    /// The decision of [`IfaceKind::detect`] from the link-info kind and the bus driver, if any.
    fn from_parts(kind: Option<&str>, driver: Option<String>) -> IfaceKind {
        match (kind, driver) {
            (Some("veth"), _) => IfaceKind::Veth,
            (Some("tun"), _) => IfaceKind::Tap,
            (Some("bridge"), _) => IfaceKind::Bridge,
            (_, Some(driver)) => IfaceKind::Nic { driver },
            (Some(kind), None) => IfaceKind::Other { kind: kind.to_owned() },
            (None, None) => IfaceKind::Nic {
                driver: "unknown".into(),
            },
        }
    }

    /// What the own TCP accepts here: partial checksums only on the links whose frames all come from
    /// this host's memory (or, on a bridge, may: see `docs/xdp-mode.md` for a bridge with a NIC port).
    pub fn partial_checksums(&self) -> PartialChecksums {
        match self {
            IfaceKind::Veth | IfaceKind::Tap | IfaceKind::Bridge => PartialChecksums::Accept,
            IfaceKind::Nic { .. } | IfaceKind::Other { .. } => PartialChecksums::Refuse,
        }
    }
}

/// Says at start what the interface is and which checksums the steered flows' TCP takes there.
pub fn log_choice(kind: &IfaceKind, iface: &str, own_tcp: bool) {
    match (kind.partial_checksums(), own_tcp) {
        (PartialChecksums::Accept, true) => tracing::info!(
            interface = iface,
            kind = %kind,
            "{iface} is a {kind}: segments from peers that offload TX checksums (containers, VMs) are accepted \
             with only the pseudo-header sum, as the kernel accepts them (docs/xdp-mode.md)"
        ),
        (PartialChecksums::Accept, false) => tracing::warn!(
            interface = iface,
            kind = %kind,
            "{iface} is a {kind}, whose peers (containers, VMs) usually offload TX checksums: smoltcp's socket \
             (--xdp-tcp smoltcp) drops their segments as corrupt. Use --xdp-tcp own, or `ethtool -K <peer> tx \
             off` on every peer"
        ),
        (PartialChecksums::Refuse, _) => tracing::info!(
            interface = iface,
            kind = %kind,
            "{iface} is a {kind}: every TCP checksum is verified; segments with a partial checksum are dropped, \
             counted (`soft-rdma status`: tcp_dropped_partial_checksum) and warned about"
        ),
    }
}

impl fmt::Display for IfaceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IfaceKind::Nic { driver } => write!(f, "NIC ({driver})"),
            IfaceKind::Veth => f.write_str("veth"),
            IfaceKind::Tap => f.write_str("tun/tap"),
            IfaceKind::Bridge => f.write_str("bridge"),
            IfaceKind::Other { kind } => write!(f, "{kind}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_links_accept_partial_checksums_and_nics_do_not() {
        let nic = IfaceKind::from_parts(None, Some("ixgbe".into()));
        assert_eq!(nic, IfaceKind::Nic { driver: "ixgbe".into() });
        assert_eq!(nic.partial_checksums(), PartialChecksums::Refuse);
        for (kind, expected) in [
            ("veth", IfaceKind::Veth),
            ("tun", IfaceKind::Tap),
            ("bridge", IfaceKind::Bridge),
        ] {
            let k = IfaceKind::from_parts(Some(kind), None);
            assert_eq!(k, expected);
            assert_eq!(k.partial_checksums(), PartialChecksums::Accept, "{kind}");
        }
        // A macvlan may sit on a NIC: verified.
        let m = IfaceKind::from_parts(Some("macvlan"), None);
        assert_eq!(m.partial_checksums(), PartialChecksums::Refuse);
        // Nothing known: the strict choice.
        assert_eq!(IfaceKind::from_parts(None, None).partial_checksums(), PartialChecksums::Refuse);
        // A NIC driver that also registers link info (none does today) is still a NIC.
        let v = IfaceKind::from_parts(Some("vlan"), Some("e1000e".into()));
        assert_eq!(v.partial_checksums(), PartialChecksums::Refuse);
    }
}
