//! Knowledge Foundry retrieval: the gateway's pipeline behind the Foundry
//! contract. A knowledge base is a namespace; basic retrieval is one raw
//! strategy pass with a similarity floor; agentic retrieval decomposes the
//! question (by rule, or by the optional LLM with the rules as fallback),
//! runs the sub-queries under a token and a latency budget, and packs a
//! `[Source N]` context for the caller's model. With an LLM configured and
//! budget left, it also writes an `answer` citing those sources.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::time::Duration;

use engram_common::Identity;
use engram_proto::{
    AgenticRetrieveRequest, BasicRetrieveRequest, Filters, FoundryResponse, FoundryResult,
    FoundryStep, ScoredMemory,
};
use prost_types::Struct;
use tokio::time::Instant;

use crate::error::Error;
use crate::gateway::Gateway;
use crate::pipeline::assemble::tokens;
use crate::pipeline::strategy::Strategy;
use crate::query::{MAX_TEXT_CHARS, Mode, Query, Raw};
use crate::surfaces::decompose::{self, Plan, SLOT};
use crate::surfaces::llm::{self, LlmError};

pub const DEFAULT_TOP_K: u32 = 10;
pub const MAX_TOP_K: u32 = 100;
/// all-MiniLM-L6-v2 puts good matches at cosine 0.50–0.65 and unrelated
/// text mostly under 0.3; 0.65 (the seed's value, for larger embedders)
/// returned nothing for 10 of 12 answerable questions in a trial.
pub const DEFAULT_SIMILARITY: f32 = 0.4;
pub const DEFAULT_MAX_STEPS: u32 = 5;
pub const MAX_STEPS: u32 = 20;
pub const DEFAULT_TOP_K_PER_STEP: u32 = 5;
pub const MAX_TOP_K_PER_STEP: u32 = 50;
pub const DEFAULT_TOKEN_BUDGET: u32 = 8_000;
pub const TOKEN_BUDGET_RANGE: std::ops::RangeInclusive<u32> = 100..=100_000;
pub const DEFAULT_MAX_LATENCY_MS: u32 = 30_000;
pub const LATENCY_RANGE: std::ops::RangeInclusive<u32> = 1_000..=120_000;
pub const MAX_KB_IDS: usize = 32;
/// Pipelines one agentic request runs at once, whatever its steps and
/// knowledge bases (up to 5 parallel steps × 32 bases would be 160); the
/// tenant is charged this many in-flight slots for it.
pub const AGENTIC_IN_FLIGHT: u32 = 8;
/// Share of the token budget the packed context may fill; the rest is left
/// for the caller's prompt and answer.
pub const CONTEXT_SHARE: f32 = 0.7;
/// Hits of a bridge's first step searched for the bridge entity: the one
/// the description names is often second or third (see
/// `decompose::bridge_entity`).
const BRIDGE_HITS: usize = 3;
/// The same with `mode: auto`: on multi-hop steps Stage 4b fills #2 and #3
/// with memories that complete the #1, so the one the description names
/// can sit at #4 or #5 (the demo's "the project that migrates the billing
/// system": Project Atlas at #4 behind the invoices note's two customers).
const BRIDGE_HITS_AUTO: usize = 5;
/// RRF k and the whole question's weight when agentic steps are merged,
/// fitted on the 2Wiki dev half: R@2/5/10 74.0 / 92.6 / 97.7 (k 60,
/// weight 1: 68.6 / 89.1 / 98.0; the old max-score merge without the whole
/// question: 65.1 / 87.2 / 94.9).
const STEP_RRF_K: f32 = 2.0;
const WHOLE_QUESTION_WEIGHT: f32 = 2.0;
/// How close to the latency deadline a failed step counts as cut by it.
const LATENCY_SLACK: Duration = Duration::from_millis(150);
/// Share of the remaining latency budget LLM decomposition may take, so
/// the retrieval it plans still has time to run.
const DECOMPOSE_TIME_SHARE: u32 = 3;
/// Below this much time left, an LLM call is not worth starting.
const MIN_LLM_TIME: Duration = Duration::from_millis(200);
/// Below this many budget tokens left, synthesis is skipped: the sources
/// and an answer would not fit.
const MIN_SYNTH_TOKENS: u32 = 256;
/// Prompt tokens besides the sources and the question.
const SYNTH_OVERHEAD_TOKENS: u32 = 80;
/// Answer length cap, whatever budget is left.
const MAX_ANSWER_TOKENS: u32 = 1_024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effort {
    Low,
    Medium,
    High,
}

impl Effort {
    /// Sub-queries a decomposition may produce.
    fn max_parts(self) -> usize {
        match self {
            Self::Low => 1,
            Self::Medium => 2,
            Self::High => 4,
        }
    }
}

fn parse_mode(mode: &str, default: Raw) -> Result<Raw, Error> {
    match mode {
        "" => Ok(default),
        "keyword" => Ok(Raw::Keyword),
        "vector" => Ok(Raw::Vector),
        "hybrid" => Ok(Raw::Hybrid),
        _ => Err(Error::invalid("mode", "must be keyword, vector or hybrid")),
    }
}

/// The agentic surface also takes `auto`, its default: each step runs the
/// whole pipeline (route, Stage 4 ranker, complementary slots), never the
/// cross-encoder. Dev R@2 against `hybrid`: 2Wiki 80.0 / 73.7, HotpotQA
/// 84.0 / 73.5, MuSiQue 61.1 / 54.4, LoCoMo equal; the demo's bridge
/// question keeps its answer with either (docs/surfaces.md).
fn parse_agentic_mode(mode: &str) -> Result<Mode, Error> {
    match mode {
        "" | "auto" => Ok(Mode::Auto),
        _ => parse_mode(mode, Raw::Hybrid)
            .map(Mode::Raw)
            .map_err(|_| Error::invalid("mode", "must be auto, keyword, vector or hybrid")),
    }
}

fn check_query(query: &str) -> Result<(), Error> {
    if query.trim().is_empty() {
        return Err(Error::invalid("query", "is required"));
    }
    if query.chars().count() > MAX_TEXT_CHARS {
        return Err(Error::invalid(
            "query",
            format!("must be at most {MAX_TEXT_CHARS} characters"),
        ));
    }
    Ok(())
}

/// The caller's `filters`, kept when non-empty and nested at most
/// [`engram_common::text::MAX_NESTING`] levels (HTTP and gRPC alike).
fn checked_filters(filters: Option<Struct>) -> Result<Option<Struct>, Error> {
    if let Some(f) = &filters {
        engram_common::text::check_struct_depth(f)
            .map_err(|rule| Error::invalid("filters", rule))?;
    }
    Ok(filters.filter(|f| !f.fields.is_empty()))
}

fn check_tenant(tenant_id: &str) -> Result<(), Error> {
    if tenant_id.is_empty() {
        return Err(Error::invalid("tenant_id", "is required"));
    }
    Ok(())
}

/// A knowledge base is a namespace: a UUID (normalised) or the name the
/// memories were written under (`default` in the README's examples).
fn parse_kb(field: &'static str, kb: &str) -> Result<String, Error> {
    if let Ok(u) = uuid::Uuid::parse_str(kb) {
        return Ok(u.hyphenated().to_string());
    }
    let ok =
        !kb.is_empty() && kb.chars().count() <= 128 && engram_common::text::check_text(kb).is_ok();
    match ok {
        true => Ok(kb.to_string()),
        false => Err(Error::invalid(
            field,
            "must be a UUID or a namespace name of 1..=128 characters",
        )),
    }
}

fn in_range(
    field: &'static str,
    v_opt: Option<u32>,
    default: u32,
    range: std::ops::RangeInclusive<u32>,
) -> Result<u32, Error> {
    let v = v_opt.unwrap_or(default);
    if range.contains(&v) {
        Ok(v)
    } else {
        Err(Error::invalid(
            field,
            format!("must be in {}..={}", range.start(), range.end()),
        ))
    }
}

/// A `BasicRetrieveRequest` that passed boundary validation.
#[derive(Debug, Clone)]
pub struct Basic {
    pub namespace: String,
    pub query: String,
    pub tenant_id: String,
    pub top_k: u32,
    pub mode: Raw,
    pub filters_opt: Option<Struct>,
    pub similarity_threshold: f32,
}

impl TryFrom<BasicRetrieveRequest> for Basic {
    type Error = Error;

    fn try_from(r: BasicRetrieveRequest) -> Result<Self, Error> {
        let BasicRetrieveRequest {
            kb_id,
            query,
            tenant_id,
            top_k,
            mode,
            filters,
            similarity_threshold,
        } = r;
        if kb_id.is_empty() {
            return Err(Error::invalid("kb_id", "is required"));
        }
        let namespace = parse_kb("kb_id", &kb_id)?;
        check_query(&query)?;
        check_tenant(&tenant_id)?;
        let top_k = in_range("top_k", top_k, DEFAULT_TOP_K, 1..=MAX_TOP_K)?;
        let mode = parse_mode(&mode, Raw::Vector)?;
        let similarity_threshold = similarity_threshold.unwrap_or(DEFAULT_SIMILARITY);
        if !(0.0..=1.0).contains(&similarity_threshold) {
            return Err(Error::invalid("similarity_threshold", "must be in 0..=1"));
        }
        Ok(Self {
            namespace,
            query,
            tenant_id,
            top_k,
            mode,
            filters_opt: checked_filters(filters)?,
            similarity_threshold,
        })
    }
}

/// An `AgenticRetrieveRequest` that passed boundary validation.
#[derive(Debug, Clone)]
pub struct Agentic {
    pub query: String,
    pub tenant_id: String,
    /// Empty = every namespace.
    pub namespaces: Vec<String>,
    pub max_steps: u32,
    pub effort: Effort,
    pub top_k_per_step: u32,
    pub token_budget: u32,
    pub max_latency: Duration,
    pub mode: Mode,
    pub filters_opt: Option<Struct>,
}

impl TryFrom<AgenticRetrieveRequest> for Agentic {
    type Error = Error;

    fn try_from(r: AgenticRetrieveRequest) -> Result<Self, Error> {
        let AgenticRetrieveRequest {
            query,
            tenant_id,
            kb_ids,
            max_steps,
            reasoning_effort,
            top_k_per_step,
            token_budget,
            max_latency_ms,
            mode,
            filters,
        } = r;
        check_query(&query)?;
        check_tenant(&tenant_id)?;
        if kb_ids.len() > MAX_KB_IDS {
            return Err(Error::invalid(
                "kb_ids",
                format!("at most {MAX_KB_IDS} knowledge bases"),
            ));
        }
        let mut namespaces = Vec::with_capacity(kb_ids.len());
        for kb in &kb_ids {
            let ns = parse_kb("kb_ids", kb)?;
            if !namespaces.contains(&ns) {
                namespaces.push(ns);
            }
        }
        let effort = match reasoning_effort.as_str() {
            "low" => Effort::Low,
            "" | "medium" => Effort::Medium,
            "high" => Effort::High,
            _ => {
                return Err(Error::invalid(
                    "reasoning_effort",
                    "must be low, medium or high",
                ));
            }
        };
        Ok(Self {
            query,
            tenant_id,
            namespaces,
            max_steps: in_range("max_steps", max_steps, DEFAULT_MAX_STEPS, 1..=MAX_STEPS)?,
            effort,
            top_k_per_step: in_range(
                "top_k_per_step",
                top_k_per_step,
                DEFAULT_TOP_K_PER_STEP,
                1..=MAX_TOP_K_PER_STEP,
            )?,
            token_budget: in_range(
                "token_budget",
                token_budget,
                DEFAULT_TOKEN_BUDGET,
                TOKEN_BUDGET_RANGE,
            )?,
            max_latency: Duration::from_millis(u64::from(in_range(
                "max_latency_ms",
                max_latency_ms,
                DEFAULT_MAX_LATENCY_MS,
                LATENCY_RANGE,
            )?)),
            mode: parse_agentic_mode(&mode)?,
            filters_opt: checked_filters(filters)?,
        })
    }
}

fn authorize(identity: &Identity, tenant_id: &str) -> Result<(), Error> {
    if identity.tenant != tenant_id {
        return Err(Error::PermissionDenied(
            "tenant_id does not match the caller's tenant".into(),
        ));
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn raw_query(
    text: String,
    namespace: String,
    filters_opt: Option<Struct>,
    k: u32,
    mode: Mode,
) -> Query {
    Query {
        text,
        filters: Filters {
            namespace,
            metadata: filters_opt,
            ..Default::default()
        },
        limit: k,
        mode,
        hypotheses: Vec::new(),
        turn_id_opt: None,
        token_budget: 0,
        explain: false,
        context_sufficient: false,
        skip_rerank: true,
        no_cache: false,
        fail_open: false,
    }
}

fn strategy_score(r: &ScoredMemory, strategy: Strategy) -> Option<f32> {
    r.provenance
        .as_ref()?
        .strategies
        .iter()
        .find(|h| strategy.credited(h))
        .map(|h| h.score)
}

fn document_id(m: &engram_proto::Memory) -> String {
    let from_meta = m
        .metadata
        .as_ref()
        .and_then(|s| s.fields.get("document_id"))
        .map(|v| match struct_value_json(v) {
            serde_json::Value::String(s) => s,
            other => other.to_string(),
        })
        .filter(|s| !s.is_empty());
    from_meta.unwrap_or_else(|| {
        if m.source.is_empty() {
            m.id.clone()
        } else {
            m.source.clone()
        }
    })
}

fn struct_value_json(v: &prost_types::Value) -> serde_json::Value {
    engram_common::convert::value_to_json(v)
}

fn to_result(r: ScoredMemory, score: f32) -> Option<FoundryResult> {
    let m = r.memory?;
    Some(FoundryResult {
        chunk_id: m.id.clone(),
        document_id: document_id(&m),
        text: m.content.clone(),
        score,
        metadata: m.metadata.clone(),
    })
}

/// Basic retrieval: one strategy pass over one knowledge base. Scores are
/// the strategy's own (cosine similarity for vector, ts_rank for keyword),
/// the fused score for hybrid.
pub async fn basic(
    gw: &Gateway,
    identity: Identity,
    b: Basic,
    start: Instant,
    deadline: Instant,
) -> Result<FoundryResponse, Error> {
    authorize(&identity, &b.tenant_id)?;
    let t = Instant::now();
    let q = raw_query(
        b.query.clone(),
        b.namespace,
        b.filters_opt,
        b.top_k,
        Mode::Raw(b.mode),
    );
    let r = gw.retrieve(identity, q, start, deadline).await?;
    let threshold = b.similarity_threshold;
    let results: Vec<FoundryResult> = r
        .records
        .into_iter()
        .filter_map(|rec| {
            let sim_opt = strategy_score(&rec, Strategy::Vector);
            let score = match b.mode {
                Raw::Vector => {
                    let sim = sim_opt.unwrap_or(0.0);
                    if sim < threshold {
                        return None;
                    }
                    sim
                }
                Raw::Keyword => strategy_score(&rec, Strategy::Keyword).unwrap_or(rec.score),
                Raw::Hybrid | Raw::Graph => {
                    // Only a hit whose sole evidence is a weak vector match
                    // is dropped: keyword and graph hits have no similarity.
                    let other = rec.provenance.as_ref().is_some_and(|p| {
                        p.strategies.iter().any(|h| !Strategy::Vector.credited(h))
                    });
                    if !other && sim_opt.is_some_and(|s| s < threshold) {
                        return None;
                    }
                    rec.score
                }
            };
            to_result(rec, score)
        })
        .collect();
    let tokens_used: u32 = results.iter().map(|r| tokens(&r.text)).sum();
    let step = FoundryStep {
        step_number: 1,
        action: "retrieve".into(),
        input: b.query,
        result_count: results.len() as u32,
        tokens: tokens_used,
        latency_ms: ms(t.elapsed()),
        detail: format!("mode={:?}", b.mode).to_lowercase(),
    };
    tracing::info!(
        tenant = %b.tenant_id,
        results = results.len(),
        "foundry basic retrieved"
    );
    Ok(FoundryResponse {
        request_id: r.query_id,
        answer: String::new(),
        results,
        steps: vec![step],
        total_tokens_used: tokens_used,
        total_latency_ms: ms(start.elapsed()),
        truncated: false,
        truncated_reason: String::new(),
        context: String::new(),
    })
}

/// Why the agent must stop before its next step, if it must.
pub fn stop_reason(
    elapsed: Duration,
    max_latency: Duration,
    tokens_used: u32,
    token_budget: u32,
    retrieves_done: u32,
    max_steps: u32,
) -> Option<&'static str> {
    if tokens_used >= token_budget {
        Some("budget")
    } else if elapsed >= max_latency {
        Some("latency")
    } else if retrieves_done >= max_steps {
        Some("max_steps")
    } else {
        None
    }
}

/// The running state of one agentic request.
struct Run<'a> {
    gw: &'a Gateway,
    identity: Identity,
    a: &'a Agentic,
    start: Instant,
    deadline: Instant,
    steps: Vec<FoundryStep>,
    tokens_used: u32,
    retrieves: u32,
    truncated_opt: Option<&'static str>,
    /// Every chunk any step returned, in first-seen order; its `score` is
    /// the reciprocal-rank fusion of the steps' rankings, since one
    /// sub-query's scores are not comparable with another's.
    results: Vec<FoundryResult>,
    index: HashMap<String, usize>,
    /// The latest retrieve's top hits, best first, for a bridge follow-up.
    top_hits: Vec<BestHit>,
    /// At most [`AGENTIC_IN_FLIGHT`] pipelines at once, the share the
    /// request was admitted with.
    pipelines: tokio::sync::Semaphore,
}

/// Content and entity names of one of a step's top hits. Retrieval
/// records carry no entity names (proto `Memory.entities`), so today the
/// names come from the content (`decompose::bridge_entity`); the field
/// stays for hits that do carry them.
struct BestHit {
    content: String,
    entities: Vec<String>,
}

/// What one sub-query returned.
struct StepOutcome {
    input: String,
    results: Vec<FoundryResult>,
    top_hits: Vec<BestHit>,
    latency: Duration,
    error_opt: Option<Error>,
    /// The request's latency budget, not the pipeline ceiling, ended it.
    cut_by_latency: bool,
}

impl Run<'_> {
    fn check(&mut self) -> bool {
        if self.truncated_opt.is_some() {
            return false;
        }
        self.truncated_opt = stop_reason(
            self.start.elapsed(),
            self.a.max_latency,
            self.tokens_used,
            self.a.token_budget,
            self.retrieves,
            self.a.max_steps,
        );
        self.truncated_opt.is_none()
    }

    fn push_step(
        &mut self,
        action: &str,
        input: String,
        count: usize,
        tokens: u32,
        latency: Duration,
        detail: String,
    ) {
        self.steps.push(FoundryStep {
            step_number: self.steps.len() as u32 + 1,
            action: action.into(),
            input,
            result_count: count as u32,
            tokens,
            latency_ms: ms(latency),
            detail,
        });
    }

    /// One sub-query across the requested knowledge bases, in parallel.
    async fn retrieve_one(&self, text: String) -> StepOutcome {
        let t = Instant::now();
        let namespaces = if self.a.namespaces.is_empty() {
            vec![String::new()]
        } else {
            self.a.namespaces.clone()
        };
        let ceiling =
            Instant::now() + Duration::from_millis(self.gw.settings().pipeline.ceiling_ms);
        let latency_bound = self.deadline <= ceiling;
        let step_deadline = self.deadline.min(ceiling);
        let calls = namespaces.into_iter().map(|ns| {
            let mut q = raw_query(
                text.clone(),
                ns,
                self.a.filters_opt.clone(),
                self.a.top_k_per_step,
                self.a.mode,
            );
            // Sub-queries differ by one entity ("..., Alan Turing?" vs
            // "..., John von Neumann?"): the semantic cache would match one
            // to the other.
            q.no_cache = true;
            async move {
                // Never closed, so a permit always comes.
                let _permit = self.pipelines.acquire().await.ok();
                let start = Instant::now();
                self.gw
                    .retrieve(self.identity.clone(), q, start, step_deadline)
                    .await
            }
        });
        let mut records: Vec<ScoredMemory> = Vec::new();
        let mut error_opt = None;
        let mut any_ok = false;
        for r in futures::future::join_all(calls).await {
            match r {
                Ok(r) => {
                    any_ok = true;
                    records.extend(r.records);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "knowledge base retrieval failed");
                    error_opt = Some(e);
                }
            }
        }
        // The pipeline stops its strategies a little before the deadline
        // it was given, so "near the deadline" counts as reaching it.
        let cut_by_latency = latency_bound && Instant::now() + LATENCY_SLACK >= self.deadline;
        // One knowledge base failing degrades the step; all failing fails it.
        if any_ok {
            error_opt = None;
        }
        records.sort_by(|a, b| b.score.total_cmp(&a.score));
        records.truncate(self.a.top_k_per_step as usize);
        let bridge_hits = match self.a.mode {
            Mode::Auto => BRIDGE_HITS_AUTO,
            _ => BRIDGE_HITS,
        };
        let top_hits = records
            .iter()
            .take(bridge_hits)
            .filter_map(|r| r.memory.as_ref())
            .map(|m| BestHit {
                content: m.content.clone(),
                entities: m.entities.clone(),
            })
            .collect();
        let results = records
            .into_iter()
            .filter_map(|r| {
                let s = r.score;
                to_result(r, s)
            })
            .collect();
        StepOutcome {
            input: text,
            error_opt,
            results,
            top_hits,
            latency: t.elapsed(),
            cut_by_latency,
        }
    }

    /// Records a finished retrieve; a failure after the latency budget is a
    /// truncation, any other failure the request's error.
    fn absorb(&mut self, o: StepOutcome) -> Result<(), Error> {
        self.retrieves += 1;
        if let Some(e) = o.error_opt {
            if o.cut_by_latency || self.start.elapsed() >= self.a.max_latency {
                self.push_step(
                    "retrieve",
                    o.input,
                    0,
                    0,
                    o.latency,
                    "stopped: latency".into(),
                );
                self.truncated_opt.get_or_insert("latency");
                return Ok(());
            }
            return Err(e);
        }
        let tokens: u32 = o.results.iter().map(|r| tokens(&r.text)).sum();
        self.tokens_used = self.tokens_used.saturating_add(tokens);
        let count = o.results.len();
        let weight = if o.input == self.a.query {
            WHOLE_QUESTION_WEIGHT
        } else {
            1.0
        };
        for (rank, mut r) in o.results.into_iter().enumerate() {
            let share = weight / (STEP_RRF_K + rank as f32 + 1.0);
            match self.index.entry(r.chunk_id.clone()) {
                Entry::Occupied(e) => self.results[*e.get()].score += share,
                Entry::Vacant(e) => {
                    e.insert(self.results.len());
                    r.score = share;
                    self.results.push(r);
                }
            }
        }
        self.top_hits = o.top_hits;
        self.push_step("retrieve", o.input, count, tokens, o.latency, String::new());
        Ok(())
    }

    async fn parallel(&mut self, queries: Vec<String>) -> Result<(), Error> {
        if !self.check() {
            return Ok(());
        }
        let room = self.a.max_steps.saturating_sub(self.retrieves) as usize;
        if queries.len() > room {
            self.truncated_opt = Some("max_steps");
        }
        let outcomes =
            futures::future::join_all(queries.into_iter().take(room).map(|q| self.retrieve_one(q)))
                .await;
        for o in outcomes {
            self.absorb(o)?;
        }
        Ok(())
    }

    async fn bridge(&mut self, first: String, follow_up: String) -> Result<(), Error> {
        if !self.check() {
            return Ok(());
        }
        // The whole question runs beside the first hop when the steps allow
        // both hops too: it keeps what a single pass finds in the ranking.
        let whole_asked = self.a.max_steps.saturating_sub(self.retrieves) >= 3;
        if whole_asked {
            let whole = self.a.query.clone();
            let (o_first, o_whole) =
                futures::future::join(self.retrieve_one(first.clone()), self.retrieve_one(whole))
                    .await;
            self.absorb(o_whole)?;
            // Absorbed last, so its top hits feed the follow-up.
            self.absorb(o_first)?;
        } else {
            let o = self.retrieve_one(first.clone()).await;
            self.absorb(o)?;
        }
        let mut follow_up = follow_up;
        let mut asked = first;
        // Nested bridges ("the spouse of the founder of X") take one more
        // hop per level while the budget allows.
        loop {
            let hits: Vec<(&str, &[String])> = self
                .top_hits
                .iter()
                .map(|h| (h.content.as_str(), h.entities.as_slice()))
                .collect();
            let entity_opt = decompose::bridge_entity(&hits, &asked);
            if entity_opt.is_none() && whole_asked {
                // The fallback below has already run beside the first hop.
                break;
            }
            let next = match &entity_opt {
                Some(e) => follow_up.replace(SLOT, e),
                // No bridge entity: ask the whole question instead.
                None => self.a.query.clone(),
            };
            if !self.check() {
                break;
            }
            let o = self.retrieve_one(next.clone()).await;
            self.absorb(o)?;
            if let Some(last) = self.steps.last_mut() {
                last.detail = match &entity_opt {
                    Some(e) => format!("bridge entity: {e}"),
                    None => "no bridge entity: whole question".into(),
                };
            }
            match (
                entity_opt,
                decompose::decompose(&next, self.a.effort.max_parts()),
            ) {
                (
                    Some(_),
                    Plan::Bridge {
                        first,
                        follow_up: f,
                    },
                ) if self.a.effort == Effort::High => {
                    if !self.check() {
                        break;
                    }
                    let o = self.retrieve_one(first.clone()).await;
                    self.absorb(o)?;
                    asked = first;
                    follow_up = f;
                }
                _ => break,
            }
        }
        Ok(())
    }
}

impl Run<'_> {
    fn time_left(&self) -> Duration {
        self.a.max_latency.saturating_sub(self.start.elapsed())
    }

    /// Sub-queries alone lose what one pass over the whole question finds
    /// (the 2Wiki dev half at RRF k 60: R@2 68.6 with it, 63.7 without), so
    /// it leads them when the steps allow one more.
    fn with_whole_question(&self, qs: &mut Vec<String>) {
        if !qs.contains(&self.a.query) && (qs.len() as u32) < self.a.max_steps {
            qs.insert(0, self.a.query.clone());
        }
    }

    /// The sub-query plan: the LLM's when one is configured and answers
    /// usably in time, else the rules'. Either way one `decompose` step.
    async fn plan(&mut self) -> Plan {
        let t = Instant::now();
        let q = self.a.query.clone();
        let max_parts = self.a.effort.max_parts();
        let mut note = String::new();
        if let Some(llm) = self.gw.llm() {
            let budget = llm.budget(self.time_left() / DECOMPOSE_TIME_SHARE);
            if budget < MIN_LLM_TIME {
                note = " (llm skipped: latency)".into();
            } else {
                let r = llm.decompose(&q, max_parts, budget).await;
                llm::observe(self.gw.metrics(), &r, t);
                match r {
                    Ok(reply) => {
                        self.tokens_used = self.tokens_used.saturating_add(reply.tokens);
                        let mut qs = reply.value;
                        self.with_whole_question(&mut qs);
                        let detail = format!("method=llm; parallel: {}", qs.join(" | "));
                        self.push_step("decompose", q, qs.len(), reply.tokens, t.elapsed(), detail);
                        return Plan::Parallel(qs);
                    }
                    Err(e) => {
                        tracing::warn!(
                            tenant = %self.a.tenant_id,
                            error = %e,
                            "llm decomposition failed, using the rules"
                        );
                        note = format!(" (llm failed: {})", e.kind());
                    }
                }
            }
        }
        let mut plan = decompose::decompose(&q, max_parts);
        if let Plan::Parallel(qs) = &mut plan {
            self.with_whole_question(qs);
        }
        let subs = plan.sub_queries();
        let kind = match &plan {
            Plan::Single(_) => "single",
            Plan::Parallel(_) => "parallel",
            Plan::Bridge { .. } => "bridge",
        };
        self.push_step(
            "decompose",
            q,
            subs.len(),
            0,
            t.elapsed(),
            format!("method=rules{note}; {kind}: {}", subs.join(" | ")),
        );
        plan
    }

    /// The `synthesize` step: with an LLM and budget left, an answer over
    /// the leading `entries` that fit what is left of the token budget;
    /// otherwise, or when the call fails, "" and the context alone.
    async fn synthesize(&mut self, entries: &[String], context: &str) -> String {
        let t = Instant::now();
        let q = self.a.query.clone();
        let context_only = |why: String| {
            (
                String::new(),
                context.matches("[Source ").count(),
                tokens(context),
                format!("{why}: context only"),
            )
        };
        let (answer, count, step_tokens, detail) = match self.gw.llm() {
            None => context_only("no llm configured".into()),
            Some(_) if entries.is_empty() => context_only("llm skipped: no sources".into()),
            Some(llm) => {
                let left = self.a.token_budget.saturating_sub(self.tokens_used);
                let answer_room = (left / 4).clamp(64, MAX_ANSWER_TOKENS);
                let room = left
                    .saturating_sub(answer_room)
                    .saturating_sub(SYNTH_OVERHEAD_TOKENS)
                    .saturating_sub(tokens(&q));
                // A prefix, so "[Source N]" in the answer means the same
                // entry as in the returned context.
                let mut used = 0;
                let take = entries
                    .iter()
                    .take_while(|e| {
                        used += tokens(e);
                        used <= room
                    })
                    .count();
                let budget = llm.budget(self.time_left());
                if left < MIN_SYNTH_TOKENS || take == 0 {
                    self.truncated_opt.get_or_insert("budget");
                    context_only("llm skipped: budget".into())
                } else if budget < MIN_LLM_TIME {
                    self.truncated_opt.get_or_insert("latency");
                    context_only("llm skipped: latency".into())
                } else {
                    let sources = entries[..take].concat();
                    let r = llm.synthesize(&q, &sources, answer_room, budget).await;
                    llm::observe(self.gw.metrics(), &r, t);
                    match r {
                        Ok(reply) => {
                            self.tokens_used = self.tokens_used.saturating_add(reply.tokens);
                            (
                                reply.value,
                                take,
                                reply.tokens,
                                format!("method=llm; sources={take}"),
                            )
                        }
                        Err(e) => {
                            tracing::warn!(
                                tenant = %self.a.tenant_id,
                                error = %e,
                                "llm synthesis failed, returning the context only"
                            );
                            // A timeout cut by the request's own latency
                            // budget is a truncation, like a late retrieve.
                            if matches!(e, LlmError::Timeout)
                                && budget < Duration::from_millis(llm.settings().timeout_ms)
                            {
                                self.truncated_opt.get_or_insert("latency");
                            }
                            context_only(format!("llm failed: {}", e.kind()))
                        }
                    }
                }
            }
        };
        self.push_step("synthesize", q, count, step_tokens, t.elapsed(), detail);
        answer
    }
}

/// Results, best first, as `[Source N]` entries while they fit in `limit`
/// tokens; an entry that does not fit is skipped for a shorter one.
pub fn source_entries(results: &[FoundryResult], limit: u32) -> Vec<String> {
    let mut out = Vec::new();
    let mut used = 0;
    for r in results {
        let entry = format!("[Source {}] {}\n\n", out.len() + 1, r.text.trim());
        let t = tokens(&entry);
        if used + t <= limit {
            used += t;
            out.push(entry);
        }
    }
    out
}

/// Packs results, best first, as `[Source N]` entries until `limit` tokens.
#[cfg(test)]
pub fn pack_sources(results: &[FoundryResult], limit: u32) -> String {
    source_entries(results, limit).concat()
}

pub async fn agentic(
    gw: &Gateway,
    identity: Identity,
    a: Agentic,
    start: Instant,
) -> Result<FoundryResponse, Error> {
    authorize(&identity, &a.tenant_id)?;
    let request_id = uuid::Uuid::new_v4().to_string();
    let mut run = Run {
        gw,
        identity,
        a: &a,
        start,
        deadline: start + a.max_latency,
        steps: Vec::new(),
        tokens_used: 0,
        retrieves: 0,
        truncated_opt: None,
        results: Vec::new(),
        index: HashMap::new(),
        top_hits: Vec::new(),
        pipelines: tokio::sync::Semaphore::new(AGENTIC_IN_FLIGHT as usize),
    };
    let plan = if a.effort == Effort::Low {
        Plan::Single(a.query.clone())
    } else {
        run.plan().await
    };
    match plan {
        Plan::Single(q) => run.parallel(vec![q]).await?,
        Plan::Parallel(qs) => run.parallel(qs).await?,
        Plan::Bridge { first, follow_up } => run.bridge(first, follow_up).await?,
    }
    run.results.sort_by(|x, y| y.score.total_cmp(&x.score));
    let limit = (a.token_budget as f32 * CONTEXT_SHARE) as u32;
    let entries = source_entries(&run.results, limit);
    let context = entries.concat();
    let answer = run.synthesize(&entries, &context).await;
    let Run {
        results,
        steps,
        tokens_used,
        truncated_opt,
        ..
    } = run;
    // The Foundry spec's completion event: one per agentic request.
    tracing::info!(
        event = "agentic_retrieval_completed",
        request_id = %request_id,
        tenant = %a.tenant_id,
        effort = ?a.effort,
        steps = steps.len(),
        results = results.len(),
        tokens = tokens_used,
        latency_ms = ms(start.elapsed()),
        truncated = truncated_opt.unwrap_or(""),
        "agentic_retrieval_completed"
    );
    Ok(FoundryResponse {
        request_id,
        answer,
        results,
        steps,
        total_tokens_used: tokens_used,
        total_latency_ms: ms(start.elapsed()),
        truncated: truncated_opt.is_some(),
        truncated_reason: truncated_opt.unwrap_or_default().to_string(),
        context,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field<T: std::fmt::Debug>(r: Result<T, Error>) -> &'static str {
        match r {
            Err(Error::InvalidArgument { field, .. }) => field,
            other => panic!("expected invalid argument, got {other:?}"),
        }
    }

    fn basic_req() -> BasicRetrieveRequest {
        BasicRetrieveRequest {
            kb_id: "0B7C3F0E-8A51-4C53-9A43-6B8F7E3C1D20".into(),
            query: "q".into(),
            tenant_id: "t".into(),
            ..Default::default()
        }
    }

    #[test]
    fn basic_defaults_and_ranges() {
        let b = Basic::try_from(basic_req()).expect("valid");
        assert_eq!(b.namespace, "0b7c3f0e-8a51-4c53-9a43-6b8f7e3c1d20");
        assert_eq!(
            (b.top_k, b.mode, b.similarity_threshold),
            (10, Raw::Vector, DEFAULT_SIMILARITY)
        );
        let bad = |f: fn(&mut BasicRetrieveRequest)| {
            let mut r = basic_req();
            f(&mut r);
            field(Basic::try_from(r))
        };
        assert_eq!(bad(|r| r.kb_id.clear()), "kb_id");
        assert_eq!(bad(|r| r.kb_id = "k\u{0}b".into()), "kb_id");
        assert_eq!(bad(|r| r.kb_id = "x".repeat(129)), "kb_id");
        assert_eq!(bad(|r| r.query = " ".into()), "query");
        assert_eq!(bad(|r| r.tenant_id.clear()), "tenant_id");
        assert_eq!(bad(|r| r.top_k = Some(0)), "top_k");
        assert_eq!(bad(|r| r.top_k = Some(101)), "top_k");
        assert_eq!(bad(|r| r.mode = "graph".into()), "mode");
        assert_eq!(
            bad(|r| r.similarity_threshold = Some(-0.1)),
            "similarity_threshold"
        );
    }

    #[test]
    fn agentic_defaults_and_ranges() {
        let req = || AgenticRetrieveRequest {
            query: "q".into(),
            tenant_id: "t".into(),
            ..Default::default()
        };
        let a = Agentic::try_from(req()).expect("valid");
        assert_eq!(
            (a.max_steps, a.effort, a.top_k_per_step, a.token_budget),
            (5, Effort::Medium, 5, 8_000)
        );
        assert_eq!(a.max_latency, Duration::from_secs(30));
        assert_eq!(a.mode, Mode::Auto);
        assert!(a.namespaces.is_empty());
        let bad = |f: fn(&mut AgenticRetrieveRequest)| {
            let mut r = req();
            f(&mut r);
            field(Agentic::try_from(r))
        };
        assert_eq!(bad(|r| r.max_steps = Some(0)), "max_steps");
        assert_eq!(bad(|r| r.top_k_per_step = Some(51)), "top_k_per_step");
        assert_eq!(bad(|r| r.token_budget = Some(100_001)), "token_budget");
        assert_eq!(bad(|r| r.max_latency_ms = Some(120_001)), "max_latency_ms");
        assert_eq!(bad(|r| r.reasoning_effort = "x".into()), "reasoning_effort");
        assert_eq!(bad(|r| r.kb_ids = vec![String::new()]), "kb_ids");
        assert_eq!(bad(|r| r.mode = "graph".into()), "mode");
        assert_eq!(bad(|r| r.mode = "auto\0".into()), "mode");
        assert_eq!(bad(|r| r.mode = "AUTO".into()), "mode");
        let auto = Agentic::try_from(AgenticRetrieveRequest {
            mode: "auto".into(),
            ..req()
        });
        assert_eq!(auto.expect("auto").mode, Mode::Auto);
    }

    #[test]
    fn stops_on_budget_then_latency_then_steps() {
        let s = Duration::from_secs(1);
        assert_eq!(stop_reason(s / 2, s, 10, 100, 0, 5), None);
        assert_eq!(stop_reason(s / 2, s, 100, 100, 0, 5), Some("budget"));
        assert_eq!(stop_reason(s, s, 10, 100, 0, 5), Some("latency"));
        assert_eq!(stop_reason(s / 2, s, 10, 100, 5, 5), Some("max_steps"));
    }

    #[test]
    fn sources_pack_within_the_limit() {
        let r = |t: &str| FoundryResult {
            text: t.into(),
            ..Default::default()
        };
        let results = [r(&"a".repeat(100)), r(&"b".repeat(400)), r("short")];
        let c = pack_sources(&results, 40);
        assert_eq!(
            c,
            format!("[Source 1] {}\n\n[Source 2] short\n\n", "a".repeat(100))
        );
        assert!(tokens(&c) <= 40);
    }
}
