//! The Python client (clients/python, the `engram-retrieval` distribution) against the real
//! stack: its wheel is built from this checkout (stubs generated from
//! proto/ at build time), installed into the project-local `.engram/`, and
//! its pytest suite (clients/python/tests) drives every method of the sync
//! and asyncio clients over the gateway's public port. The stack runs with
//! `search.update_detection` on, so the conflict review calls have real
//! detected pairs to list and settle.

use std::path::{Path, PathBuf};

use engram::stack::Service;
use engram_tests::TestStack;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Project-local home: `ENGRAM_HOME` when set (scripts/test sets it), else
/// the harness's `.engram`.
fn engram_home() -> PathBuf {
    std::env::var_os("ENGRAM_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| engram_common::db::test_settings().home)
}

/// Builds and installs the wheel (cached by a fingerprint of its inputs)
/// and the pinned test tools; returns the `PYTHONPATH` that holds both.
async fn install_client(root: &Path) -> anyhow::Result<String> {
    let out = tokio::process::Command::new("python3")
        .arg(root.join("tests/py/install_client.py"))
        .arg(engram_home())
        .output()
        .await?;
    anyhow::ensure!(
        out.status.success(),
        "install_client.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let path = v["pythonpath"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("install_client.py printed no pythonpath: {v}"))?;
    eprintln!("engram-retrieval wheel: {}", v["wheel"]);
    Ok(path.to_string())
}

/// pytest's closing line counts: `(passed, failed + errors, skipped)`.
fn summary(stdout: &str) -> (u32, u32, u32) {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.contains(" passed") || l.contains(" failed") || l.contains(" error"))
        .unwrap_or_default();
    let count = |word: &str| -> u32 {
        let words: Vec<&str> = line
            .split(|c: char| c == ',' || c == '=' || c.is_whitespace())
            .filter(|w| !w.is_empty())
            .collect();
        words
            .windows(2)
            .filter(|w| w[1].starts_with(word))
            .filter_map(|w| w[0].parse::<u32>().ok())
            .sum()
    };
    (
        count("passed"),
        count("failed") + count("error"),
        count("skipped"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn python_client_against_the_real_stack() -> anyhow::Result<()> {
    let root = workspace_root();
    let pythonpath = install_client(&root).await?;
    // Update detection on, so list_conflicts / review_conflict are tested
    // on pairs the detector really flagged (clients/python/tests/
    // test_conflicts.py); detect only (no auto-supersede), as by default.
    let mut settings = engram_tests::settings().await?;
    settings.search.update_detection = true;
    // Before the acknowledgement: the Python tests list a pair right after
    // writing it.
    settings.search.update_detection_queue = 0;
    let ts =
        TestStack::start_with(settings, Service::ALL.into_iter().collect(), "sensitive").await?;
    let gw = ts
        .stack
        .addr(Service::Retrieval)
        .ok_or_else(|| anyhow::anyhow!("no gateway"))?;

    let t0 = std::time::Instant::now();
    let client_dir = root.join("clients/python");
    let out = tokio::process::Command::new("python3")
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs"])
        .arg(client_dir.join("tests"))
        .current_dir(&client_dir)
        .env("PYTHONPATH", &pythonpath)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("ENGRAM_URL", gw.to_string())
        .env("ENGRAM_API_KEY", &ts.key)
        .env("ENGRAM_TENANT", &ts.tenant)
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("pytest took {:?}\n{stdout}\n{stderr}", t0.elapsed());
    ts.shutdown().await;

    anyhow::ensure!(
        out.status.success(),
        "pytest failed (exit {:?})",
        out.status.code()
    );
    let (passed, failed, skipped) = summary(&stdout);
    // Every test runs against this stack: none may be skipped for want of
    // a server, and an empty collection is a failure too.
    assert!(passed >= 65, "too few tests passed: {passed}\n{stdout}");
    assert_eq!((failed, skipped), (0, 0), "{stdout}");
    Ok(())
}

#[test]
fn summary_reads_pytest_closing_lines() {
    assert_eq!(summary("....\n31 passed in 4.20s\n"), (31, 0, 0));
    assert_eq!(
        summary("x\n= 2 failed, 28 passed, 1 skipped, 1 error in 9.1s =\n"),
        (28, 3, 1)
    );
    assert_eq!(summary("no tests ran in 0.01s\n"), (0, 0, 0));
}
