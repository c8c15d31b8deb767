//! `perf --server`: the listener, its GetConnectionRequest loops, and one client's test served end to end.

use soft_rdma::client::Sge;

use super::*;

/// What the server says about one client.
#[derive(Clone, Debug, serde::Serialize)]
pub(super) struct ServerReport {
    pub(super) peer: SocketAddr,
    pub(super) test: Test,
    pub(super) mode: &'static str,
    pub(super) bytes: u32,
    pub(super) iterations: u32,
    pub(super) depth: u32,
    /// Send bandwidth: messages and bytes received, between the first and last arrival.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) received_messages: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) received_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) receive_gbps: Option<f64>,
    /// Whether the data this side checked was intact (send/write bandwidth).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) data_ok: Option<bool>,
    /// How the connection ended: "disconnected" by the client, or "closed" by the server after waiting.
    pub(super) end: &'static str,
}

/// GetConnectionRequest calls a server keeps outstanding: connection-setup clients may have hundreds of
/// handshakes in flight, and each offer costs the server two calls to its daemon before the next is taken.
pub(super) const ACCEPT_LOOPS: usize = 8;

pub(super) async fn serve(adapter: &Adapter, a: &PerfArgs) -> Result<()> {
    let listener = Arc::new(adapter.create_listener().await?);
    let bound = listener.listen(a.addr, 0).await?;
    if !a.json {
        println!(
            "soft-rdma perf server on {bound}: serves send/write/read, bandwidth or latency, and connect, as each client asks{}",
            if a.once { " (one client)" } else { "" }
        );
    }
    let loops = if a.once { 1 } else { ACCEPT_LOOPS };
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..loops {
        set.spawn(accept_loop(adapter.clone(), listener.clone(), a.clone()));
    }
    // Runs until one loop fails (e.g. the daemon went away); --once: until its one client is served.
    match set.join_next().await {
        Some(r) => r?,
        None => Ok(()),
    }
}

/// Serves client `peer` in a task of its own (`serve`), its failure printed with the client's address.
pub(super) fn serve_in_task(
    peer: SocketAddr,
    serve: impl Future<Output = Result<()>> + Send + 'static,
) -> tokio::task::JoinHandle<Result<()>> {
    tokio::spawn(async move {
        let r = serve.await;
        if let Err(e) = &r {
            eprintln!("client {peer}: {e:#}");
        }
        r
    })
}

pub(super) async fn accept_loop(adapter: Adapter, listener: Arc<Listener>, a: PerfArgs) -> Result<()> {
    loop {
        let connector = adapter.create_connector().await?;
        let offer = listener.get_connection_request(&connector).await?;
        let peer = offer.peer;
        if is_connect_request(&offer.private_data) {
            let timeout = Duration::from_secs_f64(a.timeout);
            let task = serve_in_task(peer, serve_connect(connector, peer, timeout));
            if a.once {
                return task.await?;
            }
            continue;
        }
        match server_one(&adapter, connector, &offer.private_data, peer, &a).await {
            Ok(r) => {
                if a.json {
                    println!("{}", serde_json::to_string(&r)?);
                } else {
                    let mut line = format!(
                        "client {peer}: {} {} {} B × {}",
                        r.test.name(),
                        r.mode,
                        r.bytes,
                        r.iterations
                    );
                    if let (Some(m), Some(b)) = (r.received_messages, r.received_bytes) {
                        line += &format!(", received {m} messages / {b} bytes");
                    }
                    if let Some(g) = r.receive_gbps {
                        line += &format!(" at {g:.3} Gb/s");
                    }
                    if let Some(ok) = r.data_ok {
                        line += if ok { ", data ok" } else { ", DATA MISMATCH" };
                    }
                    line += &format!(" ({})", r.end);
                    println!("{line}");
                }
            }
            Err(e) => {
                eprintln!("client {peer}: {e:#}");
                if a.once {
                    return Err(e);
                }
            }
        }
        if a.once {
            return Ok(());
        }
    }
}

/// Waits for the client to leave (its disconnect, or the queue pair going to error); `None` = no limit.
pub(super) async fn wait_end(conn: &Conn, limit: Option<Duration>) -> &'static str {
    let start = Instant::now();
    loop {
        if conn.wait_gone(Some(Duration::from_secs(1))).await {
            return "disconnected";
        }
        if let Ok(s) = conn.qp.query().await
            && s.state == QueuePairState::Error
        {
            return "disconnected";
        }
        if limit.is_some_and(|l| start.elapsed() >= l) {
            return "closed";
        }
    }
}

/// How the server serves a client, by what it asks: a Read is served by the daemon alone, bandwidth or
/// latency alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    SendBandwidth,
    SendLatency,
    WriteBandwidth,
    WriteLatency,
    Read,
}

impl Role {
    fn of(req: &Request) -> Role {
        match (req.test, req.latency) {
            (Test::Send, false) => Role::SendBandwidth,
            (Test::Send, true) => Role::SendLatency,
            (Test::Write, false) => Role::WriteBandwidth,
            (Test::Write, true) => Role::WriteLatency,
            (Test::Read, _) => Role::Read,
        }
    }
}

/// One client's buffers and queue pair, prepared for the accept.
struct Prepared {
    data: MemoryRegion,
    ctrl: CtrlBufs,
    qp: QueuePair,
    cq: CompletionQueue,
    /// Send bandwidth: the message-sized slots `data` is cut into, one per Receive in flight (else 1).
    slots: usize,
    /// Receives this side keeps posted.
    recv_depth: u32,
}

/// Serves one client end to end: its request checked (else rejected), buffers and queue pair set up, the
/// connection accepted, the test run, and the connection's end awaited.
pub(super) async fn server_one(
    adapter: &Adapter,
    connector: Connector,
    private_data: &[u8],
    peer: SocketAddr,
    a: &PerfArgs,
) -> Result<ServerReport> {
    let req = check_request(adapter, &connector, private_data).await?;
    let role = Role::of(&req);
    let timeout = Duration::from_secs_f64(a.timeout);
    let Prepared {
        data,
        mut ctrl,
        qp,
        cq,
        slots,
        recv_depth,
    } = prepare(adapter, &req, role).await?;
    let answer = Answer {
        buffer: if req.test == Test::Send {
            RemoteBuffer {
                stag: Stag(0),
                offset: 0,
            }
        } else {
            data.remote(0)
        },
        credits: if role == Role::SendBandwidth {
            recv_depth
        } else {
            0
        },
    };
    let limits = ReadLimits {
        inbound: adapter.info().max_inbound_read_limit,
        outbound: 16.min(adapter.info().max_outbound_read_limit),
    };
    tokio::time::timeout(timeout, connector.accept_qp(&qp, limits, &answer.encode()))
        .await
        .map_err(|_| anyhow::anyhow!("accept: the connection was not established within {timeout:?}"))??;
    let mut conn = Conn::new(connector, qp, cq, timeout);
    let mut report = ServerReport {
        peer,
        test: req.test,
        mode: if req.latency { "lat" } else { "bw" },
        bytes: req.size,
        iterations: req.iters,
        depth: req.depth,
        received_messages: None,
        received_bytes: None,
        receive_gbps: None,
        data_ok: None,
        end: "closed",
    };
    let result = match role {
        Role::SendBandwidth => {
            let recv = Receives {
                data: &data,
                slots,
                depth: recv_depth,
            };
            serve_send_bandwidth(&mut conn, &mut ctrl, recv, &req, &mut report).await
        }
        Role::WriteBandwidth => serve_write_bandwidth(&mut conn, &mut ctrl, &data, &req, &mut report).await,
        Role::SendLatency => serve_send_latency(&mut conn, &data, &req).await,
        Role::WriteLatency => serve_write_latency(&mut conn, &data, &req).await,
        Role::Read => {
            // One-sided: the daemon serves the Reads; wait for the client to leave.
            report.end = wait_end(&conn, None).await;
            Ok(())
        }
    };
    if let Err(e) = result {
        conn.close().await;
        return Err(e);
    }
    if req.test != Test::Read {
        report.end = wait_end(&conn, Some(Duration::from_secs(30))).await;
    }
    conn.close().await;
    Ok(report)
}

/// The client's request from its private data, within this adapter's limits; otherwise the connection is
/// rejected, saying why.
async fn check_request(adapter: &Adapter, connector: &Connector, private_data: &[u8]) -> Result<Request> {
    let req = match Request::decode(private_data) {
        Ok(r) => r,
        Err(e) => {
            let _ = connector.reject(b"soft-rdma perf: bad request").await;
            return Err(e);
        }
    };
    if req.size > adapter.info().max_transfer_length {
        let _ = connector.reject(b"soft-rdma perf: message too large").await;
        bail!("{} bytes exceeds the maximum transfer length", req.size);
    }
    Ok(req)
}

/// Registers the data buffer (filled with what the test checks or sends back), the control buffers and a
/// queue pair, and posts the Receives the client's first messages need.
async fn prepare(adapter: &Adapter, req: &Request, role: Role) -> Result<Prepared> {
    let info = adapter.info().clone();
    let size = req.size;
    let sz = size as usize;
    let credits = if role == Role::SendBandwidth {
        // The depth comes from the peer's private data: saturating, so a huge one is clamped, never overflows.
        req.depth
            .saturating_mul(2)
            .clamp(16, info.max_receive_queue_depth.max(1))
    } else {
        0
    };
    // Send bandwidth: Receives share up to 16 MiB of slots (the data is only checked once, at the end).
    let slots = if role == Role::SendBandwidth {
        (credits as usize).min((16usize << 20).div_ceil(sz)).max(1)
    } else {
        1
    };
    let (data_len, access) = match role {
        Role::SendBandwidth => (slots * sz, Access::LOCAL_WRITE),
        Role::SendLatency => (2 * sz, Access::LOCAL_WRITE),
        Role::WriteBandwidth => (sz, Access::LOCAL_WRITE | Access::REMOTE_WRITE),
        Role::WriteLatency => (2 * sz, Access::LOCAL_WRITE | Access::REMOTE_WRITE),
        Role::Read => (sz, Access::REMOTE_READ),
    };
    let data = adapter.register_memory(data_len, access).await?;
    match role {
        Role::WriteLatency => {
            data.fill(0, sz, 0)?;
            data.write_at(sz, &pattern_bytes(sz))?;
        }
        Role::SendLatency => data.write_at(sz, &pattern_bytes(sz))?,
        Role::Read => data.write_at(0, &pattern_bytes(sz))?,
        _ => data.fill(0, data_len, 0)?,
    }
    let ctrl = CtrlBufs::new(adapter).await?;
    let recv_depth = match role {
        Role::SendBandwidth => credits,
        Role::SendLatency => 2,
        Role::WriteBandwidth => CTRL_SLOTS as u32,
        _ => 1,
    }
    .min(info.max_receive_queue_depth);
    let send_depth = (CTRL_SLOTS as u32 + 2 + LAT_OUTSTANDING).min(info.max_send_queue_depth);
    let (qp, cq) = queue_pair_with_cq(adapter, send_depth, recv_depth).await?;
    match role {
        Role::SendBandwidth => {
            let recv = Receives {
                data: &data,
                slots,
                depth: recv_depth,
            };
            for k in 0..u64::from(recv.depth) {
                qp.receive(k, &[recv.slot_sge(k, size)])?;
            }
        }
        Role::SendLatency => {
            for k in 0..2 {
                qp.receive(k, &[data.sge(0, size)])?;
            }
        }
        Role::WriteBandwidth => {
            for slot in 0..4 {
                ctrl.post_receive(&qp, slot)?;
            }
        }
        _ => {}
    }
    Ok(Prepared {
        data,
        ctrl,
        qp,
        cq,
        slots,
        recv_depth,
    })
}

/// Send bandwidth's Receives: `depth` of them in flight, into `slots` message-sized slots of `data`.
#[derive(Clone, Copy)]
struct Receives<'a> {
    data: &'a MemoryRegion,
    slots: usize,
    depth: u32,
}

impl Receives<'_> {
    /// The slot of Receive `wr_id`, `size` bytes.
    fn slot_sge(&self, wr_id: u64, size: u32) -> Sge {
        self.data
            .sge((wr_id as usize % self.slots * size as usize) as u64, size)
    }
}

/// Send bandwidth: takes the client's Sends, reposting each Receive and granting credits in batches, then
/// checks the last message's data and sends `done` with the messages and bytes received.
async fn serve_send_bandwidth(
    conn: &mut Conn,
    ctrl: &mut CtrlBufs,
    recv: Receives<'_>,
    req: &Request,
    report: &mut ServerReport,
) -> Result<()> {
    let (size, sz) = (req.size, req.size as usize);
    let batch = (recv.depth / 2).max(1);
    let (mut count, mut bytes, mut bad, mut since) = (0u32, 0u64, 0u32, 0u32);
    let mut ctrl_out = 0usize;
    let mut last_slot = 0u64;
    let mut first = None;
    let mut last = Instant::now();
    while count < req.iters {
        for c in conn.wait(256, "the client's sends").await? {
            conn.check(&c, "send bandwidth").await?;
            match c.op {
                CompletionOp::Receive => {
                    last = Instant::now();
                    first.get_or_insert(last);
                    count += 1;
                    bytes += u64::from(c.bytes);
                    if c.bytes != size {
                        bad += 1;
                    }
                    last_slot = c.wr_id;
                    conn.qp.receive(c.wr_id, &[recv.slot_sge(c.wr_id, size)])?;
                    since += 1;
                }
                CompletionOp::Send => ctrl_out = ctrl_out.saturating_sub(1),
                _ => {}
            }
        }
        if since >= batch && count < req.iters && ctrl_out < CTRL_SLOTS - 1 {
            ctrl.send(
                &conn.qp,
                Ctrl {
                    kind: Kind::Credit,
                    count: since,
                    bytes: 0,
                    bad: 0,
                },
            )?;
            ctrl_out += 1;
            since = 0;
        }
    }
    bad += pattern_mismatches(recv.data, last_slot as usize % recv.slots * sz, sz)? as u32;
    ctrl.send(
        &conn.qp,
        Ctrl {
            kind: Kind::Done,
            count,
            bytes,
            bad,
        },
    )?;
    ctrl_out += 1;
    while ctrl_out > 0 {
        conn.next_of(CompletionOp::Send, "control sends").await?;
        ctrl_out -= 1;
    }
    report.received_messages = Some(count);
    report.received_bytes = Some(bytes);
    if let Some(f) = first
        && last > f
    {
        report.receive_gbps = Some(bytes as f64 * 8.0 / (last - f).as_secs_f64() / 1e9);
    }
    report.data_ok = Some(bad == 0);
    Ok(())
}

/// Write bandwidth: waits for the client's `fin` (behind its Writes), checks the buffer, answers `done`.
async fn serve_write_bandwidth(
    conn: &mut Conn,
    ctrl: &mut CtrlBufs,
    data: &MemoryRegion,
    req: &Request,
    report: &mut ServerReport,
) -> Result<()> {
    // The Writes complete nowhere here: wait (as long as it takes) for the fin behind them.
    let timeout = conn.timeout;
    conn.timeout = Duration::from_secs(86_400);
    let c = conn.next_of(CompletionOp::Receive, "the client's fin").await?;
    conn.timeout = timeout;
    let m = ctrl.take(&conn.qp, &c)?;
    ensure!(m.kind == Kind::Fin, "expected fin, got {m:?}");
    let bad = pattern_mismatches(data, 0, req.size as usize)?;
    ctrl.send(
        &conn.qp,
        Ctrl {
            kind: Kind::Done,
            count: m.count,
            bytes: m.bytes,
            bad: bad as u32,
        },
    )?;
    conn.next_of(CompletionOp::Send, "the done send").await?;
    report.data_ok = Some(bad == 0);
    Ok(())
}

/// Send latency: answers each of the client's pings with a pong, reposting the ping's Receive in the same
/// post.
async fn serve_send_latency(conn: &mut Conn, data: &MemoryRegion, req: &Request) -> Result<()> {
    let size = req.size;
    let mut outstanding = 0u32;
    for i in 0..req.iters {
        let mut got = None;
        while got.is_none() {
            let what = "the client's ping";
            for c in conn.get(req.busy_poll, 16, what).await? {
                conn.check(&c, "send latency").await?;
                match c.op {
                    CompletionOp::Receive => got = Some(c.wr_id),
                    CompletionOp::Send => outstanding = outstanding.saturating_sub(1),
                    _ => {}
                }
            }
        }
        // The ping's Receive goes back with the pong, one post; unsignaled but the last, as
        // the client's pings.
        let silent = i + 1 < req.iters;
        conn.qp.post(vec![
            WorkRequest::Receive {
                id: got.expect("set"),
                sgl: vec![data.sge(0, size)],
            },
            WorkRequest::Send {
                id: u64::from(i),
                sgl: vec![data.sge(u64::from(size), size)],
                solicited: false,
                invalidate: None,
                silent,
            },
        ])?;
        if !silent {
            outstanding += 1;
        }
        drain(
            conn,
            CompletionOp::Send,
            &mut outstanding,
            LAT_OUTSTANDING,
            "pong sends",
        )
        .await?;
    }
    drain(conn, CompletionOp::Send, &mut outstanding, 0, "pong sends").await
}

/// Write latency: waits for each ping's sequence byte in its buffer, then Writes the pong into the
/// client's.
async fn serve_write_latency(conn: &mut Conn, data: &MemoryRegion, req: &Request) -> Result<()> {
    let (size, sz) = (req.size, req.size as usize);
    let mut outstanding = 0u32;
    for i in 0..req.iters {
        let seq = (i % 255 + 1) as u8;
        poll_byte(conn, data, sz - 1, seq, CompletionOp::Write, &mut outstanding).await?;
        data.write_at(2 * sz - 1, &[seq])?;
        conn.qp
            .write(u64::from(i), &[data.sge(u64::from(size), size)], req.client)?;
        outstanding += 1;
        drain(
            conn,
            CompletionOp::Write,
            &mut outstanding,
            LAT_OUTSTANDING,
            "pong writes",
        )
        .await?;
    }
    drain(conn, CompletionOp::Write, &mut outstanding, 0, "pong writes").await
}
