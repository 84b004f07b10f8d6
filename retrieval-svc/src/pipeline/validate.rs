//! Stage 3: validate candidates, in order: temporal, access control,
//! filters, confidence, then cross-encoder relevance. Access control is
//! enforced here again although every downstream filters too: the gateway is
//! the last line before the caller, and graph hits are fetched by id.

use std::time::Duration;

use engram_common::Identity;
use engram_common::convert::{struct_to_json, ts_to_chrono};
use engram_proto::{DroppedCandidate, Filters, MIN_RERANK_HEAD, Memory, ScoreRequest};
use tokio::time::Instant;
use tracing::Instrument;

use super::ctx::{Ctx, ScoreMemo, StageTrace, stage_span};
use super::search::Candidate;
use super::text::said;
use crate::downstream::call_until;

/// Stage 3 for one attempt: the static checks, then, when `rerank`, the
/// cross-encoder over the top candidates. A reranker that cannot be used
/// degrades the answer and leaves the candidates unchecked.
pub async fn run(
    ctx: &mut Ctx<'_>,
    trace: &mut StageTrace,
    candidates: Vec<Candidate>,
    filters: &Filters,
    rerank: bool,
) -> Vec<Checked> {
    let t = Instant::now();
    let mut checked = static_checks(
        candidates,
        &ctx.identity,
        filters,
        filters.decay_floor,
        &mut trace.dropped,
    );
    ctx.timed("validate", t);
    ctx.metrics
        .observe_candidates("validate", &[("fused", checked.len())]);
    trace.counts.push(("validated", checked.len()));
    if rerank && !checked.is_empty() {
        let t = Instant::now();
        let scored = relevance(ctx, &mut checked, &mut trace.dropped)
            .instrument(stage_span("rerank"))
            .await;
        match scored {
            Scored::All => {}
            Scored::Head => trace.degraded.push(RERANK_PARTIAL.into()),
            Scored::Failed => trace.degraded.push("rerank".into()),
        }
        ctx.metrics
            .observe_candidates("rerank", &[("fused", checked.len())]);
        trace.counts.push(("reranked", checked.len()));
        ctx.timed("rerank", t);
    }
    checked
}

/// Passage characters sent to the cross-encoder (it truncates to its own
/// token limit anyway; this bounds the request size).
const RERANK_CHARS: usize = 2000;

#[derive(Debug, Clone)]
pub struct Checked {
    pub cand: Candidate,
    pub temporal: f32,
    pub confidence: f32,
    pub relevance_opt: Option<f32>,
    pub checks: Vec<&'static str>,
}

/// Index of the best-fused candidate (highest fused score, the earliest on
/// a tie): the memory an answer opens with (complement.rs) and whose names
/// the next hop searches for (hop.rs).
pub fn best_fused<'c>(checked: impl Iterator<Item = &'c Checked>) -> Option<usize> {
    (checked.enumerate())
        .max_by(|(a, x), (b, y)| {
            (x.cand.fused.rrf)
                .total_cmp(&y.cand.fused.rrf)
                .then(b.cmp(a))
        })
        .map(|(i, _)| i)
}

impl Checked {
    /// A candidate that passed every check, for unit tests of the stages
    /// after Stage 3.
    #[cfg(test)]
    pub fn passed(memory: Memory, rrf: f32) -> Self {
        Self {
            cand: Candidate {
                fused: super::fusion::Fused {
                    id: memory.id.clone(),
                    rrf,
                    hits: vec![],
                },
                memory,
                via_entities: vec![],
            },
            temporal: 1.0,
            confidence: 1.0,
            relevance_opt: None,
            checks: vec![],
        }
    }
}

/// Whether `m` is the version the caller asked for, by the same rule as
/// search-svc's SQL (filters.rs): as of an event time, valid then; as of
/// an ingestion time, recorded and not yet retracted then; with neither
/// and not historical, valid and not retracted now. Graph hits are fetched
/// by id, so this is where they get the rule.
fn temporal_reason(
    m: &Memory,
    f: &Filters,
    decay_floor: f32,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<String> {
    let at = |ts: &Option<prost_types::Timestamp>| ts.as_ref().and_then(ts_to_chrono);
    let as_of_event_opt = at(&f.as_of_event);
    let as_of_ingestion_opt = at(&f.as_of_ingestion);
    let current_only =
        !f.include_historical && as_of_event_opt.is_none() && as_of_ingestion_opt.is_none();
    if !f.include_historical && m.decay_score < decay_floor {
        return Some(format!("decay score {:.3} below floor", m.decay_score));
    }
    let (valid_from, valid_to) = (at(&m.valid_from), at(&m.valid_to));
    match as_of_event_opt {
        Some(t) if valid_from.is_some_and(|v| v > t) || valid_to.is_some_and(|v| v <= t) => {
            return Some("not valid at the as-of event time".into());
        }
        None if current_only && valid_to.is_some_and(|v| v <= now) => {
            return Some("no longer valid".into());
        }
        _ => {}
    }
    let (recorded_at, retracted_at) = (at(&m.recorded_at), at(&m.retracted_at));
    match as_of_ingestion_opt {
        Some(t) if recorded_at.is_some_and(|r| r > t) || retracted_at.is_some_and(|r| r <= t) => {
            Some("not recorded at the as-of ingestion time".into())
        }
        None if current_only && retracted_at.is_some_and(|r| r <= now) => Some("retracted".into()),
        _ => None,
    }
}

fn drop_reason(
    m: &Memory,
    identity: &Identity,
    filters: &Filters,
    decay_floor: f32,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<(&'static str, String)> {
    if let Some(reason) = temporal_reason(m, filters, decay_floor, now) {
        return Some(("temporal", reason));
    }
    if m.tenant_id != identity.tenant {
        return Some(("access", "other tenant".into()));
    }
    if m.access_level > identity.trust.to_proto() || m.access_level < 0 {
        return Some(("access", "above caller trust level".into()));
    }
    if !filters.memory_types.is_empty() && !filters.memory_types.contains(&m.memory_type) {
        return Some(("filters", "memory type".into()));
    }
    if !filters.agent_scope.is_empty() && !filters.agent_scope.contains(&m.agent_id) {
        return Some(("filters", "agent scope".into()));
    }
    if !filters.namespace.is_empty() && filters.namespace != m.namespace {
        return Some(("filters", "namespace".into()));
    }
    if !filters.include_consolidated && m.consolidated {
        return Some(("filters", "consolidated".into()));
    }
    if let Some(tr) = &filters.time_range {
        let et = m.event_time.as_ref().and_then(ts_to_chrono);
        let start = tr.start.as_ref().and_then(ts_to_chrono);
        let end = tr.end.as_ref().and_then(ts_to_chrono);
        if let Some(et) = et
            && (start.is_some_and(|s| et < s) || end.is_some_and(|e| et >= e))
        {
            return Some(("filters", "outside time range".into()));
        }
    }
    if let Some(want) = filters.metadata.as_ref().filter(|s| !s.fields.is_empty()) {
        let have = m
            .metadata
            .as_ref()
            .map(struct_to_json)
            .unwrap_or(serde_json::Value::Null);
        if !json_contains(&have, &struct_to_json(want)) {
            return Some(("filters", "metadata".into()));
        }
    }
    let confidence = m.source_confidence.unwrap_or(1.0);
    if confidence < filters.min_confidence {
        return Some((
            "confidence",
            format!("confidence {confidence:.2} below minimum"),
        ));
    }
    None
}

/// Postgres `@>` semantics for objects and arrays.
fn json_contains(have: &serde_json::Value, want: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (have, want) {
        (Value::Object(h), Value::Object(w)) => w
            .iter()
            .all(|(k, wv)| h.get(k).is_some_and(|hv| json_contains(hv, wv))),
        (Value::Array(h), Value::Array(w)) => {
            w.iter().all(|wv| h.iter().any(|hv| json_contains(hv, wv)))
        }
        (Value::Array(h), w) => h.iter().any(|hv| hv == w),
        (h, w) => h == w,
    }
}

/// The cheap, local checks. Order of the candidates is preserved.
pub fn static_checks(
    cands: Vec<Candidate>,
    identity: &Identity,
    filters: &Filters,
    decay_floor: f32,
    dropped: &mut Vec<DroppedCandidate>,
) -> Vec<Checked> {
    let now = chrono::Utc::now();
    cands
        .into_iter()
        .filter_map(|cand| {
            if let Some((stage, reason)) =
                drop_reason(&cand.memory, identity, filters, decay_floor, now)
            {
                dropped.push(DroppedCandidate {
                    memory_id: cand.memory.id.clone(),
                    stage: stage.into(),
                    reason,
                });
                return None;
            }
            let temporal = if filters.include_historical {
                cand.memory.decay_score.clamp(0.05, 1.0)
            } else {
                cand.memory.decay_score.clamp(decay_floor.max(0.05), 1.0)
            };
            let confidence = cand.memory.source_confidence.unwrap_or(1.0).clamp(0.0, 1.0);
            Some(Checked {
                cand,
                temporal,
                confidence,
                relevance_opt: None,
                checks: vec!["temporal", "access", "filters", "confidence"],
            })
        })
        .collect()
}

/// What the cross-encoder reads of a memory (also replayed by `engram tune`).
pub fn passage(m: &Memory) -> String {
    let mut s = String::new();
    if !m.title.is_empty() {
        s.push_str(&m.title);
        s.push('\n');
    }
    s.extend(said(m).chars().take(RERANK_CHARS));
    s
}

/// The degraded stage of an answer whose cross-encoder scored only the
/// head of its candidates (rerank-svc under load).
pub const RERANK_PARTIAL: &str = "rerank_partial";

/// How much of the top the cross-encoder scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scored {
    All,
    /// Its first candidates only: rerank-svc had time for a head.
    Head,
    /// Nothing (down, slow, malformed answer).
    Failed,
}

/// Cross-encoder over the top `rerank_top_n` (scores the request's memo
/// does not hold yet are asked for in one batch), then the relevance floor
/// over those scored. When the reranker could not be used the caller
/// marks the stage degraded and the candidates stay unchecked; when it
/// scored only a head, the rest stay unchecked and below it.
async fn relevance(
    ctx: &mut Ctx<'_>,
    checked: &mut Vec<Checked>,
    dropped: &mut Vec<DroppedCandidate>,
) -> Scored {
    let n = ctx.settings.pipeline.rerank_top_n.min(checked.len());
    if n == 0 {
        return Scored::All;
    }
    let scored = score_fresh(ctx, &checked[..n]).await;
    if scored == Scored::Failed {
        return scored;
    }
    let threshold = ctx.settings.pipeline.relevance_threshold;
    let memo = &ctx.memo;
    let mut i = 0;
    checked.retain_mut(|c| {
        let in_top = i < n;
        i += 1;
        // Past the top, or past the head rerank-svc had time for: kept,
        // unchecked.
        if !in_top {
            return true;
        }
        let Some(s) = memo.0.get(&ScoreMemo::key(&c.cand.memory)).copied() else {
            return true;
        };
        c.relevance_opt = Some(s);
        let pass = s >= threshold;
        if pass {
            c.checks.push("relevance");
        } else {
            dropped.push(DroppedCandidate {
                memory_id: c.cand.memory.id.clone(),
                stage: "relevance".into(),
                reason: format!("cross-encoder {s:.3} below {threshold}"),
            });
        }
        pass
    });
    scored
}

/// Asks rerank-svc for the scores of `top` the memo lacks, until 50 ms
/// before the deadline, and keeps those it got in the memo: all, a head
/// (rerank-svc under load scores the first few; the request lists them
/// best first), or none.
async fn score_fresh(ctx: &mut Ctx<'_>, top: &[Checked]) -> Scored {
    let fresh: Vec<&Memory> = top
        .iter()
        .map(|c| &c.cand.memory)
        .filter(|m| !ctx.memo.0.contains_key(&ScoreMemo::key(m)))
        .collect();
    if fresh.is_empty() {
        return Scored::All;
    }
    let req = ScoreRequest {
        query: ctx.query.text.clone(),
        candidates: fresh.iter().map(|m| passage(m)).collect(),
        max_length: 0,
    };
    let want = fresh.len();
    let keys: Vec<(String, i32)> = fresh.into_iter().map(ScoreMemo::key).collect();
    let deadline = ctx
        .deadline
        .checked_sub(Duration::from_millis(50))
        .unwrap_or(ctx.deadline);
    // Waiting on the model needs no cores: the work slot goes to the next
    // run, and the tenant's share of the model's queue is a rerank slot
    // (ctx.rs, `Gates`).
    ctx.work_slot_opt = None;
    let tenant = &ctx.identity.tenant;
    let Ok(_rerank_slot) = ctx.gates.rerank.acquire(tenant, deadline).await else {
        tracing::warn!("rerank degraded: the tenant's share of the cross-encoder is in use");
        return Scored::Failed;
    };
    match call_until(&ctx.ds.score, &ctx.identity, deadline, req).await {
        Ok(r) if r.scores.len() == want => {
            ctx.memo.0.extend(keys.into_iter().zip(r.scores));
            Scored::All
        }
        Ok(r) if (MIN_RERANK_HEAD..want).contains(&r.scores.len()) => {
            tracing::debug!(
                asked = want,
                scored = r.scores.len(),
                "rerank scored a head"
            );
            ctx.memo.0.extend(keys.into_iter().zip(r.scores));
            Scored::Head
        }
        Ok(r) => {
            let got = r.scores.len();
            tracing::warn!(expected = want, got, "rerank returned wrong count");
            Scored::Failed
        }
        Err(e) => {
            tracing::warn!(error = %e, "rerank degraded");
            Scored::Failed
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::fusion::Fused;
    use engram_common::AccessLevel;

    fn cand(id: &str, tenant: &str, level: i32, conf: f32) -> Candidate {
        Candidate {
            memory: Memory {
                id: id.into(),
                tenant_id: tenant.into(),
                access_level: level,
                source_confidence: Some(conf),
                decay_score: 1.0,
                ..Default::default()
            },
            fused: Fused {
                id: id.into(),
                rrf: 0.1,
                hits: vec![],
            },
            via_entities: vec![],
        }
    }

    #[test]
    fn access_control_is_hard() {
        let id = Identity {
            tenant: "t1".into(),
            agent_id: "a".into(),
            trust: AccessLevel::Internal,
        };
        let filters = Filters {
            min_confidence: 0.5,
            ..Default::default()
        };
        let mut dropped = vec![];
        let kept = static_checks(
            vec![
                cand("ok", "t1", 2, 0.9),
                cand("other-tenant", "t2", 1, 0.9),
                cand("too-secret", "t1", 3, 0.9),
                cand("unsure", "t1", 1, 0.2),
            ],
            &id,
            &filters,
            0.1,
            &mut dropped,
        );
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].cand.memory.id, "ok");
        let reasons: Vec<_> = dropped.iter().map(|d| d.stage.as_str()).collect();
        assert_eq!(reasons, ["access", "access", "confidence"]);
    }

    #[test]
    fn metadata_containment() {
        let have = serde_json::json!({"a": 1, "tags": ["x", "y"], "n": {"b": true}});
        assert!(json_contains(&have, &serde_json::json!({"a": 1})));
        assert!(json_contains(
            &have,
            &serde_json::json!({"tags": ["y"], "n": {"b": true}})
        ));
        assert!(!json_contains(&have, &serde_json::json!({"a": 2})));
    }
}
