//! `cargo xtask sweep` (being written).

#[derive(Debug, clap::Args)]
pub struct SweepArgs {}

pub fn run(_a: SweepArgs) -> anyhow::Result<()> {
    anyhow::bail!("sweep is not implemented yet")
}
