//! rdma-core's own test suite on soft-rdma: the Python tests (pyverbs) that rdma-core's developers run
//! against every provider, as Debian's python3-pyverbs installs them in `/usr/share/doc/rdma-core/tests`,
//! unmodified, through `soft-rdma run` in a namespace with a soft-rdmad.
//!
//! Their runner is driven by `tests/python/rdma_core_suite.py`, which runs the suite as its `run_tests.py`
//! does and prints one line per test. The suite finds the device's network interface under
//! `/sys/class/infiniband/DEV/device/net/`, a kernel device's sysfs entry that soft-rdma's device has no
//! counterpart of; the program runs in a private mount namespace whose `/sys/class` shows just that entry
//! (the suite then asks `ip` for the interface's address). Nothing else is arranged for it.
//!
//! What is asserted:
//! The lists are in `soft_rdma_tests::rdma_core_suite`, shared with siw_interop's run of the suite on
//! Linux kernel siw, which checks them against siw's results.
//!
//! - every test in [`MUST_PASS`] passes: the device, port, GID, PD, MR, CQ and QP calls and rdma_cm's
//!   synchronous and asynchronous connections with Sends, RDMA Writes, RDMA Reads and a reject, each side
//!   in a child process of its own (the suite forks, which the library supports);
//! - no test fails or errs but those in [`IWARP_CANNOT`], each for the reason given there (on kernel siw,
//!   an iWARP device too, the same ones err: `siw_interop.rs`, `rdma_cores_own_test_suite_on_siw`);
//! - everything else skips (InfiniBand's and vendors' features, which the suite itself finds missing) or
//!   passes ([`MAY_PASS`]: tests whose random attributes sometimes ask for extended QPs).
//!
//! The daemons' transport follows `$SOFT_RDMA_TEST_TRANSPORT`. Needs root, the binaries, the library
//! (`cargo build -p soft-rdma-verbs`) and python3-pyverbs (`cargo xtask setup`).

use std::path::Path;
use std::time::Duration;

use soft_rdma_tests::Side::A;
use soft_rdma_tests::rdma_core::{Programs, Running};
use soft_rdma_tests::rdma_core_suite::{IWARP_CANNOT, MAY_PASS, MUST_PASS, results};

/// Where Debian's python3-pyverbs puts rdma-core's test suite (some files gzipped, as Debian's docs are).
const SUITE: &str = "/usr/share/doc/rdma-core/tests";

/// How long the whole suite may run before it is killed as hung (it takes about 20 s here).
const SUITE_DEADLINE: Duration = Duration::from_secs(600);

/// The suite, unpacked into `dir` (Debian gzips the larger files).
fn unpack_suite(dir: &Path) {
    let src = Path::new(SUITE);
    assert!(
        src.join("run_tests.py").exists(),
        "{SUITE}/run_tests.py is missing: install Debian's python3-pyverbs (`cargo xtask setup` does)"
    );
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        match name.strip_suffix(".gz") {
            Some(plain) => {
                let out = std::process::Command::new("gzip")
                    .args(["-dc"])
                    .arg(&path)
                    .output()
                    .expect("gzip");
                assert!(out.status.success(), "gzip -dc {}", path.display());
                std::fs::write(dir.join(plain), out.stdout).unwrap();
            }
            None if path.is_file() => {
                std::fs::copy(&path, dir.join(&name)).unwrap();
            }
            None => {}
        }
    }
}

#[test]
fn rdma_cores_own_test_suite_passes_what_an_iwarp_device_can() {
    let p = Programs::start_alone("rcts");
    let dir = p.d.net.dir().join("rdma-core-tests");
    std::fs::create_dir_all(&dir).unwrap();
    unpack_suite(&dir);
    let runner = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/rdma_core_suite.py");
    let dev = p.d.net.dev(A);
    // The one sysfs entry the suite reads (see the module's documentation), in a mount namespace of the
    // program's own; `ip netns exec` has already given it the namespace's /sys.
    let script = format!(
        "mount -t tmpfs soft-rdma-test /sys/class && mkdir -p /sys/class/infiniband/softrdma0/device/net/{dev} \
         && exec \"$@\""
    );
    let mut cmd = p.command(
        A,
        "unshare",
        &[
            "-m",
            "sh",
            "-c",
            &script,
            "sh",
            "/usr/bin/python3",
            runner.to_str().unwrap(),
            "--dev",
            "softrdma0",
            "--gid",
            "0",
        ],
    );
    cmd.current_dir(&dir);
    let out = Running::spawn("rdma-core's test suite", cmd).wait(SUITE_DEADLINE);
    let results = results(&out.stdout);
    assert!(
        results.len() > 200,
        "the suite ran {} tests (rdma-core 44 has 273): {out}",
        results.len()
    );
    let mut wrong = Vec::new();
    for id in MUST_PASS {
        if results.get(id) != Some(&"ok") {
            wrong.push(format!("{id}: {:?}, must pass", results.get(id)));
        }
    }
    for (id, outcome) in &results {
        let cannot = IWARP_CANNOT.iter().find(|(t, _)| t == id);
        match (*outcome, cannot) {
            ("ok", _) if MUST_PASS.contains(id) || MAY_PASS.contains(id) => {}
            ("ok", Some(_)) => wrong.push(format!("{id} passed: take it off IWARP_CANNOT, into MUST_PASS")),
            ("ok", None) => wrong.push(format!("{id} passed: add it to MUST_PASS")),
            ("skip", _) => {}
            ("fail" | "error", Some(_)) => {}
            (o, None) => wrong.push(format!(
                "{id}: {o}, and no reason says why an iWARP device cannot pass it"
            )),
            (o, Some(_)) => wrong.push(format!("{id}: unknown outcome {o}")),
        }
    }
    assert!(wrong.is_empty(), "{}\n\n{out}", wrong.join("\n"));
    let tally = |o: &str| results.values().filter(|v| **v == o).count();
    println!(
        "rdma-core's suite: {} passed, {} skipped, {} failed or erred (each for a reason iWARP gives)",
        tally("ok"),
        tally("skip"),
        tally("fail") + tally("error")
    );
}
