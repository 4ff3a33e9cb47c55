//! Unique ids and the communicator life cycle: init (blocking,
//! nonblocking, grouped, all-in-one-process, scalable), split, shrink,
//! finalize, destroy, abort.

use std::ffi::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use oxccl::{BackendKind, Communicator, UniqueId};

use crate::abi::{self, NcclCommT, NcclResult, NcclUniqueId, IN_PROGRESS, SUCCESS};
use crate::config::{self, CommConfig};
use crate::error::{guard, CError, CResult};
use crate::group;
use crate::handle::{self, CComm};

use super::out;

/// The facade configuration for a C communicator: the environment's
/// (`NCCL_ALGO`, `NCCL_PROTO`, `NCCL_DEBUG`, `OXCCL_*`) with NCCL's
/// defaults (no wait deadline unless `OXCCL_DEADLINE_MS` is set), the backend
/// made definite (pointers are device pointers whenever a GPU is usable,
/// on the calling thread's current device,
/// host pointers only under `OXCCL_BACKEND=host` or without a GPU) and
/// the caller's `maxCTAs` capping the channels.
pub(crate) fn facade_config(cc: &CommConfig) -> CResult<oxccl::Config> {
    let mut cfg = oxccl::Config::from_env_as_nccl()?;
    if cfg.backend == BackendKind::Auto {
        cfg.backend = if oxccl::backend::cuda::available() {
            BackendKind::Cuda
        } else {
            BackendKind::Host
        };
    }
    if let Some(m) = cc.max_ctas {
        cfg.channels = Some(cfg.channels.map_or(m, |c| c.min(m)));
    }
    // As NCCL: a rank runs on the device current in the initialising
    // thread (read here, in the caller's thread, before any init thread).
    if cfg.backend == BackendKind::Cuda && cfg.cuda.device.is_none() {
        cfg.cuda.device = Some(oxccl::backend::cuda::current_device()?);
    }
    Ok(cfg)
}

/// Makes a new id. Starts this process's rendezvous root (as NCCL's
/// does); `NCCL_COMM_ID=host:port` names a fixed root instead.
///
/// # Safety
/// `unique_id` must be null or point to 128 writable bytes.
#[no_mangle]
pub unsafe extern "C" fn ncclGetUniqueId(unique_id: *mut NcclUniqueId) -> NcclResult {
    guard("ncclGetUniqueId", || {
        // SAFETY: caller's contract.
        unsafe { write_new_id(unique_id) }
    })
}

/// Makes a new id (its rendezvous root runs in this process) and writes
/// it through `unique_id`: `ncclGetUniqueId`'s work, and
/// `ncclCommGetUniqueId`'s once its communicator is checked.
///
/// # Safety
/// `unique_id` must be null or point to 128 writable bytes.
pub(super) unsafe fn write_new_id(unique_id: *mut NcclUniqueId) -> CResult<NcclResult> {
    let p = out(unique_id, "uniqueId")?;
    let id = UniqueId::new()?;
    // SAFETY: checked; the caller's 128-byte id.
    unsafe {
        p.write(NcclUniqueId {
            internal: id.to_bytes(),
        })
    };
    Ok(SUCCESS)
}

/// `nranks` and `rank` checked: 1..=`MAX_RANKS` ranks (the bootstrap's
/// limit; `INT_MAX` and every other count outside it is
/// `ncclInvalidArgument` from every init), `rank` one of them.
fn rank_args(nranks: c_int, rank: c_int) -> CResult<(u32, u32)> {
    let n = u32::try_from(nranks)
        .ok()
        .filter(|&n| (1..=oxccl::MAX_RANKS).contains(&n))
        .ok_or_else(|| {
            CError::arg(format!(
                "nranks is {nranks}: a communicator has 1..={} ranks",
                oxccl::MAX_RANKS
            ))
        })?;
    let r = u32::try_from(rank)
        .ok()
        .filter(|&r| r < n)
        .ok_or_else(|| CError::arg(format!("rank {rank} is out of range for nranks {nranks}")))?;
    Ok((n, r))
}

/// Starts rank `rank` of `nranks` (met through `ids`, one per root) and
/// writes its handle through `out`.
/// Blocking outside a group: returns when every rank has joined.
/// Nonblocking (`config.blocking = 0`): the handle is written at once and
/// `ncclInProgress` returned; `ncclCommGetAsyncError` says when it is done.
/// Inside a group: the handle is written at once and the group's end
/// waits for it, so one thread can start several ranks.
pub(super) fn init_rank(
    outp: *mut NcclCommT,
    nranks: c_int,
    ids: &[NcclUniqueId],
    rank: c_int,
    cfg: *const u8,
) -> CResult<NcclResult> {
    init_rank_on(outp, nranks, ids, rank, cfg, None)
}

/// As [`init_rank`], on `device` where given (a grown communicator's
/// existing rank keeps its device) instead of the thread's current one.
pub(super) fn init_rank_on(
    outp: *mut NcclCommT,
    nranks: c_int,
    ids: &[NcclUniqueId],
    rank: c_int,
    cfg: *const u8,
    device: Option<i32>,
) -> CResult<NcclResult> {
    let outp = out(outp, "comm")?;
    let (n, r) = rank_args(nranks, rank)?;
    // SAFETY: NCCL's contract for the config pointer (checked inside).
    let cc = unsafe { config::read(cfg) }?;
    let mut fcfg = facade_config(&cc)?;
    if device.is_some() {
        fcfg.cuda.device = device;
    }
    let ids: Vec<UniqueId> = ids.iter().map(|i| UniqueId::from_raw(i.internal)).collect();
    let c = Arc::new(CComm::new(n, r, cc.is_blocking(), cc.name.clone()));
    let in_group = group::active();
    if c.blocking && !in_group {
        c.finish_init(Ok(Communicator::init_rank_scalable(&ids, n, r, fcfg)?));
        let h = handle::publish(c)?;
        // SAFETY: checked by `out`.
        unsafe { outp.write(h) };
        return Ok(SUCCESS);
    }
    // The handle first: with none left, no init thread is started.
    let h = handle::publish(c.clone())?;
    let worker = c.clone();
    let t = std::thread::Builder::new()
        .name(format!("oxccl-init-r{r}"))
        .spawn(move || {
            let res = catch_unwind(AssertUnwindSafe(|| {
                Communicator::init_rank_scalable(&ids, n, r, fcfg).map_err(CError::from)
            }))
            .unwrap_or_else(|_| {
                Err(CError {
                    code: abi::INTERNAL_ERROR,
                    msg: "init panicked".into(),
                })
            });
            worker.finish_init(res);
        })
        .map_err(|e| {
            let _ = handle::retire(h);
            CError {
                code: abi::SYSTEM_ERROR,
                msg: format!("could not start the init thread: {e}"),
            }
        })?;
    c.set_init_thread(t);
    // SAFETY: checked by `out`.
    unsafe { outp.write(h) };
    if in_group {
        group::with(|g| g.inits.push(c));
        return Ok(SUCCESS);
    }
    Ok(IN_PROGRESS)
}

/// # Safety
/// `comm` must be null or writable; `config` null or an `ncclConfig_t`
/// (any release's layout) of `config->size` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankConfig(
    comm: *mut NcclCommT,
    nranks: c_int,
    comm_id: NcclUniqueId,
    rank: c_int,
    config: *mut c_void,
) -> NcclResult {
    guard("ncclCommInitRankConfig", || {
        init_rank(comm, nranks, &[comm_id], rank, config as *const u8)
    })
}

/// # Safety
/// `comm` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRank(
    comm: *mut NcclCommT,
    nranks: c_int,
    comm_id: NcclUniqueId,
    rank: c_int,
) -> NcclResult {
    guard("ncclCommInitRank", || {
        init_rank(comm, nranks, &[comm_id], rank, std::ptr::null())
    })
}

/// Rank `myrank` of `nranks` from `n_id` ids made per root (every rank
/// passes the same ids; at most one per rank): the rendezvous is spread
/// over the ids' roots, the `b`-th serving the `b`-th block of
/// consecutive ranks, as NCCL assigns them.
///
/// # Safety
/// `newcomm` null or writable; `comm_ids` null or `n_id` ids; `config` as
/// for `ncclCommInitRankConfig`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankScalable(
    newcomm: *mut NcclCommT,
    nranks: c_int,
    myrank: c_int,
    n_id: c_int,
    comm_ids: *mut NcclUniqueId,
    config: *mut c_void,
) -> NcclResult {
    guard("ncclCommInitRankScalable", || {
        let k = usize::try_from(n_id)
            .ok()
            .filter(|&k| k >= 1)
            .ok_or_else(|| CError::arg(format!("nId is {n_id}: at least one id is needed")))?;
        let p = out(comm_ids, "commIds")?;
        if k > rank_args(nranks, 0)?.0 as usize {
            return Err(CError::arg(format!(
                "nId is {n_id}: at most one id per rank ({nranks})"
            )));
        }
        // SAFETY: checked non-null and aligned; the caller's `n_id` ids
        // (at most `nranks`, so the length is sane).
        let ids = unsafe { std::slice::from_raw_parts(p, k) };
        init_rank(newcomm, nranks, ids, myrank, config as *const u8)
    })
}

/// `ndev` ranks in this process, one communicator each (ranks as threads
/// of one clique). `devlist` may be NULL; its entries must be >= 0.
///
/// # Safety
/// `comms` null or `ndev` writable handles; `devlist` null or `ndev` ints.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitAll(
    comms: *mut NcclCommT,
    ndev: c_int,
    devlist: *const c_int,
) -> NcclResult {
    guard("ncclCommInitAll", || {
        let comms = out(comms, "comms")?;
        let (n, _) = rank_args(ndev, 0)?;
        let devices: Option<Vec<i32>> = if devlist.is_null() {
            None
        } else {
            if !devlist.is_aligned() {
                return Err(CError::arg("devlist is misaligned"));
            }
            // SAFETY: the caller's `ndev` ints.
            let d = unsafe { std::slice::from_raw_parts(devlist, n as usize) };
            if let Some(bad) = d.iter().find(|&&x| x < 0) {
                return Err(CError::arg(format!("devlist holds device {bad}")));
            }
            Some(d.to_vec())
        };
        let cfg = facade_config(&CommConfig::default())?;
        // Rank r on devlist[r], as NCCL; without a list, on devices 0..n
        // (round-robin where fewer are visible: ranks may share a GPU).
        let all = match devices {
            Some(d) => oxccl::init_all_on_devices(&d, cfg)?,
            None => oxccl::init_all_with(n, cfg)?,
        };
        let handles: Vec<NcclCommT> = all
            .into_iter()
            .enumerate()
            .map(|(r, comm)| {
                let c = Arc::new(CComm::new(n, r as u32, true, None));
                c.finish_init(Ok(comm));
                handle::publish(c)
            })
            .collect::<CResult<_>>()?;
        // SAFETY: the caller's `ndev` handles (checked non-null, aligned).
        unsafe { std::ptr::copy_nonoverlapping(handles.as_ptr(), comms, handles.len()) };
        Ok(SUCCESS)
    })
}

/// Waits for the communicator's work (blocking and nonblocking alike: it
/// returns `ncclSuccess` when done).
#[no_mangle]
pub extern "C" fn ncclCommFinalize(comm: NcclCommT) -> NcclResult {
    guard("ncclCommFinalize", || {
        let c = handle::lookup(comm)?;
        if c.revoked.load(std::sync::atomic::Ordering::Acquire) {
            return Err(CError::usage(
                "ncclCommFinalize after ncclCommRevoke: destroy or abort the communicator instead",
            ));
        }
        c.join_init();
        c.wait_background();
        c.get()?.synchronize()?;
        Ok(SUCCESS)
    })
}

/// Frees the handle (after its work, as NCCL). Later uses of it are
/// `ncclInvalidArgument`.
#[no_mangle]
pub extern "C" fn ncclCommDestroy(comm: NcclCommT) -> NcclResult {
    guard("ncclCommDestroy", || {
        let c = handle::retire(comm)?;
        c.join_init();
        c.wait_background();
        if let Some(x) = c.ready() {
            // Work already failed is reported by GetAsyncError, not here.
            let _ = x.synchronize();
            x.destroy();
        }
        Ok(SUCCESS)
    })
}

/// Aborts the clique (every rank's pending and later waits fail) and
/// frees the handle.
#[no_mangle]
pub extern "C" fn ncclCommAbort(comm: NcclCommT) -> NcclResult {
    guard("ncclCommAbort", || {
        let c = handle::retire(comm)?;
        handle::abort(&c);
        Ok(SUCCESS)
    })
}

/// Splits by color, ranked by key (ties by rank). `NCCL_SPLIT_NOCOLOR`
/// ranks get NULL. Every rank of `comm` must call it. The child is
/// blocking unless its config says otherwise (or the parent is
/// nonblocking and no config is given).
///
/// # Safety
/// `newcomm` null or writable; `config` as for `ncclCommInitRankConfig`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommSplit(
    comm: NcclCommT,
    color: c_int,
    key: c_int,
    newcomm: *mut NcclCommT,
    config: *mut c_void,
) -> NcclResult {
    guard("ncclCommSplit", || {
        let c = handle::lookup(comm)?;
        let outp = out(newcomm, "newcomm")?;
        let color = match color {
            abi::SPLIT_NOCOLOR => None,
            v if v >= 0 => Some(v as u32),
            v => {
                return Err(CError::arg(format!(
                    "color {v} is negative and not NCCL_SPLIT_NOCOLOR"
                )))
            }
        };
        // SAFETY: NCCL's contract for the config pointer.
        let cc = unsafe { config::read(config as *const u8) }?;
        let parent = c.clone();
        child_into(
            &c,
            move || parent.get()?.split(color, key).map_err(CError::from),
            &cc,
            outp,
            color.is_some(),
        )
    })
}

/// Runs `make` and publishes the child (NULL for none). Inside a group it
/// runs on its own thread and the group's end writes the child, so one
/// thread can split or shrink several communicators of one clique (each
/// rank's call waits for the others'). A nonblocking child (its config's
/// `blocking = 0`, else the parent's) is made in the background
/// ([`super::split_bg`]). `expects_child`: whether this rank gets one (a
/// split's `NCCL_SPLIT_NOCOLOR` rank does not).
fn child_into(
    c: &Arc<CComm>,
    make: impl FnOnce() -> CResult<Option<Communicator>> + Send + 'static,
    cc: &CommConfig,
    outp: *mut NcclCommT,
    expects_child: bool,
) -> CResult<NcclResult> {
    let make: Box<super::split_bg::MakeChild> = Box::new(make);
    if !group::active() && !cc.blocking.unwrap_or(c.blocking) {
        return super::split_bg::start(c, make, cc, outp, expects_child);
    }
    if group::active() {
        let (blocking, cc) = (c.blocking, cc.clone());
        let t = std::thread::Builder::new()
            .name(format!("oxccl-split-r{}", c.rank))
            .spawn(move || publish_child(make, blocking, &cc))
            .map_err(|e| CError {
                code: abi::SYSTEM_ERROR,
                msg: format!("could not start the split thread: {e}"),
            })?;
        group::with(|g| g.splits.push((t, outp as usize)));
        return Ok(SUCCESS);
    }
    let h = publish_child(make, c.blocking, cc)?;
    // SAFETY: checked by the caller through `out`.
    unsafe { outp.write(h as NcclCommT) };
    Ok(SUCCESS)
}

/// Makes the child and publishes it; its handle as an address (0: none).
/// The child is blocking unless its config says otherwise (or the parent,
/// `parent_blocking`, is nonblocking and no config is given).
fn publish_child(
    make: Box<super::split_bg::MakeChild>,
    parent_blocking: bool,
    cc: &CommConfig,
) -> CResult<usize> {
    Ok(match make()? {
        None => 0,
        Some(x) => {
            let blocking = cc.blocking.unwrap_or(parent_blocking);
            let k = Arc::new(CComm::new(x.nranks(), x.rank(), blocking, cc.name.clone()));
            k.finish_init(Ok(x));
            handle::publish(k)? as usize
        }
    })
}

/// Waits for the splits started in a group and writes their children
/// (NULL for a failed one); the first failure is returned.
pub(crate) fn finish_splits(splits: Vec<(group::SplitThread, usize)>) -> CResult<()> {
    let mut first = None;
    for (t, outp) in splits {
        let r = t.join().unwrap_or_else(|_| {
            Err(CError {
                code: abi::INTERNAL_ERROR,
                msg: "split panicked".into(),
            })
        });
        let h = match r {
            Ok(h) => h,
            Err(e) => {
                first.get_or_insert(e);
                0
            }
        };
        // SAFETY: `out` checked the pointer when the split was issued, and
        // NCCL's contract keeps it valid until the group's end.
        unsafe { (outp as *mut NcclCommT).write(h as NcclCommT) };
    }
    first.map_or(Ok(()), Err)
}

/// A communicator without the excluded ranks, made by the remaining
/// ranks alone (each passing the same list): excluded ranks do not call
/// it and may be dead; one that calls it gets NULL at once. With
/// `NCCL_SHRINK_ABORT` the parent's pending work is aborted first (a dead
/// peer's waits fail instead of holding the shrink up); by default it is
/// waited for. Inside a group it runs on its own thread, as a split.
///
/// # Safety
/// `exclude` null or `count` ints; `newcomm` null or writable; `config` as
/// for `ncclCommInitRankConfig`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommShrink(
    comm: NcclCommT,
    exclude: *mut c_int,
    count: c_int,
    newcomm: *mut NcclCommT,
    config: *mut c_void,
    flags: c_int,
) -> NcclResult {
    guard("ncclCommShrink", || {
        let c = handle::lookup(comm)?;
        let outp = out(newcomm, "newcomm")?;
        if !(0..=abi::SHRINK_ABORT).contains(&flags) {
            return Err(CError::arg(format!(
                "shrinkFlags {flags} is not NCCL_SHRINK_DEFAULT or _ABORT"
            )));
        }
        let n = usize::try_from(count)
            .ok()
            .filter(|&k| k < c.nranks as usize)
            .ok_or_else(|| CError::arg(format!("excludeRanksCount {count} is out of range")))?;
        let list: &[c_int] = if n == 0 {
            &[]
        } else {
            let p = out(exclude, "excludeRanksList")?;
            // SAFETY: checked; the caller's `count` ints.
            unsafe { std::slice::from_raw_parts(p, n) }
        };
        let Some(excluded) = list
            .iter()
            .map(|&r| u32::try_from(r).ok().filter(|&r| r < c.nranks))
            .collect::<Option<Vec<u32>>>()
        else {
            return Err(CError::arg(format!(
                "excludeRanksList {list:?} holds a rank outside 0..{}",
                c.nranks
            )));
        };
        // SAFETY: NCCL's contract for the config pointer.
        let cc = unsafe { config::read(config as *const u8) }?;
        if excluded.contains(&c.rank) {
            // SAFETY: checked by `out`.
            unsafe { outp.write(std::ptr::null_mut()) };
            return Ok(SUCCESS);
        }
        c.join_init();
        if let Some(x) = c.ready() {
            if flags == abi::SHRINK_ABORT {
                x.abort();
            } else {
                // Failed work is the parent's async error, not the shrink's.
                let _ = x.synchronize();
            }
        }
        let parent = c.clone();
        child_into(
            &c,
            move || parent.get()?.shrink(&excluded).map_err(CError::from),
            &cc,
            outp,
            true,
        )
    })
}
