//! Decay does something (issue 17, item 5): `decay_score` was 1.0 forever.
//! Now search-svc's job (and `engram decay --once`, the same pass) lowers
//! it by age since a memory was learned or last used, and default reads
//! hide what fell below the floor. Real stack, shared test Postgres.

use std::time::Duration;

use engram_proto::{Memory, RetrievalMode, RetrieveRequest, UpsertRequest};
use engram_tests::TestStack;
use sqlx::PgPool;
use uuid::Uuid;

/// Moves a memory's ingestion (and event) time `days` into the past, as if
/// engram had learned it then and nobody had used it since.
async fn age(pool: &PgPool, id: &str, days: i32) -> anyhow::Result<()> {
    sqlx::query(
        "UPDATE memories SET ingestion_time = now() - make_interval(days => $2), \
         event_time = now() - make_interval(days => $2) WHERE id = $1",
    )
    .bind(Uuid::parse_str(id)?)
    .bind(days)
    .execute(pool)
    .await?;
    Ok(())
}

async fn score(pool: &PgPool, id: &str) -> anyhow::Result<f32> {
    Ok(
        sqlx::query_scalar("SELECT decay_score FROM memories WHERE id = $1")
            .bind(Uuid::parse_str(id)?)
            .fetch_one(pool)
            .await?,
    )
}

fn kayak(id: &str, where_: &str) -> Memory {
    Memory {
        id: id.into(),
        memory_type: "episodic".into(),
        content: format!("Kayak trip note: the zebra-striped kayak {where_}."),
        ..Default::default()
    }
}

fn ask(historical: bool) -> RetrieveRequest {
    RetrieveRequest {
        text: "where is the zebra-striped kayak?".into(),
        mode: RetrievalMode::Keyword as i32,
        include_historical: historical,
        no_cache: true,
        ..Default::default()
    }
}

fn ids(r: &engram_proto::RetrieveResponse) -> Vec<String> {
    r.records
        .iter()
        .filter_map(|rec| rec.memory.as_ref().map(|m| m.id.clone()))
        .collect()
}

#[tokio::test]
async fn an_unused_old_memory_fades_below_the_floor_and_a_fresh_or_used_one_stays()
-> anyhow::Result<()> {
    let ts = TestStack::start("internal").await?;
    let pool = engram_common::db::test_database().await?;
    let mut c = ts.client().await?;
    let [old, recent, used] = [(); 3].map(|_| Uuid::new_v4().to_string());
    let memories = vec![
        kayak(&old, "was left at the north pier"),
        kayak(&recent, "now sits in the boathouse"),
        kayak(&used, "has a cracked paddle"),
    ];
    c.memories.upsert(UpsertRequest { memories }).await?;
    // Episodic half-life 30 days: 400 days unused is ~0.0001.
    age(&pool, &old, 400).await?;
    age(&pool, &used, 400).await?;
    sqlx::query(
        "INSERT INTO feedback (tenant_id, agent_id, query_id, memory_id, signal, value) \
         VALUES ($1, 'agent-1', 'q-1', $2, 'used', true)",
    )
    .bind(&ts.tenant)
    .bind(Uuid::parse_str(&used)?)
    .execute(&pool)
    .await?;

    let report = engram::commands::decay_once(&ts.stack.settings).await?;
    assert!(report.updated >= 1, "{report:?}");
    assert!(
        score(&pool, &old).await? < 0.1,
        "the old memory did not fade"
    );
    assert!(score(&pool, &recent).await? > 0.99);
    assert!(score(&pool, &used).await? > 0.99, "use did not refresh it");

    let shown = ids(&c.retrieval.retrieve(ask(false)).await?.into_inner());
    assert!(!shown.contains(&old), "a faded memory in a default read");
    assert!(
        shown.contains(&recent) && shown.contains(&used),
        "{shown:?}"
    );
    let all = ids(&c.retrieval.retrieve(ask(true)).await?.into_inner());
    assert!(all.contains(&old), "include_historical lost it: {all:?}");
    ts.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn the_job_in_search_svc_runs_on_its_interval() -> anyhow::Result<()> {
    let mut settings = engram_tests::settings().await?;
    settings.search.decay_interval_secs = 1;
    let services = engram::stack::Service::ALL.into_iter().collect();
    let ts = TestStack::start_with(settings, services, "internal").await?;
    let pool = engram_common::db::test_database().await?;
    let mut c = ts.client().await?;
    let id = Uuid::new_v4().to_string();
    let memories = vec![kayak(&id, "drifted out to sea")];
    c.memories.upsert(UpsertRequest { memories }).await?;
    age(&pool, &id, 400).await?;
    // A wait for the schedule, not a latency bound: generous on a busy machine.
    let mut faded = false;
    for _ in 0..120 {
        if score(&pool, &id).await? < 0.1 {
            faded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(faded, "no decay pass ran within 30 s at a 1 s interval");
    ts.shutdown().await;
    Ok(())
}
