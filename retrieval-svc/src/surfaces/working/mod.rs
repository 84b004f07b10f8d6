//! Layer 6: session working memory first, the memory graph as fallback.
//!
//! Working memory is what an agent noted during the current session: it is
//! short-lived, per session, and read far more often than it is worth
//! searching in Postgres, so it is ranked in the gateway's process
//! (store.rs: bounded per session and in sessions, expired by TTL, least
//! recently used evicted first); every gateway replica sees the same notes
//! through a shared copy in Postgres (shared.rs), which the graph and the
//! search indexes never see. `GetMemory` answers from it when
//! something matches; otherwise it asks the pipeline for claims and expands
//! them along `causes` / `supports` edges, with the contradictions the
//! pipeline left open, so an agent gets "what do I know and why" in one call.

pub mod shared;
pub mod store;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use engram_common::Identity;
use engram_proto::{
    CausalLink, ConflictPair, ConflictResolution, ContradictionsRequest, EmbedRequest,
    GetMemoryResponse, GetRequest, Memory, MemoryItem, MemoryOrigin, NeighborsRequest,
    RetrievalMode, RetrieveRequest, ScoredMemory, SourceRef, UpsertResult,
};
use tokio::time::Instant;

pub use self::store::*;
use crate::downstream::{call, call_until};
use crate::error::Error;
use crate::gateway::Gateway;
use crate::pipeline::assemble::{CONTRADICTS, citation};
use crate::query::Query;
use crate::surfaces::demand::{Shape, Surface};

fn ts(dt: DateTime<Utc>) -> prost_types::Timestamp {
    engram_common::convert::chrono_to_ts(dt)
}

/// Embeds the fragments that came without a vector, in one call (a
/// failure leaves them text-matchable only rather than failing the write),
/// then stores them all or none: `Err(i)` when write `i` would replace a
/// fragment above the caller's trust.
pub(crate) async fn write_working(
    gw: &Gateway,
    identity: &Arc<Identity>,
    mut writes: Vec<WorkingWrite>,
) -> Result<Vec<UpsertResult>, usize> {
    let need: Vec<usize> = (0..writes.len())
        .filter(|&i| writes[i].embedding_opt.is_none())
        .collect();
    if !need.is_empty() {
        let req = EmbedRequest {
            texts: need.iter().map(|&i| writes[i].text()).collect(),
        };
        match call(&gw.downstreams().embed, identity, req).await {
            Ok(r) if r.embeddings.len() == need.len() => {
                for (&i, e) in need.iter().zip(r.embeddings) {
                    writes[i].embedding_opt = Some(e.values);
                }
            }
            Ok(_) => tracing::warn!("embed returned a short batch, fragments text-only"),
            Err(e) => {
                tracing::warn!(error = %e, "working memory embedding failed, fragments text-only");
            }
        }
    }
    let now = Utc::now();
    let r = match shared::put(gw, identity, &writes, now).await {
        shared::Shared::Refused(i) => return Err(i),
        shared::Shared::Stored(v) => gw.working().put_versions(identity, writes, Some(&v), now)?,
        shared::Shared::Unreachable => gw.working().put(identity, writes, now)?,
    };
    tracing::info!(
        tenant = %identity.tenant,
        agent = %identity.agent_id,
        count = r.len(),
        "wrote working memory"
    );
    Ok(r)
}

/// Working memory first; the graph when nothing in the session matches.
pub async fn get_memory(
    gw: &Gateway,
    identity: Identity,
    mq: MemoryQuery,
    start: Instant,
    deadline: Instant,
) -> Result<GetMemoryResponse, Error> {
    let identity = Arc::new(identity);
    let requested = mq.demand_requested();
    let mut resp = match working_first(gw, &identity, &mq, deadline).await {
        Ok(r) => r,
        Err(working_candidates) => {
            let mut r = graph_fallback(gw, &identity, &mq, start, deadline).await?;
            r.working_candidates = working_candidates;
            r
        }
    };
    resp.latency_ms = start.elapsed().as_secs_f64() * 1000.0;
    let observed = resp.items.iter().map(|i| i.memory_type.clone()).collect();
    gw.demand().observe(
        &identity.tenant,
        identity.trust,
        Surface::GetMemory,
        Shape {
            requested,
            observed,
        },
    );
    Ok(resp)
}

/// The session's matches, or how many fragments it held when none matched.
async fn working_first(
    gw: &Gateway,
    identity: &Arc<Identity>,
    mq: &MemoryQuery,
    deadline: Instant,
) -> Result<GetMemoryResponse, u32> {
    let Some(session) = mq.session_id_opt.as_deref() else {
        return Err(0);
    };
    let key = SessionKey::new(identity, session);
    let now = Utc::now();
    shared::refresh(gw, identity, &key, now).await;
    let (frags, total) = gw
        .working()
        .visible(&key, identity.trust, mq.min_confidence, now);
    let total = u32::try_from(total).unwrap_or(u32::MAX);
    if frags.is_empty() {
        return Err(total);
    }
    let mut degraded = Vec::new();
    let mut q_emb_opt = None;
    if frags.iter().any(|f| f.embedding_opt.is_some()) {
        let req = EmbedRequest {
            texts: vec![mq.query.clone()],
        };
        match call_until(&gw.downstreams().embed, identity, deadline, req).await {
            Ok(r) => q_emb_opt = r.embeddings.into_iter().next().map(|e| e.values),
            Err(e) => {
                tracing::warn!(error = %e, "working memory query embedding degraded");
                degraded.push("embed".to_string());
            }
        }
    }
    let sim = gw.settings().working.match_similarity;
    let query = mq.query.clone();
    let limit = mq.limit as usize;
    let hits =
        tokio::task::spawn_blocking(move || rank(frags, &query, q_emb_opt.as_deref(), sim, limit))
            .await
            .map_err(|_| total)?;
    if hits.is_empty() {
        return Err(total);
    }
    let ids: Vec<&str> = hits.iter().map(|h| h.fragment.id.as_str()).collect();
    gw.working().touch(&key, &ids);
    let sources = if mq.include_sources && !mq.compact {
        hits.iter()
            .map(|h| SourceRef {
                memory_id: h.fragment.id.clone(),
                citation: if h.fragment.source.is_empty() {
                    format!("[working:{} v{}]", h.fragment.id, h.fragment.version)
                } else {
                    h.fragment.source.clone()
                },
                found_by: vec![WORKING_TYPE.into()],
                namespace: h.fragment.namespace.clone(),
                session_id: session.to_string(),
            })
            .collect()
    } else {
        Vec::new()
    };
    let items = hits
        .into_iter()
        .map(|h| MemoryItem {
            id: h.fragment.id,
            content: h.fragment.content,
            memory_type: WORKING_TYPE.into(),
            confidence: h.fragment.confidence,
            score: h.score,
            session_id: session.to_string(),
            written_at: Some(ts(h.fragment.written_at)),
            expires_at: Some(ts(h.fragment.expires_at)),
            text_match: h.text_match,
            similarity: h.similarity_opt,
        })
        .collect();
    Ok(GetMemoryResponse {
        origin: MemoryOrigin::Working as i32,
        items,
        sources,
        working_candidates: total,
        degraded_stages: degraded,
        query_id: uuid::Uuid::new_v4().to_string(),
        ..Default::default()
    })
}

/// Claims from the pipeline (multi-hop route: vector + graph), then the
/// causal neighbourhood and the contradictions nobody settled.
async fn graph_fallback(
    gw: &Gateway,
    identity: &Arc<Identity>,
    mq: &MemoryQuery,
    start: Instant,
    deadline: Instant,
) -> Result<GetMemoryResponse, Error> {
    let q = Query::try_from(RetrieveRequest {
        text: mq.query.clone(),
        limit: Some(mq.limit),
        min_confidence: Some(mq.min_confidence),
        mode: RetrievalMode::MultiHop as i32,
        ..Default::default()
    })?;
    let r = gw
        .pipeline()
        .retrieve((**identity).clone(), q, start, deadline)
        .await?;
    let items: Vec<MemoryItem> = r.records.iter().filter_map(claim).collect();
    let mut resp = GetMemoryResponse {
        origin: if items.is_empty() {
            MemoryOrigin::None
        } else {
            MemoryOrigin::Graph
        } as i32,
        query_id: r.query_id.clone(),
        degraded_stages: r.degraded_stages.clone(),
        ..Default::default()
    };
    if mq.compact || items.is_empty() {
        resp.items = items;
        return Ok(resp);
    }
    let mut x = Expansion {
        gw,
        identity,
        mq,
        deadline,
        degraded: std::mem::take(&mut resp.degraded_stages),
    };
    let item_ids: Vec<String> = items.iter().map(|i| i.id.clone()).collect();
    let (chain, chain_mems) = x.causal_chain(&item_ids).await;
    let mut all_ids = item_ids;
    all_ids.extend(chain.iter().map(|c| c.memory_id.clone()));
    resp.contradictions = x.open_contradictions(all_ids, &r.conflicts).await;
    if mq.include_sources {
        resp.sources = sources(&r.records, &chain, &chain_mems);
    }
    x.degraded.sort();
    x.degraded.dedup();
    resp.items = items;
    resp.causal_chain = chain;
    resp.degraded_stages = x.degraded;
    Ok(resp)
}

/// A pipeline record as a `GetMemory` item.
fn claim(s: &ScoredMemory) -> Option<MemoryItem> {
    let m = s.memory.as_ref()?;
    Some(MemoryItem {
        id: m.id.clone(),
        content: m.content.clone(),
        memory_type: m.memory_type.clone(),
        confidence: m.source_confidence.unwrap_or(1.0),
        score: s.score,
        written_at: m.event_time,
        ..Default::default()
    })
}

/// The graph fallback's expansion of the claims; a failed step degrades
/// the answer and leaves its part empty.
struct Expansion<'a> {
    gw: &'a Gateway,
    identity: &'a Arc<Identity>,
    mq: &'a MemoryQuery,
    deadline: Instant,
    degraded: Vec<String>,
}

impl Expansion<'_> {
    /// The `causes` / `supports` neighbourhood of the claims (the claims
    /// themselves left out), with the contents the caller may read.
    async fn causal_chain(
        &mut self,
        item_ids: &[String],
    ) -> (Vec<CausalLink>, HashMap<String, Memory>) {
        let ds = self.gw.downstreams();
        let req = NeighborsRequest {
            memory_ids: item_ids.to_vec(),
            depth: self.mq.max_depth,
            max_nodes: MAX_CHAIN,
            edge_types: vec!["causes".into(), "supports".into()],
        };
        let neighbors = match call_until(&ds.neighbors, self.identity, self.deadline, req).await {
            Ok(n) => n.neighbors,
            Err(e) => {
                tracing::warn!(error = %e, "causal expansion degraded");
                self.degraded.push("causal_chain".into());
                Vec::new()
            }
        };
        let item_set: HashSet<&str> = item_ids.iter().map(String::as_str).collect();
        let neighbors: Vec<_> = neighbors
            .into_iter()
            .filter(|n| !item_set.contains(n.memory_id.as_str()))
            .collect();
        let ids: Vec<String> = neighbors.iter().map(|n| n.memory_id.clone()).collect();
        let chain_mems = self.readable(ids).await;
        let chain = neighbors
            .iter()
            .filter_map(|n| {
                let m = chain_mems.get(&n.memory_id)?;
                Some(CausalLink {
                    memory_id: n.memory_id.clone(),
                    edge_type: n.via_edge_type.clone(),
                    depth: n.depth,
                    content: m.content.clone(),
                    confidence: m.source_confidence.unwrap_or(1.0),
                })
            })
            .collect();
        (chain, chain_mems)
    }

    /// The memories of `ids` within the caller's tenant, trust and
    /// confidence floor.
    async fn readable(&mut self, ids: Vec<String>) -> HashMap<String, Memory> {
        if ids.is_empty() {
            return HashMap::new();
        }
        let (identity, min_confidence) = (self.identity, self.mq.min_confidence);
        let req = GetRequest {
            ids,
            include_embedding: false,
            omit_entities: false,
            vectors_only: false,
            ..Default::default()
        };
        match call_until(&self.gw.downstreams().get, identity, self.deadline, req).await {
            Ok(g) => g
                .memories
                .into_iter()
                .filter(|m| {
                    m.tenant_id == identity.tenant
                        && m.access_level <= identity.trust.to_proto()
                        && m.source_confidence.unwrap_or(1.0) >= min_confidence
                })
                .map(|m| (m.id.clone(), m))
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "causal chain contents degraded");
                self.degraded.push("causal_chain".into());
                HashMap::new()
            }
        }
    }

    /// Contradictions among claims and chain that the pipeline did not
    /// settle (a pair with a winner is not reported again).
    async fn open_contradictions(
        &mut self,
        ids: Vec<String>,
        settled_by_pipeline: &[ConflictPair],
    ) -> Vec<ConflictPair> {
        if ids.len() < 2 {
            return Vec::new();
        }
        let settled: HashSet<(String, String)> = settled_by_pipeline
            .iter()
            .filter(|c| c.resolution != ConflictResolution::Unresolved as i32)
            .flat_map(|c| {
                [
                    (c.memory_a.clone(), c.memory_b.clone()),
                    (c.memory_b.clone(), c.memory_a.clone()),
                ]
            })
            .collect();
        let req = ContradictionsRequest { memory_ids: ids };
        let ds = self.gw.downstreams();
        match call_until(&ds.contradictions, self.identity, self.deadline, req).await {
            Ok(c) => c
                .pairs
                .into_iter()
                .filter(|p| !settled.contains(&(p.memory_a.clone(), p.memory_b.clone())))
                .map(|p| ConflictPair {
                    memory_a: p.memory_a,
                    memory_b: p.memory_b,
                    resolution: ConflictResolution::Unresolved as i32,
                    winner_id: String::new(),
                    edge_type: CONTRADICTS.into(),
                    reason: "a contradicts edge in the graph".into(),
                    score: 0.0,
                })
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "contradiction lookup degraded");
                self.degraded.push("contradictions".into());
                Vec::new()
            }
        }
    }
}

/// Where each claim and chain link came from.
fn sources(
    records: &[ScoredMemory],
    chain: &[CausalLink],
    chain_mems: &HashMap<String, Memory>,
) -> Vec<SourceRef> {
    let claims = records.iter().filter_map(|s| {
        let m = s.memory.as_ref()?;
        let prov = s.provenance.as_ref();
        Some(SourceRef {
            memory_id: m.id.clone(),
            citation: prov
                .map(|p| p.citation.clone())
                .filter(|c| !c.is_empty())
                .unwrap_or_else(|| citation(m)),
            found_by: prov
                .map(|p| p.strategies.iter().map(|h| h.strategy.clone()).collect())
                .unwrap_or_default(),
            namespace: m.namespace.clone(),
            session_id: String::new(),
        })
    });
    let links = chain.iter().filter_map(|c| {
        let m = chain_mems.get(&c.memory_id)?;
        Some(SourceRef {
            memory_id: m.id.clone(),
            citation: citation(m),
            found_by: vec![c.edge_type.clone()],
            namespace: m.namespace.clone(),
            session_id: String::new(),
        })
    });
    claims.chain(links).collect()
}
