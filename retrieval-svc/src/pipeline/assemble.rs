//! Stage 5: assemble. Contradictions among the top records are resolved
//! (newer wins unless the older is clearly more trusted; the loser is
//! dropped), every record gets its provenance, and the context block is
//! packed to the caller's token budget.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use engram_common::convert::ts_to_chrono;
use engram_proto::{
    ConflictPair, ConflictResolution, Contradiction, ContradictionsRequest, DroppedCandidate,
    Memory, Provenance, ScoredMemory,
};
use tokio::time::Instant;
use tracing::Instrument;

use super::ctx::{Ctx, StageTrace, stage_span};
use super::strategy::Strategy;
use super::text::said;
use super::validate::Checked;
use crate::downstream::call_until;

/// Stage 5 for one attempt: contradictions (when `conflicts`), then the
/// records, losers removed, cut to the query's limit.
pub async fn run(
    ctx: &mut Ctx<'_>,
    trace: &mut StageTrace,
    ranked: Vec<(Checked, f32)>,
    conflicts: bool,
) -> (Vec<ScoredMemory>, Vec<ConflictPair>) {
    let mut pairs = Vec::new();
    let mut losers = HashSet::new();
    if conflicts {
        let t = Instant::now();
        (pairs, losers) = contradictions(ctx, trace, &ranked).await;
        ctx.timed("conflicts", t);
    }
    // History asked for: a contradiction's loser stays, labelled outdated
    // in the context block; the pair is still reported.
    if ctx.query.filters.include_historical {
        losers.clear();
    }
    let t = Instant::now();
    let records = assemble(
        ranked,
        &losers,
        ctx.query.limit as usize,
        &mut trace.dropped,
    );
    ctx.timed("assemble", t);
    ctx.metrics
        .observe_candidates("assemble", &[("fused", records.len())]);
    trace.counts.push(("returned", records.len()));
    (records, pairs)
}

/// Asks the graph which of the top 2×limit memories contradict each other
/// and resolves each pair. Skipped (degraded) when the graph just failed
/// this query: asking it again would only spend another timeout.
async fn contradictions(
    ctx: &Ctx<'_>,
    trace: &mut StageTrace,
    ranked: &[(Checked, f32)],
) -> (Vec<ConflictPair>, HashSet<String>) {
    if trace.is_degraded(Strategy::Graph) {
        trace.degraded.push("conflicts".into());
        return Default::default();
    }
    let ids: Vec<String> = ranked
        .iter()
        .take((ctx.query.limit as usize).saturating_mul(2))
        .map(|(c, _)| c.cand.memory.id.clone())
        .collect();
    if ids.len() < 2 {
        return Default::default();
    }
    let deadline = ctx
        .deadline
        .checked_sub(Duration::from_millis(20))
        .unwrap_or(ctx.deadline);
    let req = ContradictionsRequest { memory_ids: ids };
    match call_until(&ctx.ds.contradictions, &ctx.identity, deadline, req)
        .instrument(stage_span("conflicts"))
        .await
    {
        Ok(r) => resolve_conflicts(ranked, &r.pairs),
        Err(e) => {
            tracing::warn!(error = %e, "conflict detection degraded");
            trace.degraded.push("conflicts".into());
            Default::default()
        }
    }
}

/// Mean cross-encoder relevance of the top three when it ran, else the top
/// record's fused score relative to the best reachable one.
pub fn confidence_of(records: &[ScoredMemory], max_rrf: f32) -> f32 {
    let rel: Vec<f32> = records
        .iter()
        .take(3)
        .filter_map(|r| r.provenance.as_ref().and_then(|p| p.relevance))
        .collect();
    if !rel.is_empty() {
        return (rel.iter().sum::<f32>() / rel.len() as f32).clamp(0.0, 1.0);
    }
    match records.first().and_then(|r| r.provenance.as_ref()) {
        Some(p) if max_rrf > 0.0 => (p.rrf_score / max_rrf).clamp(0.0, 1.0),
        Some(_) => 0.5,
        None => 0.0,
    }
}

/// The graph edge type graph-svc reports contradictions for.
pub const CONTRADICTS: &str = "contradicts";

/// An older memory wins on confidence only by at least this margin.
const CONFIDENCE_MARGIN: f32 = 0.3;

fn when(m: &Memory) -> Option<i64> {
    m.event_time
        .as_ref()
        .or(m.ingestion_time.as_ref())
        .or(m.recorded_at.as_ref())
        .and_then(ts_to_chrono)
        .map(|t| t.timestamp_millis())
}

/// Recency wins when the newer memory is at least as trusted; confidence
/// wins when the times tie or the older one is clearly more trusted; when
/// the two signals disagree mildly, both are kept and flagged.
pub fn resolve_pair(a: &Memory, b: &Memory) -> (ConflictResolution, Option<String>) {
    let (ca, cb) = (
        a.source_confidence.unwrap_or(1.0),
        b.source_confidence.unwrap_or(1.0),
    );
    let newer = match (when(a), when(b)) {
        (Some(ta), Some(tb)) if (ta - tb).abs() > 1000 => Some(if ta > tb {
            (a, ca, b, cb)
        } else {
            (b, cb, a, ca)
        }),
        _ => None,
    };
    match newer {
        Some((n, cn, o, co)) => {
            if cn >= co {
                (ConflictResolution::Recency, Some(n.id.clone()))
            } else if co - cn >= CONFIDENCE_MARGIN {
                (ConflictResolution::Confidence, Some(o.id.clone()))
            } else {
                (ConflictResolution::Unresolved, None)
            }
        }
        None if (ca - cb).abs() >= 0.1 => {
            let w = if ca > cb { a } else { b };
            (ConflictResolution::Confidence, Some(w.id.clone()))
        }
        None => (ConflictResolution::Unresolved, None),
    }
}

/// Conflict pairs among `ranked` and the losers to remove.
pub fn resolve_conflicts(
    ranked: &[(Checked, f32)],
    pairs: &[Contradiction],
) -> (Vec<ConflictPair>, HashSet<String>) {
    let by_id: HashMap<&str, &Memory> = ranked
        .iter()
        .map(|(c, _)| (c.cand.memory.id.as_str(), &c.cand.memory))
        .collect();
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut losers = HashSet::new();
    for p in pairs {
        let (Some(a), Some(b)) = (
            by_id.get(p.memory_a.as_str()),
            by_id.get(p.memory_b.as_str()),
        ) else {
            continue;
        };
        let key = if p.memory_a < p.memory_b {
            (p.memory_a.clone(), p.memory_b.clone())
        } else {
            (p.memory_b.clone(), p.memory_a.clone())
        };
        if p.memory_a == p.memory_b || !seen.insert(key) {
            continue;
        }
        let (resolution, winner_opt) = resolve_pair(a, b);
        if let Some(w) = &winner_opt {
            let loser = if *w == a.id { &b.id } else { &a.id };
            losers.insert(loser.clone());
        }
        out.push(ConflictPair {
            memory_a: a.id.clone(),
            memory_b: b.id.clone(),
            resolution: resolution as i32,
            winner_id: winner_opt.unwrap_or_default(),
            edge_type: CONTRADICTS.into(),
            reason: "a contradicts edge in the graph".into(),
            score: 0.0,
        });
    }
    (out, losers)
}

pub fn citation(m: &Memory) -> String {
    if m.source.is_empty() {
        format!("[memory:{} v{}]", m.id, m.version)
    } else {
        m.source.clone()
    }
}

pub fn to_record(c: Checked, score: f32) -> ScoredMemory {
    let Checked {
        cand,
        temporal,
        confidence,
        relevance_opt,
        checks,
    } = c;
    let provenance = Provenance {
        strategies: cand.fused.hits,
        rrf_score: cand.fused.rrf,
        checks_passed: checks.into_iter().map(String::from).collect(),
        confidence,
        citation: citation(&cand.memory),
        relevance: relevance_opt,
        temporal_score: temporal,
        via_entities: cand.via_entities,
    };
    ScoredMemory {
        memory: Some(cand.memory),
        score,
        provenance: Some(provenance),
        // Set by `assemble`, which knows the position.
        rank: 0,
    }
}

/// The final record list: losers of resolved conflicts removed, then `limit`.
pub fn assemble(
    ranked: Vec<(Checked, f32)>,
    losers: &HashSet<String>,
    limit: usize,
    dropped: &mut Vec<DroppedCandidate>,
) -> Vec<ScoredMemory> {
    let mut out = Vec::with_capacity(limit);
    for (c, score) in ranked {
        if losers.contains(&c.cand.memory.id) {
            dropped.push(DroppedCandidate {
                memory_id: c.cand.memory.id.clone(),
                stage: "conflicts".into(),
                reason: "lost a contradiction".into(),
            });
            continue;
        }
        if out.len() < limit {
            let mut record = to_record(c, score);
            record.rank = out.len() as u32 + 1;
            out.push(record);
        }
    }
    separate_ties(&mut out);
    out
}

/// The share of the room above the next record's score by which a record
/// tied with it is raised, and the least step.
const TIE_LEAD: f32 = 0.01;
const TIE_STEP: f32 = 0.001;

/// Each record's score strictly above the next one's, so records that rank
/// differently never show one score (issue 49: the demo's first answers
/// read 0.8236 twice, the dev-fitted ranker having raised the fusion's #1
/// to exactly the best score). The order is the one already chosen; a tie
/// is broken upward, from the last record to the first, and nothing else
/// moves. Done here, after every stage, because Stage 4b weighs a slot's
/// own score against the best one's.
fn separate_ties(records: &mut [ScoredMemory]) {
    for i in (0..records.len().saturating_sub(1)).rev() {
        let next = records[i + 1].score;
        if records[i].score <= next {
            records[i].score = next + ((1.0 - next) * TIE_LEAD).max(TIE_STEP);
        }
    }
}

/// ≈ 4 characters per token, rounded up.
pub fn tokens(s: &str) -> u32 {
    chars_to_tokens(s.chars().count())
}

pub const CONTEXT_HEADER: &str = "## Relevant Long-Term Memories\n";

/// `metadata.scope` when the writer set one, else the namespace.
fn scope(m: &Memory) -> String {
    let from_meta = m
        .metadata
        .as_ref()
        .and_then(|s| s.fields.get("scope"))
        .and_then(|v| match &v.kind {
            Some(prost_types::value::Kind::StringValue(s)) if !s.is_empty() => Some(s.clone()),
            _ => None,
        });
    from_meta.unwrap_or_else(|| {
        if m.namespace.is_empty() {
            "default".into()
        } else {
            m.namespace.clone()
        }
    })
}

/// One memory of the context block: `**[type | scope | vN | date]**` (the
/// event date, so an LLM can tell time), a note when it replaces another
/// memory or has been replaced, then the content. `others` are the
/// answer's other records: a replacement among them is named by its date
/// and words rather than a bare id.
pub fn context_entry(m: &Memory, others: &[ScoredMemory], conflicts: &[ConflictPair]) -> String {
    let kind = if m.memory_type.is_empty() {
        "episodic"
    } else {
        m.memory_type.as_str()
    };
    let date = m.event_time.as_ref().map(day).unwrap_or_default();
    let mut e = match date.is_empty() {
        true => format!("\n**[{kind} | {} | v{}]**\n", scope(m), m.version),
        false => format!("\n**[{kind} | {} | v{} | {date}]**\n", scope(m), m.version),
    };
    let find = |pred: &dyn Fn(&Memory) -> bool| {
        others
            .iter()
            .filter_map(|r| r.memory.as_ref())
            .find(|o| pred(o))
    };
    if !m.supersedes.is_empty() {
        match find(&|o| o.id == m.supersedes) {
            Some(old) => e.push_str(&format!(
                "_Replaces the version of {}: \"{}\"._\n",
                old.event_time.as_ref().map(day).unwrap_or_default(),
                short(&old.content)
            )),
            None => e.push_str(&format!("_Supersedes memory {}._\n", m.supersedes)),
        }
    }
    let lost_to = |o: &Memory| {
        conflicts.iter().any(|p| {
            p.winner_id == o.id && o.id != m.id && (p.memory_a == m.id || p.memory_b == m.id)
        })
    };
    if let Some(newer) = find(&|o| o.supersedes == m.id || lost_to(o)) {
        e.push_str(&format!(
            "_Outdated: superseded on {} by: \"{}\"._\n",
            newer.event_time.as_ref().map(day).unwrap_or_default(),
            short(&newer.content)
        ));
    } else if let Some(until) = m
        .valid_to
        .as_ref()
        .filter(|t| t.seconds <= chrono::Utc::now().timestamp())
    {
        e.push_str(&format!("_Outdated: valid until {}._\n", day(until)));
    }
    e.push_str(&edits(m));
    e.push_str(said(m).trim());
    if let Some(t) = m.turn.as_ref().filter(|t| !t.caption.is_empty()) {
        e.push_str(&format!(" [shared: {}]", t.caption));
    }
    e.push('\n');
    e
}

/// Earlier versions shown per entry (the latest ones): a memory edited a
/// hundred times must not fill the block with its past.
const EDITS_SHOWN: usize = 3;

/// A note per earlier content of a memory edited in place (history.rs
/// read them), the latest [`EDITS_SHOWN`], oldest first: its version, the
/// recorded time it held and its first words.
fn edits(m: &Memory) -> String {
    let skip = m.history.len().saturating_sub(EDITS_SHOWN);
    let mut e = String::new();
    for v in &m.history[skip..] {
        let from = v.recorded_at.as_ref().map(day).unwrap_or_default();
        let to = v.replaced_at.as_ref().map(day).unwrap_or_default();
        e.push_str(&format!(
            "_Edited: v{} (recorded {from} until {to}) said: \"{}\"._\n",
            v.version,
            short(&v.content)
        ));
    }
    e
}

/// A timestamp's UTC date, `YYYY-MM-DD`.
fn day(t: &prost_types::Timestamp) -> String {
    chrono::DateTime::from_timestamp(t.seconds, 0)
        .map(|d| d.format("%Y-%m-%d").to_string())
        .unwrap_or_default()
}

/// The first words of a memory, for a note about it.
fn short(text: &str) -> String {
    const MAX: usize = 80;
    let t = text.trim();
    match t.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &t[..cut]),
        None => t.to_string(),
    }
}

/// Most relevant first; an entry that does not fit is skipped and smaller
/// later ones may still fit. Never over `budget`, header included; no
/// entry fits = no block at all (a bare header would only cost tokens).
pub fn pack_context(
    records: &[ScoredMemory],
    conflicts: &[ConflictPair],
    budget: u32,
) -> (String, u32) {
    let mut block = String::from(CONTEXT_HEADER);
    // Characters counted once per entry: re-counting the whole block for
    // each one was quadratic (limit 100 over 60 KiB memories, issue 47).
    let mut chars = CONTEXT_HEADER.chars().count();
    let mut entries = 0;
    for r in records {
        let Some(m) = &r.memory else { continue };
        let entry = context_entry(m, records, conflicts);
        let with = chars + entry.chars().count();
        if chars_to_tokens(with) <= budget {
            block.push_str(&entry);
            chars = with;
            entries += 1;
        }
    }
    if entries == 0 {
        return (String::new(), 0);
    }
    (block, chars_to_tokens(chars))
}

/// [`tokens`] of a text of `chars` characters.
fn chars_to_tokens(chars: usize) -> u32 {
    u32::try_from(chars.div_ceil(4)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::fusion::Fused;
    use crate::pipeline::search::Candidate;
    use prost_types::Timestamp;

    fn mem(id: &str, secs: i64, conf: f32) -> Memory {
        Memory {
            id: id.into(),
            event_time: Some(Timestamp {
                seconds: secs,
                nanos: 0,
            }),
            source_confidence: Some(conf),
            content: format!("content of {id}"),
            version: 1,
            ..Default::default()
        }
    }

    #[test]
    fn recency_wins_when_newer_is_as_trusted() {
        let (r, w) = resolve_pair(&mem("old", 1_000, 0.8), &mem("new", 2_000, 0.8));
        assert_eq!(r, ConflictResolution::Recency);
        assert_eq!(w.as_deref(), Some("new"));
    }

    #[test]
    fn confidence_wins_on_a_tie_in_time_or_a_clear_margin() {
        let (r, w) = resolve_pair(&mem("a", 1_000, 0.9), &mem("b", 1_000, 0.5));
        assert_eq!(
            (r, w.as_deref()),
            (ConflictResolution::Confidence, Some("a"))
        );
        let (r, w) = resolve_pair(&mem("old", 1_000, 0.95), &mem("new", 2_000, 0.4));
        assert_eq!(
            (r, w.as_deref()),
            (ConflictResolution::Confidence, Some("old"))
        );
    }

    #[test]
    fn unresolved_keeps_both() {
        let (r, w) = resolve_pair(&mem("old", 1_000, 0.8), &mem("new", 2_000, 0.7));
        assert_eq!((r, w), (ConflictResolution::Unresolved, None));
        let checked = |m: Memory| Checked {
            cand: Candidate {
                fused: Fused {
                    id: m.id.clone(),
                    rrf: 0.1,
                    hits: vec![],
                },
                memory: m,
                via_entities: vec![],
            },
            temporal: 1.0,
            confidence: 1.0,
            relevance_opt: None,
            checks: vec![],
        };
        let ranked = vec![
            (checked(mem("old", 1_000, 0.8)), 0.2),
            (checked(mem("new", 2_000, 0.7)), 0.1),
        ];
        let pairs = vec![Contradiction {
            memory_a: "old".into(),
            memory_b: "new".into(),
            weight: 1.0,
        }];
        let (conflicts, losers) = resolve_conflicts(&ranked, &pairs);
        assert_eq!(conflicts.len(), 1);
        assert!(losers.is_empty());
        let mut dropped = vec![];
        let records = assemble(ranked, &losers, 10, &mut dropped);
        assert_eq!(records.len(), 2);
    }

    #[test]
    fn records_that_rank_differently_never_show_one_score() {
        let record = |score: f32| ScoredMemory {
            score,
            ..Default::default()
        };
        let mut records: Vec<ScoredMemory> =
            [1.2, 1.2, 0.8236, 0.8236, 0.7583, 0.7583, 0.7583, 0.1]
                .into_iter()
                .map(record)
                .collect();
        separate_ties(&mut records);
        let scores: Vec<f32> = records.iter().map(|r| r.score).collect();
        assert!(scores.windows(2).all(|w| w[0] > w[1]), "{scores:?}");
        // Only ties move, and only up: the last of each run keeps its score.
        assert_eq!(scores[7], 0.1);
        assert_eq!(scores[6], 0.7583);
        assert_eq!(scores[3], 0.8236);
        assert!(scores[2] > 0.8236 && scores[2] < 0.83, "{scores:?}");
        assert!(scores[0] > 1.2, "past 1 the least step: {scores:?}");
    }

    #[test]
    fn context_never_exceeds_budget() {
        let records: Vec<ScoredMemory> = (0..50)
            .map(|i| ScoredMemory {
                memory: Some(Memory {
                    id: format!("m{i}"),
                    content: "x".repeat(10 + (i * 37) % 200),
                    ..Default::default()
                }),
                score: 1.0,
                provenance: None,
                rank: 0,
            })
            .collect();
        for budget in [0, 1, 5, 17, 64, 100, 333, 1000, 100_000] {
            let (block, t) = pack_context(&records, &[], budget);
            assert!(t <= budget, "budget {budget}: {t}");
            assert_eq!(t, tokens(&block));
        }
        let (block, _) = pack_context(&records, &[], 100_000);
        assert!(block.starts_with(
            "## Relevant Long-Term Memories\n\n**[episodic | default | v0]**\nxxxxxxxxxx"
        ));
        assert_eq!(pack_context(&records, &[], 8), (String::new(), 0));
    }

    #[test]
    fn context_entries_name_type_scope_version_and_supersedes() {
        let mut newer = mem("new", 2_000, 0.9);
        newer.memory_type = "semantic".into();
        newer.namespace = "kb-1".into();
        newer.version = 3;
        newer.supersedes = "old".into();
        newer.content = "Alice now leads billing.".into();
        let mut scoped = mem("s", 1_000, 0.9);
        scoped.metadata = Some(engram_common::convert::json_to_struct(
            &serde_json::json!({"scope": "user"}),
        ));
        let records: Vec<ScoredMemory> = [newer, scoped]
            .into_iter()
            .map(|m| ScoredMemory {
                memory: Some(m),
                score: 1.0,
                provenance: None,
                rank: 0,
            })
            .collect();
        let (block, t) = pack_context(&records, &[], 1000);
        assert_eq!(
            block,
            "## Relevant Long-Term Memories\n\n**[semantic | kb-1 | v3 | 1970-01-01]**\n_Supersedes memory old._\nAlice now leads billing.\n\n**[episodic | user | v1 | 1970-01-01]**\ncontent of s\n"
        );
        assert_eq!(t, tokens(&block));
    }

    #[test]
    fn records_carry_their_rank_and_conflicts_their_edge_type() {
        use crate::pipeline::fusion::Fused;
        use crate::pipeline::search::Candidate;
        let checked = |m: Memory| Checked {
            cand: Candidate {
                fused: Fused {
                    id: m.id.clone(),
                    rrf: 0.5,
                    hits: vec![],
                },
                memory: m,
                via_entities: vec![],
            },
            temporal: 1.0,
            confidence: 1.0,
            relevance_opt: None,
            checks: vec![],
        };
        let (old, new) = (mem("old", 100, 1.0), mem("new", 200, 1.0));
        let ranked = vec![
            (checked(new.clone()), 0.9),
            (checked(old.clone()), 0.8),
            (checked(mem("other", 150, 1.0)), 0.7),
        ];
        let pairs = [Contradiction {
            memory_a: "old".into(),
            memory_b: "new".into(),
            weight: 1.0,
        }];
        let (conflicts, losers) = resolve_conflicts(&ranked, &pairs);
        assert_eq!(conflicts[0].edge_type, CONTRADICTS);
        let records = assemble(ranked, &losers, 10, &mut Vec::new());
        let ranks: Vec<(String, u32)> = records
            .iter()
            .map(|r| {
                (
                    r.memory.as_ref().map(|m| m.id.clone()).unwrap_or_default(),
                    r.rank,
                )
            })
            .collect();
        assert_eq!(ranks, [("new".to_string(), 1), ("other".to_string(), 2)]);
    }

    #[test]
    fn the_context_block_tells_time_and_names_what_replaced_what() {
        let day0 = 1_736_150_400; // 2025-01-06
        let old = Memory {
            content: "Priya lives in Berlin.".into(),
            valid_to: Some(Timestamp {
                seconds: day0 + 86_400 * 100,
                nanos: 0,
            }),
            ..mem("old", day0, 1.0)
        };
        let new = Memory {
            content: "Priya moved to Amsterdam.".into(),
            supersedes: "old".into(),
            ..mem("new", day0 + 86_400 * 100, 1.0)
        };
        let rec = |m: &Memory| ScoredMemory {
            memory: Some(m.clone()),
            ..Default::default()
        };
        let (block, _) = pack_context(&[rec(&new), rec(&old)], &[], 500);
        assert!(block.contains("**[episodic | default | v1 | 2025-04-16]**\n_Replaces the version of 2025-01-06: \"Priya lives in Berlin.\"._\nPriya moved to Amsterdam."), "{block}");
        assert!(block.contains("**[episodic | default | v1 | 2025-01-06]**\n_Outdated: superseded on 2025-04-16 by: \"Priya moved to Amsterdam.\"._\nPriya lives in Berlin."), "{block}");
        let (alone, _) = pack_context(&[rec(&old)], &[], 500);
        assert!(
            alone.contains("_Outdated: valid until 2025-04-16._"),
            "{alone}"
        );
    }

    #[test]
    fn an_edited_memory_shows_its_last_earlier_versions_oldest_first() {
        let day0 = 1_736_150_400; // 2025-01-06
        let at = |d: i64| {
            Some(Timestamp {
                seconds: day0 + 86_400 * d,
                nanos: 0,
            })
        };
        let said = ["Pixel 5", "Pixel 6", "Pixel 7", "Pixel 8"];
        let history = (said.iter().enumerate())
            .map(|(i, s)| engram_proto::MemoryVersion {
                version: i as i32 + 1,
                content: format!("Lena's phone is a {s}."),
                recorded_at: at(i as i64 * 10),
                replaced_at: at(i as i64 * 10 + 10),
                ..Default::default()
            })
            .collect();
        let m = Memory {
            content: "Lena's on an iPhone 15 now.".into(),
            version: 5,
            history,
            ..mem("phone", day0, 1.0)
        };
        let entry = context_entry(&m, &[], &[]);
        let want = "_Edited: v2 (recorded 2025-01-16 until 2025-01-26) said: \"Lena's phone is a Pixel 6.\"._\n\
             _Edited: v3 (recorded 2025-01-26 until 2025-02-05) said: \"Lena's phone is a Pixel 7.\"._\n\
             _Edited: v4 (recorded 2025-02-05 until 2025-02-15) said: \"Lena's phone is a Pixel 8.\"._\n\
             Lena's on an iPhone 15 now.";
        assert!(entry.contains(want), "{entry}");
        assert!(!entry.contains("Pixel 5"), "{entry}");
    }
}
