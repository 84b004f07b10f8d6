//! Issue 50 item 2: schemathesis (PyPI) generates requests from the
//! gateway's own OpenAPI document and sends them to the REST routes of a
//! real stack. Every answer must be a client error or a success that
//! matches the document: no 5xx, no response outside its schema. The run
//! is bounded (a fixed seed, 60 examples per operation and phase) and
//! must send at least 1,000 requests.

use std::path::{Path, PathBuf};
use std::time::Duration;

use engram_tests::TestStack;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// "2653 generated, 2653 passed" → 2653, from schemathesis's summary.
fn generated(summary: &str) -> Option<u64> {
    summary.lines().find_map(|l| {
        let before = l
            .split(" generated,")
            .next()
            .filter(|b| b.len() < l.len())?;
        before.split_whitespace().last()?.parse().ok()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_requests_get_no_server_error_and_no_answer_outside_the_schema()
-> anyhow::Result<()> {
    let root = workspace_root();
    let site = engram_tests::install_pytools(&root)
        .await?
        .join("schemathesis");
    let ts = TestStack::start("internal").await?;
    let http = ts
        .stack
        .http_addr_opt
        .ok_or_else(|| anyhow::anyhow!("no http"))?;
    // Hypothesis keeps its example database in the working directory.
    let scratch = tempfile::tempdir()?;
    let run = tokio::process::Command::new("python3")
        .arg(site.join("bin/schemathesis"))
        .args(["run", &format!("http://{http}/openapi.json")])
        .args(["-H", &format!("Authorization: Bearer {}", ts.key)])
        .args(["--checks", "not_a_server_error,response_schema_conformance"])
        .args(["--max-examples", "60", "--seed", "1", "--no-color"])
        .env("PYTHONPATH", &site)
        .env("SCHEMATHESIS_TELEMETRY", "false")
        .current_dir(scratch.path())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(600), run).await??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let tail: Vec<&str> = stdout.lines().rev().take(40).collect();
    let tail = tail.into_iter().rev().collect::<Vec<_>>().join("\n");
    assert!(
        out.status.success(),
        "schemathesis found failures:\n{stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let n = generated(&stdout).unwrap_or(0);
    println!("schemathesis: {n} requests\n{tail}");
    assert!(n >= 1000, "only {n} requests were generated:\n{tail}");
    ts.shutdown().await;
    Ok(())
}

#[test]
fn the_summary_count_is_read() {
    assert_eq!(
        generated("Test cases:\n  2653 generated, 2653 passed\n"),
        Some(2653)
    );
    let warned = "13 operations mostly rejected generated data\n  20 generated, 20 passed";
    assert_eq!(generated(warned), Some(20));
    assert_eq!(generated("nothing"), None);
}
