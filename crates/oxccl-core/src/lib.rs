//! oxccl-core: the pure part of oxccl.
//!
//! Data types and reduction operators, collective descriptions, the plan IR
//! (algorithms as data), the algorithm generators, the plan checker and the
//! sequential reference interpreter. No I/O and no `unsafe`: every backend
//! executes the plans built here, so a plan proven here is proven everywhere.
#![forbid(unsafe_code)]

pub mod coll;
pub mod dtype;
pub mod element;
pub mod error;
pub mod fault;
pub mod gen;
pub mod interp;
pub mod plan;
mod race;
pub mod redop;
pub mod reference;
pub mod testkit;
pub mod trace;

pub use coll::{Algo, CollKind, Collective, Proto};
pub use dtype::DataType;
pub use element::Element;
pub use error::CoreError;
pub use fault::{describe_ranks, ranks_named, ranks_with, Awaited, FaultCause, WaitFault};
pub use gen::{generate, PlanRequest};
pub use plan::Plan;
pub use redop::{BaseOp, LoweredOp, RedOp};

// Re-exported so `with_dtype!` works in crates that do not name them.
pub use float8;
pub use half;
