//! The UDS protocol decoder (soft_rdma::uds::proto), as the daemon reads client bytes: never panics, and
//! what decodes re-encodes to a frame that decodes to the same message. (Not byte-identical: postcard also
//! accepts non-minimal varints, e.g. `FF 00` for 127, which carry the same value.)
#![no_main]
use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use soft_rdma::uds::proto::{ClientMessage, MAX_CLIENT_FRAME, ServerMessage, split_frame};

fuzz_target!(|data: &[u8]| {
    let mut buf = BytesMut::from(data);
    while let Ok(Some(frame)) = split_frame(&mut buf, MAX_CLIENT_FRAME) {
        if let Ok(m) = ClientMessage::decode(&frame) {
            let mut out = BytesMut::new();
            m.encode(&mut out);
            assert_eq!(ClientMessage::decode(&out[4..]), Ok(m));
        }
    }
    let _ = ServerMessage::decode(data);
});
