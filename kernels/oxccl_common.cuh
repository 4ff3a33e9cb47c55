// oxccl device-side definitions shared by every kernel, after the
// generated layout.
//
// Every record the host writes or reads (OxStep, OxOperand, OxChan, OxConn,
// OxSem, OxError, OxDesc), every constant both sides use, and the
// fixed-width integer names (NVRTC compiles without the toolkit headers)
// are generated from crates/oxccl-cuda/src/layout.rs and placed before
// this file in every module's source (kernels.rs, module_source). Only
// what the device alone uses is defined here.

// A channel with at most this many steps and operands is copied into
// shared memory at block start (12 KiB), one parallel load for the
// whole call instead of dependent loads per step; larger ones are read
// from global memory as they run.
#define OX_STAGE_STEPS 256
#define OX_STAGE_OPS 512

// A buffer address without its allocation's tag (OX_TAG_SHIFT).
#define OX_ADDR_MASK ((1ull << OX_TAG_SHIFT) - 1)
