//! `split` of communicators whose ranks are threads (`init_all`): colors,
//! key order, no color, a rank that never calls, and CUDA ranks staying on
//! their devices.

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
