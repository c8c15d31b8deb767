//! Scatter/gather lists: copying message bytes out of and into registered memory through the registry's
//! checks.

use super::*;

/// Copies bytes `[pos, pos + dst.len())` of the message gathered from `sgl` into `dst`. An SGE that no longer
/// passes its check contributes zeros; the result says whether every piece was readable.
pub(super) fn gather(
    mem: &MemoryRegistry,
    session: SessionId,
    sgl: &[Sge],
    pos: u64,
    dst: &mut [u8],
) -> bool {
    let mut ok = true;
    let mut skip = pos;
    let mut at = 0usize;
    for sge in sgl {
        let want = dst.len().saturating_sub(at);
        if want == 0 {
            break;
        }
        let l = u64::from(sge.length);
        if skip >= l {
            skip -= l;
            continue;
        }
        let n = (l - skip).min(want as u64) as usize;
        let Some(piece) = dst.get_mut(at..at + n) else {
            break;
        };
        match sge.offset.checked_add(skip) {
            Some(off) if mem.check(session, sge.stag, off, n as u64, Access(0)).is_ok() => {
                mem.read(sge.stag, off, piece)
            }
            _ => {
                piece.fill(0);
                ok = false;
            }
        }
        at += n;
        skip = 0;
    }
    ok
}

/// Places `data` at message position `pos` across the scatter list `sgl` (LOCAL_WRITE re-checked).
pub(super) fn scatter(mem: &MemoryRegistry, session: SessionId, sgl: &[Sge], pos: u64, data: &[u8]) -> bool {
    let mut skip = pos;
    let mut at = 0usize;
    for sge in sgl {
        let want = data.len().saturating_sub(at);
        if want == 0 {
            break;
        }
        let l = u64::from(sge.length);
        if skip >= l {
            skip -= l;
            continue;
        }
        let n = (l - skip).min(want as u64) as usize;
        let Some(piece) = data.get(at..at + n) else {
            return false;
        };
        let Some(off) = sge.offset.checked_add(skip) else {
            return false;
        };
        if mem
            .check(session, sge.stag, off, n as u64, Access::LOCAL_WRITE)
            .is_err()
        {
            return false;
        }
        mem.write(sge.stag, off, piece);
        at += n;
        skip = 0;
    }
    at == data.len()
}

/// Every nonzero SGE passes `check` with `need` (siw `siw_check_sgl_tx` skips zero-length SGEs).
pub(super) fn check_sgl(
    mem: &MemoryRegistry,
    session: SessionId,
    sgl: &[Sge],
    need: Access,
) -> Result<(), AccessError> {
    sgl.iter()
        .filter(|s| s.length > 0)
        .try_for_each(|s| mem.check(session, s.stag, s.offset, u64::from(s.length), need))
}
