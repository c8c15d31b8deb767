//! What both TCP backends of the XDP stack are given ([`Shared`]): smoltcp's `Interface` over the AF_XDP
//! device with its socket sets (in either mode it answers the neighbour frames the stack injects and the
//! segments no TCP claims; on smoltcp's socket its sets also hold the backend's sockets), the neighbours
//! mirrored from the kernel (`neighbours.rs`), routes (rtnetlink), the XDP endpoint map, the events for
//! the engine and the ids of accepted connections. Also the commands both backends carry out ([`Cmd`]).

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant as StdInstant};

use bytes::Bytes;
use smoltcp::iface::{Config, Interface};
use smoltcp::time::Instant;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr};
use tracing::{debug, warn};

use super::neighbours::{NEIGH_TIMEOUT, Neighbours, Pending, neighbour_frame};
use crate::engine::requests::ListenerId;
use crate::engine::transport_seam::{ConnId, ConnectFailure, TransportEvent};
use crate::transport::xdp::iface::IfaceInfo;
use crate::transport::xdp::loader::{Endpoints, endpoint_key};
use crate::transport::xdp::netlink::{NUD_FAILED, Netlink, Route};
use crate::transport::xdp::sets::Sets;
use crate::transport::xdp::xsk::XdpDevice;

pub(in crate::transport::xdp) enum Cmd {
    /// The listening sockets exist when the command returns.
    Listen {
        listener: ListenerId,
        local: SocketAddr,
    },
    StopListening {
        listener: ListenerId,
    },
    Connect {
        conn: ConnId,
        local: SocketAddr,
        remote: SocketAddr,
        /// The kernel's route to `remote`, as the transport looked it up to choose this stack over the
        /// kernel's (`None`: look it up again, which reports why there is none).
        route: Option<Route>,
    },
    Send {
        conn: ConnId,
        data: Bytes,
    },
    Close {
        conn: ConnId,
        abort: bool,
    },
}

/// The stack's parts both TCP backends use (see the module documentation).
pub(super) struct Shared {
    pub(super) iface: Interface,
    pub(super) dev: XdpDevice,
    pub(super) sets: Sets,
    pub(super) info: IfaceInfo,
    pub(super) nl: Netlink,
    /// Events for the engine, taken by `Stack::poll_event`.
    pub(super) events: VecDeque<TransportEvent>,
    pub(super) neigh: Neighbours,
    next_conn: u64,
    pub(super) connect_timeout: Duration,
    /// Time zero of both TCPs' clocks.
    pub(super) start: StdInstant,
    /// The XDP endpoint map: each connection holds its local endpoint there for as long as it lives.
    pub(super) endpoints: Endpoints,
}

impl Shared {
    /// The interface over `dev` with `info`'s MAC and addresses; accepted connections' ids count from
    /// `conn_id_base`.
    pub(super) fn new(
        info: IfaceInfo,
        dev: XdpDevice,
        endpoints: Endpoints,
        connect_timeout: Duration,
        conn_id_base: u64,
        random_seed: u64,
    ) -> anyhow::Result<Shared> {
        let mut dev = dev;
        let start = StdInstant::now();
        let mut config = Config::new(HardwareAddress::Ethernet(EthernetAddress(info.mac)));
        config.random_seed = random_seed;
        let mut iface = Interface::new(config, &mut dev, Instant::from_micros(0));
        iface.update_ip_addrs(|addrs| {
            for a in &info.addrs {
                // Prefix 0: every destination is "on link" for smoltcp; the next hop is the kernel's
                // (see the module documentation of `mod.rs`).
                if addrs.push(IpCidr::new(IpAddress::from(a.addr), 0)).is_err() {
                    warn!(addr = %a.addr, "too many addresses on the interface; ignoring this one");
                }
            }
        });
        let nl = Netlink::open()?;
        Ok(Shared {
            iface,
            dev,
            sets: Sets::new(),
            info,
            nl,
            events: VecDeque::new(),
            neigh: Neighbours::default(),
            next_conn: conn_id_base,
            connect_timeout,
            start,
            endpoints,
        })
    }

    /// The id of a connection just accepted.
    pub(super) fn new_conn_id(&mut self) -> ConnId {
        let conn = ConnId(self.next_conn);
        self.next_conn += 1;
        conn
    }

    /// `now` on smoltcp's clock.
    pub(super) fn ts(&self, now: StdInstant) -> Instant {
        Instant::from_micros(now.duration_since(self.start).as_micros() as i64)
    }

    pub(super) fn emit(&mut self, ev: TransportEvent) {
        // One line per failed connect, as the kernel transport writes it (the suites read it in both modes).
        if let TransportEvent::ConnectFailed { conn, reason } = &ev {
            let timeout = self.connect_timeout;
            debug!(conn = conn.0, ?reason, ?timeout, "connect failed");
        }
        self.events.push_back(ev);
    }

    /// Polls the interface's sets that are due (handing them the received frames left for smoltcp), kicks
    /// TX, and asks the kernel for the neighbours smoltcp solicited.
    pub(super) fn poll_stack(&mut self, now: StdInstant) {
        let ts = self.ts(now);
        self.sets.poll(&mut self.iface, &mut self.dev, ts);
        self.dev.kick();
        for target in std::mem::take(&mut self.dev.solicits) {
            // smoltcp forgot (or never knew) it: ask the kernel again.
            self.neigh.known.remove(&target);
            self.want_neighbour(target, now);
        }
    }

    /// Lets go of `local`'s endpoint in the XDP map (a reference a connection held).
    pub(super) fn release_endpoint(&mut self, local: SocketAddr) {
        let k = endpoint_key(local.ip(), local.port());
        self.endpoints.lock().expect("not poisoned").release(&[k]);
    }

    /// The local address a connect to `remote` uses: `local`'s if it is the interface's, else the route's
    /// preferred source (or the interface's first of the family). Reports ConnectFailed and returns `None`
    /// when there is none.
    pub(super) fn connect_source(
        &mut self,
        conn: ConnId,
        local: SocketAddr,
        remote: SocketAddr,
        route: Option<Route>,
    ) -> Option<IpAddr> {
        let route = match route.map_or_else(|| self.nl.route_get(remote.ip()), Ok) {
            Ok(r) => r,
            Err(e) => {
                let reason = match e.raw_os_error() {
                    Some(libc::EHOSTUNREACH) => ConnectFailure::HostUnreachable,
                    _ => ConnectFailure::NetworkUnreachable,
                };
                self.emit(TransportEvent::ConnectFailed { conn, reason });
                return None;
            }
        };
        let local_ip = if local.ip().is_unspecified() {
            route
                .prefsrc
                .filter(|ip| self.info.has_addr(*ip))
                .or_else(|| self.info.first_of_family(remote.is_ipv4()))
        } else if self.info.has_addr(local.ip()) {
            Some(local.ip())
        } else {
            None
        };
        if local_ip.is_none() {
            self.emit(TransportEvent::ConnectFailed {
                conn,
                reason: ConnectFailure::AddressNotAvailable,
            });
        }
        local_ip
    }
}

/// Neighbours (`neighbours.rs`): asked of the kernel, injected into smoltcp, refreshed, given up on.
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
