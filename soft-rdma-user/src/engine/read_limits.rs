//! Read-limit (IRD/ORD) negotiation: RFC 6581 §9 on the wire, docs/connector-semantics.md "Read limits" for the API.
//!
//! Vocabulary: a side's `inbound` limit is its IRD (RDMA Reads it serves), `outbound` its ORD (Reads it
//! issues). What a side reports about its peer (GetReadLimits) is the peer's offer *swapped into the
//! caller's view*: the peer serving N reads means the caller may issue N.

use soft_rdma_common::wire::mpa::EnhancedControl;

use super::requests::{AdapterInfo, ReadLimits};

/// The limits a side puts on the wire: its own, silently capped by the adapter (IND2Connector::Connect and
/// ::Accept implementation notes) and to the 14-bit field, below the 0x3FFF "no negotiation" value.
pub fn capped(own: ReadLimits, adapter: &AdapterInfo) -> ReadLimits {
    let field_max = (EnhancedControl::NO_NEGOTIATION - 1) as u32;
    ReadLimits {
        inbound: own.inbound.min(adapter.max_inbound_read_limit).min(field_max),
        outbound: own.outbound.min(adapter.max_outbound_read_limit).min(field_max),
    }
}

/// The peer's offer (its IRD and ORD from the RFC 6581 word) in the caller's view: the caller may issue as
/// many reads as the peer serves (outbound = peer IRD) and serves as many as the peer issues (inbound =
/// peer ORD). 0x3FFF ("no automatic negotiation", RFC 6581 §9.1) puts no bound: it maps to `u32::MAX`.
pub fn peer_view(ird: u16, ord: u16) -> ReadLimits {
    let v = |x: u16| {
        if x == EnhancedControl::NO_NEGOTIATION {
            u32::MAX
        } else {
            x as u32
        }
    };
    ReadLimits {
        inbound: v(ord),
        outbound: v(ird),
    }
}

/// The effective limits of one side: min(own, adapter max, what the peer allows)
/// (docs/connector-semantics.md "Read limits": effective inbound = min(own inbound, adapter max, peer's outbound);
/// effective outbound = min(own outbound, adapter max, peer's inbound)).
pub fn effective(own: ReadLimits, peer: ReadLimits, adapter: &AdapterInfo) -> ReadLimits {
    let own = capped(own, adapter);
    ReadLimits {
        inbound: own.inbound.min(peer.inbound),
        outbound: own.outbound.min(peer.outbound),
    }
}

/// A responder's answer, as it goes on the wire: Accept's values silently limited to the lower of the
/// adapter's capabilities and the values the connecting peer offered (IND2Connector::Accept implementation
/// notes, seed 004; docs/connector-semantics.md "Read limits"), so the connecting side never sees more than it
/// asked for. Responder IRD = min(own IRD, adapter, initiator ORD); responder ORD = min(own ORD, adapter,
/// initiator IRD), which is also RFC 6581 §9's "responder ORD ≤ initiator IRD". Linux siw as a responder does
/// the same (siw_accept(): local IRD = the peer's ORD, local ORD = the peer's IRD, at most 128; docs/iwarp-wire.md
/// §2), and siw as an initiator takes the Reply's IRD as its ORD (siw_proc_mpareply()), so a smaller IRD here
/// can only make it issue fewer Reads. 0x3FFF from the initiator ("no automatic negotiation") bounds nothing.
pub fn responder_offer(own: ReadLimits, initiator: &EnhancedControl, adapter: &AdapterInfo) -> ReadLimits {
    effective(own, peer_view(initiator.ird, initiator.ord), adapter)
}

/// RFC 6581 §9: the initiator checks that the responder's ORD does not exceed its IRD; if it does, the
/// initiator sends a Terminate (LLP, MPA, code 0x06). 0x3FFF on either side skips the check.
pub fn initiator_ird_sufficient(own_ird: u16, responder_ord: u16) -> bool {
    own_ird == EnhancedControl::NO_NEGOTIATION
        || responder_ord == EnhancedControl::NO_NEGOTIATION
        || responder_ord <= own_ird
}

#[cfg(test)]
pub(crate) mod tests_support {
    use super::*;

    /// An adapter with both read limits at `max` and siw-like other limits.
    pub(crate) fn adapter(max: u32) -> AdapterInfo {
        AdapterInfo {
            max_inbound_read_limit: max,
            max_outbound_read_limit: max,
            ..crate::engine::cm::CmConfig::default_siw_compatible().adapter
        }
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::adapter;
    use super::*;
    use proptest::prelude::*;

    /// An MPA v2 IRD/ORD word with no flags set.
    fn word(ird: u16, ord: u16) -> EnhancedControl {
        EnhancedControl {
            ird,
            ord,
            ..Default::default()
        }
    }

    #[test]
    fn caps_and_swap() {
        let a = adapter(128);
        assert_eq!(capped(ReadLimits::new(1000, 3), &a), ReadLimits::new(128, 3));
        // The peer serves 4 and issues 8: the caller may issue 4 and must serve 8.
        assert_eq!(peer_view(4, 8), ReadLimits::new(8, 4));
        let eff = effective(ReadLimits::new(16, 16), peer_view(4, 8), &a);
        assert_eq!(eff, ReadLimits::new(8, 4));
        // 0x3FFF: no automatic negotiation, local values unchanged.
        let eff = effective(ReadLimits::new(16, 2), peer_view(0x3FFF, 0x3FFF), &a);
        assert_eq!(eff, ReadLimits::new(16, 2));
    }

    /// The named limits: the default asks for what the adapter allows and gets exactly that; none stays none.
    #[test]
    fn named_limits_after_the_adapter_caps() {
        let a = adapter(128);
        assert_eq!(ReadLimits::default(), ReadLimits::ADAPTER_MAX);
        assert_eq!(capped(ReadLimits::default(), &a), ReadLimits::symmetric(128));
        assert_eq!(capped(ReadLimits::NONE, &a), ReadLimits::new(0, 0));
        assert_eq!(capped(ReadLimits::symmetric(4), &a), ReadLimits::new(4, 4));
        // Against a peer offering IRD 8 / ORD 2, the default is what the peer allows.
        assert_eq!(
            effective(ReadLimits::default(), peer_view(8, 2), &a),
            ReadLimits::new(2, 8)
        );
    }

    #[test]
    fn responder_rule() {
        let a = adapter(128);
        let init = word(3, 10);
        let offer = responder_offer(ReadLimits::new(64, 64), &init, &a);
        // Responder ORD ≤ initiator IRD; responder IRD limited to the initiator's ORD (seed 004).
        assert_eq!(offer, ReadLimits::new(10, 3));
        assert!(initiator_ird_sufficient(3, 3));
        assert!(!initiator_ird_sufficient(3, 4));
        assert!(initiator_ird_sufficient(0x3FFF, 100));
    }

    /// docs/connector-semantics.md "Read limits" example: the connector offers IRD 4 / ORD 8, the listener accepts
    /// with IRD 16 / ORD 2. The Reply carries IRD 8 / ORD 2; the connector reads outbound 8 / inbound 2, and
    /// the listener's effective limits are IRD 8 / ORD 2. And the mirror image (listener 2 / 16).
    #[test]
    fn accept_is_limited_to_the_connecting_peers_offer() {
        let a = adapter(128);
        let offer = word(4, 8);
        let listener = ReadLimits::new(16, 2);
        let reply = responder_offer(listener, &offer, &a);
        assert_eq!(reply, ReadLimits::new(8, 2));
        let connector_sees = peer_view(reply.inbound as u16, reply.outbound as u16);
        assert_eq!(connector_sees, ReadLimits::new(2, 8));
        assert_eq!(effective(listener, peer_view(4, 8), &a), reply);
        // The other direction: the listener wants fewer reads served and more issued than offered.
        let reply = responder_offer(ReadLimits::new(2, 16), &offer, &a);
        assert_eq!(reply, ReadLimits::new(2, 4));
        // An adapter maximum below both still wins.
        let reply = responder_offer(listener, &offer, &adapter(3));
        assert_eq!(reply, ReadLimits::new(3, 2));
        // 0x3FFF from the initiator: no negotiation, the listener's own (capped) values go out.
        let free = word(0x3FFF, 0x3FFF);
        assert_eq!(responder_offer(listener, &free, &a), listener);
    }

    proptest! {
        /// The RFC 6581 §9 rules hold whatever both sides ask and whatever the adapters allow.
        #[test]
        fn negotiation_rules(ii in any::<u32>(), io in any::<u32>(), ri in any::<u32>(), ro in any::<u32>(),
                             amax in 0u32..200, bmax in 0u32..200) {
            let (a, b) = (adapter(amax), adapter(bmax));
            let init_wire = capped(ReadLimits::new(ii, io), &a);
            let init_word = word(init_wire.inbound as u16, init_wire.outbound as u16);
            let resp = responder_offer(ReadLimits::new(ri, ro), &init_word, &b);
            // responder ORD ≤ initiator IRD
            prop_assert!(resp.outbound <= init_wire.inbound);
            prop_assert!(initiator_ird_sufficient(init_word.ird, resp.outbound as u16));
            // Effective limits from each side's view never exceed own, adapter, or the peer's offer.
            let init_eff = effective(ReadLimits::new(ii, io), peer_view(resp.inbound as u16, resp.outbound as u16), &a);
            prop_assert!(init_eff.outbound <= resp.inbound && init_eff.outbound <= amax && init_eff.outbound <= io);
            prop_assert!(init_eff.inbound <= amax && init_eff.inbound <= ii);
            // What one side issues, the other serves.
            let resp_serves = capped(ReadLimits::new(ri, ro), &b).inbound;
            prop_assert!(init_eff.outbound <= resp_serves);
            // Accept's values are limited to the connecting peer's offer before they go out (seed 004): what
            // the initiator's GetReadLimits reports never exceeds what it offered, either way.
            let seen = peer_view(resp.inbound as u16, resp.outbound as u16);
            prop_assert!(seen.outbound <= init_wire.outbound && seen.inbound <= init_wire.inbound);
            // And the responder's wire word is exactly its own effective limits.
            prop_assert_eq!(resp, effective(ReadLimits::new(ri, ro), peer_view(init_word.ird, init_word.ord), &b));
        }
    }
}
