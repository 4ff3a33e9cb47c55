//! The cost model: for (collective, algorithm, protocol, channels) a time
//! `latency(steps, hop classes) + bytes × busbw factor / bandwidth`.
//!
//! `bytes` is the size nccl-tests reports ([`oxccl_core::Collective::bytes`]:
//! the larger of a rank's two buffers), so `bytes / time` is its algbw and
//! the model's bandwidths are bus bandwidths. All constants live in
//! [`crate::consts`].

use oxccl_core::{Algo, CollKind, Proto};

use crate::consts::HopClass;
use crate::select::Selector;

pub use crate::shape::Shape;

/// Whether the model times `algo` for `kind`: exactly the collectives that
/// have a generator ([`oxccl_core::gen::supports`], the one table), plus
/// Send/Recv as Ring. Send/Recv plans come from `gen::p2p`, not from a
/// collective generator; the model times them as one ring hop, and Ring is
/// the name NCCL logs for them.
pub fn serves(algo: Algo, kind: CollKind) -> bool {
    if kind == CollKind::SendRecv {
        return algo == Algo::Ring;
    }
    oxccl_core::gen::supports(algo, kind)
}

fn log2_ceil(n: u32) -> f64 {
    f64::from(n.max(1).next_power_of_two().trailing_zeros())
}

impl Selector {
    /// The model's time for one combination in µs, or `None` where it does not
    /// apply (the algorithm does not serve the collective, all-pairs off
    /// NVLink, LL128 off NVLink, or the constants' avoid list names it).
    pub fn predict(
        &self,
        kind: CollKind,
        algo: Algo,
        proto: Proto,
        channels: u32,
        bytes: usize,
        nranks: u32,
    ) -> Option<f64> {
        if !serves(algo, kind) || self.constants().avoids(kind, algo) {
            return None;
        }
        if algo == Algo::OneShotLl {
            return self.predict_oneshot_ll(proto, bytes, nranks);
        }
        self.predict_plan(kind, algo, proto, channels, bytes, nranks)
    }

    /// The one-step LL AllReduce: its own model, where the backend has
    /// the path ([`crate::consts::OneShotLlModel`]). It is the LL
    /// protocol, so it is timed (and reported) under LL only; ranks on
    /// several hosts never share its slots.
    fn predict_oneshot_ll(&self, proto: Proto, bytes: usize, nranks: u32) -> Option<f64> {
        let (c, s) = (self.constants(), self.shape());
        c.oneshot_ll
            .filter(|_| proto == Proto::LL && s.nnodes <= 1)
            .and_then(|m| m.time_us(nranks.max(1), bytes as f64))
    }

    /// [`Selector::predict`] for the plan-running algorithms (the caller
    /// checked the algorithm serves `kind` and is not avoided).
    fn predict_plan(
        &self,
        kind: CollKind,
        algo: Algo,
        proto: Proto,
        channels: u32,
        bytes: usize,
        nranks: u32,
    ) -> Option<f64> {
        let (c, s) = (self.constants(), self.shape());
        if proto == Proto::LL128 && !s.ll128_ok {
            return None;
        }
        let n = nranks.max(1);
        let bytes = bytes as f64;
        let nn = s.nnodes.clamp(1, n);
        let m = n.div_ceil(nn);
        let direct = crate::consts::is_direct(algo);
        let wide_open = matches!(
            kind,
            CollKind::AllToAll | CollKind::Gather | CollKind::Scatter
        );
        if direct && !s.direct_ok && !(algo == Algo::AllPairs && wide_open) {
            return None;
        }
        let pf = c.proto_factor(proto);
        let chan_bw = f64::from(channels.max(1)) * c.channel_cap(proto);
        if n == 1 {
            // Nothing crosses a link: a local copy at most, at what its
            // channels (blocks) move (one block alone copied 256 MiB at
            // about 38 GB/s on an H100), after the launch's base latency
            // (so a small copy keeps one channel).
            let bw = chan_bw.min(s.intra_bw).max(1e-9) * pf;
            return Some(c.base(algo, proto) + bytes / (bw * 1000.0));
        }
        let hop_in = c.hop(algo, proto, s.intra_hop);
        let hop_net = c.hop(algo, proto, HopClass::Net);
        let base = c.base(algo, proto);
        let multi = nn > 1;
        let net_bw = if multi { s.inter_bw } else { f64::INFINITY };
        let factor = kind.busbw_factor(n);
        let pf = if direct { pf * c.direct_bw } else { pf };
        // Each arm gives its latency, bandwidth, data and the hops a
        // message takes one after another (for `Constants::exposed_hop_us`).
        let (lat, bw, data, hops) = match algo {
            Algo::Ring | Algo::Chain => {
                let (steps, inter) = match kind {
                    CollKind::AllReduce => (2 * (n - 1), 2 * (nn - 1)),
                    CollKind::SendRecv => (1, u32::from(multi)),
                    _ => (n - 1, nn - 1),
                };
                let lat = base + f64::from(steps - inter) * hop_in + f64::from(inter) * hop_net;
                let mut bw = chan_bw.min(s.intra_bw).min(net_bw) * pf;
                if algo == Algo::Chain {
                    bw *= c.tree_bw;
                }
                let f = if kind == CollKind::SendRecv {
                    1.0
                } else {
                    factor
                };
                (lat, bw, bytes * f, f64::from(steps))
            }
            Algo::BinaryTree => {
                let depth = log2_ceil(m) * hop_in + log2_ceil(nn) * hop_net;
                let passes = if kind == CollKind::AllReduce {
                    2.0
                } else {
                    1.0
                };
                let lat = base + passes * depth;
                // An interior rank feeds two children from one port.
                let bw = chan_bw.min(s.intra_bw).min(net_bw) * pf * c.tree_bw / 2.0;
                let hops = passes * (log2_ceil(m) + log2_ceil(nn));
                (lat, bw, bytes * factor, hops)
            }
            Algo::DoubleBinaryTree => {
                let lat = base + 2.0 * (f64::from(m - 1) * hop_in + log2_ceil(nn) * hop_net);
                let bw = chan_bw.min(s.intra_bw).min(net_bw) * pf * c.tree_bw;
                let hops = 2.0 * (f64::from(m - 1) + log2_ceil(nn));
                (lat, bw, bytes * factor, hops)
            }
            Algo::OneShot => {
                let lat = base + hop_in + f64::from(n - 1) * c.direct_peer_lat;
                let bw = chan_bw.min(s.direct_bw) * pf;
                (lat, bw, bytes * f64::from(n - 1), 1.0)
            }
            Algo::TwoShot => {
                let lat = base + 2.0 * hop_in + 2.0 * f64::from(n - 1) * c.direct_peer_lat;
                let bw = chan_bw.min(s.direct_bw) * pf;
                (lat, bw, bytes * factor, 2.0)
            }
            Algo::AllPairs => {
                let hop = if multi { hop_net } else { hop_in };
                let lat = base + hop + f64::from(n - 1) * c.direct_peer_lat;
                let per_rank = if multi {
                    s.direct_bw.min(s.inter_bw / f64::from(m))
                } else {
                    s.direct_bw
                };
                let bw = chan_bw.min(per_rank) * pf;
                // Rooted: through FIFOs the root sends (or receives) every
                // peer's copy; the registered plans spread the root's
                // share over every rank (push Broadcast, spread Reduce:
                // each rank moves 1/n of it to or from all), so they move
                // what the ring does per rank, whatever n is.
                let data = match kind {
                    CollKind::Broadcast | CollKind::Reduce if !c.direct_fifo_free => {
                        bytes * f64::from(n - 1)
                    }
                    _ => bytes * factor,
                };
                (lat, bw, data, 1.0)
            }
            // Timed only where the backend runs the plans on its copy
            // engines ([`Constants::copy_engine`]); elsewhere they run as
            // the backend's other plans, slower than all-pairs' pushes.
            // A rank issues one copy per peer block per channel (so one
            // channel is best) and moves what all-pairs moves, at its
            // share of the engines, at most the port's rate.
            Algo::OneShotLl => return None, // timed by `predict`
            Algo::CopyEngine => {
                let ce = c.copy_engine?;
                let copies = f64::from(n) * f64::from(channels.max(1));
                let lat = ce.base_us + f64::from(n - 1) * ce.peer_us + copies * ce.issue_us;
                let bw = ce.rank_bw(s.ranks_per_gpu).min(s.direct_bw.max(1e-9));
                // Ordered by stream memory operations, not by kernels
                // waiting on each other: no hop of the kind the term prices.
                (lat, bw, bytes * factor, 0.0)
            }
        };
        let (lat_add, bw_mul) = c.correction_for(kind, algo, proto);
        let bw = (bw * bw_mul).max(1e-9);
        // A registered (FIFO-free) direct plan synchronises through an
        // entry and an exit barrier with every peer instead of passing
        // messages: where hops are exposed, each barrier waits on n − 1
        // peers' signals (across processes on one H100, the registered
        // two-shot ran 8 B AllReduce at 28.35 µs and 512 B at 56.29 where
        // the FIFO one-shot took 20.37 and 19.62).
        let hops = if direct && c.direct_fifo_free {
            2.0 * f64::from(n - 1)
        } else {
            hops
        };
        let exposed = hops * c.exposed_hop_us;
        Some((lat + lat_add).max(0.0) + exposed + data / (bw * 1000.0))
    }
}
