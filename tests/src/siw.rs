//! A Linux kernel siw peer for the interoperability suite: a qemu VM running Debian's 6.1 kernel with siw,
//! iw_cm, rdma_cm and rdma-core 44 (rping, rdma_server/rdma_client, `cm_peer`) and perftest 4.5, on a bridge
//! in a network namespace of its own, next to which a soft-rdmad runs.
//!
//! ```text
//! netns sr<id>: srhost0 10.98.<n>.1/24 ── veth ── srhostbr0 ┐
//!               soft-rdmad (kernel TCP, or XDP on srhost0)   bridge srbr0 ── tap srtap0 ── VM eth0 10.98.<n>.2,
//!                                                                             siw0 on it, agent on TCP 2323
//! ```
//!
//! soft-rdmad's side of the link is a veth of its own, so that in XDP mode its program sits on the interface
//! every frame to and from the VM crosses; the capture is taken on the tap (the VM's side), where frames
//! the daemon sends through AF_XDP are seen too.
//!
//! The image (`vmlinuz`, `initramfs.gz`) is built by `interop/build-image.sh` (`cargo xtask interop` runs it)
//! into `$SOFT_RDMA_SIW_IMAGE` (default `/var/tmp/soft-rdma-siw`). The VM runs under TCG (KVM does not work
//! on the machines this was written on; `SOFT_RDMA_SIW_ACCEL=kvm` tries it). Everything — VM, capture,
//! namespace — is torn down on drop.

use std::io::{BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::{Daemon, run_quiet, spawn_daemon_in, tshark};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// The VM's command agent port.
const AGENT_PORT: u16 = 2323;
const BRIDGE: &str = "srbr0";
const TAP: &str = "srtap0";
/// soft-rdmad's interface (the host address; `--xdp` attaches here).
pub const HOST_DEV: &str = "srhost0";
const HOST_DEV_PEER: &str = "srhostbr0";

/// Where the image is: `$SOFT_RDMA_SIW_IMAGE`, else `/var/tmp/soft-rdma-siw`.
pub fn image_dir() -> PathBuf {
    std::env::var_os("SOFT_RDMA_SIW_IMAGE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/soft-rdma-siw"))
}

/// One siw VM on its bridge.
pub struct SiwVm {
    ns: String,
    n: u8,
    dir: PathBuf,
    qemu_pid: Option<i32>,
    capture: Option<(Child, PathBuf)>,
}

impl SiwVm {
    /// Boots a VM whose siw is upstream's as built (`siwopts` empty) or the build with module parameters,
    /// loaded with `siwopts` (`mpa_crc_required=1,peer_to_peer=1`, ...). Waits until siw0 and the agent are up.
    pub fn boot(tag: &str, siwopts: &str) -> Result<SiwVm> {
        let image = image_dir();
        for f in ["vmlinuz", "initramfs.gz"] {
            ensure!(
                image.join(f).is_file(),
                "{} missing: build the siw image with `cargo xtask interop` (interop/build-image.sh)",
                image.join(f).display()
            );
        }
        let (ns, n, dir) = crate::fresh_name(&COUNTER, 17, ("sr", tag), "soft-rdma-siw")?;
        let mut vm = SiwVm {
            ns,
            n,
            dir,
            qemu_pid: None,
            capture: None,
        };
        let ns = vm.ns.clone();
        run_quiet(&["ip", "netns", "add", &ns])?;
        for cmd in [
            "link set lo up".to_owned(),
            format!("link add {BRIDGE} type bridge"),
            format!("link set {BRIDGE} type bridge stp_state 0 forward_delay 0"),
            format!("link set {BRIDGE} up"),
            format!("link add {HOST_DEV} type veth peer name {HOST_DEV_PEER}"),
            format!("link set {HOST_DEV_PEER} master {BRIDGE} up"),
            format!("addr add {}/24 dev {HOST_DEV}", vm.host_ip()),
            format!("link set {HOST_DEV} up"),
            format!("tuntap add dev {TAP} mode tap"),
            format!("link set {TAP} master {BRIDGE} up"),
        ] {
            let mut args = vec!["ip", "-n", &ns];
            args.extend(cmd.split_whitespace());
            run_quiet(&args)?;
        }
        let accel = match std::env::var("SOFT_RDMA_SIW_ACCEL").as_deref() {
            Ok("kvm") => "-accel kvm -cpu host",
            _ => "-accel tcg,thread=multi -cpu max",
        };
        let console = vm.dir.join("console.log");
        let pidfile = vm.dir.join("qemu.pid");
        let mut append = format!("console=ttyS0 quiet panic=-1 sr.ip={}/24", vm.vm_ip());
        if !siwopts.is_empty() {
            append.push_str(&format!(" sr.siwopts={siwopts}"));
        }
        let out = Command::new("ip")
            .args(["netns", "exec", &ns, "qemu-system-x86_64"])
            .args(["-name", &format!("soft-rdma-siw-{ns}")])
            .args(accel.split(' '))
            .args([
                "-m",
                "768",
                "-smp",
                "2",
                "-nodefaults",
                "-no-user-config",
                "-display",
                "none",
            ])
            .args(["-no-reboot", "-serial"])
            .arg(format!("file:{}", console.display()))
            .args([
                "-netdev",
                &format!("tap,id=n0,ifname={TAP},script=no,downscript=no"),
            ])
            // virtio-net with its defaults, as users run VMs: checksum offload and TSO on, so the guest's
            // segments reach the tap with only the pseudo-header sum in their checksum field
            // (CHECKSUM_PARTIAL) and as GSO packets; soft-rdmad's XDP transport takes them on its veth
            // (docs/xdp-mode.md, "Peers that offload TX checksums").
            .args([
                "-device",
                &format!("virtio-net-pci,netdev=n0,mac=52:54:00:98:{:02x}:02", vm.n),
            ])
            .arg("-kernel")
            .arg(image.join("vmlinuz"))
            .arg("-initrd")
            .arg(image.join("initramfs.gz"))
            .args(["-append", &append])
            .arg("-pidfile")
            .arg(&pidfile)
            .arg("-daemonize")
            .output()
            .context("starting qemu-system-x86_64 (install it with `cargo xtask interop`)")?;
        ensure!(
            out.status.success(),
            "qemu failed to start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        vm.qemu_pid = Some(std::fs::read_to_string(&pidfile)?.trim().parse()?);
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let text = std::fs::read_to_string(&console).unwrap_or_default();
            if let Some(line) = text.lines().find(|l| l.contains("SR-ERROR")) {
                bail!("the siw VM failed to set up: {line}\n{}", tail(&text));
            }
            if text.contains("SR-READY") {
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "the siw VM was not ready in 180 s:\n{}",
                tail(&text)
            );
            ensure!(vm.qemu_alive(), "qemu exited during boot:\n{}", tail(&text));
            std::thread::sleep(Duration::from_millis(200));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while vm.run("true", 10).is_err() {
            ensure!(Instant::now() < deadline, "the siw VM's agent does not answer");
            std::thread::sleep(Duration::from_millis(300));
        }
        Ok(vm)
    }

    fn qemu_alive(&self) -> bool {
        self.qemu_pid
            .is_some_and(|p| Path::new(&format!("/proc/{p}")).exists())
    }

    pub fn ns(&self) -> &str {
        &self.ns
    }

    /// This side's address on the bridge (where soft-rdmad's connections come from and listen).
    pub fn host_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 98, self.n, 1)
    }

    /// The VM's address (siw0's netdev).
    pub fn vm_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 98, self.n, 2)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The VM's console (kernel messages, SR-READY).
    pub fn console(&self) -> String {
        std::fs::read_to_string(self.dir.join("console.log")).unwrap_or_default()
    }

    /// Runs a shell command in the VM (as root, through the agent) and returns its exit status and output.
    pub fn run(&self, cmd: &str, timeout_secs: u32) -> Result<(i32, String)> {
        let addr = SocketAddr::from((self.vm_ip(), AGENT_PORT));
        let request = format!("{timeout_secs} {}\n", base64(cmd.as_bytes()));
        let path = format!("/run/netns/{}", self.ns);
        std::thread::spawn(move || -> Result<(i32, String)> {
            let fd = std::fs::File::open(&path)?;
            nix::sched::setns(fd, nix::sched::CloneFlags::CLONE_NEWNET)?;
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
            s.set_read_timeout(Some(Duration::from_secs(u64::from(timeout_secs) + 15)))?;
            s.write_all(request.as_bytes())?;
            let mut out = String::new();
            BufReader::new(s).read_to_string(&mut out)?;
            let Some(at) = out.rfind("\nSR-EXIT ") else {
                bail!("the agent's answer has no exit status: {out}");
            };
            let status = out[at + 9..].trim().parse()?;
            out.truncate(at);
            Ok((status, out))
        })
        .join()
        .expect("agent thread panicked")
    }

    /// [`Self::run`] on a thread: for servers in the VM while the test drives soft-rdma.
    pub fn spawn(&self, cmd: &str, timeout_secs: u32) -> std::thread::JoinHandle<Result<(i32, String)>> {
        let me = SiwVmRef {
            ns: self.ns.clone(),
            n: self.n,
        };
        let cmd = cmd.to_owned();
        std::thread::spawn(move || me.vm().run(&cmd, timeout_secs))
    }

    /// Waits until something in the VM listens on TCP `port` (busybox netstat), 30 s at most.
    pub fn wait_listening(&self, port: u16) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (_, out) = self.run("netstat -ltn", 10)?;
            if out.lines().any(|l| l.contains(&format!(":{port} "))) {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "nothing listens on port {port} in the VM:\n{out}"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// Puts two kprobes on siw's connection manager (ftrace), so that [`Self::accept_windows_us`] can time
    /// siw_accept(): the return of siw_send_mpareqrep() (the Reply handed to TCP) and the entry of
    /// siw_cm_upcall() (with its reason).
    pub fn trace_siw_cm(&self) -> Result<()> {
        let (rc, out) = self.run(
            "set -e; T=/sys/kernel/tracing; [ -f $T/kprobe_events ] || mount -t tracefs nodev $T; \
             echo 'r:sr_reply_sent siw_send_mpareqrep' >> $T/kprobe_events; \
             echo 'p:sr_upcall siw_cm_upcall reason=%si:s32' >> $T/kprobe_events; \
             echo 1 > $T/events/kprobes/enable; echo 1 > $T/tracing_on",
            10,
        )?;
        ensure!(rc == 0, "kprobes on siw's connection manager: {out}");
        Ok(())
    }

    /// For every connection siw accepted without RTR since [`Self::trace_siw_cm`]: how long, in µs, siw
    /// left its socket off the data path after handing the MPA Reply to TCP — from siw_send_mpareqrep()
    /// returning into siw_accept() to the ESTABLISHED upcall right after siw_qp_socket_assoc(), on the same
    /// thread. A first FPDU arriving inside that window is the one siw 6.1 misses
    /// (`soft_rdma::engine::first_fpdu`).
    pub fn accept_windows_us(&self) -> Result<Vec<u64>> {
        let (_, trace) = self.run("cat /sys/kernel/tracing/trace", 10)?;
        Ok(accept_windows_us(&trace))
    }

    /// Starts soft-rdmad in the namespace: kernel TCP, or (`xdp`) steering its flows through XDP/AF_XDP on
    /// [`HOST_DEV`].
    pub fn spawn_daemon(&self, xdp: bool, extra: &[&str]) -> Result<Daemon> {
        let mut args: Vec<&str> = if xdp { vec!["--xdp", HOST_DEV] } else { vec![] };
        args.extend_from_slice(extra);
        spawn_daemon_in(&self.ns, &self.dir, "soft-rdmad", &args)
    }

    /// Starts tshark on the VM's tap (the agent's port left out); [`Self::stop_capture`] returns the file.
    pub fn start_capture(&mut self, name: &str) -> Result<()> {
        let file = self.dir.join(format!("{name}.pcapng"));
        let log = self.dir.join(format!("{name}.tshark.log"));
        // A 64 MiB capture buffer (dumpcap's default is 2 MiB): perftest's bandwidth runs put megabytes on
        // the tap in well under a second, and a frame the capture drops leaves the dissector reading FPDUs
        // out of payload bytes (a kernel-mode run under load once counted 2,600 fewer Read Responses than
        // were sent, and Terminates and unknown opcodes that were not: its frames missing from the capture,
        // most likely dropped by it; the run itself passed).
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns, "tshark", "-i", TAP, "-q", "-B", "64"])
            .args(["-f", &format!("tcp and not port {AGENT_PORT}"), "-w"])
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            // A process group of its own, so that a failed scenario's drop stops tshark's dumpcap with it
            // (killing tshark alone leaves dumpcap capturing, orphaned).
            .process_group(0)
            .spawn()
            .context("starting tshark")?;
        self.capture = Some((child, file));
        let deadline = Instant::now() + Duration::from_secs(20);
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("Capturing on")
        {
            ensure!(Instant::now() < deadline, "tshark did not start capturing");
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// Stops the capture (after a moment for the last segments) and returns the pcapng's path.
    pub fn stop_capture(&mut self) -> Result<PathBuf> {
        let (mut child, file) = self.capture.take().context("no capture running")?;
        std::thread::sleep(Duration::from_millis(500));
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGINT,
        );
        child.wait()?;
        Ok(file)
    }
}

/// What the VM's agent needs to be reached from another thread.
struct SiwVmRef {
    ns: String,
    n: u8,
}

impl SiwVmRef {
    /// A non-owning view (nothing is torn down when it goes).
    fn vm(&self) -> std::mem::ManuallyDrop<SiwVm> {
        std::mem::ManuallyDrop::new(SiwVm {
            ns: self.ns.clone(),
            n: self.n,
            dir: PathBuf::new(),
            qemu_pid: None,
            capture: None,
        })
    }
}

impl Drop for SiwVm {
    fn drop(&mut self) {
        if let Some((mut child, _)) = self.capture.take() {
            // tshark and its dumpcap: the group start_capture made.
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = child.wait();
        }
        if let Some(pid) = self.qemu_pid.take() {
            let pid = nix::unistd::Pid::from_raw(pid);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            let deadline = Instant::now() + Duration::from_secs(5);
            while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
        if std::thread::panicking() || std::env::var_os("SOFT_RDMA_KEEP_CAPTURES").is_some() {
            eprintln!(
                "siw VM {}: captures, console and daemon log kept in {}",
                self.ns,
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// An ftrace line's task (`comm-pid`), timestamp in µs and event name:
/// `  rping-123  [001] d....  12.345678: sr_upcall: (siw_cm_upcall+0x0/0x170 [siw]) reason=3`.
fn trace_event(line: &str) -> Option<(&str, u64, &str)> {
    let task = line.split_whitespace().next()?;
    let mut words = line.split_whitespace();
    let stamp = words.find(|w| {
        w.ends_with(':')
            && w.trim_end_matches(':').split_once('.').is_some_and(|(a, b)| {
                !a.is_empty()
                    && a.bytes().all(|c| c.is_ascii_digit())
                    && b.len() == 6
                    && b.bytes().all(|c| c.is_ascii_digit())
            })
    })?;
    let (sec, frac) = stamp.trim_end_matches(':').split_once('.')?;
    let us = sec.parse::<u64>().ok()? * 1_000_000 + frac.parse::<u64>().ok()?;
    let event = words.next()?.trim_end_matches(':');
    Some((task, us, event))
}

/// [`SiwVm::accept_windows_us`] on an ftrace buffer.
fn accept_windows_us(trace: &str) -> Vec<u64> {
    let mut open: Vec<(&str, u64)> = Vec::new();
    let mut windows = Vec::new();
    for line in trace.lines() {
        let Some((task, t, event)) = trace_event(line) else {
            continue;
        };
        if event == "sr_reply_sent" && line.contains("(siw_accept+") {
            open.push((task, t));
        } else if event == "sr_upcall" && line.contains("reason=3") {
            // IW_CM_EVENT_ESTABLISHED (3), on the thread that sent the Reply.
            if let Some(i) = open.iter().position(|(k, _)| *k == task) {
                windows.push(t.saturating_sub(open.remove(i).1));
            }
        }
    }
    windows
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(25)..].join("\n")
}

fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let v = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[(v >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// What tshark saw in a capture: iWARP frames by type, and the problems it flagged.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CaptureSummary {
    pub mpa_requests: usize,
    pub mpa_replies: usize,
    /// FPDUs by RDMAP opcode name (`Send`, `RDMA Write`, `Read Request`, ...).
    pub fpdus: std::collections::BTreeMap<String, usize>,
    /// FPDUs whose MPA CRC tshark checked and found good / bad.
    pub crc_good: usize,
    pub crc_bad: usize,
    /// Frames tshark calls malformed (or with an MPA length it cannot account for).
    pub malformed: usize,
    /// Expert-info errors tshark reported.
    pub expert_errors: usize,
}

impl std::fmt::Display for CaptureSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MPA Request {}, MPA Reply {}",
            self.mpa_requests, self.mpa_replies
        )?;
        for (k, v) in &self.fpdus {
            write!(f, ", {k} {v}")?;
        }
        write!(
            f,
            "; CRC good {} bad {}; malformed {}; expert errors {}",
            self.crc_good, self.crc_bad, self.malformed, self.expert_errors
        )
    }
}

/// RFC 5040 §4.8 opcode names.
fn opcode_name(op: u32) -> String {
    match op {
        0 => "RDMA Write".into(),
        1 => "Read Request".into(),
        2 => "Read Response".into(),
        3 => "Send".into(),
        4 => "Send with Invalidate".into(),
        5 => "Send with SE".into(),
        6 => "Send with SE and Invalidate".into(),
        7 => "Terminate".into(),
        n => format!("opcode {n}"),
    }
}

/// The line that separates a command's standard output from its standard error in [`apart`]'s answer.
const STDERR_MARK: &str = "SR-STDERR";

/// `cmd` (one simple command) as a shell line for [`SiwVm::run`] or [`SiwVm::spawn`] that keeps its standard
/// error apart from its output (the agent merges the two, and a program's buffered output then interleaves
/// with its unbuffered errors, even within a line) and writes its pid to `/tmp/sr-<name>.pid` (so it can be
/// killed); [`apart_outcome`] splits the answer. The exit status is the command's.
pub fn apart(cmd: &str, name: &str) -> String {
    format!(
        "{cmd} 2>/tmp/sr-{name}.err & echo $! > /tmp/sr-{name}.pid; wait $!; rc=$?; \
         printf '\\n{STDERR_MARK}\\n'; cat /tmp/sr-{name}.err; exit $rc"
    )
}

/// The [`crate::rdma_core::Outcome`] of an [`apart`] command from the agent's answer (`what` in reports).
#[cfg(feature = "client")]
pub fn apart_outcome(what: &str, (code, answer): (i32, String)) -> crate::rdma_core::Outcome {
    let mut o = crate::rdma_core::Outcome::exited(what, code, answer);
    let mark = format!("\n{STDERR_MARK}\n");
    if let Some(at) = o.stdout.rfind(&mark) {
        o.stderr = o.stdout[at + mark.len()..].to_owned();
        o.stdout.truncate(at);
    }
    o
}

/// Decodes a capture with Wireshark's `iwarp_mpa` / `iwarp_ddp_rdmap` dissectors.
pub fn summarize(pcap: &Path) -> Result<CaptureSummary> {
    let mut s = CaptureSummary::default();
    let rows = tshark(
        pcap,
        &[
            "-Y",
            "iwarp_mpa",
            "-T",
            "fields",
            "-E",
            "separator=;",
            "-e",
            "iwarp_mpa.key.req",
            "-e",
            "iwarp_mpa.key.rep",
            "-e",
            "iwarp_rdma.opcode",
        ],
    )?;
    for row in rows.lines() {
        let cols: Vec<&str> = row.split(';').collect();
        if cols.first().is_some_and(|c| !c.is_empty()) {
            s.mpa_requests += 1;
        }
        if cols.get(1).is_some_and(|c| !c.is_empty()) {
            s.mpa_replies += 1;
        }
        for op in cols.get(2).unwrap_or(&"").split(',').filter(|o| !o.is_empty()) {
            let op = u32::from_str_radix(op.trim_start_matches("0x"), 16).unwrap_or(u32::MAX);
            *s.fpdus.entry(opcode_name(op)).or_default() += 1;
        }
    }
    // tshark verifies every CRC it sees and says so in the decode tree.
    let tree = tshark(pcap, &["-Y", "iwarp_mpa", "-V"])?;
    s.crc_good = tree.matches("Good CRC32").count();
    s.crc_bad = tree.matches("Bad CRC32").count();
    s.malformed = crate::capture::malformed_or_bad_length_frames(pcap)?.len();
    let expert = tshark(pcap, &["-q", "-z", "expert,error"])?;
    s.expert_errors = expert
        .lines()
        .skip_while(|l| !l.starts_with("Errors"))
        .skip(1)
        .take_while(|l| !l.starts_with("Warns") && !l.starts_with("====="))
        .filter(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|f| f.parse::<u32>().is_ok())
        })
        .count();
    Ok(s)
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_matches_rfc_4648_vectors() {
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(super::base64(i.as_bytes()), o);
        }
    }

    #[test]
    fn accept_windows_from_an_ftrace_buffer() {
        let trace = "\
# tracer: nop
#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION
           rping-201     [001] d....    10.000100: sr_reply_sent: (siw_accept+0x2f3/0x590 [siw] <- siw_send_mpareqrep)
       cm_peer-305     [000] d....    10.000150: sr_reply_sent: (siw_accept+0x2f3/0x590 [siw] <- siw_send_mpareqrep)
     kworker/0:1-40      [000] .....    10.000160: sr_upcall: (siw_cm_upcall+0x0/0x170 [siw]) reason=1
           rping-201     [001] .....    10.000350: sr_upcall: (siw_cm_upcall+0x0/0x170 [siw]) reason=3
       cm_peer-305     [000] .....    10.001150: sr_upcall: (siw_cm_upcall+0x0/0x170 [siw]) reason=3
     kworker/1:2-77      [001] d....    10.002000: sr_reply_sent: (siw_reject+0x40/0x90 [siw] <- siw_send_mpareqrep)
     kworker/1:2-77      [001] .....    10.002100: sr_upcall: (siw_cm_upcall+0x0/0x170 [siw]) reason=3";
        assert_eq!(super::accept_windows_us(trace), vec![250, 1000]);
    }

    #[cfg(feature = "client")]
    #[test]
    fn apart_splits_output_from_errors() {
        let line = super::apart("ib_send_bw -R 10.0.0.1", "p1");
        assert!(line.starts_with("ib_send_bw -R 10.0.0.1 2>/tmp/sr-p1.err & echo $! > /tmp/sr-p1.pid;"));
        let o = super::apart_outcome("x", (1, " 64 200 1.0 2.0\nSR-STDERR\n Bad wc status 2\n".into()));
        assert_eq!(o.stdout, " 64 200 1.0 2.0");
        assert_eq!(o.stderr, " Bad wc status 2\n");
        assert_eq!(o.code(), Some(1));
        // An answer without the marker (the command never got that far) is all output.
        let o = super::apart_outcome("x", (137, "Killed".into()));
        assert_eq!((o.stdout.as_str(), o.stderr.as_str()), ("Killed", ""));
    }

    #[test]
    fn opcode_names() {
        assert_eq!(super::opcode_name(3), "Send");
        assert_eq!(super::opcode_name(7), "Terminate");
        assert_eq!(super::opcode_name(9), "opcode 9");
    }
}
