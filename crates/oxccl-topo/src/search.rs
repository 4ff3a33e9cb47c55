//! Channel search: rings that maximise the bottleneck bandwidth, chains
//! inside a host and the double binary tree across hosts.
//!
//! Rings are searched among the distinct GPUs of one host. Each ring hop
//! uses the physical links of its path in one direction, and a ring at
//! speed `s` takes `s` from each, so rings that share a PCIe switch or the
//! inter-socket link really share it. Speeds are tried from high to low;
//! the set of rings with the largest total wins. Hops of NVLink class are
//! tried first and, when NVLink alone can close a ring, only they are used
//! (so DGX-1 rings are NVLink-only); otherwise the depth-first search
//! prefers the best class first, which keeps NUMA-local GPUs adjacent on
//! PCIe machines.

use crate::graph::{NodeId, Topology};
use crate::paths::Path;

/// Rings found on one host.
#[derive(Clone, Debug, PartialEq)]
pub struct RingSet {
    /// Each ring as positions in the GPU list searched.
    pub rings: Vec<Vec<usize>>,
    /// Bandwidth each ring gets, GB/s.
    pub bw_per_ring: f64,
    /// Whether every hop is direct NVLink or NVSwitch (or the same GPU).
    pub nvlink_only: bool,
}

impl RingSet {
    /// Sum over rings: the bus bandwidth rings can reach.
    pub fn total_bw(&self) -> f64 {
        self.bw_per_ring * self.rings.len() as f64
    }
}

/// Bound on depth-first expansions per ring, so a search on a large host
/// that has no NVLink-only ring gives up quickly and falls back.
const DFS_BUDGET: usize = 200_000;

struct Search<'a> {
    paths: &'a [Vec<Path>],
    residual: Vec<[f64; 2]>,
    nvlink_only: bool,
    budget: usize,
}

impl Search<'_> {
    fn fits(&self, a: usize, b: usize, s: f64) -> bool {
        let p = &self.paths[a][b];
        if self.nvlink_only && !p.class.is_nvlink() {
            return false;
        }
        p.links
            .iter()
            .all(|&(l, fwd)| self.residual[l][usize::from(!fwd)] >= s - 1e-9)
    }

    fn take(&mut self, a: usize, b: usize, s: f64) {
        for &(l, fwd) in &self.paths[a][b].links {
            self.residual[l][usize::from(!fwd)] -= s;
        }
    }

    fn ring(&mut self, n: usize, s: f64) -> Option<Vec<usize>> {
        let mut order = vec![0usize];
        let mut used = vec![false; n];
        used[0] = true;
        if self.dfs(n, s, &mut order, &mut used) {
            Some(order)
        } else {
            None
        }
    }

    fn dfs(&mut self, n: usize, s: f64, order: &mut Vec<usize>, used: &mut [bool]) -> bool {
        if self.budget == 0 {
            return false;
        }
        self.budget -= 1;
        let last = *order.last().unwrap_or(&0);
        if order.len() == n {
            return self.fits(last, order[0], s);
        }
        let mut cands: Vec<usize> = (0..n)
            .filter(|&c| !used[c] && self.fits(last, c, s))
            .collect();
        // Best class first, then widest, then lowest index: deterministic
        // and keeps close GPUs together.
        cands.sort_by(|&x, &y| {
            let (px, py) = (&self.paths[last][x], &self.paths[last][y]);
            (px.class.rank(), -px.bw, x)
                .partial_cmp(&(py.class.rank(), -py.bw, y))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        for c in cands {
            used[c] = true;
            order.push(c);
            if self.dfs(n, s, order, used) {
                return true;
            }
            order.pop();
            used[c] = false;
        }
        false
    }
}

/// Searches up to `max_rings` rings over `gpus` (distinct GPU nodes of one
/// host).
pub fn search_rings(topo: &Topology, gpus: &[NodeId], max_rings: usize) -> RingSet {
    let n = gpus.len();
    let max_rings = max_rings.max(1);
    if n <= 1 {
        let bw = gpus.first().map_or(0.0, |&g| topo.local_bw(g));
        return RingSet {
            rings: vec![(0..n).collect()],
            bw_per_ring: bw,
            nvlink_only: true,
        };
    }
    let paths: Vec<Vec<Path>> = gpus
        .iter()
        .map(|&a| gpus.iter().map(|&b| topo.path(a, b)).collect())
        .collect();
    let host = topo.nodes[gpus[0]].host;
    let mut speeds: Vec<f64> = Vec::new();
    for l in topo.links.iter().filter(|l| topo.nodes[l.a].host == host) {
        for k in 1..=max_rings {
            speeds.push(l.bw / k as f64);
        }
    }
    speeds.sort_by(|a, b| b.partial_cmp(a).unwrap_or(std::cmp::Ordering::Equal));
    speeds.dedup_by(|a, b| (*a - *b).abs() < 1e-6);
    let caps: Vec<[f64; 2]> = topo.links.iter().map(|l| [l.bw, l.bw]).collect();
    for nvlink_only in [true, false] {
        let mut best: Option<RingSet> = None;
        for &s in &speeds {
            if best
                .as_ref()
                .is_some_and(|b| s * max_rings as f64 <= b.total_bw() + 1e-9)
            {
                break;
            }
            let mut st = Search {
                paths: &paths,
                residual: caps.clone(),
                nvlink_only,
                budget: DFS_BUDGET,
            };
            let mut rings = Vec::new();
            while rings.len() < max_rings {
                st.budget = DFS_BUDGET;
                let Some(r) = st.ring(n, s) else { break };
                for i in 0..n {
                    st.take(r[i], r[(i + 1) % n], s);
                }
                rings.push(r);
            }
            if rings.is_empty() {
                continue;
            }
            let cand = RingSet {
                bw_per_ring: s,
                nvlink_only,
                rings,
            };
            if best
                .as_ref()
                .is_none_or(|b| cand.total_bw() > b.total_bw() + 1e-9)
            {
                best = Some(cand);
            }
        }
        if let Some(mut b) = best {
            b.nvlink_only = b
                .rings
                .iter()
                .all(|r| (0..n).all(|i| paths[r[i]][r[(i + 1) % n]].class.is_nvlink()));
            return b;
        }
    }
    // Unreachable in practice (some PCIe path always exists); a plain ring
    // at the worst bandwidth keeps callers going.
    let bw = (0..n)
        .map(|i| paths[i][(i + 1) % n].bw)
        .fold(f64::INFINITY, f64::min);
    RingSet {
        rings: vec![(0..n).collect()],
        bw_per_ring: bw,
        nvlink_only: false,
    }
}

/// One binary tree over `n` ranks: `parent[r]` (None for the root).
///
/// Ranks are placed in order in a balanced in-order tree (a rank's level is
/// its number of trailing zero bits), with rank 0 as a root above it, so
/// neighbours in rank order are close in the tree and most odd ranks are
/// leaves.
pub fn binary_tree(n: usize) -> Vec<Option<usize>> {
    let top = n.next_power_of_two();
    (0..n)
        .map(|r| {
            if r == 0 {
                return None;
            }
            let mut p = r;
            loop {
                let low = p & p.wrapping_neg();
                p = (p - low) | (low << 1);
                if p >= top {
                    return Some(0);
                }
                if p < n {
                    return Some(p);
                }
            }
        })
        .collect()
}

/// The two trees of a double binary tree over `n` ranks: the second is the
/// first mirrored (`n − 1 − r`) when `n` is even and shifted by one when it
/// is odd, so a rank that is interior in one tree tends to be a leaf in the
/// other and each tree carries half the data.
pub fn double_binary_tree(n: usize) -> [Vec<Option<usize>>; 2] {
    let t0 = binary_tree(n);
    let map = |r: usize| if n & 1 == 0 { n - 1 - r } else { (r + 1) % n };
    // t1 is t0 relabelled: physical rank map(v) plays virtual rank v.
    let mut t1 = vec![None; n];
    for v in 0..n {
        t1[map(v)] = t0[v].map(map);
    }
    [t0, t1]
}

/// Children lists of a tree given by parents.
pub fn children(parents: &[Option<usize>]) -> Vec<Vec<usize>> {
    let mut c = vec![Vec::new(); parents.len()];
    for (r, p) in parents.iter().enumerate() {
        if let Some(p) = p {
            c[*p].push(r);
        }
    }
    c
}

/// Depth of a tree (edges from the root to the deepest rank).
pub fn depth(parents: &[Option<usize>]) -> usize {
    (0..parents.len())
        .map(|mut r| {
            let mut d = 0;
            while let Some(p) = parents[r] {
                r = p;
                d += 1;
            }
            d
        })
        .max()
        .unwrap_or(0)
}
