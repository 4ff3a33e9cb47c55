//! Memory windows (NCCL's `ncclCommWindowRegister`): a range of a rank's
//! memory that every rank of the communicator registers (each its own
//! range, the same size by convention), so collectives whose buffers lie
//! in windows run the direct, zero-copy plans.
//!
//! A window is built on [`Communicator::register`]: where the backend's
//! peers reach registered memory (ranks as threads of one process: the
//! host backend, and CUDA, whose ranks share their device's context or
//! reach other devices through the access the allocation grants, as
//! `ncclMemAlloc` memory does), registering the window registers the
//! range and checks that every rank may load and store it.
//!
//! CUDA ranks as processes map each rank's window into every peer at
//! registration: the owner exports the allocation holding it (it must be
//! `ncclMemAlloc`'s exportable VMM memory) as a POSIX file descriptor,
//! sends it to every peer over the bootstrap's fd mailbox with a record
//! (a tag, the allocation's start and size) gathered over the bootstrap;
//! each peer maps it and stores the delta to its mapping under the
//! owner's tag, as for memory shared per call (`oxccl_cuda`'s
//! `world/exports.rs`). Only once every peer says it mapped the window
//! does the owner count it as shared, so calls on it take the direct
//! plans (with the call check on, which makes the ranks agree per call).
//! Elsewhere (other memory, the host backend's processes) the window is
//! kept without a registration and calls on it run as on any caller
//! memory. Either way every collective on a window is correct; only the
//! plan differs.
//!
//! Registration is collective, as in NCCL: every rank registers its
//! window before calls on it, windows in the same order on every rank.
//! Ranks as threads need no communication for it (each rank's range is
//! its own; the call check compares what the ranks say about their
//! buffers at each call and falls back to FIFO plans on every rank unless
//! all registered); CUDA ranks as processes meet in it (two gathers over
//! the bootstrap and the descriptors), so there it returns once every
//! rank registered.
//!
//! Deregistration is local and releases nothing: it only stops later
//! calls from taking the direct plans on the range (peer processes keep
//! their mapping of a window until the communicator ends). Calls already
//! enqueued keep the plan they were given and the memory stays the
//! caller's (as NCCL says, the caller keeps it allocated until those calls
//! have completed), so deregistering while work on the window is pending
//! is sound without waiting for that work.
//!
//! Flags: [`WIN_COLL_SYMMETRIC`] asks for NCCL's symmetric-kernel
//! eligibility, which needs the window aligned to
//! [`WIN_REQUIRED_ALIGNMENT`] (refused otherwise); [`WIN_STRICT_ORDERING`]
//! and unknown bits are accepted and change nothing (every oxccl call is
//! ordered on its stream already).

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::backend::{PeerWindow, RawBuf};
use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::register::Registration;

/// Fd mailbox tags of window exchanges: this base plus the window's
/// sequence number.
const FD_TAG: u64 = 0x6f78_7769_6e00_0000;

/// `NCCL_WIN_DEFAULT`.
pub const WIN_DEFAULT: u32 = 0x00;
/// `NCCL_WIN_COLL_SYMMETRIC`: the window is registered alike on every
/// rank and aligned to [`WIN_REQUIRED_ALIGNMENT`].
pub const WIN_COLL_SYMMETRIC: u32 = 0x01;
/// `NCCL_WIN_STRICT_ORDERING`: accepted; oxccl's calls are always
/// ordered on their stream.
pub const WIN_STRICT_ORDERING: u32 = 0x02;
/// `NCCL_WIN_REQUIRED_ALIGNMENT`: what a symmetric window's start must be
/// a multiple of.
pub const WIN_REQUIRED_ALIGNMENT: u64 = 4096;

/// Window ids are unique in the process, so a window of one communicator
/// is never taken for another's.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A registered window of one rank; end it with
/// [`Communicator::window_deregister`]. Dropping it instead keeps the
/// range registered until the communicator ends (nothing leaks beyond it).
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a window stays registered until it is passed to window_deregister"]
pub struct Window {
    id: u64,
    rank: u32,
    addr: u64,
    bytes: usize,
    flags: u32,
    /// The facade's registration, where the backend's peers reach it.
    reg: Option<Registration>,
    /// Mapped into every peer process at registration.
    mapped: bool,
}

impl Window {
    /// Start of the range: the pointer the rank registered (NCCL's
    /// `ncclWinGetUserPtr`).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The registered pointer, as the caller passed it.
    pub fn user_ptr(&self) -> *mut std::ffi::c_void {
        self.addr as usize as *mut std::ffi::c_void
    }

    /// Length of the range in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The flags it was registered with.
    pub fn flags(&self) -> u32 {
        self.flags
    }

    /// The rank that registered it.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Whether every rank's kernels reach the window (registered with the
    /// backend, or mapped into every peer process), so calls on it may
    /// take the direct plans (see the module docs).
    pub fn direct(&self) -> bool {
        self.reg.is_some() || self.mapped
    }

    /// Whether `bytes` bytes at `addr` lie inside the window.
    pub fn contains(&self, addr: u64, bytes: usize) -> bool {
        addr >= self.addr
            && addr
                .checked_add(bytes as u64)
                .is_some_and(|end| end <= self.addr + self.bytes as u64)
    }
}

/// Whether windows of CUDA rank processes are mapped into every peer at
/// registration (the direct plans on windows across processes). Off: on
/// the H100 (2026-12-06) ReduceScatter of 1 Mi floats on windows mapped
/// that way gave wrong results at 2 processes, so until that is found,
/// windows there run as caller memory (FIFO plans, right results).
const MAP_ACROSS_PROCESSES: bool = false;

impl Communicator {
    /// Registers `bytes` bytes at `ptr` (device memory of this rank's
    /// device on CUDA, `ncclMemAlloc` memory being the usual kind; host
    /// memory on the host backend) as this rank's window (see the module
    /// docs). Every rank registers its own window before calls on it.
    /// A null pointer, an empty or wrapping range, and a
    /// [`WIN_COLL_SYMMETRIC`] window not aligned to
    /// [`WIN_REQUIRED_ALIGNMENT`] are refused ([`Error::BadPointer`]), as
    /// is memory the backend's peers cannot reach.
    ///
    /// # Safety
    /// As [`Communicator::register`]: until the window is deregistered,
    /// calls on buffers inside it let every rank's kernels read and write
    /// them during the call, so the memory stays allocated for every such
    /// call until it completed, and `ptr..ptr + bytes` is one allocation
    /// (or lies inside one).
    pub unsafe fn window_register(
        &self,
        ptr: *const std::ffi::c_void,
        bytes: usize,
        flags: u32,
    ) -> Result<Window> {
        self.check_usable()?;
        let addr = ptr as u64;
        let bad = |detail: String| Error::BadPointer {
            what: "window",
            detail,
        };
        if addr == 0 || bytes == 0 {
            return Err(bad(format!(
                "{bytes} bytes at {addr:#x}: need a non-null pointer and a non-empty range"
            )));
        }
        if addr.checked_add(bytes as u64).is_none() {
            return Err(bad(format!(
                "{bytes} bytes at {addr:#x} wrap around the address space"
            )));
        }
        if flags & WIN_COLL_SYMMETRIC != 0 && !addr.is_multiple_of(WIN_REQUIRED_ALIGNMENT) {
            return Err(bad(format!(
                "a symmetric window (NCCL_WIN_COLL_SYMMETRIC) must start at a multiple of \
                 {WIN_REQUIRED_ALIGNMENT} bytes (NCCL_WIN_REQUIRED_ALIGNMENT), not {addr:#x}"
            )));
        }
        let backend = &self.clique().backend;
        let reg = if backend.registered_external() {
            // SAFETY: the caller's contract is register's.
            Some(unsafe { self.register(ptr, bytes) }?)
        } else {
            None
        };
        let mapped = MAP_ACROSS_PROCESSES
            && reg.is_none()
            && backend.maps_windows()
            && self.map_window(addr, bytes)?;
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        self.regs.write().windows.push(id);
        tracing::debug!(
            rank = self.rank(),
            addr,
            bytes,
            flags,
            direct = reg.is_some() || mapped,
            "oxccl: window registered"
        );
        Ok(Window {
            id,
            rank: self.rank(),
            addr,
            bytes,
            flags,
            reg,
            mapped,
        })
    }

    /// Maps this rank's window into every peer process and theirs here
    /// (see the module docs); whether every peer mapped this rank's. Every
    /// rank calls it for its window, in the same order.
    fn map_window(&self, addr: u64, bytes: usize) -> Result<bool> {
        let cl = self.clique();
        let Some(boot) = cl.boot.as_ref().filter(|b| b.all_local()) else {
            return Ok(false);
        };
        let map_boot = crate::init::map_bootstrap;
        let (me, n) = (self.rank(), boot.nranks());
        let seq = {
            let mut regs = self.regs.write();
            regs.window_seq += 1;
            regs.window_seq
        };
        let exported = cl
            .backend
            .window_export(me, RawBuf { addr, bytes })
            .unwrap_or_else(|e| {
                tracing::debug!(rank = me, error = %e, "oxccl: window not exported");
                None
            });
        let rec = exported
            .as_ref()
            .map(|(_, r)| r.clone())
            .unwrap_or_default();
        let recs = boot.all_gather(&rec).map_err(map_boot)?;
        let tag = FD_TAG.wrapping_add(seq);
        let deadline = Instant::now() + boot.limit();
        if let Some((fd, _)) = &exported {
            for p in (0..n).filter(|&p| p != me) {
                boot.mailbox()
                    .send(p, tag, &[fd.as_fd()], deadline)
                    .map_err(map_boot)?;
            }
        }
        let mut mapped = vec![0u8; n as usize];
        for p in (0..n).filter(|&p| p != me) {
            if recs[p as usize].is_empty() {
                continue;
            }
            let fds = boot.mailbox().recv(p, tag, deadline).map_err(map_boot)?;
            let ok = match fds.first() {
                Some(fd) => cl
                    .backend
                    .window_import(
                        me,
                        PeerWindow {
                            peer: p,
                            fd,
                            record: &recs[p as usize],
                        },
                    )
                    .map_err(|e| {
                        tracing::warn!(rank = me, peer = p, error = %e,
                            "oxccl: a peer's window could not be mapped here; calls on it run FIFO plans");
                    })
                    .is_ok(),
                None => false,
            };
            mapped[p as usize] = u8::from(ok);
        }
        let all = boot.all_gather(&mapped).map_err(map_boot)?;
        let everywhere = (0..n).all(|q| q == me || all[q as usize].get(me as usize) == Some(&1));
        if exported.is_some() && everywhere {
            cl.backend.window_publish(me, &rec)?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Ends a window: later calls on its range run as on unregistered
    /// memory. Releases nothing and waits for nothing: calls already
    /// enqueued on the window keep their plans (see the module docs). A
    /// window of another communicator (it stays registered there), or
    /// one deregistered already, is refused.
    pub fn window_deregister(&self, w: &Window) -> Result<()> {
        let mut regs = self.regs.write();
        let Some(i) = regs.windows.iter().position(|&id| id == w.id) else {
            return Err(Error::InvalidUsage(format!(
                "window_deregister: the window of {} bytes at {:#x} (rank {}) is not a window \
                 of rank {} of this communicator",
                w.bytes,
                w.addr,
                w.rank,
                self.rank()
            )));
        };
        regs.windows.swap_remove(i);
        drop(regs);
        if w.mapped {
            self.clique().backend.window_retire(
                self.rank(),
                RawBuf {
                    addr: w.addr,
                    bytes: w.bytes,
                },
            );
        }
        match w.reg {
            Some(r) => self.deregister(r),
            None => Ok(()),
        }
    }
}
