//! NetworkDirect status codes (docs/connector-semantics.md "Status codes").
//!
//! The numeric values are the NTSTATUS values NetworkDirect uses; they are preserved on the UDS wire and in
//! every error so that tools and logs can name them exactly.

listed_enum! {
    /// A NetworkDirect status. `#[repr(u32)]`: `status as u32` is the ND numeric value.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    #[repr(u32)]
    pub enum NdStatus {
        Success = 0x0000_0000 => "ND_SUCCESS",
        Pending = 0x0000_0103 => "ND_PENDING",
        BufferOverflow = 0x8000_0005 => "ND_BUFFER_OVERFLOW",
        Unsuccessful = 0xC000_0001 => "ND_UNSUCCESSFUL",
        AccessViolation = 0xC000_0005 => "ND_ACCESS_VIOLATION",
        InvalidParameter = 0xC000_000D => "ND_INVALID_PARAMETER",
        /// ND_DATA_OVERRUN (ndstatus.h): a received message longer than the posted receive buffer.
        DataOverrun = 0xC000_003C => "ND_DATA_OVERRUN",
        SharingViolation = 0xC000_0043 => "ND_SHARING_VIOLATION",
        InsufficientResources = 0xC000_009A => "ND_INSUFFICIENT_RESOURCES",
        IoTimeout = 0xC000_00B5 => "ND_IO_TIMEOUT",
        Canceled = 0xC000_0120 => "ND_CANCELED",
        /// ND_REMOTE_ERROR (ndstatus.h): the peer terminated the stream (an iWARP Terminate arrived or was sent).
        RemoteError = 0xC000_013D => "ND_REMOTE_ERROR",
        InvalidAddress = 0xC000_0141 => "ND_INVALID_ADDRESS",
        InvalidBufferSize = 0xC000_0206 => "ND_INVALID_BUFFER_SIZE",
        TooManyAddresses = 0xC000_0209 => "ND_TOO_MANY_ADDRESSES",
        AddressAlreadyExists = 0xC000_020A => "ND_ADDRESS_ALREADY_EXISTS",
        ConnectionRefused = 0xC000_0236 => "ND_CONNECTION_REFUSED",
        ConnectionInvalid = 0xC000_023A => "ND_CONNECTION_INVALID",
        ConnectionActive = 0xC000_023B => "ND_CONNECTION_ACTIVE",
        NetworkUnreachable = 0xC000_023C => "ND_NETWORK_UNREACHABLE",
        HostUnreachable = 0xC000_023D => "ND_HOST_UNREACHABLE",
        ConnectionAborted = 0xC000_0241 => "ND_CONNECTION_ABORTED",
        DeviceRemoved = 0xC000_02B6 => "ND_DEVICE_REMOVED",
    }
}

impl NdStatus {
    /// The ND numeric value.
    pub const fn code(self) -> u32 {
        self as u32
    }

    /// The status with this numeric value, if it is one soft-rdma knows.
    pub fn from_code(code: u32) -> Option<NdStatus> {
        NdStatus::ALL.iter().copied().find(|s| s.code() == code)
    }

    /// True for statuses the seeds call retryable (a new connect attempt may succeed).
    pub const fn is_retryable(self) -> bool {
        matches!(
            self,
            NdStatus::IoTimeout
                | NdStatus::ConnectionRefused
                | NdStatus::NetworkUnreachable
                | NdStatus::HostUnreachable
        )
    }

    /// NTSTATUS severity: success and informational (PENDING) are not errors; warnings
    /// (BUFFER_OVERFLOW, 0x8...) and errors (0xC...) are.
    pub const fn is_error(self) -> bool {
        self.code() >= 0x8000_0000
    }
}

impl core::fmt::Display for NdStatus {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} (0x{:08X})", self.name(), self.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_match_the_reference_table() {
        // docs/connector-semantics.md, "Status codes".
        assert_eq!(NdStatus::Pending.code(), 0x103);
        assert_eq!(NdStatus::BufferOverflow.code(), 0x8000_0005);
        assert_eq!(NdStatus::InvalidBufferSize.code(), 0xC000_0206);
        assert_eq!(NdStatus::TooManyAddresses.code(), 0xC000_0209);
        assert_eq!(NdStatus::AddressAlreadyExists.code(), 0xC000_020A);
        assert_eq!(NdStatus::ConnectionAborted.code(), 0xC000_0241);
        assert_eq!(NdStatus::DeviceRemoved.code(), 0xC000_02B6);
    }

    #[test]
    fn from_code_round_trips_and_rejects_unknown() {
        for s in NdStatus::ALL {
            assert_eq!(NdStatus::from_code(s.code()), Some(s));
        }
        assert_eq!(NdStatus::from_code(0xC000_0002), None);
        let mut codes: std::vec::Vec<u32> = NdStatus::ALL.iter().map(|s| s.code()).collect();
        codes.dedup();
        assert_eq!(codes.len(), NdStatus::ALL.len());
        assert!(codes.windows(2).all(|w| w[0] < w[1]), "ALL is in numeric order");
    }

    #[test]
    fn severity() {
        assert!(!NdStatus::Success.is_error());
        assert!(!NdStatus::Pending.is_error());
        assert!(NdStatus::BufferOverflow.is_error());
        assert!(NdStatus::ConnectionRefused.is_error() && NdStatus::ConnectionRefused.is_retryable());
        assert!(!NdStatus::ConnectionAborted.is_retryable());
    }
}
