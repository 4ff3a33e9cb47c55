//! One-way connections: a FIFO of message slots plus a semaphore.
//!
//! A [`Link`] carries everything rank `from` sends rank `to` on one
//! channel. Slots belong to the receiver side (here: the fabric's shared
//! memory). The protocol is NCCL's head/tail counters:
//!
//! - the sender may fill slot `tail % slots` once `tail - head < slots`; it
//!   writes the payload and the slot's length, then stores `tail + 1` with
//!   Release;
//! - the receiver may read slot `head % slots` once `tail > head` (Acquire),
//!   and when done stores `head + 1` with Release, which hands the slot back.
//!
//! Counters are 64-bit and only grow, so a link needs no reset between
//! calls: each call starts where the last one stopped. Each counter has a
//! single writer, so plain stores suffice; the Acquire loads on the other
//! side order the slot's contents.
//!
//! The semaphore (`posted`/`consumed`) serves `Signal`/`Wait` steps: a
//! signal is a Release increment of `posted`; a wait succeeds once `posted`
//! exceeds `consumed` (Acquire) and then bumps `consumed`, which only the
//! receiver touches.

use std::alloc::{self, Layout};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use crate::shm::{LinkCtr, Segment};

/// Slot memory: `slots × stride` bytes, 64-byte aligned, zero-initialised.
#[derive(Debug)]
struct SlotMem {
    base: *mut u8,
    layout: Layout,
}

// SAFETY: `SlotMem` owns its allocation; concurrent access to the bytes is
// ordered by the head/tail protocol of `Link` (a slot has one writer at a
// time, and its readers run only after the writer's Release).
unsafe impl Send for SlotMem {}
// SAFETY: as above; `&SlotMem` only hands out the base address.
unsafe impl Sync for SlotMem {}

impl SlotMem {
    fn new(bytes: usize) -> SlotMem {
        let layout = Layout::from_size_align(bytes.max(64), 64).expect("slot memory layout");
        // SAFETY: the layout has a non-zero size. Zeroed memory comes from
        // calloc/mmap, so untouched slots cost no physical pages.
        let base = unsafe { alloc::alloc_zeroed(layout) };
        if base.is_null() {
            alloc::handle_alloc_error(layout);
        }
        SlotMem { base, layout }
    }
}

impl Drop for SlotMem {
    fn drop(&mut self) {
        // SAFETY: `base` came from `alloc_zeroed` with this very layout.
        unsafe { alloc::dealloc(self.base, self.layout) }
    }
}

/// Where a link's slots live.
#[derive(Debug)]
enum Slots {
    /// This process's heap, allocated on first message, so signal-only
    /// links cost nothing.
    Lazy(OnceLock<SlotMem>),
    /// A shared segment (ranks in several processes).
    Fixed(*mut u8),
}

/// The memory a thread-mode link owns.
#[derive(Debug)]
struct Owned {
    ctr: LinkCtr,
    lens: Box<[AtomicU64]>,
    /// Per slot: the address of a message sent by reference or landed in
    /// place (0: the message is in the slot). See [`Link::publish_ref`].
    refs: Box<[AtomicUsize]>,
    /// Receiving end: messages to land in place, `(seq, addr, bytes)` in
    /// order (see [`Link::expect_landing`]).
    landings: parking_lot::Mutex<std::collections::VecDeque<(u64, usize, usize)>>,
}

/// A one-way connection `(channel, from, to)`: counters, slot lengths and
/// slots, owned here (ranks as threads) or in a segment that the
/// receiver's process shares with the sender's.
#[derive(Debug)]
pub(crate) struct Link {
    ctr: *const LinkCtr,
    /// Length in bytes of the message in each slot (`nslots` of them).
    lens: *const AtomicU64,
    nslots: usize,
    slots: Slots,
    stride: usize,
    /// Set once a network proxy sends this link's messages: the executor
    /// may then publish messages by reference ([`Link::publish_ref`]).
    by_ref: AtomicBool,
    /// Set once a network proxy receives this link's messages and may
    /// land them in place ([`Link::expect_landing`]).
    lands: AtomicBool,
    _own: Option<Box<Owned>>,
    _seg: Option<Arc<Segment>>,
}

// SAFETY: the pointers lead into memory the link owns (`_own`, the slot
// allocation) or keeps mapped (`_seg`); concurrent access goes through
// atomics, and slot bytes are ordered by the head/tail protocol.
unsafe impl Send for Link {}
// SAFETY: as above.
unsafe impl Sync for Link {}

impl Link {
    pub(crate) fn new(slots: usize, slot_bytes: usize) -> Link {
        let own = Box::new(Owned {
            ctr: LinkCtr::default(),
            lens: (0..slots).map(|_| AtomicU64::new(0)).collect(),
            refs: (0..slots).map(|_| AtomicUsize::new(0)).collect(),
            landings: Default::default(),
        });
        Link {
            ctr: &own.ctr,
            lens: own.lens.as_ptr(),
            nslots: slots,
            slots: Slots::Lazy(OnceLock::new()),
            // Keep every slot 64-byte aligned (a cache line; any element type).
            stride: slot_bytes.next_multiple_of(64),
            by_ref: AtomicBool::new(false),
            lands: AtomicBool::new(false),
            _own: Some(own),
            _seg: None,
        }
    }

    /// A link whose counters, lengths and slots live in `seg`.
    ///
    /// # Safety
    /// `ctr`, `lens` (`nslots` entries) and `slots` (`nslots × stride`
    /// bytes, 64-byte aligned) lie inside `seg`'s mapping, are used for this
    /// link only, and every process agrees on where.
    pub(crate) unsafe fn mapped(
        seg: Arc<Segment>,
        ctr: *const LinkCtr,
        lens: *const AtomicU64,
        slots: *mut u8,
        nslots: usize,
        stride: usize,
    ) -> Link {
        Link {
            ctr,
            lens,
            nslots,
            slots: Slots::Fixed(slots),
            stride,
            by_ref: AtomicBool::new(false),
            lands: AtomicBool::new(false),
            _own: None,
            _seg: Some(seg),
        }
    }

    fn ctr(&self) -> &LinkCtr {
        // SAFETY: `ctr` points into memory this link keeps alive.
        unsafe { &*self.ctr }
    }

    fn len_of(&self, seq: u64) -> &AtomicU64 {
        let i = (seq % self.slots()) as usize;
        // SAFETY: `i < nslots`, and `lens` has `nslots` entries kept alive.
        unsafe { &*self.lens.add(i) }
    }

    fn slots(&self) -> u64 {
        self.nslots as u64
    }

    fn slot_ptr(&self, seq: u64) -> *mut u8 {
        let base = match &self.slots {
            Slots::Lazy(mem) => {
                mem.get_or_init(|| SlotMem::new(self.stride * self.nslots))
                    .base
            }
            Slots::Fixed(p) => *p,
        };
        let i = (seq % self.slots()) as usize;
        // SAFETY: `i < slots`, so the offset stays inside the
        // `stride × slots` bytes of slot memory.
        unsafe { base.add(i * self.stride) }
    }

    /// Sender side: the slot to fill next, if the receiver has freed one.
    /// Counters no honest pair of ranks writes (the head past the tail, or
    /// more messages in flight than slots: a corrupt or hostile peer's
    /// segment) are an error saying so; nothing is touched.
    pub(crate) fn try_reserve(&self) -> Result<Option<(u64, *mut u8)>, String> {
        let t = self.ctr().tail.load(Ordering::Relaxed);
        // Acquire: the receiver's reads of the slot we are about to reuse
        // happen before our writes into it.
        let h = self.ctr().head.load(Ordering::Acquire);
        let queued = self.in_flight(t, h)?;
        Ok((queued < self.slots()).then(|| (t, self.slot_ptr(t))))
    }

    /// Messages between `head` and `tail`, if the counters are sane:
    /// `head <= tail <= head + slots`.
    fn in_flight(&self, tail: u64, head: u64) -> Result<u64, String> {
        tail.checked_sub(head)
            .filter(|&q| q <= self.slots())
            .ok_or_else(|| {
                format!(
                    "its FIFO counters read tail {tail}, head {head} for {} slots",
                    self.nslots
                )
            })
    }

    /// Sender side: publishes slot `seq` (from `try_reserve`) holding
    /// `bytes` bytes.
    pub(crate) fn publish(&self, seq: u64, bytes: usize) {
        if let Some(r) = self.ref_of(seq) {
            r.store(0, Ordering::Relaxed);
        }
        self.len_of(seq).store(bytes as u64, Ordering::Relaxed);
        self.ctr().tail.store(seq + 1, Ordering::Release);
    }

    fn ref_of(&self, seq: u64) -> Option<&AtomicUsize> {
        let own = self._own.as_ref()?;
        own.refs.get((seq % self.slots()) as usize)
    }

    /// Lets the executor publish messages by reference: called by the
    /// network proxy that sends this link's messages. Links in shared
    /// memory never are (their reader is another process).
    pub(crate) fn send_by_reference(&self) {
        if self._own.is_some() {
            self.by_ref.store(true, Ordering::Release);
        }
    }

    /// Lets the executor ask for messages landed in place: called by the
    /// network proxy that receives this link's messages.
    pub(crate) fn land_in_place(&self) {
        if self._own.is_some() {
            self.lands.store(true, Ordering::Release);
        }
    }

    /// Whether [`Link::expect_landing`] may be used.
    pub(crate) fn lands(&self) -> bool {
        self.lands.load(Ordering::Acquire)
    }

    /// Receiving end: message `seq` should land as `bytes` bytes at
    /// `addr` (the rank's memory, untouched by anything else until the
    /// message is consumed). Calls come in `seq` order.
    pub(crate) fn expect_landing(&self, seq: u64, addr: usize, bytes: usize) {
        if let Some(own) = &self._own {
            own.landings.lock().push_back((seq, addr, bytes));
        }
    }

    /// Network proxy, receiving end: where message `seq` lands, if it is
    /// to land in place (forgetting landings of earlier messages, which
    /// were already received into their slots).
    pub(crate) fn take_landing(&self, seq: u64) -> Option<(usize, usize)> {
        let own = self._own.as_ref()?;
        let mut q = own.landings.lock();
        while q.front().is_some_and(|&(s, ..)| s < seq) {
            q.pop_front();
        }
        match q.front() {
            Some(&(s, addr, bytes)) if s == seq => {
                q.pop_front();
                Some((addr, bytes))
            }
            _ => None,
        }
    }

    /// Undoes [`Link::take_landing`]`(seq)` (the receive could not be
    /// posted yet).
    pub(crate) fn put_back_landing(&self, seq: u64, addr: usize, bytes: usize) {
        if let Some(own) = &self._own {
            own.landings.lock().push_front((seq, addr, bytes));
        }
    }

    /// Whether [`Link::publish_ref`] may be used.
    pub(crate) fn by_reference(&self) -> bool {
        self.by_ref.load(Ordering::Acquire)
    }

    /// Publishes message `seq` as the `bytes` bytes at `addr`, its slot
    /// left empty. Sender side (a link the network proxy sends): the
    /// rank's own memory, which the proxy sends from directly; the sender
    /// must not write those bytes until [`Link::released`]`(seq)`.
    /// Network proxy, receiving end: a message landed in place.
    pub(crate) fn publish_ref(&self, seq: u64, addr: usize, bytes: usize) {
        let r = self
            .ref_of(seq)
            .expect("publish_ref on a link that sends by reference");
        r.store(addr, Ordering::Relaxed);
        self.len_of(seq).store(bytes as u64, Ordering::Relaxed);
        self.ctr().tail.store(seq + 1, Ordering::Release);
    }

    /// Sender side: whether message `seq` has been handed back (sent, for
    /// a network link).
    pub(crate) fn released(&self, seq: u64) -> bool {
        self.ctr().head.load(Ordering::Acquire) > seq
    }

    /// Receiver side: the next message (sequence, slot, length in bytes),
    /// if one has arrived. Counters or a length no honest sender writes
    /// (more messages than slots, a message longer than its slot) are an
    /// error saying so; nothing is read.
    #[allow(clippy::type_complexity)]
    pub(crate) fn try_peek(&self) -> Result<Option<(u64, *const u8, usize)>, String> {
        let h = self.ctr().head.load(Ordering::Relaxed);
        let t = self.ctr().tail.load(Ordering::Acquire);
        if self.in_flight(t, h)? == 0 {
            return Ok(None);
        }
        let len = self.len_of(h).load(Ordering::Relaxed);
        let ptr = self.message_ptr(h);
        // A message by reference (thread-mode links only) may be longer
        // than a slot; one in its slot may not.
        if ptr == self.slot_ptr(h).cast_const() && len > self.stride as u64 {
            return Err(format!(
                "its message #{h} claims {len} bytes in a {}-byte slot",
                self.stride
            ));
        }
        Ok(Some((h, ptr, len as usize)))
    }

    /// Where published message `seq` lies: its slot, or where it was
    /// published by reference.
    fn message_ptr(&self, seq: u64) -> *const u8 {
        match self.ref_of(seq).map(|r| r.load(Ordering::Relaxed)) {
            Some(addr) if addr != 0 => addr as *const u8,
            _ => self.slot_ptr(seq).cast_const(),
        }
    }

    /// Receiver side: hands slot `seq` (from `try_peek`) back to the sender.
    pub(crate) fn release(&self, seq: u64) {
        self.ctr().head.store(seq + 1, Ordering::Release);
    }

    /// Network proxy, sending end: message `seq` (address, length in
    /// bytes, whether it is by reference: outside the slots) once the
    /// executor has published it. The slot (and a referenced range) stays
    /// the proxy's until it [`Link::release`]s it (after the bytes left).
    pub(crate) fn published(&self, seq: u64) -> Option<(*const u8, usize, bool)> {
        let t = self.ctr().tail.load(Ordering::Acquire);
        (seq < t).then(|| {
            let len = self.len_of(seq).load(Ordering::Relaxed) as usize;
            let ptr = self.message_ptr(seq);
            (ptr, len, ptr != self.slot_ptr(seq).cast_const())
        })
    }

    /// Network proxy, receiving end: slot `seq` to receive into, once the
    /// executor has drained what it held (`seq - head < slots`). The proxy
    /// then [`Link::publish`]es it.
    pub(crate) fn free_slot(&self, seq: u64) -> Option<*mut u8> {
        let h = self.ctr().head.load(Ordering::Acquire);
        (seq - h.min(seq) < self.slots()).then(|| self.slot_ptr(seq))
    }

    /// The slots' memory `(base, bytes)` (allocated now if it was not),
    /// for a transport's registration.
    pub(crate) fn region(&self) -> (*mut u8, usize) {
        (self.slot_ptr(0), self.stride * self.nslots)
    }

    /// Bytes per slot: the most one message may hold.
    pub(crate) fn stride(&self) -> usize {
        self.stride
    }

    /// `Signal`: releases this thread's earlier writes to the waiter.
    pub(crate) fn signal(&self) {
        self.ctr().posted.fetch_add(1, Ordering::Release);
    }

    /// `Wait`: consumes one signal if one is pending.
    pub(crate) fn try_wait(&self) -> bool {
        let consumed = self.ctr().consumed.load(Ordering::Relaxed);
        if self.ctr().posted.load(Ordering::Acquire) > consumed {
            self.ctr().consumed.store(consumed + 1, Ordering::Relaxed);
            true
        } else {
            false
        }
    }

    /// Counters `(tail, head, posted, consumed)`, for tests and diagnostics.
    pub(crate) fn counters(&self) -> [u64; 4] {
        [
            self.ctr().tail.load(Ordering::Acquire),
            self.ctr().head.load(Ordering::Acquire),
            self.ctr().posted.load(Ordering::Acquire),
            self.ctr().consumed.load(Ordering::Acquire),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_wrap_around_slots_and_only_grow() {
        let l = Link::new(2, 16);
        let mut seen = Vec::new();
        for i in 0..5u64 {
            let (t, p) = l.try_reserve().unwrap().expect("room");
            assert_eq!(t, i);
            // SAFETY: the slot holds 16 bytes and is ours until published.
            unsafe { p.write(i as u8) };
            l.publish(t, 1);
            if i % 2 == 1 {
                assert!(l.try_reserve().unwrap().is_none(), "two slots are full");
                for _ in 0..2 {
                    let (h, p, len) = l.try_peek().unwrap().expect("message");
                    assert_eq!(len, 1);
                    // SAFETY: the slot was published with one byte.
                    seen.push(unsafe { p.read() });
                    l.release(h);
                }
            }
        }
        let (h, p, _) = l.try_peek().unwrap().expect("last message");
        // SAFETY: as above.
        seen.push(unsafe { p.read() });
        l.release(h);
        assert_eq!(seen, [0, 1, 2, 3, 4]);
        assert!(l.try_peek().unwrap().is_none());
        assert_eq!(l.counters()[..2], [5, 5]);
    }

    #[test]
    fn waits_consume_signals_in_order() {
        let l = Link::new(2, 8);
        assert!(!l.try_wait());
        l.signal();
        l.signal();
        assert!(l.try_wait());
        assert!(l.try_wait());
        assert!(!l.try_wait());
        assert_eq!(l.counters()[2..], [2, 2]);
    }
}
