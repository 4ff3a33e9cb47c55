//! oxccl-topo: see docs/ARCHITECTURE.md.
#![forbid(unsafe_code)]
