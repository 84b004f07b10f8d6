//! The gateway's Prometheus metrics and its one structured log event per
//! retrieval. One registry per gateway (not the process-global
//! one) so several gateways in one test process never collide.
//!
//! Label values come from closed sets (stage, route, strategy, stack names,
//! signal, resolution): never query text, tenant or agent ids, so the series
//! count stays bounded whatever the traffic.

use std::time::Duration;

use engram_common::Identity;
use engram_proto::{ConflictResolution, QueryRoute, RetrieveResponse, SkipReason};
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Latency buckets (seconds) from a cache hit (~1 ms) to the 3 s ceiling.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];
const SCORE_BUCKETS: &[f64] = &[0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];
const COUNT_BUCKETS: &[f64] = &[0.0, 1.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0];
const TOKEN_BUCKETS: &[f64] = &[
    0.0, 100.0, 500.0, 1000.0, 2000.0, 4000.0, 8000.0, 16000.0, 32000.0, 64000.0,
];

pub struct Metrics {
    registry: Registry,
    pub stage_latency: HistogramVec,
    pub e2e_latency: Histogram,
    pub hit_rate: IntCounterVec,
    pub results: IntCounterVec,
    pub precision_at_k: Histogram,
    pub route: IntCounterVec,
    pub retry: IntCounterVec,
    pub candidates: HistogramVec,
    pub conflicts: IntCounterVec,
    pub selfrag_score: Histogram,
    pub feedback: IntCounterVec,
    pub circuit_state: IntGaugeVec,
    pub downstream_requests: IntCounterVec,
    pub downstream_latency: HistogramVec,
    pub feedback_dropped: IntGauge,
    pub cache_bytes: IntGaugeVec,
    pub kf_requests: IntCounterVec,
    pub kf_latency: HistogramVec,
    pub kf_results: HistogramVec,
    pub kf_tokens: HistogramVec,
    pub kf_steps: Histogram,
}

/// One finished Knowledge Foundry request, for the `kf_retrieval_*`
/// families: `mode` basic or agentic, `outcome` ok, truncated or error.
#[derive(Debug, Clone, Copy)]
pub struct FoundryOutcome {
    pub mode: &'static str,
    pub outcome: &'static str,
    pub elapsed: std::time::Duration,
    pub results: usize,
    pub tokens: u32,
    pub steps: usize,
}

/// What the gateway reads off its parts when it is scraped.
#[derive(Debug, Default)]
pub struct Scrape<'a> {
    /// Each breaker's state: 0 closed, 1 half-open, 2 open.
    pub breakers: &'a [(&'static str, i64)],
    pub feedback_dropped: u64,
    /// Weighed bytes per cache (results, semantic, turns).
    pub cache_bytes: &'a [(&'static str, u64)],
}

fn histogram(name: &str, help: &str, buckets: &[f64]) -> prometheus::Result<Histogram> {
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
}

fn histogram_vec(
    name: &str,
    help: &str,
    buckets: &[f64],
    labels: &[&str],
) -> prometheus::Result<HistogramVec> {
    HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
}

fn counter_vec(name: &str, help: &str, labels: &[&str]) -> prometheus::Result<IntCounterVec> {
    IntCounterVec::new(Opts::new(name, help), labels)
}

impl Metrics {
    pub fn new() -> prometheus::Result<Self> {
        let m = Self {
            registry: Registry::new(),
            stage_latency: histogram_vec(
                "engram_retrieval_latency_seconds",
                "Time spent per pipeline stage (route, search, validate, rerank, conflicts, assemble, cache).",
                LATENCY_BUCKETS,
                &["stage"],
            )?,
            e2e_latency: histogram(
                "engram_retrieval_e2e_latency_seconds",
                "Retrieve latency as the gateway saw it, every outcome included.",
                LATENCY_BUCKETS,
            )?,
            hit_rate: counter_vec(
                "engram_retrieval_hit_rate",
                "Feedback calls by result: hit = the agent marked a returned memory used or helpful, miss = it did not; rate(hit) over rate(hit + miss) is the hit rate.",
                &["result"],
            )?,
            results: counter_vec(
                "engram_retrieval_results_total",
                "Retrievals by result: records (some returned), empty, cache_hit, skip, error.",
                &["result"],
            )?,
            precision_at_k: histogram(
                "engram_retrieval_precision_at_k",
                "Per feedback call on a known answer: returned memories the agent marked used or helpful, over the k the answer returned.",
                SCORE_BUCKETS,
            )?,
            route: counter_vec(
                "engram_retrieval_route_total",
                "Retrievals by final route (simple, multi_hop, exploratory, skip).",
                &["route"],
            )?,
            retry: counter_vec(
                "engram_retrieval_retry_total",
                "Retry attempts by escalation level (broaden: wider filters; escalate: next route up).",
                &["level"],
            )?,
            candidates: histogram_vec(
                "engram_retrieval_candidates",
                "Candidates per attempt after each stage, per strategy (fused = all strategies merged).",
                COUNT_BUCKETS,
                &["stage", "strategy"],
            )?,
            conflicts: counter_vec(
                "engram_retrieval_conflict_total",
                "Contradictions found among the top records, by resolution.",
                &["resolution"],
            )?,
            selfrag_score: histogram(
                "engram_retrieval_selfrag_score",
                "Cross-encoder relevance of each returned memory it scored (the Stage 3 self-RAG check).",
                SCORE_BUCKETS,
            )?,
            feedback: counter_vec(
                "engram_retrieval_feedback_total",
                "Feedback items accepted, by signal.",
                &["signal"],
            )?,
            circuit_state: IntGaugeVec::new(
                Opts::new(
                    "engram_retrieval_circuit_state",
                    "Circuit breaker per downstream stack: 0 closed, 1 half-open, 2 open.",
                ),
                &["stage"],
            )?,
            downstream_requests: counter_vec(
                "engram_downstream_requests_total",
                "Downstream calls per stack and outcome (ok, error, timeout: the stack's own, deadline: the request's, circuit_open, overloaded, cancelled: the caller hung up); retries count once.",
                &["stack", "outcome"],
            )?,
            downstream_latency: histogram_vec(
                "engram_downstream_latency_seconds",
                "Downstream call latency per stack, retries included.",
                LATENCY_BUCKETS,
                &["stack"],
            )?,
            feedback_dropped: IntGauge::new(
                "engram_feedback_dropped_total",
                "Feedback batches dropped (queue full or store failed) since start.",
            )?,
            cache_bytes: IntGaugeVec::new(
                Opts::new(
                    "engram_cache_bytes",
                    "Bytes held by each answer cache (results, semantic, turns), weighed by encoded size.",
                ),
                &["cache"],
            )?,
            kf_requests: counter_vec(
                "kf_retrieval_requests_total",
                "Knowledge Foundry retrievals by mode (basic, agentic) and outcome (ok, truncated, error).",
                &["mode", "outcome"],
            )?,
            kf_latency: histogram_vec(
                "kf_retrieval_latency_seconds",
                "Knowledge Foundry retrieval latency by mode, every outcome included.",
                LATENCY_BUCKETS,
                &["mode"],
            )?,
            kf_results: histogram_vec(
                "kf_retrieval_results",
                "Results returned per Knowledge Foundry retrieval, by mode.",
                COUNT_BUCKETS,
                &["mode"],
            )?,
            kf_tokens: histogram_vec(
                "kf_retrieval_tokens_used",
                "Tokens used per Knowledge Foundry retrieval (results and agentic steps), by mode.",
                TOKEN_BUCKETS,
                &["mode"],
            )?,
            kf_steps: histogram(
                "kf_retrieval_agentic_steps",
                "Steps per agentic retrieval.",
                COUNT_BUCKETS,
            )?,
        };
        let r = &m.registry;
        r.register(Box::new(m.stage_latency.clone()))?;
        r.register(Box::new(m.e2e_latency.clone()))?;
        r.register(Box::new(m.hit_rate.clone()))?;
        r.register(Box::new(m.results.clone()))?;
        r.register(Box::new(m.precision_at_k.clone()))?;
        r.register(Box::new(m.route.clone()))?;
        r.register(Box::new(m.retry.clone()))?;
        r.register(Box::new(m.candidates.clone()))?;
        r.register(Box::new(m.conflicts.clone()))?;
        r.register(Box::new(m.selfrag_score.clone()))?;
        r.register(Box::new(m.feedback.clone()))?;
        r.register(Box::new(m.circuit_state.clone()))?;
        r.register(Box::new(m.downstream_requests.clone()))?;
        r.register(Box::new(m.downstream_latency.clone()))?;
        r.register(Box::new(m.feedback_dropped.clone()))?;
        r.register(Box::new(m.cache_bytes.clone()))?;
        r.register(Box::new(m.kf_requests.clone()))?;
        r.register(Box::new(m.kf_latency.clone()))?;
        r.register(Box::new(m.kf_results.clone()))?;
        r.register(Box::new(m.kf_tokens.clone()))?;
        r.register(Box::new(m.kf_steps.clone()))?;
        Ok(m)
    }

    /// Handles for one downstream stack, resolved once at start-up.
    pub fn stack(&self, name: &'static str) -> StackMetrics {
        let outcome = |o: &str| self.downstream_requests.with_label_values(&[name, o]);
        StackMetrics {
            inner_opt: Some(StackHandles {
                ok: outcome("ok"),
                error: outcome("error"),
                timeout: outcome("timeout"),
                circuit_open: outcome("circuit_open"),
                overloaded: outcome("overloaded"),
                deadline: outcome("deadline"),
                cancelled: outcome("cancelled"),
                latency: self.downstream_latency.with_label_values(&[name]),
            }),
        }
    }

    /// Lets other gateway modules (demand tracking, working memory) add
    /// their families to the same per-gateway registry.
    pub fn register(&self, c: Box<dyn prometheus::core::Collector>) -> prometheus::Result<()> {
        self.registry.register(c)
    }

    /// Prometheus text of the registry after refreshing scrape-time gauges.
    pub fn render(&self, scrape: &Scrape<'_>) -> String {
        for (name, state) in scrape.breakers {
            self.circuit_state.with_label_values(&[name]).set(*state);
        }
        self.feedback_dropped
            .set(i64::try_from(scrape.feedback_dropped).unwrap_or(i64::MAX));
        for (cache, bytes) in scrape.cache_bytes {
            self.cache_bytes
                .with_label_values(&[cache])
                .set(i64::try_from(*bytes).unwrap_or(i64::MAX));
        }
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::warn!(error = %e, "metrics encoding failed");
        }
        String::from_utf8(buf).unwrap_or_default()
    }

    /// Candidate counts per strategy after Stage 2 (a memory found by two
    /// strategies counts for both) and the fused total.
    pub fn observe_candidates(&self, stage: &'static str, counts: &[(&'static str, usize)]) {
        for (strategy, n) in counts {
            self.candidates
                .with_label_values(&[stage, strategy])
                .observe(*n as f64);
        }
    }

    pub fn observe_retry(&self, attempt: u32) {
        let level = if attempt >= 2 { "escalate" } else { "broaden" };
        self.retry.with_label_values(&[level]).inc();
    }

    /// One feedback call: each signal; a hit when any returned memory was
    /// marked used or helpful; precision@k when the answer is still known
    /// (`judged_opt`: useful returned memories, k).
    pub fn observe_feedback(
        &self,
        signals: &[(&'static str, bool)],
        judged_opt: Option<(usize, usize)>,
    ) {
        if signals.is_empty() {
            return;
        }
        let mut hit = false;
        for (signal, value) in signals {
            self.feedback.with_label_values(&[signal]).inc();
            hit |= matches!(*signal, "used" | "helpful") && *value;
        }
        let result = if hit { "hit" } else { "miss" };
        self.hit_rate.with_label_values(&[result]).inc();
        if let Some((useful, k)) = judged_opt.filter(|(_, k)| *k > 0) {
            self.precision_at_k.observe(useful.min(k) as f64 / k as f64);
        }
    }

    /// Records one finished Knowledge Foundry request.
    pub fn observe_foundry(&self, o: &FoundryOutcome) {
        self.kf_requests
            .with_label_values(&[o.mode, o.outcome])
            .inc();
        self.kf_latency
            .with_label_values(&[o.mode])
            .observe(o.elapsed.as_secs_f64());
        if o.outcome == "error" {
            return;
        }
        self.kf_results
            .with_label_values(&[o.mode])
            .observe(o.results as f64);
        self.kf_tokens
            .with_label_values(&[o.mode])
            .observe(f64::from(o.tokens));
        if o.mode == "agentic" {
            self.kf_steps.observe(o.steps as f64);
        }
    }

    /// Records one finished retrieval (any outcome) and emits its log event.
    pub fn observe_retrieval(&self, r: &RetrievalOutcome<'_>) {
        self.e2e_latency.observe(r.elapsed.as_secs_f64());
        let Ok(resp) = r.result else {
            self.results.with_label_values(&["error"]).inc();
            tracing::warn!(
                query_id = r.query_id_opt.unwrap_or_default(),
                tenant = %r.identity.tenant,
                agent_id = %r.identity.agent_id,
                latency_ms = r.elapsed.as_secs_f64() * 1000.0,
                query = r.query_log_opt.as_deref(),
                error = r.result.err().map(String::as_str).unwrap_or_default(),
                "retrieval failed"
            );
            return;
        };
        let route = route_label(resp.route);
        self.route.with_label_values(&[route]).inc();
        let skip = SkipReason::try_from(resp.skip_reason).unwrap_or(SkipReason::None);
        let result = match skip {
            SkipReason::CacheHit => "cache_hit",
            SkipReason::None if resp.records.is_empty() => "empty",
            SkipReason::None => "records",
            _ => "skip",
        };
        self.results.with_label_values(&[result]).inc();
        for s in &resp.stage_latencies {
            self.stage_latency
                .with_label_values(&[stage_label(&s.stage)])
                .observe(s.ms / 1000.0);
        }
        for c in &resp.conflicts {
            self.conflicts
                .with_label_values(&[resolution_label(c.resolution)])
                .inc();
        }
        // The cross-encoder's verdict on what was returned (records it did
        // not score, or answers without it, add nothing).
        let relevances =
            (resp.records.iter()).filter_map(|s| s.provenance.as_ref().and_then(|p| p.relevance));
        for relevance in relevances {
            self.selfrag_score.observe(f64::from(relevance));
        }
        let stage_latencies: serde_json::Map<String, serde_json::Value> = resp
            .stage_latencies
            .iter()
            .map(|s| {
                (
                    s.stage.clone(),
                    serde_json::json!((s.ms * 1000.0).round() / 1000.0),
                )
            })
            .collect();
        let candidate_counts: serde_json::Map<String, serde_json::Value> = r
            .candidate_counts
            .iter()
            .map(|(k, v)| ((*k).to_string(), serde_json::json!(v)))
            .collect();
        tracing::info!(
            query_id = %crate::receipt::answer_id(&resp.query_id),
            tenant = %r.identity.tenant,
            agent_id = %r.identity.agent_id,
            route,
            skip_reason = skip_label(skip),
            stage_latencies = %serde_json::Value::Object(stage_latencies),
            candidate_counts = %serde_json::Value::Object(candidate_counts),
            total_candidates = resp.total_candidates,
            result_count = resp.records.len(),
            retry_count = resp.retry_count,
            retrieval_confidence = resp.retrieval_confidence,
            conflicts_detected = resp.conflicts.len(),
            degraded = %resp.degraded_stages.join(","),
            latency_ms = resp.latency_ms,
            query = r.query_log_opt.as_deref(),
            "retrieval"
        );
    }
}

/// Downstream stack handles; the default records nothing (unit tests of the
/// resilience stack need no registry).
#[derive(Clone, Default)]
pub struct StackMetrics {
    inner_opt: Option<StackHandles>,
}

#[derive(Clone)]
struct StackHandles {
    ok: IntCounter,
    error: IntCounter,
    timeout: IntCounter,
    circuit_open: IntCounter,
    overloaded: IntCounter,
    deadline: IntCounter,
    cancelled: IntCounter,
    latency: Histogram,
}

/// How a downstream call ended, for the outcome label.
#[derive(Debug, Clone, Copy)]
pub enum CallOutcome {
    Ok,
    Error,
    Timeout,
    CircuitOpen,
    Overloaded,
    /// The request's deadline passed before the call finished.
    Deadline,
    /// The caller dropped the call before it finished.
    Cancelled,
}

impl StackMetrics {
    pub fn record(&self, outcome: CallOutcome, elapsed: Duration) {
        let Some(h) = &self.inner_opt else {
            return;
        };
        h.latency.observe(elapsed.as_secs_f64());
        match outcome {
            CallOutcome::Ok => h.ok.inc(),
            CallOutcome::Error => h.error.inc(),
            CallOutcome::Timeout => h.timeout.inc(),
            CallOutcome::CircuitOpen => h.circuit_open.inc(),
            CallOutcome::Overloaded => h.overloaded.inc(),
            CallOutcome::Deadline => h.deadline.inc(),
            CallOutcome::Cancelled => h.cancelled.inc(),
        }
    }
}

/// Everything [`Metrics::observe_retrieval`] needs about one call.
pub struct RetrievalOutcome<'a> {
    pub identity: &'a Identity,
    pub result: Result<&'a RetrieveResponse, &'a String>,
    pub query_id_opt: Option<&'a str>,
    pub elapsed: Duration,
    pub candidate_counts: &'a [(&'static str, usize)],
    /// Already scrubbed (or None when `log.query_text` is off).
    pub query_log_opt: Option<String>,
}

fn route_label(route: i32) -> &'static str {
    match QueryRoute::try_from(route) {
        Ok(QueryRoute::Simple) => "simple",
        Ok(QueryRoute::MultiHop) => "multi_hop",
        Ok(QueryRoute::Exploratory) => "exploratory",
        Ok(QueryRoute::Skip) => "skip",
        _ => "unspecified",
    }
}

fn resolution_label(r: i32) -> &'static str {
    match ConflictResolution::try_from(r) {
        Ok(ConflictResolution::Recency) => "recency",
        Ok(ConflictResolution::Confidence) => "confidence",
        Ok(ConflictResolution::Unresolved) => "unresolved",
        _ => "unspecified",
    }
}

fn skip_label(s: SkipReason) -> &'static str {
    match s {
        SkipReason::None => "none",
        SkipReason::CacheHit => "cache_hit",
        SkipReason::ContextSufficient => "context_sufficient",
        SkipReason::NoRetrievalNeeded => "no_retrieval_needed",
    }
}

/// Stage names are produced by the pipeline itself; anything unexpected is
/// folded so a future stage cannot add unbounded series.
fn stage_label(stage: &str) -> &'static str {
    match stage {
        "route" => "route",
        "search" => "search",
        "validate" => "validate",
        "rerank" => "rerank",
        "hop" => "hop",
        "current" => "current",
        "chain" => "chain",
        "conflicts" => "conflicts",
        "assemble" => "assemble",
        "cache" => "cache",
        _ => "other",
    }
}

/// Bounded strategy label for a fusion hit.
pub fn strategy_label(s: &str) -> &'static str {
    crate::pipeline::strategy::Strategy::of(s).map_or("other", |s| s.name())
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use engram_common::AccessLevel;
    use engram_proto::{ScoredMemory, StageLatency};

    use super::*;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("buf").extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn one_retrieval_is_one_json_event_and_counted() {
        let m = Metrics::new().expect("metrics");
        let buf = Buf::default();
        let writer = buf.clone();
        let sub = tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_writer(move || writer.clone())
            .finish();
        let identity = Identity {
            tenant: "t1".into(),
            agent_id: "agent-7".into(),
            trust: AccessLevel::Public,
        };
        let resp = RetrieveResponse {
            query_id: "q-1".into(),
            route: QueryRoute::MultiHop as i32,
            records: vec![ScoredMemory::default()],
            retrieval_confidence: 0.7,
            retry_count: 1,
            stage_latencies: vec![StageLatency {
                stage: "search".into(),
                ms: 12.5,
            }],
            ..Default::default()
        };
        let query = "email bob@example.com about 123456789";
        tracing::subscriber::with_default(sub, || {
            m.observe_retrieval(&RetrievalOutcome {
                identity: &identity,
                result: Ok(&resp),
                query_id_opt: None,
                elapsed: Duration::from_millis(20),
                candidate_counts: &[("vector", 4), ("fused", 5)],
                query_log_opt: engram_common::scrub::query_for_log(query, true),
            });
        });
        let text = String::from_utf8(buf.0.lock().expect("buf").clone()).expect("utf8");
        assert!(
            !text.contains("bob@") && !text.contains("123456789"),
            "{text}"
        );
        let line: serde_json::Value = serde_json::from_str(text.trim()).expect("one json line");
        assert_eq!(line["message"], "retrieval");
        assert_eq!(line["route"], "multi_hop");
        assert_eq!(line["result_count"], 1);
        assert_eq!(line["retry_count"], 1);
        let r = m.render(&Scrape {
            breakers: &[("graph.ppr", 2)],
            feedback_dropped: 2,
            ..Default::default()
        });
        assert!(
            r.contains("engram_retrieval_route_total{route=\"multi_hop\"} 1"),
            "{r}"
        );
        assert!(
            r.contains("engram_retrieval_results_total{result=\"records\"} 1"),
            "{r}"
        );
        assert!(
            r.contains("engram_retrieval_circuit_state{stage=\"graph.ppr\"} 2"),
            "{r}"
        );
        assert!(
            r.contains("engram_retrieval_latency_seconds_count{stage=\"search\"} 1"),
            "{r}"
        );
        assert!(!r.contains("bob"), "{r}");
    }
}
