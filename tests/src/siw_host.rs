//! What the siw interop suites share (`tests/tests/siw_interop.rs`, `tests/tests/siw_middleware.rs`): a
//! soft-rdmad beside the siw VM ([`Host`]) in either transport mode ([`Mode`]), the VM's rdma_cm peer, the
//! capture and XDP-steering checks every scenario ends with, Debian's programs on soft-rdma's drop-in
//! libraries on the host side ([`Host::rdma_core`]), and [`both_modes!`], which makes each scenario two tests.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use soft_rdma::client::{Adapter, QueuePair};

use crate::rdma_core::Running;
use crate::siw::{CaptureSummary, SiwVm, summarize};
use crate::{Daemon, cli_binary, daemon_binary};

pub async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within 60 s"))
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// soft-rdmad's transport in a scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Kernel,
    Xdp,
}

/// A soft-rdmad beside the VM and an adapter on it.
pub struct Host {
    pub vm: SiwVm,
    pub daemon: Daemon,
    pub adapter: Adapter,
    pub mode: Mode,
}

pub async fn host(tag: &str, siwopts: &str, daemon_args: &[&str], mode: Mode) -> Host {
    let vm = SiwVm::boot(tag, siwopts).unwrap_or_else(|e| {
        // On stdout too, where `cargo xtask interop` counts scenarios whose VM did not boot.
        println!("booting the siw VM: {e:#}");
        panic!("booting the siw VM: {e:#}")
    });
    let daemon = vm
        .spawn_daemon(mode == Mode::Xdp, daemon_args)
        .expect("soft-rdmad");
    let adapter = Adapter::open(daemon.uds_path()).await.expect("adapter");
    Host {
        vm,
        daemon,
        adapter,
        mode,
    }
}

impl Host {
    /// Starts `server` (its output kept for the end) and waits until it listens at `port` on the host.
    pub fn serve(&self, server: &mut Command, port: u16) -> std::process::Child {
        let child = server
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        self.wait_listener(port);
        child
    }

    /// Starts the VM's rdma_cm peer: `listen` on the VM's address or `connect` to the host's, at `port`, with
    /// `pd` (hex) as the value of `pd_option` (`--pd`, or `--reject` for a listener), then `more` options.
    pub fn cm_peer(
        &self,
        role: &str,
        port: u16,
        (pd_option, pd): (&str, &[u8]),
        more: &str,
    ) -> std::thread::JoinHandle<anyhow::Result<(i32, String)>> {
        let ip = if role == "listen" {
            self.vm.vm_ip()
        } else {
            self.vm.host_ip()
        };
        let cmd = format!("/sr/cm_peer {role} {ip} {port} {pd_option} {} {more}", hex(pd));
        self.vm.spawn(cmd.trim_end(), 60)
    }

    /// The result of a command started with `SiwVm::spawn`; when the agent gives none (the command outlived
    /// its timeout, or the VM stalled), the VM's processes and kernel log, for the failure message.
    pub fn joined(
        &self,
        what: &str,
        h: std::thread::JoinHandle<anyhow::Result<(i32, String)>>,
    ) -> (i32, String) {
        match h.join().expect("agent thread") {
            Ok(r) => r,
            Err(e) => {
                let diag = self
                    .vm
                    .run("ps; dmesg | tail -30", 20)
                    .map(|(_, o)| o)
                    .unwrap_or_else(|e| format!("(the VM does not answer either: {e:#})"));
                panic!(
                    "{what}: no answer from the VM's agent ({e:#})\n{diag}\nconsole:\n{}",
                    self.vm.console()
                );
            }
        }
    }

    pub fn vm_addr(&self, port: u16) -> SocketAddr {
        SocketAddr::from((self.vm.vm_ip(), port))
    }

    pub fn host_addr(&self, port: u16) -> SocketAddr {
        SocketAddr::from((self.vm.host_ip(), port))
    }

    /// A queue pair for a connection (siw's side always has one; ours routes RTRs to it).
    pub async fn qp(&self) -> QueuePair {
        let cq = self.adapter.create_completion_queue(16).await.unwrap();
        self.adapter.create_queue_pair(&cq, &cq, 4, 4).await.unwrap()
    }

    /// In XDP mode, that the scenario's traffic went through the XDP program: its counters (soft-rdmad's
    /// status) show frames steered to the daemon, MPA handshake frames and FPDUs. (The XDP daemon also has
    /// kernel sockets and falls back to them for local routes, so a silent fallback would otherwise pass.)
    pub async fn check_steering(&self, scenario: &str, fpdus: bool) {
        if self.mode != Mode::Xdp {
            return;
        }
        let st = self.adapter.status().await.expect("status");
        let t = st.transport.expect("the transport's status");
        assert_eq!(t.kind, "xdp", "{scenario}: {t:?}");
        let c = |name: &str| t.counters.iter().find(|(n, _)| n == name).map_or(0, |(_, v)| *v);
        println!("xdp counters {scenario}: {:?}", t.counters);
        assert!(
            c("redirected") > 0,
            "{scenario}: nothing steered: {:?}",
            t.counters
        );
        assert!(
            c("mpa_request") + c("mpa_reply") > 0,
            "{scenario}: no MPA handshake seen by the XDP program: {:?}",
            t.counters
        );
        if fpdus {
            assert!(
                c("tagged_fpdu") + c("untagged_fpdu") > 0,
                "{scenario}: no FPDU seen by the XDP program: {:?}",
                t.counters
            );
        }
        // The VM runs virtio-net with checksum offload on: its segments carry partial checksums, taken
        // on the daemon's veth, and none is dropped for its checksum (issue 34).
        assert!(
            c("tcp_partial_checksums_accepted") > 0,
            "{scenario}: no partial checksum from the offloading VM: {:?}",
            t.counters
        );
        for reason in ["tcp_dropped_bad_checksum", "tcp_dropped_partial_checksum"] {
            assert_eq!(c(reason), 0, "{scenario}: {reason}: {:?}", t.counters);
        }
    }

    /// Stops the capture and checks it: the handshake(s) present, nothing malformed, every CRC good.
    pub fn check_capture(&mut self, scenario: &str, requests: usize) -> CaptureSummary {
        let pcap = self.vm.stop_capture().expect("capture");
        let s = summarize(&pcap).expect("tshark");
        println!("capture {scenario} ({:?} mode): {s}", self.mode);
        assert_eq!(
            (s.mpa_requests, s.mpa_replies),
            (requests, requests),
            "{scenario}: MPA Requests/Replies in the capture ({s})"
        );
        assert_eq!(s.malformed, 0, "{scenario}: malformed frames ({s})");
        assert_eq!(s.crc_bad, 0, "{scenario}: bad CRCs ({s})");
        assert_eq!(s.expert_errors, 0, "{scenario}: tshark expert errors ({s})");
        s
    }

    /// The measurement behind soft-rdmad's first-FPDU hold, for the record (a figure, not a check): how long
    /// each of siw's accepts in this VM (without RTR: with one, siw waits for the RTR instead) left its
    /// socket off the data path after handing the Reply to TCP. Needs [`SiwVm::trace_siw_cm`] at the start;
    /// `accepts`: how many there were.
    pub fn print_accept_windows(&self, scenario: &str, accepts: usize) {
        let windows = self.vm.accept_windows_us().unwrap();
        assert_eq!(
            windows.len(),
            accepts,
            "{scenario}: siw's accepts in the trace: {windows:?}"
        );
        println!(
            "siw_accept window {scenario} ({:?} mode): {} accepts, max {} us, all {windows:?}",
            self.mode,
            windows.len(),
            windows.iter().max().unwrap()
        );
    }

    /// Waits until a listener on `port` shows in soft-rdmad's status (a server we started is ready), 30 s
    /// at most.
    pub fn wait_listener(&self, port: u16) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let out = self.cli().args(["status", "--json"]).output().unwrap();
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            let listening = v["listeners"].as_array().is_some_and(|ls| {
                ls.iter().any(|l| {
                    l["local"]
                        .as_str()
                        .is_some_and(|a| a.ends_with(&format!(":{port}")))
                })
            });
            if listening {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no listener on port {port} in soft-rdmad's status: {}",
                String::from_utf8_lossy(&out.stdout)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The soft-rdma CLI, talking to this daemon.
    pub fn cli(&self) -> Command {
        let bin = daemon_binary().unwrap().with_file_name("soft-rdma");
        let mut c = Command::new(bin);
        c.env("SOFT_RDMA_UDS", self.daemon.uds_path());
        c
    }
}

impl Host {
    /// Debian's `program args…` on the host, in the VM's host-side namespace, on soft-rdma's drop-in
    /// libraries (`soft-rdma run`) and this scenario's soft-rdmad; killed after [`DEADLINE`].
    pub fn rdma_core(&self, program: &str, args: &[&str]) -> Running {
        let mut c = Command::new("ip");
        // In the scenario's own directory: a program that crashes leaves its backtrace file there
        // (libfabric's `*.btr`), not in the checkout.
        c.current_dir(self.vm.dir());
        c.args(["netns", "exec", self.vm.ns()])
            .arg(cli_binary().unwrap())
            .arg("--uds")
            .arg(self.daemon.uds_path())
            // Line-buffered output (coreutils' stdbuf), so a program killed at its deadline has shown it.
            .args(["run", "--", "stdbuf", "-oL", "-eL", program])
            .args(args);
        Running::spawn(&format!("{program} {} (host, soft-rdma)", args.join(" ")), c)
    }
}

/// [`Host::wait_listener`], failing at once with the server's output if it exits first.
pub fn wait_listener_or_exit(h: &Host, port: u16, server: &mut Running) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        if server.has_exited() {
            panic!("the server exited before it listened: {}", server.stop());
        }
        let out = h.cli().args(["status", "--json"]).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let port = format!(":{port}");
        if v["listeners"].as_array().is_some_and(|ls| {
            ls.iter()
                .any(|l| l["local"].as_str().is_some_and(|a| a.ends_with(&port)))
        }) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no listener on port {port} after 30 s: {}", server.stop());
}

/// Switches siw's peer-to-peer mode (the parameter build's `peer_to_peer`, read at each connect).
pub fn siw_peer_to_peer(h: &Host, on: bool) {
    let (rc, out) =
        h.vm.run(
            &format!("echo {} > /sys/module/siw/parameters/peer_to_peer", u8::from(on)),
            10,
        )
        .unwrap();
    assert_eq!(rc, 0, "siw peer_to_peer={on}: {out}");
}

/// Each scenario as two tests: soft-rdmad in kernel-TCP mode and in XDP mode.
#[macro_export]
macro_rules! both_modes {
    ($scenario:ident, $kernel:ident, $xdp:ident) => {
        $crate::both_modes!(
            $scenario,
            $kernel,
            $xdp,
            ignore = "needs the siw VM image: run with `cargo xtask interop`"
        );
    };
    // A scenario `cargo xtask interop` does not run: `$why` says why, and how to run it.
    ($scenario:ident, $kernel:ident, $xdp:ident, ignore = $why:literal) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[ignore = $why]
        async fn $kernel() {
            $scenario($crate::siw_host::Mode::Kernel).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[ignore = $why]
        async fn $xdp() {
            $scenario($crate::siw_host::Mode::Xdp).await;
        }
    };
}
