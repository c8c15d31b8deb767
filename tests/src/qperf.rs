//! qperf 0.4.11 (Debian's `qperf`, rdma_cm: `-cm1`) on soft-rdma's drop-in libraries between the two
//! namespaces of a [`Programs`] pair: its server (`qperf`, no arguments) in B, listening on TCP
//! [`CONTROL_PORT`] for its control connection, and a client (`qperf -cm1 … B TEST…`) in A.
//!
//! qperf prints each test's name and then one figure line per measurement, `name = value unit`
//! (`src/qperf.c`); a test it cannot run ends with its own message and exit status 1 (qperf 0.4.11 prints
//! both on standard output). The server serves one client after another until it is stopped: it never exits
//! on its own, so the harness stops it (by pid, and the child it forked for the test first) once the client
//! is done, after checking it is still running.

use std::time::{Duration, Instant};

use crate::Side::{A, B};
use crate::rdma_core::{Outcome, Programs, Running};

/// The TCP port qperf's server listens on for its control connection (`qperf.c`, `ListenPort` 19765).
pub const CONTROL_PORT: u16 = 19765;

/// One client run against a server started for it.
pub struct Run {
    pub client: Outcome,
    /// The server's output; it was stopped by the harness after the client.
    pub server: Outcome,
    /// Whether the server was still running when the client had finished (it had not crashed or exited).
    pub server_alive: bool,
}

/// Starts qperf's server in B and waits (for [`crate::rdma_core::DEADLINE`] at most) until it listens on
/// [`CONTROL_PORT`].
pub fn start_server(p: &Programs) -> Running {
    let mut server = p.spawn(B, "qperf", &[]);
    let deadline = Instant::now() + crate::rdma_core::DEADLINE;
    loop {
        let out =
            p.d.net
                .command(B, "ss")
                .args(["-Hltn", &format!("sport = :{CONTROL_PORT}")])
                .output()
                .expect("ss");
        if !String::from_utf8_lossy(&out.stdout).trim().is_empty() {
            return server;
        }
        if server.has_exited() || Instant::now() > deadline {
            let out = server.stop();
            panic!("qperf's server never listened on TCP {CONTROL_PORT}:\n{out}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What qperf's client prints when its connect was refused (`cm_expect_event`): qperf 0.4.11's server sends
/// its port before it calls `rdma_listen` (`cm_open_server`), so a client quick enough connects to a port
/// nobody listens on yet, as on the kernel's rdma_cm (qperf fixed it after 0.4.11: 118a571, "Fix rdmacm
/// race").
pub const REFUSED: &str = "unexpected event from RDMA CM: Event rejected";

/// [`run_once`], up to [`TRIES`] times (saying so) while the client's connect is refused ([`REFUSED`]):
/// qperf's own race, once per test in the run; the last attempt is returned, refused or not.
pub fn run(p: &Programs, args: &[&str], tests: &[&str]) -> Run {
    let mut r = run_once(p, args, tests);
    for n in 1..TRIES {
        if r.client.success() || !r.client.text().contains(REFUSED) {
            break;
        }
        println!(
            "NOTE: connect {n} of {TRIES} was refused (qperf 0.4.11's listen race); running once more:\n{}",
            r.client
        );
        r = run_once(p, args, tests);
    }
    r
}

/// Attempts of [`run`]: each test in a run makes its own connection, each with the race.
pub const TRIES: u32 = 3;

/// `qperf -cm1 -t 1 -to 20 ARGS… B TESTS…` in A against a fresh server in B, the client bounded by
/// [`crate::rdma_core::DEADLINE`]; the server is stopped afterwards. `-to 20` (qperf's own timeout for each
/// exchange, 5 s by default) leaves room for a loaded 2-core machine; it bounds nothing the harness needs.
pub fn run_once(p: &Programs, args: &[&str], tests: &[&str]) -> Run {
    let mut server = start_server(p);
    let b = p.ip(B).to_string();
    let mut v = vec!["-cm1", "-t", "1", "-to", "20"];
    v.extend_from_slice(args);
    v.push(&b);
    v.extend_from_slice(tests);
    let client = p.run(A, "qperf", &v);
    let server_alive = !server.has_exited();
    // qperf's server forks a child per test (`server`, `src/qperf.c`) and waits for it: the children go
    // first, by pid, so that none outlives a server stopped mid-test.
    if let Some(pid) = server.pid() {
        for child in children(pid) {
            // SAFETY: a signal to a process id just read from /proc as the server's child.
            unsafe { libc::kill(child as libc::pid_t, libc::SIGKILL) };
        }
    }
    let server = server.stop();
    Run {
        client,
        server,
        server_alive,
    }
}

impl Run {
    /// The client exited 0, the server is still serving, and the client printed a figure line for each of
    /// `tests` (in order, each after its name line).
    pub fn assert_figures(&self, tests: &[&str]) -> &Self {
        assert!(
            self.client.success() && self.server_alive,
            "{}\n{}",
            self.client,
            self.server
        );
        let per_test = figures(&self.client.stdout);
        let names: Vec<&str> = per_test.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, tests, "the tests reported in\n{}", self.client);
        for (name, f) in &per_test {
            assert!(!f.is_empty(), "no figure for {name} in\n{}", self.client);
        }
        self
    }

    /// The client ended on its own (not killed at the deadline, no crash) with exit status 1 and one of
    /// `messages` (qperf's own words) in its output, and the server is still serving.
    pub fn assert_refused(&self, messages: &[&str]) -> &Self {
        assert_eq!(
            self.client.code(),
            Some(1),
            "qperf's client should fail with its own message:\n{}\n{}",
            self.client,
            self.server
        );
        let text = self.client.text();
        assert!(
            messages.iter().any(|m| text.contains(m)),
            "expected one of {messages:?} in the output of {}",
            self.client
        );
        assert!(self.server_alive, "the server exited:\n{}", self.server);
        self
    }
}

/// The process ids whose parent is `pid` (`/proc/PID/stat`, field 4).
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| {
            std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|stat| {
                // `pid (comm) state ppid …`: comm may hold spaces, so the fields after the last ')'.
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(pid)
            })
        })
        .collect()
}

/// Each test's name line (`rc_bw:`) with the figure lines after it (`bw = 1.2 GB/sec` as ("bw", 1.2)).
pub fn figures(stdout: &str) -> Vec<(String, Vec<(String, f64)>)> {
    let mut v: Vec<(String, Vec<(String, f64)>)> = Vec::new();
    for line in stdout.lines() {
        if let Some(name) = line.strip_suffix(':')
            && !name.starts_with(' ')
            && !name.contains(' ')
        {
            v.push((name.to_owned(), Vec::new()));
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let Some(number) = value
            .split_whitespace()
            .next()
            .and_then(|n| n.parse::<f64>().ok())
        else {
            continue;
        };
        if let Some((_, f)) = v.last_mut() {
            f.push((key.trim().to_owned(), number));
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_are_found_by_parent() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        assert!(children(std::process::id()).contains(&child.id()));
        let _ = child.kill();
        let _ = child.wait();
        assert!(!children(std::process::id()).contains(&child.id()));
    }

    #[test]
    fn figure_lines_follow_their_test() {
        let out =
            "rc_bw:\n    bw  =  1.17 GB/sec\nrc_lat:\n    latency  =  13.6 us\n    msg_rate  =  2 K/sec\n";
        let f = figures(out);
        assert_eq!(f.len(), 2);
        assert_eq!(f[0], ("rc_bw".to_owned(), vec![("bw".to_owned(), 1.17)]));
        assert_eq!(f[1].1.len(), 2);
        assert!(figures("rc_bw:\nfailed\n")[0].1.is_empty());
    }
}
