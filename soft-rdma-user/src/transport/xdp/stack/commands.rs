//! The XDP stack's commands: listen and stop listening, connect (choosing the source address and
//! resolving the next hop first), close, and the MSS a connection announces.

use super::*;

impl Stack {
    pub(in crate::transport::xdp) fn command(&mut self, cmd: Cmd, now: StdInstant) {
        // `--xdp-tcp own`: the same commands, carried out on `crate::tcp` (own_tcp.rs).
        let own = self.own.is_some();
        match cmd {
            Cmd::Listen { listener, local } => {
                if own {
                    self.own_listen(listener, local);
                } else {
                    self.listen(listener, local);
                }
            }
            Cmd::StopListening { listener } if own => self.own_stop_listening(listener),
            Cmd::StopListening { listener } => self.stop_listening(listener, now),
            Cmd::Connect {
                conn,
                local,
                remote,
                route,
            } if own => self.own_connect(conn, local, remote, route, now),
            Cmd::Connect {
                conn,
                local,
                remote,
                route,
            } => self.connect(conn, local, remote, route, now),
            Cmd::Send { conn, data } if own => self.own_send(conn, data),
            Cmd::Send { conn, data } => {
                if let Some(c) = self.conns.get_mut(&conn)
                    && c.close.is_none()
                    && !data.is_empty()
                {
                    c.pending.push_back(data);
                    self.touched.push(conn);
                }
            }
            Cmd::Close { conn, abort } if own => {
                if self.own_has(conn) {
                    self.own_close(conn, abort);
                } else {
                    self.emit(TransportEvent::Closed { conn });
                }
            }
            Cmd::Close { conn, abort } => self.close(conn, abort, now),
        }
    }

    /// Stops a smoltcp listener: its listening sockets go; a handshake under way is reset.
    pub(super) fn stop_listening(&mut self, listener: ListenerId, now: StdInstant) {
        if let Some(l) = self.listeners.remove(&listener) {
            for (_, set, pool) in l.pools {
                for h in pool {
                    if self.sets.get(h).is_listening() {
                        self.remove_socket(h);
                    } else {
                        // A handshake under way: reset in a set of its own, the pool goes.
                        let h = self.sets.move_out(h);
                        self.sets.get_mut(h).abort();
                        self.drain(h, now);
                    }
                }
                self.sets.remove_pool(set);
            }
        }
    }

    /// A new smoltcp socket, its buffers charged to the daemon's TCP bounds ([`Stack::remove_socket`] gives
    /// them back); `None` past `--max-tcp-connections` or `--max-tcp-buffer-bytes`, counted and logged.
    /// `active`: for a connect (else a listening slot).
    pub(super) fn charged_socket(&mut self, active: bool) -> Option<tcp::Socket<'static>> {
        if self.budget.try_open_fixed(RX_BUFFER, TX_BUFFER) {
            return Some(Self::new_socket());
        }
        if active {
            self.budget.count_refused_connect();
        } else {
            self.listeners_short = true;
        }
        let limits = self.budget.limits();
        crate::warn_limited!(
            connections = self.budget.connections(),
            max_connections = limits.max_connections,
            buffer_bytes = self.budget.buffer_bytes(),
            max_buffer_bytes = limits.max_buffer_bytes,
            per_socket = RX_BUFFER + TX_BUFFER,
            "smoltcp connection bound reached: {}",
            if active {
                "the connect fails with INSUFFICIENT_RESOURCES"
            } else {
                "no listening slot made; a SYN past the ones ready is reset"
            }
        );
        None
    }

    fn new_socket() -> tcp::Socket<'static> {
        let mut s = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0u8; RX_BUFFER]),
            tcp::SocketBuffer::new(vec![0u8; TX_BUFFER]),
        );
        // As kernel.rs sets TCP_NODELAY: FPDUs go out as soon as they are queued.
        s.set_nagle_enabled(false);
        s.set_keep_alive(Some(SDuration::from_secs(5)));
        // Cubic: as the kernel; on a lossless veth it measured the same as no congestion control.
        s.set_congestion_control(tcp::CongestionControl::Cubic);
        s
    }

    /// Dead-peer detection once connected (kernel.rs: about 20 s, with keepalives every 5 s idle, set at
    /// creation: setting them on an idle open connection would send a probe at once).
    pub(super) fn tune_open(s: &mut tcp::Socket<'static>) {
        s.set_timeout(Some(SDuration::from_secs(20)));
    }

    pub(super) fn add_listening_socket(&mut self, pool: SetId, ep: IpListenEndpoint) -> Option<Sock> {
        let mut s = self.charged_socket(false)?;
        // A handshake that never completes (SYN-RECEIVED) closes the slot after 10 s (`accept` drops it).
        s.set_timeout(Some(SDuration::from_secs(10)));
        match s.listen(ep) {
            Ok(()) => Some(self.sets.add_listening(pool, s)),
            Err(e) => {
                self.budget.close_fixed(RX_BUFFER, TX_BUFFER);
                crate::warn_limited!(?ep, error = ?e, "smoltcp listen failed");
                None
            }
        }
    }

    pub(super) fn listen(&mut self, listener: ListenerId, local: SocketAddr) {
        let addrs = self.info.expand(local.ip());
        if addrs.is_empty() {
            crate::warn_limited!(%local, "cannot listen: no address of that family on the interface");
            return;
        }
        let mut pools = Vec::new();
        for a in addrs {
            let ep = listen_endpoint(a, local.port());
            let set = self.sets.add_pool(SocketAddr::new(a, local.port()));
            let mut pool = Vec::new();
            for _ in 0..SPARE_LISTENERS {
                // None: past the bounds (or smoltcp refused): the next would be too.
                let Some(h) = self.add_listening_socket(set, ep) else {
                    break;
                };
                pool.push(h);
            }
            self.sets.replenished(set, pool.len());
            pools.push((ep, set, pool));
        }
        debug!(listener = listener.0, %local, "listening (XDP)");
        self.listeners.insert(listener, Listener { pools });
    }

    /// The local address a connect to `remote` uses: `local`'s if it is the interface's, else the route's
    /// preferred source (or the interface's first of the family). Reports ConnectFailed and returns `None`
    /// when there is none.
    pub(super) fn connect_source(
        &mut self,
        conn: ConnId,
        local: SocketAddr,
        remote: SocketAddr,
        route: Option<Route>,
    ) -> Option<IpAddr> {
        let route = match route.map_or_else(|| self.nl.route_get(remote.ip()), Ok) {
            Ok(r) => r,
            Err(e) => {
                let reason = match e.raw_os_error() {
                    Some(libc::EHOSTUNREACH) => ConnectFailure::HostUnreachable,
                    _ => ConnectFailure::NetworkUnreachable,
                };
                self.emit(TransportEvent::ConnectFailed { conn, reason });
                return None;
            }
        };
        let local_ip = if local.ip().is_unspecified() {
            route
                .prefsrc
                .filter(|ip| self.info.has_addr(*ip))
                .or_else(|| self.info.first_of_family(remote.is_ipv4()))
        } else if self.info.has_addr(local.ip()) {
            Some(local.ip())
        } else {
            None
        };
        if local_ip.is_none() {
            self.emit(TransportEvent::ConnectFailed {
                conn,
                reason: ConnectFailure::AddressNotAvailable,
            });
        }
        local_ip
    }

    pub(super) fn connect(
        &mut self,
        conn: ConnId,
        local: SocketAddr,
        remote: SocketAddr,
        route: Option<Route>,
        now: StdInstant,
    ) {
        let Some(local_ip) = self.connect_source(conn, local, remote, route) else {
            return;
        };
        self.neigh.failed.remove(&remote.ip());
        self.want_neighbour(remote.ip(), now);
        self.conns.insert(
            conn,
            Conn::new(
                None,
                SocketAddr::new(local_ip, local.port()),
                remote,
                Phase::Resolving {
                    deadline: now + self.connect_timeout,
                },
            ),
        );
        self.resolving.push(conn);
    }

    /// Connections whose next hop resolved send their SYN; those whose resolution failed fail.
    pub(super) fn start_resolved(&mut self, now: StdInstant) {
        if self.resolving.is_empty() {
            return;
        }
        for id in std::mem::take(&mut self.resolving) {
            let Some(c) = self.conns.get(&id) else {
                continue; // closed while resolving
            };
            let (remote, local) = (c.remote, c.local);
            let Phase::Resolving { deadline } = c.phase else {
                continue;
            };
            if self.neigh.known.contains_key(&remote.ip()) {
                let Some(mut s) = self.charged_socket(true) else {
                    self.conns.remove(&id);
                    self.emit(TransportEvent::ConnectFailed {
                        conn: id,
                        reason: ConnectFailure::NoResources,
                    });
                    continue;
                };
                let r = s.connect(
                    self.iface.context(),
                    (IpAddress::from(remote.ip()), remote.port()),
                    (IpAddress::from(local.ip()), local.port()),
                );
                match r {
                    Ok(()) => {
                        let h = self.sets.add_connection(s, local, remote);
                        self.hold(h, local);
                        self.adopt(id, h);
                        let c = self.conns.get_mut(&id).expect("listed");
                        c.handle = Some(h);
                        c.phase = Phase::Connecting { deadline };
                        self.deadlines.insert((deadline, id));
                    }
                    Err(e) => {
                        self.budget.close_fixed(RX_BUFFER, TX_BUFFER);
                        crate::warn_limited!(conn = id.0, %local, %remote, error = ?e, "smoltcp connect failed");
                        self.conns.remove(&id);
                        self.emit(TransportEvent::ConnectFailed {
                            conn: id,
                            reason: ConnectFailure::Other,
                        });
                    }
                }
            } else if self.neigh.failed.contains_key(&remote.ip()) {
                self.conns.remove(&id);
                self.emit(TransportEvent::ConnectFailed {
                    conn: id,
                    reason: ConnectFailure::HostUnreachable,
                });
            } else if now >= deadline {
                self.conns.remove(&id);
                self.emit(TransportEvent::ConnectFailed {
                    conn: id,
                    reason: ConnectFailure::TimedOut,
                });
            } else {
                self.resolving.push(id);
            }
        }
        self.neigh
            .failed
            .retain(|_, t| now.duration_since(*t) < Duration::from_secs(1));
    }

    pub(super) fn close(&mut self, conn: ConnId, abort: bool, now: StdInstant) {
        debug!(conn = conn.0, abort, "close (XDP)");
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        match (c.handle, &c.phase) {
            (None, _) | (Some(_), Phase::Connecting { .. }) => {
                // Not connected yet: abandon the attempt (kernel.rs reports Closed likewise).
                let c = self.conns.remove(&conn).expect("exists");
                if let Some(h) = c.handle {
                    self.sets.get_mut(h).abort();
                    self.drain(h, now);
                }
                self.emit(TransportEvent::Closed { conn });
            }
            (Some(h), _) => {
                if abort {
                    let c = self.conns.remove(&conn).expect("exists");
                    self.sets.get_mut(h).abort();
                    self.drain(h, now);
                    if !c.closed_reported {
                        self.emit(TransportEvent::Closed { conn });
                    }
                } else {
                    c.close = Some(false);
                    c.linger_deadline = Some(now + CLOSE_LINGER);
                    self.deadlines.insert((now + CLOSE_LINGER, conn));
                    self.touched.push(conn);
                }
            }
        }
    }

    // ---------------------------------------------------------------------------------------------------
    // Sockets ↔ engine.

    pub(super) fn local_mss(&self, remote: SocketAddr) -> u32 {
        let ip_hdr = if remote.is_ipv4() { 20 } else { 40 };
        (self.info.mtu - ip_hdr - 20) as u32
    }

    pub(super) fn mss_for(&mut self, remote: SocketAddr, local_port: u16) -> u32 {
        let local = self.local_mss(remote);
        let peer = self
            .peer_mss
            .remove(&(remote, local_port))
            .map_or(local, u32::from);
        local.min(peer).clamp(536, 65_000)
    }
}
