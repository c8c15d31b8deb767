//! The daemon's side of the shared rings, fed mappings whose every byte a client controls: the consumer of a
//! queue pair's rings (soft_rdma::rings::qp::QpRingReader) and the producer of a completion ring
//! (soft_rdma::rings::cq::CqRingWriter), which reads the client's consumer index. The first input byte sets
//! the rings' depths and the queue pair's SGE bound, the next bytes are copied over the queue pair's mapping
//! (header and entries), and the rest are scribbles (offset, word) made between drains, into the queue
//! pair's mapping or (high bit of the offset) the completion ring's. After each drain every request taken
//! is completed into the completion ring. Never panics; every request handed out passed validation (its
//! SGE count and total length within bounds); once the reader or the writer reports a fault it reports the
//! same one forever.
#![no_main]
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use soft_rdma::engine::verbs::*;
use soft_rdma::rings::cq::{self, CqRingWriter};
use soft_rdma::rings::qp::{QpRingLayout, QpRingReader};
use soft_rdma::shm::SharedMemory;

const MAX_TRANSFER: u32 = 1 << 16;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, data)) = data.split_first() else {
        return;
    };
    // Bits 0-1: send depth 1..=4 (x2), bits 2-3: receive depth, bits 4-6: max SGEs 1..=8, bit 7: drain max 1.
    let send_depth = 2 * (u32::from(mode & 3) + 1);
    let receive_depth = 2 * (u32::from((mode >> 2) & 3) + 1);
    let max_sge = u32::from((mode >> 4) & 7) + 1;
    let drain_max = if mode & 0x80 != 0 { 1 } else { 64 };
    let config = QueuePairConfig {
        send_cq: CompletionQueueId(1),
        receive_cq: CompletionQueueId(1),
        send_depth,
        receive_depth,
        max_send_sge: max_sge,
        max_receive_sge: max_sge,
        pd: Default::default(),
    };
    let layout = QpRingLayout::new(send_depth, receive_depth).unwrap();
    let daemon = layout.create().unwrap();
    let client = Arc::new(
        SharedMemory::from_fd(daemon.fd().unwrap().try_clone_to_owned().unwrap(), layout.bytes()).unwrap(),
    );
    let mut reader = QpRingReader::new(daemon, layout, &config, MAX_TRANSFER).unwrap();
    let cq_geometry = cq::geometry(4).unwrap();
    let (cq_daemon, mut cq_writer) = CqRingWriter::create(cq_geometry).unwrap();
    let cq_client = SharedMemory::from_fd(
        cq_daemon.fd().unwrap().try_clone_to_owned().unwrap(),
        cq::bytes(cq_geometry),
    )
    .unwrap();
    let mut cq_fault = None;

    // The image: as many bytes as the rings occupy (the tail of the page is not read by anyone).
    let image_len = (layout.send.bytes() + layout.receive.bytes()).min(data.len());
    let (image, scribbles) = data.split_at(image_len);
    client.write_at(0, image).unwrap();

    let mut out = Vec::new();
    let mut fault = None;
    let mut drain = |reader: &mut QpRingReader, out: &mut Vec<WorkRequest>| {
        let before = out.len();
        match reader.drain(drain_max, out) {
            Ok(d) => {
                assert!(fault.is_none(), "a faulted reader drained again");
                assert_eq!(out.len() - before, (d.sends + d.receives) as usize);
                assert!(d.sends <= drain_max && d.receives <= drain_max);
            }
            Err(f) => {
                if let Some(old) = &fault {
                    assert_eq!(old, &f, "the fault changed");
                }
                assert_eq!(reader.fault(), Some(&f));
                fault = Some(f);
            }
        }
        let _ = reader.prepare_sleep();
        // Complete what was taken into the completion ring.
        for wr in &out[before..] {
            cq_writer.push(Completion {
                qp: QueuePairId(1),
                wr_id: wr.id(),
                op: wr.op(),
                status: soft_rdma::NdStatus::Success,
                bytes: 0,
                solicited: false,
                invalidated: None,
            });
        }
        match cq_writer.flush() {
            Ok(_) => assert!(cq_fault.is_none(), "a faulted completion writer wrote again"),
            Err(f) => {
                if let Some(old) = &cq_fault {
                    assert_eq!(old, &f, "the completion ring's fault changed");
                }
                assert_eq!(cq_writer.fault(), Some(&f));
                assert_eq!(cq_writer.overflowed(), 0);
                cq_fault = Some(f);
            }
        }
    };
    drain(&mut reader, &mut out);
    // Scribbles: 2 bytes of word index, 8 bytes of value, then a drain.
    for s in scribbles.chunks_exact(10) {
        let at = u16::from_le_bytes([s[0], s[1]]);
        if at & 0x8000 == 0 {
            let word = usize::from(at) % (layout.bytes() / 8);
            client.write_at(word * 8, &s[2..10]).unwrap();
        } else {
            let word = usize::from(at & 0x7fff) % (cq::bytes(cq_geometry) / 8);
            cq_client.write_at(word * 8, &s[2..10]).unwrap();
        }
        drain(&mut reader, &mut out);
    }
    for wr in &out {
        let sgl = match wr {
            WorkRequest::Send { sgl, .. }
            | WorkRequest::Write { sgl, .. }
            | WorkRequest::Receive { sgl, .. } => sgl.clone(),
            WorkRequest::Read { sink, .. } => vec![*sink],
        };
        assert!(sgl.len() as u32 <= max_sge);
        assert!(sgl.iter().map(|s| u64::from(s.length)).sum::<u64>() <= u64::from(MAX_TRANSFER));
    }
});
