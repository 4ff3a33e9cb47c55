//! Every generated plan the core supports, run on the host fabric and
//! compared with the sequential reference: all algorithms and collectives
//! `oxccl_core::gen::supports` lists (new generators are covered as they
//! land), all twelve data types, every op, in place and out of place.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::{check_request, small_config, Checked};
use oxccl_core::testkit::OPS;
use oxccl_core::{gen, with_dtype, Algo, CollKind, Collective, DataType, PlanRequest, RedOp};
use oxccl_host::HostFabric;
use proptest::prelude::*;

/// Every `(algo, kind)` the generators claim, except Send/Recv (which has
/// no collective reference).
fn supported() -> Vec<(Algo, CollKind)> {
    Algo::ALL
        .into_iter()
        .flat_map(|a| CollKind::ALL.into_iter().map(move |k| (a, k)))
        .filter(|&(a, k)| k != CollKind::SendRecv && gen::supports(a, k))
        .collect()
}

/// Fabrics shared by the cases of one test, one per rank count: connections
/// persist across calls of different plans, types and sizes, as in a real
/// communicator.
struct Fabrics {
    slot_bytes: usize,
    by_n: HashMap<u32, Arc<HostFabric>>,
}

impl Fabrics {
    fn new(slot_bytes: usize) -> Self {
        Fabrics {
            slot_bytes,
            by_n: HashMap::new(),
        }
    }
    fn get(&mut self, n: u32) -> Arc<HostFabric> {
        self.by_n
            .entry(n)
            .or_insert_with(|| HostFabric::new(n, small_config(self.slot_bytes)))
            .clone()
    }
}

#[allow(clippy::too_many_arguments)] // reason: one request's every knob
fn request(
    algo: Algo,
    kind: CollKind,
    n: u32,
    count: usize,
    root: u32,
    channels: u32,
    chunk: usize,
    in_place: bool,
    registered: bool,
) -> PlanRequest {
    let mut req = PlanRequest::new(Collective::new(kind, count, root), n, algo);
    req.channels = channels;
    req.chunk = chunk;
    req.in_place = in_place;
    req.registered = registered;
    req
}

fn check(fabs: &mut Fabrics, req: &PlanRequest, dt: DataType, op: RedOp, seed: u64) -> Checked {
    assert!(
        req.chunk * dt.size() <= fabs.slot_bytes,
        "chunk must fit a slot"
    );
    let fab = fabs.get(req.nranks);
    with_dtype!(dt, T => check_request::<T>(&fab, req, op, seed)).unwrap_or_else(|e| panic!("{e}"))
}

/// All types × all ops (where the collective takes one) × in/out of place,
/// on three ranks with an odd count, two channels and a chunk that does not
/// divide the data.
#[test]
fn every_dtype_op_and_placement() {
    let mut fabs = Fabrics::new(64);
    let (mut ran, mut remote, mut unsupported) = (0, 0, 0);
    for (algo, kind) in supported() {
        for dt in DataType::ALL {
            for op in OPS
                .into_iter()
                .filter(|&op| oxccl_core::testkit::op_applies(kind, op))
            {
                for (in_place, registered) in
                    [(false, false), (true, false), (false, true), (true, true)]
                {
                    let chunk = (64 / dt.size()).min(5);
                    let req = request(algo, kind, 3, 37, 1, 2, chunk, in_place, registered);
                    if check(&mut fabs, &req, dt, op, 7) == Checked::Ran {
                        ran += 1;
                        let plan = oxccl_core::generate(&req).expect("generated above");
                        remote += usize::from(plan.ranks.iter().any(|r| r.needs_registration()));
                    } else {
                        unsupported += 1;
                    }
                }
            }
        }
    }
    println!(
        "ran {ran} (algo, collective, dtype, op, placement) cases, {remote} with remote steps, \
         {unsupported} unsupported"
    );
    assert_eq!(
        (ran, remote, unsupported),
        EVERY_DTYPE_OP_AND_PLACEMENT,
        "(ran, with remote steps, unsupported)"
    );
}

/// Cases `every_dtype_op_and_placement` runs: (ran, of which with remote
/// steps, unsupported requests). Every supported (algorithm, collective)
/// × 12 types × its ops × 4 placements runs and none is refused but the
/// copy-engine algorithm's unregistered requests (5 collectives × 12
/// types × 2 placements); a generator or op added or dropped moves these
/// and must update them.
const EVERY_DTYPE_OP_AND_PLACEMENT: (usize, usize, usize) = (5064, 912, 120);

/// Cases `shapes` runs: (ran, unsupported); pinned as above (the
/// copy-engine algorithm refuses its 250 unregistered requests).
const SHAPES: (usize, usize) = (4050, 250);

/// Rank counts (including 1 and non-powers of two), counts from empty to
/// several rounds, channel counts and roots.
#[test]
fn shapes() {
    let mut fabs = Fabrics::new(256);
    let (mut ran, mut unsupported) = (0, 0);
    let mut tally = |c: Checked| match c {
        Checked::Ran => ran += 1,
        Checked::Unsupported => unsupported += 1,
    };
    for (algo, kind) in supported() {
        for n in [1u32, 2, 4, 5, 8] {
            for count in [0usize, 1, 7, 100, 1001] {
                for channels in [1u32, 3] {
                    for (in_place, registered) in [(false, false), (true, true)] {
                        let root = (n - 1).min(2);
                        let req = request(
                            algo, kind, n, count, root, channels, 16, in_place, registered,
                        );
                        tally(check(
                            &mut fabs,
                            &req,
                            DataType::F32,
                            RedOp::Sum,
                            count as u64,
                        ));
                        if kind.is_reduction() {
                            tally(check(&mut fabs, &req, DataType::I8, RedOp::Max, 3));
                        }
                    }
                }
            }
        }
    }
    println!("shapes: ran {ran}, {unsupported} unsupported");
    assert_eq!((ran, unsupported), SHAPES, "(ran, unsupported)");
}

fn arb_case() -> impl Strategy<Value = (PlanRequest, DataType, RedOp, u64)> {
    let pairs = supported();
    (
        0..pairs.len(),
        1u32..=6,
        0usize..300,
        1u32..=3,
        1usize..=8,
        (any::<bool>(), any::<bool>()),
        0..DataType::ALL.len(),
        0..OPS.len(),
        any::<u64>(),
        any::<u32>(),
    )
        .prop_map(
            move |(p, n, count, channels, chunk, (in_place, registered), dt, op, seed, root)| {
                let (algo, kind) = pairs[p];
                let op = if oxccl_core::testkit::op_applies(kind, OPS[op]) {
                    OPS[op]
                } else {
                    RedOp::Sum
                };
                let req = request(
                    algo,
                    kind,
                    n,
                    count,
                    root % n,
                    channels,
                    chunk,
                    in_place,
                    registered,
                );
                (req, DataType::ALL[dt], op, seed)
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn random_requests((req, dt, op, seed) in arb_case()) {
        let mut fabs = Fabrics::new(64);
        check(&mut fabs, &req, dt, op, seed);
    }
}
