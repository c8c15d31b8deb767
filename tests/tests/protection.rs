//! RDMA's protection model from the attacker's side (issue 40): `tests/c/protection.c`, plain rdma-core, a
//! target on B holding two protection domains (a read-write, a read-only, a deregistered and an
//! invalidatable region in each) and a client on A in each PD that tries what it must not get: the other
//! PD's region (Write and Read), a deregistered STag, an invalidated STag, a read-only region, a range past
//! the end, below the start and wrapping 2^64, and a bad lkey of its own. The target prints one verdict per
//! case (its bytes untouched, the connection ended by the refusal, the async event siw raises: QP_ACCESS_ERR
//! for a refused Write, QP_REQ_ERR for a refused Read); the clients print theirs for the cases they judge
//! (the Read got nothing; the bad lkey failed locally, flushed the rest and raised QP_FATAL), and fail on
//! any other event. The same program runs against kernel siw (docs/protection.md).
//!
//! The daemons' transports follow `$SOFT_RDMA_TEST_TRANSPORT` (`kernel`, `xdp`, `mixed`): `cargo xtask
//! test` runs the suite in all three. Needs root, the binaries, the library and a C compiler with the
//! rdma-core headers (`cargo xtask setup`).

use soft_rdma_tests::Side::{A, B};
use soft_rdma_tests::protection::{CASES, client_passed, target_passed};
use soft_rdma_tests::rdma_core::{Programs, compile_c};

#[test]
fn a_client_reaches_only_its_own_protection_domain_and_live_stags() {
    let p = Programs::start("prot");
    let exe = compile_c("protection", p.d.net.dir());
    let exe = exe.to_str().expect("UTF-8 path");
    let b = p.ip(B).to_string();
    let connections = (2 * CASES).to_string();
    let mut server = p.spawn(B, exe, &["server", "7480", &connections]);
    p.wait_listening(B, 7480, &mut server);
    let client0 = p.run(A, exe, &["client", &b, "7480", "0"]);
    let client1 = if client0.success() {
        Some(p.run(A, exe, &["client", &b, "7480", "1"]))
    } else {
        None
    };
    let ran_both = client1.as_ref().is_some_and(|c| c.success());
    let server = if ran_both {
        server.wait(soft_rdma_tests::rdma_core::DEADLINE)
    } else {
        let mut server = server;
        server.stop()
    };
    let client1 = client1.unwrap_or_else(|| panic!("client 0 failed:\n{client0}\n{server}"));
    assert!(
        ran_both && server.success(),
        "a program failed:\n{server}\n{client0}\n{client1}\n{}",
        daemon_logs(&p)
    );
    assert!(
        target_passed(&server),
        "one PASS verdict per case, {} in all: {server}",
        2 * CASES
    );
    for client in [&client0, &client1] {
        assert!(client_passed(client), "bad-lkey and other-pd-read PASS: {client}");
    }
    // What each side saw, for a run with --nocapture.
    println!("{server}\n{client0}\n{client1}");
    p.assert_in_force();
}

/// The end of each daemon's log, for a failure's message.
fn daemon_logs(p: &Programs) -> String {
    let mut out = String::new();
    for e in std::fs::read_dir(p.d.net.dir()).into_iter().flatten().flatten() {
        let path = e.path();
        if path.extension().is_some_and(|x| x == "log") {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(40)..].join("\n");
            out += &format!("--- {} ---\n{tail}\n", path.display());
        }
    }
    out
}
