//! What both binaries (`engram`, `engram-lab`) do around a command: load
//! the settings, start telemetry and the async runtime, run the command,
//! flush the spans, and turn the outcome into an exit code. Each `main`
//! only parses its arguments.

use std::future::Future;
use std::path::Path;
use std::process::ExitCode;

use engram_common::Settings;

use crate::out::is_broken_pipe;

/// Runs `command` with the settings from `config` (or ./engram.toml and
/// the environment) and reports a failure on stderr as `name: error`.
/// Settings that do not load exit 2; a closed stdout (`… | head`) is a
/// success: the reader had what it wanted.
pub fn run<F, Fut>(name: &str, config: Option<&Path>, command: F) -> ExitCode
where
    F: FnOnce(Settings) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let settings = match Settings::load(config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{name}: {e}");
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
            eprintln!("{name}: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(command(settings));
    // Flush the spans still batched for the OTLP exporter (no-op without it).
    engram_common::telemetry::shutdown();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e:#}");
            ExitCode::FAILURE
        }
    }
}
