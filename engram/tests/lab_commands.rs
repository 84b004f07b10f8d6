//! The lab's commands through the product binary: `engram eval …` runs the
//! `engram-lab` binary beside it (engram links no lab code, issue 52);
//! without one, the user is told how to build it. `cargo test --workspace`
//! builds `engram-lab` too (lab/tests/cli.rs), so both halves run in CI.

use std::path::Path;
use std::process::{Command, Output};

fn engram(args: &[&str], lab_opt: Option<&str>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_engram"));
    c.args(args).env_remove("ENGRAM_LAB_BIN");
    if let Some(lab) = lab_opt {
        c.env("ENGRAM_LAB_BIN", lab);
    }
    c.output().expect("engram runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn help_names_the_lab_commands_and_an_unknown_one_is_refused() {
    let help = text(&engram(&["--help"], None).stdout);
    for c in ["eval", "bench", "tune", "ranker", "soak", "engram-lab"] {
        assert!(help.contains(c), "{c} in {help}");
    }
    let out = engram(&["frob"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("unrecognized subcommand 'frob'"));
}

#[test]
fn without_the_lab_binary_a_lab_command_says_how_to_build_it() {
    let out = engram(&["bench", "--help"], Some("/nonexistent/engram-lab"));
    assert_eq!(out.status.code(), Some(127));
    let err = text(&out.stderr);
    assert!(err.contains("cargo build --release -p engram-lab"), "{err}");
}

#[test]
fn with_the_lab_binary_beside_it_a_lab_command_answers_as_before() {
    let lab = Path::new(env!("CARGO_BIN_EXE_engram"))
        .with_file_name(format!("engram-lab{}", std::env::consts::EXE_SUFFIX));
    assert!(
        lab.is_file(),
        "{} missing: run with --workspace (or cargo build -p engram-lab)",
        lab.display()
    );
    let out = engram(&["eval", "current", "--help"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let help = text(&out.stdout);
    assert!(help.contains("Usage: engram-lab eval current"), "{help}");
    assert!(help.contains("--verbose"), "{help}");
}
