//! iWARP wire formats: MPA Request/Reply frames and FPDU framing (RFC 5044, RFC 6581), DDP headers
//! (RFC 5041), RDMAP messages including Read Request and Terminate (RFC 5040).
//!
//! Each format follows the smoltcp pattern: a zerocopy checked view over bytes (`…Header`) and a parsed
//! representation (`…Repr`) with `parse`, `buffer_len` and `emit`. Parsing untrusted bytes never panics;
//! every malformation is its own [`WireError`] variant, and [`WireError::terminate_cause`] names the
//! Terminate (layer, type, code) a receiver reports for it.
//!
//! Each module uses only modules listed before it: [`cause`] (the Terminate vocabulary), [`error`], `buf`
//! (bounds checks), then [`mpa`], [`ddp`], [`fpdu`], [`read_request`], [`terminate`], [`rdmap`].

mod buf;
pub mod cause;
pub mod ddp;
pub mod error;
pub mod fpdu;
pub mod mpa;
pub mod rdmap;
pub mod read_request;
pub mod terminate;

pub use cause::TerminateCause;
pub use error::WireError;
