//! `cargo xtask`: oxccl's developer tasks.
//!
//! - `sweep`: the nccl-tests style performance sweep (the main job);
//! - `topo`: print a machine's topology and the rings/trees chosen on it;
//! - `simulate`: predicted time and busbw at scale from the cost model;
//! - `tidy`: repository checks (crate dependency arrows, settings);
//! - `settings`: write the README's variable table.

use clap::{Parser, Subcommand};

mod nccl_cols;
mod simulate;
mod sweep;
mod tidy;
mod tidy_layers;
mod tidy_settings;
mod topo;

#[derive(Debug, Parser)]
#[command(name = "xtask", about = "oxccl developer tasks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Performance sweep in the manner of nccl-tests.
    Sweep(sweep::SweepArgs),
    /// Show a topology (live, from an XML file or a preset) and the choices made on it.
    Topo(topo::TopoArgs),
    /// Predict time and bus bandwidth at scale from the cost model.
    Simulate(simulate::SimulateArgs),
    /// Repository checks.
    Tidy,
    /// Write README.md's variable table from `oxccl::settings::SETTINGS`.
    Settings,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Sweep(a) => sweep::run(a),
        Cmd::Topo(a) => topo::run(a),
        Cmd::Simulate(a) => simulate::run(a),
        Cmd::Tidy => tidy::run(),
        Cmd::Settings => tidy_settings::write_readme(&tidy::root()),
    }
}
