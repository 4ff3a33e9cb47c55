//! Outputs against the sequential reference, element by element.

use super::bound::{rounding_bound, tolerance, Tolerance};
use crate::coll::{CollKind, Collective};
use crate::element::Element;
use crate::redop::{LoweredOp, RedOp};

/// Every rank's output as one process sees it when it checks only its
/// own: rank `me`'s is `out`, the others' are the reference's (for
/// Send/Recv on a ring, the previous rank's input).
pub fn own_outputs<T: Element>(
    coll: &Collective,
    inputs: &[Vec<T>],
    me: u32,
    out: Vec<T>,
    op: RedOp,
) -> Vec<Vec<T>> {
    let n = inputs.len();
    let mut outputs: Vec<Vec<T>> = if coll.kind == CollKind::SendRecv {
        (0..n).map(|r| inputs[(r + n - 1) % n].clone()).collect()
    } else {
        let exp = crate::reference::expected(coll, inputs, &op.lower(T::DTYPE, n as u32));
        exp.into_iter().map(Option::unwrap_or_default).collect()
    };
    outputs[me as usize] = out;
    outputs
}

/// Compares outputs with the reference ([`crate::reference::expected`]).
/// Returns the number of wrong elements (missing ones, of missing ranks
/// too, included) and a description of the first. Exact cases
/// ([`tolerance`]) must match bit for bit (NaN matching NaN); rounded ones
/// must lie within [`rounding_bound`] of the sum of their rounded terms.
pub fn compare<T: Element>(
    coll: &Collective,
    inputs: &[Vec<T>],
    outputs: &[Vec<T>],
    op: RedOp,
) -> (u64, Option<String>) {
    let n = inputs.len() as u32;
    let lowered: LoweredOp = op.lower(T::DTYPE, n);
    let expected = crate::reference::expected(coll, inputs, &lowered);
    let rounded = tolerance(T::DTYPE, op, n) == Tolerance::Rounded;
    // Rounded cases are float sums with a pre-scale, converted once.
    let scale = T::from_f64(lowered.pre_scale.unwrap_or(1.0)).to_f64();
    let mut wrong = 0u64;
    let mut first = None;
    for (r, exp) in expected.iter().enumerate() {
        let Some(exp) = exp else { continue };
        let got = outputs.get(r).map_or(&[][..], Vec::as_slice);
        if got.len() < exp.len() {
            wrong += (exp.len() - got.len()) as u64;
            first.get_or_insert_with(|| {
                format!(
                    "rank {r}: output has {} elements, expected {}",
                    got.len(),
                    exp.len()
                )
            });
        }
        // The input element each output element reduces (rounded cases
        // are reductions: ReduceScatter's rank r reduces block r).
        let block = if coll.kind == CollKind::ReduceScatter {
            r * coll.count
        } else {
            0
        };
        for (i, (e, g)) in exp.iter().zip(got).enumerate() {
            let ok = if rounded {
                let xs = inputs.iter().map(|inp| inp[block + i].to_f64());
                let (exact, bound) = rounding_bound(T::DTYPE, xs, scale);
                (g.to_f64() - exact).abs() <= bound
            } else {
                e.bits_eq(*g) || (e.to_f64().is_nan() && g.to_f64().is_nan())
            };
            if !ok {
                wrong += 1;
                first.get_or_insert_with(|| {
                    format!("rank {r} element {i}: expected {e:?}, got {g:?}")
                });
            }
        }
    }
    (wrong, first)
}
