//! Builds the XDP program (`soft-rdma-ebpf`) for `bpfel-unknown-none` with aya-build so that a plain
//! `cargo build` embeds the object (`include_bytes_aligned!(concat!(env!("OUT_DIR"), "/soft-rdma-xdp"))`).
//! Needs the nightly toolchain with rust-src and bpf-linker: `cargo xtask setup` installs both.
fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-changed=../soft-rdma-common/src");
    let linker_ok = std::process::Command::new("bpf-linker")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !linker_ok {
        anyhow::bail!(
            "bpf-linker is not installed (needed to build the XDP program). Run `cargo xtask setup` first."
        );
    }
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "soft-rdma-ebpf",
            root_dir: "../soft-rdma-ebpf",
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
}
