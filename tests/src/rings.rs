//! A client process's view of its shared rings (`soft_rdma::rings`), as a client that breaks the contract
//! would see them: the queue pairs' ring memfds it has mapped, found in `/proc/self/maps`, and writes into
//! them behind the client library's back (through `/proc/self/map_files`, which root may open).

use std::collections::BTreeSet;
use std::os::unix::fs::FileExt;

/// The memfd name of a queue pair's rings (`QpRingLayout::create`).
const QP_RINGS: &str = "memfd:soft-rdma-qp-rings";

/// The address ranges (`start-end`, as `/proc/self/maps` writes them) of the queue-pair rings this process
/// has mapped.
pub fn qp_ring_mappings() -> BTreeSet<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    maps.lines()
        .filter(|l| l.contains(QP_RINGS))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// Writes `bytes` at `offset` of the ring memfd mapped at `range` (from [`qp_ring_mappings`]).
pub fn scribble(range: &str, offset: u64, bytes: &[u8]) {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/self/map_files/{range}"))
        .expect("open the ring's memfd through /proc/self/map_files");
    file.write_all_at(bytes, offset).expect("write into the ring");
}
