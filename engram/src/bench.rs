//! `engram bench`: end-to-end latency and throughput on a synthetic tenant.
//!
//! The corpus is N memories whose texts are real 2Wiki passages (with a
//! numbered suffix) and whose vectors are real MiniLM embeddings of a base
//! set, perturbed with small noise and renormalised: HNSW sees a realistic
//! distribution without embedding N texts. ~5 typed edges per memory give
//! graph-svc a realistic degree. Queries (2Wiki dev questions) cycle through
//! the simple, multi_hop and exploratory routes, once without and once with
//! the cross-encoder. The floor is a bare pgvector top-10 on the same rows.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::Context;
use engram_proto::search_service_client::SearchServiceClient;
use engram_proto::{
    AddEdgesRequest, Edge, EmbedRequest, GetRequest, Memory, RetrievalMode, RetrieveRequest,
    UpsertRequest,
};
use futures::StreamExt;
use rand::Rng;
use rand::SeedableRng;

use crate::client::Client;
use crate::eval::{load_2wiki, percentile};
use crate::stack::{Service, Stack};

pub struct BenchArgs {
    pub memories: usize,
    pub queries: usize,
    pub concurrency: usize,
    pub base_texts: usize,
}

/// One query's end-to-end milliseconds and per-stage timings.
type Timed = (f64, Vec<(String, f64)>);

fn bench_id(tenant: &str, i: usize) -> String {
    uuid::Uuid::new_v5(
        &uuid::Uuid::NAMESPACE_OID,
        format!("{tenant}:{i}").as_bytes(),
    )
    .to_string()
}

fn pcts(v: &mut [f64]) -> serde_json::Value {
    v.sort_by(|a, b| a.total_cmp(b));
    let r = |x: f64| (x * 100.0).round() / 100.0;
    serde_json::json!({"p50": r(percentile(v, 50.0)), "p95": r(percentile(v, 95.0)), "p99": r(percentile(v, 99.0))})
}

/// Embeds texts through search-svc's internal API (the bench owns the stack).
async fn embed(stack: &Stack, texts: &[String]) -> anyhow::Result<Vec<Vec<f32>>> {
    let addr = stack
        .addr(Service::Search)
        .context("bench needs search-svc")?;
    let token = stack
        .settings
        .auth
        .internal_token_opt
        .clone()
        .unwrap_or_default();
    let mut c = SearchServiceClient::connect(format!("http://{addr}"))
        .await?
        .max_decoding_message_size(64 << 20);
    let id = engram_common::Identity {
        tenant: "bench-embed".into(),
        agent_id: "bench".into(),
        trust: engram_common::AccessLevel::Sensitive,
    };
    let mut out = Vec::with_capacity(texts.len());
    for chunk in texts.chunks(64) {
        let mut req = tonic::Request::new(EmbedRequest {
            texts: chunk.to_vec(),
        });
        id.write_internal(req.metadata_mut(), &token);
        out.extend(
            c.embed(req)
                .await?
                .into_inner()
                .embeddings
                .into_iter()
                .map(|e| e.values),
        );
    }
    Ok(out)
}

pub async fn run(
    stack: &Stack,
    client: &mut Client,
    tenant: &str,
    args: &BenchArgs,
    progress: bool,
) -> anyhow::Result<serde_json::Value> {
    let part = load_2wiki(
        &crate::eval::data_path("hipporag/2wikimultihopqa_corpus.json"),
        &crate::eval::data_path("hipporag/2wiki_dev.jsonl"),
        None,
    )?;
    let base_n = args.base_texts.min(part.docs.len()).max(1);
    let base_texts: Vec<String> = part.docs[..base_n]
        .iter()
        .map(|d| format!("{}\n{}", d.title, d.text))
        .collect();

    // Ingest throughput with real embeddings: a separate small tenant-free batch
    // measured through the gateway (server-side embedding).
    let sample: Vec<Memory> = part.docs[..base_n.min(512)]
        .iter()
        .map(|d| Memory {
            id: uuid::Uuid::new_v4().to_string(),
            title: d.title.clone(),
            content: d.text.clone(),
            ..Default::default()
        })
        .collect();
    let t = Instant::now();
    for chunk in sample.chunks(128) {
        client
            .memories
            .upsert(UpsertRequest {
                memories: chunk.to_vec(),
            })
            .await?;
    }
    let ingest_rate = sample.len() as f64 / t.elapsed().as_secs_f64();
    // Fresh ids each run (so they are really embedded), removed afterwards.
    let ids: Vec<String> = sample.iter().map(|m| m.id.clone()).collect();
    client
        .memories
        .delete(engram_proto::DeleteRequest { ids })
        .await?;

    // The synthetic corpus (reused when already there).
    let have = client
        .memories
        .get(GetRequest {
            ids: vec![bench_id(tenant, args.memories - 1)],
            include_embedding: false,
        })
        .await?
        .into_inner();
    let mut corpus_secs = 0.0;
    if have.memories.is_empty() {
        if progress {
            eprintln!("embedding {base_n} base texts");
        }
        let base_vecs = embed(stack, &base_texts).await?;
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let t = Instant::now();
        let mut i = 0;
        while i < args.memories {
            let end = (i + 1000).min(args.memories);
            let batch: Vec<Memory> = (i..end)
                .map(|j| {
                    let b = j % base_n;
                    let mut v: Vec<f32> = base_vecs[b]
                        .iter()
                        .map(|x| x + rng.random_range(-0.04..0.04))
                        .collect();
                    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-9);
                    v.iter_mut().for_each(|x| *x /= norm);
                    let d = &part.docs[b];
                    Memory {
                        id: bench_id(tenant, j),
                        title: format!("{} #{j}", d.title),
                        content: format!("{} (record {j})", d.text),
                        embedding: v,
                        ..Default::default()
                    }
                })
                .collect();
            client
                .memories
                .upsert(UpsertRequest { memories: batch })
                .await?;
            let edges: Vec<Edge> = (i..end)
                .flat_map(|j| {
                    let mut r = rand::rngs::StdRng::seed_from_u64(j as u64);
                    (0..5).map(move |_| Edge {
                        src_id: bench_id(tenant, j),
                        dst_id: bench_id(tenant, r.random_range(0..=j)),
                        edge_type: "related".into(),
                        weight: 1.0,
                    })
                })
                .filter(|e| e.src_id != e.dst_id)
                .collect();
            client.memories.add_edges(AddEdgesRequest { edges }).await?;
            i = end;
            if progress {
                eprint!("\r  corpus {i}/{}", args.memories);
            }
        }
        corpus_secs = t.elapsed().as_secs_f64();
        if progress {
            eprintln!();
        }
    }

    let questions: Vec<String> = part.questions.iter().map(|q| q.text.clone()).collect();
    let routes = [
        RetrievalMode::Simple,
        RetrievalMode::MultiHop,
        RetrievalMode::Exploratory,
    ];
    let mut e2e = serde_json::Map::new();
    let mut qps = serde_json::Map::new();
    let mut stages: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (label, skip_rerank) in [("no_rerank", true), ("rerank", false)] {
        let t = Instant::now();
        let results: Vec<anyhow::Result<Timed>> = futures::stream::iter(0..args.queries)
            .map(|i| {
                let mut c = client.clone();
                let text = questions[i % questions.len()].clone();
                let mode = routes[i % routes.len()];
                async move {
                    let req = RetrieveRequest {
                        text,
                        limit: Some(10),
                        mode: mode as i32,
                        skip_rerank,
                        no_cache: true,
                        ..Default::default()
                    };
                    let t = Instant::now();
                    let r = c.retrieval.retrieve(req).await?.into_inner();
                    let st = r
                        .stage_latencies
                        .into_iter()
                        .map(|s| (s.stage, s.ms))
                        .collect();
                    anyhow::Ok((t.elapsed().as_secs_f64() * 1000.0, st))
                }
            })
            .buffer_unordered(args.concurrency.max(1))
            .collect()
            .await;
        let wall = t.elapsed().as_secs_f64();
        let mut lat = Vec::new();
        for r in results {
            let (ms, st) = r?;
            lat.push(ms);
            if !skip_rerank {
                continue;
            }
            for (stage, v) in st {
                stages.entry(stage).or_default().push(v);
            }
        }
        qps.insert(
            label.into(),
            serde_json::json!(((lat.len() as f64 / wall) * 10.0).round() / 10.0),
        );
        e2e.insert(label.into(), pcts(&mut lat));
    }

    // Floor: a bare pgvector top-10 on the same rows, same tenant predicate.
    let url = stack
        .database_url_opt()
        .context("bench needs the database")?;
    let pool = engram_common::db::connect(url, 4).await?;
    let qvecs = embed(stack, &questions[..questions.len().min(100)]).await?;
    let mut floor = Vec::new();
    for i in 0..args.queries.min(500) {
        let v = pgvector::Vector::from(qvecs[i % qvecs.len()].clone());
        let t = Instant::now();
        let _rows: Vec<(uuid::Uuid,)> = sqlx::query_as(
            "SELECT id FROM memories WHERE tenant_id = $1 ORDER BY embedding <=> $2 LIMIT 10",
        )
        .bind(tenant)
        .bind(v)
        .fetch_all(&pool)
        .await?;
        floor.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    pool.close().await;
    let floor = pcts(&mut floor);

    let stages_ms: serde_json::Map<String, serde_json::Value> = stages
        .into_iter()
        .map(|(k, mut v)| (k, pcts(&mut v)))
        .collect();
    Ok(serde_json::json!({
        "memories": args.memories,
        "queries": args.queries,
        "concurrency": args.concurrency,
        "e2e_ms": e2e,
        "qps": qps,
        "floor_ms": {"p50": floor["p50"], "p95": floor["p95"]},
        "stages_ms": stages_ms,
        "rss_mb": {"engram": rss_mb()},
        "ingest": {
            "embedded_memories_per_s": (ingest_rate * 10.0).round() / 10.0,
            "corpus_seconds": (corpus_secs * 10.0).round() / 10.0,
        },
    }))
}

/// Peak resident set of this process (all services run in it), from /proc.
pub fn rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map(|kb| (kb / 1024.0 * 10.0).round() / 10.0)
        .unwrap_or(0.0)
}
