//! Communicators whose ranks are processes: [`UniqueId`],
//! [`Communicator::init_rank`], [`init_from_env`] and
//! [`Communicator::split`] (the crate's front page says how they fit;
//! this module is private).
//!
//! The ranks meet through `oxccl-bootstrap` (TCP rendezvous, then a ring
//! for small all-gathers) and run on the host backend across processes
//! (FIFOs and `alloc` buffers in shared memory, see `oxccl-host`), or on
//! CUDA (`backend::cuda_procs`: `Cuda`, or `Auto` when every rank has a
//! device).

use std::sync::Arc;

use oxccl_bootstrap::Bootstrap;

use crate::backend::{self, cuda_procs, BackendKind};
use crate::comm::{Clique, Communicator};
use crate::config::Config;
pub(crate) use crate::error::map_bootstrap;
use crate::error::{Error, Result};
use crate::split_threads::split_members;

/// A communicator's unique id: 128 bytes (NCCL's `ncclUniqueId`) that one
/// process makes with [`UniqueId::new`] and sends to the others (with
/// [`UniqueId::to_bytes`]) by any means: a file, MPI, a key-value store.
/// It carries the communicator's random key, which every connection of
/// the rendezvous proves: whoever holds the id may join, so send it only
/// to the job's own ranks (see the README's security section).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UniqueId(oxccl_bootstrap::UniqueId);

impl UniqueId {
    pub const BYTES: usize = oxccl_bootstrap::UniqueId::BYTES;

    /// A new id, configured from the environment ([`Config::from_env`]):
    /// [`UniqueId::with_config`].
    pub fn new() -> Result<UniqueId> {
        UniqueId::with_config(&Config::from_env()?)
    }

    /// A new id. Starts the rendezvous root in this process (it serves one
    /// communicator's init, then exits; it gives up after `config`'s
    /// deadline; one thread serves every root of the process) on the
    /// interface its bootstrap settings choose. With a `comm_id` there
    /// (`NCCL_COMM_ID=host:port`), the id of that address instead: rank 0
    /// runs the root there, and the key comes from `comm_secret`
    /// (`OXCCL_COMM_SECRET`; public without it, as NCCL's trust model).
    pub fn with_config(config: &Config) -> Result<UniqueId> {
        oxccl_bootstrap::UniqueId::new_with(config.deadline, &config.bootstrap_settings())
            .map(UniqueId)
            .map_err(map_bootstrap)
    }

    pub fn to_bytes(&self) -> [u8; UniqueId::BYTES] {
        self.0.to_bytes()
    }

    /// An id from [`UniqueId::to_bytes`]'s bytes; anything else (wrong
    /// length, bytes no `UniqueId::new` made) is refused.
    pub fn from_bytes(b: &[u8]) -> Result<UniqueId> {
        oxccl_bootstrap::UniqueId::from_bytes(b)
            .map(UniqueId)
            .map_err(map_bootstrap)
    }

    /// Any 128 bytes, unchecked until a communicator of two or more ranks
    /// uses them (the C ABI: frameworks make 1-rank communicators from ids
    /// nobody generated).
    pub fn from_raw(b: [u8; UniqueId::BYTES]) -> UniqueId {
        UniqueId(oxccl_bootstrap::UniqueId::from_raw(b))
    }
}

impl Communicator {
    /// Rank `rank` of an `nranks`-rank communicator whose other ranks call
    /// this in other processes with the same `id` (NCCL's
    /// `ncclCommInitRankConfig`). Blocks until every rank has joined, at
    /// most `config.deadline`.
    pub fn init_rank(
        id: &UniqueId,
        nranks: u32,
        rank: u32,
        config: Config,
    ) -> Result<Communicator> {
        Communicator::init_rank_scalable(std::slice::from_ref(id), nranks, rank, config)
    }

    /// As [`Communicator::init_rank`], with the rendezvous spread over
    /// several ids (NCCL's `ncclCommInitRankScalable`): every rank passes
    /// the same ids, each made by [`UniqueId::new`] in some process (at
    /// most one per rank); the id at index `b` serves the `b`-th block of
    /// consecutive ranks (`oxccl_bootstrap::root_block`).
    pub fn init_rank_scalable(
        ids: &[UniqueId],
        nranks: u32,
        rank: u32,
        config: Config,
    ) -> Result<Communicator> {
        let _nvtx = crate::observe::range(crate::observe::Func::CommInitRank, || {
            crate::observe::Args {
                rank,
                nranks,
                ..Default::default()
            }
        });
        // Before anything connects: the bootstrap and the backends' setup
        // (each connection's transport) log at INFO.
        crate::debug::init(config.debug, config.debug_subsys);
        let ids: Vec<oxccl_bootstrap::UniqueId> = ids.iter().map(|i| i.0).collect();
        let dev = config.bootstrap_settings().device_info(None, String::new());
        let boot = Bootstrap::init_scalable(&ids, nranks, rank, &dev, config.deadline)
            .map_err(map_bootstrap)?;
        Communicator::on_bootstrap(Arc::new(boot), config)
    }

    /// This process's rank of the communicator met through `boot`.
    pub(crate) fn on_bootstrap(boot: Arc<Bootstrap>, config: Config) -> Result<Communicator> {
        let (rank, n) = (boot.rank(), boot.nranks());
        let opts = config.backend_options(n);
        if n > 1 && config.backend != BackendKind::Host {
            // Before the first CUDA use: a process rank needs few queues.
            oxccl_cuda::driver::prefer_process_rank_queues();
        }
        let backend = match (config.backend, n) {
            (BackendKind::Cuda, 1) => backend::cuda::create(&opts)?,
            (BackendKind::Auto, 1) if backend::cuda::available() => backend::cuda::create(&opts)?,
            (_, 1) => backend::host::create(&opts)?,
            // Every rank learns whether all can use CUDA, so all pick alike.
            (BackendKind::Cuda, _) if cuda_procs::every_rank_has_cuda(&boot, true)? => {
                cuda_procs::create(&boot, &opts)?
            }
            (BackendKind::Auto, _) if cuda_procs::every_rank_has_cuda(&boot, false)? => {
                cuda_procs::create(&boot, &opts)?
            }
            (_, _) => backend::host::create_procs(&boot, &opts)?,
        };
        // Ranks check calls only if every rank asked for it; the records
        // live in shared memory, or mirrored over TCP between ranks that
        // talk over the network (if every rank asked for that too).
        let (check_calls, across) = if n > 1 {
            let mode = crate::check::agree_on_check(
                &boot,
                config.check_calls,
                config.check_calls_across_hosts,
                config.host.force_network,
            )?;
            (
                mode != crate::check::CheckMode::Off,
                mode == crate::check::CheckMode::Mirrored,
            )
        } else {
            (config.check_calls, false)
        };
        let config = Config {
            check_calls,
            check_calls_across_hosts: across,
            ..config
        };
        let clique = Clique::new(n, backend, config, Some(boot))?;
        Ok(Communicator::in_clique(rank, clique))
    }

    /// Every rank's `mine`, by rank, gathered over the bootstrap (host
    /// sockets, not the data path): for tools that coordinate the ranks of
    /// a process clique, such as the sweep's barriers and its per-rank
    /// results. Every rank must call it, in the same order as its other
    /// calls of it; records are at most `oxccl_bootstrap::MAX_RECORD`
    /// bytes. Ranks as threads (`init_all`) get `InvalidUsage`.
    pub fn exchange(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.check_usable()?;
        let boot = self.clique().boot.as_ref().ok_or_else(|| {
            Error::InvalidUsage(
                "exchange needs a communicator made by init_rank or init_from_env".into(),
            )
        })?;
        boot.all_gather(mine).map_err(map_bootstrap)
    }

    /// The configuration of a child of this rank (split, shrink, grow):
    /// this communicator's, on this rank's device, so the child's rank
    /// stays on its GPU whatever its index in the child.
    pub fn child_config(&self) -> Config {
        let mut c = self.clique().config.clone();
        if let Some(d) = self.cuda_device() {
            c.cuda.device = Some(d);
        }
        c.cuda.co_resident = c.cuda.co_resident.max(self.ranks_on_busiest_memory());
        c
    }

    /// A new communicator of the ranks that pass the same `color` (NCCL's
    /// `ncclCommSplit`): ranked by `key`, ties by rank here; ranks passing
    /// `None` get `Ok(None)`. Every rank of this communicator must call
    /// it. No new id is needed: the ranks agree through this
    /// communicator's bootstrap, and the new rank 0 runs the new root.
    /// With ranks as threads (`init_all`), every rank's thread calls it at
    /// once and each member stays on its parent rank's device.
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Communicator>> {
        let _nvtx = crate::observe::range(crate::observe::Func::CommSplit, || self.tool_args());
        self.check_usable()?;
        let cl = self.clique();
        let Some(boot) = cl.boot.as_ref() else {
            return crate::split_threads::split(self, color, key);
        };
        let mut mine = Vec::with_capacity(12);
        mine.extend_from_slice(&color.map_or(-1i64, i64::from).to_le_bytes());
        mine.extend_from_slice(&key.to_le_bytes());
        let all = boot.all_gather(&mine).map_err(map_bootstrap)?;
        let mut entries = Vec::with_capacity(all.len());
        for (r, b) in all.iter().enumerate() {
            let (c, k) = b
                .split_at_checked(8)
                .filter(|(_, k)| k.len() == 4)
                .ok_or_else(|| {
                    Error::Bootstrap(format!("rank {r} sent a split record of {} bytes", b.len()))
                })?;
            let c = i64::from_le_bytes(c.try_into().expect("8 bytes"));
            let k = i32::from_le_bytes(k.try_into().expect("4 bytes"));
            entries.push((c, k, r as u32));
        }
        let members = split_members(&entries, color);
        let new_rank = members.iter().position(|&r| r == self.rank());
        // The new rank 0 of each color makes the new id; everyone learns
        // the ids in one more all-gather.
        let id = match new_rank {
            // A root of its own, never `NCCL_COMM_ID`'s address (the
            // parent's rendezvous is there).
            Some(0) => Some(UniqueId(
                oxccl_bootstrap::UniqueId::new_with(
                    cl.config.deadline,
                    &oxccl_bootstrap::BootstrapSettings {
                        comm_id: None,
                        ..cl.config.bootstrap_settings()
                    },
                )
                .map_err(map_bootstrap)?,
            )),
            _ => None,
        };
        let ids = boot
            .all_gather(&id.map(|i| i.to_bytes().to_vec()).unwrap_or_default())
            .map_err(map_bootstrap)?;
        let (Some(new_rank), Some(&leader)) = (new_rank, members.first()) else {
            return Ok(None);
        };
        let id = UniqueId::from_bytes(&ids[leader as usize])?;
        let n = members.len() as u32;
        let child = Bootstrap::init(
            &id.0,
            n,
            new_rank as u32,
            &cl.config
                .bootstrap_settings()
                .device_info(None, String::new()),
            cl.config.deadline,
        )
        .map_err(map_bootstrap)?;
        Communicator::on_bootstrap(Arc::new(child), self.child_config()).map(Some)
    }
}

/// Where a launcher put this process: rank, rank count, rank on this host,
/// and the root's address every rank computes alike.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchEnv {
    /// `torchrun`, `openmpi`, `pmi` (MPICH's Hydra and other PMI
    /// launchers) or `slurm`.
    pub launcher: &'static str,
    pub rank: u32,
    pub nranks: u32,
    pub local_rank: u32,
    /// `host:port` of the root (rank 0 runs it).
    pub root: String,
}

/// The launchers' conventions [`LaunchEnv::from_vars`] knows, in the order
/// it tries them: name, then the rank, rank count and local rank variables.
const LAUNCHERS: [(&str, [&str; 3]); 4] = [
    ("torchrun", ["RANK", "WORLD_SIZE", "LOCAL_RANK"]),
    (
        "openmpi",
        [
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
        ],
    ),
    ("pmi", ["PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"]),
    ("slurm", ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"]),
];

/// Where the root listens: `NCCL_COMM_ID`, else `MASTER_ADDR` and
/// `MASTER_PORT`.
const ROOT_VARS: [&str; 3] = ["NCCL_COMM_ID", "MASTER_ADDR", "MASTER_PORT"];

impl LaunchEnv {
    /// Every variable [`LaunchEnv::from_vars`] reads: what a program that
    /// starts ranks as child processes clears before it sets its own
    /// convention, so that none inherited from its own launcher takes over.
    pub fn vars() -> impl Iterator<Item = &'static str> {
        LAUNCHERS.into_iter().flat_map(|(_, v)| v).chain(ROOT_VARS)
    }

    /// Reads a launcher's variables through `get`. The first convention
    /// present wins: torchrun (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`), Open MPI
    /// (`OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`), PMI (`PMI_RANK`,
    /// `PMI_SIZE`, and MPICH's `MPI_LOCALRANKID`), Slurm (`SLURM_PROCID`,
    /// `SLURM_NTASKS`, `SLURM_LOCALID`). The root is
    /// `NCCL_COMM_ID` if set, else `MASTER_ADDR` and `MASTER_PORT` + 1
    /// (under torchrun `MASTER_PORT` itself is torch's own store).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<LaunchEnv> {
        let num = |var: &str, v: String| {
            v.trim().parse::<u32>().map_err(|_| Error::Config {
                var: var.into(),
                value: v,
                reason: "expected a non-negative integer".into(),
            })
        };
        let (launcher, [rv, nv, lv]) = LAUNCHERS
            .into_iter()
            .find(|(_, [r, n, _])| get(r).is_some() && get(n).is_some())
            .ok_or_else(|| {
                // A launcher's rank without its size (or the size alone).
                let half = LAUNCHERS.into_iter().find_map(|(_, [r, n, _])| {
                    match (get(r), get(n)) {
                        (Some(v), None) => Some((r, v, n)),
                        (None, Some(v)) => Some((n, v, r)),
                        _ => None,
                    }
                });
                match half {
                    Some((set, value, unset)) => Error::Config {
                        var: set.into(),
                        value,
                        reason: format!("{set} is set but {unset} is not: set both"),
                    },
                    None => Error::Config {
                        var: "RANK/WORLD_SIZE".into(),
                        value: String::new(),
                        reason: "no launcher's variables are set (torchrun's RANK and WORLD_SIZE, Open MPI's OMPI_COMM_WORLD_RANK and _SIZE, PMI's PMI_RANK and PMI_SIZE, or Slurm's SLURM_PROCID and SLURM_NTASKS)".into(),
                    },
                }
            })?;
        let rank = num(rv, get(rv).unwrap_or_default())?;
        let nranks = num(nv, get(nv).unwrap_or_default())?;
        let local_rank = get(lv).map(|v| num(lv, v)).transpose()?.unwrap_or(0);
        if nranks == 0 || rank >= nranks {
            return Err(Error::Config {
                var: rv.into(),
                value: rank.to_string(),
                reason: format!("rank {rank} is out of range for {nv}={nranks}"),
            });
        }
        let root = match get("NCCL_COMM_ID").filter(|v| !v.is_empty()) {
            Some(id) => id,
            None => {
                let addr = get("MASTER_ADDR").filter(|v| !v.is_empty());
                let port = get("MASTER_PORT").filter(|v| !v.is_empty());
                match (addr, port) {
                    (Some(a), Some(p)) => {
                        let p: u16 = p.trim().parse().ok().filter(|&p| p < u16::MAX).ok_or_else(|| Error::Config {
                            var: "MASTER_PORT".into(),
                            value: p.clone(),
                            reason: "expected a port below 65535".into(),
                        })?;
                        if a.contains(':') {
                            format!("[{a}]:{}", p + 1)
                        } else {
                            format!("{a}:{}", p + 1)
                        }
                    }
                    _ if nranks == 1 => String::new(),
                    _ => {
                        return Err(Error::Config {
                            var: "MASTER_ADDR/MASTER_PORT".into(),
                            value: String::new(),
                            reason: format!(
                                "{launcher} set the ranks but nothing says where rank 0 listens: set MASTER_ADDR and MASTER_PORT, or NCCL_COMM_ID=host:port"
                            ),
                        })
                    }
                }
            }
        };
        Ok(LaunchEnv {
            launcher,
            rank,
            nranks,
            local_rank,
            root,
        })
    }

    /// What `launcher` sets for this rank, so that [`LaunchEnv::from_vars`]
    /// reads this back: the inverse, for programs that start ranks as
    /// child processes. The root goes in `NCCL_COMM_ID` under Open MPI and
    /// as `MASTER_ADDR` with `MASTER_PORT` one below the root's port under
    /// torchrun and Slurm (none where `root` is empty).
    pub fn to_vars(&self) -> Result<Vec<(&'static str, String)>> {
        let (_, names) = LAUNCHERS
            .into_iter()
            .find(|(l, _)| *l == self.launcher)
            .ok_or_else(|| {
                Error::InvalidUsage(format!(
                    "unknown launcher {:?}: expected torchrun, openmpi, pmi or slurm",
                    self.launcher
                ))
            })?;
        let mut v: Vec<(&'static str, String)> = names
            .into_iter()
            .zip([self.rank, self.nranks, self.local_rank])
            .map(|(k, x)| (k, x.to_string()))
            .collect();
        if self.root.is_empty() {
            return Ok(v);
        }
        if self.launcher == "openmpi" {
            v.push(("NCCL_COMM_ID", self.root.clone()));
            return Ok(v);
        }
        let bad = || Error::InvalidUsage(format!("root {:?} is not host:port", self.root));
        let (host, port) = self.root.rsplit_once(':').ok_or_else(bad)?;
        let port = port
            .parse::<u16>()
            .ok()
            .filter(|&p| p > 0)
            .ok_or_else(bad)?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        v.push(("MASTER_ADDR", host.to_string()));
        v.push(("MASTER_PORT", (port - 1).to_string()));
        Ok(v)
    }
}

/// This process's rank of a communicator described by a launcher's
/// environment variables (see [`LaunchEnv::from_vars`]), configured from
/// the environment ([`Config::from_env`]).
pub fn init_from_env() -> Result<Communicator> {
    init_from_env_with(Config::from_env()?)
}

/// [`init_from_env`] with the caller's configuration (tools that take
/// their settings from flags, such as the sweep).
pub fn init_from_env_with(config: Config) -> Result<Communicator> {
    let env = crate::settings::Environment::capture();
    let env = LaunchEnv::from_vars(|k| env.get(k))?;
    tracing::info!(launcher = env.launcher, rank = env.rank, nranks = env.nranks, local_rank = env.local_rank, root = %env.root, "oxccl: init from the launcher's environment");
    let id = if env.nranks == 1 {
        UniqueId::from_raw([0; UniqueId::BYTES])
    } else {
        UniqueId(
            oxccl_bootstrap::UniqueId::from_comm_id_in(
                &env.root,
                config.bootstrap.iface.family,
                config.bootstrap.comm_secret.as_deref(),
            )
            .map_err(map_bootstrap)?,
        )
    };
    Communicator::init_rank(&id, env.nranks, env.rank, config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl_bootstrap::env::from_pairs as vars;

    #[test]
    fn each_launcher_convention_is_read() {
        let t = LaunchEnv::from_vars(vars(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
        ]))
        .unwrap();
        assert_eq!(
            (t.launcher, t.rank, t.nranks, t.local_rank, t.root.as_str()),
            ("torchrun", 3, 8, 1, "10.0.0.1:29501")
        );
        let o = LaunchEnv::from_vars(vars(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("NCCL_COMM_ID", "host:1234"),
        ]))
        .unwrap();
        assert_eq!(
            (o.launcher, o.rank, o.nranks, o.local_rank, o.root.as_str()),
            ("openmpi", 1, 2, 1, "host:1234")
        );
        let s = LaunchEnv::from_vars(vars(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_LOCALID", "0"),
            ("MASTER_ADDR", "::1"),
            ("MASTER_PORT", "7000"),
        ]))
        .unwrap();
        assert_eq!((s.launcher, s.root.as_str()), ("slurm", "[::1]:7001"));
        let p = LaunchEnv::from_vars(vars(&[
            ("PMI_RANK", "2"),
            ("PMI_SIZE", "4"),
            ("MPI_LOCALRANKID", "2"),
            ("NCCL_COMM_ID", "host:1234"),
        ]))
        .unwrap();
        assert_eq!(
            (p.launcher, p.rank, p.nranks, p.local_rank),
            ("pmi", 2, 4, 2)
        );
    }

    #[test]
    fn to_vars_is_read_back_by_from_vars() {
        for (launcher, root) in [
            ("torchrun", "10.0.0.1:29501"),
            ("openmpi", "host:1234"),
            ("pmi", "host:1234"),
            ("slurm", "[::1]:7001"),
            ("slurm", ""),
        ] {
            let nranks = if root.is_empty() { 1 } else { 8 };
            let e = LaunchEnv {
                launcher,
                rank: nranks - 1,
                nranks,
                local_rank: 0,
                root: root.into(),
            };
            let v = e.to_vars().unwrap();
            let pairs: Vec<(&str, &str)> = v.iter().map(|(k, x)| (*k, x.as_str())).collect();
            assert_eq!(LaunchEnv::from_vars(vars(&pairs)).unwrap(), e, "{pairs:?}");
        }
        let mut e = LaunchEnv::from_vars(vars(&[("RANK", "0"), ("WORLD_SIZE", "1")])).unwrap();
        e.launcher = "mpich";
        assert!(matches!(e.to_vars(), Err(Error::InvalidUsage(_))));
        e.launcher = "torchrun";
        e.root = "no-port".into();
        assert!(matches!(e.to_vars(), Err(Error::InvalidUsage(_))));
    }

    #[test]
    fn bad_launcher_variables_are_config_errors() {
        for kv in [
            vec![],
            vec![
                ("RANK", "x"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "a"),
                ("MASTER_PORT", "1"),
            ],
            vec![
                ("RANK", "2"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "a"),
                ("MASTER_PORT", "1"),
            ],
            vec![("RANK", "0"), ("WORLD_SIZE", "2")],
            vec![
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "a"),
                ("MASTER_PORT", "65535"),
            ],
        ] {
            assert!(
                matches!(LaunchEnv::from_vars(vars(&kv)), Err(Error::Config { .. })),
                "{kv:?}"
            );
        }
        // Half a convention is named, not taken for no launcher at all.
        let e = LaunchEnv::from_vars(vars(&[("RANK", "0")])).unwrap_err();
        assert!(
            e.to_string().contains("RANK is set but WORLD_SIZE is not"),
            "{e}"
        );
        let e = LaunchEnv::from_vars(vars(&[("OMPI_COMM_WORLD_SIZE", "4")])).unwrap_err();
        assert!(
            e.to_string()
                .contains("OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not"),
            "{e}"
        );
        // One rank needs no root address.
        assert!(
            LaunchEnv::from_vars(vars(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "1")])).is_ok()
        );
    }

    #[test]
    fn split_orders_by_key_then_rank_and_drops_no_color() {
        let e = [
            (1, 5, 0),
            (0, 0, 1),
            (1, -2, 2),
            (-1, 0, 3),
            (1, 5, 4),
            (0, 9, 5),
        ];
        assert_eq!(split_members(&e, Some(1)), [2, 0, 4]);
        assert_eq!(split_members(&e, Some(0)), [1, 5]);
        assert!(split_members(&e, None).is_empty());
        assert!(split_members(&e, Some(7)).is_empty());
    }
}
