//! Both MPA handshake machines (soft_rdma::engine::mpa) fed arbitrary bytes in arbitrary pieces: never panic,
//! and an accepted offer always yields a Reply that the initiator side can parse.
#![no_main]
use libfuzzer_sys::fuzz_target;
use soft_rdma::client::ReadLimits;
use soft_rdma::engine::mpa::{MpaConfig, MpaInitiator, MpaResponder};

fuzz_target!(|data: &[u8]| {
    let Some((&cut, data)) = data.split_first() else {
        return;
    };
    let cfg = MpaConfig::default();
    let limits = ReadLimits {
        inbound: 4,
        outbound: 4,
    };
    let at = (cut as usize).min(data.len());
    let mut responder = MpaResponder::new(std::time::Instant::now(), &cfg);
    let mut offer = responder.on_bytes(&data[..at]);
    if let Ok(None) = offer {
        offer = responder.on_bytes(&data[at..]);
    }
    if let Ok(Some(offer)) = offer {
        if let Ok((reply, _)) = offer.accept(&cfg, limits, b"ok") {
            assert!(soft_rdma_common::wire::mpa::MpaRepr::parse(&reply).is_ok());
        }
        let _ = offer.reject(&data[..data.len().min(300)]);
    }
    let (mut initiator, _) = MpaInitiator::new(&cfg, limits, b"").unwrap();
    if let Ok(None) = initiator.on_bytes(&data[..at]) {
        let _ = initiator.on_bytes(&data[at..]);
    }
    let _ = initiator.on_closed();
});
