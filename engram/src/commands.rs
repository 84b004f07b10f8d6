//! The CLI commands.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use engram_common::Settings;
use engram_proto::{RetrievalMode, RetrieveRequest, RetrieveResponse, UpsertRequest};
use engram_stack::client::{Client, INGEST_BATCH, INGEST_IN_FLIGHT};
use engram_stack::stack::{self, Service, Stack, StackOptions};
use engram_stack::{out, outln};
use futures::StreamExt;

use crate::{demo, ingest};

/// Where the CLI finds a running gateway and which key it uses.
#[derive(Debug, Clone, clap::Args)]
pub struct Conn {
    /// Gateway URI; default: http://<listen.retrieval>.
    #[arg(long)]
    pub addr: Option<String>,
    /// API key; default: ENGRAM_API_KEY, else <home>/dev-api-key written by `engram up`.
    #[arg(long, env = "ENGRAM_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Tenant the key must belong to (the gateway takes the tenant from the key).
    #[arg(long, default_value = "default")]
    pub tenant: String,
}

impl Conn {
    pub async fn connect(&self, settings: &Settings) -> anyhow::Result<Client> {
        let uri = self
            .addr
            .clone()
            .unwrap_or_else(|| format!("http://{}", settings.listen.retrieval));
        let key = match &self.api_key {
            Some(k) => k.clone(),
            None => std::fs::read_to_string(settings.home.join("dev-api-key"))
                .map(|k| k.trim().to_string())
                .map_err(|_| {
                    anyhow::anyhow!(
                        "no API key: pass --api-key or ENGRAM_API_KEY, or start `engram up` (it writes {})",
                        settings.home.join("dev-api-key").display()
                    )
                })?,
        };
        if self.api_key.is_none() && self.tenant != "default" {
            anyhow::bail!(
                "the dev key belongs to tenant \"default\"; pass --api-key for tenant {:?}",
                self.tenant
            );
        }
        Client::connect(&uri, &key).await
    }
}

/// `engram up` / `engram serve`: run until Ctrl-C or SIGTERM.
pub async fn up(settings: Settings, services_opt: Option<Vec<String>>) -> anyhow::Result<()> {
    let mut opts = StackOptions::default();
    if let Some(list) = services_opt {
        opts.services = list
            .iter()
            .map(|s| Service::parse(s))
            .collect::<anyhow::Result<BTreeSet<_>>>()?;
    }
    let mut stack = Stack::start(settings, opts).await?;
    // The services keep running when nobody reads the banner
    // (`engram up | head -3`): a failed write is only logged.
    if let Err(e) = out::print(&banner(&stack)) {
        tracing::warn!(error = %e, "cannot print the start-up banner");
    }
    if let Some(url) = stack.database_url_opt() {
        tracing::info!(database = %redact_url(url), "database ready");
    }
    tokio::select! {
        _ = shutdown_signal() => {}
        (svc, res) = stack.any_exited() => {
            let msg = match res { Ok(()) => "stopped".to_string(), Err(e) => format!("{e:#}") };
            eprintln!("engram: {} service exited: {msg}", svc.name());
        }
    }
    stack.shutdown().await;
    Ok(())
}

/// What `engram up` prints once the services listen: their addresses and
/// the dev key it created, if any.
fn banner(stack: &Stack) -> String {
    let mut b = String::new();
    for (svc, addr) in &stack.addrs {
        let _ = writeln!(b, "{:<9} grpc://{addr}", svc.name());
    }
    let _ = writeln!(
        b,
        "{:<9} http://{} (/health /ready /metrics)",
        "admin", stack.admin_addr
    );
    if let Some(a) = stack.http_addr_opt {
        let _ = writeln!(b, "{:<9} http://{a}/api/v1/", "http");
    }
    if let Some(key) = &stack.api_key_opt {
        let _ = writeln!(b, "dev API key (tenant default, trust sensitive): {key}");
        let path = stack.settings.home.join("dev-api-key");
        let _ = writeln!(b, "  saved to {}", path.display());
    }
    b.push_str("engram is up; Ctrl-C to stop\n");
    b
}

/// `engram demo`: everything on ephemeral ports, sample loaded, queries printed.
/// The tenant the demo writes to: its own, so the sample never shows up in
/// the answers of tenant `default` that `engram up` serves from the same
/// data directory.
pub const DEMO_TENANT: &str = "demo";

pub async fn demo(settings: Settings) -> anyhow::Result<()> {
    let key = stack::random_token();
    let opts = StackOptions {
        ephemeral_ports: true,
        dev_api_key: false,
        extra_keys: vec![(
            key.clone(),
            DEMO_TENANT.into(),
            "demo-agent".into(),
            "sensitive".into(),
        )],
        ..Default::default()
    };
    let stack = Stack::start(settings, opts).await?;
    let result = demo_on(&stack, &key).await;
    stack.shutdown().await;
    out::print(&result?)?;
    Ok(())
}

/// The demo against a running stack, with a key of [`DEMO_TENANT`];
/// returns what it prints.
pub async fn demo_on(stack: &Stack, key: &str) -> anyhow::Result<String> {
    let uri = stack.gateway_uri().context("demo needs the gateway")?;
    let mut client = Client::connect(&uri, key).await?;
    let n = demo::load_sample(&mut client, DEMO_TENANT).await?;
    let mut out = format!(
        "loaded {n} sample memories into tenant \"{DEMO_TENANT}\" (its own: tenant \"default\" is untouched)\n"
    );
    for q in demo::QUERIES {
        let r = demo::run_query(&mut client, q).await?;
        let texts = demo::conflict_texts(&mut client, &r).await;
        out.push_str(&demo::render_with(q, &r, &texts));
    }
    let r = demo::run_agentic(&mut client, DEMO_TENANT, demo::BRIDGE_QUERY).await?;
    out.push_str(&demo::render_agentic(demo::BRIDGE_QUERY, &r));
    Ok(out)
}

pub async fn ingest(settings: Settings, file: &Path, conn: Conn) -> anyhow::Result<()> {
    let key = ingest::IdKey::for_deployment(&settings)?;
    let batch = ingest::parse_file(file, &conn.tenant, &key)?;
    let waves = batch.waves()?;
    let mut client = conn.connect(&settings).await?;
    let total = batch.memories.len();
    let mut tally = IngestTally::default();
    for wave in &waves {
        // The memories of one wave are independent: two batches at once
        // keep both of the server's cores busy (one embeds while the other
        // writes).
        let calls = wave.chunks(INGEST_BATCH).map(|chunk| {
            let mut memories_client = client.memories.clone();
            let memories = chunk.iter().map(|&i| batch.memories[i].clone()).collect();
            async move {
                (
                    chunk,
                    memories_client.upsert(UpsertRequest { memories }).await,
                )
            }
        });
        let mut answers = futures::stream::iter(calls).buffer_unordered(INGEST_IN_FLIGHT);
        while let Some((chunk, answer)) = answers.next().await {
            let results = match answer {
                Ok(r) => r.into_inner().results,
                Err(status) => return Err(at_line(&batch, chunk, &status)),
            };
            tally.count(&results);
            eprint!("\r  ingesting {}: {}/{total}", conn.tenant, tally.written());
        }
    }
    if total > 0 {
        eprintln!();
    }
    let edges = client.add_edges(&batch.edges).await?;
    outln!(
        "ingested {} from {}: {} created, {} updated, {} unchanged; {edges} edges",
        tally.written(),
        file.display(),
        tally.created,
        tally.updated,
        tally.unchanged
    )?;
    Ok(())
}

/// What an ingest did: a new row, new text (re-embedded), or the same text.
#[derive(Debug, Default)]
struct IngestTally {
    created: usize,
    updated: usize,
    unchanged: usize,
}

impl IngestTally {
    fn count(&mut self, results: &[engram_proto::UpsertResult]) {
        for r in results {
            match (r.created, r.embedded) {
                (true, _) => self.created += 1,
                (false, true) => self.updated += 1,
                (false, false) => self.unchanged += 1,
            }
        }
    }

    fn written(&self) -> usize {
        self.created + self.updated + self.unchanged
    }
}

/// A refused upsert as the user wrote it: `memories[i]` in the server's
/// message becomes the file line and id of that memory.
fn at_line(batch: &ingest::Batch, chunk: &[usize], status: &tonic::Status) -> anyhow::Error {
    let message = status.message();
    let index_opt = message
        .split("memories[")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .and_then(|n| n.parse::<usize>().ok());
    match index_opt
        .and_then(|i| chunk.get(i))
        .and_then(|&j| batch.origins.get(j))
    {
        Some(origin) => anyhow::anyhow!("{origin}: {message} ({:?})", status.code()),
        None => anyhow::anyhow!("ingest refused: {message} ({:?})", status.code()),
    }
}

pub fn parse_mode(mode: &str) -> anyhow::Result<RetrievalMode> {
    Ok(match mode {
        "auto" => RetrievalMode::Auto,
        "simple" => RetrievalMode::Simple,
        "multi_hop" => RetrievalMode::MultiHop,
        "exploratory" => RetrievalMode::Exploratory,
        "vector" => RetrievalMode::Vector,
        "keyword" => RetrievalMode::Keyword,
        "graph" => RetrievalMode::Graph,
        "hybrid" => RetrievalMode::Hybrid,
        other => anyhow::bail!(
            "--mode {other:?}: expected auto, simple, multi_hop, exploratory, vector, keyword, graph or hybrid"
        ),
    })
}

/// What `engram query` may ask besides the text.
#[derive(Debug, Clone, clap::Args)]
pub struct QueryOptions {
    #[arg(long, default_value_t = 10)]
    pub limit: u32,
    /// auto | simple | multi_hop | exploratory | vector | keyword | graph | hybrid
    #[arg(long, default_value = "auto")]
    pub mode: String,
    /// Only memories of this namespace.
    #[arg(long)]
    pub namespace: Option<String>,
    /// Also superseded, retracted and decayed memories.
    #[arg(long)]
    pub include_historical: bool,
    /// List what was dropped and why (JSON output only), and each edited
    /// record's earlier versions.
    #[arg(long)]
    pub explain: bool,
    #[arg(long)]
    pub json: bool,
}

pub async fn query(
    settings: Settings,
    text: &str,
    options: QueryOptions,
    conn: Conn,
) -> anyhow::Result<()> {
    let mode = parse_mode(&options.mode)?;
    let json = options.json;
    let mut client = conn.connect(&settings).await?;
    let req = RetrieveRequest {
        text: text.to_string(),
        limit: Some(options.limit),
        mode: mode as i32,
        namespace: options.namespace.unwrap_or_default(),
        include_historical: options.include_historical,
        explain: options.explain,
        ..Default::default()
    };
    let r = client
        .retrieval
        .retrieve(req)
        .await
        .map_err(|s| anyhow::anyhow!("{}: {}", s.code(), s.message()))?
        .into_inner();
    let texts = demo::conflict_texts(&mut client, &r).await;
    if json {
        outln!("{}", query_json(&r, &texts))?;
    } else {
        out::print(&demo::render_with(text, &r, &texts))?;
    }
    Ok(())
}

/// `engram query --json`: the answer as one JSON object. `conflicts`
/// carries what the text output shows of each pair (each memory's text
/// from `texts`, null when unknown); `cached` says the gateway answered
/// from its cache (it reports that as route skip).
pub fn query_json(r: &RetrieveResponse, texts: &demo::Texts) -> serde_json::Value {
    let records: Vec<serde_json::Value> = r
        .records
        .iter()
        .map(|rec| {
            let m = rec.memory.clone().unwrap_or_default();
            let p = rec.provenance.clone().unwrap_or_default();
            serde_json::json!({
                "id": m.id, "content": m.content, "version": m.version, "score": rec.score, "citation": p.citation,
                "history": m.history.iter().map(|v| serde_json::json!({"version": v.version, "content": v.content, "recorded_at": v.recorded_at.as_ref().map(|t| t.seconds), "replaced_at": v.replaced_at.as_ref().map(|t| t.seconds)})).collect::<Vec<_>>(),
                "strategies": p.strategies.iter().map(|s| serde_json::json!({"strategy": s.strategy, "rank": s.rank, "score": s.score})).collect::<Vec<_>>(),
            })
        })
        .collect();
    let conflicts: Vec<serde_json::Value> = (r.conflicts.iter())
        .map(|c| {
            serde_json::json!({
                "memory_a": c.memory_a, "memory_b": c.memory_b,
                "memory_a_text": texts.get(&c.memory_a), "memory_b_text": texts.get(&c.memory_b),
                "resolution": demo::resolution_name(c), "winner_id": c.winner_id,
                "edge_type": c.edge_type, "reason": c.reason, "score": c.score,
            })
        })
        .collect();
    serde_json::json!({
        "query_id": r.query_id, "route": r.route, "cached": demo::is_cached(r),
        "records": records, "conflicts": conflicts,
        "latency_ms": r.latency_ms, "nothing_relevant": r.nothing_relevant,
        "degraded_stages": r.degraded_stages,
        "evidence_score": r.evidence_score,
        "dropped": r.dropped.iter().map(|d| serde_json::json!({"id": d.memory_id, "stage": d.stage, "reason": d.reason})).collect::<Vec<_>>(),
    })
}

/// `engram decay --once`: one full pass of search-svc's decay job
/// (`search_svc::decay`) over every memory in the configured database (the
/// embedded one, or `DATABASE_URL`), for operators who changed half-lives
/// or run with `search.decay_interval_secs = 0`.
pub async fn decay(settings: Settings, once: bool) -> anyhow::Result<()> {
    if !once {
        anyhow::bail!(
            "decay runs inside search-svc every search.decay_interval_secs; pass --once for one pass now"
        );
    }
    let r = decay_once(&settings).await?;
    outln!(
        "decay: {} memories scanned, {} updated",
        r.scanned,
        r.updated
    )?;
    Ok(())
}

/// The pass `engram decay --once` runs, with the same policy as the job.
pub async fn decay_once(settings: &Settings) -> anyhow::Result<search_svc::decay::PassReport> {
    let db = engram_common::db::Database::open(settings)
        .await
        .context("database")?;
    let policy = search_svc::decay::Policy::from_settings(&settings.search);
    let result = search_svc::decay::run_pass(&db.pool, &policy).await;
    db.close().await;
    Ok(result?)
}

/// `engram index-facts`: the fact index for memories written without it.
pub async fn index_facts(
    settings: Settings,
    tenant_opt: Option<String>,
    batch: u32,
) -> anyhow::Result<()> {
    let db = engram_common::db::Database::open(&settings)
        .await
        .context("database")?;
    let load = settings.clone();
    let embeddings =
        tokio::task::spawn_blocking(move || search_svc::Embeddings::load_blocking(&load)).await?;
    if !embeddings.is_ready() {
        anyhow::bail!("the embedding model is not loaded; see the log above");
    }
    let timeout_ms = settings.search.statement_timeout_write_ms;
    let tenant = tenant_opt.as_deref();
    let result =
        search_svc::facts::backfill(&db.pool, &embeddings, tenant, batch, timeout_ms).await;
    db.close().await;
    let r = result?;
    outln!(
        "index-facts: {} memories without sentences scanned, {} indexed",
        r.scanned,
        r.indexed
    )?;
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

fn redact_url(url: &str) -> String {
    match url.split_once('@') {
        Some((scheme_user, host)) => {
            let scheme = scheme_user.split("://").next().unwrap_or("postgres");
            format!("{scheme}://***@{host}")
        }
        None => url.to_string(),
    }
}

pub use stack::dev_api_key;

#[cfg(test)]
mod tests {
    use super::*;
    use engram_proto::{ConflictPair, ConflictResolution, QueryRoute, SkipReason};

    #[test]
    fn query_json_carries_the_conflicts_and_says_cached() {
        let r = RetrieveResponse {
            route: QueryRoute::Skip as i32,
            skip_reason: SkipReason::CacheHit as i32,
            conflicts: vec![ConflictPair {
                memory_a: "a".into(),
                memory_b: "b".into(),
                resolution: ConflictResolution::Recency as i32,
                winner_id: "a".into(),
                edge_type: "same_slot".into(),
                reason: "values differ: Porto, Lisbon".into(),
                score: 0.75,
            }],
            ..Default::default()
        };
        let texts = demo::Texts::from([("a".to_string(), "Priya lives in Porto.".to_string())]);
        let v = query_json(&r, &texts);
        assert_eq!(v["cached"], true);
        assert_eq!(
            v["conflicts"],
            serde_json::json!([{
                "memory_a": "a", "memory_b": "b",
                "memory_a_text": "Priya lives in Porto.", "memory_b_text": null,
                "resolution": "recency", "winner_id": "a",
                "edge_type": "same_slot", "reason": "values differ: Porto, Lisbon", "score": 0.75,
            }])
        );
        let fresh = query_json(&RetrieveResponse::default(), &texts);
        assert_eq!(fresh["cached"], false);
        assert_eq!(fresh["conflicts"], serde_json::json!([]));
    }
}
