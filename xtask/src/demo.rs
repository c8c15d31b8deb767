//! `cargo xtask demo`: two namespaces, a daemon in each, the CLI's connection-management walk-through
//! (`soft-rdma demo`, which checks every result it prints), and a capture of its traffic on A's veth decoded by
//! an independent dissector (Wireshark's, via tshark). The capture is a check too: tshark must start and stop
//! cleanly, the iWARP frames must be there, each one a kind the dissector's fields name (MPA Request, Reply,
//! RTR), none malformed, every Request answered and every accepted connection completed by an RTR.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use soft_rdma_tests::capture::{IwarpFrame, IwarpKind, iwarp_frames, malformed_frames};
use soft_rdma_tests::{Side, TestNet};

use crate::{cargo, run as run_cmd};

/// What the capture shows, by kind.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub requests: usize,
    pub accepts: usize,
    pub rejects: usize,
    pub rtrs: usize,
}

/// The capture's checks: some MPA frames, none malformed, nothing but handshakes and RTRs (the demo moves no
/// data and disconnects in order), every Request answered, every accepted connection completed by its RTR.
pub fn check_capture(frames: &[IwarpFrame], malformed: &[u64]) -> Result<Tally> {
    ensure!(
        malformed.is_empty(),
        "malformed frames in the capture: {malformed:?}"
    );
    let mut t = Tally::default();
    for f in frames {
        match f.kind {
            IwarpKind::Request => t.requests += 1,
            IwarpKind::Reply { reject: false } => t.accepts += 1,
            IwarpKind::Reply { reject: true } => t.rejects += 1,
            IwarpKind::Rtr => t.rtrs += 1,
            other => bail!(
                "frame {} is a {other:?}: the demo sends none ({})",
                f.number,
                f.info
            ),
        }
    }
    ensure!(t.requests > 0, "no MPA frame in the capture: {t:?}");
    ensure!(
        t.requests == t.accepts + t.rejects,
        "not every MPA Request has its Reply: {t:?}"
    );
    ensure!(
        t.rtrs == t.accepts,
        "not every accepted connection sent its RTR: {t:?}"
    );
    Ok(t)
}

/// tshark capturing on `side`'s veth into `pcap`, started: it has said it captures.
struct Capture {
    child: std::process::Child,
    stderr: Arc<Mutex<String>>,
}

impl Capture {
    fn start(net: &TestNet, side: Side, pcap: &Path) -> Result<Capture> {
        let mut child = net
            .command(side, "tshark")
            .args(["-i", &net.dev(side), "-f", "tcp", "-w"])
            .arg(pcap)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting tshark (run `cargo xtask setup`)")?;
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let pipe = child.stderr.take().expect("piped");
        let text = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                // tshark says so once the capture runs (traffic before that would be missed).
                if line.contains("Capturing on") {
                    let _ = tx.send(());
                }
                let mut t = text.lock().unwrap_or_else(|e| e.into_inner());
                t.push_str(&line);
                t.push('\n');
            }
        });
        let mut c = Capture { child, stderr };
        if rx.recv_timeout(Duration::from_secs(20)).is_err() {
            let _ = c.child.kill();
            let _ = c.child.wait();
            bail!("tshark did not start capturing in 20 s:\n{}", c.stderr_text());
        }
        Ok(c)
    }

    fn stderr_text(&self) -> String {
        self.stderr.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// SIGINT (tshark writes out what it has and exits 0); its exit status is checked.
    fn stop(mut self) -> Result<()> {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGINT,
        );
        let status = self.child.wait()?;
        ensure!(
            status.success(),
            "tshark exited with {status}:\n{}",
            self.stderr_text()
        );
        Ok(())
    }
}

pub fn run(root: &Path) -> Result<()> {
    run_cmd(cargo().args(["build", "--workspace"]))?;
    let cli = root.join("target/debug/soft-rdma");
    println!("==> setting up two network namespaces joined by veth, with soft-rdmad in each");
    let net = TestNet::new("demo")?;
    println!(
        "    A: {} ({}, {})   B: {} ({}, {})",
        net.ns(Side::A),
        net.ipv4(Side::A),
        net.ipv6(Side::A),
        net.ns(Side::B),
        net.ipv4(Side::B),
        net.ipv6(Side::B)
    );
    let pcap = std::env::temp_dir().join("soft-rdma-demo.pcap");
    let _ = std::fs::remove_file(&pcap);
    let capture = Capture::start(&net, Side::A, &pcap)?;
    let da = net.spawn_daemon(Side::A, &[])?;
    let db = net.spawn_daemon(Side::B, &[])?;
    let outcome = run_cmd(
        Command::new(&cli)
            .arg("demo")
            .arg("--a-uds")
            .arg(da.uds_path())
            .arg("--b-uds")
            .arg(db.uds_path())
            .arg("--b-addr")
            .arg(net.ipv4(Side::B).to_string()),
    );
    if outcome.is_err() {
        eprintln!(
            "--- soft-rdmad A log ---\n{}\n--- soft-rdmad B log ---\n{}",
            da.log_text(),
            db.log_text()
        );
    }
    drop((da, db));
    // The daemons' last segments reach tshark's ring in the meantime (a grace, not a check).
    std::thread::sleep(Duration::from_millis(500));
    let stopped = capture.stop();
    drop(net);
    outcome?;
    stopped?;
    println!(
        "\n==> The demo's traffic on A's veth, decoded by an independent dissector (Wireshark's, via tshark):\n"
    );
    let frames = iwarp_frames(&pcap)?;
    for f in &frames {
        println!(
            "  {:>4}  {} → {}  {:?}  {}",
            f.number, f.src, f.dst, f.kind, f.info
        );
    }
    let malformed = malformed_frames(&pcap)?;
    let t = check_capture(&frames, &malformed)?;
    println!(
        "\n  {} MPA Requests, {} Replies ({} accepting, {} rejecting), {} RTRs; no malformed frame: checked",
        t.requests,
        t.accepts + t.rejects,
        t.accepts,
        t.rejects,
        t.rtrs
    );
    println!("  capture kept at {} (open it in Wireshark)", pcap.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(number: u64, kind: IwarpKind) -> IwarpFrame {
        IwarpFrame {
            number,
            src: "a".into(),
            dst: "b".into(),
            kind,
            info: String::new(),
        }
    }

    fn good() -> Vec<IwarpFrame> {
        vec![
            f(1, IwarpKind::Request),
            f(2, IwarpKind::Reply { reject: false }),
            f(3, IwarpKind::Rtr),
            f(4, IwarpKind::Request),
            f(5, IwarpKind::Reply { reject: true }),
        ]
    }

    #[test]
    fn a_good_capture_passes() {
        assert_eq!(
            check_capture(&good(), &[]).unwrap(),
            Tally {
                requests: 2,
                accepts: 1,
                rejects: 1,
                rtrs: 1
            }
        );
    }

    #[test]
    fn each_fault_fails() {
        assert!(check_capture(&good(), &[7]).is_err(), "a malformed frame");
        assert!(check_capture(&[], &[]).is_err(), "no MPA frame");
        let mut v = good();
        v.remove(1);
        assert!(check_capture(&v, &[]).is_err(), "a Request without its Reply");
        let mut v = good();
        v.remove(2);
        assert!(check_capture(&v, &[]).is_err(), "an accept without its RTR");
        let mut v = good();
        v.push(f(6, IwarpKind::Terminate));
        assert!(check_capture(&v, &[]).is_err(), "a Terminate");
        let mut v = good();
        v.push(f(6, IwarpKind::Data { opcode: 3 }));
        assert!(check_capture(&v, &[]).is_err(), "data");
    }
}
