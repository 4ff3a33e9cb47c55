//! Entry points for fuzzing what this crate reads from a peer's shared
//! memory (ranks as processes of one host). Not part of the API: the
//! workspace's `oxccl-fuzz` tests and the `fuzz/` targets call them.
//!
//! Every value a peer's process writes into its segment or into a FIFO
//! of ours (published buffer offsets, lengths and counts; FIFO counters
//! and message lengths; the failure reason's length) is untrusted. The
//! entry below writes arbitrary words there, as a hostile peer would, and
//! then does what a rank does with them; it panics only if a bad value
//! got through: an address outside the peer's heap or the FIFO's slots.

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::procs::Procs;
use crate::remote::{RemoteAccess, RemoteFault};
use crate::shm::{LinkCtr, RankCtl, Segment};

thread_local! {
    /// Two ranks' segments, made once per thread; rank 0 is "us".
    static PAIR: RefCell<Option<Procs>> = const { RefCell::new(None) };
}

fn pair() -> Procs {
    let lay = crate::shm::Layout::new(2, 4, 256, 64 << 10);
    let segs = (0..2)
        .map(|r| Segment::create(lay.total, r).map(|(s, _)| Arc::new(s)))
        .collect::<Result<Vec<_>, _>>()
        .expect("two shared segments");
    Procs::local(0, lay, segs)
}

/// Reads `bytes` as little-endian words (the last one zero-padded),
/// endlessly (zeros once they run out).
fn words(bytes: &[u8]) -> impl Iterator<Item = u64> + '_ {
    bytes
        .chunks(8)
        .map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(w)
        })
        .chain(std::iter::repeat(0))
}

/// Plays a hostile rank 1: `bytes` become the words of its published
/// buffers, of the FIFO counters and lengths of a link in each direction,
/// and of the shared failure reason; then rank 0 resolves remote
/// accesses, peeks and reserves FIFO slots and reads the reason. Panics if
/// anything it is handed lies outside where it may.
pub fn shared_segment(bytes: &[u8]) {
    PAIR.with(|p| {
        let mut p = p.borrow_mut();
        let procs = p.get_or_insert_with(pair);
        play(procs, &mut words(bytes));
    });
}

fn play(p: &Procs, w: &mut impl Iterator<Item = u64>) {
    let mut next = || w.next().unwrap_or(0);
    let lay = p.layout();
    // Its published buffers (its own segment, which it owns).
    let ctl: &RankCtl = p.rank(1);
    ctl.pub_call.store(next() % 4, Ordering::Relaxed);
    ctl.pub_n.store(next() as u32, Ordering::Relaxed);
    for b in ctl.pub_bufs.iter().take(4) {
        b[0].store(next(), Ordering::Relaxed);
        b[1].store(next(), Ordering::Relaxed);
    }
    let peer = p.segment(1);
    let (lo, hi) = (
        peer.base() as usize + lay.heap,
        peer.base() as usize + lay.total,
    );
    for _ in 0..4 {
        let elem = 1 << (next() % 4);
        let a = RemoteAccess {
            call: next() % 4,
            buf: (next() % 300) as usize,
            off: (next() >> 1) as usize,
            len: (next() >> 1) as usize,
            elem,
        };
        match p.remote(1, &a) {
            Ok(addr) => {
                let end = a.len.checked_mul(elem).and_then(|b| addr.checked_add(b));
                assert!(
                    addr >= lo && end.is_some_and(|e| e <= hi) && addr % elem == 0,
                    "{a:?} resolved to {addr:#x}, outside the peer's heap {lo:#x}..{hi:#x}"
                );
            }
            Err(RemoteFault::Plan(_) | RemoteFault::Corrupt(_)) => {}
        }
    }
    // A link it sends us (in our segment: it writes the tail and lengths)
    // and one we send it (in its segment: it writes the head).
    for (from, to) in [(1, 0), (0, 1)] {
        let link = p.link(0, from, to).expect("channel 0");
        let off = lay.link(0, from as usize);
        // SAFETY: the layout puts link (0, from)'s counters at `off` of
        // `to`'s segment.
        let ctr: &LinkCtr = unsafe { p.segment(to).at(off) };
        ctr.tail.store(next(), Ordering::Relaxed);
        ctr.head.store(next(), Ordering::Relaxed);
        let (slots, bytes) = link.region();
        let slots = slots as usize;
        // SAFETY: link (0, from)'s slot lengths follow its counters.
        let lens: &[std::sync::atomic::AtomicU64; 4] =
            unsafe { p.segment(to).at(lay.link_lens(off)) };
        for l in lens {
            l.store(next(), Ordering::Relaxed);
        }
        if let Ok(Some((_, ptr, len))) = link.try_peek() {
            let ptr = ptr as usize;
            assert!(
                ptr >= slots && ptr + len <= slots + bytes,
                "a peeked message of {len} bytes at {ptr:#x} leaves the slots"
            );
        }
        if let Ok(Some((_, ptr))) = link.try_reserve() {
            let ptr = ptr as usize;
            assert!(ptr >= slots && ptr + link.stride() <= slots + bytes);
        }
    }
    // The shared failure reason (rank 0's segment, any rank writes it).
    let g = p.global();
    g.reason_len.store(next() as u32, Ordering::Relaxed);
    g.reason_state.store(2, Ordering::Release);
    let _ = p.reason();
    g.reason_state.store(0, Ordering::Release);
}
