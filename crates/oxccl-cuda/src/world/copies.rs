//! Copy-engine execution of copy-only plans (the `ce` algorithm): every
//! transfer of a rank's plan issued as one `cuMemcpyAsync` on the rank's
//! stream, the ranks ordered by stream memory operations on flag words,
//! and no kernel launched.
//!
//! **Which plans.** [`copy_list`] accepts a rank plan whose every
//! transfer has one source, an input (this rank's or a peer's), and one
//! destination, an output, with no FIFO operand, no swap, no pre- or
//! post-operation and no scratch buffer. Inputs are read only, so no
//! copy reads what another copy of the call writes, and one barrier
//! before all copies and one after them order everything the plan's own
//! signals and waits did (those are dropped). In place, a copy whose
//! source is its destination (the rank's own block) is skipped; one
//! whose ranges overlap otherwise is refused. The facade asks for this
//! only for plans of `Algo::CopyEngine`; the staged in-place AllToAll
//! (through scratch) is not accepted and runs on the executor.
//!
//! **Which cliques** ([`World::copies_usable`]): ranks as threads of this
//! process (peers' buffer addresses are exchanged between their threads
//! per call), each calling from its own thread (the launch gate exists),
//! and no more streams on a device than hardware queues (a stream waiting
//! on a flag blocks its queue; a peer's stream behind it in the same
//! queue could never write the flag). Otherwise the plan runs on the
//! executor kernel as before, with a debug line; results never differ.
//!
//! **Ordering.** Three flag words per rank, `A`, `B`, `C`, in host-mapped
//! memory every device of the clique maps (so ranks on several GPUs of
//! the process see them, and nothing is allocated per call). Each call
//! enqueues, on rank r's stream ([`CALL`]):
//!
//! 1. `A[r] = 1`, wait until `A[p] ≥ 1` for every peer p, `C[r] = 0`
//!    (every rank's earlier work on its buffers is done: inputs are ready
//!    and outputs may be written);
//! 2. the copies;
//! 3. `B[r] = 1`, wait for every `B[p]`, `A[r] = 0` (every rank's copies
//!    are done: nobody still reads or writes r's buffers);
//! 4. `C[r] = 1`, wait for every `C[p]`, `B[r] = 0`.
//!
//! The values are constants, so a captured graph replays the same
//! sequence and stays right: every flag goes back to 0 before any rank
//! can wait on it again. `A[r]` is cleared only once every peer passed
//! its A-wait (they wrote `B`), `B[r]` once every peer passed its B-wait
//! (they wrote `C`), and `C[r]` at the next call once every peer passed
//! its C-wait (they wrote the next `A`). A peer cannot see a stale 1:
//! each clear is stored, behind the write fence of the next flag write,
//! before the flag that lets a peer reach the wait it would fool.
//! Stream writes fence before storing (the driver's default), so the
//! copies are visible before `B`.
//!
//! **Addresses.** A copy names buffers by `(rank, buffer)`; at each call
//! every rank hands its buffer addresses to an [`AddrExchange`] and takes its
//! peers' (a rendezvous of the ranks' threads, with the clique's
//! deadline), before anything is enqueued, so either every rank enqueues
//! its whole sequence or none does. Under graph capture the addresses of
//! the captured call are baked into the graph, as the executor's are.
//!
//! **Limits.** A stream waiting on a flag has no deadline: were a rank to
//! fail between the rendezvous and the end of its enqueueing, its peers'
//! streams would wait for good (it still enqueues its flag writes, in
//! order, after a failed copy, so only a failing stream operation itself
//! can cause that). Whether the driver runs a same-device copy on a copy
//! engine or on an internal kernel is the driver's choice.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use std::sync::atomic::Ordering;

use oxccl_core::plan::{BufId, BufRole, Dst, Loc, RankPlan, Src, Step};
use oxccl_core::{Awaited, FaultCause, WaitFault};

use crate::error::{CudaError, Result};

use super::{lock, Prepared, World};

/// One end of a copy: a rank's plan buffer and an element offset in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct End {
    pub rank: u32,
    pub buf: usize,
    pub off: usize,
}

/// One copy of a rank's plan, in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Copy {
    pub src: End,
    pub dst: End,
    pub len: usize,
}

/// The copies of `rp` if it is a copy-only plan (module docs), merged
/// where one continues another (pieces split one transfer into many);
/// `None` otherwise. Empty copies are dropped. The plan's signals and
/// waits are dropped too: every copy reads an input, which no copy of
/// the call writes, so the barriers around all copies order everything.
pub fn copy_list(rp: &RankPlan) -> Option<Vec<Copy>> {
    if rp
        .bufs
        .iter()
        .any(|b| b.role == BufRole::Scratch && b.len > 0)
    {
        return None;
    }
    let role = |buf: BufId| rp.bufs.get(buf.0 as usize).map(|b| b.role);
    let me = rp.rank;
    let mut copies = Vec::new();
    for step in rp.channels.iter().flat_map(|c| &c.steps) {
        let x = match step {
            Step::Signal { .. } | Step::Wait { .. } => continue,
            Step::Swap { .. } => return None,
            Step::Xfer(x) => x,
        };
        let ([src], [dst], false) = (x.srcs.as_slice(), x.dsts.as_slice(), x.post) else {
            return None;
        };
        let src = match *src {
            Src::Local { at, pre: false } => (me, at),
            Src::Remote {
                peer,
                at,
                pre: false,
            } => (peer, at),
            _ => return None,
        };
        let dst = match *dst {
            Dst::Local(at) => (me, at),
            Dst::Remote { peer, at } => (peer, at),
            Dst::Send { .. } => return None,
        };
        // Every rank of a collective declares the same buffers, so the
        // roles of this plan's are the peers' too.
        if role(src.1.buf) != Some(BufRole::Input) || role(dst.1.buf) != Some(BufRole::Output) {
            return None;
        }
        let end = |(rank, at): (u32, Loc)| End {
            rank,
            buf: at.buf.0 as usize,
            off: at.off,
        };
        if x.len > 0 {
            copies.push(Copy {
                src: end(src),
                dst: end(dst),
                len: x.len,
            });
        }
    }
    Some(merge(copies))
}

/// Joins copies that continue one another (same buffers, both ends
/// contiguous), so a transfer split over channels and pieces is one copy.
fn merge(mut copies: Vec<Copy>) -> Vec<Copy> {
    copies.sort_by_key(|c| (c.src.rank, c.src.buf, c.dst.rank, c.dst.buf, c.dst.off));
    let mut out: Vec<Copy> = Vec::with_capacity(copies.len());
    for c in copies {
        if let Some(last) = out.last_mut() {
            let same = (last.src.rank, last.src.buf, last.dst.rank, last.dst.buf)
                == (c.src.rank, c.src.buf, c.dst.rank, c.dst.buf);
            if same && last.src.off + last.len == c.src.off && last.dst.off + last.len == c.dst.off
            {
                last.len += c.len;
                continue;
            }
        }
        out.push(c);
    }
    out
}

/// The per-call exchange of buffer addresses between the ranks' threads.
#[derive(Debug, Default)]
pub(super) struct AddrExchange {
    rounds: Mutex<Rounds>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct Rounds {
    /// Copy-engine calls made so far, per rank.
    calls: Vec<u64>,
    /// Calls some rank has joined and not every rank has read.
    open: HashMap<u64, Round>,
}

#[derive(Debug)]
struct Round {
    bases: Vec<Option<Vec<u64>>>,
    read: usize,
}

/// Why an exchange did not complete.
#[derive(Debug)]
pub(super) enum Missed {
    /// The clique failed or was aborted meanwhile.
    Failed,
    /// The deadline passed; these ranks never joined.
    Absent(Vec<u32>, Duration),
}

impl AddrExchange {
    /// Joins `rank`'s next copy-engine call with its buffer bases `mine`
    /// and returns every rank's (indexed by rank) once all `n` joined the
    /// same call.
    pub(super) fn swap(
        &self,
        rank: u32,
        n: usize,
        mine: Vec<u64>,
        deadline: Option<Duration>,
        failed: impl Fn() -> bool,
    ) -> std::result::Result<Vec<Vec<u64>>, Missed> {
        let r = rank as usize;
        let mut g = lock(&self.rounds);
        if g.calls.len() < n {
            g.calls.resize(n, 0);
        }
        let k = g.calls[r];
        g.calls[r] += 1;
        g.open
            .entry(k)
            .or_insert_with(|| Round {
                bases: vec![None; n],
                read: 0,
            })
            .bases[r] = Some(mine);
        self.cv.notify_all();
        let start = Instant::now();
        loop {
            let Some(round) = g.open.get_mut(&k) else {
                // Only the last reader removes a round, and this rank has
                // not read it.
                return Err(Missed::Failed);
            };
            if round.bases.iter().all(Option::is_some) {
                let all: Vec<Vec<u64>> = round.bases.iter().flatten().cloned().collect();
                round.read += 1;
                if round.read == n {
                    g.open.remove(&k);
                }
                return Ok(all);
            }
            if failed() {
                return Err(Missed::Failed);
            }
            let waited = start.elapsed();
            if deadline.is_some_and(|d| waited >= d) {
                let absent = round
                    .bases
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| b.is_none())
                    .map(|(q, _)| q as u32)
                    .collect();
                return Err(Missed::Absent(absent, waited));
            }
            // A bounded sleep, so a failure or the deadline is noticed.
            g = self
                .cv
                .wait_timeout(g, Duration::from_millis(10))
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }
}

/// One operation of a rank's copy-engine call on its stream: a store to
/// one of its own flags (0 = A, 1 = B, 2 = C), a wait until that flag of
/// every peer is at least 1, or the copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Op {
    Set(usize, u32),
    WaitPeers(usize),
    Copies,
}

/// The sequence every rank enqueues per call (module docs): the same
/// constants every time, so a captured graph's replay is the same call.
pub(super) const CALL: [Op; 10] = [
    Op::Set(0, 1),
    Op::WaitPeers(0),
    Op::Set(2, 0),
    Op::Copies,
    Op::Set(1, 1),
    Op::WaitPeers(1),
    Op::Set(0, 0),
    Op::Set(2, 1),
    Op::WaitPeers(2),
    Op::Set(1, 0),
];

/// The device addresses of `rank`'s three flags in a flag area of
/// `n` ranks starting at `base`: `[A, B, C]`.
pub(super) fn flags(base: u64, n: usize, rank: usize) -> [u64; 3] {
    [0, 1, 2].map(|k| base + 4 * (k * n + rank) as u64)
}

/// Bytes of the flag area of `n` ranks.
pub(super) fn flag_bytes(n: usize) -> usize {
    3 * 4 * n.max(1)
}

/// The byte address of `e` given every rank's buffer bases.
pub(super) fn address(bases: &[Vec<u64>], e: End, elem: usize) -> Result<u64> {
    let base = bases
        .get(e.rank as usize)
        .and_then(|b| b.get(e.buf))
        .copied()
        .filter(|&a| a != 0)
        .ok_or_else(|| {
            CudaError::Invalid(format!(
                "copy-engine plan names buffer {} of rank {}, which the call did not provide",
                e.buf, e.rank
            ))
        })?;
    Ok(base + (e.off * elem) as u64)
}

impl World {
    /// Whether this clique runs copy-only plans on the copy engines
    /// (module docs: ranks as threads, each on its own thread, every
    /// stream its own hardware queue).
    pub fn copy_engine_usable(&self) -> bool {
        self.copy_flags.is_some()
    }

    /// Executor kernels this process enqueued so far, all ranks together.
    pub fn kernel_launches(&self) -> u64 {
        self.kernel_launches.load(Ordering::Relaxed)
    }

    /// Calls this process ran as copies on the copy engines so far, all
    /// ranks together.
    pub fn copy_engine_calls(&self) -> u64 {
        self.copy_calls.load(Ordering::Relaxed)
    }

    /// `rp`'s copies where it runs on the copy engines here, else `None`
    /// with a debug line saying why.
    pub(super) fn copies_for(&self, rp: &RankPlan) -> Option<Vec<Copy>> {
        let why = if self.copy_flags.is_none() {
            "this clique cannot order copies without the executor (ranks as processes, \
             launches not gated, more streams than hardware queues on a device, or \
             relaunch mode)"
        } else {
            match copy_list(rp) {
                Some(c) => return Some(c),
                None => "the plan is not copy-only (FIFO, scratch staging or a mid-plan barrier)",
            }
        };
        tracing::debug!(
            rank = rp.rank,
            "oxccl: copy-engine plan runs on the executor: {why}"
        );
        None
    }

    /// Enqueues `rank`'s copies of `p` on its stream between the flag
    /// barriers (module docs), after exchanging buffer addresses with the
    /// peers' threads. `bufs`: the rank's plan buffers (addresses as the
    /// launch got them; scratch entries unused, a copy-only plan has
    /// none).
    ///
    /// # Safety
    /// As [`World::launch`]: every buffer a copy names, this rank's and
    /// (through the exchange) its peers', must be valid memory reachable
    /// from the rank's device for the plan's length until the stream
    /// passes the copies.
    pub(super) unsafe fn run_copies(
        &self,
        p: &Prepared,
        copies: &[Copy],
        rank: u32,
        bufs: &[u64],
    ) -> Result<()> {
        let st = self.rank(rank)?;
        let area = self
            .copy_flags
            .as_ref()
            .ok_or_else(|| CudaError::Invalid("no copy-engine flags in this clique".into()))?;
        let n = self.ranks.len();
        let mine: Vec<u64> = bufs
            .iter()
            .zip(&p.scratch_offsets)
            .map(|(&a, o)| if o.is_some() { 0 } else { self.tagged(a) })
            .collect();
        let deadline = (self.cfg.timeout != Duration::MAX).then_some(self.cfg.timeout);
        let all = self
            .addrs
            .swap(rank, n, mine, deadline, || self.failed())
            .map_err(|m| match m {
                Missed::Failed => self.failure().unwrap_or(CudaError::Aborted),
                Missed::Absent(absent, waited) => CudaError::Wait(WaitFault {
                    cause: FaultCause::Deadline,
                    rank,
                    peer: absent.first().copied().unwrap_or(rank),
                    channel: 0,
                    step: 0,
                    awaited: Awaited::Unknown,
                    waited,
                    absent,
                }),
            })?;
        // From here every rank enqueues its whole flag sequence, whatever
        // fails, so no peer's stream waits on a flag never written.
        let elem = p.elem_size;
        let resolved: Result<Vec<(u64, u64, usize)>> = copies
            .iter()
            .map(|c| {
                let (dst, src) = (address(&all, c.dst, elem)?, address(&all, c.src, elem)?);
                let bytes = c.len * elem;
                if dst != src && dst < src + bytes as u64 && src < dst + bytes as u64 {
                    return Err(CudaError::Invalid(format!(
                        "copy-engine plan: a copy of {bytes} bytes from {src:#x} to {dst:#x} \
                         overlaps itself"
                    )));
                }
                Ok((dst, src, bytes))
            })
            .filter(|r| !matches!(r, Ok((d, s, _)) if d == s))
            .collect();
        let s = &st.stream;
        let own = |r: usize| flags(area.dev_ptr, n, r);
        let mine = own(rank as usize);
        let peers = (0..n).filter(|&q| q != rank as usize);
        let mut first: Option<CudaError> = None;
        let mut note = |r: Result<()>| {
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        };
        for op in CALL {
            match op {
                // SAFETY: the flag words lie in `area` (aligned,
                // host-mapped), which lives as long as the clique, longer
                // than any stream's use.
                Op::Set(f, v) => note(unsafe { s.write_value(mine[f], v) }),
                Op::WaitPeers(f) => {
                    for q in peers.clone() {
                        // SAFETY: as above.
                        note(unsafe { s.wait_value_geq(own(q)[f], 1) });
                    }
                }
                Op::Copies => match &resolved {
                    Ok(list) => {
                        for &(dst, src, bytes) in list {
                            // SAFETY: caller's contract (both ends are plan
                            // buffers of the call, reachable from here).
                            let r = unsafe { s.copy_async(dst, src, bytes) };
                            if r.is_err() {
                                note(r);
                                break;
                            }
                        }
                    }
                    Err(e) => note(Err(CudaError::Invalid(e.to_string()))),
                },
            }
        }
        match first {
            Some(e) => Err(e),
            None => {
                self.copy_calls.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl_core::gen::{generate, PlanRequest};
    use oxccl_core::{Algo, CollKind, Collective};

    fn plan(kind: CollKind, n: u32, in_place: bool, channels: u32) -> oxccl_core::plan::Plan {
        let mut req = PlanRequest::new(Collective::new(kind, 1000, n - 1), n, Algo::CopyEngine);
        req.registered = true;
        req.in_place = in_place;
        req.channels = channels;
        req.chunk = 96;
        generate(&req).expect("a copy-engine plan")
    }

    const KINDS: [CollKind; 5] = [
        CollKind::Broadcast,
        CollKind::AllGather,
        CollKind::Gather,
        CollKind::Scatter,
        CollKind::AllToAll,
    ];

    #[test]
    fn every_copy_engine_plan_but_the_staged_all_to_all_is_copy_only() {
        for kind in KINDS {
            for n in [1, 2, 3, 8] {
                for in_place in [false, true] {
                    for channels in [1, 3] {
                        let p = plan(kind, n, in_place, channels);
                        let staged = in_place && kind == CollKind::AllToAll && n > 1;
                        for rp in &p.ranks {
                            let got = copy_list(rp);
                            assert_eq!(got.is_none(), staged, "{kind} n={n} in_place={in_place}");
                        }
                    }
                }
            }
        }
    }

    /// Merging joins the pieces of a transfer (one copy per pair of
    /// buffers with one channel) and moves the same elements as the
    /// plan's transfers.
    #[test]
    fn merged_copies_cover_the_same_elements() {
        for kind in KINDS {
            for channels in [1, 3] {
                let p = plan(kind, 4, false, channels);
                for rp in &p.ranks {
                    let got = copy_list(rp).unwrap();
                    let moved: usize = rp
                        .channels
                        .iter()
                        .flat_map(|c| &c.steps)
                        .map(|s| match s {
                            Step::Xfer(x) => x.len,
                            _ => 0,
                        })
                        .sum();
                    assert_eq!(got.iter().map(|c| c.len).sum::<usize>(), moved, "{kind}");
                    if channels == 1 {
                        let pairs: std::collections::HashSet<_> = got
                            .iter()
                            .map(|c| (c.src.rank, c.src.buf, c.dst.rank, c.dst.buf))
                            .collect();
                        assert_eq!(pairs.len(), got.len(), "{kind}: {got:?}");
                    }
                }
            }
        }
    }

    /// Copies read only inputs and write only outputs, so no copy
    /// depends on another of the same call (what lets one barrier before
    /// and one after replace the plan's own ordering).
    #[test]
    fn copies_read_inputs_and_write_outputs() {
        for kind in KINDS {
            let p = plan(kind, 3, kind == CollKind::AllGather, 2);
            for rp in &p.ranks {
                for c in copy_list(rp).unwrap() {
                    assert_eq!(c.src.buf, BufId::INPUT.0 as usize, "{kind}");
                    assert_eq!(c.dst.buf, BufId::OUTPUT.0 as usize, "{kind}");
                }
            }
        }
    }

    #[test]
    fn plans_with_fifo_or_reductions_are_not_copy_only() {
        let mut req =
            PlanRequest::new(Collective::new(CollKind::AllGather, 1000, 0), 4, Algo::Ring);
        req.channels = 2;
        let p = generate(&req).unwrap();
        assert!(p.ranks.iter().all(|rp| copy_list(rp).is_none()));
        let mut req = PlanRequest::new(
            Collective::new(CollKind::ReduceScatter, 1000, 0),
            4,
            Algo::AllPairs,
        );
        req.registered = true;
        let p = generate(&req).unwrap();
        assert!(p.ranks.iter().all(|rp| copy_list(rp).is_none()));
    }

    #[test]
    fn exchange_hands_every_rank_every_base() {
        let x = std::sync::Arc::new(AddrExchange::default());
        for call in 0..3u64 {
            let got: Vec<_> = (0..4u32)
                .map(|r| {
                    let x = x.clone();
                    std::thread::spawn(move || {
                        x.swap(r, 4, vec![u64::from(r) * 10 + call], None, || false)
                            .unwrap()
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect();
            for all in got {
                assert_eq!(all, (0..4).map(|r| vec![r * 10 + call]).collect::<Vec<_>>());
            }
        }
        assert!(lock(&x.rounds).open.is_empty());
    }

    #[test]
    fn exchange_names_absent_ranks_at_the_deadline() {
        let x = AddrExchange::default();
        match x.swap(1, 3, vec![1], Some(Duration::from_millis(30)), || false) {
            Err(Missed::Absent(absent, _)) => assert_eq!(absent, vec![0, 2]),
            other => panic!("{other:?}"),
        }
    }

    /// The flag protocol of [`CALL`] with ranks as threads and flags as
    /// atomics (a stream runs its operations in order, a store fenced
    /// after everything before it, as the driver's default stream stores
    /// are): over many calls with random delays, a rank copies in call k
    /// only once every rank has finished call k−1's copies and started
    /// call k (its earlier work on its buffers is done), and leaves call k
    /// only once every rank finished call k's copies. A flag left at 1, or
    /// cleared too early, would break one of those or hang (a wait of
    /// more than 10 s fails).
    #[test]
    fn the_flag_protocol_orders_calls_repeated_with_the_same_values() {
        use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};
        const N: usize = 4;
        const CALLS: u64 = 300;
        let flags: Vec<AtomicU32> = (0..3 * N).map(|_| AtomicU32::new(0)).collect();
        let started: Vec<AtomicU64> = (0..N).map(|_| AtomicU64::new(0)).collect();
        let copied: Vec<AtomicU64> = (0..N).map(|_| AtomicU64::new(0)).collect();
        std::thread::scope(|sc| {
            for r in 0..N {
                let (flags, started, copied) = (&flags, &started, &copied);
                sc.spawn(move || {
                    let mut seed = r as u64 * 7919 + 1;
                    let mut jitter = || {
                        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                        for _ in 0..(seed >> 60) {
                            std::thread::yield_now();
                        }
                    };
                    for k in 1..=CALLS {
                        started[r].store(k, SeqCst);
                        for op in CALL {
                            jitter();
                            match op {
                                Op::Set(f, v) => flags[f * N + r].store(v, SeqCst),
                                Op::WaitPeers(f) => {
                                    for q in (0..N).filter(|&q| q != r) {
                                        let t0 = Instant::now();
                                        while flags[f * N + q].load(SeqCst) < 1 {
                                            // A protocol that deadlocks fails
                                            // (and so does a peer that panicked).
                                            assert!(t0.elapsed().as_secs() < 10, "hung");
                                            std::thread::yield_now();
                                        }
                                    }
                                    if f == 1 {
                                        for c in copied {
                                            assert!(c.load(SeqCst) >= k, "left early");
                                        }
                                    }
                                }
                                Op::Copies => {
                                    for (st, c) in started.iter().zip(copied) {
                                        assert!(st.load(SeqCst) >= k, "copied early");
                                        assert!(c.load(SeqCst) >= k - 1, "overlap");
                                    }
                                    copied[r].store(k, SeqCst);
                                }
                            }
                        }
                    }
                });
            }
        });
        assert!(copied.iter().all(|c| c.load(SeqCst) == CALLS));
    }

    #[test]
    fn flags_do_not_overlap() {
        let n = 5;
        let mut all: Vec<u64> = (0..n).flat_map(|r| flags(0, n, r)).collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 3 * n);
        assert!(all
            .iter()
            .all(|&a| a + 4 <= flag_bytes(n) as u64 && a % 4 == 0));
    }

    #[test]
    fn addresses_refuse_missing_buffers() {
        let bases = vec![vec![0x1000, 0x2000], vec![0x3000, 0]];
        let e = |rank, buf, off| End { rank, buf, off };
        assert_eq!(address(&bases, e(0, 1, 3), 4).unwrap(), 0x200c);
        assert!(address(&bases, e(1, 1, 0), 4).is_err());
        assert!(address(&bases, e(2, 0, 0), 4).is_err());
    }
}
