//! The shape of the float formats, shared by the tolerance bounds and the
//! second implementation of the arithmetic (which both depend on it, not
//! on each other).

use crate::dtype::DataType;

/// Significand bits (hidden bit included) and the smallest normal
/// exponent of a float type.
pub(crate) fn float_format(dtype: DataType) -> (i32, i32) {
    match dtype {
        DataType::F64 => (53, -1022),
        DataType::F32 => (24, -126),
        DataType::F16 => (11, -14),
        DataType::Bf16 => (8, -126),
        DataType::F8E4M3 => (4, -6),
        DataType::F8E5M2 => (3, -14),
        _ => (64, 0),
    }
}

/// The exponent of the largest power of two not above |v| (v finite, not 0).
pub(crate) fn exponent(v: f64) -> i32 {
    let bits = v.abs().to_bits();
    let biased = (bits >> 52) as i32;
    if biased == 0 {
        // f64 subnormal: 2^-1074 times the mantissa.
        63 - (bits.leading_zeros() as i32) - 1074
    } else {
        biased - 1023
    }
}
