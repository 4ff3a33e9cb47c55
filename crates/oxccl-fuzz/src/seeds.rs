//! Valid inputs to mutate, written out by hand where the encoder is
//! private to its crate (a wrong seed costs depth, never correctness).

/// No seeds: arbitrary bytes reach every path.
pub fn none() -> Vec<Vec<u8>> {
    Vec::new()
}

/// The payloads inside the bootstrap's frames (after their header).
pub fn bootstrap_payloads() -> Vec<Vec<u8>> {
    oxccl_bootstrap::fuzz::seeds()
        .into_iter()
        .map(|f| f[oxccl_bootstrap::wire::HEADER..].to_vec())
        .collect()
}

/// A mirror frame of each kind (byte 0: the kind, 1 to 5), Send/Recv
/// ones with a type and a count.
pub fn mirror_frames() -> Vec<Vec<u8>> {
    (1..=5u8)
        .map(|kind| {
            let mut b = vec![0u8; 64];
            b[0] = kind;
            b[1] = 1;
            b[2] = 7;
            b[4] = 1;
            b[8] = 3;
            b[56] = 16;
            b
        })
        .collect()
}

/// Fingerprint words of each tag (the low byte of the first word).
pub fn fingerprints() -> Vec<Vec<u8>> {
    (1..=4u64)
        .map(|tag| {
            [tag | 2 << 8 | 7 << 16 | 0xff << 24, 1024, 0]
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .collect()
        })
        .collect()
}

/// A Send/Recv record's (count, meta) words, with and without a direct
/// buffer id.
pub fn shared_records() -> Vec<Vec<u8>> {
    [
        (64u64, 1u64 << 63 | 7),
        (8, 1 << 63 | 1 << 32 | 5 << 16 | 2),
    ]
    .iter()
    .map(|&(c, m)| [c, m].iter().flat_map(|w| w.to_le_bytes()).collect())
    .collect()
}

/// The unique id entry: the first 128 bytes (zero-padded) as an id, read.
pub fn unique_id(bytes: &[u8]) {
    let mut raw = [0u8; oxccl_bootstrap::UniqueId::BYTES];
    let n = bytes.len().min(raw.len());
    raw[..n].copy_from_slice(&bytes[..n]);
    let _ = oxccl_bootstrap::UniqueId::from_raw(raw).info();
}

/// Ids for 127.0.0.1:29500 and [::1]:29500 with a magic.
pub fn unique_ids() -> Vec<Vec<u8>> {
    let mut v4 = vec![0u8; 128];
    v4[..8].copy_from_slice(&0x1234_5678_9abc_def0u64.to_le_bytes());
    v4[8] = 4;
    v4[10..12].copy_from_slice(&29500u16.to_be_bytes());
    v4[12..16].copy_from_slice(&[127, 0, 0, 1]);
    let mut v6 = v4.clone();
    v6[8] = 6;
    v6[12..28].copy_from_slice(&std::net::Ipv6Addr::LOCALHOST.octets());
    vec![v4, v6]
}
