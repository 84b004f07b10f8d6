//! The learned Stage 4 ranker learns from feedback (issue 18): answers
//! that got feedback leave training examples in Postgres, `engram ranker
//! train` fits a model from them, and the gateway swaps it in without a
//! restart, which changes the ranking.

use std::time::Duration;

use engram::client::Client;
use engram_proto::{FeedbackItem, FeedbackRequest, FeedbackSignal, RetrieveRequest};
use engram_tests::TestStack;

const QUERY: &str = "What did we decide about the database migration?";

/// The long note the feedback keeps calling helpful, though fusion ranks
/// it low: nothing in it matches the question's words.
const LONG_NOTE: &str = "Offsite notes. The team walked through the quarterly plan, the hiring \
     pipeline, the budget for conferences, the on-call rotation for the holidays, the design \
     review cadence, the customer advisory board, the roadmap themes for next year, the \
     documentation sprint, the intern projects, and the office move in spring; everyone agreed \
     to write shorter status reports and to keep Fridays free of meetings.";

async fn ask(c: &mut Client) -> anyhow::Result<engram_proto::RetrieveResponse> {
    let req = RetrieveRequest {
        text: QUERY.into(),
        limit: Some(6),
        no_cache: true,
        ..Default::default()
    };
    Ok(c.retrieval.retrieve(req).await?.into_inner())
}

fn position(r: &engram_proto::RetrieveResponse, content: &str) -> Option<usize> {
    r.records
        .iter()
        .position(|s| s.memory.as_ref().is_some_and(|m| m.content == content))
}

async fn examples_stored(pool: &sqlx::PgPool, tenant: &str) -> anyhow::Result<i64> {
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM ranker_examples WHERE tenant_id = $1")
        .bind(tenant)
        .fetch_one(pool)
        .await?;
    Ok(n)
}

#[tokio::test]
async fn feedback_trains_a_model_the_gateway_swaps_in() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let model_path = dir.path().join("ranker.json");
    let shipped = retrieval_svc::lab::Ranker::new(serde_json::from_str(include_str!(
        "../models/ranker/default.json"
    ))?)?;
    std::fs::write(&model_path, serde_json::to_string(shipped.model())?)?;
    let mut settings = engram_tests::settings().await?;
    settings.pipeline.ranker.model_path_opt = Some(model_path.clone());
    settings.pipeline.ranker.reload_ms = 100;
    let ts = TestStack::start_with(
        settings,
        engram::stack::Service::ALL.into_iter().collect(),
        "sensitive",
    )
    .await?;
    let mut c = ts.client().await?;
    for fact in [
        "We decided to migrate the database to Postgres 18 in March.",
        "The database migration needs a freeze on schema changes.",
        "Database backups run nightly before the migration window.",
        "The migration plan for the database was approved by Ana.",
        LONG_NOTE,
    ] {
        engram_tests::remember(&mut c, fact).await?;
    }
    let before = ask(&mut c).await?;
    let was = position(&before, LONG_NOTE).ok_or_else(|| anyhow::anyhow!("note not returned"))?;
    assert!(was > 0, "fusion does not put the note first: {before:?}");

    // Twenty answers, each judged: the note helpful, the rest not used.
    let answers = 20;
    for _ in 0..answers {
        let r = ask(&mut c).await?;
        let items = r
            .records
            .iter()
            .filter_map(|s| s.memory.as_ref())
            .map(|m| FeedbackItem {
                memory_id: m.id.clone(),
                signal: FeedbackSignal::Helpful as i32,
                value: m.content == LONG_NOTE,
            })
            .collect();
        let req = FeedbackRequest {
            query_id: r.query_id.clone(),
            items,
        };
        c.retrieval.feedback(req).await?;
    }
    let pool = engram_common::db::test_database().await?;
    let want = i64::from(answers) * before.records.len() as i64;
    for _ in 0..100 {
        if examples_stored(&pool, &ts.tenant).await? >= want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(examples_stored(&pool, &ts.tenant).await?, want);

    let opts = engram_lab::ranker::TrainOptions {
        tenant_opt: Some(ts.tenant.clone()),
        tenants: Vec::new(),
        since_opt: None,
        out: model_path.clone(),
        all_features: true,
        identity_share: 2.0,
    };
    let report = engram_lab::ranker::train_from_feedback(&pool, &opts).await?;
    assert_eq!(report.answers, 20);
    assert_eq!(report.identities, 1);
    // Checked on its held-out answers against the shipped model, which
    // keeps the fusion's #1 and so never puts the note first.
    assert_eq!(
        report.check.winner,
        engram_lab::ranker::Winner::New,
        "{:?}",
        report.check
    );

    // The gateway polls the file every 100 ms; the ranking must change.
    let mut now = was;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        now = position(&ask(&mut c).await?, LONG_NOTE).unwrap_or(usize::MAX);
        if now == 0 {
            break;
        }
    }
    assert_eq!(
        now,
        0,
        "the learned model puts the note first (was #{})",
        was + 1
    );
    ts.shutdown().await;
    Ok(())
}
