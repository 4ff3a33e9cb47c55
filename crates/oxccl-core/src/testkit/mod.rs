//! Shared test support: inputs whose results are exact (or boundedly
//! rounded), comparison against [`crate::reference`], and an independent
//! model of the arithmetic for golden tables. Used by every backend's test
//! suite, so one test body serves them all.
//!
//! `tests/testkit_selftest.rs` shows that [`compare`] with these inputs
//! reports a dropped rank, a doubled or zeroed result, a swapped block and
//! an off-by-one offset as wrong for every data type, op and rank count the
//! suites use; `tests/golden.rs` checks the reference against [`model`].

mod bound;
mod compare;
mod format;
mod input;
pub mod model;

pub use bound::{rounding_bound, tolerance, ulp, Tolerance};
pub use compare::{compare, own_outputs};
pub use input::input;

use crate::coll::CollKind;
use crate::dtype::DataType;
use crate::redop::RedOp;

/// Whether `op` is defined for collective `kind` (reductions only take ops).
pub fn op_applies(kind: CollKind, op: RedOp) -> bool {
    kind.is_reduction() || op == RedOp::Sum
}

/// Whether the suites run `op` with `kind` on `dtype`: it applies to the
/// collective and is defined on the type. PreMulSum(0.5) on an integer
/// type is not (its scalar would become 0 and every result 0, a run no
/// dropped or doubled rank could fail; the facade refuses it).
pub fn op_defined(kind: CollKind, dtype: DataType, op: RedOp) -> bool {
    op_applies(kind, op) && op.undefined_reason(dtype).is_none()
}

/// Every collective the shared suites run: [`CollKind::ALL`] but its
/// last, Send/Recv (which has its own tests).
pub const COLLECTIVES: [CollKind; 8] = {
    assert!(matches!(CollKind::ALL[8], CollKind::SendRecv));
    let mut out = [CollKind::SendRecv; 8];
    let mut i = 0;
    while i < out.len() {
        out[i] = CollKind::ALL[i];
        i += 1;
    }
    out
};

/// Every reduction op the shared suites try (where it applies): the five
/// built-ins, an exact PreMulSum and an inexact one.
pub const OPS: [RedOp; 7] = [
    RedOp::Sum,
    RedOp::Prod,
    RedOp::Max,
    RedOp::Min,
    RedOp::Avg,
    RedOp::PreMulSum(2.0),
    RedOp::PreMulSum(0.5),
];
