//! `soft-rdma run [--uds PATH] -- PROGRAM ARGS…`: runs an unmodified libibverbs/librdmacm program on
//! soft-rdma.
//!
//! It finds soft-rdma's drop-in library `libsoft_rdma_verbs.so` (`$SOFT_RDMA_VERBS_LIB`, else beside the
//! `soft-rdma` executable), makes the link directory beside it ([`link_directory`]), puts that directory first
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

/// The drop-in library's file name (the `soft-rdma-verbs` crate's cdylib).
pub const LIBRARY: &str = "libsoft_rdma_verbs.so";
/// The directory [`link_directory`] makes beside the library.
pub const LINK_DIR: &str = "rdma-core";
/// The sonames rdma-core 44's programs are linked against (`DT_NEEDED`), each a link to the library.
pub const SONAMES: [&str; 2] = ["libibverbs.so.1", "librdmacm.so.1"];
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

/// Makes `<dir of lib>/rdma-core/` holding `libibverbs.so.1` and `librdmacm.so.1`, each a relative symbolic
/// link `../<file name of lib>`, and returns the directory. The same layout as the `soft-rdma-verbs` crate's
/// `link_directory` (this crate cannot depend on that one: it depends on this one), which a netns test checks.
///
/// Idempotent: a link that already points there is left alone. Atomic: a missing or wrong link is replaced by
/// creating a link under a temporary name and renaming it over the old one, so a program started meanwhile
/// sees either the old link or the new one, never none.
pub fn link_directory(lib: &Path) -> io::Result<PathBuf> {
    let (Some(parent), Some(file)) = (lib.parent(), lib.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} names no file in a directory", lib.display()),
        ));
    };
    let dir = parent.join(LINK_DIR);
    std::fs::create_dir_all(&dir)?;
    let target = Path::new("..").join(file);
    for name in SONAMES {
        let link = dir.join(name);
        if std::fs::read_link(&link).is_ok_and(|t| t == target) {
            continue;
        }
        let tmp = dir.join(format!(".{name}.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&target, &tmp)?;
        if let Err(e) = std::fs::rename(&tmp, &link) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    }
    Ok(dir)
}

/// Where the library is: `$SOFT_RDMA_VERBS_LIB` (which must exist), else beside this executable.
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
    let p = exe.with_file_name(LIBRARY);
    if !p.is_file() {
        bail!(
            "soft-rdma's verbs library {} is missing: build it with `cargo build -p soft-rdma-verbs` (add \
             `--release` for a release soft-rdma), or set {LIBRARY_ENV} to its path",
            p.display()
        );
    }
    Ok(p)
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

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("soft-rdma-run-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn link_directory_makes_both_links_idempotently() {
        let d = scratch("links");
        let lib = d.join(LIBRARY);
        std::fs::write(&lib, b"not really a library").unwrap();
        let dir = link_directory(&lib).unwrap();
        assert_eq!(dir, d.join(LINK_DIR));
        for name in SONAMES {
            let link = dir.join(name);
            assert_eq!(std::fs::read_link(&link).unwrap(), Path::new("..").join(LIBRARY));
            assert_eq!(std::fs::read(&link).unwrap(), b"not really a library");
        }
        // Again: the same, and no temporary left behind.
        assert_eq!(link_directory(&lib).unwrap(), dir);
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, SONAMES);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn link_directory_replaces_a_wrong_link() {
        let d = scratch("wrong");
        let lib = d.join("libother.so");
        std::fs::write(&lib, b"x").unwrap();
        std::fs::create_dir_all(d.join(LINK_DIR)).unwrap();
        std::os::unix::fs::symlink("/nowhere", d.join(LINK_DIR).join(SONAMES[0])).unwrap();
        let dir = link_directory(&lib).unwrap();
        for name in SONAMES {
            assert_eq!(
                std::fs::read_link(dir.join(name)).unwrap(),
                Path::new("../libother.so")
            );
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn link_directory_refuses_a_path_without_a_file() {
        assert_eq!(
            link_directory(Path::new("/")).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }

    #[test]
    fn library_path_goes_first() {
        let d = Path::new("/x/rdma-core");
        assert_eq!(library_path(d, None), "/x/rdma-core");
        assert_eq!(library_path(d, Some("".into())), "/x/rdma-core");
        assert_eq!(library_path(d, Some("/a:/b".into())), "/x/rdma-core:/a:/b");
    }
}
