//! The wire format under proptest: every byte string decodes to a value
//! or a typed error (never a panic), frames round-trip, and every cut of
//! a valid frame is reported as truncated.

use oxccl_bootstrap::wire::{decode, frame, Kind, Reader, Writer, HEADER, MAX_PAYLOAD};
use oxccl_bootstrap::{UniqueId, WireError};
use proptest::prelude::*;

const MAGIC: u64 = 0x1122_3344_5566_7788;

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Hello),
        Just(Kind::Table),
        Just(Kind::Fail),
        Just(Kind::Peer),
        Just(Kind::Data),
        Just(Kind::Challenge),
        Just(Kind::Ack)
    ]
}

proptest! {
    #[test]
    fn frames_round_trip(k in kind(), payload in proptest::collection::vec(any::<u8>(), 0..2000)) {
        let f = frame(MAGIC, k, &payload);
        let (k2, body, used) = decode(MAGIC, &f).unwrap();
        prop_assert_eq!(k2, k);
        prop_assert_eq!(body, &payload[..]);
        prop_assert_eq!(used, f.len());
    }

    #[test]
    fn every_cut_of_a_frame_is_truncated(k in kind(), payload in proptest::collection::vec(any::<u8>(), 1..300), cut in any::<prop::sample::Index>()) {
        let f = frame(MAGIC, k, &payload);
        let at = cut.index(f.len());
        let r = decode(MAGIC, &f[..at]);
        prop_assert!(matches!(r, Err(WireError::Truncated { .. })), "{:?}", r);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        match decode(MAGIC, &bytes) {
            Ok((_, body, used)) => prop_assert!(used == HEADER + body.len() && used <= bytes.len()),
            Err(WireError::WrongMagic { .. } | WireError::Truncated { .. } | WireError::BadKind { .. } | WireError::Oversized { .. } | WireError::Malformed { .. } | WireError::BadProof { .. }) => {}
        }
        // Payload parsers: a value or a typed error.
        let mut r = Reader::new(&bytes, "fuzz");
        let _ = r.str().and_then(|_| r.addr()).and_then(|_| r.bytes(64));
        let _ = UniqueId::from_bytes(&bytes);
    }

    #[test]
    fn a_right_magic_with_garbage_after_it_is_typed(rest in proptest::collection::vec(any::<u8>(), 8..64)) {
        let mut bytes = MAGIC.to_le_bytes().to_vec();
        bytes.extend_from_slice(&rest);
        let r = decode(MAGIC, &bytes);
        if let Err(e) = r {
            let wrong = matches!(e, WireError::WrongMagic { .. });
            prop_assert!(!wrong);
        }
    }

    #[test]
    fn fields_round_trip(a in any::<u32>(), s in "\\PC{0,40}", v6 in any::<[u8; 16]>(), port in any::<u16>(), v4 in any::<[u8; 4]>()) {
        let a6 = std::net::SocketAddr::new(std::net::Ipv6Addr::from(v6).into(), port);
        let a4 = std::net::SocketAddr::new(std::net::Ipv4Addr::from(v4).into(), port);
        let mut w = Writer::default();
        w.u32(a).str(&s).addr(a6).addr(a4);
        let mut r = Reader::new(&w.0, "fields");
        prop_assert_eq!(r.u32().unwrap(), a);
        prop_assert_eq!(r.str().unwrap(), s);
        let back6 = r.addr().unwrap();
        // A v4-mapped v6 address comes back as the v4 one it maps.
        prop_assert!(back6 == a6 || std::net::Ipv6Addr::from(v6).to_ipv4_mapped().is_some());
        prop_assert_eq!(r.addr().unwrap(), a4);
        r.finish().unwrap();
    }
}

#[test]
fn oversized_and_bad_kind_headers() {
    let mut f = frame(MAGIC, Kind::Data, &[]);
    f[12..16].copy_from_slice(&((MAX_PAYLOAD + 1) as u32).to_le_bytes());
    assert!(matches!(
        decode(MAGIC, &f),
        Err(WireError::Oversized { .. })
    ));
    let mut f = frame(MAGIC, Kind::Data, &[]);
    f[8] = 99;
    assert!(matches!(
        decode(MAGIC, &f),
        Err(WireError::BadKind { got: 99, .. })
    ));
    let f = frame(MAGIC ^ 1, Kind::Data, &[]);
    assert!(matches!(
        decode(MAGIC, &f),
        Err(WireError::WrongMagic { .. })
    ));
}
