//! soft-rdma's drop-in `libibverbs.so.1` and `librdmacm.so.1`: rdma-core 44's ABI (`infiniband/verbs.h`,
//! `rdma/rdma_cma.h`) over soft-rdma's client library, so that unmodified RDMA programs (rping, perftest,
//! ucmatose, cmtime, …) run on soft-rdma.
//!
//! One file, two names: `libsoft_rdma_verbs.so` (soname `libibverbs.so.1`) is reached as
//! `rdma-core/libibverbs.so.1` and `rdma-core/librdmacm.so.1`, symbolic links made by [`link_directory`];
//! glibc maps a file reached under a second name once, so both names share one process-wide state
//! (`state`). Programs run with `soft-rdma run -- PROGRAM` or with that directory on `LD_LIBRARY_PATH`.
//!
//! The modules: `abi` (the C structs), `export` (versioned symbols, panics, handles, pipes), `state`
//! (runtime and session), `netif` (the interface the device stands for), `device` (device, contexts,
//! queries), `memory` (PDs, MRs), `cq` (CQs, channels), `lease` (the runtime's
//! worker held off while a thread waits for completions and serves the connections itself), `qp` (queue pairs, the data path), `cm` (rdma_cm),
//! `unsupported` (what iWARP or soft-rdma lacks), `strings` (the `*_str` helpers), `events` (the session's
//! end), `errno` (statuses in C's terms), `primitives` (the client calls beyond the connector model), `private`
//! (rdma-core's provider-facing symbols, for provider libraries programs link).
//! docs/rdma-core.md is the user's guide.

pub mod abi;
mod cm;
mod cq;
mod device;
mod errno;
mod events;
mod export;
mod lease;
mod memory;
mod netif;
mod primitives;
mod private;
mod qp;
mod srq;
mod state;
mod strings;
mod unsupported;

/// Every exported C function, for Rust callers that link the rlib (the tests): the same functions C
/// programs reach as `ibv_*`/`rdma_*`, including the data path's `ibv_context_ops` entries.
#[doc(hidden)]
pub mod c {
    pub use crate::cm::*;
    pub use crate::cq::*;
    pub use crate::device::*;
    pub use crate::memory::*;
    pub use crate::qp::*;
    pub use crate::strings::*;
    pub use crate::unsupported::*;
}

pub use netif::IFACE_ENV;
pub use qp::MAX_INLINE_DATA;
pub use state::{DEVICE_NAME, LOG_ENV};

/// Makes the directory `rdma-core/` beside `lib` (the built `libsoft_rdma_verbs.so`) holding both names as
/// links to it, and returns it: the directory to put first on `LD_LIBRARY_PATH` (the same function
/// `soft-rdma run` uses).
pub use soft_rdma::dropin::link_directory;
