//! The call check of a group (see [`crate::check`]): its collectives are
//! one call in the collective sequence (a lone collective is compared as
//! that collective, so it matches the same call made outside a group), its
//! Send/Recv are matched pair by pair.

use oxccl_core::gen::p2p::P2pOp;
use oxccl_core::RedOp;
use parking_lot::MutexGuard;

use super::{Entry, Pending};
use crate::check::{Call, CallSeq, Posted};
use crate::comm::{scalar_bits, Communicator};
use crate::error::Result;

/// One communicator's operations, as the group holds them.
type CommOps<'e, 'a> = (&'a Communicator, Vec<&'e Entry<'a>>);

/// What one communicator published.
struct Published {
    call: Option<Call>,
    posted: Vec<Posted>,
    /// The entry index of each posted record.
    who: Vec<usize>,
    /// Per entry, a send's own direct buffer id (see `Agreed::direct`).
    direct: Vec<Option<u16>>,
    registered: bool,
}

/// What one communicator's ranks agreed on.
#[derive(Debug)]
pub(super) struct Agreed {
    /// Whether every rank's collective buffers were backend memory.
    pub registered: bool,
    /// Per entry: on a send, its buffer id in this rank's plan where the
    /// receiver reads it directly; on a receive, the sender's id of the
    /// buffer to read (`p2p::Path::Direct`); `None`: through a FIFO.
    pub direct: Vec<Option<u16>>,
}

/// Publishes every communicator's calls first (one thread may drive
/// ranks that wait for each other), then compares them. Returns what
/// each communicator's ranks agreed on.
pub(super) fn group(
    comms: &[CommOps<'_, '_>],
    seqs: &mut [MutexGuard<'_, CallSeq>],
) -> Result<Vec<Agreed>> {
    let published: Vec<Published> = comms
        .iter()
        .zip(seqs.iter_mut())
        .map(|((comm, entries), seq)| publish(comm, entries, seq))
        .collect();
    let mut first_err = None;
    let mut agreed = Vec::with_capacity(comms.len());
    for (((comm, _), seq), p) in comms.iter().zip(seqs.iter_mut()).zip(&published) {
        match compare(comm, seq, p) {
            Ok(a) => agreed.push(a),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(agreed),
    }
}

fn publish(comm: &Communicator, entries: &[&Entry<'_>], seq: &mut CallSeq) -> Published {
    let mut colls = Vec::new();
    let mut posted = Vec::new();
    let mut who = Vec::new();
    let direct = super::direct_sends(comm, entries);
    let mut registered = true;
    // A digest of the group's PreMulSum scalars (0 without any).
    let mut scalars = 0u64;
    let premul = |p: &Pending| {
        matches!(
            p,
            Pending::Coll {
                op: RedOp::PreMulSum(_) | RedOp::PreMulSumDevice(_),
                ..
            }
        )
    };
    if !comm.checking() {
        // Unchecked, peers' scalars are unknown: FIFO plans (see
        // `check::calls`).
        return Published {
            call: None,
            posted,
            who,
            direct: vec![None; entries.len()],
            registered: !entries.iter().any(|e| premul(&e.pending)),
        };
    }
    for (i, e) in entries.iter().enumerate() {
        match &e.pending {
            Pending::Coll { checked, op } if checked.coll.count > 0 => {
                let c = &checked.coll;
                colls.push(Call::coll(c.kind, e.dtype, c.count, *op, c.root));
                registered &= checked.backend_memory;
                let bits = scalar_bits(*op);
                if bits != 0 {
                    scalars = scalars.rotate_left(17) ^ bits;
                }
            }
            Pending::Coll { .. } => {}
            Pending::P2p { op, .. } => {
                let (peer, count, send) = match *op {
                    P2pOp::Send { peer, count } => (peer, count, true),
                    P2pOp::Recv { peer, count } => (peer, count, false),
                };
                if count > 0 {
                    posted.push(comm.post_p2p(peer, send, count, e.dtype, direct[i]));
                    who.push(i);
                }
            }
        }
    }
    let call = match colls.len() {
        0 => None,
        1 => Some(colls[0]),
        _ => Some(Call::group(&colls)),
    };
    if let Some(c) = call {
        comm.publish_call(seq, c, registered, scalars);
    }
    Published {
        call,
        posted,
        who,
        direct,
        registered,
    }
}

fn compare(comm: &Communicator, seq: &mut CallSeq, p: &Published) -> Result<Agreed> {
    let registered = match p.call {
        Some(c) => match comm.compare_call(seq, c) {
            Ok(a) => a.registered,
            Err(e) => {
                comm.withdraw_p2p(&p.posted);
                return Err(e);
            }
        },
        None => p.registered,
    };
    let theirs = comm.compare_p2p(seq, &p.posted)?;
    let mut direct = p.direct.clone();
    for ((&i, post), id) in p.who.iter().zip(&p.posted).zip(theirs) {
        if !post.rec.send {
            direct[i] = id;
        }
    }
    Ok(Agreed { registered, direct })
}
