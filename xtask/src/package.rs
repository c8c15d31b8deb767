//! `cargo xtask package`: soft-rdma as a Debian package, `target/debian/soft-rdma_<version>-1_amd64.deb`.
//!
//! 1. the toolchain parts of setup (nightly rust-src and bpf-linker: soft-rdmad's build builds the XDP
//!    program), and cargo-deb [`CARGO_DEB_VERSION`] from crates.io if missing or another version;
//! 2. `cargo build --release -p soft-rdma-user --bins`, then `-p soft-rdma-verbs --lib`: soft-rdmad,
//!    soft-rdma and the drop-in library `libsoft_rdma_verbs.so`;
//! 3. the manual pages, generated from the binaries' own clap definitions (`soft-rdmad --write-man-page`,
//!    `soft-rdma write-man-pages`, both hidden) into `target/debian-staging/man/`;
//! 4. `cargo deb --no-build` on soft-rdma-user, whose `[package.metadata.deb]` lists what goes where
//!    (docs/installing.md): the binaries, the library in `/usr/lib/x86_64-linux-gnu/soft-rdma/` with its
//!    link directory, the systemd unit, `/etc/soft-rdma/soft-rdmad.toml` (a conffile), the manual pages, the
//!    docs, the copyright file and the maintainer scripts in `dist/debian/`;
//! 5. `lintian --fail-on error` on the package (installed on demand): an error fails the command.
//!
//! `--test` then builds a second package with a higher version (the upgrade) and runs
//! `tests/tests/package.rs`: a debootstrap'ed bookworm root, the package installed there with apt-get,
//! soft-rdmad and Debian's rping and ib_write_bw run from that root alone in two namespaces, and install,
//! upgrade, remove and purge leaving no stray file.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::{Tally, cargo, run, run_tests, setup};

/// The cargo-deb release this project's packaging was written and checked against.
pub const CARGO_DEB_VERSION: &str = "3.8.0";

/// The Debian revision of the upgrade package `--test` builds: above cargo-deb's default `-1`.
const UPGRADE_REVISION: &str = "1+upgradetest1";

#[derive(clap::Args)]
pub struct PackageArgs {
    /// The package's version (default: the crate's version and revision 1, e.g. 0.1.0-1).
    #[arg(long)]
    deb_version: Option<String>,
    /// Skip lintian.
    #[arg(long)]
    no_lintian: bool,
    /// Then run the package suite (tests/tests/package.rs) against it, and an upgrade package.
    #[arg(long)]
    test: bool,
}

pub fn run_command(root: &Path, args: PackageArgs) -> Result<()> {
    let deb = build(root, args.deb_version.as_deref(), &root.join("target/debian"))?;
    if !args.no_lintian {
        lintian(&deb)?;
    }
    if args.test {
        let mut tally = Tally::default();
        let ok = test_suite(root, &deb, &mut tally)?;
        println!(
            "package suite: {} passed, {} failed, {} skipped",
            tally.passed, tally.failed, tally.ignored
        );
        if !ok || tally.failed > 0 {
            bail!("the package suite failed");
        }
    }
    Ok(())
}

/// The whole package step of `cargo xtask test`: build, lintian, upgrade package, suite. Failures are
/// counted in `tally`; returns whether everything ran and passed.
pub fn gate(root: &Path, tally: &mut Tally) -> bool {
    let outcome = build(root, None, &root.join("target/debian")).and_then(|deb| {
        lintian(&deb)?;
        tally.passed += 1;
        test_suite(root, &deb, tally)
    });
    match outcome {
        Ok(ok) => ok,
        Err(e) => {
            eprintln!("Debian package: {e:#}");
            tally.failed += 1;
            false
        }
    }
}

/// The upgrade package, then `cargo test -p soft-rdma-tests --test package` with both packages named.
fn test_suite(root: &Path, deb: &Path, tally: &mut Tally) -> Result<bool> {
    let version = deb_version_of(deb)?;
    let upstream = version.rsplit_once('-').map_or(version.as_str(), |(u, _)| u);
    let upgrade_version = format!("{upstream}-{UPGRADE_REVISION}");
    // cargo-deb deletes the package's other versions from target/debian/ whatever `--output` says: the
    // first package is put back after the upgrade package is built.
    let dir = root.join("target/debian-upgrade-test");
    let kept = dir.join("first").join(deb.file_name().context("a package file")?);
    std::fs::create_dir_all(kept.parent().expect("a directory"))?;
    std::fs::copy(deb, &kept)?;
    let upgrade = build(root, Some(&upgrade_version), &dir)?;
    std::fs::copy(&kept, deb)?;
    setup::apt_install(&["debootstrap"])?;
    run_tests(
        cargo()
            .args([
                "test",
                "-p",
                "soft-rdma-tests",
                "--test",
                "package",
                "--no-fail-fast",
            ])
            .args(["--", "--include-ignored"])
            .env("SOFT_RDMA_DEB", deb)
            .env("SOFT_RDMA_DEB_UPGRADE", &upgrade),
        tally,
    )
}

/// The target directory cargo builds into (`$CARGO_TARGET_DIR`, else `target/`).
fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
}

/// Builds the package into `out`; returns its path.
fn build(root: &Path, deb_version: Option<&str>, out: &Path) -> Result<PathBuf> {
    setup::toolchain()?;
    ensure_cargo_deb()?;
    // Two builds, as `cargo xtask bench` makes them (so the gate builds them once): together, cargo would
    // unify the features and build the drop-in library on a daemon-featured soft-rdma-user; on its own it
    // links the client library alone (no aya, smoltcp or xdpilone: docs/licences.md).
    run(cargo().args(["build", "--release", "-p", "soft-rdma-user", "--bins"]))
        .context("the release build of soft-rdmad and soft-rdma failed")?;
    run(cargo().args(["build", "--release", "-p", "soft-rdma-verbs", "--lib"]))
        .context("the release build of the drop-in library failed")?;
    let release = target_dir(root).join("release");
    let man = root.join("target/debian-staging/man");
    let _ = std::fs::remove_dir_all(&man);
    std::fs::create_dir_all(&man)?;
    run(Command::new(release.join("soft-rdmad"))
        .arg("--write-man-page")
        .arg(&man))?;
    run(Command::new(release.join("soft-rdma"))
        .arg("write-man-pages")
        .arg(&man))?;
    let mut pages: Vec<String> = std::fs::read_dir(&man)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    pages.sort();
    println!("manual pages: {}", pages.join(" "));
    std::fs::create_dir_all(out)?;
    // Only this build's package in `out`, so that nothing stale is taken for it.
    for e in std::fs::read_dir(out)? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "deb") {
            std::fs::remove_file(&p)?;
        }
    }
    let mut deb = cargo();
    // `--strip`: the release profile keeps line tables (`debug = 1`, for backtraces and profiles), which
    // cargo-deb would otherwise ship; Debian policy 10.1 wants installed binaries stripped.
    deb.args(["deb", "-p", "soft-rdma-user", "--no-build", "--strip", "--output"])
        .arg(out);
    if let Some(v) = deb_version {
        deb.args(["--deb-version", v]);
    }
    run(&mut deb).context("cargo deb failed")?;
    let built: Vec<PathBuf> = std::fs::read_dir(out)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "deb"))
        .collect();
    match built.as_slice() {
        [one] => {
            println!("✓ {}", one.display());
            Ok(one.clone())
        }
        other => bail!(
            "cargo deb left {} packages in {}, expected one",
            other.len(),
            out.display()
        ),
    }
}

/// `dpkg-deb -f DEB Version`.
fn deb_version_of(deb: &Path) -> Result<String> {
    let out = Command::new("dpkg-deb")
        .arg("-f")
        .arg(deb)
        .arg("Version")
        .output()
        .context("cannot run dpkg-deb")?;
    if !out.status.success() {
        bail!(
            "dpkg-deb -f {} Version: {}",
            deb.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// cargo-deb [`CARGO_DEB_VERSION`], installed from crates.io unless that version is there.
fn ensure_cargo_deb() -> Result<()> {
    let have = cargo().args(["deb", "--version"]).output();
    if let Ok(out) = &have
        && out.status.success()
        && String::from_utf8_lossy(&out.stdout).contains(CARGO_DEB_VERSION)
    {
        println!("✓ cargo-deb {CARGO_DEB_VERSION}");
        return Ok(());
    }
    println!("… installing cargo-deb {CARGO_DEB_VERSION}");
    run(cargo().args(["install", "cargo-deb", "--locked", "--version", CARGO_DEB_VERSION]))
        .with_context(|| format!("`cargo install cargo-deb --version {CARGO_DEB_VERSION}` failed"))
}

/// lintian on the package: its tags are printed; an error (E:) fails. Debian's lintian is installed on
/// demand.
pub fn lintian(deb: &Path) -> Result<()> {
    setup::apt_install(&["lintian"])?;
    let out = Command::new("lintian")
        .args(["--fail-on", "error", "--display-info", "--tag-display-limit", "0"])
        .arg(deb)
        .output()
        .context("cannot run lintian")?;
    let text = String::from_utf8_lossy(&out.stdout);
    print!("{text}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    let errors = text.lines().filter(|l| l.starts_with("E: ")).count();
    let warnings = text.lines().filter(|l| l.starts_with("W: ")).count();
    if !out.status.success() || errors > 0 {
        bail!("lintian found {errors} errors in {} (above)", deb.display());
    }
    println!("✓ lintian: no error ({warnings} warnings)");
    Ok(())
}
