//! One end of a connection: its sockets spread over helper threads
//! ([`worker`]), the next message number, and the connection's failure.
//!
//! A message of `size` bytes becomes one part per socket that carries
//! some of it ([`split`]: small messages travel whole on socket 0, alone),
//! each part queued on the worker that owns its socket. A receive is
//! posted on socket 0 only: its header gives the size, from which the
//! worker queues the message's other parts ([`worker`]).
//!
//! A small message (at most one chunk) on a socket with no send queued
//! leaves from the thread that called `isend`, as NCCL's socket transport
//! sends messages below its chunk size from the caller's `test`: waking
//! the socket thread and being woken back by it costs two context
//! switches per message, more than the message's own system call. What
//! the socket does not take at once goes to the worker as usual.

use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use crossbeam::channel::unbounded;
use parking_lot::Mutex;
use rustix::event::{eventfd, EventfdFlags};

use crate::config::TcpConfig;
use crate::error::NetError;
use crate::tcp::req::{Req, Waker};
use crate::tcp::worker::{self, Ctx, Lane, Part, RecvSpec};
use crate::wire::{split, PartHeader};

#[derive(Debug)]
pub(crate) struct Conn {
    pub label: String,
    /// Each socket thread's queue and doorbell.
    lanes: Arc<[Lane]>,
    threads: Mutex<Vec<JoinHandle<()>>>,
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
    waker: Wake,
}

/// The transport's waker, for completions on the calling thread.
struct Wake(Option<Waker>);

impl std::fmt::Debug for Wake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Wake(set)"
        } else {
            "Wake(none)"
        })
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
        let nthreads = nsocks.div_ceil(per_thread);
        let mut lanes = Vec::with_capacity(nthreads);
        let mut rxs = Vec::with_capacity(nthreads);
        for _ in 0..nthreads {
            let (tx, rx) = unbounded();
            let bell = Arc::new(
                eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)
                    .map_err(|e| io("eventfd", e.into()))?,
            );
            lanes.push(Lane { tx, bell });
            rxs.push(rx);
        }
        let lanes: Arc<[Lane]> = lanes.into();
        let mut threads = Vec::with_capacity(nthreads);
        let mut rest = socks.into_iter();
        for (t, rx) in rxs.into_iter().enumerate() {
            let mine: Vec<TcpStream> = rest.by_ref().take(per_thread).collect();
            let ctx = Ctx {
                label: label.clone(),
                rx,
                bell: lanes[t].bell.clone(),
                lanes: lanes.clone(),
                per_thread,
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
            threads.push(thread);
        }
        Ok(Conn {
            label,
            lanes,
            threads: Mutex::new(threads),
            per_thread,
            nsocks,
            min_chunk: cfg.min_chunk,
            seq: AtomicU32::new(0),
            stop,
            failed,
            socks: clones,
            queued,
            sending: Mutex::new(()),
            waker: Wake(waker),
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
        for p in parts {
            worker::post(&self.lanes, self.per_thread, p).map_err(|_| NetError::Closed {
                conn: self.label.clone(),
                detail: "its socket thread is gone".into(),
            })?;
        }
        Ok(())
    }

    /// Sends a message of `len` bytes at `ptr` on every socket: inline
    /// where it is small and the socket idle, else queued on the workers.
    pub fn send(&self, ptr: usize, len: usize, tag: u32) -> Result<Arc<Req>, NetError> {
        self.check()?;
        let _order = self.sending.lock();
        let seq = self.seq.fetch_add(1, Ordering::AcqRel);
        // Socket 0 always carries the header; another socket only a part
        // with bytes (the receiver knows which from the size).
        let nparts = (0..self.nsocks)
            .filter(|&i| i == 0 || split(len, self.nsocks, i, self.min_chunk).1 > 0)
            .count();
        let req = Req::new(nparts, Some(len as u64));
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
            if i > 0 && n == 0 {
                continue;
            }
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
            if let Some(w) = &self.waker.0 {
                w();
            }
        }
        Ok(req)
    }

    /// Posts a receive of at most `cap` bytes at `ptr` on every socket.
    pub fn recv(&self, ptr: usize, cap: usize, tag: u32) -> Result<Arc<Req>, NetError> {
        self.check()?;
        let seq = self.seq.fetch_add(1, Ordering::AcqRel);
        // Socket 0's part; the worker adds the others once the size is in.
        let req = Req::new(1, None);
        let spec = RecvSpec {
            ptr,
            cap,
            seq,
            tag,
            nparts: self.nsocks,
            part: 0,
            min_chunk: self.min_chunk,
        };
        self.submit(vec![Part::recv(req.clone(), 0, spec)])?;
        Ok(req)
    }

    /// Stops the helpers (waiting for them: no memory of a pending request
    /// is touched after this) and closes the sockets, which the peer sees.
    pub fn close(&self) {
        self.stop.store(true, Ordering::Release);
        for s in &self.socks {
            let _ = s.shutdown(Shutdown::Both);
        }
        let mut threads = self.threads.lock();
        for l in self.lanes.iter() {
            let _ = rustix::io::write(&*l.bell, &1u64.to_ne_bytes());
        }
        for t in threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.close();
    }
}
