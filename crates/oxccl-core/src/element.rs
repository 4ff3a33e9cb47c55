//! CPU arithmetic for every data type.
//!
//! The rules match what the CUDA kernels do, so the reference and the GPU
//! agree bit for bit: integers wrap; f32 and f64 compute natively; f16, bf16
//! and both fp8 formats widen to f32, compute, and round back to nearest-even
//! (fp8 saturates to the largest finite value, as CUDA's `__nv_fp8` does).

use std::fmt::Debug;

use float8::{F8E4M3, F8E5M2};
use half::{bf16, f16};

use crate::dtype::DataType;

/// A type collectives can carry. Implemented for the Rust type of each of
/// the twelve [`DataType`]s. The impls' methods are `#[inline]`: without
/// it a method that is not a tiny leaf (`Ord::max` calls `max_by`) stays
/// a call per element in other crates' loops, which kept the host
/// backend's integer Max/Min about 20 times slower than Sum.
pub trait Element: Copy + Send + Sync + PartialEq + Debug + Default + 'static {
    /// The matching NCCL data type.
    const DTYPE: DataType;
    /// Converts from f64 (rounding or wrapping as the type does).
    fn from_f64(v: f64) -> Self;
    /// Converts to f64.
    fn to_f64(self) -> f64;
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn maximum(self, o: Self) -> Self;
    fn minimum(self, o: Self) -> Self;
    /// Division by a rank count: truncating for integers (NCCL's `ncclAvg`
    /// on integers sums, then divides), rounding for floats.
    fn div_count(self, n: u32) -> Self;
    /// Bit-level equality, so NaNs compare equal to themselves in tests.
    fn bits_eq(self, o: Self) -> bool;
}

macro_rules! int_element {
    ($t:ty, $dt:expr) => {
        impl Element for $t {
            const DTYPE: DataType = $dt;
            #[inline]
            fn from_f64(v: f64) -> Self {
                // Through i128 so negative values wrap into unsigned types.
                (v as i128) as $t
            }
            #[inline]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline]
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            #[inline]
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            #[inline]
            fn maximum(self, o: Self) -> Self {
                Ord::max(self, o)
            }
            #[inline]
            fn minimum(self, o: Self) -> Self {
                Ord::min(self, o)
            }
            #[inline]
            fn div_count(self, n: u32) -> Self {
                // Wrapping division only differs from `/` for MIN / -1,
                // which cannot occur with a positive n.
                self.wrapping_div(n as $t)
            }
            #[inline]
            fn bits_eq(self, o: Self) -> bool {
                self == o
            }
        }
    };
}

int_element!(i8, DataType::I8);
int_element!(u8, DataType::U8);
int_element!(i32, DataType::I32);
int_element!(u32, DataType::U32);
int_element!(i64, DataType::I64);
int_element!(u64, DataType::U64);

macro_rules! native_float_element {
    ($t:ty, $dt:expr) => {
        impl Element for $t {
            const DTYPE: DataType = $dt;
            #[inline]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline]
            fn add(self, o: Self) -> Self {
                self + o
            }
            #[inline]
            fn mul(self, o: Self) -> Self {
                self * o
            }
            #[inline]
            fn maximum(self, o: Self) -> Self {
                // fmax semantics (a NaN operand loses), as CUDA's fmaxf.
                <$t>::max(self, o)
            }
            #[inline]
            fn minimum(self, o: Self) -> Self {
                <$t>::min(self, o)
            }
            #[inline]
            fn div_count(self, n: u32) -> Self {
                self / (n as $t)
            }
            #[inline]
            fn bits_eq(self, o: Self) -> bool {
                self.to_bits() == o.to_bits()
            }
        }
    };
}

native_float_element!(f32, DataType::F32);
native_float_element!(f64, DataType::F64);

/// Small floats compute in f32 and round once per operation.
macro_rules! widened_float_element {
    ($t:ty, $dt:expr, $from32:expr, $to32:expr, $from64:expr) => {
        impl Element for $t {
            const DTYPE: DataType = $dt;
            #[inline]
            fn from_f64(v: f64) -> Self {
                $from64(v)
            }
            #[inline]
            fn to_f64(self) -> f64 {
                $to32(self) as f64
            }
            #[inline]
            fn add(self, o: Self) -> Self {
                $from32($to32(self) + $to32(o))
            }
            #[inline]
            fn mul(self, o: Self) -> Self {
                $from32($to32(self) * $to32(o))
            }
            #[inline]
            fn maximum(self, o: Self) -> Self {
                $from32(f32::max($to32(self), $to32(o)))
            }
            #[inline]
            fn minimum(self, o: Self) -> Self {
                $from32(f32::min($to32(self), $to32(o)))
            }
            #[inline]
            fn div_count(self, n: u32) -> Self {
                $from32($to32(self) / n as f32)
            }
            #[inline]
            fn bits_eq(self, o: Self) -> bool {
                self.to_bits() == o.to_bits()
            }
        }
    };
}

widened_float_element!(
    f16,
    DataType::F16,
    f16::from_f32,
    f16::to_f32,
    f16::from_f64
);
widened_float_element!(
    bf16,
    DataType::Bf16,
    bf16::from_f32,
    bf16::to_f32,
    bf16::from_f64
);
widened_float_element!(
    F8E4M3,
    DataType::F8E4M3,
    F8E4M3::from_f32,
    |x: F8E4M3| x.to_f32(),
    F8E4M3::from_f64
);
widened_float_element!(
    F8E5M2,
    DataType::F8E5M2,
    F8E5M2::from_f32,
    |x: F8E5M2| x.to_f32(),
    F8E5M2::from_f64
);

/// Runs `$body` with the type alias `$T` bound to the Rust type of `$dt`.
///
/// ```
/// use oxccl_core::{with_dtype, DataType, Element};
/// let size = with_dtype!(DataType::Bf16, T => std::mem::size_of::<T>());
/// assert_eq!(size, 2);
/// ```
#[macro_export]
macro_rules! with_dtype {
    ($dt:expr, $T:ident => $body:expr) => {{
        match $dt {
            $crate::DataType::I8 => {
                type $T = i8;
                $body
            }
            $crate::DataType::U8 => {
                type $T = u8;
                $body
            }
            $crate::DataType::I32 => {
                type $T = i32;
                $body
            }
            $crate::DataType::U32 => {
                type $T = u32;
                $body
            }
            $crate::DataType::I64 => {
                type $T = i64;
                $body
            }
            $crate::DataType::U64 => {
                type $T = u64;
                $body
            }
            $crate::DataType::F16 => {
                type $T = $crate::half::f16;
                $body
            }
            $crate::DataType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DataType::F64 => {
                type $T = f64;
                $body
            }
            $crate::DataType::Bf16 => {
                type $T = $crate::half::bf16;
                $body
            }
            $crate::DataType::F8E4M3 => {
                type $T = $crate::float8::F8E4M3;
                $body
            }
            $crate::DataType::F8E5M2 => {
                type $T = $crate::float8::F8E5M2;
                $body
            }
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_matches_size() {
        for dt in DataType::ALL {
            let size = with_dtype!(dt, T => { assert_eq!(T::DTYPE, dt); std::mem::size_of::<T>() });
            assert_eq!(size, dt.size(), "{dt}");
        }
    }

    #[test]
    fn integers_in_exact_range_round_trip() {
        for dt in DataType::ALL {
            let m = dt.exact_int_range().min(1 << 20) as f64;
            with_dtype!(dt, T => {
                for v in [0.0, 1.0, m - 1.0, m] {
                    assert_eq!(T::from_f64(v).to_f64(), v, "{dt} {v}");
                }
            });
        }
    }

    #[test]
    fn integer_avg_truncates_and_wraps() {
        assert_eq!((-7i32).div_count(2), -3);
        assert_eq!(250u8.add(10), 4);
        assert_eq!(i8::MIN.div_count(1), i8::MIN);
    }

    #[test]
    fn fp8_saturates() {
        let big = F8E4M3::from_f64(1e6);
        assert_eq!(big.to_f64(), 448.0);
        assert_eq!(
            F8E4M3::from_f64(200.0)
                .add(F8E4M3::from_f64(300.0))
                .to_f64(),
            448.0
        );
    }
}
