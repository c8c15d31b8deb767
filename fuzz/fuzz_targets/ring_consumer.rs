//! The daemon's consumer of a queue pair's shared rings (soft_rdma::rings::qp::QpRingReader), fed a mapping
//! whose every byte a client controls: the first input byte sets the rings' depths and the queue pair's
//! SGE bound, the next bytes are copied over the mapping (header and entries), and the rest are scribbles
//! (offset, word) made between drains. Never panics; every request handed out passed validation (its SGE
//! count and total length within bounds); once the reader reports a fault it reports the same one forever.
#![no_main]
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use soft_rdma::engine::verbs::*;
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
    };
    let layout = QpRingLayout::new(send_depth, receive_depth).unwrap();
    let daemon = layout.create().unwrap();
    let client = Arc::new(
        SharedMemory::from_fd(daemon.fd().unwrap().try_clone_to_owned().unwrap(), layout.bytes()).unwrap(),
    );
    let mut reader = QpRingReader::new(daemon, layout, &config, MAX_TRANSFER).unwrap();

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
    };
    drain(&mut reader, &mut out);
    // Scribbles: 2 bytes of word index, 8 bytes of value, then a drain.
    for s in scribbles.chunks_exact(10) {
        let word = usize::from(u16::from_le_bytes([s[0], s[1]])) % (layout.bytes() / 8);
        client.write_at(word * 8, &s[2..10]).unwrap();
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
