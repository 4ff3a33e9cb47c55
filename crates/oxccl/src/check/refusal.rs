//! A rank whose call fails validation posts a refusal in the call's place
//! on the board, so its peers' matching calls fail at once naming it and
//! the reason instead of waiting for a call that will never come. The
//! reason travels as a one-byte code (the board's words are shared between
//! processes), read back as a phrase.

use crate::error::Error;

/// The code of a call whose arguments a layer above the facade refused
/// (the C ABI's own checks).
pub(crate) const ARGUMENTS: u8 = 11;

/// The code of a group whose sends to its own rank and receives from it
/// differ (found at the group's end, before anything is published).
pub(crate) const SELF_PAIRS: u8 = 12;

/// The code of a rank whose call failed after every rank agreed on it
/// (its launch, plan or stream join), posted in place of its next call.
pub(crate) const AGREED: u8 = 13;

/// Phrases by code; code 0 is any other failure.
const PHRASES: [&str; 14] = [
    "its call failed",
    "a buffer's length does not fit the count",
    "a buffer is longer than the call allows",
    "a length is not a multiple of the rank count",
    "a buffer's layout is invalid",
    "its root is out of range",
    "its peer is out of range",
    "its buffers overlap without being in place",
    "the reduction op is not defined for the type",
    "a buffer pointer is invalid",
    "a buffer belongs to another communicator or backend",
    "its arguments were refused",
    "its sends to itself and receives from itself do not match",
    "its call failed after every rank agreed on it",
];

/// Whether `e` is a refusal of the call's arguments (what validation
/// returns before anything is written), worth telling the peers.
pub(crate) fn is_refusal(e: &Error) -> bool {
    code(e) != 0 || matches!(e, Error::InvalidUsage(_) | Error::NoAlgorithm { .. })
}

/// The code of `e`'s reason.
pub(crate) fn code(e: &Error) -> u8 {
    match e {
        Error::LengthMismatch { .. } => 1,
        Error::TooLong { .. } => 2,
        Error::NotMultiple { .. } => 3,
        Error::InvalidLayout { .. } => 4,
        Error::RootOutOfRange { .. } => 5,
        Error::PeerOutOfRange { .. } => 6,
        Error::InvalidInPlace { .. } => 7,
        Error::OpNotDefined { .. } => 8,
        Error::BadPointer { .. } => 9,
        Error::ForeignBuffer { .. } => 10,
        _ => 0,
    }
}

/// The phrase of a code (codes from a newer peer read as the generic one).
pub(crate) fn phrase(code: u8) -> &'static str {
    PHRASES
        .get(usize::from(code))
        .copied()
        .unwrap_or(PHRASES[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_errors_have_their_own_phrase_and_others_the_generic_one() {
        let e = Error::RootOutOfRange { root: 9, nranks: 4 };
        assert!(is_refusal(&e));
        assert_eq!(phrase(code(&e)), "its root is out of range");
        let e = Error::Timeout("late".into());
        assert!(!is_refusal(&e));
        assert_eq!(phrase(code(&e)), "its call failed");
        assert_eq!(phrase(200), "its call failed");
    }
}
