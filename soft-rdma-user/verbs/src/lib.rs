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
//! queries), `memory` (PDs, MRs), `cq` (CQs, channels), `qp` (queue pairs, the data path), `cm` (rdma_cm),
//! `unsupported` (what iWARP or soft-rdma lacks), `strings` (the `*_str` helpers), `events` (the session's
//! end), `errno` (statuses in C's terms), `primitives` (the client calls beyond the connector model), `private`
//! (rdma-core's provider-facing symbols, for provider libraries programs link).
//! docs/rdma-core.md is the user's guide.

use std::io;
use std::path::{Path, PathBuf};

pub mod abi;
mod cm;
mod cq;
mod device;
mod errno;
mod events;
mod export;
mod memory;
mod netif;
mod primitives;
mod private;
mod qp;
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

/// The names programs load the library by: both link to the one file.
pub const LIBRARY_NAMES: [&str; 2] = ["libibverbs.so.1", "librdmacm.so.1"];

/// Makes (idempotently and atomically) the directory `rdma-core/` beside `lib` (the built
/// `libsoft_rdma_verbs.so`), holding `libibverbs.so.1` and `librdmacm.so.1` as symbolic links to it,
/// and returns it: the directory to put first on `LD_LIBRARY_PATH`.
///
/// Each link is made under a temporary name and renamed over the final one, so that a concurrent call or
/// a program starting meanwhile never sees a missing or half-made link.
pub fn link_directory(lib: &Path) -> io::Result<PathBuf> {
    let file_name = lib.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} names no file", lib.display()),
        )
    })?;
    if !lib.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{} does not exist: build it first (cargo build -p soft-rdma-verbs)",
                lib.display()
            ),
        ));
    }
    let parent = lib.parent().unwrap_or(Path::new("."));
    let dir = parent.join("rdma-core");
    std::fs::create_dir_all(&dir)?;
    let target = Path::new("..").join(file_name);
    for name in LIBRARY_NAMES {
        let link = dir.join(name);
        if std::fs::read_link(&link).is_ok_and(|t| t == target) {
            continue;
        }
        let tmp = dir.join(format!(".{name}.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&target, &tmp)?;
        std::fs::rename(&tmp, &link)?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_directory_links_both_names_and_is_idempotent() {
        let d = tempfile::tempdir().unwrap();
        let lib = d.path().join("libsoft_rdma_verbs.so");
        std::fs::write(&lib, b"not really a library").unwrap();
        let dir = link_directory(&lib).unwrap();
        assert_eq!(dir, d.path().join("rdma-core"));
        for name in LIBRARY_NAMES {
            assert_eq!(
                std::fs::read_link(dir.join(name)).unwrap(),
                Path::new("../libsoft_rdma_verbs.so")
            );
            assert_eq!(std::fs::read(dir.join(name)).unwrap(), b"not really a library");
        }
        assert_eq!(link_directory(&lib).unwrap(), dir);
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            2,
            "no temporary links left behind"
        );
        let missing = link_directory(&d.path().join("nothing.so")).unwrap_err();
        assert!(
            missing.to_string().contains("cargo build -p soft-rdma-verbs"),
            "{missing}"
        );
    }
}
