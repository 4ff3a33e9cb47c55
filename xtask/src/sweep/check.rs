//! The sweep's checked call, beyond comparing the output with the
//! reference: before it, the output and a guard region past it are
//! poisoned (so a call that writes nothing, or too little, leaves visible
//! poison), and every element of the rank's buffers outside the output is
//! snapshotted; after it, those must be unchanged: the send buffer of an
//! out-of-place call, the input outside the output of an in-place one, and
//! [`GUARD`] elements past every output.
//!
//! The collective itself is a [`Runner`]: the sweep passes
//! [`run_collective`]; tests pass faulty ones (one that does nothing, one
//! that writes past its output, one that clobbers its send buffer) and see
//! each reported wrong.
//!
//! The outputs' comparison with the sequential reference lives here too:
//! [`compare_parallel`] and, for Send/Recv, [`check_sendrecv`].

use oxccl::core::testkit;
use oxccl::core::Collective;
use oxccl::{Buffer, CollKind, Communicator, Element, RedOp, Slice};

use super::external::Mirror;

/// Elements past every output that a call must leave untouched.
pub(crate) const GUARD: usize = 256;

/// One rank's buffers for a call.
#[derive(Debug)]
pub(crate) struct RankView<'a, T: Element> {
    /// With `--memory external`: the calls run on this mirror of the
    /// buffers below (the raw entry points on its stream).
    pub mirror: Option<&'a Mirror>,
    pub send: Slice<'a, T>,
    pub recv: Slice<'a, T>,
    /// The allocation the output lies in, and the output's offset in it.
    pub out_buf: &'a Buffer<T>,
    pub out_at: usize,
}

/// How a rank runs one call of the row: [`run_collective`] in the sweep.
pub(crate) type Runner<T> =
    dyn Fn(&Communicator, &Collective, &RankView<'_, T>, RedOp) -> oxccl::Result<()> + Sync;

/// The call a row measures: the collective, or for Send/Recv a group
/// sending to the next rank and receiving from the previous one.
pub(crate) fn run_collective<T: Element>(
    c: &Communicator,
    coll: &Collective,
    v: &RankView<'_, T>,
    op: RedOp,
) -> oxccl::Result<()> {
    if let Some(m) = v.mirror {
        return run_raw(c, coll, v, op, m);
    }
    if coll.kind == CollKind::SendRecv {
        let n = c.nranks();
        oxccl::group(|g| {
            g.send(c, v.send, (c.rank() + 1) % n)?;
            g.recv(c, v.recv, (c.rank() + n - 1) % n)
        })
    } else {
        c.collective(coll.kind, v.send, v.recv, op, coll.root)
    }
}

/// [`run_collective`] through the raw entry points on `m`'s copies of the
/// view's buffers, on `m`'s stream.
fn run_raw<T: Element>(
    c: &Communicator,
    coll: &Collective,
    v: &RankView<'_, T>,
    op: RedOp,
    m: &Mirror,
) -> oxccl::Result<()> {
    let at = |s: &Slice<'_, T>| {
        m.at(s.addr())
            .map(|a| a as *mut std::ffi::c_void)
            .map_err(|e| oxccl::Error::InvalidUsage(e.to_string()))
    };
    let (send, recv, stream, dt) = (at(&v.send)?, at(&v.recv)?, m.stream(), T::DTYPE);
    let n = c.nranks();
    // SAFETY: both pointers lie in the mirror's registered allocations,
    // which outlive every call (the sweep synchronizes each row's calls
    // before it ends the registrations), with the lengths the views have;
    // the stream is the mirror's live stream of this rank's device.
    unsafe {
        if coll.kind == CollKind::SendRecv {
            oxccl::group(|g| {
                g.send_raw(c, send, v.send.len(), dt, (c.rank() + 1) % n, stream)?;
                g.recv_raw(c, recv, v.recv.len(), dt, (c.rank() + n - 1) % n, stream)
            })
        } else {
            let call = oxccl::RawColl {
                kind: coll.kind,
                send,
                recv,
                count: coll.count,
                dtype: dt,
                op,
                root: coll.root,
            };
            c.collective_raw(call, stream)
        }
    }
}

/// The value written over outputs and guards: NaN for floating types (never
/// equal to a finite expected value), the 0xA5 byte pattern's value for
/// integers (far from the small values the inputs hold).
pub(crate) fn poison<T: Element>() -> T {
    let dt = T::DTYPE;
    if dt.is_float() {
        return T::from_f64(f64::NAN);
    }
    let unsigned = dt.name().starts_with('u');
    T::from_f64(match (dt.size(), unsigned) {
        (1, false) => -91.0,
        (1, true) => 165.0,
        (4, false) => -1_515_870_811.0,
        (4, true) => 2_779_096_485.0,
        (_, false) => -6.5e18,
        (_, true) => 1.19e19,
    })
}

/// The regions of a rank's buffers outside its output that a call must
/// not change, by name.
pub(crate) fn watched<'a, T: Element>(
    v: &RankView<'a, T>,
    in_place: bool,
) -> Vec<(&'static str, Slice<'a, T>)> {
    let end = v.out_at + v.recv.len();
    let mut w = Vec::new();
    if in_place {
        // The larger of input and output starts the buffer and holds the
        // other (`Collective::in_place_offsets`): the input may extend on
        // either side of the output (ReduceScatter), then the guard.
        w.push(("input before the output", v.out_buf.slice(..v.out_at)));
        w.push((
            "input or guard past the output",
            v.out_buf.slice(end..guard_at(v, true) + GUARD),
        ));
    } else {
        w.push(("send buffer", v.send));
        w.push(("guard past the output", v.out_buf.slice(end..end + GUARD)));
    }
    w
}

/// Where the guard starts in `out_buf`: past the output, or in place past
/// whichever of input and output ends later.
fn guard_at<T: Element>(v: &RankView<'_, T>, in_place: bool) -> usize {
    let end = v.out_at + v.recv.len();
    if in_place {
        end.max(v.send.len())
    } else {
        end
    }
}

/// Poisons the output and the guard past it, then writes the input (in
/// place it may lie inside the output, which then starts out holding it).
pub(crate) fn prepare<T: Element>(
    v: &RankView<'_, T>,
    input: &[T],
    in_place: bool,
) -> oxccl::Result<()> {
    let g = guard_at(v, in_place);
    v.recv.copy_from_slice(&vec![poison::<T>(); v.recv.len()])?;
    v.out_buf
        .slice(g..g + GUARD)
        .copy_from_slice(&[poison::<T>(); GUARD])?;
    v.send.copy_from_slice(input)
}

/// What [`prepare`] left in the regions [`watched`] names, known without
/// reading the device: the input and the guard's poison. (Reading them
/// back would cost a transfer of the send buffer per rank and row.)
pub(crate) fn prepared<T: Element>(
    v: &RankView<'_, T>,
    input: &[T],
    in_place: bool,
) -> Vec<Vec<T>> {
    let guard = vec![poison::<T>(); GUARD];
    if !in_place {
        return vec![input.to_vec(), guard];
    }
    let end = v.out_at + v.recv.len();
    if input.len() > v.recv.len() {
        // The input starts the buffer and holds the output.
        let mut past = input[end..].to_vec();
        past.extend(guard);
        vec![input[..v.out_at].to_vec(), past]
    } else {
        // The output starts the buffer (out_at is 0) and holds the input.
        vec![Vec::new(), guard]
    }
}

/// Every watched region's contents.
pub(crate) fn snapshot<T: Element>(
    regions: &[(&'static str, Slice<'_, T>)],
) -> oxccl::Result<Vec<Vec<T>>> {
    regions.iter().map(|(_, s)| s.to_vec()).collect()
}

/// Elements of the watched regions that differ between `before` and
/// `after` (bit for bit), and the first of them.
pub(crate) fn changed<T: Element>(
    rank: u32,
    regions: &[(&'static str, Slice<'_, T>)],
    before: &[Vec<T>],
    after: &[Vec<T>],
) -> (u64, Option<String>) {
    let mut found = (0, None);
    for (((name, _), b), a) in regions.iter().zip(before).zip(after) {
        bit_diffs(b, a, &mut found, |i, x, y| {
            format!("rank {rank}: {name}, element {i}, changed from {x:?} to {y:?}")
        });
    }
    found
}

/// Adds to `found` the elements where `want` and `got` differ bit for bit,
/// describing the first difference overall with `describe(index, want, got)`.
pub(crate) fn bit_diffs<T: Element>(
    want: &[T],
    got: &[T],
    found: &mut (u64, Option<String>),
    describe: impl Fn(usize, T, T) -> String,
) {
    for (i, (w, g)) in want.iter().zip(got).enumerate() {
        if !w.bits_eq(*g) {
            found.0 += 1;
            found.1.get_or_insert_with(|| describe(i, *w, *g));
        }
    }
}

/// `testkit::compare`, split over the CPU's cores for the element-wise
/// collectives (AllReduce, Broadcast, Reduce: output element i depends only
/// on input element i, so each range is a smaller call of the same kind);
/// others are compared whole. At 1 GiB per rank the serial compare would
/// dominate the sweep.
pub(crate) fn compare_parallel<T: Element>(
    coll: &Collective,
    inputs: &[Vec<T>],
    outputs: &[Vec<T>],
    op: RedOp,
) -> (u64, Option<String>) {
    let elementwise = matches!(
        coll.kind,
        CollKind::AllReduce | CollKind::Broadcast | CollKind::Reduce
    );
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let short = outputs.iter().any(|o| o.len() < coll.count);
    if !elementwise || threads < 2 || coll.count < (1 << 20) || short {
        return testkit::compare(coll, inputs, outputs, op);
    }
    let step = coll.count.div_ceil(threads);
    let parts: Vec<(u64, Option<String>)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..coll.count)
            .step_by(step)
            .map(|lo| {
                let hi = (lo + step).min(coll.count);
                s.spawn(move || {
                    let part = Collective::new(coll.kind, hi - lo, coll.root);
                    let ins: Vec<Vec<T>> = inputs.iter().map(|v| v[lo..hi].to_vec()).collect();
                    let outs: Vec<Vec<T>> = outputs.iter().map(|v| v[lo..hi].to_vec()).collect();
                    let (w, first) = testkit::compare(&part, &ins, &outs, op);
                    (w, first.map(|f| format!("{f} (in elements {lo}..{hi})")))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or((1, Some("compare thread panicked".into())))
            })
            .collect()
    });
    let wrong = parts.iter().map(|p| p.0).sum();
    (wrong, parts.into_iter().find_map(|p| p.1))
}

/// Expected: each rank holds its predecessor's input.
pub(crate) fn check_sendrecv<T: Element>(
    inputs: &[Vec<T>],
    outputs: &[Vec<T>],
) -> (u64, Option<String>) {
    let n = inputs.len();
    let mut found = (0, None);
    for (r, got) in outputs.iter().enumerate() {
        let exp = &inputs[(r + n - 1) % n];
        bit_diffs(exp, got, &mut found, |i, e, g| {
            format!("rank {r} element {i}: expected {e:?}, got {g:?}")
        });
    }
    found
}
