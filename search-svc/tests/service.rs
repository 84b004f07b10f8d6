//! search-svc through its gRPC API, against real Postgres and the real model.

mod common;

use common::*;
use engram_common::convert::{chrono_to_ts, json_to_struct};
use engram_common::{AccessLevel, Identity};
use engram_proto as pb;
use uuid::Uuid;

#[tokio::test]
async fn upsert_then_dense_and_keyword_search_find_it() {
    let mut h = start().await;
    let t = tenant();
    let me = ident(&t, "agent-a", AccessLevel::Internal);
    let id = Uuid::new_v4().to_string();
    let r = upsert(
        &mut h.client,
        &me,
        vec![
            mem(
                &id,
                "Ermengarde of Tours",
                "Ermengarde of Tours was the wife of Lothair I and mother of Lothair II.",
            ),
            mem(
                "",
                "Kiwi",
                "The kiwi is a flightless bird native to New Zealand.",
            ),
        ],
    )
    .await;
    assert_eq!(r.results.len(), 2);
    assert!(r.results[0].created && r.results[0].embedded);
    assert_eq!(r.results[0].id, id);

    let resp = h
        .client
        .vector_search(req(
            pb::VectorSearchRequest {
                text: "Who was the mother of Lothair II?".into(),
                embedding: vec![],
                filters: None,
                k: 1,
                fact_k: 0,
            },
            &me,
        ))
        .await
        .expect("vector")
        .into_inner();
    assert_eq!(resp.query_embedding.len(), 384);
    let top = resp.hits[0].memory.as_ref().expect("memory");
    assert_eq!(top.id, id);
    assert_eq!(top.agent_id, "agent-a");
    assert!(resp.hits[0].score > 0.3, "{}", resp.hits[0].score);

    let hits = keyword(
        &mut h.client,
        &me,
        "When did Lothair II's mother die?",
        None,
        5,
    )
    .await;
    assert_eq!(ids(&hits), vec![id.clone()]);

    // Entities: the title is the home entity.
    let home: Vec<(String, bool)> = sqlx::query_as(
        "SELECT e.name, me.is_home FROM memory_entities me JOIN entities e ON e.id = me.entity_id WHERE me.memory_id = $1 AND me.is_home",
    )
    .bind(Uuid::parse_str(&id).expect("uuid"))
    .fetch_all(&h.pool)
    .await
    .expect("entities");
    assert_eq!(home, vec![("ermengarde of tours".to_string(), true)]);

    // Get names them (home entity first) unless the caller omits them; the
    // row is the same either way.
    for omit_entities in [false, true] {
        let got = h
            .client
            .get(req(
                pb::GetRequest {
                    ids: vec![id.clone()],
                    include_embedding: false,
                    omit_entities,
                    vectors_only: false,
                    ..Default::default()
                },
                &me,
            ))
            .await
            .expect("get")
            .into_inner();
        let m = &got.memories[0];
        assert_eq!(m.title, "Ermengarde of Tours");
        assert!(m.embedding.is_empty());
        if omit_entities {
            assert!(m.entities.is_empty(), "{:?}", m.entities);
        } else {
            assert_eq!(
                m.entities.first().map(String::as_str),
                Some("Ermengarde of Tours")
            );
        }
    }
}

#[tokio::test]
async fn upsert_is_idempotent_and_versions_content_changes() {
    let mut h = start().await;
    let t = tenant();
    let me = ident(&t, "a", AccessLevel::Public);
    let id = Uuid::new_v4().to_string();
    let first = upsert(
        &mut h.client,
        &me,
        vec![mem(&id, "", "the cat sat on the mat")],
    )
    .await;
    let again = upsert(
        &mut h.client,
        &me,
        vec![mem(&id, "", "the cat sat on the mat")],
    )
    .await;
    assert!(first.results[0].created);
    assert!(!again.results[0].created);
    assert!(
        !again.results[0].embedded,
        "unchanged content is not re-embedded"
    );
    assert_eq!(again.results[0].version, 1);
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM memories WHERE tenant_id = $1")
        .bind(&t)
        .fetch_one(&h.pool)
        .await
        .expect("count");
    assert_eq!(n, 1);
    let changed = upsert(
        &mut h.client,
        &me,
        vec![mem(&id, "", "the dog sat on the mat")],
    )
    .await;
    assert_eq!(changed.results[0].version, 2);
    assert!(changed.results[0].embedded);

    // Another tenant can neither overwrite nor see it.
    let other = ident(&tenant(), "x", AccessLevel::Sensitive);
    let err = h
        .client
        .upsert(req(
            pb::UpsertRequest {
                memories: vec![mem(&id, "", "hijack")],
            },
            &other,
        ))
        .await
        .expect_err("other tenant");
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    let got = h
        .client
        .get(req(
            pb::GetRequest {
                ids: vec![id.clone()],
                include_embedding: true,
                omit_entities: false,
                vectors_only: false,
                ..Default::default()
            },
            &me,
        ))
        .await
        .expect("get")
        .into_inner();
    assert_eq!(got.memories[0].content, "the dog sat on the mat");
    assert_eq!(got.memories[0].embedding.len(), 384);

    // The pipeline's vectors-only read: the same vector, no row, and the
    // same scope (another tenant sees nothing).
    let vectors_only = |who: &Identity| {
        req(
            pb::GetRequest {
                ids: vec![id.clone()],
                include_embedding: true,
                omit_entities: true,
                vectors_only: true,
                ..Default::default()
            },
            who,
        )
    };
    let lean = h
        .client
        .get(vectors_only(&me))
        .await
        .expect("vectors")
        .into_inner();
    assert_eq!(lean.memories.len(), 1);
    assert_eq!(lean.memories[0].id, id);
    assert_eq!(lean.memories[0].embedding, got.memories[0].embedding);
    assert!(lean.memories[0].content.is_empty());
    let foreign = h
        .client
        .get(vectors_only(&other))
        .await
        .expect("vectors")
        .into_inner();
    assert!(foreign.memories.is_empty());

    // Writing above one's trust level is refused.
    let err = h
        .client
        .upsert(req(
            pb::UpsertRequest {
                memories: vec![pb::Memory {
                    access_level: pb::AccessLevel::Confidential as i32,
                    ..mem("", "", "secret")
                }],
            },
            &me,
        ))
        .await
        .expect_err("above trust");
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
}

#[tokio::test]
async fn supersede_keeps_history_for_as_of_queries() {
    let mut h = start().await;
    let t = tenant();
    let me = ident(&t, "a", AccessLevel::Public);
    let old = Uuid::new_v4().to_string();
    let new = Uuid::new_v4().to_string();
    upsert(
        &mut h.client,
        &me,
        vec![pb::Memory {
            embedding: axis(1),
            ..mem(&old, "", "alice lives in paris")
        }],
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let before = chrono::Utc::now();
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let r = upsert(
        &mut h.client,
        &me,
        vec![pb::Memory {
            supersedes: old.clone(),
            embedding: axis(1),
            ..mem(&new, "", "alice lives in berlin")
        }],
    )
    .await;
    assert_eq!(
        r.results[0].version, 2,
        "a superseding memory continues the chain"
    );

    assert_eq!(
        ids(&keyword(&mut h.client, &me, "where does alice live", None, 10).await),
        vec![new.clone()]
    );
    assert_eq!(
        ids(&dense(&mut h.client, &me, axis(1), None, 10).await),
        vec![new.clone()]
    );
    for f in [
        pb::Filters {
            as_of_event: Some(chrono_to_ts(before)),
            ..Default::default()
        },
        pb::Filters {
            as_of_ingestion: Some(chrono_to_ts(before)),
            ..Default::default()
        },
    ] {
        assert_eq!(
            ids(&keyword(&mut h.client, &me, "alice", Some(f.clone()), 10).await),
            vec![old.clone()]
        );
        assert_eq!(
            ids(&dense(&mut h.client, &me, axis(1), Some(f), 10).await),
            vec![old.clone()]
        );
    }
    let hist = pb::Filters {
        include_historical: true,
        ..Default::default()
    };
    let mut both = vec![old.clone(), new.clone()];
    both.sort();
    assert_eq!(
        ids(&keyword(&mut h.client, &me, "alice", Some(hist), 10).await),
        both
    );
    let edges: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM edges WHERE edge_type = 'supersedes' AND src_id = $1",
    )
    .bind(Uuid::parse_str(&new).expect("uuid"))
    .fetch_one(&h.pool)
    .await
    .expect("edges");
    assert_eq!(edges, 1);
}

/// Memories that differ from the baseline in exactly one filtered dimension;
/// each filter must hide exactly its own memory in dense and keyword search.
#[tokio::test]
async fn every_filter_is_applied_in_sql() {
    // An operator's decay floor, so the floor's SQL is covered too (the
    // default is 0: decay only ranks, issue 46).
    let mut h = start_configured(embeddings(), |s| s.search.decay_floor = 0.1).await;
    let t = tenant();
    let a = ident(&t, "agent-a", AccessLevel::Sensitive);
    let b = ident(&t, "agent-b", AccessLevel::Sensitive);
    let now = chrono::Utc::now();
    let day = chrono::Duration::days(1);
    let base = |id: &str| pb::Memory {
        id: id.into(),
        content: "zebra facts".into(),
        embedding: axis(7),
        memory_type: "semantic".into(),
        namespace: "kb".into(),
        event_time: Some(chrono_to_ts(now - day)),
        metadata: Some(json_to_struct(&serde_json::json!({"color": "red"}))),
        source_confidence: Some(0.9),
        ..Default::default()
    };
    let n = |_: ()| Uuid::new_v4().to_string();
    let (plain, typ, old, ns, cons, meta, lowconf, decayed, other_agent, future_valid) = (
        n(()),
        n(()),
        n(()),
        n(()),
        n(()),
        n(()),
        n(()),
        n(()),
        n(()),
        n(()),
    );
    upsert(
        &mut h.client,
        &a,
        vec![
            base(&plain),
            pb::Memory {
                memory_type: "episodic".into(),
                ..base(&typ)
            },
            pb::Memory {
                event_time: Some(chrono_to_ts(now - day * 30)),
                ..base(&old)
            },
            pb::Memory {
                namespace: "other".into(),
                ..base(&ns)
            },
            pb::Memory {
                consolidated: true,
                ..base(&cons)
            },
            pb::Memory {
                metadata: Some(json_to_struct(&serde_json::json!({"color": "blue"}))),
                ..base(&meta)
            },
            pb::Memory {
                source_confidence: Some(0.2),
                ..base(&lowconf)
            },
            base(&decayed),
            pb::Memory {
                valid_from: Some(chrono_to_ts(now - day * 40)),
                valid_to: Some(chrono_to_ts(now - day * 20)),
                ..base(&future_valid)
            },
        ],
    )
    .await;
    upsert(&mut h.client, &b, vec![base(&other_agent)]).await;
    sqlx::query("UPDATE memories SET decay_score = 0.05 WHERE id = $1")
        .bind(Uuid::parse_str(&decayed).expect("uuid"))
        .execute(&h.pool)
        .await
        .expect("decay");

    let all: Vec<String> = [
        &plain,
        &typ,
        &old,
        &ns,
        &cons,
        &meta,
        &lowconf,
        &decayed,
        &other_agent,
        &future_valid,
    ]
    .into_iter()
    .cloned()
    .collect();
    let without = |hidden: &[&String]| {
        let mut v: Vec<String> = all
            .iter()
            .filter(|x| !hidden.contains(x))
            .cloned()
            .collect();
        v.sort();
        v
    };
    let ts = chrono_to_ts;
    // Defaults hide consolidated, decayed (below the operator's floor) and
    // no-longer-valid memories.
    let default_hidden = [&cons, &decayed, &future_valid];
    let cases: Vec<(&str, pb::Filters, Vec<String>)> = vec![
        ("default", pb::Filters::default(), without(&default_hidden)),
        (
            "memory_types",
            pb::Filters {
                memory_types: vec!["semantic".into()],
                ..Default::default()
            },
            without(&[&cons, &decayed, &future_valid, &typ]),
        ),
        (
            "time_range",
            pb::Filters {
                time_range: Some(pb::TimeRange {
                    start: Some(ts(now - day * 2)),
                    end: Some(ts(now)),
                }),
                ..Default::default()
            },
            without(&[&cons, &decayed, &future_valid, &old]),
        ),
        (
            "agent_scope",
            pb::Filters {
                agent_scope: vec!["agent-a".into()],
                ..Default::default()
            },
            without(&[&cons, &decayed, &future_valid, &other_agent]),
        ),
        (
            "namespace",
            pb::Filters {
                namespace: "kb".into(),
                ..Default::default()
            },
            without(&[&cons, &decayed, &future_valid, &ns]),
        ),
        (
            "include_consolidated",
            pb::Filters {
                include_consolidated: true,
                ..Default::default()
            },
            without(&[&decayed, &future_valid]),
        ),
        (
            "metadata",
            pb::Filters {
                metadata: Some(json_to_struct(&serde_json::json!({"color": "red"}))),
                ..Default::default()
            },
            without(&[&cons, &decayed, &future_valid, &meta]),
        ),
        (
            "min_confidence",
            pb::Filters {
                min_confidence: 0.5,
                ..Default::default()
            },
            without(&[&cons, &decayed, &future_valid, &lowconf]),
        ),
        (
            "decay_floor",
            pb::Filters {
                decay_floor: 0.01,
                ..Default::default()
            },
            without(&[&cons, &future_valid]),
        ),
        (
            "include_historical",
            pb::Filters {
                include_historical: true,
                ..Default::default()
            },
            without(&[&cons]),
        ),
        (
            "as_of_event",
            pb::Filters {
                as_of_event: Some(ts(now - day * 25)),
                ..Default::default()
            },
            {
                // Only memories valid 25 days ago: the old-event one (valid from
                // its event time, 30 days ago) and the closed interval.
                let mut v = vec![old.clone(), future_valid.clone()];
                v.sort();
                v
            },
        ),
        (
            "as_of_ingestion",
            pb::Filters {
                as_of_ingestion: Some(ts(now - day)),
                ..Default::default()
            },
            vec![],
        ),
    ];
    for (name, f, expected) in cases {
        let kw = ids(&keyword(&mut h.client, &a, "zebra", Some(f.clone()), 50).await);
        assert_eq!(kw, expected, "keyword, filter {name}");
        let dn = ids(&dense(&mut h.client, &a, axis(7), Some(f), 50).await);
        assert_eq!(dn, expected, "dense, filter {name}");
    }
}

#[tokio::test]
async fn concurrent_overlapping_batches_end_with_exact_rows() {
    let h = start().await;
    let t = tenant();
    let me = ident(&t, "a", AccessLevel::Public);
    let pool_ids: Vec<String> = (0..40).map(|_| Uuid::new_v4().to_string()).collect();
    let mut tasks = Vec::new();
    for w in 0..8usize {
        let mut c = h.client.clone();
        let me = me.clone();
        // Each batch takes 20 ids from a window that overlaps its neighbours.
        let batch: Vec<pb::Memory> = (0..20)
            .map(|j| {
                let id = &pool_ids[(w * 3 + j) % pool_ids.len()];
                pb::Memory {
                    embedding: axis(j),
                    entities: vec!["Shared Entity".into(), format!("E{j}")],
                    ..mem(id, "", &format!("content {id} from writer {w}"))
                }
            })
            .collect();
        tasks.push(tokio::spawn(async move {
            c.upsert(req(pb::UpsertRequest { memories: batch }, &me))
                .await
        }));
    }
    let mut touched = std::collections::BTreeSet::new();
    for (w, task) in tasks.into_iter().enumerate() {
        let r = task.await.expect("join").expect("upsert").into_inner();
        assert_eq!(r.results.len(), 20);
        for j in 0..20 {
            touched.insert(pool_ids[(w * 3 + j) % pool_ids.len()].clone());
        }
    }
    let rows: Vec<(Uuid, String)> =
        sqlx::query_as("SELECT id, content FROM memories WHERE tenant_id = $1 ORDER BY id")
            .bind(&t)
            .fetch_all(&h.pool)
            .await
            .expect("rows");
    let got: std::collections::BTreeSet<String> =
        rows.iter().map(|(id, _)| id.to_string()).collect();
    assert_eq!(got, touched);
    for (id, content) in &rows {
        assert!(
            content.starts_with(&format!("content {id} from writer ")),
            "{content}"
        );
    }
    let shared: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM memory_entities me JOIN entities e ON e.id = me.entity_id WHERE e.tenant_id = $1 AND e.name = 'shared entity'",
    )
    .bind(&t)
    .fetch_one(&h.pool)
    .await
    .expect("links");
    assert_eq!(shared as usize, touched.len());
}

#[tokio::test]
async fn bad_input_is_invalid_argument_naming_the_field() {
    let mut h = start().await;
    let me = ident(&tenant(), "a", AccessLevel::Public);
    let big = "x".repeat(65 * 1024);
    let err = h
        .client
        .upsert(req(
            pb::UpsertRequest {
                memories: vec![mem("", "", "ok"), mem("", "", &big)],
            },
            &me,
        ))
        .await
        .expect_err("too big");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        err.message(),
        "memories[1].content: must be at most 65536 bytes"
    );

    let cases: Vec<(pb::VectorSearchRequest, &str)> = vec![
        (
            pb::VectorSearchRequest {
                text: "q".into(),
                k: 0,
                ..Default::default()
            },
            "k:",
        ),
        (
            pb::VectorSearchRequest {
                text: "q".into(),
                k: 201,
                ..Default::default()
            },
            "k:",
        ),
        (
            pb::VectorSearchRequest {
                embedding: vec![1.0; 10],
                k: 5,
                ..Default::default()
            },
            "embedding:",
        ),
        (
            pb::VectorSearchRequest {
                text: "q".repeat(4097),
                k: 5,
                ..Default::default()
            },
            "text:",
        ),
        (
            pb::VectorSearchRequest {
                text: "q".into(),
                k: 5,
                filters: Some(pb::Filters {
                    memory_types: vec!["BAD".into()],
                    ..Default::default()
                }),
                ..Default::default()
            },
            "filters.memory_types[0]:",
        ),
    ];
    for (r, field) in cases {
        let err = h.client.vector_search(req(r, &me)).await.expect_err(field);
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{field}");
        assert!(
            err.message().starts_with(field),
            "{field}: {}",
            err.message()
        );
    }
    let err = h
        .client
        .delete(req(
            pb::DeleteRequest {
                ids: vec!["not-a-uuid".into()],
            },
            &me,
        ))
        .await
        .expect_err("bad id");
    assert_eq!(err.message(), "ids[0]: must be a UUID");

    // No internal token: unauthenticated.
    let err = h
        .client
        .keyword_search(tonic::Request::new(pb::KeywordSearchRequest {
            text: "q".into(),
            k: 1,
            filters: None,
        }))
        .await
        .expect_err("no token");
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
}

#[tokio::test]
async fn delete_cascades_and_edges_need_visible_ends() {
    let mut h = start().await;
    let t = tenant();
    let me = ident(&t, "a", AccessLevel::Internal);
    let (x, y, secret) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    upsert(
        &mut h.client,
        &me,
        vec![
            pb::Memory {
                triples: vec![pb::Triple {
                    subject: "Alice".into(),
                    relation: "knows".into(),
                    object: "Bob".into(),
                }],
                ..mem(&x.to_string(), "Alice", "Alice knows Bob.")
            },
            mem(&y.to_string(), "Bob", "Bob is a builder."),
        ],
    )
    .await;
    let high = ident(&t, "a", AccessLevel::Sensitive);
    upsert(
        &mut h.client,
        &high,
        vec![pb::Memory {
            access_level: pb::AccessLevel::Sensitive as i32,
            ..mem(&secret.to_string(), "", "classified")
        }],
    )
    .await;

    let edge = |s: Uuid, d: Uuid, ty: &str| pb::Edge {
        src_id: s.to_string(),
        dst_id: d.to_string(),
        edge_type: ty.into(),
        weight: 0.0,
    };
    let added = h
        .client
        .add_edges(req(
            pb::AddEdgesRequest {
                edges: vec![edge(x, y, "related"), edge(y, x, "contradicts")],
            },
            &me,
        ))
        .await
        .expect("edges")
        .into_inner();
    assert_eq!(added.added, 2);
    let err = h
        .client
        .add_edges(req(
            pb::AddEdgesRequest {
                edges: vec![edge(x, secret, "related")],
            },
            &me,
        ))
        .await
        .expect_err("invisible end");
    assert_eq!(err.code(), tonic::Code::NotFound);
    let err = h
        .client
        .add_edges(req(
            pb::AddEdgesRequest {
                edges: vec![edge(x, Uuid::new_v4(), "related")],
            },
            &me,
        ))
        .await
        .expect_err("missing end");
    assert_eq!(err.code(), tonic::Code::NotFound);

    // A lower-trust caller cannot delete the sensitive memory.
    let d = h
        .client
        .delete(req(
            pb::DeleteRequest {
                ids: vec![secret.to_string()],
            },
            &me,
        ))
        .await
        .expect("delete")
        .into_inner();
    assert_eq!(d.deleted, 0);
    let d = h
        .client
        .delete(req(
            pb::DeleteRequest {
                ids: vec![x.to_string()],
            },
            &me,
        ))
        .await
        .expect("delete")
        .into_inner();
    assert_eq!(d.deleted, 1);
    let (edges, triples, links): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM edges WHERE src_id = $1 OR dst_id = $1), \
                (SELECT count(*) FROM triples WHERE memory_id = $1), \
                (SELECT count(*) FROM memory_entities WHERE memory_id = $1)",
    )
    .bind(x)
    .fetch_one(&h.pool)
    .await
    .expect("counts");
    assert_eq!((edges, triples, links), (0, 0, 0));

    let stored = h
        .client
        .store_feedback(req(
            pb::StoreFeedbackRequest {
                items: vec![pb::StoredFeedback {
                    query_id: "q1".into(),
                    memory_id: y.to_string(),
                    signal: "helpful".into(),
                    value: true,
                }],
                examples: vec![pb::RankExample {
                    query_id: "q1".into(),
                    memory_id: y.to_string(),
                    features: vec![0.5, 1.0],
                    relevant: true,
                }],
            },
            &me,
        ))
        .await
        .expect("feedback")
        .into_inner();
    assert_eq!(stored.stored, 1);
    let (features, relevant): (Vec<f32>, bool) = sqlx::query_as(
        "SELECT features, relevant FROM ranker_examples WHERE tenant_id = $1 AND memory_id = $2",
    )
    .bind(&t)
    .bind(y)
    .fetch_one(&h.pool)
    .await
    .expect("the example is stored with the feedback");
    assert_eq!((features, relevant), (vec![0.5, 1.0], true));
    let bad = h
        .client
        .store_feedback(req(
            pb::StoreFeedbackRequest {
                items: vec![pb::StoredFeedback {
                    query_id: "q2".into(),
                    memory_id: y.to_string(),
                    signal: "helpful".into(),
                    value: true,
                }],
                examples: vec![pb::RankExample {
                    query_id: "q2".into(),
                    memory_id: y.to_string(),
                    features: vec![f32::NAN],
                    relevant: true,
                }],
            },
            &me,
        ))
        .await
        .expect_err("a NaN feature is refused");
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    assert!(
        bad.message().contains("examples[0].features"),
        "{}",
        bad.message()
    );
}

#[tokio::test]
async fn change_events_are_notified_on_commit() {
    let mut h = start().await;
    let t = tenant();
    let me = ident(&t, "a", AccessLevel::Public);
    let mut listener = sqlx::postgres::PgListener::connect_with(&h.pool)
        .await
        .expect("listener");
    listener.listen("engram_changes").await.expect("listen");
    let id = Uuid::new_v4();
    upsert(
        &mut h.client,
        &me,
        vec![pb::Memory {
            embedding: axis(3),
            ..mem(&id.to_string(), "", "note")
        }],
    )
    .await;
    let want =
        serde_json::json!({"tenant": t, "op": "upsert", "ids": [id.to_string()], "write": ""});
    assert_eq!(next_change(&mut listener, &t).await, want);
    // A write that closes another memory names it too: graph-svc re-reads
    // only the memories a notification names.
    let newer = Uuid::new_v4();
    upsert(
        &mut h.client,
        &me,
        vec![pb::Memory {
            embedding: axis(3),
            supersedes: id.to_string(),
            ..mem(&newer.to_string(), "", "newer note")
        }],
    )
    .await;
    let want = serde_json::json!({"tenant": t, "op": "upsert", "ids": [newer.to_string(), id.to_string()], "write": ""});
    assert_eq!(next_change(&mut listener, &t).await, want);
    // The gateway's id of a write call comes back in its event, so the
    // replica that made the write knows it (retrieval-svc own_writes.rs);
    // a malformed one is dropped, not refused.
    for (sent, echoed) in [("4f1c9a-w", "4f1c9a-w"), ("not an id", "")] {
        let third = Uuid::new_v4();
        let mut r = req(
            pb::UpsertRequest {
                memories: vec![pb::Memory {
                    embedding: axis(3),
                    ..mem(&third.to_string(), "", "third note")
                }],
            },
            &me,
        );
        engram_common::identity::write_write_id(r.metadata_mut(), sent);
        h.client.upsert(r).await.expect("upsert");
        let got = next_change(&mut listener, &t).await;
        assert_eq!(got["write"], echoed, "{got}");
    }
}

/// The next change notification for `tenant`.
async fn next_change(listener: &mut sqlx::postgres::PgListener, tenant: &str) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let n = tokio::time::timeout_at(deadline, listener.recv())
            .await
            .expect("in time")
            .expect("recv");
        let v: serde_json::Value = serde_json::from_str(n.payload()).expect("json");
        if v["tenant"] == tenant {
            return v;
        }
    }
}

#[tokio::test]
async fn missing_model_is_not_serving_but_client_vectors_work() {
    let mut h = start_with(
        search_svc::Embeddings::unavailable("test: no model"),
        "ts_rank_cd",
    )
    .await;
    let me = ident(&tenant(), "a", AccessLevel::Public);
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", h.addr))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let st = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: search_svc::SERVICE_NAME.into(),
        })
        .await
        .expect("health")
        .into_inner();
    assert_eq!(
        st.status,
        tonic_health::pb::health_check_response::ServingStatus::NotServing as i32
    );
    let err = h
        .client
        .vector_search(req(
            pb::VectorSearchRequest {
                text: "hello".into(),
                k: 3,
                ..Default::default()
            },
            &me,
        ))
        .await
        .expect_err("needs model");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    let err = h
        .client
        .upsert(req(
            pb::UpsertRequest {
                memories: vec![mem("", "", "x")],
            },
            &me,
        ))
        .await
        .expect_err("needs model");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    upsert(
        &mut h.client,
        &me,
        vec![pb::Memory {
            embedding: axis(2),
            ..mem("", "", "with vector")
        }],
    )
    .await;
    assert_eq!(dense(&mut h.client, &me, axis(2), None, 3).await.len(), 1);
}

/// Dense search no longer sets the HNSW knobs per query (one round trip), so
/// every pooled connection must carry them from its startup options.
#[tokio::test]
async fn pooled_connections_carry_the_hnsw_settings() {
    let pool = engram_common::db::test_database().await.expect("database");
    for _ in 0..3 {
        // The cast loads pgvector first, so its own GUCs are the ones read.
        let (ef, scan, _): (String, String, String) = sqlx::query_as(
            "SELECT current_setting('hnsw.ef_search'), \
             current_setting('hnsw.iterative_scan'), '[1,2]'::vector::text",
        )
        .fetch_one(&pool)
        .await
        .expect("settings");
        assert_eq!(ef, "100");
        assert_eq!(scan, "relaxed_order");
    }
}

/// While Postgres is unreachable a write is refused at once with
/// UNAVAILABLE (not acknowledged, so the caller retries it), instead of
/// waiting out the pool's acquire timeout with the caller's slot held.
#[tokio::test]
async fn writes_fail_fast_with_unavailable_while_the_database_is_down() {
    // Nothing listens on a port the OS just gave back.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(std::time::Duration::from_secs(10))
        .connect_lazy(&format!("postgres://engram:x@127.0.0.1:{port}/engram"))
        .expect("lazy pool");
    let mut settings = engram_common::db::test_settings();
    settings.auth.internal_token_opt = Some(TOKEN.into());
    let svc = search_svc::SearchSvc::new(
        &settings,
        pool,
        search_svc::Embeddings::unavailable("test: no model"),
    )
    .expect("svc");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(search_svc::serve_svc(listener, svc, async move {
        let _ = stopped.await;
    }));
    let mut client = connect(addr).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    // The watcher's first check decides (it is bounded by two seconds).
    let listing = tonic_health::pb::HealthCheckRequest {
        service: "engram.v1.ListingService".into(),
    };
    let not_serving = tonic_health::pb::health_check_response::ServingStatus::NotServing as i32;
    for _ in 0..100 {
        let st = health.check(listing.clone()).await.expect("health");
        if st.into_inner().status == not_serving {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let me = ident(&tenant(), "a", AccessLevel::Internal);
    let err = client
        .upsert(req(
            pb::UpsertRequest {
                memories: vec![pb::Memory {
                    embedding: axis(1),
                    ..mem("", "", "written during an outage")
                }],
            },
            &me,
        ))
        .await
        .expect_err("no database");
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(
        err.message().contains("not applied; retry"),
        "{}",
        err.message()
    );
    let _ = stop.send(());
}

/// A `contradicts` edge a client added could never be removed (issue 47,
/// item 20). DeleteEdges removes the caller's own edges between memories
/// it may read, and nothing else: not another tenant's, not one that ends
/// at a memory above the caller's level, not engram's detected ones, and
/// never a `supersedes` edge, which follows the memory's field.
#[tokio::test]
async fn delete_edges_removes_only_what_the_caller_added_and_may_read() {
    let mut h = start().await;
    let t = tenant();
    let me = ident(&t, "a", AccessLevel::Internal);
    let high = ident(&t, "a", AccessLevel::Sensitive);
    let (x, y, secret) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    upsert(
        &mut h.client,
        &me,
        vec![
            mem(&x.to_string(), "", "The coffee machine is on floor 3."),
            mem(&y.to_string(), "", "The coffee machine is on floor 5."),
        ],
    )
    .await;
    upsert(
        &mut h.client,
        &high,
        vec![pb::Memory {
            access_level: pb::AccessLevel::Sensitive as i32,
            ..mem(&secret.to_string(), "", "classified")
        }],
    )
    .await;
    let edge = |s: Uuid, d: Uuid, ty: &str| pb::Edge {
        src_id: s.to_string(),
        dst_id: d.to_string(),
        edge_type: ty.into(),
        weight: 0.0,
    };
    let key = |s: Uuid, d: Uuid, ty: &str| pb::EdgeKey {
        src_id: s.to_string(),
        dst_id: d.to_string(),
        edge_type: ty.into(),
    };
    let added = h
        .client
        .add_edges(req(
            pb::AddEdgesRequest {
                edges: vec![
                    edge(x, y, "contradicts"),
                    edge(x, y, "related"),
                    edge(x, secret, "related"),
                ],
            },
            &high,
        ))
        .await
        .expect("edges")
        .into_inner();
    assert_eq!(added.added, 3);
    sqlx::query("UPDATE edges SET origin = 'detected' WHERE src_id = $1 AND edge_type = 'related' AND dst_id = $2")
        .bind(x)
        .bind(y)
        .execute(&h.pool)
        .await
        .expect("mark detected");
    let delete = |who: &Identity, keys: Vec<pb::EdgeKey>| {
        let mut c = h.client.clone();
        let r = req(pb::DeleteEdgesRequest { edges: keys }, who);
        async move { c.delete_edges(r).await }
    };
    let count = |r: Result<tonic::Response<pb::DeleteEdgesResponse>, tonic::Status>| {
        r.expect("delete edges").into_inner().deleted
    };

    // Another tenant naming the same edge removes nothing.
    let stranger = ident(&tenant(), "a", AccessLevel::Sensitive);
    assert_eq!(
        count(delete(&stranger, vec![key(x, y, "contradicts")]).await),
        0
    );
    // An edge to a memory above the caller's level stays, unreported.
    assert_eq!(count(delete(&me, vec![key(x, secret, "related")]).await), 0);
    // engram's detected edges are reviewed with ReviewConflict, not here.
    assert_eq!(count(delete(&me, vec![key(x, y, "related")]).await), 0);
    // A supersedes edge is refused, naming the field and the rule.
    let err = delete(&me, vec![key(x, y, "contradicts"), key(y, x, "supersedes")])
        .await
        .expect_err("supersedes");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().starts_with("edges[1].edge_type:"),
        "{}",
        err.message()
    );
    let err = delete(&me, vec![]).await.expect_err("empty");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    // The owner's own edge goes, once (the repeat counts once).
    let twice = vec![key(x, y, "contradicts"), key(x, y, "contradicts")];
    assert_eq!(count(delete(&me, twice).await), 1);
    assert_eq!(count(delete(&me, vec![key(x, y, "contradicts")]).await), 0);

    let left: Vec<(Uuid, String, String)> = sqlx::query_as(
        "SELECT dst_id, edge_type, origin FROM edges WHERE src_id = $1 ORDER BY edge_type, dst_id",
    )
    .bind(x)
    .fetch_all(&h.pool)
    .await
    .expect("edges left");
    let mut want = vec![
        (y, "related".to_string(), "detected".to_string()),
        (secret, "related".to_string(), "caller".to_string()),
    ];
    want.sort_by(|a, b| (&a.1, a.0).cmp(&(&b.1, b.0)));
    assert_eq!(left, want);
    // The sensitive caller may remove the edge to its sensitive memory.
    assert_eq!(
        count(delete(&high, vec![key(x, secret, "related")]).await),
        1
    );
}
