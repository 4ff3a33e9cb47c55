//! Ranks in several processes of one host: the parts of a
//! [`crate::HostFabric`] that live in shared segments ([`crate::shm`]),
//! how ranks sleep and wake across processes (a futex on a doorbell word
//! in the sleeper's segment), and the watcher that notices a peer process
//! dying (a pidfd per peer) and fails the fabric, naming the peer.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use oxccl_bootstrap::{Bootstrap, PeerWatch};
use oxccl_core::plan::Rank;
use parking_lot::Mutex;
use rustix::event::Timespec;
use rustix::thread::futex;

use crate::error::HostError;
use crate::fifo::Link;
use crate::remote::{RemoteAccess, RemoteFault};
use crate::shm::{
    GlobalCtl, Heap, Layout, LinkCtr, RankCtl, Segment, MAX_CHANNELS, MAX_PUB, RANK_CTL,
};
use crate::HostConfig;

/// How long [`Procs::reason`] waits for a failure record being written
/// (a few stores; longer means its writer died between claim and publish).
const REASON_WRITE_WAIT: Duration = Duration::from_millis(200);

/// Tag of the segment descriptors in the bootstrap's fd mailbox.
const SEG_TAG: u64 = 0x6f78_6363_6c73_6567;

/// The shared state of a fabric whose ranks are processes.
#[derive(Debug)]
pub(crate) struct Procs {
    pub me: Rank,
    lay: Layout,
    /// Every rank's segment, by rank (ours included).
    segs: Vec<Arc<Segment>>,
    heap: Mutex<Heap>,
    pids: Vec<u32>,
    dead: Box<[AtomicBool]>,
    watcher: Mutex<Option<PeerWatch>>,
}

fn ts(d: Duration) -> Timespec {
    Timespec {
        tv_sec: d.as_secs() as _,
        tv_nsec: d.subsec_nanos() as _,
    }
}

impl Procs {
    /// Creates this rank's segment, swaps segments with every peer through
    /// `boot`, and maps theirs. `cfg` must be sanitized and equal on every
    /// rank (checked).
    pub fn new(boot: &Bootstrap, cfg: &HostConfig) -> Result<Procs, HostError> {
        let me = boot.rank();
        let n = boot.nranks() as usize;
        if !boot.all_local() {
            return Err(HostError::Shm(
                "the host backend across processes needs every rank on this machine".into(),
            ));
        }
        let lay = Layout::new(
            n,
            cfg.slots,
            cfg.slot_bytes.next_multiple_of(64),
            cfg.shm_heap_bytes,
        );
        let key = format!("{} {} {}", lay.slots, lay.stride, lay.total);
        for (r, k) in boot.all_gather(key.as_bytes())?.iter().enumerate() {
            if k != key.as_bytes() {
                return Err(HostError::Shm(format!(
                    "rank {r} lays out its segment as {:?}, rank {me} as {key:?}: configure every rank alike",
                    String::from_utf8_lossy(k)
                )));
            }
        }
        let deadline = Instant::now() + boot.limit();
        let (mine, fd) = Segment::create(lay.total, me)?;
        for p in (0..n as u32).filter(|&p| p != me) {
            boot.mailbox().send(p, SEG_TAG, &[fd.as_fd()], deadline)?;
        }
        drop(fd);
        let mut segs = Vec::with_capacity(n);
        let mut mine = Some(mine);
        for p in 0..n as u32 {
            if p == me {
                segs.push(Arc::new(mine.take().expect("own segment")));
                continue;
            }
            let fds = boot.mailbox().recv(p, SEG_TAG, deadline)?;
            let fd = fds
                .first()
                .ok_or_else(|| HostError::Shm(format!("rank {p} sent no segment")))?;
            segs.push(Arc::new(Segment::map(fd, lay.total, me, p)?));
        }
        // Every peer has mapped ours before anyone writes into it.
        boot.barrier()?;
        Ok(Procs {
            me,
            lay,
            segs,
            heap: Mutex::new(Heap::new(lay.heap, lay.total)),
            pids: boot.descs().iter().map(|d| d.pid).collect(),
            dead: (0..n).map(|_| AtomicBool::new(false)).collect(),
            watcher: Mutex::new(None),
        })
    }

    /// Rank `me` of ranks whose segments (of layout `lay`) are already
    /// mapped here, with no bootstrap and no watcher: for the fuzz entry,
    /// which plays a peer writing into its segment.
    pub(crate) fn local(me: Rank, lay: Layout, segs: Vec<Arc<Segment>>) -> Procs {
        let n = segs.len();
        Procs {
            me,
            lay,
            segs,
            heap: Mutex::new(Heap::new(lay.heap, lay.total)),
            pids: vec![std::process::id(); n],
            dead: (0..n).map(|_| AtomicBool::new(false)).collect(),
            watcher: Mutex::new(None),
        }
    }

    /// The segments' layout.
    pub(crate) fn layout(&self) -> Layout {
        self.lay
    }

    /// `r`'s segment as mapped in this process.
    pub(crate) fn segment(&self, r: Rank) -> &Segment {
        &self.segs[r as usize]
    }

    /// Starts the thread that watches peers' processes: `lost(rank, pid)`
    /// runs for each that exits (the fabric fails, naming the first).
    pub fn watch(&self, lost: impl Fn(Rank, u32) + Send + 'static) -> Result<(), HostError> {
        let peers = (0..self.pids.len() as u32)
            .filter(|&r| r != self.me)
            .map(|r| (r, self.pids[r as usize]))
            .collect();
        let w = PeerWatch::start_pids(self.me, peers, lost)
            .map_err(|e| HostError::Shm(e.to_string()))?;
        *self.watcher.lock() = Some(w);
        Ok(())
    }

    pub fn global(&self) -> &GlobalCtl {
        // SAFETY: offset 0 of every segment holds a GlobalCtl (rank 0's is used).
        unsafe { self.segs[0].at(0) }
    }

    pub fn rank(&self, r: Rank) -> &RankCtl {
        // SAFETY: RANK_CTL of every segment holds its owner's RankCtl.
        unsafe { self.segs[r as usize].at(RANK_CTL) }
    }

    pub fn is_dead(&self, r: Rank) -> bool {
        self.dead[r as usize].load(Ordering::Acquire)
    }

    pub fn mark_dead(&self, r: Rank) {
        self.dead[r as usize].store(true, Ordering::Release);
    }

    pub fn pid(&self, r: Rank) -> u32 {
        self.pids[r as usize]
    }

    /// The link `(channel, from, to)`: in `to`'s segment.
    pub fn link(&self, channel: usize, from: Rank, to: Rank) -> Result<Link, HostError> {
        if channel >= MAX_CHANNELS {
            return Err(HostError::InvalidPlan(format!(
                "channel {channel}: at most {MAX_CHANNELS} channels across processes"
            )));
        }
        let seg = &self.segs[to as usize];
        let off = self.lay.link(channel, from as usize);
        // SAFETY: the layout gives each (channel, sender) its own link
        // area inside the receiver's segment, equal in every process
        // (checked at setup): counters, `slots` lengths, then the slots.
        unsafe {
            Ok(Link::mapped(
                seg.clone(),
                seg.at::<LinkCtr>(off),
                seg.at(self.lay.link_lens(off)),
                seg.base().add(self.lay.link_slots(off)),
                self.lay.slots,
                self.lay.stride,
            ))
        }
    }

    /// Publishes this rank's buffers of call `call` (addresses in this
    /// process) as offsets into its segment, for peers' remote steps.
    pub fn publish(&self, call: u64, bufs: &[(usize, usize)], elem: usize) {
        let ctl = self.rank(self.me);
        let base = self.segs[self.me as usize].base() as usize;
        let heap = self.heap.lock();
        for (i, &(addr, len)) in bufs.iter().take(MAX_PUB).enumerate() {
            let off = addr.wrapping_sub(base);
            let shared = addr >= base && heap.contains(off, (len * elem).max(1));
            ctl.pub_bufs[i][0].store(if shared { off as u64 + 1 } else { 0 }, Ordering::Relaxed);
            ctl.pub_bufs[i][1].store(len as u64, Ordering::Relaxed);
        }
        ctl.pub_n
            .store(bufs.len().min(MAX_PUB) as u32, Ordering::Relaxed);
        ctl.pub_call.store(call, Ordering::Release);
    }

    /// Address in this process of `peer`'s elements that `a` names. What
    /// the peer published is checked before use: a count of buffers above
    /// [`MAX_PUB`], or a buffer reaching outside the peer's heap or
    /// misaligned, is [`RemoteFault::Corrupt`].
    pub fn remote(&self, peer: Rank, a: &RemoteAccess) -> Result<usize, RemoteFault> {
        let ctl = self.rank(peer);
        let buf = a.buf;
        a.resolve(ctl.pub_call.load(Ordering::Acquire), || {
            let n = ctl.pub_n.load(Ordering::Relaxed) as usize;
            if n > MAX_PUB {
                return Err(RemoteFault::Corrupt(format!(
                    "it claims {n} published buffers (at most {MAX_PUB})"
                )));
            }
            if buf >= n {
                return Err(RemoteFault::Plan(format!(
                    "remote buffer {buf} was not published"
                )));
            }
            let at = ctl.pub_bufs[buf][0].load(Ordering::Relaxed);
            let blen = ctl.pub_bufs[buf][1].load(Ordering::Relaxed);
            if at == 0 {
                return Err(RemoteFault::Plan(format!(
                    "the peer's buffer {buf} is not in shared memory: across processes, direct plans need buffers from Communicator::alloc"
                )));
            }
            let off = self.heap_range(at - 1, blen, a.elem).ok_or_else(|| {
                RemoteFault::Corrupt(format!(
                    "its buffer {buf} is published as {blen} elements of {} bytes at byte {} of its segment, outside its heap (bytes {}..{}) or misaligned",
                    a.elem,
                    at - 1,
                    self.lay.heap,
                    self.lay.total
                ))
            })?;
            Ok((self.segs[peer as usize].base() as usize + off, blen as usize))
        })
    }

    /// `off` as an offset of a segment, if `len` elements of `elem` bytes
    /// from there lie inside the heap of a segment of this layout, aligned
    /// for the element type.
    fn heap_range(&self, off: u64, len: u64, elem: usize) -> Option<usize> {
        let off = usize::try_from(off).ok()?;
        let bytes = usize::try_from(len).ok()?.checked_mul(elem)?;
        let end = off.checked_add(bytes)?;
        let aligned = !elem.is_power_of_two() || off % elem == 0;
        (off >= self.lay.heap && end <= self.lay.total && aligned).then_some(off)
    }

    /// Rings `r`'s doorbell; wakes it if it sleeps.
    pub fn wake(&self, r: Rank) {
        let ctl = self.rank(r);
        ctl.doorbell.fetch_add(1, Ordering::SeqCst);
        if ctl.sleeping.load(Ordering::SeqCst) != 0 {
            let _ = futex::wake(&ctl.doorbell, futex::Flags::empty(), i32::MAX as u32);
        }
    }

    /// This rank's doorbell, read before looking for work.
    pub fn arm(&self) -> u32 {
        self.rank(self.me).doorbell.load(Ordering::SeqCst)
    }

    /// Sleeps until the doorbell moves from `seen` or `timeout` passes.
    pub fn park(&self, seen: u32, timeout: Duration) {
        let ctl = self.rank(self.me);
        ctl.sleeping.store(1, Ordering::SeqCst);
        if ctl.doorbell.load(Ordering::SeqCst) == seen {
            let _ = futex::wait(
                &ctl.doorbell,
                futex::Flags::empty(),
                seen,
                Some(&ts(timeout)),
            );
        }
        ctl.sleeping.store(0, Ordering::SeqCst);
    }

    /// Records the first failure's reason and marks every rank failed.
    pub fn fail(&self, reason: &str) {
        let g = self.global();
        g.record_reason(reason);
        g.broken.store(1, Ordering::Release);
        for r in 0..self.segs.len() as Rank {
            self.wake(r);
        }
    }

    pub fn is_broken(&self) -> bool {
        self.global().broken.load(Ordering::Acquire) != 0
    }

    /// The first failure's reason, once written.
    pub fn reason(&self) -> String {
        self.global()
            .recorded_reason(REASON_WRITE_WAIT)
            .unwrap_or_else(|| "a peer failed".into())
    }

    /// Shared memory of this rank that peers can address.
    pub fn alloc(&self, bytes: usize) -> Result<usize, HostError> {
        let off = self.heap.lock().alloc(bytes).ok_or_else(|| {
            HostError::Shm(format!(
                "out of shared memory: {bytes} bytes asked, the heap holds {} (HostConfig::shm_heap_bytes)",
                self.lay.total - self.lay.heap
            ))
        })?;
        Ok(self.segs[self.me as usize].base() as usize + off)
    }

    /// Frees memory from [`Procs::alloc`] (its pages go back to the system).
    pub fn free(&self, addr: usize) {
        let seg = &self.segs[self.me as usize];
        let off = addr.wrapping_sub(seg.base() as usize);
        if let Some(len) = self.heap.lock().free(off) {
            seg.punch(off, len);
        }
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        // Stops the watcher (joined unless this is the watcher itself).
        drop(self.watcher.lock().take());
    }
}
