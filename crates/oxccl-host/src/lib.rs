//! oxccl-host: see docs/ARCHITECTURE.md.
