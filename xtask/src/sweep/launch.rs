//! Where the sweep's ranks come from: threads of this process (`--ranks
//! N`), or this process as one rank of several that a launcher started
//! (`--from-env`; `--procs` starts them itself, see `procs`).

use anyhow::{bail, Context};
use oxccl::{Communicator, Config};

use super::args::SweepArgs;

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
        oxccl::init_all_with(a.ranks, config).context("creating communicators")
    }
}
