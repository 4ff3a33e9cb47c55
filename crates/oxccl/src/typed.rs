//! The typed collectives, one entry point each: every one is
//! [`Communicator::collective`] with its kind, and the root or operation
//! that kind takes.

use oxccl_core::{CollKind, Element, RedOp};

use crate::buffer::{In, Out};
use crate::comm::Communicator;
use crate::error::Result;

impl Communicator {
    /// `recv[i] = op over ranks of send[i]`. In place: pass the same buffer.
    pub fn all_reduce<'a, T: Element>(
        &self,
        send: impl Into<In<'a, T>>,
        recv: impl Into<Out<'a, T>>,
        op: RedOp,
    ) -> Result<()> {
        self.collective(CollKind::AllReduce, send, recv, op, 0)
    }

    /// In-place AllReduce (for plain slices, which cannot be passed twice).
    pub fn all_reduce_in_place<'a, T: Element>(
        &self,
        buf: impl Into<Out<'a, T>>,
        op: RedOp,
    ) -> Result<()> {
        let out = buf.into();
        self.collective(CollKind::AllReduce, out.as_in(), out, op, 0)
    }

    /// Copies the root's `send` into every rank's `recv`. Other ranks'
    /// `send` is ignored, as in NCCL: pass anything (an empty slice).
    pub fn broadcast<'a, T: Element>(
        &self,
        send: impl Into<In<'a, T>>,
        recv: impl Into<Out<'a, T>>,
        root: u32,
    ) -> Result<()> {
        self.collective(CollKind::Broadcast, send, recv, RedOp::Sum, root)
    }

    /// In-place Broadcast.
    pub fn broadcast_in_place<'a, T: Element>(
        &self,
        buf: impl Into<Out<'a, T>>,
        root: u32,
    ) -> Result<()> {
        let out = buf.into();
        self.collective(CollKind::Broadcast, out.as_in(), out, RedOp::Sum, root)
    }

    /// Reduces every rank's `send` into the root's `recv`. Other ranks'
    /// `recv` is ignored, as in NCCL: pass anything (an empty slice).
    pub fn reduce<'a, T: Element>(
        &self,
        send: impl Into<In<'a, T>>,
        recv: impl Into<Out<'a, T>>,
        op: RedOp,
        root: u32,
    ) -> Result<()> {
        self.collective(CollKind::Reduce, send, recv, op, root)
    }

    /// `recv` (n × count) = every rank's `send` (count), in rank order. In
    /// place: `send` is this rank's block of `recv`.
    pub fn all_gather<'a, T: Element>(
        &self,
        send: impl Into<In<'a, T>>,
        recv: impl Into<Out<'a, T>>,
    ) -> Result<()> {
        self.collective(CollKind::AllGather, send, recv, RedOp::Sum, 0)
    }

    /// In-place AllGather: this rank's block of `buf` is its contribution.
    pub fn all_gather_in_place<'a, T: Element>(&self, buf: impl Into<Out<'a, T>>) -> Result<()> {
        let out = buf.into();
        let n = self.nranks() as usize;
        let send = out.block(self.rank() as usize, n, std::mem::size_of::<T>())?;
        self.collective(CollKind::AllGather, send, out, RedOp::Sum, 0)
    }

    /// `recv` (count) = block `rank` of the reduction of every rank's
    /// `send` (n × count). In place: `recv` is this rank's block of `send`.
    pub fn reduce_scatter<'a, T: Element>(
        &self,
        send: impl Into<In<'a, T>>,
        recv: impl Into<Out<'a, T>>,
        op: RedOp,
    ) -> Result<()> {
        self.collective(CollKind::ReduceScatter, send, recv, op, 0)
    }

    /// In-place ReduceScatter: the result lands in this rank's block of `buf`.
    pub fn reduce_scatter_in_place<'a, T: Element>(
        &self,
        buf: impl Into<Out<'a, T>>,
        op: RedOp,
    ) -> Result<()> {
        let out = buf.into();
        let n = self.nranks() as usize;
        let recv = out.block_out(self.rank() as usize, n, std::mem::size_of::<T>())?;
        self.collective(CollKind::ReduceScatter, out.as_in(), recv, op, 0)
    }

    /// Block `j` of `send` goes to rank `j`; block `i` of `recv` comes from
    /// rank `i` (both n × count).
    pub fn all_to_all<'a, T: Element>(
        &self,
        send: impl Into<In<'a, T>>,
        recv: impl Into<Out<'a, T>>,
    ) -> Result<()> {
        self.collective(CollKind::AllToAll, send, recv, RedOp::Sum, 0)
    }

    /// The root's `recv` (n × count) = every rank's `send` (count). Other
    /// ranks' `recv` is ignored, as in NCCL: pass anything.
    pub fn gather<'a, T: Element>(
        &self,
        send: impl Into<In<'a, T>>,
        recv: impl Into<Out<'a, T>>,
        root: u32,
    ) -> Result<()> {
        self.collective(CollKind::Gather, send, recv, RedOp::Sum, root)
    }

    /// Every rank's `recv` (count) = block `rank` of the root's `send`.
    /// Other ranks' `send` is ignored, as in NCCL: pass anything.
    pub fn scatter<'a, T: Element>(
        &self,
        send: impl Into<In<'a, T>>,
        recv: impl Into<Out<'a, T>>,
        root: u32,
    ) -> Result<()> {
        self.collective(CollKind::Scatter, send, recv, RedOp::Sum, root)
    }
}
