//! A storm of bad connections at a listener is dropped connection by
//! connection, but warned of a few times, not once per connection: the
//! first in full, then a count at most every 5 s and one at close; each
//! drop is still logged at debug level, and the peer still connects.

use std::io::{Read, Write};
use std::net::{IpAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use oxccl_net::{Net, TcpConfig, TcpNet};

/// A hang guard for the polling loops below, never a measurement.
const GUARD: Duration = Duration::from_secs(60);
/// Bad connections driven at the listener.
const STORM: usize = 300;
/// The listener's shortest time between two warnings of one kind.
const WARN_EVERY: Duration = Duration::from_secs(5);

fn net(magic: u64) -> TcpNet {
    let cfg = TcpConfig {
        nthreads: 1,
        nsocks_per_thread: 2,
        min_chunk: 4096,
        deadline: Duration::from_secs(10),
    };
    let key = oxccl_bootstrap::Key::from_secret(&magic.to_le_bytes()).to_bytes();
    TcpNet::new(
        cfg,
        magic,
        key,
        "lo",
        "127.0.0.1".parse::<IpAddr>().unwrap(),
        None,
    )
}

/// A `tracing` writer into a shared buffer.
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

/// Whether the listener has closed `s` (read at its end: nothing more
/// will come, or the connection was reset); `s` is non-blocking.
fn closed_by_listener(mut s: &TcpStream) -> bool {
    let mut b = [0u8; 16];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(n) => panic!("the listener sent {n} bytes to a stranger"),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(_) => true,
    }
}

/// Drives the storm and then the peer at a fresh listener of `b`.
fn storm_then_peer(b: &TcpNet) {
    let (h, l) = b.listen(0).unwrap();
    let mut storm = Vec::new();
    for i in 0..STORM {
        let mut s = TcpStream::connect(h.addr).unwrap();
        // A whole hello's worth of garbage (or more): refused once read.
        s.write_all(&[0xAB; 80][..64 + i % 17]).unwrap();
        s.set_nonblocking(true).unwrap();
        storm.push(s);
        // Let the listener take some as they come (its backlog is finite).
        if i % 20 == 0 {
            assert!(b.accept(l).unwrap().is_none(), "a stranger was accepted");
        }
    }
    // Every stranger is dropped...
    let t = Instant::now();
    while !storm.is_empty() {
        assert!(b.accept(l).unwrap().is_none(), "a stranger was accepted");
        storm.retain(|s| !closed_by_listener(s));
        assert!(
            t.elapsed() < GUARD,
            "{} strangers never dropped",
            storm.len()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // ...and the peer still gets through.
    let peer = net(7);
    let _s = peer.connect(0, &h).unwrap().expect("TCP connects at once");
    let t = Instant::now();
    while b.accept(l).unwrap().is_none() {
        assert!(t.elapsed() < GUARD, "the peer never got through");
        std::thread::sleep(Duration::from_millis(1));
    }
    b.close_listen(l).unwrap();
}

#[test]
fn a_storm_of_bad_connections_gives_a_few_warnings_not_one_each() {
    let b = net(7);
    let cap = Captured::default();
    let w = cap.clone();
    let sub = tracing_subscriber::fmt()
        .with_writer(move || w.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    let start = Instant::now();
    tracing::subscriber::with_default(sub, || storm_then_peer(&b));
    let took = start.elapsed();
    let text = String::from_utf8(cap.0.lock().unwrap().clone()).unwrap();
    let ours = |l: &&str| l.contains("oxccl-net: listener");
    let warns: Vec<&str> = text
        .lines()
        .filter(ours)
        .filter(|l| l.contains(" WARN "))
        .collect();
    let debugs = text
        .lines()
        .filter(ours)
        .filter(|l| l.contains(" DEBUG ") && l.contains("dropped a connection from"))
        .count();
    // The first in full, one per period that passed, one at close.
    let bound = 2 + (took.as_secs_f64() / WARN_EVERY.as_secs_f64()).floor() as usize;
    assert!(
        !warns.is_empty() && warns.len() <= bound,
        "{} WARN lines for {STORM} drops in {took:?} (at most {bound}):\n{}",
        warns.len(),
        warns.join("\n")
    );
    assert!(
        warns[0].contains("dropped a connection from 127.0.0.1:"),
        "{}",
        warns[0]
    );
    // Every drop but the first (in full at WARN) is at debug level, and
    // the counts in the later warnings add up to them.
    assert_eq!(debugs, STORM - 1, "{text}");
    let counted: usize = warns[1..]
        .iter()
        .map(|l| {
            let before = l.split(" more dropped connections").next().unwrap();
            before
                .rsplit(' ')
                .next()
                .and_then(|n| n.parse::<usize>().ok())
                .unwrap_or_else(|| panic!("no count in {l}"))
        })
        .sum();
    assert_eq!(counted, STORM - 1, "{}", warns.join("\n"));
}
