//! Every generator on a grid of small cases, f32 and i32, sum.

mod common;

use oxccl_core::{Collective, DataType, PlanRequest, RedOp};

#[test]
fn every_generator_small_grid() {
    for (algo, kind) in common::served() {
        for n in [1u32, 2, 3, 4, 5, 7, 8] {
            for count in [0usize, 1, 2, 7, 30] {
                for in_place in [false, true] {
                    for (channels, chunk) in [(1, 64), (2, 3), (3, 1)] {
                        let root = (count as u32 * 7 + 3) % n;
                        let mut req = PlanRequest::new(Collective::new(kind, count, root), n, algo);
                        req.in_place = in_place;
                        req.channels = channels;
                        req.chunk = chunk;
                        for registered in [false, true] {
                            req.registered = registered;
                            for dt in [DataType::F32, DataType::I32] {
                                if let Err(e) = common::run_dtype(&req, dt, RedOp::Sum, 7) {
                                    panic!("{algo} {kind} n={n} count={count} root={root} in_place={in_place} ch={channels} chunk={chunk} registered={registered} {dt}: {e}");
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
