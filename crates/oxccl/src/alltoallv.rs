//! Variable-size all-to-all (`MPI_Alltoallv`, torch's `all_to_all_single`
//! with splits) as one group of Send/Recv, so each pair is matched (and
//! checked) like any Send/Recv.

use oxccl_core::Element;

use crate::buffer::{In, Out};
use crate::comm::Communicator;
use crate::error::{Error, Result};

/// Checks one side's counts and displacements against its buffer of
/// `len` elements; returns the blocks `(peer, displacement, count)` that
/// carry data.
fn blocks(
    what: &'static str,
    counts: &[usize],
    displs: &[usize],
    len: usize,
    nranks: usize,
) -> Result<Vec<(usize, usize, usize)>> {
    for (name, v) in [("counts", counts), ("displacements", displs)] {
        if v.len() != nranks {
            return Err(Error::InvalidLayout {
                what,
                detail: format!("{} {name} given, one per rank ({nranks}) needed", v.len()),
            });
        }
    }
    let mut out = Vec::new();
    for (p, (&c, &d)) in counts.iter().zip(displs).enumerate() {
        if d.checked_add(c).is_none_or(|end| end > len) {
            return Err(Error::InvalidLayout {
                what,
                detail: format!(
                    "the block of rank {p} (displacement {d}, count {c}) ends past the buffer's {len} elements"
                ),
            });
        }
        if c > 0 {
            out.push((p, d, c));
        }
    }
    Ok(out)
}

impl Communicator {
    /// Rank `p` receives `send_counts[p]` elements of `send` starting at
    /// `send_displs[p]`; this rank receives `recv_counts[q]` elements from
    /// rank `q` into `recv` at `recv_displs[q]`. Rank `q`'s
    /// `send_counts[r]` must equal rank `r`'s `recv_counts[q]` (a
    /// difference is [`Error::Mismatch`] on both). Receive blocks must not
    /// overlap; send and receive buffers must be disjoint.
    #[allow(clippy::too_many_arguments)]
    pub fn all_to_all_v<'a, T: Element>(
        &self,
        send: impl Into<In<'a, T>>,
        send_counts: &[usize],
        send_displs: &[usize],
        recv: impl Into<Out<'a, T>>,
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<()> {
        let (send, recv) = (send.into(), recv.into());
        let n = self.nranks() as usize;
        let es = std::mem::size_of::<T>();
        let sends = blocks("send", send_counts, send_displs, send.len(), n)?;
        let mut recvs = blocks("receive", recv_counts, recv_displs, recv.len(), n)?;
        recvs.sort_by_key(|&(_, d, _)| d);
        if let Some(w) = recvs.windows(2).find(|w| w[0].1 + w[0].2 > w[1].1) {
            return Err(Error::InvalidLayout {
                what: "receive",
                detail: format!(
                    "the blocks of ranks {} and {} overlap; receive blocks must be disjoint",
                    w[0].0, w[1].0
                ),
            });
        }
        if send.overlaps(&recv) {
            return Err(Error::InvalidLayout {
                what: "send and receive",
                detail: "the buffers overlap; all_to_all_v is out of place only".into(),
            });
        }
        crate::group::group(|g| {
            for &(p, d, c) in &sends {
                g.send::<T>(self, send.part(d, c, es), p as u32)?;
            }
            for &(p, d, c) in &recvs {
                g.recv::<T>(self, recv.part(d, c, es), p as u32)?;
            }
            Ok(())
        })
    }
}
