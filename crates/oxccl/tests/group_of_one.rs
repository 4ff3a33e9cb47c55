//! A group holding one collective is that collective: it runs as the lone
//! call (the call check compares it as the lone call), so one rank may make
//! it grouped while its peer makes it alone, typed or raw.

use oxccl::{CollKind, DataType, RawColl, RawStream, RedOp};

mod common;
use common::{host, on_ranks as each_rank};

#[test]
fn a_grouped_call_and_a_lone_call_meet() {
    let comms = host(2);
    each_rank(&comms, |c| {
        let r = c.rank();
        let send = c.alloc::<f32>(3).unwrap();
        let recv = c.alloc::<f32>(3).unwrap();
        for i in 0..3u8 {
            send.copy_from_slice(&[f32::from(i) + r as f32; 3]).unwrap();
            if r == 0 {
                oxccl::group(|g| g.all_reduce(c, &send, &recv, RedOp::Sum)).unwrap();
            } else {
                c.all_reduce(&send, &recv, RedOp::Sum).unwrap();
            }
            assert_eq!(recv.to_vec().unwrap(), vec![2.0 * f32::from(i) + 1.0; 3]);
        }
        // The lone path ran it: it is this rank's last collective (the
        // group path leaves the last choice alone).
        assert!(c.last_choice().is_some(), "rank {r}: no lone call ran");
    });
}

#[test]
fn a_grouped_raw_call_and_a_lone_raw_call_meet() {
    let comms = host(2);
    each_rank(&comms, |c| {
        let r = c.rank();
        let send = [r as i32 + 1; 4];
        let mut recv = [0i32; 4];
        let call = RawColl {
            kind: CollKind::AllReduce,
            send: send.as_ptr().cast(),
            recv: recv.as_mut_ptr().cast(),
            count: 4,
            dtype: DataType::I32,
            op: RedOp::Max,
            root: 0,
        };
        // SAFETY: this thread's arrays, 4 i32 each way, alive across the
        // call; the host backend completes it before returning.
        unsafe {
            if r == 1 {
                let mut g = oxccl::Group::new();
                g.collective_raw(c, call, RawStream(0)).unwrap();
                g.end().unwrap();
            } else {
                c.collective_raw(call, RawStream(0)).unwrap();
            }
        }
        assert_eq!(recv, [2; 4], "rank {r}");
        assert!(c.last_choice().is_some(), "rank {r}: no lone call ran");
    });
}

#[test]
fn a_group_of_two_collectives_still_runs_as_a_group() {
    let comms = host(2);
    each_rank(&comms, |c| {
        let r = c.rank();
        let a = c.alloc::<u32>(2).unwrap();
        let b = c.alloc::<u32>(2).unwrap();
        a.copy_from_slice(&[r + 1; 2]).unwrap();
        let (x, y) = (c.alloc::<u32>(2).unwrap(), c.alloc::<u32>(2).unwrap());
        b.copy_from_slice(&[10 * (r + 1); 2]).unwrap();
        oxccl::group(|g| {
            g.all_reduce(c, &a, &x, RedOp::Sum)?;
            g.all_reduce(c, &b, &y, RedOp::Sum)
        })
        .unwrap();
        assert_eq!(x.to_vec().unwrap(), vec![3; 2]);
        assert_eq!(y.to_vec().unwrap(), vec![30; 2]);
    });
}
