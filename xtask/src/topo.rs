//! `cargo xtask topo` (being written).

#[derive(Debug, clap::Args)]
pub struct TopoArgs {}

pub fn run(_a: TopoArgs) -> anyhow::Result<()> {
    anyhow::bail!("topo is not implemented yet")
}
