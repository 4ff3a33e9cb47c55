//! A profiler plugin of ours hears the proxy's work over the network
//! transport: two rank processes of this host forced onto it, each with
//! the plugin loaded. The test binary re-executes itself: the test
//! `child` is the processes' entry point, told its role by
//! `OXCCL_MP_ROLE`.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

mod common;
use common::procs::{child_rank, finish, spawn_ranks_live};

use oxccl::{BackendKind, Config, RedOp};

/// Only the network between ranks of one host, over loopback.
const OVER_NET: &[(&str, &str)] = &[
    ("NCCL_P2P_DISABLE", "1"),
    ("NCCL_SHM_DISABLE", "1"),
    ("NCCL_SOCKET_IFNAME", "lo"),
];

/// Activation masks: group, collective, proxy operation and step; and
/// group and collective only.
const WITH_PROXY: u32 = 1 | 2 | 8 | 16;
const WITHOUT_PROXY: u32 = 1 | 2;

/// Elements of the AllReduce: several messages per link.
const COUNT: usize = 1 << 20;

/// Runs two rank processes under the plugin (its v4 interface only with
/// `v4`) with `mask`; each rank's event lines.
fn run(mask: u32, v4: bool) -> Vec<Vec<String>> {
    let dir = std::env::temp_dir().join(format!(
        "oxccl-prof-proxy-{}-{mask}-{v4}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let lib = common::profiler::build_plugin(&dir, v4);
    let out = |r: u32| dir.join(format!("events.{r}.txt"));
    let (kids, rx) = spawn_ranks_live("reduce", 2, |r| {
        let mut v: Vec<(&'static str, String)> =
            OVER_NET.iter().map(|&(k, v)| (k, v.to_string())).collect();
        v.push(("NCCL_PROFILER_PLUGIN", lib.display().to_string()));
        v.push(("PROFILER_OUT", out(r).display().to_string()));
        v.push(("PROFILER_MASK", mask.to_string()));
        v
    });
    let (codes, lines) = finish(kids, &rx);
    assert!(
        codes.iter().all(|c| *c == Some(0)),
        "exit codes {codes:?}\n{lines:#?}"
    );
    let events = (0..2).map(|r| read(&out(r), r)).collect();
    let _ = std::fs::remove_dir_all(&dir);
    events
}

/// Rank `r`'s lines of the plugin's file, without the rank tag.
fn read(path: &Path, r: u32) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .map(|l| {
            l.strip_prefix(&format!("{r} "))
                .unwrap_or_else(|| panic!("a line of another rank in rank {r}'s file: {l}"))
                .to_string()
        })
        .collect()
}

/// An event as the plugin printed it.
#[derive(Debug, Default)]
struct Ev {
    kind: String,
    parent: u64,
    /// Line numbers of its start and stop.
    start: usize,
    stop: Option<usize>,
    fields: HashMap<String, String>,
    /// States recorded, in order.
    states: Vec<i32>,
}

fn parse(lines: &[String]) -> HashMap<u64, Ev> {
    let mut evs: HashMap<u64, Ev> = HashMap::new();
    for (i, l) in lines.iter().enumerate() {
        let w: Vec<&str> = l.split(' ').collect();
        match w[0] {
            "start" => {
                let id: u64 = w[2].parse().unwrap();
                let fields: HashMap<String, String> = w[3..]
                    .iter()
                    .filter_map(|f| f.split_once('='))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                let parent = fields["parent"].parse().unwrap();
                evs.insert(
                    id,
                    Ev {
                        kind: w[1].to_string(),
                        parent,
                        start: i,
                        fields,
                        ..Ev::default()
                    },
                );
            }
            "stop" => {
                let e = evs
                    .get_mut(&w[1].parse().unwrap())
                    .expect("stop of an unknown event");
                assert!(e.stop.is_none(), "stopped twice: {l}");
                e.stop = Some(i);
            }
            "state" => {
                let e = evs
                    .get_mut(&w[1].parse().unwrap())
                    .expect("state of an unknown event");
                assert!(e.stop.is_none(), "state after stop: {l}");
                e.states.push(w[2].parse().unwrap());
            }
            _ => {}
        }
    }
    evs
}

#[test]
fn proxy_operations_and_steps_nest_under_their_collective_in_order() {
    proxy_events_nest(false);
}

#[test]
fn a_v4_plugin_hears_the_proxy_too() {
    proxy_events_nest(true);
}

/// Every event stopped once, inside its parent's life; a send or receive
/// operation per link with the peer, its steps numbered in order and as
/// many as it announced, each with its states.
fn proxy_events_nest(v4: bool) {
    for (r, lines) in run(WITH_PROXY, v4).iter().enumerate() {
        let evs = parse(lines);
        let all = lines.join("\n");
        let of = |k: &'static str| evs.values().filter(move |e| e.kind == k);
        assert_eq!(of("coll").count(), 1, "rank {r}:\n{all}");
        let (sends, recvs): (Vec<&Ev>, Vec<&Ev>) =
            of("proxyop").partition(|e| e.fields["send"] == "1");
        assert!(!sends.is_empty() && !recvs.is_empty(), "rank {r}:\n{all}");
        for e in evs.values() {
            let stop = e.stop.unwrap_or_else(|| panic!("never stopped: {e:?}"));
            if e.kind == "group" {
                continue;
            }
            // Started after its parent, stopped before it.
            let p = &evs[&e.parent];
            let want = match e.kind.as_str() {
                "coll" => "group",
                "proxyop" => "coll",
                "proxystep" => "proxyop",
                k => panic!("unasked kind {k}"),
            };
            assert_eq!(p.kind, want, "{e:?}");
            assert!(
                p.start < e.start && stop < p.stop.unwrap(),
                "{e:?} under {p:?}"
            );
        }
        for (&oid, op) in evs.iter().filter(|(_, e)| e.kind == "proxyop") {
            assert_eq!(op.fields["ownpid"], "1", "{op:?}");
            assert_eq!(op.fields["peer"], (1 - r).to_string(), "{op:?}");
            let send = op.fields["send"] == "1";
            let mut steps: Vec<&Ev> = of("proxystep").filter(|s| s.parent == oid).collect();
            steps.sort_by_key(|s| s.start);
            let n: usize = op.fields["steps"].parse().unwrap();
            assert!(n > 0, "{op:?}");
            assert_eq!(steps.len(), n, "rank {r} op {op:?}:\n{all}");
            for (i, s) in steps.iter().enumerate() {
                assert_eq!(s.fields["step"], i.to_string(), "{s:?}");
                // SendWait; or RecvWait (unless it landed before the call
                // began) then RecvGPUWait.
                let ok = if send {
                    s.states == [9]
                } else {
                    s.states == [10, 12] || s.states == [12]
                };
                assert!(ok, "rank {r} step {s:?}");
            }
        }
    }
}

#[test]
fn a_mask_without_proxy_events_gets_none() {
    for (r, lines) in run(WITHOUT_PROXY, false).iter().enumerate() {
        let evs = parse(lines);
        assert!(
            evs.values().all(|e| e.kind == "group" || e.kind == "coll"),
            "rank {r}: {lines:#?}"
        );
        assert_eq!(evs.len(), 2, "rank {r}: {lines:#?}");
    }
}

/// One AllReduce over the network, then the communicator's end.
fn child_reduce() {
    let c = child_rank(Config {
        backend: BackendKind::Host,
        deadline: Duration::from_secs(60),
        ..Config::from_env().unwrap()
    });
    let send = vec![1.0f32; COUNT];
    let mut recv = vec![0.0f32; COUNT];
    c.all_reduce(&send[..], &mut recv[..], RedOp::Sum).unwrap();
    assert!(recv.iter().all(|&x| x == 2.0));
    drop(c);
    println!("OK");
}

#[test]
fn child() {
    common::procs::run_role(&[("reduce", child_reduce)]);
}
