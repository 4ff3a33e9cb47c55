//! Safe interop with cudarc (cargo feature `cudarc`): collectives and
//! Send/Recv on cudarc's device memory (`CudaSlice<T>`, `CudaView<T>`,
//! `CudaViewMut<T>`: anything implementing `DevicePtr`/`DevicePtrMut`),
//! enqueued on a cudarc `CudaStream`.
//!
//! These are the raw entry points ([`Communicator::collective_raw`]) with
//! the contract kept by types: the borrows keep the memory alive and
//! unaliased for the call, and cudarc's own event tracking orders
//! everything else. Each buffer is taken through cudarc's
//! `device_ptr(&stream)` / `device_ptr_mut(&stream)`, which make the
//! stream wait for the buffer's earlier writes (and, for an output, reads)
//! on any stream, and whose guards, dropped after the call is enqueued,
//! record the buffer's read or write event on the stream. Since the
//! caller's stream waits for the collective before anything later on it
//! ([`crate::RawStream`] ordering), those events complete only after the
//! collective: cudarc's later uses of the memory, and its frees
//! (`cuMemFreeAsync` after waiting for both events), wait for it.
//!
//! The stream must belong to the primary context of the rank's device
//! (cudarc's `CudaContext::new(ordinal)` is that context); another is
//! refused. The memory must be on that device too: cudarc's pool memory
//! is, when it comes from that context. Unregistered memory runs FIFO
//! plans; a range registered with [`Communicator::register`] (unsafe: it
//! outlives borrows) may run the direct plans.

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
use oxccl_core::{CollKind, Element, RedOp};

use crate::backend::RawStream;
use crate::buffer::{In, Out};
use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::raw::Role;

fn raw_stream(stream: &CudaStream) -> RawStream {
    RawStream::from_ptr(stream.cu_stream().cast())
}

impl Communicator {
    /// Refuses cudarc memory on a backend that does not run on CUDA.
    fn cudarc_backend(&self, what: &'static str) -> Result<()> {
        if self.backend() != crate::BackendKind::Cuda {
            return Err(Error::ForeignBuffer {
                what,
                detail: format!(
                    "cudarc device memory needs the CUDA backend; this communicator runs on {}",
                    self.backend()
                ),
            });
        }
        Ok(())
    }

    /// Any collective (see [`Communicator::collective`] for the lengths)
    /// from `send` into `recv`, both cudarc device memory on this rank's
    /// device, enqueued on `stream`. Returns once enqueued.
    pub fn collective_on<T: Element>(
        &self,
        kind: CollKind,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        op: RedOp,
        root: u32,
        stream: &CudaStream,
    ) -> Result<()> {
        self.cudarc_backend("cudarc buffer")?;
        let (slen, rlen) = (send.len(), recv.len());
        let (sp, _read) = send.device_ptr(stream);
        let (rp, _write) = recv.device_ptr_mut(stream);
        let s = In::from_arg(self.raw_arg(Role::Send, sp, slen, T::DTYPE)?);
        let r = Out::from_arg(self.raw_arg(Role::Recv, rp, rlen, T::DTYPE)?);
        // SAFETY: both are live cudarc allocations of `slen`/`rlen`
        // elements, borrowed (so alive and, for `recv`, unaliased) until
        // the guards drop after the call is enqueued; cudarc's events,
        // recorded by those guards on `stream` after the call, order
        // every later use and free after it (module docs). `stream` is a
        // live cudarc stream (its context is checked by `on_stream`).
        unsafe {
            self.on_stream(raw_stream(stream), || {
                self.collective::<T>(kind, s, r, op, root)
            })
        }
    }

    /// Any collective in place on `buf` (cudarc device memory on this
    /// rank's device) in NCCL's layout: AllGather and Gather take this
    /// rank's block of `buf` as input, ReduceScatter and Scatter leave the
    /// result in it, the others read and write all of it. Enqueued on
    /// `stream`; returns once enqueued.
    pub fn collective_in_place_on<T: Element>(
        &self,
        kind: CollKind,
        buf: &mut impl DevicePtrMut<T>,
        op: RedOp,
        root: u32,
        stream: &CudaStream,
    ) -> Result<()> {
        self.cudarc_backend("cudarc buffer")?;
        let len = buf.len();
        let (p, _write) = buf.device_ptr_mut(stream);
        let out = Out::<T>::from_arg(self.raw_arg(Role::Recv, p, len, T::DTYPE)?);
        let (n, r, es) = (
            self.nranks() as usize,
            self.rank() as usize,
            std::mem::size_of::<T>(),
        );
        let send = match kind {
            CollKind::AllGather | CollKind::Gather => out.block(r, n, es)?,
            _ => out.as_in(),
        };
        let recv = match kind {
            CollKind::ReduceScatter | CollKind::Scatter => out.block_out(r, n, es)?,
            _ => Out::from_arg(out.arg),
        };
        // SAFETY: as in `collective_on`, for one borrowed buffer.
        unsafe {
            self.on_stream(raw_stream(stream), || {
                self.collective::<T>(kind, send, recv, op, root)
            })
        }
    }

    /// Sends `buf` (cudarc device memory) to `peer`, enqueued on `stream`
    /// (a group of one; `peer` calls [`Communicator::recv_on`]).
    pub fn send_on<T: Element>(
        &self,
        buf: &impl DevicePtr<T>,
        peer: u32,
        stream: &CudaStream,
    ) -> Result<()> {
        self.cudarc_backend("cudarc send buffer")?;
        let len = buf.len();
        let (p, _read) = buf.device_ptr(stream);
        // SAFETY: as in `collective_on`: the borrow and cudarc's read event
        // cover the call.
        unsafe {
            self.send_raw(
                p as usize as *const _,
                len,
                T::DTYPE,
                peer,
                raw_stream(stream),
            )
        }
    }

    /// Receives into `buf` (cudarc device memory) from `peer`, enqueued on
    /// `stream`.
    pub fn recv_on<T: Element>(
        &self,
        buf: &mut impl DevicePtrMut<T>,
        peer: u32,
        stream: &CudaStream,
    ) -> Result<()> {
        self.cudarc_backend("cudarc receive buffer")?;
        let len = buf.len();
        let (p, _write) = buf.device_ptr_mut(stream);
        // SAFETY: as in `collective_on`: the mutable borrow and cudarc's
        // write event cover the call.
        unsafe {
            self.recv_raw(
                p as usize as *mut _,
                len,
                T::DTYPE,
                peer,
                raw_stream(stream),
            )
        }
    }
}
