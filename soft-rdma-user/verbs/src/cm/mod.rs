//! rdma_cm (placeholder while written).
pub(crate) fn device_removed() {}
pub(crate) fn qp_destroyed(_qp: *mut crate::abi::ibv_qp) {}
