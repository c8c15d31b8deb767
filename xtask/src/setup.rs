//! `cargo xtask setup`: installs what a fresh machine lacks, and is a fast no-op when all is there.
//!
//! 1. the nightly toolchain's `rust-src` (the XDP program is built with `-Z build-std=core`);
//! 2. `bpf-linker`, built against the nightly toolchain's *own* libLLVM (it must match the LLVM that rustc
//!    nightly emits bitcode for): a prefix directory with `bin/llvm-config` and `lib/libLLVM*` links into the
//!    toolchain's sysroot, then `LLVM_PREFIX=… cargo install bpf-linker --features llvm-<major>`. The prefix
//!    lives under `$CARGO_HOME/soft-rdma/` because bpf-linker's rpath points into it;
//! 3. the Debian packages the tests use (iproute2, ethtool, tshark, iputils-ping, and prometheus, whose
//!    server scrapes two daemons in the metrics suite and whose promtool checks their exposition), and
//!    rdma-core's unmodified programs and headers that the rdma_core_programs suite runs on soft-rdma's drop-in
//!    libraries: rdmacm-utils (rping, ucmatose, cmtime, rdma_server, rdma_client), perftest, ibverbs-utils
//!    (ibv_devices, ibv_devinfo), libibverbs-dev and librdmacm-dev (the headers `tests/c/bad_use.c` is
//!    compiled against, and the `-libverbs -lrdmacm` link names), and python3-pyverbs (rdma-core's Python
//!    bindings, with rdma-core's own test suite, which the rdma_core_suite suite runs on soft-rdma); and the
//!    RDMA software people run on those libraries, which the middleware suites run unmodified: libfabric-bin
//!    (fi_info, fi_pingpong: libfabric's verbs and RxM providers), fio (its `ioengine=rdma`) and qperf, with
//!    iperf3 as the TCP baseline no one here wrote.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

const APT_PACKAGES: [&str; 15] = [
    "iproute2",
    "ethtool",
    "tshark",
    "iputils-ping",
    "prometheus",
    "rdmacm-utils",
    "perftest",
    "ibverbs-utils",
    "libibverbs-dev",
    "librdmacm-dev",
    "python3-pyverbs",
    "libfabric-bin",
    "fio",
    "qperf",
    "iperf3",
];

pub fn run() -> Result<()> {
    toolchain()?;
    apt_packages()?;
    Ok(())
}

/// What building soft-rdmad needs (1 and 2 above), without the test packages.
pub fn toolchain() -> Result<()> {
    rust_src()?;
    bpf_linker()
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn rust_src() -> Result<()> {
    let installed =
        output(Command::new("rustup").args(["component", "list", "--toolchain", "nightly", "--installed"]))
            .context("the nightly toolchain is missing: `rustup toolchain install nightly`")?;
    if installed.lines().any(|l| l.starts_with("rust-src")) {
        println!("✓ nightly rust-src");
        return Ok(());
    }
    println!("… installing nightly rust-src");
    crate::run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))
        .context("`rustup component add rust-src --toolchain nightly` failed")
}

/// The nightly toolchain's LLVM: (full version, major, the libLLVM files in its sysroot).
struct NightlyLlvm {
    version: String,
    major: String,
    libs: Vec<PathBuf>,
    main_lib: PathBuf,
}

fn nightly_llvm() -> Result<NightlyLlvm> {
    let vv = output(Command::new("rustc").args(["+nightly", "-vV"]))?;
    let version = vv
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .context("`rustc +nightly -vV` names no LLVM version")?
        .trim()
        .to_owned();
    let major = version.split('.').next().unwrap_or_default().to_owned();
    let sysroot = output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))?;
    let lib_dir = Path::new(sysroot.trim()).join("lib");
    let mut libs: Vec<PathBuf> = std::fs::read_dir(&lib_dir)
        .with_context(|| format!("reading {}", lib_dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM"))
        })
        .collect();
    libs.sort();
    // The real library (not a linker-script or symlink) is the soname bpf-linker will need at run time.
    let main_lib = libs
        .iter()
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM.so."))
        })
        .or_else(|| libs.first())
        .cloned()
        .with_context(|| {
            format!(
                "no libLLVM in {} (is the nightly toolchain complete?)",
                lib_dir.display()
            )
        })?;
    Ok(NightlyLlvm {
        version,
        major,
        libs,
        main_lib,
    })
}

fn cargo_home() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cargo")
        })
}

/// bpf-linker is usable if it runs and its libLLVM resolves to the current nightly's library.
fn bpf_linker_matches(llvm: &NightlyLlvm) -> Result<Option<String>> {
    let Ok(path) = output(Command::new("sh").args(["-c", "command -v bpf-linker"])) else {
        return Ok(None);
    };
    let path = path.trim().to_owned();
    let Ok(version) = output(Command::new(&path).arg("--version")) else {
        return Ok(None);
    };
    let ldd = output(Command::new("ldd").arg(&path)).unwrap_or_default();
    let want = std::fs::canonicalize(&llvm.main_lib)?;
    let linked = ldd.lines().filter(|l| l.contains("libLLVM")).find_map(|l| {
        let target = l.split("=>").nth(1)?.split_whitespace().next()?;
        std::fs::canonicalize(target).ok()
    });
    Ok((linked.as_deref() == Some(want.as_path())).then(|| version.trim().to_owned()))
}

fn bpf_linker() -> Result<()> {
    let llvm = nightly_llvm()?;
    if let Some(v) = bpf_linker_matches(&llvm)? {
        println!("✓ {v} (LLVM {})", llvm.version);
        return Ok(());
    }
    println!(
        "… building bpf-linker against the nightly toolchain's LLVM {} (about a minute)",
        llvm.version
    );
    let prefix = cargo_home()
        .join("soft-rdma")
        .join(format!("llvm-{}", llvm.version));
    let (bin, lib) = (prefix.join("bin"), prefix.join("lib"));
    std::fs::create_dir_all(&bin)?;
    std::fs::create_dir_all(&lib)?;
    let config = bin.join("llvm-config");
    std::fs::write(
        &config,
        format!(
            "#!/bin/sh\n# Written by cargo xtask setup: bpf-linker's build asks only for the version.\necho {}\n",
            llvm.version
        ),
    )?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o755))?;
    let link = |target: &Path, name: &Path| -> Result<()> {
        let _ = std::fs::remove_file(name);
        std::os::unix::fs::symlink(target, name).with_context(|| format!("symlink {}", name.display()))
    };
    for l in &llvm.libs {
        link(l, &lib.join(l.file_name().expect("a file")))?;
    }
    link(&llvm.main_lib, &lib.join("libLLVM.so"))?;
    crate::run(
        crate::cargo()
            .args([
                "install",
                "bpf-linker",
                "--force",
                "--no-default-features",
                "--features",
            ])
            .arg(format!("llvm-{}", llvm.major))
            .env("LLVM_PREFIX", &prefix),
    )
    .context("building bpf-linker failed; see the output above")?;
    match bpf_linker_matches(&llvm)? {
        Some(v) => println!("✓ {v} (LLVM {})", llvm.version),
        None => bail!(
            "bpf-linker was installed but does not link the nightly's libLLVM; is ~/.cargo/bin on PATH?"
        ),
    }
    Ok(())
}

fn apt_packages() -> Result<()> {
    apt_install(&APT_PACKAGES)
}

/// Installs the Debian packages of `packages` that are missing (`apt-get update` first: a fresh machine has
/// no package lists), and says which were there already.
pub fn apt_install(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| {
            !output(Command::new("dpkg-query").args(["-W", "-f=${Status}", p]))
                .is_ok_and(|s| s.contains("install ok installed"))
        })
        .collect();
    if missing.is_empty() {
        println!("✓ Debian packages: {}", packages.join(", "));
        return Ok(());
    }
    println!("… installing Debian packages: {}", missing.join(", "));
    let fix = format!(
        "run as root: apt-get update && apt-get install -y {}",
        missing.join(" ")
    );
    // tshark asks whether non-root users may capture; answer no, non-interactively.
    let mut preseed = Command::new("debconf-set-selections")
        .stdin(Stdio::piped())
        .spawn()?;
    use std::io::Write;
    preseed
        .stdin
        .take()
        .expect("piped")
        .write_all(b"wireshark-common wireshark-common/install-setuid boolean false\n")?;
    preseed.wait()?;
    crate::run(
        Command::new("apt-get")
            .args(["update", "-qq"])
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .with_context(|| fix.clone())?;
    crate::run(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .with_context(|| fix)?;
    println!("✓ Debian packages: {}", packages.join(", "));
    Ok(())
}

/// cargo-fuzz, installed on first use.
pub fn ensure_cargo_fuzz() -> Result<()> {
    if output(Command::new("cargo").args(["+nightly", "fuzz", "--version"])).is_ok() {
        return Ok(());
    }
    println!("… installing cargo-fuzz");
    crate::run(crate::cargo().args(["install", "cargo-fuzz", "--locked"]))
        .context("`cargo install cargo-fuzz` failed")
}
