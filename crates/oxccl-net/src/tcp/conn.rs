//! One end of a connection: its sockets spread over helper threads
//! ([`worker`]), the next message number, and the connection's failure.
//!
//! A message of `size` bytes becomes one part per socket ([`split`]:
//! small messages travel whole on socket 0, the other sockets carry only a
//! header), each part queued on the worker that owns its socket.
//!
//! A small message (at most one chunk) on a socket with no send queued
//! leaves from the thread that called `isend`, as NCCL's socket transport
//! sends messages below its chunk size from the caller's `test`: waking
//! the socket thread and being woken back by it costs two context
//! switches per message, more than the message's own system call. What
//! the socket does not take at once goes to the worker as usual.

use std::net::{Shutdown, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use crossbeam::channel::{unbounded, Sender};
use parking_lot::Mutex;
use rustix::event::{eventfd, EventfdFlags};

use crate::config::TcpConfig;
use crate::error::NetError;
use crate::tcp::req::{Req, Waker};
use crate::tcp::worker::{self, Ctx, Part, RecvSpec};
use crate::wire::{split, PartHeader};

#[derive(Debug)]
struct Helper {
    tx: Sender<Part>,
    bell: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

pub(crate) struct Conn {
    pub label: String,
    helpers: Mutex<Vec<Helper>>,
    per_thread: usize,
    nsocks: usize,
    min_chunk: usize,
    /// Next message number (sending: to stamp; receiving: to expect).
    seq: AtomicU32,
    stop: Arc<AtomicBool>,
    failed: Arc<OnceLock<NetError>>,
    /// Clones of the sockets: to shut them down on close, and to send
    /// small messages inline.
    socks: Vec<TcpStream>,
    /// Send parts queued on each socket's worker and not yet written:
    /// inline sends only where there are none, so bytes keep their order.
    queued: Arc<[AtomicUsize]>,
    /// Held across a send, so message numbers and the sockets' queues
    /// take messages in one order.
    sending: Mutex<()>,
    waker: Option<Waker>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("label", &self.label)
            .field("nsocks", &self.nsocks)
            .field("seq", &self.seq)
            .field("queued", &self.queued)
            .finish_non_exhaustive()
    }
}

impl Conn {
    /// Starts the helper threads over `socks` (in socket-index order).
    pub fn start(
        label: String,
        socks: Vec<TcpStream>,
        cfg: &TcpConfig,
        waker: Option<Waker>,
    ) -> Result<Conn, NetError> {
        let io = |what, e: std::io::Error| NetError::Io {
            conn: label.clone(),
            what,
            detail: e.to_string(),
        };
        let stop = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(OnceLock::new());
        let per_thread = cfg.nsocks_per_thread.max(1);
        let mut clones = Vec::with_capacity(socks.len());
        for s in &socks {
            s.set_nonblocking(true)
                .map_err(|e| io("set_nonblocking", e))?;
            let _ = s.set_nodelay(true);
            clones.push(s.try_clone().map_err(|e| io("dup", e))?);
        }
        let nsocks = socks.len();
        let queued: Arc<[AtomicUsize]> = (0..nsocks).map(|_| AtomicUsize::new(0)).collect();
        let mut helpers = Vec::new();
        let mut rest = socks.into_iter();
        for t in 0..nsocks.div_ceil(per_thread) {
            let mine: Vec<TcpStream> = rest.by_ref().take(per_thread).collect();
            let (tx, rx) = unbounded();
            let bell = Arc::new(
                eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)
                    .map_err(|e| io("eventfd", e.into()))?,
            );
            let ctx = Ctx {
                label: label.clone(),
                rx,
                bell: bell.clone(),
                stop: stop.clone(),
                failed: failed.clone(),
                waker: waker.clone(),
                deadline: cfg.deadline,
                queued: queued.clone(),
                first: t * per_thread,
            };
            let thread = std::thread::Builder::new()
                .name(format!("oxccl-net-{t}"))
                .spawn(move || worker::run(mine, ctx))
                .map_err(|e| io("spawning a socket thread", e))?;
            helpers.push(Helper {
                tx,
                bell,
                thread: Some(thread),
            });
        }
        Ok(Conn {
            label,
            helpers: Mutex::new(helpers),
            per_thread,
            nsocks,
            min_chunk: cfg.min_chunk,
            seq: AtomicU32::new(0),
            stop,
            failed,
            socks: clones,
            queued,
            sending: Mutex::new(()),
            waker,
        })
    }

    fn check(&self) -> Result<(), NetError> {
        match self.failed.get() {
            Some(e) => Err(e.clone()),
            None if self.stop.load(Ordering::Acquire) => Err(NetError::Closed {
                conn: self.label.clone(),
                detail: "closed here".into(),
            }),
            None => Ok(()),
        }
    }

    fn submit(&self, parts: Vec<Part>) -> Result<(), NetError> {
        let helpers = self.helpers.lock();
        for p in parts {
            let h = &helpers[p.sock / self.per_thread];
            let p = Part {
                sock: p.sock % self.per_thread,
                ..p
            };
            h.tx.send(p).map_err(|_| NetError::Closed {
                conn: self.label.clone(),
                detail: "its socket thread is gone".into(),
            })?;
            let _ = rustix::io::write(&*h.bell, &1u64.to_ne_bytes());
        }
        Ok(())
    }

    /// Sends a message of `len` bytes at `ptr` on every socket: inline
    /// where it is small and the socket idle, else queued on the workers.
    pub fn send(&self, ptr: usize, len: usize, tag: u32) -> Result<Arc<Req>, NetError> {
        self.check()?;
        let _order = self.sending.lock();
        let seq = self.seq.fetch_add(1, Ordering::AcqRel);
        let req = Req::new(self.nsocks, Some(len as u64));
        let hdr = PartHeader {
            seq,
            tag,
            size: len as u64,
        };
        let small = len <= self.min_chunk;
        let mut queue = Vec::with_capacity(self.nsocks);
        let mut ended = false;
        for i in 0..self.nsocks {
            let (off, n) = split(len, self.nsocks, i, self.min_chunk);
            let mut p = Part::send(req.clone(), i, hdr, ptr + off, n);
            // `queued` only falls to 0 once the worker wrote its last
            // part's last byte (Release there, Acquire here), and only this
            // thread (under `sending`) raises it: no worker writes this
            // socket while we do.
            if small && self.queued[i].load(Ordering::Acquire) == 0 {
                match worker::push(&mut p, &self.socks[i]) {
                    Ok((true, _)) => {
                        ended |= req.part_done();
                        continue;
                    }
                    Ok((false, _)) => {}
                    Err(e) => {
                        // As the worker does with a failing socket: the
                        // connection takes no more requests, this one fails.
                        let e = NetError::Io {
                            conn: format!("{} (socket {i})", self.label),
                            what: "send",
                            detail: e.to_string(),
                        };
                        let _ = self.failed.set(e.clone());
                        req.fail(e);
                        ended = true;
                        break;
                    }
                }
            }
            self.queued[i].fetch_add(1, Ordering::AcqRel);
            queue.push(p);
        }
        if !queue.is_empty() {
            self.submit(queue)?;
        }
        if ended {
            if let Some(w) = &self.waker {
                w();
            }
        }
        Ok(req)
    }

    /// Posts a receive of at most `cap` bytes at `ptr` on every socket.
    pub fn recv(&self, ptr: usize, cap: usize, tag: u32) -> Result<Arc<Req>, NetError> {
        self.check()?;
        let seq = self.seq.fetch_add(1, Ordering::AcqRel);
        let req = Req::new(self.nsocks, None);
        let parts = (0..self.nsocks)
            .map(|part| {
                Part::recv(
                    req.clone(),
                    part,
                    RecvSpec {
                        ptr,
                        cap,
                        seq,
                        tag,
                        nparts: self.nsocks,
                        part,
                        min_chunk: self.min_chunk,
                    },
                )
            })
            .collect();
        self.submit(parts)?;
        Ok(req)
    }

    /// Stops the helpers (waiting for them: no memory of a pending request
    /// is touched after this) and closes the sockets, which the peer sees.
    pub fn close(&self) {
        self.stop.store(true, Ordering::Release);
        for s in &self.socks {
            let _ = s.shutdown(Shutdown::Both);
        }
        let mut helpers = self.helpers.lock();
        for h in helpers.iter_mut() {
            let _ = rustix::io::write(&*h.bell, &1u64.to_ne_bytes());
            if let Some(t) = h.thread.take() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.close();
    }
}
