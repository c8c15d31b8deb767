//! Neighbours: smoltcp asks for every destination (its addresses have prefix length 0), and the stack
//! answers with the MAC of the kernel's next hop, asked of the kernel (`ip route get`, `ip neigh get`, and
//! `RTM_NEWNEIGH NTF_USE` when the kernel has no entry) and injected as a synthetic ARP reply or Neighbor
//! Advertisement. See the parent module for why. Part of [`Shared`]: a connect on either TCP backend waits
//! here for its next hop, and the own TCP frames its segments to the MACs in [`Neighbours::known`].

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant as StdInstant};

use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol, Icmpv6Packet,
    Icmpv6Repr, IpProtocol, Ipv6Packet, Ipv6Repr, NdiscNeighborFlags, NdiscRepr,
};
use tracing::debug;

use super::shared::Shared;
use crate::transport::xdp::iface::IfaceInfo;
use crate::transport::xdp::netlink::NUD_FAILED;

/// Give up resolving a neighbour after this long (the kernel's default: 3 probes, 1 s apart).
const NEIGH_TIMEOUT: Duration = Duration::from_millis(3500);
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
    started: StdInstant,
    pub(super) next_check: StdInstant,
    triggered: bool,
}

impl Shared {
    pub(super) fn want_neighbour(&mut self, target: IpAddr, now: StdInstant) {
        if self.neigh.known.contains_key(&target) {
            return;
        }
        self.neigh.pending.entry(target).or_insert(Pending {
            started: now,
            next_check: now,
            triggered: false,
        });
    }

    /// One resolution step for every pending neighbour whose check is due; injects what resolved.
    pub(super) fn resolve_neighbours(&mut self, now: StdInstant) -> bool {
        if self.neigh.pending.is_empty() {
            return false;
        }
        let due: Vec<IpAddr> = self
            .neigh
            .pending
            .iter()
            .filter(|(_, p)| p.next_check <= now)
            .map(|(ip, _)| *ip)
            .collect();
        let mut injected = false;
        for target in due {
            match self.resolve_step(target, now) {
                Ok(Some(mac)) => {
                    self.neigh.pending.remove(&target);
                    self.neigh.failed.remove(&target);
                    self.inject_neighbour(target, mac, now);
                    injected = true;
                }
                Ok(None) => {}
                Err(reason) => {
                    debug!(%target, reason, "neighbour resolution failed");
                    self.neigh.pending.remove(&target);
                    self.neigh.failed.insert(target, now);
                }
            }
        }
        injected
    }

    pub(super) fn resolve_step(
        &mut self,
        target: IpAddr,
        now: StdInstant,
    ) -> Result<Option<[u8; 6]>, &'static str> {
        let route = self.nl.route_get(target).map_err(|_| "no route")?;
        if route.oif != self.info.index {
            return Err("the route leaves through another interface");
        }
        let hop = route.next_hop(target);
        let entry = self
            .nl
            .neigh_get(self.info.index, hop)
            .map_err(|_| "neighbour lookup failed")?;
        if let Some(mac) = entry.and_then(|n| n.usable()) {
            return Ok(Some(mac));
        }
        let p = self.neigh.pending.get_mut(&target).expect("pending");
        if p.triggered && entry.is_some_and(|n| n.state & NUD_FAILED != 0) {
            return Err("the kernel could not resolve the next hop");
        }
        if now.duration_since(p.started) > NEIGH_TIMEOUT {
            return Err("timed out");
        }
        if !p.triggered {
            p.triggered = true;
            if let Err(e) = self.nl.neigh_resolve(self.info.index, hop) {
                crate::warn_limited!(%hop, error = %e, "asking the kernel to resolve a neighbour");
            }
        }
        let waited = now.duration_since(p.started);
        p.next_check = now + (waited / 4).clamp(Duration::from_micros(500), Duration::from_millis(50));
        Ok(None)
    }

    /// Queues a synthetic ARP reply / Neighbor Advertisement "target is at mac" for smoltcp.
    pub(super) fn inject_neighbour(&mut self, target: IpAddr, mac: [u8; 6], now: StdInstant) {
        if let Some(frame) = neighbour_frame(&self.info, target, mac) {
            self.dev.rx_frames.push_back(frame);
            self.neigh.known.insert(target, (mac, now));
            self.sets.neighbour_known(target);
        }
    }
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
