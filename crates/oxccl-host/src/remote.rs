//! A direct step's access to a peer's buffer, checked the same way whether
//! the peer is a thread of this process or another process.

/// Why a remote access cannot be made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RemoteFault {
    /// The ranks' plans or calls disagree.
    Plan(String),
    /// The peer's shared memory holds what no honest peer writes.
    Corrupt(String),
}

/// `len` elements of `elem` bytes at element `off` of a peer's buffer
/// `buf`, touched in call number `call`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RemoteAccess {
    pub call: u64,
    pub buf: usize,
    pub off: usize,
    pub len: usize,
    pub elem: usize,
}

impl RemoteAccess {
    /// The access's address, given the call the peer has published its
    /// buffers for and `buffer()`, that buffer's base address and length in
    /// elements (or why it has none). A peer still in another call means
    /// the plan lacks a barrier before the step.
    pub fn resolve(
        &self,
        published: u64,
        buffer: impl FnOnce() -> Result<(usize, usize), RemoteFault>,
    ) -> Result<usize, RemoteFault> {
        if published != self.call {
            return Err(RemoteFault::Plan(format!(
                "remote access to a peer in call {published} from call {}: the plan lacks a signal/wait before it",
                self.call
            )));
        }
        let (base, blen) = buffer()?;
        if self.off.checked_add(self.len).is_none_or(|e| e > blen) {
            return Err(RemoteFault::Plan(self.out_of_range()));
        }
        Ok(base + self.off * self.elem)
    }

    /// The error for elements the peer's buffer does not have.
    pub fn out_of_range(&self) -> String {
        format!(
            "remote buffer {} has no elements {}..+{}",
            self.buf, self.off, self.len
        )
    }
}
