//! The RDMA port space: ephemeral ports 49152-65535, explicit binds, shared endpoints, and the 4-tuple
//! registry (docs/connector-semantics.md "Port space"; IND2Connector::Bind, NdkConnectWithSharedEndpoint).
//!
//! Every port soft-rdma holds is also held in the host's TCP port space through [`HostPorts`], so host
//! applications and soft-rdma never collide (IND2Connector::Connect remarks: "a port mapping service must be
//! provided by the provider to map NetworkDirect ports to host TCP ports").
//!
//! Allocation is O(1) amortized and first-in first-out: the free ephemeral ports are a queue, a port given
//! back joins its end, and allocation takes from its front, so a port is handed out again only after every
//! other free port was (a just-released port is in TIME_WAIT on the host for a minute: handing it out again
//! at once would only find it busy). Taking a specific port leaves a tombstone in the queue (its sequence
//! number no longer matches), skipped when allocation reaches it.
//!
//! A free port the host holds (TIME_WAIT after soft-rdma closed a connection first, or another application)
//! is skipped and moved to the back of the queue; an allocation tries every free port at most once, so
//! TOO_MANY_ADDRESSES means that no free port is usable, not that the first few were busy.
//!
//! Per-session shares ([`Limits`]): the engine names the session it acts for ([`PortSpace::act_for`]) and
//! each binding made meanwhile is that session's until released. A session holds at most
//! `max_ports_per_session` ports (each is a socket in the daemon: INSUFFICIENT_RESOURCES past it) and at most
//! `max_ephemeral_ports_per_session` of 49152-65535 (TOO_MANY_ADDRESSES past it, as when the range is used
//! up), so one session cannot take the descriptors or the ephemeral range from the others.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, SocketAddr};

use super::ids::SessionId;
use super::limits::{Limit, LimitHits, Limits};
use super::transport_seam::{ConnectFailure, HostPorts};
use crate::error::{Error, NdStatus, Result};

/// First port of the ephemeral range (docs/connector-semantics.md: 49152-65535).
pub const EPHEMERAL_FIRST: u16 = 49152;
/// Last port of the ephemeral range.
pub const EPHEMERAL_LAST: u16 = 65535;
/// 16,384 ports.
pub const EPHEMERAL_COUNT: usize = (EPHEMERAL_LAST - EPHEMERAL_FIRST) as usize + 1;
const NOT_FREE: u64 = u64::MAX;

/// One holder of a port on one local IP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Binding {
    ip: IpAddr,
    /// A shared endpoint: many connections (distinct destinations) from this addr:port.
    shared: bool,
    /// The session that made it, if it was made for one ([`PortSpace::act_for`]).
    owner: Option<SessionId>,
}

/// Ports one session holds, against its shares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionPorts {
    /// Every port it holds.
    pub ports: usize,
    /// Those in 49152-65535.
    pub ephemeral: usize,
}

/// The port space. Not thread-safe by design: the engine owns it.
#[derive(Debug)]
pub struct PortSpace {
    /// Ports in use, with their holders (usually one).
    bound: HashMap<u16, Vec<Binding>>,
    /// Free ephemeral ports in allocation order (front first), with tombstones: an entry counts only if its
    /// sequence number (`head` + its position) equals `free_seq` of its port.
    free: VecDeque<u16>,
    /// The sequence number of `free`'s front entry.
    head: u64,
    /// For each ephemeral port: the sequence number of its live entry in `free`, or NOT_FREE.
    free_seq: Vec<u64>,
    /// Live entries in `free`.
    free_live: usize,
    /// Established or connecting (local, remote) pairs.
    tuples: HashSet<(SocketAddr, SocketAddr)>,
    /// The session bindings are made for now, if any.
    acting: Option<SessionId>,
    /// What each session holds (sessions holding nothing are not kept).
    held: HashMap<SessionId, SessionPorts>,
    max_ports_per_session: usize,
    max_ephemeral_per_session: usize,
    /// How often each per-session share refused a bind.
    hits: LimitHits,
}

impl Default for PortSpace {
    fn default() -> Self {
        Self::new()
    }
}

/// The host could not give a socket for `local` (file descriptor limit, kernel memory).
fn no_resources(local: SocketAddr) -> Error {
    Error::new(
        NdStatus::InsufficientResources,
        format!(
            "no socket for {local}: out of file descriptors or kernel memory (each soft-rdma port and \
             connection is a socket; see soft-rdmad's RLIMIT_NOFILE)"
        ),
    )
}

fn family_wildcard_conflict(a: IpAddr, b: IpAddr) -> bool {
    // A wildcard bind conflicts with every address of its family, and two binds of the same address conflict.
    a == b || (a.is_ipv4() == b.is_ipv4() && (a.is_unspecified() || b.is_unspecified()))
}

impl PortSpace {
    /// A port space with the per-session shares of `limits`.
    pub fn with_limits(limits: &Limits) -> Self {
        PortSpace {
            max_ports_per_session: limits.max_ports_per_session,
            max_ephemeral_per_session: limits.max_ephemeral_ports_per_session,
            ..Self::new()
        }
    }

    /// Bindings made from now on belong to `session` (`None`: to no session, unbounded).
    pub fn act_for(&mut self, session: Option<SessionId>) {
        self.acting = session;
    }

    /// The ports `session` holds.
    pub fn held_by(&self, session: SessionId) -> SessionPorts {
        self.held.get(&session).copied().unwrap_or_default()
    }

    /// The acting session's shares, before it binds `port` (0: any ephemeral port).
    fn check_share(&self, port: u16) -> Result<()> {
        let Some(session) = self.acting else {
            return Ok(());
        };
        let held = self.held_by(session);
        if held.ports >= self.max_ports_per_session {
            self.hits.hit(Limit::PortsPerSession);
            return Err(Error::new(
                NdStatus::InsufficientResources,
                format!(
                    "this session holds {} ports, the per-session limit (--max-ports-per-session); close some \
                     first",
                    held.ports
                ),
            ));
        }
        if (port == 0 || Self::is_ephemeral(port)) && held.ephemeral >= self.max_ephemeral_per_session {
            self.hits.hit(Limit::EphemeralPortsPerSession);
            return Err(Error::new(
                NdStatus::TooManyAddresses,
                format!(
                    "this session holds {} ports of {EPHEMERAL_FIRST}-{EPHEMERAL_LAST}, its share of the range \
                     (--max-ephemeral-ports-per-session)",
                    held.ephemeral
                ),
            ));
        }
        Ok(())
    }

    /// Records a new binding of `local` for the acting session.
    fn hold(&mut self, local: SocketAddr, shared: bool) {
        let owner = self.acting;
        self.bound.entry(local.port()).or_default().push(Binding {
            ip: local.ip(),
            shared,
            owner,
        });
        if let Some(session) = owner {
            let h = self.held.entry(session).or_default();
            h.ports += 1;
            h.ephemeral += usize::from(Self::is_ephemeral(local.port()));
        }
    }

    /// Forgets a binding of `port` that `owner` held.
    fn unhold(&mut self, owner: Option<SessionId>, port: u16) {
        let Some(session) = owner else { return };
        if let Some(h) = self.held.get_mut(&session) {
            h.ports = h.ports.saturating_sub(1);
            h.ephemeral = h.ephemeral.saturating_sub(usize::from(Self::is_ephemeral(port)));
            if h.ports == 0 {
                self.held.remove(&session);
            }
        }
    }

    pub fn new() -> Self {
        // 49152 first, then upwards.
        let free: VecDeque<u16> = (EPHEMERAL_FIRST..=EPHEMERAL_LAST).collect();
        let free_seq = (0..EPHEMERAL_COUNT as u64).collect();
        PortSpace {
            bound: HashMap::new(),
            free,
            head: 0,
            free_seq,
            free_live: EPHEMERAL_COUNT,
            tuples: HashSet::new(),
            acting: None,
            held: HashMap::new(),
            max_ports_per_session: usize::MAX,
            max_ephemeral_per_session: usize::MAX,
            hits: LimitHits::default(),
        }
    }

    /// How often each per-session share refused a bind.
    pub fn hits(&self) -> &LimitHits {
        &self.hits
    }

    /// Ephemeral ports not in use.
    pub fn free_count(&self) -> usize {
        self.free_live
    }

    /// Distinct ports in use (ephemeral or not).
    pub fn in_use_count(&self) -> usize {
        self.bound.len()
    }

    fn is_ephemeral(port: u16) -> bool {
        port >= EPHEMERAL_FIRST
    }

    fn take_free(&mut self, port: u16) {
        if !Self::is_ephemeral(port) {
            return;
        }
        let slot = (port - EPHEMERAL_FIRST) as usize;
        if self.free_seq[slot] != NOT_FREE {
            // Its entry in the queue becomes a tombstone.
            self.free_seq[slot] = NOT_FREE;
            self.free_live -= 1;
        }
    }

    fn give_free(&mut self, port: u16) {
        if !Self::is_ephemeral(port) {
            return;
        }
        let slot = (port - EPHEMERAL_FIRST) as usize;
        if self.free_seq[slot] != NOT_FREE {
            return;
        }
        self.free_seq[slot] = self.head + self.free.len() as u64;
        self.free.push_back(port);
        self.free_live += 1;
    }

    /// The free port that has waited longest (skipping tombstones), still free.
    fn oldest_free(&mut self) -> Option<u16> {
        while let Some(&port) = self.free.front() {
            if self.free_seq[(port - EPHEMERAL_FIRST) as usize] == self.head {
                return Some(port);
            }
            self.free.pop_front();
            self.head += 1;
        }
        None
    }

    fn conflicts(&self, local: SocketAddr, shared: bool) -> bool {
        self.bound.get(&local.port()).is_some_and(|holders| {
            holders.iter().any(|b| {
                family_wildcard_conflict(b.ip, local.ip()) && !(shared && b.shared && b.ip == local.ip())
            })
        })
    }

    /// Binds `local`. Port 0 allocates an ephemeral port (TOO_MANY_ADDRESSES when none is free);
    /// an explicit port already held gives SHARING_VIOLATION, as does one the host holds; an IP that is not
    /// the host's gives INVALID_ADDRESS (IND2Connector::Bind, docs/connector-semantics.md "The active side" 1).
    /// `shared`: a shared endpoint (NdkCreateSharedEndpoint); binding the same addr:port shared twice fails.
    /// Past the acting session's shares: INSUFFICIENT_RESOURCES (ports) or TOO_MANY_ADDRESSES (ephemeral).
    pub fn bind(&mut self, local: SocketAddr, shared: bool, host: &mut dyn HostPorts) -> Result<SocketAddr> {
        self.bind_as(local, shared, false, host)
    }

    /// [`PortSpace::bind`] for a listener ([`HostPorts::reserve_listener`]).
    pub fn bind_listener(&mut self, local: SocketAddr, host: &mut dyn HostPorts) -> Result<SocketAddr> {
        self.bind_as(local, false, true, host)
    }

    fn bind_as(
        &mut self,
        local: SocketAddr,
        shared: bool,
        listener: bool,
        host: &mut dyn HostPorts,
    ) -> Result<SocketAddr> {
        let reserve = |host: &mut dyn HostPorts, at: SocketAddr| {
            if listener {
                host.reserve_listener(at)
            } else {
                host.reserve(at, shared)
            }
        };
        self.check_share(local.port())?;
        if local.port() != 0 {
            if self.conflicts(local, false) {
                return Err(Error::new(
                    NdStatus::SharingViolation,
                    format!("{local} is already bound by soft-rdma"),
                ));
            }
            match reserve(host, local) {
                Ok(()) => {}
                Err(ConnectFailure::AddressInUse) => {
                    return Err(Error::new(
                        NdStatus::SharingViolation,
                        format!("{local} is in use by another application on this host"),
                    ));
                }
                Err(ConnectFailure::AddressNotAvailable) => {
                    return Err(Error::new(
                        NdStatus::InvalidAddress,
                        format!("{} is not an address of this host", local.ip()),
                    ));
                }
                Err(ConnectFailure::NoResources) => return Err(no_resources(local)),
                Err(other) => {
                    return Err(Error::new(
                        NdStatus::Unsuccessful,
                        format!("reserving {local} in the host: {other:?}"),
                    ));
                }
            }
            self.take_free(local.port());
            self.hold(local, shared);
            return Ok(local);
        }
        let mut skipped = Vec::new();
        let result = loop {
            // Every port tried is taken off the queue until the loop ends: each free port at most once.
            let Some(port) = self.oldest_free() else {
                let why = if skipped.is_empty() {
                    format!("no free port in {EPHEMERAL_FIRST}-{EPHEMERAL_LAST}: soft-rdma holds them all")
                } else {
                    format!(
                        "no usable port in {EPHEMERAL_FIRST}-{EPHEMERAL_LAST}: the {} soft-rdma does not hold \
                         are held by the host (TIME_WAIT after an active close, or other applications)",
                        skipped.len()
                    )
                };
                break Err(Error::new(NdStatus::TooManyAddresses, why));
            };
            self.take_free(port);
            let candidate = SocketAddr::new(local.ip(), port);
            match reserve(host, candidate) {
                Ok(()) => {
                    self.hold(candidate, shared);
                    break Ok(candidate);
                }
                Err(ConnectFailure::AddressInUse) => skipped.push(port),
                Err(ConnectFailure::AddressNotAvailable) => {
                    skipped.push(port);
                    break Err(Error::new(
                        NdStatus::InvalidAddress,
                        format!("{} is not an address of this host", local.ip()),
                    ));
                }
                Err(ConnectFailure::NoResources) => {
                    skipped.push(port);
                    break Err(no_resources(candidate));
                }
                Err(other) => {
                    skipped.push(port);
                    break Err(Error::new(
                        NdStatus::Unsuccessful,
                        format!("reserving {candidate} in the host: {other:?}"),
                    ));
                }
            }
        };
        // Ports the host held stay allocatable (the host may free them later), behind every other free port.
        for p in skipped {
            self.give_free(p);
        }
        result
    }

    /// Releases a binding made by [`PortSpace::bind`]; the port returns to the host when its last holder goes.
    pub fn release(&mut self, local: SocketAddr, host: &mut dyn HostPorts) {
        let port = local.port();
        let Some(holders) = self.bound.get_mut(&port) else {
            return;
        };
        let mut released = None;
        if let Some(i) = holders.iter().position(|b| b.ip == local.ip()) {
            released = Some(holders.swap_remove(i).owner);
            host.release(local);
        }
        if holders.is_empty() {
            self.bound.remove(&port);
            self.give_free(port);
        }
        if let Some(owner) = released {
            self.unhold(owner, port);
        }
    }

    /// Registers a connection's 4-tuple: ADDRESS_ALREADY_EXISTS if that exact pair exists
    /// (NdkConnectWithSharedEndpoint: only a duplicate 4-tuple fails).
    pub fn add_tuple(&mut self, local: SocketAddr, remote: SocketAddr) -> Result<()> {
        if !self.tuples.insert((local, remote)) {
            return Err(Error::new(
                NdStatus::AddressAlreadyExists,
                format!("a connection {local} → {remote} already exists"),
            ));
        }
        Ok(())
    }

    pub fn remove_tuple(&mut self, local: SocketAddr, remote: SocketAddr) {
        self.tuples.remove(&(local, remote));
    }

    pub fn has_tuple(&self, local: SocketAddr, remote: SocketAddr) -> bool {
        self.tuples.contains(&(local, remote))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A host port space: what a kernel would say. `foreign` ports are held by other applications; past
    /// `max_sockets` held ports (if set) the host is out of descriptors.
    #[derive(Default)]
    pub(crate) struct FakeHost {
        pub held: HashSet<SocketAddr>,
        pub foreign: HashSet<u16>,
        pub local_ips: Vec<IpAddr>,
        pub max_sockets: Option<usize>,
    }

    impl HostPorts for FakeHost {
        fn reserve(&mut self, local: SocketAddr, _shared: bool) -> Result<(), ConnectFailure> {
            if !local.ip().is_unspecified()
                && !self.local_ips.is_empty()
                && !self.local_ips.contains(&local.ip())
            {
                return Err(ConnectFailure::AddressNotAvailable);
            }
            if self.foreign.contains(&local.port()) {
                return Err(ConnectFailure::AddressInUse);
            }
            if self.max_sockets.is_some_and(|m| self.held.len() >= m) {
                return Err(ConnectFailure::NoResources);
            }
            self.held.insert(local);
            Ok(())
        }
        fn release(&mut self, local: SocketAddr) {
            self.held.remove(&local);
        }
    }

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// A released port is handed out again only after every other free port (it may be in TIME_WAIT on the
    /// host); an explicitly bound free port is skipped by allocation and comes back at the end when released.
    #[test]
    fn allocation_is_first_in_first_out() {
        let (mut ps, mut host) = (PortSpace::new(), FakeHost::default());
        let any = sa("0.0.0.0:0");
        let a = ps.bind(any, false, &mut host).unwrap();
        assert_eq!(a.port(), EPHEMERAL_FIRST);
        ps.release(a, &mut host);
        let b = ps.bind(any, false, &mut host).unwrap();
        assert_eq!(b.port(), EPHEMERAL_FIRST + 1, "not the port just released");
        // An explicit bind of a free port in the middle of the queue: allocation skips it.
        ps.bind(sa("0.0.0.0:49154"), false, &mut host).unwrap();
        assert_eq!(ps.bind(any, false, &mut host).unwrap().port(), 49155);
        ps.release(sa("0.0.0.0:49154"), &mut host);
        assert_eq!(ps.free_count(), EPHEMERAL_COUNT - 2);
        // Everything else first, then 49152 (released first), then 49154 (released second).
        let mut order = Vec::new();
        while let Ok(x) = ps.bind(any, false, &mut host) {
            order.push(x.port());
        }
        assert_eq!(order.len(), EPHEMERAL_COUNT - 2);
        assert_eq!(&order[order.len() - 2..], &[49152, 49154]);
        assert_eq!(ps.free_count(), 0);
    }

    #[test]
    fn explicit_and_wildcard_conflicts() {
        let (mut ps, mut host) = (PortSpace::new(), FakeHost::default());
        ps.bind(sa("10.0.0.1:5000"), false, &mut host).unwrap();
        let e = ps.bind(sa("10.0.0.1:5000"), false, &mut host).unwrap_err();
        assert_eq!(e.status, NdStatus::SharingViolation);
        assert_eq!(
            ps.bind(sa("0.0.0.0:5000"), false, &mut host).unwrap_err().status,
            NdStatus::SharingViolation
        );
        ps.bind(sa("10.0.0.2:5000"), false, &mut host).unwrap();
        ps.bind(sa("[::1]:5000"), false, &mut host).unwrap();
        ps.release(sa("10.0.0.1:5000"), &mut host);
        ps.release(sa("10.0.0.2:5000"), &mut host);
        ps.bind(sa("0.0.0.0:5000"), false, &mut host).unwrap();
        assert!(host.held.contains(&sa("0.0.0.0:5000")));
    }

    #[test]
    fn host_held_ports_and_foreign_addresses() {
        let mut host = FakeHost {
            foreign: [50000].into(),
            local_ips: vec![sa("10.0.0.1:0").ip()],
            ..Default::default()
        };
        let mut ps = PortSpace::new();
        let e = ps.bind(sa("10.0.0.1:50000"), false, &mut host).unwrap_err();
        assert_eq!(e.status, NdStatus::SharingViolation);
        let e = ps.bind(sa("10.9.9.9:7000"), false, &mut host).unwrap_err();
        assert_eq!(e.status, NdStatus::InvalidAddress);
        // An allocation skips the host-held port and the skipped port stays allocatable later.
        let before = ps.free_count();
        for _ in 0..EPHEMERAL_COUNT - 1 {
            let a = ps.bind(sa("10.0.0.1:0"), false, &mut host).unwrap();
            assert_ne!(a.port(), 50000);
        }
        assert_eq!(before, EPHEMERAL_COUNT);
        assert_eq!(
            ps.bind(sa("10.0.0.1:0"), false, &mut host).unwrap_err().status,
            NdStatus::TooManyAddresses
        );
        host.foreign.clear();
        assert_eq!(ps.bind(sa("10.0.0.1:0"), false, &mut host).unwrap().port(), 50000);
    }

    /// Ports held by the host at the front of the queue (TIME_WAIT after soft-rdma closed those connections
    /// first) are skipped however many there are, and go to the back: TOO_MANY_ADDRESSES only when no free
    /// port is usable.
    #[test]
    fn host_held_ports_at_the_front_are_all_skipped() {
        let (mut ps, mut host) = (PortSpace::new(), FakeHost::default());
        let any = sa("0.0.0.0:0");
        let all: Vec<SocketAddr> = (0..EPHEMERAL_COUNT)
            .map(|_| ps.bind(any, false, &mut host).unwrap())
            .collect();
        // 1,000 released while the host keeps them (TIME_WAIT), then 10 the host lets go at once.
        for a in &all[..1000] {
            ps.release(*a, &mut host);
            host.foreign.insert(a.port());
        }
        let e = ps.bind(any, false, &mut host).unwrap_err();
        assert_eq!(e.status, NdStatus::TooManyAddresses);
        assert!(e.context.contains("held by the host"), "{e}");
        assert_eq!(
            ps.free_count(),
            1000,
            "the held ports stay free in soft-rdma's view"
        );
        for a in &all[1000..1010] {
            ps.release(*a, &mut host);
        }
        let mut got: Vec<u16> = (0..10)
            .map(|_| ps.bind(any, false, &mut host).unwrap().port())
            .collect();
        got.sort_unstable();
        let want: Vec<u16> = all[1000..1010].iter().map(|a| a.port()).collect();
        assert_eq!(got, want, "the 10 usable ports, behind 1,000 held ones");
        assert!(ps.bind(any, false, &mut host).is_err());
        // TIME_WAIT ends: the held ports are usable again, oldest first.
        host.foreign.clear();
        assert_eq!(ps.bind(any, false, &mut host).unwrap(), all[0]);
    }

    /// Out of descriptors (EMFILE) is INSUFFICIENT_RESOURCES, for allocation and explicit binds alike, and
    /// the port tried stays free.
    #[test]
    fn out_of_descriptors_is_insufficient_resources() {
        let mut host = FakeHost {
            max_sockets: Some(3),
            ..Default::default()
        };
        let mut ps = PortSpace::new();
        for _ in 0..3 {
            ps.bind(sa("0.0.0.0:0"), false, &mut host).unwrap();
        }
        let e = ps.bind(sa("0.0.0.0:0"), false, &mut host).unwrap_err();
        assert_eq!(e.status, NdStatus::InsufficientResources, "{e}");
        let e = ps.bind(sa("0.0.0.0:6000"), false, &mut host).unwrap_err();
        assert_eq!(e.status, NdStatus::InsufficientResources, "{e}");
        assert_eq!(ps.free_count(), EPHEMERAL_COUNT - 3);
        host.max_sockets = None;
        ps.bind(sa("0.0.0.0:0"), false, &mut host).unwrap();
        ps.bind(sa("0.0.0.0:6000"), false, &mut host).unwrap();
    }

    #[test]
    fn exhaustion_at_exactly_16384_and_recovery() {
        let (mut ps, mut host) = (PortSpace::new(), FakeHost::default());
        let mut got = HashSet::new();
        for _ in 0..EPHEMERAL_COUNT {
            let a = ps.bind(sa("0.0.0.0:0"), false, &mut host).unwrap();
            assert!((EPHEMERAL_FIRST..=EPHEMERAL_LAST).contains(&a.port()));
            assert!(got.insert(a.port()), "port {} handed out twice", a.port());
        }
        let e = ps.bind(sa("0.0.0.0:0"), false, &mut host).unwrap_err();
        assert_eq!(e.status, NdStatus::TooManyAddresses);
        ps.release(sa("0.0.0.0:60000"), &mut host);
        assert_eq!(ps.bind(sa("0.0.0.0:0"), false, &mut host).unwrap().port(), 60000);
    }

    /// A session's shares: ephemeral ports past its share are TOO_MANY_ADDRESSES (explicit ones in the range
    /// count too), any port past its port share INSUFFICIENT_RESOURCES; other sessions, and bindings made for
    /// no session, are not affected; released ports give the share back.
    /// What [`PortSpace::held_by`] reports for a session holding `ports`, `ephemeral` of them ephemeral.
    fn held(ports: usize, ephemeral: usize) -> SessionPorts {
        SessionPorts { ports, ephemeral }
    }

    #[test]
    fn per_session_shares() {
        let limits = Limits {
            max_ports_per_session: 4,
            max_ephemeral_ports_per_session: 2,
            ..Limits::default()
        };
        let (mut ps, mut host) = (PortSpace::with_limits(&limits), FakeHost::default());
        let (s1, s2) = (SessionId(1), SessionId(2));
        ps.act_for(Some(s1));
        let e1 = ps.bind(sa("0.0.0.0:0"), false, &mut host).unwrap();
        ps.bind(sa("0.0.0.0:60000"), false, &mut host).unwrap();
        let e = ps.bind(sa("0.0.0.0:0"), false, &mut host).unwrap_err();
        assert_eq!(e.status, NdStatus::TooManyAddresses, "{e}");
        let e = ps.bind(sa("0.0.0.0:60001"), false, &mut host).unwrap_err();
        assert_eq!(e.status, NdStatus::TooManyAddresses, "{e}");
        ps.bind(sa("0.0.0.0:7000"), false, &mut host).unwrap();
        ps.bind_listener(sa("0.0.0.0:7001"), &mut host).unwrap();
        let e = ps.bind(sa("0.0.0.0:7002"), false, &mut host).unwrap_err();
        assert_eq!(e.status, NdStatus::InsufficientResources, "{e}");
        assert_eq!(ps.held_by(s1), held(4, 2));
        let hits = |l| ps.hits().get(l);
        assert_eq!(
            (hits(Limit::EphemeralPortsPerSession), hits(Limit::PortsPerSession)),
            (2, 1),
            "each refusal counted against its share"
        );
        // Another session, and the engine acting for no session, still bind.
        ps.act_for(Some(s2));
        ps.bind(sa("0.0.0.0:0"), false, &mut host).unwrap();
        ps.act_for(None);
        ps.bind(sa("0.0.0.0:0"), false, &mut host).unwrap();
        assert_eq!(ps.held_by(s2), held(1, 1));
        // A release (by whoever) gives the port back to its owner's share.
        ps.release(e1, &mut host);
        assert_eq!(ps.held_by(s1), held(3, 1));
        ps.act_for(Some(s1));
        ps.bind(sa("0.0.0.0:0"), false, &mut host).unwrap();
        assert_eq!(host.held.len(), 6);
    }

    #[test]
    fn four_tuples() {
        let mut ps = PortSpace::new();
        ps.add_tuple(sa("10.0.0.1:50000"), sa("10.0.0.2:7000")).unwrap();
        ps.add_tuple(sa("10.0.0.1:50000"), sa("10.0.0.2:7001")).unwrap();
        let e = ps
            .add_tuple(sa("10.0.0.1:50000"), sa("10.0.0.2:7000"))
            .unwrap_err();
        assert_eq!(e.status, NdStatus::AddressAlreadyExists);
        ps.remove_tuple(sa("10.0.0.1:50000"), sa("10.0.0.2:7000"));
        ps.add_tuple(sa("10.0.0.1:50000"), sa("10.0.0.2:7000")).unwrap();
    }

    proptest! {
        /// Any sequence of allocations and frees keeps: free + in-use ephemeral = 16,384; no port twice;
        /// the host holds exactly what soft-rdma holds.
        #[test]
        fn allocate_free_invariants(ops in proptest::collection::vec((any::<bool>(), any::<u16>()), 1..400)) {
            let (mut ps, mut host) = (PortSpace::new(), FakeHost::default());
            let mut held: Vec<SocketAddr> = Vec::new();
            for (alloc, pick) in ops {
                if alloc || held.is_empty() {
                    let a = ps.bind(sa("0.0.0.0:0"), false, &mut host).unwrap();
                    prop_assert!(!held.contains(&a));
                    held.push(a);
                } else {
                    let a = held.swap_remove(pick as usize % held.len());
                    ps.release(a, &mut host);
                }
                prop_assert_eq!(ps.free_count() + held.len(), EPHEMERAL_COUNT);
                prop_assert_eq!(host.held.len(), held.len());
            }
        }
    }
}
