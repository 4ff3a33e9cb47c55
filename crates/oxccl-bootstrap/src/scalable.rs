//! One communicator's rendezvous spread over several roots (NCCL's
//! `ncclCommInitRankScalable`): every rank passes the same ids, and root
//! `b` serves a block of consecutive ranks, as NCCL assigns them (the
//! first `nranks % nroots` roots one rank more than the others).
//!
//! 1. Block 0's ranks and the first rank of every other block (its
//!    leader) meet at root 0; each other block meets at its own root.
//! 2. Every rank's final descriptor (with a fresh ring listener) goes to
//!    its block's leader, the blocks' tables go around the leaders'
//!    ring, and each leader hands the whole table down its block.
//! 3. The ranks connect in one ring, as after a single root, and the
//!    meeting bootstraps are dropped.
//!
//! So no root sees more than its block (and root 0 the leaders), and the
//! result is an ordinary [`Bootstrap`]. Each step has the caller's
//! deadline. A block of one rank contacts no root (as any 1-rank
//! bootstrap): its root gives up at its deadline, unused.

use std::time::Instant;

use crate::desc::{decode_descs, decode_table, encode_table, DeviceInfo, RankDesc};
use crate::error::BootstrapError;
use crate::fdpass::FdMailbox;
use crate::id::UniqueId;
use crate::ring::{check_ranks, listen_like, subset_magic, Bootstrap};

/// The ranks root `b` of `nroots` serves: `(first rank, count)`.
pub fn root_block(b: u32, nranks: u32, nroots: u32) -> (u32, u32) {
    let (per, extra) = (nranks / nroots, nranks % nroots);
    let first = b * per + b.min(extra);
    (first, per + u32::from(b < extra))
}

/// The root of `nroots` that serves `rank`.
pub fn root_of(rank: u32, nranks: u32, nroots: u32) -> u32 {
    let (per, extra) = (nranks / nroots, nranks % nroots);
    let big = extra * (per + 1);
    if rank < big {
        rank / (per + 1)
    } else {
        extra + (rank - big) / per
    }
}

impl Bootstrap {
    /// Joins the rendezvous of `ids` (every rank passes the same ids, at
    /// most one per rank) as `rank` of `nranks`. One id, or all alike, is
    /// [`Bootstrap::init`].
    pub fn init_scalable(
        ids: &[UniqueId],
        nranks: u32,
        rank: u32,
        dev: &DeviceInfo,
        limit: std::time::Duration,
    ) -> Result<Bootstrap, BootstrapError> {
        check_ranks(nranks, rank)?;
        let bad = |m: String| Err(BootstrapError::InvalidArgument(m));
        let Some(first_id) = ids.first() else {
            return bad("no unique id: at least one is needed".into());
        };
        if ids.len() > nranks as usize {
            return bad(format!(
                "{} ids for {nranks} ranks: at most one per rank",
                ids.len()
            ));
        }
        if nranks == 1 || ids.iter().all(|i| i == first_id) {
            return Bootstrap::init(first_id, nranks, rank, dev, limit);
        }
        for (i, id) in ids.iter().enumerate() {
            if let Some(j) = ids[..i].iter().position(|x| x == id) {
                return bad(format!("ids {j} and {i} are the same id"));
            }
        }
        let limit = crate::clamp(limit);
        let nroots = ids.len() as u32;
        let b = root_of(rank, nranks, nroots);
        let (first, size) = root_block(b, nranks, nroots);
        let local = rank - first;
        let root0 = first_id.info()?;
        let (listener, desc) = listen_like(root0.root, rank, dev)?;
        let mine = encode_table(std::slice::from_ref(&desc));

        // 1. The meetings: the leaders' (with block 0) and the block's.
        let m0 = root_block(0, nranks, nroots).1;
        let leaders = (b == 0 || local == 0)
            .then(|| {
                let at = if b == 0 { local } else { m0 + b - 1 };
                Bootstrap::init(first_id, m0 + nroots - 1, at, dev, limit)
            })
            .transpose()?;
        let block = (b > 0 && size > 1)
            .then(|| Bootstrap::init(&ids[b as usize], size, local, dev, limit))
            .transpose()?;

        // 2. Descriptors up to the leaders, around them, and back down.
        let up = match &block {
            Some(x) => concat(x.all_gather(&mine)?)?,
            None => mine,
        };
        let table = match &leaders {
            Some(l) => {
                let all = concat(l.all_gather(&up)?)?;
                // Checked here, so a leader hands down only a whole table.
                decode_table(&all, nranks).map_err(|err| BootstrapError::Wire {
                    rank,
                    from: "the leaders' tables".into(),
                    err,
                })?;
                match &block {
                    Some(x) => x.broadcast(0, &all)?,
                    None => all,
                }
            }
            None => block
                .as_ref()
                .map_or(Ok(Vec::new()), |x| x.broadcast(0, &[]))?,
        };
        let descs = decode_table(&table, nranks).map_err(|err| BootstrapError::Wire {
            rank,
            from: format!("block {b}'s leader"),
            err,
        })?;
        drop((leaders, block));

        // 3. One ring, under a magic of its own (the meetings' mailboxes
        // and connections used root 0's).
        let magic = subset_magic(root0.magic, 0, &[nranks, nroots]);
        let key = root0.key.derive(
            "scalable ring",
            &[&nranks.to_le_bytes(), &nroots.to_le_bytes()],
        );
        let mailbox = FdMailbox::new(&key, root0.root.port(), rank, &descs)?.with_limit(limit);
        let deadline = Instant::now() + limit;
        Bootstrap::linked(
            magic,
            key,
            limit,
            deadline,
            descs,
            rank,
            listener,
            mailbox,
            dev.wait_warn,
        )
    }
}

/// Tables gathered from several ranks, as one table in their order.
fn concat(parts: Vec<Vec<u8>>) -> Result<Vec<u8>, BootstrapError> {
    let mut all: Vec<RankDesc> = Vec::new();
    for p in &parts {
        all.extend(decode_descs(p).map_err(|err| BootstrapError::Wire {
            rank: u32::MAX,
            from: "a gathered table".into(),
            err,
        })?);
    }
    Ok(encode_table(&all))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_nccls() {
        // 5 ranks on 2 roots: {0, 1, 2} and {3, 4}; on 3 roots: 2, 2, 1.
        let of = |n, k| (0..n).map(|r| root_of(r, n, k)).collect::<Vec<_>>();
        assert_eq!(of(5, 2), [0, 0, 0, 1, 1]);
        assert_eq!(of(5, 3), [0, 0, 1, 1, 2]);
        assert_eq!(of(4, 4), [0, 1, 2, 3]);
        assert_eq!(of(8, 1), [0; 8]);
        for n in 1..40 {
            for k in 1..=n {
                let mut next = 0;
                for b in 0..k {
                    let (first, size) = root_block(b, n, k);
                    assert_eq!(first, next, "n={n} k={k} b={b}");
                    assert!(size >= 1);
                    for r in first..first + size {
                        assert_eq!(root_of(r, n, k), b, "n={n} k={k} r={r}");
                    }
                    next = first + size;
                }
                assert_eq!(next, n);
            }
        }
    }
}
