//! The C structs of `soft_rdma_verbs::abi` against the system's rdma-core headers: from one list of
//! (struct, field) pairs, the Rust `offset_of!`/`size_of` values and a generated C file of
//! `offsetof`/`sizeof`, compiled with `cc` against `<infiniband/verbs.h>` and `<rdma/rdma_cma.h>`, must
//! agree, and so must every constant the libraries use.
//!
//! Needs a C compiler and Debian's `libibverbs-dev` and `librdmacm-dev` (`cargo xtask setup` installs
//! them); without them the test fails and says so.

use std::fmt::Write as _;
use std::mem::{offset_of, size_of};
use std::process::Command;

use soft_rdma_verbs::abi::*;

struct Layout {
    c_struct: &'static str,
    size: usize,
    /// (Rust field, C member designator, Rust offset).
    fields: Vec<(&'static str, &'static str, usize)>,
}

/// `rust_struct { field, field = "c.member", … }`: a field without `= "…"` has the same name in C.
macro_rules! layouts {
    ($( $s:ident { $( $f:ident $(= $cf:literal)? ),* $(,)? } )*) => {
        vec![ $( Layout {
            c_struct: stringify!($s),
            size: size_of::<$s>(),
            fields: vec![ $( (stringify!($f), layouts!(@c $f $($cf)?), offset_of!($s, $f)) ),* ],
        } ),* ]
    };
    (@c $f:ident) => { stringify!($f) };
    (@c $f:ident $cf:literal) => { $cf };
}

macro_rules! constants {
    ($( $c:ident ),* $(,)?) => { vec![ $( (stringify!($c), $c as i64) ),* ] };
}

fn layouts() -> Vec<Layout> {
    layouts! {
        ibv_device { _ops, node_type, transport_type, name, dev_name, dev_path, ibdev_path }
        ibv_context_ops {
            _compat_query_device, _compat_query_port, _compat_pd_mr = "_compat_alloc_pd", alloc_mw, bind_mw,
            dealloc_mw, _compat_create_cq, poll_cq, req_notify_cq, _compat_cq_srq = "_compat_cq_event",
            post_srq_recv, _compat_qp = "_compat_create_qp", post_send, post_recv,
            _compat_tail = "_compat_create_ah"
        }
        ibv_context { device, ops, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat }
        verbs_context { ops = "query_port", _ABI_placeholder3, sz, context }
        ibv_device_attr {
            fw_ver, node_guid, sys_image_guid, max_mr_size, page_size_cap, vendor_id, vendor_part_id, hw_ver,
            max_qp, max_qp_wr, device_cap_flags, max_sge, max_sge_rd, max_cq, max_cqe, max_mr, max_pd,
            max_qp_rd_atom, max_ee_rd_atom, max_res_rd_atom, max_qp_init_rd_atom, max_ee_init_rd_atom,
            atomic_cap, max_ee, max_rdd, max_mw, max_raw_ipv6_qp, max_raw_ethy_qp, max_mcast_grp,
            max_mcast_qp_attach, max_total_mcast_qp_attach, max_ah, max_fmr, max_map_per_fmr, max_srq,
            max_srq_wr, max_srq_sge, max_pkeys, local_ca_ack_delay, phys_port_cnt
        }
        ibv_device_attr_ex { orig_attr, comp_mask, phys_port_cnt_ex }
        ibv_query_device_ex_input { comp_mask }
        ibv_port_attr {
            state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz, bad_pkey_cntr, qkey_viol_cntr,
            pkey_tbl_len, lid, sm_lid, lmc, max_vl_num, sm_sl, subnet_timeout, init_type_reply, active_width,
            active_speed, phys_state, link_layer, flags, port_cap_flags2
        }
        ibv_gid { raw }
        ibv_gid_entry { gid, gid_index, port_num, gid_type, ndev_ifindex }
        ibv_async_event { element, event_type }
        ibv_pd { context, handle }
        ibv_mr { context, pd, addr, length, handle, lkey, rkey }
        ibv_comp_channel { context, fd, refcnt }
        ibv_cq {
            context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
            async_events_completed
        }
        ibv_qp {
            context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type, mutex, cond,
            events_completed
        }
        ibv_qp_cap { max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data }
        ibv_qp_init_attr { qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all }
        ibv_qp_init_attr_ex {
            qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all, comp_mask, pd, xrcd, create_flags,
            max_tso_header, rwq_ind_tbl, rx_hash_conf, source_qpn, send_ops_flags
        }
        ibv_global_route { dgid, flow_label, sgid_index, hop_limit, traffic_class }
        ibv_ah_attr { grh, dlid, sl, src_path_bits, static_rate, is_global, port_num }
        ibv_qp_attr {
            qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn, dest_qp_num,
            qp_access_flags, cap, ah_attr, alt_ah_attr, pkey_index, alt_pkey_index, en_sqd_async_notify,
            sq_draining, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer, port_num, timeout, retry_cnt,
            rnr_retry, alt_port_num, alt_timeout, rate_limit
        }
        ibv_sge { addr, length, lkey }
        ibv_send_wr {
            wr_id, next, sg_list, num_sge, opcode, send_flags, invalidate_rkey, rdma = "wr.rdma", qp_type,
            _bind_mw_tso = "bind_mw"
        }
        ibv_send_wr_rdma { remote_addr = "rdma.remote_addr", rkey = "rdma.rkey" }
        ibv_recv_wr { wr_id, next, sg_list, num_sge }
        ibv_wc {
            wr_id, status, opcode, vendor_err, byte_len, invalidated_rkey, qp_num, src_qp, wc_flags,
            pkey_index, slid, sl, dlid_path_bits
        }
        rdma_event_channel { fd }
        rdma_ib_addr { sgid, dgid, pkey }
        rdma_addr { src = "src_addr", dst = "dst_addr", ibaddr = "addr.ibaddr" }
        rdma_route { addr, path_rec, num_paths }
        rdma_cm_id {
            verbs, channel, context, qp, route, ps, port_num, event, send_cq_channel, send_cq, recv_cq_channel,
            recv_cq, srq, pd, qp_type
        }
        rdma_conn_param {
            private_data, private_data_len, responder_resources, initiator_depth, flow_control, retry_count,
            rnr_retry_count, srq, qp_num
        }
        rdma_cm_event_param { conn }
        rdma_cm_event { id, listen_id, event, status, param }
        rdma_addrinfo {
            ai_flags, ai_family, ai_qp_type, ai_port_space, ai_src_len, ai_dst_len, ai_src_addr, ai_dst_addr,
            ai_src_canonname, ai_dst_canonname, ai_route_len, ai_route, ai_connect_len, ai_connect, ai_next
        }
    }
}

fn constants() -> Vec<(&'static str, i64)> {
    constants![
        IBV_SYSFS_NAME_MAX,
        IBV_SYSFS_PATH_MAX,
        IBV_NODE_RNIC,
        IBV_TRANSPORT_IWARP,
        IBV_PORT_ACTIVE,
        IBV_PORT_DOWN,
        IBV_MTU_256,
        IBV_MTU_4096,
        IBV_LINK_LAYER_ETHERNET,
        IBV_PORT_CM_SUP,
        IBV_PORT_DEVICE_MGMT_SUP,
        IBV_QPT_RC,
        IBV_QPS_RESET,
        IBV_QPS_INIT,
        IBV_QPS_RTR,
        IBV_QPS_RTS,
        IBV_QPS_SQD,
        IBV_QPS_SQE,
        IBV_QPS_ERR,
        IBV_QP_STATE,
        IBV_QP_CUR_STATE,
        IBV_QP_ACCESS_FLAGS,
        IBV_QP_MAX_QP_RD_ATOMIC,
        IBV_QP_MAX_DEST_RD_ATOMIC,
        IBV_QP_CAP,
        IBV_ACCESS_LOCAL_WRITE,
        IBV_ACCESS_REMOTE_WRITE,
        IBV_ACCESS_REMOTE_READ,
        IBV_ACCESS_REMOTE_ATOMIC,
        IBV_ACCESS_MW_BIND,
        IBV_ACCESS_ZERO_BASED,
        IBV_ACCESS_ON_DEMAND,
        IBV_ACCESS_HUGETLB,
        IBV_ACCESS_OPTIONAL_RANGE,
        IBV_WR_RDMA_WRITE,
        IBV_WR_RDMA_WRITE_WITH_IMM,
        IBV_WR_SEND,
        IBV_WR_SEND_WITH_IMM,
        IBV_WR_RDMA_READ,
        IBV_WR_ATOMIC_CMP_AND_SWP,
        IBV_WR_ATOMIC_FETCH_AND_ADD,
        IBV_WR_LOCAL_INV,
        IBV_WR_BIND_MW,
        IBV_WR_SEND_WITH_INV,
        IBV_SEND_FENCE,
        IBV_SEND_SIGNALED,
        IBV_SEND_SOLICITED,
        IBV_SEND_INLINE,
        IBV_WC_SUCCESS,
        IBV_WC_LOC_LEN_ERR,
        IBV_WC_LOC_QP_OP_ERR,
        IBV_WC_LOC_PROT_ERR,
        IBV_WC_WR_FLUSH_ERR,
        IBV_WC_LOC_ACCESS_ERR,
        IBV_WC_REM_INV_REQ_ERR,
        IBV_WC_REM_ACCESS_ERR,
        IBV_WC_REM_OP_ERR,
        IBV_WC_FATAL_ERR,
        IBV_WC_GENERAL_ERR,
        IBV_WC_SEND,
        IBV_WC_RDMA_WRITE,
        IBV_WC_RDMA_READ,
        IBV_WC_RECV,
        IBV_WC_WITH_INV,
        IBV_EVENT_DEVICE_FATAL,
        IBV_FORK_UNNEEDED,
        VERBS_OP_QUERY_DEVICE_EX,
        VERBS_CONTEXT_OPS,
        IBV_REREG_MR_FLAGS_SUPPORTED,
        IBV_REREG_MR_ERR_INPUT,
        IBV_QP_INIT_ATTR_PD,
        RDMA_CM_EVENT_ADDR_RESOLVED,
        RDMA_CM_EVENT_ADDR_ERROR,
        RDMA_CM_EVENT_ROUTE_RESOLVED,
        RDMA_CM_EVENT_ROUTE_ERROR,
        RDMA_CM_EVENT_CONNECT_REQUEST,
        RDMA_CM_EVENT_CONNECT_RESPONSE,
        RDMA_CM_EVENT_CONNECT_ERROR,
        RDMA_CM_EVENT_UNREACHABLE,
        RDMA_CM_EVENT_REJECTED,
        RDMA_CM_EVENT_ESTABLISHED,
        RDMA_CM_EVENT_DISCONNECTED,
        RDMA_CM_EVENT_DEVICE_REMOVAL,
        RDMA_CM_EVENT_MULTICAST_JOIN,
        RDMA_CM_EVENT_MULTICAST_ERROR,
        RDMA_CM_EVENT_ADDR_CHANGE,
        RDMA_CM_EVENT_TIMEWAIT_EXIT,
        RDMA_PS_IPOIB,
        RDMA_PS_TCP,
        RDMA_PS_UDP,
        RDMA_PS_IB,
        RAI_PASSIVE,
        RAI_NUMERICHOST,
        RAI_FAMILY,
        RDMA_OPTION_ID,
        RDMA_OPTION_ID_TOS,
        RDMA_OPTION_ID_REUSEADDR,
        RDMA_OPTION_ID_AFONLY,
        RDMA_OPTION_ID_ACK_TIMEOUT,
    ]
}

/// The C names of structs whose Rust name differs (a union member made a struct of its own).
fn c_type(rust: &str) -> String {
    match rust {
        "ibv_gid" => "union ibv_gid".into(),
        "rdma_cm_event_param" => "union { struct rdma_conn_param conn; struct rdma_ud_param ud; }".into(),
        other => format!("struct {other}"),
    }
}

/// The C program printing `name value` for every size, offset and constant.
fn c_source(layouts: &[Layout], constants: &[(&str, i64)]) -> String {
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <stdint.h>\n#include <infiniband/verbs.h>\n\
         #include <rdma/rdma_cma.h>\n",
    );
    // The union members the Rust side makes structs of, as typedefs with the header's layout.
    c.push_str(
        "typedef union { struct rdma_conn_param conn; struct rdma_ud_param ud; } rdma_cm_event_param;\n",
    );
    // Where verbs.h puts the one extended op the library sets, and how many pointers precede
    // `_ABI_placeholder3`, as `ops` array positions.
    c.push_str(
        "#define VERBS_OP_QUERY_DEVICE_EX (offsetof(struct verbs_context, query_device_ex) / sizeof(void *))\n\
         #define VERBS_CONTEXT_OPS (offsetof(struct verbs_context, _ABI_placeholder3) / sizeof(void *))\n",
    );
    c.push_str("int main(void) {\n");
    for l in layouts {
        let t = match l.c_struct {
            "ibv_send_wr_rdma" => "__typeof__(((struct ibv_send_wr *)0)->wr)".to_string(),
            "rdma_cm_event_param" => "rdma_cm_event_param".to_string(),
            other => c_type(other),
        };
        writeln!(c, "  printf(\"sizeof {} %zu\\n\", sizeof({t}));", l.c_struct).unwrap();
        for (f, cf, _) in &l.fields {
            writeln!(c, "  printf(\"{}.{f} %zu\\n\", offsetof({t}, {cf}));", l.c_struct).unwrap();
        }
    }
    for (name, _) in constants {
        writeln!(c, "  printf(\"{name} %lld\\n\", (long long)({name}));").unwrap();
    }
    c.push_str("  return 0;\n}\n");
    c
}

#[test]
fn structs_and_constants_match_the_system_headers() {
    for (header, package) in [
        ("/usr/include/infiniband/verbs.h", "libibverbs-dev"),
        ("/usr/include/rdma/rdma_cma.h", "librdmacm-dev"),
    ] {
        assert!(
            std::path::Path::new(header).exists(),
            "{header} is missing: install Debian's {package} (apt-get install {package}, or `cargo xtask setup`) \
             so that soft-rdma's ABI structs can be checked against rdma-core's"
        );
    }
    let layouts = layouts();
    let constants = constants();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("layout.c");
    let exe = dir.path().join("layout");
    std::fs::write(&src, c_source(&layouts, &constants)).unwrap();
    let cc = Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run the C compiler `cc` ({e}): install gcc (apt-get install build-essential)")
        });
    assert!(
        cc.status.success(),
        "the generated C file does not compile against the system's headers:\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    let c_values: std::collections::HashMap<String, i64> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect();
    let mut wrong = Vec::new();
    let mut check = |name: String, rust: i64| match c_values.get(&name) {
        Some(&c) if c == rust => {}
        other => wrong.push(format!("{name}: Rust {rust}, C {other:?}")),
    };
    for l in &layouts {
        check(format!("sizeof {}", l.c_struct), l.size as i64);
        for (f, _, off) in &l.fields {
            check(format!("{}.{f}", l.c_struct), *off as i64);
        }
    }
    for (name, v) in &constants {
        check(name.to_string(), *v);
    }
    assert!(
        wrong.is_empty(),
        "soft_rdma_verbs::abi differs from rdma-core's headers:\n{}",
        wrong.join("\n")
    );
}
