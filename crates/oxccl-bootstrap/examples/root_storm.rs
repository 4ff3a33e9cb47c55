//! What a storm of strangers costs a root, and what it costs a job.
//!
//! `cargo run --release -p oxccl-bootstrap --example root_storm` starts a
//! root, has a child process open 1000 connections to it (silent, then
//! each announcing and sending a 4 MiB frame), and prints this process's
//! threads and resident memory meanwhile; then it times a 3-rank
//! rendezvous with no storm and under storms of garbage and of silence.
//! The child half runs as `root_storm client ADDR MAGIC KIND N`.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use oxccl_bootstrap::wire::{header, Kind};
use oxccl_bootstrap::{Bootstrap, DeviceInfo, UniqueId};

fn status(field: &str) -> String {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .map(|l| l[field.len()..].trim().to_string())
        .unwrap_or_default()
}

fn client(at: SocketAddr, magic: u64, kind: &str, n: usize) {
    let mut kept = Vec::with_capacity(n);
    let body = vec![0x5au8; 4 << 20];
    for i in 0..n {
        let Ok(mut s) = TcpStream::connect(at) else {
            continue;
        };
        match kind {
            "frames" => {
                let _ = s.set_nonblocking(true);
                let _ = s.write(&header(magic, Kind::Hello, 4 << 20));
                let _ = s.write(&body);
            }
            "garbage" => {
                let x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                let _ = s.write_all(&x.to_le_bytes().repeat(1 + i % 40));
            }
            _ => {}
        }
        kept.push(s);
    }
    println!("OPEN {}", kept.len());
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

fn storm(id: &UniqueId, kind: &str, n: usize) -> std::process::Child {
    let i = id.info().unwrap();
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args([
            "client",
            &i.root.to_string(),
            &i.magic.to_string(),
            kind,
            &n.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until every connection is open.
    let mut out = std::io::BufReader::new(c.stdout.take().unwrap());
    let mut line = String::new();
    let _ = std::io::BufRead::read_line(&mut out, &mut line);
    eprintln!("  storm of {kind}: {}", line.trim());
    c
}

fn job(id: &UniqueId, n: u32) -> (Duration, Vec<String>) {
    let t = Instant::now();
    let res: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                s.spawn(move || {
                    Bootstrap::init(id, n, r, &DeviceInfo::default(), Duration::from_secs(30))
                        .map(|_| "ok".to_string())
                        .unwrap_or_else(|e| e.to_string())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    (t.elapsed(), res)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("client") {
        client(
            args[2].parse().unwrap(),
            args[3].parse().unwrap(),
            &args[4],
            args[5].parse().unwrap(),
        );
        return;
    }
    println!(
        "idle process: threads {}, VmRSS {}",
        status("Threads:"),
        status("VmRSS:")
    );
    let ids: Vec<UniqueId> = (0..1000)
        .map(|_| UniqueId::new(Duration::from_secs(60)).unwrap())
        .collect();
    println!(
        "1000 unused ids: threads {}, VmRSS {}, fds {}",
        status("Threads:"),
        status("VmRSS:"),
        std::fs::read_dir("/proc/self/fd").unwrap().count()
    );
    drop(ids);
    for kind in ["silent", "frames"] {
        let id = UniqueId::new(Duration::from_secs(60)).unwrap();
        let mut c = storm(&id, kind, 1000);
        let mut peak_threads = 0u32;
        let mut peak_rss = 0u64;
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(3) {
            peak_threads = peak_threads.max(status("Threads:").parse().unwrap_or(0));
            let rss: u64 = status("VmRSS:")
                .trim_end_matches(" kB")
                .parse()
                .unwrap_or(0);
            peak_rss = peak_rss.max(rss);
            std::thread::sleep(Duration::from_millis(20));
        }
        println!(
            "root under 1000 {kind} connections: peak threads {peak_threads}, peak VmRSS {peak_rss} kB"
        );
        // The rendezvous still works.
        let (took, res) = job(&id, 2);
        println!("  a 2-rank job meanwhile: {took:?}, {res:?}");
        let _ = c.stdin.take().unwrap().write_all(b"\n");
        let _ = c.wait();
    }
    let (took, res) = job(&UniqueId::new(Duration::from_secs(60)).unwrap(), 3);
    println!("3-rank job, no storm: {took:?} {res:?}");
    for kind in ["garbage", "silent"] {
        let mut worst = Duration::ZERO;
        let mut errs = Vec::new();
        for _ in 0..10 {
            let id = UniqueId::new(Duration::from_secs(60)).unwrap();
            let mut c = storm(&id, kind, 500);
            let (took, res) = job(&id, 3);
            worst = worst.max(took);
            errs.extend(res.into_iter().filter(|r| r != "ok"));
            let _ = c.stdin.take().unwrap().write_all(b"\n");
            let _ = c.wait();
        }
        println!(
            "3-rank job under 500 {kind} connections, 10 runs: slowest {worst:?}, errors {errs:?}"
        );
    }
}
