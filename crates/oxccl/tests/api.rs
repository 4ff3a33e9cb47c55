//! What sits next to the collectives: barrier, typed group helpers for
//! every collective, completion handles, all_to_all_v, PreMulSum from a
//! scalar in memory, and the element types at the crate root.

use std::time::Duration;

mod common;
use common::{host, on_ranks};

use oxccl::{bf16, f16, BackendKind, Config, Error, RedOp, F8E4M3, F8E5M2};

#[test]
fn barrier_meets_every_rank_and_names_a_missing_one() {
    let comms = host(3);
    for r in on_ranks(&comms, |c| (0..5).try_for_each(|_| c.barrier())) {
        r.unwrap();
    }
    // A rank calling a collective where the others barrier: a mismatch.
    let out = on_ranks(&comms, |c| {
        if c.rank() == 1 {
            let b = c.alloc::<f32>(4).unwrap();
            c.all_reduce_in_place(&b, RedOp::Sum)
        } else {
            c.barrier()
        }
    });
    for r in out {
        let m = r.unwrap_err().to_string();
        assert!(m.contains("ranks 0, 2: barrier"), "{m}");
    }
    let lonely = oxccl::init_all_with(
        2,
        Config::builder()
            .backend(BackendKind::Host)
            .deadline(Duration::from_millis(200))
            .build()
            .unwrap(),
    )
    .unwrap();
    let m = lonely[0].barrier().unwrap_err().to_string();
    assert!(
        m.contains("barrier") && m.contains("rank 1 has not reached it"),
        "{m}"
    );
}

#[test]
fn group_has_a_typed_helper_for_every_collective() {
    let comms = host(3);
    let n = 3usize;
    let out = on_ranks(&comms, |c| {
        let r = c.rank() as usize;
        let mine: Vec<i32> = vec![r as i32 + 1; 2];
        let blocks: Vec<i32> = (0..2 * n).map(|i| (10 * r + i) as i32).collect();
        let mut bc = if r == 0 { vec![7, 8] } else { vec![0, 0] };
        let mut red = vec![0; 2];
        let mut ag = vec![0; 2 * n];
        let mut rs = vec![0; 2];
        let mut a2a = vec![0; 2 * n];
        let mut gat = vec![0; 2 * n];
        let mut sc = vec![0; 2];
        let bc_in = bc.clone();
        oxccl::group(|g| {
            g.broadcast(c, &bc_in, &mut bc, 0)?;
            g.reduce(c, &mine, &mut red, RedOp::Sum, 1)?;
            g.all_gather(c, &mine, &mut ag)?;
            g.reduce_scatter(c, &blocks, &mut rs, RedOp::Max)?;
            g.all_to_all(c, &blocks, &mut a2a)?;
            g.gather(c, &mine, &mut gat, 2)?;
            g.scatter(c, &blocks, &mut sc, 0)
        })
        .unwrap();
        (bc, red, ag, rs, a2a, gat, sc)
    });
    for (r, (bc, red, ag, rs, a2a, gat, sc)) in out.into_iter().enumerate() {
        assert_eq!(bc, vec![7, 8]);
        if r == 1 {
            assert_eq!(red, vec![6, 6]);
        }
        assert_eq!(ag, vec![1, 1, 2, 2, 3, 3]);
        // Max over ranks of block r: rank 2's values.
        assert_eq!(rs, vec![(20 + 2 * r) as i32, (21 + 2 * r) as i32]);
        let want: Vec<i32> = (0..n)
            .flat_map(|q| [(10 * q + 2 * r) as i32, (10 * q + 2 * r + 1) as i32])
            .collect();
        assert_eq!(a2a, want);
        if r == 2 {
            assert_eq!(gat, vec![1, 1, 2, 2, 3, 3]);
        }
        assert_eq!(sc, vec![2 * r as i32, 2 * r as i32 + 1]);
    }
}

#[test]
fn completion_handles_wait_and_poll() {
    let comms = host(2);
    let out = on_ranks(&comms, |c| {
        let b = c.alloc::<f64>(16).unwrap();
        b.copy_from_slice(&[1.5; 16]).unwrap();
        c.all_reduce_in_place(&b, RedOp::Sum).unwrap();
        let mut h = c.completion().unwrap();
        // Host calls complete on return.
        assert!(h.is_done().unwrap());
        h.wait().unwrap();
        b.to_vec().unwrap()
    });
    assert!(out.iter().all(|v| v == &vec![3.0; 16]));
    let mut h = comms[0].completion().unwrap();
    comms[1].abort();
    assert!(matches!(h.is_done(), Err(Error::Failed { rank: 0, .. })));
    assert!(comms[0].completion().is_err());
}

#[test]
fn all_to_all_v_moves_uneven_blocks() {
    let comms = host(3);
    let n = 3usize;
    // Rank r sends r + p + 1 elements to rank p.
    let cnt = |from: usize, to: usize| from + to + 1;
    let out = on_ranks(&comms, |c| {
        let r = c.rank() as usize;
        let sc: Vec<usize> = (0..n).map(|p| cnt(r, p)).collect();
        let sd: Vec<usize> = sc
            .iter()
            .scan(0, |a, &x| {
                let d = *a;
                *a += x;
                Some(d)
            })
            .collect();
        let rc: Vec<usize> = (0..n).map(|q| cnt(q, r)).collect();
        // Receive blocks in reverse order with a gap, to use displacements.
        let mut rd = vec![0; n];
        let mut at = 1;
        for q in (0..n).rev() {
            rd[q] = at;
            at += rc[q];
        }
        let send: Vec<u32> = (0..sd[n - 1] + sc[n - 1])
            .map(|i| (100 * r + i) as u32)
            .collect();
        let recv = c.alloc::<u32>(at).unwrap();
        c.all_to_all_v(&send, &sc, &sd, &recv, &rc, &rd).unwrap();
        (recv.to_vec().unwrap(), rc, rd)
    });
    for (r, (recv, rc, rd)) in out.iter().enumerate() {
        assert_eq!(recv[0], 0, "the gap stays");
        for q in 0..n {
            let q_disp: usize = (0..r).map(|p| cnt(q, p)).sum();
            let want: Vec<u32> = (0..rc[q]).map(|i| (100 * q + q_disp + i) as u32).collect();
            assert_eq!(&recv[rd[q]..rd[q] + rc[q]], &want[..], "rank {r} from {q}");
        }
    }
}

#[test]
fn all_to_all_v_refuses_bad_layouts_and_mismatched_counts() {
    let comms = host(2);
    let c = &comms[0];
    let send = vec![0.0f32; 4];
    let mut recv = vec![0.0f32; 4];
    let layout = |e: Error| assert!(matches!(e, Error::InvalidLayout { .. }), "{e}");
    layout(
        c.all_to_all_v(&send, &[2], &[0], &mut recv, &[2, 2], &[0, 2])
            .unwrap_err(),
    );
    layout(
        c.all_to_all_v(&send, &[2, 3], &[0, 2], &mut recv, &[2, 2], &[0, 2])
            .unwrap_err(),
    );
    layout(
        c.all_to_all_v(&send, &[2, 2], &[0, 2], &mut recv, &[2, 2], &[0, 1])
            .unwrap_err(),
    );
    assert_eq!(recv, vec![0.0; 4], "nothing written");
    // Rank 1 expects 3 from rank 0, which sends 2: both sides fail.
    let out = on_ranks(&comms, |c| {
        let (send, mut recv) = (vec![1.0f32; 4], vec![0.0f32; 5]);
        let rc: &[usize] = if c.rank() == 1 { &[3, 2] } else { &[2, 2] };
        c.all_to_all_v(&send, &[2, 2], &[0, 2], &mut recv, rc, &[0, 3])
    });
    for r in out {
        assert!(matches!(r, Err(Error::Mismatch { .. })), "{r:?}");
    }
}

#[test]
fn premul_sum_takes_its_scalar_from_memory() {
    // Each rank's scalar scales its own input (NCCL's semantics), also
    // where registered plans would read peers' inputs, checked or not.
    for check in [true, false] {
        let comms = oxccl::init_all_with(
            2,
            Config::builder()
                .backend(BackendKind::Host)
                .check_calls(check)
                .build()
                .unwrap(),
        )
        .unwrap();
        for len in [8usize, 300_000] {
            let out = on_ranks(&comms, |c| {
                let scale = c.alloc::<f32>(1).unwrap();
                scale.copy_from_slice(&[c.rank() as f32 + 2.0]).unwrap();
                let op = c.premul_sum_op(&scale).unwrap();
                let b = c.alloc::<f32>(len).unwrap();
                b.copy_from_slice(&vec![1.0; len]).unwrap();
                c.all_reduce_in_place(&b, op).unwrap();
                let g = c.alloc::<f32>(len).unwrap();
                g.copy_from_slice(&vec![1.0; len]).unwrap();
                oxccl::group(|gr| gr.all_reduce(c, &g, &g, op)).unwrap();
                (b.to_vec().unwrap(), g.to_vec().unwrap())
            });
            // 2 * 1 + 3 * 1.
            for (b, g) in out {
                assert!(
                    b.iter().chain(&g).all(|&x| x == 5.0),
                    "check {check}, {len}"
                );
            }
        }
    }
    let comms = host(2);
    let c = &comms[0];
    assert!(matches!(
        c.premul_sum_op(&c.alloc::<f32>(0).unwrap()),
        Err(Error::LengthMismatch { .. })
    ));
    let half_int = c.alloc::<i32>(1).unwrap();
    half_int.copy_from_slice(&[i32::MAX]).unwrap();
    assert!(c.premul_sum_op(&half_int).is_ok());
}

#[test]
fn element_types_are_at_the_crate_root() {
    let comms = host(2);
    let out = on_ranks(&comms, |c| {
        let h = c.alloc::<f16>(4).unwrap();
        h.copy_from_slice(&[f16::from_f32(1.5); 4]).unwrap();
        c.all_reduce_in_place(&h, RedOp::Sum).unwrap();
        let b = c.alloc::<bf16>(4).unwrap();
        b.copy_from_slice(&[bf16::from_f32(2.0); 4]).unwrap();
        c.all_reduce_in_place(&b, RedOp::Max).unwrap();
        let e4 = c.alloc::<F8E4M3>(4).unwrap();
        e4.copy_from_slice(&[F8E4M3::from_f32(0.5); 4]).unwrap();
        c.all_reduce_in_place(&e4, RedOp::Sum).unwrap();
        let e5 = c.alloc::<F8E5M2>(4).unwrap();
        e5.copy_from_slice(&[F8E5M2::from_f32(c.rank() as f32); 4])
            .unwrap();
        c.all_reduce_in_place(&e5, RedOp::Min).unwrap();
        (
            h.to_vec().unwrap()[0].to_f32(),
            b.to_vec().unwrap()[0].to_f32(),
            e4.to_vec().unwrap()[0].to_f32(),
            e5.to_vec().unwrap()[0].to_f32(),
        )
    });
    for v in out {
        assert_eq!(v, (3.0, 2.0, 1.0, 0.0));
    }
}
