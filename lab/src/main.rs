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
    let settings = match engram_common::Settings::load(cli.config.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("engram-lab: {e}");
            return ExitCode::from(2);
        }
    };
    engram_common::telemetry::init(&settings.log);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("engram-lab: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(engram_lab::run(settings, cli.command));
    // Flush the spans still batched for the OTLP exporter (no-op without it).
    engram_common::telemetry::shutdown();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("engram-lab: {e:#}");
            ExitCode::FAILURE
        }
    }
}
