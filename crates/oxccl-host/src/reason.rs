//! The first failure's reason, kept in the segment every rank of a
//! process clique maps ([`GlobalCtl`]): the first failer claims the record,
//! writes it, then publishes it, so exactly one reason is written and
//! readers see it whole.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::shm::GlobalCtl;

/// `reason_state` values.
const FREE: u32 = 0;
const WRITING: u32 = 1;
const WRITTEN: u32 = 2;

impl GlobalCtl {
    /// Records `reason` (cut to the record's size) if no failure was
    /// recorded yet; `false` where another failer got there first.
    pub(crate) fn record_reason(&self, reason: &str) -> bool {
        if self
            .reason_state
            .compare_exchange(FREE, WRITING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        let b = reason.as_bytes();
        let n = b.len().min(self.reason.len() * 8);
        for (i, w) in self.reason.iter().enumerate() {
            let mut word = [0u8; 8];
            for (k, x) in word.iter_mut().enumerate() {
                if let Some(&c) = b.get(i * 8 + k).filter(|_| i * 8 + k < n) {
                    *x = c;
                }
            }
            w.store(u64::from_le_bytes(word), Ordering::Relaxed);
        }
        self.reason_len.store(n as u32, Ordering::Relaxed);
        self.reason_state.store(WRITTEN, Ordering::Release);
        true
    }

    /// The recorded reason. A later failer marks the clique broken at
    /// once, so a rank it wakes can come here while the first failer is
    /// still writing (a few stores): wait up to `wait` for that, not
    /// forever, since the writer may be killed between claim and publish.
    /// `None`: nothing recorded (or its writer never finished).
    pub(crate) fn recorded_reason(&self, wait: Duration) -> Option<String> {
        let until = Instant::now() + wait;
        let mut state = self.reason_state.load(Ordering::Acquire);
        while state == WRITING && Instant::now() < until {
            std::thread::yield_now();
            state = self.reason_state.load(Ordering::Acquire);
        }
        if state != WRITTEN {
            return None;
        }
        let n = self.reason_len.load(Ordering::Relaxed) as usize;
        let bytes: Vec<u8> = self
            .reason
            .iter()
            .flat_map(|w| w.load(Ordering::Relaxed).to_le_bytes())
            .take(n)
            .collect();
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, AtomicU64};

    use super::*;

    fn blank() -> GlobalCtl {
        GlobalCtl {
            broken: AtomicU32::new(0),
            reason_state: AtomicU32::new(FREE),
            reason_len: AtomicU32::new(0),
            reason: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    #[test]
    fn the_first_reason_wins_and_reads_back_whole() {
        let g = blank();
        assert_eq!(g.recorded_reason(Duration::ZERO), None);
        assert!(g.record_reason("rank 2 (pid 7) exited"));
        assert!(!g.record_reason("rank 1: aborted"));
        let long = "x".repeat(2000);
        let h = blank();
        assert!(h.record_reason(&long));
        assert_eq!(
            g.recorded_reason(Duration::ZERO).as_deref(),
            Some("rank 2 (pid 7) exited")
        );
        assert_eq!(h.recorded_reason(Duration::ZERO).unwrap().len(), 800);
    }

    /// A reader woken while the first failer is still writing (the record
    /// claimed, not yet published) gets the reason once it is published,
    /// not an anonymous failure: the multiprocess test that kills a rank
    /// once read "a peer failed" here. A writer that never publishes
    /// costs the reader `wait`, then `None`.
    #[test]
    fn a_reader_waits_for_a_reason_being_written() {
        let g = blank();
        g.reason_state.store(WRITING, Ordering::Release);
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                g.reason_state.store(FREE, Ordering::Release);
                assert!(g.record_reason("rank 2 (pid 7) exited"));
            });
            assert_eq!(
                g.recorded_reason(Duration::from_secs(10)).as_deref(),
                Some("rank 2 (pid 7) exited")
            );
        });
        let stuck = blank();
        stuck.reason_state.store(WRITING, Ordering::Release);
        let t = Instant::now();
        assert_eq!(stuck.recorded_reason(Duration::from_millis(30)), None);
        assert!(t.elapsed() >= Duration::from_millis(30));
    }
}
