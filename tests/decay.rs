//! Decay does something (issue 17, item 5): `decay_score` was 1.0 forever.
//! Now search-svc's job (and `engram decay --once`, the same pass) lowers
//! it by age since a memory was learned or last used. By default decay only
//! ranks: time alone never hides a live fact (issue 46, item 5); an
//! operator's `search.decay_floor` hides what fell below it. Real stack,
//! shared test Postgres.

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
async fn an_unused_old_memory_fades_ranks_below_fresh_ones_and_only_a_floor_hides_it()
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

    // The pass may find nothing left to do: another test's search-svc runs
    // the job every second over the shared database, and may have faded
    // these rows first. The scores below are what counts.
    engram::commands::decay_once(&ts.stack.settings).await?;
    assert!(
        score(&pool, &old).await? < 0.1,
        "the old memory did not fade"
    );
    assert!(score(&pool, &recent).await? > 0.99);
    assert!(score(&pool, &used).await? > 0.99, "use did not refresh it");

    // Default settings: the faded memory is still read, below the fresh.
    let shown = ids(&c.retrieval.retrieve(ask(false)).await?.into_inner());
    let at = |id: &str| shown.iter().position(|s| s == id);
    assert!(at(&old).is_some(), "time alone hid a memory: {shown:?}");
    assert!(
        at(&recent) < at(&old) && at(&used) < at(&old),
        "a faded memory above fresh ones: {shown:?}"
    );
    ts.shutdown().await;

    // An operator's floor hides it from default reads, not from history.
    let mut settings = engram_tests::settings().await?;
    settings.search.decay_floor = 0.1;
    let services = engram::stack::Service::ALL.into_iter().collect();
    let floored = TestStack::start_with(settings, services, "internal").await?;
    let mut c = floored.client().await?;
    let [old, recent] = [(); 2].map(|_| Uuid::new_v4().to_string());
    let memories = vec![
        kayak(&old, "was left at the north pier"),
        kayak(&recent, "now sits in the boathouse"),
    ];
    c.memories.upsert(UpsertRequest { memories }).await?;
    age(&pool, &old, 400).await?;
    engram::commands::decay_once(&floored.stack.settings).await?;
    let shown = ids(&c.retrieval.retrieve(ask(false)).await?.into_inner());
    assert!(
        !shown.contains(&old),
        "a faded memory above the floor: {shown:?}"
    );
    assert!(shown.contains(&recent), "{shown:?}");
    let all = ids(&c.retrieval.retrieve(ask(true)).await?.into_inner());
    assert!(all.contains(&old), "include_historical lost it: {all:?}");
    floored.shutdown().await;
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

/// A year with no feedback, per memory type (issue 46, item 5): each type
/// fades by its half-life (episodic 30 days: ~0.0002; conversation 14:
/// ~0; semantic 180: ~0.25; procedural 365: 0.5; documents never), and
/// every one of them is still in a default read.
#[tokio::test]
async fn a_year_unused_fades_every_type_but_hides_none() -> anyhow::Result<()> {
    let ts = TestStack::start("internal").await?;
    let pool = engram_common::db::test_database().await?;
    let mut c = ts.client().await?;
    let types = [
        "episodic",
        "semantic",
        "procedural",
        "conversation",
        "document",
    ];
    let ids_by_type: Vec<(&str, String)> = (types.iter())
        .map(|t| (*t, Uuid::new_v4().to_string()))
        .collect();
    let memories = (ids_by_type.iter())
        .map(|(t, id)| Memory {
            memory_type: (*t).into(),
            ..kayak(id, &format!("is kept by the {t} club"))
        })
        .collect();
    c.memories.upsert(UpsertRequest { memories }).await?;
    for (_, id) in &ids_by_type {
        age(&pool, id, 365).await?;
    }
    engram::commands::decay_once(&ts.stack.settings).await?;
    let mut req = ask(false);
    req.limit = Some(10);
    let shown = ids(&c.retrieval.retrieve(req).await?.into_inner());
    for (t, id) in &ids_by_type {
        let s = score(&pool, id).await?;
        assert!(
            shown.contains(id),
            "a {t} memory (decay {s:.4}) hidden after a year"
        );
    }
    assert!(
        score(&pool, &ids_by_type[0].1).await? < 0.01,
        "episodic did not fade"
    );
    assert!(
        score(&pool, &ids_by_type[4].1).await? > 0.99,
        "a document faded"
    );
    ts.shutdown().await;
    Ok(())
}

/// Issue 47, item 5: the pass keeps the newest vote of each kind per
/// memory and deletes the older ones, so repeated feedback cannot grow the
/// table without bound, and what decay reads (the newest use) is unchanged.
#[tokio::test]
async fn the_pass_keeps_only_the_newest_vote_of_each_kind_per_memory() -> anyhow::Result<()> {
    let pool = engram_common::db::test_database().await?;
    let ts = TestStack::start("internal").await?;
    let mut c = ts.client().await?;
    let id = Uuid::new_v4().to_string();
    let m = kayak(&id, "is tied to the jetty");
    c.memories
        .upsert(UpsertRequest { memories: vec![m] })
        .await?;
    let vote = |signal: &str, days: i32| {
        sqlx::query(
            "INSERT INTO feedback (tenant_id, agent_id, query_id, memory_id, signal, value, created_at) \
             SELECT tenant_id, 'a', 'q', id, $2, true, now() - make_interval(days => $3) \
             FROM memories WHERE id = $1",
        )
        .bind(Uuid::parse_str(&id).expect("uuid"))
        .bind(signal.to_string())
        .bind(days)
        .execute(&pool)
    };
    for days in [9, 3, 5, 7] {
        vote("used", days).await?;
    }
    vote("helpful", 4).await?;
    let settings = engram_tests::settings().await?;
    let policy = search_svc::decay::Policy::from_settings(&settings.search);
    search_svc::decay::run_pass(&pool, &policy).await?;

    let kept: Vec<(String, f64)> = sqlx::query_as(
        "SELECT signal, round(extract(epoch FROM now() - created_at) / 86400)::float8 \
         FROM feedback WHERE memory_id = $1 ORDER BY signal",
    )
    .bind(Uuid::parse_str(&id)?)
    .fetch_all(&pool)
    .await?;
    assert_eq!(
        kept,
        [("helpful".into(), 4.0), ("used".into(), 3.0)],
        "{kept:?}"
    );
    Ok(())
}
