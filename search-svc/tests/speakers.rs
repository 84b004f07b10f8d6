//! A dense query says the caller's readable speakers in the first person
//! (search-svc speakers.rs). Which names count is an access decision: only
//! speakers of turns the caller may read, in its own tenant. The vector
//! search tells by handing back no query embedding when it rewrote the
//! query (the gateway must not cache "…Caroline…" under "…I…").

mod common;

use common::*;
use engram_common::{AccessLevel, Identity};
use engram_proto as pb;
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

/// (rewritten, the top hit's content) for one vector search.
async fn search(c: &mut Client, id: &Identity, text: &str) -> (bool, String) {
    let r = c
        .vector_search(req(
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
        .into_inner();
    let top = r
        .hits
        .first()
        .and_then(|h| h.memory.as_ref())
        .map(|m| m.content.clone())
        .unwrap_or_default();
    (r.query_embedding.is_empty(), top)
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
            turn(
                "Melanie",
                0,
                "I painted a sunrise over the lake last week.",
                AccessLevel::Public,
            ),
            turn(
                "Melanie",
                1,
                "My cat is called Oliver and he sleeps all day.",
                AccessLevel::Public,
            ),
            turn(
                "Caroline",
                2,
                "I went to a support group yesterday.",
                AccessLevel::Sensitive,
            ),
            // A document that names someone: not a speaker.
            mem(&Uuid::new_v4().to_string(), "Rome", "Romulus founded Rome."),
        ],
    )
    .await;
    let other = tenant();
    let stranger = ident(&other, "o", AccessLevel::Sensitive);
    upsert(
        &mut h.client,
        &stranger,
        vec![turn(
            "Jon",
            0,
            "I lost my job at the bank.",
            AccessLevel::Public,
        )],
    )
    .await;

    let (rewritten, top) = search(&mut h.client, &public, "What did Melanie paint?").await;
    assert!(rewritten, "Melanie is a readable speaker");
    assert_eq!(top, "I painted a sunrise over the lake last week.");
    assert!(
        search(&mut h.client, &public, "What did Melanie's cat do?")
            .await
            .0
    );

    // Caroline's only turn is above the public caller's trust.
    assert!(
        !search(&mut h.client, &public, "When did Caroline go to the group?")
            .await
            .0
    );
    assert!(
        search(&mut h.client, &writer, "When did Caroline go to the group?")
            .await
            .0
    );
    // Jon speaks in another tenant; Romulus is named in a document only.
    assert!(
        !search(&mut h.client, &writer, "Did Jon lose his job?")
            .await
            .0
    );
    assert!(!search(&mut h.client, &writer, "Who was Romulus?").await.0);
    // A query that is only a name keeps it.
    assert!(!search(&mut h.client, &public, "Melanie").await.0);
    // Another namespace's turns are not the caller's either.
    let filtered = rewritten_in_namespace(&mut h.client, &public, "What did Melanie paint?").await;
    assert!(!filtered, "no Melanie turn in namespace elsewhere");
}

async fn rewritten_in_namespace(c: &mut Client, id: &Identity, text: &str) -> bool {
    let r = c
        .vector_search(req(
            pb::VectorSearchRequest {
                text: text.into(),
                embedding: Vec::new(),
                filters: Some(pb::Filters {
                    namespace: "elsewhere".into(),
                    ..Default::default()
                }),
                k: 5,
                fact_k: 0,
            },
            id,
        ))
        .await
        .expect("vector search")
        .into_inner();
    r.query_embedding.is_empty()
}

#[tokio::test]
async fn switched_off_the_query_is_embedded_as_given() {
    let mut h = start_configured(embeddings(), |s| {
        s.search.dense_speakers_first_person = false
    })
    .await;
    let t = tenant();
    let me = ident(&t, "a", AccessLevel::Internal);
    upsert(
        &mut h.client,
        &me,
        vec![turn(
            "Melanie",
            0,
            "I painted a sunrise.",
            AccessLevel::Public,
        )],
    )
    .await;
    assert!(
        !search(&mut h.client, &me, "What did Melanie paint?")
            .await
            .0
    );
}
