//! oxccl: collective communications for GPUs, in the style of NCCL, in Rust.
//!
//! Each rank's thread calls collectives on its own [`Communicator`]. With
//! buffers from [`Communicator::alloc`] the same code runs on every backend:
//!
//! ```
//! let comms = oxccl::init_all(4).unwrap();
//! std::thread::scope(|s| for c in &comms { s.spawn(move || {
//!     let b = c.alloc::<f32>(1024).unwrap();
//!     b.copy_from_slice(&vec![c.rank() as f32; 1024]).unwrap();
//!     c.all_reduce_in_place(&b, oxccl::RedOp::Sum).unwrap();
//!     assert_eq!(b.to_vec().unwrap(), vec![6.0; 1024]); // ordered after the call
//! }); });
//! ```
//!
//! # Backends, buffers and streams
//!
//! [`init_all_with`] picks a backend through [`Config::backend`]: `Host`
//! (ranks are threads of this process; what CI runs), `Cuda` (ranks
//! round-robin over the visible GPUs, several ranks may share one), or
//! `Auto`, the default (CUDA when a device is present, else host). Code
//! written against [`Buffer`]s runs on both:
//!
//! - **Buffers.** [`Communicator::alloc`] returns a [`Buffer<T>`]: host
//!   memory on the host backend, `cuMemAlloc` device memory on CUDA
//!   (registered on both, so the registered one-shot, two-shot and
//!   all-pairs plans may use it, like `ncclMemAlloc`). Fill and read it
//!   with `copy_from_slice`/`to_vec`; take views at any element offset
//!   with `slice(range)`. On the host backend
//!   plain `&[T]`/`&mut [T]` are accepted too (not registered, so only
//!   FIFO plans); on CUDA they are refused with [`Error::ForeignBuffer`].
//! - **Streams.** On the host backend a call runs on the calling thread and
//!   completes before it returns. On CUDA each communicator (rank) has its
//!   own non-blocking stream; a call is enqueued there as one kernel launch
//!   and returns at once; [`Communicator::synchronize`] waits for it, and
//!   `to_vec`/`copy_from_slice` run on that stream, ordered after work
//!   already issued. Code that
//!   calls `synchronize` where it needs results is correct on both.
//! - **In place.** Pass the same buffer (or NCCL's in-place layout:
//!   AllGather's send is the rank's block of the receive buffer,
//!   ReduceScatter's receive is the rank's block of the send buffer);
//!   the `*_in_place` methods do it for plain slices. Any other overlap is
//!   [`Error::InvalidInPlace`].
//!
//! # Element types
//!
//! Buffers hold any [`Element`]: `i8`, `u8`, `i32`, `u32`, `i64`, `u64`,
//! `f32`, `f64`, and, re-exported here, [`f16`](struct@f16) and [`bf16`] (16-bit
//! floats) and [`F8E4M3`] and [`F8E5M2`] (8-bit floats), as NCCL's twelve
//! `ncclDataType_t`s. 16- and 8-bit values are combined in f32 and
//! rounded back after each operation, bit for bit alike on every backend.
//!
//! # More than the collectives
//!
//! [`Communicator::barrier`]; per-call [`Completion`] handles
//! ([`Communicator::completion`]: a CUDA event on the rank's stream,
//! `wait`/`is_done`, beside `synchronize`); variable-size all-to-all
//! ([`Communicator::all_to_all_v`], over grouped Send/Recv); PreMulSum with
//! a scalar in memory ([`Communicator::premul_sum_op`]). Runnable
//! programs: `cargo run -p oxccl --example data_parallel` and
//! `--example zero` (host backend without a GPU).
//!
//! # Validation
//!
//! Every argument is checked here, once, before anything runs; each rule
//! has its own [`Error`] variant and nothing is written when a check fails.
//! Defined op/type pairs: Sum, Prod, Max, Min and Avg on every type (Avg on
//! integers sums then divides with truncation, as NCCL); PreMulSum needs a
//! finite scalar, integral and in range on integer types.
//!
//! # Mismatched calls
//!
//! Every call is compared with the peers' before any data moves (see
//! [`Error::Mismatch`]): a rank calling Broadcast while the others call
//! AllReduce, or counts, types, ops or roots that differ, or a send whose
//! receive has another count (or never comes while the peer enters a
//! collective), is an error on every rank involved, naming the ranks and
//! what each called; nothing is written and the communicator stays
//! usable. The check costs one small record per call, read by every rank;
//! [`Config::check_calls`] (`OXCCL_CHECK_CALLS=0`) turns it off. It covers
//! ranks as threads and ranks as processes of one host (records in shared
//! memory); ranks that talk over the network (other hosts, or
//! `NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1`) check only with
//! `OXCCL_CHECK_CALLS=all` on every rank
//! ([`Config::check_calls_across_hosts`]: records mirrored over TCP, n − 1
//! small messages per rank and collective), else run unchecked, said at
//! init.
//! Zero-count calls are no-ops and take no part in it. A rank whose
//! communicator is destroyed or dropped is named at once by the peers
//! waiting for it (threads, or processes of one host), not at the deadline.
//!
//! # Threads
//!
//! [`Communicator`] is `Send` and `Sync`. Calls from several threads on one
//! communicator are ordered: each holds the communicator for its whole
//! length (on CUDA, until it is enqueued), so they never run into each
//! other. Which runs first is up to the threads, so every rank must see
//! the same order: concurrent different calls usually come out as a
//! mismatch on some ranks, never as corruption or an internal error.
//!
//! # Groups
//!
//! [`group()`] (or [`Group`]) issues several operations together: grouped
//! Send/Recv (all-to-all exchanges, rings) and collectives, on one or
//! several communicators driven by one thread. See [`mod@group`] for how
//! they run.
//!
//! # Ranks as processes
//!
//! A communicator whose ranks are processes is made by one process's
//! [`UniqueId::new`], handed to the others by any means (a file, MPI, a
//! key-value store; [`UniqueId::to_bytes`]), and [`Communicator::init_rank`]
//! in each; [`init_from_env`] does it from a launcher's variables (torchrun,
//! Open MPI, PMI, Slurm: see [`LaunchEnv::from_vars`]), and
//! [`Communicator::split`] makes sub-communicators. The ranks meet over TCP
//! and run on the host backend across processes (buffers in shared memory)
//! or on CUDA (every rank with a device). A 1-rank communicator contacts no
//! root and never reads its id.
//!
//! The usual way is one process per rank, started by a launcher, each
//! calling [`init_from_env`]: it reads the rank, the rank count and the
//! local rank from the launcher's variables, and where rank 0's root
//! listens from `NCCL_COMM_ID=host:port`, else `MASTER_ADDR` with the
//! root at `MASTER_PORT + 1`. The same program under each launcher:
//!
//! ```no_run
//! fn main() -> oxccl::Result<()> {
//!     let comm = oxccl::init_from_env()?;
//!     let n = 1 << 20;
//!     let b = comm.alloc::<f32>(n)?;
//!     b.copy_from_slice(&vec![comm.rank() as f32; n])?;
//!     comm.all_reduce_in_place(&b, oxccl::RedOp::Sum)?;
//!     let sum = b.to_vec()?; // ordered after the call
//!     let want = (0..comm.nranks()).sum::<u32>() as f32;
//!     assert!(sum.iter().all(|&x| x == want));
//!     Ok(())
//! }
//! ```
//!
//! ```text
//! # torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
//! torchrun --nproc-per-node=8 --no-python ./my_prog
//! torchrun --nnodes=2 --nproc-per-node=8 --rdzv-endpoint=node0:29500 --no-python ./my_prog
//! # Open MPI sets OMPI_COMM_WORLD_*; say where rank 0's root listens
//! mpirun -np 8 -x NCCL_COMM_ID=node0:29600 -x OXCCL_COMM_SECRET ./my_prog
//! # MPICH/Hydra (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID)
//! mpiexec -n 8 -genv NCCL_COMM_ID node0:29600 ./my_prog
//! # Slurm sets SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
//! NCCL_COMM_ID=$(scontrol show hostnames | head -1):29600 srun -N 2 --ntasks-per-node=8 ./my_prog
//! ```
//!
//! With `NCCL_COMM_ID` no id is exchanged, so set `OXCCL_COMM_SECRET` (the
//! same string on every rank) on networks others can reach: the README's
//! security section says why. A program that already has a channel between
//! its ranks (MPI, a key-value store) can instead make a [`UniqueId`] on
//! rank 0, send its bytes, and call [`Communicator::init_rank`].
//!
//! # Configuration
//!
//! [`Config`] overrides algorithm, protocol, channels and deadline; build
//! one with types through [`Config::builder`] (its argument types,
//! [`BackendKind`], [`Algo`], [`Proto`], [`CollKind`] and [`DebugLevel`],
//! are all re-exported here), or read NCCL's and oxccl's variables with
//! [`Config::from_env`] (what [`init_all`] does; see [`config`] for the
//! variables and the `NCCL_ALGO`/`NCCL_PROTO` syntax). [`Config::default`]
//! and the builder start from:
//!
//! | field | default | meaning |
//! | --- | --- | --- |
//! | `backend` | [`BackendKind::Auto`] | CUDA when a device is present, else host |
//! | `algo`, `proto` | every algorithm and protocol | the selector chooses among what they allow |
//! | `channels` | `None` | the selector chooses, capped by the backend |
//! | `deadline` | 300 s | every wait gives up with an error after it ([`config::NO_DEADLINE`]: never) |
//! | `wait_warn` | 10 s, then every minute | a wait for absent peers (in a call, or at init's rendezvous) warns on stderr, naming them and the call |
//! | `chunk_bytes` | `None` | the backend's FIFO slot; larger pieces for direct plans |
//! | `debug` | `None` | no log subscriber is installed (see Logging below) |
//! | `check_calls` | `true` | every call is compared with the peers' first |
//! | `check_calls_across_hosts` | `false` | not between ranks that talk over the network |
//! | `topology` | `None` | detected from the machine |
//! | `cuda.device` | `None` | ranks as processes take their host's GPUs round-robin; `Some(d)` (or [`ConfigBuilder::device`]) runs this rank on device `d`, as the C ABI does with the thread's current device; [`init_all_on_devices`] places threads |
//!
//! Algorithms ([`Algo`]) and protocols ([`Proto`]), with the names
//! `NCCL_ALGO`/`NCCL_PROTO` (and [`Algo::from_str`](std::str::FromStr)) take,
//! case-insensitive:
//!
//! | `Algo` | names | `Proto` | names |
//! | --- | --- | --- | --- |
//! | `Ring` | `ring` | `Simple` | `simple` |
//! | `Chain` | `chain` | `LL` | `ll` |
//! | `BinaryTree` | `btree`, `binarytree` | `LL128` | `ll128` (in `NCCL_PROTO`: no backend runs it, ignored with a warning) |
//! | `DoubleBinaryTree` | `tree` (NCCL's Tree), `dbtree`, `doublebinarytree` | | |
//! | `OneShot` | `oneshot`, `one_shot` | | |
//! | `TwoShot` | `twoshot`, `two_shot` | | |
//! | `AllPairs` | `allpairs`, `all_pairs`, `direct` | | |
//!
//! Values written for NCCL work unchanged: NCCL algorithms and protocols
//! oxccl lacks (`nvls`, `collnet`, `pat`, `ll128`) are ignored with a
//! warning printed to stderr (unless `NCCL_DEBUG=NONE`), and every value
//! is checked before a communicator exists. Each collective's algorithm,
//! protocol and channel count come from the selection policy (the cost
//! model of the machine), among what the configuration and the backend
//! allow (protocols: Simple on the host backend, Simple and LL on CUDA).
//!
//! # Logging, and where warnings go
//!
//! oxccl logs through `tracing`, and prints nothing unless a subscriber
//! listens: set `OXCCL_DEBUG` (else `NCCL_DEBUG`) to one of NCCL's levels
//! `NONE`, `VERSION`, `WARN`, `ABORT`, `INFO`, `TRACE` (or
//! [`ConfigBuilder::debug`] with a [`DebugLevel`]) and oxccl installs one
//! that writes to **stderr**, once per process, unless the application
//! installed its own (which then gets the same events). INFO and TRACE
//! lines show for the subsystems `NCCL_DEBUG_SUBSYS` names (NCCL's syntax
//! and default, `INIT,BOOTSTRAP,ENV`: each call's line is `COLL`'s).
//! Profilers see every API call as an NVTX range and NCCL's profiler
//! plugins are driven unchanged; `OXCCL_TRACE` writes a step trace (see
//! [`observe`]). Warnings are
//! `WARN` events, with one exception printed to stderr even without a
//! subscriber: a wait for peers that have not reached a call warns after
//! 10 s and then every minute (`Config::wait_warn`), naming the ranks and
//! the call; calls a backend enqueues (CUDA) get the same warning from a
//! watchdog thread when they have not completed by then. The error at the
//! deadline itself is always returned; a peer whose call was refused
//! (alone or inside a group), or failed on it after every rank agreed on
//! the call (its launch), makes the others fail at once
//! ([`Error::PeerFailed`], [`Error::blamed_rank`]). At `INFO` each call
//! logs what it is and its choice: `oxccl: reduce(sum, root 2) of 1024 x
//! float: algo ring proto simple channels 1 predicted 3.1 us`, marked
//! `(override)` when the configuration restricted it and, on the host
//! backend, `(host-model estimate, not GPU time)`. `TRACE` adds each call's
//! agreement between ranks.
//!
//! The crate's internals, file by file, are mapped in the repository's
//! `docs/ARCHITECTURE.md` and `crates/oxccl/src/FACADE.md`.

mod alltoallv;
pub mod backend;
mod blame;
mod buffer;
mod check;
mod comm;
mod completion;
pub mod config;
mod debug;
pub mod error;
/// Entry points for fuzzing the call check's decoders; not part of the API.
#[doc(hidden)]
pub mod fuzz {
    pub use crate::check::fuzz::{fingerprint, mirror_frame, shared_record};
}
pub mod group;
mod init;
#[cfg(feature = "cudarc")]
mod interop;
pub mod observe;
mod ops;
mod plans;
mod raw;
mod recent;
mod register;
mod registry;
mod select;
pub mod settings;
mod shrink;
mod sink;
mod split_threads;
mod typed;
mod validate;
mod watchdog;
mod window;

pub use backend::{BackendKind, RawStream};
pub use buffer::{Buffer, In, Out, Slice};
pub use comm::{init_all, init_all_on, init_all_on_devices, init_all_with, Communicator};
pub use completion::Completion;
pub use config::{Config, ConfigBuilder, DebugLevel, WaitWarn};
pub use error::{Error, Result};
pub use group::{group, Group};
pub use init::{init_from_env, init_from_env_with, LaunchEnv, UniqueId};
/// Most ranks a communicator may have.
pub use oxccl_bootstrap::MAX_RANKS;
pub use raw::RawColl;
pub use register::Registration;
pub use select::{Choice, Transport};
pub use window::{
    Window, WIN_COLL_SYMMETRIC, WIN_DEFAULT, WIN_REQUIRED_ALIGNMENT, WIN_STRICT_ORDERING,
};

/// The call check's CPU work, for the benchmarks in `benches/` only; not
/// part of the API.
#[doc(hidden)]
pub use check::bench as call_check;
/// The pure core (plan IR, generators, test support), for tools and tests.
pub use oxccl_core as core;
pub use oxccl_core::{Algo, CollKind, DataType, Element, Proto, RedOp};

/// The element types beside Rust's own (`i8`, `u8`, `i32`, `u32`, `i64`,
/// `u64`, `f32`, `f64`): 16-bit floats from the `half` crate and 8-bit
/// floats from the `float8` crate, NCCL's `ncclFloat16`, `ncclBfloat16`,
/// `ncclFloat8e4m3` and `ncclFloat8e5m2`. Every [`Element`] type is one of
/// these twelve.
pub use oxccl_core::float8::{F8E4M3, F8E5M2};
pub use oxccl_core::half::{bf16, f16};

/// This machine's topology: `OXCCL_TOPO_FILE`/`NCCL_TOPO_FILE`, else sysfs
/// and NVML, with the CUDA driver's ordinals and peer access merged in
/// when a driver is present. Never panics (a bad setting elsewhere in the
/// environment is ignored here).
pub fn detect_topology() -> oxccl_topo::Topology {
    let env = settings::Environment::capture();
    let file = Config::from_vars(|k| env.get(k))
        .ok()
        .and_then(|c| c.topology_file);
    oxccl_cuda::detect_topology(file.as_deref())
}
