//! A clique of ranks in one process: their devices, streams, FIFO
//! connections, semaphores, compiled kernels and cached plan uploads; and
//! the launch of one rank's plan.
//!
//! Memory that a peer touches (FIFO slots, semaphores, user buffers from
//! [`World::alloc`]) comes from `cuMemAlloc` on the owner's device; a FIFO
//! and a semaphore live in the receiver's (waiter's) memory. Nothing is
//! freed with `cuMemFree` while the clique lives: `cuMemFree` waits for the
//! whole device, and a rank blocked there while its peers spin on it would
//! stall them until their deadline. Freed buffers go to a per-device pool.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use cudarc::driver::sys::CUdevice_attribute as A;
use oxccl_core::plan::{BufRole, RankPlan};
use oxccl_core::{BaseOp, DataType, LoweredOp, Proto};

use crate::driver::Ctx;
use crate::driver::{DevMem, Event, Function, HostMapped, Module, Stream};
use crate::encode::{
    self, Encoded, LinkKey, CONN_HEADER, DESC_LL, MAX_BUFS, MAX_CHANNELS, SEM_BYTES,
};
use crate::error::{CudaError, Result};
use crate::kernels::{self, Origin, THREADS};

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
    /// [`THREADS`]); larger plans run [`THREADS`]. A small call's time is
    /// a chain of block barriers and round trips, and a barrier over fewer
    /// threads is cheaper.
    pub small_threads: u32,
}

/// Largest transfer, in bytes, of a plan that runs with
/// [`WorldConfig::small_threads`]: a 64-thread block moves it in a few
/// passes of 16-byte vectors (or LL lines).
pub const SMALL_STEP_BYTES: u64 = 2048;

impl WorldConfig {
    /// `nranks` ranks round-robin over `ndevices` devices, 512 KiB slots,
    /// 4 slots per connection, 64 threads per block for small plans.
    pub fn round_robin(nranks: u32, ndevices: i32, timeout: Duration) -> Self {
        WorldConfig {
            devices: (0..nranks as i32).map(|r| r % ndevices.max(1)).collect(),
            slot_bytes: 512 << 10,
            nslots: 4,
            timeout,
            small_threads: 64,
        }
    }
}

/// Device-encoded `OxDesc` (kernels/oxccl_common.cuh): the kernel's only
/// parameter, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Desc {
    steps: u64,
    ops: u64,
    ptr_table: u64,
    abort_flag: u64,
    world_fail: u64,
    err: u64,
    scale_bits: u64,
    timeout_ns: u64,
    slot_bytes: u64,
    rank: u32,
    nranks: u32,
    nbufs: u32,
    flags: u32,
    post_div: u32,
    nslots: u32,
    bufs: [u64; MAX_BUFS],
    chans: [[u32; 4]; MAX_CHANNELS],
}

const _: () = assert!(std::mem::size_of::<Desc>() == 1120);
const _: () = assert!(std::mem::offset_of!(Desc, scale_bits) == 48);
const _: () = assert!(std::mem::offset_of!(Desc, bufs) == 96);
const _: () = assert!(std::mem::offset_of!(Desc, chans) == 608);

const D_PRE: u32 = 2;
const D_SYS: u32 = 4;
const E_TIMEOUT: u32 = 1;
const E_ABORTED: u32 = 2;
const E_PEER_FAILED: u32 = 3;
const ERR_BYTES: usize = 32;
/// Host-mapped words: the host's abort flag and the clique's failure word.
const W_ABORT: usize = 0;
const W_FAIL: usize = 1;

/// A plan uploaded for one rank.
#[derive(Debug)]
pub struct Prepared {
    blob: DevMem,
    layout: encode::BlobLayout,
    /// The launch parameter's channel records (the first `nchannels` set).
    chans: [[u32; 4]; MAX_CHANNELS],
    nchannels: u32,
    /// Threads per block.
    threads: u32,
    /// Scratch buffers' byte offsets in the rank's scratch area, by buffer id.
    scratch_offsets: Vec<Option<usize>>,
    scratch_bytes: usize,
    elem_size: usize,
    proto: Proto,
}

impl Prepared {
    /// The wire protocol of the plan's FIFO connections.
    pub fn proto(&self) -> Proto {
        self.proto
    }

    pub fn channels(&self) -> u32 {
        self.nchannels
    }
}

/// What a link's memory is for. A connection has a Simple and an LL
/// buffer, each made on first use, with counters of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum LinkKind {
    Sem,
    Fifo(Proto),
}

/// Uploaded plans by hash, with the plan itself to rule out collisions.
type PlanCache = HashMap<u64, Vec<(RankPlan, Arc<Prepared>)>>;

#[derive(Debug)]
struct RankState {
    stream: Stream,
    err: DevMem,
    scratch: Mutex<Option<DevMem>>,
    /// Old scratch areas: kept, not freed, while the clique lives.
    retired: Mutex<Vec<DevMem>>,
    plans: Mutex<PlanCache>,
}

#[derive(Debug)]
struct DeviceState {
    ctx: Arc<Ctx>,
    /// For memsets and uploads that must not wait on the ranks' kernels.
    setup: Stream,
    arch: u32,
    sm_count: u32,
    ranks_here: u32,
    /// Per entry of `kernels::DTYPES`: the loaded module and its kernels
    /// (in `kernels::OPS` order). Set once; read without a lock on every
    /// launch, since all of a device's ranks launch at the same time.
    modules: Vec<OnceLock<(Module, Vec<Function>)>>,
    /// Held while a module compiles or loads, so it happens once.
    loading: Mutex<()>,
    pool: Mutex<HashMap<usize, Vec<DevMem>>>,
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
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere leaves the data usable: every critical section
    // here keeps its maps consistent at each step.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn plan_hash(rp: &RankPlan) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    rp.hash(&mut h);
    h.finish()
}

/// Bytes `len` rounds up to in the buffer pool.
fn pool_class(bytes: usize) -> usize {
    let b = bytes.max(256);
    if b <= 64 << 20 {
        b.next_power_of_two()
    } else {
        b.div_ceil(64 << 20) * (64 << 20)
    }
}

/// The pre-scale as the element type's bits, converted exactly as
/// `Element::from_f64` does on the CPU.
pub fn scale_bits(dtype: DataType, s: f64) -> u64 {
    use oxccl_core::float8::{F8E4M3, F8E5M2};
    use oxccl_core::half::{bf16, f16};
    use oxccl_core::Element;
    match dtype {
        DataType::I8 => u64::from(i8::from_f64(s) as u8),
        DataType::U8 => u64::from(u8::from_f64(s)),
        DataType::I32 => u64::from(i32::from_f64(s) as u32),
        DataType::U32 => u64::from(u32::from_f64(s)),
        DataType::I64 => i64::from_f64(s) as u64,
        DataType::U64 => u64::from_f64(s),
        DataType::F16 => u64::from(f16::from_f64(s).to_bits()),
        DataType::Bf16 => u64::from(bf16::from_f64(s).to_bits()),
        DataType::F32 => u64::from((s as f32).to_bits()),
        DataType::F64 => s.to_bits(),
        DataType::F8E4M3 => u64::from(F8E4M3::from_f64(s).to_bits()),
        DataType::F8E5M2 => u64::from(F8E5M2::from_f64(s).to_bits()),
    }
}

impl World {
    pub fn new(cfg: WorldConfig) -> Result<Arc<World>> {
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
        for &o in &ordinals {
            let ctx = Ctx::new(o)?;
            let major = ctx.attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
            let minor = ctx.attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
            let sm_count = ctx.attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
            let setup = Stream::new(&ctx)?;
            devices.push(DeviceState {
                ranks_here: cfg.devices.iter().filter(|&&d| d == o).count() as u32,
                ctx,
                setup,
                arch: (major * 10 + minor) as u32,
                sm_count,
                modules: kernels::DTYPES.iter().map(|_| OnceLock::new()).collect(),
                loading: Mutex::new(()),
                pool: Mutex::new(HashMap::new()),
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
        for &d in &rank_dev {
            let ctx = &devices[d].ctx;
            let err = DevMem::zeroed(ctx, ERR_BYTES)?;
            ranks.push(RankState {
                stream: Stream::new(ctx)?,
                err,
                scratch: Mutex::new(None),
                retired: Mutex::new(Vec::new()),
                plans: Mutex::new(HashMap::new()),
            });
        }
        let nranks = cfg.devices.len();
        // Buffer bases per rank, published by every launch.
        let ptr_table = DevMem::zeroed(&devices[0].ctx, nranks * MAX_BUFS * 8)?;
        let host_words = HostMapped::zeroed(&devices[0].ctx, 64)?;
        Ok(Arc::new(World {
            cfg,
            devices,
            rank_dev,
            ranks,
            links: Mutex::new(HashMap::new()),
            ptr_table,
            host_words,
            live: Mutex::new(HashMap::new()),
        }))
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
    /// resident): SMs / ranks on the busiest device, at most 32.
    pub fn max_channels(&self) -> u32 {
        self.devices
            .iter()
            .map(|d| (d.sm_count / d.ranks_here.max(1)).clamp(1, 32))
            .min()
            .unwrap_or(1)
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

    /// Zeroed device memory that every rank can address: on `rank`'s device.
    pub fn alloc(&self, rank: u32, bytes: usize) -> Result<u64> {
        let dev = self.dev(rank)?;
        let class = pool_class(bytes);
        let reused = lock(&dev.pool).get_mut(&class).and_then(Vec::pop);
        let mem = match reused {
            Some(m) => m,
            None => DevMem::zeroed(&dev.ctx, class)?,
        };
        // SAFETY: `mem` holds `class` >= `bytes` bytes; the memset is on
        // the setup stream, which never waits for the ranks' kernels.
        unsafe { memset_zero(&dev.setup, mem.ptr, bytes)? };
        let ptr = mem.ptr;
        lock(&self.live).insert(ptr, (rank, mem));
        Ok(ptr)
    }

    /// Returns memory from [`World::alloc`] to the pool.
    pub fn free(&self, rank: u32, ptr: u64) -> Result<()> {
        let (owner, mem) = lock(&self.live).remove(&ptr).ok_or_else(|| {
            CudaError::Invalid(format!("{ptr:#x} was not allocated by this clique"))
        })?;
        if owner != rank {
            let e = CudaError::Invalid(format!("{ptr:#x} belongs to rank {owner}, not {rank}"));
            lock(&self.live).insert(ptr, (owner, mem));
            return Err(e);
        }
        let dev = self.dev(rank)?;
        lock(&dev.pool).entry(mem.bytes).or_default().push(mem);
        Ok(())
    }

    /// The kernel for `(dtype, op)` on `rank`'s device, compiling or
    /// loading its module on first use.
    pub fn kernel(
        &self,
        rank: u32,
        dtype: DataType,
        op: BaseOp,
    ) -> Result<(Function, Option<Origin>)> {
        let dev = self.dev(rank)?;
        let slot = kernels::OPS.iter().position(|o| o.0 == op).unwrap_or(0);
        let cell = kernels::DTYPES
            .iter()
            .position(|d| d.0 == dtype)
            .and_then(|i| dev.modules.get(i))
            .ok_or_else(|| CudaError::Invalid(format!("no kernel for {dtype}")))?;
        if let Some((_, fs)) = cell.get() {
            return Ok((fs[slot], None));
        }
        let _loading = lock(&dev.loading);
        if let Some((_, fs)) = cell.get() {
            return Ok((fs[slot], None));
        }
        let (cubin, origin) = kernels::cubin(dtype, dev.arch)?;
        let m = Module::load(&dev.ctx, &cubin)?;
        let fs = kernels::OPS
            .iter()
            .map(|o| m.function(&kernels::kernel_name(dtype, o.0)))
            .collect::<Result<Vec<_>>>()?;
        let f = fs[slot];
        // Only this thread sets the cell (the loading lock is held).
        let _ = cell.set((m, fs));
        Ok((f, Some(origin)))
    }

    /// Blocks of the executor that fit on one SM.
    pub fn blocks_per_sm(&self, rank: u32) -> Result<u32> {
        let (f, _) = self.kernel(rank, DataType::F32, BaseOp::Sum)?;
        f.max_blocks_per_sm(THREADS)
    }

    /// The connection or semaphore memory for `key`, created on first use
    /// in the receiver's device memory.
    fn link(&self, kind: LinkKind, key: LinkKey) -> Result<u64> {
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
            LinkKind::Fifo(p) => CONN_HEADER + self.cfg.nslots * self.fifo_slot_bytes(p),
        };
        let m = DevMem::zeroed(&dev.ctx, bytes)?;
        let ptr = m.ptr;
        links.insert((kind, key), m);
        Ok(ptr)
    }

    /// Slot stride of a `proto` connection: an LL slot carries a Simple
    /// slot's data in lines of half data, half flags.
    fn fifo_slot_bytes(&self, proto: Proto) -> usize {
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
        // SAFETY: the connection holds a CONN_HEADER-byte header: `tail`
        // at 0 and `head` at 128 (OxConn).
        unsafe {
            dev.setup.read_sync(ptr, &mut tail)?;
            dev.setup.read_sync(ptr + 128, &mut head)?;
        }
        Ok(Some((u64::from_le_bytes(tail), u64::from_le_bytes(head))))
    }

    /// Uploads `rp` for its rank with Simple FIFOs; see
    /// [`World::prepare_proto`].
    pub fn prepare(&self, rp: &RankPlan, elem_size: usize) -> Result<Arc<Prepared>> {
        self.prepare_proto(rp, elem_size, Proto::Simple)
    }

    /// Uploads `rp` for its rank, its FIFO connections running `proto`
    /// (Simple or LL), once; later calls with an equal plan and protocol
    /// return the cached upload. Every rank of a call must use the same
    /// protocol: the two have separate buffers and counters.
    pub fn prepare_proto(
        &self,
        rp: &RankPlan,
        elem_size: usize,
        proto: Proto,
    ) -> Result<Arc<Prepared>> {
        if !matches!(proto, Proto::Simple | Proto::LL) {
            return Err(CudaError::Invalid(format!(
                "protocol {proto}: the CUDA executor runs simple and ll"
            )));
        }
        let r = rp.rank;
        let st = self.rank(r)?;
        if rp.nranks != self.nranks() {
            return Err(CudaError::Invalid(format!(
                "plan for {} ranks on a clique of {}",
                rp.nranks,
                self.nranks()
            )));
        }
        let h = plan_hash(rp);
        if let Some(list) = lock(&st.plans).get(&h) {
            if let Some((_, p)) = list
                .iter()
                .find(|(q, p)| q == rp && p.elem_size == elem_size && p.proto == proto)
            {
                return Ok(p.clone());
            }
        }
        if rp.max_message() * elem_size > self.cfg.slot_bytes {
            return Err(CudaError::Plan(format!(
                "a message of {} elements × {elem_size} bytes exceeds the {}-byte FIFO slot",
                rp.max_message(),
                self.cfg.slot_bytes
            )));
        }
        let nch = rp.channels.len() as u32;
        if nch > self.max_channels() {
            return Err(CudaError::Plan(format!(
                "{nch} channels; at most {} fit on the device with every rank resident",
                self.max_channels()
            )));
        }
        let mut enc: Encoded = encode::encode(rp)?;
        // Every rank launches at least one block, even with nothing to do
        // (a launch of zero blocks is an error).
        if enc.chans.is_empty() {
            enc.chans.push((0, 0, 0, 0));
        }
        let conn_ptrs = enc
            .conns
            .iter()
            .map(|&k| self.link(LinkKind::Fifo(proto), k))
            .collect::<Result<Vec<_>>>()?;
        let sem_ptrs = enc
            .sems
            .iter()
            .map(|&k| self.link(LinkKind::Sem, k))
            .collect::<Result<Vec<_>>>()?;
        let bytes = enc.blob(&conn_ptrs, &sem_ptrs);
        let dev = self.dev(r)?;
        let blob = DevMem::zeroed(&dev.ctx, bytes.len())?;
        // SAFETY: `blob` holds `bytes.len()` bytes.
        unsafe { dev.setup.write_sync(blob.ptr, &bytes)? };
        let mut scratch_offsets = vec![None; rp.bufs.len()];
        let mut off = 0usize;
        for (i, b) in rp.bufs.iter().enumerate() {
            if b.role == BufRole::Scratch && b.len > 0 {
                scratch_offsets[i] = Some(off);
                off += (b.len * elem_size).div_ceil(256) * 256;
            }
        }
        // Grow the scratch area now, not at launch: a cuMemAlloc while
        // peers' kernels spin waiting for this rank's launch can stall it.
        if off > 0 {
            self.scratch(r, off)?;
        }
        let mut chans = [[0u32; 4]; MAX_CHANNELS];
        for (slot, &(first, n, op_first, nops)) in chans.iter_mut().zip(&enc.chans) {
            *slot = [first, n, op_first, nops];
        }
        let p = Arc::new(Prepared {
            blob,
            layout: enc.layout(),
            chans,
            nchannels: enc.chans.len() as u32,
            threads: self.block_threads(&enc, rp.bufs.len(), elem_size),
            scratch_offsets,
            scratch_bytes: off,
            elem_size,
            proto,
        });
        lock(&st.plans)
            .entry(h)
            .or_default()
            .push((rp.clone(), p.clone()));
        Ok(p)
    }

    /// Threads per block for an encoded plan: [`THREADS`], or for a plan
    /// of small transfers `small_threads` raised to a multiple of 32 that
    /// covers what its steps need (a thread per operand and per signal or
    /// wait of a run) and the buffers it publishes (a thread each).
    fn block_threads(&self, enc: &Encoded, nbufs: usize, elem_size: usize) -> u32 {
        let small = enc.max_len().saturating_mul(elem_size as u64) <= SMALL_STEP_BYTES;
        if !small || self.cfg.small_threads == 0 {
            return THREADS;
        }
        let need = enc
            .min_threads()
            .max(nbufs as u32)
            .max(self.cfg.small_threads);
        need.div_ceil(32).saturating_mul(32).min(THREADS)
    }

    /// Scratch area of at least `bytes` for `rank` (grows; never shrinks).
    fn scratch(&self, rank: u32, bytes: usize) -> Result<u64> {
        let st = self.rank(rank)?;
        let mut s = lock(&st.scratch);
        if let Some(m) = s.as_ref() {
            if m.bytes >= bytes {
                return Ok(m.ptr);
            }
        }
        let m = DevMem::zeroed(&self.dev(rank)?.ctx, bytes.next_power_of_two())?;
        let ptr = m.ptr;
        if let Some(old) = s.replace(m) {
            lock(&st.retired).push(old);
        }
        Ok(ptr)
    }

    /// Enqueues one rank's plan on its stream (one kernel launch; returns
    /// at once). `bufs` has one device address per plan buffer; scratch
    /// entries are ignored (the clique provides scratch).
    ///
    /// # Safety
    /// Each non-scratch address must be device memory of the rank (or
    /// registered memory every rank can reach when the plan has remote
    /// steps) valid for the plan's length until the stream reaches the
    /// kernel.
    pub unsafe fn launch(
        &self,
        p: &Prepared,
        rank: u32,
        bufs: &[u64],
        dtype: DataType,
        op: &LoweredOp,
    ) -> Result<()> {
        let st = self.rank(rank)?;
        if bufs.len() != p.scratch_offsets.len() {
            return Err(CudaError::Invalid(format!(
                "{} buffer addresses for a plan with {} buffers",
                bufs.len(),
                p.scratch_offsets.len()
            )));
        }
        if dtype.size() != p.elem_size {
            return Err(CudaError::Invalid(format!(
                "plan prepared for {}-byte elements, launched with {dtype}",
                p.elem_size
            )));
        }
        let scratch_base = if p.scratch_bytes > 0 {
            self.scratch(rank, p.scratch_bytes)?
        } else {
            0
        };
        let (f, _) = self.kernel(rank, dtype, op.base)?;
        let mut d = Desc {
            steps: p.blob.ptr,
            ops: p.blob.ptr + p.layout.ops as u64,
            ptr_table: self.ptr_table.ptr,
            abort_flag: self.host_words.dev_ptr + (W_ABORT * 4) as u64,
            world_fail: self.host_words.dev_ptr + (W_FAIL * 4) as u64,
            err: st.err.ptr,
            scale_bits: op.pre_scale.map_or(0, |s| scale_bits(dtype, s)),
            timeout_ns: u64::try_from(self.cfg.timeout.as_nanos()).unwrap_or(u64::MAX),
            slot_bytes: self.fifo_slot_bytes(p.proto) as u64,
            rank,
            nranks: self.nranks(),
            nbufs: bufs.len() as u32,
            flags: if op.pre_scale.is_some() { D_PRE } else { 0 }
                | if self.devices.len() > 1 { D_SYS } else { 0 }
                | if p.proto == Proto::LL { DESC_LL } else { 0 },
            post_div: op.post_div.unwrap_or(0),
            nslots: self.cfg.nslots as u32,
            bufs: [0; MAX_BUFS],
            chans: p.chans,
        };
        for (i, (&a, o)) in bufs.iter().zip(&p.scratch_offsets).enumerate() {
            d.bufs[i] = match o {
                Some(off) => scratch_base + *off as u64,
                None => a,
            };
        }
        // SAFETY: `Desc` mirrors OxDesc (layout asserted on both sides);
        // the plan blob, links and tables live as long as the clique; the
        // caller guarantees the buffers.
        unsafe { f.launch(p.nchannels, p.threads, &st.stream, &d) }
    }

    /// Waits for the rank's stream and reports a device-side failure.
    pub fn synchronize(&self, rank: u32) -> Result<()> {
        let st = self.rank(rank)?;
        st.stream.synchronize()?;
        match self.rank_failure(rank)? {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Makes every pending and future device-side wait fail promptly.
    pub fn abort(&self) {
        self.host_words.store_u32(W_ABORT, 1);
    }

    /// Whether any rank recorded a failure (cheap: one host-memory read).
    pub fn failed(&self) -> bool {
        self.host_words.load_u32(W_FAIL) != 0 || self.host_words.load_u32(W_ABORT) != 0
    }

    /// The failure `rank` recorded, if any (reads its error record without
    /// waiting for its kernels).
    pub fn rank_failure(&self, rank: u32) -> Result<Option<CudaError>> {
        Ok(self.rank_record(rank)?.map(|(_, e)| e))
    }

    /// `rank`'s error record: the device error code and its error.
    fn rank_record(&self, rank: u32) -> Result<Option<(u32, CudaError)>> {
        let st = self.rank(rank)?;
        let dev = self.dev(rank)?;
        let mut rec = [0u8; ERR_BYTES];
        // SAFETY: `err` holds ERR_BYTES bytes.
        unsafe { dev.setup.read_sync(st.err.ptr, &mut rec)? };
        let w = |i: usize| u32::from_le_bytes(rec[i * 4..i * 4 + 4].try_into().unwrap_or([0; 4]));
        let waited_ms = u64::from_le_bytes(rec[24..32].try_into().unwrap_or([0; 8])) / 1_000_000;
        let (rank, peer, channel, step) = (w(1), w(2), w(3), w(4));
        let aborted = |why| CudaError::Aborted {
            rank,
            peer,
            channel,
            step,
            why,
        };
        let e = match w(0) {
            0 => return Ok(None),
            E_TIMEOUT => CudaError::Timeout {
                rank,
                peer,
                channel,
                step,
                waited_ms,
            },
            E_ABORTED => aborted("the communicator was aborted"),
            E_PEER_FAILED => aborted("another rank failed"),
            other => CudaError::Invalid(format!("unknown device error code {other}")),
        };
        Ok(Some((w(0), e)))
    }

    /// The first failure of any rank: a timeout, else an abort the host
    /// asked for, in preference to the "another rank failed" they cause on
    /// every other rank; among equals, the lowest rank.
    pub fn failure(&self) -> Option<CudaError> {
        if !self.failed() {
            return None;
        }
        let cause = |code: u32| match code {
            E_TIMEOUT => 0,
            E_ABORTED => 1,
            _ => 2,
        };
        (0..self.nranks())
            .filter_map(|r| self.rank_record(r).ok().flatten())
            .min_by_key(|(code, _)| cause(*code))
            .map(|(_, e)| e)
            .or(Some(CudaError::Aborted {
                rank: 0,
                peer: 0,
                channel: 0,
                step: 0,
                why: "the communicator was aborted",
            }))
    }

    /// An event on `rank`'s device.
    pub fn event(&self, rank: u32) -> Result<Event> {
        Event::new(&self.dev(rank)?.ctx)
    }

    /// Copies `bytes` device-to-device on `rank`'s stream `iters` times and
    /// returns the median time of one copy, in seconds (the copy ceiling).
    pub fn time_copy(&self, rank: u32, bytes: usize, iters: usize) -> Result<f64> {
        let dev = self.dev(rank)?;
        let st = self.rank(rank)?;
        let a = DevMem::zeroed(&dev.ctx, bytes)?;
        let b = DevMem::zeroed(&dev.ctx, bytes)?;
        let (e0, e1) = (Event::new(&dev.ctx)?, Event::new(&dev.ctx)?);
        let mut times = Vec::new();
        for i in 0..iters + 2 {
            e0.record(&st.stream)?;
            // SAFETY: both allocations hold `bytes` bytes and outlive the sync below.
            unsafe { st.stream.copy_dtod(b.ptr, a.ptr, bytes)? };
            e1.record(&st.stream)?;
            let ms = e1.elapsed_since(&e0)?;
            if i >= 2 {
                times.push(f64::from(ms) / 1e3);
            }
        }
        times.sort_by(f64::total_cmp);
        Ok(times.get(times.len() / 2).copied().unwrap_or(0.0))
    }
}

/// # Safety
/// `ptr` must be device memory of at least `bytes` bytes in `s`'s context.
unsafe fn memset_zero(s: &Stream, ptr: u64, bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    s.ctx().bind()?;
    // SAFETY: caller's contract.
    unsafe {
        cudarc::driver::sys::cuMemsetD8Async(ptr, 0, bytes, s.raw)
            .result()
            .map_err(|e| CudaError::driver("cuMemsetD8Async", e))?;
    }
    s.synchronize()
}
