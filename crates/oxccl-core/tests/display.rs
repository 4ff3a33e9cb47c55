//! Plans print readably, and stay compact: step counts as documented and
//! messages no larger than the chunk.

mod common;

use oxccl_core::{generate, Algo, CollKind, Collective, PlanRequest};

#[test]
fn ring_allreduce_prints_its_primitives() {
    let req = PlanRequest::new(Collective::new(CollKind::AllReduce, 8, 0), 3, Algo::Ring);
    let text = generate(&req).unwrap().to_string();
    println!("{text}");
    for needle in [
        "rank 0/3",
        "rank 2/3",
        "send ",
        "recv_reduce_send",
        "recv_reduce_copy_send",
        "recv_copy_send",
        "in[",
        "out[",
        "!post",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    // 2n−1 = 5 steps per rank for one round (2(n−1) = 4 messages sent).
    let rank0: Vec<&str> = text
        .split("rank 1/3")
        .next()
        .unwrap()
        .lines()
        .filter(|l| l.contains(" -> "))
        .collect();
    assert_eq!(rank0.len(), 5, "{rank0:?}");
}

#[test]
fn ring_allreduce_has_two_n_minus_one_steps_and_messages_per_round() {
    for n in 2..=8u32 {
        let chunk = 16;
        let rounds = 3;
        let mut req = PlanRequest::new(
            Collective::new(CollKind::AllReduce, chunk * n as usize * rounds, 0),
            n,
            Algo::Ring,
        );
        req.chunk = chunk;
        let plan = generate(&req).unwrap();
        for rp in &plan.ranks {
            assert_eq!(rp.step_count(), rounds * (2 * n as usize - 1));
            let sends = rp
                .channels
                .iter()
                .flat_map(|c| &c.steps)
                .filter(|s| s.to_string().contains("send("))
                .count();
            assert_eq!(sends, rounds * 2 * (n as usize - 1));
        }
    }
}

#[test]
fn messages_never_exceed_the_chunk() {
    for (algo, kind) in common::served() {
        for registered in [false, true] {
            if !common::has_plan(algo, kind, registered, false, 6) {
                continue;
            }
            let mut req = PlanRequest::new(Collective::new(kind, 1000, 1), 6, algo);
            req.chunk = 37;
            req.channels = 2;
            req.registered = registered;
            let plan = generate(&req).unwrap();
            for rp in &plan.ranks {
                assert!(
                    rp.max_message() <= 37,
                    "{algo} {kind}: {}",
                    rp.max_message()
                );
                // Compact: steps grow with pieces, not elements.
                assert!(
                    rp.step_count() < 1000,
                    "{algo} {kind}: {} steps",
                    rp.step_count()
                );
            }
            // Registered plans touch peers' memory (in rooted collectives
            // only the readers do: the root or the non-roots); FIFO plans
            // never do.
            assert_eq!(
                plan.ranks.iter().any(|rp| rp.needs_registration()),
                registered
                    && matches!(
                        algo,
                        Algo::OneShot | Algo::TwoShot | Algo::AllPairs | Algo::CopyEngine
                    ),
                "{algo} {kind} registered={registered}"
            );
        }
    }
}
