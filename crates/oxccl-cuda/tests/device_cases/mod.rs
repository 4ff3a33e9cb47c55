//! What `every_case_on_the_device` runs, decided without a GPU: the
//! `OXCCL_GPU_*` variables (parsed strictly: a bad value is an error, never
//! zero cases) and the list of cases for a rank count, with every plan
//! generated up front (a generation error fails the test, it is not
//! skipped). The list's length is checked against a count derived from the
//! filter alone, so a case that silently drops out is noticed; the CPU
//! tests below hold both to account on machines without a GPU.

use std::collections::HashMap;
use std::sync::Arc;

use oxccl_core::gen::{generate, supports, PlanRequest};
use oxccl_core::plan::Plan;
use oxccl_core::testkit::{COLLECTIVES, OPS};
use oxccl_core::{Algo, CollKind, Collective, DataType, Proto, RedOp};
use oxccl_cuda::encode;

/// The variables GPU tests read; any other `OXCCL_GPU_*` is a typo.
const KNOWN: [&str; 4] = [
    "OXCCL_GPU_RANKS",
    "OXCCL_GPU_DTYPE",
    "OXCCL_GPU_QUICK",
    "OXCCL_GPU_BIG",
];

/// Rank counts a device run may ask for (8 ranks per GPU is the most any
/// run uses; 64 leaves room for several GPUs).
const MAX_RANKS: u32 = 64;

/// The element count of every case: not divisible by any rank count > 1.
pub const COUNT: usize = 1001;

/// The device suite's filter, from the `OXCCL_GPU_*` variables.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuEnv {
    /// `OXCCL_GPU_RANKS` (`1,2,3,4,8`): the rank counts, default `1,2,3,4,8`.
    pub ranks: Vec<u32>,
    /// `OXCCL_GPU_DTYPE` (`f32` or `float,bf16`): only these data types.
    pub dtypes: Option<Vec<DataType>>,
    /// `OXCCL_GPU_QUICK=1`: f32 and bf16, the first op only (sanitizer runs).
    pub quick: bool,
    /// `OXCCL_GPU_BIG=1`: add 256 MiB per rank to the size sweep.
    pub big: bool,
}

impl Default for GpuEnv {
    fn default() -> Self {
        GpuEnv {
            ranks: vec![1, 2, 3, 4, 8],
            dtypes: None,
            quick: false,
            big: false,
        }
    }
}

impl GpuEnv {
    /// The process's `OXCCL_GPU_*` variables.
    ///
    /// # Panics
    /// On any bad value or unknown `OXCCL_GPU_*` name: the test fails.
    pub fn from_env() -> GpuEnv {
        let vars = std::env::vars_os()
            .filter(|(k, _)| k.to_string_lossy().starts_with("OXCCL_GPU_"))
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.to_string_lossy().into_owned(),
                )
            });
        GpuEnv::from_vars(vars).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Parses `OXCCL_GPU_*` pairs (a pure function, tested below).
    pub fn from_vars(vars: impl IntoIterator<Item = (String, String)>) -> Result<GpuEnv, String> {
        let mut env = GpuEnv::default();
        for (k, v) in vars {
            let bad = |why: String| format!("{k}={v:?}: {why}");
            match k.as_str() {
                "OXCCL_GPU_RANKS" => {
                    let mut ranks = Vec::new();
                    for item in v.split(',') {
                        let n: u32 = item
                            .trim()
                            .parse()
                            .map_err(|e| bad(format!("{item:?} is not a rank count ({e})")))?;
                        if !(1..=MAX_RANKS).contains(&n) {
                            return Err(bad(format!("{n} ranks: expected 1 to {MAX_RANKS}")));
                        }
                        if ranks.contains(&n) {
                            return Err(bad(format!("{n} is listed twice")));
                        }
                        ranks.push(n);
                    }
                    env.ranks = ranks;
                }
                "OXCCL_GPU_DTYPE" => {
                    let dts = v
                        .split(',')
                        .map(|d| d.trim().parse::<DataType>().map_err(|e| bad(e.to_string())))
                        .collect::<Result<Vec<_>, _>>()?;
                    env.dtypes = Some(dts);
                }
                "OXCCL_GPU_QUICK" => env.quick = flag(&v).map_err(bad)?,
                "OXCCL_GPU_BIG" => env.big = flag(&v).map_err(bad)?,
                _ => {
                    return Err(format!(
                        "unknown variable {k}; the GPU tests read {}",
                        KNOWN.join(", ")
                    ))
                }
            }
        }
        Ok(env)
    }

    /// The data types to run.
    pub fn dtypes(&self) -> Vec<DataType> {
        match &self.dtypes {
            Some(d) => d.clone(),
            None if self.quick => vec![DataType::F32, DataType::Bf16],
            None => DataType::ALL.to_vec(),
        }
    }

    /// The ops to run for `kind` on `dt` (only defined pairs).
    pub fn ops(&self, kind: CollKind, dt: DataType) -> Vec<RedOp> {
        let ops: &[RedOp] = if kind.is_reduction() && !self.quick {
            &OPS
        } else {
            &OPS[..1]
        };
        ops.iter()
            .copied()
            .filter(|o| o.undefined_reason(dt).is_none())
            .collect()
    }
}

fn flag(v: &str) -> Result<bool, String> {
    match v.trim() {
        "1" => Ok(true),
        "0" => Ok(false),
        _ => Err("expected 1 or 0".into()),
    }
}

/// One case of the device suite.
#[derive(Clone, Debug)]
pub struct Case {
    pub kind: CollKind,
    pub algo: Algo,
    pub registered: bool,
    pub dt: DataType,
    pub op: RedOp,
    pub in_place: bool,
    pub proto: Proto,
    pub plan: Arc<Plan>,
}

impl std::fmt::Display for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} reg={} {} {} in_place={} {}",
            self.kind, self.algo, self.registered, self.dt, self.op, self.in_place, self.proto
        )
    }
}

/// What plans depend on in a clique: its rank count, how many channels
/// (blocks) it can run and its FIFO slot size.
#[derive(Clone, Copy, Debug)]
pub struct Clique {
    pub n: u32,
    pub max_channels: u32,
    pub slot_bytes: usize,
}

/// The plan request the device tests make: root `n - 1` for rooted
/// collectives, at most 4 channels, the FIFO slot as the piece size.
pub fn request(
    Clique {
        n,
        max_channels,
        slot_bytes,
    }: Clique,
    kind: CollKind,
    count: usize,
    algo: Algo,
    (in_place, registered): (bool, bool),
    elem: usize,
) -> PlanRequest {
    let root = if kind.has_root() { n - 1 } else { 0 };
    PlanRequest {
        channels: max_channels.min(4),
        chunk: (slot_bytes / elem).max(1),
        in_place,
        registered,
        ..PlanRequest::new(Collective::new(kind, count, root), n, algo)
    }
}

/// The FIFO protocols a plan can run under: both when it has FIFO
/// connections, else only Simple (the protocol changes nothing then).
pub fn protos_for(plan: &Plan) -> Result<&'static [Proto], String> {
    let mut fifo = false;
    for r in &plan.ranks {
        let e = encode::encode(r).map_err(|e| format!("rank {}: encode: {e}", r.rank))?;
        fifo |= !e.conns.is_empty();
    }
    Ok(if fifo {
        &[Proto::Simple, Proto::LL]
    } else {
        &[Proto::Simple]
    })
}

/// Every collective × algorithm (FIFO, and registered where the plan uses
/// registration) × dtype × op × in-place × protocol the filter asks for on
/// `n` ranks. Any generation or encoding error is returned, never skipped.
pub fn cases(clique: Clique, env: &GpuEnv) -> Result<Vec<Case>, String> {
    let n = clique.n;
    let mut out = Vec::new();
    // Plans depend on the element size, not on the type or op.
    let mut plans: HashMap<(CollKind, Algo, bool, bool, usize), Arc<Plan>> = HashMap::new();
    for kind in COLLECTIVES {
        for algo in Algo::ALL.into_iter().filter(|&a| device_case_algo(a, kind)) {
            for registered in [false, true] {
                for dt in env.dtypes() {
                    for op in env.ops(kind, dt) {
                        for in_place in [false, true] {
                            let key = (kind, algo, in_place, registered, dt.size());
                            let plan = match plans.get(&key) {
                                Some(p) => p.clone(),
                                None => {
                                    let req = request(
                                        clique,
                                        kind,
                                        COUNT,
                                        algo,
                                        (in_place, registered),
                                        dt.size(),
                                    );
                                    let p = generate(&req).map_err(|e| {
                                        format!("{n} ranks {kind} {algo} reg={registered} in_place={in_place}: {e}")
                                    })?;
                                    plans.entry(key).or_insert(Arc::new(p)).clone()
                                }
                            };
                            // A registered request whose plan needs no
                            // registration is the FIFO case again.
                            if registered && !plan.ranks.iter().any(|r| r.needs_registration()) {
                                continue;
                            }
                            for &proto in protos_for(&plan)? {
                                out.push(Case {
                                    kind,
                                    algo,
                                    registered,
                                    dt,
                                    op,
                                    in_place,
                                    proto,
                                    plan: plan.clone(),
                                });
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(out)
}

/// The algorithms the device cases cover for `kind`: every one serving
/// it but the copy-engine algorithm, whose plans are the registered
/// all-pairs plans with one destination per step (no FIFO form and none on
/// one rank); the facade's `collectives` suite runs it on the GPU.
fn device_case_algo(algo: Algo, kind: CollKind) -> bool {
    supports(algo, kind) && algo != Algo::CopyEngine
}

/// How many cases [`cases`] must list, from the filter alone: per
/// collective × supported algorithm × dtype × op × in-place, the FIFO
/// plan under Simple and LL (Simple only on one rank, where no plan has a
/// connection) plus, for the algorithms with a registered form (one-shot,
/// two-shot, all-pairs) from two ranks, that plan under Simple.
pub fn expected_cases(n: u32, env: &GpuEnv) -> usize {
    let mut total = 0;
    for kind in COLLECTIVES {
        for algo in Algo::ALL.into_iter().filter(|&a| device_case_algo(a, kind)) {
            let fifo = if n > 1 { 2 } else { 1 };
            let registered = usize::from(
                n > 1 && matches!(algo, Algo::OneShot | Algo::TwoShot | Algo::AllPairs),
            );
            for dt in env.dtypes() {
                total += env.ops(kind, dt).len() * 2 * (fifo + registered);
            }
        }
    }
    total
}

fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn gpu_variables_parse_strictly() {
    assert_eq!(GpuEnv::from_vars(vars(&[])), Ok(GpuEnv::default()));
    let env = GpuEnv::from_vars(vars(&[
        ("OXCCL_GPU_RANKS", "2, 8"),
        ("OXCCL_GPU_DTYPE", "float,bf16"),
        ("OXCCL_GPU_QUICK", "1"),
        ("OXCCL_GPU_BIG", "0"),
    ]))
    .unwrap();
    assert_eq!(env.ranks, vec![2, 8]);
    assert_eq!(env.dtypes(), vec![DataType::F32, DataType::Bf16]);
    assert!(env.quick && !env.big);
    for (k, v, says) in [
        ("OXCCL_GPU_RANKS", "", "not a rank count"),
        ("OXCCL_GPU_RANKS", "2;4", "not a rank count"),
        ("OXCCL_GPU_RANKS", "2,,4", "not a rank count"),
        ("OXCCL_GPU_RANKS", "0", "expected 1 to 64"),
        ("OXCCL_GPU_RANKS", "65", "expected 1 to 64"),
        ("OXCCL_GPU_RANKS", "4,4", "twice"),
        ("OXCCL_GPU_DTYPE", "float33", "float33"),
        ("OXCCL_GPU_DTYPE", "", "unknown"),
        ("OXCCL_GPU_QUICK", "yes", "expected 1 or 0"),
        ("OXCCL_GPU_BIG", "", "expected 1 or 0"),
        ("OXCCL_GPU_DTYPES", "f32", "unknown variable"),
        ("OXCCL_GPU_RANK", "2", "unknown variable"),
    ] {
        let e = GpuEnv::from_vars(vars(&[(k, v)])).unwrap_err();
        assert!(e.contains(k) && e.contains(says), "{k}={v:?}: {e}");
    }
}

/// Every plan of the default and the quick filter generates and encodes
/// on every rank count of a device run, the list has exactly the derived
/// length, and every supported (collective, algorithm) pair is in it.
#[test]
fn device_case_lists_are_complete() {
    let slot =
        oxccl_cuda::WorldConfig::round_robin(1, 1, std::time::Duration::from_secs(1)).slot_bytes;
    let quick = GpuEnv {
        quick: true,
        ..GpuEnv::default()
    };
    let one = GpuEnv {
        dtypes: Some(vec![DataType::F8E5M2]),
        ..GpuEnv::default()
    };
    for env in [GpuEnv::default(), quick, one] {
        for n in [1, 2, 3, 4, 8] {
            let clique = Clique {
                n,
                max_channels: 4,
                slot_bytes: slot,
            };
            let list = cases(clique, &env).unwrap();
            assert_eq!(list.len(), expected_cases(n, &env), "{n} ranks, {env:?}");
            for kind in COLLECTIVES {
                for algo in Algo::ALL.into_iter().filter(|&a| device_case_algo(a, kind)) {
                    assert!(
                        list.iter().any(|c| (c.kind, c.algo) == (kind, algo)),
                        "{n} ranks: no {kind} {algo} case"
                    );
                }
            }
        }
    }
    // Pinned: the counts of the device runs in docs/perf/LOG.md (1 rank
    // 2316, 2 or more 5376; quick 100 / 236; the one-step LL AllReduce
    // added 156 / 312, before it 2160 / 5064). A change to the
    // collectives, generators or testkit::OPS that moves them must say so
    // here.
    let quick = GpuEnv {
        quick: true,
        ..GpuEnv::default()
    };
    for (n, full, short) in [(1, 2316, 100), (2, 5376, 236), (8, 5376, 236)] {
        assert_eq!(expected_cases(n, &GpuEnv::default()), full, "{n} ranks");
        assert_eq!(expected_cases(n, &quick), short, "{n} ranks, quick");
    }
}
