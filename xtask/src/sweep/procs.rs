//! The sweep with ranks as processes: `--procs N` launches N
//! copies of this program as one rank each (torchrun's variables, root on
//! a free local port), and `--from-env` is one such rank, whoever launched
//! it (torchrun, mpirun, Slurm, or `--procs`).
//!
//! A rank measures and checks its own part of each row: its output
//! against the sequential reference (every rank's input is a pure
//! function of the row, so each process can compute them all), its send
//! buffer and guard unchanged. The ranks then swap `(time, wrong, first
//! fault)` over the bootstrap (`Communicator::exchange`: host sockets, not
//! the data path under test), so every rank holds the slowest time and the
//! total of wrong elements, and rank 0 prints the same table the threads
//! print. Barriers between phases are bootstrap exchanges too.

use std::process::{Child, Command, Stdio};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use oxccl::core::testkit;
use oxccl::core::Collective;
use oxccl::{CollKind, Communicator, Element, RedOp};

use super::measure::{Case, Measured};
use super::pools::Pool;
use super::{check, rank::rank_run};

/// Where the ranks of one row wait for each other between phases.
pub(crate) trait Meet: Sync {
    fn meet(&self);
}

impl Meet for Barrier {
    fn meet(&self) {
        self.wait();
    }
}

/// A barrier of a process clique: an empty exchange over the bootstrap.
/// An error (a lost peer) lets the rank through: its next call fails and
/// names the peer.
struct ProcMeet<'a>(&'a Communicator);

impl Meet for ProcMeet<'_> {
    fn meet(&self) {
        let _ = self.0.exchange(&[]);
    }
}

/// One rank's row, then every rank's result swapped: see the module docs.
pub(super) fn measure_rank<T: Element>(
    c: &Communicator,
    pool: &mut Pool<T>,
    case: Case<'_>,
    run: &check::Runner<T>,
) -> anyhow::Result<Measured> {
    let (coll, op, a) = (case.coll, case.op, case.a);
    let (n, me) = (c.nranks(), c.rank());
    let nrow = case
        .nccl
        .row::<T>(coll, op, n, a.warmup, a.iters, a.check != 0);
    let slot = pool.first_mut().context("sweep buffers missing")?;
    let bufs = slot.take().context("sweep buffers missing")?;
    // Peers' inputs serve only the check: unchecked, each process makes
    // its own (at 256 MiB, every process making all n took longer than
    // the collectives themselves).
    let inputs: Vec<Vec<T>> = (0..n)
        .map(|r| {
            if a.check != 0 || r == me {
                testkit::input::<T>(coll, n, r, op, 1)
            } else {
                Vec::new()
            }
        })
        .collect();
    let meet = ProcMeet(c);
    let r = rank_run(c, &bufs, case, &inputs[me as usize], &meet, &nrow, run);
    *slot = Some(bufs);
    let mine = match r {
        Ok(done) => {
            let (w, f) = if a.check == 0 {
                (0, None)
            } else {
                own_check(coll, &inputs, me, done.out, op)
            };
            Record {
                time_ns: done.time.as_nanos() as u64,
                laps_ns: done.laps.iter().map(|l| l.as_nanos() as u64).collect(),
                wrong: w + done.outside.0,
                fault: f.or(done.outside.1),
                error: None,
            }
        }
        Err(e) => Record {
            time_ns: 0,
            laps_ns: Vec::new(),
            wrong: 0,
            fault: None,
            error: Some(format!("{e:#}")),
        },
    };
    let all = c
        .exchange(&mine.encode())
        .context("gathering the ranks' results")?;
    let recs = all
        .iter()
        .enumerate()
        .map(|(r, b)| Record::decode(b).with_context(|| format!("rank {r}'s result")))
        .collect::<anyhow::Result<Vec<Record>>>()?;
    if let Some((r, e)) = recs
        .iter()
        .enumerate()
        .find_map(|(r, x)| x.error.as_ref().map(|e| (r, e)))
    {
        bail!("rank {r}: {e}");
    }
    let slowest = recs.iter().max_by_key(|x| x.time_ns);
    let time = slowest.map_or(0, |x| x.time_ns);
    if me == 0 {
        let laps: Vec<Duration> = slowest
            .map(|x| x.laps_ns.iter().map(|&l| Duration::from_nanos(l)).collect())
            .unwrap_or_default();
        super::measure::print_spread(coll, case.in_place, &laps);
    }
    Ok(Measured {
        time: Duration::from_nanos(time),
        wrong: recs.iter().map(|x| x.wrong).sum(),
        first_wrong: recs.into_iter().find_map(|x| x.fault),
        nccl: nrow.finish(&inputs),
    })
}

/// Wrong elements of rank `me`'s output, the other ranks' outputs taken
/// as the reference's (each process checks its own).
fn own_check<T: Element>(
    coll: &Collective,
    inputs: &[Vec<T>],
    me: u32,
    out: Vec<T>,
    op: RedOp,
) -> (u64, Option<String>) {
    let outputs = oxccl::core::testkit::own_outputs(coll, inputs, me, out, op);
    if coll.kind == CollKind::SendRecv {
        super::check_sendrecv(inputs, &outputs)
    } else {
        check::compare_parallel(coll, inputs, &outputs, op)
    }
}

/// One rank's result of a row, as it travels.
#[derive(Debug, PartialEq)]
struct Record {
    time_ns: u64,
    /// Every timed call, sorted (for `OXCCL_SWEEP_SPREAD`, printed by rank 0).
    laps_ns: Vec<u64>,
    wrong: u64,
    fault: Option<String>,
    error: Option<String>,
}

impl Record {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&self.time_ns.to_le_bytes());
        v.extend_from_slice(&(self.laps_ns.len() as u32).to_le_bytes());
        for l in &self.laps_ns {
            v.extend_from_slice(&l.to_le_bytes());
        }
        v.extend_from_slice(&self.wrong.to_le_bytes());
        for s in [&self.fault, &self.error] {
            let b = s.as_deref().map_or(&[][..], str::as_bytes);
            let b = &b[..b.len().min(4096)];
            v.push(u8::from(s.is_some()));
            v.extend_from_slice(&(b.len() as u32).to_le_bytes());
            v.extend_from_slice(b);
        }
        v
    }

    fn decode(b: &[u8]) -> anyhow::Result<Record> {
        fn take<'a>(b: &mut &'a [u8], n: usize) -> anyhow::Result<&'a [u8]> {
            let (h, t) = b
                .split_at_checked(n)
                .with_context(|| format!("truncated: {n} more bytes expected"))?;
            *b = t;
            Ok(h)
        }
        let mut b = b;
        let u64_at = |b: &mut &[u8]| -> anyhow::Result<u64> {
            Ok(u64::from_le_bytes(take(b, 8)?.try_into()?))
        };
        let time_ns = u64_at(&mut b)?;
        let laps = u32::from_le_bytes(take(&mut b, 4)?.try_into()?) as usize;
        if laps > b.len() / 8 {
            bail!("{laps} laps in {} bytes", b.len());
        }
        let laps_ns = (0..laps)
            .map(|_| u64_at(&mut b))
            .collect::<anyhow::Result<Vec<u64>>>()?;
        let wrong = u64_at(&mut b)?;
        let mut text = || -> anyhow::Result<Option<String>> {
            let some = take(&mut b, 1)?[0] != 0;
            let len = u32::from_le_bytes(take(&mut b, 4)?.try_into()?) as usize;
            let s = String::from_utf8_lossy(take(&mut b, len)?).into_owned();
            Ok(some.then_some(s))
        };
        let fault = text()?;
        let error = text()?;
        if !b.is_empty() {
            bail!("{} bytes past the end", b.len());
        }
        Ok(Record {
            time_ns,
            laps_ns,
            wrong,
            fault,
            error,
        })
    }
}

/// How long the other ranks get to fail on their own, after one rank has
/// failed, before they are killed (their waits have the configured
/// deadline, which may be longer).
const GRACE: Duration = Duration::from_secs(60);

/// `--procs LIST`: one sweep per entry, each with that many processes.
pub(super) fn launch(list: &str) -> anyhow::Result<()> {
    let counts = list
        .split(',')
        .map(|s| s.trim().parse::<u32>().ok().filter(|&n| n >= 1))
        .collect::<Option<Vec<u32>>>()
        .with_context(|| format!("--procs {list:?}: expected a comma list of rank counts >= 1"))?;
    let args = child_args(std::env::args().skip(1));
    let exe = std::env::current_exe().context("finding this program")?;
    for n in counts {
        let port = free_port()?;
        let secret = launch_secret()?;
        let mut kids: Vec<(u32, Child)> = Vec::new();
        for r in 0..n {
            let mut cmd = Command::new(&exe);
            // No launcher variable is inherited: another convention (or
            // `NCCL_COMM_ID`) would take over from the torchrun ones set here.
            for v in oxccl::LaunchEnv::vars() {
                cmd.env_remove(v);
            }
            cmd.args(&args)
                .envs(child_env(r, n, port, &secret)?)
                .stdout(if r == 0 {
                    Stdio::inherit()
                } else {
                    Stdio::null()
                });
            let kid = cmd
                .spawn()
                .with_context(|| format!("starting rank {r} of {n}"))?;
            kids.push((r, kid));
        }
        wait_all(n, kids)?;
    }
    Ok(())
}

/// Rank `r` of `n`'s variables: torchrun's, with the root at
/// 127.0.0.1:`port`, and the launch's `secret` as `OXCCL_COMM_SECRET`.
fn child_env(
    r: u32,
    n: u32,
    port: u16,
    secret: &str,
) -> anyhow::Result<Vec<(&'static str, String)>> {
    let env = oxccl::LaunchEnv {
        launcher: "torchrun",
        rank: r,
        nranks: n,
        local_rank: r,
        root: format!("127.0.0.1:{port}"),
    };
    let mut v = env.to_vars()?;
    v.push(("OXCCL_COMM_SECRET", secret.to_string()));
    Ok(v)
}

/// A fresh secret for one launch's rendezvous: its root's address is
/// fixed (torchrun's convention, no id is passed), so without a secret its
/// key would be the public one and any user of this host could join the
/// ranks, or claim a rank before they do.
fn launch_secret() -> anyhow::Result<String> {
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .context("drawing the launch's secret")?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// This program's arguments for a child: `--procs` removed, `--from-env`
/// added.
fn child_args(args: impl Iterator<Item = String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut skip = false;
    for a in args {
        if std::mem::take(&mut skip) {
            continue;
        }
        if a == "--procs" {
            skip = true;
        } else if !a.starts_with("--procs=") {
            out.push(a);
        }
    }
    out.push("--from-env".into());
    out
}

/// A local TCP port nobody listens on now (the rendezvous root's).
fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    let p = l.local_addr()?.port();
    if p < 2 {
        bail!("port {p} leaves no room for MASTER_PORT");
    }
    Ok(p)
}

/// Waits for every rank; after the first failure the others get
/// [`GRACE`] to fail on their own, then are killed.
fn wait_all(n: u32, mut kids: Vec<(u32, Child)>) -> anyhow::Result<()> {
    let mut failed: Vec<String> = Vec::new();
    let mut since: Option<Instant> = None;
    while !kids.is_empty() {
        let mut i = 0;
        while i < kids.len() {
            match kids[i].1.try_wait() {
                Ok(Some(st)) => {
                    let (r, _) = kids.swap_remove(i);
                    if !st.success() {
                        failed.push(format!("rank {r} {st}"));
                        since.get_or_insert_with(Instant::now);
                    }
                }
                Ok(None) => i += 1,
                Err(e) => bail!("waiting for rank {}: {e}", kids[i].0),
            }
        }
        if since.is_some_and(|t| t.elapsed() > GRACE) {
            for (r, k) in &mut kids {
                let _ = k.kill();
                let _ = k.wait();
                failed.push(format!("rank {r} killed {GRACE:?} after the first failure"));
            }
            kids.clear();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if !failed.is_empty() {
        bail!("--procs {n}: {}", failed.join("; "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_garbage_is_refused() {
        let r = Record {
            time_ns: 123_456,
            laps_ns: vec![100_000, 123_456, 200_000],
            wrong: 7,
            fault: Some("rank 1 element 3: expected 1, got 2".into()),
            error: None,
        };
        assert_eq!(Record::decode(&r.encode()).unwrap(), r);
        let e = r.encode();
        assert!(Record::decode(&e[..e.len() - 1]).is_err());
        assert!(Record::decode(&[e.clone(), vec![0]].concat()).is_err());
        assert!(Record::decode(&[]).is_err());
    }

    #[test]
    fn children_get_from_env_instead_of_procs() {
        let a = |v: &[&str]| child_args(v.iter().map(|s| s.to_string()));
        assert_eq!(
            a(&["sweep", "--procs", "2,4", "-e", "1M"]),
            ["sweep", "-e", "1M", "--from-env"]
        );
        assert_eq!(a(&["sweep", "--procs=8"]), ["sweep", "--from-env"]);
    }

    #[test]
    fn children_share_a_fresh_secret_for_the_rendezvous() {
        let (a, b) = (launch_secret().unwrap(), launch_secret().unwrap());
        assert_eq!(a.len(), 32);
        assert_ne!(a, b, "two launches drew the same secret");
        for r in 0..2 {
            let env = child_env(r, 2, 29_500, &a).unwrap();
            assert!(
                env.contains(&("OXCCL_COMM_SECRET", a.clone())),
                "rank {r}: {env:?}"
            );
            let get = |k: &str| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
            let c = oxccl::Config::from_vars(get).unwrap();
            assert_eq!(c.bootstrap.comm_secret.as_deref(), Some(a.as_str()));
        }
    }

    #[test]
    fn a_wrong_rank_count_list_is_refused() {
        for l in ["", "0", "2,x", "-1"] {
            assert!(launch(l).is_err(), "{l:?}");
        }
    }
}

#[cfg(test)]
mod check_tests {
    use super::*;

    #[test]
    fn own_check_sees_a_dropped_a_doubled_and_a_zeroed_output() {
        let n = 3u32;
        for kind in [CollKind::AllReduce, CollKind::AllGather, CollKind::SendRecv] {
            let coll = Collective::new(kind, 50, 0);
            let inputs: Vec<Vec<f32>> = (0..n)
                .map(|r| testkit::input::<f32>(&coll, n, r, RedOp::Sum, 1))
                .collect();
            let exp: Vec<f32> = if kind == CollKind::SendRecv {
                inputs[0].clone()
            } else {
                oxccl::core::reference::expected(
                    &coll,
                    &inputs,
                    &RedOp::Sum.lower(oxccl::DataType::F32, n),
                )[1]
                .clone()
                .unwrap()
            };
            let ok = own_check(&coll, &inputs, 1, exp.clone(), RedOp::Sum);
            assert_eq!(ok.0, 0, "{kind}: {ok:?}");
            let short = own_check(&coll, &inputs, 1, exp[1..].to_vec(), RedOp::Sum);
            assert!(short.0 > 0, "{kind}: a dropped element passed");
            let doubled: Vec<f32> = exp.iter().map(|x| 2.0 * x + 1.0).collect();
            let d = own_check(&coll, &inputs, 1, doubled, RedOp::Sum);
            assert!(d.0 > 0 && d.1.unwrap().contains("rank 1"), "{kind}");
            let z = own_check(&coll, &inputs, 1, vec![0.0; exp.len()], RedOp::Sum);
            assert!(z.0 > 0, "{kind}: zeros passed");
        }
    }
}
