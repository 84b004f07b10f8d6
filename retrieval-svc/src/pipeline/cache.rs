//! In-memory caches, all keyed by the full caller identity so one agent's
//! results (filtered by its trust level) can never be served to another.
//! Writes through the gateway bump a per-tenant generation, which makes every
//! older entry of that tenant a miss without scanning the maps.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use engram_common::Identity;
use engram_proto::{QueryRoute, RetrieveResponse, SkipReason, StageLatency};
use parking_lot::Mutex;
use prost::Message;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use super::ctx::ms_since;
use crate::query::Query;

const MAX_ENTRIES: usize = 10_000;
const MAX_SEMANTIC_PER_SCOPE: usize = 16;
const TURN_TTL: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheKey {
    /// Identity + everything in the request that changes the answer.
    pub exact: [u8; 32],
    /// Same without the query text: the neighbourhood for cosine hits.
    pub scope: [u8; 32],
}

impl CacheKey {
    pub fn new(identity: &Identity, q: &Query) -> Self {
        let mut scope = Sha256::new();
        for part in [
            identity.tenant.as_bytes(),
            identity.agent_id.as_bytes(),
            identity.trust.name().as_bytes(),
            format!("{:?}", q.mode).as_bytes(),
            &q.limit.to_le_bytes(),
            &q.token_budget.to_le_bytes(),
            &[u8::from(q.explain), u8::from(q.skip_rerank)],
            &q.filters.encode_to_vec(),
        ] {
            scope.update((part.len() as u64).to_le_bytes());
            scope.update(part);
        }
        for h in &q.hypotheses {
            scope.update((h.len() as u64).to_le_bytes());
            scope.update(h.as_bytes());
        }
        let scope: [u8; 32] = scope.finalize().into();
        let norm = q
            .text
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .to_lowercase();
        let exact: [u8; 32] = Sha256::new()
            .chain_update(scope)
            .chain_update(norm.as_bytes())
            .finalize()
            .into();
        Self { exact, scope }
    }
}

struct Entry {
    at: Instant,
    generation: u64,
    response: RetrieveResponse,
}

/// A turn's first answer: when, and the tenant's generation it was computed at.
type TurnEntry = (Instant, u64, RetrieveResponse);

struct SemEntry {
    at: Instant,
    generation: u64,
    embedding: Vec<f32>,
    response: RetrieveResponse,
}

pub struct Caches {
    ttl: Duration,
    similarity: f32,
    results: Mutex<HashMap<[u8; 32], Entry>>,
    semantic: Mutex<HashMap<[u8; 32], VecDeque<SemEntry>>>,
    turns: Mutex<HashMap<(Identity, String), TurnEntry>>,
    generations: Mutex<HashMap<String, u64>>,
}

impl Caches {
    pub fn new(ttl: Duration, similarity: f32) -> Self {
        Self {
            ttl,
            similarity,
            results: Mutex::default(),
            semantic: Mutex::default(),
            turns: Mutex::default(),
            generations: Mutex::default(),
        }
    }

    /// The tenant's write generation. A request reads it when it starts and
    /// stores its answer under it, so a write that lands while the request
    /// runs leaves that answer stale instead of cached as fresh.
    pub fn generation(&self, tenant: &str) -> u64 {
        self.generations.lock().get(tenant).copied().unwrap_or(0)
    }

    /// A write for `tenant` went through: every cached result of it is stale.
    pub fn invalidate_tenant(&self, tenant: &str) {
        *self
            .generations
            .lock()
            .entry(tenant.to_string())
            .or_insert(0) += 1;
    }

    pub fn get_exact(&self, key: &CacheKey, tenant: &str) -> Option<RetrieveResponse> {
        let generation = self.generation(tenant);
        let map = self.results.lock();
        let e = map.get(&key.exact)?;
        (e.generation == generation && e.at.elapsed() < self.ttl).then(|| e.response.clone())
    }

    /// Whether a cosine lookup could hit; the caller embeds the query only then.
    pub fn has_semantic(&self, key: &CacheKey, tenant: &str) -> bool {
        let generation = self.generation(tenant);
        self.semantic.lock().get(&key.scope).is_some_and(|q| {
            q.iter()
                .any(|e| e.generation == generation && e.at.elapsed() < self.ttl)
        })
    }

    pub fn get_semantic(
        &self,
        key: &CacheKey,
        tenant: &str,
        embedding: &[f32],
    ) -> Option<RetrieveResponse> {
        let generation = self.generation(tenant);
        let map = self.semantic.lock();
        map.get(&key.scope)?
            .iter()
            .filter(|e| e.generation == generation && e.at.elapsed() < self.ttl)
            .map(|e| (cosine(&e.embedding, embedding), e))
            .filter(|(c, _)| *c >= self.similarity)
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, e)| e.response.clone())
    }

    /// Stores an answer computed from the tenant's data as of `generation`
    /// (read when the request started).
    pub fn put(
        &self,
        key: &CacheKey,
        generation: u64,
        response: &RetrieveResponse,
        embedding_opt: Option<Vec<f32>>,
    ) {
        let now = Instant::now();
        {
            let mut map = self.results.lock();
            if map.len() >= MAX_ENTRIES {
                map.retain(|_, e| e.at.elapsed() < self.ttl);
                if map.len() >= MAX_ENTRIES {
                    map.clear();
                }
            }
            map.insert(
                key.exact,
                Entry {
                    at: now,
                    generation,
                    response: response.clone(),
                },
            );
        }
        if let Some(embedding) = embedding_opt.filter(|e| !e.is_empty()) {
            let mut map = self.semantic.lock();
            if map.len() >= MAX_ENTRIES {
                map.clear();
            }
            let q = map.entry(key.scope).or_default();
            if q.len() >= MAX_SEMANTIC_PER_SCOPE {
                q.pop_front();
            }
            q.push_back(SemEntry {
                at: now,
                generation,
                embedding,
                response: response.clone(),
            });
        }
    }

    /// Whether [`Self::get_turn`] would answer, without copying the answer.
    pub fn has_turn(&self, identity: &Identity, turn_id: &str) -> bool {
        self.read_turn(identity, turn_id, |_| ()).is_some()
    }

    /// This turn's first answer, unless a write of the tenant came since.
    pub fn get_turn(&self, identity: &Identity, turn_id: &str) -> Option<RetrieveResponse> {
        self.read_turn(identity, turn_id, RetrieveResponse::clone)
    }

    fn read_turn<T>(
        &self,
        identity: &Identity,
        turn_id: &str,
        read: impl FnOnce(&RetrieveResponse) -> T,
    ) -> Option<T> {
        let generation = self.generation(&identity.tenant);
        let map = self.turns.lock();
        let entry = map.get(&(identity.clone(), turn_id.to_string()))?;
        is_fresh(entry, generation).then(|| read(&entry.2))
    }

    /// Keeps a turn's first answer; a stale one (expired, or from before a
    /// write) is replaced.
    pub fn put_turn(
        &self,
        identity: &Identity,
        turn_id: &str,
        generation: u64,
        response: &RetrieveResponse,
    ) {
        let mut map = self.turns.lock();
        if map.len() >= MAX_ENTRIES {
            map.retain(|_, (at, _, _)| at.elapsed() < TURN_TTL);
            if map.len() >= MAX_ENTRIES {
                map.clear();
            }
        }
        let key = (identity.clone(), turn_id.to_string());
        if !map.get(&key).is_some_and(|e| is_fresh(e, generation)) {
            map.insert(key, (Instant::now(), generation, response.clone()));
        }
    }
}

/// A turn entry within its TTL and from the tenant's current generation.
fn is_fresh((at, g, _): &TurnEntry, generation: u64) -> bool {
    at.elapsed() < TURN_TTL && *g == generation
}

/// A cached answer as this request's own: its id, no retries, one "cache"
/// stage timing.
pub fn answer(mut r: RetrieveResponse, query_id: String, start: Instant) -> RetrieveResponse {
    r.route = QueryRoute::Skip as i32;
    r.skip_reason = SkipReason::CacheHit as i32;
    r.query_id = query_id;
    r.retry_count = 0;
    r.latency_ms = ms_since(start);
    r.stage_latencies = vec![StageLatency {
        stage: "cache".into(),
        ms: ms_since(start),
    }];
    r
}

pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() || a.is_empty() {
        return 0.0;
    }
    let (mut dot, mut na, mut nb) = (0.0f32, 0.0f32, 0.0f32);
    for (x, y) in a.iter().zip(b) {
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na.sqrt() * nb.sqrt())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engram_common::AccessLevel;
    use engram_proto::RetrieveRequest;

    fn id(tenant: &str, agent: &str, trust: AccessLevel) -> Identity {
        Identity {
            tenant: tenant.into(),
            agent_id: agent.into(),
            trust,
        }
    }

    fn query(text: &str) -> Query {
        Query::try_from(RetrieveRequest {
            text: text.into(),
            ..Default::default()
        })
        .expect("valid")
    }

    fn resp(qid: &str) -> RetrieveResponse {
        RetrieveResponse {
            query_id: qid.into(),
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn not_shared_across_identities_and_invalidated_by_writes() {
        let c = Caches::new(Duration::from_secs(60), 0.95);
        let alice = id("t1", "alice", AccessLevel::Sensitive);
        let bob = id("t1", "bob", AccessLevel::Public);
        let k_alice = CacheKey::new(&alice, &query("What  is X?"));
        c.put(&k_alice, c.generation("t1"), &resp("q1"), None);
        // Same text, normalised whitespace/case: hit for alice only.
        let again = CacheKey::new(&alice, &query("what is x?"));
        assert_eq!(
            c.get_exact(&again, "t1").map(|r| r.query_id),
            Some("q1".into())
        );
        let k_bob = CacheKey::new(&bob, &query("What  is X?"));
        assert!(c.get_exact(&k_bob, "t1").is_none());
        // Same agent name, lower trust: still a different identity.
        let k_low = CacheKey::new(
            &id("t1", "alice", AccessLevel::Public),
            &query("What is X?"),
        );
        assert!(c.get_exact(&k_low, "t1").is_none());

        c.invalidate_tenant("t2");
        assert!(c.get_exact(&k_alice, "t1").is_some());
        c.invalidate_tenant("t1");
        assert!(c.get_exact(&k_alice, "t1").is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn entries_expire_and_semantic_hits_need_similarity() {
        let c = Caches::new(Duration::from_secs(60), 0.95);
        let alice = id("t1", "alice", AccessLevel::Public);
        let k = CacheKey::new(&alice, &query("where is the key"));
        assert!(!c.has_semantic(&k, "t1"));
        c.put(
            &k,
            c.generation("t1"),
            &resp("q1"),
            Some(vec![1.0, 0.0, 0.0]),
        );
        let k2 = CacheKey::new(&alice, &query("where's the key"));
        assert!(c.has_semantic(&k2, "t1"));
        assert!(c.get_semantic(&k2, "t1", &[0.99, 0.05, 0.0]).is_some());
        assert!(c.get_semantic(&k2, "t1", &[0.0, 1.0, 0.0]).is_none());
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(c.get_exact(&k, "t1").is_none());
        assert!(!c.has_semantic(&k2, "t1"));
    }

    #[test]
    fn turn_cache_is_per_identity() {
        let c = Caches::new(Duration::from_secs(60), 0.95);
        let a = id("t1", "a", AccessLevel::Public);
        let b = id("t1", "b", AccessLevel::Public);
        c.put_turn(&a, "turn-1", 0, &resp("q1"));
        c.put_turn(&a, "turn-1", 0, &resp("q2"));
        assert_eq!(
            c.get_turn(&a, "turn-1").map(|r| r.query_id),
            Some("q1".into())
        );
        assert!(c.get_turn(&b, "turn-1").is_none());
    }

    #[test]
    fn an_answer_computed_across_a_write_is_never_served() {
        let c = Caches::new(Duration::from_secs(60), 0.95);
        let a = id("t1", "a", AccessLevel::Public);
        let k = CacheKey::new(&a, &query("who leads billing?"));
        // The request starts, a write lands, the request stores its answer.
        let started_at = c.generation("t1");
        c.invalidate_tenant("t1");
        c.put(&k, started_at, &resp("q1"), Some(vec![1.0, 0.0]));
        assert!(c.get_exact(&k, "t1").is_none());
        assert!(!c.has_semantic(&k, "t1"));
        // A turn's answer is dropped by the next write, then replaced.
        c.put_turn(&a, "turn-1", c.generation("t1"), &resp("q2"));
        assert!(c.get_turn(&a, "turn-1").is_some());
        c.invalidate_tenant("t1");
        assert!(c.get_turn(&a, "turn-1").is_none());
        c.put_turn(&a, "turn-1", c.generation("t1"), &resp("q3"));
        assert_eq!(
            c.get_turn(&a, "turn-1").map(|r| r.query_id),
            Some("q3".into())
        );
    }
}
