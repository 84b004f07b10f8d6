//! gRPC handlers: validate at the boundary, resolve the caller's view, run
//! the walk off the async runtime.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use engram_common::Identity;
use engram_common::settings::Settings;
use engram_proto::graph_service_server::GraphService;
use engram_proto::{
    Contradiction, ContradictionsRequest, ContradictionsResponse, GraphHit, LinkQueryRequest,
    LinkQueryResponse, LinkedEntity, Neighbor, NeighborsRequest, NeighborsResponse, PprRequest,
    PprResponse, StatsRequest, StatsResponse,
};
use tonic::{Request, Response, Status};
use uuid::Uuid;

use crate::error::Error;
use crate::graph::{Graph, NodeBudget, PprParams, View};
use crate::store::heard::MAX_WRITE_ID_CHARS;
use crate::store::{Registry, Served};

const MAX_QUERY_CHARS: usize = 8192;
const MAX_SEEDS: usize = 200;
const MAX_FACTS: usize = 32;
const MAX_IDS: usize = 1000;
pub const MAX_NODES: u32 = 1000;
pub const MAX_HOPS: u32 = 4;
pub const MAX_K: u32 = 50;

pub struct GraphSvc {
    registry: Arc<Registry>,
    settings: Settings,
}

impl GraphSvc {
    pub fn new(registry: Arc<Registry>, settings: Settings) -> Self {
        Self { registry, settings }
    }

    fn identity<T>(&self, req: &Request<T>) -> Result<Identity, Error> {
        Ok(Identity::read_internal(
            req.metadata(),
            self.settings.auth.internal_token_opt.as_deref(),
        )?)
    }

    /// The client's gRPC deadline when shorter than the graph timeout.
    fn deadline<T>(&self, req: &Request<T>) -> Instant {
        let own = Duration::from_millis(self.settings.pipeline.graph_timeout_ms.max(1));
        let client = engram_common::server::grpc_timeout(req.metadata());
        Instant::now() + client.map_or(own, |c| c.min(own))
    }

    /// The tenant's graph, waiting for a first load no longer than
    /// `graph.load_wait_ms` and the request's deadline allow.
    async fn serve(&self, tenant: &str, deadline: Instant) -> Result<Served, Error> {
        let wait = load_wait(
            deadline.saturating_duration_since(Instant::now()),
            Duration::from_millis(self.settings.graph.load_wait_ms),
        );
        self.registry.serve(tenant, wait).await
    }
}

/// Time kept after a load for the walk and the answer's way back, so a
/// load finishing at the deadline still leaves an answer in time.
const LOAD_MARGIN: Duration = Duration::from_millis(50);

/// How long a query may wait for its tenant's first load.
fn load_wait(left: Duration, setting: Duration) -> Duration {
    left.saturating_sub(LOAD_MARGIN).min(setting)
}

fn parse_id(field: &str, s: &str) -> Result<Uuid, Error> {
    Uuid::parse_str(s).map_err(|_| Error::invalid(field, format!("{s:?} is not a UUID")))
}

fn bounded(field: &str, v: u32, default: u32, max: u32) -> Result<u32, Error> {
    match v {
        0 => Ok(default.min(max)),
        v if v <= max => Ok(v),
        v => Err(Error::invalid(
            field,
            format!("{v} exceeds the maximum {max}"),
        )),
    }
}

/// A validated `PprRequest`.
pub struct PprQuery {
    pub query_text: String,
    pub seeds: Vec<(Uuid, f32)>,
    pub damping: f32,
    pub max_iter: u32,
    pub tolerance: f32,
    pub max_nodes: u32,
    pub max_hops: u32,
    pub k: u32,
    pub entity_seed_weight: f32,
    pub namespace_opt: Option<String>,
    pub include_historical: bool,
    /// Sentences the query resembles, with their similarity.
    pub facts: Vec<(String, f32)>,
    /// graph.fact_entities and graph.fact_seed_share.
    pub fact_entities: usize,
    pub fact_seed_share: f64,
    /// The write the answer must reflect to be fresh ("" = none).
    pub after_write: String,
}

impl PprQuery {
    pub fn from_proto(
        r: PprRequest,
        g: &engram_common::settings::GraphSettings,
    ) -> Result<Self, Error> {
        let PprRequest {
            query_text,
            seeds,
            damping,
            max_iter,
            tolerance,
            max_nodes,
            max_hops,
            k,
            entity_seed_weight,
            namespace,
            include_historical,
            facts,
            after_write,
        } = r;
        if after_write.chars().count() > MAX_WRITE_ID_CHARS {
            return Err(Error::invalid(
                "after_write",
                format!("at most {MAX_WRITE_ID_CHARS} characters"),
            ));
        }
        if query_text.chars().count() > MAX_QUERY_CHARS {
            return Err(Error::invalid(
                "query_text",
                format!("at most {MAX_QUERY_CHARS} characters"),
            ));
        }
        if seeds.len() > MAX_SEEDS {
            return Err(Error::invalid(
                "seeds",
                format!("at most {MAX_SEEDS} seeds"),
            ));
        }
        let seeds = seeds
            .into_iter()
            .map(|s| {
                if !s.weight.is_finite() || s.weight < 0.0 {
                    return Err(Error::invalid("seeds.weight", "must be finite and >= 0"));
                }
                Ok((parse_id("seeds.memory_id", &s.memory_id)?, s.weight))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let facts = fact_seeds(facts)?;
        let damping = if damping == 0.0 { g.damping } else { damping };
        if !(damping > 0.0 && damping < 1.0) {
            return Err(Error::invalid("damping", "must be in (0, 1)"));
        }
        let tolerance = if tolerance == 0.0 {
            g.tolerance
        } else {
            tolerance
        };
        if !(tolerance > 0.0 && tolerance < 1.0) {
            return Err(Error::invalid("tolerance", "must be in (0, 1)"));
        }
        let entity_seed_weight = if entity_seed_weight == 0.0 {
            g.entity_seed_weight
        } else {
            entity_seed_weight
        };
        if !entity_seed_weight.is_finite() || entity_seed_weight < 0.0 {
            return Err(Error::invalid(
                "entity_seed_weight",
                "must be finite and >= 0",
            ));
        }
        Ok(Self {
            query_text,
            seeds,
            damping,
            max_iter: bounded("max_iter", max_iter, g.max_iter, 1000)?,
            tolerance,
            max_nodes: bounded("max_nodes", max_nodes, g.max_nodes, MAX_NODES)?,
            max_hops: bounded("max_hops", max_hops, g.max_hops, MAX_HOPS)?,
            k: bounded("k", k, g.top_k, MAX_K)?,
            entity_seed_weight,
            namespace_opt: Some(namespace).filter(|n| !n.is_empty()),
            include_historical,
            facts,
            fact_entities: g.fact_entities as usize,
            fact_seed_share: f64::from(g.fact_seed_share),
            after_write,
        })
    }
}

fn fact_seeds(facts: Vec<engram_proto::FactSeed>) -> Result<Vec<(String, f32)>, Error> {
    if facts.len() > MAX_FACTS {
        return Err(Error::invalid(
            "facts",
            format!("at most {MAX_FACTS} facts"),
        ));
    }
    facts
        .into_iter()
        .map(|f| {
            if !f.weight.is_finite() || f.weight < 0.0 {
                return Err(Error::invalid("facts.weight", "must be finite and >= 0"));
            }
            if f.text.chars().count() > MAX_QUERY_CHARS {
                return Err(Error::invalid(
                    "facts.text",
                    format!("at most {MAX_QUERY_CHARS} characters"),
                ));
            }
            Ok((f.text, f.weight))
        })
        .collect()
}

/// Runs a validated query against one graph (also used by the evaluation).
pub fn run_ppr(
    graph: &Graph,
    q: &PprQuery,
    view: &View,
    memory_seed_weight: f32,
    deadline_opt: Option<Instant>,
) -> PprResponse {
    run_ppr_with(
        graph,
        q,
        view,
        memory_seed_weight,
        deadline_opt,
        NODE_BUDGET,
    )
}

/// What `max_nodes` bounds in the service; see the crate docs for why.
pub const NODE_BUDGET: NodeBudget = NodeBudget::AllNodes;

/// [`run_ppr`] with an explicit budget semantics (for measurements).
pub fn run_ppr_with(
    graph: &Graph,
    q: &PprQuery,
    view: &View,
    memory_seed_weight: f32,
    deadline_opt: Option<Instant>,
    budget: NodeBudget,
) -> PprResponse {
    let linked = graph.link(&q.query_text, view);
    let mut seeds = entity_seeds(graph, q, view, &linked);
    // Dense seeds ride along at a small weight: they must not drown entities.
    let rel = if seeds.is_empty() {
        1.0
    } else {
        f64::from(memory_seed_weight)
    };
    // Hidden memories among them seed nothing (the walk drops seeds its
    // view hides, mass and all).
    for (id, w) in &q.seeds {
        if let Some(m) = graph.memory(id) {
            seeds.push((m, f64::from(*w) * rel));
        }
    }
    let params = PprParams {
        damping: f64::from(q.damping),
        max_iter: q.max_iter,
        tol: f64::from(q.tolerance),
        max_nodes: q.max_nodes as usize,
        max_hops: q.max_hops as u8,
        k: q.k as usize,
        budget,
        deadline_opt,
    };
    let out = graph.ppr(&seeds, view, &params);
    PprResponse {
        hits: out
            .hits
            .iter()
            .enumerate()
            .map(|(rank, h)| GraphHit {
                memory_id: graph.memory_id(h.memory).to_string(),
                score: h.score as f32,
                rank: rank as u32 + 1,
                via_entities: h
                    .via_entities
                    .iter()
                    .map(|&e| graph.entity_name(e).to_string())
                    .collect(),
            })
            .collect(),
        linked_entities: linked
            .into_iter()
            .map(|l| LinkedEntity {
                name: l.name,
                df: l.df,
                has_home: l.has_home,
            })
            .collect(),
        nodes_touched: out.nodes_touched as u32,
        deadline_exceeded: out.deadline_hit,
        memory_count: graph.visible_memory_count(view) as u32,
        stale: false,
        no_contradicts_edges: !graph.has_edge_type("contradicts"),
    }
}

/// The walk's entity seeds, summing to `entity_seed_weight`: the query's
/// own names by inverse document frequency and, when the caller sent facts,
/// the entities those sentences name (each scored by its best fact's weight
/// over its document frequency, the best `fact_entities` kept), mixed by
/// `fact_seed_share`. Facts find the bridge entity a question never names
/// ("the director of <film>": the director is in the film's sentence).
fn entity_seeds(
    graph: &Graph,
    q: &PprQuery,
    view: &View,
    linked: &[crate::graph::LinkedEntity],
) -> Vec<(u32, f64)> {
    let own: Vec<(u32, f64)> = linked
        .iter()
        .map(|l| (l.entity, 1.0 / f64::from(l.df)))
        .collect();
    let mut by_entity: HashMap<u32, f64> = HashMap::new();
    for (text, w) in &q.facts {
        for l in graph.link(text, view) {
            let score = f64::from(*w) / f64::from(l.df);
            let best = by_entity.entry(l.entity).or_default();
            *best = best.max(score);
        }
    }
    let mut from_facts: Vec<(u32, f64)> = by_entity.into_iter().collect();
    from_facts.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    from_facts.truncate(q.fact_entities);
    let share = match (own.is_empty(), from_facts.is_empty()) {
        (_, true) => 0.0,
        (true, false) => 1.0,
        (false, false) => q.fact_seed_share,
    };
    let total = f64::from(q.entity_seed_weight);
    let mut seeds = normalized(&own, total * (1.0 - share));
    seeds.extend(normalized(&from_facts, total * share));
    seeds
        .into_iter()
        .filter(|(_, w)| *w > 0.0)
        .map(|(e, w)| (graph.entity_node(e), w))
        .collect()
}

/// `scores` rescaled to sum to `total` (empty when they sum to nothing).
fn normalized(scores: &[(u32, f64)], total: f64) -> Vec<(u32, f64)> {
    let sum: f64 = scores.iter().map(|(_, s)| s).sum();
    if sum <= 0.0 || total <= 0.0 {
        return Vec::new();
    }
    scores.iter().map(|&(e, s)| (e, s * total / sum)).collect()
}

fn parse_ids(field: &str, ids: Vec<String>) -> Result<Vec<Uuid>, Error> {
    if ids.len() > MAX_IDS {
        return Err(Error::invalid(field, format!("at most {MAX_IDS} ids")));
    }
    ids.iter().map(|s| parse_id(field, s)).collect()
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Internal(e.to_string()))
}

#[tonic::async_trait]
impl GraphService for GraphSvc {
    async fn personalized_page_rank(
        &self,
        request: Request<PprRequest>,
    ) -> Result<Response<PprResponse>, Status> {
        let id = self.identity(&request)?;
        let deadline = self.deadline(&request);
        let q = PprQuery::from_proto(request.into_inner(), &self.settings.graph)?;
        let served = self.serve(&id.tenant, deadline).await?;
        let graph = served.graph().clone();
        let msw = self.settings.graph.memory_seed_weight;
        let started = Instant::now();
        let after_write = q.after_write.clone();
        let trust = id.trust.as_i16();
        let mut resp = blocking(move || {
            let view = graph.view(trust, q.namespace_opt.as_deref(), q.include_historical);
            run_ppr(&graph, &q, &view, msw, Some(deadline))
        })
        .await?;
        // Read after the walk: a change noted during it makes it stale too.
        // The write first: once heard, its change is counted (store.rs).
        let heard = self.registry.has_heard(&id.tenant, &after_write);
        resp.stale = !heard || served.stale();
        tracing::debug!(
            hits = resp.hits.len(),
            stale = resp.stale,
            linked = resp.linked_entities.len(),
            nodes_touched = resp.nodes_touched,
            us = started.elapsed().as_micros() as u64,
            "ppr"
        );
        Ok(Response::new(resp))
    }

    async fn neighbors(
        &self,
        request: Request<NeighborsRequest>,
    ) -> Result<Response<NeighborsResponse>, Status> {
        let id = self.identity(&request)?;
        let deadline = self.deadline(&request);
        let NeighborsRequest {
            memory_ids,
            depth,
            max_nodes,
            edge_types,
        } = request.into_inner();
        let ids = parse_ids("memory_ids", memory_ids)?;
        if !(1..=MAX_HOPS).contains(&depth) {
            return Err(Error::invalid("depth", format!("must be in 1..={MAX_HOPS}")).into());
        }
        let max_nodes = bounded(
            "max_nodes",
            max_nodes,
            self.settings.graph.max_nodes,
            MAX_NODES,
        )?;
        let types_opt: Option<HashSet<String>> =
            (!edge_types.is_empty()).then(|| edge_types.into_iter().collect());
        let graph = self.serve(&id.tenant, deadline).await?.graph().clone();
        let out = blocking(move || {
            let view = graph.view(id.trust.as_i16(), None, false);
            let starts: Vec<u32> = ids.iter().filter_map(|i| graph.memory(i)).collect();
            graph
                .neighbors(
                    &starts,
                    depth,
                    max_nodes as usize,
                    types_opt.as_ref(),
                    &view,
                )
                .into_iter()
                .map(|n| Neighbor {
                    memory_id: graph.memory_id(n.memory).to_string(),
                    depth: n.depth,
                    via_edge_type: n.via,
                })
                .collect()
        })
        .await?;
        Ok(Response::new(NeighborsResponse { neighbors: out }))
    }

    async fn contradictions(
        &self,
        request: Request<ContradictionsRequest>,
    ) -> Result<Response<ContradictionsResponse>, Status> {
        let id = self.identity(&request)?;
        let deadline = self.deadline(&request);
        let ContradictionsRequest { memory_ids } = request.into_inner();
        let ids = parse_ids("memory_ids", memory_ids)?;
        let graph = self.serve(&id.tenant, deadline).await?.graph().clone();
        let view = graph.view(id.trust.as_i16(), None, true);
        let nodes: Vec<u32> = ids.iter().filter_map(|i| graph.memory(i)).collect();
        let pairs = graph
            .contradictions(&nodes, &view)
            .into_iter()
            .map(|(a, b, w)| Contradiction {
                memory_a: graph.memory_id(a).to_string(),
                memory_b: graph.memory_id(b).to_string(),
                weight: w,
            })
            .collect();
        Ok(Response::new(ContradictionsResponse { pairs }))
    }

    async fn link_query(
        &self,
        request: Request<LinkQueryRequest>,
    ) -> Result<Response<LinkQueryResponse>, Status> {
        let id = self.identity(&request)?;
        let deadline = self.deadline(&request);
        let LinkQueryRequest { text } = request.into_inner();
        if text.chars().count() > MAX_QUERY_CHARS {
            return Err(
                Error::invalid("text", format!("at most {MAX_QUERY_CHARS} characters")).into(),
            );
        }
        let graph = self.serve(&id.tenant, deadline).await?.graph().clone();
        let resp = blocking(move || {
            let view = graph.view(id.trust.as_i16(), None, false);
            LinkQueryResponse {
                entities: graph
                    .link(&text, &view)
                    .into_iter()
                    .map(|l| LinkedEntity {
                        name: l.name,
                        df: l.df,
                        has_home: l.has_home,
                    })
                    .collect(),
                memory_count: graph.visible_memory_count(&view) as u32,
            }
        })
        .await?;
        Ok(Response::new(resp))
    }

    async fn stats(
        &self,
        request: Request<StatsRequest>,
    ) -> Result<Response<StatsResponse>, Status> {
        let id = self.identity(&request)?;
        let StatsRequest {} = request.into_inner();
        let totals = self.registry.totals();
        let mut resp = StatsResponse {
            loaded: false,
            memories: 0,
            entities: 0,
            edges: 0,
            loaded_tenants: totals.tenants as u32,
            total_nodes: totals.nodes,
            total_edges: totals.edges,
            total_bytes: totals.bytes,
            memory_budget_bytes: self.settings.graph.memory_budget_bytes,
        };
        if let Some(g) = self.registry.loaded(&id.tenant) {
            resp.loaded = true;
            resp.memories = g.memory_count() as u64;
            resp.entities = g.entity_count() as u64;
            resp.edges = g.edge_count() as u64;
        }
        Ok(Response::new(resp))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engram_common::server::parse_grpc_timeout;

    #[test]
    fn a_query_waits_for_a_load_within_its_deadline_and_the_setting() {
        let ms = Duration::from_millis;
        assert_eq!(load_wait(ms(500), ms(300)), ms(300));
        assert_eq!(load_wait(ms(200), ms(300)), ms(150));
        assert_eq!(load_wait(ms(30), ms(300)), Duration::ZERO);
        assert_eq!(load_wait(ms(500), Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn grpc_timeouts_parse() {
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("x"), None);
        assert_eq!(parse_grpc_timeout(""), None);
    }

    #[test]
    fn bad_requests_name_the_field() {
        let g = engram_common::settings::GraphSettings::default();
        let bad = |r: PprRequest| match PprQuery::from_proto(r, &g) {
            Err(Error::InvalidArgument(m)) => m,
            _ => String::new(),
        };
        assert!(
            bad(PprRequest {
                max_nodes: 5000,
                ..Default::default()
            })
            .starts_with("max_nodes")
        );
        assert!(
            bad(PprRequest {
                damping: 1.5,
                ..Default::default()
            })
            .starts_with("damping")
        );
        assert!(
            bad(PprRequest {
                k: 51,
                ..Default::default()
            })
            .starts_with("k")
        );
        assert!(
            bad(PprRequest {
                max_hops: 5,
                ..Default::default()
            })
            .starts_with("max_hops")
        );
        let seeds = vec![engram_proto::Seed {
            memory_id: "nope".into(),
            weight: 1.0,
        }];
        assert!(
            bad(PprRequest {
                seeds,
                ..Default::default()
            })
            .starts_with("seeds.memory_id")
        );
        let q = PprQuery::from_proto(PprRequest::default(), &g).ok();
        assert!(q.is_some_and(|q| q.max_nodes == 1000 && q.k == 50 && q.damping == 0.5));
        let fact = |text: &str, weight: f32| engram_proto::FactSeed {
            text: text.into(),
            weight,
        };
        assert!(
            bad(PprRequest {
                facts: vec![fact("x", f32::NAN)],
                ..Default::default()
            })
            .starts_with("facts.weight")
        );
        assert!(
            bad(PprRequest {
                facts: vec![fact("x", 1.0); MAX_FACTS + 1],
                ..Default::default()
            })
            .starts_with("facts")
        );
        assert!(
            bad(PprRequest {
                facts: vec![fact(&"x".repeat(MAX_QUERY_CHARS + 1), 1.0)],
                ..Default::default()
            })
            .starts_with("facts.text")
        );
    }

    /// A film, its director and its lead actor: the question names only
    /// the film, so the director and the actor are equally far from it.
    fn film_graph() -> Graph {
        use crate::graph::{Dictionary, GraphBuilder};
        let mut dict = Dictionary::default();
        for name in ["Inception", "Christopher Nolan", "Leonardo DiCaprio"] {
            dict.add(name);
        }
        let mut b = GraphBuilder::new(Arc::new(dict), 5.0);
        let film = b.add_memory(Uuid::from_u128(1), "default", 1, None, false);
        let director = b.add_memory(Uuid::from_u128(2), "default", 1, None, false);
        let actor = b.add_memory(Uuid::from_u128(3), "default", 1, None, false);
        b.add_mention(film, 0, true);
        b.add_mention(film, 1, false);
        b.add_mention(film, 2, false);
        b.add_mention(director, 1, true);
        b.add_mention(actor, 2, true);
        b.build()
    }

    fn ranked(g: &Graph, facts: Vec<engram_proto::FactSeed>) -> Vec<(u128, f32)> {
        let settings = engram_common::settings::GraphSettings::default();
        let req = PprRequest {
            query_text: "Who is the spouse of the director of Inception?".into(),
            facts,
            ..Default::default()
        };
        let q = PprQuery::from_proto(req, &settings).expect("valid");
        let view = g.view(1, None, false);
        let out = run_ppr(g, &q, &view, settings.memory_seed_weight, None);
        assert_eq!(out.linked_entities.len(), 1, "only the query's own names");
        out.hits
            .iter()
            .filter_map(|h| Some((Uuid::parse_str(&h.memory_id).ok()?.as_u128(), h.score)))
            .collect()
    }

    #[test]
    fn a_fact_seeds_the_bridge_entity_the_question_never_names() {
        let g = film_graph();
        let score = |r: &[(u128, f32)], id: u128| r.iter().find(|h| h.0 == id).map(|h| h.1);
        let before = ranked(&g, Vec::new());
        assert!(score(&before, 2).is_some());
        assert_eq!(score(&before, 2), score(&before, 3), "a tie without facts");
        let fact = engram_proto::FactSeed {
            text: "Inception\nIt was directed by Christopher Nolan.".into(),
            weight: 0.8,
        };
        let after = ranked(&g, vec![fact]);
        assert!(
            score(&after, 2) > score(&after, 3),
            "the director's memory leads the actor's: {after:?}"
        );
        // Facts that name nothing in the graph leave the walk as it was.
        let nothing = engram_proto::FactSeed {
            text: "an unrelated sentence".into(),
            weight: 0.9,
        };
        assert_eq!(ranked(&g, vec![nothing]), before);
    }
}
