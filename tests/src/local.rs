//! Local clients that do what the client library never would, for the suites that test soft-rdmad against
//! them: a raw client of the Unix socket ([`Raw`]: a blocking std `UnixStream`, hand-made frames as
//! docs/protocol.md describes them, descriptors passed with any frame), sealed memfds that cost no memory
//! ([`sparse_memfd`]), and the CLI run as another user ([`cli_as`]).

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::BytesMut;
use soft_rdma::Error;
use soft_rdma::engine::requests::{RequestId, SessionId};
use soft_rdma::uds::messages::{Request as CmRequest, Response as CmResponse};
use soft_rdma::uds::proto::{ClientMessage, MAX_SERVER_FRAME, PROTOCOL_VERSION, ServerMessage, split_frame};

use crate::cli_binary;

/// `m` framed as on the socket.
pub fn frame(m: &ClientMessage) -> BytesMut {
    let mut b = BytesMut::new();
    m.encode(&mut b);
    b
}

/// A Hello of protocol `version`.
pub fn hello(version: u16) -> ClientMessage {
    ClientMessage::Hello {
        version,
        client_name: "raw test client".into(),
    }
}

/// A raw client: hand-made frames on a blocking socket (reads time out after 10 s: a hang fails the test).
pub struct Raw {
    pub s: UnixStream,
    buf: BytesMut,
}

impl Raw {
    pub fn connect(path: &Path) -> Raw {
        let s = UnixStream::connect(path).expect("connect to soft-rdmad");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Raw {
            s,
            buf: BytesMut::new(),
        }
    }

    /// Writes bytes; the daemon may already have closed (a write after its Goodbye may fail).
    pub fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.s.write_all(bytes)
    }

    pub fn send(&mut self, m: &ClientMessage) {
        self.write(&frame(m)).expect("writing to soft-rdmad");
    }

    /// Sends `bytes` in one `sendmsg` with `fds` as SCM_RIGHTS (attached to the first byte), whatever the
    /// frame announces.
    pub fn send_with_fds(&mut self, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
        use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
        let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let cmsgs = [ControlMessage::ScmRights(&raw)];
        let sent = sendmsg::<()>(
            self.s.as_raw_fd(),
            &[std::io::IoSlice::new(bytes)],
            &cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        )?;
        self.write(&bytes[sent..])
    }

    /// Hello and its Welcome.
    pub fn hello(&mut self) -> SessionId {
        self.send(&hello(PROTOCOL_VERSION));
        match self.next_message() {
            Some(ServerMessage::Welcome { session, version, .. }) => {
                assert_eq!(version, PROTOCOL_VERSION);
                session
            }
            other => panic!("expected Welcome, got {other:?}"),
        }
    }

    /// The next message from the daemon; `None` when it closed the socket.
    pub fn next_message(&mut self) -> Option<ServerMessage> {
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            if let Some(f) = split_frame(&mut self.buf, MAX_SERVER_FRAME).expect("a well-formed frame") {
                return Some(ServerMessage::decode(&f).expect("a decodable message"));
            }
            match self.s.read(&mut chunk) {
                Ok(0) => {
                    assert!(
                        self.buf.is_empty(),
                        "closed in the middle of a frame: {:?}",
                        self.buf
                    );
                    return None;
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
                // A signal (SIGCHLD of a daemon the test started) ends a read with a timeout early.
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => panic!("reading from soft-rdmad (10 s timeout): {e}"),
            }
        }
    }

    /// The daemon's Goodbye, after which it must close the socket.
    pub fn goodbye(&mut self, what: &str) -> Error {
        match self.next_message() {
            Some(ServerMessage::Goodbye { error }) => {
                let after = self.next_message();
                assert!(
                    after.is_none(),
                    "{what}: soft-rdmad sent {after:?} after its Goodbye"
                );
                error
            }
            other => panic!("{what}: expected Goodbye, got {other:?}"),
        }
    }

    /// Sends `requests` in one write (ids from `first_id` on) without reading anything.
    pub fn send_requests(&mut self, first_id: u64, requests: Vec<CmRequest>) {
        let mut out = BytesMut::new();
        for (i, request) in requests.into_iter().enumerate() {
            ClientMessage::Request {
                id: RequestId(first_id + i as u64),
                request,
            }
            .encode(&mut out);
        }
        self.write(&out).expect("writing requests");
    }

    /// Sends `requests` in one write (ids from `first_id` on) and collects their answers by id; other messages
    /// (completions) are returned beside them.
    pub fn pipeline(
        &mut self,
        first_id: u64,
        requests: Vec<CmRequest>,
    ) -> (Vec<Result<CmResponse, Error>>, Vec<ServerMessage>) {
        let n = requests.len();
        self.send_requests(first_id, requests);
        let mut answers: Vec<Option<Result<CmResponse, Error>>> = vec![None; n];
        let mut others = Vec::new();
        let mut got = 0;
        while got < n {
            match self.next_message() {
                Some(ServerMessage::Response { id, result }) => {
                    let i = (id.0 - first_id) as usize;
                    assert!(answers[i].is_none(), "two answers to request {}", id.0);
                    answers[i] = Some(result);
                    got += 1;
                }
                Some(m) => others.push(m),
                None => panic!("soft-rdmad closed the session after {got} of {n} answers"),
            }
        }
        (answers.into_iter().map(Option::unwrap).collect(), others)
    }

    pub fn request(&mut self, id: u64, request: CmRequest) -> Result<CmResponse, Error> {
        self.pipeline(id, vec![request]).0.remove(0)
    }
}

/// A memfd of `len` bytes sealed against shrinking and growing, as RegisterMemory wants, never written: a
/// sparse file that costs no memory however long it is.
pub fn sparse_memfd(len: u64) -> OwnedFd {
    // SAFETY: plain system calls on a descriptor this function creates and owns.
    unsafe {
        let fd = libc::memfd_create(c"sparse".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING);
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        let fd = OwnedFd::from_raw_fd(fd);
        let size = libc::off_t::try_from(len).expect("a length off_t holds");
        assert_eq!(
            libc::ftruncate(fd.as_raw_fd(), size),
            0,
            "ftruncate {len}: {}",
            std::io::Error::last_os_error()
        );
        assert_eq!(
            libc::fcntl(
                fd.as_raw_fd(),
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW
            ),
            0,
            "sealing: {}",
            std::io::Error::last_os_error()
        );
        fd
    }
}

/// The unprivileged uid/gid tests run clients as (`nobody`).
pub const NOBODY: u32 = 65534;

/// An existing group other than root's and nobody's, and not `except`: for `--group` / `--admin-group`.
pub fn system_group(except: Option<u32>) -> (String, u32) {
    ["daemon", "bin", "sys", "adm", "disk", "lp", "mail"]
        .iter()
        .find_map(|name| {
            nix::unistd::Group::from_name(name)
                .ok()
                .flatten()
                .filter(|g| {
                    let gid = g.gid.as_raw();
                    gid != 0 && gid != NOBODY && Some(gid) != except
                })
                .map(|g| (g.name, g.gid.as_raw()))
        })
        .expect("a system group (daemon, bin, sys, adm, disk, lp or mail)")
}

/// The CLI (`soft-rdma --uds UDS ARGS...`) as uid/gid [`NOBODY`] with exactly the supplementary `groups`
/// (setpriv); returns whether it succeeded, and its stdout and stderr.
pub fn cli_as_nobody(uds: &Path, groups: &[u32], args: &[&str]) -> (bool, String, String) {
    let mut cmd = Command::new("setpriv");
    cmd.arg(format!("--reuid={NOBODY}"))
        .arg(format!("--regid={NOBODY}"));
    if groups.is_empty() {
        cmd.arg("--clear-groups");
    } else {
        let list: Vec<String> = groups.iter().map(u32::to_string).collect();
        cmd.arg(format!("--groups={}", list.join(",")));
    }
    let out = cmd
        .arg(cli_binary().expect("the soft-rdma CLI"))
        .arg("--uds")
        .arg(uds)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("setpriv");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
