//! The client's bandwidth tests (`send`, `write`, `read`): one connection per message size, the operations
//! kept in flight, and the data checked at the end.

use super::*;

/// What the client registered for one test.
pub(super) struct ClientBufs {
    /// send: the source (Receives of --latency pongs land after it); write: the source (--latency: the
    /// landing buffer at 0, the source at `size`); read: the sink.
    pub(super) data: MemoryRegion,
    pub(super) ctrl: CtrlBufs,
}

pub(super) async fn client_one(
    adapter: &Adapter,
    a: &PerfArgs,
    test: Test,
    size: u32,
    iters: u32,
    mode: &'static str,
) -> Result<Row> {
    let info = adapter.info().clone();
    let sz = size as usize;
    let depth = a.depth.min(
        info.max_send_queue_depth
            .saturating_sub(CTRL_SLOTS as u32 + 1)
            .max(1),
    );
    let timeout = Duration::from_secs_f64(a.timeout);

    let (data_len, access) = match (test, a.latency) {
        (Test::Send, false) => (sz, Access::LOCAL_WRITE),
        (Test::Send, true) => (2 * sz, Access::LOCAL_WRITE),
        (Test::Write, false) => (sz, Access::LOCAL_WRITE),
        (Test::Write, true) => (2 * sz, Access::LOCAL_WRITE | Access::REMOTE_WRITE),
        (Test::Read, _) => (sz, Access::LOCAL_WRITE),
    };
    let data = adapter
        .register_memory(data_len, access)
        .await
        .context("registering the data buffer")?;
    match (test, a.latency) {
        (Test::Send | Test::Write, false) => data.write_at(0, &pattern_bytes(sz))?,
        (Test::Send, true) => data.write_at(0, &pattern_bytes(sz))?,
        (Test::Write, true) => {
            data.fill(0, sz, 0)?;
            data.write_at(sz, &pattern_bytes(sz))?;
        }
        (Test::Read, _) => data.fill(0, sz, 0)?,
    }
    let mut bufs = ClientBufs {
        data,
        ctrl: CtrlBufs::new(adapter).await?,
    };

    let send_depth = (depth + CTRL_SLOTS as u32 + 1).min(info.max_send_queue_depth);
    let recv_depth = (CTRL_SLOTS as u32 + 2).min(info.max_receive_queue_depth);
    let (qp, cq) = queue_pair_with_cq(adapter, send_depth, recv_depth).await?;
    // Receives first: iWARP has no receiver-not-ready retry.
    match (test, a.latency) {
        (Test::Send, true) => {
            for slot in 0..2 {
                qp.receive(CTRL_RECV | slot, &[bufs.data.sge(size as u64, size)])?;
            }
        }
        (Test::Send | Test::Write, false) => {
            for slot in 0..4 {
                bufs.ctrl.post_receive(&qp, slot)?;
            }
        }
        _ => {}
    }
    // One warm-up message first, untimed (`client_bw`; a latency test's first round, `latency::Rounds`):
    // the server serves it too.
    let warmup = 1;
    let request = Request {
        test,
        latency: a.latency,
        busy_poll: a.busy_poll,
        size,
        iters: iters + warmup,
        depth,
        client: if test == Test::Write && a.latency {
            bufs.data.remote(0)
        } else {
            RemoteBuffer {
                stag: Stag(0),
                offset: 0,
            }
        },
    };
    let connector = adapter.create_connector().await?;
    let limits = ReadLimits {
        inbound: 16.min(info.max_inbound_read_limit),
        outbound: depth.min(info.max_outbound_read_limit).max(1),
    };
    let answer =
        Answer::decode(&connect(&connector, &qp, a.addr, limits, &request.encode(), timeout).await?)?;
    connector.complete_connect().await?;
    let mut conn = Conn::new(connector, qp, cq, timeout);

    let label = format!("{} {mode} {size} B", test.name());
    let result = match (test, a.latency) {
        (_, false) => client_bw(&mut conn, &mut bufs, test, size, iters, depth, answer, label).await,
        (Test::Send, true) => client_send_lat(&mut conn, &bufs, size, iters, a.busy_poll, label).await,
        (Test::Write, true) => client_write_lat(&mut conn, &bufs, size, iters, answer, label).await,
        (Test::Read, true) => {
            client_read_lat(&mut conn, &bufs, size, iters, a.busy_poll, answer, label).await
        }
    };
    mark_interval(true);
    conn.close().await;
    let lat_kind = match (a.latency, test) {
        (false, _) => "post-to-completion",
        (true, Test::Read) => "round-trip",
        (true, _) => "half-round-trip",
    };
    let depth = if a.latency { 1 } else { depth };
    Ok(Row::new(
        PerfTest::from(test),
        mode,
        size,
        iters,
        depth,
        lat_kind,
        result?,
    ))
}

/// What one measured run yields.
pub(super) struct Measured {
    pub(super) elapsed: Duration,
    pub(super) cpu: Duration,
    /// µs per operation.
    pub(super) lat: Vec<f64>,
    pub(super) server_bytes: Option<u64>,
}

#[allow(clippy::too_many_arguments)]
/// `iters` messages measured, after one warm-up message that is not: the clock (and the measured interval
/// of `cargo xtask bench`) starts when its completion arrives, so that connection set-up, in particular the
/// initiator's first-FPDU hold (20 ms, docs/interop.md), stays out of a steady-state figure (it is in the
/// connection-setup figures), as perftest's warm-up keeps it out. The TCP baseline does the same.
pub(super) async fn client_bw(
    conn: &mut Conn,
    bufs: &mut ClientBufs,
    test: Test,
    size: u32,
    iters: u32,
    depth: u32,
    answer: Answer,
    label: String,
) -> Result<Measured> {
    let mut progress = Progress::new(label, iters);
    let mut credits: u64 = match test {
        Test::Send => {
            ensure!(answer.credits > 0, "the server granted no receive credits");
            u64::from(answer.credits)
        }
        _ => u64::MAX,
    };
    let data_op = match test {
        Test::Send => CompletionOp::Send,
        Test::Write => CompletionOp::Write,
        Test::Read => CompletionOp::Read,
    };
    let make = |i: u64| match test {
        Test::Send => WorkRequest::Send {
            id: i,
            sgl: vec![bufs.data.sge(0, size)],
            solicited: false,
            invalidate: None,
            silent: false,
        },
        Test::Write => WorkRequest::Write {
            id: i,
            sgl: vec![bufs.data.sge(0, size)],
            remote: answer.buffer,
            silent: false,
        },
        Test::Read => WorkRequest::Read {
            id: i,
            sink: bufs.data.sge(0, size),
            remote: answer.buffer,
            silent: false,
        },
    };
    let n = iters as usize + 1;
    let mut posted = 0usize;
    let mut completed = 0usize;
    let mut done: Option<Ctrl> = None;
    let mut lat = Vec::with_capacity(n);
    let mut cpu0 = cpu_time();
    let mut t0 = Instant::now();
    let mut post_at = vec![t0; n];
    while completed < n {
        let mut batch = Vec::new();
        let now = Instant::now();
        // The warm-up message alone until it completes.
        let depth = if completed == 0 { 1 } else { depth as usize };
        while posted < n && posted - completed < depth && credits > 0 {
            batch.push(make(posted as u64));
            post_at[posted] = now;
            posted += 1;
            credits -= 1;
        }
        if !batch.is_empty() {
            conn.qp.post(batch)?;
        }
        let got = conn.wait(256, "data completions").await?;
        let now = Instant::now();
        for c in got {
            conn.check(&c, "bandwidth test").await?;
            if c.op == data_op && c.wr_id < n as u64 {
                completed += 1;
                if c.wr_id == 0 {
                    mark_interval(false);
                    cpu0 = cpu_time();
                    t0 = Instant::now();
                } else {
                    lat.push(us(now - post_at[c.wr_id as usize]));
                }
            } else if c.op == CompletionOp::Receive {
                let m = bufs.ctrl.take(&conn.qp, &c)?;
                match m.kind {
                    Kind::Credit => credits += u64::from(m.count),
                    Kind::Done => done = Some(m),
                    Kind::Fin => bail!("unexpected fin from the server"),
                }
            }
        }
        progress.tick(completed.saturating_sub(1) as u32);
    }
    progress.finish();
    // Send: the server's `done` says everything arrived. Write: `fin` (after the Writes) and its `done`.
    if test == Test::Write {
        bufs.ctrl.send(
            &conn.qp,
            Ctrl {
                kind: Kind::Fin,
                count: iters + 1,
                bytes: u64::from(size) * u64::from(iters + 1),
                bad: 0,
            },
        )?;
    }
    if test != Test::Read {
        while done.is_none() {
            let c = conn.next_of(CompletionOp::Receive, "the server's done").await?;
            let m = bufs.ctrl.take(&conn.qp, &c)?;
            if m.kind == Kind::Done {
                done = Some(m);
            }
        }
    }
    let elapsed = t0.elapsed();
    let cpu = cpu_time().saturating_sub(cpu0);
    let mut server_bytes = None;
    match test {
        Test::Send => {
            let d = done.expect("waited for");
            let sent = iters + 1; // with the warm-up
            let want = u64::from(size) * u64::from(sent);
            ensure!(
                d.count == sent && d.bytes == want,
                "the server received {} messages, {} bytes; {sent} messages, {want} bytes were sent",
                d.count,
                d.bytes
            );
            ensure!(
                d.bad == 0,
                "the server found {} bad bytes in what it received",
                d.bad
            );
            server_bytes = Some(d.bytes);
        }
        Test::Write => {
            let d = done.expect("waited for");
            ensure!(d.bad == 0, "the server found {} bad bytes in its buffer", d.bad);
        }
        Test::Read => {
            let bad = pattern_mismatches(&bufs.data, 0, size as usize)?;
            ensure!(bad == 0, "{bad} bytes read differ from the server's pattern");
        }
    }
    Ok(Measured {
        elapsed,
        cpu,
        lat,
        server_bytes,
    })
}
