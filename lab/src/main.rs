//! `engram-lab`: eval, bench, tune, soak and ranker training, the
//! measuring and fitting that never serves a user. A binary of its own so
//! the product binary (`engram`) links none of it; `engram eval …` and the
//! others still work, by running this binary (found beside `engram`).
//! Commands live in the library (`engram_lab::run`); this file only parses.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// The same allocator as `engram`: `bench --in-process` and the soak's
/// in-process stack serve from this binary, and their figures must be the
/// product's (docs/benchmarks.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "engram-lab",
    version,
    about = "engram's lab: eval, bench, tune, soak, ranker training"
)]
struct Cli {
    /// TOML config file (default: ./engram.toml when present; env ENGRAM__SECTION__KEY overrides).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: engram_lab::LabCommand,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    engram_stack::cli::run("engram-lab", cli.config.as_deref(), |settings| {
        engram_lab::run(settings, cli.command)
    })
}
