//! `split` and `shrink` of communicators whose ranks are threads of this
//! process (`init_all`): every expected rank's thread deposits its
//! `(color, key)` on the clique's board (for `split` every rank, for
//! `shrink` only the remaining ones); the last to arrive makes one new
//! clique per color (the members ordered by key, then rank, as across
//! processes) on a backend of the parent's kind, each member on its
//! parent rank's device, and every thread takes its own communicator. An
//! expected rank that never calls makes the others fail at the configured
//! deadline, naming it.

use std::time::Instant;

use crate::backend::{self, BackendKind};
use crate::comm::{init_all_on, Communicator, Outcome};
use crate::error::{Error, Result};

/// The parent ranks of `color`'s new communicator, in new-rank order:
/// by key, then by parent rank. `entries` are `(color or -1, key, rank)`.
pub(crate) fn split_members(entries: &[(i64, i32, u32)], color: Option<u32>) -> Vec<u32> {
    let Some(color) = color else {
        return Vec::new();
    };
    let mut m: Vec<(i32, u32)> = entries
        .iter()
        .filter(|e| e.0 == i64::from(color))
        .map(|e| (e.1, e.2))
        .collect();
    m.sort();
    m.into_iter().map(|(_, r)| r).collect()
}

/// The ranks marked in `m`.
fn ranks_of(m: &[bool]) -> Vec<usize> {
    (0..m.len()).filter(|&r| m[r]).collect()
}

/// The children of one finished round, by parent rank.
fn make_children(parent: &Communicator, entries: &[(i64, i32, u32)]) -> Outcome {
    let cl = parent.clique();
    let devices = cl.backend.rank_devices();
    let mut out: Vec<Option<Communicator>> = (0..cl.nranks).map(|_| None).collect();
    let mut colors: Vec<i64> = entries.iter().map(|e| e.0).filter(|&c| c >= 0).collect();
    colors.sort_unstable();
    colors.dedup();
    for c in colors {
        let members = split_members(entries, Some(c as u32));
        let n = members.len() as u32;
        // Siblings run beside each other on the parent's devices.
        let mut cfg = cl.config.clone();
        cfg.cuda.co_resident = cfg.cuda.co_resident.max(parent.ranks_on_busiest_memory());
        let opts = cfg.backend_options(n);
        let made = match (cl.backend.kind(), &devices) {
            (BackendKind::Host, _) => backend::host::create(&opts),
            (BackendKind::Cuda, Some(d)) => {
                let mine = members.iter().map(|&r| d[r as usize]).collect();
                backend::cuda::create_on(&opts, mine)
            }
            _ => Err(Error::InvalidUsage(format!(
                "split is not available on {}",
                cl.backend.describe()
            ))),
        };
        let comms = made
            .and_then(|b| init_all_on(n, b, cfg))
            .map_err(|e| format!("making color {c}'s communicators: {e}"))?;
        for (r, comm) in members.iter().zip(comms) {
            out[*r as usize] = Some(comm);
        }
    }
    Ok(out)
}

/// `parent.split(color, key)` for a thread clique.
pub(crate) fn split(
    parent: &Communicator,
    color: Option<u32>,
    key: i32,
) -> Result<Option<Communicator>> {
    let all = vec![true; parent.clique().nranks as usize];
    round(parent, color, key, &all)
}

/// `parent.shrink(..)` for a thread clique: `members` (ascending, the
/// caller among them) meet without the others.
pub(crate) fn shrink(parent: &Communicator, members: &[u32]) -> Result<Communicator> {
    let mut expected = vec![false; parent.clique().nranks as usize];
    for &m in members {
        expected[m as usize] = true;
    }
    round(parent, Some(0), parent.rank() as i32, &expected)?
        .ok_or_else(|| Error::Internal("shrink gave a remaining rank no communicator".into()))
}

/// One rendezvous of the `expected` ranks on the clique's board.
fn round(
    parent: &Communicator,
    color: Option<u32>,
    key: i32,
    expected: &[bool],
) -> Result<Option<Communicator>> {
    let cl = parent.clique();
    let (me, n) = (parent.rank() as usize, cl.nranks as usize);
    let board = &cl.split;
    let deadline = Instant::now() + cl.config.deadline.min(oxccl_bootstrap::MAX_LIMIT);
    let mut g = board.round.lock();
    // A previous round still being collected: wait for it to clear.
    while g.done.is_some() {
        if board.cv.wait_until(&mut g, deadline).timed_out() {
            return Err(Error::Timeout(format!(
                "rank {me}: split waited for the previous split's ranks"
            )));
        }
    }
    if g.entries.len() != n || g.entries.iter().all(Option::is_none) {
        g.entries = vec![None; n];
        g.quit = vec![false; n];
        g.expected = expected.to_vec();
    } else if g.expected != expected {
        return Err(Error::InvalidUsage(format!(
            "rank {me}: a split or shrink of other ranks ({:?} expected) is being gathered; \
             every rank must make the same calls (shrink: the same excluded ranks)",
            ranks_of(&g.expected)
        )));
    }
    if g.entries[me].is_some() {
        return Err(Error::InvalidUsage(format!(
            "rank {me} called split again before every rank had called it"
        )));
    }
    g.entries[me] = Some((color.map_or(-1, i64::from), key));
    g.quit[me] = false;
    if (0..n).all(|r| !expected[r] || g.entries[r].is_some()) {
        let entries: Vec<(i64, i32, u32)> = g
            .entries
            .iter()
            .enumerate()
            .filter_map(|(r, e)| e.map(|(c, k)| (c, k, r as u32)))
            .collect();
        g.done = Some(make_children(parent, &entries));
        g.left = ranks_of(expected).len() as u32;
        g.entries.clear();
        board.cv.notify_all();
    }
    while g.done.is_none() {
        if board.cv.wait_until(&mut g, deadline).timed_out() {
            let missing: Vec<u32> = (0..n)
                .filter(|&r| expected[r] && r != me && g.entries[r].is_none() && !g.quit[r])
                .map(|r| r as u32)
                .collect();
            g.entries[me] = None;
            g.quit[me] = true;
            return Err(Error::Timeout(format!(
                "rank {me}: split or shrink waited {:?} for {}, which never called it",
                cl.config.deadline,
                oxccl_core::ranks_named(&missing)
            )));
        }
    }
    let outcome = match g.done.as_mut() {
        Some(Ok(v)) => Ok(v[me].take()),
        Some(Err(e)) => Err(Error::Backend(e.clone())),
        None => Err(Error::Internal("split round vanished".into())),
    };
    g.left -= 1;
    if g.left == 0 {
        g.done = None;
        board.cv.notify_all();
    }
    outcome
}
