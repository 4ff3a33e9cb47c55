//! oxccl-topo: the machine as a graph, and the choices made on it.
#![forbid(unsafe_code)]

pub mod consts;
pub mod error;
pub mod graph;
pub mod paths;
pub mod presets;
pub mod report;
pub mod xml;

pub use error::{Result, TopoError};
pub use graph::{Attrs, LinkKind, Node, NodeId, NodeKind, NvLinkGen, Topology};
pub use paths::{Path, PathClass};
