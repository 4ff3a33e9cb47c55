//! Messages the network proxy may receive straight into their final place
//! (a "landing"), instead of into a FIFO slot the executor then copies
//! from: one memory pass less per byte received.
//!
//! A message qualifies when the step consuming it is a plain copy
//! (`Recv` → local destinations, no post-operation) on a link whose proxy
//! lands messages, and no other step of the call touches the first local
//! destination's bytes: the proxy writes them whenever the message
//! arrives, possibly before the executor reaches the step, so nothing else
//! may read or write them in between, in any order the channels run.
//! The step itself then finds its data in place and copies nothing there.

use crate::compile::{ODst, OSrc, Op, Program};

/// A message of this call that lands in place: the `nth` message (from
/// 0) this call receives on `prog.links[link]`, `bytes` bytes at `addr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Landing {
    pub link: usize,
    pub nth: u64,
    pub addr: usize,
    pub bytes: usize,
}

/// Every local range a step reads or writes, as `(start, end)` bytes.
fn ranges(prog: &Program, elem: usize) -> (Vec<usize>, Vec<usize>) {
    let (mut starts, mut ends) = (Vec::new(), Vec::new());
    let mut add = |addr: usize, bytes: usize| {
        if bytes > 0 {
            starts.push(addr);
            ends.push(addr + bytes);
        }
    };
    for op in prog.channels.iter().flatten() {
        match op {
            Op::Xfer(x) => {
                let bytes = x.len * elem;
                for s in &x.srcs {
                    if let OSrc::Local { addr, .. } = *s {
                        add(addr, bytes);
                    }
                }
                for d in &x.dsts {
                    if let ODst::Local { addr } = *d {
                        add(addr, bytes);
                    }
                }
            }
            Op::Swap { addr, len, .. } => add(*addr, len * elem),
            Op::Signal { .. } | Op::Wait { .. } => {}
        }
    }
    starts.sort_unstable();
    ends.sort_unstable();
    (starts, ends)
}

/// The messages of `prog` that may land in place, on the links
/// `lands(link)` says take landings.
pub(crate) fn landings(prog: &Program, elem: usize, lands: impl Fn(usize) -> bool) -> Vec<Landing> {
    let mut nth = vec![0u64; prog.links.len()];
    let mut out = Vec::new();
    let mut touched: Option<(Vec<usize>, Vec<usize>)> = None;
    for ch in &prog.channels {
        for op in ch {
            let Op::Xfer(x) = op else { continue };
            // The message number of each link this step receives on.
            let mut first = None;
            for s in &x.srcs {
                if let OSrc::Recv { link, .. } = *s {
                    first.get_or_insert((link, nth[link]));
                    nth[link] += 1;
                }
            }
            let Some((link, n)) = first else { continue };
            let plain = x.srcs.len() == 1 && !x.post && x.len > 0 && lands(link);
            let dst = x.dsts.iter().find_map(|d| match *d {
                ODst::Local { addr } => Some(addr),
                _ => None,
            });
            let (Some(addr), true) = (dst, plain) else {
                continue;
            };
            let bytes = x.len * elem;
            // Ranges overlapping [addr, addr+bytes): those starting before
            // its end minus those ending at or before its start. Its own
            // is one; the step's other destinations are disjoint from it.
            let (starts, ends) = touched.get_or_insert_with(|| ranges(prog, elem));
            let overlapping = starts.partition_point(|&s| s < addr + bytes)
                - ends.partition_point(|&e| e <= addr);
            if overlapping == 1 {
                out.push(Landing {
                    link,
                    nth: n,
                    addr,
                    bytes,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::compile::XOp;
    use crate::fifo::Link;

    fn xfer(srcs: Vec<OSrc>, dsts: Vec<ODst>, len: usize) -> Op {
        Op::Xfer(XOp {
            srcs,
            dsts,
            len,
            post: false,
        })
    }
    const RECV0: OSrc = OSrc::Recv { link: 0, peer: 1 };
    const RECV1: OSrc = OSrc::Recv { link: 1, peer: 1 };
    fn local(addr: usize) -> OSrc {
        OSrc::Local { addr, pre: false }
    }
    fn to(addr: usize) -> ODst {
        ODst::Local { addr }
    }
    fn prog(channels: Vec<Vec<Op>>) -> Program {
        Program {
            channels,
            links: (0..2).map(|_| Arc::new(Link::new(2, 64))).collect(),
            bufs: Vec::new(),
        }
    }
    fn at(link: usize, nth: u64, addr: usize, bytes: usize) -> Landing {
        Landing {
            link,
            nth,
            addr,
            bytes,
        }
    }

    #[test]
    fn a_copy_into_a_range_nothing_else_touches_lands() {
        // Two channels: channel 1's messages count on their own link.
        let p = prog(vec![
            vec![
                xfer(vec![local(0)], vec![ODst::Send { link: 0, peer: 1 }], 4),
                xfer(vec![RECV0], vec![to(1000)], 4),
                xfer(
                    vec![RECV0],
                    vec![to(1016), ODst::Send { link: 0, peer: 1 }],
                    4,
                ),
            ],
            vec![xfer(vec![RECV1], vec![to(2000)], 2)],
        ]);
        assert_eq!(
            landings(&p, 4, |_| true),
            [at(0, 0, 1000, 16), at(0, 1, 1016, 16), at(1, 0, 2000, 8)]
        );
        // Links that do not land, and empty messages, never do.
        assert_eq!(landings(&p, 4, |l| l == 1), [at(1, 0, 2000, 8)]);
        let empty = prog(vec![vec![xfer(vec![RECV0], vec![to(1000)], 0)]]);
        assert!(landings(&empty, 4, |_| true).is_empty());
    }

    #[test]
    fn a_range_another_step_touches_does_not_land() {
        let cases = [
            // Read earlier (sent from), on the same channel.
            vec![vec![
                xfer(vec![local(1000)], vec![ODst::Send { link: 0, peer: 1 }], 4),
                xfer(vec![RECV0], vec![to(1000)], 4),
            ]],
            // Written later by another channel, partly.
            vec![
                vec![xfer(vec![RECV0], vec![to(1000)], 4)],
                vec![xfer(vec![local(0)], vec![to(1012)], 4)],
            ],
            // Read by a reduction that ends just inside it.
            vec![
                vec![xfer(vec![RECV0], vec![to(1000)], 4)],
                vec![xfer(vec![local(990), local(0)], vec![to(3000)], 3)],
            ],
        ];
        for (i, c) in cases.into_iter().enumerate() {
            assert!(landings(&prog(c), 4, |_| true).is_empty(), "case {i}");
        }
        // Just touching (ending where it starts) is no overlap.
        let p = prog(vec![
            vec![xfer(vec![RECV0], vec![to(1000)], 4)],
            vec![xfer(vec![local(0)], vec![to(984)], 4)],
        ]);
        assert_eq!(landings(&p, 4, |_| true), [at(0, 0, 1000, 16)]);
    }

    #[test]
    fn reductions_and_post_operations_do_not_land_but_count_messages() {
        let post = XOp {
            srcs: vec![RECV0],
            dsts: vec![to(5000)],
            len: 4,
            post: true,
        };
        let p = prog(vec![vec![
            xfer(vec![RECV0, local(0)], vec![to(1000)], 4),
            Op::Xfer(post),
            xfer(vec![RECV0], vec![ODst::Send { link: 1, peer: 1 }], 4),
            xfer(vec![RECV0], vec![to(2000)], 4),
        ]]);
        // The fourth message of link 0 is the only one that lands.
        assert_eq!(landings(&p, 4, |_| true), [at(0, 3, 2000, 16)]);
    }
}
