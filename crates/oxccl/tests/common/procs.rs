//! Ranks as child processes of a test: the test binary re-executes itself
//! running its ignored test `child`, told its role by `OXCCL_MP_ROLE` and
//! its rank by `OXCCL_MP_ID`/`_N`/`_RANK`; the parent reads their lines.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use oxccl::{Communicator, Config, UniqueId};

pub const ROLE: &str = "OXCCL_MP_ROLE";
/// Bound on every wait of the parent: a hang guard, never a measurement.
pub const GUARD: Duration = Duration::from_secs(120);

pub type Lines = mpsc::Receiver<(usize, String)>;

/// `n` children of one new id running `role`, rank `r` with `vars(r)`
/// set; their stdout and stderr lines arrive on the receiver.
pub fn spawn_ranks(
    role: &str,
    n: u32,
    vars: impl Fn(u32) -> Vec<(&'static str, String)>,
) -> (Vec<Child>, Lines) {
    let id = UniqueId::new().unwrap();
    let hex: String = id.to_bytes().iter().map(|x| format!("{x:02x}")).collect();
    let (tx, rx) = mpsc::channel();
    let kids = (0..n)
        .map(|r| {
            let mut cmd = Command::new(std::env::current_exe().unwrap());
            cmd.args([
                "--exact",
                "child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE, role)
            .env("OXCCL_MP_ID", &hex)
            .env("OXCCL_MP_N", n.to_string())
            .env("OXCCL_MP_RANK", r.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
            for v in oxccl::LaunchEnv::vars() {
                cmd.env_remove(v);
            }
            for (k, v) in vars(r) {
                cmd.env(k, v);
            }
            let mut c = cmd.spawn().unwrap();
            let pipes: [Box<dyn std::io::Read + Send>; 2] = [
                Box::new(c.stdout.take().unwrap()),
                Box::new(c.stderr.take().unwrap()),
            ];
            for pipe in pipes {
                let tx = tx.clone();
                std::thread::spawn(move || {
                    for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                        let _ = tx.send((r as usize, line));
                    }
                });
            }
            c
        })
        .collect();
    (kids, rx)
}

/// Waits (bounded) for every child; their exit codes and lines (`early`:
/// lines the caller already took, kept first).
pub fn finish(
    mut kids: Vec<Child>,
    rx: &Lines,
    mut early: Vec<Vec<String>>,
) -> (Vec<Option<i32>>, Vec<Vec<String>>) {
    let t = Instant::now();
    let mut codes = vec![None; kids.len()];
    early.resize(kids.len(), Vec::new());
    let mut lines = early;
    while codes.iter().any(Option::is_none) {
        for (i, k) in kids.iter_mut().enumerate() {
            if codes[i].is_none() {
                if let Some(st) = k.try_wait().unwrap() {
                    codes[i] = Some(st.code().unwrap_or(-1));
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
            panic!("children still running after {GUARD:?}: {codes:?}\n{lines:#?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Late lines (pipes drain after exit).
    while let Ok((who, l)) = rx.recv_timeout(Duration::from_millis(200)) {
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

fn env_u32(k: &str) -> u32 {
    std::env::var(k).unwrap().parse().unwrap()
}

/// The child's rank of the parent's id, configured as given.
pub fn child_comm(config: Config) -> Communicator {
    let hex = std::env::var("OXCCL_MP_ID").unwrap();
    let b: Vec<u8> = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let id = UniqueId::from_bytes(&b).unwrap();
    Communicator::init_rank(&id, env_u32("OXCCL_MP_N"), env_u32("OXCCL_MP_RANK"), config).unwrap()
}
