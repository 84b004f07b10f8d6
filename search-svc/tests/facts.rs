//! The fact index (search-svc facts.rs): each sentence of a memory with its
//! own embedding, written with the memory, gone with it, and readable only
//! by who may read the memory.

mod common;

use common::*;
use engram_common::AccessLevel;
use engram_proto as pb;
use uuid::Uuid;

/// The service with the fact index on (it is off by default).
async fn start_indexed() -> Harness {
    start_configured(embeddings(), |s| s.search.fact_index = true).await
}

async fn facts(c: &mut Client, id: &engram_common::Identity, text: &str) -> Vec<pb::FactHit> {
    c.vector_search(req(
        pb::VectorSearchRequest {
            text: text.into(),
            embedding: Vec::new(),
            filters: None,
            k: 5,
            fact_k: 10,
        },
        id,
    ))
    .await
    .expect("vector search")
    .into_inner()
    .facts
}

#[tokio::test]
async fn sentences_are_indexed_follow_edits_and_go_with_their_memory() {
    let mut h = start_indexed().await;
    let t = tenant();
    let me = ident(&t, "a", AccessLevel::Internal);
    let id = Uuid::new_v4();
    let film = "Inception is a 2010 science fiction film. It was directed by Christopher Nolan. \
                The film grossed over 800 million dollars worldwide.";
    upsert(
        &mut h.client,
        &me,
        vec![mem(&id.to_string(), "Inception", film)],
    )
    .await;

    let found = facts(
        &mut h.client,
        &me,
        "Which director made it? Christopher Nolan",
    )
    .await;
    assert_eq!(found.len(), 3, "one fact per sentence: {found:?}");
    assert_eq!(
        found[0].text, "Inception\nIt was directed by Christopher Nolan.",
        "the best match is the director's sentence, titled: {found:?}"
    );
    assert!(found.iter().all(|f| f.memory_id == id.to_string()));
    assert!(found.windows(2).all(|w| w[0].score >= w[1].score));

    // An edit replaces the sentences; an unchanged re-upsert keeps them.
    let edited = "Inception was directed by Christopher Nolan. Hans Zimmer wrote its score.";
    upsert(
        &mut h.client,
        &me,
        vec![mem(&id.to_string(), "Inception", edited)],
    )
    .await;
    upsert(
        &mut h.client,
        &me,
        vec![mem(&id.to_string(), "Inception", edited)],
    )
    .await;
    let texts: Vec<String> = facts(&mut h.client, &me, "film music")
        .await
        .into_iter()
        .map(|f| f.text)
        .collect();
    assert_eq!(texts.len(), 2, "{texts:?}");
    assert!(texts.contains(&"Inception\nHans Zimmer wrote its score.".to_string()));

    h.client
        .delete(req(
            pb::DeleteRequest {
                ids: vec![id.to_string()],
            },
            &me,
        ))
        .await
        .expect("delete");
    assert!(
        facts(&mut h.client, &me, "Who directed Inception?")
            .await
            .is_empty()
    );
    let left: i64 =
        sqlx::query_scalar("SELECT count(*) FROM memory_sentences WHERE memory_id = $1")
            .bind(id)
            .fetch_one(&h.pool)
            .await
            .expect("count");
    assert_eq!(left, 0);
}

#[tokio::test]
async fn facts_are_readable_only_by_who_may_read_the_memory() {
    let mut h = start_indexed().await;
    let t = tenant();
    let high = ident(&t, "a", AccessLevel::Sensitive);
    let low = ident(&t, "b", AccessLevel::Public);
    let stranger = ident(&tenant(), "c", AccessLevel::Sensitive);
    let secret = Uuid::new_v4();
    upsert(
        &mut h.client,
        &high,
        vec![pb::Memory {
            access_level: pb::AccessLevel::Sensitive as i32,
            ..mem(
                &secret.to_string(),
                "Project Falcon",
                "Project Falcon is owned by Dana Reyes. Its budget is twelve million.",
            )
        }],
    )
    .await;
    let q = "Who owns Project Falcon?";
    assert_eq!(facts(&mut h.client, &high, q).await.len(), 2);
    assert!(
        facts(&mut h.client, &low, q).await.is_empty(),
        "above the caller's trust"
    );
    assert!(
        facts(&mut h.client, &stranger, q).await.is_empty(),
        "another tenant's"
    );
}

#[tokio::test]
async fn fact_k_over_the_limit_is_invalid_argument() {
    let mut h = start_indexed().await;
    let me = ident(&tenant(), "a", AccessLevel::Internal);
    let err = h
        .client
        .vector_search(req(
            pb::VectorSearchRequest {
                text: "anything".into(),
                embedding: Vec::new(),
                filters: None,
                k: 5,
                fact_k: 51,
            },
            &me,
        ))
        .await
        .expect_err("fact_k 51");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("fact_k"), "{}", err.message());
}

#[tokio::test]
async fn a_backfill_indexes_what_was_written_without_the_index() {
    let mut h = start_configured(embeddings(), |s| s.search.fact_index = false).await;
    let t = tenant();
    let me = ident(&t, "a", AccessLevel::Internal);
    let id = Uuid::new_v4();
    let text = "Dana Reyes owns Project Falcon. The project ships in March.";
    upsert(
        &mut h.client,
        &me,
        vec![mem(&id.to_string(), "Falcon", text)],
    )
    .await;
    assert!(
        facts(&mut h.client, &me, "Who owns Project Falcon?")
            .await
            .is_empty()
    );

    let report = search_svc::facts::backfill(&h.pool, &embeddings(), Some(&t), 1, 10_000)
        .await
        .expect("backfill");
    assert_eq!((report.scanned, report.indexed), (1, 1));
    let found = facts(&mut h.client, &me, "Who owns Project Falcon?").await;
    assert_eq!(found.len(), 2, "{found:?}");
    let again = search_svc::facts::backfill(&h.pool, &embeddings(), Some(&t), 1, 10_000)
        .await
        .expect("second backfill");
    assert_eq!(again.scanned, 0, "nothing left to index");
}
