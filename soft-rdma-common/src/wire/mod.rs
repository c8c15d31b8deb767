//! iWARP wire formats: MPA Request/Reply frames and FPDU framing (RFC 5044, RFC 6581), DDP headers
//! (RFC 5041), RDMAP messages including Read Request and Terminate (RFC 5040).
//!
//! Each format follows the smoltcp pattern: a zerocopy checked view over bytes (`…Header`) and a parsed
//! representation (`…Repr`) with `parse`, `buffer_len` and `emit`. Parsing untrusted bytes never panics;
//! every malformation is its own [`WireError`] variant, and [`WireError::terminate_cause`] names the
//! Terminate (layer, type, code) a receiver reports for it.

pub mod ddp;
pub mod error;
pub mod fpdu;
pub mod mpa;
pub mod rdmap;
pub mod terminate;

pub use error::{TerminateCause, WireError};
