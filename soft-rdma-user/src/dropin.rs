//! Where soft-rdma's drop-in `libibverbs.so.1` and `librdmacm.so.1` are found: one library file
//! (`libsoft_rdma_verbs.so`, the `soft-rdma-verbs` crate's cdylib) reached under rdma-core's two sonames
//! through a link directory beside it. `soft-rdma run` and the verbs crate (for its users and tests) make
//! that directory with the one [`link_directory`] here.
//!
//! glibc's loader looks a program's `DT_NEEDED` names up in `LD_LIBRARY_PATH` before the system's
//! directories (ld.so(8)) and maps a file reached under a second name once, so both names share one
//! process-wide state (`/work/shared/reference/verbs-abi.md`, "How glibc's loader treats two names").
//!
//! Where the library is looked for ([`candidates`]): beside the `soft-rdma` executable (a checkout's
//! `target/<profile>/`), then in the private directory [`installed_dir`] of the prefix the executable is
//! installed under (`/usr/bin/soft-rdma` → `/usr/lib/<multiarch>/soft-rdma/`, where the Debian package puts
//! it with its link directory already made). A private directory, not `/usr/lib/<multiarch>/` itself: the
//! loader never finds it unless `soft-rdma run` asks, so rdma-core's own `libibverbs1` and `librdmacm1` stay
//! what every other program loads, and both packages install together (Debian policy 8.1 and 10.2: shared
//! libraries used only by one package's programs belong in a private directory).

use std::io;
use std::path::{Path, PathBuf};

/// The drop-in library's file name.
pub const LIBRARY: &str = "libsoft_rdma_verbs.so";
/// The directory [`link_directory`] makes beside the library.
pub const LINK_DIR: &str = "rdma-core";
/// The sonames rdma-core 44's programs are linked against (`DT_NEEDED`), each a link to the library.
pub const SONAMES: [&str; 2] = ["libibverbs.so.1", "librdmacm.so.1"];

/// Debian's multiarch tuple for this build's target (Debian policy 9.1.1, the multiarch library directory):
/// the directory under `<prefix>/lib/` that the package installs the library in.
pub const MULTIARCH: &str = if cfg!(target_arch = "x86_64") {
    "x86_64-linux-gnu"
} else if cfg!(target_arch = "aarch64") {
    "aarch64-linux-gnu"
} else if cfg!(target_arch = "riscv64") {
    "riscv64-linux-gnu"
} else if cfg!(all(target_arch = "powerpc64", target_endian = "little")) {
    "powerpc64le-linux-gnu"
} else if cfg!(target_arch = "s390x") {
    "s390x-linux-gnu"
} else {
    "unknown-linux-gnu"
};

/// The installed library's private directory for an executable at `exe`: `<prefix>/lib/<MULTIARCH>/soft-rdma`
/// where `exe` is `<prefix>/bin/soft-rdma` (`/usr/bin` → `/usr/lib/x86_64-linux-gnu/soft-rdma`); `None` if
/// `exe` is not in a directory with a parent.
pub fn installed_dir(exe: &Path) -> Option<PathBuf> {
    let prefix = exe.parent()?.parent()?;
    Some(prefix.join("lib").join(MULTIARCH).join("soft-rdma"))
}

/// Where the library may be, in the order it is looked for, for the `soft-rdma` executable at `exe`: beside
/// it (a build tree), then [`installed_dir`] (an installed package).
pub fn candidates(exe: &Path) -> Vec<PathBuf> {
    let mut v = vec![exe.with_file_name(LIBRARY)];
    v.extend(installed_dir(exe).map(|d| d.join(LIBRARY)));
    v
}

/// Makes `<dir of lib>/rdma-core/` holding `libibverbs.so.1` and `librdmacm.so.1`, each a relative symbolic
/// link `../<file name of lib>`, and returns the directory: the one to put first on `LD_LIBRARY_PATH`.
///
/// Idempotent: a link that already points there is left alone. Atomic: a missing or wrong link is replaced by
/// creating a link under a temporary name and renaming it over the old one, so a program (or a concurrent
/// call) started meanwhile sees either the old link or the new one, never none.
pub fn link_directory(lib: &Path) -> io::Result<PathBuf> {
    let (Some(parent), Some(file)) = (lib.parent(), lib.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} names no file in a directory", lib.display()),
        ));
    };
    if !lib.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{} does not exist: build it first (cargo build -p soft-rdma-verbs)",
                lib.display()
            ),
        ));
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("soft-rdma-dropin-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn the_library_is_looked_for_beside_the_executable_then_in_the_installed_prefix() {
        let found = candidates(Path::new("/usr/bin/soft-rdma"));
        assert_eq!(
            found,
            [
                PathBuf::from("/usr/bin/libsoft_rdma_verbs.so"),
                PathBuf::from(format!("/usr/lib/{MULTIARCH}/soft-rdma/libsoft_rdma_verbs.so")),
            ]
        );
        let checkout = candidates(Path::new("/src/soft-rdma/target/release/soft-rdma"));
        assert_eq!(
            checkout[0],
            Path::new("/src/soft-rdma/target/release/libsoft_rdma_verbs.so")
        );
        assert_eq!(installed_dir(Path::new("/soft-rdma")), None);
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        assert_eq!(MULTIARCH, "x86_64-linux-gnu");
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
    fn link_directory_refuses_a_path_without_a_file_and_a_missing_library() {
        assert_eq!(
            link_directory(Path::new("/")).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        let d = scratch("missing");
        let missing = link_directory(&d.join("nothing.so")).unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
        assert!(
            missing.to_string().contains("cargo build -p soft-rdma-verbs"),
            "{missing}"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
