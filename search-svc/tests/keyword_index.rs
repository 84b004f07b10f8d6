//! The in-memory keyword index (search-svc keyword_index.rs) against the
//! real Postgres: it answers as SQL's BM25 does, a write is found at once
//! (SQL answers while the index is behind), a write made by another
//! search-svc process reaches it through the change feed, and request
//! filters are SQL's even when the index's first hits are all filtered out.

mod common;

use std::time::Duration;

use common::*;
use engram_common::AccessLevel;
use engram_proto as pb;

async fn start_indexed() -> Harness {
    start_configured(embeddings(), |s| {
        s.search.keyword_scoring = "bm25".into();
        s.search.keyword_index = true;
        s.search.keyword_index_rebuild_ms = 0;
    })
    .await
}

/// Whether the tenant's keyword index answered `text` (false: SQL).
async fn answered_by_index(h: &mut Harness, who: &engram_common::Identity, text: &str) -> bool {
    let request = pb::KeywordSearchRequest {
        text: text.into(),
        filters: None,
        k: 10,
    };
    (h.client.keyword_search(req(request, who)).await)
        .expect("keyword search")
        .into_inner()
        .from_keyword_index
}

fn texts(hits: &[pb::SearchHit]) -> Vec<String> {
    hits.iter()
        .filter_map(|h| h.memory.as_ref().map(|m| m.title.clone()))
        .collect()
}

const CORPUS: &[(&str, &str)] = &[
    ("Falcon", "Project Falcon is owned by Ada Lovelace."),
    ("Ada Lovelace", "Ada Lovelace reports to Charles Babbage."),
    ("Kestrel", "Kestrel is a small falcon that hovers."),
    ("Weather", "Rain is expected on Tuesday."),
];

async fn write_corpus(h: &mut Harness, who: &engram_common::Identity) {
    let memories = CORPUS.iter().map(|(t, c)| mem("", t, c)).collect();
    upsert(&mut h.client, who, memories).await;
}

/// An indexed search-svc holding the corpus, its index up to date, and a
/// caller who reads every level.
async fn indexed_corpus() -> (Harness, engram_common::Identity) {
    let mut h = start_indexed().await;
    let who = ident(&tenant(), "a", AccessLevel::Sensitive);
    write_corpus(&mut h, &who).await;
    wait_keyword_index(&h, &who).await;
    (h, who)
}

#[tokio::test]
async fn the_index_ranks_as_sql_and_never_misses_a_write() {
    let mut h = start_indexed().await;
    let who = ident(&tenant(), "a", AccessLevel::Sensitive);
    write_corpus(&mut h, &who).await;
    let question = "Who owns project Falcon?";
    assert!(!h.svc.keyword_index().is_current(&who.tenant));
    assert!(!answered_by_index(&mut h, &who, question).await);
    let mut sql_only = start_configured(embeddings(), |s| s.search.keyword_index = false).await;
    let from_sql = texts(&keyword(&mut sql_only.client, &who, question, None, 10).await);
    assert!(!answered_by_index(&mut sql_only, &who, question).await);
    wait_keyword_index(&h, &who).await;
    assert!(answered_by_index(&mut h, &who, question).await);
    let from_index = texts(&keyword(&mut h.client, &who, question, None, 10).await);
    assert_eq!(from_index, from_sql);
    assert_eq!(from_index[0], "Falcon");
    assert!(!from_index.contains(&"Weather".to_string()));

    // A new memory is found by the very next search, before any rebuild.
    upsert(
        &mut h.client,
        &who,
        vec![mem("", "Osprey", "An osprey eats fish.")],
    )
    .await;
    assert!(!answered_by_index(&mut h, &who, "osprey").await);
    let hits = keyword(&mut h.client, &who, "osprey", None, 10).await;
    assert_eq!(texts(&hits), vec!["Osprey".to_string()]);
    wait_keyword_index(&h, &who).await;
    let hits = keyword(&mut h.client, &who, "osprey", None, 10).await;
    assert_eq!(texts(&hits), vec!["Osprey".to_string()]);

    // And a deleted one is gone at once.
    let id = hits[0]
        .memory
        .as_ref()
        .map(|m| m.id.clone())
        .unwrap_or_default();
    h.client
        .delete(req(pb::DeleteRequest { ids: vec![id] }, &who))
        .await
        .expect("delete");
    assert!(
        keyword(&mut h.client, &who, "osprey", None, 10)
            .await
            .is_empty()
    );
}

#[tokio::test]
async fn a_write_through_another_process_reaches_the_index_by_the_feed() {
    let mut a = start_indexed().await;
    let mut b = start_indexed().await;
    let who = ident(&tenant(), "a", AccessLevel::Sensitive);
    write_corpus(&mut a, &who).await;
    wait_keyword_index(&a, &who).await;
    upsert(
        &mut b.client,
        &who,
        vec![mem("", "Merlin", "A merlin is a falcon.")],
    )
    .await;
    // `a` learns of the write from the feed; until then its index may not
    // know it, so poll (the feed delivers within milliseconds).
    for _ in 0..250 {
        let hits = keyword(&mut a.client, &who, "merlin", None, 10).await;
        if texts(&hits) == vec!["Merlin".to_string()] {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("a write through another search-svc never reached this one's keyword search");
}

#[tokio::test]
async fn filters_apply_even_when_the_indexs_best_hits_are_all_filtered_out() {
    let mut h = start_indexed().await;
    let who = ident(&tenant(), "a", AccessLevel::Sensitive);
    // 60 memories in namespace "a" say "owl" twice (they outrank), 3 in
    // "b" say it once.
    let mut memories: Vec<pb::Memory> = (0..60)
        .map(|i| pb::Memory {
            namespace: "a".into(),
            ..mem("", &format!("a{i}"), "owl owl")
        })
        .collect();
    memories.extend((0..3).map(|i| pb::Memory {
        namespace: "b".into(),
        ..mem("", &format!("b{i}"), "an owl in the barn")
    }));
    upsert(&mut h.client, &who, memories).await;
    wait_keyword_index(&h, &who).await;
    let only_b = pb::Filters {
        namespace: "b".into(),
        ..Default::default()
    };
    let hits = keyword(&mut h.client, &who, "owl", Some(only_b), 3).await;
    let mut found = texts(&hits);
    found.sort();
    assert_eq!(found, vec!["b0", "b1", "b2"]);
    // Without the filter the doubled word ranks first.
    let hits = keyword(&mut h.client, &who, "owl", None, 3).await;
    assert!(texts(&hits).iter().all(|t| t.starts_with('a')));
}

#[tokio::test]
async fn a_caller_below_a_records_level_never_gets_it_from_the_index() {
    let mut h = start_indexed().await;
    let t = tenant();
    let top = ident(&t, "w", AccessLevel::Sensitive);
    let low = ident(&t, "r", AccessLevel::Public);
    let secret = pb::Memory {
        access_level: AccessLevel::Sensitive.to_proto(),
        ..mem("", "Secret", "the falcon falcon falcon code")
    };
    upsert(
        &mut h.client,
        &top,
        vec![secret, mem("", "Open", "a falcon")],
    )
    .await;
    wait_keyword_index(&h, &low).await;
    assert_eq!(
        texts(&keyword(&mut h.client, &low, "falcon", None, 10).await),
        vec!["Open"]
    );
    let all = texts(&keyword(&mut h.client, &top, "falcon", None, 10).await);
    assert_eq!(all, vec!["Secret", "Open"]);
}

#[tokio::test]
async fn the_index_searches_what_the_tsv_holds_for_turns_speaker_and_caption() {
    let mut h = start_indexed().await;
    let who = ident(&tenant(), "a", AccessLevel::Sensitive);
    let turn = |i: u32, speaker: &str, text: &str, caption: &str| pb::Memory {
        turn: Some(pb::Turn {
            session_id: "s1".into(),
            turn_index: i,
            speaker: speaker.into(),
            caption: caption.into(),
        }),
        ..mem("", "", text)
    };
    let turns = vec![
        turn(0, "Caroline", "I went to a support group yesterday.", ""),
        turn(
            1,
            "Melanie",
            "That sounds lovely.",
            "a photo of a sunflower field",
        ),
    ];
    upsert(&mut h.client, &who, turns).await;
    wait_keyword_index(&h, &who).await;
    assert!(answered_by_index(&mut h, &who, "Caroline").await);
    let by_speaker = keyword(&mut h.client, &who, "Caroline", None, 10).await;
    let first = by_speaker[0].memory.as_ref().map(|m| m.content.clone());
    assert_eq!(
        first.as_deref(),
        Some("I went to a support group yesterday.")
    );
    let by_caption = keyword(&mut h.client, &who, "sunflower", None, 10).await;
    let first = by_caption[0].memory.as_ref().map(|m| m.content.clone());
    assert_eq!(first.as_deref(), Some("That sounds lovely."));
}

#[tokio::test]
async fn writes_are_applied_in_place_without_a_full_build() {
    let (mut h, who) = indexed_corpus().await;
    // Updates only from here on (a full build would start again from 0);
    // a write is applied once or twice (its own call, then the echo of its
    // notification), so the counts only grow.
    let full = h
        .svc
        .keyword_index()
        .updates(&who.tenant)
        .unwrap_or(u32::MAX);
    let grew = |before: u32, after: Option<u32>| after.is_some_and(|a| a > before && a != u32::MAX);

    // A new memory, then an edit of it, then its deletion: each is applied
    // to the index in place and found (or not) through the index.
    let written = upsert(
        &mut h.client,
        &who,
        vec![mem("", "Heron", "A heron wades.")],
    )
    .await;
    let id = written.results[0].id.clone();
    wait_keyword_index(&h, &who).await;
    let first = h.svc.keyword_index().updates(&who.tenant);
    assert!(grew(full, first), "{full} -> {first:?}");
    assert!(answered_by_index(&mut h, &who, "heron").await);
    assert_eq!(
        texts(&keyword(&mut h.client, &who, "wades", None, 10).await),
        vec!["Heron"]
    );

    upsert(
        &mut h.client,
        &who,
        vec![mem(&id, "Heron", "A heron fishes.")],
    )
    .await;
    wait_keyword_index(&h, &who).await;
    let second = h.svc.keyword_index().updates(&who.tenant);
    assert!(grew(first.unwrap_or(0), second), "{first:?} -> {second:?}");
    assert!(
        keyword(&mut h.client, &who, "wades", None, 10)
            .await
            .is_empty()
    );
    assert_eq!(
        texts(&keyword(&mut h.client, &who, "fishes", None, 10).await),
        vec!["Heron"]
    );

    h.client
        .delete(req(pb::DeleteRequest { ids: vec![id] }, &who))
        .await
        .expect("delete");
    wait_keyword_index(&h, &who).await;
    let third = h.svc.keyword_index().updates(&who.tenant);
    assert!(grew(second.unwrap_or(0), third), "{second:?} -> {third:?}");
    assert!(answered_by_index(&mut h, &who, "heron").await);
    assert!(
        keyword(&mut h.client, &who, "heron", None, 10)
            .await
            .is_empty()
    );
    // The rest of the tenant is as it was.
    let rest = texts(&keyword(&mut h.client, &who, "Who owns project Falcon?", None, 10).await);
    assert_eq!(rest[0], "Falcon");
}

#[tokio::test]
async fn hostile_queries_get_an_answer_or_a_clear_refusal_from_the_index() {
    let (mut h, who) = indexed_corpus().await;
    // The longest query allowed, of ~800 distinct words (64 of them score),
    // punctuation only, and unicode: answered by the index.
    let many: String = (0..800).map(|i| format!("w{i} ")).collect();
    let long: String = many.chars().take(4096).collect();
    for text in [long.as_str(), "?!?!... ---", "Fålcon ÖWNED 😀 falcon"] {
        assert!(answered_by_index(&mut h, &who, text).await, "{text:.40}");
    }
    let hits = keyword(&mut h.client, &who, "Fålcon ÖWNED 😀 falcon", None, 10).await;
    assert_eq!(texts(&hits).first().map(String::as_str), Some("Falcon"));
    // Past the limits: InvalidArgument naming the field, never the index.
    let too_long = "a".repeat(4097);
    for (text, k, field) in [
        (too_long.as_str(), 10, "text"),
        ("a\0b", 10, "text"),
        ("falcon", 0, "k"),
        ("falcon", 201, "k"),
    ] {
        let request = pb::KeywordSearchRequest {
            text: text.into(),
            filters: None,
            k,
        };
        let status = h
            .client
            .keyword_search(req(request, &who))
            .await
            .expect_err("refused");
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{text:.20} k={k}"
        );
        assert!(status.message().contains(field), "{}", status.message());
    }
}
