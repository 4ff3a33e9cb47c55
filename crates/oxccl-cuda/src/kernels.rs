//! Kernel sources, the instantiation table, NVRTC compilation and the
//! on-disk module cache.
//!
//! The `.cuh` files under `kernels/` are embedded with `include_str!`. One
//! module per data type holds the executor for the four base operators;
//! Avg and PreMulSum run as Sum with the plan's pre/post flags (see
//! `oxccl_core::LoweredOp`), so 12 × 4 kernels cover every (dtype, op).
//! Modules are compiled for the device's own architecture at first use and
//! cached on disk keyed by a hash of the source, the architecture, the
//! NVRTC version and the options, so a second process start loads cubins.

use std::path::PathBuf;
use std::sync::OnceLock;

use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};
use oxccl_core::{BaseOp, DataType};

use crate::driver::guarded;
use crate::error::{CudaError, Result};

pub const COMMON_SRC: &str = include_str!("../../../kernels/oxccl_common.cuh");
pub const NUM_SRC: &str = include_str!("../../../kernels/oxccl_num.cuh");
pub const EXEC_SRC: &str = include_str!("../../../kernels/oxccl_exec.cuh");
pub const LL_SRC: &str = include_str!("../../../kernels/oxccl_ll.cuh");

/// Threads per block; mirrors `OX_THREADS`.
pub const THREADS: u32 = 512;

/// The instantiation table: each data type's C++ element type.
pub const DTYPES: [(DataType, &str); 12] = [
    (DataType::I8, "i8"),
    (DataType::U8, "u8"),
    (DataType::I32, "i32"),
    (DataType::U32, "u32"),
    (DataType::I64, "i64"),
    (DataType::U64, "u64"),
    (DataType::F16, "ox_f16"),
    (DataType::F32, "float"),
    (DataType::F64, "double"),
    (DataType::Bf16, "ox_bf16"),
    (DataType::F8E4M3, "ox_e4m3"),
    (DataType::F8E5M2, "ox_e5m2"),
];

/// Each base operator's device constant and symbol suffix.
pub const OPS: [(BaseOp, &str, &str); 4] = [
    (BaseOp::Sum, "OX_SUM", "sum"),
    (BaseOp::Prod, "OX_PROD", "prod"),
    (BaseOp::Max, "OX_MAX", "max"),
    (BaseOp::Min, "OX_MIN", "min"),
];

/// NVRTC options. `--fmad=false` keeps `a + b * s` from fusing, so results
/// match the CPU reference bit for bit.
const OPTIONS: [&str; 3] = ["--std=c++17", "--fmad=false", "-lineinfo"];

/// The kernel symbol for `(dtype, op)`.
pub fn kernel_name(dtype: DataType, op: BaseOp) -> String {
    let suffix = OPS.iter().find(|o| o.0 == op).map_or("sum", |o| o.2);
    format!("oxccl_exec_{}_{suffix}", dtype.name())
}

/// The complete source of one data type's module.
pub fn module_source(dtype: DataType) -> String {
    let ctype = DTYPES
        .iter()
        .find(|d| d.0 == dtype)
        .map_or("float", |d| d.1);
    let parts = [COMMON_SRC, NUM_SRC, EXEC_SRC, LL_SRC];
    let mut s = String::with_capacity(parts.iter().map(|p| p.len() + 1).sum::<usize>() + 1024);
    for part in parts {
        s.push_str(part);
        s.push('\n');
    }
    s.push_str("// Instantiations (generated from kernels.rs' table).\n");
    for (op, constant, _) in OPS {
        s.push_str(&format!(
            "extern \"C\" __global__ void __launch_bounds__(OX_THREADS) {}(const __grid_constant__ OxDesc d) {{ ox_exec<{ctype}, {constant}>(d); }}\n",
            kernel_name(dtype, op)
        ));
    }
    s
}

/// FNV-1a, 64 bits: a stable hash for cache keys (std's hasher is not
/// stable across Rust versions).
pub fn fnv64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        // Separator so ("ab","c") and ("a","bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The NVRTC version, or why NVRTC cannot be used.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    static V: OnceLock<Result<(i32, i32)>> = OnceLock::new();
    V.get_or_init(|| {
        guarded("nvrtcVersion", || {
            // SAFETY: only probes whether the shared library can be opened.
            if !unsafe { nvrtc_sys::is_culib_present() } {
                return Err(CudaError::NoNvrtc("libnvrtc.so could not be loaded".into()));
            }
            let (mut maj, mut min) = (0, 0);
            // SAFETY: valid out-pointers.
            unsafe { nvrtc_sys::nvrtcVersion(&mut maj, &mut min) }
                .result()
                .map_err(|e| CudaError::NoNvrtc(format!("{e:?}")))?;
            Ok((maj, min))
        })
    })
    .clone()
}

/// Where cubins are cached: `$OXCCL_CACHE_DIR`, else `$XDG_CACHE_HOME/oxccl`,
/// else `$HOME/.cache/oxccl`, else the temp dir.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("OXCCL_CACHE_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("oxccl");
    }
    if let Some(h) = std::env::var_os("HOME") {
        return PathBuf::from(h).join(".cache").join("oxccl");
    }
    std::env::temp_dir().join("oxccl-cache")
}

/// Where a module was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    Compiled,
    DiskCache,
}

/// The cubin for `dtype`'s module on `sm_{arch}`: from the disk cache, or
/// compiled by NVRTC and stored there.
pub fn cubin(dtype: DataType, arch: u32) -> Result<(Vec<u8>, Origin)> {
    let (maj, min) = nvrtc_version()?;
    let src = module_source(dtype);
    let arch_opt = format!("--gpu-architecture=sm_{arch}");
    let ver = format!("{maj}.{min}");
    let key = fnv64(&[
        src.as_bytes(),
        arch_opt.as_bytes(),
        ver.as_bytes(),
        OPTIONS.join(" ").as_bytes(),
    ]);
    let path = cache_dir().join(format!("{}-sm{arch}-{key:016x}.cubin", dtype.name()));
    if let Ok(bytes) = std::fs::read(&path) {
        if !bytes.is_empty() {
            return Ok((bytes, Origin::DiskCache));
        }
    }
    let bin = compile(&src, dtype.name(), &arch_opt)?;
    // A failed cache write only costs the next start a compile.
    if std::fs::create_dir_all(cache_dir()).is_ok() {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &bin).is_ok() && std::fs::rename(&tmp, &path).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok((bin, Origin::Compiled))
}

/// Compiles a standalone source for `sm_{arch}` with the executor's NVRTC
/// options, bypassing the disk cache: for examples and probes that carry
/// their own small kernels (they compile in milliseconds and change often).
pub fn compile_source(src: &str, name: &str, arch: u32) -> Result<Vec<u8>> {
    nvrtc_version()?;
    compile(src, name, &format!("--gpu-architecture=sm_{arch}"))
}

fn compile(src: &str, name: &str, arch_opt: &str) -> Result<Vec<u8>> {
    guarded("nvrtc", || {
        let csrc = std::ffi::CString::new(src).map_err(|e| CudaError::Invalid(e.to_string()))?;
        let cname = std::ffi::CString::new(format!("oxccl_{name}.cu"))
            .map_err(|e| CudaError::Invalid(e.to_string()))?;
        let prog = nvrtc::create_program(&csrc, Some(&cname))
            .map_err(|e| CudaError::NoNvrtc(format!("{e:?}")))?;
        let mut opts: Vec<String> = OPTIONS.iter().map(|s| s.to_string()).collect();
        opts.push(arch_opt.to_string());
        // SAFETY: `prog` is live until destroyed below; `csrc`/`cname` outlive it.
        let out = unsafe {
            let compiled = nvrtc::compile_program(prog, &opts);
            let result = match compiled {
                Ok(()) => {
                    let mut size = 0usize;
                    nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size)
                        .result()
                        .and_then(|()| {
                            let mut buf = vec![0u8; size];
                            nvrtc_sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast())
                                .result()
                                .map(|()| buf)
                        })
                        .map_err(|e| CudaError::Compile {
                            module: name.into(),
                            arch: arch_opt.into(),
                            log: format!("{e:?}"),
                        })
                }
                Err(e) => {
                    let log = nvrtc::get_program_log(prog)
                        .map(|l| {
                            let bytes: Vec<u8> =
                                l.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
                            String::from_utf8_lossy(&bytes).into_owned()
                        })
                        .unwrap_or_default();
                    Err(CudaError::Compile {
                        module: name.into(),
                        arch: arch_opt.into(),
                        log: format!("{e:?}: {log}"),
                    })
                }
            };
            let _ = nvrtc::destroy_program(prog);
            result
        };
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_covers_every_dtype_once() {
        for dt in DataType::ALL {
            assert_eq!(DTYPES.iter().filter(|d| d.0 == dt).count(), 1, "{dt}");
        }
    }

    #[test]
    fn module_source_instantiates_four_ops() {
        let s = module_source(DataType::Bf16);
        for op in [BaseOp::Sum, BaseOp::Prod, BaseOp::Max, BaseOp::Min] {
            assert!(s.contains(&kernel_name(DataType::Bf16, op)), "{op:?}");
        }
        assert!(s.contains("ox_exec<ox_bf16, OX_MIN>"));
        assert_eq!(
            kernel_name(DataType::F8E4M3, BaseOp::Max),
            "oxccl_exec_f8e4m3_max"
        );
    }

    #[test]
    fn module_source_defines_the_ll_path_with_the_rust_constants() {
        let s = module_source(DataType::F32);
        // The executor forward-declares the LL functions; the LL file
        // must follow it in the module.
        let (exec, ll) = (
            s.find("ox_ll_flag(u64 count);")
                .expect("forward declaration"),
            s.find("ox_ll_flag(u64 count) {").expect("definition"),
        );
        assert!(exec < ll);
        assert!(s.contains(&format!("#define OXD_LL {}", crate::encode::DESC_LL)));
        assert!(s.contains(&format!(
            "#define OX_CONN_HEADER {}",
            crate::encode::CONN_HEADER
        )));
        assert!(s.contains(&format!(
            "#define OX_MAX_CHANNELS {}",
            crate::encode::MAX_CHANNELS
        )));
        assert!(
            s.contains("% 0xFFFFFFFFull) + 1"),
            "flag formula as encode::ll_flag"
        );
    }

    #[test]
    fn cache_key_changes_with_any_part() {
        let a = fnv64(&[b"src", b"sm_90"]);
        assert_ne!(a, fnv64(&[b"src", b"sm_80"]));
        assert_ne!(fnv64(&[b"ab", b"c"]), fnv64(&[b"a", b"bc"]));
        assert_eq!(a, fnv64(&[b"src", b"sm_90"]));
    }
}
