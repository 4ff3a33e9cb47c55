//! `cargo xtask simulate` (being written).

#[derive(Debug, clap::Args)]
pub struct SimulateArgs {}

pub fn run(_a: SimulateArgs) -> anyhow::Result<()> {
    anyhow::bail!("simulate is not implemented yet")
}
