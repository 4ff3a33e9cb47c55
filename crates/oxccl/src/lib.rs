//! oxccl: see docs/ARCHITECTURE.md.
