//! Send/Recv: a group of point-to-point operations as one plan.
//!
//! Every operation has its own buffer (an input for a send, an output for a
//! receive), numbered in the order the rank listed its operations. The k-th
//! send from a to b matches the k-th receive on b from a, and their counts
//! must be equal. An operation of `count` elements uses
//! [`op_channels`]`(count, chunk, channels)` channels, one per `chunk`-sized
//! piece up to the plan's channel count, and each of those carries its
//! `split` share in pieces of at most `chunk` elements. Both ends of an
//! operation know its count, so they agree on its channels without
//! talking; small operations stay on channel 0 (no extra handshakes),
//! large ones spread over every channel (a FIFO connection moves a piece
//! at a time per channel, so one or two channels cap a large transfer at
//! one or two blocks' copy rate).
//!
//! Schedule (deadlock-free at FIFO depth 1 per connection and round): the
//! sends from a to b form one stream of pieces, the receives on b from a
//! the same stream. Round j of a channel is: the j-th self-copy piece, the
//! j-th piece of every outgoing stream (peers in rotating order from the
//! rank), then the j-th piece of every incoming stream. A round has one
//! step per active stream; self send/receive pairs become local copies.
//!
//! **Direct messages** ([`Path::Direct`], registered buffers on both
//! sides as the caller knows them): the receiver copies the message
//! straight from the sender's buffer (`Src::Remote`), one read and one
//! write per byte instead of the FIFO's two of each, spread over the same
//! channels as a FIFO message of its size. Per channel, before the FIFO
//! rounds: the rank signals every peer it sends a direct message to on
//! this channel ("my buffers are handed over"), then for every peer it
//! receives direct messages from: waits for that signal, copies its
//! pieces, signals back ("done reading"); after the FIFO rounds it waits
//! for the "done" of every peer it sent direct messages to, so its
//! buffers are not handed back while a peer still reads them. The first
//! signals wait for nothing, so the direct part cannot deadlock and adds
//! nothing the FIFO rounds wait for. On one semaphore (channel, a → b),
//! a's signals come in the order "ready" then "done", and b's waits on it
//! in the order "for ready" then "for done": each wait is paired with the
//! signal it means.

use super::{local, pieces, recv, send, split, Steps};
use crate::coll::Algo;
use crate::error::CoreError;
use crate::plan::{BufDecl, BufId, BufRole, Channel, Dst, Loc, Plan, Rank, RankPlan, Src, Step};

/// One point-to-point operation of a rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum P2pOp {
    Send { peer: Rank, count: usize },
    Recv { peer: Rank, count: usize },
}

impl P2pOp {
    fn peer(self) -> Rank {
        match self {
            P2pOp::Send { peer, .. } | P2pOp::Recv { peer, .. } => peer,
        }
    }
    fn count(self) -> usize {
        match self {
            P2pOp::Send { count, .. } | P2pOp::Recv { count, .. } => count,
        }
    }
    fn is_send(self) -> bool {
        matches!(self, P2pOp::Send { .. })
    }
}

/// A piece of one operation's buffer: `(buffer, offset, length)`.
type Piece = (BufId, usize, usize);

/// How one operation's data moves. Both ends of a message must name the
/// same path (for the k-th send from a to b and the k-th receive on b
/// from a); a message to or from the rank itself is a local copy whatever
/// its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Path {
    /// Through a FIFO connection: any memory.
    Fifo,
    /// The receiver reads the sender's buffer directly: the sender's
    /// buffer must be registered (addressable by the receiver's executor).
    /// On a receive, the sender's id of that buffer (its operation's
    /// index in the sender's list); on a send, ignored.
    Direct(BufId),
}

/// The paths of every rank's operations when each message `(from, to, k,
/// count)` (the k-th from `from` to `to`) goes direct where `direct` says:
/// what a whole-plan caller (and the tests) compute; a communicator learns
/// its peers' buffer ids from them instead.
pub fn paths(
    ops: &[Vec<P2pOp>],
    direct: impl Fn(Rank, Rank, usize, usize) -> bool,
) -> Vec<Vec<Path>> {
    let n = ops.len() as Rank;
    // The k-th send from a to b: its index in a's list.
    let sends = |a: Rank, b: Rank| -> Vec<usize> {
        ops[a as usize]
            .iter()
            .enumerate()
            .filter(|(_, o)| o.is_send() && o.peer() == b)
            .map(|(i, _)| i)
            .collect()
    };
    (0..n)
        .map(|r| {
            let list = &ops[r as usize];
            list.iter()
                .enumerate()
                .map(|(i, o)| {
                    let (a, b) = if o.is_send() {
                        (r, o.peer())
                    } else {
                        (o.peer(), r)
                    };
                    // Which message of its pair this operation is.
                    let k = list[..i]
                        .iter()
                        .filter(|x| x.is_send() == o.is_send() && x.peer() == o.peer())
                        .count();
                    if a == b || !direct(a, b, k, o.count()) {
                        return Path::Fifo;
                    }
                    match sends(a, b).get(k) {
                        Some(&i) => Path::Direct(BufId(i as u16)),
                        None => Path::Fifo,
                    }
                })
                .collect()
        })
        .collect()
}

/// Builds the plan for `ops[r]`, the operations of each rank `r`, every
/// message through a FIFO.
pub fn plan(
    nranks: u32,
    ops: &[Vec<P2pOp>],
    chunk: usize,
    channels: u32,
) -> Result<Plan, CoreError> {
    let fifo: Vec<Vec<Path>> = ops.iter().map(|l| vec![Path::Fifo; l.len()]).collect();
    plan_with_paths(nranks, ops, &fifo, chunk, channels)
}

/// [`plan`] with each operation's path given (`paths[r][i]` for
/// `ops[r][i]`; see [`paths`]).
pub fn plan_with_paths(
    nranks: u32,
    ops: &[Vec<P2pOp>],
    paths: &[Vec<Path>],
    chunk: usize,
    channels: u32,
) -> Result<Plan, CoreError> {
    validate(nranks, ops, chunk, channels)?;
    if paths.len() != ops.len() || paths.iter().zip(ops).any(|(p, o)| p.len() != o.len()) {
        return bad("one path per operation needed".into());
    }
    let ranks = (0..nranks)
        .map(|r| {
            let i = r as usize;
            let mine = RankOps {
                rank: r,
                list: &ops[i],
                paths: &paths[i],
            };
            build_rank(nranks, mine, chunk, channels)
        })
        .collect();
    Ok(Plan {
        algo: Algo::AllPairs,
        coll: None,
        nranks,
        ranks,
    })
}

fn bad<T>(m: String) -> Result<T, CoreError> {
    Err(CoreError::InvalidRequest(m))
}

fn validate(nranks: u32, ops: &[Vec<P2pOp>], chunk: usize, channels: u32) -> Result<(), CoreError> {
    if nranks == 0 {
        return bad("p2p plan needs ranks > 0".into());
    }
    if ops.len() != nranks as usize {
        return bad(format!("{} op lists for {nranks} ranks", ops.len()));
    }
    for (r, list) in ops.iter().enumerate() {
        validate_list(nranks, r as Rank, list, chunk, channels)?;
    }
    for a in 0..nranks {
        for b in 0..nranks {
            let sends = counts(&ops[a as usize], b, true);
            let recvs = counts(&ops[b as usize], a, false);
            if sends != recvs {
                return bad(format!(
                    "rank {a} sends {sends:?} to rank {b}, which receives {recvs:?} from it"
                ));
            }
        }
    }
    Ok(())
}

fn counts(list: &[P2pOp], peer: Rank, sends: bool) -> Vec<usize> {
    list.iter()
        .filter(|o| o.peer() == peer && o.is_send() == sends)
        .map(|o| o.count())
        .collect()
}

/// Channels an operation of `count` elements uses in a plan of `nch`
/// channels with `chunk`-element pieces: one per piece, at least 1, at
/// most `nch`.
pub fn op_channels(count: usize, chunk: usize, nch: usize) -> usize {
    count.div_ceil(chunk.max(1)).clamp(1, nch.max(1))
}

/// The pieces, on channel `ch`, of the operations of `list` towards
/// `peer` in one direction whose path `keep` accepts, in order.
#[allow(clippy::too_many_arguments)] // reason: one channel's view of a rank's list; a struct would only rename them
fn stream(
    list: &[P2pOp],
    paths: &[Path],
    keep: impl Fn(Path) -> bool,
    peer: Rank,
    sends: bool,
    chunk: usize,
    ch: usize,
    nch: usize,
) -> Vec<Piece> {
    list.iter()
        .zip(paths)
        .enumerate()
        .filter(|(_, (o, p))| o.peer() == peer && o.is_send() == sends && keep(**p))
        .map(|(i, (o, _))| (i, o))
        .flat_map(|(i, o)| {
            let buf = BufId(i as u16);
            let used = op_channels(o.count(), chunk, nch);
            let share = if ch < used {
                split(o.count(), used)[ch].clone()
            } else {
                0..0
            };
            pieces(share, chunk).map(move |p| (buf, p.start, p.len()))
        })
        .collect()
}

/// Builds rank `rank`'s part of the plan from its own operations only:
/// equal to `plan(nranks, ops, chunk, channels)?.ranks[rank]` for any
/// `ops` whose `ops[rank]` is `list` (a rank's steps depend only on its own
/// list). Checks what one rank can: sizes, `rank` and every peer in range,
/// and that its sends to itself match its receives from itself; matching
/// with other ranks is the callers' contract (as with NCCL, a mismatch
/// shows up as a length mismatch or a timeout at run time).
pub fn rank_plan(
    nranks: u32,
    rank: Rank,
    list: &[P2pOp],
    chunk: usize,
    channels: u32,
) -> Result<RankPlan, CoreError> {
    rank_plan_with_paths(
        nranks,
        rank,
        list,
        &vec![Path::Fifo; list.len()],
        chunk,
        channels,
    )
}

/// [`rank_plan`] with each operation's path given (`paths[i]` for
/// `list[i]`): equal to `plan_with_paths(..)?.ranks[rank]` for the same
/// rank's list and paths.
pub fn rank_plan_with_paths(
    nranks: u32,
    rank: Rank,
    list: &[P2pOp],
    paths: &[Path],
    chunk: usize,
    channels: u32,
) -> Result<RankPlan, CoreError> {
    validate_list(nranks, rank, list, chunk, channels)?;
    if paths.len() != list.len() {
        return bad(format!(
            "rank {rank}: {} paths for {} operations",
            paths.len(),
            list.len()
        ));
    }
    if counts(list, rank, true) != counts(list, rank, false) {
        return bad(format!(
            "rank {rank} sends {:?} to itself but receives {:?} from itself",
            counts(list, rank, true),
            counts(list, rank, false)
        ));
    }
    let ops = RankOps { rank, list, paths };
    Ok(build_rank(nranks, ops, chunk, channels))
}

/// The checks on one rank's list that need no other rank.
fn validate_list(
    nranks: u32,
    rank: Rank,
    list: &[P2pOp],
    chunk: usize,
    channels: u32,
) -> Result<(), CoreError> {
    if nranks == 0 || channels == 0 || chunk == 0 {
        return bad(format!(
            "p2p plan needs ranks, channels and chunk > 0 (got {nranks}, {channels}, {chunk})"
        ));
    }
    if rank >= nranks {
        return bad(format!("rank {rank} out of range for {nranks} ranks"));
    }
    if list.len() > usize::from(u16::MAX) {
        return bad(format!("rank {rank}: too many operations ({})", list.len()));
    }
    if let Some(op) = list.iter().find(|o| o.peer() >= nranks) {
        return bad(format!("rank {rank}: peer {} out of range", op.peer()));
    }
    Ok(())
}

/// One rank's operations and the path of each (`paths[i]` for `list[i]`).
struct RankOps<'a> {
    rank: Rank,
    list: &'a [P2pOp],
    paths: &'a [Path],
}

/// One rank's steps (inputs already validated).
fn build_rank(nranks: u32, ops: RankOps<'_>, chunk: usize, channels: u32) -> RankPlan {
    let RankOps { rank, list, paths } = ops;
    let bufs = list
        .iter()
        .map(|o| BufDecl {
            role: if o.is_send() {
                BufRole::Input
            } else {
                BufRole::Output
            },
            len: o.count(),
            must_write: !o.is_send(),
        })
        .collect();
    let nch = channels as usize;
    let peers: Vec<Rank> = (1..nranks).map(|k| (rank + k) % nranks).collect();
    let mut chans = Vec::with_capacity(nch);
    let fifo = |p: Path| p == Path::Fifo;
    let direct = |p: Path| p != Path::Fifo;
    let any = |_: Path| true;
    for ch in 0..nch {
        let st = |keep: &dyn Fn(Path) -> bool, q: Rank, sends: bool| {
            stream(list, paths, keep, q, sends, chunk, ch, nch)
        };
        let copies: Vec<(Piece, Piece)> = st(&any, rank, true)
            .into_iter()
            .zip(st(&any, rank, false))
            .collect();
        let outs: Vec<Vec<Piece>> = peers.iter().map(|&q| st(&fifo, q, true)).collect();
        let ins: Vec<Vec<Piece>> = peers.iter().map(|&q| st(&fifo, q, false)).collect();
        // Direct: peers this rank hands buffers to on this channel, and
        // per peer the pieces it reads from that peer's buffers.
        let handed: Vec<Rank> = peers
            .iter()
            .copied()
            .filter(|&q| !st(&direct, q, true).is_empty())
            .collect();
        let mut s = Steps::default();
        s.0.extend(handed.iter().map(|&peer| Step::Signal { peer }));
        for &q in &peers {
            let reads = st(&direct, q, false);
            if reads.is_empty() {
                continue;
            }
            s.0.push(Step::Wait { peer: q });
            for (b, o, len) in reads {
                // Only direct receives were kept: each has the sender's id.
                let theirs = match paths[b.0 as usize] {
                    Path::Direct(id) => id,
                    Path::Fifo => continue,
                };
                let at = Loc::new(theirs, o);
                let src = Src::Remote {
                    peer: q,
                    at,
                    pre: false,
                };
                s.mv(src, vec![Dst::Local(Loc::new(b, o))], len);
            }
            s.0.push(Step::Signal { peer: q });
        }
        let rounds = outs
            .iter()
            .chain(&ins)
            .map(Vec::len)
            .chain([copies.len()])
            .max()
            .unwrap_or(0);
        for j in 0..rounds {
            if let Some(&((sb, so, len), (rb, ro, _))) = copies.get(j) {
                s.mv(
                    local(Loc::new(sb, so)),
                    vec![Dst::Local(Loc::new(rb, ro))],
                    len,
                );
            }
            for (q, st) in peers.iter().zip(&outs) {
                if let Some(&(b, o, len)) = st.get(j) {
                    s.mv(local(Loc::new(b, o)), vec![send(*q)], len);
                }
            }
            for (q, st) in peers.iter().zip(&ins) {
                if let Some(&(b, o, len)) = st.get(j) {
                    s.mv(recv(*q), vec![Dst::Local(Loc::new(b, o))], len);
                }
            }
        }
        s.0.extend(handed.iter().map(|&peer| Step::Wait { peer }));
        chans.push(Channel { steps: s.0 });
    }
    RankPlan {
        rank,
        nranks,
        bufs,
        channels: chans,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // That `rank_plan` alone builds working plans (checked and run through
    // the interpreter for random groups) is tested in tests/p2p.rs.

    #[test]
    fn rank_plan_refuses_what_one_rank_can_see() {
        let send = |peer, count| P2pOp::Send { peer, count };
        let recv = |peer, count| P2pOp::Recv { peer, count };
        let refused = |list: &[P2pOp], rank, chunk, channels, needle: &str| match rank_plan(
            2, rank, list, chunk, channels,
        ) {
            Err(CoreError::InvalidRequest(m)) => assert!(m.contains(needle), "{m}"),
            other => panic!("expected {needle:?}, got {other:?}"),
        };
        refused(&[], 2, 4, 1, "rank 2 out of range for 2 ranks");
        refused(&[send(2, 1)], 0, 4, 1, "rank 0: peer 2 out of range");
        refused(&[send(1, 1)], 0, 0, 1, "chunk > 0 (got 2, 1, 0)");
        refused(&[send(1, 1)], 0, 4, 0, "chunk > 0 (got 2, 0, 4)");
        refused(
            &[send(0, 3), recv(0, 2)],
            0,
            4,
            1,
            "rank 0 sends [3] to itself but receives [2] from itself",
        );
        assert!(rank_plan(2, 0, &[send(0, 3), recv(0, 3), recv(1, 5)], 4, 1).is_ok());
    }
}
