//! Reduction operators and how they lower onto element arithmetic.

use std::fmt;
use std::str::FromStr;

use crate::dtype::DataType;
use crate::element::Element;
use crate::error::CoreError;

/// A reduction operator, as `ncclRedOp_t` offers them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RedOp {
    Sum,
    Prod,
    Max,
    Min,
    /// Mean over ranks. As in NCCL: on integer types the values are summed
    /// and the sum divided by the rank count with truncation toward zero;
    /// on floating types each input is first multiplied by `1/nranks`
    /// (rounded to the type), then summed.
    Avg,
    /// Each rank's input is multiplied by the scalar, then summed. The
    /// scalar is held as f64 and converted to the element type once (for
    /// 64-bit integers beyond 2^53 that conversion is inexact).
    PreMulSum(f64),
    /// PreMulSum with the scalar in device memory (NCCL's
    /// `ncclScalarDevice`): the address of one element of the call's type
    /// on the rank's device, read by the kernel when the call runs, so no
    /// host wait comes first and a call captured into a graph reads the
    /// value of each replay. Only a backend whose executor runs on the
    /// device takes it; the others refuse it.
    PreMulSumDevice(u64),
}

/// The element-wise operator a backend applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BaseOp {
    Sum,
    Prod,
    Max,
    Min,
}

/// A [`RedOp`] made concrete for one data type and rank count: what the
/// executors apply. `pre_scale` multiplies a rank's own input when it first
/// enters a reduction; `post_div` divides the final result once.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoweredOp {
    pub base: BaseOp,
    pub pre_scale: Option<f64>,
    /// The device address of a pre-scale the executor reads itself
    /// ([`RedOp::PreMulSumDevice`]); `pre_scale` is then `None`.
    pub pre_scale_at: Option<u64>,
    pub post_div: Option<u32>,
}

impl RedOp {
    /// Lowers the op for `dtype` on `nranks` ranks.
    pub fn lower(self, dtype: DataType, nranks: u32) -> LoweredOp {
        let plain = |base| LoweredOp {
            base,
            pre_scale: None,
            pre_scale_at: None,
            post_div: None,
        };
        match self {
            RedOp::Sum => plain(BaseOp::Sum),
            RedOp::Prod => plain(BaseOp::Prod),
            RedOp::Max => plain(BaseOp::Max),
            RedOp::Min => plain(BaseOp::Min),
            RedOp::Avg if dtype.is_float() => LoweredOp {
                base: BaseOp::Sum,
                pre_scale: Some(1.0 / f64::from(nranks.max(1))),
                pre_scale_at: None,
                post_div: None,
            },
            RedOp::Avg => LoweredOp {
                base: BaseOp::Sum,
                pre_scale: None,
                pre_scale_at: None,
                post_div: Some(nranks.max(1)),
            },
            RedOp::PreMulSum(s) => LoweredOp {
                base: BaseOp::Sum,
                pre_scale: Some(s),
                pre_scale_at: None,
                post_div: None,
            },
            RedOp::PreMulSumDevice(addr) => LoweredOp {
                base: BaseOp::Sum,
                pre_scale: None,
                pre_scale_at: Some(addr),
                post_div: None,
            },
        }
    }

    /// Why `self` is not defined on `dtype`, or `None` when it is. Sum,
    /// Prod, Max, Min and Avg are defined on every type (Avg on integers
    /// sums then divides with truncation, as NCCL does). PreMulSum needs a
    /// finite scalar, and on integer types an integer the type can hold,
    /// since the scalar is converted to the element type once.
    pub fn undefined_reason(self, dtype: DataType) -> Option<String> {
        let RedOp::PreMulSum(s) = self else {
            return None;
        };
        if !s.is_finite() {
            return Some("the scalar must be finite".into());
        }
        if !dtype.is_float() {
            let max = dtype.exact_int_range() as f64;
            let min = if dtype.name().starts_with('u') {
                0.0
            } else {
                -max - 1.0
            };
            if s.fract() != 0.0 || s < min || s > max {
                return Some(format!(
                    "on integer types the scalar must be an integer in {min}..={max}"
                ));
            }
        }
        None
    }

    /// The `ncclRedOp_t` value for the built-in ops (PreMulSum ops are
    /// created at run time and have no fixed code).
    pub fn nccl_code(self) -> Option<i32> {
        match self {
            RedOp::Sum => Some(0),
            RedOp::Prod => Some(1),
            RedOp::Max => Some(2),
            RedOp::Min => Some(3),
            RedOp::Avg => Some(4),
            RedOp::PreMulSum(_) | RedOp::PreMulSumDevice(_) => None,
        }
    }

    /// The name nccl-tests prints in its `redop` column.
    pub fn name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Prod => "prod",
            RedOp::Max => "max",
            RedOp::Min => "min",
            RedOp::Avg => "avg",
            RedOp::PreMulSum(_) | RedOp::PreMulSumDevice(_) => "premulsum",
        }
    }
}

impl fmt::Display for RedOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for RedOp {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "sum" => RedOp::Sum,
            "prod" => RedOp::Prod,
            "max" => RedOp::Max,
            "min" => RedOp::Min,
            "avg" => RedOp::Avg,
            "premulsum" => RedOp::PreMulSum(2.0),
            _ => {
                return Err(CoreError::Parse {
                    what: "reduction op",
                    value: s.to_string(),
                    expected: "sum prod max min avg premulsum",
                })
            }
        })
    }
}

impl BaseOp {
    /// Applies the operator to two elements.
    #[inline]
    pub fn apply<T: Element>(self, a: T, b: T) -> T {
        match self {
            BaseOp::Sum => a.add(b),
            BaseOp::Prod => a.mul(b),
            BaseOp::Max => a.maximum(b),
            BaseOp::Min => a.minimum(b),
        }
    }
}

impl LoweredOp {
    /// Applies the pre-scale (if any) to a rank's own input element.
    #[inline]
    pub fn pre<T: Element>(&self, v: T) -> T {
        match self.pre_scale {
            Some(s) => v.mul(T::from_f64(s)),
            None => v,
        }
    }

    /// Applies the post-division (if any) to a final result element.
    #[inline]
    pub fn post<T: Element>(&self, v: T) -> T {
        match self.post_div {
            Some(n) => v.div_count(n),
            None => v,
        }
    }

    /// Sequential reference: reduces `inputs[r][i]` over ranks in rank order.
    pub fn reference<T: Element>(&self, inputs: &[&[T]], len: usize) -> Vec<T> {
        (0..len)
            .map(|i| {
                let mut acc = self.pre(inputs[0][i]);
                for inp in &inputs[1..] {
                    acc = self.base.apply(acc, self.pre(inp[i]));
                }
                self.post(acc)
            })
            .collect()
    }
}
