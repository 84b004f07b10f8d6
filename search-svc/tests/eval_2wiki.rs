//! 2Wiki dev recall of dense and keyword search (ignored: minutes of work).
//!
//!   cargo test -p search-svc --test eval_2wiki -- --ignored --nocapture
//!
//! Loads /work/shared/data/hipporag/2wikimultihopqa_corpus.json (memory
//! content = text, title = title) into one tenant (reused when already
//! complete) and prints R@2/R@5 (HippoRAG's definition) per strategy, ingest
//! throughput and search latency p50. `ENGRAM_2WIKI_DIR` overrides the folder.

mod common;

use std::collections::HashMap;
use std::time::Instant;

use common::*;
use engram_common::AccessLevel;
use engram_proto as pb;
use uuid::Uuid;

#[derive(serde::Deserialize)]
struct Passage {
    title: String,
    text: String,
}

#[derive(serde::Deserialize)]
struct Question {
    question: String,
    gold_passage_idx: Vec<usize>,
}

fn p50(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes of 2Wiki recall on ../shared/data; `engram eval 2wiki` is the measured path"]
async fn recall_on_2wiki_dev() {
    let dir =
        std::env::var("ENGRAM_2WIKI_DIR").unwrap_or_else(|_| "/work/shared/data/hipporag".into());
    let corpus: Vec<Passage> = serde_json::from_str(
        &std::fs::read_to_string(format!("{dir}/2wikimultihopqa_corpus.json")).expect("corpus"),
    )
    .expect("json");
    let questions: Vec<Question> = std::fs::read_to_string(format!("{dir}/2wiki_dev.jsonl"))
        .expect("questions")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("question"))
        .collect();
    let mut h = start().await;
    // ENGRAM_EVAL_KEYWORD_ONLY=1: placeholder vectors, keyword strategies
    // only (minutes faster: no embedding of the corpus).
    let keyword_only = std::env::var("ENGRAM_EVAL_KEYWORD_ONLY").is_ok_and(|v| v == "1");
    let default_tenant = if keyword_only {
        "eval-2wiki-kw"
    } else {
        "eval-2wiki"
    };
    let t = std::env::var("ENGRAM_EVAL_TENANT").unwrap_or_else(|_| default_tenant.into());
    let me = ident(&t, "eval", AccessLevel::Public);
    let ids: Vec<Uuid> = (0..corpus.len())
        .map(|i| Uuid::new_v5(&Uuid::NAMESPACE_OID, format!("{t}-{i}").as_bytes()))
        .collect();
    // Hits map back to corpus indices by content, so a tenant loaded by an
    // earlier run with other ids is still scored correctly.
    let mut index: HashMap<String, usize> = HashMap::new();
    for (i, p) in corpus.iter().enumerate() {
        index.entry(p.text.clone()).or_insert(i);
    }

    let have: i64 = sqlx::query_scalar("SELECT count(*) FROM memories WHERE tenant_id = $1")
        .bind(&t)
        .fetch_one(&h.pool)
        .await
        .expect("count");
    if have as usize != corpus.len() {
        let started = Instant::now();
        for (chunk_no, chunk) in corpus.chunks(256).enumerate() {
            let memories = chunk
                .iter()
                .enumerate()
                .map(|(j, p)| {
                    let mut m = mem(&ids[chunk_no * 256 + j].to_string(), &p.title, &p.text);
                    if keyword_only {
                        m.embedding = axis(chunk_no * 256 + j);
                    }
                    m
                })
                .collect();
            upsert(&mut h.client, &me, memories).await;
        }
        let secs = started.elapsed().as_secs_f64();
        println!(
            "ingest: {} memories in {secs:.1}s = {:.1} memories/s",
            corpus.len(),
            corpus.len() as f64 / secs
        );
    } else {
        println!("ingest: reused tenant {t}");
    }

    // Query embeddings once, through the Embed RPC.
    let mut qvecs = Vec::new();
    for chunk in questions.chunks(64).filter(|_| !keyword_only) {
        let r = h
            .client
            .embed(req(
                pb::EmbedRequest {
                    texts: chunk.iter().map(|q| q.question.clone()).collect(),
                },
                &me,
            ))
            .await
            .expect("embed")
            .into_inner();
        qvecs.extend(r.embeddings.into_iter().map(|e| e.values));
    }

    let recall = |hits: &[pb::SearchHit], gold: &[usize], k: usize| -> f64 {
        let top: Vec<usize> = hits
            .iter()
            .take(k)
            .filter_map(|h| {
                h.memory
                    .as_ref()
                    .and_then(|m| index.get(&m.content).copied())
            })
            .collect();
        gold.iter().filter(|g| top.contains(g)).count() as f64 / gold.len() as f64
    };
    let mut results: Vec<(String, f64, f64, f64)> = Vec::new();
    let bm25 = start_with(embeddings(), "bm25").await;
    let strategies: &[&str] = if keyword_only {
        &["keyword ts_rank_cd", "keyword bm25"]
    } else {
        &["vector", "keyword ts_rank_cd", "keyword bm25"]
    };
    for &strategy in strategies {
        let (mut r2, mut r5, mut lat) = (0.0, 0.0, Vec::new());
        let mut client = if strategy == "keyword bm25" {
            bm25.client.clone()
        } else {
            h.client.clone()
        };
        for (i, q) in questions.iter().enumerate() {
            let started = Instant::now();
            let hits = if strategy == "vector" {
                dense(&mut client, &me, qvecs[i].clone(), None, 5).await
            } else {
                keyword(&mut client, &me, &q.question, None, 5).await
            };
            lat.push(started.elapsed().as_secs_f64() * 1000.0);
            r2 += recall(&hits, &q.gold_passage_idx, 2);
            r5 += recall(&hits, &q.gold_passage_idx, 5);
        }
        let n = questions.len() as f64;
        results.push((strategy.into(), 100.0 * r2 / n, 100.0 * r5 / n, p50(lat)));
    }
    for (s, r2, r5, l) in &results {
        println!(
            "{s:>20}: R@2 {r2:.1}  R@5 {r5:.1}  p50 {l:.1} ms  (n={})",
            questions.len()
        );
    }
}
