//! NCCL's buffer semantics: buffers a non-root rank's part ignores may be
//! anything (empty, short); they are never touched. Errors name the buffer
//! that is wrong, the in-place offset expected, and a failure once.

mod common;
use common::{host, on_ranks};

use oxccl::{Error, RedOp};

const N: usize = 4;
const COUNT: usize = 300;
const ROOT: u32 = 2;

/// What a non-root passes where it is ignored: empty, or short and
/// recognisable (must stay as it was).
fn ignored_arg(rank: u32) -> Vec<f32> {
    if rank.is_multiple_of(2) {
        Vec::new()
    } else {
        vec![-7.0; 3]
    }
}

#[test]
fn non_roots_may_pass_empty_or_short_ignored_buffers() {
    let comms = host(N as u32);
    let out = on_ranks(&comms, |c| {
        let r = c.rank();
        let root = r == ROOT;
        let mine: Vec<f32> = (0..COUNT).map(|i| (i + 1000 * r as usize) as f32).collect();
        // Reduce: non-roots' receive ignored.
        let mut red = if root {
            vec![0.0; COUNT]
        } else {
            ignored_arg(r)
        };
        c.reduce(&mine, &mut red, RedOp::Sum, ROOT).unwrap();
        // Gather: non-roots' receive ignored.
        let mut gat = if root {
            vec![0.0; N * COUNT]
        } else {
            ignored_arg(r)
        };
        c.gather(&mine, &mut gat, ROOT).unwrap();
        // Scatter: non-roots' send ignored (backend buffers at the root).
        let all: Vec<f32> = (0..N * COUNT).map(|i| i as f32).collect();
        let sc_send = if root { all.clone() } else { ignored_arg(r) };
        let mut sc = vec![0.0; COUNT];
        c.scatter(&sc_send, &mut sc, ROOT).unwrap();
        // Broadcast: non-roots' send ignored; into a Buffer this time.
        let bc = c.alloc::<f32>(COUNT).unwrap();
        let bc_send = if root { mine.clone() } else { ignored_arg(r) };
        c.broadcast(&bc_send, &bc, ROOT).unwrap();
        (red, gat, sc_send, sc, bc.to_vec().unwrap())
    });
    let sum = |i: usize| (0..N).map(|r| (i + 1000 * r) as f32).sum::<f32>();
    for (r, (red, gat, sc_send, sc, bc)) in out.into_iter().enumerate() {
        let r = r as u32;
        if r == ROOT {
            assert_eq!(red, (0..COUNT).map(sum).collect::<Vec<_>>());
            let want: Vec<f32> = (0..N * COUNT)
                .map(|i| (i % COUNT + 1000 * (i / COUNT)) as f32)
                .collect();
            assert_eq!(gat, want);
        } else {
            // Untouched, whatever it was.
            assert_eq!(red, ignored_arg(r));
            assert_eq!(gat, ignored_arg(r));
            assert_eq!(sc_send, ignored_arg(r));
        }
        let base = r as usize * COUNT;
        assert_eq!(
            sc,
            (base..base + COUNT).map(|i| i as f32).collect::<Vec<_>>()
        );
        let want_bc: Vec<f32> = (0..COUNT)
            .map(|i| (i + 1000 * ROOT as usize) as f32)
            .collect();
        assert_eq!(bc, want_bc, "rank {r}");
    }
}

#[test]
fn broadcast_errors_name_the_buffer_that_is_wrong() {
    let comms = host(2);
    // Root: send and receive must agree; the send buffer is named.
    let mut recv = vec![0.0f32; 8];
    let e = comms[0]
        .broadcast(&vec![1.0f32; 5], &mut recv, 0)
        .unwrap_err();
    match &e {
        Error::LengthMismatch {
            what,
            expected,
            got,
        } => {
            assert_eq!((*what, *expected, *got), ("send buffer", 8, 5), "{e}");
        }
        other => panic!("{other}"),
    }
    assert_eq!(recv, vec![0.0; 8], "nothing written");
}

#[test]
fn in_place_layout_errors_give_the_expected_offset() {
    let comms = host(4);
    let c = &comms[1];
    let b = c.alloc::<f32>(16).unwrap();
    // AllGather in place: send must be block 1 (byte 16) of the receive.
    let e = c.all_gather(b.slice(0..4), &b).unwrap_err();
    assert!(matches!(e, Error::InvalidInPlace { .. }), "{e}");
    let m = e.to_string();
    assert!(m.contains("send starts 0 bytes from receive"), "{m}");
    assert!(m.contains("start 16 bytes from it"), "{m}");
}

#[test]
fn a_failure_is_named_once() {
    let comms = host(2);
    let b = comms[1].alloc::<f32>(4).unwrap();
    comms[0].abort();
    let e = comms[1].all_reduce_in_place(&b, RedOp::Sum).unwrap_err();
    let m = e.to_string();
    assert!(matches!(e, Error::Failed { rank: 1, .. }), "{m}");
    assert_eq!(m.matches("failed earlier").count(), 1, "{m}");
    assert_eq!(m.matches("aborted").count(), 1, "{m}");
}
