//! `cargo xtask check-fresh`: proves, on a machine that already has every tool, that a machine with none of
//! them can still reach `cargo xtask setup`, and that an application can link the client library without the
//! daemon's tool chain. It is the first step of `cargo xtask test`, because CI runs on a machine where earlier
//! runs left bpf-linker behind, and a green run there would otherwise hide a broken set-up.
//!
//! 1. `cargo tree`: xtask's build graph has no soft-rdma-user and nothing that builds the XDP program; the
//!    client-only library (`--no-default-features --features client`) has no aya, aya-log, aya-build, smoltcp
//!    or xdpilone (an application must not inherit xdpilone's EUPL-1.2 by linking the client), nor the
//!    metrics endpoint's prometheus-client, hyper, hyper-util or http-body-util (the client gains no
//!    dependencies).
//! 2. With bpf-linker hidden from `PATH` and a scratch target directory: xtask and the client-only library
//!    build on stable Rust; and the daemon's build fails with an error that names `cargo xtask setup` (which
//!    also proves that bpf-linker really was hidden).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// Crates that need bpf-linker or nightly to build (aya-build, and soft-rdma-user's build script that calls
/// it), or that belong to the daemon only (its XDP transport, its metrics endpoint's exposition and HTTP).
const DAEMON_ONLY: [&str; 10] = [
    "aya",
    "aya-log",
    "aya-build",
    "aya-obj",
    "smoltcp",
    "xdpilone",
    "prometheus-client",
    "hyper",
    "hyper-util",
    "http-body-util",
];

pub fn run() -> Result<()> {
    graphs_are_clean()?;
    builds_without_bpf_linker()?;
    println!(
        "✓ fresh-machine check: xtask and the client library need no bpf-linker, aya, smoltcp or xdpilone"
    );
    Ok(())
}

/// The crate names in `cargo tree` for `args` (normal and build dependencies, every feature as selected).
fn tree(args: &[&str]) -> Result<Vec<String>> {
    let out = crate::cargo()
        .args([
            "tree",
            "-e",
            "normal,build",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .context("cannot run cargo tree")?;
    if !out.status.success() {
        bail!("`cargo tree {}` failed", args.join(" "));
    }
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

/// The names in `graph` that `forbidden` lists.
fn offenders<'a>(graph: &'a [String], forbidden: &[&str]) -> Vec<&'a str> {
    graph
        .iter()
        .map(String::as_str)
        .filter(|n| forbidden.contains(n))
        .collect()
}

fn graphs_are_clean() -> Result<()> {
    let xtask = tree(&["-p", "xtask"])?;
    let mut forbidden = DAEMON_ONLY.to_vec();
    forbidden.push("soft-rdma-user");
    let bad = offenders(&xtask, &forbidden);
    if !bad.is_empty() {
        bail!(
            "fresh-machine check failed: xtask's build graph contains {}: on a machine without bpf-linker \
             `cargo xtask setup` could not even be built. Keep xtask's dependencies free of soft-rdma-user \
             (soft-rdma-tests with default-features = false).",
            bad.join(", ")
        );
    }
    println!(
        "✓ cargo tree -p xtask: {} crates, none of {}",
        xtask.len(),
        forbidden.join(", ")
    );
    let client = tree(&[
        "-p",
        "soft-rdma-user",
        "--no-default-features",
        "--features",
        "client",
    ])?;
    let bad = offenders(&client, &DAEMON_ONLY);
    if !bad.is_empty() {
        bail!(
            "fresh-machine check failed: the client-only library's graph contains {}; an application \
             linking `soft-rdma-user` with features = [\"client\"] would need the daemon's tool chain or \
             inherit its licences. Make those dependencies optional under the `daemon` feature.",
            bad.join(", ")
        );
    }
    println!(
        "✓ cargo tree -p soft-rdma-user --no-default-features --features client: {} crates, none of {}",
        client.len(),
        DAEMON_ONLY.join(", ")
    );
    Ok(())
}

/// `PATH` with bpf-linker taken out: each directory that holds it is replaced by a shadow directory of links
/// to everything else in it (cargo, rustc and rustup usually share `~/.cargo/bin` with it).
fn path_without_bpf_linker(shadow_root: &Path) -> Result<OsString> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = Vec::new();
    for (i, dir) in std::env::split_paths(&path).enumerate() {
        if !dir.join("bpf-linker").exists() {
            dirs.push(dir);
            continue;
        }
        let shadow = shadow_root.join(format!("path{i}"));
        std::fs::create_dir_all(&shadow)?;
        for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let entry = entry?;
            if entry.file_name() == "bpf-linker" {
                continue;
            }
            std::os::unix::fs::symlink(entry.path(), shadow.join(entry.file_name()))?;
        }
        dirs.push(shadow);
    }
    Ok(std::env::join_paths(dirs)?)
}

fn builds_without_bpf_linker() -> Result<()> {
    let scratch = std::env::temp_dir().join(format!("soft-rdma-fresh-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let result = builds_in(&scratch);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn builds_in(scratch: &Path) -> Result<()> {
    let path = path_without_bpf_linker(&scratch.join("shadow"))?;
    let hidden = Command::new("sh")
        .args(["-c", "command -v bpf-linker"])
        .env("PATH", &path)
        .stdout(Stdio::null())
        .status()?;
    if hidden.success() {
        bail!("fresh-machine check could not hide bpf-linker from PATH");
    }
    let target: PathBuf = scratch.join("target");
    let cargo = |args: &[&str]| {
        let mut c = crate::cargo();
        c.args(args)
            .env("PATH", &path)
            .env("CARGO_TARGET_DIR", &target)
            // Stable Rust, whatever toolchain runs xtask: nightly is the XDP program's business only.
            .env("RUSTUP_TOOLCHAIN", "stable");
        c
    };
    println!("… building xtask with bpf-linker hidden, in a scratch target directory");
    crate::run(&mut cargo(&["build", "--quiet", "-p", "xtask"])).context(
        "fresh-machine check failed: xtask does not build without bpf-linker, so `cargo xtask setup` \
         could not run on a fresh machine",
    )?;
    println!("✓ xtask builds without bpf-linker");
    println!("… building the client-only library with bpf-linker hidden");
    crate::run(&mut cargo(&[
        "build",
        "--quiet",
        "-p",
        "soft-rdma-user",
        "--no-default-features",
        "--features",
        "client",
        "--lib",
    ]))
    .context(
        "fresh-machine check failed: the client-only library does not build on stable without bpf-linker",
    )?;
    println!("✓ soft-rdma-user --no-default-features --features client builds without bpf-linker");
    // The daemon must fail here, and say how to fix it: that is what a new user sees before setup.
    println!("… building the daemon with bpf-linker hidden (must fail, naming `cargo xtask setup`)");
    let out = cargo(&["build", "--quiet", "-p", "soft-rdma-user", "--lib"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        bail!(
            "fresh-machine check failed: the daemon built with bpf-linker hidden, so the check hid nothing"
        );
    }
    if !stderr.contains("bpf-linker is not installed") || !stderr.contains("cargo xtask setup") {
        bail!(
            "fresh-machine check failed: without bpf-linker the daemon's build fails with an error that \
             does not name `cargo xtask setup`:\n{stderr}"
        );
    }
    println!(
        "✓ without bpf-linker the daemon's build stops with: bpf-linker is not installed … `cargo xtask setup`"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offenders_names_only_forbidden_crates() {
        let graph: Vec<String> = ["anyhow", "aya-build", "clap", "smoltcp"]
            .map(String::from)
            .into();
        assert_eq!(offenders(&graph, &DAEMON_ONLY), ["aya-build", "smoltcp"]);
        assert!(offenders(&graph[..1], &DAEMON_ONLY).is_empty());
    }

    #[test]
    fn shadow_path_hides_bpf_linker_and_keeps_the_rest() {
        let root = std::env::temp_dir().join(format!("soft-rdma-fresh-test-{}", std::process::id()));
        let bin = root.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("bpf-linker"), "").unwrap();
        std::fs::write(bin.join("cargo"), "").unwrap();
        // SAFETY: this test is the only one in xtask that reads or writes PATH.
        let old = std::env::var_os("PATH");
        unsafe { std::env::set_var("PATH", std::env::join_paths([&bin]).unwrap()) };
        let path = path_without_bpf_linker(&root.join("shadow"));
        match old {
            Some(p) => unsafe { std::env::set_var("PATH", p) },
            None => unsafe { std::env::remove_var("PATH") },
        }
        let dirs: Vec<PathBuf> = std::env::split_paths(&path.unwrap()).collect();
        assert_eq!(dirs.len(), 1);
        assert!(dirs[0].join("cargo").exists());
        assert!(!dirs[0].join("bpf-linker").exists());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
