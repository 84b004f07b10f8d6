//! Fact seeds end to end (issue 19): with the fact index and
//! `pipeline.graph_fact_seeds` on, a Retrieve asks search-svc for the
//! sentences nearest the question beside its dense list and passes them to
//! graph-svc, whose walk starts from the entities they name. Off by default
//! (docs/benchmarks.md, "Fact seeds"); this keeps the wiring working.

use engram_proto::{Memory, RetrievalMode, RetrieveRequest, UpsertRequest};
use engram_tests::TestStack;

const MEMORIES: [(&str, &str); 4] = [
    (
        "Inception",
        "Inception is a 2010 science fiction film. It was directed by Christopher Nolan. \
         Leonardo DiCaprio plays the lead role.",
    ),
    (
        "Christopher Nolan",
        "Christopher Nolan is a British film director. He is married to Emma Thomas, \
         who produces his films.",
    ),
    (
        "Leonardo DiCaprio",
        "Leonardo DiCaprio is an American actor. He grew up in Los Angeles.",
    ),
    (
        "Emma Thomas",
        "Emma Thomas is a British film producer. She co-founded Syncopy Inc.",
    ),
];

#[tokio::test]
async fn a_bridge_question_walks_from_the_facts_it_resembles() -> anyhow::Result<()> {
    let mut settings = engram_tests::settings().await?;
    settings.search.fact_index = true;
    settings.pipeline.graph_fact_seeds = 5;
    let ts = TestStack::start_with(
        settings,
        engram::stack::Service::ALL.into_iter().collect(),
        "internal",
    )
    .await?;
    let mut c = ts.client().await?;
    let memories = MEMORIES
        .iter()
        .map(|(title, content)| Memory {
            title: (*title).into(),
            content: (*content).into(),
            memory_type: "semantic".into(),
            ..Default::default()
        })
        .collect();
    c.memories
        .upsert(UpsertRequest { memories })
        .await?
        .into_inner();
    let pool = engram_common::db::test_database().await?;
    let sentences: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM memory_sentences s JOIN memories m ON m.id = s.memory_id \
         WHERE m.tenant_id = $1",
    )
    .bind(&ts.tenant)
    .fetch_one(&pool)
    .await?;
    assert_eq!(sentences, 9, "every sentence of every memory is indexed");

    for mode in [RetrievalMode::Auto, RetrievalMode::MultiHop] {
        let r = c
            .retrieval
            .retrieve(RetrieveRequest {
                text: "Who is the wife of the director of Inception?".into(),
                mode: mode as i32,
                limit: Some(4),
                no_cache: true,
                ..Default::default()
            })
            .await?
            .into_inner();
        assert!(
            r.degraded_stages.is_empty(),
            "{mode:?}: {:?}",
            r.degraded_stages
        );
        let titles: Vec<String> = r
            .records
            .iter()
            .filter_map(|s| s.memory.as_ref().map(|m| m.title.clone()))
            .collect();
        assert!(
            titles.iter().any(|t| t == "Christopher Nolan"),
            "{mode:?}: the bridge memory is found: {titles:?}"
        );
    }
    ts.shutdown().await;
    Ok(())
}
