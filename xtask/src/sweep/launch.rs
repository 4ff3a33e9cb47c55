//! Where the sweep's ranks come from: threads of this process (`--ranks
//! N`), or this process as one rank of several that a launcher started
//! (`--from-env`, or found by [`resolve`]; `--procs` starts them itself,
//! see `procs`).

use anyhow::{bail, Context};
use oxccl::{Communicator, Config};

use super::args::SweepArgs;
use super::launcher::{self, Detected};

/// Applies what a launcher's variables (read through `get`) say, unless
/// `--from-env` or `--no-launcher` already decided: under a complete,
/// consistent launch the sweep joins as one rank, exactly as with
/// `--from-env`; where it cannot tell, it stops with the line
/// [`launcher::detect`] gives. A flag that starts the sweep's own ranks
/// (`--ranks`, `--procs`, `--pick`) under a launch is an error: it would
/// run them in every launched process.
pub(crate) fn resolve(
    a: &mut SweepArgs,
    get: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<()> {
    if a.from_env || a.no_launcher {
        return Ok(());
    }
    match launcher::detect(get) {
        Detected::Alone => Ok(()),
        Detected::Unclear(line) => bail!("{line}"),
        Detected::Launched {
            launcher,
            rank,
            nranks,
            seen,
        } => {
            let own = [
                (a.ranks.is_some(), "--ranks"),
                (a.procs.is_some(), "--procs"),
                (a.pick, "--pick"),
            ];
            if let Some((_, flag)) = own.iter().find(|(set, _)| *set) {
                bail!(
                    "{flag} starts this sweep's own ranks, but {launcher} started this process as rank {rank} of {nranks} (saw {seen}): drop {flag} to join the launched ranks, or pass --no-launcher to run them in every launched process anyway"
                );
            }
            if rank == 0 {
                eprintln!(
                    "# {launcher} started this process (rank {rank} of {nranks}): joining as with --from-env (--no-launcher runs --ranks threads instead)"
                );
            }
            a.from_env = true;
            Ok(())
        }
    }
}

/// This process's communicators: one per rank thread, or the one rank a
/// launcher's environment describes.
pub(crate) fn join(a: &SweepArgs, config: Config) -> anyhow::Result<Vec<Communicator>> {
    if a.from_env {
        if a.nccl.nccl {
            bail!("--nccl runs with ranks as threads only");
        }
        Ok(vec![
            oxccl::init_from_env_with(config).context("joining the launched ranks")?
        ])
    } else {
        oxccl::init_all_with(a.ranks(), config).context("creating communicators")
    }
}

#[cfg(test)]
mod tests {
    use super::launcher::fake_env;
    use super::*;

    fn args(flags: &[&str]) -> SweepArgs {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            a: SweepArgs,
        }
        let argv = std::iter::once("sweep").chain(flags.iter().copied());
        <Cli as clap::Parser>::parse_from(argv).a
    }

    const MPI: [(&str, &str); 2] = [("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "4")];

    #[test]
    fn a_launched_sweep_joins_as_from_env() {
        let mut a = args(&["-b", "8"]);
        resolve(&mut a, fake_env(&MPI)).unwrap();
        assert!(a.from_env);
        // No launcher: threads, as before.
        let mut a = args(&[]);
        resolve(&mut a, fake_env(&[])).unwrap();
        assert!(!a.from_env);
        assert_eq!(a.ranks(), 4);
    }

    #[test]
    fn own_ranks_under_a_launcher_are_an_error_unless_opted_out() {
        for flags in [&["--ranks", "8"][..], &["--procs", "2"], &["--pick"]] {
            let mut a = args(flags);
            let e = resolve(&mut a, fake_env(&MPI)).unwrap_err().to_string();
            assert!(e.contains(flags[0]) && e.contains("--no-launcher"), "{e}");
            assert!(e.contains("OMPI_COMM_WORLD_RANK=1"), "{e}");
        }
        let mut a = args(&["--ranks", "8", "--no-launcher"]);
        resolve(&mut a, fake_env(&MPI)).unwrap();
        assert!(!a.from_env);
        assert_eq!(a.ranks(), 8);
    }

    #[test]
    fn unclear_variables_stop_and_from_env_decides_alone() {
        let mut a = args(&[]);
        let e = resolve(&mut a, fake_env(&[("WORLD_SIZE", "4")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("WORLD_SIZE=4") && e.contains("--from-env"),
            "{e}"
        );
        // --from-env reads the variables itself, whatever they are.
        let mut a = args(&["--from-env"]);
        resolve(&mut a, fake_env(&[("WORLD_SIZE", "4")])).unwrap();
        assert!(a.from_env);
    }
}
