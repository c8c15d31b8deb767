//! The client's latency tests: `send` and `write` ping-pong (half round trip) and one outstanding `read`.

use super::*;

/// Keeps at most this many of this side's own requests uncompleted in the latency tests.
pub(super) const LAT_OUTSTANDING: u32 = 8;

/// Waits for completions of this side's own requests of `op` until at most `keep` are outstanding.
pub(super) async fn drain(
    conn: &mut Conn,
    op: CompletionOp,
    outstanding: &mut u32,
    keep: u32,
    what: &str,
) -> Result<()> {
    while *outstanding > keep {
        for c in conn.wait(64, what).await? {
            conn.check(&c, what).await?;
            if c.op == op {
                *outstanding -= 1;
            }
        }
    }
    Ok(())
}

/// One latency test's bookkeeping: a sample per round, the progress line, and the wall and CPU time of the
/// whole test. Round 0 is a warm-up, not measured: a connection's first message waits for the first-FPDU
/// hold (engine/first_fpdu.rs) and meets cold caches. The clock, the CPU time and the measured interval
/// ([`mark_interval`]) start after it; the server serves it as one more round.
struct Rounds {
    progress: Progress,
    lat: Vec<f64>,
    cpu0: Duration,
    t0: Instant,
    iters: u32,
}

impl Rounds {
    fn start(label: String, iters: u32) -> Self {
        Rounds {
            progress: Progress::new(label, iters),
            lat: Vec::with_capacity(iters as usize),
            cpu0: cpu_time(),
            t0: Instant::now(),
            iters,
        }
    }

    /// Rounds to run: the warm-up and the `iters` measured.
    fn total(&self) -> u32 {
        self.iters + 1
    }

    /// Round `i` (0: the warm-up) took `us` µs.
    fn record(&mut self, i: u32, us: f64) {
        if i == 0 {
            mark_interval(false);
            self.cpu0 = cpu_time();
            self.t0 = Instant::now();
            return;
        }
        self.lat.push(us);
        self.progress.tick(i);
    }

    /// The test ends now.
    fn done(self) -> Measured {
        Measured {
            elapsed: self.t0.elapsed(),
            cpu: cpu_time().saturating_sub(self.cpu0),
            lat: self.lat,
            server_bytes: None,
        }
    }
}

pub(super) async fn client_send_lat(
    conn: &mut Conn,
    bufs: &ClientBufs,
    size: u32,
    iters: u32,
    busy: bool,
    label: String,
) -> Result<Measured> {
    let mut rounds = Rounds::start(label, iters);
    let mut outstanding = 0u32;
    // The Receive the last pong used goes back with the next ping, one post (one doorbell at most).
    let mut repost = None;
    let total = rounds.total();
    for i in 0..total {
        let start = Instant::now();
        let mut batch = Vec::with_capacity(2);
        if let Some(id) = repost.take() {
            batch.push(WorkRequest::Receive {
                id,
                sgl: vec![bufs.data.sge(u64::from(size), size)],
            });
        }
        // Unsignaled but the last (perftest's latency tests signal every `cq_mod`th): a round trip wakes
        // each side once, for the message it receives.
        let silent = i + 1 < total;
        batch.push(WorkRequest::Send {
            id: u64::from(i),
            sgl: vec![bufs.data.sge(0, size)],
            solicited: false,
            invalidate: None,
            silent,
        });
        if !silent {
            outstanding += 1;
        }
        conn.qp.post(batch)?;
        let mut end = None;
        while end.is_none() {
            for c in conn.get(busy, 16, "the pong").await? {
                conn.check(&c, "send latency").await?;
                match c.op {
                    CompletionOp::Receive => {
                        end = Some(Instant::now());
                        ensure!(c.bytes == size, "pong of {} bytes, expected {size}", c.bytes);
                        repost = Some(c.wr_id);
                    }
                    CompletionOp::Send => outstanding = outstanding.saturating_sub(1),
                    _ => {}
                }
            }
        }
        let half = us(end.expect("set") - start) / 2.0;
        drain(
            conn,
            CompletionOp::Send,
            &mut outstanding,
            LAT_OUTSTANDING,
            "send completions",
        )
        .await?;
        rounds.record(i, half);
    }
    drain(conn, CompletionOp::Send, &mut outstanding, 0, "send completions").await?;
    Ok(rounds.done())
}

/// Spins until the byte at `offset` of `mr` is `want` (RDMA Write has no completion at its target).
pub(super) async fn poll_byte(
    conn: &mut Conn,
    mr: &MemoryRegion,
    offset: usize,
    want: u8,
    own: CompletionOp,
    outstanding: &mut u32,
) -> Result<Instant> {
    let start = Instant::now();
    let mut b = [0u8];
    let mut spins = 0u32;
    loop {
        mr.read_at(offset, &mut b)?;
        if b[0] == want {
            return Ok(Instant::now());
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(64) {
            for c in conn.poll(16) {
                conn.check(&c, "write latency").await?;
                if c.op == own {
                    *outstanding = outstanding.saturating_sub(1);
                }
            }
            if conn.peer_gone() {
                return Err(PeerGone.into());
            }
            if start.elapsed() > conn.timeout {
                return Err(conn.timed_out("the peer's RDMA Write").await);
            }
            // Two daemons and two of these may share few CPUs: let them run.
            std::thread::yield_now();
            tokio::task::yield_now().await;
        } else {
            std::hint::spin_loop();
        }
    }
}

pub(super) async fn client_write_lat(
    conn: &mut Conn,
    bufs: &ClientBufs,
    size: u32,
    iters: u32,
    answer: Answer,
    label: String,
) -> Result<Measured> {
    let sz = size as usize;
    let mut rounds = Rounds::start(label, iters);
    let mut outstanding = 0u32;
    for i in 0..rounds.total() {
        let seq = (i % 255 + 1) as u8;
        bufs.data.write_at(2 * sz - 1, &[seq])?;
        let start = Instant::now();
        conn.qp.write(
            u64::from(i),
            &[bufs.data.sge(u64::from(size), size)],
            answer.buffer,
        )?;
        outstanding += 1;
        let end = poll_byte(
            conn,
            &bufs.data,
            sz - 1,
            seq,
            CompletionOp::Write,
            &mut outstanding,
        )
        .await?;
        let half = us(end - start) / 2.0;
        drain(
            conn,
            CompletionOp::Write,
            &mut outstanding,
            LAT_OUTSTANDING,
            "write completions",
        )
        .await?;
        rounds.record(i, half);
    }
    drain(
        conn,
        CompletionOp::Write,
        &mut outstanding,
        0,
        "write completions",
    )
    .await?;
    Ok(rounds.done())
}

pub(super) async fn client_read_lat(
    conn: &mut Conn,
    bufs: &ClientBufs,
    size: u32,
    iters: u32,
    busy: bool,
    answer: Answer,
    label: String,
) -> Result<Measured> {
    let mut rounds = Rounds::start(label, iters);
    for i in 0..rounds.total() {
        let start = Instant::now();
        conn.qp
            .read(u64::from(i), bufs.data.sge(0, size), answer.buffer)?;
        let mut end = None;
        while end.is_none() {
            for c in conn.get(busy, 16, "the read").await? {
                conn.check(&c, "read latency").await?;
                if c.op == CompletionOp::Read && c.wr_id == u64::from(i) {
                    end = Some(Instant::now());
                }
            }
        }
        rounds.record(i, us(end.expect("set") - start));
    }
    let measured = rounds.done();
    let bad = pattern_mismatches(&bufs.data, 0, size as usize)?;
    ensure!(bad == 0, "{bad} bytes read differ from the server's pattern");
    Ok(measured)
}
