//! The launch gate of a device shared by more ranks than it has hardware
//! work queues.
//!
//! Each rank's kernels run on its own stream, and the driver maps a
//! context's streams onto at most `CUDA_DEVICE_MAX_CONNECTIONS` (≤ 32)
//! hardware queues, so past that count rank streams share queues. A queue
//! runs its entries in order and stalls at one whose stream dependency is
//! not met (the next kernel of a rank, a copy after it, an event wait);
//! when that entry waits on a kernel that spins for a peer whose kernel is
//! queued behind the entry, nothing moves until the deadline. That is the
//! first-call deadline of 64 ranks on one GPU (issue 16).
//!
//! The gate removes the cycle without touching the streams: a launch
//! returns only once every rank of the device has launched as many times,
//! so whatever a rank puts on its stream after call k (its call k+1, a copy
//! that waits for call k) reaches the hardware after every co-located
//! kernel of call k. Ahead of a call-k kernel in any queue there is then
//! only work that depends on calls before k, which (by induction, with
//! every block resident: see `World::max_channels`) completes. The cost is
//! one host rendezvous per call among the device's ranks, so the gate is on
//! only where the queues run out (`GateMode::Auto`).
//!
//! What it asks of the caller: the ranks of a device call from their own
//! threads (or in one group, whose end then launches each communicator on
//! a thread of its own). One thread that issues rank 0's call and then rank
//! 1's, outside a group, waits in rank 0's call until the deadline, which
//! the error explains. Every rank of the clique takes part in every launch,
//! as in the collectives; a Send/Recv group that leaves some ranks out is
//! the same wait.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::lock;

/// Whether launches on a device wait for its other ranks' launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum GateMode {
    /// On for a device whose rank streams (plus its setup stream) exceed
    /// its hardware queues.
    #[default]
    Auto,
    /// Always (for experiments: what it costs at few ranks).
    On,
    /// Never (for experiments: to see the queues' deadlock).
    Off,
}

impl GateMode {
    /// `OXCCL_LAUNCH_GATE`: `auto` (or unset), `on`/`1`, `off`/`0`; any
    /// other value is `Auto` with a warning.
    pub fn from_env() -> GateMode {
        match std::env::var("OXCCL_LAUNCH_GATE") {
            Err(_) => GateMode::Auto,
            Ok(v) => match v.trim().to_ascii_lowercase().as_str() {
                "" | "auto" => GateMode::Auto,
                "on" | "1" => GateMode::On,
                "off" | "0" => GateMode::Off,
                other => {
                    tracing::warn!("OXCCL_LAUNCH_GATE={other} is not auto, on or off: auto");
                    GateMode::Auto
                }
            },
        }
    }

    /// Whether a device with `ranks_here` rank streams and `queues`
    /// hardware queues is gated (its setup stream takes one queue too).
    pub fn gates(self, ranks_here: u32, queues: u32) -> bool {
        match self {
            GateMode::On => ranks_here > 1,
            GateMode::Off => false,
            GateMode::Auto => ranks_here > 1 && ranks_here + 1 > queues,
        }
    }
}

/// Hardware queues per context the driver gives this process: what
/// `CUDA_DEVICE_MAX_CONNECTIONS` says (read by the driver at context
/// creation; `driver::init` sets it unless the user did), else the
/// driver's default of 8; the driver caps it at 32.
pub fn hardware_queues() -> u32 {
    std::env::var("CUDA_DEVICE_MAX_CONNECTIONS")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .map_or(8, |n| n.clamp(1, 32))
}

/// Why a gate wait ended without every rank's launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GateFault {
    /// How long the wait lasted.
    pub waited: Duration,
    /// The device's ranks that had not launched this call.
    pub absent: Vec<u32>,
    /// It ended because the clique failed or was aborted, not at the
    /// deadline.
    pub aborted: bool,
}

/// How often a waiting launch looks at the clique's abort and failure
/// words (nothing wakes it for those).
const POLL: Duration = Duration::from_millis(5);

/// One device's gate: the launches each of its ranks has made.
#[derive(Debug)]
pub struct Gate {
    /// The clique ranks on this device, by slot.
    ranks: Vec<u32>,
    launched: Mutex<Vec<u64>>,
    /// Notified when the fewest launches of any slot grows.
    moved: Condvar,
}

impl Gate {
    /// A gate for the clique ranks `ranks` (one slot each, in this order).
    pub fn new(ranks: Vec<u32>) -> Gate {
        Gate {
            launched: Mutex::new(vec![0; ranks.len()]),
            ranks,
            moved: Condvar::new(),
        }
    }

    /// The slot of clique rank `rank`, if it is on this device.
    pub fn slot(&self, rank: u32) -> Option<usize> {
        self.ranks.iter().position(|&r| r == rank)
    }

    /// Counts a launch of `slot` without waiting (a launch that failed
    /// before reaching the stream: its peers must not wait for it).
    pub fn count(&self, slot: usize) {
        let mut l = lock(&self.launched);
        self.bump(&mut l, slot);
    }

    /// Counts a launch of `slot`, then waits until every slot has launched
    /// as many times, at most `deadline` (`None`: no deadline), returning
    /// early when `stop()` says the clique failed or was aborted.
    pub fn pass(
        &self,
        slot: usize,
        deadline: Option<Duration>,
        stop: impl Fn() -> bool,
    ) -> Result<(), GateFault> {
        let start = Instant::now();
        let end = deadline.and_then(|d| start.checked_add(d));
        let mut l = lock(&self.launched);
        let mine = self.bump(&mut l, slot);
        loop {
            if l.iter().all(|&n| n >= mine) {
                return Ok(());
            }
            let now = Instant::now();
            let aborted = stop();
            if aborted || end.is_some_and(|e| now >= e) {
                return Err(GateFault {
                    waited: now - start,
                    absent: self
                        .ranks
                        .iter()
                        .zip(l.iter())
                        .filter(|(_, &n)| n < mine)
                        .map(|(&r, _)| r)
                        .collect(),
                    aborted,
                });
            }
            let slice = end.map_or(POLL, |e| (e - now).min(POLL));
            l = self
                .moved
                .wait_timeout(l, slice)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Adds one launch to `slot` and wakes the waiters if that raised the
    /// fewest; returns the slot's new count.
    fn bump(&self, l: &mut [u64], slot: usize) -> u64 {
        let before = l.iter().copied().min().unwrap_or(0);
        if let Some(n) = l.get_mut(slot) {
            *n += 1;
        }
        if l.iter().copied().min().unwrap_or(0) > before {
            self.moved.notify_all();
        }
        l.get(slot).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    use super::*;

    #[test]
    fn auto_gates_only_past_the_queues() {
        assert!(!GateMode::Auto.gates(8, 32));
        assert!(!GateMode::Auto.gates(31, 32));
        assert!(GateMode::Auto.gates(32, 32));
        assert!(GateMode::Auto.gates(8, 8));
        assert!(!GateMode::Auto.gates(1, 1));
        assert!(GateMode::On.gates(2, 32));
        assert!(!GateMode::Off.gates(128, 32));
    }

    /// 128 ranks, 50 calls each: no rank returns from call k before every
    /// rank has launched call k.
    #[test]
    fn no_rank_passes_a_call_before_every_rank_launched_it() {
        const N: usize = 128;
        const CALLS: u64 = 50;
        let gate = Arc::new(Gate::new((0..N as u32).collect()));
        let launched: Arc<Vec<AtomicU64>> = Arc::new((0..N).map(|_| AtomicU64::new(0)).collect());
        let handles: Vec<_> = (0..N)
            .map(|s| {
                let (gate, launched) = (gate.clone(), launched.clone());
                std::thread::spawn(move || {
                    for k in 1..=CALLS {
                        launched[s].store(k, Ordering::SeqCst);
                        gate.pass(s, Some(Duration::from_secs(60)), || false)
                            .map_err(|f| format!("slot {s} call {k}: {f:?}"))?;
                        if let Some(p) = launched.iter().position(|l| l.load(Ordering::SeqCst) < k)
                        {
                            return Err(format!("slot {s} passed call {k} before slot {p}"));
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().expect("thread").expect("gate order");
        }
    }

    /// A rank that never launches: the others stop at the deadline, naming it.
    #[test]
    fn a_missing_rank_is_named_at_the_deadline() {
        let gate = Arc::new(Gate::new(vec![4, 5, 6]));
        let g = gate.clone();
        let t = std::thread::spawn(move || g.pass(1, Some(Duration::from_millis(100)), || false));
        let f = gate
            .pass(0, Some(Duration::from_millis(100)), || false)
            .expect_err("rank 6 never launched");
        assert_eq!(f.absent, vec![6]);
        assert!(!f.aborted);
        assert!(f.waited >= Duration::from_millis(100));
        assert_eq!(t.join().expect("thread").expect_err("same").absent, vec![6]);
    }

    /// An abort ends the wait without a deadline.
    #[test]
    fn an_abort_ends_the_wait() {
        let gate = Gate::new(vec![0, 1]);
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            s.store(true, Ordering::SeqCst);
        });
        let f = gate
            .pass(0, None, || stop.load(Ordering::SeqCst))
            .expect_err("aborted");
        t.join().expect("thread");
        assert!(f.aborted);
        assert_eq!(f.absent, vec![1]);
    }

    /// A failed launch is counted without waiting, so its peers pass.
    #[test]
    fn a_counted_failure_releases_the_peers() {
        let gate = Gate::new(vec![0, 1]);
        gate.count(1);
        assert_eq!(gate.pass(0, Some(Duration::from_secs(5)), || false), Ok(()));
        assert_eq!(gate.slot(1), Some(1));
        assert_eq!(gate.slot(7), None);
    }
}
