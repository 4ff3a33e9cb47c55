//! Per-call completion handles: [`Communicator::completion`] after an
//! operation gives a handle that is done when that operation (and all
//! issued before it on the rank) is, like a `torch.distributed` work
//! object. On CUDA it is an event recorded on the rank's stream; on the
//! host backend calls complete on return, so it is done at once.

use std::sync::Arc;

use crate::backend;
use crate::comm::{Clique, Communicator};
use crate::error::{Error, Result};

/// Done when the work its rank had issued at its making is done.
#[derive(Debug)]
pub struct Completion {
    inner: Box<dyn backend::Completion>,
    clique: Arc<Clique>,
    rank: u32,
}

impl Completion {
    /// Whether the work has completed (never waits). A clique failure is
    /// an error ([`Error::PeerFailed`] where a peer's call failed after
    /// the ranks agreed on it).
    pub fn is_done(&mut self) -> Result<bool> {
        self.failed()?;
        self.inner.is_done()
    }

    /// Waits for the work; then reports a clique failure (a peer's
    /// deadline, an abort) as [`Communicator::synchronize`] does.
    pub fn wait(mut self) -> Result<()> {
        self.inner.wait()?;
        self.failed()
    }

    fn failed(&self) -> Result<()> {
        match self.clique.backend.failure() {
            Some(e) => Err(self.clique.blamed(
                self.rank,
                Error::Failed {
                    rank: self.rank,
                    cause: e.root_cause(),
                },
            )),
            None => Ok(()),
        }
    }
}

impl Communicator {
    /// A handle on everything this rank has issued so far: call it right
    /// after an operation to wait for (or poll) that operation alone,
    /// while later ones keep running.
    pub fn completion(&self) -> Result<Completion> {
        self.check_usable()?;
        Ok(Completion {
            inner: self.clique().backend.completion(self.rank())?,
            clique: self.clique().clone(),
            rank: self.rank(),
        })
    }
}
