//! Whether a launcher started this process: torchrun, mpirun (Open MPI),
//! a PMI launcher (MPICH's Hydra) or a Slurm job step. Without this a
//! sweep started by `mpirun -n 8` ran its own 4 rank threads in each of
//! the 8 processes, eight unrelated sweeps, and printed all of them.
//!
//! [`detect`] reads the variables through a lookup (tests pass a map, not
//! the process's environment) and says one of three things: no launcher,
//! one rank of a launched sweep (a complete, consistent rank and size:
//! the sweep then joins as `--from-env` does), or that it cannot tell
//! (a rank without a size, a rank out of range, two launchers that
//! disagree), with a line naming what it saw and which flag to pass.

/// One launcher's rank and size variables, and a variable that must be
/// set too for them to mean a launch (Slurm sets its rank and size in a
/// batch script as well, where nothing was launched yet: only a job step,
/// `SLURM_STEP_ID`, is one).
struct Convention {
    name: &'static str,
    rank: &'static str,
    size: &'static str,
    only_with: Option<&'static str>,
}

/// In the order `--from-env` tries them (`oxccl::LaunchEnv::from_vars`):
/// the innermost launcher first, as torchrun or mpirun inside a Slurm step.
const CONVENTIONS: [Convention; 4] = [
    Convention {
        name: "torchrun",
        rank: "RANK",
        size: "WORLD_SIZE",
        only_with: None,
    },
    Convention {
        name: "openmpi",
        rank: "OMPI_COMM_WORLD_RANK",
        size: "OMPI_COMM_WORLD_SIZE",
        only_with: None,
    },
    Convention {
        name: "pmi",
        rank: "PMI_RANK",
        size: "PMI_SIZE",
        only_with: None,
    },
    Convention {
        name: "slurm",
        rank: "SLURM_PROCID",
        size: "SLURM_NTASKS",
        only_with: Some("SLURM_STEP_ID"),
    },
];

/// Variables listed when seen, though they decide nothing alone.
const ALSO_SHOWN: [&str; 4] = ["LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_STEP_ID"];

/// What the environment says about how this process was started.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Detected {
    /// No launcher's rank or size variable is set.
    Alone,
    /// One rank of a launched sweep: join as `--from-env` does.
    Launched {
        launcher: &'static str,
        rank: u32,
        nranks: u32,
        /// `NAME=value` of every launcher variable seen.
        seen: String,
    },
    /// Partial or conflicting variables: the line to stop with.
    Unclear(String),
}

/// Reads the launchers' variables through `get`. See the module docs.
pub(crate) fn detect(get: impl Fn(&str) -> Option<String>) -> Detected {
    let mut seen: Vec<String> = Vec::new();
    // (launcher, rank, size) of every complete convention, innermost first.
    let mut complete: Vec<(&'static str, u32, u32)> = Vec::new();
    let mut problems: Vec<String> = Vec::new();
    for c in &CONVENTIONS {
        if c.only_with.is_some_and(|v| get(v).is_none()) {
            continue;
        }
        let (rank, size) = (get(c.rank), get(c.size));
        for (var, v) in [(c.rank, &rank), (c.size, &size)] {
            if let Some(v) = v {
                seen.push(format!("{var}={v}"));
            }
        }
        match (rank, size) {
            (None, None) => {}
            (Some(_), None) => problems.push(format!("{} without {}", c.rank, c.size)),
            (None, Some(_)) => problems.push(format!("{} without {}", c.size, c.rank)),
            (Some(r), Some(s)) => match (r.trim().parse::<u32>(), s.trim().parse::<u32>()) {
                (Ok(r), Ok(s)) if r < s => complete.push((c.name, r, s)),
                _ => problems.push(format!("{}={r} is not a rank below {}={s}", c.rank, c.size)),
            },
        }
    }
    if seen.is_empty() {
        return Detected::Alone;
    }
    seen.extend(
        ALSO_SHOWN
            .iter()
            .filter_map(|v| get(v).map(|x| format!("{v}={x}"))),
    );
    let seen = seen.join(" ");
    // An outer launcher agrees with the inner one when it started one
    // process per group of inner ranks (srun, one task a node, each
    // running torchrun), or is the same launch seen twice.
    if let Some(&(inner, r, n)) = complete.first() {
        for &(outer, or, on) in &complete[1..] {
            if (or, on) != (r, n) && (on >= n || n % on != 0) {
                problems.push(format!(
                    "{inner} says rank {r} of {n}, {outer} rank {or} of {on}"
                ));
            }
        }
    }
    match (problems.is_empty(), complete.first()) {
        (true, Some(&(launcher, rank, nranks))) => Detected::Launched {
            launcher,
            rank,
            nranks,
            seen,
        },
        _ => Detected::Unclear(format!(
            "cannot tell whether a launcher started this sweep: saw {seen} ({}); pass --from-env to join as one rank of a launched sweep, or --no-launcher to run --ranks N threads in this process regardless",
            problems.join("; ")
        )),
    }
}

/// A lookup answering from `pairs` as [`detect`] reads the process
/// environment: for tests.
#[cfg(test)]
pub(super) fn fake_env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let env = oxccl::settings::Environment::from_pairs(pairs);
    move |k| env.get(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launched(d: &Detected) -> Option<(&'static str, u32, u32)> {
        match d {
            Detected::Launched {
                launcher,
                rank,
                nranks,
                ..
            } => Some((launcher, *rank, *nranks)),
            _ => None,
        }
    }

    fn unclear(d: Detected) -> String {
        match d {
            Detected::Unclear(line) => line,
            d => panic!("expected a stop, got {d:?}"),
        }
    }

    #[test]
    fn no_launcher_variables_is_alone() {
        assert_eq!(detect(fake_env(&[])), Detected::Alone);
        // A Slurm allocation's batch script launched nothing yet.
        let batch = [("SLURM_PROCID", "0"), ("SLURM_NTASKS", "16")];
        assert_eq!(detect(fake_env(&batch)), Detected::Alone);
        // Root addresses alone start nothing either.
        assert_eq!(detect(fake_env(&[("MASTER_ADDR", "h")])), Detected::Alone);
    }

    #[test]
    fn each_launcher_is_recognised() {
        let torch = [
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "3"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
        ];
        let d = detect(fake_env(&torch));
        assert_eq!(launched(&d), Some(("torchrun", 3, 8)));
        let Detected::Launched { seen, .. } = d else {
            unreachable!()
        };
        assert!(seen.contains("RANK=3") && seen.contains("MASTER_ADDR=10.0.0.1"));
        let mpi = [("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "2")];
        assert_eq!(launched(&detect(fake_env(&mpi))), Some(("openmpi", 1, 2)));
        let pmi = [("PMI_RANK", "0"), ("PMI_SIZE", "4")];
        assert_eq!(launched(&detect(fake_env(&pmi))), Some(("pmi", 0, 4)));
        let step = [
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_STEP_ID", "0"),
        ];
        assert_eq!(launched(&detect(fake_env(&step))), Some(("slurm", 5, 16)));
    }

    #[test]
    fn a_launcher_inside_a_slurm_step_is_the_inner_one() {
        // srun, one task on each of 2 nodes, each running torchrun for 4.
        let nested = [
            ("RANK", "6"),
            ("WORLD_SIZE", "8"),
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_STEP_ID", "0"),
        ];
        assert_eq!(
            launched(&detect(fake_env(&nested))),
            Some(("torchrun", 6, 8))
        );
        // srun started the 8 ranks itself and mpirun's view agrees.
        let same = [
            ("OMPI_COMM_WORLD_RANK", "6"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
            ("SLURM_PROCID", "6"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_STEP_ID", "0"),
        ];
        assert_eq!(launched(&detect(fake_env(&same))), Some(("openmpi", 6, 8)));
    }

    #[test]
    fn partial_or_conflicting_variables_stop_with_what_was_seen() {
        let line = unclear(detect(fake_env(&[("RANK", "2")])));
        assert!(line.contains("RANK=2"), "{line}");
        assert!(line.contains("RANK without WORLD_SIZE"), "{line}");
        assert!(
            line.contains("--from-env") && line.contains("--no-launcher"),
            "{line}"
        );
        let line = unclear(detect(fake_env(&[("PMI_SIZE", "4")])));
        assert!(line.contains("PMI_SIZE without PMI_RANK"), "{line}");
        let line = unclear(detect(fake_env(&[("RANK", "8"), ("WORLD_SIZE", "8")])));
        assert!(line.contains("not a rank below"), "{line}");
        let line = unclear(detect(fake_env(&[("RANK", "x"), ("WORLD_SIZE", "8")])));
        assert!(line.contains("RANK=x"), "{line}");
        // Two launchers that cannot both describe this process.
        let both = [
            ("RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "3"),
        ];
        let line = unclear(detect(fake_env(&both)));
        assert!(
            line.contains("torchrun says rank 1 of 4, openmpi rank 2 of 3"),
            "{line}"
        );
        // A complete launcher beside a partial one is unclear too.
        let mixed = [("RANK", "1"), ("WORLD_SIZE", "4"), ("PMI_RANK", "1")];
        assert!(matches!(detect(fake_env(&mixed)), Detected::Unclear(_)));
    }
}
