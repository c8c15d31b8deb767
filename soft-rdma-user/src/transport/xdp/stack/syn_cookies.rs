//! SYN cookies, the daemon's side (the rule is `soft_rdma_common::syn_cookie`, the SYN-ACK the XDP
//! program's): the key, the time counter the program and the own TCP's table share, and whether the
//! program may answer SYNs at all.
//!
//! The program answers with `XDP_TX`, which sends the frame back out of the device it came in on. That
//! works in generic mode (the kernel transmits it as any packet) and on a NIC whose driver took the program
//! in native mode (`XDP_TX` is part of native XDP's basic actions). A veth in native mode is the exception:
//! it hands the frame to its peer's XDP receive ring, which exists only while the peer has an XDP program
//! or GRO on. Without both the frame is dropped (the driver counts `xdp_tx_errors`), and with GRO alone it
//! waits there until the peer's next packet (measured: 42 ms with a kernel-TCP peer), as the driver kicks
//! the peer's poll only when the peer has a native-mode program. The peer can change that at any time, so
//! for a veth the daemon asks the kernel (rtnetlink, the peer found by its namespace id) at start, when a
//! listener starts and once a second whether the peer runs a native-mode XDP program, and turns the
//! program's answers on and off with it. The table keeps checking cookies either
//! way, so a cookie already sent is still honoured; a SYN whose SYN-ACK was lost in a change comes again
//! (the peer retransmits it) and finds the daemon answering.

use std::time::{Duration, Instant as StdInstant};

use soft_rdma_common::syn_cookie::{self, SynCookieKey};
use tracing::{info, warn};

use crate::tcp::{ConnectionTable, SynAckOffer};
use crate::transport::xdp::loader::ProgramConfig;
use crate::transport::xdp::netlink::Netlink;

/// How often a veth's peer is looked at.
const PEER_CHECK: Duration = Duration::from_secs(1);

/// What the daemon decides for SYN cookies: the program's configuration and how the program is attached.
pub struct SynCookieSetup {
    pub config: ProgramConfig,
    /// The program runs in generic (SKB) mode.
    pub generic_mode: bool,
    pub ifindex: u32,
}

/// Whether a frame the program sends with `XDP_TX` leaves the device at once. `veth_peer_xdp`: `Ok(None)`
/// for a device that is not a veth, else whether the peer runs a native-mode XDP program (an error: the
/// kernel could not tell).
pub(super) fn xdp_tx_leaves(generic_mode: bool, veth_peer_xdp: &std::io::Result<Option<bool>>) -> bool {
    generic_mode || matches!(veth_peer_xdp, Ok(None | Some(true)))
}

/// Counter steps due at `now`, the next one being due at `next` (`now >= next`). Rounds run at least every
/// 100 ms (`Stack::next_timeout`), so this is one; after a stall of the whole process (SIGSTOP), as many
/// as it missed.
fn steps_due(next: StdInstant, now: StdInstant) -> u32 {
    1 + (now.duration_since(next).as_secs() / syn_cookie::TICK_PERIOD_SECS) as u32
}

/// SYN cookies in use. See the module doc.
pub(super) struct SynCookies {
    setup: SynCookieSetup,
    offer: SynAckOffer,
    key: SynCookieKey,
    tick: u32,
    next_tick: StdInstant,
    /// The program answers SYNs now (`None` before the first check).
    answering: Option<bool>,
    next_check: StdInstant,
}

impl SynCookies {
    /// Turns cookies on in `table`, and in the program if its SYN-ACKs can leave. `None` when the table's
    /// configuration cannot use them.
    pub(super) fn start(
        setup: SynCookieSetup,
        table: &mut ConnectionTable,
        nl: &mut Netlink,
        now: StdInstant,
    ) -> Option<SynCookies> {
        let offer = table.syn_ack_offer()?;
        let key = SynCookieKey {
            k0: crate::seed::random_seed(),
            k1: crate::seed::random_seed(),
        };
        table.enable_syn_cookies(key, 0);
        let mut c = SynCookies {
            setup,
            offer,
            key,
            tick: 0,
            next_tick: now + Duration::from_secs(syn_cookie::TICK_PERIOD_SECS),
            answering: None,
            next_check: now,
        };
        c.service(table, nl, now);
        Some(c)
    }

    /// Once per round: the time counter (to the program first, then to the table, so that the table's is
    /// never behind), and once a second whether the program may answer.
    /// `nl`: the stack's rtnetlink socket, to look at a veth's peer with.
    pub(super) fn service(&mut self, table: &mut ConnectionTable, nl: &mut Netlink, now: StdInstant) {
        if now >= self.next_tick {
            let steps = steps_due(self.next_tick, now);
            let tick = self.tick.wrapping_add(steps) & syn_cookie::TICK_MASK;
            self.next_tick += Duration::from_secs(syn_cookie::TICK_PERIOD_SECS) * steps;
            match self.setup.config.set_syn_cookie_tick(tick) {
                Ok(()) => {
                    self.tick = tick;
                    table.set_syn_cookie_tick(tick);
                }
                Err(e) => warn!(error = %format!("{e:#}"), "cannot advance the SYN cookie's time counter"),
            }
        }
        if now >= self.next_check {
            self.check_peer(nl, now);
        }
    }

    /// Whether the program's SYN-ACKs leave at once, now; the program's answers on or off with it. Also
    /// run when a listener starts, so that its first SYN finds the program's setting current.
    pub(super) fn check_peer(&mut self, nl: &mut Netlink, now: StdInstant) {
        self.next_check = now + PEER_CHECK;
        let peer = if self.setup.generic_mode {
            Ok(None)
        } else {
            nl.veth_peer_xdp(self.setup.ifindex)
        };
        let leaves = xdp_tx_leaves(self.setup.generic_mode, &peer);
        if Some(leaves) == self.answering {
            return;
        }
        let r = if leaves {
            self.setup
                .config
                .enable_syn_cookies(self.offer, self.key, self.tick)
        } else {
            self.setup.config.disable_syn_cookies()
        };
        match r {
            Ok(()) => {
                self.answering = Some(leaves);
                if leaves {
                    info!(offer = ?self.offer, "SYN cookies on: the XDP program answers listeners' SYNs");
                } else {
                    info!(
                        veth_peer_xdp = ?peer,
                        "SYN cookies off: the program's SYN-ACKs would not reach the veth's peer at once (XDP_TX \
                         needs a native-mode XDP program on the peer); the daemon answers SYNs"
                    );
                }
            }
            Err(e) => warn!(error = %format!("{e:#}"), "cannot switch the XDP program's SYN cookies"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counter_catches_up_after_a_stall() {
        let next = StdInstant::now();
        assert_eq!(steps_due(next, next), 1);
        assert_eq!(steps_due(next, next + Duration::from_secs(63)), 1);
        assert_eq!(steps_due(next, next + Duration::from_secs(64)), 2);
        assert_eq!(steps_due(next, next + Duration::from_secs(64 * 10 + 1)), 11);
    }

    #[test]
    fn xdp_tx_leaves_in_generic_mode_on_a_nic_or_to_a_veth_peer_with_xdp() {
        let unknown = || Err(std::io::Error::from_raw_os_error(libc::EPERM));
        assert!(xdp_tx_leaves(true, &unknown()));
        assert!(xdp_tx_leaves(true, &Ok(Some(false))));
        assert!(
            xdp_tx_leaves(false, &Ok(None)),
            "not a veth: the driver took native XDP"
        );
        assert!(xdp_tx_leaves(false, &Ok(Some(true))));
        assert!(!xdp_tx_leaves(false, &Ok(Some(false))));
        assert!(!xdp_tx_leaves(false, &unknown()));
    }
}
