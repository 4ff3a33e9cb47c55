//! Deterministic reductions (`OXCCL_DETERMINISTIC`, `Config::deterministic`),
//! one generic body for every backend: host always, CUDA when a device is
//! there (else `skipped: no CUDA device`, a failure under
//! `OXCCL_REQUIRE_GPU=1`).
//!
//! Inputs are chosen so that the order of a sum shows in its bits (a big
//! value, a small one and the big one negated: `big + 1 - big` is 0 or 1
//! depending on the order, in f32, f16 and bf16 alike). With the switch
//! on, AllReduce, Reduce and ReduceScatter give the sequential
//! reference's bits (rank order 0..n−1) under every algorithm, protocol,
//! channel count and piece size the backend runs, on registered and plain
//! buffers, in place and out of place, and for every call size (a smaller
//! call's elements are a prefix of a larger one's). With it off, at least
//! one pair of those runs differs, so the check can fail.

use oxccl::core::gen::{reduces_in_rank_order, supports};
use oxccl::core::{reference, with_dtype, Collective};
use oxccl::{
    Algo, BackendKind, CollKind, Communicator, Config, DataType, Element, Error, Proto, RedOp,
};

mod common;
use common::on_ranks;

const REDUCTIONS: [CollKind; 3] = [
    CollKind::AllReduce,
    CollKind::Reduce,
    CollKind::ReduceScatter,
];
const DTYPES: [DataType; 3] = [DataType::F32, DataType::F16, DataType::Bf16];
/// Call sizes (elements per block): the smaller ones' results must be
/// prefixes of the largest's.
const COUNTS: [usize; 3] = [1031, 40, 1];
const NRANKS: u32 = 5;

/// A value of which `big + 1 - big` loses the 1 in `T` (its spacing at
/// `big` is 2 or more), for the order-revealing inputs.
fn big<T: Element>() -> f64 {
    match T::DTYPE {
        DataType::F16 => 2048.0,
        DataType::Bf16 => 256.0,
        _ => 1e8,
    }
}

/// Element `i` of block `b` of rank `r`'s input: independent of the call
/// size, so every call's result is a prefix of a larger call's.
fn value<T: Element>(r: u32, b: usize, i: usize) -> T {
    let g = big::<T>();
    let set = [g, 1.0, -g, 3.0, 0.5, g / 2.0, -1.0, 0.25, -g / 2.0, 1.5];
    let k = (r as usize * 7 + i * 3 + b * 5 + i / 5) % set.len();
    T::from_f64(set[k])
}

/// What one run produced: per collective, data type and memory form,
/// every rank's output (the largest call's), as bits.
type Outcome = Vec<(String, Vec<Option<Vec<u64>>>)>;

/// `v` as comparable bits: widening f32, f16 and bf16 to f64 is exact and
/// keeps the sign of zero, so equal bits here are equal bits there (the
/// inputs make no NaN).
fn bits<T: Element>(v: &[T]) -> Vec<u64> {
    v.iter().map(|x| x.to_f64().to_bits()).collect()
}

/// How the memory of a call is laid out.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Memory {
    /// `comm.alloc` buffers, out of place (registered: direct plans).
    Alloc,
    /// `comm.alloc`, in place.
    AllocInPlace,
    /// Plain slices (not registered: FIFO plans).
    Slices,
}

/// One rank's output of `kind` on `count` elements per block.
fn call<T: Element>(c: &Communicator, kind: CollKind, count: usize, mem: Memory) -> Vec<T> {
    let n = c.nranks();
    let coll = Collective::new(kind, count, n - 1);
    let (ilen, olen) = (coll.input_len(n), coll.output_len(n));
    let input: Vec<T> = (0..ilen)
        .map(|j| value::<T>(c.rank(), j / count.max(1), j % count.max(1)))
        .collect();
    let op = RedOp::Sum;
    let res;
    let out = match mem {
        Memory::Slices => {
            let mut out = vec![T::default(); olen];
            res = c.collective(kind, &input[..], &mut out[..], op, coll.root);
            out
        }
        Memory::Alloc => {
            let send = c.alloc::<T>(ilen).unwrap();
            let recv = c.alloc::<T>(olen).unwrap();
            send.copy_from_slice(&input).unwrap();
            res = c.collective(kind, &send, &recv, op, coll.root);
            c.synchronize().unwrap();
            recv.to_vec().unwrap()
        }
        Memory::AllocInPlace => {
            let (in_off, out_off) = coll.in_place_offsets(c.rank());
            let buf = c.alloc::<T>(ilen.max(olen)).unwrap();
            buf.slice(in_off..in_off + ilen)
                .copy_from_slice(&input)
                .unwrap();
            let recv = buf.slice(out_off..out_off + olen);
            res = c.collective(kind, buf.slice(in_off..in_off + ilen), recv, op, coll.root);
            c.synchronize().unwrap();
            recv.to_vec().unwrap()
        }
    };
    if let Err(e) = res {
        panic!("rank {}: {kind} of {count} ({mem:?}) failed: {e}", c.rank());
    }
    out
}

/// One run's configuration: an algorithm (for every reduction it serves),
/// a protocol, a channel count and a piece size.
#[derive(Clone, Copy, Debug)]
struct Setup {
    algo: Algo,
    proto: Proto,
    channels: u32,
    chunk_bytes: Option<usize>,
}

/// Every setup over `protos` (what the backend runs): each algorithm, on
/// 1, 2 and 4 channels with the default, 256-byte and 4 KiB pieces.
fn setups(protos: &[Proto]) -> Vec<Setup> {
    let mut v = Vec::new();
    for algo in Algo::ALL {
        for &proto in protos {
            for (channels, chunk_bytes) in [(1, None), (2, Some(256)), (4, Some(4096))] {
                v.push(Setup {
                    algo,
                    proto,
                    channels,
                    chunk_bytes,
                });
            }
        }
    }
    v
}

fn config(backend: BackendKind, s: Setup, deterministic: bool) -> Config {
    let mut b = Config::builder()
        .backend(backend)
        .algorithms(&[s.algo])
        .protocols(&[s.proto])
        .channels(s.channels)
        .deterministic(deterministic);
    if let Some(c) = s.chunk_bytes {
        b = b.chunk_bytes(c);
    }
    b.build().unwrap()
}

/// The reductions `algo` runs: those it serves, and with the switch on
/// only those it reduces in rank order.
fn kinds(algo: Algo, deterministic: bool) -> Vec<CollKind> {
    REDUCTIONS
        .into_iter()
        .filter(|&k| supports(algo, k))
        .filter(|&k| !deterministic || reduces_in_rank_order(algo, k))
        .collect()
}

/// Runs every reduction `kinds` names, in every data type and memory form
/// and at every call size, on `comms`. Checks that smaller calls' results
/// are prefixes of the largest's and that the largest equals the
/// sequential reference bit for bit, with `exact` (the switch on);
/// returns the largest call's outputs.
fn run(comms: &[Communicator], algo: Algo, kinds: &[CollKind], exact: bool, what: &str) -> Outcome {
    let mut outcome = Vec::new();
    for &kind in kinds {
        for dt in DTYPES {
            // Plain slices are host memory: only the host backend takes
            // them (unregistered memory there runs FIFO plans).
            let host = comms[0].backend() == oxccl::BackendKind::Host;
            let mems: &[Memory] = if host {
                &[Memory::Alloc, Memory::AllocInPlace, Memory::Slices]
            } else {
                &[Memory::Alloc, Memory::AllocInPlace]
            };
            for &mem in mems {
                let key = format!("{kind} {dt} {mem:?}");
                let outs = with_dtype!(dt, T => one_case::<T>(comms, algo, kind, mem, exact, &format!("{what}: {key}")));
                outcome.push((key, outs));
            }
        }
    }
    outcome
}

/// [`run`]'s body for one collective, type and memory form.
fn one_case<T: Element>(
    comms: &[Communicator],
    algo: Algo,
    kind: CollKind,
    mem: Memory,
    exact: bool,
    what: &str,
) -> Vec<Option<Vec<u64>>> {
    let n = comms.len() as u32;
    let mut largest: Vec<Option<Vec<u64>>> = Vec::new();
    for (i, &count) in COUNTS.iter().enumerate() {
        let outs: Vec<Vec<T>> = on_ranks(comms, |c| call::<T>(c, kind, count, mem));
        // The configuration forced one algorithm: it is what ran.
        for c in comms {
            let ran = c.last_choice().map(|ch| ch.algo);
            assert_eq!(ran, Some(algo), "{what}: ran {ran:?}");
        }
        let coll = Collective::new(kind, count, n - 1);
        let defined: Vec<Option<Vec<u64>>> = outs
            .iter()
            .enumerate()
            .map(|(r, o)| coll.writes_output(r as u32).then(|| bits(o)))
            .collect();
        if i == 0 {
            if exact {
                let inputs: Vec<Vec<T>> = (0..n)
                    .map(|r| {
                        (0..coll.input_len(n))
                            .map(|j| value::<T>(r, j / count, j % count))
                            .collect()
                    })
                    .collect();
                let op = RedOp::Sum.lower(T::DTYPE, n);
                let want: Vec<Option<Vec<u64>>> = reference::expected(&coll, &inputs, &op)
                    .iter()
                    .map(|w| w.as_deref().map(bits))
                    .collect();
                assert_eq!(defined, want, "{what}: not the rank-order reference");
            }
            largest = defined;
        } else if exact {
            // (Without the switch a ring's order follows the call's
            // layout, so sizes may differ there: not checked.)
            for (r, (got, big)) in defined.iter().zip(&largest).enumerate() {
                if let (Some(got), Some(big)) = (got, big) {
                    assert_eq!(
                        got[..],
                        big[..count],
                        "{what}: rank {r}'s {count}-element call is no prefix of the {}-element one",
                        COUNTS[0]
                    );
                }
            }
        }
    }
    largest
}

/// The generic body: `make` builds `NRANKS` communicators from a
/// configuration (`None`: the backend is absent, skip); `protos` are
/// the protocols the backend runs.
fn every_plan_same_bits(
    backend: BackendKind,
    protos: &[Proto],
    make: &dyn Fn(Config) -> Option<Vec<Communicator>>,
) {
    // Switch on: every run equals the reference, so every pair is equal;
    // compared pairwise too, to say which runs disagree.
    let mut seen: Vec<(String, Outcome)> = Vec::new();
    let mut algos = Vec::new();
    for s in setups(protos) {
        let ks = kinds(s.algo, true);
        if ks.is_empty() {
            continue;
        }
        algos.push(s.algo);
        let Some(comms) = make(config(backend, s, true)) else {
            return;
        };
        let what = format!("deterministic {s:?}");
        let out = run(&comms, s.algo, &ks, true, &what);
        for (w, o) in &seen {
            for (key, outs) in &out {
                if let Some((_, other)) = o.iter().find(|(k, _)| k == key) {
                    assert_eq!(outs, other, "{key}: {what} differs from {w}");
                }
            }
        }
        seen.push((what, out));
    }
    for want in [Algo::OneShot, Algo::TwoShot, Algo::AllPairs] {
        assert!(algos.contains(&want), "{want} never ran");
    }

    // Switch off: rings and trees reduce in other orders, so some pair of
    // runs of the same call differs (else this test could not fail).
    let mut off: Vec<(String, Outcome)> = Vec::new();
    for s in setups(protos) {
        let ks = kinds(s.algo, false);
        if ks.is_empty() {
            continue;
        }
        let Some(comms) = make(config(backend, s, false)) else {
            return;
        };
        off.push((format!("{s:?}"), run(&comms, s.algo, &ks, false, "free")));
    }
    let mut differing = Vec::new();
    for (i, (wa, a)) in off.iter().enumerate() {
        for (wb, b) in &off[i + 1..] {
            for (key, outs) in a {
                if b.iter().any(|(k, o)| k == key && o != outs) {
                    differing.push(format!("{key}: {wa} / {wb}"));
                }
            }
        }
    }
    assert!(
        !differing.is_empty(),
        "without the switch every plan gave the same bits: the inputs do not reveal order"
    );
    println!(
        "{} differing pairs without the switch, e.g. {}",
        differing.len(),
        differing[0]
    );
}

#[test]
fn host_reductions_are_bit_identical_under_every_plan() {
    every_plan_same_bits(BackendKind::Host, &[Proto::Simple], &|cfg| {
        Some(oxccl::init_all_with(NRANKS, cfg).unwrap())
    });
}

#[test]
fn cuda_reductions_are_bit_identical_under_every_plan() {
    if oxccl::backend::cuda::device_or_skip("cuda_reductions_are_bit_identical_under_every_plan")
        .is_none()
    {
        return;
    }
    every_plan_same_bits(BackendKind::Cuda, &[Proto::Simple, Proto::LL], &|cfg| {
        Some(oxccl::init_all_with(NRANKS, cfg).expect("CUDA communicators"))
    });
}

/// With the switch on, an algorithm filter that leaves a reduction only
/// rings or trees is refused, naming the switch: at the call for a plain
/// list (other collectives still run), at init for a rule of its own.
#[test]
fn forced_order_dependent_algorithms_are_refused() {
    let on = |b: oxccl::ConfigBuilder| b.backend(BackendKind::Host).deterministic(true).build();
    let comms =
        oxccl::init_all_with(3, on(Config::builder().algorithms(&[Algo::Ring])).unwrap()).unwrap();
    let results = on_ranks(&comms, |c| {
        let send = [1.0f32; 8];
        let mut recv = vec![0.0f32; 8];
        let ar = c.all_reduce(&send[..], &mut recv[..], RedOp::Sum);
        let mut all = [0.0f32; 24];
        let ag = c.all_gather(&send[..], &mut all[..]);
        (ar, ag, recv)
    });
    for (ar, ag, recv) in results {
        match ar {
            Err(e @ Error::NoAlgorithm { .. }) => {
                let m = e.to_string();
                assert!(
                    m.contains("OXCCL_DETERMINISTIC=1 admits only oneshot,twoshot"),
                    "{m}"
                );
            }
            other => panic!("AllReduce under ring with the switch: {other:?}"),
        }
        assert!(recv.iter().all(|&x| x == 0.0), "a refused call wrote");
        ag.unwrap();
    }
    let rule = Config::builder().algorithms_for(CollKind::ReduceScatter, &[Algo::Ring]);
    match oxccl::init_all_with(3, on(rule).unwrap()) {
        Err(e @ Error::NoAlgorithm { .. }) => {
            assert!(e.to_string().contains("admits only allpairs"), "{e}");
        }
        other => panic!(
            "a ring-only ReduceScatter rule with the switch: {:?}",
            other.err()
        ),
    }
}
