//! A clique of ranks in one process: their devices, streams, FIFO
//! connections, semaphores, compiled kernels and cached plan uploads; and
//! the launch of one rank's plan.
//!
//! Memory that a peer touches (FIFO slots, semaphores, user buffers from
//! [`World::alloc`]) comes from `cuMemAlloc` on the owner's device; a FIFO
//! and a semaphore live in the receiver's (waiter's) memory. Nothing is
//! freed with `cuMemFree` while the clique lives: `cuMemFree` waits for the
//! whole device, and a rank blocked there while its peers spin on it would
//! stall them until their deadline. Freed buffers go to a per-device pool,
//! reused in stream order (`memory`).
//!
//! One job per file (private modules): `memory` (user buffers, the pool,
//! scratch), `links` (FIFO and semaphore memory between ranks), `upload` (a
//! plan encoded and cached per rank), `launch` (the kernel and its
//! parameter), `gate` (a launch returns once the launches its kernel depends
//! on were made, where streams may share hardware queues), `streams` (calls
//! on a caller's stream: fork and join with events), `external` (memory the
//! caller allocated: checks for registration), `exports` (ranks as
//! processes: the caller's allocations shared per call) and `failure` (the
//! device error records, abort and the failure word).

mod copies;
mod exports;
mod external;
mod failure;
mod gate;
mod heap;
mod launch;
mod links;
mod ll1_slots;
mod memory;
mod oneshot_ll;
mod procs;
mod relaunch;
mod streams;
mod upload;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use cudarc::driver::sys::CUdevice_attribute as A;

use crate::driver::{Ctx, DevMem, Event, Function, HostMapped, Module, Stream};
use crate::encode::LinkKey;
use crate::error::{CudaError, Result};
use crate::kernels;
use crate::layout::MAX_BUFS;

pub use copies::{copy_list, Copy, End};
pub use exports::{Shared, EXPORT_BYTES, LAST_TAG, WINDOW_RECORD_BYTES};
pub use gate::{GateMode, Party};
pub use heap::{default_heap_bytes, HEAP_VAR};
pub use launch::scale_bits;
use links::LinkKind;
pub use procs::Exchange;
use upload::PlanCache;
pub use upload::Prepared;

/// How a clique is laid out and tuned.
#[derive(Clone, Debug)]
pub struct WorldConfig {
    /// Device ordinal of each rank (several ranks may share one).
    pub devices: Vec<i32>,
    /// Bytes per FIFO slot (the largest message).
    pub slot_bytes: usize,
    /// Slots per connection (at least `oxccl_core::interp::MIN_FIFO_DEPTH`).
    pub nslots: usize,
    /// How long a device-side wait may last before it fails.
    pub timeout: Duration,
    /// Threads per block for plans whose every transfer is at most
    /// [`SMALL_STEP_BYTES`] (raised to what the plan's steps need, at most
    /// [`THREADS`](kernels::THREADS)); larger plans run [`THREADS`](kernels::THREADS). A small call's time is
    /// a chain of block barriers and round trips, and a barrier over fewer
    /// threads is cheaper.
    pub small_threads: u32,
    /// Whether a launch waits until the launches its kernel depends on
    /// were made (`gate`): where the device's hardware queues run out, and
    /// for calls on a caller's stream.
    pub launch_gate: GateMode,
    /// Ranks as processes only: bytes of each rank's heap shared with its
    /// peers (user buffers and scratch; `heap`), 0 for
    /// [`default_heap_bytes`].
    pub heap_bytes: usize,
    /// Dynamic shared memory each executor block reserves and does not
    /// use (`OXCCL_BLOCK_SMEM`, an experiment; default 0): with enough of
    /// it no two blocks share an SM, so a block that the hardware placed
    /// beside another (where a rank with one channel is a whole call's
    /// critical path) cannot happen; `blocks_per_sm`, and so the residency
    /// check, count it.
    pub block_smem: u32,
    /// Ranks known to run on each of this clique's devices beside its own
    /// (0: none known). A communicator split from another runs its
    /// kernels while its siblings run theirs on the same GPU, all spinning
    /// on peers, so its channel cap must count the parent's ranks there,
    /// not only its own: two 4-rank children of 8 ranks on one GPU, each
    /// capped for 4, asked twice the blocks that fit and waited for ever.
    pub co_resident: u32,
    /// Where compiled kernels are cached (`OXCCL_CACHE_DIR`); `None`:
    /// [`kernels::cache_dir`]'s default.
    pub cache_dir: Option<std::path::PathBuf>,
    /// Relaunch mode (`OXCCL_RELAUNCH`, for compute-sanitizer): no kernel
    /// ever waits for a peer's; a launch returns once its plan has run,
    /// relaunched until then (`relaunch`).
    pub relaunch: bool,
    /// Largest AllReduce payload per rank, bytes, the one-step LL path
    /// serves (`oneshot_ll`; 0: none). Each rank's slots take
    /// 2 × ranks × twice this, at most `ll1_slots::SLOT_BUDGET` (the
    /// limit served shrinks to fit).
    pub ll1_bytes: usize,
}

/// Kernels a device runs at once ("maximum number of resident grids per
/// device" in the CUDA programming guide: 128 from compute capability 7.0
/// on); each rank on a device has one kernel running per call.
pub const MAX_RESIDENT_KERNELS: u32 = 128;

/// Largest transfer, in bytes, of a plan that runs with
/// [`WorldConfig::small_threads`]: a 64-thread block moves it in a few
/// passes of 16-byte vectors (or LL lines).
pub const SMALL_STEP_BYTES: u64 = 2048;

impl WorldConfig {
    /// `nranks` ranks round-robin over `ndevices` devices, 512 KiB slots,
    /// 4 slots per connection, 64 threads per block for small plans, the
    /// default heap for ranks as processes; launches gated where the
    /// hardware queues run out, no reserved shared memory, the default
    /// kernel cache.
    pub fn round_robin(nranks: u32, ndevices: i32, timeout: Duration) -> Self {
        WorldConfig {
            devices: (0..nranks as i32).map(|r| r % ndevices.max(1)).collect(),
            slot_bytes: oxccl_core::interp::DEFAULT_SLOT_BYTES,
            nslots: 4,
            timeout,
            small_threads: 64,
            launch_gate: GateMode::Auto,
            heap_bytes: 0,
            block_smem: 0,
            co_resident: 0,
            cache_dir: None,
            relaunch: false,
            ll1_bytes: 64 << 10,
        }
    }
}

#[derive(Debug)]
struct RankState {
    stream: Stream,
    err: DevMem,
    scratch: Mutex<Option<DevMem>>,
    /// Old scratch areas: kept, not freed, while the clique lives.
    retired: Mutex<Vec<DevMem>>,
    plans: Mutex<PlanCache>,
    /// Fork and join events for calls on a caller's stream (`streams`).
    joins: streams::Joins,
    /// Set from `follow_stream` on a caller's stream to `release_stream`:
    /// the launch between them is gated (`gate`).
    on_caller_stream: std::sync::atomic::AtomicBool,
    /// Relaunch mode only: each channel's progress record (`relaunch`).
    progress: Option<HostMapped>,
}

#[derive(Debug)]
struct DeviceState {
    ctx: Arc<Ctx>,
    /// For memsets and uploads that must not wait on the ranks' kernels.
    setup: Stream,
    arch: u32,
    sm_count: u32,
    /// The device's memory in bytes.
    total_mem: usize,
    ranks_here: u32,
    /// Per entry of `kernels::DTYPES`: the loaded module and its kernels
    /// (in `kernels::OPS` order). Set once; read without a lock on every
    /// launch, since all of a device's ranks launch at the same time.
    modules: Vec<OnceLock<(Module, Vec<Function>)>>,
    /// Held while a module compiles or loads, so it happens once.
    loading: Mutex<()>,
    /// Freed user buffers by size class (see `memory`).
    pool: Mutex<HashMap<usize, Vec<memory::Freed>>>,
    /// Ordering events of pool entries handed out again, for reuse.
    events: Mutex<Vec<Event>>,
}

/// A clique's CUDA state, shared by its ranks' threads.
#[derive(Debug)]
pub struct World {
    cfg: WorldConfig,
    devices: Vec<DeviceState>,
    /// Rank -> index into `devices`.
    rank_dev: Vec<usize>,
    ranks: Vec<RankState>,
    links: Mutex<HashMap<(LinkKind, LinkKey), DevMem>>,
    ptr_table: DevMem,
    host_words: HostMapped,
    live: Mutex<HashMap<u64, (u32, DevMem)>>,
    /// Freed memory whose release event could not be recorded: never
    /// reused (nothing says when its last use ends), freed with the clique.
    leaked: Mutex<Vec<DevMem>>,
    /// Ranks as processes: every rank's link arena, mapped here (`procs`).
    shared: Option<procs::SharedLinks>,
    /// The launch gate of this process's ranks (`gate`): `None` with one
    /// rank here or `GateMode::Off`.
    gate: Option<gate::Gate>,
    /// Every launch is gated (a device past its hardware queues, or
    /// `GateMode::On`), not only those on a caller's stream.
    gate_always: bool,
    /// The copy-engine path's flag words (`copies`), where this clique
    /// can run it: `None` for ranks as processes, ungated threads, or a
    /// device with more streams than hardware queues.
    copy_flags: Option<HostMapped>,
    /// Buffer addresses handed between the ranks' threads per
    /// copy-engine call.
    addrs: copies::AddrExchange,
    /// Executor kernels enqueued so far (all ranks of this process).
    kernel_launches: std::sync::atomic::AtomicU64,
    /// Calls run as copies on the copy engines so far.
    copy_calls: std::sync::atomic::AtomicU64,
    /// The one-step LL AllReduce's slots, once a plan has used them.
    ll1: Mutex<Option<Arc<oneshot_ll::Ll1Mem>>>,
    /// Calls run on the one-step LL path so far.
    ll1_calls: std::sync::atomic::AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere leaves the data usable: every critical section
    // here keeps its maps consistent at each step.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl World {
    pub fn new(cfg: WorldConfig) -> Result<Arc<World>> {
        let w = World::make(cfg, None)?;
        w.check_residency()?;
        Ok(Arc::new(w))
    }

    /// Refuses, at creation, a device with more ranks than can run at once:
    /// every rank's kernel spins until its peers' kernels run, so all of
    /// them, each with at least one block, must be resident together.
    /// Past that a call could only end at its deadline.
    fn check_residency(&self) -> Result<()> {
        for (d, dev) in self.devices.iter().enumerate() {
            let n = dev.ranks_here;
            let mut cap = MAX_RESIDENT_KERNELS;
            if n > dev.sm_count.min(cap) {
                // Only now load the executor to ask for its occupancy (one
                // block per SM always fits).
                let first = self.rank_dev.iter().position(|&x| x == d).unwrap_or(0) as u32;
                cap = cap.min(dev.sm_count * self.blocks_per_sm(first)?.max(1));
            }
            if n > cap {
                return Err(CudaError::Invalid(format!(
                    "{n} ranks on device {}: at most {cap} can run there at once ({} SMs, \
                     at most {MAX_RESIDENT_KERNELS} concurrent kernels), and every rank's kernel \
                     must be resident while it waits for its peers; spread the ranks over more \
                     GPUs (WorldConfig::devices, CUDA_VISIBLE_DEVICES) or run at most {cap} per GPU",
                    dev.ctx.ordinal, dev.sm_count
                )));
            }
        }
        Ok(())
    }

    /// `first`: the rank whose stream is made right after the devices'
    /// setup streams, so that with few hardware queues (a process rank)
    /// it shares none with them.
    fn make(cfg: WorldConfig, first: Option<u32>) -> Result<World> {
        if cfg.devices.is_empty() {
            return Err(CudaError::Invalid(
                "a clique needs at least one rank".into(),
            ));
        }
        if cfg.nslots < oxccl_core::interp::MIN_FIFO_DEPTH
            || cfg.slot_bytes < 16
            || !cfg.slot_bytes.is_multiple_of(16)
        {
            return Err(CudaError::Invalid(format!(
                "{} slots of {} bytes: need at least {} slots of a multiple of 16 bytes",
                cfg.nslots,
                cfg.slot_bytes,
                oxccl_core::interp::MIN_FIFO_DEPTH
            )));
        }
        let count = crate::driver::device_count()?;
        let mut ordinals: Vec<i32> = cfg.devices.clone();
        ordinals.sort_unstable();
        ordinals.dedup();
        if let Some(bad) = ordinals.iter().find(|&&o| o < 0 || o >= count) {
            return Err(CudaError::Invalid(format!(
                "device {bad} does not exist ({count} visible)"
            )));
        }
        let mut devices = Vec::new();
        let queues = gate::hardware_queues();
        let mut gate_always = false;
        for &o in &ordinals {
            let here: Vec<u32> = (0..cfg.devices.len() as u32)
                .filter(|&r| cfg.devices[r as usize] == o)
                .collect();
            // Ranks as processes (`first`): one rank of this process, the
            // others elsewhere, so there is nothing to rendezvous with.
            gate_always |= cfg.launch_gate.gates(here.len() as u32, queues);
            let ctx = Ctx::new(o)?;
            let major = ctx.attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
            let minor = ctx.attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
            let sm_count = ctx.attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
            let total_mem = ctx.total_mem()?;
            let setup = Stream::new(&ctx)?;
            devices.push(DeviceState {
                ranks_here: here.len() as u32,
                ctx,
                setup,
                arch: (major * 10 + minor) as u32,
                sm_count,
                total_mem,
                modules: kernels::DTYPES.iter().map(|_| OnceLock::new()).collect(),
                loading: Mutex::new(()),
                pool: Mutex::new(HashMap::new()),
                events: Mutex::new(Vec::new()),
            });
        }
        // Every device reaches every other's memory (P2P over NVLink or PCIe).
        for a in &devices {
            for b in &devices {
                a.ctx.enable_peer(&b.ctx)?;
            }
        }
        let rank_dev: Vec<usize> = cfg
            .devices
            .iter()
            .map(|o| ordinals.iter().position(|x| x == o).unwrap_or(0))
            .collect();
        let mut ranks = Vec::new();
        let mut streams: Vec<Option<Stream>> = rank_dev.iter().map(|_| None).collect();
        let order = first
            .into_iter()
            .map(|f| f as usize)
            .chain((0..rank_dev.len()).filter(|&r| Some(r as u32) != first));
        for r in order {
            if let Some(slot) = streams.get_mut(r) {
                *slot = Some(Stream::new(&devices[rank_dev[r]].ctx)?);
            }
        }
        for (&d, stream) in rank_dev.iter().zip(streams) {
            let ctx = &devices[d].ctx;
            let err = DevMem::zeroed(ctx, failure::ERR_BYTES)?;
            let stream =
                stream.ok_or_else(|| CudaError::Invalid("a rank without a stream".into()))?;
            let progress = cfg
                .relaunch
                .then(|| HostMapped::zeroed(ctx, relaunch::PROGRESS_BYTES))
                .transpose()?;
            ranks.push(RankState {
                progress,
                stream,
                err,
                scratch: Mutex::new(None),
                retired: Mutex::new(Vec::new()),
                plans: Mutex::new(HashMap::new()),
                joins: streams::Joins::default(),
                on_caller_stream: std::sync::atomic::AtomicBool::new(false),
            });
        }
        let nranks = cfg.devices.len();
        // Buffer bases per rank, published by every launch.
        let ptr_table = DevMem::zeroed(&devices[0].ctx, nranks * MAX_BUFS * 8)?;
        let host_words = HostMapped::zeroed(&devices[0].ctx, 64)?;
        // Ranks as processes (`first`): one rank of this process, the
        // others elsewhere, so there is nothing to rendezvous with.
        // Relaunch mode: no kernel waits for another, so nothing to gate.
        let gate =
            (first.is_none() && nranks > 1 && cfg.launch_gate != GateMode::Off && !cfg.relaunch)
                .then(|| gate::Gate::new((0..nranks as u32).collect()));
        let gate_always = gate_always && gate.is_some();
        // The copy-engine path: ranks as threads of this process, each on
        // its own thread (a gate, or one rank), every stream its own
        // hardware queue (a stream waiting on a flag blocks its queue).
        // Not in relaunch mode: a copy-engine call's streams wait on each
        // other's flags, the kind of wait that mode is there to avoid.
        let copy_flags =
            (first.is_none() && (gate.is_some() || nranks == 1) && !gate_always && !cfg.relaunch)
                .then(|| HostMapped::zeroed(&devices[0].ctx, copies::flag_bytes(nranks)))
                .transpose()?;
        Ok(World {
            cfg,
            devices,
            rank_dev,
            ranks,
            links: Mutex::new(HashMap::new()),
            ptr_table,
            host_words,
            live: Mutex::new(HashMap::new()),
            leaked: Mutex::new(Vec::new()),
            shared: None,
            gate_always,
            gate,
            copy_flags,
            addrs: copies::AddrExchange::default(),
            kernel_launches: std::sync::atomic::AtomicU64::new(0),
            copy_calls: std::sync::atomic::AtomicU64::new(0),
            ll1: Mutex::new(None),
            ll1_calls: std::sync::atomic::AtomicU64::new(0),
        })
    }

    pub fn nranks(&self) -> u32 {
        self.ranks.len() as u32
    }

    pub fn config(&self) -> &WorldConfig {
        &self.cfg
    }

    fn dev(&self, rank: u32) -> Result<&DeviceState> {
        self.rank_dev
            .get(rank as usize)
            .map(|&d| &self.devices[d])
            .ok_or_else(|| {
                CudaError::Invalid(format!("rank {rank} out of range 0..{}", self.ranks.len()))
            })
    }

    fn rank(&self, rank: u32) -> Result<&RankState> {
        self.ranks.get(rank as usize).ok_or_else(|| {
            CudaError::Invalid(format!("rank {rank} out of range 0..{}", self.ranks.len()))
        })
    }

    /// The rank's stream (for graph capture and events).
    pub fn stream(&self, rank: u32) -> Result<&Stream> {
        Ok(&self.rank(rank)?.stream)
    }

    /// Largest channel count a plan may use so every rank's blocks fit on
    /// their device at once (they spin on each other, so all must be
    /// resident): SMs / ranks on the busiest device (its own, or the
    /// [`WorldConfig::co_resident`] ranks it shares the device with, if
    /// more), at most 32.
    pub fn max_channels(&self) -> u32 {
        self.devices
            .iter()
            .map(|d| {
                let ranks = d.ranks_here.max(self.cfg.co_resident);
                oxccl_topo::policy::gpu_channel_cap(d.sm_count, ranks)
            })
            .min()
            .unwrap_or(1)
    }

    /// Whether a launch may wait for other ranks of this process to
    /// launch the call (`gate`: always past a device's hardware queues, and
    /// on a caller's stream; relaunch mode: every launch, which returns
    /// once its plan has run): those ranks must then call from threads of
    /// their own.
    pub fn launches_in_step(&self) -> bool {
        self.gate.is_some() || self.cfg.relaunch
    }

    /// Bytes per FIFO slot.
    pub fn slot_bytes(&self) -> usize {
        self.cfg.slot_bytes
    }

    /// A short description: "1x NVIDIA H200, 8 ranks".
    pub fn describe(&self) -> String {
        let names: Vec<String> = self
            .devices
            .iter()
            .map(|d| {
                crate::device::device_info(d.ctx.ordinal)
                    .map(|i| format!("{} (sm_{})", i.name, i.arch))
                    .unwrap_or_else(|_| format!("device {}", d.ctx.ordinal))
            })
            .collect();
        format!(
            "{}x {}, {} ranks",
            self.devices.len(),
            names.join(" + "),
            self.ranks.len()
        )
    }

    /// An event on `rank`'s device.
    pub fn event(&self, rank: u32) -> Result<Event> {
        Event::new(&self.dev(rank)?.ctx)
    }
}
