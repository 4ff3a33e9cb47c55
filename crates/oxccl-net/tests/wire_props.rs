//! The network wire format: every record round-trips, and no input, however
//! garbled, makes a decoder panic; the split of a message over sockets
//! covers it exactly.

use oxccl_net::wire::{split, Handle, Hello, PartHeader, MAX_SOCKS};
use proptest::prelude::*;

proptest! {
    #[test]
    fn records_round_trip(magic: u64, id: u64, port in 1u16.., v6: bool, ip: [u8; 16],
                          nsocks in 1u16..=MAX_SOCKS as u16, index: u16, seq: u32, tag: u32,
                          size in 0u64..=oxccl_net::wire::MAX_MESSAGE, nonce: [u8; 16], mac: [u8; 32]) {
        let addr = if v6 {
            std::net::SocketAddr::new(std::net::Ipv6Addr::from(ip).into(), port)
        } else {
            let v4: [u8; 4] = ip[..4].try_into().unwrap();
            std::net::SocketAddr::new(std::net::Ipv4Addr::from(v4).into(), port)
        };
        let h = Handle { magic, listen_id: id, addr, nsocks, nonce };
        prop_assert_eq!(Handle::decode(&h.encode(), magic), Ok(h));
        let hello = Hello { magic, listen_id: id, index: index % nsocks, nsocks, mac };
        prop_assert_eq!(Hello::decode(&hello.encode(), magic), Ok(hello));
        let p = PartHeader { seq, tag, size };
        prop_assert_eq!(PartHeader::decode(&p.encode()), Ok(p));
    }

    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..120), magic: u64) {
        let _ = Handle::decode(&bytes, magic);
        let _ = Hello::decode(&bytes, magic);
        let _ = PartHeader::decode(&bytes);
    }

    #[test]
    fn a_flipped_byte_is_noticed_or_harmless(magic: u64, id: u64, at in 0usize..Hello::BYTES, bit in 0u8..8) {
        let hello = Hello { magic, listen_id: id, index: 1, nsocks: 2, mac: [3; 32] };
        let mut b = hello.encode();
        b[at] ^= 1 << bit;
        // Either refused, or decoded into something visibly different.
        if let Ok(h) = Hello::decode(&b, magic) { prop_assert_ne!(h, hello) }
    }

    #[test]
    fn split_covers_the_message_exactly(size in 0usize..(1 << 26), nparts in 1usize..=MAX_SOCKS,
                                         min_chunk in 1usize..(1 << 20)) {
        let mut next = 0;
        for i in 0..nparts {
            let (off, len) = split(size, nparts, i, min_chunk);
            prop_assert_eq!(off, next);
            next += len;
        }
        prop_assert_eq!(next, size);
    }
}
