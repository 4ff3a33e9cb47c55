//! One test body for the raw entry points (`collective_raw`, `send_raw`,
//! `recv_raw`) over any memory: the host backend's host pointers and,
//! in `external.rs`, every kind of CUDA memory on a caller's stream.

use oxccl::core::testkit;
use oxccl::core::Collective;
use oxccl::{CollKind, Communicator, Element, RawColl, RawStream, RedOp};

/// Memory the caller allocates and copies, as an application would.
pub trait Mem: Sync {
    /// `bytes` bytes for `rank` (never freed before the test ends).
    fn alloc(&self, rank: u32, bytes: usize) -> u64;
    /// The caller's stream of `rank`.
    fn stream(&self, rank: u32) -> RawStream;
    /// Enqueues a copy of `src` to `dst` on `stream` (the source stays
    /// alive until `sync`).
    fn upload(&self, rank: u32, dst: u64, src: &[u8]);
    /// Enqueues a copy of `src` to `dst` on the rank's stream.
    fn download(&self, rank: u32, src: u64, dst: &mut [u8]);
    /// Waits for the rank's stream (only the caller's stream: nothing of
    /// the communicator's).
    fn sync(&self, rank: u32);
}

pub fn bytes_of<T: Element>(v: &[T]) -> &[u8] {
    // SAFETY: `Element` types are plain data without padding.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
}

pub fn bytes_of_mut<T: Element>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as above; every bit pattern is a valid `Element`.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), std::mem::size_of_val(v)) }
}

/// A call on f32 buffers at the device (or host) addresses `send` and
/// `recv`.
pub fn f32_call(
    kind: CollKind,
    send: u64,
    recv: u64,
    count: usize,
    op: RedOp,
    root: u32,
) -> RawColl {
    RawColl {
        kind,
        send: send as *const _,
        recv: recv as *mut _,
        count,
        dtype: oxccl::DataType::F32,
        op,
        root,
    }
}

/// Where an in-place call's input lies inside its output (elements), or
/// the reverse: NCCL's layouts.
fn in_place_ptrs<T: Element>(c: &Collective, r: u32, buf: u64) -> (u64, u64) {
    let es = std::mem::size_of::<T>() as u64;
    let blk = (r as usize * c.count) as u64 * es;
    match c.kind {
        CollKind::AllGather | CollKind::Gather => (buf + blk, buf),
        CollKind::ReduceScatter | CollKind::Scatter => (buf, buf + blk),
        _ => (buf, buf),
    }
}

/// How a test's buffers are made known to the communicator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reg {
    /// Not at all: FIFO plans.
    No,
    /// `Communicator::register` on each buffer.
    Register,
    /// `Communicator::window_register` on each buffer (symmetric where
    /// the buffer is aligned for it).
    Window,
}

impl From<bool> for Reg {
    /// Registered with `Communicator::register`, or not at all.
    fn from(register: bool) -> Reg {
        if register {
            Reg::Register
        } else {
            Reg::No
        }
    }
}

/// Runs `kind` on `count` elements through `collective_raw` on every rank
/// (out of place, or in place in NCCL's layout), the buffers registered
/// as `reg` says (`true`: registered, `false`: not), and returns the
/// number of wrong elements with the first described.
pub fn run_collective<T: Element, M: Mem>(
    comms: &[Communicator],
    mem: &M,
    kind: CollKind,
    count: usize,
    op: RedOp,
    in_place: bool,
    reg: impl Into<Reg>,
) -> Outcome {
    let reg = reg.into();
    let n = comms.len() as u32;
    let root = n - 1;
    let coll = Collective::new(kind, count, if kind.has_root() { root } else { 0 });
    let es = std::mem::size_of::<T>();
    let inputs: Vec<Vec<T>> = (0..n)
        .map(|r| testkit::input::<T>(&coll, n, r, op, 7))
        .collect();
    let outputs = super::on_ranks(comms, |c| {
        let r = c.rank();
        let (lin, lout) = (coll.input_len(n), coll.output_len(n));
        let (send, recv) = if in_place {
            let buf = mem.alloc(r, lin.max(lout) * es);
            in_place_ptrs::<T>(&coll, r, buf)
        } else {
            (mem.alloc(r, lin * es), mem.alloc(r, lout * es))
        };
        // Poison the output, then the input over it where in place: both
        // on the caller's stream, before the call.
        let poison = vec![T::from_f64(-3.0); lout];
        mem.upload(r, recv, bytes_of(&poison));
        mem.upload(r, send, bytes_of(&inputs[r as usize]));
        let regs = (reg == Reg::Register).then(|| {
            // SAFETY: both ranges are allocations of this test that
            // outlive every call on them.
            unsafe {
                [
                    c.register(send as *const _, lin * es)
                        .expect("register send"),
                    c.register(recv as *const _, lout * es)
                        .expect("register recv"),
                ]
            }
        });
        let wins = (reg == Reg::Window).then(|| {
            let win = |p: u64, bytes: usize| {
                let flags = if p.is_multiple_of(oxccl::WIN_REQUIRED_ALIGNMENT) {
                    oxccl::WIN_COLL_SYMMETRIC
                } else {
                    oxccl::WIN_DEFAULT
                };
                // SAFETY: as for `register` above.
                let w = unsafe { c.window_register(p as *const _, bytes, flags) }
                    .expect("window_register");
                assert_eq!((w.addr(), w.bytes(), w.rank()), (p, bytes, r));
                w
            };
            if send == recv {
                vec![win(send, lin.max(lout) * es)]
            } else {
                vec![win(send, lin * es), win(recv, lout * es)]
            }
        });
        // SAFETY: the buffers hold the lengths the collective needs, on
        // the rank's device (or host), and live until the test ends; the
        // stream is the rank's caller stream.
        let res = unsafe {
            c.collective_raw(
                RawColl {
                    kind,
                    send: send as *const _,
                    recv: recv as *mut _,
                    count,
                    dtype: T::DTYPE,
                    op,
                    root,
                },
                mem.stream(r),
            )
        };
        let mut out = vec![T::default(); lout];
        mem.download(r, recv, bytes_of_mut(&mut out));
        mem.sync(r);
        let choice = c.last_choice();
        for g in regs.into_iter().flatten() {
            c.deregister(g).expect("deregister");
        }
        for w in wins.into_iter().flatten() {
            c.window_deregister(&w).expect("window_deregister");
        }
        res.map(|()| (out, choice))
    });
    let mut outs = Vec::new();
    let mut direct = true;
    for (r, o) in outputs.into_iter().enumerate() {
        match o {
            Ok((out, choice)) => {
                direct &= choice.is_some_and(|ch| ch.is_direct());
                outs.push(out)
            }
            Err(e) => {
                return Outcome {
                    wrong: 1,
                    first: Some(format!("rank {r}: {e}")),
                    direct: false,
                }
            }
        }
    }
    let (wrong, first) = testkit::compare(&coll, &inputs, &outs, op);
    Outcome {
        wrong,
        first,
        direct,
    }
}

/// What one raw collective gave.
#[derive(Debug)]
pub struct Outcome {
    /// Wrong elements (every rank's), with the first described.
    pub wrong: u64,
    pub first: Option<String>,
    /// Whether every rank ran a direct (zero-copy) plan.
    pub direct: bool,
}

/// A ring exchange through `send_raw`/`recv_raw` in one group per rank:
/// rank r sends `count` elements to r+1 and receives from r-1. Returns
/// the wrong elements' count and the first described.
pub fn run_ring<T: Element, M: Mem>(
    comms: &[Communicator],
    mem: &M,
    count: usize,
) -> (u64, Option<String>) {
    let n = comms.len() as u32;
    let es = std::mem::size_of::<T>();
    let value = |r: u32, i: usize| T::from_f64(((r as usize * 7 + i) % 100) as f64);
    let got = super::on_ranks(comms, |c| {
        let r = c.rank();
        let (s, d) = (mem.alloc(r, count * es), mem.alloc(r, count * es));
        let input: Vec<T> = (0..count).map(|i| value(r, i)).collect();
        mem.upload(r, s, bytes_of(&input));
        let st = mem.stream(r);
        let res = oxccl::group(|g| {
            // SAFETY: both buffers hold `count` elements and live until
            // the test ends.
            unsafe {
                g.send_raw(c, s as *const _, count, T::DTYPE, (r + 1) % n, st)?;
                g.recv_raw(c, d as *mut _, count, T::DTYPE, (r + n - 1) % n, st)
            }
        });
        let mut out = vec![T::default(); count];
        mem.download(r, d, bytes_of_mut(&mut out));
        mem.sync(r);
        res.map(|()| out)
    });
    let mut wrong = 0;
    let mut first = None;
    for (r, o) in got.into_iter().enumerate() {
        let from = (r as u32 + n - 1) % n;
        match o {
            Ok(out) => {
                for (i, x) in out.iter().enumerate() {
                    if x.to_f64() != value(from, i).to_f64() {
                        wrong += 1;
                        first
                            .get_or_insert_with(|| format!("rank {r} element {i}: {}", x.to_f64()));
                    }
                }
            }
            Err(e) => {
                wrong += 1;
                first.get_or_insert_with(|| format!("rank {r}: {e}"));
            }
        }
    }
    (wrong, first)
}
