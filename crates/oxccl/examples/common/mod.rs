//! What both training examples do around their loop: read `[RANKS]
//! [STEPS]`, run every rank on its own thread, and compare every rank's
//! final parameters with the single-process run, bit for bit.

use oxccl::{Communicator, Element};

/// `[RANKS] [STEPS]` from the command line, with defaults.
pub fn args(ranks: u32, steps: u32) -> (u32, u32) {
    let mut a = std::env::args().skip(1);
    let mut next = |d: u32| a.next().and_then(|v| v.parse().ok()).unwrap_or(d);
    (next(ranks), next(steps))
}

/// Runs `train` on every rank's thread and checks each result against
/// `want`: bit for bit when `rel_tol` is 0, else within `rel_tol` of each
/// value (where the reduction order rounds differently); exits non-zero
/// on any difference. Returns the backend's name.
pub fn run_and_check<T: Element>(
    comms: &[Communicator],
    train: impl Fn(&Communicator) -> oxccl::Result<Vec<T>> + Sync,
    want: &[T],
    rel_tol: f64,
) -> oxccl::Result<String> {
    let results: Vec<oxccl::Result<Vec<T>>> = std::thread::scope(|s| {
        let train = &train;
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(move || train(c))).collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank panicked"))
            .collect()
    });
    for (r, got) in results.into_iter().enumerate() {
        let got = got?;
        let close = |a: T, b: T| {
            a.bits_eq(b) || (a.to_f64() - b.to_f64()).abs() <= rel_tol * b.to_f64().abs()
        };
        let bad = got
            .iter()
            .zip(want)
            .filter(|(a, b)| !close(**a, **b))
            .count();
        if bad > 0 || got.len() != want.len() {
            eprintln!(
                "rank {r}: {bad} of {} parameters differ from the single-process run",
                want.len()
            );
            std::process::exit(1);
        }
    }
    Ok(comms[0].describe_backend())
}
