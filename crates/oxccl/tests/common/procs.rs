//! Ranks as child processes of a test: the test binary re-executes itself
//! running its test `child`, told its role by `OXCCL_MP_ROLE` (and
//! its rank by `OXCCL_MP_ID`/`_N`/`_RANK`); the parent reads their lines.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use oxccl::{Communicator, Config, UniqueId};

pub const ROLE: &str = "OXCCL_MP_ROLE";
/// Bound on every wait of the parent: a hang guard, never a measurement.
pub const GUARD: Duration = Duration::from_secs(120);

/// Where children's lines arrive: (child, line).
pub type Lines = mpsc::Receiver<(usize, String)>;

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

/// A child running `role` with `vars`, started through the command `wrap`
/// (e.g. `ip netns exec NAME`; none: directly); its stdout and stderr
/// lines arrive on `tx` as child `who`'s.
pub fn spawn_via(
    wrap: &[&str],
    role: &str,
    vars: &[(&str, String)],
    tx: &mpsc::Sender<(usize, String)>,
    who: usize,
) -> Child {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = match wrap.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    cmd.args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for v in oxccl::LaunchEnv::vars() {
        cmd.env_remove(v);
    }
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let mut c = cmd.spawn().unwrap();
    let out = c.stdout.take().unwrap();
    let err = c.stderr.take().unwrap();
    for pipe in [
        Box::new(out) as Box<dyn std::io::Read + Send>,
        Box::new(err),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let _ = tx.send((who, line));
            }
        });
    }
    c
}

/// The variables that make a child rank `r` of `n` of `id`.
pub fn id_vars(id: &UniqueId, n: u32, r: u32) -> Vec<(&'static str, String)> {
    vec![
        ("OXCCL_MP_ID", hex(&id.to_bytes())),
        ("OXCCL_MP_N", n.to_string()),
        ("OXCCL_MP_RANK", r.to_string()),
    ]
}

/// `n` children of one new id running `role`, rank `r` with `more(r)`
/// variables too; their lines arrive on the receiver.
pub fn spawn_ranks_live(
    role: &str,
    n: u32,
    more: impl Fn(u32) -> Vec<(&'static str, String)>,
) -> (Vec<Child>, Lines) {
    let id = UniqueId::new().unwrap();
    let (tx, rx) = mpsc::channel();
    let kids = (0..n)
        .map(|r| {
            let mut vars = id_vars(&id, n, r);
            vars.extend(more(r));
            spawn_via(&[], role, &vars, &tx, r as usize)
        })
        .collect();
    (kids, rx)
}

/// Waits (bounded) for every child; returns exit codes and their lines.
pub fn finish(mut kids: Vec<Child>, rx: &Lines) -> (Vec<Option<i32>>, Vec<Vec<String>>) {
    let t = Instant::now();
    let mut codes = vec![None; kids.len()];
    let mut lines = vec![Vec::new(); kids.len()];
    let mut done = 0;
    while done < kids.len() {
        for (i, k) in kids.iter_mut().enumerate() {
            if codes[i].is_none() {
                if let Some(st) = k.try_wait().unwrap() {
                    codes[i] = Some(st.code().unwrap_or(-1));
                    done += 1;
                }
            }
        }
        while let Ok((who, l)) = rx.try_recv() {
            lines[who].push(l);
        }
        if t.elapsed() > GUARD {
            for k in &mut kids {
                let _ = k.kill();
            }
            panic!("children still running after {GUARD:?}: {codes:?}\n{lines:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Late lines (pipes drain after exit).
    let t = Instant::now();
    while let Ok((who, l)) = rx.recv_timeout(Duration::from_millis(200).saturating_sub(t.elapsed()))
    {
        lines[who].push(l);
    }
    (codes, lines)
}

/// The children's own lines starting with `tag` (libtest may print
/// `test child ... ` before them on the same line).
pub fn tagged(lines: &[String], tag: &str) -> Vec<String> {
    lines
        .iter()
        .filter_map(|l| l.find(tag).map(|i| l[i..].to_string()))
        .collect()
}

/// Asserts that on every rank the first line tagged `tag` satisfies
/// `want`, naming the rank and showing its lines otherwise.
pub fn every_rank_first(lines: &[Vec<String>], tag: &str, want: impl Fn(&str) -> bool) {
    for (r, l) in lines.iter().enumerate() {
        let t = tagged(l, tag);
        assert!(t.first().is_some_and(|x| want(x)), "rank {r}: {l:#?}");
    }
}

/// Asserts that on every rank some line tagged `tag` satisfies `want`.
pub fn every_rank_any(lines: &[Vec<String>], tag: &str, want: impl Fn(&str) -> bool) {
    for (r, l) in lines.iter().enumerate() {
        let t = tagged(l, tag);
        assert!(t.iter().any(|x| want(x)), "rank {r}: {t:?}\n{l:#?}");
    }
}

pub fn env_u32(k: &str) -> u32 {
    std::env::var(k).unwrap().parse().unwrap()
}

/// In a child: its rank of the parent's id, configured as given.
pub fn child_rank(config: Config) -> Communicator {
    let id = UniqueId::from_bytes(&unhex(&std::env::var("OXCCL_MP_ID").unwrap())).unwrap();
    Communicator::init_rank(&id, env_u32("OXCCL_MP_N"), env_u32("OXCCL_MP_RANK"), config).unwrap()
}

/// Once every child printed a line holding `marker`, kills child `victim`
/// and waits (bounded) for the others; exit codes and every line.
pub fn kill_once_all_say(
    mut kids: Vec<Child>,
    rx: &Lines,
    marker: &str,
    victim: usize,
) -> (Vec<Option<i32>>, Vec<Vec<String>>) {
    let t = Instant::now();
    let mut said = vec![false; kids.len()];
    let mut early = vec![Vec::new(); kids.len()];
    while !said.iter().all(|&x| x) {
        let (who, l) = rx
            .recv_timeout(GUARD.saturating_sub(t.elapsed()))
            .unwrap_or_else(|_| panic!("children never said {marker}: {early:#?}"));
        if l.contains(marker) {
            said[who] = true;
        }
        early[who].push(l);
    }
    kids[victim].kill().unwrap();
    let (codes, mut lines) = finish(kids, rx);
    for (i, l) in early.into_iter().enumerate() {
        lines[i].splice(0..0, l);
    }
    (codes, lines)
}

/// The body of a test binary's `child` test: runs the role [`ROLE`] names
/// among `roles`; in a plain test run (no role) it has nothing to do.
pub fn run_role(roles: &[(&str, fn())]) {
    let Ok(role) = std::env::var(ROLE) else {
        println!("child: runs only as a rank process the other tests spawn ({ROLE} unset)");
        return;
    };
    match roles.iter().find(|(name, _)| *name == role) {
        Some((_, run)) => run(),
        None => panic!("{ROLE}={role:?}: no such rank role"),
    }
}
