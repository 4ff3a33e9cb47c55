//! A ZeRO-style loop (optimizer state and updates sharded over ranks): each
//! step the gradients are ReduceScatter-ed (Avg), so each rank holds the
//! averaged gradient of its own shard; it updates its shard of the
//! parameters (with a momentum it alone keeps), and AllGather puts the
//! full parameters back on every rank, in place. In bf16 gradients and
//! parameters, f32 momentum. Every rank then checks it holds what one
//! process would have computed, bit for bit (with a power-of-two rank
//! count the average is exact; other counts are refused).
//!
//! `cargo run -p oxccl --example zero [RANKS] [STEPS]` (default 4, 10). On
//! the GPU when there is one, else the host backend.

mod common;

use oxccl::{bf16, Communicator, RedOp};

const SHARD: usize = 1024;
const LR: f32 = 0.25;
const MOMENTUM: f32 = 0.5;

/// Rank `r`'s gradient of parameter `i` at step `s` (exact in bf16, and so
/// is their average over a power-of-two rank count).
fn grad(r: u32, s: u32, i: usize) -> bf16 {
    bf16::from_f32(((i as u32 + r + 2 * s) % 4) as f32 / 4.0)
}

/// The update of one parameter, in the order every rank applies it.
fn step(p: bf16, g: bf16, m: &mut f32) -> bf16 {
    *m = MOMENTUM * *m + g.to_f32();
    bf16::from_f32(p.to_f32() - LR * *m)
}

fn train(c: &Communicator, steps: u32) -> oxccl::Result<Vec<bf16>> {
    let (n, r) = (c.nranks() as usize, c.rank() as usize);
    let params = c.alloc::<bf16>(n * SHARD)?;
    params.copy_from_slice(&vec![bf16::from_f32(1.0); n * SHARD])?;
    let grads = c.alloc::<bf16>(n * SHARD)?;
    let mut momentum = vec![0.0f32; SHARD];
    let mine = r * SHARD..(r + 1) * SHARD;
    for s in 0..steps {
        let g: Vec<bf16> = (0..n * SHARD).map(|i| grad(c.rank(), s, i)).collect();
        grads.copy_from_slice(&g)?;
        // This rank's shard of the averaged gradient lands in its block.
        c.reduce_scatter_in_place(&grads, RedOp::Avg)?;
        let g = grads.slice(mine.clone()).to_vec()?;
        let p = params.slice(mine.clone()).to_vec()?;
        let p: Vec<bf16> = p
            .iter()
            .zip(&g)
            .zip(&mut momentum)
            .map(|((&p, &g), m)| step(p, g, m))
            .collect();
        params.slice(mine.clone()).copy_from_slice(&p)?;
        c.all_gather_in_place(&params)?;
    }
    c.synchronize()?;
    params.to_vec()
}

fn expected(n: u32, steps: u32) -> Vec<bf16> {
    let len = n as usize * SHARD;
    let mut p = vec![bf16::from_f32(1.0); len];
    let mut m = vec![0.0f32; len];
    for s in 0..steps {
        for i in 0..len {
            let avg = (0..n).map(|r| grad(r, s, i).to_f32()).sum::<f32>() / n as f32;
            p[i] = step(p[i], bf16::from_f32(avg), &mut m[i]);
        }
    }
    p
}

fn main() -> oxccl::Result<()> {
    let (n, steps) = common::args(4, 10);
    if !n.is_power_of_two() {
        eprintln!("zero: use a power-of-two rank count (the exact check needs it)");
        std::process::exit(2);
    }
    let comms = oxccl::init_all(n)?;
    let want = expected(n, steps);
    let backend = common::run_and_check(&comms, |c| train(c, steps), &want, 0.0)?;
    println!(
        "zero: {n} ranks on {backend}, {steps} steps, {} bf16 parameters sharded {SHARD} per rank: every rank matches the single-process run",
        want.len()
    );
    Ok(())
}
