//! Stage 2: search and fuse. The strategies of a plan run concurrently, each
//! through its downstream stack (own timeout, breaker, retry, and the
//! request's deadline); a failed strategy degrades the answer instead of
//! failing it. When dense hits seed the graph walk, the graph waits for the
//! vector list (keyword still runs alongside). The lists are fused by
//! weighted RRF (fusion.rs), with weights chosen by the route or, in AUTO,
//! by the graph's entity evidence (evidence.rs). Graph hits carry only ids,
//! so the fused pool's missing memories are fetched with one `Get`.

use std::collections::HashMap;

use engram_proto::{
    FactSeed, Filters, GetRequest, KeywordSearchRequest, Memory, PprRequest, PprResponse,
    SearchResponse, Seed, StrategyHit, VectorSearchRequest,
};
use tokio::time::Instant;

use super::ctx::Ctx;
use super::evidence::{self, Evidence};
use super::fusion::{Fused, StrategyList, max_score, rank_fusion, rrf, weights_for};
use super::later::{Vectors, read_vectors, stage_deadline};
use super::plan::{Fusion, Plan, Weights};
use super::session;
use super::strategy::Strategy;
use super::when;
use crate::downstream::{DownstreamError, call_until};
use crate::error::Error;
use crate::metrics::{Metrics, strategy_label};
use crate::query::Route;
use chrono::{DateTime, Utc};

#[derive(Debug, Clone)]
pub struct Candidate {
    pub memory: Memory,
    pub fused: Fused,
    pub via_entities: Vec<String>,
}

impl Candidate {
    /// A memory a later search found that was not fused in Stage 2: one
    /// hit, credited to `strategy` at `rank` (0-based) with `score`.
    pub fn found(memory: Memory, strategy: Strategy, rank: usize, score: f32) -> Self {
        let hit = StrategyHit {
            strategy: strategy.name().to_string(),
            rank: rank as u32 + 1,
            score,
        };
        Self {
            fused: Fused {
                id: memory.id.clone(),
                rrf: 0.0,
                hits: vec![hit],
            },
            memory,
            via_entities: Vec::new(),
        }
    }
}

#[derive(Debug, Default)]
pub struct Candidates {
    pub candidates: Vec<Candidate>,
    /// Distinct memories any strategy returned.
    pub total: usize,
    pub max_rrf: f32,
    pub degraded: Vec<&'static str>,
    pub query_embedding_opt: Option<Vec<f32>>,
    /// The evidence-chosen route (AUTO plans only).
    pub route_opt: Option<Route>,
    pub evidence: Evidence,
    /// A strategy answered from data older than the latest change it knew
    /// of (graph-svc mid-rebuild): usable, but not to be cached as fresh.
    pub stale: bool,
    /// graph-svc's current graph of the tenant has no `contradicts` edge,
    /// so Stage 5 need not ask it for contradictions (one call fewer).
    pub no_contradictions: bool,
    /// The fused candidates' stored vectors, for Stage 4b.
    pub vectors: Vectors,
    /// On a multi-hop answer (with the hedge on), the memory the simple
    /// route's weights put first; kept in the candidates, where Stage 4b
    /// gives it the place after its slots.
    pub hedge_opt: Option<String>,
}

/// Stage 2 for one attempt: fan out, fuse, fetch what the graph named.
/// Strategies that all "failed" because the pipeline ran out of time are a
/// deadline, not an open circuit.
pub async fn run(
    ctx: &Ctx<'_>,
    plan: &Plan,
    filters: &Filters,
    hypotheses: &[String],
) -> Result<Candidates, Error> {
    let deadline = stage_deadline(ctx.deadline);
    let outcomes = fan_out(ctx, plan, filters, hypotheses, deadline).await;
    let mut pool = match Pool::gather(outcomes, plan) {
        Err(Error::RetrievalCircuitOpen | Error::RetrievalTimedOut)
            if Instant::now() >= deadline =>
        {
            return Err(Error::DeadlineExceeded);
        }
        other => other?,
    };
    let reference_opt = filters
        .as_of_event
        .as_ref()
        .and_then(|t| DateTime::from_timestamp(t.seconds, 0));
    let fused = pool.fuse(plan, &ctx.query.text, reference_opt);
    let complements =
        (pool.out.route_opt.or(plan.route_opt)).is_some_and(|chosen| plan.complements(chosen));
    if complements {
        // Beside the graph hits' rows, not after Stage 4: one round trip
        // fewer on the multi-hop path (at 8 in flight Stage 4b's own read
        // waited 7 ms p50 behind the other queries' work).
        let ids = fused.iter().map(|f| f.id.clone()).collect();
        let (_, vectors) = tokio::join!(
            pool.fetch_missing(ctx, &fused, filters, deadline),
            read_vectors(ctx, ids, deadline)
        );
        pool.out.vectors = vectors;
    } else {
        pool.fetch_missing(ctx, &fused, filters, deadline).await;
    }
    Ok(pool.into_candidates(fused))
}

/// A list's weight under `w`.
fn weight_of(strategy: Strategy, w: &Weights) -> f32 {
    match strategy.slot() {
        Some(0) => w.vector,
        Some(1) => w.keyword,
        _ => w.graph,
    }
}

/// Where `id` stands in each list (provenance for a memory the route's own
/// fusion left out).
fn hits_of(id: &str, lists: &[StrategyList]) -> Vec<StrategyHit> {
    (lists.iter())
        .filter_map(|l| {
            let i = l.hits.iter().position(|(hit, _)| hit == id)?;
            Some(StrategyHit {
                strategy: l.strategy.name().to_string(),
                rank: i as u32 + 1,
                score: l.hits[i].1,
            })
        })
        .collect()
}

/// Candidates per strategy after Stage 2 plus the fused total, observed in
/// `engram_retrieval_candidates{stage="search"}`.
pub fn counts(m: &Metrics, c: &Candidates) -> Vec<(&'static str, usize)> {
    let mut counts: Vec<(&'static str, usize)> = Vec::new();
    for cand in &c.candidates {
        for hit in &cand.fused.hits {
            let s = strategy_label(&hit.strategy);
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

type Outcome<T> = Option<Result<T, DownstreamError>>;

/// What each strategy answered (`None`: not run).
struct Outcomes {
    vector: Outcome<SearchResponse>,
    keyword: Outcome<SearchResponse>,
    graph: Outcome<PprResponse>,
    hyde: Vec<Result<SearchResponse, DownstreamError>>,
}

/// Runs the plan's strategies concurrently; with dense seeds the graph
/// walk starts from the top vector hits, so it waits for them.
async fn fan_out(
    ctx: &Ctx<'_>,
    plan: &Plan,
    filters: &Filters,
    hypotheses: &[String],
    deadline: Instant,
) -> Outcomes {
    let (ds, id, p) = (ctx.ds, &ctx.identity, &ctx.settings.pipeline);
    let text = ctx.query.text.as_str();
    // At least the answer's size, so a large `limit` is never starved by
    // lists that overlap.
    let k = (p.candidates_per_strategy.max(ctx.query.limit)).clamp(1, 200);
    let fact_k = match plan.graph {
        true => plan.fact_seeds,
        false => 0,
    };
    let vector_req = |t: &str, fact_k: u32| VectorSearchRequest {
        text: t.to_string(),
        embedding: Vec::new(),
        filters: Some(filters.clone()),
        k,
        fact_k,
    };
    let ppr_req = |seeds: Vec<Seed>, facts: Vec<FactSeed>| PprRequest {
        query_text: text.to_string(),
        seeds,
        facts,
        k: k.min(50),
        namespace: filters.namespace.clone(),
        // An as-of query needs the versions that are history now; the
        // gateway then keeps the ones visible at that time (validate.rs).
        include_historical: filters.include_historical
            || filters.as_of_event.is_some()
            || filters.as_of_ingestion.is_some(),
        after_write: ctx.after_write.clone(),
        ..Default::default()
    };
    let seeded = plan.graph && plan.vector && (plan.dense_seeds || fact_k > 0);
    let vector_then_graph = async {
        let v = match plan.vector {
            true => Some(call_until(&ds.vector, id, deadline, vector_req(text, fact_k)).await),
            false => None,
        };
        let g = match seeded {
            true => {
                let seeds = match plan.dense_seeds {
                    true => dense_seeds(&v, p.graph_dense_seeds as usize),
                    false => Vec::new(),
                };
                let req = ppr_req(seeds, fact_seeds(&v));
                Some(call_until(&ds.ppr, id, deadline, req).await)
            }
            false => None,
        };
        (v, g)
    };
    let keyword = async {
        let req = KeywordSearchRequest {
            text: text.to_string(),
            filters: Some(filters.clone()),
            k,
        };
        match plan.keyword {
            true => Some(call_until(&ds.keyword, id, deadline, req).await),
            false => None,
        }
    };
    let graph_parallel = async {
        match plan.graph && !seeded {
            true => {
                let req = ppr_req(Vec::new(), Vec::new());
                Some(call_until(&ds.ppr, id, deadline, req).await)
            }
            false => None,
        }
    };
    let hyde = futures::future::join_all(
        hypotheses
            .iter()
            .filter(|_| plan.vector)
            .map(|h| call_until(&ds.vector, id, deadline, vector_req(h, 0))),
    );
    let ((vector, g_seq), keyword, g_par, hyde) =
        tokio::join!(vector_then_graph, keyword, graph_parallel, hyde);
    Outcomes {
        vector,
        keyword,
        graph: g_seq.or(g_par),
        hyde,
    }
}

/// Graph seeds from the top dense hits, with raw rank weights: graph-svc
/// scales memory seeds by its own graph.memory_seed_weight so entity seeds
/// dominate.
fn dense_seeds(v: &Outcome<SearchResponse>, n: usize) -> Vec<Seed> {
    let Some(Ok(r)) = v else {
        return Vec::new();
    };
    r.hits
        .iter()
        .filter_map(|h| h.memory.as_ref())
        .take(n)
        .enumerate()
        .map(|(i, m)| Seed {
            memory_id: m.id.clone(),
            weight: 1.0 / (i as f32 + 1.0),
        })
        .collect()
}

/// The sentences the vector search matched, as fact seeds (a failed
/// vector search leaves the walk its query's own names).
fn fact_seeds(v: &Outcome<SearchResponse>) -> Vec<FactSeed> {
    let Some(Ok(r)) = v else {
        return Vec::new();
    };
    r.facts
        .iter()
        .map(|f| FactSeed {
            text: f.text.clone(),
            weight: f.score.max(0.0),
        })
        .collect()
}

/// The strategies' lists and everything they carried, on the way to one
/// fused candidate list.
#[derive(Default)]
struct Pool {
    out: Candidates,
    memories: HashMap<String, Memory>,
    via: HashMap<String, Vec<String>>,
    lists: Vec<StrategyList>,
    attempted: usize,
    failed: usize,
    /// Failures that were only slowness (a stage timeout or the request's
    /// deadline): if every strategy failed so, the caller hears that, not
    /// that a breaker is open (soak's fuzz run found the misleading message).
    slow: usize,
    /// A downstream's INVALID_ARGUMENT: the request, not the service, was
    /// wrong, and if every strategy failed the caller must hear why.
    invalid_opt: Option<String>,
    /// A downstream's RESOURCE_EXHAUSTED (busy, or a tenant graph still
    /// loading): if nothing answered, the caller should retry, not give up.
    busy_opt: Option<tonic::Status>,
}

impl Pool {
    /// Collects every list; fails only when every strategy that ran failed.
    fn gather(o: Outcomes, plan: &Plan) -> Result<Self, Error> {
        let mut pool = Self::default();
        pool.search_list(Strategy::Vector, o.vector, true);
        pool.search_list(Strategy::Keyword, o.keyword, true);
        for h in o.hyde {
            pool.search_list(Strategy::Hyde, Some(h), false);
        }
        if let Some(g) = o.graph {
            pool.graph_list(g, plan);
        }
        if pool.attempted > 0 && pool.failed == pool.attempted {
            return Err(match (pool.invalid_opt.take(), pool.busy_opt.take()) {
                (Some(rule), _) => Error::invalid("request", rule),
                (None, Some(status)) => Error::Downstream {
                    service: "retrieval",
                    status,
                },
                (None, None) if pool.slow == pool.failed => Error::RetrievalTimedOut,
                (None, None) => Error::RetrievalCircuitOpen,
            });
        }
        Ok(pool)
    }

    fn note_invalid(&mut self, e: &DownstreamError) {
        if matches!(e, DownstreamError::Timeout | DownstreamError::Deadline) {
            self.slow += 1;
        }
        let DownstreamError::Status(s) = e else {
            return;
        };
        match s.code() {
            tonic::Code::InvalidArgument => self.invalid_opt = Some(s.message().to_string()),
            tonic::Code::ResourceExhausted => self.busy_opt = Some(s.clone()),
            _ => {}
        }
    }

    /// A dense or keyword list; HyDE lists do not count towards "every
    /// strategy failed".
    fn search_list(&mut self, strategy: Strategy, r: Outcome<SearchResponse>, counts: bool) {
        let name = strategy.name();
        let Some(r) = r else {
            return;
        };
        self.attempted += usize::from(counts);
        let resp = match r {
            Ok(resp) => resp,
            Err(e) => {
                self.failed += usize::from(counts);
                self.note_invalid(&e);
                tracing::warn!(strategy = name, error = %e, "strategy degraded");
                if !self.out.degraded.contains(&name) {
                    self.out.degraded.push(name);
                }
                return;
            }
        };
        if strategy == Strategy::Vector && !resp.query_embedding.is_empty() {
            self.out.query_embedding_opt = Some(resp.query_embedding.clone());
        }
        let hits = resp
            .hits
            .into_iter()
            .filter_map(|h| {
                let m = h.memory?;
                let id = m.id.clone();
                self.memories.entry(id.clone()).or_insert(m);
                Some((id, h.score))
            })
            .collect();
        self.lists.push(StrategyList {
            strategy,
            // Set once the fusion weights are known.
            weight: 0.0,
            hits,
        });
    }

    /// The graph's list, and with an evidence plan the entity evidence
    /// that picks the fusion weights.
    fn graph_list(&mut self, r: Result<PprResponse, DownstreamError>, plan: &Plan) {
        self.attempted += 1;
        let resp = match r {
            Ok(resp) => resp,
            Err(e) => {
                self.failed += 1;
                self.note_invalid(&e);
                tracing::warn!(strategy = Strategy::Graph.name(), error = %e, "strategy degraded");
                self.out.degraded.push(Strategy::Graph.name());
                return;
            }
        };
        if let Fusion::ByEvidence {
            anchor_max_df_ratio,
            ..
        } = &plan.fusion
        {
            self.out.evidence = Evidence::from_linked(
                &resp.linked_entities,
                resp.memory_count,
                *anchor_max_df_ratio,
            );
        }
        self.out.stale |= resp.stale;
        // A stale graph may be missing a contradiction written since.
        self.out.no_contradictions = resp.no_contradicts_edges && !resp.stale;
        if resp.deadline_exceeded {
            // Partial walk: usable, but say so.
            self.out.degraded.push(Strategy::Graph.name());
        }
        let hits = resp
            .hits
            .into_iter()
            .map(|h| {
                self.via.insert(h.memory_id.clone(), h.via_entities);
                (h.memory_id, h.score)
            })
            .collect();
        self.lists.push(StrategyList {
            strategy: Strategy::Graph,
            weight: 0.0,
            hits,
        });
    }

    /// Weighted RRF over the lists, conversation turns lifted by their
    /// session and speaker, cut to the plan's pool size (plus the hedge of
    /// a multi-hop answer, [`Pool::hedge`]).
    fn fuse(
        &mut self,
        plan: &Plan,
        query: &str,
        reference_opt: Option<DateTime<Utc>>,
    ) -> Vec<Fused> {
        let w = match &plan.fusion {
            Fusion::Fixed(w) => *w,
            Fusion::ByEvidence {
                indicator,
                weights,
                default_k,
                ..
            } => {
                let route = evidence::route(*indicator, &self.out.evidence);
                self.out.route_opt = Some(route);
                Weights::of(weights_for(weights, route), *default_k)
            }
        };
        for list in &mut self.lists {
            list.weight = weight_of(list.strategy, &w);
        }
        let mut fused = rrf(&self.lists, w.k);
        self.out.total = fused.len();
        self.out.max_rrf = max_score(&self.lists, w.k);
        session::lift(&mut fused, &self.memories, query, plan.lift);
        // Parsing time expressions is the costlier half: skip it when the
        // lift would multiply by 1 anyway.
        if plan.lift.time > 0.0
            && let Some(span) = when::parse(query, reference_opt, Utc::now())
        {
            when::lift(&mut fused, &self.memories, span, plan.lift.time);
        }
        let kept_opt = self.hedge(plan, &mut fused);
        fused.truncate(plan.pool);
        fused.extend(kept_opt);
        fused
    }

    /// The hedge of a multi-hop answer (`Plan::hedge_opt`): the memory the
    /// simple route's weights fuse first, noted in `hedge_opt` and handed
    /// back when the pool would lose it (fused beyond the pool's size, or
    /// not fused at all because only a list this route weighs 0 found it:
    /// keyword on multi-hop); the caller appends it after the cut.
    fn hedge(&mut self, plan: &Plan, fused: &mut Vec<Fused>) -> Option<Fused> {
        let route_opt = self.out.route_opt.or(plan.route_opt);
        let simple = match (route_opt, plan.hedge_opt) {
            (Some(Route::MultiHop), Some(simple)) if plan.complement => simple,
            _ => return None,
        };
        let id = self.first_by(&simple)?;
        let kept_opt = match fused.iter().position(|f| f.id == id) {
            Some(i) if i < plan.pool => None,
            Some(i) => Some(fused.remove(i)),
            None => {
                self.out.total += 1;
                Some(Fused {
                    id: id.clone(),
                    rrf: 0.0,
                    hits: hits_of(&id, &self.lists),
                })
            }
        };
        self.out.hedge_opt = Some(id);
        kept_opt
    }

    /// The memory `w` would fuse first from these lists (no lifts: they are
    /// for conversation turns, which multi-hop answers rarely are).
    fn first_by(&self, w: &Weights) -> Option<String> {
        let lists = (self.lists.iter()).map(|l| {
            (
                weight_of(l.strategy, w),
                l.hits.iter().map(|(id, _)| id.as_str()),
            )
        });
        let first_opt = rank_fusion(lists, w.k).into_iter().next();
        first_opt.map(|(id, _, _)| id.to_string())
    }

    /// Fetches the fused memories no list carried (graph hits are ids).
    /// An as-of read fetches them as recorded then, as the search lists
    /// carry them (search-svc rows.rs `as_recorded_at`).
    async fn fetch_missing(
        &mut self,
        ctx: &Ctx<'_>,
        fused: &[Fused],
        filters: &Filters,
        deadline: Instant,
    ) {
        let missing: Vec<String> = fused
            .iter()
            .filter(|f| !self.memories.contains_key(&f.id))
            .map(|f| f.id.clone())
            .collect();
        if missing.is_empty() {
            return;
        }
        let req = GetRequest {
            ids: missing,
            include_embedding: false,
            omit_entities: true,
            vectors_only: false,
            as_of_ingestion: filters.as_of_ingestion,
            ..Default::default()
        };
        match call_until(&ctx.ds.get, &ctx.identity, deadline, req).await {
            Ok(resp) => {
                for m in resp.memories {
                    self.memories.entry(m.id.clone()).or_insert(m);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "fetching graph hits failed");
                self.out.degraded.push("memory_fetch");
            }
        }
    }

    fn into_candidates(mut self, fused: Vec<Fused>) -> Candidates {
        self.out.candidates = fused
            .into_iter()
            .filter_map(|f| {
                let memory = self.memories.remove(&f.id)?;
                let via_entities = self.via.remove(&f.id).unwrap_or_default();
                Some(Candidate {
                    memory,
                    fused: f,
                    via_entities,
                })
            })
            .collect();
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::Raw;
    use engram_common::settings::PipelineSettings;

    fn plan() -> Plan {
        Plan::raw(Raw::Vector, 10, 60.0)
    }

    fn outcomes(vector: Outcome<SearchResponse>, keyword: Outcome<SearchResponse>) -> Outcomes {
        Outcomes {
            vector,
            keyword,
            graph: None,
            hyde: Vec::new(),
        }
    }

    #[test]
    fn stage_4b_reorders_multi_hop_and_chained_simple_answers_only() {
        let p = PipelineSettings::default();
        let plain = Plan::for_route(Route::Simple, &p, 10);
        let chain = Plan {
            chained: true,
            ..Plan::for_route(Route::Simple, &p, 10)
        };
        assert!(plain.complements(Route::MultiHop));
        assert!(!plain.complements(Route::Simple));
        assert!(chain.complements(Route::Simple));
        assert!(!chain.complements(Route::Exploratory));
        let raw = Plan {
            chained: true,
            ..Plan::raw(Raw::Vector, 10, 60.0)
        };
        assert!(!raw.complements(Route::MultiHop));
        assert!(!raw.complements(Route::Simple));
    }

    fn response(ids: &[&str]) -> SearchResponse {
        SearchResponse {
            hits: (ids.iter())
                .map(|id| engram_proto::SearchHit {
                    memory: Some(Memory {
                        id: id.to_string(),
                        ..Default::default()
                    }),
                    score: 1.0,
                    rank: 0,
                })
                .collect(),
            ..Default::default()
        }
    }

    /// A multi-hop plan that ran the keyword list too (as AUTO does).
    fn multi_hop_plan(pool: usize) -> Plan {
        let p = PipelineSettings::default();
        Plan {
            keyword: true,
            pool,
            ..Plan::for_route(Route::MultiHop, &p, 10)
        }
    }

    #[test]
    fn a_multi_hop_pool_keeps_the_simple_readings_first_even_from_a_list_it_weighs_0() {
        // The multi-hop weights give keyword 0, so "k" (the keyword list's
        // #1, the dense list's #3) has no fused score; the simple weights
        // put it first.
        let o = outcomes(
            Some(Ok(response(&["a", "b", "k", "c"]))),
            Some(Ok(response(&["k", "x"]))),
        );
        let plan = multi_hop_plan(2);
        let mut pool = Pool::gather(o, &plan).expect("lists");
        let fused = pool.fuse(&plan, "q", None);
        let ids: Vec<&str> = fused.iter().map(|f| f.id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "k"]);
        assert_eq!(pool.out.hedge_opt.as_deref(), Some("k"));
        assert_eq!(fused[2].hits[0].strategy, Strategy::Vector.name());
        // Found by the keyword list alone, it has no fused entry at all: its
        // provenance names the list that found it.
        let o = outcomes(
            Some(Ok(response(&["a", "b", "c"]))),
            Some(Ok(response(&["k"]))),
        );
        let mut pool = Pool::gather(o, &plan).expect("lists");
        let fused = pool.fuse(&plan, "q", None);
        let ids: Vec<&str> = fused.iter().map(|f| f.id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "k"]);
        let strategies: Vec<(&str, u32)> = (fused[2].hits.iter())
            .map(|h| (h.strategy.as_str(), h.rank))
            .collect();
        assert_eq!(strategies, [(Strategy::Keyword.name(), 1)]);
        assert_eq!(fused[2].rrf, 0.0);

        // The simple route, or the hedge off: nothing kept.
        let simple = Plan {
            keyword: true,
            ..Plan::for_route(Route::Simple, &PipelineSettings::default(), 10)
        };
        let o = outcomes(Some(Ok(response(&["a"]))), Some(Ok(response(&["k"]))));
        let mut pool = Pool::gather(o, &simple).expect("lists");
        pool.fuse(&simple, "q", None);
        assert_eq!(pool.out.hedge_opt, None);
        let off = Plan {
            hedge_opt: None,
            ..multi_hop_plan(2)
        };
        let o = outcomes(Some(Ok(response(&["a"]))), Some(Ok(response(&["k"]))));
        let mut pool = Pool::gather(o, &off).expect("lists");
        let fused = pool.fuse(&off, "q", None);
        assert_eq!(pool.out.hedge_opt, None);
        assert_eq!(fused.len(), 1);
    }

    #[test]
    fn strategies_that_were_only_slow_say_so() {
        let o = outcomes(Some(Err(DownstreamError::Timeout)), None);
        assert!(matches!(
            Pool::gather(o, &plan()),
            Err(Error::RetrievalTimedOut)
        ));
        let o = outcomes(
            Some(Err(DownstreamError::Timeout)),
            Some(Err(DownstreamError::Deadline)),
        );
        assert!(matches!(
            Pool::gather(o, &plan()),
            Err(Error::RetrievalTimedOut)
        ));
    }

    #[test]
    fn open_breakers_everywhere_are_still_unavailable() {
        let o = outcomes(
            Some(Err(DownstreamError::CircuitOpen)),
            Some(Err(DownstreamError::Timeout)),
        );
        assert!(matches!(
            Pool::gather(o, &plan()),
            Err(Error::RetrievalCircuitOpen)
        ));
    }
}
