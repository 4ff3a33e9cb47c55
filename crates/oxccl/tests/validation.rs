//! One test per validation rule: the distinct error variant comes back and
//! the receive buffer is left untouched.

use oxccl::{BackendKind, Communicator, Config, Error, RedOp};

mod common;
use common::host;

const SENTINEL: f32 = -7.5;

/// A receive buffer filled with a sentinel, to prove nothing was written.
fn sentinel(c: &Communicator, len: usize) -> oxccl::Buffer<f32> {
    let b = c.alloc::<f32>(len).unwrap();
    b.copy_from_slice(&vec![SENTINEL; len]).unwrap();
    b
}

fn untouched(b: &oxccl::Buffer<f32>) {
    assert!(
        b.to_vec().unwrap().iter().all(|&x| x == SENTINEL),
        "buffer was written"
    );
}

#[test]
fn length_mismatch() {
    let comms = host(2);
    let c = &comms[0];
    let send = c.alloc::<f32>(8).unwrap();
    let recv = sentinel(c, 7);
    let e = c.all_reduce(&send, &recv, RedOp::Sum).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                what: "receive buffer",
                expected: 8,
                got: 7
            }
        ),
        "{e}"
    );
    assert_eq!(e.nccl_result(), 4);
    untouched(&recv);
    let recv = sentinel(c, 15);
    let e = c.all_gather(&send, &recv).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                expected: 16,
                got: 15,
                ..
            }
        ),
        "{e}"
    );
    untouched(&recv);
}

#[test]
fn not_a_multiple_of_ranks() {
    let comms = host(2);
    let c = &comms[0];
    let send = c.alloc::<f32>(7).unwrap();
    let recv = sentinel(c, 7);
    let e = c.all_to_all(&send, &recv).unwrap_err();
    assert!(
        matches!(
            e,
            Error::NotMultiple {
                len: 7,
                nranks: 2,
                ..
            }
        ),
        "{e}"
    );
    untouched(&recv);
}

#[test]
fn root_out_of_range() {
    let comms = host(2);
    let c = &comms[1];
    let send = c.alloc::<f32>(4).unwrap();
    let recv = sentinel(c, 4);
    let e = c.broadcast(&send, &recv, 2).unwrap_err();
    assert_eq!(e, Error::RootOutOfRange { root: 2, nranks: 2 });
    let e = c.reduce(&send, &recv, RedOp::Max, 9).unwrap_err();
    assert_eq!(e, Error::RootOutOfRange { root: 9, nranks: 2 });
    untouched(&recv);
}

#[test]
fn peer_out_of_range() {
    let comms = host(3);
    let c = &comms[0];
    let recv = sentinel(c, 4);
    let e = c.recv(&recv, 3).unwrap_err();
    assert_eq!(e, Error::PeerOutOfRange { peer: 3, nranks: 3 });
    let send = c.alloc::<f32>(4).unwrap();
    let e = c.send(&send, 17).unwrap_err();
    assert_eq!(
        e,
        Error::PeerOutOfRange {
            peer: 17,
            nranks: 3
        }
    );
    untouched(&recv);
}

#[test]
fn overlapping_buffers_not_in_place_layout() {
    let comms = host(2);
    let c = &comms[0];
    let buf = sentinel(c, 16);
    let e = c
        .all_reduce(buf.slice(0..8), buf.slice(4..12), RedOp::Sum)
        .unwrap_err();
    assert!(matches!(e, Error::InvalidInPlace { .. }), "{e}");
    // AllGather in place needs send == this rank's block (rank 0: offset 0).
    let e = c.all_gather(buf.slice(4..12), buf.full()).unwrap_err();
    assert!(matches!(e, Error::InvalidInPlace { .. }), "{e}");
    // ReduceScatter in place needs recv == this rank's block of send.
    let e = c
        .reduce_scatter(buf.full(), buf.slice(8..16), RedOp::Sum)
        .unwrap_err();
    assert!(matches!(e, Error::InvalidInPlace { .. }), "{e}");
    untouched(&buf);
}

#[test]
fn op_not_defined_for_dtype() {
    let comms = host(2);
    let c = &comms[0];
    let recv = sentinel(c, 4);
    let send = c.alloc::<f32>(4).unwrap();
    let e = c
        .all_reduce(&send, &recv, RedOp::PreMulSum(f64::NAN))
        .unwrap_err();
    assert!(matches!(e, Error::OpNotDefined { .. }), "{e}");
    untouched(&recv);
    let si = c.alloc::<i32>(4).unwrap();
    let ri = c.alloc::<i32>(4).unwrap();
    let e = c.all_reduce(&si, &ri, RedOp::PreMulSum(0.5)).unwrap_err();
    assert!(matches!(e, Error::OpNotDefined { .. }), "{e}");
    let e = c.all_reduce(&si, &ri, RedOp::PreMulSum(1e12)).unwrap_err();
    assert!(matches!(e, Error::OpNotDefined { .. }), "{e}");
}

/// A scalar in device memory is read by kernels when the call runs, so
/// only the raw entry points (whose contract keeps it alive) of a backend
/// with such kernels take it; the host backend refuses it either way.
#[test]
fn device_scalar_needs_a_raw_call_and_kernels_that_read_it() {
    let comms = host(2);
    let c = &comms[0];
    assert!(!c.reads_device_scalars());
    let recv = sentinel(c, 4);
    let send = c.alloc::<f32>(4).unwrap();
    // Refused before anything reads it, so any address serves.
    let op = RedOp::PreMulSumDevice(0x1000);
    let e = c.all_reduce(&send, &recv, op).unwrap_err();
    assert!(
        matches!(e, Error::InvalidUsage(ref m) if m.contains("raw entry points")),
        "{e}"
    );
    untouched(&recv);
    let (x, mut y) = (vec![1f32; 4], vec![SENTINEL; 4]);
    // SAFETY: host memory of this process, `count` elements each, alive to
    // the end of the call (host calls complete before returning).
    let e = unsafe {
        c.collective_raw(
            oxccl::RawColl {
                kind: oxccl::CollKind::AllReduce,
                send: x.as_ptr().cast(),
                recv: y.as_mut_ptr().cast(),
                count: 4,
                dtype: oxccl::DataType::F32,
                op,
                root: 0,
            },
            oxccl::RawStream::default(),
        )
    }
    .unwrap_err();
    assert!(
        matches!(e, Error::InvalidUsage(ref m) if m.contains("kernels read")),
        "{e}"
    );
    assert!(y.iter().all(|&v| v == SENTINEL), "written: {y:?}");
}

#[test]
fn buffer_of_another_rank_or_communicator() {
    let comms = host(2);
    let other = host(2);
    let send = comms[1].alloc::<f32>(4).unwrap();
    let recv = sentinel(&comms[0], 4);
    let e = comms[0].all_reduce(&send, &recv, RedOp::Sum).unwrap_err();
    assert!(matches!(e, Error::ForeignBuffer { .. }), "{e}");
    let send = other[0].alloc::<f32>(4).unwrap();
    let e = comms[0].all_reduce(&send, &recv, RedOp::Sum).unwrap_err();
    assert!(matches!(e, Error::ForeignBuffer { .. }), "{e}");
    untouched(&recv);
}

#[test]
fn destroyed_communicator() {
    let comms = host(2);
    let c = &comms[0];
    let send = c.alloc::<f32>(4).unwrap();
    let recv = sentinel(c, 4);
    c.destroy();
    let e = c.all_reduce(&send, &recv, RedOp::Sum).unwrap_err();
    assert_eq!(e, Error::Destroyed { rank: 0 });
    assert_eq!(e.nccl_result(), 5);
    assert!(matches!(c.alloc::<f32>(1), Err(Error::Destroyed { .. })));
    untouched(&recv);
}

#[test]
fn failed_communicator() {
    let comms = host(2);
    let send = comms[1].alloc::<f32>(4).unwrap();
    let recv = sentinel(&comms[1], 4);
    comms[0].abort();
    let e = comms[1].all_reduce(&send, &recv, RedOp::Sum).unwrap_err();
    assert!(matches!(e, Error::Failed { rank: 1, .. }), "{e}");
    assert_eq!(e.nccl_result(), 6);
    assert!(comms[1].async_error().is_some());
    untouched(&recv);
}

#[test]
fn no_allowed_algorithm_fails_at_init() {
    // A filter leaving a collective without an algorithm is refused when
    // the communicators are made, not at that collective's first call.
    let e = oxccl::init_all_with(
        2,
        Config {
            backend: BackendKind::Host,
            algo: oxccl::config::parse_algo_filter("NCCL_ALGO", "allgather:tree").unwrap(),
            ..Config::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            Error::NoAlgorithm {
                coll: oxccl::CollKind::AllGather,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("tree"), "{e}");
}

#[test]
fn zero_ranks_is_invalid_usage() {
    assert!(matches!(
        oxccl::init_all_with(0, Config::default()),
        Err(Error::InvalidUsage(_))
    ));
}

/// CUDA refuses buffers it did not allocate; without a driver, asking for
/// it is a typed error (the test then skips its GPU half, and fails under
/// `OXCCL_REQUIRE_GPU=1`).
#[test]
fn cuda_refuses_plain_slices_or_is_absent() {
    let cuda = || Config {
        backend: BackendKind::Cuda,
        ..Config::default()
    };
    if oxccl::backend::cuda::device_or_skip("cuda_refuses_plain_slices_or_is_absent").is_none() {
        let e = oxccl::init_all_with(1, cuda()).unwrap_err();
        assert!(matches!(e, Error::BackendUnavailable(_)), "{e}");
        return;
    }
    let comms = oxccl::init_all_with(1, cuda()).unwrap();
    let send = vec![1.0f32; 4];
    let mut recv = vec![SENTINEL; 4];
    let e = comms[0]
        .all_reduce(&send, &mut recv, RedOp::Sum)
        .unwrap_err();
    assert!(matches!(e, Error::ForeignBuffer { .. }), "{e}");
    assert_eq!(recv, vec![SENTINEL; 4]);
}
