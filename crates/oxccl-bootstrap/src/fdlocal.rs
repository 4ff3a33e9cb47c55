//! Descriptors between ranks that are threads of one process: no socket
//! is needed (the descriptor table is shared), so a send duplicates the
//! descriptors into a process-wide inbox that the receiving rank takes
//! them from. Nothing outside the process can reach it.

use std::collections::HashMap;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// (sender, tag, descriptors).
pub(crate) type Parcel = (u32, u64, Vec<OwnedFd>);

/// One communicator's inboxes in this process: (stamp, scope).
type Scope = (u64, u16);

#[derive(Default)]
struct Inboxes {
    /// Mailboxes of this scope alive in this process; the inboxes go when
    /// the last one does (parcels nobody will take).
    live: usize,
    by_rank: HashMap<u32, Vec<Parcel>>,
}

struct Registry {
    scopes: Mutex<HashMap<Scope, Inboxes>>,
    arrived: Condvar,
}

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| Registry {
        scopes: Mutex::new(HashMap::new()),
        arrived: Condvar::new(),
    })
}

fn lock() -> MutexGuard<'static, HashMap<Scope, Inboxes>> {
    registry().scopes.lock().unwrap_or_else(|p| p.into_inner())
}

/// A mailbox of `scope` opened in this process.
pub(crate) fn open(scope: Scope) {
    lock().entry(scope).or_default().live += 1;
}

/// A mailbox of `scope` closed: its rank's inbox goes, and every inbox of
/// the scope once no mailbox of it is left.
pub(crate) fn close(scope: Scope, rank: u32) {
    let mut all = lock();
    if let Some(s) = all.get_mut(&scope) {
        s.by_rank.remove(&rank);
        s.live = s.live.saturating_sub(1);
        if s.live == 0 {
            all.remove(&scope);
        }
    }
}

/// Leaves duplicates of `fds` for rank `to` from rank `from` under `tag`.
pub(crate) fn send(
    scope: Scope,
    from: u32,
    to: u32,
    tag: u64,
    fds: &[BorrowedFd<'_>],
) -> std::io::Result<()> {
    let dups = fds
        .iter()
        .map(|f| f.try_clone_to_owned())
        .collect::<std::io::Result<Vec<_>>>()?;
    lock()
        .entry(scope)
        .or_default()
        .by_rank
        .entry(to)
        .or_default()
        .push((from, tag, dups));
    registry().arrived.notify_all();
    Ok(())
}

/// Takes what rank `from` left for `me` under `tag`, waiting at most
/// `wait`; `None` if nothing came in that time.
pub(crate) fn take(
    scope: Scope,
    me: u32,
    from: u32,
    tag: u64,
    wait: Duration,
) -> Option<Vec<OwnedFd>> {
    let until = Instant::now() + wait;
    let mut all = lock();
    loop {
        let inbox = all.get_mut(&scope).and_then(|s| s.by_rank.get_mut(&me));
        if let Some(inbox) = inbox {
            if let Some(i) = inbox.iter().position(|p| p.0 == from && p.1 == tag) {
                return Some(inbox.swap_remove(i).2);
            }
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        all = registry()
            .arrived
            .wait_timeout(all, left)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn parcels_are_matched_by_sender_and_tag_and_go_with_the_last_mailbox() {
        let scope = (0x5eed, 3);
        open(scope);
        open(scope);
        let fd = rustix::fs::memfd_create("t", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        send(scope, 0, 1, 7, &[fd.as_fd()]).unwrap();
        send(scope, 2, 1, 7, &[]).unwrap();
        assert!(take(scope, 1, 0, 8, Duration::ZERO).is_none());
        assert!(take(scope, 1, 2, 7, Duration::ZERO).unwrap().is_empty());
        assert_eq!(take(scope, 1, 0, 7, Duration::ZERO).unwrap().len(), 1);
        send(scope, 0, 1, 9, &[fd.as_fd()]).unwrap();
        close(scope, 0);
        assert!(lock().contains_key(&scope));
        close(scope, 1);
        assert!(
            !lock().contains_key(&scope),
            "the last close leaves parcels behind"
        );
    }
}
