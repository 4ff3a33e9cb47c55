//! Groups: several operations issued together and run as one plan per
//! communicator (NCCL's `ncclGroupStart`/`ncclGroupEnd`).
//!
//! Operations are validated as they are added; nothing runs until
//! [`Group::end`]. An operation refused for its arguments returns its
//! error at once and fails the whole group, as in NCCL: the group's end
//! returns that error (dropping the group unended does the same), and the
//! refusal is posted as this rank's call on every communicator of the
//! group, so the peers' matching group ends fail at once naming this rank
//! and the reason ([`Error::PeerFailed`]) instead of waiting. At the
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

use oxccl_core::gen::p2p::{self, P2pOp, Path};
use oxccl_core::plan::BufId;
use oxccl_core::{CollKind, DataType, Element, Plan, Proto, RedOp};

use crate::backend::{RawBuf, RawStream};
use crate::buffer::{Arg, In, Out, Space};
use crate::check::refusal;
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
        /// Backend or registered memory: peers may address it.
        registered: bool,
    },
}

#[derive(Debug)]
pub(crate) struct Entry<'a> {
    pub comm: &'a Communicator,
    pub dtype: DataType,
    pub pending: Pending,
}

/// A group being built. Buffers stay borrowed until it ends.
///
/// Every operation takes the communicator first, then its buffers (any
/// [`In`]/[`Out`] argument: `&Buffer<T>`, a `Slice`, or on the host backend
/// `&[T]`/`&mut [T]`), then what the collective needs; each returns
/// `Result<()>` and only checks its arguments: nothing runs until
/// [`Group::end`] (or the end of [`group()`]'s closure).
///
/// | method | arguments after `comm, send, recv` |
/// | --- | --- |
/// | [`all_reduce`](Group::all_reduce), [`reduce_scatter`](Group::reduce_scatter) | `op: RedOp` |
/// | [`reduce`](Group::reduce) | `op: RedOp, root: u32` |
/// | [`broadcast`](Group::broadcast), [`gather`](Group::gather), [`scatter`](Group::scatter) | `root: u32` |
/// | [`all_gather`](Group::all_gather), [`all_to_all`](Group::all_to_all) | none |
/// | [`collective`](Group::collective) | `kind: CollKind, op: RedOp, root: u32` (any collective) |
///
/// Send/Recv take one buffer: `send(comm, buf, peer)` and
/// `recv(comm, buf, peer)`. The raw forms on caller memory and streams
/// ([`Group::collective_raw`], [`Group::send_raw`], [`Group::recv_raw`]) are
/// `unsafe`, as on [`Communicator`].
///
/// ```
/// # let cfg = oxccl::Config::builder().backend(oxccl::BackendKind::Host).build().unwrap();
/// # let comms = oxccl::init_all_with(2, cfg).unwrap();
/// std::thread::scope(|s| for c in &comms { s.spawn(move || {
///     let (me, n) = (c.rank(), c.nranks());
///     let send = c.alloc::<i32>(4).unwrap();
///     send.copy_from_slice(&[me as i32; 4]).unwrap();
///     let recv = c.alloc::<i32>(4).unwrap();
///     oxccl::group(|g| {
///         g.send(c, &send, (me + 1) % n)?;
///         g.recv(c, &recv, (me + n - 1) % n)
///     }).unwrap();
///     assert_eq!(recv.to_vec().unwrap(), vec![((me + n - 1) % n) as i32; 4]);
/// }); });
/// ```
#[derive(Debug, Default)]
pub struct Group<'a> {
    /// Inline for one: a group of one collective, which runs as the lone
    /// call, then allocates nothing.
    entries: smallvec::SmallVec<[Entry<'a>; 1]>,
    /// The caller's streams of each communicator that has raw operations
    /// (`raw.rs`), each once, in first-use order: its launches are ordered
    /// on every one (joined by events on CUDA).
    streams: Vec<(&'a Communicator, Vec<RawStream>)>,
    /// The first operation refused for its arguments, not yet posted.
    refused: Option<Refused<'a>>,
}

/// A group's first refused operation: its error, the code posted to the
/// peers, and the communicators of refused operations.
#[derive(Debug)]
struct Refused<'a> {
    error: Error,
    code: u8,
    comms: Vec<&'a Communicator>,
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
    /// No collective in it: only the ranks its Send/Recv name launch it.
    p2p_only: bool,
    /// Its operations as a profiler plugin hears of them (empty unless
    /// one is attached).
    events: Vec<crate::observe::profiler::Part>,
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
        crate::observe::mark(crate::observe::Func::GroupStart, Default::default);
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
        let func = match op {
            P2pOp::Send { .. } => crate::observe::Func::Send,
            P2pOp::Recv { .. } => crate::observe::Func::Recv,
        };
        let _nvtx = crate::observe::range(func, || crate::observe::Args {
            count: Some(arg.len),
            dtype: Some(dtype),
            peer: Some(peer),
            ..comm.tool_args()
        });
        let checked = comm
            .check_usable()
            .and_then(|()| validate::p2p(what, arg, peer, &comm.owner()));
        self.note(comm, checked)?;
        let registered = matches!(
            arg.space,
            Space::Backend { .. } | Space::External { registered: true }
        );
        self.push(
            comm,
            dtype,
            Pending::P2p {
                op,
                raw: arg.raw,
                registered,
            },
        );
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
        let r = comm.check_collective(kind, send.into(), recv.into(), op, root);
        let (checked, op) = self.note(comm, r)?;
        let _nvtx = comm.coll_range(&checked, T::DTYPE, op);
        self.push(comm, T::DTYPE, Pending::Coll { checked, op });
        Ok(())
    }

    /// Passes on `r`, the check of an operation on `comm`; a refusal of its
    /// arguments is kept, to fail the group (see the module docs).
    pub(crate) fn note<R>(&mut self, comm: &'a Communicator, r: Result<R>) -> Result<R> {
        if let Err(e) = &r {
            if refusal::is_refusal(e) {
                self.refuse(comm, e.clone(), refusal::code(e));
            }
        }
        r
    }

    fn refuse(&mut self, comm: &'a Communicator, error: Error, code: u8) {
        let r = self.refused.get_or_insert_with(|| Refused {
            error,
            code,
            comms: Vec::new(),
        });
        if !r.comms.iter().any(|c| std::ptr::eq(*c, comm)) {
            r.comms.push(comm);
        }
    }

    /// Posts a refusal kept by [`Group::note`] as this rank's call on every
    /// communicator of the group, once; its error, if there was one.
    fn post_refusal(&mut self) -> Option<Error> {
        let r = self.refused.take()?;
        let mut comms = r.comms;
        for e in &self.entries {
            if !comms.iter().any(|c| std::ptr::eq(*c, e.comm)) {
                comms.push(e.comm);
            }
        }
        for c in comms {
            c.post_refusal(r.code);
        }
        Some(r.error)
    }

    /// Refuses the group where a communicator's sends to its own rank and
    /// receives from it differ (its Send/Recv plan could not be built):
    /// found before anything is published, so it is posted like a refusal.
    fn check_self_pairs(&mut self) {
        // Collectives only (the common group): nothing to pair, and no
        // list to build.
        if !self
            .entries
            .iter()
            .any(|e| matches!(e.pending, Pending::P2p { .. }))
        {
            return;
        }
        let mut found = None;
        let mut seen: Vec<&Communicator> = Vec::new();
        for e in &self.entries {
            if seen.iter().any(|c| std::ptr::eq(*c, e.comm)) {
                continue;
            }
            seen.push(e.comm);
            let me = e.comm.rank();
            let mine = |send: bool| -> Vec<usize> {
                self.entries
                    .iter()
                    .filter(|x| std::ptr::eq(x.comm, e.comm))
                    .filter_map(|x| match x.pending {
                        Pending::P2p {
                            op: P2pOp::Send { peer, count },
                            ..
                        } if send && peer == me && count > 0 => Some(count),
                        Pending::P2p {
                            op: P2pOp::Recv { peer, count },
                            ..
                        } if !send && peer == me && count > 0 => Some(count),
                        _ => None,
                    })
                    .collect()
            };
            let (sends, recvs) = (mine(true), mine(false));
            if sends != recvs {
                let error = Error::InvalidUsage(format!(
                    "this rank's sends to itself and receives from itself do not match: rank \
                     {me} sends {sends:?} to itself but receives {recvs:?} from itself"
                ));
                found = Some((e.comm, error));
                break;
            }
        }
        if let Some((comm, error)) = found {
            self.refuse(comm, error, refusal::SELF_PAIRS);
        }
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

    /// The caller's streams `comm`'s raw operations named (none: it has
    /// only typed operations, ordered on the rank's own stream).
    fn streams_of(&self, comm: &Communicator) -> &[RawStream] {
        self.streams
            .iter()
            .find(|(c, _)| std::ptr::eq(*c, comm))
            .map_or(&[], |(_, s)| s.as_slice())
    }

    /// Records a stream of `comm`'s raw operations.
    pub(crate) fn set_stream(&mut self, comm: &'a Communicator, stream: RawStream) {
        match self
            .streams
            .iter_mut()
            .find(|(c, _)| std::ptr::eq(*c, comm))
        {
            Some((_, list)) if !list.contains(&stream) => list.push(stream),
            Some(_) => {}
            None => self.streams.push((comm, vec![stream])),
        }
    }

    /// A group of one collective is that collective, as in NCCL (the call
    /// check compares it as the lone call already, so peers may make it
    /// grouped or not): it runs as the lone call, on the stream its raw
    /// form named, which spares it the group's locks, jobs and merged plan
    /// (about as costly again as the call itself on the host backend).
    /// `None`: the group holds anything else.
    fn run_lone(&self) -> Option<Result<()>> {
        let [Entry {
            comm,
            dtype,
            pending: Pending::Coll { checked, op },
        }] = &self.entries[..]
        else {
            return None;
        };
        let (comm, dtype, op, checked) = (*comm, *dtype, *op, *checked);
        let count = checked.coll.count;
        let call = move || comm.run_checked(checked, dtype, op);
        Some(match *self.streams_of(comm) {
            [] => call(),
            // SAFETY: the group's raw operation's contract (`collective_raw`)
            // holds for its stream until the stream has passed the group's end.
            [stream] => unsafe { comm.call_on_stream(stream, count, call) },
            // One operation names one stream.
            _ => Err(Error::Internal(
                "a group of one operation named several streams".into(),
            )),
        })
    }

    /// Runs every operation of the group; returns when all are done (host)
    /// or enqueued (CUDA). A group holding a refused operation (or whose
    /// sends to a rank itself differ from its receives from itself) runs
    /// nothing: the refusal is posted to the peers of every communicator in
    /// it, whose group ends then fail naming this rank, and its error is
    /// returned.
    pub fn end(mut self) -> Result<()> {
        let _nvtx = crate::observe::range(crate::observe::Func::GroupEnd, Default::default);
        self.check_self_pairs();
        if let Some(e) = self.post_refusal() {
            return Err(e);
        }
        if let Some(r) = self.run_lone() {
            return r;
        }
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
        // From here on every rank agreed on the group: a failure on this
        // rank leaves its peers in their data waits, so it fails the
        // communicators (naming this rank) instead of returning quietly.
        let all: Vec<&Communicator> = comms.iter().map(|(c, _)| *c).collect();
        let jobs = comms
            .iter()
            .zip(agreed)
            .map(|((comm, entries), agreed)| Ok((*comm, build_jobs(comm, entries, &agreed)?)))
            .collect::<Result<Vec<_>>>()
            .map_err(|e| fail_unlaunched(&all, e))?;
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
                        let streams = self.streams_of(comm);
                        s.spawn(move || run_jobs(comm, js, streams))
                    })
                    .collect();
                handles
                    .into_iter()
                    .zip(&jobs)
                    .map(|(h, (comm, _))| {
                        h.join()
                            .unwrap_or_else(|_| {
                                Err(Error::Internal("group thread panicked".into()))
                            })
                            .map_err(|e| comm.fail_agreed(GROUP, e))
                    })
                    .collect::<Vec<_>>()
                    .into_iter()
                    .collect::<Result<()>>()
            })
        } else {
            for (i, (comm, js)) in jobs.iter().enumerate() {
                if let Err(e) = run_jobs(comm, js, self.streams_of(comm)) {
                    let e = comm.fail_agreed(GROUP, e);
                    let rest: Vec<&Communicator> = jobs[i + 1..].iter().map(|(c, _)| *c).collect();
                    fail_unlaunched(&rest, e.clone());
                    return Err(e);
                }
            }
            Ok(())
        }
    }
}

/// How a failed group names its call to the peers it fails.
const GROUP: &str = "its group";

/// Fails `comms`, a group's communicators that will not launch their part
/// after their ranks agreed on it (because of `e`), so their peers stop
/// waiting for it; returns `e` (as the failure of the rank to blame, see
/// [`Communicator::blamed`], where it is a wait another rank ended). A refusal every rank reaches alike (no
/// algorithm allowed for a call) leaves them usable.
fn fail_unlaunched(comms: &[&Communicator], e: Error) -> Error {
    if matches!(e, Error::NoAlgorithm { .. }) {
        return e;
    }
    let why = if crate::comm::own_fault(&e) {
        e.clone()
    } else {
        Error::InvalidUsage(format!(
            "not launched: another part of its group failed: {e}"
        ))
    };
    for c in comms {
        c.fail_agreed(GROUP, why.clone());
    }
    match comms.first() {
        Some(c) => c.blamed(e),
        None => e,
    }
}

/// A group dropped without its end after one of its operations was
/// refused still tells the peers, whose group ends would otherwise wait
/// for it (the usual case: `?` on the refused operation inside [`group`]).
impl Drop for Group<'_> {
    fn drop(&mut self) {
        self.post_refusal();
    }
}

fn run_jobs(comm: &Communicator, jobs: &[Job], streams: &[RawStream]) -> Result<()> {
    let launch_all = || {
        jobs.iter().try_for_each(|j| {
            let _events = comm
                .prof
                .as_ref()
                .map(|p| crate::observe::profiler::Launch::start(p, &j.events));
            comm.launch(&j.prepared, j.dtype, j.op, j.proto, j.p2p_only)
        })
    };
    // SAFETY: the raw operations' callers vouched for their streams until
    // they have passed the group's end (`Group::collective_raw`).
    unsafe { comm.on_streams(streams, Box::new(launch_all)) }
}

/// Operations of one data type and one reduction op share a launch
/// (Send/Recv joins any launch of its data type): key `(dtype code, op)`,
/// value the entries (each with its direct buffer id, see
/// `check::Agreed::direct`) and their op.
type Launches<'e, 'a> = BTreeMap<(u8, String), (Vec<(&'e Entry<'a>, Option<u16>)>, Option<RedOp>)>;

fn op_key(op: RedOp) -> String {
    match op {
        RedOp::PreMulSum(s) => format!("premulsum:{:x}", s.to_bits()),
        RedOp::PreMulSumDevice(a) => format!("premulsum@{a:x}"),
        o => o.name().into(),
    }
}

/// Builds one communicator's launches, in a deterministic order every rank
/// reproduces, from what its ranks agreed.
fn build_jobs(
    comm: &Communicator,
    entries: &[&Entry<'_>],
    agreed: &check::Agreed,
) -> Result<Vec<Job>> {
    comm.check_usable()?;
    let registered = agreed.registered;
    let mut by_key: Launches<'_, '_> = BTreeMap::new();
    for (e, &direct) in entries.iter().zip(&agreed.direct) {
        let (dt, op) = match &e.pending {
            // Left out of the launches, as a lone call runs no plan.
            Pending::Coll { checked, op } if comm.nothing_to_move(checked, *op) => continue,
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
        v.0.push((e, direct));
        if op.is_some() {
            v.1 = op;
        }
    }
    by_key
        .into_values()
        .map(|(list, op)| build_job(comm, &list, op.unwrap_or(RedOp::Sum), registered))
        .collect::<Result<Vec<_>>>()
        .map(|v| v.into_iter().flatten().collect())
}

/// Merges one launch key's operations into as few rank plans as fit: a
/// launch holds collectives of one protocol and at most the channels the
/// backend keeps resident (see [`batches`]).
fn build_job(
    comm: &Communicator,
    list: &[(&Entry<'_>, Option<u16>)],
    op: RedOp,
    registered: bool,
) -> Result<Vec<Job>> {
    let dtype = list[0].0.dtype;
    let es = dtype.size();
    // Each part with its protocol (`None`: the Send/Recv part) and the
    // profiler's events for it.
    let mut parts: Vec<(Prepared, Option<Proto>, Vec<crate::observe::profiler::Part>)> = Vec::new();
    let mut p2p_ops = Vec::new();
    let mut p2p_bufs = Vec::new();
    let mut p2p_paths = Vec::new();
    let profiled = comm.prof.is_some();
    let mut p2p_events = Vec::new();
    for &(e, direct) in list {
        match &e.pending {
            Pending::Coll { checked, .. } if checked.coll.count == 0 => {}
            Pending::Coll { checked, .. } => {
                let mut checked = *checked;
                checked.backend_memory &= registered;
                let (prep, choice): (Prepared, Choice) = comm.prepare(&checked, es)?;
                let mut events = Vec::new();
                if profiled {
                    events.push(crate::comm::profiler_part(&checked, dtype, &choice));
                }
                parts.push((prep, Some(choice.proto), events));
            }
            Pending::P2p { op, raw, .. } => {
                let count = match op {
                    P2pOp::Send { count, .. } | P2pOp::Recv { count, .. } => *count,
                };
                if count > 0 && profiled {
                    let (send, peer) = match *op {
                        P2pOp::Send { peer, .. } => (true, peer),
                        P2pOp::Recv { peer, .. } => (false, peer),
                    };
                    p2p_events.push(crate::observe::profiler::Part::P2p {
                        send,
                        buf: raw.addr,
                        count,
                        dtype,
                        peer,
                        channels: 0,
                    });
                }
                if count > 0 {
                    p2p_ops.push(*op);
                    p2p_bufs.push(*raw);
                    p2p_paths.push(direct.map_or(Path::Fifo, |id| Path::Direct(BufId(id))));
                }
            }
        }
    }
    if !p2p_ops.is_empty() {
        parts.push((
            p2p_part(comm, &p2p_ops, &p2p_paths, p2p_bufs, es)?,
            None,
            p2p_events,
        ));
    }
    let max = comm.clique().backend.max_channels() as usize;
    let channels: Vec<(usize, Option<Proto>)> = parts
        .iter()
        .map(|(p, proto, _)| (p.plan.rank_plan().channels.len(), *proto))
        .collect();
    let mut parts = parts.into_iter();
    let jobs: Vec<Job> = batches(&channels, max)
        .into_iter()
        .map(|(len, proto)| {
            let mut batch = Vec::new();
            let mut events = Vec::new();
            for (p, _, ev) in parts.by_ref().take(len) {
                batch.push(p);
                events.extend(ev);
            }
            Job {
                prepared: merge(comm, batch),
                dtype,
                op,
                // Only collectives set the protocol.
                p2p_only: proto.is_none(),
                proto: proto.unwrap_or(Proto::Simple),
                events,
            }
        })
        .collect();
    tracing::info!(
        target: "oxccl::coll",
        rank = comm.rank(),
        operations = list.len(),
        launches = jobs.len(),
        dtype = %dtype,
        "oxccl: group launch"
    );
    Ok(jobs)
}

/// Splits a launch's parts, given as (channels, protocol: `None` for the
/// Send/Recv part), into consecutive batches: (parts, protocol). A batch
/// never mixes two collectives' protocols (a plan's FIFO pieces are sized
/// for its own) nor holds more channels than `max` (the blocks that fit
/// resident with every rank's), unless one part alone has more (it then
/// goes alone and the backend says why it cannot run). Every rank's
/// collectives are the same calls with the same plans, so every rank cuts
/// its batches at the same places; the Send/Recv part comes last, where
/// the collectives before it are the same everywhere too.
fn batches(parts: &[(usize, Option<Proto>)], max: usize) -> Vec<(usize, Option<Proto>)> {
    let mut out: Vec<(usize, Option<Proto>)> = Vec::new();
    let mut used = 0;
    for &(ch, proto) in parts {
        let fits = out.last().is_some_and(|&(_, p)| {
            used + ch <= max && (p.is_none() || proto.is_none() || p == proto)
        });
        match out.last_mut() {
            Some(last) if fits => {
                last.0 += 1;
                last.1 = last.1.or(proto);
                used += ch;
            }
            _ => {
                out.push((1, proto));
                used = ch;
            }
        }
    }
    out
}

/// Channels of a Send/Recv plan unless configured (at most what the
/// backend holds): 16 is every channel 8 ranks get on an H200 (132 SMs).
const P2P_CHANNELS: u32 = 16;

/// Sends at least this large go direct (the receiver reads the sender's
/// buffer) where both may: below it a message is a few FIFO pieces, whose
/// handshakes cost what the direct plan's do, and the FIFO plan's timing
/// is the measured one.
pub(crate) const P2P_DIRECT_MIN_BYTES: usize = 256 << 10;

/// Per entry, a send's buffer id in this rank's Send/Recv plan where its
/// receiver is to read it directly (`p2p::Path::Direct`), decided from
/// what this rank alone knows; the receiver learns it through the call
/// check (without the check nothing goes direct). A send goes direct when
/// its buffer is backend or registered memory on a backend whose peers
/// address such memory, it is at least [`P2P_DIRECT_MIN_BYTES`], goes to
/// another rank, and its launch holds no collective (so the Send/Recv
/// part's buffers are numbered from 0 there, as the id says: `merge`
/// puts collectives first).
pub(crate) fn direct_sends(comm: &Communicator, entries: &[&Entry<'_>]) -> Vec<Option<u16>> {
    let backend = &comm.clique().backend;
    // On every backend unless `OXCCL_P2P_DIRECT=0` (`Config::p2p_direct`).
    let able = comm.checking() && backend.registered_alloc() && comm.config().p2p_direct;
    let mut next: BTreeMap<u8, usize> = BTreeMap::new();
    entries
        .iter()
        .map(|e| {
            let Pending::P2p { op, registered, .. } = &e.pending else {
                return None;
            };
            let (count, send_to) = match *op {
                P2pOp::Send { peer, count } => (count, Some(peer)),
                P2pOp::Recv { count, .. } => (count, None),
            };
            if count == 0 {
                return None;
            }
            // The operation's index in its launch's Send/Recv part.
            let slot = next.entry(e.dtype as u8).or_default();
            let id = *slot;
            *slot += 1;
            let alone = !entries
                .iter()
                .any(|x| x.dtype == e.dtype && matches!(x.pending, Pending::Coll { .. }));
            let peer = send_to?;
            (able
                && *registered
                && alone
                && peer != comm.rank()
                && count.saturating_mul(e.dtype.size()) >= P2P_DIRECT_MIN_BYTES)
                .then(|| u16::try_from(id).ok())
                .flatten()
        })
        .collect()
}

/// The Send/Recv part of this rank, from its own operations alone and
/// their agreed paths (`gen::p2p::rank_plan_with_paths`; matching the
/// peers' lists is their contract).
fn p2p_part(
    comm: &Communicator,
    ops: &[P2pOp],
    paths: &[Path],
    bufs: Vec<RawBuf>,
    es: usize,
) -> Result<Prepared> {
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
    let plan = p2p::rank_plan_with_paths(comm.nranks(), comm.rank(), ops, paths, chunk, channels)
        .map_err(|e| match e {
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

/// Point-to-point calls outside a group are groups of one operation.
impl Communicator {
    /// Sends `buf` to `peer` (which must call `recv` with the same count).
    /// Outside a group this is a group of one operation.
    pub fn send<'a, T: Element>(&self, buf: impl Into<In<'a, T>>, peer: u32) -> Result<()> {
        let buf: In<'_, T> = buf.into();
        let _nvtx = crate::observe::range(crate::observe::Func::Send, || crate::observe::Args {
            count: Some(buf.arg.len),
            dtype: Some(T::DTYPE),
            peer: Some(peer),
            ..self.tool_args()
        });
        group(|g| g.send::<T>(self, buf, peer))
    }

    /// Receives into `buf` from `peer`.
    pub fn recv<'a, T: Element>(&self, buf: impl Into<Out<'a, T>>, peer: u32) -> Result<()> {
        let buf: Out<'_, T> = buf.into();
        let _nvtx = crate::observe::range(crate::observe::Func::Recv, || crate::observe::Args {
            count: Some(buf.arg.len),
            dtype: Some(T::DTYPE),
            peer: Some(peer),
            ..self.tool_args()
        });
        group(|g| g.recv::<T>(self, buf, peer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BackendKind, Config};

    /// Launch batches: channels summed up to the resident cap, protocols
    /// never mixed, Send/Recv riding with what precedes it, an oversized
    /// part alone.
    #[test]
    fn batches_keep_launches_resident_and_of_one_protocol() {
        use Proto::{Simple as S, LL};
        // Two 32-channel collectives where 32 fit: two launches.
        assert_eq!(
            batches(&[(32, Some(S)), (32, Some(S))], 32),
            vec![(1, Some(S)), (1, Some(S))]
        );
        // Small ones share; a different protocol starts a launch; the
        // Send/Recv part joins the last if it fits.
        assert_eq!(
            batches(&[(8, Some(S)), (8, Some(S)), (4, Some(LL)), (16, None)], 32),
            vec![(2, Some(S)), (2, Some(LL))]
        );
        assert_eq!(
            batches(&[(20, Some(LL)), (16, None)], 32),
            vec![(1, Some(LL)), (1, None)]
        );
        assert_eq!(batches(&[(16, None)], 32), vec![(1, None)]);
        assert_eq!(
            batches(&[(64, Some(S)), (1, Some(S))], 32),
            vec![(1, Some(S)), (1, Some(S))]
        );
        assert!(batches(&[], 32).is_empty());
    }

    /// Which sends go direct, and their ids in the Send/Recv part:
    /// large sends of backend memory to another rank; not small ones,
    /// host memory, sends to the rank itself, receives, sends in a launch
    /// with a collective of their type, or anything without the check.
    #[test]
    fn direct_sends_are_large_backend_sends_in_launches_of_their_own() {
        let decide = |check: bool| {
            let cfg = Config {
                backend: BackendKind::Host,
                check_calls: check,
                ..Config::default()
            };
            let comms = crate::init_all_with(2, cfg).unwrap();
            let c = &comms[0];
            let big = P2P_DIRECT_MIN_BYTES / 4;
            let a = c.alloc::<f32>(big).unwrap();
            let small = c.alloc::<f32>(big - 1).unwrap();
            let b = c.alloc::<f64>(big).unwrap();
            let host = vec![0f32; big];
            let mut g = Group::new();
            g.send(c, &a, 1).unwrap(); // f32 id 0: direct
            g.recv(c, &a, 1).unwrap(); // f32 id 1: a receive
            g.send(c, &small, 1).unwrap(); // f32 id 2: too small
            g.send(c, &host, 1).unwrap(); // f32 id 3: host memory
            g.send(c, &a, 0).unwrap(); // f32 id 4: to itself
            g.send(c, &a, 1).unwrap(); // f32 id 5: direct
            g.send(c, &b, 1).unwrap(); // f64: shares a launch with a collective
            g.all_reduce(c, &b, &b, RedOp::Sum).unwrap();
            let entries: Vec<&Entry<'_>> = g.entries.iter().collect();
            direct_sends(c, &entries)
        };
        let n = None;
        assert_eq!(decide(true), vec![Some(0), n, n, n, n, Some(5), n, n]);
        assert_eq!(decide(false), vec![n; 8]);
    }
}
