//! Two connected RC queue pairs through the libraries' own `extern "C"` functions, as a C program calls
//! them (the data path through `ibv_context.ops`, as verbs.h's inlines do), against a soft-rdmad on
//! loopback in kernel-TCP mode: rdma_cm with private data and read limits both ways, Send with inline data,
//! RDMA Write and Read on the program's own memory, completion channels (blocking and O_NONBLOCK), bad use
//! (foreign handles, another context's objects, too many SGEs, an unregistered lkey, a post before the
//! connection, a CQ still in use), the flush at disconnect, and soft-rdmad going away (DEVICE_FATAL).
//!
//! Needs soft-rdmad built beside this test (`cargo build -p soft-rdma-user --all-features --bins`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use soft_rdma_verbs::abi::*;
use soft_rdma_verbs::c::*;

struct Daemon {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn soft_rdmad() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().unwrap().parent().unwrap().join("soft-rdmad");
    assert!(
        path.exists(),
        "{} is missing: build it first (cargo build -p soft-rdma-user --all-features --bins)",
        path.display()
    );
    path
}

/// soft-rdmad on a socket of its own, which this process's libraries use (SOFT_RDMA_UDS).
fn start_daemon() -> Daemon {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("soft-rdmad.sock");
    let log = std::fs::File::create(dir.path().join("soft-rdmad.log")).unwrap();
    let child = Command::new(soft_rdmad())
        .arg("--uds")
        .arg(&uds)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !uds.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "soft-rdmad did not make {}",
            uds.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: set before any thread of this test reads the environment (the library reads it once).
    unsafe { std::env::set_var("SOFT_RDMA_UDS", &uds) };
    Daemon { child, _dir: dir }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

fn sockaddr(a: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: zeroed storage, filled below.
    let mut s: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let SocketAddr::V4(v4) = a else {
        panic!("IPv4 only here")
    };
    // SAFETY: sockaddr_storage holds a sockaddr_in.
    let sin = unsafe { &mut *(&raw mut s).cast::<libc::sockaddr_in>() };
    sin.sin_family = libc::AF_INET as u16;
    sin.sin_port = v4.port().to_be();
    sin.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
    s
}

/// The next event on `ch`, which must be `expected`; acknowledged, with (id, private data, IRD, ORD).
unsafe fn expect_event(
    ch: *mut rdma_event_channel,
    expected: i32,
) -> (*mut rdma_cm_id, Vec<u8>, u8, u8, i32) {
    let mut ev = null_mut();
    assert_eq!(
        unsafe { rdma_get_cm_event(ch, &mut ev) },
        0,
        "rdma_get_cm_event: errno {}",
        errno()
    );
    let e = unsafe { &*ev };
    let c = e.param.conn;
    let data = if c.private_data.is_null() {
        Vec::new()
    } else {
        unsafe { std::slice::from_raw_parts(c.private_data.cast::<u8>(), usize::from(c.private_data_len)) }
            .to_vec()
    };
    let got = (e.id, data, c.responder_resources, c.initiator_depth, e.status);
    let event = e.event;
    assert_eq!(unsafe { rdma_ack_cm_event(ev) }, 0);
    assert_eq!(
        event, expected,
        "expected event {expected}, got {event} (status {})",
        got.4
    );
    got
}

/// Polls `cq` through `ops.poll_cq` until one completion arrives.
unsafe fn poll_one(cq: *mut ibv_cq) -> ibv_wc {
    let poll = unsafe { (*(*cq).context).ops.poll_cq.unwrap() };
    let start = Instant::now();
    loop {
        let mut wc = ibv_wc::default();
        let n = unsafe { poll(cq, 1, &mut wc) };
        assert!(n >= 0, "ibv_poll_cq: {n}");
        if n == 1 {
            return wc;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no completion on the CQ"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

unsafe fn post_send(qp: *mut ibv_qp, wr: &mut ibv_send_wr) -> (i32, *mut ibv_send_wr) {
    let mut bad = null_mut();
    let f = unsafe { (*(*qp).context).ops.post_send.unwrap() };
    (unsafe { f(qp, wr, &mut bad) }, bad)
}

unsafe fn post_recv(qp: *mut ibv_qp, sge: &mut ibv_sge, id: u64) -> i32 {
    let mut wr = ibv_recv_wr {
        wr_id: id,
        next: null_mut(),
        sg_list: sge,
        num_sge: 1,
    };
    let mut bad = null_mut();
    let f = unsafe { (*(*qp).context).ops.post_recv.unwrap() };
    unsafe { f(qp, &mut wr, &mut bad) }
}

fn send_wr(id: u64, opcode: i32, sges: &mut [ibv_sge], flags: u32) -> ibv_send_wr {
    // SAFETY: all-zero is a valid ibv_send_wr.
    let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.wr_id = id;
    wr.opcode = opcode;
    wr.sg_list = sges.as_mut_ptr();
    wr.num_sge = sges.len() as i32;
    wr.send_flags = flags;
    wr
}

/// One side: context of its id, PD, a CQ on a channel, an RC QP through rdma_create_qp.
struct Side {
    pd: *mut ibv_pd,
    cq: *mut ibv_cq,
    channel: *mut ibv_comp_channel,
    qp: *mut ibv_qp,
}

unsafe fn side(id: *mut rdma_cm_id) -> Side {
    unsafe {
        let verbs = (*id).verbs;
        assert!(!verbs.is_null(), "the id has a device once resolved or requested");
        let pd = ibv_alloc_pd(verbs);
        let channel = ibv_create_comp_channel(verbs);
        let cq = ibv_create_cq(verbs, 64, null_mut(), channel, 0);
        assert!(!pd.is_null() && !channel.is_null() && !cq.is_null());
        let mut attr = ibv_qp_init_attr {
            qp_context: null_mut(),
            send_cq: cq,
            recv_cq: cq,
            srq: null_mut(),
            cap: ibv_qp_cap {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 2,
                max_recv_sge: 2,
                max_inline_data: 64,
            },
            qp_type: IBV_QPT_RC,
            sq_sig_all: 0,
        };
        assert_eq!(
            rdma_create_qp(id, pd, &mut attr),
            0,
            "rdma_create_qp: errno {}",
            errno()
        );
        assert_eq!(attr.cap.max_inline_data, 64);
        Side {
            pd,
            cq,
            channel,
            qp: (*id).qp,
        }
    }
}

/// The device, its queries, and a foreign pointer refused; the context of an `ibv_open_device`.
unsafe fn device() -> *mut ibv_context {
    unsafe {
        let mut n = 0;
        let list = ibv_get_device_list(&mut n);
        assert_eq!(n, 1);
        let name = std::ffi::CStr::from_ptr(ibv_get_device_name(*list))
            .to_str()
            .unwrap()
            .to_string();
        assert_eq!(name, soft_rdma_verbs::DEVICE_NAME);
        let ctx = ibv_open_device(*list);
        ibv_free_device_list(list);
        let mut attr: ibv_device_attr = std::mem::zeroed();
        assert_eq!(ibv_query_device(ctx, &mut attr), 0);
        assert_eq!(attr.max_sge_rd, 1);
        assert!(attr.max_qp_wr > 0 && attr.max_sge > 0);
        let mut port: ibv_port_attr = std::mem::zeroed();
        assert_eq!(ibv_query_port(ctx, 1, &mut port), 0);
        assert_eq!(
            (port.state, port.link_layer),
            (IBV_PORT_ACTIVE, IBV_LINK_LAYER_ETHERNET)
        );
        assert_eq!(ibv_query_port(ctx, 2, &mut port), libc::EINVAL);
        // A foreign pointer is refused, never dereferenced.
        let mut junk = [0u8; 512];
        assert_eq!(
            ibv_query_device(junk.as_mut_ptr().cast(), &mut attr),
            libc::EINVAL
        );
        assert!(ibv_alloc_pd(junk.as_mut_ptr().cast()).is_null());
        assert_eq!(errno(), libc::EINVAL);
        ctx
    }
}

/// A channel (EAGAIN under O_NONBLOCK while empty), a listener on 127.0.0.1 port 0 and a connecting id
/// with its address and route resolved: (channel, listener, connecting id, the listener's address).
unsafe fn listen_and_resolve() -> (
    *mut rdma_event_channel,
    *mut rdma_cm_id,
    *mut rdma_cm_id,
    libc::sockaddr_storage,
) {
    unsafe {
        let ch = rdma_create_event_channel();
        assert!(!ch.is_null());
        let cm_flags = libc::fcntl((*ch).fd, libc::F_GETFL);
        assert_eq!(
            libc::fcntl((*ch).fd, libc::F_SETFL, cm_flags | libc::O_NONBLOCK),
            0
        );
        let mut none = null_mut();
        assert_eq!(rdma_get_cm_event(ch, &mut none), -1);
        assert_eq!(errno(), libc::EAGAIN);
        assert_eq!(libc::fcntl((*ch).fd, libc::F_SETFL, cm_flags), 0);
        let (mut listen, mut client, mut bogus) = (null_mut(), null_mut(), null_mut());
        assert_eq!(rdma_create_id(ch, &mut listen, null_mut(), RDMA_PS_TCP), 0);
        assert_eq!(rdma_create_id(ch, &mut client, null_mut(), RDMA_PS_TCP), 0);
        assert_eq!(rdma_create_id(ch, &mut bogus, null_mut(), RDMA_PS_UDP), -1);
        assert_eq!(errno(), libc::ENOSYS);
        let mut at = sockaddr("127.0.0.1:0".parse().unwrap());
        assert_eq!(rdma_bind_addr(listen, (&raw mut at).cast()), 0);
        // As the kernel's `cma_get_port`: port 0 is picked by the bind, before the listen (qperf -cm1).
        let port = u16::from_be(rdma_get_src_port(listen));
        assert!(port >= 49152, "port 0 takes soft-rdma's range, got {port}");
        assert_eq!(rdma_listen(listen, 4), 0, "rdma_listen: errno {}", errno());
        assert_eq!(
            u16::from_be(rdma_get_src_port(listen)),
            port,
            "the listen keeps the bound port"
        );
        let mut dst = sockaddr(SocketAddr::from(([127, 0, 0, 1], port)));
        resolve(ch, client, &mut dst);
        assert_eq!(u16::from_be(rdma_get_dst_port(client)), port);
        (ch, listen, client, dst)
    }
}

unsafe fn resolve(ch: *mut rdma_event_channel, id: *mut rdma_cm_id, dst: &mut libc::sockaddr_storage) {
    unsafe {
        assert_eq!(
            rdma_resolve_addr(id, null_mut(), (dst as *mut libc::sockaddr_storage).cast(), 2000),
            0
        );
        expect_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
        assert_eq!(rdma_resolve_route(id, 2000), 0);
        expect_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
    }
}

/// Another context's CQ with this PD: EINVAL; a UD queue pair: EOPNOTSUPP; a zero-size send queue: taken.
unsafe fn foreign_objects(other_ctx: *mut ibv_context, a: &Side) {
    unsafe {
        let foreign_cq = ibv_create_cq(other_ctx, 4, null_mut(), null_mut(), 0);
        assert!(!foreign_cq.is_null());
        let cap = ibv_qp_cap {
            max_send_wr: 1,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let mut mixed = ibv_qp_init_attr {
            qp_context: null_mut(),
            send_cq: foreign_cq,
            recv_cq: foreign_cq,
            srq: null_mut(),
            cap,
            qp_type: IBV_QPT_RC,
            sq_sig_all: 0,
        };
        assert!(ibv_create_qp(a.pd, &mut mixed).is_null());
        assert_eq!(errno(), libc::EINVAL);
        mixed.qp_type = 4; // IBV_QPT_UD
        mixed.send_cq = a.cq;
        mixed.recv_cq = a.cq;
        assert!(ibv_create_qp(a.pd, &mut mixed).is_null());
        assert_eq!(errno(), libc::EOPNOTSUPP);
        assert_eq!(ibv_destroy_cq(foreign_cq), 0);
        // A zero-size send queue, as qperf's rc_bw and rc_rdma_read servers ask (rdma-core takes it; siw
        // refuses it); then what siw's modify_qp takes of an idle queue pair: IBV_QP_CAP (ignored) and SQD
        // (no change).
        mixed.qp_type = IBV_QPT_RC;
        mixed.cap.max_send_wr = 0;
        let qp = ibv_create_qp(a.pd, &mut mixed);
        assert!(!qp.is_null(), "a zero-size send queue: errno {}", errno());
        let mut attr: ibv_qp_attr = std::mem::zeroed();
        assert_eq!(ibv_modify_qp(qp, &mut attr, IBV_QP_CAP), 0);
        attr.qp_state = IBV_QPS_SQD;
        assert_eq!(ibv_modify_qp(qp, &mut attr, IBV_QP_STATE), 0);
        assert_eq!(ibv_destroy_qp(qp), 0);
    }
}

/// Connects with private data and read limits both ways; the server registers `inbox` on its PD and
/// posts two Receives into it (1024.., 2048..) before it accepts: (server id, its side, the inbox's MR).
unsafe fn connect(
    ch: *mut rdma_event_channel,
    client: *mut rdma_cm_id,
    inbox: &mut [u8],
) -> (*mut rdma_cm_id, Side, *mut ibv_mr) {
    unsafe {
        let hello = b"hello from the client";
        let mut param: rdma_conn_param = std::mem::zeroed();
        param.private_data = hello.as_ptr().cast();
        param.private_data_len = hello.len() as u8;
        param.responder_resources = 2;
        param.initiator_depth = 3;
        assert_eq!(rdma_connect(client, &mut param), 0);
        let (server, data, ird, ord, _) = expect_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
        assert_eq!(data, hello);
        assert_eq!((ird, ord), (3, 2), "the peer's ORD to serve, its IRD to use");
        let b = side(server);
        let access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
        let inbox_mr = ibv_reg_mr(b.pd, inbox.as_mut_ptr().cast(), inbox.len(), access);
        assert!(!inbox_mr.is_null());
        for (i, at) in [1024u64, 2048].into_iter().enumerate() {
            let mut sge = ibv_sge {
                addr: inbox.as_ptr() as u64 + at,
                length: 1024,
                lkey: (*inbox_mr).lkey,
            };
            assert_eq!(post_recv(b.qp, &mut sge, 77 + i as u64), 0);
        }
        let welcome = b"welcome";
        let mut accept: rdma_conn_param = std::mem::zeroed();
        accept.private_data = welcome.as_ptr().cast();
        accept.private_data_len = welcome.len() as u8;
        accept.responder_resources = 3;
        accept.initiator_depth = 2;
        assert_eq!(rdma_accept(server, &mut accept), 0);
        let mut established = [
            expect_event(ch, RDMA_CM_EVENT_ESTABLISHED),
            expect_event(ch, RDMA_CM_EVENT_ESTABLISHED),
        ];
        established.sort_by_key(|e| e.0 != client);
        assert_eq!(
            established[0].1, welcome,
            "the accepting side's private data reaches the connecting side"
        );
        assert!(
            established[0].2 > 0 && established[0].3 > 0,
            "negotiated IRD/ORD: {:?}",
            established[0]
        );
        (server, b, inbox_mr)
    }
}

/// Send with inline data (the buffer reused at once) to a CQ armed on a non-blocking channel: poll(2)
/// wakes, the event names the CQ, the Receive lands at `inbox[at..]`.
unsafe fn inline_send_wakes_the_channel(a: &Side, b: &Side, inbox: &[u8], at: usize) {
    unsafe {
        let fd = (*b.channel).fd;
        let flags = libc::fcntl(fd, libc::F_GETFL);
        assert_eq!(libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK), 0);
        let (mut ev_cq, mut ev_ctx) = (null_mut(), null_mut());
        assert_eq!(ibv_get_cq_event(b.channel, &mut ev_cq, &mut ev_ctx), -1);
        assert_eq!(errno(), libc::EAGAIN);
        let notify = (*(*b.cq).context).ops.req_notify_cq.unwrap();
        assert_eq!(notify(b.cq, 0), 0);
        let mut msg = *b"inline ping!";
        let mut isge = [ibv_sge {
            addr: msg.as_ptr() as u64,
            length: msg.len() as u32,
            lkey: 0,
        }];
        let mut send = send_wr(10, IBV_WR_SEND, &mut isge, IBV_SEND_INLINE | IBV_SEND_SIGNALED);
        assert_eq!(post_send(a.qp, &mut send).0, 0);
        msg.fill(b'x');
        let sent = poll_one(a.cq);
        assert_eq!(
            (sent.wr_id, sent.status, sent.opcode),
            (10, IBV_WC_SUCCESS, IBV_WC_SEND)
        );
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        assert_eq!(libc::poll(&mut pfd, 1, 10_000), 1);
        assert_eq!(ibv_get_cq_event(b.channel, &mut ev_cq, &mut ev_ctx), 0);
        assert_eq!(ev_cq, b.cq);
        ibv_ack_cq_events(b.cq, 1);
        let got = poll_one(b.cq);
        assert_eq!(
            (got.wr_id, got.status, got.opcode, got.byte_len),
            (77, IBV_WC_SUCCESS, IBV_WC_RECV, 12)
        );
        assert_eq!(got.qp_num, (*b.qp).qp_num);
        assert_eq!(&inbox[at..at + 12], b"inline ping!");
    }
}

/// RDMA Write into the server's memory at its address, gathered from two SGEs; RDMA Read back into
/// another place of the client's memory; then bad use of the data path.
unsafe fn write_read_and_bad_use(a: &Side, b: &Side, out_mr: *mut ibv_mr, inbox_mr: *mut ibv_mr) {
    unsafe {
        let (out, inbox) = ((*out_mr).addr as *const u8, (*inbox_mr).addr as *const u8);
        let bytes = |p: *const u8, r: std::ops::Range<usize>| {
            std::slice::from_raw_parts(p.add(r.start), r.len()).to_vec()
        };
        let sge = |at: usize, length: u32| ibv_sge {
            addr: out as u64 + at as u64,
            length,
            lkey: (*out_mr).lkey,
        };
        let mut wsge = [sge(100, 200), sge(1000, 56)];
        let mut write = send_wr(11, IBV_WR_RDMA_WRITE, &mut wsge, IBV_SEND_SIGNALED);
        write.rdma.remote_addr = inbox as u64 + 3000;
        write.rdma.rkey = (*inbox_mr).rkey;
        assert_eq!(post_send(a.qp, &mut write).0, 0);
        let w = poll_one(a.cq);
        assert_eq!(
            (w.wr_id, w.status, w.opcode),
            (11, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE)
        );
        let mut rdsge = [sge(2048, 256)];
        let mut read = send_wr(12, IBV_WR_RDMA_READ, &mut rdsge, IBV_SEND_SIGNALED);
        read.rdma.remote_addr = inbox as u64 + 3000;
        read.rdma.rkey = (*inbox_mr).rkey;
        assert_eq!(post_send(a.qp, &mut read).0, 0);
        let r = poll_one(a.cq);
        assert_eq!(
            (r.wr_id, r.status, r.opcode, r.byte_len),
            (12, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, 256)
        );
        let expected: Vec<u8> = [bytes(out, 100..300), bytes(out, 1000..1056)].concat();
        assert_eq!(bytes(out, 2048..2304), expected);
        // The Read's response followed the Write's bytes on the stream: they are in place at the server.
        assert_eq!(bytes(inbox, 3000..3256), expected);

        // Too many SGEs (EINVAL, that request named), an opcode iWARP lacks, an unregistered lkey.
        let mut three = [wsge[0], wsge[1], wsge[0]];
        let mut too_many = send_wr(13, IBV_WR_SEND, &mut three, IBV_SEND_SIGNALED);
        let (rc, bad) = post_send(a.qp, &mut too_many);
        assert_eq!((rc, bad), (libc::EINVAL, &raw mut too_many));
        let mut imm = send_wr(14, IBV_WR_SEND_WITH_IMM, &mut wsge[..1], IBV_SEND_SIGNALED);
        assert_eq!(post_send(a.qp, &mut imm).0, libc::EINVAL);
        // An unregistered lkey, or a region of another PD, is a local protection error that ends the queue
        // pair, as siw's (`siw_qp_sq_proc_tx`): tests/tests/protection.rs's bad-lkey case and the engine's
        // `engine/qp/tests/posting.rs` test it; this connection goes on to the error-state test below.
        // A CQ still in use, a PD with regions: EBUSY.
        assert_eq!(ibv_destroy_cq(a.cq), libc::EBUSY);
        assert_eq!(ibv_dealloc_pd(b.pd), libc::EBUSY);
    }
}

/// A second connection, refused with private data: REJECTED, -ECONNREFUSED, the words reach it.
unsafe fn refused(ch: *mut rdma_event_channel, dst: &mut libc::sockaddr_storage) {
    unsafe {
        let mut refused = null_mut();
        assert_eq!(rdma_create_id(ch, &mut refused, null_mut(), RDMA_PS_TCP), 0);
        resolve(ch, refused, dst);
        assert_eq!(rdma_connect(refused, null_mut()), 0);
        let (offer, _, _, _, _) = expect_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
        let no = b"not today";
        assert_eq!(rdma_reject(offer, no.as_ptr().cast(), no.len() as u8), 0);
        let (id, words, _, _, status) = expect_event(ch, RDMA_CM_EVENT_REJECTED);
        assert_eq!((id, &words[..], status), (refused, &no[..], -libc::ECONNREFUSED));
        assert_eq!(rdma_destroy_id(offer), 0);
        assert_eq!(rdma_destroy_id(refused), 0);
    }
}

/// ibv_modify_qp to ERR ends the connection (as siw does): both sides hear DISCONNECTED, the server's
/// posted Receive (78) is flushed, the queue pair reports ERR; rdma_disconnect after it is a no-op.
unsafe fn error_state_disconnects(
    ch: *mut rdma_event_channel,
    client: *mut rdma_cm_id,
    server: *mut rdma_cm_id,
    a: &Side,
    b: &Side,
) {
    unsafe {
        let mut to_err = ibv_qp_attr {
            qp_state: IBV_QPS_ERR,
            ..ibv_qp_attr::default()
        };
        assert_eq!(ibv_modify_qp(a.qp, &mut to_err, IBV_QP_STATE), 0);
        let (mut qattr, mut qinit): (ibv_qp_attr, ibv_qp_init_attr) =
            (ibv_qp_attr::default(), std::mem::zeroed());
        assert_eq!(ibv_query_qp(a.qp, &mut qattr, IBV_QP_STATE, &mut qinit), 0);
        assert_eq!(
            (qattr.qp_state, qinit.send_cq, qinit.cap.max_inline_data),
            (IBV_QPS_ERR, a.cq, 64)
        );
        assert_eq!(rdma_disconnect(client), 0);
        let mut seen = [
            expect_event(ch, RDMA_CM_EVENT_DISCONNECTED).0,
            expect_event(ch, RDMA_CM_EVENT_DISCONNECTED).0,
        ];
        seen.sort();
        let mut both = [client, server];
        both.sort();
        assert_eq!(seen, both);
        let flushed = poll_one(b.cq);
        assert_eq!((flushed.wr_id, flushed.status), (78, IBV_WC_WR_FLUSH_ERR));
    }
}

#[test]
fn two_queue_pairs_through_the_c_abi() {
    let mut daemon = start_daemon();
    // SAFETY: the libraries' C functions, called as a C program calls them, with live arguments.
    unsafe {
        let other_ctx = device();
        let (ch, listen, client, mut dst) = listen_and_resolve();
        let a = side(client);
        foreign_objects(other_ctx, &a);

        // A Send before the connection: ENOTCONN, the request named.
        let mut out = (0..4096).map(|i| (i % 251) as u8).collect::<Vec<u8>>();
        let out_mr = ibv_reg_mr(a.pd, out.as_mut_ptr().cast(), out.len(), IBV_ACCESS_LOCAL_WRITE);
        assert!(!out_mr.is_null(), "ibv_reg_mr: errno {}", errno());
        let mut sge = [ibv_sge {
            addr: out.as_ptr() as u64,
            length: 8,
            lkey: (*out_mr).lkey,
        }];
        let mut early = send_wr(1, IBV_WR_SEND, &mut sge, IBV_SEND_SIGNALED);
        let (rc, bad) = post_send(a.qp, &mut early);
        assert_eq!((rc, bad), (libc::ENOTCONN, &raw mut early));

        let mut inbox = vec![0u8; 4096];
        let (server, b, inbox_mr) = connect(ch, client, &mut inbox);
        inline_send_wakes_the_channel(&a, &b, &inbox, 1024);
        write_read_and_bad_use(&a, &b, out_mr, inbox_mr);
        refused(ch, &mut dst);
        error_state_disconnects(ch, client, server, &a, &b);

        // Teardown in rdma-core's order.
        for (s, id) in [(&a, client), (&b, server)] {
            rdma_destroy_qp(id);
            assert_eq!(ibv_destroy_cq(s.cq), 0);
            assert_eq!(ibv_destroy_comp_channel(s.channel), 0);
            assert_eq!(rdma_destroy_id(id), 0);
        }
        assert_eq!(ibv_dereg_mr(out_mr), 0);
        assert_eq!(ibv_dereg_mr(inbox_mr), 0);
        assert_eq!(ibv_dereg_mr(inbox_mr), libc::EINVAL, "a region freed twice");
        for pd in [a.pd, b.pd] {
            assert_eq!(ibv_dealloc_pd(pd), 0);
        }
        assert_eq!(rdma_destroy_id(listen), 0);
        rdma_destroy_event_channel(ch);

        // soft-rdmad goes away: DEVICE_FATAL on the async fd, the port down, registration refused.
        let _ = daemon.child.kill();
        let _ = daemon.child.wait();
        let mut event: ibv_async_event = std::mem::zeroed();
        assert_eq!(ibv_get_async_event(other_ctx, &mut event), 0);
        assert_eq!(event.event_type, IBV_EVENT_DEVICE_FATAL);
        ibv_ack_async_event(&mut event);
        let mut port: ibv_port_attr = std::mem::zeroed();
        assert_eq!(ibv_query_port(other_ctx, 1, &mut port), 0);
        assert_eq!(port.state, IBV_PORT_DOWN);
        // Every command now fails as uverbs fails them after a disassociation: EIO.
        assert!(ibv_alloc_pd(other_ctx).is_null(), "no PD without soft-rdmad");
        assert_eq!(errno(), libc::EIO);
        assert!(ibv_create_cq(other_ctx, 4, std::ptr::null_mut(), std::ptr::null_mut(), 0).is_null());
        assert_eq!(errno(), libc::EIO);
        assert_eq!(ibv_close_device(other_ctx), 0);
    }
}
