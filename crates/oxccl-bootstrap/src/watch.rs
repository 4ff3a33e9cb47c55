//! Noticing a peer process's death: a pidfd per peer on this host, polled
//! by one thread that calls back once per lost peer. Backends use it to
//! fail their waits promptly, naming the lost rank (the CUDA backend sets
//! its host-written abort flag, which every device wait polls).

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};

use crate::error::BootstrapError;
use crate::ring::Bootstrap;

/// How often the watcher looks at its stop flag when nothing wakes it
/// (the wake-up descriptor does at once; this only bounds a lost wake).
const TICK: Duration = Duration::from_millis(100);

/// A running watcher of every other rank's process (stopped on drop).
#[derive(Debug)]
pub struct PeerWatch {
    stop: Arc<AtomicBool>,
    /// Written on drop so the watcher's poll returns at once: an aborted
    /// call that frees its communicator joins the watcher, and should not
    /// wait out a tick for it.
    wake: Arc<OwnedFd>,
    lost: Arc<Mutex<Option<(u32, u32)>>>,
    thread: Option<JoinHandle<()>>,
}

impl PeerWatch {
    /// Watches the processes of `boot`'s other ranks; `on_lost(rank, pid)`
    /// runs on the watcher thread for each that exits. Every rank must be
    /// on this host.
    pub fn start(
        boot: &Bootstrap,
        on_lost: impl Fn(u32, u32) + Send + 'static,
    ) -> Result<PeerWatch, BootstrapError> {
        let me = boot.rank();
        let peers = boot
            .descs()
            .iter()
            .filter(|d| d.rank != me)
            .map(|d| (d.rank, d.pid))
            .collect();
        PeerWatch::start_pids(me, peers, on_lost)
    }

    /// Watches the processes `peers` (`(rank, pid)`) on behalf of rank
    /// `me`, as [`PeerWatch::start`] does.
    pub fn start_pids(
        me: u32,
        peers: Vec<(u32, u32)>,
        on_lost: impl Fn(u32, u32) + Send + 'static,
    ) -> Result<PeerWatch, BootstrapError> {
        let mut fds: Vec<(u32, u32, OwnedFd)> = Vec::new();
        for (rank, pid) in peers {
            let bad = |why: String| {
                BootstrapError::InvalidArgument(format!("watching rank {rank} (pid {pid}): {why}"))
            };
            let p = rustix::process::Pid::from_raw(pid as i32)
                .ok_or_else(|| bad("not a process id".into()))?;
            let fd = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty())
                .map_err(|e| bad(e.to_string()))?;
            fds.push((rank, pid, fd));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let lost = Arc::new(Mutex::new(None));
        let wake = Arc::new(
            eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).map_err(|e| {
                BootstrapError::InvalidArgument(format!("making the watcher's wake-up: {e}"))
            })?,
        );
        let (s, l, w) = (stop.clone(), lost.clone(), wake.clone());
        let thread = std::thread::Builder::new()
            .name(format!("oxccl-peers-r{me}"))
            .spawn(move || {
                watch(fds, &s, &w, |r, pid| {
                    l.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert((r, pid));
                    on_lost(r, pid);
                })
            })
            .map_err(|e| BootstrapError::InvalidArgument(format!("spawning the watcher: {e}")))?;
        Ok(PeerWatch {
            stop,
            wake,
            lost,
            thread: Some(thread),
        })
    }

    /// The first peer seen exiting: `(rank, pid)`.
    pub fn lost(&self) -> Option<(u32, u32)> {
        *self.lost.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for PeerWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // A failed write leaves the tick to notice the flag.
        let _ = rustix::io::write(&*self.wake, &1u64.to_ne_bytes());
        if let Some(t) = self.thread.take() {
            // The callback may drop the last reference to the watcher's
            // owner, so this can run on the watcher itself: never join it.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

fn watch(
    mut fds: Vec<(u32, u32, OwnedFd)>,
    stop: &AtomicBool,
    wake: &OwnedFd,
    on_lost: impl Fn(u32, u32),
) {
    let tick = Timespec {
        tv_sec: 0,
        tv_nsec: TICK.as_nanos() as _,
    };
    while !stop.load(Ordering::Acquire) && !fds.is_empty() {
        // The wake-up first, then one per peer (index + 1).
        let mut pfds: Vec<PollFd<'_>> = std::iter::once(PollFd::new(wake, PollFlags::IN))
            .chain(fds.iter().map(|(_, _, fd)| PollFd::new(fd, PollFlags::IN)))
            .collect();
        if poll(&mut pfds, Some(&tick)).unwrap_or(0) == 0 {
            continue;
        }
        if !pfds[0].revents().is_empty() {
            return;
        }
        let gone: Vec<usize> = (1..pfds.len())
            .filter(|&i| !pfds[i].revents().is_empty())
            .map(|i| i - 1)
            .collect();
        drop(pfds);
        for &i in gone.iter().rev() {
            let (r, pid, _) = fds.swap_remove(i);
            on_lost(r, pid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A peer that exits is reported once with its rank and pid; one that
    /// lives on is not, and dropping the watcher stops it (its thread is
    /// joined, woken by the drop).
    #[test]
    fn an_exit_is_reported_and_a_drop_stops_the_watcher() {
        let mut dies = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        let mut lives = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let w = PeerWatch::start_pids(0, vec![(1, dies.id()), (2, lives.id())], move |r, pid| {
            tx.send((r, pid)).unwrap();
        })
        .unwrap();
        dies.wait().unwrap();
        let got = rx.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(got, (1, dies.id()));
        assert_eq!(w.lost(), Some(got));
        drop(w);
        // The watcher is gone with its callback: the channel is closed.
        assert!(matches!(rx.recv(), Err(mpsc::RecvError)));
        lives.kill().unwrap();
        lives.wait().unwrap();
    }
}
