//! fio 3.33's `ioengine=rdma` (Debian's `fio`, `engines/rdma.c`) on soft-rdma's drop-in libraries between
//! the two namespaces of a [`Programs`] pair: its server (`--rw=read`, listening with `rdma_listen`) in B and
//! its client (`--rw=write`, `--hostname` B) in A, each a single job with `--thread` (the job stays in the
//! program's process, whose pid the harness stops on every exit path).
//!
//! The roles are fio's (`fio_rdmaio_setup_listen`, `fio_rdmaio_setup_connect`): the client names the verb
//! (`--verb=write`, `read` or `send`) and posts the work requests; the server learns the verb from the
//! client's first message. fio's job summary line says `err= 0` when the job ended without an error
//! (`stat.c`, `show_thread_status_normal`); the tests assert on it and on exit codes, never on figures.

use crate::Side::{A, B};
use crate::rdma_core::{DEADLINE, Outcome, Programs};

/// Both ends of one fio run.
pub struct Pair {
    pub client: Outcome,
    pub server: Outcome,
}

/// fio's options for one end: a job named after the `role`, `ioengine=rdma`, `--thread`, and `extra`.
pub fn options(role: &str, port: u16, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [
        format!("--name={role}"),
        "--ioengine=rdma".to_owned(),
        "--thread".to_owned(),
        format!("--port={port}"),
    ]
    .into_iter()
    .collect();
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// The server (`--rw=read`, `server` options) in B, then, once it listens on `port`, the client
/// (`--rw=write --hostname=B --verb=VERB`, `client` options) in A; both bounded by [`DEADLINE`].
pub fn run(p: &Programs, port: u16, verb: &str, server: &[&str], client: &[&str]) -> Pair {
    let mut s_args = options("server", port, &["--rw=read"]);
    s_args.extend(server.iter().map(|s| s.to_string()));
    let s_args: Vec<&str> = s_args.iter().map(String::as_str).collect();
    let mut srv = p.spawn(B, "fio", &s_args);
    p.wait_listening(B, port, &mut srv);
    let host = format!("--hostname={}", p.ip(B));
    let verb = format!("--verb={verb}");
    let mut c_args = options("client", port, &["--rw=write", &host, &verb]);
    c_args.extend(client.iter().map(|s| s.to_string()));
    let c_args: Vec<&str> = c_args.iter().map(String::as_str).collect();
    let client = p.run(A, "fio", &c_args);
    let server = srv.wait(DEADLINE);
    Pair { client, server }
}

impl Pair {
    /// Both ends exited 0 and each job's summary says `err= 0`.
    pub fn assert_success(&self) -> &Self {
        for (end, o) in [("client", &self.client), ("server", &self.server)] {
            assert!(
                o.success(),
                "fio's {end} failed:\n{}\n{}",
                self.client,
                self.server
            );
            assert!(
                job_errors(&o.stdout) == [0],
                "fio's {end} should report one job with err= 0:\n{}\n{}",
                self.client,
                self.server
            );
        }
        self
    }
}

/// The `err=` of each job summary line (`NAME: (groupid=0, jobs=1): err= 0: pid=…`, or `err=84 (file:…`).
pub fn job_errors(stdout: &str) -> Vec<i64> {
    stdout
        .lines()
        .filter(|l| l.contains("(groupid="))
        .filter_map(|l| {
            let (_, rest) = l.split_once("err=")?;
            let rest = rest.trim_start();
            let end = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '-'))
                .unwrap_or(rest.len());
            rest[..end].parse().ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_errors_come_from_summary_lines() {
        let out = "client: (g=0): rw=write, bs=(R) 64.0KiB\nfio-3.33\n\
                   client: (groupid=0, jobs=1): err= 0: pid=42: Sun Nov 29 01:00:00 2026\n  write: IOPS=1\n";
        assert_eq!(job_errors(out), [0]);
        assert_eq!(
            job_errors("server: (groupid=0, jobs=1): err=110 (file:io_u.c:1, func=io_u error): pid=1\n"),
            [110]
        );
    }
}
