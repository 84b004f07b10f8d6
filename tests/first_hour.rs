//! Issue 24, "the first hour": a missing cross-encoder is reported once at
//! start and does not degrade queries, and a clean shutdown stops the
//! embedded Postgres a crashed run left behind.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use engram::stack::Service;
use engram_proto::RetrieveRequest;
use engram_tests::{TestStack, settings};

/// Every log line of this test binary (one global subscriber: services log
/// from tokio worker threads, which a thread-local one would miss).
fn captured_logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static BUF: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    BUF.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let writer = Capture(buf.clone());
        let sub = tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || writer.clone())
            .finish();
        let _ = tracing::subscriber::set_global_default(sub);
        buf
    })
}

#[derive(Clone)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut v) = self.0.lock() {
            v.extend_from_slice(b);
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `pipeline.cross_encoder = true` with no model: one WARN at start naming
/// the path and how to supply one; queries skip the stage as if it were off
/// (no `degraded=rerank`, no rerank latency, no per-query warning).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn missing_cross_encoder_is_reported_once_and_degrades_nothing() -> anyhow::Result<()> {
    let logs = captured_logs();
    let mut s = settings().await?;
    s.pipeline.cross_encoder = true;
    let missing = std::env::temp_dir().join(format!("engram-no-ce-{}", uuid::Uuid::new_v4()));
    s.models.cross_encoder_dir_opt = Some(missing.clone());
    let ts = TestStack::start_with(s, Service::ALL.into_iter().collect(), "sensitive").await?;
    let mut client = ts.client().await?;
    engram::demo::load_sample(&mut client, &ts.tenant).await?;
    for text in [
        "Who leads the project that migrates the billing system?",
        "oat-milk flat white",
        "What does Alice drink?",
    ] {
        let r = client
            .retrieval
            .retrieve(RetrieveRequest {
                text: text.into(),
                limit: Some(3),
                no_cache: true,
                ..Default::default()
            })
            .await?
            .into_inner();
        assert!(!r.records.is_empty(), "{text}: no records");
        assert!(
            !r.degraded_stages.iter().any(|d| d == "rerank"),
            "{text}: degraded {:?}",
            r.degraded_stages
        );
        assert!(
            !r.stage_latencies.iter().any(|l| l.stage == "rerank"),
            "{text}: a rerank stage ran"
        );
    }
    ts.shutdown().await;

    let text = String::from_utf8(logs.lock().map(|b| b.clone()).unwrap_or_default())?;
    let events: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let missing = missing.display().to_string();
    let about_model: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["message"].as_str().is_some_and(|m| m.contains(&missing)))
        .collect();
    assert_eq!(about_model.len(), 1, "one report of the model: {text}");
    let report = &about_model[0];
    assert_eq!(report["level"], "WARN", "{report}");
    let m = report["message"].as_str().unwrap_or_default();
    for how in [
        "../shared/models/engram-ce-minilm-l6",
        "models.cross_encoder_dir_opt",
        "pipeline.cross_encoder = false",
    ] {
        assert!(m.contains(how), "{how} missing in {m}");
    }
    assert!(
        !events.iter().any(|e| e["message"] == "rerank degraded"),
        "a per-query rerank warning: {text}"
    );
    Ok(())
}

const CRASH_CHILD_ENV: &str = "ENGRAM_FIRST_HOUR_CRASH_DATA_DIR";
const CRASH_TEST: &str = "a_clean_shutdown_stops_the_orphan_of_a_crashed_run";

fn postmaster_pid(data: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(data.join("postmaster.pid")).ok()?;
    let pid: u32 = text.lines().next()?.trim().parse().ok()?;
    Path::new(&format!("/proc/{pid}")).exists().then_some(pid)
}

fn gone(pid: u32) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while Path::new(&format!("/proc/{pid}")).exists() {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    true
}

/// A run that dies hard (this test binary re-run as a child that starts
/// the server and exits without dropping anything) leaves the postmaster
/// running. The next run adopts it; a second live user keeps it running;
/// the clean shutdown of the last one stops it. Uses a data dir of its own,
/// never the shared test Postgres.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_shutdown_stops_the_orphan_of_a_crashed_run() -> anyhow::Result<()> {
    let mut s = engram_common::db::test_settings();
    s.database.url_opt = None;
    if let Some(dir) = std::env::var_os(CRASH_CHILD_ENV) {
        s.database.embedded_data_dir = PathBuf::from(dir);
        let pg = engram_common::pg::EmbeddedPostgres::start(&s)?;
        println!("child started postgres on {}", pg.port());
        // The crash: no destructor runs.
        std::process::exit(0);
    }
    let name = format!("test-first-hour-{}", uuid::Uuid::new_v4().simple());
    s.database.embedded_data_dir = name.clone().into();
    let data = s.home.join(&name);
    let result = async {
        let out = std::process::Command::new(std::env::current_exe()?)
            .args(["--exact", CRASH_TEST, "--nocapture", "--test-threads=1"])
            .env(CRASH_CHILD_ENV, &name)
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "crashing child failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let pid = postmaster_pid(&data)
            .ok_or_else(|| anyhow::anyhow!("the crashed run left no postmaster"))?;

        // What `engram up` does: Database::open adopts, Stack::shutdown closes.
        let db = engram_common::db::Database::open(&s).await?;
        let s2 = s.clone();
        let other =
            tokio::task::spawn_blocking(move || engram_common::pg::EmbeddedPostgres::start(&s2))
                .await??;
        assert_eq!(postmaster_pid(&data), Some(pid), "adopted, not restarted");
        let one: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&db.pool).await?;
        assert_eq!(one, 1);
        db.close().await;
        assert_eq!(
            postmaster_pid(&data),
            Some(pid),
            "stopped under another live user"
        );
        tokio::task::spawn_blocking(move || drop(other)).await?;
        anyhow::ensure!(
            tokio::task::spawn_blocking(move || gone(pid)).await?,
            "the last user's clean shutdown left postmaster {pid} running"
        );
        Ok(())
    }
    .await;
    if let Some(pid) = postmaster_pid(&data) {
        // A failed run must not leave its server behind either.
        let _ = std::process::Command::new("kill")
            .arg(pid.to_string())
            .status();
        gone(pid);
    }
    let _ = std::fs::remove_dir_all(&data);
    result
}
