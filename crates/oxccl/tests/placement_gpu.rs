//! Ranks run on the device they name (what the C ABI names: the calling
//! thread's current device), several ranks on one device included, and a
//! split child stays on its parent rank's device. Needs a GPU; skips
//! without one (fails under `OXCCL_REQUIRE_GPU=1`).

use oxccl::{BackendKind, Config, RedOp, UniqueId};

#[test]
fn ranks_named_on_device_0_run_there_and_splits_keep_it() {
    if oxccl::backend::cuda::device_or_skip("placement_gpu").is_none() {
        return;
    }
    let n = 3u32;
    let id = UniqueId::new().unwrap();
    let devices: Vec<(Option<i32>, Option<i32>)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                s.spawn(move || {
                    let config = Config::builder()
                        .backend(BackendKind::Cuda)
                        .device(0)
                        .build()
                        .unwrap();
                    let c = oxccl::Communicator::init_rank(&id, n, r, config).unwrap();
                    let b = c.alloc::<f32>(64).unwrap();
                    b.copy_from_slice(&[1.0; 64]).unwrap();
                    c.all_reduce_in_place(&b, RedOp::Sum).unwrap();
                    c.synchronize().unwrap();
                    assert_eq!(b.to_vec().unwrap(), vec![n as f32; 64]);
                    let color = (r != 1).then_some(0);
                    let child = c.split(color, 0).unwrap();
                    (c.cuda_device(), child.and_then(|k| k.cuda_device()))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, (dev, child)) in devices.into_iter().enumerate() {
        assert_eq!(dev, Some(0), "rank {r}");
        let want = (r != 1).then_some(0);
        assert_eq!(child, want, "rank {r}'s child");
    }
}

/// `ncclCommInitAll`'s device list naming device 0 for every rank: each
/// rank reports device 0 and the clique works; a device the process does
/// not see is refused naming the rank.
#[test]
fn a_device_list_naming_device_0_several_times() {
    let Some(info) = oxccl::backend::cuda::device_or_skip("placement_gpu") else {
        return;
    };
    let config = || {
        Config::builder()
            .backend(BackendKind::Cuda)
            .build()
            .unwrap()
    };
    let comms = oxccl::init_all_on_devices(&[0, 0, 0], config()).unwrap();
    for c in &comms {
        assert_eq!(c.cuda_device(), Some(0), "rank {}", c.rank());
    }
    let got: Vec<Vec<f32>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let b = c.alloc::<f32>(8).unwrap();
                    b.copy_from_slice(&[1.0; 8]).unwrap();
                    c.all_reduce_in_place(&b, RedOp::Sum).unwrap();
                    c.synchronize().unwrap();
                    b.to_vec().unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(got.iter().all(|v| v == &vec![3.0; 8]));
    let beyond = info.devices.len() as i32;
    let e = oxccl::init_all_on_devices(&[0, beyond], config()).unwrap_err();
    assert!(e.to_string().contains("rank 1 asked for device"), "{e}");
}
