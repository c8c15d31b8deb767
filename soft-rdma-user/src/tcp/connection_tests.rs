//! Rule-by-rule tests of `connection.rs` and `segment_arrival.rs`: two connections joined by hand, every
//! segment inspected, dropped or altered by the test.

use super::wire::{TcpFlags, TcpHeader};
use super::{Connection, Events, Instant, Keepalive, Seq, State, TcpConfig, reset_for_unknown};
use std::time::Duration;

type Seg = (TcpHeader, Vec<u8>);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn cfg() -> TcpConfig {
    TcpConfig {
        mss: 1000,
        send_buffer: 64 * 1024,
        recv_buffer: 64 * 1024,
        delayed_ack: Duration::ZERO,
        time_wait: ms(1000),
        ..TcpConfig::default()
    }
}

fn drain(c: &mut Connection, now: Instant) -> Vec<Seg> {
    let mut buf = vec![0u8; 65536];
    let mut out = Vec::new();
    while let Some((h, n)) = c.poll_transmit(now, &mut buf) {
        out.push((h, buf[..n].to_vec()));
        assert!(out.len() < 10_000, "poll_transmit never ends");
    }
    out
}

fn deliver(c: &mut Connection, now: Instant, segs: &[Seg]) {
    for (h, p) in segs {
        c.on_segment(now, h, p);
    }
}

/// Exchange until both are quiet, with no loss; `now` advances by `rtt/2` per hop.
fn pump(a: &mut Connection, b: &mut Connection, now: &mut Instant, half_rtt: Duration) {
    for _ in 0..10_000 {
        let from_a = drain(a, *now);
        let from_b = drain(b, *now);
        if from_a.is_empty() && from_b.is_empty() {
            return;
        }
        *now = *now + half_rtt;
        deliver(b, *now, &from_a);
        deliver(a, *now, &from_b);
    }
    panic!("never quiet");
}

/// A connected pair (client, server) after a handshake with a 10 ms RTT.
fn pair(cfg: &TcpConfig) -> (Connection, Connection, Instant) {
    let mut now = Instant::from_millis(1000);
    let mut a = Connection::connect(cfg, 40000, 80, 1_000_000, 7, now);
    let syn = drain(&mut a, now);
    now = now + ms(5);
    let mut b = Connection::accept(cfg, &syn[0].0, 5_000_000, 99, now).unwrap();
    pump(&mut a, &mut b, &mut now, ms(5));
    assert_eq!((a.state(), b.state()), (State::Established, State::Established));
    a.take_events();
    b.take_events();
    (a, b, now)
}

fn data(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

fn read_all(c: &mut Connection) -> Vec<u8> {
    let mut out = vec![0u8; 1 << 20];
    let n = c.recv(&mut out);
    out.truncate(n);
    out
}

#[test]
fn three_way_handshake_negotiates_mss_window_scale_timestamps_and_sack() {
    let c = cfg();
    let mut now = Instant::from_millis(1);
    let mut a = Connection::connect(&c, 40000, 80, 100, 0, now);
    let syn = drain(&mut a, now);
    assert_eq!(syn.len(), 1);
    let h = syn[0].0;
    assert_eq!(h.flags, TcpFlags(TcpFlags::SYN));
    assert_eq!(h.seq, Seq(100));
    assert_eq!(h.options.mss, Some(1000));
    assert_eq!(h.options.window_scale, Some(1)); // 64 KiB needs one shift to fit 16 bits
    assert!(h.options.sack_permitted);
    assert_eq!(h.options.timestamp.map(|t| t.1), Some(0));
    now = now + ms(5);
    let mut b = Connection::accept(&c, &h, 900, 0, now).unwrap();
    let synack = drain(&mut b, now);
    let sa = synack[0].0;
    assert_eq!(sa.flags, TcpFlags(TcpFlags::SYN | TcpFlags::ACK));
    assert_eq!((sa.seq, sa.ack), (Seq(900), Seq(101)));
    assert!(sa.options.timestamp.is_some() && sa.options.sack_permitted);
    now = now + ms(5);
    deliver(&mut a, now, &synack);
    assert_eq!(a.state(), State::Established);
    assert!(a.take_events().contains(Events::CONNECTED));
    let ack = drain(&mut a, now);
    assert_eq!(ack.len(), 1);
    assert_eq!((ack[0].0.seq, ack[0].0.ack), (Seq(101), Seq(901)));
    deliver(&mut b, now + ms(5), &ack);
    assert_eq!(b.state(), State::Established);
    assert_eq!(a.negotiated(), ((1, 1), true, true));
    // MSS 1000 less the 12 bytes of timestamp option.
    assert_eq!(a.send_mss(), 988);
    // RFC 6298 §2.2 first sample 10 ms, RTO at the 200 ms floor.
    assert_eq!(a.smoothed_rtt(), Some(ms(10)));
    assert_eq!(a.rto(), ms(200));
}

#[test]
fn options_the_peer_does_not_offer_stay_off_and_mss_defaults_to_536() {
    let c = cfg();
    let now = Instant::from_millis(1);
    let syn = TcpHeader {
        src_port: 1,
        dst_port: 2,
        seq: Seq(7),
        flags: TcpFlags(TcpFlags::SYN),
        window: 1000,
        ..Default::default()
    };
    let mut b = Connection::accept(&c, &syn, 1, 0, now).unwrap();
    assert_eq!(b.negotiated(), ((0, 0), false, false));
    assert_eq!(b.send_mss(), 536);
    let synack = drain(&mut b, now);
    let o = synack[0].0.options;
    assert_eq!(
        (o.window_scale, o.timestamp, o.sack_permitted),
        (None, None, false)
    );
    assert_eq!(o.mss, Some(1000));
    // An ACK, an RST or a non-SYN segment opens nothing.
    let mut ack = syn;
    ack.flags = TcpFlags(TcpFlags::ACK);
    assert!(Connection::accept(&c, &ack, 1, 0, now).is_none());
}

#[test]
fn simultaneous_open_goes_through_syn_received_on_both_sides() {
    let c = cfg();
    let mut now = Instant::from_millis(1);
    let mut a = Connection::connect(&c, 1000, 2000, 10, 0, now);
    let mut b = Connection::connect(&c, 2000, 1000, 20, 0, now);
    let sa = drain(&mut a, now);
    let sb = drain(&mut b, now);
    now = now + ms(5);
    deliver(&mut a, now, &sb);
    deliver(&mut b, now, &sa);
    assert_eq!((a.state(), b.state()), (State::SynReceived, State::SynReceived));
    let sa2 = drain(&mut a, now);
    assert_eq!(sa2[0].0.flags, TcpFlags(TcpFlags::SYN | TcpFlags::ACK));
    assert_eq!((sa2[0].0.seq, sa2[0].0.ack), (Seq(10), Seq(21)));
    deliver(&mut b, now, &sa2);
    assert_eq!(b.state(), State::Established);
    pump(&mut a, &mut b, &mut now, ms(5));
    assert_eq!((a.state(), b.state()), (State::Established, State::Established));
    a.send(b"hello").unwrap();
    pump(&mut a, &mut b, &mut now, ms(5));
    assert_eq!(read_all(&mut b), b"hello");
}

#[test]
fn unanswered_syn_backs_off_and_times_out() {
    let c = TcpConfig {
        max_syn_retransmissions: 2,
        ..cfg()
    };
    let mut now = Instant::from_millis(1);
    let mut a = Connection::connect(&c, 1, 2, 0, 0, now);
    assert_eq!(drain(&mut a, now).len(), 1);
    assert_eq!(a.poll_at(), Some(now + ms(1000)));
    now = a.poll_at().unwrap();
    assert_eq!(drain(&mut a, now)[0].0.flags, TcpFlags(TcpFlags::SYN));
    assert_eq!(a.poll_at(), Some(now + ms(2000)));
    now = a.poll_at().unwrap();
    assert_eq!(drain(&mut a, now).len(), 1);
    now = a.poll_at().unwrap();
    drain(&mut a, now);
    assert_eq!(a.state(), State::Closed);
    assert!(a.take_events().contains(Events::TIMED_OUT));
    assert_eq!(a.counters().rto_events, 2);
}

#[test]
fn retransmission_timeout_resends_from_snd_una_backs_off_and_resets_on_ack() {
    let (mut a, mut b, mut now) = pair(&cfg());
    a.send(&data(3000)).unwrap();
    let lost = drain(&mut a, now);
    assert_eq!(lost.len(), 4);
    let sent_at = now;
    let rto = a.rto();
    // The tail-loss probe goes first (2·SRTT); it is lost too, and the RTO runs out.
    now = a.poll_at().unwrap();
    assert_eq!(now, sent_at + ms(22));
    let probe = drain(&mut a, now);
    assert_eq!(a.counters().tlp_probes, 1);
    assert_eq!(probe.len(), 1);
    now = a.poll_at().unwrap();
    let again = drain(&mut a, now);
    assert_eq!(a.counters().rto_events, 1);
    assert_eq!(a.rto_backoff(), 1);
    assert_eq!(a.congestion_window(), a.send_mss());
    assert_eq!(again.len(), 1, "one segment in the loss window");
    assert_eq!(again[0].0.seq, lost[0].0.seq);
    assert_eq!(a.poll_at(), Some(now + 2 * rto));
    deliver(&mut b, now + ms(5), &again);
    pump(&mut a, &mut b, &mut now, ms(5));
    assert_eq!(read_all(&mut b), data(3000));
    assert_eq!(a.rto_backoff(), 0);
    assert_eq!(a.counters().rto_events, 1);
}

/// Sends `n` full segments from `a`, returns them.
fn flight(a: &mut Connection, now: Instant, n: usize) -> Vec<Seg> {
    let mss = a.send_mss() as usize;
    a.send(&data(n * mss)).unwrap();
    let segs = drain(a, now);
    assert_eq!(segs.len(), n);
    segs
}

#[test]
fn three_duplicate_acks_trigger_fast_retransmit_even_when_the_window_changes() {
    let c = TcpConfig { sack: false, ..cfg() };
    let (mut a, mut b, mut now) = pair(&c);
    let segs = flight(&mut a, now, 8);
    now = now + ms(5);
    // Segment 0 lost; the receiver's duplicate ACKs each advertise a different window.
    for (i, s) in segs[1..4].iter().enumerate() {
        deliver(&mut b, now, std::slice::from_ref(s));
        let mut acks = drain(&mut b, now);
        assert_eq!(acks.len(), 1);
        acks[0].0.window = acks[0].0.window.wrapping_sub(i as u16 * 7);
        deliver(&mut a, now + ms(5), &acks);
        if i < 2 {
            assert!(
                drain(&mut a, now + ms(5))
                    .iter()
                    .all(|s| s.0.seq != segs[0].0.seq)
            );
        }
    }
    now = now + ms(5);
    assert_eq!(a.counters().dup_acks, 3);
    assert_eq!(a.counters().fast_retransmits, 1);
    let rtx = drain(&mut a, now);
    assert_eq!(rtx[0].0.seq, segs[0].0.seq);
    assert_eq!(a.counters().rto_events, 0);
    deliver(&mut b, now, &segs[4..]);
    deliver(&mut b, now, &rtx);
    pump(&mut a, &mut b, &mut now, ms(5));
    assert_eq!(read_all(&mut b), data(8 * a.send_mss() as usize));
}

#[test]
fn newreno_partial_ack_retransmits_the_next_hole_without_a_timeout() {
    let c = TcpConfig { sack: false, ..cfg() };
    let (mut a, mut b, mut now) = pair(&c);
    let segs = flight(&mut a, now, 8);
    now = now + ms(5);
    // Segments 0 and 4 lost.
    let mut dupacks = Vec::new();
    for (i, s) in segs.iter().enumerate() {
        if i != 0 && i != 4 {
            deliver(&mut b, now, std::slice::from_ref(s));
            dupacks.extend(drain(&mut b, now));
        }
    }
    assert_eq!(dupacks.len(), 6);
    deliver(&mut a, now + ms(5), &dupacks);
    now = now + ms(5);
    let rtx = drain(&mut a, now);
    assert_eq!(rtx[0].0.seq, segs[0].0.seq);
    now = now + ms(5);
    deliver(&mut b, now, &rtx[..1]);
    let partial = drain(&mut b, now);
    assert_eq!(partial.last().unwrap().0.ack, segs[4].0.seq);
    now = now + ms(5);
    deliver(&mut a, now, &partial);
    let rtx2 = drain(&mut a, now);
    assert_eq!(
        rtx2.first().map(|s| s.0.seq),
        Some(segs[4].0.seq),
        "partial ACK: the next hole at once"
    );
    deliver(&mut b, now + ms(5), &rtx2);
    pump(&mut a, &mut b, &mut now, ms(5));
    assert_eq!(read_all(&mut b).len(), 8 * a.send_mss() as usize);
    assert_eq!((a.counters().rto_events, a.counters().fast_retransmits), (0, 1));
}

#[test]
fn sack_repairs_several_holes_in_one_recovery() {
    let (mut a, mut b, mut now) = pair(&cfg());
    let segs = flight(&mut a, now, 10);
    now = now + ms(5);
    let lost = [1usize, 4, 7];
    let mut acks = Vec::new();
    for (i, s) in segs.iter().enumerate() {
        if !lost.contains(&i) {
            deliver(&mut b, now, std::slice::from_ref(s));
            acks.extend(drain(&mut b, now));
        }
    }
    assert!(
        acks.iter().any(|s| s.0.options.sack_count >= 2),
        "receiver reports SACK blocks"
    );
    let last = acks.last().unwrap().0.options;
    assert_eq!(
        last.sacks()[0],
        (segs[8].0.seq, segs[9].0.seq + a.send_mss()),
        "most recent block first"
    );
    now = now + ms(5);
    deliver(&mut a, now, &acks);
    let rtx = drain(&mut a, now);
    let rtx_seqs: Vec<Seq> = rtx.iter().map(|s| s.0.seq).collect();
    for i in lost {
        assert!(rtx_seqs.contains(&segs[i].0.seq), "hole {i} resent: {rtx_seqs:?}");
    }
    assert_eq!(a.counters().sack_retransmits, 3);
    deliver(&mut b, now + ms(5), &rtx);
    pump(&mut a, &mut b, &mut now, ms(5));
    assert_eq!(read_all(&mut b).len(), 10 * a.send_mss() as usize);
    assert_eq!((a.counters().rto_events, a.counters().fast_retransmits), (0, 1));
}

#[test]
fn data_segments_carrying_sack_blocks_stay_within_the_mss() {
    for timestamps in [true, false] {
        let c = TcpConfig { timestamps, ..cfg() };
        let (mut a, mut b, now) = pair(&c);
        // B's data reaches A with gaps: A has out-of-order data, so its segments carry SACK blocks.
        let segs = flight(&mut b, now, 8);
        for (i, s) in segs.iter().enumerate() {
            if i % 2 == 1 {
                deliver(&mut a, now, std::slice::from_ref(s));
            }
        }
        drain(&mut a, now);
        a.send(&data(20_000)).unwrap();
        let out = drain(&mut a, now);
        assert!(out.iter().any(|s| s.0.options.sack_count > 0 && !s.1.is_empty()));
        for (h, p) in &out {
            // RFC 9293 §3.7.1: TCP header with options plus data within the peer's MSS (1000) + 20.
            assert!(
                h.header_len() + p.len() <= 1000 + 20,
                "{} + {}",
                h.header_len(),
                p.len()
            );
        }
    }
}

#[test]
fn tail_loss_probe_repairs_a_lost_last_segment_before_the_rto() {
    let (mut a, mut b, mut now) = pair(&cfg());
    let segs = flight(&mut a, now, 5);
    let rto_at = now + a.rto();
    now = now + ms(5);
    deliver(&mut b, now, &segs[..4]);
    let acks = drain(&mut b, now);
    now = now + ms(5);
    deliver(&mut a, now, &acks);
    // One segment in flight: PTO = 2·SRTT + 200 ms, capped at the RTO, which the probe replaces.
    let _ = rto_at;
    assert_eq!(a.poll_at(), Some(now + a.rto()));
    now = a.poll_at().unwrap();
    let probe = drain(&mut a, now);
    assert_eq!(probe.len(), 1);
    assert_eq!(probe[0].0.seq, segs[4].0.seq, "the last segment again");
    assert_eq!(a.counters().tlp_probes, 1);
    deliver(&mut b, now + ms(5), &probe);
    pump(&mut a, &mut b, &mut now, ms(5));
    assert_eq!(read_all(&mut b).len(), 5 * a.send_mss() as usize);
    assert_eq!(a.counters().rto_events, 0);
}

#[test]
fn zero_window_is_probed_and_transfer_resumes_when_the_reader_reads() {
    let small = TcpConfig {
        recv_buffer: 4000,
        ..cfg()
    };
    let (mut a, mut b, mut now) = pair(&small);
    a.send(&data(10_000)).unwrap();
    pump(&mut a, &mut b, &mut now, ms(5));
    // Four full segments; the 48 bytes of window left are too few to send (sender SWS avoidance).
    assert_eq!(b.readable(), 4 * a.send_mss() as usize);
    // The persist timer first overrides SWS avoidance, then probes the zero window.
    for _ in 0..4 {
        now = a.poll_at().expect("persist timer");
        pump(&mut a, &mut b, &mut now, ms(5));
    }
    assert_eq!(b.readable(), 4000);
    assert!(a.counters().zero_window_probes >= 2, "{:?}", a.counters());
    assert_eq!(a.counters().rto_events, 0);
    assert_eq!(a.state(), State::Established);
    let mut got = read_all(&mut b);
    // The window update is sent at once.
    pump(&mut a, &mut b, &mut now, ms(5));
    while got.len() < 10_000 {
        let more = read_all(&mut b);
        if more.is_empty() {
            now = a.poll_at().or(b.poll_at()).unwrap();
        }
        got.extend(more);
        pump(&mut a, &mut b, &mut now, ms(5));
    }
    assert_eq!(got, data(10_000));
}

#[test]
fn keepalive_probes_an_idle_peer_and_times_out_when_it_is_gone() {
    let c = TcpConfig {
        keepalive: Some(Keepalive {
            idle: ms(1000),
            interval: ms(100),
            probes: 3,
        }),
        ..cfg()
    };
    let (mut a, mut b, connected_at) = pair(&c);
    let mut now = a.poll_at().unwrap();
    assert!(now + ms(10) >= connected_at + ms(1000) && now <= connected_at + ms(1000));
    let probe = drain(&mut a, now);
    assert_eq!(probe.len(), 1);
    // SEG.SEQ = SND.UNA − 1: the client's ISN was 1,000,000, its SND.UNA is 1,000,001.
    assert_eq!(probe[0].0.seq, Seq(1_000_000));
    assert!(probe[0].1.is_empty());
    // The peer answers; the count of unanswered probes restarts.
    deliver(&mut b, now, &probe);
    let answer = drain(&mut b, now);
    assert_eq!(answer.len(), 1);
    deliver(&mut a, now, &answer);
    assert_eq!(a.counters().keepalive_probes, 1);
    assert_eq!(
        a.poll_at(),
        Some(now + ms(1000)),
        "an answer restarts the idle time"
    );
    // Now the peer is gone.
    for _ in 0..4 {
        now = a.poll_at().unwrap();
        drain(&mut a, now);
    }
    assert_eq!(a.counters().keepalive_probes, 4);
    assert_eq!(a.state(), State::Closed);
    assert!(a.take_events().contains(Events::TIMED_OUT));
}

#[test]
fn active_close_fin_wait_1_fin_wait_2_time_wait_closed() {
    let (mut a, mut b, mut now) = pair(&cfg());
    a.close();
    assert_eq!(a.state(), State::FinWait1);
    let fin = drain(&mut a, now);
    assert!(fin[0].0.flags.fin());
    deliver(&mut b, now, &fin);
    assert_eq!(b.state(), State::CloseWait);
    assert!(b.take_events().contains(Events::PEER_CLOSED));
    assert!(b.is_read_closed());
    deliver(&mut a, now, &drain(&mut b, now));
    assert_eq!(a.state(), State::FinWait2);
    b.close();
    assert_eq!(b.state(), State::LastAck);
    let bfin = drain(&mut b, now);
    deliver(&mut a, now, &bfin);
    assert_eq!(a.state(), State::TimeWait);
    deliver(&mut b, now, &drain(&mut a, now));
    assert_eq!(b.state(), State::Closed);
    assert!(b.take_events().contains(Events::CLOSED));
    // TIME-WAIT: a retransmitted FIN is acknowledged again and restarts 2·MSL (RFC 9293 §3.10.7.4).
    now = now + ms(600);
    deliver(&mut a, now, &bfin);
    let reack = drain(&mut a, now);
    assert_eq!(reack.len(), 1);
    assert!(reack[0].0.flags.ack() && !reack[0].0.flags.fin());
    assert_eq!(a.poll_at(), Some(now + ms(1000)));
    now = now + ms(1000);
    drain(&mut a, now);
    assert_eq!(a.state(), State::Closed);
    assert!(a.take_events().contains(Events::CLOSED));
}

#[test]
fn simultaneous_close_goes_through_closing() {
    let (mut a, mut b, mut now) = pair(&cfg());
    a.close();
    b.close();
    let fa = drain(&mut a, now);
    let fb = drain(&mut b, now);
    deliver(&mut a, now, &fb);
    deliver(&mut b, now, &fa);
    assert_eq!((a.state(), b.state()), (State::Closing, State::Closing));
    pump(&mut a, &mut b, &mut now, ms(5));
    assert_eq!((a.state(), b.state()), (State::TimeWait, State::TimeWait));
}

#[test]
fn fin_with_the_ack_of_our_fin_goes_straight_to_time_wait() {
    let (mut a, mut b, now) = pair(&cfg());
    a.close();
    let fa = drain(&mut a, now);
    deliver(&mut b, now, &fa);
    // The peer's ACK is lost; it closes: its FIN acknowledges ours too.
    drain(&mut b, now);
    b.close();
    let fb = drain(&mut b, now);
    assert!(fb[0].0.flags.fin() && fb[0].0.ack == fa[0].0.seq + 1);
    deliver(&mut a, now, &fb);
    assert_eq!(a.state(), State::TimeWait);
}

#[test]
fn close_in_syn_sent_and_fin_ahead_of_missing_data() {
    let c = cfg();
    let now = Instant::from_millis(1);
    let mut a = Connection::connect(&c, 1, 2, 0, 0, now);
    a.close();
    assert_eq!(a.state(), State::Closed);
    let (mut a, mut b, mut now) = pair(&c);
    a.send(&data(1500)).unwrap();
    a.close();
    let segs = drain(&mut a, now);
    assert_eq!(segs.len(), 2);
    assert!(segs[1].0.flags.fin());
    // The FIN-carrying segment arrives first: the FIN waits for the gap.
    deliver(&mut b, now, &segs[1..]);
    assert_eq!(b.state(), State::Established);
    deliver(&mut b, now, &segs[..1]);
    assert_eq!(b.state(), State::CloseWait);
    assert_eq!(read_all(&mut b), data(1500));
    pump(&mut a, &mut b, &mut now, ms(5));
    assert_eq!(a.state(), State::FinWait2);
}

#[test]
fn rst_is_accepted_only_at_rcv_nxt_and_challenged_elsewhere_in_the_window() {
    let (mut a, mut b, now) = pair(&cfg());
    b.send(b"x").unwrap();
    let x = drain(&mut b, now);
    let rcv_nxt = x[0].0.seq + 1;
    deliver(&mut a, now, &x);
    drain(&mut a, now);
    let rst = |seq: Seq| TcpHeader {
        src_port: 80,
        dst_port: 40000,
        seq,
        flags: TcpFlags(TcpFlags::RST),
        ..Default::default()
    };
    // In the window but not exact: challenge ACK (RFC 5961 §3.2).
    a.on_segment(now, &rst(rcv_nxt + 100), &[]);
    assert_eq!(a.state(), State::Established);
    let challenge = drain(&mut a, now);
    assert_eq!(challenge.len(), 1);
    assert_eq!(challenge[0].0.ack, rcv_nxt);
    assert_eq!(a.counters().challenge_acks, 1);
    // Outside the window: dropped silently.
    a.on_segment(now, &rst(rcv_nxt + 10_000_000), &[]);
    assert!(drain(&mut a, now).is_empty());
    // A SYN in ESTABLISHED: challenge ACK (RFC 5961 §4.2).
    let mut syn = rst(rcv_nxt);
    syn.flags = TcpFlags(TcpFlags::SYN);
    a.on_segment(now, &syn, &[]);
    assert_eq!(a.state(), State::Established);
    assert_eq!(drain(&mut a, now).len(), 1);
    // An ACK for data never sent: challenge ACK, dropped (RFC 5961 §5.2).
    let mut bogus = x[0].0;
    bogus.seq = rcv_nxt;
    bogus.ack = bogus.ack + 1_000_000;
    a.on_segment(now, &bogus, b"zz");
    assert_eq!(a.readable(), 1);
    assert_eq!(drain(&mut a, now).len(), 1);
    // Exactly RCV.NXT: reset.
    a.on_segment(now, &rst(rcv_nxt), &[]);
    assert_eq!(a.state(), State::Closed);
    assert!(a.take_events().contains(Events::RESET));
}

#[test]
fn rst_in_syn_sent_counts_only_with_an_acceptable_ack() {
    let c = cfg();
    let now = Instant::from_millis(1);
    let mut a = Connection::connect(&c, 1, 2, 1000, 0, now);
    drain(&mut a, now);
    let mut rst = TcpHeader {
        src_port: 2,
        dst_port: 1,
        flags: TcpFlags(TcpFlags::RST | TcpFlags::ACK),
        ack: Seq(5),
        ..Default::default()
    };
    a.on_segment(now, &rst, &[]);
    assert_eq!(a.state(), State::SynSent);
    rst.ack = Seq(1001);
    a.on_segment(now, &rst, &[]);
    assert_eq!(a.state(), State::Closed);
    assert!(a.take_events().contains(Events::RESET));
    // A bad ACK without RST is answered with <SEQ=SEG.ACK><CTL=RST>.
    let mut a = Connection::connect(&c, 1, 2, 1000, 0, now);
    drain(&mut a, now);
    let ack = TcpHeader {
        flags: TcpFlags(TcpFlags::ACK),
        ack: Seq(77),
        ..Default::default()
    };
    a.on_segment(now, &ack, &[]);
    let out = drain(&mut a, now);
    assert_eq!((out[0].0.flags, out[0].0.seq), (TcpFlags(TcpFlags::RST), Seq(77)));
}

#[test]
fn segments_for_no_connection_get_the_rfc_9293_reset() {
    let syn = TcpHeader {
        src_port: 5,
        dst_port: 6,
        seq: Seq(10),
        flags: TcpFlags(TcpFlags::SYN),
        ..Default::default()
    };
    let r = reset_for_unknown(&syn, 3).unwrap();
    assert_eq!((r.src_port, r.dst_port, r.seq, r.ack), (6, 5, Seq(0), Seq(14)));
    assert_eq!(r.flags, TcpFlags(TcpFlags::RST | TcpFlags::ACK));
    let ack = TcpHeader {
        flags: TcpFlags(TcpFlags::ACK),
        ack: Seq(99),
        ..syn
    };
    let r = reset_for_unknown(&ack, 0).unwrap();
    assert_eq!((r.seq, r.flags), (Seq(99), TcpFlags(TcpFlags::RST)));
    let rst = TcpHeader {
        flags: TcpFlags(TcpFlags::RST),
        ..syn
    };
    assert!(reset_for_unknown(&rst, 0).is_none());
}

#[test]
fn paws_drops_an_old_duplicate_data_segment() {
    let (mut a, mut b, mut now) = pair(&cfg());
    a.send(b"first").unwrap();
    let first = drain(&mut a, now);
    now = now + ms(50);
    a.send(b"second").unwrap();
    deliver(&mut b, now, &first);
    pump(&mut a, &mut b, &mut now, ms(5));
    assert_eq!(read_all(&mut b), b"firstsecond");
    // The old segment, replayed with its old timestamp and a sequence number made current.
    let mut old = first[0].clone();
    old.0.seq = old.0.seq + 11;
    b.on_segment(now, &old.0, &old.1);
    assert_eq!(b.readable(), 0);
    assert_eq!(b.counters().unacceptable_segments, 1);
}

#[test]
fn delayed_ack_waits_for_a_second_segment_or_the_timer() {
    let c = TcpConfig {
        delayed_ack: ms(40),
        ..cfg()
    };
    let (mut a, mut b, now) = pair(&c);
    a.send(&data(500)).unwrap();
    let one = drain(&mut a, now);
    deliver(&mut b, now, &one);
    assert!(drain(&mut b, now).is_empty());
    assert_eq!(b.poll_at(), Some(now + ms(40)));
    assert_eq!(drain(&mut b, now + ms(40)).len(), 1);
    a.send(&data(2 * a.send_mss() as usize)).unwrap();
    let two = drain(&mut a, now);
    assert_eq!(two.len(), 2);
    deliver(&mut b, now, &two);
    assert_eq!(
        drain(&mut b, now).len(),
        1,
        "every second segment is acknowledged at once"
    );
}

#[test]
fn abort_sends_rst_and_send_after_close_is_refused() {
    let (mut a, _b, now) = pair(&cfg());
    a.close();
    assert!(a.send(b"late").is_err());
    let (mut a, _b, _) = pair(&cfg());
    a.abort();
    let out = drain(&mut a, now);
    assert_eq!(out.len(), 1);
    assert!(out[0].0.flags.rst());
    assert_eq!(a.state(), State::Closed);
}

/// 16,384 connections (issue 20's scale) held at once, each through a handshake, one byte each way and
/// an orderly close; the state outside the buffers stays small (about 1 KiB: 16,384 connections in
/// 17 MiB), and the buffers hold no memory once empty and idle.
#[test]
fn sixteen_thousand_connections_are_held_at_once() {
    const N: usize = 16_384;
    let small = TcpConfig {
        send_buffer: 2048,
        recv_buffer: 2048,
        time_wait: ms(60_000),
        ..cfg()
    };
    let state_bytes = std::mem::size_of::<Connection>();
    assert!(state_bytes <= 1088, "Connection is {state_bytes} bytes");
    println!("Connection state: {state_bytes} bytes plus its two rings");
    let mut now = Instant::from_millis(1);
    let mut clients: Vec<Connection> = (0..N)
        .map(|i| Connection::connect(&small, 10_000 + (i % 50_000) as u16, 80, i as u32 * 7919, 0, now))
        .collect();
    let mut servers: Vec<Connection> = clients
        .iter_mut()
        .enumerate()
        .map(|(i, c)| {
            let syn = drain(c, now);
            Connection::accept(&small, &syn[0].0, i as u32 * 104_729, 0, now).unwrap()
        })
        .collect();
    for (c, s) in clients.iter_mut().zip(servers.iter_mut()) {
        pump(c, s, &mut now, Duration::ZERO);
        c.send(b"x").unwrap();
        s.send(b"y").unwrap();
    }
    for (c, s) in clients.iter_mut().zip(servers.iter_mut()) {
        pump(c, s, &mut now, Duration::ZERO);
        assert_eq!((read_all(c), read_all(s)), (b"y".to_vec(), b"x".to_vec()));
        assert_eq!((c.state(), s.state()), (State::Established, State::Established));
    }
    for (c, s) in clients.iter_mut().zip(servers.iter_mut()) {
        c.close();
        pump(c, s, &mut now, Duration::ZERO);
        s.close();
        pump(c, s, &mut now, Duration::ZERO);
        assert_eq!((c.state(), s.state()), (State::TimeWait, State::Closed));
    }
    // A second later the TIME-WAIT ends hold no buffer memory either.
    now = now + ms(1001);
    for c in clients.iter_mut() {
        assert!(c.buffer_memory() > 0);
        let _ = drain(c, now);
        assert_eq!((c.state(), c.buffer_memory()), (State::TimeWait, 0));
    }
}

/// Pacing (BBR §4.6.2): with the model-based controller, once the initial window's allowance is spent a
/// sender with a large window does not burst it; it sends a bucket's worth and asks to be polled again
/// when tokens are back. NewReno is not paced: the whole window leaves at once.
#[test]
fn the_model_based_controller_paces_what_the_window_allows() {
    let bbr = TcpConfig {
        congestion: super::CongestionControl::Bbr,
        ..cfg()
    };
    let (mut a, mut b, mut now) = pair(&bbr);
    // Grow the model past the initial window: 20 round trips of bulk data.
    let bulk = data(60_000);
    for _ in 0..20 {
        a.send(&bulk).unwrap();
        pump(&mut a, &mut b, &mut now, ms(5));
        read_all(&mut b);
    }
    a.send(&data(60_000)).unwrap();
    let burst = drain(&mut a, now);
    let window = a.congestion_window() as usize / 1000;
    assert!(!burst.is_empty());
    assert!(
        burst.len() < window,
        "{} segments sent at once, window {window}",
        burst.len()
    );
    let next = a.poll_at().expect("a pacing time");
    assert!(next > now && next < now + ms(5), "{next:?} {now:?}");
    // Polled at that time: more segments leave.
    assert!(!drain(&mut a, next).is_empty());

    let (mut a, _b, now) = pair(&cfg());
    a.send(&data(60_000)).unwrap();
    assert_eq!(drain(&mut a, now).len(), 10, "NewReno's initial window at once");
}

/// RFC 8985 §6.3: two segments lost near the tail, too few SACKed above them for DupThresh (even lowered
/// by early retransmit): the RACK reordering timer marks them lost and they are resent long before the
/// RTO, without a probe.
#[test]
fn rack_timer_repairs_holes_duplicate_acks_cannot_mark() {
    let (mut a, mut b, mut now) = pair(&cfg());
    let segs = flight(&mut a, now, 10);
    now = now + ms(5);
    let mut acks = Vec::new();
    for (i, s) in segs.iter().enumerate() {
        if i != 7 && i != 8 {
            deliver(&mut b, now, std::slice::from_ref(s));
            acks.extend(drain(&mut b, now));
        }
    }
    now = now + ms(5);
    deliver(&mut a, now, &acks);
    assert!(drain(&mut a, now).is_empty(), "nothing is lost yet");
    assert_eq!(a.counters().fast_retransmits, 0);
    // The timer: the holes' transmission time + RACK.rtt (10 ms) + the reordering window (min_RTT/4).
    let at = a.poll_at().unwrap();
    assert!(at < now + ms(10), "RACK timer, not the RTO: {at:?} vs {now:?}");
    now = at;
    let rtx = drain(&mut a, now);
    let seqs: Vec<Seq> = rtx.iter().map(|s| s.0.seq).collect();
    assert_eq!(seqs, vec![segs[7].0.seq, segs[8].0.seq]);
    deliver(&mut b, now + ms(5), &rtx);
    pump(&mut a, &mut b, &mut now, ms(5));
    assert_eq!(read_all(&mut b).len(), 10 * a.send_mss() as usize);
    let c = a.counters();
    assert_eq!((c.rto_events, c.tlp_probes, c.fast_retransmits), (0, 0, 1));
}

/// Issue 34: once the path has shown reordering (with SACK), counting no longer marks losses — RACK's
/// time-based rule alone does. A segment overtaken by nine others is not resent at once (DupThresh would
/// have called it lost), and when it arrives within the reordering window nothing was resent at all.
#[test]
fn after_reordering_a_segment_overtaken_by_many_is_not_resent_by_count() {
    let (mut a, mut b, mut now) = pair(&cfg());
    // A first flight, its segments 1 and 2 swapped on the way: reordering seen.
    let segs = flight(&mut a, now, 4);
    now = now + ms(5);
    let mut acks = Vec::new();
    for i in [0usize, 2, 1, 3] {
        deliver(&mut b, now, std::slice::from_ref(&segs[i]));
        acks.extend(drain(&mut b, now));
    }
    now = now + ms(5);
    deliver(&mut a, now, &acks);
    assert!(drain(&mut a, now).is_empty());
    assert_eq!(a.counters().fast_retransmits, 0);
    // A second flight: segment 0 arrives after the other nine, 5 ms later.
    let segs = flight(&mut a, now, 10);
    now = now + ms(5);
    let mut acks = Vec::new();
    for s in &segs[1..] {
        deliver(&mut b, now, std::slice::from_ref(s));
        acks.extend(drain(&mut b, now));
    }
    now = now + ms(5);
    deliver(&mut a, now, &acks);
    assert!(
        drain(&mut a, now).is_empty(),
        "nine segments SACKed above a hole: RACK's window has not passed yet, so nothing is resent"
    );
    assert_eq!(a.counters().fast_retransmits, 0);
    deliver(&mut b, now, std::slice::from_ref(&segs[0]));
    pump(&mut a, &mut b, &mut now, ms(5));
    let c = a.counters();
    assert_eq!(
        (c.retransmitted_segments, c.fast_retransmits, c.rto_events),
        (0, 0, 0)
    );
    assert_eq!(read_all(&mut b).len(), 14 * a.send_mss() as usize);
}

/// Issue 34: the first retransmission of an episode proves needless (its original was only late: the ACK
/// echoes the original's timestamp, RFC 3522), but a later hole is lost too: the episode is not undone,
/// so that hole is repaired in it rather than in a new one.
#[test]
fn a_late_first_segment_does_not_undo_an_episode_with_another_hole() {
    let (mut a, mut b, mut now) = pair(&cfg());
    let segs = flight(&mut a, now, 10);
    now = now + ms(5);
    // Segment 0 late, segment 5 lost.
    let mut acks = Vec::new();
    for (i, s) in segs.iter().enumerate() {
        if i != 0 && i != 5 {
            deliver(&mut b, now, std::slice::from_ref(s));
            acks.extend(drain(&mut b, now));
        }
    }
    now = now + ms(5);
    deliver(&mut a, now, &acks);
    let rtx = drain(&mut a, now);
    assert_eq!(
        rtx.first().map(|s| s.0.seq),
        Some(segs[0].0.seq),
        "fast retransmit of the first hole"
    );
    assert_eq!(a.counters().fast_retransmits, 1);
    // The original of segment 0 arrives before its retransmission: the ACK echoes its timestamp.
    deliver(&mut b, now, std::slice::from_ref(&segs[0]));
    let late = drain(&mut b, now);
    now = now + ms(5);
    deliver(&mut a, now, &late);
    assert_eq!(
        a.counters().spurious_recoveries,
        0,
        "segment 5 is still lost: no undo"
    );
    deliver(&mut b, now, &rtx);
    pump(&mut a, &mut b, &mut now, ms(5));
    assert_eq!(read_all(&mut b).len(), 10 * a.send_mss() as usize);
    let c = a.counters();
    assert_eq!((c.fast_retransmits, c.rto_events), (1, 0), "{c:?}");
}

/// A pair after a flight of ten segments whose first was lost and the other nine SACKed, 10 ms later:
/// (client, server, now, the flight, what the client sent on those ACKs).
fn first_of_ten_lost() -> (Connection, Connection, Instant, Vec<Seg>, Vec<Seg>) {
    let (mut a, mut b, mut now) = pair(&cfg());
    let segs = flight(&mut a, now, 10);
    now = now + ms(5);
    let mut acks = Vec::new();
    for s in segs.iter().skip(1) {
        deliver(&mut b, now, std::slice::from_ref(s));
        acks.extend(drain(&mut b, now));
    }
    now = now + ms(5);
    deliver(&mut a, now, &acks);
    let rtx = drain(&mut a, now);
    (a, b, now, segs, rtx)
}

/// RFC 8985 §6.2: a retransmission is timed like an original, so when it is lost too, data sent after it
/// and delivered shows the loss, and it is resent again without waiting for the RTO.
#[test]
fn rack_finds_a_lost_retransmission() {
    let (mut a, mut b, mut now, segs, rtx) = first_of_ten_lost();
    assert_eq!(rtx[0].0.seq, segs[0].0.seq, "fast retransmit");
    // That retransmission is lost as well; new data follows it and is delivered.
    a.send(&data(3 * a.send_mss() as usize)).unwrap();
    now = now + ms(1);
    let more = drain(&mut a, now);
    assert!(!more.is_empty());
    now = now + ms(5);
    deliver(&mut b, now, &more);
    let acks = drain(&mut b, now);
    now = now + ms(5);
    deliver(&mut a, now, &acks);
    let mut again = drain(&mut a, now);
    if again.is_empty() {
        let before = now;
        now = a.poll_at().unwrap();
        assert!(now < before + ms(50), "the RACK timer, not the RTO (200 ms)");
        again = drain(&mut a, now);
    }
    assert_eq!(again[0].0.seq, segs[0].0.seq, "the lost retransmission, again");
    assert_eq!(a.counters().lost_retransmissions, 1);
    deliver(&mut b, now + ms(5), &again);
    pump(&mut a, &mut b, &mut now, ms(5));
    assert_eq!(read_all(&mut b).len(), 13 * a.send_mss() as usize);
    assert_eq!(a.counters().rto_events, 0);
}

/// Issue 34: a fast retransmission lost again when the sender has nothing more to send (its peer's
/// window full, or the application waiting): no later segment is delivered, so RACK cannot find it lost.
/// The stalled-recovery probe (`timers.rs`) resends it after a PTO instead of waiting for the RTO.
#[test]
fn a_stalled_recovery_is_probed_before_the_rto() {
    let (mut a, mut b, mut now, segs, rtx) = first_of_ten_lost();
    assert_eq!(rtx.len(), 1);
    assert_eq!(rtx[0].0.seq, segs[0].0.seq, "fast retransmit");
    // That retransmission is lost, and nothing follows it.
    let sent = now;
    now = a.poll_at().unwrap();
    assert!(
        now < sent + ms(50),
        "a probe after 2·SRTT, not the RTO (200 ms): {now:?}"
    );
    let probe = drain(&mut a, now);
    assert_eq!(probe.len(), 1);
    assert_eq!(probe[0].0.seq, segs[0].0.seq, "the head, again");
    assert_eq!(a.counters().tlp_probes, 1);
    // One probe per stall: lost too, the RTO is next.
    let next = a.poll_at().unwrap();
    assert!(next >= now + ms(200), "{next:?}");
    deliver(&mut b, now + ms(5), &probe);
    pump(&mut a, &mut b, &mut now, ms(5));
    assert_eq!(read_all(&mut b).len(), 10 * a.send_mss() as usize);
    assert_eq!(a.counters().rto_events, 0);
}

/// RFC 9293 §3.8.3 R2 as a time (RFC 5482's user timeout): a peer that answers nothing is given up 2 s
/// after the first retransmission timeout, after a handful of timeouts, not after `max_retransmissions`.
#[test]
fn the_user_timeout_gives_up_on_a_silent_peer() {
    let c = TcpConfig {
        user_timeout: Some(ms(2000)),
        max_retransmissions: 100,
        ..cfg()
    };
    let (mut a, _b, mut now) = pair(&c);
    a.send(&data(3000)).unwrap();
    let _lost = drain(&mut a, now);
    let mut first_rto = None;
    while a.state() != State::Closed {
        now = a.poll_at().expect("a timer runs until it gives up");
        let _ = drain(&mut a, now);
        if a.counters().rto_events == 1 && first_rto.is_none() {
            first_rto = Some(now);
        }
        assert!(a.counters().rto_events < 10, "{:?}", a.counters());
    }
    assert!(a.take_events().contains(Events::TIMED_OUT));
    assert_eq!(now, first_rto.unwrap() + ms(2000));
}

/// RFC 2883 §4: a segment received twice is reported in a D-SACK block (first, below the cumulative ACK);
/// the sender takes it as a spurious retransmission and widens RACK's reordering window (RFC 8985 §6.2
/// step 4), once per round trip.
#[test]
fn a_duplicate_segment_is_reported_by_dsack_and_widens_the_reordering_window() {
    let (mut a, mut b, mut now) = pair(&cfg());
    let segs = flight(&mut a, now, 2);
    now = now + ms(5);
    deliver(&mut b, now, &segs);
    let acks = drain(&mut b, now);
    assert_eq!(acks.last().unwrap().0.options.sack_count, 0);
    // The first segment again (a retransmission that was not needed): entirely below RCV.NXT.
    deliver(&mut b, now, &segs[..1]);
    let dup_ack = drain(&mut b, now);
    assert_eq!(dup_ack.len(), 1);
    let o = dup_ack[0].0.options;
    let len = segs[0].1.len() as u32;
    assert_eq!(o.sacks(), &[(segs[0].0.seq, segs[0].0.seq + len)]);
    // Reported once: nothing more to send, and B's next data segment carries no SACK block.
    assert!(drain(&mut b, now).is_empty());
    b.send(b"reply").unwrap();
    let reply = drain(&mut b, now);
    assert_eq!(reply[0].0.options.sack_count, 0);
    now = now + ms(5);
    assert_eq!(a.reo_wnd_mult(), 1);
    deliver(&mut a, now, &acks);
    deliver(&mut a, now, &dup_ack);
    assert_eq!(a.reo_wnd_mult(), 2);
    // A part already received, part new: the old part is the D-SACK block.
    a.send(&data(100)).unwrap();
    let new = drain(&mut a, now);
    let mut overlap = new[0].clone();
    overlap.0.seq = overlap.0.seq - 10;
    overlap.1 = [segs[1].1[segs[1].1.len() - 10..].to_vec(), overlap.1].concat();
    deliver(&mut b, now, &[overlap]);
    let ack = drain(&mut b, now);
    assert_eq!(ack[0].0.options.sacks(), &[(new[0].0.seq - 10, new[0].0.seq)]);
    assert_eq!(read_all(&mut b).len(), 2 * a.send_mss() as usize + 100);
}

/// RFC 7323 §2.4 and RFC 9293 §3.8.6: a scaled window field is the window rounded to a multiple of
/// 2^shift; rounding down when the reader is slow would move the right edge back by a few bytes, which the
/// receiver must not do. Segments of 999 bytes into a 256 KiB buffer (shift 3) that nobody reads.
#[test]
fn a_scaled_window_never_moves_its_right_edge_back() {
    let big = TcpConfig {
        mss: 999,
        recv_buffer: 256 * 1024,
        send_buffer: 512 * 1024,
        ..cfg()
    };
    let (mut a, mut b, mut now) = pair(&big);
    let ((shift, _), ..) = b.negotiated();
    assert_eq!(shift, 3);
    a.send(&data(300_000)).unwrap();
    let mut right: Option<Seq> = None;
    for _ in 0..10_000 {
        let from_a = drain(&mut a, now);
        let from_b = drain(&mut b, now);
        for (h, _) in &from_b {
            if h.flags.ack() && !h.flags.syn() {
                let edge = h.ack + (u32::from(h.window) << shift);
                if let Some(before) = right {
                    assert!(
                        edge >= before,
                        "right edge moved back from {before:?} to {edge:?}"
                    );
                }
                right = Some(edge);
            }
        }
        if from_a.is_empty() && from_b.is_empty() {
            match a.poll_at() {
                Some(at) if b.readable() < 256 * 1024 - 999 => now = at,
                _ => break,
            }
            continue;
        }
        now = now + ms(5);
        deliver(&mut b, now, &from_a);
        deliver(&mut a, now, &from_b);
    }
    assert!(right.is_some());
    let mut got = read_all(&mut b);
    while got.len() < 300_000 {
        pump(&mut a, &mut b, &mut now, ms(5));
        let more = read_all(&mut b);
        if more.is_empty() {
            now = a
                .poll_at()
                .or(b.poll_at())
                .expect("a timer while data is missing");
        }
        got.extend(more);
    }
    assert_eq!(got, data(300_000));
}
