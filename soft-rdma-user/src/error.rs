//! The one error type of soft-rdma: a NetworkDirect status (numeric value preserved) plus context.

use std::borrow::Cow;

pub use soft_rdma_common::status::NdStatus;

/// An error: the ND status a NetworkDirect application would see, and a human-readable context.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {context}")]
pub struct Error {
    /// The NetworkDirect status; `status.code()` is the numeric value.
    pub status: NdStatus,
    /// What went wrong, in words (which object, which limit, which address).
    pub context: Cow<'static, str>,
    /// With BUFFER_OVERFLOW: the buffer size that would have held everything (IND2Connector::GetPrivateData).
    pub required_size: Option<u32>,
}

impl Error {
    pub fn new(status: NdStatus, context: impl Into<Cow<'static, str>>) -> Self {
        Error {
            status,
            context: context.into(),
            required_size: None,
        }
    }

    /// BUFFER_OVERFLOW carrying the size the caller needs.
    pub fn buffer_overflow(required: u32, context: impl Into<Cow<'static, str>>) -> Self {
        Error {
            status: NdStatus::BufferOverflow,
            context: context.into(),
            required_size: Some(required),
        }
    }

    /// The ND numeric value of the status.
    pub fn code(&self) -> u32 {
        self.status.code()
    }
}

/// `Result` with soft-rdma's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Shorthand: `err(NdStatus::ConnectionInvalid, "connector 3 is not connecting")`.
pub fn err<T>(status: NdStatus, context: impl Into<Cow<'static, str>>) -> Result<T> {
    Err(Error::new(status, context))
}
