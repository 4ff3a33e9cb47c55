//! Why the typed call on `comm.alloc` buffers and the raw call on plain
//! memory (the C ABI's entry) cost differently on the host backend: an
//! f32 AllReduce (8 bytes unless asked), N rank threads, each path's pick (algorithm,
//! transport) and wall time per call (median over interleaved runs, the
//! slowest rank of each run), with the call check on and off.
//!
//! Paths: `typed-alloc` (`all_reduce` on `comm.alloc` buffers: registered,
//! may take a direct plan), `typed-plain` (`all_reduce` on `Vec`s),
//! `raw-plain` (`collective_raw` on plain host memory), `raw-alloc`
//! (`collective_raw` on the `comm.alloc` buffers' addresses).
//!
//! `host_typed_raw [RANKS] [CALLS_PER_RUN] [RUNS] [COUNT]`, default
//! `2 2000 15 2` (COUNT f32 elements per rank: 2 is 8 bytes).
//! Release mode.

use std::sync::Barrier;
use std::time::Instant;

use oxccl::{
    BackendKind, Choice, CollKind, Communicator, Config, DataType, RawColl, RawStream, RedOp,
};
use oxccl_bench::median;

const PATHS: [&str; 4] = ["typed-alloc", "typed-plain", "raw-plain", "raw-alloc"];

/// One rank's buffers of every path.
struct Bufs {
    send: oxccl::Buffer<f32>,
    recv: oxccl::Buffer<f32>,
    plain_send: Vec<f32>,
    plain_recv: Vec<f32>,
}

/// One call on path `p`.
fn call(c: &Communicator, b: &mut Bufs, p: usize) -> oxccl::Result<()> {
    let count = b.plain_send.len();
    let raw = |send: *const f32, recv: *mut f32| RawColl {
        kind: CollKind::AllReduce,
        send: send.cast(),
        recv: recv.cast(),
        count,
        dtype: DataType::F32,
        op: RedOp::Sum,
        root: 0,
    };
    match p {
        0 => c.all_reduce(&b.send, &b.recv, RedOp::Sum),
        1 => c.all_reduce(&b.plain_send, &mut b.plain_recv, RedOp::Sum),
        // SAFETY: this rank's host memory, 2 f32 each way, alive across
        // the call (the host backend completes it before returning).
        2 => unsafe {
            c.collective_raw(
                raw(b.plain_send.as_ptr(), b.plain_recv.as_mut_ptr()),
                RawStream(0),
            )
        },
        // SAFETY: as above; `comm.alloc` memory of this rank (host
        // backend: host memory at `addr`).
        _ => unsafe {
            c.collective_raw(
                raw(
                    b.send.full().addr() as usize as *const f32,
                    b.recv.full().addr() as usize as *mut f32,
                ),
                RawStream(0),
            )
        },
    }
}

/// Per path: its pick, and each run's ns per call on this rank.
type RankOut = Vec<(Option<Choice>, Vec<f64>)>;

fn rank(
    c: &Communicator,
    bar: &Barrier,
    (calls, runs, count): (u32, usize, usize),
) -> oxccl::Result<RankOut> {
    let mut b = Bufs {
        send: c.alloc::<f32>(count)?,
        recv: c.alloc::<f32>(count)?,
        plain_send: vec![1.0; count],
        plain_recv: vec![0.0; count],
    };
    let mut out: RankOut = Vec::new();
    for p in 0..PATHS.len() {
        for _ in 0..50 {
            call(c, &mut b, p)?;
        }
        out.push((c.last_choice(), Vec::with_capacity(runs)));
    }
    for _ in 0..runs {
        for (p, o) in out.iter_mut().enumerate() {
            bar.wait();
            let t0 = Instant::now();
            for _ in 0..calls {
                call(c, &mut b, p)?;
            }
            o.1.push(t0.elapsed().as_nanos() as f64 / f64::from(calls));
        }
    }
    Ok(out)
}

fn main() -> oxccl::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut next = |d: u64| args.next().and_then(|a| a.parse().ok()).unwrap_or(d);
    let (n, calls, runs) = (next(2) as u32, next(2000) as u32, next(15) as usize);
    let count = next(2) as usize;
    for check in [true, false] {
        let config = Config::builder()
            .backend(BackendKind::Host)
            .check_calls(check)
            .build()?;
        let comms = oxccl::init_all_with(n, config)?;
        let bar = Barrier::new(n as usize);
        let per_rank = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .map(|c| {
                    let bar = &bar;
                    s.spawn(move || rank(c, bar, (calls, runs, count)))
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("rank thread"))
                .collect::<oxccl::Result<Vec<_>>>()
        })?;
        println!(
            "host_typed_raw: {} B f32 allreduce, {n} rank threads, check {}, ns per call, median of {runs} interleaved runs of {calls} (slowest rank)",
            4 * count,
            if check { "on" } else { "off" }
        );
        for (p, name) in PATHS.iter().enumerate() {
            let slowest: Vec<f64> = (0..runs)
                .map(|r| per_rank.iter().map(|o| o[p].1[r]).fold(0.0, f64::max))
                .collect();
            let ch = per_rank[0][p].0;
            let pick = ch.map_or("-".to_string(), |c| {
                format!(
                    "{:?} {:?} {:?} ch {}",
                    c.algo, c.transport, c.proto, c.channels
                )
            });
            println!("  {name:<12} {:>9.0}  {pick}", median(slowest));
        }
    }
    Ok(())
}
