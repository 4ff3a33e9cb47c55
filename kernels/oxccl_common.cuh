// oxccl device-side definitions shared by every kernel.
//
// NVRTC compiles these sources without the CUDA toolkit headers, so the
// fixed-width integer names are defined here. The structs below are the
// device encoding of a plan; crates/oxccl-cuda/src/encode.rs mirrors them
// with #[repr(C)] types and a layout test, so both sides must change together.

typedef signed char i8;
typedef unsigned char u8;
typedef short i16;
typedef unsigned short u16;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

#define OX_THREADS 512
#define OX_MAX_BUFS 64
#define OX_MAX_OPERANDS 32
// Channel records a launch parameter carries (one block per channel).
#define OX_MAX_CHANNELS 32
#define OX_CONN_HEADER 256
// A channel with at most this many steps and operands is copied into
// shared memory at block start (12 KiB), one parallel load for the
// whole call instead of dependent loads per step; larger ones are read
// from global memory as they run.
#define OX_STAGE_STEPS 256
#define OX_STAGE_OPS 512

// Operand kinds.
#define OXK_LOCAL 0
#define OXK_CONN 1
#define OXK_REMOTE 2

// Step kinds.
#define OXS_XFER 0
#define OXS_SIGNAL 1
#define OXS_WAIT 2
// Exchange len elements between operand 0 (local) and operand 1 (a
// peer's buffer); nsrc = 2, ndst = 0.
#define OXS_SWAP 3

// Operand flags / step flags.
#define OXF_PRE 1
#define OXF_POST 1

// Descriptor flags.
#define OXD_PRE 2
// Some peer is on another GPU: fences and counter accesses need system
// scope; with every rank on one GPU, device scope is enough and cheaper.
#define OXD_SYS 4
// FIFO connections run the LL protocol (kernels/oxccl_ll.cuh): conns[]
// point to LL connections and slot_bytes is the LL slot stride.
#define OXD_LL 8

// Error codes written into OxError.code.
#define OXE_TIMEOUT 1
#define OXE_ABORTED 2
#define OXE_PEER_FAILED 3

// One source or destination of a transfer. 16 bytes.
//  LOCAL:  bufs[buf] + off elements.
//  CONN:   off = the OxConn's address (resolved on the host at upload),
//          idx = connection table index, buf = peer rank (for errors).
//  REMOTE: idx = peer rank, buf = buffer id in the peer's table.
struct OxOperand {
  u8 kind;
  u8 flags;
  u16 buf;
  u32 idx;
  u64 off;
};

// One step. 16 bytes. XFER, SWAP: operands [first, first+nsrc+ndst). SIGNAL/WAIT:
// len = the OxSem's address (resolved on the host at upload), first = peer
// rank (for errors), nsrc = steps left in its
// run of consecutive signals (waits) from here, at most 255 (so a run's
// first step holds the run's length), ndst (waits) = earlier waits of the
// run on the same semaphore. encode.rs (mark_runs) fills them in.
struct OxStep {
  u8 op;
  u8 nsrc;
  u8 ndst;
  u8 flags;
  u32 first;
  u64 len;
};

// A channel's steps and, contiguous, the operands of its transfers.
struct OxChan {
  u32 first;
  u32 nsteps;
  u32 op_first;
  u32 nops;
};

// A FIFO connection, in the receiver's memory. The slots follow the
// header. Counters only grow: no reset between calls or graph replays.
// An LL connection has the same header; its receiver polls the slots'
// flags instead of `tail`, which only its sender reads.
struct OxConn {
  u64 tail;  // messages posted; written by the sender
  u64 pad0[15];
  u64 head;  // messages consumed; written by the receiver
  u64 pad1[15];
};

// A one-sided semaphore (channel, from -> to), in the waiter's memory.
struct OxSem {
  u64 posted;    // bumped by the signaller
  u64 pad0[15];
  u64 consumed;  // waits completed; written by the waiter only
  u64 pad1[15];
};

// First error of a launch; device memory of the rank, read by the host.
struct OxError {
  u32 code;
  u32 rank;
  u32 peer;
  u32 channel;
  u32 step;
  u32 pad;
  u64 waited_ns;
};

// Per-launch descriptor, passed by value as a __grid_constant__ parameter.
// The channel records ride in it (read from the constant bank, no memory
// round trip before a block knows where its steps are); steps and
// operands are in the uploaded blob.
struct OxDesc {
  const OxStep* steps;
  const OxOperand* ops;
  u64* ptr_table;            // [nranks][OX_MAX_BUFS] buffer bases, for remote steps
  const volatile u32* abort_flag;  // host-mapped; non-zero: abort
  volatile u32* world_fail;  // set by any rank that failed, polled by all
  OxError* err;
  u64 scale_bits;            // pre-scale as the element type's bits
  u64 timeout_ns;
  u64 slot_bytes;
  u32 rank;
  u32 nranks;
  u32 nbufs;
  u32 flags;
  u32 post_div;
  u32 nslots;
  u64 bufs[OX_MAX_BUFS];
  OxChan chans[OX_MAX_CHANNELS];
};
// Layout checks: encode.rs asserts the same numbers on the Rust side.
static_assert(sizeof(OxOperand) == 16, "OxOperand layout");
static_assert(sizeof(OxStep) == 16, "OxStep layout");
static_assert(sizeof(OxChan) == 16, "OxChan layout");
static_assert(sizeof(OxConn) == OX_CONN_HEADER, "OxConn layout");
static_assert(sizeof(OxSem) == 256, "OxSem layout");
static_assert(sizeof(OxError) == 32, "OxError layout");
static_assert(sizeof(OxDesc) == 1120, "OxDesc layout");
