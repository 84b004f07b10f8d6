//! `engram bench`: end-to-end latency and throughput on a synthetic tenant.
//!
//! The corpus is N memories whose texts are the dev corpora, once as written
//! and then with names and numbers varied (`--corpus mixed`, crate::mixed),
//! or ~2,000 2Wiki passages repeated with a numbered suffix (`--corpus
//! repeated`, the older numbers), and whose vectors are real MiniLM
//! embeddings of the base texts, perturbed with small noise and
//! renormalised: HNSW sees a realistic distribution without embedding N
//! texts. ~5 typed edges per memory give
//! graph-svc a realistic degree. Queries (2Wiki dev questions) cycle through
//! the simple, multi_hop and exploratory routes, once without and once with
//! the cross-encoder. The floor is a bare pgvector top-10 on the same rows.
//!
//! The corpus goes through the public write path (MemoryService.Upsert in
//! batches of 1,000 with client vectors, AddEdges), a few batches at a time,
//! and ends with a marker memory so a later run with the same parameters
//! reuses it. Besides the contract keys the report has direct per-service
//! numbers (search-svc dense / keyword, graph-svc PPR, rerank-svc Score)
//! measured one call at a time over the internal API, and ingest throughput
//! with server-side embeddings.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::Context;
use engram_proto::graph_service_client::GraphServiceClient;
use engram_proto::rerank_service_client::RerankServiceClient;
use engram_proto::search_service_client::SearchServiceClient;
use engram_proto::{
    Edge, EmbedRequest, GetRequest, KeywordSearchRequest, Memory, PprRequest, RetrievalMode,
    RetrieveRequest, ScoreRequest, Seed, UpsertRequest, VectorSearchRequest,
};
use engram_stack::client::{Client, INGEST_BATCH, INGEST_IN_FLIGHT};
use engram_stack::stack::{Service, Stack};
use futures::StreamExt;
use rand::Rng;
use rand::SeedableRng;

use crate::eval::{load_2wiki, percentile};
use crate::split::{SplitStack, vm_hwm_mb};

pub struct BenchArgs {
    pub memories: usize,
    pub queries: usize,
    pub concurrency: usize,
    pub base_texts: usize,
    /// Upsert / AddEdges batches in flight while building the corpus.
    pub write_concurrency: usize,
    /// Passages ingested with server-side embeddings for the ingest rate.
    pub ingest_sample: usize,
    pub corpus: CorpusKind,
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

/// What the bench measures: the services in this process ([`Stack`]) or one
/// process per service ([`SplitStack`], the default: per-service peak RSS).
pub enum Target {
    InProcess(Stack),
    Split(SplitStack),
}

impl Target {
    fn settings(&self) -> &engram_common::Settings {
        match self {
            Target::InProcess(s) => &s.settings,
            Target::Split(s) => &s.settings,
        }
    }

    fn addr(&self, svc: Service) -> Option<std::net::SocketAddr> {
        let addrs = match self {
            Target::InProcess(s) => &s.addrs,
            Target::Split(s) => &s.addrs,
        };
        addrs.iter().find(|(s, _)| *s == svc).map(|(_, a)| *a)
    }

    pub fn gateway_uri(&self) -> Option<String> {
        self.addr(Service::Retrieval).map(|a| format!("http://{a}"))
    }

    fn database_url_opt(&self) -> Option<&str> {
        match self {
            Target::InProcess(s) => s.database_url_opt(),
            Target::Split(s) => Some(s.database_url()),
        }
    }

    /// Where the embedded cluster's postmaster.pid would be.
    fn pg_data_dir(&self) -> std::path::PathBuf {
        let s = self.settings();
        s.home_path(&s.database.embedded_data_dir)
    }

    /// CPU seconds so far of each process that serves a query: every
    /// service (one figure in one process), Postgres, and the bench itself.
    fn cpu_seconds(&self) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        match self {
            Target::InProcess(_) => {
                out.insert(
                    "engram (all services and the bench)".into(),
                    crate::profile::process_cpu_seconds("self"),
                );
            }
            Target::Split(s) => {
                for (svc, pid) in s.pids() {
                    out.insert(
                        svc.name().to_string(),
                        crate::profile::process_cpu_seconds(&pid.to_string()),
                    );
                }
                out.insert(
                    "bench client".into(),
                    crate::profile::process_cpu_seconds("self"),
                );
            }
        }
        out.insert(
            "postgres".into(),
            crate::profile::postgres_cpu_seconds(Some(&self.pg_data_dir())),
        );
        out
    }

    /// Peak RSS per service; in one process every service shares one figure.
    fn rss_mb(&self) -> serde_json::Value {
        match self {
            Target::InProcess(_) => serde_json::json!({"engram": rss_mb()}),
            Target::Split(s) => serde_json::Value::Object(
                s.peak_rss_mb()
                    .into_iter()
                    .map(|(svc, mb)| (svc.name().to_string(), serde_json::json!(mb)))
                    .collect(),
            ),
        }
    }

    pub async fn shutdown(self) {
        match self {
            Target::InProcess(s) => s.shutdown().await,
            Target::Split(s) => s.shutdown().await,
        }
    }
}

/// The internal identity and token the bench uses to call services directly.
fn internal<T>(stack: &Target, tenant: &str, msg: T) -> tonic::Request<T> {
    let token = stack
        .settings()
        .auth
        .internal_token_opt
        .clone()
        .unwrap_or_default();
    let id = engram_common::Identity {
        tenant: tenant.into(),
        agent_id: "bench".into(),
        trust: engram_common::AccessLevel::Sensitive,
    };
    let mut req = tonic::Request::new(msg);
    id.write_internal(req.metadata_mut(), &token);
    req
}

fn uri(stack: &Target, svc: Service) -> anyhow::Result<String> {
    let addr = stack
        .addr(svc)
        .with_context(|| format!("bench needs {}", svc.name()))?;
    Ok(format!("http://{addr}"))
}

/// Embeds texts through search-svc's internal API (the bench owns the stack).
async fn embed(stack: &Target, texts: &[String]) -> anyhow::Result<Vec<Vec<f32>>> {
    let mut c = SearchServiceClient::connect(uri(stack, Service::Search)?)
        .await?
        .max_decoding_message_size(64 << 20);
    let mut out = Vec::with_capacity(texts.len());
    for chunk in texts.chunks(32) {
        let req = internal(
            stack,
            "bench-embed",
            EmbedRequest {
                texts: chunk.to_vec(),
            },
        );
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

/// Calls `ready` every 50 ms until it says yes: the milliseconds that
/// took, or None when it still had not after a minute.
async fn wait_until<F, Fut>(mut ready: F) -> anyhow::Result<Option<f64>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let t = Instant::now();
    while t.elapsed() < std::time::Duration::from_secs(60) {
        if ready().await? {
            return Ok(Some(t.elapsed().as_secs_f64() * 1000.0));
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    Ok(None)
}

/// Polls PPR until graph-svc answers from a current graph (not `stale`).
async fn wait_graph_fresh(
    graph: &GraphServiceClient<tonic::transport::Channel>,
    req: impl Fn() -> tonic::Request<PprRequest>,
) -> anyhow::Result<Option<f64>> {
    wait_until(|| async {
        let resp = graph.clone().personalized_page_rank(req()).await?;
        Ok(!resp.into_inner().stale)
    })
    .await
}

/// Keyword-searches until the tenant's in-memory keyword index answers
/// (search-svc keyword_index.rs: the first call schedules its build and SQL
/// answers meanwhile), so the timed calls measure the index, as the graph's
/// first call is reported apart from PPR's. The ms from the first call, or
/// None when the index is off or not current within a minute (then the
/// timed calls measure SQL).
async fn wait_keyword_index(
    stack: &Target,
    search: &SearchServiceClient<tonic::transport::Channel>,
    tenant: &str,
    questions: &[String],
) -> anyhow::Result<Option<f64>> {
    if !stack.settings().search.keyword_index {
        return Ok(None);
    }
    let text = questions.first().cloned().unwrap_or_default();
    wait_until(|| async {
        let req = internal(
            stack,
            tenant,
            KeywordSearchRequest {
                text: text.clone(),
                k: 50,
                ..Default::default()
            },
        );
        let resp = search.clone().keyword_search(req).await?;
        Ok(resp.into_inner().from_keyword_index)
    })
    .await
}

/// How much of the exact nearest-neighbour list the HNSW index finds at
/// this scale, for the bench's real questions: the dev evals run on
/// tenants of at most ~12K memories, where HNSW is near exact, so only
/// here does an ANN miss show. Per question, the index's top 30 (the
/// pipeline's candidates per strategy) against the exact top 30 (a
/// sequential scan: index scans off for the statement's transaction):
/// the share of the exact 30 found, and of the exact 5.
async fn ann_recall(
    pool: &sqlx::PgPool,
    tenant: &str,
    qvecs: &[Vec<f32>],
    ef_search: u32,
) -> anyhow::Result<serde_json::Value> {
    const K: i64 = 30;
    // The index's order (half precision, `dense::HALF`) against the exact
    // full-precision one: what the pipeline's candidates lose to both.
    let (indexed, exact_order) = (
        nearest_ids_sql(search_svc::dense::HALF, "$3"),
        nearest_ids_sql("", "$3"),
    );
    let (indexed_sql, exact_sql) = (indexed.as_str(), exact_order.as_str());
    let n = qvecs.len().min(100);
    let (mut all, mut top5) = (0.0f64, 0.0f64);
    for q in &qvecs[..n] {
        let top = |exact: bool| async move {
            let mut tx = pool.begin().await?;
            if exact {
                sqlx::query("SET LOCAL enable_indexscan = off")
                    .execute(&mut *tx)
                    .await?;
            }
            // Unprepared: a cached plan would not see enable_indexscan change.
            let sql = if exact { exact_sql } else { indexed_sql };
            let ids: Vec<uuid::Uuid> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .persistent(false)
                .bind(tenant)
                .bind(pgvector::Vector::from(q.clone()))
                .bind(K)
                .fetch_all(&mut *tx)
                .await?;
            tx.commit().await?;
            anyhow::Ok(ids)
        };
        let (exact, found) = (top(true).await?, top(false).await?);
        let hit = |ids: &[uuid::Uuid]| ids.iter().filter(|id| found.contains(id)).count() as f64;
        all += hit(&exact) / exact.len().max(1) as f64;
        top5 += hit(&exact[..exact.len().min(5)]) / exact.len().clamp(1, 5) as f64;
    }
    let share = |x: f64| round1(100.0 * x / n.max(1) as f64);
    Ok(serde_json::json!({
        "k": K,
        "ef_search": ef_search,
        "questions": n,
        "exact_top30_found_pct": share(all),
        "exact_top5_in_top30_pct": share(top5),
    }))
}

/// The ids of a tenant's nearest memories to `$2`, ordered through
/// `cast` (`dense::HALF` walks the index; "" sorts the stored vectors).
fn nearest_ids_sql(cast: &str, limit: &str) -> String {
    format!(
        "SELECT id FROM memories WHERE tenant_id = $1 \
         ORDER BY embedding{cast} <=> $2{cast} LIMIT {limit}"
    )
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// p50/p95 (and p99) of `n` sequential calls of `f`.
async fn time_calls<F, Fut>(n: usize, mut f: F) -> anyhow::Result<serde_json::Value>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        f(i).await?;
        v.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(pcts(&mut v))
}

const EDGE_TYPES: [&str; 5] = ["related", "related", "related", "causes", "part_of"];

/// Where the bench tenant's texts come from (`--corpus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CorpusKind {
    /// ~2,000 2Wiki passages repeated with a record number (the corpus of
    /// every bench before 25 November 2026).
    Repeated,
    /// Every dev corpus once, then copies with names and numbers replaced
    /// (crate::mixed).
    Mixed,
}

/// The texts of one corpus kind.
enum CorpusTexts<'a> {
    Repeated(&'a crate::eval::Part),
    Mixed(crate::mixed::MixedBase),
}

impl CorpusTexts<'_> {
    /// The base texts whose embeddings every memory's vector derives from.
    fn base(&self, want: usize) -> Vec<String> {
        match self {
            Self::Repeated(part) => part.docs[..want.min(part.docs.len()).max(1)]
                .iter()
                .map(|d| format!("{}\n{}", d.title, d.text))
                .collect(),
            Self::Mixed(base) => base
                .docs
                .iter()
                .take(want.max(1))
                .map(|(t, x)| format!("{t}\n{x}"))
                .collect(),
        }
    }

    /// Memory `j`'s title and content (its vector is base `j mod base_n`'s).
    fn memory(&self, j: usize, base_n: usize) -> (String, String) {
        match self {
            Self::Repeated(part) => {
                let d = &part.docs[j % base_n];
                (
                    format!("{} #{j}", d.title),
                    format!("{} (record {j})", d.text),
                )
            }
            Self::Mixed(base) => base.text(j),
        }
    }
}

fn corpus_memory(tenant: &str, j: usize, base_vecs: &[Vec<f32>], texts: &CorpusTexts) -> Memory {
    let base_n = base_vecs.len();
    let b = j % base_n;
    let mut rng = rand::rngs::StdRng::seed_from_u64(j as u64 ^ 0x5eed);
    let mut v: Vec<f32> = base_vecs[b]
        .iter()
        .map(|x| x + rng.random_range(-0.04..0.04))
        .collect();
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-9);
    v.iter_mut().for_each(|x| *x /= norm);
    let (title, content) = texts.memory(j, base_n);
    Memory {
        id: bench_id(tenant, j),
        title,
        content,
        embedding: v,
        ..Default::default()
    }
}

/// Builds the synthetic tenant through the public write path; returns
/// (upsert seconds, edge seconds, edges added).
async fn build_corpus(
    stack: &Target,
    client: &Client,
    tenant: &str,
    args: &BenchArgs,
    texts: &CorpusTexts<'_>,
    base_texts: &[String],
    progress: bool,
) -> anyhow::Result<(f64, f64, u64)> {
    if progress {
        eprintln!("embedding {} base texts", base_texts.len());
    }
    let base_vecs = embed(stack, base_texts).await?;
    let starts: Vec<usize> = (0..args.memories).step_by(1000).collect();
    let t = Instant::now();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(starts.clone())
        .map(|i| {
            let mut c = client.clone();
            let base_vecs = &base_vecs;
            let done = &done;
            async move {
                let end = (i + 1000).min(args.memories);
                let batch: Vec<Memory> = (i..end)
                    .map(|j| corpus_memory(tenant, j, base_vecs, texts))
                    .collect();
                c.memories.upsert(UpsertRequest { memories: batch }).await?;
                let n = done.fetch_add(end - i, std::sync::atomic::Ordering::Relaxed) + end - i;
                if progress {
                    eprint!("\r  memories {n}/{}", args.memories);
                }
                anyhow::Ok(())
            }
        })
        .buffer_unordered(args.write_concurrency.max(1))
        .collect()
        .await;
    results.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    let upsert_secs = t.elapsed().as_secs_f64();
    if progress {
        eprintln!();
    }

    let t = Instant::now();
    let added = std::sync::atomic::AtomicU64::new(0);
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(starts)
        .map(|i| {
            let mut c = client.clone();
            let added = &added;
            async move {
                let end = (i + 1000).min(args.memories);
                // 1,000 memories x 5 edges = 5,000 edges in 5 calls of 1,000.
                let edges: Vec<Edge> = (i..end)
                    .flat_map(|j| {
                        let mut r = rand::rngs::StdRng::seed_from_u64(j as u64);
                        (0..5).map(move |e| Edge {
                            src_id: bench_id(tenant, j),
                            dst_id: bench_id(tenant, r.random_range(0..args.memories)),
                            edge_type: EDGE_TYPES[e].into(),
                            weight: 1.0,
                        })
                    })
                    .filter(|e| e.src_id != e.dst_id)
                    .collect();
                let n = c.add_edges(&edges).await?;
                added.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                if progress {
                    eprint!("\r  edges for {end}/{}", args.memories);
                }
                anyhow::Ok(())
            }
        })
        .buffer_unordered(args.write_concurrency.max(1))
        .collect()
        .await;
    results.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    let edge_secs = t.elapsed().as_secs_f64();
    if progress {
        eprintln!();
    }
    // The marker says "complete": a later run with the same N reuses it.
    let mut c = client.clone();
    c.memories
        .upsert(UpsertRequest {
            memories: vec![Memory {
                id: bench_id(tenant, args.memories),
                title: "bench marker".into(),
                content: format!("bench corpus of {} memories complete", args.memories),
                embedding: base_vecs[0].clone(),
                ..Default::default()
            }],
        })
        .await?;
    Ok((
        upsert_secs,
        edge_secs,
        added.load(std::sync::atomic::Ordering::Relaxed),
    ))
}

/// Ingest with server-side embeddings, straight into search-svc (the write
/// path the gateway forwards to) in a tenant of its own, so graph-svc does
/// not reload the big bench tenant on every batch. Fresh ids (so they are
/// really embedded), removed afterwards. Reported with its breakdown: the
/// embedding alone (`Embed`, the same texts and batches) and the write
/// alone (the same memories with their vectors supplied), and with two
/// batches in flight, as a loader that keeps the pipe full sees it.
async fn ingest_rates(
    stack: &Target,
    part: &crate::eval::Part,
    n: usize,
) -> anyhow::Result<serde_json::Value> {
    let sample: Vec<Memory> = part.docs[..n.min(part.docs.len())]
        .iter()
        .map(|d| Memory {
            id: uuid::Uuid::new_v4().to_string(),
            title: d.title.clone(),
            content: d.text.clone(),
            ..Default::default()
        })
        .collect();
    let texts: Vec<String> = sample
        .iter()
        .map(|m| search_svc::validate::embedding_text(&m.title, &m.content))
        .collect();
    let t = Instant::now();
    let vectors = embed(stack, &texts).await?;
    let embed_only = texts.len() as f64 / t.elapsed().as_secs_f64().max(1e-9);
    let supplied: Vec<Memory> = (sample.iter().zip(vectors))
        .map(|(m, v)| Memory {
            id: uuid::Uuid::new_v4().to_string(),
            embedding: v,
            ..m.clone()
        })
        .collect();
    let fresh = |memories: &[Memory]| -> Vec<Memory> {
        (memories.iter())
            .map(|m| Memory {
                id: uuid::Uuid::new_v4().to_string(),
                ..m.clone()
            })
            .collect()
    };
    Ok(serde_json::json!({
        "embedded_memories_per_s": round1(write_rate(stack, sample.clone(), 32, 1).await?),
        "embedded_memories_per_s_2_in_flight": round1(write_rate(stack, fresh(&sample), 32, 2).await?),
        // As `engram ingest` writes a file.
        "embedded_memories_per_s_as_engram_ingest": round1(write_rate(stack, fresh(&sample), INGEST_BATCH, INGEST_IN_FLIGHT).await?),
        "embed_only_per_s": round1(embed_only),
        "write_only_per_s": round1(write_rate(stack, supplied, 32, 1).await?),
        "passages": sample.len(),
    }))
}

/// The same for short facts (`semantic`, one second apart), the memories
/// write-time update detection judges (search.update_detection): the
/// texts of the labelled update pairs, dev and held-out.
async fn fact_ingest_rate(stack: &Target) -> anyhow::Result<(f64, usize)> {
    let start = chrono::Utc::now() - chrono::Duration::days(30);
    let sample: Vec<Memory> = (crate::updates_eval::fact_texts()?.into_iter().enumerate())
        .map(|(i, text)| Memory {
            id: uuid::Uuid::new_v4().to_string(),
            content: text,
            memory_type: "semantic".into(),
            event_time: Some(engram_common::convert::chrono_to_ts(
                start + chrono::Duration::seconds(i as i64),
            )),
            ..Default::default()
        })
        .collect();
    let n = sample.len();
    Ok((write_rate(stack, sample, 32, 1).await?, n))
}

/// Memories per second writing `sample` in batches of `batch`, `in_flight`
/// batches at a time.
async fn write_rate(
    stack: &Target,
    sample: Vec<Memory>,
    batch: usize,
    in_flight: usize,
) -> anyhow::Result<f64> {
    let tenant = "bench-ingest";
    let mut c = SearchServiceClient::connect(uri(stack, Service::Search)?)
        .await?
        .max_encoding_message_size(64 << 20);
    let t = Instant::now();
    let calls = sample.chunks(batch.max(1)).map(|chunk| {
        let mut c = c.clone();
        let req = internal(
            stack,
            tenant,
            UpsertRequest {
                memories: chunk.to_vec(),
            },
        );
        async move { c.upsert(req).await }
    });
    let mut answers = futures::stream::iter(calls).buffer_unordered(in_flight.max(1));
    while let Some(answer) = answers.next().await {
        answer?;
    }
    drop(answers);
    let rate = sample.len() as f64 / t.elapsed().as_secs_f64().max(1e-9);
    let ids: Vec<String> = sample.iter().map(|m| m.id.clone()).collect();
    for chunk in ids.chunks(1000) {
        c.delete(internal(
            stack,
            tenant,
            engram_proto::DeleteRequest {
                ids: chunk.to_vec(),
            },
        ))
        .await?;
    }
    Ok(rate)
}

/// The synthetic corpus of `args.memories` memories in `tenant`, built
/// unless its completion marker is there; what building it took.
pub(crate) async fn ensure_corpus(
    stack: &Target,
    client: &mut Client,
    tenant: &str,
    args: &BenchArgs,
    part: &crate::eval::Part,
    progress: bool,
) -> anyhow::Result<serde_json::Value> {
    // The synthetic corpus (reused when its completion marker is there).
    let have = client
        .memories
        .get(GetRequest {
            ids: vec![bench_id(tenant, args.memories)],
            include_embedding: false,
            omit_entities: false,
            vectors_only: false,
            ..Default::default()
        })
        .await?
        .into_inner();
    let kind = format!("{:?}", args.corpus).to_lowercase();
    let mut corpus = serde_json::json!({"reused": true, "kind": kind});
    if have.memories.is_empty() {
        // Only a build reads the corpora (the mixed one all four) and
        // formats the base texts.
        let texts = match args.corpus {
            CorpusKind::Repeated => CorpusTexts::Repeated(part),
            CorpusKind::Mixed => CorpusTexts::Mixed(crate::mixed::MixedBase::load()?),
        };
        // A mixed corpus smaller than its base embeds only the texts it uses.
        let base_texts = texts.base(match args.corpus {
            CorpusKind::Repeated => args.base_texts,
            CorpusKind::Mixed => args.memories,
        });
        let (upsert_secs, edge_secs, edges) =
            build_corpus(stack, client, tenant, args, &texts, &base_texts, progress).await?;
        analyze(stack).await?;
        corpus = serde_json::json!({
            "reused": false,
            "kind": kind,
            "base_texts": base_texts.len(),
            "upsert_seconds": round1(upsert_secs),
            "upsert_memories_per_s": round1(args.memories as f64 / upsert_secs.max(1e-9)),
            "edges": edges,
            "edge_seconds": round1(edge_secs),
            "write_concurrency": args.write_concurrency,
        });
    }
    Ok(corpus)
}

/// Refreshes the planner's statistics after the corpus load. Autovacuum
/// would within a minute or so; measured straight after a 20K load, plans
/// made for the tenant before it held anything took dense k50 from 18 to
/// 150 ms and keyword from 19 to 178 ms (p50).
async fn analyze(stack: &Target) -> anyhow::Result<()> {
    let pool = maintenance_pool(stack).await?;
    sqlx::query("ANALYZE").execute(&pool).await?;
    pool.close().await;
    Ok(())
}

/// One connection to the bench's database for maintenance statements.
async fn maintenance_pool(stack: &Target) -> anyhow::Result<sqlx::PgPool> {
    let url = stack
        .database_url_opt()
        .context("bench needs the database")?;
    Ok(engram_common::db::connect_with(url, 1, stack.settings().search.hnsw_ef_search).await?)
}

/// Tables with at least this many dead rows are vacuumed before measuring:
/// a run's own ingest figures leave ~5,400 in `memories`, and a few hundred
/// dead rows in a small table cost nothing worth 25 s of vacuum.
const SETTLE_DEAD_ROWS: i64 = 1000;

/// Vacuums the tables earlier runs left dead rows in, before anything is
/// measured; which ones and how long it took. Why: every run's ingest
/// figures write and delete memories beside the reused corpus, and once
/// the dead rows passed autovacuum's threshold (a fifth of the table) an
/// autovacuum of the HNSW index ran through whole runs at a third of a core
/// (cost-throttled, it outlived each run and started again in the next):
/// it took the full bench's ingest from 250 to 160-200 / s and was in the
/// query figures too. Run in the foreground it takes 23-30 s at 100K.
/// Best effort: a failure (a `DATABASE_URL` role without the rights, a
/// lock held elsewhere) is reported in the JSON, not fatal to the bench.
async fn settle(stack: &Target) -> serde_json::Value {
    let t = Instant::now();
    let mut tables = Vec::new();
    let failed_opt = vacuum_dead(stack, &mut tables).await.err();
    if let Some(e) = &failed_opt {
        tracing::warn!(error = %e, "bench could not vacuum before measuring");
    }
    serde_json::json!({
        "tables": tables,
        "seconds": round1(t.elapsed().as_secs_f64()),
        "failed": failed_opt.map(|e| format!("{e:#}")),
    })
}

/// Vacuums (and analyzes) the tables of engram's schema this role owns
/// with at least [`SETTLE_DEAD_ROWS`] dead rows, pushing each name to
/// `done` once vacuumed.
async fn vacuum_dead(stack: &Target, done: &mut Vec<String>) -> anyhow::Result<()> {
    let pool = maintenance_pool(stack).await?;
    // Only engram's schema (a shared database holds others' tables), only
    // tables this role owns (VACUUM skips the rest with a warning), and
    // names quoted by Postgres itself.
    let tables: Vec<(String,)> = sqlx::query_as(
        "SELECT format('%I.%I', s.schemaname, s.relname) \
         FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid \
         WHERE s.schemaname = current_schema() AND s.n_dead_tup >= $1 \
           AND pg_has_role(c.relowner, 'USAGE') \
         ORDER BY s.relname",
    )
    .bind(SETTLE_DEAD_ROWS)
    .fetch_all(&pool)
    .await?;
    // A role's statement_timeout would cut a 30 s VACUUM short. VACUUM
    // runs outside a transaction and takes no parameters: the simple
    // protocol.
    sqlx::raw_sql("SET statement_timeout = 0")
        .execute(&pool)
        .await?;
    for (table,) in tables {
        let sql = format!("VACUUM (ANALYZE) {table}");
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&pool)
            .await?;
        done.push(table);
    }
    pool.close().await;
    Ok(())
}

/// Queries one at a time until five in a row come back whole: the tenant's
/// graph has loaded (a first load of 100K memories takes seconds and would
/// otherwise be most of a profile) and connections and plans are warm.
/// Gives up after two minutes.
async fn warm_up(client: &Client, questions: &[String]) -> anyhow::Result<()> {
    let until = Instant::now() + std::time::Duration::from_secs(120);
    let mut whole = 0;
    for text in questions.iter().cycle() {
        if whole >= 5 || Instant::now() > until {
            break;
        }
        let req = RetrieveRequest {
            text: text.clone(),
            skip_rerank: true,
            no_cache: true,
            ..Default::default()
        };
        let answer = client.clone().retrieval.retrieve(req).await?.into_inner();
        whole = match answer.degraded_stages.is_empty() {
            true => whole + 1,
            false => {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                0
            }
        };
    }
    anyhow::ensure!(
        whole >= 5,
        "the stack still degrades answers after two minutes of warm-up"
    );
    Ok(())
}

/// The 2Wiki dev corpus and questions every bench pass draws from.
fn bench_part() -> anyhow::Result<crate::eval::Part> {
    load_2wiki(
        &crate::eval::data_path("hipporag/2wikimultihopqa_corpus.json"),
        &crate::eval::data_path("hipporag/2wiki_dev.jsonl"),
        None,
    )
}

/// `engram bench --in-process --profile FILE`: the corpus, a warm-up
/// (the graph loads, caches of plans fill), then the no-rerank query mix
/// under the CPU profiler (crate::profile).
pub async fn profile(
    stack: &Target,
    client: &mut Client,
    tenant: &str,
    args: &BenchArgs,
    out: &std::path::Path,
    progress: bool,
) -> anyhow::Result<serde_json::Value> {
    let part = bench_part()?;
    let corpus = ensure_corpus(stack, client, tenant, args, &part, progress).await?;
    let vacuumed = settle(stack).await;
    let questions: Vec<String> = part.questions.iter().map(|q| q.text.clone()).collect();
    if progress {
        eprintln!(
            "corpus ready ({vacuumed}); warming up, then profiling {} queries",
            args.queries
        );
    }
    warm_up(client, &questions).await?;
    let search = SearchServiceClient::connect(uri(stack, Service::Search)?).await?;
    let keyword_index_first_ms = wait_keyword_index(stack, &search, tenant, &questions).await?;
    let mut report = crate::profile::profile_queries(
        client,
        &questions,
        args.queries,
        args.concurrency,
        out,
        Some(&stack.pg_data_dir()),
    )
    .await?;
    report["memories"] = serde_json::json!(args.memories);
    report["corpus"] = corpus;
    report["vacuumed_before"] = vacuumed;
    report["keyword_index_first_answer_ms"] = serde_json::json!(keyword_index_first_ms.map(round1));
    Ok(report)
}

/// `engram bench --ingest-only`: the ingest figures of [`run`] alone.
pub async fn ingest_only(stack: &Target, passages: usize) -> anyhow::Result<serde_json::Value> {
    let part = bench_part()?;
    let vacuumed = settle(stack).await;
    let (facts_per_s, facts) = fact_ingest_rate(stack).await?;
    Ok(serde_json::json!({
        "vacuumed_before": vacuumed,
        "ingest": {
            "passages": ingest_rates(stack, &part, passages).await?,
            "facts_per_s": round1(facts_per_s),
            "facts": facts,
            "update_detection": stack.settings().search.update_detection,
        },
        "rss_mb": stack.rss_mb(),
    }))
}

pub async fn run(
    stack: &Target,
    client: &mut Client,
    tenant: &str,
    args: &BenchArgs,
    progress: bool,
) -> anyhow::Result<serde_json::Value> {
    let part = bench_part()?;
    let corpus = ensure_corpus(stack, client, tenant, args, &part, progress).await?;
    let vacuumed = settle(stack).await;
    if progress {
        eprintln!("corpus ready ({vacuumed}); measuring");
    }

    let questions: Vec<String> = part.questions.iter().map(|q| q.text.clone()).collect();
    let nq_direct = args.queries.clamp(1, 300);
    let qvecs = embed(stack, &questions[..questions.len().min(nq_direct)]).await?;

    // Direct: search-svc dense and keyword, one call at a time.
    let search = SearchServiceClient::connect(uri(stack, Service::Search)?)
        .await?
        .max_decoding_message_size(64 << 20);
    let dense_ms = time_calls(nq_direct, |i| {
        let mut c = search.clone();
        let req = internal(
            stack,
            tenant,
            VectorSearchRequest {
                embedding: qvecs[i % qvecs.len()].clone(),
                k: 50,
                ..Default::default()
            },
        );
        async move {
            c.vector_search(req).await?;
            anyhow::Ok(())
        }
    })
    .await?;
    let keyword_index_first_ms = wait_keyword_index(stack, &search, tenant, &questions).await?;
    let keyword_ms = time_calls(nq_direct, |i| {
        let mut c = search.clone();
        let req = internal(
            stack,
            tenant,
            KeywordSearchRequest {
                text: questions[i % questions.len()].clone(),
                k: 50,
                ..Default::default()
            },
        );
        async move {
            c.keyword_search(req).await?;
            anyhow::Ok(())
        }
    })
    .await?;

    // Direct: graph-svc PPR (the first call may build the tenant's graph).
    let graph = GraphServiceClient::connect(uri(stack, Service::Graph)?)
        .await?
        .max_decoding_message_size(64 << 20);
    let ppr_req = |i: usize| {
        internal(
            stack,
            tenant,
            PprRequest {
                query_text: questions[i % questions.len()].clone(),
                seeds: (0..3)
                    .map(|s| Seed {
                        memory_id: bench_id(tenant, (i * 7919 + s * 104_729) % args.memories),
                        weight: 1.0,
                    })
                    .collect(),
                ..Default::default()
            },
        )
    };
    // A first load longer than `graph.load_wait_ms` answers "loading"
    // (ResourceExhausted) and goes on in the background: ask until served.
    let t = Instant::now();
    loop {
        match graph.clone().personalized_page_rank(ppr_req(0)).await {
            Ok(_) => break,
            Err(s) if s.code() == tonic::Code::ResourceExhausted && t.elapsed().as_secs() < 600 => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(s) => return Err(s.into()),
        }
    }
    let graph_first_ms = t.elapsed().as_secs_f64() * 1000.0;
    let ppr_ms = time_calls(nq_direct, |i| {
        let mut c = graph.clone();
        let req = ppr_req(i);
        async move {
            c.personalized_page_rank(req).await?;
            anyhow::Ok(())
        }
    })
    .await?;
    let as_tenant = |req: PprRequest| internal(stack, tenant, req);
    let write_to_visible =
        crate::visible::graph_write_to_visible(uri(stack, Service::Graph)?, client, &as_tenant)
            .await?;
    // That write left the tenant's keyword index behind: its rebuild is the
    // keyword side of write-to-visible (SQL answers meanwhile), and the
    // passes below measure the index.
    let keyword_index_rebuild_ms = wait_keyword_index(stack, &search, tenant, &questions).await?;
    // Its last delete also left graph-svc rebuilding: wait until the walk
    // is on a current graph, so that rebuild's CPU and stale answers (which
    // Stage 5 cannot trust to hold no contradiction) stay out of the passes.
    let graph_fresh_ms = wait_graph_fresh(&graph, || ppr_req(0)).await?;

    // Direct: rerank-svc Score on 20 and 50 passages of ~128 tokens.
    let mut rerank_ms = serde_json::Map::new();
    if let Ok(addr) = uri(stack, Service::Rerank) {
        let rerank = RerankServiceClient::connect(addr).await?;
        let passage = |i: usize| {
            let d = &part.docs[i % part.docs.len()];
            let mut p = format!("{}\n{}", d.title, d.text);
            // ~128 tokens: pad short passages with the next one's text.
            let next = &part.docs[(i + 1) % part.docs.len()];
            if p.split_whitespace().count() < 90 {
                p.push(' ');
                p.push_str(&next.text);
            }
            p.split_whitespace().take(95).collect::<Vec<_>>().join(" ")
        };
        for n in [20usize, 50] {
            let calls = if n == 20 { 20 } else { 10 };
            let r = time_calls(calls, |i| {
                let mut c = rerank.clone();
                let req = internal(
                    stack,
                    tenant,
                    ScoreRequest {
                        query: questions[i % questions.len()].clone(),
                        candidates: (0..n).map(|j| passage(i * 50 + j)).collect(),
                        max_length: 0,
                    },
                );
                async move {
                    c.score(req).await?;
                    anyhow::Ok(())
                }
            })
            .await;
            match r {
                Ok(v) => {
                    rerank_ms.insert(format!("{n}_candidates"), v);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "rerank score bench failed");
                    break;
                }
            }
        }
    }

    let routes = [
        RetrievalMode::Simple,
        RetrievalMode::MultiHop,
        RetrievalMode::Exploratory,
    ];
    let mut e2e = serde_json::Map::new();
    let mut qps = serde_json::Map::new();
    let mut stages: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut degraded: BTreeMap<String, usize> = BTreeMap::new();
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    // The contract's passes run at the requested concurrency; the sequential
    // ones (one query in flight) show latency without queueing, which on
    // two cores is most of the concurrent numbers.
    let mut seq = serde_json::Map::new();
    let mut seq_stages: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut cpu_per_query = serde_json::Map::new();
    let n_seq = args.queries.min(300);
    for (label, skip_rerank, sequential) in [
        ("no_rerank", true, false),
        ("rerank", false, false),
        ("no_rerank", true, true),
        ("rerank", false, true),
    ] {
        let (n, conc) = if sequential {
            (n_seq, 1)
        } else {
            (args.queries, args.concurrency.max(1))
        };
        if progress {
            eprintln!("{n} queries, {label}, concurrency {conc}");
        }
        let cpu_before = stack.cpu_seconds();
        let t = Instant::now();
        let results: Vec<anyhow::Result<Timed>> = futures::stream::iter(0..n)
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
                    let r = match c.retrieval.retrieve(req).await {
                        Ok(r) => r.into_inner(),
                        // Counted, not fatal: an overloaded stack is a result.
                        Err(s) => {
                            let ms = t.elapsed().as_secs_f64() * 1000.0;
                            return anyhow::Ok((ms, vec![(format!("error:{:?}", s.code()), 0.0)]));
                        }
                    };
                    let mut st: Vec<(String, f64)> = r
                        .stage_latencies
                        .into_iter()
                        .map(|s| (s.stage, s.ms))
                        .collect();
                    st.extend(
                        r.degraded_stages
                            .into_iter()
                            .map(|d| (format!("degraded:{d}"), 0.0)),
                    );
                    anyhow::Ok((t.elapsed().as_secs_f64() * 1000.0, st))
                }
            })
            .buffer_unordered(conc)
            .collect()
            .await;
        let wall = t.elapsed().as_secs_f64();
        if skip_rerank && !sequential {
            cpu_per_query = cpu_ms_per_query(&cpu_before, &stack.cpu_seconds(), n);
        }
        let tag = if sequential {
            format!("sequential_{label}")
        } else {
            label.to_string()
        };
        let mut lat = Vec::new();
        for r in results {
            let (ms, st) = r?;
            lat.push(ms);
            for (stage, v) in st {
                if let Some(code) = stage.strip_prefix("error:") {
                    *errors.entry(format!("{tag}:{code}")).or_default() += 1;
                } else if let Some(d) = stage.strip_prefix("degraded:") {
                    *degraded.entry(format!("{tag}:{d}")).or_default() += 1;
                } else if skip_rerank && sequential {
                    seq_stages.entry(stage).or_default().push(v);
                } else if skip_rerank {
                    stages.entry(stage).or_default().push(v);
                }
            }
        }
        if sequential {
            seq.insert(label.into(), pcts(&mut lat));
        } else {
            qps.insert(
                label.into(),
                serde_json::json!(round1(lat.len() as f64 / wall)),
            );
            e2e.insert(label.into(), pcts(&mut lat));
        }
    }

    // Floor: a bare pgvector top-10 on the same rows, same tenant predicate
    // and the same ef_search as search-svc.
    let url = stack
        .database_url_opt()
        .context("bench needs the database")?;
    let pool =
        engram_common::db::connect_with(url, 4, stack.settings().search.hnsw_ef_search).await?;
    let mut floor = Vec::new();
    let floor_sql = nearest_ids_sql(search_svc::dense::HALF, "10");
    for i in 0..args.queries.min(500) {
        let v = pgvector::Vector::from(qvecs[i % qvecs.len()].clone());
        let t = Instant::now();
        let _rows: Vec<(uuid::Uuid,)> = sqlx::query_as(sqlx::AssertSqlSafe(floor_sql.as_str()))
            .bind(tenant)
            .bind(v)
            .fetch_all(&pool)
            .await?;
        floor.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let ann = ann_recall(
        &pool,
        tenant,
        &qvecs,
        stack.settings().search.hnsw_ef_search,
    )
    .await?;
    pool.close().await;
    let floor = pcts(&mut floor);

    // Ingest throughput with real (server-side) embeddings, last so its
    // embedding load does not overlap the query phases.
    if progress {
        eprintln!("ingest with embeddings ({} passages)", args.ingest_sample);
    }
    let ingest = match ingest_rates(stack, &part, args.ingest_sample).await {
        Ok(rates) => rates,
        Err(e) => serde_json::json!({"failed": format!("{e:#}")}),
    };
    let (facts_ingest, facts) = match fact_ingest_rate(stack).await {
        Ok((r, n)) => (serde_json::json!(round1(r)), n),
        Err(e) => (serde_json::json!(format!("failed: {e:#}")), 0),
    };

    let stage_pcts = |m: BTreeMap<String, Vec<f64>>| -> serde_json::Map<String, serde_json::Value> {
        m.into_iter()
            .map(|(k, mut v)| {
                let p = pcts(&mut v);
                (k, serde_json::json!({"p50": p["p50"], "p95": p["p95"]}))
            })
            .collect()
    };
    let stages_ms = stage_pcts(stages);
    let seq_stages_ms = stage_pcts(seq_stages);
    let ratio = |p: &str| {
        let f = floor[p].as_f64().unwrap_or(0.0);
        let e = e2e
            .get("no_rerank")
            .and_then(|v| v[p].as_f64())
            .unwrap_or(0.0);
        if f > 0.0 { round1(e / f) } else { 0.0 }
    };
    let ratio_to_floor = serde_json::json!({"p50": ratio("p50"), "p95": ratio("p95")});
    Ok(serde_json::json!({
        "memories": args.memories,
        "queries": args.queries,
        "concurrency": args.concurrency,
        "e2e_ms": e2e,
        "qps": qps,
        "floor_ms": {"p50": floor["p50"], "p95": floor["p95"]},
        "dense_ann_recall": ann,
        "stages_ms": stages_ms,
        "sequential": {"queries": n_seq, "e2e_ms": seq, "stages_ms": seq_stages_ms},
        "cpu_ms_per_query": cpu_per_query,
        "cpu_note": "CPU (user + system) of each process over the concurrent no-rerank pass, per query",
        "rss_mb": stack.rss_mb(),
        "rss_note": match stack {
            Target::InProcess(_) => "--in-process: all services share this process; the value is its peak RSS (VmHWM), Postgres excluded",
            Target::Split(_) => "one process per service; each value is that process's peak RSS (VmHWM), Postgres excluded",
        },
        "ratio_to_floor": ratio_to_floor,
        "degraded": degraded,
        "errors": errors,
        "stage2_timeouts_ms": {
            "vector": stack.settings().pipeline.vector_timeout_ms,
            "keyword": stack.settings().pipeline.keyword_timeout_ms,
            "graph": stack.settings().pipeline.graph_timeout_ms,
        },
        "direct_ms": {
            "search_dense_k50": dense_ms,
            "search_keyword_k50": keyword_ms,
            "keyword_index_first_answer": keyword_index_first_ms.map(round1),
            "graph_ppr": ppr_ms,
            "graph_first_call": round1(graph_first_ms),
            "rerank_score": rerank_ms,
        },
        "corpus": corpus,
        "vacuumed_before": vacuumed,
        "write_to_visible_ms": write_to_visible,
        "keyword_index_rebuild_after_write_ms": keyword_index_rebuild_ms.map(round1),
        "graph_fresh_after_write_ms": graph_fresh_ms.map(round1),
        "ingest": {
            "passages": ingest,
            "facts_per_s": facts_ingest,
            "facts": facts,
            "update_detection": stack.settings().search.update_detection,
        },
    }))
}

/// Each process's CPU between two readings, in ms per query.
fn cpu_ms_per_query(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    queries: usize,
) -> serde_json::Map<String, serde_json::Value> {
    let per = |secs: f64| serde_json::json!(round1(secs * 1000.0 / queries.max(1) as f64));
    let mut out: serde_json::Map<String, serde_json::Value> = (after.iter())
        .map(|(k, a)| (k.clone(), per(a - before.get(k).copied().unwrap_or(0.0))))
        .collect();
    let total: f64 = (after.iter())
        .map(|(k, a)| a - before.get(k).copied().unwrap_or(0.0))
        .sum();
    out.insert("total".into(), per(total));
    out
}

/// Peak resident set of this process, from /proc.
pub fn rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| vm_hwm_mb(&s))
        .unwrap_or(0.0)
}
