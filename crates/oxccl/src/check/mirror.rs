//! The board mirrored over TCP, for ranks that talk over the network (on
//! several hosts, or forced onto it): every rank keeps the whole board in
//! its own memory, as ranks that are threads do ([`super::board`]'s
//! `Local`), and sends each change it makes to the peers that read it: a
//! collective record to every peer, a Send/Recv record (or its withdrawal)
//! to the other side only, an abort and a departure to every peer. One
//! thread per rank applies what arrives and wakes the waiters.
//!
//! One connection per pair of ranks, made at init by the bootstrap
//! ([`Bootstrap::mesh`]); a connection keeps its frames in order, so a
//! withdrawal always lands before the collective record that follows it
//! (the poisoned call of `calls.rs`). A peer whose connection closes (its
//! process exited, or was killed) is named by waits that need it.
//!
//! Each collective costs every rank n − 1 small frames out and in: cheap
//! at a few hosts, quadratic in all, so it is off between hosts unless
//! every rank asks for it (`OXCCL_CHECK_CALLS=all`).

use std::net::TcpStream;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use oxccl_bootstrap::Bootstrap;
use oxccl_core::DataType;
use parking_lot::Mutex;

use super::records::{Local, P2pRecord};
use crate::error::{Error, Result};

/// Bytes per frame: every message has the same size.
const FRAME: usize = 64;

/// What a frame carries (on the wire, its index in [`KINDS`] + 1: a
/// zeroed frame is refused).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A collective record.
    Coll,
    /// One side of a Send/Recv.
    P2p,
    /// That side withdrawn, unmatched.
    Withdraw,
    /// The sender aborted its communicator.
    Abort,
    /// The sender's communicator was destroyed or dropped.
    Leave,
}

const KINDS: [Kind; 5] = [
    Kind::Coll,
    Kind::P2p,
    Kind::Withdraw,
    Kind::Abort,
    Kind::Leave,
];

impl Kind {
    fn code(self) -> u8 {
        KINDS
            .iter()
            .position(|&k| k == self)
            .expect("every kind is listed") as u8
            + 1
    }

    fn from_code(b: u8) -> Option<Kind> {
        KINDS.get(usize::from(b.checked_sub(1)?)).copied()
    }
}

/// One frame, decoded: `src` sent it; `num` is the sequence number
/// (collective) or the message index (Send/Recv).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Frame {
    kind: Kind,
    src: u32,
    num: u64,
    /// A collective record's words.
    words: [u64; 4],
    /// A Send/Recv record (its peer is the frame's receiver).
    rec: Option<P2pRecord>,
}

impl Frame {
    fn new(kind: Kind, src: u32, num: u64) -> Frame {
        Frame {
            kind,
            src,
            num,
            words: [0; 4],
            rec: None,
        }
    }

    fn encode(&self) -> [u8; FRAME] {
        let mut b = [0u8; FRAME];
        b[0] = self.kind.code();
        b[4..8].copy_from_slice(&self.src.to_le_bytes());
        b[8..16].copy_from_slice(&self.num.to_le_bytes());
        for (i, w) in self.words.iter().enumerate() {
            b[16 + 8 * i..24 + 8 * i].copy_from_slice(&w.to_le_bytes());
        }
        if let Some(r) = self.rec {
            b[1] = u8::from(r.send);
            b[2] = r.dtype as u8;
            b[3] = u8::from(r.direct.is_some());
            b[48..52].copy_from_slice(&r.peer.to_le_bytes());
            b[52..54].copy_from_slice(&r.direct.unwrap_or(0).to_le_bytes());
            b[56..64].copy_from_slice(&(r.count as u64).to_le_bytes());
        }
        b
    }

    fn decode(b: &[u8; FRAME]) -> Option<Frame> {
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let kind = Kind::from_code(b[0])?;
        let rec = match kind {
            Kind::P2p | Kind::Withdraw => Some(P2pRecord {
                peer: u32::from_le_bytes(b[48..52].try_into().expect("4 bytes")),
                send: b[1] != 0,
                count: usize::try_from(u64_at(56)).ok()?,
                dtype: *DataType::ALL.get(usize::from(b[2]))?,
                direct: (b[3] != 0)
                    .then(|| u16::from_le_bytes(b[52..54].try_into().expect("2 bytes"))),
            }),
            _ => None,
        };
        Some(Frame {
            kind,
            src: u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")),
            num: u64_at(8),
            words: [0, 1, 2, 3].map(|i| u64_at(16 + 8 * i)),
            rec,
        })
    }
}

/// What the applying thread shares with the rank.
#[derive(Debug)]
struct Inner {
    me: u32,
    local: Local,
    /// Per peer: its connection closed (its process exited or was killed).
    closed: Box<[AtomicBool]>,
    /// The first rank that aborted, + 1 (0: none).
    aborted: AtomicU32,
    stop: AtomicBool,
}

impl Inner {
    fn wake(&self) {
        self.local.wake_all();
    }

    /// Applies one peer's frame to this rank's copy of the board.
    fn apply(&self, f: Frame) {
        match f.kind {
            Kind::Coll => self.local.store(f.src, f.num, f.words),
            Kind::P2p => {
                if let Some(rec) = f.rec {
                    self.local.put_side(f.src, rec, f.num);
                }
            }
            Kind::Withdraw => {
                if let Some(rec) = f.rec {
                    self.local.drop_side(f.src, rec, f.num);
                }
            }
            Kind::Abort => {
                let _ = self.aborted.compare_exchange(
                    0,
                    f.src + 1,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
            }
            Kind::Leave => self.local.mark_gone(f.src),
        }
        self.wake();
    }
}

/// Fuzz entry: a peer's frame from arbitrary bytes (the first
/// [`FRAME`], zero-padded); one that decodes encodes back to itself.
pub(super) fn fuzz_frame(bytes: &[u8]) {
    let mut b = [0u8; FRAME];
    let n = bytes.len().min(FRAME);
    b[..n].copy_from_slice(&bytes[..n]);
    if let Some(f) = Frame::decode(&b) {
        assert_eq!(Frame::decode(&f.encode()), Some(f));
    }
}

/// This rank's mirror of the board and its connections to every peer.
#[derive(Debug)]
pub(super) struct Mirror {
    inner: Arc<Inner>,
    /// Per peer: where this rank's frames go (`None` for itself).
    out: Vec<Option<Mutex<TcpStream>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Mirror {
    /// Connects every pair of `boot`'s ranks ([`Bootstrap::mesh`]; each
    /// rank calls this at init) and starts the thread that applies peers'
    /// frames.
    pub fn new(boot: &Bootstrap, local: Local) -> Result<Mirror> {
        let (me, n) = (boot.rank(), boot.nranks());
        let socks = boot
            .mesh("call check")
            .map_err(crate::init::map_bootstrap)?;
        let inner = Arc::new(Inner {
            me,
            local,
            closed: (0..n).map(|_| AtomicBool::new(false)).collect(),
            aborted: AtomicU32::new(0),
            stop: AtomicBool::new(false),
        });
        let mut ins = Vec::new();
        let mut out = Vec::new();
        for (r, s) in socks.into_iter().enumerate() {
            match s {
                Some(s) => {
                    let _ = s.set_nodelay(true);
                    let _ = s.set_read_timeout(None);
                    let rd = s.try_clone().map_err(|e| net_error(me, "clone", &e))?;
                    ins.push((r as u32, rd));
                    out.push(Some(Mutex::new(s)));
                }
                None => out.push(None),
            }
        }
        let i2 = inner.clone();
        let reader = std::thread::Builder::new()
            .name(format!("oxccl-check-{me}"))
            .spawn(move || read_frames(&i2, ins))
            .map_err(|e| net_error(me, "start its reader", &e))?;
        Ok(Mirror {
            inner,
            out,
            reader: Some(reader),
        })
    }

    pub fn local(&self) -> &Local {
        &self.inner.local
    }

    /// Sends `f` to `peer`; a closed connection is noted (waits that need
    /// that peer name it), not an error here.
    fn send_to(&self, peer: u32, f: &Frame) {
        let Some(Some(s)) = self.out.get(peer as usize) else {
            return;
        };
        if write_frame(&s.lock(), &f.encode()).is_err() {
            self.inner.closed[peer as usize].store(true, Ordering::Release);
            self.inner.wake();
        }
    }

    fn send_all(&self, f: &Frame) {
        for peer in 0..self.out.len() as u32 {
            self.send_to(peer, f);
        }
    }

    /// This rank published collective `seq`.
    pub fn published(&self, rank: u32, seq: u64, words: [u64; 4]) {
        debug_assert_eq!(rank, self.inner.me);
        self.send_all(&Frame {
            words,
            ..Frame::new(Kind::Coll, rank, seq)
        });
    }

    /// This rank posted Send/Recv record `k`.
    pub fn posted(&self, rank: u32, rec: P2pRecord, k: u64) {
        self.send_to(
            rec.peer,
            &Frame {
                rec: Some(rec),
                ..Frame::new(Kind::P2p, rank, k)
            },
        );
    }

    /// This rank withdrew its unmatched record `k`.
    pub fn withdrew(&self, rank: u32, rec: P2pRecord, k: u64) {
        self.send_to(
            rec.peer,
            &Frame {
                rec: Some(rec),
                ..Frame::new(Kind::Withdraw, rank, k)
            },
        );
    }

    pub fn abort(&self, rank: u32) {
        let _ =
            self.inner
                .aborted
                .compare_exchange(0, rank + 1, Ordering::AcqRel, Ordering::Acquire);
        self.send_all(&Frame::new(Kind::Abort, rank, 0));
        self.inner.wake();
    }

    pub fn leave(&self, rank: u32) {
        self.send_all(&Frame::new(Kind::Leave, rank, 0));
    }

    /// The first rank that aborted, if any.
    pub fn aborted_by(&self) -> Option<u32> {
        self.inner.aborted.load(Ordering::Acquire).checked_sub(1)
    }

    /// Whether `rank`'s connection closed.
    pub fn closed(&self, rank: u32) -> bool {
        self.inner
            .closed
            .get(rank as usize)
            .is_some_and(|c| c.load(Ordering::Acquire))
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        for s in self.out.iter().flatten() {
            let _ = s.lock().shutdown(std::net::Shutdown::Both);
        }
        if let Some(h) = self.reader.take() {
            let _ = h.join();
        }
    }
}

/// Writes a whole frame on a blocking socket, without SIGPIPE (this code
/// also runs inside `libnccl.so.2`, where the host program may not ignore
/// that signal).
fn write_frame(s: &TcpStream, mut b: &[u8]) -> std::result::Result<(), rustix::io::Errno> {
    while !b.is_empty() {
        match rustix::net::send(s, b, rustix::net::SendFlags::NOSIGNAL) {
            Ok(0) => return Err(rustix::io::Errno::PIPE),
            Ok(n) => b = &b[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn net_error(me: u32, what: &str, e: &std::io::Error) -> Error {
    Error::Bootstrap(format!("rank {me}: the call check could not {what}: {e}"))
}

/// The reader's loop: whole frames from every peer, applied in each
/// connection's order, until the mirror is dropped.
fn read_frames(inner: &Inner, mut ins: Vec<(u32, TcpStream)>) {
    let mut bufs: Vec<Vec<u8>> = ins.iter().map(|_| Vec::with_capacity(FRAME)).collect();
    let mut open: Vec<bool> = ins.iter().map(|_| true).collect();
    while !inner.stop.load(Ordering::Acquire) {
        let mut fds: Vec<rustix::event::PollFd<'_>> = ins
            .iter()
            .zip(&open)
            .filter(|(_, o)| **o)
            .map(|((_, s), _)| rustix::event::PollFd::new(s, rustix::event::PollFlags::IN))
            .collect();
        if fds.is_empty() {
            return;
        }
        let slice = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        };
        let _ = rustix::event::poll(&mut fds, Some(&slice));
        drop(fds);
        for (i, (peer, s)) in ins.iter_mut().enumerate() {
            if !open[i] {
                continue;
            }
            let mut chunk = [0u8; 16 * FRAME];
            loop {
                // DONTWAIT per call: the socket itself stays blocking for
                // the writer, which shares its file description.
                match rustix::net::recv(s.as_fd(), &mut chunk, rustix::net::RecvFlags::DONTWAIT)
                    .map(|(n, _)| n)
                {
                    Ok(0) => {
                        open[i] = false;
                        inner.closed[*peer as usize].store(true, Ordering::Release);
                        inner.wake();
                        break;
                    }
                    Ok(got) => {
                        bufs[i].extend_from_slice(&chunk[..got]);
                        let whole = bufs[i].len() / FRAME * FRAME;
                        for b in bufs[i][..whole].chunks_exact(FRAME) {
                            let b: &[u8; FRAME] = b.try_into().expect("a whole frame");
                            // A frame from another rank than the
                            // connection's is garbage: dropped.
                            if let Some(f) = Frame::decode(b).filter(|f| f.src == *peer) {
                                inner.apply(f);
                            }
                        }
                        bufs[i].drain(..whole);
                    }
                    Err(rustix::io::Errno::AGAIN) => break,
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(_) => {
                        open[i] = false;
                        inner.closed[*peer as usize].store(true, Ordering::Release);
                        inner.wake();
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_garbage_is_refused() {
        let rec = P2pRecord {
            peer: 7,
            send: true,
            count: 1 << 40,
            dtype: DataType::Bf16,
            direct: Some(513),
        };
        for f in [
            Frame {
                words: [1, u64::MAX, 3, 4],
                ..Frame::new(Kind::Coll, 3, 99)
            },
            Frame {
                rec: Some(rec),
                ..Frame::new(Kind::P2p, 2, 5)
            },
            Frame {
                rec: Some(P2pRecord {
                    direct: None,
                    ..rec
                }),
                ..Frame::new(Kind::Withdraw, 2, 5)
            },
            Frame::new(Kind::Leave, 1, 0),
            Frame::new(Kind::Abort, 0, 0),
        ] {
            assert_eq!(Frame::decode(&f.encode()), Some(f));
        }
        let mut bad = Frame::new(Kind::Abort, 1, 0).encode();
        for code in [0, 6, 0x7f] {
            bad[0] = code;
            assert_eq!(Frame::decode(&bad), None);
        }
        let mut bad_type = Frame {
            rec: Some(rec),
            ..Frame::new(Kind::P2p, 2, 5)
        }
        .encode();
        bad_type[2] = 200;
        assert_eq!(Frame::decode(&bad_type), None);
    }
}
