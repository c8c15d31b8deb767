//! soft-rdma's statuses in C's terms: an `Error`'s ND status as the errno rdma-core's calls give for the
//! same failure (errno(3)), and a completion's status as `enum ibv_wc_status` (verbs.h), as siw maps
//! its own (`siw_cq.c` `map_wc_status`).

use libc::c_int;
use soft_rdma::{Error, NdStatus};

use crate::abi::*;

pub(crate) fn errno_of(e: &Error) -> c_int {
    errno_of_status(e.status)
}

pub(crate) fn errno_of_status(s: NdStatus) -> c_int {
    match s {
        NdStatus::Success | NdStatus::Pending => 0,
        NdStatus::InvalidParameter | NdStatus::InvalidBufferSize => libc::EINVAL,
        NdStatus::InsufficientResources => libc::ENOMEM,
        NdStatus::AccessViolation => libc::EACCES,
        NdStatus::BufferOverflow => libc::ENOBUFS,
        NdStatus::DataOverrun => libc::EMSGSIZE,
        NdStatus::SharingViolation => libc::EBUSY,
        NdStatus::IoTimeout => libc::ETIMEDOUT,
        NdStatus::Canceled => libc::ECANCELED,
        NdStatus::RemoteError => libc::EREMOTEIO,
        NdStatus::InvalidAddress | NdStatus::TooManyAddresses => libc::EADDRNOTAVAIL,
        NdStatus::AddressAlreadyExists => libc::EADDRINUSE,
        NdStatus::ConnectionRefused => libc::ECONNREFUSED,
        NdStatus::ConnectionInvalid => libc::ENOTCONN,
        NdStatus::ConnectionActive => libc::EISCONN,
        NdStatus::NetworkUnreachable => libc::ENETUNREACH,
        NdStatus::HostUnreachable => libc::EHOSTUNREACH,
        NdStatus::ConnectionAborted => libc::ECONNABORTED,
        // soft-rdmad went away: the device is gone under an open context, and every command then fails as
        // uverbs fails them after a device is disassociated (-EIO, drivers/infiniband/core/uverbs_main.c).
        NdStatus::DeviceRemoved => libc::EIO,
        NdStatus::Unsuccessful => libc::EIO,
    }
}

/// A completion's status as `enum ibv_wc_status`.
pub(crate) fn wc_status(s: NdStatus) -> c_int {
    match s {
        NdStatus::Success => IBV_WC_SUCCESS,
        // Flushed: the queue pair left RTS (disconnect, terminate, ibv_modify_qp to ERR).
        NdStatus::Canceled => IBV_WC_WR_FLUSH_ERR,
        // A local SGE outside a region, an unknown lkey, missing LOCAL_WRITE.
        NdStatus::AccessViolation => IBV_WC_LOC_PROT_ERR,
        // A message longer than its receive buffers.
        NdStatus::DataOverrun | NdStatus::InvalidBufferSize => IBV_WC_LOC_LEN_ERR,
        // The stream was terminated by the peer (a remote STag or range it refused).
        NdStatus::RemoteError => IBV_WC_REM_ACCESS_ERR,
        NdStatus::InvalidParameter | NdStatus::InsufficientResources => IBV_WC_LOC_QP_OP_ERR,
        NdStatus::DeviceRemoved => IBV_WC_FATAL_ERR,
        _ => IBV_WC_GENERAL_ERR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_has_an_errno_and_a_wc_status() {
        for &s in NdStatus::ALL.iter() {
            let e = errno_of_status(s);
            assert_eq!(e == 0, !s.is_error(), "{s}");
            let w = wc_status(s);
            assert_eq!(w == IBV_WC_SUCCESS, s == NdStatus::Success, "{s}");
        }
        assert_eq!(wc_status(NdStatus::Canceled), IBV_WC_WR_FLUSH_ERR);
        assert_eq!(wc_status(NdStatus::AccessViolation), IBV_WC_LOC_PROT_ERR);
    }
}
