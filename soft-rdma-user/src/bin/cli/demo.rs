//! `soft-rdma demo`: a walk-through of connection management between two daemons (A and B), checking every
//! result it shows: connect with private data and read limits, a reject with private data, a shared-endpoint
//! fan-out, status tables, and a disconnect that the other side is notified of.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use soft_rdma::NdStatus;
use soft_rdma::client::{Adapter, ConnectionRequest, Connector, Listener, SharedEndpoint};
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

/// A's read limits in each of its connects: IRD 4, ORD 8.
const A_LIMITS: ReadLimits = ReadLimits {
    inbound: 4,
    outbound: 8,
};

/// What A offers in step 1's connect; its first 32 bytes go out as the private data.
const HELLO: &[u8; 34] = b"hello from A: may I read 8 at once";

/// The two daemons, and B's address as A reaches it.
struct Demo<'a> {
    a: &'a Adapter,
    b: &'a Adapter,
    b_addr: IpAddr,
}

/// Step 1's connection, which steps 4 and 5 come back to.
struct FirstConnection {
    listener: Listener,
    active: Connector,
    passive: Connector,
    /// B's listening address.
    bound: SocketAddr,
    /// A's end of the connection.
    a_local: SocketAddr,
}

/// What A's connector reports of step 1's connection.
struct ActiveView {
    /// B's read limits, from A's view.
    limits: ReadLimits,
    /// B's private data.
    private_data: Bytes,
    local: SocketAddr,
    peer: SocketAddr,
}

/// Step 3's connections, all from one shared endpoint on A.
struct FanOut {
    ep: SharedEndpoint,
    /// Each connection's listener on B, B's connector, A's connector, and the listener's address.
    conns: Vec<(Listener, Connector, Connector, SocketAddr)>,
    /// A's local port of each connection (one and the same).
    locals: Vec<u16>,
}

pub async fn run(args: DemoArgs) -> Result<()> {
    let a = Adapter::open(&args.a_uds).await?;
    let b = Adapter::open(&args.b_uds).await?;
    let demo = Demo {
        a: &a,
        b: &b,
        b_addr: args.b_addr,
    };
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
    let first = demo.first_connection().await?;
    // The refused connector and the duplicate one are kept to the end: the status tables show them.
    let _refused = demo.refused_connect().await?;
    let (fan, _dup) = demo.shared_endpoint().await?;
    demo.daemons_hold(&first, &fan).await?;
    demo.disconnect(&first).await?;
    let FanOut { ep, conns, .. } = fan;
    let FirstConnection {
        listener,
        active,
        passive,
        ..
    } = first;
    drop(conns);
    drop(ep);
    drop(listener);
    drop(active);
    drop(passive);
    demo.teardown().await?;
    println!("\ndemo complete: every result above was checked.");
    Ok(())
}

impl Demo<'_> {
    /// B's address at `port`.
    fn at(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.b_addr, port)
    }

    /// Step 1: B listens; A connects with private data and read limits, B accepts with its own; what each
    /// side saw is shown side by side and checked.
    async fn first_connection(&self) -> Result<FirstConnection> {
        step(
            1,
            "B listens; A connects with 32 bytes of private data, IRD 4, ORD 8",
        );
        let listener = self.b.create_listener().await?;
        let bound = listener.listen(self.at(7174), 0).await?;
        println!("B: listening on {bound}");
        let active = self.a.create_connector().await?;
        let passive = self.b.create_connector().await?;
        let (seen, offer) = connect_and_accept(&listener, &active, &passive, bound).await?;
        print_views(&seen, &offer);
        check_views(&seen, &offer, &passive, bound).await?;
        Ok(FirstConnection {
            listener,
            active,
            passive,
            bound,
            a_local: seen.local,
        })
    }

    /// Step 2: a listener whose handler refuses with private data; A's connect fails with
    /// CONNECTION_REFUSED and shows the refusal's private data. Returns A's refused connector.
    async fn refused_connect(&self) -> Result<Connector> {
        step(
            2,
            "A connects to a listener whose handler refuses, with private data",
        );
        let picky = self.b.create_listener().await?;
        let picky_addr = picky.listen(self.at(7175), 0).await?;
        let b2 = self.b.clone();
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
                            private_data: Bytes::from_static(b"B is full, try later"),
                        }
                    },
                    |_, _| {},
                )
                .await;
        });
        let c = self.a.create_connector().await?;
        let r = within("refused connect", c.connect(picky_addr, A_LIMITS, b"one more?")).await?;
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
        Ok(c)
    }

    /// Step 3: three connections from one shared endpoint on A to three listeners on B, all from one local
    /// port; a fourth to the first listener again is refused as a duplicate 4-tuple. Returns the three, and
    /// the fourth's connector.
    async fn shared_endpoint(&self) -> Result<(FanOut, Connector)> {
        step(
            3,
            "shared endpoint: one local addr:port on A, three listeners on B",
        );
        let ep = self
            .a
            .create_shared_endpoint(SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), 0))
            .await?;
        let mut conns = Vec::new();
        let mut locals = Vec::new();
        for port in 7176..7179 {
            let l = self.b.create_listener().await?;
            let dest = l.listen(self.at(port), 0).await?;
            let (pc, ac) = (self.b.create_connector().await?, self.a.create_connector().await?);
            let (x, y) = within("fan-out connect", async {
                tokio::join!(
                    async {
                        ac.connect_with_shared_endpoint(&ep, dest, A_LIMITS, b"fan-out")
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
            conns.push((l, pc, ac, dest));
        }
        ensure!(
            locals.windows(2).all(|w| w[0] == w[1]),
            "the three connections do not share one local port: {locals:?}"
        );
        let dup = self.a.create_connector().await?;
        let e = dup
            .connect_with_shared_endpoint(&ep, self.at(7176), A_LIMITS, b"")
            .await
            .err()
            .ok_or_else(|| anyhow::anyhow!("duplicate 4-tuple accepted"))?;
        println!(
            "A: a fourth connection to {} from the same endpoint → {e}",
            self.at(7176)
        );
        ensure!(
            e.status == NdStatus::AddressAlreadyExists,
            "expected ADDRESS_ALREADY_EXISTS, got {e}"
        );
        Ok((FanOut { ep, conns, locals }, dup))
    }

    /// Step 4: both daemons' status tables, printed, and checked against steps 1-3: every connection in
    /// place, the shared endpoint, the ports in use, B's listeners.
    async fn daemons_hold(&self, first: &FirstConnection, fan: &FanOut) -> Result<()> {
        step(4, "what the daemons hold");
        let (sa, sb) = (self.a.status().await?, self.b.status().await?);
        print_status("A", &sa);
        print_status("B", &sb);
        let (bound, a_local) = (first.bound, first.a_local);
        let c = connector(&sa, "A", first.active.id().0)?;
        ensure!(
            (c.state, c.local, c.peer) == (ConnectorState::Connected, Some(a_local), Some(bound)),
            "A's table: the first connection is {c:?}"
        );
        let c = connector(&sb, "B", first.passive.id().0)?;
        ensure!(
            (c.state, c.local, c.peer) == (ConnectorState::Connected, Some(bound), Some(a_local)),
            "B's table: the first connection is {c:?}"
        );
        for (_, pc, ac, dest) in &fan.conns {
            let (x, y) = (connector(&sa, "A", ac.id().0)?, connector(&sb, "B", pc.id().0)?);
            ensure!(
                x.state == ConnectorState::Connected
                    && x.local.map(|l| l.port()) == Some(fan.locals[0])
                    && x.peer == Some(*dest),
                "A's table: a fan-out connection is {x:?}"
            );
            ensure!(
                y.state == ConnectorState::Connected && y.local == Some(*dest),
                "B's table: a fan-out connection is {y:?}"
            );
        }
        ensure!(
            sa.shared_endpoints.len() == 1 && sa.shared_endpoints[0].port() == fan.locals[0],
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
        let mut want: Vec<SocketAddr> = std::iter::once(bound)
            .chain(fan.conns.iter().map(|k| k.3))
            .collect();
        want.sort();
        ensure!(
            listening == want,
            "B's table: listeners on {listening:?}, not {want:?} (the refusing one is closed)"
        );
        Ok(())
    }

    /// Step 5: A disconnects step 1's connection; B's NotifyDisconnect, registered before, completes.
    async fn disconnect(&self, first: &FirstConnection) -> Result<()> {
        step(5, "A disconnects; B's NotifyDisconnect fires");
        let mut notify = Box::pin(first.passive.notify_disconnect());
        // B's request goes out on the first poll; B answers a session's requests in order, so once a status
        // round trip after it is back, NotifyDisconnect is registered (before A disconnects).
        let early = std::future::poll_fn(|cx| std::task::Poll::Ready(notify.as_mut().poll(cx))).await;
        ensure!(
            early.is_pending(),
            "NotifyDisconnect completed before A disconnected: {early:?}"
        );
        self.b.status().await?;
        first.active.disconnect().await?;
        within("NotifyDisconnect", notify).await??;
        println!("B: NotifyDisconnect completed: A went away");
        ensure!(
            first.active.peer_addr().await.is_err(),
            "A still reports a peer after Disconnect"
        );
        Ok(())
    }

    /// Step 6, once everything is dropped: both daemons release every port; their tables, printed.
    async fn teardown(&self) -> Result<()> {
        step(6, "after the teardown");
        // The closes go out as the objects drop; wait for both daemons to have released every port.
        let (sa, sb) = within("the teardown", async {
            loop {
                let (sa, sb) = (self.a.status().await?, self.b.status().await?);
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
        Ok(())
    }
}

/// Step 1's handshake: A connects with [`A_LIMITS`] and [`HELLO`] while B takes the offer (printing it) and
/// accepts with its own limits and private data; then A's view of the connection, printed.
async fn connect_and_accept(
    listener: &Listener,
    active: &Connector,
    passive: &Connector,
    bound: SocketAddr,
) -> Result<(ActiveView, ConnectionRequest)> {
    let b_limits = ReadLimits {
        inbound: 16,
        outbound: 2,
    };
    let (connected, accepted) = within("connect/accept", async {
        tokio::join!(
            async {
                active.connect(bound, A_LIMITS, &HELLO[..32]).await?;
                let seen = (
                    active.read_limits().await?,
                    active.private_data().await?,
                    active.local_addr().await?,
                );
                active.complete_connect().await?;
                Ok::<_, soft_rdma::Error>(seen)
            },
            async {
                let offer = listener.get_connection_request(passive).await?;
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
    let (limits, private_data, local) = connected?;
    let offer = accepted?;
    // Each side's view, asked of its own connector.
    let peer = active.peer_addr().await?;
    println!(
        "A: connected {local} → {bound}; B's limits (A's view) {limits:?}; private data {}",
        show(&private_data)
    );
    let seen = ActiveView {
        limits,
        private_data,
        local,
        peer,
    };
    Ok((seen, offer))
}

/// Step 1's table: what each side saw of the other.
fn print_views(seen: &ActiveView, offer: &ConnectionRequest) {
    println!("\n   what each side saw      | A (active)                 | B (passive)");
    println!("   ------------------------+----------------------------+---------------------------");
    println!("   peer address            | {:<26} | {}", seen.peer, offer.peer);
    println!(
        "   reads it may issue      | {:<26} | {}",
        seen.limits.outbound, offer.limits.outbound
    );
    println!(
        "   reads it must serve     | {:<26} | {}",
        seen.limits.inbound, offer.limits.inbound
    );
    println!(
        "   peer's private data     | {:<26} | {}",
        show(&seen.private_data),
        show(&offer.private_data)
    );
}

/// Step 1's checks: each side got the other's private data, the limits as the accept limited them, and
/// each other's address.
async fn check_views(
    seen: &ActiveView,
    offer: &ConnectionRequest,
    passive: &Connector,
    bound: SocketAddr,
) -> Result<()> {
    ensure!(
        offer.private_data.as_ref() == &HELLO[..32],
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
        seen.private_data.as_ref() == b"welcome, A",
        "A received different private data"
    );
    // Accept's values are limited to A's offer before they go out (IND2Connector::Accept, seed 004):
    // B serves min(16, A's ORD 8) = 8 → A may issue 8; B issues min(2, A's IRD 4) = 2 → A serves 2.
    ensure!(
        seen.limits
            == ReadLimits {
                inbound: 2,
                outbound: 8
            },
        "A saw limits {:?}",
        seen.limits
    );
    ensure!(
        passive.peer_addr().await? == seen.local && offer.peer == seen.local,
        "B's peer address is not A's local address"
    );
    ensure!(
        seen.peer == bound,
        "A's peer address {} is not B's listening address {bound}",
        seen.peer
    );
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
