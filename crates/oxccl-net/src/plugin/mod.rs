//! Hosting NCCL's network plugins (`ncclNet` v8 to v12): the libraries
//! clusters install for their fabric (InfiniBand, EFA, Slingshot…).
//!
//! - [`abi`]: the C layouts, as `#[repr(C)]` Rust.
//! - [`load`]: finding a library (`NCCL_NET_PLUGIN`) and taking the
//!   newest table it exports that oxccl speaks.
//! - [`PluginNet`]: a plugin behind the [`crate::Net`] interface.
//! - [`select`]: which network a communicator uses, with NCCL's
//!   fallbacks to the built-in TCP transport.
//! - `log`: the debug logger passed to `init`, forwarded to `tracing`.

pub mod abi;
pub mod load;
mod log;
mod net;
mod select;

pub use load::{LoadFailure, PluginLib, NEWEST, OLDEST};
pub use net::PluginNet;
pub use select::{select, Selection, BUILT_IN};
