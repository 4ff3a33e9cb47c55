//! `ncclGroupStart`/`ncclGroupEnd` on the calling thread: a depth counter
//! (groups nest; only the outermost end runs anything), the operations
//! issued meanwhile, communicators whose init or split was started inside
//! the group, and the first error, which the end reports (as NCCL, a failed
//! call inside a group fails the whole group).

use std::cell::RefCell;
use std::sync::Arc;

use crate::error::CError;
use crate::exec::Pending;
use crate::handle::CComm;

/// A split started inside a group: its child's handle (0: none).
pub type SplitThread = std::thread::JoinHandle<crate::error::CResult<usize>>;

#[derive(Debug, Default)]
pub struct State {
    pub depth: u32,
    pub ops: Vec<Pending>,
    pub inits: Vec<Arc<CComm>>,
    /// Splits started in the group, with where each child goes.
    pub splits: Vec<(SplitThread, usize)>,
    pub error: Option<CError>,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

/// Whether the calling thread is inside a group.
pub fn active() -> bool {
    STATE.with(|s| s.borrow().depth > 0)
}

pub fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    STATE.with(|s| f(&mut s.borrow_mut()))
}

/// Takes the group's contents when its outermost end is reached.
pub fn take() -> State {
    STATE.with(|s| std::mem::take(&mut *s.borrow_mut()))
}
