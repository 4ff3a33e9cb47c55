//! The bounded fuzz run CI makes: every target of `oxccl_fuzz::TARGETS`
//! over arbitrary bytes and over mutations of valid messages, asserting no
//! panic (proptest reports the smallest input that panics), no allocation
//! above `ALLOC_CAP` while decoding one input, and no hang (a watchdog).
//!
//! `OXCCL_FUZZ_CASES` sets the cases per target (default 30 000).

use std::sync::mpsc;
use std::time::{Duration, Instant};

use oxccl_fuzz::alloc::{peak_during, Counting};
use oxccl_fuzz::{Target, ALLOC_CAP, TARGETS};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

#[global_allocator]
static ALLOC: Counting = Counting;

/// A target that has not returned after this long is hung: far above any
/// run's time (a few seconds), so only a hang reaches it.
const HANG_LIMIT: Duration = Duration::from_secs(300);

fn cases() -> u32 {
    std::env::var("OXCCL_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30_000)
}

/// One input: arbitrary bytes, or a seed with some bytes overwritten,
/// inserted or cut off (which reaches past magic numbers and lengths).
fn inputs(seeds: Vec<Vec<u8>>) -> BoxedStrategy<Vec<u8>> {
    let random = proptest::collection::vec(any::<u8>(), 0..600);
    if seeds.is_empty() {
        return random.boxed();
    }
    let mutated = (
        proptest::sample::select(seeds),
        proptest::collection::vec((any::<usize>(), any::<u8>(), 0..3u8), 0..8),
        any::<Option<usize>>(),
    )
        .prop_map(|(mut b, edits, cut)| {
            for (at, v, how) in edits {
                let i = at % (b.len() + 1);
                match how {
                    0 if i < b.len() => b[i] = v,
                    1 => b.insert(i, v),
                    _ if i < b.len() => b[i] ^= 1 << (v % 8),
                    _ => b.push(v),
                }
            }
            if let Some(c) = cut {
                b.truncate(c % (b.len() + 1));
            }
            b
        });
    prop_oneof![random, mutated.clone(), mutated].boxed()
}

/// Runs `t` on its seeds, then on `cases` inputs; what went wrong, if
/// anything, else how long it took.
fn exercise(t: Target, cases: u32) -> Result<Duration, String> {
    let start = Instant::now();
    let check = |b: &[u8]| -> Result<(), TestCaseError> {
        let ((), peak) = peak_during(|| (t.run)(b));
        prop_assert!(
            peak <= ALLOC_CAP,
            "{} allocated {peak} bytes for a {}-byte input (cap {ALLOC_CAP})",
            t.name,
            b.len()
        );
        Ok(())
    };
    for s in (t.seeds)() {
        check(&s).map_err(|e| format!("{}: seed {s:?}: {e}", t.name))?;
    }
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&inputs((t.seeds)()), |b| check(&b))
        .map_err(|e| format!("{}: {e}", t.name))?;
    Ok(start.elapsed())
}

/// [`exercise`] on a thread of its own, failing if it outlives `limit`.
fn watched(t: Target, cases: u32, limit: Duration) -> Result<Duration, String> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(format!("fuzz-{}", t.name))
        .spawn(move || {
            let _ = tx.send(exercise(t, cases));
        })
        .expect("a fuzz thread");
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| Err(format!("{} hung: no answer in {limit:?}", t.name)))
}

#[test]
fn every_target_survives_arbitrary_and_mutated_input() {
    let n = cases();
    let mut failed = Vec::new();
    for &t in TARGETS {
        match watched(t, n, HANG_LIMIT) {
            Ok(d) => eprintln!(
                "fuzz target {:<20} {n} cases in {d:.2?}: {}",
                t.name, t.covers
            ),
            Err(e) => failed.push(e),
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn names_are_unique_and_every_target_has_a_libfuzzer_binary() {
    let manifest = include_str!("../../../fuzz/Cargo.toml");
    for (i, t) in TARGETS.iter().enumerate() {
        assert!(
            TARGETS[..i].iter().all(|u| u.name != t.name),
            "{} twice",
            t.name
        );
        assert!(
            manifest.contains(&format!("name = \"{}\"", t.name)),
            "fuzz/Cargo.toml has no [[bin]] for {}",
            t.name
        );
    }
}

// The harness itself can fail: a panicking, an over-allocating and a
// hanging target are each caught.

fn hangs(b: &[u8]) {
    if b.len() > 3 {
        loop {
            std::thread::park();
        }
    }
}

fn panics(b: &[u8]) {
    assert!(b.len() < 40, "a long input");
}

fn hoards(b: &[u8]) {
    if b.first() == Some(&7) {
        std::hint::black_box(vec![0u8; ALLOC_CAP + 1]);
    }
}

fn no_seeds() -> Vec<Vec<u8>> {
    Vec::new()
}

fn bad(name: &'static str, run: fn(&[u8])) -> Target {
    Target {
        name,
        covers: "a planted bug",
        run,
        seeds: no_seeds,
    }
}

#[test]
fn a_panic_and_an_allocation_above_the_cap_are_caught() {
    let e = exercise(bad("panics", panics), 500).unwrap_err();
    assert!(e.contains("a long input"), "{e}");
    let e = exercise(bad("hoards", hoards), 2000).unwrap_err();
    assert!(e.contains("allocated"), "{e}");
    let ((), peak) = peak_during(|| drop(std::hint::black_box(vec![1u8; 1 << 20])));
    assert!(peak >= 1 << 20, "the allocator counted {peak} bytes");
    // Never returns, whatever the limit: the watchdog gives up on it (its
    // thread stays parked until the test process exits).
    let e = watched(bad("hangs", hangs), 100, Duration::from_secs(1)).unwrap_err();
    assert!(e.contains("hung"), "{e}");
}
