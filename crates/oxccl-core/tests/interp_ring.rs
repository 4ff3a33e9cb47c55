//! Smoke test of the ring AllReduce through the interpreter.

mod common;

use oxccl_core::{Algo, CollKind, Collective, PlanRequest, RedOp};

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
                if let Err(e) = common::run_typed::<f32>(&req, RedOp::Sum, 1) {
                    panic!("n={n} count={count} in_place={inplace}: {e}");
                }
            }
        }
    }
}
