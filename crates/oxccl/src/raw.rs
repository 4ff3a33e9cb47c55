//! The raw entry points on caller memory and streams; the user-facing
//! account is on [`RawColl`] (this module is private).

use std::ffi::c_void;

use oxccl_core::float8::{F8E4M3, F8E5M2};
use oxccl_core::half::{bf16, f16};
use oxccl_core::plan::BufRole;
use oxccl_core::{CollKind, Collective, DataType, RedOp};

use crate::backend::{RawBuf, RawStream};
use crate::buffer::{Arg, In, Out, Space};
use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::group::Group;

/// Runs `$body` with `$T` bound to the element type of `$dtype`.
macro_rules! with_element {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            DataType::I8 => {
                type $T = i8;
                $body
            }
            DataType::U8 => {
                type $T = u8;
                $body
            }
            DataType::I32 => {
                type $T = i32;
                $body
            }
            DataType::U32 => {
                type $T = u32;
                $body
            }
            DataType::I64 => {
                type $T = i64;
                $body
            }
            DataType::U64 => {
                type $T = u64;
                $body
            }
            DataType::F16 => {
                type $T = f16;
                $body
            }
            DataType::F32 => {
                type $T = f32;
                $body
            }
            DataType::F64 => {
                type $T = f64;
                $body
            }
            DataType::Bf16 => {
                type $T = bf16;
                $body
            }
            DataType::F8E4M3 => {
                type $T = F8E4M3;
                $body
            }
            DataType::F8E5M2 => {
                type $T = F8E5M2;
                $body
            }
        }
    };
}

/// Which argument of a call, for messages.
#[derive(Clone, Copy)]
pub(crate) enum Role {
    Send,
    Recv,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Send => "send buffer",
            Role::Recv => "receive buffer",
        }
    }
}

/// One raw collective: NCCL's arguments as a value (what
/// [`Communicator::collective_raw`] and [`Group::collective_raw`] take).
///
/// The raw entry points: collectives and Send/Recv on memory the caller
/// allocated, enqueued on the caller's stream, with the data type chosen
/// at run time (what a C ABI or a framework binding calls).
///
/// Each raw call is the typed call on an external argument: the same
/// validation, call check, selection and plans. What differs:
///
/// - the memory is the caller's: device pointers on CUDA (`cuMemAlloc`,
///   stream-ordered pool memory from `cuMemAllocAsync`, VMM memory from
///   `cuMemCreate` mapped for the device), host pointers on the host
///   backend. Unregistered memory runs FIFO plans, in which only the
///   rank's own kernel touches its buffers; memory inside a range the rank
///   registered ([`Communicator::register`]) may also run the direct
///   (zero-copy) plans, in which peers load and store it. Every rank
///   decides alike (the call check agrees on it; see the docs of
///   [`Communicator::register`]);
/// - the call is ordered on the caller's stream `stream` (CUDA: the
///   rank's launch runs after `stream`'s earlier work and `stream`'s later
///   work runs after it, through events, with no host wait; the host
///   backend ignores the stream and completes the call before returning).
///
/// The count is NCCL's: per rank for AllGather's send, ReduceScatter's
/// receive, AllToAll's per-peer block, Gather's send and Scatter's
/// receive (see [`oxccl_core::Collective`]).
#[derive(Clone, Copy, Debug)]
pub struct RawColl {
    /// Which collective: NCCL's `ncclAllReduce`, `ncclBroadcast`, ...
    pub kind: CollKind,
    /// The input; may be null where this rank's part ignores it (a
    /// non-root's send buffer of Broadcast or Scatter).
    pub send: *const c_void,
    /// The output; may be null where this rank's part ignores it (a
    /// non-root's receive buffer of Reduce or Gather).
    pub recv: *mut c_void,
    /// NCCL's count: per rank where NCCL's is (see the module docs).
    pub count: usize,
    pub dtype: DataType,
    /// Ignored by non-reductions.
    pub op: RedOp,
    /// Ignored by rootless collectives.
    pub root: u32,
}

impl Communicator {
    /// `len` elements of `dtype` at `ptr` as an argument: external memory,
    /// registered where a registration of this rank covers it. A null
    /// pointer is an empty argument (a buffer the rank's part ignores is
    /// then bound to the communicator's own sink; one it uses is refused
    /// by validation as too short).
    pub(crate) fn raw_arg(&self, role: Role, ptr: u64, len: usize, dtype: DataType) -> Result<Arg> {
        let es = dtype.size();
        if ptr == 0 {
            return Ok(Arg {
                space: Space::External { registered: false },
                raw: RawBuf::NULL,
                len: 0,
            });
        }
        if !ptr.is_multiple_of(es as u64) {
            return Err(Error::InvalidUsage(format!(
                "{} {ptr:#x} is not aligned to its {es}-byte {dtype} elements",
                role.name()
            )));
        }
        let bytes = len.checked_mul(es).ok_or_else(|| {
            Error::InvalidUsage(format!(
                "{} of {len} {dtype} elements overflows",
                role.name()
            ))
        })?;
        let raw = RawBuf { addr: ptr, bytes };
        // Shared unasked where the backend can (CUDA ranks as processes),
        // only under the call check, which orders the sharing before every
        // peer's launch and makes all ranks agree on the plan.
        let registered = self.registered(raw)
            || (self.checking() && self.clique().backend.share_external(self.rank(), raw));
        Ok(Arg {
            space: Space::External { registered },
            raw,
            len,
        })
    }

    /// Runs `f` ordered on the caller's `stream`: the rank's work after the
    /// stream's earlier work, the stream's later work after the rank's.
    ///
    /// # Safety
    /// `stream` must be a valid handle for this backend (see [`RawStream`]).
    pub(crate) unsafe fn on_stream(
        &self,
        stream: RawStream,
        f: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        self.check_usable()?;
        let backend = &self.clique().backend;
        // SAFETY: caller's contract.
        unsafe { backend.follow_stream(self.rank(), stream)? };
        let r = f();
        // Joined back even when the call failed, so a capture of `stream`
        // never ends with the rank's stream left forked.
        // SAFETY: caller's contract.
        let joined = unsafe { backend.release_stream(self.rank(), stream) };
        r.and(joined)
    }

    /// Runs `f` ordered on every stream of `streams` (see
    /// [`Communicator::on_stream`]): after the work each holds, before
    /// the work each is given later. On the host backend streams are
    /// ignored and `f` just runs.
    ///
    /// # Safety
    /// As [`Communicator::on_stream`], for each stream.
    pub(crate) unsafe fn on_streams(
        &self,
        streams: &[RawStream],
        f: Box<dyn FnOnce() -> Result<()> + '_>,
    ) -> Result<()> {
        match streams.split_first() {
            None => f(),
            // SAFETY: caller's contract, for `first` as for the rest.
            Some((first, rest)) => unsafe { self.on_stream(*first, || self.on_streams(rest, f)) },
        }
    }

    /// Any collective on memory the caller allocated, enqueued on the
    /// caller's stream: NCCL's `ncclAllReduce`, `ncclBroadcast`, ... with
    /// `call.kind` naming which (see [`RawColl`]). Returns once the call
    /// is enqueued (CUDA) or done (host). A count of 0 does nothing.
    ///
    /// In place as in NCCL: `send == recv` (AllReduce, Broadcast, Reduce,
    /// AllToAll), `send` at this rank's block of `recv` (AllGather,
    /// Gather), `recv` at this rank's block of `send` (ReduceScatter,
    /// Scatter). A buffer this rank's part ignores (a non-root's receive
    /// buffer of Reduce or Gather, send buffer of Broadcast or Scatter)
    /// may be null.
    ///
    /// # Safety
    /// - On CUDA, `send` and `recv` are device addresses on this rank's
    ///   device that its kernels may read (`send`) and write (`recv`):
    ///   `cuMemAlloc`, `cuMemAllocAsync` or mapped VMM memory of the device,
    ///   or memory of `comm.alloc`. On the host backend they are host
    ///   pointers of this process.
    /// - `send` holds the collective's input length (`count`, or
    ///   `nranks × count` for ReduceScatter, AllToAll and Scatter) and
    ///   `recv` its output length (`count`, or `nranks × count` for
    ///   AllGather, AllToAll and Gather) elements of `dtype`, aligned to
    ///   the element size; they overlap only in NCCL's in-place layout.
    /// - The memory stays allocated, and nothing but this call writes
    ///   `recv` or `send`'s elements (nor reads `recv`), until the call
    ///   has completed: on CUDA, until `stream` has passed it (work the
    ///   caller enqueues on `stream` afterwards, and a stream-ordered
    ///   free there, are ordered after it; anything else must wait for an
    ///   event recorded on `stream` after the call).
    /// - `stream` is, on CUDA, a live stream of the primary context of
    ///   this rank's device (the runtime API's and cudarc's), or 0 for
    ///   the legacy default stream. On the host backend it is ignored.
    /// - Registered memory (see [`Communicator::register`]) may be read
    ///   and written by every rank's kernel during the call.
    /// - With [`RedOp::PreMulSumDevice`] (CUDA, where
    ///   [`Communicator::reads_device_scalars`]), the address holds one
    ///   element of `dtype` in memory this rank's kernel may read, written
    ///   in `stream` order before the call and kept allocated until the
    ///   call has completed.
    pub unsafe fn collective_raw(&self, call: RawColl, stream: RawStream) -> Result<()> {
        let (send, recv) = self.raw_pair(&call).map_err(|e| self.refuse_call(e))?;
        // SAFETY: caller's contract.
        unsafe {
            self.call_on_stream(stream, call.count, || {
                with_element!(call.dtype, T => self.collective::<T>(
                    call.kind,
                    In::from_arg(send),
                    Out::from_arg(recv),
                    call.op,
                    call.root,
                ))
            })
        }
    }

    /// Runs `call`, one collective of `count` elements whose arguments
    /// passed their checks, ordered on the caller's `stream`. When joining
    /// the stream fails before the call was published, the peers are told
    /// in its place, as of a refusal.
    ///
    /// # Safety
    /// As [`Communicator::on_stream`].
    pub(crate) unsafe fn call_on_stream(
        &self,
        stream: RawStream,
        count: usize,
        call: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let reached = std::cell::Cell::new(false);
        // SAFETY: caller's contract.
        let r = unsafe {
            self.on_stream(stream, || {
                reached.set(true);
                call()
            })
        };
        match r {
            Err(e) if !reached.get() && count > 0 && crate::comm::own_fault(&e) => {
                self.post_refusal(crate::check::refusal::code(&e));
                Err(e)
            }
            r => r,
        }
    }

    /// The two arguments of a raw collective, sized from NCCL's count.
    fn raw_pair(&self, call: &RawColl) -> Result<(Arg, Arg)> {
        let RawColl {
            kind,
            count,
            dtype,
            root,
            ..
        } = *call;
        let (send, recv) = (call.send as u64, call.recv as u64);
        if kind == CollKind::SendRecv {
            return Err(Error::InvalidUsage(
                "Send/Recv go through send_raw() and recv_raw()".into(),
            ));
        }
        let n = self.nranks();
        // Lengths are at most `count × n`: refuse what would overflow.
        count.checked_mul(n as usize).ok_or_else(|| {
            Error::InvalidUsage(format!("{kind} of {count} elements × {n} ranks overflows"))
        })?;
        let coll = Collective::new(kind, count, root);
        let ignored = crate::validate::ignored(kind, root, self.rank());
        for (role, ptr, plan_role) in [
            (Role::Send, send, BufRole::Input),
            (Role::Recv, recv, BufRole::Output),
        ] {
            if ptr == 0 && count > 0 && ignored != Some(plan_role) {
                return Err(null_buffer(role, count));
            }
        }
        Ok((
            self.raw_arg(Role::Send, send, coll.input_len(n), dtype)?,
            self.raw_arg(Role::Recv, recv, coll.output_len(n), dtype)?,
        ))
    }
}

impl<'a> Group<'a> {
    /// Adds a raw collective (see [`Communicator::collective_raw`]); the
    /// group's launch on `comm` is ordered on `stream`. A communicator's
    /// raw operations in a group may name different streams, as NCCL's:
    /// its launches then wait for each stream's earlier work, and each
    /// stream's later work waits for them.
    ///
    /// # Safety
    /// As [`Communicator::collective_raw`], until `stream` has passed the
    /// group's end.
    pub unsafe fn collective_raw(
        &mut self,
        comm: &'a Communicator,
        call: RawColl,
        stream: RawStream,
    ) -> Result<()> {
        let pair = comm.raw_pair(&call);
        let (send, recv) = self.note(comm, pair)?;
        let (kind, op, root) = (call.kind, call.op, call.root);
        with_element!(call.dtype, T => self.collective::<T>(
            comm, kind, In::from_arg(send), Out::from_arg(recv), op, root
        ))?;
        self.set_stream(comm, stream);
        Ok(())
    }

    /// A raw send (`Role::Send`) or receive of `count` elements at `buf`.
    #[allow(clippy::too_many_arguments)]
    fn p2p_raw(
        &mut self,
        comm: &'a Communicator,
        role: Role,
        buf: u64,
        count: usize,
        dtype: DataType,
        peer: u32,
        stream: RawStream,
    ) -> Result<()> {
        let arg = comm.raw_arg(role, buf, count, dtype).and_then(|arg| {
            if arg.len == count {
                Ok(arg)
            } else {
                Err(null_buffer(role, count))
            }
        });
        let arg = self.note(comm, arg)?;
        with_element!(dtype, T => match role {
            Role::Send => self.send::<T>(comm, In::from_arg(arg), peer),
            Role::Recv => self.recv::<T>(comm, Out::from_arg(arg), peer),
        })?;
        self.set_stream(comm, stream);
        Ok(())
    }
}

fn null_buffer(role: Role, count: usize) -> Error {
    Error::InvalidUsage(format!(
        "{} is null but {count} elements were to go through it",
        role.name()
    ))
}

/// Send and Recv on raw pointers, written once for both receivers: the
/// communicator's own call (a group of one) and the group's.
macro_rules! raw_p2p {
    ($(
        $name:ident($ptr:ty, $role:expr)
        communicator { $(#[$cdoc:meta])* }
        group { $(#[$gdoc:meta])* }
    )*) => {
        impl Communicator {$(
            $(#[$cdoc])*
            pub unsafe fn $name(&self, buf: $ptr, count: usize, dtype: DataType, peer: u32, stream: RawStream) -> Result<()> {
                // SAFETY: caller's contract.
                unsafe { crate::group::group(|g| g.$name(self, buf, count, dtype, peer, stream)) }
            }
        )*}

        impl<'a> Group<'a> {$(
            $(#[$gdoc])*
            pub unsafe fn $name(&mut self, comm: &'a Communicator, buf: $ptr, count: usize, dtype: DataType, peer: u32, stream: RawStream) -> Result<()> {
                self.p2p_raw(comm, $role, buf as u64, count, dtype, peer, stream)
            }
        )*}
    };
}

raw_p2p! {
    send_raw(*const c_void, Role::Send)
    communicator {
        /// NCCL's `ncclSend`: `count` elements of `dtype` at `buf` to `peer`,
        /// enqueued on the caller's stream (outside a group, a group of one).
        ///
        /// # Safety
        /// As [`Communicator::collective_raw`], for `buf` holding `count`
        /// elements that only this call reads until `stream` has passed it.
    }
    group {
        /// Adds a raw send (see [`Communicator::send_raw`]).
        ///
        /// # Safety
        /// As [`Communicator::send_raw`], until `stream` has passed the
        /// group's end.
    }
    recv_raw(*mut c_void, Role::Recv)
    communicator {
        /// NCCL's `ncclRecv`: `count` elements of `dtype` into `buf` from
        /// `peer`, enqueued on the caller's stream.
        ///
        /// # Safety
        /// As [`Communicator::send_raw`], for a `buf` only this call writes.
    }
    group {
        /// Adds a raw receive (see [`Communicator::recv_raw`]).
        ///
        /// # Safety
        /// As [`Communicator::recv_raw`], until `stream` has passed the
        /// group's end.
    }
}
