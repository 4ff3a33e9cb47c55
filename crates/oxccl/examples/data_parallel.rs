//! A data-parallel training loop, as a user of oxccl writes it: rank 0's
//! initial parameters are broadcast, then each step every rank computes a
//! gradient on its own data, the gradients are averaged with AllReduce
//! Avg, and every rank applies the same SGD update. At the end every rank
//! checks that it holds the parameters a single process would have: bit
//! for bit with a power-of-two rank count (Avg scales by 1/n exactly),
//! else within a relative 1e-5 (a dropped rank moves them by 1e-3 or more).
//!
//! `cargo run -p oxccl --example data_parallel [RANKS] [STEPS]` (default 4,
//! 20). Runs on the GPU when there is one, else on the host backend
//! (`OXCCL_BACKEND=host` forces it).

mod common;

use oxccl::{Communicator, RedOp};

const PARAMS: usize = 4096;
const LR: f32 = 0.5;

/// Rank `r`'s gradient at step `s`: small integers over a power of two,
/// so sums and the average are exact in f32 and results can be compared
/// bit for bit.
fn grad(r: u32, s: u32, i: usize) -> f32 {
    ((i as u32 + 3 * r + s) % 8) as f32 / 8.0
}

fn train(c: &Communicator, steps: u32) -> oxccl::Result<Vec<f32>> {
    let params = c.alloc::<f32>(PARAMS)?;
    if c.rank() == 0 {
        params.copy_from_slice(&(0..PARAMS).map(|i| (i % 64) as f32).collect::<Vec<_>>())?;
    }
    c.broadcast_in_place(&params, 0)?;
    let grads = c.alloc::<f32>(PARAMS)?;
    for s in 0..steps {
        let g: Vec<f32> = (0..PARAMS).map(|i| grad(c.rank(), s, i)).collect();
        grads.copy_from_slice(&g)?;
        c.all_reduce_in_place(&grads, RedOp::Avg)?;
        // The update: copy out, step, copy in (reads are ordered after
        // the AllReduce on the rank's stream).
        let (p, g) = (params.to_vec()?, grads.to_vec()?);
        let p: Vec<f32> = p.iter().zip(&g).map(|(p, g)| p - LR * g).collect();
        params.copy_from_slice(&p)?;
    }
    c.synchronize()?;
    params.to_vec()
}

/// What one process computing every rank's gradient would hold.
fn expected(n: u32, steps: u32) -> Vec<f32> {
    (0..PARAMS)
        .map(|i| {
            let mut p = (i % 64) as f32;
            for s in 0..steps {
                let sum: f32 = (0..n).map(|r| grad(r, s, i) * (1.0 / n as f32)).sum();
                p -= LR * sum;
            }
            p
        })
        .collect()
}

fn main() -> oxccl::Result<()> {
    let (n, steps) = common::args(4, 20);
    let comms = oxccl::init_all(n)?;
    let want = expected(n, steps);
    let tol = if n.is_power_of_two() { 0.0 } else { 1e-5 };
    let backend = common::run_and_check(&comms, |c| train(c, steps), &want, tol)?;
    println!(
        "data_parallel: {n} ranks on {backend}, {steps} steps of {PARAMS} parameters: every rank matches the single-process run"
    );
    Ok(())
}
