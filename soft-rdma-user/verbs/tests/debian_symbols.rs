//! Debian's unmodified binaries bind to the library: every `IBVERBS_*`/`RDMACM_*` symbol they import (and
//! the provider libraries perftest links import) is defined at that version, the version nodes they need
//! exist, and the soname is `libibverbs.so.1` (`objdump -T`, `objdump -p`).
//!
//! Needs binutils and Debian's ibverbs-utils, rdmacm-utils, perftest and python3-pyverbs (`cargo xtask
//! setup`); without them the test fails and names the package.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// (binary, Debian package).
const PROGRAMS: &[(&str, &str)] = &[
    ("ibv_devices", "ibverbs-utils"),
    ("ibv_devinfo", "ibverbs-utils"),
    ("rping", "rdmacm-utils"),
    ("ucmatose", "rdmacm-utils"),
    ("rdma_server", "rdmacm-utils"),
    ("rdma_client", "rdmacm-utils"),
    ("cmtime", "rdmacm-utils"),
    ("ib_write_bw", "perftest"),
    ("ib_read_bw", "perftest"),
    ("ib_send_bw", "perftest"),
];

/// rdma-core's Python bindings (python3-pyverbs), whose extension modules Python loads with every symbol
/// bound at once (RTLD_NOW): one missing symbol and `import pyverbs` fails. Their provider modules
/// (`providers/mlx5`, `providers/efa`) are left out: they need mlx5dv/efadv from the vendors' libraries.
const PYVERBS: &str = "/usr/lib/python3/dist-packages/pyverbs";

/// Provider libraries perftest links for its direct-verbs calls (bound at load time).
const PROVIDERS: &[&str] = &[
    "/lib/x86_64-linux-gnu/libmlx5.so.1",
    "/lib/x86_64-linux-gnu/libefa.so.1",
];

fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let lib = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("libsoft_rdma_verbs.so");
    assert!(
        lib.exists(),
        "{} is missing: cargo build -p soft-rdma-verbs",
        lib.display()
    );
    lib
}

fn objdump(args: &[&str], file: &Path) -> String {
    let out = Command::new("objdump")
        .args(args)
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("cannot run objdump ({e}): install binutils"));
    assert!(
        out.status.success(),
        "objdump {args:?} {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `name@VERSION` of the dynamic symbols of `file` at rdma-core's versions: imported (`UND`) or defined.
fn versioned(file: &Path, imported: bool) -> BTreeSet<String> {
    objdump(&["-T"], file)
        .lines()
        .filter(|l| l.contains("IBVERBS") || l.contains("RDMACM"))
        .filter(|l| l.contains("*UND*") == imported)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (name, version) = (f.last()?, f.get(f.len().checked_sub(2)?)?);
            Some(format!(
                "{name}@{}",
                version.trim_matches(|c| c == '(' || c == ')')
            ))
        })
        .collect()
}

#[test]
fn debian_binaries_find_every_symbol_they_import() {
    let lib = library();
    let defined = versioned(&lib, false);
    let mut missing = Vec::new();
    for (program, package) in PROGRAMS {
        let path = Path::new("/usr/bin").join(program);
        assert!(
            path.exists(),
            "{} is missing: install Debian's {package} (cargo xtask setup)",
            path.display()
        );
        for sym in versioned(&path, true) {
            if !defined.contains(&sym) {
                missing.push(format!("{program}: {sym}"));
            }
        }
    }
    let modules = std::fs::read_dir(PYVERBS)
        .unwrap_or_else(|e| panic!("{PYVERBS}: {e}: install Debian's python3-pyverbs (cargo xtask setup)"));
    let mut seen = 0;
    for module in modules {
        let path = module.unwrap().path();
        if path.extension().is_some_and(|e| e == "so") {
            seen += 1;
            for sym in versioned(&path, true) {
                if !defined.contains(&sym) {
                    missing.push(format!("{}: {sym}", path.display()));
                }
            }
        }
    }
    assert!(
        seen > 10,
        "{PYVERBS} holds {seen} extension modules: is python3-pyverbs whole?"
    );
    for provider in PROVIDERS {
        let path = Path::new(provider);
        assert!(
            path.exists(),
            "{provider} is missing: install Debian's ibverbs-providers"
        );
        for sym in versioned(path, true) {
            if !defined.contains(&sym) {
                missing.push(format!("{provider}: {sym}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "symbols the library does not define:\n{}",
        missing.join("\n")
    );
    // The 1.1 versions of LATEST_SYMVER_FUNC's functions are the defaults.
    assert!(
        objdump(&["-T"], &lib)
            .lines()
            .any(|l| l.ends_with(" IBVERBS_1.1 ibv_get_device_list"))
    );
}

#[test]
fn soname_and_version_nodes() {
    let lib = library();
    let p = objdump(&["-p"], &lib);
    assert!(
        p.lines()
            .any(|l| l.split_whitespace().eq(["SONAME", "libibverbs.so.1"])),
        "{p}"
    );
    let mut nodes: Vec<String> = (0..=18).map(|i| format!("IBVERBS_1.{i}")).collect();
    nodes.extend((0..=5).map(|i| format!("RDMACM_1.{i}")));
    nodes.push("IBVERBS_PRIVATE_34".into());
    for node in nodes {
        assert!(
            p.lines()
                .any(|l| l.split_whitespace().last() == Some(node.as_str())),
            "version node {node} is not defined:\n{p}"
        );
    }
}
