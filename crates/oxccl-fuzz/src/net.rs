//! oxccl-net's decoders (public in that crate), with round trips: what
//! decodes encodes back to the same value.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

use oxccl_net::config::{Count, Proposal};
use oxccl_net::wire::{Handle, Hello, PartHeader};

/// The magic the entries expect (any value will do).
const MAGIC: u64 = 0x6f78_6e65_7466_757a;

pub fn handle(b: &[u8]) {
    if let Ok(h) = Handle::decode(b, MAGIC) {
        assert_eq!(Handle::decode(&h.encode(), MAGIC), Ok(h));
    }
}

pub fn hello(b: &[u8]) {
    if let Ok(h) = Hello::decode(b, MAGIC) {
        assert_eq!(Hello::decode(&h.encode(), MAGIC), Ok(h));
    }
}

pub fn part_header(b: &[u8]) {
    if let Ok(h) = PartHeader::decode(b) {
        assert_eq!(PartHeader::decode(&h.encode()), Ok(h));
    }
}

pub fn proposal(b: &[u8]) {
    if let Ok(p) = Proposal::decode(b) {
        assert_eq!(Proposal::decode(&p.encode()), Ok(p));
    }
}

pub fn handle_seeds() -> Vec<Vec<u8>> {
    [
        SocketAddr::from((Ipv4Addr::LOCALHOST, 5000)),
        SocketAddr::from((Ipv6Addr::LOCALHOST, 5001)),
    ]
    .into_iter()
    .map(|addr| {
        Handle {
            magic: MAGIC,
            listen_id: 3,
            addr,
            nsocks: 2,
            nonce: [5; 16],
        }
        .encode()
        .to_vec()
    })
    .collect()
}

pub fn hello_seeds() -> Vec<Vec<u8>> {
    vec![Hello {
        magic: MAGIC,
        listen_id: 3,
        index: 1,
        nsocks: 2,
        mac: [6; 32],
    }
    .encode()
    .to_vec()]
}

pub fn part_header_seeds() -> Vec<Vec<u8>> {
    vec![PartHeader {
        seq: 9,
        tag: 1,
        size: 1 << 20,
    }
    .encode()
    .to_vec()]
}

pub fn proposal_seeds() -> Vec<Vec<u8>> {
    vec![Proposal {
        nthreads: Count::Set(2),
        nsocks_per_thread: Count::Auto(4),
    }
    .encode()
    .to_vec()]
}
