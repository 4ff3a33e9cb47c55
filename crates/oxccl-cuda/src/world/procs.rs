//! A clique whose ranks are processes of one host: each process
//! drives one rank of a [`World`] that knows every rank's device, and the
//! links between ranks live in per-rank arenas shared by CUDA IPC.
//!
//! A link's memory is the receiver's, as in one process, but it cannot be
//! made on first use: the sender, in another process, needs its address
//! when it uploads its plan. So every rank makes, at creation, one arena
//! of `channels × ranks` entries, each a semaphore, a Simple and an LL
//! connection, at fixed offsets; the arenas' IPC handles travel in one
//! all-gather and every process opens its peers'. The link `(channel,
//! from, to)` is then entry `(channel, from)` of `to`'s arena in every
//! process, with no further agreement. Counters only grow, so the memory
//! is zeroed once. The cost is memory: about 6 MiB per entry with the
//! default 512 KiB slots (768 MiB per rank for 8 ranks × 16 channels).
//!
//! Plans with direct steps on peers' buffers need more: each rank's user
//! buffers and scratch come from a heap every peer maps (`heap`), the
//! table where kernels publish their buffers' addresses lies in rank 0's
//! arena (one table for the clique, as in one process), and each process
//! holds, per peer, the delta from the peer's address of its heap to this
//! process's mapping of it, which kernels add to what the peer published.
//! The caller's own allocations are shared per call (`exports`).
//! Kernels of different processes spin on each other's counters: that
//! needs MPS on a shared GPU (the facade chooses; see
//! `oxccl::backend::cuda_procs`).

use crate::driver::DevMem;
use crate::encode::LinkKey;
use crate::error::{CudaError, Result};
use crate::ipc::{export, Imported, HANDLE_BYTES};
use crate::layout::{CONN_HEADER, MAX_BUFS, SEM_BYTES};

use super::heap::{default_heap_bytes, Heap};
use super::ll1_slots::{slot_bytes, slot_lines};
use super::{LinkKind, World, WorldConfig};
use oxccl_core::Proto;

/// An all-gather of small records between the processes, in rank order
/// (the bootstrap's, passed in by the facade).
pub type Exchange<'a> = dyn FnMut(&[u8]) -> std::result::Result<Vec<Vec<u8>>, String> + 'a;

/// Every rank's link arena as mapped in this process.
#[derive(Debug)]
pub(super) struct SharedLinks {
    /// Arena base per rank (this process's address).
    bases: Vec<u64>,
    /// Bytes of one `(channel, from)` entry and the offsets in it.
    entry: usize,
    simple_at: usize,
    ll_at: usize,
    channels: u32,
    /// The clique's table of published buffer addresses (in rank 0's
    /// arena), as mapped here.
    pub(super) table: u64,
    /// This rank's heap, and per rank and tag the delta kernels add to
    /// its published addresses (`[nranks][MAPS]` i64, this process's
    /// device; `exports`).
    pub(super) heap: Heap,
    pub(super) delta: DevMem,
    /// The caller's allocations shared with peers, and theirs mapped here.
    pub(super) exports: std::sync::Mutex<super::exports::Exports>,
    /// The rank this process drives.
    pub(super) me: u32,
    /// Where each arena holds its rank's one-step LL slots and epoch
    /// (`oneshot_ll`), where the path is on.
    pub(super) ll1: Option<Ll1Arena>,
    _own: DevMem,
    _peers: Vec<Imported>,
}

/// The one-step LL path's part of every rank's link arena: the same
/// offsets in each, so a peer's slots are its arena's base plus
/// `slots_at` with no exchange.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ll1Arena {
    /// LL lines per sender and parity.
    pub(super) lines: u64,
    pub(super) slots_at: u64,
    /// The rank's epoch word (read and written by its own kernels only).
    pub(super) epoch_at: u64,
}

/// What each rank sends in the first exchange: its link arena's handle,
/// its heap's handle, the heap's address in its own process, and the
/// arena's layout (its bytes and its one-step LL lines), which every rank
/// must share: a rank whose settings differ would write a peer's arena at
/// the wrong offsets.
const RECORD: usize = 2 * HANDLE_BYTES + 8 + LAYOUT;
const LAYOUT: usize = 16;

/// Little-endian u64 words, for messages.
fn words(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
        .collect()
}

fn round256(b: usize) -> usize {
    b.div_ceil(256) * 256
}

impl SharedLinks {
    /// Rank `r`'s link arena as mapped in this process.
    pub(super) fn arena(&self, r: u32) -> u64 {
        self.bases[r as usize]
    }

    pub(super) fn link(&self, kind: LinkKind, key: LinkKey) -> Result<u64> {
        let (ch, from, to) = key;
        let n = self.bases.len() as u32;
        if from >= n || to >= n || ch >= self.channels {
            return Err(CudaError::Plan(format!(
                "link {key:?} outside the clique's {n} ranks and {} channels",
                self.channels
            )));
        }
        let at = match kind {
            LinkKind::Sem => 0,
            LinkKind::Fifo(Proto::LL) => self.ll_at,
            LinkKind::Fifo(_) => self.simple_at,
        };
        let idx = ch as usize * n as usize + from as usize;
        Ok(self.bases[to as usize] + (idx * self.entry + at) as u64)
    }
}

impl World {
    /// Rank `me` of a clique whose ranks are processes: `cfg.devices`
    /// names every rank's device (this process drives `me` only). Every
    /// process must call this with equal `cfg`; `exchange` is called twice.
    /// Fails alike on every rank if any rank fails to open a peer's arena,
    /// so callers can fall back together.
    pub fn across_processes(
        cfg: WorldConfig,
        me: u32,
        exchange: &mut Exchange<'_>,
    ) -> Result<std::sync::Arc<World>> {
        let n = cfg.devices.len();
        if me as usize >= n {
            return Err(CudaError::Invalid(format!("rank {me} of {n}")));
        }
        // Local failures still take part in both exchanges (an empty
        // record, then the reason), so no peer waits for this rank.
        let local = (|| {
            let w = World::make(cfg, Some(me))?;
            let channels = w.max_channels();
            let simple_at = SEM_BYTES;
            let ll_at =
                simple_at + round256(CONN_HEADER + w.cfg.nslots * w.fifo_slot_bytes(Proto::Simple));
            let entry = ll_at + round256(CONN_HEADER + w.cfg.nslots * w.fifo_slot_bytes(Proto::LL));
            let table_at = entry * channels as usize * n;
            let mut arena = table_at + n * MAX_BUFS * 8;
            // The one-step LL slots and epoch after the table, zeroed with
            // it (every process computes the same offsets from `cfg`).
            let ll1 = (w.oneshot_ll_bytes() > 0).then(|| {
                let lines = slot_lines(w.cfg.ll1_bytes, n);
                let slots_at = round256(arena);
                let epoch_at = slots_at + slot_bytes(n, lines) as usize;
                arena = epoch_at + 256;
                Ll1Arena {
                    lines,
                    slots_at: slots_at as u64,
                    epoch_at: epoch_at as u64,
                }
            });
            let dev = w.dev(me)?;
            let ctx = dev.ctx.clone();
            let own = DevMem::zeroed(&ctx, arena)?;
            let heap_bytes = match w.cfg.heap_bytes {
                0 => default_heap_bytes(
                    crate::device::device_info(ctx.ordinal)?.total_mem,
                    dev.ranks_here,
                ),
                b => b,
            };
            let heap = Heap::new(DevMem::uninit(&ctx, heap_bytes)?);
            let mut record = export(&own, &ctx)?.to_vec();
            record.extend(export(heap.arena(), &ctx)?);
            record.extend(heap.base().to_le_bytes());
            record.extend((arena as u64).to_le_bytes());
            record.extend(ll1.map_or(0, |l| l.lines).to_le_bytes());
            Ok((
                w, ctx, own, heap, record, entry, simple_at, ll_at, channels, table_at, ll1,
            ))
        })();
        let fail = |e: String| CudaError::Invalid(format!("exchanging link arenas and heaps: {e}"));
        let records = exchange(local.as_ref().map_or(&[][..], |l| &l.4[..])).map_err(fail)?;
        let mut peers = Vec::new();
        let mut bases = vec![0u64; n];
        let mut deltas = vec![0i64; n];
        let mut err = local.as_ref().err().map(|e| format!("rank {me}: {e}"));
        if let Ok((_, ctx, own, _, mine, ..)) = &local {
            let layout = |rec: &[u8]| rec[RECORD - LAYOUT..].to_vec();
            for (r, rec) in records.iter().enumerate() {
                if r == me as usize {
                    bases[r] = own.ptr;
                    continue;
                }
                if rec.len() != RECORD {
                    err = Some(format!("rank {me}: rank {r} sent no link arena"));
                    break;
                }
                if layout(rec) != layout(mine) {
                    err = Some(format!(
                        "rank {r}'s link arena is laid out unlike rank {me}'s (bytes and \
                         one-step LL lines {:?} against {:?}): every process of a \
                         communicator must run with the same OXCCL_ settings",
                        words(&layout(rec)),
                        words(&layout(mine))
                    ));
                    break;
                }
                let (links, rest) = rec.split_at(HANDLE_BYTES);
                let (heap, rest) = rest.split_at(HANDLE_BYTES);
                let at = &rest[..8];
                let opened = Imported::open(ctx, links).and_then(|l| {
                    let h = Imported::open(ctx, heap)?;
                    Ok((l, h))
                });
                match opened {
                    Ok((l, h)) => {
                        bases[r] = l.ptr;
                        let theirs = u64::from_le_bytes(at.try_into().unwrap_or_default());
                        deltas[r] = h.ptr.wrapping_sub(theirs) as i64;
                        peers.push(l);
                        peers.push(h);
                    }
                    Err(e) => {
                        err = Some(format!(
                            "rank {me} opening rank {r}'s link arena or heap: {e}"
                        ));
                        break;
                    }
                }
            }
        }
        let delta = match (&local, &err) {
            (Ok((_, ctx, ..)), None) => {
                let bytes = super::exports::initial_table(me as usize, &deltas);
                let m = DevMem::uninit(ctx, bytes.len());
                match m.and_then(|m| m.upload(&bytes).map(|()| m)) {
                    Ok(m) => Some(m),
                    Err(e) => {
                        err = Some(format!("rank {me}: {e}"));
                        None
                    }
                }
            }
            _ => None,
        };
        // Everyone learns whether everyone mapped everything.
        let verdicts = exchange(err.as_deref().unwrap_or("").as_bytes()).map_err(fail)?;
        if let Some(v) = verdicts.iter().find(|v| !v.is_empty()) {
            return Err(CudaError::Invalid(String::from_utf8_lossy(v).into_owned()));
        }
        let (mut w, _, own, heap, _, entry, simple_at, ll_at, channels, table_at, ll1) = local?;
        let delta = delta.ok_or_else(|| CudaError::Invalid("no heap deltas".into()))?;
        w.shared = Some(SharedLinks {
            table: bases[0] + table_at as u64,
            bases,
            entry,
            simple_at,
            ll_at,
            channels,
            heap,
            delta,
            exports: Default::default(),
            me,
            ll1,
            _own: own,
            _peers: peers,
        });
        Ok(std::sync::Arc::new(w))
    }

    /// Whether this world's ranks are processes.
    pub fn across_processes_here(&self) -> bool {
        self.shared.is_some()
    }
}
