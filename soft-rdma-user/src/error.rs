//! The one error type of soft-rdma: a NetworkDirect status (numeric value preserved) plus context.

use std::borrow::Cow;

pub use soft_rdma_common::status::NdStatus;

/// An error: the ND status a NetworkDirect application would see, and a human-readable context.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[error("{status}: {context}")]
pub struct Error {
    /// The NetworkDirect status; `status.code()` is the numeric value (what goes on the UDS wire).
    #[serde(with = "nd_status_code")]
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

/// Serde form of [`NdStatus`]: its ND numeric value; unknown values are refused.
pub(crate) mod nd_status_code {
    use super::NdStatus;
    use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

    pub fn serialize<S: Serializer>(s: &NdStatus, ser: S) -> Result<S::Ok, S::Error> {
        ser.serialize_u32(s.code())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(de: D) -> Result<NdStatus, D::Error> {
        let code = u32::deserialize(de)?;
        NdStatus::from_code(code).ok_or_else(|| D::Error::custom(format!("unknown ND status 0x{code:08X}")))
    }
}
