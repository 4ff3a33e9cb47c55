//! Entry points for fuzzing what the call check decodes from peers: not
//! part of the API (the workspace's `oxccl-fuzz` tests and the `fuzz/`
//! targets reach them through `oxccl::fuzz`). Each takes arbitrary bytes
//! and must return, never panic; what decodes encodes back to itself.

/// Little-endian words of `bytes` (zero-padded), `N` of them.
fn words<const N: usize>(bytes: &[u8]) -> [u64; N] {
    let mut w = [0u64; N];
    for (i, c) in bytes.chunks(8).take(N).enumerate() {
        let mut b = [0u8; 8];
        b[..c.len()].copy_from_slice(c);
        w[i] = u64::from_le_bytes(b);
    }
    w
}

/// A frame of the mirror (the call check across hosts, over TCP).
pub fn mirror_frame(bytes: &[u8]) {
    super::mirror::fuzz_frame(bytes);
}

/// A collective's fingerprint words, as a peer published them.
pub fn fingerprint(bytes: &[u8]) {
    let w = words::<3>(bytes);
    if let Some((call, reg)) = super::Call::decode(w) {
        assert_eq!(super::Call::decode(call.encode(reg)), Some((call, reg)));
    }
}

/// A Send/Recv record of the shared board (processes of one host).
pub fn shared_record(bytes: &[u8]) {
    let [count, meta] = words::<2>(bytes);
    super::shared::fuzz_record(count, meta);
}
