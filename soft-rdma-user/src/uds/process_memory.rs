//! A client's own memory, reached by soft-rdmad in the client's process: the regions a C program registers
//! with `ibv_reg_mr` on its own buffers (rdma-core `infiniband/verbs.h`) when soft-rdmad runs its queue pairs
//! (XDP mode), where no memfd can be shared.
//!
//! This module owns [`ProcessMemory`] (one such region) and [`ClientProcess`] (the session's handle on the
//! client's address space). The handle is `/proc/<pid>/mem` of the process that connected (SO_PEERCRED),
//! opened once per session: the open file stays bound to that process's memory, so it can never reach
//! another process that later gets the same pid; once the client exits, every access fails (`proc(5)`,
//! `/proc/pid/mem`). Opening it needs the ptrace access check (`ptrace(2)`, "Ptrace access mode checking"):
//! soft-rdmad runs as root with CAP_SYS_PTRACE.
//!
//! A failed access (the client unmapped the buffer, or exited) is logged, rate-limited, and the bytes are
//! left alone or read as zeros: the client broke the rule every RDMA buffer has (stay registered memory until
//! deregistered), and only its own connection can suffer for it.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use crate::engine::memory::RegionMemory;
use crate::error::{Error, NdStatus};
use crate::warn_limited;

/// The address space of the process that opened a session (its `/proc/<pid>/mem`).
#[derive(Clone, Debug)]
pub struct ClientProcess {
    mem: Arc<File>,
    pid: i32,
}

impl ClientProcess {
    /// Opens the address space of `pid` (SO_PEERCRED of the session). Errors say why, with what to do.
    pub fn open(pid: Option<i32>) -> Result<ClientProcess, Error> {
        let Some(pid) = pid else {
            return Err(Error::new(
                NdStatus::InvalidParameter,
                "soft-rdmad does not know this client's pid (no SO_PEERCRED), so it cannot reach memory the \
                 client registered in place: register memory the library allocates (register_memory) instead",
            ));
        };
        let mem = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .map_err(|e| {
                Error::new(
                    NdStatus::AccessViolation,
                    format!(
                        "soft-rdmad cannot open /proc/{pid}/mem to reach the memory this client registered in \
                         place ({e}): run soft-rdmad as root with CAP_SYS_PTRACE, or use kernel-TCP mode"
                    ),
                )
            })?;
        Ok(ClientProcess {
            mem: Arc::new(mem),
            pid,
        })
    }

    /// `length` bytes at `address` in the client, as a region's memory. INVALID_PARAMETER when the range is
    /// empty or wraps the address space.
    pub fn region(&self, address: u64, length: u64) -> Result<ProcessMemory, Error> {
        if length == 0 || address.checked_add(length).is_none() {
            return Err(Error::new(
                NdStatus::InvalidParameter,
                format!("a region of {length} bytes at {address:#x} is empty or wraps the address space"),
            ));
        }
        Ok(ProcessMemory {
            process: self.clone(),
            address,
            length,
        })
    }
}

/// One region of a client's own memory ([`ClientProcess::region`]).
#[derive(Debug)]
pub struct ProcessMemory {
    process: ClientProcess,
    address: u64,
    length: u64,
}

impl RegionMemory for ProcessMemory {
    fn len(&self) -> u64 {
        self.length
    }

    fn read_at(&self, offset: u64, out: &mut [u8]) {
        let at = self.address.saturating_add(offset);
        if let Err(e) = self.process.mem.read_exact_at(out, at) {
            out.fill(0);
            warn_limited!(pid = self.process.pid, address = at, len = out.len(), error = %e,
                "cannot read the client's registered memory (unmapped, or the client exited): zeros sent");
        }
    }

    fn write_at(&self, offset: u64, data: &[u8]) {
        let at = self.address.saturating_add(offset);
        if let Err(e) = self.process.mem.write_all_at(data, at) {
            warn_limited!(pid = self.process.pid, address = at, len = data.len(), error = %e,
                "cannot write the client's registered memory (unmapped, or the client exited): bytes dropped");
        }
    }

    /// Every access is a `pread` or `pwrite` of `/proc/<pid>/mem`, which walks the client's page tables page
    /// by page.
    fn costly_access(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reaches_this_process_and_refuses_what_it_cannot() {
        let mut buf = vec![0u8; 64];
        let me = ClientProcess::open(Some(std::process::id() as i32)).expect("root opens its own mem");
        let r = me.region(buf.as_mut_ptr() as u64, 64).unwrap();
        r.write_at(8, b"hello");
        let mut out = [0u8; 5];
        r.read_at(8, &mut out);
        assert_eq!(&out, b"hello");
        assert_eq!(&std::hint::black_box(&buf)[8..13], b"hello");
        assert!(me.region(u64::MAX - 1, 4).is_err(), "wraps");
        assert!(me.region(0x1000, 0).is_err(), "empty");
        // Address 0 is never mapped: the read fails, zeros come out, nothing panics.
        let unmapped = me.region(0, 16).unwrap();
        let mut z = [1u8; 16];
        unmapped.read_at(0, &mut z);
        assert_eq!(z, [0; 16]);
        assert!(ClientProcess::open(None).is_err());
    }
}
