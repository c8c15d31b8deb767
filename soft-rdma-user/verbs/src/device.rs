//! The device (`softrdma0`, one per soft-rdmad: an RNIC, transport iWARP) and its contexts: the device
//! list, `ibv_open_device`/`ibv_close_device`, the queries (`ibv_query_device`, `ibv_query_port`,
//! `ibv_query_gid` and their extended forms) and the async event file (`ibv_get_async_event`,
//! IBV_EVENT_DEVICE_FATAL when soft-rdmad's session ends).
//!
//! A context is rdma-core's `struct verbs_context` with `abi_compat = __VERBS_ABI_IS_EXTENDED` and `sz`
//! set, every extended op NULL (verbs.h `verbs_get_ctx_op` then makes the inlines fall back to the
//! exported functions or answer EOPNOTSUPP), and `ops` holding the data path: `post_send`, `post_recv`,
//! `poll_cq`, `req_notify_cq`.

use std::collections::VecDeque;
use std::mem::offset_of;
use std::sync::{Arc, Mutex, OnceLock};

use libc::{c_char, c_int, c_void};

use crate::abi::*;
use crate::export::{CCell, CObject, EventPipe, Registry, export, ret_errno, ret_ptr, set_errno};
use crate::state::{self, DEVICE_NAME, Process};

/// An open device context.
#[repr(C)]
pub(crate) struct Context {
    c: CCell<verbs_context>,
    pub(crate) process: Arc<Process>,
    async_pipe: EventPipe,
    /// Events for `ibv_get_async_event`: (type, element).
    async_events: Mutex<VecDeque<(c_int, usize)>>,
}

// SAFETY: #[repr(C)], the C struct first.
unsafe impl CObject for Context {
    type C = verbs_context;
    const KIND: &'static str = "device context";
}

static CONTEXTS: Registry<Context> = Registry::new();

const CONTEXT_OFFSET: usize = offset_of!(verbs_context, context);

impl Context {
    /// The `struct ibv_context *` C callers hold.
    pub(crate) fn ibv(&self) -> *mut ibv_context {
        // SAFETY: the field of a live struct.
        unsafe { &raw mut (*self.c.get()).context }
    }

    /// Queues an async event and wakes `ibv_get_async_event`.
    pub(crate) fn post_async_event(&self, event_type: c_int, element: usize) {
        self.async_events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back((event_type, element));
        self.async_pipe.ring();
    }
}

/// The live context `p` names, or EINVAL.
pub(crate) fn context(p: *const ibv_context) -> Result<Arc<Context>, c_int> {
    CONTEXTS.get(p.wrapping_byte_sub(CONTEXT_OFFSET).cast())
}

/// Every open context (the async events of soft-rdmad going away reach each).
pub(crate) fn contexts() -> Vec<Arc<Context>> {
    CONTEXTS.all()
}

/// The one `struct ibv_device`, made once and never freed (device lists point at it).
fn device() -> *mut ibv_device {
    static DEVICE: OnceLock<usize> = OnceLock::new();
    *DEVICE.get_or_init(|| {
        let mut d = ibv_device {
            _ops: [std::ptr::null_mut(); 2],
            node_type: IBV_NODE_RNIC,
            transport_type: IBV_TRANSPORT_IWARP,
            name: [0; IBV_SYSFS_NAME_MAX],
            dev_name: [0; IBV_SYSFS_NAME_MAX],
            dev_path: [0; IBV_SYSFS_PATH_MAX],
            ibdev_path: [0; IBV_SYSFS_PATH_MAX],
        };
        copy_c_str(&mut d.name, DEVICE_NAME);
        copy_c_str(&mut d.dev_name, "soft-rdmad");
        Box::into_raw(Box::new(d)) as usize
    }) as *mut ibv_device
}

pub(crate) fn copy_c_str(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len() - 1);
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
    dst[n] = 0;
}

fn check_device(d: *const ibv_device) -> Result<(), c_int> {
    if d.is_null() || !std::ptr::eq(d, device()) {
        return Err(libc::EINVAL);
    }
    Ok(())
}

/// The lists handed out, with their lengths, until `ibv_free_device_list`.
static LISTS: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

export!("IBVERBS_1.1";
/// verbs.h `ibv_get_device_list`: one device when soft-rdmad answers, none (and a word on stderr) when not.
fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    ret_ptr("ibv_get_device_list", || {
        let devices: Vec<*mut ibv_device> = match state::process() {
            Ok(_) => vec![device(), std::ptr::null_mut()],
            Err(_) => vec![std::ptr::null_mut()],
        };
        if !num_devices.is_null() {
            // SAFETY: the caller's out-parameter (verbs.h: may be NULL).
            unsafe { *num_devices = devices.len() as c_int - 1 };
        }
        let len = devices.len();
        let list = Box::into_raw(devices.into_boxed_slice()) as *mut *mut ibv_device;
        LISTS.lock().unwrap_or_else(|p| p.into_inner()).push((list as usize, len));
        Ok(list)
    })
});

export!("IBVERBS_1.1";
fn ibv_free_device_list(list: *mut *mut ibv_device) {
    crate::export::guard("ibv_free_device_list", (), || {
        let mut lists = LISTS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = lists.iter().position(|&(p, _)| p == list as usize) {
            let (p, len) = lists.swap_remove(i);
            // SAFETY: made by ibv_get_device_list from a boxed slice of `len` pointers.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p as *mut *mut ibv_device, len)) });
        }
    })
});

export!("IBVERBS_1.1";
fn ibv_get_device_name(d: *mut ibv_device) -> *const c_char {
    crate::export::guard("ibv_get_device_name", std::ptr::null(), || match check_device(d) {
        // SAFETY: the live device.
        Ok(()) => unsafe { (*d).name.as_ptr() },
        Err(e) => {
            set_errno(e);
            std::ptr::null()
        }
    })
});

export!("IBVERBS_1.1";
/// The node GUID (__be64).
fn ibv_get_device_guid(d: *mut ibv_device) -> u64 {
    crate::export::guard("ibv_get_device_guid", 0, || match (check_device(d), state::process()) {
        (Ok(()), Ok(p)) => p.interface.guid(),
        _ => {
            set_errno(libc::EINVAL);
            0
        }
    })
});

export!("IBVERBS_1.9";
fn ibv_get_device_index(d: *mut ibv_device) -> c_int {
    crate::export::guard("ibv_get_device_index", -1, || match check_device(d) {
        Ok(()) => 0,
        Err(_) => -1,
    })
});

export!("IBVERBS_1.1";
fn ibv_open_device(d: *mut ibv_device) -> *mut ibv_context {
    ret_ptr("ibv_open_device", || {
        check_device(d)?;
        let process = state::process()?;
        open_context(process)
    })
});

/// A new context on the session (the one rdma_cm ids share is made here too).
pub(crate) fn open_context(process: Arc<Process>) -> Result<*mut ibv_context, c_int> {
    let async_pipe = EventPipe::new()?;
    let context = ibv_context {
        device: device(),
        ops: ibv_context_ops {
            _compat_query_device: std::ptr::null_mut(),
            _compat_query_port: std::ptr::null_mut(),
            _compat_pd_mr: [std::ptr::null_mut(); 5],
            alloc_mw: std::ptr::null_mut(),
            bind_mw: std::ptr::null_mut(),
            dealloc_mw: std::ptr::null_mut(),
            _compat_create_cq: std::ptr::null_mut(),
            poll_cq: Some(crate::cq::poll_cq),
            req_notify_cq: Some(crate::cq::req_notify_cq),
            _compat_cq_srq: [std::ptr::null_mut(); 7],
            post_srq_recv: crate::srq::post_srq_recv as *mut c_void,
            _compat_qp: [std::ptr::null_mut(); 4],
            post_send: Some(crate::qp::post_send),
            post_recv: Some(crate::qp::post_recv),
            _compat_tail: [std::ptr::null_mut(); 5],
        },
        cmd_fd: -1,
        async_fd: async_pipe.read,
        num_comp_vectors: 1,
        // SAFETY: an all-zero pthread_mutex_t is PTHREAD_MUTEX_INITIALIZER on glibc.
        mutex: unsafe { std::mem::zeroed() },
        abi_compat: VERBS_ABI_IS_EXTENDED,
    };
    let mut ops = [std::ptr::null_mut(); VERBS_CONTEXT_OPS];
    ops[VERBS_OP_QUERY_DEVICE_EX] = query_device_ex as *mut c_void;
    let vctx = verbs_context {
        ops,
        _ABI_placeholder3: 0,
        sz: std::mem::size_of::<verbs_context>(),
        context,
    };
    let ctx = Arc::new(Context {
        c: CCell::new(vctx),
        process: process.clone(),
        async_pipe,
        async_events: Mutex::default(),
    });
    let ibv = ctx.ibv();
    CONTEXTS.insert(ctx);
    Ok(ibv)
}

export!("IBVERBS_1.1";
fn ibv_close_device(ctx: *mut ibv_context) -> c_int {
    ret_errno("ibv_close_device", || {
        let c = context(ctx)?;
        CONTEXTS.remove(c.c.get())?;
        Ok(())
    })
});

export!("IBVERBS_1.1";
fn ibv_query_device(ctx: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int {
    ret_errno("ibv_query_device", || {
        let c = context(ctx)?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's struct.
        unsafe { attr.write(device_attr(&c.process)) };
        Ok(())
    })
});

/// `verbs_context.query_device_ex` (verbs.h), reached through the header's `ibv_query_device_ex` inline:
/// the device's attributes and, where the caller's struct is large enough, the extended ones (one port).
/// Returns an errno value, as the op's callers expect.
unsafe extern "C" fn query_device_ex(
    ctx: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    ret_errno("ibv_query_device_ex", || {
        let c = context(ctx)?;
        // SAFETY: the caller's input struct, when given.
        if attr.is_null() || (!input.is_null() && unsafe { (*input).comp_mask } != 0) {
            return Err(libc::EINVAL);
        }
        if attr_size < std::mem::size_of::<ibv_device_attr>() {
            return Err(libc::EOPNOTSUPP);
        }
        let size = attr_size.min(std::mem::size_of::<ibv_device_attr_ex>());
        // SAFETY: the caller's struct of `attr_size` bytes, of which the first `size` are written.
        unsafe {
            std::ptr::write_bytes(attr.cast::<u8>(), 0, size);
            std::ptr::addr_of_mut!((*attr).orig_attr).write(device_attr(&c.process));
            if size == std::mem::size_of::<ibv_device_attr_ex>() {
                std::ptr::addr_of_mut!((*attr).phys_port_cnt_ex).write(1);
            }
        }
        Ok(())
    })
}

/// What soft-rdma's limits make of `struct ibv_device_attr` (siw's `siw_query_device` for the fields with
/// no soft-rdma counterpart).
pub(crate) fn device_attr(p: &Process) -> ibv_device_attr {
    let i = &p.info;
    let clamp = |v: u32| v.min(i32::MAX as u32) as c_int;
    // The session's object bound is soft-rdmad's --max-objects-per-session (65,536 by default), which the
    // Welcome does not carry; regions have their own bound (--max-regions-per-session, 4,096).
    const MAX_OBJECTS: c_int = 65_536;
    const MAX_REGIONS: c_int = 4_096;
    // SAFETY: all-zero is a valid ibv_device_attr (integers and a byte array).
    let mut a: ibv_device_attr = unsafe { std::mem::zeroed() };
    copy_c_str(&mut a.fw_ver, concat!("soft-rdma ", env!("CARGO_PKG_VERSION")));
    a.node_guid = p.interface.guid();
    a.sys_image_guid = p.interface.guid();
    a.max_mr_size = u64::from(i.max_transfer_length);
    a.page_size_cap = page_size() as u64;
    a.vendor_id = SOFT_RDMA_VENDOR_ID;
    a.max_qp = MAX_OBJECTS;
    a.max_qp_wr = clamp(i.max_send_queue_depth.min(i.max_receive_queue_depth));
    a.max_sge = clamp(i.max_send_sge.min(i.max_receive_sge));
    // An RDMA Read's sink is one SGE (as siw: SIW_MAX_SGE_RD).
    a.max_sge_rd = 1;
    a.max_cq = MAX_OBJECTS;
    a.max_cqe = clamp(i.max_completion_queue_depth);
    a.max_mr = MAX_REGIONS;
    a.max_pd = MAX_OBJECTS;
    a.max_qp_rd_atom = clamp(i.max_inbound_read_limit);
    a.max_res_rd_atom = clamp(i.max_inbound_read_limit);
    a.max_qp_init_rd_atom = clamp(i.max_outbound_read_limit);
    a.max_pkeys = 1;
    a.phys_port_cnt = 1;
    // Shared receive queues (siw's bounds are `SIW_MAX_SRQ`, `SIW_MAX_SRQ_WR`, `SIW_MAX_SGE`).
    a.max_srq = soft_rdma::client::MAX_SRQS_PER_SESSION as c_int;
    a.max_srq_wr = clamp(soft_rdma::client::MAX_SRQ_DEPTH);
    a.max_srq_sge = clamp(i.max_receive_sge);
    a
}

pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let s = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if s > 0 { s as usize } else { 4096 }
}

export!("IBVERBS_1.1";
/// The exported `ibv_query_port` the header's inline falls back to (its `struct _compat_ibv_port_attr` is
/// `struct ibv_port_attr` in rdma-core 44).
fn ibv_query_port(ctx: *mut ibv_context, port: u8, attr: *mut ibv_port_attr) -> c_int {
    ret_errno("ibv_query_port", || {
        let c = context(ctx)?;
        if port != 1 || attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's struct.
        unsafe { attr.write(port_attr(&c.process)) };
        Ok(())
    })
});

pub(crate) fn port_attr(p: &Process) -> ibv_port_attr {
    // SAFETY: all-zero is a valid ibv_port_attr.
    let mut a: ibv_port_attr = unsafe { std::mem::zeroed() };
    a.state = if p.adapter_alive() {
        IBV_PORT_ACTIVE
    } else {
        IBV_PORT_DOWN
    };
    a.max_mtu = IBV_MTU_4096;
    a.active_mtu = p.interface.ibv_mtu();
    a.gid_tbl_len = 1;
    a.port_cap_flags = IBV_PORT_CM_SUP | IBV_PORT_DEVICE_MGMT_SUP;
    a.max_msg_sz = p.info.max_transfer_length;
    a.pkey_tbl_len = 1;
    // IBV_WIDTH_4X, IBV_SPEED_QDR: nominal, as siw reports for links it cannot measure.
    a.active_width = 2;
    a.active_speed = 4;
    // LinkUp (IB spec: PortPhysicalState 5) while soft-rdmad answers, Disabled (3) after.
    a.phys_state = if p.adapter_alive() { 5 } else { 3 };
    a.link_layer = IBV_LINK_LAYER_ETHERNET;
    a
}

export!("IBVERBS_1.1";
fn ibv_query_gid(ctx: *mut ibv_context, port: u8, index: c_int, gid: *mut ibv_gid) -> c_int {
    // verbs.h: "0 on success, -1 on error".
    crate::export::ret_minus_one("ibv_query_gid", || {
        let c = context(ctx)?;
        if port != 1 || index != 0 || gid.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's union.
        unsafe { (*gid).raw = c.process.interface.gid() };
        Ok(())
    })
});

export!("IBVERBS_PRIVATE_34";
/// rdma-core's private `ibv_query_gid_type` (ibv_devinfo -v): IBV_GID_TYPE_IB, what an iWARP device's
/// GID is typed.
fn ibv_query_gid_type(ctx: *mut ibv_context, port: u8, index: c_uint, gid_type: *mut c_int) -> c_int {
    ret_errno("ibv_query_gid_type", || {
        context(ctx)?;
        if port != 1 || index != 0 || gid_type.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's out-parameter.
        unsafe { *gid_type = 0 };
        Ok(())
    })
});

export!("IBVERBS_1.11";
/// `ibv_query_gid_ex`'s exported half: fills `entry_size` bytes of a `struct ibv_gid_entry`.
fn _ibv_query_gid_ex(ctx: *mut ibv_context, port: u32, index: u32, entry: *mut ibv_gid_entry, flags: u32, entry_size: usize) -> c_int {
    ret_errno("ibv_query_gid_ex", || {
        let c = context(ctx)?;
        if port != 1 || entry.is_null() || flags != 0 || entry_size < std::mem::size_of::<ibv_gid_entry>() {
            return Err(libc::EINVAL);
        }
        if index != 0 {
            return Err(libc::ENODATA);
        }
        // SAFETY: the caller's struct, at least this large (checked above).
        unsafe { entry.write(gid_entry(&c)) };
        Ok(())
    })
});

/// The one GID entry of port 1, as `_ibv_query_gid_ex` gives it.
fn gid_entry(c: &Context) -> ibv_gid_entry {
    ibv_gid_entry {
        gid: ibv_gid {
            raw: c.process.interface.gid(),
        },
        gid_index: 0,
        port_num: 1,
        gid_type: 0,
        ndev_ifindex: c.process.interface.ifindex(),
    }
}

export!("IBVERBS_1.11";
/// `ibv_query_gid_table`'s exported half (verbs.h): the device's GID table, which holds one entry (port 1,
/// index 0, from the interface's MAC as siw's), written `entry_size` bytes apart. Returns how many entries
/// it wrote, or a negative errno (rdma-core's contract for this call).
fn _ibv_query_gid_table(ctx: *mut ibv_context, entries: *mut ibv_gid_entry, max_entries: usize, flags: u32, entry_size: usize) -> isize {
    crate::export::guard("ibv_query_gid_table", -(libc::EIO as isize), || {
        let Ok(c) = context(ctx) else {
            return -(libc::EINVAL as isize);
        };
        if entries.is_null() || flags != 0 || entry_size < std::mem::size_of::<ibv_gid_entry>() {
            return -(libc::EINVAL as isize);
        }
        if max_entries < 1 {
            return -(libc::EINVAL as isize);
        }
        // SAFETY: the caller's array of at least one entry of `entry_size` bytes (checked above).
        unsafe { entries.write(gid_entry(&c)) };
        1
    })
});

export!("IBVERBS_1.1";
fn ibv_query_pkey(ctx: *mut ibv_context, port: u8, index: c_int, pkey: *mut u16) -> c_int {
    crate::export::ret_minus_one("ibv_query_pkey", || {
        context(ctx)?;
        if port != 1 || index != 0 || pkey.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's out-parameter: the default P_Key, as siw reports.
        unsafe { *pkey = 0xffff_u16.to_be() };
        Ok(())
    })
});

export!("IBVERBS_1.1";
/// Waits (unless the program set O_NONBLOCK on `async_fd`) for the next async event.
fn ibv_get_async_event(ctx: *mut ibv_context, event: *mut ibv_async_event) -> c_int {
    crate::export::ret_minus_one("ibv_get_async_event", || {
        let c = context(ctx)?;
        if event.is_null() {
            return Err(libc::EINVAL);
        }
        c.async_pipe.wait()?;
        let (event_type, element) = c
            .async_events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
            .ok_or(libc::EAGAIN)?;
        // SAFETY: the caller's struct.
        unsafe {
            event.write(ibv_async_event {
                element: element as *mut c_void,
                event_type,
            })
        };
        Ok(())
    })
});

export!("IBVERBS_1.1";
fn ibv_ack_async_event(_event: *mut ibv_async_event) {});

export!("IBVERBS_1.0";
/// rdma-core's historical helper: reads `dir/file` into `buf` without its trailing newline; the length,
/// or -1.
fn ibv_read_sysfs_file(dir: *const c_char, file: *const c_char, buf: *mut c_char, size: usize) -> c_int {
    crate::export::guard("ibv_read_sysfs_file", -1, || {
        if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: NUL-terminated strings from the caller.
        let (d, f) = unsafe { (std::ffi::CStr::from_ptr(dir), std::ffi::CStr::from_ptr(file)) };
        let path = std::path::Path::new(std::ffi::OsStr::from_bytes_compat(d.to_bytes())).join(std::ffi::OsStr::from_bytes_compat(f.to_bytes()));
        match std::fs::read(&path) {
            Ok(mut bytes) => {
                bytes.truncate(size - 1);
                if bytes.last() == Some(&b'\n') {
                    bytes.pop();
                }
                // SAFETY: `size` bytes of the caller's buffer; at most size - 1 written plus the NUL.
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), bytes.len());
                    *buf.add(bytes.len()) = 0;
                }
                bytes.len() as c_int
            }
            Err(e) => {
                set_errno(e.raw_os_error().unwrap_or(libc::EIO));
                -1
            }
        }
    })
});

use libc::c_uint;

/// `OsStr` from bytes (Unix).
trait FromBytesCompat {
    fn from_bytes_compat(b: &[u8]) -> &std::ffi::OsStr;
}

impl FromBytesCompat for std::ffi::OsStr {
    fn from_bytes_compat(b: &[u8]) -> &std::ffi::OsStr {
        std::os::unix::ffi::OsStrExt::from_bytes(b)
    }
}
