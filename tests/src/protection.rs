//! What `tests/c/protection.c` prints when it passes, for the suites that run it: between two soft-rdma
//! ends (`tests/tests/protection.rs`) and against kernel siw (`tests/tests/siw_c_programs.rs`).

use crate::rdma_core::Outcome;

/// Cases per client (`NCASES` in protection.c).
pub const CASES: usize = 10;

/// Whether `protection`'s target passed: exit 0 and one PASS verdict per case of each of its two clients.
pub fn target_passed(o: &Outcome) -> bool {
    let verdicts = o.lines_with("CASE ");
    o.success() && verdicts.len() == 2 * CASES && verdicts.iter().all(|l| l.contains(": PASS"))
}

/// Whether a `protection` client passed: exit 0 and its two verdicts (bad-lkey, other-pd-read) PASS.
pub fn client_passed(o: &Outcome) -> bool {
    let verdicts = o.lines_with("CASE ");
    o.success() && verdicts.len() == 2 && verdicts.iter().all(|l| l.contains(": PASS"))
}
