//! Sleeping until something changes, among threads or processes: a futex
//! word bumped by every change, which sleepers wait on. Woken, a sleeper
//! looks again without taking a lock, so many sleepers woken together run
//! at once (a mutex and a condition variable let 128 rank threads go one
//! after another through the mutex).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rustix::event::Timespec;
use rustix::thread::futex;

/// Sleeps while `word` (in a region shared between processes) holds
/// `seen`, at most `timeout`; returns early on [`futex_wake_all`], a
/// signal, or when the word already moved.
pub fn futex_wait(word: &AtomicU32, seen: u32, timeout: Duration) {
    let ts = Timespec {
        tv_sec: timeout.as_secs() as _,
        tv_nsec: timeout.subsec_nanos() as _,
    };
    // Not FUTEX_PRIVATE: the sleepers may be in other processes.
    let _ = futex::wait(word, futex::Flags::empty(), seen, Some(&ts));
}

/// Wakes every thread or process sleeping on `word` in [`futex_wait`].
pub fn futex_wake_all(word: &AtomicU32) {
    let _ = futex::wake(word, futex::Flags::empty(), i32::MAX as u32);
}

/// A change counter and its sleepers; `#[repr(C)]` and plain atomics, so
/// it can live in memory that processes share (zeroed is a valid bell).
#[repr(C)]
#[derive(Debug, Default)]
pub struct Bell {
    /// Bumped by every [`Bell::ring`]; the futex word.
    epoch: AtomicU32,
    /// Waiters asleep (or about to be) on `epoch`.
    sleepers: AtomicU32,
}

impl Bell {
    /// Records a change and wakes every sleeper. Call it after the change
    /// is visible: a sleeper that read the epoch before this bump does not
    /// sleep through it, and one that reads it after sees the change.
    pub fn ring(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            futex_wake_all(&self.epoch);
        }
    }

    /// Sleeps until a [`Bell::ring`], at most `nap`, unless `ready`
    /// answers first; returns what `ready` answered (`None` after a
    /// sleep: the caller looks again).
    pub fn sleep_unless<T>(
        &self,
        nap: Duration,
        ready: &mut impl FnMut() -> Option<T>,
    ) -> Option<T> {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let seen = self.epoch.load(Ordering::SeqCst);
        let found = ready();
        if found.is_none() {
            futex_wait(&self.epoch, seen, nap);
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::Instant;

    #[test]
    fn a_futex_sleeper_wakes_when_woken() {
        let word = AtomicU32::new(0);
        // A word that already moved returns at once.
        futex_wait(&word, 1, Duration::from_secs(60));
        let t = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(10));
                word.store(1, Ordering::SeqCst);
                futex_wake_all(&word);
            });
            while word.load(Ordering::SeqCst) == 0 {
                futex_wait(&word, 0, Duration::from_secs(60));
            }
        });
        // A lost wake-up would have slept the whole minute.
        assert!(t.elapsed() < Duration::from_secs(50));
    }

    /// Many sleepers, one change rung once: every one wakes long before
    /// its minute-long nap would end (a lost wake-up sleeps it out).
    #[test]
    fn one_ring_wakes_every_sleeper() {
        let bell = Bell::default();
        let done = AtomicBool::new(false);
        let t = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..16 {
                s.spawn(|| {
                    let mut ready = || done.load(Ordering::SeqCst).then_some(());
                    while bell
                        .sleep_unless(Duration::from_secs(60), &mut ready)
                        .is_none()
                    {}
                });
            }
            std::thread::sleep(Duration::from_millis(20));
            done.store(true, Ordering::SeqCst);
            bell.ring();
        });
        assert!(t.elapsed() < Duration::from_secs(50));
    }
}
