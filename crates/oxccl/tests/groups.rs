//! Grouped Send/Recv, collectives in groups, and one thread driving every
//! communicator of a clique.

use oxccl::RedOp;

mod common;
use common::{host, on_ranks as each_rank};

#[test]
fn ring_exchange() {
    let comms = host(5);
    each_rank(&comms, |c| {
        let (r, n) = (c.rank(), c.nranks());
        // Large enough to need many FIFO pieces in both directions.
        let send: Vec<u32> = (0..300_000).map(|i| i * 10 + r).collect();
        let mut recv = vec![0u32; send.len()];
        oxccl::group(|g| {
            g.send(c, &send, (r + 1) % n)?;
            g.recv(c, &mut recv, (r + n - 1) % n)
        })
        .unwrap();
        let from = (r + n - 1) % n;
        let want: Vec<u32> = (0..300_000).map(|i| i * 10 + from).collect();
        assert_eq!(recv, want, "rank {r} from {from}");
    });
}

/// Send/Recv on `comm.alloc` memory: messages of 256 KiB and more are
/// read directly from the sender's buffer, smaller ones and those whose
/// send buffer is the caller's host memory go through FIFOs, all in one
/// group: a ring both ways (one direct message each way on every pair of
/// neighbours, plus a small one), and a large message to the next rank
/// from a plain host slice on odd ranks.
#[test]
fn direct_send_recv_on_alloc_memory() {
    let comms = host(5);
    each_rank(&comms, |c| {
        let (r, n) = (c.rank(), c.nranks());
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        let big = 300_000usize;
        let val =
            |from: u32, tag: u32, i: usize| from * 1_000_000 + tag * 100_000 + i as u32 % 99_991;
        let fwd = c.alloc::<u32>(big).unwrap();
        let back = c.alloc::<u32>(big).unwrap();
        let small = c.alloc::<u32>(100).unwrap();
        fwd.copy_from_slice(&(0..big).map(|i| val(r, 1, i)).collect::<Vec<_>>())
            .unwrap();
        back.copy_from_slice(&(0..big).map(|i| val(r, 2, i)).collect::<Vec<_>>())
            .unwrap();
        small
            .copy_from_slice(&(0..100).map(|i| val(r, 3, i)).collect::<Vec<_>>())
            .unwrap();
        let host_src: Vec<u32> = (0..big).map(|i| val(r, 4, i)).collect();
        let got_fwd = c.alloc::<u32>(big).unwrap();
        let got_back = c.alloc::<u32>(big).unwrap();
        let got_small = c.alloc::<u32>(100).unwrap();
        let mut got_host = vec![0u32; big];
        oxccl::group(|g| {
            g.recv(c, &got_back, next)?;
            g.send(c, &fwd, next)?;
            g.send(c, &small, next)?;
            g.send(c, &back, prev)?;
            g.recv(c, &got_fwd, prev)?;
            g.recv(c, &got_small, prev)?;
            if r % 2 == 1 && next != 0 {
                g.send(c, &host_src, next)?;
            }
            if prev % 2 == 1 && r != 0 {
                g.recv(c, &mut got_host, prev)?;
            }
            Ok(())
        })
        .unwrap();
        let want = |from, tag, len| (0..len).map(|i| val(from, tag, i)).collect::<Vec<_>>();
        assert_eq!(
            got_fwd.to_vec().unwrap(),
            want(prev, 1, big),
            "rank {r} from {prev}"
        );
        assert_eq!(
            got_back.to_vec().unwrap(),
            want(next, 2, big),
            "rank {r} from {next}"
        );
        assert_eq!(got_small.to_vec().unwrap(), want(prev, 3, 100), "rank {r}");
        if prev % 2 == 1 && r != 0 {
            assert_eq!(got_host, want(prev, 4, big), "rank {r} host message");
        }
    });
}

/// A direct message whose send is the sender's third operation, read by
/// a receiver whose plan has a single buffer: the receiver addresses the
/// sender's buffer by the sender's numbering, not its own.
#[test]
fn direct_send_recv_with_different_lists() {
    let comms = host(2);
    each_rank(&comms, |c| {
        let big = 100_000usize;
        let val = |i: usize| i as u32 * 3 + 1;
        if c.rank() == 0 {
            let me = c.alloc::<u32>(10).unwrap();
            let back = c.alloc::<u32>(10).unwrap();
            let data = c.alloc::<u32>(big).unwrap();
            me.copy_from_slice(&[7; 10]).unwrap();
            data.copy_from_slice(&(0..big).map(val).collect::<Vec<_>>())
                .unwrap();
            oxccl::group(|g| {
                g.send(c, &me, 0)?;
                g.recv(c, &back, 0)?;
                g.send(c, &data, 1)
            })
            .unwrap();
            assert_eq!(back.to_vec().unwrap(), vec![7; 10]);
        } else {
            let got = c.alloc::<u32>(big).unwrap();
            oxccl::group(|g| g.recv(c, &got, 0)).unwrap();
            assert_eq!(got.to_vec().unwrap(), (0..big).map(val).collect::<Vec<_>>());
        }
    });
}

#[test]
fn all_to_all_by_send_recv() {
    let comms = host(4);
    each_rank(&comms, |c| {
        let (r, n) = (c.rank() as usize, c.nranks() as usize);
        let count = 1000;
        let send: Vec<Vec<i64>> = (0..n)
            .map(|p| {
                (0..count)
                    .map(|i| (r * 1_000_000 + p * 1000 + i) as i64)
                    .collect()
            })
            .collect();
        let mut recv: Vec<Vec<i64>> = vec![vec![0; count]; n];
        oxccl::group(|g| {
            for (p, s) in send.iter().enumerate() {
                g.send(c, s, p as u32)?;
            }
            for (p, d) in recv.iter_mut().enumerate() {
                g.recv(c, d, p as u32)?;
            }
            Ok(())
        })
        .unwrap();
        // Every element of every block: what peer p sent to this rank.
        for (p, d) in recv.iter().enumerate() {
            let want: Vec<i64> = (0..count)
                .map(|i| (p * 1_000_000 + r * 1000 + i) as i64)
                .collect();
            assert_eq!(d, &want, "rank {r} from {p}");
        }
    });
}

#[test]
fn one_thread_drives_every_communicator() {
    let comms = host(4);
    let n = comms.len();
    // Values vary by element and rank, so a swapped or shifted block shows.
    let sends: Vec<Vec<f32>> = (0..n)
        .map(|r| (0..4096).map(|i| ((r + 1) * (i % 5 + 1)) as f32).collect())
        .collect();
    let mut recvs: Vec<Vec<f32>> = vec![vec![0.0; 4096]; n];
    let mut ring: Vec<Vec<u8>> = vec![vec![0; 100]; n];
    let ring_src: Vec<Vec<u8>> = (0..n)
        .map(|r| (0..100).map(|i| (r * 100 + i) as u8).collect())
        .collect();
    oxccl::group(|g| {
        for ((c, s), d) in comms.iter().zip(&sends).zip(recvs.iter_mut()) {
            g.all_reduce(c, s, d, RedOp::Sum)?;
        }
        for ((c, s), d) in comms.iter().zip(&ring_src).zip(ring.iter_mut()) {
            let r = c.rank();
            g.send(c, s, (r + 1) % n as u32)?;
            g.recv(c, d, (r + n as u32 - 1) % n as u32)?;
        }
        Ok(())
    })
    .unwrap();
    // Sum over ranks of (r + 1)(i % 5 + 1) = 10 (i % 5 + 1), exact in f32.
    let want: Vec<f32> = (0..4096).map(|i| (10 * (i % 5 + 1)) as f32).collect();
    for (r, d) in recvs.iter().enumerate() {
        assert_eq!(d, &want, "rank {r}");
    }
    for (r, d) in ring.iter().enumerate() {
        assert_eq!(d, &ring_src[(r + n - 1) % n], "rank {r}");
    }
}

#[test]
fn collectives_grouped_on_each_rank() {
    let comms = host(3);
    each_rank(&comms, |c| {
        let a = c.alloc::<f64>(64).unwrap();
        let b = c.alloc::<f64>(64).unwrap();
        let g_out = c.alloc::<f64>(3 * 64).unwrap();
        a.copy_from_slice(&[c.rank() as f64; 64]).unwrap();
        oxccl::group(|g| {
            g.all_reduce(c, &a, &b, RedOp::Max)?;
            g.collective(c, oxccl::CollKind::AllGather, &a, &g_out, RedOp::Sum, 0)
        })
        .unwrap();
        assert_eq!(b.to_vec().unwrap(), vec![2.0; 64]);
        // Block q of the gather holds rank q's 64 values, every element.
        let want: Vec<f64> = (0..3).flat_map(|q| vec![q as f64; 64]).collect();
        assert_eq!(g_out.to_vec().unwrap(), want, "rank {}", c.rank());
    });
}

/// 8 ranks on a 2-core machine: an AllReduce sweep over sizes completes
/// (the waits park rather than spin forever) and every result is exact.
#[test]
fn eight_ranks_all_reduce_sweep_completes() {
    let comms = host(8);
    each_rank(&comms, |c| {
        let mut len = 1;
        while len <= 1 << 20 {
            let mut v = vec![c.rank() as i32 + 1; len];
            for _ in 0..3 {
                c.all_reduce_in_place(&mut v, RedOp::Sum).unwrap();
                c.all_reduce_in_place(&mut v, RedOp::Min).unwrap();
            }
            assert!(v.iter().all(|&x| x == 36 * 8 * 8), "len {len}");
            len *= 8;
        }
    });
}
