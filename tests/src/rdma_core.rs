//! Debian's unmodified rdma-core programs (rping, ucmatose, cmtime, rdma_server/rdma_client, ibv_devinfo…)
//! on soft-rdma's drop-in `libibverbs.so.1`/`librdmacm.so.1`, between the two namespaces of a [`Daemons`]
//! pair.
//!
//! [`Programs`] starts the pair (its transports follow `$SOFT_RDMA_TEST_TRANSPORT`). A program runs in side A's
//! or B's namespace as `soft-rdma --uds <that side's socket> run -- PROGRAM ARGS…` ([`Programs::command`]),
//! either to completion ([`Programs::run`]) or in the background ([`Programs::spawn`], a [`Running`] that is
//! killed when dropped). Every wait is bounded: a program still running at its deadline is killed, and the
//! [`Outcome`] says so, with everything it printed, so a hang fails with the program's own words instead of
//! hanging the suite. [`compile_c`] builds a C test program against the system's rdma-core headers.

use std::fmt;
use std::io::Read;
use std::net::Ipv4Addr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::ends::{Daemons, Steering, assert_steered_as, expects_xdp, steering};
use crate::{Side, TestNet, cli_binary};

/// How long a program may run before the harness kills it. Not a performance bound: a program that has not
/// finished by then is hung (rping's 10 rounds of 64 KiB take well under a second).
pub const DEADLINE: Duration = Duration::from_secs(60);

/// Two namespaces with a soft-rdmad each (and a client-library session on each, for the daemons' status),
/// and the runtime those sessions live on.
pub struct Programs {
    /// Field order is drop order: the sessions and daemons before the runtime.
    pub d: Daemons,
    rt: tokio::runtime::Runtime,
    /// Steering counters when the pair started (`None` for a kernel-mode daemon).
    before: (Option<Steering>, Option<Steering>),
    /// This pair's turn on the machine (released last).
    _turn: Turn,
}

/// Pairs that may run beside others hold the machine shared; a pair whose program races itself holds it
/// alone ([`Programs::start_alone`]).
static MACHINE: std::sync::RwLock<()> = std::sync::RwLock::new(());

enum Turn {
    Shared(#[allow(dead_code)] std::sync::RwLockReadGuard<'static, ()>),
    Alone(#[allow(dead_code)] std::sync::RwLockWriteGuard<'static, ()>),
}

impl Programs {
    /// A fresh pair named after `tag`, beside the other tests' pairs.
    pub fn start(tag: &str) -> Programs {
        let turn = Turn::Shared(MACHINE.read().unwrap_or_else(|e| e.into_inner()));
        Self::start_with(tag, turn)
    }

    /// A fresh pair with the machine to itself, for perftest: its client connects its test queue pairs
    /// right after the exchange that tells the server to listen for them, with nothing in between to wait
    /// for (perftest's `create_rdma_cm_connection`), and its retry reuses the ids it has just destroyed.
    /// On this 2-core machine, with other pairs' daemons and programs competing for the CPU, the server now
    /// and then listens after the client's connect arrived (refused), as it would on any host that loaded.
    pub fn start_alone(tag: &str) -> Programs {
        let turn = Turn::Alone(MACHINE.write().unwrap_or_else(|e| e.into_inner()));
        Self::start_with(tag, turn)
    }

    fn start_with(tag: &str, turn: Turn) -> Programs {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let d = rt.block_on(Daemons::start(tag, &[], &[]));
        let before = rt.block_on(async { (steering(&d.a).await, steering(&d.b).await) });
        let p = Programs {
            d,
            rt,
            before,
            _turn: turn,
        };
        // As on a real host, the link is up before a program asks about it (ibv_devinfo's port, the GID of
        // the interface): the kernel's link watcher reports a new veth's carrier up to a second late.
        for side in [Side::A, Side::B] {
            p.wait_link_up(side);
        }
        p
    }

    /// Waits (10 s at most) until `side`'s veth has `operstate` `up`.
    fn wait_link_up(&self, side: Side) {
        let path = format!("/sys/class/net/{}/operstate", self.d.net.dev(side));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let out = self.d.net.command(side, "cat").arg(&path).output().expect("cat");
            let state = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            if state == "up" {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "side {side:?}'s veth is still {state:?} after 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `side`'s IPv4 address.
    pub fn ip(&self, side: Side) -> Ipv4Addr {
        self.d.net.ipv4(side)
    }

    /// `side`'s soft-rdmad socket.
    pub fn uds(&self, side: Side) -> &Path {
        match side {
            Side::A => self.d.da.uds_path(),
            Side::B => self.d.db.uds_path(),
        }
    }

    /// `program args…` in `side`'s namespace on soft-rdma's libraries: `ip netns exec NS soft-rdma --uds
    /// SOCK run -- stdbuf -oL -eL program args…`. `ip netns exec`, `soft-rdma run` and `stdbuf` all exec, so
    /// the child's pid is the program's. `stdbuf` (coreutils) makes its standard output line-buffered, as on
    /// a terminal: a hung program that the harness kills has still shown everything it printed.
    pub fn command(&self, side: Side, program: &str, args: &[&str]) -> Command {
        let mut c = self.d.net.command(side, cli_path().to_str().expect("UTF-8 path"));
        c.arg("--uds")
            .arg(self.uds(side))
            .args(["run", "--", "stdbuf", "-oL", "-eL", program])
            .args(args);
        c
    }

    /// soft-rdma's own CLI (`soft-rdma --uds SOCK args…`) in `side`'s namespace, on the client library.
    pub fn cli(&self, side: Side, args: &[&str]) -> Command {
        let mut c = self.d.net.command(side, cli_path().to_str().expect("UTF-8 path"));
        c.arg("--uds").arg(self.uds(side)).args(args);
        c
    }

    /// Runs `program args…` on `side` to completion, or kills it at [`DEADLINE`].
    pub fn run(&self, side: Side, program: &str, args: &[&str]) -> Outcome {
        self.spawn(side, program, args).wait(DEADLINE)
    }

    /// Starts `program args…` on `side` in the background.
    pub fn spawn(&self, side: Side, program: &str, args: &[&str]) -> Running {
        let what = format!("{} (side {side:?})", [&[program], args].concat().join(" "));
        Running::spawn(&what, self.command(side, program, args))
    }

    /// Waits until `side`'s daemon holds a listener on `port` (what a server program's `rdma_listen` makes),
    /// for [`DEADLINE`] at most; panics with the server's output if it exits or never listens.
    pub fn wait_listening(&self, side: Side, port: u16, server: &mut Running) {
        if !self.listens_or_exits(side, port, server) {
            let out = server.stop();
            panic!("no listener on port {port} in side {side:?}'s soft-rdmad:\n{out}");
        }
    }

    /// Waits until `side`'s daemon holds a listener on `port` (`true`), or the server exits or
    /// [`DEADLINE`] passes (`false`): for a server that may refuse its options before it listens.
    pub fn listens_or_exits(&self, side: Side, port: u16, server: &mut Running) -> bool {
        let adapter = match side {
            Side::A => &self.d.a,
            Side::B => &self.d.b,
        };
        let deadline = Instant::now() + DEADLINE;
        loop {
            let status = self.rt.block_on(adapter.status()).expect("daemon status");
            if status.listeners.iter().any(|l| l.local.port() == port) {
                return true;
            }
            if server.has_exited() || Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Asserts that each daemon's connections since the pair started went through the XDP program if the
    /// test transport puts it in XDP mode ([`crate::ends::assert_steered`]): call it once a program's
    /// connection crossed the wire.
    pub fn assert_in_force(&self) {
        self.rt.block_on(async {
            assert_steered_as(&self.d.a, expects_xdp(Side::A), "daemon A", self.before.0).await;
            assert_steered_as(&self.d.b, expects_xdp(Side::B), "daemon B", self.before.1).await;
        });
    }
}

/// The `soft-rdma` CLI, or a panic saying how to build it.
fn cli_path() -> PathBuf {
    cli_binary().unwrap_or_else(|e| panic!("{e:#}"))
}

/// A program running in the background; killed (SIGKILL) and reaped when dropped.
pub struct Running {
    what: String,
    child: Option<Child>,
    out: Arc<Mutex<Vec<u8>>>,
    err: Arc<Mutex<Vec<u8>>>,
    readers: Vec<JoinHandle<()>>,
}

/// Copies `from` into `to` until end of file, on a thread of its own.
fn collect(mut from: impl Read + Send + 'static, to: Arc<Mutex<Vec<u8>>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            to.lock().expect("output lock").extend_from_slice(&buf[..n]);
        }
    })
}

impl Running {
    /// Starts `cmd` (`what` in reports) with its output collected and no input.
    pub fn spawn(what: &str, mut cmd: Command) -> Running {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let (out, err) = (Arc::default(), Arc::default());
        let readers = vec![
            collect(child.stdout.take().expect("piped"), Arc::clone(&out)),
            collect(child.stderr.take().expect("piped"), Arc::clone(&err)),
        ];
        Running {
            what: what.to_owned(),
            child: Some(child),
            out,
            err,
            readers,
        }
    }

    /// The process id (the program's: every launcher in between execs).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the program has exited (it is not reaped away: [`Self::wait`] still reports its status).
    pub fn has_exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|c| c.try_wait().ok().flatten().is_some())
    }

    /// What it printed on standard output so far.
    pub fn stdout_so_far(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().expect("output lock")).into_owned()
    }

    /// Waits until its standard output has a line containing `needle` (for `timeout` at most); panics with
    /// everything it printed otherwise.
    pub fn wait_for_line(&mut self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.stdout_so_far().lines().any(|l| l.contains(needle)) {
            if self.has_exited() || Instant::now() > deadline {
                let out = self.stop();
                panic!("waited for a line with {needle:?}:\n{out}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for it to exit, for `timeout` from now at most, then kills it: its outcome.
    pub fn wait(mut self, timeout: Duration) -> Outcome {
        let deadline = Instant::now() + timeout;
        let mut child = self.child.take().expect("waited once");
        let (status, timed_out) = loop {
            match child.try_wait() {
                Ok(Some(s)) => break (Some(s), None),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = child.kill();
                    break (child.wait().ok(), Some(timeout));
                }
            }
        };
        self.finish(status, timed_out)
    }

    /// A server's outcome once its `client` finished: waited for ([`DEADLINE`]) if the client succeeded, else
    /// stopped at once (a server whose client failed may wait for it forever).
    pub fn wait_after(mut self, client: &Outcome) -> Outcome {
        if client.success() {
            self.wait(DEADLINE)
        } else {
            self.stop()
        }
    }

    /// Kills it now (SIGKILL) and returns its outcome so far: for a server whose client failed.
    pub fn stop(&mut self) -> Outcome {
        let Some(mut child) = self.child.take() else {
            return self.finish(None, None);
        };
        let status = match child.try_wait() {
            Ok(Some(s)) => Some(s),
            _ => {
                let _ = child.kill();
                child.wait().ok()
            }
        };
        self.finish(status, None)
    }

    fn finish(&mut self, status: Option<ExitStatus>, timed_out: Option<Duration>) -> Outcome {
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        let text =
            |b: &Arc<Mutex<Vec<u8>>>| String::from_utf8_lossy(&b.lock().expect("output lock")).into_owned();
        Outcome {
            what: self.what.clone(),
            status,
            timed_out,
            stdout: text(&self.out),
            stderr: text(&self.err),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// How a program ended and what it printed.
pub struct Outcome {
    pub what: String,
    /// `None` if it could not be reaped.
    pub status: Option<ExitStatus>,
    /// Set when the harness killed it at its deadline.
    pub timed_out: Option<Duration>,
    pub stdout: String,
    pub stderr: String,
}

impl Outcome {
    /// The outcome of a command that ran elsewhere and exited with `code`, having printed `output` (the siw
    /// VM's agent gives the exit status and standard output and error together; a command it killed at its
    /// timeout exits 137).
    pub fn exited(what: &str, code: i32, output: String) -> Outcome {
        Outcome {
            what: what.to_owned(),
            status: Some(ExitStatus::from_raw((code & 0xff) << 8)),
            timed_out: None,
            stdout: output,
            stderr: String::new(),
        }
    }

    /// Its exit code, if it exited (not killed by a signal).
    pub fn code(&self) -> Option<i32> {
        self.status.and_then(|s| s.code())
    }

    /// The signal that killed it, if one did and the harness did not.
    pub fn crash_signal(&self) -> Option<i32> {
        self.timed_out
            .is_none()
            .then(|| self.status.and_then(|s| s.signal()))
            .flatten()
    }

    /// Whether it exited 0 by itself.
    pub fn success(&self) -> bool {
        self.timed_out.is_none() && self.code() == Some(0)
    }

    /// Standard output, then standard error.
    pub fn text(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }

    /// The output with every run of white space made one space (ibv_devinfo aligns with tabs).
    pub fn words(&self) -> String {
        self.text().split_whitespace().collect::<Vec<_>>().join(" ")
    }

    /// Panics with the whole report unless it exited 0 by itself.
    #[track_caller]
    pub fn assert_success(&self) -> &Self {
        assert!(self.success(), "{self}");
        self
    }

    /// [`Self::assert_success`] for Debian's rping (rdma-core 44), which may lose its own teardown race
    /// once its connection ended: its main thread destroys the event channel while its CM thread goes back
    /// to `rdma_get_cm_event`, which fails (EINVAL on soft-rdma's librdmacm, EBADF on rdma-core's), and
    /// that thread exits 255 (fixed after v44: rdma-core f3ae6534a, "rping: terminate CM event thread
    /// before exiting"). Only that exit, after its DISCONNECT EVENT line, is taken, with a note; the data
    /// is judged by the other checks (the client's `-V` verification, its rounds).
    #[track_caller]
    pub fn assert_rping_success(&self) -> &Self {
        let lost_race = self.code() == Some(255)
            && self.stderr.contains("DISCONNECT EVENT")
            && self.stderr.contains("rdma_get_cm_event: Invalid argument");
        if lost_race {
            println!("NOTE: rping 44 lost its own teardown race after its connection ended: {self}");
            return self;
        }
        self.assert_success()
    }

    /// Panics with the whole report unless its output (stdout and stderr) contains `needle`.
    #[track_caller]
    pub fn assert_prints(&self, needle: &str) -> &Self {
        assert!(
            self.text().contains(needle),
            "expected {needle:?} in the output of {self}"
        );
        self
    }

    /// Panics unless [`Self::words`] contains `words` (its own white space made single spaces).
    #[track_caller]
    pub fn assert_words(&self, words: &str) -> &Self {
        let want = words.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            self.words().contains(&want),
            "expected {want:?} in the output of {self}"
        );
        self
    }

    /// The lines of standard output that contain `needle`.
    pub fn lines_with(&self, needle: &str) -> Vec<&str> {
        self.stdout.lines().filter(|l| l.contains(needle)).collect()
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}`: ", self.what)?;
        match (self.timed_out, self.status) {
            (Some(t), _) => write!(f, "still running after {} s: killed", t.as_secs())?,
            (None, None) => write!(f, "could not be waited for")?,
            (None, Some(s)) => match (s.code(), s.signal()) {
                (Some(c), _) => write!(f, "exited with status {c}")?,
                (_, Some(sig)) => write!(
                    f,
                    "killed by signal {sig}{}",
                    if s.core_dumped() { " (core dumped)" } else { "" }
                )?,
                _ => write!(f, "{s}")?,
            },
        }
        let cut = |s: &str| {
            // The last 8 KiB: rping -v at 64 KiB prints a lot, and the end says why it stopped.
            let start = s.len().saturating_sub(8 << 10);
            let start = (start..s.len())
                .find(|&i| s.is_char_boundary(i))
                .unwrap_or(s.len());
            format!("{}{}", if start > 0 { "…" } else { "" }, &s[start..])
        };
        write!(
            f,
            "\n--- stdout ---\n{}\n--- stderr ---\n{}\n--------------",
            cut(self.stdout.trim_end()),
            cut(self.stderr.trim_end())
        )
    }
}

/// Compiles the C test program `tests/c/<name>.c` with `cc` against the system's rdma-core headers, linked
/// with `-libverbs -lrdmacm` (the sonames soft-rdma's libraries answer to under `soft-rdma run`), into `dir`;
/// the executable's path. Panics with the compiler's output, and what to install, if it fails.
pub fn compile_c(name: &str, dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("c")
        .join(format!("{name}.c"));
    let exe = dir.join(name);
    let out = Command::new("cc")
        .args(["-Wall", "-Wextra", "-Werror", "-O1", "-g", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(["-libverbs", "-lrdmacm"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run cc: {e}; install a C compiler (Debian: gcc)"));
    assert!(
        out.status.success(),
        "cc {} failed (the headers and link names come from Debian's libibverbs-dev and librdmacm-dev: \
         `cargo xtask setup`):\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Waits until a TCP socket listens on `port` in `side`'s namespace of `net` (a program's own control
/// socket, before any RDMA listener), failing with `server`'s output if it exits first or after
/// [`DEADLINE`].
pub fn wait_tcp_listening(net: &TestNet, side: Side, port: u16, server: &mut Running) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let out = net
            .command(side, "ss")
            .args(["-Hltn", &format!("sport = :{port}")])
            .output()
            .expect("ss");
        if !String::from_utf8_lossy(&out.stdout).trim().is_empty() {
            return;
        }
        if server.has_exited() || Instant::now() > deadline {
            let out = server.stop();
            panic!("nothing listens on TCP port {port} in side {side:?}:\n{out}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
