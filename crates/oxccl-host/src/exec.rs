//! A rank's executor: runs its channels round-robin from one thread.
//!
//! Each round advances every channel as far as it goes (a step runs only
//! when all its messages have arrived and all its sends have a free slot,
//! so steps never half-run). When no channel moved, the rank is idle: it
//! snoozes `spin` times (crossbeam `Backoff`: spin, then yield), then parks
//! until a peer wakes it or the earliest deadline of a blocked channel.
//! Every producer wakes the consumer it unblocks, so parking loses nothing,
//! and more ranks than cores still make progress.

use std::time::{Duration, Instant};

use crossbeam::sync::Parker;
use crossbeam::utils::Backoff;
use oxccl_core::plan::Rank;
use oxccl_core::trace::{Stamp, StepRecord};
use oxccl_core::{Awaited, Element, FaultCause, LoweredOp, WaitFault};
use smallvec::SmallVec;

use crate::compile::{ODst, OSrc, Op, Program, XOp};
use crate::error::HostError;
use crate::kernel::{transfer, In, TypedOp};
use crate::remote::{RemoteAccess, RemoteFault};
use crate::view::{BlockedAt, Calls, FabricView};

/// What a call did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecStats {
    /// Steps run, over all channels.
    pub steps: usize,
    /// Messages sent.
    pub messages: usize,
    /// Payload bytes sent.
    pub bytes_sent: usize,
    /// Messages the network proxy sent straight from this rank's buffers
    /// (by reference), not from a FIFO slot.
    pub by_reference: usize,
    /// Messages the network proxy received straight into their place in
    /// this rank's buffers (landed), not into a FIFO slot.
    pub landed: usize,
    /// Times the rank parked waiting for a peer.
    pub parks: usize,
}

/// Why a step could not run yet.
#[derive(Clone, Copy, Debug)]
struct Blocked {
    peer: Rank,
    what: Awaited,
}

struct Runner<'a, T, F> {
    fab: &'a F,
    me: Rank,
    calls: Calls,
    prog: &'a Program,
    op: TypedOp<T>,
    // A step's operands, inline up to `OPERANDS` (no allocation per call
    // for the common plans; more spill to the heap).
    srcs: SmallVec<[In<T>; OPERANDS]>,
    dsts: SmallVec<[*mut T; OPERANDS]>,
    /// Claimed messages `(link, seq)` of a step, and its claimed slots
    /// `(link, seq, peer, by reference from)`.
    recvs: SmallVec<[(usize, u64); OPERANDS]>,
    sends: SmallVec<[Claimed; OPERANDS]>,
    /// Messages published by reference and not yet sent: their bytes must
    /// not be written until they are.
    refs: Vec<Ref>,
    temp: Vec<T>,
    stats: ExecStats,
    /// Where each step's record goes when a trace is asked for.
    trace: Option<&'a mut Vec<StepRecord>>,
}

/// A message published by reference ([`crate::fifo::Link::publish_ref`]):
/// bytes `[lo, hi)` of the rank's memory, read by the proxy until the
/// link hands message `seq` back.
#[derive(Clone, Copy, Debug)]
struct Ref {
    link: usize,
    seq: u64,
    peer: Rank,
    lo: usize,
    hi: usize,
}

/// A claimed send slot: `(link, seq, peer, by reference from)`.
type Claimed = (usize, u64, Rank, Option<usize>);

/// When a channel's current step was first tried, and the peer it waited
/// on (traced calls only).
type Tried = Option<(Instant, Option<Rank>)>;

/// Operands of a step and channels of a program kept inline by [`run`].
const OPERANDS: usize = 8;
const CHANNELS: usize = 16;

/// The longest a blocked rank parks before it looks again by itself.
const MAX_PARK: Duration = Duration::from_secs(1);

/// Runs `prog` for rank `me` (its call numbers `calls`) to completion;
/// with `trace`, appends a record of every step there.
pub(crate) fn run<T: Element>(
    fab: &impl FabricView,
    me: Rank,
    calls: Calls,
    prog: &Program,
    op: &LoweredOp,
    parker: &Parker,
    trace: Option<&mut Vec<StepRecord>>,
) -> Result<ExecStats, HostError> {
    let mut r = Runner {
        fab,
        me,
        calls,
        prog,
        op: TypedOp::<T>::new(op),
        srcs: SmallVec::new(),
        dsts: SmallVec::new(),
        recvs: SmallVec::new(),
        sends: SmallVec::new(),
        refs: Vec::new(),
        temp: Vec::new(),
        stats: ExecStats::default(),
        trace,
    };
    let nch = prog.channels.len();
    let mut pc: SmallVec<[usize; CHANNELS]> = smallvec::smallvec![0; nch];
    let mut since: SmallVec<[Option<(Instant, Blocked)>; CHANNELS]> =
        smallvec::smallvec![None; nch];
    // Traced only: when each channel's current step was first tried, and
    // the peer it waited on.
    let mut tried: SmallVec<[Tried; CHANNELS]> = smallvec::smallvec![None; nch];
    let backoff = Backoff::new();
    let mut idle = 0u32;
    let mut next_warn = fab.config().warn_after;
    loop {
        let seen = fab.arm();
        if fab.is_broken() {
            return Err(fab.stop_error(me).expect("broken fabric has a reason"));
        }
        let mut progressed = false;
        let mut done = true;
        for c in 0..nch {
            let ops = &prog.channels[c];
            while pc[c] < ops.len() {
                if r.trace.is_some() && tried[c].is_none() {
                    tried[c] = Some((Instant::now(), None));
                }
                match r.try_step(c, pc[c], &ops[pc[c]])? {
                    None => {
                        if let (Some(t), Some((start, waited))) = (&mut r.trace, tried[c].take()) {
                            t.push(record(c, pc[c], &ops[pc[c]], start, waited));
                        }
                        pc[c] += 1;
                        r.stats.steps += 1;
                        progressed = true;
                        since[c] = None;
                    }
                    Some(b) => {
                        if let Some((_, w)) = &mut tried[c] {
                            *w = Some(b.peer);
                        }
                        // Keep when the wait began; report what it waits for now.
                        let t0 = since[c].map_or_else(Instant::now, |(t0, _)| t0);
                        since[c] = Some((t0, b));
                        break;
                    }
                }
            }
            done &= pc[c] == ops.len();
        }
        if done {
            return Ok(r.stats);
        }
        if progressed {
            idle = 0;
            next_warn = fab.config().warn_after;
            backoff.reset();
            continue;
        }
        let (elapsed, deadline) = check_idle(fab, me, calls, &since, &pc, &mut next_warn)?;
        if idle < fab.spin() {
            idle += 1;
            backoff.snooze();
        } else {
            r.stats.parks += 1;
            // In slices: without a deadline (`Duration::MAX`) the rest
            // would not be a time the parker can add to now.
            // Also woken for the next warning.
            let until = (deadline - elapsed)
                .min(next_warn.saturating_sub(elapsed))
                .min(MAX_PARK);
            fab.park(parker, seen, until);
        }
    }
}

/// What an idle round of [`run`] checks: a dead peer of any blocked
/// channel, the deadline of the channel blocked longest, and whether the
/// next loud warning is due (`next_warn`, moved a period on when printed).
/// Returns how long that channel has waited and the deadline read now.
fn check_idle(
    fab: &impl FabricView,
    me: Rank,
    calls: Calls,
    since: &[Option<(Instant, Blocked)>],
    pc: &[usize],
    next_warn: &mut Duration,
) -> Result<(Duration, Duration), HostError> {
    // Idle: the channel blocked longest decides the deadline.
    let (c, (t0, b)) = since
        .iter()
        .enumerate()
        .filter_map(|(c, s)| s.map(|s| (c, s)))
        .min_by_key(|(_, (t0, _))| *t0)
        .expect("an unfinished channel is blocked");
    let elapsed = t0.elapsed();
    // Read every idle round: `set_deadline` may change it mid-call.
    let deadline = fab.deadline();
    // Ranks as processes: a blocked channel's peer that has exited
    // will never answer.
    for (ch, (_, blk)) in since
        .iter()
        .enumerate()
        .filter_map(|(ch, s)| s.map(|s| (ch, s)))
    {
        let at = BlockedAt {
            me,
            peer: blk.peer,
            channel: ch,
            step: pc[ch],
        };
        if let Some(err) = fab.dead_peer_error(at) {
            return Err(err);
        }
    }
    if elapsed >= deadline {
        let err = HostError::Deadline(WaitFault {
            cause: FaultCause::Deadline,
            rank: me,
            peer: b.peer,
            channel: c as u32,
            step: pc[c] as u32,
            awaited: b.what,
            waited: elapsed,
            absent: fab.absent(calls.call),
        });
        tracing::error!(%err, "host fabric deadline");
        fab.fail(err.to_string());
        return Err(err);
    }
    if elapsed >= *next_warn {
        // Progress of a hang, not silence: at the first period, then
        // every period, naming what the longest-blocked channel waits
        // for, whether or not logging was set up.
        *next_warn = elapsed + fab.config().warn_every;
        // No deadline is stored as the largest count of nanoseconds.
        let limit = if deadline >= Duration::from_nanos(u64::MAX) {
            "no deadline".to_string()
        } else {
            format!("deadline {deadline:?}")
        };
        warn_loud(
            me,
            &format!(
                "oxccl-host: waiting {:.1} s ({limit}) for {} from peer {} on channel {c}, step {}; ranks not yet in this call: {:?}",
                elapsed.as_secs_f64(),
                b.what,
                b.peer,
                pc[c],
                fab.absent(calls.call)
            ),
        );
    }
    Ok((elapsed, deadline))
}

/// The trace record of step `s` of channel `c`, tried first at `start`,
/// done now; `waited`: the peer it waited on last, if any.
fn record(c: usize, s: usize, op: &Op, start: Instant, waited: Option<Rank>) -> StepRecord {
    let (name, peer) = describe(op);
    StepRecord {
        channel: c as u32,
        step: s as u32,
        name,
        peer: waited.or(peer),
        waited: waited.is_some(),
        start: Stamp::Host(start),
        end: Stamp::Host(Instant::now()),
    }
}

/// A step's kind in the plan IR's words, and the first peer it exchanges
/// with.
fn describe(op: &Op) -> (&'static str, Option<Rank>) {
    match op {
        Op::Signal { peer, .. } => ("signal", Some(*peer)),
        Op::Wait { peer, .. } => ("wait", Some(*peer)),
        Op::Swap { peer, .. } => ("swap", Some(*peer)),
        Op::Xfer(x) => {
            let from = x.srcs.iter().find_map(|s| match *s {
                OSrc::Recv { peer, .. } | OSrc::Remote { peer, .. } => Some(peer),
                OSrc::Local { .. } => None,
            });
            let to = x.dsts.iter().find_map(|d| match *d {
                ODst::Send { peer, .. } | ODst::Remote { peer, .. } => Some(peer),
                ODst::Local { .. } => None,
            });
            let name = oxccl_core::trace::name(from.is_some(), x.srcs.len() > 1, to.is_some());
            (name, from.or(to))
        }
    }
}

impl<T: Element, F: FabricView> Runner<'_, T, F> {
    /// Runs step `s` of channel `c` if it can run now; otherwise says what
    /// it waits for.
    fn try_step(&mut self, c: usize, s: usize, op: &Op) -> Result<Option<Blocked>, HostError> {
        let links = &self.prog.links;
        match *op {
            Op::Signal { link, peer } => {
                links[link].signal();
                self.fab.wake(peer);
                Ok(None)
            }
            Op::Wait { link, peer } => Ok((!links[link].try_wait()).then_some(Blocked {
                peer,
                what: Awaited::Signal,
            })),
            Op::Xfer(ref x) => self.try_xfer(c, s, x),
            Op::Swap {
                addr,
                peer,
                buf,
                off,
                len,
            } => {
                if let Some(b) = self.sending(addr, len * size_of::<T>()) {
                    return Ok(Some(b));
                }
                let theirs = self.remote(peer, c, s, buf, off, len)?;
                // SAFETY: `addr` was bounds- and alignment-checked by
                // `compile` against this rank's buffers, `theirs` against
                // the peer's published buffers of this call; a peer's
                // memory is disjoint from ours, and the plan's barriers
                // (checked by `oxccl_core::interp`) keep every other
                // access to both ranges out of this step's way.
                unsafe { crate::kernel::swap(addr as *mut T, theirs as *mut T, len) };
                Ok(None)
            }
        }
    }

    fn try_xfer(&mut self, c: usize, s: usize, x: &XOp) -> Result<Option<Blocked>, HostError> {
        let links = &self.prog.links;
        let elem = size_of::<T>();
        self.srcs.clear();
        self.dsts.clear();
        self.recvs.clear();
        self.sends.clear();
        // Readiness first: nothing is consumed or published unless all of
        // the step can run.
        for dst in &x.dsts {
            if let ODst::Local { addr } = *dst {
                if let Some(b) = self.sending(addr, x.len * elem) {
                    return Ok(Some(b));
                }
            }
        }
        for src in &x.srcs {
            let (ptr, pre) = match *src {
                OSrc::Local { addr, pre } => (addr, pre),
                OSrc::Recv { link, peer } => {
                    let peeked = links[link]
                        .try_peek()
                        .map_err(|d| self.corrupt(peer, c, s, d))?;
                    let Some((seq, ptr, len)) = peeked else {
                        return Ok(Some(Blocked {
                            peer,
                            what: Awaited::Message,
                        }));
                    };
                    if len != x.len * elem {
                        return Err(self.mismatch(
                            peer,
                            c,
                            s,
                            format!(
                                "receives {} bytes ({} elements) but the message has {len} bytes",
                                x.len * elem,
                                x.len
                            ),
                        ));
                    }
                    self.recvs.push((link, seq));
                    (ptr as usize, false)
                }
                OSrc::Remote {
                    peer,
                    buf,
                    off,
                    pre,
                } => (self.remote(peer, c, s, buf, off, x.len)?, pre),
            };
            self.srcs.push(In {
                ptr: ptr as *const T,
                pre,
            });
        }
        for dst in &x.dsts {
            let ptr = match *dst {
                ODst::Local { addr } => addr,
                ODst::Send { link, peer } => {
                    let reserved = links[link]
                        .try_reserve()
                        .map_err(|d| self.corrupt(peer, c, s, d))?;
                    let Some((seq, ptr)) = reserved else {
                        return Ok(Some(Blocked {
                            peer,
                            what: Awaited::Slot,
                        }));
                    };
                    let by_ref = links[link]
                        .by_reference()
                        .then(|| self.left_in_place(x))
                        .flatten();
                    self.sends.push((link, seq, peer, by_ref));
                    if by_ref.is_some() {
                        // The proxy sends the bytes from where they are.
                        continue;
                    }
                    ptr as usize
                }
                ODst::Remote { peer, buf, off } => self.remote(peer, c, s, buf, off, x.len)?,
            };
            self.dsts.push(ptr as *mut T);
        }
        // SAFETY: local operands were bounds- and alignment-checked by
        // `compile` against buffers the caller of `execute` vouched for;
        // remote ones against the peer's published buffers of this very call
        // (the plan's wait ordered them after the peer's publication);
        // claimed slots hold `len` elements (checked against the slot size)
        // and belong to this rank until released/published below. Local
        // destinations are pairwise disjoint (checked in `compile`); slots
        // and peers' memory are disjoint from them.
        unsafe {
            transfer(
                &self.srcs,
                &self.dsts,
                x.len,
                x.post,
                &self.op,
                &mut self.temp,
            )
        };
        for &(link, seq) in &self.recvs {
            links[link].release(seq);
        }
        for &(link, seq, dst, by_ref) in &self.sends {
            let bytes = x.len * elem;
            match by_ref {
                Some(addr) => {
                    links[link].publish_ref(seq, addr, bytes);
                    self.refs.push(Ref {
                        link,
                        seq,
                        peer: dst,
                        lo: addr,
                        hi: addr + bytes,
                    });
                    self.stats.by_reference += 1;
                }
                None => links[link].publish(seq, bytes),
            }
            self.fab.wake(dst);
            self.stats.messages += 1;
            self.stats.bytes_sent += x.len * elem;
        }
        for (src, got) in x.srcs.iter().zip(&self.srcs) {
            if let OSrc::Recv { peer, .. } = *src {
                self.fab.wake(peer);
                let at = got.ptr as usize;
                if x.dsts
                    .iter()
                    .any(|d| matches!(*d, ODst::Local { addr } if addr == at))
                {
                    self.stats.landed += 1;
                }
            }
        }
        Ok(None)
    }

    /// Where step `x` leaves its message in this rank's memory, if it
    /// does: a local destination holds the result; a plain copy of one
    /// local range is that range. Empty messages travel in their slot.
    fn left_in_place(&self, x: &XOp) -> Option<usize> {
        if x.len == 0 {
            return None;
        }
        let dst = x.dsts.iter().find_map(|d| match *d {
            ODst::Local { addr } => Some(addr),
            _ => None,
        });
        dst.or_else(|| match x.srcs[..] {
            [OSrc::Local { addr, pre }] if !x.post && (!pre || !self.op.scales()) => Some(addr),
            _ => None,
        })
    }

    /// If the `bytes` bytes at `addr` overlap a message still being sent
    /// by reference, what the step waits for: that message to leave.
    fn sending(&mut self, addr: usize, bytes: usize) -> Option<Blocked> {
        if self.refs.is_empty() {
            return None;
        }
        let links = &self.prog.links;
        self.refs.retain(|r| !links[r.link].released(r.seq));
        self.refs
            .iter()
            .find(|r| addr < r.hi && r.lo < addr + bytes)
            .map(|r| Blocked {
                peer: r.peer,
                what: Awaited::Slot,
            })
    }

    fn remote(
        &self,
        peer: Rank,
        c: usize,
        s: usize,
        buf: usize,
        off: usize,
        len: usize,
    ) -> Result<usize, HostError> {
        let access = RemoteAccess {
            call: self.calls.synced,
            buf,
            off,
            len,
            elem: size_of::<T>(),
        };
        self.fab.remote(peer, &access).map_err(|f| match f {
            RemoteFault::Plan(d) => self.mismatch(peer, c, s, d),
            RemoteFault::Corrupt(d) => self.corrupt(peer, c, s, d),
        })
    }

    /// A peer's shared memory holds what no honest peer writes: fails the
    /// fabric, naming the peer.
    fn corrupt(&self, peer: Rank, channel: usize, step: usize, detail: String) -> HostError {
        let err = HostError::Corrupt {
            rank: self.me,
            peer,
            detail: format!("channel {channel} step {step}: {detail}"),
        };
        tracing::error!(%err, "oxccl host: a peer's shared memory is corrupt");
        self.fab.fail(err.to_string());
        err
    }

    /// A run-time disagreement between ranks: fails the fabric.
    fn mismatch(&self, peer: Rank, channel: usize, step: usize, detail: String) -> HostError {
        let err = HostError::Mismatch {
            rank: self.me,
            peer,
            channel,
            step,
            detail,
        };
        self.fab.fail(err.to_string());
        err
    }
}

/// A warning the user must see whether or not logging was set up: through
/// `tracing` where a subscriber takes warnings, else straight to stderr.
fn warn_loud(rank: u32, msg: &str) {
    if tracing::enabled!(tracing::Level::WARN) {
        tracing::warn!(rank, "{msg}");
    } else {
        eprintln!("oxccl WARN rank {rank}: {msg}");
    }
}
