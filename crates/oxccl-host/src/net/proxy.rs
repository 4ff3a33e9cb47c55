//! The proxy thread (NCCL's proxy): it moves each network link's FIFO
//! messages between the link's slots in this process and the transport.
//!
//! Sending end: message `seq` goes out once the executor has published it
//! (`tail > seq`), at most `slots` in flight; when the transport reports it
//! sent, the slot goes back to the executor (`head = seq + 1`). Receiving
//! end: a receive is posted into slot `seq` once the executor has drained
//! it (`seq - head < slots`); when it completes, the message is published
//! (`tail = seq + 1`). So the receiver's slots bound what is in flight, as
//! in shared memory: ordering and flow control are the FIFO's own.
//!
//! A failed request marks its peer lost (with why); the executor, blocked
//! on that peer, fails the call naming rank, peer, channel and step.
//!
//! The work itself is a [`Pump`] behind a lock, which the proxy thread
//! and the rank's executor both run: the executor runs a pass right after
//! it publishes or drains a slot (a small message then leaves from the
//! executor's own thread, [`oxccl_net`] sending it inline) and around its
//! park, and the transport wakes the parked executor instead of the proxy
//! thread. Each thread hand-off is a context switch of tens of µs on a
//! loaded host, several per message otherwise; the proxy thread remains
//! for what happens while the executor is busy or outside a call.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam::channel::Receiver;
use crossbeam::sync::{Parker, Unparker};
use oxccl_core::plan::Rank;
use oxccl_net::{Buf, Comm, MemHandle, Net, NetError, RecvComm, Region, Request, SendComm};
use parking_lot::Mutex;

use super::events::{ProxyEvents, Window};
use crate::fifo::Link;

/// Which end of a connection a link is.
#[derive(Clone, Copy, Debug)]
pub(crate) enum End {
    Send(SendComm),
    Recv(RecvComm),
}

/// What the proxy and the fabric share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub net: Arc<dyn Net>,
    /// The transport wakes nobody when a request completes (a plugin):
    /// the proxy thread keeps testing while anything is in flight, as
    /// NCCL's proxy polls.
    pub polled: bool,
    pub me: Rank,
    /// Why each peer is lost, once it is.
    pub lost: Box<[Mutex<Option<Lost>>]>,
    pub stop: AtomicBool,
    /// Set by a clean shutdown: the proxy reports `drained` once every
    /// message the executor published has left (or its connection failed).
    pub draining: AtomicBool,
    pub drained: AtomicBool,
    /// Wakes this process's rank (the executor parks on it).
    pub rank: Unparker,
    /// The executor is parked waiting on the network and runs a pass when
    /// it wakes: the transport's completions wake it, not the proxy.
    pub rank_waits: Arc<AtomicBool>,
    /// Wakes the proxy.
    pub proxy: Unparker,
}

impl Shared {
    /// Records why `peer` is lost: its own report (`reported`, from its
    /// control connection) wins over a connection seen failing.
    pub fn lose(&self, peer: Rank, why: String, reported: bool) {
        let mut l = self.lost[peer as usize].lock();
        if l.as_ref().is_none_or(|l| reported && !l.reported) {
            tracing::debug!(rank = self.me, peer, %why, "oxccl-host: network peer lost");
            *l = Some(Lost {
                at: Instant::now(),
                why,
                reported,
            });
        }
        drop(l);
        self.rank.unpark();
    }

    /// Why `peer` is lost, once that is settled (its report, or a failed
    /// connection seen at least [`REPORT_GRACE`] ago: the report travels
    /// on another socket and may come a little later), and the rank to
    /// name for it: `peer`, unless `peer` reported that it failed because
    /// another rank was lost, and this rank saw that one go too. Then the
    /// rank that died is named, with `peer`'s report as the context: in a
    /// ring where rank 1 of 3 dies, rank 0 waits on rank 2, which fails on
    /// rank 1, and rank 0 names rank 1, not its own peer.
    pub fn lost(&self, peer: Rank) -> Option<(Rank, String)> {
        let (why, reported) = {
            let l = self.lost.get(peer as usize)?.lock();
            let l = l.as_ref()?;
            if !(l.reported || l.at.elapsed() >= REPORT_GRACE) {
                return None;
            }
            (l.why.clone(), l.reported)
        };
        if reported {
            if let Some((dead, own)) = self.cause(peer, &why) {
                return Some((
                    dead,
                    format!(
                        "{own} (rank {peer}, which this rank was waiting on, failed because \
                         of it: {why})"
                    ),
                ));
            }
        }
        Some((peer, why))
    }

    /// The innermost lost rank a report names (`peer rank N is lost`):
    /// that rank, and why it is lost here (or that `peer` said so, where
    /// this rank has not seen it go yet).
    fn cause(&self, peer: Rank, why: &str) -> Option<(Rank, String)> {
        const PAT: &str = "peer rank ";
        let at = why.rfind(PAT)? + PAT.len();
        let digits: String = why[at..].chars().take_while(char::is_ascii_digit).collect();
        let dead: Rank = digits.parse().ok()?;
        if dead == peer || dead == self.me || !why[at + digits.len()..].starts_with(" is lost") {
            return None;
        }
        let l = self.lost.get(dead as usize)?.lock();
        let own = match l.as_ref() {
            Some(l) => l.why.clone(),
            // Not seen here (a connection with nothing posted on it notices
            // no close): the report is the word of a rank of the job.
            None => format!("rank {peer} reported it lost"),
        };
        Some((dead, own))
    }
}

/// How long a failed connection waits for the peer's own report.
pub(crate) const REPORT_GRACE: Duration = Duration::from_millis(200);

/// Why a peer is lost.
#[derive(Debug)]
pub(crate) struct Lost {
    at: Instant,
    why: String,
    /// The peer said so itself (its failure reason).
    reported: bool,
}

impl Shared {}

/// One link the proxy serves.
#[derive(Debug)]
pub(crate) struct Entry {
    pub link: Arc<Link>,
    pub end: End,
    pub peer: Rank,
    pub channel: usize,
    mr: Option<MemHandle>,
    /// Next message number to send or to post a receive for.
    next: u64,
    /// Requests in flight: message number, request, the registration of
    /// a message sent by reference or landed in place (dropped once it
    /// completes), and where it lands.
    inflight: VecDeque<(u64, Request, Option<MemHandle>, Option<usize>)>,
    slots: usize,
    dead: bool,
    /// The observed call's operation on this link, while one runs.
    window: Option<Window>,
}

impl Entry {
    pub fn new(link: Arc<Link>, end: End, peer: Rank, channel: usize, slots: usize) -> Entry {
        Entry {
            link,
            end,
            peer,
            channel,
            mr: None,
            next: 0,
            inflight: VecDeque::new(),
            slots,
            dead: false,
            window: None,
        }
    }

    /// An observed call begins: its `count` messages on this link.
    fn open_window(&mut self, events: &Arc<dyn ProxyEvents>, count: u64) {
        let send = matches!(self.end, End::Send(_));
        let mut w = Window::open(events, &self.link, send, self.channel, self.peer, count);
        if !send {
            // Receives the proxy posted ahead, landed or still in flight.
            let inflight: Vec<u64> = self.inflight.iter().map(|i| i.0).collect();
            let [_, head, ..] = self.link.counters();
            for seq in head..self.next {
                if inflight.contains(&seq) {
                    w.posted_earlier(seq);
                } else {
                    w.landed_earlier(seq);
                }
            }
        }
        self.window = Some(w);
    }

    fn comm(&self) -> Comm {
        match self.end {
            End::Send(s) => Comm::Send(s),
            End::Recv(r) => Comm::Recv(r),
        }
    }

    fn fail(&mut self, sh: &Shared, seq: u64, e: &NetError) {
        self.dead = true;
        let dir = match self.end {
            End::Send(_) => format!("to rank {}", self.peer),
            End::Recv(_) => format!("from rank {}", self.peer),
        };
        sh.lose(
            self.peer,
            format!(
                "the network connection {dir} on channel {} failed at message {seq}: {e}",
                self.channel
            ),
            false,
        );
    }

    /// A sending end with nothing published left to send and nothing in
    /// flight (or a dead one: nothing more will leave); receiving ends
    /// hold nothing a peer waits for.
    fn drained(&self) -> bool {
        match self.end {
            End::Send(_) => {
                self.dead || (self.inflight.is_empty() && self.link.published(self.next).is_none())
            }
            End::Recv(_) => true,
        }
    }

    /// Moves what can move now; `true` if anything did.
    fn progress(&mut self, sh: &Shared) -> bool {
        if self.dead {
            return false;
        }
        let net = &*sh.net;
        let mr = match self.mr {
            Some(m) => m,
            None => {
                let (base, len) = self.link.region();
                match net.reg_mr(self.comm(), Region::host(base, len)) {
                    Ok(m) => *self.mr.insert(m),
                    Err(e) => {
                        self.fail(sh, 0, &e);
                        return false;
                    }
                }
            }
        };
        if let (Some(w), End::Recv(_)) = (&mut self.window, self.end) {
            w.consumed(self.link.counters()[1]);
        }
        let mut moved = false;
        // Completions, oldest first (a connection completes in order).
        while let Some(&(seq, req, own_mr, landed)) = self.inflight.front() {
            match net.test(req) {
                Ok(None) => break,
                Ok(Some(bytes)) => {
                    self.inflight.pop_front();
                    if let Some(w) = &mut self.window {
                        w.completed(seq, bytes);
                    }
                    if let Some(m) = own_mr {
                        let _ = net.dereg_mr(self.comm(), m);
                    }
                    match (self.end, landed) {
                        (End::Send(_), _) => self.link.release(seq),
                        (End::Recv(_), None) => self.link.publish(seq, bytes),
                        (End::Recv(_), Some(addr)) => self.link.publish_ref(seq, addr, bytes),
                    }
                    sh.rank.unpark();
                    moved = true;
                }
                Err(e) => {
                    self.fail(sh, seq, &e);
                    return moved;
                }
            }
        }
        // New requests, while the FIFO allows.
        while self.inflight.len() < self.slots {
            let seq = self.next;
            let mut own_mr = None;
            let mut landed = None;
            let started = match self.end {
                End::Send(s) => {
                    let Some((ptr, len, by_ref)) = self.link.published(seq) else {
                        break;
                    };
                    // A message by reference lies in the rank's own memory:
                    // registered for this one send.
                    let mr = if by_ref {
                        match net.reg_mr(Comm::Send(s), Region::host(ptr.cast_mut(), len)) {
                            Ok(m) => *own_mr.insert(m),
                            Err(e) => {
                                self.fail(sh, seq, &e);
                                return moved;
                            }
                        }
                    } else {
                        mr
                    };
                    // SAFETY: the slot stays the proxy's (the executor does
                    // not reuse it) until `release(seq)` after completion;
                    // the link outlives the connection (`close` comes first).
                    // A range by reference is the executor's memory, which
                    // it does not write until `release(seq)` and which
                    // outlives the call: the call returns only once its
                    // messages left, or (on failure) once every connection
                    // is closed, which joins the threads reading it.
                    unsafe { net.isend(s, Buf::new(ptr.cast_mut(), len, mr), self.channel as u32) }
                }
                End::Recv(r) => {
                    let Some(slot) = self.link.free_slot(seq) else {
                        break;
                    };
                    // A message to land in place goes straight to the
                    // rank's memory, registered for this one receive.
                    let (ptr, cap, mr) = match self.link.take_landing(seq) {
                        Some((addr, bytes)) => {
                            let ptr = addr as *mut u8;
                            match net.reg_mr(Comm::Recv(r), Region::host(ptr, bytes)) {
                                Ok(m) => {
                                    landed = Some((addr, bytes));
                                    (ptr, bytes, *own_mr.insert(m))
                                }
                                Err(e) => {
                                    self.fail(sh, seq, &e);
                                    return moved;
                                }
                            }
                        }
                        None => (slot, self.link.stride(), mr),
                    };
                    // SAFETY: the slot was drained by the executor and is
                    // not read again until `publish(seq)`; a landing range
                    // is touched by no step of the call but the one that
                    // consumes this message (`landing`), and the call does
                    // not return before it has; as above for lifetime.
                    unsafe { net.irecv(r, Buf::new(ptr, cap, mr), self.channel as u32) }
                }
            };
            match started {
                Ok(Some(req)) => {
                    if let Some(w) = &mut self.window {
                        let bytes = match self.end {
                            End::Send(_) => self.link.published(seq).map_or(0, |p| p.1),
                            End::Recv(_) => 0,
                        };
                        w.posted(seq, bytes);
                    }
                    self.inflight
                        .push_back((seq, req, own_mr, landed.map(|(a, _)| a)));
                    self.next += 1;
                    moved = true;
                }
                Ok(None) => {
                    if let Some(m) = own_mr {
                        let _ = net.dereg_mr(self.comm(), m);
                    }
                    if let Some((addr, bytes)) = landed {
                        // Not posted: the next try takes it again.
                        self.link.put_back_landing(seq, addr, bytes);
                    }
                    break;
                }
                Err(e) => {
                    self.fail(sh, seq, &e);
                    return moved;
                }
            }
        }
        moved
    }
}

/// Longest failure reason a peer may send (longer ones are cut).
pub(crate) const REASON_BYTES: usize = 4096;

/// The receiving end of a peer's control connection: the one message it
/// ever carries is why the peer failed, sent just before it closes its
/// connections, so a rank blocked on a peer that failed because of a third
/// one names the whole chain.
#[derive(Debug)]
pub(crate) struct Control {
    pub peer: Rank,
    pub comm: RecvComm,
    buf: Box<[u8; REASON_BYTES]>,
    req: Option<Request>,
    done: bool,
}

impl Control {
    pub fn new(peer: Rank, comm: RecvComm) -> Control {
        Control {
            peer,
            comm,
            buf: Box::new([0; REASON_BYTES]),
            req: None,
            done: false,
        }
    }

    fn progress(&mut self, sh: &Shared) -> bool {
        if self.done {
            return false;
        }
        let net = &*sh.net;
        let Some(req) = self.req else {
            let ptr = self.buf.as_mut_ptr();
            let posted = net
                .reg_mr(Comm::Recv(self.comm), Region::host(ptr, REASON_BYTES))
                // SAFETY: `buf` is boxed (it does not move) and lives in
                // this entry, which outlives the connection (closed before
                // the proxy lets go of its entries).
                .and_then(|mr| unsafe {
                    net.irecv(self.comm, Buf::new(ptr, REASON_BYTES, mr), u32::MAX)
                });
            match posted {
                Ok(r) => self.req = r,
                Err(_) => self.done = true,
            }
            return true;
        };
        match net.test(req) {
            Ok(None) => false,
            Ok(Some(n)) => {
                self.done = true;
                let why = String::from_utf8_lossy(&self.buf[..n.min(REASON_BYTES)]);
                sh.lose(self.peer, format!("rank {} failed: {why}", self.peer), true);
                true
            }
            // Closed without a reason: the data connections tell the rest.
            Err(_) => {
                self.done = true;
                false
            }
        }
    }
}

/// Every link and control connection of the process: what a pass of the
/// proxy moves, whichever thread runs it.
#[derive(Debug)]
pub(crate) struct Pump {
    rx: Receiver<Entry>,
    entries: Vec<Entry>,
    controls: Vec<Control>,
}

impl Pump {
    pub fn new(rx: Receiver<Entry>, controls: Vec<Control>) -> Pump {
        Pump {
            rx,
            entries: Vec::new(),
            controls,
        }
    }

    /// An observed call begins: each of `links` (with the count of the
    /// call's messages on it) gets its operation.
    pub fn open_windows(&mut self, events: &Arc<dyn ProxyEvents>, links: &[(Arc<Link>, u64)]) {
        while let Ok(e) = self.rx.try_recv() {
            self.entries.push(e);
        }
        for e in &mut self.entries {
            if let Some(&(_, n)) = links.iter().find(|(l, _)| Arc::ptr_eq(l, &e.link)) {
                if n > 0 {
                    e.open_window(events, n);
                }
            }
        }
    }

    /// The observed call returned: every operation it opened stops.
    pub fn close_windows(&mut self) {
        for e in &mut self.entries {
            if let Some(w) = e.window.take() {
                w.close();
            }
        }
    }

    /// Moves what can move now on every link; `true` if anything did.
    pub fn pass(&mut self, sh: &Shared) -> bool {
        while let Ok(e) = self.rx.try_recv() {
            self.entries.push(e);
        }
        let mut moved = false;
        for c in &mut self.controls {
            moved |= c.progress(sh);
        }
        for e in &mut self.entries {
            moved |= e.progress(sh);
        }
        if sh.draining.load(Ordering::Acquire) && !moved && self.entries.iter().all(Entry::drained)
        {
            sh.drained.store(true, Ordering::Release);
        }
        moved
    }
}

/// Idle passes a polling proxy yields between before it parks.
const POLL_YIELDS: u32 = 2000;
/// A polling proxy's park once idle: short, since nothing wakes it.
const POLL_PARK: Duration = Duration::from_micros(200);

/// The proxy's loop: serve every link, park when nothing moves.
pub(crate) fn run(sh: Arc<Shared>, pump: Arc<Mutex<Pump>>, parker: Parker) {
    let mut idle = 0u32;
    while !sh.stop.load(Ordering::Acquire) {
        let moved = pump.lock().pass(&sh);
        // A transport that wakes nobody is polled: yield between passes
        // for a while after the last movement (a message in flight
        // completes within it), then poll at a slower pace.
        if sh.polled {
            idle = if moved { 0 } else { idle.saturating_add(1) };
            if idle < POLL_YIELDS {
                std::thread::yield_now();
            } else {
                parker.park_timeout(POLL_PARK);
            }
            continue;
        }
        // Idle: park at once. Every event unparks whoever runs the next
        // pass: a completion this thread, or the executor when it is
        // parked on the network (which then runs the pass); a slot the
        // executor published or drained is passed by the executor, or
        // unparks this thread when it holds the pump. An unpark that came
        // since the pass above makes this return at once. Spinning
        // or yielding here only takes the CPU from the socket threads and
        // executors it waits for (measured on 2 cores: docs/perf/LOG.md).
        if !moved {
            parker.park_timeout(Duration::from_millis(50));
        }
    }
    // The links' slots must outlive the requests naming them: the pump
    // (and its entries) lives until the last of this thread and the
    // `NetPart`, which closes every connection (joining their threads)
    // before setting `stop`.
}
