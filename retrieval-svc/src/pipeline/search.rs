//! Stage 2: candidate generation. The strategies of a route run
//! concurrently, each through its downstream stack (own timeout, breaker,
//! retry); a failed strategy degrades the answer instead of failing it. When
//! dense hits seed the graph walk, the graph waits for the vector list
//! (keyword still runs alongside). Graph hits carry only ids, so the fused
//! pool's missing memories are fetched with one `Get`.

use std::collections::HashMap;
use std::sync::Arc;

use engram_common::Identity;
use engram_common::settings::{FusionWeights, PipelineSettings, StrategyWeights};
use engram_proto::{
    Filters, GetRequest, KeywordSearchRequest, Memory, PprRequest, PprResponse, SearchResponse,
    Seed, VectorSearchRequest,
};
use tokio::time::Instant;

use crate::downstream::{DownstreamError, Downstreams, call};
use crate::error::Error;
use crate::evidence::{self, Evidence};
use crate::fusion::{Fused, StrategyList, max_score, rrf, weights_for};
use crate::router::{Raw, Route};

pub const VECTOR: &str = "vector";
pub const KEYWORD: &str = "keyword";
pub const GRAPH: &str = "graph";
pub const HYDE: &str = "hyde";

/// Fusion weights of one fused list.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Weights {
    pub vector: f32,
    pub keyword: f32,
    pub graph: f32,
    pub k: f32,
}

impl Weights {
    pub fn of(w: &StrategyWeights, default_k: f32) -> Self {
        Self {
            vector: w.vector.max(0.0),
            keyword: w.keyword.max(0.0),
            graph: w.graph.max(0.0),
            k: w.rrf_k_opt.unwrap_or(default_k).max(0.0),
        }
    }
}

/// How the fused list is weighted.
#[derive(Debug, Clone)]
pub enum Fusion {
    Fixed(Weights),
    /// AUTO: every strategy runs; the route (and so the weights) follows the
    /// evidence the graph returns with its walk (evidence.rs).
    ByEvidence {
        indicator: Route,
        weights: FusionWeights,
        default_k: f32,
        anchor_max_df_ratio: f32,
    },
}

/// Which strategies to run and how to fuse them.
#[derive(Debug, Clone)]
pub struct Plan {
    pub vector: bool,
    pub keyword: bool,
    pub graph: bool,
    /// Seed the graph walk with the top dense hits (sequential vector → graph).
    pub dense_seeds: bool,
    /// Keep at most this many fused candidates.
    pub pool: usize,
    pub fusion: Fusion,
}

impl Plan {
    fn pool(p: &PipelineSettings, limit: u32) -> usize {
        (limit as usize)
            .max(p.rerank_top_n)
            .saturating_mul(2)
            .min(200)
    }

    /// A fixed route: its strategies with weight > 0 (a route always has a
    /// dense list, even if its weight is tuned to 0: it feeds HyDE, the
    /// cache's query embedding and the fallback).
    pub fn for_route(route: Route, p: &PipelineSettings, limit: u32) -> Self {
        let w = Weights::of(weights_for(&p.weights, route), p.rrf_k);
        Self {
            vector: true,
            keyword: w.keyword > 0.0,
            graph: w.graph > 0.0,
            dense_seeds: p.graph_dense_seeds > 0,
            pool: Self::pool(p, limit),
            fusion: Fusion::Fixed(Weights {
                vector: w.vector.max(f32::MIN_POSITIVE),
                ..w
            }),
        }
    }

    /// AUTO: all three strategies; weights by evidence.
    pub fn by_evidence(indicator: Route, p: &PipelineSettings, limit: u32) -> Self {
        Self {
            vector: true,
            keyword: true,
            graph: true,
            dense_seeds: p.graph_dense_seeds > 0,
            pool: Self::pool(p, limit),
            fusion: Fusion::ByEvidence {
                indicator,
                weights: p.weights.clone(),
                default_k: p.rrf_k,
                anchor_max_df_ratio: p.anchor_max_df_ratio,
            },
        }
    }

    /// Raw modes for evaluation: single strategy (graph with entity seeds
    /// only, the pure strategy); `Raw::Hybrid` here is the equal-weight
    /// fusion of all three (the gateway's HYBRID mode uses `by_evidence`).
    pub fn raw(raw: Raw, limit: u32, k: f32) -> Self {
        let (vector, keyword, graph) = match raw {
            Raw::Vector => (1.0, 0.0, 0.0),
            Raw::Keyword => (0.0, 1.0, 0.0),
            Raw::Graph => (0.0, 0.0, 1.0),
            Raw::Hybrid => (1.0, 1.0, 1.0),
        };
        Self {
            vector: vector > 0.0,
            keyword: keyword > 0.0,
            graph: graph > 0.0,
            dense_seeds: false,
            pool: limit as usize,
            fusion: Fusion::Fixed(Weights {
                vector,
                keyword,
                graph,
                k,
            }),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Candidate {
    pub memory: Memory,
    pub fused: Fused,
    pub via_entities: Vec<String>,
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
}

type Outcome<T> = Option<Result<T, DownstreamError>>;

async fn bounded<T>(
    deadline: Instant,
    fut: impl Future<Output = Result<T, DownstreamError>>,
) -> Result<T, DownstreamError> {
    tokio::time::timeout_at(deadline, fut)
        .await
        .unwrap_or(Err(DownstreamError::Timeout))
}

#[allow(clippy::too_many_arguments)]
pub async fn candidates(
    ds: &Downstreams,
    settings: &PipelineSettings,
    identity: &Arc<Identity>,
    text: &str,
    hypotheses: &[String],
    filters: &Filters,
    plan: &Plan,
    deadline: Instant,
) -> Result<Candidates, Error> {
    let k = settings.candidates_per_strategy.clamp(1, 200);
    let vector_req = |t: &str| VectorSearchRequest {
        text: t.to_string(),
        embedding: Vec::new(),
        filters: Some(filters.clone()),
        k,
    };
    let ppr_req = |seeds: Vec<Seed>| PprRequest {
        query_text: text.to_string(),
        seeds,
        k: k.min(50),
        namespace: filters.namespace.clone(),
        include_historical: filters.include_historical,
        ..Default::default()
    };
    let run_graph = plan.graph;
    let seeded = run_graph && plan.dense_seeds && plan.vector;

    let vector_then_graph = async {
        let v: Outcome<SearchResponse> = if plan.vector {
            Some(bounded(deadline, call(&ds.vector, identity, vector_req(text))).await)
        } else {
            None
        };
        let g: Outcome<PprResponse> = if seeded {
            let seeds = match &v {
                Some(Ok(r)) => r
                    .hits
                    .iter()
                    .filter_map(|h| h.memory.as_ref())
                    .take(settings.graph_dense_seeds as usize)
                    .enumerate()
                    // Raw rank weights: graph-svc scales memory seeds by its
                    // own graph.memory_seed_weight so entity seeds dominate.
                    .map(|(i, m)| Seed {
                        memory_id: m.id.clone(),
                        weight: 1.0 / (i as f32 + 1.0),
                    })
                    .collect(),
                _ => Vec::new(),
            };
            Some(bounded(deadline, call(&ds.ppr, identity, ppr_req(seeds))).await)
        } else {
            None
        };
        (v, g)
    };
    let keyword = async {
        if plan.keyword {
            let req = KeywordSearchRequest {
                text: text.to_string(),
                filters: Some(filters.clone()),
                k,
            };
            Some(bounded(deadline, call(&ds.keyword, identity, req)).await)
        } else {
            None
        }
    };
    let graph_parallel = async {
        if run_graph && !seeded {
            Some(bounded(deadline, call(&ds.ppr, identity, ppr_req(Vec::new()))).await)
        } else {
            None
        }
    };
    let hyde = futures::future::join_all(
        hypotheses
            .iter()
            .filter(|_| plan.vector)
            .map(|h| bounded(deadline, call(&ds.vector, identity, vector_req(h)))),
    );
    let ((v, g_seq), kw, g_par, hyde) =
        tokio::join!(vector_then_graph, keyword, graph_parallel, hyde);
    let g = g_seq.or(g_par);

    let mut out = Candidates::default();
    let mut memories: HashMap<String, Memory> = HashMap::new();
    let mut via: HashMap<String, Vec<String>> = HashMap::new();
    let mut lists = Vec::new();
    let mut attempted = 0;
    let mut failed = 0;
    let mut search_list = |name: &'static str,
                           r: Outcome<SearchResponse>,
                           counts: bool,
                           out: &mut Candidates,
                           memories: &mut HashMap<String, Memory>| {
        let r = r?;
        if counts {
            attempted += 1;
        }
        match r {
            Ok(resp) => {
                if name == VECTOR && !resp.query_embedding.is_empty() {
                    out.query_embedding_opt = Some(resp.query_embedding.clone());
                }
                let hits = resp
                    .hits
                    .into_iter()
                    .filter_map(|h| {
                        let m = h.memory?;
                        let id = m.id.clone();
                        memories.entry(id.clone()).or_insert(m);
                        Some((id, h.score))
                    })
                    .collect();
                Some(StrategyList {
                    strategy: name,
                    // Set once the fusion weights are known.
                    weight: 0.0,
                    hits,
                })
            }
            Err(e) => {
                if counts {
                    failed += 1;
                }
                tracing::warn!(strategy = name, error = %e, "strategy degraded");
                if !out.degraded.contains(&name) {
                    out.degraded.push(name);
                }
                None
            }
        }
    };
    lists.extend(search_list(VECTOR, v, true, &mut out, &mut memories));
    lists.extend(search_list(KEYWORD, kw, true, &mut out, &mut memories));
    for h in hyde {
        lists.extend(search_list(HYDE, Some(h), false, &mut out, &mut memories));
    }
    if let Some(g) = g {
        attempted += 1;
        match g {
            Ok(resp) => {
                if let Fusion::ByEvidence {
                    anchor_max_df_ratio,
                    ..
                } = &plan.fusion
                {
                    out.evidence = Evidence::from_linked(
                        &resp.linked_entities,
                        resp.memory_count,
                        *anchor_max_df_ratio,
                    );
                }
                if resp.deadline_exceeded {
                    // Partial walk: usable, but say so.
                    out.degraded.push(GRAPH);
                }
                let hits = resp
                    .hits
                    .into_iter()
                    .map(|h| {
                        via.insert(h.memory_id.clone(), h.via_entities);
                        (h.memory_id, h.score)
                    })
                    .collect();
                lists.push(StrategyList {
                    strategy: GRAPH,
                    weight: 0.0,
                    hits,
                });
            }
            Err(e) => {
                failed += 1;
                tracing::warn!(strategy = GRAPH, error = %e, "strategy degraded");
                out.degraded.push(GRAPH);
            }
        }
    }
    if attempted > 0 && failed == attempted {
        return Err(Error::RetrievalCircuitOpen);
    }

    let w = match &plan.fusion {
        Fusion::Fixed(w) => *w,
        Fusion::ByEvidence {
            indicator,
            weights,
            default_k,
            ..
        } => {
            let route = evidence::route(*indicator, &out.evidence);
            out.route_opt = Some(route);
            Weights::of(weights_for(weights, route), *default_k)
        }
    };
    for list in &mut lists {
        list.weight = match list.strategy {
            VECTOR | HYDE => w.vector,
            KEYWORD => w.keyword,
            _ => w.graph,
        };
    }
    let mut fused = rrf(&lists, w.k);
    out.total = fused.len();
    out.max_rrf = max_score(&lists, w.k);
    fused.truncate(plan.pool);

    let missing: Vec<String> = fused
        .iter()
        .filter(|f| !memories.contains_key(&f.id))
        .map(|f| f.id.clone())
        .collect();
    if !missing.is_empty() {
        let req = GetRequest {
            ids: missing,
            include_embedding: false,
        };
        match bounded(deadline, call(&ds.get, identity, req)).await {
            Ok(resp) => {
                for m in resp.memories {
                    memories.entry(m.id.clone()).or_insert(m);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "fetching graph hits failed");
                out.degraded.push("memory_fetch");
            }
        }
    }
    out.candidates = fused
        .into_iter()
        .filter_map(|f| {
            let memory = memories.remove(&f.id)?;
            let via_entities = via.remove(&f.id).unwrap_or_default();
            Some(Candidate {
                memory,
                fused: f,
                via_entities,
            })
        })
        .collect();
    Ok(out)
}
