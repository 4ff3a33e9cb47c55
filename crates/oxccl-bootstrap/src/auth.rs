//! The communicator's key and the proofs made with it.
//!
//! Every unique id carries a 32-byte secret drawn from the OS's random
//! source ([`Key::random`]); with `NCCL_COMM_ID` it is derived from
//! `OXCCL_COMM_SECRET` ([`Key::from_secret`]). Whoever holds the id holds
//! the key; a hello on any of the communicator's listeners proves it with
//! a keyed BLAKE3 hash (a MAC) over a fresh challenge, and the acceptor
//! answers with a proof of its own, so neither a stranger who connects
//! nor a fake listener learns or feeds anything. Keys of later
//! rendezvous (subsets, the scalable ring, the network transport, the fd
//! mailboxes) are derived from the parent's, never sent.
//!
//! Nothing here is home-made cryptography: `blake3::keyed_hash` is the
//! MAC, `blake3::derive_key` the key derivation, and comparisons go
//! through `blake3::Hash`'s constant-time equality.

use crate::error::BootstrapError;

/// Bytes of a key, a nonce and a MAC.
pub const KEY_BYTES: usize = 32;
pub const NONCE_BYTES: usize = 32;
pub const MAC_BYTES: usize = 32;

/// A communicator's secret key (never printed).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key([u8; KEY_BYTES]);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(<secret>)")
    }
}

/// `n` bytes from the operating system's random source.
pub fn random<const N: usize>() -> Result<[u8; N], BootstrapError> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| BootstrapError::Io {
        rank: u32::MAX,
        what: "drawing random bytes from the OS".into(),
        detail: e.to_string(),
    })?;
    Ok(b)
}

/// A fresh challenge.
pub fn nonce() -> Result<[u8; NONCE_BYTES], BootstrapError> {
    random()
}

impl Key {
    /// A key from its bytes (as carried in a unique id).
    pub const fn from_bytes(b: [u8; KEY_BYTES]) -> Key {
        Key(b)
    }

    /// The raw bytes, for a unique id or a layer that keys its own MACs.
    pub fn to_bytes(&self) -> [u8; KEY_BYTES] {
        self.0
    }

    /// A new random key.
    pub fn random() -> Result<Key, BootstrapError> {
        random().map(Key)
    }

    /// The key every rank derives from the same secret string
    /// (`OXCCL_COMM_SECRET`, any bytes: hex or a passphrase alike).
    pub fn from_secret(secret: &[u8]) -> Key {
        Key(blake3::derive_key("oxccl 2026-12 comm secret v1", secret))
    }

    /// The public key of `NCCL_COMM_ID` without a secret: anyone may
    /// compute it, so it proves nothing (NCCL's trust model).
    pub fn public() -> Key {
        Key::from_secret(b"")
    }

    /// A child key for `purpose`, bound to `parts` (a subset's members,
    /// a mailbox's scope...): distinct purposes or parts give unrelated
    /// keys.
    pub fn derive(&self, purpose: &str, parts: &[&[u8]]) -> Key {
        Key(*self.hasher(purpose, parts).finalize().as_bytes())
    }

    fn hasher(&self, context: &str, parts: &[&[u8]]) -> blake3::Hasher {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        // Length-prefixed, so no two lists of parts hash alike.
        for p in std::iter::once(context.as_bytes()).chain(parts.iter().copied()) {
            h.update(&(p.len() as u64).to_le_bytes());
            h.update(p);
        }
        h
    }

    /// The MAC of `parts` under this key, for `context` (a fixed string
    /// naming the message, so a proof of one kind never passes as another).
    pub fn mac(&self, context: &str, parts: &[&[u8]]) -> [u8; MAC_BYTES] {
        *self.hasher(context, parts).finalize().as_bytes()
    }

    /// Whether `tag` is the MAC of `parts` (in constant time).
    pub fn verify(&self, context: &str, parts: &[&[u8]], tag: &[u8]) -> bool {
        let Ok(tag) = <[u8; MAC_BYTES]>::try_from(tag) else {
            return false;
        };
        self.hasher(context, parts).finalize() == blake3::Hash::from(tag)
    }

    /// A short public name derived from the key (hex), for names that
    /// others can see but must not be able to guess (fd mailboxes).
    pub fn tag_hex(&self, purpose: &str, parts: &[&[u8]], bytes: usize) -> String {
        self.mac(purpose, parts)[..bytes.min(MAC_BYTES)]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_bind_key_context_and_parts() {
        let k = Key::random().unwrap();
        let other = Key::random().unwrap();
        assert_ne!(k, other);
        let m = k.mac("hello", &[b"a", b"bc"]);
        assert!(k.verify("hello", &[b"a", b"bc"], &m));
        assert!(!other.verify("hello", &[b"a", b"bc"], &m));
        assert!(!k.verify("ack", &[b"a", b"bc"], &m));
        assert!(!k.verify("hello", &[b"ab", b"c"], &m));
        assert!(!k.verify("hello", &[b"a", b"bc"], &m[..31]));
        assert_ne!(k.derive("x", &[]), k.derive("y", &[]));
        assert_eq!(Key::from_secret(b"s"), Key::from_secret(b"s"));
        assert_ne!(Key::from_secret(b"s"), Key::public());
        assert_eq!(format!("{k:?}"), "Key(<secret>)");
    }
}
