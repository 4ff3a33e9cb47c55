//! The reference interpreter, which is also the plan checker.
//!
//! It runs every rank's plan in one thread, one step at a time, under a
//! scheduler that picks any runnable `(rank, channel)` (the order is seeded,
//! so tests explore different interleavings). Connections hold at most
//! `fifo_depth` messages, so a plan that would deadlock on a real backend
//! deadlocks here too and is reported. While it runs it checks the IR's
//! invariants: matching message lengths, in-bounds slices, no read of
//! unwritten scratch or output, every `must_write` output written.

use std::collections::{HashMap, VecDeque};

use crate::element::Element;
use crate::error::CoreError;
use crate::plan::{BufDecl, BufId, BufRole, Dst, Loc, Plan, Rank, Src, Step, Xfer};
use crate::race::Race;
use crate::redop::LoweredOp;

/// Where a plan buffer lives in a rank's memory: arena and offset. Two
/// buffers may share an arena (in-place calls).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct View {
    pub arena: usize,
    pub off: usize,
    pub len: usize,
}

/// One rank's memory: arenas of elements, and where each plan buffer is.
#[derive(Clone, Debug)]
pub struct RankMem<T> {
    pub arenas: Vec<Vec<T>>,
    pub views: Vec<View>,
    /// Per arena, which elements hold defined values.
    pub written: Vec<Vec<bool>>,
}

/// Memory for every rank of `plan`, inputs from `inputs[rank]`. With
/// `in_place`, input and output overlap as the plan's collective defines
/// (groups without a collective overlap at offset 0).
pub fn memories<T: Element>(plan: &Plan, inputs: &[Vec<T>], in_place: bool) -> Vec<RankMem<T>> {
    plan.ranks
        .iter()
        .zip(inputs)
        .map(|(rp, input)| {
            let offsets = match (in_place, plan.coll) {
                (true, Some(c)) => Some(c.in_place_offsets(rp.rank)),
                (true, None) => Some((0, 0)),
                (false, _) => None,
            };
            RankMem::new(&rp.bufs, input, offsets)
        })
        .collect()
}

impl<T: Element> RankMem<T> {
    /// Builds memory for a plan's buffers of one rank: inputs filled from
    /// `input`, outputs zeroed (but not "written"), scratch undefined. With
    /// `in_place`, the smaller of input and output is placed inside the
    /// larger at the offsets `Collective::in_place_offsets` gives.
    pub fn new(bufs: &[BufDecl], input: &[T], in_place: Option<(usize, usize)>) -> Self {
        let idx = |role| bufs.iter().position(|b| b.role == role);
        // With in_place, the smaller of input/output is placed inside the other.
        let alias = match (in_place, idx(BufRole::Input), idx(BufRole::Output)) {
            (Some((in_off, out_off)), Some(ii), Some(io)) => {
                if bufs[ii].len <= bufs[io].len {
                    Some((ii, io, in_off))
                } else {
                    Some((io, ii, out_off))
                }
            }
            _ => None,
        };
        let mut arenas = Vec::new();
        let mut views = vec![
            View {
                arena: 0,
                off: 0,
                len: 0
            };
            bufs.len()
        ];
        let mut written = Vec::new();
        for (i, b) in bufs.iter().enumerate() {
            if alias.is_some_and(|(guest, _, _)| guest == i) {
                continue;
            }
            let mut data = vec![T::default(); b.len];
            if b.role == BufRole::Input {
                let k = input.len().min(b.len);
                data[..k].copy_from_slice(&input[..k]);
            }
            written.push(vec![b.role == BufRole::Input; b.len]);
            arenas.push(data);
            views[i] = View {
                arena: arenas.len() - 1,
                off: 0,
                len: b.len,
            };
        }
        if let Some((guest, host, off)) = alias {
            let len = bufs[guest].len;
            let arena = views[host].arena;
            views[guest] = View { arena, off, len };
            if bufs[guest].role == BufRole::Input {
                let k = input.len().min(len);
                arenas[arena][off..off + k].copy_from_slice(&input[..k]);
                written[arena][off..off + len].fill(true);
            }
        }
        RankMem {
            arenas,
            views,
            written,
        }
    }

    /// Writes `data` at the start of buffer `buf` and marks it defined
    /// (tests with several inputs, such as Send/Recv groups).
    pub fn write_buf(&mut self, buf: BufId, data: &[T]) {
        let v = self.views[buf.0 as usize];
        let k = data.len().min(v.len);
        self.arenas[v.arena][v.off..v.off + k].copy_from_slice(&data[..k]);
        self.written[v.arena][v.off..v.off + k].fill(true);
    }

    /// A copy of a buffer's contents.
    pub fn read_buf(&self, buf: BufId) -> Vec<T> {
        let v = self.views[buf.0 as usize];
        self.arenas[v.arena][v.off..v.off + v.len].to_vec()
    }
}

/// The fewest message slots a backend may give a connection. A step that
/// receives and forwards (recv_reduce_send) holds the message it forwards
/// while its peer still holds the previous one, so rings need two; plans are
/// checked at this depth, so any backend with at least this many is safe.
pub const MIN_FIFO_DEPTH: usize = 2;

/// Bytes per message slot a backend gives a connection unless configured
/// otherwise (the host backend's FIFO and the CUDA world's): large enough
/// that a message's fixed cost is small beside its copy, small enough
/// that a few slots per connection stay cheap.
pub const DEFAULT_SLOT_BYTES: usize = 512 << 10;

/// Interpreter options.
#[derive(Clone, Copy, Debug)]
pub struct InterpOptions {
    /// Messages a connection holds before its sender blocks. Defaults to
    /// [`MIN_FIFO_DEPTH`], the strictest depth backends are allowed.
    pub fifo_depth: usize,
    /// Seed for the scheduling order.
    pub seed: u64,
}

impl Default for InterpOptions {
    fn default() -> Self {
        InterpOptions {
            fifo_depth: MIN_FIFO_DEPTH,
            seed: 0,
        }
    }
}

/// What a run did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InterpStats {
    pub steps: usize,
    pub messages: usize,
    pub elements_sent: usize,
}

type ConnKey = (usize, Rank, Rank);

fn err(msg: String) -> CoreError {
    CoreError::PlanCheck(msg)
}

/// Runs `plan` on `mem` (one entry per rank) with `op`.
pub fn run<T: Element>(
    plan: &Plan,
    mem: &mut [RankMem<T>],
    op: &LoweredOp,
    opts: &InterpOptions,
) -> Result<InterpStats, CoreError> {
    run_inner(plan, mem, op, opts, None)
}

/// Seeds the checker runs each plan under (the first also with race
/// detection).
const CHECK_SEEDS: [u64; 3] = [0, 1, 0x5EED];

/// Checks `plan` for buffers laid out out of place (input and output
/// separate): runs it symbolically under several schedules at the minimum
/// FIFO depth, so it finds mismatched or missing messages, deadlocks,
/// out-of-bounds slices, reads of undefined scratch or output, outputs
/// never written, writes into inputs, and (through happens-before vector
/// clocks, see `race`) unordered accesses to one element, remote accesses
/// before the peer entered the call, and ranks that may finish while
/// peers still access their memory.
pub fn check(plan: &Plan) -> Result<(), CoreError> {
    check_layout(plan, false)
}

/// [`check`] for a plan generated for an in-place call: input and output
/// alias as [`crate::coll::Collective::in_place_offsets`] says.
pub fn check_in_place(plan: &Plan) -> Result<(), CoreError> {
    check_layout(plan, true)
}

fn check_layout(plan: &Plan, in_place: bool) -> Result<(), CoreError> {
    let coll = match (in_place, plan.coll) {
        (false, c) => c,
        (true, Some(c)) => Some(c),
        (true, None) => return Err(err("an in-place check needs the plan's collective".into())),
    };
    let fresh = || -> Vec<RankMem<u8>> {
        plan.ranks
            .iter()
            .map(|rp| {
                let alias = coll
                    .filter(|_| in_place)
                    .map(|c| c.in_place_offsets(rp.rank));
                RankMem::new(&rp.bufs, &[], alias)
            })
            .collect()
    };
    let op = crate::redop::RedOp::Sum.lower(crate::DataType::U8, plan.nranks);
    for (i, seed) in CHECK_SEEDS.into_iter().enumerate() {
        let mut mem = fresh();
        let opts = InterpOptions {
            seed,
            ..InterpOptions::default()
        };
        let mut race = (i == 0).then(|| {
            let arenas: Vec<Vec<usize>> = mem
                .iter()
                .map(|m| m.arenas.iter().map(Vec::len).collect())
                .collect();
            Race::new(plan, &arenas)
        });
        run_inner(plan, &mut mem, &op, &opts, race.as_mut())?;
        if let Some(r) = &race {
            r.finish()?;
        }
    }
    Ok(())
}

fn run_inner<T: Element>(
    plan: &Plan,
    mem: &mut [RankMem<T>],
    op: &LoweredOp,
    opts: &InterpOptions,
    mut race: Option<&mut Race>,
) -> Result<InterpStats, CoreError> {
    let n = plan.nranks as usize;
    check_shapes(plan, mem)?;
    let mut pcs: Vec<Vec<usize>> = plan
        .ranks
        .iter()
        .map(|r| vec![0; r.channels.len()])
        .collect();
    let mut fifos: HashMap<ConnKey, VecDeque<Vec<T>>> = HashMap::new();
    let mut sems: HashMap<ConnKey, u64> = HashMap::new();
    let mut waits: HashMap<ConnKey, u64> = HashMap::new();
    let mut stats = InterpStats::default();
    let mut order: Vec<(usize, usize)> = plan
        .ranks
        .iter()
        .enumerate()
        .flat_map(|(r, rp)| (0..rp.channels.len()).map(move |c| (r, c)))
        .collect();
    let mut rng = opts.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    loop {
        // Shuffle the visiting order each sweep (xorshift: no dependency).
        for i in (1..order.len()).rev() {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            order.swap(i, (rng % (i as u64 + 1)) as usize);
        }
        let mut progressed = false;
        let mut done = true;
        for &(r, c) in &order {
            // Run this channel as far as it goes.
            loop {
                let steps = &plan.ranks[r].channels[c].steps;
                let pc = pcs[r][c];
                if pc >= steps.len() {
                    break;
                }
                let me = r as Rank;
                let step = &steps[pc];
                let ran = match step {
                    Step::Signal { peer } => {
                        check_peer(*peer, n, r, c, pc)?;
                        if let Some(race) = race.as_deref_mut() {
                            let t = race.thread(r, c);
                            race.tick(t);
                            race.signal((c, me, *peer), t);
                        }
                        *sems.entry((c, me, *peer)).or_default() += 1;
                        true
                    }
                    Step::Wait { peer } => {
                        check_peer(*peer, n, r, c, pc)?;
                        let posted = sems.get(&(c, *peer, me)).copied().unwrap_or(0);
                        let w = waits.entry((c, *peer, me)).or_default();
                        if posted > *w {
                            *w += 1;
                            if let Some(race) = race.as_deref_mut() {
                                let t = race.thread(r, c);
                                race.tick(t);
                                race.wait((c, *peer, me), t);
                            }
                            true
                        } else {
                            false
                        }
                    }
                    Step::Swap { peer, .. } => {
                        check_peer(*peer, n, r, c, pc)?;
                        let site = Site { r, c, pc };
                        exec_swap(plan, mem, site, step, race.as_deref_mut())?;
                        true
                    }
                    Step::Xfer(x) => {
                        let ready = xfer_ready(x, &fifos, opts.fifo_depth, Site { r, c, pc }, n)?;
                        if ready {
                            let at = Site { r, c, pc };
                            exec_xfer(
                                plan,
                                mem,
                                &mut fifos,
                                op,
                                at,
                                x,
                                &mut stats,
                                race.as_deref_mut(),
                            )?;
                        }
                        ready
                    }
                };
                if !ran {
                    break;
                }
                pcs[r][c] += 1;
                stats.steps += 1;
                progressed = true;
            }
            if pcs[r][c] < plan.ranks[r].channels[c].steps.len() {
                done = false;
            }
        }
        if done {
            break;
        }
        if !progressed {
            let blocked: Vec<String> = order
                .iter()
                .filter(|&&(r, c)| pcs[r][c] < plan.ranks[r].channels[c].steps.len())
                .take(8)
                .map(|&(r, c)| {
                    format!(
                        "rank {r} channel {c} step {}: {}",
                        pcs[r][c], plan.ranks[r].channels[c].steps[pcs[r][c]]
                    )
                })
                .collect();
            return Err(err(format!("deadlock; blocked: {}", blocked.join("; "))));
        }
    }
    check_drained(plan, mem, &fifos, &sems, &waits)?;
    Ok(stats)
}

/// The plan has one rank plan per rank, each numbered as it stands, and
/// `mem` one memory per rank with one view per declared buffer.
fn check_shapes<T: Element>(plan: &Plan, mem: &[RankMem<T>]) -> Result<(), CoreError> {
    let n = plan.nranks as usize;
    if plan.ranks.len() != n || mem.len() != n {
        return Err(err(format!(
            "plan has {} rank plans and {} memories for {} ranks",
            plan.ranks.len(),
            mem.len(),
            n
        )));
    }
    for (r, rp) in plan.ranks.iter().enumerate() {
        if rp.rank as usize != r || rp.nranks != plan.nranks {
            return Err(err(format!(
                "rank plan {r} says rank {} of {}",
                rp.rank, rp.nranks
            )));
        }
        if mem[r].views.len() != rp.bufs.len() {
            return Err(err(format!(
                "rank {r}: memory has {} buffers, plan {}",
                mem[r].views.len(),
                rp.bufs.len()
            )));
        }
    }
    Ok(())
}

/// Whether transfer `x` at `at` can run now: every receive has a message
/// of its length waiting and every send has room in its FIFO.
fn xfer_ready<T>(
    x: &Xfer,
    fifos: &HashMap<ConnKey, VecDeque<Vec<T>>>,
    fifo_depth: usize,
    at: Site,
    n: usize,
) -> Result<bool, CoreError> {
    let Site { r, c, pc } = at;
    let me = r as Rank;
    // Runnable when every recv has a message and every send has room.
    let mut ready = true;
    for s in &x.srcs {
        if let Src::Recv { peer } = s {
            check_peer(*peer, n, r, c, pc)?;
            match fifos.get(&(c, *peer, me)).and_then(|q| q.front()) {
                Some(m) if m.len() != x.len => {
                    return Err(err(format!(
                        "rank {r} channel {c} step {pc}: receives {} elements from {peer} but the message has {}",
                        x.len,
                        m.len()
                    )))
                }
                Some(_) => {}
                None => ready = false,
            }
        }
    }
    for d in &x.dsts {
        if let Dst::Send { peer } = d {
            check_peer(*peer, n, r, c, pc)?;
            if fifos
                .get(&(c, me, *peer))
                .is_some_and(|q| q.len() >= fifo_depth)
            {
                ready = false;
            }
        }
    }
    Ok(ready)
}

/// After the last step: every message was received, every signal waited
/// for, and every buffer that must be written was, element by element.
fn check_drained<T: Element>(
    plan: &Plan,
    mem: &[RankMem<T>],
    fifos: &HashMap<ConnKey, VecDeque<Vec<T>>>,
    sems: &HashMap<ConnKey, u64>,
    waits: &HashMap<ConnKey, u64>,
) -> Result<(), CoreError> {
    if let Some((k, q)) = fifos.iter().find(|(_, q)| !q.is_empty()) {
        return Err(err(format!(
            "{} unreceived message(s) on channel {} from rank {} to rank {}",
            q.len(),
            k.0,
            k.1,
            k.2
        )));
    }
    for ((c, from, to), posted) in sems {
        let consumed = waits.get(&(*c, *from, *to)).copied().unwrap_or(0);
        if consumed != *posted {
            return Err(err(format!(
                "channel {c}: {posted} signals from {from} to {to} but {consumed} waits"
            )));
        }
    }
    for (r, rp) in plan.ranks.iter().enumerate() {
        for (b, decl) in rp.bufs.iter().enumerate() {
            if decl.must_write {
                let v = mem[r].views[b];
                if let Some(i) = mem[r].written[v.arena][v.off..v.off + v.len]
                    .iter()
                    .position(|w| !w)
                {
                    return Err(err(format!(
                        "rank {r}: element {i} of buffer {b} ({:?}) is never written",
                        decl.role
                    )));
                }
            }
        }
    }
    Ok(())
}

fn check_peer(peer: Rank, n: usize, r: usize, c: usize, pc: usize) -> Result<(), CoreError> {
    if peer as usize >= n {
        return Err(err(format!(
            "rank {r} channel {c} step {pc}: peer {peer} out of range"
        )));
    }
    Ok(())
}

fn resolve<T>(
    mem: &RankMem<T>,
    at: Loc,
    len: usize,
    what: &str,
) -> Result<(usize, usize), CoreError> {
    let v = mem
        .views
        .get(at.buf.0 as usize)
        .ok_or_else(|| err(format!("{what}: no buffer {}", at.buf.0)))?;
    if at.off + len > v.len {
        return Err(err(format!(
            "{what}: {at}+{len} exceeds buffer length {}",
            v.len
        )));
    }
    Ok((v.arena, v.off + at.off))
}

/// Where a step is: rank, channel, index.
#[derive(Clone, Copy, Debug)]
struct Site {
    r: usize,
    c: usize,
    pc: usize,
}

/// One [`Step::Swap`]: `(at, peer, peer_at, len)`. Both ranges must hold
/// defined values and neither may be an input; each is read and written.
fn exec_swap<T: Element>(
    plan: &Plan,
    mem: &mut [RankMem<T>],
    at: Site,
    swap: &Step,
    mut race: Option<&mut Race>,
) -> Result<(), CoreError> {
    let Site { r, c, pc } = at;
    let what = format!("rank {r} channel {c} step {pc}");
    let &Step::Swap {
        at: here,
        peer,
        peer_at: there,
        len,
    } = swap
    else {
        return Err(err(format!("{what}: not a swap")));
    };
    let q = peer as usize;
    if q == r {
        return Err(err(format!("{what}: swaps with itself")));
    }
    let t = race.as_deref_mut().map(|race| {
        let t = race.thread(r, c);
        race.tick(t);
        t
    });
    let mut ends = [(0, 0); 2];
    for (k, (owner, l)) in [(r, here), (q, there)].into_iter().enumerate() {
        let m = &mem[owner];
        let (a, o) = resolve(m, l, len, &what)?;
        let role = plan.ranks[owner].bufs[l.buf.0 as usize].role;
        if role == BufRole::Input {
            return Err(err(format!(
                "{what}: swaps into an input buffer of rank {owner}"
            )));
        }
        if let Some(i) = m.written[a][o..o + len].iter().position(|w| !w) {
            return Err(err(format!(
                "{what}: swaps undefined element {} of {role:?} buffer on rank {owner}",
                l.off + i
            )));
        }
        if let (Some(race), Some(t)) = (race.as_deref_mut(), t) {
            race.access(t, (owner, a, o), len, true, &what)?;
        }
        ends[k] = (a, o);
    }
    let ((a0, o0), (a1, o1)) = (ends[0], ends[1]);
    let mine = mem[r].arenas[a0][o0..o0 + len].to_vec();
    let theirs = mem[q].arenas[a1][o1..o1 + len].to_vec();
    mem[r].arenas[a0][o0..o0 + len].copy_from_slice(&theirs);
    mem[q].arenas[a1][o1..o1 + len].copy_from_slice(&mine);
    Ok(())
}

#[allow(clippy::too_many_arguments)] // reason: the interpreter's whole state for one step
fn exec_xfer<T: Element>(
    plan: &Plan,
    mem: &mut [RankMem<T>],
    fifos: &mut HashMap<ConnKey, VecDeque<Vec<T>>>,
    op: &LoweredOp,
    at: Site,
    x: &crate::plan::Xfer,
    stats: &mut InterpStats,
    mut race: Option<&mut Race>,
) -> Result<(), CoreError> {
    let Site { r, c, pc } = at;
    let me = r as Rank;
    let what = format!("rank {r} channel {c} step {pc}");
    // The step starts once its messages are there: it is ordered after
    // their sends before it touches memory.
    let t = race.as_deref_mut().map(|race| {
        let t = race.thread(r, c);
        race.tick(t);
        for s in &x.srcs {
            if let Src::Recv { peer } = *s {
                race.recv((c, peer, me), t);
            }
        }
        t
    });
    for s in &x.srcs {
        if let Src::Remote { peer, .. } = *s {
            check_peer(peer, plan.ranks.len(), r, c, pc)?;
        }
    }
    for d in &x.dsts {
        if let Dst::Remote { peer, .. } = *d {
            check_peer(peer, plan.ranks.len(), r, c, pc)?;
        }
    }
    if x.srcs.is_empty() {
        return Err(err(format!("{what}: transfer without a source")));
    }
    let mut acc: Option<Vec<T>> = None;
    for s in &x.srcs {
        let vals: Vec<T> = match *s {
            Src::Recv { peer } => fifos
                .get_mut(&(c, peer, me))
                .and_then(|q| q.pop_front())
                .expect("readiness checked"),
            Src::Local { at, pre } | Src::Remote { at, pre, .. } => {
                let owner = match *s {
                    Src::Remote { peer, .. } => peer as usize,
                    _ => r,
                };
                let m = &mem[owner];
                let (a, o) = resolve(m, at, x.len, &what)?;
                let role = plan.ranks[owner].bufs[at.buf.0 as usize].role;
                if let Some(i) = m.written[a][o..o + x.len].iter().position(|w| !w) {
                    return Err(err(format!(
                        "{what}: reads undefined element {} of {role:?} buffer on rank {owner}",
                        at.off + i
                    )));
                }
                if let (Some(race), Some(t)) = (race.as_deref_mut(), t) {
                    race.access(t, (owner, a, o), x.len, false, &what)?;
                }
                let src = &m.arenas[a][o..o + x.len];
                if pre {
                    src.iter().map(|v| op.pre(*v)).collect()
                } else {
                    src.to_vec()
                }
            }
        };
        acc = Some(match acc {
            None => vals,
            Some(mut a) => {
                for (d, v) in a.iter_mut().zip(vals) {
                    *d = op.base.apply(*d, v);
                }
                a
            }
        });
    }
    let mut out = acc.expect("at least one source");
    if x.post {
        for v in &mut out {
            *v = op.post(*v);
        }
    }
    for d in &x.dsts {
        match *d {
            Dst::Send { peer } => {
                stats.messages += 1;
                stats.elements_sent += x.len;
                if let (Some(race), Some(t)) = (race.as_deref_mut(), t) {
                    race.send((c, me, peer), t);
                }
                fifos
                    .entry((c, me, peer))
                    .or_default()
                    .push_back(out.clone());
            }
            Dst::Local(at) | Dst::Remote { at, .. } => {
                let owner = match *d {
                    Dst::Remote { peer, .. } => peer as usize,
                    _ => r,
                };
                let (a, o) = resolve(&mem[owner], at, x.len, &what)?;
                let role = plan.ranks[owner].bufs[at.buf.0 as usize].role;
                if role == BufRole::Input {
                    return Err(err(format!(
                        "{what}: writes into an input buffer of rank {owner}"
                    )));
                }
                let m = &mut mem[owner];
                if let (Some(race), Some(t)) = (race.as_deref_mut(), t) {
                    race.access(t, (owner, a, o), x.len, true, &what)?;
                }
                m.arenas[a][o..o + x.len].copy_from_slice(&out);
                m.written[a][o..o + x.len].fill(true);
            }
        }
    }
    Ok(())
}
