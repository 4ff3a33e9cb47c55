//! The call check across processes of one host (host backend): calls that
//! do not match are an error on every rank involved, naming the ranks and
//! what differed, before any data moves; the communicator stays usable; a
//! rank whose process dies while its peers wait in the check is named;
//! the check can be switched off. The test binary re-executes itself (see
//! `common::procs`); `child` runs one rank.

use std::time::Duration;

mod common;
use common::procs::{child_rank, finish, kill_once_all_say, spawn_ranks_live, tagged, GUARD, ROLE};
use common::{assert_names, KIND_SIDES};

use oxccl::{BackendKind, Communicator, Config, Error, RedOp};

fn config() -> Config {
    Config {
        backend: BackendKind::Host,
        deadline: Duration::from_secs(60),
        ..Config::from_env().unwrap()
    }
}

/// Every rank's lines of a role that must exit 0.
fn run(role: &str, n: u32, vars: impl Fn(u32) -> Vec<(&'static str, String)>) -> Vec<Vec<String>> {
    let (kids, rx) = spawn_ranks_live(role, n, vars);
    let (codes, lines) = finish(kids, &rx);
    assert!(
        codes.iter().all(|c| *c == Some(0)),
        "exit codes {codes:?}\n{lines:#?}"
    );
    lines
}

/// Rank `r`'s message for `case` (its line `CASE case MISMATCH msg`), or a
/// panic naming what it printed instead.
fn mismatch(lines: &[Vec<String>], r: usize, case: &str) -> String {
    let tag = format!("CASE {case} ");
    let got = tagged(&lines[r], &tag);
    let l = got
        .first()
        .unwrap_or_else(|| panic!("rank {r} printed no {tag:?}: {:#?}", lines[r]));
    l.strip_prefix(&format!("{tag}MISMATCH "))
        .unwrap_or_else(|| panic!("rank {r}, {case}: expected a mismatch, got {l}"))
        .to_string()
}

/// NCCL's switches that leave only the network between ranks of one host,
/// over loopback, and the check asked for across it.
const OVER_NET: &[(&str, &str)] = &[
    ("NCCL_P2P_DISABLE", "1"),
    ("NCCL_SHM_DISABLE", "1"),
    ("NCCL_SOCKET_IFNAME", "lo"),
    ("OXCCL_CHECK_CALLS", "all"),
];

fn vars(v: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    v.iter().map(|(k, x)| (*k, x.to_string())).collect()
}

#[test]
fn mismatched_calls_across_four_processes_are_errors_on_every_rank() {
    mismatched_calls_are_errors(&[]);
}

/// The same cases between processes that talk over the network, the
/// records mirrored over TCP (`OXCCL_CHECK_CALLS=all`).
#[test]
fn mismatched_calls_over_the_network_are_errors_on_every_rank() {
    mismatched_calls_are_errors(OVER_NET);
}

fn mismatched_calls_are_errors(extra: &[(&'static str, &str)]) {
    let lines = run("cases", 4, |_| vars(extra));
    for (r, l) in lines.iter().enumerate() {
        assert_eq!(tagged(l, "CHECK "), ["CHECK on"], "on by default: {l:#?}");
        // Every case was followed by a correct AllReduce on every rank.
        assert_eq!(tagged(l, "USABLE ").len(), 6, "rank {r}: {l:#?}");
    }
    for r in 0..4 {
        assert_names(
            &mismatch(&lines, r, "kind"),
            &[&format!("rank {r}:"), KIND_SIDES[0], KIND_SIDES[1]],
        );
        assert_names(
            &mismatch(&lines, r, "count"),
            &[
                "ranks 0-1: allreduce(sum) of 4096 x float",
                "ranks 2-3: allreduce(sum) of 2048 x float",
            ],
        );
        assert_names(
            &mismatch(&lines, r, "dtype"),
            &[
                "rank 2: allreduce(sum) of 8 x double",
                "ranks 0-1, 3: allreduce(sum) of 8 x float",
            ],
        );
        assert_names(
            &mismatch(&lines, r, "root"),
            &[
                "rank 1: reduce(sum, root 1) of 8 x uint8",
                "ranks 0, 2-3: reduce(sum, root 0)",
            ],
        );
        // Nothing was written by the failed broadcast/AllReduce.
        assert_eq!(tagged(&lines[r], "UNTOUCHED "), ["UNTOUCHED yes"]);
    }
    // Send 16, receive 32: one error on each side; the pair's next
    // Send/Recv matches as usual.
    let m0 = mismatch(&lines, 0, "p2p");
    assert!(m0.contains("rank 0 sends 16 x int32 to rank 1"), "{m0}");
    assert!(m0.contains("but rank 1 receives 32 x int32"), "{m0}");
    let m1 = mismatch(&lines, 1, "p2p");
    assert!(
        m1.contains("rank 1 receives 32 x int32 from rank 0"),
        "{m1}"
    );
    assert!(m1.contains("but rank 0 sends 16 x int32"), "{m1}");
    assert_eq!(tagged(&lines[1], "NEXT "), ["NEXT 10"], "{:#?}", lines[1]);
    // An unmatched send fails on the sender and poisons the collective
    // its peer entered instead; the next collective is untouched.
    let m = mismatch(&lines, 0, "unmatched");
    assert!(m.contains("rank 0 sends 16 x float to rank 1"), "{m}");
    assert!(m.contains("without the matching recv"), "{m}");
    for r in 1..4 {
        let m = mismatch(&lines, r, "unmatched");
        assert!(
            m.contains("rank 0: no collective: it waits in a send of 16 x float to rank 1"),
            "{m}"
        );
    }
}

/// Groups of 150 Send/Recv each way between two processes: more open
/// messages per pair than the shared board's ring holds (64), so records
/// wait in their process and are written as earlier ones are compared.
/// All arrive right; a count that differs at the second group's message
/// #100 (the pair's #250) fails on both sides, naming it.
#[test]
fn groups_of_many_send_recv_across_processes() {
    groups_of_many_send_recv(&[]);
}

#[test]
fn groups_of_many_send_recv_over_the_network() {
    groups_of_many_send_recv(OVER_NET);
}

fn groups_of_many_send_recv(extra: &[(&'static str, &str)]) {
    let lines = run("many", 2, |_| vars(extra));
    for (r, l) in lines.iter().enumerate() {
        assert_eq!(tagged(l, "MANY "), ["MANY 150 right"], "rank {r}: {l:#?}");
        let m = mismatch(&lines, r, "many");
        assert!(
            m.contains("(its message #250 on that pair)"),
            "rank {r}: {m}"
        );
        assert_eq!(tagged(l, "USABLE ").len(), 1, "rank {r}: {l:#?}");
    }
}

#[test]
fn the_check_off_still_runs_and_ranks_must_all_ask_for_it() {
    // Off everywhere (the environment's switch), then off on rank 1 only:
    // both run unchecked, and correct calls are right.
    for off_on in [vec![0u32, 1, 2], vec![1]] {
        let lines = run("usable", 3, |r| {
            if off_on.contains(&r) {
                vec![("OXCCL_CHECK_CALLS", "0".into())]
            } else {
                Vec::new()
            }
        });
        for l in &lines {
            assert_eq!(tagged(l, "CHECK "), ["CHECK off"], "{l:#?}");
            assert_eq!(tagged(l, "USABLE ").len(), 1, "{l:#?}");
        }
    }
}

#[test]
fn a_process_killed_during_the_check_is_named_by_the_others() {
    killed_during_the_check(&[], "peer rank 2 (pid");
}

#[test]
fn a_process_killed_during_the_check_over_the_network_is_named() {
    killed_during_the_check(OVER_NET, "peer rank 2's connection closed");
}

fn killed_during_the_check(extra: &[(&'static str, &str)], named: &str) {
    let (kids, rx) = spawn_ranks_live("dies", 4, |_| vars(extra));
    // Ranks 0, 1 and 3 enter an AllReduce; rank 2 never does.
    let (codes, lines) = kill_once_all_say(kids, &rx, "READY", 2);
    for r in [0usize, 1, 3] {
        assert_eq!(codes[r], Some(0), "{lines:#?}");
        let errs = tagged(&lines[r], "ERR ");
        let e = errs.first().unwrap_or_else(|| panic!("{lines:#?}"));
        // Named by the check (not by a data wait: nothing moved), and not
        // at the deadline (60 s).
        assert!(e.contains(named), "rank {r}: {e}");
        assert!(e.contains("before any data moved"), "rank {r}: {e}");
        assert!(!e.contains("timeout"), "rank {r}: {e}");
    }
}

#[test]
fn a_rank_that_aborts_is_named_by_peers_waiting_in_the_check() {
    let lines = run("aborts", 3, |_| Vec::new());
    for r in [0usize, 2] {
        let errs = tagged(&lines[r], "ERR ");
        let e = errs.first().unwrap_or_else(|| panic!("{lines:#?}"));
        // Named at once, not at the deadline (60 s).
        assert!(
            e.contains("rank 1") && e.contains("aborted"),
            "rank {r}: {e}"
        );
        assert!(!e.contains("timeout"), "rank {r}: {e}");
    }
}

/// A rank whose process destroys its communicator and lives on: its
/// peers' waits in the check name it at once (its process has not exited,
/// and the deadline is a minute away).
#[test]
fn a_rank_that_destroys_its_communicator_is_named_by_waiting_peers() {
    destroyed_is_named(&[]);
}

#[test]
fn a_rank_that_destroys_its_communicator_over_the_network_is_named() {
    destroyed_is_named(OVER_NET);
}

fn destroyed_is_named(extra: &[(&'static str, &str)]) {
    let lines = run("leaves", 3, |_| vars(extra));
    for r in [0usize, 2] {
        let errs = tagged(&lines[r], "ERR ");
        let e = errs.first().unwrap_or_else(|| panic!("{lines:#?}"));
        assert!(
            e.contains("peer rank 1 destroyed or dropped its communicator"),
            "rank {r}: {e}"
        );
        assert!(!e.contains("timeout"), "rank {r}: {e}");
    }
}

/// A collective refused inside rank 1's group: the other processes'
/// group ends fail at once naming rank 1 and the reason (not at the
/// deadline, a minute away), and the communicator stays usable.
#[test]
fn a_call_refused_in_a_group_is_named_by_the_other_processes() {
    refused_in_a_group(&[]);
}

#[test]
fn a_call_refused_in_a_group_over_the_network_is_named() {
    refused_in_a_group(OVER_NET);
}

fn refused_in_a_group(extra: &[(&'static str, &str)]) {
    let lines = run("refuses", 3, |_| vars(extra));
    let own = tagged(&lines[1], "ERR ");
    assert!(
        own.first()
            .is_some_and(|e| e.contains("receive buffer has 4 elements")),
        "{:#?}",
        lines[1]
    );
    for r in [0usize, 2] {
        let errs = tagged(&lines[r], "ERR ");
        let e = errs.first().unwrap_or_else(|| panic!("{lines:#?}"));
        assert_names(
            e,
            &[
                "peer rank 1 failed call #1",
                "a buffer's length does not fit the count",
            ],
        );
    }
    for (r, l) in lines.iter().enumerate() {
        assert_eq!(tagged(l, "USABLE ").len(), 1, "rank {r}: {l:#?}");
    }
}

// ---- the ranks ----

/// `case`'s outcome on this rank as one line.
fn report<T>(case: &str, r: oxccl::Result<T>) {
    match r {
        Err(e @ Error::Mismatch { .. }) => println!("CASE {case} MISMATCH {e}"),
        Err(e) => println!("CASE {case} OTHER {e}"),
        Ok(_) => println!("CASE {case} OK"),
    }
}

/// A correct AllReduce: the communicator is usable and no stray message
/// from a failed call reaches it.
fn usable(c: &Communicator) {
    let n = c.nranks() as f32;
    let b = c.alloc::<f32>(64).unwrap();
    b.copy_from_slice(&[c.rank() as f32 + 1.0; 64]).unwrap();
    c.all_reduce_in_place(&b, RedOp::Sum).unwrap();
    assert_eq!(b.to_vec().unwrap(), vec![n * (n + 1.0) / 2.0; 64]);
    println!("USABLE rank {}", c.rank());
}

fn cases(c: &Communicator) {
    let me = c.rank();
    let b = c.alloc::<f32>(1024).unwrap();
    b.copy_from_slice(&[me as f32 + 1.0; 1024]).unwrap();
    report(
        "kind",
        if me == 0 {
            c.broadcast_in_place(&b, 0)
        } else {
            c.all_reduce_in_place(&b, RedOp::Sum)
        },
    );
    let same = b.to_vec().unwrap() == vec![me as f32 + 1.0; 1024];
    println!("UNTOUCHED {}", if same { "yes" } else { "no" });
    usable(c);
    let b = c.alloc::<f32>(if me < 2 { 4096 } else { 2048 }).unwrap();
    report("count", c.all_reduce_in_place(&b, RedOp::Sum));
    usable(c);
    report(
        "dtype",
        if me == 2 {
            c.all_reduce_in_place(&c.alloc::<f64>(8).unwrap(), RedOp::Sum)
        } else {
            c.all_reduce_in_place(&c.alloc::<f32>(8).unwrap(), RedOp::Sum)
        },
    );
    usable(c);
    let (s, d) = (c.alloc::<u8>(8).unwrap(), c.alloc::<u8>(8).unwrap());
    report(
        "root",
        c.reduce(&s, &d, RedOp::Sum, if me == 1 { 1 } else { 0 }),
    );
    usable(c);
    let b = c.alloc::<i32>(32).unwrap();
    match me {
        0 => report("p2p", c.send(b.slice(..16), 1)),
        1 => report("p2p", c.recv(&b, 0)),
        _ => {}
    }
    b.copy_from_slice(&[me as i32 + 10; 32]).unwrap();
    match me {
        0 => c.send(&b, 1).unwrap(),
        1 => {
            c.recv(&b, 0).unwrap();
            let v = b.to_vec().unwrap();
            assert!(v.iter().all(|&x| x == v[0]), "{v:?}");
            println!("NEXT {}", v[0]);
        }
        _ => {}
    }
    usable(c);
    let b = c.alloc::<f32>(16).unwrap();
    report(
        "unmatched",
        if me == 0 {
            c.send(&b, 1)
        } else {
            c.all_reduce_in_place(&b, RedOp::Sum)
        },
    );
    usable(c);
}

/// 150 messages each way in one group; then the same with rank 1
/// expecting 5 elements in its message #100 from rank 0.
fn many(c: &Communicator) {
    const N: usize = 150;
    let (me, peer) = (c.rank(), 1 - c.rank());
    let sends: Vec<Vec<u32>> = (0..N as u32).map(|i| vec![me * 1000 + i; 4]).collect();
    for bad in [false, true] {
        let mut recvs: Vec<Vec<u32>> = (0..N)
            .map(|i| vec![0; if bad && me == 1 && i == 100 { 5 } else { 4 }])
            .collect();
        let r = oxccl::group(|g| {
            for (s, r) in sends.iter().zip(recvs.iter_mut()) {
                g.send(c, &s[..], peer)?;
                g.recv(c, &mut r[..], peer)?;
            }
            Ok(())
        });
        if bad {
            report("many", r);
            continue;
        }
        r.unwrap();
        let right = (0..N as u32)
            .filter(|&i| recvs[i as usize] == vec![peer * 1000 + i; 4])
            .count();
        println!("MANY {right} right");
    }
    usable(c);
}

/// A rank process of the tests above (`ROLE` set); in a plain test run it
/// has nothing to do.
#[test]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        println!("child: runs only as a rank process the other tests spawn ({ROLE} unset)");
        return;
    };
    let c = child_rank(config());
    println!(
        "CHECK {}",
        if c.config().check_calls { "on" } else { "off" }
    );
    match role.as_str() {
        "cases" => cases(&c),
        "usable" => usable(&c),
        "many" => many(&c),
        "dies" => {
            println!("READY");
            if c.rank() == 2 {
                // Killed by the parent.
                std::thread::sleep(GUARD);
                return;
            }
            let b = c.alloc::<f32>(8).unwrap();
            match c.all_reduce_in_place(&b, RedOp::Sum) {
                Ok(()) => println!("OK no error"),
                Err(e) => println!("ERR {e}"),
            }
        }
        "aborts" => {
            let b = c.alloc::<f32>(8).unwrap();
            c.exchange(&[]).unwrap();
            if c.rank() == 1 {
                // Most likely while the others wait in the check (if
                // not, their calls fail at entry, naming the abort too).
                std::thread::sleep(Duration::from_millis(300));
                c.abort();
                return;
            }
            match c.all_reduce_in_place(&b, RedOp::Sum) {
                Ok(()) => println!("OK no error"),
                Err(e) => println!("ERR {e}"),
            }
        }
        "refuses" => {
            let send = c.alloc::<f32>(8).unwrap();
            let recv = c.alloc::<f32>(if c.rank() == 1 { 4 } else { 8 }).unwrap();
            let r = oxccl::group(|g| {
                g.all_reduce(&c, &send, &recv, RedOp::Sum)?;
                g.all_reduce(&c, &send, &send, RedOp::Max)
            });
            match r {
                Ok(()) => println!("OK no error"),
                Err(e) => println!("ERR {e}"),
            }
            usable(&c);
        }
        "leaves" => {
            let b = c.alloc::<f32>(8).unwrap();
            c.exchange(&[]).unwrap();
            if c.rank() == 1 {
                c.destroy();
                // Alive well past its peers' calls: only the destroy can
                // name it.
                std::thread::sleep(Duration::from_secs(3));
                return;
            }
            match c.all_reduce_in_place(&b, RedOp::Sum) {
                Ok(()) => println!("OK no error"),
                Err(e) => println!("ERR {e}"),
            }
        }
        r => panic!("unknown role {r}"),
    }
}
