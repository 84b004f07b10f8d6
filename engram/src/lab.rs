//! The lab's commands (`eval`, `bench`, `tune`, `soak`, `ranker`) from the
//! product binary: `engram` links no lab code (issue 52), so it runs the
//! `engram-lab` binary with the same arguments, the way `git` runs
//! `git-<command>`. The lab's services run from this `engram` (it is told
//! where through `ENGRAM_BIN`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The subcommands `engram-lab` answers.
pub const COMMANDS: &[&str] = &["eval", "tune", "ranker", "bench", "soak"];

/// What `engram --help` says about them.
pub const HELP: &str = "Lab commands (run by the engram-lab binary beside this one; \
build it with `cargo build --release -p engram-lab`):\n  \
eval    recall, latency, what is true now, abstention (docs/benchmarks.md)\n  \
bench   latency and throughput on a synthetic tenant\n  \
tune    fit the fusion weights (and the Stage 4 ranker)\n  \
ranker  train the Stage 4 ranker from stored feedback\n  \
soak    reliability: noisy neighbour, faults, a slowed downstream, a soak";

/// The lab binary: `ENGRAM_LAB_BIN`, else `engram-lab` beside this
/// executable, else whatever `engram-lab` is on `PATH`.
fn lab_binary(me: &Path) -> PathBuf {
    if let Some(bin) = std::env::var_os("ENGRAM_LAB_BIN") {
        return PathBuf::from(bin);
    }
    let beside = me.with_file_name(format!("engram-lab{}", std::env::consts::EXE_SUFFIX));
    match beside.is_file() {
        true => beside,
        false => PathBuf::from("engram-lab"),
    }
}

/// Runs `engram-lab [--config F] <args>` (stdin, stdout and stderr
/// inherited), waits for it and returns its exit code; `args` starts with
/// the subcommand.
pub fn run(config: Option<&Path>, args: Vec<OsString>) -> ExitCode {
    let command = args.first().map(|a| a.to_string_lossy().into_owned());
    let command = command.unwrap_or_default();
    if !COMMANDS.contains(&command.as_str()) {
        eprintln!(
            "error: unrecognized subcommand '{command}'\n\nFor more information, try '--help'."
        );
        return ExitCode::from(2);
    }
    let me = match std::env::current_exe() {
        Ok(me) => me,
        Err(e) => {
            eprintln!("engram: locating this executable: {e}");
            return ExitCode::FAILURE;
        }
    };
    let lab = lab_binary(&me);
    let mut child = std::process::Command::new(&lab);
    if let Some(c) = config {
        child.arg("--config").arg(c);
    }
    child.args(&args).env("ENGRAM_BIN", &me);
    match child.status() {
        Ok(status) => status_code(status),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!(
                "engram: `{command}` is a lab command, run by {}, which is neither beside {} \
                 nor on PATH (build it: cargo build --release -p engram-lab)",
                lab.display(),
                me.display()
            );
            ExitCode::from(127)
        }
        Err(e) => {
            eprintln!("engram: running {}: {e}", lab.display());
            ExitCode::FAILURE
        }
    }
}

/// The child's exit code; killed by a signal, 128 + the signal as a shell says.
fn status_code(status: std::process::ExitStatus) -> ExitCode {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            return ExitCode::from(128u8.saturating_add(u8::try_from(sig).unwrap_or(0)));
        }
    }
    let code = status.code().unwrap_or(1);
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
