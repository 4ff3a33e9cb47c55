//! `cargo xtask tidy`: checks the crate dependency arrows of DESIGN.md.

pub fn run() -> anyhow::Result<()> {
    anyhow::bail!("tidy is not implemented yet")
}
