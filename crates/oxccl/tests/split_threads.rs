//! `split` of communicators whose ranks are threads (`init_all`): colors,
//! key order, no color, a rank that never calls, CUDA ranks staying on
//! their devices, and children that run at once on one GPU fitting there
//! together.

use std::time::Duration;

use oxccl::{BackendKind, Communicator, Config, Error, RedOp};

fn comms(n: u32, backend: BackendKind, deadline: Duration) -> Vec<Communicator> {
    oxccl::init_all_with(
        n,
        Config {
            backend,
            deadline,
            ..Config::default()
        },
    )
    .unwrap()
}

/// Every rank splits by `me % 2` (rank 3 passes no color) with key `-me`,
/// then sums its parent rank + 1 in the child: one line per parent rank.
fn split_and_sum(cs: &[Communicator]) -> Vec<String> {
    std::thread::scope(|s| {
        let hs: Vec<_> = cs
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let me = c.rank();
                    let color = (me != 3).then_some(me % 2);
                    match c.split(color, -(me as i32)).unwrap() {
                        None => format!("{me} -> none"),
                        Some(child) => {
                            let b = child.alloc::<f32>(4).unwrap();
                            b.copy_from_slice(&[me as f32 + 1.0; 4]).unwrap();
                            child.all_reduce_in_place(&b, RedOp::Sum).unwrap();
                            let v = b.to_vec().unwrap();
                            format!(
                                "{me} -> {} of {} sum {}",
                                child.rank(),
                                child.nranks(),
                                v[0]
                            )
                        }
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

const WANT: [&str; 4] = [
    "0 -> 1 of 2 sum 4",
    "1 -> 0 of 1 sum 2",
    "2 -> 0 of 2 sum 4",
    "3 -> none",
];

#[test]
fn threads_split_by_color_ordered_by_key() {
    let cs = comms(4, BackendKind::Host, Duration::from_secs(30));
    assert_eq!(split_and_sum(&cs), WANT);
    // A second split of the same parents works as the first.
    assert_eq!(split_and_sum(&cs), WANT);
}

/// Each child of an 8-rank parent, split in two, with the parent's
/// communicator: `(co_resident, max_channels)` of every child, by parent
/// rank, and the parent's `max_channels`.
fn split_in_two(cs: &[Communicator]) -> (Vec<Communicator>, Vec<(u32, u32)>) {
    let children: Vec<Communicator> = std::thread::scope(|s| {
        let hs: Vec<_> = cs
            .iter()
            .map(|c| s.spawn(move || c.split(Some(c.rank() % 2), 0).unwrap().unwrap()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let seen = children
        .iter()
        .map(|c| (c.child_config().cuda.co_resident, c.max_channels()))
        .collect();
    (children, seen)
}

#[test]
fn split_children_count_their_siblings_on_the_device() {
    let cs = comms(8, BackendKind::Host, Duration::from_secs(30));
    let (children, seen) = split_in_two(&cs);
    assert!(children.iter().all(|c| c.nranks() == 4));
    // The parent's 8 ranks share the host: each child (and its own
    // children) counts them, not only its 4.
    assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), [8; 8]);
}

/// Two 4-rank children of 8 ranks on one GPU run large AllReduces at
/// the same time: each child's blocks are capped for the 8 ranks that
/// share the device, so all fit at once (capped for 4 each, they asked for
/// twice the blocks that fit and spun until the deadline).
#[test]
fn cuda_split_children_run_at_once_on_one_gpu() {
    if oxccl::backend::cuda::device_or_skip("cuda_split_children_run_at_once_on_one_gpu").is_none()
    {
        return;
    }
    let cs = comms(8, BackendKind::Cuda, Duration::from_secs(60));
    let (children, seen) = split_in_two(&cs);
    for (r, &(co, ch)) in seen.iter().enumerate() {
        assert!(co >= 8, "child of rank {r} counts {co} ranks on the device");
        assert!(
            ch <= cs[r].max_channels(),
            "child of rank {r}: {ch} channels"
        );
    }
    let n = 1 << 18;
    let sums: Vec<f32> = std::thread::scope(|s| {
        let hs: Vec<_> = children
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let b = c.alloc::<f32>(n).unwrap();
                    b.copy_from_slice(&vec![c.rank() as f32 + 1.0; n]).unwrap();
                    for _ in 0..3 {
                        c.all_reduce_in_place(&b, RedOp::Max).unwrap();
                    }
                    let v = b.to_vec().unwrap();
                    assert!(v.iter().all(|&x| x == v[0]), "uneven result");
                    v[0]
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(sums, [4.0; 8]);
}

#[test]
fn a_rank_that_never_splits_is_named_and_the_next_round_works() {
    let cs = comms(3, BackendKind::Host, Duration::from_millis(300));
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = cs[..2]
            .iter()
            .map(|c| s.spawn(move || c.split(Some(0), 0)))
            .collect();
        hs.into_iter()
            .map(|h| match h.join().unwrap() {
                Err(Error::Timeout(m)) => m,
                other => panic!("expected a timeout, got {other:?}"),
            })
            .collect()
    });
    for e in errs {
        assert!(e.contains("for rank 2, which never called it"), "{e}");
    }
    let got: Vec<u32> = std::thread::scope(|s| {
        let hs: Vec<_> = cs
            .iter()
            .map(|c| s.spawn(move || c.split(Some(7), 0).unwrap().unwrap().nranks()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(got, [3, 3, 3]);
}

#[test]
fn cuda_threads_split_on_their_devices() {
    if oxccl::backend::cuda::device_or_skip("cuda_threads_split_on_their_devices").is_none() {
        return;
    }
    let cs = comms(4, BackendKind::Cuda, Duration::from_secs(30));
    assert_eq!(split_and_sum(&cs), WANT);
}
