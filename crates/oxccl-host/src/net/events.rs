//! What a profiler hears of the proxy's work: NCCL's proxy operations and
//! steps, for the profiler plugins the `oxccl` crate drives.
//!
//! A call that asks for them ([`crate::HostFabric::execute_observed`])
//! opens, before any step runs, one operation per network link its plan
//! uses (channel, peer, send or receive), counting the messages the plan
//! moves on it; every message of that range is a step:
//! - sending: started when the proxy posts it to the transport
//!   ([`StepState::SendWait`]), stopped when the transport reports it sent;
//! - receiving: started when the receive is posted, or when the call
//!   begins if the proxy posted it earlier (it keeps receives posted
//!   ahead), in [`StepState::RecvWait`]; [`StepState::RecvGpuWait`] once it
//!   landed (the rank has yet to consume it); stopped once the rank
//!   consumed it. A message that landed before its call began is started
//!   and marked landed when the call begins.
//!
//! Whatever is still open when the call returns is stopped then, steps
//! before operations. With no observer nothing of this runs: a message
//! costs one branch on an empty option.

use std::collections::VecDeque;
use std::sync::Arc;

use oxccl_core::plan::Rank;

use crate::fifo::Link;

/// A step's state, as NCCL's proxy step states name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepState {
    /// Posted to the transport, not yet sent.
    SendWait,
    /// Receive posted, nothing landed yet.
    RecvWait,
    /// Landed; the rank has not consumed it yet.
    RecvGpuWait,
}

/// The observer's side: handles are its own (0 is none). Called with the
/// proxy's lock held, from whichever thread runs the pass.
pub trait ProxyEvents: Send + Sync + std::fmt::Debug {
    /// A call's operation on one network link: `steps` messages with
    /// `peer` on `channel`, each at most `chunk` bytes.
    fn op_start(&self, channel: u32, peer: Rank, send: bool, steps: u32, chunk: usize) -> usize;
    fn op_stop(&self, op: usize);
    /// Step `step` (0-based in its operation) of `op`.
    fn step_start(&self, op: usize, step: u32) -> usize;
    /// A state change of a step, with the bytes it carries where known.
    fn step_state(&self, step: usize, state: StepState, bytes: usize);
    fn step_stop(&self, step: usize);
}

/// One link's part in an observed call.
#[derive(Debug)]
pub(crate) struct Window {
    events: Arc<dyn ProxyEvents>,
    send: bool,
    /// Message numbers `[first, end)` are the call's.
    first: u64,
    end: u64,
    op: usize,
    /// Started steps not yet sent or landed, oldest first.
    open: VecDeque<(u64, usize)>,
    /// Landed receives the rank has not consumed yet.
    landed: VecDeque<(u64, usize)>,
}

impl Window {
    /// Opens the operation of a call's `count` messages on `link`, from
    /// the link's next message (the next the rank publishes or drains).
    pub(crate) fn open(
        events: &Arc<dyn ProxyEvents>,
        link: &Link,
        send: bool,
        channel: usize,
        peer: Rank,
        count: u64,
    ) -> Window {
        let [tail, head, ..] = link.counters();
        let first = if send { tail } else { head };
        let op = events.op_start(
            channel as u32,
            peer,
            send,
            count.min(u32::MAX as u64) as u32,
            link.stride(),
        );
        Window {
            events: events.clone(),
            send,
            first,
            end: first + count,
            op,
            open: VecDeque::new(),
            landed: VecDeque::new(),
        }
    }

    fn covers(&self, seq: u64) -> bool {
        (self.first..self.end).contains(&seq)
    }

    fn start(&self, seq: u64) -> usize {
        if self.op == 0 {
            return 0;
        }
        self.events.step_start(self.op, (seq - self.first) as u32)
    }

    /// Message `seq` was posted (`bytes`: its length when sending).
    pub(crate) fn posted(&mut self, seq: u64, bytes: usize) {
        if !self.covers(seq) {
            return;
        }
        let h = self.start(seq);
        let state = if self.send {
            StepState::SendWait
        } else {
            StepState::RecvWait
        };
        if h != 0 {
            self.events.step_state(h, state, bytes);
        }
        self.open.push_back((seq, h));
    }

    /// A receive the proxy posted before the call began.
    pub(crate) fn posted_earlier(&mut self, seq: u64) {
        self.posted(seq, 0);
    }

    /// A message of the call that landed before the call began.
    pub(crate) fn landed_earlier(&mut self, seq: u64) {
        if self.covers(seq) {
            let h = self.start(seq);
            if h != 0 {
                self.events.step_state(h, StepState::RecvGpuWait, 0);
            }
            self.landed.push_back((seq, h));
        }
    }

    /// The transport completed message `seq` (`bytes` moved).
    pub(crate) fn completed(&mut self, seq: u64, bytes: usize) {
        let Some(i) = self.open.iter().position(|&(s, _)| s == seq) else {
            return;
        };
        let (_, h) = self.open.remove(i).expect("found above");
        if self.send {
            self.stop(h);
        } else {
            if h != 0 {
                self.events.step_state(h, StepState::RecvGpuWait, bytes);
            }
            self.landed.push_back((seq, h));
        }
    }

    /// Receives the rank has consumed (it drained up to `head`) stop.
    pub(crate) fn consumed(&mut self, head: u64) {
        while let Some(&(seq, h)) = self.landed.front() {
            if seq >= head {
                break;
            }
            self.landed.pop_front();
            self.stop(h);
        }
    }

    fn stop(&self, h: usize) {
        if h != 0 {
            self.events.step_stop(h);
        }
    }

    /// The call returned: what is still open stops, steps first.
    pub(crate) fn close(self) {
        for &(_, h) in self.open.iter().chain(&self.landed) {
            self.stop(h);
        }
        if self.op != 0 {
            self.events.op_stop(self.op);
        }
    }
}
