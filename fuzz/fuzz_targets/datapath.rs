//! One queue pair's data path (soft_rdma::engine::qp) fed an arbitrary byte stream as FPDUs (framed with
//! FpduRepr::frame_len, max ULPDU 1448): every parsed message goes to `on_message` until one terminates the
//! stream, and the queue pair transmits in between (Read Responses, queued Sends). Never panics, and after the
//! final flush every posted work request has completed exactly once.
#![no_main]
use libfuzzer_sys::fuzz_target;
use soft_rdma::NdStatus;
use soft_rdma::engine::memory::{MemoryRegistry, VecMemory};
use soft_rdma::engine::qp::{QpParams, QueuePair};
use soft_rdma::engine::requests::*;
use soft_rdma::engine::verbs::*;
use soft_rdma_common::wire::fpdu::FpduRepr;
use soft_rdma_common::wire::rdmap::MessageRepr;

const MAX_ULPDU: usize = 1448;

fuzz_target!(|data: &[u8]| {
    // First byte: bit 0 CRC on the transmit side, bits 1-3 transmit budget, bits 4-7 IRD.
    let Some((&mode, data)) = data.split_first() else {
        return;
    };
    let session = SessionId(1);
    // A fixed key seed, so the STags are the same on every run (seeds in the corpus can name them).
    let mut mem = MemoryRegistry::new(0);
    let (_, rw) = mem
        .register(session.into(), Box::new(VecMemory::new(4096)), Access::ALL, 0)
        .unwrap();
    let (_, local) = mem
        .register(session.into(), Box::new(VecMemory::new(1024)), Access::LOCAL_WRITE, 0)
        .unwrap();
    let (_, remote) = mem
        .register(
            session.into(),
            Box::new(VecMemory::new(1024)),
            Access::REMOTE_READ | Access::REMOTE_WRITE,
            // Addressed from a virtual address, as a C program's region: tagged offsets below it are outside.
            0x7f00_0000_0000,
        )
        .unwrap();
    let (_, _foreign) = mem
        .register(SessionId(2).into(), Box::new(VecMemory::new(1024)), Access::ALL, 0)
        .unwrap();
    let config = QueuePairConfig {
        send_cq: CompletionQueueId(1),
        receive_cq: CompletionQueueId(2),
        send_depth: 16,
        receive_depth: 16,
        max_send_sge: 4,
        max_receive_sge: 4,
        pd: Default::default(),
    };
    let mut qp = QueuePair::new(QueuePairId(1), session, config);
    let mut out = Vec::new();
    let mut posted = Vec::new();
    let mut post = |qp: &mut QueuePair, mem: &MemoryRegistry, out: &mut Vec<_>, wr: WorkRequest| {
        posted.push(wr.id());
        qp.post(wr, mem, out);
    };
    for i in 0..4u64 {
        let sgl = vec![
            Sge {
                stag: rw,
                offset: i * 512,
                length: 300,
            },
            Sge {
                stag: local,
                offset: i * 256,
                length: 212,
            },
        ];
        post(&mut qp, &mem, &mut out, WorkRequest::Receive { id: i, sgl });
    }
    qp.connect(QpParams {
        crc: mode & 1 != 0,
        max_ulpdu: MAX_ULPDU,
        ird: u32::from(mode >> 4),
        ord: 2,
    });
    // Outstanding Reads, so inbound Read Responses have an ORQ to match (sinks: `rw` at 2048, zero-length).
    let peer = RemoteBuffer {
        stag: Stag(0x0100_0000),
        offset: 0,
    };
    post(
        &mut qp,
        &mem,
        &mut out,
        WorkRequest::Read {
            id: 10,
            sink: Sge {
                stag: rw,
                offset: 2048,
                length: 2000,
            },
            remote: peer,
            silent: false,
        },
    );
    post(
        &mut qp,
        &mem,
        &mut out,
        WorkRequest::Read {
            id: 11,
            sink: Sge {
                stag: Stag(0),
                offset: 0,
                length: 0,
            },
            remote: peer,
            silent: false,
        },
    );
    post(
        &mut qp,
        &mem,
        &mut out,
        WorkRequest::Send {
            id: 12,
            sgl: vec![Sge {
                stag: remote,
                offset: 0,
                length: 1024,
            }],
            solicited: true,
            invalidate: Some(Stag(0x200)),
            silent: false,
        },
    );
    post(
        &mut qp,
        &mem,
        &mut out,
        WorkRequest::Write {
            id: 13,
            sgl: vec![Sge {
                stag: rw,
                offset: 0,
                length: 3000,
            }],
            remote: peer,
            silent: false,
        },
    );
    let budget = usize::from((mode >> 1) & 7) * 700 + 1;
    let mut tx = Vec::new();
    qp.poll_transmit(&mem, 1 << 16, &mut tx, &mut out);
    let mut rest = data;
    loop {
        let len = match FpduRepr::frame_len(rest, MAX_ULPDU) {
            Ok(Some(len)) if len <= rest.len() => len,
            _ => break,
        };
        let (frame, tail) = rest.split_at(len);
        rest = tail;
        // The connection manager checks the CRC; the fuzzer rarely would get one right, so none is checked here.
        let Ok(f) = FpduRepr::parse(frame, MAX_ULPDU) else {
            break;
        };
        let Ok(msg) = MessageRepr::parse(f.ulpdu) else {
            break;
        };
        if qp.on_message(&msg, &mut mem, None, &mut out).is_err() {
            break;
        }
        tx.clear();
        qp.poll_transmit(&mem, budget, &mut tx, &mut out);
    }
    qp.flush(NdStatus::Canceled, &mut out);
    let mut done: Vec<u64> = out.iter().map(|(_, c)| c.wr_id).collect();
    done.sort_unstable();
    posted.sort_unstable();
    assert_eq!(done, posted, "every work request completes exactly once");
});
