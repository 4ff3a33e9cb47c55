//! What a rank registered (`crate::register` registers and looks up; the
//! clique holds one [`Registry`] per rank).

/// A range registered with `Communicator::register`; hand it back to
/// `Communicator::deregister`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Registration {
    pub(crate) rank: u32,
    pub(crate) id: u64,
    pub(crate) addr: u64,
    pub(crate) bytes: usize,
}

impl Registration {
    /// Start of the range.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length of the range in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The rank that registered it.
    pub fn rank(&self) -> u32 {
        self.rank
    }
}

/// One rank's registered ranges.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    pub(crate) next_id: u64,
    pub(crate) ranges: Vec<Registration>,
    /// Ids of this rank's live windows (`window.rs`).
    pub(crate) windows: Vec<u64>,
    /// Windows this rank mapped with its peer processes so far (names
    /// each exchange; every rank registers windows in the same order).
    pub(crate) window_seq: u64,
}
