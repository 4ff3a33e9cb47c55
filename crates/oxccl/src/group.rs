//! Groups: several operations issued together and run as one plan per
//! communicator (NCCL's `ncclGroupStart`/`ncclGroupEnd`).
//!
//! Operations are validated as they are added (an invalid one is refused
//! and the group stays usable); nothing runs until [`Group::end`]. At the
//! end, each communicator's operations become one merged plan per
//! (data type, op): its collectives in issue order, then one Send/Recv
//! block built by `oxccl_core::gen::p2p::rank_plan` (the k-th send from a to b
//! matches the k-th receive on b from a). Every rank must issue matching
//! groups, as with NCCL.
//!
//! One thread may drive several communicators in one group. On the host
//! backend, where execution blocks, each communicator's plan then runs on
//! its own scoped thread, so the ranks progress together; on CUDA the
//! launches are enqueued one after the other on each rank's stream, except
//! where a launch waits for the other ranks of its GPU to launch (more
//! ranks on a GPU than hardware queues): then on scoped threads too.

use std::collections::BTreeMap;

use oxccl_core::gen::p2p::{self, P2pOp};
use oxccl_core::{CollKind, DataType, Element, Plan, Proto, RedOp};

use crate::backend::{RawBuf, RawStream};
use crate::buffer::{Arg, In, Out};
use crate::comm::{Communicator, PlanRef, Prepared};
use crate::error::{Error, Result};
use crate::select::Choice;
use crate::validate;

mod check;

/// A collective or a Send/Recv waiting for the group's end.
#[derive(Debug)]
pub(crate) enum Pending {
    Coll {
        checked: validate::Checked,
        op: RedOp,
    },
    P2p {
        op: P2pOp,
        raw: RawBuf,
    },
}

#[derive(Debug)]
pub(crate) struct Entry<'a> {
    pub comm: &'a Communicator,
    pub dtype: DataType,
    pub pending: Pending,
}

/// A group being built. Buffers stay borrowed until it ends.
#[derive(Debug, Default)]
pub struct Group<'a> {
    entries: Vec<Entry<'a>>,
    /// The caller's stream of each communicator that has raw operations
    /// (`raw.rs`): its launches are ordered on it.
    streams: Vec<(&'a Communicator, RawStream)>,
}

/// Runs `f` to fill a group, then ends it.
pub fn group<'a, R>(f: impl FnOnce(&mut Group<'a>) -> Result<R>) -> Result<R> {
    let mut g = Group::new();
    let r = f(&mut g)?;
    g.end()?;
    Ok(r)
}

/// One launch: a merged rank plan and its buffers.
#[derive(Debug)]
struct Job {
    prepared: Prepared,
    dtype: DataType,
    op: RedOp,
    proto: Proto,
}

/// One typed helper of [`Group`]: `name(comm, send, recv, args...)` adds
/// [`Group::collective`] of `kind` with the op and root given after `=>`.
macro_rules! typed_helper {
    ($(#[$doc:meta])* $name:ident, $kind:ident, ($($arg:ident: $ty:ty),*) => $op:expr, $root:expr) => {
        $(#[$doc])*
        pub fn $name<T: Element>(
            &mut self,
            comm: &'a Communicator,
            send: impl Into<In<'a, T>>,
            recv: impl Into<Out<'a, T>>,
            $($arg: $ty),*
        ) -> Result<()> {
            self.collective(comm, CollKind::$kind, send, recv, $op, $root)
        }
    };
}

impl<'a> Group<'a> {
    pub fn new() -> Self {
        Group::default()
    }

    /// Adds a send of `buf` to `peer`.
    pub fn send<T: Element>(
        &mut self,
        comm: &'a Communicator,
        buf: impl Into<In<'a, T>>,
        peer: u32,
    ) -> Result<()> {
        let arg = buf.into().arg;
        let op = P2pOp::Send {
            peer,
            count: arg.len,
        };
        self.p2p(comm, T::DTYPE, "send buffer", &arg, peer, op)
    }

    /// Adds a receive into `buf` from `peer`.
    pub fn recv<T: Element>(
        &mut self,
        comm: &'a Communicator,
        buf: impl Into<Out<'a, T>>,
        peer: u32,
    ) -> Result<()> {
        let arg = buf.into().arg;
        let op = P2pOp::Recv {
            peer,
            count: arg.len,
        };
        self.p2p(comm, T::DTYPE, "receive buffer", &arg, peer, op)
    }

    /// Adds one side of a Send/Recv, `op` on `arg` (named `what` in errors).
    fn p2p(
        &mut self,
        comm: &'a Communicator,
        dtype: DataType,
        what: &'static str,
        arg: &Arg,
        peer: u32,
        op: P2pOp,
    ) -> Result<()> {
        comm.check_usable()?;
        validate::p2p(what, arg, peer, &comm.owner())?;
        self.push(comm, dtype, Pending::P2p { op, raw: arg.raw });
        Ok(())
    }

    /// Adds any collective (see [`Communicator::collective`]).
    pub fn collective<T: Element>(
        &mut self,
        comm: &'a Communicator,
        kind: CollKind,
        send: impl Into<In<'a, T>>,
        recv: impl Into<Out<'a, T>>,
        op: RedOp,
        root: u32,
    ) -> Result<()> {
        let (checked, op) = comm.check_collective(kind, send.into(), recv.into(), op, root)?;
        self.push(comm, T::DTYPE, Pending::Coll { checked, op });
        Ok(())
    }

    typed_helper!(
        /// Adds an AllReduce (see [`Communicator::all_reduce`]).
        all_reduce, AllReduce, (op: RedOp) => op, 0
    );
    typed_helper!(
        /// Adds a Broadcast from `root` (see [`Communicator::broadcast`]).
        broadcast, Broadcast, (root: u32) => RedOp::Sum, root
    );
    typed_helper!(
        /// Adds a Reduce to `root` (see [`Communicator::reduce`]).
        reduce, Reduce, (op: RedOp, root: u32) => op, root
    );
    typed_helper!(
        /// Adds an AllGather (see [`Communicator::all_gather`]).
        all_gather, AllGather, () => RedOp::Sum, 0
    );
    typed_helper!(
        /// Adds a ReduceScatter (see [`Communicator::reduce_scatter`]).
        reduce_scatter, ReduceScatter, (op: RedOp) => op, 0
    );
    typed_helper!(
        /// Adds an AllToAll (see [`Communicator::all_to_all`]).
        all_to_all, AllToAll, () => RedOp::Sum, 0
    );
    typed_helper!(
        /// Adds a Gather to `root` (see [`Communicator::gather`]).
        gather, Gather, (root: u32) => RedOp::Sum, root
    );
    typed_helper!(
        /// Adds a Scatter from `root` (see [`Communicator::scatter`]).
        scatter, Scatter, (root: u32) => RedOp::Sum, root
    );

    fn push(&mut self, comm: &'a Communicator, dtype: DataType, pending: Pending) {
        self.entries.push(Entry {
            comm,
            dtype,
            pending,
        });
    }

    /// The caller's stream `comm`'s raw operations named, if any.
    fn stream_of(&self, comm: &Communicator) -> Option<RawStream> {
        self.streams
            .iter()
            .find(|(c, _)| std::ptr::eq(*c, comm))
            .map(|&(_, s)| s)
    }

    /// Refuses a second stream for one communicator in a group.
    pub(crate) fn check_stream(&self, comm: &Communicator, stream: RawStream) -> Result<()> {
        match self.stream_of(comm) {
            Some(s) if s != stream => Err(Error::InvalidUsage(format!(
                "rank {}: one group's operations on a communicator must share one stream \
                 ({:#x} before, {:#x} now)",
                comm.rank(),
                s.0,
                stream.0
            ))),
            _ => Ok(()),
        }
    }

    /// Records the stream of `comm`'s raw operations (checked before).
    pub(crate) fn set_stream(&mut self, comm: &'a Communicator, stream: RawStream) {
        if self.stream_of(comm).is_none() {
            self.streams.push((comm, stream));
        }
    }

    /// Runs every operation of the group; returns when all are done (host)
    /// or enqueued (CUDA).
    pub fn end(self) -> Result<()> {
        // Communicators in first-use order, each with its operations.
        let mut comms: Vec<(&Communicator, Vec<&Entry<'_>>)> = Vec::new();
        for e in &self.entries {
            match comms.iter_mut().find(|(c, _)| std::ptr::eq(*c, e.comm)) {
                Some((_, list)) => list.push(e),
                None => comms.push((e.comm, vec![e])),
            }
        }
        // Each communicator's call state stays locked until the group has
        // run (calls from other threads wait); locked in address order so
        // two threads' groups over the same communicators cannot deadlock.
        let mut order: Vec<usize> = (0..comms.len()).collect();
        order.sort_by_key(|&i| std::ptr::from_ref(comms[i].0) as usize);
        let mut locks: Vec<Option<_>> = comms.iter().map(|_| None).collect();
        for i in order {
            locks[i] = Some(comms[i].0.call_lock());
        }
        let mut seqs: Vec<_> = locks.into_iter().flatten().collect();
        let agreed = check::group(&comms, &mut seqs)?;
        let jobs = comms
            .iter()
            .zip(agreed)
            .map(|((comm, entries), registered)| {
                Ok((*comm, build_jobs(comm, entries, registered)?))
            })
            .collect::<Result<Vec<_>>>()?;
        // A launch that waits for the other ranks of its GPU (CUDA past the
        // hardware queues) needs them on threads of their own, as a
        // blocking backend's plans do.
        let blocking = jobs.first().is_some_and(|(c, _)| {
            let b = &c.clique().backend;
            b.blocking() || b.launches_in_step()
        });
        if jobs.len() > 1 && blocking {
            std::thread::scope(|s| {
                let handles: Vec<_> = jobs
                    .iter()
                    .map(|(comm, js)| {
                        let stream = self.stream_of(comm);
                        s.spawn(move || run_jobs(comm, js, stream))
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(Error::Internal("group thread panicked".into()))
                        })
                    })
                    .collect::<Vec<_>>()
                    .into_iter()
                    .collect::<Result<()>>()
            })
        } else {
            jobs.iter()
                .try_for_each(|(comm, js)| run_jobs(comm, js, self.stream_of(comm)))
        }
    }
}

fn run_jobs(comm: &Communicator, jobs: &[Job], stream: Option<RawStream>) -> Result<()> {
    let launch_all = || {
        jobs.iter()
            .try_for_each(|j| comm.launch(&j.prepared, j.dtype, j.op, j.proto))
    };
    match stream {
        // SAFETY: the raw operations' callers vouched for the stream until
        // it has passed the group's end (`Group::collective_raw`).
        Some(s) => unsafe { comm.on_stream(s, launch_all) },
        None => launch_all(),
    }
}

/// Operations of one data type and one reduction op share a launch
/// (Send/Recv joins any launch of its data type): key `(dtype code, op)`,
/// value the entries and their op.
type Launches<'e, 'a> = BTreeMap<(u8, String), (Vec<&'e Entry<'a>>, Option<RedOp>)>;

fn op_key(op: RedOp) -> String {
    match op {
        RedOp::PreMulSum(s) => format!("premulsum:{:x}", s.to_bits()),
        o => o.name().into(),
    }
}

/// Builds one communicator's launches, in a deterministic order every rank
/// reproduces.
/// `registered`: whether every rank agreed its buffers are backend memory.
fn build_jobs(comm: &Communicator, entries: &[&Entry<'_>], registered: bool) -> Result<Vec<Job>> {
    comm.check_usable()?;
    let mut by_key: Launches<'_, '_> = BTreeMap::new();
    for e in entries {
        let (dt, op) = match &e.pending {
            Pending::Coll { op, .. } => (e.dtype, Some(*op)),
            Pending::P2p { .. } => (e.dtype, None),
        };
        let key = (dt, op.map(op_key).unwrap_or_default());
        // Send/Recv ride with the first collective of their type, if any.
        let slot = if op.is_none() {
            by_key
                .keys()
                .find(|(d, _)| *d == dt as u8)
                .cloned()
                .unwrap_or((dt as u8, String::new()))
        } else {
            (key.0 as u8, key.1)
        };
        let v = by_key.entry(slot).or_insert_with(|| (Vec::new(), None));
        v.0.push(e);
        if op.is_some() {
            v.1 = op;
        }
    }
    by_key
        .into_values()
        .map(|(list, op)| build_job(comm, &list, op.unwrap_or(RedOp::Sum), registered))
        .filter_map(Result::transpose)
        .collect()
}

/// Merges one launch's operations into a single rank plan.
fn build_job(
    comm: &Communicator,
    list: &[&Entry<'_>],
    op: RedOp,
    registered: bool,
) -> Result<Option<Job>> {
    let dtype = list[0].dtype;
    let es = dtype.size();
    let mut parts: Vec<Prepared> = Vec::new();
    let mut proto = None::<Proto>;
    let mut p2p_ops = Vec::new();
    let mut p2p_bufs = Vec::new();
    for e in list {
        match &e.pending {
            Pending::Coll { checked, .. } if checked.coll.count == 0 => {}
            Pending::Coll { checked, .. } => {
                let mut checked = *checked;
                checked.backend_memory &= registered;
                let (prep, choice): (Prepared, Choice) = comm.prepare(&checked, es)?;
                proto.get_or_insert(choice.proto);
                parts.push(prep);
            }
            Pending::P2p { op, raw } => {
                let count = match op {
                    P2pOp::Send { count, .. } | P2pOp::Recv { count, .. } => *count,
                };
                if count > 0 {
                    p2p_ops.push(*op);
                    p2p_bufs.push(*raw);
                }
            }
        }
    }
    if !p2p_ops.is_empty() {
        parts.push(p2p_part(comm, &p2p_ops, p2p_bufs, es)?);
    }
    if parts.is_empty() {
        return Ok(None);
    }
    tracing::info!(
        rank = comm.rank(),
        operations = list.len(),
        dtype = %dtype,
        "oxccl: group launch"
    );
    Ok(Some(Job {
        prepared: merge(comm, parts),
        dtype,
        op,
        proto: proto.unwrap_or(Proto::Simple),
    }))
}

/// Channels of a Send/Recv plan unless configured (at most what the
/// backend holds): 16 is every channel 8 ranks get on an H200 (132 SMs).
const P2P_CHANNELS: u32 = 16;

/// The Send/Recv part of this rank, from its own operations alone
/// (`gen::p2p::rank_plan`; matching the peers' lists is their contract).
fn p2p_part(comm: &Communicator, ops: &[P2pOp], bufs: Vec<RawBuf>, es: usize) -> Result<Prepared> {
    let cl = comm.clique();
    let chunk = (crate::comm::fifo_bytes(&cl.config, cl.backend.chunk_bytes()) / es).max(1);
    // Every rank must use the same channel count whatever its own traffic,
    // so it does not depend on sizes: the most the device holds. Each
    // operation then uses as many of them as it has FIFO pieces
    // (`p2p::op_channels`, which both ends compute alike), so a small
    // send stays on one channel and a large one uses them all.
    let channels = cl
        .config
        .channels
        .unwrap_or(P2P_CHANNELS)
        .clamp(1, cl.backend.max_channels());
    let plan =
        p2p::rank_plan(comm.nranks(), comm.rank(), ops, chunk, channels).map_err(|e| match e {
            oxccl_core::CoreError::InvalidRequest(m) => Error::InvalidUsage(format!(
                "this rank's sends to itself and receives from itself do not match: {m}"
            )),
            other => other.into(),
        })?;
    Ok(Prepared {
        plan: PlanRef::Own(plan),
        bufs,
    })
}

/// Concatenates rank plans: buffers and channels of later parts are
/// renumbered after earlier ones (via `Plan::merge`).
fn merge(comm: &Communicator, parts: Vec<Prepared>) -> Prepared {
    if parts.len() == 1 {
        return parts.into_iter().next().expect("one part");
    }
    let mut bufs = Vec::new();
    let singles: Vec<Plan> = parts
        .into_iter()
        .map(|p| {
            bufs.extend(p.bufs);
            let mut rp = p.plan.into_owned();
            rp.rank = 0;
            rp.nranks = 1;
            Plan {
                algo: oxccl_core::Algo::Ring,
                coll: None,
                nranks: 1,
                ranks: vec![rp],
            }
        })
        .collect();
    let mut merged = Plan::merge(oxccl_core::Algo::Ring, &singles)
        .ranks
        .pop()
        .expect("one rank");
    merged.rank = comm.rank();
    merged.nranks = comm.nranks();
    Prepared {
        plan: PlanRef::Own(merged),
        bufs,
    }
}
