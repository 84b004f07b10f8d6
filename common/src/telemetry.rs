//! Logging setup: JSON lines for machines, pretty output in a terminal.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::settings::LogSettings;

/// Installs the global subscriber once; later calls are no-ops (tests).
pub fn init(log: &LogSettings) {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .or_else(|| EnvFilter::try_new(&log.filter).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let json = match log.format.as_str() {
        "json" => true,
        "pretty" => false,
        _ => !std::io::stderr().is_terminal(),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
}
