//! The one-step LL AllReduce ("LL one-shot", `Algo::OneShotLl`) for ranks
//! as threads: the protocol the CUDA kernel runs (`kernels/oxccl_ll1.cuh`),
//! on host memory, so CI exercises its logic.
//!
//! Each rank owns LL slots: 2 parities × n senders × `cap` bytes of
//! payload, as 8-byte LL words of 4 data bytes and a 4-byte flag, stored
//! and loaded as one 64-bit atomic (so data and flag land together, and a
//! reader polling the word needs no fence). Each rank keeps an epoch, the
//! number of one-shot calls it has finished; call `e` uses flag
//! `e mod (2^32 − 1) + 1` (never 0: zeroed memory is never data) and
//! parity `e & 1`. A call: rank r stores its input as words tagged with
//! the flag into slot `[parity][r]` of every rank (itself included), then
//! reads slot `[parity][q]` for q = 0..n−1, waiting until each word's flag
//! is the call's, and reduces the n contributions in rank order, so every
//! rank computes the same bits as the sequential reference. Then it
//! advances its epoch.
//!
//! No exit barrier: rank r overwrites parity p of a peer only at call
//! e + 2, after finishing call e + 1, which needed every peer's e + 1
//! words; a peer stores those only after finishing its reads of call e
//! (its calls run in order). So slot `[p][r]` is never overwritten while
//! a reader still needs it. Stores are releases and loads acquires, so
//! "after" holds in the memory model too (a reader's loads of call e
//! happen before its e + 1 stores, which happen before the writer's
//! e + 2 stores).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use oxccl_core::plan::Rank;
use oxccl_core::{with_dtype, DataType, LoweredOp};
use oxccl_core::{Awaited, FaultCause, WaitFault};

use crate::error::HostError;
use crate::fabric::HostFabric;
use crate::kernel::{self, In, TypedOp};
use crate::HostBuf;

/// Data bytes of one LL word.
const WORD_DATA: usize = 4;
/// Polls between checks of the fabric's failure and the deadline.
const CHECK_EVERY: u32 = 1024;
/// Polls after which a wait yields its core between polls (ranks may
/// outnumber cores).
const SPIN_FAST: u32 = 64;

/// The flag of a rank's call `epoch` (never 0).
pub fn ll_flag(epoch: u64) -> u32 {
    (epoch % 0xFFFF_FFFF) as u32 + 1
}

/// The LL slots and epochs of a clique's ranks as threads.
pub struct OneShotLl {
    nranks: u32,
    /// Largest payload per rank, bytes.
    cap: usize,
    /// Each rank's slots, made at the first call (any rank's: peers write
    /// into every rank's).
    slots: OnceLock<Box<[Box<[AtomicU64]>]>>,
    /// Each rank's finished calls; only the rank itself touches its own.
    epochs: Box<[AtomicU64]>,
    /// Tests: run by a rank between its stores and its loads (rank,
    /// epoch), so a test can hold a reader back while peers run ahead.
    #[cfg(test)]
    between: Option<Box<dyn Fn(Rank, u64) + Send + Sync>>,
}

impl std::fmt::Debug for OneShotLl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OneShotLl")
            .field("nranks", &self.nranks)
            .field("cap", &self.cap)
            .finish_non_exhaustive()
    }
}

impl OneShotLl {
    /// The path for `nranks` rank threads serving calls of at most `cap`
    /// bytes per rank (nothing is allocated until the first call).
    pub fn new(nranks: u32, cap: usize) -> OneShotLl {
        OneShotLl {
            nranks,
            cap,
            slots: OnceLock::new(),
            epochs: (0..nranks).map(|_| AtomicU64::new(0)).collect(),
            #[cfg(test)]
            between: None,
        }
    }

    /// Largest payload per rank, in bytes, a call may carry.
    pub fn cap_bytes(&self) -> usize {
        self.cap
    }

    /// Words per sender and parity.
    fn words(&self) -> usize {
        self.cap.div_ceil(WORD_DATA)
    }

    fn slots(&self) -> &[Box<[AtomicU64]>] {
        self.slots.get_or_init(|| {
            let per_rank = 2 * self.nranks as usize * self.words();
            (0..self.nranks)
                .map(|_| (0..per_rank).map(|_| AtomicU64::new(0)).collect())
                .collect()
        })
    }

    /// Where sender `from`'s words of `parity` start in a rank's slots.
    fn base(&self, parity: usize, from: Rank) -> usize {
        (parity * self.nranks as usize + from as usize) * self.words()
    }

    /// One rank's AllReduce of `count` elements of `dtype` from `input`
    /// into `output` (which may be the same memory) under `op`. Every
    /// rank of the clique must make the same sequence of these calls.
    ///
    /// # Safety
    /// `input` must be valid for reads and `output` for writes of
    /// `count` elements of `dtype`, aligned for it, and nothing else may
    /// write them during the call.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce(
        &self,
        fabric: &HostFabric,
        rank: Rank,
        input: HostBuf,
        output: HostBuf,
        count: usize,
        dtype: DataType,
        op: &LoweredOp,
    ) -> Result<(), HostError> {
        let bytes = count * dtype.size();
        if rank >= self.nranks || bytes > self.cap || input.bytes < bytes || output.bytes < bytes {
            return Err(HostError::InvalidPlan(format!(
                "one-step LL AllReduce of {bytes} bytes on rank {rank}: at most {} bytes on ranks \
                 0..{}, buffers of {} and {} bytes",
                self.cap, self.nranks, input.bytes, output.bytes
            )));
        }
        if let Some(e) = fabric.stop_error(rank) {
            return Err(e);
        }
        let epoch = self.epochs[rank as usize].load(Ordering::Relaxed);
        let flag = ll_flag(epoch);
        let parity = (epoch & 1) as usize;
        let nwords = bytes.div_ceil(WORD_DATA);
        // A PreMulSum's factor is this rank's own (ranks may pass different
        // ones), so the sender scales its contribution before storing it.
        let scaled: Vec<u64>;
        let data = if op.pre_scale.is_some() {
            let mut buf = vec![0u64; bytes.div_ceil(8)];
            with_dtype!(dtype, T => {
                let typed = TypedOp::<T>::new(op);
                let src = [In { ptr: input.ptr.cast_const().cast::<T>(), pre: true }];
                // SAFETY: `input` holds `count` readable elements (caller);
                // `scaled` holds at least `bytes` writable, 8-byte aligned.
                unsafe {
                    kernel::transfer::<T>(
                        &src,
                        &[buf.as_mut_ptr().cast::<T>()],
                        count,
                        false,
                        &typed,
                        &mut Vec::new(),
                    )
                };
            });
            scaled = buf;
            // SAFETY: `scaled` holds at least `bytes` initialised bytes.
            unsafe { std::slice::from_raw_parts(scaled.as_ptr().cast::<u8>(), bytes) }
        } else {
            // SAFETY: `input` holds `bytes` readable bytes (caller).
            unsafe { std::slice::from_raw_parts(input.ptr.cast_const(), bytes) }
        };
        self.put(rank, parity, flag, data);
        #[cfg(test)]
        if let Some(f) = &self.between {
            f(rank, epoch);
        }
        // Every contribution, in rank order, as 8-byte-aligned memory the
        // element loops can read.
        let per_src = nwords.div_ceil(2);
        let mut staged = vec![0u64; per_src * self.nranks as usize];
        for q in 0..self.nranks {
            let words = &mut staged[q as usize * per_src..][..per_src];
            self.get(fabric, rank, q, parity, flag, nwords, words)?;
        }
        with_dtype!(dtype, T => {
            let srcs: Vec<In<T>> = (0..self.nranks as usize)
                .map(|q| In {
                    ptr: staged[q * per_src..].as_ptr().cast::<T>(),
                    // Scaled by its sender.
                    pre: false,
                })
                .collect();
            let typed = TypedOp::<T>::new(op);
            // SAFETY: each source is `count` elements of staged words
            // (8-byte aligned, `per_src * 8 >= bytes`); `output` holds
            // `count` writable elements (caller) and is disjoint from them.
            unsafe {
                kernel::transfer::<T>(
                    &srcs,
                    &[output.ptr.cast::<T>()],
                    count,
                    op.post_div.is_some(),
                    &typed,
                    &mut Vec::new(),
                )
            };
        });
        self.epochs[rank as usize].store(epoch + 1, Ordering::Relaxed);
        Ok(())
    }

    /// Stores `data` as words tagged `flag` into slot `[parity][rank]` of
    /// every rank, starting with the next one (so the ranks' first stores
    /// spread over the clique).
    fn put(&self, rank: Rank, parity: usize, flag: u32, data: &[u8]) {
        let slots = self.slots();
        let base = self.base(parity, rank);
        for k in 1..=self.nranks {
            let to = &slots[((rank + k) % self.nranks) as usize];
            for (j, chunk) in data.chunks(WORD_DATA).enumerate() {
                let mut w = [0u8; WORD_DATA];
                w[..chunk.len()].copy_from_slice(chunk);
                let word = u64::from(u32::from_le_bytes(w)) | (u64::from(flag) << 32);
                to[base + j].store(word, Ordering::Release);
            }
        }
    }

    /// Waits for sender `q`'s `nwords` words of this call in `rank`'s
    /// slot `[parity][q]` and packs their data into `out` (two words per
    /// `u64`, little-endian, as the bytes were).
    #[allow(clippy::too_many_arguments)]
    fn get(
        &self,
        fabric: &HostFabric,
        rank: Rank,
        q: Rank,
        parity: usize,
        flag: u32,
        nwords: usize,
        out: &mut [u64],
    ) -> Result<(), HostError> {
        let mine = &self.slots()[rank as usize][self.base(parity, q)..][..nwords];
        let mut start: Option<Instant> = None;
        for (j, cell) in mine.iter().enumerate() {
            let mut spins = 0u32;
            let word = loop {
                let w = cell.load(Ordering::Acquire);
                if (w >> 32) as u32 == flag {
                    break w;
                }
                spins = spins.wrapping_add(1);
                if spins > SPIN_FAST {
                    std::thread::yield_now();
                }
                if spins.is_multiple_of(CHECK_EVERY) {
                    let t0 = *start.get_or_insert_with(Instant::now);
                    self.check(fabric, rank, q, j, t0)?;
                    if spins > 16 * CHECK_EVERY {
                        std::thread::sleep(Duration::from_micros(20));
                    }
                }
            };
            out[j / 2] |= (word & 0xFFFF_FFFF) << (32 * (j % 2));
        }
        Ok(())
    }

    /// Between polls: the fabric's failure (an abort, a peer's error) or
    /// the deadline ends the wait, which then fails the fabric.
    fn check(
        &self,
        fabric: &HostFabric,
        rank: Rank,
        q: Rank,
        word: usize,
        t0: Instant,
    ) -> Result<(), HostError> {
        if let Some(e) = fabric.stop_error(rank) {
            return Err(e);
        }
        let waited = t0.elapsed();
        if waited >= fabric.deadline() {
            let err = HostError::Deadline(WaitFault {
                cause: FaultCause::Deadline,
                rank,
                peer: q,
                channel: 0,
                step: word as u32,
                awaited: Awaited::Message,
                waited,
                absent: Vec::new(),
            });
            fabric.fail(err.to_string());
            return Err(err);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HostConfig;
    use oxccl_core::RedOp;

    /// Random pause in µs (xorshift of a seed).
    fn pause(seed: u64) -> u64 {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d) % 400
    }

    /// Ranks held back between their stores and their loads while peers
    /// run a call ahead: a slot reused before its reader is done (one
    /// parity, say) fails this with wrong sums or a deadline.
    #[test]
    fn readers_held_back_still_read_their_call() {
        for n in [2u32, 3, 5] {
            let fabric = HostFabric::new(
                n,
                HostConfig {
                    deadline: Duration::from_secs(20),
                    ..HostConfig::default()
                },
            );
            let mut ll = OneShotLl::new(n, 256);
            ll.between = Some(Box::new(move |r, e| {
                if (u64::from(r) + e) % 3 == 0 {
                    std::thread::sleep(Duration::from_micros(pause(e * 131 + u64::from(r))));
                }
            }));
            let op = RedOp::Sum.lower(DataType::U32, n);
            let calls = 200u32;
            let results: Vec<Vec<Vec<u32>>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..n)
                    .map(|r| {
                        let (ll, fabric, op) = (&ll, &fabric, &op);
                        s.spawn(move || {
                            (0..calls)
                                .map(|i| {
                                    let count = 1 + (i as usize * 7) % 64;
                                    let input: Vec<u32> =
                                        (0..count as u32).map(|j| (r + 1) * 1000 + i + j).collect();
                                    let mut out = vec![0u32; count];
                                    // SAFETY: both buffers hold `count` u32s and
                                    // outlive the call.
                                    unsafe {
                                        ll.all_reduce(
                                            fabric,
                                            r,
                                            HostBuf::from_slice(&input),
                                            HostBuf::from_mut_slice(&mut out),
                                            count,
                                            DataType::U32,
                                            op,
                                        )
                                    }
                                    .unwrap_or_else(|e| panic!("rank {r} call {i}: {e}"));
                                    out
                                })
                                .collect()
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for (r, per_call) in results.iter().enumerate() {
                for (i, out) in per_call.iter().enumerate() {
                    let i = i as u32;
                    let want: Vec<u32> = (0..out.len() as u32)
                        .map(|j| (0..n).map(|q| (q + 1) * 1000 + i + j).sum())
                        .collect();
                    assert_eq!(out, &want, "{n} ranks, rank {r}, call {i}");
                }
            }
        }
    }

    /// A call larger than the slots is refused, and nothing waits.
    #[test]
    fn a_call_past_the_slots_is_refused() {
        let fabric = HostFabric::new(2, HostConfig::default());
        let ll = OneShotLl::new(2, 16);
        let input = [1u32; 5];
        let mut out = [0u32; 5];
        let op = RedOp::Sum.lower(DataType::U32, 2);
        // SAFETY: both buffers hold 5 u32s.
        let r = unsafe {
            ll.all_reduce(
                &fabric,
                0,
                HostBuf::from_slice(&input),
                HostBuf::from_mut_slice(&mut out),
                5,
                DataType::U32,
                &op,
            )
        };
        assert!(matches!(r, Err(HostError::InvalidPlan(_))), "{r:?}");
        assert_eq!(out, [0; 5]);
    }
}
