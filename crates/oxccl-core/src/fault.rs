//! A wait that did not end: the one fault type every backend reports when
//! a rank gives up waiting for a peer, kept as data up to the caller (and
//! the C ABI, which maps it to an NCCL result code).

use std::fmt;
use std::time::Duration;

/// What a rank was waiting for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Awaited {
    /// The next message of a FIFO connection from the peer (a receive).
    Message,
    /// A free slot in the connection to the peer (a send: the peer has not
    /// drained it).
    Slot,
    /// A signal from the peer (a `Wait` step: barriers, remote accesses).
    Signal,
    /// Not recorded (a record from an older kernel, or none at all).
    Unknown,
}

impl Awaited {
    /// The device record's code for this (0 = unknown).
    pub const fn code(self) -> u32 {
        match self {
            Awaited::Unknown => 0,
            Awaited::Message => 1,
            Awaited::Slot => 2,
            Awaited::Signal => 3,
        }
    }

    /// The value for a device record's code; unknown codes are `Unknown`.
    pub const fn from_code(c: u32) -> Awaited {
        match c {
            1 => Awaited::Message,
            2 => Awaited::Slot,
            3 => Awaited::Signal,
            _ => Awaited::Unknown,
        }
    }

    fn noun(self) -> &'static str {
        match self {
            Awaited::Message => "a message",
            Awaited::Slot => "a free slot",
            Awaited::Signal => "a signal",
            Awaited::Unknown => "progress",
        }
    }
}

impl fmt::Display for Awaited {
    /// With its article: "a message", "a free slot", "a signal".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.noun())
    }
}

/// Why the wait ended without what it awaited.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultCause {
    /// It outlived the deadline: this rank is the one that timed out.
    Deadline,
    /// The communicator was aborted by the user.
    Aborted,
    /// Another rank failed first, and every wait stops with it.
    PeerFailed,
}

/// A rank gave up waiting for a peer: where, for what, for how long.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WaitFault {
    pub cause: FaultCause,
    pub rank: u32,
    pub peer: u32,
    pub channel: u32,
    pub step: u32,
    pub awaited: Awaited,
    /// How long the wait had lasted when it ended.
    pub waited: Duration,
    /// Ranks that had not started the call when the wait ended, where the
    /// backend knows (the host backend does): usually the real culprits.
    pub absent: Vec<u32>,
}

impl WaitFault {
    /// Which fault to report when several ranks recorded one: a timeout
    /// before an abort before the "another rank failed" they cause.
    pub fn severity(&self) -> u8 {
        match self.cause {
            FaultCause::Deadline => 0,
            FaultCause::Aborted => 1,
            FaultCause::PeerFailed => 2,
        }
    }
}

/// A list of ranks as people write it, runs folded: `0, 2-4, 7`.
pub fn describe_ranks(ranks: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        out.push(if j == i {
            ranks[i].to_string()
        } else {
            format!("{}-{}", ranks[i], ranks[j])
        });
        i = j + 1;
    }
    out.join(", ")
}

/// `rank 3`, or `ranks 0, 2-4`.
pub fn ranks_named(ranks: &[u32]) -> String {
    match ranks {
        [r] => format!("rank {r}"),
        _ => format!("ranks {}", describe_ranks(ranks)),
    }
}

/// The subject of a sentence about `ranks`, with its verb: `rank 3 has`,
/// `ranks 0, 2-4 have` (`verb` is `(singular, plural)`).
pub fn ranks_with(ranks: &[u32], verb: (&str, &str)) -> String {
    let v = if ranks.len() == 1 { verb.0 } else { verb.1 };
    format!("{} {v}", ranks_named(ranks))
}

impl fmt::Display for WaitFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {} channel {} step {}: ",
            self.rank, self.channel, self.step
        )?;
        let what = self.awaited.noun();
        let ms = self.waited.as_millis();
        match self.cause {
            FaultCause::Deadline => write!(
                f,
                "waited {ms} ms for {what} from peer {} past the deadline",
                self.peer
            )?,
            FaultCause::Aborted => write!(
                f,
                "aborted after {ms} ms waiting for {what} from peer {} (the communicator was aborted)",
                self.peer
            )?,
            FaultCause::PeerFailed => write!(
                f,
                "stopped after {ms} ms waiting for {what} from peer {} (another rank failed)",
                self.peer
            )?,
        }
        if !self.absent.is_empty() {
            write!(f, "; {} never joined this call", ranks_named(&self.absent))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_codes_stay_unknown() {
        for a in [
            Awaited::Message,
            Awaited::Slot,
            Awaited::Signal,
            Awaited::Unknown,
        ] {
            assert_eq!(Awaited::from_code(a.code()), a);
        }
        assert_eq!(Awaited::from_code(99), Awaited::Unknown);
    }

    #[test]
    fn the_message_names_every_field() {
        let f = WaitFault {
            cause: FaultCause::Deadline,
            rank: 1,
            peer: 0,
            channel: 2,
            step: 3,
            awaited: Awaited::Signal,
            waited: Duration::from_millis(8000),
            absent: vec![0],
        };
        assert_eq!(
            f.to_string(),
            "rank 1 channel 2 step 3: waited 8000 ms for a signal from peer 0 past the deadline; \
             rank 0 never joined this call"
        );
        assert_eq!(describe_ranks(&[0, 2, 3, 4, 7]), "0, 2-4, 7");
        assert_eq!(ranks_with(&[5], ("has", "have")), "rank 5 has");
        assert_eq!(ranks_with(&[1, 2], ("has", "have")), "ranks 1-2 have");
        let g = WaitFault {
            cause: FaultCause::PeerFailed,
            ..f.clone()
        };
        assert!(g.severity() > f.severity());
        assert!(g.to_string().contains("another rank failed"));
    }
}
