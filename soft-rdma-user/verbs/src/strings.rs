//! The `*_str` helpers of verbs.h (`ibv_wc_status_str`, `ibv_event_type_str`, `ibv_node_type_str`,
//! `ibv_port_state_str`): static NUL-terminated words for each value of the header's enums.

use std::ffi::CStr;

use libc::{c_char, c_int};

use crate::export::export;

fn pick(table: &[&'static CStr], i: c_int, unknown: &'static CStr) -> *const c_char {
    usize::try_from(i)
        .ok()
        .and_then(|i| table.get(i))
        .copied()
        .unwrap_or(unknown)
        .as_ptr()
}

/// `enum ibv_wc_status`, in order.
const WC_STATUS: [&CStr; 24] = [
    c"success",
    c"local length error",
    c"local QP operation error",
    c"local EE context operation error",
    c"local protection error",
    c"Work Request Flushed Error",
    c"memory management operation error",
    c"bad response error",
    c"local access error",
    c"remote invalid request error",
    c"remote access error",
    c"remote operation error",
    c"transport retry counter exceeded",
    c"RNR retry counter exceeded",
    c"local RDD violation error",
    c"remote invalid RD request",
    c"aborted error",
    c"invalid EE context number",
    c"invalid EE context state",
    c"fatal error",
    c"response timeout error",
    c"general error",
    c"TM error",
    c"TM software rendezvous",
];

/// `enum ibv_event_type`, in order.
const EVENT_TYPE: [&CStr; 20] = [
    c"CQ error",
    c"local work queue catastrophic error",
    c"invalid request local work queue error",
    c"local access violation work queue error",
    c"communication established",
    c"send queue drained",
    c"path migrated",
    c"path migration request error",
    c"local catastrophic error",
    c"port active",
    c"port error",
    c"LID change",
    c"P_Key change",
    c"SM change",
    c"SRQ catastrophic error",
    c"SRQ limit reached",
    c"last WQE reached",
    c"client reregistration",
    c"GID table change",
    c"WQ fatal",
];

/// `enum ibv_node_type` from 1 (CA) to 6 (unspecified).
const NODE_TYPE: [&CStr; 7] = [
    c"unknown",
    c"InfiniBand channel adapter",
    c"InfiniBand switch",
    c"InfiniBand router",
    c"iWARP NIC",
    c"usNIC",
    c"usNIC UDP",
];

/// `enum ibv_port_state`.
const PORT_STATE: [&CStr; 6] = [
    c"PORT_NOP",
    c"PORT_DOWN",
    c"PORT_INIT",
    c"PORT_ARMED",
    c"PORT_ACTIVE",
    c"PORT_ACTIVE_DEFER",
];

export!("IBVERBS_1.1";
fn ibv_wc_status_str(status: c_int) -> *const c_char {
    pick(&WC_STATUS, status, c"unknown")
});

export!("IBVERBS_1.1";
fn ibv_event_type_str(event: c_int) -> *const c_char {
    pick(&EVENT_TYPE, event, c"unknown")
});

export!("IBVERBS_1.1";
fn ibv_node_type_str(node_type: c_int) -> *const c_char {
    pick(&NODE_TYPE, node_type, c"unknown")
});

export!("IBVERBS_1.1";
fn ibv_port_state_str(state: c_int) -> *const c_char {
    pick(&PORT_STATE, state, c"unknown")
});

#[cfg(test)]
mod tests {
    use super::*;

    fn s(p: *const c_char) -> &'static str {
        // SAFETY: the static strings above.
        unsafe { CStr::from_ptr(p) }.to_str().unwrap()
    }

    #[test]
    fn values_name_their_words_and_the_rest_is_unknown() {
        // SAFETY: plain lookups.
        unsafe {
            assert_eq!(s(ibv_wc_status_str(5)), "Work Request Flushed Error");
            assert_eq!(s(ibv_wc_status_str(4)), "local protection error");
            assert_eq!(s(ibv_wc_status_str(-1)), "unknown");
            assert_eq!(s(ibv_event_type_str(8)), "local catastrophic error");
            assert_eq!(s(ibv_node_type_str(4)), "iWARP NIC");
            assert_eq!(s(ibv_port_state_str(4)), "PORT_ACTIVE");
            assert_eq!(s(ibv_port_state_str(99)), "unknown");
        }
    }
}
