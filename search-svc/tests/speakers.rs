//! A dense query says the caller's readable speakers in the first person
//! (search-svc speakers.rs). Which names count is an access decision: only
//! speakers of turns the caller may read, in its own tenant and under its
//! filters. A rewritten query's vector is not handed back to the gateway's
//! semantic cache ("…Caroline…" and "…Melanie…" both become "…I…").

mod common;

use common::*;
use engram_common::{AccessLevel, Identity};
use engram_proto as pb;
use search_svc::speakers::dense_text;
use search_svc::validate::SearchFilters;
use uuid::Uuid;

fn turn(speaker: &str, index: u32, text: &str, level: AccessLevel) -> pb::Memory {
    pb::Memory {
        id: Uuid::new_v4().to_string(),
        content: text.into(),
        access_level: level.to_proto(),
        turn: Some(pb::Turn {
            session_id: "s1".into(),
            turn_index: index,
            speaker: speaker.into(),
            caption: String::new(),
        }),
        ..Default::default()
    }
}

async fn rewrite(h: &Harness, id: &Identity, f: &SearchFilters, text: &str) -> Option<String> {
    let readers = search_svc::bounds::Readers::new(&h.pool, 5_000);
    dense_text(&readers, id, f, text, 0.1, 5_000)
        .await
        .expect("speaker probe")
}

#[tokio::test]
async fn only_readable_speakers_of_the_callers_tenant_are_rewritten() {
    let mut h = start().await;
    let t = tenant();
    let writer = ident(&t, "w", AccessLevel::Sensitive);
    let public = ident(&t, "p", AccessLevel::Public);
    upsert(
        &mut h.client,
        &writer,
        vec![
            turn("Melanie", 0, "I painted a sunrise.", AccessLevel::Public),
            turn(
                "Caroline",
                1,
                "I went to a support group.",
                AccessLevel::Sensitive,
            ),
            // A document that names someone: not a speaker.
            mem(&Uuid::new_v4().to_string(), "Rome", "Romulus founded Rome."),
        ],
    )
    .await;
    let other = ident(&tenant(), "o", AccessLevel::Sensitive);
    upsert(
        &mut h.client,
        &other,
        vec![turn("Jon", 0, "I lost my job.", AccessLevel::Public)],
    )
    .await;
    let all = SearchFilters::default();

    let paint = rewrite(&h, &public, &all, "What did Melanie paint?").await;
    assert_eq!(paint.as_deref(), Some("What did I paint?"));
    let cat = rewrite(&h, &public, &all, "What did Melanie's cat do?").await;
    assert_eq!(cat.as_deref(), Some("What did my cat do?"));
    // Caroline's only turn is above the public caller's trust.
    let group = "When did Caroline go to the group?";
    assert_eq!(rewrite(&h, &public, &all, group).await, None);
    assert!(rewrite(&h, &writer, &all, group).await.is_some());
    // Jon speaks in another tenant; Romulus is named in a document only.
    assert_eq!(
        rewrite(&h, &writer, &all, "Did Jon lose his job?").await,
        None
    );
    assert_eq!(rewrite(&h, &writer, &all, "Who was Romulus?").await, None);
    // A query that is only a name keeps it.
    assert_eq!(rewrite(&h, &public, &all, "Melanie").await, None);
    // The caller's filters apply: no Melanie turn in another namespace.
    let elsewhere = SearchFilters {
        namespace_opt: Some("elsewhere".into()),
        ..Default::default()
    };
    let filtered = rewrite(&h, &public, &elsewhere, "What did Melanie paint?").await;
    assert_eq!(filtered, None);
}

async fn vector_search(c: &mut Client, id: &Identity, text: &str) -> pb::SearchResponse {
    c.vector_search(req(
        pb::VectorSearchRequest {
            text: text.into(),
            embedding: Vec::new(),
            filters: None,
            k: 5,
            fact_k: 0,
        },
        id,
    ))
    .await
    .expect("vector search")
    .into_inner()
}

#[tokio::test]
async fn a_rewritten_query_finds_the_turn_and_is_not_handed_to_the_cache() {
    let mut h = start().await;
    let me = ident(&tenant(), "a", AccessLevel::Internal);
    let painted = turn(
        "Melanie",
        0,
        "I painted a sunrise over the lake.",
        AccessLevel::Public,
    );
    let cat = turn(
        "Melanie",
        1,
        "My cat is called Oliver.",
        AccessLevel::Public,
    );
    upsert(&mut h.client, &me, vec![painted.clone(), cat]).await;

    let r = vector_search(&mut h.client, &me, "What did Melanie paint?").await;
    let top_opt = r.hits.first().and_then(|h| h.memory.as_ref());
    assert_eq!(top_opt.map(|m| m.id.as_str()), Some(painted.id.as_str()));
    assert!(r.query_embedding.is_empty(), "rewritten: nothing to cache");
    let plain = vector_search(&mut h.client, &me, "Who founded Rome?").await;
    assert_eq!(plain.query_embedding.len(), 384, "as asked: cacheable");
}

#[tokio::test]
async fn switched_off_the_query_is_embedded_as_given() {
    let mut h = start_configured(embeddings(), |s| {
        s.search.dense_speakers_first_person = false
    })
    .await;
    let me = ident(&tenant(), "a", AccessLevel::Internal);
    let painted = turn("Melanie", 0, "I painted a sunrise.", AccessLevel::Public);
    upsert(&mut h.client, &me, vec![painted]).await;
    let r = vector_search(&mut h.client, &me, "What did Melanie paint?").await;
    assert_eq!(r.query_embedding.len(), 384);
}
