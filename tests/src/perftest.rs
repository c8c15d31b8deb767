//! Debian's perftest 4.5 (`ib_*_bw`, `ib_*_lat`, with `-R`: rdma_cm) on soft-rdma's drop-in libraries between
//! the two namespaces of a [`Programs`] pair: a server in B, its client in A, and their results rows. The
//! pieces that do not depend on where the two sides run ([`options`], [`with_retry`], [`Pair`]'s checks,
//! [`rows`]) serve the siw interop suite too, whose perftest runs one side in its VM.
//!
//! perftest prints one results row per message size after a header line that starts with `#bytes`
//! (perftest 4.5, `src/perftest_parameters.h`: `RESULT_FMT`, `RESULT_FMT_G`, `RESULT_FMT_LAT`); a row's first
//! two fields are the size and the iterations. The tests assert on rows and exit codes, never on figures:
//! performance is `cargo xtask bench`'s (`--only perftest`).

use std::time::Duration;

use crate::Side::{A, B};
use crate::rdma_core::{Outcome, Programs};

/// Both sides of one perftest run.
pub struct Pair {
    pub client: Outcome,
    pub server: Outcome,
}

/// `program -R -F -p PORT args…` as server in B and as client of B in A, both sides with the same options
/// (perftest's server takes most of them from the client, but not all, so both get them), with
/// [`with_retry`] on perftest's listen race.
pub fn run(p: &Programs, program: &str, port: u16, args: &[&str]) -> Pair {
    with_retry(port, |port| run_once(p, program, port, args))
}

/// What perftest's client prints when its connect is refused (nothing listens at the server's port), on
/// soft-rdma's librdmacm.
pub const REFUSED: &str = "RDMA_CM_EVENT_REJECTED; error: -111";

/// Whether a perftest client's output says its connect was refused: [`REFUSED`], or what it prints on
/// rdma-core's own librdmacm over siw, whose iWARP connect fails with ECONNREFUSED ("Failed to connect
/// through RDMA CM." then "ERRNO: Connection refused."; perftest 4.5 may then crash in its own retry,
/// `rdma_cm_client_connection`, so the exit status says nothing).
pub fn was_refused(client_output: &str) -> bool {
    client_output.contains(REFUSED)
        || (client_output.contains("Failed to connect through RDMA CM")
            && client_output.contains("ERRNO: Connection refused"))
}

/// `attempt(port)`, and once more on the next port (saying so) if its client's first connect was refused
/// ([`was_refused`]): perftest's own race between its server's listen and its client's connect
/// (docs/running-rdma-programs.md), which each pair running alone (`Programs::start_alone`) keeps rare; a
/// second refusal fails the test. `attempt` runs a server and its client at `port` (on any hosts).
pub fn with_retry(port: u16, attempt: impl FnMut(u16) -> Pair) -> Pair {
    with_retries(port, 2, attempt)
}

/// [`with_retry`] with up to `tries` attempts, each on the next port: for a server on a much slower host
/// than its client (the siw interop suite's VM, under emulation), where the race is common. perftest 4.5's
/// own retry of a refused connect (`rdma_cm_client_connection`, 10 tries) reuses the ids it has just
/// destroyed and fails on any library (upstream fixed it after 4.5-0.17: "Fix crashes and logical flaws in
/// RDMA CM connection retry"), so the harness retries the whole run instead. Only a refusal is retried; the
/// last attempt's pair is returned, refused or not.
pub fn with_retries(port: u16, tries: u16, mut attempt: impl FnMut(u16) -> Pair) -> Pair {
    let mut pair = attempt(port);
    for n in 1..tries {
        if pair.client.success() || !was_refused(&pair.client.text()) {
            break;
        }
        println!(
            "NOTE: connect {n} of {tries} was refused (the known listen race); running once more:\n{}",
            pair.client
        );
        pair = attempt(port + n);
    }
    pair
}

/// The options both sides of a run get before the test's own: `-R` (rdma_cm, the only way on iWARP),
/// `-F` (no failure over the CPU frequency governor, which has nothing to do with the test), `-p PORT`.
pub fn options(port: u16, args: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = ["-R", "-F", "-p", &port.to_string()]
        .iter()
        .map(|s| s.to_string())
        .collect();
    v.extend(args.iter().map(|s| s.to_string()));
    v
}

fn run_once(p: &Programs, program: &str, port: u16, args: &[&str]) -> Pair {
    let common = options(port, args);
    let common: Vec<&str> = common.iter().map(String::as_str).collect();
    let mut server = p.spawn(B, program, &common);
    p.wait_listening(B, port, &mut server);
    let b = p.ip(B).to_string();
    let mut client_args = common.clone();
    client_args.push(&b);
    let client = p.run(A, program, &client_args);
    let server = server.wait_after(&client);
    Pair { client, server }
}

/// [`run`] for an option that must fail: the client starts once the server listens or has exited (it may
/// fail before it listens), and a server still running a few seconds after its client (one that listens for
/// a client that never came) is stopped.
pub fn run_refused(p: &Programs, program: &str, port: u16, args: &[&str]) -> Pair {
    let common = options(port, args);
    let common: Vec<&str> = common.iter().map(String::as_str).collect();
    let mut server = p.spawn(B, program, &common);
    // A server that takes the options listens; one that refuses them exits first. A fixed moment here
    // lost the race under CI's load (the client was rejected before the server listened).
    p.listens_or_exits(B, port, &mut server);
    let b = p.ip(B).to_string();
    let mut client_args = common.clone();
    client_args.push(&b);
    let client = p.run(A, program, &client_args);
    let server = server.wait(Duration::from_secs(5));
    Pair { client, server }
}

impl Pair {
    /// Both exited 0 (else a panic with both sides' output: a refusal on one side is explained by the other).
    pub fn assert_success(&self) -> &Self {
        assert!(
            self.client.success() && self.server.success(),
            "{}\n{}",
            self.client,
            self.server
        );
        self
    }

    /// `side`'s results rows (the client's or, `server` true, the server's).
    pub fn rows(&self, server: bool) -> Vec<Row> {
        rows(if server {
            &self.server.stdout
        } else {
            &self.client.stdout
        })
    }

    /// The client prints a row for each of `sizes` with `iters` iterations (None: any), and nothing else.
    pub fn assert_rows(&self, sizes: &[u64], iters: Option<u64>) -> &Self {
        let rows = self.rows(false);
        let got: Vec<u64> = rows.iter().map(|r| r.bytes).collect();
        assert_eq!(got, sizes, "results rows' sizes in\n{}", self.client);
        for r in &rows {
            if let Some(n) = iters {
                assert_eq!(r.iterations, n, "iterations of a row in\n{}", self.client);
            }
            assert!(r.iterations > 0, "a row without iterations in\n{}", self.client);
            assert!(
                r.figures
                    .iter()
                    .enumerate()
                    .all(|(i, f)| (f.is_finite() && *f >= 0.0) || is_stdev_nan(&r.figures, i)),
                "a row with a figure that is not a number in\n{}",
                self.client
            );
        }
        self
    }
}

/// Whether `figures[i]` is a latency row's t_stdev printed as NaN: perftest computes it as the square root
/// of the mean of squares less the squared mean, in cycles (perftest's `src/perftest_resources.c`,
/// `print_report_lat`), which cancels to a negative number once an iteration takes tens of milliseconds
/// (squares past 2^53), as multi-MiB Reads under CI's load do: "-nan" there is perftest's arithmetic, not a
/// figure soft-rdma made. Every other column must be a number.
fn is_stdev_nan(figures: &[f64], i: usize) -> bool {
    figures.len() == 7 && i == 4 && figures[i].is_nan()
}

/// One results row: size, iterations, and the figures after them.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub bytes: u64,
    pub iterations: u64,
    pub figures: Vec<f64>,
}

/// The results rows of perftest's output: the lines after a `#bytes` header whose first two fields are
/// integers and whose other fields are numbers (at least two of them).
pub fn rows(stdout: &str) -> Vec<Row> {
    let mut seen_header = false;
    let mut v = Vec::new();
    for line in stdout.lines() {
        if line.trim_start().starts_with("#bytes") {
            seen_header = true;
            continue;
        }
        if !seen_header {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        // Bandwidth rows have 5 fields, latency rows 9, a latency run by duration (`-D`) 4.
        if f.len() < 4 {
            continue;
        }
        let (Ok(bytes), Ok(iterations)) = (f[0].parse(), f[1].parse()) else {
            continue;
        };
        let Some(figures) = f[2..].iter().map(|x| x.parse().ok()).collect() else {
            continue;
        };
        v.push(Row {
            bytes,
            iterations,
            figures,
        });
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pair whose client exited with `code` and printed `stderr`.
    fn pair(code: i32, stderr: &str) -> Pair {
        Pair {
            client: Outcome::exited("client", code, stderr.to_owned()),
            server: Outcome::exited("server", 0, String::new()),
        }
    }

    #[test]
    fn only_a_refusal_is_retried_on_the_next_ports() {
        let refused = format!("RDMA CM event error:\nEvent: {REFUSED}.\n");
        let mut ports = Vec::new();
        let p = with_retries(100, 4, |port| {
            ports.push(port);
            if ports.len() < 3 {
                pair(1, &refused)
            } else {
                pair(0, "")
            }
        });
        assert!(p.client.success());
        assert_eq!(ports, [100, 101, 102]);
        // At most `tries` attempts; the last refusal is what comes back.
        ports.clear();
        let p = with_retry(200, |port| {
            ports.push(port);
            pair(1, &refused)
        });
        assert!(!p.client.success());
        assert_eq!(ports, [200, 201]);
        // Any other failure is the test's.
        ports.clear();
        let p = with_retries(300, 4, |port| {
            ports.push(port);
            pair(1, "Couldn't allocate MR")
        });
        assert!(!p.client.success());
        assert_eq!(ports, [300]);
    }

    #[test]
    fn a_refusal_on_siw_is_recognised_whatever_the_exit_status() {
        // As perftest 4.5 on rdma-core's librdmacm over siw printed it in the interop suite (then crashed in
        // its own retry: exit status 139).
        let siw = "Failed to connect through RDMA CM.\nERRNO: Connection refused.\nFailed to handle RDMA CM \
                   event.\nERRNO: Connection refused.\n";
        assert!(was_refused(siw));
        let mut ports = Vec::new();
        let p = with_retries(400, 4, |port| {
            ports.push(port);
            if ports.len() < 2 {
                pair(139, siw)
            } else {
                pair(0, "")
            }
        });
        assert!(p.client.success());
        assert_eq!(ports, [400, 401]);
        // Another connect failure is not a refusal.
        assert!(!was_refused(
            "Failed to connect through RDMA CM.\nERRNO: Connection timed out.\n"
        ));
    }

    #[test]
    fn options_come_first() {
        assert_eq!(
            options(18515, &["-s", "64"]),
            ["-R", "-F", "-p", "18515", "-s", "64"]
        );
    }

    /// perftest's own "-nan" is allowed in a latency row's t_stdev column only.
    #[test]
    fn only_a_latency_rows_stdev_may_be_perftests_nan() {
        let out = " #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%\n                    4194304 5 67233.11 177936.81 114806.25 114806.25 -nan 177936.81 177936.81\n";
        let r = rows(out);
        assert_eq!(r.len(), 1);
        assert!(r[0].figures[4].is_nan() && is_stdev_nan(&r[0].figures, 4));
        assert!(!is_stdev_nan(&r[0].figures, 3));
        assert!(!is_stdev_nan(&[1.0, f64::NAN, 2.0], 1));
    }

    #[test]
    fn rows_follow_the_header() {
        let out = " 65536 1000 1 2 3\n #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n 2          10             0.01               0.01               0.500000\n 4          10             0.02               0.02               0.600000\n---------\n";
        let r = rows(out);
        assert_eq!(r.len(), 2);
        assert_eq!(r[1].bytes, 4);
        assert_eq!(r[1].figures, vec![0.02, 0.02, 0.6]);
    }
}
