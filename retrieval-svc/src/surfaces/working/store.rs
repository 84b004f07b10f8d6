//! The session store of Layer 6: validated working-memory writes, bounded
//! sessions with TTL and LRU eviction, trust-aware reads and the ranking of
//! fragments against a query; also the validated `GetMemoryRequest`. A leaf:
//! it knows nothing of the pipeline or the gateway.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use engram_common::settings::WorkingMemorySettings;
use engram_common::text::MAX_NAMESPACE_CHARS;
use engram_common::{AccessLevel, Identity};
use engram_proto::{GetMemoryRequest, Memory, UpsertResult};
use parking_lot::Mutex;
use prometheus::{IntCounterVec, IntGauge, Opts};
use prost_types::value::Kind;

use crate::error::Error;
use crate::query::{DEFAULT_LIMIT, MAX_LIMIT, MAX_TEXT_CHARS};

/// The `memory_type` that routes a write to working memory.
pub const WORKING_TYPE: &str = "working";
pub const MAX_SESSION_ID_CHARS: usize = 128;
pub const DEFAULT_MAX_DEPTH: u32 = 2;
pub const MAX_DEPTH: u32 = 4;
pub const EMBEDDING_DIM: usize = 384;
const MAX_CONTENT_BYTES: usize = 64 * 1024;
const MAX_SOURCE_CHARS: usize = 2048;
/// Causal links returned at most, whatever the depth.
pub const MAX_CHAIN: u32 = 50;
/// A fragment matches on words when it holds this share of the query's
/// content words.
const MIN_TEXT_MATCH: f32 = 0.34;
/// Added to the recency score `1 / (1 + n)` (n = newer matching notes):
/// it can never lift a note over one of the three newest, only reorder
/// older ones, so the latest word on a subject wins.
const CONFIDENCE_BONUS: f32 = 0.05;

const STOPWORDS: &[&str] = &[
    "a", "about", "an", "and", "are", "as", "at", "be", "by", "did", "do", "does", "for", "from",
    "had", "has", "have", "how", "i", "in", "is", "it", "its", "me", "my", "of", "on", "or", "our",
    "say", "said", "that", "the", "their", "this", "to", "was", "we", "were", "what", "when",
    "where", "which", "who", "why", "will", "with", "you", "your",
];

fn tokens(text: &str) -> HashSet<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|t| t.chars().count() >= 2)
        .map(str::to_lowercase)
        .filter(|t| !STOPWORDS.contains(&t.as_str()))
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> Option<f32> {
    if a.len() != b.len() || a.is_empty() {
        return None;
    }
    let (mut dot, mut na, mut nb) = (0.0f32, 0.0f32, 0.0f32);
    for (x, y) in a.iter().zip(b) {
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    (na > 0.0 && nb > 0.0).then(|| dot / (na.sqrt() * nb.sqrt()))
}

/// A session is private to the agent that wrote it, within its tenant.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionKey {
    pub tenant: String,
    pub agent: String,
    pub session: String,
}

impl SessionKey {
    pub fn new(identity: &Identity, session: &str) -> Self {
        Self {
            tenant: identity.tenant.clone(),
            agent: identity.agent_id.clone(),
            session: session.to_string(),
        }
    }
}

/// A validated working-memory write.
#[derive(Debug, Clone)]
pub struct WorkingWrite {
    pub id: String,
    pub session_id: String,
    pub ttl: Duration,
    pub content: String,
    pub title: String,
    pub namespace: String,
    pub source: String,
    pub confidence: f32,
    pub access: AccessLevel,
    pub embedding_opt: Option<Vec<f32>>,
}

pub fn is_working(m: &Memory) -> bool {
    m.memory_type == WORKING_TYPE
}

impl WorkingWrite {
    /// Boundary validation of a `memory_type = "working"` memory. Graph-only
    /// fields (entities, triples, supersedes, validity, consolidated) and a
    /// conversation turn's place have no meaning for a session note and are
    /// ignored, as are output-only ones.
    pub fn from_memory(m: Memory, s: &WorkingMemorySettings) -> Result<Self, Error> {
        let Memory {
            id,
            namespace,
            agent_id: _,
            memory_type: _,
            content,
            title,
            access_level,
            source_confidence,
            decay_score: _,
            event_time: _,
            ingestion_time: _,
            valid_from: _,
            valid_to: _,
            recorded_at: _,
            retracted_at: _,
            version: _,
            supersedes: _,
            consolidated: _,
            metadata,
            source,
            entities: _,
            triples: _,
            embedding,
            tenant_id: _,
            turn: _,
            history: _,
        } = m;
        let id = if id.is_empty() {
            uuid::Uuid::new_v4().to_string()
        } else {
            uuid::Uuid::parse_str(&id)
                .map_err(|_| Error::invalid("memories.id", "must be a UUID or empty"))?
                .to_string()
        };
        if content.trim().is_empty() {
            return Err(Error::invalid("memories.content", "must not be empty"));
        }
        if content.len() + title.len() > MAX_CONTENT_BYTES {
            return Err(Error::invalid(
                "memories.content",
                format!("content and title must be at most {MAX_CONTENT_BYTES} bytes"),
            ));
        }
        if namespace.chars().count() > MAX_NAMESPACE_CHARS {
            return Err(Error::invalid(
                "memories.namespace",
                format!("at most {MAX_NAMESPACE_CHARS} characters"),
            ));
        }
        if source.chars().count() > MAX_SOURCE_CHARS {
            return Err(Error::invalid(
                "memories.source",
                format!("at most {MAX_SOURCE_CHARS} characters"),
            ));
        }
        let confidence = source_confidence.unwrap_or(1.0);
        if !(0.0..=1.0).contains(&confidence) {
            return Err(Error::invalid(
                "memories.source_confidence",
                "must be in 0..=1",
            ));
        }
        let access = AccessLevel::from_proto(access_level).ok_or_else(|| {
            Error::invalid(
                "memories.access_level",
                format!("unknown access level {access_level}"),
            )
        })?;
        let fields = metadata.map(|m| m.fields).unwrap_or_default();
        let session_id = match fields.get("session_id").and_then(|v| v.kind.as_ref()) {
            Some(Kind::StringValue(s))
                if !s.trim().is_empty()
                    && s.chars().count() <= MAX_SESSION_ID_CHARS
                    && !s.contains('\0') =>
            {
                s.clone()
            }
            _ => {
                return Err(Error::invalid(
                    "memories.metadata.session_id",
                    format!(
                        "a working memory needs a string session_id of 1..={MAX_SESSION_ID_CHARS} characters, no NUL"
                    ),
                ));
            }
        };
        let ttl_ms = match fields.get("ttl_ms").and_then(|v| v.kind.as_ref()) {
            None | Some(Kind::NullValue(_)) => s.default_ttl_ms,
            Some(Kind::NumberValue(n))
                if n.is_finite() && *n >= 1.0 && *n <= s.max_ttl_ms as f64 && n.fract() == 0.0 =>
            {
                *n as u64
            }
            _ => {
                return Err(Error::invalid(
                    "memories.metadata.ttl_ms",
                    format!("must be a whole number in 1..={}", s.max_ttl_ms),
                ));
            }
        };
        let embedding_opt = if embedding.is_empty() {
            None
        } else if embedding.len() != EMBEDDING_DIM || embedding.iter().any(|x| !x.is_finite()) {
            return Err(Error::invalid(
                "memories.embedding",
                format!("must be empty or {EMBEDDING_DIM} finite floats"),
            ));
        } else {
            Some(embedding)
        };
        Ok(Self {
            id,
            session_id,
            ttl: Duration::from_millis(ttl_ms),
            content,
            title,
            namespace,
            source,
            confidence,
            access,
            embedding_opt,
        })
    }

    pub fn text(&self) -> String {
        if self.title.is_empty() {
            self.content.clone()
        } else {
            format!("{}\n{}", self.title, self.content)
        }
    }
}

/// One stored note.
#[derive(Debug, Clone)]
pub struct Fragment {
    pub id: String,
    pub content: String,
    pub title: String,
    pub namespace: String,
    pub source: String,
    pub confidence: f32,
    pub access: AccessLevel,
    pub embedding_opt: Option<Arc<[f32]>>,
    tokens: Arc<HashSet<String>>,
    pub written_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub version: i32,
    used: u64,
    /// What this fragment costs the store (strings, vector, word set).
    bytes: usize,
    /// Stored in Postgres too (shared.rs): a note the shared copy no
    /// longer holds was deleted, expired or evicted through another
    /// replica, and goes here too when the session is next read.
    shared: bool,
}

/// Bookkeeping per fragment beyond its text and vector (maps, Arcs).
const FRAGMENT_OVERHEAD: usize = 256;

impl Fragment {
    fn weigh(&self) -> usize {
        let text = self.id.len()
            + self.content.len()
            + self.title.len()
            + self.namespace.len()
            + self.source.len();
        let vector = self.embedding_opt.as_ref().map_or(0, |e| e.len() * 4);
        let words: usize = self.tokens.iter().map(|t| t.len() + 32).sum();
        text + vector + words + FRAGMENT_OVERHEAD
    }
}

struct Session {
    fragments: HashMap<String, Fragment>,
    used: u64,
}

/// What one tenant holds.
#[derive(Debug, Default, Clone, Copy)]
struct Usage {
    bytes: usize,
    sessions: usize,
}

/// Every session, with running totals kept by the only four functions that
/// add or remove fragments ([`State::insert`], [`State::remove`],
/// [`State::drop_session`], [`State::expire`]).
#[derive(Default)]
struct State {
    sessions: HashMap<SessionKey, Session>,
    tick: u64,
    fragments: usize,
    bytes: usize,
    tenants: HashMap<String, Usage>,
}

impl State {
    fn next(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    fn usage(&self, tenant: &str) -> Usage {
        self.tenants.get(tenant).copied().unwrap_or_default()
    }

    /// Stores `f` in the session (opened if absent); returns what it replaced.
    fn insert(&mut self, key: &SessionKey, f: Fragment, tick: u64) -> Option<Fragment> {
        let added = f.bytes;
        if !self.sessions.contains_key(key) {
            self.tenants.entry(key.tenant.clone()).or_default().sessions += 1;
        }
        let session = self.sessions.entry(key.clone()).or_insert_with(|| Session {
            fragments: HashMap::new(),
            used: tick,
        });
        session.used = tick;
        let old = session.fragments.insert(f.id.clone(), f);
        let removed = old.as_ref().map_or(0, |o| o.bytes);
        if old.is_none() {
            self.fragments += 1;
        }
        self.bytes = self.bytes + added - removed;
        let usage = self.tenants.entry(key.tenant.clone()).or_default();
        usage.bytes = usage.bytes + added - removed;
        old
    }

    /// Removes one fragment; an emptied session goes with it.
    fn remove(&mut self, key: &SessionKey, id: &str) -> Option<Fragment> {
        let session = self.sessions.get_mut(key)?;
        let f = session.fragments.remove(id)?;
        let emptied = session.fragments.is_empty();
        self.fragments -= 1;
        self.bytes -= f.bytes;
        if let Some(u) = self.tenants.get_mut(&key.tenant) {
            u.bytes -= f.bytes;
        }
        if emptied {
            self.drop_session(key);
        }
        Some(f)
    }

    /// Removes a whole session; returns how many fragments it held.
    fn drop_session(&mut self, key: &SessionKey) -> usize {
        let Some(s) = self.sessions.remove(key) else {
            return 0;
        };
        let bytes: usize = s.fragments.values().map(|f| f.bytes).sum();
        self.fragments -= s.fragments.len();
        self.bytes -= bytes;
        if let Some(u) = self.tenants.get_mut(&key.tenant) {
            u.bytes -= bytes;
            u.sessions -= 1;
            if u.sessions == 0 {
                self.tenants.remove(&key.tenant);
            }
        }
        s.fragments.len()
    }

    /// Drops the session's expired fragments; returns how many.
    fn expire(&mut self, key: &SessionKey, now: DateTime<Utc>) -> usize {
        let Some(s) = self.sessions.get(key) else {
            return 0;
        };
        let ids: Vec<String> = s
            .fragments
            .values()
            .filter(|f| f.expires_at <= now)
            .map(|f| f.id.clone())
            .collect();
        for id in &ids {
            self.remove(key, id);
        }
        ids.len()
    }

    /// The least recently used session matching `pick`.
    fn lru_session(&self, pick: impl Fn(&SessionKey, &Session) -> bool) -> Option<SessionKey> {
        self.sessions
            .iter()
            .filter(|(k, s)| pick(k, s))
            .min_by_key(|(_, s)| s.used)
            .map(|(k, _)| k.clone())
    }

    /// The tenant's least recently used fragment at or below `trust`, in
    /// any of its sessions.
    fn lru_fragment_of(&self, tenant: &str, trust: AccessLevel) -> Option<(SessionKey, String)> {
        self.sessions
            .iter()
            .filter(|(k, _)| k.tenant == tenant)
            .flat_map(|(k, s)| s.fragments.values().map(move |f| (k, f)))
            .filter(|(_, f)| f.access <= trust)
            .min_by_key(|(_, f)| f.used)
            .map(|(k, f)| (k.clone(), f.id.clone()))
    }
}

fn first_unwritable(st: &State, identity: &Identity, writes: &[WorkingWrite]) -> Option<usize> {
    writes.iter().position(|w| {
        let key = SessionKey::new(identity, &w.session_id);
        st.sessions
            .get(&key)
            .and_then(|s| s.fragments.get(&w.id))
            .is_some_and(|f| f.access > identity.trust)
    })
}

/// How much the store may hold: per session, per tenant and in all.
#[derive(Debug, Clone, Copy)]
struct Limits {
    per_session: usize,
    sessions: usize,
    tenant_sessions: usize,
    tenant_bytes: usize,
    bytes: usize,
}

/// The in-process store. One short lock per call; ranking (cosine over the
/// session's fragments) happens on clones outside it.
pub struct WorkingMemory {
    state: Mutex<State>,
    limits: Limits,
    fragments_gauge: IntGauge,
    sessions_gauge: IntGauge,
    bytes_gauge: IntGauge,
    evicted: IntCounterVec,
}

/// A fragment that matched a query.
#[derive(Debug, Clone)]
pub struct Hit {
    pub fragment: Fragment,
    pub score: f32,
    pub text_match: f32,
    pub similarity_opt: Option<f32>,
}

impl WorkingMemory {
    pub fn new(s: &WorkingMemorySettings) -> prometheus::Result<Self> {
        Ok(Self {
            state: Mutex::new(State::default()),
            limits: Limits {
                per_session: s.max_per_session.max(1),
                sessions: s.max_sessions.max(1),
                tenant_sessions: s.max_sessions_per_tenant.max(1),
                tenant_bytes: s.max_bytes_per_tenant.max(1),
                bytes: s.max_bytes.max(1),
            },
            fragments_gauge: IntGauge::new(
                "engram_working_memory_fragments",
                "Working-memory fragments held in this gateway.",
            )?,
            sessions_gauge: IntGauge::new(
                "engram_working_memory_sessions",
                "Working-memory sessions held in this gateway.",
            )?,
            bytes_gauge: IntGauge::new(
                "engram_working_memory_bytes",
                "Estimated bytes of working memory held in this gateway.",
            )?,
            evicted: IntCounterVec::new(
                Opts::new(
                    "engram_working_memory_evicted_total",
                    "Working-memory fragments dropped, by reason (ttl, lru_fragment, lru_session, tenant_budget, memory_budget).",
                ),
                &["reason"],
            )?,
        })
    }

    pub fn register(&self, m: &crate::metrics::Metrics) -> prometheus::Result<()> {
        m.register(Box::new(self.fragments_gauge.clone()))?;
        m.register(Box::new(self.sessions_gauge.clone()))?;
        m.register(Box::new(self.bytes_gauge.clone()))?;
        m.register(Box::new(self.evicted.clone()))?;
        Ok(())
    }

    fn gauges(&self, st: &State) {
        let set = |g: &IntGauge, n: usize| g.set(i64::try_from(n).unwrap_or(i64::MAX));
        set(&self.fragments_gauge, st.fragments);
        set(&self.sessions_gauge, st.sessions.len());
        set(&self.bytes_gauge, st.bytes);
    }

    fn evict(&self, reason: &'static str, n: usize) {
        if n > 0 {
            self.evicted.with_label_values(&[reason]).inc_by(n as u64);
        }
    }

    /// The index of the first write that would replace a fragment stored
    /// above the caller's trust: a public key of an agent must not overwrite
    /// what the same agent wrote at a higher level.
    pub fn first_unwritable(&self, identity: &Identity, writes: &[WorkingWrite]) -> Option<usize> {
        let st = self.state.lock();
        first_unwritable(&st, identity, writes)
    }

    /// Writes (or rewrites, by id) fragments of one identity, all or none:
    /// `Err(i)` when write `i` would replace a fragment above the caller's
    /// trust ([`Self::first_unwritable`]). A rewrite with new content bumps
    /// the version. Room is made first in the writer's own share (its least
    /// recently used fragment or session), then in the store's.
    pub fn put(
        &self,
        identity: &Identity,
        writes: Vec<WorkingWrite>,
        now: DateTime<Utc>,
    ) -> Result<Vec<UpsertResult>, usize> {
        self.put_versions(identity, writes, None, now)
    }

    /// [`Self::put`] with each write's version and `created` as the shared
    /// copy stored them (same order), when it did.
    pub fn put_versions(
        &self,
        identity: &Identity,
        writes: Vec<WorkingWrite>,
        shared_opt: Option<&[(i32, bool)]>,
        now: DateTime<Utc>,
    ) -> Result<Vec<UpsertResult>, usize> {
        let mut st = self.state.lock();
        if let Some(i) = first_unwritable(&st, identity, &writes) {
            return Err(i);
        }
        let out = (writes.into_iter().enumerate())
            .map(|(i, w)| {
                let forced = shared_opt.and_then(|v| v.get(i).copied());
                self.put_one(&mut st, identity, w, forced, now)
            })
            .collect();
        self.gauges(&st);
        Ok(out)
    }

    /// Makes this replica's copy of a session what the shared copy holds at
    /// or below `trust` (`notes`): shared notes it no longer holds go, new
    /// or newer ones come in (within this replica's limits). Notes above
    /// `trust` and notes never shared stay as they are.
    pub fn sync(
        &self,
        key: &SessionKey,
        trust: AccessLevel,
        notes: Vec<Fragment>,
        now: DateTime<Utc>,
    ) {
        let mut st = self.state.lock();
        let held: HashSet<&str> = notes.iter().map(|f| f.id.as_str()).collect();
        let gone: Vec<String> = (st.sessions.get(key).into_iter())
            .flat_map(|s| s.fragments.values())
            .filter(|f| f.shared && f.access <= trust && !held.contains(f.id.as_str()))
            .map(|f| f.id.clone())
            .collect();
        for id in &gone {
            st.remove(key, id);
        }
        for mut f in notes {
            let local = st.sessions.get(key).and_then(|s| s.fragments.get(&f.id));
            if local.is_some_and(|l| {
                l.version >= f.version
                    && l.expires_at.timestamp_millis() == f.expires_at.timestamp_millis()
            }) {
                continue;
            }
            let created = local.is_none();
            let tick = st.next();
            f.used = tick;
            self.make_room(&mut st, key, trust, f.bytes, created, now);
            st.insert(key, f, tick);
        }
        self.gauges(&st);
    }

    fn put_one(
        &self,
        st: &mut State,
        identity: &Identity,
        w: WorkingWrite,
        forced: Option<(i32, bool)>,
        now: DateTime<Utc>,
    ) -> UpsertResult {
        let key = SessionKey::new(identity, &w.session_id);
        let expired = st.expire(&key, now);
        self.evict("ttl", expired);
        let tick = st.next();
        let local = match st.sessions.get(&key).and_then(|s| s.fragments.get(&w.id)) {
            Some(old) if old.content == w.content && old.title == w.title => (old.version, false),
            Some(old) => (old.version + 1, false),
            None => (1, true),
        };
        let (version, created) = forced.unwrap_or(local);
        let id = w.id.clone();
        let embedded = w.embedding_opt.is_some();
        let mut fragment = fragment_of(w, now, version, tick);
        fragment.shared = forced.is_some();
        self.make_room(st, &key, identity.trust, fragment.bytes, created, now);
        st.insert(&key, fragment, tick);
        UpsertResult {
            id,
            version,
            created,
            embedded,
        }
    }

    /// Frees room for a fragment of `bytes` in `key`'s session (a rewrite
    /// only needs bytes, a new one also a slot): the
    /// session's own cap, the tenant's session count and bytes, then the
    /// store's sessions and bytes. A tenant over its share only ever evicts
    /// its own fragments; others lose theirs only to the store-wide bound,
    /// which the per-tenant share keeps out of one tenant's reach.
    fn make_room(
        &self,
        st: &mut State,
        key: &SessionKey,
        trust: AccessLevel,
        bytes: usize,
        created: bool,
        now: DateTime<Utc>,
    ) {
        let l = self.limits;
        if created
            && let Some(s) = st.sessions.get(key)
            && s.fragments.len() >= l.per_session
            && let Some(lru) = s
                .fragments
                .values()
                .min_by_key(|f| f.used)
                .map(|f| f.id.clone())
        {
            st.remove(key, &lru);
            self.evict("lru_fragment", 1);
        }
        let opens = !st.sessions.contains_key(key);
        // Within its tenant's budget a caller only evicts what it could
        // read: a public key's sessions never push out a sensitive key's
        // note (issue 47, item 8). With nothing of its level left to evict
        // it goes over by this one write, which its next write evicts.
        if opens && st.usage(&key.tenant).sessions >= l.tenant_sessions {
            let readable = |s: &Session| s.fragments.values().all(|f| f.access <= trust);
            let own = st.lru_session(|k, s| k.tenant == key.tenant && readable(s));
            let n = own.map_or(0, |k| st.drop_session(&k));
            self.evict("tenant_budget", n);
        }
        while st.usage(&key.tenant).bytes + bytes > l.tenant_bytes {
            let Some((k, id)) = st.lru_fragment_of(&key.tenant, trust) else {
                break;
            };
            st.remove(&k, &id);
            self.evict("tenant_budget", 1);
        }
        if opens && st.sessions.len() >= l.sessions {
            self.evict_sessions(st, now);
        }
        while st.bytes + bytes > l.bytes {
            let Some(k) = st.lru_session(|k, _| k != key) else {
                break;
            };
            let n = st.drop_session(&k);
            self.evict("memory_budget", n);
        }
    }

    /// Makes room for one session: expired fragments everywhere first, then
    /// the least recently used session.
    fn evict_sessions(&self, st: &mut State, now: DateTime<Utc>) {
        let keys: Vec<SessionKey> = st.sessions.keys().cloned().collect();
        let mut expired = 0;
        for k in &keys {
            expired += st.expire(k, now);
        }
        self.evict("ttl", expired);
        while st.sessions.len() >= self.limits.sessions {
            let Some(k) = st.lru_session(|_, _| true) else {
                break;
            };
            let n = st.drop_session(&k);
            self.evict("lru_session", n);
        }
    }

    /// The session's live fragments the caller may see (trust and
    /// confidence floor), and the count before those filters.
    pub fn visible(
        &self,
        key: &SessionKey,
        trust: AccessLevel,
        min_confidence: f32,
        now: DateTime<Utc>,
    ) -> (Vec<Fragment>, usize) {
        let mut st = self.state.lock();
        let expired = st.expire(key, now);
        self.evict("ttl", expired);
        self.gauges(&st);
        let tick = st.next();
        let Some(s) = st.sessions.get_mut(key) else {
            return (Vec::new(), 0);
        };
        s.used = tick;
        let total = s.fragments.values().filter(|f| f.access <= trust).count();
        let out = s
            .fragments
            .values()
            .filter(|f| f.access <= trust && f.confidence >= min_confidence)
            .cloned()
            .collect();
        (out, total)
    }

    /// Marks fragments as just used, so LRU eviction spares what is read.
    pub fn touch(&self, key: &SessionKey, ids: &[&str]) {
        let mut st = self.state.lock();
        let tick = st.next();
        if let Some(s) = st.sessions.get_mut(key) {
            for id in ids {
                if let Some(f) = s.fragments.get_mut(*id) {
                    f.used = tick;
                }
            }
        }
    }

    /// Removes the identity's fragments with these ids from every one of its
    /// sessions; returns how many. Above the caller's trust is as if absent.
    pub fn delete(&self, identity: &Identity, ids: &[String]) -> u32 {
        let mut st = self.state.lock();
        let targets: Vec<(SessionKey, String)> = st
            .sessions
            .iter()
            .filter(|(k, _)| k.tenant == identity.tenant && k.agent == identity.agent_id)
            .flat_map(|(k, s)| {
                ids.iter()
                    .filter(|id| {
                        s.fragments
                            .get(*id)
                            .is_some_and(|f| f.access <= identity.trust)
                    })
                    .map(move |id| (k.clone(), id.clone()))
            })
            .collect();
        let n = targets
            .iter()
            .filter(|(k, id)| st.remove(k, id).is_some())
            .count();
        self.gauges(&st);
        u32::try_from(n).unwrap_or(u32::MAX)
    }
}

/// The stored form of a validated write.
fn fragment_of(w: WorkingWrite, now: DateTime<Utc>, version: i32, tick: u64) -> Fragment {
    let ttl = chrono::Duration::from_std(w.ttl).unwrap_or(chrono::Duration::MAX);
    let expires_at = now
        .checked_add_signed(ttl)
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    let tokens = Arc::new(tokens(&w.text()));
    let mut f = Fragment {
        id: w.id,
        tokens,
        content: w.content,
        title: w.title,
        namespace: w.namespace,
        source: w.source,
        confidence: w.confidence,
        access: w.access,
        embedding_opt: w.embedding_opt.map(Arc::from),
        written_at: now,
        expires_at,
        version,
        used: tick,
        bytes: 0,
        shared: false,
    };
    f.bytes = f.weigh();
    f
}

/// What the shared copy stores of a write (shared.rs): the note as a
/// `Memory`, opaque to search-svc, with what decides a new version.
pub fn note_of(w: &WorkingWrite, now: DateTime<Utc>) -> engram_proto::SessionNote {
    use prost::Message;
    use sha2::{Digest, Sha256};
    let ttl = chrono::Duration::from_std(w.ttl).unwrap_or(chrono::Duration::MAX);
    let expires_at = now
        .checked_add_signed(ttl)
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    let body = Memory {
        id: w.id.clone(),
        content: w.content.clone(),
        title: w.title.clone(),
        namespace: w.namespace.clone(),
        source: w.source.clone(),
        source_confidence: Some(w.confidence),
        access_level: w.access.to_proto(),
        embedding: w.embedding_opt.clone().unwrap_or_default(),
        ingestion_time: Some(engram_common::convert::chrono_to_ts(now)),
        ..Default::default()
    };
    let mut h = Sha256::new();
    for part in [w.title.as_bytes(), w.content.as_bytes()] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    engram_proto::SessionNote {
        session_id: w.session_id.clone(),
        id: w.id.clone(),
        access_level: w.access.to_proto(),
        body: body.encode_to_vec(),
        content_hash: h.finalize().to_vec(),
        expires_at_ms: expires_at.timestamp_millis(),
        version: 0,
        created: false,
    }
}

/// A note read back from the shared copy; `None` when it does not decode
/// (another version's encoding) or has an unknown level.
pub fn fragment_from_note(n: &engram_proto::SessionNote) -> Option<Fragment> {
    use prost::Message;
    let m = Memory::decode(n.body.as_slice()).ok()?;
    let access = AccessLevel::from_proto(n.access_level)?;
    let written_at = (m.ingestion_time.as_ref())
        .and_then(|t| {
            DateTime::<Utc>::from_timestamp(t.seconds, u32::try_from(t.nanos).unwrap_or(0))
        })
        .unwrap_or_else(Utc::now);
    let expires_at = DateTime::<Utc>::from_timestamp_millis(n.expires_at_ms)?;
    let text = if m.title.is_empty() {
        m.content.clone()
    } else {
        format!("{}\n{}", m.title, m.content)
    };
    let embedding_opt = (m.embedding.len() == EMBEDDING_DIM).then(|| Arc::from(m.embedding));
    let mut f = Fragment {
        id: m.id,
        tokens: Arc::new(tokens(&text)),
        content: m.content,
        title: m.title,
        namespace: m.namespace,
        source: m.source,
        confidence: m.source_confidence.unwrap_or(1.0),
        access,
        embedding_opt,
        written_at,
        expires_at,
        version: n.version,
        used: 0,
        bytes: 0,
        shared: true,
    };
    f.bytes = f.weigh();
    Some(f)
}

/// Matches by shared content words or embedding cosine, then ranks by
/// recency with a small confidence bonus: in a session, the latest note on
/// a subject is usually the one that holds, whatever its wall-clock age.
pub fn rank(
    fragments: Vec<Fragment>,
    query: &str,
    query_embedding_opt: Option<&[f32]>,
    match_similarity: f32,
    limit: usize,
) -> Vec<Hit> {
    let q = tokens(query);
    let mut hits: Vec<Hit> = fragments
        .into_iter()
        .filter_map(|f| {
            let text_match = if q.is_empty() {
                0.0
            } else {
                q.iter().filter(|t| f.tokens.contains(*t)).count() as f32 / q.len() as f32
            };
            let similarity_opt = match (query_embedding_opt, &f.embedding_opt) {
                (Some(a), Some(b)) => cosine(a, b),
                _ => None,
            };
            let matched = text_match >= MIN_TEXT_MATCH
                || similarity_opt.is_some_and(|s| s >= match_similarity);
            if !matched {
                return None;
            }
            Some(Hit {
                score: 0.0,
                text_match,
                similarity_opt,
                fragment: f,
            })
        })
        .collect();
    hits.sort_by_key(|h| std::cmp::Reverse(h.fragment.written_at));
    // Notes written in the same instant (one batch) share a recency rank.
    let mut newer = 0usize;
    let mut prev_opt: Option<DateTime<Utc>> = None;
    for (i, h) in hits.iter_mut().enumerate() {
        if prev_opt.is_some_and(|p| p != h.fragment.written_at) {
            newer = i;
        }
        prev_opt = Some(h.fragment.written_at);
        h.score = 1.0 / (1.0 + newer as f32) + CONFIDENCE_BONUS * h.fragment.confidence;
    }
    hits.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| b.fragment.written_at.cmp(&a.fragment.written_at))
            .then_with(|| a.fragment.id.cmp(&b.fragment.id))
    });
    hits.truncate(limit);
    hits
}

/// A `GetMemoryRequest` that passed boundary validation.
#[derive(Debug, Clone)]
pub struct MemoryQuery {
    pub query: String,
    pub session_id_opt: Option<String>,
    pub min_confidence: f32,
    pub limit: u32,
    pub compact: bool,
    pub include_sources: bool,
    pub max_depth: u32,
}

impl TryFrom<GetMemoryRequest> for MemoryQuery {
    type Error = Error;

    fn try_from(r: GetMemoryRequest) -> Result<Self, Error> {
        let GetMemoryRequest {
            query,
            session_id,
            min_confidence,
            limit,
            compact,
            include_sources,
            max_depth,
        } = r;
        if query.trim().is_empty() {
            return Err(Error::invalid("query", "must not be empty"));
        }
        if query.chars().count() > MAX_TEXT_CHARS {
            return Err(Error::invalid(
                "query",
                format!("at most {MAX_TEXT_CHARS} characters"),
            ));
        }
        if session_id.chars().count() > MAX_SESSION_ID_CHARS {
            return Err(Error::invalid(
                "session_id",
                format!("at most {MAX_SESSION_ID_CHARS} characters"),
            ));
        }
        let min_confidence = min_confidence.unwrap_or(0.0);
        if !(0.0..=1.0).contains(&min_confidence) {
            return Err(Error::invalid("min_confidence", "must be in 0..=1"));
        }
        let limit = limit.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(Error::invalid(
                "limit",
                format!("must be in 1..={MAX_LIMIT}"),
            ));
        }
        let max_depth = max_depth.unwrap_or(DEFAULT_MAX_DEPTH);
        if !(1..=MAX_DEPTH).contains(&max_depth) {
            return Err(Error::invalid(
                "max_depth",
                format!("must be in 1..={MAX_DEPTH}"),
            ));
        }
        Ok(Self {
            query,
            session_id_opt: (!session_id.trim().is_empty()).then_some(session_id),
            min_confidence,
            limit,
            compact,
            include_sources,
            max_depth,
        })
    }
}

impl MemoryQuery {
    pub fn demand_requested(&self) -> std::collections::BTreeSet<String> {
        let mut p = std::collections::BTreeSet::from(["surface:get_memory".to_string()]);
        if self.session_id_opt.is_some() {
            p.insert("session".into());
        }
        if self.min_confidence > 0.0 {
            p.insert("min_confidence".into());
        }
        if self.compact {
            p.insert("compact".into());
        } else {
            p.insert("causal_chain".into());
            p.insert("contradictions".into());
            if self.include_sources {
                p.insert("sources".into());
            }
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost_types::{Struct, Value};

    fn ident(tenant: &str, agent: &str, trust: AccessLevel) -> Identity {
        Identity {
            tenant: tenant.into(),
            agent_id: agent.into(),
            trust,
        }
    }

    fn write(session: &str, id: u128, content: &str, conf: f32) -> WorkingWrite {
        WorkingWrite {
            id: uuid::Uuid::from_u128(id).to_string(),
            session_id: session.into(),
            ttl: Duration::from_secs(3600),
            content: content.into(),
            title: String::new(),
            namespace: String::new(),
            source: String::new(),
            confidence: conf,
            access: AccessLevel::Public,
            embedding_opt: None,
        }
    }

    fn settings(per_session: usize, sessions: usize) -> WorkingMemorySettings {
        WorkingMemorySettings {
            max_per_session: per_session,
            max_sessions: sessions,
            ..Default::default()
        }
    }

    #[test]
    fn a_tenant_over_its_budget_evicts_only_its_own_fragments() {
        let s = WorkingMemorySettings {
            max_bytes_per_tenant: 64 * 1024,
            max_bytes: 160 * 1024,
            max_sessions_per_tenant: 3,
            ..Default::default()
        };
        let wm = WorkingMemory::new(&s).expect("metrics");
        let now = Utc::now();
        let quiet = ident("t-quiet", "a", AccessLevel::Public);
        wm.put(
            &quiet,
            vec![write("s", 1, "the launch code is blue", 1.0)],
            now,
        )
        .expect("stored");
        let flood = ident("t-flood", "a", AccessLevel::Public);
        let big = "x".repeat(8 * 1024);
        for i in 0..200u128 {
            let session = format!("s{}", i % 7);
            wm.put(&flood, vec![write(&session, 1000 + i, &big, 1.0)], now)
                .expect("stored");
        }
        let st = wm.state.lock();
        let used = st.usage("t-flood");
        assert!(
            used.bytes <= 64 * 1024,
            "flooder holds {} bytes",
            used.bytes
        );
        assert!(
            used.sessions <= 3,
            "flooder holds {} sessions",
            used.sessions
        );
        assert!(st.bytes <= 160 * 1024);
        let recount: usize = st
            .sessions
            .values()
            .flat_map(|s| s.fragments.values())
            .map(|f| f.bytes)
            .sum();
        assert_eq!(recount, st.bytes);
        drop(st);
        let (v, _) = wm.visible(&SessionKey::new(&quiet, "s"), AccessLevel::Public, 0.0, now);
        assert_eq!(v.len(), 1);
        assert!(wm.evicted.with_label_values(&["tenant_budget"]).get() > 0);
    }

    #[test]
    fn a_lower_trust_key_never_evicts_a_higher_trust_keys_note() {
        let s = WorkingMemorySettings {
            max_bytes_per_tenant: 64 * 1024,
            max_sessions_per_tenant: 3,
            ..Default::default()
        };
        let wm = WorkingMemory::new(&s).expect("metrics");
        let now = Utc::now();
        let high = ident("t", "a", AccessLevel::Sensitive);
        let mut note = write("private", 1, "the escrow PIN is with legal", 1.0);
        note.access = AccessLevel::Sensitive;
        wm.put(&high, vec![note], now).expect("stored");
        let low = ident("t", "a", AccessLevel::Public);
        let big = "x".repeat(8 * 1024);
        for i in 0..200u128 {
            let session = format!("s{}", i % 50);
            wm.put(&low, vec![write(&session, 1000 + i, &big, 1.0)], now)
                .expect("stored");
        }
        let key = SessionKey::new(&high, "private");
        let (v, _) = wm.visible(&key, AccessLevel::Sensitive, 0.0, now);
        assert_eq!(v.len(), 1, "the sensitive note was evicted");
        let used = wm.state.lock().usage("t");
        assert!(used.sessions <= 4, "{} sessions", used.sessions);
        assert!(used.bytes <= 64 * 1024 + 9 * 1024, "{} bytes", used.bytes);
    }

    fn meta(pairs: &[(&str, Kind)]) -> Option<Struct> {
        Some(Struct {
            fields: pairs
                .iter()
                .map(|(k, v)| {
                    (
                        k.to_string(),
                        Value {
                            kind: Some(v.clone()),
                        },
                    )
                })
                .collect(),
        })
    }

    #[test]
    fn writes_are_validated_naming_the_field() {
        let s = WorkingMemorySettings::default();
        let base = Memory {
            memory_type: WORKING_TYPE.into(),
            content: "note".into(),
            ..Default::default()
        };
        let e = WorkingWrite::from_memory(base.clone(), &s).expect_err("no session");
        assert!(
            e.to_string().contains("memories.metadata.session_id"),
            "{e}"
        );
        let m = Memory {
            metadata: meta(&[
                ("session_id", Kind::StringValue("s1".into())),
                ("ttl_ms", Kind::NumberValue(0.0)),
            ]),
            ..base.clone()
        };
        let e = WorkingWrite::from_memory(m, &s).expect_err("ttl 0");
        assert!(e.to_string().contains("memories.metadata.ttl_ms"), "{e}");
        // A NUL would be refused by the shared copy: refused here, named.
        let m = Memory {
            metadata: meta(&[("session_id", Kind::StringValue("s\0".into()))]),
            ..base.clone()
        };
        let e = WorkingWrite::from_memory(m, &s).expect_err("NUL");
        assert!(e.to_string().contains("session_id"), "{e}");
        let m = Memory {
            metadata: meta(&[("session_id", Kind::StringValue("s1".into()))]),
            source_confidence: Some(0.7),
            ..base
        };
        let w = WorkingWrite::from_memory(m, &s).expect("valid");
        assert_eq!(w.session_id, "s1");
        assert_eq!(w.ttl, Duration::from_millis(s.default_ttl_ms));
        assert!((w.confidence - 0.7).abs() < 1e-6);
        assert!(uuid::Uuid::parse_str(&w.id).is_ok());
    }

    #[test]
    fn sessions_are_private_and_trust_is_respected() {
        let wm = WorkingMemory::new(&settings(10, 10)).expect("metrics");
        let now = Utc::now();
        let a = ident("t1", "agent", AccessLevel::Sensitive);
        let mut secret = write("s", 1, "launch code is blue", 1.0);
        secret.access = AccessLevel::Sensitive;
        wm.put(&a, vec![secret, write("s", 2, "lunch at noon", 1.0)], now)
            .expect("stored");
        let (v, total) = wm.visible(&SessionKey::new(&a, "s"), AccessLevel::Sensitive, 0.0, now);
        assert_eq!((v.len(), total), (2, 2));
        let (v, _) = wm.visible(&SessionKey::new(&a, "s"), AccessLevel::Public, 0.0, now);
        assert_eq!(v.len(), 1);
        let other_tenant = ident("t2", "agent", AccessLevel::Sensitive);
        let other_agent = ident("t1", "agent-2", AccessLevel::Sensitive);
        for who in [&other_tenant, &other_agent] {
            let (v, total) =
                wm.visible(&SessionKey::new(who, "s"), AccessLevel::Sensitive, 0.0, now);
            assert_eq!((v.len(), total), (0, 0));
        }
        assert_eq!(
            wm.delete(&other_agent, &[uuid::Uuid::from_u128(2).to_string()]),
            0
        );
        assert_eq!(wm.delete(&a, &[uuid::Uuid::from_u128(2).to_string()]), 1);
    }

    #[test]
    fn a_lower_trust_key_cannot_overwrite_delete_or_count_higher_fragments() {
        let wm = WorkingMemory::new(&settings(10, 10)).expect("metrics");
        let now = Utc::now();
        let high = ident("t1", "agent", AccessLevel::Sensitive);
        let low = ident("t1", "agent", AccessLevel::Public);
        let mut secret = write("s", 1, "launch code is blue", 1.0);
        secret.access = AccessLevel::Sensitive;
        wm.put(&high, vec![secret], now).expect("stored");
        let overwrite = write("s", 1, "launch code is red", 1.0);
        assert_eq!(
            wm.put(&low, vec![write("s", 2, "fine", 1.0), overwrite], now),
            Err(1)
        );
        let key = SessionKey::new(&low, "s");
        let (v, total) = wm.visible(&key, AccessLevel::Public, 0.0, now);
        assert_eq!((v.len(), total), (0, 0), "nothing written, nothing counted");
        assert_eq!(wm.delete(&low, &[uuid::Uuid::from_u128(1).to_string()]), 0);
        let (v, total) = wm.visible(&key, AccessLevel::Sensitive, 0.0, now);
        assert_eq!((v.len(), total), (1, 1));
        assert_eq!(v[0].content, "launch code is blue");
    }

    #[test]
    fn ttl_and_lru_evict() {
        let wm = WorkingMemory::new(&settings(2, 2)).expect("metrics");
        let now = Utc::now();
        let a = ident("t", "a", AccessLevel::Public);
        let key = SessionKey::new(&a, "s");
        wm.put(
            &a,
            vec![write("s", 1, "one", 1.0), write("s", 2, "two", 1.0)],
            now,
        )
        .expect("stored");
        // Reading 1 makes 2 the least recently used.
        wm.touch(&key, &[&uuid::Uuid::from_u128(1).to_string()]);
        wm.put(&a, vec![write("s", 3, "three", 1.0)], now)
            .expect("stored");
        let (v, _) = wm.visible(&key, AccessLevel::Public, 0.0, now);
        let mut ids: Vec<String> = v.into_iter().map(|f| f.content).collect();
        ids.sort();
        assert_eq!(ids, ["one", "three"]);
        // A rewrite bumps the version and does not evict.
        let r = wm
            .put(&a, vec![write("s", 3, "three!", 1.0)], now)
            .expect("stored");
        assert_eq!((r[0].version, r[0].created), (2, false));
        // Sessions: a third one evicts the least recently used session.
        wm.put(&a, vec![write("s2", 10, "x", 1.0)], now)
            .expect("stored");
        wm.visible(&key, AccessLevel::Public, 0.0, now);
        wm.put(&a, vec![write("s3", 11, "y", 1.0)], now)
            .expect("stored");
        let (v, _) = wm.visible(&SessionKey::new(&a, "s2"), AccessLevel::Public, 0.0, now);
        assert!(v.is_empty());
        assert_eq!(wm.visible(&key, AccessLevel::Public, 0.0, now).0.len(), 2);
        // TTL: an hour later everything is gone.
        let later = now + chrono::Duration::seconds(3601);
        assert!(
            wm.visible(&key, AccessLevel::Public, 0.0, later)
                .0
                .is_empty()
        );
        assert_eq!(wm.evicted.with_label_values(&["ttl"]).get(), 2);
        assert_eq!(wm.fragments_gauge.get(), 1);
    }

    #[test]
    fn ranking_prefers_recent_with_a_confidence_bonus() {
        let wm = WorkingMemory::new(&settings(10, 10)).expect("metrics");
        let now = Utc::now();
        let a = ident("t", "a", AccessLevel::Public);
        let t0 = now - chrono::Duration::minutes(20);
        wm.put(&a, vec![write("s", 1, "deadline is Monday", 1.0)], t0)
            .expect("stored");
        wm.put(
            &a,
            vec![write("s", 2, "deadline moved to Friday", 0.2)],
            now,
        )
        .expect("stored");
        wm.put(&a, vec![write("s", 3, "buy oat milk", 1.0)], now)
            .expect("stored");
        let (v, _) = wm.visible(&SessionKey::new(&a, "s"), AccessLevel::Public, 0.0, now);
        let hits = rank(v.clone(), "when is the deadline?", None, 0.5, 10);
        let contents: Vec<&str> = hits.iter().map(|h| h.fragment.content.as_str()).collect();
        assert_eq!(contents, ["deadline moved to Friday", "deadline is Monday"]);
        // Same age: the bonus breaks the tie toward confidence.
        let hits = rank(v, "milk deadline", None, 0.5, 10);
        assert_eq!(hits[0].fragment.content, "buy oat milk");
        assert!(rank(Vec::new(), "x", None, 0.5, 10).is_empty());
    }

    #[test]
    fn embedding_matches_without_shared_words() {
        let now = Utc::now();
        let mut w = write("s", 1, "the quarterly numbers", 1.0);
        w.embedding_opt = Some(vec![1.0, 0.0, 0.0]);
        let wm = WorkingMemory::new(&settings(10, 10)).expect("metrics");
        let a = ident("t", "a", AccessLevel::Public);
        wm.put(&a, vec![w], now).expect("stored");
        let (v, _) = wm.visible(&SessionKey::new(&a, "s"), AccessLevel::Public, 0.0, now);
        let hits = rank(v.clone(), "revenue report", Some(&[0.9, 0.1, 0.0]), 0.5, 10);
        assert_eq!(hits.len(), 1);
        assert!(hits[0].similarity_opt.is_some_and(|s| s > 0.9));
        assert!(rank(v, "revenue report", Some(&[0.0, 1.0, 0.0]), 0.5, 10).is_empty());
    }

    #[test]
    fn memory_query_defaults_and_bounds() {
        let ok = MemoryQuery::try_from(GetMemoryRequest {
            query: "q".into(),
            ..Default::default()
        })
        .expect("valid");
        assert_eq!((ok.limit, ok.max_depth, ok.min_confidence), (10, 2, 0.0));
        assert!(ok.session_id_opt.is_none());
        for (req, field) in [
            (GetMemoryRequest::default(), "query"),
            (
                GetMemoryRequest {
                    query: "q".into(),
                    limit: Some(0),
                    ..Default::default()
                },
                "limit",
            ),
            (
                GetMemoryRequest {
                    query: "q".into(),
                    max_depth: Some(5),
                    ..Default::default()
                },
                "max_depth",
            ),
            (
                GetMemoryRequest {
                    query: "q".into(),
                    min_confidence: Some(1.5),
                    ..Default::default()
                },
                "min_confidence",
            ),
        ] {
            let e = MemoryQuery::try_from(req).expect_err(field);
            assert!(e.to_string().contains(field), "{e}");
        }
    }
}
