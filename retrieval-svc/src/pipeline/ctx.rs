//! Per-request state, passed by reference to every stage instead of a row
//! of parallel arguments: who asks, what, by when, with which settings and
//! downstreams, and what the stages observed ([`StageTrace`]).

use std::sync::Arc;

use engram_common::{Identity, Settings};
use engram_proto::{DroppedCandidate, Memory, StageLatency};
use tokio::time::Instant;

use super::ranker::Ranker;
use super::strategy::Strategy;
use crate::downstream::Downstreams;
use crate::fair::{FairGate, Slot};
use crate::metrics::Metrics;
use crate::query::Query;

pub struct Ctx<'a> {
    pub settings: &'a Settings,
    pub ds: &'a Downstreams,
    pub metrics: &'a Metrics,
    pub identity: Arc<Identity>,
    pub query: Query,
    pub start: Instant,
    /// The pipeline's deadline: the ceiling or the caller's own, earlier one.
    pub deadline: Instant,
    /// Every attempt's stage timings, in the order they ran.
    pub timings: Vec<StageLatency>,
    /// Cross-encoder scores already computed in this request: a retry
    /// re-ranks mostly the same memories.
    pub memo: ScoreMemo,
    /// Texts this request already embedded: Stage 3b and Stage 4d may both
    /// embed a question's clause.
    pub embedded: EmbedMemo,
    /// The Stage 4 model, taken once so every attempt ranks with the same.
    pub ranker_opt: Option<Arc<Ranker>>,
    pub gates: &'a Gates,
    /// This run's work slot while it holds one: from the start of an
    /// attempt until it waits for the cross-encoder (see [`Gates`]).
    pub work_slot_opt: Option<Slot>,
    /// The tenant's latest write graph-svc may not have heard of ("" =
    /// none): the graph walk names it, so an answer from a graph without
    /// it says it is stale (unheard.rs).
    pub after_write: String,
}

/// The gateway's two fair gates (fair.rs). A run holds a *work* slot while
/// it uses the cores (search, fusion, checks) and gives it up when it
/// waits for the cross-encoder, which runs in rerank-svc on its own niced
/// thread: held through that wait, a capped lone tenant's slots would sit
/// idle behind the model (28.6 QPS with it instead of 52 on the 100K
/// bench). The wait takes a *rerank* slot instead, so while several
/// tenants are active each has at most its share of requests in
/// rerank-svc's one queue, and one tenant's flood cannot fill it ahead of
/// another's rerank.
pub struct Gates {
    pub work: FairGate,
    pub rerank: FairGate,
}

impl Ctx<'_> {
    /// Records that `stage` ran from `since` until now.
    pub fn timed(&mut self, stage: &str, since: Instant) {
        self.timings.push(StageLatency {
            stage: stage.into(),
            ms: ms_since(since),
        });
    }
}

/// What one attempt's stages observed; the answer reports the trace of the
/// attempt it returns.
#[derive(Debug, Default)]
pub struct StageTrace {
    /// Candidates per stage / strategy, for the retrieval log event.
    pub counts: Vec<(&'static str, usize)>,
    /// Stages or strategies that failed or ran short; the answer is partial.
    pub degraded: Vec<String>,
    /// Candidates a stage removed, and why (returned with `explain`).
    pub dropped: Vec<DroppedCandidate>,
}

impl StageTrace {
    /// Whether `strategy`'s search failed or ran short in this run.
    pub fn is_degraded(&self, strategy: Strategy) -> bool {
        self.degraded.iter().any(|d| d == strategy.name())
    }
}

pub fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

/// One span per pipeline stage; downstream call spans nest under it, so a
/// trace shows where a retrieval spent its time.
pub fn stage_span(stage: &'static str) -> tracing::Span {
    tracing::info_span!("stage", stage, otel.name = %format_args!("stage.{stage}"))
}

/// Cross-encoder scores already computed in this request, by memory id and
/// version: a retry re-ranks mostly the same memories, and scoring a pair
/// again costs ~15 ms of CPU for the same number.
#[derive(Debug, Default)]
pub struct ScoreMemo(pub std::collections::HashMap<(String, i32), f32>);

impl ScoreMemo {
    pub fn key(m: &Memory) -> (String, i32) {
        (m.id.clone(), m.version)
    }
}

/// Texts embedded in this request, with their embeddings: one embed call
/// per text, however many stages ask (a handful of entries at most).
#[derive(Debug, Default)]
pub struct EmbedMemo(std::sync::Mutex<Vec<(String, Vec<f32>)>>);

impl EmbedMemo {
    pub fn get(&self, text: &str) -> Option<Vec<f32>> {
        let seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        (seen.iter())
            .find(|(t, _)| t == text)
            .map(|(_, v)| v.clone())
    }

    pub fn put(&self, text: String, embedding: Vec<f32>) {
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if !seen.iter().any(|(t, _)| *t == text) {
            seen.push((text, embedding));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_is_embedded_once_per_request() {
        let memo = EmbedMemo::default();
        assert_eq!(memo.get("the project that migrates"), None);
        memo.put("the project that migrates".into(), vec![0.5, 0.5]);
        memo.put("the project that migrates".into(), vec![9.0]);
        assert_eq!(memo.get("the project that migrates"), Some(vec![0.5, 0.5]));
        assert_eq!(memo.get("another clause"), None);
    }
}
