//! The sequential reference: what each collective must produce, computed
//! the plainest way. Every backend's tests compare against it.

use crate::coll::{CollKind, Collective};
use crate::element::Element;
use crate::redop::LoweredOp;

/// Expected output of every rank (`None` where the collective leaves that
/// rank's output undefined: non-roots of Reduce and Gather).
pub fn expected<T: Element>(
    coll: &Collective,
    inputs: &[Vec<T>],
    op: &LoweredOp,
) -> Vec<Option<Vec<T>>> {
    let n = inputs.len();
    let c = coll.count;
    let root = coll.root as usize;
    let block = |r: usize, j: usize| &inputs[r][j * c..(j + 1) * c];
    let reduce_blocks = |j: usize| {
        let parts: Vec<&[T]> = (0..n).map(|r| block(r, j)).collect();
        op.reference(&parts, c)
    };
    (0..n)
        .map(|r| match coll.kind {
            CollKind::AllReduce => Some(reduce_blocks(0)),
            CollKind::Reduce => (r == root).then(|| reduce_blocks(0)),
            CollKind::Broadcast => Some(inputs[root][..c].to_vec()),
            CollKind::AllGather => Some((0..n).flat_map(|j| block(j, 0).to_vec()).collect()),
            CollKind::Gather => {
                (r == root).then(|| (0..n).flat_map(|j| block(j, 0).to_vec()).collect())
            }
            CollKind::ReduceScatter => Some(reduce_blocks(r)),
            CollKind::Scatter => Some(block(root, r).to_vec()),
            CollKind::AllToAll => Some((0..n).flat_map(|j| block(j, r).to_vec()).collect()),
            // Send/Recv has no collective meaning: its tests build their own expectation.
            CollKind::SendRecv => None,
        })
        .collect()
}
