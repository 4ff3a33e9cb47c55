//! The call check's per-call CPU work as plain functions, for the
//! criterion benchmarks in `benches/` (reached through
//! `oxccl::call_check`, hidden from the docs): packing a call into the
//! board's words, reading every rank's words back and comparing them, and
//! a group's digest. Not part of the API.

use oxccl_core::{CollKind, DataType, RedOp};

use super::Call;

/// A collective's fingerprint as a rank publishes it (registered buffers).
pub fn fingerprint(
    kind: CollKind,
    dtype: DataType,
    count: usize,
    op: RedOp,
    root: u32,
) -> [u64; 3] {
    Call::coll(kind, dtype, count, op, root).encode(true)
}

/// Whether every rank's words describe the same call, as each rank reads
/// them off the board.
pub fn agree(words: &[[u64; 3]]) -> bool {
    let mut calls = words.iter().map(|w| Call::decode(*w).map(|(c, _)| c));
    let Some(first) = calls.next() else {
        return true;
    };
    first.is_some() && calls.all(|c| c == first)
}

/// The fingerprint of a group of `n` AllReduces of distinct counts.
pub fn group_digest(n: usize) -> [u64; 3] {
    let calls: Vec<Call> = (0..n)
        .map(|i| Call::coll(CollKind::AllReduce, DataType::F32, 1024 + i, RedOp::Sum, 0))
        .collect();
    Call::group(&calls).encode(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agreement_is_decided_by_every_field() {
        let w = fingerprint(CollKind::Reduce, DataType::Bf16, 4096, RedOp::Max, 3);
        assert!(agree(&[w; 4]));
        let other = fingerprint(CollKind::Reduce, DataType::Bf16, 4096, RedOp::Max, 2);
        assert!(!agree(&[w, w, other]));
        assert_ne!(group_digest(3), group_digest(4));
    }
}
