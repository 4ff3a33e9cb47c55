//! Growing a communicator (NCCL 2.29): `ncclCommGetUniqueId` makes the id
//! of the grown communicator on one existing rank, and `ncclCommGrow` is
//! called by every existing rank (`comm`, `rank = -1`; the one holding
//! the id passes it, the others NULL) and by every new rank (`comm` NULL,
//! the id, the rank assigned to it). Existing ranks keep their ranks; they
//! learn the id over the parent's bootstrap, then everyone meets at the
//! id's root as in `ncclCommInitRankConfig`.

use std::ffi::{c_int, c_void};

use crate::abi::{NcclCommT, NcclResult, NcclUniqueId};
use crate::error::{guard, CError, CResult};
use crate::handle;

use super::init::{init_rank, init_rank_on, write_new_id};
use super::out;

/// A new id for growing `comm` (its rendezvous root runs in this
/// process, as `ncclGetUniqueId`'s does). Call it on one existing rank and
/// pass the id to that rank's `ncclCommGrow` and to the new ranks.
///
/// # Safety
/// `unique_id` must be null or point to 128 writable bytes.
#[no_mangle]
pub unsafe extern "C" fn ncclCommGetUniqueId(
    comm: NcclCommT,
    unique_id: *mut NcclUniqueId,
) -> NcclResult {
    guard("ncclCommGetUniqueId", || {
        let c = handle::lookup(comm)?;
        c.callable()?;
        // SAFETY: caller's contract.
        unsafe { write_new_id(unique_id) }
    })
}

/// The grown communicator of `nranks` ranks, written through `newcomm`
/// (see the module for who passes what). Blocking, nonblocking and
/// grouped as `ncclCommInitRankConfig`; a NULL `config` is the default
/// configuration. Existing ranks must be ranks of a communicator made by
/// `ncclCommInitRank*` (ranks as threads of `ncclCommInitAll` cannot grow:
/// `ncclInvalidUsage`).
///
/// # Safety
/// `unique_id` null or 128 readable bytes; `newcomm` null or writable;
/// `config` as for `ncclCommInitRankConfig`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommGrow(
    comm: NcclCommT,
    nranks: c_int,
    unique_id: *const NcclUniqueId,
    rank: c_int,
    newcomm: *mut NcclCommT,
    config: *mut c_void,
) -> NcclResult {
    guard("ncclCommGrow", || {
        // SAFETY: the caller's contract for `unique_id`.
        let given = unsafe { read_id(unique_id) }?;
        if comm.is_null() {
            let id = given.ok_or_else(|| {
                CError::arg("a new rank (comm NULL) must pass the id from ncclCommGetUniqueId")
            })?;
            return init_rank(newcomm, nranks, &[id], rank, config as *const u8);
        }
        let c = handle::lookup(comm)?;
        c.callable()?;
        if rank != -1 {
            return Err(CError::arg(format!(
                "rank {rank}: an existing rank passes -1 and keeps its rank ({})",
                c.rank
            )));
        }
        if u32::try_from(nranks).map_or(true, |n| n <= c.nranks) {
            return Err(CError::arg(format!(
                "nRanks {nranks} does not grow a communicator of {} ranks",
                c.nranks
            )));
        }
        out(newcomm, "newcomm")?;
        c.join_init();
        let mine = given.map(|i| i.internal.to_vec()).unwrap_or_default();
        let all = c.get()?.exchange(&mine).map_err(CError::from)?;
        let id = the_id(&all)?;
        // An existing rank stays on its device, wherever its thread is.
        let device = c.get()?.cuda_device();
        init_rank_on(
            newcomm,
            nranks,
            &[id],
            c.rank as c_int,
            config as *const u8,
            device,
        )
    })
}

/// # Safety
/// `p` null or 128 readable bytes.
unsafe fn read_id(p: *const NcclUniqueId) -> CResult<Option<NcclUniqueId>> {
    if p.is_null() {
        return Ok(None);
    }
    if !p.is_aligned() {
        return Err(CError::arg(format!("uniqueId {p:p} is misaligned")));
    }
    // SAFETY: non-null and aligned; the caller's 128 bytes.
    Ok(Some(unsafe { p.read() }))
}

/// The one id the existing ranks' records hold (records are empty, or an
/// id's 128 bytes).
fn the_id(all: &[Vec<u8>]) -> CResult<NcclUniqueId> {
    let holders: Vec<usize> = (0..all.len()).filter(|&r| !all[r].is_empty()).collect();
    match holders.as_slice() {
        [r] => {
            let internal = all[*r].as_slice().try_into().map_err(|_| {
                CError::arg(format!("rank {r} passed a record of {} bytes", all[*r].len()))
            })?;
            Ok(NcclUniqueId { internal })
        }
        [] => Err(CError::arg(
            "no existing rank passed the id: one of them (the one that called ncclCommGetUniqueId) must",
        )),
        many => {
            let first = &all[many[0]];
            if many.iter().all(|&r| &all[r] == first) {
                the_id(&all[many[0]..=many[0]])
            } else {
                Err(CError::arg(format!(
                    "ranks {many:?} passed different ids to ncclCommGrow"
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_one_id_or_the_same_everywhere() {
        let id = vec![7u8; 128];
        assert_eq!(
            the_id(&[vec![], id.clone(), vec![]]).unwrap().internal,
            [7u8; 128]
        );
        assert!(the_id(&[id.clone(), vec![], id.clone()]).is_ok());
        assert!(the_id(&[vec![], vec![]]).is_err());
        assert!(the_id(&[id, vec![1u8; 128]]).is_err());
        assert!(the_id(&[vec![1u8; 5]]).is_err());
    }
}
