//! A helper thread of one connection (NCCL's socket threads): it drives
//! `NCCL_NSOCKS_PERTHREAD` non-blocking sockets, each with a queue of
//! message parts, moving bytes on every socket that is ready and sleeping
//! in `poll` (on the sockets and a doorbell) when none is.
//!
//! A part is a header then a body. Send parts carry both; a receive part
//! reads the header first, checks it (sequence, tag, size against the
//! posted buffer) and only then knows where its body goes ([`split`]).
//! Only socket 0 carries every message: a receive is posted there, and its
//! header's size says which other sockets carry a part (those [`split`]
//! gives bytes), which this worker then queues on their workers, in
//! message order, so a small message costs one socket, not a header on
//! each.
//! A socket's parts run in order, so the messages of a connection arrive
//! in order. A socket error, an early close, a malformed header or a
//! socket that moves nothing for the deadline fails the whole connection:
//! every queued part's request fails with that error.

use std::collections::VecDeque;
use std::net::TcpStream;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crossbeam::channel::{Receiver, Sender};
use rustix::event::{poll, PollFd, PollFlags, Timespec};

use crate::error::NetError;
use crate::tcp::io::{self, Moved};
use crate::tcp::req::{Req, Waker};
use crate::wire::{split, PartHeader};

/// Where a receive part's bytes may go and what it expects.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecvSpec {
    pub ptr: usize,
    pub cap: usize,
    pub seq: u32,
    pub tag: u32,
    pub nparts: usize,
    pub part: usize,
    pub min_chunk: usize,
}

#[derive(Debug)]
pub(crate) enum Dir {
    /// Header bytes, then the body.
    Send,
    Recv(RecvSpec),
}

/// One message's part on one socket of this worker.
#[derive(Debug)]
pub(crate) struct Part {
    pub req: Arc<Req>,
    /// The socket's index among this worker's sockets.
    pub sock: usize,
    pub hdr: [u8; PartHeader::BYTES],
    pub hdr_done: usize,
    pub dir: Dir,
    /// Body `(address, length)`, known for sends at once and for receives
    /// once the header is read.
    pub body: Option<(usize, usize)>,
    pub body_done: usize,
}

impl Part {
    pub fn send(req: Arc<Req>, sock: usize, hdr: PartHeader, ptr: usize, len: usize) -> Part {
        Part {
            req,
            sock,
            hdr: hdr.encode(),
            hdr_done: 0,
            dir: Dir::Send,
            body: Some((ptr, len)),
            body_done: 0,
        }
    }

    pub fn recv(req: Arc<Req>, sock: usize, spec: RecvSpec) -> Part {
        Part {
            req,
            sock,
            hdr: [0; PartHeader::BYTES],
            hdr_done: 0,
            dir: Dir::Recv(spec),
            body: None,
            body_done: 0,
        }
    }

    fn wants_write(&self) -> bool {
        matches!(self.dir, Dir::Send)
    }
}

/// One worker's queue of parts and the doorbell that wakes it.
#[derive(Debug)]
pub(crate) struct Lane {
    pub tx: Sender<Part>,
    pub bell: Arc<OwnedFd>,
}

/// Queues part `p` (its `sock` the connection's socket index) on the
/// worker owning that socket; gives back its request if that worker is
/// gone.
pub(crate) fn post(lanes: &[Lane], per_thread: usize, p: Part) -> Result<(), Arc<Req>> {
    let lane = &lanes[p.sock / per_thread];
    let p = Part {
        sock: p.sock % per_thread,
        ..p
    };
    lane.tx.send(p).map_err(|e| e.0.req)?;
    let _ = rustix::io::write(&*lane.bell, &1u64.to_ne_bytes());
    Ok(())
}

/// What a worker needs besides its sockets.
pub(crate) struct Ctx {
    pub label: String,
    pub rx: Receiver<Part>,
    pub bell: Arc<OwnedFd>,
    /// Every worker's lane (a receive's later parts go to their sockets'
    /// workers) and how many sockets each has.
    pub lanes: Arc<[Lane]>,
    pub per_thread: usize,
    pub stop: Arc<AtomicBool>,
    pub failed: Arc<OnceLock<NetError>>,
    pub waker: Option<Waker>,
    pub deadline: Duration,
    /// Send parts queued per socket of the connection (shared with
    /// [`super::conn::Conn`], which sends inline only on a socket with
    /// none), and this worker's first socket's index there.
    pub queued: Arc<[AtomicUsize]>,
    pub first: usize,
}

impl Ctx {
    fn wake(&self) {
        if let Some(w) = &self.waker {
            w();
        }
    }

    fn conn(&self, sock: &TcpStream, i: usize) -> String {
        let addr = |a: std::io::Result<std::net::SocketAddr>| {
            a.map_or_else(|_| "?".into(), |a| a.to_string())
        };
        format!(
            "{} ({} -> {}, socket {i})",
            self.label,
            addr(sock.local_addr()),
            addr(sock.peer_addr())
        )
    }
}

/// Writes what `sock` takes of send part `p`, header and body together in
/// one system call per attempt (a small message leaves as one segment).
/// `(done, moved)`. Used by the worker and, for small messages on an idle
/// socket, by the thread that called `isend` ([`super::conn`]).
pub(crate) fn push(p: &mut Part, sock: &TcpStream) -> Result<(bool, bool), rustix::io::Errno> {
    let (ptr, len) = p.body.unwrap_or_default();
    let body: &[u8] = if len == 0 {
        &[]
    } else {
        // SAFETY: `isend`'s contract keeps these `len` bytes valid and
        // unwritten until the request completes or the comm closes; the
        // worker is joined before close returns, and the calling thread
        // uses them only inside its `isend`.
        unsafe { std::slice::from_raw_parts(ptr as *const u8, len) }
    };
    let mut moved = false;
    while p.hdr_done < PartHeader::BYTES || p.body_done < len {
        match io::send2(sock.as_fd(), &p.hdr[p.hdr_done..], &body[p.body_done..])? {
            // A stream socket takes at least a byte unless it would block.
            Moved::Bytes(0) | Moved::Blocked | Moved::Closed => return Ok((false, moved)),
            Moved::Bytes(n) => {
                let h = n.min(PartHeader::BYTES - p.hdr_done);
                p.hdr_done += h;
                p.body_done += n - h;
                moved = true;
            }
        }
    }
    Ok((true, true))
}

/// Moves bytes of `p` on `sock`: `(done, moved)`. A receive's first part,
/// once its header is in, adds the message's other parts to `more`.
fn advance(
    p: &mut Part,
    sock: &TcpStream,
    ctx: &Ctx,
    i: usize,
    more: &mut Vec<Part>,
) -> Result<(bool, bool), NetError> {
    let io_err = |what, e: rustix::io::Errno| NetError::Io {
        conn: ctx.conn(sock, i),
        what,
        detail: e.to_string(),
    };
    if p.wants_write() {
        return push(p, sock).map_err(|e| io_err("send", e));
    }
    let mut moved = false;
    let closed = |detail: &str| NetError::Closed {
        conn: ctx.conn(sock, i),
        detail: detail.into(),
    };
    while p.hdr_done < PartHeader::BYTES {
        let r = io::recv(sock.as_fd(), &mut p.hdr[p.hdr_done..]).map_err(|e| io_err("recv", e))?;
        match r {
            Moved::Bytes(n) => {
                p.hdr_done += n;
                moved = true;
            }
            Moved::Blocked => return Ok((false, moved)),
            Moved::Closed => return Err(closed("between messages")),
        }
    }
    // A receive part learns its body from its header (send parts are
    // made with theirs).
    if let (None, Dir::Recv(spec)) = (p.body, &p.dir) {
        let spec = *spec;
        let h = PartHeader::decode(&p.hdr).map_err(|err| NetError::Wire {
            conn: ctx.conn(sock, i),
            err,
        })?;
        let bad = |detail: String| NetError::Wire {
            conn: ctx.conn(sock, i),
            err: crate::error::WireError::Malformed {
                what: "part header",
                detail,
            },
        };
        if h.seq != spec.seq || h.tag != spec.tag {
            return Err(bad(format!(
                "message {} tag {} where message {} tag {} was posted",
                h.seq, h.tag, spec.seq, spec.tag
            )));
        }
        if h.size > spec.cap as u64 {
            return Err(NetError::InvalidArgument(format!(
                "{}: a message of {} bytes arrived for a receive of {} bytes",
                ctx.conn(sock, i),
                h.size,
                spec.cap
            )));
        }
        p.req.agree_size(h.size).map_err(bad)?;
        let size = h.size as usize;
        if spec.part == 0 {
            // Counted before this part can complete, so the request does
            // not finish early.
            let before = more.len();
            more.extend(
                (1..spec.nparts)
                    .filter(|&j| split(size, spec.nparts, j, spec.min_chunk).1 > 0)
                    .map(|j| Part::recv(p.req.clone(), j, RecvSpec { part: j, ..spec })),
            );
            p.req.add_parts(more.len() - before);
        }
        let (off, len) = split(size, spec.nparts, spec.part, spec.min_chunk);
        p.body = Some((spec.ptr + off, len));
    }
    let (ptr, len) = p.body.unwrap_or_default();
    while p.body_done < len {
        // SAFETY: `irecv`'s contract gives this request the posted bytes
        // until it completes or the comm closes; `split` keeps the part
        // inside the message, and the message fits the posted capacity
        // (checked above). Parts of one message are disjoint.
        let b = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) };
        let r = io::recv(sock.as_fd(), &mut b[p.body_done..]).map_err(|e| io_err("recv", e))?;
        match r {
            Moved::Bytes(n) => {
                p.body_done += n;
                moved = true;
            }
            Moved::Blocked => return Ok((false, moved)),
            Moved::Closed => return Err(closed("in the middle of a message")),
        }
    }
    Ok((true, true))
}

/// The longest a worker sleeps before it looks at `stop` and its clock.
const SLICE: Timespec = Timespec {
    tv_sec: 0,
    tv_nsec: 100_000_000,
};

fn drain_bell(bell: &OwnedFd) {
    let mut b = [0u8; 8];
    let _ = rustix::io::read(bell, &mut b);
}

/// The worker's loop, until the connection is closed.
///
/// A socket that fails (an error, an early close, garbage, a stall past
/// the deadline) fails its own queued parts and marks the connection
/// failed (no new requests), but the other sockets go on: what the peer
/// sent before it closed still arrives, so a message complete on every
/// socket completes even when the peer exited right after sending it.
pub(crate) fn run(socks: Vec<TcpStream>, ctx: Ctx) {
    let mut queues: Vec<VecDeque<Part>> = socks.iter().map(|_| VecDeque::new()).collect();
    let mut dead: Vec<Option<NetError>> = socks.iter().map(|_| None).collect();
    let mut last_move = Instant::now();
    loop {
        if ctx.stop.load(Ordering::Acquire) {
            return;
        }
        while let Ok(p) = ctx.rx.try_recv() {
            let s = p.sock;
            queues[s].push_back(p);
        }
        let mut failed_any = false;
        for (q, d) in queues.iter_mut().zip(&dead) {
            if let Some(e) = d {
                for p in q.drain(..) {
                    p.req.fail(e.clone());
                    failed_any = true;
                }
            }
        }
        if failed_any {
            ctx.wake();
        }
        if queues.iter().all(VecDeque::is_empty) {
            // Idle: sleep on the doorbell (rung with every part and on
            // close), in slices.
            last_move = Instant::now();
            let mut fds = [PollFd::new(&*ctx.bell, PollFlags::IN)];
            let _ = poll(&mut fds, Some(&SLICE));
            drain_bell(&ctx.bell);
            continue;
        }
        let mut moved_any = false;
        let mut more = Vec::new();
        for (i, sock) in socks.iter().enumerate() {
            if dead[i].is_some() {
                continue;
            }
            while let Some(p) = queues[i].front_mut() {
                match advance(p, sock, &ctx, i, &mut more) {
                    Ok((done, moved)) => {
                        moved_any |= moved;
                        if !done {
                            break;
                        }
                        let p = queues[i].pop_front().expect("front exists");
                        if p.wants_write() {
                            // Its last byte is written: the socket is the
                            // caller's again once no other send is queued.
                            ctx.queued[ctx.first + i].fetch_sub(1, Ordering::Release);
                        }
                        if p.req.part_done() {
                            ctx.wake();
                        }
                    }
                    Err(e) => {
                        tracing::debug!(%e, "oxccl-net: socket failed");
                        let _ = ctx.failed.set(e.clone());
                        dead[i] = Some(e);
                        moved_any = true;
                        break;
                    }
                }
            }
        }
        // A receive's later parts, in message order: this worker's own
        // sockets directly, the others through their lanes.
        let mine = ctx.first / ctx.per_thread;
        for p in more {
            if p.sock / ctx.per_thread == mine {
                let s = p.sock % ctx.per_thread;
                queues[s].push_back(Part { sock: s, ..p });
            } else if let Err(req) = post(&ctx.lanes, ctx.per_thread, p) {
                req.fail(NetError::Closed {
                    conn: ctx.label.clone(),
                    detail: "a socket thread is gone".into(),
                });
                ctx.wake();
            }
        }
        if moved_any {
            last_move = Instant::now();
            continue;
        }
        if last_move.elapsed() >= ctx.deadline {
            for (i, q) in queues.iter().enumerate() {
                if let (Some(p), None) = (q.front(), &dead[i]) {
                    let what = if p.wants_write() {
                        "the peer to take data (it stopped reading)"
                    } else {
                        "data from the peer"
                    };
                    let e = NetError::Timeout {
                        conn: ctx.conn(&socks[i], i),
                        what,
                        limit: ctx.deadline,
                    };
                    let _ = ctx.failed.set(e.clone());
                    dead[i] = Some(e);
                }
            }
            continue;
        }
        // Sleep until a busy socket is ready, a part arrives, or a slice
        // passes (to look at `stop` and the stall clock).
        let mut fds = vec![PollFd::new(&*ctx.bell, PollFlags::IN)];
        for (i, sock) in socks.iter().enumerate() {
            if let (Some(p), None) = (queues[i].front(), &dead[i]) {
                let f = if p.wants_write() {
                    PollFlags::OUT
                } else {
                    PollFlags::IN
                };
                fds.push(PollFd::new(sock, f));
            }
        }
        let _ = poll(&mut fds, Some(&SLICE));
        let rang = !fds[0].revents().is_empty();
        drop(fds);
        if rang {
            drain_bell(&ctx.bell);
        }
    }
}
