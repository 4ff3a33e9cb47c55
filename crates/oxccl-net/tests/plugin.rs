//! Network plugins of the tests' own (`plugins/ours.c`, TCP over
//! loopback), built with the system C compiler: each table version (v8 to
//! v12) loads and carries messages through its own entry points; the
//! newest exported version is taken; and a plugin that fails `init`,
//! exports no known version, cannot be found or drops its connection is
//! named in what the caller sees, the built-in transport remaining.

mod plugins;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use oxccl_net::plugin::{load, select, PluginNet, BUILT_IN};
use oxccl_net::{Buf, Comm, MemKind, Net, NetError, RecvComm, Region, Request, SendComm};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("net-plugins")
}

/// The plugin of table version `v`.
fn version(v: u32) -> PathBuf {
    plugins::build(&dir(), &format!("v{v}"), &[&format!("NET_VERSION={v}")])
}

fn path_str(p: &std::path::Path) -> String {
    p.to_str().expect("a UTF-8 path").to_string()
}

/// A connected pair over `net`: connect and accept, each answering "not
/// yet" at first, driven together.
fn pair(net: &dyn Net) -> (SendComm, RecvComm) {
    let (mut h, l) = net.listen(0).expect("listen");
    let (mut s, mut r) = (None, None);
    let until = Instant::now() + Duration::from_secs(20);
    let mut calls = 0;
    while s.is_none() || r.is_none() {
        assert!(Instant::now() < until, "no connection");
        if s.is_none() {
            s = net.connect(0, &mut h).expect("connect");
        }
        if r.is_none() {
            r = net.accept(l).expect("accept");
        }
        calls += 1;
    }
    // Our plugin says "not yet" at least once on each side.
    assert!(calls > 1);
    net.close_listen(l).expect("close listen");
    (s.unwrap(), r.unwrap())
}

/// Waits for `req`: its size, or the error.
fn wait(net: &dyn Net, req: Request) -> Result<usize, NetError> {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(n) = net.test(req)? {
            return Ok(n);
        }
        assert!(Instant::now() < until, "request {req:?} never completed");
        std::thread::yield_now();
    }
}

/// Sends `data` with `tag` over a fresh pair and receives it into a
/// buffer of `cap` bytes: what arrived, or the first error.
fn round_trip(net: &dyn Net, s: SendComm, r: RecvComm, data: &[u8], tag: u32) -> Vec<u8> {
    let mut src = data.to_vec();
    let mut dst = vec![0u8; data.len().max(1)];
    let smr = net
        .reg_mr(Comm::Send(s), Region::host(src.as_mut_ptr(), src.len()))
        .expect("regMr send");
    let rmr = net
        .reg_mr(Comm::Recv(r), Region::host(dst.as_mut_ptr(), dst.len()))
        .expect("regMr recv");
    // SAFETY: both buffers outlive the requests, waited for below.
    let rq = unsafe { net.irecv(r, Buf::new(dst.as_mut_ptr(), dst.len(), rmr), tag) }
        .expect("irecv")
        .expect("a request");
    // SAFETY: as above.
    let sq = unsafe { net.isend(s, Buf::new(src.as_ptr().cast_mut(), src.len(), smr), tag) }
        .expect("isend")
        .expect("a request");
    // Either end progresses only when tested: test both.
    let (mut sent, mut got) = (None, None);
    let until = Instant::now() + Duration::from_secs(20);
    while sent.is_none() || got.is_none() {
        assert!(Instant::now() < until, "no progress");
        if sent.is_none() {
            sent = net.test(sq).expect("send test");
        }
        if got.is_none() {
            got = net.test(rq).expect("recv test");
        }
    }
    assert_eq!(sent, Some(data.len()));
    assert_eq!(got, Some(data.len()));
    // SAFETY: the receive completed; nothing else writes `dst`.
    let flush = unsafe { net.iflush(r, Buf::new(dst.as_mut_ptr(), data.len(), rmr)) };
    assert_eq!(flush.expect("iflush"), None, "host memory needs no flush");
    net.dereg_mr(Comm::Send(s), smr).expect("deregMr");
    net.dereg_mr(Comm::Recv(r), rmr).expect("deregMr");
    dst.truncate(data.len());
    dst
}

#[test]
fn every_version_carries_messages_through_its_own_entry_points() {
    for v in 8..=12u32 {
        let lib = load::open(&path_str(&version(v))).expect("our plugin loads");
        assert_eq!(lib.version, v);
        assert_eq!(lib.name, "ours");
        let net = PluginNet::new(lib, 42).expect("init");
        assert_eq!(net.devices(), 1);
        let p = net.properties(0).unwrap();
        assert_eq!(p.name, "ours0");
        assert_eq!((p.speed_mbps, p.max_recvs), (25000, 1));
        assert!(p.ptr_host && !p.ptr_cuda && !p.ptr_dmabuf);
        assert_eq!(p.latency, Duration::from_nanos(3500));
        assert!(p.pci_path.is_none());
        let (s, r) = pair(&net);
        for (len, tag) in [
            (0usize, 0u32),
            (1, 1),
            (4096, 2),
            (3 << 20, 3),
            (77, u32::MAX),
        ] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + v as usize) as u8).collect();
            assert_eq!(
                round_trip(&net, s, r, &data, tag),
                data,
                "v{v}, {len} bytes"
            );
        }
        net.close_send(s).unwrap();
        net.close_recv(r).unwrap();
        // Closed comms are gone: their handles are refused, never passed on.
        assert!(matches!(net.close_send(s), Err(NetError::BadHandle { .. })));
    }
}

#[test]
fn the_newest_exported_version_is_taken() {
    let p = plugins::build(&dir(), "all", &["NET_VERSION=11", "ALL_VERSIONS"]);
    let lib = load::open(&path_str(&p)).expect("loads");
    assert_eq!(lib.version, 11, "v8 to v11 exported: v11 is the newest");
}

#[test]
fn a_full_comm_answers_not_now_and_a_wrong_tag_fails_naming_the_plugin() {
    let net = PluginNet::new(load::open(&path_str(&version(9))).unwrap(), 1).unwrap();
    let (s, r) = pair(&net);
    let mut buf = vec![5u8; 64];
    let mr = net
        .reg_mr(Comm::Send(s), Region::host(buf.as_mut_ptr(), buf.len()))
        .unwrap();
    // Nothing tested, nothing completes: the plugin takes 32, then says
    // "not now" (a null request), as NCCL's plugins may.
    let mut reqs = Vec::new();
    for _ in 0..40 {
        // SAFETY: `buf` outlives the requests (waited for below).
        match unsafe { net.isend(s, Buf::new(buf.as_ptr().cast_mut(), 8, mr), 9) }.unwrap() {
            Some(q) => reqs.push(q),
            None => break,
        }
    }
    assert_eq!(reqs.len(), 32);
    let mut dst = vec![0u8; 64];
    let rmr = net
        .reg_mr(Comm::Recv(r), Region::host(dst.as_mut_ptr(), dst.len()))
        .unwrap();
    // SAFETY: `dst` outlives the request.
    let rq = unsafe { net.irecv(r, Buf::new(dst.as_mut_ptr(), 64, rmr), 10) }
        .unwrap()
        .unwrap();
    // A test drives the comm's queue: the first message leaves.
    assert_eq!(wait(&net, reqs[0]).unwrap(), 8);
    let err = wait(&net, rq).unwrap_err().to_string();
    assert!(
        err.contains("net plugin ours") && err.contains("v9") && err.contains("test failed"),
        "{err}"
    );
    // CUDA memory is refused: our plugin takes host pointers only.
    let e = net
        .reg_mr(
            Comm::Send(s),
            Region {
                ptr: buf.as_mut_ptr(),
                len: 8,
                kind: MemKind::Cuda,
            },
        )
        .unwrap_err();
    assert!(e.to_string().contains("does not take Cuda memory"), "{e}");
    net.close_send(s).unwrap();
    net.close_recv(r).unwrap();
    // The closed comm's requests are forgotten, never tested again.
    assert!(matches!(net.test(reqs[1]), Err(NetError::BadHandle { .. })));
}

#[test]
fn a_dropped_connection_fails_both_ends_naming_the_plugin() {
    let p = plugins::build(&dir(), "drop", &["NET_VERSION=10", "DROP_AFTER=100000"]);
    let net = PluginNet::new(load::open(&path_str(&p)).unwrap(), 2).unwrap();
    let (s, r) = pair(&net);
    let mut src = vec![1u8; 1 << 20];
    let mut dst = vec![0u8; 1 << 20];
    let smr = net
        .reg_mr(Comm::Send(s), Region::host(src.as_mut_ptr(), src.len()))
        .unwrap();
    let rmr = net
        .reg_mr(Comm::Recv(r), Region::host(dst.as_mut_ptr(), dst.len()))
        .unwrap();
    // SAFETY: both buffers outlive the requests.
    let rq = unsafe { net.irecv(r, Buf::new(dst.as_mut_ptr(), dst.len(), rmr), 0) }
        .unwrap()
        .unwrap();
    // SAFETY: as above.
    let sq = unsafe { net.isend(s, Buf::new(src.as_ptr().cast_mut(), src.len(), smr), 0) }
        .unwrap()
        .unwrap();
    let (mut se, mut re) = (None, None);
    let until = Instant::now() + Duration::from_secs(20);
    while se.is_none() || re.is_none() {
        assert!(Instant::now() < until, "the drop was never seen");
        if se.is_none() {
            match net.test(sq) {
                Ok(None) => {}
                Ok(Some(n)) => panic!("a send of {n} bytes completed past the drop"),
                Err(e) => se = Some(e.to_string()),
            }
        }
        if re.is_none() {
            match net.test(rq) {
                Ok(None) => {}
                Ok(Some(n)) => panic!("a receive of {n} bytes completed past the drop"),
                Err(e) => re = Some(e.to_string()),
            }
        }
    }
    let (se, re) = (se.unwrap(), re.unwrap());
    assert!(
        se.contains("net plugin ours") && se.contains("ncclSystemError"),
        "{se}"
    );
    assert!(
        re.contains("net plugin ours") && re.contains("ncclRemoteError"),
        "{re}"
    );
}

#[test]
fn a_plugin_that_fails_init_is_named_and_tcp_remains() {
    let p = plugins::build(&dir(), "failinit", &["NET_VERSION=8", "FAIL_INIT"]);
    let sel = select(Some(&path_str(&p)), None, 3).expect("a fallback, not an error");
    assert!(sel.net.is_none(), "the built-in transport remains");
    assert_eq!(sel.available, vec![BUILT_IN.to_string()]);
    let w = sel.warnings.join("\n");
    assert!(
        w.contains(&path_str(&p))
            && w.contains("ncclNetPlugin_v8")
            && w.contains("init failed: ncclSystemError"),
        "{w}"
    );
}

#[test]
fn a_plugin_of_no_known_version_is_named_and_tcp_remains() {
    let p = plugins::build(&dir(), "v99", &["ONLY_V99"]);
    let sel = select(Some(&path_str(&p)), None, 4).unwrap();
    assert!(sel.net.is_none());
    let w = sel.warnings.join("\n");
    assert!(
        w.contains(&path_str(&p))
            && w.contains("exports none of ncclNetPlugin_v12 to ncclNetPlugin_v8"),
        "{w}"
    );
}

#[test]
fn a_missing_plugin_is_named_a_listed_one_after_it_is_taken() {
    let good = path_str(&version(11));
    let sel = select(Some(&format!("nowhere-to-be-found, {good}")), None, 5).unwrap();
    let w = sel.warnings.join("\n");
    assert!(w.contains("libnccl-net-nowhere-to-be-found.so"), "{w}");
    let net = sel.net.expect("the second entry loads");
    assert_eq!(net.lib().version, 11);
    assert_eq!(
        sel.available,
        vec!["ours".to_string(), BUILT_IN.to_string()]
    );
}

#[test]
fn nccl_net_picks_by_name_and_none_loads_nothing() {
    let good = path_str(&version(10));
    // By name, in any case; `Socket` is the built-in one.
    assert!(select(Some(&good), Some("OURS"), 6).unwrap().net.is_some());
    assert!(select(Some(&good), Some("socket"), 6)
        .unwrap()
        .net
        .is_none());
    let e = select(Some(&good), Some("IB"), 6).unwrap_err().to_string();
    assert!(
        e.contains("NCCL_NET=\"IB\"") && e.contains("available: ours, Socket"),
        "{e}"
    );
    // `none`: no plugin is even looked at.
    let sel = select(Some("none"), None, 6).unwrap();
    assert!(sel.net.is_none() && sel.warnings.is_empty());
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn the_plugins_log_lands_in_tracing_formatted() {
    // v11 initialises per communicator, so this init runs here, whatever
    // other tests did with the library.
    let p = version(11);
    let cap = Captured::default();
    let w = cap.clone();
    let sub = tracing_subscriber::fmt()
        .with_writer(move || w.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    tracing::subscriber::with_default(sub, || {
        let sel = select(Some(&path_str(&p)), None, 7).unwrap();
        assert!(sel.net.is_some());
    });
    let text = String::from_utf8(cap.0.lock().unwrap().clone()).unwrap();
    // The plugin's own line, its arguments formatted by the C logger.
    assert!(
        text.contains("NET/Plugin: ours: plugin init (table v11)"),
        "{text}"
    );
    // The host's lines: which plugin, which version, which device.
    assert!(text.contains("ncclNetPlugin_v11"), "{text}");
    assert!(text.contains("NET/ours: device 0: ours0"), "{text}");
}
