//! Connections of rdma_cm ids on soft-rdmad's connector: `rdma_connect` (`Connector::connect_qp`, then
//! `complete_connect`), `rdma_listen` (a task per listener turning `get_connection_request` into
//! CONNECT_REQUEST events on new ids), `rdma_accept` (`accept_qp`), `rdma_reject`, `rdma_disconnect`
//! (DISCONNECTED from `notify_disconnect`, or from the local call), `rdma_get_request`, the ids' queue
//! pairs (`rdma_create_qp`, `rdma_create_qp_ex`, `rdma_destroy_qp`) and endpoints (`rdma_create_ep`,
//! `rdma_destroy_ep`). docs/rdma-core.md has the mapping as a table.
//!
//! `responder_resources` is the IRD and `initiator_depth` the ORD (RFC 6581 §9; `ReadLimits { inbound,
//! outbound }`): the peer's in CONNECT_REQUEST, the negotiated ones (the queue pair's) in ESTABLISHED, as
//! the kernel's `cma_iw_handler` reports them.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use libc::{c_int, c_void};
use soft_rdma::NdStatus;
use soft_rdma::client::{Connector, QueuePairState, ReadLimits};

use super::addr::{
    addrinfo_addrs, rdma_bind_addr, rdma_resolve_addr, rdma_resolve_route, release_reservation, to_sockaddr,
};
use super::{EventData, IDS, Id, cm_context, id, new_id, rdma_destroy_id};
use crate::abi::*;
use crate::errno::{errno_of, errno_of_status};
use crate::export::{Errno, export, ret_minus_one};
use crate::qp::Qp;
use crate::state;

/// The read limits and private data a program asks for (`struct rdma_conn_param`; NULL: the device's
/// maxima and none, as rdma-core's `ucma_copy_conn_param_to_kern`), capped to soft-rdma's limits.
fn conn_param(id: &Id, p: *const rdma_conn_param, max_private: u32) -> Result<(ReadLimits, Vec<u8>), Errno> {
    let info = &id.process.info;
    // SAFETY: the caller's struct, if any.
    let Some(p) = (unsafe { p.as_ref() }) else {
        return Ok((
            ReadLimits::new(info.max_inbound_read_limit, info.max_outbound_read_limit),
            Vec::new(),
        ));
    };
    let limits = ReadLimits::new(
        u32::from(p.responder_resources).min(info.max_inbound_read_limit),
        u32::from(p.initiator_depth).min(info.max_outbound_read_limit),
    );
    if u32::from(p.private_data_len) > max_private {
        return Err(libc::EINVAL);
    }
    let data = if p.private_data.is_null() || p.private_data_len == 0 {
        Vec::new()
    } else {
        // SAFETY: `private_data_len` bytes of the caller's.
        unsafe { std::slice::from_raw_parts(p.private_data.cast::<u8>(), usize::from(p.private_data_len)) }
            .to_vec()
    };
    Ok((limits, data))
}

/// The read limits in force on a connected queue pair: (IRD, ORD).
async fn negotiated(qp: Option<&Arc<Qp>>, connector: &Connector) -> (u8, u8) {
    if let Some(qp) = qp
        && let Ok(s) = qp.qp.query().await
        && s.state == QueuePairState::Connected
    {
        return (s.ird.min(255) as u8, s.ord.min(255) as u8);
    }
    match connector.read_limits().await {
        Ok(l) => (l.inbound.min(255) as u8, l.outbound.min(255) as u8),
        Err(_) => (0, 0),
    }
}

/// The connection is established: ESTABLISHED, then DISCONNECTED once the peer disconnects.
async fn established(id: Arc<Id>, connector: Arc<Connector>, qp: Option<Arc<Qp>>, private_data: Vec<u8>) {
    if let Some(qp) = &qp {
        qp.set_state(IBV_QPS_RTS);
    }
    let (ird, ord) = negotiated(qp.as_ref(), &connector).await;
    id.deliver(
        RDMA_CM_EVENT_ESTABLISHED,
        EventData {
            private_data,
            responder_resources: ird,
            initiator_depth: ord,
            ..EventData::default()
        },
    );
    if connector.notify_disconnect().await.is_ok() {
        if let Some(qp) = &qp {
            after_what_came_first(qp).await;
        }
        disconnected(&id);
    }
}

/// How long the peer's DISCONNECTED waits at most for the program to poll what the peer sent before it.
const DISCONNECT_AFTER_DATA: Duration = Duration::from_millis(200);

/// Waits until the program has polled the successful completions `qp` delivered (or
/// [`DISCONNECT_AFTER_DATA`] passed): over TCP a peer's last message and its FIN arrive together, and a
/// program that handles DISCONNECTED first destroys the queue pair before it polls that message. On
/// rdma-core's rdma_cm the event comes after it (the kernel's iw_cm reports the close from a work queue,
/// after siw made the CQE in softirq); libfabric's RxM relies on it: it closes the connection on the event,
/// then reads the CQ (`rxm_close_conn`), and loses or crashes on a message it reads after the close.
async fn after_what_came_first(qp: &Qp) {
    let deadline = tokio::time::Instant::now() + DISCONNECT_AFTER_DATA;
    while qp.holds_delivered() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// DISCONNECTED, once per connection (the peer's disconnect or this side's), the queue pair in Error.
fn disconnected(id: &Arc<Id>) {
    if id.disconnected.swap(true, std::sync::atomic::Ordering::AcqRel) {
        return;
    }
    if let Some(qp) = id.lock().qp.clone() {
        qp.set_state(IBV_QPS_ERR);
    }
    id.deliver(RDMA_CM_EVENT_DISCONNECTED, EventData::default());
}

/// A failed connect as rdma_cm's event and status (the kernel's `cma_iw_handler`: a refusal is REJECTED,
/// a timeout or an unreachable peer UNREACHABLE, anything else CONNECT_ERROR; status = -errno).
fn failed_connect(status: NdStatus) -> (c_int, c_int) {
    let event = match status {
        NdStatus::ConnectionRefused => RDMA_CM_EVENT_REJECTED,
        NdStatus::IoTimeout | NdStatus::NetworkUnreachable | NdStatus::HostUnreachable => {
            RDMA_CM_EVENT_UNREACHABLE
        }
        _ => RDMA_CM_EVENT_CONNECT_ERROR,
    };
    (event, -errno_of_status(status))
}

export!("RDMACM_1.0";
fn rdma_connect(p: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    ret_minus_one("rdma_connect", || {
        let id = id(p)?;
        let (limits, private_data) = conn_param(&id, param, id.process.info.max_caller_data)?;
        let (connector, remote, qp) = {
            let s = id.lock();
            (s.connector.clone().ok_or(libc::EINVAL)?, s.remote.ok_or(libc::EINVAL)?, s.qp.clone())
        };
        let task_id = id.clone();
        let task = state::handle().spawn(async move {
            let id = task_id;
            let r = match &qp {
                Some(q) => connector.connect_qp(&q.qp, remote, limits, &private_data).await,
                None => connector.connect(remote, limits, &private_data).await,
            };
            let r = match r {
                Ok(()) => {
                    let peer_data = connector.private_data().await.unwrap_or_default().to_vec();
                    connector.complete_connect().await.map(|()| peer_data)
                }
                Err(e) => Err(e),
            };
            match r {
                Ok(peer_data) => established(id, connector, qp, peer_data).await,
                Err(e) => {
                    tracing::info!(error = %e, %remote, "rdma_connect failed");
                    let (event, status) = failed_connect(e.status);
                    let private_data = if event == RDMA_CM_EVENT_REJECTED {
                        connector.private_data().await.unwrap_or_default().to_vec()
                    } else {
                        Vec::new()
                    };
                    id.deliver(event, EventData { status, private_data, ..EventData::default() });
                }
            }
        });
        id.lock().tasks.push(task.abort_handle());
        id.complete()
    })
});

/// The kernel rdma_cm's default `max_backlog` (`/proc/sys/net/rdma_ucm/max_backlog`, torvalds/linux
/// `drivers/infiniband/core/ucma.c`).
pub(crate) const MAX_BACKLOG: u32 = 1024;

/// The backlog soft-rdmad's listener gets for `rdma_listen(id, backlog)`: as the kernel's `ucma_listen`,
/// 0 or less is the maximum and anything larger is capped to it (qperf 0.4.11 listens with 0). soft-rdmad's
/// 0 means "no limit", which a program never gets: every queue of offers is bounded.
pub(crate) fn listen_backlog(backlog: c_int) -> u32 {
    if backlog <= 0 {
        MAX_BACKLOG
    } else {
        (backlog as u32).min(MAX_BACKLOG)
    }
}

export!("RDMACM_1.0";
fn rdma_listen(p: *mut rdma_cm_id, backlog: c_int) -> c_int {
    ret_minus_one("rdma_listen", || {
        let id = id(p)?;
        if id.lock().listener.is_some() {
            return Err(libc::EINVAL);
        }
        let local = id.lock().local.unwrap_or((Ipv4Addr::UNSPECIFIED, 0).into());
        release_reservation(&id);
        let adapter = id.process.adapter.clone();
        let (listener, bound) = state::block_on(async move {
            let l = adapter.create_listener().await?;
            let bound = l.listen(local, listen_backlog(backlog)).await?;
            Ok::<_, soft_rdma::Error>((Arc::new(l), bound))
        })
        .map_err(|e| {
            tracing::warn!(error = %e, %local, "rdma_listen failed");
            errno_of(&e)
        })?;
        id.set_local(bound);
        id.lock().listener = Some(listener.clone());
        let task = state::handle().spawn(serve(id.clone(), listener, bound));
        id.lock().tasks.push(task.abort_handle());
        Ok(())
    })
});

/// Turns each offer to the listener into a new id and a CONNECT_REQUEST event.
async fn serve(listen: Arc<Id>, listener: Arc<soft_rdma::client::Listener>, bound: SocketAddr) {
    let adapter = listen.process.adapter.clone();
    loop {
        let Ok(connector) = adapter.create_connector().await else {
            return;
        };
        let offer = match listener.get_connection_request(&connector).await {
            Ok(offer) => offer,
            Err(e) => {
                tracing::debug!(error = %e, "rdma_listen: the listener stopped");
                return;
            }
        };
        let local = connector.local_addr().await.unwrap_or(bound);
        // SAFETY: the live listening id's fields.
        let (context, ps) = unsafe { ((*listen.ibv()).context, (*listen.ibv()).ps) };
        // A synchronous listener's new ids are synchronous, each with a channel of its own (rdma-core's
        // `ucma_process_conn_req`: `rdma_migrate_id(child, NULL)`); an asynchronous one's share its channel.
        let channel = (!listen.is_sync()).then(|| listen.channel());
        let Ok(child) = new_id(listen.process.clone(), channel, context, ps) else {
            let _ = connector.reject(&[]).await;
            continue;
        };
        child.set_local(local);
        child.set_remote(offer.peer);
        if child.set_verbs().is_err() {
            continue;
        }
        child.lock().connector = Some(Arc::new(connector));
        let child_ptr = IDS.insert(child.clone());
        let data = EventData {
            private_data: offer.private_data.to_vec(),
            // The offer's limits from this side's view: inbound = the peer's ORD (what this side must
            // serve), outbound = the peer's IRD (what this side may issue).
            responder_resources: offer.limits.inbound.min(255) as u8,
            initiator_depth: offer.limits.outbound.min(255) as u8,
            listen_id: Some(listen.ibv()),
            ..EventData::default()
        };
        // On the listener's channel (a synchronous listener's own: rdma_get_request takes it).
        child.deliver_via(&listen, RDMA_CM_EVENT_CONNECT_REQUEST, data);
        tracing::debug!(peer = %offer.peer, id = ?child_ptr, "rdma_cm: connect request");
    }
}

export!("RDMACM_1.0";
/// A synchronous listening id's next connection request (rdma-core `rdma_get_request`): acknowledges the
/// event in the listener's `id->event`, waits, and returns the new id with its CONNECT_REQUEST in its own
/// `id->event` (acknowledged by its next waiting call, e.g. `rdma_accept`) and the queue pair
/// `rdma_create_ep` asked for. The new id is synchronous, with events of its own. Another event stays in
/// the listener's `id->event`: REJECTED → ECONNREFUSED, a status → errno, any other type → EINVAL.
fn rdma_get_request(listen: *mut rdma_cm_id, out: *mut *mut rdma_cm_id) -> c_int {
    ret_minus_one("rdma_get_request", || {
        let listen = id(listen)?;
        if out.is_null() || !listen.is_sync() || listen.lock().listener.is_none() {
            return Err(libc::EINVAL);
        }
        listen.ack_last();
        let ev = listen.next_sync_event()?;
        // SAFETY: an event delivered to this id, still registered.
        let (kind, child, status) = unsafe { ((*ev).event, (*ev).id, (*ev).status) };
        if status != 0 || kind != RDMA_CM_EVENT_CONNECT_REQUEST {
            // SAFETY: the live listener's field.
            unsafe { (*listen.ibv()).event = ev };
            return Err(match status {
                0 => libc::EINVAL,
                _ if kind == RDMA_CM_EVENT_REJECTED => libc::ECONNREFUSED,
                s => s.abs(),
            });
        }
        let child_id = id(child)?;
        // SAFETY: the live id's field.
        unsafe { (*child).event = ev };
        let ep = listen.lock().ep_qp;
        if let Some((pd, mut attr)) = ep
            && let Err(e) = create_id_qp(&child_id, pd, &mut attr)
        {
            let _ = ret_minus_one("rdma_reject", || reject(&child_id, &[]));
            // SAFETY: our own export on the id just made (it acknowledges the request).
            let _ = unsafe { rdma_destroy_id(child) };
            return Err(e);
        }
        // SAFETY: the caller's out-parameter.
        unsafe { *out = child };
        Ok(())
    })
});

export!("RDMACM_1.0";
fn rdma_accept(p: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    ret_minus_one("rdma_accept", || {
        let id = id(p)?;
        let (limits, private_data) = conn_param(&id, param, id.process.info.max_callee_data)?;
        let (connector, qp) = {
            let s = id.lock();
            (s.connector.clone().ok_or(libc::EINVAL)?, s.qp.clone())
        };
        if let Some(q) = &qp {
            q.begin_accept();
        }
        let task_id = id.clone();
        let task = state::handle().spawn(async move {
            let id = task_id;
            let r = match &qp {
                Some(q) => {
                    let r = connector.accept_qp(&q.qp, limits, &private_data).await;
                    q.end_accept();
                    r
                }
                None => connector.accept(limits, &private_data).await,
            };
            match r {
                Ok(()) => established(id, connector, qp, Vec::new()).await,
                Err(e) => {
                    tracing::info!(error = %e, "rdma_accept failed");
                    let status = -errno_of(&e);
                    id.deliver(RDMA_CM_EVENT_CONNECT_ERROR, EventData { status, ..EventData::default() });
                }
            }
        });
        id.lock().tasks.push(task.abort_handle());
        id.complete()
    })
});

fn reject(id: &Id, private_data: &[u8]) -> Result<(), Errno> {
    let connector = id.lock().connector.clone().ok_or(libc::EINVAL)?;
    let data = private_data.to_vec();
    state::block_on(async move { connector.reject(&data).await }).map_err(|e| errno_of(&e))
}

export!("RDMACM_1.0";
fn rdma_reject(p: *mut rdma_cm_id, private_data: *const c_void, len: u8) -> c_int {
    ret_minus_one("rdma_reject", || {
        let id = id(p)?;
        if u32::from(len) > id.process.info.max_callee_data {
            return Err(libc::EINVAL);
        }
        let data = if private_data.is_null() || len == 0 {
            &[][..]
        } else {
            // SAFETY: `len` bytes of the caller's.
            unsafe { std::slice::from_raw_parts(private_data.cast::<u8>(), usize::from(len)) }
        };
        reject(&id, data)
    })
});

export!("RDMACM_1.0";
/// Disconnects (the queue pair goes to Error: what is posted is flushed) and reports DISCONNECTED on this
/// side as well, as iWARP's rdma_cm does. A synchronous id waits for its DISCONNECTED and leaves it in
/// `id->event` (rdma-core `rdma_disconnect` → `ucma_complete`), unless an earlier call already took it.
fn rdma_disconnect(p: *mut rdma_cm_id) -> c_int {
    ret_minus_one("rdma_disconnect", || {
        let id = id(p)?;
        if id.is_sync() && id.last_event() == Some(RDMA_CM_EVENT_DISCONNECTED) {
            return Ok(());
        }
        disconnect(&id)?;
        id.complete()
    })
});

pub(crate) fn disconnect(id: &Arc<Id>) -> Result<(), Errno> {
    let connector = id.lock().connector.clone().ok_or(libc::EINVAL)?;
    if id.disconnected.load(std::sync::atomic::Ordering::Acquire) {
        return Ok(());
    }
    let r = state::block_on(async move { connector.disconnect().await });
    match r {
        Ok(()) => {}
        // The peer ended it meanwhile: DISCONNECTED is on its way.
        Err(e) if e.status == NdStatus::ConnectionInvalid => {}
        Err(e) => return Err(errno_of(&e)),
    }
    disconnected(id);
    Ok(())
}

/// The PD rdma_cm ids use when a program gives none (rdma-core: one per device).
fn default_pd(id: &Id) -> Result<*mut ibv_pd, Errno> {
    let pd_slot = &id.process.cm_default_pd;
    if let Some(&p) = pd_slot.get() {
        return Ok(p as *mut ibv_pd);
    }
    let ctx = cm_context(&id.process)?;
    // SAFETY: our own export, on the ids' live context.
    let pd = unsafe { crate::memory::ibv_alloc_pd(ctx.ibv()) };
    if pd.is_null() {
        return Err(crate::export::errno());
    }
    Ok(*pd_slot.get_or_init(|| pd as usize) as *mut ibv_pd)
}

/// `rdma_create_qp`: the id's queue pair (and CQs with channels when the attributes name none, as
/// rdma-core's `ucma_create_cqs`), moved to INIT.
fn create_id_qp(id: &Arc<Id>, pd: *mut ibv_pd, attr: &mut ibv_qp_init_attr) -> Result<(), Errno> {
    // SAFETY: the live id's field.
    let verbs = unsafe { (*id.ibv()).verbs };
    if verbs.is_null() || id.lock().qp.is_some() {
        return Err(libc::EINVAL);
    }
    let pd = if pd.is_null() { default_pd(id)? } else { pd };
    if crate::memory::pd(pd)?.context.ibv() != verbs {
        return Err(libc::EINVAL);
    }
    let mut own = Vec::new();
    let mut make_cq = |depth: u32| -> Result<(*mut ibv_cq, *mut ibv_comp_channel), Errno> {
        // SAFETY: our own exports, on the id's live context.
        unsafe {
            let ch = crate::cq::ibv_create_comp_channel(verbs);
            if ch.is_null() {
                return Err(crate::export::errno());
            }
            // The id is the CQs' context, as ucma_create_cqs makes them: rdma_verbs.h's
            // rdma_get_send_comp and rdma_get_recv_comp assert it of the events they get.
            let cq = crate::cq::ibv_create_cq(verbs, depth.max(1) as c_int, id.ibv().cast(), ch, 0);
            if cq.is_null() {
                let e = crate::export::errno();
                crate::cq::ibv_destroy_comp_channel(ch);
                return Err(e);
            }
            own.push((cq, ch));
            Ok((cq, ch))
        }
    };
    let made = (|| {
        if attr.recv_cq.is_null() {
            let (cq, ch) = make_cq(attr.cap.max_recv_wr)?;
            attr.recv_cq = cq;
            // SAFETY: the live id's fields.
            unsafe { ((*id.ibv()).recv_cq, (*id.ibv()).recv_cq_channel) = (cq, ch) };
        }
        if attr.send_cq.is_null() {
            let (cq, ch) = make_cq(attr.cap.max_send_wr)?;
            attr.send_cq = cq;
            // SAFETY: as above.
            unsafe { ((*id.ibv()).send_cq, (*id.ibv()).send_cq_channel) = (cq, ch) };
        }
        crate::qp::create_qp(pd, attr)
    })();
    let qp_ptr = match made {
        Ok(q) => q,
        Err(e) => {
            destroy_cqs(id, own);
            return Err(e);
        }
    };
    let qp = crate::qp::qp(qp_ptr)?;
    qp.set_state(IBV_QPS_INIT);
    // SAFETY: the live id's fields.
    unsafe {
        (*id.ibv()).qp = qp_ptr;
        (*id.ibv()).pd = pd;
    }
    let mut s = id.lock();
    s.qp = Some(qp);
    s.own_cqs = own;
    Ok(())
}

fn destroy_cqs(id: &Id, cqs: Vec<(*mut ibv_cq, *mut ibv_comp_channel)>) {
    for (cq, ch) in cqs {
        // SAFETY: our own exports on handles we made.
        unsafe {
            crate::cq::ibv_destroy_cq(cq);
            crate::cq::ibv_destroy_comp_channel(ch);
            let c = &mut *id.ibv();
            if c.send_cq == cq {
                (c.send_cq, c.send_cq_channel) = (std::ptr::null_mut(), std::ptr::null_mut());
            }
            if c.recv_cq == cq {
                (c.recv_cq, c.recv_cq_channel) = (std::ptr::null_mut(), std::ptr::null_mut());
            }
        }
    }
}

export!("RDMACM_1.0";
fn rdma_create_qp(p: *mut rdma_cm_id, pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> c_int {
    ret_minus_one("rdma_create_qp", || {
        let id = id(p)?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's struct; rdma-core writes the capacities back into it.
        create_id_qp(&id, pd, unsafe { &mut *attr })
    })
});

export!("RDMACM_1.0";
/// `rdma_create_qp` with `struct ibv_qp_init_attr_ex` (perftest): the PD must be given
/// (IBV_QP_INIT_ATTR_PD); the extension's other fields (XRC, RSS, TSO, send ops) are not soft-rdma's.
fn rdma_create_qp_ex(p: *mut rdma_cm_id, attr: *mut ibv_qp_init_attr_ex) -> c_int {
    ret_minus_one("rdma_create_qp_ex", || {
        let id = id(p)?;
        // SAFETY: the caller's struct.
        let ex = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
        if ex.comp_mask & !IBV_QP_INIT_ATTR_PD != 0 || ex.create_flags != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        let pd = if ex.comp_mask & IBV_QP_INIT_ATTR_PD != 0 { ex.pd } else { std::ptr::null_mut() };
        let mut a = ibv_qp_init_attr {
            qp_context: ex.qp_context,
            send_cq: ex.send_cq,
            recv_cq: ex.recv_cq,
            srq: ex.srq,
            cap: ex.cap,
            qp_type: ex.qp_type,
            sq_sig_all: ex.sq_sig_all,
        };
        create_id_qp(&id, pd, &mut a)?;
        ex.cap = a.cap;
        Ok(())
    })
});

export!("RDMACM_1.0";
fn rdma_destroy_qp(p: *mut rdma_cm_id) {
    crate::export::guard("rdma_destroy_qp", (), || {
        let Ok(id) = id(p) else { return };
        // SAFETY: the live id's field.
        let qp = unsafe { (*id.ibv()).qp };
        if !qp.is_null() {
            let _ = crate::qp::destroy_qp(qp);
        }
        let own = std::mem::take(&mut id.lock().own_cqs);
        destroy_cqs(&id, own);
    })
});

export!("RDMACM_1.0";
/// A synchronous id for `res` (rdma_getaddrinfo's): passive → bound to its source address, the queue
/// pair attributes kept for `rdma_get_request`; active → address and route resolved and its queue pair
/// made.
fn rdma_create_ep(out: *mut *mut rdma_cm_id, res: *mut rdma_addrinfo, pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> c_int {
    ret_minus_one("rdma_create_ep", || {
        if out.is_null() {
            return Err(libc::EINVAL);
        }
        let (src, dst, passive) = addrinfo_addrs(res)?;
        let process = state::process()?;
        let id = new_id(process, None, std::ptr::null_mut(), RDMA_PS_TCP)?;
        let p = IDS.insert(id.clone());
        let made = (|| {
            // SAFETY: all-zero storage, filled below.
            let mut s: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            let mut d: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            if passive {
                to_sockaddr(&mut s, src.ok_or(libc::EINVAL)?);
                // SAFETY: our own exports with live arguments.
                if unsafe { rdma_bind_addr(p, (&raw mut s).cast()) } != 0 {
                    return Err(crate::export::errno());
                }
                if !attr.is_null() {
                    // SAFETY: the caller's struct.
                    let mut a = unsafe { std::ptr::read(attr) };
                    // rdma-core's ucma_passive_ep: the queue pair type is the addrinfo's (RC).
                    a.qp_type = IBV_QPT_RC;
                    id.lock().ep_qp = Some((pd, a));
                }
                return Ok(());
            }
            to_sockaddr(&mut d, dst.ok_or(libc::EINVAL)?);
            let src_ptr = match src {
                Some(a) => {
                    to_sockaddr(&mut s, a);
                    (&raw mut s).cast()
                }
                None => std::ptr::null_mut(),
            };
            // SAFETY: our own exports with live arguments.
            unsafe {
                if rdma_resolve_addr(p, src_ptr, (&raw mut d).cast(), 2000) != 0
                    || rdma_resolve_route(p, 2000) != 0
                {
                    return Err(crate::export::errno());
                }
            }
            if !attr.is_null() {
                // SAFETY: the caller's struct; rdma-core's rdma_create_ep sets its type to the addrinfo's.
                let attr = unsafe { &mut *attr };
                attr.qp_type = IBV_QPT_RC;
                create_id_qp(&id, pd, attr)?;
            }
            Ok(())
        })();
        if let Err(e) = made {
            // SAFETY: our own export on the id just made.
            unsafe { rdma_destroy_id(p) };
            return Err(e);
        }
        // SAFETY: the caller's out-parameter.
        unsafe { *out = p };
        Ok(())
    })
});

export!("RDMACM_1.0";
fn rdma_destroy_ep(p: *mut rdma_cm_id) {
    crate::export::guard("rdma_destroy_ep", (), || {
        // SAFETY: our own exports; both check `p`.
        unsafe {
            rdma_destroy_qp(p);
            rdma_destroy_id(p);
        }
    })
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_connects_map_to_the_kernels_events() {
        assert_eq!(
            failed_connect(NdStatus::ConnectionRefused),
            (RDMA_CM_EVENT_REJECTED, -libc::ECONNREFUSED)
        );
        assert_eq!(
            failed_connect(NdStatus::IoTimeout),
            (RDMA_CM_EVENT_UNREACHABLE, -libc::ETIMEDOUT)
        );
        assert_eq!(
            failed_connect(NdStatus::HostUnreachable),
            (RDMA_CM_EVENT_UNREACHABLE, -libc::EHOSTUNREACH)
        );
        assert_eq!(
            failed_connect(NdStatus::ConnectionAborted),
            (RDMA_CM_EVENT_CONNECT_ERROR, -libc::ECONNABORTED)
        );
    }

    #[test]
    fn a_backlog_of_zero_or_less_is_the_kernels_maximum() {
        // ucma_listen: `cmd.backlog > 0 && cmd.backlog < max_backlog ? cmd.backlog : max_backlog`.
        assert_eq!(listen_backlog(0), MAX_BACKLOG);
        assert_eq!(listen_backlog(-1), MAX_BACKLOG);
        assert_eq!(listen_backlog(c_int::MIN), MAX_BACKLOG);
        assert_eq!(listen_backlog(3), 3);
        assert_eq!(listen_backlog(5000), MAX_BACKLOG);
    }
}
