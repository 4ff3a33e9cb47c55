//! Golden tables: reduction results written independently of `Element`
//! arithmetic, against the sequential reference and the interpreter.
//!
//! Three sources agree: values worked out by hand (below, with the
//! rounding that makes each interesting), `testkit::model` (i128 and f64
//! with explicit rounding to each format), and `reference::expected` (the
//! `Element` arithmetic the interpreter and the host kernels share).

use oxccl_core::interp::{self, InterpOptions};
use oxccl_core::plan::BufId;
use oxccl_core::testkit::{self, model, Tolerance, OPS};
use oxccl_core::{
    gen, generate, reference, with_dtype, Algo, CollKind, Collective, DataType, Element,
    PlanRequest, RedOp,
};

/// Equal values, or both NaN (−0 equals +0).
fn same(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

/// One hand-computed case: three ranks' inputs (one row each) and the
/// AllReduce result, element by element.
struct Row {
    dt: DataType,
    op: RedOp,
    ranks: [[f64; 3]; 3],
    want: [f64; 3],
}

/// A value of the table: a decimal, `2^e`, `p/q` or `inf`, maybe negated.
fn value(s: &str) -> f64 {
    if let Some(v) = s.strip_prefix('-') {
        return -value(v);
    }
    if s == "inf" {
        return f64::INFINITY;
    }
    if let Some(e) = s.strip_prefix("2^") {
        return 2f64.powi(e.parse().unwrap());
    }
    if let Some((p, q)) = s.split_once('/') {
        return value(p) / value(q);
    }
    s.parse()
        .unwrap_or_else(|_| panic!("golden table: bad value {s:?}"))
}

fn three(s: &str) -> [f64; 3] {
    let v: Vec<f64> = s.split_whitespace().map(value).collect();
    v.try_into()
        .unwrap_or_else(|v| panic!("golden table: {v:?} is not three values"))
}

/// The rows of `tests/data/golden_allreduce.txt` (its header says how it
/// reads).
fn hand_rows() -> Vec<Row> {
    let mut inputs = std::collections::HashMap::new();
    let mut rows = Vec::new();
    let text = include_str!("data/golden_allreduce.txt");
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (head, vals) = line.split_once(':').expect("golden table: no ':'");
        let words: Vec<&str> = head.split_whitespace().collect();
        match words[..] {
            ["in", dt] => {
                let ranks: Vec<[f64; 3]> = vals.split('|').map(three).collect();
                let ranks: [[f64; 3]; 3] = ranks.try_into().expect("three ranks");
                inputs.insert(dt.to_string(), ranks);
            }
            [dt, op] => rows.push(Row {
                dt: dt.parse().unwrap(),
                op: op.parse().unwrap(),
                ranks: inputs[dt],
                want: three(vals),
            }),
            _ => panic!("golden table: bad line {line:?}"),
        }
    }
    rows
}

/// The reference's AllReduce of `ranks` in type `T`, as f64.
fn reference_allreduce<T: Element>(ranks: &[[f64; 3]], op: RedOp) -> Vec<f64> {
    let inputs: Vec<Vec<T>> = ranks
        .iter()
        .map(|r| r.iter().map(|&v| T::from_f64(v)).collect())
        .collect();
    for (row, t) in ranks.iter().zip(&inputs) {
        for (&v, x) in row.iter().zip(t) {
            assert_eq!(x.to_f64(), v, "{}: input {v} is not a value", T::DTYPE);
        }
    }
    let coll = Collective::new(CollKind::AllReduce, 3, 0);
    let lowered = op.lower(T::DTYPE, ranks.len() as u32);
    reference::expected(&coll, &inputs, &lowered)[0]
        .as_ref()
        .expect("AllReduce defines every output")
        .iter()
        .map(|x| x.to_f64())
        .collect()
}

#[test]
fn hand_table_matches_model_and_reference() {
    let rows = hand_rows();
    for r in &rows {
        let got = with_dtype!(r.dt, T => reference_allreduce::<T>(&r.ranks, r.op));
        for i in 0..3 {
            let col: Vec<f64> = r.ranks.iter().map(|v| v[i]).collect();
            let m = model::reduce(r.dt, r.op, &col);
            let what = format!("{} {:?} element {i} {col:?}", r.dt, r.op);
            assert!(same(m, r.want[i]), "{what}: model {m}, hand {}", r.want[i]);
            assert!(
                same(got[i], r.want[i]),
                "{what}: reference {}, hand {}",
                got[i],
                r.want[i]
            );
        }
    }
    println!("{} hand rows × 3 elements agree", rows.len());
}

/// Reference vs model on `inputs` for a reduction collective.
fn check_reduction<T: Element>(coll: &Collective, inputs: &[Vec<T>], op: RedOp) -> usize {
    let n = inputs.len();
    let c = coll.count;
    let exp = reference::expected(coll, inputs, &op.lower(T::DTYPE, n as u32));
    let mut checked = 0;
    for (r, e) in exp.iter().enumerate() {
        let Some(e) = e else { continue };
        let b = if coll.kind == CollKind::ReduceScatter {
            r
        } else {
            0
        };
        for (i, x) in e.iter().enumerate() {
            let col: Vec<f64> = inputs.iter().map(|v| v[b * c + i].to_f64()).collect();
            let m = model::reduce(T::DTYPE, op, &col);
            assert!(
                same(x.to_f64(), m),
                "{} {} {op:?} n={n} rank {r} element {i} {col:?}: reference {x:?}, model {m}",
                T::DTYPE,
                coll.kind
            );
            checked += 1;
        }
    }
    checked
}

fn ops() -> Vec<RedOp> {
    let mut v = OPS.to_vec();
    v.push(RedOp::PreMulSum(0.3));
    v
}

#[test]
fn model_matches_reference_on_testkit_inputs() {
    let mut checked = 0;
    for dt in DataType::ALL {
        for op in ops() {
            for n in [1u32, 2, 3, 4, 5, 8, 16, 33] {
                for kind in [CollKind::AllReduce, CollKind::ReduceScatter] {
                    let coll = Collective::new(kind, 2 * n as usize + 5, 0);
                    checked += with_dtype!(dt, T => {
                        let ins: Vec<Vec<T>> =
                            (0..n).map(|r| testkit::input(&coll, n, r, op, 3)).collect();
                        check_reduction(&coll, &ins, op)
                    });
                }
            }
        }
    }
    println!("{checked} elements: reference = model");
}

/// Values that round: floats with fractional parts over a few binades;
/// integers over the whole range, so sums and products wrap (64-bit ones
/// multiples of 2^11, which f64 holds exactly).
fn random_value<T: Element>(x: u64) -> T {
    let dt = T::DTYPE;
    let unit = (x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
    let v = match dt {
        DataType::F8E4M3 | DataType::F8E5M2 => unit * 20.0,
        DataType::F16 | DataType::Bf16 => unit * 1000.0,
        DataType::F32 | DataType::F64 => unit * 1e6,
        DataType::I8 => f64::from(x as i8),
        DataType::U8 => f64::from(x as u8),
        DataType::I32 => f64::from(x as i32),
        DataType::U32 => f64::from(x as u32),
        DataType::I64 => ((x as i64) & !0x7FF) as f64,
        _ => (x & !0x7FF) as f64,
    };
    T::from_f64(v)
}

#[test]
fn model_matches_reference_on_rounding_values() {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut checked = 0;
    for dt in DataType::ALL {
        for op in ops() {
            for n in [2u32, 3, 5, 8] {
                let coll = Collective::new(CollKind::AllReduce, 64, 0);
                checked += with_dtype!(dt, T => {
                    let ins: Vec<Vec<T>> = (0..n)
                        .map(|_| (0..64).map(|_| {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            random_value::<T>(x)
                        }).collect())
                        .collect();
                    check_reduction(&coll, &ins, op)
                });
            }
        }
    }
    println!("{checked} elements: reference = model");
}

/// Every generator of a reduction, run by the interpreter on testkit
/// inputs: exact cases equal the model bit for bit, rounded ones lie
/// within the rounding bound of the model's terms.
#[test]
fn interpreter_matches_model() {
    let mut exact = 0;
    let mut rounded = 0;
    for kind in [
        CollKind::AllReduce,
        CollKind::Reduce,
        CollKind::ReduceScatter,
    ] {
        for algo in Algo::ALL.into_iter().filter(|&a| gen::supports(a, kind)) {
            for n in [1u32, 2, 3, 4, 5, 8] {
                let mut req =
                    PlanRequest::new(Collective::new(kind, 3 * n as usize + 2, 0), n, algo);
                req.chunk = 3;
                req.channels = 2;
                let Ok(plan) = generate(&req) else { continue };
                for dt in DataType::ALL {
                    for op in ops()
                        .into_iter()
                        .filter(|o| o.undefined_reason(dt).is_none())
                    {
                        let (e, r) = with_dtype!(dt, T => interp_vs_model::<T>(&req, &plan, op));
                        exact += e;
                        rounded += r;
                    }
                }
            }
        }
    }
    println!("interpreter = model: {exact} elements exactly, {rounded} within the bound");
    assert!(exact > 0 && rounded > 0);
}

fn interp_vs_model<T: Element>(
    req: &PlanRequest,
    plan: &oxccl_core::Plan,
    op: RedOp,
) -> (usize, usize) {
    let n = req.nranks;
    let coll = req.coll;
    let c = coll.count;
    let inputs: Vec<Vec<T>> = (0..n).map(|r| testkit::input(&coll, n, r, op, 9)).collect();
    let mut mem = interp::memories(plan, &inputs, false);
    interp::run(
        plan,
        &mut mem,
        &op.lower(T::DTYPE, n),
        &InterpOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{req:?}: {e}"));
    let tol = testkit::tolerance(T::DTYPE, op, n);
    let scale = T::from_f64(op.lower(T::DTYPE, n).pre_scale.unwrap_or(1.0)).to_f64();
    let (mut exact, mut rounded) = (0, 0);
    for (r, m) in mem.iter().enumerate() {
        if !coll.writes_output(r as u32) {
            continue;
        }
        let out: Vec<T> = m.read_buf(BufId::OUTPUT);
        let b = if coll.kind == CollKind::ReduceScatter {
            r
        } else {
            0
        };
        for (i, g) in out.iter().enumerate() {
            let col: Vec<f64> = inputs.iter().map(|v| v[b * c + i].to_f64()).collect();
            let what = format!(
                "{} {} {op:?} {req:?} rank {r} element {i}",
                T::DTYPE,
                coll.kind
            );
            if tol == Tolerance::Exact {
                let m = model::reduce(T::DTYPE, op, &col);
                assert!(same(g.to_f64(), m), "{what}: interpreter {g:?}, model {m}");
                exact += 1;
            } else {
                let (center, bound) = testkit::rounding_bound(T::DTYPE, col.into_iter(), scale);
                assert!(
                    (g.to_f64() - center).abs() <= bound,
                    "{what}: interpreter {g:?}, model {center} ± {bound}"
                );
                rounded += 1;
            }
        }
    }
    (exact, rounded)
}
