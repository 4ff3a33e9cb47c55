//! Entry points for fuzzing this crate's wire decoders: not part of the
//! API (the workspace's `oxccl-fuzz` tests and the `fuzz/` targets call
//! them). Each takes arbitrary bytes from a stranger and must return,
//! never panic; where a value decodes, encoding it again gives it back.

use std::net::{Ipv4Addr, SocketAddr};

use crate::desc::{
    decode_descs, decode_fail, decode_peer, decode_table, encode_peer, encode_table, Hello,
    RankDesc, PROTOCOL,
};
use crate::wire::{self, Kind, HEADER};

/// The magic the frame entry expects (any value: a stranger's bytes are
/// checked against the communicator's).
pub const MAGIC: u64 = 0x6f78_6363_6c66_757a;

/// One frame from a connection's bytes, then its payload by kind.
pub fn frame(bytes: &[u8]) {
    if let Some(h) = bytes.get(..HEADER).and_then(|h| h.try_into().ok()) {
        let _ = wire::parse_header(MAGIC, h);
    }
    let Ok((kind, body, used)) = wire::decode(MAGIC, bytes) else {
        return;
    };
    assert!(used <= bytes.len() && body.len() <= wire::MAX_PAYLOAD);
    match kind {
        Kind::Hello => hello(body),
        Kind::Table => table(body),
        Kind::Fail => fail(body),
        Kind::Peer => peer(body),
        // Data is opaque here; a kind added later is fuzzed once listed.
        _ => {}
    }
}

/// A rank's hello to the root.
pub fn hello(b: &[u8]) {
    if let Ok(h) = Hello::decode(b) {
        assert_eq!(Hello::decode(&h.encode()).as_ref(), Ok(&h));
    }
}

/// The root's table (as any rank count and as the one it announces).
pub fn table(b: &[u8]) {
    if let Ok(v) = decode_descs(b) {
        assert_eq!(decode_descs(&encode_table(&v)).as_ref(), Ok(&v));
        let _ = decode_table(b, v.len() as u32);
    }
    let _ = decode_table(b, 2);
}

/// A ring connection's first message.
pub fn peer(b: &[u8]) {
    if let Ok((r, n)) = decode_peer(b) {
        assert_eq!(encode_peer(r, n), b);
    }
}

/// A connector's hello payload at an acceptor's gate: split into body,
/// nonce and MAC and checked against a key; a stranger's bytes never
/// prove it (the chance of a random 32-byte MAC passing is nil).
pub fn proof(b: &[u8]) {
    let key = crate::auth::Key::from_bytes([7; crate::auth::KEY_BYTES]);
    let na = [3u8; crate::auth::NONCE_BYTES];
    assert!(!crate::handshake::proves(&key, "root", MAGIC, &na, b));
    if let Some((body, nc, mac)) = crate::handshake::split_proof(b) {
        assert_eq!(body.len() + nc.len() + mac.len(), b.len());
    }
}

/// A datagram at an fd mailbox (its credentials are the kernel's, so
/// only the bytes are a stranger's).
pub fn mailbox(b: &[u8]) {
    if let Some((from, tag)) = crate::fdpass::parse_datagram(MAGIC, b) {
        assert_eq!(b.len(), 20);
        assert_eq!(b[8..12], from.to_le_bytes());
        assert_eq!(b[12..], tag.to_le_bytes());
    }
}

/// A refusal's reason.
pub fn fail(b: &[u8]) {
    assert!(decode_fail(b).len() <= 3 * wire::MAX_STR);
}

/// Valid messages to start mutating from: a frame of each kind.
pub fn seeds() -> Vec<Vec<u8>> {
    let desc = |rank| RankDesc {
        rank,
        host: "node-a/boot".into(),
        pid: 4242,
        device: -1,
        bus_id: String::new(),
        pidns: 0,
        listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 4000 + rank as u16)),
    };
    let table = encode_table(&[desc(0), desc(1)]);
    let mut hello = PROTOCOL.to_le_bytes().to_vec();
    hello.extend_from_slice(&2u32.to_le_bytes());
    hello.extend_from_slice(&encode_table(&[desc(1)])[4..]);
    vec![
        wire::frame(MAGIC, Kind::Hello, &hello),
        wire::frame(MAGIC, Kind::Table, &table),
        wire::frame(MAGIC, Kind::Peer, &encode_peer(1, 2)),
        wire::frame(MAGIC, Kind::Fail, b"rank 1 asked for 3 ranks"),
        wire::frame(MAGIC, Kind::Data, &[7; 24]),
    ]
}
