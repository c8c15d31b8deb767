//! Debian's libfabric 1.17 fabtests (`fi_pingpong`) on soft-rdma's drop-in libraries between the two
//! namespaces of a [`Programs`] pair: a server in B, its client in A, and the results rows the client
//! prints.
//!
//! fi_pingpong (fabtests `util/pingpong.c`) exchanges its fabric
//! addresses over a TCP control connection of its own (port 47592 by default, `-P`/`-B`) before it opens the
//! fabric, so the server is ready once that port listens. With `-c` it checks the data of every message;
//! `-S all` (its default) runs six sizes from 64 B to 1 MiB, and it prints one row
//! per size: `bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec`, the size with a k/m/g suffix.

use crate::Side::{A, B};
use crate::perftest::Pair;
use crate::rdma_core::{DEADLINE, Outcome, Programs, Running, wait_tcp_listening};

/// fi_pingpong's default control port.
pub const CONTROL_PORT: u16 = 47592;

/// `fi_pingpong -c args…` as server in B and as its client in A, with `env` set on both.
pub fn fi_pingpong(p: &Programs, args: &[&str], env: &[(&str, &str)]) -> Pair {
    let mut common = vec!["-c"];
    common.extend_from_slice(args);
    let spawn = |side, extra: Option<&str>| {
        let mut a = common.clone();
        a.extend(extra);
        let mut cmd = p.command(side, "fi_pingpong", &a);
        // A crash leaves a backtrace file (`fi_pingpong.*.btr`) in the working directory: the pair's own.
        cmd.envs(env.iter().copied()).current_dir(p.d.net.dir());
        Running::spawn(&format!("fi_pingpong {} (side {side:?})", a.join(" ")), cmd)
    };
    let mut server = spawn(B, None);
    wait_tcp_listening(&p.d.net, B, CONTROL_PORT, &mut server);
    let b = p.ip(B).to_string();
    let client = spawn(A, Some(&b)).wait(DEADLINE);
    let server = server.wait_after(&client);
    Pair { client, server }
}

/// A size as fi_pingpong prints it (`64`, `4k`, `1m`; fabtests `size_str`, powers of 1024).
pub fn parse_size(s: &str) -> Option<u64> {
    let (num, mult) = match s.chars().last()? {
        'k' => (&s[..s.len() - 1], 1u64 << 10),
        'm' => (&s[..s.len() - 1], 1 << 20),
        'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().ok().map(|n| n * mult)
}

/// The sizes of fi_pingpong's results rows: lines after its `bytes` header whose first field is a size and
/// whose second (`#sent`) is a count.
pub fn rows(stdout: &str) -> Vec<u64> {
    let mut seen_header = false;
    let mut v = Vec::new();
    for line in stdout.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.first() == Some(&"bytes") {
            seen_header = true;
            continue;
        }
        if !seen_header || f.len() < 8 {
            continue;
        }
        if let (Some(size), Ok(_)) = (parse_size(f[0]), f[1].parse::<u64>()) {
            v.push(size);
        }
    }
    v
}

/// fi_pingpong's sizes for `-S all` as fi_pingpong 1.17 prints them.
pub const ALL_SIZES: [u64; 6] = [64, 256, 1 << 10, 4 << 10, 64 << 10, 1 << 20];

/// The client printed a row for each of [`ALL_SIZES`], in order (with `-c`, every message of each size
/// was checked).
pub fn sizes_checked(client: &Outcome) {
    assert_eq!(
        rows(&client.stdout),
        ALL_SIZES,
        "results rows' sizes in\n{client}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_fabtests_prints_them() {
        assert_eq!(parse_size("64"), Some(64));
        assert_eq!(parse_size("4k"), Some(4096));
        assert_eq!(parse_size("1m"), Some(1 << 20));
        assert_eq!(parse_size("x"), None);
        let out = "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n\
                   1       10      =10      20          0.00s      0.01     147.05       0.01\n\
                   4k      10      =10      80k         0.00s     49.73      82.35       0.01\n";
        assert_eq!(rows(out), vec![1, 4096]);
    }
}
