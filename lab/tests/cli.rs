//! The `engram-lab` binary parses every lab command (`engram` hands them
//! to it; engram/tests/lab_commands.rs checks that side). Being an
//! integration test, this also makes `cargo test --workspace` build the
//! binary where `engram` looks for it.

use std::process::Command;

#[test]
fn every_lab_command_is_there() {
    let out = Command::new(env!("CARGO_BIN_EXE_engram-lab"))
        .arg("--help")
        .output()
        .expect("engram-lab runs");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for c in ["eval", "tune", "ranker", "bench", "soak"] {
        assert!(help.contains(c), "{c} in {help}");
    }
}

/// `engram` forwards exactly the commands this binary has.
#[test]
fn engram_forwards_exactly_the_lab_commands() {
    use clap::Subcommand;
    let cmd = engram_lab::LabCommand::augment_subcommands(clap::Command::new("engram-lab"));
    let mut ours: Vec<&str> = cmd.get_subcommands().map(|c| c.get_name()).collect();
    let mut forwarded = engram::lab::COMMANDS.to_vec();
    ours.sort_unstable();
    forwarded.sort_unstable();
    assert_eq!(ours, forwarded);
}
