//! oxccl-cuda: the CUDA backend.
//!
//! Plans from `oxccl-core` run on the GPU through one kernel launch per
//! operation: block `c` of the launch walks channel `c`'s steps (see
//! `kernels/oxccl_exec.cuh`). Kernels are NVRTC-compiled from the embedded
//! `kernels/` sources for the device's own architecture at first use and
//! cached on disk. cudarc loads `libcuda`/`libnvrtc` at run time, so the
//! crate builds and its CPU tests pass on machines without CUDA; there,
//! [`available`] returns [`CudaError::NoDriver`] and nothing panics.
//!
//! FIFO connections run the Simple or the LL protocol, chosen per plan
//! upload ([`World::prepare_proto`]). Before `cuInit`, [`driver::init`]
//! sets `CUDA_DEVICE_MAX_CONNECTIONS=32` unless the user set it, so up to
//! 31 rank streams of a GPU never share a hardware queue (ranks on one GPU
//! spin on each other); past that, launches go in step (`world/gate.rs`). [`topo_probe`] gives the driver's view of the topology. The
//! NCCL baseline and the latency experiments live in `oxccl-bench`.
//! See docs/ARCHITECTURE.md, section oxccl-cuda.
#![doc = include_str!("BACKEND.md")]

pub mod device;
pub mod driver;
pub mod encode;
pub mod error;
pub mod ipc;
pub mod kernels;
pub mod layout;
pub mod vmm;
pub mod world;

pub use device::{
    available, device_or_skip, gpu_gate, skip_or_fail, CudaInfo, DeviceInfo, GpuGate,
    REQUIRE_GPU_VAR,
};
pub use error::{CudaError, Result};
pub use world::{
    default_heap_bytes, Exchange, GateMode, Party, Prepared, Shared, World, WorldConfig,
    EXPORT_BYTES, HEAP_VAR, LAST_TAG, MAX_RESIDENT_KERNELS,
};
pub mod topo_probe;
pub use topo_probe::{detect_topology, driver_facts};
