//! The retrieval pipeline, read top to bottom in this file: shortcuts and
//! caches, then attempts of Stages 1–5 (route, search + fuse, validate,
//! distill, assemble) with retries under the ceiling, then the answer. Stage
//! 6 (feedback) arrives later on its own RPC. Each stage lives in the file
//! named after it; they share per-request state through [`ctx::Ctx`].
//!
//! Nothing here knows the gateway, the surfaces or the API adapters: they
//! call the pipeline, never the reverse (`layering::dependencies_point_one_way` in lib.rs).

pub mod abstain;
pub mod assemble;
pub mod cache;
pub mod chain;
pub mod change;
pub mod complement;
pub mod ctx;
pub mod current;
pub mod distill;
pub mod evidence;
pub mod feedback;
pub mod fusion;
pub mod history;
pub mod hop;
pub mod later;
pub mod plan;
pub mod previous;
pub mod ranker;
pub mod retry;
pub mod route;
pub mod search;
pub mod session;
pub mod shape;
pub mod slots;
pub mod strategy;
pub mod subject;
pub mod text;
pub mod turns;
pub mod unheard;
pub mod validate;
pub mod wants;
pub mod when;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use engram_common::{AccessLevel, Identity, Settings};
use engram_proto::{
    ConflictPair, EmbedRequest, Filters, QueryRoute, RankExample, RetrieveResponse, ScoredMemory,
    SkipReason,
};
use tokio::time::Instant;
use tracing::Instrument;

use self::cache::{CacheKey, CacheLimits, Caches};
use self::ctx::{Ctx, Gates, StageTrace, ms_since, stage_span};
use self::feedback::{Feedback, FeedbackQueue, QUEUE_CAPACITY, Submitted};
use self::retry::LOW_CONFIDENCE;
use self::route::Step;
use crate::downstream::{Downstreams, call_until};
use crate::error::Error;
use crate::fair::{FairConfig, FairGate};
use crate::metrics::{Metrics, RetrievalOutcome};
use crate::query::{Mode, Query, Route};
use crate::receipt::{self, Opened, Receipt, ReceiptKey};

/// The pipeline's shared state: settings, downstream stacks, metrics,
/// caches and the feedback queue. Cheap to share behind an `Arc`.
pub struct Pipeline {
    settings: Settings,
    ds: Downstreams,
    metrics: Arc<Metrics>,
    caches: Caches,
    feedback: FeedbackQueue,
    answers: Answers,
    /// Signs each answer's query id with what it returned (receipt.rs), so
    /// any replica checks feedback on it.
    receipts: ReceiptKey,
    ranker: Arc<ranker::Slot>,
    /// Each tenant's fair share of the runs and of the cross-encoder's
    /// queue at once (fair.rs, ctx.rs).
    gates: Gates,
}

/// What each recent answer returned, by query id, so feedback can be read
/// as precision@k. Bounded in bytes and time; feedback on an answer this
/// gateway no longer knows (or never gave) counts as a hit or miss only.
type Answers = moka::sync::Cache<String, Arc<Answered>>;

struct Answered {
    tenant: String,
    agent_id: String,
    /// The asking key's trust level: a key of another level with the same
    /// agent id did not ask, so it may not vote (issue 47, item 14).
    trust: AccessLevel,
    ids: Vec<String>,
    /// Stage 4 features per returned memory (same order as `ids`).
    rows: Vec<Option<ranker::Row>>,
    /// The first feedback on an answer makes its training examples; later
    /// ones would only repeat them (one caller cannot outweigh others by
    /// sending the same judgement again).
    examples_taken: AtomicBool,
}

/// The training examples one feedback makes of a known answer: every
/// returned memory with features, relevant when marked used or helpful.
fn examples(a: &Answered, feedback: &Feedback) -> Vec<RankExample> {
    if a.examples_taken.swap(true, Ordering::Relaxed) {
        return Vec::new();
    }
    let useful = feedback.useful_ids();
    (a.ids.iter().zip(&a.rows))
        .filter_map(|(id, row_opt)| {
            row_opt.map(|row| RankExample {
                query_id: receipt::answer_id(feedback.query_id()).to_string(),
                memory_id: id.clone(),
                features: row.to_vec(),
                relevant: useful.contains(id.as_str()),
            })
        })
        .collect()
}

/// The retry hint of a tenant over its share of the feedback queue: about
/// a few stores' time.
const FEEDBACK_RETRY_MS: u64 = 100;

const ANSWERS_MAX_BYTES: u64 = 16 << 20;
const ANSWERS_TTL: Duration = Duration::from_secs(3600);

fn answers() -> Answers {
    answers_within(ANSWERS_MAX_BYTES)
}

/// The record of served answers, least recently used out first: moka's
/// default TinyLFU admits a new key only when it was seen more often than
/// the one it would evict, and every answer's key is new, so a full record
/// took none and feedback on them went unchecked (issue 47, item 10).
fn answers_within(max_bytes: u64) -> Answers {
    moka::sync::Cache::builder()
        .max_capacity(max_bytes)
        .eviction_policy(moka::policy::EvictionPolicy::lru())
        .weigher(|k: &String, v: &Arc<Answered>| {
            let ids: usize = v.ids.iter().map(|i| i.len() + 24).sum();
            let ids = ids + v.rows.len() * std::mem::size_of::<Option<ranker::Row>>();
            u32::try_from(k.len() + v.tenant.len() + ids + 64).unwrap_or(u32::MAX)
        })
        .time_to_live(ANSWERS_TTL)
        .build()
}

/// What `run` answers with: the response, the candidate counts of its
/// attempt and the Stage 4 features of its candidates (none when it came
/// from a cache or a shortcut).
struct Ran {
    response: RetrieveResponse,
    counts: Vec<(&'static str, usize)>,
    rows: Vec<(String, ranker::Row)>,
}

impl Ran {
    fn cached(response: RetrieveResponse) -> Self {
        Self {
            response,
            counts: Vec::new(),
            rows: Vec::new(),
        }
    }
}

/// What one attempt produced.
struct Attempt {
    /// The route it resolved to (AUTO's evidence may move the step's).
    route: Route,
    records: Vec<ScoredMemory>,
    conflicts: Vec<ConflictPair>,
    total: u32,
    confidence: f32,
    trace: StageTrace,
    query_embedding_opt: Option<Vec<f32>>,
    /// Built on a graph older than the latest change (see `Candidates`).
    stale: bool,
    /// Stage 4 features per candidate, by memory id.
    rows: Vec<(String, ranker::Row)>,
}

impl Pipeline {
    /// Must run inside a tokio runtime: it spawns the feedback writer.
    pub fn new(settings: Settings, ds: Downstreams, metrics: Arc<Metrics>) -> Self {
        let p = &settings.pipeline;
        let caches = Caches::new(CacheLimits::from_settings(p));
        let feedback = FeedbackQueue::spawn(ds.clone(), QUEUE_CAPACITY);
        let ranker = Arc::new(ranker::Slot::from_settings(&p.ranker));
        ranker::spawn_reload(Arc::downgrade(&ranker), &p.ranker);
        let work = FairConfig::from_settings(&settings.tenant);
        // The cross-encoder's queue is shared as the cores are; a tenant
        // alone is never held there (rerank-svc's own queue target bounds
        // its wait).
        let rerank = FairConfig {
            alone: u32::MAX,
            ..work
        };
        let gates = Gates {
            work: FairGate::new(work),
            rerank: FairGate::new(rerank),
        };
        let receipts = ReceiptKey::new(settings.auth.internal_token_opt.as_deref());
        Self {
            settings,
            ds,
            metrics,
            caches,
            feedback,
            answers: answers(),
            receipts,
            ranker,
            gates,
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn downstreams(&self) -> &Downstreams {
        &self.ds
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn caches(&self) -> &Caches {
        &self.caches
    }

    pub fn feedback_dropped(&self) -> u64 {
        self.feedback.dropped()
    }

    /// The whole pipeline for an authenticated, validated query; every
    /// outcome is counted and logged once.
    pub async fn retrieve(
        &self,
        identity: Identity,
        q: Query,
        start: Instant,
        deadline: Instant,
    ) -> Result<RetrieveResponse, Error> {
        let query_log_opt =
            engram_common::scrub::query_for_log(&q.text, self.settings.log.query_text);
        let who = identity.clone();
        let mut r = self.run(identity, q, start, deadline).await;
        if let Ok(ran) = &mut r
            && !ran.response.records.is_empty()
        {
            let ids = (ran.response.records.iter())
                .filter_map(|s| s.memory.as_ref().map(|m| m.id.as_str()));
            let receipt = self.receipts.issue(&ran.response.query_id, &who, ids);
            self.remember_answer(&who, &ran.response, &ran.rows);
            ran.response.query_id = receipt;
        }
        let err_opt = r.as_ref().err().map(ToString::to_string);
        let (result, candidate_counts) = match (&r, &err_opt) {
            (Ok(ran), _) => (Ok(&ran.response), ran.counts.as_slice()),
            (Err(_), Some(e)) => (Err(e), &[][..]),
            (Err(_), None) => return r.map(|ran| ran.response),
        };
        self.metrics.observe_retrieval(&RetrievalOutcome {
            identity: &who,
            result,
            query_id_opt: None,
            elapsed: start.elapsed(),
            candidate_counts,
            query_log_opt,
        });
        r.map(|ran| ran.response)
    }

    /// Stage 6: records feedback on an earlier answer; never waits. Returns
    /// how many items were accepted (0 when the queue was full). Feedback
    /// on an answer must come from the caller it was given to and name
    /// only memories it returned (a poisoning guard): the query id is the
    /// answer's receipt, which every replica checks (receipt.rs). A plain
    /// id no gateway issued is accepted unchecked, as is one this replica
    /// no longer remembers; search-svc still stores votes only for
    /// memories the caller may read.
    pub fn feedback(&self, identity: Identity, feedback: Feedback) -> Result<u32, Error> {
        let answer = receipt::answer_id(feedback.query_id());
        let known_opt = self.answers.get(answer);
        let judged_opt = match self.receipts.open(feedback.query_id(), &identity) {
            Opened::Foreign => {
                return Err(Error::PermissionDenied(
                    "query_id: not an answer given to this caller".into(),
                ));
            }
            Opened::Valid(r) => Some(check_receipt(&self.receipts, &r, &feedback)?),
            Opened::Plain => match &known_opt {
                Some(a) => {
                    check_feedback(a, &identity, &feedback)?;
                    let useful = feedback.useful_ids();
                    let hits = a.ids.iter().filter(|id| useful.contains(id.as_str()));
                    Some((hits.count(), a.ids.len()))
                }
                None => None,
            },
        };
        self.metrics
            .observe_feedback(&feedback.signals(), judged_opt);
        let examples = known_opt
            .map(|a| examples(&a, &feedback))
            .unwrap_or_default();
        let n = feedback.len();
        let submitted = (self.feedback).submit(Arc::new(identity), feedback.into_items(), examples);
        match submitted {
            Submitted::Queued => Ok(n),
            Submitted::Dropped => Ok(0),
            Submitted::OverShare => Err(Error::TenantLimit {
                what: "feedback batches queued",
                retry_after_ms: FEEDBACK_RETRY_MS,
            }),
        }
    }

    /// Keeps which memories an answer returned (for precision@k and the
    /// feedback guard) and the features they were ranked with.
    fn remember_answer(
        &self,
        identity: &Identity,
        resp: &RetrieveResponse,
        rows: &[(String, ranker::Row)],
    ) {
        let ids: Vec<String> = (resp.records.iter())
            .filter_map(|s| s.memory.as_ref().map(|m| m.id.clone()))
            .collect();
        let rows = (ids.iter())
            .map(|id| rows.iter().find(|(r, _)| r == id).map(|(_, row)| *row))
            .collect();
        let answered = Answered {
            tenant: identity.tenant.clone(),
            agent_id: identity.agent_id.clone(),
            trust: identity.trust,
            ids,
            rows,
            examples_taken: AtomicBool::new(false),
        };
        self.answers
            .insert(resp.query_id.clone(), Arc::new(answered));
    }

    /// The sequence, with the candidate counts of the answer's attempt.
    async fn run(
        &self,
        identity: Identity,
        q: Query,
        start: Instant,
        deadline: Instant,
    ) -> Result<Ran, Error> {
        let q = current::with_history_when_past(q);
        let query_id = uuid::Uuid::new_v4().to_string();
        // Read before any search: what this request answers is as of now.
        let generation = self.caches.generation(&identity.tenant);
        let identity = Arc::new(identity);
        if let Some(turn) = &q.turn_id_opt {
            turns::recall(
                &self.caches,
                &self.ds,
                &identity,
                turn,
                generation,
                deadline,
            )
            .await;
        }
        if let Some(r) = self.shortcut(&identity, &q, &query_id, start) {
            return Ok(Ran::cached(r));
        }
        let key = CacheKey::new(&identity, &q);
        if !q.no_cache
            && let Some(hit) = self.cache_lookup(&identity, &q, &key, deadline).await
        {
            return Ok(Ran::cached(cache::answer(hit, query_id, start)));
        }
        // A cache hit costs nothing; a run's attempts take work slots
        // (`attempt`).
        let mut ctx = self.ctx(identity, q, start, deadline);
        let outer = deadline + Duration::from_millis(50);
        let (mut best, retries) =
            match tokio::time::timeout_at(outer, self.attempts(&mut ctx)).await {
                Ok(r) => r?,
                Err(_) => return Err(Error::DeadlineExceeded),
            };
        let ceiling_hit = Instant::now() >= deadline;
        let cacheable = best.trace.degraded.is_empty() && !ceiling_hit && !best.stale;
        let embedding_opt = best.query_embedding_opt.take();
        let rows = std::mem::take(&mut best.rows);
        let (response, counts) = answer(&mut ctx, best, retries, query_id, ceiling_hit);
        if cacheable && !ctx.query.no_cache {
            self.caches.put(
                &key,
                &ctx.identity.tenant,
                generation,
                &response,
                embedding_opt,
            );
        }
        if let Some(turn) = &ctx.query.turn_id_opt {
            self.caches
                .put_turn(&ctx.identity, turn, generation, &response);
            // A write that landed during the run has already dropped the
            // tenant's shared answers: this one is stale and stays local.
            if self.caches.generation(&ctx.identity.tenant) == generation {
                turns::share(&self.ds, &ctx.identity, turn, &response, deadline).await;
            }
        }
        Ok(Ran {
            response,
            counts,
            rows,
        })
    }

    /// Answers that need no search: this turn's answer already given, a
    /// caller whose context is sufficient, a greeting.
    fn shortcut(
        &self,
        identity: &Identity,
        q: &Query,
        query_id: &str,
        start: Instant,
    ) -> Option<RetrieveResponse> {
        if let Some(turn) = &q.turn_id_opt
            && let Some(mut r) = self.caches.get_turn(identity, turn)
        {
            r.latency_ms = ms_since(start);
            return Some(r);
        }
        let reason = if q.context_sufficient {
            SkipReason::ContextSufficient
        } else if q.mode == Mode::Auto && route::no_retrieval_needed(&q.text) {
            SkipReason::NoRetrievalNeeded
        } else {
            return None;
        };
        Some(RetrieveResponse {
            route: QueryRoute::Skip as i32,
            skip_reason: reason as i32,
            query_id: query_id.to_string(),
            latency_ms: ms_since(start),
            ..Default::default()
        })
    }

    /// The exact-match cache, then (when this scope has entries) the
    /// semantic one, which needs the query's embedding.
    async fn cache_lookup(
        &self,
        identity: &Arc<Identity>,
        q: &Query,
        key: &CacheKey,
        deadline: Instant,
    ) -> Option<RetrieveResponse> {
        if let Some(hit) = self.caches.get_exact(key, &identity.tenant) {
            return Some(hit);
        }
        if !self.caches.has_semantic(key, &identity.tenant) {
            return None;
        }
        let req = EmbedRequest {
            texts: vec![q.text.clone()],
        };
        let r = call_until(&self.ds.embed, identity, deadline, req)
            .await
            .ok()?;
        let e = r.embeddings.into_iter().next()?;
        self.caches.get_semantic(key, &identity.tenant, &e.values)
    }

    fn ctx(&self, identity: Arc<Identity>, q: Query, start: Instant, deadline: Instant) -> Ctx<'_> {
        let ranker_opt = self.ranker.get_for(&identity.tenant);
        let after_write = self.caches.unheard_write(&identity.tenant);
        Ctx {
            settings: &self.settings,
            ds: &self.ds,
            metrics: &self.metrics,
            identity,
            query: q,
            start,
            deadline,
            timings: Vec::new(),
            memo: Default::default(),
            embedded: Default::default(),
            ranker_opt,
            gates: &self.gates,
            work_slot_opt: None,
            after_write,
        }
    }

    /// Stage 1, then attempts with escalation (retry.rs) until one is good
    /// enough or time runs out; the best attempt and the retries it took.
    async fn attempts(&self, ctx: &mut Ctx<'_>) -> Result<(Attempt, u32), Error> {
        let t = Instant::now();
        let (mut step, mut filters) = stage_span("route").in_scope(|| {
            let mut filters = ctx.query.filters.clone();
            filters.decay_floor = ctx.settings.search.decay_floor;
            (Step::first(&ctx.query), filters)
        });
        ctx.timed("route", t);
        if step.is_raw() {
            return Ok((self.attempt(ctx, &step, &filters).await?, 0));
        }
        let max_attempts = ctx.settings.pipeline.max_attempts.max(1);
        let mut best: Option<Attempt> = None;
        let mut retries = 0;
        // What the previous attempt ran (its resolved route), unless a
        // downstream was degraded in it: the same plan again would only
        // repeat its answer at full cost.
        let mut repeat_of: Option<(Route, bool, Filters)> = None;
        for n in 0..max_attempts {
            if n > 0 {
                if !later::time_for_another(ctx.deadline) {
                    break;
                }
                filters = retry::broaden(&filters);
                // Escalate from where the evidence put the query. An evidence
                // plan's route is a fixed point of `evidence::route`, so it
                // resolves to itself again.
                let from = best.as_ref().map_or(step.route, |b| b.route);
                match retry::escalate(n, from, step.by_evidence, &filters, repeat_of.as_ref()) {
                    Some((r, e)) => (step.route, step.by_evidence) = (r, e),
                    None => break,
                }
                retries += 1;
                ctx.metrics.observe_retry(n);
                tracing::debug!(attempt = n, route = ?step.route, "broadening retrieval");
            }
            let a = match self.attempt(ctx, &step, &filters).await {
                Ok(a) => a,
                // A later attempt failing keeps the earlier answer.
                Err(e) if best.is_some() => {
                    tracing::warn!(error = %e, "retry attempt failed");
                    break;
                }
                Err(e) => return Err(e),
            };
            // A reranked head is no downstream down: the same plan again
            // would only ask the loaded cross-encoder once more.
            let whole = (a.trace.degraded.iter()).all(|d| d == validate::RERANK_PARTIAL);
            repeat_of = whole.then(|| (a.route, step.by_evidence, filters.clone()));
            let good = !a.records.is_empty() && a.confidence >= LOW_CONFIDENCE;
            let best_so_far = best.as_ref().map(|b| (b.records.len(), b.confidence));
            if retry::better(a.records.len(), a.confidence, best_so_far) {
                best = Some(a);
            }
            if good {
                break;
            }
        }
        Ok((best.ok_or(Error::DeadlineExceeded)?, retries))
    }

    /// One pass through Stages 2–5.
    async fn attempt(
        &self,
        ctx: &mut Ctx<'_>,
        step: &Step,
        filters: &Filters,
    ) -> Result<Attempt, Error> {
        take_work_slot(ctx).await?;
        let t = Instant::now();
        let plan = step.plan(&ctx.query, &ctx.settings.pipeline);
        let found = search::run(ctx, &plan, filters, step.hypotheses(&ctx.query))
            .instrument(stage_span("search"))
            .await?;
        ctx.timed("search", t);
        let mut trace = StageTrace {
            counts: search::counts(ctx.metrics, &found),
            degraded: found.degraded.iter().map(ToString::to_string).collect(),
            dropped: Vec::new(),
        };
        let rerank = step.reranks(&ctx.query) && ctx.settings.pipeline.cross_encoder;
        let mut checked = validate::run(ctx, &mut trace, found.candidates, filters, rerank)
            .instrument(stage_span("validate"))
            .await;
        // The rerank gave the slot up while it waited for the model; the
        // stages after it use the cores again.
        take_work_slot(ctx).await?;
        let route = found.route_opt.unwrap_or(step.route);
        let hop = hop::run(
            ctx,
            &mut trace,
            &mut checked,
            &plan,
            route,
            filters,
            &found.vectors,
        )
        .instrument(stage_span(hop::HOP.name()))
        .await;
        let learned = distill::Learned {
            ranker_opt: ctx.ranker_opt.as_deref(),
            query: &ctx.query.text,
        };
        let t = Instant::now();
        let distilled = stage_span("distill")
            .in_scope(|| distill::run(checked, &ctx.settings.pipeline, step.is_raw(), learned));
        ctx.timed("distill", t);
        let rows = distilled.rows;
        let mut ranked = distilled.ranked;
        // Raw plans never reorder: their `complement` is false.
        if plan.complements(route) {
            let query_opt = found.query_embedding_opt.as_deref();
            let after = complement::After {
                hedge_opt: found.hedge_opt.as_deref(),
                hop: &hop.ids,
                opening_opt: hop.opens_opt.as_deref(),
            };
            complement::run(
                ctx,
                &mut trace,
                &mut ranked,
                query_opt,
                found.vectors,
                after,
            )
            .instrument(stage_span("complement"))
            .await;
        }
        // Raw plans keep the strategy's order here too.
        let versions = if step.is_raw() || !ctx.settings.pipeline.current_first {
            Vec::new()
        } else {
            let t = Instant::now();
            let (near, moved, news, pairs) = stage_span("current").in_scope(|| {
                let near = subject::near_first(&mut ranked);
                let moved = subject::order(&ctx.query.text, &mut ranked);
                let news = change::changes_first(&ctx.query.text, &mut ranked);
                (near, moved, news, current::run(&ctx.query, &mut ranked))
            });
            ctx.timed("current", t);
            trace.counts.push(("near_first_moves", near));
            trace.counts.push(("subject_moves", moved));
            trace.counts.push(("change_moves", news));
            trace.counts.push(("versions", pairs.len()));
            let before = previous::run(ctx, &mut trace, &mut ranked, &pairs)
                .instrument(stage_span(previous::PREVIOUS))
                .await;
            trace.counts.push(("previous_moves", before));
            let chain = chain::run(ctx, &mut trace, &mut ranked, filters)
                .instrument(stage_span(chain::CHAIN.name()))
                .await;
            trace.counts.push((chain::CHAIN.name(), chain));
            pairs
        };
        let ask_conflicts = !step.is_raw() && !found.no_contradictions;
        let (mut records, mut conflicts) = assemble::run(ctx, &mut trace, ranked, ask_conflicts)
            .instrument(stage_span("assemble"))
            .await;
        conflicts.extend(versions);
        let edited = history::run(ctx, &mut trace, &mut records, filters)
            .instrument(stage_span("history"))
            .await;
        trace.counts.push(("history", edited));
        Ok(Attempt {
            route,
            confidence: assemble::confidence_of(&records, found.max_rrf),
            records,
            conflicts,
            total: (found.total + hop.added) as u32,
            trace,
            query_embedding_opt: found.query_embedding_opt,
            stale: found.stale,
            rows,
        })
    }
}

/// Feedback on a verified receipt: every named memory was returned; the
/// (hits, k) of its precision@k.
fn check_receipt(
    key: &ReceiptKey,
    r: &Receipt,
    feedback: &Feedback,
) -> Result<(usize, usize), Error> {
    if let Some(id) = feedback.memory_ids().find(|id| !key.returned(r, id)) {
        return Err(Error::invalid(
            "items.memory_id",
            format!("{id} was not returned by this query"),
        ));
    }
    let useful = feedback.useful_ids();
    Ok((useful.len(), r.k()))
}

/// Feedback on a known answer: from its own caller, on what it returned.
fn check_feedback(a: &Answered, identity: &Identity, feedback: &Feedback) -> Result<(), Error> {
    let caller = (&a.tenant, &a.agent_id, a.trust);
    if caller != (&identity.tenant, &identity.agent_id, identity.trust) {
        return Err(Error::PermissionDenied(
            "query_id: this answer was given to another caller".into(),
        ));
    }
    match feedback
        .memory_ids()
        .find(|id| !a.ids.iter().any(|r| r == id))
    {
        Some(id) => Err(Error::invalid(
            "items.memory_id",
            format!("{id} was not returned by this query"),
        )),
        None => Ok(()),
    }
}

/// The response of the best attempt, and its candidate counts. A degraded
/// or cut-short answer reports half its confidence.
fn answer(
    ctx: &mut Ctx<'_>,
    mut best: Attempt,
    retry_count: u32,
    query_id: String,
    ceiling_hit: bool,
) -> (RetrieveResponse, Vec<(&'static str, usize)>) {
    let q = &ctx.query;
    let mut confidence = best.confidence;
    if ceiling_hit || !best.trace.degraded.is_empty() {
        confidence *= 0.5;
    }
    let (context_block, context_tokens) = if q.token_budget > 0 {
        assemble::pack_context(&best.records, &best.conflicts, q.token_budget)
    } else {
        (String::new(), 0)
    };
    // Earlier versions were read for the block; only `explain` returns them.
    if !q.explain {
        for m in best.records.iter_mut().filter_map(|r| r.memory.as_mut()) {
            m.history.clear();
        }
    }
    let StageTrace {
        counts,
        degraded,
        dropped,
    } = best.trace;
    let calibration = abstain::calibration(&ctx.settings.pipeline.abstain);
    let features = abstain::features(&q.text, &best.records);
    let evidence_score = abstain::score(&features, &calibration);
    let nothing_relevant =
        abstain::nothing_relevant(&features, evidence_score, best.records.len(), &calibration);
    let response = RetrieveResponse {
        nothing_relevant,
        evidence_score,
        records: best.records,
        route: best.route.to_proto() as i32,
        total_candidates: best.total,
        retrieval_confidence: confidence,
        conflicts: best.conflicts,
        retry_count,
        skip_reason: SkipReason::None as i32,
        latency_ms: ms_since(ctx.start),
        stage_latencies: std::mem::take(&mut ctx.timings),
        degraded_stages: degraded,
        query_id,
        context_block,
        context_tokens,
        dropped: if q.explain { dropped } else { Vec::new() },
    };
    (response, counts)
}

/// One of the tenant's fair share of the work slots, unless the run holds
/// one, so no tenant's flood can take the cores another tenant's next
/// query needs. A run gives its slot up while it waits for the
/// cross-encoder (validate.rs) and takes one again here before its next
/// stage or its retry.
async fn take_work_slot(ctx: &mut Ctx<'_>) -> Result<(), Error> {
    if ctx.work_slot_opt.is_none() {
        let slot = ctx.gates.work.acquire(&ctx.identity.tenant, ctx.deadline);
        ctx.work_slot_opt = Some(slot.await?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_record_of_answers_keeps_taking_new_ones() {
        // Issue 47, item 10: under TinyLFU a full record admitted no new
        // answer, so feedback on the answers after it went unchecked.
        let record = answers_within(64 << 10);
        for i in 0..2_000 {
            let answered = Answered {
                tenant: "t".into(),
                agent_id: "a".into(),
                trust: AccessLevel::Public,
                ids: vec!["x".repeat(36); 10],
                rows: Vec::new(),
                examples_taken: AtomicBool::new(false),
            };
            record.insert(format!("q-{i}"), Arc::new(answered));
            record.run_pending_tasks();
        }
        assert!(
            record.get("q-1999").is_some(),
            "the newest answer was refused"
        );
        assert!(record.get("q-0").is_none(), "the oldest should have gone");
    }
}
