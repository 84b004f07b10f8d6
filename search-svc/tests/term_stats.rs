//! BM25 statistics kept by the write path (migrations/0002_term_stats.sql):
//! exact after concurrent and mixed writes, and per access level so hidden
//! records never shift a caller's scores.

mod common;

use common::*;
use engram_common::AccessLevel;
use engram_proto as pb;
use sqlx::PgPool;
use uuid::Uuid;

type TermRow = (String, i16, i64);
type DocRow = (i16, i64, i64);

/// The maintained statistics and a recount from the rows, for one tenant.
async fn stats_and_recount(
    pool: &PgPool,
    t: &str,
) -> ((Vec<TermRow>, Vec<DocRow>), (Vec<TermRow>, Vec<DocRow>)) {
    let kept_terms: Vec<TermRow> = sqlx::query_as(
        "SELECT lexeme, access_level, df FROM term_stats WHERE tenant_id = $1 AND df <> 0 ORDER BY 1, 2",
    )
    .bind(t)
    .fetch_all(pool)
    .await
    .expect("term_stats");
    let kept_docs: Vec<DocRow> = sqlx::query_as(
        "SELECT access_level, docs, total_len FROM doc_stats WHERE tenant_id = $1 AND docs <> 0 ORDER BY 1",
    )
    .bind(t)
    .fetch_all(pool)
    .await
    .expect("doc_stats");
    let terms: Vec<TermRow> = sqlx::query_as(
        "SELECT u.lexeme, m.access_level, count(*)::int8 FROM memories m, \
         unnest(tsvector_to_array(m.tsv)) AS u(lexeme) WHERE m.tenant_id = $1 GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .bind(t)
    .fetch_all(pool)
    .await
    .expect("recount terms");
    let docs: Vec<DocRow> = sqlx::query_as(
        "SELECT access_level, count(*)::int8, sum(tsv_len)::int8 FROM memories WHERE tenant_id = $1 GROUP BY 1 ORDER BY 1",
    )
    .bind(t)
    .fetch_all(pool)
    .await
    .expect("recount docs");
    ((kept_terms, kept_docs), (terms, docs))
}

fn level(i: usize) -> i32 {
    (i % 4) as i32 + 1
}

#[tokio::test]
async fn statistics_match_a_recount_after_concurrent_and_mixed_writes() {
    let h = start().await;
    let t = tenant();
    let me = ident(&t, "a", AccessLevel::Sensitive);
    let ids: Vec<String> = (0..40).map(|_| Uuid::new_v4().to_string()).collect();
    let mut tasks = Vec::new();
    for w in 0..8usize {
        let mut c = h.client.clone();
        let me = me.clone();
        let batch: Vec<pb::Memory> = (0..20)
            .map(|j| {
                let i = (w * 3 + j) % ids.len();
                pb::Memory {
                    embedding: axis(j),
                    access_level: level(i + w),
                    ..mem(
                        &ids[i],
                        &format!("Topic {}", j % 5),
                        &format!("shared words and writer{w} item{i} zebra number {j}"),
                    )
                }
            })
            .collect();
        tasks.push(tokio::spawn(async move {
            c.upsert(req(pb::UpsertRequest { memories: batch }, &me))
                .await
        }));
    }
    for task in tasks {
        task.await.expect("join").expect("upsert");
    }
    let (kept, recount) = stats_and_recount(&h.pool, &t).await;
    assert!(!recount.0.is_empty());
    assert_eq!(kept, recount, "after concurrent upserts");

    // Same content again (no change), new content, a level change, deletes.
    let mut c = h.client.clone();
    let same: Vec<pb::Memory> = (0..5)
        .map(|i| pb::Memory {
            embedding: axis(i),
            access_level: 1,
            ..mem(&ids[i], "Repeat", "repeated text stays counted once")
        })
        .collect();
    upsert(&mut c, &me, same.clone()).await;
    upsert(&mut c, &me, same).await;
    let moved: Vec<pb::Memory> = (5..10)
        .map(|i| pb::Memory {
            embedding: axis(i),
            access_level: 4,
            ..mem(&ids[i], "Repeat", "repeated text stays counted once")
        })
        .collect();
    upsert(&mut c, &me, moved).await;
    c.delete(req(
        pb::DeleteRequest {
            ids: ids[10..20].to_vec(),
        },
        &me,
    ))
    .await
    .expect("delete");
    let (kept, recount) = stats_and_recount(&h.pool, &t).await;
    assert_eq!(kept, recount, "after mixed writes");
}

#[tokio::test]
async fn hidden_levels_and_other_tenants_do_not_shift_scores() {
    let h = start().await;
    let mut c = h.client.clone();
    // Two public memories that score alike for "quokka wombat"...
    let public = |t: &str| {
        vec![
            pb::Memory {
                embedding: axis(1),
                ..mem(
                    &Uuid::new_v4().to_string(),
                    "",
                    &format!("the quokka of {t}"),
                )
            },
            pb::Memory {
                embedding: axis(2),
                ..mem(
                    &Uuid::new_v4().to_string(),
                    "",
                    &format!("the wombat of {t}"),
                )
            },
        ]
    };
    // ...in a tenant that also holds sensitive quokka records,
    let t = tenant();
    let admin = ident(&t, "a", AccessLevel::Sensitive);
    let public_caller = ident(&t, "p", AccessLevel::Public);
    upsert(&mut c, &admin, public("x")).await;
    let hidden: Vec<pb::Memory> = (0..30)
        .map(|i| pb::Memory {
            embedding: axis(i + 3),
            access_level: 4,
            ..mem(
                &Uuid::new_v4().to_string(),
                "",
                &format!("secret quokka file {i}"),
            )
        })
        .collect();
    upsert(&mut c, &admin, hidden).await;
    // and a tenant with the public ones only.
    let other = tenant();
    let other_caller = ident(&other, "p", AccessLevel::Public);
    upsert(&mut c, &other_caller, public("x")).await;

    let scores = |hits: &[pb::SearchHit]| -> Vec<(String, f32)> {
        let mut v: Vec<(String, f32)> = hits
            .iter()
            .filter_map(|h| h.memory.as_ref().map(|m| (m.content.clone(), h.score)))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    let seen = scores(&keyword(&mut c, &public_caller, "quokka wombat", None, 10).await);
    let alone = scores(&keyword(&mut c, &other_caller, "quokka wombat", None, 10).await);
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(
        seen, alone,
        "hidden records changed a public caller's scores"
    );
    assert!((seen[0].1 - seen[1].1).abs() < 1e-6, "{seen:?}");

    // The sensitive caller does see quokka as the commoner term.
    let all = keyword(&mut c, &admin, "quokka wombat", None, 40).await;
    assert_eq!(all.len(), 32);
    let top = all[0].memory.as_ref().map(|m| m.content.clone());
    assert_eq!(top.as_deref(), Some("the wombat of x"));
}

/// BM25 asks the GIN index only for the rarest terms while their summed df
/// fits `search.keyword_candidates`: a budget of 3 keeps the one "okapi"
/// memory and never touches the ten "river" ones, 2,000 scores them all.
#[tokio::test]
async fn the_candidate_budget_takes_the_rarest_terms_first() {
    let t = tenant();
    let id = ident(&t, "a", AccessLevel::Sensitive);
    let mut memories: Vec<pb::Memory> = (0..10)
        .map(|i| pb::Memory {
            embedding: axis(i),
            ..mem(
                &Uuid::new_v4().to_string(),
                "",
                &format!("the river bend {i}"),
            )
        })
        .collect();
    memories.push(pb::Memory {
        embedding: axis(20),
        ..mem(&Uuid::new_v4().to_string(), "", "an okapi by the river")
    });
    let wide = start().await;
    upsert(&mut wide.client.clone(), &id, memories).await;
    let all = keyword(&mut wide.client.clone(), &id, "okapi river", None, 50).await;
    assert_eq!(all.len(), 11);
    let narrow = start_configured(embeddings(), |s| s.search.keyword_candidates = 3).await;
    let few = keyword(&mut narrow.client.clone(), &id, "okapi river", None, 50).await;
    assert_eq!(few.len(), 1, "{few:?}");
    assert_eq!(
        few[0].memory.as_ref().map(|m| m.content.as_str()),
        Some("an okapi by the river")
    );
    // The kept memory is scored with every query term, as without a budget.
    assert!((few[0].score - all[0].score).abs() < 1e-6);
}

/// keyword.rs recovers BM25's term frequency from ts_rank; a Postgres that
/// ranked differently would silently change scores, so check it here.
#[tokio::test]
async fn term_frequency_from_ts_rank_is_exact() {
    let pool = engram_common::db::test_database().await.expect("db");
    let sql = format!(
        "WITH d AS (SELECT n, setweight(to_tsvector('english', 'start'), 'A') || \
           setweight(to_tsvector('english', repeat('quokka stone ', n)), 'B') AS tsv \
           FROM generate_series(1, 300) n) \
         SELECT n, (SELECT coalesce(array_length(u.positions, 1), 1) FROM unnest(c.tsv) u \
           WHERE u.lexeme = 'quokka')::float8 AS truth, {} AS tf \
         FROM d c, (SELECT '''quokka'''::tsquery AS query) df ORDER BY n",
        search_svc::keyword::TERM_FREQUENCY
    );
    let rows: Vec<(i32, f64, f64)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .fetch_all(&pool)
        .await
        .expect("query");
    assert_eq!(rows.len(), 300);
    for (n, truth, tf) in rows {
        assert_eq!(truth, tf, "tf {n}");
    }
}
