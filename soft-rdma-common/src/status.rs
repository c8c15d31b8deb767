//! NetworkDirect status codes (docs/connector-semantics.md "Status codes").
//!
//! The numeric values are the NTSTATUS values NetworkDirect uses; they are preserved on the UDS wire and in
//! every error so that tools and logs can name them exactly.

/// A NetworkDirect status. `#[repr(u32)]`: `status as u32` is the ND numeric value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum NdStatus {
    Success = 0x0000_0000,
    Pending = 0x0000_0103,
    BufferOverflow = 0x8000_0005,
    Unsuccessful = 0xC000_0001,
    AccessViolation = 0xC000_0005,
    InvalidParameter = 0xC000_000D,
    /// ND_DATA_OVERRUN (ndstatus.h): a received message longer than the posted receive buffer.
    DataOverrun = 0xC000_003C,
    SharingViolation = 0xC000_0043,
    InsufficientResources = 0xC000_009A,
    IoTimeout = 0xC000_00B5,
    Canceled = 0xC000_0120,
    /// ND_REMOTE_ERROR (ndstatus.h): the peer terminated the stream (an iWARP Terminate arrived or was sent).
    RemoteError = 0xC000_013D,
    InvalidAddress = 0xC000_0141,
    InvalidBufferSize = 0xC000_0206,
    TooManyAddresses = 0xC000_0209,
    AddressAlreadyExists = 0xC000_020A,
    ConnectionRefused = 0xC000_0236,
    ConnectionInvalid = 0xC000_023A,
    ConnectionActive = 0xC000_023B,
    NetworkUnreachable = 0xC000_023C,
    HostUnreachable = 0xC000_023D,
    ConnectionAborted = 0xC000_0241,
    DeviceRemoved = 0xC000_02B6,
}

impl NdStatus {
    /// Every status, in numeric order.
    pub const ALL: [NdStatus; 23] = [
        NdStatus::Success,
        NdStatus::Pending,
        NdStatus::BufferOverflow,
        NdStatus::Unsuccessful,
        NdStatus::AccessViolation,
        NdStatus::InvalidParameter,
        NdStatus::DataOverrun,
        NdStatus::SharingViolation,
        NdStatus::InsufficientResources,
        NdStatus::IoTimeout,
        NdStatus::Canceled,
        NdStatus::RemoteError,
        NdStatus::InvalidAddress,
        NdStatus::InvalidBufferSize,
        NdStatus::TooManyAddresses,
        NdStatus::AddressAlreadyExists,
        NdStatus::ConnectionRefused,
        NdStatus::ConnectionInvalid,
        NdStatus::ConnectionActive,
        NdStatus::NetworkUnreachable,
        NdStatus::HostUnreachable,
        NdStatus::ConnectionAborted,
        NdStatus::DeviceRemoved,
    ];

    /// The ND numeric value.
    pub const fn code(self) -> u32 {
        self as u32
    }

    /// The status with this numeric value, if it is one soft-rdma knows.
    pub fn from_code(code: u32) -> Option<NdStatus> {
        NdStatus::ALL.iter().copied().find(|s| s.code() == code)
    }

    /// The ND name, e.g. `ND_CONNECTION_REFUSED`.
    pub const fn name(self) -> &'static str {
        match self {
            NdStatus::Success => "ND_SUCCESS",
            NdStatus::Pending => "ND_PENDING",
            NdStatus::BufferOverflow => "ND_BUFFER_OVERFLOW",
            NdStatus::Unsuccessful => "ND_UNSUCCESSFUL",
            NdStatus::AccessViolation => "ND_ACCESS_VIOLATION",
            NdStatus::InvalidParameter => "ND_INVALID_PARAMETER",
            NdStatus::DataOverrun => "ND_DATA_OVERRUN",
            NdStatus::SharingViolation => "ND_SHARING_VIOLATION",
            NdStatus::InsufficientResources => "ND_INSUFFICIENT_RESOURCES",
            NdStatus::IoTimeout => "ND_IO_TIMEOUT",
            NdStatus::Canceled => "ND_CANCELED",
            NdStatus::RemoteError => "ND_REMOTE_ERROR",
            NdStatus::InvalidAddress => "ND_INVALID_ADDRESS",
            NdStatus::InvalidBufferSize => "ND_INVALID_BUFFER_SIZE",
            NdStatus::TooManyAddresses => "ND_TOO_MANY_ADDRESSES",
            NdStatus::AddressAlreadyExists => "ND_ADDRESS_ALREADY_EXISTS",
            NdStatus::ConnectionRefused => "ND_CONNECTION_REFUSED",
            NdStatus::ConnectionInvalid => "ND_CONNECTION_INVALID",
            NdStatus::ConnectionActive => "ND_CONNECTION_ACTIVE",
            NdStatus::NetworkUnreachable => "ND_NETWORK_UNREACHABLE",
            NdStatus::HostUnreachable => "ND_HOST_UNREACHABLE",
            NdStatus::ConnectionAborted => "ND_CONNECTION_ABORTED",
            NdStatus::DeviceRemoved => "ND_DEVICE_REMOVED",
        }
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
