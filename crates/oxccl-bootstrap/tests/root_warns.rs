//! A rendezvous that waits for a rank that never comes says so while it
//! waits, at the root naming that rank, and at every rank waiting for the
//! table: with no deadline (the C ABI's default) it
//! would otherwise be silence. Its own test binary: the root runs on a
//! thread of its own, so its log is caught by a global subscriber.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oxccl_bootstrap::{Bootstrap, BootstrapSettings, DeviceInfo, UniqueId, WaitWarn};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_root_waiting_for_a_rank_warns_naming_it_until_its_deadline() {
    let cap = Captured::default();
    let w = cap.clone();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_writer(move || w.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish(),
    )
    .unwrap();
    let warn = WaitWarn {
        first: Duration::from_millis(300),
        every: Duration::from_millis(400),
    };
    let limit = Duration::from_millis(2500);
    let s = BootstrapSettings {
        wait_warn: warn,
        ..BootstrapSettings::default()
    };
    let id = UniqueId::new_with(limit, &s).unwrap();
    // Ranks 0 and 1 of 3 join; rank 2 never starts.
    let out: Vec<_> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let id = &id;
                let dev = DeviceInfo {
                    wait_warn: warn,
                    ..DeviceInfo::default()
                };
                sc.spawn(move || Bootstrap::init(id, 3, r, &dev, limit))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in out {
        let Err(e) = r else {
            panic!("a rendezvous without rank 2 cannot complete");
        };
        assert!(e.to_string().contains("rank 2 never joined"), "{e}");
    }
    let text = String::from_utf8(cap.0.lock().unwrap().clone()).unwrap();
    let warnings: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("the bootstrap root at") && l.contains("still waits after"))
        .collect();
    // About 0.3, 0.7, 1.1, 1.5, 1.9 and 2.3 s: the first and the repeats.
    assert!(warnings.len() >= 3, "{text}");
    assert!(
        warnings.iter().all(|l| l.contains("deadline 2.5s")),
        "{text}"
    );
    // Ranks 0 and 1 join within milliseconds; on a loaded machine the
    // first warning may still count fewer.
    let last = warnings.last().unwrap();
    assert!(
        last.contains("2 of 3 ranks joined; rank 2 not yet"),
        "{last}"
    );
    // The ranks waiting for the table say so too, in their own processes
    // (here threads), pointing at the root's process for who is missing.
    for r in 0..2 {
        let mine = text
            .lines()
            .filter(|l| {
                l.contains(&format!(
                    "rank {r} still waits for the rank table from the bootstrap root"
                ))
            })
            .count();
        assert!(mine >= 2, "rank {r} warned {mine} times:\n{text}");
    }
    assert!(
        text.contains("deadline 2.5s): the root sends it once every rank has joined"),
        "{text}"
    );
}
