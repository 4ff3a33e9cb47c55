//! Happens-before race detection for the checker ([`crate::interp::check`]).
//!
//! Every `(rank, channel)` is a thread with a vector clock. Messages and
//! signals carry the sender's clock and the receiver joins it; FIFO
//! back-pressure is *not* counted as ordering (a backend with deeper FIFOs
//! does not provide it). Against these clocks it checks:
//! - two accesses to one element of a rank's memory (by any rank, through
//!   aliasing in-place buffers too), at least one a write, are ordered;
//! - a rank reads or writes a peer's memory only after it has heard from
//!   the peer in this call (the peer has entered the call, so its input is
//!   ready and its buffers are in use by this operation);
//! - every such remote access is known to the peer before the peer's plan
//!   ends (the peer does not return, and its caller does not reuse the
//!   buffer, while someone still reads or writes it).

use std::collections::{HashMap, VecDeque};

use crate::error::CoreError;
use crate::plan::{Plan, Rank};

type Clock = Vec<u32>;
type ConnKey = (usize, Rank, Rank);
/// `(thread, clock)`: one access.
type Epoch = (u32, u32);

#[derive(Clone, Debug, Default)]
struct Cell {
    write: Option<Epoch>,
    /// Reads since the last write, one per thread.
    reads: Vec<Epoch>,
}

#[derive(Debug)]
pub(crate) struct Race {
    base: Vec<usize>,
    /// `(rank, channel)` of each thread.
    who: Vec<(usize, usize)>,
    vc: Vec<Clock>,
    msgs: HashMap<ConnKey, VecDeque<Clock>>,
    sigs: HashMap<ConnKey, VecDeque<Clock>>,
    /// Per rank, per arena, per element.
    mem: Vec<Vec<Vec<Cell>>>,
    /// Latest clock of each `(owner rank, accessing thread)` remote access.
    remote: HashMap<(usize, usize), u32>,
}

fn err(msg: String) -> CoreError {
    CoreError::PlanCheck(msg)
}

impl Race {
    /// `arenas[r]`: the arena lengths of rank `r`.
    pub(crate) fn new(plan: &Plan, arenas: &[Vec<usize>]) -> Self {
        let mut base = Vec::new();
        let mut who = Vec::new();
        for (r, rp) in plan.ranks.iter().enumerate() {
            base.push(who.len());
            who.extend((0..rp.channels.len()).map(|c| (r, c)));
        }
        let t = who.len();
        Race {
            base,
            who,
            vc: vec![vec![0; t]; t],
            msgs: HashMap::new(),
            sigs: HashMap::new(),
            mem: arenas
                .iter()
                .map(|a| a.iter().map(|&l| vec![Cell::default(); l]).collect())
                .collect(),
            remote: HashMap::new(),
        }
    }

    pub(crate) fn thread(&self, rank: usize, channel: usize) -> usize {
        self.base[rank] + channel
    }

    /// Starts a step of thread `t`.
    pub(crate) fn tick(&mut self, t: usize) {
        self.vc[t][t] += 1;
    }

    fn join(&mut self, t: usize, other: &Clock) {
        for (a, b) in self.vc[t].iter_mut().zip(other) {
            *a = (*a).max(*b);
        }
    }

    pub(crate) fn send(&mut self, key: ConnKey, t: usize) {
        let c = self.vc[t].clone();
        self.msgs.entry(key).or_default().push_back(c);
    }

    pub(crate) fn recv(&mut self, key: ConnKey, t: usize) {
        if let Some(c) = self.msgs.get_mut(&key).and_then(VecDeque::pop_front) {
            self.join(t, &c);
        }
    }

    pub(crate) fn signal(&mut self, key: ConnKey, t: usize) {
        let c = self.vc[t].clone();
        self.sigs.entry(key).or_default().push_back(c);
    }

    pub(crate) fn wait(&mut self, key: ConnKey, t: usize) {
        if let Some(c) = self.sigs.get_mut(&key).and_then(VecDeque::pop_front) {
            self.join(t, &c);
        }
    }

    fn ordered(&self, t: usize, e: Epoch) -> bool {
        e.0 as usize == t || self.vc[t][e.0 as usize] >= e.1
    }

    fn describe(&self, e: Epoch) -> String {
        let (r, c) = self.who[e.0 as usize];
        format!("rank {r} channel {c}")
    }

    /// An access by thread `t` to `len` elements of `owner`'s arena at `off`.
    pub(crate) fn access(
        &mut self,
        t: usize,
        (owner, arena, off): (usize, usize, usize),
        len: usize,
        write: bool,
        what: &str,
    ) -> Result<(), CoreError> {
        let me = self.who[t].0;
        let now = (t as u32, self.vc[t][t]);
        if owner != me {
            let lo = self.base[owner];
            let hi = self.base.get(owner + 1).copied().unwrap_or(self.who.len());
            if !(lo..hi).any(|u| self.vc[t][u] >= 1) {
                return Err(err(format!(
                    "{what}: accesses rank {owner}'s memory before hearing from rank {owner} (it may not have entered the call)"
                )));
            }
            let e = self.remote.entry((owner, t)).or_default();
            *e = (*e).max(now.1);
        }
        for i in off..off + len {
            let cell = &self.mem[owner][arena][i];
            let conflict = cell.write.filter(|&w| !self.ordered(t, w)).or_else(|| {
                cell.reads
                    .iter()
                    .copied()
                    .find(|&r| write && !self.ordered(t, r))
            });
            if let Some(other) = conflict {
                return Err(err(format!(
                    "{what}: {} element {} of an arena of rank {owner}, unordered with an access by {}",
                    if write { "writes" } else { "reads" },
                    i,
                    self.describe(other)
                )));
            }
            let cell = &mut self.mem[owner][arena][i];
            if write {
                cell.write = Some(now);
                cell.reads.clear();
            } else if let Some(r) = cell.reads.iter_mut().find(|r| r.0 == now.0) {
                *r = now;
            } else {
                cell.reads.push(now);
            }
        }
        Ok(())
    }

    /// After the run: every remote access is known to its owner's plan
    /// before the owner finishes.
    pub(crate) fn finish(&self) -> Result<(), CoreError> {
        for (&(owner, t), &clock) in &self.remote {
            let lo = self.base[owner];
            let hi = self.base.get(owner + 1).copied().unwrap_or(self.who.len());
            if !(lo..hi).any(|u| self.vc[u][t] >= clock) {
                let (r, c) = self.who[t];
                return Err(err(format!(
                    "rank {owner} may finish while rank {r} channel {c} still accesses its memory (step clock {clock}); it must wait for a signal sent after the access"
                )));
            }
        }
        Ok(())
    }
}
