//! The memory of a link between two ranks: a FIFO connection (one per
//! protocol) or a semaphore, made on first use in the receiver's device.

use oxccl_core::Proto;
use oxccl_topo::policy::LinkMemory;

use crate::driver::DevMem;
use crate::encode::{self, LinkKey};
use crate::error::{CudaError, Result};
use crate::layout::{OxConn, CONN_HEADER, SEM_BYTES};

use super::{lock, World};

/// What a link's memory is for. A connection has a Simple and an LL
/// buffer, each made on first use, with counters of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum LinkKind {
    Sem,
    Fifo(Proto),
}

impl World {
    /// The connection or semaphore memory for `key`, created on first use
    /// in the receiver's device memory.
    pub(super) fn link(&self, kind: LinkKind, key: LinkKey) -> Result<u64> {
        if let Some(sh) = &self.shared {
            return sh.link(kind, key);
        }
        let mut links = lock(&self.links);
        if let Some(m) = links.get(&(kind, key)) {
            return Ok(m.ptr);
        }
        let (_, from, to) = key;
        if from as usize >= self.ranks.len() || to as usize >= self.ranks.len() {
            return Err(CudaError::Plan(format!(
                "link {key:?} names a rank outside the clique"
            )));
        }
        let dev = self.dev(to)?;
        let bytes = match kind {
            LinkKind::Sem => SEM_BYTES,
            LinkKind::Fifo(p) => self.fifo_link_bytes(p),
        };
        let m = DevMem::zeroed(&dev.ctx, bytes)?;
        let ptr = m.ptr;
        links.insert((kind, key), m);
        Ok(ptr)
    }

    /// Bytes of one `proto` connection: its header and its slots.
    fn fifo_link_bytes(&self, proto: Proto) -> usize {
        CONN_HEADER + self.cfg.nslots * self.fifo_slot_bytes(proto)
    }

    /// What a plan's FIFO connections take of a device and may take
    /// ([`LinkMemory`]): each connection's buffer per protocol, the
    /// busiest device's ranks, and a share of the smallest device's
    /// memory.
    pub fn link_memory(&self) -> LinkMemory {
        LinkMemory {
            per_link: Proto::ALL.map(|p| self.fifo_link_bytes(p) as u64),
            ranks_per_device: self.devices.iter().map(|d| d.ranks_here).max().unwrap_or(1),
            budget: self
                .devices
                .iter()
                .map(|d| d.total_mem as u64)
                .min()
                .unwrap_or(0)
                / LinkMemory::SHARE,
        }
    }

    /// Slot stride of a `proto` connection: an LL slot carries a Simple
    /// slot's data in lines of half data, half flags.
    pub(super) fn fifo_slot_bytes(&self, proto: Proto) -> usize {
        match proto {
            Proto::LL => encode::ll_slot_bytes(self.cfg.slot_bytes),
            _ => self.cfg.slot_bytes,
        }
    }

    /// The `(tail, head)` counters of connection `key`'s `proto` buffer,
    /// or `None` if no plan has used it yet (tests and diagnostics).
    pub fn conn_counters(&self, proto: Proto, key: LinkKey) -> Result<Option<(u64, u64)>> {
        let Some(ptr) = lock(&self.links)
            .get(&(LinkKind::Fifo(proto), key))
            .map(|m| m.ptr)
        else {
            return Ok(None);
        };
        let dev = self.dev(key.2)?;
        let (mut tail, mut head) = ([0u8; 8], [0u8; 8]);
        let at = |off: usize| ptr + off as u64;
        // SAFETY: the connection starts with an OxConn header.
        unsafe {
            dev.setup
                .read_sync(at(std::mem::offset_of!(OxConn, tail)), &mut tail)?;
            dev.setup
                .read_sync(at(std::mem::offset_of!(OxConn, head)), &mut head)?;
        }
        Ok(Some((u64::from_le_bytes(tail), u64::from_le_bytes(head))))
    }
}
