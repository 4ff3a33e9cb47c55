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

use super::{local, pieces, recv, send, split, Steps};
use crate::coll::Algo;
use crate::error::CoreError;
use crate::plan::{BufDecl, BufId, BufRole, Channel, Dst, Loc, Plan, Rank, RankPlan};

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

/// Builds the plan for `ops[r]`, the operations of each rank `r`.
pub fn plan(
    nranks: u32,
    ops: &[Vec<P2pOp>],
    chunk: usize,
    channels: u32,
) -> Result<Plan, CoreError> {
    validate(nranks, ops, chunk, channels)?;
    let ranks = (0..nranks)
        .map(|r| build_rank(nranks, r, &ops[r as usize], chunk, channels))
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
/// `peer` in one direction, in order.
fn stream(
    list: &[P2pOp],
    peer: Rank,
    sends: bool,
    chunk: usize,
    ch: usize,
    nch: usize,
) -> Vec<Piece> {
    list.iter()
        .enumerate()
        .filter(|(_, o)| o.peer() == peer && o.is_send() == sends)
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
    validate_list(nranks, rank, list, chunk, channels)?;
    if counts(list, rank, true) != counts(list, rank, false) {
        return bad(format!(
            "rank {rank} sends {:?} to itself but receives {:?} from itself",
            counts(list, rank, true),
            counts(list, rank, false)
        ));
    }
    Ok(build_rank(nranks, rank, list, chunk, channels))
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

/// One rank's steps (inputs already validated).
fn build_rank(nranks: u32, rank: Rank, list: &[P2pOp], chunk: usize, channels: u32) -> RankPlan {
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
    for ch in 0..nch {
        let copies: Vec<(Piece, Piece)> = stream(list, rank, true, chunk, ch, nch)
            .into_iter()
            .zip(stream(list, rank, false, chunk, ch, nch))
            .collect();
        let outs: Vec<Vec<Piece>> = peers
            .iter()
            .map(|&q| stream(list, q, true, chunk, ch, nch))
            .collect();
        let ins: Vec<Vec<Piece>> = peers
            .iter()
            .map(|&q| stream(list, q, false, chunk, ch, nch))
            .collect();
        let rounds = outs
            .iter()
            .chain(&ins)
            .map(Vec::len)
            .chain([copies.len()])
            .max()
            .unwrap_or(0);
        let mut s = Steps::default();
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
