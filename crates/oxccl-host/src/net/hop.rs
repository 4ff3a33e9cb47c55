//! One network hop's latency, measured at setup for the cost model: an
//! 8-byte token passed around the ring of ranks through the executors,
//! the proxies and the transport, exactly the path a latency-bound
//! message of a plan takes (a raw socket's ping-pong would miss the
//! threads' wake-ups, which dominate on a loaded host).
//!
//! Every rank runs the same small plan on its own fabric; rank 0 times it
//! and broadcasts the figure, so every rank models the same network.

use std::time::Instant;

use oxccl_bootstrap::Bootstrap;
use oxccl_core::plan::{BufDecl, BufRole, Channel, Dst, Loc, Rank, RankPlan, Src, Step, Xfer};

use crate::error::HostError;
use crate::view::Executes;
use crate::HostBuf;

/// Times the token goes around the ring in the timed call.
const ROUNDS: usize = 10;

/// Elements of the token (two f32: 8 bytes, NCCL's smallest size).
const TOKEN: usize = 2;

/// Rank `me`'s part of `rounds` passes of the token around `n` ranks:
/// rank 0 sends its input and receives the token back; every other rank
/// receives it and sends it on.
fn ring_plan(me: Rank, n: u32, rounds: usize) -> RankPlan {
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    let xfer = |src: Src, dst: Dst| Step::Xfer(Xfer::new(vec![src], vec![dst], TOKEN));
    let local = |at: Loc| Src::Local { at, pre: false };
    let mut steps = Vec::with_capacity(2 * rounds);
    for _ in 0..rounds {
        let send = |at| xfer(local(at), Dst::Send { peer: next });
        let recv = xfer(Src::Recv { peer: prev }, Dst::Local(Loc::output(0)));
        if me == 0 {
            steps.extend([send(Loc::input(0)), recv]);
        } else {
            steps.extend([recv, send(Loc::output(0))]);
        }
    }
    let decl = |role| BufDecl {
        role,
        len: TOKEN,
        must_write: role == BufRole::Output,
    };
    RankPlan {
        rank: me,
        nranks: n,
        bufs: vec![decl(BufRole::Input), decl(BufRole::Output)],
        channels: vec![Channel { steps }],
    }
}

/// Runs `rounds` passes on this rank; the call's wall time in µs.
fn pass(fab: &impl Executes, me: Rank, n: u32, rounds: usize) -> Result<f64, HostError> {
    let plan = ring_plan(me, n, rounds);
    let mut input = [1.0f32; TOKEN];
    let mut output = [0.0f32; TOKEN];
    let bufs = [
        HostBuf {
            ptr: input.as_mut_ptr().cast(),
            bytes: TOKEN * 4,
        },
        HostBuf {
            ptr: output.as_mut_ptr().cast(),
            bytes: TOKEN * 4,
        },
    ];
    let t = Instant::now();
    // SAFETY: both buffers live on this stack frame until `execute`
    // returns, and nothing else touches them meanwhile.
    unsafe { fab.execute_f32(&plan, &bufs) }?;
    Ok(t.elapsed().as_secs_f64() * 1e6)
}

/// The latency of one hop in µs, as rank 0 measured it (one untimed pass
/// first: connections' first messages and the plan's compilation), agreed
/// by every rank through `boot`. Collective: every rank calls it.
pub(crate) fn measure(fab: &impl Executes, boot: &Bootstrap) -> Result<f64, HostError> {
    let (me, n) = (boot.rank(), boot.nranks());
    pass(fab, me, n, 1)?;
    let t = pass(fab, me, n, ROUNDS)?;
    let mine = t / (ROUNDS as f64 * f64::from(n));
    let agreed = boot.broadcast(0, &mine.to_le_bytes())?;
    let bytes: [u8; 8] = agreed.as_slice().try_into().map_err(|_| {
        HostError::Net(format!(
            "rank 0 sent a hop latency of {} bytes, not 8",
            agreed.len()
        ))
    })?;
    Ok(f64::from_le_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_goes_round_every_rank_once_per_round() {
        for n in [2u32, 3, 5] {
            let plans: Vec<RankPlan> = (0..n).map(|r| ring_plan(r, n, 3)).collect();
            for p in &plans {
                assert_eq!(p.channels[0].steps.len(), 6);
            }
            // Each rank sends to the next and receives from the previous.
            for (r, p) in plans.iter().enumerate() {
                let r = r as u32;
                let sends = p.channels[0]
                    .steps
                    .iter()
                    .filter(|s| matches!(s, Step::Xfer(x) if x.dsts == [Dst::Send { peer: (r + 1) % n }]))
                    .count();
                let recvs = p.channels[0]
                    .steps
                    .iter()
                    .filter(|s| matches!(s, Step::Xfer(x) if x.srcs == [Src::Recv { peer: (r + n - 1) % n }]))
                    .count();
                assert_eq!((sends, recvs), (3, 3), "rank {r} of {n}");
            }
        }
    }
}
