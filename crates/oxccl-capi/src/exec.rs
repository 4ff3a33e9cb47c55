//! One C call as data ([`Call`]), its checks, and how it runs on the
//! communicator's backend.
//!
//! Every pointer the caller passes is checked here before anything is
//! built from it: null, misaligned for the type, or an address range that
//! wraps is `ncclInvalidArgument`; so is a count whose byte size
//! overflows. Buffers a rank does not use (a non-root's Broadcast source,
//! Reduce/Gather destination, Scatter source) are not checked, as NCCL.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use oxccl::{CollKind, DataType, Group, RawColl, RawStream, RedOp};

use crate::abi::CudaStream;
use crate::error::{CError, CResult};
use crate::handle::CComm;

/// What a call does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum What {
    Coll(CollKind),
    Send,
    Recv,
}

/// One checked collective or Send/Recv.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    pub what: What,
    pub send: usize,
    pub recv: usize,
    pub count: usize,
    pub dtype: DataType,
    pub op: RedOp,
    /// Root of rooted collectives, peer of Send/Recv.
    pub root: u32,
    /// The caller's `cudaStream_t` (ignored on the host backend).
    pub stream: usize,
}

impl Call {
    /// This call as the raw collective `kind`.
    fn coll(&self, kind: CollKind) -> RawColl {
        RawColl {
            kind,
            send: self.send as *const c_void,
            recv: self.recv as *mut c_void,
            count: self.count,
            dtype: self.dtype,
            op: self.op,
            root: self.root,
        }
    }
}

/// The data type behind an `ncclDataType_t` value.
pub fn dtype(v: c_int) -> CResult<DataType> {
    usize::try_from(v)
        .ok()
        .and_then(|i| DataType::ALL.get(i).copied())
        .ok_or_else(|| CError::arg(format!("datatype {v} is not an ncclDataType_t (0..=11)")))
}

/// The call's name for tools (NVTX, profiler plugins).
pub fn func(w: What) -> oxccl::observe::Func {
    match w {
        What::Coll(k) => oxccl::observe::Func::Coll(k),
        What::Send => oxccl::observe::Func::Send,
        What::Recv => oxccl::observe::Func::Recv,
    }
}

/// A checked call's arguments as tools see them.
pub fn args(c: &CComm, call: &Call) -> oxccl::observe::Args {
    let base = c.ready().map(|c| c.tool_args()).unwrap_or_default();
    let (op, root, peer) = match call.what {
        What::Coll(k) => (
            k.is_reduction().then_some(call.op),
            k.has_root().then_some(call.root),
            None,
        ),
        What::Send | What::Recv => (None, None, Some(call.root)),
    };
    oxccl::observe::Args {
        count: Some(call.count),
        dtype: Some(call.dtype),
        op,
        root,
        peer,
        ..base
    }
}

/// The raw arguments of a C call, before checks.
#[derive(Clone, Copy, Debug)]
pub struct Raw {
    pub what: What,
    pub send: *const std::ffi::c_void,
    pub recv: *mut std::ffi::c_void,
    pub count: usize,
    pub dtype: c_int,
    pub op: c_int,
    pub root: c_int,
    pub stream: CudaStream,
}

/// Checks a call against its communicator.
pub fn check(c: &CComm, raw: Raw) -> CResult<Call> {
    c.callable()?;
    let dt = dtype(raw.dtype)?;
    let n = c.nranks as usize;
    let me = c.rank;
    let root = |what: &str| {
        u32::try_from(raw.root)
            .ok()
            .filter(|&r| r < c.nranks)
            .ok_or_else(|| {
                CError::arg(format!(
                    "{what} {} is out of range: the communicator has ranks 0..{}",
                    raw.root, c.nranks
                ))
            })
    };
    let (kind_root, send_len, recv_len) = match raw.what {
        What::Send | What::Recv => {
            let peer = root("peer")?;
            let (s, r) = if raw.what == What::Send {
                (raw.count, 0)
            } else {
                (0, raw.count)
            };
            (peer, s, r)
        }
        What::Coll(k) => {
            let per = raw.count;
            let all = per
                .checked_mul(n)
                .ok_or_else(|| CError::arg(format!("count {per} times {n} ranks overflows")))?;
            let rooted = matches!(
                k,
                CollKind::Broadcast | CollKind::Reduce | CollKind::Gather | CollKind::Scatter
            );
            let r = if rooted { root("root")? } else { 0 };
            let at_root = |len: usize| if me == r { len } else { 0 };
            let (s, v) = match k {
                CollKind::AllReduce => (per, per),
                CollKind::Broadcast => (at_root(per), per),
                CollKind::Reduce => (per, at_root(per)),
                CollKind::AllGather => (per, all),
                CollKind::ReduceScatter => (all, per),
                CollKind::AllToAll => (all, all),
                CollKind::Gather => (per, at_root(all)),
                CollKind::Scatter => (at_root(all), per),
                CollKind::SendRecv => unreachable!("Send/Recv are not collectives here"),
            };
            (r, s, v)
        }
    };
    let op = match raw.what {
        What::Coll(k) if k.is_reduction() => c.op(raw.op, dt, raw.stream as usize)?,
        _ => RedOp::Sum,
    };
    check_ptr("sendbuff", raw.send as usize, send_len, dt)?;
    check_ptr("recvbuff", raw.recv as usize, recv_len, dt)?;
    Ok(Call {
        what: raw.what,
        send: raw.send as usize,
        recv: raw.recv as usize,
        count: raw.count,
        dtype: dt,
        op,
        root: kind_root,
        stream: raw.stream as usize,
    })
}

/// No user address of a 64-bit Linux process reaches this (57-bit virtual
/// addresses with 5-level paging): a buffer ending beyond it has a
/// nonsense count.
const ADDR_LIMIT: usize = 1 << 57;

/// A buffer of `len` elements at `addr`: non-null, aligned, not wrapping.
fn check_ptr(what: &str, addr: usize, len: usize, dt: DataType) -> CResult<()> {
    if len == 0 {
        return Ok(());
    }
    let es = dt.size();
    if addr == 0 {
        return Err(CError::arg(format!(
            "{what} is NULL but {len} elements of {dt} are needed"
        )));
    }
    if !addr.is_multiple_of(es) {
        return Err(CError::arg(format!(
            "{what} {addr:#x} is not aligned to {es} bytes for {dt}"
        )));
    }
    len.checked_mul(es)
        .and_then(|b| addr.checked_add(b))
        .filter(|&end| end <= ADDR_LIMIT)
        .ok_or_else(|| {
            CError::arg(format!(
                "{what}: {len} elements of {dt} from {addr:#x} overflow the address space"
            ))
        })?;
    Ok(())
}

/// Runs one call now (outside a group): enqueued on the caller's stream
/// (CUDA) or done before returning (host).
pub fn run(c: &Arc<CComm>, call: &Call) -> CResult<()> {
    let comm = c.get()?;
    let s = RawStream(call.stream as u64);
    let (send, recv) = (call.send as *const c_void, call.recv as *mut c_void);
    // SAFETY: `check` verified the pointers (non-null where used, aligned,
    // not wrapping) and the stream is the caller's; NCCL's contract, which
    // the caller accepted, is the raw entry points' own: device (host,
    // on the host backend) memory of the sizes the call implies, left
    // alone until the stream has passed the call.
    let r = unsafe {
        match call.what {
            What::Coll(k) => comm.collective_raw(call.coll(k), s),
            What::Send => comm.send_raw(send, call.count, call.dtype, call.root, s),
            What::Recv => comm.recv_raw(recv, call.count, call.dtype, call.root, s),
        }
    };
    r.map_err(CError::from)
}

/// One operation waiting for its group's end.
#[derive(Debug)]
pub struct Pending {
    pub comm: Arc<CComm>,
    pub call: Call,
}

impl Pending {
    pub fn new(comm: Arc<CComm>, call: Call) -> Pending {
        Pending { comm, call }
    }
}

/// Runs a group's operations together (one facade group; a group of one
/// collective runs there as the lone call, `Group::end`).
pub fn run_group(ops: &[Pending]) -> CResult<()> {
    let mut g = Group::new();
    for p in ops {
        let comm = p.comm.get()?;
        let c = &p.call;
        let s = RawStream(c.stream as u64);
        let (send, recv) = (c.send as *const c_void, c.recv as *mut c_void);
        // SAFETY: as in `run`, until the stream has passed the group's end.
        let r = unsafe {
            match c.what {
                What::Coll(k) => g.collective_raw(comm, c.coll(k), s),
                What::Send => g.send_raw(comm, send, c.count, c.dtype, c.root, s),
                What::Recv => g.recv_raw(comm, recv, c.count, c.dtype, c.root, s),
            }
        };
        r?;
    }
    g.end().map_err(CError::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtypes_are_read_as_integers() {
        assert_eq!(dtype(0).unwrap(), DataType::I8);
        assert_eq!(dtype(11).unwrap(), DataType::F8E5M2);
        for bad in [-1, 12, c_int::MAX, c_int::MIN] {
            assert_eq!(dtype(bad).unwrap_err().code, crate::abi::INVALID_ARGUMENT);
        }
    }

    #[test]
    fn pointers_are_checked() {
        assert!(check_ptr("b", 0, 0, DataType::F32).is_ok());
        assert!(check_ptr("b", 0, 1, DataType::F32)
            .unwrap_err()
            .msg
            .contains("NULL"));
        assert!(check_ptr("b", 2, 1, DataType::F32)
            .unwrap_err()
            .msg
            .contains("aligned"));
        assert!(check_ptr("b", 2, 1, DataType::U8).is_ok());
        assert!(check_ptr("b", usize::MAX - 7, 4, DataType::F64)
            .unwrap_err()
            .msg
            .contains("overflow"));
    }
}
