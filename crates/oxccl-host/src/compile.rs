//! Checks a rank's plan against its buffers and this fabric, and resolves
//! it into a [`Program`]: every local operand an address, every connection
//! a [`Link`]. All validation happens here, before any step runs, so a bad
//! call writes nothing.

use std::collections::HashMap;
use std::sync::Arc;

use oxccl_core::plan::{BufRole, Dst, Loc, Rank, RankPlan, Src, Step, Xfer};

use crate::error::HostError;
use crate::fifo::Link;
use crate::view::FabricView;
use crate::HostBuf;

/// A resolved step.
#[derive(Debug)]
pub(crate) enum Op {
    Xfer(XOp),
    Signal {
        link: usize,
        peer: Rank,
    },
    Wait {
        link: usize,
        peer: Rank,
    },
    /// Exchange `len` elements at local `addr` with the peer's buffer
    /// `buf` at element `off` (resolved at run time, as remote operands).
    Swap {
        addr: usize,
        peer: Rank,
        buf: usize,
        off: usize,
        len: usize,
    },
}

/// A resolved transfer; `len` in elements.
#[derive(Debug)]
pub(crate) struct XOp {
    pub srcs: Vec<OSrc>,
    pub dsts: Vec<ODst>,
    pub len: usize,
    pub post: bool,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum OSrc {
    Local {
        addr: usize,
        pre: bool,
    },
    Recv {
        link: usize,
        peer: Rank,
    },
    /// Resolved at run time against the peer's published buffers.
    Remote {
        peer: Rank,
        buf: usize,
        off: usize,
        pre: bool,
    },
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum ODst {
    Local { addr: usize },
    Send { link: usize, peer: Rank },
    Remote { peer: Rank, buf: usize, off: usize },
}

/// A rank's plan, ready to run.
#[derive(Debug)]
pub(crate) struct Program {
    pub channels: Vec<Vec<Op>>,
    pub links: Vec<Arc<Link>>,
    /// Per plan buffer: address and length in elements, as published to
    /// peers for remote steps.
    pub bufs: Vec<(usize, usize)>,
}

/// A rank's scratch memory, reused between calls: 8-byte words of this
/// process's heap (ranks as threads), or a block of the rank's shared heap
/// (ranks as processes: peers' remote steps may address it).
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    heap: Vec<u64>,
    shared: Option<(usize, usize)>,
}

impl Scratch {
    pub(crate) fn new() -> Scratch {
        Scratch::default()
    }

    /// The address of at least `bytes` bytes of scratch, 64-byte aligned.
    fn base(&mut self, fab: &impl FabricView, bytes: usize) -> Result<usize, HostError> {
        if !fab.shared_heap() {
            let words = bytes.div_ceil(8);
            if self.heap.len() < words {
                self.heap.resize(words, 0);
            }
            return Ok(self.heap.as_mut_ptr() as usize);
        }
        match self.shared {
            Some((addr, have)) if have >= bytes => return Ok(addr),
            Some((addr, _)) => fab.free_shared(addr as *mut u8),
            None => {}
        }
        self.shared = None;
        let addr = fab.alloc_shared(bytes.max(64))? as usize;
        self.shared = Some((addr, bytes.max(64)));
        Ok(addr)
    }
}

/// Builds the program for `plan` over `bufs` with elements of `elem`
/// bytes, carving scratch buffers out of `scratch`.
pub(crate) fn compile(
    fab: &impl FabricView,
    plan: &RankPlan,
    bufs: &[HostBuf],
    elem: usize,
    scratch: &mut Scratch,
) -> Result<Program, HostError> {
    let addrs = place(fab, plan, bufs, elem, scratch)?;
    let mut links = Links {
        fab,
        index: HashMap::new(),
        links: Vec::new(),
    };
    let slot_bytes = fab.config().slot_bytes;
    let mut channels = Vec::with_capacity(plan.channels.len());
    for (c, ch) in plan.channels.iter().enumerate() {
        let mut ops = Vec::with_capacity(ch.steps.len());
        for (s, step) in ch.steps.iter().enumerate() {
            let cx = StepCx {
                me: plan.rank,
                c,
                s,
                plan,
                addrs: &addrs,
                elem,
            };
            ops.push(cx.lower(step, &mut links, slot_bytes)?);
        }
        channels.push(ops);
    }
    Ok(Program {
        channels,
        links: links.links,
        bufs: addrs,
    })
}

/// Checks `plan` against the fabric and `bufs`, and gives every buffer
/// of the plan its `(address, length)`: the caller's, or a 64-byte
/// aligned region of scratch.
fn place(
    fab: &impl FabricView,
    plan: &RankPlan,
    bufs: &[HostBuf],
    elem: usize,
    scratch: &mut Scratch,
) -> Result<Vec<(usize, usize)>, HostError> {
    let me = plan.rank;
    let bad = |m: String| Err(HostError::InvalidPlan(format!("rank {me}: {m}")));
    if plan.nranks != fab.nranks() || me >= plan.nranks {
        return bad(format!(
            "plan is for rank {me} of {} but the fabric has {} ranks",
            plan.nranks,
            fab.nranks()
        ));
    }
    let given = plan
        .bufs
        .iter()
        .filter(|b| b.role != BufRole::Scratch)
        .count();
    if bufs.len() != given {
        return bad(format!(
            "{} buffers given, the plan declares {given} (not counting scratch)",
            bufs.len()
        ));
    }
    // Scratch: one 64-byte-aligned region per scratch buffer.
    let mut scratch_offs = Vec::new();
    let mut total = 0usize;
    for d in plan.bufs.iter().filter(|b| b.role == BufRole::Scratch) {
        scratch_offs.push(total);
        let bytes = d
            .len
            .checked_mul(elem)
            .ok_or_else(|| HostError::InvalidPlan(format!("rank {me}: scratch size overflows")))?;
        total = total.saturating_add(bytes.next_multiple_of(64));
    }
    if plan.channels.len() > fab.max_channels() {
        return bad(format!(
            "{} channels, this fabric runs at most {}",
            plan.channels.len(),
            fab.max_channels()
        ));
    }
    let scratch_base = scratch.base(fab, total)?;
    let mut user = bufs.iter();
    let mut scratch_regions = scratch_offs.into_iter();
    let mut addrs = Vec::with_capacity(plan.bufs.len());
    for (i, d) in plan.bufs.iter().enumerate() {
        if d.role == BufRole::Scratch {
            let off = scratch_regions
                .next()
                .expect("one region per scratch buffer");
            addrs.push((scratch_base + off, d.len));
            continue;
        }
        let b = user.next().expect("counted above");
        let need = d.len.saturating_mul(elem);
        if b.bytes < need {
            return bad(format!(
                "buffer {i} ({:?}) has {} bytes, the plan needs {need}",
                d.role, b.bytes
            ));
        }
        if d.len > 0 && (b.ptr.is_null() || !(b.ptr as usize).is_multiple_of(elem)) {
            return bad(format!(
                "buffer {i} ({:?}) pointer {:p} is null or not aligned to {elem} bytes",
                d.role, b.ptr
            ));
        }
        addrs.push((b.ptr as usize, d.len));
    }
    Ok(addrs)
}

/// The program's connections, each looked up once.
struct Links<'f, F> {
    fab: &'f F,
    index: HashMap<(usize, Rank, Rank), usize>,
    links: Vec<Arc<Link>>,
}

impl<F: FabricView> Links<'_, F> {
    /// The program's index of connection `(c, from, to)`.
    fn get(&mut self, c: usize, from: Rank, to: Rank) -> usize {
        *self.index.entry((c, from, to)).or_insert_with(|| {
            self.links.push(self.fab.link(c, from, to));
            self.links.len() - 1
        })
    }
}

/// One step being lowered: where it is, and the rank's placed buffers.
struct StepCx<'p> {
    me: Rank,
    c: usize,
    s: usize,
    plan: &'p RankPlan,
    addrs: &'p [(usize, usize)],
    elem: usize,
}

impl StepCx<'_> {
    fn err(&self, m: String) -> HostError {
        HostError::InvalidPlan(format!(
            "rank {} channel {} step {}: {m}",
            self.me, self.c, self.s
        ))
    }

    fn peer(&self, p: Rank) -> Result<Rank, HostError> {
        if p < self.plan.nranks {
            Ok(p)
        } else {
            Err(self.err(format!("peer {p} out of range")))
        }
    }

    /// The address of `len` elements at `l`, checked against the buffer's
    /// length (and, for a write, its role).
    fn local(&self, l: Loc, len: usize, write: bool) -> Result<usize, HostError> {
        let (decl, (addr, blen)) = self
            .plan
            .bufs
            .get(l.buf.0 as usize)
            .zip(self.addrs.get(l.buf.0 as usize))
            .ok_or_else(|| self.err(format!("no buffer {}", l.buf.0)))?;
        if l.off.checked_add(len).is_none_or(|end| end > *blen) {
            return Err(self.err(format!("{l}+{len} exceeds buffer length {blen}")));
        }
        if write && decl.role == BufRole::Input {
            return Err(self.err(format!("writes into input buffer at {l}")));
        }
        Ok(addr + l.off * self.elem)
    }

    fn lower<F: FabricView>(
        &self,
        step: &Step,
        links: &mut Links<'_, F>,
        slot_bytes: usize,
    ) -> Result<Op, HostError> {
        let me = self.me;
        Ok(match *step {
            Step::Signal { peer } => Op::Signal {
                link: links.get(self.c, me, self.peer(peer)?),
                peer,
            },
            Step::Wait { peer } => Op::Wait {
                link: links.get(self.c, self.peer(peer)?, me),
                peer,
            },
            Step::Swap {
                at: l,
                peer,
                peer_at,
                len,
            } => {
                if self.peer(peer)? == me {
                    return Err(self.err("swaps with itself".into()));
                }
                // Plans are symmetric: the peer's buffer has our declaration.
                self.local(peer_at, len, true)?;
                Op::Swap {
                    addr: self.local(l, len, true)?,
                    peer,
                    buf: peer_at.buf.0 as usize,
                    off: peer_at.off,
                    len,
                }
            }
            Step::Xfer(ref x) => Op::Xfer(XOp {
                srcs: self.sources(x, links)?,
                dsts: self.destinations(x, links, slot_bytes)?,
                len: x.len,
                post: x.post,
            }),
        })
    }

    fn sources<F: FabricView>(
        &self,
        x: &Xfer,
        links: &mut Links<'_, F>,
    ) -> Result<Vec<OSrc>, HostError> {
        if x.srcs.is_empty() {
            return Err(self.err("transfer without a source".into()));
        }
        let mut srcs = Vec::with_capacity(x.srcs.len());
        let mut recv_from = Vec::new();
        for src in &x.srcs {
            srcs.push(match *src {
                Src::Local { at: l, pre } => OSrc::Local {
                    addr: self.local(l, x.len, false)?,
                    pre,
                },
                Src::Recv { peer } => {
                    if recv_from.contains(&peer) {
                        return Err(self.err(format!("receives twice from peer {peer}")));
                    }
                    recv_from.push(peer);
                    OSrc::Recv {
                        link: links.get(self.c, self.peer(peer)?, self.me),
                        peer,
                    }
                }
                Src::Remote { peer, at: l, pre } => {
                    // The peer's buffer, by the peer's numbering (a
                    // Send/Recv plan's lists differ per rank): checked
                    // against what the peer published, at run time
                    // (`Fabric::remote`).
                    l.off
                        .checked_add(x.len)
                        .ok_or_else(|| self.err(format!("{l}+{} overflows", x.len)))?;
                    OSrc::Remote {
                        peer: self.peer(peer)?,
                        buf: l.buf.0 as usize,
                        off: l.off,
                        pre,
                    }
                }
            });
        }
        Ok(srcs)
    }

    fn destinations<F: FabricView>(
        &self,
        x: &Xfer,
        links: &mut Links<'_, F>,
        slot_bytes: usize,
    ) -> Result<Vec<ODst>, HostError> {
        let mut dsts = Vec::with_capacity(x.dsts.len());
        let mut send_to = Vec::new();
        let mut local_dsts: Vec<usize> = Vec::new();
        let bytes = x.len.saturating_mul(self.elem);
        for dst in &x.dsts {
            dsts.push(match *dst {
                Dst::Local(l) => {
                    let addr = self.local(l, x.len, true)?;
                    if local_dsts.iter().any(|&o| o.abs_diff(addr) < bytes) {
                        return Err(self.err("overlapping destinations".into()));
                    }
                    local_dsts.push(addr);
                    ODst::Local { addr }
                }
                Dst::Send { peer } => {
                    if send_to.contains(&peer) {
                        return Err(self.err(format!("sends twice to peer {peer}")));
                    }
                    send_to.push(peer);
                    if bytes > slot_bytes {
                        return Err(self.err(format!(
                            "message of {bytes} bytes exceeds the {slot_bytes}-byte slot; use chunk <= slot_bytes / element size"
                        )));
                    }
                    ODst::Send {
                        link: links.get(self.c, self.me, self.peer(peer)?),
                        peer,
                    }
                }
                Dst::Remote { peer, at: l } => {
                    self.local(l, x.len, true)?;
                    ODst::Remote {
                        peer: self.peer(peer)?,
                        buf: l.buf.0 as usize,
                        off: l.off,
                    }
                }
            });
        }
        Ok(dsts)
    }
}
