//! Zero-copy views of host buffers, and the copy errors that say what is
//! allowed.

mod common;
use common::{host, on_ranks};

use oxccl::{Error, RedOp};

#[test]
fn host_buffers_have_zero_copy_views() {
    let comms = host(3);
    let out = on_ranks(&comms, |c| {
        let mut b = c.alloc::<i64>(1000).unwrap();
        let p = b.as_slice().unwrap().as_ptr();
        for (i, v) in b.as_mut_slice().unwrap().iter_mut().enumerate() {
            *v = i as i64 * (c.rank() as i64 + 1);
        }
        c.all_reduce_in_place(&b, RedOp::Sum).unwrap();
        let copy = b.to_vec().unwrap();
        let view = b.as_slice().unwrap();
        assert_eq!(view.as_ptr(), p, "the same memory, no copy");
        assert_eq!(view, &copy[..]);
        copy
    });
    for v in out {
        assert!(v.iter().enumerate().all(|(i, &x)| x == 6 * i as i64));
    }
    let mut empty = comms[0].alloc::<f32>(0).unwrap();
    assert!(empty.as_slice().unwrap().is_empty());
    assert!(empty.as_mut_slice().unwrap().is_empty());
}

#[test]
fn copies_say_shorter_is_fine_and_longer_is_not() {
    let comms = host(1);
    let b = comms[0].alloc::<u8>(4).unwrap();
    b.copy_from_slice(&[1, 2]).unwrap();
    let e = b.copy_from_slice(&[0; 5]).unwrap_err();
    assert!(matches!(e, Error::TooLong { max: 4, got: 5, .. }), "{e}");
    assert!(e.to_string().contains("at most 4"), "{e}");
    assert_eq!(b.to_vec().unwrap(), vec![1, 2, 0, 0]);
}

#[test]
fn cuda_buffers_refuse_host_views() {
    let Some(comms) = common::cuda("cuda_buffers_refuse_host_views", 1) else {
        return;
    };
    let mut b = comms[0].alloc::<f32>(4).unwrap();
    assert!(matches!(b.as_slice(), Err(Error::ForeignBuffer { .. })));
    assert!(matches!(b.as_mut_slice(), Err(Error::ForeignBuffer { .. })));
}
