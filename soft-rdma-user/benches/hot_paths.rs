//! Micro-benchmarks of soft-rdma's hot pieces (`cargo bench -p soft-rdma-user`):
//!
//! - `fpdu`: FPDU encode (RDMAP/DDP header + payload + MPA length, pad and CRC field) and decode (frame
//!   length, parse, RDMAP parse), with and without CRC32c, for a 64 B payload, a full segment (the largest
//!   ULPDU that fits a 1460 B MSS, what the data path sends) and 16 KiB.
//! - `port_space`: ephemeral port allocate + free, and 1,024 allocations then their release.
//! - `mpa`: one MPA v2 handshake through the two engines (Request with 32 B private data and IRD/ORD, the
//!   responder's offer, Accept, the initiator reading the Reply) and the RTR FPDU.
//! - `qp`: one 64 KiB RDMA Write between two queue-pair engines in memory: post, `poll_transmit` into
//!   FPDUs, cut/parse them and `on_message` at the target (what the connection manager does per stream).
//!
//! Measurement time is short (2 s, 20 samples) so that the whole run stays within a few minutes on 2 cores.
//! These time single pieces in isolation; end-to-end figures against kernel TCP are `cargo xtask bench`'s.

use std::hint::black_box;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use soft_rdma::engine::framing;
use soft_rdma::engine::memory::{MemoryRegistry, VecMemory};
use soft_rdma::engine::mpa::{MpaConfig, MpaInitiator, MpaResponder, ReplyOutcome};
use soft_rdma::engine::port_space::PortSpace;
use soft_rdma::engine::qp::{QpParams, QueuePair};
use soft_rdma::engine::requests::{ReadLimits, SessionId};
use soft_rdma::engine::transport_seam::{ConnectFailure, HostPorts};
use soft_rdma::engine::verbs::{
    Access, Completion, CompletionQueueId, QueuePairConfig, QueuePairId, RemoteBuffer, Sge, WorkRequest,
};
use soft_rdma_common::wire::ddp::{Placement, TAGGED_HEADER_LEN};
use soft_rdma_common::wire::fpdu::{self as wire_fpdu, FpduRepr, max_ulpdu_for};
use soft_rdma_common::wire::rdmap::{MessageRepr, RdmapOpcode};

/// The TCP MSS on a 1500-byte Ethernet path.
const MSS: usize = 1460;

fn configure() -> Criterion {
    Criterion::default()
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500))
        .sample_size(20)
}

fn write_segment(payload: &[u8]) -> MessageRepr<'_> {
    MessageRepr {
        opcode: RdmapOpcode::RdmaWrite,
        last: true,
        placement: Placement::Tagged {
            stag: 0x0100_0042,
            offset: 4096,
        },
        payload,
    }
}

/// What the connection manager does with the front of a stream: cut the first FPDU, check its CRC when
/// `crc`, parse it and its message. Returns the message and the FPDU's length on the wire.
fn decode_first(stream: &[u8], crc: bool) -> (MessageRepr<'_>, usize) {
    let n = FpduRepr::frame_len(stream, u16::MAX as usize)
        .expect("valid")
        .expect("a whole FPDU");
    if crc {
        wire_fpdu::verify_crc(&stream[..n]).expect("CRC matches");
    }
    let f = FpduRepr::parse(&stream[..n], u16::MAX as usize).expect("parses");
    (MessageRepr::parse(f.ulpdu).expect("parses"), n)
}

fn fpdu(c: &mut Criterion) {
    let full = max_ulpdu_for(MSS) - TAGGED_HEADER_LEN;
    let mut g = c.benchmark_group("fpdu");
    for (label, len) in [("64B", 64usize), ("segment", full), ("16KiB", 16 << 10)] {
        let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let msg = write_segment(&payload);
        let ulpdu_len = msg.buffer_len();
        g.throughput(Throughput::Bytes(len as u64));
        for crc in [false, true] {
            let tag = if crc { "crc" } else { "nocrc" };
            // The engine's builder (allocates the ULPDU and the FPDU, as the RTR/Terminate path does).
            g.bench_function(format!("encode_framing/{label}/{tag}"), |b| {
                b.iter(|| framing::fpdu(black_box(&msg), crc).expect("encodes"))
            });
            // Into a reused buffer, as a data path would: header + payload, then length/pad/CRC.
            let mut ulpdu = vec![0u8; ulpdu_len];
            let mut out = vec![0u8; wire_fpdu::fpdu_len(ulpdu_len)];
            g.bench_function(format!("encode_into/{label}/{tag}"), |b| {
                b.iter(|| {
                    black_box(&msg).emit(&mut ulpdu).expect("fits");
                    let f = FpduRepr {
                        ulpdu: &ulpdu,
                        crc: 0,
                    };
                    if crc {
                        f.emit_with_crc(&mut out).expect("fits")
                    } else {
                        f.emit(&mut out).expect("fits")
                    }
                })
            });
            let frame = framing::fpdu(&msg, crc).expect("encodes");
            g.bench_function(format!("decode/{label}/{tag}"), |b| {
                b.iter(|| {
                    let (m, _) = decode_first(black_box(&frame[..]), crc);
                    black_box(m.payload.len())
                })
            });
        }
    }
    g.finish();
}

/// A host whose every port is free (the kernel transport binds a socket here; this measures the engine).
struct FreeHost;

impl HostPorts for FreeHost {
    fn reserve(&mut self, _local: SocketAddr, _shared: bool) -> Result<(), ConnectFailure> {
        Ok(())
    }
    fn release(&mut self, _local: SocketAddr) {}
}

fn port_space(c: &mut Criterion) {
    let any: SocketAddr = "10.0.0.1:0".parse().expect("address");
    let mut g = c.benchmark_group("port_space");
    let mut ps = PortSpace::new();
    let mut host = FreeHost;
    g.bench_function("allocate_free", |b| {
        b.iter(|| {
            let a = ps.bind(black_box(any), false, &mut host).expect("a free port");
            ps.release(a, &mut host);
        })
    });
    g.throughput(Throughput::Elements(1024));
    g.bench_function("allocate_1024_then_free", |b| {
        let mut held = Vec::with_capacity(1024);
        b.iter(|| {
            for _ in 0..1024 {
                held.push(ps.bind(any, false, &mut host).expect("a free port"));
            }
            for a in held.drain(..) {
                ps.release(a, &mut host);
            }
        })
    });
    g.finish();
}

fn mpa(c: &mut Criterion) {
    let config = MpaConfig::default();
    let limits = ReadLimits {
        inbound: 16,
        outbound: 16,
    };
    let pd = [0x5Au8; 32];
    let mut g = c.benchmark_group("mpa");
    let now = Instant::now();
    g.bench_function("handshake_round_trip", |b| {
        b.iter(|| {
            let (mut initiator, request) =
                MpaInitiator::new(&config, limits, black_box(&pd)).expect("request");
            let mut responder = MpaResponder::new(now, &config);
            let offer = responder
                .on_bytes(&request)
                .expect("valid request")
                .expect("complete request");
            let (reply, _negotiated) = offer.accept(&config, limits, &pd).expect("reply");
            match initiator.on_bytes(&reply).expect("valid reply") {
                Some(ReplyOutcome::Accepted { negotiated, .. }) => {
                    let rtr = negotiated.rtr.expect("peer-to-peer: an RTR");
                    black_box(framing::rtr_fpdu(rtr, negotiated.crc))
                }
                other => panic!("not accepted: {other:?}"),
            }
        })
    });
    g.finish();
}

/// One side of an in-memory queue-pair connection.
struct Side {
    qp: QueuePair,
    mem: MemoryRegistry,
    comps: Vec<(CompletionQueueId, Completion)>,
}

impl Side {
    fn new(session: u64) -> Side {
        let config = QueuePairConfig {
            send_cq: CompletionQueueId(1),
            receive_cq: CompletionQueueId(2),
            send_depth: 64,
            receive_depth: 64,
            max_send_sge: 4,
            max_receive_sge: 4,
            pd: Default::default(),
        };
        Side {
            qp: QueuePair::new(QueuePairId(session), SessionId(session), config),
            mem: MemoryRegistry::new(session * 77),
            comps: Vec::new(),
        }
    }
}

fn qp(c: &mut Criterion) {
    const LEN: usize = 64 << 10;
    let mut g = c.benchmark_group("qp");
    g.throughput(Throughput::Bytes(LEN as u64));
    for crc in [false, true] {
        let params = QpParams {
            crc,
            max_ulpdu: max_ulpdu_for(MSS),
            ird: 8,
            ord: 8,
        };
        let mut a = Side::new(1);
        let mut b = Side::new(2);
        let src = VecMemory::new(LEN);
        src.fill_at(0, &(0..LEN).map(|i| (i % 251) as u8).collect::<Vec<_>>());
        let (_, src_stag) = a
            .mem
            .register(SessionId(1).into(), Box::new(src), Access::LOCAL_WRITE, 0)
            .expect("registers");
        let (_, dst_stag) = b
            .mem
            .register(
                SessionId(2).into(),
                Box::new(VecMemory::new(LEN)),
                Access::REMOTE_WRITE,
                0,
            )
            .expect("registers");
        a.qp.connect(params);
        b.qp.connect(params);
        let mut wire = Vec::with_capacity(LEN + LEN / 8);
        let tag = if crc { "crc" } else { "nocrc" };
        g.bench_function(format!("write_64KiB/{tag}"), |bench| {
            bench.iter(|| {
                a.qp.post(
                    WorkRequest::Write {
                        id: 1,
                        sgl: vec![Sge {
                            stag: src_stag,
                            offset: 0,
                            length: LEN as u32,
                        }],
                        remote: RemoteBuffer {
                            stag: dst_stag,
                            offset: 0,
                        },
                        silent: false,
                    },
                    &a.mem,
                    &mut a.comps,
                );
                while a.qp.wants_transmit() {
                    wire.clear();
                    a.qp.poll_transmit(&a.mem, 64 << 10, &mut wire, &mut a.comps);
                    // What the connection manager does with the stream: cut, check, parse, deliver.
                    let mut at = 0;
                    while at < wire.len() {
                        let (m, n) = decode_first(&wire[at..], crc);
                        b.qp.on_message(&m, &mut b.mem, None, &mut b.comps)
                            .expect("placed");
                        at += n;
                    }
                }
                assert_eq!(a.comps.len(), 1, "one Write completion");
                a.comps.clear();
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = configure();
    targets = fpdu, port_space, mpa, qp
}
criterion_main!(benches);
