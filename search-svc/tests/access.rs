//! Property: no search result is ever above the caller's trust level or from
//! another tenant, for random memories and callers, dense and keyword
//! (keyword both from SQL and from the in-memory keyword index).

mod common;

use common::*;
use engram_common::AccessLevel;
use engram_proto as pb;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::collections::HashMap;
use std::sync::Mutex;

const WORDS: &[&str] = &["apple", "river", "stone", "cloud", "tiger"];

fn level(i: u8) -> AccessLevel {
    AccessLevel::from_i16(i16::from(i)).unwrap_or(AccessLevel::Public)
}

#[test]
fn results_never_exceed_trust_or_cross_tenants() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    // The fact index on, so its sentences are under the property too.
    let mut h = rt.block_on(start_configured(embeddings(), |s| {
        s.search.keyword_scoring = "bm25".into();
        s.search.fact_index = true;
        s.search.keyword_index_rebuild_ms = 0;
    }));
    let tenants = [tenant(), tenant()];
    // (tenant index, access level, word index, axis)
    let memories =
        prop::collection::vec((0usize..2, 1u8..=4, 0usize..WORDS.len(), 0usize..4), 1..12);
    let caller = (0usize..2, 1u8..=4, 0usize..WORDS.len(), 0usize..4);
    let mut runner = TestRunner::new(Config {
        cases: 12,
        ..Config::default()
    });
    // Every memory written, by id: (tenant index, access level).
    let written: Mutex<HashMap<String, (usize, u8)>> = Mutex::new(HashMap::new());
    let result = runner.run(&(memories, caller), |(mems, (ct, cl, word, ax))| {
        let mut client = h.client.clone();
        rt.block_on(async {
            for (t, l, w, a) in &mems {
                let who = ident(&tenants[*t], "writer", AccessLevel::Sensitive);
                let r = upsert(
                    &mut client,
                    &who,
                    vec![pb::Memory {
                        access_level: level(*l).to_proto(),
                        embedding: axis(*a),
                        ..mem(
                            "",
                            "",
                            &format!("{} note {}", WORDS[*w], WORDS[(*w + 1) % WORDS.len()]),
                        )
                    }],
                )
                .await;
                let mut w = written.lock().expect("written");
                for res in r.results {
                    w.insert(res.id, (*t, *l));
                }
            }
            let me = ident(&tenants[ct], "reader", level(cl));
            // Facts (the sentence index) name only their memory: it must be
            // one of this tenant's at or below the caller's trust.
            let found = dense_facts(&mut client, &me, axis(ax), 50).await;
            for fact in found {
                let found = written
                    .lock()
                    .expect("written")
                    .get(&fact.memory_id)
                    .copied();
                let (t, l) = found.expect("a fact of a memory this test never wrote");
                assert_eq!(t, ct, "a fact of a foreign tenant leaked");
                assert!(l <= cl, "a fact at level {l} above trust {cl}");
            }
            let check = |hits: &[pb::SearchHit]| {
                for hit in hits {
                    let m = hit.memory.as_ref().expect("memory");
                    assert_eq!(m.tenant_id, tenants[ct], "foreign tenant leaked");
                    assert!(
                        m.access_level <= level(cl).to_proto(),
                        "level {} above trust {cl}",
                        m.access_level
                    );
                }
            };
            let two_words = format!("{} note", WORDS[word]);
            check(&dense(&mut client, &me, axis(ax), None, 200).await);
            // Right after the writes the tenant's keyword index is behind
            // them and SQL answers; then the index itself.
            check(&keyword(&mut client, &me, WORDS[word], None, 200).await);
            check(&keyword(&mut client, &me, &two_words, None, 200).await);
            wait_keyword_index(&h, &me).await;
            check(&keyword(&mut client, &me, WORDS[word], None, 200).await);
            check(&keyword(&mut client, &me, &two_words, None, 200).await);
            // Get by id, whole rows and the pipeline's vectors-only read,
            // asked for every id ever written.
            let all: Vec<String> = written.lock().expect("written").keys().cloned().collect();
            for vectors_only in [false, true] {
                let got = client
                    .get(req(
                        pb::GetRequest {
                            ids: all.clone(),
                            include_embedding: true,
                            omit_entities: true,
                            vectors_only,
                            ..Default::default()
                        },
                        &me,
                    ))
                    .await
                    .expect("get")
                    .into_inner();
                for m in got.memories {
                    let (t, l) = written.lock().expect("written")[&m.id];
                    assert_eq!(t, ct, "get returned a foreign tenant's memory");
                    assert!(l <= cl, "get returned level {l} above trust {cl}");
                }
            }
        });
        Ok(())
    });
    result.expect("property holds");
    // The property is not vacuous: the highest-trust caller sees everything
    // of its tenant.
    rt.block_on(async {
        let top = ident(&tenants[0], "r", AccessLevel::Sensitive);
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM memories WHERE tenant_id = $1")
            .bind(&tenants[0])
            .fetch_one(&h.pool)
            .await
            .expect("count");
        let hits = keyword(&mut h.client, &top, "note", None, 200).await;
        assert_eq!(hits.len() as i64, n);
    });
}
