//! A global allocator that measures, per thread and only while asked, the
//! most bytes live at once: what a decoder allocated for one input.
//! Install it in a binary with
//! `#[global_allocator] static A: oxccl_fuzz::alloc::Counting = oxccl_fuzz::alloc::Counting;`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// [`System`], counting what armed threads allocate.
#[derive(Debug)]
pub struct Counting;

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn note(delta: isize) {
    // `try_with`: the allocator also runs while thread locals are torn down.
    if ARMED.try_with(Cell::get).unwrap_or(false) {
        let live = LIVE.with(|l| {
            l.set(l.get() + delta);
            l.get()
        });
        PEAK.with(|p| p.set(p.get().max(live)));
    }
}

// SAFETY: every call is forwarded to `System` unchanged; the counting
// touches only const-initialised thread locals, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, forwarded.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            note(l.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, forwarded.
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            note(l.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(p, l) };
        note(-(l.size() as isize));
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: the caller's contract, forwarded.
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            note(new as isize - l.size() as isize);
        }
        q
    }
}

/// Runs `f` and returns what it returned and the most bytes it had
/// allocated at once on this thread (0 unless [`Counting`] is the global
/// allocator).
pub fn peak_during<R>(f: impl FnOnce() -> R) -> (R, usize) {
    /// Disarms on the way out, a panic's included.
    struct Armed;
    impl Drop for Armed {
        fn drop(&mut self) {
            ARMED.with(|a| a.set(false));
        }
    }
    LIVE.with(|l| l.set(0));
    PEAK.with(|p| p.set(0));
    ARMED.with(|a| a.set(true));
    let armed = Armed;
    let r = f();
    drop(armed);
    (r, PEAK.with(Cell::get).max(0) as usize)
}
