//! Addresses of rdma_cm ids: `rdma_bind_addr`, `rdma_resolve_addr` (the source address picked as the
//! kernel picks it: a UDP socket's `connect` and `getsockname`), `rdma_resolve_route`, the ports
//! (`rdma_get_src_port`, `rdma_get_dst_port`) and `rdma_getaddrinfo`/`rdma_freeaddrinfo`.
//!
//! IPv4 and IPv6 only: AF_IB addresses are InfiniBand's (EAFNOSUPPORT). Port 0 takes a port of soft-rdma's
//! 49152–65535 when the connector is bound (docs/connection-management.md, "Ports"): at `rdma_bind_addr`
//! already, as the kernel's `cma_get_port`, held by a bound connector until the id listens or resolves.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::sync::Arc;

use libc::{c_char, c_int, sockaddr, sockaddr_in, sockaddr_in6, sockaddr_storage};

use super::{EventData, Id, id};
use crate::abi::*;
use crate::errno::errno_of;
use crate::export::{CCell, CObject, Errno, Registry, export, guard, ret_minus_one};
use crate::state;

/// A C socket address as Rust's.
pub(crate) fn from_sockaddr(p: *const sockaddr) -> Result<SocketAddr, Errno> {
    if p.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's address, read as the family it says it is.
    unsafe {
        match c_int::from((*p).sa_family) {
            libc::AF_INET => {
                let a = &*p.cast::<sockaddr_in>();
                Ok(SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                    u16::from_be(a.sin_port),
                )))
            }
            libc::AF_INET6 => {
                let a = &*p.cast::<sockaddr_in6>();
                Ok(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(a.sin6_addr.s6_addr),
                    u16::from_be(a.sin6_port),
                    a.sin6_flowinfo,
                    a.sin6_scope_id,
                )))
            }
            // AF_IB (rdma/rdma_cma.h, `struct sockaddr_ib`): InfiniBand addressing.
            27 => Err(libc::EAFNOSUPPORT),
            _ => Err(libc::EAFNOSUPPORT),
        }
    }
}

/// Writes `a` into a `sockaddr_storage`.
pub(crate) fn to_sockaddr(dst: &mut sockaddr_storage, a: SocketAddr) -> libc::socklen_t {
    // SAFETY: all-zero is a valid sockaddr_storage.
    *dst = unsafe { std::mem::zeroed() };
    match a {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage holds any sockaddr.
            let s = unsafe { &mut *(dst as *mut sockaddr_storage).cast::<sockaddr_in>() };
            s.sin_family = libc::AF_INET as libc::sa_family_t;
            s.sin_port = v4.port().to_be();
            s.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            std::mem::size_of::<sockaddr_in>() as libc::socklen_t
        }
        SocketAddr::V6(v6) => {
            // SAFETY: as above.
            let s = unsafe { &mut *(dst as *mut sockaddr_storage).cast::<sockaddr_in6>() };
            s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            s.sin6_port = v6.port().to_be();
            s.sin6_addr.s6_addr = v6.ip().octets();
            s.sin6_flowinfo = v6.flowinfo();
            s.sin6_scope_id = v6.scope_id();
            std::mem::size_of::<sockaddr_in6>() as libc::socklen_t
        }
    }
}

impl Id {
    /// Records the id's local address (and in `route.addr.src_addr`, where programs read it).
    pub(crate) fn set_local(&self, a: SocketAddr) {
        self.lock().local = Some(a);
        // SAFETY: the live id's field.
        unsafe { to_sockaddr(&mut (*self.ibv()).route.addr.src, a) };
    }

    pub(crate) fn set_remote(&self, a: SocketAddr) {
        self.lock().remote = Some(a);
        // SAFETY: the live id's field.
        unsafe { to_sockaddr(&mut (*self.ibv()).route.addr.dst, a) };
    }
}

/// The source address the kernel would pick to reach `dst` (its routing table, via a UDP socket).
pub(crate) fn source_for(dst: SocketAddr) -> Result<IpAddr, Errno> {
    let any: SocketAddr = match dst {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let probe = UdpSocket::bind(any).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
    let mut target = dst;
    if target.port() == 0 {
        target.set_port(9);
    }
    probe
        .connect(target)
        .map_err(|e| e.raw_os_error().unwrap_or(libc::ENETUNREACH))?;
    Ok(probe
        .local_addr()
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?
        .ip())
}

export!("RDMACM_1.0";
fn rdma_bind_addr(p: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    ret_minus_one("rdma_bind_addr", || {
        let id = id(p)?;
        let a = from_sockaddr(addr)?;
        if id.lock().local.is_some() {
            return Err(libc::EINVAL);
        }
        // A wildcard address names no device (rdma-core leaves `verbs` NULL then).
        if !a.ip().is_unspecified() {
            id.set_verbs()?;
        }
        if a.port() == 0 {
            // The kernel's rdma_bind_addr picks the port at once (`cma_get_port`), so `rdma_get_src_port`
            // names it before `rdma_listen`: qperf's `-cm1` server sends it to its client then. The port is
            // held by a bound connector until the id listens or connects ([`release_reservation`]).
            let bound = bind_connector(&id, a, "rdma_bind_addr")?;
            id.set_local(bound);
        } else {
            id.set_local(a);
        }
        Ok(())
    })
});

/// Gives back the port `rdma_bind_addr` held for an id not yet resolved (a connector bound, no remote), so
/// that `rdma_listen` or `rdma_resolve_addr` can take it again: the close goes to soft-rdmad before their
/// own request, on the same session.
pub(crate) fn release_reservation(id: &Id) {
    let mut s = id.lock();
    if s.remote.is_none() && s.listener.is_none() {
        drop(s.connector.take());
    }
}

export!("RDMACM_1.0";
/// Picks the source address, binds the id's connector (port 0: soft-rdma's range) and reports
/// RDMA_CM_EVENT_ADDR_RESOLVED, or RDMA_CM_EVENT_ADDR_ERROR with the bind's errno.
fn rdma_resolve_addr(p: *mut rdma_cm_id, src: *mut sockaddr, dst: *mut sockaddr, _timeout_ms: c_int) -> c_int {
    ret_minus_one("rdma_resolve_addr", || {
        let id = id(p)?;
        let remote = from_sockaddr(dst)?;
        let local = match (src.is_null(), id.lock().local) {
            (false, _) => from_sockaddr(src)?,
            (true, Some(l)) => l,
            (true, None) => SocketAddr::new(
                match remote {
                    SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
                    SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
                },
                0,
            ),
        };
        let local = if local.ip().is_unspecified() {
            SocketAddr::new(source_for(remote)?, local.port())
        } else {
            local
        };
        release_reservation(&id);
        id.set_remote(remote);
        id.set_verbs()?;
        match bind_connector(&id, local, "rdma_resolve_addr") {
            Ok(bound) => {
                id.set_local(bound);
                id.deliver(RDMA_CM_EVENT_ADDR_RESOLVED, EventData::default());
            }
            Err(e) => {
                id.set_local(local);
                id.deliver(RDMA_CM_EVENT_ADDR_ERROR, EventData { status: -e, ..EventData::default() });
            }
        }
        id.complete(RDMA_CM_EVENT_ADDR_RESOLVED)
    })
});

/// Makes the id's connector and binds it to `local`; the address bound.
fn bind_connector(id: &Arc<Id>, local: SocketAddr, call: &str) -> Result<SocketAddr, Errno> {
    let adapter = id.process.adapter.clone();
    let (connector, bound) = state::block_on(async move {
        let c = adapter.create_connector().await?;
        let bound = c.bind(local).await?;
        Ok::<_, soft_rdma::Error>((c, bound))
    })
    .map_err(|e| {
        tracing::warn!(error = %e, %local, "{call}: soft-rdma could not bind");
        errno_of(&e)
    })?;
    id.lock().connector = Some(Arc::new(connector));
    Ok(bound)
}

export!("RDMACM_1.0";
/// iWARP has no path records: the route is the address (RDMA_CM_EVENT_ROUTE_RESOLVED at once).
fn rdma_resolve_route(p: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    ret_minus_one("rdma_resolve_route", || {
        let id = id(p)?;
        let s = id.lock();
        if s.connector.is_none() || s.remote.is_none() {
            return Err(libc::EINVAL);
        }
        drop(s);
        id.deliver(RDMA_CM_EVENT_ROUTE_RESOLVED, EventData::default());
        id.complete(RDMA_CM_EVENT_ROUTE_RESOLVED)
    })
});

export!("RDMACM_1.0";
/// The local port, in network byte order (0 when unbound).
fn rdma_get_src_port(p: *mut rdma_cm_id) -> u16 {
    guard("rdma_get_src_port", 0, || id(p).ok().and_then(|id| id.lock().local).map_or(0, |a| a.port().to_be()))
});

export!("RDMACM_1.0";
fn rdma_get_dst_port(p: *mut rdma_cm_id) -> u16 {
    guard("rdma_get_dst_port", 0, || id(p).ok().and_then(|id| id.lock().remote).map_or(0, |a| a.port().to_be()))
});

/// One `struct rdma_addrinfo` and the addresses it points at.
#[repr(C)]
struct AddrInfo {
    c: CCell<rdma_addrinfo>,
    src: Box<sockaddr_storage>,
    dst: Box<sockaddr_storage>,
}

// SAFETY: #[repr(C)], the C struct first.
unsafe impl CObject for AddrInfo {
    type C = rdma_addrinfo;
    const KIND: &'static str = "rdma_addrinfo";
}

static ADDRINFOS: Registry<AddrInfo> = Registry::new();

/// `node`/`service` as socket addresses (getaddrinfo(3): numeric or names, IPv4 and IPv6).
fn lookup(
    node: *const c_char,
    service: *const c_char,
    family: c_int,
    passive: bool,
) -> Result<Vec<SocketAddr>, Errno> {
    // SAFETY: all-zero is a valid addrinfo hint.
    let mut hints: libc::addrinfo = unsafe { std::mem::zeroed() };
    hints.ai_family = family;
    hints.ai_socktype = libc::SOCK_STREAM;
    hints.ai_flags = if passive { libc::AI_PASSIVE } else { 0 };
    let mut res: *mut libc::addrinfo = std::ptr::null_mut();
    // SAFETY: C strings (or NULL) from the caller; res is freed below.
    let rc = unsafe { libc::getaddrinfo(node, service, &hints, &mut res) };
    if rc != 0 {
        // rdma_getaddrinfo(3): a getaddrinfo failure is -1 with errno (EADDRNOTAVAIL for an unknown name).
        return Err(if rc == libc::EAI_SYSTEM {
            crate::export::errno()
        } else {
            libc::EADDRNOTAVAIL
        });
    }
    let mut out = Vec::new();
    let mut at = res;
    while !at.is_null() {
        // SAFETY: getaddrinfo's list.
        let ai = unsafe { &*at };
        if let Ok(a) = from_sockaddr(ai.ai_addr) {
            out.push(a);
        }
        at = ai.ai_next;
    }
    // SAFETY: the list getaddrinfo made.
    unsafe { libc::freeaddrinfo(res) };
    out.first().map(|_| out.clone()).ok_or(libc::EADDRNOTAVAIL)
}

export!("RDMACM_1.0";
/// One result for the first address `node`/`service` resolve to: passive (RAI_PASSIVE) → `ai_src_addr`,
/// active → `ai_dst_addr` (and `ai_src_addr` when the hints give one); RC over RDMA_PS_TCP.
fn rdma_getaddrinfo(node: *const c_char, service: *const c_char, hints: *const rdma_addrinfo, res: *mut *mut rdma_addrinfo) -> c_int {
    ret_minus_one("rdma_getaddrinfo", || {
        if res.is_null() || (node.is_null() && service.is_null()) {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's hints, if any.
        let hints = unsafe { hints.as_ref() };
        let flags = hints.map_or(0, |h| h.ai_flags);
        let family = hints.map_or(libc::AF_UNSPEC, |h| h.ai_family);
        if family != libc::AF_UNSPEC && family != libc::AF_INET && family != libc::AF_INET6 {
            return Err(libc::EAFNOSUPPORT);
        }
        if let Some(h) = hints {
            if h.ai_qp_type != 0 && h.ai_qp_type != IBV_QPT_RC {
                return Err(libc::ENOSYS);
            }
            if h.ai_port_space != 0 && h.ai_port_space != RDMA_PS_TCP {
                return Err(libc::ENOSYS);
            }
        }
        let passive = flags & RAI_PASSIVE != 0;
        let addr = lookup(node, service, family, passive)?[0];
        // SAFETY: all-zero storage.
        let (mut src, mut dst): (Box<sockaddr_storage>, Box<sockaddr_storage>) =
            unsafe { (Box::new(std::mem::zeroed()), Box::new(std::mem::zeroed())) };
        let (mut src_len, mut dst_len) = (0, 0);
        if passive {
            src_len = to_sockaddr(&mut src, addr);
        } else {
            dst_len = to_sockaddr(&mut dst, addr);
            if let Some(h) = hints.filter(|h| !h.ai_src_addr.is_null()) {
                src_len = to_sockaddr(&mut src, from_sockaddr(h.ai_src_addr)?);
            }
        }
        let info = Arc::new(AddrInfo {
            c: CCell::new(rdma_addrinfo {
                ai_flags: flags,
                ai_family: if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 },
                ai_qp_type: IBV_QPT_RC,
                ai_port_space: RDMA_PS_TCP,
                ai_src_len: src_len,
                ai_dst_len: dst_len,
                ai_src_addr: if src_len > 0 { (&raw mut *src).cast() } else { std::ptr::null_mut() },
                ai_dst_addr: if dst_len > 0 { (&raw mut *dst).cast() } else { std::ptr::null_mut() },
                ai_src_canonname: std::ptr::null_mut(),
                ai_dst_canonname: std::ptr::null_mut(),
                ai_route_len: 0,
                ai_route: std::ptr::null_mut(),
                ai_connect_len: 0,
                ai_connect: std::ptr::null_mut(),
                ai_next: std::ptr::null_mut(),
            }),
            src,
            dst,
        });
        // SAFETY: the caller's out-parameter.
        unsafe { *res = ADDRINFOS.insert(info) };
        Ok(())
    })
});

export!("RDMACM_1.0";
fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    guard("rdma_freeaddrinfo", (), || {
        let _ = ADDRINFOS.remove(res);
    })
});

/// The addresses an `rdma_addrinfo` of ours names: (source, destination).
pub(crate) fn addrinfo_addrs(
    res: *mut rdma_addrinfo,
) -> Result<(Option<SocketAddr>, Option<SocketAddr>, bool), Errno> {
    let info = ADDRINFOS.get(res)?;
    // SAFETY: the live result's fields.
    let c = unsafe { &*info.c.get() };
    let src = (!c.ai_src_addr.is_null())
        .then(|| from_sockaddr(c.ai_src_addr))
        .transpose()?;
    let dst = (!c.ai_dst_addr.is_null())
        .then(|| from_sockaddr(c.ai_dst_addr))
        .transpose()?;
    Ok((src, dst, c.ai_flags & RAI_PASSIVE != 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addresses_round_trip_through_c() {
        for a in ["10.0.0.2:7174", "[fe80::1]:18515", "0.0.0.0:0"] {
            let a: SocketAddr = a.parse().unwrap();
            // SAFETY: zeroed storage.
            let mut s: sockaddr_storage = unsafe { std::mem::zeroed() };
            to_sockaddr(&mut s, a);
            assert_eq!(from_sockaddr((&raw const s).cast()), Ok(a));
        }
        // SAFETY: zeroed storage.
        let mut ib: sockaddr_storage = unsafe { std::mem::zeroed() };
        ib.ss_family = 27;
        assert_eq!(from_sockaddr((&raw const ib).cast()), Err(libc::EAFNOSUPPORT));
        assert_eq!(from_sockaddr(std::ptr::null()), Err(libc::EINVAL));
    }

    #[test]
    fn the_source_for_loopback_is_loopback() {
        assert_eq!(
            source_for("127.0.0.1:7174".parse().unwrap()),
            Ok(IpAddr::from(Ipv4Addr::LOCALHOST))
        );
    }
}
