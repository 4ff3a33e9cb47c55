//! The bytes on a network connection. Three records, all fixed-size and
//! little-endian:
//!
//! - [`Handle`] (64 bytes, fits NCCL's 128-byte `NCCL_NET_HANDLE_MAXSIZE`):
//!   what a listener gives the layer above to send to the connecting peer
//!   out of band (through the bootstrap, whose connections prove the
//!   communicator's key): the communicator's magic, the listener's address
//!   and id, how many sockets it expects, and a fresh random nonce.
//! - [`Hello`] (56 bytes): the first bytes on every socket, connector to
//!   acceptor: the magic again, the listener id, which socket of how many,
//!   and a MAC under the transport's key (derived from the communicator's,
//!   never sent) over the whole handle (its nonce included) and the rest of
//!   the hello. An acceptor drops a socket whose hello does not match or
//!   does not prove the key, so a stranger, a replayed hello (the nonce is
//!   the listener's own, and each socket index is taken once) or a rank of
//!   another communicator is never trusted.
//! - [`PartHeader`] (16 bytes): before each message's part on each socket:
//!   the comm's message sequence number, the tag and the message's total
//!   size, from which both ends compute the same [`split`] of the message
//!   over the sockets.
//!
//! Decoding never panics: every malformed input is a [`WireError`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use oxccl_bootstrap::Key;

use crate::error::WireError;

/// Protocol version carried in every hello (2: hellos carry a MAC).
pub const VERSION: u16 = 2;
/// Bytes of a handle's nonce.
pub const NONCE_BYTES: usize = 16;
/// Bytes of a hello's MAC.
pub const MAC_BYTES: usize = 32;
/// The context string of a hello's MAC.
const HELLO_CTX: &str = "oxccl net hello v2";
/// Most sockets one connection may have (NCCL's `NCCL_SOCKET_MAX_SOCKETS`
/// is 64 as well).
pub const MAX_SOCKS: usize = 64;
/// The largest message a part header may announce (1 TiB): anything larger
/// is garbage, not data.
pub const MAX_MESSAGE: u64 = 1 << 40;

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn exact<const N: usize>(b: &[u8], what: &'static str) -> Result<[u8; N], WireError> {
    b.try_into().map_err(|_| WireError::Truncated {
        what,
        got: b.len(),
        want: N,
    })
}

/// `N` zero bytes but for `magic` and `listen_id` at 0 and 8: the start of
/// a handle and of a hello.
fn start<const N: usize>(magic: u64, listen_id: u64) -> [u8; N] {
    let mut b = [0u8; N];
    b[0..8].copy_from_slice(&magic.to_le_bytes());
    b[8..16].copy_from_slice(&listen_id.to_le_bytes());
    b
}

/// `bytes` as exactly `N` bytes that start with `magic`, or why not.
fn with_magic<const N: usize>(
    bytes: &[u8],
    magic: u64,
    what: &'static str,
) -> Result<[u8; N], WireError> {
    let b: [u8; N] = exact(bytes, what)?;
    let got = u64_at(&b, 0);
    if got != magic {
        return Err(WireError::WrongMagic {
            expected: magic,
            got,
        });
    }
    Ok(b)
}

/// The error for a malformed `what`, given the detail.
fn malformed(what: &'static str) -> impl Fn(String) -> WireError {
    move |detail| WireError::Malformed { what, detail }
}

fn nsocks_ok(n: u16, what: &'static str) -> Result<u16, WireError> {
    if n == 0 || n as usize > MAX_SOCKS {
        return Err(malformed(what)(format!(
            "{n} sockets (1 to {MAX_SOCKS} allowed)"
        )));
    }
    Ok(n)
}

/// Where and how to connect to a listener (NCCL's opaque handle).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Handle {
    pub magic: u64,
    pub listen_id: u64,
    pub addr: SocketAddr,
    /// Sockets the listener expects per connection.
    pub nsocks: u16,
    /// Fresh per listener: what a hello's MAC is bound to.
    pub nonce: [u8; NONCE_BYTES],
}

impl Handle {
    pub const BYTES: usize = 64;

    pub fn encode(&self) -> [u8; Handle::BYTES] {
        let mut b: [u8; Handle::BYTES] = start(self.magic, self.listen_id);
        match self.addr.ip() {
            IpAddr::V4(ip) => {
                b[16] = 4;
                b[20..24].copy_from_slice(&ip.octets());
            }
            IpAddr::V6(ip) => {
                b[16] = 6;
                b[20..36].copy_from_slice(&ip.octets());
            }
        }
        b[18..20].copy_from_slice(&self.addr.port().to_le_bytes());
        b[36..38].copy_from_slice(&self.nsocks.to_le_bytes());
        b[40..40 + NONCE_BYTES].copy_from_slice(&self.nonce);
        b
    }

    /// A handle from `bytes`, which must be exactly [`Handle::BYTES`] long,
    /// carry `magic`, a known address family and zeros where unused.
    pub fn decode(bytes: &[u8], magic: u64) -> Result<Handle, WireError> {
        let b: [u8; Handle::BYTES] = with_magic(bytes, magic, "handle")?;
        let bad = malformed("handle");
        let port = u16_at(&b, 18);
        let ip = match b[16] {
            4 if b[24..36].iter().all(|&x| x == 0) => {
                IpAddr::V4(Ipv4Addr::from(exact::<4>(&b[20..24], "handle")?))
            }
            6 => IpAddr::V6(Ipv6Addr::from(exact::<16>(&b[20..36], "handle")?)),
            f => return Err(bad(format!("address family byte {f}"))),
        };
        if b[17] != 0
            || b[38..40].iter().any(|&x| x != 0)
            || b[40 + NONCE_BYTES..].iter().any(|&x| x != 0)
        {
            return Err(bad("reserved bytes are not zero".into()));
        }
        if port == 0 {
            return Err(bad("port 0".into()));
        }
        Ok(Handle {
            magic,
            listen_id: u64_at(&b, 8),
            addr: SocketAddr::new(ip, port),
            nsocks: nsocks_ok(u16_at(&b, 36), "handle")?,
            nonce: b[40..40 + NONCE_BYTES].try_into().expect("a nonce"),
        })
    }
}

/// The first bytes on every socket of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Hello {
    pub magic: u64,
    pub listen_id: u64,
    /// This socket's index among the connection's `nsocks`.
    pub index: u16,
    pub nsocks: u16,
    /// MAC of the handle and the fields above ([`Hello::sign`]).
    pub mac: [u8; MAC_BYTES],
}

impl Hello {
    pub const BYTES: usize = 24 + MAC_BYTES;

    /// The hello for socket `index` of a connection to `handle`, signed
    /// with `key`.
    pub fn sign(handle: &Handle, index: u16, key: &Key) -> Hello {
        let mut h = Hello {
            magic: handle.magic,
            listen_id: handle.listen_id,
            index,
            nsocks: handle.nsocks,
            mac: [0; MAC_BYTES],
        };
        h.mac = key.mac(HELLO_CTX, &[&handle.encode(), &h.encode()[..24]]);
        h
    }

    /// Whether the MAC proves `key` for a connection to `handle` (in
    /// constant time).
    pub fn verify(&self, handle: &Handle, key: &Key) -> bool {
        key.verify(
            HELLO_CTX,
            &[&handle.encode(), &self.encode()[..24]],
            &self.mac,
        )
    }

    pub fn encode(&self) -> [u8; Hello::BYTES] {
        let mut b: [u8; Hello::BYTES] = start(self.magic, self.listen_id);
        b[16..18].copy_from_slice(&self.index.to_le_bytes());
        b[18..20].copy_from_slice(&self.nsocks.to_le_bytes());
        b[20..22].copy_from_slice(&VERSION.to_le_bytes());
        b[24..].copy_from_slice(&self.mac);
        b
    }

    /// A hello from exactly [`Hello::BYTES`] bytes carrying `magic` (its
    /// MAC is not checked here: [`Hello::verify`]).
    pub fn decode(bytes: &[u8], magic: u64) -> Result<Hello, WireError> {
        let b: [u8; Hello::BYTES] = with_magic(bytes, magic, "hello")?;
        let bad = malformed("hello");
        let version = u16_at(&b, 20);
        if version != VERSION {
            return Err(bad(format!("version {version}, this is {VERSION}")));
        }
        if u16_at(&b, 22) != 0 {
            return Err(bad("reserved bytes are not zero".into()));
        }
        let nsocks = nsocks_ok(u16_at(&b, 18), "hello")?;
        let index = u16_at(&b, 16);
        if index >= nsocks {
            return Err(bad(format!("socket {index} of {nsocks}")));
        }
        Ok(Hello {
            magic,
            listen_id: u64_at(&b, 8),
            index,
            nsocks,
            mac: b[24..].try_into().expect("a MAC"),
        })
    }
}

/// What precedes a message's part on each socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PartHeader {
    /// The message's sequence number on its connection (wrapping).
    pub seq: u32,
    pub tag: u32,
    /// The whole message's size in bytes.
    pub size: u64,
}

impl PartHeader {
    pub const BYTES: usize = 16;

    pub fn encode(&self) -> [u8; PartHeader::BYTES] {
        let mut b = [0u8; PartHeader::BYTES];
        b[0..4].copy_from_slice(&self.seq.to_le_bytes());
        b[4..8].copy_from_slice(&self.tag.to_le_bytes());
        b[8..16].copy_from_slice(&self.size.to_le_bytes());
        b
    }

    pub fn decode(bytes: &[u8]) -> Result<PartHeader, WireError> {
        let b: [u8; PartHeader::BYTES] = exact(bytes, "part header")?;
        let h = PartHeader {
            seq: u32_at(&b, 0),
            tag: u32_at(&b, 4),
            size: u64_at(&b, 8),
        };
        if h.size > MAX_MESSAGE {
            return Err(malformed("part header")(format!(
                "a message of {} bytes (at most {MAX_MESSAGE})",
                h.size
            )));
        }
        Ok(h)
    }
}

/// Part `i` of a `size`-byte message spread over `nparts` sockets, as
/// `(offset, length)`: parts of `max(min_chunk, size / nparts)` bytes
/// (rounded up to 4 KiB) in socket order, the last ones shorter or empty,
/// as NCCL's socket transport splits. Both ends compute it from the size in
/// the part header, so the split itself never travels.
pub fn split(size: usize, nparts: usize, i: usize, min_chunk: usize) -> (usize, usize) {
    let nparts = nparts.max(1);
    let chunk = size
        .div_ceil(nparts)
        .max(min_chunk)
        .max(1)
        .next_multiple_of(4096);
    let off = chunk.saturating_mul(i).min(size);
    (off, chunk.min(size - off))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A handle of magic 7, listener 9, two sockets.
    fn handle() -> Handle {
        Handle {
            magic: 7,
            listen_id: 9,
            addr: "127.0.0.1:4000".parse().unwrap(),
            nsocks: 2,
            nonce: [5; NONCE_BYTES],
        }
    }

    #[test]
    fn small_messages_use_the_first_socket_only() {
        assert_eq!(split(100, 4, 0, 65536), (0, 100));
        assert_eq!(split(100, 4, 1, 65536), (100, 0));
        assert_eq!(split(0, 4, 0, 65536), (0, 0));
        assert_eq!(split(1 << 20, 4, 3, 65536), (3 << 18, 1 << 18));
    }

    #[test]
    fn a_handle_of_another_communicator_is_refused() {
        let h = handle();
        assert_eq!(Handle::decode(&h.encode(), 7), Ok(h));
        assert!(matches!(
            Handle::decode(&h.encode(), 8),
            Err(WireError::WrongMagic { .. })
        ));
    }

    #[test]
    fn a_hello_proves_the_key_for_one_handle() {
        let key = Key::from_secret(b"k");
        let h = handle();
        let hello = Hello::sign(&h, 1, &key);
        let back = Hello::decode(&hello.encode(), 7).unwrap();
        assert_eq!(back, hello);
        assert!(back.verify(&h, &key));
        assert!(!back.verify(&h, &Key::from_secret(b"other")));
        let other_listener = Handle {
            nonce: [6; NONCE_BYTES],
            ..h
        };
        assert!(!back.verify(&other_listener, &key));
        let mut forged = hello;
        forged.index = 0;
        assert!(!forged.verify(&h, &key));
    }
}
