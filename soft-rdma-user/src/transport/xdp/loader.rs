//! Loading the embedded XDP program, attaching it, and its maps.
//!
//! Attach: aya 0.14 `Xdp::attach` first tries `bpf_link_create` (a BPF link owned by a file descriptor of
//! this process) and only falls back to the legacy netlink attach when the kernel answers EINVAL (kernels
//! before 5.9). With a BPF link, the program is detached when the last descriptor closes — when the daemon
//! exits, including SIGKILL or a crash — so no stale program keeps steering packets to sockets that no longer
//! exist. [`Loaded::link_kind`] reports which one the kernel gave us; with the netlink fallback a crashed
//! daemon leaves the program attached (`ip link set dev IFACE xdp off` removes it), and because
//! `bpf_redirect_map` falls back to `XDP_PASS` when no socket is registered, traffic still reaches the
//! kernel even then.

use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, anyhow};
use aya::Ebpf;
use aya::maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, XskMap};
use aya::programs::{Xdp, XdpMode};
use soft_rdma_common::maps::{
    CONFIG_DROP_PPM, CONFIG_MAP, CONFIG_SYN_COOKIE_KEY, CONFIG_SYN_COOKIE_MSS, CONFIG_SYN_COOKIE_MSS6,
    CONFIG_SYN_COOKIE_TICK, CONFIG_SYN_COOKIE_WINDOW, CONFIG_SYN_COOKIE_WSCALE, CONFIG_SYN_COOKIES,
    COUNTERS_MAP, Counter, ENDPOINT_LISTENING, ENDPOINTS_MAP, EndpointKey, EndpointValue, PROGRAM_NAME,
    SYN_COOKIES_ON, SYN_COOKIES_SACK, SYN_COOKIES_WINDOW_SCALE, XSKS_MAP,
};
use soft_rdma_common::syn_cookie::SynCookieKey;

use crate::tcp::SynAckOffer;
use tracing::{info, warn};

/// `--xdp-mode`.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum XdpModeChoice {
    /// Native (driver) mode, falling back to generic (SKB) mode if the driver refuses.
    #[default]
    Auto,
    /// Native (driver) mode only.
    Native,
    /// Generic (SKB) mode only.
    Generic,
}

/// The mode the program actually runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachedMode {
    Native,
    Generic,
}

impl std::fmt::Display for AttachedMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AttachedMode::Native => "native",
            AttachedMode::Generic => "generic",
        })
    }
}

/// The `ENDPOINTS` map with a reference count per key: port reservations (a wildcard and a specific
/// address may overlap) and live connections (an accepted connection outlives its listener's reservation)
/// each hold their keys; a key leaves the map with its last holder.
pub struct EndpointTable {
    map: BpfHashMap<MapData, EndpointKey, EndpointValue>,
    refs: std::collections::HashMap<EndpointKey, u32>,
    /// Keys of listening addresses (flagged [`ENDPOINT_LISTENING`] while in the map).
    listening: std::collections::HashSet<EndpointKey>,
}

pub type Endpoints = Arc<Mutex<EndpointTable>>;

/// The map key of a local address and port.
pub fn endpoint_key(ip: std::net::IpAddr, port: u16) -> EndpointKey {
    match ip {
        std::net::IpAddr::V4(a) => EndpointKey::ipv4(a.octets(), port),
        std::net::IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => EndpointKey::ipv4(v4.octets(), port),
            None => EndpointKey::ipv6(a.octets(), port),
        },
    }
}

impl EndpointTable {
    /// Holds every key in `keys` (all or none).
    pub fn acquire(&mut self, keys: &[EndpointKey]) -> Result<(), aya::maps::MapError> {
        for (i, k) in keys.iter().enumerate() {
            let value = self.value_of(k);
            let r = self.refs.entry(*k).or_insert(0);
            if *r == 0
                && let Err(e) = self.map.insert(*k, value, 0)
            {
                self.refs.remove(k);
                self.release(&keys[..i]);
                return Err(e);
            }
            *r += 1;
        }
        Ok(())
    }

    fn value_of(&self, k: &EndpointKey) -> EndpointValue {
        EndpointValue {
            flags: if self.listening.contains(k) {
                ENDPOINT_LISTENING
            } else {
                0
            },
        }
    }

    /// Flags `k` as a listening address (its SYNs may be answered with a cookie by the program), or not;
    /// the flag follows the key in and out of the map.
    pub fn set_listening(&mut self, k: EndpointKey, listening: bool) {
        if listening {
            self.listening.insert(k);
        } else {
            self.listening.remove(&k);
        }
        if self.refs.contains_key(&k)
            && let Err(e) = self.map.insert(k, self.value_of(&k), 0)
        {
            warn!(error = %e, listening, "cannot flag an endpoint in the XDP map");
        }
    }

    pub fn release(&mut self, keys: &[EndpointKey]) {
        for k in keys {
            if let Some(r) = self.refs.get_mut(k) {
                *r -= 1;
                if *r == 0 {
                    self.refs.remove(k);
                    let _ = self.map.remove(k);
                }
            }
        }
    }
}

/// The program's configuration map (`CONFIG`), which the daemon writes: SYN cookies here (the test-only
/// fault injection is set at load).
pub struct ProgramConfig {
    map: Array<MapData, u32>,
}

impl ProgramConfig {
    /// The program answers listeners' SYNs with cookies from now on, offering what `offer` says, with `key`
    /// and the time counter at `tick`. The switch is written last, so the program never sees half a setting.
    pub fn enable_syn_cookies(&mut self, offer: SynAckOffer, key: SynCookieKey, tick: u32) -> Result<()> {
        for (i, w) in key.to_words().into_iter().enumerate() {
            self.map.set(CONFIG_SYN_COOKIE_KEY + i as u32, w, 0)?;
        }
        self.map
            .set(CONFIG_SYN_COOKIE_MSS, u32::from(offer.mss_ipv4), 0)?;
        self.map
            .set(CONFIG_SYN_COOKIE_MSS6, u32::from(offer.mss_ipv6), 0)?;
        self.map.set(
            CONFIG_SYN_COOKIE_WSCALE,
            u32::from(offer.window_scale.unwrap_or(0)),
            0,
        )?;
        self.map
            .set(CONFIG_SYN_COOKIE_WINDOW, u32::from(offer.window), 0)?;
        self.map.set(CONFIG_SYN_COOKIE_TICK, tick, 0)?;
        let mut flags = SYN_COOKIES_ON;
        if offer.sack {
            flags |= SYN_COOKIES_SACK;
        }
        if offer.window_scale.is_some() {
            flags |= SYN_COOKIES_WINDOW_SCALE;
        }
        self.map.set(CONFIG_SYN_COOKIES, flags, 0)?;
        Ok(())
    }

    /// The cookie's time counter.
    pub fn set_syn_cookie_tick(&mut self, tick: u32) -> Result<()> {
        Ok(self.map.set(CONFIG_SYN_COOKIE_TICK, tick, 0)?)
    }

    /// Every SYN goes to the daemon again.
    pub fn disable_syn_cookies(&mut self) -> Result<()> {
        Ok(self.map.set(CONFIG_SYN_COOKIES, 0, 0)?)
    }
}

/// The loaded and attached program. Dropping it detaches the program (aya's link).
pub struct Loaded {
    // Field order = drop order: maps first, then the program object with its link.
    pub endpoints: Endpoints,
    pub xsks: Option<XskMap<MapData>>,
    pub counters: PerCpuArray<MapData, u64>,
    /// Taken by the stack, which writes it.
    pub config: Option<ProgramConfig>,
    pub mode: AttachedMode,
    /// "bpf_link" (detached when the process exits) or "netlink" (legacy: survives a crash).
    pub link_kind: &'static str,
    _ebpf: Ebpf,
}

/// The compiled XDP object, built by `build.rs` (aya-build) into `OUT_DIR`.
static PROGRAM: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/soft-rdma-xdp"));

/// Loads the program and attaches it to `iface` in `choice` mode.
/// `fault_drop_ppm`: test-only fault injection (steered segments dropped per million; 0 = none).
pub fn load_and_attach(iface: &str, choice: XdpModeChoice, fault_drop_ppm: u32) -> Result<Loaded> {
    let mut ebpf = Ebpf::load(PROGRAM).context("loading the XDP object")?;
    if fault_drop_ppm != 0 {
        let mut config: Array<&mut MapData, u32> = ebpf
            .map_mut(CONFIG_MAP)
            .ok_or_else(|| anyhow!("no map {CONFIG_MAP}"))?
            .try_into()
            .context(CONFIG_MAP)?;
        config
            .set(CONFIG_DROP_PPM, fault_drop_ppm, 0)
            .context("setting the fault injection")?;
        warn!(
            fault_drop_ppm,
            "fault injection: the XDP program drops steered segments at random"
        );
    }
    let prog: &mut Xdp = ebpf
        .program_mut(PROGRAM_NAME)
        .ok_or_else(|| anyhow!("the XDP object has no program {PROGRAM_NAME}"))?
        .try_into()
        .context("program type")?;
    prog.load()
        .context("loading the XDP program into the kernel (verifier)")?;
    let mode = match choice {
        XdpModeChoice::Native => {
            prog.attach(iface, XdpMode::Driver)
                .with_context(|| {
                    format!(
                        "attaching the XDP program to {iface} in native mode (the driver may not support it, \
                         or not at this MTU: veth takes native XDP up to MTU 3498; --xdp-mode generic always works)"
                    )
                })?;
            AttachedMode::Native
        }
        XdpModeChoice::Generic => {
            prog.attach(iface, XdpMode::Skb)
                .with_context(|| format!("attaching the XDP program to {iface} in generic mode"))?;
            AttachedMode::Generic
        }
        XdpModeChoice::Auto => match prog.attach(iface, XdpMode::Driver) {
            Ok(_) => AttachedMode::Native,
            Err(e) => {
                warn!(%iface, error = %format!("{e:#}"), reason = ?e,
                    "native XDP refused by the driver; falling back to generic (SKB) mode");
                prog.attach(iface, XdpMode::Skb)
                    .with_context(|| format!("attaching the XDP program to {iface} in generic mode"))?;
                AttachedMode::Generic
            }
        },
    };
    let program_id = prog.info().map(|i| i.id()).unwrap_or(0);
    let link_kind = if aya::programs::loaded_links()
        .filter_map(|l| l.ok())
        .any(|l| l.program_id() == program_id)
    {
        "bpf_link"
    } else {
        "netlink"
    };
    let endpoints: BpfHashMap<MapData, EndpointKey, EndpointValue> = ebpf
        .take_map(ENDPOINTS_MAP)
        .ok_or_else(|| anyhow!("no map {ENDPOINTS_MAP}"))?
        .try_into()
        .context(ENDPOINTS_MAP)?;
    let xsks: XskMap<MapData> = ebpf
        .take_map(XSKS_MAP)
        .ok_or_else(|| anyhow!("no map {XSKS_MAP}"))?
        .try_into()
        .context(XSKS_MAP)?;
    let counters: PerCpuArray<MapData, u64> = ebpf
        .take_map(COUNTERS_MAP)
        .ok_or_else(|| anyhow!("no map {COUNTERS_MAP}"))?
        .try_into()
        .context(COUNTERS_MAP)?;
    let config: Array<MapData, u32> = ebpf
        .take_map(CONFIG_MAP)
        .ok_or_else(|| anyhow!("no map {CONFIG_MAP}"))?
        .try_into()
        .context(CONFIG_MAP)?;
    info!(%iface, %mode, link = link_kind, program_id, "XDP program attached");
    Ok(Loaded {
        endpoints: Arc::new(Mutex::new(EndpointTable {
            map: endpoints,
            refs: std::collections::HashMap::new(),
            listening: std::collections::HashSet::new(),
        })),
        xsks: Some(xsks),
        counters,
        config: Some(ProgramConfig { map: config }),
        mode,
        link_kind,
        _ebpf: ebpf,
    })
}

impl Loaded {
    /// The counters summed over CPUs, by name.
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        Counter::ALL
            .iter()
            .map(|c| {
                let sum = self
                    .counters
                    .get(&(*c as u32), 0)
                    .map(|v| v.iter().sum())
                    .unwrap_or(0);
                (c.name(), sum)
            })
            .collect()
    }
}
