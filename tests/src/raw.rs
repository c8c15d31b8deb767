//! What a plain kernel TCP socket in a test observes of a soft-rdma peer: how a connection ended, read from
//! the result of a `read`, so that a test asserts the event (FIN or reset) and never takes a timeout for a
//! close.

use std::io::ErrorKind;

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
