//! Registration of external memory for zero-copy plans (NCCL's
//! `ncclCommRegister` / `ncclCommDeregister`).
//!
//! A raw call ([`Communicator::collective_raw`]) on memory the caller
//! allocated runs a FIFO plan: each rank's kernel touches only its own
//! buffers and data crosses ranks through the library's FIFOs, which works
//! on any memory the rank's device can address. The direct plans
//! (one-shot, two-shot, all-pairs), which have peers load and store a
//! rank's buffers and skip the FIFO copies, need memory every rank can
//! address. Memory from `comm.alloc` is; external memory is once it is
//! registered: within one process every rank's kernel can address memory
//! on its own device (ranks sharing a GPU share its context), and a peer
//! on another device can when the allocation grants that device access
//! (peer access for `cuMemAlloc`, `cuMemPoolSetAccess` for pool memory,
//! `cuMemSetAccess` for VMM), which registration checks.
//!
//! CUDA ranks as processes need no registration: with the call check on,
//! each raw call shares its buffers' allocations with the peer processes
//! (`Backend::share_external`; `cudaMalloc`/`cuMemAlloc` memory, not pool
//! or VMM memory), registered or not (`docs/CUDA_PROCESSES.md`).
//!
//! Where peers cannot reach the caller's memory at all (ranks as
//! processes of the host backend, and CUDA rank processes staged through
//! host memory, as without MPS), registering still succeeds, as NCCL's
//! does wherever its zero-copy paths are off: the backend checks that the
//! memory is the rank's, and calls on the range run FIFO plans.
//!
//! A raw call uses a direct plan only where both of its buffers lie in
//! ranges this rank registered and every rank agrees (the call check
//! compares each rank's answer and falls back to the FIFO plan on every
//! rank unless all say yes). With the call check off
//! (`OXCCL_CHECK_CALLS=0`) nothing compares them: every rank must then
//! register alike (all ranks' buffers of a call registered, or none), as
//! every rank must pass matching calls. A FIFO plan is also used, on
//! registered memory too, where the selector predicts it faster (small
//! calls under LL) or for a PreMulSum whose scalar the ranks do not share
//! through the call check.
//!
//! Windows (`ncclCommWindowRegister`, [`Communicator::window_register`])
//! are registrations made by every rank alike (`window.rs`).
//!
//! Send/Recv: a send of 256 KiB or more whose buffer is registered (or
//! `comm.alloc` memory) is read by its receiver straight from that buffer
//! (`gen::p2p::Path::Direct`), whatever the receiver's buffer; the
//! sender's choice reaches the receiver through the call check, so with
//! the check off, and for sends that share a group launch with a
//! collective of their type, Send/Recv stay on FIFOs.

use crate::backend::RawBuf;
use crate::comm::Communicator;
use crate::error::{Error, Result};

pub use crate::registry::Registration;

impl Communicator {
    /// Registers `bytes` bytes at `ptr` (device memory of this rank's
    /// device on CUDA, host memory on the host backend) so raw calls on
    /// it may run the direct, zero-copy plans (see the module docs). The
    /// backend checks that every rank of the clique may load and store it;
    /// nothing is copied or pinned. Ranges may overlap; registering is
    /// local to this rank and costs no communication.
    ///
    /// # Safety
    /// Until [`Communicator::deregister`] is called with the returned
    /// handle, every raw call whose buffers lie in the range lets every
    /// rank's kernels read and write those buffers during the call: the
    /// memory must stay allocated for every such call until it completed
    /// (as the raw calls' own contract says), and `ptr..ptr + bytes` must
    /// be one allocation (or lie inside one).
    pub unsafe fn register(
        &self,
        ptr: *const std::ffi::c_void,
        bytes: usize,
    ) -> Result<Registration> {
        self.check_usable()?;
        let addr = ptr as u64;
        if addr == 0 || bytes == 0 {
            return Err(Error::InvalidUsage(format!(
                "register: {bytes} bytes at {addr:#x}: need a non-null pointer and a non-empty range"
            )));
        }
        if addr.checked_add(bytes as u64).is_none() {
            return Err(Error::InvalidUsage(format!(
                "register: {bytes} bytes at {addr:#x} wrap around the address space"
            )));
        }
        self.clique()
            .backend
            .check_external(self.rank(), RawBuf { addr, bytes })?;
        let mut regs = self.regs.write();
        regs.next_id += 1;
        let r = Registration {
            rank: self.rank(),
            id: regs.next_id,
            addr,
            bytes,
        };
        regs.ranges.push(r);
        Ok(r)
    }

    /// Ends a registration: later raw calls on the range run FIFO plans
    /// (calls already enqueued keep their plans). An unknown handle (one
    /// of another rank, or deregistered already) is an error.
    pub fn deregister(&self, reg: Registration) -> Result<()> {
        let mut regs = self.regs.write();
        match regs.ranges.iter().position(|r| *r == reg) {
            Some(i) => {
                regs.ranges.swap_remove(i);
                Ok(())
            }
            None => Err(Error::InvalidUsage(format!(
                "deregister: {} bytes at {:#x} (rank {}) is not registered on rank {}",
                reg.bytes,
                reg.addr,
                reg.rank,
                self.rank()
            ))),
        }
    }

    /// Whether `raw` lies inside one range this rank registered, on a
    /// backend whose peers reach registered memory.
    pub(crate) fn registered(&self, raw: RawBuf) -> bool {
        if !self.clique().backend.registered_external() {
            return false;
        }
        let regs = self.regs.read();
        regs.ranges
            .iter()
            .any(|r| raw.addr >= r.addr && raw.end() <= r.addr + r.bytes as u64)
    }
}
