//! `libnccl.so.2`: NCCL 2.30's C ABI over oxccl, so programs built for
//! NCCL (PyTorch, nccl-tests, MPI codes) run on oxccl unchanged.
//!
//! The header is `include/nccl.h` (this project's own text, NCCL's values
//! and layouts). The built library is `liboxccl_capi.so` with soname
//! `libnccl.so.2`; `cargo xtask dist` or a copy under that name makes the
//! drop-in. See `README.md` beside this file for what is supported, what
//! returns `ncclInvalidUsage`, and the environment variables.
//!
//! # The boundary
//!
//! Every exported function runs its body through [`error::guard`]: a
//! panic becomes `ncclInternalError`, every failure a result code and a
//! message for `ncclGetLastError`. Enum arguments are read as integers
//! ([`abi`]); communicator handles are keys into a table of live
//! communicators ([`handle`]), never dereferenced; every pointer is
//! checked before use (`exec::check`), and nothing is written when a
//! check fails.

/// Calls `$f::<T>(args)` with `T` the Rust element type of a `DataType`.
macro_rules! typed {
    ($dt:expr, $f:ident ( $($a:expr),* )) => {
        match $dt {
            oxccl::DataType::I8 => $f::<i8>($($a),*),
            oxccl::DataType::U8 => $f::<u8>($($a),*),
            oxccl::DataType::I32 => $f::<i32>($($a),*),
            oxccl::DataType::U32 => $f::<u32>($($a),*),
            oxccl::DataType::I64 => $f::<i64>($($a),*),
            oxccl::DataType::U64 => $f::<u64>($($a),*),
            oxccl::DataType::F16 => $f::<oxccl::f16>($($a),*),
            oxccl::DataType::F32 => $f::<f32>($($a),*),
            oxccl::DataType::F64 => $f::<f64>($($a),*),
            oxccl::DataType::Bf16 => $f::<oxccl::bf16>($($a),*),
            oxccl::DataType::F8E4M3 => $f::<oxccl::F8E4M3>($($a),*),
            oxccl::DataType::F8E5M2 => $f::<oxccl::F8E5M2>($($a),*),
        }
    };
}

pub mod abi;
mod api;
pub mod config;
pub mod error;
mod exec;
mod group;
pub mod handle;
mod params;
mod scalar;
mod window;
