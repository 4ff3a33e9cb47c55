//! Ranks as processes of this host: every collective across 2 and 4
//! processes, launchers' environments, `split`, and a process killed
//! mid-loop. The test binary re-executes itself: the test `child`
//! is the processes' entry point, told its role by `OXCCL_MP_ROLE`.

use std::process::{Child, Command};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;
#[path = "../../oxccl-net/tests/plugins/mod.rs"]
mod plugins;
use common::procs::{
    env_u32, every_rank_any, every_rank_first, finish, kill_once_all_say, spawn_ranks_live,
    spawn_via, tagged, unhex, GUARD,
};

use oxccl::core::testkit;
use oxccl::core::{with_dtype, Collective};
use oxccl::{
    BackendKind, CollKind, Communicator, Config, DataType, Element, LaunchEnv, RedOp, UniqueId,
};

/// The children's backend: host unless `OXCCL_MP_BACKEND` names another.
const BACKEND: &str = "OXCCL_MP_BACKEND";

fn config(deadline: Duration) -> Config {
    let backend = std::env::var(BACKEND).map_or(BackendKind::Host, |b| b.parse().unwrap());
    // The rest (NCCL_DEBUG, the network's variables) as the launcher set it.
    Config {
        backend,
        deadline,
        ..Config::from_env().unwrap()
    }
}

/// A child running `role` with `vars`; its stdout lines arrive on `tx`.
fn spawn(
    role: &str,
    vars: &[(&str, String)],
    tx: &mpsc::Sender<(usize, String)>,
    who: usize,
) -> Child {
    spawn_via(&[], role, vars, tx, who)
}

fn run_ranks(role: &str, n: u32) -> Vec<Vec<String>> {
    run_ranks_on(role, n, "host")
}

fn run_ranks_on(role: &str, n: u32, backend: &str) -> Vec<Vec<String>> {
    run_ranks_with(role, n, backend, &[])
}

/// `n` children of one new id running `role`, rank `r` with `more(r)`
/// variables too; their exit codes and lines.
fn spawn_ranks(
    role: &str,
    n: u32,
    more: impl Fn(u32) -> Vec<(&'static str, String)>,
) -> (Vec<Option<i32>>, Vec<Vec<String>>) {
    let (kids, rx) = spawn_ranks_live(role, n, more);
    finish(kids, &rx)
}

fn owned(vars: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    vars.iter().map(|&(k, v)| (k, v.to_string())).collect()
}

/// [`run_ranks_on`] with `extra` variables set in every child.
fn run_ranks_with(
    role: &str,
    n: u32,
    backend: &str,
    extra: &[(&'static str, &str)],
) -> Vec<Vec<String>> {
    let (codes, lines) = spawn_ranks(role, n, |_| {
        let mut v = owned(extra);
        v.push((BACKEND, backend.into()));
        v
    });
    assert!(
        codes.iter().all(|c| *c == Some(0)),
        "exit codes {codes:?}\n{lines:#?}"
    );
    lines
}

fn ok_lines(lines: &[Vec<String>]) -> Vec<String> {
    lines.iter().flat_map(|l| tagged(l, "OK ")).collect()
}

#[test]
fn every_collective_across_two_and_four_processes() {
    for n in [2u32, 4] {
        let lines = run_ranks("all", n);
        let oks = ok_lines(&lines);
        assert_eq!(oks.len(), n as usize, "{lines:#?}");
        for l in oks {
            // "OK rank R: C cases, 0 wrong"
            let cases: usize = l.split_whitespace().nth(3).unwrap().parse().unwrap();
            assert!(cases >= 100, "{l}");
        }
    }
}

/// CUDA ranks as processes (every rank on the first visible GPUs,
/// round-robin): the same cases on device buffers.
#[test]
fn every_collective_across_processes_on_cuda() {
    oxccl::backend::cuda::prefer_process_rank_queues();
    if oxccl::backend::cuda::device_or_skip("every_collective_across_processes_on_cuda").is_none() {
        return;
    }
    for n in [2u32, 4] {
        let lines = run_ranks_on("all", n, "cuda");
        let oks = ok_lines(&lines);
        assert_eq!(oks.len(), n as usize, "{lines:#?}");
        for l in oks {
            let cases: usize = l.split_whitespace().nth(3).unwrap().parse().unwrap();
            assert!(cases >= 50, "{l}");
        }
        // The device path (MPS, or a GPU per rank) shares each rank's heap,
        // so direct plans run across processes too.
        for l in &lines {
            if tagged(l, "BACKEND ")
                .iter()
                .any(|b| b.contains("heaps shared"))
            {
                let direct = tagged(l, "DIRECT ");
                let k: usize = direct
                    .first()
                    .and_then(|d| d.split_whitespace().nth(1))
                    .and_then(|k| k.parse().ok())
                    .unwrap_or_else(|| panic!("no DIRECT line: {l:#?}"));
                assert!(k > 0, "no direct plan ran on the device path: {l:#?}");
            }
        }
    }
}

/// The one-step LL AllReduce across processes (forced with
/// `NCCL_ALGO=allreduce:ll1`): each rank stores into its peers' slots in
/// their link arenas. Every dtype family and op, in place and out, at
/// counts up to the path's limit, each case three times (so both parities
/// of the slots are reused); on the device path every call ran on it.
#[test]
fn the_one_step_ll_allreduce_runs_across_processes_on_cuda() {
    oxccl::backend::cuda::prefer_process_rank_queues();
    let test = "the_one_step_ll_allreduce_runs_across_processes_on_cuda";
    if oxccl::backend::cuda::device_or_skip(test).is_none() {
        return;
    }
    for n in [2u32, 3, 4] {
        let lines = run_ranks_with("ll1", n, "cuda", &[("NCCL_ALGO", "allreduce:ll1")]);
        let oks = ok_lines(&lines);
        assert_eq!(oks.len(), n as usize, "{lines:#?}");
        for l in &lines {
            let cases: u64 = tagged(l, "OK ")
                .first()
                .and_then(|o| o.split_whitespace().nth(3)?.parse().ok())
                .unwrap_or_else(|| panic!("no OK line: {l:#?}"));
            let ran: u64 = tagged(l, "LL1 ")
                .first()
                .and_then(|o| o.split_whitespace().nth(1)?.parse().ok())
                .unwrap_or_else(|| panic!("no LL1 line: {l:#?}"));
            assert!(cases >= 100, "{l:#?}");
            // The device path's kernels wait on each other (MPS, or a GPU
            // per rank); the staged path and the relaunch mode
            // (`OXCCL_RELAUNCH`) have no one-step LL path.
            let device_path = tagged(l, "BACKEND ")
                .iter()
                .any(|b| b.contains("heaps shared"));
            if device_path && std::env::var_os("OXCCL_RELAUNCH").is_none() {
                assert_eq!(ran, cases, "not every call ran the path: {l:#?}");
            }
        }
    }
}

/// The caller's own device memory (`cuMemAlloc`, as a framework's caching
/// allocator has it) through the raw entry points: on the device path each
/// rank shares its allocations with its peer processes per call, so the
/// direct plans run on them; freed and reallocated memory gets a fresh
/// mapping.
#[test]
fn the_callers_memory_runs_direct_plans_across_processes_on_cuda() {
    oxccl::backend::cuda::prefer_process_rank_queues();
    let test = "the_callers_memory_runs_direct_plans_across_processes_on_cuda";
    if oxccl::backend::cuda::device_or_skip(test).is_none() {
        return;
    }
    for n in [2u32, 3] {
        let lines = run_ranks_on("external", n, "cuda");
        assert_eq!(ok_lines(&lines).len(), n as usize, "{lines:#?}");
        for l in &lines {
            if tagged(l, "BACKEND ")
                .iter()
                .any(|b| b.contains("heaps shared"))
            {
                let k: usize = tagged(l, "DIRECT ")
                    .first()
                    .and_then(|d| d.split_whitespace().nth(1))
                    .and_then(|k| k.parse().ok())
                    .unwrap_or_else(|| panic!("no DIRECT line: {l:#?}"));
                assert!(k > 0, "no direct plan ran on the caller's memory: {l:#?}");
            }
        }
    }
}

/// Windows across processes: every rank registers windows over its
/// buffers (`ncclMemAlloc`'s memory on CUDA, host memory on the host
/// backend), the collectives on them are right, the window gives back the
/// registered pointer, and deregistered windows are stale.
fn windows_across_processes(backend: &str) {
    for n in [2u32, 3] {
        let lines = run_ranks_on("windows", n, backend);
        let ok = ok_lines(&lines);
        assert_eq!(ok.len(), n as usize, "{lines:#?}");
        for l in ok {
            assert!(l.ends_with(" 0 wrong"), "{l}\n{lines:#?}");
        }
        // Windows are not mapped across processes yet (`window.rs`,
        // `MAP_ACROSS_PROCESSES`): calls on them run as caller memory.
        for l in &lines {
            let direct: usize = tagged(l, "DIRECT ")
                .first()
                .and_then(|d| d.split_whitespace().nth(1))
                .and_then(|k| k.parse().ok())
                .unwrap_or_else(|| panic!("no DIRECT line: {l:#?}"));
            if backend == "host" {
                assert_eq!(direct, 0, "host processes reach no window: {l:#?}");
            }
        }
    }
}

#[test]
fn windows_across_processes_on_the_host_backend() {
    windows_across_processes("host");
}

#[test]
fn windows_across_processes_on_cuda() {
    oxccl::backend::cuda::prefer_process_rank_queues();
    if oxccl::backend::cuda::device_or_skip("windows_across_processes_on_cuda").is_none() {
        return;
    }
    windows_across_processes("cuda");
}

#[test]
fn split_groups_by_color_and_orders_by_key() {
    let lines = run_ranks("split", 4);
    let mut oks = ok_lines(&lines);
    oks.sort();
    assert_eq!(
        oks,
        [
            "OK split parent 0 -> child rank 1 of 2 sum 2",
            "OK split parent 1 -> child rank 0 of 1 sum 1",
            "OK split parent 2 -> child rank 0 of 2 sum 2",
            "OK split parent 3 -> none",
        ]
    );
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn init_from_env_under_each_launcher_convention() {
    let n = 3u32;
    // Open MPI's ranks find the root through NCCL_COMM_ID, torchrun's and
    // Slurm's through MASTER_ADDR and MASTER_PORT (LaunchEnv::to_vars).
    for name in ["torchrun", "openmpi", "slurm"] {
        let port = free_port();
        let (tx, rx) = mpsc::channel();
        let kids: Vec<Child> = (0..n)
            .map(|r| {
                let vars = LaunchEnv {
                    launcher: name,
                    rank: r,
                    nranks: n,
                    local_rank: r,
                    root: format!("127.0.0.1:{port}"),
                }
                .to_vars()
                .unwrap();
                spawn("env", &vars, &tx, r as usize)
            })
            .collect();
        let (codes, lines) = finish(kids, &rx);
        assert!(
            codes.iter().all(|c| *c == Some(0)),
            "{name}: {codes:?}\n{lines:#?}"
        );
        let mut oks = ok_lines(&lines);
        oks.sort();
        let want: Vec<String> = (0..n)
            .map(|r| format!("OK env {name} rank {r} of {n} sum 6"))
            .collect();
        assert_eq!(oks, want, "{lines:#?}");
    }
}

fn oxccl_shm_entries() -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains("oxccl"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_killed_process_fails_the_others_naming_it() {
    killed_process_is_named("host");
}

#[test]
fn a_killed_cuda_process_fails_the_others_naming_it() {
    oxccl::backend::cuda::prefer_process_rank_queues();
    if oxccl::backend::cuda::device_or_skip("a_killed_cuda_process_fails_the_others_naming_it")
        .is_none()
    {
        return;
    }
    killed_process_is_named("cuda");
}

fn killed_process_is_named(backend: &str) {
    killed_process_is_named_with(backend, &[]);
}

fn killed_process_is_named_with(backend: &str, extra: &[(&'static str, &str)]) {
    let n = 4u32;
    let (codes, lines) = kill_one_of(n, 2, backend, extra);
    for r in [0usize, 1, 3] {
        assert_eq!(codes[r], Some(3), "rank {r} should fail: {lines:#?}");
        let errs = tagged(&lines[r], "ERR ");
        let err = errs.first().unwrap_or_else(|| panic!("{lines:#?}"));
        assert!(
            err.contains("rank 2"),
            "rank {r}'s error does not name rank 2: {err}"
        );
    }
    // Segments are unnamed memfds: nothing is left in /dev/shm.
    assert!(oxccl_shm_entries().is_empty(), "{:?}", oxccl_shm_entries());
}

/// `n` ranks loop on AllReduce until rank `victim` is killed: every
/// rank's exit code and lines.
fn kill_one_of(
    n: u32,
    victim: usize,
    backend: &str,
    extra: &[(&'static str, &str)],
) -> (Vec<Option<i32>>, Vec<Vec<String>>) {
    let (kids, rx) = spawn_ranks_live("loop", n, |_| {
        let mut vars = vec![(BACKEND, backend.to_string())];
        vars.extend(owned(extra));
        vars
    });
    kill_once_all_say(kids, &rx, "LOOPING", victim)
}

/// More processes than a Unix datagram queue holds messages
/// (`net.unix.max_dgram_qlen`, 10 by default): every rank sends its
/// segment to every peer before receiving, which used to hang until the
/// deadline past 11 ranks.
#[test]
fn sixteen_processes_initialise_and_reduce() {
    let lines = run_ranks("tiny", 16);
    assert_eq!(ok_lines(&lines).len(), 16, "{lines:#?}");
}

#[test]
fn one_rank_needs_no_root_and_ignores_its_id() {
    let c = Communicator::init_rank(
        &UniqueId::from_raw([0x5a; 128]),
        1,
        0,
        config(Duration::from_secs(10)),
    )
    .unwrap();
    let b = c.alloc::<f32>(8).unwrap();
    b.copy_from_slice(&[2.0; 8]).unwrap();
    c.all_reduce_in_place(&b, RedOp::Sum).unwrap();
    assert_eq!(b.to_vec().unwrap(), vec![2.0; 8]);
    assert!(UniqueId::from_bytes(&[0x5a; 128]).is_err());
    assert!(UniqueId::from_bytes(&[0; 12]).is_err());
    let id = UniqueId::new().unwrap();
    assert_eq!(UniqueId::from_bytes(&id.to_bytes()).unwrap(), id);
    // Rank out of range: refused before any connection.
    assert!(Communicator::init_rank(&id, 2, 2, config(Duration::from_secs(5))).is_err());
}

// ---- the network transport, forced between processes of this host ----

/// NCCL's switches that leave only the network between ranks of one host
/// (`NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1`), over loopback.
const OVER_NET: &[(&str, &str)] = &[
    ("NCCL_P2P_DISABLE", "1"),
    ("NCCL_SHM_DISABLE", "1"),
    ("NCCL_SOCKET_IFNAME", "lo"),
];

#[test]
fn every_collective_over_the_network_transport() {
    for (n, info) in [(2u32, true), (3, false)] {
        let mut extra = OVER_NET.to_vec();
        if info {
            // Connections are the network subsystem's lines.
            extra.push(("NCCL_DEBUG", "INFO"));
            extra.push(("NCCL_DEBUG_SUBSYS", "INIT,NET"));
        }
        let lines = run_ranks_with("all", n, "host", &extra);
        assert_eq!(ok_lines(&lines).len(), n as usize, "{lines:#?}");
        for (r, l) in lines.iter().enumerate() {
            let b = tagged(l, "BACKEND ");
            // With the channels connected (the default four), of the
            // sockets the ranks agreed on (on this host: every rank's
            // default, the same).
            assert!(
                b.iter()
                    .any(|b| b.contains("over NET/Socket/0 (4 channels, ")
                        && b.contains("x2 sockets)")),
                "rank {r}: {b:?}"
            );
            // The hop latency measured at setup, which the selector's model
            // takes: a figure, and every rank's the same.
            let hop = |b: &String| b.split(", one hop ").nth(1).map(str::to_owned);
            let hops: Vec<Option<String>> = lines
                .iter()
                .map(|l| tagged(l, "BACKEND ").first().and_then(hop))
                .collect();
            assert!(
                hops[0].as_ref().is_some_and(|h| h.ends_with(" us")),
                "{hops:?}"
            );
            assert!(hops.iter().all(|h| h == &hops[0]), "{hops:?}");
            // ... and the model takes it: no plan beats one hop.
            let hop_us: f64 = hops[0]
                .as_deref()
                .and_then(|h| h.trim_end_matches(" us").parse().ok())
                .unwrap_or(f64::NAN);
            let predicted: Vec<f64> = tagged(l, "PREDICTED ")
                .iter()
                .filter_map(|p| p.trim_start_matches("PREDICTED ").trim().parse().ok())
                .collect();
            assert!(
                predicted.len() == 1 && predicted[0] >= hop_us - 1.0,
                "rank {r}: predicted {predicted:?} us, one hop {hop_us} us"
            );
            // NCCL_DEBUG=INFO names each connection's transport.
            for p in (0..n as usize).filter(|&p| info && p != r) {
                for want in [
                    format!("Channel 00 : {r} -> {p} [send] via NET/Socket/0"),
                    format!("Channel 01 : {p} -> {r} [receive] via NET/Socket/0"),
                ] {
                    assert!(
                        l.iter().any(|x| x.contains(&want)),
                        "rank {r} never logged {want:?}"
                    );
                }
            }
        }
    }
}

/// CUDA ranks as processes forced onto the network: the staged path
/// (device buffers through host memory) carried by the transport's proxy,
/// whatever MPS says; the backend names the transport.
#[test]
fn every_collective_over_the_network_on_cuda() {
    if oxccl::backend::cuda::device_or_skip("every_collective_over_the_network_on_cuda").is_none() {
        return;
    }
    let lines = run_ranks_with("all", 2, "cuda", OVER_NET);
    assert_eq!(ok_lines(&lines).len(), 2, "{lines:#?}");
    every_rank_any(&lines, "BACKEND ", |b| {
        b.contains("staged") && b.contains("over NET/Socket/0")
    });
    // Asking for the device path as well is a configuration error.
    let (codes, lines) = spawn_ranks("all", 2, |_| {
        let mut v = owned(OVER_NET);
        v.push((BACKEND, "cuda".into()));
        v.push(("OXCCL_CUDA_PROCS", "device".into()));
        v
    });
    assert!(codes.iter().all(|c| *c != Some(0)), "{lines:#?}");
    assert!(
        lines
            .iter()
            .flatten()
            .any(|l| l.contains("OXCCL_CUDA_PROCS")),
        "{lines:#?}"
    );
}

/// CUDA ranks as processes on the staged path (as without MPS) capture
/// calls into a CUDA graph and replay it with new inputs: each captured
/// call is copies and a host node that runs the plan at every replay.
/// (The device path's kernels capture as threads' do; nccl-tests `-G`
/// under MPS runs them.)
#[test]
fn a_graph_captured_across_processes_replays_right_on_cuda() {
    oxccl::backend::cuda::prefer_process_rank_queues();
    let test = "a_graph_captured_across_processes_replays_right_on_cuda";
    if oxccl::backend::cuda::device_or_skip(test).is_none() {
        return;
    }
    let lines = run_ranks_with("graph", 2, "cuda", &[("OXCCL_CUDA_PROCS", "staged")]);
    assert_eq!(ok_lines(&lines).len(), 2, "{lines:#?}");
    every_rank_any(&lines, "BACKEND ", |b| b.contains("staged"));
}

/// Four processes standing for two hosts (`NCCL_HOSTID`, ranks 0 and 2
/// on `a`, 1 and 3 on `b`): they talk over the network without being
/// forced, plans follow the hosts (rings cross each boundary once per
/// channel, the double binary tree across hosts with chains inside), and
/// every collective is right, with the trees forced for AllReduce too.
#[test]
fn ranks_on_two_hosts_plan_by_host() {
    for algo in ["", "allreduce:tree"] {
        let (codes, lines) = spawn_ranks("all", 4, |r| {
            let mut v = owned(&[("NCCL_SOCKET_IFNAME", "lo"), ("NCCL_DEBUG", "INFO")]);
            v.push(("NCCL_HOSTID", if r % 2 == 0 { "a" } else { "b" }.into()));
            v.push(("NCCL_ALGO", algo.into()));
            v.push((BACKEND, "host".into()));
            v
        });
        assert!(
            codes.iter().all(|c| *c == Some(0)),
            "NCCL_ALGO={algo:?}: exit codes {codes:?}\n{lines:#?}"
        );
        assert_eq!(ok_lines(&lines).len(), 4, "{lines:#?}");
        every_rank_any(&lines, "BACKEND ", |b| b.contains("over NET/Socket/0"));
        // The rings: each host's ranks together.
        every_rank_any(&lines, "Ring 00 :", |x| x.contains("0 2 1 3"));
    }
}

#[test]
fn a_send_right_before_exit_is_delivered_over_the_network() {
    // Rank 0's Send completes once its data is in the FIFO; its process
    // then drops the communicator and exits at once. The proxy must still
    // send what is in the FIFO before closing the connections.
    let lines = run_ranks_with("send_exit", 2, "host", OVER_NET);
    assert_eq!(ok_lines(&lines).len(), 2, "{lines:#?}");
}

#[test]
fn a_killed_process_over_the_network_is_named() {
    killed_process_is_named_with("host", OVER_NET);
}

/// Rank 1 of 3 is killed over TCP: both survivors name rank 1 as the
/// lost peer (the error's first peer), rank 2 because it waited on it,
/// rank 0 (which waits on rank 2 in the ring) through rank 2's forwarded
/// reason and its own closed connection from rank 1, not rank 2.
#[test]
fn the_killed_rank_is_the_one_named_over_the_network() {
    let (codes, lines) = kill_one_of(3, 1, "host", OVER_NET);
    for r in [0usize, 2] {
        assert_eq!(codes[r], Some(3), "rank {r} should fail: {lines:#?}");
        let errs = tagged(&lines[r], "ERR ");
        let err = errs.first().unwrap_or_else(|| panic!("{lines:#?}"));
        eprintln!("rank {r}: {err}");
        let first = err.find("peer rank ").map(|at| &err[at..]);
        assert!(
            first.is_some_and(|f| f.starts_with("peer rank 1 is lost")),
            "rank {r}'s error does not name rank 1 as the lost peer: {err}"
        );
    }
}

#[test]
fn a_dropped_connection_fails_the_peer_naming_it() {
    // Rank 1 aborts its communicator mid-loop (its connections close, its
    // process lives on); rank 0's deadline is far away, so only the
    // closed connection can end its call.
    let (codes, lines) = spawn_ranks("abort", 2, |_| owned(OVER_NET));
    assert_eq!(codes[0], Some(3), "{lines:#?}");
    let err = tagged(&lines[0], "ERR ");
    let err = err.first().unwrap_or_else(|| panic!("{lines:#?}"));
    assert!(
        err.contains("peer rank 1 is lost") && err.contains("aborted"),
        "rank 0's error does not name rank 1's abort: {err}"
    );
    assert_eq!(codes[1], Some(0), "{lines:#?}");
}

#[test]
fn ranks_must_agree_on_the_network() {
    // Rank 0 alone is forced onto the network.
    let (_, lines) = spawn_ranks(
        "init",
        2,
        |r| {
            if r == 0 {
                owned(OVER_NET)
            } else {
                Vec::new()
            }
        },
    );
    every_rank_first(&lines, "ERR ", |e| e.contains("NCCL_SHM_DISABLE"));
}

/// Each connection's sockets: a count set on one rank (here
/// `NCCL_SOCKET_NTHREADS=3` on rank 0 only) is every rank's, the other
/// count each host's default; set on two ranks differently, init fails on
/// both, naming the variable and the ranks.
#[test]
fn ranks_agree_on_the_sockets_and_a_set_count_wins() {
    let (codes, lines) = spawn_ranks("init", 2, |r| {
        let mut v = owned(OVER_NET);
        if r == 0 {
            v.push(("NCCL_SOCKET_NTHREADS", "3".into()));
        }
        v
    });
    assert_eq!(codes, vec![Some(0); 2], "{lines:#?}");
    every_rank_first(&lines, "OK init ", |b| b.contains("3x2 sockets"));
    let (_, lines) = spawn_ranks("init", 2, |r| {
        let mut v = owned(OVER_NET);
        v.push(if r == 0 {
            ("NCCL_SOCKET_NTHREADS", "3".into())
        } else {
            ("OXCCL_SOCKET_NTHREADS", "2".into())
        });
        v
    });
    every_rank_first(&lines, "ERR ", |e| {
        e.contains("NCCL_SOCKET_NTHREADS") && e.contains("rank 1 sets 2 but rank 0 sets 3")
    });
}

/// Two network namespaces joined by a veth pair, removed on drop.
struct Netns {
    names: [String; 2],
}

impl Netns {
    const ADDRS: [&str; 2] = ["10.231.7.1", "10.231.7.2"];

    fn ip(args: &[&str]) -> Result<(), String> {
        let out = Command::new("ip")
            .args(args)
            .output()
            .map_err(|e| format!("ip: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// The namespaces, or why this machine cannot make them.
    fn setup() -> Result<Netns, String> {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let euid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|u| u.split_whitespace().nth(1));
        if euid != Some("0") {
            return Err("not root: network namespaces need CAP_SYS_ADMIN".into());
        }
        let tag = std::process::id() % 100_000;
        let ns = Netns {
            names: [format!("oxccl-a-{tag}"), format!("oxccl-b-{tag}")],
        };
        let veth = [format!("oxa{tag}"), format!("oxb{tag}")];
        Netns::ip(&["netns", "add", &ns.names[0]])?;
        Netns::ip(&["netns", "add", &ns.names[1]])?;
        Netns::ip(&[
            "link",
            "add",
            &veth[0],
            "netns",
            &ns.names[0],
            "type",
            "veth",
            "peer",
            "name",
            &veth[1],
            "netns",
            &ns.names[1],
        ])?;
        for ((name, dev), addr) in ns.names.iter().zip(&veth).zip(Netns::ADDRS) {
            let cidr = format!("{addr}/24");
            Netns::ip(&["-n", name, "addr", "add", &cidr, "dev", dev])?;
            Netns::ip(&["-n", name, "link", "set", dev, "up"])?;
            Netns::ip(&["-n", name, "link", "set", "lo", "up"])?;
        }
        Ok(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Netns::ip(&["netns", "del", n]);
        }
    }
}

#[test]
fn ranks_in_two_network_namespaces_over_a_veth_pair() {
    let ns = match Netns::setup() {
        Ok(ns) => ns,
        Err(why) => {
            println!("skipped: no network namespaces here ({why})");
            return;
        }
    };
    // Each rank in its own namespace: the only way between them is the
    // veth pair, through both network stacks. One host identity, so the
    // switches force the network (shared memory would work too).
    let port = 29_000 + (std::process::id() % 1000) as u16;
    let (tx, rx) = mpsc::channel();
    let n = 2u32;
    let kids: Vec<Child> = (0..n)
        .map(|r| {
            let vars = vec![
                ("RANK", r.to_string()),
                ("WORLD_SIZE", n.to_string()),
                ("NCCL_COMM_ID", format!("{}:{port}", Netns::ADDRS[0])),
                ("NCCL_SOCKET_IFNAME", "oxa,oxb".into()),
                ("NCCL_P2P_DISABLE", "1".into()),
                ("NCCL_SHM_DISABLE", "1".into()),
                ("NCCL_DEBUG", "INFO".into()),
                ("NCCL_DEBUG_SUBSYS", "INIT,NET".into()),
            ];
            let netns = ns.names[r as usize].clone();
            spawn_via(
                &["ip", "netns", "exec", &netns],
                "ns",
                &vars,
                &tx,
                r as usize,
            )
        })
        .collect();
    let (codes, lines) = finish(kids, &rx);
    assert!(codes.iter().all(|c| *c == Some(0)), "{codes:?}\n{lines:#?}");
    for (r, l) in lines.iter().enumerate() {
        let ok = tagged(l, "OK ns ");
        assert!(
            ok.first()
                .is_some_and(|o| o.contains("over NET/Socket/0") && o.contains("0 wrong")),
            "rank {r}: {l:#?}"
        );
        let peer = Netns::ADDRS[1 - r];
        assert!(
            l.iter().any(|x| x.contains("[send] via NET/Socket/0")),
            "rank {r} logged no network connection: {l:#?}"
        );
        assert!(
            tagged(l, "PEER ").iter().any(|x| x.contains(peer)),
            "rank {r} did not see its peer at {peer}: {l:#?}"
        );
    }
}

// ---- network plugins of our own (oxccl-net's tests/plugins/ours.c) ----

/// Our test plugin built with `defines` (once per test process), its path.
fn our_plugin(name: &str, defines: &[&str]) -> String {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("mp-net-plugins");
    let p = plugins::build(&dir, name, defines);
    p.to_str().expect("a UTF-8 path").to_string()
}

/// [`OVER_NET`] with `NCCL_NET_PLUGIN=plugin` and `NCCL_DEBUG=INFO` for
/// the init and network subsystems (where plugin and connection lines go).
fn over_plugin(plugin: &str) -> Vec<(&'static str, String)> {
    let mut v = owned(OVER_NET);
    v.push(("NCCL_NET_PLUGIN", plugin.to_string()));
    v.push(("NCCL_DEBUG", "INFO".to_string()));
    v.push(("NCCL_DEBUG_SUBSYS", "INIT,NET".to_string()));
    v
}

/// Runs role `all` (every collective, then Send/Recv) on `n` processes
/// over `plugin`; every rank's lines, once each said OK.
fn all_over_plugin(n: u32, plugin: &str, more: &[(&'static str, &str)]) -> Vec<Vec<String>> {
    let (codes, lines) = spawn_ranks("all", n, |_| {
        let mut v = over_plugin(plugin);
        v.extend(owned(more));
        v
    });
    assert!(
        codes.iter().all(|c| *c == Some(0)),
        "exit codes {codes:?}\n{lines:#?}"
    );
    assert_eq!(ok_lines(&lines).len(), n as usize, "{lines:#?}");
    lines
}

#[test]
fn every_collective_over_our_plugin_in_each_version() {
    // Each table version's entry points carry a whole run; three ranks
    // once (every rank both connects and accepts several peers).
    // v9's device states a latency of 5 ms, far above a loopback hop: the
    // cost model prices what the device states.
    for (v, n) in [(8u32, 2u32), (9, 2), (10, 3), (11, 2), (12, 2)] {
        let ver = format!("NET_VERSION={v}");
        let p = if v == 9 {
            our_plugin("v9-slow", &[&ver, "LATENCY_US=5000"])
        } else {
            our_plugin(&format!("v{v}"), &[&ver])
        };
        let lines = all_over_plugin(n, &p, &[]);
        for (r, l) in lines.iter().enumerate() {
            let b = tagged(l, "BACKEND ");
            assert!(
                b.iter().any(|b| b.contains("over NET/ours/0 (4 channels)")),
                "v{v} rank {r}: {b:?}"
            );
            // v9's stated 5 ms is a floor under the measured hop. Other
            // versions state 3.5 us, and their measured hop (a loaded
            // machine has stretched a loopback hop past 5 ms) says nothing
            // about the floor: their stated latency is checked on the NIC
            // line below.
            let hop = priced_hop_us(&b);
            assert!(hop.is_some(), "v{v} rank {r} priced no hop: {b:?}");
            if v == 9 {
                assert!(hop.is_some_and(|h| h >= 5000.0), "v9 rank {r}: {b:?}");
            }
            // NCCL_DEBUG=INFO names the plugin, its version, and each
            // connection's network.
            let has = |want: &str| l.iter().any(|x| x.contains(want));
            assert!(
                has(&format!("ncclNetPlugin_v{v} of v8 to v12")),
                "v{v} rank {r}: {l:#?}"
            );
            assert!(
                has("NET/Plugin: ours: plugin init"),
                "v{v} rank {r}: {l:#?}"
            );
            // The plugin's device is a NIC of the topology (no PCI path:
            // under the CPU), with the speed and latency it states.
            let lat = if v == 9 { "5000" } else { "3.5" };
            let nic = format!(
                "Topology NET/0 : NIC0 ours0 (pci none under CPU0): 3.1 GB/s, latency {lat} us"
            );
            assert!(has(&nic), "v{v} rank {r} never logged {nic:?}: {l:#?}");
            for p in (0..n as usize).filter(|&p| p != r) {
                let want =
                    format!("Channel 00 : {r} -> {p} [send] via NET/ours/0 (plugin ours from ");
                assert!(has(&want), "v{v} rank {r} never logged {want:?}");
            }
        }
    }
}

#[test]
fn ranks_whose_devices_state_different_latencies_price_the_largest() {
    // Rank 1's device states 5 ms, rank 0's 3.5 µs: both ranks' models
    // must take the same hop (the largest), or their selectors could pick
    // different plans for one call.
    let fast = our_plugin("v10", &["NET_VERSION=10"]);
    let slow = our_plugin("v10-slow", &["NET_VERSION=10", "LATENCY_US=5000"]);
    let (codes, lines) = spawn_ranks("all", 2, |r| {
        let mut v = over_plugin(if r == 0 { &fast } else { &slow });
        v.push(("OXCCL_CHECK_CALLS", "all".into()));
        v
    });
    assert!(codes.iter().all(|c| *c == Some(0)), "{codes:?}\n{lines:#?}");
    assert_eq!(ok_lines(&lines).len(), 2, "{lines:#?}");
    let hops: Vec<Option<f64>> = lines
        .iter()
        .map(|l| priced_hop_us(&tagged(l, "BACKEND ")))
        .collect();
    assert!(
        hops.iter().all(|h| h.is_some_and(|h| h >= 5000.0)) && hops[0] == hops[1],
        "the ranks priced other hops: {hops:?}"
    );
}

/// The hop (µs) a rank's backend line says the model prices (at least the
/// largest stated latency; more where the measured hop is longer).
fn priced_hop_us(backend: &[String]) -> Option<f64> {
    backend.iter().find_map(|b| {
        let rest = &b[b.find(", one hop ")? + ", one hop ".len()..];
        rest.split_whitespace().next()?.parse().ok()
    })
}

#[test]
fn libnccl_net_so_on_the_loader_path_is_used_when_no_plugin_is_named() {
    // NCCL_NET_PLUGIN unset: NCCL's default library name, found through
    // LD_LIBRARY_PATH.
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("mp-default-plugin");
    plugins::build_as(&dir, "libnccl-net.so", &["NET_VERSION=9"]);
    let dir = dir.to_str().expect("a UTF-8 path").to_string();
    let (codes, lines) = spawn_ranks("tiny", 2, |_| {
        let mut v = owned(OVER_NET);
        v.push(("LD_LIBRARY_PATH", dir.clone()));
        v.push(("NCCL_DEBUG", "INFO".into()));
        v.push(("NCCL_DEBUG_SUBSYS", "INIT,NET".into()));
        v
    });
    assert!(codes.iter().all(|c| *c == Some(0)), "{codes:?} {lines:#?}");
    for (r, l) in lines.iter().enumerate() {
        assert!(
            l.iter().any(|x| x.contains("[send] via NET/ours/0")),
            "rank {r} did not take libnccl-net.so: {l:#?}"
        );
    }
}

#[test]
fn nccl_net_socket_keeps_the_built_in_transport_beside_a_plugin() {
    let p = our_plugin("v10", &["NET_VERSION=10"]);
    let lines = all_over_plugin(2, &p, &[("NCCL_NET", "Socket")]);
    for l in &lines {
        let b = tagged(l, "BACKEND ");
        assert!(b.iter().any(|b| b.contains("over NET/Socket/0")), "{b:?}");
    }
}

#[test]
fn a_plugin_that_fails_init_or_has_no_known_version_is_named_and_tcp_carries_the_run() {
    for (name, defines, why) in [
        (
            "failinit",
            &["NET_VERSION=9", "FAIL_INIT"][..],
            "init failed: ncclSystemError",
        ),
        (
            "v99",
            &["ONLY_V99"][..],
            "exports none of ncclNetPlugin_v12 to ncclNetPlugin_v8",
        ),
    ] {
        let p = our_plugin(name, defines);
        let lines = all_over_plugin(2, &p, &[]);
        for (r, l) in lines.iter().enumerate() {
            let b = tagged(l, "BACKEND ");
            assert!(
                b.iter().any(|b| b.contains("over NET/Socket/0")),
                "{name} rank {r}: {b:?}"
            );
            assert!(
                l.iter()
                    .any(|x| x.contains("WARN") && x.contains(&p) && x.contains(why)),
                "{name} rank {r}: no WARN naming the plugin and {why:?}: {l:#?}"
            );
        }
    }
}

#[test]
fn ranks_on_different_networks_fail_init_naming_both() {
    let p = our_plugin("v11", &["NET_VERSION=11"]);
    let (_, lines) = spawn_ranks("init", 2, |r| over_plugin(if r == 0 { &p } else { "none" }));
    for (r, l) in lines.iter().enumerate() {
        let err = tagged(l, "ERR ");
        assert!(
            err.iter()
                .any(|e| e.contains("network ours") && e.contains("network Socket")),
            "rank {r}'s init error does not name both networks: {l:#?}"
        );
    }
}

#[test]
fn a_connection_the_plugin_drops_fails_the_ranks_naming_the_plugin() {
    // Rank 0's plugin shuts each send connection after 200 kB; rank 1's
    // is the same protocol without the drop. Their deadline is far away:
    // only the dropped connection can end the loop.
    let drop = our_plugin("drop", &["NET_VERSION=10", "DROP_AFTER=200000"]);
    let good = our_plugin("v10", &["NET_VERSION=10"]);
    let (codes, lines) = spawn_ranks("abort", 2, |r| {
        let mut v = over_plugin(if r == 0 { &drop } else { &good });
        v.push(("NCCL_NET", "ours".into()));
        v
    });
    assert_eq!(codes[0], Some(3), "{lines:#?}");
    let err = tagged(&lines[0], "ERR ");
    let err = err.first().unwrap_or_else(|| panic!("{lines:#?}"));
    assert!(
        err.contains("peer rank 1 is lost") || err.contains("rank 1 failed"),
        "rank 0's error does not name its peer: {err}"
    );
    assert!(
        err.contains("net plugin ours") && err.contains("v10"),
        "rank 0's error does not name the plugin: {err}"
    );
    assert!(
        lines[0]
            .iter()
            .any(|x| x.contains("ours: dropping the connection")),
        "the plugin's own WARN is missing: {:#?}",
        lines[0]
    );
}

// ---- the children ----

fn child_comm(deadline: Duration) -> Communicator {
    let id = UniqueId::from_bytes(&unhex(&std::env::var("OXCCL_MP_ID").unwrap())).unwrap();
    Communicator::init_rank(
        &id,
        env_u32("OXCCL_MP_N"),
        env_u32("OXCCL_MP_RANK"),
        config(deadline),
    )
    .unwrap()
}

/// One collective on this rank; the number of wrong elements of its output.
fn check_one<T: Element>(
    c: &Communicator,
    kind: CollKind,
    count: usize,
    op: RedOp,
    in_place: bool,
    registered: bool,
) -> (u64, Option<String>) {
    let n = c.nranks();
    let me = c.rank();
    let root = if kind.has_root() { n - 1 } else { 0 };
    let coll = Collective::new(kind, count, root);
    let inputs: Vec<Vec<T>> = (0..n)
        .map(|r| testkit::input::<T>(&coll, n, r, op, 11))
        .collect();
    let (ilen, olen) = (coll.input_len(n), coll.output_len(n));
    let out: Vec<T> = if registered {
        let (in_off, out_off) = if in_place {
            coll.in_place_offsets(me)
        } else {
            (0, 0)
        };
        let buf = c
            .alloc::<T>(if in_place { ilen.max(olen) } else { ilen })
            .unwrap();
        buf.slice(in_off..in_off + ilen)
            .copy_from_slice(&inputs[me as usize])
            .unwrap();
        let other = c.alloc::<T>(olen).unwrap();
        let recv = if in_place {
            buf.slice(out_off..out_off + olen)
        } else {
            other.slice(..)
        };
        c.collective(kind, buf.slice(in_off..in_off + ilen), recv, op, root)
            .unwrap();
        recv.to_vec().unwrap()
    } else {
        let mut out = vec![T::default(); olen];
        c.collective(kind, &inputs[me as usize][..], &mut out[..], op, root)
            .unwrap();
        out
    };
    // Each process checks its own output.
    let outputs = testkit::own_outputs(&coll, &inputs, me, out, op);
    testkit::compare(&coll, &inputs, &outputs, op)
}

fn child_all() {
    let c = child_comm(Duration::from_secs(60));
    println!("BACKEND {}", c.describe_backend());
    let on_device = c.backend() == BackendKind::Cuda;
    let (mut cases, mut wrong, mut first) = (0usize, 0u64, None);
    let mut direct = 0usize;
    for kind in testkit::COLLECTIVES {
        let ops: &[RedOp] = if kind.is_reduction() {
            &[RedOp::Sum, RedOp::Max, RedOp::Avg]
        } else {
            &[RedOp::Sum]
        };
        for dt in [DataType::F32, DataType::I32, DataType::Bf16] {
            for &op in ops.iter().filter(|o| o.undefined_reason(dt).is_none()) {
                for (count, in_place, registered) in [
                    (1000, false, true),
                    (1000, true, true),
                    (1000, false, false),
                    (3, false, true),
                    (150_000, false, true),
                    (150_000, true, false),
                ]
                .into_iter()
                // Device ranks take device buffers only.
                .filter(|c| c.2 || !on_device)
                {
                    let (w, f) = with_dtype!(dt, T => check_one::<T>(&c, kind, count, op, in_place, registered));
                    cases += 1;
                    direct += usize::from(c.last_choice().is_some_and(|ch| ch.is_direct()));
                    wrong += w;
                    if w > 0 && first.is_none() {
                        first = Some(format!("{kind} {dt} {op} count {count} in_place={in_place} registered={registered}: {}", f.unwrap_or_default()));
                    }
                }
            }
        }
    }
    println!("DIRECT {direct} calls");
    // Send/Recv: even ranks send to the next odd one (host slices).
    let me = c.rank();
    if on_device {
        finish_child(me, cases, wrong, first);
        return;
    }
    // What the selector's model predicts for an 8-byte AllReduce: over the
    // network at least one hop (measured at setup), whatever the plan.
    let mut tiny = [0.0f32; 2];
    c.all_reduce(&[1.0f32, 2.0][..], &mut tiny[..], RedOp::Sum)
        .unwrap();
    if let Some(us) = c.last_choice().and_then(|ch| ch.predicted_us) {
        println!("PREDICTED {us}");
    }
    let data: Vec<f64> = (0..5000)
        .map(|i| f64::from(me) * 1e4 + f64::from(i))
        .collect();
    if me.is_multiple_of(2) && me + 1 < c.nranks() {
        c.send(&data[..], me + 1).unwrap();
    } else if me % 2 == 1 {
        let mut got = vec![0.0f64; 5000];
        c.recv(&mut got[..], me - 1).unwrap();
        let want: Vec<f64> = (0..5000)
            .map(|i| f64::from(me - 1) * 1e4 + f64::from(i))
            .collect();
        if got != want {
            wrong += 1;
            first.get_or_insert_with(|| "send/recv delivered the wrong data".into());
        }
    }
    cases += 1;
    finish_child(me, cases, wrong, first);
}

/// A CUDA driver call of the external-memory child, which must succeed.
fn cu(what: &str, r: cudarc::driver::sys::CUresult) {
    assert_eq!(r, cudarc::driver::sys::CUresult::CUDA_SUCCESS, "{what}");
}

/// Copies `data` to the device memory at `p` (a synchronous copy).
///
/// # Safety
/// `p` holds at least `data.len()` f32s of the current context's memory.
unsafe fn to_device(p: u64, data: &[f32]) {
    // SAFETY: caller's contract.
    let r =
        unsafe { cudarc::driver::sys::cuMemcpyHtoD_v2(p, data.as_ptr().cast(), data.len() * 4) };
    cu("cuMemcpyHtoD", r);
}

/// `len` f32s read from the device memory at `p` (a synchronous copy).
///
/// # Safety
/// `p` holds at least `len` f32s and no call in flight writes them.
unsafe fn from_device(p: u64, len: usize) -> Vec<f32> {
    let mut out = vec![0f32; len];
    // SAFETY: caller's contract; `out` holds `len` f32s.
    let r = unsafe { cudarc::driver::sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), p, len * 4) };
    cu("cuMemcpyDtoH", r);
    out
}

/// Captures `f`'s work on `raw` into a graph (global mode, as
/// `torch.cuda.graph` and nccl-tests do) and instantiates it.
///
/// # Safety
/// `raw` is a live, idle stream of the current context.
unsafe fn capture_on(
    raw: cudarc::driver::sys::CUstream,
    f: impl FnOnce(),
) -> (
    cudarc::driver::sys::CUgraph,
    cudarc::driver::sys::CUgraphExec,
) {
    use cudarc::driver::sys;
    let (mut graph, mut exec) = (std::ptr::null_mut(), std::ptr::null_mut());
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
    // SAFETY: caller's contract.
    unsafe {
        cu("cuStreamSynchronize", sys::cuStreamSynchronize(raw));
        cu(
            "cuStreamBeginCapture",
            sys::cuStreamBeginCapture_v2(raw, mode),
        );
    }
    f();
    // SAFETY: the capture begun above; `graph` is then a captured graph.
    unsafe {
        cu(
            "cuStreamEndCapture",
            sys::cuStreamEndCapture(raw, &mut graph),
        );
        cu(
            "cuGraphInstantiate",
            sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0),
        );
    }
    (graph, exec)
}

/// How many host nodes `graph` holds.
///
/// # Safety
/// `graph` is a live graph.
unsafe fn host_nodes(graph: cudarc::driver::sys::CUgraph) -> usize {
    use cudarc::driver::sys;
    let mut n = 0usize;
    // SAFETY: caller's contract; a null array asks for the count.
    unsafe {
        cu(
            "cuGraphGetNodes",
            sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n),
        )
    };
    let mut nodes = vec![std::ptr::null_mut(); n];
    // SAFETY: `nodes` holds `n` entries.
    unsafe {
        cu(
            "cuGraphGetNodes",
            sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n),
        )
    };
    nodes
        .iter()
        .filter(|&&nd| {
            let mut t = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
            // SAFETY: a node of `graph`.
            unsafe { cu("cuGraphNodeGetType", sys::cuGraphNodeGetType(nd, &mut t)) };
            t == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_HOST
        })
        .count()
}

/// Memory of one window of [`child_windows`]: `ncclMemAlloc`'s on CUDA
/// (the current context is the rank's: `barrier` bound it), host memory
/// otherwise.
enum WinMem {
    Device(oxccl::backend::cuda::SymMem),
    Host(Vec<u64>),
}

impl WinMem {
    fn new(cuda: bool, bytes: usize) -> WinMem {
        if cuda {
            WinMem::Device(oxccl::backend::cuda::alloc_symmetric(bytes).unwrap())
        } else {
            WinMem::Host(vec![0u64; bytes.div_ceil(8) + 512])
        }
    }

    /// The start: 4096-aligned (a symmetric window's alignment).
    fn ptr(&mut self) -> u64 {
        match self {
            WinMem::Device(m) => m.ptr,
            WinMem::Host(v) => (v.as_mut_ptr() as u64).next_multiple_of(4096),
        }
    }

    fn put(&mut self, data: &[f32]) {
        let p = self.ptr();
        match self {
            // SAFETY: the allocation holds `data`.
            WinMem::Device(_) => unsafe { to_device(p, data) },
            // SAFETY: the vector holds 4096 spare bytes past `data`'s room.
            WinMem::Host(_) => unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr(), p as *mut f32, data.len())
            },
        }
    }

    fn get(&mut self, len: usize) -> Vec<f32> {
        let p = self.ptr();
        match self {
            // SAFETY: as in `put`; the calls on it completed (a barrier
            // after a synchronising copy on the legacy stream).
            WinMem::Device(_) => unsafe { from_device(p, len) },
            WinMem::Host(_) => {
                let mut out = vec![0f32; len];
                // SAFETY: as in `put`.
                unsafe { std::ptr::copy_nonoverlapping(p as *const f32, out.as_mut_ptr(), len) };
                out
            }
        }
    }

    fn free(self) {
        if let WinMem::Device(m) = self {
            // SAFETY: every call on it completed (the barrier before).
            unsafe { oxccl::backend::cuda::free_symmetric(m) }.unwrap();
        }
    }
}

/// AllReduce, AllGather and an AllReduce scaled by a PreMulSum scalar in
/// device memory captured into a CUDA graph on the rank's own stream and
/// replayed with new inputs and scalars each time (see
/// `a_graph_captured_across_processes_replays_right_on_cuda`).
fn child_graph() {
    use cudarc::driver::sys;
    use oxccl::RawStream;
    let c = child_comm(Duration::from_secs(60));
    println!("BACKEND {}", c.describe_backend());
    let (n, me) = (c.nranks(), c.rank());
    // Binds the device's context to this thread for the driver calls below.
    c.barrier().unwrap();
    let (mut cases, mut wrong, mut first) = (0usize, 0u64, None);
    let count = 1000usize;
    let (mut send, mut sum, mut all, mut scaled, mut scalar) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut raw = std::ptr::null_mut();
    // SAFETY: plain allocations and a stream, kept to the end.
    unsafe {
        cu("cuMemAlloc", sys::cuMemAlloc_v2(&mut send, count * 4));
        cu("cuMemAlloc", sys::cuMemAlloc_v2(&mut sum, count * 4));
        cu("cuMemAlloc", sys::cuMemAlloc_v2(&mut scaled, count * 4));
        cu("cuMemAlloc", sys::cuMemAlloc_v2(&mut scalar, 4));
        cu(
            "cuMemAlloc",
            sys::cuMemAlloc_v2(&mut all, count * 4 * n as usize),
        );
        cu("cuStreamCreate", sys::cuStreamCreate(&mut raw, 1));
    }
    let stream = RawStream(raw as u64);
    let calls = || {
        let ar = common::raw::f32_call(CollKind::AllReduce, send, sum, count, RedOp::Sum, 0);
        let ag = common::raw::f32_call(CollKind::AllGather, sum, all, count, RedOp::Sum, 0);
        let op = RedOp::PreMulSumDevice(scalar);
        let pm = common::raw::f32_call(CollKind::AllReduce, send, scaled, count, op, 0);
        // SAFETY: the buffers and the scalar live to the end; `stream` is
        // this rank's.
        unsafe {
            c.collective_raw(ar, stream)
                .and_then(|_| c.collective_raw(ag, stream))
                .and_then(|_| c.collective_raw(pm, stream))
        }
    };
    let input = |k: u32, r: u32| -> Vec<f32> {
        (0..count)
            .map(|i| (i % 13) as f32 + (k * 10 + r) as f32)
            .collect()
    };
    let factor = |k: u32, r: u32| (k + 1 + r) as f32;
    // Warm-up outside the capture (plans made), then the capture.
    // SAFETY: `send` holds `count` f32s, `scalar` one.
    unsafe {
        to_device(send, &input(0, me));
        to_device(scalar, &[factor(0, me)]);
    }
    // The legacy stream's copies land before the warm-up on `stream`.
    // SAFETY: no argument.
    cu("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() });
    calls().unwrap();
    // SAFETY: `raw` is this rank's live stream, idle.
    let (graph, exec) = unsafe { capture_on(raw, || calls().unwrap()) };
    // The calls were captured, not run at capture time: the graph holds
    // the staged path's host nodes (one per call).
    // SAFETY: `graph` was just captured.
    let hosts = unsafe { host_nodes(graph) };
    println!("NODES rank {me}: {hosts} host nodes");
    if c.describe_backend().contains("staged") && hosts != 3 {
        wrong += 1;
        first = Some(format!("{hosts} host nodes captured for 3 staged calls"));
    }
    for k in 1..4u32 {
        // Uploaded on the graph's own stream: a synchronous copy from
        // pageable memory on the legacy stream may still be landing when
        // the replay on this non-blocking stream reads `send` (a first
        // version of this test read each replay's previous input so).
        let (data, f) = (input(k, me), [factor(k, me)]);
        // SAFETY: `send` holds `count` f32s, `scalar` one; `data` and `f`
        // outlive the copies (the stream is drained below); a live
        // executable graph and stream.
        unsafe {
            cu(
                "cuMemcpyHtoDAsync",
                sys::cuMemcpyHtoDAsync_v2(send, data.as_ptr().cast(), count * 4, raw),
            );
            cu(
                "cuMemcpyHtoDAsync",
                sys::cuMemcpyHtoDAsync_v2(scalar, f.as_ptr().cast(), 4, raw),
            );
            cu("cuGraphLaunch", sys::cuGraphLaunch(exec, raw));
            cu("cuStreamSynchronize", sys::cuStreamSynchronize(raw));
        }
        let want: Vec<f32> = (0..count)
            .map(|i| (0..n).map(|r| input(k, r)[i]).sum())
            .collect();
        // SAFETY: the replay completed.
        let (got, gathered) = unsafe {
            (
                from_device(sum, count),
                from_device(all, count * n as usize),
            )
        };
        // Small integers: exact in f32 in any order of summation.
        let want_scaled: Vec<f32> = (0..count)
            .map(|i| (0..n).map(|r| factor(k, r) * input(k, r)[i]).sum())
            .collect();
        // SAFETY: the replay completed.
        let got_scaled = unsafe { from_device(scaled, count) };
        let gathered_ok = gathered.chunks(count).all(|ch| ch == want.as_slice());
        let head = |v: &[f32]| format!("{:?}..", &v[..3]);
        let checks = [
            ("AllReduce", got == want, head(&got), head(&want)),
            (
                "AllGather of the sums",
                gathered_ok,
                head(&gathered),
                head(&want),
            ),
            (
                "PreMulSum (device scalar)",
                got_scaled == want_scaled,
                head(&got_scaled),
                head(&want_scaled),
            ),
        ];
        for (what, ok, saw, expected) in checks {
            cases += 1;
            if !ok {
                wrong += 1;
                first.get_or_insert_with(|| format!("replay {k}: {what} {saw} want {expected}"));
            }
        }
    }
    c.barrier().unwrap();
    // SAFETY: every replay completed; nothing uses them any more.
    unsafe {
        cu("cuGraphExecDestroy", sys::cuGraphExecDestroy(exec));
        cu("cuGraphDestroy", sys::cuGraphDestroy(graph));
        cu("cuStreamDestroy", sys::cuStreamDestroy_v2(raw));
    }
    finish_child(me, cases, wrong, first);
}

/// Collectives on windows registered by every rank (see
/// `windows_across_processes`).
fn child_windows() {
    use oxccl::RawStream;
    let c = child_comm(Duration::from_secs(60));
    println!("BACKEND {}", c.describe_backend());
    let cuda = c.backend() == BackendKind::Cuda;
    let (n, me) = (c.nranks(), c.rank());
    // Binds the device's context to this thread for the driver calls below.
    c.barrier().unwrap();
    let (mut cases, mut wrong, mut first, mut direct) = (0usize, 0u64, None, 0usize);
    for kind in [
        CollKind::AllReduce,
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::Broadcast,
    ] {
        for count in [1000usize, 1 << 20] {
            let root = if kind.has_root() { n - 1 } else { 0 };
            let coll = Collective::new(kind, count, root);
            let op = RedOp::Sum;
            let inputs: Vec<Vec<f32>> = (0..n)
                .map(|r| testkit::input::<f32>(&coll, n, r, op, 3))
                .collect();
            let (lin, lout) = (coll.input_len(n), coll.output_len(n));
            let (mut a, mut b) = (WinMem::new(cuda, lin * 4), WinMem::new(cuda, lout * 4));
            a.put(&inputs[me as usize]);
            b.put(&vec![-3.0; lout]);
            let (send, recv) = (a.ptr(), b.ptr());
            // SAFETY: both allocations outlive every call on them (freed
            // after the barrier below).
            let wins = unsafe {
                [
                    c.window_register(send as *const _, lin * 4, oxccl::WIN_COLL_SYMMETRIC)
                        .unwrap(),
                    c.window_register(recv as *const _, lout * 4, oxccl::WIN_COLL_SYMMETRIC)
                        .unwrap(),
                ]
            };
            assert_eq!(wins[0].addr(), send);
            assert_eq!(wins[1].user_ptr() as u64, recv);
            let call = common::raw::f32_call(kind, send, recv, count, op, root);
            // SAFETY: both buffers live until after the barrier below;
            // stream 0 is the legacy default stream.
            unsafe { c.collective_raw(call, RawStream::DEFAULT) }.unwrap();
            direct += usize::from(c.last_choice().is_some_and(|ch| ch.is_direct()));
            for w in &wins {
                c.window_deregister(w).unwrap();
                assert!(
                    c.window_deregister(w).is_err(),
                    "a stale window deregistered"
                );
            }
            let out = b.get(lout);
            c.barrier().unwrap();
            let outputs = testkit::own_outputs(&coll, &inputs, me, out, op);
            let (w, f) = testkit::compare(&coll, &inputs, &outputs, op);
            cases += 1;
            wrong += w;
            if w > 0 && first.is_none() {
                first = Some(format!("{kind} count {count}: {}", f.unwrap_or_default()));
            }
            a.free();
            b.free();
        }
    }
    if let Some(f) = first {
        println!("FIRST {f}");
    }
    println!("DIRECT {direct}");
    println!("OK rank {me}: {cases} window cases, {wrong} wrong");
    c.destroy();
}

/// Collectives through `collective_raw` on this process's own `cuMemAlloc`
/// memory, each case on fresh allocations freed afterwards (after a
/// barrier: nothing of any rank's is in flight then).
fn child_external() {
    use cudarc::driver::sys;
    use oxccl::RawStream;
    let c = child_comm(Duration::from_secs(60));
    println!("BACKEND {}", c.describe_backend());
    let (n, me) = (c.nranks(), c.rank());
    let (mut cases, mut wrong, mut first, mut direct) = (0usize, 0u64, None, 0usize);
    // Binds the device's context to this thread for the driver calls below.
    c.barrier().unwrap();
    let kinds = [
        CollKind::AllReduce,
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::Broadcast,
        CollKind::Reduce,
        CollKind::AllToAll,
    ];
    for round in 0..2 {
        for kind in kinds {
            for (count, in_place) in [(1000usize, false), (150_000, true), (1 << 20, false)] {
                let root = if kind.has_root() { n - 1 } else { 0 };
                let coll = Collective::new(kind, count, root);
                let op = RedOp::Sum;
                let inputs: Vec<Vec<f32>> = (0..n)
                    .map(|r| testkit::input::<f32>(&coll, n, r, op, 5 + round))
                    .collect();
                let (lin, lout) = (coll.input_len(n), coll.output_len(n));
                let es = 4u64;
                let bytes = |l: usize| (l.max(1) * 4).max(16);
                let (mut a, mut b) = (0u64, 0u64);
                // SAFETY: plain allocations, freed below after the barrier.
                unsafe {
                    cu(
                        "cuMemAlloc",
                        sys::cuMemAlloc_v2(&mut a, bytes(lin.max(lout))),
                    );
                    if !in_place {
                        cu("cuMemAlloc", sys::cuMemAlloc_v2(&mut b, bytes(lout)));
                    }
                }
                let blk = (me as usize * count) as u64 * es;
                let (send, recv) = match (in_place, kind) {
                    (false, _) => (a, b),
                    (true, CollKind::AllGather | CollKind::Gather) => (a + blk, a),
                    (true, CollKind::ReduceScatter | CollKind::Scatter) => (a, a + blk),
                    (true, _) => (a, a),
                };
                let src = &inputs[me as usize];
                // SAFETY: `send` holds `lin` f32s.
                unsafe { to_device(send, src) };
                let call = common::raw::f32_call(kind, send, recv, count, op, root);
                println!("CASE round {round} {kind} count {count} in_place={in_place} send {send:#x} recv {recv:#x}");
                // SAFETY: both buffers live until after the barrier below;
                // stream 0 is the legacy default stream.
                unsafe { c.collective_raw(call, RawStream::DEFAULT) }.unwrap();
                direct += usize::from(c.last_choice().is_some_and(|ch| ch.is_direct()));
                c.barrier().unwrap();
                // SAFETY: `recv` holds `lout` f32s; the call completed.
                let out = unsafe { from_device(recv, lout) };
                // SAFETY: read; no call on them is in flight.
                unsafe {
                    cu("cuMemFree", sys::cuMemFree_v2(a));
                    if b != 0 {
                        cu("cuMemFree", sys::cuMemFree_v2(b));
                    }
                }
                let outputs = testkit::own_outputs(&coll, &inputs, me, out, op);
                let (w, f) = testkit::compare(&coll, &inputs, &outputs, op);
                cases += 1;
                wrong += w;
                if w > 0 && first.is_none() {
                    first = Some(format!(
                        "round {round} {kind} count {count} in_place={in_place}: {}",
                        f.unwrap_or_default()
                    ));
                }
                // Everyone has read its result before anyone frees more.
                c.barrier().unwrap();
            }
        }
    }
    let (w, f) = external_ring(&c);
    cases += 1;
    wrong += w;
    first = first.or(f);
    println!("DIRECT {direct} calls");
    finish_child(me, cases, wrong, first);
}

/// Send/Recv on a ring, 1 Mi f32 (a direct read of the sender's buffer
/// from 256 KiB on), on fresh allocations of the caller's: the wrong
/// elements and what went wrong.
fn external_ring(c: &oxccl::Communicator) -> (u64, Option<String>) {
    use cudarc::driver::sys;
    use oxccl::RawStream;
    let (n, me) = (c.nranks(), c.rank());
    let (mut wrong, mut first) = (0u64, None);
    let count = 1usize << 20;
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let data: Vec<f32> = (0..count)
        .map(|i| (me as usize * 7 + i % 1000) as f32)
        .collect();
    let (mut sbuf, mut rbuf) = (0u64, 0u64);
    // SAFETY: plain allocations and a synchronous copy, freed below after
    // the barrier.
    unsafe {
        cu("cuMemAlloc", sys::cuMemAlloc_v2(&mut sbuf, count * 4));
        cu("cuMemAlloc", sys::cuMemAlloc_v2(&mut rbuf, count * 4));
        to_device(sbuf, &data);
    }
    oxccl::group(|g| {
        // SAFETY: both buffers live until after the barrier below.
        unsafe {
            g.send_raw(
                c,
                sbuf as *const _,
                count,
                DataType::F32,
                next,
                RawStream::DEFAULT,
            )?;
            g.recv_raw(
                c,
                rbuf as *mut _,
                count,
                DataType::F32,
                prev,
                RawStream::DEFAULT,
            )
        }
    })
    .unwrap();
    c.barrier().unwrap();
    // SAFETY: `rbuf` holds `count` f32s; the exchange completed.
    let got = unsafe { from_device(rbuf, count) };
    let want: Vec<f32> = (0..count)
        .map(|i| (prev as usize * 7 + i % 1000) as f32)
        .collect();
    if got != want {
        wrong += got.iter().zip(&want).filter(|(a, b)| a != b).count() as u64;
        first.get_or_insert_with(|| "send/recv on the caller's memory delivered wrong data".into());
    }
    c.barrier().unwrap();
    // SAFETY: nothing of any rank's is in flight after the barrier.
    unsafe {
        cu("cuMemFree", sys::cuMemFree_v2(sbuf));
        cu("cuMemFree", sys::cuMemFree_v2(rbuf));
    }
    (wrong, first)
}

/// AllReduce cases for the one-step LL path (the parent forces it):
/// counts from 1 element to the path's 64 KiB default.
fn child_ll1() {
    let c = child_comm(Duration::from_secs(60));
    println!("BACKEND {}", c.describe_backend());
    let (mut cases, mut wrong, mut first) = (0usize, 0u64, None);
    for dt in [DataType::F32, DataType::Bf16, DataType::I32, DataType::F64] {
        let ops = [RedOp::Sum, RedOp::Max, RedOp::Avg];
        for &op in ops.iter().filter(|o| o.undefined_reason(dt).is_none()) {
            for (count, in_place) in [(1, false), (3, true), (1000, false), (1000, true)]
                .into_iter()
                .chain([((64 << 10) / dt.size(), false)])
            {
                for _ in 0..3 {
                    let (w, f) = with_dtype!(dt, T => check_one::<T>(&c, CollKind::AllReduce, count, op, in_place, true));
                    cases += 1;
                    wrong += w;
                    if w > 0 && first.is_none() {
                        first = Some(format!(
                            "{dt} {op} count {count} in_place={in_place}: {}",
                            f.unwrap_or_default()
                        ));
                    }
                }
            }
        }
    }
    let ran = c.launch_counts().map_or(0, |l| l.oneshot_ll_calls);
    println!("LL1 {ran} calls");
    finish_child(c.rank(), cases, wrong, first);
}

fn finish_child(me: u32, cases: usize, wrong: u64, first: Option<String>) {
    if wrong > 0 {
        println!(
            "WRONG rank {me}: {wrong} wrong, first: {}",
            first.unwrap_or_default()
        );
        std::process::exit(2);
    }
    println!("OK rank {me}: {cases} cases, 0 wrong");
}

fn child_split() {
    let c = child_comm(Duration::from_secs(60));
    let me = c.rank();
    let color = (me != 3).then_some(me % 2);
    match c.split(color, -(me as i32)).unwrap() {
        None => println!("OK split parent {me} -> none"),
        Some(s) => {
            let mut v = [me as f32];
            s.all_reduce_in_place(&mut v[..], RedOp::Sum).unwrap();
            println!(
                "OK split parent {me} -> child rank {} of {} sum {}",
                s.rank(),
                s.nranks(),
                v[0]
            );
        }
    }
}

fn child_env() {
    let c = oxccl::init_from_env().unwrap();
    let launcher = oxccl::LaunchEnv::from_vars(|k| std::env::var(k).ok())
        .unwrap()
        .launcher;
    let mut v = [c.rank() as f64 + 1.0];
    c.all_reduce_in_place(&mut v[..], RedOp::Sum).unwrap();
    println!(
        "OK env {launcher} rank {} of {} sum {}",
        c.rank(),
        c.nranks(),
        v[0]
    );
}

fn child_abort() {
    let c = child_comm(Duration::from_secs(600));
    let b = c.alloc::<f32>(1 << 16).unwrap();
    let t = Instant::now();
    for i in 0u64.. {
        if c.rank() == 1 && i == 20 {
            // Mid-loop: the peer is inside (or about to enter) its call.
            c.abort();
            println!("ABORTED");
            return;
        }
        if let Err(e) = c.all_reduce_in_place(&b, RedOp::Sum) {
            println!("ERR {e}");
            std::process::exit(3);
        }
        if t.elapsed() > GUARD {
            println!("never failed");
            std::process::exit(4);
        }
    }
}

/// Rank 0 sends 8 MiB to rank 1 and exits at once; rank 1 checks it.
fn child_send_exit() {
    let c = child_comm(Duration::from_secs(60));
    let n = 1 << 20;
    if c.rank() == 0 {
        let data: Vec<f64> = (0..n).map(|i| i as f64).collect();
        c.send(&data[..], 1).unwrap();
        drop(c);
        println!("OK rank 0: sent");
    } else {
        let mut got = vec![0.0f64; n];
        c.recv(&mut got[..], 0).unwrap();
        let wrong = got
            .iter()
            .enumerate()
            .filter(|&(i, &v)| v != i as f64)
            .count();
        if wrong > 0 {
            println!("WRONG rank 1: {wrong} wrong");
            std::process::exit(2);
        }
        println!("OK rank 1: received");
    }
}

fn child_init() {
    match Communicator::init_rank(
        &UniqueId::from_bytes(&unhex(&std::env::var("OXCCL_MP_ID").unwrap())).unwrap(),
        env_u32("OXCCL_MP_N"),
        env_u32("OXCCL_MP_RANK"),
        config(Duration::from_secs(30)),
    ) {
        Ok(c) => println!("OK init {}", c.describe_backend()),
        Err(e) => println!("ERR {e}"),
    }
}

/// Init, then one 2-element AllReduce, checked.
fn child_tiny() {
    let c = child_comm(Duration::from_secs(60));
    let (n, me) = (c.nranks(), c.rank());
    let mut v = [me as f32, 1.0];
    c.all_reduce_in_place(&mut v[..], RedOp::Sum).unwrap();
    let want = [(0..n).map(|r| r as f32).sum(), n as f32];
    if v == want {
        println!("OK rank {me}");
    } else {
        println!("WRONG rank {me}: {v:?}, want {want:?}");
    }
}

/// A rank in a network namespace: an AllReduce and an AllGather of 1 Mi
/// elements each, checked.
fn child_ns() {
    let c = oxccl::init_from_env().unwrap();
    let (n, me) = (c.nranks(), c.rank());
    let count = 1 << 20;
    let mut v: Vec<f32> = (0..count).map(|i| (i % 1000) as f32 + me as f32).collect();
    c.all_reduce_in_place(&mut v[..], RedOp::Sum).unwrap();
    let ranks: f32 = (0..n).map(|r| r as f32).sum();
    let mut wrong = (0..count)
        .filter(|&i| v[i] != n as f32 * (i % 1000) as f32 + ranks)
        .count();
    let mine = vec![me as i32; count];
    let mut all = vec![-1i32; count * n as usize];
    c.all_gather(&mine[..], &mut all[..]).unwrap();
    wrong += (0..all.len())
        .filter(|&i| all[i] != (i / count) as i32)
        .count();
    for a in tcp_peers() {
        println!("PEER {a}");
    }
    println!("OK ns rank {me}: {} {wrong} wrong", c.describe_backend());
}

/// The addresses of this process's TCP connections (from /proc): what the
/// namespace test checks its peer against.
fn tcp_peers() -> Vec<String> {
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    tcp.lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(2))
        .filter_map(|hex| {
            let (ip, _) = hex.split_once(':')?;
            let ip = u32::from_str_radix(ip, 16).ok()?;
            Some(std::net::Ipv4Addr::from(ip.to_le_bytes()).to_string())
        })
        .collect()
}

fn child_loop() {
    // A deadline far above the parent's guard: only the watcher can
    // report the killed peer in time.
    let c = child_comm(Duration::from_secs(600));
    let b = c.alloc::<f32>(1 << 16).unwrap();
    let t = Instant::now();
    for i in 0.. {
        if let Err(e) = c.all_reduce_in_place(&b, RedOp::Sum) {
            println!("ERR {e}");
            std::process::exit(3);
        }
        if i == 0 {
            println!("LOOPING");
        }
        if t.elapsed() > GUARD {
            println!("never failed");
            std::process::exit(4);
        }
    }
}

/// The entry point of the processes the other tests spawn (`ROLE` set);
/// in a plain test run it has nothing to do.
#[test]
fn child() {
    common::procs::run_role(&[
        ("all", child_all),
        ("external", child_external),
        ("ll1", child_ll1),
        ("windows", child_windows),
        ("graph", child_graph),
        ("split", child_split),
        ("env", child_env),
        ("loop", child_loop),
        ("abort", child_abort),
        ("init", child_init),
        ("tiny", child_tiny),
        ("send_exit", child_send_exit),
        ("ns", child_ns),
    ]);
}
