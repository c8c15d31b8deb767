//! What rdma-core's own test suite (the Python tests, pyverbs, that rdma-core's developers run against every
//! provider) is expected to do on an iWARP device: shared by `tests/tests/rdma_core_suite.rs` (soft-rdma) and
//! `tests/tests/siw_interop.rs` (Linux kernel siw in the interop VM, which checks these lists against siw's
//! own results). The suite is driven by `tests/python/rdma_core_suite.py` ([`RUNNER`]), which prints one
//! `SOFT-RDMA-RESULT <outcome> <test id>` line per test ([`results`]).

use std::collections::BTreeMap;

/// The runner's text (`tests/python/rdma_core_suite.py`), for a machine that has no checkout (the siw VM).
pub const RUNNER: &str = include_str!("../python/rdma_core_suite.py");

/// Tests that pass on soft-rdma, and on Linux kernel siw (Debian bookworm's 6.1, rdma-core 44). The rdma_cm tests fork a child process for each side, after the parent
/// opened the device.
pub const MUST_PASS: [&str; 28] = [
    "tests.test_cq.CQAPITest.test_create_cq",
    "tests.test_cq.CQAPITest.test_create_cq_bad_flow",
    "tests.test_cq.CQAPITest.test_create_cq_with_comp_channel",
    "tests.test_cqex.CQEXAPITest.test_create_cq_ex",
    "tests.test_device.DeviceTest.test_dev_list",
    "tests.test_device.DeviceTest.test_open_dev",
    "tests.test_device.DeviceTest.test_phys_port_cnt_ex",
    "tests.test_device.DeviceTest.test_query_device",
    "tests.test_device.DeviceTest.test_query_device_ex",
    "tests.test_device.DeviceTest.test_query_gid",
    "tests.test_device.DeviceTest.test_query_gid_ex",
    "tests.test_device.DeviceTest.test_query_gid_table",
    "tests.test_device.DeviceTest.test_query_gid_table_bad_flow",
    "tests.test_device.DeviceTest.test_query_pkey",
    "tests.test_device.DeviceTest.test_query_port",
    "tests.test_device.DeviceTest.test_query_port_bad_flow",
    "tests.test_fork.ForkAPITest.test_is_fork_initialized",
    "tests.test_mr.MRTest.test_reg_mr_bad_flags",
    "tests.test_pd.PDTest.test_alloc_pd",
    "tests.test_pd.PDTest.test_dealloc_pd",
    "tests.test_pd.PDTest.test_destroy_pd_twice",
    "tests.test_pd.PDTest.test_multiple_pd_creation",
    "tests.test_qp.QPTest.test_create_rc_qp_no_attr",
    "tests.test_qp.QPTest.test_create_rc_qp_with_attr",
    "tests.test_rdmacm.CMTestCase.test_rdmacm_sync_traffic",
    "tests.test_rdmacm.CMTestCase.test_rdmacm_async_reject_traffic",
    "tests.test_rdmacm.CMTestCase.test_rdmacm_async_read",
    "tests.test_rdmacm.CMTestCase.test_rdmacm_async_write",
];

/// Tests whose attributes are drawn at random: with some draws they ask for an extended QP (send ops
/// flags), which soft-rdma's library does not make (EOPNOTSUPP, and the suite skips), with others they pass.
/// On siw `test_query_rc_qp` fails (a queue pair moved to INIT is reported in RESET).
pub const MAY_PASS: [&str; 3] = [
    "tests.test_qp.QPTest.test_create_rc_qp_ex_no_attr",
    "tests.test_qp.QPTest.test_create_rc_qp_ex_with_attr",
    "tests.test_qp.QPTest.test_query_rc_qp",
];

/// Tests that cannot pass on an iWARP device, with the reason; siw_interop's `rdma_cores_own_test_suite_on_siw`
/// checks that none passes on siw (on siw each errs, as on soft-rdma).
pub const IWARP_CANNOT: [(&str, &str); 9] = [
    (
        "tests.test_cq_events.CqEventsTestCase.test_cq_events_rc",
        IB_CONNECT,
    ),
    ("tests.test_mr.MRTest.test_mr_rereg_access", IB_CONNECT),
    ("tests.test_mr.MRTest.test_mr_rereg_access_bad_flow", IB_CONNECT),
    ("tests.test_mr.MRTest.test_mr_rereg_addr", IB_CONNECT),
    ("tests.test_mr.MRTest.test_mr_rereg_pd", IB_CONNECT),
    (
        "tests.test_relaxed_ordering.RoTestCase.test_ro_rc_traffic",
        IB_CONNECT,
    ),
    (
        "tests.test_rdmacm.CMTestCase.test_rdmacm_async_traffic",
        "it sets the ack timeout with rdma_set_option and expects ibv_query_qp to report it; rdma_cm never \
         gives an iWARP queue pair a timeout (TCP retransmits), so the kernel's reports 0 as soft-rdma does \
         (siw errs on both sides)",
    ),
    (
        "tests.test_rdmacm.CMTestCase.test_rdmacm_async_traffic_external_qp",
        "a queue pair made outside rdma_cm and connected with rdma_establish, which soft-rdma does not do \
         (docs/rdma-core.md); the suite expects RDMA_CM_EVENT_CONNECT_RESPONSE before it calls rdma_establish, \
         but iWARP's kernel rdma_cm completes the connection itself and reports RDMA_CM_EVENT_ESTABLISHED \
         (siw: \"Expected this event: 5, got this event: RDMA_CM_EVENT_ESTABLISHED\")",
    ),
    (
        "tests.test_rdmacm.CMTestCase.test_rdmacm_async_udp_traffic",
        "RDMA_PS_UDP is unreliable datagrams, which iWARP has none of (soft-rdma: ENOSYS; siw: creating the \
         UD queue pair fails with EOPNOTSUPP)",
    ),
];

const IB_CONNECT: &str = "it connects RC queue pairs InfiniBand's way, moving them to RTR and RTS with \
    ibv_modify_qp; an iWARP queue pair reaches RTS only through rdma_cm (siw answers EINVAL, as soft-rdma)";

/// Each test's outcome (ok, skip, fail, error) by id, from the runner's output.
pub fn results(stdout: &str) -> BTreeMap<&str, &str> {
    let mut results = BTreeMap::new();
    for line in stdout.lines() {
        if let Some(rest) = line.strip_prefix("SOFT-RDMA-RESULT ")
            && let Some((outcome, id)) = rest.split_once(' ')
        {
            results.insert(id, outcome);
        }
    }
    results
}
