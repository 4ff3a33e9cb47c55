//! One C call as data ([`Call`]), its checks, and how it runs on the
//! communicator's backend.
//!
//! Every pointer the caller passes is checked here before anything is
//! built from it: null, misaligned for the type, or an address range that
//! wraps is `ncclInvalidArgument`; so is a count whose byte size
//! overflows. Buffers a rank does not use (a non-root's Broadcast source,
//! Reduce/Gather destination, Scatter source) are not checked, as NCCL.

use std::ffi::c_int;
use std::sync::Arc;

use oxccl::{CollKind, Communicator, DataType, Element, Group, In, Out, RedOp};

use crate::abi::CudaStream;
use crate::error::{CError, CResult};
use crate::handle::{CComm, Space};

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
    /// Elements of the send and receive buffers on this rank (0: unused).
    pub send_len: usize,
    pub recv_len: usize,
    pub count: usize,
    pub dtype: DataType,
    pub op: RedOp,
    /// Root of rooted collectives, peer of Send/Recv.
    pub root: u32,
    /// The caller's `cudaStream_t` (ignored on the host backend).
    #[allow(dead_code)] // read by the device path, once the facade takes streams (issue 10)
    pub stream: usize,
}

/// The data type behind an `ncclDataType_t` value.
pub fn dtype(v: c_int) -> CResult<DataType> {
    usize::try_from(v)
        .ok()
        .and_then(|i| DataType::ALL.get(i).copied())
        .ok_or_else(|| CError::arg(format!("datatype {v} is not an ncclDataType_t (0..=11)")))
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
        What::Coll(k) if k.is_reduction() => c.op(raw.op, dt)?,
        _ => RedOp::Sum,
    };
    check_ptr("sendbuff", raw.send as usize, send_len, dt)?;
    check_ptr("recvbuff", raw.recv as usize, recv_len, dt)?;
    Ok(Call {
        what: raw.what,
        send: raw.send as usize,
        recv: raw.recv as usize,
        send_len,
        recv_len,
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

/// Runs one call now (outside a group).
pub fn run(c: &Arc<CComm>, call: &Call) -> CResult<()> {
    let comm = c.get()?;
    if call.count == 0 {
        return Ok(());
    }
    match c.space()? {
        Space::Host => {
            let mut temp = Vec::new();
            prepare_temp(call, &mut temp);
            // SAFETY: `check` verified the pointers; the caller (NCCL's
            // contract) keeps them valid for `len` elements until the call
            // completes, which on the host backend is before it returns.
            unsafe { typed!(call.dtype, run_host(comm, call, &temp)) }
        }
        Space::Device => Err(device_unbuilt()),
    }
}

/// One operation waiting for its group's end.
#[derive(Debug)]
pub struct Pending {
    pub comm: Arc<CComm>,
    pub call: Call,
    temp: Vec<u64>,
}

impl Pending {
    pub fn new(comm: Arc<CComm>, call: Call) -> Pending {
        Pending {
            comm,
            call,
            temp: Vec::new(),
        }
    }
}

/// Runs a group's operations together (one facade group).
pub fn run_group(ops: &mut [Pending]) -> CResult<()> {
    for p in ops.iter_mut() {
        p.comm.get()?;
        if p.comm.space()? == Space::Device {
            return Err(device_unbuilt());
        }
        prepare_temp(&p.call, &mut p.temp);
    }
    let mut g = Group::new();
    for p in ops.iter() {
        if p.call.count == 0 {
            continue;
        }
        let comm = p.comm.get()?;
        // SAFETY: as in `run`; the group ends below, before the borrows end.
        unsafe { typed!(p.call.dtype, add_host(&mut g, comm, &p.call, &p.temp)) }?;
    }
    g.end().map_err(CError::from)
}

fn device_unbuilt() -> CError {
    CError::usage(
        "device buffers through the C ABI need the facade's raw entry point (issue 10), not landed in this build; run with OXCCL_BACKEND=host",
    )
}

/// Whether two byte ranges share memory.
fn overlap(a: usize, alen: usize, b: usize, blen: usize) -> bool {
    alen > 0 && blen > 0 && a < b + blen && b < a + alen
}

/// When the send buffer overlaps the receive buffer (NCCL's in-place
/// layouts), a copy of the send data in `temp`, so the Rust slices handed
/// to the facade never alias.
fn prepare_temp(call: &Call, temp: &mut Vec<u64>) {
    let es = call.dtype.size();
    let (sb, rb) = (call.send_len * es, call.recv_len * es);
    temp.clear();
    if overlap(call.send, sb, call.recv, rb) {
        temp.resize(sb.div_ceil(8), 0);
        // SAFETY: `check` verified `sb` bytes at `send`; `temp` holds them.
        unsafe {
            std::ptr::copy_nonoverlapping(call.send as *const u8, temp.as_mut_ptr() as *mut u8, sb)
        };
    }
}

/// The call's send and receive buffers as the facade takes them.
///
/// # Safety
/// The checked pointers must be valid host memory for their lengths for
/// `'a`, and `temp` as `prepare_temp` left it.
unsafe fn host_args<'a, T: Element>(call: &Call, temp: &'a [u64]) -> (In<'a, T>, Out<'a, T>) {
    let send: &'a [T] = if call.send_len == 0 {
        &[]
    } else if !temp.is_empty() {
        // SAFETY: temp holds a copy of the send bytes, 8-byte aligned.
        unsafe { std::slice::from_raw_parts(temp.as_ptr() as *const T, call.send_len) }
    } else {
        // SAFETY: the caller's contract; checked non-null and aligned.
        unsafe { std::slice::from_raw_parts(call.send as *const T, call.send_len) }
    };
    let recv: &'a mut [T] = if call.recv_len == 0 {
        &mut []
    } else {
        // SAFETY: as above; `send` does not alias it (see prepare_temp).
        unsafe { std::slice::from_raw_parts_mut(call.recv as *mut T, call.recv_len) }
    };
    (send.into(), recv.into())
}

/// # Safety
/// See [`host_args`].
unsafe fn run_host<T: Element>(comm: &Communicator, call: &Call, temp: &[u64]) -> CResult<()> {
    // SAFETY: forwarded.
    let (send, recv) = unsafe { host_args::<T>(call, temp) };
    let r = match call.what {
        What::Coll(k) => comm.collective(k, send, recv, call.op, call.root),
        What::Send => comm.send(send, call.root),
        What::Recv => comm.recv(recv, call.root),
    };
    r.map_err(CError::from)
}

/// # Safety
/// See [`host_args`].
unsafe fn add_host<'a, T: Element>(
    g: &mut Group<'a>,
    comm: &'a Communicator,
    call: &Call,
    temp: &'a [u64],
) -> CResult<()> {
    // SAFETY: forwarded.
    let (send, recv) = unsafe { host_args::<T>(call, temp) };
    let r = match call.what {
        What::Coll(k) => g.collective(comm, k, send, recv, call.op, call.root),
        What::Send => g.send(comm, send, call.root),
        What::Recv => g.recv(comm, recv, call.root),
    };
    r.map_err(CError::from)
}

/// A PreMulSum scalar at `addr` (`ncclScalarDevice`), read at call time.
pub fn read_scalar(c: &CComm, addr: usize, dt: DataType) -> CResult<f64> {
    match c.space()? {
        // SAFETY: checked non-null and aligned when the op was made; the
        // caller keeps it valid while the op exists (NCCL's contract).
        Space::Host => Ok(unsafe { typed!(dt, read_host(addr)) }),
        Space::Device => Err(device_unbuilt()),
    }
}

/// # Safety
/// `addr` must hold a readable, aligned `T`.
pub unsafe fn read_host<T: Element>(addr: usize) -> f64 {
    // SAFETY: forwarded.
    unsafe { std::ptr::read(addr as *const T) }.to_f64()
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

    #[test]
    fn overlap_is_exact() {
        assert!(overlap(0, 8, 4, 8));
        assert!(!overlap(0, 8, 8, 8));
        assert!(!overlap(0, 0, 0, 8));
        assert!(overlap(16, 4, 0, 32));
    }
}
