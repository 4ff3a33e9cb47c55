//! Selector picks on a few points, overrides, rings and calibration.

use oxccl_core::{Algo, CollKind, Proto};
use oxccl_topo::calibrate::{fit, fit_fifo, parse_sweep};
use oxccl_topo::select::Selector;
use oxccl_topo::Topology;

const PROTOS: [Proto; 2] = [Proto::Simple, Proto::LL];

fn hgx(hosts: u32) -> (Topology, Selector) {
    let t = Topology::preset("hgx-h100", hosts).unwrap();
    let ranks: Vec<usize> = (0..t.gpus().len()).collect();
    let s = Selector::new(&t, &ranks);
    (t, s)
}

fn pick(s: &Selector, bytes: usize, n: u32, algos: &[Algo], protos: &[Proto]) -> (Algo, Proto) {
    let c = s.choose(CollKind::AllReduce, bytes, n, algos, protos);
    assert!(c.us().is_finite() && c.us() > 0.0);
    (c.algo, c.proto)
}

#[test]
fn pinned_picks_one_host() {
    let (_, s) = hgx(1);
    assert_eq!(
        pick(&s, 8, 8, &Algo::ALL, &PROTOS),
        (Algo::OneShot, Proto::LL)
    );
    let c = s.choose(CollKind::AllReduce, 1 << 30, 8, &Algo::ALL, &PROTOS);
    assert_eq!(
        (c.algo, c.proto, c.channels),
        (Algo::Ring, Proto::Simple, 16)
    );
    // 1 GiB at ~371 GB/s busbw: 2 × 7/8 × 1 GiB / 371 GB/s ≈ 5.1 ms.
    assert!((5000.0..5300.0).contains(&c.us()), "{}", c.us());
    // Without all-pairs, small messages go to a tree-family algorithm with LL.
    let classic = [Algo::Ring, Algo::DoubleBinaryTree];
    assert_eq!(pick(&s, 8, 8, &classic, &PROTOS).1, Proto::LL);
}

#[test]
fn pinned_picks_64_hosts() {
    let (_, s) = hgx(64);
    assert_eq!(s.shape().nnodes, 64);
    let n = 512;
    // Tiny messages: a logarithmic tree, LL.
    let (a, p) = pick(&s, 8, n, &Algo::ALL, &PROTOS);
    assert!(
        matches!(a, Algo::BinaryTree | Algo::DoubleBinaryTree),
        "{a}"
    );
    assert_eq!(p, Proto::LL);
    // 1 GiB across 512 ranks: the ring's 1022 steps of latency cost more
    // than the tree's bandwidth discount, where the tree gets as many
    // channels as the ring: its plan has two per channel (one per tree),
    // so that takes 32 blocks a rank.
    let wide = s.clone().with_max_channels(32);
    assert_eq!(
        pick(&wide, 1 << 30, n, &Algo::ALL, &PROTOS),
        (Algo::DoubleBinaryTree, Proto::Simple)
    );
    // With 16 blocks a rank the tree runs on 8 channels at most.
    let c = s.choose(
        CollKind::AllReduce,
        1 << 30,
        n,
        &[Algo::DoubleBinaryTree],
        &PROTOS,
    );
    assert_eq!((c.algo, c.channels), (Algo::DoubleBinaryTree, 8), "{c}");
    // 16 GiB: the ring's bandwidth wins.
    assert_eq!(
        pick(&s, 16 << 30, n, &Algo::ALL, &PROTOS),
        (Algo::Ring, Proto::Simple)
    );
    // All-pairs does not apply across hosts for AllReduce.
    assert!(s
        .predict(CollKind::AllReduce, Algo::OneShot, Proto::LL, 1, 8, n)
        .is_none());
}

#[test]
fn overrides_win() {
    let (_, s) = hgx(1);
    assert_eq!(
        pick(&s, 8, 8, &[Algo::Ring], &PROTOS),
        (Algo::Ring, Proto::LL)
    );
    assert_eq!(
        pick(&s, 8, 8, &Algo::ALL, &[Proto::Simple]).1,
        Proto::Simple
    );
    assert_eq!(
        pick(&s, 1 << 30, 8, &[Algo::DoubleBinaryTree], &[Proto::LL]),
        (Algo::DoubleBinaryTree, Proto::LL)
    );
    // LL128 is chosen only when allowed.
    let c = s.choose(CollKind::AllReduce, 1 << 20, 8, &Algo::ALL, &Proto::ALL);
    let c2 = s.choose(CollKind::AllReduce, 1 << 20, 8, &Algo::ALL, &PROTOS);
    assert!(c.us() <= c2.us());
    assert_ne!(c2.proto, Proto::LL128);
    // An allowed set that cannot apply falls back to Ring.
    let t = Topology::preset("pcie-8gpu", 1).unwrap();
    let p = Selector::new(&t, &(0..8).collect::<Vec<_>>());
    assert_eq!(
        pick(&p, 1 << 20, 8, &[Algo::OneShot], &PROTOS).0,
        Algo::Ring
    );
    assert_eq!(
        p.choose(CollKind::AllReduce, 1 << 20, 8, &Algo::ALL, &[Proto::LL128])
            .proto,
        Proto::Simple
    );
}

#[test]
fn picks_serve_the_collective() {
    let (_, s) = hgx(2);
    for kind in CollKind::ALL {
        for bytes in [8usize, 1 << 16, 1 << 26] {
            let c = s.choose(kind, bytes, 16, &Algo::ALL, &PROTOS);
            assert!(
                oxccl_topo::model::serves(c.algo, kind) || kind == CollKind::SendRecv,
                "{kind} {}",
                c.algo
            );
            assert!(c.channels >= 1 && c.channels <= s.max_channels());
        }
    }
    // AllToAll across hosts may use all-pairs over the network.
    let c = s.choose(CollKind::AllToAll, 1 << 26, 16, &Algo::ALL, &PROTOS);
    assert!(matches!(c.algo, Algo::AllPairs | Algo::Ring));
}

#[test]
fn rings_cover_every_rank() {
    let (_, s) = hgx(2);
    let rings = s.rings();
    assert_eq!(rings.len() as u32, s.max_channels());
    for r in &rings {
        let mut v = r.clone();
        v.sort_unstable();
        assert_eq!(v, (0..16).collect::<Vec<u32>>());
    }
    // DGX-1: consecutive ranks in each ring are NVLink neighbours.
    let t = Topology::preset("dgx1", 1).unwrap();
    let s = Selector::new(&t, &(0..8).collect::<Vec<_>>()).with_max_channels(4);
    let g = t.gpus();
    for r in s.rings() {
        for i in 0..8 {
            let p = t.path(g[r[i] as usize], g[r[(i + 1) % 8] as usize]);
            assert!(p.class.is_nvlink());
        }
    }
}

#[test]
fn several_ranks_on_one_gpu() {
    let t = Topology::preset("single-gpu", 1).unwrap();
    let s = Selector::new(&t, &[0, 0, 0, 0]);
    assert!(s.shape().direct_ok);
    // Four ranks share the GPU's copy bandwidth.
    assert!((s.shape().intra_bw - 2105.0 / 4.0).abs() < 1e-6);
    let r = s.rings();
    assert_eq!(r[0], vec![0, 1, 2, 3]);
    let c = s.choose(
        CollKind::AllReduce,
        8,
        4,
        &[Algo::Ring, Algo::DoubleBinaryTree],
        &PROTOS,
    );
    assert_eq!(c.algo, Algo::Ring);
    // A CPU-only topology (no GPU) still gives a selector.
    let cpu_only = oxccl_topo::detect::detect_with(std::path::Path::new("/nonexistent"), false);
    assert!(cpu_only.gpus().is_empty());
    let s = Selector::new(&cpu_only, &[0, 1]);
    let c = s.choose(CollKind::AllGather, 1024, 2, &Algo::ALL, &PROTOS);
    assert!(c.us().is_finite());
}

#[test]
fn ring_latency_linear_tree_logarithmic() {
    let lat = |hosts: u32, algo: Algo| {
        let (_, s) = hgx(hosts);
        s.predict(CollKind::AllReduce, algo, Proto::LL, 1, 8, hosts * 8)
            .unwrap()
    };
    let (r2, r4, r8) = (lat(2, Algo::Ring), lat(4, Algo::Ring), lat(8, Algo::Ring));
    let (t2, t4, t8) = (
        lat(2, Algo::DoubleBinaryTree),
        lat(4, Algo::DoubleBinaryTree),
        lat(8, Algo::DoubleBinaryTree),
    );
    // Ring: equal increments per doubling of ranks grow (linear in ranks).
    assert!((r8 - r4) > 1.9 * (r4 - r2));
    // Tree: equal increments per doubling (logarithmic).
    assert!(((t8 - t4) - (t4 - t2)).abs() < 1e-3);
}

#[test]
fn calibration_recovers_a_known_machine() {
    let (_, s) = hgx(1);
    // A "measured" machine 5 µs slower and at 80% of the model's bandwidth.
    let mut results = Vec::new();
    for e in 0..=30 {
        let bytes = 8usize << e;
        let p0 = s
            .predict(CollKind::AllReduce, Algo::Ring, Proto::Simple, 16, 0, 8)
            .unwrap();
        let p = s
            .predict(CollKind::AllReduce, Algo::Ring, Proto::Simple, 16, bytes, 8)
            .unwrap();
        let t = p0 + 5.0 + (p - p0) / 0.8;
        results.push(format!(
            r#"{{"coll":"allreduce","dtype":"float","op":"sum","bytes":{bytes},"count":{},"algo":"ring","proto":"simple","channels":16,"time_us":{t},"algbw_gbps":0,"busbw_gbps":0,"in_place":false,"wrong":0,"future":1}}"#,
            bytes / 4
        ));
    }
    let json = format!(
        r#"{{"machine":"test","backend":"model","nranks":8,"results":[{}]}}"#,
        results.join(",")
    );
    let sweep = parse_sweep(&json).unwrap();
    let consts = fit(&s, &sweep);
    let (lat, mul) = consts.correction(Algo::Ring, Proto::Simple);
    assert!((lat - 5.0).abs() < 0.01, "{lat}");
    assert!((mul - 0.8).abs() < 0.01, "{mul}");
    let cal = s.clone().with_constants(consts);
    let ring_1g = |sel: &Selector| {
        sel.predict(
            CollKind::AllReduce,
            Algo::Ring,
            Proto::Simple,
            16,
            1 << 30,
            8,
        )
        .unwrap()
    };
    assert!(ring_1g(&cal) > ring_1g(&s) * 1.2);
    assert!(parse_sweep("{").is_err());
}

#[test]
fn builtin_calibration_applies_to_ranks_sharing_one_gpu_of_any_model() {
    use oxccl_topo::calibrate::builtin_for;
    let one = Topology::preset("single-gpu", 1).unwrap();
    let sweep = builtin_for(&one, &[0; 8]).expect("one GPU shared by 8 ranks");
    assert_eq!(sweep.nranks, 8);
    assert!(builtin_for(&one, &[0]).is_none(), "one rank shares nothing");
    let h100 = Topology::preset("hgx-h100", 1).unwrap();
    assert!(builtin_for(&h100, &[3; 4]).is_some(), "an H100 shared by 4");
    assert!(builtin_for(&h100, &[0, 0, 1, 1]).is_none(), "two GPUs");
    let h200 = Topology::preset("hgx-h200", 1).unwrap();
    assert!(builtin_for(&h200, &[0, 1, 2, 3, 4, 5, 6, 7]).is_none());
}

/// On an H100 shared by 8 ranks the calibrated model picks what the lent
/// H100 measured fastest at 256 MiB (two-shot AllReduce
/// 1546 µs against the ring's 4108, all-pairs AllGather 912 against 2197),
/// at the H100's own speed: slower than on the H200 by about their
/// memory bandwidths' ratio.
#[test]
fn an_h100_shared_by_8_ranks_picks_what_was_measured_fastest() {
    use oxccl_topo::calibrate::{builtin_for, carry, fit, SHARED_GPU_MACHINE};
    let reference = Topology::preset(SHARED_GPU_MACHINE, 1).unwrap();
    let reference = Selector::new(&reference, &[0; 8]).with_max_channels(16);
    let pick = |preset: &str| {
        let t = Topology::preset(preset, 1).unwrap();
        let s = Selector::new(&t, &[0; 8]).with_max_channels(16);
        let fitted = fit(&reference, &builtin_for(&t, &[0; 8]).unwrap());
        let cal = s.clone().with_constants(carry(&fitted, s.constants()));
        let big = 256 << 20;
        let ar = cal.choose(CollKind::AllReduce, big, 8, &Algo::ALL, &[Proto::Simple]);
        let ag = cal.choose(CollKind::AllGather, big, 8, &Algo::ALL, &[Proto::Simple]);
        (ar, ag)
    };
    let (ar, ag) = pick("hgx-h100");
    assert_eq!(ar.algo, Algo::TwoShot, "{ar}");
    assert_eq!(ag.algo, Algo::AllPairs, "{ag}");
    let (ar200, _) = pick("single-gpu");
    let ratio = ar.us() / ar200.us();
    assert!((1.1..1.6).contains(&ratio), "H100 / H200 time {ratio}");
}

#[test]
fn calibration_fits_each_collective_and_picks_the_measured_fastest() {
    let s = Selector::new(&Topology::preset("single-gpu", 1).unwrap(), &[0; 8]);
    let sweep = first_calibration();
    // Registered Reduce and AllGather now complete near their floors
    // (run 7): nothing is avoided.
    assert!(sweep.avoid.is_empty(), "{:?}", sweep.avoid);
    let cal = s.clone().with_constants(fit(&s, &sweep));
    assert!(cal.constants().avoid.is_empty());
    // Every measured point is reproduced by its own collective's fit
    // (ring AllReduce has two points: the fit is their median), the
    // registered ones by `fit`, the FIFO variants' by `fit_fifo`.
    let fifo_cal = s.clone().with_constants(fit_fifo(&s, &sweep));
    for r in sweep.results.iter().filter(|r| r.algo != "ring") {
        let kind: CollKind = r.coll.parse().unwrap();
        let algo: Algo = r.algo.parse().unwrap();
        let proto: Proto = r.proto.parse().unwrap();
        let by = if r.registered { &cal } else { &fifo_cal };
        let p = by
            .predict(kind, algo, proto, r.channels, r.bytes as usize, 8)
            .unwrap();
        assert!((p - r.time_us).abs() < 0.01 * r.time_us, "{r:?}: {p}");
    }
    // 256 MiB: what run 7 measured fastest on registered buffers.
    for (kind, algo) in [
        (CollKind::AllReduce, Algo::TwoShot),
        (CollKind::ReduceScatter, Algo::AllPairs),
        (CollKind::Reduce, Algo::AllPairs),
        (CollKind::AllGather, Algo::AllPairs),
        (CollKind::Broadcast, Algo::AllPairs),
        (CollKind::AllToAll, Algo::AllPairs),
    ] {
        let c = cal.choose(kind, 256 << 20, 8, &Algo::ALL, &PROTOS);
        assert_eq!((c.algo, c.proto), (algo, Proto::Simple), "{kind}: {c}");
    }
    // The FIFO view drops the registered direct fits and the avoid list.
    let fifo = cal.constants().for_fifo();
    assert!(fifo.avoid.is_empty());
    assert_eq!(
        fifo.correction_for(CollKind::AllReduce, Algo::TwoShot, Proto::Simple),
        fifo.correction_for(CollKind::AllReduce, Algo::Ring, Proto::Simple)
    );
}

#[test]
fn a_sweeps_avoid_list_keeps_its_variants_out() {
    use oxccl_topo::calibrate::Avoid;
    let s = Selector::new(&Topology::preset("single-gpu", 1).unwrap(), &[0; 8]);
    let mut sweep = builtin();
    let avoid = |coll: &str, algo: &str| Avoid {
        coll: coll.into(),
        algo: algo.into(),
        why: "test".into(),
    };
    // An unknown name is skipped, not an error.
    sweep.avoid = vec![avoid("reduce", "allpairs"), avoid("allgather", "nosuch")];
    let consts = fit(&s, &sweep);
    assert_eq!(consts.avoid, vec![(CollKind::Reduce, Algo::AllPairs)]);
    let cal = s.clone().with_constants(consts);
    assert!(cal
        .predict(
            CollKind::Reduce,
            Algo::AllPairs,
            Proto::Simple,
            16,
            1 << 20,
            8
        )
        .is_none());
    for bytes in [8, 256 << 20] {
        let c = cal.choose(CollKind::Reduce, bytes, 8, &Algo::ALL, &PROTOS);
        assert_ne!(c.algo, Algo::AllPairs, "{bytes}: {c}");
    }
    // Without the entry the same sweep picks all-pairs at 256 MiB.
    let plain = s.clone().with_constants(fit(&s, &builtin()));
    let c = plain.choose(CollKind::Reduce, 256 << 20, 8, &Algo::ALL, &PROTOS);
    assert_eq!(c.algo, Algo::AllPairs, "{c}");
    // The avoid list also arrives through JSON.
    let json = r#"{"nranks":8,"results":[],"avoid":[{"coll":"allgather","algo":"allpairs"}]}"#;
    let consts = fit(&s, &parse_sweep(json).unwrap());
    assert!(consts.avoids(CollKind::AllGather, Algo::AllPairs));
}

#[test]
fn small_points_reach_the_view_that_runs_their_plan() {
    // Session 3 run 1, 8 B AllReduce on 8 ranks sharing one H200, eager:
    // registered direct one-shot 17.02 µs, FIFO one-shot 14.02 (LL) and
    // 17.71 (Simple); empty-plan floor 10.69.
    let s = Selector::new(&Topology::preset("single-gpu", 1).unwrap(), &[0; 8]);
    let registered = s.clone().with_constants(oxccl_topo::consts::Constants {
        direct_fifo_free: true,
        ..s.constants().clone()
    });
    let sweep = first_calibration();
    assert_eq!(sweep.launch_floor_us, Some(10.69));
    let reg = registered.clone().with_constants(fit(&registered, &sweep));
    let fifo = s.clone().with_constants(fit_fifo(&registered, &sweep));
    assert!(!fifo.constants().direct_fifo_free);
    let t = |sel: &Selector, algo, proto, bytes| {
        sel.predict(CollKind::AllReduce, algo, proto, 1, bytes, 8)
            .unwrap()
    };
    let near = |got: f64, want: f64| (got - want).abs() < 0.05;
    assert!(near(t(&reg, Algo::OneShot, Proto::Simple, 8), 17.02));
    assert!(near(t(&fifo, Algo::OneShot, Proto::LL, 8), 14.02));
    assert!(near(t(&fifo, Algo::OneShot, Proto::Simple, 8), 17.71));
    // The registered view does not see the FIFO points, nor the FIFO
    // view the registered one-shot's: its large point's bandwidth is not
    // the FIFO variant's, which takes the ring's.
    assert!(!near(t(&reg, Algo::OneShot, Proto::LL, 8), 14.02));
    let ring = fifo
        .constants()
        .correction_for(CollKind::AllReduce, Algo::Ring, Proto::Simple);
    let one = fifo
        .constants()
        .correction_for(CollKind::AllReduce, Algo::OneShot, Proto::Simple);
    assert_eq!(one.1, ring.1);
    assert!(near(one.0, 17.71 - 10.8), "{one:?}");
    // What no small point timed pays the launch floor over the model:
    // ring and trees in both views, the two-shot's FIFO variant too.
    let plain = |algo, proto| {
        s.predict(CollKind::AllReduce, algo, proto, 1, 0, 8)
            .unwrap()
    };
    for algo in [
        Algo::Ring,
        Algo::BinaryTree,
        Algo::DoubleBinaryTree,
        Algo::Chain,
    ] {
        for sel in [&reg, &fifo] {
            let got = sel
                .predict(CollKind::AllReduce, algo, Proto::LL, 1, 0, 8)
                .unwrap();
            assert!(near(got, plain(algo, Proto::LL) + 10.69), "{algo}: {got}");
        }
    }
    let got = t(&fifo, Algo::TwoShot, Proto::LL, 0);
    assert!(near(got, plain(Algo::TwoShot, Proto::LL) + 10.69), "{got}");
    // So at 8 B the FIFO one-shot under LL is the fastest of everything
    // either view times, and the direct one-shot the registered view's.
    let best = |sel: &Selector| sel.choose(CollKind::AllReduce, 8, 8, &Algo::ALL, &PROTOS);
    let c = best(&fifo);
    assert_eq!((c.algo, c.proto), (Algo::OneShot, Proto::LL), "{c}");
    let c = reg.choose(CollKind::AllReduce, 8, 8, &Algo::ALL, &[Proto::Simple]);
    assert_eq!(c.algo, Algo::OneShot, "{c}");
    assert!(c.us() > best(&fifo).us() + 2.5, "{c}");
}

#[test]
fn old_sweeps_parse_as_registered_with_no_launch_floor() {
    let s = Selector::new(&Topology::preset("single-gpu", 1).unwrap(), &[0; 8]);
    let json = r#"{"nranks":8,"results":[
        {"coll":"allreduce","bytes":8,"algo":"oneshot","proto":"simple","time_us":20.0},
        {"coll":"allreduce","bytes":8,"algo":"ring","proto":"ll","time_us":30.0}]}"#;
    let sweep = parse_sweep(json).unwrap();
    assert!(sweep
        .results
        .iter()
        .all(|r| r.registered && r.channels == 1));
    assert_eq!(sweep.launch_floor_us, None);
    let consts = fit(&s, &sweep);
    // Without a floor, only what was measured is corrected.
    assert_eq!(consts.correction(Algo::TwoShot, Proto::Simple), (0.0, 1.0));
    assert_eq!(consts.correction(Algo::Ring, Proto::Simple), (0.0, 1.0));
    let p = s
        .clone()
        .with_constants(consts)
        .predict(CollKind::AllReduce, Algo::OneShot, Proto::Simple, 1, 8, 8)
        .unwrap();
    assert!((p - 20.0).abs() < 0.01, "{p}");
    // A registered point stays out of the FIFO view, whose one-shot takes
    // the ring's measured correction of that protocol instead.
    let fifo = fit_fifo(&s, &sweep);
    assert_eq!(
        fifo.correction(Algo::OneShot, Proto::LL),
        fifo.correction(Algo::Ring, Proto::LL)
    );
    assert_eq!(fifo.correction(Algo::OneShot, Proto::Simple), (0.0, 1.0));
}

/// The built-in calibration's first version (2026-12-02: large points,
/// three 8 B points from the `latency` example, the empty plan's floor),
/// kept as a fixture: the fitting tests below pin what `fit` and
/// `fit_fifo` make of those exact points, whatever the shipped file
/// holds now.
fn first_calibration() -> oxccl_topo::calibrate::Sweep {
    parse_sweep(include_str!("fixtures/h200-1gpu-8ranks-2026-12-02.json")).unwrap()
}

/// The built-in calibration for 8 ranks sharing one H200.
fn builtin() -> oxccl_topo::calibrate::Sweep {
    let one = Topology::preset("single-gpu", 1).unwrap();
    oxccl_topo::calibrate::builtin_for(&one, &[0; 8]).unwrap()
}

#[test]
fn direct_algorithms_get_a_channel_per_64_kib_only() {
    let (_, s) = hgx(1);
    let min = s.constants().direct_chan_min_bytes;
    assert_eq!(min, 65536.0);
    for bytes in [8usize, 4 << 10, 64 << 10, 100 << 10, 256 << 10, 1 << 30] {
        for algo in [Algo::OneShot, Algo::TwoShot] {
            let c = s.choose(CollKind::AllReduce, bytes, 8, &[algo], &[Proto::Simple]);
            let most = ((bytes as f64 / min) as u32).max(1);
            assert!(c.channels <= most, "{bytes} B: {c}");
            if bytes <= 64 << 10 {
                assert_eq!(c.channels, 1, "{bytes} B: {c}");
            }
        }
    }
    let c = s.choose(CollKind::AllReduce, 1 << 30, 8, &[Algo::TwoShot], &PROTOS);
    assert_eq!(c.channels, 16, "{c}");
}

#[test]
fn fifo_free_direct_plans_take_the_lowest_latency_under_simple() {
    let (_, s) = hgx(1);
    let fifo_free = s.clone().with_constants(oxccl_topo::consts::Constants {
        direct_fifo_free: true,
        ..s.constants().clone()
    });
    // Latency alone: no bytes, so LL's halved bandwidth does not count.
    let t = |s: &Selector, algo, proto| {
        s.predict(CollKind::AllReduce, algo, proto, 1, 0, 8)
            .unwrap()
    };
    // Generic model: Simple's FIFO handshake makes it slower than LL.
    assert!(t(&s, Algo::OneShot, Proto::Simple) > t(&s, Algo::OneShot, Proto::LL) + 1.0);
    // FIFO-free: the same latency under either protocol, LL's.
    let (simple, ll) = (
        t(&fifo_free, Algo::OneShot, Proto::Simple),
        t(&fifo_free, Algo::OneShot, Proto::LL),
    );
    assert!((simple - ll).abs() < 1e-9, "{simple} {ll}");
    // Ring and trees still go through FIFOs.
    assert_eq!(
        t(&fifo_free, Algo::Ring, Proto::Simple),
        t(&s, Algo::Ring, Proto::Simple)
    );
    assert!(!fifo_free.constants().for_fifo().direct_fifo_free);
    // choose_among keeps to the listed pairs.
    let c = fifo_free
        .choose_among(CollKind::AllReduce, 8, 8, &[(Algo::OneShot, Proto::Simple)])
        .unwrap();
    assert_eq!(
        (c.algo, c.proto, c.channels),
        (Algo::OneShot, Proto::Simple, 1)
    );
    assert!(s
        .choose_among(
            CollKind::AllReduce,
            8,
            8,
            &[(Algo::AllPairs, Proto::Simple)]
        )
        .is_none());
}

/// Registered all-pairs Broadcast and Reduce spread the root's share over
/// every rank (push, spread reduction), so per rank they move about what
/// they do at 8 ranks whatever the count; through FIFOs the root alone
/// sends or receives every peer's copy. On the H200 (docs/perf/LOG.md, 2026-12-04 20:28 H200, 64 MiB) the
/// model's old (n − 1) factor for both made the selector take the ring for
/// Broadcast from 32 ranks on: 29% of the floor at 32, 64 and 128 ranks.
#[test]
fn registered_rooted_all_pairs_cost_does_not_grow_with_the_rank_count() {
    let one = Topology::preset("single-gpu", 1).unwrap();
    let bytes = 64 << 20;
    for kind in [CollKind::Broadcast, CollKind::Reduce] {
        let at = |n: usize, channels: u32| {
            let policy = oxccl_topo::Policy::gpu(&one, &vec![0; n], channels);
            let c = policy.best(kind, bytes, true, &Algo::ALL, &PROTOS);
            let fifo = policy
                .selector(false, Algo::AllPairs, oxccl_topo::select::Transport::Fifo)
                .predict(
                    kind,
                    Algo::AllPairs,
                    Proto::Simple,
                    channels,
                    bytes,
                    n as u32,
                )
                .unwrap();
            (c, fifo)
        };
        let (c8, fifo8) = at(8, 16);
        for (n, channels) in [(32, 4), (64, 2), (128, 1)] {
            let (c, fifo) = at(n, channels);
            assert_eq!(
                (c.algo, c.is_direct()),
                (Algo::AllPairs, true),
                "{kind} {n}: {c}"
            );
            let ratio = c.us() / c8.us();
            assert!((0.9..1.3).contains(&ratio), "{kind} {n}: {c} against {c8}");
            // The FIFO plan still pays for the root's n − 1 copies.
            assert!(
                fifo > 3.0 * fifo8,
                "{kind} {n}: FIFO {fifo} against {fifo8}"
            );
        }
    }
}
