//! Stage 1's output: which strategies a query runs, how their lists are
//! fused, and which later signals (Stage 4b's slots, the hedge, the next
//! hop) may act on its answer. route.rs builds a plan; search.rs runs it.

use engram_common::settings::{
    ComplementSettings, FusionWeights, PipelineSettings, StrategyWeights,
};

use super::fusion::weights_for;
use super::session::Lift;
use crate::query::{Raw, Route};

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

/// How a plan searches for the next hop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HopPlan {
    /// Names of the first memory added to the question.
    pub names: usize,
    /// Memories asked of the keyword index.
    pub depth: u32,
    /// The place a find takes (Stage 4b's slots): an answer no longer than
    /// that has no room for one.
    pub at: usize,
}

impl HopPlan {
    /// None when the settings turn Stage 4b or the second search off.
    pub fn of(c: &ComplementSettings) -> Option<Self> {
        (c.pool > 0 && c.hop_names > 0).then(|| Self {
            names: c.hop_names,
            depth: u32::try_from(c.hop_depth).unwrap_or(1).max(1),
            at: c.slots,
        })
    }
}

/// Which strategies to run and how to fuse them.
#[derive(Debug, Clone)]
pub struct Plan {
    pub vector: bool,
    pub keyword: bool,
    pub graph: bool,
    /// Seed the graph walk with the top dense hits (sequential vector → graph).
    pub dense_seeds: bool,
    /// Sentences nearest the query to ask for with the vector list; their
    /// entities seed the walk (sequential vector → graph). 0 = none.
    pub fact_seeds: u32,
    /// Keep at most this many fused candidates.
    pub pool: usize,
    pub fusion: Fusion,
    /// Conversation turns lifted by their session and speaker (off in the
    /// raw modes, which are the strategies' own order).
    pub lift: Lift,
    /// The route a fixed plan runs (AUTO's comes from the evidence).
    pub route_opt: Option<Route>,
    /// Stage 4b may reorder this plan's answer (not in raw modes): when the
    /// route is one it reorders ([`Plan::complements`]) Stage 2 then reads
    /// the fused candidates' vectors beside the graph hits' rows, so Stage
    /// 4b needs no round trip of its own.
    pub complement: bool,
    /// The question is a chain of relations (`route::chained`), so Stage 4b
    /// reorders it on the simple route too. Set by `route::Step::plan`.
    pub chained: bool,
    /// The simple route's weights, when Stage 4b's hedge is on: a
    /// multi-hop answer then keeps the simple reading's #1 in its pool
    /// (`Candidates::hedge_opt`).
    pub hedge_opt: Option<Weights>,
    /// The second keyword search of an answer Stage 4b reorders (hop.rs,
    /// after Stage 3), when on.
    pub hop_opt: Option<HopPlan>,
}

impl Plan {
    /// Whether Stage 4b reorders this plan's answer on `route`: multi-hop
    /// answers, and simple ones to a chain of relations (AUTO's route comes
    /// from the graph's evidence, which chat memories and misspelt names
    /// never give).
    pub fn complements(&self, route: Route) -> bool {
        self.complement
            && match route {
                Route::MultiHop => true,
                Route::Simple => self.chained,
                Route::Exploratory => false,
            }
    }

    fn lift(p: &PipelineSettings) -> Lift {
        Lift {
            session: p.session_lift,
            speaker: p.speaker_lift,
            time: p.time_lift,
        }
    }

    fn hedge(p: &PipelineSettings) -> Option<Weights> {
        (p.complement.pool > 0 && p.complement.hedge)
            .then(|| Weights::of(&p.weights.simple, p.rrf_k))
    }

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
            fact_seeds: p.graph_fact_seeds,
            pool: Self::pool(p, limit),
            fusion: Fusion::Fixed(Weights {
                vector: w.vector.max(f32::MIN_POSITIVE),
                ..w
            }),
            lift: Self::lift(p),
            route_opt: Some(route),
            complement: p.complement.pool > 0,
            chained: false,
            hedge_opt: Self::hedge(p),
            hop_opt: HopPlan::of(&p.complement),
        }
    }

    /// AUTO: all three strategies; weights by evidence.
    pub fn by_evidence(indicator: Route, p: &PipelineSettings, limit: u32) -> Self {
        Self {
            vector: true,
            keyword: true,
            graph: true,
            dense_seeds: p.graph_dense_seeds > 0,
            fact_seeds: p.graph_fact_seeds,
            pool: Self::pool(p, limit),
            fusion: Fusion::ByEvidence {
                indicator,
                weights: p.weights.clone(),
                default_k: p.rrf_k,
                anchor_max_df_ratio: p.anchor_max_df_ratio,
            },
            lift: Self::lift(p),
            route_opt: None,
            complement: p.complement.pool > 0,
            chained: false,
            hedge_opt: Self::hedge(p),
            hop_opt: HopPlan::of(&p.complement),
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
            fact_seeds: 0,
            pool: limit as usize,
            fusion: Fusion::Fixed(Weights {
                vector,
                keyword,
                graph,
                k,
            }),
            lift: Lift::OFF,
            route_opt: None,
            complement: false,
            chained: false,
            hedge_opt: None,
            hop_opt: None,
        }
    }
}
