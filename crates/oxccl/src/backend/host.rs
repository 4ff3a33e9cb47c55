//! The host backend: ranks are threads of this process (or, through
//! [`create_procs`], processes of this host: one rank each, buffers from
//! the rank's shared heap), buffers are host memory, and plans run on
//! `oxccl_host::HostFabric` (shared-memory FIFOs).
//! Calls block until done, so "streams" are trivial: `synchronize` has
//! nothing to wait for and the timer is an `Instant`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use oxccl_core::plan::BufRole;
use oxccl_core::Proto;
use oxccl_host::{HostBuf, HostConfig, HostError, HostFabric};

use super::{Backend, BackendKind, BackendOptions, Launch, RawBuf, Timer, WallTimer};
use crate::error::Error;

/// Alignment of host allocations: enough for every element type and for
/// vectorised copies.
const ALIGN: usize = 64;

/// The host backend of one clique.
#[derive(Debug)]
pub struct HostBackend {
    fabric: Arc<HostFabric>,
    nranks: u32,
    /// Ranks as processes: this process's rank.
    proc_rank: Option<u32>,
    /// Ranks as processes over shared memory (not the network): `alloc`
    /// comes from the rank's shared heap.
    shared: bool,
    /// Ranks as processes: each rank's host, from the bootstrap (labels
    /// in order of first appearance).
    host_of: Vec<u32>,
    /// Plans run, every rank's ([`Backend::launch_counts`]).
    plans_run: AtomicU64,
    /// The one-step LL AllReduce, for ranks as threads (`None`: ranks as
    /// processes, or turned off).
    ll1: Option<oxccl_host::OneShotLl>,
    /// Calls run on it, every rank's.
    ll1_runs: AtomicU64,
}

/// A plan's handle when its launches run the one-step LL AllReduce of
/// `count` elements instead of the plan.
#[derive(Debug)]
pub(crate) struct OneShotLlRun {
    pub count: usize,
}

/// The handle of `plan` when it runs on a one-step LL path serving up to
/// `cap` bytes per rank: an AllReduce plan of that algorithm whose
/// payload fits.
pub(crate) fn oneshot_ll_run(
    plan: &oxccl_core::Plan,
    elem_size: usize,
    cap: usize,
) -> Option<OneShotLlRun> {
    let coll = plan.coll?;
    let fits = plan.algo == oxccl_core::Algo::OneShotLl
        && coll.kind == oxccl_core::CollKind::AllReduce
        && coll.count.checked_mul(elem_size).is_some_and(|b| b <= cap);
    fits.then_some(OneShotLlRun { count: coll.count })
}

/// Each rank's host as a label (in order of first appearance) from the
/// bootstrap's host identities. Over the network with every rank on one
/// host (forced), each rank is a host of its own: every hop of its
/// crosses the network.
fn hosts_of(boot: &oxccl_bootstrap::Bootstrap, network: bool) -> Vec<u32> {
    if network && boot.all_local() {
        return (0..boot.nranks()).collect();
    }
    let mut seen: Vec<&str> = Vec::new();
    boot.descs()
        .iter()
        .map(|d| match seen.iter().position(|h| *h == d.host) {
            Some(i) => i as u32,
            None => {
                seen.push(&d.host);
                seen.len() as u32 - 1
            }
        })
        .collect()
}

/// Creates the host backend for `opts.nranks` ranks.
pub fn create(opts: &BackendOptions) -> Result<Arc<dyn Backend>, Error> {
    let cfg = opts.host.apply(HostConfig {
        deadline: opts.deadline,
        warn_after: opts.wait_warn.first,
        warn_every: opts.wait_warn.every,
        ..HostConfig::default()
    });
    Ok(Arc::new(HostBackend {
        fabric: HostFabric::new(opts.nranks, cfg),
        nranks: opts.nranks,
        proc_rank: None,
        shared: false,
        host_of: Vec::new(),
        plans_run: AtomicU64::new(0),
        ll1: (opts.ll1_bytes > 0).then(|| oxccl_host::OneShotLl::new(opts.nranks, opts.ll1_bytes)),
        ll1_runs: AtomicU64::new(0),
    }))
}

/// Creates the host backend of this process's rank of a communicator
/// whose ranks are processes of this host, met through `boot`.
pub fn create_procs(
    boot: &oxccl_bootstrap::Bootstrap,
    opts: &BackendOptions,
) -> Result<Arc<dyn Backend>, Error> {
    let cfg = opts.host.apply(HostConfig {
        deadline: opts.deadline,
        warn_after: opts.wait_warn.first,
        warn_every: opts.wait_warn.every,
        ..HostConfig::default()
    });
    let fabric = HostFabric::across_processes(boot, cfg).map_err(map_error)?;
    let network = fabric.network().is_some();
    Ok(Arc::new(HostBackend {
        shared: !network,
        host_of: hosts_of(boot, network),
        fabric,
        nranks: opts.nranks,
        proc_rank: Some(boot.rank()),
        plans_run: AtomicU64::new(0),
        // Its slots are plain memory of one process: ranks as processes
        // run the FIFO one-shot instead.
        ll1: None,
        ll1_runs: AtomicU64::new(0),
    }))
}

/// Maps a fabric error onto the facade's.
pub(crate) fn map_error(e: HostError) -> Error {
    match e {
        HostError::Deadline(f) => Error::Wait(f),
        e @ HostError::Aborted { .. } => Error::Aborted(e.to_string()),
        HostError::Failed(m) => Error::Aborted(m),
        e @ HostError::Mismatch { .. } => Error::Backend(e.to_string()),
        e @ HostError::Corrupt { .. } => Error::Aborted(e.to_string()),
        e @ HostError::PeerLost { .. } => Error::Aborted(e.to_string()),
        e @ HostError::NetLost { .. } => Error::Aborted(e.to_string()),
        HostError::Net(m) => Error::Bootstrap(m),
        HostError::Shm(m) => Error::Bootstrap(m),
        HostError::Bootstrap(e) => Error::Bootstrap(e.to_string()),
        HostError::InvalidPlan(m) => Error::Internal(m),
    }
}

/// Page size assumed for page-aligned allocations.
const PAGE: usize = 4096;

/// The layout of a private allocation of `bytes`. Ranks as processes over
/// the network (`paged`) get whole pages: a CUDA rank staged through this
/// backend page-locks its staging areas (`cuMemHostRegister`), which
/// refuses two registrations sharing a page.
fn layout(bytes: usize, paged: bool) -> Result<std::alloc::Layout, Error> {
    let err =
        |e: &dyn std::fmt::Display| Error::Backend(format!("cannot allocate {bytes} bytes: {e}"));
    let (size, align) = if paged {
        let size = bytes
            .checked_next_multiple_of(PAGE)
            .ok_or_else(|| err(&"too large"))?;
        (size, PAGE)
    } else {
        (bytes, ALIGN)
    };
    std::alloc::Layout::from_size_align(size, align).map_err(|e| err(&e))
}

fn host_buf(raw: RawBuf) -> HostBuf {
    HostBuf {
        ptr: raw.addr as usize as *mut u8,
        bytes: raw.bytes,
    }
}

impl HostBackend {
    /// One rank's call on the one-step LL path: the plan's input and
    /// output buffers, `run.count` elements.
    ///
    /// # Safety
    /// As [`Backend::execute`].
    unsafe fn run_oneshot_ll(
        &self,
        launch: &Launch<'_>,
        run: &OneShotLlRun,
        path: &oxccl_host::OneShotLl,
    ) -> Result<(), Error> {
        let role = |want: BufRole| {
            launch
                .plan
                .bufs
                .iter()
                .zip(launch.bufs)
                .find(|(d, _)| d.role == want)
                .map(|(_, r)| host_buf(*r))
                .ok_or_else(|| Error::Internal(format!("an AllReduce plan without {want:?}")))
        };
        let (input, output) = (role(BufRole::Input)?, role(BufRole::Output)?);
        self.ll1_runs.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller guarantees (trait contract) both buffers are
        // valid host memory of their lengths for the call, aligned for the
        // element type; in place they are the same memory, which the path
        // allows (it reads all of the input before writing the output).
        unsafe {
            path.all_reduce(
                &self.fabric,
                launch.rank,
                input,
                output,
                run.count,
                launch.dtype,
                launch.op,
            )
        }
        .map_err(map_error)
    }

    /// Whether private allocations take whole pages (see [`layout`]).
    fn paged(&self) -> bool {
        self.proc_rank.is_some() && !self.shared
    }
}

impl Backend for HostBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Host
    }

    fn describe(&self) -> String {
        match (self.proc_rank, self.fabric.network()) {
            (Some(r), Some(via)) => {
                // The hop the model prices (measured, at least the
                // device's stated latency).
                let hop = self
                    .net_placement()
                    .and_then(|p| p.hop_latency_us())
                    .map(|h| format!(", one hop {h:.0} us"))
                    .unwrap_or_default();
                // The channels connected (the 2026-12-04 17:10 H200 run's log would have shown a
                // binary older than the four of 7cb56f3 at a glance) and
                // the sockets of each connection the ranks agreed on.
                let socks = self
                    .fabric
                    .network_sockets()
                    .map(|(t, s)| format!(", {t}x{s} sockets"))
                    .unwrap_or_default();
                format!(
                    "host, rank {r} of {} processes over {via} ({} channels{socks}){hop}",
                    self.nranks,
                    self.fabric.max_channels()
                )
            }
            (Some(r), None) => format!("host, rank {r} of {} processes", self.nranks),
            (None, _) => format!("host, {} rank threads", self.nranks),
        }
    }

    fn blocking(&self) -> bool {
        true
    }

    fn registered_alloc(&self) -> bool {
        // Ranks as threads: any buffer is addressable by every peer through
        // the fabric's published buffer table. As processes: `alloc`
        // memory is in the rank's shared heap, which every peer maps. Over
        // the network nothing is: FIFO plans only.
        self.fabric.network().is_none()
    }

    fn registered_external(&self) -> bool {
        // Only rank threads register the caller's memory (`check_external`).
        self.proc_rank.is_none()
    }

    fn check_external(&self, _rank: u32, _buf: RawBuf) -> Result<(), Error> {
        // Rank threads reach any memory of this process. Rank processes
        // reach only each other's shared heaps: their registrations are
        // hints that change nothing (`registered_external`), accepted as
        // NCCL accepts any of the caller's memory. Host memory has nothing
        // to check.
        Ok(())
    }

    fn host_addressable(&self) -> bool {
        // `alloc` is `alloc_zeroed` in this process.
        true
    }

    fn chunk_bytes(&self) -> usize {
        self.fabric.config().slot_bytes
    }

    fn max_channels(&self) -> u32 {
        // Over the network: the channels connected at setup.
        self.fabric.max_channels().min(32) as u32
    }

    fn protocols(&self) -> &'static [Proto] {
        // `oxccl-host` builds Simple FIFOs only; LL would be Simple under
        // another name, so it is not offered (NCCL_PROTO=LL alone is a
        // configuration error on this backend).
        &[Proto::Simple]
    }

    fn launch_counts(&self) -> Option<super::LaunchCounts> {
        Some(super::LaunchCounts {
            kernels: self.plans_run.load(Ordering::Relaxed),
            copy_engine_calls: 0,
            oneshot_ll_calls: self.ll1_runs.load(Ordering::Relaxed),
        })
    }

    fn oneshot_ll_bytes(&self) -> usize {
        self.ll1
            .as_ref()
            .map_or(0, oxccl_host::OneShotLl::cap_bytes)
    }

    fn prepare_plan(
        &self,
        plan: &oxccl_core::Plan,
        elem_size: usize,
        _proto: Proto,
    ) -> super::PreparedPlan {
        let run = oneshot_ll_run(plan, elem_size, self.oneshot_ll_bytes());
        Ok(run.map(|r| Arc::new(r) as super::PlanHandle))
    }

    unsafe fn execute(&self, launch: &Launch<'_>) -> Result<(), Error> {
        let ll1 = launch
            .handle
            .and_then(|h| h.downcast_ref::<OneShotLlRun>())
            .zip(self.ll1.as_ref());
        if let Some((run, path)) = ll1 {
            // SAFETY: as the plan's execution below (the same contract).
            return unsafe { self.run_oneshot_ll(launch, run, path) };
        }
        // Inline: plans bind a handful of buffers, and a call allocates nothing.
        let bufs: smallvec::SmallVec<[HostBuf; 4]> = launch
            .plan
            .bufs
            .iter()
            .zip(launch.bufs)
            .filter(|(d, _)| d.role != BufRole::Scratch)
            .map(|(_, r)| host_buf(*r))
            .collect();
        // SAFETY: the caller guarantees (trait contract) that every
        // non-scratch buffer is valid host memory of its length for the
        // call, aliased only as the plan's in-place layout says; the
        // facade aligned allocations and checked element alignment.
        self.plans_run.fetch_add(1, Ordering::Relaxed);
        let mut steps = launch.steps.map(|s| s.now.lock());
        // A profiler plugin that asked for proxy events hears of the
        // network links' work (nothing to hear without a network).
        let proxy = crate::observe::profiler::proxy_events();
        // SAFETY: as above.
        unsafe {
            self.fabric
                .execute_observed(
                    launch.plan,
                    &bufs,
                    launch.dtype,
                    launch.op,
                    steps.as_deref_mut(),
                    proxy.as_ref(),
                )
                .map(|_| ())
                .map_err(map_error)
        }
    }

    fn alloc(&self, _rank: u32, bytes: usize) -> Result<RawBuf, Error> {
        if self.shared {
            // Peers' direct steps address it: the rank's shared heap
            // (zeroed: fresh or punched-out pages).
            let ptr = self.fabric.alloc_shared(bytes).map_err(map_error)?;
            return Ok(RawBuf {
                addr: ptr as usize as u64,
                bytes,
            });
        }
        let layout = layout(bytes.max(1), self.paged())?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::Backend(format!(
                "out of host memory ({bytes} bytes)"
            )));
        }
        Ok(RawBuf {
            addr: ptr as usize as u64,
            bytes,
        })
    }

    unsafe fn free(&self, _rank: u32, buf: RawBuf) {
        if self.shared {
            self.fabric.free_shared(buf.addr as usize as *mut u8);
            return;
        }
        if let Ok(layout) = layout(buf.bytes.max(1), self.paged()) {
            // SAFETY: `buf` came from `alloc` with this very layout
            // (caller's contract), and is not used afterwards.
            unsafe { std::alloc::dealloc(buf.addr as usize as *mut u8, layout) };
        }
    }

    unsafe fn write(&self, _rank: u32, dst: RawBuf, src: &[u8]) -> Result<(), Error> {
        // SAFETY: `dst` has room for `src.len()` bytes (caller's contract);
        // a user slice cannot overlap memory the backend owns.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst.addr as usize as *mut u8, src.len())
        };
        Ok(())
    }

    unsafe fn read(&self, _rank: u32, src: RawBuf, dst: &mut [u8]) -> Result<(), Error> {
        // SAFETY: `src` holds at least `dst.len()` bytes (caller's
        // contract) and does not overlap the user's slice.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.addr as usize as *const u8,
                dst.as_mut_ptr(),
                dst.len(),
            )
        };
        Ok(())
    }

    fn synchronize(&self, _rank: u32) -> Result<(), Error> {
        Ok(())
    }

    fn abort(&self, why: &str) {
        self.fabric.abort(why);
    }

    fn failure(&self) -> Option<Error> {
        self.fabric.failure().map(map_error)
    }

    fn timer(&self, _rank: u32) -> Result<Box<dyn Timer>, Error> {
        Ok(Box::<WallTimer>::default())
    }

    fn stream_bandwidth(&self, bytes: usize) -> Option<Result<f64, Error>> {
        self.fabric
            .stream_bandwidth(bytes)
            .map(|r| r.map_err(map_error))
    }

    fn duplex_bandwidth(&self, bytes: usize) -> Option<Result<f64, Error>> {
        self.fabric
            .duplex_bandwidth(bytes)
            .map(|r| r.map_err(map_error))
    }

    fn net_placement(&self) -> Option<oxccl_topo::NetPlacement> {
        Some(oxccl_topo::NetPlacement {
            host_of: self.host_of.clone(),
            bw: self.fabric.network_bandwidth()?,
            hop_us: self.fabric.network_hop_us(),
            device: self.fabric.network_device().map(|d| oxccl_topo::NetDevice {
                name: d.name.clone(),
                pci_path: d.pci_path.clone(),
                speed_mbps: d.speed_mbps,
                // Every rank's largest, not this rank's device's: the
                // model's inputs must be the same on every rank.
                latency_us: self.fabric.network_device_latency_us().unwrap_or(0.0),
            }),
        })
    }

    fn copy_bandwidth(&self, bytes: usize) -> Result<f64, Error> {
        let src = vec![1u8; bytes.max(1)];
        let mut dst = vec![0u8; bytes.max(1)];
        // Warm up (page faults), then take the best of a few copies.
        dst.copy_from_slice(&src);
        let mut best = Duration::MAX;
        for _ in 0..5 {
            let t = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
            best = best.min(t.elapsed());
        }
        Ok(bytes as f64 / best.as_secs_f64().max(1e-9) / 1e9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paged_layouts_take_whole_pages() {
        for bytes in [1, 64, 4095, 4096, 4097, 1 << 20] {
            let l = layout(bytes, true).unwrap();
            assert_eq!((l.align(), l.size() % PAGE), (PAGE, 0), "{bytes}");
            assert!(l.size() >= bytes);
            let l = layout(bytes, false).unwrap();
            assert_eq!((l.align(), l.size()), (ALIGN, bytes));
        }
        assert!(layout(usize::MAX - 10, true).is_err());
    }
}
