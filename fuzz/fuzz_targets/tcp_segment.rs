//! soft-rdma's TCP (soft_rdma::tcp) fed arbitrary input, on a connection opened actively, passively or from a
//! SYN cookie's ACK: raw segment bytes through `TcpHeader::parse`,
//! segments crafted near the connection's own sequence numbers (so they pass the acceptability checks and
//! reach ACK, SACK, FIN and RST processing), time steps, timer expiries and application calls. Never
//! panics; every segment it emits fits its payload buffer and the MSS, and re-parses to the same header.
#![no_main]
use libfuzzer_sys::fuzz_target;
use soft_rdma::tcp::wire::MAX_HEADER_LEN;
use soft_rdma::tcp::{Connection, Instant, Keepalive, Seq, TcpConfig, TcpFlags, TcpHeader, TcpOptions};
use soft_rdma_common::syn_cookie::PeerSynOptions;
use std::time::Duration;

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes([self.byte()?, self.byte()?]))
    }
    fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }
}

/// What the fuzzer knows of the connection from its output: its next sequence number and what it acks.
#[derive(Default)]
struct Seen {
    conn_nxt: Seq,
    conn_ack: Seq,
}

fn drain(conn: &mut Connection, now: Instant, seen: &mut Seen) {
    let mut payload = [0u8; 2048];
    let mut frame = [0u8; MAX_HEADER_LEN + 2048];
    for _ in 0..256 {
        let Some((h, n)) = conn.poll_transmit(now, &mut payload) else {
            return;
        };
        assert!(n <= payload.len() && n as u32 <= conn.send_mss().max(1));
        let hl = h.emit(&mut frame).unwrap();
        let (back, off) = TcpHeader::parse(&frame[..hl]).unwrap();
        assert_eq!(off, hl);
        assert_eq!(back.seq, h.seq);
        assert_eq!(back.flags, h.flags);
        let end = h.seq + n as u32 + u32::from(h.flags.syn()) + u32::from(h.flags.fin());
        if end > seen.conn_nxt {
            seen.conn_nxt = end;
        }
        if h.flags.ack() {
            seen.conn_ack = h.ack;
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let Some(mode) = input.byte() else { return };
    let cfg = TcpConfig {
        mss: 536,
        send_buffer: 8192,
        recv_buffer: 2048 << (mode >> 6),
        max_ranges: 4,
        sack: mode & 1 != 0,
        timestamps: mode & 2 != 0,
        window_scaling: mode & 4 != 0,
        delayed_ack: if mode & 8 != 0 {
            Duration::from_millis(40)
        } else {
            Duration::ZERO
        },
        keepalive: (mode & 16 != 0).then_some(Keepalive {
            idle: Duration::from_millis(500),
            interval: Duration::from_millis(100),
            probes: 3,
        }),
        time_wait: Duration::from_millis(500),
        ..TcpConfig::default()
    };
    let mut now = Instant::from_millis(1);
    let mut seen = Seen::default();
    let Some(start) = input.byte() else { return };
    let mut conn = if mode & 32 != 0 {
        Connection::connect(&cfg, 1, 2, 1000, 0, now)
    } else if start & 1 == 0 {
        let options = TcpOptions {
            mss: Some(536),
            window_scale: Some(2),
            sack_permitted: true,
            timestamp: Some((100, 0)),
            ..Default::default()
        };
        let syn = TcpHeader {
            src_port: 2,
            dst_port: 1,
            seq: Seq(5000),
            flags: TcpFlags(TcpFlags::SYN),
            window: 4096,
            options,
            ..Default::default()
        };
        Connection::accept(&cfg, &syn, 1000, 0, now).unwrap()
    } else {
        // Opened from a SYN cookie's ACK (the SYN's options as the cookie carried them, any values).
        let (Some(mss), Some(tsecr_hi), Some(window)) = (input.u16(), input.u16(), input.u16()) else {
            return;
        };
        let ack = TcpHeader {
            src_port: 2,
            dst_port: 1,
            seq: Seq(5001),
            ack: Seq(1001),
            flags: TcpFlags(TcpFlags::ACK),
            window: 4096,
            options: TcpOptions {
                timestamp: Some((100, u32::from(tsecr_hi) << 16)),
                ..Default::default()
            },
            ..Default::default()
        };
        let peer = PeerSynOptions {
            mss,
            window_scale: (start & 2 != 0).then_some(start >> 4),
            sack_permitted: start & 4 != 0,
        };
        let Some(mut c) = Connection::accept_cookie(&cfg, &ack, peer, window, now) else {
            return;
        };
        c.on_segment(now, &ack, &[]);
        c
    };
    let mut ts_val = 100u32;
    let pattern = [0x5au8; 1024];
    let mut sink = [0u8; 4096];
    while let Some(op) = input.byte() {
        match op % 8 {
            0 => {
                let len = usize::from(input.byte().unwrap_or(0));
                let bytes = input.take(len);
                if let Ok((h, off)) = TcpHeader::parse(bytes) {
                    conn.on_segment(now, &h, &bytes[off..]);
                }
            }
            1 | 2 => {
                // A segment near the connection's own numbers.
                let (Some(flags), Some(dseq), Some(dack), Some(window), Some(extra)) =
                    (input.byte(), input.u16(), input.u16(), input.u16(), input.byte())
                else {
                    break;
                };
                let mut options = TcpOptions::default();
                if extra & 1 != 0 {
                    ts_val = ts_val.wrapping_add(u32::from(extra >> 4));
                    options.timestamp = Some((ts_val, 0));
                }
                let sacks = usize::from((extra >> 1) & 3);
                for i in 0..sacks {
                    let (l, r) = (input.u16().unwrap_or(0), input.u16().unwrap_or(0));
                    options.sack_blocks[i] = (seen.conn_nxt - u32::from(l), seen.conn_nxt - u32::from(r));
                }
                options.sack_count = sacks as u8;
                let h = TcpHeader {
                    src_port: 2,
                    dst_port: 1,
                    seq: Seq(seen.conn_ack.0.wrapping_add(i32::from(dseq as i16) as u32)),
                    ack: Seq(seen.conn_nxt.0.wrapping_add(i32::from(dack as i16) as u32)),
                    flags: TcpFlags(flags),
                    window,
                    urgent: 0,
                    options,
                };
                let len = usize::from(extra >> 3) * 32;
                conn.on_segment(now, &h, &pattern[..len.min(pattern.len())]);
            }
            3 => now = now + Duration::from_millis(u64::from(input.u16().unwrap_or(0))),
            4 => {
                if let Some(t) = conn.poll_at() {
                    now = now.max(t);
                }
            }
            5 => {
                let len = usize::from(input.byte().unwrap_or(0)) * 16;
                let _ = conn.send(&pattern[..len.min(pattern.len())]);
            }
            6 => {
                let _ = conn.recv(&mut sink);
            }
            _ => match op >> 3 {
                0 => conn.close(),
                1 => conn.abort(),
                _ => {
                    let _ = conn.take_events();
                }
            },
        }
        drain(&mut conn, now, &mut seen);
    }
});
