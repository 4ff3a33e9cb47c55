//! Helpers shared by the facade's test binaries.

use oxccl::{BackendKind, Communicator, Config};

/// `n` communicators on the host backend, whatever the machine has.
pub fn host(n: u32) -> Vec<Communicator> {
    oxccl::init_all_with(
        n,
        Config {
            backend: BackendKind::Host,
            ..Config::default()
        },
    )
    .unwrap()
}
