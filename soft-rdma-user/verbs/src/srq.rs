//! Shared receive queues: `ibv_create_srq`, `ibv_modify_srq`, `ibv_query_srq`, `ibv_destroy_srq` and the
//! data path's `ibv_post_srq_recv` (`ibv_context_ops.post_srq_recv`, which verbs.h's inline calls), over the
//! client's `SharedReceiveQueue`. Queue pairs name one with `ibv_qp_init_attr.srq` (`crate::qp`); its
//! limit event reaches `ibv_get_async_event` as IBV_EVENT_SRQ_LIMIT_REACHED with the SRQ as element.
//!
//! siw's rules (`siw_verbs.c` `siw_create_srq`, `siw_modify_srq`; rdma-core `providers/siw/siw.c`
//! `siw_post_srq_recv`): `max_wr` 0 or above `max_srq_wr`, `max_sge` above `max_srq_sge`, `srq_limit` above
//! `max_wr` → EINVAL; IBV_SRQ_MAX_WR in a modify → EOPNOTSUPP (no resize), a limit above the size →
//! EINVAL, 0 disarms; a post with `num_sge` 0 or above the SRQ's → EINVAL, full → ENOMEM. Destroying one a
//! queue pair still uses → EBUSY. In kernel-TCP mode the SRQ lives in this process's data path; in XDP
//! mode in soft-rdmad's, and each call is a request to it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use libc::{c_int, c_void};
use soft_rdma::client::{Sge, SharedReceiveQueue};

use crate::abi::*;
use crate::device::Context;
use crate::errno::errno_of;
use crate::export::{CCell, CObject, Errno, Registry, export, guard, ret_errno, ret_ptr};
use crate::memory::{Pd, local_sge, pd};
use crate::state;

#[repr(C)]
pub(crate) struct Srq {
    c: CCell<ibv_srq>,
    pub(crate) context: Arc<Context>,
    pd: Arc<Pd>,
    pub(crate) srq: SharedReceiveQueue,
    attr: ibv_srq_attr,
    /// Queue pairs created on it (`ibv_destroy_srq` answers EBUSY while any is live).
    users: AtomicUsize,
}

// SAFETY: #[repr(C)], the C struct first.
unsafe impl CObject for Srq {
    type C = ibv_srq;
    const KIND: &'static str = "shared receive queue";
}

pub(crate) static SRQS: Registry<Srq> = Registry::new();

impl Srq {
    pub(crate) fn ibv(&self) -> *mut ibv_srq {
        self.c.get()
    }

    pub(crate) fn hold(&self) {
        self.users.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn release(&self) {
        self.users.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The live SRQ `p` names, or EINVAL.
pub(crate) fn srq(p: *const c_void) -> Result<Arc<Srq>, Errno> {
    SRQS.get(p.cast())
}

export!("IBVERBS_1.1";
fn ibv_create_srq(p: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    ret_ptr("ibv_create_srq", || {
        // SAFETY: the caller's struct.
        let init = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
        create_srq(p, init)
    })
});

fn create_srq(p: *mut ibv_pd, init: &mut ibv_srq_init_attr) -> Result<*mut ibv_srq, Errno> {
    let pd = pd(p)?;
    let context = pd.context.clone();
    let adapter = context.process.adapter.clone();
    let a = init.attr;
    let max_sge = context.process.info.max_receive_sge;
    // siw_create_srq: max_wr 0 or too big, max_sge too big, a limit above max_wr: EINVAL. A max_sge of 0
    // gets one SGE (siw rounds its ring up the same way).
    if a.max_wr == 0
        || a.max_wr > soft_rdma::client::MAX_SRQ_DEPTH
        || a.max_sge > max_sge
        || a.srq_limit > a.max_wr
    {
        return Err(libc::EINVAL);
    }
    let sges = a.max_sge.max(1);
    let queue =
        state::block_on(adapter.create_shared_receive_queue(a.max_wr, sges, a.srq_limit)).map_err(|e| {
            tracing::warn!(error = %e, "ibv_create_srq: soft-rdma refused the shared receive queue");
            errno_of(&e)
        })?;
    let attr = ibv_srq_attr {
        max_wr: a.max_wr,
        max_sge: sges,
        srq_limit: a.srq_limit,
    };
    tracing::debug!(
        max_wr = a.max_wr,
        max_sge = sges,
        limit = a.srq_limit,
        "ibv_create_srq"
    );
    // As rdma-core: the granted sizes go back to the caller.
    init.attr = attr;
    let handle = queue.id().0 as u32;
    let srq = Arc::new(Srq {
        c: CCell::new(ibv_srq {
            context: context.ibv(),
            srq_context: init.srq_context,
            pd: p,
            handle,
            // SAFETY: all-zero is glibc's static initializer.
            mutex: unsafe { std::mem::zeroed() },
            cond: unsafe { std::mem::zeroed() },
            events_completed: 0,
        }),
        context: context.clone(),
        pd: pd.clone(),
        srq: queue,
        attr,
        users: AtomicUsize::new(0),
    });
    let weak = Arc::downgrade(&srq);
    pd.hold();
    let c = SRQS.insert(srq);
    let element = c as usize;
    let ctx = Arc::downgrade(&context);
    if let Some(s) = weak.upgrade() {
        s.srq.on_limit_reached(move || {
            if let Some(ctx) = ctx.upgrade() {
                ctx.post_async_event(IBV_EVENT_SRQ_LIMIT_REACHED, element);
            }
        });
    }
    Ok(c)
}

export!("IBVERBS_1.1";
fn ibv_modify_srq(p: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> c_int {
    ret_errno("ibv_modify_srq", || {
        let s = srq(p.cast())?;
        // SAFETY: the caller's struct.
        let a = unsafe { attr.as_ref() }.ok_or(libc::EINVAL)?;
        if mask & IBV_SRQ_MAX_WR != 0 {
            // siw_modify_srq: no resize.
            return Err(libc::EOPNOTSUPP);
        }
        if mask & !IBV_SRQ_LIMIT != 0 {
            return Err(libc::EINVAL);
        }
        if mask & IBV_SRQ_LIMIT != 0 {
            state::block_on(s.srq.set_limit(a.srq_limit)).map_err(|e| errno_of(&e))?;
        }
        Ok(())
    })
});

export!("IBVERBS_1.1";
fn ibv_query_srq(p: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    ret_errno("ibv_query_srq", || {
        let s = srq(p.cast())?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        let status = state::block_on(s.srq.query()).map_err(|e| errno_of(&e))?;
        let a = ibv_srq_attr {
            srq_limit: status.limit,
            ..s.attr
        };
        // SAFETY: the caller's struct.
        unsafe { attr.write(a) };
        Ok(())
    })
});

export!("IBVERBS_1.1";
fn ibv_destroy_srq(p: *mut ibv_srq) -> c_int {
    ret_errno("ibv_destroy_srq", || {
        let s = srq(p.cast())?;
        if s.users.load(Ordering::Acquire) > 0 {
            return Err(libc::EBUSY);
        }
        state::block_on(s.srq.close()).map_err(|e| errno_of(&e))?;
        SRQS.remove(p)?;
        s.pd.release();
        Ok(())
    })
});

/// `ibv_context_ops.post_srq_recv`: the chain in order; the first refused one stops it and `*bad` names it
/// (ibv_post_srq_recv(3)), those before it posted, as siw's ring takes them one by one.
pub(crate) unsafe extern "C" fn post_srq_recv(
    p: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    guard("ibv_post_srq_recv", libc::EIO, || post_chain(p, wr, bad))
}

fn post_chain(p: *mut ibv_srq, wr: *mut ibv_recv_wr, bad: *mut *mut ibv_recv_wr) -> c_int {
    let fail = |at: *mut ibv_recv_wr, e: Errno| {
        if !bad.is_null() {
            // SAFETY: the caller's out-parameter.
            unsafe { *bad = at };
        }
        e
    };
    let Ok(s) = srq(p.cast()) else {
        return fail(wr, libc::EINVAL);
    };
    let mut requests = Vec::new();
    let mut at = Vec::new();
    let mut w = wr;
    while !w.is_null() {
        // SAFETY: the caller's chain of work requests.
        let r = unsafe { &*w };
        if r.num_sge <= 0 || r.num_sge as u32 > s.attr.max_sge || r.sg_list.is_null() {
            // siw_post_srq_recv: no SGE or too many: EINVAL. The ones before are posted.
            return post(&s, requests).map_or_else(|(i, e)| fail(at[i], e), |()| fail(w, libc::EINVAL));
        }
        // SAFETY: `num_sge` entries of the caller's list.
        let sges = unsafe { std::slice::from_raw_parts(r.sg_list, r.num_sge as usize) };
        let sgl: Vec<Sge> = sges.iter().map(|g| local_sge(g, s.pd.ibv())).collect();
        requests.push((r.wr_id, sgl));
        at.push(w);
        w = r.next;
    }
    post(&s, requests).map_or_else(|(i, e)| fail(at[i], e), |()| 0)
}

fn post(s: &Srq, requests: Vec<(u64, Vec<Sge>)>) -> Result<(), (usize, Errno)> {
    if requests.is_empty() {
        return Ok(());
    }
    state::block_on(s.srq.post(requests)).map_err(|(i, e)| {
        tracing::info!(error = %e, "ibv_post_srq_recv refused");
        (i, errno_of(&e))
    })
}
