//! Without soft-rdmad: no device (the list is empty, not NULL), rdma_cm has nothing to open (ENODEV, as
//! rdma-core's `ucma_init` without a device), and nothing crashes.

use std::ptr::null_mut;

use soft_rdma_verbs::c::*;

#[test]
fn no_daemon_means_no_device() {
    let dir = tempfile::tempdir().unwrap();
    // SAFETY: set before the library reads the environment (its first use is below).
    unsafe { std::env::set_var("SOFT_RDMA_UDS", dir.path().join("nobody-listens.sock")) };
    // SAFETY: the libraries' C functions with live arguments.
    unsafe {
        let mut n = -1;
        let list = ibv_get_device_list(&mut n);
        assert!(!list.is_null(), "an empty list, not NULL");
        assert_eq!(n, 0);
        assert!((*list).is_null(), "the list is NULL-terminated");
        ibv_free_device_list(list);
        // Asked again (a program retrying): still none, and still no crash.
        let again = ibv_get_device_list(null_mut());
        assert!((*again).is_null());
        ibv_free_device_list(again);
        assert!(rdma_create_event_channel().is_null());
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::ENODEV));
        let mut id = null_mut();
        assert_eq!(
            rdma_create_id(null_mut(), &mut id, null_mut(), soft_rdma_verbs::abi::RDMA_PS_TCP),
            -1
        );
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::ENODEV));
    }
}
