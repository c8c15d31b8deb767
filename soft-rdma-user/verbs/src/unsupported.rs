//! What iWARP or soft-rdma lacks, exported so that programs linked against rdma-core bind, each failing
//! with the errno rdma-core's providers give for it (siw's where siw lacks it too): address handles
//! (UD), multicast, memory windows (NULL `alloc_mw`: the inline answers EOPNOTSUPP), immediate data and atomics (`qp`), rdma_cm's UD, multicast, SRQ, ECE and rsocket calls.
//! Also the few process-wide helpers that have nothing to do (`ibv_fork_init`: soft-rdma registers
//! memory without pinning it, so fork needs no preparation). docs/rdma-core.md lists them.

use libc::{c_int, c_void, pollfd};

use crate::abi::*;
use crate::export::{export, guard, ret_errno, ret_minus_one, ret_ptr};

export!("IBVERBS_1.1";
/// Address handles are for UD queue pairs, which iWARP lacks (siw: EOPNOTSUPP).
fn ibv_create_ah(_pd: *mut ibv_pd, _attr: *mut ibv_ah_attr) -> *mut c_void {
    ret_ptr("ibv_create_ah", || Err(libc::EOPNOTSUPP))
});

export!("IBVERBS_1.1";
fn ibv_destroy_ah(_ah: *mut c_void) -> c_int {
    ret_errno("ibv_destroy_ah", || Err(libc::EINVAL))
});

export!("IBVERBS_1.1";
fn ibv_create_ah_from_wc(_pd: *mut ibv_pd, _wc: *mut ibv_wc, _grh: *mut c_void, _port: u8) -> *mut c_void {
    ret_ptr("ibv_create_ah_from_wc", || Err(libc::EOPNOTSUPP))
});

export!("IBVERBS_1.1";
fn ibv_init_ah_from_wc(_ctx: *mut ibv_context, _port: u8, _wc: *mut ibv_wc, _grh: *mut c_void, _ah: *mut ibv_ah_attr) -> c_int {
    ret_minus_one("ibv_init_ah_from_wc", || Err(libc::EOPNOTSUPP))
});

export!("IBVERBS_1.1";
/// Multicast is InfiniBand's and RoCE's (UD): EOPNOTSUPP.
fn ibv_attach_mcast(_qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16) -> c_int {
    ret_errno("ibv_attach_mcast", || Err(libc::EOPNOTSUPP))
});

export!("IBVERBS_1.1";
fn ibv_detach_mcast(_qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16) -> c_int {
    ret_errno("ibv_detach_mcast", || Err(libc::EOPNOTSUPP))
});

export!("IBVERBS_1.1";
/// soft-rdma does not pin registered memory (kernel-TCP mode reads and writes it in this process; the
/// daemon reaches it with process_vm_readv/writev), so a fork needs no preparation.
fn ibv_fork_init() -> c_int {
    0
});

export!("IBVERBS_1.1";
fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
});

export!("IBVERBS_1.1";
fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
});

export!("IBVERBS_1.13";
/// `enum ibv_fork_status` (verbs.h): IBV_FORK_UNNEEDED, for the reason `ibv_fork_init` gives.
fn ibv_is_fork_initialized() -> c_int {
    IBV_FORK_UNNEEDED
});

export!("IBVERBS_1.10";
/// Importing another process's objects shares a uverbs command descriptor (`ibv_import_device(cmd_fd)`),
/// which soft-rdma has none of: EOPNOTSUPP, as rdma-core answers for a provider without import.
fn ibv_import_device(_cmd_fd: c_int) -> *mut ibv_context {
    ret_ptr("ibv_import_device", || Err(libc::EOPNOTSUPP))
});

export!("IBVERBS_1.10";
fn ibv_import_pd(_ctx: *mut ibv_context, _pd_handle: u32) -> *mut ibv_pd {
    ret_ptr("ibv_import_pd", || Err(libc::EOPNOTSUPP))
});

export!("IBVERBS_1.10";
fn ibv_import_mr(_pd: *mut ibv_pd, _mr_handle: u32) -> *mut ibv_mr {
    ret_ptr("ibv_import_mr", || Err(libc::EOPNOTSUPP))
});

export!("IBVERBS_1.13";
/// Device memory is a NIC's (`ibv_alloc_dm` answers EOPNOTSUPP too).
fn ibv_import_dm(_ctx: *mut ibv_context, _dm_handle: u32) -> *mut c_void {
    ret_ptr("ibv_import_dm", || Err(libc::EOPNOTSUPP))
});

export!("IBVERBS_1.10";
/// Nothing is ever imported, so there is nothing to unimport: these do nothing, as rdma-core's
/// `unimport_*` do for a provider without import (`libibverbs/dummy_ops.c`). The object stays whole,
/// to be destroyed with its own call.
fn ibv_unimport_pd(_pd: *mut ibv_pd) {});

export!("IBVERBS_1.10";
fn ibv_unimport_mr(_mr: *mut ibv_mr) {});

export!("IBVERBS_1.13";
fn ibv_unimport_dm(_dm: *mut c_void) {});

export!("IBVERBS_1.12";
/// dma-buf memory is a device's or a GPU's, which soft-rdma cannot reach: EOPNOTSUPP, as siw answers.
fn ibv_reg_dmabuf_mr(_pd: *mut ibv_pd, _offset: u64, _length: usize, _iova: u64, _fd: c_int, _access: c_int) -> *mut ibv_mr {
    ret_ptr("ibv_reg_dmabuf_mr", || Err(libc::EOPNOTSUPP))
});

export!("IBVERBS_1.14";
/// Whether a Write's bytes land in order, so that a reader may poll the data instead of a completion
/// (ibv_query_qp_data_in_order(3)): 0, not guaranteed, as for siw (a provider without the op). soft-rdma
/// places each DDP segment as it arrives, but promises nothing the kernel's iWARP stack does not.
fn ibv_query_qp_data_in_order(_qp: *mut ibv_qp, _op: c_int, _flags: u32) -> c_int {
    0
});

export!("IBVERBS_1.0";
/// No sysfs tree stands for soft-rdma's device: ENOSYS (rdma-core's answer without sysfs).
fn ibv_get_sysfs_path() -> *const libc::c_char {
    guard("ibv_get_sysfs_path", std::ptr::null(), || {
        crate::export::set_errno(libc::ENOSYS);
        std::ptr::null()
    })
});

export!("RDMACM_1.0";
/// rdma_set_option(3): REUSEADDR and AFONLY are accepted (soft-rdmad's listeners bind with SO_REUSEADDR,
/// and an IPv6 address is never mapped to IPv4). The ack timeout (one byte) is accepted and has no effect,
/// as the kernel's rdma_cm does for an iWARP RC id (`rdma_set_ack_timeout` stores it; only InfiniBand's
/// queue pairs take it, and TCP's own retransmission timer governs iWARP). TOS, which the kernel would pass
/// to the RNIC's TCP, is not applied by soft-rdma: ENOSYS, as is every other option.
fn rdma_set_option(_id: *mut rdma_cm_id, level: c_int, name: c_int, value: *mut c_void, len: usize) -> c_int {
    ret_minus_one("rdma_set_option", || {
        if value.is_null() || len == 0 {
            return Err(libc::EINVAL);
        }
        match (level, name) {
            (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR | RDMA_OPTION_ID_AFONLY) => Ok(()),
            (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) if len == 1 => Ok(()),
            (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) => Err(libc::EINVAL),
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) => Err(libc::ENOSYS),
            _ => Err(libc::ENOSYS),
        }
    })
});

export!("RDMACM_1.0";
/// rsockets' poll: every descriptor these libraries hand out is a real file, so this is poll(2) (what
/// rdma-core's `rpoll` does for descriptors that are not rsockets).
fn rpoll(fds: *mut pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int {
    // SAFETY: the caller's array, as poll(2) takes it.
    unsafe { libc::poll(fds, nfds, timeout) }
});

export!("RDMACM_1.0";
/// rdma_notify is InfiniBand's (communication established on a UD/UC QP): ENOSYS.
fn rdma_notify(_id: *mut rdma_cm_id, _event: c_int) -> c_int {
    ret_minus_one("rdma_notify", || Err(libc::ENOSYS))
});

export!("RDMACM_1.0";
/// Multicast (UD): ENOSYS, what the kernel's rdma_cm answers on an iWARP device.
fn rdma_join_multicast(_id: *mut rdma_cm_id, _addr: *mut libc::sockaddr, _context: *mut c_void) -> c_int {
    ret_minus_one("rdma_join_multicast", || Err(libc::ENOSYS))
});

export!("RDMACM_1.0";
fn rdma_leave_multicast(_id: *mut rdma_cm_id, _addr: *mut libc::sockaddr) -> c_int {
    ret_minus_one("rdma_leave_multicast", || Err(libc::ENOSYS))
});

export!("RDMACM_1.1";
fn rdma_join_multicast_ex(_id: *mut rdma_cm_id, _attr: *mut c_void, _context: *mut c_void) -> c_int {
    ret_minus_one("rdma_join_multicast_ex", || Err(libc::ENOSYS))
});

export!("RDMACM_1.0";
/// SRQs: not soft-rdma's.
fn rdma_create_srq(_id: *mut rdma_cm_id, _pd: *mut ibv_pd, _attr: *mut c_void) -> c_int {
    ret_minus_one("rdma_create_srq", || Err(libc::EOPNOTSUPP))
});

export!("RDMACM_1.0";
fn rdma_create_srq_ex(_id: *mut rdma_cm_id, _attr: *mut c_void) -> c_int {
    ret_minus_one("rdma_create_srq_ex", || Err(libc::EOPNOTSUPP))
});

export!("RDMACM_1.0";
fn rdma_destroy_srq(_id: *mut rdma_cm_id) {});

export!("RDMACM_1.2";
/// For queue pairs made outside rdma_cm (`rdma_init_qp_attr`, `rdma_establish`): on iWARP the connection
/// manager moves the queue pair itself; soft-rdma connects only queue pairs made with `rdma_create_qp`:
/// ENOSYS.
fn rdma_init_qp_attr(_id: *mut rdma_cm_id, _attr: *mut ibv_qp_attr, _mask: *mut c_int) -> c_int {
    ret_minus_one("rdma_init_qp_attr", || Err(libc::ENOSYS))
});

export!("RDMACM_1.2";
fn rdma_establish(_id: *mut rdma_cm_id) -> c_int {
    ret_minus_one("rdma_establish", || Err(libc::ENOSYS))
});

export!("RDMACM_1.3";
/// Enhanced connection establishment (ECE) is an InfiniBand/RoCE vendor option: EOPNOTSUPP.
fn rdma_set_local_ece(_id: *mut rdma_cm_id, _ece: *mut c_void) -> c_int {
    ret_minus_one("rdma_set_local_ece", || Err(libc::EOPNOTSUPP))
});

export!("RDMACM_1.3";
fn rdma_get_remote_ece(_id: *mut rdma_cm_id, _ece: *mut c_void) -> c_int {
    ret_minus_one("rdma_get_remote_ece", || Err(libc::EOPNOTSUPP))
});

export!("RDMACM_1.3";
fn rdma_reject_ece(_id: *mut rdma_cm_id, _data: *const c_void, _len: u8) -> c_int {
    ret_minus_one("rdma_reject_ece", || Err(libc::EOPNOTSUPP))
});

/// `ibv_context` is the device list element of rdma_cm (`rdma_get_devices`).
pub(crate) fn device_contexts() -> Result<Vec<*mut ibv_context>, c_int> {
    let process = crate::state::process()?;
    Ok(vec![crate::cm::cm_context(&process)?.ibv()])
}

static DEVICE_LISTS: std::sync::Mutex<Vec<(usize, usize)>> = std::sync::Mutex::new(Vec::new());

export!("RDMACM_1.0";
/// The ids' shared device context, NULL-terminated.
fn rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    ret_ptr("rdma_get_devices", || {
        let mut list = device_contexts().unwrap_or_default();
        let n = list.len();
        list.push(std::ptr::null_mut());
        if !num.is_null() {
            // SAFETY: the caller's out-parameter.
            unsafe { *num = n as c_int };
        }
        let len = list.len();
        let p = Box::into_raw(list.into_boxed_slice()) as *mut *mut ibv_context;
        DEVICE_LISTS.lock().unwrap_or_else(|e| e.into_inner()).push((p as usize, len));
        Ok(p)
    })
});

export!("RDMACM_1.0";
fn rdma_free_devices(list: *mut *mut ibv_context) {
    guard("rdma_free_devices", (), || {
        let mut lists = DEVICE_LISTS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = lists.iter().position(|&(p, _)| p == list as usize) {
            let (p, len) = lists.swap_remove(i);
            // SAFETY: made by rdma_get_devices from a boxed slice of `len` pointers.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p as *mut *mut ibv_context, len)) });
        }
    })
});
