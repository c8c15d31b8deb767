//! `soft-rdma run [--uds PATH] -- PROGRAM ARGS…`: runs an unmodified libibverbs/librdmacm program on
//! soft-rdma.
//!
//! It finds soft-rdma's drop-in library `libsoft_rdma_verbs.so` (`$SOFT_RDMA_VERBS_LIB`, else beside the
//! `soft-rdma` executable, else in the installed package's private directory
//! `<prefix>/lib/<multiarch>/soft-rdma/`: `soft_rdma::dropin::candidates`), makes the link directory beside it
//! (`soft_rdma::dropin::link_directory`; the package ships it made), puts that directory first
//! on `LD_LIBRARY_PATH`, sets `SOFT_RDMA_UDS` when `--uds` is given, and `exec`s the program: it replaces this
//! process, so its signals and its exit code are the program's own.
//!
//! glibc's loader looks a program's `DT_NEEDED` names (`libibverbs.so.1`, `librdmacm.so.1`) up in
//! `LD_LIBRARY_PATH` before the system's directories (ld.so(8), "Rpath token expansion" and the search order),
//! and ignores `LD_LIBRARY_PATH` for set-user-ID programs; both names reach the one library file, which the
//! loader maps once (`/work/shared/reference/verbs-abi.md`, "How glibc's loader treats two names").

use std::ffi::OsString;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

pub use soft_rdma::dropin::{LIBRARY, LINK_DIR, link_directory};
/// Overrides where the library is looked for.
pub const LIBRARY_ENV: &str = "SOFT_RDMA_VERBS_LIB";

#[derive(clap::Args)]
pub struct RunArgs {
    /// The program and its arguments, after `--` (e.g. `-- rping -s -a 10.0.0.2`).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM [ARGS]..."
    )]
    command: Vec<OsString>,
}

/// Where the library is: `$SOFT_RDMA_VERBS_LIB` (which must exist), else the first of
/// `soft_rdma::dropin::candidates` for this executable that exists.
pub fn find_library() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(LIBRARY_ENV).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            bail!(
                "{LIBRARY_ENV}={} is not a file: point it at soft-rdma's {LIBRARY}, or unset it to use the one beside \
                 the soft-rdma executable",
                p.display()
            );
        }
        return Ok(p);
    }
    let exe = std::env::current_exe().context("cannot find the soft-rdma executable's own path")?;
    let tried = soft_rdma::dropin::candidates(&exe);
    if let Some(p) = tried.iter().find(|p| p.is_file()) {
        return Ok(p.clone());
    }
    let tried: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
    bail!(
        "soft-rdma's verbs library {LIBRARY} is missing (looked in {}): in a checkout build it with `cargo build \
         -p soft-rdma-verbs` (add `--release` for a release soft-rdma); an installed soft-rdma needs its package \
         complete (`apt-get install --reinstall soft-rdma`); or set {LIBRARY_ENV} to its path",
        tried.join(", ")
    );
}

/// `dir`, then what `LD_LIBRARY_PATH` held (`current`), colon-separated.
pub fn library_path(dir: &Path, current: Option<OsString>) -> OsString {
    let mut v = dir.as_os_str().to_owned();
    if let Some(c) = current.filter(|c| !c.is_empty()) {
        v.push(":");
        v.push(c);
    }
    v
}

/// Execs the program; returns only if it could not start (the error, and the shell's exit code for it: 127
/// not found, 126 not executable).
pub fn run(uds: Option<PathBuf>, args: RunArgs) -> (anyhow::Error, i32) {
    let lib = match find_library() {
        Ok(l) => l,
        Err(e) => return (e, 1),
    };
    let dir = match link_directory(&lib) {
        Ok(d) => d,
        Err(e) => {
            let e = anyhow::anyhow!(
                "cannot make the link directory {} beside {}: {e}; make that directory writable, or copy {LIBRARY} \
                 where it is",
                lib.with_file_name(LINK_DIR).display(),
                lib.display()
            );
            return (e, 1);
        }
    };
    let (program, rest) = args.command.split_first().expect("clap requires a program");
    let mut cmd = std::process::Command::new(program);
    cmd.args(rest).env(
        "LD_LIBRARY_PATH",
        library_path(&dir, std::env::var_os("LD_LIBRARY_PATH")),
    );
    if let Some(u) = uds {
        cmd.env("SOFT_RDMA_UDS", u);
    }
    let err = cmd.exec();
    let name = Path::new(program).display();
    match err.kind() {
        io::ErrorKind::NotFound => (
            anyhow::anyhow!(
                "program {name} not found: give its path, or install it (rping, ucmatose, cmtime, rdma_server and \
                 rdma_client are in Debian's rdmacm-utils; ibv_devices and ibv_devinfo in ibverbs-utils)"
            ),
            127,
        ),
        io::ErrorKind::PermissionDenied => (
            anyhow::anyhow!("program {name} cannot be executed: {err}; check its permissions"),
            126,
        ),
        _ => (anyhow::anyhow!("cannot start {name}: {err}"), 126),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_path_goes_first() {
        let d = Path::new("/x/rdma-core");
        assert_eq!(library_path(d, None), "/x/rdma-core");
        assert_eq!(library_path(d, Some("".into())), "/x/rdma-core");
        assert_eq!(library_path(d, Some("/a:/b".into())), "/x/rdma-core:/a:/b");
    }
}
