//! Helpers shared by the facade's test binaries.

use oxccl::{BackendKind, Communicator, Config};

/// `n` communicators on the host backend, whatever the machine has.
#[allow(dead_code)] // not every test binary uses it
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

/// Runs `f` on every rank's own thread; results in rank order.
#[allow(dead_code)] // not every test binary runs ranks on threads
pub fn on_ranks<R: Send>(comms: &[Communicator], f: impl Fn(&Communicator) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                let f = &f;
                s.spawn(move || f(c))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}
