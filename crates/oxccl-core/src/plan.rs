//! The plan IR: algorithms as data.
//!
//! A [`Plan`] holds, for every rank, a list of channels; a channel is an
//! ordered list of [`Step`]s. A step is either a transfer ([`Xfer`]: read one
//! or more sources, combine them with the reduction operator, write one or
//! more destinations), a one-sided synchronisation ([`Step::Signal`],
//! [`Step::Wait`]), or an exchange with a peer's memory ([`Step::Swap`]).
//! NCCL's primitives are all shapes of `Xfer`:
//!
//! | NCCL primitive            | sources              | destinations          |
//! |---------------------------|----------------------|-----------------------|
//! | send                      | local                | send                  |
//! | recv                      | recv                 | local                 |
//! | recv_reduce               | recv, local          | local                 |
//! | recv_reduce_send          | recv, local          | send                  |
//! | recv_reduce_copy_send     | recv, local          | local, send           |
//! | recv_copy_send            | recv                 | local, send           |
//! | copy / reduce             | local (one or more)  | local                 |
//! | get / reduce_from / put   | remote ...           | ... remote            |
//!
//! Invariants (enforced by [`crate::interp`], which is also the checker):
//! - Messages on a connection `(channel, from, to)` are received in the order
//!   they were sent, with the same length; so plans cannot deadlock when every
//!   connection holds at least one message.
//! - Channels of one rank never depend on each other: they touch disjoint
//!   output and scratch ranges, so a backend may run them in any interleaving.
//! - A step reduces its sources left to right, so results are deterministic
//!   for a given plan.
//! - Remote sources/destinations refer to the peer's buffer of the same id
//!   (plans are symmetric) and are only legal on registered buffers.

use std::fmt;

use crate::coll::{Algo, Collective};

/// A rank number.
pub type Rank = u32;

/// Index of a buffer in [`RankPlan::bufs`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufId(pub u16);

impl BufId {
    /// Conventional ids for a single collective's plan.
    pub const INPUT: BufId = BufId(0);
    pub const OUTPUT: BufId = BufId(1);
    pub const SCRATCH: BufId = BufId(2);
}

/// What a buffer is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BufRole {
    /// The user's send buffer: read only, initially valid.
    Input,
    /// The user's receive buffer.
    Output,
    /// Backend-provided temporary memory, initially undefined.
    Scratch,
}

/// A buffer a rank's plan uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufDecl {
    pub role: BufRole,
    /// Length in elements.
    pub len: usize,
    /// Whether every element must be written by the plan (outputs the
    /// collective defines on this rank).
    pub must_write: bool,
}

/// A position in a buffer, in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Loc {
    pub buf: BufId,
    pub off: usize,
}

impl Loc {
    pub const fn new(buf: BufId, off: usize) -> Self {
        Loc { buf, off }
    }
    pub const fn input(off: usize) -> Self {
        Loc::new(BufId::INPUT, off)
    }
    pub const fn output(off: usize) -> Self {
        Loc::new(BufId::OUTPUT, off)
    }
    pub const fn scratch(off: usize) -> Self {
        Loc::new(BufId::SCRATCH, off)
    }
}

/// A source operand of a transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Src {
    /// This rank's memory. `pre`: apply the op's pre-scale (this is the
    /// rank's own contribution entering a reduction).
    Local { at: Loc, pre: bool },
    /// The next message on the connection from `peer` on this channel.
    Recv { peer: Rank },
    /// A peer's registered buffer, read directly.
    Remote { peer: Rank, at: Loc, pre: bool },
}

/// A destination operand of a transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dst {
    Local(Loc),
    /// A message on the connection to `peer` on this channel.
    Send {
        peer: Rank,
    },
    /// A peer's registered buffer, written directly.
    Remote {
        peer: Rank,
        at: Loc,
    },
}

/// Read `srcs`, reduce them left to right, optionally post-process, write
/// every destination. `len` elements.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Xfer {
    pub srcs: Vec<Src>,
    pub dsts: Vec<Dst>,
    pub len: usize,
    /// Apply the op's post-operation (integer Avg's division) to the result.
    pub post: bool,
}

/// One step of a channel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    Xfer(Xfer),
    /// Bump the semaphore `(channel, self -> peer)`. Releases every earlier
    /// write of this channel (including remote puts) to the peer.
    Signal {
        peer: Rank,
    },
    /// Wait until the semaphore `(channel, peer -> self)` exceeds the number
    /// of waits on it so far; acquires what the peer released.
    Wait {
        peer: Rank,
    },
    /// Exchange `len` elements between this rank's `at` and `peer`'s
    /// registered `peer_at`: element by element, both are read before
    /// either is written, so two blocks trade places in one pass with no
    /// scratch (in-place AllToAll). Both locations are read and written.
    Swap {
        at: Loc,
        peer: Rank,
        peer_at: Loc,
        len: usize,
    },
}

/// One channel's steps on one rank.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Channel {
    pub steps: Vec<Step>,
}

/// Everything one rank executes for one operation (or one group).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RankPlan {
    pub rank: Rank,
    pub nranks: u32,
    pub bufs: Vec<BufDecl>,
    pub channels: Vec<Channel>,
}

/// A whole plan: every rank's part.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Plan {
    pub algo: Algo,
    /// The collective it implements (`None` for Send/Recv groups).
    pub coll: Option<Collective>,
    pub nranks: u32,
    pub ranks: Vec<RankPlan>,
}

impl Xfer {
    /// A transfer with no post-operation.
    pub fn new(srcs: Vec<Src>, dsts: Vec<Dst>, len: usize) -> Self {
        Xfer {
            srcs,
            dsts,
            len,
            post: false,
        }
    }

    /// NCCL's name for this shape of transfer.
    pub fn primitive_name(&self) -> &'static str {
        let recv = self.srcs.iter().any(|s| matches!(s, Src::Recv { .. }));
        let remote_src = self.srcs.iter().any(|s| matches!(s, Src::Remote { .. }));
        let send = self.dsts.iter().any(|d| matches!(d, Dst::Send { .. }));
        let remote_dst = self.dsts.iter().any(|d| matches!(d, Dst::Remote { .. }));
        let local_dst = self.dsts.iter().any(|d| matches!(d, Dst::Local(_)));
        let reduce = self.srcs.len() > 1;
        match (recv, reduce, local_dst, send) {
            _ if remote_src && reduce => "reduce_from",
            _ if remote_src => "get",
            _ if remote_dst && reduce => "reduce_put",
            _ if remote_dst => "put",
            (true, false, false, false) => "recv_discard",
            (true, false, true, false) => "recv",
            (true, false, _, true) if local_dst => "recv_copy_send",
            (true, false, _, true) => "recv_send",
            (true, true, true, false) => "recv_reduce",
            (true, true, false, true) => "recv_reduce_send",
            (true, true, true, true) => "recv_reduce_copy_send",
            (false, false, false, true) => "send",
            (false, false, true, true) => "copy_send",
            (false, true, _, true) => "reduce_send",
            (false, false, _, false) => "copy",
            (false, true, _, false) => "reduce",
            (true, true, false, false) => "recv_reduce_discard",
        }
    }
}

impl RankPlan {
    /// The other ranks this rank's steps exchange with (messages, remote
    /// reads and writes, semaphores), ascending: whose kernels this rank's
    /// kernel waits for, directly.
    pub fn peers(&self) -> Vec<Rank> {
        let mut v: Vec<Rank> = self
            .channels
            .iter()
            .flat_map(|c| &c.steps)
            .flat_map(|s| -> Vec<Rank> {
                match s {
                    Step::Xfer(x) => x
                        .srcs
                        .iter()
                        .filter_map(|s| match *s {
                            Src::Recv { peer } | Src::Remote { peer, .. } => Some(peer),
                            Src::Local { .. } => None,
                        })
                        .chain(x.dsts.iter().filter_map(|d| match *d {
                            Dst::Send { peer } | Dst::Remote { peer, .. } => Some(peer),
                            Dst::Local(_) => None,
                        }))
                        .collect(),
                    Step::Signal { peer } | Step::Wait { peer } | Step::Swap { peer, .. } => {
                        vec![*peer]
                    }
                }
            })
            .filter(|&p| p != self.rank)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Whether any step touches a peer's memory directly.
    pub fn needs_registration(&self) -> bool {
        self.channels
            .iter()
            .flat_map(|c| &c.steps)
            .any(|s| match s {
                Step::Xfer(x) => {
                    x.srcs.iter().any(|s| matches!(s, Src::Remote { .. }))
                        || x.dsts.iter().any(|d| matches!(d, Dst::Remote { .. }))
                }
                Step::Swap { .. } => true,
                Step::Signal { .. } | Step::Wait { .. } => false,
            })
    }

    /// Largest message, in elements, sent on any connection: what a FIFO
    /// slot must hold.
    pub fn max_message(&self) -> usize {
        self.channels
            .iter()
            .flat_map(|c| &c.steps)
            .filter_map(|s| match s {
                Step::Xfer(x) if x.dsts.iter().any(|d| matches!(d, Dst::Send { .. })) => {
                    Some(x.len)
                }
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    /// Number of steps over all channels.
    pub fn step_count(&self) -> usize {
        self.channels.iter().map(|c| c.steps.len()).sum()
    }
}

impl Plan {
    /// Whether the plan is copies only, which a GPU backend runs on its
    /// copy engines with no SM ([`crate::Algo::sm_free`]).
    pub fn sm_free(&self) -> bool {
        self.algo.sm_free()
    }

    /// Combines several plans (a group) into one: buffers and channels of
    /// later plans are renumbered after those of earlier ones, so each
    /// operation keeps its own connections.
    pub fn merge(algo: Algo, plans: &[Plan]) -> Plan {
        let nranks = plans.first().map_or(0, |p| p.nranks);
        let mut ranks: Vec<RankPlan> = (0..nranks)
            .map(|r| RankPlan {
                rank: r,
                nranks,
                bufs: Vec::new(),
                channels: Vec::new(),
            })
            .collect();
        for p in plans {
            assert_eq!(
                p.nranks, nranks,
                "merged plans must have the same rank count"
            );
            for (dst, src) in ranks.iter_mut().zip(&p.ranks) {
                let base = u16::try_from(dst.bufs.len()).expect("too many buffers in a group");
                let shift = |l: Loc| Loc::new(BufId(l.buf.0 + base), l.off);
                dst.bufs.extend_from_slice(&src.bufs);
                for ch in &src.channels {
                    let steps = ch
                        .steps
                        .iter()
                        .map(|s| match s {
                            Step::Xfer(x) => Step::Xfer(Xfer {
                                srcs: x
                                    .srcs
                                    .iter()
                                    .map(|s| match *s {
                                        Src::Local { at, pre } => Src::Local { at: shift(at), pre },
                                        Src::Remote { peer, at, pre } => Src::Remote {
                                            peer,
                                            at: shift(at),
                                            pre,
                                        },
                                        r @ Src::Recv { .. } => r,
                                    })
                                    .collect(),
                                dsts: x
                                    .dsts
                                    .iter()
                                    .map(|d| match *d {
                                        Dst::Local(at) => Dst::Local(shift(at)),
                                        Dst::Remote { peer, at } => Dst::Remote {
                                            peer,
                                            at: shift(at),
                                        },
                                        s @ Dst::Send { .. } => s,
                                    })
                                    .collect(),
                                len: x.len,
                                post: x.post,
                            }),
                            Step::Swap {
                                at,
                                peer,
                                peer_at,
                                len,
                            } => Step::Swap {
                                at: shift(*at),
                                peer: *peer,
                                peer_at: shift(*peer_at),
                                len: *len,
                            },
                            other => other.clone(),
                        })
                        .collect();
                    dst.channels.push(Channel { steps });
                }
            }
        }
        Plan {
            algo,
            coll: None,
            nranks,
            ranks,
        }
    }
}

fn buf_name(b: BufId) -> String {
    match b {
        BufId::INPUT => "in".into(),
        BufId::OUTPUT => "out".into(),
        BufId::SCRATCH => "tmp".into(),
        BufId(i) => format!("buf{i}"),
    }
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", buf_name(self.buf), self.off)
    }
}

impl fmt::Display for Src {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let star = |p: bool| if p { "*" } else { "" };
        match self {
            Src::Local { at, pre } => write!(f, "{at}{}", star(*pre)),
            Src::Recv { peer } => write!(f, "recv({peer})"),
            Src::Remote { peer, at, pre } => write!(f, "r{peer}:{at}{}", star(*pre)),
        }
    }
}

impl fmt::Display for Dst {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dst::Local(at) => write!(f, "{at}"),
            Dst::Send { peer } => write!(f, "send({peer})"),
            Dst::Remote { peer, at } => write!(f, "r{peer}:{at}"),
        }
    }
}

impl fmt::Display for Step {
    /// `recv_reduce_send  recv(3) + in[128]* -> send(1)  x128` where `*`
    /// marks a pre-scaled source and `!post` a post-processed result.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Signal { peer } => write!(f, "signal({peer})"),
            Step::Wait { peer } => write!(f, "wait({peer})"),
            Step::Swap {
                at,
                peer,
                peer_at,
                len,
            } => write!(f, "{:<22}{at} <-> r{peer}:{peer_at}  x{len}", "swap"),
            Step::Xfer(x) => {
                write!(f, "{:<22}", x.primitive_name())?;
                for (i, s) in x.srcs.iter().enumerate() {
                    write!(f, "{}{s}", if i > 0 { " + " } else { "" })?;
                }
                f.write_str(" -> ")?;
                for (i, d) in x.dsts.iter().enumerate() {
                    write!(f, "{}{d}", if i > 0 { ", " } else { "" })?;
                }
                write!(f, "  x{}", x.len)?;
                if x.post {
                    f.write_str(" !post")?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for RankPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "rank {}/{}:", self.rank, self.nranks)?;
        for (i, b) in self.bufs.iter().enumerate() {
            writeln!(
                f,
                "  {} {:?} len {}",
                buf_name(BufId(i as u16)),
                b.role,
                b.len
            )?;
        }
        for (c, ch) in self.channels.iter().enumerate() {
            writeln!(f, "  channel {c}:")?;
            for (i, s) in ch.steps.iter().enumerate() {
                writeln!(f, "    {i:>4}  {s}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.coll {
            Some(c) => writeln!(
                f,
                "plan: {} count {} root {} algo {} on {} ranks",
                c.kind, c.count, c.root, self.algo, self.nranks
            )?,
            None => writeln!(
                f,
                "plan: group, algo {} on {} ranks",
                self.algo, self.nranks
            )?,
        }
        for r in &self.ranks {
            write!(f, "{r}")?;
        }
        Ok(())
    }
}
