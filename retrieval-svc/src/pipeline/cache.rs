//! In-memory caches, all keyed by the full caller identity so one agent's
//! results (filtered by its trust level) can never be served to another.
//! Writes bump a per-tenant generation, which makes every older entry of
//! that tenant a miss without scanning the maps.
//!
//! Memory is bounded in bytes, not entries: each cache is a `moka` cache
//! weighed by the encoded size of what it keeps (one `limit=100` answer of
//! 64 KB memories is megabytes, an empty one a few hundred bytes), with TTL
//! eviction and a per-tenant share ([`Share`]) so one tenant's flood of
//! distinct queries cannot push every other tenant's answers out. moka was
//! chosen over hand-written maps for its size-aware eviction and lock-free
//! reads (docs/decisions.md). Eviction is least-recently-used, not moka's
//! default TinyLFU: TinyLFU admits a new entry only when its key was seen
//! more often than the victim's, and nearly every answer and turn here is
//! new, so a full cache stopped taking any (issue 47, item 10). A tenant at
//! its share makes room by dropping its own oldest entries, so its newest
//! turns are cached, not refused until the old ones expire.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use engram_common::Identity;
use engram_common::settings::PipelineSettings;
use engram_proto::{QueryRoute, RetrieveResponse, SkipReason, StageLatency};
use moka::notification::RemovalCause;
use parking_lot::Mutex;
use prost::Message;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use super::ctx::ms_since;
use super::text::query_words;
use super::unheard::Unheard;
use super::{current, slots};
use crate::query::Query;

const MAX_SEMANTIC_PER_SCOPE: usize = 16;
const TURN_TTL: Duration = Duration::from_secs(600);
/// Bookkeeping per entry beyond the answer's encoded size (key, Arc, moka's
/// own node): keeps tiny answers from looking free.
const ENTRY_OVERHEAD: usize = 256;

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
        let sense = sense(&q.text);
        scope.update((sense.len() as u64).to_le_bytes());
        scope.update(sense.as_bytes());
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

/// What a question's answer turns on that a cosine can miss: the names it
/// asks about, its numbers, and whether it asks about the past. Only
/// questions that agree on all three share a cosine neighbourhood, so
/// "Where does Mira live?" never answers "Where does Dana live?", nor
/// "Where did Mira live before?" (issue 47, item 11), however close their
/// vectors are; "where is the key" and "where's the key" still do.
fn sense(text: &str) -> String {
    let (names, _) = query_words(text);
    let words = slots::tokens(text);
    let mut parts: Vec<&str> = names.iter().map(String::as_str).collect();
    let numbers = words
        .iter()
        .filter(|w| w.chars().any(|c| c.is_ascii_digit()));
    parts.extend(numbers.map(String::as_str));
    parts.sort_unstable();
    let past = current::asks_past(text);
    format!("{}|{past}", parts.join(" "))
}

/// What the caches may hold: TTL, cosine for a semantic hit, total bytes
/// and one tenant's share of them.
#[derive(Debug, Clone, Copy)]
pub struct CacheLimits {
    pub ttl: Duration,
    pub similarity: f32,
    pub max_bytes: u64,
    pub tenant_share: f64,
}

impl CacheLimits {
    pub fn from_settings(p: &PipelineSettings) -> Self {
        Self {
            ttl: Duration::from_millis(p.cache_ttl_ms),
            similarity: p.cache_similarity,
            max_bytes: p.cache_max_bytes,
            tenant_share: p.cache_tenant_share,
        }
    }
}

/// One cached value with the tenant it is charged to, the tenant's write
/// generation it was computed at, and its weight.
struct Stored<T> {
    tenant: Arc<str>,
    at: Instant,
    generation: u64,
    bytes: u32,
    value: T,
}

impl<T> Stored<T> {
    fn fresh(&self, generation: u64, ttl: Duration) -> bool {
        self.generation == generation && self.at.elapsed() < ttl
    }
}

struct SemEntry {
    at: Instant,
    generation: u64,
    embedding: Vec<f32>,
    response: RetrieveResponse,
}

type Bytes = Arc<Mutex<HashMap<Arc<str>, u64>>>;

/// Bytes each tenant holds in one cache, kept by moka's removal listener;
/// a tenant past its share gets no new entries until some of its own go.
#[derive(Clone)]
struct Share {
    limit: u64,
    bytes: Bytes,
}

impl Share {
    fn new(limit: u64) -> Self {
        Self {
            limit,
            bytes: Arc::default(),
        }
    }

    /// Charges `bytes` to `tenant` if it stays within its share.
    fn admit(&self, tenant: &Arc<str>, bytes: u32) -> bool {
        let mut map = self.bytes.lock();
        let used = map.entry(tenant.clone()).or_insert(0);
        if *used + u64::from(bytes) > self.limit {
            return false;
        }
        *used += u64::from(bytes);
        true
    }

    fn release(&self, tenant: &Arc<str>, bytes: u32) {
        let mut map = self.bytes.lock();
        if let Some(used) = map.get_mut(tenant) {
            *used = used.saturating_sub(u64::from(bytes));
            if *used == 0 {
                map.remove(tenant);
            }
        }
    }

    fn holds(&self, tenant: &str) -> bool {
        self.bytes.lock().contains_key(tenant)
    }

    #[cfg(test)]
    fn used(&self, tenant: &str) -> u64 {
        self.bytes.lock().get(tenant).copied().unwrap_or(0)
    }
}

/// Each tenant's keys in the order they were stored, so a tenant at its
/// share drops its own oldest first. A key may outlive its entry (expired,
/// evicted, replaced); the queues are pruned so they stay within a few
/// times the entries that can be live.
#[derive(Default)]
struct Order {
    queues: HashMap<Arc<str>, VecDeque<[u8; 32]>>,
    puts: u64,
}

/// How often (in puts) the queues of tenants holding nothing are dropped.
const PRUNE_EVERY: u64 = 1024;

type Store<T> = moka::sync::Cache<[u8; 32], Arc<Stored<T>>>;

/// A byte-weighed moka cache whose removals give the bytes back to the
/// tenant's share.
fn store<T: Send + Sync + 'static>(max_bytes: u64, ttl: Duration, share: &Share) -> Store<T> {
    let listener = share.clone();
    moka::sync::Cache::builder()
        .max_capacity(max_bytes)
        .weigher(|_k: &[u8; 32], v: &Arc<Stored<T>>| v.bytes)
        .time_to_live(ttl)
        .eviction_policy(moka::policy::EvictionPolicy::lru())
        .eviction_listener(move |_k, v: Arc<Stored<T>>, _cause: RemovalCause| {
            listener.release(&v.tenant, v.bytes);
        })
        .build()
}

fn weigh(encoded: usize) -> u32 {
    u32::try_from(encoded + ENTRY_OVERHEAD).unwrap_or(u32::MAX)
}

/// One cache with its tenant accounting.
struct Shared<T> {
    store: Store<T>,
    share: Share,
    order: Mutex<Order>,
    /// Most keys a tenant's queue keeps: as many entries as its share
    /// could hold at the smallest weight.
    max_queue: usize,
}

impl<T: Send + Sync + 'static> Shared<T> {
    fn new(max_bytes: u64, tenant_share: f64, ttl: Duration) -> Self {
        // Saturating float-to-int: a share of 1.0 is the whole cache.
        let limit = (max_bytes as f64 * tenant_share) as u64;
        let share = Share::new(limit.max(1));
        let max_queue = usize::try_from(limit / ENTRY_OVERHEAD as u64).unwrap_or(usize::MAX);
        Self {
            store: store(max_bytes, ttl, &share),
            share,
            order: Mutex::default(),
            max_queue: max_queue.max(1),
        }
    }

    fn get(&self, key: &[u8; 32]) -> Option<Arc<Stored<T>>> {
        self.store.get(key)
    }

    /// Stores, first dropping the tenant's own oldest entries while it is
    /// over its share (an entry larger than the whole share is not
    /// stored); a dropped or replaced entry's bytes come back through the
    /// listener, which moka calls at once on an invalidation.
    fn put(&self, key: [u8; 32], stored: Stored<T>) {
        let mut order = self.order.lock();
        order.puts += 1;
        if order.puts.is_multiple_of(PRUNE_EVERY) {
            order.queues.retain(|t, _| self.share.holds(t));
        }
        let queue = order.queues.entry(stored.tenant.clone()).or_default();
        while !self.share.admit(&stored.tenant, stored.bytes) {
            let Some(oldest) = queue.pop_front() else {
                return;
            };
            self.store.invalidate(&oldest);
        }
        queue.push_back(key);
        if queue.len() > self.max_queue {
            queue.pop_front();
        }
        drop(order);
        self.store.insert(key, Arc::new(stored));
    }
}

pub struct Caches {
    ttl: Duration,
    similarity: f32,
    results: Shared<RetrieveResponse>,
    semantic: Shared<Vec<Arc<SemEntry>>>,
    turns: Shared<RetrieveResponse>,
    generations: Mutex<Generations>,
    /// Each tenant's latest write graph-svc may not have heard of.
    unheard: Mutex<Unheard>,
}

/// Per-tenant write counters, plus an epoch that a resync of the change
/// feed bumps for every tenant at once.
#[derive(Default)]
struct Generations {
    epoch: u64,
    tenants: HashMap<String, u64>,
}

impl Caches {
    pub fn new(limits: CacheLimits) -> Self {
        let each = limits.max_bytes / 3;
        let share = limits.tenant_share;
        Self {
            ttl: limits.ttl,
            similarity: limits.similarity,
            results: Shared::new(each, share, limits.ttl),
            semantic: Shared::new(each, share, limits.ttl),
            turns: Shared::new(each, share, TURN_TTL),
            generations: Mutex::default(),
            unheard: Mutex::default(),
        }
    }

    /// Bytes each cache holds now, for the scrape-time gauge.
    pub fn weighed_bytes(&self) -> [(&'static str, u64); 3] {
        [
            ("results", self.results.store.weighted_size()),
            ("semantic", self.semantic.store.weighted_size()),
            ("turns", self.turns.store.weighted_size()),
        ]
    }

    /// The tenant's write generation. A request reads it when it starts and
    /// stores its answer under it, so a write that lands while the request
    /// runs leaves that answer stale instead of cached as fresh.
    pub fn generation(&self, tenant: &str) -> u64 {
        let g = self.generations.lock();
        let own = g.tenants.get(tenant).copied().unwrap_or(0);
        (g.epoch << 32).wrapping_add(own)
    }

    /// A write for `tenant` went through: every cached result of it is stale.
    pub fn invalidate_tenant(&self, tenant: &str) {
        *self
            .generations
            .lock()
            .tenants
            .entry(tenant.to_string())
            .or_insert(0) += 1;
    }

    /// `tenant`'s write `write_id` went through (or may have): every cached
    /// answer of it is stale, and graph walks name the write until
    /// graph-svc has heard of it (unheard.rs).
    pub fn wrote(&self, tenant: &str, write_id: &str) {
        self.invalidate_tenant(tenant);
        self.unheard.lock().wrote(tenant, write_id, Instant::now());
    }

    /// The write a graph walk for `tenant` must reflect to be fresh, or "".
    pub fn unheard_write(&self, tenant: &str) -> String {
        self.unheard.lock().write_for(tenant, Instant::now())
    }

    /// Changes may have been missed: every cached answer is stale.
    pub fn invalidate_all(&self) {
        let mut g = self.generations.lock();
        g.epoch += 1;
        g.tenants.clear();
    }

    pub fn get_exact(&self, key: &CacheKey, tenant: &str) -> Option<RetrieveResponse> {
        let generation = self.generation(tenant);
        let e = self.results.get(&key.exact)?;
        e.fresh(generation, self.ttl).then(|| e.value.clone())
    }

    /// Whether a cosine lookup could hit; the caller embeds the query only then.
    pub fn has_semantic(&self, key: &CacheKey, tenant: &str) -> bool {
        let generation = self.generation(tenant);
        self.semantic.get(&key.scope).is_some_and(|q| {
            q.value
                .iter()
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
        let q = self.semantic.get(&key.scope)?;
        q.value
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
        tenant: &str,
        generation: u64,
        response: &RetrieveResponse,
        embedding_opt: Option<Vec<f32>>,
    ) {
        let now = Instant::now();
        let tenant: Arc<str> = Arc::from(tenant);
        let encoded = response.encoded_len();
        self.results.put(
            key.exact,
            Stored {
                tenant: tenant.clone(),
                at: now,
                generation,
                bytes: weigh(encoded),
                value: response.clone(),
            },
        );
        if let Some(embedding) = embedding_opt.filter(|e| !e.is_empty()) {
            self.put_semantic(key, tenant, generation, response, embedding);
        }
    }

    /// Appends to the scope's short list (copy on write: readers keep the
    /// list they got), dropping the oldest and anything stale.
    fn put_semantic(
        &self,
        key: &CacheKey,
        tenant: Arc<str>,
        generation: u64,
        response: &RetrieveResponse,
        embedding: Vec<f32>,
    ) {
        let mut list: Vec<Arc<SemEntry>> = self
            .semantic
            .get(&key.scope)
            .map(|q| {
                q.value
                    .iter()
                    .filter(|e| e.generation == generation && e.at.elapsed() < self.ttl)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        if list.len() >= MAX_SEMANTIC_PER_SCOPE {
            list.remove(0);
        }
        list.push(Arc::new(SemEntry {
            at: Instant::now(),
            generation,
            embedding,
            response: response.clone(),
        }));
        let encoded: usize = list
            .iter()
            .map(|e| e.response.encoded_len() + e.embedding.len() * 4)
            .sum();
        self.semantic.put(
            key.scope,
            Stored {
                tenant,
                at: Instant::now(),
                generation,
                bytes: weigh(encoded),
                value: list,
            },
        );
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
        let entry = self.turns.get(&turn_key(identity, turn_id))?;
        entry
            .fresh(generation, TURN_TTL)
            .then(|| read(&entry.value))
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
        let key = turn_key(identity, turn_id);
        if self
            .turns
            .get(&key)
            .is_some_and(|e| e.fresh(generation, TURN_TTL))
        {
            return;
        }
        self.turns.put(
            key,
            Stored {
                tenant: Arc::from(identity.tenant.as_str()),
                at: Instant::now(),
                generation,
                bytes: weigh(response.encoded_len()),
                value: response.clone(),
            },
        );
    }
}

/// A turn is keyed by a hash of who asked and the caller's turn id, so an
/// unbounded caller string never becomes a key. The replicas share it
/// (turns.rs).
pub fn turn_key(identity: &Identity, turn_id: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    for part in [
        identity.tenant.as_bytes(),
        identity.agent_id.as_bytes(),
        identity.trust.name().as_bytes(),
        turn_id.as_bytes(),
    ] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h.finalize().into()
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

    fn limits(max_bytes: u64) -> CacheLimits {
        CacheLimits {
            ttl: Duration::from_secs(60),
            similarity: 0.95,
            max_bytes,
            tenant_share: 0.25,
        }
    }

    fn resp(qid: &str) -> RetrieveResponse {
        RetrieveResponse {
            query_id: qid.into(),
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn not_shared_across_identities_and_invalidated_by_writes() {
        let c = Caches::new(limits(1 << 30));
        let alice = id("t1", "alice", AccessLevel::Sensitive);
        let bob = id("t1", "bob", AccessLevel::Public);
        let k_alice = CacheKey::new(&alice, &query("What  is X?"));
        c.put(&k_alice, "t1", c.generation("t1"), &resp("q1"), None);
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
        c.put(&k_alice, "t1", c.generation("t1"), &resp("q2"), None);
        assert!(c.get_exact(&k_alice, "t1").is_some());
        c.invalidate_all();
        assert!(c.get_exact(&k_alice, "t1").is_none());
    }

    #[tokio::test]
    async fn a_write_drops_answers_and_is_named_to_the_graph() {
        let c = Caches::new(limits(1 << 30));
        let alice = id("t1", "alice", AccessLevel::Public);
        let k = CacheKey::new(&alice, &query("What is X?"));
        c.put(&k, "t1", c.generation("t1"), &resp("q1"), None);
        assert_eq!(c.unheard_write("t1"), "");
        c.wrote("t1", "w1");
        assert!(c.get_exact(&k, "t1").is_none(), "the write drops answers");
        assert_eq!(c.unheard_write("t1"), "w1");
        assert_eq!(c.unheard_write("t2"), "", "only the writer's tenant");
    }

    #[test]
    fn another_name_number_or_tense_never_shares_a_cosine_hit() {
        let c = Caches::new(limits(1 << 30));
        let alice = id("t1", "alice", AccessLevel::Public);
        let v = [1.0, 0.0, 0.0];
        let asked = CacheKey::new(&alice, &query("Where does Mira live?"));
        c.put(
            &asked,
            "t1",
            c.generation("t1"),
            &resp("q1"),
            Some(v.to_vec()),
        );
        for other in [
            "Where does Dana live?",
            "Where did Mira live before?",
            "Where does Mira live in 2023?",
        ] {
            let k = CacheKey::new(&alice, &query(other));
            assert!(c.get_semantic(&k, "t1", &v).is_none(), "{other}");
        }
        let same = CacheKey::new(&alice, &query("where does Mira live"));
        assert!(c.get_semantic(&same, "t1", &v).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn entries_expire_and_semantic_hits_need_similarity() {
        let c = Caches::new(limits(1 << 30));
        let alice = id("t1", "alice", AccessLevel::Public);
        let k = CacheKey::new(&alice, &query("where is the key"));
        assert!(!c.has_semantic(&k, "t1"));
        c.put(
            &k,
            "t1",
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
        let c = Caches::new(limits(1 << 30));
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
        let c = Caches::new(limits(1 << 30));
        let a = id("t1", "a", AccessLevel::Public);
        let k = CacheKey::new(&a, &query("who leads billing?"));
        // The request starts, a write lands, the request stores its answer.
        let started_at = c.generation("t1");
        c.invalidate_tenant("t1");
        c.put(&k, "t1", started_at, &resp("q1"), Some(vec![1.0, 0.0]));
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

    #[test]
    fn one_tenant_cannot_fill_the_cache_past_its_share() {
        // 3 MB in all, 1 MB per cache, a quarter of it per tenant.
        let c = Caches::new(limits(3 << 20));
        let big = RetrieveResponse {
            query_id: "x".repeat(100 * 1024),
            ..Default::default()
        };
        let flooder = id("t-flood", "a", AccessLevel::Public);
        for i in 0..50 {
            let k = CacheKey::new(&flooder, &query(&format!("question {i}")));
            c.put(&k, "t-flood", 0, &big, None);
        }
        c.results.store.run_pending_tasks();
        let used = c.results.share.used("t-flood");
        assert!(used <= (1 << 20) / 4, "flooder holds {used} bytes");
        // Another tenant still caches, and its answer stays.
        let other = id("t-quiet", "b", AccessLevel::Public);
        let k = CacheKey::new(&other, &query("where is the key"));
        c.put(&k, "t-quiet", 0, &resp("q-quiet"), None);
        for i in 50..100 {
            let k = CacheKey::new(&flooder, &query(&format!("question {i}")));
            c.put(&k, "t-flood", 0, &big, None);
        }
        c.results.store.run_pending_tasks();
        assert_eq!(
            c.get_exact(&k, "t-quiet").map(|r| r.query_id),
            Some("q-quiet".into())
        );
    }

    #[test]
    fn a_full_cache_keeps_taking_new_answers() {
        // Issue 47, item 10: under TinyLFU a full cache admitted no answer
        // it had not seen before, and nearly every answer is new.
        let c = Caches::new(CacheLimits {
            tenant_share: 1.0,
            ..limits(3 << 20)
        });
        let a = id("t1", "a", AccessLevel::Public);
        let big = RetrieveResponse {
            query_id: "x".repeat(64 * 1024),
            ..Default::default()
        };
        for i in 0..200 {
            let k = CacheKey::new(&a, &query(&format!("question {i}")));
            c.put(&k, "t1", 0, &big, None);
            c.results.store.run_pending_tasks();
        }
        let last = CacheKey::new(&a, &query("question 199"));
        assert!(
            c.get_exact(&last, "t1").is_some(),
            "the newest answer was refused"
        );
    }

    #[test]
    fn a_tenant_at_its_share_drops_its_own_oldest_turn() {
        // Issue 47, item 10: a busy tenant's new turns were refused until
        // its old ones expired (600 s).
        let c = Caches::new(limits(3 << 20));
        let a = id("t-busy", "a", AccessLevel::Public);
        let big = RetrieveResponse {
            query_id: "x".repeat(64 * 1024),
            ..Default::default()
        };
        for i in 0..40 {
            c.put_turn(&a, &format!("turn-{i}"), c.generation("t-busy"), &big);
        }
        c.turns.store.run_pending_tasks();
        assert!(c.has_turn(&a, "turn-39"), "the newest turn was refused");
        assert!(
            !c.has_turn(&a, "turn-0"),
            "the oldest turn should have made room"
        );
        let used = c.turns.share.used("t-busy");
        assert!(used <= (1 << 20) / 4, "the tenant holds {used} bytes");
    }

    #[test]
    fn bytes_come_back_when_entries_go() {
        let c = Caches::new(limits(3 << 20));
        let a = id("t1", "a", AccessLevel::Public);
        let k = CacheKey::new(&a, &query("q"));
        c.put(&k, "t1", 0, &resp("q1"), None);
        c.results.store.run_pending_tasks();
        assert!(c.results.share.used("t1") > 0);
        c.put(&k, "t1", 0, &resp("q2"), None);
        c.results.store.invalidate_all();
        c.results.store.run_pending_tasks();
        assert_eq!(c.results.share.used("t1"), 0);
    }
}
