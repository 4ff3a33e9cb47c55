//! Argument validation, done once here for every backend: lengths, root,
//! peer, reduction op, buffer ownership and NCCL's in-place rules. Nothing
//! is executed (so nothing is written) unless all of it passes.

use oxccl_core::plan::BufRole;
use oxccl_core::{CollKind, Collective, DataType, RedOp};

use crate::backend::{BackendKind, RawBuf};
use crate::buffer::{Arg, Space};
use crate::error::{Error, Result};

/// Which communicator an argument must belong to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Owner {
    pub clique: u64,
    pub rank: u32,
    pub nranks: u32,
    pub backend: BackendKind,
}

/// A collective call that passed validation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Checked {
    pub coll: Collective,
    pub in_place: bool,
    pub send: RawBuf,
    pub recv: RawBuf,
    /// Whether both buffers are backend memory (so registered, where the
    /// backend registers its allocations) or registered external memory.
    pub backend_memory: bool,
    /// A buffer this rank's part ignores (as NCCL ignores it) that the
    /// caller passed too short or not as this rank's memory: the plan's
    /// role and length in elements, to be bound to the communicator's own
    /// sink instead (`comm.rs`), so nothing of the caller's is touched.
    pub sink: Option<(BufRole, usize)>,
}

/// Which buffer a non-root rank's part ignores: Broadcast and Scatter
/// read only the root's send buffer, Reduce and Gather write only the
/// root's receive buffer.
pub(crate) fn ignored(kind: CollKind, root: u32, rank: u32) -> Option<BufRole> {
    if rank == root {
        return None;
    }
    match kind {
        CollKind::Broadcast | CollKind::Scatter => Some(BufRole::Input),
        CollKind::Reduce | CollKind::Gather => Some(BufRole::Output),
        _ => None,
    }
}

/// Checks that `arg` may be used by `owner`.
pub(crate) fn check_space(what: &'static str, arg: &Arg, owner: &Owner) -> Result<()> {
    match arg.space {
        Space::Host if owner.backend != BackendKind::Host => Err(Error::ForeignBuffer {
            what,
            detail: format!(
                "plain Rust slices can only be used on the host backend; this communicator runs on {}: allocate with comm.alloc()",
                owner.backend
            ),
        }),
        Space::Host => Ok(()),
        Space::Backend { clique, rank } if clique != owner.clique || rank != owner.rank => {
            Err(Error::ForeignBuffer {
                what,
                detail: format!(
                    "the buffer belongs to rank {rank} of communicator set #{clique}, but the call is on rank {} of set #{}: allocate it with this communicator's alloc()",
                    owner.rank, owner.clique
                ),
            })
        }
        Space::Backend { .. } => Ok(()),
        // The raw entry point's caller vouched for it (`unsafe`).
        Space::External { .. } => Ok(()),
    }
}

/// Whether `op` is defined on `dtype` (the rule is the core's
/// [`RedOp::undefined_reason`]).
pub(crate) fn check_op(op: RedOp, dtype: DataType) -> Result<()> {
    match op.undefined_reason(dtype) {
        None => Ok(()),
        Some(reason) => Err(Error::OpNotDefined {
            op: match op {
                RedOp::PreMulSum(s) => format!("premulsum({s})"),
                RedOp::PreMulSumDevice(a) => format!("premulsum(scalar at {a:#x})"),
                other => other.to_string(),
            },
            dtype,
            reason,
        }),
    }
}

/// Validates a collective call and works out its count and whether it is
/// in place.
pub(crate) fn collective(
    kind: CollKind,
    send: &Arg,
    recv: &Arg,
    root: u32,
    op: RedOp,
    dtype: DataType,
    owner: &Owner,
) -> Result<Checked> {
    let n = owner.nranks;
    if kind.has_root() && root >= n {
        return Err(Error::RootOutOfRange { root, nranks: n });
    }
    if kind.is_reduction() {
        check_op(op, dtype)?;
    }
    let skip = ignored(kind, root, owner.rank);
    if skip != Some(BufRole::Input) {
        check_space("send buffer", send, owner)?;
    }
    if skip != Some(BufRole::Output) {
        check_space("receive buffer", recv, owner)?;
    }
    let nu = n as usize;
    // The count comes from a buffer this rank uses.
    let count = match kind {
        CollKind::ReduceScatter | CollKind::Scatter | CollKind::Broadcast => recv.len,
        CollKind::AllToAll => {
            if !send.len.is_multiple_of(nu) {
                return Err(Error::NotMultiple {
                    what: "send buffer",
                    len: send.len,
                    nranks: n,
                });
            }
            send.len / nu
        }
        _ => send.len,
    };
    let coll = Collective::new(kind, count, if kind.has_root() { root } else { 0 });
    let (want_in, want_out) = (coll.input_len(n), coll.output_len(n));
    let usable = |a: &Arg, want: usize| a.len == want && check_space("", a, owner).is_ok();
    let sink = match skip {
        Some(BufRole::Input) if !usable(send, want_in) => Some((BufRole::Input, want_in)),
        Some(BufRole::Output) if !usable(recv, want_out) => Some((BufRole::Output, want_out)),
        _ => None,
    };
    if send.len != want_in && skip != Some(BufRole::Input) {
        return Err(Error::LengthMismatch {
            what: "send buffer",
            expected: want_in,
            got: send.len,
        });
    }
    if recv.len != want_out && skip != Some(BufRole::Output) {
        return Err(Error::LengthMismatch {
            what: "receive buffer",
            expected: want_out,
            got: recv.len,
        });
    }
    let in_place = sink.is_none() && in_place(&coll, send, recv, dtype.size(), owner.rank)?;
    // A sunk buffer is the backend's own memory.
    let backend = |a: &Arg, role| {
        matches!(
            a.space,
            Space::Backend { .. } | Space::External { registered: true }
        ) || sink.is_some_and(|(r, _)| r == role)
    };
    Ok(Checked {
        coll,
        in_place,
        send: send.raw,
        recv: recv.raw,
        backend_memory: backend(send, BufRole::Input) && backend(recv, BufRole::Output),
        sink,
    })
}

/// Decides whether overlapping buffers are NCCL's in-place layout:
/// AllGather/Gather: the send buffer is the rank's own block of the
/// receive buffer; ReduceScatter/Scatter: the receive buffer is the rank's
/// own block of the send buffer; every other collective: the same start.
/// Disjoint buffers are out of place; any other overlap is an error.
fn in_place(coll: &Collective, send: &Arg, recv: &Arg, es: usize, rank: u32) -> Result<bool> {
    let (s, r) = (send.raw, recv.raw);
    let disjoint = send.space != recv.space
        || s.bytes == 0
        || r.bytes == 0
        || s.end() <= r.addr
        || r.end() <= s.addr;
    if disjoint {
        return Ok(false);
    }
    let (in_off, out_off) = coll.in_place_offsets(rank);
    let (want_send, want) = match coll.kind {
        CollKind::AllGather | CollKind::Gather => (
            r.addr + (in_off * es) as u64,
            "the send buffer must be this rank's block of the receive buffer",
        ),
        CollKind::ReduceScatter | CollKind::Scatter => (
            s.addr,
            "the receive buffer must be this rank's block of the send buffer",
        ),
        _ => (
            r.addr,
            "send and receive buffers must start at the same address",
        ),
    };
    let want_recv = match coll.kind {
        CollKind::ReduceScatter | CollKind::Scatter => s.addr + (out_off * es) as u64,
        _ => r.addr,
    };
    if s.addr == want_send && r.addr == want_recv {
        return Ok(true);
    }
    let rel = i128::from(s.addr) - i128::from(r.addr);
    let expected = i128::from(want_send) - i128::from(want_recv);
    Err(Error::InvalidInPlace {
        coll: coll.kind,
        detail: format!(
            "send starts {rel} bytes from receive; {want}, i.e. start {expected} bytes from it (rank {rank}, {} elements per block)",
            coll.count
        ),
    })
}

/// Validates one Send or Recv.
pub(crate) fn p2p(what: &'static str, arg: &Arg, peer: u32, owner: &Owner) -> Result<()> {
    if peer >= owner.nranks {
        return Err(Error::PeerOutOfRange {
            peer,
            nranks: owner.nranks,
        });
    }
    check_space(what, arg, owner)
}
