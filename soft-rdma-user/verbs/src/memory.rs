//! Protection domains and memory regions on the program's own memory (`ibv_alloc_pd`, `ibv_reg_mr`,
//! `ibv_reg_mr_iova2`, `ibv_dereg_mr`).
//!
//! A region is the client's borrowed registration of `length` bytes at `addr`: lkey = rkey = its STag;
//! a peer addresses byte i as tagged offset `iova + i` (`mr->addr` for `ibv_reg_mr`), and a local SGE
//! (`addr`, `length`, `lkey`) becomes the region's offset `addr - mr->addr` (verbs.h `struct ibv_sge`).
//! Each `ibv_pd` is a protection domain of the client library ([`Adapter::protection_domain`]): a region
//! registered on it is reached only through queue pairs created on it, by this program's SGEs and by a
//! peer's RDMA Write, Read and Send with Invalidate, as kernel siw checks (`siw_check_mem`: E_PD_MISMATCH).
//!
//! [`Adapter::protection_domain`]: soft_rdma::client::Adapter::protection_domain

use foldhash::HashMap;
use std::cell::RefCell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use libc::{c_int, c_void};
use soft_rdma::client::{Access, MemoryRegion, PdId, Sge, Stag};

use crate::abi::*;
use crate::device::{Context, context};
use crate::errno::errno_of;
use crate::export::{CCell, CObject, Errno, Registry, export, ret_errno, ret_ptr};
use crate::state;

#[repr(C)]
pub(crate) struct Pd {
    c: CCell<ibv_pd>,
    pub(crate) context: Arc<Context>,
    /// Its protection domain in soft-rdma: the regions and queue pairs made on it carry it.
    pub(crate) id: PdId,
    /// Regions and queue pairs made on it (`ibv_dealloc_pd` answers EBUSY while any is live).
    users: AtomicUsize,
}

// SAFETY: #[repr(C)], the C struct first.
unsafe impl CObject for Pd {
    type C = ibv_pd;
    const KIND: &'static str = "protection domain";
}

pub(crate) static PDS: Registry<Pd> = Registry::new();

impl Pd {
    pub(crate) fn ibv(&self) -> *mut ibv_pd {
        self.c.get()
    }

    pub(crate) fn hold(&self) {
        self.users.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn release(&self) {
        self.users.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The live PD `p` names, or EINVAL.
pub(crate) fn pd(p: *const ibv_pd) -> Result<Arc<Pd>, Errno> {
    PDS.get(p)
}

export!("IBVERBS_1.1";
fn ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    ret_ptr("ibv_alloc_pd", || {
        let context = context(ctx)?;
        if !context.process.adapter_alive() {
            // The device is gone (soft-rdmad went away): EIO, as uverbs after a disassociation.
            return Err(libc::EIO);
        }
        static HANDLES: AtomicUsize = AtomicUsize::new(1);
        let id = context.process.adapter.protection_domain();
        let pd = Arc::new(Pd {
            c: CCell::new(ibv_pd {
                context: ctx,
                handle: HANDLES.fetch_add(1, Ordering::Relaxed) as u32,
            }),
            context,
            id,
            users: AtomicUsize::new(0),
        });
        Ok(PDS.insert(pd))
    })
});

export!("IBVERBS_1.1";
fn ibv_dealloc_pd(p: *mut ibv_pd) -> c_int {
    ret_errno("ibv_dealloc_pd", || {
        let pd = pd(p)?;
        if pd.users.load(Ordering::Acquire) > 0 {
            return Err(libc::EBUSY);
        }
        PDS.remove(p)?;
        Ok(())
    })
});

/// A registered region of the program's memory.
#[repr(C)]
pub(crate) struct Mr {
    c: CCell<ibv_mr>,
    pd: Arc<Pd>,
    region: MemoryRegion,
}

// SAFETY: #[repr(C)], the C struct first.
unsafe impl CObject for Mr {
    type C = ibv_mr;
    const KIND: &'static str = "memory region";
}

static MRS: Registry<Mr> = Registry::new();

/// A live region as the data path sees it: its first byte's address, its length and its PD.
#[derive(Clone, Copy)]
struct LocalRegion {
    base: u64,
    len: u64,
    pd: usize,
}

/// The live regions by lkey: the data path turns SGEs into region offsets with it.
static BY_LKEY: LazyLock<Mutex<HashMap<u32, LocalRegion>>> = LazyLock::new(Mutex::default);
/// Regions deregistered so far: a thread's copy of `BY_LKEY`'s entries ([`KNOWN_LKEYS`]) made before the
/// last one is forgotten.
static LKEY_REMOVALS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The regions this thread's posts named, copied from `BY_LKEY` (with the count of removals then), so
    /// that a post looks its SGEs up without the process-wide lock. A registration adds an lkey no copy
    /// holds; a deregistration bumps the count, and every thread's copy is dropped at its next post.
    static KNOWN_LKEYS: RefCell<(u64, HashMap<u32, LocalRegion>)> = RefCell::new((0, HashMap::default()));
}

/// The live region `lkey` names, if any: from this thread's copy, or `BY_LKEY` the first time.
fn region_of(lkey: u32) -> Option<LocalRegion> {
    let removals = LKEY_REMOVALS.load(Ordering::Acquire);
    KNOWN_LKEYS.with(|known| {
        let mut known = known.borrow_mut();
        if known.0 != removals {
            known.1.clear();
            known.0 = removals;
        }
        if let Some(r) = known.1.get(&lkey) {
            return Some(*r);
        }
        let r = *BY_LKEY.lock().unwrap_or_else(|p| p.into_inner()).get(&lkey)?;
        known.1.insert(lkey, r);
        Some(r)
    })
}

/// `sge` as soft-rdma's SGE on a queue pair of `pd`: the region's offset of `addr`. An lkey that names no
/// region, a region of another PD, or bytes outside it, pass through with an offset the data path refuses,
/// so the request completes with a local protection error (IBV_WC_LOC_PROT_ERR), as siw completes it.
pub(crate) fn local_sge(sge: &ibv_sge, pd: *const ibv_pd) -> Sge {
    let offset = match region_of(sge.lkey) {
        Some(LocalRegion { base, len, pd: owner })
            if owner == pd as usize && sge.addr >= base && sge.addr - base + u64::from(sge.length) <= len =>
        {
            sge.addr - base
        }
        // Past any region's end: refused by the data path's bounds check.
        _ => u64::MAX - u64::from(sge.length),
    };
    Sge {
        stag: Stag(sge.lkey),
        offset,
        length: sge.length,
    }
}

/// verbs.h `enum ibv_access_flags` as soft-rdma's access. On-demand paging and zero-based regions are not
/// soft-rdma's: EOPNOTSUPP (the kernel refuses ON_DEMAND without ODP, `ib_check_mr_access`; siw would
/// ignore ZERO_BASED and place data at the wrong addresses). Remote atomic and memory-window bind access
/// are accepted and dropped, as kernel siw does (`siw_reg_user_mr` keeps `rights & IWARP_ACCESS_MASK`): no
/// atomic ever arrives on iWARP, soft-rdma has no memory windows to bind (`ibv_alloc_mw` fails), and qperf
/// and libfabric's verbs provider ask for remote atomic on every region.
fn access_of(flags: c_int) -> Result<Access, Errno> {
    let known = IBV_ACCESS_LOCAL_WRITE
        | IBV_ACCESS_REMOTE_WRITE
        | IBV_ACCESS_REMOTE_READ
        | IBV_ACCESS_REMOTE_ATOMIC
        | IBV_ACCESS_MW_BIND
        | IBV_ACCESS_ZERO_BASED
        | IBV_ACCESS_ON_DEMAND
        | IBV_ACCESS_HUGETLB
        | IBV_ACCESS_OPTIONAL_RANGE;
    if flags & !known != 0 {
        return Err(libc::EINVAL);
    }
    if flags & (IBV_ACCESS_ZERO_BASED | IBV_ACCESS_ON_DEMAND) != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    // verbs(7) / ibv_reg_mr(3), and the kernel's `ib_check_mr_access`: remote write or remote atomic needs
    // local write.
    if flags & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) != 0
        && flags & IBV_ACCESS_LOCAL_WRITE == 0
    {
        return Err(libc::EINVAL);
    }
    let mut a = Access::LOCAL_READ;
    if flags & IBV_ACCESS_LOCAL_WRITE != 0 {
        a = a.union(Access::LOCAL_WRITE);
    }
    if flags & IBV_ACCESS_REMOTE_READ != 0 {
        a = a.union(Access::REMOTE_READ);
    }
    if flags & IBV_ACCESS_REMOTE_WRITE != 0 {
        a = a.union(Access::REMOTE_WRITE);
    }
    Ok(a)
}

fn reg_mr(
    p: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> Result<*mut ibv_mr, Errno> {
    let pd = pd(p)?;
    let access = access_of(access)?;
    let base = NonNull::new(addr.cast::<u8>()).ok_or(libc::EINVAL)?;
    if length == 0 {
        return Err(libc::EINVAL);
    }
    if !pd.context.process.adapter_alive() {
        // The device is gone (soft-rdmad went away): EIO, as uverbs after a disassociation.
        return Err(libc::EIO);
    }
    let adapter = pd.context.process.adapter.clone();
    let in_pd = pd.id;
    // SAFETY: the program owns these bytes and keeps them mapped until ibv_dereg_mr (ibv_reg_mr(3)).
    let region = state::block_on(async move {
        unsafe { crate::primitives::register_borrowed_memory(&adapter, in_pd, base, length, iova, access) }
            .await
    })
    .map_err(|e| {
        tracing::warn!(error = %e, "ibv_reg_mr: soft-rdma refused to register {length} bytes");
        errno_of(&e)
    })?;
    let stag = region.stag().0;
    let mr = Arc::new(Mr {
        c: CCell::new(ibv_mr {
            context: pd.context.ibv(),
            pd: p,
            addr,
            length,
            handle: stag,
            lkey: stag,
            rkey: stag,
        }),
        pd: pd.clone(),
        region,
    });
    pd.hold();
    BY_LKEY.lock().unwrap_or_else(|p| p.into_inner()).insert(
        stag,
        LocalRegion {
            base: addr as u64,
            len: length as u64,
            pd: p as usize,
        },
    );
    Ok(MRS.insert(mr))
}

export!("IBVERBS_1.1";
fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, length: usize, access: c_int) -> *mut ibv_mr {
    ret_ptr("ibv_reg_mr", || reg_mr(pd, addr, length, addr as u64, access))
});

export!("IBVERBS_1.7";
fn ibv_reg_mr_iova(pd: *mut ibv_pd, addr: *mut c_void, length: usize, iova: u64, access: c_int) -> *mut ibv_mr {
    ret_ptr("ibv_reg_mr_iova", || reg_mr(pd, addr, length, iova, access))
});

export!("IBVERBS_1.8";
/// What `ibv_reg_mr` becomes in verbs.h whenever the access flags are not a compile-time constant.
fn ibv_reg_mr_iova2(pd: *mut ibv_pd, addr: *mut c_void, length: usize, iova: u64, access: u32) -> *mut ibv_mr {
    ret_ptr("ibv_reg_mr_iova2", || reg_mr(pd, addr, length, iova, access as c_int))
});

export!("IBVERBS_1.1";
fn ibv_dereg_mr(p: *mut ibv_mr) -> c_int {
    ret_errno("ibv_dereg_mr", || {
        let mr = MRS.remove(p)?;
        let mut by_lkey = BY_LKEY.lock().unwrap_or_else(|p| p.into_inner());
        // Before the entry goes: a thread that reads the old count afterwards finds the map without it.
        LKEY_REMOVALS.fetch_add(1, Ordering::AcqRel);
        by_lkey.remove(&mr.region.stag().0);
        drop(by_lkey);
        mr.pd.release();
        Ok(())
    })
});

export!("IBVERBS_1.1";
/// Re-registration: soft-rdma has no in-place change of a region (siw has none either). It answers as
/// rdma-core does for a provider without `rereg_mr` (`libibverbs/dummy_ops.c`): `IBV_REREG_MR_ERR_INPUT`
/// (an `enum ibv_rereg_mr_err_code`, verbs.h, not an errno) with errno EOPNOTSUPP; EINVAL for a region that
/// is not live or flags outside `IBV_REREG_MR_FLAGS_SUPPORTED`.
fn ibv_rereg_mr(mr: *mut ibv_mr, flags: c_int, _pd: *mut ibv_pd, _addr: *mut c_void, _length: usize, _access: c_int) -> c_int {
    crate::export::guard("ibv_rereg_mr", IBV_REREG_MR_ERR_INPUT, || {
        let e = if flags & !IBV_REREG_MR_FLAGS_SUPPORTED != 0 || MRS.get(mr).is_err() {
            libc::EINVAL
        } else {
            libc::EOPNOTSUPP
        };
        crate::export::set_errno(e);
        IBV_REREG_MR_ERR_INPUT
    })
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_flags_map_or_are_refused() {
        assert_eq!(access_of(0), Ok(Access::LOCAL_READ));
        assert_eq!(
            access_of(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ),
            Ok(Access::ALL)
        );
        assert_eq!(access_of(IBV_ACCESS_REMOTE_WRITE), Err(libc::EINVAL));
        // Remote atomic: accepted and dropped, as siw; without local write refused, as the kernel does.
        assert_eq!(
            access_of(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC),
            Ok(Access::LOCAL_WRITE)
        );
        assert_eq!(access_of(IBV_ACCESS_REMOTE_ATOMIC), Err(libc::EINVAL));
        // Memory-window bind: accepted and dropped, as siw.
        assert_eq!(
            access_of(IBV_ACCESS_MW_BIND | IBV_ACCESS_LOCAL_WRITE),
            Ok(Access::LOCAL_WRITE)
        );
        assert_eq!(
            access_of(IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE),
            Err(libc::EOPNOTSUPP)
        );
        assert_eq!(access_of(1 << 15), Err(libc::EINVAL));
        // Relaxed ordering is a hint.
        assert_eq!(
            access_of(IBV_ACCESS_LOCAL_WRITE | (1 << 20)),
            Ok(Access::LOCAL_WRITE)
        );
    }

    #[test]
    fn an_unknown_lkey_or_range_becomes_an_offset_the_data_path_refuses() {
        let pd = 0x7000 as *const ibv_pd;
        let region = LocalRegion {
            base: 0x1000,
            len: 0x100,
            pd: pd as usize,
        };
        BY_LKEY.lock().unwrap().insert(0x4242, region);
        let ok = local_sge(
            &ibv_sge {
                addr: 0x1010,
                length: 0x10,
                lkey: 0x4242,
            },
            pd,
        );
        assert_eq!((ok.offset, ok.length, ok.stag), (0x10, 0x10, Stag(0x4242)));
        let sge = |addr, lkey| ibv_sge {
            addr,
            length: 0x10,
            lkey,
        };
        assert!(local_sge(&sge(0x10f8, 0x4242), pd).offset > 0x100, "past the end");
        assert!(local_sge(&sge(0x1010, 0x4343), pd).offset > 0x100, "unknown lkey");
        let other_pd = 0x8000 as *const ibv_pd;
        assert!(
            local_sge(&sge(0x1010, 0x4242), other_pd).offset > 0x100,
            "another PD's region"
        );
        // Deregistered (as `ibv_dereg_mr` does it): this thread's copy of the region is forgotten.
        {
            let mut by_lkey = BY_LKEY.lock().unwrap();
            LKEY_REMOVALS.fetch_add(1, Ordering::AcqRel);
            by_lkey.remove(&0x4242);
        }
        assert!(
            local_sge(&sge(0x1010, 0x4242), pd).offset > 0x100,
            "a deregistered region"
        );
    }
}
