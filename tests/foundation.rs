//! Foundation: the demo path end to end on the real stack, migrations
//! idempotence, restart on an existing data dir, and clear start-up errors.

use engram::stack::{Stack, StackOptions};
use engram_common::Settings;
use engram_tests::{TestStack, settings};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn demo_path_returns_real_results() -> anyhow::Result<()> {
    let ts = TestStack::start("sensitive").await?;
    let mut client = ts.client().await?;
    let n = engram::demo::load_sample(&mut client, &ts.tenant).await?;
    assert!(n >= 20, "sample has {n} memories");
    let r = engram::demo::run_query(&mut client, "What is the deadline for the Atlas migration?")
        .await?;
    let text: Vec<String> = r
        .records
        .iter()
        .filter_map(|x| x.memory.as_ref())
        .map(|m| m.content.clone())
        .collect();
    assert!(
        text.iter()
            .any(|c| c.contains("deadline moved to the end of Q3")),
        "expected the current deadline among {text:?}"
    );
    // The superseded version is closed, so default retrieval never shows it.
    assert!(
        !text.iter().any(|c| c.contains("end of Q2 2025")),
        "superseded memory returned: {text:?}"
    );
    let rendered = engram::demo::render("q", &r);
    assert!(rendered.contains("deadline moved"), "{rendered}");
    let multi = engram::demo::run_query(
        &mut client,
        "Who leads the project that migrates the billing system?",
    )
    .await?;
    assert_eq!(multi.route, engram_proto::QueryRoute::MultiHop as i32);
    // The clause's memory opens the answer and the bridge answer follows it
    // (issue 49: the bridge answer in the top 2 of Retrieve).
    let top2: Vec<&str> = (multi.records.iter().take(2))
        .filter_map(|x| x.memory.as_ref().map(|m| m.content.as_str()))
        .collect();
    assert!(
        top2.iter()
            .any(|c| c.contains("engineering lead of Project Atlas")),
        "the bridge answer is not in the top 2: {top2:?}"
    );
    assert!(
        multi.records.iter().any(|x| x
            .provenance
            .as_ref()
            .is_some_and(|p| p.strategies.iter().any(|s| s.strategy == "graph"))),
        "multi-hop answer has no graph provenance"
    );
    // Agentic retrieval bridges it: the project first, then its lead.
    let agentic =
        engram::demo::run_agentic(&mut client, &ts.tenant, engram::demo::BRIDGE_QUERY).await?;
    let rendered = engram::demo::render_agentic(engram::demo::BRIDGE_QUERY, &agentic);
    assert!(
        agentic
            .steps
            .iter()
            .any(|s| s.detail == "bridge entity: Project Atlas"),
        "{rendered}"
    );
    assert!(
        agentic
            .results
            .iter()
            .any(|x| x.text.contains("engineering lead of Project Atlas")),
        "{rendered}"
    );
    // Loading twice is idempotent (stable ids).
    engram::demo::load_sample(&mut client, &ts.tenant).await?;
    let r2 = engram::demo::run_query(&mut client, "oat-milk flat white").await?;
    let hits = r2
        .records
        .iter()
        .filter(|x| {
            x.memory
                .as_ref()
                .is_some_and(|m| m.content.contains("oat-milk"))
        })
        .count();
    assert_eq!(hits, 1, "duplicate rows after re-ingest");
    ts.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn migrations_apply_twice() -> anyhow::Result<()> {
    let pool = engram_common::db::test_database().await?;
    engram_common::db::MIGRATOR.run(&pool).await?;
    engram_common::db::MIGRATOR.run(&pool).await?;
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations")
        .fetch_one(&pool)
        .await?;
    assert!(n >= 1);
    Ok(())
}

#[tokio::test]
async fn bad_database_url_is_one_clear_error() -> anyhow::Result<()> {
    let mut s = settings().await?;
    s.database.url_opt = Some("postgres://nobody@127.0.0.1:1/none".into());
    let err = Stack::start(
        s,
        StackOptions {
            ephemeral_ports: true,
            ..Default::default()
        },
    )
    .await
    .err()
    .ok_or_else(|| anyhow::anyhow!("expected an error"))?;
    let msg = format!("{err:#}");
    assert!(
        msg.contains("cannot connect to postgres at 127.0.0.1:1"),
        "{msg}"
    );
    let mut s = settings().await?;
    s.database.url_opt = Some("mysql:/x".into());
    let err = Stack::start(
        s,
        StackOptions {
            ephemeral_ports: true,
            ..Default::default()
        },
    )
    .await
    .err()
    .ok_or_else(|| anyhow::anyhow!("expected an error"))?;
    assert!(
        format!("{err:#}").contains("not a valid postgres URL"),
        "{err:#}"
    );
    Ok(())
}

#[tokio::test]
async fn port_in_use_is_one_clear_error() -> anyhow::Result<()> {
    let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let err = engram_common::server::bind(&taken.local_addr()?.to_string(), "retrieval")
        .await
        .err()
        .ok_or_else(|| anyhow::anyhow!("expected an error"))?;
    let msg = err.to_string();
    assert!(
        msg.contains("already in use") && msg.contains("ENGRAM__LISTEN__RETRIEVAL"),
        "{msg}"
    );
    Ok(())
}

/// Runs `body` on a blocking thread with a current-thread runtime and
/// settings for a fresh embedded data dir of its own (removed afterwards):
/// for tests that start and stop servers, which must never touch the shared
/// test Postgres.
async fn with_own_data_dir(
    prefix: &str,
    body: impl FnOnce(&Settings, &tokio::runtime::Runtime) -> anyhow::Result<()> + Send + 'static,
) -> anyhow::Result<()> {
    let mut s = engram_common::db::test_settings();
    let dir = format!("{prefix}-{}", uuid::Uuid::new_v4().simple());
    s.database.embedded_data_dir = dir.clone().into();
    let s2 = s.clone();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        body(&s2, &rt)
    })
    .await??;
    let _ = std::fs::remove_dir_all(s.home.join(dir));
    Ok(())
}

#[tokio::test]
async fn restart_on_an_existing_data_dir_keeps_data() -> anyhow::Result<()> {
    with_own_data_dir("test-restart", |s, rt| {
        let mut pg = engram_common::pg::EmbeddedPostgres::start(s)?;
        let url = pg.url();
        rt.block_on(async {
            let pool = engram_common::db::connect(&url, 2).await?;
            engram_common::db::MIGRATOR.run(&pool).await?;
            sqlx::query("CREATE TABLE IF NOT EXISTS restart_probe (v int)")
                .execute(&pool)
                .await?;
            sqlx::query("INSERT INTO restart_probe VALUES (42)")
                .execute(&pool)
                .await?;
            pool.close().await;
            anyhow::Ok(())
        })?;
        pg.stop();
        let pg = engram_common::pg::EmbeddedPostgres::start(s)?;
        let url = pg.url();
        let v: i32 = rt.block_on(async {
            let pool = engram_common::db::connect(&url, 2).await?;
            engram_common::db::MIGRATOR.run(&pool).await?;
            let v = sqlx::query_scalar("SELECT v FROM restart_probe")
                .fetch_one(&pool)
                .await?;
            pool.close().await;
            anyhow::Ok(v)
        })?;
        assert_eq!(v, 42);
        drop(pg);
        Ok(())
    })
    .await
}

/// Issue 47, item 18: initdb's `trust` let any local OS user (`nobody`
/// included) read every tenant's rows over TCP. A fresh data dir is made
/// the way older ones were (trusting), so this also shows one secured on
/// start.
#[tokio::test]
async fn the_embedded_server_asks_every_connection_for_its_password() -> anyhow::Result<()> {
    with_own_data_dir("test-password", |s, rt| {
        let pg = engram_common::pg::EmbeddedPostgres::start(s)?;
        let hba = std::fs::read_to_string(pg.data_dir().join("pg_hba.conf"))?;
        assert!(!hba.contains("trust"), "{hba}");
        let port = pg.port();
        rt.block_on(async {
            for who in ["postgres", "postgres:guess", "nobody"] {
                let url = format!("postgres://{who}@127.0.0.1:{port}/engram");
                let refused = engram_common::db::connect(&url, 1).await;
                assert!(refused.is_err(), "{who} got in");
            }
            let pool = engram_common::db::connect(&pg.url(), 1).await?;
            let one: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&pool).await?;
            assert_eq!(one, 1);
            pool.close().await;
            anyhow::Ok(())
        })?;
        drop(pg);
        Ok(())
    })
    .await
}

/// A parallel test binary (or a second `engram serve`) that adopts the
/// running server must not stop it on exit: that once turned a whole CI run's
/// queries into "the database system is shutting down".
#[tokio::test]
async fn an_adopted_server_outlives_its_adopter() -> anyhow::Result<()> {
    with_own_data_dir("test-adopt", |s, rt| {
        let owner = engram_common::pg::EmbeddedPostgres::start(s)?;
        let adopter = engram_common::pg::EmbeddedPostgres::start(s)?;
        assert_eq!(adopter.port(), owner.port());
        drop(adopter);
        let one: i32 = rt.block_on(async {
            let pool = engram_common::db::connect(&owner.url(), 1).await?;
            let one = sqlx::query_scalar("SELECT 1").fetch_one(&pool).await?;
            pool.close().await;
            anyhow::Ok(one)
        })?;
        assert_eq!(one, 1);
        drop(owner);
        Ok(())
    })
    .await
}

#[test]
fn missing_pip_is_one_clear_error() {
    let home = std::env::temp_dir().join(format!("engram-nopip-{}", uuid::Uuid::new_v4().simple()));
    let err = engram_common::bootstrap::ensure_python_packages_with(&home, "/nonexistent/python3")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("python3 with pip is needed"), "{err}");
    let _ = std::fs::remove_dir_all(home);
}

/// A first start derives the quantised embedder itself (the path a machine
/// without scripts/test takes): into a fresh home, from the installed
/// wheels, once; a second call reuses it.
#[tokio::test]
async fn a_first_start_derives_the_quantized_embedder() -> anyhow::Result<()> {
    let shared = engram_common::db::test_settings();
    let installed = engram_common::bootstrap::ensure_python_packages(&shared.home)?;
    let home = std::env::temp_dir().join(format!("engram-quant-{}", uuid::Uuid::new_v4().simple()));
    let derived = {
        let (home, installed) = (home.clone(), installed.clone());
        tokio::task::spawn_blocking(move || {
            engram_common::bootstrap::ensure_quantized_embedder(&home, &installed)
        })
        .await??
    };
    assert!(
        derived.starts_with(&home) && derived.is_file(),
        "{}",
        derived.display()
    );
    let modified = std::fs::metadata(&derived)?.modified()?;
    let again = engram_common::bootstrap::ensure_quantized_embedder(&home, &installed)?;
    assert_eq!(again, derived);
    assert_eq!(
        std::fs::metadata(&again)?.modified()?,
        modified,
        "derived twice"
    );
    let _ = std::fs::remove_dir_all(home);
    Ok(())
}
