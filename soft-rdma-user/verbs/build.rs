//! Links `libsoft_rdma_verbs.so` as rdma-core's libraries are linked: soname `libibverbs.so.1` (the file is
//! also reached as `librdmacm.so.1`, a second name of the same inode that glibc maps once) and the version
//! nodes of rdma-core 44's `libibverbs.map.in` and `librdmacm.map` (`symbols.map`), so that binaries linked
//! against rdma-core find every version node they need (glibc `_dl_check_map_versions`).

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let map = std::path::Path::new(&dir).join("symbols.map");
    println!("cargo:rerun-if-changed={}", map.display());
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
}
