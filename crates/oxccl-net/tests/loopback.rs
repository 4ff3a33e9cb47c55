//! The TCP transport over loopback, as the host backend uses it: listen,
//! connect, accept, then messages of every size split over the sockets,
//! in order; strangers refused; a closed peer an error, never a hang.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use oxccl_net::{Buf, Comm, MemKind, Net, NetError, RecvComm, Region, SendComm, TcpConfig, TcpNet};

const LO: &str = "127.0.0.1";
/// A hang guard for the polling loops below, never a measurement.
const GUARD: Duration = Duration::from_secs(60);

fn net(magic: u64, nthreads: usize, per: usize) -> TcpNet {
    let cfg = TcpConfig {
        nthreads,
        nsocks_per_thread: per,
        min_chunk: 4096,
        deadline: Duration::from_secs(10),
    };
    TcpNet::new(
        cfg,
        magic,
        key_of(magic),
        "lo",
        LO.parse::<IpAddr>().unwrap(),
        None,
    )
}

/// The key of the communicator with `magic`, in these tests.
fn key_of(magic: u64) -> [u8; 32] {
    oxccl_bootstrap::Key::from_secret(&magic.to_le_bytes()).to_bytes()
}

fn pair(a: &TcpNet, b: &TcpNet) -> (SendComm, RecvComm) {
    let (h, l) = b.listen(0).unwrap();
    let s = a.connect(0, &h).unwrap().expect("TCP connects at once");
    let t = Instant::now();
    let r = loop {
        if let Some(r) = b.accept(l).unwrap() {
            break r;
        }
        assert!(t.elapsed() < GUARD, "accept never completed");
        std::thread::yield_now();
    };
    b.close_listen(l).unwrap();
    (s, r)
}

fn wait(n: &TcpNet, req: oxccl_net::Request) -> Result<usize, NetError> {
    let t = Instant::now();
    loop {
        if let Some(sz) = n.test(req)? {
            return Ok(sz);
        }
        assert!(t.elapsed() < GUARD, "request never completed");
        std::thread::yield_now();
    }
}

#[test]
fn messages_of_every_size_arrive_whole_and_in_order() {
    for (threads, per) in [(1, 1), (2, 2), (3, 1)] {
        let (a, b) = (net(11, threads, per), net(11, threads, per));
        let (s, r) = pair(&a, &b);
        // Small after large: a small message rides socket 0 alone, behind
        // a large one's parts on every socket.
        let sizes = [
            0usize,
            1,
            4095,
            4096,
            70_000,
            1 << 20,
            3 * (1 << 20) + 17,
            5,
            1 << 20,
            0,
            9000,
        ];
        let msgs: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(k, &n)| (0..n).map(|i| (i * 31 + k * 7) as u8).collect())
            .collect();
        let cap = 4 << 20;
        let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|_| vec![0u8; cap]).collect();
        let mut recvs = Vec::new();
        for buf in &mut bufs {
            let mr = b
                .reg_mr(Comm::Recv(r), Region::host(buf.as_mut_ptr(), cap))
                .unwrap();
            // SAFETY: `bufs` outlives the requests (waited for below).
            recvs.push(
                unsafe { b.irecv(r, Buf::new(buf.as_mut_ptr(), cap, mr), 5) }
                    .unwrap()
                    .unwrap(),
            );
        }
        let mut sends = Vec::new();
        for m in &msgs {
            let mr = a
                .reg_mr(Comm::Send(s), Region::host(m.as_ptr().cast_mut(), m.len()))
                .unwrap();
            // SAFETY: `msgs` outlives the requests (waited for below).
            sends.push(
                unsafe { a.isend(s, Buf::new(m.as_ptr().cast_mut(), m.len(), mr), 5) }
                    .unwrap()
                    .unwrap(),
            );
        }
        for (k, q) in sends.into_iter().enumerate() {
            assert_eq!(wait(&a, q).unwrap(), sizes[k]);
        }
        for (k, q) in recvs.into_iter().enumerate() {
            assert_eq!(wait(&b, q).unwrap(), sizes[k], "message {k}");
            assert_eq!(
                &bufs[k][..sizes[k]],
                &msgs[k][..],
                "message {k} ({threads}x{per})"
            );
            assert!(
                bufs[k][sizes[k]..].iter().all(|&x| x == 0),
                "nothing past the message"
            );
        }
        a.close_send(s).unwrap();
        b.close_recv(r).unwrap();
    }
}

/// Accepts on `l` until a connection is complete, the guard aside.
fn accept_one(b: &TcpNet, l: oxccl_net::ListenComm) -> RecvComm {
    let t = Instant::now();
    loop {
        if let Some(r) = b.accept(l).expect("strangers are dropped, not errors") {
            return r;
        }
        assert!(t.elapsed() < GUARD, "accept never completed");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn strangers_are_dropped_and_the_peer_still_connects() {
    use std::io::Write;
    let (a, b) = (net(1, 1, 2), net(2, 1, 2));
    let (h, l) = b.listen(0).unwrap();
    // Our own handle of another communicator: refused before connecting.
    assert!(matches!(a.connect(0, &h), Err(NetError::Wire { .. })));
    let mut strangers = Vec::new();
    // Garbage, a truncated hello, and silence.
    for bytes in [&[0xAB; 56][..], &[0u8; 10][..], &[][..]] {
        let mut s = std::net::TcpStream::connect(h.addr).unwrap();
        s.write_all(bytes).unwrap();
        strangers.push(s);
    }
    // A stranger that holds the handle (it travels in the clear) and the
    // magic, but not the key: its hellos do not prove it.
    let thief = TcpNet::new(
        TcpConfig {
            nthreads: 1,
            nsocks_per_thread: 2,
            min_chunk: 4096,
            deadline: Duration::from_secs(10),
        },
        2,
        key_of(99),
        "lo",
        LO.parse::<IpAddr>().unwrap(),
        None,
    );
    let _forged = thief.connect(0, &h).unwrap();
    // None of that completes a connection...
    for _ in 0..50 {
        assert!(b.accept(l).unwrap().is_none(), "a stranger was accepted");
        std::thread::sleep(Duration::from_millis(2));
    }
    // ...and the peer holding the key still gets through.
    let peer = net(2, 1, 2);
    let s = peer.connect(0, &h).unwrap().unwrap();
    let r = accept_one(&b, l);
    let msg = b"through the storm".to_vec();
    let mut got = vec![0u8; 64];
    let (smr, rmr) = (
        peer.reg_mr(
            Comm::Send(s),
            Region::host(msg.as_ptr() as *mut u8, msg.len()),
        )
        .unwrap(),
        b.reg_mr(Comm::Recv(r), Region::host(got.as_mut_ptr(), got.len()))
            .unwrap(),
    );
    // SAFETY: both buffers outlive the requests, which are waited for.
    let rr = unsafe { b.irecv(r, Buf::new(got.as_mut_ptr(), got.len(), rmr), 5) }
        .unwrap()
        .unwrap();
    // SAFETY: as above.
    let sr = unsafe { peer.isend(s, Buf::new(msg.as_ptr().cast_mut(), msg.len(), smr), 5) }
        .unwrap()
        .unwrap();
    assert_eq!(wait(&peer, sr).unwrap(), msg.len());
    assert_eq!(wait(&b, rr).unwrap(), msg.len());
    assert_eq!(&got[..msg.len()], &msg[..]);
    drop(strangers);
}

/// Storms of garbage and of silent connections (hundreds, arriving
/// before and with the peer's) never keep a connection from completing:
/// ten rounds of each.
#[test]
fn storms_of_garbage_and_silence_leave_the_connection_intact() {
    use std::io::Write;
    let b = net(4, 1, 2);
    let peer = net(4, 1, 2);
    for round in 0..10u64 {
        for garbage in [true, false] {
            let (h, l) = b.listen(0).unwrap();
            let mut storm = Vec::new();
            for i in 0..150u64 {
                let Ok(mut s) = std::net::TcpStream::connect(h.addr) else {
                    continue;
                };
                if garbage {
                    let x = (round * 1000 + i).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                    let _ = s.write_all(&x.to_le_bytes().repeat(1 + (i as usize % 9)));
                }
                storm.push(s);
                // Let the listener see some of the storm as it comes.
                if i % 50 == 0 {
                    let _ = b.accept(l).unwrap();
                }
            }
            let _s = peer.connect(0, &h).unwrap().unwrap();
            let _r = accept_one(&b, l);
            b.close_listen(l).unwrap();
            drop(storm);
        }
    }
}

/// A storm that arrives after the peer's sockets, before the listener
/// looks again (more strangers than may wait), does not push the peer's
/// hellos out: they came first and were whole, and no connector sends
/// them twice.
#[test]
fn a_storm_behind_the_peers_sockets_does_not_evict_them() {
    let b = net(5, 1, 2);
    let peer = net(5, 1, 2);
    for _ in 0..3 {
        let (h, l) = b.listen(0).unwrap();
        let _s = peer.connect(0, &h).unwrap().unwrap();
        let storm: Vec<std::net::TcpStream> = (0..100)
            .filter_map(|_| std::net::TcpStream::connect(h.addr).ok())
            .collect();
        assert!(storm.len() > 64, "only {} strangers connected", storm.len());
        let t = Instant::now();
        loop {
            if b.accept(l).unwrap().is_some() {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "the peer's sockets were dropped for the strangers behind them"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        b.close_listen(l).unwrap();
    }
}

/// With no deadline (`Duration::MAX`, what the C ABI configures as NCCL
/// has none), connecting and accepting work as with one.
#[test]
fn no_deadline_connects_and_accepts() {
    let mk = || {
        let cfg = TcpConfig {
            nthreads: 1,
            nsocks_per_thread: 2,
            min_chunk: 4096,
            deadline: Duration::MAX,
        };
        TcpNet::new(cfg, 6, key_of(6), "lo", LO.parse::<IpAddr>().unwrap(), None)
    };
    let (a, b) = (mk(), mk());
    let (s, r) = pair(&a, &b);
    a.close_send(s).unwrap();
    b.close_recv(r).unwrap();
}

#[test]
fn bad_arguments_are_typed_errors() {
    let (a, b) = (net(3, 1, 1), net(3, 1, 1));
    let (s, r) = pair(&a, &b);
    let mut small = vec![0u8; 16];
    let mr = b
        .reg_mr(Comm::Recv(r), Region::host(small.as_mut_ptr(), 16))
        .unwrap();
    // Outside the registration.
    // SAFETY: refused before anything is queued.
    let e = unsafe { b.irecv(r, Buf::new(small.as_mut_ptr(), 32, mr), 0) };
    assert!(matches!(e, Err(NetError::InvalidArgument(_))), "{e:?}");
    assert!(matches!(
        a.reg_mr(
            Comm::Send(s),
            Region {
                ptr: small.as_mut_ptr(),
                len: 16,
                kind: MemKind::Cuda
            }
        ),
        Err(NetError::Unsupported { .. })
    ));
    assert!(matches!(a.properties(1), Err(NetError::InvalidArgument(_))));
    // A message larger than the posted receive fails the receive.
    let big = [1u8; 64];
    let smr = a
        .reg_mr(Comm::Send(s), Region::host(big.as_ptr().cast_mut(), 64))
        .unwrap();
    // SAFETY: both buffers outlive the requests.
    let q = unsafe { b.irecv(r, Buf::new(small.as_mut_ptr(), 16, mr), 0) }
        .unwrap()
        .unwrap();
    // SAFETY: as above.
    let _ = unsafe { a.isend(s, Buf::new(big.as_ptr().cast_mut(), 64, smr), 0) }
        .unwrap()
        .unwrap();
    let e = wait(&b, q).unwrap_err();
    assert!(e.to_string().contains("64 bytes"), "{e}");
    assert!(small.iter().all(|&x| x == 0), "nothing written");
}

#[test]
fn a_closed_peer_fails_pending_and_later_requests() {
    let (a, b) = (net(4, 1, 2), net(4, 1, 2));
    let (s, r) = pair(&a, &b);
    let mut buf = vec![0u8; 1024];
    let mr = b
        .reg_mr(Comm::Recv(r), Region::host(buf.as_mut_ptr(), 1024))
        .unwrap();
    // SAFETY: `buf` outlives the request (the comm is closed before it drops).
    let q = unsafe { b.irecv(r, Buf::new(buf.as_mut_ptr(), 1024, mr), 0) }
        .unwrap()
        .unwrap();
    a.close_send(s).unwrap();
    let e = wait(&b, q).unwrap_err();
    assert!(matches!(e, NetError::Closed { .. }), "{e}");
    // SAFETY: refused at once: the connection failed.
    let again = unsafe { b.irecv(r, Buf::new(buf.as_mut_ptr(), 1024, mr), 0) };
    assert!(again.is_err());
    b.close_recv(r).unwrap();
}

/// The child half of the descriptor test: with `RLIMIT_NOFILE` at 48,
/// listens, says where (the handle in hex), and accepts until the real
/// peer's connection is complete while the parent's storm of silent
/// connections makes `accept` fail with EMFILE.
#[test]
fn emfile_child() {
    if std::env::var("OXCCL_NET_EMFILE_CHILD").is_err() {
        return;
    }
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let was = getrlimit(Resource::Nofile);
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(48),
            maximum: was.maximum,
        },
    )
    .unwrap();
    let b = net(21, 1, 2);
    let (h, l) = b.listen(0).unwrap();
    let hex: String = h.encode().iter().map(|x| format!("{x:02x}")).collect();
    println!("HANDLE {hex}");
    let t = Instant::now();
    loop {
        match b.accept(l) {
            Ok(Some(_)) => break,
            Ok(None) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => {
                println!("FAILED after {:?}: {e}", t.elapsed());
                std::process::exit(1);
            }
        }
        if t.elapsed() > GUARD {
            println!("FAILED: never accepted");
            std::process::exit(1);
        }
    }
    println!("ACCEPTED after {:?}", t.elapsed());
}

/// A listener whose process is out of descriptors (`ulimit -n 48`) under
/// 300 silent connections still takes the peer's connection: `accept`'s
/// EMFILE sheds waiting sockets and backs off instead of failing.
#[test]
fn emfile_at_the_listener_is_survived() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "emfile_child", "--nocapture", "--test-threads=1"])
        .env("OXCCL_NET_EMFILE_CHILD", "1")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let h = loop {
        line.clear();
        assert_ne!(
            out.read_line(&mut line).unwrap(),
            0,
            "the child said nothing"
        );
        if let Some(at) = line.find("HANDLE ") {
            let hex = line[at + 7..].trim();
            let bytes: Vec<u8> = (0..hex.len() / 2)
                .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
                .collect();
            break oxccl_net::Handle::decode(&bytes, 21).unwrap();
        }
    };
    let storm: Vec<std::net::TcpStream> = (0..300)
        .filter_map(|_| std::net::TcpStream::connect(h.addr).ok())
        .collect();
    let peer = net(21, 1, 2);
    let _s = peer.connect(0, &h).unwrap().unwrap();
    let mut said = Vec::new();
    let mut rest = String::new();
    while out.read_line(&mut rest).unwrap() > 0 {
        said.push(std::mem::take(&mut rest));
    }
    let status = child.wait().unwrap();
    drop(storm);
    let said = said.concat();
    eprintln!("{said}");
    assert!(
        status.success() && said.contains("ACCEPTED after"),
        "{said}"
    );
}
