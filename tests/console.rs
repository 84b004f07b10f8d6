//! Issue 50 item 4: the memory console in a real headless Chromium (Debian's
//! `chromium` and `chromium-driver`, driven by selenium from PyPI) on a real
//! stack with two tenants: sign in with a key, search with explain drawn,
//! open a memory and its versions, confirm a detected conflict, and find
//! none of the other tenant's memories or conflicts
//! (tests/py/console_probe.py). Screenshots land in
//! `target/console-screenshots/`.
//!
//! `scripts/test` installs Chromium and sets `ENGRAM_REQUIRE_BROWSER=1`, so
//! CI fails without it; a plain `cargo test` on a machine with no Chromium
//! says why it skips.

use std::path::{Path, PathBuf};
use std::time::Duration;

use engram::client::Client;
use engram_proto::{Memory, UpsertRequest};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Chromium and its WebDriver, where Debian installs them.
fn browser() -> Option<(PathBuf, PathBuf)> {
    let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .map(PathBuf::from)
        .into_iter()
        .find(|p| p.exists())?;
    let driver = PathBuf::from("/usr/bin/chromedriver");
    driver.exists().then_some((chromium, driver))
}

fn days_ago(days: i64) -> prost_types::Timestamp {
    let t = chrono::Utc::now() - chrono::Duration::days(days);
    prost_types::Timestamp {
        seconds: t.timestamp(),
        nanos: 0,
    }
}

async fn write(c: &mut Client, id: &str, content: &str, days: i64) -> anyhow::Result<String> {
    let m = Memory {
        id: id.into(),
        content: content.into(),
        memory_type: "semantic".into(),
        event_time: Some(days_ago(days)),
        ..Default::default()
    };
    let r = (c
        .memories
        .upsert(UpsertRequest { memories: vec![m] })
        .await?)
        .into_inner();
    Ok(r.results.first().map(|r| r.id.clone()).unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_searches_opens_and_reviews_in_chromium_and_sees_only_their_tenant()
-> anyhow::Result<()> {
    let Some((chromium, driver)) = browser() else {
        let required = std::env::var("ENGRAM_REQUIRE_BROWSER").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "no chromium/chromedriver; scripts/test installs them"
        );
        println!(
            "skipped: no /usr/bin/chromium and /usr/bin/chromedriver (apt install chromium chromium-driver)"
        );
        return Ok(());
    };
    let root = workspace_root();
    let site = engram_tests::install_pytools(&root).await?.join("selenium");
    let mut settings = engram_tests::settings().await?;
    settings.search.update_detection = true;
    settings.search.update_detection_queue = 0; // the pair is there at the ack
    let (stack, uri, keys) =
        engram_tests::stack_with_keys(settings, &[("a", "sensitive"), ("b", "sensitive")]).await?;
    let http = stack
        .http_addr_opt
        .ok_or_else(|| anyhow::anyhow!("no http"))?;
    let mut a = Client::connect(&uri, &keys[0]).await?;
    let mut b = Client::connect(&uri, &keys[1]).await?;
    write(&mut a, "", "Priya lives in Berlin.", 150).await?;
    write(&mut a, "", "Priya likes hiking on weekends.", 120).await?;
    write(&mut a, "", "Priya moved to Amsterdam.", 10).await?;
    let edited = uuid::Uuid::new_v4().to_string();
    let first = "The team standup is at 9:30 every morning.";
    write(&mut a, &edited, first, 30).await?;
    write(
        &mut a,
        &edited,
        "The team standup is at 10:00 every morning.",
        5,
    )
    .await?;
    let other = "The vault code of tenant b is 7781.";
    let other_id = write(&mut b, "", other, 3).await?;

    let config = serde_json::json!({
        "base": format!("http://{http}"),
        "key_a": keys[0], "key_b": keys[1],
        "edited_id": edited, "first_text": first,
        "other_id": other_id, "other_text": other,
        "shots": root.join("target/console-screenshots"),
        "chromium": chromium, "driver": driver,
    });
    let run = tokio::process::Command::new("python3")
        .arg(root.join("tests/py/console_probe.py"))
        .arg(config.to_string())
        .env("PYTHONPATH", &site)
        .env("SE_OFFLINE", "true")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(300), run).await??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "the console probe failed:\n{stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stack.shutdown().await;
    Ok(())
}
