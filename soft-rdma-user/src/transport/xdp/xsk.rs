//! AF_XDP sockets (xdpilone) and the smoltcp `phy::Device` over them.
//!
//! One socket per RX queue, each with its own UMEM (anonymous mmap): the first half of the frames
//! circulates fill ring → RX ring → (copied out) → fill ring, the second half free list → TX ring →
//! completion ring → free list. Copy mode (`XDP_COPY`), `XDP_USE_NEED_WAKEUP`: the fill ring is woken with
//! poll(2) and the TX ring with sendto(2) when the kernel asks (in copy mode it always asks for TX: the
//! kernel transmits only inside sendto, at most 32 frames per call, hence [`XskQueue::kick`]'s loop).
//! Frames that do not fit in the fill ring stay in `free_rx` and are retried: none is ever lost.
//!
//! Multi-buffer (`XDP_USE_SG`, Linux `Documentation/networking/af_xdp.rst`, "Multi-Buffer Support"): a
//! packet larger than one frame — a GSO/TSO super-packet from a peer on the same host (a VM's tap or a
//! container's veth behind a bridge, in generic mode: the kernel does not split those before XDP) — comes
//! as several descriptors, each but the last flagged `XDP_PKT_CONTD`; [`XskQueue::receive`] joins them into
//! one frame (at most [`MAX_PACKET`] bytes; a longer one is dropped and counted). The program is loaded
//! `xdp.frags` for this.
//!
//! The device hands smoltcp copies of received frames (queued in [`XdpDevice::rx_frames`], where the
//! transport also injects the synthetic neighbour answers, see `stack.rs`) and writes transmitted frames
//! straight into UMEM. ARP requests and IPv6 Neighbor Solicitations smoltcp emits are not sent: they are
//! recorded in [`XdpDevice::solicits`] and answered from the kernel's neighbour table.

use std::collections::VecDeque;
use std::ffi::CString;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::num::NonZeroU32;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result, anyhow};
use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::time::Instant;
use xdpilone::xdp::{XdpDesc, XdpStatisticsV2};
use xdpilone::{DeviceQueue, IfInfo, RingRx, RingTx, Socket, SocketConfig, Umem, UmemConfig};

use crate::transport::status::XskQueueStatus;

const FRAME_SIZE: u32 = 4096;
/// Frames for RX (all in the fill ring when idle) and for TX.
const RX_FRAMES: u32 = 4096;
const TX_FRAMES: u32 = 4096;
/// Data the kernel places after `XDP_PACKET_HEADROOM` in each frame: the largest frame we can take in one
/// descriptor (and the largest we send).
pub const MAX_FRAME: usize = (FRAME_SIZE - 256) as usize;
/// The largest packet joined from several descriptors: a 64 KiB GSO packet with its headers (the
/// kernel's default `gso_max_size`); anything longer is dropped (`oversized`).
pub const MAX_PACKET: usize = 65_536 + 14 + 60 + 60;
/// `XDP_USE_SG` (bind flag) and `XDP_PKT_CONTD` (descriptor option): Linux `include/uapi/linux/if_xdp.h`.
const XDP_USE_SG: u16 = 1 << 4;
const XDP_PKT_CONTD: u32 = 1 << 0;

struct Area {
    ptr: NonNull<u8>,
    len: usize,
}

impl Area {
    fn new(len: usize) -> Result<Area> {
        // SAFETY: anonymous private mapping, checked for failure.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mmap of the UMEM");
        }
        Ok(Area {
            ptr: NonNull::new(p.cast()).expect("mmap never returns NULL on success"),
            len,
        })
    }
}

impl Drop for Area {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; every user (the sockets) is dropped before (field order).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// One queue's counters, written by the stack and read by `status` (relaxed: statistics).
#[derive(Debug, Default)]
pub struct QueueCounters {
    pub queue: u32,
    rx_frames: AtomicU64,
    tx_frames: AtomicU64,
    rx_dropped: AtomicU64,
    rx_ring_full: AtomicU64,
    rx_fill_ring_empty: AtomicU64,
    invalid_descs: AtomicU64,
    oversized: AtomicU64,
}

impl QueueCounters {
    pub fn new(queue: u32) -> Arc<QueueCounters> {
        Arc::new(QueueCounters {
            queue,
            ..QueueCounters::default()
        })
    }

    pub fn snapshot(&self) -> XskQueueStatus {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        XskQueueStatus {
            queue: self.queue,
            rx_frames: get(&self.rx_frames),
            tx_frames: get(&self.tx_frames),
            rx_dropped: get(&self.rx_dropped),
            rx_ring_full: get(&self.rx_ring_full),
            rx_fill_ring_empty: get(&self.rx_fill_ring_empty),
            invalid_descs: get(&self.invalid_descs),
            rx_oversized: get(&self.oversized),
        }
    }
}

/// One AF_XDP socket bound to one RX queue.
pub struct XskQueue {
    // Field order = drop order: rings and sockets before the UMEM registration, the mapping last.
    rx: RingRx,
    tx: RingTx,
    fcq: DeviceQueue,
    _umem: Umem,
    area: Area,
    free_rx: Vec<u64>,
    free_tx: Vec<u64>,
    pub queue_id: u32,
    counters: Arc<QueueCounters>,
    /// The descriptors of a multi-buffer packet received so far (`XDP_PKT_CONTD`), joined.
    joining: Vec<u8>,
    /// The packet being joined grew past [`MAX_PACKET`]: its remaining descriptors are skipped.
    skipping: bool,
}

impl XskQueue {
    /// Binds a socket to `counters.queue` of `ifname`.
    pub fn new(ifname: &str, counters: Arc<QueueCounters>) -> Result<XskQueue> {
        let queue_id = counters.queue;
        let total = RX_FRAMES + TX_FRAMES;
        let area = Area::new((total * FRAME_SIZE) as usize)?;
        let config = UmemConfig {
            fill_size: RX_FRAMES,
            complete_size: TX_FRAMES,
            frame_size: FRAME_SIZE,
            headroom: 0,
            flags: 0,
        };
        let slice = NonNull::slice_from_raw_parts(area.ptr, area.len);
        // SAFETY: page-aligned mapping of the right size that outlives the Umem (field order).
        let umem = unsafe { Umem::new(config, slice) }.map_err(|e| anyhow!("registering the UMEM: {e}"))?;
        let mut info = IfInfo::invalid();
        let cname = CString::new(ifname)?;
        info.from_name(&cname)
            .map_err(|e| anyhow!("interface {ifname}: {e}"))?;
        info.set_queue(queue_id);
        let sock = Socket::with_shared(&info, &umem).map_err(|e| anyhow!("AF_XDP socket: {e}"))?;
        let fcq = umem
            .fq_cq(&sock)
            .map_err(|e| anyhow!("fill/completion rings: {e}"))?;
        let user = umem
            .rx_tx(
                &sock,
                &SocketConfig {
                    rx_size: NonZeroU32::new(RX_FRAMES),
                    tx_size: NonZeroU32::new(TX_FRAMES),
                    bind_flags: SocketConfig::XDP_BIND_COPY
                        | SocketConfig::XDP_BIND_NEED_WAKEUP
                        | XDP_USE_SG,
                },
            )
            .map_err(|e| anyhow!("RX/TX rings: {e}"))?;
        let rx = user.map_rx().map_err(|e| anyhow!("mapping the RX ring: {e}"))?;
        let tx = user.map_tx().map_err(|e| anyhow!("mapping the TX ring: {e}"))?;
        umem.bind(&user).map_err(|e| {
            anyhow!("binding the AF_XDP socket to {ifname} queue {queue_id} (copy mode): {e}")
        })?;
        let mut q = XskQueue {
            rx,
            tx,
            fcq,
            _umem: umem,
            area,
            free_rx: (0..RX_FRAMES).map(|i| (i * FRAME_SIZE) as u64).collect(),
            free_tx: (RX_FRAMES..total).map(|i| (i * FRAME_SIZE) as u64).collect(),
            queue_id,
            counters,
            joining: Vec::new(),
            skipping: false,
        };
        q.refill();
        Ok(q)
    }

    /// The socket's descriptor (for the XSKS map and poll(2)).
    pub fn fd(&self) -> i32 {
        self.rx.as_raw_fd()
    }

    /// The kernel's counters for this socket (`XDP_STATISTICS`): frames the program steered here but the
    /// kernel dropped (no fill ring entry, RX ring full), and invalid descriptors.
    fn statistics(&self) -> Option<XdpStatisticsV2> {
        self.fcq.statistics_v2().ok()
    }

    /// Copies the kernel's counters ([`Self::statistics`]) into the shared [`QueueCounters`]; returns them.
    pub fn refresh_statistics(&self) -> Option<XdpStatisticsV2> {
        let stats = self.statistics();
        if let Some(s) = stats {
            let c = &self.counters;
            c.rx_dropped.store(s.rx_dropped, Ordering::Relaxed);
            c.rx_ring_full.store(s.rx_ring_full, Ordering::Relaxed);
            c.rx_fill_ring_empty
                .store(s.rx_fill_ring_empty_descs, Ordering::Relaxed);
            c.invalid_descs
                .store(s.rx_invalid_descs + s.tx_invalid_descs, Ordering::Relaxed);
        }
        stats
    }

    fn chunk(addr: u64) -> u64 {
        addr & !(FRAME_SIZE as u64 - 1)
    }

    /// Hands every free RX frame to the kernel; those that do not fit stay queued for the next call.
    pub fn refill(&mut self) {
        if !self.free_rx.is_empty() {
            let mut w = self.fcq.fill(self.free_rx.len() as u32);
            let n = w.insert(self.free_rx.iter().copied()) as usize;
            w.commit();
            drop(w);
            self.free_rx.drain(..n);
        }
        if self.fcq.needs_wakeup() {
            self.fcq.wake();
        }
    }

    /// Calls `f` with each received packet (at most `max` descriptors; a multi-buffer packet's descriptors
    /// joined, see the module documentation); returns how many packets.
    pub fn receive(&mut self, max: u32, mut f: impl FnMut(&[u8])) -> u32 {
        let mut n = 0;
        {
            let mut r = self.rx.receive(max);
            while let Some(desc) = r.read() {
                let len = (desc.len as usize).min(self.area.len.saturating_sub(desc.addr as usize));
                // SAFETY: the kernel wrote `len` bytes at `addr` inside our UMEM and handed the frame to
                // us (it is ours until it goes back to the fill ring).
                let data = unsafe {
                    std::slice::from_raw_parts(self.area.ptr.as_ptr().add(desc.addr as usize), len)
                };
                let more = desc.options & XDP_PKT_CONTD != 0;
                if !more && self.joining.is_empty() && !self.skipping {
                    f(data);
                    n += 1;
                } else if self.joining.len() + data.len() > MAX_PACKET || self.skipping {
                    // Past the bound: the rest of this packet goes, and it is counted once.
                    if !self.skipping {
                        self.counters.oversized.fetch_add(1, Ordering::Relaxed);
                    }
                    self.joining.clear();
                    self.skipping = more;
                } else {
                    self.joining.extend_from_slice(data);
                    if !more {
                        f(&self.joining);
                        self.joining.clear();
                        n += 1;
                    }
                }
                self.free_rx.push(Self::chunk(desc.addr));
            }
            r.release();
        }
        if n > 0 {
            self.counters.rx_frames.fetch_add(n as u64, Ordering::Relaxed);
            self.refill();
        }
        n
    }

    /// Frames the kernel finished transmitting go back to the free list.
    pub fn reap_completions(&mut self) -> u32 {
        let mut n = 0;
        let mut c = self.fcq.complete(TX_FRAMES);
        while let Some(addr) = c.read() {
            self.free_tx.push(Self::chunk(addr));
            n += 1;
        }
        c.release();
        n
    }

    pub fn tx_free(&self) -> usize {
        self.free_tx.len()
    }

    /// Frames queued on the TX ring and not yet taken by the kernel.
    pub fn tx_pending(&self) -> u32 {
        self.tx.pending()
    }

    /// A free TX frame, if any.
    fn take_tx(&mut self) -> Option<u64> {
        self.free_tx.pop()
    }

    fn frame_mut(&mut self, addr: u64, len: usize) -> &mut [u8] {
        let len = len.min(FRAME_SIZE as usize);
        // SAFETY: a free TX frame of our UMEM: nobody else (kernel included) touches it now.
        unsafe { std::slice::from_raw_parts_mut(self.area.ptr.as_ptr().add(addr as usize), len) }
    }

    fn frame(&self, addr: u64, len: usize) -> &[u8] {
        // SAFETY: a frame of our UMEM we just wrote.
        unsafe { std::slice::from_raw_parts(self.area.ptr.as_ptr().add(addr as usize), len) }
    }

    fn submit(&mut self, addr: u64, len: usize) {
        let mut w = self.tx.transmit(1);
        if w.insert_once(XdpDesc {
            addr,
            len: len as u32,
            options: 0,
        }) {
            w.commit();
            self.counters.tx_frames.fetch_add(1, Ordering::Relaxed);
        } else {
            // Cannot happen (the ring holds every TX frame), but never lose the frame.
            drop(w);
            self.free_tx.push(addr);
        }
    }

    /// Makes the kernel transmit what the TX ring holds (copy mode: sendto, 32 frames per call).
    pub fn kick(&mut self) {
        let mut rounds = 0;
        while self.tx.pending() > 0 && rounds < 256 {
            if !self.tx.needs_wakeup() {
                break;
            }
            // SAFETY: zero-length sendto on our own socket.
            let r = unsafe {
                libc::sendto(
                    self.tx.as_raw_fd(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            };
            if r < 0 {
                let e = std::io::Error::last_os_error().raw_os_error();
                // EAGAIN: the batch limit, go on; EBUSY/ENOBUFS/ENXIO: the device is busy, retry later.
                if e != Some(libc::EAGAIN) {
                    break;
                }
            }
            rounds += 1;
        }
    }
}

/// The smoltcp device: all queues' RX, queue 0's TX.
pub struct XdpDevice {
    pub queues: Vec<XskQueue>,
    /// Frames for smoltcp: received ones and injected neighbour answers, in order.
    pub rx_frames: VecDeque<Vec<u8>>,
    /// Next-hop addresses smoltcp asked for (ARP request / Neighbor Solicitation it tried to send).
    pub solicits: Vec<IpAddr>,
    /// IP MTU.
    pub mtu: usize,
    /// Frames written to the TX ring since the last kick.
    pub tx_queued: u32,
    /// Frames smoltcp produced while no TX frame was free (dropped: TCP retransmits).
    pub tx_dropped: u64,
}

impl XdpDevice {
    pub fn new(queues: Vec<XskQueue>, mtu: usize) -> XdpDevice {
        XdpDevice {
            queues,
            rx_frames: VecDeque::new(),
            solicits: Vec::new(),
            mtu,
            tx_queued: 0,
            tx_dropped: 0,
        }
    }

    /// A transmit token for queue 0 (a frame that finds no free TX slot is dropped and counted).
    pub fn tx_token(&mut self) -> TxTok<'_> {
        let XdpDevice {
            queues,
            solicits,
            tx_queued,
            tx_dropped,
            ..
        } = self;
        TxTok {
            q: &mut queues[0],
            solicits,
            queued: tx_queued,
            dropped: tx_dropped,
        }
    }

    pub fn kick(&mut self) {
        if self.tx_queued > 0 || self.queues[0].tx_pending() > 0 {
            self.queues[0].kick();
            self.tx_queued = 0;
        }
    }
}

pub struct RxTok(pub Vec<u8>);

impl phy::RxToken for RxTok {
    fn consume<R, F>(self, f: F) -> R
    where
        F: FnOnce(&[u8]) -> R,
    {
        f(&self.0)
    }
}

pub struct TxTok<'a> {
    q: &'a mut XskQueue,
    solicits: &'a mut Vec<IpAddr>,
    queued: &'a mut u32,
    dropped: &'a mut u64,
}

/// A TCP SYN without ACK (IPv4 or IPv6 without extension headers, at most one VLAN tag).
pub fn is_connection_request(frame: &[u8]) -> bool {
    let (mut ethertype, mut l3) = (frame.get(12..14), 14);
    if ethertype == Some(&[0x81, 0x00]) {
        (ethertype, l3) = (frame.get(16..18), 18);
    }
    let l4 = match ethertype {
        Some([0x08, 0x00]) if frame.get(l3 + 9) == Some(&6) => {
            l3 + ((frame.get(l3).copied().unwrap_or(0) & 0x0f) as usize) * 4
        }
        Some([0x86, 0xdd]) if frame.get(l3 + 6) == Some(&6) => l3 + 40,
        _ => return false,
    };
    frame.get(l4 + 13).is_some_and(|flags| flags & 0x12 == 0x02)
}

/// The address an ARP request or Neighbor Solicitation asks for, if `frame` is one.
fn solicited_target(frame: &[u8]) -> Option<IpAddr> {
    if frame.len() < 14 {
        return None;
    }
    match u16::from_be_bytes([frame[12], frame[13]]) {
        // ARP: htype 1, ptype 0x0800, op 1 (request); target protocol address at 14 + 24.
        0x0806 if frame.len() >= 42 && frame[20..22] == [0, 1] => {
            let t: [u8; 4] = frame[38..42].try_into().ok()?;
            Some(IpAddr::V4(Ipv4Addr::from(t)))
        }
        // IPv6, next header ICMPv6 (58), type 135 (NS); target at ICMPv6 + 8.
        0x86DD if frame.len() >= 14 + 40 + 24 && frame[14 + 6] == 58 && frame[54] == 135 => {
            let t: [u8; 16] = frame[62..78].try_into().ok()?;
            Some(IpAddr::V6(Ipv6Addr::from(t)))
        }
        _ => None,
    }
}

impl phy::TxToken for TxTok<'_> {
    fn consume<R, F>(self, len: usize, f: F) -> R
    where
        F: FnOnce(&mut [u8]) -> R,
    {
        let Some(addr) = self.q.take_tx() else {
            *self.dropped += 1;
            let mut scratch = vec![0u8; len];
            return f(&mut scratch);
        };
        let len = len.min(FRAME_SIZE as usize);
        let r = f(self.q.frame_mut(addr, len));
        if let Some(target) = solicited_target(self.q.frame(addr, len)) {
            // Answered from the kernel's neighbour table instead (stack.rs).
            self.q.free_tx.push(addr);
            if !self.solicits.contains(&target) {
                self.solicits.push(target);
            }
        } else {
            self.q.submit(addr, len);
            *self.queued += 1;
        }
        r
    }
}

impl phy::Device for XdpDevice {
    type RxToken<'a> = RxTok;
    type TxToken<'a> = TxTok<'a>;

    fn receive(&mut self, _timestamp: Instant) -> Option<(RxTok, TxTok<'_>)> {
        let frame = self.rx_frames.pop_front()?;
        Some((RxTok(frame), self.tx_token()))
    }

    fn transmit(&mut self, _timestamp: Instant) -> Option<TxTok<'_>> {
        if self.queues[0].tx_free() == 0 {
            return None;
        }
        Some(self.tx_token())
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = self.mtu + 14;
        caps
    }
}

#[cfg(test)]
mod tests {
    use super::is_connection_request;

    /// An Ethernet frame with `ethertype` and `l3` after the MAC addresses (and a VLAN tag if `vlan`).
    fn frame(vlan: bool, ethertype: [u8; 2], l3: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        if vlan {
            f.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
        }
        f.extend_from_slice(&ethertype);
        f.extend_from_slice(l3);
        f
    }

    fn ipv4_tcp(flags: u8, ihl: u8) -> Vec<u8> {
        let mut ip = vec![0u8; ihl as usize * 4 + 20];
        ip[0] = 0x40 | ihl;
        ip[9] = 6;
        ip[ihl as usize * 4 + 13] = flags;
        ip
    }

    fn ipv6_tcp(flags: u8) -> Vec<u8> {
        let mut ip = vec![0u8; 60];
        ip[0] = 0x60;
        ip[6] = 6;
        ip[40 + 13] = flags;
        ip
    }

    #[test]
    fn connection_requests_are_syns_without_ack() {
        const SYN: u8 = 0x02;
        const ACK: u8 = 0x10;
        for vlan in [false, true] {
            assert!(is_connection_request(&frame(
                vlan,
                [0x08, 0x00],
                &ipv4_tcp(SYN, 5)
            )));
            assert!(
                is_connection_request(&frame(vlan, [0x08, 0x00], &ipv4_tcp(SYN, 8))),
                "IPv4 options"
            );
            assert!(is_connection_request(&frame(vlan, [0x86, 0xdd], &ipv6_tcp(SYN))));
            assert!(!is_connection_request(&frame(
                vlan,
                [0x08, 0x00],
                &ipv4_tcp(SYN | ACK, 5)
            )));
            assert!(!is_connection_request(&frame(
                vlan,
                [0x08, 0x00],
                &ipv4_tcp(ACK, 5)
            )));
            assert!(!is_connection_request(&frame(
                vlan,
                [0x86, 0xdd],
                &ipv6_tcp(ACK | 0x01)
            )));
            let mut udp = ipv4_tcp(SYN, 5);
            udp[9] = 17;
            assert!(!is_connection_request(&frame(vlan, [0x08, 0x00], &udp)));
            assert!(
                !is_connection_request(&frame(vlan, [0x08, 0x06], &[0u8; 28])),
                "ARP"
            );
        }
        let whole = frame(false, [0x08, 0x00], &ipv4_tcp(SYN, 5));
        // Cut before the flags byte (Ethernet 14 + IPv4 20 + TCP 13): not one.
        for cut in 0..14 + 20 + 14 {
            assert!(!is_connection_request(&whole[..cut]), "truncated at {cut}");
        }
    }
}
