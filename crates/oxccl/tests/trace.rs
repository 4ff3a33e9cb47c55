//! The step trace (`OXCCL_TRACE`): Chrome trace JSON with a process per
//! rank, each call on the rank's host thread and a step event for every
//! step of its plan: host times on the host backend, the GPU's
//! `%globaltimer` on CUDA (that test skips without a device).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use oxccl::config::TraceSettings;
use oxccl::{BackendKind, Communicator, Config, RedOp};
use serde_json::Value;

mod common;

fn traced(backend: BackendKind, path: &PathBuf, calls: usize) -> Config {
    let _ = std::fs::remove_file(path);
    Config {
        backend,
        trace: Some(TraceSettings {
            path: path.clone(),
            calls,
        }),
        ..Config::default()
    }
}

/// Checks the trace of `nranks` ranks that each ran `calls` AllReduces,
/// its steps stamped by `clock` (`host` or `globaltimer`).
fn check(text: &str, nranks: u64, calls: usize, clock: &str) {
    let v: Value = serde_json::from_str(text).expect("JSON");
    let events = v["traceEvents"].as_array().expect("traceEvents");
    let num = |e: &Value, k: &str| e[k].as_f64().unwrap_or_else(|| panic!("{k} in {e}"));
    let pids: BTreeSet<u64> = events.iter().map(|e| e["pid"].as_u64().unwrap()).collect();
    assert_eq!(pids, (0..nranks).collect(), "one track per rank");
    for rank in 0..nranks {
        let named = events.iter().any(|e| {
            e["ph"] == "M"
                && e["name"] == "process_name"
                && e["pid"] == rank
                && e["args"]["name"] == format!("rank {rank}")
        });
        assert!(named, "rank {rank} has no named track");
        let calls_seen: Vec<&Value> = events
            .iter()
            .filter(|e| e["pid"] == rank && e["cat"] == "call")
            .collect();
        assert_eq!(calls_seen.len(), calls, "rank {rank}: {calls_seen:?}");
        for (i, call) in calls_seen.iter().enumerate() {
            assert_eq!(call["ph"], "X");
            assert_eq!(call["name"], "allreduce");
            assert_eq!(call["args"]["call"], i as u64);
            let plan_steps = call["args"]["plan_steps"].as_u64().unwrap();
            assert!(plan_steps > 0);
            let steps: Vec<&Value> = events
                .iter()
                .filter(|e| e["pid"] == rank && e["cat"] == "step" && e["args"]["call"] == i as u64)
                .collect();
            assert_eq!(
                steps.len() as u64,
                plan_steps,
                "rank {rank} call {i}: a step event per plan step"
            );
            // Every channel's steps are there once each, 0.., in time order,
            // on the channel's thread, inside the call; those that exchange
            // name their peer.
            let mut per_channel: BTreeMap<u64, Vec<(u64, f64, f64)>> = BTreeMap::new();
            let (t0, t1) = (num(call, "ts"), num(call, "ts") + num(call, "dur"));
            for s in &steps {
                assert_eq!(s["args"]["clock"], clock, "{s}");
                let ch = s["args"]["channel"].as_u64().unwrap();
                assert_eq!(s["tid"].as_u64().unwrap(), ch + 1, "{s}");
                if let Some(peer) = s["args"]["peer"].as_u64() {
                    assert!(peer < nranks && peer != rank, "{s}");
                }
                let (a, d) = (num(s, "ts"), num(s, "dur"));
                assert!(d >= 0.0 && a >= t0 - 0.01, "{s} before {call}");
                if clock == "host" {
                    assert!(a + d <= t1 + 0.01, "{s} after {call}");
                }
                per_channel.entry(ch).or_default().push((
                    s["args"]["step"].as_u64().unwrap(),
                    a,
                    d,
                ));
            }
            assert!(
                steps.iter().any(|s| s["args"]["peer"].is_u64()),
                "rank {rank} call {i}: no step names a peer"
            );
            for (ch, list) in per_channel {
                let idx: Vec<u64> = list.iter().map(|x| x.0).collect();
                assert_eq!(
                    idx,
                    (0..list.len() as u64).collect::<Vec<_>>(),
                    "channel {ch}"
                );
                for w in list.windows(2) {
                    // A signal/wait run the kernel does as one phase shares
                    // its stamps.
                    let same_run = clock == "globaltimer" && w[1].1 == w[0].1 && w[1].2 == w[0].2;
                    assert!(
                        same_run || w[1].1 >= w[0].1 + w[0].2 - 0.01,
                        "channel {ch} steps overlap"
                    );
                }
            }
        }
    }
}

#[test]
fn a_four_rank_host_trace_has_a_track_per_rank_and_every_plan_step() {
    let path = std::env::temp_dir().join(format!("oxccl-trace-{}.json", std::process::id()));
    let comms = oxccl::init_all_with(4, traced(BackendKind::Host, &path, 3)).unwrap();
    common::on_ranks(&comms, |c| {
        // Past the recorded calls too: the fourth is not in the trace.
        for n in [4096usize, 8, 100_000, 8] {
            let send = vec![1.0f32; n];
            let mut recv = vec![0.0f32; n];
            c.all_reduce(&send[..], &mut recv[..], RedOp::Sum).unwrap();
            assert_eq!(recv[n - 1], 4.0);
        }
    });
    // Written once every rank has its three calls, before the drop.
    let text = std::fs::read_to_string(&path).expect("the trace file");
    drop(comms);
    let _ = std::fs::remove_file(&path);
    check(&text, 4, 3, "host");
}

/// On CUDA every step's start and end come from the kernel's
/// `%globaltimer`, in order per channel.
#[test]
fn a_cuda_trace_has_every_plan_step_in_globaltimer_order() {
    if oxccl::backend::cuda::device_or_skip("a_cuda_trace_has_every_plan_step_in_globaltimer_order")
        .is_none()
    {
        return;
    }
    let path = std::env::temp_dir().join(format!("oxccl-cuda-trace-{}.json", std::process::id()));
    let comms: Vec<Communicator> =
        oxccl::init_all_with(2, traced(BackendKind::Cuda, &path, 2)).unwrap();
    common::on_ranks(&comms, |c| {
        for n in [1usize << 16, 2] {
            let b = c.alloc::<f32>(n).unwrap();
            b.copy_from_slice(&vec![1.0; n]).unwrap();
            c.all_reduce_in_place(&b, RedOp::Sum).unwrap();
            assert_eq!(b.to_vec().unwrap()[n - 1], 2.0);
        }
    });
    let text = std::fs::read_to_string(&path).expect("the trace file");
    drop(comms);
    let _ = std::fs::remove_file(&path);
    check(&text, 2, 2, "globaltimer");
}
