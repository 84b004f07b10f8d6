//! `engram demo`: the whole system on the embedded Postgres with a small
//! sample (an engineering team's memories, with entities, edges, a version
//! chain and one contradiction) and a few real queries, printed with scores
//! and where each result came from.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use engram_proto::{
    AgenticRetrieveRequest, ConflictPair, ConflictResolution, FoundryResponse, GetRequest, Memory,
    QueryRoute, RetrieveRequest, RetrieveResponse, SkipReason, UpsertRequest,
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

/// The text of each memory a conflict names, by id.
pub type Texts = HashMap<String, String>;

/// [`Texts`] of the memories the records hold.
pub fn texts_in_records(r: &RetrieveResponse) -> Texts {
    let wanted: HashSet<&str> = conflict_ids(r).collect();
    (r.records.iter())
        .filter_map(|rec| rec.memory.as_ref())
        .filter(|m| wanted.contains(m.id.as_str()))
        .map(|m| (m.id.clone(), text_of(m)))
        .collect()
}

/// [`Texts`] of every memory `r`'s conflicts name: from the records, and
/// from the store for the ones the answer left out (the loser of a
/// resolved pair is dropped from the records). One the key cannot read
/// any more is left out, and shown by its id.
pub async fn conflict_texts(client: &mut Client, r: &RetrieveResponse) -> Texts {
    let mut texts = texts_in_records(r);
    let mut missing: Vec<String> = (conflict_ids(r))
        .filter(|id| !texts.contains_key(*id))
        .map(str::to_string)
        .collect();
    missing.sort();
    missing.dedup();
    if missing.is_empty() {
        return texts;
    }
    let req = GetRequest {
        ids: missing,
        ..Default::default()
    };
    match client.memories.get(req).await {
        Ok(found) => {
            texts.extend((found.into_inner().memories.iter()).map(|m| (m.id.clone(), text_of(m))))
        }
        Err(status) => tracing::debug!(%status, "the conflicts' memories are shown by id"),
    }
    texts
}

fn conflict_ids(r: &RetrieveResponse) -> impl Iterator<Item = &str> {
    (r.conflicts.iter()).flat_map(|c| [c.memory_a.as_str(), c.memory_b.as_str()])
}

/// A memory as people recognise it: its text, else its title.
fn text_of(m: &Memory) -> String {
    match m.content.trim().is_empty() {
        true => m.title.clone(),
        false => m.content.clone(),
    }
}

/// Human-readable rendering of one answer; conflicts name the memories the
/// records hold by their text ([`render_with`] for the others too).
pub fn render(query: &str, r: &RetrieveResponse) -> String {
    render_with(query, r, &texts_in_records(r))
}

/// [`render`] with the conflicts' memories named from `texts`.
pub fn render_with(query: &str, r: &RetrieveResponse, texts: &Texts) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\n> {query}");
    let _ = writeln!(
        out,
        "  route={} candidates={} confidence={:.2} evidence={:.2}{} latency={:.1}ms{}",
        route_label(r),
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
    );
    render_records(&mut out, r);
    for c in &r.conflicts {
        let _ = writeln!(out, "  {}", render_conflict(texts, c));
    }
    if !r.context_block.is_empty() {
        let _ = writeln!(out, "  context ({} tokens):", r.context_tokens);
        for line in r.context_block.lines() {
            let _ = writeln!(out, "    | {line}");
        }
    }
    out
}

/// Whether `r` is a cached answer: the gateway reports one as route
/// `skip` with skip reason `cache_hit` (retrieval-svc pipeline/cache.rs).
pub fn is_cached(r: &RetrieveResponse) -> bool {
    r.skip_reason == SkipReason::CacheHit as i32
}

/// The route as it happened: a cached answer is `cached` (no route ran
/// for it; the gateway says `skip` and keeps no record of the route that
/// first found it), a skip names its reason.
pub fn route_label(r: &RetrieveResponse) -> String {
    if is_cached(r) {
        return "cached (a recent identical request's answer; nothing searched)".into();
    }
    let route = QueryRoute::try_from(r.route)
        .map(|x| x.as_str_name().trim_start_matches("QUERY_ROUTE_"))
        .unwrap_or("?")
        .to_lowercase();
    match SkipReason::try_from(r.skip_reason) {
        Ok(SkipReason::None) | Err(_) => route,
        Ok(reason) => format!(
            "{route} ({})",
            reason
                .as_str_name()
                .trim_start_matches("SKIP_REASON_")
                .to_lowercase()
        ),
    }
}

fn render_records(out: &mut String, r: &RetrieveResponse) {
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
        for v in &m.history {
            let _ = writeln!(
                out,
                "     before (v{}, {}): {}",
                v.version,
                until(&v.replaced_at),
                v.content
            );
        }
    }
}

/// "until" and the UTC date of an optional timestamp, `?` when unset.
fn until(t: &Option<prost_types::Timestamp>) -> String {
    (t.as_ref())
        .and_then(|t| chrono::DateTime::from_timestamp(t.seconds, 0))
        .map_or("?".into(), |d| d.format("until %Y-%m-%d").to_string())
}

/// A conflict's resolution by name: `recency`, `confidence`, `unresolved`.
pub fn resolution_name(c: &ConflictPair) -> String {
    ConflictResolution::try_from(c.resolution)
        .map(|x| {
            x.as_str_name()
                .trim_start_matches("CONFLICT_RESOLUTION_")
                .to_lowercase()
        })
        .unwrap_or_default()
}

/// One conflict for people: each memory by the start of its text, which
/// one won and why.
fn render_conflict(texts: &Texts, c: &ConflictPair) -> String {
    let kind = match c.edge_type.as_str() {
        "" => String::new(),
        t => format!(" ({t})"),
    };
    let outcome = match c.winner_id.as_str() {
        "" => format!("{}, no winner", resolution_name(c)),
        w => format!("{} keeps {}", resolution_name(c), memory_label(texts, w)),
    };
    let reason = match c.reason.as_str() {
        "" => String::new(),
        why => format!("; {why}"),
    };
    format!(
        "conflict{kind}: {} vs {} -> {outcome}{reason}",
        memory_label(texts, &c.memory_a),
        memory_label(texts, &c.memory_b)
    )
}

/// A memory by the first words of its text; one whose text is not known,
/// by the start of its id.
fn memory_label(texts: &Texts, id: &str) -> String {
    match texts.get(id) {
        Some(text) => format!("\"{}\"", excerpt(text, 48)),
        None => format!("memory {}", id.chars().take(8).collect::<String>()),
    }
}

/// `text` on one line, cut to `max` characters with an ellipsis.
fn excerpt(text: &str, max: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= max {
        return flat;
    }
    let cut: String = flat.chars().take(max).collect();
    format!("{}…", cut.trim_end())
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

#[cfg(test)]
mod tests {
    use super::*;
    use engram_proto::ScoredMemory;

    const NEW: &str = "0b6e8f1e-8f0a-4d61-9a57-2d6f1c1f7a01";
    const OLD: &str = "7c9d2a44-1b3e-4f5a-8c6d-9e0f1a2b3c4d";

    fn record(id: &str, content: &str) -> ScoredMemory {
        ScoredMemory {
            memory: Some(Memory {
                id: id.into(),
                content: content.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn answer_with_a_conflict(winner: &str) -> RetrieveResponse {
        RetrieveResponse {
            route: QueryRoute::Simple as i32,
            records: vec![
                record(
                    NEW,
                    "Alice now prefers afternoon meetings because her mornings are blocked.",
                ),
                record(OLD, "Alice said she prefers morning meetings."),
            ],
            conflicts: vec![ConflictPair {
                memory_a: NEW.into(),
                memory_b: OLD.into(),
                resolution: ConflictResolution::Recency as i32,
                winner_id: winner.into(),
                edge_type: "contradicts".into(),
                reason: "the newer says afternoon, the older morning".into(),
                score: 0.0,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_conflict_shows_its_memories_by_their_text_and_why() {
        let text = render("q", &answer_with_a_conflict(NEW));
        let line = (text.lines())
            .find(|l| l.contains("conflict"))
            .unwrap_or_default();
        assert!(!line.contains(NEW) && !line.contains(OLD), "{line}");
        assert!(
            line.contains("\"Alice now prefers afternoon meetings because her…\" vs \"Alice said she prefers morning meetings.\""),
            "{line}"
        );
        assert!(
            line.contains("recency keeps \"Alice now prefers afternoon"),
            "{line}"
        );
        assert!(line.contains("(contradicts)"), "{line}");
        assert!(line.contains("the newer says afternoon"), "{line}");
    }

    #[test]
    fn a_memory_the_answer_dropped_is_named_from_the_texts_given() {
        let mut r = answer_with_a_conflict(NEW);
        r.records.truncate(1);
        let line = render_conflict(&texts_in_records(&r), &r.conflicts[0]);
        assert!(line.contains("vs memory 7c9d2a44 ->"), "{line}");
        let mut texts = texts_in_records(&r);
        texts.insert(
            OLD.into(),
            "Alice said she prefers morning meetings.".into(),
        );
        let text = render_with("q", &r, &texts);
        assert!(
            text.contains("vs \"Alice said she prefers morning meetings.\" ->"),
            "{text}"
        );
        let unresolved = answer_with_a_conflict("");
        let line = render_conflict(&texts_in_records(&unresolved), &unresolved.conflicts[0]);
        assert!(line.contains("-> recency, no winner"), "{line}");
    }

    #[test]
    fn a_cached_answer_says_cached_not_skip() {
        let cached = RetrieveResponse {
            route: QueryRoute::Skip as i32,
            skip_reason: SkipReason::CacheHit as i32,
            ..Default::default()
        };
        let text = render("q", &cached);
        assert!(text.contains("route=cached"), "{text}");
        assert!(!text.contains("skip"), "{text}");
        let skipped = RetrieveResponse {
            route: QueryRoute::Skip as i32,
            skip_reason: SkipReason::NoRetrievalNeeded as i32,
            ..Default::default()
        };
        assert_eq!(route_label(&skipped), "skip (no_retrieval_needed)");
        let searched = RetrieveResponse {
            route: QueryRoute::MultiHop as i32,
            ..Default::default()
        };
        assert_eq!(route_label(&searched), "multi_hop");
    }

    #[test]
    fn excerpts_are_one_line_and_cut_on_characters() {
        assert_eq!(excerpt("a\n b\tc", 10), "a b c");
        assert_eq!(excerpt("ééééé ééééé", 6), "ééééé…");
    }
}
