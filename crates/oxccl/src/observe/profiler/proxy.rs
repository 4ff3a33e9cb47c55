//! The proxy's events (`ncclProfileProxyOp`, `ncclProfileProxyStep`) for
//! the host backend's network transport: the launch on this thread names
//! its context and parent event here; the backend hands the sink to the
//! fabric, whose proxy reports through it (`oxccl_host::ProxyEvents`).
//!
//! As NCCL does, an operation is started when the mask asks for proxy
//! operations or steps (steps need their operation as parent), and steps
//! only when it asks for steps. Step states: `SendWait` once a message is
//! posted, `RecvWait` while a receive waits, `RecvGPUWait` (with the
//! bytes) once it landed until the rank consumes it.

use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use oxccl_host::{ProxyEvents, StepState};

use super::abi::{self, Body};
use super::Ctx;

/// One launch's proxy events.
#[derive(Debug)]
struct Sink {
    ctx: Arc<Ctx>,
    /// The parent operation's handle (an address of the plugin's).
    parent: usize,
    pid: i32,
}

/// Set once any launch has wanted proxy events: until then (always,
/// without a plugin asking) a call's look-up is one load and a branch.
static WANTED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// The launch running on this thread, if its plugin wants proxy events.
    static CURRENT: RefCell<Option<Arc<dyn ProxyEvents>>> = const { RefCell::new(None) };
}

/// A launch starts on this thread, under the event `parent`.
pub(super) fn begin(ctx: &Arc<Ctx>, parent: *mut c_void) {
    if ctx.mask & (abi::EV_PROXY_OP | abi::EV_PROXY_STEP) == 0 {
        return;
    }
    let sink: Arc<dyn ProxyEvents> = Arc::new(Sink {
        ctx: ctx.clone(),
        parent: parent as usize,
        pid: std::process::id() as i32,
    });
    WANTED.store(true, Ordering::Relaxed);
    CURRENT.with(|c| *c.borrow_mut() = Some(sink));
}

/// The launch on this thread ended.
pub(super) fn end() {
    if WANTED.load(Ordering::Relaxed) {
        CURRENT.with(|c| c.borrow_mut().take());
    }
}

/// The sink of the launch running on this thread, for the backend.
pub(crate) fn current() -> Option<Arc<dyn ProxyEvents>> {
    if !WANTED.load(Ordering::Relaxed) {
        return None;
    }
    CURRENT.with(|c| c.borrow().clone())
}

impl ProxyEvents for Sink {
    fn op_start(&self, channel: u32, peer: u32, send: bool, steps: u32, chunk: usize) -> usize {
        let proxy_op = abi::ProxyOp {
            pid: self.pid,
            channel_id: channel.min(255) as u8,
            peer: peer as c_int,
            n_steps: steps.min(c_int::MAX as u32) as c_int,
            chunk_size: chunk.min(c_int::MAX as usize) as c_int,
            is_send: send as c_int,
        };
        // Asked for by either bit (NCCL starts it for both).
        let h = self.ctx.start_gated(
            abi::EV_PROXY_OP,
            abi::EV_PROXY_OP | abi::EV_PROXY_STEP,
            self.parent as *mut c_void,
            Body { proxy_op },
        );
        h as usize
    }

    fn op_stop(&self, op: usize) {
        self.ctx.stop(op as *mut c_void);
    }

    fn step_start(&self, op: usize, step: u32) -> usize {
        let proxy_step = abi::ProxyStep {
            step: step.min(c_int::MAX as u32) as c_int,
        };
        let h = self
            .ctx
            .start(abi::EV_PROXY_STEP, op as *mut c_void, Body { proxy_step });
        h as usize
    }

    fn step_state(&self, step: usize, state: StepState, bytes: usize) {
        let state = match state {
            StepState::SendWait => abi::STATE_SEND_WAIT,
            StepState::RecvWait => abi::STATE_RECV_WAIT,
            StepState::RecvGpuWait => abi::STATE_RECV_GPU_WAIT,
        };
        self.ctx.record(
            step as *mut c_void,
            state,
            abi::StateArgs { trans_size: bytes },
        );
    }

    fn step_stop(&self, step: usize) {
        self.ctx.stop(step as *mut c_void);
    }
}
