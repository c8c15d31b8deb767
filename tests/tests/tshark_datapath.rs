//! Real daemon traffic read by an independent dissector: two soft-rdmad daemons in a netns pair, tshark
//! capturing on A's veth while the client library connects a queue pair (MPA Rev 2, peer-to-peer RTR) and does
//! one of every operation — Send, Send with Solicited Event, Send with Invalidate, a multi-FPDU RDMA Write and
//! RDMA Read — then disconnects. The capture must decode in Wireshark's `iwarp_mpa` / `iwarp_ddp_rdmap`
//! dissectors with one MPA Request and Reply, exactly the FPDUs those operations imply (opcode, direction,
//! L bit, STag/TO, queue/MSN/MO, the Read Request header), every TCP payload byte inside a decoded MPA frame,
//! no malformed frame and no expert note beyond the two tshark 4.0 raises for every Rev 2 frame; with CRC
//! required on both daemons, tshark must find every FPDU's CRC32c good. Needs root and tshark.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use soft_rdma::client::{CompletionOp, QueuePairState, ReadLimits};
use soft_rdma_common::wire::ddp::{TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN};
use soft_rdma_common::wire::fpdu::max_ulpdu_for;
use soft_rdma_common::wire::rdmap::{READ_REQUEST_LEN, RdmapOpcode};
use soft_rdma_tests::ends::{End, assert_steered_as, listen_and_connect_ok, steering};
use soft_rdma_tests::ops::{assert_ok, completions, pattern, within};
use soft_rdma_tests::{Daemon, Side, TestNet};

const PORT: u16 = 7310;

/// The MSS on the test veth (MTU 1500): every FPDU must fit one segment (RFC 5044 §4.1). Kernel TCP on both
/// ends, and soft-rdma's own TCP (the XDP transport's default), negotiate timestamps (12 bytes of options
/// per segment: 1448); smoltcp's socket (`SOFT_RDMA_TEST_XDP_TCP=smoltcp`) offers none, so a connection with
/// an XDP end on it has 1460.
fn mss() -> usize {
    let smoltcp = std::env::var("SOFT_RDMA_TEST_XDP_TCP").as_deref() == Ok("smoltcp");
    if capture_side() == Side::B && smoltcp {
        1460
    } else {
        1448
    }
}

/// Expert notes tshark 4.0 (pre-RFC 6581) raises for MPA Rev 2 frames: expected (docs/iwarp-wire.md §6).
const EXPECTED_REV2_NOTES: [&str; 2] = [
    "Rev field is NOT set to one as required by RFC 5044",
    "Res field is NOT set to zero as required by RFC 5044",
];

// What the test does (sizes and offsets chosen so that a wrong length, offset or STag shows).
const SEND_LEN: usize = 100;
/// Spans two FPDUs: the second carries MO = the first's payload.
const SEND_SE_LEN: usize = 2000;
const SEND_INV_LEN: usize = 64;
const WRITE_LEN: usize = 5000;
const WRITE_TO: u64 = 333;
const READ_LEN: usize = 5000;
const READ_SINK_TO: u64 = 45;
const READ_SOURCE_TO: u64 = 777;
const REGION: usize = 8192;

// ---------------------------------------------------------------------------------------------------------
// The capture.

/// A in kernel mode: capture on A. With XDP in the test configuration: A runs over XDP, the capture on B.
fn capture_side() -> Side {
    match soft_rdma_tests::test_transport().expect("SOFT_RDMA_TEST_TRANSPORT") {
        soft_rdma_tests::TestTransport::Kernel => Side::A,
        _ => Side::B,
    }
}

/// tshark writing A's veth to a pcap; stopped with SIGINT (so it flushes) when stopped or dropped. If the test
/// panics, the capture is kept under the temporary directory (the namespace directory is deleted).
struct Capture {
    child: Option<Child>,
    pcap: PathBuf,
    log: PathBuf,
    name: String,
}

impl Capture {
    fn start(net: &TestNet, name: &str) -> Capture {
        let pcap = net.dir().join(format!("{name}.pcap"));
        let log = net.dir().join(format!("{name}.tshark.log"));
        // AF_XDP traffic bypasses the packet taps of its own side: with an XDP daemon the capture runs on the
        // kernel-TCP side's veth (the frames on the wire are the same).
        let side = capture_side();
        let child = net
            .command(side, "tshark")
            .args(["-i", &net.dev(side), "-f", &format!("tcp port {PORT}")])
            .args(["-F", "pcap", "-w"])
            .arg(&pcap)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run tshark ({e}); install it with `cargo xtask setup`"));
        let mut c = Capture {
            child: Some(child),
            pcap,
            log,
            name: name.to_owned(),
        };
        // tshark says "Capturing on '<dev>'" once dumpcap has the interface open; the pcap header is then
        // written. Packets sent before that would be missing (and the MPA dissector needs the handshake).
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let said = std::fs::read_to_string(&c.log).unwrap_or_default();
            let header = std::fs::metadata(&c.pcap).is_ok_and(|m| m.len() >= 24);
            if said.contains("Capturing on") && header {
                break;
            }
            if let Some(status) = c.child.as_mut().unwrap().try_wait().unwrap() {
                c.child = None;
                panic!("tshark exited ({status}) before capturing:\n{said}");
            }
            assert!(
                Instant::now() < deadline,
                "tshark did not start capturing in 20 s:\n{said}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(200));
        c
    }

    /// SIGINT, then wait (up to 10 s, then SIGKILL); returns tshark's stderr.
    fn stop(&mut self) -> String {
        if let Some(mut child) = self.child.take() {
            // `ip netns exec` execs tshark: the child's pid is tshark's. tshark stops its dumpcap on SIGINT.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGINT,
            );
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let log = self.stop();
        if std::thread::panicking() {
            let kept = std::env::temp_dir().join(format!(
                "soft-rdma-tshark-datapath-{}-{}.pcap",
                self.name,
                std::process::id()
            ));
            if std::fs::copy(&self.pcap, &kept).is_ok() {
                eprintln!("capture kept at {} (tshark said: {})", kept.display(), log.trim());
            }
        }
    }
}

fn tshark(pcap: &Path, args: &[&str]) -> String {
    soft_rdma_tests::tshark(pcap, args).unwrap_or_else(|e| panic!("{e:#}"))
}

// ---------------------------------------------------------------------------------------------------------
// Driving the daemons (as data_path.rs).

async fn end(d: &Daemon) -> End {
    End::open(d.uds_path(), 256, 64).await
}

const LIMITS: ReadLimits = ReadLimits {
    inbound: 4,
    outbound: 4,
};

/// What the test posted, for checking the wire against.
struct Posted {
    a_ip: String,
    b_ip: String,
    invalidated: u32,
    write_stag: u32,
    read_sink_stag: u32,
    read_source_stag: u32,
}

/// Everything the capture should show, done with byte-for-byte verification. The returned net and capture
/// must outlive the decode (the pcap is in the net's directory).
async fn exercise(tag: &str, daemon_args: &[&str]) -> (TestNet, Capture, Posted) {
    let net = TestNet::new(tag).expect("netns pair");
    let mut capture = Capture::start(&net, tag);
    // Kernel TCP on both sides, or (SOFT_RDMA_TEST_TRANSPORT=xdp or mixed) A over XDP and B over kernel TCP,
    // where the capture runs.
    let a_xdp = capture_side() == Side::B;
    let da = net
        .spawn_daemon_over(Side::A, a_xdp, daemon_args)
        .expect("daemon A");
    let db = net
        .spawn_daemon_over(Side::B, false, daemon_args)
        .expect("daemon B");
    let (a, b) = (end(&da).await, end(&db).await);

    // B's buffers: three inboxes, posted before it accepts (data may arrive as soon as it does), a region
    // A will invalidate, the Write target and the Read source.
    let inbox = b.register(REGION).await;
    let exposed = b.register(4096).await;
    // The three Sends, in order: (what, bytes, offset in the inbox, solicited, the STag to invalidate).
    let sends = [
        ("Send", SEND_LEN, 0, false, None),
        ("Send with SE", SEND_SE_LEN, 1024, true, None),
        (
            "Send with Invalidate",
            SEND_INV_LEN,
            4096,
            false,
            Some(exposed.stag()),
        ),
    ];
    for (i, &(_, len, at, ..)) in sends.iter().enumerate() {
        b.qp.receive(1 + i as u64, &[inbox.sge(at as u64, len as u32)])
            .unwrap();
    }
    let target = b.register(REGION).await;
    let source = b.register(REGION).await;
    let local = a.register(REGION).await;
    let sink = a.register(REGION).await;

    // Connect A → B with the defaults (MPA Rev 2, peer-to-peer: A sends the RTR).
    let remote = net.addr(Side::B, PORT);
    let before = (steering(&a.adapter).await, steering(&b.adapter).await);
    listen_and_connect_ok(&a, &b, remote, (LIMITS, LIMITS)).await;
    // With the XDP test transport A's connection went through its XDP program, not a fallback.
    assert_steered_as(&a.adapter, a_xdp, "daemon A", before.0).await;
    assert_steered_as(&b.adapter, false, "daemon B", before.1).await;

    // The Sends: A's completes, B's Receive gets the bytes with the Solicited Event flag and the invalidated
    // STag the Send carried.
    for (i, (what, len, at, solicited, invalidate)) in sends.into_iter().enumerate() {
        let data = pattern(len, 1 + i as u8);
        local.write_at(0, &data).unwrap();
        let i = i as u64;
        a.qp.send_with(10 + i, &[local.sge(0, len as u32)], solicited, invalidate)
            .unwrap();
        assert_ok(
            &completions(&a.cq, 1).await[0],
            10 + i,
            CompletionOp::Send,
            len as u32,
        );
        let got = completions(&b.cq, 1).await;
        assert_ok(&got[0], 1 + i, CompletionOp::Receive, len as u32);
        assert_eq!(
            (got[0].solicited, got[0].invalidated),
            (solicited, invalidate),
            "{what}: {got:?}"
        );
        assert_eq!(inbox.to_vec(at, len).unwrap(), data, "{what}");
    }

    // RDMA Write, several FPDUs.
    let data = pattern(WRITE_LEN, 4);
    local.write_at(0, &data).unwrap();
    a.qp.write(13, &[local.sge(0, WRITE_LEN as u32)], target.remote(WRITE_TO))
        .unwrap();
    assert_ok(
        &completions(&a.cq, 1).await[0],
        13,
        CompletionOp::Write,
        WRITE_LEN as u32,
    );

    // RDMA Read, several Read Responses. (Its completion also says the Write before it was placed: B
    // handles the stream in order.)
    let data = pattern(READ_LEN, 5);
    source.write_at(READ_SOURCE_TO as usize, &data).unwrap();
    a.qp.read(
        14,
        sink.sge(READ_SINK_TO, READ_LEN as u32),
        source.remote(READ_SOURCE_TO),
    )
    .unwrap();
    assert_ok(
        &completions(&a.cq, 1).await[0],
        14,
        CompletionOp::Read,
        READ_LEN as u32,
    );
    assert_eq!(
        sink.to_vec(READ_SINK_TO as usize, READ_LEN).unwrap(),
        data,
        "Read"
    );
    assert_eq!(
        target.to_vec(WRITE_TO as usize, WRITE_LEN).unwrap(),
        pattern(WRITE_LEN, 4),
        "Write"
    );
    assert!(
        b.cq.poll(16).is_empty(),
        "one-sided operations complete nothing on B"
    );

    // Disconnect; wait until B saw it (the FINs are in the capture).
    within("disconnect", a.connector.disconnect()).await.unwrap();
    within("peer disconnect", async {
        while b.qp.query().await.unwrap().state == QueuePairState::Connected {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = capture.stop();
    assert!(
        std::fs::metadata(&capture.pcap).is_ok_and(|m| m.len() > 24),
        "empty capture; tshark said:\n{log}"
    );
    let posted = Posted {
        a_ip: net.ipv4(Side::A).to_string(),
        b_ip: net.ipv4(Side::B).to_string(),
        invalidated: exposed.stag().0,
        write_stag: target.stag().0,
        read_sink_stag: sink.stag().0,
        read_source_stag: source.stag().0,
    };
    drop((a, b, inbox, exposed, target, source, local, sink, da, db));
    (net, capture, posted)
}

// ---------------------------------------------------------------------------------------------------------
// Reading tshark's decode.

fn parse_u64(s: &str) -> u64 {
    soft_rdma_tests::capture::number(s).unwrap_or_else(|| panic!("bad number {s:?}"))
}

fn parse_bool(s: &str) -> bool {
    match s.trim() {
        "1" | "True" | "true" => true,
        "0" | "False" | "false" => false,
        other => panic!("bad boolean {other:?}"),
    }
}

/// The fields asked of tshark, in column order.
const FIELDS: [&str; 29] = [
    "frame.number",
    "ip.src",
    "tcp.len",
    "frame.protocols",
    "iwarp_mpa.key.req",
    "iwarp_mpa.key.rep",
    "iwarp_mpa.rev",
    "iwarp_mpa.crc_flag",
    "iwarp_mpa.pdlength",
    "iwarp_mpa.ulpdulength",
    "iwarp_mpa.crc",
    "iwarp_rdma.opcode",
    "iwarp_ddp.last_flag",
    "iwarp_ddp.tagged_flag",
    "iwarp_ddp.stag",
    "iwarp_ddp.tagged_offset",
    "iwarp_ddp.qn",
    "iwarp_ddp.msn",
    "iwarp_ddp.mo",
    "iwarp_rdma.inval_stag",
    "iwarp_rdma.sinkstag",
    "iwarp_rdma.sinkto",
    "iwarp_rdma.rdmardsz",
    "iwarp_rdma.srcstag",
    "iwarp_rdma.srcto",
    // With CRC, tshark shows the received CRC as `crc_check` (with its verdict) instead of `crc`.
    "iwarp_mpa.crc_check",
    "iwarp_ddp.dv",
    "iwarp_rdma.version",
    // Untagged: the RDMAP control byte and the 4-byte Invalidate STag / reserved word (RFC 5040 §4.1).
    "iwarp_ddp.rsvdulp",
];

/// One MPA Request or Reply.
#[derive(Debug)]
struct Handshake {
    frame: u64,
    from_a: bool,
    request: bool,
    rev: u64,
    crc_flag: bool,
    /// The MPA frame's length on the wire (20-byte header + private data).
    wire_len: usize,
}

/// One FPDU as tshark decoded it.
#[derive(Debug, Clone)]
struct Fpdu {
    frame: u64,
    from_a: bool,
    ulpdu_len: usize,
    crc: u64,
    opcode: RdmapOpcode,
    last: bool,
    /// DDP and RDMAP versions (RFC 5041 §4.2, RFC 5040 §4.1: both 1).
    versions: (u8, u8),
    /// Tagged: (STag, TO).
    tagged: Option<(u32, u64)>,
    /// Untagged: (QN, MSN, MO).
    untagged: Option<(u32, u32, u32)>,
    /// Untagged: the RDMAP control byte and the word after it, raw (the Invalidate STag for opcodes 4 and 6,
    /// else reserved, zero).
    ulp: Option<(u8, u32)>,
    /// Send with Invalidate: the STag, as tshark names it.
    inval_stag: Option<u32>,
    /// Read Request: sink STag, sink TO, size, source STag, source TO.
    read_request: Option<(u32, u64, u32, u32, u64)>,
}

impl Fpdu {
    /// Length on the wire: MPA length, ULPDU, pad to 4, CRC (RFC 5044 §4).
    fn wire_len(&self) -> usize {
        (2 + self.ulpdu_len).next_multiple_of(4) + 4
    }
    fn payload(&self) -> usize {
        let hdr = if self.tagged.is_some() {
            TAGGED_HEADER_LEN
        } else {
            UNTAGGED_HEADER_LEN
        };
        self.ulpdu_len - hdr
    }
}

struct Decoded {
    handshakes: Vec<Handshake>,
    fpdus: Vec<Fpdu>,
    /// TCP payload bytes per direction (A→B, B→A), and the bytes tshark placed in MPA frames.
    tcp_bytes: (usize, usize),
    mpa_bytes: (usize, usize),
}

fn decode(pcap: &Path, posted: &Posted, crc_on: bool, text: &mut String) -> Decoded {
    // Retransmitted segments would be counted twice (veth does not lose packets, but be exact).
    *text = soft_rdma_tests::capture::fields(pcap, "tcp && !tcp.analysis.retransmission", &FIELDS, '|')
        .unwrap_or_else(|e| panic!("{e:#}"));
    let mut d = Decoded {
        handshakes: vec![],
        fpdus: vec![],
        tcp_bytes: (0, 0),
        mpa_bytes: (0, 0),
    };
    for line in text.lines() {
        let row: Vec<&str> = line.split('|').collect();
        assert_eq!(row.len(), FIELDS.len(), "row {line:?}");
        let list = |i: usize| -> Vec<&str> {
            if row[i].is_empty() {
                vec![]
            } else {
                row[i].split(',').collect()
            }
        };
        let frame = parse_u64(row[0]);
        let from_a = if row[1] == posted.a_ip {
            true
        } else {
            assert_eq!(row[1], posted.b_ip, "frame {frame}: a stranger's packet");
            false
        };
        let tcp_len = parse_u64(row[2]) as usize;
        *if from_a {
            &mut d.tcp_bytes.0
        } else {
            &mut d.tcp_bytes.1
        } += tcp_len;
        let mut mpa = 0;
        // Handshake frames: one key field per Request/Reply.
        for (col, request) in [(4, true), (5, false)] {
            for _ in list(col) {
                let (rev, crc, pd) = (list(6), list(7), list(8));
                assert!(
                    rev.len() == 1 && crc.len() == 1 && pd.len() == 1,
                    "frame {frame}: one MPA Request/Reply per segment: {line}"
                );
                let h = Handshake {
                    frame,
                    from_a,
                    request,
                    rev: parse_u64(rev[0]),
                    crc_flag: parse_bool(crc[0]),
                    wire_len: 20 + parse_u64(pd[0]) as usize,
                };
                mpa += h.wire_len;
                d.handshakes.push(h);
            }
        }
        // FPDUs: the per-FPDU fields come in FPDU order; the tagged-only, untagged-only, Send with
        // Invalidate and Read Request fields in order among the FPDUs that have them.
        let (ulen, opc, last, tagged) = (list(9), list(11), list(12), list(13));
        let (dv, rv) = (list(26), list(27));
        let (crc, other) = if crc_on {
            (list(25), list(10))
        } else {
            (list(10), list(25))
        };
        assert!(
            other.is_empty(),
            "frame {frame}: CRC shown as {} with CRC {}: {line}",
            if crc_on { "unchecked" } else { "checked" },
            if crc_on { "on" } else { "off" }
        );
        assert!(
            [crc.len(), opc.len(), last.len(), tagged.len(), dv.len(), rv.len()]
                .iter()
                .all(|n| *n == ulen.len()),
            "frame {frame}: every FPDU has a length, CRC field, opcode, L and T bit, versions: {line}"
        );
        let (mut stag, mut to) = (list(14).into_iter(), list(15).into_iter());
        let (mut qn, mut msn, mut mo) = (list(16).into_iter(), list(17).into_iter(), list(18).into_iter());
        let mut inval = list(19).into_iter();
        let mut ulp = list(28).into_iter();
        let mut rr: Vec<_> = (20..25).map(|i| list(i).into_iter()).collect();
        for i in 0..ulen.len() {
            let opcode = RdmapOpcode::from_u8(parse_u64(opc[i]) as u8)
                .unwrap_or_else(|e| panic!("frame {frame}: FPDU {i}: {e:?}: {line}"));
            let is_tagged = parse_bool(tagged[i]);
            let next = |it: &mut std::vec::IntoIter<&str>, what: &str| {
                parse_u64(
                    it.next()
                        .unwrap_or_else(|| panic!("frame {frame}: FPDU {i} has no {what}: {line}")),
                )
            };
            let f = Fpdu {
                frame,
                from_a,
                ulpdu_len: parse_u64(ulen[i]) as usize,
                crc: parse_u64(crc[i]),
                opcode,
                last: parse_bool(last[i]),
                versions: (parse_u64(dv[i]) as u8, parse_u64(rv[i]) as u8),
                tagged: is_tagged.then(|| (next(&mut stag, "STag") as u32, next(&mut to, "TO"))),
                untagged: (!is_tagged).then(|| {
                    (
                        next(&mut qn, "QN") as u32,
                        next(&mut msn, "MSN") as u32,
                        next(&mut mo, "MO") as u32,
                    )
                }),
                ulp: (!is_tagged).then(|| {
                    let hex = ulp
                        .next()
                        .unwrap_or_else(|| panic!("frame {frame}: FPDU {i} has no ULP field: {line}"));
                    assert_eq!(hex.len(), 10, "frame {frame}: FPDU {i}: ULP field {hex:?}");
                    let v = u64::from_str_radix(hex, 16).unwrap();
                    ((v >> 32) as u8, v as u32)
                }),
                inval_stag: opcode
                    .carries_invalidate_stag()
                    .then(|| next(&mut inval, "Invalidate STag") as u32),
                read_request: (opcode == RdmapOpcode::RdmaReadRequest).then(|| {
                    (
                        next(&mut rr[0], "sink STag") as u32,
                        next(&mut rr[1], "sink TO"),
                        next(&mut rr[2], "read size") as u32,
                        next(&mut rr[3], "source STag") as u32,
                        next(&mut rr[4], "source TO"),
                    )
                }),
            };
            mpa += f.wire_len();
            d.fpdus.push(f);
        }
        assert!(
            stag.next().is_none()
                && qn.next().is_none()
                && inval.next().is_none()
                && ulp.next().is_none()
                && rr[0].next().is_none(),
            "frame {frame}: DDP/RDMAP fields left over after its FPDUs: {line}"
        );
        *if from_a {
            &mut d.mpa_bytes.0
        } else {
            &mut d.mpa_bytes.1
        } += mpa;
    }
    d
}

/// FPDUs a message of `len` payload bytes takes with a `hdr`-byte DDP header, at the MSS's MULPDU.
fn segments(len: usize, hdr: usize) -> usize {
    len.div_ceil(max_ulpdu_for(mss()) - hdr).max(1)
}

/// Checks the segments of one message: opcode, direction, L on the last only, sizes adding up, each full but
/// the last, and (tagged) consecutive TOs from `to` into `stag`, or (untagged) queue, one MSN and MOs from 0.
fn check_message(what: &str, segs: &[Fpdu], from_a: bool, len: usize, place: Placement) {
    let hdr = match place {
        Placement::Tagged { .. } => TAGGED_HEADER_LEN,
        Placement::Untagged { .. } => UNTAGGED_HEADER_LEN,
    };
    assert_eq!(segs.len(), segments(len, hdr), "{what}: FPDU count: {segs:#?}");
    let mut pos = 0usize;
    for (i, s) in segs.iter().enumerate() {
        let ctx = format!("{what}, FPDU {i} (frame {}): {s:?}", s.frame);
        assert_eq!(s.from_a, from_a, "direction of {ctx}");
        assert_eq!(s.last, i + 1 == segs.len(), "L bit of {ctx}");
        assert!(s.wire_len() <= mss(), "FPDU larger than the MSS: {ctx}");
        if i + 1 < segs.len() {
            assert_eq!(
                s.ulpdu_len,
                max_ulpdu_for(mss()),
                "a segment but the last is full: {ctx}"
            );
        }
        match place {
            Placement::Tagged { stag, to } => {
                assert_eq!(s.tagged, Some((stag, to + pos as u64)), "STag/TO of {ctx}");
            }
            Placement::Untagged { qn, msn } => {
                assert_eq!(s.untagged, Some((qn, msn, pos as u32)), "QN/MSN/MO of {ctx}");
            }
        }
        pos += s.payload();
    }
    assert_eq!(pos, len, "{what}: payload bytes");
}

#[derive(Clone, Copy)]
enum Placement {
    Tagged { stag: u32, to: u64 },
    Untagged { qn: u32, msn: u32 },
}

/// The whole check of one run; `crc` says whether both daemons required CRC.
fn check_capture(pcap: &Path, posted: &Posted, crc: bool) {
    let mut fields = String::new();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        eprintln!("{}", check_fields(pcap, posted, crc, &mut fields));
        check_expert_and_crc(pcap, crc);
    }));
    if let Err(e) = result {
        eprintln!("--- tshark fields ({}) ---\n{}", FIELDS.join(" | "), fields);
        eprintln!("--- tshark summary ---\n{}", tshark(pcap, &[]));
        std::panic::resume_unwind(e);
    }
}

/// Returns a one-line summary of the FPDUs.
fn check_fields(pcap: &Path, posted: &Posted, crc: bool, text: &mut String) -> String {
    let d = decode(pcap, posted, crc, text);

    // The handshake: a Rev 2 Request from A, a Rev 2 Reply from B, CRC as both daemons were configured.
    let hs: Vec<_> = d
        .handshakes
        .iter()
        .map(|h| (h.request, h.from_a, h.rev, h.crc_flag))
        .collect();
    assert_eq!(
        hs,
        [(true, true, 2, crc), (false, false, 2, crc)],
        "one MPA Request (A) and one Reply (B): {:?}",
        d.handshakes
    );
    assert!(
        d.fpdus.iter().all(|f| f.frame > d.handshakes[1].frame),
        "FPDUs only after the Reply"
    );

    // Every TCP payload byte is in an MPA frame tshark decoded (no undecoded data, no FPDU whose length
    // disagrees with the stream).
    assert_eq!(
        d.mpa_bytes, d.tcp_bytes,
        "MPA bytes vs TCP payload bytes (A→B, B→A)"
    );

    // Versions, and the untagged header's RDMAP control byte (version 1, opcode) and Invalidate STag word.
    for f in &d.fpdus {
        assert_eq!(f.versions, (1, 1), "DDP/RDMAP versions of {f:?}");
        if let Some((control, word)) = f.ulp {
            assert_eq!(control, 0x40 | f.opcode as u8, "RDMAP control byte of {f:?}");
            let inval = f.opcode.carries_invalidate_stag();
            assert_eq!(
                Some(word),
                if inval { f.inval_stag } else { Some(0) },
                "Invalidate STag / reserved word of {f:?}"
            );
        }
    }

    // CRC field: zero without CRC (RFC 5044 §4.4), set with it (the value is checked by tshark below).
    for f in &d.fpdus {
        assert_eq!(f.crc != 0, crc, "CRC field of {f:?}");
    }

    // The RTR (RFC 6581 §9): A's first FPDU, zero-length; soft-rdma sends a Write RTR (STag 0, TO 0) or a
    // Read RTR (a Read Request for 0 bytes) by what the responder offered.
    let first = d.fpdus.first().expect("no FPDU decoded");
    assert!(first.from_a && first.last, "the RTR is A's first FPDU: {first:?}");
    let read_rtr = match first.opcode {
        RdmapOpcode::RdmaWrite => {
            assert_eq!(
                (first.ulpdu_len, first.tagged),
                (TAGGED_HEADER_LEN, Some((0, 0))),
                "Write RTR: {first:?}"
            );
            false
        }
        RdmapOpcode::RdmaReadRequest => {
            assert_eq!(
                (first.ulpdu_len, first.untagged, first.read_request),
                (
                    UNTAGGED_HEADER_LEN + READ_REQUEST_LEN,
                    Some((1, 1, 0)),
                    Some((0, 0, 0, 0, 0))
                ),
                "Read RTR: {first:?}"
            );
            true
        }
        _ => panic!("the first FPDU is not an RTR: {first:?}"),
    };
    let rest = &d.fpdus[1..];

    // Per opcode.
    let count = |o: RdmapOpcode| rest.iter().filter(|f| f.opcode == o).count();
    let by_op = |o: RdmapOpcode| rest.iter().filter(|f| f.opcode == o).cloned().collect::<Vec<_>>();
    let counts: Vec<(u8, usize)> = RdmapOpcode::ALL.iter().map(|&o| (o as u8, count(o))).collect();
    let summary = format!(
        "{}: RTR = zero-length {}, then FPDUs per RDMAP opcode: {}",
        if crc { "CRC" } else { "no CRC" },
        if read_rtr { "Read Request" } else { "Write" },
        counts
            .iter()
            .map(|(o, n)| format!("{o}:{n}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    assert_eq!(count(RdmapOpcode::Terminate), 0, "no Terminate");
    assert_eq!(
        count(RdmapOpcode::SendWithSolicitedEventAndInvalidate),
        0,
        "no Send with SE and Invalidate"
    );

    // Sends: queue 0, MSNs 1, 2, 3 (the RTR is not a Send), MOs from 0; the Send with SE spans FPDUs. The Write:
    // at least 4 FPDUs into B's target at its TO. The Read Responses: at least 4 from B into A's sink STag, the
    // last with L. (what, opcode, from A, bytes, placement, at least this many FPDUs)
    let messages = [
        (
            "Send",
            RdmapOpcode::Send,
            true,
            SEND_LEN,
            Placement::Untagged { qn: 0, msn: 1 },
            1,
        ),
        (
            "Send with SE",
            RdmapOpcode::SendWithSolicitedEvent,
            true,
            SEND_SE_LEN,
            Placement::Untagged { qn: 0, msn: 2 },
            2,
        ),
        (
            "Send with Invalidate",
            RdmapOpcode::SendWithInvalidate,
            true,
            SEND_INV_LEN,
            Placement::Untagged { qn: 0, msn: 3 },
            1,
        ),
        (
            "RDMA Write",
            RdmapOpcode::RdmaWrite,
            true,
            WRITE_LEN,
            Placement::Tagged {
                stag: posted.write_stag,
                to: WRITE_TO,
            },
            4,
        ),
        (
            "RDMA Read Response",
            RdmapOpcode::RdmaReadResponse,
            false,
            READ_LEN,
            Placement::Tagged {
                stag: posted.read_sink_stag,
                to: READ_SINK_TO,
            },
            4,
        ),
    ];
    let mut fpdus = 0;
    for (what, opcode, from_a, len, place, at_least) in messages {
        let segs = by_op(opcode);
        assert!(
            segs.len() >= at_least,
            "a {len}-byte {what} takes at least {at_least} FPDUs: {segs:#?}"
        );
        check_message(what, &segs, from_a, len, place);
        fpdus += segs.len();
    }
    assert_eq!(
        by_op(RdmapOpcode::SendWithInvalidate)[0].inval_stag,
        Some(posted.invalidated),
        "the invalidated STag"
    );

    // The Read: one Request on queue 1 (MSN 2 after a Read RTR, else 1) with the posted STags, TOs and size.
    let rr = by_op(RdmapOpcode::RdmaReadRequest);
    assert_eq!(rr.len(), 1, "one Read Request: {rr:#?}");
    let r = &rr[0];
    assert!(r.from_a && r.last, "{r:?}");
    assert_eq!(r.ulpdu_len, UNTAGGED_HEADER_LEN + READ_REQUEST_LEN, "{r:?}");
    assert_eq!(
        r.untagged,
        Some((1, 1 + read_rtr as u32, 0)),
        "Read Request QN/MSN/MO: {r:?}"
    );
    assert_eq!(
        r.read_request,
        Some((
            posted.read_sink_stag,
            READ_SINK_TO,
            READ_LEN as u32,
            posted.read_source_stag,
            READ_SOURCE_TO
        )),
        "Read Request header (sink STag, sink TO, size, source STag, source TO)"
    );
    assert!(
        by_op(RdmapOpcode::RdmaReadResponse)[0].frame > r.frame,
        "the Responses follow the Request"
    );
    assert_eq!(rest.len(), fpdus + 1, "no other FPDU");
    // B sends nothing but Read Responses after its Reply.
    assert!(
        d.fpdus
            .iter()
            .filter(|f| !f.from_a)
            .all(|f| f.opcode == RdmapOpcode::RdmaReadResponse)
    );
    summary
}

/// No malformed frame; the only iWARP expert notes are the Rev 2 ones; every CRC good (or none checked).
fn check_expert_and_crc(pcap: &Path, crc: bool) {
    let malformed =
        soft_rdma_tests::capture::malformed_or_bad_length_frames(pcap).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(malformed.is_empty(), "malformed frames: {malformed:?}");
    // `-z expert`: sections "Errors (n)", "Warns (n)", "Notes (n)", "Chats (n)", each a table of frequency,
    // group, protocol, summary. The only notes not from TCP (SYN, FIN, ...) must be the two Rev 2 warnings,
    // once on the Request and once on the Reply.
    let expert = tshark(pcap, &["-q", "-z", "expert"]);
    let mut section = String::new();
    let mut iwarp_notes = Vec::new();
    for line in expert.lines() {
        let mut cols = line.split_whitespace();
        let Some(first) = cols.next() else {
            continue;
        };
        let Ok(freq) = first.parse::<u32>() else {
            if line.trim_end().ends_with(')') {
                section = first.to_owned(); // "Errors (n)", "Warns (n)", ...
            }
            continue;
        };
        let (_group, proto) = (cols.next(), cols.next().unwrap_or(""));
        let summary = cols.collect::<Vec<_>>().join(" ");
        assert_ne!(section, "Errors", "tshark reported an error: {line}\n{expert}");
        if proto != "TCP" {
            iwarp_notes.push((section.clone(), proto.to_owned(), summary, freq));
        }
    }
    iwarp_notes.sort();
    let mut expected: Vec<_> = EXPECTED_REV2_NOTES
        .iter()
        .map(|n| ("Warns".to_owned(), "IWARP_MPA".to_owned(), n.to_string(), 2))
        .collect();
    expected.sort();
    assert_eq!(
        iwarp_notes, expected,
        "expert notes other than TCP's: only the Rev 2 pair on the Request and the Reply\n{expert}"
    );

    let tree = tshark(pcap, &["-V"]);
    let fpdus = tshark(pcap, &["-T", "fields", "-e", "iwarp_mpa.ulpdulength"])
        .lines()
        .flat_map(|l| l.split(',').filter(|s| !s.is_empty()))
        .count();
    assert_eq!(tree.matches("Bad CRC32").count(), 0, "tshark found a bad CRC");
    assert_eq!(
        tree.matches("Good CRC32").count(),
        if crc { fpdus } else { 0 },
        "one good CRC per FPDU ({fpdus} FPDUs)"
    );
}

/// A copy of `pcap` with one byte flipped: `at` bytes into the first occurrence of `needle`.
fn mutated(pcap: &Path, needle: &[u8], at: usize, name: &str) -> PathBuf {
    let mut bytes = std::fs::read(pcap).unwrap();
    let pos = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("{name}: bytes to mutate not found in the capture"));
    bytes[pos + at] ^= 0x01;
    let out = pcap.with_file_name(name);
    std::fs::write(&out, bytes).unwrap();
    out
}

/// The checks must be able to fail on this very traffic: one flipped bit on the wire is caught.
fn checks_catch_a_flipped_bit(pcap: &Path, posted: &Posted, crc: bool) {
    let caught = |what: &str, f: &dyn Fn()| {
        eprintln!("self-check: {what} must fail the checks (a panic message below is expected)");
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        assert!(r.is_err(), "the checks did not notice {what}");
    };
    if crc {
        // A payload bit of the Write's second FPDU: only the CRC can tell.
        let data = pattern(WRITE_LEN, 4);
        let bad = mutated(pcap, &data[2000..2032], 5, "bad-crc.pcap");
        caught("a flipped Write payload bit under CRC", &|| {
            check_expert_and_crc(&bad, crc)
        });
    } else {
        // The low bit of the Read Request's size (5000 → 5001): a well-formed frame with a wrong field.
        let mut header = posted.read_sink_stag.to_be_bytes().to_vec();
        header.extend(READ_SINK_TO.to_be_bytes());
        header.extend((READ_LEN as u32).to_be_bytes());
        let bad = mutated(pcap, &header, 15, "bad-size.pcap");
        caught("a Read Request with a wrong size", &|| {
            let _ = check_fields(&bad, posted, crc, &mut String::new());
        });
    }
}

async fn run(tag: &str, crc: bool) {
    let (net, capture, posted) = exercise(tag, if crc { &["--crc-required"] } else { &[] }).await;
    check_capture(&capture.pcap, &posted, crc);
    checks_catch_a_flipped_bit(&capture.pcap, &posted, crc);
    drop(capture);
    drop(net);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_decodes_in_tshark_without_crc() {
    run("tsdp", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_decodes_in_tshark_with_crc_required() {
    run("tsdc", true).await;
}
