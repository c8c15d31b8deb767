//! A clean Debian root for the package suite (`tests/tests/package.rs`): a minimal bookworm made by
//! debootstrap from the Debian mirror this machine reaches, cached as a tarball, unpacked afresh for each test
//! ([`Chroot::fresh`]), with `/proc` and a `/dev/shm` mounted in it and unmounted on drop; commands run in it
//! with `chroot` (in a test namespace with `ip netns exec NS chroot ROOT …`) and a clean environment, so that
//! nothing from the build tree is visible to them: only what debootstrap and `apt-get install ./….deb` put
//! there.
//!
//! The cache, `target/debootstrap-cache/bookworm-<key>.tar`, is keyed by everything that makes the root
//! (suite, variant, mirror, [`ROOT_PACKAGES`]): change one and a new root is made. `$SOFT_RDMA_DEBIAN_MIRROR`
//! overrides the mirror (default `http://deb.debian.org/debian`, this machine's own apt source).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use anyhow::{Context, Result, bail};

/// The Debian release the root is made of.
pub const SUITE: &str = "bookworm";
/// Packages debootstrap adds to the minimal base: the programs the suite runs on soft-rdma (Debian's own
/// rdmacm-utils and perftest, with rdma-core's libibverbs1 and librdmacm1), and adduser, which the package
/// depends on (so `apt-get install ./….deb` needs nothing from the network).
pub const ROOT_PACKAGES: [&str; 3] = ["adduser", "perftest", "rdmacm-utils"];
/// The PATH of commands run in the root.
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// One test at a time makes the cached root (tests of one binary run on threads).
static CACHE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn mirror() -> String {
    std::env::var("SOFT_RDMA_DEBIAN_MIRROR")
        .ok()
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| "http://deb.debian.org/debian".into())
}

/// The workspace's `target/` (beside the tests crate).
pub fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate is in the workspace")
        .join("target")
}

/// FNV-1a of `text`, as hex: the cache key (stable across Rust releases, unlike `DefaultHasher`).
fn key(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The cached root's tarball, made with debootstrap if missing. Needs root and debootstrap (`cargo xtask
/// package --test` installs it).
pub fn cached_root() -> Result<PathBuf> {
    let _one = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    let mirror = mirror();
    let recipe = format!("{SUITE} minbase {mirror} {}", ROOT_PACKAGES.join(","));
    let dir = target_dir().join("debootstrap-cache");
    let tar = dir.join(format!("{SUITE}-{}.tar", key(&recipe)));
    if tar.is_file() {
        return Ok(tar);
    }
    std::fs::create_dir_all(&dir)?;
    let work = dir.join(format!("building-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    println!(
        "making the {SUITE} root with debootstrap ({recipe}); cached as {}",
        tar.display()
    );
    let started = std::time::Instant::now();
    let out = Command::new("debootstrap")
        .args(["--variant=minbase", "--include"])
        .arg(ROOT_PACKAGES.join(","))
        .args([SUITE])
        .arg(&work)
        .arg(&mirror)
        .stdin(Stdio::null())
        .output()
        .context("cannot run debootstrap: install it (apt-get install debootstrap; `cargo xtask package --test` does)")?;
    if !out.status.success() {
        let log = std::fs::read_to_string(work.join("debootstrap/debootstrap.log")).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&work);
        bail!(
            "debootstrap {SUITE} from {mirror} failed: {}\n{}\n{log}",
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    let partial = tar.with_extension("tar.partial");
    let packed = Command::new("tar")
        .arg("-C")
        .arg(&work)
        .args(["--numeric-owner", "-cf"])
        .arg(&partial)
        .arg(".")
        .status();
    let _ = std::fs::remove_dir_all(&work);
    if !packed.is_ok_and(|s| s.success()) {
        let _ = std::fs::remove_file(&partial);
        bail!("cannot pack the debootstrap root into {}", partial.display());
    }
    std::fs::rename(&partial, &tar)?;
    println!(
        "debootstrap root made in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(tar)
}

/// A fresh copy of the cached root, with `/proc` and `/dev/shm` mounted; unmounted and deleted on drop
/// (`SOFT_RDMA_TEST_KEEP_LOGS=1` keeps the files, unmounted).
pub struct Chroot {
    dir: PathBuf,
    mounts: Vec<PathBuf>,
}

impl Chroot {
    /// Unpacks the cached root (made first if missing) into `target/package-test/<tag>-<pid>/`.
    pub fn fresh(tag: &str) -> Result<Chroot> {
        let tar = cached_root()?;
        let dir = target_dir()
            .join("package-test")
            .join(format!("{tag}-{}", std::process::id()));
        if dir.exists() {
            bail!("{} exists: a previous run's root? remove it", dir.display());
        }
        std::fs::create_dir_all(&dir)?;
        let mut root = Chroot {
            dir,
            mounts: Vec::new(),
        };
        crate::output_ok(
            Command::new("tar")
                .arg("-C")
                .arg(&root.dir)
                .args(["--numeric-owner", "-xf"])
                .arg(&tar),
            "unpacking the debootstrap root",
        )?;
        root.mount(&["-t", "proc", "proc"], "proc")?;
        root.mount(&["-t", "tmpfs", "-o", "mode=1777", "tmpfs"], "dev/shm")?;
        Ok(root)
    }

    fn mount(&mut self, how: &[&str], at: &str) -> Result<()> {
        let at = self.dir.join(at);
        std::fs::create_dir_all(&at)?;
        crate::output_ok(
            Command::new("mount").args(how).arg(&at),
            &format!("mounting {}", at.display()),
        )?;
        self.mounts.push(at);
        Ok(())
    }

    /// The root's directory on the host.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `path` inside the root, as the host sees it (`/etc/group` → `<dir>/etc/group`).
    pub fn host_path(&self, path: &str) -> PathBuf {
        self.dir.join(path.trim_start_matches('/'))
    }

    /// `chroot ROOT program args…` (in namespace `ns` if given: `ip netns exec NS chroot …`), with a clean
    /// environment: PATH, HOME, LC_ALL=C, DEBIAN_FRONTEND=noninteractive, and nothing of the test's.
    pub fn command(&self, ns: Option<&str>, program: &str, args: &[&str]) -> Command {
        let mut c = match ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "chroot"]);
                c
            }
            None => Command::new("chroot"),
        };
        c.arg(&self.dir).arg(program).args(args);
        c.env_clear()
            .env("PATH", PATH)
            .env("HOME", "/root")
            .env("LC_ALL", "C")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null());
        c
    }

    /// Runs `program args…` in the root to completion: its output, or an error with both its outputs.
    pub fn run(&self, program: &str, args: &[&str]) -> Result<Output> {
        let what = format!("chroot {} {program} {}", self.dir.display(), args.join(" "));
        let out = self
            .command(None, program, args)
            .output()
            .with_context(|| format!("running {what}"))?;
        if !out.status.success() {
            bail!(
                "{what} failed ({}):\n{}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(out)
    }

    /// [`Self::run`]'s standard output, as text.
    pub fn stdout(&self, program: &str, args: &[&str]) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.run(program, args)?.stdout).into_owned())
    }

    /// Copies `deb` into the root's `/tmp` and installs it there with `apt-get install ./….deb`; the copy is
    /// deleted again.
    pub fn apt_install(&self, deb: &Path) -> Result<Output> {
        let name = deb
            .file_name()
            .context("a .deb file")?
            .to_string_lossy()
            .into_owned();
        let inside = format!("/tmp/{name}");
        std::fs::copy(deb, self.host_path(&inside)).with_context(|| format!("copying {}", deb.display()))?;
        let out = self.run(
            "apt-get",
            &[
                "install",
                "-y",
                "--no-install-recommends",
                "-o",
                "Dpkg::Use-Pty=0",
                &inside,
            ],
        );
        let _ = std::fs::remove_file(self.host_path(&inside));
        out
    }

    /// Every path in the root (directories, files, links), relative to it, but under the mounts and the
    /// volatile directories (`proc`, `sys`, `dev`, `run`, `tmp`).
    pub fn files(&self) -> Result<BTreeSet<String>> {
        fn walk(dir: &Path, rel: &str, into: &mut BTreeSet<String>) -> Result<()> {
            for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
                let e = e?;
                let name = e.file_name().to_string_lossy().into_owned();
                let path = if rel.is_empty() {
                    name
                } else {
                    format!("{rel}/{name}")
                };
                if ["proc", "sys", "dev", "run", "tmp"].contains(&path.as_str()) {
                    continue;
                }
                let kind = e.file_type()?;
                into.insert(path.clone());
                if kind.is_dir() {
                    walk(&e.path(), &path, into)?;
                }
            }
            Ok(())
        }
        let mut set = BTreeSet::new();
        walk(&self.dir, "", &mut set)?;
        Ok(set)
    }
}

impl Drop for Chroot {
    fn drop(&mut self) {
        let mut all_gone = true;
        for m in self.mounts.drain(..).rev() {
            let ok = Command::new("umount").arg(&m).status().is_ok_and(|s| s.success())
                || Command::new("umount")
                    .arg("-l")
                    .arg(&m)
                    .status()
                    .is_ok_and(|s| s.success());
            if !ok {
                eprintln!(
                    "cannot unmount {}: left in place, and the root with it",
                    m.display()
                );
                all_gone = false;
            }
        }
        // Never delete through a mount point: only a root with nothing mounted under it goes.
        let dir = self.dir.display().to_string();
        let under = format!("{dir}/");
        let mounted = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .any(|p| p == dir || p.starts_with(&under));
        if all_gone && !mounted && std::env::var_os("SOFT_RDMA_TEST_KEEP_LOGS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::key;

    #[test]
    fn the_cache_key_follows_the_recipe() {
        assert_eq!(key(""), "cbf29ce484222325");
        assert_ne!(key("bookworm minbase m a,b"), key("bookworm minbase m a,c"));
    }
}
