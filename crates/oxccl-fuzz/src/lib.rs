//! oxccl-fuzz: every decoder of bytes or words a peer process or a
//! stranger on the network can write, as one table of fuzz targets.
//!
//! Each [`Target`] takes arbitrary bytes and must return: no panic, no
//! allocation above [`ALLOC_CAP`] (the largest frame any decoder
//! accepts), no hang. Two drivers run the same table:
//!
//! - `cargo test -p oxccl-fuzz` (CI): a bounded proptest per target over
//!   arbitrary bytes and mutated valid messages, under a counting
//!   allocator ([`alloc::Counting`]) and a watchdog;
//! - `fuzz/` (cargo-fuzz, nightly): one libFuzzer binary per target,
//!   for open-ended runs (see `fuzz/README.md`).
//!
//! Adding or changing a decoder is one line of [`TARGETS`] (and, for
//! libFuzzer, a three-line binary in `fuzz/`). Decoders that crates keep
//! private are reached through each crate's `#[doc(hidden)] pub mod fuzz`,
//! which exposes exactly those entry points.

pub mod alloc;
mod net;
mod seeds;

/// One fuzz target.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    /// Its name (the libFuzzer binary's too).
    pub name: &'static str,
    /// What it decodes, in a few words.
    pub covers: &'static str,
    /// The entry: decodes `bytes`, panics only on a bug.
    pub run: fn(&[u8]),
    /// Valid messages that mutations start from (deep paths behind magic
    /// numbers and lengths that random bytes seldom get past).
    pub seeds: fn() -> Vec<Vec<u8>>,
}

/// Most bytes any decoder may allocate while decoding one input: the
/// bootstrap's frame cap, the largest payload any wire format accepts.
pub const ALLOC_CAP: usize = oxccl_bootstrap::wire::MAX_PAYLOAD;

const fn t(
    name: &'static str,
    covers: &'static str,
    run: fn(&[u8]),
    seeds: fn() -> Vec<Vec<u8>>,
) -> Target {
    Target {
        name,
        covers,
        run,
        seeds,
    }
}

use oxccl_bootstrap::fuzz as boot;

/// Every target, one line each.
#[rustfmt::skip]
pub const TARGETS: &[Target] = &[
    t("bootstrap_frame", "bootstrap frame header, then its payload by kind", boot::frame, boot::seeds),
    t("bootstrap_hello", "a rank's hello to the root", boot::hello, seeds::bootstrap_payloads),
    t("bootstrap_table", "the root's rank table (decode_descs, decode_table)", boot::table, seeds::bootstrap_payloads),
    t("bootstrap_peer", "a ring or mesh connection's first message", boot::peer, seeds::bootstrap_payloads),
    t("bootstrap_fail", "a refusal's reason", boot::fail, seeds::none),
    t("bootstrap_proof", "a hello's body, nonce and MAC at an acceptor's gate", boot::proof, seeds::bootstrap_payloads),
    t("bootstrap_mailbox", "a datagram at an fd mailbox", boot::mailbox, seeds::none),
    t("bootstrap_unique_id", "a 128-byte unique id from a C caller or a peer", seeds::unique_id, seeds::unique_ids),
    t("net_handle", "oxccl-net's connection handle", net::handle, net::handle_seeds),
    t("net_hello", "oxccl-net's per-socket hello", net::hello, net::hello_seeds),
    t("net_part_header", "oxccl-net's message part header", net::part_header, net::part_header_seeds),
    t("net_proposal", "oxccl-net's socket layout proposal", net::proposal, net::proposal_seeds),
    t("check_mirror_frame", "the call check's frame between hosts", oxccl::fuzz::mirror_frame, seeds::mirror_frames),
    t("check_fingerprint", "a collective's fingerprint words", oxccl::fuzz::fingerprint, seeds::fingerprints),
    t("check_shared_record", "a Send/Recv record of the shared board", oxccl::fuzz::shared_record, seeds::shared_records),
    t("host_segment", "a hostile peer's words in its segment and FIFOs", oxccl_host::fuzz::shared_segment, seeds::none),
];

/// The target named `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

/// Runs target `name` on `bytes` (the libFuzzer binaries' body).
///
/// # Panics
/// If no target has that name, or the target finds a bug.
pub fn run(name: &str, bytes: &[u8]) {
    let t = target(name).unwrap_or_else(|| panic!("no fuzz target {name}"));
    (t.run)(bytes);
}
