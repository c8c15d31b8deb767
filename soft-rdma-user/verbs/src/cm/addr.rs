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

/// Whether a bound address names the device, so that `rdma_bind_addr` sets `verbs`. A wildcard names no
/// device (rdma-core leaves `verbs` NULL then), and neither does a loopback address unless the device
/// stands for `lo` (`iface`): the kernel's `rdma_bind_addr` looks for the device whose GID is the
/// address's interface's (`cma_acquire_dev_by_src_ip`), and siw on an Ethernet interface is not `lo`'s.
/// libfabric's verbs provider counts on it: a passive fi_getinfo with no address binds "localhost" and,
/// finding no device there, advertises the device's own addresses (`vrb_fill_addr` →
/// `vrb_get_srcaddr_devs`), which a peer on another host can reach.
fn names_the_device(ip: IpAddr, iface: &str) -> bool {
    !ip.is_unspecified() && (!ip.is_loopback() || iface == "lo")
}

export!("RDMACM_1.0";
fn rdma_bind_addr(p: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    ret_minus_one("rdma_bind_addr", || {
        let id = id(p)?;
        let a = from_sockaddr(addr)?;
        if id.lock().local.is_some() {
            return Err(libc::EINVAL);
        }
        if names_the_device(a.ip(), &id.process.interface.name) {
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
        id.complete()
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
        id.complete()
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

/// A socket address as the bytes of its `struct sockaddr_*` (at most a `sockaddr_storage`).
type RawAddr = Vec<u8>;

/// What rdma-core reads of `struct rdma_addrinfo` hints (and what a result holds).
#[derive(Debug, Clone, Default, PartialEq)]
struct Rai {
    flags: c_int,
    family: c_int,
    qp_type: c_int,
    port_space: c_int,
    src: Option<RawAddr>,
    dst: Option<RawAddr>,
}

/// The bytes of the caller's address `p` of `len` bytes (None when `len` is 0, as rdma-core tests the
/// length, not the pointer). Longer than a `sockaddr_storage`, or a length without an address: EINVAL.
fn raw_addr(p: *const sockaddr, len: libc::socklen_t) -> Result<Option<RawAddr>, Errno> {
    if len == 0 {
        return Ok(None);
    }
    if p.is_null() || len as usize > std::mem::size_of::<sockaddr_storage>() {
        return Err(libc::EINVAL);
    }
    // SAFETY: `len` bytes of the caller's address, as rdma-core's `ucma_copy_addr` copies them.
    Ok(Some(
        unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len as usize) }.to_vec(),
    ))
}

/// The caller's hints (NULL: all zero, rdma-core's `nohints`).
fn read_hints(p: *const rdma_addrinfo) -> Result<Rai, Errno> {
    // SAFETY: the caller's hints, if any.
    let Some(h) = (unsafe { p.as_ref() }) else {
        return Ok(Rai::default());
    };
    Ok(Rai {
        flags: h.ai_flags,
        family: h.ai_family,
        qp_type: h.ai_qp_type,
        port_space: h.ai_port_space,
        src: raw_addr(h.ai_src_addr, h.ai_src_len)?,
        dst: raw_addr(h.ai_dst_addr, h.ai_dst_len)?,
    })
}

/// The getaddrinfo(3) hints rdma-core makes of an `rdma_addrinfo`'s (`ucma_convert_to_ai`): (flags,
/// family, socktype, protocol).
fn libc_hints(h: &Rai) -> (c_int, c_int, c_int, c_int) {
    let mut flags = 0;
    if h.flags & RAI_PASSIVE != 0 {
        flags |= libc::AI_PASSIVE;
    }
    if h.flags & RAI_NUMERICHOST != 0 {
        flags |= libc::AI_NUMERICHOST;
    }
    let family = if h.family == AF_IB { 0 } else { h.family };
    let socktype = match h.qp_type {
        IBV_QPT_RC | IBV_QPT_UC | IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV => libc::SOCK_STREAM,
        IBV_QPT_UD => libc::SOCK_DGRAM,
        _ => 0,
    };
    let protocol = match h.port_space {
        RDMA_PS_TCP => libc::IPPROTO_TCP,
        RDMA_PS_UDP | RDMA_PS_IPOIB => libc::IPPROTO_UDP,
        RDMA_PS_IB if socktype == libc::SOCK_STREAM => libc::IPPROTO_TCP,
        RDMA_PS_IB if socktype == libc::SOCK_DGRAM => libc::IPPROTO_UDP,
        _ => 0,
    };
    (flags, family, socktype, protocol)
}

/// getaddrinfo(3)'s first answer: (family, socktype, protocol, address).
type Found = (c_int, c_int, c_int, RawAddr);

/// The result rdma-core makes of the hints and getaddrinfo's first answer (`ucma_convert_to_rai`): the
/// QP type and port space the hints' or else the answer's, the address the source when passive and the
/// destination otherwise, `ai_flags` RAI_PASSIVE or nothing. AF_IB results (RAI_FAMILY, AF_IB and
/// RAI_NUMERICHOST) are InfiniBand's: EAFNOSUPPORT.
fn from_lookup(h: &Rai, (family, socktype, protocol, addr): Found) -> Result<Rai, Errno> {
    if h.flags & RAI_FAMILY != 0 && h.family == AF_IB && h.flags & RAI_NUMERICHOST != 0 {
        return Err(libc::EAFNOSUPPORT);
    }
    let qp_type = match (h.qp_type, socktype) {
        (0, libc::SOCK_STREAM) => IBV_QPT_RC,
        (0, libc::SOCK_DGRAM) => IBV_QPT_UD,
        (t, _) => t,
    };
    let port_space = match (h.port_space, protocol) {
        (0, libc::IPPROTO_TCP) => RDMA_PS_TCP,
        (0, libc::IPPROTO_UDP) => RDMA_PS_UDP,
        (ps, _) => ps,
    };
    let passive = h.flags & RAI_PASSIVE != 0;
    Ok(Rai {
        flags: if passive { RAI_PASSIVE } else { 0 },
        family,
        qp_type,
        port_space,
        src: passive.then(|| addr.clone()),
        dst: (!passive).then_some(addr),
    })
}

/// The result of hints alone (no node, no service): rdma-core copies the flags, family, QP type, port
/// space and destination.
fn from_hints(h: &Rai) -> Rai {
    Rai {
        src: None,
        ..h.clone()
    }
}

/// rdma-core's last step on both paths: a source the result lacks is the hints'.
fn with_hinted_source(mut r: Rai, h: &Rai) -> Rai {
    if r.src.is_none() {
        r.src = h.src.clone();
    }
    r
}

/// getaddrinfo(3) of `node`/`service` with `h`'s hints, first answer only.
fn lookup(node: *const c_char, service: *const c_char, h: &Rai) -> Result<Found, Errno> {
    let (flags, family, socktype, protocol) = libc_hints(h);
    // SAFETY: all-zero is a valid addrinfo hint.
    let mut hints: libc::addrinfo = unsafe { std::mem::zeroed() };
    (
        hints.ai_flags,
        hints.ai_family,
        hints.ai_socktype,
        hints.ai_protocol,
    ) = (flags, family, socktype, protocol);
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
    // SAFETY: getaddrinfo's list, non-empty on success.
    let ai = unsafe { &*res };
    let found = raw_addr(ai.ai_addr, ai.ai_addrlen).map(|a| {
        (
            ai.ai_family,
            ai.ai_socktype,
            ai.ai_protocol,
            a.unwrap_or_default(),
        )
    });
    // SAFETY: the list getaddrinfo made.
    unsafe { libc::freeaddrinfo(res) };
    found
}

/// `a`'s bytes in a new `sockaddr_storage`, and their length (0: none).
fn storage(a: &Option<RawAddr>) -> (Box<sockaddr_storage>, libc::socklen_t) {
    // SAFETY: all-zero storage.
    let mut s: Box<sockaddr_storage> = Box::new(unsafe { std::mem::zeroed() });
    let len = a.as_ref().map_or(0, |a| {
        // SAFETY: `raw_addr` bounds every address by the storage's size.
        unsafe { std::ptr::copy_nonoverlapping(a.as_ptr(), (&raw mut *s).cast::<u8>(), a.len()) };
        a.len()
    });
    (s, len as libc::socklen_t)
}

export!("RDMACM_1.0";
/// rdma-core's `rdma_getaddrinfo` (librdmacm/addrinfo.c): with a node or a service, getaddrinfo(3) with the
/// hints converted and its first answer; with hints alone, the hints' flags, family, QP type, port space
/// and destination. Either way a source the result lacks is the hints'. docs/rdma-core.md has the table.
fn rdma_getaddrinfo(node: *const c_char, service: *const c_char, hints: *const rdma_addrinfo, res: *mut *mut rdma_addrinfo) -> c_int {
    ret_minus_one("rdma_getaddrinfo", || {
        if res.is_null() || (node.is_null() && service.is_null() && hints.is_null()) {
            return Err(libc::EINVAL);
        }
        state::process()?;
        let h = read_hints(hints)?;
        let r = if node.is_null() && service.is_null() {
            from_hints(&h)
        } else {
            from_lookup(&h, lookup(node, service, &h)?)?
        };
        let r = with_hinted_source(r, &h);
        let (src, src_len) = storage(&r.src);
        let (dst, dst_len) = storage(&r.dst);
        let mut info = AddrInfo {
            c: CCell::new(rdma_addrinfo {
                ai_flags: r.flags,
                ai_family: r.family,
                ai_qp_type: r.qp_type,
                ai_port_space: r.port_space,
                ai_src_len: src_len,
                ai_dst_len: dst_len,
                ai_src_addr: std::ptr::null_mut(),
                ai_dst_addr: std::ptr::null_mut(),
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
        };
        // SAFETY: the boxes move with `info` without moving their contents.
        unsafe {
            let c = &mut *info.c.get();
            if src_len > 0 {
                c.ai_src_addr = (&raw mut *info.src).cast();
            }
            if dst_len > 0 {
                c.ai_dst_addr = (&raw mut *info.dst).cast();
            }
        }
        // SAFETY: the caller's out-parameter.
        unsafe { *res = ADDRINFOS.insert(Arc::new(info)) };
        Ok(())
    })
});

export!("RDMACM_1.0";
fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    guard("rdma_freeaddrinfo", (), || {
        let _ = ADDRINFOS.remove(res);
    })
});

/// What `rdma_create_ep` takes from an `rdma_addrinfo` of ours: (source, destination, passive). Its QP
/// type must be RC and its port space TCP (or unset): UD and the other port spaces are services
/// soft-rdma lacks (ENOSYS, as `rdma_create_id` answers).
pub(crate) fn addrinfo_addrs(
    res: *mut rdma_addrinfo,
) -> Result<(Option<SocketAddr>, Option<SocketAddr>, bool), Errno> {
    let info = ADDRINFOS.get(res)?;
    // SAFETY: the live result's fields.
    let c = unsafe { &*info.c.get() };
    if (c.ai_qp_type != 0 && c.ai_qp_type != IBV_QPT_RC)
        || (c.ai_port_space != 0 && c.ai_port_space != RDMA_PS_TCP)
    {
        return Err(libc::ENOSYS);
    }
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

    fn raw(a: &str) -> RawAddr {
        // SAFETY: zeroed storage.
        let mut s: sockaddr_storage = unsafe { std::mem::zeroed() };
        let len = to_sockaddr(&mut s, a.parse().unwrap()) as usize;
        // SAFETY: `len` bytes of the storage.
        unsafe { std::slice::from_raw_parts((&raw const s).cast::<u8>(), len) }.to_vec()
    }

    /// libfabric's verbs provider (`vrb_create_ep`): no node, no service, the peer as a binary destination,
    /// its own address as a binary source.
    #[test]
    fn hints_alone_give_their_own_addresses() {
        let h = Rai {
            flags: RAI_FAMILY,
            family: libc::AF_INET,
            qp_type: IBV_QPT_RC,
            port_space: RDMA_PS_TCP,
            src: Some(raw("10.0.0.1:0")),
            dst: Some(raw("10.0.0.2:7471")),
        };
        assert_eq!(with_hinted_source(from_hints(&h), &h), h);
        let no_src = Rai {
            src: None,
            ..h.clone()
        };
        assert_eq!(with_hinted_source(from_hints(&no_src), &no_src), no_src);
    }

    #[test]
    fn a_passive_lookup_is_the_source() {
        let h = Rai {
            flags: RAI_PASSIVE | RAI_NUMERICHOST,
            ..Rai::default()
        };
        let r = from_lookup(
            &h,
            (
                libc::AF_INET,
                libc::SOCK_STREAM,
                libc::IPPROTO_TCP,
                raw("10.0.0.1:0"),
            ),
        )
        .unwrap();
        assert_eq!(r.flags, RAI_PASSIVE);
        assert_eq!((r.qp_type, r.port_space), (IBV_QPT_RC, RDMA_PS_TCP));
        assert_eq!((r.src, r.dst), (Some(raw("10.0.0.1:0")), None));
    }

    /// An active lookup is the destination; the hints' source fills in, their QP type and port space win.
    #[test]
    fn an_active_lookup_is_the_destination() {
        let h = Rai {
            flags: RAI_NUMERICHOST | RAI_FAMILY,
            qp_type: IBV_QPT_UD,
            port_space: RDMA_PS_UDP,
            src: Some(raw("10.0.0.1:0")),
            ..Rai::default()
        };
        let r = from_lookup(
            &h,
            (
                libc::AF_INET,
                libc::SOCK_DGRAM,
                libc::IPPROTO_UDP,
                raw("10.0.0.2:1"),
            ),
        )
        .unwrap();
        let r = with_hinted_source(r, &h);
        assert_eq!(r.flags, 0, "only RAI_PASSIVE is kept");
        assert_eq!((r.qp_type, r.port_space), (IBV_QPT_UD, RDMA_PS_UDP));
        assert_eq!((r.src, r.dst), (Some(raw("10.0.0.1:0")), Some(raw("10.0.0.2:1"))));
    }

    #[test]
    fn hints_become_getaddrinfos() {
        let h = Rai {
            flags: RAI_PASSIVE | RAI_NUMERICHOST,
            family: libc::AF_INET6,
            qp_type: IBV_QPT_RC,
            port_space: RDMA_PS_TCP,
            ..Rai::default()
        };
        assert_eq!(
            libc_hints(&h),
            (
                libc::AI_PASSIVE | libc::AI_NUMERICHOST,
                libc::AF_INET6,
                libc::SOCK_STREAM,
                libc::IPPROTO_TCP
            )
        );
        let ib = Rai {
            family: AF_IB,
            qp_type: IBV_QPT_UD,
            port_space: RDMA_PS_IB,
            ..Rai::default()
        };
        assert_eq!(libc_hints(&ib), (0, 0, libc::SOCK_DGRAM, libc::IPPROTO_UDP));
        let ib_numeric = Rai {
            flags: RAI_FAMILY | RAI_NUMERICHOST,
            ..ib
        };
        assert_eq!(
            from_lookup(&ib_numeric, (libc::AF_INET6, 0, 0, raw("[::1]:1"))),
            Err(libc::EAFNOSUPPORT)
        );
    }

    #[test]
    fn caller_addresses_are_bounded() {
        let a = raw("10.0.0.1:5");
        assert_eq!(raw_addr(a.as_ptr().cast(), a.len() as u32), Ok(Some(a.clone())));
        assert_eq!(raw_addr(std::ptr::null(), 0), Ok(None));
        assert_eq!(raw_addr(std::ptr::null(), 16), Err(libc::EINVAL));
        assert_eq!(raw_addr(a.as_ptr().cast(), 129), Err(libc::EINVAL));
    }

    #[test]
    fn loopback_names_the_device_only_on_lo() {
        let lo: IpAddr = Ipv4Addr::LOCALHOST.into();
        let any: IpAddr = Ipv4Addr::UNSPECIFIED.into();
        let eth: IpAddr = Ipv4Addr::new(10, 0, 0, 1).into();
        assert!(!names_the_device(lo, "eth0"));
        assert!(names_the_device(lo, "lo"));
        assert!(!names_the_device(any, "lo"));
        assert!(names_the_device(eth, "eth0"));
        assert!(!names_the_device(Ipv6Addr::LOCALHOST.into(), "veth0"));
    }

    #[test]
    fn the_source_for_loopback_is_loopback() {
        assert_eq!(
            source_for("127.0.0.1:7174".parse().unwrap()),
            Ok(IpAddr::from(Ipv4Addr::LOCALHOST))
        );
    }
}
