//! The wire format of every bootstrap connection.
//!
//! A connection carries frames: a 16-byte header (the communicator's
//! 8-byte magic, a kind byte, three zero bytes, the payload length as a
//! little-endian `u32`) and the payload. The first bytes of every
//! connection are therefore the magic, and every frame is checked against
//! it, so a stranger, garbage or a rank holding another id is told apart
//! from a peer at once. The magic is no secret: what keeps strangers out
//! is the proof every connection opens with (an acceptor's `Challenge`,
//! the connector's hello with its MAC, the acceptor's `Ack`: see
//! `handshake.rs` and [`crate::auth`]). Payloads are little-endian fields; strings and byte
//! strings carry a `u32` length. Decoding is total: any byte string gives
//! a value or a [`WireError`], never a panic (a proptest checks it).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::error::WireError;

/// Bytes of a frame header.
pub const HEADER: usize = 16;
/// Largest payload a frame may announce: far above any record the
/// bootstrap sends (a 4096-rank table is about 1 MiB), and low enough that
/// a garbage length cannot make a peer allocate much.
pub const MAX_PAYLOAD: usize = 4 << 20;
/// Longest string field (host names, bus ids, reasons).
pub const MAX_STR: usize = 1024;

/// What a frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A rank introduces itself to the root.
    Hello = 1,
    /// The root answers every rank with all descriptors.
    Table = 2,
    /// The root (or a peer) refuses; the payload is the reason.
    Fail = 3,
    /// A rank introduces itself to its ring successor.
    Peer = 4,
    /// A record of a collective call on the established ring.
    Data = 5,
    /// An acceptor's first frame: a fresh nonce the connector's hello
    /// must prove the key over ([`crate::auth`]).
    Challenge = 6,
    /// An acceptor's answer to a proven hello: its own proof, so the
    /// connector knows it reached a holder of the key.
    Ack = 7,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Hello,
            2 => Kind::Table,
            3 => Kind::Fail,
            4 => Kind::Peer,
            5 => Kind::Data,
            6 => Kind::Challenge,
            7 => Kind::Ack,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Hello => "hello",
            Kind::Table => "table",
            Kind::Fail => "fail",
            Kind::Peer => "peer",
            Kind::Data => "data",
            Kind::Challenge => "challenge",
            Kind::Ack => "ack",
        }
    }
}

/// A frame header.
pub fn header(magic: u64, kind: Kind, len: usize) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(&magic.to_le_bytes());
    h[8] = kind as u8;
    h[12..].copy_from_slice(&(len as u32).to_le_bytes());
    h
}

/// A whole frame: header then payload.
pub fn frame(magic: u64, kind: Kind, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER + payload.len());
    v.extend_from_slice(&header(magic, kind, payload.len()));
    v.extend_from_slice(payload);
    v
}

/// Checks a header against `magic`: the frame's kind and payload length.
pub fn parse_header(magic: u64, h: &[u8; HEADER]) -> Result<(Kind, usize), WireError> {
    let got = u64::from_le_bytes(h[..8].try_into().expect("8 bytes"));
    if got != magic {
        return Err(WireError::WrongMagic {
            expected: magic,
            got,
        });
    }
    let kind = Kind::from_u8(h[8]).ok_or(WireError::BadKind {
        got: h[8],
        expected: "a known kind (1..=7)",
    })?;
    if h[9..12] != [0, 0, 0] {
        return Err(WireError::Malformed {
            what: "frame header",
            detail: "reserved bytes are not zero".into(),
        });
    }
    let len = u32::from_le_bytes(h[12..].try_into().expect("4 bytes")) as usize;
    if len > MAX_PAYLOAD {
        return Err(WireError::Oversized {
            len,
            max: MAX_PAYLOAD,
        });
    }
    Ok((kind, len))
}

/// Decodes one frame from the front of `bytes`: kind, payload, bytes used.
pub fn decode(magic: u64, bytes: &[u8]) -> Result<(Kind, &[u8], usize), WireError> {
    let h: &[u8; HEADER] =
        bytes
            .get(..HEADER)
            .and_then(|h| h.try_into().ok())
            .ok_or(WireError::Truncated {
                what: "frame header",
                got: bytes.len(),
                want: HEADER,
            })?;
    let (kind, len) = parse_header(magic, h)?;
    let body = bytes
        .get(HEADER..HEADER + len)
        .ok_or(WireError::Truncated {
            what: "frame payload",
            got: bytes.len() - HEADER,
            want: len,
        })?;
    Ok((kind, body, HEADER + len))
}

/// Builds a payload.
#[derive(Debug, Default)]
pub struct Writer(pub Vec<u8>);

impl Writer {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u32(v.len() as u32);
        self.0.extend_from_slice(v);
        self
    }
    /// A string, cut to [`MAX_STR`] bytes at a character boundary.
    pub fn str(&mut self, s: &str) -> &mut Self {
        let mut end = s.len().min(MAX_STR);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.bytes(&s.as_bytes()[..end])
    }
    pub fn addr(&mut self, a: SocketAddr) -> &mut Self {
        let ip = match a.ip() {
            IpAddr::V4(v4) => {
                self.u8(4);
                v4.to_ipv6_mapped().octets()
            }
            IpAddr::V6(v6) => {
                self.u8(6);
                v6.octets()
            }
        };
        self.0.extend_from_slice(&ip);
        self.u16(a.port())
    }
}

/// Reads a payload field by field; every shortfall is a typed error.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader { buf, what }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.buf.len() < n {
            return Err(WireError::Truncated {
                what: self.what,
                got: self.buf.len(),
                want: n,
            });
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }

    fn arr<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    pub fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16, WireError> {
        self.arr().map(u16::from_le_bytes)
    }
    pub fn u32(&mut self) -> Result<u32, WireError> {
        self.arr().map(u32::from_le_bytes)
    }
    pub fn i32(&mut self) -> Result<i32, WireError> {
        self.arr().map(i32::from_le_bytes)
    }
    pub fn u64(&mut self) -> Result<u64, WireError> {
        self.arr().map(u64::from_le_bytes)
    }
    pub fn bytes(&mut self, max: usize) -> Result<&'a [u8], WireError> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(self.malformed(format!("field of {n} bytes, at most {max} allowed")));
        }
        self.take(n)
    }
    pub fn str(&mut self) -> Result<String, WireError> {
        let b = self.bytes(MAX_STR)?;
        String::from_utf8(b.to_vec()).map_err(|_| self.malformed("a string is not UTF-8".into()))
    }
    pub fn addr(&mut self) -> Result<SocketAddr, WireError> {
        let fam = self.u8()?;
        let ip: [u8; 16] = self.arr()?;
        let port = self.u16()?;
        let v6 = Ipv6Addr::from(ip);
        let ip =
            match fam {
                4 => IpAddr::V4(v6.to_ipv4_mapped().ok_or_else(|| {
                    self.malformed("an IPv4 address that is not v4-mapped".into())
                })?),
                6 => IpAddr::V6(v6),
                f => return Err(self.malformed(format!("address family {f}"))),
            };
        Ok(SocketAddr::new(ip, port))
    }
    /// Errors unless every byte was read (trailing garbage is malformed).
    pub fn finish(self) -> Result<(), WireError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(self.malformed(format!("{} trailing bytes", self.buf.len())))
        }
    }
    pub fn malformed(&self, detail: String) -> WireError {
        WireError::Malformed {
            what: self.what,
            detail,
        }
    }
}

/// The unspecified IPv4 address, for descriptors without a listener.
pub const NO_ADDR: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);
