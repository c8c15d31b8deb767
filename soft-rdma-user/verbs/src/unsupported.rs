//! What iWARP or soft-rdma lacks, exported so that programs bind, and failing with rdma-core's errno.
