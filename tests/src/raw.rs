//! Kernel TCP sockets seen from a test: how a connection ended, read from the result of a `read`, so that a
//! test asserts the event (FIN or reset) and never takes a timeout for a close; and which TCP sockets a
//! namespace's kernel holds (`ss`), so that a test can say whether a connection reached the kernel at all.

use std::io::ErrorKind;
use std::net::SocketAddr;

use anyhow::{Context, Result, bail};

use crate::{Side, TestNet};

/// One TCP socket of a namespace's kernel, as `ss -tan` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSocket {
    /// `LISTEN`, `ESTAB`, `SYN-RECV`, `TIME-WAIT`, ...
    pub state: String,
    pub local: SocketAddr,
    /// `None` for a listening socket (`*`).
    pub peer: Option<SocketAddr>,
}

/// `ss -Htan` output → sockets (lines that do not parse are an error: a format change must not read as "no
/// sockets").
pub fn parse_ss(text: &str) -> Result<Vec<KernelSocket>> {
    let addr = |s: &str| -> Option<SocketAddr> {
        // IPv6 with a scope or a mapped v4 address: `[fe80::1%veth]:7400`, `[::ffff:10.0.0.1]:80`.
        let s = match s.split_once('%') {
            Some((a, rest)) => format!("{a}]{}", &rest[rest.find(']')? + 1..]),
            None => s.to_owned(),
        };
        s.parse().ok()
    };
    let mut v = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(state), Some(local), Some(peer)) = (f.first(), f.get(3), f.get(4)) else {
            bail!("unexpected ss line {line:?}");
        };
        let local = addr(local).with_context(|| format!("local address in {line:?}"))?;
        let peer = if peer.ends_with(":*") {
            None
        } else {
            Some(addr(peer).with_context(|| format!("peer address in {line:?}"))?)
        };
        v.push(KernelSocket {
            state: (*state).to_owned(),
            local,
            peer,
        });
    }
    Ok(v)
}

/// Every TCP socket `side`'s kernel holds (IPv4 and IPv6).
pub fn kernel_tcp_sockets(net: &TestNet, side: Side) -> Result<Vec<KernelSocket>> {
    let out = crate::output_ok(net.command(side, "ss").args(["-H", "-t", "-a", "-n"]), "ss")?;
    parse_ss(&String::from_utf8_lossy(&out.stdout))
}

/// How a blocking `read` on a TCP stream (with a read timeout set) came back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamEnd {
    /// End of stream: the peer closed in order (FIN).
    Fin,
    /// The peer aborted (RST).
    Reset,
    /// Bytes arrived: the connection did not end.
    Data(usize),
    /// The read timed out: nothing happened within the timeout, the connection is still open.
    StillOpen,
    /// Any other error.
    Other(ErrorKind),
}

/// Classifies `read`'s result (a timeout is [`StreamEnd::StillOpen`], never a close).
pub fn stream_end(read: std::io::Result<usize>) -> StreamEnd {
    match read {
        Ok(0) => StreamEnd::Fin,
        Ok(n) => StreamEnd::Data(n),
        Err(e) => match e.kind() {
            ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted => StreamEnd::Reset,
            ErrorKind::WouldBlock | ErrorKind::TimedOut => StreamEnd::StillOpen,
            k => StreamEnd::Other(k),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ss() {
        let text = "LISTEN 0      128     10.200.3.2:7400       0.0.0.0:*\n\
                    ESTAB  0      0       10.200.3.2:7400    10.200.3.1:49152\n\
                    LISTEN 0 128 [fd00:5352:3::2]:9102 [::]:*\n\
                    SYN-RECV 0 0 [fe80::1%vsr1b]:7400 [fe80::2%vsr1b]:50000\n";
        let v = parse_ss(text).unwrap();
        assert_eq!(v.len(), 4);
        assert_eq!(v[0].state, "LISTEN");
        assert_eq!(v[0].peer, None);
        assert_eq!(v[1].local, "10.200.3.2:7400".parse().unwrap());
        assert_eq!(v[1].peer, Some("10.200.3.1:49152".parse().unwrap()));
        assert_eq!(v[2].local.port(), 9102);
        assert_eq!((v[3].state.as_str(), v[3].local.port()), ("SYN-RECV", 7400));
        assert!(
            parse_ss("garbage\n").is_err(),
            "an unknown format is an error, not no sockets"
        );
        assert_eq!(parse_ss("").unwrap(), vec![]);
    }
    use std::io::{Error, Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::time::Duration;

    #[test]
    fn classifies_read_results() {
        assert_eq!(stream_end(Ok(0)), StreamEnd::Fin);
        assert_eq!(stream_end(Ok(3)), StreamEnd::Data(3));
        assert_eq!(
            stream_end(Err(Error::from(ErrorKind::ConnectionReset))),
            StreamEnd::Reset
        );
        assert_eq!(
            stream_end(Err(Error::from(ErrorKind::WouldBlock))),
            StreamEnd::StillOpen,
            "a timeout is not a close"
        );
        assert_eq!(
            stream_end(Err(Error::from(ErrorKind::TimedOut))),
            StreamEnd::StillOpen
        );
        assert_eq!(
            stream_end(Err(Error::from(ErrorKind::PermissionDenied))),
            StreamEnd::Other(ErrorKind::PermissionDenied)
        );
    }

    /// On real loopback sockets: a peer that stays open, closes in order, or aborts reads as such.
    #[test]
    fn real_sockets_still_open_fin_and_reset() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mut b = [0u8; 8];

        let mut c = TcpStream::connect(addr).unwrap();
        let (mut s, _) = l.accept().unwrap();
        c.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        assert_eq!(stream_end(c.read(&mut b)), StreamEnd::StillOpen);
        s.write_all(b"x").unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        assert_eq!(stream_end(c.read(&mut b)), StreamEnd::Data(1));
        drop(s);
        assert_eq!(stream_end(c.read(&mut b)), StreamEnd::Fin);

        let mut c = TcpStream::connect(addr).unwrap();
        let (s, _) = l.accept().unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        socket_linger_zero(&s);
        drop(s);
        assert_eq!(stream_end(c.read(&mut b)), StreamEnd::Reset);
    }

    /// SO_LINGER 0: the close sends an RST.
    fn socket_linger_zero(s: &TcpStream) {
        use std::os::fd::AsRawFd;
        let l = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: a valid socket and a linger struct of the size given.
        let r = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&l as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0);
    }
}
