//! RC queue pairs: `ibv_create_qp`, `ibv_query_qp`, `ibv_modify_qp`, `ibv_destroy_qp`, and the data
//! path's `ibv_post_send`/`ibv_post_recv` (`ibv_context_ops`), which turn `struct ibv_send_wr` and
//! `struct ibv_recv_wr` chains (verbs.h) into soft-rdma work requests and call the client's synchronous
//! `QueuePair::post` on the caller's thread.
//!
//! A queue pair may take its Receives from a shared receive queue (`attr.srq`, `crate::srq`): it then has
//! no receive queue of its own, and `ibv_post_recv` on it is EINVAL (siw_post_receive).
//!
//! What siw refuses is refused with siw's errno (`siw_verbs.c`): a QP type other than RC (EOPNOTSUPP), an opcode iWARP or soft-rdma lacks (immediate data, atomics, memory windows, local
//! invalidate: EINVAL), more SGEs than the queue pair's (EINVAL), a Send, Write or Read before the queue
//! pair is connected (ENOTCONN). The connection itself is rdma_cm's (`crate::cm`), as on every iWARP
//! device: `ibv_modify_qp` moves between the states siw allows without a connection (RESET and INIT are
//! one idle state, reported INIT; RTS only through rdma_cm), and to IBV_QPS_ERR flushes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use libc::{c_int, c_void};
use soft_rdma::client::{Access, MemoryRegion, QueuePair, RemoteBuffer, Sge, Stag, WorkRequest};

use crate::abi::*;
use crate::cq::{Cq, cq};
use crate::device::Context;
use crate::errno::errno_of;
use crate::export::{CCell, CObject, Errno, LastHit, Registry, export, guard, ret_errno, ret_ptr};
use crate::memory::{Pd, local_sge, pd};
use crate::state;

/// The most inline data one request carries (copied at post time into the queue pair's own region).
pub const MAX_INLINE_DATA: u32 = 256;

#[repr(C)]
pub(crate) struct Qp {
    c: CCell<ibv_qp>,
    pub(crate) context: Arc<Context>,
    pd: Arc<Pd>,
    send_cq: Arc<Cq>,
    recv_cq: Arc<Cq>,
    /// The shared receive queue its Receives come from, if any.
    srq: Option<Arc<crate::srq::Srq>>,
    pub(crate) qp: QueuePair,
    sq_sig_all: bool,
    cap: ibv_qp_cap,
    inline: Option<InlineSlots>,
    /// The state `ibv_query_qp` reports and the read limits asked with `ibv_modify_qp`.
    attrs: Mutex<QpAttrs>,
    /// An `rdma_accept` in progress (`crate::cm`), and its end.
    accepting: Mutex<bool>,
    accepted: std::sync::Condvar,
}

#[derive(Clone, Copy, Default)]
struct QpAttrs {
    state: c_int,
    max_rd_atomic: u8,
    max_dest_rd_atomic: u8,
    access: u32,
}

// SAFETY: #[repr(C)], the C struct first.
unsafe impl CObject for Qp {
    type C = ibv_qp;
    const KIND: &'static str = "queue pair";
}

pub(crate) static QPS: Registry<Qp> = Registry::new();

thread_local! {
    /// The queue pair this thread posted on last ([`Registry::get_hot`]).
    static LAST_QP: LastHit<Qp> = const { LastHit::new() };
}

/// Room for one send queue's worth of inline payloads: request n uses slot n mod depth, which the send
/// queue has finished with by then (it holds at most `depth` requests).
struct InlineSlots {
    region: MemoryRegion,
    slots: usize,
    next: AtomicUsize,
}

impl Qp {
    /// Whether a successful completion of this queue pair waits in its CQs, not yet polled
    /// ([`soft_rdma::client::CompletionQueue::holds_delivered`]).
    pub(crate) fn holds_delivered(&self) -> bool {
        let id = self.qp.id();
        self.recv_cq.cq.holds_delivered(id) || self.send_cq.cq.holds_delivered(id)
    }

    pub(crate) fn ibv(&self) -> *mut ibv_qp {
        self.c.get()
    }

    /// Records a new state (the program may read `qp->state`).
    pub(crate) fn set_state(&self, s: c_int) {
        self.attrs.lock().unwrap_or_else(|e| e.into_inner()).state = s;
        // SAFETY: the live queue pair's field.
        unsafe { (*self.ibv()).state = s };
    }

    pub(crate) fn state(&self) -> c_int {
        self.attrs.lock().unwrap_or_else(|e| e.into_inner()).state
    }

    /// `rdma_accept` started: from its return on, the program may post (rdma-core: the kernel moved the
    /// queue pair to RTS), while the client's accept completes only with the initiator's RTR.
    pub(crate) fn begin_accept(&self) {
        *self.accepting.lock().unwrap_or_else(|e| e.into_inner()) = true;
    }

    /// The accept completed (or failed).
    pub(crate) fn end_accept(&self) {
        *self.accepting.lock().unwrap_or_else(|e| e.into_inner()) = false;
        self.accepted.notify_all();
    }

    /// Waits for an accept in progress, if one is.
    fn wait_accept(&self) {
        let mut a = self.accepting.lock().unwrap_or_else(|e| e.into_inner());
        while *a {
            a = self.accepted.wait(a).unwrap_or_else(|e| e.into_inner());
        }
    }
}

pub(crate) fn qp(p: *const ibv_qp) -> Result<Arc<Qp>, Errno> {
    QPS.get(p)
}

export!("IBVERBS_1.1";
fn ibv_create_qp(p: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    ret_ptr("ibv_create_qp", || {
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's struct.
        create_qp(p, unsafe { &mut *attr })
    })
});

/// Creates an RC queue pair and writes the capacities it got back into `attr.cap` (as rdma-core does).
pub(crate) fn create_qp(p: *mut ibv_pd, attr: &mut ibv_qp_init_attr) -> Result<*mut ibv_qp, Errno> {
    let pd = pd(p)?;
    let context = pd.context.clone();
    if attr.qp_type != IBV_QPT_RC {
        return Err(libc::EOPNOTSUPP);
    }
    let srq = if attr.srq.is_null() {
        None
    } else {
        let s = crate::srq::srq(attr.srq)?;
        if !Arc::ptr_eq(&s.context, &context) {
            return Err(libc::EINVAL);
        }
        // siw_create_qp: with an SRQ the receive queue is not made (`rq_size = 0`); its sizes are not
        // looked at.
        attr.cap.max_recv_wr = 0;
        attr.cap.max_recv_sge = 0;
        Some(s)
    };
    let send_cq = cq(attr.send_cq)?;
    let recv_cq = cq(attr.recv_cq)?;
    if !Arc::ptr_eq(&send_cq.context, &context) || !Arc::ptr_eq(&recv_cq.context, &context) {
        return Err(libc::EINVAL);
    }
    let info = &context.process.info;
    let c = attr.cap;
    if c.max_send_wr > info.max_send_queue_depth
        || c.max_recv_wr > info.max_receive_queue_depth
        || c.max_send_sge > info.max_send_sge
        || c.max_recv_sge > info.max_receive_sge
        || c.max_inline_data > MAX_INLINE_DATA
        || (c.max_send_wr == 0 && c.max_recv_wr == 0)
    {
        return Err(libc::EINVAL);
    }
    let send_depth = c.max_send_wr.max(1);
    let recv_depth = if srq.is_some() { 0 } else { c.max_recv_wr.max(1) };
    let adapter = context.process.adapter.clone();
    let (sq, rq) = (&send_cq.cq, &recv_cq.cq);
    let inline_len = c.max_inline_data as usize * send_depth as usize;
    let (queue, inline) = state::block_on(async {
        // In the QP's PD: its inline slots are SGEs of its own requests (siw_check_sgl_tx checks them too).
        let qp = match &srq {
            Some(s) => {
                adapter
                    .create_queue_pair_on_srq_in(pd.id, sq, rq, send_depth, &s.srq)
                    .await?
            }
            None => {
                adapter
                    .create_queue_pair_in(pd.id, sq, rq, send_depth, recv_depth)
                    .await?
            }
        };
        let inline = if inline_len > 0 {
            Some(
                adapter
                    .register_memory_in(pd.id, inline_len, Access::LOCAL_READ)
                    .await?,
            )
        } else {
            None
        };
        Ok::<_, soft_rdma::Error>((qp, inline))
    })
    .map_err(|e| {
        tracing::warn!(error = %e, "ibv_create_qp: soft-rdma refused the queue pair");
        errno_of(&e)
    })?;
    let cap = ibv_qp_cap {
        max_send_wr: send_depth,
        max_recv_wr: recv_depth,
        max_send_sge: c.max_send_sge.max(1),
        max_recv_sge: if srq.is_some() { 0 } else { c.max_recv_sge.max(1) },
        max_inline_data: c.max_inline_data,
    };
    attr.cap = cap;
    let qp_num = queue.id().0 as u32;
    let qp = Arc::new(Qp {
        c: CCell::new(ibv_qp {
            context: context.ibv(),
            qp_context: attr.qp_context,
            pd: p,
            send_cq: attr.send_cq,
            recv_cq: attr.recv_cq,
            srq: attr.srq,
            handle: qp_num,
            qp_num,
            // What rdma-core's create_qp sets; `ibv_query_qp` then reports INIT (below).
            state: IBV_QPS_RESET,
            qp_type: IBV_QPT_RC,
            // SAFETY: all-zero is glibc's static initializer.
            mutex: unsafe { std::mem::zeroed() },
            cond: unsafe { std::mem::zeroed() },
            events_completed: 0,
        }),
        context,
        pd: pd.clone(),
        send_cq: send_cq.clone(),
        recv_cq: recv_cq.clone(),
        srq: srq.clone(),
        qp: queue,
        sq_sig_all: attr.sq_sig_all != 0,
        cap,
        inline: inline.map(|region| InlineSlots {
            region,
            slots: send_depth as usize,
            next: AtomicUsize::new(0),
        }),
        // An iWARP queue pair is idle from its creation, which siw reports as INIT
        // (`siw_qp_state_to_ib_qp_state`, siw_verbs.c); rdma-core's tests expect it of an RNIC.
        attrs: Mutex::new(QpAttrs {
            state: IBV_QPS_INIT,
            ..QpAttrs::default()
        }),
        accepting: Mutex::new(false),
        accepted: std::sync::Condvar::new(),
    });
    pd.hold();
    send_cq.hold();
    recv_cq.hold();
    if let Some(s) = &srq {
        s.hold();
    }
    let weak = Arc::downgrade(&qp);
    let c = QPS.insert(qp);
    // The queue pair's asynchronous event, as siw raises it (verbs.h `enum ibv_event_type`; the element is
    // the `ibv_qp`).
    let element = c as usize;
    if let Some(q) = weak.upgrade() {
        let ctx = Arc::downgrade(&q.context);
        q.qp.on_async_event(move |event| {
            if let Some(ctx) = ctx.upgrade() {
                ctx.post_async_event(async_event_type(event), element);
            }
        });
    }
    Ok(c)
}

/// The `enum ibv_event_type` value of a queue pair's event.
fn async_event_type(event: soft_rdma::client::QueuePairEvent) -> c_int {
    use soft_rdma::client::QueuePairEvent;
    match event {
        QueuePairEvent::Fatal => IBV_EVENT_QP_FATAL,
        QueuePairEvent::RequestError => IBV_EVENT_QP_REQ_ERR,
        QueuePairEvent::AccessError => IBV_EVENT_QP_ACCESS_ERR,
    }
}

export!("IBVERBS_1.1";
fn ibv_destroy_qp(p: *mut ibv_qp) -> c_int {
    ret_errno("ibv_destroy_qp", || destroy_qp(p))
});

pub(crate) fn destroy_qp(p: *mut ibv_qp) -> Result<(), Errno> {
    let qp = QPS.remove(p)?;
    // Its completions leave the CQs with it, before the close below flushes what it still holds.
    qp.send_cq.forget_queue_pair(qp.qp.id());
    qp.recv_cq.forget_queue_pair(qp.qp.id());
    qp.pd.release();
    qp.send_cq.release();
    qp.recv_cq.release();
    if let Some(s) = &qp.srq {
        s.release();
    }
    crate::cm::qp_destroyed(p);
    Ok(())
}

export!("IBVERBS_1.1";
fn ibv_modify_qp(p: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    ret_errno("ibv_modify_qp", || {
        let qp = qp(p)?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's struct.
        let a = unsafe { *attr };
        modify_qp(&qp, &a, mask)
    })
});

pub(crate) fn modify_qp(qp: &Qp, a: &ibv_qp_attr, mask: c_int) -> Result<(), Errno> {
    // RESET and INIT name the one idle state of an iWARP queue pair (below).
    let idle = |s: c_int| if s == IBV_QPS_RESET { IBV_QPS_INIT } else { s };
    if mask & IBV_QP_CUR_STATE != 0 && idle(a.cur_qp_state) != qp.state() {
        return Err(libc::EINVAL);
    }
    // IBV_QP_CAP: a queue pair's depths are fixed at creation. Kernel siw takes every standard attribute
    // bit and acts on the access flags and the state only (`siw_verbs_modify_qp`), so the capacities are
    // accepted and left as they are, as there.
    {
        let mut attrs = qp.attrs.lock().unwrap_or_else(|e| e.into_inner());
        if mask & IBV_QP_MAX_QP_RD_ATOMIC != 0 {
            attrs.max_rd_atomic = a.max_rd_atomic;
        }
        if mask & IBV_QP_MAX_DEST_RD_ATOMIC != 0 {
            attrs.max_dest_rd_atomic = a.max_dest_rd_atomic;
        }
        if mask & IBV_QP_ACCESS_FLAGS != 0 {
            attrs.access = a.qp_access_flags;
        }
    }
    if mask & IBV_QP_STATE == 0 {
        return Ok(());
    }
    let current = qp.state();
    match a.qp_state {
        IBV_QPS_ERR => {
            if current != IBV_QPS_ERR && !crate::cm::disconnect_qp(qp) {
                let e = crate::primitives::flush_unconnected();
                tracing::warn!("ibv_modify_qp: {}", e.context);
                return Err(libc::EOPNOTSUPP);
            }
            qp.set_state(IBV_QPS_ERR);
        }
        // As siw's state machine (siw_qp.c, `siw_qp_nextstate_from_idle`): RTS needs the connection's
        // socket, which only the connection manager gives; RTR from idle is accepted and changes nothing.
        IBV_QPS_RTS if current == IBV_QPS_RTS => {}
        IBV_QPS_RTS => {
            tracing::warn!(
                "ibv_modify_qp to RTS: an iWARP queue pair reaches RTS only through rdma_cm (rdma_connect, \
                 rdma_accept), which gives it its TCP connection: EINVAL (siw answers the same)"
            );
            return Err(libc::EINVAL);
        }
        IBV_QPS_RTR if current == IBV_QPS_INIT => {}
        // Reset is the idle state, reported INIT as siw does (siw_verbs.c maps IB_QPS_RESET and INIT to its
        // IDLE); out of Error only through Reset. A connected queue pair leaves RTS only for Error.
        s @ (IBV_QPS_RESET | IBV_QPS_INIT)
            if current == IBV_QPS_INIT || (current == IBV_QPS_ERR && s == IBV_QPS_RESET) =>
        {
            qp.set_state(idle(s));
        }
        IBV_QPS_RESET | IBV_QPS_INIT | IBV_QPS_RTR => return Err(libc::EINVAL),
        // siw maps SQD to its CLOSING and SQE to its TERMINATE (`ib_qp_state_to_siw_qp_state`); from RTS
        // both end the connection (`siw_qp_nextstate_from_rts`) and the queue pair's requests flush, as
        // librdmacm's `rdma_disconnect` does with SQD on iWARP. From any other state siw accepts them and
        // changes nothing (`siw_qp_nextstate_from_idle`: `default: break`), and so does soft-rdma.
        IBV_QPS_SQD | IBV_QPS_SQE if current == IBV_QPS_RTS => {
            crate::cm::disconnect_qp(qp);
            qp.set_state(IBV_QPS_ERR);
        }
        IBV_QPS_SQD | IBV_QPS_SQE => {}
        _ => return Err(libc::EINVAL),
    }
    Ok(())
}

export!("IBVERBS_1.1";
fn ibv_query_qp(p: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int, init: *mut ibv_qp_init_attr) -> c_int {
    ret_errno("ibv_query_qp", || {
        let qp = qp(p)?;
        if attr.is_null() || init.is_null() {
            return Err(libc::EINVAL);
        }
        let status = state::block_on(qp.qp.query()).map_err(|e| errno_of(&e))?;
        let attrs = *qp.attrs.lock().unwrap_or_else(|e| e.into_inner());
        let state = match status.state {
            soft_rdma::client::QueuePairState::Error => IBV_QPS_ERR,
            _ => attrs.state,
        };
        let (ord, ird) = if status.state == soft_rdma::client::QueuePairState::Connected {
            (status.ord.min(255) as u8, status.ird.min(255) as u8)
        } else {
            (attrs.max_rd_atomic, attrs.max_dest_rd_atomic)
        };
        let a = ibv_qp_attr {
            qp_state: state,
            cur_qp_state: state,
            path_mtu: qp.context.process.interface.ibv_mtu(),
            qp_access_flags: attrs.access,
            cap: qp.cap,
            max_rd_atomic: ord,
            max_dest_rd_atomic: ird,
            port_num: 1,
            dest_qp_num: 0,
            ..ibv_qp_attr::default()
        };
        // SAFETY: the caller's structs; the QP's C fields are live.
        unsafe {
            if mask & IBV_QP_STATE != 0 {
                // As rdma-core's ibv_query_qp: the struct's state follows what was reported.
                (*qp.ibv()).state = state;
            }
            attr.write(a);
            init.write(ibv_qp_init_attr {
                qp_context: (*qp.ibv()).qp_context,
                send_cq: qp.send_cq.ibv(),
                recv_cq: qp.recv_cq.ibv(),
                srq: qp.srq.as_ref().map_or(std::ptr::null_mut(), |s| s.ibv().cast()),
                cap: qp.cap,
                qp_type: IBV_QPT_RC,
                sq_sig_all: c_int::from(qp.sq_sig_all),
            });
        }
        Ok(())
    })
});

/// One `struct ibv_send_wr` as a soft-rdma work request.
fn send_request(qp: &Qp, wr: &ibv_send_wr) -> Result<WorkRequest, Errno> {
    if wr.num_sge < 0 || wr.num_sge as u32 > qp.cap.max_send_sge || (wr.num_sge > 0 && wr.sg_list.is_null()) {
        return Err(libc::EINVAL);
    }
    // SAFETY: `num_sge` entries of the caller's list.
    let sges: &[ibv_sge] = if wr.num_sge == 0 {
        &[]
    } else {
        unsafe { std::slice::from_raw_parts(wr.sg_list, wr.num_sge as usize) }
    };
    let silent = wr.send_flags & IBV_SEND_SIGNALED == 0 && !qp.sq_sig_all;
    let inline = wr.send_flags & IBV_SEND_INLINE != 0;
    let sgl = || -> Result<Vec<Sge>, Errno> {
        if inline {
            inline_sge(qp, sges).map(|s| vec![s])
        } else {
            Ok(sges.iter().map(|s| local_sge(s, qp.pd.ibv())).collect())
        }
    };
    let remote = RemoteBuffer {
        stag: Stag(wr.rdma.rkey),
        offset: wr.rdma.remote_addr,
    };
    Ok(match wr.opcode {
        IBV_WR_SEND | IBV_WR_SEND_WITH_INV => WorkRequest::Send {
            id: wr.wr_id,
            sgl: sgl()?,
            solicited: wr.send_flags & IBV_SEND_SOLICITED != 0,
            invalidate: (wr.opcode == IBV_WR_SEND_WITH_INV).then_some(Stag(wr.invalidate_rkey)),
            silent,
        },
        IBV_WR_RDMA_WRITE => WorkRequest::Write {
            id: wr.wr_id,
            sgl: sgl()?,
            remote,
            silent,
        },
        IBV_WR_RDMA_READ => {
            // A Read's sink is one SGE (max_sge_rd = 1) and is never inline.
            if inline || sges.len() > 1 {
                return Err(libc::EINVAL);
            }
            let sink = sges.first().map(|s| local_sge(s, qp.pd.ibv())).unwrap_or(Sge {
                stag: Stag(0),
                offset: 0,
                length: 0,
            });
            WorkRequest::Read {
                id: wr.wr_id,
                sink,
                remote,
                silent,
            }
        }
        // Immediate data, atomics, memory windows, local invalidate, TSO: not iWARP's or not soft-rdma's
        // (siw_post_send: "unsupported" opcodes get EINVAL).
        IBV_WR_RDMA_WRITE_WITH_IMM
        | IBV_WR_SEND_WITH_IMM
        | IBV_WR_ATOMIC_CMP_AND_SWP
        | IBV_WR_ATOMIC_FETCH_AND_ADD
        | IBV_WR_LOCAL_INV
        | IBV_WR_BIND_MW => return Err(libc::EINVAL),
        _ => return Err(libc::EINVAL),
    })
}

/// Copies the inline payload into the queue pair's next slot (the program may reuse its buffer as soon
/// as the post returns: ibv_post_send(3), IBV_SEND_INLINE).
fn inline_sge(qp: &Qp, sges: &[ibv_sge]) -> Result<Sge, Errno> {
    let slots = qp.inline.as_ref().ok_or(libc::EINVAL)?;
    let total: u64 = sges.iter().map(|s| u64::from(s.length)).sum();
    if total > u64::from(qp.cap.max_inline_data) {
        return Err(libc::EINVAL);
    }
    let size = qp.cap.max_inline_data as usize;
    let slot = slots.next.fetch_add(1, Ordering::Relaxed) % slots.slots;
    let mut at = slot * size;
    for s in sges {
        if s.length == 0 {
            continue;
        }
        // SAFETY: the program's own bytes, which ibv_post_send(3) says it names with addr/length.
        let bytes = unsafe { std::slice::from_raw_parts(s.addr as usize as *const u8, s.length as usize) };
        slots.region.write_at(at, bytes).map_err(|e| errno_of(&e))?;
        at += bytes.len();
    }
    Ok(slots.region.sge((slot * size) as u64, total as u32))
}

/// `ibv_context_ops.post_send`.
pub(crate) unsafe extern "C" fn post_send(
    p: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    guard("ibv_post_send", libc::EIO, || {
        post_chain(p, wr, bad, send_request)
    })
}

/// `ibv_context_ops.post_recv`.
pub(crate) unsafe extern "C" fn post_recv(
    p: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    guard("ibv_post_recv", libc::EIO, || {
        post_chain(p, wr, bad, recv_request)
    })
}

/// A chain of work requests as `infiniband/verbs.h` links them (`next`).
trait Chained {
    fn next(&self) -> *mut Self;
}

impl Chained for ibv_send_wr {
    fn next(&self) -> *mut Self {
        self.next
    }
}

impl Chained for ibv_recv_wr {
    fn next(&self) -> *mut Self {
        self.next
    }
}

/// Posts the chain at `wr` (each request made by `make`), all or none: on an error, `*bad` names the request
/// that failed (the first one when the post as a whole fails), as `ibv_post_send(3)` says.
fn post_chain<W: Chained>(
    p: *mut ibv_qp,
    wr: *mut W,
    bad: *mut *mut W,
    make: fn(&Qp, &W) -> Result<WorkRequest, Errno>,
) -> c_int {
    let fail = |at: *mut W, e: Errno| {
        if !bad.is_null() {
            // SAFETY: the caller's out-parameter.
            unsafe { *bad = at };
        }
        e
    };
    let qp = match QPS.get_hot(&LAST_QP, p) {
        Ok(qp) => qp,
        Err(e) => return fail(wr, e),
    };
    let mut requests = Vec::new();
    let mut at = wr;
    while !at.is_null() {
        // SAFETY: the caller's chain of work requests.
        let w = unsafe { &*at };
        match make(&qp, w) {
            Ok(r) => requests.push(r),
            Err(e) => return fail(at, e),
        }
        at = w.next();
    }
    post(&qp, requests).map_or_else(|e| fail(wr, e), |()| 0)
}

/// A Receive from the caller's `ibv_recv_wr`: EINVAL for a negative or too long list, or a missing one.
fn recv_request(qp: &Qp, w: &ibv_recv_wr) -> Result<WorkRequest, Errno> {
    if qp.srq.is_some() {
        // siw_post_receive: a queue pair on an SRQ has no receive queue of its own.
        return Err(libc::EINVAL);
    }
    if w.num_sge < 0 || w.num_sge as u32 > qp.cap.max_recv_sge || (w.num_sge > 0 && w.sg_list.is_null()) {
        return Err(libc::EINVAL);
    }
    let sgl = if w.num_sge == 0 {
        Vec::new()
    } else {
        // SAFETY: `num_sge` entries of the caller's list.
        unsafe { std::slice::from_raw_parts(w.sg_list, w.num_sge as usize) }
            .iter()
            .map(|s| local_sge(s, qp.pd.ibv()))
            .collect()
    };
    Ok(WorkRequest::Receive { id: w.wr_id, sgl })
}

fn post(qp: &Qp, requests: Vec<WorkRequest>) -> Result<(), Errno> {
    let _runtime = state::handle().enter();
    // A Send, Write or Read posted after rdma_accept returned but before the initiator's RTR completed
    // the client's accept (the program may have seen the initiator's first message already): it goes
    // once the accept is through, as the kernel's RTS queue pair takes it at once.
    if requests.iter().any(|r| !matches!(r, WorkRequest::Receive { .. })) {
        qp.wait_accept();
    }
    qp.qp.post(requests).map_err(|e| {
        tracing::info!(error = %e, "ibv_post_send/ibv_post_recv refused");
        errno_of(&e)
    })
}

export!("IBVERBS_1.6";
/// The extended send API (`ibv_wr_*`) is not offered: perftest and others fall back to `ibv_post_send`.
fn ibv_qp_to_qp_ex(p: *mut ibv_qp) -> *mut c_void {
    ret_ptr("ibv_qp_to_qp_ex", || {
        qp(p.cast())?;
        Err(libc::EOPNOTSUPP)
    })
});
