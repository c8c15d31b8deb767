//! Neighbours: smoltcp asks for every destination (its addresses have prefix length 0), and the stack
//! answers with the MAC of the kernel's next hop, asked of the kernel (`ip route get`, `ip neigh get`, and
//! `RTM_NEWNEIGH NTF_USE` when the kernel has no entry) and injected as a synthetic ARP reply or Neighbor
//! Advertisement. See the parent module for why. This file holds their state ([`Neighbours`]) and the frames
//! injected; `Shared` (`shared.rs`) drives them, since a connect on either TCP backend waits there for its
//! next hop, and the own TCP frames its segments to the MACs in [`Neighbours::known`].

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant as StdInstant};

use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol, Icmpv6Packet,
    Icmpv6Repr, IpProtocol, Ipv6Packet, Ipv6Repr, NdiscNeighborFlags, NdiscRepr,
};

use crate::transport::xdp::iface::IfaceInfo;

/// Give up resolving a neighbour after this long (the kernel's default: 3 probes, 1 s apart).
pub(super) const NEIGH_TIMEOUT: Duration = Duration::from_millis(3500);
/// Re-inject a learned neighbour this often (smoltcp's cache entries live 60 s).
pub(super) const NEIGH_REFRESH: Duration = Duration::from_secs(20);

/// Neighbour state mirrored from the kernel into smoltcp.
#[derive(Default)]
pub(super) struct Neighbours {
    /// What smoltcp was last given, and when.
    pub(super) known: HashMap<IpAddr, ([u8; 6], StdInstant)>,
    pub(super) pending: HashMap<IpAddr, Pending>,
    pub(super) failed: HashMap<IpAddr, StdInstant>,
}

/// A neighbour being resolved.
pub(super) struct Pending {
    pub(super) started: StdInstant,
    pub(super) next_check: StdInstant,
    pub(super) triggered: bool,
}

/// A frame telling smoltcp "`ip` is at `mac`": an ARP reply (IPv4) or a Neighbor Advertisement (IPv6),
/// addressed to the interface.
pub(super) fn neighbour_frame(info: &IfaceInfo, ip: IpAddr, mac: [u8; 6]) -> Option<Vec<u8>> {
    let ours = EthernetAddress(info.mac);
    let theirs = EthernetAddress(mac);
    match ip {
        IpAddr::V4(peer) => {
            let IpAddr::V4(me) = info.first_of_family(true)? else {
                return None;
            };
            let arp = ArpRepr::EthernetIpv4 {
                operation: ArpOperation::Reply,
                source_hardware_addr: theirs,
                source_protocol_addr: peer,
                target_hardware_addr: ours,
                target_protocol_addr: me,
            };
            let mut buf = vec![0u8; 14 + arp.buffer_len()];
            let mut eth = EthernetFrame::new_unchecked(&mut buf[..]);
            eth.set_src_addr(theirs);
            eth.set_dst_addr(ours);
            eth.set_ethertype(EthernetProtocol::Arp);
            arp.emit(&mut ArpPacket::new_unchecked(eth.payload_mut()));
            Some(buf)
        }
        IpAddr::V6(peer) => {
            let IpAddr::V6(me) = info.first_of_family(false)? else {
                return None;
            };
            let icmp = Icmpv6Repr::Ndisc(NdiscRepr::NeighborAdvert {
                flags: NdiscNeighborFlags::SOLICITED | NdiscNeighborFlags::OVERRIDE,
                target_addr: peer,
                lladdr: Some(theirs.into()),
            });
            let ip_repr = Ipv6Repr {
                src_addr: peer,
                dst_addr: me,
                next_header: IpProtocol::Icmpv6,
                payload_len: icmp.buffer_len(),
                hop_limit: 255,
            };
            let mut buf = vec![0u8; 14 + ip_repr.buffer_len() + icmp.buffer_len()];
            let mut eth = EthernetFrame::new_unchecked(&mut buf[..]);
            eth.set_src_addr(theirs);
            eth.set_dst_addr(ours);
            eth.set_ethertype(EthernetProtocol::Ipv6);
            let mut pkt = Ipv6Packet::new_unchecked(eth.payload_mut());
            ip_repr.emit(&mut pkt);
            icmp.emit(
                &peer,
                &me,
                &mut Icmpv6Packet::new_unchecked(pkt.payload_mut()),
                &smoltcp::phy::ChecksumCapabilities::default(),
            );
            Some(buf)
        }
    }
}
