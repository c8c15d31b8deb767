//! `soft-rdma demo`: a walk-through of connection management between two daemons (A and B), checking every
//! result it shows: connect with private data and read limits, a reject with private data, a shared-endpoint
//! fan-out, status tables, and a disconnect that the other side is notified of.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use soft_rdma::NdStatus;
use soft_rdma::client::Adapter;
use soft_rdma::client::{ConnectorState, ConnectorStatus, ReadLimits, StatusReport};

use super::{print_status, show};

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Daemon A's socket (the connecting side).
    #[arg(long)]
    a_uds: PathBuf,
    /// Daemon B's socket (the listening side).
    #[arg(long)]
    b_uds: PathBuf,
    /// B's address, as A reaches it.
    #[arg(long)]
    b_addr: IpAddr,
}

fn step(n: u32, title: &str) {
    println!("\n── {n}. {title}");
}

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> Result<T> {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .map_err(|_| anyhow::anyhow!("{what} did not finish in 20 s"))
}

pub async fn run(args: DemoArgs) -> Result<()> {
    let a = Adapter::open(&args.a_uds).await?;
    let b = Adapter::open(&args.b_uds).await?;
    let at = |port| SocketAddr::new(args.b_addr, port);
    println!(
        "soft-rdma demo: daemon A ({}) connects to daemon B ({}) over kernel TCP",
        args.a_uds.display(),
        args.b_uds.display()
    );
    println!(
        "adapter limits: MaxCallerData {} B, MaxCalleeData {} B, read limits ≤ {}",
        a.info().max_caller_data,
        a.info().max_callee_data,
        a.info().max_inbound_read_limit
    );

    step(
        1,
        "B listens; A connects with 32 bytes of private data, IRD 4, ORD 8",
    );
    let listener = b.create_listener().await?;
    let bound = listener.listen(at(7174), 0).await?;
    println!("B: listening on {bound}");
    let active = a.create_connector().await?;
    let passive = b.create_connector().await?;
    let hello = b"hello from A: may I read 8 at once";
    let a_limits = ReadLimits {
        inbound: 4,
        outbound: 8,
    };
    let b_limits = ReadLimits {
        inbound: 16,
        outbound: 2,
    };
    let (connected, accepted) = within("connect/accept", async {
        tokio::join!(
            async {
                active.connect(bound, a_limits, &hello[..32]).await?;
                let seen = (
                    active.read_limits().await?,
                    active.private_data().await?,
                    active.local_addr().await?,
                );
                active.complete_connect().await?;
                Ok::<_, soft_rdma::Error>(seen)
            },
            async {
                let offer = listener.get_connection_request(&passive).await?;
                println!(
                    "B: offer from {}: peer limits (B's view) {:?}, private data {}",
                    offer.peer,
                    offer.limits,
                    show(&offer.private_data)
                );
                passive.accept(b_limits, b"welcome, A").await?;
                Ok::<_, soft_rdma::Error>(offer)
            }
        )
    })
    .await?;
    let (a_limits_seen, a_pd_seen, a_local) = connected?;
    let offer = accepted?;
    // Each side's view, asked of its own connector.
    let a_peer = active.peer_addr().await?;
    println!(
        "A: connected {a_local} → {bound}; B's limits (A's view) {a_limits_seen:?}; private data {}",
        show(&a_pd_seen)
    );
    println!("\n   what each side saw      | A (active)                 | B (passive)");
    println!("   ------------------------+----------------------------+---------------------------");
    println!("   peer address            | {:<26} | {}", a_peer, offer.peer);
    println!(
        "   reads it may issue      | {:<26} | {}",
        a_limits_seen.outbound, offer.limits.outbound
    );
    println!(
        "   reads it must serve     | {:<26} | {}",
        a_limits_seen.inbound, offer.limits.inbound
    );
    println!(
        "   peer's private data     | {:<26} | {}",
        show(&a_pd_seen),
        show(&offer.private_data)
    );
    ensure!(
        offer.private_data.as_ref() == &hello[..32],
        "B received different private data"
    );
    ensure!(
        offer.limits
            == ReadLimits {
                inbound: 8,
                outbound: 4
            },
        "B saw limits {:?}, expected A's 4/8 swapped",
        offer.limits
    );
    ensure!(
        a_pd_seen.as_ref() == b"welcome, A",
        "A received different private data"
    );
    // Accept's values are limited to A's offer before they go out (IND2Connector::Accept, seed 004):
    // B serves min(16, A's ORD 8) = 8 → A may issue 8; B issues min(2, A's IRD 4) = 2 → A serves 2.
    ensure!(
        a_limits_seen
            == ReadLimits {
                inbound: 2,
                outbound: 8
            },
        "A saw limits {a_limits_seen:?}"
    );
    ensure!(
        passive.peer_addr().await? == a_local && offer.peer == a_local,
        "B's peer address is not A's local address"
    );
    ensure!(
        a_peer == bound,
        "A's peer address {a_peer} is not B's listening address {bound}"
    );

    step(
        2,
        "A connects to a listener whose handler refuses, with private data",
    );
    let picky = b.create_listener().await?;
    let picky_addr = picky.listen(at(7175), 0).await?;
    let b2 = b.clone();
    let refuser = tokio::spawn(async move {
        let _ = picky
            .serve(
                &b2,
                |o| {
                    println!(
                        "B handler: offer from {} says {} → refuse",
                        o.peer,
                        show(&o.private_data)
                    );
                    soft_rdma::client::OfferDecision::Refuse {
                        private_data: bytes::Bytes::from_static(b"B is full, try later"),
                    }
                },
                |_, _| {},
            )
            .await;
    });
    let c = a.create_connector().await?;
    let r = within("refused connect", c.connect(picky_addr, a_limits, b"one more?")).await?;
    let e = r
        .err()
        .ok_or_else(|| anyhow::anyhow!("the refused connect succeeded"))?;
    let pd = c.private_data().await?;
    println!("A: connect {picky_addr} → {e}; reject private data {}", show(&pd));
    ensure!(
        e.status == NdStatus::ConnectionRefused,
        "expected CONNECTION_REFUSED, got {e}"
    );
    ensure!(
        pd.as_ref() == b"B is full, try later",
        "reject private data differs"
    );
    refuser.abort();

    step(
        3,
        "shared endpoint: one local addr:port on A, three listeners on B",
    );
    let ep = a
        .create_shared_endpoint(SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), 0))
        .await?;
    let mut keep = Vec::new();
    let mut locals = Vec::new();
    for port in 7176..7179 {
        let l = b.create_listener().await?;
        let dest = l.listen(at(port), 0).await?;
        let (pc, ac) = (b.create_connector().await?, a.create_connector().await?);
        let (x, y) = within("fan-out connect", async {
            tokio::join!(
                async {
                    ac.connect_with_shared_endpoint(&ep, dest, a_limits, b"fan-out")
                        .await?;
                    ac.complete_connect().await
                },
                async { listener_accept(&l, &pc).await }
            )
        })
        .await?;
        x?;
        y?;
        let local = ac.local_addr().await?;
        println!("A: {local} → {dest}");
        locals.push(local.port());
        keep.push((l, pc, ac, dest));
    }
    ensure!(
        locals.windows(2).all(|w| w[0] == w[1]),
        "the three connections do not share one local port: {locals:?}"
    );
    let dup = a.create_connector().await?;
    let e = dup
        .connect_with_shared_endpoint(&ep, at(7176), a_limits, b"")
        .await
        .err()
        .ok_or_else(|| anyhow::anyhow!("duplicate 4-tuple accepted"))?;
    println!(
        "A: a fourth connection to {} from the same endpoint → {e}",
        at(7176)
    );
    ensure!(
        e.status == NdStatus::AddressAlreadyExists,
        "expected ADDRESS_ALREADY_EXISTS, got {e}"
    );

    step(4, "what the daemons hold");
    let (sa, sb) = (a.status().await?, b.status().await?);
    print_status("A", &sa);
    print_status("B", &sb);
    let first = connector(&sa, "A", active.id().0)?;
    ensure!(
        (first.state, first.local, first.peer) == (ConnectorState::Connected, Some(a_local), Some(bound)),
        "A's table: the first connection is {first:?}"
    );
    let first = connector(&sb, "B", passive.id().0)?;
    ensure!(
        (first.state, first.local, first.peer) == (ConnectorState::Connected, Some(bound), Some(a_local)),
        "B's table: the first connection is {first:?}"
    );
    for (_, pc, ac, dest) in &keep {
        let (x, y) = (connector(&sa, "A", ac.id().0)?, connector(&sb, "B", pc.id().0)?);
        ensure!(
            x.state == ConnectorState::Connected
                && x.local.map(|l| l.port()) == Some(locals[0])
                && x.peer == Some(*dest),
            "A's table: a fan-out connection is {x:?}"
        );
        ensure!(
            y.state == ConnectorState::Connected && y.local == Some(*dest),
            "B's table: a fan-out connection is {y:?}"
        );
    }
    ensure!(
        sa.shared_endpoints.len() == 1 && sa.shared_endpoints[0].port() == locals[0],
        "A's table: shared endpoints {:?}",
        sa.shared_endpoints
    );
    // The first connection's port and the shared endpoint's; the refused and duplicate connects hold none.
    ensure!(
        sa.ports_in_use == 2,
        "A's table: {} ports in use, not 2",
        sa.ports_in_use
    );
    let mut listening: Vec<SocketAddr> = sb.listeners.iter().map(|l| l.local).collect();
    listening.sort();
    let mut want: Vec<SocketAddr> = std::iter::once(bound).chain(keep.iter().map(|k| k.3)).collect();
    want.sort();
    ensure!(
        listening == want,
        "B's table: listeners on {listening:?}, not {want:?} (the refusing one is closed)"
    );

    step(5, "A disconnects; B's NotifyDisconnect fires");
    let mut notify = Box::pin(passive.notify_disconnect());
    // B's request goes out on the first poll; B answers a session's requests in order, so once a status
    // round trip after it is back, NotifyDisconnect is registered (before A disconnects).
    let early = std::future::poll_fn(|cx| std::task::Poll::Ready(notify.as_mut().poll(cx))).await;
    ensure!(
        early.is_pending(),
        "NotifyDisconnect completed before A disconnected: {early:?}"
    );
    b.status().await?;
    active.disconnect().await?;
    within("NotifyDisconnect", notify).await??;
    println!("B: NotifyDisconnect completed: A went away");
    ensure!(
        active.peer_addr().await.is_err(),
        "A still reports a peer after Disconnect"
    );

    drop(keep);
    drop(ep);
    drop(listener);
    drop(active);
    drop(passive);
    step(6, "after the teardown");
    // The closes go out as the objects drop; wait for both daemons to have released every port.
    let (sa, sb) = within("the teardown", async {
        loop {
            let (sa, sb) = (a.status().await?, b.status().await?);
            if sa.ports_in_use == 0 && sb.ports_in_use == 0 {
                return Ok::<_, soft_rdma::Error>((sa, sb));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .context("a daemon still holds ports")??;
    print_status("A", &sa);
    print_status("B", &sb);
    for (name, st) in [("A", &sa), ("B", &sb)] {
        ensure!(
            st.ports_in_use == 0 && st.ports_free == sa.ports_free && st.ports_free > 0,
            "{name} holds {} port(s), {} free",
            st.ports_in_use,
            st.ports_free
        );
    }
    println!("\ndemo complete: every result above was checked.");
    Ok(())
}

/// Connector `id` in a status report.
fn connector<'a>(st: &'a StatusReport, side: &str, id: u64) -> Result<&'a ConnectorStatus> {
    st.connectors
        .iter()
        .find(|c| c.id == id)
        .with_context(|| format!("{side}'s table has no connector {id}"))
}

async fn listener_accept(
    l: &soft_rdma::client::Listener,
    c: &soft_rdma::client::Connector,
) -> soft_rdma::Result<()> {
    l.get_connection_request(c).await?;
    c.accept(
        ReadLimits {
            inbound: 4,
            outbound: 4,
        },
        b"ok",
    )
    .await
}
