//! The XDP program: steers the TCP segments of soft-rdma's connections into AF_XDP rings.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

#[cfg(target_arch = "bpf")]
mod program {
    use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};

    #[xdp]
    pub fn soft_rdma_xdp(_ctx: XdpContext) -> u32 {
        xdp_action::XDP_PASS
    }

    #[panic_handler]
    fn panic(_info: &core::panic::PanicInfo) -> ! {
        loop {}
    }

    #[unsafe(link_section = "license")]
    #[unsafe(no_mangle)]
    static LICENSE: [u8; 4] = *b"GPL\0";
}

#[cfg(not(target_arch = "bpf"))]
fn main() {}
