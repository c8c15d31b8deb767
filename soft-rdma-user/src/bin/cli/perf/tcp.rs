//! The kernel-TCP baselines (`tcp-stream`, `tcp-pingpong`, `tcp-connect`): their 32-byte header, server
//! and client.

use super::*;

pub(super) const TCP_MAGIC: &[u8; 4] = b"SRPT";

/// What a TCP baseline client asks for: its first 32 bytes (magic, version, kind, size, iterations).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct TcpHeader {
    pub(super) test: PerfTest,
    pub(super) size: u32,
    pub(super) iters: u32,
}

impl TcpHeader {
    pub(super) fn connect() -> TcpHeader {
        TcpHeader {
            test: PerfTest::TcpConnect,
            size: 0,
            iters: 0,
        }
    }

    pub(super) fn encode(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        b[..4].copy_from_slice(TCP_MAGIC);
        b[4] = VERSION;
        b[5] = match self.test {
            PerfTest::TcpStream => 0,
            PerfTest::TcpPingpong => 1,
            _ => 2,
        };
        b[8..12].copy_from_slice(&self.size.to_be_bytes());
        b[12..16].copy_from_slice(&self.iters.to_be_bytes());
        b
    }

    pub(super) fn decode(b: &[u8; 32]) -> Result<TcpHeader> {
        ensure!(
            &b[..4] == TCP_MAGIC && b[4] == VERSION,
            "not a soft-rdma perf TCP client"
        );
        let test = match b[5] {
            0 => PerfTest::TcpStream,
            1 => PerfTest::TcpPingpong,
            2 => PerfTest::TcpConnect,
            k => bail!("unknown TCP test {k}"),
        };
        let u32_at = |o: usize| u32::from_be_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        Ok(TcpHeader {
            test,
            size: u32_at(8),
            iters: u32_at(12),
        })
    }
}

/// The TCP server: every client on its own task (connection-setup clients come hundreds at a time).
pub(super) async fn tcp_serve(a: &PerfArgs) -> Result<()> {
    let socket = if a.addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket
        .bind(a.addr)
        .with_context(|| format!("binding {}", a.addr))?;
    let listener = socket.listen(4096)?;
    if !a.json {
        println!(
            "soft-rdma perf TCP server on {}: serves tcp-stream, tcp-pingpong and tcp-connect, as each client asks{}",
            listener.local_addr()?,
            if a.once { " (one client)" } else { "" }
        );
    }
    let json = a.json;
    loop {
        let (s, peer) = listener.accept().await?;
        let task = serve_in_task(peer, tcp_serve_one(s, peer, json));
        if a.once {
            return task.await?;
        }
    }
}

pub(super) async fn tcp_serve_one(mut s: tokio::net::TcpStream, peer: SocketAddr, json: bool) -> Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    s.set_nodelay(true)?;
    let mut hdr = [0u8; 32];
    s.read_exact(&mut hdr).await?;
    let h = TcpHeader::decode(&hdr)?;
    if h.test == PerfTest::TcpConnect {
        s.write_all(&hdr).await?;
        let mut b = [0u8; 64];
        while s.read(&mut b).await? > 0 {}
        return Ok(());
    }
    ensure!(h.size > 0 && h.iters > 0, "bad request {h:?}");
    // The data tests use blocking sockets, as the client does: the plainest kernel-TCP path.
    let std = s.into_std()?;
    std.set_nonblocking(false)?;
    let line = tokio::task::spawn_blocking(move || tcp_serve_data(std, h)).await??;
    if json {
        println!(
            "{}",
            serde_json::json!({"peer": peer, "test": h.test, "bytes": h.size, "iterations": h.iters, "result": line})
        );
    } else {
        println!(
            "client {peer}: {} {} B × {}: {line}",
            h.test.name(),
            h.size,
            h.iters
        );
    }
    Ok(())
}

pub(super) fn tcp_serve_data(mut s: std::net::TcpStream, h: TcpHeader) -> Result<String> {
    use std::io::Read;
    let sz = h.size as usize;
    let line = if h.test == PerfTest::TcpStream {
        let total = h.size as u64 * h.iters as u64;
        // The last message is checked against the pattern (as the soft-rdma servers check their buffer).
        let last_at = total - h.size as u64;
        let mut buf = vec![0u8; 256 << 10];
        let (mut got, mut bad) = (0u64, 0u64);
        while got < total {
            let want = (total - got).min(buf.len() as u64) as usize;
            let n = s.read(&mut buf[..want])?;
            ensure!(n > 0, "the client closed after {got} of {total} bytes");
            let end = got + n as u64;
            if end > last_at {
                let from = got.max(last_at);
                for at in from..end {
                    if buf[(at - got) as usize] != pattern((at - last_at) as usize) {
                        bad += 1;
                    }
                }
            }
            got = end;
        }
        let mut done = [0u8; 16];
        done[..8].copy_from_slice(&got.to_be_bytes());
        done[8..].copy_from_slice(&bad.to_be_bytes());
        s.write_all(&done)?;
        format!(
            "received {got} bytes{}",
            if bad == 0 { ", data ok" } else { ", DATA MISMATCH" }
        )
    } else {
        let mut buf = vec![0u8; sz];
        for _ in 0..h.iters {
            s.read_exact(&mut buf)?;
            s.write_all(&buf)?;
        }
        "echoed".to_owned()
    };
    // Wait for the client to close.
    let mut b = [0u8; 1];
    let _ = s.read(&mut b);
    Ok(line)
}

/// One tcp-stream or tcp-pingpong row: the same figures, sizes and iterations as the soft-rdma rows.
pub(super) async fn tcp_client(a: &PerfArgs, size: u32, iters: u32) -> Result<Row> {
    let (addr, test) = (a.addr, a.test);
    let timeout = Duration::from_secs_f64(a.timeout);
    let (m, server_bytes) =
        tokio::task::spawn_blocking(move || tcp_client_blocking(addr, test, size, iters, timeout)).await??;
    let mode = if test == PerfTest::TcpStream { "bw" } else { "lat" };
    let lat_kind = if test == PerfTest::TcpStream {
        "write-call"
    } else {
        "half-round-trip"
    };
    Ok(Row::new(
        test,
        mode,
        size,
        iters,
        1,
        lat_kind,
        Measured { server_bytes, ..m },
    ))
}

pub(super) fn tcp_client_blocking(
    addr: SocketAddr,
    test: PerfTest,
    size: u32,
    iters: u32,
    timeout: Duration,
) -> Result<(Measured, Option<u64>)> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect_timeout(&addr, timeout)
        .with_context(|| format!("TCP connect to {addr}"))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    // One warm-up message (a ping-pong's round) before the clock starts, as soft-rdma's runs do
    // (`bandwidth::client_bw`, `latency::Rounds`).
    let stream = test == PerfTest::TcpStream;
    let sent = iters + 1;
    s.write_all(
        &TcpHeader {
            test,
            size,
            iters: sent,
        }
        .encode(),
    )?;
    let sz = size as usize;
    let data = pattern_bytes(sz);
    let mut lat = Vec::with_capacity(iters as usize);
    let mut progress = Progress::new(format!("{} {sz} B", test.name()), iters);
    s.write_all(&data)?;
    if !stream {
        let mut pong = vec![0u8; sz];
        s.read_exact(&mut pong).context("waiting for the warm-up pong")?;
    }
    mark_interval(false);
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    let mut server_bytes = None;
    if test == PerfTest::TcpStream {
        for i in 0..iters {
            let t = Instant::now();
            s.write_all(&data)?;
            lat.push(us(t.elapsed()));
            progress.tick(i + 1);
        }
        let mut done = [0u8; 16];
        s.read_exact(&mut done)
            .context("waiting for the server's count")?;
        let got = u64::from_be_bytes(done[..8].try_into().expect("8"));
        let bad = u64::from_be_bytes(done[8..].try_into().expect("8"));
        let want = u64::from(size) * u64::from(sent);
        ensure!(got == want, "the server received {got} bytes; {want} were sent");
        ensure!(bad == 0, "the server found {bad} bad bytes in the last message");
        server_bytes = Some(got);
    } else {
        let mut buf = vec![0u8; sz];
        for i in 0..iters {
            let t = Instant::now();
            s.write_all(&data)?;
            s.read_exact(&mut buf).context("waiting for the pong")?;
            lat.push(us(t.elapsed()) / 2.0);
            progress.tick(i + 1);
        }
        ensure!(buf == data, "the pong differs from the ping");
    }
    let elapsed = t0.elapsed();
    let cpu = cpu_time().saturating_sub(cpu0);
    mark_interval(true);
    progress.finish();
    Ok((
        Measured {
            elapsed,
            cpu,
            lat,
            server_bytes: None,
        },
        server_bytes,
    ))
}
