//! Scatter/gather lists: copying message bytes out of and into registered memory through the registry's
//! checks.

use super::*;
use crate::engine::framing::PayloadDst;

/// Walks the pieces of message bytes `[pos, pos + len)` across `sgl`: for each SGE the range covers, calls
/// `piece(sge, offset into the SGE, range of the caller's buffer)`. Stops early, answering `None`, when
/// `piece` answers false; otherwise answers how many bytes the list covered (less than `len` when the list
/// is shorter).
fn walk(
    sgl: &[Sge],
    pos: u64,
    len: usize,
    mut piece: impl FnMut(&Sge, u64, core::ops::Range<usize>) -> bool,
) -> Option<usize> {
    let mut skip = pos;
    let mut at = 0usize;
    for sge in sgl {
        let want = len.saturating_sub(at);
        if want == 0 {
            break;
        }
        let l = u64::from(sge.length);
        if skip >= l {
            skip -= l;
            continue;
        }
        let n = (l - skip).min(want as u64) as usize;
        if !piece(sge, skip, at..at + n) {
            return None;
        }
        at += n;
        skip = 0;
    }
    Some(at)
}

/// Supplies bytes `[pos, pos + len)` of the message gathered from `sgl` to `dst`: copied, or, for a gather
/// list, as references to the regions that can be sent in place. An SGE that no longer passes its check
/// contributes zeros; the result says whether every piece was readable.
pub(super) fn gather(
    mem: &MemoryRegistry,
    domain: Domain,
    sgl: &[Sge],
    pos: u64,
    len: usize,
    mut dst: PayloadDst<'_>,
) -> bool {
    let mut ok = true;
    walk(sgl, pos, len, |sge, skip, range| {
        let n = range.len();
        let off = sge.offset.checked_add(skip);
        let readable = off.is_some_and(|off| mem.check(domain, sge.stag, off, n as u64, Access(0)).is_ok());
        let off = off.unwrap_or_default();
        if let (true, PayloadDst::Gather(g)) = (readable, &mut dst)
            && let Some(pinned) = mem.pinned(sge.stag)
            && let Ok(at) = usize::try_from(off)
        {
            g.refer(pinned, at, n);
            return true;
        }
        dst.copy(range.start, n, |piece| {
            if readable {
                mem.read(sge.stag, off, piece);
            } else {
                piece.fill(0);
            }
        });
        ok &= readable;
        true
    });
    ok
}

/// Places `data` at message position `pos` across the scatter list `sgl` (LOCAL_WRITE re-checked).
pub(super) fn scatter(mem: &MemoryRegistry, domain: Domain, sgl: &[Sge], pos: u64, data: &[u8]) -> bool {
    let covered = walk(sgl, pos, data.len(), |sge, skip, range| {
        let n = range.len() as u64;
        let (Some(piece), Some(off)) = (data.get(range), sge.offset.checked_add(skip)) else {
            return false;
        };
        if mem.check(domain, sge.stag, off, n, Access::LOCAL_WRITE).is_err() {
            return false;
        }
        mem.write(sge.stag, off, piece);
        true
    });
    covered == Some(data.len())
}

/// Every nonzero SGE passes `check` with `need` (siw `siw_check_sgl_tx` skips zero-length SGEs).
pub(super) fn check_sgl(
    mem: &MemoryRegistry,
    domain: Domain,
    sgl: &[Sge],
    need: Access,
) -> Result<(), AccessError> {
    sgl.iter()
        .filter(|s| s.length > 0)
        .try_for_each(|s| mem.check(domain, s.stag, s.offset, u64::from(s.length), need))
}
