//! `engram demo`: the whole system on the embedded Postgres with a small
//! sample (an engineering team's memories, with entities, edges, a version
//! chain and one contradiction) and a few real queries, printed with scores
//! and where each result came from.

use std::fmt::Write as _;

use engram_proto::{
    AgenticRetrieveRequest, FoundryResponse, QueryRoute, RetrieveRequest, RetrieveResponse,
    UpsertRequest,
};
use engram_stack::client::Client;

use crate::ingest;

pub const SAMPLE: &str = include_str!("demo.jsonl");

/// Queries the demo runs, each chosen to show one part of the pipeline.
pub const QUERIES: &[&str] = &[
    BRIDGE_QUERY,
    "When does Alice prefer to have meetings?",
    "What is the deadline for the Atlas migration?",
    "Who is the contact at the customer that gets invoices from billing, and when can I call him?",
    "hello!",
];

/// A bridge question: one pass finds the project but not its lead, so the
/// demo also asks it through agentic retrieval, which looks up the project
/// first and then asks who leads it.
pub const BRIDGE_QUERY: &str = "Who leads the project that migrates the billing system?";

/// Loads the sample (idempotent: stable ids).
pub async fn load_sample(client: &mut Client, tenant: &str) -> anyhow::Result<usize> {
    let batch = ingest::parse_str(SAMPLE, "demo.jsonl", tenant, &ingest::IdKey::demo())?;
    let n = batch.memories.len();
    // What a memory supersedes must exist first: two passes.
    let (later, first): (Vec<_>, Vec<_>) = batch
        .memories
        .into_iter()
        .partition(|m| !m.supersedes.is_empty());
    client
        .memories
        .upsert(UpsertRequest { memories: first })
        .await?;
    client
        .memories
        .upsert(UpsertRequest { memories: later })
        .await?;
    client.add_edges(&batch.edges).await?;
    Ok(n)
}

pub async fn run_query(client: &mut Client, text: &str) -> anyhow::Result<RetrieveResponse> {
    let req = RetrieveRequest {
        text: text.to_string(),
        limit: Some(5),
        token_budget: 120,
        ..Default::default()
    };
    Ok(client.retrieval.retrieve(req).await?.into_inner())
}

/// Human-readable rendering of one answer.
pub fn render(query: &str, r: &RetrieveResponse) -> String {
    let mut out = String::new();
    let route = QueryRoute::try_from(r.route)
        .map(|x| x.as_str_name())
        .unwrap_or("?");
    let _ = writeln!(out, "\n> {query}");
    let _ = writeln!(
        out,
        "  route={} candidates={} confidence={:.2} evidence={:.2}{} latency={:.1}ms{}{}",
        route.trim_start_matches("QUERY_ROUTE_").to_lowercase(),
        r.total_candidates,
        r.retrieval_confidence,
        r.evidence_score,
        if r.nothing_relevant {
            " (nothing relevant)"
        } else {
            ""
        },
        r.latency_ms,
        if r.degraded_stages.is_empty() {
            String::new()
        } else {
            format!(" degraded={}", r.degraded_stages.join(","))
        },
        if r.skip_reason != 0 {
            format!(
                " skip={}",
                engram_proto::SkipReason::try_from(r.skip_reason)
                    .map(|s| s
                        .as_str_name()
                        .trim_start_matches("SKIP_REASON_")
                        .to_lowercase())
                    .unwrap_or_default()
            )
        } else {
            String::new()
        }
    );
    for (i, rec) in r.records.iter().enumerate() {
        let Some(m) = &rec.memory else { continue };
        let p = rec.provenance.clone().unwrap_or_default();
        let strategies: Vec<String> = p
            .strategies
            .iter()
            .map(|s| format!("{}#{}", s.strategy, s.rank))
            .collect();
        let _ = writeln!(out, "  {}. [{:.4}] {}", i + 1, rec.score, m.content);
        let _ = writeln!(
            out,
            "     via {} | {} | relevance {}",
            if strategies.is_empty() {
                "-".into()
            } else {
                strategies.join(" ")
            },
            p.citation,
            p.relevance
                .map(|r| format!("{r:.2}"))
                .unwrap_or_else(|| "n/a".into()),
        );
    }
    for c in &r.conflicts {
        let res = engram_proto::ConflictResolution::try_from(c.resolution)
            .map(|x| {
                x.as_str_name()
                    .trim_start_matches("CONFLICT_RESOLUTION_")
                    .to_lowercase()
            })
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  conflict: {} vs {} -> {res} (winner {})",
            c.memory_a,
            c.memory_b,
            if c.winner_id.is_empty() {
                "none"
            } else {
                &c.winner_id
            }
        );
    }
    if !r.context_block.is_empty() {
        let _ = writeln!(out, "  context ({} tokens):", r.context_tokens);
        for line in r.context_block.lines() {
            let _ = writeln!(out, "    | {line}");
        }
    }
    out
}

/// Agentic retrieval with rule-based decomposition (no LLM).
pub async fn run_agentic(
    client: &mut Client,
    tenant: &str,
    text: &str,
) -> anyhow::Result<FoundryResponse> {
    let r = client
        .foundry
        .retrieve_agentic(AgenticRetrieveRequest {
            query: text.to_string(),
            tenant_id: tenant.to_string(),
            reasoning_effort: "medium".into(),
            ..Default::default()
        })
        .await?;
    Ok(r.into_inner())
}

pub fn render_agentic(query: &str, r: &FoundryResponse) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n> {query}  (agentic, reasoning_effort=medium)\n  latency={:.1}ms tokens={}",
        r.total_latency_ms, r.total_tokens_used
    );
    for s in &r.steps {
        let _ = writeln!(
            out,
            "  step {} {}: {:?} -> {} results{}",
            s.step_number,
            s.action,
            s.input,
            s.result_count,
            if s.detail.is_empty() {
                String::new()
            } else {
                format!(" ({})", s.detail)
            }
        );
    }
    for (i, x) in r.results.iter().enumerate() {
        let _ = writeln!(out, "  {}. [{:.3}] {}", i + 1, x.score, x.text);
    }
    out
}
