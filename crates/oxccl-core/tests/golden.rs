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

const P2: RedOp = RedOp::PreMulSum(2.0);

/// One hand-computed case: three ranks' inputs (one row each) and the
/// AllReduce result, element by element.
struct Row {
    dt: DataType,
    op: RedOp,
    ranks: [[f64; 3]; 3],
    want: [f64; 3],
}

const fn row(dt: DataType, op: RedOp, ranks: [[f64; 3]; 3], want: [f64; 3]) -> Row {
    Row {
        dt,
        op,
        ranks,
        want,
    }
}

const INF: f64 = f64::INFINITY;

fn hand_rows() -> Vec<Row> {
    use DataType::*;
    use RedOp::*;
    let p = |e: i32| 2f64.powi(e);
    let i8_in = [[100.0, -7.0, 3.0], [50.0, 2.0, -128.0], [-20.0, 9.0, 5.0]];
    let u8_in = [[200.0, 7.0, 3.0], [100.0, 2.0, 255.0], [10.0, 9.0, 5.0]];
    let i32_in = [[2e9, -1.0, 7.0], [2e9, 1.0, 3.0], [1.0, -5.0, -2.0]];
    let f16_in = [
        [2048.0, 1.0, 65504.0],
        [1.0, p(-11), 16.0],
        [1.0, p(-11), 1.0],
    ];
    let bf16_in = [[256.0, 1.0, 3.0], [1.0, p(-8), 5.0], [1.0, p(-8), 7.0]];
    let e4_in = [[16.0, 1.0, 192.0], [1.0, 0.125, 288.0], [1.0, 0.125, 1.0]];
    let e5_in = [[8.0, 1.0, 0.25], [1.0, 0.25, 3.0], [1.0, 0.25, 5.0]];
    let f32_in = [
        [p(24), 1.0, 1.0],
        [1.0, p(-24), p(-30)],
        [1.0, p(-24), -1.0],
    ];
    let f64_in = [
        [p(53), 1.0, 1.0],
        [1.0, p(-53), p(-60)],
        [1.0, p(-53), -1.0],
    ];
    vec![
        // i8 wraps: 100 + 50 − 20 = 130 → −126; 3·(−128)·5 = −1920 → −128.
        row(I8, Sum, i8_in, [-126.0, 4.0, -120.0]),
        row(I8, Prod, i8_in, [96.0, -126.0, -128.0]),
        row(I8, Max, i8_in, [100.0, 9.0, 5.0]),
        row(I8, Min, i8_in, [-20.0, -7.0, -128.0]),
        // Avg divides the wrapped sum, truncating toward zero.
        row(I8, Avg, i8_in, [-42.0, 1.0, -40.0]),
        // Each term doubled and wrapped first: 200 → −56; −256 → 0.
        row(I8, P2, i8_in, [4.0, 8.0, 16.0]),
        row(U8, Sum, u8_in, [54.0, 18.0, 7.0]),
        row(U8, Prod, u8_in, [64.0, 126.0, 241.0]),
        row(U8, Max, u8_in, [200.0, 9.0, 255.0]),
        row(U8, Min, u8_in, [10.0, 2.0, 3.0]),
        row(U8, Avg, u8_in, [18.0, 6.0, 2.0]),
        row(U8, P2, u8_in, [108.0, 36.0, 14.0]),
        // 4e9 + 1 wraps to −294 967 295.
        row(I32, Sum, i32_in, [-294_967_295.0, -5.0, 8.0]),
        row(I32, Avg, i32_in, [-98_322_431.0, -1.0, 2.0]),
        row(I32, Max, i32_in, [2e9, 1.0, 7.0]),
        row(I32, Min, i32_in, [1.0, -5.0, -2.0]),
        // f16: 2048 + 1 ties to 2048 (another order gives 2050); 65504 + 16
        // ties up to 65536, which overflows.
        row(F16, Sum, f16_in, [2048.0, 1.0, INF]),
        row(F16, Prod, f16_in, [2048.0, p(-22), INF]),
        row(F16, Max, f16_in, [2048.0, 1.0, 65504.0]),
        row(F16, Min, f16_in, [1.0, p(-11), 1.0]),
        // 1/3 → 1365/4096. 682.5 + s → 683; + s → 683.5. s + 1365·2^-23
        // → 1366/4096, then 1367/4096. 65504·s → 21824, + 5.33 and + s stay.
        row(F16, Avg, f16_in, [683.5, 1367.0 / 4096.0, 21824.0]),
        // 4096 + 2 ties to 4096; 2 + 2^-10 ties to 2; 2·65504 overflows.
        row(F16, P2, f16_in, [4096.0, 2.0, INF]),
        row(Bf16, Sum, bf16_in, [256.0, 1.0, 15.0]),
        row(Bf16, Prod, bf16_in, [256.0, p(-16), 105.0]),
        row(Bf16, Max, bf16_in, [256.0, 1.0, 7.0]),
        row(Bf16, Min, bf16_in, [1.0, p(-8), 3.0]),
        // E4M3: 17 ties to 16; 192 + 288 = 480 saturates to 448.
        row(F8E4M3, Sum, e4_in, [16.0, 1.25, 448.0]),
        row(F8E4M3, Prod, e4_in, [16.0, p(-6), 448.0]),
        row(F8E4M3, Max, e4_in, [16.0, 1.0, 288.0]),
        row(F8E4M3, Min, e4_in, [1.0, 0.125, 1.0]),
        // 1/3 → 0.34375. 5.5 + s → 6, + s → 6.5. s + 0.04296875 → 0.375,
        // then 0.40625. 192·s = 66 → 64, 288·s = 99 → 96; 160 + s → 160.
        row(F8E4M3, Avg, e4_in, [6.5, 0.40625, 160.0]),
        // E5M2: 9 ties to 8; 3.25 ties to 3; 0.75·5 = 3.75 ties to 4.
        row(F8E5M2, Sum, e5_in, [8.0, 1.5, 8.0]),
        row(F8E5M2, Prod, e5_in, [8.0, 0.0625, 4.0]),
        row(F8E5M2, Max, e5_in, [8.0, 1.0, 5.0]),
        row(F8E5M2, Min, e5_in, [1.0, 0.25, 0.25]),
        // f32/f64: 2^p + 1 ties down; 1 + 2^-30 rounds to 1, then − 1 = 0.
        row(F32, Sum, f32_in, [p(24), 1.0, 0.0]),
        row(F32, Prod, f32_in, [p(24), p(-48), -p(-30)]),
        row(F32, Max, f32_in, [p(24), 1.0, 1.0]),
        row(F32, Min, f32_in, [1.0, p(-24), -1.0]),
        row(F64, Sum, f64_in, [p(53), 1.0, 0.0]),
        row(F64, Prod, f64_in, [p(53), p(-106), -p(-60)]),
        row(F64, Max, f64_in, [p(53), 1.0, 1.0]),
        row(F64, Min, f64_in, [1.0, p(-53), -1.0]),
    ]
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
