//! Tree generators: chain, binary tree and double binary tree.
//!
//! Shapes are built over the channel's ring order (`req.ring(channel)`), so
//! tree neighbours are ring neighbours or close to them:
//! - **chain**: the ring order rotated to start at the root; each rank's
//!   parent is the one before it.
//! - **binary tree**: an in-order tree over positions 0..n. With 1-based
//!   labels y = position + 1, the node whose lowest set bit is b has
//!   children y − b/2 and y + h for the largest h ≤ b/2 (a power of two)
//!   with y + h ≤ n; the root is the largest power of two ≤ n. Odd
//!   positions are interior, even positions leaves (in-order, leaves and
//!   interior nodes alternate). Depth ⌈log2 n⌉.
//! - **double binary tree**: the binary tree and a second one whose labels
//!   are the first's mirrored (n − 1 − position) for even n and shifted by
//!   one ((position + 1) mod n) for odd n. Mirroring an even n or shifting
//!   an odd n flips which positions are odd, so every rank is interior in
//!   at most one tree and a leaf in the other (see the tests).
//!
//! AllReduce on a tree: per piece, reduce up (own input first, then each
//! child's partial in child order) and broadcast the root's result down.
//! The down pass of piece i runs after the up pass of piece i + 1, so a
//! rank has two pieces in flight. Steps per piece: 1 at the root
//! (recv_reduce_copy_send), 2 elsewhere (up, down). Reduce: 1 per piece
//! (up); Broadcast: 1 per piece (down). Double binary tree: every request
//! channel becomes two plan channels, one per tree, each carrying half of
//! the channel's range; so the plan has 2 × `req.channels` channels.

use super::Steps;
use super::{local, out, own, pieces, recv, send, split, PlanRequest};
use crate::coll::{Algo, CollKind};
use crate::error::CoreError;
use crate::plan::{Channel, Dst, Loc, Rank, RankPlan, Src};

/// A rooted tree over ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tree {
    pub root: Rank,
    pub parent: Vec<Option<Rank>>,
    pub children: Vec<Vec<Rank>>,
}

impl Tree {
    fn from_edges(order: &[Rank], root_pos: usize, kids: impl Fn(usize) -> Vec<usize>) -> Tree {
        let n = order.len();
        let mut t = Tree {
            root: order[root_pos],
            parent: vec![None; n],
            children: vec![Vec::new(); n],
        };
        for (p, &r) in order.iter().enumerate() {
            for c in kids(p) {
                t.children[r as usize].push(order[c]);
                t.parent[order[c] as usize] = Some(r);
            }
        }
        t
    }

    /// A chain: `order[0]` is the root, each rank the parent of the next.
    pub fn chain(order: &[Rank]) -> Tree {
        let n = order.len();
        Tree::from_edges(order, 0, |p| if p + 1 < n { vec![p + 1] } else { vec![] })
    }

    /// The in-order binary tree over positions of `order` (see the module
    /// documentation); its root is at position `binary_root_pos(n)`.
    pub fn binary(order: &[Rank]) -> Tree {
        let n = order.len();
        Tree::from_edges(order, binary_root_pos(n), |p| {
            let y = p + 1;
            let b = y & y.wrapping_neg();
            let mut kids = Vec::new();
            if b >= 2 {
                kids.push(y - b / 2 - 1);
                let mut h = b / 2;
                while h >= 1 && y + h > n {
                    h /= 2;
                }
                if h >= 1 {
                    kids.push(y + h - 1);
                }
            }
            kids
        })
    }

    /// The two complementary trees of the double binary tree.
    pub fn double_binary(order: &[Rank]) -> (Tree, Tree) {
        let n = order.len();
        let second: Vec<Rank> = if n & 1 == 0 {
            order.iter().rev().copied().collect()
        } else {
            (0..n).map(|m| order[(m + n - 1) % n]).collect()
        };
        (Tree::binary(order), Tree::binary(&second))
    }

    /// NCCL's tree across hosts: ranks of `order` grouped by `host_of`
    /// (hosts in order of first appearance, each host's ranks in
    /// `order`'s order); across hosts the double binary tree over the
    /// hosts, inside each a chain. In the first tree a host's first rank
    /// heads its chain and carries its network edges; in the second the
    /// chain runs the other way, headed by the host's last rank, so the
    /// two trees' network traffic leaves from different ranks (and a
    /// host's head is interior in at most one tree's network part).
    /// `host_of` is indexed by rank; with one host this is two chains.
    pub fn double_binary_hosts(order: &[Rank], host_of: &[u32]) -> (Tree, Tree) {
        let mut groups: Vec<(u32, Vec<Rank>)> = Vec::new();
        for &r in order {
            let h = host_of.get(r as usize).copied().unwrap_or(0);
            match groups.iter_mut().find(|g| g.0 == h) {
                Some(g) => g.1.push(r),
                None => groups.push((h, vec![r])),
            }
        }
        let hosts: Vec<Rank> = (0..groups.len() as Rank).collect();
        let (ta, tb) = Tree::double_binary(&hosts);
        let build = |across: &Tree, reversed: bool| {
            let n = order.len();
            let chain = |g: &[Rank]| -> Vec<Rank> {
                if reversed {
                    g.iter().rev().copied().collect()
                } else {
                    g.to_vec()
                }
            };
            let chains: Vec<Vec<Rank>> = groups.iter().map(|g| chain(&g.1)).collect();
            let mut t = Tree {
                root: chains[across.root as usize][0],
                parent: vec![None; n],
                children: vec![Vec::new(); n],
            };
            let mut edge = |p: Rank, c: Rank| {
                t.children[p as usize].push(c);
                t.parent[c as usize] = Some(p);
            };
            for (h, ch) in chains.iter().enumerate() {
                for &k in &across.children[h] {
                    edge(ch[0], chains[k as usize][0]);
                }
                for w in ch.windows(2) {
                    edge(w[0], w[1]);
                }
            }
            t
        };
        (build(&ta, false), build(&tb, true))
    }

    pub fn is_leaf(&self, r: Rank) -> bool {
        self.children[r as usize].is_empty()
    }

    /// Longest path from the root, in edges.
    pub fn depth(&self) -> usize {
        fn d(t: &Tree, r: Rank) -> usize {
            t.children[r as usize]
                .iter()
                .map(|&c| 1 + d(t, c))
                .max()
                .unwrap_or(0)
        }
        d(self, self.root)
    }
}

/// Position of the binary tree's root among n positions.
pub fn binary_root_pos(n: usize) -> usize {
    if n == 0 {
        0
    } else {
        (1usize << (usize::BITS - 1 - n.leading_zeros())) - 1
    }
}

/// The tree of channel `ch` for a single-tree algorithm, rooted at `root`.
fn single_tree(req: &PlanRequest, ch: u32, root: Rank) -> Tree {
    let ring = req.ring(ch);
    let n = ring.len();
    let rp = ring.iter().position(|&r| r == root).expect("root in ring");
    let start = match req.algo {
        Algo::Chain => rp,
        _ => (rp + n - binary_root_pos(n)) % n,
    };
    let order: Vec<Rank> = (0..n).map(|i| ring[(start + i) % n]).collect();
    match req.algo {
        Algo::Chain => Tree::chain(&order),
        _ => Tree::binary(&order),
    }
}

pub(super) fn build(req: &PlanRequest, rank: Rank, rp: &mut RankPlan) -> Result<(), CoreError> {
    for (ch, range) in split(req.coll.count, req.channels as usize)
        .into_iter()
        .enumerate()
    {
        if req.algo == Algo::DoubleBinaryTree {
            let ring = req.ring(ch as u32);
            let (t1, t2) = if req.hosts.is_empty() {
                Tree::double_binary(&ring)
            } else {
                Tree::double_binary_hosts(&ring, &req.hosts)
            };
            let halves = split(range.len(), 2);
            for (t, h) in [t1, t2].iter().zip(halves) {
                let part = range.start + h.start..range.start + h.end;
                rp.channels.push(channel(req, t, rank, part));
            }
        } else {
            let t = single_tree(req, ch as u32, req.coll.root);
            rp.channels.push(channel(req, &t, rank, range));
        }
    }
    Ok(())
}

fn channel(req: &PlanRequest, t: &Tree, rank: Rank, range: std::ops::Range<usize>) -> Channel {
    let mut s = Steps::default();
    let ps: Vec<_> = pieces(range, req.chunk).collect();
    let kids = &t.children[rank as usize];
    let parent = t.parent[rank as usize];
    let is_root = parent.is_none();
    let down = |off: usize| -> Vec<Dst> {
        let mut d = vec![out(off)];
        d.extend(kids.iter().map(|&c| send(c)));
        d
    };
    let gather = |off: usize| -> Vec<Src> {
        let mut srcs = vec![own(Loc::input(off))];
        srcs.extend(kids.iter().map(|&c| recv(c)));
        srcs
    };
    let up = |s: &mut Steps, off: usize, len: usize| match parent {
        Some(p) => s.xfer(gather(off), vec![send(p)], len, false),
        None => {
            let dsts = if req.coll.kind == CollKind::AllReduce {
                down(off)
            } else {
                vec![out(off)]
            };
            s.xfer(gather(off), dsts, len, true);
        }
    };
    let bcast = |s: &mut Steps, off: usize, len: usize| match parent {
        Some(p) => s.mv(recv(p), down(off), len),
        None => {
            let mut dsts = down(off);
            if req.in_place {
                dsts.remove(0);
            }
            s.mv(local(Loc::input(off)), dsts, len);
        }
    };
    match req.coll.kind {
        CollKind::Reduce => ps.iter().for_each(|p| up(&mut s, p.start, p.len())),
        CollKind::Broadcast => ps.iter().for_each(|p| bcast(&mut s, p.start, p.len())),
        _ => {
            for i in 0..=ps.len() {
                if let Some(p) = ps.get(i) {
                    up(&mut s, p.start, p.len());
                }
                if let Some(p) = i.checked_sub(1).and_then(|j| ps.get(j)) {
                    if !is_root {
                        s.mv(recv(parent.expect("not root")), down(p.start), p.len());
                    }
                }
            }
        }
    }
    Channel { steps: s.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(n: usize) -> Vec<Rank> {
        (0..n as Rank).collect()
    }

    fn assert_tree(t: &Tree, n: usize, max_kids: usize) {
        let mut seen = vec![false; n];
        let mut stack = vec![t.root];
        while let Some(r) = stack.pop() {
            assert!(
                !std::mem::replace(&mut seen[r as usize], true),
                "n={n}: cycle at {r}"
            );
            assert!(t.children[r as usize].len() <= max_kids);
            for &c in &t.children[r as usize] {
                assert_eq!(t.parent[c as usize], Some(r));
                stack.push(c);
            }
        }
        assert!(seen.iter().all(|&s| s), "n={n}: not spanning");
        assert_eq!(t.parent[t.root as usize], None);
    }

    #[test]
    fn double_binary_tree_leaf_interior_property() {
        for n in 1..=128usize {
            let (a, b) = Tree::double_binary(&identity(n));
            assert_tree(&a, n, 2);
            assert_tree(&b, n, 2);
            for r in 0..n as Rank {
                assert!(
                    a.is_leaf(r) || b.is_leaf(r),
                    "n={n}: rank {r} is interior in both trees"
                );
            }
            // Logarithmic depth.
            let log = usize::BITS - n.leading_zeros();
            assert!(
                a.depth() <= log as usize && b.depth() <= log as usize,
                "n={n}"
            );
        }
    }

    #[test]
    fn across_hosts_trees_span_cross_each_boundary_once_and_chain_inside() {
        // (ranks per host, hosts), hosts interleaved in rank order.
        for (per, nh) in [
            (1usize, 1usize),
            (1, 5),
            (3, 1),
            (2, 2),
            (4, 3),
            (3, 8),
            (8, 16),
        ] {
            let n = per * nh;
            let host_of: Vec<u32> = (0..n).map(|r| (r % nh) as u32).collect();
            let order = identity(n);
            let (a, b) = Tree::double_binary_hosts(&order, &host_of);
            for (t, name) in [(&a, "first"), (&b, "second")] {
                assert_tree(t, n, 3);
                let mut crossings = 0;
                for r in 0..n {
                    for &c in &t.children[r] {
                        if host_of[r] != host_of[c as usize] {
                            crossings += 1;
                        } else {
                            // Inside a host: a chain (one child there).
                            let inside = t.children[r]
                                .iter()
                                .filter(|&&k| host_of[k as usize] == host_of[r])
                                .count();
                            assert_eq!(inside, 1, "{name} tree, rank {r}");
                        }
                    }
                }
                // A spanning tree over hosts: nh - 1 network edges.
                assert_eq!(crossings, nh - 1, "{name} tree, {per} x {nh}");
                let log = (usize::BITS - nh.leading_zeros()) as usize;
                assert!(t.depth() <= per - 1 + log, "{name} tree, {per} x {nh}");
            }
            // Different ranks carry the two trees' network edges.
            if per > 1 && nh > 1 {
                assert_ne!(a.root, b.root);
            }
        }
    }

    #[test]
    fn shapes_follow_the_ring_order() {
        let order = [3, 1, 4, 0, 2];
        let c = Tree::chain(&order);
        assert_eq!(c.root, 3);
        assert_eq!(c.children[1], vec![4]);
        assert_tree(&c, 5, 1);
        let b = Tree::binary(&order);
        // Five positions: root at position 3 (label 4), children at 1 and 4.
        assert_eq!(b.root, 0);
        assert_eq!(b.children[0], vec![1, 2]);
    }
}
