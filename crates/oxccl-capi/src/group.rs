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
    /// Communicators of calls refused for their arguments in the group:
    /// with the operations' own, they are told at the end (see
    /// [`State::post_refusal`]).
    pub refused: Vec<Arc<CComm>>,
}

impl State {
    /// A group that failed before running (a call in it was refused):
    /// posts the refusal on every communicator of the group, so the
    /// peers' matching group ends fail at once naming this rank rather
    /// than wait for it.
    pub fn post_refusal(&self) {
        let mut told: Vec<&Arc<CComm>> = Vec::new();
        for c in self.ops.iter().map(|p| &p.comm).chain(&self.refused) {
            if told.iter().any(|t| Arc::ptr_eq(t, c)) {
                continue;
            }
            told.push(c);
            if let Some(x) = c.ready() {
                x.refused_call();
            }
        }
    }
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
