//! Smoke test of the ring AllReduce through the interpreter.

use oxccl_core::interp::{self, InterpOptions, RankMem};
use oxccl_core::{generate, testkit, Algo, CollKind, Collective, PlanRequest, RedOp};

#[test]
fn ring_allreduce_small() {
    for n in [1u32, 2, 3, 5, 8] {
        for count in [0usize, 1, 7, 100, 1000] {
            for inplace in [false, true] {
                let coll = Collective::new(CollKind::AllReduce, count, 0);
                let mut req = PlanRequest::new(coll, n, Algo::Ring);
                req.channels = 2;
                req.chunk = 13;
                req.in_place = inplace;
                let plan = generate(&req).unwrap();
                let inputs: Vec<Vec<f32>> = (0..n)
                    .map(|r| testkit::input(&coll, n, r, RedOp::Sum, 1))
                    .collect();
                let mut mem: Vec<RankMem<f32>> = plan
                    .ranks
                    .iter()
                    .zip(&inputs)
                    .map(|(rp, i)| {
                        RankMem::new(&rp.bufs, i, inplace.then(|| coll.in_place_offsets(rp.rank)))
                    })
                    .collect();
                let op = RedOp::Sum.lower(oxccl_core::DataType::F32, n);
                interp::run(&plan, &mut mem, &op, &InterpOptions::default()).unwrap();
                let outs: Vec<Vec<f32>> = mem
                    .iter()
                    .map(|m| m.read_buf(oxccl_core::plan::BufId::OUTPUT))
                    .collect();
                let (wrong, first) = testkit::compare(&coll, &inputs, &outs, RedOp::Sum);
                assert_eq!(wrong, 0, "n={n} count={count}: {first:?}");
            }
        }
    }
}
