//! rdma-core's provider-facing symbols (`IBVERBS_PRIVATE_34`: `ibv_cmd_*`, `verbs_*`) and historical
//! helpers, exported because the provider libraries some programs link directly (perftest links
//! `libmlx5.so.1` and `libefa.so.1` for their direct-verbs calls) import them and are bound at load time
//! (`-z now`). They run only on those vendors' devices, which never appear here: each fails (EOPNOTSUPP,
//! or NULL with errno EOPNOTSUPP; a provider registering itself is ignored).

use libc::{c_int, c_void};

use crate::export::{export, set_errno};

/// Defines provider-facing functions that fail with EOPNOTSUPP (rdma-core's `ibv_cmd_*` return an errno).
macro_rules! failing {
    ($($name:ident @ $ver:literal),* $(,)?) => {$(
        export!($ver;
        fn $name() -> c_int {
            tracing::warn!(concat!(stringify!($name), ": a provider library's call, not soft-rdma's"));
            set_errno(libc::EOPNOTSUPP);
            libc::EOPNOTSUPP
        });
    )*};
}

/// Provider-facing functions returning a pointer: NULL, errno EOPNOTSUPP.
macro_rules! null {
    ($($name:ident @ $ver:literal),* $(,)?) => {$(
        export!($ver;
        fn $name() -> *mut c_void {
            tracing::warn!(concat!(stringify!($name), ": a provider library's call, not soft-rdma's"));
            set_errno(libc::EOPNOTSUPP);
            std::ptr::null_mut()
        });
    )*};
}

/// Provider-facing functions with nothing to do here (a provider registering itself, its log).
macro_rules! nothing {
    ($($name:ident @ $ver:literal),* $(,)?) => {$(
        export!($ver;
        fn $name() {});
    )*};
}
failing!(
    execute_ioctl @ "IBVERBS_PRIVATE_34",
    ibv_cmd_advise_mr @ "IBVERBS_PRIVATE_34",
    ibv_cmd_alloc_dm @ "IBVERBS_PRIVATE_34",
    ibv_cmd_alloc_mw @ "IBVERBS_PRIVATE_34",
    ibv_cmd_alloc_pd @ "IBVERBS_PRIVATE_34",
    ibv_cmd_attach_mcast @ "IBVERBS_PRIVATE_34",
    ibv_cmd_close_xrcd @ "IBVERBS_PRIVATE_34",
    ibv_cmd_create_ah @ "IBVERBS_PRIVATE_34",
    ibv_cmd_create_counters @ "IBVERBS_PRIVATE_34",
    ibv_cmd_create_cq_ex @ "IBVERBS_PRIVATE_34",
    ibv_cmd_create_flow @ "IBVERBS_PRIVATE_34",
    ibv_cmd_create_flow_action_esp @ "IBVERBS_PRIVATE_34",
    ibv_cmd_create_qp_ex2 @ "IBVERBS_PRIVATE_34",
    ibv_cmd_create_qp_ex @ "IBVERBS_PRIVATE_34",
    ibv_cmd_create_rwq_ind_table @ "IBVERBS_PRIVATE_34",
    ibv_cmd_create_srq @ "IBVERBS_PRIVATE_34",
    ibv_cmd_create_srq_ex @ "IBVERBS_PRIVATE_34",
    ibv_cmd_create_wq @ "IBVERBS_PRIVATE_34",
    ibv_cmd_dealloc_mw @ "IBVERBS_PRIVATE_34",
    ibv_cmd_dealloc_pd @ "IBVERBS_PRIVATE_34",
    ibv_cmd_dereg_mr @ "IBVERBS_PRIVATE_34",
    ibv_cmd_destroy_ah @ "IBVERBS_PRIVATE_34",
    ibv_cmd_destroy_counters @ "IBVERBS_PRIVATE_34",
    ibv_cmd_destroy_cq @ "IBVERBS_PRIVATE_34",
    ibv_cmd_destroy_flow @ "IBVERBS_PRIVATE_34",
    ibv_cmd_destroy_flow_action @ "IBVERBS_PRIVATE_34",
    ibv_cmd_destroy_qp @ "IBVERBS_PRIVATE_34",
    ibv_cmd_destroy_rwq_ind_table @ "IBVERBS_PRIVATE_34",
    ibv_cmd_destroy_srq @ "IBVERBS_PRIVATE_34",
    ibv_cmd_destroy_wq @ "IBVERBS_PRIVATE_34",
    ibv_cmd_detach_mcast @ "IBVERBS_PRIVATE_34",
    ibv_cmd_free_dm @ "IBVERBS_PRIVATE_34",
    ibv_cmd_get_context @ "IBVERBS_PRIVATE_34",
    ibv_cmd_modify_cq @ "IBVERBS_PRIVATE_34",
    ibv_cmd_modify_flow_action_esp @ "IBVERBS_PRIVATE_34",
    ibv_cmd_modify_qp @ "IBVERBS_PRIVATE_34",
    ibv_cmd_modify_qp_ex @ "IBVERBS_PRIVATE_34",
    ibv_cmd_modify_srq @ "IBVERBS_PRIVATE_34",
    ibv_cmd_modify_wq @ "IBVERBS_PRIVATE_34",
    ibv_cmd_open_qp @ "IBVERBS_PRIVATE_34",
    ibv_cmd_open_xrcd @ "IBVERBS_PRIVATE_34",
    ibv_cmd_query_context @ "IBVERBS_PRIVATE_34",
    ibv_cmd_query_device_any @ "IBVERBS_PRIVATE_34",
    ibv_cmd_query_mr @ "IBVERBS_PRIVATE_34",
    ibv_cmd_query_port @ "IBVERBS_PRIVATE_34",
    ibv_cmd_query_qp @ "IBVERBS_PRIVATE_34",
    ibv_cmd_query_srq @ "IBVERBS_PRIVATE_34",
    ibv_cmd_read_counters @ "IBVERBS_PRIVATE_34",
    ibv_cmd_reg_dm_mr @ "IBVERBS_PRIVATE_34",
    ibv_cmd_reg_dmabuf_mr @ "IBVERBS_PRIVATE_34",
    ibv_cmd_reg_mr @ "IBVERBS_PRIVATE_34",
    ibv_cmd_rereg_mr @ "IBVERBS_PRIVATE_34",
    ibv_cmd_resize_cq @ "IBVERBS_PRIVATE_34",
    verbs_init_cq @ "IBVERBS_PRIVATE_34",
);
null!(
    _verbs_init_and_alloc_context @ "IBVERBS_PRIVATE_34",
    verbs_open_device @ "IBVERBS_PRIVATE_34",
);
nothing!(
    __verbs_log @ "IBVERBS_PRIVATE_34",
    ibv_copy_ah_attr_from_kern @ "IBVERBS_1.1",
    ibv_copy_path_rec_from_kern @ "IBVERBS_1.0",
    ibv_copy_qp_attr_from_kern @ "IBVERBS_1.0",
    verbs_register_driver_34 @ "IBVERBS_PRIVATE_34",
    verbs_set_ops @ "IBVERBS_PRIVATE_34",
    verbs_uninit_context @ "IBVERBS_PRIVATE_34",
);

/// rdma-core's `verbs_allow_disassociate_destroy` (a `bool` providers read): false.
#[unsafe(export_name = "soft_rdma_verbs_allow_disassociate_destroy")]
pub static VERBS_ALLOW_DISASSOCIATE_DESTROY: bool = false;
core::arch::global_asm!(
    ".symver soft_rdma_verbs_allow_disassociate_destroy, verbs_allow_disassociate_destroy@@IBVERBS_PRIVATE_34"
);

export!("IBVERBS_1.5";
/// The one P_Key (0xffff, network order) is at index 0; any other: -1 (verbs.h `ibv_get_pkey_index`).
fn ibv_get_pkey_index(_ctx: *mut crate::abi::ibv_context, port: u8, pkey: u16) -> c_int {
    if port == 1 && pkey == 0xffff_u16.to_be() { 0 } else { -1 }
});

export!("IBVERBS_1.10";
/// Enhanced connection establishment is a vendor option of InfiniBand/RoCE: EOPNOTSUPP.
fn ibv_query_ece(_qp: *mut crate::abi::ibv_qp, _ece: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
});

export!("IBVERBS_1.10";
fn ibv_set_ece(_qp: *mut crate::abi::ibv_qp, _ece: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
});

export!("IBVERBS_1.1";
/// RoCE's L2 resolution: not iWARP's (iWARP runs on the kernel's or soft-rdma's TCP).
fn ibv_resolve_eth_l2_from_gid(_ctx: *mut crate::abi::ibv_context, _attr: *mut c_void, _mac: *mut u8, _vid: *mut u16) -> c_int {
    libc::EOPNOTSUPP
});
