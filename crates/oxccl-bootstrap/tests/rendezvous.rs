//! Rendezvous, ring collectives and refusals, with ranks as threads (the
//! bootstrap does not care whether peers share a process; the facade's
//! tests run ranks as processes).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use oxccl_bootstrap::wire::{frame, Kind};
use oxccl_bootstrap::{Bootstrap, BootstrapError, DeviceInfo, UniqueId, WireError};

const LIMIT: Duration = Duration::from_secs(20);

fn join_all(
    id: UniqueId,
    n: u32,
    ranks: &[u32],
    limit: Duration,
) -> Vec<Result<Bootstrap, BootstrapError>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .map(|&r| {
                s.spawn(move || {
                    Bootstrap::init(
                        &id,
                        n,
                        r,
                        &DeviceInfo {
                            device: Some(r as i32),
                            bus_id: format!("0000:{r:02x}:00.0"),
                            ..DeviceInfo::default()
                        },
                        limit,
                    )
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn ok_all(id: UniqueId, n: u32) -> Vec<Bootstrap> {
    let ranks: Vec<u32> = (0..n).collect();
    join_all(id, n, &ranks, LIMIT)
        .into_iter()
        .map(|r| r.unwrap())
        .collect()
}

#[test]
fn ranks_meet_learn_each_other_and_gather_around_the_ring() {
    for n in [2u32, 3, 5] {
        let id = UniqueId::new(LIMIT).unwrap();
        let bs = ok_all(id, n);
        for b in &bs {
            assert_eq!(b.nranks(), n);
            assert!(b.all_local());
            let d = b.descs();
            for (r, x) in d.iter().enumerate() {
                assert_eq!(x.rank, r as u32);
                assert_eq!(x.device, r as i32);
                assert_eq!(x.bus_id, format!("0000:{r:02x}:00.0"));
                assert_eq!(x.pid, std::process::id());
                assert_ne!(x.listen.port(), 0);
            }
        }
        let out: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = bs
                .iter()
                .map(|b| {
                    s.spawn(move || {
                        let mine = vec![b.rank() as u8; 1 + b.rank() as usize * 1000];
                        let g = b.all_gather(&mine).unwrap();
                        let bc = b.broadcast(n - 1, b"from the last").unwrap();
                        b.barrier().unwrap();
                        (g, bc)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (g, bc) in out {
            for (r, rec) in g.iter().enumerate() {
                assert_eq!(rec, &vec![r as u8; 1 + r * 1000], "n={n} record {r}");
            }
            assert_eq!(bc, b"from the last");
        }
    }
}

#[test]
fn one_rank_contacts_no_root_and_ignores_its_id() {
    let garbage = UniqueId::from_raw([0xAB; 128]);
    let t = Instant::now();
    let b = Bootstrap::init(&garbage, 1, 0, &DeviceInfo::default(), LIMIT).unwrap();
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(b.all_gather(b"x").unwrap(), vec![b"x".to_vec()]);
    b.barrier().unwrap();
    // Two ranks do read the id.
    assert!(matches!(
        Bootstrap::init(&garbage, 2, 0, &DeviceInfo::default(), LIMIT),
        Err(BootstrapError::InvalidId(_))
    ));
}

#[test]
fn bad_arguments_are_refused_before_any_connection() {
    let id = UniqueId::new(Duration::from_secs(2)).unwrap();
    for (n, r) in [(0, 0), (2, 2), (3, 7)] {
        assert!(
            matches!(
                Bootstrap::init(&id, n, r, &DeviceInfo::default(), LIMIT),
                Err(BootstrapError::InvalidArgument(_))
            ),
            "{n} {r}"
        );
    }
}

fn rejected(r: &Result<Bootstrap, BootstrapError>, needle: &str) -> bool {
    matches!(r, Err(BootstrapError::Rejected { reason, .. }) if reason.contains(needle))
}

#[test]
fn duplicate_rank_fails_everyone_promptly() {
    let id = UniqueId::new(LIMIT).unwrap();
    let t = Instant::now();
    let res = join_all(id, 3, &[0, 1, 1], LIMIT);
    assert!(t.elapsed() < LIMIT, "took {:?}", t.elapsed());
    for r in &res {
        assert!(rejected(r, "duplicate rank 1"), "{r:?}");
    }
}

#[test]
fn wrong_rank_count_fails_everyone() {
    let id = UniqueId::new(LIMIT).unwrap();
    let res = std::thread::scope(|s| {
        let a = s.spawn(move || Bootstrap::init(&id, 2, 0, &DeviceInfo::default(), LIMIT));
        let b = s.spawn(move || Bootstrap::init(&id, 3, 1, &DeviceInfo::default(), LIMIT));
        [a.join().unwrap(), b.join().unwrap()]
    });
    for r in &res {
        assert!(rejected(r, "wrong rank count"), "{r:?}");
    }
}

#[test]
fn a_rank_with_another_magic_is_told_so() {
    let id = UniqueId::new(LIMIT).unwrap();
    let mut b = id.to_bytes();
    b[0] ^= 0xff;
    let stale = UniqueId::from_bytes(&b).unwrap();
    let r = Bootstrap::init(&stale, 2, 1, &DeviceInfo::default(), LIMIT);
    assert!(
        matches!(
            r,
            Err(BootstrapError::Wire {
                err: WireError::WrongMagic { .. },
                ..
            })
        ),
        "{r:?}"
    );
}

/// Rank 0 of `n` joins `id` alone: it must time out promptly, naming
/// itself.
fn times_out_alone(id: &UniqueId, n: u32) {
    let t = Instant::now();
    let r = Bootstrap::init(id, n, 0, &DeviceInfo::default(), Duration::from_millis(600));
    assert!(
        matches!(r, Err(BootstrapError::Timeout { rank: 0, .. })),
        "{r:?}"
    );
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[test]
fn missing_ranks_time_out_naming_what_was_awaited() {
    times_out_alone(&UniqueId::new(Duration::from_secs(30)).unwrap(), 3);
}

/// A fake root (it does not hold the id's key) that sends `reply` to the
/// first connection and closes (a reply of two whole frames, challenge
/// and answer, once the hello came, so the answer is read before the
/// close).
fn fake_root(reply: Vec<u8>) -> UniqueId {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = l.accept() {
            let _ = s.write_all(&reply);
            if reply.len() >= 96 {
                let mut buf = [0u8; 4096];
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let _ = s.read(&mut buf);
            }
        }
    });
    // Rank 1 of an NCCL_COMM_ID-style id: it does not start a root itself.
    UniqueId::from_comm_id_with(&addr.to_string(), Some("the job's secret")).unwrap()
}

#[test]
fn truncated_oversized_and_garbage_replies_are_typed_errors() {
    let magic = oxccl_bootstrap::COMM_ID_MAGIC;
    let table = frame(magic, Kind::Table, &[1, 2, 3, 4, 5, 6, 7, 8]);
    type Check = fn(&WireError) -> bool;
    let cases: Vec<(Vec<u8>, Check)> = vec![
        (table[..10].to_vec(), |e| {
            matches!(
                e,
                WireError::Truncated {
                    what: "frame header",
                    ..
                }
            )
        }),
        (table[..20].to_vec(), |e| {
            matches!(
                e,
                WireError::Truncated {
                    what: "frame payload",
                    ..
                }
            )
        }),
        (
            {
                let mut h = frame(magic, Kind::Table, &[]);
                h[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
                h
            },
            |e| matches!(e, WireError::Oversized { .. }),
        ),
        (b"HTTP/1.1 400 Bad Request\r\n\r\n".to_vec(), |e| {
            matches!(e, WireError::WrongMagic { .. })
        }),
        // A table before any challenge, or in place of the ack: a root
        // that has not proved the key feeds no table.
        (frame(magic, Kind::Table, &[9; 8]), |e| {
            matches!(e, WireError::BadKind { .. })
        }),
        (
            [
                frame(magic, Kind::Challenge, &[7; 32]),
                frame(magic, Kind::Table, &[9; 8]),
            ]
            .concat(),
            |e| {
                matches!(
                    e,
                    WireError::BadKind {
                        expected: "ack",
                        ..
                    }
                )
            },
        ),
        // A challenge of the wrong size, and an ack that proves nothing.
        (frame(magic, Kind::Challenge, &[7; 8]), |e| {
            matches!(
                e,
                WireError::Malformed {
                    what: "challenge",
                    ..
                }
            )
        }),
        (
            [
                frame(magic, Kind::Challenge, &[7; 32]),
                frame(magic, Kind::Ack, &[0; 32]),
            ]
            .concat(),
            |e| matches!(e, WireError::BadProof { .. }),
        ),
        (frame(magic, Kind::Peer, &[]), |e| {
            matches!(e, WireError::BadKind { .. })
        }),
    ];
    for (reply, want) in cases {
        let id = fake_root(reply.clone());
        let r = Bootstrap::init(&id, 2, 1, &DeviceInfo::default(), Duration::from_secs(10));
        match &r {
            Err(BootstrapError::Wire { err, .. }) if want(err) => {}
            other => panic!("reply {reply:?}: {other:?}"),
        }
    }
}

/// Deterministic pseudo-random bytes (xorshift), so failures replay.
fn noise(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn random_bytes_at_a_listening_root_do_not_stop_the_rendezvous() {
    let id = UniqueId::new(LIMIT).unwrap();
    let root = id.info().unwrap().root;
    let magic = id.info().unwrap().magic;
    // Strangers first: garbage, silence, a right magic with garbage after
    // it, a header announcing 4 GiB, a truncated hello.
    let mut strangers = Vec::new();
    for seed in 0..24u64 {
        let mut s = TcpStream::connect(root).unwrap();
        let mut bytes = noise(seed, (seed as usize * 37) % 300);
        match seed % 4 {
            0 => {}
            1 => {
                bytes = frame(magic, Kind::Hello, &bytes);
            }
            2 => {
                bytes = frame(magic, Kind::Hello, &[]);
                bytes[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
            }
            _ => {
                bytes = frame(magic, Kind::Hello, &noise(seed, 64));
                bytes.truncate(30);
            }
        }
        let _ = s.write_all(&bytes);
        strangers.push(s); // kept open: silence after the bytes
    }
    let bs = ok_all(id, 3);
    assert_eq!(bs[2].descs().len(), 3);
    drop(strangers);
}

/// A subset rendezvous among `members` of `bs` (those ranks' threads only).
fn subset(
    bs: &[Bootstrap],
    members: &[u32],
    limit: Duration,
) -> Vec<Result<Bootstrap, BootstrapError>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = members
            .iter()
            .enumerate()
            .map(|(i, &r)| {
                let b = &bs[r as usize];
                s.spawn(move || {
                    let id = b.subset_id(members)?;
                    Bootstrap::init(
                        &id,
                        members.len() as u32,
                        i as u32,
                        &DeviceInfo::default(),
                        limit,
                    )
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn a_subset_meets_without_the_others() {
    let id = UniqueId::new(LIMIT).unwrap();
    let mut bs = ok_all(id, 4);
    // Rank 0 (the usual leader) is gone: its bootstrap, listener and all.
    let gone = bs.remove(0);
    drop(gone);
    let rest: Vec<Bootstrap> = std::iter::once(ok_all(UniqueId::new(LIMIT).unwrap(), 1).remove(0))
        .chain(bs)
        .collect();
    // `rest[r]` is rank r of the 4 again, rank 0 a stand-in never used.
    let subs: Vec<Bootstrap> = subset(&rest, &[1, 3], LIMIT)
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(subs.len(), 2);
    let got: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = subs
            .iter()
            .map(|b| s.spawn(move || b.all_gather(&[b.rank() as u8 + 10]).unwrap()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for g in got {
        assert_eq!(g, vec![vec![10], vec![11]]);
    }
    // A second subset of the same ranks is a new rendezvous (another magic).
    let again = subset(&rest, &[1, 2, 3], LIMIT);
    assert!(again.iter().all(|r| r.is_ok()), "{again:?}");
    assert_ne!(again[0].as_ref().unwrap().magic(), subs[0].magic());
}

#[test]
fn subset_lists_are_checked_and_a_missing_member_times_out() {
    let id = UniqueId::new(LIMIT).unwrap();
    let bs = ok_all(id, 3);
    for bad in [&[0u32, 0, 1][..], &[2, 1], &[0, 3], &[1, 2]] {
        assert!(
            matches!(
                bs[0].subset_id(bad),
                Err(BootstrapError::InvalidArgument(_))
            ),
            "{bad:?}"
        );
    }
    let r = subset(&bs, &[0], Duration::from_millis(10));
    assert!(r[0].is_ok(), "a 1-rank subset contacts no one");
    // Rank 1 never joins the subset {0, 1}: rank 0 fails at the deadline.
    times_out_alone(&bs[0].subset_id(&[0, 1]).unwrap(), 2);
}

/// Every rank of `n` joins through `ids` (threads of this process).
fn join_scalable(
    ids: &[UniqueId],
    n: u32,
    limit: Duration,
) -> Vec<Result<Bootstrap, BootstrapError>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let dev = DeviceInfo {
                    device: Some(r as i32),
                    bus_id: String::new(),
                    ..DeviceInfo::default()
                };
                s.spawn(move || Bootstrap::init_scalable(ids, n, r, &dev, limit))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn several_roots_make_one_bootstrap() {
    // 4 ranks on 2 roots, 5 on 2 (blocks of 3 and 2), 5 on 3 (a block of
    // one rank), 3 on 3 (every block alone).
    for (n, k) in [(4u32, 2usize), (5, 2), (5, 3), (3, 3)] {
        let ids: Vec<UniqueId> = (0..k).map(|_| UniqueId::new(LIMIT).unwrap()).collect();
        let bs: Vec<Bootstrap> = join_scalable(&ids, n, LIMIT)
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        let got: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = bs
                .iter()
                .map(|b| s.spawn(move || b.all_gather(&[b.rank() as u8 * 3]).unwrap()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (b, g) in bs.iter().zip(got) {
            assert_eq!((b.nranks(), b.descs().len()), (n, n as usize));
            for (r, d) in b.descs().iter().enumerate() {
                assert_eq!((d.rank, d.device), (r as u32, r as i32), "n={n} k={k}");
            }
            let want: Vec<Vec<u8>> = (0..n).map(|r| vec![r as u8 * 3]).collect();
            assert_eq!(g, want, "n={n} k={k}");
        }
    }
}

#[test]
fn each_block_meets_at_its_own_root() {
    // The second id names a port nobody serves: ranks 2 and 3 (its block)
    // cannot meet, so nobody completes; with only the first id used they
    // would all have met.
    let dead = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        UniqueId::from_comm_id(&format!("127.0.0.1:{port}")).unwrap()
    };
    let mut b = dead.to_bytes();
    b[9] = 0; // a root that should already run, not one rank 0 starts
    b[0] ^= 0x55;
    let dead = UniqueId::from_bytes(&b).unwrap();
    let ids = [UniqueId::new(LIMIT).unwrap(), dead];
    let t = Instant::now();
    let r = join_scalable(&ids, 4, Duration::from_millis(800));
    assert!(r.iter().all(|x| x.is_err()), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(10));
}

#[test]
fn bad_id_lists_are_refused() {
    let a = UniqueId::new(LIMIT).unwrap();
    let b = UniqueId::new(LIMIT).unwrap();
    let dev = DeviceInfo::default();
    for (ids, n) in [(&[][..], 2u32), (&[a, b, a][..], 4), (&[a, b, a][..], 2)] {
        let r = Bootstrap::init_scalable(ids, n, 0, &dev, LIMIT);
        assert!(
            matches!(r, Err(BootstrapError::InvalidArgument(_))),
            "{r:?}"
        );
    }
}
