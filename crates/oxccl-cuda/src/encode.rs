//! The device encoding of a [`RankPlan`]: fixed-size records the kernel in
//! `kernels/oxccl_exec.cuh` walks. Pure Rust, so it is tested without a GPU.
//!
//! Per channel an `OxChan` record (first step, step count, first operand,
//! operand count) travels in the launch's parameter (`OxDesc::chans`), so a
//! block knows where its records are without a memory round trip and
//! copies them into shared memory in one go. The uploaded blob (every part
//! 16-byte aligned) holds `steps[..]` then `operands[..]`. Connections and
//! semaphores are named by `(channel, from, to)` keys; in [`Encoded`] an
//! operand or a signal/wait step refers to them by table index, and the
//! blob carries the resolved pointer itself (a connection operand's `off`,
//! a signal/wait step's `len`, with the peer in its `first`), so the kernel
//! follows no table per step: each lookup was one more dependent memory
//! round trip on a small call's critical path. The same encoding serves
//! both FIFO protocols: under LL the connection pointers are LL
//! connections (see `kernels/oxccl_ll.cuh` and the LL helpers below).

use std::collections::HashMap;

use oxccl_core::plan::{Dst, RankPlan, Src, Step};

use crate::error::{CudaError, Result};
use crate::layout::{
    OxChan, OxOperand, OxStep, F_POST, F_PRE, K_CONN, K_LOCAL, K_REMOTE, MAX_BUFS, MAX_CHANNELS,
    MAX_OPERANDS, S_SIGNAL, S_SWAP, S_WAIT, S_XFER,
};

/// An LL line: {data 4 B, flag 4 B, data 4 B, flag 4 B}.
pub const LL_LINE: usize = 16;
/// Message bytes one LL line carries.
pub const LL_DATA: usize = 8;

/// Lines an LL message of `bytes` bytes takes: at least one, so an empty
/// message still orders the receiver after the sender (as `ox_exec` does).
pub fn ll_lines(bytes: usize) -> usize {
    bytes.div_ceil(LL_DATA).max(1)
}

/// Bytes of an LL slot that holds any message a `slot_bytes` Simple slot
/// holds (twice as many: half of each line is flags).
pub fn ll_slot_bytes(slot_bytes: usize) -> usize {
    ll_lines(slot_bytes) * LL_LINE
}

/// The flag of message `count` of a connection, as `ox_ll_flag` computes
/// it: never 0 (zeroed memory never passes for data) and repeating only
/// after `2^32 - 1` messages.
pub fn ll_flag(count: u64) -> u32 {
    (count % 0xFFFF_FFFF) as u32 + 1
}

/// `(channel, from, to)`: names a FIFO connection or a semaphore.
pub type LinkKey = (u32, u32, u32);

/// A plan in device form, before the pointer tables are known.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Encoded {
    /// Per channel: its records; a channel's operands are contiguous, in
    /// step order.
    pub chans: Vec<OxChan>,
    /// Per step. A signal/wait step holds its semaphore's table index in
    /// `first` and its peer in `len` until [`Encoded::blob`] swaps them
    /// for the device form (peer in `first`, address in `len`).
    pub steps: Vec<OxStep>,
    /// Per operand. A connection operand holds its table index in `idx`;
    /// the blob puts the connection's address in `off`.
    pub ops: Vec<OxOperand>,
    /// FIFO connections, by table index.
    pub conns: Vec<LinkKey>,
    /// Semaphores, by table index.
    pub sems: Vec<LinkKey>,
    /// Whether any step reads or writes a peer's buffer directly.
    pub remote: bool,
}

/// Byte offsets of each part in the blob (the steps start it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlobLayout {
    pub ops: usize,
    pub total: usize,
}

fn align16(x: usize) -> usize {
    x.div_ceil(16) * 16
}

fn index_of(table: &mut Vec<LinkKey>, map: &mut HashMap<LinkKey, u32>, k: LinkKey) -> u32 {
    *map.entry(k).or_insert_with(|| {
        table.push(k);
        (table.len() - 1) as u32
    })
}

fn small<T: TryFrom<usize>>(v: usize, what: &str) -> Result<T> {
    T::try_from(v)
        .map_err(|_| CudaError::Plan(format!("{what} {v} does not fit the device encoding")))
}

fn step(op: u8, nsrc: u8, ndst: u8, flags: u8, first: u32, len: u64) -> OxStep {
    OxStep {
        op,
        nsrc,
        ndst,
        flags,
        first,
        len,
    }
}

fn operand(kind: u8, flags: u8, buf: u16, idx: u32, off: u64) -> OxOperand {
    OxOperand {
        kind,
        flags,
        buf,
        idx,
        off,
    }
}

/// Encodes one rank's plan.
pub fn encode(rp: &RankPlan) -> Result<Encoded> {
    if rp.bufs.len() > MAX_BUFS {
        return Err(CudaError::Plan(format!(
            "{} buffers; the device executor takes at most {MAX_BUFS} (split the group)",
            rp.bufs.len()
        )));
    }
    if rp.channels.len() > MAX_CHANNELS {
        return Err(CudaError::Plan(format!(
            "{} channels; a launch carries at most {MAX_CHANNELS}",
            rp.channels.len()
        )));
    }
    let me = rp.rank;
    let mut e = Encoded::default();
    let (mut conn_map, mut sem_map) = (HashMap::new(), HashMap::new());
    for (c, ch) in rp.channels.iter().enumerate() {
        let c = c as u32;
        let first = small::<u32>(e.steps.len(), "step index")?;
        let op_first = small::<u32>(e.ops.len(), "operand index")?;
        for (i, s) in ch.steps.iter().enumerate() {
            match s {
                Step::Signal { peer } | Step::Wait { peer } => {
                    let (op, key) = match s {
                        Step::Signal { .. } => (S_SIGNAL, (c, me, *peer)),
                        _ => (S_WAIT, (c, *peer, me)),
                    };
                    let idx = index_of(&mut e.sems, &mut sem_map, key);
                    e.steps.push(step(op, 0, 0, 0, idx, u64::from(*peer)));
                }
                Step::Swap {
                    at,
                    peer,
                    peer_at,
                    len,
                } => {
                    // Two operands: this rank's range, then the peer's.
                    let first_op = small::<u32>(e.ops.len(), "operand index")?;
                    for l in [at, peer_at] {
                        if l.buf.0 as usize >= rp.bufs.len() {
                            return Err(CudaError::Plan(format!(
                                "channel {c} step {i}: buffer {} not declared",
                                l.buf.0
                            )));
                        }
                    }
                    e.remote = true;
                    e.ops.push(operand(K_LOCAL, 0, at.buf.0, 0, at.off as u64));
                    e.ops.push(operand(
                        K_REMOTE,
                        0,
                        peer_at.buf.0,
                        *peer,
                        peer_at.off as u64,
                    ));
                    e.steps.push(step(S_SWAP, 2, 0, 0, first_op, *len as u64));
                }
                Step::Xfer(x) => {
                    if x.srcs.is_empty()
                        || x.srcs.len() > MAX_OPERANDS
                        || x.dsts.len() > MAX_OPERANDS
                    {
                        return Err(CudaError::Plan(format!(
                            "channel {c} step {i}: {} sources and {} destinations (1..={MAX_OPERANDS} sources and at most {MAX_OPERANDS} destinations allowed)",
                            x.srcs.len(),
                            x.dsts.len()
                        )));
                    }
                    let first_op = small::<u32>(e.ops.len(), "operand index")?;
                    for s in &x.srcs {
                        let o = match *s {
                            Src::Local { at, pre } => operand(
                                K_LOCAL,
                                if pre { F_PRE } else { 0 },
                                at.buf.0,
                                0,
                                at.off as u64,
                            ),
                            Src::Recv { peer } => {
                                let idx = index_of(&mut e.conns, &mut conn_map, (c, peer, me));
                                operand(K_CONN, 0, small(peer as usize, "peer")?, idx, 0)
                            }
                            Src::Remote { peer, at, pre } => {
                                e.remote = true;
                                operand(
                                    K_REMOTE,
                                    if pre { F_PRE } else { 0 },
                                    at.buf.0,
                                    peer,
                                    at.off as u64,
                                )
                            }
                        };
                        e.ops.push(o);
                    }
                    for d in &x.dsts {
                        let o = match *d {
                            Dst::Local(at) => operand(K_LOCAL, 0, at.buf.0, 0, at.off as u64),
                            Dst::Send { peer } => {
                                let idx = index_of(&mut e.conns, &mut conn_map, (c, me, peer));
                                operand(K_CONN, 0, small(peer as usize, "peer")?, idx, 0)
                            }
                            Dst::Remote { peer, at } => {
                                e.remote = true;
                                operand(K_REMOTE, 0, at.buf.0, peer, at.off as u64)
                            }
                        };
                        e.ops.push(o);
                    }
                    for o in &e.ops[first_op as usize..] {
                        // A remote operand names the peer's buffer by the
                        // peer's numbering (Send/Recv plans differ per
                        // rank): it must only fit the pointer table.
                        let declared = match o.kind {
                            K_CONN => continue,
                            K_REMOTE => MAX_BUFS,
                            _ => rp.bufs.len(),
                        };
                        if o.buf as usize >= declared {
                            return Err(CudaError::Plan(format!(
                                "channel {c} step {i}: buffer {} not declared",
                                o.buf
                            )));
                        }
                    }
                    e.steps.push(step(
                        S_XFER,
                        x.srcs.len() as u8,
                        x.dsts.len() as u8,
                        if x.post { F_POST } else { 0 },
                        first_op,
                        x.len as u64,
                    ));
                }
            }
        }
        e.chans.push(OxChan {
            first,
            nsteps: small::<u32>(ch.steps.len(), "step count")?,
            op_first,
            nops: small::<u32>(e.ops.len() - op_first as usize, "operand count")?,
        });
        mark_runs(&mut e.steps[first as usize..]);
    }
    Ok(e)
}

/// Most signals or waits one run of the kernel handles (a `u8` field).
pub const MAX_RUN: usize = 255;

/// Marks runs of consecutive signals (or waits) in one channel's steps, so
/// the kernel handles a run in parallel without scanning the step list:
/// each step of a run gets in `nsrc` the steps left in its run from there
/// (the run's first step: its length; runs longer than [`MAX_RUN`] are cut
/// into pieces of at most that), and, for waits, in `ndst` how many earlier
/// waits of its piece use the same semaphore (that wait needs as many more
/// signals). Xfer steps are left alone.
fn mark_runs(steps: &mut [OxStep]) {
    let mut i = 0;
    while i < steps.len() {
        let op = steps[i].op;
        if op != S_SIGNAL && op != S_WAIT {
            i += 1;
            continue;
        }
        let mut end = i + 1;
        while end < steps.len() && end - i < MAX_RUN && steps[end].op == op {
            end += 1;
        }
        for j in i..end {
            let dup = steps[i..j]
                .iter()
                .filter(|s| s.first == steps[j].first)
                .count();
            steps[j].nsrc = (end - j) as u8;
            steps[j].ndst = if op == S_WAIT { dup as u8 } else { 0 };
        }
        i = end;
    }
}

impl Encoded {
    /// The fewest threads a block needs to run these steps: the kernel
    /// gives each operand of a transfer, and each signal or wait of a run,
    /// a thread of its own.
    pub fn min_threads(&self) -> u32 {
        self.steps
            .iter()
            .map(|s| match s.op {
                S_SIGNAL | S_WAIT => u32::from(s.nsrc.max(1)),
                _ => u32::from(s.nsrc) + u32::from(s.ndst),
            })
            .max()
            .unwrap_or(0)
            .max(1)
    }

    /// The longest transfer or swap, in elements.
    pub fn max_len(&self) -> u64 {
        self.steps
            .iter()
            .filter(|s| s.op == S_XFER || s.op == S_SWAP)
            .map(|s| s.len)
            .max()
            .unwrap_or(0)
    }

    pub fn layout(&self) -> BlobLayout {
        let ops = self.steps.len() * std::mem::size_of::<OxStep>();
        let total = align16(ops + self.ops.len() * std::mem::size_of::<OxOperand>()).max(16);
        BlobLayout { ops, total }
    }

    /// The blob, with connection operands and signal/wait steps pointing
    /// at `conn_ptrs` / `sem_ptrs` (one per entry of `conns` / `sems`).
    pub fn blob(&self, conn_ptrs: &[u64], sem_ptrs: &[u64]) -> Vec<u8> {
        assert_eq!(
            conn_ptrs.len(),
            self.conns.len(),
            "one pointer per connection"
        );
        assert_eq!(sem_ptrs.len(), self.sems.len(), "one pointer per semaphore");
        let l = self.layout();
        let mut b = vec![0u8; l.total];
        let mut put = |at: usize, bytes: &[u8]| b[at..at + bytes.len()].copy_from_slice(bytes);
        for (i, st) in self.steps.iter().enumerate() {
            let mut st = *st;
            if st.op == S_SIGNAL || st.op == S_WAIT {
                // The peer (kept in `len` by `encode`) and the
                // semaphore's address.
                st = OxStep {
                    first: st.len as u32,
                    len: sem_ptrs[st.first as usize],
                    ..st
                };
            }
            put(i * std::mem::size_of::<OxStep>(), &st.to_le_bytes());
        }
        for (i, o) in self.ops.iter().enumerate() {
            let mut o = *o;
            if o.kind == K_CONN {
                o.off = conn_ptrs[o.idx as usize];
            }
            put(
                l.ops + i * std::mem::size_of::<OxOperand>(),
                &o.to_le_bytes(),
            );
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl_core::gen::{generate, PlanRequest};
    use oxccl_core::plan::{BufDecl, BufRole, Channel, Loc, Xfer};
    use oxccl_core::{Algo, CollKind, Collective};

    #[test]
    fn ring_allreduce_uses_two_connections_per_channel() {
        let req = PlanRequest {
            channels: 3,
            chunk: 7,
            ..PlanRequest::new(Collective::new(CollKind::AllReduce, 1000, 0), 4, Algo::Ring)
        };
        let plan = generate(&req).unwrap();
        let e = encode(&plan.ranks[1]).unwrap();
        assert_eq!(e.chans.len(), 3);
        // Each channel receives from rank 0 and sends to rank 2.
        assert_eq!(e.conns.len(), 6);
        assert!(e.conns.contains(&(2, 0, 1)) && e.conns.contains(&(2, 1, 2)));
        assert_eq!(e.steps.len(), plan.ranks[1].step_count());
        assert!(!e.remote);
        let total: usize = e.chans.iter().map(|c| c.nsteps as usize).sum();
        assert_eq!(total, e.steps.len());
    }

    /// A remote operand names the peer's buffer by the peer's numbering
    /// (a Send/Recv receiver with one buffer reads the sender's third):
    /// accepted up to the pointer table's width, refused past it.
    #[test]
    fn remote_operands_use_the_peers_buffer_numbering() {
        let read = |buf: u16| RankPlan {
            rank: 1,
            nranks: 2,
            bufs: vec![BufDecl {
                role: BufRole::Output,
                len: 8,
                must_write: true,
            }],
            channels: vec![Channel {
                steps: vec![Step::Xfer(Xfer {
                    srcs: vec![Src::Remote {
                        peer: 0,
                        at: Loc::new(oxccl_core::plan::BufId(buf), 0),
                        pre: false,
                    }],
                    dsts: vec![Dst::Local(Loc::new(oxccl_core::plan::BufId(0), 0))],
                    len: 8,
                    post: false,
                })],
            }],
        };
        assert!(encode(&read(2)).unwrap().remote);
        assert!(encode(&read(MAX_BUFS as u16 - 1)).is_ok());
        let e = encode(&read(MAX_BUFS as u16)).unwrap_err().to_string();
        assert!(e.contains("not declared"), "{e}");
    }

    /// An input of `input` and an output of `output` elements.
    fn in_out(input: usize, output: usize) -> Vec<BufDecl> {
        let decl = |role, len| BufDecl {
            role,
            len,
            must_write: role == BufRole::Output,
        };
        vec![decl(BufRole::Input, input), decl(BufRole::Output, output)]
    }

    #[test]
    fn blob_places_records_little_endian() {
        let rp = RankPlan {
            rank: 0,
            nranks: 2,
            bufs: in_out(10, 10),
            channels: vec![Channel {
                steps: vec![
                    Step::Signal { peer: 1 },
                    Step::Wait { peer: 1 },
                    Step::Xfer(Xfer {
                        srcs: vec![
                            Src::Local {
                                at: Loc::input(3),
                                pre: true,
                            },
                            Src::Remote {
                                peer: 1,
                                at: Loc::input(3),
                                pre: true,
                            },
                        ],
                        dsts: vec![Dst::Local(Loc::output(3)), Dst::Send { peer: 1 }],
                        len: 5,
                        post: true,
                    }),
                ],
            }],
        };
        let e = encode(&rp).unwrap();
        assert!(e.remote);
        assert_eq!(e.sems, vec![(0, 0, 1), (0, 1, 0)]);
        assert_eq!(e.conns, vec![(0, 0, 1)]);
        let b = e.blob(&[0xAABB], &[1, 2]);
        let l = e.layout();
        assert_eq!(l.total % 16, 0);
        // The channel record: steps 0..3, operands 0..4.
        assert_eq!(
            e.chans,
            vec![OxChan {
                first: 0,
                nsteps: 3,
                op_first: 0,
                nops: 4
            }]
        );
        // The wait: peer 1 in `first`, its semaphore's address (table
        // entry 1) in `len`.
        let wait = &b[16..32];
        assert_eq!(wait[0], S_WAIT);
        assert_eq!(u32::from_le_bytes(wait[4..8].try_into().unwrap()), 1);
        assert_eq!(u64::from_le_bytes(wait[8..16].try_into().unwrap()), 2);
        let step2 = &b[32..48];
        assert_eq!(&step2[..4], &[S_XFER, 2, 2, F_POST]);
        // The send operand carries its connection's address.
        let send = &b[l.ops + 48..l.ops + 64];
        assert_eq!(send[0], K_CONN);
        assert_eq!(u64::from_le_bytes(send[8..16].try_into().unwrap()), 0xAABB);
        assert_eq!(u64::from_le_bytes(step2[8..16].try_into().unwrap()), 5);
        let remote = &b[l.ops + 16..l.ops + 32];
        assert_eq!(remote[0], K_REMOTE);
        assert_eq!(u32::from_le_bytes(remote[4..8].try_into().unwrap()), 1);
        assert_eq!(u64::from_le_bytes(remote[8..16].try_into().unwrap()), 3);
        assert_eq!(l.ops, 3 * 16);
        assert_eq!(l.total, l.ops + 4 * 16);
    }

    #[test]
    fn ll_slots_hold_any_simple_message() {
        for slot in [16usize, 4096, 512 << 10] {
            let ll = ll_slot_bytes(slot);
            assert_eq!(ll, 2 * slot);
            for bytes in [0, 1, 7, 8, 9, slot - 1, slot] {
                assert!(ll_lines(bytes) * LL_LINE <= ll, "{bytes} bytes in {ll}");
            }
        }
        assert_eq!(ll_lines(0), 1);
        assert_eq!(ll_lines(1), 1);
        assert_eq!(ll_lines(9), 2);
        // 1001 two-byte elements: 2002 bytes, 251 lines, the last half used.
        assert_eq!(ll_lines(2002), 251);
    }

    #[test]
    fn ll_flags_are_never_zero_and_differ_between_neighbours() {
        let edges = [
            0u64,
            1,
            0xFFFF_FFFD,
            0xFFFF_FFFE,
            0xFFFF_FFFF,
            1 << 32,
            u64::MAX,
        ];
        for c in edges {
            assert_ne!(ll_flag(c), 0, "count {c}");
            // A slot is reused every nslots messages: its old flag differs.
            for nslots in [2u64, 4, 8] {
                if let Some(prev) = c.checked_sub(nslots) {
                    assert_ne!(ll_flag(c), ll_flag(prev), "count {c}, {nslots} slots");
                }
            }
        }
        assert_eq!(ll_flag(0), 1);
        assert_eq!(ll_flag(0xFFFF_FFFE), 0xFFFF_FFFF);
        assert_eq!(ll_flag(0xFFFF_FFFF), 1);
    }

    /// Offsets and lengths past 2^32 elements (2^34 bytes of f32) reach the
    /// blob whole: the kernel multiplies them by the element size in u64,
    /// so no 32-bit field may carry them.
    #[test]
    fn offsets_past_32_bits_survive_encoding() {
        let big = (1usize << 32) + 12_345;
        let len = (1usize << 31) + 7;
        let rp = RankPlan {
            rank: 0,
            nranks: 2,
            bufs: in_out(big + len, 2 * big + len),
            channels: vec![Channel {
                steps: vec![Step::Xfer(Xfer::new(
                    vec![Src::Remote {
                        peer: 1,
                        at: Loc::input(big),
                        pre: false,
                    }],
                    vec![Dst::Local(Loc::output(2 * big))],
                    len,
                ))],
            }],
        };
        let e = encode(&rp).unwrap();
        let b = e.blob(&[], &[]);
        let l = e.layout();
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        assert_eq!(u64_at(8), len as u64);
        assert_eq!(u64_at(l.ops + 8), big as u64);
        assert_eq!(u64_at(l.ops + 16 + 8), 2 * big as u64);
    }

    fn sig(op: u8, sem: u32) -> OxStep {
        step(op, 0, 0, 0, sem, 0)
    }

    #[test]
    fn runs_carry_their_length_and_duplicate_waits() {
        let x = step(S_XFER, 1, 1, 0, 0, 4);
        let mut st = vec![
            sig(S_SIGNAL, 0),
            sig(S_SIGNAL, 1),
            sig(S_WAIT, 2),
            sig(S_WAIT, 3),
            sig(S_WAIT, 2),
            x,
            sig(S_WAIT, 2),
        ];
        mark_runs(&mut st);
        let runs: Vec<(u8, u8)> = st.iter().map(|s| (s.nsrc, s.ndst)).collect();
        assert_eq!(
            runs,
            vec![(2, 0), (1, 0), (3, 0), (2, 0), (1, 1), (1, 1), (1, 0)]
        );
    }

    #[test]
    fn long_runs_are_cut_into_pieces_of_max_run() {
        let mut st: Vec<_> = (0..MAX_RUN + 3).map(|_| sig(S_WAIT, 7)).collect();
        mark_runs(&mut st);
        assert_eq!(st[0].nsrc as usize, MAX_RUN);
        assert_eq!(st[0].ndst, 0);
        assert_eq!(st[MAX_RUN - 1].nsrc, 1);
        assert_eq!(st[MAX_RUN - 1].ndst as usize, MAX_RUN - 1);
        // The next piece starts afresh.
        assert_eq!((st[MAX_RUN].nsrc, st[MAX_RUN].ndst), (3, 0));
        assert_eq!((st[MAX_RUN + 2].nsrc, st[MAX_RUN + 2].ndst), (1, 2));
    }

    #[test]
    fn min_threads_covers_operands_and_runs() {
        let req = PlanRequest {
            registered: true,
            ..PlanRequest::new(Collective::new(CollKind::AllReduce, 2, 0), 8, Algo::OneShot)
        };
        let plan = generate(&req).unwrap();
        let e = encode(&plan.ranks[3]).unwrap();
        // Seven signals (or waits) in a run, and a reduction of 8 sources
        // into one output.
        assert_eq!(e.min_threads(), 9);
        assert_eq!(e.max_len(), 2);
        let mut st = vec![sig(S_SIGNAL, 0); 300];
        mark_runs(&mut st);
        let long = Encoded {
            steps: st,
            ..Encoded::default()
        };
        assert_eq!(long.min_threads(), MAX_RUN as u32);
        assert_eq!(Encoded::default().min_threads(), 1);
    }

    #[test]
    fn too_many_operands_is_an_error() {
        let srcs = vec![
            Src::Local {
                at: Loc::input(0),
                pre: false
            };
            MAX_OPERANDS + 1
        ];
        let rp = RankPlan {
            rank: 0,
            nranks: 1,
            bufs: vec![BufDecl {
                role: BufRole::Input,
                len: 1,
                must_write: false,
            }],
            channels: vec![Channel {
                steps: vec![Step::Xfer(Xfer::new(srcs, vec![], 1))],
            }],
        };
        assert!(matches!(encode(&rp), Err(CudaError::Plan(_))));
    }
}
