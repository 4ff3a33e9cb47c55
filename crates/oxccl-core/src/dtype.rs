//! The twelve NCCL data types.

use std::fmt;
use std::str::FromStr;

use crate::error::CoreError;

/// An element type, numbered as `ncclDataType_t` numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum DataType {
    I8 = 0,
    U8 = 1,
    I32 = 2,
    U32 = 3,
    I64 = 4,
    U64 = 5,
    F16 = 6,
    F32 = 7,
    F64 = 8,
    Bf16 = 9,
    F8E4M3 = 10,
    F8E5M2 = 11,
}

impl DataType {
    /// Every type, in NCCL's order.
    pub const ALL: [DataType; 12] = [
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
        DataType::F16,
        DataType::F32,
        DataType::F64,
        DataType::Bf16,
        DataType::F8E4M3,
        DataType::F8E5M2,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 | DataType::F8E4M3 | DataType::F8E5M2 => 1,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::I32 | DataType::U32 | DataType::F32 => 4,
            DataType::I64 | DataType::U64 | DataType::F64 => 8,
        }
    }

    /// Whether the type is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F16
                | DataType::F32
                | DataType::F64
                | DataType::Bf16
                | DataType::F8E4M3
                | DataType::F8E5M2
        )
    }

    /// The `ncclDataType_t` value.
    pub const fn nccl_code(self) -> i32 {
        self as i32
    }

    /// The type for an `ncclDataType_t` value, if it names one.
    pub fn from_nccl_code(code: i32) -> Option<DataType> {
        usize::try_from(code)
            .ok()
            .and_then(|i| DataType::ALL.get(i).copied())
    }

    /// The name nccl-tests prints in its `type` column.
    pub const fn name(self) -> &'static str {
        match self {
            DataType::I8 => "int8",
            DataType::U8 => "uint8",
            DataType::I32 => "int32",
            DataType::U32 => "uint32",
            DataType::I64 => "int64",
            DataType::U64 => "uint64",
            DataType::F16 => "half",
            DataType::F32 => "float",
            DataType::F64 => "double",
            DataType::Bf16 => "bfloat16",
            DataType::F8E4M3 => "f8e4m3",
            DataType::F8E5M2 => "f8e5m2",
        }
    }

    /// The largest integer `m` such that every integer in `-m..=m` (or
    /// `0..=m` for unsigned types) is exactly representable. Tests fill
    /// buffers with such integers so float results can be compared exactly.
    pub const fn exact_int_range(self) -> u64 {
        match self {
            DataType::I8 => i8::MAX as u64,
            DataType::U8 => u8::MAX as u64,
            DataType::I32 => i32::MAX as u64,
            DataType::U32 => u32::MAX as u64,
            DataType::I64 => i64::MAX as u64,
            DataType::U64 => u64::MAX,
            DataType::F16 => 1 << 11,
            DataType::Bf16 => 1 << 8,
            DataType::F32 => 1 << 24,
            DataType::F64 => 1 << 53,
            DataType::F8E4M3 => 16,
            DataType::F8E5M2 => 8,
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DataType {
    type Err = CoreError;

    /// Accepts nccl-tests' names and the Rust-style ones (`f32`, `i8`, ...).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = match s.to_ascii_lowercase().as_str() {
            "int8" | "i8" | "char" => DataType::I8,
            "uint8" | "u8" => DataType::U8,
            "int32" | "i32" | "int" => DataType::I32,
            "uint32" | "u32" => DataType::U32,
            "int64" | "i64" => DataType::I64,
            "uint64" | "u64" => DataType::U64,
            "half" | "f16" | "float16" => DataType::F16,
            "float" | "f32" | "float32" => DataType::F32,
            "double" | "f64" | "float64" => DataType::F64,
            "bfloat16" | "bf16" => DataType::Bf16,
            "f8e4m3" | "fp8_e4m3" | "float8e4m3" | "e4m3" => DataType::F8E4M3,
            "f8e5m2" | "fp8_e5m2" | "float8e5m2" | "e5m2" => DataType::F8E5M2,
            _ => return Err(CoreError::Parse {
                what: "data type",
                value: s.to_string(),
                expected:
                    "int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 f8e4m3 f8e5m2",
            }),
        };
        Ok(t)
    }
}
