//! The drop-in libibverbs' post and poll calls (soft_rdma_verbs, through `ibv_context.ops` as verbs.h's
//! inlines call them) with arbitrary work requests: any opcode and send flags (inline included), SGE lists
//! of any length (negative too) whose lkeys name a live region, another PD's, a read-only one, a
//! deregistered one or nothing, with any address and length, and any remote address and rkey; Receives
//! alike; polls of any size. Each input runs on a fresh queue pair of a process-wide device, which is then
//! destroyed and its completion queue drained. Never crashes; every byte around the registered regions (the
//! guards) and every byte of the regions the queue pair may not write stays as it was.
//!
//! A real soft-rdmad is needed: a verbs device is a session with it (`ibv_open_device` connects to its
//! socket; protection domains, regions and queue pairs are made through it). The lightest one: a single
//! soft-rdmad in kernel-TCP mode (no XDP, no root-only setup) on a private socket, started on the first
//! input and killed with this process (PR_SET_PDEATHSIG); `$SOFT_RDMA_FUZZ_DAEMON` names its binary (else
//! `target/debug/soft-rdmad` of this repository: `cargo build -p soft-rdma-user --bins`). The queue pairs
//! are never connected, so the fuzzer sees the checks at the post, the flush and the polls, not placement.
#![no_main]
use std::os::unix::process::CommandExt;
use std::ptr::null_mut;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use soft_rdma_verbs::abi::*;
use soft_rdma_verbs::c::*;

const GUARD: usize = 64;
const REGION: usize = 256;
/// Regions: 0 read-write (PD 0), 1 read-only (PD 0: no LOCAL_WRITE), 2 another PD's, 3 deregistered.
const REGIONS: usize = 4;
const FILL: u8 = 0xA5;

struct Device {
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    cq: *mut ibv_cq,
    /// GUARD | region 0 | GUARD | region 1 | GUARD | ... | GUARD.
    mem: *mut u8,
    lkeys: [u32; REGIONS],
    _daemon: std::process::Child,
}

// SAFETY: the pointers are the library's handles and a leaked buffer, used by libFuzzer's one thread.
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

fn len() -> usize {
    GUARD + REGIONS * (REGION + GUARD)
}

fn region(mem: *mut u8, r: usize) -> *mut u8 {
    mem.wrapping_add(GUARD + r * (REGION + GUARD))
}

fn device() -> &'static Device {
    static DEVICE: OnceLock<Device> = OnceLock::new();
    DEVICE.get_or_init(|| unsafe { open() })
}

unsafe fn open() -> Device {
    let dir = std::env::temp_dir().join(format!("soft-rdma-fuzz-verbs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let uds = dir.join("soft-rdmad.sock");
    let bin = std::env::var_os("SOFT_RDMA_FUZZ_DAEMON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/soft-rdmad")
        });
    let log = std::fs::File::create(dir.join("soft-rdmad.log")).unwrap();
    let mut cmd = std::process::Command::new(&bin);
    cmd.arg("--uds")
        .arg(&uds)
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    // SAFETY: async-signal-safe prctl between fork and exec: the daemon dies with this process.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        })
    };
    let daemon = cmd.spawn().unwrap_or_else(|e| {
        panic!(
            "cannot start {} ({e}): cargo build -p soft-rdma-user --bins",
            bin.display()
        )
    });
    while !uds.exists() {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // SAFETY: before the library reads the environment (its first use is below).
    unsafe { std::env::set_var("SOFT_RDMA_UDS", &uds) };
    let mut n = 0;
    let list = unsafe { ibv_get_device_list(&mut n) };
    assert!(
        n >= 1,
        "no soft-rdma device: is soft-rdmad up at {}?",
        uds.display()
    );
    let ctx = unsafe { ibv_open_device(*list) };
    assert!(!ctx.is_null());
    let pd = unsafe { ibv_alloc_pd(ctx) };
    let other_pd = unsafe { ibv_alloc_pd(ctx) };
    let cq = unsafe { ibv_create_cq(ctx, 256, null_mut(), null_mut(), 0) };
    assert!(!pd.is_null() && !other_pd.is_null() && !cq.is_null());
    let mem = Box::leak(vec![FILL; len()].into_boxed_slice()).as_mut_ptr();
    let rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    let mut lkeys = [0; REGIONS];
    for (r, (p, access)) in [(pd, rw), (pd, IBV_ACCESS_REMOTE_READ), (other_pd, rw), (pd, rw)]
        .into_iter()
        .enumerate()
    {
        let mr = unsafe { ibv_reg_mr(p, region(mem, r).cast(), REGION, access as i32) };
        assert!(!mr.is_null(), "ibv_reg_mr");
        lkeys[r] = unsafe { (*mr).lkey };
        if r == 3 {
            assert_eq!(unsafe { ibv_dereg_mr(mr) }, 0);
        }
    }
    Device {
        ctx,
        pd,
        cq,
        mem,
        lkeys,
        _daemon: daemon,
    }
}

/// Bytes of the input, zero past its end.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        let Some((&b, rest)) = self.0.split_first() else {
            return 0;
        };
        self.0 = rest;
        b
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
}

/// An SGE: mostly in or near a region (an offset from its start that may run off either end), sometimes
/// anywhere; its lkey a region's, a corrupted one or any. Inline SGEs stay inside the buffer: the library
/// copies them from the program's memory at the post, which a wild address would fault in any libibverbs.
fn sge(d: &Device, i: &mut Input, inline: bool) -> ibv_sge {
    let sel = i.u8();
    let r = usize::from(sel & 3);
    let base = region(d.mem, r) as u64;
    let (addr, length) = if inline {
        let at = usize::from(i.u8()) % len();
        let n = usize::from(i.u8()) % (len() - at + 1);
        (d.mem as u64 + at as u64, n as u32)
    } else if sel & 0x80 != 0 {
        (i.u64(), i.u32())
    } else {
        let off = i.u32() as i32 as i64 % (2 * REGION as i64);
        (base.wrapping_add(off as u64), i.u32() % (2 * REGION as u32))
    };
    let lkey = match (sel >> 2) & 3 {
        0 | 1 => d.lkeys[r],
        2 => d.lkeys[r] ^ u32::from(i.u8()),
        _ => i.u32(),
    };
    ibv_sge { addr, length, lkey }
}

fuzz_target!(|data: &[u8]| {
    let d = device();
    let mut i = Input(data);
    let mut attr = ibv_qp_init_attr {
        send_cq: d.cq,
        recv_cq: d.cq,
        qp_type: IBV_QPT_RC,
        sq_sig_all: i32::from(i.u8() & 1),
        cap: ibv_qp_cap {
            max_send_wr: 8,
            max_recv_wr: 8,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
        },
        ..unsafe { std::mem::zeroed() }
    };
    // SAFETY: the library's C functions with live arguments throughout.
    let qp = unsafe { ibv_create_qp(d.pd, &mut attr) };
    assert!(!qp.is_null(), "ibv_create_qp");
    let ops = unsafe { &(*d.ctx).ops };
    let (post_send, post_recv, poll) = (
        ops.post_send.unwrap(),
        ops.post_recv.unwrap(),
        ops.poll_cq.unwrap(),
    );
    let mut wcs = [ibv_wc::default(); 16];
    for _ in 0..16 {
        if i.0.is_empty() {
            break;
        }
        let op = i.u8();
        // Up to 8 SGEs in the list; num_sge may claim fewer, more than the queue pair takes, or be negative.
        let inline_flag = op & 0x40 != 0;
        let mut sges: Vec<ibv_sge> = (0..8).map(|_| sge(d, &mut i, inline_flag)).collect();
        let num_sge = match i.u8() {
            n @ 0..=8 => i32::from(n),
            0xff => -1,
            n => i32::from(n) * 1000,
        };
        let num_sge = num_sge.min(8);
        match op & 3 {
            0 | 1 => {
                let mut wr = ibv_send_wr {
                    wr_id: u64::from(op),
                    next: null_mut(),
                    sg_list: sges.as_mut_ptr(),
                    num_sge,
                    opcode: i32::from(i.u8() % 12),
                    // IBV_SEND_INLINE only with the inline SGEs above: an inline SGE's bytes are copied from the
                    // program's memory at the post (ibv_post_send(3)), which any libibverbs trusts.
                    send_flags: u32::from(i.u8()) & 0x1f & !IBV_SEND_INLINE
                        | if inline_flag { IBV_SEND_INLINE } else { 0 },
                    invalidate_rkey: i.u32(),
                    rdma: ibv_send_wr_rdma {
                        remote_addr: i.u64(),
                        rkey: i.u32(),
                        _rest_of_union: [0; 5],
                    },
                    qp_type: 0,
                    _bind_mw_tso: [0; 6],
                };
                let mut bad = null_mut();
                unsafe { post_send(qp, &mut wr, &mut bad) };
            }
            2 => {
                let mut wr = ibv_recv_wr {
                    wr_id: u64::from(op),
                    next: null_mut(),
                    sg_list: sges.as_mut_ptr(),
                    num_sge,
                };
                let mut bad = null_mut();
                unsafe { post_recv(qp, &mut wr, &mut bad) };
            }
            _ => {
                let n = i32::from(i.u8() % 17);
                let got = unsafe { poll(d.cq, n, wcs.as_mut_ptr()) };
                assert!(got <= n, "ibv_poll_cq returned {got} of {n}");
            }
        }
    }
    assert_eq!(unsafe { ibv_destroy_qp(qp) }, 0, "ibv_destroy_qp");
    while unsafe { poll(d.cq, 16, wcs.as_mut_ptr()) } > 0 {}
    // SAFETY: the leaked buffer, read while no queue pair is left to write it.
    let mem = unsafe { std::slice::from_raw_parts(d.mem, len()) };
    for r in 0..=REGIONS {
        let g = r * (REGION + GUARD);
        assert!(
            mem[g..g + GUARD].iter().all(|&b| b == FILL),
            "a guard byte changed before region {r}"
        );
    }
    for r in 1..REGIONS {
        let at = GUARD + r * (REGION + GUARD);
        assert!(
            mem[at..at + REGION].iter().all(|&b| b == FILL),
            "region {r} (not writable here) changed"
        );
    }
});
