//! Element loops: one transfer's sources reduced left to right into its
//! destinations, monomorphised per element type.
//!
//! The result is computed once and written to every destination that no
//! source partially overlaps (so recv_reduce_send reduces straight from the
//! incoming slot into the outgoing one, and recv_reduce_copy_send writes
//! the output and the outgoing slot in the same pass); a destination that
//! does partially overlap a source gets a copy afterwards. Reductions run in blocks of
//! [`BLOCK`] elements through an accumulator on the stack, so each source
//! is streamed once and the loops over slices vectorise.

use std::ptr;

use oxccl_core::{BaseOp, Element, LoweredOp};

/// Elements per accumulator block (8 KiB for 8-byte types: stays in L1).
const BLOCK: usize = 1024;
/// The accumulator of calls of at most this many elements.
const SMALL_BLOCK: usize = 64;

/// Destinations written straight from the accumulator; more are copied.
const MAX_DIRECT: usize = 4;

/// A source operand: address and whether the op's pre-scale applies.
#[derive(Clone, Copy, Debug)]
pub(crate) struct In<T> {
    pub ptr: *const T,
    pub pre: bool,
}

/// The op made concrete for `T` once per call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TypedOp<T> {
    base: BaseOp,
    scale: Option<T>,
    op: LoweredOp,
}

impl<T: Element> TypedOp<T> {
    pub(crate) fn new(op: &LoweredOp) -> Self {
        TypedOp {
            base: op.base,
            scale: op.pre_scale.map(T::from_f64),
            op: *op,
        }
    }

    /// Whether sources marked `pre` are scaled (a copy of one is then no
    /// plain copy).
    pub(crate) fn scales(&self) -> bool {
        self.scale.is_some()
    }
}

fn overlaps<T>(a: *const T, b: *const T, len: usize) -> bool {
    (a as usize).abs_diff(b as usize) < len * size_of::<T>()
}

/// Reduces `srcs` (left to right, pre-scaling where asked, post-processing
/// if `post`) into every pointer in `dsts`. `temp` is used only when every
/// destination partially overlaps a source.
///
/// # Safety
/// Every source is valid for reads and every destination for writes of
/// `len` elements of `T`, aligned; nothing else writes them during the call;
/// destinations do not overlap each other.
pub(crate) unsafe fn transfer<T: Element>(
    srcs: &[In<T>],
    dsts: &[*mut T],
    len: usize,
    post: bool,
    op: &TypedOp<T>,
    temp: &mut Vec<T>,
) {
    if len == 0 || dsts.is_empty() {
        return;
    }
    // Destinations that no source partially overlaps (each source is either
    // disjoint from them or exactly them) can be written straight from the
    // result; any other is copied from the first of them (or from `temp`).
    let fits = |d: *mut T| {
        srcs.iter()
            .all(|s| s.ptr == d.cast_const() || !overlaps(s.ptr, d.cast_const(), len))
    };
    let mut direct: [*mut T; MAX_DIRECT] = [ptr::null_mut(); MAX_DIRECT];
    let mut k = 0;
    for &d in dsts {
        if k < MAX_DIRECT && fits(d) {
            direct[k] = d;
            k += 1;
        }
    }
    if k == 0 {
        if temp.len() < len {
            temp.resize(len, T::default());
        }
        direct[0] = temp.as_mut_ptr();
        k = 1;
    }
    let direct = &direct[..k];
    let plain_copy = srcs.len() == 1 && !post && (!srcs[0].pre || op.scale.is_none());
    if plain_copy {
        for &d in direct {
            if srcs[0].ptr != d.cast_const() {
                // SAFETY: `d` fits, so it is disjoint from the source; both
                // are valid for `len` elements (caller, or `temp` sized above).
                unsafe { ptr::copy_nonoverlapping(srcs[0].ptr, d, len) };
            }
        }
    } else {
        // SAFETY: forwarded caller contract; every `direct` destination fits.
        unsafe { reduce_into(srcs, direct, len, post, op) };
    }
    let primary = direct[0];
    for &d in dsts {
        if !direct.contains(&d) {
            // SAFETY: `primary` holds the result; destinations are valid and
            // disjoint from each other (caller); `temp` is ours. `copy`
            // tolerates a destination that overlaps the primary.
            unsafe { ptr::copy(primary.cast_const(), d, len) };
        }
    }
}

/// # Safety
/// As [`transfer`], and every source is disjoint from each of `outs` or
/// equal to it.
unsafe fn reduce_into<T: Element>(
    srcs: &[In<T>],
    outs: &[*mut T],
    len: usize,
    post: bool,
    op: &TypedOp<T>,
) {
    // A small call gets a small accumulator: filling all BLOCK elements
    // of one was most of an 8-byte call's instructions.
    if len <= SMALL_BLOCK {
        // SAFETY: as this function's.
        unsafe { reduce_blocks::<T, SMALL_BLOCK>(srcs, outs, len, post, op) }
    } else {
        // SAFETY: as this function's.
        unsafe { reduce_blocks::<T, BLOCK>(srcs, outs, len, post, op) }
    }
}

/// [`reduce_into`] through an accumulator of `B` elements.
///
/// # Safety
/// As [`reduce_into`].
unsafe fn reduce_blocks<T: Element, const B: usize>(
    srcs: &[In<T>],
    outs: &[*mut T],
    len: usize,
    post: bool,
    op: &TypedOp<T>,
) {
    let mut acc = [T::default(); B];
    let mut start = 0;
    while start < len {
        let n = B.min(len - start);
        let acc = &mut acc[..n];
        for (k, s) in srcs.iter().enumerate() {
            // SAFETY: the source is valid for `len` elements; no `&mut` to
            // this range is alive (the only writable alias, `out`, is
            // borrowed below, after these reads).
            let src = unsafe { std::slice::from_raw_parts(s.ptr.add(start), n) };
            let scale = if s.pre { op.scale } else { None };
            if k == 0 {
                load(acc, src, scale);
            } else {
                fold(acc, src, op.base, scale);
            }
        }
        if post {
            for v in acc.iter_mut() {
                *v = op.op.post(*v);
            }
        }
        for &out in outs {
            // SAFETY: `out` is valid for `len` elements and no other
            // reference to this block is alive (source slices above are
            // dead; outputs are disjoint from each other).
            let dst = unsafe { std::slice::from_raw_parts_mut(out.add(start), n) };
            dst.copy_from_slice(acc);
        }
        start += n;
    }
}

fn load<T: Element>(acc: &mut [T], src: &[T], scale: Option<T>) {
    match scale {
        None => acc.copy_from_slice(src),
        Some(k) => {
            for (a, b) in acc.iter_mut().zip(src) {
                *a = b.mul(k);
            }
        }
    }
}

#[inline(always)]
fn fold_with<T: Element>(acc: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    for (a, b) in acc.iter_mut().zip(src) {
        *a = f(*a, *b);
    }
}

/// `acc[i] = acc[i] (op) scale(src[i])`, with the op chosen outside the loop.
fn fold<T: Element>(acc: &mut [T], src: &[T], base: BaseOp, scale: Option<T>) {
    if scale.is_none() && crate::widened::fold(acc, src, base) {
        return;
    }
    match (base, scale) {
        (BaseOp::Sum, None) => fold_with(acc, src, |a, b| a.add(b)),
        (BaseOp::Prod, None) => fold_with(acc, src, |a, b| a.mul(b)),
        (BaseOp::Max, None) => fold_with(acc, src, |a, b| a.maximum(b)),
        (BaseOp::Min, None) => fold_with(acc, src, |a, b| a.minimum(b)),
        (BaseOp::Sum, Some(k)) => fold_with(acc, src, |a, b| a.add(b.mul(k))),
        (base, Some(k)) => fold_with(acc, src, |a, b| base.apply(a, b.mul(k))),
    }
}

/// Exchanges `len` elements between `a` and `b` (a [`oxccl_core::plan::Step::Swap`]).
///
/// # Safety
/// `a` and `b` must each be valid for reads and writes of `len` elements
/// and must not overlap (`compile` rejects a swap with the rank itself,
/// and a peer's buffer is never this rank's); no other thread may access
/// either range meanwhile (the plan's barriers order every other access).
pub(crate) unsafe fn swap<T: Element>(a: *mut T, b: *mut T, len: usize) {
    debug_assert!(!overlaps(a.cast_const(), b.cast_const(), len) || len == 0);
    // SAFETY: caller's contract: both valid, disjoint, unshared.
    unsafe { ptr::swap_nonoverlapping(a, b, len) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl_core::{DataType, RedOp};

    fn run(srcs: &[In<f32>], dsts: &[*mut f32], len: usize, post: bool, op: RedOp) {
        let op = TypedOp::new(&op.lower(DataType::F32, 4));
        // SAFETY: the tests pass pointers into live vectors of `len` elements.
        unsafe { transfer(srcs, dsts, len, post, &op, &mut Vec::new()) };
    }

    #[test]
    fn reduces_left_to_right_in_place_and_to_many() {
        let len = 3000; // several blocks
        let a: Vec<f32> = (0..len).map(|i| i as f32).collect();
        let mut b: Vec<f32> = vec![1.0; len];
        let mut c = vec![0.0f32; len];
        let bp = b.as_mut_ptr();
        // b = a + b in place, copied to c as well.
        run(
            &[
                In {
                    ptr: a.as_ptr(),
                    pre: false,
                },
                In {
                    ptr: bp,
                    pre: false,
                },
            ],
            &[bp, c.as_mut_ptr()],
            len,
            false,
            RedOp::Sum,
        );
        assert!(b.iter().enumerate().all(|(i, v)| *v == i as f32 + 1.0));
        assert_eq!(b, c);
    }

    #[test]
    fn partial_overlap_goes_through_temp_and_pre_post_apply() {
        let mut v: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let p = v.as_mut_ptr();
        // SAFETY: offsets inside `v`.
        let (src, dst) = unsafe { (p.add(2).cast_const(), p) };
        // Avg on f32 lowers to a pre-scale of 1/4.
        run(
            &[In {
                ptr: src,
                pre: true,
            }],
            &[dst],
            8,
            false,
            RedOp::Avg,
        );
        let want: Vec<f32> = (2..10).map(|i| i as f32 / 4.0).collect();
        assert_eq!(&v[..8], &want[..]);
    }

    #[test]
    fn integer_avg_divides_once_after_the_sum() {
        let a = [7i32, -7];
        let b = [2i32, 0];
        let mut out = [0i32; 2];
        let op = TypedOp::new(&RedOp::Avg.lower(DataType::I32, 2));
        // SAFETY: pointers into arrays of two elements.
        unsafe {
            transfer(
                &[
                    In {
                        ptr: a.as_ptr(),
                        pre: true,
                    },
                    In {
                        ptr: b.as_ptr(),
                        pre: true,
                    },
                ],
                &[out.as_mut_ptr()],
                2,
                true,
                &op,
                &mut Vec::new(),
            )
        };
        assert_eq!(out, [4, -3]);
    }
}
