//! With the `daemon` feature, builds the XDP program (`soft-rdma-ebpf`) for `bpfel-unknown-none` with
//! aya-build, so that a plain `cargo build` embeds the object
//! (`include_bytes_aligned!(concat!(env!("OUT_DIR"), "/soft-rdma-xdp"))`). That needs the nightly toolchain
//! with rust-src and bpf-linker: `cargo xtask setup` installs both. The client library alone (`--no-default-
//! features --features client`) builds nothing here and needs neither.
fn main() {
    #[cfg(feature = "daemon")]
    if let Err(e) = xdp_program() {
        // A build script's error is printed as it is: say what is missing and the one command that fixes it.
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

#[cfg(feature = "daemon")]
fn xdp_program() -> Result<(), String> {
    println!("cargo:rerun-if-changed=../soft-rdma-common/src");
    let linker_ok = std::process::Command::new("bpf-linker")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !linker_ok {
        return Err("bpf-linker is not installed (soft-rdmad's `daemon` feature builds the XDP program with it). \
             Fix: run `cargo xtask setup` from the repository root; it installs bpf-linker and nightly rust-src. \
             An application that only needs the client library can instead depend on soft-rdma-user with \
             `default-features = false, features = [\"client\"]`, which needs neither."
            .into());
    }
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "soft-rdma-ebpf",
            root_dir: "../soft-rdma-ebpf",
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
    .map_err(|e| format!("building the XDP program failed: {e:#}. If the tool chain is incomplete, `cargo xtask setup` installs it."))
}
