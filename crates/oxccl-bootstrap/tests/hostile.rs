//! The rendezvous against strangers: hellos without the id's key, storms
//! of garbage and of silent connections, a process out of descriptors.
//! Ranks are threads of this process; the descriptor test is a child
//! process (forged fd-mailbox messages: `tests/mailbox.rs`).

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use oxccl_bootstrap::{Bootstrap, BootstrapError, DeviceInfo, Key, UniqueId};

const LIMIT: Duration = Duration::from_secs(20);

fn dev(r: u32) -> DeviceInfo {
    DeviceInfo {
        device: Some(r as i32),
        ..DeviceInfo::default()
    }
}

/// Every rank of `n` joins `id` (threads); their results.
fn join(id: &UniqueId, n: u32, limit: Duration) -> Vec<Result<Bootstrap, BootstrapError>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| s.spawn(move || Bootstrap::init(id, n, r, &dev(r), limit)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// `id` with its key replaced: what a stranger who learned the root's
/// address and magic (they are no secret) can make.
fn forged(id: &UniqueId) -> UniqueId {
    let mut b = id.to_bytes();
    b[28..60].copy_from_slice(&Key::random().unwrap().to_bytes());
    UniqueId::from_bytes(&b).unwrap()
}

/// A stranger claiming rank 1 without the key, first: refused (told that
/// its hello proves no key), while the real ranks meet and the table is
/// theirs. Without the proof, the stranger would have taken rank 1 (or
/// made it a duplicate and failed everyone).
#[test]
fn a_stranger_without_the_key_is_refused_at_the_root_while_the_job_completes() {
    let id = UniqueId::new(LIMIT).unwrap();
    let fake = forged(&id);
    let stranger = Bootstrap::init(&fake, 2, 1, &dev(77), LIMIT);
    assert!(
        matches!(&stranger, Err(BootstrapError::Rejected { reason, .. }) if reason.contains("key")),
        "{stranger:?}"
    );
    let bs: Vec<Bootstrap> = join(&id, 2, LIMIT)
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    for b in &bs {
        assert_eq!(b.descs()[1].device, 1, "the stranger's descriptor got in");
    }
}

/// Opens `n` connections to `at`: garbage on every other one if
/// `garbage`, silence on the rest; kept open until dropped.
fn storm(at: std::net::SocketAddr, n: usize, garbage: bool, seed: u64) -> Vec<TcpStream> {
    let mut v = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let Ok(mut s) = TcpStream::connect(at) else {
            continue;
        };
        if garbage {
            let x = (seed * 7919 + i).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let _ = s.write_all(&x.to_le_bytes().repeat(1 + (i as usize % 40)));
        }
        v.push(s);
    }
    v
}

/// Hundreds of garbage or silent connections at the root, before and
/// while three ranks meet: ten rounds of each, every rendezvous intact.
#[test]
fn storms_of_garbage_and_silence_at_the_root_leave_setup_intact() {
    for round in 0..10u64 {
        for garbage in [true, false] {
            let id = UniqueId::new(LIMIT).unwrap();
            let at = id.info().unwrap().root;
            let t = Instant::now();
            let (res, _kept) = std::thread::scope(|s| {
                let before = storm(at, 150, garbage, round);
                let during = s.spawn(move || storm(at, 150, garbage, round + 100));
                let res = join(&id, 3, LIMIT);
                (res, (before, during.join().unwrap()))
            });
            for r in &res {
                assert!(
                    r.is_ok(),
                    "round {round}, garbage {garbage}, after {:?}: {r:?}",
                    t.elapsed()
                );
            }
        }
    }
}

/// Unused ids cost no thread each: one thread serves every root of the
/// process.
#[test]
fn unused_ids_share_one_thread() {
    let ids: Vec<UniqueId> = (0..200)
        .map(|_| UniqueId::new(Duration::from_secs(3)).unwrap())
        .collect();
    let count = || {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|c| c.trim() == "oxccl-bootstrap")
            .count()
    };
    // A service thread that just ran out of roots (another test's) may
    // still be on its way out: look again a few times.
    let mut roots = count();
    for _ in 0..50 {
        if roots == 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        roots = count();
    }
    assert_eq!(roots, 1, "threads serving {} roots", ids.len());
    assert!(oxccl_bootstrap::service_running());
}

/// The child half of the descriptor test: with `RLIMIT_NOFILE` at 64,
/// starts a root, says where, waits for the parent's storm of silent
/// connections (enough to make `accept` fail with EMFILE), then meets
/// as 2 ranks.
#[test]
fn emfile_child() {
    if std::env::var("OXCCL_TEST_EMFILE_CHILD").is_err() {
        return;
    }
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let was = getrlimit(Resource::Nofile);
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(64),
            maximum: was.maximum,
        },
    )
    .unwrap();
    let id = UniqueId::new(LIMIT).unwrap();
    println!("ROOT {}", id.info().unwrap().root);
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let t = Instant::now();
    let res = join(&id, 2, LIMIT);
    for r in &res {
        match r {
            Ok(_) => {}
            Err(e) => {
                println!("FAILED after {:?}: {e}", t.elapsed());
                std::process::exit(1);
            }
        }
    }
    println!("MET after {:?}", t.elapsed());
}

/// A process whose descriptors run out (`ulimit -n 64`) under 300 silent
/// connections at its root still meets: `accept`'s EMFILE sheds the
/// oldest waiting connections and backs off instead of failing.
#[test]
fn emfile_at_the_root_is_survived() {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "emfile_child", "--nocapture", "--test-threads=1"])
        .env("OXCCL_TEST_EMFILE_CHILD", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let root = loop {
        line.clear();
        assert_ne!(
            out.read_line(&mut line).unwrap(),
            0,
            "the child said nothing"
        );
        // libtest may print "test emfile_child ... " ahead of it.
        if let Some(at) = line.find("ROOT ") {
            break line[at + 5..]
                .trim()
                .parse::<std::net::SocketAddr>()
                .unwrap();
        }
    };
    let kept = storm(root, 300, false, 0);
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    let mut said = Vec::new();
    while out.read_line(&mut rest).unwrap() > 0 {
        said.push(rest.clone());
        rest.clear();
    }
    let status = child.wait().unwrap();
    drop(kept);
    let said = said.concat();
    eprintln!("{said}");
    assert!(status.success() && said.contains("MET after"), "{said}");
}
