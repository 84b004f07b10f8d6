//! The gRPC front: authentication, boundary validation, the pipeline driver
//! (skip checks, caches, attempts with escalation, the ceiling) and the
//! MemoryService write path.

use std::sync::Arc;
use std::time::Duration;

use engram_common::{AccessLevel, Identity, Settings};
use engram_proto::memory_service_server::MemoryService;
use engram_proto::retrieval_service_server::RetrievalService;
use engram_proto::{
    AddEdgesRequest, AddEdgesResponse, ContradictionsRequest, DeleteRequest, DeleteResponse,
    DroppedCandidate, EmbedRequest, FeedbackRequest, FeedbackResponse, FeedbackSignal, Filters,
    GetRequest, GetResponse, QueryRoute, RetrieveRequest, RetrieveResponse, SkipReason,
    StageLatency, StoredFeedback, TimeRange, UpsertRequest, UpsertResponse,
};
use prost_types::Timestamp;
use tokio::time::Instant;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::assembly;
use crate::auth::Authenticator;
use crate::cache::{CacheKey, Caches};
use crate::demand::{Demand, Shape, Surface};
use crate::downstream::{DownstreamError, Downstreams, call};
use crate::error::Error;
use crate::feedback::{FeedbackQueue, QUEUE_CAPACITY};
use crate::llm::LlmClient;
use crate::router::{self, Mode, Query, Raw, Route};
use crate::search::{self, Plan};
use crate::validation;
use crate::working::{self, WorkingMemory, WorkingWrite};

/// Below this, an attempt's answer is "low" and the next attempt broadens.
const LOW_CONFIDENCE: f32 = 0.05;
/// Time kept back from Stage 2 so a partial answer can still be assembled.
const ASSEMBLY_RESERVE: Duration = Duration::from_millis(100);
const MAX_WRITE_BATCH: usize = 1000;
const MAX_EDGE_BATCH: usize = 10_000;
const MAX_FEEDBACK_ITEMS: usize = 1000;

#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    settings: Settings,
    ds: Downstreams,
    auth: Authenticator,
    caches: Caches,
    feedback: FeedbackQueue,
    llm_opt: Option<LlmClient>,
    working: WorkingMemory,
    demand: Demand,
}

/// What one attempt produced.
struct Attempt {
    route: Route,
    records: Vec<engram_proto::ScoredMemory>,
    conflicts: Vec<engram_proto::ConflictPair>,
    total: u32,
    confidence: f32,
    degraded: Vec<String>,
    dropped: Vec<DroppedCandidate>,
    query_embedding_opt: Option<Vec<f32>>,
    /// Per stage/strategy counts, for the retrieval log event.
    candidate_counts: Vec<(&'static str, usize)>,
}

/// Candidates per strategy after Stage 2 plus the fused total, observed in
/// `engram_retrieval_candidates{stage="search"}`.
fn search_counts(
    m: &crate::metrics::Metrics,
    c: &search::Candidates,
) -> Vec<(&'static str, usize)> {
    let mut counts: Vec<(&'static str, usize)> = Vec::new();
    for cand in &c.candidates {
        for hit in &cand.fused.hits {
            let s = crate::metrics::strategy_label(&hit.strategy);
            match counts.iter_mut().find(|(k, _)| *k == s) {
                Some((_, n)) => *n += 1,
                None => counts.push((s, 1)),
            }
        }
    }
    counts.push(("fused", c.candidates.len()));
    m.observe_candidates("search", &counts);
    counts
}

/// One span per pipeline stage; downstream call spans nest under it, so a
/// trace shows where a retrieval spent its time.
fn stage_span(stage: &'static str) -> tracing::Span {
    tracing::info_span!("stage", stage, otel.name = %format_args!("stage.{stage}"))
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

fn ds_err(service: &'static str, e: DownstreamError) -> Error {
    match e {
        DownstreamError::Status(status) => Error::Downstream { service, status },
        other => Error::DownstreamUnavailable {
            service,
            reason: other.to_string(),
        },
    }
}

pub use engram_common::server::grpc_timeout;

/// The route of retry `attempt` (>= 1) and whether the evidence fuses it,
/// given the route the best attempt resolved to and the previous attempt's
/// plan (`None` when a downstream was degraded in it, so repeating it may
/// help). From the third attempt on the route goes one step up; a plan
/// identical to the previous one goes up instead of running again, and when
/// there is no step up left there is nothing new to try (`None`).
fn escalate(
    attempt: u32,
    mut route: Route,
    mut by_evidence: bool,
    filters: &Filters,
    previous_opt: Option<&(Route, bool, Filters)>,
) -> Option<(Route, bool)> {
    if attempt >= 2 {
        route = route.next_up();
        by_evidence = false;
    }
    let same = |route: Route, by_evidence: bool| {
        previous_opt.is_some_and(|(r, e, f)| *r == route && *e == by_evidence && f == filters)
    };
    while same(route, by_evidence) {
        if route.next_up() == route && !by_evidence {
            return None;
        }
        route = route.next_up();
        by_evidence = false;
    }
    Some((route, by_evidence))
}

/// Retry escalation: wider time window (2×, centred), lower confidence bar,
/// consolidated memories included.
fn broaden(f: &Filters) -> Filters {
    let mut f = f.clone();
    f.min_confidence = (f.min_confidence - 0.2).max(0.0);
    f.include_consolidated = true;
    if let Some(TimeRange { start, end }) = &mut f.time_range {
        let now = chrono::Utc::now().timestamp();
        let s = start.as_ref().map(|t| t.seconds);
        let e = end.as_ref().map(|t| t.seconds);
        match (s, e) {
            (Some(s), Some(e)) => {
                let half = (e - s) / 2;
                *start = Some(Timestamp {
                    seconds: s - half,
                    nanos: 0,
                });
                *end = Some(Timestamp {
                    seconds: e + half,
                    nanos: 0,
                });
            }
            (Some(s), None) => {
                *start = Some(Timestamp {
                    seconds: s - (now - s).max(0),
                    nanos: 0,
                });
            }
            (None, Some(_)) => {
                *end = None;
            }
            (None, None) => {}
        }
    }
    f
}

impl Gateway {
    pub fn new(settings: Settings) -> anyhow::Result<Self> {
        let ds = Downstreams::connect(&settings)?;
        Self::with_downstreams(settings, ds)
    }

    pub fn with_downstreams(settings: Settings, ds: Downstreams) -> anyhow::Result<Self> {
        let p = &settings.pipeline;
        let caches = Caches::new(Duration::from_millis(p.cache_ttl_ms), p.cache_similarity);
        let feedback = FeedbackQueue::spawn(ds.clone(), QUEUE_CAPACITY);
        let auth = Authenticator::new(&settings.auth);
        let llm_opt = LlmClient::from_settings(&settings.llm).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "llm client unavailable, rule-based paths only");
            None
        });
        let working = WorkingMemory::new(&settings.working)?;
        working.register(&ds.metrics)?;
        let demand = Demand::new(
            settings.working.demand_threshold,
            settings.working.max_demand_shapes,
        )?;
        demand.register(&ds.metrics)?;
        Ok(Self {
            inner: Arc::new(Inner {
                settings,
                ds,
                auth,
                caches,
                feedback,
                llm_opt,
                working,
                demand,
            }),
        })
    }

    /// Layer 6's in-process session store.
    pub fn working(&self) -> &WorkingMemory {
        &self.inner.working
    }

    /// Retrieval shape counters (every Retrieve and GetMemory).
    pub fn demand(&self) -> &Demand {
        &self.inner.demand
    }

    /// The optional LLM endpoint; `None` unless `[llm] endpoint_opt` is set.
    pub fn llm(&self) -> Option<&LlmClient> {
        self.inner.llm_opt.as_ref()
    }

    pub fn downstreams(&self) -> &Downstreams {
        &self.inner.ds
    }

    pub fn feedback_dropped(&self) -> u64 {
        self.inner
            .feedback
            .dropped
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Prometheus text for the pipeline, the downstream stacks and the
    /// feedback queue. Labels come from closed sets: never query text or ids.
    pub fn metrics_text(&self) -> String {
        let ds = &self.inner.ds;
        let phases: Vec<_> = ds.breakers.iter().map(|(n, b)| (*n, b.phase())).collect();
        ds.metrics.render(&phases, self.feedback_dropped())
    }

    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// Shared with the Knowledge Foundry and HTTP fronts so every surface
    /// accepts exactly the same credentials.
    pub fn authenticate(&self, md: &MetadataMap) -> Result<Identity, Error> {
        self.inner.auth.authenticate(md)
    }

    pub fn deadline(&self, md: &MetadataMap, start: Instant) -> Instant {
        let ceiling = Duration::from_millis(self.inner.settings.pipeline.ceiling_ms);
        let budget = grpc_timeout(md)
            // Leave a little for the answer to travel back.
            .map(|t| t.saturating_sub(Duration::from_millis(20)).min(ceiling))
            .unwrap_or(ceiling);
        start + budget
    }

    fn skipped(&self, query_id: String, reason: SkipReason, start: Instant) -> RetrieveResponse {
        RetrieveResponse {
            route: QueryRoute::Skip as i32,
            skip_reason: reason as i32,
            query_id,
            latency_ms: ms_since(start),
            ..Default::default()
        }
    }

    /// The whole pipeline for an authenticated, validated query; every
    /// outcome is counted and logged once, and its shape counted as demand.
    pub async fn retrieve(
        &self,
        identity: Identity,
        q: Query,
        start: Instant,
        deadline: Instant,
    ) -> Result<RetrieveResponse, Error> {
        let tenant = identity.tenant.clone();
        let trust = identity.trust;
        let requested = Shape::requested_of_retrieve(&q);
        let r = self.retrieve_unobserved(identity, q, start, deadline).await;
        if let Ok(resp) = &r
            && resp.skip_reason != SkipReason::ContextSufficient as i32
            && resp.skip_reason != SkipReason::NoRetrievalNeeded as i32
        {
            let shape = Shape {
                requested,
                observed: Shape::observed_of(&resp.records),
            };
            self.inner
                .demand
                .observe(&tenant, trust, Surface::Retrieve, shape);
        }
        r
    }

    /// [`Self::retrieve`] without the demand count, for surfaces (GetMemory)
    /// that count their own shape.
    pub(crate) async fn retrieve_unobserved(
        &self,
        identity: Identity,
        q: Query,
        start: Instant,
        deadline: Instant,
    ) -> Result<RetrieveResponse, Error> {
        let query_log_opt =
            engram_common::scrub::query_for_log(&q.text, self.inner.settings.log.query_text);
        let who = identity.clone();
        let mut candidate_counts = Vec::new();
        let r = self
            .run_retrieve(identity, q, start, deadline, &mut candidate_counts)
            .await;
        let err_opt = r.as_ref().err().map(ToString::to_string);
        let result = match (&r, &err_opt) {
            (Ok(resp), _) => Ok(resp),
            (Err(_), Some(e)) => Err(e),
            (Err(_), None) => return r,
        };
        self.inner
            .ds
            .metrics
            .observe_retrieval(&crate::metrics::RetrievalOutcome {
                identity: &who,
                result,
                query_id_opt: None,
                elapsed: start.elapsed(),
                candidate_counts: &candidate_counts,
                query_log_opt,
            });
        r
    }

    async fn run_retrieve(
        &self,
        identity: Identity,
        q: Query,
        start: Instant,
        deadline: Instant,
        candidate_counts: &mut Vec<(&'static str, usize)>,
    ) -> Result<RetrieveResponse, Error> {
        let query_id = uuid::Uuid::new_v4().to_string();
        let caches = &self.inner.caches;
        if let Some(turn) = &q.turn_id_opt
            && let Some(mut r) = caches.get_turn(&identity, turn)
        {
            r.latency_ms = ms_since(start);
            return Ok(r);
        }
        if q.context_sufficient {
            return Ok(self.skipped(query_id, SkipReason::ContextSufficient, start));
        }
        if q.mode == Mode::Auto && router::no_retrieval_needed(&q.text) {
            return Ok(self.skipped(query_id, SkipReason::NoRetrievalNeeded, start));
        }
        let identity = Arc::new(identity);
        let key = CacheKey::new(&identity, &q);
        if !q.no_cache
            && let Some(hit) = self.cache_lookup(&identity, &q, &key, deadline).await
        {
            let mut r = hit;
            r.route = QueryRoute::Skip as i32;
            r.skip_reason = SkipReason::CacheHit as i32;
            r.query_id = query_id;
            r.retry_count = 0;
            r.latency_ms = ms_since(start);
            r.stage_latencies = vec![StageLatency {
                stage: "cache".into(),
                ms: ms_since(start),
            }];
            return Ok(r);
        }

        let outer = deadline + Duration::from_millis(50);
        let run = self.run_attempts(&identity, &q, start, deadline);
        let (best, retry_count, timings, ceiling_hit) =
            match tokio::time::timeout_at(outer, run).await {
                Ok(r) => r?,
                Err(_) => return Err(Error::DeadlineExceeded),
            };
        let mut confidence = best.confidence;
        if ceiling_hit || !best.degraded.is_empty() {
            confidence *= 0.5;
        }
        let (context_block, context_tokens) = if q.token_budget > 0 {
            assembly::pack_context(&best.records, q.token_budget)
        } else {
            (String::new(), 0)
        };
        let cacheable = best.degraded.is_empty() && !ceiling_hit;
        *candidate_counts = best.candidate_counts;
        let response = RetrieveResponse {
            records: best.records,
            route: best.route.to_proto() as i32,
            total_candidates: best.total,
            retrieval_confidence: confidence,
            conflicts: best.conflicts,
            retry_count,
            skip_reason: SkipReason::None as i32,
            latency_ms: ms_since(start),
            stage_latencies: timings,
            degraded_stages: best.degraded,
            query_id,
            context_block,
            context_tokens,
            dropped: if q.explain { best.dropped } else { Vec::new() },
        };
        if cacheable && !q.no_cache {
            caches.put(&key, &identity.tenant, &response, best.query_embedding_opt);
        }
        if let Some(turn) = &q.turn_id_opt {
            caches.put_turn(&identity, turn, &response);
        }
        Ok(response)
    }

    async fn cache_lookup(
        &self,
        identity: &Arc<Identity>,
        q: &Query,
        key: &CacheKey,
        deadline: Instant,
    ) -> Option<RetrieveResponse> {
        let caches = &self.inner.caches;
        if let Some(hit) = caches.get_exact(key, &identity.tenant) {
            return Some(hit);
        }
        if !caches.has_semantic(key, &identity.tenant) {
            return None;
        }
        let embed_deadline = deadline.min(
            Instant::now() + Duration::from_millis(self.inner.settings.pipeline.vector_timeout_ms),
        );
        let req = EmbedRequest {
            texts: vec![q.text.clone()],
        };
        match tokio::time::timeout_at(embed_deadline, call(&self.inner.ds.embed, identity, req))
            .await
        {
            Ok(Ok(r)) => {
                let e = r.embeddings.into_iter().next()?;
                caches.get_semantic(key, &identity.tenant, &e.values)
            }
            _ => None,
        }
    }

    /// Attempts with escalation; returns the best attempt, retries used,
    /// stage timings and whether the ceiling cut the work short.
    async fn run_attempts(
        &self,
        identity: &Arc<Identity>,
        q: &Query,
        start: Instant,
        deadline: Instant,
    ) -> Result<(Attempt, u32, Vec<StageLatency>, bool), Error> {
        let p = &self.inner.settings.pipeline;
        let mut timings = Vec::new();
        let t = Instant::now();
        let mut filters = q.filters.clone();
        filters.decay_floor = self.inner.settings.search.decay_floor;
        let (mut route, raw_opt) = match q.mode {
            Mode::Auto => (router::classify(&q.text), None),
            Mode::Route(r) => (r, None),
            Mode::Raw(raw) => (Route::Simple, Some(raw)),
        };
        if matches!(raw_opt, Some(Raw::Graph)) {
            route = Route::MultiHop;
        } else if matches!(raw_opt, Some(Raw::Hybrid)) {
            route = Route::Exploratory;
        }
        timings.push(StageLatency {
            stage: "route".into(),
            ms: ms_since(t),
        });
        if let Some(raw) = raw_opt {
            let a = self
                .raw_attempt(identity, q, raw, route, &filters, deadline, &mut timings)
                .await?;
            return Ok((a, 0, timings, Instant::now() >= deadline));
        }
        let max_attempts = p.max_attempts.max(1);
        let mut by_evidence = q.mode == Mode::Auto;
        let mut best: Option<Attempt> = None;
        let mut retries = 0;
        // What the previous attempt ran (its resolved route), unless a
        // downstream was degraded in it: the same plan again would only
        // repeat its answer at full cost.
        let mut repeat_of: Option<(Route, bool, Filters)> = None;
        let mut memo = validation::ScoreMemo::default();
        for attempt in 0..max_attempts {
            if attempt > 0 {
                if Instant::now() + ASSEMBLY_RESERVE >= deadline {
                    break;
                }
                filters = broaden(&filters);
                if let Some(b) = &best {
                    // Escalate from where the evidence put the query. An
                    // evidence plan's route is a fixed point of
                    // `evidence::route`, so it resolves to itself again.
                    route = b.route;
                }
                match escalate(attempt, route, by_evidence, &filters, repeat_of.as_ref()) {
                    Some((r, e)) => (route, by_evidence) = (r, e),
                    None => break,
                }
                retries += 1;
                self.inner.ds.metrics.observe_retry(attempt);
                tracing::debug!(attempt, route = ?route, "broadening retrieval");
            }
            match self
                .attempt(
                    identity,
                    q,
                    route,
                    by_evidence,
                    &filters,
                    deadline,
                    &mut timings,
                    &mut memo,
                )
                .await
            {
                Ok(a) => {
                    repeat_of = a
                        .degraded
                        .is_empty()
                        .then(|| (a.route, by_evidence, filters.clone()));
                    let good = !a.records.is_empty() && a.confidence >= LOW_CONFIDENCE;
                    let better = best.as_ref().is_none_or(|b| {
                        (b.records.is_empty() && !a.records.is_empty())
                            || (!a.records.is_empty() && a.confidence > b.confidence)
                    });
                    if better {
                        best = Some(a);
                    }
                    if good {
                        break;
                    }
                }
                // A later attempt failing keeps the earlier answer.
                Err(e) if best.is_some() => {
                    tracing::warn!(error = %e, "retry attempt failed");
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        let _ = start;
        let best = best.ok_or(Error::DeadlineExceeded)?;
        Ok((best, retries, timings, Instant::now() >= deadline))
    }

    #[allow(clippy::too_many_arguments)]
    async fn raw_attempt(
        &self,
        identity: &Arc<Identity>,
        q: &Query,
        raw: Raw,
        route: Route,
        filters: &Filters,
        deadline: Instant,
        timings: &mut Vec<StageLatency>,
    ) -> Result<Attempt, Error> {
        let p = &self.inner.settings.pipeline;
        let t = Instant::now();
        // HYBRID is the fusion stage alone: all three strategies, weighted by
        // the evidence route, without the cross-encoder or retries.
        let plan = match raw {
            Raw::Hybrid => Plan::by_evidence(router::classify(&q.text), p, q.limit),
            _ => Plan::raw(raw, q.limit, p.rrf_k),
        };
        let c = search::candidates(
            &self.inner.ds,
            p,
            identity,
            &q.text,
            &[], // raw modes are the single strategy, without HyDE
            filters,
            &plan,
            stage2_deadline(deadline),
        )
        .instrument(stage_span("search"))
        .await
        .map_err(|e| deadline_or(e, stage2_deadline(deadline)))?;
        timings.push(StageLatency {
            stage: "search".into(),
            ms: ms_since(t),
        });
        let mut candidate_counts = search_counts(&self.inner.ds.metrics, &c);
        let t = Instant::now();
        let mut dropped = Vec::new();
        let checked = validation::static_checks(
            c.candidates,
            identity,
            filters,
            filters.decay_floor,
            &mut dropped,
        );
        // Raw modes keep the strategy's own order and scores.
        let records: Vec<_> = checked
            .into_iter()
            .take(q.limit as usize)
            .map(|c| {
                let s = c.cand.fused.rrf;
                assembly::to_record(c, s)
            })
            .collect();
        timings.push(StageLatency {
            stage: "validate".into(),
            ms: ms_since(t),
        });
        let confidence = confidence_of(&records, c.max_rrf);
        self.inner
            .ds
            .metrics
            .observe_candidates("assemble", &[("fused", records.len())]);
        candidate_counts.push(("returned", records.len()));
        Ok(Attempt {
            candidate_counts,
            route: c.route_opt.unwrap_or(route),
            records,
            conflicts: Vec::new(),
            total: c.total as u32,
            confidence,
            degraded: c.degraded.iter().map(|s| s.to_string()).collect(),
            dropped,
            query_embedding_opt: c.query_embedding_opt,
        })
    }

    #[allow(clippy::too_many_arguments)]
    async fn attempt(
        &self,
        identity: &Arc<Identity>,
        q: &Query,
        route: Route,
        by_evidence: bool,
        filters: &Filters,
        deadline: Instant,
        timings: &mut Vec<StageLatency>,
        memo: &mut validation::ScoreMemo,
    ) -> Result<Attempt, Error> {
        let p = &self.inner.settings.pipeline;
        let ds = &self.inner.ds;
        let t = Instant::now();
        let plan = if by_evidence {
            Plan::by_evidence(route, p, q.limit)
        } else {
            Plan::for_route(route, p, q.limit)
        };
        let search_deadline = stage2_deadline(deadline);
        let c = search::candidates(
            ds,
            p,
            identity,
            &q.text,
            &q.hypotheses,
            filters,
            &plan,
            search_deadline,
        )
        .instrument(stage_span("search"))
        .await
        .map_err(|e| deadline_or(e, search_deadline))?;
        timings.push(StageLatency {
            stage: "search".into(),
            ms: ms_since(t),
        });
        let route = c.route_opt.unwrap_or(route);
        let metrics = &self.inner.ds.metrics;
        let mut candidate_counts = search_counts(metrics, &c);
        let mut degraded: Vec<String> = c.degraded.iter().map(|s| s.to_string()).collect();

        let t = Instant::now();
        let mut dropped = Vec::new();
        let mut checked = validation::static_checks(
            c.candidates,
            identity,
            filters,
            filters.decay_floor,
            &mut dropped,
        );
        timings.push(StageLatency {
            stage: "validate".into(),
            ms: ms_since(t),
        });
        metrics.observe_candidates("validate", &[("fused", checked.len())]);
        candidate_counts.push(("validated", checked.len()));
        if !q.skip_rerank && !checked.is_empty() {
            let t = Instant::now();
            let rerank_deadline = (Instant::now() + Duration::from_millis(p.rerank_timeout_ms))
                .min(
                    deadline
                        .checked_sub(Duration::from_millis(50))
                        .unwrap_or(deadline),
                );
            let ok = validation::relevance(
                ds,
                identity,
                &q.text,
                &mut checked,
                p.rerank_top_n,
                p.relevance_threshold,
                rerank_deadline,
                &mut dropped,
                memo,
            )
            .instrument(stage_span("rerank"))
            .await;
            if !ok {
                degraded.push("rerank".into());
            }
            metrics.observe_candidates("rerank", &[("fused", checked.len())]);
            candidate_counts.push(("reranked", checked.len()));
            timings.push(StageLatency {
                stage: "rerank".into(),
                ms: ms_since(t),
            });
        }

        let t = Instant::now();
        let ranked = assembly::rank(checked, p.rerank_blend_k, p.rerank_weight);
        let ids: Vec<String> = ranked
            .iter()
            .take((q.limit as usize).saturating_mul(2))
            .map(|(c, _)| c.cand.memory.id.clone())
            .collect();
        let mut conflicts = Vec::new();
        let mut losers = Default::default();
        if degraded.iter().any(|d| d == search::GRAPH) {
            // The graph just failed this query: asking it again would only
            // spend another timeout.
            degraded.push("conflicts".into());
        } else if ids.len() >= 2 {
            let conflicts_deadline = (Instant::now() + Duration::from_millis(p.graph_timeout_ms))
                .min(
                    deadline
                        .checked_sub(Duration::from_millis(20))
                        .unwrap_or(deadline),
                );
            let req = ContradictionsRequest { memory_ids: ids };
            match tokio::time::timeout_at(
                conflicts_deadline,
                call(&ds.contradictions, identity, req),
            )
            .instrument(stage_span("conflicts"))
            .await
            {
                Ok(Ok(r)) => {
                    (conflicts, losers) = assembly::resolve_conflicts(&ranked, &r.pairs);
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "conflict detection degraded");
                    degraded.push("conflicts".into());
                }
                Err(_) => degraded.push("conflicts".into()),
            }
        }
        timings.push(StageLatency {
            stage: "conflicts".into(),
            ms: ms_since(t),
        });
        let t = Instant::now();
        let records = assembly::assemble(ranked, &losers, q.limit as usize, &mut dropped);
        let confidence = confidence_of(&records, c.max_rrf);
        timings.push(StageLatency {
            stage: "assemble".into(),
            ms: ms_since(t),
        });
        metrics.observe_candidates("assemble", &[("fused", records.len())]);
        candidate_counts.push(("returned", records.len()));
        Ok(Attempt {
            candidate_counts,
            route,
            records,
            conflicts,
            total: c.total as u32,
            confidence,
            degraded,
            dropped,
            query_embedding_opt: c.query_embedding_opt,
        })
    }

    fn check_write_trust(
        identity: &Identity,
        level: i32,
        field: &'static str,
    ) -> Result<(), Error> {
        let level = AccessLevel::from_proto(level)
            .ok_or_else(|| Error::invalid(field, format!("unknown access level {level}")))?;
        if level > identity.trust {
            return Err(Error::PermissionDenied(format!(
                "cannot write {} memories with trust level {}",
                level.name(),
                identity.trust.name()
            )));
        }
        Ok(())
    }
}

/// Stage 2 stops a little before the ceiling so a partial answer can still
/// be validated and assembled; the reserve shrinks with short client deadlines.
fn stage2_deadline(deadline: Instant) -> Instant {
    let left = deadline.saturating_duration_since(Instant::now());
    deadline
        .checked_sub(ASSEMBLY_RESERVE.min(left / 5))
        .unwrap_or(deadline)
}

/// Strategies that all "failed" because the pipeline ran out of time are a
/// deadline, not an open circuit.
fn deadline_or(e: Error, stage2_deadline: Instant) -> Error {
    if matches!(e, Error::RetrievalCircuitOpen) && Instant::now() >= stage2_deadline {
        Error::DeadlineExceeded
    } else {
        e
    }
}

/// Mean cross-encoder relevance of the top three when it ran, else the top
/// record's fused score relative to the best reachable one.
fn confidence_of(records: &[engram_proto::ScoredMemory], max_rrf: f32) -> f32 {
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

#[tonic::async_trait]
impl RetrievalService for Gateway {
    async fn retrieve(
        &self,
        request: Request<RetrieveRequest>,
    ) -> Result<Response<RetrieveResponse>, Status> {
        let start = Instant::now();
        let identity = self.authenticate(request.metadata())?;
        let deadline = self.deadline(request.metadata(), start);
        let q = Query::try_from(request.into_inner())?;
        Ok(Response::new(
            self.retrieve(identity, q, start, deadline).await?,
        ))
    }

    async fn feedback(
        &self,
        request: Request<FeedbackRequest>,
    ) -> Result<Response<FeedbackResponse>, Status> {
        let identity = self.authenticate(request.metadata())?;
        let FeedbackRequest { query_id, items } = request.into_inner();
        if query_id.is_empty() || query_id.len() > 64 {
            return Err(Error::invalid("query_id", "must be 1..=64 characters").into());
        }
        if items.is_empty() || items.len() > MAX_FEEDBACK_ITEMS {
            return Err(Error::invalid(
                "items",
                format!("must hold 1..={MAX_FEEDBACK_ITEMS} items"),
            )
            .into());
        }
        let mut stored = Vec::with_capacity(items.len());
        for item in items {
            let signal = match FeedbackSignal::try_from(item.signal) {
                Ok(FeedbackSignal::Used) => "used",
                Ok(FeedbackSignal::Helpful) => "helpful",
                Ok(FeedbackSignal::Sufficient) => "sufficient",
                _ => {
                    return Err(Error::invalid(
                        "items.signal",
                        "must be used, helpful or sufficient",
                    )
                    .into());
                }
            };
            if item.memory_id.is_empty() || item.memory_id.len() > 64 {
                return Err(Error::invalid("items.memory_id", "must be 1..=64 characters").into());
            }
            stored.push(StoredFeedback {
                query_id: query_id.clone(),
                memory_id: item.memory_id,
                signal: signal.into(),
                value: item.value,
            });
        }
        let signals: Vec<(&'static str, bool)> = stored
            .iter()
            .map(|f| match f.signal.as_str() {
                "used" => ("used", f.value),
                "helpful" => ("helpful", f.value),
                _ => ("sufficient", f.value),
            })
            .collect();
        self.inner.ds.metrics.observe_feedback(&signals);
        let n = stored.len() as u32;
        let accepted = if self.inner.feedback.submit(Arc::new(identity), stored) {
            n
        } else {
            0
        };
        Ok(Response::new(FeedbackResponse { accepted }))
    }
}

#[tonic::async_trait]
impl MemoryService for Gateway {
    async fn upsert(
        &self,
        request: Request<UpsertRequest>,
    ) -> Result<Response<UpsertResponse>, Status> {
        let identity = self.authenticate(request.metadata())?;
        let req = request.into_inner();
        if req.memories.is_empty() || req.memories.len() > MAX_WRITE_BATCH {
            return Err(Error::invalid(
                "memories",
                format!("must hold 1..={MAX_WRITE_BATCH} memories"),
            )
            .into());
        }
        for m in &req.memories {
            Self::check_write_trust(&identity, m.access_level, "memories.access_level")?;
        }
        // Working-scope memories stay in this process; the rest go to
        // search-svc. Every working one is validated before anything is written.
        let mut working_at = Vec::new();
        let mut writes = Vec::new();
        let mut stored = Vec::with_capacity(req.memories.len());
        for (i, m) in req.memories.into_iter().enumerate() {
            if working::is_working(&m) {
                working_at.push(i);
                writes.push(WorkingWrite::from_memory(m, &self.inner.settings.working)?);
            } else {
                stored.push(m);
            }
        }
        let tenant = identity.tenant.clone();
        let identity = Arc::new(identity);
        let mut results = Vec::new();
        if !stored.is_empty() {
            let r = call(
                &self.inner.ds.upsert,
                &identity,
                UpsertRequest { memories: stored },
            )
            .await;
            // Even a failed batch may have written part of it.
            self.inner.caches.invalidate_tenant(&tenant);
            results = r.map_err(|e| ds_err("search", e))?.results;
            tracing::info!(tenant = %tenant, count = results.len(), "upserted memories");
        }
        if !writes.is_empty() {
            let wm = self.write_working(&identity, writes).await;
            for (i, r) in working_at.into_iter().zip(wm) {
                results.insert(i.min(results.len()), r);
            }
        }
        Ok(Response::new(UpsertResponse { results }))
    }

    async fn delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        let identity = self.authenticate(request.metadata())?;
        let req = request.into_inner();
        if req.ids.is_empty() || req.ids.len() > MAX_WRITE_BATCH {
            return Err(
                Error::invalid("ids", format!("must hold 1..={MAX_WRITE_BATCH} ids")).into(),
            );
        }
        let tenant = identity.tenant.clone();
        let from_working = self.inner.working.delete(&identity, &req.ids);
        let r = call(&self.inner.ds.delete, &Arc::new(identity), req).await;
        self.inner.caches.invalidate_tenant(&tenant);
        let mut r = r.map_err(|e| ds_err("search", e))?;
        r.deleted += from_working;
        tracing::info!(tenant = %tenant, count = r.deleted, "deleted memories");
        Ok(Response::new(r))
    }

    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let identity = self.authenticate(request.metadata())?;
        let req = request.into_inner();
        if req.ids.is_empty() || req.ids.len() > MAX_WRITE_BATCH {
            return Err(
                Error::invalid("ids", format!("must hold 1..={MAX_WRITE_BATCH} ids")).into(),
            );
        }
        let identity = Arc::new(identity);
        let mut r = call(&self.inner.ds.get, &identity, req)
            .await
            .map_err(|e| ds_err("search", e))?;
        r.memories.retain(|m| {
            m.tenant_id == identity.tenant && m.access_level <= identity.trust.to_proto()
        });
        Ok(Response::new(r))
    }

    async fn add_edges(
        &self,
        request: Request<AddEdgesRequest>,
    ) -> Result<Response<AddEdgesResponse>, Status> {
        let identity = self.authenticate(request.metadata())?;
        let req = request.into_inner();
        if req.edges.is_empty() || req.edges.len() > MAX_EDGE_BATCH {
            return Err(
                Error::invalid("edges", format!("must hold 1..={MAX_EDGE_BATCH} edges")).into(),
            );
        }
        let tenant = identity.tenant.clone();
        let r = call(&self.inner.ds.add_edges, &Arc::new(identity), req).await;
        self.inner.caches.invalidate_tenant(&tenant);
        let r = r.map_err(|e| ds_err("search", e))?;
        tracing::info!(tenant = %tenant, count = r.added, "added edges");
        Ok(Response::new(r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_never_repeats_the_previous_plan() {
        use Route::*;
        let f = Filters::default();
        // `escalate` after a previous attempt that ran `prev` on filters `f`.
        let after = |attempt, route, evidence, filters: &Filters, prev: Option<(Route, bool)>| {
            let prev = prev.map(|(r, e)| (r, e, Filters::default()));
            escalate(attempt, route, evidence, filters, prev.as_ref())
        };
        // Same route, evidence and filters as before: one step up instead.
        assert_eq!(
            after(1, Simple, true, &f, Some((Simple, true))),
            Some((MultiHop, false))
        );
        // A degraded previous attempt (no plan recorded) may be repeated.
        assert_eq!(after(1, Simple, true, &f, None), Some((Simple, true)));
        // Broadened filters make it a different plan.
        let wider = Filters {
            include_consolidated: true,
            ..Filters::default()
        };
        assert_eq!(
            after(1, Simple, true, &wider, Some((Simple, true))),
            Some((Simple, true))
        );
        // The third attempt goes up from the best route, past a repeat...
        assert_eq!(
            after(2, Simple, true, &f, Some((MultiHop, false))),
            Some((Exploratory, false))
        );
        // ...and stops when exploratory already ran.
        assert_eq!(
            after(2, MultiHop, false, &f, Some((Exploratory, false))),
            None
        );
    }

    #[tokio::test]
    async fn metrics_render_per_stack() {
        let g = Gateway::new(Settings::default()).expect("gateway");
        let t = g.metrics_text();
        assert!(
            t.contains("engram_retrieval_circuit_state{stage=\"search.vector\"} 0"),
            "{t}"
        );
        assert!(
            t.contains("# TYPE engram_downstream_latency_seconds histogram"),
            "{t}"
        );
        assert!(t.contains("engram_feedback_dropped_total 0"), "{t}");
    }

    #[test]
    fn grpc_timeout_parses() {
        let mut md = MetadataMap::new();
        md.insert("grpc-timeout", "250m".parse().expect("ascii"));
        assert_eq!(grpc_timeout(&md), Some(Duration::from_millis(250)));
        md.insert("grpc-timeout", "2S".parse().expect("ascii"));
        assert_eq!(grpc_timeout(&md), Some(Duration::from_secs(2)));
        md.insert("grpc-timeout", "x".parse().expect("ascii"));
        assert_eq!(grpc_timeout(&md), None);
    }

    #[test]
    fn broadening_doubles_the_window_and_lowers_the_bar() {
        let f = Filters {
            min_confidence: 0.5,
            time_range: Some(TimeRange {
                start: Some(Timestamp {
                    seconds: 1000,
                    nanos: 0,
                }),
                end: Some(Timestamp {
                    seconds: 2000,
                    nanos: 0,
                }),
            }),
            ..Default::default()
        };
        let b = broaden(&f);
        assert!((b.min_confidence - 0.3).abs() < 1e-6);
        assert!(b.include_consolidated);
        let tr = b.time_range.expect("range");
        assert_eq!(tr.start.map(|t| t.seconds), Some(500));
        assert_eq!(tr.end.map(|t| t.seconds), Some(2500));
    }
}
