//! oxccl-cuda: see docs/ARCHITECTURE.md.
